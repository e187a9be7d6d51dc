//! A short randomized fault run with a fresh seed (the 30-minute run is
//! `cargo bench -p k8s4r-e2e --bench chaos`; RELIABILITY.md records it).
//! `K8S4R_CHAOS_SEED` replays a seed, `K8S4R_CHAOS_MINUTES` (default 3)
//! sets the length.

use std::time::Duration;

use k8s4r_e2e::chaos::{self, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_randomized_fault_run_breaks_no_invariant() {
    let bins = k8s4r_e2e::binaries!();
    let seed = std::env::var("K8S4R_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(chaos::fresh_seed);
    let minutes: f64 = std::env::var("K8S4R_CHAOS_MINUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let outcome = chaos::run(
        &bins,
        Settings::new(seed, Duration::from_secs_f64(minutes * 60.0)),
    )
    .await;
    for line in outcome.bench_lines() {
        eprintln!("{line}");
    }
    eprintln!("faults by kind: {:?}", outcome.by_kind);
    assert!(
        outcome.passed(),
        "seed {seed} (replay with K8S4R_CHAOS_SEED={seed}): {} problems:\n{}",
        outcome.problems.len(),
        outcome.problems.join("\n")
    );
    assert!(outcome.faults >= 10, "only {} faults injected", outcome.faults);
}
