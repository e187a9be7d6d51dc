//! Upgrades of the agent itself, on the robot: a new binary is verified
//! (digest, a signature against a key the robot pins, its architecture,
//! its own `--version`), staged in a slot beside the running one, switched
//! to by rename and put on trial; a binary already known good rolls it
//! back when it keeps exiting or the cluster does not confirm it in time.
//!
//! This module holds the robot-side mechanics; the rollout that drives
//! them from the cluster is not built yet.

pub mod prepare;
pub mod slots;
pub mod verify;
