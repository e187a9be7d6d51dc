//! `when: continuous` outputs: while a task runs, each file its patterns
//! name is taken once it has not changed for its `settle` time and no
//! process holds it open (a recorder's rolling files, each closed before
//! the next begins). What is left when the attempt ends is taken then,
//! with the rest of its outputs.
//!
//! [`Settling`] decides from what a look at the directory saw and the time
//! (no I/O); a [`Watch`] looks at one running attempt's directory; the
//! spool looks through every watch once a second
//! ([`Spool::look_while_running`](super::spool::Spool::look_while_running)).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s4r_api::output::{matcher, Output, OutputWhen};

use super::take;

/// What a look saw of a file: its size and modification time.
pub type Seen = (u64, i128);

/// Which files have settled, from looks at a directory over time.
#[derive(Debug, Default)]
pub struct Settling {
    /// Each file: what it was at the last look, and since when.
    files: BTreeMap<String, (Seen, Duration)>,
}

impl Settling {
    /// Takes a look (`now`, what it saw) and returns the files unchanged
    /// for their `settle` since. A file not seen again is forgotten.
    pub fn look(
        &mut self,
        now: Duration,
        saw: Vec<(String, Seen)>,
        settle: impl Fn(&str) -> Duration,
    ) -> Vec<String> {
        let saw: BTreeMap<String, Seen> = saw.into_iter().collect();
        self.files.retain(|path, _| saw.contains_key(path));
        let mut ready = Vec::new();
        for (path, seen) in saw {
            match self.files.get(&path) {
                Some((before, since)) if *before == seen => {
                    if now.saturating_sub(*since) >= settle(&path) {
                        ready.push(path);
                    }
                }
                _ => {
                    self.files.insert(path, (seen, now));
                }
            }
        }
        ready
    }

    /// `path` was taken: not looked at again.
    pub fn taken(&mut self, path: &str) {
        self.files.remove(path);
    }
}

/// A running attempt whose continuous outputs are watched.
#[derive(Debug)]
pub struct Watch {
    pub uid: String,
    pub attempt: u32,
    pub work_dir: PathBuf,
    pub within: Option<String>,
    /// Its `continuous` outputs.
    pub outputs: Vec<Output>,
    pub settling: Settling,
}

impl Watch {
    /// The watch of an attempt with `outputs`, if any of them is
    /// continuous.
    pub fn of(
        uid: &str,
        attempt: u32,
        work_dir: PathBuf,
        within: Option<String>,
        outputs: &[Output],
    ) -> Option<Watch> {
        let outputs: Vec<Output> = outputs
            .iter()
            .filter(|o| o.when == OutputWhen::Continuous)
            .cloned()
            .collect();
        (!outputs.is_empty()).then(|| Watch {
            uid: uid.to_owned(),
            attempt,
            work_dir,
            within,
            outputs,
            settling: Settling::default(),
        })
    }

    /// One look (blocking): the files settled and closed, to take
    /// (`skip`: those taken already).
    pub fn look(&mut self, now: Duration, skip: &BTreeSet<String>) -> Vec<String> {
        let cwd = match &self.within {
            Some(within) => self.work_dir.join(within),
            None => self.work_dir.clone(),
        };
        let outputs: Vec<&Output> = self.outputs.iter().collect();
        let saw: Vec<(String, Seen)> = take::find(&cwd, &outputs, skip)
            .into_iter()
            .filter_map(|path| {
                let inside = take::inside(self.within.as_deref(), &path);
                take::seen(&self.work_dir, &inside).ok().map(|s| (path, s))
            })
            .collect();
        let settle = |path: &str| {
            self.outputs
                .iter()
                .find(|o| matcher(&o.path).is_ok_and(|m| m.is_match(path)))
                .map_or(k8s4r_api::output::DEFAULT_SETTLE, Output::settle)
        };
        let ready = self.settling.look(now, saw, settle);
        if ready.is_empty() {
            return ready;
        }
        let open = open_files();
        let closed: Vec<String> = ready
            .into_iter()
            .filter(|p| !open.contains(&cwd.join(p)))
            .collect();
        for path in &closed {
            self.settling.taken(path);
        }
        closed
    }
}

/// Every file some process holds open, as its path (read from
/// `/proc/*/fd`).
fn open_files() -> BTreeSet<PathBuf> {
    let mut open = BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return open;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                open.insert(target);
            }
        }
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_file_is_ready_once_unchanged_for_its_settle_time() {
        let mut s = Settling::default();
        let ten = |_: &str| secs(10);
        assert!(s.look(secs(0), vec![("a".into(), (1, 1))], ten).is_empty());
        // Growing: its clock starts again.
        assert!(s.look(secs(5), vec![("a".into(), (2, 2))], ten).is_empty());
        assert!(s.look(secs(14), vec![("a".into(), (2, 2))], ten).is_empty());
        assert_eq!(s.look(secs(15), vec![("a".into(), (2, 2))], ten), vec!["a"]);
        s.taken("a");
        // Gone from the directory: forgotten; back: a new clock.
        assert!(s.look(secs(16), vec![("b".into(), (1, 1))], ten).is_empty());
        assert!(s.look(secs(30), vec![("a".into(), (2, 2)), ("b".into(), (1, 1))], ten) == vec!["b"]);
    }
}
