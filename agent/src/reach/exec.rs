//! A process for a session: `k8s4r exec` (a command with a pty or pipes),
//! and `k8s4r cp` (a `cat` of the file, or a `cat` into it), started as
//! the task runs (its driver, user, directory, environment and cgroup:
//! what the supervisor's exec checks use) or on the robot as its session
//! user.
//!
//! A copy runs as the task's (or the session user's) own process, so it
//! reads and writes only what that user may: the agent, often root, never
//! opens the file itself. An upload goes to a file beside the target and
//! is renamed over it only once every byte announced has arrived; a cut
//! session leaves the target as it was.
//!
//! When the session ends before the process (the client left, the robot
//! was cut off, the agent is stopping), the process is hung up as ssh
//! does it: the terminal closes and its process group gets SIGHUP; what
//! is left of the group after the grace (the task's `killTimeout`, or the
//! robot's `hangup_grace`) gets SIGKILL.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::time::Duration;

use k8s4r_api::protocol::reach::{
    SessionEnd, SessionKind, SessionOpen, SessionOpened, MAX_SESSION_DATA, STDERR, STDIN, STDOUT,
};
use k8s4r_api::TaskTemplate;
use k8s4r_drivers::identity::{self, RunAs};
use nix::sys::signal::Signal;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

use super::link::{AtEof, Incoming, Link, Writer};
use super::{Place, ReachConfig};
use crate::supervisor::checks::{launch_with, AsTask, Streams};
use crate::supervisor::process::{BoxFuture, Process, ProcessGroup};
use crate::supervisor::SupervisorHandle;

/// How long output is still read after the process exited (a child it
/// left may hold the pipe open).
const DRAIN: Duration = Duration::from_secs(2);

/// The shell script an upload runs: `$1` the target (a directory takes
/// the file by `$3`, its name), `$2` the mode.
const UPLOAD: &str = r#"t="$1"; [ -d "$t" ] && t="$t/$3"; p="$t.k8s4r-part"
trap 'rm -f "$p"; exit 129' HUP TERM INT
umask 077
cat > "$p" && chmod "$2" "$p" && mv -f "$p" "$t" || { rm -f "$p"; exit 1; }"#;

/// The shell script an image push runs, as the agent: `$1` the spool
/// directory, `$2` the archive's sha256, `$3` its length, `$4` the image
/// the archive must hold (empty: any), then podman and its options. One
/// push of an archive at a time; it says first how much of the archive the
/// robot already has (`have N`: a push cut before resumes there), appends
/// what comes up to the length, checks the whole archive's sha256, loads
/// it and checks that the image is there by its digest. A verified archive
/// stays until it loads; archives of pushes abandoned for a day go.
const LOAD_IMAGE: &str = r#"d="$1"; s="$2"; n="$3"; ref="$4"; m="$5"; shift 5
p="$d/$s.part"; umask 077; mkdir -p "$d" || exit 1
exec 9>>"$d/$s.lock"
flock -n 9 || { echo "another push of this archive to this robot is under way" >&2; exit 75; }
find "$d" -maxdepth 1 -name '*.part' ! -name "$s.part" -mmin +1440 -delete 2>/dev/null
h=$(stat -c %s "$p" 2>/dev/null || echo 0)
if [ "$h" -gt "$n" ]; then : > "$p"; h=0; fi
echo "have $h"
head -c "$((n - h))" >> "$p" || exit 1
h=$(stat -c %s "$p")
if [ "$h" -ne "$n" ]; then echo "the archive arrived in part ($h of $n bytes); push it again to resume" >&2; exit 75; fi
if ! echo "$s  $p" | sha256sum -c --status; then rm -f "$p"; echo "the archive's sha256 is not $s" >&2; exit 65; fi
"$@" load --quiet --input "$p" || exit 1
if [ -n "$ref" ] && ! "$@" image exists "$ref"; then
  rm -f "$p"
  echo "the archive loaded but holds no image $ref: its digest changed on the way into the archive (push an image by the digest of its own manifest)" >&2
  exit 65
fi
hex="${ref##*@sha256:}"
case "$hex" in
  *[!0-9a-f]*) ;;
  ????????????????????????????????????????????????????????????????) mkdir -p "$m" && printf '%s\n' "$ref" > "$m/$hex" ;;
esac
rm -f "$p" "$d/$s.lock""#;

/// Runs the session's process to its end; what the session said last.
pub(super) async fn run(
    mut link: Link,
    open: &SessionOpen,
    place: &Place,
    config: &ReachConfig,
    supervisor: &SupervisorHandle,
    stop: CancellationToken,
) -> SessionEnd {
    let started = match start(open, place, config, supervisor).await {
        Ok(started) => started,
        Err(why) => return link.end(SessionEnd::error(why)).await,
    };
    let Started {
        process,
        io,
        run_as,
        grace,
    } = started;
    if !link
        .opened(SessionOpened {
            window: 0,
            length: None,
            run_as: Some(run_as),
        })
        .await
    {
        let _ = hang_up(process.group.as_ref(), process.exit, grace).await;
        return SessionEnd::error("the robot's connection is gone");
    }
    // An image push is bounded by its announced length (the script reads
    // no more), not by max_copy_bytes: images are larger than files.
    let limit = match open.kind {
        SessionKind::Download | SessionKind::Upload => Some(config.max_copy_bytes),
        _ => None,
    };
    pump(link, open, process, io, limit, grace, stop).await
}

/// A started process and its side of the streams.
struct Started {
    process: Process,
    io: Io,
    run_as: String,
    grace: Duration,
}

/// The agent's ends of a process's streams.
struct Io {
    /// stdout (with a pty: the master, both outputs in one).
    out: pipe::Receiver,
    /// stderr, without a pty.
    err: Option<pipe::Receiver>,
    /// Where stdin goes, when it comes from the client.
    stdin: Option<Writer>,
    /// The pty's master, to resize it and to hang it up.
    master: Option<OwnedFd>,
}

/// The command a session runs, as argv.
fn command_of(open: &SessionOpen, images: Option<&super::ImageLoads>) -> Vec<String> {
    match open.kind {
        SessionKind::Download => vec!["cat".into(), "--".into(), open.path.clone().unwrap_or_default()],
        SessionKind::LoadImage => {
            let mut argv: Vec<String> = vec![
                "sh".into(),
                "-c".into(),
                LOAD_IMAGE.into(),
                "k8s4r-image-push".into(),
                images.map(|i| i.dir.display().to_string()).unwrap_or_default(),
                open.sha256.clone().unwrap_or_default(),
                open.length.unwrap_or(0).to_string(),
                open.image.clone().unwrap_or_default(),
                images.map(|i| i.marks.display().to_string()).unwrap_or_default(),
            ];
            argv.extend(images.map(|i| i.podman.clone()).unwrap_or_default());
            argv
        }
        SessionKind::Upload => {
            let path = open.path.clone().unwrap_or_default();
            let name = path.rsplit('/').next().unwrap_or_default().to_owned();
            // Permission bits only: an upload never makes a setuid file.
            vec![
                "sh".into(),
                "-c".into(),
                UPLOAD.into(),
                "k8s4r-cp".into(),
                path,
                format!("{:o}", open.mode.unwrap_or(0o644) & 0o777),
                name,
            ]
        }
        _ => open.command.clone(),
    }
}

/// Starts the process where `place` says.
async fn start(
    open: &SessionOpen,
    place: &Place,
    config: &ReachConfig,
    supervisor: &SupervisorHandle,
) -> Result<Started, String> {
    let argv = command_of(open, config.images.as_ref());
    let (command, args) = argv.split_first().ok_or("no command")?;
    let (mut task, grace) = match place {
        Place::Task { uid, attempt } => {
            let task = supervisor.sandbox(Some(uid), *attempt).await?;
            let grace = k8s4r_api::validation::kill_timeout_of(&task.template);
            (task, grace)
        }
        Place::Robot { user } => {
            let mut task = supervisor.sandbox(None, None).await?;
            task.prepared = Some(robot_user(&task, user.clone()).await?);
            (task, Duration::from_secs(10))
        }
        Place::Images => {
            let mut task = supervisor.sandbox(None, None).await?;
            task.prepared = Some(as_agent(&task).await?);
            // podman's own environment (a rootless store lives under the
            // agent's HOME), its temporary files beside the spool.
            task.env.extend(k8s4r_drivers::podman::podman_env());
            if let Some(images) = &config.images {
                task.env.push(("TMPDIR".into(), images.dir.display().to_string()));
            }
            (task, Duration::from_secs(10))
        }
    };
    task.template = TaskTemplate {
        command: command.clone(),
        args: args.to_vec(),
        ..task.template
    };
    let run_as = task.prepared.as_ref().map(|p| p.user.clone()).unwrap_or_default();
    let tty = open.tty && open.kind == SessionKind::Exec;
    if tty {
        task.env.push(("TERM".into(), "xterm-256color".into()));
    }
    let wants_stdin = open.stdin || matches!(open.kind, SessionKind::Upload | SessionKind::LoadImage);
    let (cols, rows) = open.size.unwrap_or((80, 24));
    let owned = task.owned.clone();
    let start = move || -> Result<(Process, Io), String> {
        let io_err = |what: &str, e: std::io::Error| format!("cannot open the session's {what}: {e}");
        if tty {
            let pty = k8s4r_drivers::pty::open(cols, rows).map_err(|e| io_err("terminal", e))?;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| io_err("terminal", e));
            let streams = Streams {
                stdin: Some(dup(&pty.slave)?),
                stdout: dup(&pty.slave)?,
                stderr: pty.slave,
                terminal: true,
            };
            let process = launch_with(task, streams)?;
            let out = pipe::Receiver::from_owned_fd_unchecked(dup(&pty.master)?)
                .map_err(|e| io_err("terminal", e))?;
            let stdin = match wants_stdin {
                true => Some(Writer::spawn(
                    pipe::Sender::from_owned_fd_unchecked(dup(&pty.master)?)
                        .map_err(|e| io_err("terminal", e))?,
                    AtEof::EndOfTransmission,
                )),
                false => None,
            };
            return Ok((
                process,
                Io {
                    out,
                    err: None,
                    stdin,
                    master: Some(pty.master),
                },
            ));
        }
        let pipe_pair = |what: &str| -> Result<(OwnedFd, OwnedFd), String> {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io_err(what, e.into()))
        };
        let (out_r, out_w) = pipe_pair("stdout")?;
        let (err_r, err_w) = pipe_pair("stderr")?;
        let stdin_pipe = wants_stdin.then(|| pipe_pair("stdin")).transpose()?;
        let (stdin_r, stdin_w) = match stdin_pipe {
            Some((r, w)) => (Some(r), Some(w)),
            None => (None, None),
        };
        let process = launch_with(
            task,
            Streams {
                stdin: stdin_r,
                stdout: out_w,
                stderr: err_w,
                terminal: false,
            },
        )?;
        let receiver = |fd| pipe::Receiver::from_owned_fd(fd).map_err(|e| io_err("output", e));
        let stdin = match stdin_w {
            Some(w) => Some(Writer::spawn(
                pipe::Sender::from_owned_fd(w).map_err(|e| io_err("stdin", e))?,
                AtEof::Close,
            )),
            None => None,
        };
        Ok((
            process,
            Io {
                out: receiver(out_r)?,
                err: Some(receiver(err_r)?),
                stdin,
                master: None,
            },
        ))
    };
    // Registering the pipes needs the runtime: the start runs in place
    // (its fork is quick; a task's exec checks take the same path).
    let handle = tokio::runtime::Handle::current();
    let (mut process, io) = tokio::task::spawn_blocking(move || {
        let _entered = handle.enter();
        start()
    })
    .await
    .map_err(|e| format!("cannot start the command: {e}"))??;
    // Once reaped, the pid is no longer the session's to wait for.
    let (pid, exit) = (process.pid as i32, process.exit);
    process.exit = Box::pin(async move {
        let status = exit.await;
        owned.remove(pid);
        status
    });
    Ok(Started {
        process,
        io,
        run_as,
        grace,
    })
}

/// The preparation of a robot session as `user`: their identity, their
/// home as the directory.
async fn robot_user(task: &AsTask, user: String) -> Result<k8s4r_drivers::Prepared, String> {
    let launcher = std::sync::Arc::clone(&task.launcher);
    tokio::task::spawn_blocking(move || {
        let identity = identity::resolve(&RunAs::Named(user.clone()), &[], true)
            .map_err(|e| format!("session_user {user}: {e}"))?;
        let home = nix::unistd::User::from_name(&user)
            .ok()
            .flatten()
            .map(|u| u.dir)
            .filter(|d| d.is_dir())
            .unwrap_or_else(|| "/".into());
        launcher
            .prepare(&TaskTemplate::default(), &home, identity)
            .map_err(|e| format!("session_user {user}: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// The preparation of an image push: the agent's own user, in `/`.
async fn as_agent(task: &AsTask) -> Result<k8s4r_drivers::Prepared, String> {
    let launcher = std::sync::Arc::clone(&task.launcher);
    tokio::task::spawn_blocking(move || {
        launcher
            .prepare(&TaskTemplate::default(), std::path::Path::new("/"), None)
            .map_err(|e| format!("cannot prepare the image push: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Carries the streams until the process has ended and its output is
/// read, or the session ends first (then the process is hung up).
async fn pump(
    mut link: Link,
    open: &SessionOpen,
    process: Process,
    mut io: Io,
    limit: Option<u64>,
    grace: Duration,
    stop: CancellationToken,
) -> SessionEnd {
    let Process { group, exit, .. } = process;
    let mut exit: BoxFuture<std::io::Result<ExitStatus>> = exit;
    let mut out_buf = vec![0u8; MAX_SESSION_DATA];
    let mut err_buf = vec![0u8; MAX_SESSION_DATA];
    let mut out_open = true;
    let mut err_open = io.err.is_some();
    let mut exited: Option<std::io::Result<ExitStatus>> = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        if exited.is_some() && !out_open && !err_open {
            break;
        }
        let drain = async {
            match drain_until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let can_send = link.can_send();
        tokio::select! {
            () = stop.cancelled() => {
                let end = SessionEnd::error("the robot's agent is stopping");
                return finish_hung_up(link, group.as_ref(), exit, exited, grace, end).await;
            }
            incoming = link.next() => match incoming {
                Incoming::Data(STDIN, bytes) => {
                    if open.kind == SessionKind::LoadImage {
                        // An image comes within the robot's session rate,
                        // as what it sends goes.
                        link.take_in(bytes.len()).await;
                    }
                    if let (Some(limit), SessionKind::Upload) = (limit, open.kind) {
                        let announced = open.length.unwrap_or(limit).min(limit);
                        if link.bytes_in > announced {
                            let end = SessionEnd::error(format!("the upload sent more than the {announced} bytes it announced"));
                            return finish_hung_up(link, group.as_ref(), exit, exited, grace, end).await;
                        }
                    }
                    match &io.stdin {
                        Some(writer) => { let _ = writer.tx.send(Some(bytes)).await; }
                        None => link.consumed().await,
                    }
                }
                Incoming::Data(..) => link.consumed().await,
                Incoming::Eof(STDIN) => {
                    if open.kind == SessionKind::Upload {
                        let announced = open.length.unwrap_or(link.bytes_in);
                        if link.bytes_in != announced {
                            let end = SessionEnd::error(format!("the upload ended after {} of {announced} bytes; the file is left as it was", link.bytes_in));
                            return finish_hung_up(link, group.as_ref(), exit, exited, grace, end).await;
                        }
                    }
                    if let Some(writer) = &io.stdin {
                        let _ = writer.tx.send(None).await;
                    }
                }
                Incoming::Eof(_) => {}
                Incoming::Resize(cols, rows) => {
                    if let Some(master) = &io.master {
                        let _ = k8s4r_drivers::pty::resize(master, cols, rows);
                    }
                }
                Incoming::Tick => link.keepalive().await,
                Incoming::Credit => {}
                Incoming::Hangup(why) => {
                    let end = SessionEnd::error(why);
                    return finish_hung_up(link, group.as_ref(), exit, exited, grace, end).await;
                }
            },
            Some(written) = recv_written(&mut io.stdin) => {
                if let Err(e) = written {
                    // The process closed its stdin: what comes is dropped.
                    tracing::debug!(error = %e, "a session's stdin is closed");
                    io.stdin = None;
                }
                link.consumed().await;
            }
            read = io.out.read(&mut out_buf), if out_open && can_send => match read {
                Ok(n) if n > 0 => {
                    if !link.data(STDOUT, &out_buf[..n]).await {
                        let end = SessionEnd::error("the robot's connection is gone");
                        return finish_hung_up(link, group.as_ref(), exit, exited, grace, end).await;
                    }
                    if let (Some(limit), SessionKind::Download) = (limit, open.kind) {
                        if link.bytes_out > limit {
                            let end = SessionEnd::error(format!("the file is larger than the robot copies (its agent setting max_copy_bytes, {limit} bytes)"));
                            return finish_hung_up(link, group.as_ref(), exit, exited, grace, end).await;
                        }
                    }
                }
                // End of file, or EIO: a pty whose other side is all closed.
                _ => {
                    out_open = false;
                    link.eof(STDOUT).await;
                }
            },
            read = read_err(&mut io.err, &mut err_buf), if err_open && can_send => match read {
                Ok(n) if n > 0 => { link.data(STDERR, &err_buf[..n]).await; }
                _ => {
                    err_open = false;
                    link.eof(STDERR).await;
                }
            },
            status = &mut exit, if exited.is_none() => {
                exited = Some(status);
                drain_until = Some(tokio::time::Instant::now() + DRAIN);
            }
            () = drain => {
                // A child the command left holds the output open.
                out_open = false;
                err_open = false;
            }
        }
    }
    // Whatever the command left in its group goes with it, as when a
    // task's leader ends.
    group.signal(Signal::SIGKILL);
    let end = ended(exited);
    link.end(end).await
}

async fn recv_written(stdin: &mut Option<Writer>) -> Option<std::io::Result<()>> {
    match stdin {
        Some(writer) => writer.written.recv().await,
        None => std::future::pending().await,
    }
}

async fn read_err(err: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match err {
        Some(err) => err.read(buf).await,
        None => std::future::pending().await,
    }
}

/// How the process ended, as the session's end says it.
fn ended(exited: Option<std::io::Result<ExitStatus>>) -> SessionEnd {
    use std::os::unix::process::ExitStatusExt;
    match exited {
        Some(Ok(status)) => SessionEnd {
            exit_code: status.code(),
            signal: status.signal(),
            ..SessionEnd::default()
        },
        Some(Err(e)) => SessionEnd::error(format!("cannot wait for the command: {e}")),
        None => SessionEnd::error("the command did not end"),
    }
}

/// The session ended before the process: hang it up, then say `end`
/// (the server may be gone; the robot's log has it either way).
async fn finish_hung_up(
    link: Link,
    group: &dyn ProcessGroup,
    exit: BoxFuture<std::io::Result<ExitStatus>>,
    exited: Option<std::io::Result<ExitStatus>>,
    grace: Duration,
    mut end: SessionEnd,
) -> SessionEnd {
    let status = match exited {
        Some(status) => {
            group.signal(Signal::SIGKILL);
            status
        }
        None => hang_up(group, exit, grace).await,
    };
    let how = ended(Some(status));
    end.exit_code = how.exit_code;
    end.signal = how.signal;
    link.end(end).await
}

/// SIGHUP to the process's group (and its terminal closed), SIGKILL after
/// `grace`; returns once it is reaped.
async fn hang_up(
    group: &dyn ProcessGroup,
    mut exit: BoxFuture<std::io::Result<ExitStatus>>,
    grace: Duration,
) -> std::io::Result<ExitStatus> {
    group.signal(Signal::SIGHUP);
    group.signal(Signal::SIGCONT);
    let status = match tokio::time::timeout(grace, &mut exit).await {
        Ok(status) => status,
        Err(_) => {
            group.signal(Signal::SIGKILL);
            exit.await
        }
    };
    group.signal(Signal::SIGKILL);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;
    use std::io::Write as _;

    /// Runs the push's script as the session would, with `podman` a
    /// stand-in that loads anything and has every image; the archive on
    /// stdin.
    fn push(archive: &[u8], image: &str, dir: &std::path::Path) -> std::process::Output {
        let podman = dir.join("podman");
        std::fs::write(&podman, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&podman, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let sha = format!("{:x}", sha2::Sha256::digest(archive));
        let open: SessionOpen = serde_json::from_value(serde_json::json!({
            "kind": "loadImage",
            "user": "test",
            "length": archive.len(),
            "sha256": sha,
            "image": image,
            "window": 0,
            "leaseMs": 1000,
        }))
        .unwrap();
        let loads = super::super::ImageLoads {
            dir: dir.join("spool"),
            podman: vec![podman.display().to_string()],
            marks: dir.join("marks"),
        };
        let argv = command_of(&open, Some(&loads));
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(archive).unwrap();
        child.wait_with_output().unwrap()
    }

    #[test]
    fn a_pushed_image_is_marked_as_the_agents_by_its_digest_and_a_bad_reference_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let hex = "0a".repeat(32);
        let image = format!("registry.example/nav@sha256:{hex}");
        let out = push(b"an archive", &image, dir.path());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mark = std::fs::read_to_string(dir.path().join("marks").join(&hex)).unwrap();
        assert_eq!(mark.trim(), image);

        // Not a digest of 64 lowercase hex digits: loaded, but no mark.
        for bad in ["nav@sha256:../../etc/x", "nav@sha256:ABCD", "nav:tag"] {
            let out = push(b"another archive", bad, dir.path());
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        let marks: Vec<_> = std::fs::read_dir(dir.path().join("marks"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(marks.len(), 1, "{marks:?}");
    }
}
