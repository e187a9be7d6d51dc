//! What a simulated robot of the scale fleet keeps until the server
//! confirms it, and what it lists as held meanwhile.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s4r_api::TaskAttempt;

/// Status updates sent and not yet confirmed by the server, by seq: the
/// topic, the payload, and when each was last sent. Seqs grow across every
/// attempt the robot runs, as the agent's outbox ids do.
#[derive(Default)]
pub(crate) struct Outbox {
    pub(crate) next_seq: u64,
    pub(crate) unconfirmed: BTreeMap<u64, (String, Vec<u8>, tokio::time::Instant)>,
    /// The attempt of each unconfirmed update: listed as held until then.
    pub(crate) attempts: BTreeMap<u64, (String, u32)>,
}

impl Outbox {
    pub(crate) fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

/// The attempts a robot holds, as its registration and heartbeats list
/// them: those it runs and, as the agent does, those whose final status is
/// not confirmed yet (dropping them at their end let one slow status write
/// fail the task NotOnRobot).
pub(crate) fn holding(held: &HashMap<(String, u32), usize>, outbox: &Outbox) -> Vec<TaskAttempt> {
    let mut keys: BTreeSet<(String, u32)> = held.keys().cloned().collect();
    keys.extend(outbox.attempts.values().cloned());
    keys.into_iter()
        .map(|(uid, attempt)| TaskAttempt::new(uid, attempt))
        .collect()
}
