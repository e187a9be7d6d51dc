//! The agent as a child subreaper: a task's orphaned grandchildren are
//! re-parented to the agent instead of init, so that after they are killed
//! they are reaped here rather than left as zombies. Zombies tokio waits
//! for are left to it; of the others, those the caller recognises as its
//! tasks' (every one, in the agent's own process) are reaped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::procfs::{self, Stat};

/// Pids tokio waits for (task leaders, exec checks): the orphan reaper
/// must never take one. Shared with the blocking pool, whose starts go
/// through [`OwnedPids::spawn`].
///
/// A process may exit before its start has returned its pid (a task that
/// fails at once, `echo`): between the fork and the pid's recording it is
/// a zombie the set does not hold. Starts therefore hold a shared gate
/// from before the fork until the pid is recorded, and the reaper decides
/// about each zombie under the exclusive side of that gate: it waits for
/// starts in flight, then finds the pid recorded.
#[derive(Clone, Default)]
pub(crate) struct OwnedPids(Arc<Owned>);

#[derive(Default)]
struct Owned {
    /// Each pid with how many of our processes hold it: a pid is removed
    /// only once its exit has been handled, after tokio reaped it, and the
    /// kernel may have given it to a new start in between.
    pids: Mutex<HashMap<i32, u32>>,
    /// Held shared by a start between its fork and the pid's recording,
    /// exclusively by the reaper while it decides about one zombie.
    starting: RwLock<()>,
}

impl OwnedPids {
    /// Runs `start` (which forks) and records the pid `pid_of` reads from
    /// what it returns, with no reaping decision in between.
    pub(crate) fn spawn<T, E>(
        &self,
        start: impl FnOnce() -> Result<T, E>,
        pid_of: impl Fn(&T) -> i32,
    ) -> Result<T, E> {
        let _gate = self.0.starting.read().unwrap_or_else(|e| e.into_inner());
        let started = start()?;
        self.insert(pid_of(&started));
        Ok(started)
    }

    fn insert(&self, pid: i32) {
        *self.lock().entry(pid).or_default() += 1;
    }

    /// The process that held `pid` is gone (its exit handled, or it was
    /// given up).
    pub(crate) fn remove(&self, pid: i32) {
        let mut pids = self.lock();
        if let Some(count) = pids.get_mut(&pid) {
            *count -= 1;
            if *count == 0 {
                pids.remove(&pid);
            }
        }
    }

    pub(crate) fn contains(&self, pid: i32) -> bool {
        self.lock().contains_key(&pid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, u32>> {
        self.0.pids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks starts while the reaper decides about one zombie.
    fn deciding(&self) -> RwLockWriteGuard<'_, ()> {
        self.0.starting.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks the agent as a child subreaper (process-wide).
pub(crate) fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "cannot become a child subreaper; orphaned task processes go to init");
    }
}

/// Reaps zombie children that tokio does not own (`owned`) and that `ours`
/// recognises. Returns how many. Blocking: it reads /proc.
pub(crate) fn reap_orphans(owned: &OwnedPids, ours: impl Fn(i32, &Stat) -> bool) -> usize {
    let mut reaped = 0;
    for pid in procfs::own_children() {
        if owned.contains(pid) {
            continue;
        }
        let Some(stat) = procfs::stat(pid) else { continue };
        if stat.is_live() || !ours(pid, &stat) {
            continue;
        }
        // A start in flight may be about to record this pid: decide only
        // once it has.
        let _deciding = owned.deciding();
        if owned.contains(pid) {
            continue;
        }
        if waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)).is_ok() {
            reaped += 1;
        }
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// A pid is given up only once its exit is handled, after tokio reaped
    /// it: the kernel may have given it to a new start in between, which
    /// must stay owned.
    #[test]
    fn a_pid_reused_before_its_first_holder_is_given_up_stays_owned() {
        let owned = OwnedPids::default();
        owned.insert(4242);
        owned.insert(4242);
        owned.remove(4242);
        assert!(owned.contains(4242), "the new holder's");
        owned.remove(4242);
        assert!(!owned.contains(4242));
        owned.remove(4242);
        assert!(!owned.contains(4242), "a remove of what is not held is nothing");
    }

    /// A task that exits at once is a zombie before its start returns; a
    /// reaper pass at that moment must leave it to its waiter, or the
    /// task's exit status is lost (it then reads as failed).
    #[test]
    fn a_process_that_exits_before_its_start_returns_is_left_to_its_waiter() {
        let owned = OwnedPids::default();
        let target = Arc::new(AtomicI32::new(0));
        let (go, go_rx) = mpsc::channel();
        let (decided, decided_rx) = mpsc::channel();
        let reaper = {
            let (owned, target) = (owned.clone(), target.clone());
            std::thread::spawn(move || {
                go_rx.recv().expect("go");
                // Only this test's process: the other tests' children are
                // not ours to take.
                let n = reap_orphans(&owned, |pid, _| pid == target.load(Ordering::SeqCst));
                decided.send(n).expect("decided");
            })
        };
        let mut child = owned
            .spawn(
                || -> std::io::Result<Child> {
                    let child = Command::new("true").spawn()?;
                    let pid = child.id() as i32;
                    target.store(pid, Ordering::SeqCst);
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while procfs::stat(pid).is_some_and(|s| s.is_live()) {
                        assert!(Instant::now() < deadline, "`true` did not exit");
                        std::thread::yield_now();
                    }
                    // A zombie, its pid not yet recorded: the reaper runs
                    // now, and must not decide until the start is over.
                    go.send(()).expect("go");
                    let early = decided_rx.recv_timeout(Duration::from_millis(300));
                    assert!(early.is_err(), "the reaper decided during the start: {early:?}");
                    Ok(child)
                },
                |c| c.id() as i32,
            )
            .expect("spawn");
        reaper.join().expect("reaper");
        assert_eq!(decided_rx.recv().expect("decided"), 0, "nothing reaped");
        let status = child.wait().expect("the waiter reaps its own child");
        assert!(status.success(), "{status:?}");
    }
}
