//! What the agent-upgrade tests and bench share: a stand-in for systemd
//! that runs the agent exactly as `systemd/k8s4r-agent.service` says
//! (its `ExecStartPre`, `ExecStart` and `ExecStopPost` lines, its
//! `Environment` (`%n` the unit's name), `RestartSec`, `Restart=always`;
//! its `ExecStopPost` sees `SERVICE_RESULT` and, through a `systemctl`
//! of its own on `PATH`, a `stop` job only when the unit is stopped,
//! none when it restarts; and its watchdog: `WatchdogSec`, with
//! `NOTIFY_SOCKET` and `WATCHDOG_USEC` given to the main process, SIGABRT
//! when it is not told in time and SIGKILL `TimeoutAbortSec` later), a robot installed in upgrade slots as
//! `systemd/install.sh` installs it, and the signing of artifacts with the
//! real `k8s4r sign-agent`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

/// The agent's unit file, as committed.
pub fn unit_file_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/k8s4r-agent.service");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One command line of the unit.
#[derive(Clone, Debug)]
struct ExecLine {
    /// `-` before the path: its failure does not fail the start.
    may_fail: bool,
    argv: Vec<String>,
}

/// What a stand-in for systemd reads of the unit.
#[derive(Clone, Debug)]
pub struct UnitFile {
    start_pre: Vec<ExecLine>,
    start: ExecLine,
    stop_post: Vec<ExecLine>,
    /// `RestartSec`.
    pub restart_sec: Duration,
    /// `WatchdogSec`.
    pub watchdog: Option<Duration>,
    /// `TimeoutAbortSec`.
    pub abort_timeout: Duration,
    /// `Environment`, for every command.
    environment: Vec<(String, String)>,
}

/// The unit's name (`%n`).
const UNIT_NAME: &str = "k8s4r-agent.service";

impl UnitFile {
    /// Parses the unit's text, replacing each `(from, to)` in its command
    /// lines (the state directory and config file of a robot in a test).
    pub fn parse(text: &str, replace: &[(&str, &str)]) -> UnitFile {
        let mut start_pre = Vec::new();
        let mut start = None;
        let mut stop_post = Vec::new();
        let mut restart_sec = Duration::from_millis(100);
        let mut watchdog = None;
        let mut abort_timeout = Duration::from_secs(90);
        let mut environment = Vec::new();
        for line in text.lines().map(str::trim) {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if line.starts_with('#') {
                continue;
            }
            let exec = || {
                let mut value = value.to_owned();
                for (from, to) in replace {
                    value = value.replace(from, to);
                }
                let may_fail = value.starts_with('-');
                ExecLine {
                    may_fail,
                    argv: value
                        .trim_start_matches('-')
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect(),
                }
            };
            match key {
                "ExecStartPre" => start_pre.push(exec()),
                "ExecStart" => start = Some(exec()),
                "ExecStopPost" => stop_post.push(exec()),
                "Environment" => {
                    if let Some((name, value)) = value.split_once('=') {
                        environment.push((name.to_owned(), value.replace("%n", UNIT_NAME)));
                    }
                }
                "RestartSec" => {
                    restart_sec = k8s4r_api::parse_duration(value).expect("RestartSec is a duration");
                }
                "WatchdogSec" => {
                    watchdog = Some(k8s4r_api::parse_duration(value).expect("WatchdogSec is a duration"));
                }
                "TimeoutAbortSec" => {
                    abort_timeout = k8s4r_api::parse_duration(value).expect("TimeoutAbortSec is a duration");
                }
                _ => {}
            }
        }
        UnitFile {
            start_pre,
            start: start.expect("the unit has an ExecStart"),
            stop_post,
            restart_sec,
            watchdog,
            abort_timeout,
            environment,
        }
    }
}

struct Shared {
    stop: AtomicBool,
    main_pid: Mutex<Option<i32>>,
    starts: AtomicU32,
    /// Main processes killed for their silence.
    watchdog_kills: AtomicU32,
    wake: (Mutex<()>, Condvar),
}

/// A service run as systemd runs it with `Restart=always`: the start
/// commands, the main process until it exits, the stop commands, then the
/// restart delay, again and again until stopped.
pub struct Unit {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Unit {
    /// Starts `unit` with `env` in every command's environment; the
    /// output of all of them is appended to `log`.
    pub fn start(unit: UnitFile, env: Vec<(String, String)>, log: &Path) -> Unit {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            main_pid: Mutex::new(None),
            starts: AtomicU32::new(0),
            watchdog_kills: AtomicU32::new(0),
            wake: (Mutex::new(()), Condvar::new()),
        });
        let log = log.to_owned();
        let s = shared.clone();
        let thread = std::thread::spawn(move || run_unit(&unit, &env, &log, &s));
        Unit {
            shared,
            thread: Some(thread),
        }
    }

    /// The main process now, if one runs.
    pub fn main_pid(&self) -> Option<i32> {
        *self.shared.main_pid.lock().unwrap()
    }

    /// How many times the main process was started.
    pub fn starts(&self) -> u32 {
        self.shared.starts.load(Ordering::SeqCst)
    }

    /// How many main processes the watchdog killed.
    pub fn watchdog_kills(&self) -> u32 {
        self.shared.watchdog_kills.load(Ordering::SeqCst)
    }

    /// SIGKILLs the main process (systemd restarts it).
    pub fn kill_main(&self) {
        if let Some(pid) = self.main_pid() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    /// `systemctl stop`: SIGTERM to the main process only (KillMode=process),
    /// SIGKILL after 30 s, then the stop commands; no restart.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.1.notify_all();
        if let Some(pid) = self.main_pid() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if let Some(thread) = self.thread.take() {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::park_timeout(Duration::from_millis(20));
            }
            if !thread.is_finished() {
                self.kill_main();
            }
            let _ = thread.join();
        }
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn command(line: &ExecLine, env: &[(String, String)], log: &Path) -> Command {
    let mut cmd = Command::new(&line.argv[0]);
    cmd.args(&line.argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    // A log that cannot be opened (the test's directory is gone) loses the
    // output, not the unit.
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log);
    match out.and_then(|o| Ok((o.try_clone()?, o))) {
        Ok((out, err)) => cmd.stdout(out).stderr(err),
        Err(_) => cmd.stdout(Stdio::null()).stderr(Stdio::null()),
    };
    cmd
}

/// What systemd gives `ExecStopPost` besides the unit's environment:
/// `SERVICE_RESULT`, and here a `systemctl` whose `list-jobs` says the
/// unit's job (written next to `log` before each stop).
fn stop_post_env(env: &[(String, String)], log: &Path) -> Vec<(String, String)> {
    let bin = log.with_extension("bin");
    let _ = std::fs::create_dir_all(&bin);
    let script = format!(
        "#!/bin/sh\ncat {} 2>/dev/null\n",
        log.with_extension("jobs").display()
    );
    let systemctl = bin.join("systemctl");
    let _ = std::fs::write(&systemctl, script);
    let _ = std::fs::set_permissions(&systemctl, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    let path = std::env::var("PATH").unwrap_or_default();
    let mut env = env.to_vec();
    env.push(("SERVICE_RESULT".into(), "success".into()));
    env.push(("PATH".into(), format!("{}:{path}", bin.display())));
    env
}

/// Runs `line` to its end; whether it succeeded.
fn run_to_end(line: &ExecLine, env: &[(String, String)], log: &Path) -> bool {
    command(line, env, log).status().is_ok_and(|s| s.success())
}

/// The unit's watchdog: the socket its main process is told of, and what
/// the unit says of it.
struct Watchdog {
    socket: std::os::unix::net::UnixDatagram,
    path: PathBuf,
    every: Duration,
    abort_timeout: Duration,
}

fn run_unit(unit: &UnitFile, env: &[(String, String)], log: &Path, shared: &Shared) {
    let watchdog = unit.watchdog.map(|every| {
        let path = log.with_extension("notify");
        let _ = std::fs::remove_file(&path);
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("a read timeout");
        Watchdog {
            socket,
            path,
            every,
            abort_timeout: unit.abort_timeout,
        }
    });
    let env = &[unit.environment.clone(), env.to_vec()].concat();
    let stop_env = stop_post_env(env, log);
    let mut main_env = env.to_vec();
    if let Some(dog) = &watchdog {
        main_env.push(("NOTIFY_SOCKET".into(), dog.path.display().to_string()));
        main_env.push(("WATCHDOG_USEC".into(), dog.every.as_micros().to_string()));
    }
    while !shared.stop.load(Ordering::SeqCst) {
        let pre_ok = unit
            .start_pre
            .iter()
            .all(|line| run_to_end(line, env, log) || line.may_fail);
        if pre_ok {
            match command(&unit.start, &main_env, log).spawn() {
                Ok(child) => wait_main(child, shared, watchdog.as_ref()),
                Err(e) => {
                    let _ = std::fs::OpenOptions::new()
                        .append(true)
                        .open(log)
                        .and_then(|mut f| {
                            std::io::Write::write_all(&mut f, format!("unit: start: {e}\n").as_bytes())
                        });
                }
            }
            // systemd runs a `stop` job while it stops the unit; when the
            // unit restarts on its own (a crash, an upgrade's switch) none.
            let jobs = match shared.stop.load(Ordering::SeqCst) {
                true => format!("1 {UNIT_NAME} stop running\n"),
                false => String::new(),
            };
            let _ = std::fs::write(log.with_extension("jobs"), jobs);
            for line in &unit.stop_post {
                run_to_end(line, &stop_env, log);
            }
        }
        let guard = shared.wake.0.lock().unwrap();
        if !shared.stop.load(Ordering::SeqCst) {
            let _ = shared.wake.1.wait_timeout(guard, unit.restart_sec);
        }
    }
}

fn wait_main(mut child: Child, shared: &Shared, watchdog: Option<&Watchdog>) {
    let pid = i32::try_from(child.id()).ok();
    *shared.main_pid.lock().unwrap() = pid;
    shared.starts.fetch_add(1, Ordering::SeqCst);
    let Some(dog) = watchdog else {
        let _ = child.wait();
        *shared.main_pid.lock().unwrap() = None;
        return;
    };
    // What an earlier process said is not this one's.
    let mut buf = [0u8; 512];
    dog.socket.set_nonblocking(true).expect("nonblocking");
    while dog.socket.recv(&mut buf).is_ok() {}
    dog.socket.set_nonblocking(false).expect("blocking");
    let mut told = std::time::Instant::now();
    let mut aborted: Option<std::time::Instant> = None;
    let signal = |sig| {
        if let Some(pid) = pid {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    };
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        // Waits up to the socket's read timeout for a message.
        if let Ok(n) = dog.socket.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "WATCHDOG=1")
            {
                told = std::time::Instant::now();
            }
        }
        if shared.stop.load(Ordering::SeqCst) {
            // Stopping: systemd no longer watches.
            let _ = child.wait();
            break;
        }
        match aborted {
            None if told.elapsed() > dog.every => {
                shared.watchdog_kills.fetch_add(1, Ordering::SeqCst);
                signal(Signal::SIGABRT);
                aborted = Some(std::time::Instant::now());
            }
            Some(at) if at.elapsed() > dog.abort_timeout => signal(Signal::SIGKILL),
            _ => {}
        }
    }
    *shared.main_pid.lock().unwrap() = None;
}

/// The minisign key of a test's fleet, made with `k8s4r sign-agent
/// --generate`.
pub struct Signer {
    secret_key: PathBuf,
    dir: PathBuf,
}

/// One agent binary as an AgentRollout's artifact.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub bytes: Vec<u8>,
    pub sha256: String,
    pub signature: String,
}

impl Signer {
    /// A new key pair under `dir`.
    pub fn new(dir: &Path) -> Signer {
        std::fs::create_dir_all(dir).expect("the signer's dir");
        let secret_key = dir.join("agent-signing.key");
        k8s4r::sign::run(&k8s4r::sign::SignArgs {
            binary: None,
            secret_key: secret_key.clone(),
            generate: true,
            password_file: None,
            agent_version: None,
            downgrade_from: None,
        })
        .expect("k8s4r sign-agent --generate");
        Signer {
            secret_key,
            dir: dir.to_owned(),
        }
    }

    /// The public key, as a robot's `upgrade_public_keys` pins it.
    pub fn public_key(&self) -> String {
        let mut path = self.secret_key.clone().into_os_string();
        path.push(".pub");
        let text = std::fs::read_to_string(path).expect("the public key");
        text.lines()
            .rfind(|l| !l.trim().is_empty())
            .expect("a key line")
            .trim()
            .to_owned()
    }

    /// `binary` (copied as `name`), signed as `k8s4r sign-agent` signs it
    /// (its version asked from the binary).
    pub fn sign(&self, name: &str, binary: &Path) -> Artifact {
        let copy = self.dir.join(name);
        std::fs::copy(binary, &copy).expect("copy the binary to sign");
        self.sign_file(&copy)
    }

    /// `bytes` written as `name` and signed for `version`.
    pub fn sign_bytes(&self, name: &str, bytes: &[u8], version: &str) -> Artifact {
        let path = self.dir.join(name);
        std::fs::write(&path, bytes).expect("write the binary to sign");
        k8s4r::sign::run(&k8s4r::sign::SignArgs {
            binary: Some(path.clone()),
            secret_key: self.secret_key.clone(),
            generate: false,
            password_file: None,
            agent_version: Some(version.to_owned()),
            downgrade_from: None,
        })
        .expect("k8s4r sign-agent");
        artifact_of(&path)
    }

    fn sign_file(&self, path: &Path) -> Artifact {
        k8s4r::sign::run(&k8s4r::sign::SignArgs {
            binary: Some(path.to_owned()),
            secret_key: self.secret_key.clone(),
            generate: false,
            password_file: None,
            agent_version: None,
            downgrade_from: None,
        })
        .expect("k8s4r sign-agent");
        artifact_of(path)
    }
}

fn artifact_of(path: &Path) -> Artifact {
    let bytes = std::fs::read(path).expect("the signed binary");
    let mut sig = path.as_os_str().to_owned();
    sig.push(".minisig");
    Artifact {
        sha256: sha256_hex(&bytes),
        signature: std::fs::read_to_string(sig).expect("its signature"),
        bytes,
    }
}

/// Hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A robot installed as `systemd/install.sh` installs it: `binary` in the
/// slot of `version` under `state_dir`, `current` and `confirmed` pointing
/// at it, and `config` written as its agent.toml. Returns the unit that
/// runs it (not started).
pub fn install_robot(state_dir: &Path, version: &str, binary: &Path, config: &Path, toml: &str) -> UnitFile {
    std::fs::create_dir_all(state_dir).expect("the robot's state dir");
    k8s4r_agent::upgrade::slots::Slots::new(state_dir)
        .install(version, binary)
        .expect("install the agent in its slot");
    std::fs::write(config, toml).expect("agent.toml");
    let state = state_dir.to_str().expect("a UTF-8 path");
    let config = config.to_str().expect("a UTF-8 path");
    UnitFile::parse(
        &unit_file_text(),
        &[("/var/lib/k8s4r", state), ("/etc/k8s4r/agent.toml", config)],
    )
}

/// `binary` with its ELF machine field changed to aarch64: a binary built
/// for another architecture, as far as any check that reads it can tell.
pub fn as_aarch64(binary: &[u8]) -> Vec<u8> {
    let mut bytes = binary.to_vec();
    // e_machine, little endian, at offset 18: EM_AARCH64 is 183.
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    bytes
}
