//! The drivers on their own: real processes, no supervisor.

use std::os::fd::OwnedFd;
use std::path::Path;

use k8s4r_api::TaskTemplate;
use k8s4r_drivers::identity::{resolve, RunAs};
use k8s4r_drivers::{Driver, DriverError, ExecDriver, Identity, Launch, Launched, RawExecDriver};
use tokio::io::AsyncReadExt;

fn sh(driver: &str, script: &str) -> TaskTemplate {
    TaskTemplate {
        driver: driver.to_owned(),
        command: "/bin/sh".to_owned(),
        args: vec!["-c".to_owned(), script.to_owned()],
        ..TaskTemplate::default()
    }
}

/// Starts `template` and returns its stdout once it exited, and how.
async fn run(driver: &dyn Driver, template: &TaskTemplate, dir: &Path) -> (Launched, String, i32) {
    run_as(driver, template, dir, None).await
}

async fn run_as(
    driver: &dyn Driver,
    template: &TaskTemplate,
    dir: &Path,
    identity: Option<Identity>,
) -> (Launched, String, i32) {
    let prepared = driver.prepare(template, dir, identity).expect("prepare");
    let (read, write) = nix::unistd::pipe().expect("pipe");
    let stderr: OwnedFd = std::fs::File::create(dir.join("stderr")).unwrap().into();
    let mut launched = driver
        .start(Launch {
            template,
            prepared: &prepared,
            extra_env: &[("EXTRA".to_owned(), "yes".to_owned())],
            stdout: write,
            stderr,
            cgroup: None,
            shim: None,
            stdin: None,
            terminal: false,
            beside_task: false,
        })
        .expect("start");
    let status = launched.child.wait().await.unwrap();
    let mut out = String::new();
    let mut read = tokio::fs::File::from_std(std::fs::File::from(read));
    read.read_to_string(&mut out).await.unwrap();
    (launched, out, status.code().unwrap_or(-1))
}

fn task_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[tokio::test]
async fn raw_exec_leads_its_own_session_and_group() {
    let dir = task_dir();
    let template = sh(
        "raw_exec",
        "read -r pid comm state ppid pgrp sid rest < /proc/$$/stat; echo \"$$ $sid $pgrp $EXTRA\"; pwd",
    );
    let (launched, out, code) = run(&RawExecDriver::default(), &template, dir.path()).await;
    assert_eq!(code, 0);
    assert_eq!(launched.pgid, launched.pid as i32);
    let mut lines = out.lines();
    let ids: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(ids[0], launched.pid.to_string());
    assert_eq!(ids[1], ids[0], "session leader");
    assert_eq!(ids[2], ids[0], "group leader");
    assert_eq!(ids[3], "yes");
    assert_eq!(
        Path::new(lines.next().unwrap()),
        dir.path().canonicalize().unwrap()
    );
}

#[tokio::test]
async fn exec_sets_no_new_privs_and_cleans_the_environment() {
    let dir = task_dir();
    std::env::set_var("K8S4R_DRIVER_TEST_LEAK", "leaked");
    let template = sh(
        "exec",
        "grep NoNewPrivs /proc/self/status | tr -s '\\t' ' '; echo \"${K8S4R_DRIVER_TEST_LEAK:-clean} $EXTRA\"",
    );
    let (_, out, code) = run(&ExecDriver::new(), &template, dir.path()).await;
    assert_eq!(code, 0);
    assert_eq!(out, "NoNewPrivs: 1\nclean yes\n");
}

#[tokio::test]
async fn raw_exec_does_not_pass_on_the_agents_environment() {
    let dir = task_dir();
    std::env::set_var("K8S4R_PASSWORD", "hunter2");
    let mut template = sh("raw_exec", "env | sort");
    template.env.push(k8s4r_api::EnvVar {
        name: "DECLARED".to_owned(),
        value: "1".to_owned(),
        value_from: None,
    });
    let (_, out, code) = run(&RawExecDriver::default(), &template, dir.path()).await;
    assert_eq!(code, 0);
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    // What sh adds by itself (PWD, SHLVL, _) aside, only the base, the
    // agent's extra variable and the declared one.
    let unexpected: Vec<&&str> = names
        .iter()
        .filter(|n| {
            ![
                "PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "EXTRA", "DECLARED", "PWD", "SHLVL", "_",
            ]
            .contains(n)
        })
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?} in\n{out}");
    assert!(!out.contains("hunter2"));
}

#[tokio::test]
async fn exec_runs_as_the_identity_with_exactly_its_groups() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    let dir = task_dir();
    let identity = resolve(&RunAs::TaskUid(70_123), &["tty".to_owned()], false)
        .unwrap()
        .unwrap();
    let tty = nix::unistd::Group::from_name("tty")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    let template = sh(
        "exec",
        "id -u; id -g; id -G; echo \"$USER $HOME\"; touch mine && echo writable",
    );
    let (_, out, code) = run_as(&ExecDriver::new(), &template, dir.path(), Some(identity)).await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..3],
        ["70123", "70123", &format!("70123 {tty}")[..]],
        "{out}"
    );
    assert_eq!(lines[3], format!("k8s4r-70123 {}", dir.path().display()));
    assert_eq!(lines[4], "writable");
}

#[test]
fn prepare_keeps_the_working_directory_inside_the_task_directory() {
    let dir = task_dir();
    let raw = RawExecDriver::default();
    let mut template = sh("raw_exec", "true");
    template.working_dir = Some("missing/sub".to_owned());
    let err = raw.prepare(&template, dir.path(), None).unwrap_err();
    assert!(matches!(err, DriverError::MissingWorkingDir { .. }), "{err}");
    assert!(err.to_string().contains("missing/sub"), "{err}");
    assert!(!err.is_invalid_spec());

    for outside in ["/tmp", "../..", "sub/../../.."] {
        template.working_dir = Some(outside.to_owned());
        let err = raw.prepare(&template, dir.path(), None).unwrap_err();
        assert!(
            matches!(err, DriverError::WorkingDirOutside { .. }),
            "{outside}: {err}"
        );
        assert!(err.is_not_permitted());
    }
    // A symbolic link planted in the directory does not lead out of it.
    std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
    template.working_dir = Some("etc".to_owned());
    let err = raw.prepare(&template, dir.path(), None).unwrap_err();
    assert!(matches!(err, DriverError::WorkingDirOutside { .. }), "{err}");

    std::fs::create_dir(dir.path().join("inside")).unwrap();
    template.working_dir = Some("./inside".to_owned());
    let prepared = raw.prepare(&template, dir.path(), None).unwrap();
    assert_eq!(prepared.cwd, dir.path().canonicalize().unwrap().join("inside"));
}

#[tokio::test]
async fn a_missing_command_is_reported_as_not_found() {
    let dir = task_dir();
    let template = TaskTemplate {
        driver: "raw_exec".to_owned(),
        command: "no-such-command-k8s4r".to_owned(),
        ..TaskTemplate::default()
    };
    let raw = RawExecDriver::default();
    let prepared = raw.prepare(&template, dir.path(), None).unwrap();
    let null = || -> OwnedFd { std::fs::File::create("/dev/null").unwrap().into() };
    let err = raw
        .start(Launch {
            template: &template,
            prepared: &prepared,
            extra_env: &[],
            stdout: null(),
            stderr: null(),
            cgroup: None,
            shim: None,
            stdin: None,
            terminal: false,
            beside_task: false,
        })
        .unwrap_err();
    assert!(matches!(err, DriverError::CommandNotFound { .. }), "{err}");
}

#[tokio::test]
async fn tasks_take_the_ordinary_oom_score_whatever_the_agents() {
    // Lowering our own score needs CAP_SYS_RESOURCE (which systemd has when
    // it applies the unit's OOMScoreAdjust=).
    if std::fs::write("/proc/self/oom_score_adj", "-500").is_err() {
        eprintln!("skipped: cannot lower this process's OOM score here");
        return;
    }
    let dir = task_dir();
    let template = sh("raw_exec", "cat /proc/self/oom_score_adj");
    let (_, out, code) = run(&RawExecDriver::default(), &template, dir.path()).await;
    assert_eq!((code, out.as_str()), (0, "0\n"));
}
