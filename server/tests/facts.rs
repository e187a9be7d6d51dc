//! A robot's facts reach its Robot at once, a flood of them costs a bounded
//! number of writes, and the shown facts follow the Robot's label: the real
//! server between apiserver-lite and Mosquitto, with a scripted robot.

mod support;

use std::time::{Duration, Instant};

use k8s4r_api::facts::{FactValue, Facts, LABEL_SHOW_FACTS};
use k8s4r_api::protocol::Heartbeat;
use k8s4r_api::RobotPhase;
use kube::api::{Patch, PatchParams};
use support::{eventually, Env, FakeRobot};

fn facts(json: &str) -> Facts {
    serde_json::from_str(json).unwrap()
}

fn with_facts(heartbeat: Heartbeat, json: &str) -> Heartbeat {
    Heartbeat {
        facts: Some(facts(json)),
        ..heartbeat
    }
}

/// Waits until the Robot shows `want` as its facts; how long that took.
async fn shows(env: &Env, want: &Facts) -> Duration {
    let started = Instant::now();
    eventually(&format!("the robot shows {want:?}"), || async {
        let status = env.robot("rb1").await?.status?;
        (status.facts == *want).then_some(())
    })
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_reach_the_robot_at_once_and_a_flood_costs_few_writes() {
    let env = Env::start().await;
    let mut config = env.config();
    config.legacy_topics = true;
    let server = env.server_with(config).await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    let topic = robot.topics.heartbeat("rb1");
    // The first heartbeat may come before the cache has the approval.
    let battery = facts(r#"{"battery": 10, "docked": true}"#);
    eventually("the first facts are written", || async {
        let beat = with_facts(robot.heartbeat(1, 1.0), r#"{"battery": 10, "docked": true}"#);
        robot.send(topic.clone(), &beat).await;
        let status = env.robot("rb1").await?.status?;
        (status.facts == battery).then_some(())
    })
    .await;

    // A change lands well within a second, though heartbeats are coalesced.
    let sent = Instant::now();
    let beat = with_facts(robot.heartbeat(2, 1.0), r#"{"battery": 80}"#);
    robot.send(topic.clone(), &beat).await;
    shows(&env, &facts(r#"{"battery": 80}"#)).await;
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(1), "a fact change took {took:?}");

    // A heartbeat without facts leaves them alone.
    robot.send(topic.clone(), &robot.heartbeat(3, 1.0)).await;
    // A shared legacy topic cannot say who sent it: its facts are dropped.
    let legacy = with_facts(robot.heartbeat(4, 1.0), r#"{"battery": 99}"#);
    robot.send(robot.topics.legacy_heartbeat(), &legacy).await;
    eventually("the legacy heartbeat is handled", || async {
        let m = &server.metrics;
        (m.messages_in("legacy_heartbeat", "coalesced") + m.messages_in("legacy_heartbeat", "applied") >= 1)
            .then_some(())
    })
    .await;
    server.wait_in("heartbeat", "coalesced", 1).await;
    let status = env.robot("rb1").await.unwrap().status.unwrap();
    assert_eq!(status.facts, facts(r#"{"battery": 80}"#));

    // A flood: 100 changes as fast as the robot can send them.
    let before = server.metrics.api_writes("robot_facts", "ok");
    let flood = Instant::now();
    for i in 0..100u64 {
        let beat = with_facts(robot.heartbeat(10 + i, 1.0), &format!(r#"{{"counter": {i}}}"#));
        robot.send(topic.clone(), &beat).await;
    }
    let last = Facts::from([("counter".to_owned(), FactValue::Number(99.0))]);
    shows(&env, &last).await;
    let writes = server.metrics.api_writes("robot_facts", "ok") - before;
    let allowed = k8s4r_server::facts::WRITE_BURST
        + k8s4r_server::facts::WRITE_RATE * flood.elapsed().as_secs_f64()
        + 1.0;
    assert!(
        (writes as f64) <= allowed,
        "{writes} fact writes in {:?}",
        flood.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shown_facts_follow_the_robots_label() {
    let env = Env::start().await;
    let server = env.server().await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    let battery = facts(r#"{"battery": 80, "docked": true}"#);
    eventually("the facts are written", || async {
        let beat = with_facts(robot.heartbeat(1, 1.0), r#"{"battery": 80, "docked": true}"#);
        robot.send(robot.topics.heartbeat("rb1"), &beat).await;
        let status = env.robot("rb1").await?.status?;
        (status.facts == battery).then_some(())
    })
    .await;
    assert_eq!(
        env.robot("rb1")
            .await
            .unwrap()
            .status
            .unwrap()
            .shown_facts
            .as_deref(),
        Some("battery=80 docked=true"),
        "without a label, the first facts"
    );

    let label =
        |value: Option<&str>| serde_json::json!({ "metadata": { "labels": { LABEL_SHOW_FACTS: value } } });
    let pp = PatchParams::default();
    let shown = |want: Option<&'static str>| {
        let env = &env;
        async move {
            eventually(&format!("the robot shows {want:?}"), || async {
                let status = env.robot("rb1").await?.status?;
                (status.shown_facts.as_deref() == want).then_some(())
            })
            .await
        }
    };
    env.robots()
        .patch("rb1", &pp, &Patch::Merge(label(Some("battery.estop"))))
        .await
        .unwrap();
    shown(Some("battery=80 estop=<none>")).await;
    env.robots()
        .patch("rb1", &pp, &Patch::Merge(label(None)))
        .await
        .unwrap();
    shown(Some("battery=80 docked=true")).await;
    env.set_phase("rb1", RobotPhase::Offline).await;
    shown(Some("stale: battery=80 docked=true")).await;
    server.stop().await;
}
