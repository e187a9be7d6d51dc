//! A fake driver for the supervisor's unit tests. Its processes are
//! records: nothing is started or signalled on the machine. What one does
//! is named by its command:
//!
//! - `sleep`: runs until the test ends it with [`FakeDriver::exit`]; SIGTERM
//!   or SIGKILL ends it.
//! - `stubborn`: like `sleep`, but ignores SIGTERM.
//! - `missing`: cannot start (command not found).
//! - `gated`: like `sleep`, but its start (on the supervisor's blocking
//!   pool) waits until the test calls [`FakeDriver::open_gate`].
//!
//! A process writes its arguments, space-separated, to stdout when it
//! starts. Pids start above any kernel's `pid_max`, so they can never be
//! mistaken for a real process.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s4r_api::TaskTemplate;
use k8s4r_drivers::{DriverError, Identity, Launch, Limits, Prepared};
use nix::sys::signal::Signal;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::process::{Launcher, Process, ProcessGroup};

/// The driver name the fake answers to (one the spec validation accepts).
pub(crate) const DRIVER: &str = "raw_exec";
/// The first fake pid: above `PID_MAX_LIMIT` (2^22).
const FIRST_PID: u32 = 10_000_000;

/// (uid, attempt): how the tests name a fake process.
type Key = (String, u32);

#[derive(Clone, Default)]
pub(crate) struct FakeDriver {
    state: Arc<Mutex<State>>,
    /// Whether `gated` starts may go on, and how many are waiting.
    gate: Arc<(Mutex<(bool, u32)>, std::sync::Condvar)>,
}

#[derive(Default)]
struct State {
    started: u32,
    processes: HashMap<Key, FakeProcess>,
    signals: Vec<Sent>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct FakeProcess {
    pid: u32,
    started_at: Instant,
    ignores_sigterm: bool,
    /// Taken when the process ends.
    exit: Option<oneshot::Sender<io::Result<ExitStatus>>>,
    /// The write ends of its pipes, closed when it ends.
    output: Option<(File, File)>,
}

impl FakeProcess {
    fn end(&mut self, status: ExitStatus) {
        self.output = None;
        if let Some(exit) = self.exit.take() {
            let _ = exit.send(Ok(status));
        }
    }
}

/// A signal the supervisor sent to a fake process group.
struct Sent {
    to: Key,
    signal: Signal,
    at: Instant,
    /// Whether the process was still running when it came.
    alive: bool,
}

impl FakeDriver {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Ends a running process with an exit code.
    pub(crate) fn exit(&self, uid: &str, attempt: u32, code: i32) {
        let mut state = self.state();
        let process = state
            .processes
            .get_mut(&(uid.to_owned(), attempt))
            .unwrap_or_else(|| panic!("no fake process {uid}/{attempt}"));
        process.end(ExitStatus::from_raw(code << 8));
    }

    /// When the process started, and its pid.
    pub(crate) fn started(&self, uid: &str, attempt: u32) -> Option<(Instant, u32)> {
        let state = self.state();
        let process = state.processes.get(&(uid.to_owned(), attempt))?;
        Some((process.started_at, process.pid))
    }

    /// Lets every `gated` start go on.
    pub(crate) fn open_gate(&self) {
        let (lock, opened) = &*self.gate;
        lock.lock().unwrap_or_else(|p| p.into_inner()).0 = true;
        opened.notify_all();
    }

    /// How many `gated` starts wait at the gate.
    pub(crate) fn at_gate(&self) -> u32 {
        self.gate.0.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    /// How many processes were started in all.
    pub(crate) fn starts(&self) -> u32 {
        self.state().started
    }

    /// The signals a process got while it still ran, in order.
    pub(crate) fn signals_while_alive(&self, uid: &str, attempt: u32) -> Vec<(Signal, Instant)> {
        let key = (uid.to_owned(), attempt);
        let state = self.state();
        let alive = state.signals.iter().filter(|sent| sent.alive && sent.to == key);
        alive.map(|sent| (sent.signal, sent.at)).collect()
    }
}

impl Launcher for FakeDriver {
    fn name(&self) -> &'static str {
        DRIVER
    }

    fn prepare(
        &self,
        _template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError> {
        Ok(Prepared {
            user: "fake".to_owned(),
            identity,
            task_dir: task_dir.to_path_buf(),
            cwd: task_dir.to_path_buf(),
            limits: Limits::default(),
            config_env: Default::default(),
        })
    }

    fn start(&self, launch: Launch<'_>) -> Result<Process, DriverError> {
        let command = launch.template.command.as_str();
        if command == "gated" {
            let (lock, opened) = &*self.gate;
            let mut gate = lock.lock().unwrap_or_else(|p| p.into_inner());
            gate.1 += 1;
            while !gate.0 {
                gate = opened.wait(gate).unwrap_or_else(|p| p.into_inner());
            }
            gate.1 -= 1;
        }
        if !["sleep", "stubborn", "gated"].contains(&command) {
            return Err(DriverError::CommandNotFound {
                command: command.to_owned(),
            });
        }
        let env = |name: &str| {
            let found = launch.extra_env.iter().find(|(k, _)| k == name);
            found.map(|(_, v)| v.clone()).unwrap_or_default()
        };
        let key = (
            env("K8S4R_TASK_UID"),
            env("K8S4R_TASK_ATTEMPT").parse().unwrap_or(0),
        );
        let mut stdout = File::from(launch.stdout);
        let line = format!("{}\n", launch.template.args.join(" "));
        stdout
            .write_all(line.as_bytes())
            .map_err(|source| DriverError::Spawn {
                command: command.to_owned(),
                source,
            })?;
        let (exit_tx, exit_rx) = oneshot::channel();
        let mut state = self.state();
        let pid = FIRST_PID + state.started;
        state.started += 1;
        let process = FakeProcess {
            pid,
            started_at: Instant::now(),
            ignores_sigterm: command == "stubborn",
            exit: Some(exit_tx),
            output: Some((stdout, File::from(launch.stderr))),
        };
        state.processes.insert(key.clone(), process);
        Ok(Process {
            pid,
            pgid: pid as i32,
            exit: Box::pin(async move {
                exit_rx
                    .await
                    .unwrap_or_else(|_| Err(io::Error::other("the fake driver is gone")))
            }),
            group: Box::new(FakeGroup {
                key,
                state: Arc::clone(&self.state),
            }),
        })
    }

    /// Its processes are all in their group.
    fn kill_beyond_group(&self, _task_dir: &Path) {}
}

struct FakeGroup {
    key: Key,
    state: Arc<Mutex<State>>,
}

impl ProcessGroup for FakeGroup {
    fn signal(&self, signal: Signal) {
        let mut state = lock(&self.state);
        let Some(process) = state.processes.get_mut(&self.key) else {
            return;
        };
        let alive = process.exit.is_some();
        if alive && (signal == Signal::SIGKILL || !process.ignores_sigterm) {
            process.end(ExitStatus::from_raw(signal as i32));
        }
        state.signals.push(Sent {
            to: self.key.clone(),
            signal,
            at: Instant::now(),
            alive,
        });
    }
}
