//! A program a test runs as a real process and may SIGKILL, stop and
//! restart with the same arguments: the server, the manager, the API
//! server, an agent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A restartable process, killed (SIGKILL) and reaped on drop. Its stderr
/// goes to `log` (appended across restarts).
pub struct Program {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Program {
    /// Starts `program` with `args`, logging to `log`.
    pub fn start(name: &str, program: &Path, args: Vec<String>, log: &Path) -> Program {
        Self::start_with_env(name, program, args, Vec::new(), log)
    }

    /// [`Program::start`] with environment variables.
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: Vec<String>,
        envs: Vec<(String, String)>,
        log: &Path,
    ) -> Program {
        let mut p = Program {
            name: name.to_owned(),
            program: program.to_owned(),
            args,
            envs,
            log: log.to_owned(),
            child: None,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: log {}: {e}", self.name, self.log.display()));
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: start {}: {e}", self.name, self.program.display()));
        self.child = Some(child);
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the running process.
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    /// SIGKILL and reap: nothing it did not persist survives.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for it to finish its shutdown.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// Starts it again with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again after [`Program::kill`] or [`Program::stop`].
    pub fn resume(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }

    /// Whether it was started and has exited since (it crashed, or was
    /// killed from outside): a supervisor would start it again.
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(Some(_))),
            None => false,
        }
    }

    /// Whether it runs now (not killed, stopped or exited).
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && !self.exited()
    }

    /// The program and its arguments, to run it again with more flags.
    pub fn command(&self) -> (&Path, &[String]) {
        (&self.program, &self.args)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGKILLs every process working under `root` (the tasks of a test's
/// agents, which run in their task directories): an agent leaves its
/// services running when it stops, by design, and a test must not leave
/// them behind.
pub fn kill_tasks_under(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let inside = std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(root));
        if inside && pid != std::process::id() as i32 {
            let pid = nix::unistd::Pid::from_raw(pid);
            if let Ok(group) = nix::unistd::getpgid(Some(pid)) {
                if group != nix::unistd::getpgrp() {
                    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                }
            }
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
