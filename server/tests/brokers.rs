//! One server, robots spread over two brokers: each robot is answered and
//! dispatched on the broker it speaks on, and nothing meant for it is
//! published on the other.

mod support;

use k8s4r_api::condition::find_condition;
use k8s4r_api::protocol::{decode, Dispatch, RegisterResponse};
use k8s4r_api::{names, ConditionStatus, RobotPhase};
use k8s4r_service::health::Health;
use support::{eventually, Env, FakeRobot, Mosquitto};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_robot_is_answered_and_dispatched_on_its_own_broker() {
    let env = Env::start().await;
    let second = Mosquitto::start();
    let mut config = env.config();
    config.more_brokers = vec![second.url()];
    let server = env.server_with(config).await;

    let mut rb1 = FakeRobot::connect(&env.broker, "rb1").await;
    let mut rb2 = FakeRobot::connect(&second, "rb2").await;
    // Listens on the first broker to everything meant for rb2, which is
    // connected to the second.
    let mut rb2_elsewhere = FakeRobot::connect(&env.broker, "rb2").await;

    rb1.registered(&env).await;
    rb2.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    env.set_phase("rb2", RobotPhase::Online).await;
    let answer: RegisterResponse = decode(&rb1.expect("/response").await).unwrap();
    assert_eq!(answer.phase, RobotPhase::Online);
    let answer: RegisterResponse = decode(&rb2.expect("/response").await).unwrap();
    assert_eq!(answer.phase, RobotPhase::Online);

    let uid = env.dispatch_task("job-b-0", "rb2", 1).await;
    let dispatch: Dispatch = decode(&rb2.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(dispatch.task_uid, uid);
    let uid = env.dispatch_task("job-a-0", "rb1", 1).await;
    let dispatch: Dispatch = decode(&rb1.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(dispatch.task_uid, uid);
    assert!(
        rb1.drain().iter().all(|(topic, _)| topic.contains("/rb1/")),
        "rb1 got only its own messages"
    );
    let leaked = rb2_elsewhere.drain();
    assert!(
        leaked.is_empty(),
        "what the server sent rb2 also went to the broker rb2 is not on: {:?}",
        leaked.iter().map(|(topic, _)| topic).collect::<Vec<_>>()
    );

    // rb1 moves to the second broker (its own failed over): the next
    // dispatch follows it there once it spoke there.
    let mut moved = FakeRobot::connect(&second, "rb1").await;
    moved
        .send(moved.topics.heartbeat("rb1"), &moved.heartbeat(1, 0.1))
        .await;
    server.wait_in("heartbeat", "applied", 1).await;
    // Its old connection dies: the first broker publishes its last will,
    // which says nothing about where rb1 is now.
    rb1.crash();
    server.wait_in("online", "stale_broker", 1).await;
    let mut left_behind = FakeRobot::connect(&env.broker, "rb1").await;
    let uid = env.dispatch_task("job-a-1", "rb1", 1).await;
    let dispatch: Dispatch = decode(&moved.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(dispatch.task_uid, uid);
    assert!(
        left_behind.drain().is_empty(),
        "the server sent to the broker rb1 left"
    );
    let robot = env.robot("rb1").await.expect("rb1");
    let conditions = robot.status.map(|s| s.conditions).unwrap_or_default();
    let connected = find_condition(&conditions, names::CONDITION_CONNECTED);
    assert_ne!(
        connected.map(|c| c.status),
        Some(ConditionStatus::False),
        "the will from the broker rb1 left disconnected it"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_holds_up_only_its_own_robots() {
    let env = Env::start().await;
    let mut second = Mosquitto::start();
    let mut config = env.config();
    config.more_brokers = vec![second.url()];
    let server = env.server_with(config).await;
    let text = server.metrics.render();
    assert!(text.contains("k8s4r_server_mqtt_connected 2"), "{text}");
    assert!(text.contains("k8s4r_server_mqtt_brokers 2"), "{text}");

    second.stop();
    let m = server.metrics.clone();
    eventually("one connection of two up", || {
        let m = m.clone();
        async move { m.render().contains("k8s4r_server_mqtt_connected 1").then_some(()) }
    })
    .await;
    assert!(
        server.metrics.ready(),
        "still ready: the first broker's robots are served"
    );
    // The first broker's robots are answered and dispatched meanwhile.
    let mut rb1 = FakeRobot::connect(&env.broker, "rb1").await;
    rb1.registered(&env).await;
    env.set_phase("rb1", RobotPhase::Online).await;
    let answer: RegisterResponse = decode(&rb1.expect("/response").await).unwrap();
    assert_eq!(answer.phase, RobotPhase::Online);
    let uid = env.dispatch_task("job-a-0", "rb1", 1).await;
    let dispatch: Dispatch = decode(&rb1.expect("/tasks/dispatch").await).unwrap();
    assert_eq!(dispatch.task_uid, uid);

    second.resume();
    eventually("both connections up again", || {
        let m = m.clone();
        async move { m.render().contains("k8s4r_server_mqtt_connected 2").then_some(()) }
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_listed_twice_is_refused() {
    let env = Env::start().await;
    let mut config = env.config();
    config.more_brokers = vec![env.broker.url()];
    let err = k8s4r_server::Server::new(config, env.client.clone())
        .run(tokio_util::sync::CancellationToken::new())
        .await
        .expect_err("the same broker twice");
    assert!(err.to_string().contains("listed twice"), "{err}");
}
