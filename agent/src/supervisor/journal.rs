//! The state journal: one JSON line per step of a task (accepted, started,
//! ended) in `state_dir/journal.jsonl`. After the agent dies, the tasks
//! accepted and not ended are exactly the ones a new agent must settle.
//!
//! A thread of its own writes it, so that a slow or stalled disk never
//! holds up the supervisor's deadlines. The supervisor's events pass
//! through the same thread, after the record they follow: an event leaves
//! only once its record is written (in the page cache, which survives the
//! agent being killed), and the batch is then fsynced (which survives a
//! power cut, for the report after the reboot). When the disk refuses a
//! write (full, I/O error), the journal says so ([`Journal::healthy`])
//! and rewrites itself from what it holds in memory as soon as the disk
//! takes it again. Replay skips every line it cannot read, whatever the
//! bytes.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;

use super::TaskEvent;
use k8s4r_api::TaskTemplate;

/// The journal's file name under the state dir.
pub(crate) const FILE_NAME: &str = "journal.jsonl";
/// Rewrite the journal once this many lines were appended...
const COMPACT_AFTER: usize = 4096;
/// ...and they are more than this many times the live records.
const COMPACT_RATIO: usize = 4;
/// How often a journal that failed to write tries to rewrite itself.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Where a started task's processes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Started {
    pub pid: i32,
    pub pgid: i32,
    /// The leader's start time in clock ticks, to tell it from a reused pid.
    pub pid_start: u64,
    /// The start time of the group's leader (the command, when `pid` is
    /// its shim), to tell the group from a reused id; 0: unknown (older
    /// agents, whose group leader was `pid`).
    #[serde(default, skip_serializing_if = "is_zero_ticks")]
    pub pgid_start: u64,
    /// A logger writes its log files (else the task writes them itself,
    /// and the agent rotates them: tasks of older agents, or a supervisor
    /// with no shim program).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logger: bool,
    /// The boot the process ran in; after a reboot nothing is left to kill.
    pub boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// The task's own uid, if it ran as one (its leftovers are found by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_uid: Option<u32>,
    pub started_at: jiff::Timestamp,
    /// Restarts on the robot of the attempt before this start.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// How the task asks to be stopped, when not SIGTERM and 5s: what
    /// `--stop-left-tasks` honours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asks: Option<StopAsk>,
}

/// A task's stop signal and kill timeout, kept for `--stop-left-tasks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StopAsk {
    pub signal: i32,
    pub kill_timeout_ms: u64,
}

impl StopAsk {
    /// What a task asks that names neither: SIGTERM, SIGKILL after the
    /// default kill timeout.
    pub(crate) fn default_ask() -> StopAsk {
        Self::with(
            nix::sys::signal::Signal::SIGTERM,
            k8s4r_api::validation::DEFAULT_KILL_TIMEOUT,
        )
    }

    fn with(signal: nix::sys::signal::Signal, kill_timeout: std::time::Duration) -> StopAsk {
        StopAsk {
            signal: signal as i32,
            kill_timeout_ms: u64::try_from(kill_timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// What a task with this stop signal and kill timeout asks, when it
    /// asks for more than [`StopAsk::default_ask`] (only then is it
    /// journaled).
    pub(crate) fn of(signal: nix::sys::signal::Signal, kill_timeout: std::time::Duration) -> Option<StopAsk> {
        let ask = Self::with(signal, kill_timeout);
        (ask != Self::default_ask()).then_some(ask)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_ticks(n: &u64) -> bool {
    *n == 0
}

/// What taking an attempt over needs: re-adopting it after an agent
/// restart (it still runs), or starting it again from the journal after a
/// reboot (with or without the cluster) when `restart` says so.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Resume {
    pub name: String,
    pub spec: TaskTemplate,
    /// It starts again from the journal when it does not run any more (it
    /// restarts on the robot and is not fenced). Not written: a record's
    /// `resume` says it does (what older agents, which know only that
    /// field, start again), its `adopt` that it does not.
    #[serde(skip, default = "yes")]
    pub restart: bool,
    /// Its `stopAfter` (fenced), in milliseconds: the next agent fences it
    /// from the last contact of this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

/// One line of the journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub(crate) enum Record {
    #[serde(rename_all = "camelCase")]
    Accepted {
        uid: String,
        attempt: u32,
        task_dir: PathBuf,
        /// What the next agent needs to take it over, for an attempt it
        /// starts again when it no longer runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume: Option<Box<Resume>>,
        /// The same, for one it only re-adopts while it runs (a field of
        /// its own: an older agent, rolled back to, must not start it
        /// again, and its `--stop-left-tasks` stops what has no `resume`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        adopt: Option<Box<Resume>>,
    },
    #[serde(rename_all = "camelCase")]
    Started {
        uid: String,
        attempt: u32,
        #[serde(flatten)]
        at: Started,
    },
    #[serde(rename_all = "camelCase")]
    Ended { uid: String, attempt: u32 },
}

/// A task the previous run accepted and never ended.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Unfinished {
    pub uid: String,
    pub attempt: u32,
    pub task_dir: PathBuf,
    pub started: Option<Started>,
    pub resume: Option<Box<Resume>>,
}

/// The live records, by task: what a rewrite writes.
type Live = BTreeMap<(String, u32), Unfinished>;

/// Reads what the previous run left unfinished. A missing journal is an
/// empty one; unreadable lines are skipped.
pub(crate) fn replay(state_dir: &Path) -> io::Result<Vec<Unfinished>> {
    let path = state_dir.join(FILE_NAME);
    let mut bytes = Vec::new();
    match File::open(&path) {
        Ok(mut file) => file.read_to_end(&mut bytes)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut live = Live::new();
    for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // A line cut short by a crash, or garbage the disk returned, is
        // skipped, not fatal: the lines after it still count.
        match serde_json::from_slice::<Record>(line) {
            Ok(record) => apply(&mut live, record),
            Err(e) => tracing::warn!(line = n + 1, error = %e, "skipping an unreadable journal line"),
        }
    }
    Ok(live.into_values().collect())
}

fn apply(live: &mut Live, record: Record) {
    match record {
        Record::Accepted {
            uid,
            attempt,
            task_dir,
            resume,
            adopt,
        } => {
            let resume = resume.or(adopt.map(|mut a| {
                a.restart = false;
                a
            }));
            live.insert(
                (uid.clone(), attempt),
                Unfinished {
                    uid,
                    attempt,
                    task_dir,
                    started: None,
                    resume,
                },
            );
        }
        Record::Started { uid, attempt, at } => {
            if let Some(task) = live.get_mut(&(uid, attempt)) {
                task.started = Some(at);
            }
        }
        Record::Ended { uid, attempt } => {
            live.remove(&(uid, attempt));
        }
    }
}

/// Options for the journal's files: readable by root alone from their
/// creation. The state directory is traversable by task users (they walk
/// to their own directories), and the journal holds every task's spec,
/// environment included.
fn private() -> OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = OpenOptions::new();
    options.mode(0o600);
    options
}

fn records_of(live: &Live) -> Vec<Record> {
    let mut out = Vec::with_capacity(live.len() * 2);
    for task in live.values() {
        out.push(Record::Accepted {
            uid: task.uid.clone(),
            attempt: task.attempt,
            task_dir: task.task_dir.clone(),
            resume: task.resume.clone().filter(|r| r.restart),
            adopt: task.resume.clone().filter(|r| !r.restart),
        });
        if let Some(at) = &task.started {
            out.push(Record::Started {
                uid: task.uid.clone(),
                attempt: task.attempt,
                at: at.clone(),
            });
        }
    }
    out
}

enum Op {
    /// A record (if any) and the events that follow it.
    Write(Option<Record>, Vec<TaskEvent>),
    /// Resolves once everything before it is written and synced.
    Flush(std::sync::mpsc::Sender<()>),
}

/// The journal as the runner uses it. Production runs it on a thread of
/// its own ([`JournalHandle`]); the unit tests write it on the runner's own
/// thread (a thread tokio does not know of would let its paused clock run
/// on while an event is on its way).
pub(crate) trait Journal: Send {
    /// Journals `record` and then sends `events`.
    fn write(&self, record: Option<Record>, events: Vec<TaskEvent>);

    /// Sends an event that needs no record, in order with the others.
    fn event(&self, event: TaskEvent) {
        self.write(None, vec![event]);
    }

    /// Whether the last write reached the disk.
    fn healthy(&self) -> bool;

    /// Whether it still works (its thread ends only when the handle is
    /// dropped, or by a bug).
    fn is_alive(&self) -> bool;

    /// Resolves when everything written so far is on disk (or could not
    /// be); for shutdown.
    fn flush(&self) -> Receiver<()>;

    /// The file.
    fn path(&self) -> &Path;
}

/// How the runner starts its journal: on `state_dir`, sending events to
/// the channel, holding the `kept` tasks of the previous run.
pub(crate) type JournalStart =
    Box<dyn FnOnce(&Path, UnboundedSender<TaskEvent>, &[Unfinished]) -> io::Result<Box<dyn Journal>> + Send>;

/// The production journal: a thread of its own.
pub(crate) fn on_its_thread() -> JournalStart {
    Box::new(|state_dir, events, kept| Ok(Box::new(JournalHandle::start(state_dir, events, kept)?)))
}

/// The supervisor's side of the journal thread. Dropping it lets the thread
/// finish what is queued and end.
pub(crate) struct JournalHandle {
    ops: Sender<Op>,
    healthy: Arc<AtomicBool>,
    alive: Arc<AtomicBool>,
    path: PathBuf,
}

impl JournalHandle {
    /// Starts the journal over, holding only `kept` (the previous run's
    /// tasks that are taken over), on a thread of its own.
    pub(crate) fn start(
        state_dir: &Path,
        events: UnboundedSender<TaskEvent>,
        kept: &[Unfinished],
    ) -> io::Result<JournalHandle> {
        let path = state_dir.join(FILE_NAME);
        let writer = Writer::keeping(path.clone(), kept)?;
        let (ops, rx) = mpsc::channel();
        let healthy = Arc::new(AtomicBool::new(true));
        let flag = Arc::clone(&healthy);
        let alive = Arc::new(AtomicBool::new(true));
        let guard = Alive(Arc::clone(&alive));
        std::thread::Builder::new()
            .name("k8s4r-journal".to_owned())
            .stack_size(256 * 1024)
            .spawn(move || {
                let _alive = guard;
                writer.run(rx, events, flag)
            })?;
        Ok(JournalHandle {
            ops,
            healthy,
            alive,
            path,
        })
    }
}

impl Journal for JournalHandle {
    fn write(&self, record: Option<Record>, events: Vec<TaskEvent>) {
        let _ = self.ops.send(Op::Write(record, events));
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    fn flush(&self) -> Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let _ = self.ops.send(Op::Flush(tx));
        rx
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// The unit tests' journal: written on the caller's thread, and made to
/// look dead on demand.
#[cfg(test)]
pub(crate) mod inline {
    use super::*;

    /// A journal written in line; `alive` is the flag a test clears to
    /// make the runner believe it died.
    pub(crate) fn start(alive: Arc<AtomicBool>) -> JournalStart {
        Box::new(move |state_dir, events, kept| {
            let path = state_dir.join(FILE_NAME);
            let writer = Writer::keeping(path.clone(), kept)?;
            Ok(Box::new(Inline {
                writer: std::sync::Mutex::new(writer),
                events,
                healthy: AtomicBool::new(true),
                alive,
                path,
            }))
        })
    }

    struct Inline {
        writer: std::sync::Mutex<Writer>,
        events: UnboundedSender<TaskEvent>,
        healthy: AtomicBool,
        alive: Arc<AtomicBool>,
        path: PathBuf,
    }

    impl Journal for Inline {
        fn write(&self, record: Option<Record>, events: Vec<TaskEvent>) {
            let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            writer.handle(vec![Op::Write(record, events)], &self.events);
            self.healthy.store(!writer.dirty, Ordering::Relaxed);
        }

        fn healthy(&self) -> bool {
            self.healthy.load(Ordering::Relaxed)
        }

        fn is_alive(&self) -> bool {
            self.alive.load(Ordering::Relaxed)
        }

        fn flush(&self) -> Receiver<()> {
            let (tx, rx) = mpsc::channel();
            let _ = tx.send(());
            rx
        }

        fn path(&self) -> &Path {
            &self.path
        }
    }
}

/// Clears its flag when the thread holding it ends, however it ends.
pub(crate) struct Alive(pub(crate) Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

struct Writer {
    path: PathBuf,
    file: Option<File>,
    live: Live,
    /// Lines appended since the last rewrite.
    appended: usize,
    /// A write failed: the file lacks records until it is rewritten.
    dirty: bool,
}

impl Writer {
    /// A writer on an empty journal at `path`. Nothing runs yet when the
    /// supervisor starts: the file is rewritten empty (which also gets rid
    /// of a torn last line).
    fn keeping(path: PathBuf, kept: &[Unfinished]) -> io::Result<Writer> {
        let live = kept
            .iter()
            .map(|task| ((task.uid.clone(), task.attempt), task.clone()))
            .collect();
        let mut writer = Writer {
            path,
            file: None,
            live,
            appended: 0,
            dirty: false,
        };
        writer.rewrite()?;
        Ok(writer)
    }

    fn run(mut self, rx: Receiver<Op>, events: UnboundedSender<TaskEvent>, healthy: Arc<AtomicBool>) {
        loop {
            let first = if self.dirty {
                match rx.recv_timeout(RETRY_EVERY) {
                    Ok(op) => Some(op),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(op) => Some(op),
                    Err(_) => break,
                }
            };
            // Everything queued goes in one write and one fsync.
            let mut ops: Vec<Op> = first.into_iter().collect();
            ops.extend(rx.try_iter());
            self.handle(ops, &events);
            healthy.store(!self.dirty, Ordering::Relaxed);
        }
        if let Some(file) = &self.file {
            let _ = file.sync_data();
        }
    }

    /// Writes one batch, sends its events, syncs.
    fn handle(&mut self, ops: Vec<Op>, events: &UnboundedSender<TaskEvent>) {
        let mut lines = Vec::new();
        let mut out = Vec::new();
        let mut flushes = Vec::new();
        for op in ops {
            match op {
                Op::Write(record, evs) => {
                    if let Some(record) = record {
                        if let Ok(mut line) = serde_json::to_vec(&record) {
                            line.push(b'\n');
                            lines.extend_from_slice(&line);
                            self.appended += 1;
                        }
                        apply(&mut self.live, record);
                    }
                    out.extend(evs);
                }
                Op::Flush(done) => flushes.push(done),
            }
        }
        let result = if self.dirty || self.should_compact() {
            self.rewrite()
        } else {
            self.append(&lines)
        };
        match &result {
            Ok(()) => {
                if self.dirty {
                    tracing::info!(path = %self.path.display(), "journal written again");
                }
                self.dirty = false;
            }
            Err(e) => {
                if !self.dirty {
                    tracing::error!(path = %self.path.display(), error = %e, "cannot write the journal; retrying every second");
                }
                self.dirty = true;
            }
        }
        // Events leave after their records were handed to the kernel (or
        // could not be): a status is never held back by a failing disk.
        for event in out {
            let _ = events.send(event);
        }
        if !lines.is_empty() && !self.dirty {
            if let Some(file) = &self.file {
                if let Err(e) = file.sync_data() {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot sync the journal");
                }
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }

    fn should_compact(&self) -> bool {
        self.appended > COMPACT_AFTER && self.appended > COMPACT_RATIO * self.live.len().max(1)
    }

    fn append(&mut self, lines: &[u8]) -> io::Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let file = match &mut self.file {
            Some(file) => file,
            None => self
                .file
                .insert(private().create(true).append(true).open(&self.path)?),
        };
        file.write_all(lines)
    }

    /// Rewrites the journal with only the live records (atomically: temp
    /// file, fsync, rename).
    fn rewrite(&mut self) -> io::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        let written = (|| {
            let mut out = io::BufWriter::new(private().write(true).create(true).truncate(true).open(&tmp)?);
            for record in records_of(&self.live) {
                serde_json::to_writer(&mut out, &record).map_err(io::Error::other)?;
                out.write_all(b"\n")?;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.file = Some(OpenOptions::new().append(true).open(&self.path)?);
        self.appended = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(pid: i32) -> Started {
        Started {
            pid,
            pgid: pid,
            pid_start: 7,
            pgid_start: 0,
            logger: false,
            boot_id: "b".to_owned(),
            cgroup: None,
            task_uid: None,
            started_at: jiff::Timestamp::UNIX_EPOCH,
            restarts: 0,
            asks: None,
        }
    }

    fn accepted(uid: &str) -> Record {
        Record::Accepted {
            uid: uid.to_owned(),
            attempt: 1,
            task_dir: PathBuf::from("/t"),
            resume: None,
            adopt: None,
        }
    }

    fn event(uid: &str) -> TaskEvent {
        TaskEvent::Started {
            uid: uid.to_owned(),
            attempt: 1,
            pid: 1,
            at: jiff::Timestamp::UNIX_EPOCH,
            restarted: None,
            config: None,
        }
    }

    #[test]
    fn replays_what_was_not_ended_and_skips_what_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = Vec::new();
        for record in [
            accepted("a"),
            accepted("b"),
            accepted("c"),
            Record::Started {
                uid: "b".to_owned(),
                attempt: 1,
                at: started(42),
            },
        ] {
            text.extend(serde_json::to_vec(&record).unwrap());
            text.push(b'\n');
        }
        // Bytes that are not even UTF-8, then more records: still read.
        text.extend_from_slice(b"\xff\xfe garbage \x80\n");
        text.extend(
            serde_json::to_vec(&Record::Ended {
                uid: "a".to_owned(),
                attempt: 1,
            })
            .unwrap(),
        );
        text.push(b'\n');
        text.extend(serde_json::to_vec(&accepted("d")).unwrap());
        // A torn last line, as a crash mid-write leaves it.
        text.extend_from_slice(b"\n{\"op\":\"ended\",\"ui");
        std::fs::write(dir.path().join(FILE_NAME), text).unwrap();

        let left = replay(dir.path()).unwrap();
        let uids: Vec<_> = left
            .iter()
            .map(|t| (t.uid.as_str(), t.started.as_ref().map(|s| s.pid)))
            .collect();
        assert_eq!(uids, vec![("b", Some(42)), ("c", None), ("d", None)]);
    }

    #[test]
    fn the_thread_writes_records_before_their_events_and_rewrites_at_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"{\"op\":\"accepted\"").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let journal = JournalHandle::start(dir.path(), tx, &[]).unwrap();
        assert!(
            replay(dir.path()).unwrap().is_empty(),
            "started from an empty journal"
        );
        journal.write(Some(accepted("x")), vec![event("x")]);
        journal.write(
            Some(Record::Started {
                uid: "x".to_owned(),
                attempt: 1,
                at: started(7),
            }),
            vec![],
        );
        journal.event(event("y"));
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(FILE_NAME))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "the journal holds specs: root's alone");
        }
        // When the event arrives, its record is in the file.
        let first = rx.blocking_recv().unwrap();
        assert_eq!(first.uid(), "x");
        assert_eq!(replay(dir.path()).unwrap()[0].uid, "x");
        assert_eq!(rx.blocking_recv().unwrap().uid(), "y");
        journal.flush().recv().unwrap();
        let left = replay(dir.path()).unwrap();
        assert_eq!(left[0].started.as_ref().map(|s| s.pid), Some(7));
        assert!(journal.healthy());
    }

    #[test]
    fn a_journal_that_could_not_be_written_rewrites_itself_when_it_can() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut writer = Writer::keeping(path.clone(), &[]).unwrap();
        writer.handle(vec![Op::Write(Some(accepted("a")), vec![])], &tx);
        // The disk fills up: every write fails (/dev/full), and so does a
        // rewrite (its temporary file cannot be made). The event still
        // goes out.
        writer.file = Some(OpenOptions::new().write(true).open("/dev/full").unwrap());
        let tmp = path.with_extension("jsonl.tmp");
        std::fs::create_dir(&tmp).unwrap();
        writer.handle(vec![Op::Write(Some(accepted("b")), vec![event("b")])], &tx);
        assert!(writer.dirty);
        assert_eq!(rx.try_recv().unwrap().uid(), "b");
        writer.handle(vec![], &tx);
        assert!(writer.dirty, "the retry fails while the disk is full");
        // Space is back: the next batch (or the retry timer's empty one)
        // rewrites everything live, the records the disk refused included.
        std::fs::remove_dir(&tmp).unwrap();
        writer.handle(vec![Op::Write(Some(accepted("c")), vec![])], &tx);
        assert!(!writer.dirty);
        let uids: Vec<_> = replay(dir.path()).unwrap().into_iter().map(|t| t.uid).collect();
        assert_eq!(uids, vec!["a", "b", "c"]);
    }
}
