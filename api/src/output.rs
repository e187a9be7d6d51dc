//! A task template's `outputs`: the files the robot uploads to the
//! cluster's bucket once they are done, and the patterns that name them.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::DurationString;

/// Most `outputs` entries one template may have.
pub const MAX_OUTPUT_PATTERNS: usize = 16;
/// The longest pattern.
pub const MAX_PATTERN_LEN: usize = 1024;
/// How long a `continuous` output's file must be unchanged (and closed)
/// when `settle` is not set.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(10);
/// The shortest and longest `settle`.
pub const MIN_SETTLE: Duration = Duration::from_secs(1);
pub const MAX_SETTLE: Duration = Duration::from_secs(3600);

/// Files a task writes that the robot uploads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    /// A path or a glob relative to the task's working directory (no `..`,
    /// no leading `/`): `*` and `?` within one path segment, `**` across
    /// segments, `[abc]` and `{a,b}`; e.g. `bags/*.mcap`, `report.xml`.
    /// Only regular files are taken; a symbolic link is never followed.
    #[schemars(length(min = 1, max = 1024))]
    pub path: String,
    /// When a file is taken: `onExit` (the default) once the attempt ends,
    /// whatever its outcome; `continuous` while the task runs, once a file
    /// is closed by every process of the task and unchanged for `settle`
    /// (rolling recordings), and at the attempt's end for the rest.
    #[serde(default, skip_serializing_if = "OutputWhen::is_on_exit")]
    pub when: OutputWhen,
    /// `continuous` only: how long a file must be unchanged before it is
    /// taken (default 10s, 1s to 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<DurationString>,
    /// Remove the file from the robot once the bucket holds all of it
    /// (default false: it stays until the task's directory is retired).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_after_upload: bool,
}

/// When an output's files are taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OutputWhen {
    /// Once the attempt has ended.
    #[default]
    OnExit,
    /// While the task runs, each file once it is closed and settled.
    Continuous,
}

impl OutputWhen {
    /// Whether it is the default (`onExit`).
    pub fn is_on_exit(&self) -> bool {
        *self == OutputWhen::OnExit
    }
}

impl Output {
    /// Its `settle`, defaulted and held within bounds.
    pub fn settle(&self) -> Duration {
        self.settle
            .as_ref()
            .and_then(|d| d.parse().ok())
            .unwrap_or(DEFAULT_SETTLE)
            .clamp(MIN_SETTLE, MAX_SETTLE)
    }
}

/// The matcher of a pattern: `*` and `?` stop at `/`, `**` crosses it.
pub fn matcher(pattern: &str) -> Result<globset::GlobMatcher, String> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| e.kind().to_string())
}

/// The directory a walk for `pattern` may start in: its segments before
/// the first one with a glob character (`.` when the first has one).
pub fn walk_root(pattern: &str) -> &str {
    let literal = pattern
        .find(['*', '?', '[', '{', '\\'])
        .map_or(pattern, |i| &pattern[..i]);
    literal.rfind('/').map_or("", |i| &literal[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_stays_within_a_segment_and_two_cross_them() {
        let m = matcher("bags/*.mcap").unwrap();
        assert!(m.is_match("bags/run1.mcap"));
        assert!(!m.is_match("bags/old/run1.mcap"));
        let deep = matcher("bags/**/*.mcap").unwrap();
        assert!(deep.is_match("bags/old/run1.mcap"));
        assert!(deep.is_match("bags/run1.mcap"));
        assert!(matcher("report.xml").unwrap().is_match("report.xml"));
        assert!(matcher("bags/[").is_err());
    }

    #[test]
    fn a_walk_starts_at_the_literal_directories() {
        assert_eq!(walk_root("bags/*.mcap"), "bags");
        assert_eq!(walk_root("a/b/**/x"), "a/b");
        assert_eq!(walk_root("*.log"), "");
        assert_eq!(walk_root("report.xml"), "");
        assert_eq!(walk_root("out/report.xml"), "out");
    }

    #[test]
    fn settle_is_defaulted_and_bounded() {
        let mut o = Output {
            path: "x".into(),
            ..Output::default()
        };
        assert_eq!(o.settle(), DEFAULT_SETTLE);
        o.settle = Some("100ms".into());
        assert_eq!(o.settle(), MIN_SETTLE);
        o.settle = Some("30s".into());
        assert_eq!(o.settle(), Duration::from_secs(30));
    }
}
