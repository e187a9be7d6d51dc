//! The demo's progress line: tasks per state, updated in place on a
//! terminal, one plain line per change otherwise.

use std::io::{IsTerminal, Write};

use k8s4r_api::{TaskCounts, WorkState};

/// Renders progress to stdout.
pub struct Progress {
    tty: bool,
    last: Option<String>,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new(std::io::stdout().is_terminal())
    }
}

impl Progress {
    /// A renderer; `tty` chooses in-place updates.
    pub fn new(tty: bool) -> Self {
        Self { tty, last: None }
    }

    /// Shows the job's state if it changed since the last call.
    pub fn show(&mut self, job: &str, state: Option<WorkState>, counts: &TaskCounts) {
        let line = render(job, state, counts);
        if self.last.as_deref() == Some(line.as_str()) {
            return;
        }
        let mut out = std::io::stdout().lock();
        // A progress line that cannot be written is not worth stopping for.
        let _ = if self.tty {
            write!(out, "\r\x1b[2K{line}").and_then(|()| out.flush())
        } else {
            writeln!(out, "{line}")
        };
        self.last = Some(line);
    }

    /// Ends the in-place line so that later output starts on its own line.
    pub fn finish(&mut self) {
        if self.tty && self.last.is_some() {
            println!();
        }
    }
}

/// One progress line, e.g. `job demo: running  [pending 0  dispatching 1  running 2  completed 0  failed 0]  0/3`.
pub fn render(job: &str, state: Option<WorkState>, c: &TaskCounts) -> String {
    let state = match state {
        None => "submitted",
        Some(WorkState::Pending) => "pending",
        Some(WorkState::Running) => "running",
        Some(WorkState::Completed) => "completed",
        Some(WorkState::Failed) => "failed",
        Some(WorkState::Skipped) => "skipped",
        Some(WorkState::Cancelled) => "cancelled",
    };
    format!(
        "job {job}: {state:<9} [pending {}  dispatching {}  running {}  completed {}  failed {}]  {}/{} done",
        c.pending, c.dispatching, c.running, c.completed, c.failed, c.completed, c.total
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_per_state() {
        let counts = TaskCounts {
            total: 3,
            pending: 1,
            running: 1,
            completed: 1,
            ..Default::default()
        };
        assert_eq!(
            render("demo", Some(WorkState::Running), &counts),
            "job demo: running   [pending 1  dispatching 0  running 1  completed 1  failed 0]  1/3 done"
        );
    }
}
