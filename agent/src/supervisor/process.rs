//! The seam between the supervisor and the processes it runs.
//!
//! A [`Launcher`] prepares and starts a task and hands back a [`Process`]:
//! an exit to wait for and a [`ProcessGroup`] to signal. Every
//! `k8s4r_drivers::Driver` is a launcher (a real child, `killpg`); the unit
//! tests drive the supervisor with a fake one instead, as tokio tests its
//! reaper with a mock `Wait`.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::process::ExitStatus;

use k8s4r_api::TaskTemplate;
use k8s4r_drivers::{Driver, DriverError, Identity, Launch, Launched, Prepared};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A started task: the leader of its own session and process group.
pub(crate) struct Process {
    pub pid: u32,
    pub pgid: i32,
    /// Resolves once the process has exited and is reaped.
    pub exit: BoxFuture<io::Result<ExitStatus>>,
    /// The whole group, for SIGTERM and SIGKILL.
    pub group: Box<dyn ProcessGroup>,
}

/// How a process the supervisor runs beside a task (an exec check, a
/// `preStop`) ended.
pub(crate) enum Waited {
    Exited(ExitStatus),
    Failed(io::Error),
    /// It outlived its timeout and was killed (and reaped).
    TimedOut,
}

/// Waits for `process` up to `timeout`, then kills it; whatever it left in
/// its process group goes with it either way.
pub(crate) async fn wait_at_most(process: Process, timeout: std::time::Duration) -> Waited {
    let Process { exit, group, .. } = process;
    tokio::pin!(exit);
    let waited = tokio::time::timeout(timeout, &mut exit).await;
    group.signal(Signal::SIGKILL);
    match waited {
        Ok(Ok(status)) => Waited::Exited(status),
        Ok(Err(e)) => Waited::Failed(e),
        Err(_) => {
            let _ = exit.await;
            Waited::TimedOut
        }
    }
}

/// Where the supervisor's signals for one task go.
pub(crate) trait ProcessGroup: Send + Sync {
    fn signal(&self, signal: Signal);
}

/// A driver as the supervisor uses it.
pub(crate) trait Launcher: Send + Sync {
    /// The name tasks use in `spec.driver`.
    fn name(&self) -> &'static str;

    /// See [`Driver::prepare`]. Blocking (it touches the task directory):
    /// the runner calls it off its thread.
    fn prepare(
        &self,
        template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError>;

    /// Starts the task's process (see [`Driver::start`]).
    fn start(&self, launch: Launch<'_>) -> Result<Process, DriverError>;

    /// See [`Driver::kill_beyond_group`]: called with the group's SIGKILL.
    fn kill_beyond_group(&self, task_dir: &Path);
}

impl<D: Driver> Launcher for D {
    fn name(&self) -> &'static str {
        Driver::name(self)
    }

    fn prepare(
        &self,
        template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError> {
        Driver::prepare(self, template, task_dir, identity)
    }

    fn start(&self, launch: Launch<'_>) -> Result<Process, DriverError> {
        let Launched {
            mut child, pid, pgid, ..
        } = Driver::start(self, launch)?;
        Ok(Process {
            pid,
            pgid,
            exit: Box::pin(async move { child.wait().await }),
            group: Box::new(Group(pgid)),
        })
    }

    fn kill_beyond_group(&self, task_dir: &Path) {
        Driver::kill_beyond_group(self, task_dir);
    }
}

/// A real process group.
struct Group(i32);

/// The process group `pgid`, to signal (a task re-adopted after an agent
/// restart: no driver started it in this run).
pub(crate) fn group(pgid: i32) -> Box<dyn ProcessGroup> {
    Box::new(Group(pgid))
}

impl ProcessGroup for Group {
    fn signal(&self, signal: Signal) {
        signal_group(self.0, signal);
    }
}

fn signal_group(pgid: i32, signal: Signal) {
    if pgid <= 1 {
        return; // never signal our own or init's group by mistake
    }
    if let Err(e) = killpg(Pid::from_raw(pgid), signal) {
        if e != nix::errno::Errno::ESRCH {
            tracing::warn!(pgid, ?signal, error = %e, "cannot signal a task's process group");
        }
    }
}
