//! `k8s4r exec`, `k8s4r port-forward` and `k8s4r cp`: sessions on a
//! robot through the cluster, as kubectl's exec, port-forward and cp
//! reach a pod: a WebSocket to the aggregated API (`logs.k8s4r.io`, the
//! same that serves logs) in Kubernetes' channel protocol, authorized by
//! the API server as the kubeconfig's user, carried to the robot over its
//! MQTT connection by k8s4r-server.
//!
//! The exit status of `exec` is the command's. A session that ends without
//! one (the robot was cut off, the server went away) fails with what
//! happened.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use futures::{SinkExt, StreamExt};
use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::operate::KubeArgs;

pub(crate) type Ws = tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// The channel of stdin (and of what a forward sends to the robot).
pub(crate) const STDIN: u8 = 0;
/// The channel of stdout (and of what a forward gets back).
pub(crate) const STDOUT: u8 = 1;
/// The channel of stderr.
pub(crate) const STDERR: u8 = 2;
/// The channel of the final Status.
pub(crate) const STATUS: u8 = 3;
/// The channel of terminal sizes.
pub(crate) const RESIZE: u8 = 4;
/// The channel that says a stream ended.
const CLOSE: u8 = 255;
/// Bytes read from a local source at a time.
const CHUNK: usize = 32 * 1024;

/// The remote command's exit status, as this program's.
#[derive(Debug)]
pub struct RemoteExit(pub u8);

impl std::fmt::Display for RemoteExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the command exited with status {}", self.0)
    }
}

impl std::error::Error for RemoteExit {}

/// Where a session goes: a task (`NAME` or `task/NAME`) or a robot
/// (`robot/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A task, in the namespace.
    Task(String),
    /// A robot.
    Robot(String),
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, name) = match s.split_once('/') {
            Some((kind, name)) => (kind, name),
            None => ("task", s),
        };
        if name.is_empty() || name.contains('/') {
            return Err(format!(
                "{s:?}: name a task (NAME or task/NAME) or a robot (robot/NAME)"
            ));
        }
        match kind {
            "task" | "tasks" => Ok(Target::Task(name.to_owned())),
            "robot" | "robots" => Ok(Target::Robot(name.to_owned())),
            other => Err(format!("{other:?} is neither task nor robot")),
        }
    }
}

impl Target {
    fn path(&self, ns: &str, subresource: &str) -> String {
        match self {
            Target::Task(name) => {
                format!("/apis/logs.k8s4r.io/v1alpha1/namespaces/{ns}/tasks/{name}/{subresource}")
            }
            Target::Robot(name) => format!("/apis/logs.k8s4r.io/v1alpha1/robots/{name}/{subresource}"),
        }
    }

    fn describe(&self, ns: &str) -> String {
        match self {
            Target::Task(name) => format!("task {name} in namespace {ns}"),
            Target::Robot(name) => format!("robot {name}"),
        }
    }

    fn resource(&self) -> &'static str {
        match self {
            Target::Task(_) => "tasks",
            Target::Robot(_) => "robots",
        }
    }
}

/// `k8s4r exec`.
#[derive(Debug, Clone, ClapArgs)]
pub struct ExecArgs {
    /// Pass stdin to the command (its end too).
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the command a terminal (a pty), sized as this one and resized
    /// with it.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The task (NAME or task/NAME), or robot/NAME for the robot itself.
    pub target: Target,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `k8s4r port-forward`.
#[derive(Debug, Clone, ClapArgs)]
pub struct PortForwardArgs {
    /// The task (NAME or task/NAME), or robot/NAME.
    pub target: Target,
    /// `[LOCAL:]REMOTE`: listen on LOCAL (REMOTE when not given; 0 or
    /// empty picks one) and forward to REMOTE on the robot's loopback.
    #[arg(required = true)]
    pub ports: Vec<String>,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `k8s4r cp`.
#[derive(Debug, Clone, ClapArgs)]
pub struct CpArgs {
    /// `TASK:PATH`, `robot/NAME:PATH` or a local file.
    pub source: String,
    /// `TASK:PATH`, `robot/NAME:PATH` or a local path.
    pub destination: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Opens a session's WebSocket, or says why not as a person reads it.
pub(crate) async fn connect(
    client: &Client,
    target: &Target,
    ns: &str,
    subresource: &str,
    query: &str,
) -> anyhow::Result<Ws> {
    let path = format!("{}?{query}", target.path(ns, subresource));
    let request = http::Request::get(&path)
        .body(Vec::new())
        .context("building the request")?;
    match client.connect(request).await {
        Ok(connection) => Ok(connection.into_stream()),
        Err(kube::Error::Api(status)) => {
            let message = status.message.clone();
            let code = status.code;
            Err(match code {
                401 => anyhow::anyhow!("the API server did not accept your credentials: {message}"),
                403 if message.contains("cannot") => anyhow::anyhow!(
                    "you may not open {subresource} sessions on {}: it takes `create` on `{}/{subresource}` in API group logs.k8s4r.io ({message})",
                    target.describe(ns),
                    target.resource()
                ),
                // The robot refused: its message names the setting.
                403 => anyhow::anyhow!("{message}"),
                404 if message.contains("not found") => anyhow::anyhow!("{message}"),
                404 => anyhow::anyhow!(
                    "this cluster does not serve k8s4r sessions (no APIService v1alpha1.logs.k8s4r.io, or a k8s4r-server too old): {message}"
                ),
                _ => anyhow::anyhow!("{message} (HTTP {code})"),
            })
        }
        Err(e) => Err(anyhow::anyhow!(e).context(format!("opening a session on {}", target.describe(ns)))),
    }
}

pub(crate) fn query_of(pairs: &[(&str, String)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        q.append_pair(k, v);
    }
    q.finish()
}

/// `k8s4r exec`: runs the command and exits with its status.
pub async fn exec(args: ExecArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (client, ns) = args.kube.connect(data_dir).await?;
    let mut pairs: Vec<(&str, String)> = args.command.iter().map(|c| ("command", c.clone())).collect();
    if args.stdin {
        pairs.push(("stdin", "true".into()));
    }
    let local_tty = args.tty && nix::unistd::isatty(std::io::stdin()).unwrap_or(false);
    if args.tty {
        pairs.push(("tty", "true".into()));
        if let Some((w, h)) = window_size() {
            pairs.push(("width", w.to_string()));
            pairs.push(("height", h.to_string()));
        }
    }
    let ws = connect(&client, &args.target, &ns, "exec", &query_of(&pairs)).await?;
    // Raw mode only while the session is open; restored on every way out.
    let _raw = if local_tty && args.stdin {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let code = run_exec(ws, args.stdin, args.tty).await?;
    drop(_raw);
    if code != 0 {
        return Err(RemoteExit(u8::try_from(code.clamp(0, 255)).unwrap_or(1)).into());
    }
    Ok(())
}

/// The terminal's size, if stdout is one.
fn window_size() -> Option<(u16, u16)> {
    terminal_size::terminal_size().map(|(w, h)| (w.0, h.0))
}

/// The local terminal in raw mode (keys go to the remote one as typed),
/// put back when dropped.
struct RawMode(nix::sys::termios::Termios);

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).context("reading the terminal's settings")?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).context("setting the terminal raw")?;
        Ok(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, &self.0);
    }
}

/// Carries stdin, stdout, stderr and resizes until the final Status; the
/// exit code it gives.
async fn run_exec(ws: Ws, send_stdin: bool, tty: bool) -> anyhow::Result<i32> {
    let (mut sink, mut stream) = ws.split();
    let (to_ws, mut outgoing) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    if send_stdin {
        let to_ws = to_ws.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; CHUNK];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(n) if n > 0 => {
                        let mut message = vec![STDIN];
                        message.extend_from_slice(&buf[..n]);
                        if to_ws.send(message).await.is_err() {
                            return;
                        }
                    }
                    _ => {
                        let _ = to_ws.send(vec![CLOSE, STDIN]).await;
                        return;
                    }
                }
            }
        });
    }
    if tty {
        let to_ws = to_ws.clone();
        tokio::spawn(async move {
            let Ok(mut winch) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while winch.recv().await.is_some() {
                if let Some((w, h)) = window_size() {
                    let mut message = vec![RESIZE];
                    message.extend(
                        serde_json::json!({"Width": w, "Height": h})
                            .to_string()
                            .into_bytes(),
                    );
                    if to_ws.send(message).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    drop(to_ws);
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    loop {
        tokio::select! {
            Some(message) = outgoing.recv() => {
                if sink.send(Message::Binary(message.into())).await.is_err() {
                    bail!("the session's connection was lost");
                }
            }
            message = stream.next() => {
                let early = "the session ended without the command's exit status (the connection was lost)";
                let Some((channel, body)) = received(message, "session", early)? else { continue };
                let body = &body[..];
                match channel {
                    STDOUT => { stdout.write_all(body).await?; stdout.flush().await?; }
                    STDERR => { stderr.write_all(body).await?; stderr.flush().await?; }
                    STATUS => return exit_code_of(body),
                    _ => {}
                }
            }
        }
    }
}

/// The channel and bytes of the session's next message; None for one
/// that carries none (a ping, an empty frame); an error once the
/// connection ended (`early` says what that means here) or failed.
pub(crate) fn received(
    message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    what: &str,
    early: &str,
) -> anyhow::Result<Option<(u8, bytes::Bytes)>> {
    match message {
        Some(Ok(Message::Binary(data))) => Ok(data.first().map(|&channel| (channel, data.slice(1..)))),
        Some(Ok(Message::Close(_))) | None => bail!("{early}"),
        Some(Err(e)) => bail!("the {what}'s connection failed: {e}"),
        Some(Ok(_)) => Ok(None),
    }
}

/// The exit code a final Status gives; a failure that is not an exit code
/// is an error.
pub(crate) fn exit_code_of(status: &[u8]) -> anyhow::Result<i32> {
    let status: serde_json::Value =
        serde_json::from_slice(status).context("reading the session's final status")?;
    if status["status"] == "Success" {
        return Ok(0);
    }
    if status["reason"] == "NonZeroExitCode" {
        let code = status["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
            .unwrap_or(1);
        return Ok(code);
    }
    bail!("{}", status["message"].as_str().unwrap_or("the session failed"))
}

/// `k8s4r port-forward`: listens on each local port until Ctrl-C; every
/// connection is a session of its own.
pub async fn port_forward(args: PortForwardArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (client, ns) = args.kube.connect(data_dir).await?;
    let mut listeners = Vec::new();
    for spec in &args.ports {
        let (local, remote) = match spec.split_once(':') {
            Some((local, remote)) => (local, remote),
            None => (spec.as_str(), spec.as_str()),
        };
        let remote: u16 = remote
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .with_context(|| format!("{spec:?}: the remote port must be 1 to 65535"))?;
        let local: u16 = if local.is_empty() {
            0
        } else {
            local
                .parse()
                .with_context(|| format!("{spec:?}: the local port"))?
        };
        let listener = tokio::net::TcpListener::bind((args.address.as_str(), local))
            .await
            .with_context(|| format!("listening on {}:{local}", args.address))?;
        let bound = listener.local_addr()?;
        println!("Forwarding from {bound} -> {remote}");
        listeners.push((listener, remote));
    }
    let target = args.target.clone();
    let mut serving = tokio::task::JoinSet::new();
    for (listener, remote) in listeners {
        let (client, ns, target) = (client.clone(), ns.clone(), target.clone());
        serving.spawn(async move {
            loop {
                let socket = match listener.accept().await {
                    Ok((socket, _)) => socket,
                    Err(e) => {
                        // Out of file descriptors, mostly: let some end.
                        eprintln!("accepting on port {remote}: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (client, ns, target) = (client.clone(), ns.clone(), target.clone());
                tokio::spawn(async move {
                    if let Err(e) = forward_one(&client, &target, &ns, remote, socket).await {
                        eprintln!("port {remote}: {e:#}");
                    }
                });
            }
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = serving.join_next() => bail!("a listener stopped"),
    }
}

/// One forwarded connection, to its end.
async fn forward_one(
    client: &Client,
    target: &Target,
    ns: &str,
    port: u16,
    socket: tokio::net::TcpStream,
) -> anyhow::Result<()> {
    let ws = connect(client, target, ns, "portforward", &format!("ports={port}")).await?;
    let _ = socket.set_nodelay(true);
    let (mut read, mut write) = socket.into_split();
    let (mut sink, mut stream) = ws.split();
    let mut buf = vec![0u8; CHUNK];
    let mut reading = true;
    loop {
        tokio::select! {
            n = read.read(&mut buf), if reading => match n {
                Ok(n) if n > 0 => {
                    let mut message = Vec::with_capacity(n + 1);
                    message.push(STDIN);
                    message.extend_from_slice(&buf[..n]);
                    sink.send(Message::Binary(message.into())).await.context("the session's connection was lost")?;
                }
                _ => {
                    reading = false;
                    sink.send(Message::Binary(vec![CLOSE, STDIN].into())).await.context("the session's connection was lost")?;
                }
            },
            message = stream.next() => {
                let early = "the session ended early (the connection was lost)";
                let Some((channel, body)) = received(message, "session", early)? else { continue };
                let body = &body[..];
                match channel {
                    STDOUT => write.write_all(body).await.context("writing to the local connection")?,
                    CLOSE => { let _ = write.shutdown().await; }
                    STATUS => {
                        let status: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                        if status["status"] == "Success" {
                            return Ok(());
                        }
                        bail!("{}", status["message"].as_str().unwrap_or("the forward failed"));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    Local(PathBuf),
    Remote(Target, String),
}

/// `TASK:PATH` and `robot/NAME:PATH` are remote; anything else (a path
/// with no colon before its first slash, or starting with `.` or `/`) is
/// local, as kubectl cp reads them.
fn side_of(text: &str) -> anyhow::Result<Side> {
    if text.starts_with('/') || text.starts_with('.') {
        return Ok(Side::Local(PathBuf::from(text)));
    }
    let Some((target, path)) = text.split_once(':') else {
        return Ok(Side::Local(PathBuf::from(text)));
    };
    if path.is_empty() {
        bail!("{text:?}: say which file after the colon");
    }
    let target: Target = target.parse().map_err(anyhow::Error::msg)?;
    Ok(Side::Remote(target, path.to_owned()))
}

/// `k8s4r cp`: one file, either way; the robot bounds its size.
pub async fn cp(args: CpArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (client, ns) = args.kube.connect(data_dir).await?;
    match (side_of(&args.source)?, side_of(&args.destination)?) {
        (Side::Remote(target, path), Side::Local(local)) => {
            download(&client, &target, &ns, &path, &local).await
        }
        (Side::Local(local), Side::Remote(target, path)) => {
            upload(&client, &target, &ns, &local, &path).await
        }
        (Side::Local(_), Side::Local(_)) => bail!("one side of a copy is TASK:PATH or robot/NAME:PATH"),
        (Side::Remote(..), Side::Remote(..)) => {
            bail!("copies go between here and a robot, not between robots")
        }
    }
}

/// Copies a remote file to `local` (a directory takes its name); the file
/// appears whole or not at all.
async fn download(
    client: &Client,
    target: &Target,
    ns: &str,
    path: &str,
    local: &Path,
) -> anyhow::Result<()> {
    let local = if local.is_dir() {
        local.join(path.rsplit('/').next().unwrap_or("file"))
    } else {
        local.to_path_buf()
    };
    let ws = connect(
        client,
        target,
        ns,
        "exec",
        &query_of(&[("copyFrom", path.to_owned())]),
    )
    .await?;
    let part = local.with_extension("k8s4r-part");
    let mut file = tokio::fs::File::create(&part)
        .await
        .with_context(|| format!("creating {}", part.display()))?;
    let (_sink, mut stream) = ws.split();
    let mut errors = Vec::new();
    let outcome = loop {
        let early = "the copy ended early (the connection was lost)";
        let (channel, body) = match received(stream.next().await, "copy", early) {
            Ok(Some(received)) => received,
            Ok(None) => continue,
            Err(e) => break Err(e),
        };
        let body = &body[..];
        match channel {
            STDOUT => file
                .write_all(body)
                .await
                .with_context(|| format!("writing {}", part.display()))?,
            STDERR => errors.extend_from_slice(body),
            STATUS => break exit_code_of(body),
            _ => {}
        }
    };
    let done = match outcome {
        Ok(0) => Ok(()),
        Ok(code) => Err(anyhow::anyhow!(
            "cannot copy {path} from {}: {} (exit status {code})",
            target.describe(ns),
            String::from_utf8_lossy(&errors).trim()
        )),
        Err(e) => Err(e.context(format!("copying {path} from {}", target.describe(ns)))),
    };
    if let Err(e) = done {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    file.sync_all().await?;
    tokio::fs::rename(&part, &local)
        .await
        .with_context(|| format!("renaming {} to {}", part.display(), local.display()))?;
    Ok(())
}

/// Copies `local` to a remote path (a directory there takes its name).
async fn upload(client: &Client, target: &Target, ns: &str, local: &Path, path: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut file = tokio::fs::File::open(local)
        .await
        .with_context(|| format!("opening {}", local.display()))?;
    let meta = file.metadata().await?;
    if !meta.is_file() {
        bail!("{} is not a file (directories are not copied)", local.display());
    }
    let pairs = [
        ("copyTo", path.to_owned()),
        ("length", meta.len().to_string()),
        ("mode", format!("{:o}", meta.permissions().mode() & 0o777)),
    ];
    let ws = connect(client, target, ns, "exec", &query_of(&pairs)).await?;
    let (mut sink, mut stream) = ws.split();
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut reading = true;
    let mut errors = Vec::new();
    loop {
        tokio::select! {
            n = file.read(&mut buf), if reading => {
                let n = n.with_context(|| format!("reading {}", local.display()))?;
                if n == 0 {
                    reading = false;
                    sink.send(Message::Binary(vec![CLOSE, STDIN].into())).await.context("the copy's connection was lost")?;
                    continue;
                }
                sent += n as u64;
                let mut message = Vec::with_capacity(n + 1);
                message.push(STDIN);
                message.extend_from_slice(&buf[..n]);
                sink.send(Message::Binary(message.into())).await.context("the copy's connection was lost")?;
            }
            message = stream.next() => {
                let early = "the copy ended early (the connection was lost); the robot keeps its file as it was";
                let Some((channel, body)) = received(message, "copy", early)? else { continue };
                let body = &body[..];
                match channel {
                    STDERR | STDOUT => errors.extend_from_slice(body),
                    STATUS => {
                        let code = exit_code_of(body).with_context(|| format!("copying to {path} on {}", target.describe(ns)))?;
                        if code != 0 {
                            bail!("cannot copy to {path} on {}: {} (exit status {code})", target.describe(ns), String::from_utf8_lossy(&errors).trim());
                        }
                        if sent != meta.len() {
                            bail!("{} changed while it was copied", local.display());
                        }
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_copy_sides_read_as_kubectl_writes_them() {
        assert_eq!("nav".parse::<Target>(), Ok(Target::Task("nav".into())));
        assert_eq!("task/nav".parse::<Target>(), Ok(Target::Task("nav".into())));
        assert_eq!("robot/rb1".parse::<Target>(), Ok(Target::Robot("rb1".into())));
        assert!("pod/x".parse::<Target>().is_err());
        assert_eq!(
            side_of("nav:/tmp/a").unwrap(),
            Side::Remote(Target::Task("nav".into()), "/tmp/a".into())
        );
        assert_eq!(
            side_of("robot/rb1:cal.yaml").unwrap(),
            Side::Remote(Target::Robot("rb1".into()), "cal.yaml".into())
        );
        assert_eq!(side_of("./a:b").unwrap(), Side::Local("./a:b".into()));
        assert_eq!(side_of("file").unwrap(), Side::Local("file".into()));
        assert!(side_of("nav:").is_err());
    }

    #[test]
    fn the_final_status_gives_the_exit_code() {
        assert_eq!(exit_code_of(br#"{"status":"Success"}"#).unwrap(), 0);
        let three = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(exit_code_of(three).unwrap(), 3);
        let refused = br#"{"status":"Failure","reason":"InternalError","message":"robot rb1 is gone"}"#;
        assert_eq!(
            exit_code_of(refused).unwrap_err().to_string(),
            "robot rb1 is gone"
        );
    }
}
