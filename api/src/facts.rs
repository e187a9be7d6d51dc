//! A robot's own state ("facts": battery level, docked, e-stop pressed, a
//! mission in progress), read by its agent from a source the robot's
//! software controls, and the start conditions (`when:`) a task puts on
//! it, in the style of node affinity expressions.
//!
//! Facts cross a trust boundary: the cluster keeps what a robot says
//! about itself only within [`check_facts`]'s bounds, and a condition
//! never reads anything but the fact it names.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// Most facts one robot may report.
pub const MAX_FACTS: usize = 64;
/// The longest fact name.
pub const MAX_FACT_NAME: usize = 63;
/// The longest string value of a fact, in bytes.
pub const MAX_FACT_STRING: usize = 256;
/// Most start conditions one task may have.
pub const MAX_START_CONDITIONS: usize = 16;
/// Most values one start condition may list.
pub const MAX_CONDITION_VALUES: usize = 16;

/// The Robot label naming the facts `kubectl get robots -o wide` shows,
/// separated by dots: `robot.k8s4r.io/show-facts=battery.docked.estop`.
pub const LABEL_SHOW_FACTS: &str = "robot.k8s4r.io/show-facts";

/// What a robot says about itself, by name.
pub type Facts = BTreeMap<String, FactValue>;

/// One fact's value: a string, a number or a boolean.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FactValue {
    Bool(bool),
    Number(f64),
    String(String),
}

impl JsonSchema for FactValue {
    fn schema_name() -> Cow<'static, str> {
        "FactValue".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // Scalars of three types: a structural schema says so with
        // preserve-unknown-fields (Kubernetes has no "string, number or
        // boolean" type); the server bounds them (`check_facts`).
        schemars::json_schema!({
            "x-kubernetes-preserve-unknown-fields": true,
            "description": "A fact's value: a string, a number or a boolean."
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

impl FactValue {
    /// Its value as a number: a number, or a string that reads as one.
    pub fn as_number(&self) -> Option<f64> {
        match self {
            FactValue::Number(n) => Some(*n),
            FactValue::String(s) => s.trim().parse::<f64>().ok().filter(|n| n.is_finite()),
            FactValue::Bool(_) => None,
        }
    }

    /// Whether it equals a condition's value as written in a spec:
    /// `true`/`false` for a boolean, a number equal as a number.
    pub fn equals(&self, value: &str) -> bool {
        match self {
            FactValue::Bool(b) => value.trim() == if *b { "true" } else { "false" },
            FactValue::Number(n) => value.trim().parse::<f64>().is_ok_and(|v| v == *n),
            FactValue::String(s) => s == value,
        }
    }
}

impl fmt::Display for FactValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FactValue::Bool(b) => write!(f, "{b}"),
            FactValue::Number(n) => write!(f, "{n}"),
            FactValue::String(s) => f.write_str(s),
        }
    }
}

/// Checks a fact's name: 1 to 63 letters, digits, `_` and `-`, starting
/// with a letter.
pub fn validate_fact_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_FACT_NAME {
        return Err(format!(
            "a fact name has 1 to {MAX_FACT_NAME} characters, got {}",
            name.len()
        ));
    }
    let mut chars = name.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "a fact name starts with a letter and has only letters, digits, '_' and '-', got {name:?}"
        ));
    }
    Ok(())
}

/// Whether `c` is a Unicode format character (general category Cf): it
/// draws nothing itself but changes how the text around it is shown. A
/// right-to-left override in a robot's fact would make the FACTS column
/// (and the dashboard) show text in another order than it is: `estop=false`
/// where the value is not that. std has no test for the category; these are
/// its characters as of Unicode 15.1.
pub fn is_format_char(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// Checks what a robot reports as its facts: at most [`MAX_FACTS`], each
/// named by [`validate_fact_name`], strings at most [`MAX_FACT_STRING`]
/// bytes without control or format characters, numbers finite.
pub fn check_facts(facts: &Facts) -> Result<(), String> {
    if facts.len() > MAX_FACTS {
        return Err(format!("at most {MAX_FACTS} facts, got {}", facts.len()));
    }
    for (name, value) in facts {
        validate_fact_name(name)?;
        match value {
            FactValue::String(s) if s.len() > MAX_FACT_STRING => {
                return Err(format!(
                    "fact {name:?}: a string of at most {MAX_FACT_STRING} bytes, got {}",
                    s.len()
                ));
            }
            FactValue::String(s) if s.chars().any(char::is_control) => {
                return Err(format!("fact {name:?}: control characters are not allowed"));
            }
            FactValue::String(s) if s.chars().any(is_format_char) => {
                return Err(format!(
                    "fact {name:?}: invisible formatting characters (such as bidirectional overrides) are not allowed"
                ));
            }
            FactValue::Number(n) if !n.is_finite() => {
                return Err(format!("fact {name:?}: a number must be finite"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// How a start condition compares a fact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FactOperator {
    /// The fact equals one of the values.
    #[default]
    In,
    /// The fact is missing or equals none of the values.
    NotIn,
    /// The robot reports the fact.
    Exists,
    /// The robot does not report the fact.
    DoesNotExist,
    /// The fact is a number greater than the one value.
    Gt,
    /// The fact is a number less than the one value.
    Lt,
}

impl FactOperator {
    fn as_str(self) -> &'static str {
        match self {
            FactOperator::In => "In",
            FactOperator::NotIn => "NotIn",
            FactOperator::Exists => "Exists",
            FactOperator::DoesNotExist => "DoesNotExist",
            FactOperator::Gt => "Gt",
            FactOperator::Lt => "Lt",
        }
    }
}

/// What a running task does when its condition stops holding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WhileRunning {
    /// Nothing: the condition is checked at the start only.
    #[default]
    Ignore,
    /// The robot stops the task (its `preStop`, its `stopSignal`, then
    /// SIGKILL after `killTimeout`), reason `ConditionLost`.
    Stop,
}

/// One start condition: a fact the robot must report for the task to
/// start there, e.g. `{key: battery, operator: Gt, values: ["30"]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FactRequirement {
    /// The fact's name.
    #[schemars(length(min = 1, max = 63))]
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt` or `Lt`.
    pub operator: FactOperator,
    /// The values: one or more for `In` and `NotIn`, exactly one number
    /// for `Gt` and `Lt`, none for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub values: Vec<String>,
    /// `ignore` (default): checked before the start only. `stop`: the
    /// robot stops the running task, reason `ConditionLost`, as soon as
    /// the condition no longer holds.
    #[serde(default, skip_serializing_if = "is_ignore")]
    pub while_running: WhileRunning,
}

fn is_ignore(w: &WhileRunning) -> bool {
    *w == WhileRunning::Ignore
}

impl FactRequirement {
    /// Whether `facts` satisfy it. A missing fact satisfies only `NotIn`
    /// and `DoesNotExist` (as a missing label does in Kubernetes).
    pub fn admits(&self, facts: &Facts) -> bool {
        let fact = facts.get(&self.key);
        let bound = || self.values.first().and_then(|v| v.trim().parse::<f64>().ok());
        match self.operator {
            FactOperator::In => fact.is_some_and(|f| self.values.iter().any(|v| f.equals(v))),
            FactOperator::NotIn => !fact.is_some_and(|f| self.values.iter().any(|v| f.equals(v))),
            FactOperator::Exists => fact.is_some(),
            FactOperator::DoesNotExist => fact.is_none(),
            FactOperator::Gt => {
                matches!((fact.and_then(FactValue::as_number), bound()), (Some(f), Some(b)) if f > b)
            }
            FactOperator::Lt => {
                matches!((fact.and_then(FactValue::as_number), bound()), (Some(f), Some(b)) if f < b)
            }
        }
    }

    /// What is wrong with it as a spec gives it.
    pub fn problem(&self) -> Option<String> {
        if let Err(e) = validate_fact_name(&self.key) {
            return Some(e);
        }
        if self.values.len() > MAX_CONDITION_VALUES {
            return Some(format!(
                "at most {MAX_CONDITION_VALUES} values, got {}",
                self.values.len()
            ));
        }
        if let Some(v) = self.values.iter().find(|v| v.len() > MAX_FACT_STRING) {
            return Some(format!(
                "a value of at most {MAX_FACT_STRING} bytes, got {}",
                v.len()
            ));
        }
        let op = self.operator.as_str();
        match self.operator {
            FactOperator::In | FactOperator::NotIn if self.values.is_empty() => {
                Some(format!("{op} needs at least one value"))
            }
            FactOperator::Exists | FactOperator::DoesNotExist if !self.values.is_empty() => {
                Some(format!("{op} takes no values"))
            }
            FactOperator::Gt | FactOperator::Lt => match self.values.as_slice() {
                [v] if v.trim().parse::<f64>().is_ok_and(f64::is_finite) => None,
                _ => Some(format!("{op} takes exactly one number, got {:?}", self.values)),
            },
            _ => None,
        }
    }
}

impl fmt::Display for FactRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key, self.operator.as_str())?;
        match self.operator {
            FactOperator::Exists | FactOperator::DoesNotExist => Ok(()),
            FactOperator::Gt | FactOperator::Lt => match self.values.first() {
                Some(v) => write!(f, " {v}"),
                None => Ok(()),
            },
            FactOperator::In | FactOperator::NotIn => write!(f, " [{}]", self.values.join(", ")),
        }
    }
}

/// The first of `conditions` that `facts` do not satisfy, if any.
pub fn unmet<'a>(conditions: &'a [FactRequirement], facts: &Facts) -> Option<&'a FactRequirement> {
    conditions.iter().find(|c| !c.admits(facts))
}

/// Facts shown for a robot without a [`LABEL_SHOW_FACTS`] label: its
/// first few, by name.
pub const SHOWN_WITHOUT_LABEL: usize = 4;

/// What marks the facts of an Offline robot: they are as of its last
/// heartbeat, whose age the HEARTBEAT column gives.
pub const STALE_MARK: &str = "stale:";

/// The FACTS column of a Robot: the facts its [`LABEL_SHOW_FACTS`] label
/// names, as `battery=80 docked=true` (a missing one as `estop=<none>`),
/// or without the label its first [`SHOWN_WITHOUT_LABEL`] facts by name
/// (with `+N` for the rest); None without facts or label. The facts of an
/// `offline` robot are marked stale.
pub fn shown(labels: &BTreeMap<String, String>, facts: &Facts, offline: bool) -> Option<String> {
    let text = match labels.get(LABEL_SHOW_FACTS) {
        Some(names) => names
            .split('.')
            .filter(|n| !n.is_empty())
            .map(|n| match facts.get(n) {
                Some(v) => format!("{n}={v}"),
                None => format!("{n}=<none>"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        None if facts.is_empty() => return None,
        None => {
            let mut first: Vec<String> = facts
                .iter()
                .take(SHOWN_WITHOUT_LABEL)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if facts.len() > SHOWN_WITHOUT_LABEL {
                first.push(format!("+{}", facts.len() - SHOWN_WITHOUT_LABEL));
            }
            first.join(" ")
        }
    };
    Some(if offline {
        format!("{STALE_MARK} {text}")
    } else {
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(json: &str) -> Facts {
        serde_json::from_str(json).unwrap()
    }

    fn req(key: &str, operator: FactOperator, values: &[&str]) -> FactRequirement {
        FactRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
            while_running: WhileRunning::Ignore,
        }
    }

    #[test]
    fn conditions_compare_numbers_booleans_and_strings() {
        let f = facts(r#"{"battery": 80, "docked": true, "mode": "idle", "volts": "24.5"}"#);
        assert!(req("battery", FactOperator::Gt, &["30"]).admits(&f));
        assert!(!req("battery", FactOperator::Lt, &["30"]).admits(&f));
        assert!(
            req("volts", FactOperator::Gt, &["24"]).admits(&f),
            "a string that reads as a number"
        );
        assert!(req("docked", FactOperator::In, &["true"]).admits(&f));
        assert!(!req("docked", FactOperator::NotIn, &["true"]).admits(&f));
        assert!(req("mode", FactOperator::In, &["idle", "charging"]).admits(&f));
        assert!(
            req("battery", FactOperator::In, &["80.0"]).admits(&f),
            "numbers equal as numbers"
        );
        assert!(
            !req("mode", FactOperator::Gt, &["1"]).admits(&f),
            "not a number: not greater"
        );
    }

    #[test]
    fn a_missing_fact_satisfies_only_not_in_and_does_not_exist() {
        let f = Facts::new();
        assert!(!req("battery", FactOperator::Gt, &["30"]).admits(&f));
        assert!(!req("battery", FactOperator::Lt, &["30"]).admits(&f));
        assert!(!req("docked", FactOperator::In, &["true"]).admits(&f));
        assert!(!req("docked", FactOperator::Exists, &[]).admits(&f));
        assert!(req("estop", FactOperator::NotIn, &["true"]).admits(&f));
        assert!(req("estop", FactOperator::DoesNotExist, &[]).admits(&f));
    }

    #[test]
    fn bad_conditions_are_named() {
        assert!(req("battery", FactOperator::Gt, &["thirty"])
            .problem()
            .unwrap()
            .contains("one number"));
        assert!(req("battery", FactOperator::Gt, &["1", "2"]).problem().is_some());
        assert!(req("docked", FactOperator::In, &[])
            .problem()
            .unwrap()
            .contains("at least one"));
        assert!(req("docked", FactOperator::Exists, &["x"]).problem().is_some());
        assert!(req("9lives", FactOperator::Exists, &[]).problem().is_some());
        assert_eq!(req("battery", FactOperator::Gt, &["30"]).problem(), None);
        assert_eq!(
            req("battery", FactOperator::Gt, &["30"]).to_string(),
            "battery Gt 30"
        );
        assert_eq!(
            req("estop", FactOperator::NotIn, &["true"]).to_string(),
            "estop NotIn [true]"
        );
    }

    #[test]
    fn reported_facts_are_bounded() {
        assert!(check_facts(&facts(r#"{"battery": 80, "docked": true}"#)).is_ok());
        let long = format!(r#"{{"note": "{}"}}"#, "x".repeat(MAX_FACT_STRING + 1));
        assert!(check_facts(&facts(&long)).unwrap_err().contains("at most 256"));
        assert!(check_facts(&facts(r#"{"bad name": 1}"#)).is_err());
        let many: Facts = (0..=MAX_FACTS)
            .map(|i| (format!("f{i}"), FactValue::Number(i as f64)))
            .collect();
        assert!(check_facts(&many).is_err());
        assert!(check_facts(&facts(r#"{"note": "a\u0007b"}"#)).is_err());
    }

    #[test]
    fn facts_that_would_show_other_text_than_they_hold_are_refused() {
        // "estop=" then a right-to-left override: shown reversed.
        for spoof in [
            r#"{"estop": "\u202eeurt"}"#,
            r#"{"note": "ok\u2066x\u2069"}"#,
            r#"{"note": "a\u200bb"}"#,
        ] {
            let err = check_facts(&facts(spoof)).unwrap_err();
            assert!(err.contains("invisible formatting characters"), "{spoof}: {err}");
        }
        // Letters of any script are fine.
        assert!(check_facts(&facts(r#"{"site": "שלום", "zone": "Zürich 東京"}"#)).is_ok());
        assert!(is_format_char('\u{E0041}') && !is_format_char('a') && !is_format_char('\u{05D0}'));
    }

    #[test]
    fn the_label_names_the_facts_shown() {
        let f = facts(r#"{"battery": 80, "docked": true}"#);
        let labels = BTreeMap::from([(LABEL_SHOW_FACTS.to_owned(), "battery.estop".to_owned())]);
        assert_eq!(
            shown(&labels, &f, false).as_deref(),
            Some("battery=80 estop=<none>")
        );
        assert_eq!(
            shown(&labels, &f, true).as_deref(),
            Some("stale: battery=80 estop=<none>")
        );
        let none = BTreeMap::new();
        assert_eq!(
            shown(&none, &f, false).as_deref(),
            Some("battery=80 docked=true"),
            "no label: the first few facts"
        );
        let many = facts(r#"{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}"#);
        assert_eq!(shown(&none, &many, false).as_deref(), Some("a=1 b=2 c=3 d=4 +2"));
        assert_eq!(shown(&none, &Facts::new(), false), None);
        assert_eq!(shown(&none, &Facts::new(), true), None);
    }
}
