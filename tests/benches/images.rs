//! `k8s4r image push` on the real programs: the embedded API server,
//! server and manager, a real Mosquitto on loopback, a real agent offering
//! podman (vfs, runc, a store of the bench's own) and the real CLI.
//!
//! - `image_push_mib_per_s`: an OCI archive of an image of about 100 MiB
//!   (a layer of random bytes: nothing to compress) from the CLI through
//!   the API server, the server and MQTT into the robot's podman store, at
//!   the robot's default session rate (`session_bytes_per_second`, 8 MiB/s,
//!   which bounds it), over the archive's size and the push's wall time
//!   (its load into podman's store included).
//!
//! Run as:
//!
//!     cargo bench -p k8s4r-e2e --bench images -- [MiB of filler]   (default 100)

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s4r::up::{manager_config, Stack, UpArgs};
use k8s4r_api::{Robot, RobotPhase};
use k8s4r_testbed::registry::{PodmanStore, Registry};
use k8s4r_testbed::{eventually, free_port, Mosquitto};
use kube::Api;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(600);
const MIB: f64 = 1024.0 * 1024.0;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() {
    let filler_mib: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    println!(
        "INFO load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let registry = Registry::start();
    let image = registry.push_test_image_with("bench", filler_mib << 20);
    let dir = tempfile::tempdir().expect("a dir");
    let archive = dir.path().join("bench.oci.tar");
    let copied = Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{image}"))
        .arg(format!("oci-archive:{}", archive.display()))
        .output()
        .expect("skopeo runs");
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let size = std::fs::metadata(&archive).expect("the archive").len();

    let mosquitto = Mosquitto::start();
    let data_dir = dir.path().join("data");
    let (api, broker) = (format!("127.0.0.1:{}", free_port()), mosquitto.url());
    let store_listen = format!("127.0.0.1:{}", free_port());
    let args = UpArgs::from_flags(&[
        "--api-bind",
        &api,
        "--mqtt-bind",
        "127.0.0.1:0",
        "--broker-url",
        &broker,
        "--local-agent",
        "false",
        "--in-memory",
        "--no-dashboard",
        "--store-listen",
        &store_listen,
    ])
    .expect("the flags of up");
    let stack = Stack::start_with(&args, &data_dir, CancellationToken::new(), manager_config())
        .await
        .expect("the stack starts");
    let token = std::fs::read_to_string(data_dir.join("bootstrap-token")).expect("token");
    let podman = PodmanStore::new();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_e2e-agent"));
    agent
        .args([
            "--robot-id",
            "bench-1",
            "--token",
            token.trim(),
            "--broker-url",
            &broker,
        ])
        .arg("--state-dir")
        .arg(dir.path().join("agent"))
        .args(["--podman", "true"]);
    for arg in podman.args() {
        agent.arg(format!("--podman-arg={arg}"));
    }
    let _agent = Killed(
        agent
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the agent starts"),
    );
    let robots: Api<Robot> = Api::all(stack.client.clone());
    eventually(DEADLINE, "the robot online", || async {
        let r = robots.get_opt("bench-1").await.ok()??;
        (r.status?.phase? == RobotPhase::Online).then_some(())
    })
    .await;

    let began = Instant::now();
    let out = tokio::task::spawn_blocking({
        let archive = archive.clone();
        let kubeconfig = k8s4r::up::kubeconfig_path(&data_dir);
        move || {
            Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"))
                .env("KUBECONFIG", kubeconfig)
                .args(["image", "push", "robot/bench-1", "--archive"])
                .arg(&archive)
                .output()
                .expect("the CLI runs")
        }
    })
    .await
    .expect("the push");
    let took = began.elapsed();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = podman.podman(&["image", "exists", &image]);
    assert!(listed.is_empty());
    println!(
        "INFO {:.1} MiB archive pushed and loaded in {took:.2?}",
        size as f64 / MIB
    );
    println!(
        "BENCH image_push_mib_per_s {:.2} MiB/s",
        size as f64 / MIB / took.as_secs_f64()
    );
    println!(
        "INFO load average at end: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    drop(stack);
}
