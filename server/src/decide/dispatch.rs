//! Kubernetes → MQTT: what the server does about one Task (dispatch it,
//! cancel it, evict it from a robot being drained, release its
//! finalizer), from what the Task shows, and what a cancel says.

use jiff::Timestamp;
use k8s4r_api::protocol::Cancel;
use k8s4r_api::{Robot, RobotPhase, Task, TaskState, TaskStatus};

use super::ANNOTATION_DISPATCHED_ATTEMPT;

/// The attempt whose dispatch the broker acknowledged, from the annotation
/// servers before this one wrote (this one keeps that in memory: see
/// [`decide_task`]).
pub fn dispatched_attempt(task: &Task) -> u32 {
    task.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_DISPATCHED_ATTEMPT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The highest attempt that may have reached the robot (see
/// [`k8s4r_api::task::sent_attempt`]): cancels and deletions of an attempt
/// at or below it wait for the robot.
pub fn sent_attempt(task: &Task) -> u32 {
    k8s4r_api::task::sent_attempt(task.metadata.annotations.as_ref())
}

/// Whether the Task carries the server's finalizer.
pub fn has_finalizer(task: &Task) -> bool {
    task.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == k8s4r_api::names::FINALIZER_CANCEL))
}

/// What the Kubernetes → MQTT side does about one Task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskAction {
    /// Nothing to do until the Task changes.
    Nothing,
    /// Record the attempt as being sent (and add the finalizer if
    /// missing) in one write guarded by the Task's resourceVersion, unless
    /// that record is there already, then publish the dispatch. The guard
    /// orders the send against a person's cancel: see [`sent_attempt`].
    Dispatch {
        /// The robot.
        robot: String,
        /// The attempt.
        attempt: u32,
    },
    /// Publish a cancel and keep the finalizer until the robot reports the
    /// attempt ended (or goes Offline); look again after a while.
    CancelAndWait {
        /// The robot.
        robot: String,
        /// The attempt.
        attempt: u32,
    },
    /// A person cancelled the Task (it stays): publish a cancel and look
    /// again after a while, until the robot reports the attempt ended.
    Cancel {
        /// The robot.
        robot: String,
        /// The attempt.
        attempt: u32,
    },
    /// The attempt is evicted (`k8s4r drain`): publish a cancel that
    /// drains, and look again after a while, until the robot reports the
    /// attempt ended.
    Evict {
        /// The robot.
        robot: String,
        /// The attempt.
        attempt: u32,
    },
    /// Publish a cancel (best effort) and release the finalizer now.
    CancelAndRelease {
        /// The robot.
        robot: String,
        /// The attempt.
        attempt: u32,
    },
    /// Release the finalizer now.
    Release,
}

/// Decides what to do about `task`, given its robot's phase (None: no such
/// Robot) and the attempt of it this process last published (the broker
/// acknowledged it), at `now`.
///
/// What was published is not written to the Task: a write per attempt for
/// what only a restart needs. A new process (a restart, a new leader)
/// publishes a dispatching attempt again; the robot drops an attempt it
/// accepted before, across its own restarts (docs/fencing.md).
pub fn decide_task(
    task: &Task,
    robot_phase: Option<RobotPhase>,
    published: Option<u32>,
    now: Timestamp,
) -> TaskAction {
    let status = task.status.clone().unwrap_or_default();
    let robot = task.spec.target_robot.clone().filter(|r| !r.is_empty());
    let attempt = status.attempt;
    if task.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(task) {
            return TaskAction::Nothing;
        }
        let Some(robot) = robot else {
            return TaskAction::Release;
        };
        let active = matches!(status.state, Some(TaskState::Dispatching | TaskState::Running));
        let reachable = robot_phase.is_some_and(reachable);
        // A dispatch never about to be published is not on the robot: the
        // Task need not wait for a report that would never come.
        let sent = sent_attempt(task) >= attempt;
        return match (active, reachable && sent) {
            (true, true) => TaskAction::CancelAndWait { robot, attempt },
            (true, false) => TaskAction::CancelAndRelease { robot, attempt },
            (false, _) => TaskAction::Release,
        };
    }
    // A cancel wins over an eviction: the task is not to run anywhere.
    let cancel = status.cancel_requested();
    if cancel || status.eviction_requested() {
        let active = matches!(status.state, Some(TaskState::Dispatching | TaskState::Running));
        // A dispatch never sent is not sent now; one that may have been
        // sent is stopped.
        return match robot {
            Some(robot) if active && attempt >= 1 && sent_attempt(task) >= attempt => match cancel {
                true => TaskAction::Cancel { robot, attempt },
                false => TaskAction::Evict { robot, attempt },
            },
            _ => TaskAction::Nothing,
        };
    }
    // A dispatch past its deadline would be refused by the robot; the
    // manager gives the attempt up and schedules the next one.
    match (unsent(task, published.unwrap_or(0)), robot) {
        (Some(deadline), Some(robot)) if deadline.is_none_or(|d| d > now) => {
            TaskAction::Dispatch { robot, attempt }
        }
        _ => TaskAction::Nothing,
    }
}

/// A running attempt's configuration to send its robot again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSend {
    /// The robot.
    pub robot: String,
    /// The attempt.
    pub attempt: u32,
    /// The manager's request's generation: the robot reports it applied.
    pub generation: u64,
}

/// Whether to send `task`'s running attempt its configuration again: the
/// manager asked (`robot.k8s4r.io/config-refresh`) for this attempt, at a
/// generation its robot has not reported applying and this process has
/// not sent (`sent`: the attempt and generation it last sent). A Task
/// being deleted, cancelled or evicted gets none.
pub fn config_to_send(task: &Task, sent: Option<(u32, u64)>) -> Option<ConfigSend> {
    let status = task.status.as_ref()?;
    if task.metadata.deletion_timestamp.is_some()
        || status.state != Some(TaskState::Running)
        || status.cancel_requested()
        || status.eviction_requested()
    {
        return None;
    }
    let asked = k8s4r_api::config_ref::ConfigRefresh::of(task.metadata.annotations.as_ref())?;
    let applied = status.config.as_ref().map_or(0, |c| c.generation);
    let robot = task.spec.target_robot.clone().filter(|r| !r.is_empty())?;
    let new = asked.attempt == status.attempt
        && asked.generation > applied
        && sent.is_none_or(|s| s < (asked.attempt, asked.generation));
    new.then_some(ConfigSend {
        robot,
        attempt: asked.attempt,
        generation: asked.generation,
    })
}

/// A Robot's phase; Pending before the manager has decided one.
pub fn phase_of(robot: &Robot) -> RobotPhase {
    robot
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or(RobotPhase::Pending)
}

/// Whether a robot in `phase` may still report on the attempts it holds
/// (a deleted Task on it waits for its report); in any other phase its
/// Tasks' finalizers go without one.
pub fn reachable(phase: RobotPhase) -> bool {
    matches!(phase, RobotPhase::Online | RobotPhase::Pending)
}

/// The attempt a Task is dispatching (0: none).
pub fn dispatching(task: &Task) -> u32 {
    task.status
        .as_ref()
        .filter(|s| s.state == Some(TaskState::Dispatching))
        .map_or(0, |s| s.attempt)
}

/// The dispatch deadline (if any) of a Task's dispatching attempt newer
/// than `published`; None when there is no such attempt.
fn unsent(task: &Task, published: u32) -> Option<Option<Timestamp>> {
    let attempt = dispatching(task);
    (attempt >= 1 && published < attempt).then(|| task.status.as_ref().and_then(|s| s.dispatch_deadline))
}

/// Whether a Task's dispatching attempt no server began to send (no
/// sending record at its number) has passed its deadline, the Task neither
/// deleted nor asked to stop: the manager fails it, this server was late.
pub fn expired_unsent(task: &Task, now: Timestamp) -> bool {
    let Some(status) = task.status.as_ref() else {
        return false;
    };
    let stopping = task.metadata.deletion_timestamp.is_some()
        || status.cancel_requested()
        || status.eviction_requested();
    !stopping && sent_attempt(task) < status.attempt && unsent(task, 0).flatten().is_some_and(|d| d <= now)
}

/// What a cancel tells a robot: why, and whether the robot is being
/// drained (the attempt then ends `Drained` and the task waits for another
/// robot, without using a retry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    /// For the task's status message.
    pub reason: String,
    /// The robot is being drained.
    pub drain: bool,
}

impl Stop {
    /// A plain cancel, saying `reason`.
    pub fn cancel(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            drain: false,
        }
    }

    /// The cancel of a deleted or cancelled Task: who cancelled it, when
    /// the status says.
    pub fn of_task(task: &Task) -> Self {
        let cancellation = task.status.as_ref().and_then(|s| s.cancellation.as_ref());
        Self::cancel(match cancellation {
            _ if task.metadata.deletion_timestamp.is_some() => "Task deleted".to_owned(),
            Some(c) => match &c.by {
                Some(by) => format!("cancelled by {by}"),
                None => "cancelled".to_owned(),
            },
            None => "Task deleted".to_owned(),
        })
    }

    /// The cancel of an attempt being evicted (`k8s4r drain`).
    pub fn eviction(status: &TaskStatus) -> Self {
        let reason = match status.eviction.as_ref().and_then(|e| e.by.as_deref()) {
            Some(by) => format!("robot drained (k8s4r drain by {by})"),
            None => "robot drained (k8s4r drain)".to_owned(),
        };
        Self { reason, drain: true }
    }

    /// The message that stops `attempt` of the Task `uid`.
    pub fn message(&self, uid: impl Into<String>, attempt: u32) -> Cancel {
        Cancel {
            drain: self.drain,
            ..Cancel::new(uid, attempt, self.reason.clone())
        }
    }
}
