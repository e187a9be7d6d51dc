//! `k8s4r logs`: a task's output, read live from its robot through the
//! cluster's logs API (`logs.k8s4r.io`, served by k8s4r-server behind the
//! API server, which checks the caller's RBAC for `get` on `tasks/log`).
//!
//! The output goes to stdout and nothing else does: what the server has to
//! say about it (output skipped or lost, a robot that stopped answering, a
//! robot that is offline) goes to stderr, and makes the command fail, as
//! does a read that ends before the server said it was through (the answer
//! is framed, [`k8s4r_api::log_frame`], so that a cut shows).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s4r_api::log_frame::{self, Decoder, Frame};
use k8s4r_api::names::{LABEL_GROUP, LABEL_JOB};
use k8s4r_api::Task;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::operate::KubeArgs;

/// `k8s4r logs`.
#[derive(Debug, Clone, ClapArgs)]
pub struct LogsArgs {
    /// The Task.
    #[arg(required_unless_present = "job")]
    pub task: Option<String>,
    /// Every Task of this Job, each line prefixed by its task's name.
    #[arg(long, conflicts_with = "task")]
    pub job: Option<String>,
    /// With --job: only this group.
    #[arg(long, requires = "job")]
    pub group: Option<String>,
    /// Go on printing what the task writes, until it ends or Ctrl-C.
    #[arg(short, long)]
    pub follow: bool,
    /// Only the last N lines of what was written so far.
    #[arg(long)]
    pub tail: Option<u32>,
    /// Only what was written this long ago or later (e.g. 10m; to the
    /// precision of the robot's log files).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    /// Standard error instead of standard output.
    #[arg(long, conflicts_with = "all")]
    pub stderr: bool,
    /// Standard output and standard error.
    #[arg(long)]
    pub all: bool,
    /// The attempt before the current one.
    #[arg(short, long)]
    pub previous: bool,
    #[command(flatten)]
    pub kube: KubeArgs,
}

impl LogsArgs {
    fn query(&self) -> String {
        let mut q = vec![format!(
            "stream={}",
            if self.all {
                "all"
            } else if self.stderr {
                "stderr"
            } else {
                "stdout"
            }
        )];
        if self.follow {
            q.push("follow=true".into());
        }
        if self.previous {
            q.push("previous=true".into());
        }
        if let Some(n) = self.tail {
            q.push(format!("tailLines={n}"));
        }
        if let Some(d) = self.since {
            q.push(format!("sinceSeconds={}", d.as_secs().max(1)));
        }
        q.join("&")
    }
}

/// Prints the logs asked for; with several tasks, each line prefixed by
/// its task's name. Ends on Ctrl-C.
pub async fn run(args: LogsArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (client, ns) = args.kube.connect(data_dir).await?;
    let (tasks, prefixed) = match (&args.task, &args.job) {
        (Some(task), _) => (vec![task.clone()], false),
        (None, Some(job)) => {
            let mut selector = format!("{LABEL_JOB}={job}");
            if let Some(group) = &args.group {
                selector.push_str(&format!(",{LABEL_GROUP}={group}"));
            }
            let api: Api<Task> = Api::namespaced(client.clone(), &ns);
            let list = api
                .list(&ListParams::default().labels(&selector))
                .await
                .with_context(|| format!("listing the tasks of job {job} in namespace {ns}"))?;
            let mut names: Vec<String> = list
                .items
                .iter()
                .filter_map(|t| t.metadata.name.clone())
                .collect();
            names.sort();
            if names.is_empty() {
                bail!("job {job} has no tasks in namespace {ns} (yet?)");
            }
            (names, true)
        }
        (None, None) => bail!("say which task, or --job"),
    };
    let query = args.query();
    let readers = futures::future::join_all(tasks.iter().map(|name| {
        let prefix = prefixed.then(|| format!("[{name}] "));
        stream_one(&client, &ns, name, &query, prefix, args.follow)
    }));
    let results = tokio::select! {
        results = readers => results,
        _ = tokio::signal::ctrl_c() => return Ok(()),
    };
    let mut errors: Vec<(String, anyhow::Error)> = results
        .into_iter()
        .zip(&tasks)
        .filter_map(|(r, name)| r.err().map(|e| (name.clone(), e)))
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    if !prefixed {
        if let Some((_, error)) = errors.pop() {
            return Err(error);
        }
    }
    // Only partial (robots that could not be asked): said as such, for
    // the exit code.
    let partial = errors.iter().all(|(_, e)| e.downcast_ref::<Partial>().is_some());
    let said = errors
        .iter()
        .map(|(name, e)| format!("task {name}: {e:#}"))
        .collect::<Vec<_>>()
        .join("\n");
    if partial {
        return Err(Partial(said).into());
    }
    bail!("{said}")
}

/// What a refusal from the API server or the logs API means for a person.
fn refusal(code: u16, message: &str, name: &str, ns: &str) -> anyhow::Error {
    match code {
        401 => anyhow::anyhow!("the API server did not accept your credentials: {message}"),
        403 => anyhow::anyhow!(
            "you may not read the logs of task {name} in namespace {ns}: it takes `get` on `tasks/log` in API group logs.k8s4r.io ({message})"
        ),
        404 if message.contains("not found") && message.contains(name) => {
            anyhow::anyhow!("task {name} not found in namespace {ns}")
        }
        404 => anyhow::anyhow!(
            "this cluster does not serve k8s4r logs (no APIService v1alpha1.logs.k8s4r.io; see deploy/cluster/30-logs.yaml): {message}"
        ),
        503 => anyhow::anyhow!("the logs API (k8s4r-server) is unavailable: {message}"),
        _ => anyhow::anyhow!("{message} (HTTP {code})"),
    }
}

/// The message of a refusal's body (a Kubernetes Status, or plain text).
pub(crate) async fn refusal_message<S, E>(body: &mut S) -> anyhow::Result<String>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut raw = Vec::new();
    while let Some(chunk) = body.next().await {
        raw.extend_from_slice(&chunk.map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    Ok(serde_json::from_slice::<serde_json::Value>(&raw)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&raw).into_owned()))
}

/// An answer of the logs API: what it says beside the output, and the
/// output as it arrives.
pub struct Reading {
    /// Said instead of reading live (the robot is offline, or did not
    /// answer): the output is the last the cluster has.
    pub notice: Option<String>,
    /// The robot the output comes from, live.
    pub robot: Option<String>,
    /// The body is in frames ([`k8s4r_api::log_frame`]).
    pub framed: bool,
    /// The output.
    pub body: std::pin::Pin<Box<dyn futures::Stream<Item = anyhow::Result<bytes::Bytes>> + Send>>,
}

/// Asks the logs API for task `name`'s output (`query` as kubectl's logs
/// has it: `follow=true&tailLines=10&stream=all`...).
pub async fn open(client: &Client, ns: &str, name: &str, query: &str) -> anyhow::Result<Reading> {
    let path = format!("/apis/logs.k8s4r.io/v1alpha1/namespaces/{ns}/tasks/{name}/log?{query}");
    let request = http::Request::get(&path)
        .body(kube::client::Body::empty())
        .context("building the request")?;
    let response = client
        .send(request)
        .await
        .context("asking the API server for the logs")?;
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = response.into_body().into_data_stream();
    if !status.is_success() {
        let message = refusal_message(&mut body).await?;
        return Err(refusal(status.as_u16(), &message, name, ns));
    }
    let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_owned);
    Ok(Reading {
        notice: text("x-k8s4r-notice"),
        robot: text("x-k8s4r-robot"),
        framed: text(http::header::CONTENT_TYPE.as_str())
            .is_some_and(|t| t.starts_with(log_frame::CONTENT_TYPE)),
        body: Box::pin(body.map(|c| c.map_err(|e| anyhow::anyhow!("the logs stream broke: {e}")))),
    })
}

async fn stream_one(
    client: &Client,
    ns: &str,
    name: &str,
    query: &str,
    prefix: Option<String>,
    follow: bool,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    copy(client, ns, name, query, prefix, follow, &mut out, &mut err).await
}

/// Reads task `name`'s output (`query` as [`open`] takes it) into `out`,
/// each line after `prefix` if there is one, and says on `err` what is
/// missing from it. An error when the output is not complete: the read
/// was cut (the connection ended before the logs API said it was through),
/// some output was lost or skipped, or the robot could not be asked and
/// only the cluster's last output was printed.
#[allow(clippy::too_many_arguments)]
pub async fn copy(
    client: &Client,
    ns: &str,
    name: &str,
    query: &str,
    prefix: Option<String>,
    follow: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let query = if query.is_empty() {
        log_frame::QUERY.to_owned()
    } else {
        format!("{query}&{}", log_frame::QUERY)
    };
    let Reading {
        notice,
        robot,
        framed,
        mut body,
    } = open(client, ns, name, &query).await?;
    if let Some(notice) = &notice {
        writeln!(err, "warning: task {name}: {notice}")?;
    } else if follow {
        let robot = robot.map(|r| format!(" on robot {r}")).unwrap_or_default();
        writeln!(err, "following task {name}{robot} (Ctrl-C to stop)")?;
    }
    let mut lines = Lines {
        prefix,
        partial: Vec::new(),
    };
    let mut frames = framed.then(Decoder::default);
    let mut warnings = 0;
    while let Some(piece) = body.next().await {
        let piece = match piece {
            Ok(piece) => piece,
            Err(e) => {
                lines.finish(out)?;
                bail!("the read was cut, the output above is incomplete: {e:#}");
            }
        };
        let Some(frames) = &mut frames else {
            lines.write(out, &piece)?;
            continue;
        };
        frames.push(&piece);
        while let Some(frame) = frames.next_frame()? {
            match frame {
                Frame::Output(data) => lines.write(out, &data)?,
                Frame::Warning(text) => {
                    warnings += 1;
                    writeln!(err, "warning: task {name}: {text}")?;
                }
                Frame::End => {}
            }
        }
    }
    lines.finish(out)?;
    if frames.as_ref().is_some_and(|f| !f.ended()) {
        bail!("the read was cut, the output above is incomplete: the connection ended before the logs API said it was through");
    }
    if warnings > 0 {
        bail!("the output above is incomplete (see the warning(s) above)");
    }
    if let Some(notice) = notice {
        return Err(Partial(notice).into());
    }
    Ok(())
}

/// The exit code of `k8s4r logs` when the robot could not be asked and
/// only the last output the cluster keeps was printed.
pub const EXIT_PARTIAL: u8 = 3;

/// The robot could not be asked: what was printed is the last output the
/// cluster keeps (the Task's `status.outputTail`), not the whole of it.
#[derive(Debug, thiserror::Error)]
#[error("only the last output the cluster keeps was printed ({0})")]
pub struct Partial(pub String);

/// Writes output as it comes, or, with a prefix, line by line.
struct Lines {
    prefix: Option<String>,
    partial: Vec<u8>,
}

impl Lines {
    fn write(&mut self, out: &mut dyn Write, data: &[u8]) -> std::io::Result<()> {
        match &self.prefix {
            None => out.write_all(data)?,
            Some(prefix) => {
                self.partial.extend_from_slice(data);
                while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = self.partial.drain(..=end).collect();
                    out.write_all(prefix.as_bytes())?;
                    out.write_all(&line)?;
                }
            }
        }
        out.flush()
    }

    /// Writes what is left of a last line without its newline.
    fn finish(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if let (Some(prefix), false) = (&self.prefix, self.partial.is_empty()) {
            out.write_all(prefix.as_bytes())?;
            out.write_all(&self.partial)?;
            out.write_all(b"\n")?;
            self.partial.clear();
        }
        out.flush()
    }
}
