//! What the tests of deploy/ share: the repository's files, and a
//! Mosquitto running deploy/mosquitto's configuration.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s4r_testbed::{make_certificates, Mosquitto};

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

pub fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// deploy/mosquitto's configuration, with its install paths pointed at the
/// broker's directory and its listener at a free port; each replacement
/// must match, so the test follows the file.
pub fn start_deployed_mosquitto(users: &[(&str, &str)]) -> Mosquitto {
    use std::os::unix::fs::PermissionsExt;
    Mosquitto::start_with(|port, d| {
        make_certificates(d);
        let passwd = d.join("k8s4r.passwd");
        for (i, (user, password)) in users.iter().enumerate() {
            let mut cmd = Command::new("mosquitto_passwd");
            if i == 0 {
                cmd.arg("-c");
            }
            let out = cmd
                .arg("-b")
                .arg(&passwd)
                .args([user, password])
                .output()
                .expect("mosquitto_passwd (it comes with mosquitto: run scripts/setup.sh)");
            assert!(
                out.status.success(),
                "mosquitto_passwd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(d.join("k8s4r.acl"), repo_file("deploy/mosquitto/k8s4r.acl")).unwrap();
        // Mosquitto started as root reads them as its own user.
        for file in ["k8s4r.passwd", "k8s4r.acl"] {
            std::fs::set_permissions(d.join(file), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let mut conf = repo_file("deploy/mosquitto/mosquitto.conf");
        let here = d.display().to_string();
        for (from, to) in [
            (
                "password_file /etc/mosquitto/k8s4r.passwd",
                format!("password_file {here}/k8s4r.passwd"),
            ),
            (
                "acl_file /etc/mosquitto/k8s4r.acl",
                format!("acl_file {here}/k8s4r.acl"),
            ),
            (
                "cafile /etc/mosquitto/certs/ca.crt",
                format!("cafile {here}/ca.pem"),
            ),
            (
                "certfile /etc/mosquitto/certs/server.crt",
                format!("certfile {here}/server.pem"),
            ),
            (
                "keyfile /etc/mosquitto/certs/server.key",
                format!("keyfile {here}/server.key"),
            ),
            ("listener 8883", format!("listener {port} 127.0.0.1")),
        ] {
            assert!(
                conf.contains(from),
                "deploy/mosquitto/mosquitto.conf no longer says {from:?}"
            );
            conf = conf.replace(from, &to);
        }
        // Installed as README says: in conf.d, under a main file that says
        // what Debian's /etc/mosquitto/mosquitto.conf says, so that a setting
        // Mosquitto refuses to see twice fails here too.
        std::fs::create_dir(d.join("conf.d")).unwrap();
        std::fs::write(d.join("conf.d/k8s4r.conf"), conf).unwrap();
        format!("persistence true\npersistence_location {here}/\ninclude_dir {here}/conf.d\n")
    })
}
