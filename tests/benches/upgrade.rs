//! Agent upgrades on real processes (one robot run by a stand-in for
//! systemd that follows the committed unit, the stack, Mosquitto, a
//! loopback file server): `agent_upgrade_s`, from the rollout's creation to
//! the new agent confirmed, and `agent_rollback_s`, from the rollout of a
//! binary that exits at start to the old agent confirmed again (both
//! include the unit's RestartSec, 5 s, once for an upgrade and three
//! times and more for the rollback), and `agent_rollback_hang_s`, from the
//! switch to a binary that hangs (stops itself) to the old agent back and
//! reporting, with the health timeout `HANG_HEALTH_TIMEOUT`: systemd's
//! watchdog kills it (the unit's WatchdogSec, TimeoutAbortSec) and the
//! boot check rolls it back.
//!
//!     cargo bench -p k8s4r-e2e --bench upgrade -- [rounds]   (default 3)

#[path = "../tests/support/mod.rs"]
#[allow(unused)]
mod support;
#[path = "../tests/support/upgrades.rs"]
mod upgrades;

use std::time::{Duration, Instant};

use k8s4r_api::{RobotUpgradePhase, RolloutState};
use k8s4r_e2e::NEXT_VERSION;
use upgrades::{fleet, upgrade_of, version_of, OLD_VERSION};

const HEALTH_TIMEOUT: &str = "30s";
const HANG_HEALTH_TIMEOUT: &str = "15s";

#[tokio::main]
async fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(3);
    let mut upgrade = Vec::new();
    let mut rollback = Vec::new();
    let mut hang = Vec::new();
    for round in 0..rounds {
        let f = fleet(&["bench"], &[]).await;
        let started = Instant::now();
        f.roll_out("next", "next", 1, 0, HEALTH_TIMEOUT).await;
        f.wait_state("next", RolloutState::Complete, Duration::from_secs(300))
            .await;
        let robot = f.robot("bench").await;
        assert_eq!(version_of(&robot), Some(NEXT_VERSION));
        upgrade.push(started.elapsed());
        f.stop().await;

        let f = fleet(&["bench"], &[]).await;
        let started = Instant::now();
        f.roll_out("crash", "crash", 1, 0, HEALTH_TIMEOUT).await;
        f.wait_state("crash", RolloutState::PausedOnFailures, Duration::from_secs(300))
            .await;
        let robot = f.robot("bench").await;
        assert_eq!(version_of(&robot), Some(OLD_VERSION));
        assert_eq!(
            upgrade_of(&robot).map(|u| u.1),
            Some(RobotUpgradePhase::RolledBack)
        );
        rollback.push(started.elapsed());
        f.stop().await;

        let f = fleet(&["bench"], &[]).await;
        f.roll_out("hang", "hang", 1, 0, HANG_HEALTH_TIMEOUT).await;
        let deadline = Instant::now() + Duration::from_secs(300);
        while f.units["bench"].starts() < 2 {
            assert!(Instant::now() < deadline, "the robot never switched");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let switched = Instant::now();
        f.wait_state("hang", RolloutState::PausedOnFailures, Duration::from_secs(300))
            .await;
        let robot = f.robot("bench").await;
        assert_eq!(version_of(&robot), Some(OLD_VERSION));
        hang.push(switched.elapsed());
        f.stop().await;
        println!(
            "round {round}: upgrade {:.1} s, rollback {:.1} s, hang rolled back {:.1} s",
            upgrade[round].as_secs_f64(),
            rollback[round].as_secs_f64(),
            hang[round].as_secs_f64()
        );
    }
    for (name, v) in [
        ("agent_upgrade_s", upgrade),
        ("agent_rollback_s", rollback),
        ("agent_rollback_hang_s", hang),
    ] {
        let median = {
            let mut v = v.clone();
            v.sort();
            v[v.len() / 2]
        };
        let max = v.iter().max().copied().unwrap_or_default();
        println!("{name}: {} rounds, max {:.1} s", v.len(), max.as_secs_f64());
        println!("BENCH {name} {:.1} s", median.as_secs_f64());
    }
    println!("health timeout {HEALTH_TIMEOUT} ({HANG_HEALTH_TIMEOUT} for the hang)");
    println!(
        "load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}
