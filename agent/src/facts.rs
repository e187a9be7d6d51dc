//! The robot's own state ("facts": battery, docked, e-stop, a mission in
//! progress), read from what the robot's software controls: a JSON file,
//! re-read as soon as it is written (inotify on its directory, so that an
//! atomic rename counts too), and a command run every `interval`. The
//! current facts go out on a watch channel: the session sends them with
//! the heartbeats, the supervisor checks tasks' `when` against them.
//!
//! What the robot says is input like any other: a file or an output that
//! is not a JSON object of strings, numbers and booleans within the
//! protocol's bounds is refused whole, with a message for the robot's
//! health, and the facts are then unknown (empty) rather than stale: a
//! condition such as `estop In [false]` must not pass on an old value.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s4r_api::facts::{check_facts, FactValue, Facts};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The most bytes read from the file or the command.
pub const MAX_FACTS_BYTES: u64 = 64 * 1024;
/// The longest a facts command may run.
const MAX_COMMAND_TIME: Duration = Duration::from_secs(10);
/// A read that found a half-written file is tried again after this.
const REREAD_AFTER: Duration = Duration::from_millis(50);

/// Where the facts come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactsSource {
    /// A JSON file.
    pub file: Option<PathBuf>,
    /// A program that prints them.
    pub command: Option<PathBuf>,
    /// How often the command runs and the file is read regardless.
    pub interval: Duration,
}

/// The facts as last read, and what was wrong with the last read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FactsNow {
    /// False until the first read.
    pub read: bool,
    /// Unknown (empty) when the last read was refused.
    pub facts: Facts,
    /// Why the last read was refused.
    pub error: Option<String>,
}

/// Starts reading `source` until `stop`; the receiver holds the facts.
pub fn watch(source: FactsSource, stop: CancellationToken) -> watch::Receiver<FactsNow> {
    let (tx, rx) = watch::channel(FactsNow::default());
    tokio::spawn(run(source, tx, stop));
    rx
}

async fn run(source: FactsSource, tx: watch::Sender<FactsNow>, stop: CancellationToken) {
    let mut changes = source.file.as_deref().and_then(|file| match FileChanges::new(file) {
        Ok(changes) => Some(changes),
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cannot watch the facts file; it is read every facts_interval");
            None
        }
    });
    let mut tick = tokio::time::interval(source.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            seen = next_change(&mut changes) => {
                if !seen {
                    changes = None;
                }
            }
        }
        let now = read(&source).await;
        if let Some(e) = &now.error {
            if tx.borrow().error.as_ref() != Some(e) {
                tracing::warn!(error = %e, "the robot's facts are refused");
            }
        }
        tx.send_if_modified(|current| {
            let changed = *current != now;
            *current = now;
            changed
        });
    }
}

/// Reads the file and runs the command; the command's facts win.
async fn read(source: &FactsSource) -> FactsNow {
    let mut facts = Facts::new();
    if let Some(file) = &source.file {
        match read_file(file).await {
            Ok(read) => facts = read,
            Err(e) => return refused(format!("facts file {}: {e}", file.display())),
        }
    }
    if let Some(command) = &source.command {
        let timeout = source.interval.min(MAX_COMMAND_TIME);
        match run_command(command, timeout).await {
            Ok(read) => facts.extend(read),
            Err(e) => return refused(format!("facts command {}: {e}", command.display())),
        }
    }
    match check_facts(&facts) {
        Ok(()) => FactsNow {
            read: true,
            facts,
            error: None,
        },
        Err(e) => refused(e),
    }
}

fn refused(error: String) -> FactsNow {
    FactsNow {
        read: true,
        facts: Facts::new(),
        error: Some(error),
    }
}

/// The file's facts; a missing file has none. A file caught half-written
/// is read once more.
async fn read_file(path: &Path) -> Result<Facts, String> {
    match read_file_once(path).await {
        Err(_) => {
            tokio::time::sleep(REREAD_AFTER).await;
            read_file_once(path).await
        }
        read => read,
    }
}

async fn read_file_once(path: &Path) -> Result<Facts, String> {
    // The agent reads as root a file another program writes: never through
    // a link, never a FIFO or a device that could hold the read for ever.
    let file = match tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .await
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Facts::new()),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err("is a symbolic link; the agent reads only a regular file".to_owned())
        }
        Err(e) => return Err(e.to_string()),
    };
    if !file.metadata().await.map_err(|e| e.to_string())?.is_file() {
        return Err("is not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FACTS_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| e.to_string())?;
    parse(&bytes)
}

/// Runs the facts command (stdin and stderr closed) and parses what it
/// printed; killed at `timeout`.
async fn run_command(program: &Path, timeout: Duration) -> Result<Facts, String> {
    let mut child = tokio::process::Command::new(program)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let work = async {
        let mut bytes = Vec::new();
        (&mut stdout)
            .take(MAX_FACTS_BYTES + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("it failed ({status})"));
        }
        parse(&bytes)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(read) => read,
        Err(_) => Err(format!(
            "it did not finish within {}",
            k8s4r_api::duration::format_duration(timeout)
        )),
    }
}

/// A JSON object of strings, numbers and booleans, at most
/// [`MAX_FACTS_BYTES`].
pub fn parse(bytes: &[u8]) -> Result<Facts, String> {
    if bytes.len() as u64 > MAX_FACTS_BYTES {
        return Err(format!("more than {MAX_FACTS_BYTES} bytes"));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err("not a JSON object".to_owned());
    };
    let mut facts = Facts::new();
    for (name, value) in map {
        let value = match value {
            serde_json::Value::Bool(b) => FactValue::Bool(b),
            serde_json::Value::Number(n) => FactValue::Number(n.as_f64().ok_or("a number out of range")?),
            serde_json::Value::String(s) => FactValue::String(s),
            _ => return Err(format!("fact {name:?} is not a string, a number or a boolean")),
        };
        facts.insert(name, value);
    }
    check_facts(&facts)?;
    Ok(facts)
}

/// Writes to the facts file, seen through inotify on its directory.
struct FileChanges {
    fd: AsyncFd<InotifyFd>,
    name: std::ffi::OsString,
}

impl FileChanges {
    fn new(file: &Path) -> nix::Result<Self> {
        let dir = file.parent().unwrap_or(Path::new("/"));
        let name = file.file_name().unwrap_or(OsStr::new("")).to_owned();
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // Written and closed, renamed into place, or removed: never a
        // write in progress.
        inotify.add_watch(
            dir,
            AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_DELETE,
        )?;
        // Deprecated because a `T` that does not own its fd could close or
        // swap it under the registration; `InotifyFd` owns it for good.
        #[allow(deprecated)]
        let fd = AsyncFd::new(InotifyFd(inotify))
            .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(0)))?;
        Ok(FileChanges { fd, name })
    }
}

/// Resolves when the file changed: true, or false when inotify failed
/// (then only the interval reads it). Pending forever without a watch.
async fn next_change(changes: &mut Option<FileChanges>) -> bool {
    let Some(changes) = changes else {
        return std::future::pending().await;
    };
    loop {
        let Ok(mut guard) = changes.fd.readable().await else {
            return false;
        };
        match guard.get_inner().0.read_events() {
            Ok(events) => {
                if events
                    .iter()
                    .any(|e| e.name.as_deref() == Some(changes.name.as_os_str()))
                {
                    return true;
                }
            }
            Err(nix::Error::EAGAIN) => guard.clear_ready(),
            Err(_) => return false,
        }
    }
}

/// An inotify instance as tokio registers it.
struct InotifyFd(Inotify);

impl std::os::fd::AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const PATIENCE: Duration = Duration::from_secs(10);

    async fn until(
        rx: &mut watch::Receiver<FactsNow>,
        what: &str,
        f: impl Fn(&FactsNow) -> bool,
    ) -> FactsNow {
        let found = tokio::time::timeout(PATIENCE, rx.wait_for(|now| f(now)))
            .await
            .map(|r| r.unwrap().clone());
        found.unwrap_or_else(|_| panic!("timed out waiting for {what}: {:?}", rx.borrow()))
    }

    fn source(file: Option<PathBuf>, command: Option<PathBuf>) -> FactsSource {
        FactsSource {
            file,
            command,
            // Long: a change must be seen through inotify, not the interval.
            interval: Duration::from_secs(3600),
        }
    }

    #[test]
    fn only_an_object_of_scalars_within_bounds_is_taken() {
        assert_eq!(
            parse(br#"{"battery": 80, "docked": true, "mode": "idle"}"#)
                .unwrap()
                .len(),
            3
        );
        assert!(parse(b"[1, 2]").unwrap_err().contains("not a JSON object"));
        assert!(parse(br#"{"pose": {"x": 1}}"#).unwrap_err().contains("\"pose\""));
        assert!(parse(br#"{"battery": null}"#).is_err());
        assert!(parse(b"{\"battery\": 8").unwrap_err().contains("not JSON"));
        assert!(parse(br#"{"bad name": 1}"#).is_err());
        let huge = format!(r#"{{"a": "{}"}}"#, "x".repeat(MAX_FACTS_BYTES as usize));
        assert!(parse(huge.as_bytes()).unwrap_err().contains("more than"));
    }

    #[tokio::test]
    async fn a_written_or_renamed_file_is_read_at_once_and_a_bad_one_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("facts.json");
        std::fs::write(&file, r#"{"battery": 10}"#).unwrap();
        let stop = CancellationToken::new();
        let mut rx = watch(source(Some(file.clone()), None), stop.clone());
        until(&mut rx, "the first read", |n| {
            n.facts.get("battery") == Some(&FactValue::Number(10.0))
        })
        .await;

        let written = Instant::now();
        std::fs::write(&file, r#"{"battery": 80}"#).unwrap();
        until(&mut rx, "the new value", |n| {
            n.facts.get("battery") == Some(&FactValue::Number(80.0))
        })
        .await;
        assert!(
            written.elapsed() < Duration::from_secs(1),
            "{:?}",
            written.elapsed()
        );

        // Written elsewhere and renamed into place, as careful writers do.
        let tmp = dir.path().join(".facts.json.tmp");
        std::fs::write(&tmp, r#"{"battery": 81, "estop": false}"#).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        until(&mut rx, "the renamed file", |n| {
            n.facts.get("estop") == Some(&FactValue::Bool(false))
        })
        .await;

        std::fs::write(&file, "{not json").unwrap();
        let bad = until(&mut rx, "the refusal", |n| n.error.is_some()).await;
        assert!(bad.facts.is_empty(), "unknown, not stale: {bad:?}");
        assert!(bad.error.unwrap().contains("facts.json"), "the file is named");

        std::fs::write(&file, format!(r#"{{"note": "{}"}}"#, "x".repeat(300))).unwrap();
        let big = until(&mut rx, "the oversized refusal", |n| {
            n.error.as_ref().is_some_and(|e| e.contains("256"))
        })
        .await;
        assert!(big.facts.is_empty());

        std::fs::write(&file, r#"{"battery": 55}"#).unwrap();
        let good = until(&mut rx, "the good file again", |n| n.error.is_none()).await;
        assert_eq!(good.facts.get("battery"), Some(&FactValue::Number(55.0)));

        // A link planted in its place is refused, not followed.
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, r#"{"battery": 99}"#).unwrap();
        let link = dir.path().join(".link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        std::fs::rename(&link, &file).unwrap();
        let linked = until(&mut rx, "the link's refusal", |n| n.error.is_some()).await;
        assert!(linked.error.unwrap().contains("symbolic link"));
        stop.cancel();
    }

    #[tokio::test]
    async fn a_command_adds_its_facts_and_wins_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("facts.json");
        std::fs::write(&file, r#"{"battery": 10, "docked": false}"#).unwrap();
        let command = dir.path().join("state.sh");
        std::fs::write(
            &command,
            "#!/bin/sh\necho '{\"docked\": true, \"mission\": \"idle\"}'\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755)).unwrap();
        let stop = CancellationToken::new();
        let mut rx = watch(source(Some(file), Some(command.clone())), stop.clone());
        let now = until(&mut rx, "the first read", |n| n.read).await;
        assert_eq!(now.error, None);
        assert_eq!(now.facts.get("battery"), Some(&FactValue::Number(10.0)));
        assert_eq!(now.facts.get("docked"), Some(&FactValue::Bool(true)));
        assert_eq!(now.facts.get("mission"), Some(&FactValue::String("idle".into())));
        stop.cancel();

        std::fs::write(&command, "#!/bin/sh\nexit 4\n").unwrap();
        let stop = CancellationToken::new();
        let mut rx = watch(source(None, Some(command)), stop.clone());
        let failed = until(&mut rx, "the failure", |n| n.read).await;
        assert!(
            failed.error.unwrap().contains("failed"),
            "the command's failure is named"
        );
        stop.cancel();
    }
}
