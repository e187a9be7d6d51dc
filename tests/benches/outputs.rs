//! Task outputs on the real programs: the embedded API server, server and
//! manager with `k8s4r up`'s embedded object store, a real Mosquitto on
//! loopback and a real agent process, its link to the store through a TCP
//! proxy that counts what it carries.
//!
//! - `upload_mib_per_s`: a file's upload, uncapped (`--upload-bytes-per-
//!   second 0`), from the first byte on the wire to the object complete
//!   (the Task lists it uploaded);
//! - `upload_resume_resent_mib`: bytes sent beyond the file's size after
//!   the link to the store (slowed to 20 MB/s for it, so that the cut
//!   lands in a part) is cut in the middle of its upload (the part on the
//!   way is sent again; the parts the store took are not);
//! - `upload_agent_rss_mib`: the agent's resident memory at its highest
//!   while it uploads a large file, its first (sampled every 100 ms).
//!
//! Run as:
//!
//!     cargo bench -p k8s4r-e2e --bench outputs -- [MB uploaded] [MB for the RSS run]
//!     (defaults 200 and 2000)
//!
//! The agent is this package's release build, unless `K8S4R_BENCH_AGENT`
//! names another binary: the agent as shipped to robots, for its memory
//! (`cargo build --profile robot -p k8s4r-agent`, then
//! `K8S4R_BENCH_AGENT=target/robot/k8s4r-agent`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s4r::up::{manager_config, Stack, UpArgs};
use k8s4r_api::{OutputState, Robot, RobotPhase, Task};
use k8s4r_testbed::proxy::{Fault, Proxy};
use k8s4r_testbed::{eventually, free_port, Mosquitto};
use kube::api::PostParams;
use kube::Api;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(600);
const MB: u64 = 1_000_000;
const MIB: f64 = 1024.0 * 1024.0;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

struct Bench {
    stack: Stack,
    proxy: Proxy,
    agent: Killed,
    dir: tempfile::TempDir,
    jobs: usize,
}

/// What one upload took.
struct Uploaded {
    /// From the first byte on the wire to the Task listing it uploaded.
    took: Duration,
    /// Bytes the proxy carried for it.
    carried: u64,
    /// The agent's highest resident memory meanwhile, in KiB.
    rss_kib: u64,
}

impl Bench {
    /// Writes `bytes` random bytes as a task's output and waits until the
    /// Task lists it uploaded; with `cut`, the link to the store is cut
    /// for two seconds once half of it is on the wire.
    async fn upload(&mut self, bytes: u64, cut: bool) -> Uploaded {
        self.jobs += 1;
        let name = format!("out-{}", self.jobs);
        // Written before the task starts: the upload is all that is timed.
        let file = self.dir.path().join(format!("{name}.bin"));
        let status = Command::new("head")
            .args(["-c", &bytes.to_string(), "/dev/urandom"])
            .stdout(std::fs::File::create(&file).expect("a file"))
            .status()
            .expect("head runs");
        assert!(status.success());
        let job: k8s4r_api::Job = serde_json::from_value(serde_json::json!({
            "apiVersion": "robot.k8s4r.io/v1alpha1",
            "kind": "Job",
            "metadata": { "name": name, "namespace": "default" },
            "spec": { "taskGroups": [{ "name": "t", "count": 1, "task": {
                "driver": "raw_exec", "command": "/bin/sh",
                "args": ["-c", format!("mv {} data.bin", file.display())],
                "timeout": "10m",
                "outputs": [{ "path": "data.bin" }],
            }}]},
        }))
        .expect("a Job");
        let before = self.proxy.upstream_bytes();
        Api::<k8s4r_api::Job>::namespaced(self.stack.client.clone(), "default")
            .create(&PostParams::default(), &job)
            .await
            .expect("create the Job");
        let began = eventually(DEADLINE, "the first bytes on the wire", || async {
            (self.proxy.upstream_bytes() > before).then(Instant::now)
        })
        .await;
        let pid = self.agent.0.id();
        let tasks: Api<Task> = Api::namespaced(self.stack.client.clone(), "default");
        let task = format!("{name}-t-0");
        let (mut rss, mut was_cut) = (0, false);
        loop {
            rss = rss.max(rss_kib(pid));
            if cut && !was_cut && self.proxy.upstream_bytes() - before >= bytes / 2 {
                let was = self.proxy.fault();
                self.proxy.set(Fault::Cut);
                tokio::time::sleep(Duration::from_secs(2)).await;
                self.proxy.set(was);
                was_cut = true;
            }
            let uploaded = tasks
                .get(&task)
                .await
                .ok()
                .and_then(|t| t.status)
                .is_some_and(|s| s.outputs.iter().any(|o| o.state == OutputState::Uploaded));
            if uploaded {
                break;
            }
            assert!(began.elapsed() < DEADLINE, "{task} not uploaded in {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Uploaded {
            took: began.elapsed(),
            carried: self.proxy.upstream_bytes() - before,
            rss_kib: rss,
        }
    }
}

#[tokio::main]
async fn main() {
    let numbers: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let size = numbers.first().copied().unwrap_or(200) * MB;
    let big = numbers.get(1).copied().unwrap_or(2000) * MB;
    println!(
        "INFO load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let dir = tempfile::tempdir().expect("a dir");
    let mosquitto = Mosquitto::start();
    let data_dir = dir.path().join("data");
    let store = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let proxy = Proxy::start(store).await;
    let (api, broker, listen, url) = (
        format!("127.0.0.1:{}", free_port()),
        mosquitto.url(),
        store.to_string(),
        format!("http://{}", proxy.addr()),
    );
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
        &listen,
        "--store-url",
        &url,
    ])
    .expect("the flags of up");
    let stack = Stack::start_with(&args, &data_dir, CancellationToken::new(), manager_config())
        .await
        .expect("the stack starts");
    let token = std::fs::read_to_string(data_dir.join("bootstrap-token")).expect("token");
    let agent = Killed(
        Command::new(
            std::env::var_os("K8S4R_BENCH_AGENT").unwrap_or_else(|| env!("CARGO_BIN_EXE_e2e-agent").into()),
        )
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
        .args([
            "--raw-exec",
            "true",
            "--allow-root",
            "true",
            "--upload-bytes-per-second",
            "0",
        ])
        .args(["--outputs-quota-bytes", &(big * 2).to_string()])
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
    let mut bench = Bench {
        stack,
        proxy,
        agent,
        dir,
        jobs: 0,
    };

    // The agent's memory while a large file goes: first, on an agent that
    // has uploaded nothing yet.
    let idle = rss_kib(bench.agent.0.id());
    let large = bench.upload(big, false).await;
    println!(
        "INFO {} MB uploaded in {:.2?}; agent RSS before {:.1} MiB",
        big / MB,
        large.took,
        idle as f64 / 1024.0
    );
    println!(
        "BENCH upload_agent_rss_mib {:.1} MiB",
        large.rss_kib as f64 / 1024.0
    );

    // Uncapped, on loopback.
    let first = bench.upload(size, false).await;
    let rate = size as f64 / MIB / first.took.as_secs_f64();
    println!("INFO {} MB uploaded in {:.2?}", size / MB, first.took);
    println!("BENCH upload_mib_per_s {rate:.1} MiB/s");

    // A cut in the middle of a part: the link slowed to 20 MB/s (a part
    // takes 0.4 s on it), cut once half the file is on the wire.
    bench.proxy.set(Fault::Throttle(20 * MB));
    let resumed = bench.upload(size, true).await;
    bench.proxy.heal();
    println!(
        "INFO {} bytes carried for {size} with a cut, {} without",
        resumed.carried, first.carried
    );
    println!(
        "BENCH upload_resume_resent_mib {:.2} MiB",
        resumed.carried.saturating_sub(size) as f64 / MIB
    );
}
