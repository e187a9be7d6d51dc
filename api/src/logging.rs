//! Logging set-up shared by the k8s4r programs (agent, server, manager,
//! `k8s4r`), so that `--log`, `--log-format` and `RUST_LOG` mean the same
//! thing in each.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for the journal or a log shipper).
    Json,
}

/// A log filter that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?} (from {source_name}): {reason}")]
pub struct InvalidFilter {
    filter: String,
    source_name: &'static str,
    reason: String,
}

/// The filter of a program that sets no other default.
pub const DEFAULT_FILTER: &str = "info";

/// Where the filter comes from: `explicit` (a flag, its environment
/// variable or a config file) wins, then `RUST_LOG`, then the program's default.
fn choose(explicit: Option<&str>, rust_log: Option<&str>, default: &str) -> Result<EnvFilter, InvalidFilter> {
    let (filter, source_name) = match (explicit, rust_log.filter(|f| !f.trim().is_empty())) {
        (Some(f), _) => (f, "--log"),
        (None, Some(f)) => (f, "RUST_LOG"),
        (None, None) => (default, "the default"),
    };
    EnvFilter::try_new(filter).map_err(|e| InvalidFilter {
        filter: filter.to_owned(),
        source_name,
        reason: e.to_string(),
    })
}

/// Whether log lines carry colour: only when standard error is a terminal
/// (a log file or the journal would keep the escape codes), and never with
/// `NO_COLOR` set (<https://no-color.org>).
fn colour() -> bool {
    colour_for(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR"))
}

/// [`colour`], given what it looks at.
fn colour_for(terminal: bool, no_color: Option<OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Sends `tracing` output to standard error in `format`, filtered as
/// [`choose`] says. A filter that does not parse is an error rather than a
/// silent fallback. If a subscriber is set already (tests run several
/// programs in one process), the first one stays.
pub fn init(format: LogFormat, explicit: Option<&str>) -> Result<(), InvalidFilter> {
    init_with_default(format, explicit, DEFAULT_FILTER)
}

/// [`init`] for a program whose default filter is not [`DEFAULT_FILTER`].
pub fn init_with_default(
    format: LogFormat,
    explicit: Option<&str>,
    default: &str,
) -> Result<(), InvalidFilter> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = choose(explicit, rust_log.as_deref(), default)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        // Otherwise a log line that cannot be written (stderr on a full
        // disk) is reported with `eprintln!`, which panics the thread that
        // logged: a full disk must not kill a program's threads.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

/// Log lines waiting for standard error before more are dropped.
const QUEUE_LINES: usize = 4096;
/// How long a program's exit waits for its last lines to be written.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(2);

/// Like [`init`], but logging never blocks the thread that logs: lines go
/// to standard error from a thread of their own, and when it cannot keep up
/// (standard error on a stalled disk, or a journal that does not read),
/// lines are dropped and counted rather than waited for. For the robot's
/// agent, whose deadlines must not wait for a log line. Keep the guard
/// until the program exits: dropping it writes what is queued (waiting at
/// most two seconds).
pub fn init_non_blocking(format: LogFormat, explicit: Option<&str>) -> Result<LogGuard, InvalidFilter> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = choose(explicit, rust_log.as_deref(), DEFAULT_FILTER)?;
    let (queue, rx) = Queue::new(QUEUE_LINES);
    let guard = LogGuard(queue.clone());
    if let Err(e) = std::thread::Builder::new()
        .name("log-stderr".to_owned())
        .stack_size(128 * 1024)
        .spawn(move || write_lines(rx, std::io::stderr()))
    {
        // No thread: log synchronously rather than not at all.
        eprintln!("cannot start the log thread ({e}); logging synchronously");
        init(format, explicit)?;
        return Ok(guard);
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(queue)
        .with_ansi(colour())
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(guard)
}

/// Writes what is queued when dropped (see [`init_non_blocking`]).
pub struct LogGuard(Queue);

impl Drop for LogGuard {
    fn drop(&mut self) {
        let (tx, rx) = mpsc::channel();
        if self.0.tx.try_send(Message::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(FLUSH_AT_EXIT);
        }
    }
}

enum Message {
    Line(Vec<u8>),
    Flush(mpsc::Sender<()>),
}

/// The subscriber's writer: each event becomes one line on a bounded queue.
#[derive(Clone)]
struct Queue {
    tx: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

impl Queue {
    fn new(lines: usize) -> (Queue, (Receiver<Message>, Arc<AtomicU64>)) {
        let (tx, rx) = mpsc::sync_channel(lines);
        let dropped = Arc::new(AtomicU64::new(0));
        (
            Queue {
                tx,
                dropped: Arc::clone(&dropped),
            },
            (rx, dropped),
        )
    }
}

impl<'a> MakeWriter<'a> for Queue {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::new(),
            queue: self.clone(),
        }
    }
}

/// One event's text, queued when the subscriber is done with it.
struct Line {
    buf: Vec<u8>,
    queue: Queue,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let line = std::mem::take(&mut self.buf);
        if let Err(TrySendError::Full(_)) = self.queue.tx.try_send(Message::Line(line)) {
            self.queue.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn write_lines((rx, dropped): (Receiver<Message>, Arc<AtomicU64>), mut out: impl Write) {
    let mut reported = 0;
    for message in rx {
        match message {
            Message::Line(line) => {
                let now = dropped.load(Ordering::Relaxed);
                if now > reported {
                    let _ = writeln!(
                        out,
                        "({} log lines were dropped: standard error could not keep up)",
                        now - reported
                    );
                    reported = now;
                }
                let _ = out.write_all(&line);
            }
            Message::Flush(done) => {
                let _ = out.flush();
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_filter_wins_over_rust_log_which_wins_over_info() {
        let shown = |f: EnvFilter| f.to_string();
        assert_eq!(
            shown(choose(Some("debug"), Some("warn"), "info").unwrap()),
            "debug"
        );
        assert_eq!(shown(choose(None, Some("warn"), "info").unwrap()), "warn");
        assert_eq!(shown(choose(None, Some("  "), "info").unwrap()), "info");
        assert_eq!(shown(choose(None, None, "info").unwrap()), "info");
        assert_eq!(
            shown(choose(None, None, "info,rumqttd=off").unwrap()),
            "rumqttd=off,info"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_and_without_no_color() {
        assert!(colour_for(true, None));
        assert!(
            colour_for(true, Some(OsString::new())),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour_for(true, Some(OsString::from("1"))));
        assert!(
            !colour_for(false, None),
            "a file or the journal gets no escape codes"
        );
    }

    #[test]
    fn a_bad_filter_is_an_error_naming_where_it_came_from() {
        let e = choose(Some("k8s4r=loud"), None, "info").unwrap_err().to_string();
        assert!(e.contains("\"k8s4r=loud\"") && e.contains("--log"), "{e}");
        let e = choose(None, Some("=["), "info").unwrap_err().to_string();
        assert!(e.contains("RUST_LOG"), "{e}");
    }

    /// A writer that takes nothing until it is let go (once).
    struct Stalled(Arc<std::sync::Mutex<Vec<u8>>>, Option<Receiver<()>>);

    impl Write for Stalled {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Some(go) = self.1.take() {
                let _ = go.recv();
            }
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stderr_never_blocks_the_logging_thread() {
        let (queue, rx) = Queue::new(4);
        let written = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (go, stalled) = mpsc::channel();
        let writer = std::thread::spawn({
            let out = Stalled(Arc::clone(&written), Some(stalled));
            move || write_lines(rx, out)
        });
        for i in 0..100 {
            let mut line = queue.make_writer();
            writeln!(line, "line {i}").unwrap();
        }
        // All 100 returned at once: a few queued, one in the writer's hand,
        // the rest dropped and counted.
        assert!(queue.dropped.load(Ordering::Relaxed) >= 94);
        go.send(()).unwrap();
        let (tx, done) = mpsc::channel();
        queue.tx.send(Message::Flush(tx)).unwrap();
        done.recv().unwrap();
        drop(queue);
        writer.join().unwrap();
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        assert!(text.contains("line 0\n"), "{text}");
        assert!(text.contains("log lines were dropped"), "{text}");
    }
}
