//! A robot's presence against a real Mosquitto: a broker restart is not
//! every robot's disconnect, a robot that goes is still marked so.

mod support;

use std::time::{Duration, Instant};

use k8s4r_api::condition::find_condition;
use k8s4r_api::{Condition, ConditionStatus, RobotPhase};
use k8s4r_server::config::DEFAULT_WILL_HOLD;
use support::{eventually, Env, FakeRobot, Mosquitto};

/// Robot `name`'s `Connected` condition when it says `status`.
async fn connected(env: &Env, name: &str, status: ConditionStatus) -> Option<Condition> {
    let robot = env.robot(name).await?;
    find_condition(&robot.status?.conditions, "Connected")
        .filter(|c| c.status == status)
        .cloned()
}

/// A broker with persistence: its retained presence outlives a restart.
fn persistent_broker() -> Mosquitto {
    Mosquitto::start_with(|port, dir| {
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nautosave_interval 1\n",
            dir.display()
        )
    })
}

async fn a_broker_restart_keeps_its_robots_connected(persistence: bool) {
    let mut env = Env::start().await;
    if persistence {
        env.broker = persistent_broker();
    }
    let server = env.server().await;
    let robot = FakeRobot::connect(&env.broker, "rb1").await;
    robot.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    eventually("Connected=True after register", || {
        connected(&env, "rb1", ConditionStatus::True)
    })
    .await;

    // The broker stops (SIGTERM: it publishes the robot's last will as it
    // goes, and keeps it retained when it has persistence) and starts again.
    env.broker.restart();
    server.connected_again().await;
    let metrics = &server.metrics;
    // The will reached the server, live before its connection dropped or
    // retained after it came back, and was not taken as the robot's word.
    let wills = || {
        metrics.messages_in("online", "broker_went_away") + metrics.messages_in("online", "retained_offline")
    };
    eventually("the server received the robot's last will", || async {
        (wills() > 0).then_some(())
    })
    .await;
    let flapped = k8s4r_testbed::eventually_or(DEFAULT_WILL_HOLD + Duration::from_secs(3), || {
        connected(&env, "rb1", ConditionStatus::False)
    })
    .await;
    assert_eq!(flapped, None, "a broker restart marked the robot disconnected");

    // The robot itself goes (the broker stays; the robot's client connected
    // again meanwhile): its will is recorded, once the hold is over.
    let gone = Instant::now();
    robot.crash();
    let condition = eventually("Connected=False after the robot's will", || {
        connected(&env, "rb1", ConditionStatus::False)
    })
    .await;
    assert_eq!(condition.reason.as_deref(), Some("Disconnected"));
    assert!(
        gone.elapsed() >= DEFAULT_WILL_HOLD,
        "recorded before the hold was over"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_without_persistence_keeps_its_robots_connected() {
    a_broker_restart_keeps_its_robots_connected(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_with_persistence_keeps_its_robots_connected() {
    a_broker_restart_keeps_its_robots_connected(true).await;
}
