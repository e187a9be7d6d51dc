//! Checks of a template's `outputs`.

use std::collections::BTreeSet;

use super::{is_inside_task_dir, Report};
use crate::output::{matcher, OutputWhen, MAX_OUTPUT_PATTERNS, MAX_PATTERN_LEN, MAX_SETTLE, MIN_SETTLE};
use crate::task::TaskTemplate;

pub(super) fn check(report: &mut Report, path: &str, t: &TaskTemplate) {
    if t.outputs.len() > MAX_OUTPUT_PATTERNS {
        report.error(
            format!("{path}.outputs"),
            format!("at most {MAX_OUTPUT_PATTERNS} entries"),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, output) in t.outputs.iter().enumerate() {
        let at = format!("{path}.outputs[{i}]");
        let pattern = output.path.as_str();
        if pattern.len() > MAX_PATTERN_LEN {
            report.error(format!("{at}.path"), format!("at most {MAX_PATTERN_LEN} bytes"));
        } else if !is_inside_task_dir(pattern)
            || pattern.ends_with('/')
            || pattern.split('/').any(|s| s.is_empty() || s == ".")
            || pattern.chars().any(char::is_control)
        {
            report.error(
                format!("{at}.path"),
                format!("must be a relative path or glob inside the working directory (no '..', '.' or empty step, not a directory), got {pattern:?}"),
            );
        } else if let Err(e) = matcher(pattern) {
            report.error(format!("{at}.path"), format!("invalid glob {pattern:?}: {e}"));
        } else if !seen.insert(pattern) {
            report.error(format!("{at}.path"), format!("duplicate path {pattern:?}"));
        }
        if let Some(settle) = &output.settle {
            if output.when != OutputWhen::Continuous {
                report.error(format!("{at}.settle"), "only for `when: continuous`");
            }
            match settle.parse_strict() {
                Ok(d) if (MIN_SETTLE..=MAX_SETTLE).contains(&d) => {}
                Ok(_) => report.error(
                    format!("{at}.settle"),
                    format!(
                        "must be between {}s and {}s",
                        MIN_SETTLE.as_secs(),
                        MAX_SETTLE.as_secs()
                    ),
                ),
                Err(e) => report.error(format!("{at}.settle"), e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Output;

    fn problems(outputs: Vec<Output>) -> Vec<String> {
        let t = TaskTemplate {
            outputs,
            ..TaskTemplate::default()
        };
        let mut report = Report::default();
        check(&mut report, "spec", &t);
        report.0.iter().map(|p| p.to_string()).collect()
    }

    fn output(path: &str) -> Output {
        Output {
            path: path.into(),
            ..Output::default()
        }
    }

    #[test]
    fn paths_must_stay_inside_and_be_valid_globs() {
        assert!(problems(vec![output("bags/*.mcap"), output("report.xml")]).is_empty());
        for bad in [
            "../x",
            "/etc/passwd",
            "a/../../b",
            "",
            "bags/",
            "bags/[a",
            "./x",
            "a//b.log",
            "a\nb",
        ] {
            let found = problems(vec![output(bad)]);
            assert_eq!(found.len(), 1, "{bad:?}: {found:?}");
            assert!(found[0].contains("spec.outputs[0].path"), "{found:?}");
        }
        let found = problems(vec![output("a.txt"), output("a.txt")]);
        assert!(found[0].contains("duplicate"), "{found:?}");
    }

    #[test]
    fn settle_is_for_continuous_outputs_within_bounds() {
        let mut o = output("bags/*.mcap");
        o.settle = Some("30s".into());
        assert!(problems(vec![o.clone()])[0].contains("only for `when: continuous`"));
        o.when = OutputWhen::Continuous;
        assert!(problems(vec![o.clone()]).is_empty());
        o.settle = Some("2h".into());
        assert!(problems(vec![o.clone()])[0].contains("between"));
        o.settle = Some("soon".into());
        assert_eq!(problems(vec![o]).len(), 1);
    }

    #[test]
    fn seventeen_outputs_are_too_many() {
        let many = (0..17).map(|i| output(&format!("f{i}"))).collect();
        assert!(problems(many)[0].contains("at most 16"));
    }
}
