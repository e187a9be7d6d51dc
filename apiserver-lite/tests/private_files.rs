//! The files holding secrets (the TLS key, the kubeconfig, the redb file
//! with the Secrets) are never readable by other users, even for a moment.
//! The binary runs with umask 0, so any file it creates without asking for
//! a mode would be world-readable.

use std::fs::{File, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apiserver_lite::server::DATA_FILE;

/// The binary, started by a shell that first sets umask 0; killed when dropped.
struct Server(Child);

impl Server {
    fn start(data_dir: &Path, kubeconfig: &Path) -> Server {
        let child = Command::new("sh")
            .args(["-c", "umask 000 && exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_apiserver-lite"))
            .args(["--bind", "127.0.0.1:0", "--log", "warn", "--data-dir"])
            .arg(data_dir)
            .arg("--write-kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("apiserver-lite starts");
        Server(child)
    }

    /// Waits for the kubeconfig (written once the server listens), then
    /// reaches the server with it.
    async fn ready(&mut self, kubeconfig: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let yaml = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                panic!("apiserver-lite exited: {status}");
            }
            match std::fs::read_to_string(kubeconfig) {
                Ok(yaml) if !yaml.is_empty() => break yaml,
                _ => {}
            }
            assert!(Instant::now() < deadline, "no kubeconfig written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let client = apiserver_lite::server::client_for(&yaml).await.unwrap();
        client.apiserver_version().await.unwrap();
    }

    fn stop(mut self) {
        let pid = self.0.id().to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(term.success());
        let status = self.0.wait().unwrap();
        assert!(status.success(), "apiserver-lite exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn private(paths: &[&PathBuf]) {
    for p in paths {
        assert_eq!(mode(p), 0o600, "{} is {:o}", p.display(), mode(p));
    }
}

#[tokio::test]
async fn secrets_are_kept_in_files_only_their_owner_can_read() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let kubeconfig = root.path().join("kube/config");
    let (db, key) = (data.join(DATA_FILE), data.join("tls.key"));

    // First start: everything is created by the server, under umask 0.
    let mut server = Server::start(&data, &kubeconfig);
    server.ready(&kubeconfig).await;
    private(&[&db, &key, &kubeconfig]);
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(kubeconfig.parent().unwrap()), 0o700);
    server.stop();

    // Files left readable by all (by an older version, or by hand) are
    // narrowed; someone who opened the old kubeconfig does not get the new
    // token through it.
    let loose = Permissions::from_mode(0o644);
    for p in [&db, &key, &kubeconfig] {
        std::fs::set_permissions(p, loose.clone()).unwrap();
    }
    std::fs::write(&kubeconfig, "").unwrap();
    let early_reader = File::open(&kubeconfig).unwrap();
    let mut server = Server::start(&data, &kubeconfig);
    server.ready(&kubeconfig).await;
    private(&[&db, &key, &kubeconfig]);
    assert_eq!(std::io::read_to_string(early_reader).unwrap(), "");
    server.stop();
}
