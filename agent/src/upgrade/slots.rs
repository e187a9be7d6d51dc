//! The agent's binaries on the robot, A/B: every version staged in a slot
//! of its own, `current` (what systemd starts) and `confirmed` (the last
//! binary the cluster confirmed healthy) as symbolic links switched by
//! rename, and a trial record while a new binary has yet to prove itself.
//!
//! ```text
//! <state>/agent/slots/<version>/k8s4r-agent
//! <state>/agent/current    -> slots/<new>/k8s4r-agent
//! <state>/agent/confirmed  -> slots/<old>/k8s4r-agent
//! <state>/agent/trial.json  while <new> is on trial
//! <state>/agent/outcome.json  how the last upgrade ended
//! ```
//!
//! The unit starts `current` and, before each start, runs `confirmed
//! --boot-check`: a binary already known good counts the new one's starts
//! and switches back when it keeps exiting or was not confirmed within
//! its health timeout, even when the new binary cannot run a line of its
//! own. Every step is a rename of a fully written, synced file, so a power
//! cut leaves either binary in `current`, and the trial record says which
//! case it is.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Starts of a binary on trial after which it is given up on: it exits at
/// start (or the robot keeps losing power) and would never confirm.
pub const MAX_TRIAL_STARTS: u32 = 3;

const CURRENT: &str = "current";
const CONFIRMED: &str = "confirmed";
const TRIAL: &str = "trial.json";
const OUTCOME: &str = "outcome.json";
const BINARY: &str = "k8s4r-agent";

/// A new binary on trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trial {
    /// The rollout that asked for it.
    pub rollout: String,
    pub from_version: String,
    pub to_version: String,
    /// The binaries (slot paths) it switched from and to.
    pub from: PathBuf,
    pub to: PathBuf,
    /// When the switch was made (wall clock, ms since the epoch: a trial
    /// may span a reboot).
    pub switched_ms: u64,
    pub health_timeout_ms: u64,
    /// Starts counted by the boot check so far.
    pub starts: u32,
}

/// How an upgrade ended, kept until the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub rollout: String,
    pub version: String,
    pub healthy: bool,
    /// Why it was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: u64,
}

/// What the boot check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootCheck {
    /// No upgrade under way.
    Settled,
    /// The new binary starts again, still on trial.
    OnTrial(Trial),
    /// The switch back to the confirmed binary was made.
    RolledBack(Outcome),
}

/// The agent's binaries under one state directory.
#[derive(Debug, Clone)]
pub struct Slots {
    dir: PathBuf,
}

impl Slots {
    pub fn new(state_dir: &Path) -> Self {
        Slots {
            dir: state_dir.join("agent"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binary `current` points at.
    pub fn current(&self) -> Option<PathBuf> {
        self.target(CURRENT)
    }

    /// The binary `confirmed` points at.
    pub fn confirmed(&self) -> Option<PathBuf> {
        self.target(CONFIRMED)
    }

    fn target(&self, link: &str) -> Option<PathBuf> {
        let target = std::fs::read_link(self.dir.join(link)).ok()?;
        Some(if target.is_absolute() {
            target
        } else {
            self.dir.join(target)
        })
    }

    /// The slot path of `version`'s binary.
    pub fn slot(&self, version: &str) -> PathBuf {
        self.dir.join("slots").join(version).join(BINARY)
    }

    /// Makes `binary` the first confirmed and current one (the install by
    /// hand).
    pub fn install(&self, version: &str, binary: &Path) -> std::io::Result<PathBuf> {
        let slot = self.stage(version, binary)?;
        self.link(CONFIRMED, &slot)?;
        self.link(CURRENT, &slot)?;
        Ok(slot)
    }

    /// Copies a verified binary into `version`'s slot: written beside it,
    /// synced, made executable by root only, then renamed into place.
    /// `version` must be a plain name (it was checked against the binary's
    /// own `--version`).
    pub fn stage(&self, version: &str, binary: &Path) -> std::io::Result<PathBuf> {
        check_version_name(version)?;
        let slot = self.slot(version);
        let parent = slot.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent)?;
        let staging = parent.join(format!(".{BINARY}.staging"));
        let _ = std::fs::remove_file(&staging);
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o700)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&staging)?;
            let mut input = std::fs::File::open(binary)?;
            std::io::copy(&mut input, &mut out)?;
            out.sync_all()?;
        }
        std::fs::rename(&staging, &slot)?;
        sync_dir(parent)?;
        Ok(slot)
    }

    /// Switches `current` to `trial.to`, the trial recorded first: a power
    /// cut between the two leaves the old binary current and a trial whose
    /// `to` is not current, which the boot check clears.
    pub fn switch(&self, trial: &Trial) -> std::io::Result<()> {
        self.write(TRIAL, trial)?;
        self.link(CURRENT, &trial.to)
    }

    /// The trial under way, if any.
    pub fn trial(&self) -> Option<Trial> {
        read(&self.dir.join(TRIAL))
    }

    /// The last upgrade's outcome, until [`Slots::reported`].
    pub fn outcome(&self) -> Option<Outcome> {
        read(&self.dir.join(OUTCOME))
    }

    /// The outcome reached the cluster.
    pub fn reported(&self) -> std::io::Result<()> {
        remove(&self.dir.join(OUTCOME))
    }

    /// Run before every start by the confirmed binary (`--boot-check`).
    pub fn boot_check(&self, now: SystemTime) -> std::io::Result<BootCheck> {
        let Some(mut trial) = self.trial() else {
            return Ok(BootCheck::Settled);
        };
        if self.current().as_deref() != Some(trial.to.as_path()) {
            // The switch never happened (a power cut before the rename):
            // the old binary is current, nothing to undo.
            let outcome = self.end(&trial, Some("the switch to it did not complete".to_owned()), now)?;
            return Ok(BootCheck::RolledBack(outcome));
        }
        if trial.starts >= MAX_TRIAL_STARTS {
            let why = format!("it exited {} times before the cluster confirmed it", trial.starts);
            return self.roll_back(&trial, why, now).map(BootCheck::RolledBack);
        }
        if let Some(why) = overdue(&trial, now) {
            return self.roll_back(&trial, why, now).map(BootCheck::RolledBack);
        }
        trial.starts += 1;
        self.write(TRIAL, &trial)?;
        Ok(BootCheck::OnTrial(trial))
    }

    /// The running agent's own check while on trial: the reason to roll
    /// back when its health timeout has passed unconfirmed.
    pub fn overdue(&self, now: SystemTime) -> Option<String> {
        self.trial().and_then(|t| overdue(&t, now))
    }

    /// The cluster confirmed the running binary: it becomes the confirmed
    /// one and the trial ends healthy.
    pub fn confirm(&self, now: SystemTime) -> std::io::Result<Option<Outcome>> {
        let Some(trial) = self.trial() else {
            return Ok(None);
        };
        if self.current().as_deref() != Some(trial.to.as_path()) {
            return Ok(None);
        }
        self.link(CONFIRMED, &trial.to)?;
        let outcome = self.end(&trial, None, now)?;
        // The binary it came from is no longer the way back: its slot, and
        // any other left behind, would only fill the robot's disk upgrade
        // after upgrade.
        match self.prune() {
            Ok(0) => {}
            Ok(removed) => tracing::info!(
                removed,
                "removed the agent binaries no longer current or confirmed"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove old agent binaries; they stay until the next upgrade")
            }
        }
        Ok(Some(outcome))
    }

    /// Removes every slot but those of `current` and `confirmed`; how many.
    pub fn prune(&self) -> std::io::Result<usize> {
        let keep: Vec<PathBuf> = [self.current(), self.confirmed()]
            .into_iter()
            .flatten()
            .filter_map(|binary| binary.parent().map(Path::to_path_buf))
            .collect();
        if keep.is_empty() {
            // Never leave a robot without the binary its unit starts.
            return Ok(0);
        }
        let mut removed = 0;
        let entries = match std::fs::read_dir(self.dir.join("slots")) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let path = entry?.path();
            if !keep.contains(&path) {
                std::fs::remove_dir_all(&path)?;
                removed += 1;
            }
        }
        sync_dir(&self.dir.join("slots"))?;
        Ok(removed)
    }

    /// Switches `current` back to the binary the trial came from.
    pub fn roll_back(&self, trial: &Trial, why: String, now: SystemTime) -> std::io::Result<Outcome> {
        let back = self.confirmed().unwrap_or_else(|| trial.from.clone());
        self.link(CURRENT, &back)?;
        self.end(trial, Some(why), now)
    }

    /// Records the outcome, then clears the trial (in that order: a power
    /// cut between them repeats the end, never loses it).
    fn end(&self, trial: &Trial, rolled_back: Option<String>, now: SystemTime) -> std::io::Result<Outcome> {
        let outcome = Outcome {
            rollout: trial.rollout.clone(),
            version: trial.to_version.clone(),
            healthy: rolled_back.is_none(),
            reason: rolled_back,
            at_ms: millis(now),
        };
        self.write(OUTCOME, &outcome)?;
        remove(&self.dir.join(TRIAL))?;
        Ok(outcome)
    }

    /// Points `name` at `target` by renaming a new link over it.
    fn link(&self, name: &str, target: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{name}.new"));
        let _ = std::fs::remove_file(&tmp);
        let relative = target.strip_prefix(&self.dir).unwrap_or(target);
        std::os::unix::fs::symlink(relative, &tmp)?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        sync_dir(&self.dir)
    }

    fn write<T: Serialize>(&self, name: &str, value: &T) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{name}.new"));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec(value).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        sync_dir(&self.dir)
    }
}

/// Why a trial is over when its health timeout passed unconfirmed. A
/// clock that moved back before the switch counts from the switch.
fn overdue(trial: &Trial, now: SystemTime) -> Option<String> {
    let elapsed = millis(now).saturating_sub(trial.switched_ms);
    (elapsed > trial.health_timeout_ms).then(|| overdue_reason(trial))
}

/// What a rollback for lack of confirmation says.
pub fn overdue_reason(trial: &Trial) -> String {
    format!(
        "the cluster did not confirm it within its health timeout of {}",
        k8s4r_api::duration::format_duration(Duration::from_millis(trial.health_timeout_ms))
    )
}

/// A version names a directory: letters, digits, `.`, `-`, `+` and `_`,
/// not starting with a dot.
fn check_version_name(version: &str) -> std::io::Result<()> {
    let plain = !version.is_empty()
        && version.len() <= 64
        && !version.starts_with('.')
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'_'));
    if plain {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{version}` is not a version this agent stages"),
        ))
    }
}

pub fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "unreadable upgrade record ignored");
            None
        }
    }
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => path.parent().map_or(Ok(()), sync_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn installed() -> (tempfile::TempDir, Slots, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let slots = Slots::new(dir.path());
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        std::fs::write(&old, b"old binary").unwrap();
        std::fs::write(&new, b"new binary").unwrap();
        let old_slot = slots.install("1.0.0", &old).unwrap();
        let new_slot = slots.stage("2.0.0", &new).unwrap();
        (dir, slots, old_slot, new_slot)
    }

    fn trial(slots: &Slots, from: &Path, to: &Path, at: SystemTime) -> Trial {
        let trial = Trial {
            rollout: "r".into(),
            from_version: "1.0.0".into(),
            to_version: "2.0.0".into(),
            from: from.to_owned(),
            to: to.to_owned(),
            switched_ms: millis(at),
            health_timeout_ms: 60_000,
            starts: 0,
        };
        slots.switch(&trial).unwrap();
        trial
    }

    #[test]
    fn a_confirmed_upgrade_becomes_the_confirmed_binary() {
        let (_d, slots, old, new) = installed();
        assert_eq!(
            (slots.current(), slots.confirmed()),
            (Some(old.clone()), Some(old.clone()))
        );
        assert_eq!(std::fs::read(&new).unwrap(), b"new binary");
        trial(&slots, &old, &new, t(0));
        assert_eq!(slots.current(), Some(new.clone()));
        assert!(matches!(slots.boot_check(t(1)).unwrap(), BootCheck::OnTrial(t) if t.starts == 1));
        let outcome = slots.confirm(t(20)).unwrap().unwrap();
        assert!(outcome.healthy && outcome.version == "2.0.0");
        assert_eq!(
            (slots.current(), slots.confirmed()),
            (Some(new.clone()), Some(new))
        );
        assert_eq!(slots.boot_check(t(30)).unwrap(), BootCheck::Settled);
        assert!(
            !old.exists(),
            "the old binary's slot is removed once the new one is confirmed"
        );
        assert!(slots.current().is_some_and(|b| b.exists()));
        assert_eq!(slots.outcome(), Some(outcome));
        slots.reported().unwrap();
        assert_eq!(slots.outcome(), None);
    }

    #[test]
    fn a_binary_that_keeps_exiting_is_rolled_back_at_its_fourth_start() {
        let (_d, slots, old, new) = installed();
        trial(&slots, &old, &new, t(0));
        for start in 1..=MAX_TRIAL_STARTS {
            assert!(
                matches!(slots.boot_check(t(u64::from(start))).unwrap(), BootCheck::OnTrial(t) if t.starts == start)
            );
        }
        let BootCheck::RolledBack(outcome) = slots.boot_check(t(5)).unwrap() else {
            panic!("not rolled back");
        };
        assert!(!outcome.healthy);
        assert!(outcome.reason.unwrap().contains("exited 3 times"));
        assert_eq!(
            (slots.current(), slots.confirmed()),
            (Some(old.clone()), Some(old))
        );
        assert_eq!(slots.trial(), None);
    }

    #[test]
    fn an_unconfirmed_binary_is_rolled_back_after_its_health_timeout() {
        let (_d, slots, old, new) = installed();
        trial(&slots, &old, &new, t(0));
        assert_eq!(slots.overdue(t(59)), None);
        assert!(slots
            .overdue(t(61))
            .unwrap()
            .contains("within its health timeout of 1m"));
        // The next start (the agent exits to be restarted) switches back.
        assert!(matches!(slots.boot_check(t(61)).unwrap(), BootCheck::RolledBack(o) if !o.healthy));
        assert_eq!(slots.current(), Some(old));
        // A late confirmation of the binary no longer current changes nothing.
        assert_eq!(slots.confirm(t(62)).unwrap(), None);
    }

    #[test]
    fn a_power_cut_between_the_record_and_the_switch_leaves_the_old_binary() {
        let (_d, slots, old, new) = installed();
        let record = Trial {
            rollout: "r".into(),
            from_version: "1.0.0".into(),
            to_version: "2.0.0".into(),
            from: old.clone(),
            to: new,
            switched_ms: millis(t(0)),
            health_timeout_ms: 60_000,
            starts: 0,
        };
        slots.write(TRIAL, &record).unwrap();
        let check = slots.boot_check(t(1)).unwrap();
        assert!(
            matches!(check, BootCheck::RolledBack(o) if o.reason.as_deref().unwrap().contains("did not complete"))
        );
        assert_eq!(slots.current(), Some(old));
    }

    #[test]
    fn versions_that_are_not_plain_names_are_not_staged() {
        let (d, slots, _, _) = installed();
        let binary = d.path().join("new");
        for bad in ["", "../../etc", ".hidden", "a/b", "1.0 beta"] {
            assert!(slots.stage(bad, &binary).is_err(), "{bad:?}");
        }
    }
}
