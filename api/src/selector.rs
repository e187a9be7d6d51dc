//! Choosing robots: label selectors (Kubernetes' shape and semantics) and
//! placement constraints over a robot's attributes (Nomad's shape).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A label selector, as in `metav1.LabelSelector`. All requirements must hold;
/// an empty selector matches every robot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be present with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements (In, NotIn, Exists, DoesNotExist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One set-based requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// The label key the requirement applies to.
    pub key: String,
    /// How the key's value relates to `values`.
    pub operator: SelectorOperator,
    /// Values for In and NotIn; must be empty for Exists and DoesNotExist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The operator of a label selector requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent, or its value is none of `values`.
    NotIn,
    /// The label is present, whatever its value.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl LabelSelector {
    /// A selector requiring each of `labels`.
    pub fn from_labels<K: Into<String>, V: Into<String>>(labels: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            match_labels: labels.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            match_expressions: Vec::new(),
        }
    }

    /// True when the selector selects nothing in particular (matches all).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether a robot with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// Both selectors' requirements (a job's and one of its groups').
    pub fn and(&self, other: &LabelSelector) -> LabelSelector {
        let mut merged = self.clone();
        merged.match_labels.extend(other.match_labels.clone());
        merged
            .match_expressions
            .extend(other.match_expressions.iter().cloned());
        merged
    }
}

impl LabelSelectorRequirement {
    /// Whether the labels satisfy this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::NotIn => !value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

/// A placement rule over one attribute of a robot, after Nomad's constraints.
///
/// Attributes: `arch`, `os`, `osVersion`, `kernel`, `hostname`, `cpus`,
/// `memory` (bytes), `agentVersion`, and `label.<key>` for any label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Constraint {
    /// The robot attribute to test, e.g. `arch` or `label.site`.
    pub attribute: String,
    /// How the attribute compares to `value`.
    pub operator: ConstraintOperator,
    /// The value to compare with (a comma-separated list for `in`/`notIn`;
    /// unused for `exists`/`notExists`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// The comparison a constraint makes. Ordering operators compare numerically
/// when both sides are numbers and as text otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConstraintOperator {
    /// Equal to the value.
    #[serde(rename = "=")]
    Equal,
    /// Not equal to the value (true when the attribute is absent).
    #[serde(rename = "!=")]
    NotEqual,
    /// Greater than the value.
    #[serde(rename = ">")]
    Greater,
    /// Greater than or equal to the value.
    #[serde(rename = ">=")]
    GreaterOrEqual,
    /// Less than the value.
    #[serde(rename = "<")]
    Less,
    /// Less than or equal to the value.
    #[serde(rename = "<=")]
    LessOrEqual,
    /// One of the comma-separated values.
    #[serde(rename = "in")]
    In,
    /// None of the comma-separated values.
    #[serde(rename = "notIn")]
    NotIn,
    /// The attribute is present.
    #[serde(rename = "exists")]
    Exists,
    /// The attribute is absent.
    #[serde(rename = "notExists")]
    NotExists,
}

/// The attribute names a constraint may test, besides `label.<key>`.
pub const CONSTRAINT_ATTRIBUTES: &[&str] = &[
    "arch",
    "os",
    "osVersion",
    "kernel",
    "hostname",
    "cpus",
    "memory",
    "agentVersion",
];

impl Constraint {
    /// Whether a robot whose attribute has `actual` (None: absent) passes.
    pub fn admits(&self, actual: Option<&str>) -> bool {
        use ConstraintOperator as Op;
        let list = || self.value.split(',').map(str::trim);
        match (self.operator, actual) {
            (Op::Exists, a) => a.is_some(),
            (Op::NotExists, a) => a.is_none(),
            (Op::NotEqual, None) | (Op::NotIn, None) => true,
            (_, None) => false,
            (Op::Equal, Some(a)) => a == self.value,
            (Op::NotEqual, Some(a)) => a != self.value,
            (Op::In, Some(a)) => list().any(|v| v == a),
            (Op::NotIn, Some(a)) => !list().any(|v| v == a),
            (op, Some(a)) => {
                let ordering = match (a.parse::<f64>(), self.value.parse::<f64>()) {
                    (Ok(x), Ok(y)) => x.partial_cmp(&y),
                    _ => Some(a.cmp(self.value.as_str())),
                };
                let Some(ordering) = ordering else {
                    return false;
                };
                match op {
                    Op::Greater => ordering.is_gt(),
                    Op::GreaterOrEqual => ordering.is_ge(),
                    Op::Less => ordering.is_lt(),
                    _ => ordering.is_le(),
                }
            }
        }
    }
}

/// Required anti-affinity: at most one running task of a group per robot,
/// or per value of a robot label (`topologyKey`, e.g. `site`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AntiAffinity {
    /// A robot label: at most one task of the group per value of it. A robot
    /// without the label takes none of the group's tasks. Empty: per robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
}

/// Preferred affinity: robots the selector matches score `weight` higher.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightedAffinity {
    /// 1 to 100; the weights of every matching rule add up.
    pub weight: i32,
    /// Robots, by label, the rule prefers.
    pub selector: LabelSelector,
}

/// The summed weight of the affinity rules a robot with `labels` matches.
pub fn affinity_weight(rules: &[WeightedAffinity], labels: &BTreeMap<String, String>) -> i64 {
    rules
        .iter()
        .filter(|r| r.selector.matches(labels))
        .map(|r| i64::from(r.weight))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn match_labels_need_every_pair() {
        let s = LabelSelector::from_labels([("site", "lab"), ("kind", "arm")]);
        assert!(s.matches(&labels(&[("site", "lab"), ("kind", "arm"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("site", "lab")])));
        assert!(LabelSelector::default().matches(&labels(&[])));
    }

    #[test]
    fn set_based_requirements() {
        let l = labels(&[("zone", "a")]);
        assert!(req("zone", SelectorOperator::In, &["a", "b"]).matches(&l));
        assert!(!req("zone", SelectorOperator::In, &["c"]).matches(&l));
        assert!(req("zone", SelectorOperator::NotIn, &["c"]).matches(&l));
        assert!(req("other", SelectorOperator::NotIn, &["c"]).matches(&l));
        assert!(req("zone", SelectorOperator::Exists, &[]).matches(&l));
        assert!(req("other", SelectorOperator::DoesNotExist, &[]).matches(&l));
        assert!(!req("zone", SelectorOperator::DoesNotExist, &[]).matches(&l));
    }

    #[test]
    fn constraints_compare_numbers_numerically() {
        let c = |op, v: &str| Constraint {
            attribute: "cpus".into(),
            operator: op,
            value: v.into(),
        };
        assert!(c(ConstraintOperator::GreaterOrEqual, "4").admits(Some("8")));
        assert!(!c(ConstraintOperator::Greater, "10").admits(Some("8")));
        assert!(
            c(ConstraintOperator::Less, "10").admits(Some("8")),
            "8 < 10 numerically"
        );
        assert!(c(ConstraintOperator::Equal, "aarch64").admits(Some("aarch64")));
        assert!(c(ConstraintOperator::In, "x86_64, aarch64").admits(Some("aarch64")));
        assert!(c(ConstraintOperator::NotEqual, "x").admits(None));
        assert!(!c(ConstraintOperator::Equal, "x").admits(None));
        assert!(c(ConstraintOperator::NotExists, "").admits(None));
    }
}
