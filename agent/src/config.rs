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
use k8s4r_api::validation::{
    robot_id_from_hostname, validate_label_key, validate_label_value, validate_robot_id,
};
pub use k8s4r_mqtt::TlsFiles;
use k8s4r_mqtt::{BrokerUrl, TlsError};

pub use k8s4r_api::logging::LogFormat;

use crate::supervisor::{Policy, SupervisorConfig};
use crate::upgrade::verify::Trust;

mod settings;
#[cfg(test)]
mod tests;

pub use settings::Settings;

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

    /// Stop what is left of the tasks an agent that ended left running,
    /// except services with no stopAfter, and exit (the unit's
    /// ExecStopPost: systemd itself leaves task processes alone). Run by
    /// systemd while it restarts the unit, it leaves them all for the next
    /// agent to re-adopt.
    #[arg(long)]
    pub stop_left_tasks: bool,

    /// Before a start (the unit's ExecStartPre, run by the confirmed
    /// binary): count the starts of an agent on trial after an upgrade,
    /// switch back to the confirmed binary when it keeps exiting or was
    /// not confirmed in time, and exit 0.
    #[arg(long, conflicts_with_all = ["check_config", "stop_left_tasks"])]
    pub boot_check: bool,

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
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
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
    /// How long a task's start waits to be reported (merged with an end
    /// that comes within it).
    pub status_hold: Duration,
    /// Labels reported at registration.
    pub labels: BTreeMap<String, String>,
    /// The supervisor's settings: the configured ones over its defaults,
    /// with the same state directory.
    pub supervisor: SupervisorConfig,
    /// Where the robot's facts come from, if anywhere.
    pub facts: Option<crate::facts::FactsSource>,
    /// Who may sign upgrades of this agent.
    pub upgrade_trust: Trust,
    /// Which sessions from the cluster the robot takes.
    pub reach: crate::reach::ReachConfig,
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
        let upgrade_trust = resolve_upgrade_trust(&s)?;
        let mut reach = resolve_reach(&s)?;
        reach.images = supervisor.podman.as_ref().map(|podman| crate::reach::ImageLoads {
            dir: state_dir.join("images"),
            marks: podman.image_marks_dir(),
            podman: std::iter::once(podman.program.display().to_string())
                .chain(podman.global_args.iter().cloned())
                .collect(),
        });
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
            status_hold: status_hold(s.status_hold)?,
            labels,
            supervisor,
            facts,
            upgrade_trust,
            reach,
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

/// The keys pinned for upgrades, each checked to be a minisign public key,
/// or the explicit choice to accept unsigned upgrades (not both).
fn resolve_upgrade_trust(s: &Settings) -> Result<Trust, ConfigError> {
    let allow_unsigned = s.allow_unsigned_upgrades.unwrap_or(false);
    if s.upgrade_public_keys.is_empty() {
        return Ok(if allow_unsigned {
            Trust::UnsignedAllowed
        } else {
            Trust::Nothing
        });
    }
    if allow_unsigned {
        return Err(ConfigError::Conflict {
            first: "allow_unsigned_upgrades",
            second: "upgrade_public_keys",
            reason: "a pinned key means upgrades must be signed by it: leave allow_unsigned_upgrades \
                     off"
            .into(),
        });
    }
    for key in &s.upgrade_public_keys {
        if let Err(e) = minisign_verify::PublicKey::from_base64(key.trim()) {
            return Err(ConfigError::Invalid {
                key: "upgrade_public_keys",
                reason: format!("`{key}` is not a minisign public key ({e:?})"),
            });
        }
    }
    Ok(Trust::Keys(
        s.upgrade_public_keys
            .iter()
            .map(|k| k.trim().to_owned())
            .collect(),
    ))
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
    let connect_timeout = s.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&connect_timeout) {
        return Err(ConfigError::Invalid {
            key: "connect_timeout",
            reason: "must be from 1s to 5m".into(),
        });
    }
    Ok(BrokerConfig {
        host,
        port,
        tls,
        credentials,
        keep_alive,
        connect_timeout,
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
        output_tail_every: s.output_tail_every.unwrap_or(defaults.output_tail_every),
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
        leave_tasks_running: defaults.leave_tasks_running,
        shim_program: defaults.shim_program,
        outputs: resolve_outputs(s)?,
        podman: resolve_podman(s, state_dir)?,
        image_keep: s.podman_keep_images.unwrap_or(defaults.image_keep),
        image_budget: s.podman_image_budget.unwrap_or(defaults.image_budget),
    })
}

/// The robot's podman settings, when it offers the driver.
fn resolve_podman(
    s: &Settings,
    state_dir: &Path,
) -> Result<Option<k8s4r_drivers::PodmanConfig>, ConfigError> {
    if !s.podman.unwrap_or(false) {
        return Ok(None);
    }
    let defaults = k8s4r_drivers::PodmanConfig::default();
    for device in &s.podman_devices {
        k8s4r_api::container::check_device(device).map_err(|reason| ConfigError::Invalid {
            key: "podman_devices",
            reason,
        })?;
    }
    Ok(Some(k8s4r_drivers::PodmanConfig {
        program: s.podman_program.clone().unwrap_or(defaults.program),
        global_args: s.podman_args.clone(),
        tls_verify: s.podman_tls_verify.unwrap_or(defaults.tls_verify),
        authfile: s.podman_authfile.clone(),
        pull_timeout: s.podman_pull_timeout.unwrap_or(defaults.pull_timeout),
        allowed_devices: s.podman_devices.clone(),
        run_dir: state_dir.join("podman"),
        pids_max: match s.task_pids_max {
            Some(0) => None,
            Some(n) => Some(n),
            None => defaults.pids_max,
        },
    }))
}

/// The robot's settings for task outputs.
fn resolve_outputs(s: &Settings) -> Result<crate::outputs::OutputsConfig, ConfigError> {
    let defaults = crate::outputs::OutputsConfig::default();
    let when_full = match &s.outputs_when_full {
        Some(text) => text.parse().map_err(|reason| ConfigError::Invalid {
            key: "outputs_when_full",
            reason,
        })?,
        None => defaults.when_full,
    };
    Ok(crate::outputs::OutputsConfig {
        quota_bytes: s.outputs_quota_bytes.unwrap_or(defaults.quota_bytes),
        when_full,
        bytes_per_second: s.upload_bytes_per_second.unwrap_or(defaults.bytes_per_second),
        part_bytes: defaults.part_bytes,
    })
}

/// The robot's settings for sessions from the cluster.
fn resolve_reach(s: &Settings) -> Result<crate::reach::ReachConfig, ConfigError> {
    let defaults = crate::reach::ReachConfig::default();
    let mode = match &s.sessions {
        Some(text) => text.parse().map_err(|reason| ConfigError::Invalid {
            key: "sessions",
            reason,
        })?,
        None => defaults.mode,
    };
    if let Some(user) = &s.session_user {
        k8s4r_api::validation::validate_account_name(user).map_err(|reason| ConfigError::Invalid {
            key: "session_user",
            reason,
        })?;
    }
    let ports = match &s.forward_ports {
        Some(text) => crate::reach::parse_ports(text).map_err(|reason| ConfigError::Invalid {
            key: "forward_ports",
            reason,
        })?,
        None => defaults.ports,
    };
    let max_sessions = match s.max_sessions {
        Some(0) => {
            return Err(ConfigError::Invalid {
                key: "max_sessions",
                reason: "must be > 0 (sessions = \"off\" turns them off)".into(),
            })
        }
        Some(n) => n,
        None => defaults.max_sessions,
    };
    Ok(crate::reach::ReachConfig {
        mode,
        user: s.session_user.clone(),
        ports,
        max_sessions,
        bytes_per_second: s.session_bytes_per_second.unwrap_or(defaults.bytes_per_second),
        max_copy_bytes: s.max_copy_bytes.unwrap_or(defaults.max_copy_bytes),
        hangup_grace: defaults.hangup_grace,
        images: None,
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

/// How long a connection attempt (TCP, TLS and the broker's CONNACK) may
/// take before the agent gives it up and tries again, and how long a write
/// to the broker may stall. rumqttc's own default is 5 s; Paho's is 30 s.
/// After a broker restart every robot of it reconnects at once, and a
/// robot that gives up before the busy broker's CONNACK comes leaves a
/// connection the broker took, whose last will then says the robot went
/// away (the 100,000-robot reconnect storm: BENCHMARKS.md).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The default of `status_hold`.
pub const DEFAULT_STATUS_HOLD: Duration = Duration::from_secs(1);

/// `status_hold`, at most 10 s: a start held longer would leave the cluster
/// showing the task not started for most of a dispatch deadline.
fn status_hold(value: Option<Duration>) -> Result<Duration, ConfigError> {
    match value {
        Some(d) if d > Duration::from_secs(10) => Err(ConfigError::Invalid {
            key: "status_hold",
            reason: format!("must be at most 10s, not {}s", d.as_secs_f64()),
        }),
        value => Ok(value.unwrap_or(DEFAULT_STATUS_HOLD)),
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
