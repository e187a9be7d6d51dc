use super::*;
use k8s4r_api::facts::LABEL_SHOW_FACTS;
use k8s4r_api::{RobotSpec, RobotStatus};

fn facts(json: &str) -> Facts {
    serde_json::from_str(json).unwrap()
}

/// A Robot as the cache shows it: its labels and the facts it shows.
fn robot(labels: &[(&str, &str)], shows: &str, shown_facts: Option<&str>) -> Robot {
    let mut robot = Robot::new("rb1", RobotSpec::default());
    robot.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    robot.status = Some(RobotStatus {
        facts: facts(shows),
        shown_facts: shown_facts.map(str::to_owned),
        ..Default::default()
    });
    robot
}

fn written(step: FactsStep) -> FactsPatch {
    match step {
        FactsStep::Write(patch) => patch,
        other => panic!("expected a write, got {other:?}"),
    }
}

#[test]
fn new_facts_are_written_at_once_and_once() {
    let (now, mut memory) = (Instant::now(), FactsMemory::default());
    let cached = robot(&[(LABEL_SHOW_FACTS, "battery.estop")], "{}", None);
    memory.offer(facts(r#"{"battery": 80, "docked": true}"#));
    let patch = written(memory.step(&cached, now));
    assert_eq!(
        serde_json::to_string(&patch).unwrap(),
        r#"{"facts":{"battery":80.0,"docked":true},"shownFacts":"battery=80 estop=<none>"}"#
    );
    assert_eq!(memory.due(), None);
    // The same facts again: the cache does not show them yet, this
    // server's own write stands for them.
    memory.offer(facts(r#"{"battery": 80, "docked": true}"#));
    assert_eq!(
        memory.step(&cached, now + Duration::from_secs(1)),
        FactsStep::Idle
    );
    // Later, the cache speaks for the Robot.
    let caught_up = robot(
        &[(LABEL_SHOW_FACTS, "battery.estop")],
        r#"{"battery": 80, "docked": true}"#,
        Some("battery=80 estop=<none>"),
    );
    memory.offer(facts(r#"{"battery": 80, "docked": true}"#));
    assert_eq!(
        memory.step(&caught_up, now + Duration::from_secs(60)),
        FactsStep::Idle
    );
    assert_eq!(
        memory.step(&caught_up, now + Duration::from_secs(61)),
        FactsStep::Idle,
        "nothing waits"
    );
}

#[test]
fn facts_no_longer_reported_are_removed() {
    let (now, mut memory) = (Instant::now(), FactsMemory::default());
    let cached = robot(&[], r#"{"battery": 80, "mission": "survey"}"#, None);
    memory.offer(facts(r#"{"battery": 70, "docked": true}"#));
    let patch = written(memory.step(&cached, now));
    assert_eq!(patch.facts.get("mission"), Some(&None), "{patch:?}");
    assert_eq!(
        patch.shown_facts.as_deref(),
        Some("battery=70 docked=true"),
        "no label: the first facts"
    );
    // What this server wrote is removed too, though the cache lags.
    memory.offer(facts(r#"{"battery": 70}"#));
    let patch = written(memory.step(&cached, now + Duration::from_millis(600)));
    assert_eq!(patch.facts.get("docked"), Some(&None), "{patch:?}");
    assert_eq!(patch.facts.get("battery"), Some(&Some(FactValue::Number(70.0))));
}

#[test]
fn a_change_back_is_written_though_the_lagging_cache_shows_it() {
    let (now, mut memory) = (Instant::now(), FactsMemory::default());
    let cached = robot(&[], r#"{"estop": false}"#, None);
    memory.offer(facts(r#"{"estop": true}"#));
    written(memory.step(&cached, now));
    // Released again before the cache saw it pressed: the Robot shows
    // pressed (this server's write), so false is written.
    memory.offer(facts(r#"{"estop": false}"#));
    let patch = written(memory.step(&cached, now + Duration::from_millis(100)));
    assert_eq!(patch.facts.get("estop"), Some(&Some(FactValue::Bool(false))));
}

#[test]
fn a_flood_costs_a_bounded_number_of_writes_and_the_newest_lands() {
    let (start, mut memory) = (Instant::now(), FactsMemory::default());
    let cached = robot(&[], "{}", None);
    let mut writes = Vec::new();
    // 50 changes a second for 10 s; the worker steps at each message and
    // when the waiting facts are due.
    for i in 0..500u32 {
        let now = start + Duration::from_millis(u64::from(i) * 20);
        while let Some(due) = memory.due().filter(|d| *d <= now) {
            if let FactsStep::Write(patch) = memory.step(&cached, due) {
                writes.push((due, patch));
            }
        }
        memory.offer(facts(&format!(r#"{{"counter": {i}}}"#)));
        match memory.step(&cached, now) {
            FactsStep::Write(patch) => writes.push((now, patch)),
            FactsStep::Wait(at) => assert!(at > now && at <= now + Duration::from_millis(500)),
            FactsStep::Idle => panic!("a new value is never idle"),
        }
    }
    let end = start + Duration::from_secs(10);
    assert!(
        writes.len() as f64 <= WRITE_BURST + WRITE_RATE * 10.0 + 1.0,
        "{} writes",
        writes.len()
    );
    // The last value waits at most one token's time, then is written.
    let due = memory.due().expect("the newest waits");
    assert!(due <= end + Duration::from_millis(500));
    let patch = written(memory.step(&cached, due));
    assert_eq!(patch.facts.get("counter"), Some(&Some(FactValue::Number(499.0))));
    assert_eq!(memory.due(), None);
}

#[test]
fn a_label_change_is_followed_at_the_next_write() {
    let (now, mut memory) = (Instant::now(), FactsMemory::default());
    let battery = r#"{"battery": 80, "docked": true}"#;
    let before = robot(&[(LABEL_SHOW_FACTS, "battery")], battery, Some("battery=80"));
    memory.offer(facts(battery));
    assert_eq!(memory.step(&before, now), FactsStep::Idle);
    let after = robot(
        &[(LABEL_SHOW_FACTS, "battery.docked")],
        battery,
        Some("battery=80"),
    );
    memory.offer(facts(battery));
    let patch = written(memory.step(&after, now + Duration::from_secs(30)));
    assert_eq!(patch.shown_facts.as_deref(), Some("battery=80 docked=true"));
}

#[test]
fn the_label_alone_is_followed_from_the_watch() {
    let battery = r#"{"battery": 80}"#;
    let same = robot(&[(LABEL_SHOW_FACTS, "battery")], battery, Some("battery=80"));
    assert_eq!(shown_facts_stale(&same), None);
    let changed = robot(
        &[(LABEL_SHOW_FACTS, "battery.estop")],
        battery,
        Some("battery=80"),
    );
    assert_eq!(
        shown_facts_stale(&changed).and_then(|p| p.shown_facts).as_deref(),
        Some("battery=80 estop=<none>")
    );
    let removed = robot(&[], r#"{}"#, Some("battery=80"));
    let patch = shown_facts_stale(&removed).expect("the text goes with the label");
    assert_eq!(serde_json::to_string(&patch).unwrap(), r#"{"shownFacts":null}"#);
    let mut offline = robot(&[(LABEL_SHOW_FACTS, "battery")], battery, Some("battery=80"));
    offline.status.as_mut().unwrap().phase = Some(k8s4r_api::RobotPhase::Offline);
    assert_eq!(
        shown_facts_stale(&offline).and_then(|p| p.shown_facts).as_deref(),
        Some("stale: battery=80"),
        "an Offline robot's facts are marked stale"
    );
    let mut unregistered = Robot::new("rb1", RobotSpec::default());
    unregistered.metadata.labels = Some([(LABEL_SHOW_FACTS.to_owned(), "battery".to_owned())].into());
    assert_eq!(shown_facts_stale(&unregistered), None, "no status to write yet");
}

#[test]
fn a_failed_write_is_retried_later_with_the_newest_facts() {
    let (now, mut memory) = (Instant::now(), FactsMemory::default());
    let cached = robot(&[], "{}", None);
    memory.offer(facts(r#"{"battery": 50}"#));
    written(memory.step(&cached, now));
    memory.failed(facts(r#"{"battery": 50}"#), now);
    let first = memory.due().expect("waits for a retry");
    assert!(first > now);
    assert_eq!(memory.step(&cached, now), FactsStep::Wait(first));
    let patch = written(memory.step(&cached, first));
    assert_eq!(patch.facts.get("battery"), Some(&Some(FactValue::Number(50.0))));
    memory.failed(facts(r#"{"battery": 50}"#), first);
    let second = memory.due().unwrap();
    assert!(second - first > first - now, "the delay doubles");
    // Newer facts replace the ones that failed.
    memory.offer(facts(r#"{"battery": 40}"#));
    let patch = written(memory.step(&cached, second));
    assert_eq!(patch.facts.get("battery"), Some(&Some(FactValue::Number(40.0))));
    memory.succeeded();
}

#[test]
fn nothing_offered_is_nothing_written() {
    let mut memory = FactsMemory::default();
    let cached = robot(&[(LABEL_SHOW_FACTS, "battery")], "{}", None);
    assert_eq!(memory.step(&cached, Instant::now()), FactsStep::Idle);
    assert_eq!(memory.due(), None);
}
