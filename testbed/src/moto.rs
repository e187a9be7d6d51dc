//! moto's S3 server (PyPI, installed by scripts/setup.sh in target/moto):
//! a second S3 implementation, independent of the embedded store, to keep
//! the upload path's S3 client honest.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::process::Program;

/// Where setup.sh puts it; `K8S4R_MOTO_SERVER` names another.
fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("K8S4R_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/moto/bin/moto_server");
    assert!(
        path.exists(),
        "moto is not installed at {}: run scripts/setup.sh (it installs the second S3 server these tests use)",
        path.display()
    );
    path
}

/// A moto S3 server on a free loopback port, killed on drop.
pub struct Moto {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    _program: Program,
    _dir: tempfile::TempDir,
}

impl Moto {
    /// Starts it and waits until it answers; `bucket` is made.
    pub fn start(bucket: &str) -> Moto {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = crate::free_port();
        let program = Program::start(
            "moto",
            &binary(),
            vec!["-H".into(), "127.0.0.1".into(), "-p".into(), port.to_string()],
            &dir.path().join("moto.log"),
        );
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        // moto answers unsigned requests: the bucket is made with a plain
        // PUT, the way a person makes one by hand.
        while !put_bucket(port, bucket) {
            assert!(
                Instant::now() < deadline,
                "moto did not answer on {endpoint}: see {}",
                dir.path().join("moto.log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto {
            endpoint,
            _program: program,
            _dir: dir,
        }
    }
}

/// `PUT /bucket`; whether it answered 200.
fn put_bucket(port: u16, bucket: &str) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let request = format!(
        "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200")
}
