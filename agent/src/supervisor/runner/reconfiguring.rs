//! The runner's side of a running attempt's configuration change: its
//! files are rewritten off the loop (`task_config::update`), then what its
//! `onConfigChange` says is done: nothing more, its signal to its process
//! group, or a stop and an immediate start with the new values (using none
//! of its restarts). What was done goes out as the attempt's status: at
//! once, or, for a restart, with the `Started` of the new process.
//!
//! One change of an attempt is written at a time: one that comes while
//! another is being written (a QoS 1 copy, or a newer change) waits, the
//! newest only, and is taken once the first is done.

use k8s4r_api::config_ref::{ConfigSource, OnConfigChange};
use k8s4r_api::protocol::{ConfigReport, TaskConfig};

use super::*;
use crate::supervisor::task_config::{self, Applied};

impl Runner {
    /// A change of `uid`'s attempt `attempt`: ignored unless that attempt
    /// is held here.
    pub(super) fn reconfigure(&mut self, uid: String, attempt: u32, config: TaskConfig) {
        let Some(task) = self
            .table
            .ids_of(&uid, Some(attempt))
            .first()
            .copied()
            .and_then(|id| self.table.get_mut(id))
        else {
            tracing::info!(task = %uid, attempt, "configuration change for an attempt not held here: dropped");
            return;
        };
        if task.config_writing {
            let newer = task
                .config_next
                .as_ref()
                .is_none_or(|next| next.generation < config.generation);
            if newer {
                task.config_next = Some(Box::new(config));
            }
            return;
        }
        task.config_writing = true;
        let dir = task.dir.clone();
        self.offload_with(move || {
            let applied = task_config::update(&dir, &config);
            Housework::Reconfigured {
                uid,
                attempt,
                report: ConfigReport {
                    generation: config.generation,
                    sources: config.sources,
                    message: None,
                },
                applied,
            }
        });
    }

    /// The files are rewritten (or could not be): the attempt acts on it,
    /// then takes a change that came meanwhile.
    pub(super) fn on_reconfigured(
        &mut self,
        uid: String,
        attempt: u32,
        report: ConfigReport,
        applied: Applied,
    ) {
        // The process may have restarted meanwhile: it is the attempt that
        // counts, not the run.
        let Some(id) = self.table.ids_of(&uid, Some(attempt)).first().copied() else {
            return;
        };
        let next = self.table.get_mut(id).and_then(|task| {
            task.config_writing = false;
            task.config_next.take()
        });
        self.take_config(id, uid.clone(), attempt, report, applied);
        if let Some(next) = next {
            self.reconfigure(uid, attempt, *next);
        }
    }

    fn take_config(
        &mut self,
        id: u64,
        uid: String,
        attempt: u32,
        mut report: ConfigReport,
        applied: Applied,
    ) {
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        let env = match applied {
            Applied::Stale => return,
            Applied::Same => {
                report.message = Some("unchanged: the values this task takes are the same".to_owned());
                task.config = Some(report.clone());
                return self.report_config(uid, attempt, report);
            }
            Applied::Failed { why, kept } => {
                tracing::warn!(task = %uid, attempt, %why, "cannot take the changed configuration");
                // The versions it runs with are those of before.
                let kept = ConfigReport {
                    generation: report.generation,
                    sources: kept,
                    message: Some(format!("not applied: {why}; it runs on with what it had")),
                };
                task.config = Some(kept.clone());
                return self.report_config(uid, attempt, kept);
            }
            Applied::Changed(env) => env,
        };
        if let Some(prepared) = task.prepared.as_mut() {
            prepared.config_env = env;
        }
        let running = task.is_running() && task.stop.is_none();
        let what = match (task.template.on_config_change, running) {
            (_, false) => "files rewritten; not running now, it starts with them".to_owned(),
            (OnConfigChange::None, true) => {
                "files rewritten; variables take their new values at the next start".to_owned()
            }
            (OnConfigChange::Signal, true) => {
                let signal = task
                    .template
                    .config_change_signal
                    .unwrap_or(k8s4r_api::StopSignal::Hup);
                if let Phase::Running(run) = &task.phase {
                    run.group.signal(signal_of(signal));
                }
                format!("files rewritten; sent {} to its process group", signal.name())
            }
            (OnConfigChange::Restart, true) => {
                report.message = Some("files rewritten; restarted with the new values".to_owned());
                task.config = Some(report.clone());
                let why = ConfigSource::versions(&report.sources);
                tracing::info!(task = %uid, attempt, versions = %why, "restarting the task for its changed configuration");
                // Its next `Started` carries the report.
                return self.stop(id, StopCause::ConfigChanged(why));
            }
        };
        report.message = Some(what);
        task.config = Some(report.clone());
        self.report_config(uid, attempt, report);
    }

    fn report_config(&mut self, uid: String, attempt: u32, config: ConfigReport) {
        tracing::info!(task = %uid, attempt, generation = config.generation, message = config.message.as_deref().unwrap_or(""), "configuration change taken");
        self.journal
            .event(TaskEvent::Reconfigured { uid, attempt, config });
    }
}

/// The signal a spec names.
fn signal_of(signal: k8s4r_api::StopSignal) -> Signal {
    Signal::try_from(signal.number()).unwrap_or(Signal::SIGHUP)
}
