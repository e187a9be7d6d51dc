//! `podman`: the task in a container from its image, started by podman
//! without a daemon. The supervisor sees one process as for `exec`: the
//! `podman run` client, attached, which passes the stop signal on to the
//! container (`--sig-proxy`), streams its output and exits with its
//! status. Under the shim it outlives the agent with the container, so a
//! service is re-adopted with the same container.
//!
//! - The image is named by digest and pulled before the start, once; an
//!   image that is neither on the robot nor pullable is
//!   [`DriverError::ImageUnavailable`].
//! - The process in the container runs as the task's identity (`--user`),
//!   with no capabilities and `no-new-privileges` unless it is root; its
//!   directory is mounted at the same path, so paths, `K8S4R_TASK_DIR`,
//!   outputs and configuration files mean the same as under `exec`.
//! - `catatonit` is its PID 1 (`--init`): a program without a handler for
//!   the stop signal stops on it, as it would outside a container.
//! - Its limits are podman's (`--memory`, `--cpus`, `--pids-limit`).
//! - A SIGKILL of the task reaches past the client: the container's PID 1
//!   (read from the pidfile podman writes, checked to be this task's) is
//!   killed, which ends every process of its PID namespace, and the
//!   container is removed by its id.
//! - Health checks, `preStop` and `k8s4r exec` run inside the running
//!   container (`podman exec`).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s4r_api::container::ImageRef;
use k8s4r_api::task::DRIVER_PODMAN;
use k8s4r_api::TaskTemplate;

use crate::launch::{self, Isolation};

pub mod images;
use crate::{
    resolve_cwd, user_name, Driver, DriverError, Identity, Launch, Launched, Prepared, DEFAULT_PATH,
};

/// How the robot runs podman.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodmanConfig {
    /// The podman program.
    pub program: PathBuf,
    /// Options before podman's subcommand on every call (`--root`,
    /// `--storage-driver`, `--runtime`, ...).
    pub global_args: Vec<String>,
    /// Verify the registry's TLS certificate on a pull (false only for a
    /// registry on the robot's own network served over plain HTTP).
    pub tls_verify: bool,
    /// Registry credentials (podman's `auth.json`).
    pub authfile: Option<PathBuf>,
    /// How long a pull may take before the image is unavailable.
    pub pull_timeout: Duration,
    /// Devices tasks may be given, by the text they name them with.
    pub allowed_devices: Vec<String>,
    /// Where podman writes each container's pidfile: the agent's own,
    /// out of the tasks' reach.
    pub run_dir: PathBuf,
    /// `pids.max` (and RLIMIT_NPROC) of each container.
    pub pids_max: Option<u64>,
}

impl Default for PodmanConfig {
    fn default() -> Self {
        PodmanConfig {
            program: PathBuf::from("podman"),
            global_args: Vec::new(),
            tls_verify: true,
            authfile: None,
            pull_timeout: Duration::from_secs(600),
            allowed_devices: Vec::new(),
            run_dir: std::env::temp_dir().join("k8s4r-podman"),
            pids_max: Some(crate::DEFAULT_PIDS_MAX),
        }
    }
}

/// Runs tasks in containers with podman.
#[derive(Debug, Default)]
pub struct PodmanDriver {
    config: PodmanConfig,
}

/// The name of the container of the task whose directory is `task_dir`:
/// `k8s4r-<uid>-<attempt>` for the agent's `<state>/tasks/<uid>-<attempt>/work`
/// (the directory's own name when it is not `work`).
pub fn container_name(task_dir: &Path) -> String {
    let named = match task_dir.file_name() {
        Some(name) if name == "work" => task_dir.parent().and_then(Path::file_name),
        other => other,
    };
    let base = named
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("k8s4r-{safe}")
}

impl PodmanDriver {
    /// A driver with `config`.
    pub fn new(config: PodmanConfig) -> Self {
        PodmanDriver { config }
    }

    /// The robot's configuration.
    pub fn config(&self) -> &PodmanConfig {
        &self.config
    }

    fn command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.config.program);
        command.args(&self.config.global_args);
        command.env_clear().envs(podman_env());
        command.stdin(Stdio::null());
        command
    }

    /// The image on the robot: present, or pulled now by digest. Its use
    /// is noted first, under the lock the removal of unused images takes,
    /// so that it is not removed between this look and the container.
    pub fn ensure_image(&self, image: &ImageRef) -> Result<(), DriverError> {
        let pinned = image.pinned();
        let unavailable = |why: String| DriverError::ImageUnavailable {
            image: pinned.clone(),
            why,
        };
        {
            let _lock = self.lock_marks();
            self.mark_used(image, false);
            let exists = self
                .command()
                .args(["image", "exists", &pinned])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_err(|e| unavailable(format!("cannot run {}: {e}", self.config.program.display())))?;
            if exists.success() {
                return Ok(());
            }
        }
        let mut pull = self.command();
        pull.args(["pull", "--quiet"]);
        pull.arg(format!("--tls-verify={}", self.config.tls_verify));
        if let Some(authfile) = &self.config.authfile {
            pull.arg("--authfile").arg(authfile);
        }
        pull.arg(&pinned);
        let out = run_with_timeout(pull, self.config.pull_timeout)
            .map_err(|e| unavailable(format!("cannot run {}: {e}", self.config.program.display())))?;
        match out {
            Some(out) if out.status.success() => {
                self.mark_used(image, true);
                Ok(())
            }
            Some(out) => Err(unavailable(format!(
                "it is not on the robot and the pull failed: {}",
                last_line(&out.stderr)
            ))),
            None => Err(unavailable(format!(
                "it is not on the robot and the pull took longer than {}s",
                self.config.pull_timeout.as_secs()
            ))),
        }
    }

    /// `<run_dir>/<name>.<kind>`: the container's pidfile (`pid`) and id
    /// file (`cid`).
    fn run_file(&self, name: &str, kind: &str) -> PathBuf {
        self.config.run_dir.join(format!("{name}.{kind}"))
    }

    /// `podman run` for the task's main process.
    fn run_args(&self, launch: &Launch<'_>, names: &[String]) -> Result<Vec<OsString>, DriverError> {
        let t = launch.template;
        let prepared = launch.prepared;
        let image = ImageRef::parse(t.image.as_deref().unwrap_or_default())
            .map_err(|why| DriverError::InvalidResources(format!("spec.image: {why}")))?;
        let name = container_name(&prepared.task_dir);
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
        push(&[
            "run",
            "--name",
            &name,
            "--replace",
            "--rm",
            "--init",
            "--sig-proxy=true",
        ]);
        push(&["--pull", "never", "--log-driver", "none"]);
        push(&["--network", t.network.unwrap_or_default().podman_name()]);
        let stop = t.stop_signal.unwrap_or_default();
        push(&["--stop-signal", stop.name()]);
        let kill_after = k8s4r_api::validation::kill_timeout_of(t)
            .as_secs()
            .max(1)
            .to_string();
        push(&["--stop-timeout", &kill_after]);
        for (flag, kind) in [("--pidfile", "pid"), ("--cidfile", "cid")] {
            let file = self.run_file(&name, kind);
            // podman refuses to write over an id file: this attempt's last
            // run (a restart on the robot) left it.
            let _ = std::fs::remove_file(&file);
            a.push(flag.into());
            a.push(file.into_os_string());
        }
        let dir = prepared.task_dir.display().to_string();
        a.push("--volume".into());
        a.push(format!("{dir}:{dir}").into());
        a.push("--workdir".into());
        a.push(prepared.cwd.clone().into_os_string());
        a.extend(identity_args(prepared.identity.as_ref()));
        let limits = prepared.limits;
        if let Some(bytes) = limits.memory_bytes {
            a.extend(["--memory".into(), bytes.to_string().into()]);
        }
        if let Some(millis) = limits.cpu_millis {
            a.extend([
                "--cpus".into(),
                format!("{}.{:03}", millis / 1000, millis % 1000).into(),
            ]);
        }
        if let Some(pids) = limits.pids {
            a.extend(["--pids-limit".into(), pids.to_string().into()]);
            a.extend(["--ulimit".into(), format!("nproc={pids}:{pids}").into()]);
        }
        // The agent's own open-file limit: podman's default is above what
        // a robot's root may lack the right to set.
        if let Ok((soft, hard)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
            a.extend(["--ulimit".into(), format!("nofile={soft}:{hard}").into()]);
        }
        for device in &t.devices {
            if !self.config.allowed_devices.iter().any(|d| d == device) {
                return Err(DriverError::DeviceNotAllowed {
                    device: device.clone(),
                });
            }
            a.extend(["--device".into(), device.into()]);
        }
        for name in names {
            a.extend(["--env".into(), name.into()]);
        }
        if !t.command.is_empty() {
            let entrypoint = json_array(&t.command);
            a.extend(["--entrypoint".into(), entrypoint.into()]);
        }
        a.push(image.pinned().into());
        a.extend(t.args.iter().map(OsString::from));
        Ok(a)
    }

    /// `podman exec` of a command beside the running task (a check, a
    /// preStop, a session).
    fn exec_args(&self, launch: &Launch<'_>, names: &[String]) -> Vec<OsString> {
        let prepared = launch.prepared;
        let mut a: Vec<OsString> = vec!["exec".into()];
        if launch.stdin.is_some() {
            a.push("--interactive".into());
        }
        if launch.terminal {
            a.push("--tty".into());
        }
        if let Some(identity) = &prepared.identity {
            a.extend([
                "--user".into(),
                format!("{}:{}", identity.uid, identity.gid).into(),
            ]);
        }
        a.extend(["--workdir".into(), prepared.cwd.clone().into_os_string()]);
        for name in names {
            a.extend(["--env".into(), name.into()]);
        }
        a.push(container_name(&prepared.task_dir).into());
        a.push(launch.template.command.clone().into());
        a.extend(launch.template.args.iter().map(OsString::from));
        a
    }

    /// What a SIGKILL of the task must reach beyond the podman client: the
    /// container's PID 1 at once (when its pidfile names a process of this
    /// task), then the container's removal by its id (a container that
    /// replaces it under the same name is not touched), off the caller's
    /// thread.
    pub fn kill_container(&self, task_dir: &Path) {
        let name = container_name(task_dir);
        if let Some(pid) = crate::shim::container_pid(&self.run_file(&name, "pid"), task_dir) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let Some(id) = std::fs::read_to_string(self.run_file(&name, "cid"))
            .ok()
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return;
        };
        let mut rm = self.command();
        rm.args(["rm", "--force", "--time", "0", "--ignore", &id]);
        let _ = std::thread::Builder::new()
            .name("podman-rm".into())
            .spawn(move || match run_with_timeout(rm, Duration::from_secs(60)) {
                Ok(Some(out)) if out.status.success() => {}
                Ok(Some(out)) => {
                    tracing::warn!(container = %name, error = %last_line(&out.stderr), "cannot remove a killed task's container")
                }
                Ok(None) => tracing::warn!(container = %name, "removing a killed task's container took over a minute"),
                Err(e) => tracing::warn!(container = %name, error = %e, "cannot run podman to remove a killed task's container"),
            });
    }
}

/// `--user` and groups for the process in the container; without an
/// identity, the image's own user (the agent's, rootless).
fn identity_args(identity: Option<&Identity>) -> Vec<OsString> {
    let Some(identity) = identity else {
        return Vec::new();
    };
    let mut a: Vec<OsString> = vec![
        "--user".into(),
        format!("{}:{}", identity.uid, identity.gid).into(),
    ];
    for gid in &identity.groups {
        a.extend(["--group-add".into(), gid.to_string().into()]);
    }
    if identity.uid != 0 {
        a.extend([
            "--cap-drop".into(),
            "all".into(),
            "--security-opt".into(),
            "no-new-privileges".into(),
        ]);
    }
    a
}

/// podman's own environment: a fixed PATH and the agent's HOME and
/// runtime directory (a rootless podman keeps its store there).
pub fn podman_env() -> Vec<(String, String)> {
    let mut env = vec![("PATH".to_owned(), DEFAULT_PATH.to_owned())];
    for name in ["HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME"] {
        if let Ok(value) = std::env::var(name) {
            env.push((name.to_owned(), value));
        }
    }
    env
}

/// `["text"]`: podman's `--entrypoint` as a JSON array of one string,
/// so that it is taken whole, never split on spaces.
fn json_array(text: &str) -> String {
    let mut out = String::from("[\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push_str("\"]");
    out
}

fn last_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message");
    line.chars().take(300).collect()
}

/// Runs `command` to its end or `timeout` (then kills it: `None`).
fn run_with_timeout(
    mut command: std::process::Command,
    timeout: Duration,
) -> std::io::Result<Option<std::process::Output>> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn()?;
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output().map(Some);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Driver for PodmanDriver {
    fn name(&self) -> &'static str {
        DRIVER_PODMAN
    }

    fn prepare(
        &self,
        template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError> {
        let limits = crate::exec::limits_of(template, self.config.pids_max)?;
        for device in &template.devices {
            if !self.config.allowed_devices.iter().any(|d| d == device) {
                return Err(DriverError::DeviceNotAllowed {
                    device: device.clone(),
                });
            }
        }
        let image = ImageRef::parse(template.image.as_deref().unwrap_or_default())
            .map_err(|why| DriverError::InvalidResources(format!("spec.image: {why}")))?;
        let dir_error = |source| DriverError::TaskDir {
            path: task_dir.to_path_buf(),
            source,
        };
        if let Some(identity) = &identity {
            std::os::unix::fs::chown(task_dir, Some(identity.uid), Some(identity.gid)).map_err(dir_error)?;
        }
        std::fs::set_permissions(task_dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_error)?;
        std::fs::create_dir_all(&self.config.run_dir).map_err(|source| DriverError::TaskDir {
            path: self.config.run_dir.clone(),
            source,
        })?;
        self.ensure_image(&image)?;
        Ok(Prepared {
            user: user_name(identity.as_ref()),
            identity,
            task_dir: task_dir.to_path_buf(),
            cwd: resolve_cwd(template, task_dir)?,
            limits,
            config_env: Default::default(),
        })
    }

    fn start(&self, launch: Launch<'_>) -> Result<Launched, DriverError> {
        let t = launch.template;
        // The container's variables: the agent's, the configuration's, the
        // template's literal ones. Their names go on podman's command line
        // and their values through its environment, never on a command
        // line another user can read.
        let mut vars: Vec<(String, String)> = launch.extra_env.to_vec();
        vars.extend(launch.prepared.config_env.0.iter().cloned());
        vars.extend(
            t.env
                .iter()
                .filter(|var| var.value_from.is_none())
                .map(|var| (var.name.clone(), var.value.clone())),
        );
        let mut names: Vec<String> = Vec::new();
        for (name, _) in &vars {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let args = if launch.beside_task {
            self.exec_args(&launch, &names)
        } else {
            self.run_args(&launch, &names)?
        };
        let podman = TaskTemplate {
            command: self.config.program.display().to_string(),
            args: self
                .config
                .global_args
                .iter()
                .cloned()
                .chain(args.into_iter().map(|a| a.to_string_lossy().into_owned()))
                .collect(),
            ..TaskTemplate::default()
        };
        // podman runs as the agent's user: the identity is the container's.
        let prepared = Prepared {
            identity: None,
            user: launch.prepared.user.clone(),
            task_dir: launch.prepared.task_dir.clone(),
            cwd: launch.prepared.task_dir.clone(),
            limits: Default::default(),
            config_env: crate::ConfigEnv(vars),
        };
        // The shim's fence (no agent running) kills the container's PID 1
        // with the client: the container is outside the client's group.
        let kill_also =
            (!launch.beside_task).then(|| self.run_file(&container_name(&launch.prepared.task_dir), "pid"));
        let launch = Launch {
            template: &podman,
            prepared: &prepared,
            extra_env: &[],
            stdout: launch.stdout,
            stderr: launch.stderr,
            cgroup: launch.cgroup,
            shim: launch.shim,
            stdin: launch.stdin,
            terminal: launch.terminal,
            beside_task: launch.beside_task,
        };
        launch::spawn(
            launch,
            Isolation {
                base_env: podman_env(),
                no_new_privs: false,
                address_space: None,
                processes: None,
                kill_also,
            },
        )
    }

    fn kill_beyond_group(&self, task_dir: &Path) {
        self.kill_container(task_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entrypoint_is_one_json_string() {
        assert_eq!(json_array("/bin/sh"), r#"["/bin/sh"]"#);
        assert_eq!(json_array("a \"b\"\\\n"), r#"["a \"b\"\\\u000a"]"#);
    }

    #[test]
    fn a_container_is_named_after_its_attempts_directory() {
        assert_eq!(
            container_name(Path::new("/s/tasks/0f1e-2a-3/work")),
            "k8s4r-0f1e-2a-3"
        );
        assert_eq!(container_name(Path::new("/s/tasks/0f1e-2a-3")), "k8s4r-0f1e-2a-3");
        assert_eq!(container_name(Path::new("/s/tasks/a b")), "k8s4r-a_b");
    }

    #[test]
    fn a_pidfile_naming_a_process_of_another_task_is_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("c.pid");
        // This test's own process does not carry the task's marker.
        std::fs::write(&pidfile, std::process::id().to_string()).unwrap();
        assert_eq!(
            crate::shim::container_pid(&pidfile, Path::new("/nowhere/tasks/x-1")),
            None
        );
        std::fs::write(&pidfile, "1").unwrap();
        assert_eq!(crate::shim::container_pid(&pidfile, Path::new("/")), None);
    }

    #[test]
    fn a_non_root_identity_runs_without_capabilities() {
        let args = identity_args(Some(&Identity {
            name: "k8s4r-70001".into(),
            uid: 70001,
            gid: 70001,
            groups: vec![20],
        }));
        let args: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            [
                "--user",
                "70001:70001",
                "--group-add",
                "20",
                "--cap-drop",
                "all",
                "--security-opt",
                "no-new-privileges"
            ]
        );
        assert!(identity_args(None).is_empty());
    }
}
