//! A real container registry (Debian's `docker-registry`, installed by
//! scripts/setup.sh) on a free loopback port, a small image built here
//! with buildah from scratch and pushed to it by digest, and a podman
//! store of a test's own (vfs, runc: nothing of the machine's store is
//! used or left behind).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Program;

/// Programs the test image holds, with the libraries they load.
const IMAGE_PROGRAMS: &[&str] = &["/bin/sh", "/bin/sleep", "/bin/cat", "/usr/bin/id", "/usr/bin/env"];

/// A registry, killed on drop.
pub struct Registry {
    /// `127.0.0.1:PORT`, as an image reference names it.
    pub host: String,
    _program: Program,
    dir: tempfile::TempDir,
}

fn require(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{tool} is not installed: run scripts/setup.sh");
}

impl Registry {
    /// Starts one and waits until it answers.
    pub fn start() -> Registry {
        require("docker-registry");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = crate::free_port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("data").display()
            ),
        )
        .expect("write the registry's config");
        let program = Program::start(
            "docker-registry",
            Path::new("docker-registry"),
            vec!["serve".into(), config.display().to_string()],
            &dir.path().join("registry.log"),
        );
        let host = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {host}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            host,
            _program: program,
            dir,
        }
    }

    /// Builds the test image (a shell, sleep, cat, id and env, a file
    /// `/image-marker` holding `from the image`, command `sh -c 'echo hello
    /// from the image'`) and pushes it as `<host>/<name>:test`; returns its
    /// reference by digest.
    pub fn push_test_image(&self, name: &str) -> String {
        self.push_test_image_with(name, 0)
    }

    /// [`Registry::push_test_image`] with a file of `extra_bytes` random
    /// bytes in the image too (`/filler`), for an image of a given size.
    pub fn push_test_image_with(&self, name: &str, extra_bytes: u64) -> String {
        require("buildah");
        let store = self.dir.path().join("buildah");
        let buildah = |args: &[&str]| -> String {
            let out = Command::new("buildah")
                .arg("--root")
                .arg(store.join("root"))
                .arg("--runroot")
                .arg(store.join("run"))
                .args(["--storage-driver", "vfs"])
                .args(args)
                .output()
                .expect("run buildah");
            assert!(
                out.status.success(),
                "buildah {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        let ctr = buildah(&["from", "scratch"]);
        let root = PathBuf::from(buildah(&["mount", &ctr]));
        for program in IMAGE_PROGRAMS {
            copy_with_libraries(Path::new(program), &root);
        }
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        std::fs::write(root.join("image-marker"), "from the image\n").unwrap();
        if extra_bytes > 0 {
            let filler = std::fs::File::create(root.join("filler")).expect("the filler");
            let status = Command::new("head")
                .args(["-c", &extra_bytes.to_string(), "/dev/urandom"])
                .stdout(filler)
                .status()
                .expect("head runs");
            assert!(status.success());
        }
        buildah(&[
            "config",
            "--cmd",
            r#"["/bin/sh","-c","echo hello from the image"]"#,
            &ctr,
        ]);
        let tagged = format!("{}/{name}:test", self.host);
        buildah(&["commit", "--quiet", &ctr, &tagged]);
        let digest_file = self.dir.path().join(format!("{name}.digest"));
        buildah(&[
            "push",
            "--quiet",
            "--tls-verify=false",
            "--digestfile",
            digest_file.to_str().unwrap(),
            &tagged,
        ]);
        let digest = std::fs::read_to_string(&digest_file).expect("buildah wrote the digest");
        format!("{}/{name}@{}", self.host, digest.trim())
    }
}

/// Copies `program` and the shared libraries it loads (ldd) into `root`.
fn copy_with_libraries(program: &Path, root: &Path) {
    let out = Command::new("ldd").arg(program).output().expect("run ldd");
    let listing = String::from_utf8_lossy(&out.stdout);
    let libraries = listing
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
        .map(PathBuf::from);
    for file in std::iter::once(program.to_path_buf()).chain(libraries) {
        let to = root.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&file, &to).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
    }
}

/// A podman store of a test's own, removed on drop.
pub struct PodmanStore {
    dir: tempfile::TempDir,
}

impl Default for PodmanStore {
    fn default() -> Self {
        Self::new()
    }
}

impl PodmanStore {
    /// A new, empty one.
    pub fn new() -> PodmanStore {
        require("podman");
        PodmanStore {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// The options that make podman use it: the agent's `podman_args`.
    /// vfs needs neither overlayfs nor fuse; runc, unlike crun 1.8, runs
    /// under a hybrid cgroup hierarchy.
    pub fn args(&self) -> Vec<String> {
        vec![
            format!("--root={}", self.dir.path().join("root").display()),
            format!("--runroot={}", self.dir.path().join("run").display()),
            "--storage-driver=vfs".into(),
            "--runtime=runc".into(),
        ]
    }

    /// Runs podman on this store; its stdout, trimmed (panics on failure).
    pub fn podman(&self, args: &[&str]) -> String {
        let out = Command::new("podman")
            .args(self.args())
            .args(args)
            .output()
            .expect("run podman");
        assert!(
            out.status.success(),
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Whether the store holds the image `reference`.
    pub fn has_image(&self, reference: &str) -> bool {
        Command::new("podman")
            .args(self.args())
            .args(["image", "exists", reference])
            .status()
            .expect("run podman")
            .success()
    }

    /// The names of the containers in the store, running or not.
    pub fn containers(&self) -> Vec<String> {
        self.podman(&["ps", "--all", "--format", "{{.Names}}"])
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect()
    }
}

impl Drop for PodmanStore {
    fn drop(&mut self) {
        // Containers still there would keep their mounts busy.
        let _ = Command::new("podman")
            .args(self.args())
            .args(["rm", "--all", "--force", "--time", "0"])
            .output();
    }
}
