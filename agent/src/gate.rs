//! What the agent does with a dispatch, without I/O: the session's shell
//! carries the verdict out, and the deterministic simulation of the fleet
//! (`k8s4r-sim`'s `world`) calls the same function, so the simulated
//! robots admit exactly what agents admit.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::protocol::Dispatch;

use crate::fence::{Fence, Refusal};
use crate::link::RunningSet;

/// The verdict on one dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not now: the registration is not approved yet; keep it and try again
    /// when it is.
    HoldForApproval,
    /// This exact attempt runs here already (a redelivery).
    Duplicate,
    /// Refused: expired (the caller reports DispatchTimeout) or an attempt
    /// seen before (dropped silently).
    Refused(Refusal),
    /// Contact is too old for the attempt's `stopAfter`: send a heartbeat
    /// now, and keep the dispatch until its confirmation.
    WaitForContact,
    /// Run it: the fence holds it under `stop_after` (None: not fenced).
    Start {
        /// The attempt's lease.
        stop_after: Option<Duration>,
    },
}

/// Decides what to do with `dispatch` at `now` (boot clock; `wall` is the
/// robot's own clock, for a server that never said its time). `Start`
/// remembers the attempt in the fence and holds its lease; nothing else
/// changes state.
pub fn decide(
    dispatch: &Dispatch,
    approved: bool,
    running: &RunningSet,
    fence: &mut Fence,
    now: Duration,
    wall: Timestamp,
) -> Verdict {
    if !approved {
        return Verdict::HoldForApproval;
    }
    if running.contains(&dispatch.task_uid, dispatch.attempt) {
        return Verdict::Duplicate;
    }
    let stop_after: Option<Duration> = dispatch.stop_after.as_ref().and_then(|d| d.parse().ok());
    let fresh = stop_after.is_none_or(|lease| fence.fresh_for(lease, now));
    let checked = if fresh {
        fence.admit(dispatch, now, wall)
    } else {
        fence.check(dispatch, now, wall)
    };
    if let Err(refusal) = checked {
        return Verdict::Refused(refusal);
    }
    if !fresh {
        return Verdict::WaitForContact;
    }
    fence.hold(&dispatch.task_uid, dispatch.attempt, stop_after);
    Verdict::Start { stop_after }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::TaskTemplate;

    fn dispatch(attempt: u32) -> Dispatch {
        Dispatch::new("u1", "default/t", attempt, TaskTemplate::default())
    }

    #[test]
    fn holds_until_approved_then_starts_once() {
        let mut fence = Fence::new();
        let mut running = RunningSet::default();
        let now = Duration::from_secs(10);
        let wall = Timestamp::UNIX_EPOCH;
        assert_eq!(
            decide(&dispatch(1), false, &running, &mut fence, now, wall),
            Verdict::HoldForApproval
        );
        assert_eq!(
            decide(&dispatch(1), true, &running, &mut fence, now, wall),
            Verdict::Start { stop_after: None }
        );
        running.insert("u1", 1);
        assert_eq!(
            decide(&dispatch(1), true, &running, &mut fence, now, wall),
            Verdict::Duplicate
        );
        running.remove("u1", 1);
        assert_eq!(
            decide(&dispatch(1), true, &running, &mut fence, now, wall),
            Verdict::Refused(Refusal::Seen { highest: 1 })
        );
    }
}
