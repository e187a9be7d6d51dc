//! The last contact with the cluster, kept for the next agent process of
//! this boot: it re-adopts the fenced attempts this one leaves running
//! and must fence them from when the cluster last heard from the robot,
//! not from its own start (the cluster's fencing arithmetic counts from
//! then). The time is on the boot clock, so the file says which boot it
//! belongs to; one of another boot is no contact at all.
//!
//! It lives in the agent's runtime directory (`$RUNTIME_DIRECTORY`, a tmpfs
//! under systemd kept across restarts of the unit, else `state_dir/run`),
//! made by the supervisor as it starts. Written on each
//! confirmed heartbeat, renamed in place, never synced: after a power cut
//! the boot differs and the file means nothing anyway. A missing or older
//! record only makes the next process stop the attempts sooner.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::clock::{boot_clock, now};
use super::core::Core;
use crate::config::Config;

/// The file's name.
const FILE_NAME: &str = "contact";

/// Where the contact is kept.
pub(crate) struct ContactFile {
    path: PathBuf,
    boot_id: String,
    written: Option<Duration>,
}

impl ContactFile {
    /// In the agent's runtime directory (`runtime_dir`).
    pub(crate) fn new(runtime_dir: &Path, boot_id: String) -> Self {
        ContactFile {
            path: runtime_dir.join(FILE_NAME),
            boot_id,
            written: None,
        }
    }

    /// The contact a previous process of this boot wrote down, if any.
    pub(crate) fn load(&self) -> Option<Duration> {
        k8s4r_drivers::shim::read_contact(&self.path, &self.boot_id)
    }

    /// Keeps `contact` for the next process (when it moved on).
    pub(crate) fn save(&mut self, contact: Duration) {
        if self.written == Some(contact) {
            return;
        }
        let partial = self.path.with_extension("partial");
        let text = k8s4r_drivers::shim::contact_line(&self.boot_id, contact);
        let written = std::fs::write(&partial, text).and_then(|()| std::fs::rename(&partial, &self.path));
        match written {
            Ok(()) => self.written = Some(contact),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot keep the last contact for the next agent process")
            }
        }
    }
}

/// The file of the last contact, for this process's confirmations; the
/// fenced attempts the supervisor re-adopted (`leases`) are held from the
/// one the previous process of this boot kept there.
pub(super) fn fence_adopted(
    core: &mut Core,
    leases: &[(String, u32, Duration)],
    config: &Config,
) -> ContactFile {
    let contact = ContactFile::new(&config.supervisor.runtime_dir(), crate::supervisor::boot_id());
    if !leases.is_empty() {
        let last = contact.load();
        tracing::info!(tasks = leases.len(), last_contact_ago = ?last.map(|c| boot_clock().saturating_sub(c)), "fencing the re-adopted attempts from the previous process's last contact");
        core.adopted(leases, last, now());
    }
    contact
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contact_reads_back_in_the_same_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = ContactFile::new(dir.path(), "boot-a".to_owned());
        assert_eq!(file.load(), None, "nothing written yet");
        file.save(Duration::from_millis(1500));
        assert_eq!(file.load(), Some(Duration::from_millis(1500)));
        let next_boot = ContactFile::new(dir.path(), "boot-b".to_owned());
        assert_eq!(next_boot.load(), None, "another boot's clock means nothing");
        std::fs::write(dir.path().join(FILE_NAME), "garbage").unwrap();
        assert_eq!(file.load(), None);
    }
}
