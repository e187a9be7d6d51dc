//! A changed ConfigMap reaching running services on real agents: from the
//! change written to the new file in place (the service's SIGHUP, which
//! follows the file), across 100 services on 10 agents.
//!
//!     cargo bench -p k8s4r-e2e --bench config_change -- [rounds] [robots] [services]
//!     (defaults 10, 10, 100)

use std::time::Duration;

fn p(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let numbers: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rounds = numbers.first().copied().unwrap_or(10);
    let robots = numbers.get(1).copied().unwrap_or(10);
    let services = numbers.get(2).copied().unwrap_or(100);
    let bins = k8s4r_e2e::binaries!();
    let mut v = k8s4r_e2e::config_change::config_change_latencies(&bins, robots, services, rounds).await;
    println!(
        "config change: {rounds} rounds x {services} services on {robots} agents; median {:.1} ms, max {:.1} ms",
        ms(p(&mut v, 0.5)),
        ms(p(&mut v, 1.0))
    );
    println!(
        "BENCH config_change_to_service_p99_ms {:.1} ms",
        ms(p(&mut v, 0.99))
    );
}
