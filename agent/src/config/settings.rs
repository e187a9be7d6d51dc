//! [`Settings`]: every setting, optional, as a flag, an environment
//! variable and a key of the config file at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s4r_api::parse_duration;
use serde::{Deserialize, Deserializer};

use super::LogFormat;
use crate::supervisor::DiskSize;

/// Every setting, each optional: the flags and the config file's keys.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The robot's id: its Robot name and its MQTT topic level (lower-case
    /// letters, digits, '-' and '.'). Default: derived from /etc/machine-id
    /// (`robot-` and its first 12 hex digits), else the host name.
    #[arg(long, env = "K8S4R_ROBOT_ID", value_name = "ID")]
    pub robot_id: Option<String>,

    /// The bootstrap token sent with every registration. Every user of
    /// the machine sees a flag in `ps`: prefer --token-file (or
    /// K8S4R_TOKEN, or the config file).
    #[arg(long, env = "K8S4R_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// A file holding the bootstrap token (surrounding white space is
    /// ignored); only its owner may read it (`chmod 600`). Not together
    /// with --token. Default: none.
    #[arg(long, env = "K8S4R_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// The broker: `mqtt://host[:port]` (default port 1883) or
    /// `mqtts://host[:port]` (TLS, default port 8883). Default:
    /// mqtt://localhost:1883.
    #[arg(long, env = "K8S4R_BROKER_URL", value_name = "URL")]
    pub broker_url: Option<String>,

    /// PEM file of the CA certificate(s) the broker's certificate must chain
    /// to. Required with mqtts://.
    #[arg(long, env = "K8S4R_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --client-key).
    #[arg(long, env = "K8S4R_CLIENT_CERT", value_name = "FILE")]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of the client certificate.
    #[arg(long, env = "K8S4R_CLIENT_KEY", value_name = "FILE")]
    pub client_key: Option<PathBuf>,

    /// MQTT user name. Default, when a password is set: the robot id
    /// (what the broker's per-robot ACL expects).
    #[arg(long, env = "K8S4R_USERNAME", value_name = "NAME")]
    pub username: Option<String>,

    /// MQTT password.
    #[arg(long, env = "K8S4R_PASSWORD", value_name = "PASSWORD", hide_env_values = true)]
    pub password: Option<String>,

    /// MQTT keep-alive interval. Default: 30s.
    #[arg(long, env = "K8S4R_KEEP_ALIVE", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub keep_alive: Option<Duration>,

    /// How long a connection attempt to the broker (TCP, TLS, its CONNACK)
    /// may take before the agent gives it up and tries again, and how long
    /// a write to the broker may stall. Default: 20s.
    #[arg(long, env = "K8S4R_CONNECT_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub connect_timeout: Option<Duration>,

    /// The first level of every MQTT topic. Default: k8s4r.
    #[arg(long, env = "K8S4R_TOPIC_PREFIX", value_name = "PREFIX")]
    pub topic_prefix: Option<String>,

    /// Directory of the status outbox and the tasks' state (the agent
    /// logs at start what it keeps where). Default: /var/lib/k8s4r.
    #[arg(long, env = "K8S4R_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Time between heartbeats (each one jittered by ±10%). Default: 30s.
    #[arg(long, env = "K8S4R_HEARTBEAT_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub heartbeat_interval: Option<Duration>,

    /// First delay before reconnecting to the broker; doubles per failure,
    /// with jitter. Default: 1s.
    #[arg(long, env = "K8S4R_RECONNECT_MIN", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub reconnect_min: Option<Duration>,

    /// Cap of the reconnect delay. Default: 60s.
    #[arg(long, env = "K8S4R_RECONNECT_MAX", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub reconnect_max: Option<Duration>,

    /// How long to wait for the registration's response before registering
    /// again; doubles per retry, with jitter. Default: 5s.
    #[arg(long, env = "K8S4R_REGISTER_RETRY_MIN", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub register_retry_min: Option<Duration>,

    /// Cap of the registration retry delay. Default: 2m.
    #[arg(long, env = "K8S4R_REGISTER_RETRY_MAX", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub register_retry_max: Option<Duration>,

    /// Status updates kept in the outbox before superseded non-terminal
    /// ones are compacted away (terminal ones are never dropped). Default:
    /// 1000.
    #[arg(long, env = "K8S4R_OUTBOX_MAX_ENTRIES", value_name = "N")]
    pub outbox_max_entries: Option<usize>,

    /// How long the report that a task started waits before it is sent: a
    /// task that ends within it is reported once, with its end (one API
    /// write instead of two, and no Lease renewal for it), as Nomad's
    /// client batches allocation updates. 0 sends it at once; at most 10s.
    /// Default: 1s.
    #[arg(long, env = "K8S4R_STATUS_HOLD", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub status_hold: Option<Duration>,

    /// On SIGTERM, how long to keep trying to deliver the outbox after the
    /// tasks have stopped. Default: 5s.
    #[arg(long, env = "K8S4R_SHUTDOWN_FLUSH_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub shutdown_flush_timeout: Option<Duration>,

    /// A label the robot reports about itself, `key=value`; repeat the flag
    /// or separate with commas in K8S4R_LABELS. In the file: a table,
    /// `labels = { site = "lab" }`. Flags win per key.
    #[arg(
        long = "label",
        env = "K8S4R_LABELS",
        value_name = "KEY=VALUE",
        value_delimiter = ','
    )]
    #[serde(default, deserialize_with = "de_labels")]
    pub labels: Vec<String>,

    /// Largest size of one task's log file before it is rotated. Default:
    /// the supervisor's.
    #[arg(long, env = "K8S4R_LOG_MAX_BYTES", value_name = "BYTES")]
    pub log_max_bytes: Option<u64>,

    /// Rotated log files kept per task. Default: the supervisor's.
    #[arg(long, env = "K8S4R_LOG_MAX_FILES", value_name = "N")]
    pub log_max_files: Option<u32>,

    /// Bytes of a task's output sent back in its final status. Default: the
    /// supervisor's.
    #[arg(long, env = "K8S4R_OUTPUT_TAIL_BYTES", value_name = "BYTES")]
    pub output_tail_bytes: Option<usize>,

    /// How often a running task's latest output goes to the cluster (its
    /// Task's `status.outputTail`, read while the robot is offline), when
    /// it printed something since; 0 never. Default: 60s.
    #[arg(long, env = "K8S4R_OUTPUT_TAIL_EVERY", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub output_tail_every: Option<Duration>,

    /// Largest artifact a task may download. Default: the supervisor's.
    #[arg(long, env = "K8S4R_ARTIFACT_MAX_BYTES", value_name = "BYTES")]
    pub artifact_max_bytes: Option<u64>,

    /// Time limit of one artifact download. Default: the supervisor's.
    #[arg(long, env = "K8S4R_ARTIFACT_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub artifact_timeout: Option<Duration>,

    /// Retries of a failed artifact download. Default: the supervisor's.
    #[arg(long, env = "K8S4R_ARTIFACT_RETRIES", value_name = "N")]
    pub artifact_retries: Option<u32>,

    /// Offer the raw_exec driver: tasks run unisolated as the agent's user
    /// (root on a robot, so allow_root must be true as well: an agent
    /// running as root refuses raw_exec without it). Default: false.
    #[arg(long, env = "K8S4R_RAW_EXEC", value_name = "BOOL")]
    pub raw_exec: Option<bool>,

    /// Run tasks as root when they ask for it (`user: root`, or raw_exec
    /// under a root agent). Default: false.
    #[arg(long, env = "K8S4R_ALLOW_ROOT", value_name = "BOOL")]
    pub allow_root: Option<bool>,

    /// Offer the podman driver: tasks in containers from images pinned by
    /// digest (podman must be installed). Default: false.
    #[arg(long, env = "K8S4R_PODMAN", value_name = "BOOL")]
    pub podman: Option<bool>,

    /// The podman program. Default: podman (looked up in PATH).
    #[arg(long, env = "K8S4R_PODMAN_PROGRAM", value_name = "PATH")]
    pub podman_program: Option<PathBuf>,

    /// An option given to podman before its subcommand on every call
    /// (`--storage-driver=vfs`, `--root=/data/containers`); repeat the flag
    /// or separate with commas in K8S4R_PODMAN_ARGS. In the file: a list.
    #[arg(
        long = "podman-arg",
        env = "K8S4R_PODMAN_ARGS",
        value_name = "ARG",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    #[serde(default)]
    pub podman_args: Vec<String>,

    /// A device podman tasks may be given, as they name it (`/dev/video0`,
    /// `nvidia.com/gpu=all`); repeat the flag or separate with commas in
    /// K8S4R_PODMAN_DEVICES. In the file: a list. Default: none.
    #[arg(
        long = "podman-device",
        env = "K8S4R_PODMAN_DEVICES",
        value_name = "DEVICE",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub podman_devices: Vec<String>,

    /// Check the registry's TLS certificate when pulling (false only for a
    /// registry on the robot's own network over plain HTTP). Default: true.
    #[arg(long, env = "K8S4R_PODMAN_TLS_VERIFY", value_name = "BOOL")]
    pub podman_tls_verify: Option<bool>,

    /// Registry credentials for pulls (podman's auth.json). Default:
    /// podman's own.
    #[arg(long, env = "K8S4R_PODMAN_AUTHFILE", value_name = "FILE")]
    pub podman_authfile: Option<PathBuf>,

    /// How long a pull may take before the task's image is unavailable.
    /// Default: 10m.
    #[arg(long, env = "K8S4R_PODMAN_PULL_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub podman_pull_timeout: Option<Duration>,

    /// Images no held task names that are kept, the most recently used
    /// first; the others the agent brought (pulled, or pushed with `k8s4r
    /// image push`) are removed. Default: 3.
    #[arg(long, env = "K8S4R_PODMAN_KEEP_IMAGES", value_name = "N")]
    pub podman_keep_images: Option<usize>,

    /// Disk the images the agent brought may take together, as a size
    /// (`20Gi`) or a share of the file system podman keeps them on
    /// (`25%`): over it, unused images go, the least recently used first.
    /// Default: 25%.
    #[arg(long, env = "K8S4R_PODMAN_IMAGE_BUDGET", value_name = "SIZE")]
    #[serde(default, deserialize_with = "de_disk_size")]
    pub podman_image_budget: Option<DiskSize>,

    /// A user exec tasks may name in `user` (root aside: see allow_root);
    /// repeat the flag or separate with commas in K8S4R_ALLOWED_USERS. In
    /// the file: a list. Default: none.
    #[arg(
        long = "allowed-user",
        env = "K8S4R_ALLOWED_USERS",
        value_name = "USER",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub allowed_users: Vec<String>,

    /// A supplementary group tasks may name in `groups` (`dialout`, `video`,
    /// `gpio`: how tasks reach devices); repeat the flag or separate with
    /// commas in K8S4R_ALLOWED_GROUPS. In the file: a list. Default: none.
    #[arg(
        long = "allowed-group",
        env = "K8S4R_ALLOWED_GROUPS",
        value_name = "GROUP",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub allowed_groups: Vec<String>,

    /// The user exec tasks that name none run as. Default: none, each such
    /// task runs as a uid of its own from task_uids.
    #[arg(long, env = "K8S4R_EXEC_DEFAULT_USER", value_name = "USER")]
    pub exec_default_user: Option<String>,

    /// The uids given to exec tasks one each, `FIRST-LAST`; they must be
    /// free on the robot (uids of /etc/passwd are skipped). Default:
    /// 70000-79999.
    #[arg(long, env = "K8S4R_TASK_UIDS", value_name = "FIRST-LAST")]
    pub task_uids: Option<String>,

    /// Most tasks the robot holds at once; more are refused (reason
    /// OverCapacity). Default: 64.
    #[arg(long, env = "K8S4R_MAX_TASKS", value_name = "N")]
    pub max_tasks: Option<usize>,

    /// Processes (and threads) one task may have: its cgroup's pids.max,
    /// RLIMIT_NPROC of its own uid without cgroups; 0 for no limit.
    /// Default: 4096.
    #[arg(long, env = "K8S4R_TASK_PIDS_MAX", value_name = "N")]
    pub task_pids_max: Option<u64>,

    /// Disk for all task directories together (downloads, files, logs), as
    /// a size (`2Gi`) or a share of the state dir's file system (`50%`);
    /// finished tasks' directories go first when it is exceeded, then the
    /// largest task is stopped. Default: 50%.
    #[arg(long, env = "K8S4R_DISK_BUDGET", value_name = "SIZE")]
    #[serde(default, deserialize_with = "de_disk_size")]
    pub disk_budget: Option<DiskSize>,

    /// Disk kept free for the agent's own records (outbox, journal): held
    /// as a file, released when the disk fills up anyway. Default: 32Mi,
    /// at most 5% of the file system.
    #[arg(long, env = "K8S4R_DISK_RESERVE", value_name = "SIZE")]
    #[serde(default, deserialize_with = "de_disk_size")]
    pub disk_reserve: Option<DiskSize>,

    /// The cgroup v2 directory under which task cgroups are made. Default:
    /// the agent's own cgroup (the subtree systemd's Delegate=yes hands it;
    /// the agent moves itself into a leaf of it); without a usable cgroup,
    /// tasks run without cgroup limits and the log says why.
    #[arg(long, env = "K8S4R_CGROUP_ROOT", value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,

    /// A JSON file of the robot's own state ("facts": `{"battery": 80,
    /// "docked": true}`), written by the robot's software; re-read as soon
    /// as it changes (inotify). Tasks' `when` conditions read it. Default:
    /// none.
    #[arg(long, env = "K8S4R_FACTS_FILE", value_name = "FILE")]
    pub facts_file: Option<PathBuf>,

    /// A program (no arguments: wrap them in a script) that prints the
    /// robot's facts as a JSON object, run every facts_interval; its facts
    /// win over the file's. Default: none.
    #[arg(long, env = "K8S4R_FACTS_COMMAND", value_name = "PROGRAM")]
    pub facts_command: Option<PathBuf>,

    /// How often the facts command runs, and the file is read again even
    /// without a change. Default: 10s.
    #[arg(long, env = "K8S4R_FACTS_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    pub facts_interval: Option<Duration>,

    /// A minisign public key (the base64 line of a `minisign.pub`, as
    /// `k8s4r sign-agent --generate` prints it) that may sign upgrades of
    /// this agent; repeat the flag or separate with commas for several
    /// (any one of them signs). In the file: a list. Default: none, and
    /// upgrades are refused unless allow_unsigned_upgrades is true.
    #[arg(
        long = "upgrade-public-key",
        env = "K8S4R_UPGRADE_PUBLIC_KEYS",
        value_name = "KEY",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub upgrade_public_keys: Vec<String>,

    /// Accept upgrades of this agent that carry no signature when no key
    /// is pinned (their sha256 is still checked, and their version and
    /// architecture). Default: false.
    #[arg(long, env = "K8S4R_ALLOW_UNSIGNED_UPGRADES", value_name = "BOOL")]
    pub allow_unsigned_upgrades: Option<bool>,

    /// Which sessions from the cluster (`k8s4r exec`, `port-forward`,
    /// `cp`) this robot takes: `off`, `tasks` (inside running tasks, as
    /// the task runs) or `robot` (also on the robot itself, as
    /// session_user, to forward_ports). Default: tasks.
    #[arg(long, env = "K8S4R_SESSIONS", value_name = "off|tasks|robot")]
    pub sessions: Option<String>,

    /// The user sessions on the robot itself run as (with sessions =
    /// "robot"); none refuses them. Root only if named here.
    #[arg(long, env = "K8S4R_SESSION_USER", value_name = "USER")]
    pub session_user: Option<String>,

    /// Ports on the robot's loopback a robot port-forward may reach, as
    /// `22,8000-8100` (in the file: the same text). Default: none.
    #[arg(long, env = "K8S4R_FORWARD_PORTS", value_name = "PORTS")]
    pub forward_ports: Option<String>,

    /// Sessions open at once. Default: 8.
    #[arg(long, env = "K8S4R_MAX_SESSIONS", value_name = "N")]
    pub max_sessions: Option<usize>,

    /// Bytes a second all sessions together send, at most; 0 for no limit
    /// beyond flow control. Default: 8388608 (8 MiB).
    #[arg(long, env = "K8S4R_SESSION_BYTES_PER_SECOND", value_name = "BYTES")]
    pub session_bytes_per_second: Option<u64>,

    /// The largest file `k8s4r cp` moves to or from this robot. Default:
    /// 268435456 (256 MiB).
    #[arg(long, env = "K8S4R_MAX_COPY_BYTES", value_name = "BYTES")]
    pub max_copy_bytes: Option<u64>,

    /// Bytes a second all task output uploads together send, at most; 0
    /// for no limit. Keep it below the link's uplink so that heartbeats
    /// and statuses are not queued behind uploads. Default: 1048576 (1
    /// MiB).
    #[arg(long, env = "K8S4R_UPLOAD_BYTES_PER_SECOND", value_name = "BYTES")]
    pub upload_bytes_per_second: Option<u64>,

    /// Bytes of task outputs that may wait for their upload on this robot.
    /// Default: 2147483648 (2 GiB).
    #[arg(long, env = "K8S4R_OUTPUTS_QUOTA_BYTES", value_name = "BYTES")]
    pub outputs_quota_bytes: Option<u64>,

    /// What a full outputs quota does to a new output: `refuse` it (the
    /// default) or `dropOldest` (drop the oldest waiting ones until it
    /// fits). Either way the Task lists the dropped file and why, and an
    /// Event says so.
    #[arg(long, env = "K8S4R_OUTPUTS_WHEN_FULL", value_name = "POLICY")]
    pub outputs_when_full: Option<String>,

    /// Log format. Default: text.
    #[arg(long, env = "K8S4R_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,

    /// Log filter (RUST_LOG syntax), e.g. `info` or `k8s4r_agent=debug`.
    /// Default: RUST_LOG, else info. (`--log-level`, and `log_level` in the
    /// config file, are older names.)
    #[arg(long, alias = "log-level", env = "K8S4R_LOG", value_name = "FILTER")]
    #[serde(alias = "log_level")]
    pub log: Option<String>,
}

impl Settings {
    /// These settings, with `file`'s filling what is unset here.
    pub fn over(self, file: Settings) -> Settings {
        // Per-key label merge: the file's keys first, then ours replace them.
        let mut labels = file.labels;
        labels.extend(self.labels);
        // The token and its file are one setting: either given here
        // replaces both of the file's (else both would be set).
        let (token, token_file) = if self.token.is_some() || self.token_file.is_some() {
            (self.token, self.token_file)
        } else {
            (file.token, file.token_file)
        };
        Settings {
            robot_id: self.robot_id.or(file.robot_id),
            token,
            token_file,
            broker_url: self.broker_url.or(file.broker_url),
            ca_file: self.ca_file.or(file.ca_file),
            client_cert: self.client_cert.or(file.client_cert),
            client_key: self.client_key.or(file.client_key),
            username: self.username.or(file.username),
            password: self.password.or(file.password),
            keep_alive: self.keep_alive.or(file.keep_alive),
            connect_timeout: self.connect_timeout.or(file.connect_timeout),
            topic_prefix: self.topic_prefix.or(file.topic_prefix),
            state_dir: self.state_dir.or(file.state_dir),
            heartbeat_interval: self.heartbeat_interval.or(file.heartbeat_interval),
            reconnect_min: self.reconnect_min.or(file.reconnect_min),
            reconnect_max: self.reconnect_max.or(file.reconnect_max),
            register_retry_min: self.register_retry_min.or(file.register_retry_min),
            register_retry_max: self.register_retry_max.or(file.register_retry_max),
            outbox_max_entries: self.outbox_max_entries.or(file.outbox_max_entries),
            shutdown_flush_timeout: self.shutdown_flush_timeout.or(file.shutdown_flush_timeout),
            status_hold: self.status_hold.or(file.status_hold),
            labels,
            log_max_bytes: self.log_max_bytes.or(file.log_max_bytes),
            log_max_files: self.log_max_files.or(file.log_max_files),
            output_tail_bytes: self.output_tail_bytes.or(file.output_tail_bytes),
            output_tail_every: self.output_tail_every.or(file.output_tail_every),
            artifact_max_bytes: self.artifact_max_bytes.or(file.artifact_max_bytes),
            artifact_timeout: self.artifact_timeout.or(file.artifact_timeout),
            artifact_retries: self.artifact_retries.or(file.artifact_retries),
            raw_exec: self.raw_exec.or(file.raw_exec),
            allow_root: self.allow_root.or(file.allow_root),
            podman: self.podman.or(file.podman),
            podman_program: self.podman_program.or(file.podman_program),
            podman_args: if self.podman_args.is_empty() {
                file.podman_args
            } else {
                self.podman_args
            },
            podman_devices: if self.podman_devices.is_empty() {
                file.podman_devices
            } else {
                self.podman_devices
            },
            podman_tls_verify: self.podman_tls_verify.or(file.podman_tls_verify),
            podman_authfile: self.podman_authfile.or(file.podman_authfile),
            podman_pull_timeout: self.podman_pull_timeout.or(file.podman_pull_timeout),
            podman_keep_images: self.podman_keep_images.or(file.podman_keep_images),
            podman_image_budget: self.podman_image_budget.or(file.podman_image_budget),
            allowed_users: if self.allowed_users.is_empty() {
                file.allowed_users
            } else {
                self.allowed_users
            },
            allowed_groups: if self.allowed_groups.is_empty() {
                file.allowed_groups
            } else {
                self.allowed_groups
            },
            exec_default_user: self.exec_default_user.or(file.exec_default_user),
            task_uids: self.task_uids.or(file.task_uids),
            max_tasks: self.max_tasks.or(file.max_tasks),
            task_pids_max: self.task_pids_max.or(file.task_pids_max),
            disk_budget: self.disk_budget.or(file.disk_budget),
            disk_reserve: self.disk_reserve.or(file.disk_reserve),
            cgroup_root: self.cgroup_root.or(file.cgroup_root),
            facts_file: self.facts_file.or(file.facts_file),
            facts_command: self.facts_command.or(file.facts_command),
            facts_interval: self.facts_interval.or(file.facts_interval),
            upgrade_public_keys: if self.upgrade_public_keys.is_empty() {
                file.upgrade_public_keys
            } else {
                self.upgrade_public_keys
            },
            allow_unsigned_upgrades: self.allow_unsigned_upgrades.or(file.allow_unsigned_upgrades),
            sessions: self.sessions.or(file.sessions),
            session_user: self.session_user.or(file.session_user),
            forward_ports: self.forward_ports.or(file.forward_ports),
            max_sessions: self.max_sessions.or(file.max_sessions),
            session_bytes_per_second: self.session_bytes_per_second.or(file.session_bytes_per_second),
            max_copy_bytes: self.max_copy_bytes.or(file.max_copy_bytes),
            upload_bytes_per_second: self.upload_bytes_per_second.or(file.upload_bytes_per_second),
            outputs_quota_bytes: self.outputs_quota_bytes.or(file.outputs_quota_bytes),
            outputs_when_full: self.outputs_when_full.or(file.outputs_when_full),
            log_format: self.log_format.or(file.log_format),
            log: self.log.or(file.log),
        }
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map(Some).map_err(serde::de::Error::custom)
}

fn de_disk_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DiskSize>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

fn de_labels<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let map = BTreeMap::<String, String>::deserialize(d)?;
    Ok(map.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}
