//! The highest steady rate of Jobs a fleet sustains: on one cluster and
//! one fleet, single-task Jobs at each rate of `--rates` in turn, each for
//! `--minutes`, until a rate's created → started p99 goes over 1,000 ms
//! or a task of it does not finish; the last rate that held is
//! `sustained_jobs_per_s_<robots>_robots`. Each step waits for its tasks to
//! end before the next begins, and reports the cores each part used
//! (the product's programs apart from the brokers and the simulator).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::runs::{self, Latencies, Twice};
use crate::sims::{Behaviour, Sims};
use crate::{all_online, all_tasks, arg, cpu_by_part, cpu_spent, create_jobs, label, start_cluster};

/// The p99 a rate must keep, ms.
const P99_BAR_MS: f64 = 1000.0;

pub async fn run(robots: usize) {
    let rates: Vec<u64> = k8s4r_testbed::bench_list("--rates")
        .unwrap_or_else(|| vec!["10".into(), "20".into(), "30".into()])
        .iter()
        .map(|r| r.parse().expect("--rates: Jobs a second, comma-separated"))
        .collect();
    let minutes = arg("--minutes", 10);
    let cluster = start_cluster(robots).await;
    let fleet = Sims::start(&cluster, robots, Behaviour::heartbeat(Duration::from_secs(30)));
    all_online(&cluster, robots).await;
    tokio::time::sleep(Duration::from_secs(arg("--settle", 10))).await;
    // What the idle fleet costs (heartbeats, Lease renewals), to take off
    // each step's product CPU: what is left is the tasks'.
    let idle_s = arg("--idle", 60) as f64;
    let idle_from = cpu_by_part(&cluster, &fleet);
    tokio::time::sleep(Duration::from_secs_f64(idle_s)).await;
    let (idle_cores, idle_cpu) = cpu_spent(&idle_from, &cpu_by_part(&cluster, &fleet), idle_s);
    let idle_product_cores = idle_cpu / idle_s;
    println!("INFO the idle fleet over {idle_s:.0} s, cores by part: {idle_cores}");
    let mut sustained = 0;
    let mut finished_before = 0;
    for (step, &rate) in rates.iter().enumerate() {
        let jobs = usize::try_from(rate * minutes * 60).unwrap_or(usize::MAX);
        let started = Instant::now();
        let cpu_before = cpu_by_part(&cluster, &fleet);
        let created = create_jobs(&cluster.client, &format!("s{step}-"), jobs, rate, started).await;
        // A step's tasks end within the drain time after the last create,
        // or the rate did not hold.
        let deadline = Instant::now() + Duration::from_secs(arg("--drain", 300));
        while Instant::now() < deadline && (fleet.finished() as usize) < finished_before + jobs {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let took = started.elapsed().as_secs_f64();
        let (cores, product_cpu) = cpu_spent(&cpu_before, &cpu_by_part(&cluster, &fleet), took);
        let tasks = all_tasks(&cluster.client).await;
        let step_uids: HashSet<&str> = tasks
            .iter()
            .filter(|t| {
                t.labels()
                    .get(k8s4r_api::names::LABEL_JOB)
                    .is_some_and(|job| created.contains_key(job))
            })
            .filter_map(|t| t.metadata.uid.as_deref())
            .collect();
        let runs: Vec<_> = fleet
            .runs()
            .into_iter()
            .filter(|r| step_uids.contains(r.uid.as_str()))
            .collect();
        let finished = runs::finished_tasks(&runs);
        finished_before += finished;
        let latencies = Latencies::of(&tasks, &runs, &created, jiff::Timestamp::now());
        let (p50, p99) = (latencies.pct(50.0), latencies.pct(99.0));
        let twice = Twice::of(&runs);
        println!(
            "INFO {rate} Jobs/s: {}",
            Latencies::stages(&tasks, &runs, &created)
        );
        println!(
            "INFO {rate} Jobs/s for {minutes} min onto {robots} robots: {finished} of {jobs} tasks finished in {took:.1} s; created → started p50 {p50:.1} ms, p99 {p99:.1} ms; {} ran twice; the product's CPU {:.2} ms a task, the idle fleet's taken off; cores by part: {cores}",
            twice.tasks,
            (product_cpu - idle_product_cores * took).max(0.0) * 1000.0 / finished.max(1) as f64,
        );
        println!(
            "BENCH sustain_p99_ms_at_{rate}_per_s_{}_robots {p99:.1} ms",
            label(robots)
        );
        if finished < jobs || p99 > P99_BAR_MS {
            break;
        }
        sustained = rate;
    }
    println!(
        "BENCH sustained_jobs_per_s_{}_robots {sustained} jobs/s",
        label(robots)
    );
    fleet.stop().await;
}
