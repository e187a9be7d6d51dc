//! The agent as a child subreaper: a task's orphaned grandchildren are
//! re-parented to the agent instead of init, so that after they are killed
//! they are reaped here rather than left as zombies. Zombies tokio waits
//! for are left to it; of the others, those the caller recognises as its
//! tasks' (every one, in the agent's own process) are reaped.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::procfs::{self, Stat};

/// Pids tokio waits for (task leaders, exec checks): the orphan reaper
/// must never take one. Shared with the blocking pool, which adds a pid
/// the moment it is spawned.
#[derive(Clone, Default)]
pub(crate) struct OwnedPids(Arc<Mutex<HashSet<i32>>>);

impl OwnedPids {
    pub(crate) fn insert(&self, pid: i32) {
        self.lock().insert(pid);
    }

    pub(crate) fn remove(&self, pid: i32) {
        self.lock().remove(&pid);
    }

    pub(crate) fn contains(&self, pid: i32) -> bool {
        self.lock().contains(&pid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<i32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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
pub(crate) fn reap_orphans(owned: impl Fn(i32) -> bool, ours: impl Fn(i32, &Stat) -> bool) -> usize {
    let mut reaped = 0;
    for pid in procfs::own_children() {
        if owned(pid) {
            continue;
        }
        let Some(stat) = procfs::stat(pid) else { continue };
        if stat.is_live() || !ours(pid, &stat) {
            continue;
        }
        if waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)).is_ok() {
            reaped += 1;
        }
    }
    reaped
}
