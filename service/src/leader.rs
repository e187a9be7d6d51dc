//! Leader election on a Lease, with `kube-lease-manager`.
//!
//! A replica campaigns for a named Lease; it leads while it holds it and
//! renews it `renew_grace_seconds` before it would expire. A replica that
//! restarts under the same identity finds itself the holder and leads again
//! at once instead of waiting the Lease out. Resigning releases the Lease,
//! so a follower takes over without waiting for it to expire.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which Lease, for whom, and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity (the Lease holder).
    pub identity: String,
    /// How long a held Lease lasts without renewal, in seconds.
    pub lease_seconds: u64,
    /// How long before expiry the holder renews it, in seconds.
    pub renew_grace_seconds: u64,
}

impl LeaderConfig {
    /// The Lease `lease_name` for `identity`: held 15 s, renewed 5 s early.
    pub fn new(lease_name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_seconds: 15,
            renew_grace_seconds: 5,
        }
    }

    /// How long a follower may have to wait for a lost leader.
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }
}

/// Why a campaign failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The Lease could not be read or written.
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    /// The campaign ended without an error of its own.
    #[error("leader election stopped")]
    Stopped,
}

/// A running campaign for one Lease.
pub struct Election {
    leading: watch::Receiver<bool>,
    /// `None` once awaited.
    campaign: Option<JoinHandle<kube_lease_manager::Result<LeaseManager>>>,
}

impl Election {
    /// Starts campaigning for `config`'s Lease in `namespace`, writing it as
    /// `field_manager`.
    pub async fn start(
        client: Client,
        namespace: &str,
        config: &LeaderConfig,
        field_manager: &str,
    ) -> Result<Self, LeaderError> {
        let manager = LeaseManagerBuilder::new(client, &config.lease_name)
            .with_namespace(namespace)
            .with_identity(&config.identity)
            .with_duration(config.lease_seconds)
            .with_grace(config.renew_grace_seconds)
            .with_field_manager(field_manager)
            .build()
            .await?;
        let (leading, campaign) = manager.watch().await;
        Ok(Self {
            leading,
            campaign: Some(campaign),
        })
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Waits for leadership to change and returns the new state; fails
    /// when the campaign has ended (then this replica does not lead).
    pub async fn changed(&mut self) -> Result<bool, LeaderError> {
        match self.leading.changed().await {
            Ok(()) => Ok(*self.leading.borrow_and_update()),
            Err(_) => Err(self.ended().await),
        }
    }

    /// Stops campaigning, releasing the Lease if this replica holds it.
    pub async fn resign(self) -> Result<(), LeaderError> {
        // The campaign releases the Lease once nobody listens.
        drop(self.leading);
        match self.campaign {
            Some(campaign) => match campaign.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(LeaderError::Lease(e)),
                Err(_) => Err(LeaderError::Stopped),
            },
            None => Ok(()),
        }
    }

    async fn ended(&mut self) -> LeaderError {
        match self.campaign.take() {
            Some(campaign) => match campaign.await {
                Ok(Err(e)) => LeaderError::Lease(e),
                _ => LeaderError::Stopped,
            },
            None => LeaderError::Stopped,
        }
    }
}
