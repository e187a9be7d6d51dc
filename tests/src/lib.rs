//! End-to-end tests of k8s4r: see `tests/e2e.rs` and `tests/faults.rs`. The
//! package's binaries (`e2e-agent`, `e2e-server`, `e2e-manager`,
//! `e2e-apiserver`) are the real programs, run as processes; [`faults`] is
//! the fault-injection stack and its scenarios, shared by the tests and by
//! `benches/faults.rs`, which prints their figures.

pub mod chaos;
pub mod config_change;
pub mod faults;
pub mod stopping;
pub mod upgrade;

/// The version the upgrade tests roll out (`e2e-agent-next`,
/// `e2e-agent-crash` and `e2e-agent-lost` say it): newer than the agent's
/// own in semantic-version order, as a real next release is (a robot
/// refuses to go back to an older one without a signed downgrade).
pub const NEXT_VERSION: &str = "999.0.0-next";
