//! The drivers on their own: real processes, no supervisor.

use std::os::fd::OwnedFd;
use std::path::Path;

use k8s4r_api::TaskTemplate;
use k8s4r_drivers::{Driver, DriverError, ExecDriver, Launch, Launched, RawExecDriver};
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
    let prepared = driver.prepare(template, dir).expect("prepare");
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
    let (launched, out, code) = run(&RawExecDriver, &template, dir.path()).await;
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
    let (_, out, code) = run(&ExecDriver::new("nobody"), &template, dir.path()).await;
    assert_eq!(code, 0);
    assert_eq!(out, "NoNewPrivs: 1\nclean yes\n");
}

#[test]
fn prepare_reports_bad_users_and_directories() {
    let dir = task_dir();
    let exec = ExecDriver::new("nobody");
    let mut template = sh("exec", "true");
    template.user = Some("no-such-user-k8s4r".to_owned());
    let err = exec.prepare(&template, dir.path()).unwrap_err();
    assert!(matches!(err, DriverError::UnknownUser { .. }), "{err}");

    let mut template = sh("raw_exec", "true");
    template.working_dir = Some("missing/sub".to_owned());
    let err = RawExecDriver.prepare(&template, dir.path()).unwrap_err();
    assert!(err.to_string().contains("missing/sub"), "{err}");
    assert!(!err.is_invalid_spec());
}

#[tokio::test]
async fn a_missing_command_is_reported_as_not_found() {
    let dir = task_dir();
    let template = TaskTemplate {
        driver: "raw_exec".to_owned(),
        command: "no-such-command-k8s4r".to_owned(),
        ..TaskTemplate::default()
    };
    let prepared = RawExecDriver.prepare(&template, dir.path()).unwrap();
    let null = || -> OwnedFd { std::fs::File::create("/dev/null").unwrap().into() };
    let err = RawExecDriver
        .start(Launch {
            template: &template,
            prepared: &prepared,
            extra_env: &[],
            stdout: null(),
            stderr: null(),
            cgroup: None,
        })
        .unwrap_err();
    assert!(matches!(err, DriverError::CommandNotFound { .. }), "{err}");
}
