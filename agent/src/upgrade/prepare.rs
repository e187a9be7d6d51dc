//! Preparing an upgrade: the new binary downloaded into the state
//! directory, verified, asked its version, staged in its slot, and
//! switched to on trial. Nothing is switched until every check passed;
//! the caller then stops this agent so that systemd starts the new one.

use std::path::Path;
use std::time::{Duration, SystemTime};

use k8s4r_api::Artifact;

use super::slots::{millis, Slots, Trial};
use super::verify::{self, Expected, Trust};
use crate::supervisor::artifacts::{fetch_with_retries, Limits};

/// How long the new binary has to answer `--version`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a rollout asks this robot to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub rollout: String,
    pub version: String,
    pub url: String,
    pub sha256: String,
    /// The minisign signature file's text.
    pub signature: Option<String>,
    /// How long the new binary has, from the switch, to be confirmed by
    /// the cluster before it is rolled back.
    pub health_timeout: Duration,
}

/// Where an upgrade is, as the robot reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Downloading,
    Staged,
    Restarting,
}

/// Downloads, verifies and stages `order`'s binary and switches to it on
/// trial; `step` hears of each step. An error says why nothing was
/// switched.
pub async fn prepare(
    order: &Order,
    slots: &Slots,
    trust: &Trust,
    client: &reqwest::Client,
    limits: Limits,
    step: impl Fn(Step),
    may_switch: impl Fn() -> Result<(), String>,
) -> Result<Trial, String> {
    let Some(from) = slots.current() else {
        return Err(format!(
            "this agent was not installed in upgrade slots ({} has no `current` link): \
             install it once with systemd/install.sh",
            slots.dir().display()
        ));
    };
    if let Some(trial) = slots.trial() {
        return Err(format!("the upgrade to {} is still on trial", trial.to_version));
    }
    let downloads = slots.dir().join("downloads");
    std::fs::create_dir_all(&downloads).map_err(|e| format!("cannot create {}: {e}", downloads.display()))?;
    let download = downloads.join(format!("{}.partial", order.version.replace('/', "_")));
    let _ = std::fs::remove_file(&download);
    step(Step::Downloading);
    let artifact = Artifact {
        url: order.url.clone(),
        destination: "k8s4r-agent".into(),
        sha256: order.sha256.clone(),
    };
    fetch_with_retries(client, &artifact, &download, limits)
        .await
        .map_err(|e| format!("download from {}: {e}", order.url))?;
    super::failpoint("downloaded");
    let (order, slots_, trust) = (order.clone(), slots.clone(), trust.clone());
    let staged = tokio::task::spawn_blocking(move || {
        let result = check_and_stage(&order, &slots_, &trust, &download);
        let _ = std::fs::remove_file(&download);
        result.map(|to| (order, to))
    })
    .await
    .map_err(|e| format!("the staging task failed: {e}"))??;
    let (order, to) = staged;
    step(Step::Staged);
    super::failpoint("staged");
    let trial = Trial {
        rollout: order.rollout.clone(),
        from_version: crate::version().to_owned(),
        to_version: order.version.clone(),
        from,
        to,
        switched_ms: millis(SystemTime::now()),
        health_timeout_ms: u64::try_from(order.health_timeout.as_millis()).unwrap_or(u64::MAX),
        starts: 0,
    };
    // The robot's state may have changed during the download: it switches
    // only if the rollout's conditions still hold now.
    may_switch()?;
    slots
        .switch(&trial)
        .map_err(|e| format!("cannot switch to the new binary: {e}"))?;
    super::failpoint("switched");
    step(Step::Restarting);
    Ok(trial)
}

/// Blocking: the checks that need the whole file, then its slot.
fn check_and_stage(
    order: &Order,
    slots: &Slots,
    trust: &Trust,
    download: &Path,
) -> Result<std::path::PathBuf, String> {
    let expected = Expected {
        version: &order.version,
        running: crate::version(),
        sha256: &order.sha256,
        signature: order.signature.as_deref(),
    };
    verify::check(download, &expected, trust).map_err(|e| format!("refused: {e}"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(download, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make it executable: {e}"))?;
    }
    verify::probe_version(download, &order.version, PROBE_TIMEOUT).map_err(|e| format!("refused: {e}"))?;
    slots
        .stage(&order.version, download)
        .map_err(|e| format!("cannot stage it: {e}"))
}
