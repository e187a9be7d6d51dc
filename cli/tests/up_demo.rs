//! `k8s4r up --demo` end to end, as a newcomer runs it: the real binary, the
//! embedded API server and broker, the server, the manager and a local agent
//! running real processes; then kubectl (the one on the machine) against the
//! kubeconfig it wrote, and a second `up` on the same data dir.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s4r_testbed::{free_port, kubectl};

/// A running `k8s4r up` whose stdout lines arrive on a channel.
struct Up {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Up {
    fn start(data_dir: &Path, extra: &[&str]) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_k8s4r"))
            .arg("--data-dir")
            .arg(data_dir)
            .args([
                "--log",
                "warn",
                "up",
                "--store-listen",
                "127.0.0.1:0",
                "--api-bind",
            ])
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--mqtt-bind")
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start k8s4r up");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Up {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stdout line containing `needle`.
    fn expect_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {needle:?} within {timeout:?}; output so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// SIGTERM, and the exit status once it has shut down cleanly.
    fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "k8s4r up did not stop within 30 s of SIGTERM"
            );
            // Drain output so the child never blocks on a full pipe.
            let _ = self.lines.recv_timeout(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn up_demo_runs_the_job_to_completion_and_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");

    let mut up = Up::start(
        dir.path(),
        &["--demo", "--robot-id", "demo-robot", "--label", "site=lab"],
    );
    up.expect_line("k8s4r is up", Duration::from_secs(60));
    up.expect_line("submitted job default/demo", Duration::from_secs(30));
    let done = up.expect_line("job default/demo ", Duration::from_secs(120));
    assert!(done.ends_with("completed"), "{done}");

    // kubectl sees the robot and the tasks with their printer columns.
    let robots = kubectl(&kubeconfig, &["get", "robots"]);
    assert!(
        robots.contains("PHASE") && robots.contains("HEARTBEAT"),
        "{robots}"
    );
    assert!(
        robots
            .lines()
            .any(|l| l.starts_with("demo-robot") && l.contains("Online")),
        "{robots}"
    );
    let tasks = kubectl(
        &kubeconfig,
        &["get", "rtask", "-n", "default", "-l", "robot.k8s4r.io/job=demo"],
    );
    assert!(
        tasks.contains("STATE") && tasks.contains("ROBOT") && tasks.contains("EXIT"),
        "{tasks}"
    );
    assert_eq!(
        tasks
            .lines()
            .filter(|l| l.contains("completed") && l.contains("demo-robot"))
            .count(),
        3,
        "{tasks}"
    );
    let outputs = kubectl(
        &kubeconfig,
        &[
            "get",
            "rtask",
            "-n",
            "default",
            "-l",
            "robot.k8s4r.io/job=demo",
            "-o",
            "jsonpath={.items[*].status.outputTail}",
        ],
    );
    assert_eq!(outputs.matches("hello from").count(), 3, "{outputs}");
    let job = kubectl(
        &kubeconfig,
        &["get", "jobs.robot.k8s4r.io", "demo", "-n", "default"],
    );
    assert!(job.contains("completed") && job.contains("3/3"), "{job}");

    assert!(up.stop().success(), "k8s4r up exits 0 on SIGTERM");

    // A second `up` on the same data dir finds the same robot and job.
    let mut again = Up::start(dir.path(), &["--local-agent=false"]);
    again.expect_line("k8s4r is up", Duration::from_secs(60));
    let robots = kubectl(&kubeconfig, &["get", "robots", "-o", "name"]);
    assert!(robots.contains("robot.robot.k8s4r.io/demo-robot"), "{robots}");
    let job = kubectl(
        &kubeconfig,
        &[
            "get",
            "jobs.robot.k8s4r.io",
            "demo",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.state}",
        ],
    );
    assert_eq!(job, "completed");
    assert!(again.stop().success());
}
