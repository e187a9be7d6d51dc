//! End-to-end flows: apiserver-lite over HTTPS with the real kube client, a
//! real Mosquitto, the server under test, and a scripted robot.

mod support;

use k8s4r_api::condition::find_condition;
use k8s4r_api::protocol::{decode, Cancel, Dispatch, RegisterResponse};
use k8s4r_api::{names, ConditionStatus, RobotPhase, TaskAttempt, TaskState};
use k8s4r_server::decide::ANNOTATION_TOKEN_SHA256;
use k8s4r_service::leader::LeaderConfig;
use k8s4r_testbed::rbac::rule;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use rumqttc::QoS;
use std::time::Duration;
use support::{eventually, Env, FakeRobot, LEASES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_creates_a_pending_robot_and_answers_once_the_manager_decides() {
    let env = Env::start().await;
    let server = env.server().await;
    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;

    let created = env.robot("rb1").await.unwrap();
    let status = created.status.clone().unwrap();
    assert_eq!(status.phase, Some(RobotPhase::Pending));
    assert_eq!(status.device.unwrap().cpus, 4);
    assert_eq!(status.agent_version.as_deref(), Some("0.1.0"));
    assert_eq!(created.metadata.labels.unwrap()["site"], "lab");
    let hash = &created.metadata.annotations.unwrap()[ANNOTATION_TOKEN_SHA256];
    assert_eq!(hash.len(), 64);
    assert!(robot.drain().is_empty(), "no answer before the manager decides");

    // The test plays the manager.
    env.set_phase("rb1", RobotPhase::Online).await;
    let response: RegisterResponse = decode(&robot.expect("/response").await).unwrap();
    assert_eq!(response.phase, RobotPhase::Online);

    // A reconnecting robot that is already Online is answered at once.
    robot.send(robot.topics.register("rb1"), &robot.register()).await;
    let response: RegisterResponse = decode(&robot.expect("/response").await).unwrap();
    assert_eq!(response.phase, RobotPhase::Online);
    server.wait_in("register", "applied", 2).await;
    // Answers go at QoS 0: a lost one only makes the robot register again.
    let answers = robot.qos_on("/response");
    assert!(answers.len() >= 2, "{answers:?}");
    assert!(answers.iter().all(|q| *q == QoS::AtMostOnce), "{answers:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_coalesced_into_few_writes() {
    let env = Env::start().await;
    let server = env.server().await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;

    // The server learns of the approval from its watch: until then a
    // heartbeat is deferred (the robot sends it again). One at a time
    // until one is applied.
    let mut seq = 0;
    while server.metrics.messages_in("heartbeat", "applied") == 0 {
        seq += 1;
        assert!(seq <= 50, "no heartbeat applied after {seq} tries");
        robot
            .send(robot.topics.heartbeat("rb1"), &robot.heartbeat(seq, 10.0))
            .await;
        let m = &server.metrics;
        eventually("the heartbeat handled", || async {
            let handled =
                m.messages_in("heartbeat", "applied") + m.messages_in("heartbeat", "rejected_not_approved");
            (handled >= seq).then_some(())
        })
        .await;
    }
    for next in seq + 1..=seq + 29 {
        robot
            .send(robot.topics.heartbeat("rb1"), &robot.heartbeat(next, 10.0))
            .await;
    }
    server.wait_in("heartbeat", "coalesced", 29).await;
    assert_eq!(server.metrics.messages_in("heartbeat", "applied"), 1);
    assert_eq!(server.metrics.api_writes("lease", "ok"), 1, "one lease renewal");
    assert_eq!(
        server.metrics.api_writes("robot_heartbeat", "ok"),
        1,
        "one status write"
    );
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), LEASES);
    let lease = leases.get("rb1").await.unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("rb1"));
    assert!(spec.renew_time.is_some());
    let status = env.robot("rb1").await.unwrap().status.unwrap();
    assert!(status.last_heartbeat_time.is_some());
    assert_eq!(status.usage.unwrap().cpu_percent, 10.0);

    // A material change in usage is written at once.
    robot
        .send(robot.topics.heartbeat("rb1"), &robot.heartbeat(seq + 30, 95.0))
        .await;
    server.wait_in("heartbeat", "applied", 2).await;
    assert_eq!(server.metrics.api_writes("lease", "ok"), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_status_ordering_and_terminal_state() {
    let env = Env::start().await;
    let server = env.server().await;
    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;

    let uid = env.dispatch_task("job-a-0", "rb1", 1).await;
    let dispatch: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
    assert_eq!((dispatch.task_uid.as_str(), dispatch.attempt), (uid.as_str(), 1));
    assert_eq!(dispatch.task_name, "default/job-a-0");
    assert_eq!(dispatch.spec.command, "sleep");
    let task = eventually("the dispatch is recorded", || async {
        env.task("job-a-0").await.filter(|t| {
            t.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_SENDING_ATTEMPT))
                .is_some_and(|a| a == "1")
        })
    })
    .await;
    assert!(task.finalizers().contains(&names::FINALIZER_CANCEL.to_owned()));
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "default");
    eventually("a Dispatched event on the task", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("Dispatched")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("job-a-0")
            })
            .map(|_| ())
    })
    .await;

    let status = |seq, state| robot.status(&uid, 1, seq, state);
    let topic = robot.topics.status("rb1", &uid);
    robot.send(topic.clone(), &status(1, TaskState::Running)).await;
    server.wait_in("status", "applied", 1).await;
    robot.send(topic.clone(), &status(1, TaskState::Running)).await;
    server.wait_in("status", "duplicate", 1).await;
    robot.send(topic.clone(), &status(3, TaskState::Completed)).await;
    server.wait_in("status", "applied", 2).await;
    robot.send(topic.clone(), &status(2, TaskState::Running)).await;
    robot.send(topic.clone(), &status(4, TaskState::Running)).await;
    server.wait_in("status", "terminal", 2).await;
    // An attempt older than the Task's is stale.
    robot
        .send(topic.clone(), &robot.status(&uid, 0, 9, TaskState::Running))
        .await;
    server.wait_in("status", "stale", 1).await;

    let status = env.task("job-a-0").await.unwrap().status.unwrap();
    assert_eq!(status.state, Some(TaskState::Completed));
    assert_eq!(status.seq, 3);
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(status.attempt, 1, "the manager's field is untouched");
    assert!(
        robot.drain().iter().all(|(t, _)| !t.ends_with("/dispatch")),
        "one dispatch only"
    );
    // The dispatch must arrive, so it waits for the broker's PUBACK; the
    // statuses' confirmations are repaired by the robot sending again.
    assert_eq!(robot.qos_on("/tasks/dispatch"), vec![QoS::AtLeastOnce]);
    let confirmations = robot.qos_on("/tasks/acks");
    assert!(!confirmations.is_empty());
    assert!(
        confirmations.iter().all(|q| *q == QoS::AtMostOnce),
        "{confirmations:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_cancels_and_holds_the_finalizer_until_the_robot_reports() {
    let env = Env::start().await;
    let (server, mut robot, uid) = env.running_on_rb1().await;
    let topic = robot.topics.status("rb1", &uid);

    env.tasks()
        .delete("job-a-0", &DeleteParams::default())
        .await
        .unwrap();
    let cancel: Cancel = decode(&robot.expect("/tasks/cancel").await).unwrap();
    assert_eq!((cancel.task_uid.as_str(), cancel.attempt), (uid.as_str(), 1));
    let held = env.task("job-a-0").await.expect("held by the finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());

    let mut ended = robot.status(&uid, 1, 2, TaskState::Failed);
    ended.reason = Some(k8s4r_api::TaskReason::Cancelled);
    robot.send(topic, &ended).await;
    eventually("the task is gone", || async {
        env.task("job-a-0").await.is_none().then_some(())
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_neither_loses_nor_repeats_dispatches() {
    let env = Env::start().await;
    let server = env.server().await;
    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    let before = env.dispatch_task("before", "rb1", 1).await;
    robot.expect("/tasks/dispatch").await;
    let recorded = eventually("sending recorded", || async {
        env.task("before")
            .await
            .filter(|t| k8s4r_server::decide::sent_attempt(t) == 1)
    })
    .await;
    server.stop().await;

    // While the server is down the manager dispatches another task. What
    // the broker took is kept in the old process's memory only: the new
    // one sends `before` again (the robot drops an attempt it accepted
    // before), without writing its sending record again.
    let during = env.dispatch_task("during", "rb1", 1).await;
    let server = env.server().await;
    let mut sent = Vec::new();
    for _ in 0..2 {
        let d: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
        sent.push((d.task_uid, d.attempt));
    }
    sent.sort();
    let mut expected = vec![(during.clone(), 1), (before.clone(), 1)];
    expected.sort();
    assert_eq!(
        sent, expected,
        "the missed dispatch is sent, the one still dispatching again"
    );
    // A task dispatched after the restart is a marker: once it arrives, a
    // further repeat would have arrived too.
    let after = env.dispatch_task("after", "rb1", 1).await;
    let marker: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(marker.task_uid, after);
    let repeats: Vec<_> = robot
        .drain()
        .into_iter()
        .filter(|(t, _)| t.ends_with("/dispatch"))
        .collect();
    assert!(repeats.is_empty(), "no dispatch repeated: {repeats:?}");
    let again = env.task("before").await.expect("the task");
    assert_eq!(
        again.metadata.resource_version, recorded.metadata.resource_version,
        "sent again without a write"
    );

    // Once the robot reports its attempts running, a restart sends
    // nothing; a retry is a new attempt: sent.
    for uid in [&before, &during, &after] {
        let topic = robot.topics.status("rb1", uid);
        robot
            .send(topic, &robot.status(uid, 1, 1, TaskState::Running))
            .await;
    }
    server.wait_in("status", "applied", 3).await;
    server.stop().await;
    let server = env.server().await;
    env.move_task("before", "rb1", TaskState::Dispatching, 2).await;
    let retry: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
    assert_eq!((retry.task_uid.as_str(), retry.attempt), (before.as_str(), 2));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_counted_and_never_written() {
    let env = Env::start().await;
    let server = env.server().await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    let t = robot.topics.clone();
    robot.send_raw(t.register("rb1"), b"{not json".to_vec()).await;
    robot
        .send_raw(t.register("rb1"), br#"{"v":2,"robotId":"rb1"}"#.to_vec())
        .await;
    robot
        .send_raw(
            t.heartbeat("rb1"),
            vec![b' '; k8s4r_api::protocol::MAX_MESSAGE_BYTES + 1],
        )
        .await;
    let mut other = robot.register();
    other.robot_id = "rb2".into();
    robot.send(t.register("rb1"), &other).await;
    robot.send(t.heartbeat("rb1"), &robot.heartbeat(1, 1.0)).await;
    server.wait_in("register", "rejected_malformed", 1).await;
    server.wait_in("register", "rejected_version", 1).await;
    server.wait_in("heartbeat", "rejected_too_large", 1).await;
    server.wait_in("register", "rejected_robot_mismatch", 1).await;
    server.wait_in("heartbeat", "rejected_unknown_robot", 1).await;
    assert!(env
        .robots()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());

    // A robot not approved yet costs nothing: its statuses are dropped.
    robot.registered(&env).await;
    robot
        .send(
            t.status("rb1", "no-such-uid"),
            &robot.status("no-such-uid", 1, 1, TaskState::Running),
        )
        .await;
    server.wait_in("status", "rejected_not_approved", 1).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    // Status for an unknown task (read by its name: it is gone), for one
    // the robot does not name (nothing can be concluded), and for a task
    // assigned to another robot.
    eventually("a status of a deleted task refused", || async {
        robot
            .send(
                t.status("rb1", "no-such-uid"),
                &k8s4r_api::protocol::StatusUpdate {
                    task_name: Some("default/no-such-task".into()),
                    ..robot.status("no-such-uid", 1, 1, TaskState::Running)
                },
            )
            .await;
        (server.metrics.messages_in("status", "rejected_unknown_task") >= 1).then_some(())
    })
    .await;
    robot
        .send(
            t.status("rb1", "nameless-uid"),
            &robot.status("nameless-uid", 1, 2, TaskState::Running),
        )
        .await;
    server.wait_in("status", "deferred_no_name", 1).await;
    let uid = env.dispatch_task("job-a-0", "rb9", 1).await;
    robot
        .send(
            t.status("rb1", &uid),
            &robot.status(&uid, 1, 1, TaskState::Running),
        )
        .await;
    server.wait_in("status", "rejected_not_assigned", 1).await;
    let task = env.task("job-a-0").await.unwrap();
    assert_eq!(task.status.unwrap().state, Some(TaskState::Dispatching));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_will_marks_the_robot_disconnected() {
    let env = Env::start().await;
    let server = env.server().await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    let connected = |status: ConditionStatus| {
        let env = &env;
        async move {
            let robot = env.robot("rb1").await?;
            let conditions = robot.status?.conditions;
            find_condition(&conditions, "Connected")
                .filter(|c| c.status == status)
                .cloned()
        }
    };
    eventually("Connected=True after register", || {
        connected(ConditionStatus::True)
    })
    .await;
    robot.crash();
    let condition = eventually("Connected=False after the will", || {
        connected(ConditionStatus::False)
    })
    .await;
    assert_eq!(condition.reason.as_deref(), Some("Disconnected"));

    // Back again: a heartbeat flips it to True.
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot
        .send(robot.topics.heartbeat("rb1"), &robot.heartbeat(1, 1.0))
        .await;
    eventually("Connected=True after a heartbeat", || {
        connected(ConditionStatus::True)
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_topics_work_behind_the_flag_and_metrics_are_served() {
    let env = Env::start().await;
    let mut config = env.config();
    config.legacy_topics = true;
    config.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    let mut server = k8s4r_server::Server::new(config, env.client.clone());
    let metrics = server.metrics();
    let bound = server.metrics_addr();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(server.run(shutdown.clone()));
    let addr = tokio::time::timeout(Duration::from_secs(20), bound)
        .await
        .unwrap()
        .unwrap();
    eventually("ready", || {
        let m = metrics.clone();
        async move { m.ready().then_some(()) }
    })
    .await;

    let robot = FakeRobot::connect(&env.broker, "rb7").await;
    robot
        .send(robot.topics.legacy_register(), &robot.register())
        .await;
    eventually("the robot exists", || async { env.robot("rb7").await }).await;
    env.set_phase("rb7", RobotPhase::Online).await;
    // Until the server's cache has the approval, heartbeats are dropped.
    eventually("legacy heartbeat applied", || {
        let m = metrics.clone();
        let robot = &robot;
        async move {
            robot
                .send(robot.topics.legacy_heartbeat(), &robot.heartbeat(1, 1.0))
                .await;
            (m.messages_in("legacy_heartbeat", "applied") >= 1).then_some(())
        }
    })
    .await;

    let body = http_get(addr, "/metrics").await;
    assert!(
        body.contains(
            "k8s4r_server_messages_received_total{topic=\"legacy_register\",outcome=\"applied\"} 1"
        ),
        "{body}"
    );
    assert!(
        body.contains("k8s4r_server_api_write_duration_seconds_bucket"),
        "{body}"
    );
    assert!(http_get(addr, "/readyz").await.contains("200 OK"));
    assert!(http_get(addr, "/healthz").await.contains("200 OK"));
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

/// Replica `name` of servers that share the messages and elect a leader.
fn replica(env: &Env, name: &str) -> k8s4r_server::ServerConfig {
    let mut config = env.config();
    config.shared_group = Some("servers".into());
    // A short Lease, so that a hand-over is quick.
    config.leader = Some(LeaderConfig {
        lease_seconds: 3,
        renew_grace_seconds: 1,
        ..LeaderConfig::new(k8s4r_server::leader::LEADER_LEASE, name)
    });
    config.identity = name.into();
    config.broker.client_id = format!("k8s4r-server-{name}");
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_the_messages_and_one_dispatches() {
    let env = Env::start().await;
    let a = env.server_with(replica(&env, "a")).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), LEASES);
    eventually("replica a leads", || async {
        let lease = leases.get_opt(k8s4r_server::leader::LEADER_LEASE).await.ok()??;
        (lease.spec?.holder_identity.as_deref() == Some("a")).then_some(())
    })
    .await;
    let b = env.server_with(replica(&env, "b")).await;

    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    for seq in 1..=20 {
        robot
            .send(robot.topics.heartbeat("rb1"), &robot.heartbeat(seq, 10.0))
            .await;
    }
    // Applied, or dropped while a replica's cache did not show the
    // approval yet: handled either way, by one replica.
    let handled = |m: &k8s4r_server::Metrics| {
        m.messages_in("heartbeat", "applied")
            + m.messages_in("heartbeat", "coalesced")
            + m.messages_in("heartbeat", "rejected_not_approved")
    };
    eventually("every heartbeat handled once", || async {
        (handled(&a.metrics) + handled(&b.metrics) == 20).then_some(())
    })
    .await;
    assert!(
        handled(&a.metrics) > 0 && handled(&b.metrics) > 0,
        "the broker splits the messages: a={} b={}",
        handled(&a.metrics),
        handled(&b.metrics)
    );

    let first = env.dispatch_task("job-a-0", "rb1", 1).await;
    let d: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(d.task_uid, first);
    let second = env.dispatch_task("job-a-1", "rb1", 1).await;
    let d: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(d.task_uid, second, "job-a-0 was not published twice");
    assert!(robot.drain().iter().all(|(t, _)| !t.ends_with("/dispatch")));
    assert_eq!(
        b.metrics.messages_out("dispatch", "acked"),
        0,
        "only the leader dispatches"
    );

    // The leader stops and hands over: the other replica dispatches. What
    // the broker took is in the old leader's memory only, so the new one
    // sends the attempts still dispatching again (the robot drops an
    // attempt it accepted before), each once.
    a.stop().await;
    let third = env.dispatch_task("job-a-2", "rb1", 1).await;
    let mut sent = Vec::new();
    for _ in 0..3 {
        let d: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
        sent.push(d.task_uid);
    }
    sent.sort();
    let mut expected = vec![first, second, third];
    expected.sort();
    assert_eq!(sent, expected);
    // The robot can see the message before the replica sees the PUBACK.
    eventually("replica b counts its dispatches", || async {
        let m = &b.metrics;
        (m.messages_out("dispatch", "acked") == 1 && m.messages_out("dispatch", "resent") == 2).then_some(())
    })
    .await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reconnects_after_the_broker_restarts() {
    let mut env = Env::start().await;
    let server = env.server().await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    robot.crash();

    env.broker.restart();
    server.connected_again().await;
    // The new broker has no sessions: the server subscribed again.
    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.send(robot.topics.register("rb1"), &robot.register()).await;
    let response: RegisterResponse = decode(&robot.expect("/response").await).unwrap();
    assert_eq!(response.phase, RobotPhase::Online);
    let uid = env.dispatch_task("job-a-0", "rb1", 1).await;
    let d: Dispatch = decode(&robot.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(d.task_uid, uid);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_robot_going_offline_releases_its_deleted_tasks() {
    let env = Env::start().await;
    let server = env.server().await;
    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    let uid = env.dispatch_task("job-a-0", "rb1", 1).await;
    robot.expect("/tasks/dispatch").await;
    let topic = robot.topics.status("rb1", &uid);
    robot
        .send(topic, &robot.status(&uid, 1, 1, TaskState::Running))
        .await;
    server.wait_in("status", "applied", 1).await;
    env.tasks()
        .delete("job-a-0", &DeleteParams::default())
        .await
        .unwrap();
    robot.expect("/tasks/cancel").await;
    assert!(env.task("job-a-0").await.is_some(), "held for the robot's report");

    // The robot never answers; the manager declares it Offline.
    env.set_phase("rb1", RobotPhase::Offline).await;
    eventually("the task is released", || async {
        env.task("job-a-0").await.is_none().then_some(())
    })
    .await;
    server.stop().await;
}

/// The status messages a server handled, whatever it made of them.
fn statuses_handled(m: &k8s4r_server::Metrics) -> u64 {
    [
        "applied",
        "error",
        "deferred_unsynced",
        "deferred_unknown_task",
        "deferred_no_name",
        "rejected_unknown_task",
    ]
    .iter()
    .map(|outcome| m.messages_in("status", outcome))
    .sum()
}

/// What a robot that insists does: `status` now and again 31 s later,
/// with heartbeats listing `listed` every 2 s for 36 s.
async fn insist(
    robot: &mut FakeRobot,
    uid: &str,
    status: &k8s4r_api::protocol::StatusUpdate,
    listed: &[TaskAttempt],
) {
    let started = std::time::Instant::now();
    let mut seq = 0;
    let mut sent_again = false;
    robot.send(robot.topics.status("rb1", uid), status).await;
    while started.elapsed() < Duration::from_secs(36) {
        seq += 1;
        let heartbeat = k8s4r_api::protocol::Heartbeat {
            held: k8s4r_api::protocol::HeldList {
                running: listed.to_vec(),
                reconcile: true,
                last_seq: None,
            },
            session: Some("s".into()),
            ..robot.heartbeat(seq, 5.0)
        };
        robot.send(robot.topics.heartbeat("rb1"), &heartbeat).await;
        if !sent_again && started.elapsed() >= Duration::from_secs(31) {
            robot.send(robot.topics.status("rb1", uid), status).await;
            sent_again = true;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Takes from ServiceAccount `name`'s ClusterRole the right to list,
/// watch or read Tasks (it may still patch them and their status).
async fn may_not_read_tasks(env: &Env, name: &str) {
    k8s4r_testbed::rbac::set_rules(
        &env.client,
        name,
        vec![
            rule(
                &["*"],
                &[
                    "robots",
                    "robots/status",
                    "leases",
                    "events",
                    "namespaces",
                    "tasks/status",
                ],
                &["*"],
            ),
            rule(&["robot.k8s4r.io"], &["tasks"], &["patch", "update"]),
        ],
    )
    .await;
}

/// Issue 26, hole 3: a replica whose Task cache is stale (its watch cut,
/// and its ServiceAccount no longer allowed to list, watch or read Tasks,
/// as a misconfigured or throttled replica would be) never confirms a
/// status of a Task its cache lacks, nor cancels the attempt, however long
/// the robot insists: the same status twice, 31 s apart, and heartbeats
/// listing the attempt all along. A healthy replica beside it applies the
/// status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_stale_task_cache_neither_confirms_nor_cancels() {
    let env = Env::start().await;
    let token = env
        .service_account("stale", vec![rule(&["*"], &["*"], &["*"])])
        .await;
    // The stale replica reaches the API server through a link the test cuts.
    let link = k8s4r_testbed::Proxy::start(env.api.addr()).await;
    let stale_client = env.client_via(link.addr(), &token).await;
    let replica = |name: &str| {
        let mut config = env.config();
        config.identity = name.into();
        config.broker.client_id = format!("k8s4r-server-{name}");
        config
    };
    let stale = env.server_using(replica("stale"), stale_client).await;
    let healthy = env.server_with(replica("healthy")).await;

    let mut robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    // The stale replica's watch ends, and it may no longer list, watch or
    // read Tasks: nothing it learns of Tasks from now on.
    may_not_read_tasks(&env, "stale").await;
    link.set(k8s4r_testbed::Fault::Cut);
    link.heal();
    let uid = env.dispatch_task("late", "rb1", 1).await;
    env.move_task("late", "rb1", TaskState::Running, 1).await;

    let status = k8s4r_api::protocol::StatusUpdate {
        task_name: Some("default/late".into()),
        ..robot.status(&uid, 1, 7, TaskState::Running)
    };
    let listed = vec![TaskAttempt::new(&uid, 1).named(Some("default/late".into()))];
    insist(&mut robot, &uid, &status, &listed).await;
    // Both statuses reached the stale replica, whatever it made of them.
    eventually("both statuses handled by the stale replica", || async {
        (statuses_handled(&stale.metrics) >= 2).then_some(())
    })
    .await;
    assert_eq!(
        stale.metrics.messages_out("status_ack", "queued"),
        0,
        "the stale replica confirmed a status"
    );
    assert_eq!(
        stale.metrics.messages_out("cancel", "queued"),
        0,
        "the stale replica cancelled the attempt"
    );
    // It could not judge them: its watch is not in sync (or, before it
    // noticed, it could not read).
    assert_eq!(
        stale.metrics.messages_in("status", "deferred_unsynced")
            + stale.metrics.messages_in("status", "error"),
        2
    );
    assert_eq!(healthy.metrics.messages_out("cancel", "queued"), 0);
    assert!(
        healthy.metrics.messages_out("status_ack", "queued") >= 1,
        "the healthy replica applied it"
    );
    let cancels: Vec<_> = robot
        .drain()
        .into_iter()
        .filter(|(topic, _)| topic.ends_with("/tasks/cancel"))
        .collect();
    assert!(cancels.is_empty(), "{cancels:?}");
    stale.stop().await;
    healthy.stop().await;
}
