//! A [`Disk`] in memory, for shells without a state directory of their own
//! (the simulations, whose "disk" outlives a simulated restart because the
//! shell keeps it) and for tests.

use std::collections::BTreeMap;

use k8s4r_api::protocol::StatusUpdate;

use super::Disk;

/// What [`Memory::admit`](Disk::admit) does with an accepted attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Admissions {
    /// Records it, as the agent does.
    #[default]
    Record,
    /// Says it is recorded and forgets it: a robot without the record, to
    /// show what the record prevents.
    Forget,
    /// Fails, as a full disk would.
    Fail,
}

/// The outbox and the record of accepted attempts, in memory.
#[derive(Debug)]
pub struct Memory {
    /// Statuses waiting for their confirmation, by seq.
    pub outbox: BTreeMap<u64, StatusUpdate>,
    /// The seq the next status gets.
    pub next_seq: u64,
    /// The attempts accepted, oldest first.
    pub admitted: Vec<(String, u32)>,
    /// What `admit` does.
    pub admissions: Admissions,
    /// Final statuses settled since the shell last took them: the robot was
    /// told the cluster recorded them.
    pub settled: Vec<StatusUpdate>,
}

impl Default for Memory {
    /// Empty, its first status numbered 1 as the agent's outbox numbers
    /// it: a Task's status counts as seq 0 before any report, so a first
    /// report numbered 0 would be taken for a duplicate (the simulated
    /// robots' first status was dropped that way).
    fn default() -> Self {
        Memory {
            outbox: BTreeMap::new(),
            next_seq: 1,
            admitted: Vec::new(),
            admissions: Admissions::default(),
            settled: Vec::new(),
        }
    }
}

impl Disk for Memory {
    fn push(&mut self, mut update: StatusUpdate) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        update.seq = seq;
        self.outbox.insert(seq, update);
        seq
    }

    fn settle(&mut self, seq: u64) {
        if let Some(update) = self.outbox.remove(&seq) {
            if update.state.is_terminal() {
                self.settled.push(update);
            }
        }
    }

    fn get(&self, seq: u64) -> Option<&StatusUpdate> {
        self.outbox.get(&seq)
    }

    fn first_from(&self, from: u64) -> Option<(u64, &StatusUpdate)> {
        self.outbox.range(from..).next().map(|(seq, u)| (*seq, u))
    }

    fn waiting(&self) -> Vec<(String, u32)> {
        self.outbox
            .values()
            .map(|u| (u.task_uid.clone(), u.attempt))
            .collect()
    }

    fn len(&self) -> usize {
        self.outbox.len()
    }

    fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn admit(&mut self, uid: &str, attempt: u32) -> std::io::Result<()> {
        match self.admissions {
            Admissions::Record => self.admitted.push((uid.to_owned(), attempt)),
            Admissions::Forget => {}
            Admissions::Fail => return Err(std::io::Error::other("no space left on device")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::TaskState;

    #[test]
    fn a_first_status_is_numbered_so_that_it_counts_as_news() {
        let mut memory = Memory::default();
        let seq = memory.push(StatusUpdate::new("uid", 1, 0, TaskState::Running));
        let update = memory.get(seq).expect("kept until settled");
        assert!(
            update.supersedes(1, 0, Some(TaskState::Dispatching)),
            "a first report ({seq}) over a Task not reported on yet"
        );
    }
}
