//! Runs the machine's kubectl binaries against a test server.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The oldest kubectl the project supports, and the newest on the machine.
pub const OLDEST: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.27";
pub const NEWEST: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

/// One kubectl binary with its own kubeconfig and HOME.
pub struct Kubectl {
    pub bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Kubectl {
    pub fn new(bin: &str, kubeconfig: &Path) -> Option<Self> {
        if !Path::new(bin).exists() {
            eprintln!("skipping {bin}: not installed");
            return None;
        }
        Some(Kubectl {
            bin: bin.into(),
            kubeconfig: kubeconfig.into(),
            home: tempfile::tempdir().unwrap(),
        })
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        // A fresh HOME keeps kubectl's discovery cache per test.
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .env_remove("KUBECTL_EXTERNAL_DIFF");
        c
    }

    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let mut c = self.command(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("kubectl runs");
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(args, None);
        assert!(ok, "{} {args:?} failed:\n{out}", self.bin.display());
        out
    }

    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let (ok, out) = self.run(args, Some(stdin));
        assert!(ok, "{} {args:?} failed:\n{out}", self.bin.display());
        out
    }

    pub fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out) = self.run(args, stdin);
        assert!(!ok, "{} {args:?} should fail:\n{out}", self.bin.display());
        out
    }
}
