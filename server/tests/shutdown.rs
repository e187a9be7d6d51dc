//! A stop of the server ends, whenever it comes: here before its Task
//! cache ever fills (its account may not list Tasks, as happens while the
//! API server is away at start). kube-runtime's controller would wait for
//! that first list forever.

mod support;

use std::time::Duration;

use k8s4r_testbed::rbac::rule;
use support::{eventually, Env};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_before_its_tasks_are_listed_stops_at_once() {
    let env = Env::start().await;
    // Everything but Tasks.
    let all = ["*"];
    let token = env
        .service_account(
            "no-tasks",
            vec![
                rule(&["", "coordination.k8s.io", "events.k8s.io"], &all, &all),
                rule(
                    &["robot.k8s4r.io"],
                    &["robots", "robots/status", "agentrollouts"],
                    &all,
                ),
            ],
        )
        .await;
    let client = env.client_via(env.api.addr(), &token).await;

    let server = k8s4r_server::Server::new(env.config(), client);
    let metrics = server.metrics();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));
    // Its Robots listed, the Task controller has started: its list of
    // Tasks is refused, and it waits for one.
    eventually("the server's Task controller asks for the Tasks", || {
        let denied = env.api.denied();
        async move {
            denied
                .iter()
                .any(|d| d.contains("no-tasks") && d.contains("\"tasks\""))
                .then_some(())
        }
    })
    .await;
    assert!(
        !metrics.ready(),
        "ready without its Task cache: {:?}",
        env.api.denied()
    );

    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(10), task).await;
    let result = stopped
        .expect("the server stops within 10 s")
        .expect("the server's task");
    result.expect("the server stopped cleanly");
}
