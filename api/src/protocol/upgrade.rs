//! Agent upgrades on the wire: the server's order (`agent/upgrade`, to one
//! robot) and the robot's account of where its upgrade stands (in its
//! registrations and heartbeats, until a confirmed heartbeat carried the
//! final word).

use serde::{Deserialize, Serialize};

use super::{bound, version, Message, ProtocolError};
use crate::agent_rollout::RobotUpgradePhase;

/// Longest version string.
pub const MAX_VERSION_BYTES: usize = 64;
/// Longest artifact URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Longest signature file (a minisign signature is about 300 bytes).
pub const MAX_SIGNATURE_BYTES: usize = 2048;
/// Longest reason a robot reports (it is written into the Robot's status).
pub const MAX_REASON_BYTES: usize = 1024;
/// Longest rollout name (a Kubernetes object name).
pub const MAX_NAME_BYTES: usize = 253;

/// `agent/upgrade`: run this version of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeOrder {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The AgentRollout that asks.
    pub rollout: String,
    /// The version, as `k8s4r-agent --version` prints it.
    pub version: String,
    /// The binary for this robot's architecture.
    pub url: String,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// Its minisign signature file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// How long the new agent has to be confirmed, in milliseconds.
    pub health_timeout_ms: u64,
    /// The rollout's conditions on the robot's facts: the agent checks
    /// them again just before it switches, and does not switch unless they
    /// hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<crate::facts::FactRequirement>,
}

impl Message for UpgradeOrder {
    const KIND: &'static str = "upgrade order";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        bound(Self::KIND, "rollout", self.rollout.len(), MAX_NAME_BYTES)?;
        bound(Self::KIND, "version", self.version.len(), MAX_VERSION_BYTES)?;
        bound(Self::KIND, "url", self.url.len(), MAX_URL_BYTES)?;
        bound(Self::KIND, "sha256", self.sha256.len(), 64)?;
        bound(Self::KIND, "when", self.when.len(), 16)?;
        for requirement in &self.when {
            bound(Self::KIND, "when.key", requirement.key.len(), 63)?;
            bound(Self::KIND, "when.values", requirement.values.len(), 16)?;
            let longest = requirement.values.iter().map(String::len).max().unwrap_or(0);
            bound(Self::KIND, "when.values[]", longest, 256)?;
        }
        bound(
            Self::KIND,
            "signature",
            self.signature.as_ref().map_or(0, String::len),
            MAX_SIGNATURE_BYTES,
        )
    }
}

/// Where this robot's last upgrade stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeReport {
    pub rollout: String,
    pub version: String,
    pub phase: RobotUpgradePhase,
    /// Why it failed or was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl UpgradeReport {
    /// Refuses fields longer than the protocol allows.
    pub fn check_limits(&self, kind: &'static str) -> Result<(), ProtocolError> {
        bound(kind, "upgrade.rollout", self.rollout.len(), MAX_NAME_BYTES)?;
        bound(kind, "upgrade.version", self.version.len(), MAX_VERSION_BYTES)?;
        bound(
            kind,
            "upgrade.reason",
            self.reason.as_ref().map_or(0, String::len),
            MAX_REASON_BYTES,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode, encode};
    use super::*;

    #[test]
    fn an_order_round_trips_and_oversized_fields_are_refused() {
        let order = UpgradeOrder {
            v: 1,
            rollout: "agent-0-2".into(),
            version: "0.2.0".into(),
            url: "https://files.example/k8s4r-agent-aarch64".into(),
            sha256: "ab".repeat(32),
            signature: Some("untrusted comment: x\nRW...\n".into()),
            health_timeout_ms: 120_000,
            when: serde_json::from_value(
                serde_json::json!([{"key": "docked", "operator": "In", "values": ["true"]}]),
            )
            .unwrap(),
        };
        assert_eq!(decode::<UpgradeOrder>(&encode(&order)).unwrap(), order);
        let long = UpgradeOrder {
            url: "x".repeat(MAX_URL_BYTES + 1),
            ..order
        };
        assert!(matches!(
            decode::<UpgradeOrder>(&encode(&long)),
            Err(ProtocolError::TooMany { field: "url", .. })
        ));
    }
}
