//! The fault scenarios of docs/fencing.md against real processes: every
//! program a process, each agent behind a proxy the scenario cuts or
//! blackholes, tasks that record when they really ran. One at a time (a
//! lock): they measure timing on 2 cores.

use k8s4r_e2e::faults::{self, Binaries, Report};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bins() -> Binaries {
    k8s4r_e2e::binaries!()
}

fn check(report: Report) {
    for note in &report.notes {
        eprintln!("{}: {note}", report.name);
    }
    assert!(
        report.passed(),
        "{}: overlapping attempts {}, lost statuses {}, finished twice {}, not completed {}, problems {:?}\n{report:#?}",
        report.name,
        report.overlapping,
        report.lost(),
        report.finished_twice,
        report.not_completed,
        report.problems
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_robots_task_completes_once_without_overlap() {
    let _one = SERIAL.lock().await;
    check(faults::blackholed_robot_is_replaced(&bins()).await);
}

/// At the server's default idle Lease interval (600 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_an_idle_robot_that_takes_work_and_is_blackholed_is_replaced_without_overlap() {
    let _one = SERIAL.lock().await;
    check(faults::an_idle_robot_takes_work_and_is_blackholed(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_without_replacement_the_task_finishes_on_its_robot() {
    let _one = SERIAL.lock().await;
    check(faults::blackholed_robot_is_waited_for(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_a_server_sigkilled_during_a_burst_loses_no_status() {
    let _one = SERIAL.lock().await;
    check(faults::server_killed_during_a_burst(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_an_api_server_outage_loses_no_status() {
    let _one = SERIAL.lock().await;
    check(faults::api_server_down(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_a_broker_restart_loses_nothing_and_runs_nothing_twice() {
    let _one = SERIAL.lock().await;
    check(faults::broker_restarted(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_a_flooding_robot_does_not_slow_the_others() {
    let _one = SERIAL.lock().await;
    let (report, quiet, flooded) = faults::flood_costs_the_flooder_only(&bins()).await;
    eprintln!("dispatch p99: quiet {quiet:?}, flooded {flooded:?}");
    check(report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g_deleting_a_task_whose_dispatch_is_in_flight_completes() {
    let _one = SERIAL.lock().await;
    check(faults::deleting_a_held_task(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_a_robot_flooding_unknown_attempts_costs_the_others_nothing() {
    let _one = SERIAL.lock().await;
    check(faults::flood_of_unknown_attempts(&bins(), 20, std::time::Duration::from_secs(40)).await);
}

/// At the agents' default heartbeat interval, for `K8S4R_SHORT_STOP_AFTER_SECS`
/// (default 120 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i_a_short_stop_after_never_stops_a_healthy_robots_task() {
    let _one = SERIAL.lock().await;
    let secs = std::env::var("K8S4R_SHORT_STOP_AFTER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    check(faults::short_stop_after_on_healthy_robots(&bins(), std::time::Duration::from_secs(secs)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j_a_cancel_while_the_dispatch_is_recorded_stops_the_attempt() {
    let _one = SERIAL.lock().await;
    check(faults::cancel_while_a_dispatch_is_recorded(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_a_dispatch_that_waited_for_its_robot_never_runs_beside_a_replacement() {
    let _one = SERIAL.lock().await;
    check(faults::a_dispatch_that_waited_for_its_robot(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l_a_fenced_attempt_runs_its_pre_stop_and_stops_on_sigint_before_its_replacement() {
    let _one = SERIAL.lock().await;
    check(k8s4r_e2e::stopping::fenced_attempt_stops_gracefully_before_its_replacement(&bins()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m_the_robots_facts_start_a_waiting_task_and_stop_a_running_one_at_once() {
    let _one = SERIAL.lock().await;
    let (to_start, to_stop) = k8s4r_e2e::stopping::fact_latencies(&bins(), 3).await;
    eprintln!("fact to start {to_start:?}, fact to stop {to_stop:?}");
    for d in &to_start {
        assert!(
            *d < std::time::Duration::from_secs(1),
            "a task started {d:?} after the facts allowed it"
        );
    }
    for d in &to_stop {
        assert!(
            *d < std::time::Duration::from_millis(500),
            "a task was stopped {d:?} after its condition broke"
        );
    }
}
