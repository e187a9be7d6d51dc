//! The session's side of upgrades of the agent: the order handed to
//! [`crate::upgrade::start`], a heartbeat at once when an upgrade moves
//! on, and the report registrations and heartbeats carry.

use std::sync::{Arc, Mutex};

use k8s4r_api::protocol::UpgradeReport;
use tokio_util::sync::CancellationToken;

use super::Session;
use crate::upgrade::{lock, Upgrades};

/// What the session needs for upgrades of the agent.
pub(super) struct UpgradeHooks {
    pub(super) upgrades: Arc<Mutex<Upgrades>>,
    /// Rings when an upgrade moved on: a heartbeat says so at once.
    pub(super) news: Arc<tokio::sync::Notify>,
    /// Stops the agent once the new binary is switched to.
    pub(super) restart: CancellationToken,
    pub(super) limits: crate::supervisor::artifacts::Limits,
}

impl UpgradeHooks {
    /// What a registration says of upgrades.
    pub(super) fn report(&self) -> Option<UpgradeReport> {
        lock(&self.upgrades).report()
    }

    /// What heartbeat `seq` says of upgrades (remembered: its confirmation
    /// may settle the final word).
    pub(super) fn report_in_heartbeat(&self, seq: u64) -> Option<UpgradeReport> {
        let mut upgrades = lock(&self.upgrades);
        let report = upgrades.report();
        upgrades.heartbeat_sent(seq);
        report
    }
}

/// Resolves when an upgrade moved on; pending forever without upgrades.
pub(super) async fn news(hooks: Option<&UpgradeHooks>) {
    match hooks {
        Some(h) => h.news.notified().await,
        None => std::future::pending().await,
    }
}

impl Session {
    /// Upgrades of the agent: orders are prepared with downloads within
    /// `limits`, and `restart` is cancelled once the new binary is
    /// switched to.
    pub fn with_upgrades(
        mut self,
        upgrades: Arc<Mutex<Upgrades>>,
        restart: CancellationToken,
        limits: crate::supervisor::artifacts::Limits,
    ) -> Self {
        self.upgrades = Some(UpgradeHooks {
            upgrades,
            news: Arc::default(),
            restart,
            limits,
        });
        self
    }
}
