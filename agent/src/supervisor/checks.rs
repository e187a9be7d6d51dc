//! Health checks of a running task (its `checks`): what each one is, how
//! its failures add up, and the TCP and HTTP probes. The runner runs them
//! (an exec check goes through the task's own driver) and stops a task
//! whose check failed `failureThreshold` times in a row; `restart` then
//! decides whether it runs again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s4r_api::validation::{check_timing, CheckTiming};
use k8s4r_api::{HealthCheck, TaskTemplate};
use k8s4r_drivers::{Launch, Prepared, TaskCgroup};

use super::outcome::{verdict, Exit};
use super::process::{wait_at_most, Launcher, Process, Waited};
use super::reaper::OwnedPids;

/// Where TCP and HTTP checks go when they name no host: the robot itself.
const LOCALHOST: &str = "127.0.0.1";

/// One check of one task, and its failures in a row.
#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub spec: HealthCheck,
    pub timing: CheckTiming,
    /// For messages: its name, or what it checks.
    pub label: String,
    failures: u32,
}

/// What one probe found.
pub(crate) type Probe = Result<(), String>;

impl Check {
    /// The checks of a task.
    pub(crate) fn all_of(template: &TaskTemplate) -> Vec<Check> {
        template
            .checks
            .iter()
            .map(|spec| Check {
                timing: check_timing(spec),
                label: label_of(spec),
                spec: spec.clone(),
                failures: 0,
            })
            .collect()
    }

    /// Forgets its failures (a new run of the task).
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// Counts a probe; the reason to stop the task when this failure made
    /// it unhealthy.
    pub(crate) fn record(&mut self, probe: Probe) -> Option<String> {
        match probe {
            Ok(()) => {
                self.failures = 0;
                None
            }
            Err(why) => {
                self.failures += 1;
                (self.failures >= self.timing.failure_threshold).then(|| {
                    format!(
                        "health check {} failed {} time{} in a row: {why}",
                        self.label,
                        self.failures,
                        if self.failures == 1 { "" } else { "s" }
                    )
                })
            }
        }
    }
}

fn label_of(spec: &HealthCheck) -> String {
    if let Some(name) = &spec.name {
        return format!("{name:?}");
    }
    if let Some(exec) = &spec.exec {
        return format!("exec {}", exec.command);
    }
    if let Some(tcp) = &spec.tcp {
        return format!("tcp {}:{}", tcp.host.as_deref().unwrap_or(LOCALHOST), tcp.port);
    }
    if let Some(http) = &spec.http {
        return format!(
            "http {}:{}{}",
            http.host.as_deref().unwrap_or(LOCALHOST),
            http.port,
            http.path.as_deref().unwrap_or("/")
        );
    }
    "(empty)".to_owned()
}

/// Connects to `host:port` within `timeout`.
pub(crate) async fn tcp_probe(host: Option<String>, port: u16, timeout: Duration) -> Probe {
    let host = host.unwrap_or_else(|| LOCALHOST.to_owned());
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("cannot connect: {e}")),
        Err(_) => Err(format!(
            "no connection within {}",
            k8s4r_api::duration::format_duration(timeout)
        )),
    }
}

/// The HTTP client of every HTTP check, built once, on the blocking pool:
/// it reads the robot's CA bundle, which the supervisor's thread must not
/// wait for.
#[derive(Clone, Default)]
pub(crate) struct HttpClient(std::sync::Arc<std::sync::OnceLock<Result<reqwest::Client, String>>>);

impl HttpClient {
    /// GETs `http://host:port/path` within `timeout` (see [`http`]).
    async fn probe(self, host: Option<String>, port: u16, path: Option<String>, timeout: Duration) -> Probe {
        let cell = self.0;
        let client = tokio::task::spawn_blocking(move || cell.get_or_init(http_client).clone())
            .await
            .map_err(|e| format!("cannot build an HTTP client: {e}"))??;
        http(client, host, port, path, timeout).await
    }
}

/// What an exec check runs as: its task's driver, spec, preparation,
/// environment and cgroup.
pub(crate) struct AsTask {
    pub launcher: Arc<dyn Launcher>,
    pub template: TaskTemplate,
    pub prepared: Option<Prepared>,
    pub env: Vec<(String, String)>,
    pub cgroup: Option<TaskCgroup>,
    pub owned: OwnedPids,
}

/// The probe of `check`: what it found, and the pid of an exec check's
/// process (now reaped). None when it cannot run yet (an exec check of a
/// re-adopted task not prepared again).
pub(crate) fn probe(
    check: &Check,
    http_client: &HttpClient,
    task: impl FnOnce() -> AsTask,
) -> Option<impl Future<Output = (Probe, Option<i32>)> + Send + 'static> {
    let timeout = check.timing.timeout;
    let spec = check.spec.clone();
    let http_client = http_client.clone();
    let exec = match spec.exec {
        Some(exec) => {
            let task = task();
            let prepared = task.prepared?;
            let template = TaskTemplate {
                command: exec.command,
                args: exec.args,
                ..task.template
            };
            Some(move || {
                launch_check(
                    task.launcher,
                    template,
                    prepared,
                    task.env,
                    task.cgroup,
                    task.owned,
                )
            })
        }
        None => None,
    };
    Some(async move {
        if let Some(tcp) = spec.tcp {
            return (tcp_probe(tcp.host, tcp.port, timeout).await, None);
        }
        if let Some(http) = spec.http {
            return (
                http_client.probe(http.host, http.port, http.path, timeout).await,
                None,
            );
        }
        let Some(start) = exec else {
            return (Ok(()), None);
        };
        // Its fork and exec wait on the blocking pool, not on the loop.
        match tokio::task::spawn_blocking(start).await {
            Ok(Ok(process)) => {
                let pid = process.pid as i32;
                (exec_probe(process, timeout).await, Some(pid))
            }
            Ok(Err(why)) => (Err(why), None),
            Err(e) => (Err(format!("cannot run the check: {e}")), None),
        }
    })
}

/// Waits for an exec check's process: healthy when it exits 0 within
/// `timeout`; killed (and reaped) when it does not.
async fn exec_probe(process: Process, timeout: Duration) -> Probe {
    match wait_at_most(process, timeout).await {
        Waited::Exited(status) if status.success() => Ok(()),
        Waited::Exited(status) => Err(format!(
            "the check command {}",
            verdict(Exit::from(status), None, Duration::ZERO).message
        )),
        Waited::Failed(e) => Err(format!("cannot wait for the check command: {e}")),
        Waited::TimedOut => Err(format!(
            "the check command did not finish within {}",
            k8s4r_api::duration::format_duration(timeout)
        )),
    }
}

/// A client for HTTP checks: no redirects followed (a 3xx is healthy).
pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    k8s4r_mqtt::install_crypto_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// GETs `http://host:port/path` within `timeout`: healthy on 2xx and 3xx.
pub(crate) async fn http(
    client: reqwest::Client,
    host: Option<String>,
    port: u16,
    path: Option<String>,
    timeout: Duration,
) -> Probe {
    let host = host.unwrap_or_else(|| LOCALHOST.to_owned());
    // An IPv6 literal goes in brackets in a URL.
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let url = format!("http://{host}:{port}{}", path.as_deref().unwrap_or("/"));
    let response = client
        .get(&url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = response.status();
    if status.is_success() || status.is_redirection() {
        Ok(())
    } else {
        Err(format!("GET {url} answered {status}"))
    }
}

/// An exec health check's command, started as the task runs (its driver,
/// user, directory, environment and cgroup); output discarded. Blocking.
pub(crate) fn launch_check(
    launcher: Arc<dyn Launcher>,
    template: TaskTemplate,
    prepared: Prepared,
    env: Vec<(String, String)>,
    cgroup: Option<TaskCgroup>,
    owned: OwnedPids,
) -> Result<Process, String> {
    let null = |what: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map(std::os::fd::OwnedFd::from)
            .map_err(|e| format!("cannot open /dev/null for the check's {what}: {e}"))
    };
    let task = AsTask {
        launcher,
        template,
        prepared: Some(prepared),
        env,
        cgroup,
        owned,
    };
    launch_as_task(task, (null("stdout")?, null("stderr")?)).map_err(|e| format!("cannot run the check: {e}"))
}

/// Starts `task.template`'s command as the task runs (its driver, user,
/// directory, environment and cgroup), its output to `outputs`. Blocking.
pub(crate) fn launch_as_task(
    task: AsTask,
    (stdout, stderr): (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
) -> Result<Process, String> {
    launch_with(
        task,
        Streams {
            stdin: None,
            stdout,
            stderr,
            terminal: false,
        },
    )
}

/// A command's standard streams.
pub(crate) struct Streams {
    /// Its stdin; None: empty.
    pub stdin: Option<std::os::fd::OwnedFd>,
    pub stdout: std::os::fd::OwnedFd,
    pub stderr: std::os::fd::OwnedFd,
    /// stdin is a pty's slave, to be its controlling terminal.
    pub terminal: bool,
}

/// Starts `task.template`'s command as [`launch_as_task`] does, with
/// `streams`. Blocking.
pub(crate) fn launch_with(task: AsTask, streams: Streams) -> Result<Process, String> {
    let Streams {
        stdin,
        stdout,
        stderr,
        terminal,
    } = streams;
    let AsTask {
        launcher,
        template,
        prepared,
        env,
        cgroup,
        owned,
    } = task;
    let prepared = prepared.ok_or("the task is not prepared in this run of the agent")?;
    owned
        .spawn(
            || {
                launcher.start(Launch {
                    template: &template,
                    prepared: &prepared,
                    extra_env: &env,
                    stdout,
                    stderr,
                    // Counted against the task's limits, like the task.
                    cgroup: cgroup.as_ref(),
                    // The agent waits for a check itself: it never
                    // outlives it.
                    shim: None,
                    stdin,
                    terminal,
                    beside_task: true,
                })
            },
            |process| process.pid as i32,
        )
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::TcpCheck;

    fn check(threshold: u32) -> Check {
        let spec = HealthCheck {
            tcp: Some(TcpCheck { port: 1, host: None }),
            failure_threshold: Some(threshold),
            ..HealthCheck::default()
        };
        Check::all_of(&TaskTemplate {
            checks: vec![spec],
            ..TaskTemplate::default()
        })
        .remove(0)
    }

    #[test]
    fn failures_in_a_row_make_it_unhealthy_and_a_success_starts_over() {
        let mut c = check(3);
        assert_eq!(c.record(Err("refused".into())), None);
        assert_eq!(c.record(Err("refused".into())), None);
        assert_eq!(c.record(Ok(())), None);
        assert_eq!(c.record(Err("refused".into())), None);
        assert_eq!(c.record(Err("refused".into())), None);
        assert_eq!(
            c.record(Err("refused".into())).as_deref(),
            Some("health check tcp 127.0.0.1:1 failed 3 times in a row: refused")
        );
    }

    /// An HTTP server answering every request with `status`.
    async fn answering(status: &'static str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn http_probes_take_2xx_and_3xx_as_healthy_and_the_rest_as_not() {
        let client = http_client().unwrap();
        let t = Duration::from_secs(5);
        for (status, healthy) in [
            ("200 OK", true),
            ("302 Found", true),
            ("500 Internal Server Error", false),
            ("404 Not Found", false),
        ] {
            let port = answering(status).await;
            let probe = http(client.clone(), None, port, Some("/healthz".into()), t).await;
            assert_eq!(probe.is_ok(), healthy, "{status}: {probe:?}");
        }
    }

    #[tokio::test]
    async fn tcp_and_http_probes_tell_a_listener_from_none() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(tcp_probe(None, port, Duration::from_secs(2)).await.is_ok());
        drop(listener);
        let refused = tcp_probe(None, port, Duration::from_secs(2)).await.unwrap_err();
        assert!(refused.contains("cannot connect"), "{refused}");
        let client = http_client().unwrap();
        let down = http(
            client,
            None,
            port,
            Some("/healthz".into()),
            Duration::from_secs(2),
        )
        .await;
        assert!(down.unwrap_err().contains("/healthz"));
    }
}
