//! The deterministic simulation of the fleet (`k8s4r_sim::world`): many
//! seeds, each a whole fleet under faults on a virtual clock, checked.
//!
//!     cargo bench -p k8s4r-e2e --bench simulation -- --seeds N [--first F] [--seed S]
//!
//! `--seeds N` runs N seeds from `--first F` (a fresh one by default,
//! printed); `--seed S` runs S alone and prints its whole history. Each
//! failing seed is printed with the shortest history that still shows its
//! first violation (of kind `--kind K`, e.g. `LostCompletion`, if given):
//! faults are removed one by one while it persists. Prints
//! `BENCH sim_seeds_run`, `sim_violations`, `sim_virtual_hours`,
//! `sim_seeds_per_cpu_minute` and `sim_faults_per_seed`; exits non-zero
//! when a seed failed.

use std::collections::BTreeMap;

use k8s4r_sim::world::{self, WorldConfig};
use k8s4r_testbed::bench_arg;

fn main() {
    let config = WorldConfig::default();
    let only = std::env::args().any(|a| a == "--seed");
    let (first, count) = if only {
        (bench_arg("--seed", 0), 1)
    } else {
        (
            bench_arg("--first", k8s4r_e2e::chaos::fresh_seed() >> 16),
            bench_arg("--seeds", 200),
        )
    };
    println!("load average before {}", k8s4r_e2e::chaos::load_average());
    println!("seeds {first}..{}", first + count);
    let cpu_before = cpu_seconds();
    let mut violations = 0usize;
    let mut virtual_ms = 0u64;
    let mut faults = 0usize;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut failing = Vec::new();
    for seed in first..first + count {
        let report = world::run(seed, &config);
        virtual_ms += report.virtual_ms;
        faults += report.faults.len();
        if only {
            for entry in &report.history {
                println!("  {entry}");
            }
        }
        if !report.violations.is_empty() {
            violations += report.violations.len();
            for v in &report.violations {
                *kinds.entry(format!("{:?}", v.kind)).or_default() += 1;
            }
            failing.push((seed, report));
        }
    }
    let cpu = cpu_seconds() - cpu_before;
    let wanted = std::env::args().skip_while(|a| a != "--kind").nth(1);
    for (seed, report) in &failing {
        let Some(shown) = report
            .violations
            .iter()
            .find(|v| wanted.as_ref().is_none_or(|k| *k == format!("{:?}", v.kind)))
        else {
            println!("FAILED seed {seed} ({} violations)", report.violations.len());
            continue;
        };
        let shortest = world::shrink(*seed, &config, report, shown.kind);
        let first = shortest
            .violations
            .iter()
            .find(|v| v.kind == shown.kind)
            .unwrap_or(shown);
        println!(
            "FAILED seed {seed} ({} violations; shortest history, {} of {} faults):",
            report.violations.len(),
            shortest.faults.len(),
            report.faults.len()
        );
        print!("{}", shortest.story(first));
    }
    for (kind, n) in &kinds {
        println!("  {kind}: {n}");
    }
    println!("load average after {}", k8s4r_e2e::chaos::load_average());
    println!("BENCH sim_seeds_run {count} seeds");
    println!("BENCH sim_violations {violations} violations");
    println!("BENCH sim_virtual_hours {:.1} h", virtual_ms as f64 / 3_600_000.0);
    println!(
        "BENCH sim_faults_per_seed {:.1} faults",
        faults as f64 / count.max(1) as f64
    );
    println!(
        "BENCH sim_seeds_per_cpu_minute {:.0} seeds",
        count as f64 / (cpu / 60.0).max(1e-9)
    );
    if violations > 0 {
        std::process::exit(1);
    }
}

/// CPU time this process used (user and system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th fields of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}
