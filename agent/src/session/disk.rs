//! The agent's [`Disk`] for the protocol's core: the outbox of statuses
//! and the record of accepted attempts, both files under the state
//! directory.

use k8s4r_api::protocol::StatusUpdate;

use super::core::Disk;
use crate::admitted::Admitted;
use crate::outbox::Outbox;

/// The files.
pub(super) struct Files {
    pub(super) outbox: Outbox,
    pub(super) admitted: Admitted,
}

impl Disk for Files {
    fn push(&mut self, update: StatusUpdate) -> u64 {
        match self.outbox.push(update) {
            Ok(seq) => seq,
            Err(e) => {
                // Without a disk the update still goes out and waits for the
                // server's confirmation in memory; it just would not survive
                // a restart. Its seq is its own, never reused.
                tracing::error!(error = %e, seq = e.seq, "cannot journal a status update; keeping it in memory");
                e.seq
            }
        }
    }

    fn settle(&mut self, seq: u64) {
        if let Err(e) = self.outbox.remove(seq) {
            tracing::error!(error = %e, "cannot remove a settled status from the outbox");
        }
    }

    fn get(&self, seq: u64) -> Option<&StatusUpdate> {
        self.outbox
            .first_from(seq)
            .filter(|(id, _)| *id == seq)
            .map(|(_, u)| u)
    }

    fn first_from(&self, from: u64) -> Option<(u64, &StatusUpdate)> {
        self.outbox.first_from(from)
    }

    fn waiting(&self) -> Vec<(String, u32)> {
        self.outbox
            .iter()
            .map(|(_, u)| (u.task_uid.clone(), u.attempt))
            .collect()
    }

    fn len(&self) -> usize {
        self.outbox.len()
    }

    fn next_seq(&self) -> u64 {
        self.outbox.peek_seq()
    }

    fn admit(&mut self, uid: &str, attempt: u32) -> std::io::Result<()> {
        self.admitted
            .record(uid, attempt)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", self.admitted.path().display())))
    }
}
