//! Status conditions, in the shape of `metav1.Condition`.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One aspect of an object's state, as `kubectl describe` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The aspect this condition describes, e.g. `Ready` or `Scheduled`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// A CamelCase word saying why the status is what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A sentence for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Timestamp>,
    /// The generation of the object the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known.
    Unknown,
}

impl Condition {
    /// A condition with the transition time set to now.
    pub fn new(type_: &str, status: ConditionStatus, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_: type_.to_owned(),
            status,
            reason: Some(reason.to_owned()),
            message: Some(message.into()),
            last_transition_time: Some(Timestamp::now()),
            observed_generation: None,
        }
    }
}

/// Inserts or replaces the condition of the same type in `conditions`,
/// keeping the old transition time when the status did not change (as
/// `meta.SetStatusCondition` does). Returns whether anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time;
            }
            let changed = existing.status != new.status
                || existing.reason != new.reason
                || existing.message != new.message
                || existing.observed_generation != new.observed_generation;
            *existing = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// The condition of this type, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_condition_keeps_transition_time_when_status_is_unchanged() {
        let mut list = Vec::new();
        let mut first = Condition::new("Ready", ConditionStatus::True, "Up", "fine");
        first.last_transition_time = Some(Timestamp::UNIX_EPOCH);
        assert!(set_condition(&mut list, first));
        let again = Condition::new("Ready", ConditionStatus::True, "Up", "still fine");
        assert!(set_condition(&mut list, again));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, Some(Timestamp::UNIX_EPOCH));
        let flipped = Condition::new("Ready", ConditionStatus::False, "Down", "gone");
        set_condition(&mut list, flipped);
        assert_ne!(list[0].last_transition_time, Some(Timestamp::UNIX_EPOCH));
    }
}
