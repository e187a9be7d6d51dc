//! The fault scenarios of docs/fencing.md against real processes: every
//! program a process, each agent behind a proxy the scenario cuts or
//! blackholes, tasks that record when they really ran. One at a time (a
//! lock): they measure timing on 2 cores.

use k8s4r_e2e::faults::{self, Binaries, Report};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bins() -> Binaries {
    Binaries {
        apiserver: env!("CARGO_BIN_EXE_e2e-apiserver").into(),
        server: env!("CARGO_BIN_EXE_e2e-server").into(),
        manager: env!("CARGO_BIN_EXE_e2e-manager").into(),
        agent: env!("CARGO_BIN_EXE_e2e-agent").into(),
    }
}

fn check(report: Report) {
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
