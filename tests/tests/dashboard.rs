//! The dashboard in a real browser: a real `k8s4r up` process serving it,
//! three real agents, headless Chromium driven through chromedriver. Each
//! step saves a screenshot (`target/screenshots/dashboard-*.png`, or
//! `$K8S4R_SCREENSHOT_DIR`).

mod support;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s4r_api::{Job, Task};
use k8s4r_testbed::browser::Browser;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use support::{free_port, job_json, read_pid, sh, Proc, DEADLINE};

const K8S4R: &str = env!("CARGO_BIN_EXE_e2e-k8s4r");
const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
/// The page-weight budget of the fleet view, compressed or not.
const FLEET_BUDGET: u64 = 200 * 1024;

/// A process whose standard output is read line by line.
struct Lines {
    proc: Proc,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn start(mut cmd: Command) -> Lines {
        let mut child: Child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the program");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines {
            proc: Proc(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line (from now) containing `needle`.
    fn expect(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no line with {needle:?}; output:\n{}", self.seen.join("\n")),
            }
        }
    }
}

/// The URL in a line that ends with one.
fn url_in(line: &str) -> String {
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("a URL")
        .to_owned()
}

fn agent(dir: &Path, broker: &str, robot: &str) -> Proc {
    let token = std::fs::read_to_string(dir.join("data/bootstrap-token")).expect("bootstrap token");
    let state = dir.join("agents").join(robot);
    std::fs::create_dir_all(&state).expect("state dir");
    let child = Command::new(AGENT)
        .args([
            "--robot-id",
            robot,
            "--token",
            token.trim(),
            "--broker-url",
            broker,
        ])
        .arg("--state-dir")
        .arg(&state)
        .args([
            "--heartbeat-interval",
            "1s",
            "--raw-exec",
            "true",
            "--allow-root",
            "true",
        ])
        .args(["--label", "site=lab"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the agent starts");
    Proc(child)
}

async fn client_of(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// A kubeconfig for a ServiceAccount bound to nothing but `view`.
async fn viewer_kubeconfig(admin: &Client, admin_kubeconfig: &Path, dir: &Path) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("viewer".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create the ServiceAccount");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("viewer-view".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "view".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "viewer".into(),
            namespace: Some("default".into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind view");
    let token = accounts
        .create_token_request("viewer", &PostParams::default(), &Default::default())
        .await
        .expect("a token")
        .status
        .expect("its status")
        .token;
    let mut yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin_kubeconfig).expect("admin kubeconfig"))
            .expect("yaml");
    yaml["users"][0]["user"] = serde_yaml::to_value(serde_json::json!({ "token": token })).expect("user");
    let path = dir.join("viewer.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&yaml).expect("yaml")).expect("write");
    path
}

/// The `data-state` of group `group` in the job graph now (read in one
/// script: the page may swap the graph between two WebDriver calls).
async fn group_state(browser: &Browser, group: &str) -> String {
    let script = "const g = document.getElementById('grp-' + arguments[0]); return g ? g.dataset.state : '';";
    browser
        .execute(script, &[serde_json::json!(group)])
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The terminal on a running task's page (the browser is on it): a shell
/// in the task's directory with its environment, typed into, resized,
/// exited with a status; and no terminal for a WebSocket of another site.
async fn terminal_in_the_task(browser: &Browser, url: &str) {
    browser.wait_for("#term-open:not([disabled])", DEADLINE).await;
    let violations = browser.axe_violations().await;
    assert!(violations.is_empty(), "accessibility:\n{}", violations.join("\n"));
    browser
        .execute("document.getElementById('term-open').click();", &[])
        .await;
    browser.wait_text("#term-status", "Running sh", DEADLINE).await;
    let keys = browser
        .wait_for("#terminal .xterm-helper-textarea", DEADLINE)
        .await;
    // Typed as keys (WebDriver's Enter is U+E007). What is checked is what
    // the shell computes, never the echo of what was typed.
    keys.send_keys(
        "echo name=$K8S4R_TASK_NAME sum=$((6*7)); [ \"$(pwd)\" = \"$K8S4R_TASK_DIR\" ] && echo at-$((1+1))-home\u{E007}",
    )
    .await;
    let screen = browser
        .wait_text("#terminal .xterm-rows", "at-2-home", DEADLINE)
        .await;
    assert!(screen.contains("sum=42"), "{screen}");
    assert!(screen.contains("sleeper-s-0"), "{screen}");
    // The page's size reaches the pty, and so does a resize.
    let size = browser
        .execute(
            "const t = window.k8s4rTerminal; return t.rows + 'x' + t.cols;",
            &[],
        )
        .await;
    let size = size.as_str().expect("the terminal's size").to_owned();
    keys.send_keys("stty size | tr ' ' x\u{E007}").await;
    browser.wait_text("#terminal .xterm-rows", &size, DEADLINE).await;
    browser
        .execute("window.k8s4rTerminal.resize(100, 20);", &[])
        .await;
    keys.send_keys("stty size | tr ' ' x\u{E007}").await;
    browser
        .wait_text("#terminal .xterm-rows", "20x100", DEADLINE)
        .await;
    browser.screenshot("dashboard-terminal").await;
    keys.send_keys("exit 3\u{E007}").await;
    browser
        .wait_text("#term-status", "exited with status 3", DEADLINE)
        .await;
    browser.wait_for("#term-open:not([hidden])", DEADLINE).await;

    // A page of another site may open a WebSocket to the dashboard, and
    // its browser may even send the cookie: the Origin tells it apart.
    for origin in [Some("http://evil.example"), None] {
        let status = terminal_upgrade(url, "/ns/default/tasks/sleeper-s-0/terminal", origin).await;
        assert_eq!(status, 403, "a terminal WebSocket from origin {origin:?}");
    }
    let own = url.split("/?").next().expect("base").to_owned();
    let status = terminal_upgrade(url, "/ns/default/tasks/sleeper-s-0/terminal", Some(&own)).await;
    assert_eq!(status, 101, "the dashboard's own origin opens it");
}

/// The status of a WebSocket upgrade to `path` of the dashboard at `url`
/// (which carries its login token), sent with the login cookie and
/// `origin`.
async fn terminal_upgrade(url: &str, path: &str, origin: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, query) = rest.split_once("/?token=").expect("a login token");
    let port = host.rsplit(':').next().expect("a port");
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Cookie: k8s4r_dashboard_{port}={query}\r\n"
    );
    if let Some(origin) = origin {
        request.push_str(&format!("Origin: {origin}\r\n"));
    }
    request.push_str("\r\n");
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = vec![0u8; 512];
    let n = stream.read(&mut answer).await.expect("read");
    let line = String::from_utf8_lossy(&answer[..n]).to_string();
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_fleet_jobs_logs_and_acts_as_its_user() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mqtt = free_port();
    let mut up_cmd = Command::new(K8S4R);
    up_cmd
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--log",
            "warn",
            "up",
            "--in-memory",
            "--store-listen",
            "127.0.0.1:0",
        ])
        .args(["--api-bind", &format!("127.0.0.1:{}", free_port())])
        .args(["--mqtt-bind", &format!("127.0.0.1:{mqtt}")])
        .args(["--dashboard-listen", &format!("127.0.0.1:{}", free_port())]);
    let mut up = Lines::start(up_cmd);
    let url = url_in(&up.expect("dashboard"));
    let broker = format!("mqtt://127.0.0.1:{mqtt}");
    let _agents: Vec<Proc> = ["rb1", "rb2", "rb3"]
        .iter()
        .map(|r| agent(dir.path(), &broker, r))
        .collect();
    let kubeconfig = data.join("kubeconfig");
    let admin = client_of(&kubeconfig).await;
    let base = url.split("/?").next().expect("base").to_owned();
    let browser = Browser::start().await;

    // The fleet: three robots Online.
    browser.goto(&url).await;
    browser.wait_text("#count-online", "3", DEADLINE).await;
    for robot in ["rb1", "rb2", "rb3"] {
        // The page redraws a row as its robot's heartbeats come: each is
        // read afresh, not through an element found before a redraw.
        browser
            .wait_text(&format!("#robot-{robot}"), "Online", DEADLINE)
            .await;
    }
    browser.screenshot("dashboard-fleet").await;
    let violations = browser.axe_violations().await;
    assert!(violations.is_empty(), "accessibility:\n{}", violations.join("\n"));
    let bytes = browser.page_bytes().await;
    assert!(
        bytes > 0 && bytes <= FLEET_BUDGET,
        "the fleet view weighs {bytes} bytes"
    );

    // An ordered Job: its graph's nodes change colour as its groups run.
    let mut job = job_json(
        "chain",
        serde_json::json!([
            // Long enough for the Job's paced first status to show it.
            { "name": "a", "count": 1, "task": sh("sleep 5", "1m") },
            { "name": "b", "count": 1, "task": sh("sleep 2", "1m") },
            { "name": "c", "count": 1, "task": sh("sleep 1", "1m") },
        ]),
    );
    job["spec"]["order"] = serde_json::json!(["a", "b", "c"]);
    let jobs: Api<Job> = Api::namespaced(admin.clone(), "default");
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job).expect("a Job"),
    )
    .await
    .expect("create the Job");
    browser.goto(&format!("{base}/ns/default/jobs/chain")).await;
    let mut seen_a_running_b_pending = false;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (a, b, c) = (
            group_state(&browser, "a").await,
            group_state(&browser, "b").await,
            group_state(&browser, "c").await,
        );
        if a == "running" && b == "pending" {
            if !seen_a_running_b_pending {
                browser.screenshot("dashboard-job-graph").await;
            }
            seen_a_running_b_pending = true;
        }
        if [&a, &b, &c].iter().all(|s| *s == "completed") {
            break;
        }
        assert!(Instant::now() < deadline, "the graph ended at a={a} b={b} c={c}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen_a_running_b_pending,
        "the page showed a running while b waited"
    );
    let violations = browser.axe_violations().await;
    assert!(violations.is_empty(), "accessibility:\n{}", violations.join("\n"));

    // A PeriodicJob shows its schedule and its next run.
    let periodic: k8s4r_api::PeriodicJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1",
        "kind": "PeriodicJob",
        "metadata": { "name": "nightly", "namespace": "default" },
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": { "spec": { "taskGroups": [{ "name": "g", "count": 1, "task": sh("true", "1m") }] } }
        }
    }))
    .expect("a PeriodicJob");
    Api::<k8s4r_api::PeriodicJob>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &periodic)
        .await
        .expect("create the PeriodicJob");
    browser.goto(&format!("{base}/jobs")).await;
    browser
        .wait_text("#periodic-default-nightly", "0 3 * * *", DEADLINE)
        .await;
    browser
        .wait_text("#periodic-default-nightly", "T03:00:00", DEADLINE)
        .await;
    browser
        .wait_text("#job-default-chain", "completed", DEADLINE)
        .await;

    // A rollout's robots, with their phase and why each waits.
    let rollout: k8s4r_api::AgentRollout = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1",
        "kind": "AgentRollout",
        "metadata": { "name": "dockside" },
        "spec": {
            "version": "9.9.9",
            "artifacts": [{ "arch": std::env::consts::ARCH, "url": "http://127.0.0.1:9/agent", "sha256": "ab".repeat(32) }],
            "when": [{ "key": "docked", "operator": "In", "values": ["true"] }],
        }
    }))
    .expect("an AgentRollout");
    Api::<k8s4r_api::AgentRollout>::all(admin.clone())
        .create(&PostParams::default(), &rollout)
        .await
        .expect("create the AgentRollout");
    browser.goto(&format!("{base}/rollouts")).await;
    browser
        .wait_text("#rollout-dockside", "docked <none>, needs In [true]", DEADLINE)
        .await;
    browser.wait_text("#rollout-dockside", "Pending", DEADLINE).await;
    let violations = browser.axe_violations().await;
    assert!(violations.is_empty(), "accessibility:\n{}", violations.join("\n"));

    // A running task's output reaches the page within a second.
    let lines = "for i in $(seq 1 40); do echo \"line-$i $(date +%s%3N)\"; sleep 0.25; done";
    let jobs_log = job_json(
        "talker",
        serde_json::json!([{ "name": "t", "count": 1, "task": sh(lines, "1m") }]),
    );
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(jobs_log).expect("a Job"),
    )
    .await
    .expect("create the Job");
    let tasks: Api<Task> = Api::namespaced(admin.clone(), "default");
    support::eventually("talker running", || async {
        let s = tasks.get("talker-t-0").await.ok()?.status?;
        (s.state == Some(k8s4r_api::TaskState::Running)).then_some(())
    })
    .await;
    browser.goto(&format!("{base}/ns/default/tasks/talker-t-0")).await;
    browser
        .execute(
            "window.seen = []; const since = Date.now(); \
             new MutationObserver(ms => { for (const m of ms) for (const n of m.addedNodes) \
               window.seen.push([Date.now(), n.textContent]); }) \
             .observe(document.getElementById('log'), { childList: true }); \
             window.since = since;",
            &[],
        )
        .await;
    browser.wait_text("#log", "line-30", DEADLINE).await;
    let seen = browser.execute("return [window.since, window.seen];", &[]).await;
    let since = seen[0].as_i64().expect("since");
    let mut latencies = Vec::new();
    for entry in seen[1].as_array().expect("seen") {
        let at = entry[0].as_i64().expect("at");
        for line in entry[1].as_str().unwrap_or("").lines() {
            let Some(written) = line.split_whitespace().nth(1).and_then(|t| t.parse::<i64>().ok()) else {
                continue;
            };
            if written > since {
                latencies.push(at - written);
            }
        }
    }
    assert!(latencies.len() >= 10, "lines seen live: {latencies:?}");
    let worst = latencies.iter().max().copied().unwrap_or_default();
    assert!(worst <= 1000, "a line took {worst} ms to show: {latencies:?}");
    browser.screenshot("dashboard-task-log").await;

    // A task's outputs: listed on its page, each uploaded one a link that
    // downloads it through the cluster.
    let mut recorder = sh("echo 'the report' > report.txt", "1m");
    recorder["outputs"] = serde_json::json!([{ "path": "report.txt" }]);
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job_json(
            "recorded",
            serde_json::json!([{ "name": "t", "count": 1, "task": recorder }]),
        ))
        .expect("a Job"),
    )
    .await
    .expect("create the Job");
    // The page of a Task that exists (the manager makes it), before its
    // upload: the list appears as the Task changes.
    support::eventually("the task made", || async { tasks.get("recorded-t-0").await.ok() }).await;
    browser
        .goto(&format!("{base}/ns/default/tasks/recorded-t-0"))
        .await;
    browser.wait_text("table.outputs", "Uploaded", DEADLINE).await;
    let got = browser
        .execute_async(
            "const done = arguments[0]; \
             fetch(document.querySelector('table.outputs a[download]').href) \
             .then(r => r.text().then(t => done([r.status, t])));",
            &[],
        )
        .await;
    assert_eq!(got, serde_json::json!([200, "the report\n"]), "the download link");
    let violations = browser.axe_violations().await;
    assert!(violations.is_empty(), "accessibility:\n{}", violations.join("\n"));

    // A task that takes a Secret: its pages never show the value.
    const PLANTED: &str = "PLANTED-dashboard-7f3e-s3cr3t";
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "dash-keys", "namespace": "default" },
        "stringData": { "token": PLANTED },
    }))
    .expect("a Secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
    let mut keyed = sh(
        "[ -n \"$TOKEN\" ] && [ -s keys/token ] && echo has-its-key; exec sleep 30",
        "1m",
    );
    keyed["env"] = serde_json::json!([
        { "name": "TOKEN", "valueFrom": { "secretKeyRef": { "name": "dash-keys", "key": "token" } } },
    ]);
    keyed["files"] = serde_json::json!([{ "path": "keys", "secret": { "secretName": "dash-keys" } }]);
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job_json(
            "keyed",
            serde_json::json!([{ "name": "k", "count": 1, "task": keyed }]),
        ))
        .expect("a Job"),
    )
    .await
    .expect("create the Job");
    support::eventually("keyed running with its key", || async {
        let s = tasks.get("keyed-k-0").await.ok()?.status?;
        (s.state == Some(k8s4r_api::TaskState::Running)).then_some(())
    })
    .await;
    for page in ["ns/default/tasks/keyed-k-0", "ns/default/jobs/keyed", "jobs", ""] {
        browser.goto(&format!("{base}/{page}")).await;
        if page.contains("tasks") {
            browser.wait_text("#log", "has-its-key", DEADLINE).await;
        }
        let html = browser
            .execute("return document.documentElement.outerHTML;", &[])
            .await;
        let html = html.as_str().unwrap_or_default();
        assert!(!html.is_empty(), "the page {page} is empty");
        assert!(
            !html.contains(PLANTED),
            "the dashboard's {page} page shows the secret"
        );
    }

    // Cancel in the page stops the task's process on its robot.
    let pid_file = dir.path().join("sleeper.pid");
    let sleeper = format!("echo $$ > {}; exec sleep 600", pid_file.display());
    let job_sleep = job_json(
        "sleeper",
        serde_json::json!([{ "name": "s", "count": 1, "task": sh(&sleeper, "1h") }]),
    );
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job_sleep).expect("a Job"),
    )
    .await
    .expect("create the Job");
    let pid = read_pid(&pid_file).await;
    browser
        .goto(&format!("{base}/ns/default/tasks/sleeper-s-0"))
        .await;
    terminal_in_the_task(&browser, &url).await;
    // A running task's Cancel asks first: its button shows once the
    // question is open. Retry is not offered for a task that runs.
    browser.wait_for("summary[data-action='Cancel?']", DEADLINE).await;
    let shown = browser
        .execute(
            "const b = document.querySelector('button[data-action=Cancel]'); return b.checkVisibility();",
            &[],
        )
        .await;
    assert_eq!(shown, serde_json::json!(false), "no cancel without the question");
    assert!(browser.find_all("button[data-action=Retry]").await.is_empty());
    // Clicked in one script: the live part may be swapped between finding
    // the button and a WebDriver click.
    let shown = browser
        .execute(
            "document.querySelector(\"summary[data-action='Cancel?']\").click(); \
             const b = document.querySelector('button[data-action=Cancel]'); \
             const shown = b.checkVisibility(); b.click(); return shown;",
            &[],
        )
        .await;
    assert_eq!(
        shown,
        serde_json::json!(true),
        "the question open, its button shows"
    );
    support::eventually("the task's process gone", || async {
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err();
        gone.then_some(())
    })
    .await;
    browser.wait_text("#live", "cancelled", DEADLINE).await;
    browser.screenshot("dashboard-cancelled").await;

    // Retry in the page: the output pane follows the new attempt, which
    // starts after the page came back, without a reload.
    let flaky =
        "echo \"attempt $K8S4R_TASK_ATTEMPT\"; [ \"$K8S4R_TASK_ATTEMPT\" -ge 2 ] && exec sleep 600; exit 3";
    let job_flaky = job_json(
        "flaky",
        serde_json::json!([{ "name": "f", "count": 1, "task": sh(flaky, "1h") }]),
    );
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job_flaky).expect("a Job"),
    )
    .await
    .expect("create the Job");
    support::eventually("flaky failed", || async {
        let s = tasks.get("flaky-f-0").await.ok()?.status?;
        (s.state == Some(k8s4r_api::TaskState::Failed)).then_some(())
    })
    .await;
    browser.goto(&format!("{base}/ns/default/tasks/flaky-f-0")).await;
    browser.wait_text("#log", "attempt 1", DEADLINE).await;
    assert!(
        browser
            .find_all("summary[data-action='Cancel?']")
            .await
            .is_empty()
            && browser.find_all("button[data-action=Cancel]").await.is_empty(),
        "no cancel for a task that ended"
    );
    browser
        .execute(
            "document.querySelector('button[data-action=Retry]').click();",
            &[],
        )
        .await;
    browser.wait_text("#live", "attempt 2", DEADLINE).await;
    browser.execute("window.notReloaded = true;", &[]).await;
    browser.wait_text("#log", "attempt 2", DEADLINE).await;
    let kept = browser.execute("return window.notReloaded === true;", &[]).await;
    assert_eq!(kept, serde_json::json!(true), "followed without a reload");
    let status = browser.wait_for("#log-status", DEADLINE).await.text().await;
    assert!(
        !status.contains("cut off") && !status.contains("keeps no output"),
        "{status}"
    );
    let started = browser
        .execute(
            "return [...document.querySelectorAll('table.attempts tbody tr:not(.said)')].map(r => r.cells[2].textContent.trim());",
            &[],
        )
        .await;
    let started: Vec<String> = serde_json::from_value(started).expect("the Started column");
    assert_eq!(started.len(), 2, "{started:?}");
    assert!(
        started.iter().all(|s| s.ends_with("ago")),
        "each attempt keeps its start: {started:?}"
    );
    browser.screenshot("dashboard-retried").await;

    // A user bound only to `view` sees no action and is told why.
    let viewer = viewer_kubeconfig(&admin, &kubeconfig, dir.path()).await;
    let mut dash = Command::new(K8S4R);
    dash.arg("--data-dir")
        .arg(&data)
        .args(["dashboard", "--kubeconfig"])
        .arg(&viewer)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    let mut viewer_dash = Lines::start(dash);
    let viewer_url = url_in(&viewer_dash.expect("k8s4r dashboard:"));
    let viewer_base = viewer_url.split("/?").next().expect("base").to_owned();
    browser.goto(&viewer_url).await;
    browser.wait_text("#count-online", "3", DEADLINE).await;
    browser
        .goto(&format!("{viewer_base}/ns/default/tasks/talker-t-0"))
        .await;
    browser.wait_for("#log", DEADLINE).await;
    assert!(
        browser.find_all("button[data-action]").await.is_empty(),
        "a viewer sees no action"
    );
    assert!(
        browser.find_all("#term-form").await.is_empty(),
        "a viewer (no tasks/exec) is offered no terminal"
    );
    browser
        .goto(&format!("{viewer_base}/ns/default/tasks/talker-t-0/cancel"))
        .await;
    let said = browser.wait_text(".problem", "may not cancel", DEADLINE).await;
    assert!(said.contains("patch"), "{said}");
    browser.screenshot("dashboard-viewer-refused").await;
    let status = browser
        .execute_async(
            "const done = arguments[arguments.length - 1]; \
             const csrf = document.querySelector('meta[name=csrf]').content; \
             fetch(location.pathname, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, \
               body: '_csrf=' + csrf }).then(r => done(r.status));",
            &[],
        )
        .await;
    assert_eq!(status, serde_json::json!(403), "a viewer's POST is refused");
    drop(viewer_dash);

    // Killing `k8s4r up` shows the banner.
    browser.goto(&format!("{base}/fleet")).await;
    browser.wait_text("#count-online", "3", DEADLINE).await;
    up.proc.0.kill().expect("SIGKILL k8s4r up");
    let _ = up.proc.0.wait();
    let banner = browser
        .wait_for("#conn:not([hidden])", Duration::from_secs(5))
        .await;
    assert!(banner.text().await.contains("lost"));
    browser.screenshot("dashboard-lost").await;
}
