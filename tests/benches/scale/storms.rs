//! The reconnect storm: every broker restarted under a fleet running work.

use super::*;

/// The broker restarts (without persistence: every session and retained
/// message is gone) under a fleet running work: time until every robot is
/// connected and registered again, dispatches that reached a robot twice
/// (or a second robot while the first held the task), and status updates
/// a robot reported that the cluster never recorded.
pub(super) async fn reconnect_storm(robots: usize, jobs: usize, rate: u64) {
    let mut cluster = start_cluster(robots).await;
    let fleet = Sims::start(
        &cluster,
        robots,
        Behaviour {
            heartbeat: Duration::from_secs(30),
            // Tasks long enough to be running when the broker goes.
            tasks: (
                Duration::from_secs(arg("--task-min-s", 5)),
                Duration::from_secs(arg("--task-max-s", 20)),
            ),
        },
    );
    all_online(&cluster, robots).await;
    // What the storm writes, by kind of object (the watches list first,
    // within the settling time).
    let (written, watches) = cost::Written::start(&cluster.client);
    tokio::time::sleep(Duration::from_secs(arg("--settle", 10))).await;
    // Jobs arrive before, during and after the restart.
    let client = cluster.client.clone();
    let creating = tokio::spawn(async move { create_jobs(&client, "d-", jobs, rate, Instant::now()).await });
    let deadline = Instant::now() + Duration::from_secs(300);
    while (fleet.dispatches() as usize) < jobs / 3 {
        assert!(Instant::now() < deadline, "work did not reach the robots");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = fleet.dispatches().saturating_sub(fleet.finished());
    let rv0 = resource_version(&cluster.client).await;
    let (by_kind0, server0) = (written.now(), writes_by_kind(&cluster).await);
    let restarted = Instant::now();
    tokio::task::block_in_place(|| cluster.restart_brokers());
    let deadline = Instant::now() + Duration::from_secs(arg("--deadline", 600));
    loop {
        let again = fleet.registered_since(restarted);
        if again >= robots && cluster.phases.online() >= robots {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{again}/{robots} robots registered again after the broker restarted"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = restarted.elapsed().as_secs_f64();
    let storm_writes = resource_version(&cluster.client).await.saturating_sub(rv0);
    let (by_kind, server) = (written.now(), writes_by_kind(&cluster).await);
    println!(
        "INFO the storm's API writes by kind of object: {}",
        writes_between(&by_kind0, &by_kind)
    );
    println!(
        "INFO the server's and the manager's meanwhile, by kind: {}",
        writes_between(&server0, &server)
    );
    for watch in watches {
        watch.abort();
    }
    let created = creating.await.expect("jobs created");
    // Every task ends: its robot reported it, or the manager moved it.
    let deadline = Instant::now() + Duration::from_secs(900);
    let tasks = loop {
        let tasks = all_tasks(&cluster.client).await;
        let ended = tasks
            .iter()
            .filter(|t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.state)
                    .is_some_and(|s| s.is_terminal())
            })
            .count();
        if ended >= created.len() {
            break tasks;
        }
        assert!(
            Instant::now() < deadline,
            "{ended}/{} tasks ended 900 s after the restart",
            created.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let runs = fleet.runs();
    let lost = runs::lost_statuses(&tasks, &runs);
    let retried = tasks
        .iter()
        .filter(|t| t.status.as_ref().is_some_and(|s| s.attempt > 1))
        .count();
    let twice = Twice::of(&runs);
    println!(
        "INFO {} restarted under {robots} robots holding {held} tasks; {} jobs; all registered again after {took:.1} s with {storm_writes} API writes meanwhile (the jobs' included); {} tasks retried; {} status updates sent again; {} tasks ran twice at once, {} were completed twice; {} re-sent dispatches refused by the robot's fence",
        if cluster.edges.is_empty() { "the broker" } else { "every broker" },
        created.len(),
        retried,
        fleet.resent_statuses(),
        twice.at_once,
        twice.completed,
        fleet.resent_dispatches(),
    );
    println!("BENCH reconnect_storm_{}_s {took:.1} s", label(robots));
    println!("BENCH reconnect_duplicates {} tasks", twice.tasks);
    println!("BENCH reconnect_lost {lost} statuses");
    fleet.stop().await;
}
