//! The `Connected` condition: what the robot said about its connection,
//! and what the broker knew of it when this server started.

use std::collections::HashSet;

use jiff::Timestamp;
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::{Condition, ConditionStatus, Robot};

use super::CONDITION_CONNECTED;

/// The conditions list with `Connected` set to `up`, or None when it already
/// says so (no write needed). A robot that has never been marked
/// disconnected gets the condition on its first register.
pub fn connected(conditions: &[Condition], up: bool, now: Timestamp) -> Option<Vec<Condition>> {
    if up {
        set_connected(
            conditions,
            ConditionStatus::True,
            REASON_CONNECTED,
            "the robot is connected to the broker",
            now,
        )
    } else {
        set_connected(
            conditions,
            ConditionStatus::False,
            "Disconnected",
            "the robot disconnected: it said online: false as it stopped, or its last will did",
            now,
        )
    }
}

/// Whether `robot` was heard from, or connected again, after `since`,
/// when its `online: false` was received and held (`crate::wills`): a
/// robot whose agent restarted within the hold may have said `online:
/// true` to another replica, or on another broker, and been recorded
/// already; its older `online: false` must not undo that. `lease_renewed`:
/// its Lease's `renewTime`, which heartbeats renew.
pub fn heard_after(robot: &Robot, lease_renewed: Option<Timestamp>, since: Timestamp) -> bool {
    let Some(status) = robot.status.as_ref() else {
        return false;
    };
    let reconnected = find_condition(&status.conditions, CONDITION_CONNECTED)
        .filter(|c| c.status == ConditionStatus::True)
        .and_then(|c| c.last_transition_time);
    [
        reconnected,
        status.last_registration_time,
        status.last_heartbeat_time,
        lease_renewed,
    ]
    .into_iter()
    .flatten()
    .any(|t| t > since)
}

/// Reason of `Connected=False` for a robot the broker did not know as
/// connected when this server started.
pub const REASON_NOT_CONNECTED_AT_START: &str = "NotConnectedAtStart";
const REASON_CONNECTED: &str = "Connected";

/// The Robots (name and new conditions) that still say `Connected=True`
/// although the broker held no `online: true` presence for them when this
/// server started (`present`), and that have not been heard from since
/// (`started`): after a restart of the cluster side, a robot whose agent is
/// gone must not stay schedulable until its heartbeat times out. A robot
/// that connects later says `online: true` and is Connected again.
pub fn absent_at_start<'a>(
    robots: impl IntoIterator<Item = &'a Robot>,
    present: &HashSet<String>,
    started: Timestamp,
    now: Timestamp,
) -> Vec<(String, Vec<Condition>)> {
    robots
        .into_iter()
        .filter_map(|robot| {
            let name = robot.metadata.name.as_deref()?;
            let status = robot.status.as_ref()?;
            let heard_since_start = [status.last_heartbeat_time, status.last_registration_time]
                .into_iter()
                .flatten()
                .any(|t| t >= started);
            if present.contains(name) || heard_since_start {
                return None;
            }
            find_condition(&status.conditions, CONDITION_CONNECTED)
                .filter(|c| c.status == ConditionStatus::True)?;
            let list = set_connected(
                &status.conditions,
                ConditionStatus::False,
                REASON_NOT_CONNECTED_AT_START,
                "the broker had no connection from this robot's agent when the server started, \
                 and the agent has not announced itself since",
                now,
            )?;
            Some((name.to_owned(), list))
        })
        .collect()
}

fn set_connected(
    conditions: &[Condition],
    wanted: ConditionStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    if find_condition(conditions, CONDITION_CONNECTED).is_some_and(|c| c.status == wanted) {
        return None;
    }
    let mut condition = Condition::new(CONDITION_CONNECTED, wanted, reason, message);
    condition.last_transition_time = Some(now);
    let mut list = conditions.to_vec();
    set_condition(&mut list, condition);
    Some(list)
}
