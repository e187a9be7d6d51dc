//! The dashboard over a simulated fleet: `k8s4r dashboard` as a process
//! against the scale bench's cluster, with every robot Online.
//!
//! - `dashboard_fleet_render_ms_10k`: the time from sending `GET /fleet`
//!   to the first byte of the answer (median of 20, over raw TCP);
//! - `dashboard_fleet_kib`: what the fleet view weighs, its HTML and its
//!   two assets, as sent;
//! - `dashboard_update_p99_ms`: from a Robot's label patched (the API
//!   server's answer) to the page in headless Chromium showing that
//!   resourceVersion in the robot's row.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s4r_api::Robot;
use k8s4r_sim::Fleet;
use k8s4r_testbed::browser::Browser;
use k8s4r_testbed::free_port;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::{all_online, label, sim, Cluster};

/// One GET over a fresh connection: the time to the first byte of the
/// answer, and the whole answer.
fn get(addr: &str, path: &str, cookie: &str) -> (Duration, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).expect("connect to the dashboard");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n");
    let sent = Instant::now();
    stream.write_all(request.as_bytes()).expect("send");
    let mut first = [0u8; 1];
    stream.read_exact(&mut first).expect("the first byte");
    let ttfb = sent.elapsed();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).expect("the answer");
    let mut all = first.to_vec();
    all.extend(rest);
    (ttfb, all)
}

/// The body of an HTTP answer.
fn body(answer: &[u8]) -> &[u8] {
    answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(answer, |i| &answer[i + 4..])
}

fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(0)
}

pub async fn run(cluster: impl std::future::Future<Output = Cluster>, robots: usize, updates: usize) {
    let cluster = cluster.await;
    let fleet = Fleet::start(sim(&cluster, robots, Duration::from_secs(30)));
    all_online(&cluster, robots).await;
    let data = tempfile::tempdir().expect("data dir");
    let mut dashboard = Dashboard::start(&cluster, data.path(), robots).await;
    measure_fleet(&dashboard, robots);
    measure_updates(&cluster, &dashboard, updates).await;
    let _ = dashboard.child.kill();
    let _ = dashboard.child.wait();
    fleet.stop().await;
}

/// `k8s4r dashboard` as a process, holding every robot.
struct Dashboard {
    child: std::process::Child,
    addr: String,
    url: String,
    cookie: String,
}

impl Dashboard {
    async fn start(cluster: &Cluster, data: &std::path::Path, robots: usize) -> Dashboard {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"))
            .arg("--data-dir")
            .arg(data)
            .args(["--log", "warn", "dashboard", "--kubeconfig"])
            .arg(&cluster.kubeconfig)
            .args(["--listen", &addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("k8s4r dashboard");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        while !line.contains("http://") {
            line.clear();
            out.read_line(&mut line).expect("its URL");
        }
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .expect("URL")
            .to_owned();
        let token = url.rsplit('=').next().expect("token").to_owned();
        let cookie = format!("k8s4r_dashboard_{port}={token}");
        // Until its caches hold every robot.
        let started = Instant::now();
        loop {
            let (_, answer) = get(&addr, "/healthz", &cookie);
            let health: serde_json::Value = serde_json::from_slice(body(&answer)).unwrap_or_default();
            if health["ready"] == true && health["robots"].as_u64() == Some(robots as u64) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "the dashboard never held every robot: {health}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "INFO the dashboard held {robots} robots after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Dashboard {
            child,
            addr,
            url,
            cookie,
        }
    }
}

/// The fleet view's first byte and weight.
fn measure_fleet(d: &Dashboard, robots: usize) {
    let mut ttfb = Vec::new();
    let mut html = Vec::new();
    for _ in 0..20 {
        let (t, answer) = get(&d.addr, "/fleet", &d.cookie);
        ttfb.push(t.as_secs_f64() * 1000.0);
        html = answer;
    }
    let js = get(&d.addr, "/assets/app.js", &d.cookie).1;
    let css = get(&d.addr, "/assets/app.css", &d.cookie).1;
    let kib = (html.len() + js.len() + css.len()) as f64 / 1024.0;
    println!(
        "INFO fleet view: first byte median {:.1} ms, p99 {:.1} ms, max {:.1} ms; HTML {} B, JS {} B, CSS {} B",
        percentile(ttfb.clone(), 0.5),
        percentile(ttfb.clone(), 0.99),
        percentile(ttfb.clone(), 1.0),
        html.len(),
        js.len(),
        css.len()
    );
    println!(
        "BENCH dashboard_fleet_render_ms_{} {:.1} ms",
        label(robots),
        percentile(ttfb, 0.5)
    );
    println!("BENCH dashboard_fleet_kib {kib:.1} KiB");
}

/// Changes as a browser sees them: robots of the first page, relabelled
/// one every 200 ms.
async fn measure_updates(cluster: &Cluster, d: &Dashboard, updates: usize) {
    let browser = Browser::start().await;
    browser.goto(&d.url).await;
    browser.goto(&format!("http://{}/fleet?sort=name", d.addr)).await;
    browser
        .execute(
            "window.seen = {}; const record = () => { const now = Date.now(); \
               for (const tr of document.querySelectorAll('tr[data-rv]')) { \
                 const k = tr.id + '@' + tr.dataset.rv; if (!(k in window.seen)) window.seen[k] = now; } }; \
             record(); new MutationObserver(record).observe(document.getElementById('live'), \
               { childList: true, subtree: true });",
            &[],
        )
        .await;
    let api: Api<Robot> = Api::all(cluster.client.clone());
    let mut names: Vec<String> = api
        .list_metadata(&ListParams::default())
        .await
        .expect("robots")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    // The first page of the fleet view sorted by name.
    names.truncate(100);
    let mut sent = Vec::new();
    for i in 0..updates {
        let name = &names[i % names.len()];
        let patch = serde_json::json!({ "metadata": { "labels": { "bench-tick": i.to_string() } } });
        let at = now_ms();
        let patched = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch a label");
        sent.push((
            format!("robot-{name}@{}", patched.resource_version().unwrap_or_default()),
            at,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = browser.execute("return window.seen;", &[]).await;
    let mut latencies = Vec::new();
    let mut missed = 0;
    for (key, at) in &sent {
        match seen[key.as_str()].as_i64() {
            Some(shown) => latencies.push((shown - at) as f64),
            // Not shown yet: counted as the time so far (a lower bound).
            None => {
                missed += 1;
                latencies.push((now_ms() - at) as f64);
            }
        }
    }
    println!(
        "INFO updates: {} shown, {missed} not shown within 3 s of the last; median {:.0} ms, max {:.0} ms",
        latencies.len() - missed,
        percentile(latencies.clone(), 0.5),
        percentile(latencies.clone(), 1.0)
    );
    println!(
        "BENCH dashboard_update_p99_ms {:.0} ms",
        percentile(latencies, 0.99)
    );
}
