//! The agent's configuration: a TOML file, clap flags and `K8S4R_*`
//! environment variables, in rising order of precedence.
//!
//! One struct, [`Settings`], is both the flag set and the file's schema, so
//! every flag `--foo-bar` is the file key `foo_bar` and the two cannot drift
//! apart. Every field is optional there; defaults are applied once, in
//! [`Config::resolve`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use k8s4r_api::parse_duration;
use k8s4r_api::validation::{
    robot_id_from_hostname, validate_label_key, validate_label_value, validate_robot_id,
};
pub use k8s4r_mqtt::TlsFiles;
use k8s4r_mqtt::{BrokerUrl, TlsError};
use serde::{Deserialize, Deserializer};

pub use k8s4r_api::logging::LogFormat;

use crate::supervisor::{DiskSize, Policy, SupervisorConfig};

/// Where the config file is read from when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/k8s4r/agent.toml";
/// Where the agent keeps its outbox and task state by default.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/k8s4r";
/// The broker when none is configured.
pub const DEFAULT_BROKER_URL: &str = "mqtt://localhost:1883";

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has a bad key or value; the reason
    /// carries the line and column.
    #[error("invalid config file {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and the offending text.
        reason: String,
    },
    /// A setting has a value the agent cannot use.
    #[error("invalid setting {key}: {reason}")]
    Invalid {
        /// The file key (the flag is the same with '-' for '_').
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Two settings that cannot hold together (on this machine): refused
    /// rather than one of them quietly not applied.
    #[error("settings {first} and {second} do not go together: {reason}")]
    Conflict {
        /// One setting's file key.
        first: &'static str,
        /// The other's.
        second: &'static str,
        /// Why, and what to do.
        reason: String,
    },
}

/// The k8s4r robot agent: registers the robot with the fleet over MQTT,
/// heartbeats, runs the tasks it is sent and reports their status, keeping
/// status updates in an on-disk outbox while the broker is unreachable.
///
/// Every setting can come from the TOML config file (key `foo_bar` for flag
/// `--foo-bar`), from an environment variable `K8S4R_FOO_BAR`, or from the
/// flag; the flag wins over the variable, which wins over the file.
#[derive(Debug, Parser)]
// A flag given twice takes its last value, so wrappers can append overrides.
#[command(name = "k8s4r-agent", version, about, long_about, args_override_self = true)]
pub struct Args {
    /// The TOML config file. When not given, /etc/k8s4r/agent.toml is read
    /// if it exists.
    #[arg(long, env = "K8S4R_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Read and check the configuration, print what it resolves to, and exit
    /// (0 when it is usable, 2 when not) without connecting.
    #[arg(long)]
    pub check_config: bool,

    /// Kill what is left of the tasks an agent that ended left running,
    /// except the services the next agent re-adopts, and exit (the unit's
    /// ExecStopPost: systemd itself leaves task processes alone).
    #[arg(long)]
    pub stop_left_tasks: bool,

    /// The settings, also accepted in the config file.
    #[command(flatten)]
    pub settings: Settings,
}

impl Args {
    /// Reads the config file and merges it under the flags.
    pub fn load(self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => Some(read_file(path)?),
            None => {
                let path = Path::new(DEFAULT_CONFIG_PATH);
                if path.exists() {
                    Some(read_file(path)?)
                } else {
                    None
                }
            }
        };
        let settings = match file {
            Some(file) => self.settings.over(file),
            None => self.settings,
        };
        Config::resolve(settings)
    }
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

/// Parses the text of a config file; `path` is only for the error.
pub fn parse_file(path: &Path, text: &str) -> Result<Settings, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        reason: e.to_string().trim_end().to_owned(),
    })
}

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
            topic_prefix: self.topic_prefix.or(file.topic_prefix),
            state_dir: self.state_dir.or(file.state_dir),
            heartbeat_interval: self.heartbeat_interval.or(file.heartbeat_interval),
            reconnect_min: self.reconnect_min.or(file.reconnect_min),
            reconnect_max: self.reconnect_max.or(file.reconnect_max),
            register_retry_min: self.register_retry_min.or(file.register_retry_min),
            register_retry_max: self.register_retry_max.or(file.register_retry_max),
            outbox_max_entries: self.outbox_max_entries.or(file.outbox_max_entries),
            shutdown_flush_timeout: self.shutdown_flush_timeout.or(file.shutdown_flush_timeout),
            labels,
            log_max_bytes: self.log_max_bytes.or(file.log_max_bytes),
            log_max_files: self.log_max_files.or(file.log_max_files),
            output_tail_bytes: self.output_tail_bytes.or(file.output_tail_bytes),
            artifact_max_bytes: self.artifact_max_bytes.or(file.artifact_max_bytes),
            artifact_timeout: self.artifact_timeout.or(file.artifact_timeout),
            artifact_retries: self.artifact_retries.or(file.artifact_retries),
            raw_exec: self.raw_exec.or(file.raw_exec),
            allow_root: self.allow_root.or(file.allow_root),
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

/// How to reach the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// TLS settings, for mqtts://.
    pub tls: Option<TlsFiles>,
    /// User name and password.
    pub credentials: Option<(String, String)>,
    /// MQTT keep-alive.
    pub keep_alive: Duration,
}

/// The resolved configuration, defaults applied and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The robot's id.
    pub robot_id: String,
    /// The bootstrap token.
    pub token: Option<String>,
    /// The file the token was read from, if it was.
    pub token_file: Option<PathBuf>,
    /// The broker.
    pub broker: BrokerConfig,
    /// The topic prefix.
    pub topic_prefix: String,
    /// The state directory.
    pub state_dir: PathBuf,
    /// Heartbeat period (before jitter).
    pub heartbeat_interval: Duration,
    /// First reconnect delay.
    pub reconnect_min: Duration,
    /// Reconnect delay cap.
    pub reconnect_max: Duration,
    /// First registration retry delay.
    pub register_retry_min: Duration,
    /// Registration retry delay cap.
    pub register_retry_max: Duration,
    /// Outbox size that triggers compaction.
    pub outbox_max_entries: usize,
    /// Outbox flush bound at shutdown.
    pub shutdown_flush_timeout: Duration,
    /// Labels reported at registration.
    pub labels: BTreeMap<String, String>,
    /// The supervisor's settings: the configured ones over its defaults,
    /// with the same state directory.
    pub supervisor: SupervisorConfig,
    /// Where the robot's facts come from, if anywhere.
    pub facts: Option<crate::facts::FactsSource>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter, if set.
    pub log: Option<String>,
}

impl Config {
    /// Applies defaults and checks every value, for an agent running as
    /// this process's user.
    pub fn resolve(s: Settings) -> Result<Config, ConfigError> {
        Self::resolve_as(s, nix::unistd::geteuid().is_root())
    }

    /// Applies defaults and checks every value, for an agent that runs as
    /// root or not (what some settings need depends on it).
    pub fn resolve_as(s: Settings, agent_is_root: bool) -> Result<Config, ConfigError> {
        let robot_id = resolve_robot_id(s.robot_id.clone())?;
        let broker = resolve_broker(&s, &robot_id)?;
        let topic_prefix = s
            .topic_prefix
            .clone()
            .unwrap_or_else(|| k8s4r_api::protocol::DEFAULT_PREFIX.to_owned());
        if topic_prefix.is_empty() || topic_prefix.contains(['+', '#']) {
            return Err(ConfigError::Invalid {
                key: "topic_prefix",
                reason: format!("{topic_prefix:?} must be non-empty and free of MQTT wildcards"),
            });
        }
        let labels = resolve_labels(&s.labels)?;
        let reconnect_min = positive("reconnect_min", s.reconnect_min, Duration::from_secs(1))?;
        let reconnect_max = positive("reconnect_max", s.reconnect_max, Duration::from_secs(60))?;
        let register_retry_min =
            positive("register_retry_min", s.register_retry_min, Duration::from_secs(5))?;
        let register_retry_max = positive(
            "register_retry_max",
            s.register_retry_max,
            Duration::from_secs(120),
        )?;
        let outbox_max_entries = s.outbox_max_entries.unwrap_or(1000);
        if outbox_max_entries == 0 {
            return Err(ConfigError::Invalid {
                key: "outbox_max_entries",
                reason: "must be > 0".into(),
            });
        }
        let state_dir = s
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let supervisor = resolve_supervisor(&s, &robot_id, &state_dir)?;
        check_raw_exec(&supervisor.policy, agent_is_root)?;
        let facts = resolve_facts(&s)?;
        let token = resolve_token(&s)?;
        Ok(Config {
            robot_id,
            token,
            token_file: s.token_file,
            broker,
            topic_prefix,
            state_dir,
            heartbeat_interval: positive(
                "heartbeat_interval",
                s.heartbeat_interval,
                Duration::from_secs(30),
            )?,
            reconnect_min,
            reconnect_max: reconnect_max.max(reconnect_min),
            register_retry_min,
            register_retry_max: register_retry_max.max(register_retry_min),
            outbox_max_entries,
            shutdown_flush_timeout: s.shutdown_flush_timeout.unwrap_or(Duration::from_secs(5)),
            labels,
            supervisor,
            facts,
            log_format: s.log_format.unwrap_or_default(),
            log: s.log,
        })
    }

    /// The status outbox: `state_dir/outbox`.
    pub fn outbox_dir(&self) -> PathBuf {
        self.state_dir.join("outbox")
    }

    /// Where the agent writes on this machine, in one line for a person:
    /// logged at start and printed by --check-config, so that a
    /// hand-started agent does not fill /var/lib/k8s4r unannounced.
    pub fn state_layout(&self) -> String {
        let s = &self.supervisor;
        let default = if self.state_dir.as_path() == Path::new(DEFAULT_STATE_DIR) {
            " (the default: set state_dir to choose another)"
        } else {
            ""
        };
        format!(
            "state dir {}{default}: outbox {}, journal {}, task directories {}, disk reserve {} ({})",
            self.state_dir.display(),
            self.outbox_dir().display(),
            s.journal_file().display(),
            s.tasks_dir().display(),
            s.reserve_file().display(),
            s.reserve_described()
        )
    }
}

/// raw_exec runs tasks as the agent's own user: under a root agent that is
/// root, which only allow_root permits. Refused here, at start and by
/// --check-config, rather than raw_exec quietly not being offered.
fn check_raw_exec(policy: &Policy, agent_is_root: bool) -> Result<(), ConfigError> {
    if policy.raw_exec && agent_is_root && !policy.allow_root {
        return Err(ConfigError::Conflict {
            first: "raw_exec",
            second: "allow_root",
            reason: "raw_exec = true runs tasks as the agent's user, root here: it needs allow_root = true \
                     as well (or run the agent as another user, or leave raw_exec off: exec tasks run \
                     under users of their own)"
                .into(),
        });
    }
    Ok(())
}

/// Largest token file read: a token is a few dozen bytes.
const TOKEN_FILE_MAX_BYTES: u64 = 4096;

/// The bootstrap token: as given, or read from token_file; not both.
fn resolve_token(s: &Settings) -> Result<Option<String>, ConfigError> {
    match (&s.token, &s.token_file) {
        (Some(_), Some(_)) => Err(ConfigError::Conflict {
            first: "token",
            second: "token_file",
            reason: "give the token one way: token_file (--token-file), or token (--token, which every \
                     user of the machine sees in `ps`)"
                .into(),
        }),
        (Some(token), None) => Ok(Some(token.clone())),
        (None, Some(path)) => read_token_file(path).map(Some),
        (None, None) => Ok(None),
    }
}

/// The token in `path`, without surrounding white space: a regular file
/// no one but its owner can read (whoever holds the token can register
/// robots).
fn read_token_file(path: &Path) -> Result<String, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let invalid = |reason: String| ConfigError::Invalid {
        key: "token_file",
        reason: format!("{}: {reason}", path.display()),
    };
    // Looked at before it is opened: opening a FIFO would wait for a writer.
    let meta = std::fs::metadata(path).map_err(|e| invalid(e.to_string()))?;
    if !meta.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    if meta.len() > TOKEN_FILE_MAX_BYTES {
        return Err(invalid(format!(
            "{} bytes: a token file holds the token alone (at most {TOKEN_FILE_MAX_BYTES} bytes)",
            meta.len()
        )));
    }
    token_file_mode_ok(meta.permissions().mode()).map_err(invalid)?;
    let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(invalid("empty".into()));
    }
    Ok(token.to_owned())
}

/// Whether a token file's mode keeps it to its owner; the error says what
/// to run.
fn token_file_mode_ok(mode: u32) -> Result<(), String> {
    if mode & 0o044 != 0 {
        return Err(format!(
            "readable by group or others (mode {:04o}): anyone who reads the token can register robots; \
             chmod 600 it",
            mode & 0o7777
        ));
    }
    Ok(())
}

/// Where the facts come from: a file, a command, or both.
fn resolve_facts(s: &Settings) -> Result<Option<crate::facts::FactsSource>, ConfigError> {
    let interval = positive("facts_interval", s.facts_interval, Duration::from_secs(10))?;
    if s.facts_file.is_none() && s.facts_command.is_none() {
        return Ok(None);
    }
    for (key, path) in [("facts_file", &s.facts_file), ("facts_command", &s.facts_command)] {
        if path.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err(ConfigError::Invalid {
                key,
                reason: "must be an absolute path".into(),
            });
        }
    }
    Ok(Some(crate::facts::FactsSource {
        file: s.facts_file.clone(),
        command: s.facts_command.clone(),
        interval,
    }))
}

/// The robot id as set, or the machine's, checked.
fn resolve_robot_id(set: Option<String>) -> Result<String, ConfigError> {
    let robot_id = match set {
        Some(id) => id,
        None => default_robot_id().ok_or(ConfigError::Invalid {
            key: "robot_id",
            reason: "not set, and neither /etc/machine-id nor the host name gives a usable id".into(),
        })?,
    };
    validate_robot_id(&robot_id).map_err(|reason| ConfigError::Invalid {
        key: "robot_id",
        reason,
    })?;
    Ok(robot_id)
}

/// Where the broker is, how to reach it (TLS files, credentials) and the
/// keep-alive.
fn resolve_broker(s: &Settings, robot_id: &str) -> Result<BrokerConfig, ConfigError> {
    let url = s.broker_url.as_deref().unwrap_or(DEFAULT_BROKER_URL);
    let parsed = BrokerUrl::parse(url).map_err(|e| ConfigError::Invalid {
        key: "broker_url",
        reason: e.to_string(),
    })?;
    let tls = TlsFiles::resolve(
        &parsed,
        s.ca_file.clone(),
        s.client_cert.clone(),
        s.client_key.clone(),
    )
    .map_err(|e| {
        let key = match &e {
            TlsError::Settings { key, .. } => key,
            _ => "ca_file",
        };
        ConfigError::Invalid {
            key,
            reason: e.to_string(),
        }
    })?;
    let BrokerUrl { host, port, .. } = parsed;
    let credentials = match (s.username.clone(), s.password.clone()) {
        (Some(u), p) => Some((u, p.unwrap_or_default())),
        // The broker's ACL (`pattern readwrite k8s4r/robots/%u/#`) wants
        // the robot id as the user name, so that is the default.
        (None, Some(p)) => Some((robot_id.to_owned(), p)),
        (None, None) => None,
    };
    let keep_alive = positive("keep_alive", s.keep_alive, Duration::from_secs(30))?;
    if keep_alive < Duration::from_secs(1) {
        return Err(ConfigError::Invalid {
            key: "keep_alive",
            reason: "must be at least 1s (MQTT counts it in seconds)".into(),
        });
    }
    Ok(BrokerConfig {
        host,
        port,
        tls,
        credentials,
        keep_alive,
    })
}

/// `key=value` labels, each key and value checked as Kubernetes checks them.
fn resolve_labels(items: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut labels = BTreeMap::new();
    for item in items {
        let (k, v) = item.split_once('=').ok_or_else(|| ConfigError::Invalid {
            key: "labels",
            reason: format!("{item:?} is not key=value"),
        })?;
        validate_label_key(k).map_err(|reason| ConfigError::Invalid {
            key: "labels",
            reason,
        })?;
        validate_label_value(v).map_err(|reason| ConfigError::Invalid {
            key: "labels",
            reason,
        })?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(labels)
}

/// The supervisor's settings: the configured ones over its defaults.
fn resolve_supervisor(
    s: &Settings,
    robot_id: &str,
    state_dir: &Path,
) -> Result<SupervisorConfig, ConfigError> {
    let defaults = SupervisorConfig::default();
    let max_tasks = match s.max_tasks {
        Some(0) => {
            return Err(ConfigError::Invalid {
                key: "max_tasks",
                reason: "must be > 0".into(),
            })
        }
        Some(n) => n,
        None => defaults.max_tasks,
    };
    Ok(SupervisorConfig {
        robot_id: robot_id.to_owned(),
        state_dir: state_dir.to_owned(),
        log_max_bytes: s.log_max_bytes.unwrap_or(defaults.log_max_bytes),
        log_max_files: s.log_max_files.unwrap_or(defaults.log_max_files),
        output_tail_bytes: s.output_tail_bytes.unwrap_or(defaults.output_tail_bytes),
        artifact_max_bytes: s.artifact_max_bytes.unwrap_or(defaults.artifact_max_bytes),
        artifact_timeout: s.artifact_timeout.unwrap_or(defaults.artifact_timeout),
        artifact_retries: s.artifact_retries.unwrap_or(defaults.artifact_retries),
        cgroup_root: s.cgroup_root.clone().or(defaults.cgroup_root),
        policy: Policy {
            raw_exec: s.raw_exec.unwrap_or(defaults.policy.raw_exec),
            allow_root: s.allow_root.unwrap_or(defaults.policy.allow_root),
            allowed_users: names("allowed_users", s.allowed_users.clone())?,
            allowed_groups: names("allowed_groups", s.allowed_groups.clone())?,
            default_user: s.exec_default_user.clone(),
        },
        task_uids: match &s.task_uids {
            Some(text) => parse_uid_range(text)?,
            None => defaults.task_uids,
        },
        max_tasks,
        task_pids_max: match s.task_pids_max {
            Some(0) => None,
            Some(n) => Some(n),
            None => defaults.task_pids_max,
        },
        disk_budget: s.disk_budget.unwrap_or(defaults.disk_budget),
        disk_reserve: s.disk_reserve.or(defaults.disk_reserve),
        reap_all_orphans: defaults.reap_all_orphans,
        leave_services_running: defaults.leave_services_running,
    })
}

/// User or group names, each checked.
fn names(key: &'static str, list: Vec<String>) -> Result<Vec<String>, ConfigError> {
    for name in &list {
        k8s4r_api::validation::validate_account_name(name)
            .map_err(|reason| ConfigError::Invalid { key, reason })?;
    }
    Ok(list)
}

/// `FIRST-LAST`, above the system's users.
fn parse_uid_range(text: &str) -> Result<std::ops::RangeInclusive<u32>, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        key: "task_uids",
        reason,
    };
    let (first, last) = text
        .split_once('-')
        .ok_or_else(|| invalid(format!("{text:?} is not FIRST-LAST")))?;
    let parse = |n: &str| {
        n.trim()
            .parse::<u32>()
            .map_err(|e| invalid(format!("{text:?}: {n:?} is not a uid: {e}")))
    };
    let (first, last) = (parse(first)?, parse(last)?);
    if first < 1000 || first > last || last == u32::MAX {
        return Err(invalid(format!(
            "{text:?} must be FIRST <= LAST, from 1000 (above the system users) and below 4294967295"
        )));
    }
    Ok(first..=last)
}

fn positive(key: &'static str, value: Option<Duration>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        Some(d) if d.is_zero() => Err(ConfigError::Invalid {
            key,
            reason: "must be > 0".into(),
        }),
        Some(d) => Ok(d),
        None => Ok(default),
    }
}

/// `robot-` and the first 12 hex digits of /etc/machine-id, else the host
/// name made into a valid id.
pub fn default_robot_id() -> Option<String> {
    let from_machine_id = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .and_then(|id| robot_id_from_machine_id(&id));
    from_machine_id.or_else(|| sysinfo::System::host_name().and_then(|h| robot_id_from_hostname(&h)))
}

/// `robot-<first 12 hex digits>` of a machine id, if it looks like one.
pub fn robot_id_from_machine_id(machine_id: &str) -> Option<String> {
    let id = machine_id.trim().to_ascii_lowercase();
    if id.len() < 12 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some(format!("robot-{}", &id[..12]))
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_shipped_example_config_is_valid() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../systemd/agent.toml.example"
        ));
        let text = std::fs::read_to_string(path).unwrap();
        let config = Config::resolve(parse_file(path, &text).unwrap()).unwrap();
        assert_eq!(config.broker.port, 8883);
        assert_eq!(config.labels.get("site").map(String::as_str), Some("lab"));
        let (user, _) = config.broker.credentials.expect("the example logs in");
        assert_eq!(user, config.robot_id, "the user name defaults to the robot id");
    }
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_examples_commented_task_settings_are_valid_too() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../systemd/agent.toml.example"
        ));
        let text = std::fs::read_to_string(path).unwrap();
        let (_, tail) = text.split_once("# What tasks may do here.").unwrap();
        let settings: String = tail
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ")
                    .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(settings.lines().count(), 12, "{settings}");
        let config =
            Config::resolve(parse_file(path, &format!("robot_id = \"rb1\"\n{settings}")).unwrap()).unwrap();
        let s = config.supervisor;
        assert!(!s.policy.raw_exec && !s.policy.allow_root);
        assert_eq!(s.policy.allowed_groups, ["dialout", "video", "gpio", "i2c"]);
        assert_eq!((s.max_tasks, s.task_pids_max), (64, Some(4096)));
        assert_eq!(
            (s.disk_budget, s.disk_reserve),
            (DiskSize::Percent(50), Some(DiskSize::Bytes(32 << 20)))
        );
        assert_eq!(s.task_uids, 70_000..=79_999);
        let facts = config.facts.expect("the example's facts settings");
        assert_eq!(facts.file.as_deref(), Some(Path::new("/run/robot/facts.json")));
        assert_eq!(facts.interval, Duration::from_secs(10));
    }

    #[test]
    fn task_settings_are_checked() {
        for (toml, key) in [
            ("task_uids = \"0-100\"", "task_uids"),
            ("task_uids = \"5000\"", "task_uids"),
            ("task_uids = \"9000-8000\"", "task_uids"),
            ("max_tasks = 0", "max_tasks"),
            ("allowed_groups = [\"a b\"]", "allowed_groups"),
            ("allowed_users = [\"-rf\"]", "allowed_users"),
        ] {
            let file = parse_file(Path::new("a.toml"), &format!("robot_id = \"rb1\"\n{toml}")).unwrap();
            match Config::resolve(file) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{toml}"),
                other => panic!("{toml}: {other:?}"),
            }
        }
        let err = parse_file(Path::new("a.toml"), "disk_budget = \"lots\"").unwrap_err();
        assert!(err.to_string().contains("lots"), "{err}");
        let args = Args::try_parse_from([
            "k8s4r-agent",
            "--robot-id",
            "rb1",
            "--raw-exec",
            "true",
            "--allowed-group",
            "dialout",
            "--allowed-group",
            "video",
            "--disk-budget",
            "2Gi",
            "--task-pids-max",
            "0",
        ])
        .unwrap();
        let s = Config::resolve_as(args.settings, false).unwrap().supervisor;
        assert!(s.policy.raw_exec);
        assert_eq!(s.policy.allowed_groups, ["dialout", "video"]);
        assert_eq!((s.disk_budget, s.task_pids_max), (DiskSize::Bytes(2 << 30), None));
    }

    #[test]
    fn raw_exec_under_a_root_agent_needs_allow_root() {
        let raw = Settings {
            raw_exec: Some(true),
            ..settings("rb1")
        };
        match Config::resolve_as(raw.clone(), true) {
            Err(e @ ConfigError::Conflict { .. }) => {
                let e = e.to_string();
                assert!(e.contains("raw_exec") && e.contains("allow_root = true"), "{e}");
                assert!(e.contains("root here"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let c = Config::resolve_as(raw.clone(), false).unwrap();
        assert!(
            c.supervisor.policy.raw_exec,
            "as another user raw_exec runs as that user"
        );
        let allowed = Settings {
            allow_root: Some(true),
            ..raw
        };
        assert!(
            Config::resolve_as(allowed, true)
                .unwrap()
                .supervisor
                .policy
                .raw_exec
        );
        assert!(
            Config::resolve_as(settings("rb1"), true).is_ok(),
            "raw_exec off: nothing to refuse"
        );
    }

    /// A token file in a fresh directory, with this text and mode.
    fn token_file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    fn with_token_file(path: &Path) -> Settings {
        Settings {
            token_file: Some(path.to_owned()),
            ..settings("rb1")
        }
    }

    #[test]
    fn the_token_is_read_from_a_private_file() {
        let (_dir, path) = token_file("  s3cret\n", 0o600);
        let c = Config::resolve_as(with_token_file(&path), false).unwrap();
        assert_eq!(c.token.as_deref(), Some("s3cret"));
        assert_eq!(c.token_file.as_deref(), Some(path.as_path()));

        let (_dir, open) = token_file("s3cret", 0o644);
        let e = Config::resolve_as(with_token_file(&open), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("token_file") && e.contains("0644") && e.contains("chmod 600"),
            "{e}"
        );
        let (_dir, empty) = token_file(" \n", 0o600);
        let e = Config::resolve_as(with_token_file(&empty), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
        let missing = path.with_file_name("nothing-here");
        let e = Config::resolve_as(with_token_file(&missing), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing-here"), "{e}");
        let dir = path.parent().unwrap();
        let e = Config::resolve_as(with_token_file(dir), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");

        assert!(token_file_mode_ok(0o100600).is_ok() && token_file_mode_ok(0o400).is_ok());
        assert!(token_file_mode_ok(0o640).is_err() && token_file_mode_ok(0o604).is_err());
    }

    #[test]
    fn a_token_is_given_one_way() {
        let (_dir, path) = token_file("s3cret", 0o600);
        let both = Settings {
            token: Some("other".into()),
            ..with_token_file(&path)
        };
        match Config::resolve_as(both, false) {
            Err(e @ ConfigError::Conflict { .. }) => {
                let e = e.to_string();
                assert!(e.contains("token_file") && e.contains("`ps`"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // A flag replaces the file's way of giving the token.
        let file = parse_file(Path::new("a.toml"), "robot_id = \"rb1\"\ntoken = \"in-file\"").unwrap();
        let merged = with_token_file(&path).over(file.clone());
        assert_eq!((merged.token, merged.token_file), (None, Some(path.clone())));
        let merged = Settings::default().over(file);
        assert_eq!(merged.token.as_deref(), Some("in-file"));
        let args = Args::try_parse_from(["k8s4r-agent", "--token-file", "/etc/k8s4r/token"]).unwrap();
        assert_eq!(args.settings.token_file, Some(PathBuf::from("/etc/k8s4r/token")));
    }

    #[test]
    fn the_state_layout_names_every_place_the_agent_writes() {
        let layout = Config::resolve_as(settings("rb1"), false).unwrap().state_layout();
        for part in [
            "/var/lib/k8s4r (the default",
            "/var/lib/k8s4r/outbox",
            "/var/lib/k8s4r/journal.jsonl",
            "/var/lib/k8s4r/tasks",
            "/var/lib/k8s4r/reserve (32.0 MiB, at most 5% of the file system)",
        ] {
            assert!(layout.contains(part), "{part}: {layout}");
        }
        let chosen = Settings {
            state_dir: Some("/srv/agent".into()),
            disk_reserve: Some(DiskSize::Percent(2)),
            ..settings("rb1")
        };
        let layout = Config::resolve_as(chosen, false).unwrap().state_layout();
        assert!(!layout.contains("default"), "{layout}");
        assert!(
            layout.contains("/srv/agent/reserve (2% of the file system)"),
            "{layout}"
        );
    }

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    fn settings(robot_id: &str) -> Settings {
        Settings {
            robot_id: Some(robot_id.into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply() {
        let c = Config::resolve(settings("rb1")).unwrap();
        assert_eq!(c.broker.host, "localhost");
        assert_eq!(c.broker.port, 1883);
        assert_eq!(c.broker.tls, None);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/k8s4r"));
        assert_eq!(c.topic_prefix, "k8s4r");
    }

    #[test]
    fn file_keys_parse_and_flags_win() {
        let file = parse_file(
            Path::new("agent.toml"),
            r#"
robot_id = "from-file"
broker_url = "mqtts://broker.example:9883"
ca_file = "/etc/k8s4r/ca.pem"
heartbeat_interval = "10s"
labels = { site = "lab", arm = "ur5" }
"#,
        )
        .unwrap();
        let flags = Settings {
            robot_id: Some("from-flag".into()),
            labels: vec!["site=field".into()],
            ..Default::default()
        };
        let c = Config::resolve(flags.over(file)).unwrap();
        assert_eq!(c.robot_id, "from-flag");
        assert_eq!(c.broker.port, 9883);
        assert_eq!(
            c.broker.tls.as_ref().unwrap().ca_file,
            PathBuf::from("/etc/k8s4r/ca.pem")
        );
        assert_eq!(c.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(c.labels["site"], "field");
        assert_eq!(c.labels["arm"], "ur5");
    }

    #[test]
    fn flags_parse_durations_and_the_last_one_wins() {
        let args = Args::try_parse_from([
            "k8s4r-agent",
            "--robot-id",
            "rb2",
            "--heartbeat-interval",
            "200ms",
        ])
        .unwrap();
        assert_eq!(args.settings.robot_id.as_deref(), Some("rb2"));
        assert_eq!(args.settings.heartbeat_interval, Some(Duration::from_millis(200)));
        assert!(Args::try_parse_from(["k8s4r-agent", "--heartbeat-interval", "5"]).is_err());
        let args = Args::try_parse_from(["k8s4r-agent", "--robot-id", "a", "--robot-id", "b"]).unwrap();
        assert_eq!(args.settings.robot_id.as_deref(), Some("b"), "the last flag wins");
    }

    #[test]
    fn supervisor_settings_override_the_supervisors_defaults() {
        let file = parse_file(
            Path::new("agent.toml"),
            r#"
robot_id = "rb1"
state_dir = "/srv/k8s4r"
log_max_bytes = 1000
artifact_timeout = "7s"
exec_default_user = "robot"
cgroup_root = "/sys/fs/cgroup/k8s4r"
"#,
        )
        .unwrap();
        let args = Args::try_parse_from([
            "k8s4r-agent",
            "--log-max-bytes",
            "2000",
            "--artifact-retries",
            "9",
        ])
        .unwrap();
        let config = Config::resolve(args.settings.over(file)).unwrap();
        let defaults = SupervisorConfig::default();
        let expected = SupervisorConfig {
            robot_id: "rb1".to_owned(),
            state_dir: PathBuf::from("/srv/k8s4r"),
            log_max_bytes: 2000,
            artifact_timeout: Duration::from_secs(7),
            artifact_retries: 9,
            cgroup_root: Some(PathBuf::from("/sys/fs/cgroup/k8s4r")),
            policy: Policy {
                default_user: Some("robot".to_owned()),
                ..defaults.policy.clone()
            },
            ..defaults.clone()
        };
        assert_eq!(config.supervisor, expected);

        let config = Config::resolve(settings("rb1")).unwrap();
        let expected = SupervisorConfig {
            robot_id: "rb1".to_owned(),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            ..defaults
        };
        assert_eq!(config.supervisor, expected);
    }

    #[test]
    fn bad_files_name_the_line() {
        let err = parse_file(
            Path::new("/etc/k8s4r/agent.toml"),
            "robot_id = \"rb1\"\nheartbeat_intervall = \"1s\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/etc/k8s4r/agent.toml"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("heartbeat_intervall"), "{err}");
        let err = parse_file(Path::new("a.toml"), "keep_alive = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1") && err.contains("soon"), "{err}");
        let err = parse_file(Path::new("a.toml"), "robot_id = ")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn bad_values_are_refused() {
        for (s, key) in [
            (settings("Robot_1"), "robot_id"),
            (
                Settings {
                    broker_url: Some("http://x".into()),
                    ..settings("rb1")
                },
                "broker_url",
            ),
            (
                Settings {
                    broker_url: Some("mqtts://x".into()),
                    ..settings("rb1")
                },
                "ca_file",
            ),
            (
                Settings {
                    client_cert: Some("c.pem".into()),
                    ..settings("rb1")
                },
                "client_cert",
            ),
            (
                Settings {
                    heartbeat_interval: Some(Duration::ZERO),
                    ..settings("rb1")
                },
                "heartbeat_interval",
            ),
            (
                Settings {
                    labels: vec!["novalue".into()],
                    ..settings("rb1")
                },
                "labels",
            ),
        ] {
            match Config::resolve(s) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    #[test]
    fn robot_ids_are_derived() {
        assert_eq!(
            robot_id_from_machine_id("0123456789abcdef0123456789abcdef\n").as_deref(),
            Some("robot-0123456789ab")
        );
        assert_eq!(robot_id_from_machine_id("short"), None);
    }
}
