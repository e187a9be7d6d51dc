//! `k8s4r drain`'s eviction as the server carries it out: a cancel that
//! drains, to the robot that runs the attempt, and to a robot that lists
//! it after a reconnect.

mod support;

use k8s4r_api::protocol::{decode, Cancel, HeldList};
use k8s4r_api::{ManualAction, TaskAttempt};
use kube::api::{Patch, PatchParams};
use support::Env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_attempt_gets_a_cancel_that_drains() {
    let env = Env::start().await;
    let (server, mut robot, uid) = env.running_on_rb1().await;

    // The test plays the manager acting on robot.k8s4r.io/evict.
    let eviction = ManualAction {
        value: "e1".into(),
        by: Some("alice".into()),
        at: jiff::Timestamp::now(),
        attempt: 1,
        ..Default::default()
    };
    let body = serde_json::json!({ "status": { "eviction": eviction } });
    env.tasks()
        .patch_status("job-a-0", &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
    let cancel: Cancel = decode(&robot.expect("/tasks/cancel").await).unwrap();
    assert_eq!((cancel.task_uid.as_str(), cancel.attempt), (uid.as_str(), 1));
    assert!(cancel.drain, "{cancel:?}");
    assert_eq!(cancel.reason, "robot drained (k8s4r drain by alice)");

    // A robot that lists the attempt (after a reconnect) is told again.
    let mut beat = robot.heartbeat(1, 1.0);
    beat.held = HeldList {
        running: vec![TaskAttempt::new(&uid, 1)],
        reconcile: true,
        last_seq: Some(1),
    };
    robot.send(robot.topics.heartbeat("rb1"), &beat).await;
    let again: Cancel = decode(&robot.expect("/tasks/cancel").await).unwrap();
    assert!(again.drain && again.attempt == 1, "{again:?}");
    server.stop().await;
}
