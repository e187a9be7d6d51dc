//! The spool: files taken off tasks that wait for their upload, in
//! `state_dir/outputs/`, bounded by a quota, with their journal. The end
//! of an attempt puts its files in ([`Spool::take_attempt`], blocking,
//! before its directory may be retired); the uploader takes them out.
//!
//! A full quota applies the robot's policy ([`admit`], a pure decision):
//! `refuse` the new file, or `dropOldest` pending files until it fits.
//! Either way the file given up is reported to the server, which lists it
//! on the Task as dropped, with the reason, and says so in an Event.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s4r_api::output::Output;
use k8s4r_api::protocol::outputs::part_size;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::continuous::Watch;
use super::journal::{Entry, Journal, Pending};
use super::take;
use super::upload::Step;

/// How often running attempts' directories are looked at for their
/// continuous outputs.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the robot does when a file would not fit in its quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// The new file is not taken (the default: what is waiting was there
    /// first).
    #[default]
    Refuse,
    /// The oldest pending files are dropped until it fits.
    DropOldest,
}

impl std::str::FromStr for WhenFull {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "refuse" => Ok(WhenFull::Refuse),
            "dropOldest" => Ok(WhenFull::DropOldest),
            other => Err(format!("{other:?} is not one of refuse, dropOldest")),
        }
    }
}

/// The robot's settings for outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputsConfig {
    /// Bytes the spool may hold (files waiting for their upload).
    pub quota_bytes: u64,
    pub when_full: WhenFull,
    /// Bytes a second all uploads together send; 0: no limit.
    pub bytes_per_second: u64,
    /// The size of a part (larger for a file that would need more than
    /// the bucket's most parts).
    pub part_bytes: u64,
}

impl Default for OutputsConfig {
    fn default() -> Self {
        OutputsConfig {
            quota_bytes: 2 << 30,
            when_full: WhenFull::Refuse,
            bytes_per_second: 1 << 20,
            part_bytes: 8 << 20,
        }
    }
}

/// Whether a file of `size` goes in, given what waits (`pending`: id and
/// size, oldest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    Take,
    /// Taken once these are dropped.
    TakeDropping(Vec<u64>),
    Refuse(String),
}

pub fn admit(pending: &[(u64, u64)], quota: u64, size: u64, when_full: WhenFull) -> Admit {
    let used: u64 = pending.iter().map(|(_, s)| s).sum();
    if used.saturating_add(size) <= quota {
        return Admit::Take;
    }
    if size > quota {
        return Admit::Refuse(format!(
            "{size} bytes is more than the robot's outputs quota ({quota} bytes)"
        ));
    }
    match when_full {
        WhenFull::Refuse => Admit::Refuse(format!(
            "the robot's outputs quota is full ({used} of {quota} bytes wait for upload; policy refuse)"
        )),
        WhenFull::DropOldest => {
            let mut freed = 0u64;
            let need = used + size - quota;
            let drop: Vec<u64> = pending
                .iter()
                .take_while(|(_, s)| {
                    let more = freed < need;
                    freed += s;
                    more
                })
                .map(|(id, _)| *id)
                .collect();
            Admit::TakeDropping(drop)
        }
    }
}

/// What the uploader hears of.
#[derive(Debug)]
pub enum Notice {
    /// A file to upload, or (refused) to report.
    Added(Entry),
    /// A pending file dropped for a newer one.
    Dropped { id: u64, reason: String },
    /// The server's answer about an upload.
    Answer(k8s4r_api::protocol::outputs::OutputAnswer),
}

/// Which attempt's files, and where they are.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub uid: &'a str,
    pub attempt: u32,
    /// The task's own directory.
    pub work_dir: &'a Path,
    /// Its working directory in it (`workingDir`), if set.
    pub within: Option<&'a str>,
}

impl Attempt<'_> {
    /// `path` (relative to the working directory) relative to `work_dir`.
    pub fn inside(&self, path: &str) -> String {
        take::inside(self.within, path)
    }
}

struct State {
    journal: Journal,
    next_id: u64,
    /// Files waiting: id and size, oldest first.
    pending: BTreeMap<u64, u64>,
    /// Each (task, attempt, path) is taken once.
    taken: BTreeSet<(String, u32, String)>,
}

/// Running attempts whose continuous outputs are looked at.
#[derive(Default)]
struct Watches {
    map: BTreeMap<(String, u32), Watch>,
    /// A look is under way (the map is out)...
    looking: bool,
    /// ...and these ended meanwhile.
    gone: BTreeSet<(String, u32)>,
}

/// The spool, shared by the ends of attempts and the uploader.
pub struct Spool {
    dir: PathBuf,
    config: OutputsConfig,
    state: Mutex<State>,
    watches: Mutex<Watches>,
    notices: UnboundedSender<Notice>,
    receiver: Mutex<Option<(UnboundedReceiver<Notice>, Vec<Pending>)>>,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool").field("dir", &self.dir).finish()
    }
}

impl Spool {
    /// Opens the spool in `state_dir/outputs`, with what a previous run
    /// left pending.
    pub fn open(state_dir: &Path, config: OutputsConfig) -> std::io::Result<Spool> {
        let dir = take::spool_dir(state_dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let (journal, pending) = Journal::open(&dir)?;
        // Spooled files no entry names (a crash between the link and its
        // journal line) go.
        let known: BTreeSet<String> = pending.iter().map(|p| p.entry.id.to_string()).collect();
        for file in std::fs::read_dir(&dir)?.flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.bytes().all(|b| b.is_ascii_digit()) && !known.contains(&name) {
                let _ = std::fs::remove_file(file.path());
            }
        }
        let next_id = pending.iter().map(|p| p.entry.id + 1).max().unwrap_or(1);
        let state = State {
            journal,
            next_id,
            // What waits for its upload: not what was refused or dropped
            // (its file is gone; it waits only to be reported).
            pending: pending
                .iter()
                .filter(|p| {
                    p.entry.refused.is_none() && !p.steps.iter().any(|s| matches!(s, Step::Dropped { .. }))
                })
                .map(|p| (p.entry.id, p.entry.size))
                .collect(),
            taken: pending
                .iter()
                .map(|p| (p.entry.task_uid.clone(), p.entry.attempt, p.entry.path.clone()))
                .collect(),
        };
        let (notices, receiver) = unbounded_channel();
        Ok(Spool {
            dir,
            config,
            state: Mutex::new(state),
            watches: Mutex::default(),
            notices,
            receiver: Mutex::new(Some((receiver, pending))),
        })
    }

    pub fn config(&self) -> &OutputsConfig {
        &self.config
    }

    /// The spooled file of upload `id`.
    pub fn file(&self, id: u64) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// For the uploader, once: its notices and what was pending at start.
    pub fn receiver(&self) -> Option<(UnboundedReceiver<Notice>, Vec<Pending>)> {
        lock(&self.receiver).take()
    }

    /// Hands the uploader the server's answer.
    pub fn answer(&self, answer: k8s4r_api::protocol::outputs::OutputAnswer) {
        let _ = self.notices.send(Notice::Answer(answer));
    }

    /// Takes the files `outputs` name in the working directory (`within`
    /// the task's directory `work_dir`) for attempt `attempt` of task
    /// `uid`, each once. Blocking. Returns how many.
    pub fn take_attempt(&self, at: Attempt<'_>, outputs: &[&Output]) -> usize {
        let skip = self.taken_of(at.uid, at.attempt);
        let cwd = match at.within {
            Some(within) => at.work_dir.join(within),
            None => at.work_dir.to_owned(),
        };
        let found = take::find(&cwd, outputs, &skip);
        self.take_files(at, &found, outputs)
    }

    /// Takes `paths` (relative to the working directory), which `outputs`
    /// named, each once. Blocking. Returns how many.
    pub fn take_files(&self, at: Attempt<'_>, paths: &[String], outputs: &[&Output]) -> usize {
        let mut taken = 0;
        for path in paths {
            let delete_after = outputs.iter().any(|o| {
                o.delete_after_upload && k8s4r_api::output::matcher(&o.path).is_ok_and(|m| m.is_match(path))
            });
            if self.take_one(&at, path, delete_after) {
                taken += 1;
            }
        }
        taken
    }

    /// The paths of attempt `attempt` of `uid` taken already.
    pub fn taken_of(&self, uid: &str, attempt: u32) -> BTreeSet<String> {
        lock(&self.state)
            .taken
            .iter()
            .filter(|(u, a, _)| u == uid && *a == attempt)
            .map(|(_, _, p)| p.clone())
            .collect()
    }

    /// Watches a running attempt's continuous outputs (again after a
    /// restart of its process: the watch it has stays).
    pub fn watch(&self, watch: Watch) {
        let mut watches = lock(&self.watches);
        let key = (watch.uid.clone(), watch.attempt);
        watches.gone.remove(&key);
        watches.map.entry(key).or_insert(watch);
    }

    /// The attempt has ended: its directory is no longer looked at.
    pub fn unwatch(&self, uid: &str, attempt: u32) {
        let mut watches = lock(&self.watches);
        let key = (uid.to_owned(), attempt);
        watches.map.remove(&key);
        if watches.looking {
            watches.gone.insert(key);
        }
    }

    /// Whether any attempt is watched.
    pub fn watching(&self) -> bool {
        let watches = lock(&self.watches);
        watches.looking || !watches.map.is_empty()
    }

    /// One look at every watched attempt (blocking; without the lock, so
    /// that the runner's watch and unwatch never wait for a file's hash).
    pub fn look_at_watched(&self, now: std::time::Duration) {
        let mut looked = {
            let mut watches = lock(&self.watches);
            watches.looking = true;
            std::mem::take(&mut watches.map)
        };
        for watch in looked.values_mut() {
            let skip = self.taken_of(&watch.uid, watch.attempt);
            let ready = watch.look(now, &skip);
            if ready.is_empty() {
                continue;
            }
            let at = Attempt {
                uid: &watch.uid,
                attempt: watch.attempt,
                work_dir: &watch.work_dir,
                within: watch.within.as_deref(),
            };
            let outputs: Vec<&Output> = watch.outputs.iter().collect();
            self.take_files(at, &ready, &outputs);
        }
        let mut watches = lock(&self.watches);
        for (key, watch) in looked {
            if !watches.gone.contains(&key) {
                watches.map.entry(key).or_insert(watch);
            }
        }
        watches.looking = false;
        watches.gone.clear();
    }

    fn take_one(&self, at: &Attempt<'_>, path: &str, delete_after: bool) -> bool {
        let (uid, attempt) = (at.uid, at.attempt);
        let inside = at.inside(path);
        let size = match take::size_of(at.work_dir, &inside) {
            Ok(size) => size,
            Err(e) => {
                tracing::warn!(task = uid, attempt, path, error = %e, "an output not taken");
                return false;
            }
        };
        let mut state = lock(&self.state);
        if !state.taken.insert((uid.to_owned(), attempt, path.to_owned())) {
            // Taken meanwhile (a look at a running task's directory and
            // its end at once).
            return false;
        }
        let id = state.next_id;
        state.next_id += 1;
        let mut entry = Entry {
            id,
            task_uid: uid.to_owned(),
            attempt,
            path: path.to_owned(),
            size,
            sha256: String::new(),
            part_size: part_size(size, self.config.part_bytes),
            work_dir: at.work_dir.to_owned(),
            within: at.within.map(str::to_owned),
            delete_after,
            refused: None,
        };
        let waiting: Vec<(u64, u64)> = state.pending.iter().map(|(i, s)| (*i, *s)).collect();
        match admit(&waiting, self.config.quota_bytes, size, self.config.when_full) {
            Admit::Take => {}
            Admit::TakeDropping(ids) => {
                for dropped in ids {
                    state.pending.remove(&dropped);
                    let reason = format!(
                        "dropped from the robot's full outputs quota ({} bytes) for a newer output (policy dropOldest)",
                        self.config.quota_bytes
                    );
                    tracing::warn!(id = dropped, %reason, "an output dropped");
                    // Journaled first: after a restart it is still reported.
                    let step = Step::Dropped {
                        reason: reason.clone(),
                    };
                    if let Err(e) = state.journal.step(dropped, &step) {
                        tracing::warn!(id = dropped, error = %e, "cannot journal a dropped output");
                    }
                    let _ = std::fs::remove_file(self.file(dropped));
                    let _ = self.notices.send(Notice::Dropped { id: dropped, reason });
                }
            }
            Admit::Refuse(reason) => {
                tracing::warn!(task = uid, attempt, path, %reason, "an output refused");
                entry.refused = Some(reason);
                return self.record(&mut state, entry);
            }
        }
        // Its room is held while it is linked and read, without the lock.
        state.pending.insert(id, size);
        drop(state);
        let taken = take::take(at.work_dir, &inside, &self.file(id));
        let mut state = lock(&self.state);
        match taken {
            Ok(taken) => {
                // What was read at the size check may have changed since.
                entry.size = taken.size;
                entry.part_size = part_size(taken.size, self.config.part_bytes);
                entry.sha256 = taken.sha256;
                state.pending.insert(id, taken.size);
                self.record(&mut state, entry)
            }
            Err(e) => {
                state.pending.remove(&id);
                tracing::warn!(task = uid, attempt, path, error = %e, "an output not taken");
                false
            }
        }
    }

    fn record(&self, state: &mut MutexGuard<'_, State>, entry: Entry) -> bool {
        if let Err(e) = state.journal.added(&entry) {
            tracing::error!(error = %e, path = %state.journal.path().display(), "cannot journal an output; it is not uploaded");
            let _ = std::fs::remove_file(self.file(entry.id));
            state.pending.remove(&entry.id);
            return false;
        }
        let _ = self.notices.send(Notice::Added(entry));
        true
    }

    /// Journals a step of upload `id`; false when the disk refused it (the
    /// step is not taken: it is done again).
    pub fn step(&self, id: u64, step: &Step) -> bool {
        let mut state = lock(&self.state);
        match state.journal.step(id, step) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(id, error = %e, "cannot journal an upload's step");
                false
            }
        }
    }

    /// Upload `id` is over: its spooled file goes.
    pub fn done(&self, id: u64) {
        let mut state = lock(&self.state);
        state.pending.remove(&id);
        if let Err(e) = state.journal.done(id) {
            tracing::warn!(id, error = %e, "cannot journal the end of an upload");
        }
        drop(state);
        let _ = std::fs::remove_file(self.file(id));
    }

    /// Looks at every watched attempt once a second until `stop`.
    pub fn look_while_running(self: Arc<Self>, stop: CancellationToken) {
        tokio::spawn(async move {
            let began = tokio::time::Instant::now();
            let mut every = tokio::time::interval(LOOK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                if !self.watching() {
                    continue;
                }
                let spool = self.clone();
                let now = began.elapsed();
                let _ = tokio::task::spawn_blocking(move || spool.look_at_watched(now)).await;
            }
        });
    }

    /// Bytes waiting for upload.
    pub fn pending_bytes(&self) -> u64 {
        lock(&self.state).pending.values().sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_quota_refuses_or_drops_the_oldest_until_the_file_fits() {
        let waiting = [(1, 40), (2, 30), (3, 20)];
        assert_eq!(admit(&waiting, 100, 10, WhenFull::Refuse), Admit::Take);
        let Admit::Refuse(why) = admit(&waiting, 100, 11, WhenFull::Refuse) else {
            panic!()
        };
        assert!(why.contains("quota is full (90 of 100 bytes"), "{why}");
        assert_eq!(
            admit(&waiting, 100, 11, WhenFull::DropOldest),
            Admit::TakeDropping(vec![1])
        );
        assert_eq!(
            admit(&waiting, 100, 60, WhenFull::DropOldest),
            Admit::TakeDropping(vec![1, 2])
        );
        // Larger than the whole quota: nothing is dropped for it.
        assert!(matches!(
            admit(&waiting, 100, 101, WhenFull::DropOldest),
            Admit::Refuse(_)
        ));
    }

    fn output(path: &str) -> Output {
        Output {
            path: path.into(),
            ..Output::default()
        }
    }

    #[test]
    fn files_are_taken_once_and_a_restart_finds_them_pending() {
        let state = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        std::fs::write(work.path().join("a.log"), b"aaaa").unwrap();
        std::fs::write(work.path().join("b.log"), b"bb").unwrap();
        let config = OutputsConfig {
            quota_bytes: 5,
            ..OutputsConfig::default()
        };
        let spool = Spool::open(state.path(), config.clone()).unwrap();
        let (mut rx, at_start) = spool.receiver().unwrap();
        assert!(at_start.is_empty());
        let logs = output("*.log");
        let at = Attempt {
            uid: "u",
            attempt: 1,
            work_dir: work.path(),
            within: None,
        };
        assert_eq!(spool.take_attempt(at, &[&logs]), 2);
        // Taken once: nothing new.
        assert_eq!(spool.take_attempt(at, &[&logs]), 0);
        let Some(Notice::Added(a)) = rx.try_recv().ok() else {
            panic!()
        };
        assert_eq!(
            (a.path.as_str(), a.size, a.refused.as_deref()),
            ("a.log", 4, None)
        );
        let Some(Notice::Added(b)) = rx.try_recv().ok() else {
            panic!()
        };
        // 4 + 2 > 5: refused, and reported.
        assert!(b.refused.as_deref().unwrap().contains("quota is full"), "{b:?}");
        assert_eq!(spool.pending_bytes(), 4);
        assert_eq!(std::fs::read(spool.file(a.id)).unwrap(), b"aaaa");
        drop(spool);

        let again = Spool::open(state.path(), config).unwrap();
        let (_, pending) = again.receiver().unwrap();
        assert_eq!(pending.len(), 2);
        assert_eq!(again.pending_bytes(), 4);
        again.done(a.id);
        assert!(!again.file(a.id).exists());
        assert_eq!(again.take_attempt(at, &[&logs]), 0);
    }
}
