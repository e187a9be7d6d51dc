//! What k8s4r's integration tests share: a free loopback port, polling with
//! a deadline instead of sleeping, the machine's kubectl, the Mosquitto
//! binary, TLS certificates made with openssl, and fault injection: a TCP
//! proxy a test can cut, blackhole or slow down ([`proxy`]), and programs it
//! can SIGKILL and restart ([`process`]); for benchmarks, their flags and
//! the API server's write counter; for the dashboard, headless Chromium
//! ([`browser`]) and pages to load in it ([`http`]).

pub mod browser;
pub mod http;
pub mod moto;
pub mod process;
pub mod proxy;
pub mod rbac;
pub mod registry;

pub use browser::{Browser, Element};
pub use process::Program;
pub use proxy::{Fault, Proxy};

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The value given after a bench's flag `name` (`--robots 1000`), if any.
pub fn bench_flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

/// A bench's numeric flag `name` (`--robots 1000`), else `default`.
pub fn bench_arg(name: &str, default: u64) -> u64 {
    bench_flag(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A bench's comma-separated flag `name` (`--rates 10,20`), if given.
pub fn bench_list(name: &str) -> Option<Vec<String>> {
    Some(
        bench_flag(name)?
            .split(',')
            .map(|v| v.trim().to_owned())
            .collect(),
    )
}

/// The API server's resourceVersion now: it moves with every write, so
/// the difference over a stretch of time counts the writes in it (a list's
/// version is the store's, whatever was listed).
pub async fn resource_version(client: &kube::Client) -> u64 {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let list = namespaces
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .expect("list namespaces");
    list.metadata
        .resource_version
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `check` until it returns `Some`, or panics with `what` after
/// `timeout`. The pause between polls only paces the loop.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match eventually_or(timeout, check).await {
        Some(v) => v,
        None => panic!("timed out waiting for: {what}"),
    }
}

/// Polls `check` until it returns `Some`, or returns None after `timeout`:
/// for watching that something does *not* happen within a window.
pub async fn eventually_or<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Runs the machine's kubectl against `kubeconfig`; panics with its stderr
/// when it fails, returns its stdout.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl (it is on the machine image)");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes, with the openssl CLI, in `dir`: a CA (`ca.pem`, `ca.key`), a
/// server certificate for 127.0.0.1 (`server.pem`, `server.key`) and a
/// client certificate with CN `robot` (`client.pem`, `client.key`), all
/// signed by the CA and valid for two days.
pub fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("openssl is needed for the TLS tests ({e}): run scripts/setup.sh"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = [
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=k8s4r test CA",
    ];
    run(&[&["req", "-x509"][..], &ec, &ca].concat());
    // A key and certificate `<name>.key`, `<name>.pem` for `subject`, signed
    // by the CA with the extensions in `extensions`.
    let issue = |name: &str, subject: &str, extensions: &str| {
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.cnf"),
        );
        std::fs::write(dir.join(&ext), extensions).expect("extensions file");
        run(&[
            &["req"][..],
            &ec,
            &["-keyout", &key, "-out", &csr, "-subj", subject],
        ]
        .concat());
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    };
    issue("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\n");
    issue("client", "/CN=robot", "extendedKeyUsage=clientAuth\n");
    use std::os::unix::fs::PermissionsExt;
    for f in ["ca.pem", "server.pem", "server.key"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
}

/// The Mosquitto broker binary; panics with what to do when it is missing.
pub fn mosquitto_binary() -> PathBuf {
    for dir in ["/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join("mosquitto");
        if p.exists() {
            return p;
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("mosquitto");
            if p.exists() {
                return p;
            }
        }
    }
    panic!("mosquitto is not installed: run scripts/setup.sh (it installs the broker these tests start)");
}

/// A Mosquitto broker run from a config file in a directory of its own,
/// killed (and reaped) on drop.
pub struct Mosquitto {
    /// The port of the listener [`Mosquitto::start_with`] was told to use.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl Mosquitto {
    /// Plain MQTT on a free loopback port, anonymous clients allowed, no
    /// persistence.
    pub fn start() -> Mosquitto {
        Self::start_with(|port, _| {
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 10000\nset_tcp_nodelay true\n"
            )
        })
    }

    /// Writes the config `config(port, dir)` gives for a free `port` into
    /// the broker's directory `dir`, starts Mosquitto on it and waits until
    /// `port` accepts connections. The directory is world-writable: started
    /// as root, Mosquitto reads and writes its files as its own user.
    pub fn start_with(config: impl FnOnce(u16, &Path) -> String) -> Mosquitto {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let port = free_port();
        let text = config(port, dir.path());
        std::fs::write(dir.path().join("mosquitto.conf"), text).expect("write mosquitto.conf");
        let mut broker = Mosquitto {
            port,
            dir,
            child: None,
        };
        broker.spawn();
        broker
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("mosquitto.log"))
            .expect("the broker's log file");
        let child = Command::new(mosquitto_binary())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen on {}: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `mqtt://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// The broker's directory (its config, log and whatever else it keeps).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the broker logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Stops the broker with SIGTERM, so that it saves its persistence file.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }

    /// Kills the broker at once (SIGKILL): what it did not save is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The broker's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// Starts it again after [`Mosquitto::kill`] or [`Mosquitto::stop`],
    /// on the same port with the same directory.
    pub fn resume(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }

    /// Stops the broker (SIGTERM) and starts it again on the same port
    /// with the same directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}
