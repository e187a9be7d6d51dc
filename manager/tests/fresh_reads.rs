//! A replacement of a silent robot's attempt is decided on what the API
//! server says then, never on the watch caches alone: here the manager's
//! Lease watch stalls (its link to the API server is cut, and it may no
//! longer list or watch Leases, as a watch stuck behind a relist of
//! 100,000 Leases would be) while the robot's Lease goes on being renewed.
//! Run-once hole 1 of the review (docs/fencing.md); the simulation's seeds
//! 16 and 20 find it too.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s4r_api::{TaskReason, TaskState};
use k8s4r_testbed::rbac::{client_via, rule, service_account, set_rules};
use k8s4r_testbed::{Fault, Proxy};
use k8s_openapi::api::rbac::v1::PolicyRule;

const WAIT: Duration = Duration::from_secs(20);
/// How long the Lease lasts, as the server writes it for a robot.
const LEASE_SECONDS: i32 = 3;

/// What the manager may do: everything, with or without listing and
/// watching Leases (its own leader Lease it still reads and writes).
fn manager_rules(watch_leases: bool) -> Vec<PolicyRule> {
    let mut lease_verbs = vec!["get", "create", "update", "patch", "delete"];
    if watch_leases {
        lease_verbs.extend(["list", "watch"]);
    }
    vec![
        rule(
            &[
                "",
                "robot.k8s4r.io",
                "events.k8s.io",
                "authorization.k8s.io",
                "rbac.authorization.k8s.io",
            ],
            &["*"],
            &["*"],
        ),
        rule(&["coordination.k8s.io"], &["leases"], &lease_verbs),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_lease_watch_does_not_replace_a_robot_whose_lease_is_renewed() {
    let env = api_server().await;
    let c = &env.client;
    let token = service_account(&env.server, c, "manager", manager_rules(true)).await;
    let link = Proxy::start(env.server.addr()).await;
    let mut cfg = config();
    // The server renews a robot's Lease about this often.
    cfg.lifecycle.lease_interval = Duration::from_secs(1);
    let manager = Manager::start(&client_via(&env.server, link.addr(), &token).await, cfg);

    robot("a").create(c).await;
    renew_lease(c, "a", LEASE_SECONDS).await;
    let fenced = fenced_group("g");
    create_job(c, "steady", None, vec![fenced]).await;
    task_where(c, "steady-g-0", "dispatched to a", |t| {
        dispatching_on(t) == Some("a")
    })
    .await;
    report(c, "steady-g-0", TaskState::Running, None, None).await;
    // Somewhere a replacement could go.
    robot("b").create(c).await;

    // The manager's Lease watch stalls: its watches are cut, and it may no
    // longer list or watch Leases, so its Lease cache keeps what it had.
    set_rules(c, "manager", manager_rules(false)).await;
    link.set(Fault::Cut);
    link.heal();

    // Robot a stays in contact: the server renews its Lease (and nothing
    // else: its Robot is not written) for three times its fence.
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(21) {
        renew_lease(c, "a", LEASE_SECONDS).await;
        heartbeat(c, "b").await;
        let t = task(c, "steady-g-0").await.expect("the task");
        let status = t.status.as_ref().expect("a status");
        assert_eq!(
            (status.attempt, status.state),
            (1, Some(TaskState::Running)),
            "a robot whose Lease is renewed was replaced after {:?}: {status:?}",
            held.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The manager did look, and found its cache behind the API server.
    assert!(
        manager.metrics.stale_robot_records.get() >= 1,
        "the manager never decided on a stale record: the watch did not stall"
    );

    // Robot a goes quiet for real: now the fresh read says so too, and its
    // attempt moves to b once fenced.
    let t = eventually(WAIT, "attempt 2 on b", || async {
        heartbeat(c, "b").await;
        let t = task(c, "steady-g-0").await?;
        (t.status.as_ref()?.attempt == 2).then_some(t)
    })
    .await;
    let status = t.status.unwrap();
    assert_eq!(status.attempts[0].reason, Some(TaskReason::RobotLost));
    assert_eq!(status.robot.as_deref(), Some("b"));
    manager.stop().await;
}
