//! Acknowledged means durable: the binary is SIGKILLed in the middle of a
//! burst of writes from many clients, and after a restart every write it
//! answered is there with the resourceVersion it answered, versions only
//! move on, and a watcher resuming where it was gets every later event or
//! a 410. A watcher never sees a change that storage then loses. A disk
//! that fills up fails the writes it cannot hold, and memory stays what is
//! on disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectList, PostParams, WatchEvent, WatchParams};
use kube::Client;

const CLIENTS: usize = 32;

/// The binary on a data directory; SIGKILLed when dropped.
struct Server {
    child: Child,
    kubeconfig: PathBuf,
}

impl Server {
    async fn start(data_dir: &Path, scratch: &Path, run: u32) -> (Server, Client) {
        let kubeconfig = scratch.join(format!("kubeconfig-{run}"));
        let child = Command::new(env!("CARGO_BIN_EXE_apiserver-lite"))
            .args(["--bind", "127.0.0.1:0", "--log", "warn", "--data-dir"])
            .arg(data_dir)
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("apiserver-lite starts");
        let mut server = Server { child, kubeconfig };
        let client = server.ready().await;
        (server, client)
    }

    /// Waits for the kubeconfig (written once the server listens).
    async fn ready(&mut self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        let yaml = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("apiserver-lite exited: {status}");
            }
            match std::fs::read_to_string(&self.kubeconfig) {
                Ok(yaml) if !yaml.is_empty() => break yaml,
                _ => {}
            }
            assert!(Instant::now() < deadline, "no kubeconfig written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let client = apiserver_lite::server::client_for(&yaml).await.unwrap();
        client.apiserver_version().await.unwrap();
        client
    }

    fn sigkill(&mut self) {
        // Child::kill sends SIGKILL: no shutdown, no flush.
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a numeric resourceVersion")
}

/// Each listed object's name and resourceVersion.
fn versions(list: &ObjectList<ConfigMap>) -> BTreeMap<String, u64> {
    list.items
        .iter()
        .map(|cm| (cm.metadata.name.clone().unwrap_or_default(), rv_of(cm)))
        .collect()
}

fn config_map(name: &str, bytes: usize) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"payload": "x".repeat(bytes)},
    }))
    .unwrap()
}

async fn poll_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one watcher saw: each object's name and version, in order.
type Seen = Arc<Mutex<Vec<(String, u64)>>>;

fn watch_config_maps(client: Client, seen: Seen) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let Ok(stream) = api.watch(&WatchParams::default(), "0").await else {
            return;
        };
        let mut stream = stream.boxed();
        // Ends when the server dies under it.
        while let Ok(Some(event)) = stream.try_next().await {
            if let WatchEvent::Added(cm) | WatchEvent::Modified(cm) = event {
                let name = cm.metadata.name.clone().unwrap_or_default();
                seen.lock().unwrap().push((name, rv_of(&cm)));
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_a_burst_loses_no_acknowledged_write() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let (mut server, client) = Server::start(&data, scratch.path(), 1).await;

    let watchers: Vec<Seen> = (0..2).map(|_| Seen::default()).collect();
    for seen in &watchers {
        watch_config_maps(client.clone(), seen.clone());
    }

    // 32 clients write until the server dies under them.
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let mut writers = Vec::new();
    for c in 0..CLIENTS {
        let (client, acked) = (client.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(client, "default");
            for i in 0.. {
                let name = format!("c{c}-{i}");
                match api.create(&PostParams::default(), &config_map(&name, 256)).await {
                    Ok(cm) => {
                        acked.lock().unwrap().insert(name, rv_of(&cm));
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    poll_until("500 acknowledged writes", Duration::from_secs(60), || {
        acked.lock().unwrap().len() >= 500
    })
    .await;
    server.sigkill();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let seen_before: Vec<Vec<(String, u64)>> = watchers.iter().map(|s| s.lock().unwrap().clone()).collect();
    let newest_acked = acked.values().copied().max().unwrap();

    let (_server, client) = Server::start(&data, scratch.path(), 2).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let stored = versions(&list);
    let missing: Vec<(&String, &u64)> = acked
        .iter()
        .filter(|(name, rv)| stored.get(*name) != Some(rv))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes missing or at another version after SIGKILL: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    // A watcher was sent only what was stored.
    for seen in &seen_before {
        for (name, rv) in seen {
            assert_eq!(
                stored.get(name),
                Some(rv),
                "a watcher saw {name}@{rv}, which was not stored"
            );
        }
    }
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(
        list_rv >= newest_acked,
        "resourceVersion went back: {list_rv} < {newest_acked}"
    );
    let after = api
        .create(&PostParams::default(), &config_map("after-restart", 16))
        .await
        .unwrap();
    assert!(rv_of(&after) > list_rv, "a new write reused a version");

    // A watcher resuming from the last version it saw gets every later
    // change, or is told to list again.
    for seen in &seen_before {
        let from = seen.iter().map(|(_, rv)| *rv).max().unwrap_or(0);
        let mut wanted: Vec<String> = stored
            .iter()
            .filter(|(_, rv)| **rv > from)
            .map(|(name, _)| name.clone())
            .collect();
        wanted.push("after-restart".into());
        let mut stream = api
            .watch(&WatchParams::default().timeout(5), &from.to_string())
            .await
            .unwrap()
            .boxed();
        let mut got: Vec<String> = Vec::new();
        let mut expired = false;
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                WatchEvent::Added(cm) | WatchEvent::Modified(cm) => got.push(cm.metadata.name.unwrap()),
                WatchEvent::Error(e) => {
                    assert_eq!(e.code, 410, "{e:?}");
                    expired = true;
                    break;
                }
                _ => {}
            }
            if wanted.iter().all(|w| got.contains(w)) {
                break;
            }
        }
        assert!(
            expired || wanted.iter().all(|w| got.contains(w)),
            "resumed from {from}: neither 410 nor every later change; wanted {} got {}",
            wanted.len(),
            got.len()
        );
    }
}

/// A tmpfs of `size` on `dir`, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` when not root (mounting needs it); a root that cannot mount fails.
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mount -t tmpfs failed as root");
        Some(Tmpfs(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "remount failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[tokio::test]
async fn a_full_disk_fails_the_writes_it_cannot_hold_and_memory_stays_what_is_stored() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let Some(disk) = Tmpfs::mount(&data, "2m") else {
        return;
    };
    let (mut server, client) = Server::start(&data, scratch.path(), 1).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut refused = None;
    for i in 0..200 {
        let name = format!("big-{i}");
        match api
            .create(&PostParams::default(), &config_map(&name, 64 * 1024))
            .await
        {
            Ok(cm) => {
                acked.insert(name, rv_of(&cm));
            }
            Err(kube::Error::Api(status)) => {
                refused = Some((name, status));
                break;
            }
            Err(e) => panic!("{name}: not an API error: {e}"),
        }
    }
    let (name, status) = refused.expect("a 2 MiB disk filled up");
    assert_eq!(status.code, 500, "{status:?}");
    assert!(status.message.contains("storage"), "{status:?}");
    assert!(!acked.is_empty());

    // Memory is what is on disk: the refused write is not there, and the
    // server still serves.
    let got = api.get_opt(&name).await.unwrap();
    assert!(got.is_none(), "{name} was refused but is served: {got:?}");
    let listed = versions(&api.list(&ListParams::default()).await.unwrap());
    assert_eq!(listed, acked);

    // Room again: writes succeed without a restart.
    disk.resize("64m");
    let after = api
        .create(&PostParams::default(), &config_map("after-room", 16))
        .await
        .unwrap();
    assert!(rv_of(&after) > acked.values().copied().max().unwrap());
    acked.insert("after-room".into(), rv_of(&after));

    server.sigkill();
    let (_server, client) = Server::start(&data, scratch.path(), 2).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let stored = versions(&api.list(&ListParams::default()).await.unwrap());
    assert_eq!(stored, acked);
}
