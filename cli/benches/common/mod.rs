//! What the `k8s4r` benches share.

use std::net::TcpListener;

/// A port free on loopback now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `p`th percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Prints the load average, as every figure is recorded with it; false when
/// the bench was not asked for (`cargo test` builds benches and runs them
/// without `--bench`).
pub fn start() -> bool {
    if !std::env::args().any(|a| a == "--bench") {
        return false;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "INFO load average at start: {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    true
}
