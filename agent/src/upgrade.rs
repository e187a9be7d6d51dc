//! Upgrades of the agent itself, on the robot: a new binary is verified
//! (digest, a signature against a key the robot pins, its architecture,
//! its own `--version`), staged in a slot beside the running one, switched
//! to by rename and put on trial ([`prepare`]); a binary already known
//! good rolls it back when it keeps exiting ([`slots::Slots::boot_check`],
//! the unit's `ExecStartPre`), and the new agent rolls itself back when the
//! cluster has not confirmed it by its health timeout ([`Upgrades`]).

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub mod prepare;
pub mod slots;
pub mod verify;

use k8s4r_api::protocol::{UpgradeOrder, UpgradeReport};
use k8s4r_api::RobotUpgradePhase;
use slots::{Outcome, Slots, Trial};
use tokio_util::sync::CancellationToken;
use verify::Trust;

/// This process's view of upgrades: whether it is the binary on trial,
/// and the last upgrade's outcome waiting to be reported.
#[derive(Debug)]
pub struct Upgrades {
    slots: Slots,
    trust: Trust,
    /// The trial this very binary is on.
    trial: Option<Trial>,
    outcome: Option<Outcome>,
    /// The upgrade this process is preparing, or how its preparation
    /// failed (until reported).
    progress: Option<UpgradeReport>,
    /// The heartbeat that carried the final word, whose confirmation
    /// means the cluster has it.
    final_in: Option<u64>,
}

impl Upgrades {
    /// Reads the slots under `state_dir` at start.
    pub fn at_start(state_dir: &Path, trust: Trust) -> Self {
        let slots = Slots::new(state_dir);
        let trial = slots.trial().filter(|t| is_this_binary(&t.to));
        if let Some(t) = &trial {
            tracing::info!(
                from = %t.from_version,
                to = %t.to_version,
                rollout = %t.rollout,
                "this agent is on trial after an upgrade: the cluster must confirm it within {}",
                k8s4r_api::duration::format_duration(Duration::from_millis(t.health_timeout_ms))
            );
        }
        if trial.is_some() {
            failpoint("trial-start");
        }
        let outcome = slots.outcome();
        Upgrades {
            slots,
            trust,
            trial,
            outcome,
            progress: None,
            final_in: None,
        }
    }

    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// When this binary's trial runs out, if it is on one.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.trial
            .as_ref()
            .map(|t| UNIX_EPOCH + Duration::from_millis(t.switched_ms.saturating_add(t.health_timeout_ms)))
    }

    /// The cluster confirmed this agent (a heartbeat of this process came
    /// back confirmed): a binary on trial becomes the confirmed one.
    pub fn confirmed(&mut self) {
        if self.trial.take().is_none() {
            return;
        }
        match self.slots.confirm(SystemTime::now()) {
            Ok(Some(outcome)) => {
                tracing::info!(version = %outcome.version, "the upgrade is confirmed healthy");
                self.outcome = Some(outcome);
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "cannot record the upgrade as confirmed"),
        }
    }

    /// The trial ran out unconfirmed: switches back to the confirmed
    /// binary. The caller then stops the agent so that it is restarted.
    pub fn give_up(&mut self) -> Option<String> {
        let trial = self.trial.take()?;
        let why = slots::overdue_reason(&trial);
        match self.slots.roll_back(&trial, why.clone(), SystemTime::now()) {
            Ok(outcome) => self.outcome = Some(outcome),
            Err(e) => tracing::error!(error = %e, "cannot switch back to the confirmed agent"),
        }
        Some(format!(
            "upgrade to {} rolled back: {why}; the agent exits so that the confirmed binary starts",
            trial.to_version
        ))
    }

    /// The last upgrade's outcome, until it was reported.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// What registrations and heartbeats say about upgrades: the one under
    /// way (or refused), else the last one's outcome, else nothing.
    pub fn report(&self) -> Option<UpgradeReport> {
        if let Some(progress) = &self.progress {
            return Some(progress.clone());
        }
        if let Some(t) = &self.trial {
            return Some(UpgradeReport {
                rollout: t.rollout.clone(),
                version: t.to_version.clone(),
                phase: RobotUpgradePhase::Restarting,
                reason: None,
            });
        }
        self.outcome.as_ref().map(|o| UpgradeReport {
            rollout: o.rollout.clone(),
            version: o.version.clone(),
            phase: if o.healthy {
                RobotUpgradePhase::Healthy
            } else {
                RobotUpgradePhase::RolledBack
            },
            reason: o.reason.clone(),
        })
    }

    /// Heartbeat `seq` went out with [`Upgrades::report`]: when that was a
    /// final word, its confirmation means the cluster has it.
    pub fn heartbeat_sent(&mut self, seq: u64) {
        let last_word = self.report().is_some_and(|r| {
            matches!(
                r.phase,
                RobotUpgradePhase::Healthy
                    | RobotUpgradePhase::RolledBack
                    | RobotUpgradePhase::Failed
                    | RobotUpgradePhase::Pending
            )
        });
        if last_word && self.final_in.is_none() {
            self.final_in = Some(seq);
        }
    }

    /// Heartbeat `seq` was confirmed.
    pub fn heartbeat_confirmed(&mut self, seq: u64) {
        self.confirmed();
        if self.final_in.is_some_and(|carried| carried <= seq) {
            self.final_in = None;
            self.reported();
        }
    }

    /// The cluster has the outcome (or the refusal).
    fn reported(&mut self) {
        // A refusal, or an order put off (the robot no longer met the
        // rollout's conditions at the switch): the next order is taken.
        if matches!(&self.progress, Some(p) if matches!(p.phase, RobotUpgradePhase::Failed | RobotUpgradePhase::Pending))
        {
            self.progress = None;
            return;
        }
        if self.outcome.take().is_some() {
            if let Err(e) = self.slots.reported() {
                tracing::warn!(error = %e, "cannot clear the reported upgrade outcome");
            }
        }
    }

    /// Whether `order` needs work: not when this agent already runs its
    /// version, nor while an upgrade is prepared or on trial, nor when the
    /// same order was just refused and the cluster has not heard it yet.
    fn takes(&mut self, order: &UpgradeOrder) -> bool {
        if order.version == crate::version() {
            if self.trial.is_none() && self.progress.is_none() && self.outcome.is_none() {
                // Already there (a re-sent order after the restart, or a
                // robot installed by hand): say so once.
                self.outcome = Some(Outcome {
                    rollout: order.rollout.clone(),
                    version: order.version.clone(),
                    healthy: true,
                    reason: None,
                    at_ms: slots::millis(SystemTime::now()),
                });
            }
            return false;
        }
        self.trial.is_none() && self.progress.is_none()
    }

    fn step(&mut self, order: &UpgradeOrder, phase: RobotUpgradePhase, reason: Option<String>) {
        self.final_in = None;
        self.progress = Some(UpgradeReport {
            rollout: order.rollout.clone(),
            version: order.version.clone(),
            phase,
            reason,
        });
    }
}

/// Starts preparing `order` when it needs work: downloads, verifies and
/// stages the new binary and switches to it, each step told to the
/// cluster (`news` sends a heartbeat at once); then `restart` stops this
/// agent so that systemd starts the new one. A refusal is reported as
/// `Failed` with its reason and switches nothing.
pub fn start(
    upgrades: &Arc<Mutex<Upgrades>>,
    order: UpgradeOrder,
    limits: crate::supervisor::artifacts::Limits,
    news: Arc<tokio::sync::Notify>,
    restart: CancellationToken,
    facts: Option<tokio::sync::watch::Receiver<crate::facts::FactsNow>>,
) {
    let (slots, trust) = {
        let mut u = lock(upgrades);
        if !u.takes(&order) {
            news.notify_one();
            return;
        }
        u.step(&order, RobotUpgradePhase::Downloading, None);
        (u.slots.clone(), u.trust.clone())
    };
    news.notify_one();
    tracing::info!(rollout = %order.rollout, version = %order.version, url = %order.url, "upgrading the agent");
    let upgrades = Arc::clone(upgrades);
    tokio::spawn(async move {
        let prepared = prepare::Order {
            rollout: order.rollout.clone(),
            version: order.version.clone(),
            url: order.url.clone(),
            sha256: order.sha256.clone(),
            signature: order.signature.clone(),
            health_timeout: Duration::from_millis(order.health_timeout_ms),
        };
        let client = match crate::supervisor::artifacts::client() {
            Ok(client) => client,
            Err(e) => {
                lock(&upgrades).step(&order, RobotUpgradePhase::Failed, Some(e));
                news.notify_one();
                return;
            }
        };
        let tell = |step: prepare::Step| {
            let phase = match step {
                prepare::Step::Downloading => RobotUpgradePhase::Downloading,
                prepare::Step::Staged => RobotUpgradePhase::Staged,
                prepare::Step::Restarting => RobotUpgradePhase::Restarting,
            };
            lock(&upgrades).step(&order, phase, None);
            news.notify_one();
        };
        let when = order.when.clone();
        let may_switch = move || may_switch(&when, facts.as_ref());
        match prepare::prepare(&prepared, &slots, &trust, &client, limits, tell, may_switch).await {
            Ok(_) => {
                tracing::info!(version = %order.version, "the new agent is staged and switched to: restarting");
                restart.cancel();
            }
            Err(why) if why.starts_with(NOT_SWITCHED) => {
                tracing::warn!(version = %order.version, "upgrade put off: {why}");
                lock(&upgrades).step(&order, RobotUpgradePhase::Pending, Some(why));
                news.notify_one();
            }
            Err(why) => {
                tracing::error!(version = %order.version, "upgrade refused: {why}");
                lock(&upgrades).step(&order, RobotUpgradePhase::Failed, Some(why));
                news.notify_one();
            }
        }
    });
}

/// How an upgrade put off at the switch starts its reason.
pub const NOT_SWITCHED: &str = "not switched:";

/// Whether the robot may switch now: the rollout's conditions (`when`) on
/// its facts hold, as the agent reads them right now (not as the cluster
/// last heard them). `Err` says which does not, starting with
/// [`NOT_SWITCHED`].
pub fn may_switch(
    when: &[k8s4r_api::facts::FactRequirement],
    facts: Option<&tokio::sync::watch::Receiver<crate::facts::FactsNow>>,
) -> Result<(), String> {
    if when.is_empty() {
        return Ok(());
    }
    let now = facts.map(|rx| rx.borrow().facts.clone()).unwrap_or_default();
    match k8s4r_api::facts::unmet(when, &now) {
        None => Ok(()),
        Some(condition) => Err(format!(
            "{NOT_SWITCHED} {condition} no longer holds on the robot ({})",
            now.get(&condition.key).map_or_else(
                || format!("{} <none>", condition.key),
                |v| format!("{} {v}", condition.key)
            )
        )),
    }
}

/// A binary on trial that the cluster has not confirmed by its deadline
/// switches back to the confirmed one and stops the agent with a failure:
/// systemd starts the confirmed binary, which reports the rollback. A
/// binary that never connects is rolled back this way; one that cannot
/// even start, by the unit's boot check.
pub async fn watch_trial(
    upgrades: Arc<Mutex<Upgrades>>,
    stop: CancellationToken,
    failure: Arc<OnceLock<String>>,
) {
    let Some(deadline) = lock(&upgrades).deadline() else {
        return;
    };
    let left = deadline
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::select! {
        () = tokio::time::sleep(left) => {}
        () = stop.cancelled() => return,
    }
    let Some(why) = lock(&upgrades).give_up() else {
        return; // confirmed meanwhile
    };
    tracing::error!("{why}");
    let _ = failure.set(why);
    stop.cancel();
}

/// The variable that names a failpoint, `STEP:MARKER`.
pub const FAILPOINT_VARIABLE: &str = "K8S4R_UPGRADE_FAILPOINT";

/// Fault injection for the upgrade tests: with `K8S4R_UPGRADE_FAILPOINT`
/// set to `STEP:MARKER`, the agent SIGKILLs itself on reaching STEP
/// (`downloaded`, `staged`, `switched`, `trial-start`), standing for a
/// power cut there. Once: the marker file is created first, and a marker
/// that exists disarms it.
pub(crate) fn failpoint(step: &str) {
    let Ok(value) = std::env::var(FAILPOINT_VARIABLE) else {
        return;
    };
    let Some((at, marker)) = value.split_once(':') else {
        return;
    };
    if at != step {
        return;
    }
    let armed = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(marker)
        .is_ok();
    if armed {
        tracing::warn!(step, "upgrade failpoint reached: SIGKILL");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// The upgrades' lock; a panic while holding it leaves them usable.
pub(crate) fn lock(upgrades: &Mutex<Upgrades>) -> std::sync::MutexGuard<'_, Upgrades> {
    upgrades.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `path` is the binary this process runs (both resolved).
fn is_this_binary(path: &Path) -> bool {
    let this = std::env::current_exe().and_then(std::fs::canonicalize);
    let that = std::fs::canonicalize(path);
    matches!((this, that), (Ok(a), Ok(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_waits_for_the_rollouts_conditions_as_the_robot_sees_them_now() {
        let when: Vec<k8s4r_api::facts::FactRequirement> = serde_json::from_value(serde_json::json!([
            {"key": "docked", "operator": "In", "values": ["true"]}
        ]))
        .unwrap();
        assert_eq!(may_switch(&[], None), Ok(()), "no conditions: always");
        let now = |docked: Option<bool>| {
            let mut facts = k8s4r_api::facts::Facts::new();
            if let Some(d) = docked {
                facts.insert("docked".into(), serde_json::from_value(d.into()).unwrap());
            }
            tokio::sync::watch::channel(crate::facts::FactsNow {
                read: true,
                facts,
                error: None,
            })
            .1
        };
        assert_eq!(may_switch(&when, Some(&now(Some(true)))), Ok(()));
        let undocked = may_switch(&when, Some(&now(Some(false)))).unwrap_err();
        assert!(undocked.starts_with(NOT_SWITCHED), "{undocked}");
        assert!(
            undocked.contains("docked In [true] no longer holds on the robot (docked false)"),
            "{undocked}"
        );
        assert!(may_switch(&when, Some(&now(None)))
            .unwrap_err()
            .contains("docked <none>"));
        assert!(
            may_switch(&when, None).is_err(),
            "a robot without facts meets none"
        );
    }

    /// A robot whose old agent is confirmed and which switched to this
    /// very test binary on trial.
    fn on_trial(timeout_ms: u64) -> (tempfile::TempDir, Slots, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let slots = Slots::new(dir.path());
        let placeholder = dir.path().join("old");
        std::fs::write(&placeholder, b"old").unwrap();
        let old = slots.install("1.0.0", &placeholder).unwrap();
        let this = std::env::current_exe().unwrap();
        slots
            .switch(&Trial {
                rollout: "r".into(),
                from_version: "1.0.0".into(),
                to_version: "2.0.0".into(),
                from: old.clone(),
                to: this,
                switched_ms: slots::millis(SystemTime::now()),
                health_timeout_ms: timeout_ms,
                starts: 1,
            })
            .unwrap();
        (dir, slots, old)
    }

    #[test]
    fn the_binary_on_trial_is_confirmed_by_the_cluster() {
        let (dir, slots, _) = on_trial(60_000);
        let mut upgrades = Upgrades::at_start(dir.path(), Trust::Nothing);
        assert!(upgrades.deadline().is_some_and(|d| d > SystemTime::now()));
        upgrades.confirmed();
        assert_eq!(upgrades.deadline(), None);
        assert_eq!(slots.confirmed(), Some(std::env::current_exe().unwrap()));
        assert!(upgrades
            .outcome()
            .is_some_and(|o| o.healthy && o.version == "2.0.0"));
        upgrades.reported();
        assert_eq!(Upgrades::at_start(dir.path(), Trust::Nothing).outcome(), None);
    }

    #[test]
    fn an_unconfirmed_binary_gives_up_and_switches_back() {
        let (dir, slots, old) = on_trial(0);
        let mut upgrades = Upgrades::at_start(dir.path(), Trust::Nothing);
        let why = upgrades.give_up().unwrap();
        assert!(
            why.contains("did not confirm it within its health timeout"),
            "{why}"
        );
        assert_eq!(slots.current(), Some(old));
        assert!(upgrades.outcome().is_some_and(|o| !o.healthy));
        assert_eq!(upgrades.give_up(), None, "once");
    }

    #[test]
    fn another_binary_on_trial_is_not_this_process_s_business() {
        let (dir, slots, old) = on_trial(60_000);
        slots
            .switch(&Trial {
                to: old,
                ..slots.trial().unwrap()
            })
            .unwrap();
        assert_eq!(Upgrades::at_start(dir.path(), Trust::Nothing).deadline(), None);
    }
}
