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
use crate::supervisor::DiskSize;
use crate::upgrade::verify::Trust;
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
    assert_eq!(settings.lines().count(), 13, "{settings}");
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
    assert!(matches!(config.upgrade_trust, Trust::Keys(keys) if keys.len() == 1));
}

#[test]
fn upgrades_are_refused_until_a_key_is_pinned_or_unsigned_ones_allowed() {
    let resolve = |toml: &str| {
        Config::resolve(parse_file(Path::new("a.toml"), &format!("robot_id = \"rb1\"\n{toml}")).unwrap())
    };
    assert_eq!(resolve("").unwrap().upgrade_trust, Trust::Nothing);
    assert_eq!(
        resolve("allow_unsigned_upgrades = true").unwrap().upgrade_trust,
        Trust::UnsignedAllowed
    );
    let bad = resolve("upgrade_public_keys = [\"RWQnot-base64\"]").unwrap_err();
    assert!(bad.to_string().contains("upgrade_public_keys"), "{bad}");
    let key = "RWTvuqghya2V+tDQPYdARaKU/Zkjf8s4dlrda6p1DVqWiz8yuk0hBjDu";
    let both = resolve(&format!(
        "upgrade_public_keys = [\"{key}\"]\nallow_unsigned_upgrades = true"
    ))
    .unwrap_err();
    assert!(both.to_string().contains("allow_unsigned_upgrades"), "{both}");
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
    assert_eq!(c.status_hold, Duration::from_secs(1));
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
status_hold = "0s"
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
    assert_eq!(c.status_hold, Duration::ZERO, "0 sends a start at once");
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
                status_hold: Some(Duration::from_secs(11)),
                ..settings("rb1")
            },
            "status_hold",
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
