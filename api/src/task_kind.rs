//! What kind of work a task is. Its own module, below both the task types
//! and the disconnect policy, whose defaults depend on it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What kind of work a task is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TaskKind {
    /// Runs to completion: exit 0 completes it.
    #[default]
    Batch,
    /// Runs until stopped: every exit is restarted on the robot.
    Service,
}

impl TaskKind {
    /// Whether it is the default, batch.
    pub fn is_batch(&self) -> bool {
        *self == TaskKind::Batch
    }
}
