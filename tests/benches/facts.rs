//! The robot's facts against its tasks, on the real programs (API server,
//! server, manager, Mosquitto and an agent, each a process): how long from
//! writing the facts file to a waiting task running (`fact_to_start`), and
//! to a `whileRunning: stop` task's stop signal reaching it
//! (`fact_to_stop`). Each round writes the file as a robot would (a
//! temporary file renamed into place); the times are the task's own.
//!
//!     cargo bench -p k8s4r-e2e --bench facts -- [rounds]   (default 50)

use std::time::Duration;

fn p(mut v: Vec<Duration>, q: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(50);
    let bins = k8s4r_e2e::binaries!();
    let (start, stop) = k8s4r_e2e::stopping::fact_latencies(&bins, rounds).await;
    for (name, v) in [("fact_to_start", start), ("fact_to_stop", stop)] {
        println!(
            "{name}: {} rounds, median {:.1} ms, max {:.1} ms",
            v.len(),
            ms(p(v.clone(), 0.5)),
            ms(p(v.clone(), 1.0))
        );
        println!("BENCH {name}_p99_ms {:.1} ms", ms(p(v, 0.99)));
    }
}
