//! Test fixtures: a real Mosquitto on a port chosen at run time, a test
//! "server" played by a plain rumqttc client, and the real agent binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s4r_api::protocol::{decode, encode, Message, RegisterResponse, StatusUpdate, Topics};
use k8s4r_api::RobotPhase;
use k8s4r_testbed::{free_port, Mosquitto};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;

/// Polls `f` until it returns Some, or panics with `what` at the deadline.
pub async fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Mosquitto broker with persistence, and optionally a TLS listener;
/// killed on drop.
pub struct Broker {
    mosquitto: Mosquitto,
    /// The TLS listener's port, for [`Broker::start_tls`].
    pub tls_port: Option<u16>,
}

impl Broker {
    /// Starts a broker with persistence (so queued QoS 1 messages and
    /// persistent sessions survive a restart).
    pub fn start() -> Broker {
        Self::start_with(false, false)
    }

    /// Starts a broker with a second, TLS listener whose certificate (for
    /// IP 127.0.0.1) is signed by a fresh CA; see [`Broker::ca_file`].
    pub fn start_tls() -> Broker {
        Self::start_with(true, false)
    }

    /// Like [`Broker::start_tls`], and the TLS listener requires a client
    /// certificate signed by the same CA; see [`Broker::client_cert`].
    pub fn start_mtls() -> Broker {
        Self::start_with(true, true)
    }

    /// The CA certificate of the TLS listener.
    pub fn ca_file(&self) -> PathBuf {
        self.mosquitto.dir().join("ca.pem")
    }

    /// A client certificate and key the CA signed.
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        let dir = self.mosquitto.dir();
        (dir.join("client.pem"), dir.join("client.key"))
    }

    fn start_with(tls: bool, require_client_cert: bool) -> Broker {
        let mut tls_port = None;
        let mosquitto = Mosquitto::start_with(|port, dir| {
            let d = dir.display();
            let mut text = format!(
                "allow_anonymous true\npersistence true\npersistence_location {d}/\nautosave_interval 1\nmax_queued_messages 10000\nlistener {port} 127.0.0.1\n"
            );
            if tls {
                k8s4r_testbed::make_certificates(dir);
                let port = free_port();
                text.push_str(&format!(
                    "listener {port} 127.0.0.1\ncafile {d}/ca.pem\ncertfile {d}/server.pem\nkeyfile {d}/server.key\nrequire_certificate {require_client_cert}\n"
                ));
                tls_port = Some(port);
            }
            text
        });
        Broker { mosquitto, tls_port }
    }

    /// `mqtt://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        self.mosquitto.url()
    }

    /// Stops the broker (SIGTERM, so it saves its persistence file).
    pub fn stop(&mut self) {
        self.mosquitto.stop();
    }

    /// Starts it again on the same port with the same state.
    pub fn restart(&mut self) {
        self.mosquitto.restart();
    }

    /// The broker's log.
    pub fn log(&self) -> String {
        self.mosquitto.log()
    }
}

/// One message the test server received.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
    pub at: Instant,
}

impl Received {
    pub fn decode<M: Message>(&self) -> M {
        decode(&self.payload).unwrap_or_else(|e| panic!("{}: {e}", self.topic))
    }
}

/// The server side, played by a plain client with a persistent session.
pub struct Server {
    pub client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Received>,
    pub topics: Topics,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Connects and subscribes to everything under `k8s4r/robots/<robot>/`.
    pub async fn connect(broker: &Broker, robot: &str) -> Server {
        let mut options =
            MqttOptions::new(format!("test-server-{robot}"), "127.0.0.1", broker.mosquitto.port);
        options.set_clean_session(false);
        options.set_max_packet_size(4 << 20, 4 << 20);
        options.set_keep_alive(Duration::from_secs(5));
        let (client, mut eventloop) = AsyncClient::new(options, 1000);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(Received {
                            topic: p.topic.clone(),
                            payload: p.payload.to_vec(),
                            retain: p.retain,
                            at: Instant::now(),
                        });
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        client
            .subscribe(format!("k8s4r/robots/{robot}/#"), QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        tokio::time::timeout(Duration::from_secs(10), ready_rx.recv())
            .await
            .expect("SUBACK in time");
        Server {
            client,
            rx,
            topics: Topics::default(),
            task,
        }
    }

    /// The next message whose topic ends with `suffix`, skipping others.
    pub async fn next(&mut self, suffix: &str, timeout: Duration) -> Received {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) if m.topic.ends_with(suffix) => return m,
                Ok(Some(_)) => {}
                Ok(None) => panic!("test server stopped"),
                Err(_) => panic!("no message on *{suffix} within {timeout:?}"),
            }
        }
    }

    /// Every message that arrives within `window`.
    pub async fn drain(&mut self, window: Duration) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + window;
        let mut out = Vec::new();
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            out.push(m);
        }
        out
    }

    pub async fn publish(&self, topic: String, payload: Vec<u8>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .expect("publish");
    }

    /// Waits for a register from `robot` and approves it.
    pub async fn approve(&mut self, robot: &str) -> k8s4r_api::protocol::Register {
        let register = self.next("/register", Duration::from_secs(20)).await.decode();
        self.publish(
            self.topics.response(robot),
            encode(&RegisterResponse::new(
                RobotPhase::Online,
                Some("approved".into()),
            )),
        )
        .await;
        register
    }

    /// Waits for a register from `robot` and approves it as the current
    /// server does: with the registration's nonce, the server's clock,
    /// status confirmations on and heartbeats allowed to leave out usage
    /// that has not moved.
    pub async fn approve_current(&mut self, robot: &str) -> k8s4r_api::protocol::Register {
        let register: k8s4r_api::protocol::Register =
            self.next("/register", Duration::from_secs(20)).await.decode();
        let answer = RegisterResponse {
            server_time: Some(jiff::Timestamp::now()),
            status_acks: true,
            usage_when_moved: true,
            nonce: register.nonce.clone(),
            ..RegisterResponse::new(RobotPhase::Online, Some("approved".into()))
        };
        self.publish(self.topics.response(robot), encode(&answer)).await;
        register
    }

    /// The status updates of task `uid` until one is terminal.
    pub async fn statuses_until_terminal(&mut self, uid: &str, timeout: Duration) -> Vec<StatusUpdate> {
        let suffix = format!("/tasks/{uid}/status");
        let deadline = Instant::now() + timeout;
        let mut out: Vec<StatusUpdate> = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let update: StatusUpdate = self.next(&suffix, left).await.decode();
            let terminal = update.state.is_terminal();
            out.push(update);
            if terminal {
                return out;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The real `k8s4r-agent` binary; SIGKILLed on drop.
pub struct Agent {
    pub child: Child,
    pub state_dir: PathBuf,
    log: PathBuf,
}

impl Agent {
    /// Starts the agent against `broker` with `state_dir` and extra flags.
    pub fn start(broker: &Broker, robot: &str, state_dir: &Path, extra: &[&str]) -> Agent {
        Self::start_url(&broker.url(), robot, state_dir, extra)
    }

    /// Like [`Agent::start`], with these variables in the agent's
    /// environment.
    pub fn start_with_env(
        broker: &Broker,
        robot: &str,
        state_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        Self::start_inner(&broker.url(), robot, state_dir, extra, env)
    }

    /// Starts the agent against the broker at `url`.
    pub fn start_url(url: &str, robot: &str, state_dir: &Path, extra: &[&str]) -> Agent {
        Self::start_inner(url, robot, state_dir, extra, &[])
    }

    fn start_inner(url: &str, robot: &str, state_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let log = state_dir.with_extension(format!("{}.log", std::process::id()));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("agent log");
        let child = Command::new(env!("CARGO_BIN_EXE_k8s4r-agent"))
            .args(["--config", "/dev/null"])
            .args(["--broker-url", url])
            .args(["--robot-id", robot])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--heartbeat-interval", "200ms"])
            .args(["--reconnect-min", "100ms", "--reconnect-max", "1s"])
            .args(["--register-retry-min", "1s"])
            .args(["--log", "k8s4r_agent=debug,info"])
            // The tests' dispatches are mostly raw_exec shell scripts;
            // flags in `extra` come later and win.
            .args(["--raw-exec", "true", "--allow-root", "true"])
            .args(extra)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start k8s4r-agent");
        Agent {
            child,
            state_dir: state_dir.to_owned(),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).expect("signal the agent");
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Outbox entries on disk.
    pub fn outbox_files(&self) -> Vec<String> {
        std::fs::read_dir(self.state_dir.join("outbox"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        // What it left running (services, by design; a killed agent's
        // tasks) must not outlive the test.
        k8s4r_testbed::process::kill_tasks_under(&self.state_dir);
        if std::thread::panicking() {
            eprintln!("---- agent log ----\n{}", self.log());
        }
    }
}

/// A dispatch of `sh -c <script>` through raw_exec.
pub fn shell_dispatch(uid: &str, attempt: u32, script: &str) -> k8s4r_api::protocol::Dispatch {
    let spec = k8s4r_api::TaskTemplate {
        driver: "raw_exec".into(),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    };
    k8s4r_api::protocol::Dispatch::new(uid, format!("default/{uid}"), attempt, spec)
}

/// Asserts updates are in order as the server applies them. Delivery is
/// at-least-once: a PUBACK lost with the broker makes the agent send an
/// update again after it reconnects, so an update whose seq was already
/// seen must be an exact copy of that one and is skipped, as the server
/// skips it. What is left must have strictly increasing seqs, states that
/// never go back, and exactly one terminal state, at the end.
pub fn assert_in_order(updates: &[StatusUpdate]) {
    let mut applied: Vec<&StatusUpdate> = Vec::new();
    for update in updates {
        match applied.iter().find(|a| a.seq == update.seq) {
            Some(earlier) => assert_eq!(*earlier, update, "one seq sent with two contents: {updates:#?}"),
            None => applied.push(update),
        }
    }
    for pair in applied.windows(2) {
        assert!(pair[0].seq < pair[1].seq, "seq order: {updates:#?}");
        assert!(
            !pair[0].state.is_terminal(),
            "state after a terminal one: {updates:#?}"
        );
    }
}
