//! The core on its own: events in, commands out, on a clock the test
//! moves, with a disk in memory that outlives a "restart" (a new core).

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::backoff::Jitter;
use k8s4r_api::protocol::{
    encode, Dispatch, Heartbeat, Register, RegisterResponse, StatusAck, StatusUpdate, Topics,
};
use k8s4r_api::{DeviceInfo, RobotPhase, TaskState, TaskTemplate};

use super::*;

type Mem = Memory;

const ROBOT: &str = "r1";

fn at(secs: u64) -> Now {
    Now {
        mono: Duration::from_secs(secs),
        wall: Timestamp::from_second(1_800_000_000 + secs as i64).unwrap(),
    }
}

fn core(session: &str, disk: &Mem) -> Core {
    core_holding(session, disk, Duration::ZERO)
}

/// A core that holds an attempt's report that it runs for `hold`.
fn core_holding(session: &str, disk: &Mem, hold: Duration) -> Core {
    let settings = Settings {
        robot_id: ROBOT.into(),
        topic_prefix: "k8s4r".into(),
        session_id: session.into(),
        template: Register::new(ROBOT, "test", DeviceInfo::default()),
        heartbeat_interval: Duration::from_secs(30),
        status_hold: hold,
        register_retry: (Duration::from_secs(1), Duration::from_secs(8)),
        max_outstanding: 16,
        jitter: Jitter::with_seed(7),
    };
    Core::new(settings, Vec::new(), &disk.admitted)
}

fn topics() -> Topics {
    Topics::new("k8s4r")
}

/// Connects and answers the registration Online; returns the commands of
/// the approval.
fn approve(core: &mut Core, disk: &mut Mem, now: Now) -> Vec<Command> {
    let out = core.connected(now, disk);
    let nonce = out
        .iter()
        .find_map(|c| match c {
            Command::Publish {
                payload: Payload::Register(r),
                ..
            } => r.nonce.clone(),
            _ => None,
        })
        .expect("a registration on connect");
    let response = RegisterResponse {
        status_acks: true,
        nonce: Some(nonce),
        ..RegisterResponse::new(RobotPhase::Online, None)
    };
    core.message(&topics().response(ROBOT), &encode(&response), false, now, disk)
}

fn heartbeats(out: &[Command]) -> Vec<Heartbeat> {
    out.iter()
        .filter_map(|c| match c {
            Command::Publish {
                payload: Payload::Heartbeat(h),
                ..
            } => Some((**h).clone()),
            _ => None,
        })
        .collect()
}

fn starts(out: &[Command]) -> Vec<(String, u32)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Start(r) => Some((r.uid.clone(), r.attempt)),
            _ => None,
        })
        .collect()
}

/// Connects; the broker acknowledges everything the core publishes on
/// the connection. Returns the registration's nonce.
fn connect_all_acknowledged(core: &mut Core, disk: &mut Mem, now: Now) -> String {
    let out = core.connected(now, disk);
    let mut nonce = None;
    let mut pkid = 0;
    for command in &out {
        if let Command::Publish { payload, .. } = command {
            if let Payload::Register(r) = payload {
                nonce = r.nonce.clone();
            }
            pkid += 1;
            core.sent(pkid);
            core.puback(pkid, now, disk);
        }
    }
    nonce.expect("a registration on connect")
}

fn spec() -> TaskTemplate {
    TaskTemplate {
        driver: "raw_exec".into(),
        command: "true".into(),
        ..Default::default()
    }
}

fn dispatch(core: &mut Core, disk: &mut Mem, attempt: u32, now: Now) -> Vec<Command> {
    let d = Dispatch::new("u1", "default/t", attempt, spec());
    core.message(&topics().dispatch(ROBOT), &encode(&d), false, now, disk)
}

#[test]
fn a_connection_subscribes_says_online_and_registers_and_approval_starts_heartbeats() {
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    let out = c.connected(at(10), &mut disk);
    assert!(matches!(&out[0], Command::Subscribe(t) if !t.is_empty()));
    assert!(
        matches!(&out[1], Command::Publish { retain: true, .. }),
        "online=true, retained"
    );
    assert!(matches!(
        &out[2],
        Command::Publish {
            payload: Payload::Register(_),
            ..
        }
    ));
    assert!(
        heartbeats(&c.tick(at(10), &mut disk)).is_empty(),
        "no heartbeat before approval"
    );
    approve(&mut c, &mut disk, at(11));
    let out = c.tick(at(11), &mut disk);
    let sent = heartbeats(&out);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].session.as_deref(), Some("s1"));
    assert!(
        c.next_wake().unwrap() > at(11).mono,
        "the next heartbeat is scheduled later"
    );
}

#[test]
fn an_attempt_starts_once_recorded_and_never_again_after_a_restart() {
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(10));
    assert_eq!(
        starts(&dispatch(&mut c, &mut disk, 1, at(11))),
        vec![("u1".into(), 1)]
    );
    assert_eq!(
        disk.admitted,
        vec![("u1".to_owned(), 1)],
        "recorded before the start"
    );
    assert!(
        starts(&dispatch(&mut c, &mut disk, 1, at(12))).is_empty(),
        "a redelivery"
    );
    // The agent restarts: memory gone, the disk kept. The broker delivers
    // the same dispatch again to the new process.
    let mut c = core("s2", &disk);
    approve(&mut c, &mut disk, at(20));
    assert!(
        starts(&dispatch(&mut c, &mut disk, 1, at(21))).is_empty(),
        "ran before the restart"
    );
    assert_eq!(
        starts(&dispatch(&mut c, &mut disk, 2, at(22))),
        vec![("u1".into(), 2)]
    );
}

#[test]
fn an_acceptance_that_cannot_be_recorded_does_not_start_and_says_why() {
    let mut disk = Mem {
        admissions: Admissions::Fail,
        ..Mem::default()
    };
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(10));
    let out = dispatch(&mut c, &mut disk, 1, at(11));
    assert!(starts(&out).is_empty());
    let failed = disk.outbox.values().next().expect("a status");
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(k8s4r_api::TaskReason::StartFailed));
}

#[test]
fn an_ended_attempt_stays_listed_until_the_server_confirms_its_status() {
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(10));
    dispatch(&mut c, &mut disk, 1, at(11));
    let mut done = StatusUpdate::new("u1", 1, 0, TaskState::Completed);
    done.reason = Some(k8s4r_api::TaskReason::Completed);
    let out = c.status(done, at(12), &mut disk);
    assert!(out
        .iter()
        .any(|cmd| matches!(cmd, Command::Publish { topic, .. } if topic == &topics().status(ROBOT, "u1"))));
    let listed = |c: &mut Core, disk: &mut Mem, t: u64| {
        let out = c.tick(at(t), disk);
        heartbeats(&out)
            .pop()
            .map(|h| h.held.running.iter().map(|a| a.attempt).collect::<Vec<_>>())
    };
    assert_eq!(
        listed(&mut c, &mut disk, 100),
        Some(vec![1]),
        "ended, not yet confirmed"
    );
    let seq = *disk.outbox.keys().next().unwrap();
    c.message(
        &topics().status_ack(ROBOT),
        &encode(&StatusAck::new(vec![seq])),
        false,
        at(101),
        &mut disk,
    );
    assert!(disk.outbox.is_empty());
    assert_eq!(
        listed(&mut c, &mut disk, 200),
        Some(vec![]),
        "confirmed: no longer held"
    );
}

#[test]
fn a_dispatch_while_leaving_is_refused_with_a_status_and_a_retained_command_is_ignored() {
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(10));
    let d = Dispatch::new("u1", "default/t", 1, spec());
    assert!(c
        .message(&topics().dispatch(ROBOT), &encode(&d), true, at(11), &mut disk)
        .is_empty());
    c.leave(&mut disk);
    assert!(starts(&dispatch(&mut c, &mut disk, 1, at(12))).is_empty());
    let refused = disk.outbox.values().next().expect("a status");
    assert_eq!(refused.reason, Some(k8s4r_api::TaskReason::AgentShutdown));
    assert!(
        heartbeats(&c.tick(at(100), &mut disk)).is_empty(),
        "no heartbeats while leaving"
    );
}

#[test]
fn a_copy_of_an_accepted_attempt_during_shutdown_fails_nothing() {
    // A restarted server sends a still-dispatching attempt again; the agent
    // took it already and is shutting down (a restart: the task goes on).
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(10));
    assert_eq!(
        starts(&dispatch(&mut c, &mut disk, 1, at(11))),
        vec![("u1".into(), 1)]
    );
    c.leave(&mut disk);
    let queued = disk.outbox.len();
    assert!(dispatch(&mut c, &mut disk, 1, at(12)).is_empty());
    assert_eq!(disk.outbox.len(), queued, "no status for the copy");
    // A new attempt is still refused with a status.
    assert!(starts(&dispatch(&mut c, &mut disk, 2, at(13))).is_empty());
    let refused = disk.outbox.values().last().expect("a status");
    assert_eq!(
        (refused.attempt, refused.reason),
        (2, Some(k8s4r_api::TaskReason::AgentShutdown))
    );
}

#[test]
fn a_publish_the_client_refused_goes_out_again() {
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(10));
    let out = c.status(
        StatusUpdate::new("u1", 1, 0, TaskState::Running),
        at(10),
        &mut disk,
    );
    assert_eq!(out.len(), 1);
    c.withdraw_last();
    let again = c.tick(at(11), &mut disk);
    assert!(again
        .iter()
        .any(|cmd| matches!(cmd, Command::Publish { topic, .. } if topic == &topics().status(ROBOT, "u1"))));
}

#[test]
fn a_status_the_broker_took_before_the_registration_answer_waits_for_the_server() {
    // A restarted agent sends its outbox as soon as it connects; the
    // broker's PUBACK comes before the registration's answer. The status
    // must wait for the server's confirmation all the same: the server
    // acknowledges to the broker before it writes.
    let mut disk = Mem::default();
    let seq = disk.push(StatusUpdate::new("u1", 1, 0, TaskState::Completed));
    let mut c = core("s2", &disk);
    // online, register, the status: all acknowledged by the broker.
    connect_all_acknowledged(&mut c, &mut disk, at(10));
    assert!(
        disk.outbox.contains_key(&seq),
        "kept until the server says it applied it"
    );
    approve(&mut c, &mut disk, at(11));
    assert!(
        disk.outbox.contains_key(&seq),
        "the server confirms statuses: still kept"
    );
    c.message(
        &topics().status_ack(ROBOT),
        &encode(&StatusAck::new(vec![seq])),
        false,
        at(12),
        &mut disk,
    );
    assert!(disk.outbox.is_empty());
}

#[test]
fn against_a_server_that_confirms_nothing_the_brokers_acknowledgement_settles() {
    let mut disk = Mem::default();
    let seq = disk.push(StatusUpdate::new("u1", 1, 0, TaskState::Completed));
    let mut c = core("s2", &disk);
    let nonce = connect_all_acknowledged(&mut c, &mut disk, at(10));
    assert!(disk.outbox.contains_key(&seq));
    let old = RegisterResponse {
        nonce: Some(nonce),
        ..RegisterResponse::new(RobotPhase::Online, None)
    };
    c.message(&topics().response(ROBOT), &encode(&old), false, at(11), &mut disk);
    assert!(
        disk.outbox.is_empty(),
        "the broker had it, and that is all this server offers"
    );
}

#[test]
fn a_running_tasks_output_is_not_kept_while_the_link_is_down() {
    let mut disk = Mem::default();
    let mut c = core("s1", &disk);
    approve(&mut c, &mut disk, at(1));
    let mut running = StatusUpdate::new("u1", 1, 0, TaskState::Running);
    c.status(running.clone(), at(2), &mut disk);
    let output = |text: &str| {
        let mut update = StatusUpdate::new("u1", 1, 0, TaskState::Running);
        update.output_tail = Some(text.to_owned());
        update
    };
    c.status(output("at waypoint 3\n"), at(2), &mut disk);
    assert_eq!(disk.outbox.len(), 2, "connected: journaled and sent");
    c.disconnected();
    c.status(output("at waypoint 4\n"), at(2), &mut disk);
    c.status(output("at waypoint 5\n"), at(2), &mut disk);
    assert_eq!(disk.outbox.len(), 2, "made while cut off: not journaled");
    // The link is back: the latest goes, once.
    c.connected(at(5), &mut disk);
    assert_eq!(disk.outbox.len(), 3);
    let last = disk.outbox.values().last().unwrap();
    assert_eq!(last.output_tail.as_deref(), Some("at waypoint 5\n"));
    c.connected(at(6), &mut disk);
    assert_eq!(disk.outbox.len(), 3, "sent once");
    // Cut off again, then the attempt ends: its late output never goes.
    c.disconnected();
    c.status(output("at waypoint 6\n"), at(2), &mut disk);
    running.state = TaskState::Completed;
    c.status(running, at(2), &mut disk);
    assert_eq!(disk.outbox.len(), 4, "the end is kept whatever the link");
    c.connected(at(7), &mut disk);
    assert_eq!(disk.outbox.len(), 4, "no running status after the end");
}

/// The status publishes among `out`.
fn statuses(out: &[Command]) -> usize {
    out.iter()
        .filter(|cmd| matches!(cmd, Command::Publish { topic, .. } if topic == &topics().status(ROBOT, "u1")))
        .count()
}

/// A core holding starts for 5 s, approved at 10 s, whose attempt 1 of
/// "u1" started at 11 s: its start report is held.
fn started_and_held(disk: &mut Mem) -> Core {
    let mut c = core_holding("s1", disk, Duration::from_secs(5));
    approve(&mut c, disk, at(10));
    dispatch(&mut c, disk, 1, at(11));
    let mut running = StatusUpdate::new("u1", 1, 0, TaskState::Running);
    running.start_time = Some(at(11).wall);
    assert_eq!(statuses(&c.status(running, at(11), disk)), 0, "held");
    c
}

#[test]
fn an_attempt_that_ends_within_the_hold_is_reported_once_with_its_start() {
    let mut disk = Mem::default();
    let mut c = core_holding("s1", &disk, Duration::from_secs(5));
    approve(&mut c, &mut disk, at(10));
    assert_eq!(
        starts(&dispatch(&mut c, &mut disk, 1, at(11))),
        vec![("u1".into(), 1)]
    );
    let mut running = StatusUpdate::new("u1", 1, 0, TaskState::Running);
    running.start_time = Some(at(11).wall);
    running.task_name = Some("default/t".into());
    assert_eq!(statuses(&c.status(running, at(11), &mut disk)), 0, "held");
    assert!(disk.outbox.is_empty(), "not journaled while held");
    assert_eq!(statuses(&c.tick(at(12), &mut disk)), 0, "still held");
    assert!(
        c.running().to_vec().iter().any(|a| a.uid == "u1"),
        "the robot lists the attempt as held all along"
    );
    let mut done = StatusUpdate::new("u1", 1, 0, TaskState::Completed);
    done.exit_code = Some(0);
    done.finish_time = Some(at(13).wall);
    assert_eq!(
        statuses(&c.status(done, at(13), &mut disk)),
        1,
        "the end goes at once"
    );
    let sent: Vec<_> = disk.outbox.values().cloned().collect();
    assert_eq!(sent.len(), 1, "one report: {sent:?}");
    assert_eq!(sent[0].state, TaskState::Completed);
    assert_eq!(sent[0].start_time, Some(at(11).wall), "with the start it merged");
    assert_eq!(sent[0].exit_code, Some(0));
    assert_eq!(statuses(&c.tick(at(20), &mut disk)), 0, "nothing left to send");
    assert_eq!(disk.outbox.len(), 1);
}

#[test]
fn a_start_still_running_at_the_hold_s_end_goes_then_with_what_came_meanwhile() {
    let mut disk = Mem::default();
    let mut c = started_and_held(&mut disk);
    let output = |text: &str| {
        let mut update = StatusUpdate::new("u1", 1, 0, TaskState::Running);
        update.output_tail = Some(text.to_owned());
        update
    };
    assert_eq!(statuses(&c.status(output("loading map\n"), at(12), &mut disk)), 0);
    assert_eq!(statuses(&c.tick(at(15), &mut disk)), 0, "before the hold's end");
    assert_eq!(statuses(&c.tick(at(16), &mut disk)), 1, "at its end");
    let sent: Vec<_> = disk.outbox.values().cloned().collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].state, sent[0].start_time, sent[0].output_tail.as_deref()),
        (TaskState::Running, Some(at(11).wall), Some("loading map\n"))
    );
    // Output after the start went is not held.
    assert_eq!(
        statuses(&c.status(output("at waypoint 1\n"), at(17), &mut disk)),
        1
    );
}

#[test]
fn a_held_start_goes_into_the_outbox_when_the_agent_leaves() {
    let mut disk = Mem::default();
    let mut c = core_holding("s1", &disk, Duration::from_secs(5));
    approve(&mut c, &mut disk, at(10));
    dispatch(&mut c, &mut disk, 1, at(11));
    c.status(
        StatusUpdate::new("u1", 1, 0, TaskState::Running),
        at(11),
        &mut disk,
    );
    assert!(disk.outbox.is_empty());
    let out = c.leave(&mut disk);
    assert_eq!(statuses(&out), 1);
    assert_eq!(
        disk.outbox.values().map(|u| u.state).collect::<Vec<_>>(),
        vec![TaskState::Running],
        "kept for the next process, whatever this one still manages to send"
    );
    // While leaving, a report goes at once.
    let mut again = StatusUpdate::new("u1", 1, 0, TaskState::Running);
    again.restarts.restart_count = 1;
    assert_eq!(statuses(&c.status(again, at(12), &mut disk)), 1);
}

#[test]
fn a_held_start_with_output_merged_is_journaled_even_while_the_link_is_down() {
    let mut disk = Mem::default();
    let mut c = started_and_held(&mut disk);
    let mut output = StatusUpdate::new("u1", 1, 0, TaskState::Running);
    output.output_tail = Some("loading map\n".into());
    c.status(output.clone(), at(12), &mut disk);
    c.disconnected();
    c.tick(at(16), &mut disk);
    let kept: Vec<_> = disk.outbox.values().cloned().collect();
    assert_eq!(kept.len(), 1, "the start is on disk, not only in memory");
    assert_eq!(kept[0].start_time, Some(at(11).wall));
    // Later output made while cut off does not replace it.
    output.output_tail = Some("at waypoint 1\n".into());
    c.status(output, at(17), &mut disk);
    assert_eq!(disk.outbox.len(), 1);
    assert_eq!(disk.outbox.values().next().unwrap().start_time, Some(at(11).wall));
}
