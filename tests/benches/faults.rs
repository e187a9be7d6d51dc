//! Runs every fault scenario once and prints what RELIABILITY.md records:
//! one row per scenario, then `BENCH fault_overlapping_attempts`,
//! `BENCH fault_lost_statuses` and `BENCH fault_scenarios_passed`.
//!
//!     cargo bench -p k8s4r-e2e --bench faults --profile dev
//!
//! (The dev profile reuses the test build; the figures are counts, not
//! timings, so the profile does not change them.)

use k8s4r_e2e::faults;

#[tokio::main]
async fn main() {
    let bins = k8s4r_e2e::binaries!();
    let reports = faults::all(&bins).await;
    println!(
        "| scenario | tasks | runs | finished | applied | overlapping attempts | lost statuses | passed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &reports {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.tasks,
            r.runs,
            r.finished,
            r.applied,
            r.overlapping,
            r.lost(),
            if r.passed() { "yes" } else { "no" }
        );
        for note in &r.notes {
            println!("  {}: {note}", r.name);
        }
        if !r.passed() {
            println!("  problems: {:?}", r.problems);
        }
    }
    let overlapping: usize = reports.iter().map(|r| r.overlapping).sum();
    let lost: usize = reports.iter().map(|r| r.lost()).sum();
    let passed = reports.iter().filter(|r| r.passed()).count();
    println!("BENCH fault_overlapping_attempts {overlapping} pairs");
    println!("BENCH fault_lost_statuses {lost} statuses");
    println!(
        "BENCH fault_scenarios_passed {passed}/{} scenarios",
        reports.len()
    );
}
