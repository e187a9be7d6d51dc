//! The randomized fault run (issue 26): the whole stack as real processes
//! under a seeded nemesis, then the checker (see `k8s4r_e2e::chaos`).
//!
//!     cargo bench -p k8s4r-e2e --bench chaos --profile dev -- --seed S --minutes M
//!
//! Without `--seed` a fresh one is drawn and printed: a failing run replays
//! with it. `--robots N` (default 4) and `--recovery-secs` (default 180)
//! change the cluster and how long Jobs may take to settle after the last
//! fault. Prints the seed, the faults by kind, every problem found, and
//! `BENCH chaos_faults_injected`, `chaos_overlaps`, `chaos_lost_statuses`,
//! `chaos_stuck_jobs` and `chaos_minutes`. Exits non-zero when a check
//! failed. Needs root for the disk faults (a tmpfs per robot) and
//! libfaketime for the clock faults; without them those kinds are skipped.

use std::time::Duration;

use k8s4r_e2e::chaos::{self, Settings};
use k8s4r_testbed::bench_arg;

#[tokio::main]
async fn main() {
    let bins = k8s4r_e2e::binaries!();
    let seed = bench_arg("--seed", chaos::fresh_seed());
    let minutes = bench_arg("--minutes", 30);
    let mut settings = Settings::new(seed, Duration::from_secs(minutes * 60));
    settings.robots = bench_arg("--robots", 4) as usize;
    settings.recovery = Duration::from_secs(bench_arg("--recovery-secs", 180));
    let load_before = chaos::load_average();
    let outcome = chaos::run(&bins, settings).await;
    println!("seed {seed}");
    println!(
        "load average before {load_before}, after {}",
        chaos::load_average()
    );
    println!(
        "{} jobs, {} attempts, {} terminal statuses acknowledged, {} manual cancels and retries",
        outcome.jobs, outcome.attempts, outcome.acknowledged, outcome.manual
    );
    for (kind, n) in &outcome.by_kind {
        println!("  {kind}: {n}");
    }
    for problem in &outcome.problems {
        println!("PROBLEM {problem}");
    }
    for line in outcome.bench_lines() {
        println!("{line}");
    }
    if !outcome.passed() {
        std::process::exit(1);
    }
}
