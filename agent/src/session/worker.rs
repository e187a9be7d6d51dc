//! The session's side of the supervisor: the calls it makes, in order, on
//! a worker task of their own, and the supervisor's events turned into
//! status updates.

use k8s4r_api::protocol::StatusUpdate;
use k8s4r_api::{RestartStatus, TaskReason, TaskState};
use tokio::sync::{mpsc, oneshot};

use super::core::failed_status;
use crate::supervisor::outcome::StopCause;
use crate::supervisor::{Submit, SupervisorHandle, TaskEvent, TaskRequest};

/// Supervisor calls, run in order by the worker task.
pub(super) enum TaskCommand {
    Submit(Box<TaskRequest>),
    /// The robot's facts changed.
    Facts(k8s4r_api::Facts),
    Stop {
        uid: String,
        /// None: whatever attempt runs.
        attempt: Option<u32>,
        cause: StopCause,
    },
    /// A running attempt's changed configuration.
    Reconfigure(Box<k8s4r_api::protocol::ConfigUpdate>),
    Shutdown(oneshot::Sender<()>),
}

/// Turns a supervisor event into a status update (its seq is set by the
/// outbox).
pub fn status_of(event: TaskEvent) -> StatusUpdate {
    let mut update = StatusUpdate::new(event.uid(), event.attempt(), 0, TaskState::Running);
    match event {
        TaskEvent::Started {
            at,
            restarted,
            config,
            ..
        } => {
            update.start_time = Some(at);
            update.config = config;
            if let Some(r) = restarted {
                update.restarts = RestartStatus {
                    restart_count: r.count,
                    last_exit_code: r.last_exit_code,
                    last_restart_time: Some(r.at),
                };
                update.message = Some(format!("restarted on the robot ({}): {}", r.count, r.cause));
            }
        }
        TaskEvent::Reconfigured { config, .. } => update.config = Some(config),
        TaskEvent::Output { started, tail, .. } => {
            update.start_time = Some(started);
            update.output_tail = Some(tail);
        }
        TaskEvent::Finished { outcome, .. } => {
            update.state = outcome.state;
            update.exit_code = outcome.exit_code;
            update.signal = outcome.signal;
            update.reason = Some(outcome.reason);
            update.message = Some(outcome.message).filter(|m| !m.is_empty());
            update.start_time = outcome.started_at;
            update.finish_time = Some(outcome.finished_at);
            update.output_tail = Some(outcome.output_tail).filter(|t| !t.is_empty());
        }
    }
    update
}

pub(super) async fn worker(
    supervisor: SupervisorHandle,
    mut commands: mpsc::UnboundedReceiver<TaskCommand>,
    updates: mpsc::UnboundedSender<StatusUpdate>,
) {
    while let Some(command) = commands.recv().await {
        match command {
            TaskCommand::Submit(req) => {
                let (uid, attempt) = (req.uid.clone(), req.attempt);
                match supervisor.submit(*req).await {
                    Ok(Submit::Accepted) => tracing::info!(task = %uid, attempt, "task accepted"),
                    Ok(Submit::Duplicate) => {
                        tracing::info!(task = %uid, attempt, "duplicate dispatch ignored")
                    }
                    Err(e) => {
                        tracing::error!(task = %uid, attempt, error = %e, "supervisor refused the task");
                        let _ = updates.send(failed_status(
                            &uid,
                            attempt,
                            TaskReason::StartFailed,
                            e.to_string(),
                            jiff::Timestamp::now(),
                        ));
                    }
                }
            }
            TaskCommand::Facts(facts) => supervisor.set_facts(facts),
            TaskCommand::Stop { uid, attempt, cause } => {
                supervisor.stop(&uid, attempt, cause).await;
            }
            TaskCommand::Reconfigure(update) => {
                let update = *update;
                supervisor.reconfigure(&update.task_uid, update.attempt, update.config);
            }
            TaskCommand::Shutdown(done) => {
                supervisor.shutdown().await;
                let _ = done.send(());
            }
        }
    }
}

pub(super) async fn forward_events(
    mut events: mpsc::UnboundedReceiver<TaskEvent>,
    updates: mpsc::UnboundedSender<StatusUpdate>,
) {
    while let Some(event) = events.recv().await {
        if updates.send(status_of(event)).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::TaskOutcome;

    #[test]
    fn events_become_status_updates() {
        let at: jiff::Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
        let started = status_of(TaskEvent::Started {
            uid: "u".into(),
            attempt: 2,
            pid: 42,
            at,
            restarted: None,
            config: None,
        });
        assert_eq!(
            (started.state, started.attempt, started.start_time),
            (TaskState::Running, 2, Some(at))
        );
        let finished = status_of(TaskEvent::Finished {
            uid: "u".into(),
            attempt: 2,
            outcome: TaskOutcome {
                state: TaskState::Failed,
                exit_code: Some(143),
                signal: Some(15),
                reason: TaskReason::Timeout,
                message: "timed out".into(),
                started_at: Some(at),
                finished_at: at,
                output_tail: String::new(),
            },
        });
        assert_eq!(finished.state, TaskState::Failed);
        assert_eq!(finished.reason, Some(TaskReason::Timeout));
        assert_eq!(finished.exit_code, Some(143));
        assert_eq!(finished.output_tail, None);
        assert_eq!(finished.finish_time, Some(at));
    }
}
