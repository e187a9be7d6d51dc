use super::*;
use k8s4r_api::robot::AgentHealth;

fn now() -> Timestamp {
    "2026-11-22T10:00:00Z".parse().unwrap()
}
use k8s4r_api::protocol::Register;
use k8s4r_api::{AttemptRecord, RobotSpec, RobotStatus, TaskAttempt, TaskSpec, TaskStatus};

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn device() -> DeviceInfo {
    DeviceInfo {
        arch: "aarch64".into(),
        os: "linux".into(),
        cpus: 4,
        memory_bytes: 4 << 30,
        ..Default::default()
    }
}

fn register(labels: &[(&str, &str)]) -> Register {
    Register {
        token: Some("s3cret".into()),
        drivers: vec!["exec".into()],
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Register::new("rb1", "0.1.0", device())
    }
}

/// A Robot as the cluster would show it.
struct RobotBuilder(Robot);

impl RobotBuilder {
    fn new() -> Self {
        let mut robot = Robot::new("rb1", RobotSpec::default());
        robot.status = Some(RobotStatus {
            phase: Some(RobotPhase::Pending),
            ..Default::default()
        });
        Self(robot)
    }
    fn phase(mut self, phase: RobotPhase) -> Self {
        self.status().phase = Some(phase);
        self
    }
    fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
        self
    }
    fn reported(mut self, k: &str, v: &str) -> Self {
        self.status().reported_labels.insert(k.into(), v.into());
        self
    }
    fn connected(mut self, up: bool) -> Self {
        let conditions = connected(&[], up, t("2026-01-01T00:00:00Z")).unwrap();
        self.status().conditions = conditions;
        self
    }
    fn heartbeat(mut self, at: &str, usage: Usage) -> Self {
        self.status().last_heartbeat_time = Some(t(at));
        self.status().usage = Some(usage);
        self
    }
    fn status(&mut self) -> &mut RobotStatus {
        self.0.status.get_or_insert_with(Default::default)
    }
}

/// A Task as the manager would leave it.
struct TaskBuilder(Task);

impl TaskBuilder {
    fn new() -> Self {
        let mut task = Task::new("job-a-0", TaskSpec::default());
        task.metadata.namespace = Some("default".into());
        task.metadata.uid = Some("u1".into());
        Self(task)
    }
    fn target(mut self, robot: &str) -> Self {
        self.0.spec.target_robot = Some(robot.into());
        self
    }
    fn state(mut self, state: TaskState, attempt: u32, seq: u64) -> Self {
        let status = self.0.status.get_or_insert_with(TaskStatus::default);
        status.state = Some(state);
        status.attempt = attempt;
        status.seq = seq;
        self
    }
    fn closed_attempt(mut self, attempt: u32) -> Self {
        let status = self.0.status.get_or_insert_with(TaskStatus::default);
        status.attempts.push(AttemptRecord {
            start_time: None,
            attempt,
            robot: None,
            state: TaskState::Failed,
            exit_code: Some(1),
            reason: None,
            message: None,
            finish_time: None,
        });
        self
    }
    /// The server recorded `attempt` as being sent.
    fn dispatched(mut self, attempt: u32) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                k8s4r_api::names::ANNOTATION_SENDING_ATTEMPT.into(),
                attempt.to_string(),
            );
        self
    }
    fn finalizer(mut self) -> Self {
        self.0
            .metadata
            .finalizers
            .get_or_insert_with(Default::default)
            .push(k8s4r_api::names::FINALIZER_CANCEL.into());
        self
    }
    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(
            "2026-01-01T00:00:00Z",
        )));
        self
    }
}

fn update(attempt: u32, seq: u64, state: TaskState) -> StatusUpdate {
    StatusUpdate {
        exit_code: state.is_terminal().then_some(0),
        ..StatusUpdate::new("u1", attempt, seq, state)
    }
}

fn usage(cpu: f64, mem_gib: u64) -> Usage {
    Usage {
        cpu_percent: cpu,
        memory_used_bytes: mem_gib << 30,
        memory_total_bytes: 8 << 30,
        disk_free_bytes: 10 << 30,
        ..Default::default()
    }
}

#[test]
fn first_register_creates_a_pending_robot_and_waits_for_the_manager() {
    let now = t("2026-11-22T10:00:00Z");
    let plan = plan_register(&register(&[("site", "lab")]), None, now).unwrap();
    assert!(plan.create);
    assert_eq!(plan.respond, None);
    assert_eq!(plan.status.phase, Some(RobotPhase::Pending));
    assert_eq!(plan.metadata.labels["site"], Some("lab".into()));
    let hash = plan.metadata.annotations[ANNOTATION_TOKEN_SHA256]
        .clone()
        .unwrap();
    assert_eq!(hash.len(), 64);
    assert!(!hash.contains("s3cret"));
    let capacity = plan.status.capacity.unwrap();
    assert_eq!(capacity.cpu.unwrap().as_str(), "4");
    assert_eq!(plan.status.last_registration_time, Some(now));
    let connected = plan.status.conditions.unwrap();
    assert_eq!(connected[0].type_, CONDITION_CONNECTED);
    assert_eq!(connected[0].status, ConditionStatus::True);
}

#[test]
fn register_of_an_online_robot_is_answered_at_once_and_keeps_the_phase() {
    let robot = RobotBuilder::new().phase(RobotPhase::Online).connected(true).0;
    let plan = plan_register(&register(&[]), Some(&robot), Timestamp::now()).unwrap();
    assert!(!plan.create);
    assert_eq!(plan.respond, Some(RobotPhase::Online));
    assert_eq!(plan.status.phase, None, "the manager owns the phase");
    assert_eq!(plan.status.conditions, None, "already connected: no list rewrite");
    let rejected = RobotBuilder::new().phase(RobotPhase::Rejected).0;
    let plan = plan_register(&register(&[]), Some(&rejected), Timestamp::now()).unwrap();
    assert_eq!(plan.respond, Some(RobotPhase::Rejected));
    let offline = RobotBuilder::new().phase(RobotPhase::Offline).0;
    let plan = plan_register(&register(&[]), Some(&offline), Timestamp::now()).unwrap();
    assert_eq!(plan.respond, None, "Offline waits for the manager to see it live");
}

/// The Robot as the registration planned in `first` left it at `at`,
/// approved since.
fn as_registered(first: &RegisterPlan, at: Timestamp) -> Robot {
    let mut robot = RobotBuilder::new()
        .phase(RobotPhase::Online)
        .connected(true)
        .label("site", "lab")
        .reported("site", "lab")
        .0;
    robot.metadata.annotations = Some(
        [(
            ANNOTATION_TOKEN_SHA256.to_owned(),
            first.metadata.annotations[ANNOTATION_TOKEN_SHA256]
                .clone()
                .unwrap(),
        )]
        .into(),
    );
    let status = robot.status.as_mut().unwrap();
    status.device = first.status.device.clone();
    status.drivers = first.status.drivers.clone().unwrap();
    status.agent_version = first.status.agent_version.clone();
    status.capacity = first.status.capacity.clone();
    status.last_registration_time = Some(at);
    robot
}

#[test]
fn a_registration_with_nothing_new_is_not_written_however_late() {
    let now = t("2026-11-22T10:00:00Z");
    let first = plan_register(&register(&[("site", "lab")]), None, t("2026-11-22T09:59:50Z")).unwrap();
    assert!(first.write_status);
    let robot = as_registered(&first, t("2026-11-22T09:59:50Z"));
    let again = plan_register(&register(&[("site", "lab")]), Some(&robot), now).unwrap();
    assert!(
        !again.write_status,
        "10 s later, nothing new: answered, not written"
    );
    assert_eq!(again.respond, Some(RobotPhase::Online));
    let later = plan_register(
        &register(&[("site", "lab")]),
        Some(&robot),
        t("2026-11-23T10:00:00Z"),
    )
    .unwrap();
    assert!(!later.write_status, "a day later, nothing new: still not written");
    // An Offline robot (back after its heartbeat timeout: it sends no
    // heartbeat before it is answered) is written, so the manager sees it.
    let mut away = robot.clone();
    away.status.as_mut().unwrap().phase = Some(RobotPhase::Offline);
    let back = plan_register(
        &register(&[("site", "lab")]),
        Some(&away),
        t("2026-11-23T10:00:00Z"),
    )
    .unwrap();
    assert!(back.write_status);
    assert_eq!(
        back.status.last_registration_time,
        Some(t("2026-11-23T10:00:00Z"))
    );
    // A Pending robot registering again while it waits for the manager is
    // not written again; a Rejected one is, for the manager's second look.
    let mut waiting = robot.clone();
    waiting.status.as_mut().unwrap().phase = Some(RobotPhase::Pending);
    let again = plan_register(&register(&[("site", "lab")]), Some(&waiting), now).unwrap();
    assert!(!again.write_status, "Pending, nothing new: not written");
    assert_eq!(again.respond, None, "still waits for the manager's decision");
    let mut refused = robot.clone();
    refused.status.as_mut().unwrap().phase = Some(RobotPhase::Rejected);
    assert!(
        plan_register(&register(&[("site", "lab")]), Some(&refused), now)
            .unwrap()
            .write_status
    );
    // A reconnect after its last will said it was gone is new.
    let mut gone = robot.clone();
    gone.status.as_mut().unwrap().conditions = connected(&[], false, now).unwrap();
    assert!(
        plan_register(&register(&[("site", "lab")]), Some(&gone), now)
            .unwrap()
            .write_status
    );
    let mut upgraded = register(&[("site", "lab")]);
    upgraded.drivers.push("raw_exec".into());
    assert!(plan_register(&upgraded, Some(&robot), now).unwrap().write_status);
    let relabelled = register(&[("site", "field")]);
    assert!(
        plan_register(&relabelled, Some(&robot), now)
            .unwrap()
            .write_status
    );
}

#[test]
fn labels_a_person_set_are_never_clobbered() {
    let robot = RobotBuilder::new()
        .label("site", "lab")
        .reported("site", "lab")
        .label("owner", "ana") // a person's
        .label("zone", "b") // a person changed what the robot reported
        .reported("zone", "a")
        .label("old", "x") // the robot reported it, and stops now
        .reported("old", "x")
        .0;
    let plan = plan_register(
        &register(&[("site", "field"), ("owner", "bob"), ("zone", "c")]),
        Some(&robot),
        Timestamp::now(),
    )
    .unwrap();
    let labels = plan.metadata.labels;
    assert_eq!(labels.get("site"), Some(&Some("field".into())));
    assert_eq!(labels.get("owner"), None, "person's label untouched");
    assert_eq!(labels.get("zone"), None, "person's override untouched");
    assert_eq!(labels.get("old"), Some(&None), "robot's stale label removed");
    let reported = plan.status.reported_labels.unwrap();
    assert_eq!(reported.get("site"), Some(&Some("field".into())));
    assert_eq!(reported.get("old"), Some(&None));
    assert_eq!(reported.get("owner"), Some(&Some("bob".into())));
}

#[test]
fn a_label_a_person_removed_stays_removed() {
    // The robot reported site=lab and a person removed the label since.
    let robot = RobotBuilder::new().reported("site", "lab").label("other", "x").0;
    for reports in [("site", "lab"), ("site", "field")] {
        let plan = plan_register(&register(&[reports]), Some(&robot), Timestamp::now()).unwrap();
        assert_eq!(
            plan.metadata.labels.get("site"),
            None,
            "re-added from {reports:?}"
        );
    }
    // A key the robot never reported before is still applied.
    let plan = plan_register(
        &register(&[("site", "lab"), ("arch", "arm64")]),
        Some(&robot),
        Timestamp::now(),
    )
    .unwrap();
    assert_eq!(plan.metadata.labels.get("arch"), Some(&Some("arm64".into())));
}

#[test]
fn register_with_an_invalid_label_is_rejected() {
    let err = plan_register(&register(&[("bad key!", "v")]), None, Timestamp::now()).unwrap_err();
    assert_eq!(err.outcome(), "rejected_invalid_label");
}

#[test]
fn heartbeats_are_coalesced() {
    let limits = Coalescing::default();
    let start = t("2026-11-22T10:00:00Z");
    let robot = RobotBuilder::new()
        .phase(RobotPhase::Online)
        .heartbeat("2026-11-22T09:59:50Z", usage(10.0, 1))
        .0;
    let mut memory = HeartbeatMemory::default();
    let mut leases = 0;
    let mut writes = 0;
    // Ten minutes of heartbeats every 5 s with steady usage.
    for i in 0..120 {
        let now = start + jiff::SignedDuration::from_secs(5 * i);
        let plan = plan_heartbeat(
            &mut memory,
            &robot,
            None,
            true,
            Some(&usage(12.0, 1)),
            None,
            now,
            limits,
        );
        leases += usize::from(plan.renew_lease.is_some());
        writes += usize::from(plan.status.is_some());
    }
    assert_eq!(leases, 10, "one lease renewal per minute");
    // The Robot showed a heartbeat from 09:59:50: the next is due at 10:03:50.
    assert_eq!(writes, 2, "one status write per 4 minutes");
    // A material change is written at once.
    let later = start + jiff::SignedDuration::from_secs(601);
    let plan = plan_heartbeat(
        &mut memory,
        &robot,
        None,
        true,
        Some(&usage(90.0, 1)),
        None,
        later,
        limits,
    );
    assert!(plan.status.is_some());
}

/// A heartbeat without usage (its figures have not moved materially since
/// the robot's last confirmed ones) keeps the Robot's figures: the status
/// refresh writes the time alone, and nothing is written as a usage change.
#[test]
fn a_heartbeat_without_usage_keeps_the_robots_figures() {
    let limits = Coalescing::default();
    let robot = RobotBuilder::new()
        .phase(RobotPhase::Online)
        .heartbeat("2026-11-22T09:59:50Z", usage(10.0, 1))
        .0;
    let mut memory = HeartbeatMemory::default();
    let soon = t("2026-11-22T10:00:00Z");
    let plan = plan_heartbeat(&mut memory, &robot, None, false, None, None, soon, limits);
    assert!(plan.status.is_none(), "no usage is no change: {plan:?}");
    // The idle refresh is the longer one.
    let refresh = t("2026-11-22T09:59:50Z") + limits.status_refresh(false);
    let plan = plan_heartbeat(&mut memory, &robot, None, false, None, None, refresh, limits);
    let status = plan.status.expect("the status refresh is due");
    assert_eq!(status.last_heartbeat_time, Some(refresh));
    assert_eq!(status.usage, None, "the patch leaves the Robot's usage as it is");
    assert_eq!(memory.usage_written, Some(usage(10.0, 1)));
    let json = serde_json::to_value(&status).unwrap();
    assert!(
        json.get("usage").is_none(),
        "a merge patch without usage keeps it: {json}"
    );
}

#[test]
fn an_idle_robot_is_renewed_at_the_long_interval_and_at_once_when_it_takes_work() {
    let limits = Coalescing::default();
    let start = t("2026-11-22T10:00:00Z");
    let robot = RobotBuilder::new()
        .phase(RobotPhase::Online)
        .heartbeat("2026-11-22T09:59:50Z", usage(10.0, 1))
        .0;
    let mut memory = HeartbeatMemory::default();
    let at = |secs: i64| start + jiff::SignedDuration::from_secs(secs);
    let beat = |memory: &mut HeartbeatMemory, working: bool, secs: i64| {
        plan_heartbeat(
            memory,
            &robot,
            None,
            working,
            Some(&usage(12.0, 1)),
            None,
            at(secs),
            limits,
        )
    };
    let mut renewals = Vec::new();
    let mut writes = 0;
    // An hour of idle heartbeats every 30 s.
    for i in 0..120 {
        let plan = beat(&mut memory, false, 30 * i);
        renewals.extend(plan.renew_lease.map(|interval| (30 * i, interval)));
        writes += usize::from(plan.status.is_some());
    }
    let idle = limits.idle_lease_interval;
    assert_eq!(
        renewals,
        vec![
            (0, idle),
            (600, idle),
            (1200, idle),
            (1800, idle),
            (2400, idle),
            (3000, idle)
        ]
    );
    // The Robot showed 09:59:50: written again at 10:30:00 only.
    assert_eq!(writes, 1);
    // Heard holding work: renewed at once, promising the short interval.
    let plan = beat(&mut memory, true, 3610);
    assert_eq!(plan.renew_lease, Some(limits.lease_interval));
    let plan = beat(&mut memory, true, 3640);
    assert_eq!(plan.renew_lease, None, "the short interval has not passed");
    // Idle again: the Lease promised 60 s, so it is renewed once that has
    // passed (not at the idle interval), promising the idle one.
    let plan = beat(&mut memory, false, 3650);
    assert_eq!(plan.renew_lease, None);
    let plan = beat(&mut memory, false, 3670);
    assert_eq!(plan.renew_lease, Some(idle));
}

#[test]
fn a_lease_another_replica_wrote_idle_is_renewed_when_this_one_hears_work() {
    let limits = Coalescing::default();
    let now = t("2026-11-22T10:00:00Z");
    let mut memory = None;
    let cached = LeaseRecord::read(t("2026-11-22T09:59:00Z"), Some(1800));
    assert_eq!(cached.interval, Duration::from_secs(600));
    assert_eq!(plan_lease(&mut memory, Some(cached), false, now, limits), None);
    assert_eq!(
        plan_lease(&mut memory, Some(cached), true, now, limits),
        Some(limits.lease_interval)
    );
    assert_eq!(LeaseRecord::duration_seconds(limits.lease_interval), 180);
    // No Lease yet: renewed at once.
    assert_eq!(
        plan_lease(&mut None, None, false, now, limits),
        Some(limits.idle_lease_interval)
    );
}

#[test]
fn a_heartbeat_after_a_disconnect_sets_connected_again() {
    let robot = RobotBuilder::new()
        .phase(RobotPhase::Online)
        .connected(false)
        .heartbeat("2026-11-22T09:59:59Z", usage(10.0, 1))
        .0;
    let mut memory = HeartbeatMemory::default();
    let plan = plan_heartbeat(
        &mut memory,
        &robot,
        None,
        false,
        Some(&usage(10.0, 1)),
        None,
        t("2026-11-22T10:00:00Z"),
        Coalescing::default(),
    );
    let conditions = plan.status.unwrap().conditions.unwrap();
    assert_eq!(conditions[0].status, ConditionStatus::True);
}

#[test]
fn writes_by_another_replica_count() {
    let limits = Coalescing::default();
    let now = t("2026-11-22T10:00:00Z");
    // This replica wrote long ago; another one wrote the status and renewed
    // the Lease a moment ago (its clock even runs a little ahead).
    let robot = RobotBuilder::new()
        .phase(RobotPhase::Online)
        .heartbeat("2026-11-22T10:00:02Z", usage(10.0, 1))
        .0;
    let mut memory = HeartbeatMemory {
        lease: Some(LeaseRecord {
            renewed: t("2026-11-22T09:00:00Z"),
            interval: limits.idle_lease_interval,
        }),
        status_written: Some(t("2026-11-22T09:00:00Z")),
        usage_written: Some(usage(10.0, 1)),
    };
    let plan = plan_heartbeat(
        &mut memory,
        &robot,
        Some(LeaseRecord::read(t("2026-11-22T09:59:50Z"), Some(1800))),
        false,
        Some(&usage(10.0, 1)),
        None,
        now,
        limits,
    );
    assert!(plan.is_empty(), "{plan:?}");
}

#[test]
fn accepting_tasks_follows_the_agents_health_and_is_written_on_change_only() {
    let now = t("2026-11-22T10:00:00Z");
    let full = AgentHealth {
        accepting_tasks: false,
        reason: Some(AgentHealth::REASON_DISK_FULL.into()),
        message: Some("the disk is full".into()),
        ..AgentHealth::default()
    };
    let list = accepting(&[], Some(&full), now).unwrap();
    let c = find_condition(&list, CONDITION_ACCEPTING_TASKS).unwrap();
    assert_eq!(c.status, ConditionStatus::False);
    assert_eq!(c.reason.as_deref(), Some("DiskFull"));
    assert_eq!(accepting(&list, Some(&full), now), None, "unchanged: no write");
    let ready = AgentHealth {
        accepting_tasks: true,
        ..AgentHealth::default()
    };
    let back = accepting(&list, Some(&ready), now).unwrap();
    let c = find_condition(&back, CONDITION_ACCEPTING_TASKS).unwrap();
    assert_eq!(
        (c.status, c.reason.as_deref()),
        (ConditionStatus::True, Some("Ready"))
    );
    assert_eq!(accepting(&list, None, now), None, "an older agent says nothing");
    // A robot that takes tasks but whose facts file is refused says so.
    let refused = AgentHealth {
        accepting_tasks: true,
        reason: Some("FactsRefused".into()),
        message: Some("facts file /run/robot/facts.json: not JSON".into()),
        ..AgentHealth::default()
    };
    let said = accepting(&back, Some(&refused), now).unwrap();
    let c = find_condition(&said, CONDITION_ACCEPTING_TASKS).unwrap();
    assert_eq!(
        (c.status, c.reason.as_deref(), c.message.as_deref()),
        (
            ConditionStatus::True,
            Some("FactsRefused"),
            Some("facts file /run/robot/facts.json: not JSON")
        )
    );
    // A heartbeat that changes it writes, however recently the status was.
    let robot = RobotBuilder::new().phase(RobotPhase::Online).connected(true).0;
    let mut memory = HeartbeatMemory {
        lease: Some(LeaseRecord {
            renewed: now,
            interval: Duration::from_secs(600),
        }),
        status_written: Some(now),
        usage_written: Some(usage(10.0, 1)),
    };
    let plan = plan_heartbeat(
        &mut memory,
        &robot,
        None,
        false,
        Some(&usage(10.0, 1)),
        Some(&full),
        now,
        Coalescing::default(),
    );
    assert!(plan.status.unwrap().conditions.is_some());
}

#[test]
fn usage_changes_that_matter() {
    assert!(!usage(10.0, 1).moved_materially(&usage(25.0, 1)));
    assert!(usage(10.0, 1).moved_materially(&usage(35.0, 1)));
    assert!(usage(10.0, 1).moved_materially(&usage(10.0, 2)));
}

#[test]
fn last_will_marks_the_robot_disconnected_once() {
    let now = Timestamp::now();
    let down = connected(&[], false, now).unwrap();
    assert_eq!(down[0].status, ConditionStatus::False);
    assert_eq!(down[0].reason.as_deref(), Some("Disconnected"));
    assert_eq!(connected(&down, false, now), None, "no second write");
}

#[test]
fn restarts_on_the_robot_reach_the_status_and_a_report_without_them_keeps_them() {
    let running = TaskBuilder::new().target("rb1").state(TaskState::Running, 1, 3).0;
    let restarted = StatusUpdate {
        restarts: k8s4r_api::RestartStatus {
            restart_count: 3,
            last_exit_code: Some(1),
            last_restart_time: Some(now()),
        },
        ..update(1, 4, TaskState::Running)
    };
    let Ok(StatusDecision::Apply(patch)) = decide_status(&restarted, "u1", "rb1", Some(&running), now())
    else {
        panic!("not applied");
    };
    assert_eq!(patch.restarts.as_ref(), Some(&restarted.restarts));
    let body = serde_json::to_value(&patch).unwrap();
    assert_eq!(body["restartCount"], 3);

    let Ok(StatusDecision::Apply(patch)) = decide_status(
        &update(1, 5, TaskState::Failed),
        "u1",
        "rb1",
        Some(&running),
        now(),
    ) else {
        panic!("not applied");
    };
    let body = serde_json::to_value(&patch).unwrap();
    assert!(
        body.get("restartCount").is_none(),
        "a merge patch without restarts leaves them: {body}"
    );
}

#[test]
fn status_updates_apply_in_order() {
    let task = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .0;
    let decision = decide_status(&update(1, 1, TaskState::Running), "u1", "rb1", Some(&task), now());
    assert!(
        matches!(decision, Ok(StatusDecision::Apply(ref p)) if p.state == TaskState::Running && p.seq == 1)
    );
    let running = TaskBuilder::new().target("rb1").state(TaskState::Running, 1, 3).0;
    assert_eq!(
        decide_status(
            &update(1, 2, TaskState::Running),
            "u1",
            "rb1",
            Some(&running),
            now()
        ),
        Ok(StatusDecision::Ignore(Ignored::Duplicate))
    );
    assert_eq!(
        decide_status(
            &update(1, 3, TaskState::Running),
            "u1",
            "rb1",
            Some(&running),
            now()
        ),
        Ok(StatusDecision::Ignore(Ignored::Duplicate))
    );
    assert!(matches!(
        decide_status(
            &update(1, 4, TaskState::Completed),
            "u1",
            "rb1",
            Some(&running),
            now()
        ),
        Ok(StatusDecision::Apply(_))
    ));
}

#[test]
fn a_new_attempt_reads_the_old_seq_as_zero() {
    // The manager started attempt 2 without resetting seq.
    let task = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 2, 9)
        .closed_attempt(1)
        .0;
    assert!(matches!(
        decide_status(&update(2, 1, TaskState::Running), "u1", "rb1", Some(&task), now()),
        Ok(StatusDecision::Apply(_))
    ));
    assert_eq!(
        decide_status(
            &update(1, 10, TaskState::Running),
            "u1",
            "rb1",
            Some(&task),
            now()
        ),
        Ok(StatusDecision::Ignore(Ignored::StaleAttempt))
    );
}

#[test]
fn terminal_state_is_kept() {
    let done = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Completed, 1, 5)
        .0;
    assert_eq!(
        decide_status(&update(1, 6, TaskState::Running), "u1", "rb1", Some(&done), now()),
        Ok(StatusDecision::Ignore(Ignored::Terminal))
    );
    // The manager closed attempt 1 and waits to retry: a late report of
    // attempt 1 cannot reopen it.
    let pending = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Pending, 1, 5)
        .closed_attempt(1)
        .0;
    assert_eq!(
        decide_status(
            &update(1, 6, TaskState::Running),
            "u1",
            "rb1",
            Some(&pending),
            now()
        ),
        Ok(StatusDecision::Ignore(Ignored::StaleAttempt))
    );
}

#[test]
fn bad_status_updates_are_rejected_with_a_reason() {
    let task = TaskBuilder::new().target("rb1").state(TaskState::Running, 1, 1).0;
    let outcome = |r: Result<StatusDecision, Rejection>| r.unwrap_err().outcome();
    assert_eq!(
        outcome(decide_status(
            &update(1, 2, TaskState::Running),
            "u1",
            "rb2",
            Some(&task),
            now()
        )),
        "rejected_not_assigned"
    );
    assert_eq!(
        outcome(decide_status(
            &update(1, 2, TaskState::Running),
            "u1",
            "rb1",
            None,
            now()
        )),
        "rejected_unknown_task"
    );
    assert_eq!(
        outcome(decide_status(
            &update(3, 1, TaskState::Running),
            "u1",
            "rb1",
            Some(&task),
            now()
        )),
        "rejected_future_attempt"
    );
    assert_eq!(
        outcome(decide_status(
            &update(1, 2, TaskState::Pending),
            "u1",
            "rb1",
            Some(&task),
            now()
        )),
        "rejected_invalid_state"
    );
    assert_eq!(
        outcome(decide_status(
            &update(1, 2, TaskState::Running),
            "u2",
            "rb1",
            Some(&task),
            now()
        )),
        "rejected_task_mismatch"
    );
}

#[test]
fn dispatch_once_per_attempt_and_again_after_a_restart() {
    let task = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .0;
    let online = Some(RobotPhase::Online);
    assert_eq!(
        decide_task(&task, online, None, now()),
        TaskAction::Dispatch {
            robot: "rb1".into(),
            attempt: 1
        }
    );
    let sent = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .dispatched(1)
        .0;
    assert_eq!(decide_task(&sent, online, Some(1), now()), TaskAction::Nothing);
    // A new process does not know what the broker took: it sends again,
    // and the robot drops an attempt it accepted before.
    assert!(matches!(
        decide_task(&sent, online, None, now()),
        TaskAction::Dispatch { attempt: 1, .. }
    ));
    let retry = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 2, 0)
        .dispatched(1)
        .0;
    assert!(matches!(
        decide_task(&retry, online, Some(1), now()),
        TaskAction::Dispatch { attempt: 2, .. }
    ));
    let running = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Running, 1, 1)
        .dispatched(1)
        .0;
    assert_eq!(decide_task(&running, online, None, now()), TaskAction::Nothing);
    let pending = TaskBuilder::new().state(TaskState::Pending, 0, 0).0;
    assert_eq!(decide_task(&pending, None, None, now()), TaskAction::Nothing);
}

#[test]
fn a_dispatch_is_counted_expired_only_when_no_server_began_to_send_it() {
    let late = |b: TaskBuilder| {
        let mut task = b.target("rb1").state(TaskState::Dispatching, 1, 0).0;
        task.status.as_mut().unwrap().dispatch_deadline = Some(t("2020-01-01T00:00:00Z"));
        task
    };
    let unsent = late(TaskBuilder::new());
    assert!(expired_unsent(&unsent, now()));
    assert_eq!(
        decide_task(&unsent, Some(RobotPhase::Online), None, now()),
        TaskAction::Nothing
    );
    // Being sent (the record written before the publish) or sent: not expired.
    let mut sending = late(TaskBuilder::new());
    sending
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(k8s4r_api::names::ANNOTATION_SENDING_ATTEMPT.into(), "1".into());
    assert!(!expired_unsent(&sending, now()));
    assert!(!expired_unsent(&late(TaskBuilder::new().dispatched(1)), now()));
    // Deleted: it goes another way.
    assert!(!expired_unsent(&late(TaskBuilder::new().deleting()), now()));
    // Before its deadline it is sent, not counted.
    let mut early = late(TaskBuilder::new());
    early.status.as_mut().unwrap().dispatch_deadline = Some(t("2999-01-01T00:00:00Z"));
    assert!(!expired_unsent(&early, now()));
    assert!(matches!(
        decide_task(&early, Some(RobotPhase::Online), None, now()),
        TaskAction::Dispatch { .. }
    ));
}

#[test]
fn deletion_cancels_and_holds_the_finalizer_until_the_robot_reports() {
    let running = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Running, 1, 2)
        .dispatched(1)
        .finalizer()
        .deleting();
    assert_eq!(
        decide_task(&running.0, Some(RobotPhase::Online), None, now()),
        TaskAction::CancelAndWait {
            robot: "rb1".into(),
            attempt: 1
        }
    );
    assert!(matches!(
        decide_task(&running.0, Some(RobotPhase::Offline), None, now()),
        TaskAction::CancelAndRelease { .. }
    ));
    let ended = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Failed, 1, 3)
        .dispatched(1)
        .finalizer()
        .deleting()
        .0;
    assert_eq!(
        decide_task(&ended, Some(RobotPhase::Online), None, now()),
        TaskAction::Release
    );
    let unsent = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .finalizer()
        .deleting()
        .0;
    assert!(matches!(
        decide_task(&unsent, Some(RobotPhase::Online), None, now()),
        TaskAction::CancelAndRelease { .. }
    ));
    let released = TaskBuilder::new().state(TaskState::Running, 1, 0).deleting().0;
    assert_eq!(
        decide_task(&released, Some(RobotPhase::Online), None, now()),
        TaskAction::Nothing
    );
}

fn lost_attempt(robot: &str, attempt: u32) -> AttemptRecord {
    AttemptRecord {
        start_time: None,
        attempt,
        robot: Some(robot.into()),
        state: TaskState::Failed,
        exit_code: None,
        reason: Some(TaskReason::RobotLost),
        message: None,
        finish_time: None,
    }
}

#[test]
fn the_first_report_of_an_attempt_is_stamped_with_the_servers_clock() {
    let task = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .0;
    let mut running = update(1, 1, TaskState::Running);
    running.start_time = Some(t("1999-01-01T00:00:00Z")); // the robot's clock is off
    let StatusDecision::Apply(patch) = decide_status(&running, "u1", "rb1", Some(&task), now()).unwrap()
    else {
        panic!("applied");
    };
    assert_eq!(patch.observed_running_time, Some(now()));
    let mut seen = task.clone();
    seen.status.as_mut().unwrap().observed_running_time = Some(t("2026-11-22T09:00:00Z"));
    let StatusDecision::Apply(patch) = decide_status(&running, "u1", "rb1", Some(&seen), now()).unwrap()
    else {
        panic!("applied");
    };
    assert_eq!(patch.observed_running_time, None, "set once per attempt");
}

#[test]
fn a_replaced_attempts_late_completion_wins_under_keep_original_only() {
    let mut task = TaskBuilder::new().target("rb2").state(TaskState::Running, 2, 5).0;
    task.status
        .as_mut()
        .unwrap()
        .attempts
        .push(lost_attempt("rb1", 1));
    let done = update(1, 9, TaskState::Completed);
    let StatusDecision::Apply(patch) = decide_status(&done, "u1", "rb1", Some(&task), now()).unwrap() else {
        panic!("keepOriginal is the default");
    };
    assert_eq!(patch.state, TaskState::Completed);
    assert!(patch.message.unwrap().contains("replacement attempt 2"));
    // A late failure, another robot's report, or keepReplacement: stale.
    let failed = update(1, 9, TaskState::Failed);
    assert_eq!(
        decide_status(&failed, "u1", "rb1", Some(&task), now()),
        Ok(StatusDecision::Ignore(Ignored::StaleAttempt))
    );
    assert_eq!(
        decide_status(&done, "u1", "rb3", Some(&task), now()),
        Err(Rejection::NotAssigned {
            task: "default/job-a-0".into(),
            robot: "rb3".into(),
            assigned: Some("rb2".into())
        })
    );
    task.spec.disconnect = Some(k8s4r_api::DisconnectPolicy {
        reconcile: Some(k8s4r_api::Reconcile::KeepReplacement),
        ..Default::default()
    });
    // Under keepReplacement the late completion does not decide the Task,
    // but it is kept in the attempt's record: the robot is told it was
    // recorded (the simulation found it thrown away, seed 52).
    let StatusDecision::Record(record) = decide_status(&done, "u1", "rb1", Some(&task), now()).unwrap()
    else {
        panic!("recorded in attempts[]");
    };
    let kept = record.attempts.iter().find(|a| a.attempt == 1).unwrap();
    assert_eq!(kept.state, TaskState::Completed);
    assert_eq!(kept.exit_code, Some(0));
    assert!(kept.message.as_deref().unwrap().contains("keepReplacement"));
    // Once kept, a repeat is a duplicate.
    task.status.as_mut().unwrap().attempts = record.attempts;
    assert_eq!(
        decide_status(&done, "u1", "rb1", Some(&task), now()),
        Ok(StatusDecision::Ignore(Ignored::Duplicate))
    );
}

#[test]
fn under_keep_original_a_late_completion_wins_over_a_failed_replacement() {
    // The simulation's seed 1002291: attempt 2 was replaced, the
    // replacements failed (Disconnected), and attempt 2's completion came
    // while the Task waited for its next retry.
    let mut task = TaskBuilder::new().target("rb2").state(TaskState::Failed, 4, 5).0;
    task.status.as_mut().unwrap().reason = Some(TaskReason::Disconnected);
    task.status
        .as_mut()
        .unwrap()
        .attempts
        .push(lost_attempt("rb3", 2));
    let StatusDecision::Apply(patch) = decide_status(
        &update(2, 9, TaskState::Completed),
        "u1",
        "rb3",
        Some(&task),
        now(),
    )
    .unwrap() else {
        panic!("the original's completion wins");
    };
    assert_eq!(patch.state, TaskState::Completed);
}

#[test]
fn a_completion_after_the_retry_was_written_and_before_the_replacement_stands() {
    // The simulation's seed 30: the manager failed attempt 1 and wrote the
    // retry (pending again at attempt 1, the attempt recorded as lost); the
    // completion came before the next attempt was placed.
    let mut task = TaskBuilder::new().target("rb1").state(TaskState::Pending, 1, 3).0;
    task.status
        .as_mut()
        .unwrap()
        .attempts
        .push(lost_attempt("rb1", 1));
    let done = update(1, 4, TaskState::Completed);
    let StatusDecision::Apply(patch) = decide_status(&done, "u1", "rb1", Some(&task), now()).unwrap() else {
        panic!("the completion stands");
    };
    assert_eq!(patch.state, TaskState::Completed);
    // Another robot's record, or a failure: stale as before.
    assert_eq!(
        decide_status(&update(1, 4, TaskState::Failed), "u1", "rb1", Some(&task), now()),
        Ok(StatusDecision::Ignore(Ignored::StaleAttempt))
    );
}

#[test]
fn a_completed_task_stops_an_attempt_its_robot_still_runs() {
    // The simulation's seed 71: a late completion under keepOriginal
    // completed the Task while its replacement ran; nothing stopped it.
    let task = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Completed, 2, 5)
        .0;
    let held = TaskAttempt::new("u1", 2);
    assert!(unwanted(&held, "rb1", &task).is_some());
    // A failed attempt's robot lists it until its end is confirmed.
    let failed = TaskBuilder::new().target("rb1").state(TaskState::Failed, 2, 5).0;
    assert!(unwanted(&held, "rb1", &failed).is_none());
}

#[test]
fn a_completion_after_the_manager_gave_the_attempt_up_stands() {
    // Found by the simulation (seed 22): the manager failed attempt 1
    // RobotLost and had not yet retried when the robot's completion came.
    for reconcile in [
        k8s4r_api::Reconcile::KeepOriginal,
        k8s4r_api::Reconcile::KeepReplacement,
    ] {
        let mut task = TaskBuilder::new().target("rb1").state(TaskState::Failed, 1, 3).0;
        task.status.as_mut().unwrap().reason = Some(TaskReason::RobotLost);
        task.spec.disconnect = Some(k8s4r_api::DisconnectPolicy {
            reconcile: Some(reconcile),
            ..Default::default()
        });
        let done = update(1, 4, TaskState::Completed);
        let StatusDecision::Apply(patch) = decide_status(&done, "u1", "rb1", Some(&task), now()).unwrap()
        else {
            panic!("the completion is recorded under {reconcile:?}");
        };
        assert_eq!(patch.state, TaskState::Completed);
        assert_eq!(patch.reason, Some(TaskReason::Completed));
        assert!(patch.message.unwrap().contains("no retry follows"));
        // A late failure changes nothing.
        assert_eq!(
            decide_status(&update(1, 4, TaskState::Failed), "u1", "rb1", Some(&task), now()),
            Ok(StatusDecision::Ignore(Ignored::Terminal))
        );
    }
    // A failure of the task's own stays final.
    let own = TaskBuilder::new().target("rb1").state(TaskState::Failed, 1, 3).0;
    assert_eq!(
        decide_status(
            &update(1, 4, TaskState::Completed),
            "u1",
            "rb1",
            Some(&own),
            now()
        ),
        Ok(StatusDecision::Ignore(Ignored::Terminal))
    );
}

#[test]
fn a_completion_of_a_lost_attempt_stands_after_the_task_failed_waiting_for_a_robot() {
    // Attempt 1 was given up (RobotLost); the task then waited past its
    // Job's pendingDeadlineSeconds and failed Unschedulable. The robot
    // comes back with attempt 1 completed: it stands.
    let mut task = TaskBuilder::new().target("rb1").state(TaskState::Failed, 1, 3).0;
    let status = task.status.as_mut().unwrap();
    status.reason = Some(TaskReason::Unschedulable);
    status.attempts.push(lost_attempt("rb1", 1));
    let done = update(1, 4, TaskState::Completed);
    let StatusDecision::Apply(patch) = decide_status(&done, "u1", "rb1", Some(&task), now()).unwrap() else {
        panic!("the completion is recorded");
    };
    assert_eq!(patch.state, TaskState::Completed);
    // From another robot, it does not.
    assert!(!matches!(
        decide_status(&done, "u1", "rb2", Some(&task), now()),
        Ok(StatusDecision::Apply(_))
    ));
}

#[test]
fn an_expired_dispatch_is_not_published() {
    let mut task = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .0;
    task.status.as_mut().unwrap().dispatch_deadline = Some(t("2026-11-22T10:00:30Z"));
    assert!(matches!(
        decide_task(&task, Some(RobotPhase::Online), None, now()),
        TaskAction::Dispatch { .. }
    ));
    assert_eq!(
        decide_task(&task, Some(RobotPhase::Online), None, t("2026-11-22T10:00:30Z")),
        TaskAction::Nothing
    );
}

/// A Task with `uid`, on `robot`, running `attempt` with status `seq`.
fn running(uid: &str, robot: &str, attempt: u32, seq: u64) -> Task {
    let mut task = TaskBuilder::new()
        .target(robot)
        .state(TaskState::Running, attempt, seq)
        .0;
    task.metadata.uid = Some(uid.into());
    task
}

#[test]
fn reconcile_cancels_what_no_task_wants_and_fails_what_the_robot_lost() {
    let held = |uid: &str, attempt: u32| TaskAttempt::new(uid, attempt);
    let current = running("now", "rb1", 2, 4);
    let elsewhere = running("moved", "rb2", 1, 1);
    let lost = running("lost", "rb1", 3, 7);
    let ahead = running("ahead", "rb1", 1, 1);
    let mut late = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Dispatching, 1, 0)
        .0;
    late.metadata.uid = Some("late".into());
    late.status.as_mut().unwrap().dispatch_deadline = Some(t("2026-11-22T09:59:00Z"));
    let mut sent = late.clone();
    sent.metadata.uid = Some("sent".into());
    sent.status.as_mut().unwrap().dispatch_deadline = Some(t("2026-11-22T09:59:55Z"));
    let tasks = [current.clone(), elsewhere.clone(), lost.clone(), ahead.clone()];
    let lookup = |uid: &str| {
        tasks
            .iter()
            .find(|t| t.metadata.uid.as_deref() == Some(uid))
            .cloned()
            .map(std::sync::Arc::new)
    };
    let reported = [
        held("now", 2),
        held("gone", 1),
        held("moved", 1),
        held("now", 1),
        // Newer than this server's cache: left alone.
        held("ahead", 2),
    ];
    let holding = Holding {
        held: &reported,
        complete: true,
        last_seq: Some(7),
        sent_at: Some(now()),
    };
    let assigned = [&current, &lost, &late, &sent, &ahead];
    let plan = plan_reconcile("rb1", holding, lookup, assigned, now());
    let cancelled: Vec<(&str, u32)> = plan
        .cancel
        .iter()
        .map(|(a, _)| (a.uid.as_str(), a.attempt))
        .collect();
    assert_eq!(cancelled, [("moved", 1), ("now", 1)]);
    assert_eq!(
        plan.unknown,
        [held("gone", 1)],
        "unknown: cancelled only once that lasts"
    );
    let failed: Vec<(&str, Option<TaskReason>)> = plan
        .lost
        .iter()
        .map(|(uid, p)| (uid.as_str(), p.reason))
        .collect();
    assert_eq!(
        failed,
        [
            ("lost", Some(TaskReason::NotOnRobot)),
            ("late", Some(TaskReason::DispatchTimeout))
        ],
        "a dispatch only 5 s past its deadline may still be on its way"
    );
    assert_eq!(plan.lost[0].1.state, TaskState::Failed);
    // A list older than the Task's last status cannot speak for it.
    let older = Holding {
        last_seq: Some(6),
        ..holding
    };
    let plan = plan_reconcile("rb1", older, lookup, assigned, now());
    assert!(plan.lost.iter().all(|(uid, _)| uid != "lost"), "{plan:?}");
    // A robot that does not say its list is complete loses nothing.
    let partial = Holding {
        complete: false,
        ..holding
    };
    let plan = plan_reconcile("rb1", partial, lookup, assigned, now());
    assert!(plan.lost.is_empty() && plan.cancel.len() == 2);
}

mod connection;
mod eviction;

#[test]
fn a_robots_output_tail_is_kept_to_its_last_64_kib() {
    let task = TaskBuilder::new().target("rb1").state(TaskState::Running, 1, 3).0;
    let mut running = update(1, 4, TaskState::Running);
    // The cut falls inside the two bytes of "é": it moves past them.
    running.output_tail = Some(format!("é{}", "x".repeat(MAX_OUTPUT_TAIL_BYTES - 1)));
    let StatusDecision::Apply(patch) = decide_status(&running, "u1", "rb1", Some(&task), now()).unwrap()
    else {
        panic!("applied");
    };
    let tail = patch.output_tail.unwrap();
    assert_eq!(tail.len(), MAX_OUTPUT_TAIL_BYTES - 1);
    assert!(tail.chars().all(|c| c == 'x'));
}

#[test]
fn a_changed_configuration_is_sent_once_per_generation_the_robot_has_not_reported() {
    use k8s4r_api::config_ref::ConfigRefresh;
    let asked = |task: &mut Task, attempt: u32, generation: u64| {
        let value = serde_json::to_string(&ConfigRefresh {
            attempt,
            generation,
            versions: "ConfigMap/params@2".into(),
            at: None,
        })
        .unwrap();
        task.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(k8s4r_api::names::ANNOTATION_CONFIG_REFRESH.into(), value);
    };
    let mut task = TaskBuilder::new().target("rb1").state(TaskState::Running, 2, 3).0;
    assert_eq!(config_to_send(&task, None), None, "nothing asked");
    asked(&mut task, 2, 1);
    let send = ConfigSend {
        robot: "rb1".into(),
        attempt: 2,
        generation: 1,
    };
    assert_eq!(config_to_send(&task, None), Some(send.clone()));
    assert_eq!(config_to_send(&task, Some((2, 1))), None, "sent by this process");
    assert_eq!(
        config_to_send(&task, Some((1, 7))),
        Some(send),
        "an earlier attempt's"
    );
    // The robot reported it: a new process does not send it again.
    task.status.as_mut().unwrap().config = Some(k8s4r_api::TaskConfigStatus {
        generation: 1,
        ..Default::default()
    });
    assert_eq!(config_to_send(&task, None), None);
    // A request for another attempt, or a task no longer running, gets none.
    asked(&mut task, 1, 5);
    assert_eq!(config_to_send(&task, None), None);
    let mut done = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Completed, 2, 3)
        .0;
    asked(&mut done, 2, 1);
    assert_eq!(config_to_send(&done, None), None);
    let mut deleting = TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Running, 2, 3)
        .deleting()
        .0;
    asked(&mut deleting, 2, 1);
    assert_eq!(config_to_send(&deleting, None), None);
}

#[test]
fn a_report_of_the_configuration_reaches_the_status_with_its_versions_in_one_line() {
    use k8s4r_api::config_ref::{ConfigSource, ObjectKind};
    use k8s4r_api::protocol::ConfigReport;
    let task = TaskBuilder::new().target("rb1").state(TaskState::Running, 1, 3).0;
    let mut running = update(1, 4, TaskState::Running);
    running.config = Some(ConfigReport {
        generation: 2,
        sources: vec![
            ConfigSource {
                kind: ObjectKind::Secret,
                name: "keys".into(),
                resource_version: "9".into(),
            },
            ConfigSource {
                kind: ObjectKind::ConfigMap,
                name: "params".into(),
                resource_version: "12".into(),
            },
        ],
        message: Some("sent SIGHUP to its process group".into()),
    });
    let StatusDecision::Apply(patch) = decide_status(&running, "u1", "rb1", Some(&task), now()).unwrap()
    else {
        panic!("applied");
    };
    let config = patch.config.expect("the configuration");
    assert_eq!(config.versions, "ConfigMap/params@12,Secret/keys@9");
    assert_eq!(config.generation, 2);
    // A report that says nothing of it leaves what the status has.
    let plain = update(1, 5, TaskState::Running);
    let StatusDecision::Apply(patch) = decide_status(&plain, "u1", "rb1", Some(&task), now()).unwrap() else {
        panic!("applied");
    };
    assert!(patch.config.is_none());
    let json = serde_json::to_value(&patch).unwrap();
    assert!(json.get("config").is_none(), "{json}");
    // An older generation than the status records is not written over it.
    let mut recorded = task.clone();
    recorded.status.as_mut().unwrap().config = Some(k8s4r_api::TaskConfigStatus {
        generation: 3,
        ..Default::default()
    });
    let StatusDecision::Apply(patch) = decide_status(&running, "u1", "rb1", Some(&recorded), now()).unwrap()
    else {
        panic!("applied");
    };
    assert!(patch.config.is_none(), "generation 2 after 3");
    // Nothing of it is left out: a field it lacks is cleared (merge patch).
    let running_json = serde_json::to_value(config_status(&ConfigReport::default())).unwrap();
    assert_eq!(running_json["message"], serde_json::Value::Null, "{running_json}");
    assert!(running_json["sources"].is_array(), "{running_json}");
}
