//! The documentation stays usable: the README is short enough for a
//! newcomer to read through, every relative link in the Markdown a reader
//! is pointed to (and every `#anchor` in it) leads somewhere, and none of
//! it speaks of the project's internal issue numbers, which mean nothing
//! to a reader.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The README is the first page: the two commands, the way to a second
/// robot and a first Job, and pointers to the rest, under this many lines.
const README_MAX_LINES: usize = 250;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the repository")
        .to_path_buf()
}

/// README.md and the other top-level Markdown files, `docs/*.md`, and the
/// crates' own READMEs (the README links to them).
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut found = Vec::new();
    let mut markdown_in = |dir: &Path| {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_some_and(|e| e == "md") && path.is_file() {
                found.push(path);
            }
        }
    };
    markdown_in(&root);
    markdown_in(&root.join("docs"));
    for entry in std::fs::read_dir(&root).expect("read the repository root") {
        let crate_readme = entry.expect("a directory entry").path().join("README.md");
        if crate_readme.is_file() {
            found.push(crate_readme);
        }
    }
    found.sort();
    found.dedup();
    assert!(
        found.iter().any(|p| p.ends_with("docs/operating.md")),
        "docs/*.md not found under {}",
        root.display()
    );
    found
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A line with its inline code spans removed (a link inside backticks is
/// text, not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` and the reference
/// definitions `[label]: target` on one line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    if let Some(rest) = line.trim_start().strip_prefix('[') {
        if let Some((_, after)) = rest.split_once("]:") {
            if let Some(target) = after.split_whitespace().next() {
                targets.push(target.to_owned());
            }
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading: its text without Markdown markup,
/// lower-cased, punctuation dropped (letters, digits, `-` and `_` kept),
/// spaces turned into hyphens.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // Keep a link's text, drop its target.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(close) => {
                text.push_str(&after[..close]);
                let target = &after[close + 2..];
                rest = target.find(')').map_or("", |end| &target[end + 1..]);
            }
            None => {
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a document's headings give, numbered as GitHub numbers
/// repeated headings (`name`, `name-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// `dir/../x` as `x`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with one link of `from`, if anything.
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".to_owned());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else if path.starts_with('/') {
        return Some(format!(
            "{target}: an absolute path does not resolve on GitHub; link relatively"
        ));
    } else {
        normalize(&from.parent().expect("a document is in a directory").join(path))
    };
    if !file.starts_with(repo_root()) {
        return Some(format!("{target}: leads out of the repository"));
    }
    if !file.exists() {
        return Some(format!("{target}: {} does not exist", shown(&file)));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let known = anchors(&read(&file));
    (!known.contains(anchor)).then(|| {
        format!(
            "{target}: {} has no heading with the anchor #{anchor} (it has: {})",
            shown(&file),
            known.into_iter().collect::<Vec<_>>().join(", ")
        )
    })
}

/// Where a line names an internal issue or pull request number: "issue
/// 26", "issues 26 and 27", "issue #28", "#28".
fn issue_reference(line: &str) -> Option<String> {
    let lower = line.to_lowercase();
    let bytes = lower.as_bytes();
    for (at, _) in lower.match_indices("issue") {
        let mut i = at + "issue".len();
        if bytes.get(i) == Some(&b's') {
            i += 1;
        }
        if bytes.get(i) == Some(&b' ') {
            i += 1;
        }
        if bytes.get(i) == Some(&b'#') {
            i += 1;
        }
        let digits = bytes[i.min(bytes.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits > 0 {
            return Some(lower[at..i + digits].to_owned());
        }
    }
    for (at, _) in lower.match_indices('#') {
        let before = at.checked_sub(1).map(|b| bytes[b]);
        let starts_word = before.is_none_or(|b| b == b' ' || b == b'(' || b == b'[');
        let digits = bytes[at + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
        let ends_word = bytes
            .get(at + 1 + digits)
            .is_none_or(|b| !b.is_ascii_alphanumeric() && *b != b'-' && *b != b'_');
        if starts_word && digits > 0 && ends_word {
            return Some(lower[at..at + 1 + digits].to_owned());
        }
    }
    None
}

#[test]
fn the_readme_is_under_its_line_budget() {
    let readme = read(&repo_root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move detail to a page under docs/"
    );
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                checked += 1;
                if let Some(problem) = broken(&doc, &target) {
                    problems.push(format!("{}:{number}: {problem}", shown(&doc)));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the link parser broken?"
    );
    assert!(problems.is_empty(), "broken links:\n{}", problems.join("\n"));
}

#[test]
fn no_document_names_an_internal_issue_number() {
    let mut problems = Vec::new();
    for doc in documents() {
        for (i, line) in read(&doc).lines().enumerate() {
            if let Some(found) = issue_reference(line) {
                problems.push(format!("{}:{}: {found:?} in {line:?}", shown(&doc), i + 1));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "internal issue numbers mean nothing to a reader; say what changed instead:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_are_meant_to_see() {
    assert_eq!(
        slug("Stopping the way robot software needs: `stopSignal` and `preStop`"),
        "stopping-the-way-robot-software-needs-stopsignal-and-prestop"
    );
    assert_eq!(
        slug("Start conditions on a robot's facts (`when`)"),
        "start-conditions-on-a-robots-facts-when"
    );
    assert_eq!(
        slug("k8s4r — Kubernetes for robot fleets"),
        "k8s4r--kubernetes-for-robot-fleets"
    );
    assert_eq!(slug("See [the page](x.md) now"), "see-the-page-now");
    let repeated = anchors("# A\n\n## Notes\n\n```sh\n# not a heading\n```\n\n## Notes\n");
    assert_eq!(
        repeated,
        BTreeSet::from(["a".to_owned(), "notes".to_owned(), "notes-1".to_owned()])
    );

    assert_eq!(
        link_targets("see [a](docs/a.md#x) and [b](../b.md), not `[c](c.md)`"),
        ["docs/a.md#x", "../b.md"]
    );
    assert_eq!(
        link_targets("[ref]: https://example.com/x"),
        ["https://example.com/x"]
    );

    for named in [
        "issue 26",
        "(Issue 30)",
        "issues 26 and 27",
        "issue #28",
        "see #28.",
        "[#7]",
    ] {
        assert!(issue_reference(named).is_some(), "{named}");
    }
    for fine in [
        "an issue with 3 robots",
        "issuer 2",
        "docs/a.md#anchor",
        "C#10",
        "#ff0000",
        "# 1 heading",
    ] {
        assert_eq!(issue_reference(fine), None, "{fine}");
    }
}

/// BENCHMARKS.md and RELIABILITY.md open with the table of current figures
/// `scripts/bench-record.py` writes: one row and exactly one `BENCH` line
/// per figure, saying the same value and unit, and no other `BENCH` line
/// in the file (earlier runs are history: docs/benchmarks-history.md, or
/// quoted without the mark).
#[test]
fn each_figure_has_one_current_value() {
    const BEGIN: &str = "<!-- figures: written by scripts/bench-record.py; do not edit by hand -->";
    const END: &str = "<!-- end of figures -->";
    for name in ["BENCHMARKS.md", "RELIABILITY.md"] {
        let text = read(&repo_root().join(name));
        let (before, rest) = text
            .split_once(BEGIN)
            .unwrap_or_else(|| panic!("{name}: no table of current figures"));
        let (block, after) = rest
            .split_once(END)
            .unwrap_or_else(|| panic!("{name}: the table of figures does not end"));
        assert!(
            !before
                .lines()
                .chain(after.lines())
                .any(|l| l.starts_with("BENCH ")),
            "{name}: a BENCH line outside the table's block"
        );
        let mut rows = std::collections::BTreeMap::new();
        let mut lines = std::collections::BTreeMap::new();
        for line in block.lines() {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
            if line.starts_with("| `") && cells.len() == 7 {
                rows.insert(
                    cells[0].trim_matches('`').to_owned(),
                    (cells[1].to_owned(), cells[2].to_owned()),
                );
            }
            if let Some(rest) = line.strip_prefix("BENCH ") {
                let mut words = rest.splitn(3, ' ');
                let figure = words.next().unwrap_or_default().to_owned();
                let value = words.next().unwrap_or_default().to_owned();
                let unit = words.next().unwrap_or_default().trim().to_owned();
                assert!(
                    lines.insert(figure.clone(), (value, unit)).is_none(),
                    "{name}: two BENCH lines for {figure}"
                );
            }
        }
        assert!(!rows.is_empty(), "{name}: an empty table");
        assert_eq!(rows, lines, "{name}: the table and its BENCH lines disagree");
    }
}
