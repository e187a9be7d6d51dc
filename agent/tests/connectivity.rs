//! The agent against a real Mosquitto: registration, heartbeats, task
//! statuses, broker outages, agent restarts, last will, bad messages.

mod support;

use std::time::Duration;

use k8s4r_api::protocol::{encode, Heartbeat, Online};
use k8s4r_api::{TaskReason, TaskState};
use nix::sys::signal::Signal;
use support::{assert_in_order, eventually, shell_dispatch, Agent, Broker, Server};

const LONG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn registers_then_heartbeats_at_the_configured_cadence() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb1").await;
    let tmp = tempfile::tempdir().unwrap();
    let _agent = Agent::start(
        &broker,
        "rb1",
        &tmp.path().join("state"),
        &["--label", "site=lab"],
    );

    let online: Online = server.next("/online", LONG).await.decode();
    assert!(online.online);
    let register = server.approve("rb1").await;
    assert_eq!(register.robot_id, "rb1");
    assert_eq!(register.labels["site"], "lab");
    assert!(register.drivers.iter().any(|d| d == "raw_exec"), "{register:?}");
    assert!(register.device.cpus >= 1 && register.device.memory_bytes > 0);

    let mut beats = Vec::new();
    while beats.len() < 8 {
        let m = server.next("/heartbeat", LONG).await;
        let hb: Heartbeat = m.decode();
        beats.push((m.at, hb));
    }
    for pair in beats.windows(2) {
        assert_eq!(pair[1].1.seq, pair[0].1.seq + 1, "heartbeat seqs count up");
    }
    let usage = beats[0]
        .1
        .usage
        .as_ref()
        .expect("the first heartbeat carries usage");
    assert!(usage.memory_total_bytes > 0);
    assert!(
        beats.iter().all(|(_, hb)| hb.usage.is_some()),
        "a server that did not allow it gets usage in every heartbeat"
    );
    // 7 intervals of 200ms ±10%: allow for scheduling noise, not for a
    // different cadence.
    let span = beats[7].0 - beats[0].0;
    let mean = span / 7;
    assert!(
        mean >= Duration::from_millis(170) && mean <= Duration::from_millis(260),
        "mean heartbeat interval {mean:?}"
    );
}

/// To a server that allows it, heartbeats leave out usage that has not
/// moved since the figures of a confirmed heartbeat; each registration
/// starts again with usage.
#[tokio::test]
async fn usage_is_left_out_once_a_heartbeat_carrying_it_is_confirmed() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb9").await;
    let tmp = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&broker, "rb9", &tmp.path().join("state"), &[]);
    server.approve_current("rb9").await;
    let mut first = None;
    let mut without = 0;
    for _ in 0..15 {
        let hb: Heartbeat = server.next("/heartbeat", LONG).await.decode();
        first.get_or_insert_with(|| hb.usage.clone());
        without += usize::from(hb.usage.is_none());
        let ack =
            k8s4r_api::protocol::StatusAck::heartbeat(hb.seq, hb.session.clone(), jiff::Timestamp::now());
        server
            .publish(server.topics.status_ack("rb9"), encode(&ack))
            .await;
    }
    assert!(
        first.flatten().is_some(),
        "the first heartbeat of a session carries usage"
    );
    assert!(without > 0, "no heartbeat left its unmoved usage out");
    // A new agent process registers again: its first heartbeat carries
    // usage whatever the last one confirmed.
    agent.kill();
    let _agent = Agent::start(&broker, "rb9", &tmp.path().join("state"), &[]);
    server.approve_current("rb9").await;
    let hb: Heartbeat = server.next("/heartbeat", LONG).await.decode();
    assert!(
        hb.usage.is_some(),
        "the first heartbeat after a registration carries usage"
    );
}

#[tokio::test]
async fn heartbeats_wait_for_approval_and_register_is_retried() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb7").await;
    let tmp = tempfile::tempdir().unwrap();
    let _agent = Agent::start(&broker, "rb7", &tmp.path().join("state"), &[]);
    server.next("/register", LONG).await;
    // Unanswered, the agent registers again (retry 1s with jitter) and sends
    // no heartbeat in between.
    let seen = server.drain(Duration::from_millis(2500)).await;
    assert!(seen.iter().any(|m| m.topic.ends_with("/register")), "no retry");
    assert!(
        !seen.iter().any(|m| m.topic.ends_with("/heartbeat")),
        "heartbeat before approval"
    );
}

#[tokio::test]
async fn dispatch_reports_running_then_completed_in_order() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb2").await;
    let tmp = tempfile::tempdir().unwrap();
    let _agent = Agent::start(&broker, "rb2", &tmp.path().join("state"), &[]);
    server.approve("rb2").await;

    // Longer than the agent's status_hold (1 s), so its start is reported
    // on its own.
    let dispatch = shell_dispatch("u-ok", 1, "echo hello; sleep 2");
    server
        .publish(server.topics.dispatch("rb2"), encode(&dispatch))
        .await;
    // At-least-once: the same dispatch again is ignored.
    server
        .publish(server.topics.dispatch("rb2"), encode(&dispatch))
        .await;

    let updates = server.statuses_until_terminal("u-ok", LONG).await;
    assert_in_order(&updates);
    assert_eq!(updates.first().unwrap().state, TaskState::Running, "{updates:#?}");
    let last = updates.last().unwrap();
    assert_eq!(last.state, TaskState::Completed, "{last:#?}");
    assert_eq!(last.exit_code, Some(0));
    assert!(
        last.output_tail.as_deref().unwrap_or("").contains("hello"),
        "{last:#?}"
    );
    assert!(updates.iter().all(|u| u.attempt == 1 && u.task_uid == "u-ok"));
    // No second run of the duplicate.
    let more = server.drain(Duration::from_millis(700)).await;
    assert!(
        !more.iter().any(|m| m.topic.ends_with("/tasks/u-ok/status")),
        "duplicate ran: {more:?}"
    );
}

/// With the default `status_hold` (1 s), a task that ends within it is
/// reported once: its end, carrying its start time and output.
#[tokio::test]
async fn a_task_that_ends_within_the_status_hold_is_reported_once_with_its_start() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb12").await;
    let tmp = tempfile::tempdir().unwrap();
    let _agent = Agent::start(&broker, "rb12", &tmp.path().join("state"), &[]);
    server.approve("rb12").await;
    let dispatch = shell_dispatch("u-quick", 1, "echo quick; sleep 0.1");
    server
        .publish(server.topics.dispatch("rb12"), encode(&dispatch))
        .await;
    let updates = server.statuses_until_terminal("u-quick", LONG).await;
    assert_eq!(updates.len(), 1, "{updates:#?}");
    let end = &updates[0];
    assert_eq!(
        (end.state, end.exit_code),
        (TaskState::Completed, Some(0)),
        "{end:#?}"
    );
    let (start, finish) = (
        end.start_time.expect("its start"),
        end.finish_time.expect("its end"),
    );
    assert!(start <= finish, "{end:#?}");
    assert!(
        end.output_tail.as_deref().unwrap_or("").contains("quick"),
        "{end:#?}"
    );
}

#[tokio::test]
async fn cancel_stops_a_running_task() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb8").await;
    let tmp = tempfile::tempdir().unwrap();
    let _agent = Agent::start(&broker, "rb8", &tmp.path().join("state"), &[]);
    server.approve("rb8").await;
    server
        .publish(
            server.topics.dispatch("rb8"),
            encode(&shell_dispatch("u-c", 1, "sleep 30")),
        )
        .await;
    let running: k8s4r_api::protocol::StatusUpdate = server.next("/tasks/u-c/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    let cancel = k8s4r_api::protocol::Cancel::new("u-c", 1, "Task deleted");
    server.publish(server.topics.cancel("rb8"), encode(&cancel)).await;
    let updates = server.statuses_until_terminal("u-c", LONG).await;
    let last = updates.last().unwrap();
    assert_eq!(
        (last.state, last.reason),
        (TaskState::Failed, Some(TaskReason::Cancelled)),
        "{last:#?}"
    );
    assert!(last.seq > running.seq);
}

#[tokio::test]
async fn statuses_survive_a_ten_second_broker_outage_in_order() {
    let mut broker = Broker::start();
    let mut server = Server::connect(&broker, "rb3").await;
    let tmp = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&broker, "rb3", &tmp.path().join("state"), &[]);
    server.approve("rb3").await;

    // Finishes during the outage; its output shows it ran through it.
    let dispatch = shell_dispatch("u-out", 1, "sleep 4; echo survived");
    server
        .publish(server.topics.dispatch("rb3"), encode(&dispatch))
        .await;
    let running: k8s4r_api::protocol::StatusUpdate = server.next("/tasks/u-out/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);

    broker.stop();
    // The outage itself is the scenario, not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(agent.is_running(), "agent died during the outage");
    assert!(
        !agent.outbox_files().is_empty(),
        "the completed status waits in the outbox"
    );
    broker.restart();
    server.approve("rb3").await;

    let mut updates = vec![running];
    updates.extend(server.statuses_until_terminal("u-out", LONG).await);
    assert_in_order(&updates);
    let last = updates.last().unwrap();
    assert_eq!(last.state, TaskState::Completed, "{updates:#?}");
    assert!(last.output_tail.as_deref().unwrap_or("").contains("survived"));
    eventually("the outbox to drain", LONG, || {
        agent.outbox_files().is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_status_in_the_outbox_is_delivered_after_sigkill_and_restart() {
    let mut broker = Broker::start();
    let mut server = Server::connect(&broker, "rb4").await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut agent = Agent::start(&broker, "rb4", &state, &[]);
    server.approve("rb4").await;

    server
        .publish(
            server.topics.dispatch("rb4"),
            encode(&shell_dispatch("u-kill", 1, "sleep 3")),
        )
        .await;
    let running: k8s4r_api::protocol::StatusUpdate = server.next("/tasks/u-kill/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    broker.stop();
    // The task ends while the broker is down: its status can only be in the
    // outbox.
    eventually("the completed status in the outbox", LONG, || {
        agent
            .outbox_files()
            .iter()
            .any(|f| {
                std::fs::read_to_string(state.join("outbox").join(f)).is_ok_and(|t| t.contains("completed"))
            })
            .then_some(())
    })
    .await;
    agent.signal(Signal::SIGKILL);
    agent.kill();

    broker.restart();
    let _agent = Agent::start(&broker, "rb4", &state, &[]);
    // At-least-once: the running update may come again if its PUBACK was
    // lost with the broker; the completed one must come, after it.
    let updates = server.statuses_until_terminal("u-kill", LONG).await;
    assert_in_order(&updates);
    let last = updates.last().unwrap();
    assert_eq!(last.state, TaskState::Completed, "{updates:#?}");
    assert!(last.seq > running.seq);
}

/// A dispatch delivered again to a new agent process (its PUBACK was lost
/// with the link before the agent restarted, and the broker's persistent
/// session sends it again; or a server died before it recorded the send
/// and published it again) never runs the attempt a second time: the
/// agent recorded the attempt on disk before it started it. The
/// deterministic simulation found this (seed 2): the new process used to
/// remember only what it still ran.
#[tokio::test]
async fn a_dispatch_delivered_again_after_a_restart_never_runs_twice() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb9").await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let runs = tmp.path().join("runs");
    let mut agent = Agent::start(&broker, "rb9", &state, &[]);
    server.approve("rb9").await;
    let dispatch = shell_dispatch("u-once", 1, &format!("echo ran >> {}", runs.display()));
    server
        .publish(server.topics.dispatch("rb9"), encode(&dispatch))
        .await;
    let updates = server.statuses_until_terminal("u-once", LONG).await;
    assert_eq!(
        updates.last().unwrap().state,
        TaskState::Completed,
        "{updates:#?}"
    );

    agent.signal(Signal::SIGKILL);
    agent.kill();
    let _agent = Agent::start(&broker, "rb9", &state, &[]);
    server.approve("rb9").await;
    server
        .publish(server.topics.dispatch("rb9"), encode(&dispatch))
        .await;
    // A newer attempt of the same task still runs: the record refuses only
    // what was accepted before.
    let next = shell_dispatch("u-once", 2, &format!("echo ran >> {}", runs.display()));
    server.publish(server.topics.dispatch("rb9"), encode(&next)).await;
    let first: Vec<u64> = updates.iter().map(|u| u.seq).collect();
    let mut after = Vec::new();
    while !after
        .iter()
        .any(|u: &k8s4r_api::protocol::StatusUpdate| u.attempt == 2 && u.state.is_terminal())
    {
        after.extend(server.statuses_until_terminal("u-once", LONG).await);
    }
    // What the outbox sends again of attempt 1 carries its old seqs.
    assert!(
        after.iter().all(|u| u.attempt == 2 || first.contains(&u.seq)),
        "attempt 1 ran again: {after:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        2,
        "attempt 1 once, attempt 2 once"
    );
}

/// The stale answer of issue 26: the answer to an agent's registration
/// waited in the broker while the robot was away, the manager gave the
/// attempt up meanwhile, and a dispatch whose deadline has passed waits
/// behind it. The next agent process ignores the answer it did not ask
/// for, takes the server's time from the answer to its own registration,
/// and refuses the expired dispatch instead of running it.
#[tokio::test]
async fn a_stale_registration_answer_never_starts_an_expired_dispatch() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb-stale").await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let marker = tmp.path().join("ran");
    let mut agent = Agent::start(&broker, "rb-stale", &state, &[]);
    let first = server.approve_current("rb-stale").await;
    // The first process took its answer: none is left for the next one.
    eventually("the first agent approved", LONG, || {
        agent.log().contains("registration approved").then_some(())
    })
    .await;
    agent.kill();
    loop {
        let presence: Online = server.next("/online", LONG).await.decode();
        if !presence.online {
            break;
        }
    }

    // Queued for the robot's persistent session: the answer to the last
    // registration, with the server's time of then (ten minutes ago), and
    // a dispatch whose deadline passed a minute ago.
    let now = jiff::Timestamp::now();
    let stale = k8s4r_api::protocol::RegisterResponse {
        server_time: Some(now - jiff::SignedDuration::from_mins(10)),
        status_acks: true,
        nonce: first.nonce.clone(),
        ..k8s4r_api::protocol::RegisterResponse::new(k8s4r_api::RobotPhase::Online, None)
    };
    server
        .publish(server.topics.response("rb-stale"), encode(&stale))
        .await;
    let expired = k8s4r_api::protocol::Dispatch {
        expires_at: Some(now - jiff::SignedDuration::from_mins(1)),
        ..shell_dispatch("u-stale", 1, &format!("touch {}", marker.display()))
    };
    server
        .publish(server.topics.dispatch("rb-stale"), encode(&expired))
        .await;

    let agent = Agent::start(&broker, "rb-stale", &state, &[]);
    let second = server.approve_current("rb-stale").await;
    assert_ne!(second.nonce, first.nonce, "each registration has its own nonce");
    let updates = server.statuses_until_terminal("u-stale", LONG).await;
    let last = updates.last().unwrap();
    assert_eq!(last.state, TaskState::Failed, "{updates:#?}");
    assert_eq!(
        last.reason,
        Some(k8s4r_api::TaskReason::DispatchTimeout),
        "{updates:#?}"
    );
    assert!(
        updates.iter().all(|u| u.state != TaskState::Running),
        "{updates:#?}"
    );
    assert!(!marker.exists(), "the expired dispatch ran");
    assert!(
        agent.log().contains("did not ask for"),
        "the stale answer was not recognised:\n{}",
        agent.log()
    );
}

#[tokio::test]
async fn a_dispatch_queued_while_the_robot_was_away_runs_when_it_returns() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb10").await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut agent = Agent::start(&broker, "rb10", &state, &[]);
    server.approve("rb10").await;
    agent.kill();
    let will: Online = server.next("/online", LONG).await.decode();
    let will = if will.online {
        server.next("/online", LONG).await.decode()
    } else {
        will
    };
    assert!(!will.online);

    // The broker queues this for the agent's persistent session.
    server
        .publish(
            server.topics.dispatch("rb10"),
            encode(&shell_dispatch("u-away", 1, "true")),
        )
        .await;
    let _agent = Agent::start(&broker, "rb10", &state, &[]);
    server.approve("rb10").await;
    let updates = server.statuses_until_terminal("u-away", LONG).await;
    assert_eq!(
        updates.last().unwrap().state,
        TaskState::Completed,
        "{updates:#?}"
    );
}

#[tokio::test]
async fn the_last_will_fires_on_an_unclean_disconnect() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb5").await;
    let tmp = tempfile::tempdir().unwrap();
    let agent = Agent::start(&broker, "rb5", &tmp.path().join("state"), &[]);
    let online = server.next("/online", LONG).await;
    assert!(online.decode::<Online>().online);
    agent.signal(Signal::SIGKILL);
    let will = server.next("/online", LONG).await;
    assert!(!will.decode::<Online>().online);
}

/// A task that runs until `go` exists, writing its pid to `pid` first.
fn until_go(tmp: &std::path::Path) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let (go, pid) = (tmp.join("go"), tmp.join("pid"));
    let script = format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        pid.display(),
        go.display()
    );
    (script, go, pid)
}

/// SIGTERM, as `systemctl restart` and an upgrade's switch send: the
/// agent goes offline and exits, leaving its running task running; the
/// next agent re-adopts it and reports its own end, in attempt 1.
#[tokio::test]
async fn sigterm_leaves_a_running_task_to_the_next_agent_and_goes_offline() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb9").await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut agent = Agent::start(&broker, "rb9", &state, &[]);
    server.approve("rb9").await;
    let (script, go, pid_file) = until_go(tmp.path());
    server
        .publish(
            server.topics.dispatch("rb9"),
            encode(&shell_dispatch("u-term", 1, &script)),
        )
        .await;
    server.next("/tasks/u-term/status", LONG).await;
    let pid: i32 = eventually("the task's pid", LONG, || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .await;
    agent.signal(Signal::SIGTERM);
    let online = server.next("/online", LONG).await;
    assert!(!online.decode::<Online>().online);
    let status = eventually("the agent to exit", LONG, || {
        agent.child.try_wait().ok().flatten()
    })
    .await;
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(agent.outbox_files().is_empty(), "no end was reported");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok(),
        "the task was stopped"
    );

    let next = Agent::start(&broker, "rb9", &state, &[]);
    eventually("the next agent re-adopting the task", LONG, || {
        next.log()
            .contains("re-adopting a batch task of the previous run")
            .then_some(())
    })
    .await;
    std::fs::write(&go, "").unwrap();
    let updates = server.statuses_until_terminal("u-term", LONG).await;
    let last = updates.last().unwrap();
    assert_eq!(
        (last.state, last.attempt, last.exit_code),
        (TaskState::Completed, 1, Some(0)),
        "{updates:#?}"
    );
}

#[tokio::test]
async fn bad_messages_are_refused_and_the_agent_carries_on() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "rb6").await;
    let tmp = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&broker, "rb6", &tmp.path().join("state"), &[]);
    server.approve("rb6").await;
    let dispatch_topic = server.topics.dispatch("rb6");

    // Malformed JSON: logged, nothing to answer.
    server
        .publish(dispatch_topic.clone(), b"{\"v\":1,\"taskUid\":".to_vec())
        .await;
    // Oversized: over the protocol's 256 KiB.
    let mut big = shell_dispatch("u-big", 1, "true");
    big.spec.args.push("x".repeat(300 * 1024));
    server.publish(dispatch_topic.clone(), encode(&big)).await;
    // Unknown version, with a readable task uid: failed InvalidSpec.
    let mut v2 = serde_json::to_value(shell_dispatch("u-v2", 1, "true")).unwrap();
    v2["v"] = 2.into();
    server
        .publish(dispatch_topic.clone(), v2.to_string().into_bytes())
        .await;
    // Invalid spec: failed InvalidSpec naming the field.
    let mut invalid = shell_dispatch("u-spec", 3, "true");
    invalid.spec.driver = "docker".into();
    server.publish(dispatch_topic.clone(), encode(&invalid)).await;
    // A bad cancel and a bad response: logged.
    server.publish(server.topics.cancel("rb6"), b"[]".to_vec()).await;
    server
        .publish(server.topics.response("rb6"), b"{\"v\":1}".to_vec())
        .await;

    let v2_status: k8s4r_api::protocol::StatusUpdate = server.next("/tasks/u-v2/status", LONG).await.decode();
    assert_eq!(
        (v2_status.state, v2_status.reason),
        (TaskState::Failed, Some(TaskReason::InvalidSpec))
    );
    assert!(
        v2_status.message.as_deref().unwrap_or("").contains("version 2"),
        "{v2_status:#?}"
    );
    let spec_status: k8s4r_api::protocol::StatusUpdate =
        server.next("/tasks/u-spec/status", LONG).await.decode();
    assert_eq!(
        (spec_status.state, spec_status.reason),
        (TaskState::Failed, Some(TaskReason::InvalidSpec))
    );
    assert_eq!(spec_status.attempt, 3);
    assert!(
        spec_status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("spec.driver"),
        "{spec_status:#?}"
    );

    // Still alive and still working.
    server
        .publish(dispatch_topic, encode(&shell_dispatch("u-after", 1, "true")))
        .await;
    let updates = server.statuses_until_terminal("u-after", LONG).await;
    assert_eq!(updates.last().unwrap().state, TaskState::Completed);
    assert!(agent.is_running());
    let log = agent.log();
    assert!(log.contains("malformed dispatch message"), "{log}");
    assert!(log.contains("exceeds the limit"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Runs the agent on a config file `contents`, which it must refuse with
/// exit code 2; gives the file's path and what the agent printed.
fn refused_config(tmp: &std::path::Path, contents: &str) -> (std::path::PathBuf, String) {
    let file = tmp.join("agent.toml");
    std::fs::write(&file, contents).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_k8s4r-agent"))
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    (file, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_bad_config_file_is_refused_with_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, err) = refused_config(tmp.path(), "robot_id = \"rb1\"\nheartbeat_interval = 30\n");
    assert!(
        err.contains(&file.display().to_string()) && err.contains("line 2"),
        "{err}"
    );
}

#[test]
fn a_bad_log_filter_is_refused_before_the_agent_starts() {
    let tmp = tempfile::tempdir().unwrap();
    // `log_level` is the older name of `log`, still read.
    let config = format!(
        "robot_id = \"rb1\"\nbroker_url = \"mqtt://127.0.0.1:1\"\nstate_dir = {:?}\nlog_level = \"k8s4r_agent=chatty\"\n",
        tmp.path().join("state")
    );
    let (_, err) = refused_config(tmp.path(), &config);
    assert!(err.contains("invalid log filter \"k8s4r_agent=chatty\""), "{err}");
}

#[test]
fn help_documents_every_setting() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_k8s4r-agent"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--broker-url",
        "--ca-file",
        "--robot-id",
        "--state-dir",
        "--heartbeat-interval",
        "K8S4R_BROKER_URL",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}

#[tokio::test]
async fn connects_over_tls_with_a_ca_file() {
    let broker = Broker::start_tls();
    let mut server = Server::connect(&broker, "rb11").await;
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("mqtts://127.0.0.1:{}", broker.tls_port.unwrap());
    let ca = broker.ca_file();
    let _agent = Agent::start_url(
        &url,
        "rb11",
        &tmp.path().join("state"),
        &["--ca-file", ca.to_str().unwrap()],
    );
    server.approve("rb11").await;
    let hb: Heartbeat = server.next("/heartbeat", LONG).await.decode();
    assert_eq!(hb.robot_id, "rb11");
}

#[tokio::test]
async fn refuses_a_broker_whose_certificate_does_not_chain_to_the_ca() {
    let broker = Broker::start_tls();
    let other = Broker::start_tls();
    let mut server = Server::connect(&broker, "rb12").await;
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("mqtts://127.0.0.1:{}", broker.tls_port.unwrap());
    let wrong_ca = other.ca_file();
    let agent = Agent::start_url(
        &url,
        "rb12",
        &tmp.path().join("state"),
        &["--ca-file", wrong_ca.to_str().unwrap()],
    );
    eventually("a failed connection in the log", LONG, || {
        agent.log().contains("broker connection lost").then_some(())
    })
    .await;
    let seen = server.drain(Duration::from_millis(500)).await;
    assert!(seen.is_empty(), "the agent got through: {seen:?}");
    assert!(
        agent.log().to_lowercase().contains("certificate"),
        "{}",
        agent.log()
    );
}

/// An end that happened while the broker was away waits on disk through
/// a SIGTERM, and the next start delivers it.
#[tokio::test]
async fn sigterm_without_a_broker_keeps_the_status_for_the_next_start() {
    let mut broker = Broker::start();
    let mut server = Server::connect(&broker, "rb13").await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let flush = ["--shutdown-flush-timeout", "1s"];
    let mut agent = Agent::start(&broker, "rb13", &state, &flush);
    server.approve("rb13").await;
    let (script, go, _) = until_go(tmp.path());
    server
        .publish(
            server.topics.dispatch("rb13"),
            encode(&shell_dispatch("u-down", 1, &script)),
        )
        .await;
    let running: k8s4r_api::protocol::StatusUpdate = server.next("/tasks/u-down/status", LONG).await.decode();
    broker.stop();
    std::fs::write(&go, "").unwrap();
    let outbox = state.join("outbox");
    let waiting = || -> Vec<String> {
        std::fs::read_dir(&outbox)
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    eventually("the end waiting on disk", LONG, || {
        waiting().iter().any(|t| t.contains("Completed")).then_some(())
    })
    .await;
    agent.signal(Signal::SIGTERM);
    // Bounded by the 1s flush timeout.
    let status = eventually("the agent to exit", LONG, || {
        agent.child.try_wait().ok().flatten()
    })
    .await;
    assert!(status.success(), "{status:?}");
    assert!(
        waiting().iter().any(|t| t.contains("Completed")),
        "the end still waits on disk"
    );

    broker.restart();
    let _agent = Agent::start(&broker, "rb13", &state, &flush);
    let updates = server.statuses_until_terminal("u-down", LONG).await;
    assert_in_order(&updates);
    let last = updates.last().unwrap();
    assert_eq!(last.state, TaskState::Completed, "{updates:#?}");
    assert!(last.seq > running.seq);
}

#[tokio::test]
async fn presents_a_client_certificate_for_mutual_tls() {
    let broker = Broker::start_mtls();
    let mut server = Server::connect(&broker, "rb14").await;
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("mqtts://127.0.0.1:{}", broker.tls_port.unwrap());
    let ca = broker.ca_file();
    let (cert, key) = broker.client_cert();
    let flags = [
        "--ca-file",
        ca.to_str().unwrap(),
        "--client-cert",
        cert.to_str().unwrap(),
        "--client-key",
        key.to_str().unwrap(),
    ];
    let _agent = Agent::start_url(&url, "rb14", &tmp.path().join("state"), &flags);
    let register = server.approve("rb14").await;
    assert_eq!(register.robot_id, "rb14");
}
