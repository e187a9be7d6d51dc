//! The supervisor against real processes. No sleeps to wait for anything:
//! every wait polls a condition with a deadline. (`sleep 1000` is only ever
//! a workload.)

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use k8s4r_agent::supervisor::{
    self, Submit, SupervisorConfig, SupervisorError, SupervisorHandle, TaskEvent, TaskRequest,
};
use k8s4r_api::{EnvVar, TaskReason, TaskResources, TaskState, TaskTemplate};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc::UnboundedReceiver;

mod supervising;
use supervising::*;

// ------------------------------------------------------------------- exits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_zero_completes_with_logs_and_tail() {
    let mut h = Harness::new();
    let out = h
        .run(
            "exit-zero",
            sh("echo hello; echo oops >&2; echo \"$K8S4R_TASK_ATTEMPT\""),
        )
        .await;
    assert_eq!(out.state, TaskState::Completed);
    assert_eq!(
        (out.reason, out.exit_code, out.signal),
        (TaskReason::Completed, Some(0), None)
    );
    assert!(
        out.output_tail.contains("hello") && out.output_tail.contains("oops"),
        "{:?}",
        out.output_tail
    );
    let started = h.started("exit-zero").await;
    assert!(started > 1);
    h.handle.shutdown().await; // flushes the logs
    assert_eq!(h.log("exit-zero", "stdout.log"), "hello\n1\n");
    assert_eq!(h.log("exit-zero", "stderr.log"), "oops\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_rotate_and_the_tail_is_capped() {
    let mut h = Harness::with_config(|c| {
        c.log_max_bytes = 100;
        c.log_max_files = 3;
        c.output_tail_bytes = 16;
    });
    // 50 lines of 11 bytes: 550 bytes through files of 100, of which the
    // last three files keep 250. The task's logger rotates them as it
    // writes.
    let out = h
        .run(
            "rotate",
            sh("i=10; while [ $i -lt 60 ]; do echo \"line $i...\"; i=$((i+1)); done"),
        )
        .await;
    assert_eq!(out.reason, TaskReason::Completed);
    assert_eq!(out.output_tail, "8...\nline 59...\n");
    h.handle.shutdown().await;
    let all: String = (10..60).map(|i| format!("line {i}...\n")).collect();
    let kept = [
        h.log("rotate", "stdout.log.2"),
        h.log("rotate", "stdout.log.1"),
        h.log("rotate", "stdout.log"),
    ];
    assert_eq!(kept.iter().map(String::len).collect::<Vec<_>>(), [100, 100, 50]);
    assert_eq!(kept.concat(), all[all.len() - 250..]);
    let logs = h.dir.path().join("tasks/rotate-1/logs");
    assert!(!logs.join("stdout.log.3").exists());
    assert!(
        logs.join(".times/stdout.log").exists() && !logs.join(".times/stdout.log.3").exists(),
        "the time index rotates with its file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_zero_exit_is_an_error() {
    let mut h = Harness::new();
    let out = h.run("exit-three", sh("exit 3")).await;
    assert_eq!(
        (out.state, out.reason, out.exit_code),
        (TaskState::Failed, TaskReason::Error, Some(3))
    );
    assert_eq!(out.message, "exited with code 3");
}

/// The shim is a fenced task's last line of fencing: with the agent's
/// kept contact older than `stopAfter` plus the kill timeout (here a
/// minute old, as when no agent has run since), it SIGKILLs the command
/// itself, whether an agent is there to do it or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_task_whose_contact_ran_out_is_killed_by_its_shim() {
    let mut h = Harness::new();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
    let stale = Duration::from(now).saturating_sub(Duration::from_secs(60));
    let run = h.dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("contact"),
        k8s4r_drivers::shim::contact_line(boot_id.trim(), stale),
    )
    .unwrap();
    let mut req = request("fenced", 1, task("sleep", &["1000"]).with_kill_timeout("1s"));
    req.stop_after = Some(Duration::from_secs(1));
    let started = std::time::Instant::now();
    assert_eq!(h.handle.submit(req).await.unwrap(), Submit::Accepted);
    let out = h.finished("fenced").await;
    assert_eq!(
        (out.signal, out.reason),
        (Some(9), TaskReason::Signaled),
        "{}",
        out.message
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_by_a_signal_is_signaled() {
    let mut h = Harness::new();
    let out = h.run("signaled", sh("kill -USR1 $$; sleep 1000")).await;
    assert_eq!((out.state, out.reason), (TaskState::Failed, TaskReason::Signaled));
    assert_eq!((out.exit_code, out.signal), (Some(128 + 10), Some(10)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_args_and_cwd_reach_the_process() {
    let mut h = Harness::new();
    let mut spec = task("/bin/sh", &["-c", "echo \"$GREETING $0\"; pwd", "arg0"]).with_cwd(".");
    spec.env.push(EnvVar {
        name: "GREETING".to_owned(),
        value: "hi".to_owned(),
        value_from: None,
    });
    let out = h.run("env-args", spec).await;
    let work = h.dir.path().canonicalize().unwrap().join("tasks/env-args-1/work");
    assert_eq!(out.output_tail, format!("hi arg0\n{}\n", work.display()));
}

/// The task's environment (an `LD_PRELOAD` of its choosing included)
/// reaches its command, never its shim, which runs as the agent's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tasks_environment_reaches_its_command_and_not_its_root_shim() {
    let mut h = Harness::new();
    let mut spec = task("sleep", &["1000"]);
    spec.env.push(EnvVar {
        name: "LD_PRELOAD".to_owned(),
        value: "/nonexistent/evil.so".to_owned(),
        value_from: None,
    });
    assert_eq!(
        h.handle.submit(request("env-shim", 1, spec)).await.unwrap(),
        Submit::Accepted
    );
    let pid = h.started("env-shim").await;
    let environ = |pid: u32| std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let has_preload = |env: &[u8]| env.split(|b| *b == 0).any(|v| v.starts_with(b"LD_PRELOAD="));
    assert!(has_preload(&environ(pid)), "the command lacks its environment");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let shim: u32 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let shim_cmdline = std::fs::read(format!("/proc/{shim}/cmdline")).unwrap();
    assert!(
        shim_cmdline.split(|b| *b == 0).any(|a| a == b"--task-shim"),
        "{shim} is not the shim"
    );
    assert!(
        !has_preload(&environ(shim)),
        "the shim got the task's environment"
    );
    h.handle.cancel("env-shim", Some(1), "done".to_owned()).await;
    h.finished("env-shim").await;
}

// ----------------------------------------------------------------- timeouts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_sigterm_obeyed_is_143() {
    let mut h = Harness::new();
    let out = h
        .run("timeout-term", task("sleep", &["1000"]).with_timeout("300ms"))
        .await;
    assert_eq!((out.state, out.reason), (TaskState::Failed, TaskReason::Timeout));
    assert_eq!((out.exit_code, out.signal), (Some(143), Some(15)));
    let took = elapsed(&out);
    assert!(
        took >= Duration::from_millis(295) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_sigterm_ignored_is_sigkilled_after_kill_timeout() {
    let mut h = Harness::new();
    let spec = sh("trap '' TERM; sleep 1000")
        .with_timeout("200ms")
        .with_kill_timeout("400ms");
    let out = h.run("timeout-kill", spec).await;
    assert_eq!((out.state, out.reason), (TaskState::Failed, TaskReason::Timeout));
    assert_eq!((out.exit_code, out.signal), (Some(137), Some(9)));
    let took = elapsed(&out);
    assert!(
        took >= Duration::from_millis(595) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(out.message.contains("kill timeout of 400ms"), "{}", out.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_zero_after_sigterm_still_times_out() {
    let mut h = Harness::new();
    let spec = sh("trap 'exit 0' TERM; while :; do sleep 0.05; done").with_timeout("200ms");
    let out = h.run("timeout-clean", spec).await;
    assert_eq!((out.reason, out.exit_code), (TaskReason::Timeout, Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grandchildren_do_not_survive_and_are_reaped() {
    let mut h = Harness::new();
    h.submit(
        "grandchildren",
        sh("sleep 1000 & sleep 1000").with_timeout("300ms"),
    )
    .await;
    let pgid = h.started("grandchildren").await;
    poll_until("both sleeps run", || group_members(pgid, false).len() >= 2).await;
    let out = h.finished("grandchildren").await;
    assert_eq!(out.reason, TaskReason::Timeout);
    // Nothing left: not running, and not even a zombie (the agent is the
    // subreaper of the orphaned background sleep and reaps it).
    poll_until("the group is gone", || group_members(pgid, true).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_task_leaves_no_background_process() {
    let mut h = Harness::new();
    h.submit("leftover", sh("sleep 1000 & echo started")).await;
    let pgid = h.started("leftover").await;
    let out = h.finished("leftover").await;
    assert_eq!(out.reason, TaskReason::Completed);
    poll_until("the background sleep is gone", || {
        group_members(pgid, true).is_empty()
    })
    .await;
}

/// Processes that escape their task's process group, each ignoring
/// SIGTERM and writing its pid to `pids`: a child that starts a session of
/// its own (found as the leader's child), and a double fork whose middle
/// process exits at once (the orphan comes to the agent, a subreaper, and
/// its environment names the task).
const ESCAPE: &str = r#"
setsid sh -c 'echo $$ >> pids; trap "" TERM HUP; while :; do sleep 1; done' &
sh -c 'setsid sh -c "echo \$\$ >> pids; trap \"\" TERM HUP; while :; do sleep 1; done" & exit 0'
"#;
/// The same double fork with the environment cleared: only a uid of the
/// task's own (exec) or its cgroup still tells it is the task's.
const ESCAPE_CLEARED: &str = r#"
sh -c 'setsid env -i /bin/sh -c "echo \$\$ >> pids; trap \"\" TERM HUP; while :; do /bin/sleep 1; done" & exit 0'
"#;

async fn escapees_are_killed(driver: &str, cgroups: bool) {
    let (script, escapees) = if driver == "exec" || cgroups {
        (format!("{ESCAPE}{ESCAPE_CLEARED}echo ready; sleep 1000"), 3)
    } else {
        (format!("{ESCAPE}echo ready; sleep 1000"), 2)
    };
    let no_cgroups = tempfile::tempdir().unwrap();
    let mut h = Harness::with_config(|c| {
        if !cgroups {
            // Not a cgroup directory: the agent runs without task cgroups.
            c.cgroup_root = Some(no_cgroups.path().to_path_buf());
        }
    });
    let uid = format!("escape-{driver}-{cgroups}");
    h.submit(
        &uid,
        sh(&script)
            .with_driver(driver)
            .with_timeout("1s")
            .with_kill_timeout("200ms"),
    )
    .await;
    h.started(&uid).await;
    let pids_file = h.dir.path().join(format!("tasks/{uid}-1/work/pids"));
    let read_pids = || -> Vec<i32> {
        std::fs::read_to_string(&pids_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    poll_until("the escapees run", || read_pids().len() == escapees).await;
    let out = h.finished(&uid).await;
    assert_eq!(out.reason, TaskReason::Timeout, "{}", out.message);
    for pid in read_pids() {
        // Gone, not even a zombie: killed and reaped.
        poll_until(
            &format!("escapee {pid} is gone ({driver}, cgroups {cgroups})"),
            || !Path::new(&format!("/proc/{pid}")).exists(),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_leave_the_group_are_killed_without_cgroups() {
    escapees_are_killed("raw_exec", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_processes_that_leave_everything_are_found_by_their_uid() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    escapees_are_killed("exec", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_leave_the_group_are_killed_with_cgroups() {
    if supervisor_has_no_cgroups() {
        eprintln!("skipped: no writable cgroup v2 here");
        return;
    }
    escapees_are_killed("raw_exec", true).await;
}

/// Whether this machine lacks a cgroup v2 the agent can write.
fn supervisor_has_no_cgroups() -> bool {
    k8s4r_drivers::Cgroups::detect(None).is_err()
}

// ------------------------------------------------------------------- cancel

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_terminates_the_task() {
    let mut h = Harness::new();
    h.submit("cancel-me", task("sleep", &["1000"])).await;
    let pgid = h.started("cancel-me").await;
    assert_eq!(h.handle.running().await.len(), 1);
    h.handle
        .cancel("cancel-me", None, "task deleted".to_owned())
        .await;
    let out = h.finished("cancel-me").await;
    assert_eq!(
        (out.state, out.reason, out.exit_code),
        (TaskState::Failed, TaskReason::Cancelled, Some(143))
    );
    assert!(out.message.contains("task deleted"), "{}", out.message);
    assert!(h.handle.running().await.is_empty());
    poll_until("the group is gone", || group_members(pgid, false).is_empty()).await;
    // Cancelling something unknown is a no-op.
    h.handle.cancel("nobody-knows", Some(4), "x".to_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_escalates_to_sigkill() {
    let mut h = Harness::new();
    h.submit(
        "cancel-stubborn",
        sh("trap '' TERM; echo ready; sleep 1000").with_kill_timeout("300ms"),
    )
    .await;
    h.started("cancel-stubborn").await;
    // Cancel only once the trap is set, or SIGTERM would simply win.
    let log = h.dir.path().join("tasks/cancel-stubborn-1/logs/stdout.log");
    poll_until("the trap is set", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("ready"))
    })
    .await;
    h.handle
        .cancel("cancel-stubborn", Some(1), "superseded".to_owned())
        .await;
    let out = h.finished("cancel-stubborn").await;
    assert_eq!(
        (out.reason, out.exit_code, out.signal),
        (TaskReason::Cancelled, Some(137), Some(9))
    );
    h.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_ignored() {
    let mut h = Harness::new();
    h.submit("dup", task("sleep", &["1000"])).await;
    let req = request("dup", 1, task("sleep", &["1000"]));
    assert_eq!(h.handle.submit(req.clone()).await.unwrap(), Submit::Duplicate);
    h.handle.cancel("dup", None, "done".to_owned()).await;
    h.finished("dup").await;
    assert_eq!(h.handle.submit(req.clone()).await.unwrap(), Submit::Duplicate);
    let next = TaskRequest { attempt: 2, ..req };
    assert_eq!(h.handle.submit(next).await.unwrap(), Submit::Accepted);
    h.handle.shutdown().await;
}

// --------------------------------------------------------------- many tasks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_tasks() {
    let mut h = Harness::with_config(|c| c.max_tasks = 200);
    // Each task blocks reading a FIFO the test holds open: all 200 really
    // run at the same time, and all end when the test closes it.
    let gate = h.dir.path().join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&gate)
        .unwrap();
    let script = format!(
        "exec 3< {}; echo \"out $K8S4R_TASK_NAME\"; read line <&3 || true",
        gate.display()
    );
    for i in 0..200 {
        h.submit(&format!("many-{i}"), sh(&script)).await;
    }
    for i in 0..200 {
        h.started(&format!("many-{i}")).await;
    }
    assert_eq!(h.handle.running().await.len(), 200);
    // Every task has the FIFO open (it says so after opening it).
    for i in 0..200 {
        let log = h.dir.path().join(format!("tasks/many-{i}-1/logs/stdout.log"));
        poll_until("the task holds the gate", || {
            std::fs::read_to_string(&log).is_ok_and(|s| s.starts_with("out"))
        })
        .await;
    }
    drop(holder);
    for i in 0..200 {
        let uid = format!("many-{i}");
        let out = h.finished(&uid).await;
        assert_eq!(out.reason, TaskReason::Completed, "{uid}: {}", out.message);
        assert_eq!(out.output_tail, format!("out {uid}\n"));
    }
    assert!(h.handle.running().await.is_empty());
    // Only the newest 100 finished task directories are kept.
    h.handle.shutdown().await;
    let kept = std::fs::read_dir(h.dir.path().join("tasks")).unwrap().count();
    assert_eq!(kept, 100);
    let finished: Vec<&str> = h
        .seen
        .iter()
        .filter_map(|e| match e {
            TaskEvent::Finished { uid, .. } => Some(uid.as_str()),
            TaskEvent::Started { .. } | TaskEvent::Output { .. } | TaskEvent::Reconfigured { .. } => None,
        })
        .collect();
    for uid in &finished[100..] {
        assert!(
            h.dir.path().join(format!("tasks/{uid}-1")).exists(),
            "{uid} is among the newest"
        );
    }
}

// ---------------------------------------------------------------- bad input

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_input_fails_its_task_and_the_agent_keeps_running() {
    let mut h = Harness::new();
    let cases: Vec<(&str, TaskTemplate, TaskReason, &str)> = vec![
        (
            "bad-driver",
            task("true", &[]).with_driver("docker"),
            TaskReason::InvalidSpec,
            "unknown driver",
        ),
        (
            "bad-command",
            task("no-such-command-k8s4r", &[]),
            TaskReason::StartFailed,
            "not found",
        ),
        (
            "bad-path",
            task("/nonexistent/bin/x", &[]),
            TaskReason::StartFailed,
            "not found",
        ),
        (
            "bad-user",
            task("true", &[])
                .with_driver("exec")
                .with_user("no-such-user-k8s4r"),
            TaskReason::NotPermitted,
            "does not allow user",
        ),
        (
            "bad-cwd",
            task("true", &[]).with_cwd("/nonexistent/dir"),
            TaskReason::InvalidSpec,
            "spec.workingDir",
        ),
        (
            "missing-cwd",
            task("true", &[]).with_cwd("not/there"),
            TaskReason::StartFailed,
            "working directory",
        ),
        (
            "bad-spec",
            task("", &[]).with_timeout("soon"),
            TaskReason::InvalidSpec,
            "spec.command",
        ),
        (
            "bad-memory",
            TaskTemplate {
                resources: Some(TaskResources {
                    memory: Some("lots".into()),
                    ..TaskResources::default()
                }),
                ..task("true", &[]).with_driver("exec")
            },
            TaskReason::InvalidSpec,
            "spec.resources.memory",
        ),
    ];
    for (uid, spec, reason, needle) in cases {
        let out = h.run(uid, spec).await;
        assert_eq!(
            (out.state, out.reason),
            (TaskState::Failed, reason),
            "{uid}: {}",
            out.message
        );
        assert!(
            out.message.contains(needle),
            "{uid}: {:?} lacks {needle:?}",
            out.message
        );
        assert!(out.started_at.is_none(), "{uid}");
    }
    assert!(h.seen.iter().all(|e| matches!(e, TaskEvent::Finished { .. })));
    let out = h.run("still-alive", task("true", &[])).await;
    assert_eq!(out.reason, TaskReason::Completed);
}

// --------------------------------------------------------------------- exec

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_isolated_as_a_uid_of_its_own() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    let mut h = Harness::new();
    let script = "id -u; id -G; grep NoNewPrivs /proc/self/status | tr -s '\\t' ' '; echo \"$HOME\"; \
                  echo \"${GREETING:-clean}\"; ulimit -v; touch here && echo writable";
    let mut spec = sh(script).with_driver("exec");
    spec.resources = Some(TaskResources {
        memory: Some("64Mi".into()),
        cpu: Some("500m".into()),
        ..TaskResources::default()
    });
    std::env::set_var("GREETING", "leaked");
    let first = h.run("exec-own-1", spec.clone()).await;
    let second = h.run("exec-own-2", spec).await;
    let mut uids = Vec::new();
    for (uid, out) in [("exec-own-1", first), ("exec-own-2", second)] {
        assert_eq!(out.reason, TaskReason::Completed, "{}", out.message);
        let lines: Vec<&str> = out.output_tail.lines().collect();
        let task_uid: u32 = lines[0].parse().unwrap();
        assert!(supervisor::DEFAULT_TASK_UIDS.contains(&task_uid), "{lines:?}");
        assert_eq!(lines[1], lines[0], "its own group and no other: {lines:?}");
        assert_eq!(lines[2], "NoNewPrivs: 1");
        assert!(lines[3].ends_with(&format!("tasks/{uid}-1/work")), "{lines:?}");
        assert_eq!(lines[4], "clean", "the agent's environment must not leak");
        // cgroup memory.max where the controller is available, RLIMIT_AS
        // (in KiB) otherwise.
        assert!(lines[5] == "65536" || lines[5] == "unlimited", "{lines:?}");
        assert_eq!(lines[6], "writable");
        uids.push(task_uid);
    }
    assert_ne!(uids[0], uids[1], "two tasks never share a uid");
    use std::os::unix::fs::MetadataExt;
    let work = std::fs::metadata(h.dir.path().join("tasks/exec-own-1-1/work")).unwrap();
    assert_eq!((work.uid(), work.mode() & 0o777), (uids[0], 0o700));
    // Once finished, the task's directory is root's alone: a later task
    // given the same uid cannot reach its files.
    let dir = h.dir.path().join("tasks/exec-own-1-1");
    poll_until("the finished directory is closed", || {
        std::fs::metadata(&dir).is_ok_and(|m| m.mode() & 0o777 == 0o700)
    })
    .await;
}

/// A task uid comes back to a new task only once what its earlier tasks
/// left in /tmp, /var/tmp, /dev/shm and System V IPC is gone, and the uid
/// rotation goes on where it was after an agent restart (issue 26, hole 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_uid_comes_back_clean_and_its_rotation_survives_a_restart() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    // Two uids of their own, outside the range the other tests share.
    let range = 88_000..=88_001;
    let dir = state_dir();
    let exec_config = || SupervisorConfig {
        task_uids: range.clone(),
        ..config(dir.path())
    };
    let tag = format!("k8s4r-leftover-{}", std::process::id());
    let leave = format!(
        "id -u; touch /tmp/{tag}; mkdir /var/tmp/{tag}; echo x > /var/tmp/{tag}/f; echo x > /dev/shm/{tag}; \
         ipcmk -M 4096 >/dev/null && ipcmk -S 1 >/dev/null && ipcmk -Q >/dev/null && echo ipc"
    );
    let run = |handle: SupervisorHandle,
               mut events: UnboundedReceiver<TaskEvent>,
               uid: &'static str,
               script: String| async move {
        let req = request(uid, 1, sh(&script).with_driver("exec"));
        assert_eq!(handle.submit(req).await.unwrap(), Submit::Accepted);
        let outcome = tokio::time::timeout(PATIENCE, async {
            while let Some(event) = events.recv().await {
                if let TaskEvent::Finished { uid: u, outcome, .. } = event {
                    if u == uid {
                        return outcome;
                    }
                }
            }
            panic!("the supervisor stopped");
        })
        .await
        .unwrap_or_else(|_| panic!("{uid} did not finish"));
        assert_eq!(
            outcome.reason,
            TaskReason::Completed,
            "{uid}: {}",
            outcome.message
        );
        let task_uid: u32 = outcome.output_tail.lines().next().unwrap().parse().unwrap();
        (handle, events, task_uid, outcome.output_tail)
    };
    let owned_ipc = |uid: u32| {
        ["shm", "sem", "msg"]
            .iter()
            .map(|t| std::fs::read_to_string(format!("/proc/sysvipc/{t}")).unwrap_or_default())
            .flat_map(|text| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
            .filter(|line| line.split_whitespace().any(|f| f == uid.to_string()))
            .count()
    };

    let (handle, events) = supervisor::spawn(exec_config()).unwrap();
    let (handle, _events, first, out) = run(handle, events, "leave", leave).await;
    assert!(out.contains("ipc"), "{out}");
    assert!(std::path::Path::new(&format!("/tmp/{tag}")).exists());
    assert!(owned_ipc(first) >= 3, "the task's IPC objects");
    handle.shutdown().await;

    // The agent restarts: the next task gets the other uid, not the first
    // one again.
    let (handle, events) = supervisor::spawn(exec_config()).unwrap();
    let (handle, events, second, _) = run(handle, events, "next", "id -u".to_owned()).await;
    assert_ne!(second, first, "the rotation started over after the restart");
    // The one after comes back to the first uid: its leftovers are gone
    // before it starts.
    let check = format!(
        "id -u; for p in /tmp/{tag} /var/tmp/{tag} /dev/shm/{tag}; do [ -e $p ] && echo found $p; done; true"
    );
    let (handle, _events, third, out) = run(handle, events, "again", check).await;
    assert_eq!(third, first);
    assert!(!out.contains("found"), "{out}");
    assert_eq!(owned_ipc(first), 0, "System V IPC of the earlier task");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_as_a_named_user_only_when_the_robot_allows_it() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let mut h = Harness::with_config(|c| {
        c.policy.allow_root = false;
        c.policy.allowed_users = vec!["nobody".to_owned()];
        c.policy.allowed_groups = vec!["tty".to_owned()];
    });
    let tty = nix::unistd::Group::from_name("tty")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    let mut spec = sh("id -un; id -G").with_driver("exec").with_user("nobody");
    spec.groups = vec!["tty".to_owned()];
    let out = h.run("exec-nobody", spec).await;
    assert_eq!(out.reason, TaskReason::Completed, "{}", out.message);
    let nogroup = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    assert_eq!(out.output_tail, format!("nobody\n{nogroup} {tty}\n"));

    let out = h
        .run("exec-root", sh("id -u").with_driver("exec").with_user("root"))
        .await;
    assert_eq!(out.reason, TaskReason::NotPermitted);
    assert!(out.message.contains("allow_root = false"), "{}", out.message);
    let mut spec = sh("id -u").with_driver("exec");
    spec.groups = vec!["disk".to_owned()];
    let out = h.run("exec-disk", spec).await;
    assert_eq!(out.reason, TaskReason::NotPermitted);
    assert!(out.message.contains("group(s) disk"), "{}", out.message);
}

// ---------------------------------------------------------------- artifacts

/// The body at `/ok` (with a length), `/stream` (no length, ends at
/// close) and `/flaky` (503 once, then the body); anything else 404.
async fn http_server(body: Vec<u8>) -> String {
    use k8s4r_testbed::http::{serve, Reply};
    serve(vec![
        ("/ok", Reply::Body(body.clone())),
        ("/stream", Reply::Stream(body.clone())),
        ("/flaky", Reply::FlakyOnce(body)),
    ])
    .await
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_are_fetched_verified_and_retried() {
    let body = b"artifact body\n".to_vec();
    let base = http_server(body.clone()).await;
    let mut h = Harness::new();
    let spec = sh("cat bin/payload flaky.txt")
        .with_artifact(format!("{base}/ok"), "bin/payload", sha256(&body))
        .with_artifact(format!("{base}/flaky"), "flaky.txt", sha256(&body).to_uppercase());
    let out = h.run("artifact-ok", spec).await;
    assert_eq!(out.reason, TaskReason::Completed, "{}", out.message);
    assert_eq!(out.output_tail, "artifact body\nartifact body\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_artifacts_belong_to_the_task_user() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let body = b"for nobody\n".to_vec();
    let base = http_server(body.clone()).await;
    let mut h = Harness::new();
    let spec = sh("cat sub/dir/file && touch sub/dir/new sub/dir/file && echo writable")
        .with_driver("exec")
        .with_artifact(format!("{base}/ok"), "sub/dir/file", sha256(&body));
    let out = h.run("artifact-exec", spec).await;
    assert_eq!(out.reason, TaskReason::Completed, "{}", out.message);
    assert_eq!(out.output_tail, "for nobody\nwritable\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_checksum_mismatch_fails_the_task() {
    let base = http_server(b"not what you expect".to_vec()).await;
    let mut h = Harness::new();
    let spec = sh("echo never").with_artifact(format!("{base}/ok"), "f", sha256(b"something else"));
    let out = h.run("artifact-sha", spec).await;
    assert_eq!(
        (out.state, out.reason),
        (TaskState::Failed, TaskReason::ArtifactFailed)
    );
    assert!(
        out.message.contains("artifact 0") && out.message.contains("sha256 mismatch"),
        "{}",
        out.message
    );
    assert!(out.started_at.is_none());
    assert!(!h.dir.path().join("tasks/artifact-sha-1/work/f").exists());
    assert!(!h.dir.path().join("tasks/artifact-sha-1/work/f.partial").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_size_cap_is_enforced_with_and_without_a_length() {
    let body = vec![b'x'; 4096];
    let base = http_server(body.clone()).await;
    let mut h = Harness::with_config(|c| c.artifact_max_bytes = 1024);
    for (uid, path) in [("cap-length", "/ok"), ("cap-stream", "/stream")] {
        let spec = sh("echo never").with_artifact(format!("{base}{path}"), "big", sha256(&body));
        let out = h.run(uid, spec).await;
        assert_eq!(out.reason, TaskReason::ArtifactFailed, "{uid}");
        assert!(
            out.message.contains("larger than the cap of 1024 bytes"),
            "{uid}: {}",
            out.message
        );
    }
    let spec = sh("echo never").with_artifact(format!("{base}/missing"), "x", sha256(&body));
    let out = h.run("artifact-404", spec).await;
    assert!(out.message.contains("404"), "{}", out.message);
}

// ----------------------------------------------------------------- shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_terminates_everything_and_reports_it() {
    let mut h = Harness::new();
    h.submit("down-1", task("sleep", &["1000"])).await;
    h.submit(
        "down-2",
        sh("trap '' TERM; sleep 1000").with_kill_timeout("300ms"),
    )
    .await;
    let pgids = [h.started("down-1").await, h.started("down-2").await];
    h.handle.shutdown().await;
    for uid in ["down-1", "down-2"] {
        let out = h.finished(uid).await;
        assert_eq!(out.reason, TaskReason::AgentShutdown, "{}", out.message);
        assert!(out.message.contains("the agent"), "{}", out.message);
    }
    for pgid in pgids {
        assert!(group_members(pgid, false).is_empty());
    }
    let late = request("late", 1, task("true", &[]));
    assert!(matches!(
        h.handle.submit(late).await,
        Err(SupervisorError::Stopped)
    ));
    assert!(h.handle.running().await.is_empty());
}

// ------------------------------------------------------------------ restart

const HELPER_DIR: &str = "K8S4R_SUPERVISOR_HELPER_DIR";

/// Not a test of its own: the "previous agent" of
/// `a_restart_re_adopts_the_previous_runs_tasks_and_stops_each_whole`, run in a child process that the
/// test SIGKILLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of a_restart_re_adopts_the_previous_runs_tasks_and_stops_each_whole"]
async fn restart_helper_agent() {
    let Ok(dir) = std::env::var(HELPER_DIR) else {
        return;
    };
    let (handle, mut events) = supervisor::spawn(config(Path::new(&dir))).unwrap();
    let specs = [
        ("restart-sleep", task("sleep", &["1000"])),
        ("restart-tree", sh("sleep 1000 & sleep 1000")),
        (
            "restart-stubborn",
            sh("trap '' TERM; echo before the crash; sleep 1000"),
        ),
    ];
    for (uid, spec) in specs {
        handle.submit(request(uid, 1, spec)).await.unwrap();
    }
    let mut started = 0;
    while let Some(event) = events.recv().await {
        if let TaskEvent::Started { uid, pid, .. } = event {
            println!("STARTED {uid} {pid}");
            started += 1;
            if started == 3 {
                println!("READY");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_re_adopts_the_previous_runs_tasks_and_stops_each_whole() {
    let dir = state_dir();
    let mut helper = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "restart_helper_agent",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_DIR, dir.path())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(helper.stdout.take().unwrap()).lines();
    let mut pgids: HashMap<String, u32> = HashMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("helper agent did not get ready")
            .unwrap()
            .expect("helper agent exited");
        // libtest may print "test restart_helper_agent ... " before the
        // helper's first line, on the same line.
        if let Some((_, rest)) = line.split_once("STARTED ") {
            let (uid, pid) = rest.split_once(' ').unwrap();
            pgids.insert(uid.to_owned(), pid.parse().unwrap());
        }
        if line.ends_with("READY") {
            break;
        }
    }
    poll_until("the tree task has both sleeps", || {
        group_members(pgids["restart-tree"], false).len() >= 2
    })
    .await;
    let log = dir.path().join("tasks/restart-stubborn-1/logs/stdout.log");
    poll_until("the output is on disk", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("before the crash"))
    })
    .await;
    // The agent dies without any chance to clean up; its tasks live on.
    helper.kill().await.unwrap();
    for pgid in pgids.values() {
        assert!(
            !group_members(*pgid, false).is_empty(),
            "orphaned tasks keep running"
        );
    }

    // The next run re-adopts them as they run (the same processes).
    let (handle, mut events) = supervisor::spawn(config(dir.path())).unwrap();
    let mut running: Vec<String> = handle.running().await.into_iter().map(|a| a.uid).collect();
    running.sort();
    assert_eq!(running, ["restart-sleep", "restart-stubborn", "restart-tree"]);
    for pgid in pgids.values() {
        assert!(
            !group_members(*pgid, false).is_empty(),
            "a re-adopted task was stopped"
        );
    }
    // The same dispatch delivered again is not run twice.
    let again = TaskRequest {
        uid: "restart-sleep".to_owned(),
        attempt: 1,
        name: "x".to_owned(),
        spec: task("sleep", &["1000"]),
        stop_after: None,
        config: None,
    };
    assert_eq!(handle.submit(again).await.unwrap(), Submit::Duplicate);
    // Each is still the supervisor's to stop, whole: the tree's other
    // sleep and the one that ignores SIGTERM too.
    for uid in ["restart-sleep", "restart-stubborn", "restart-tree"] {
        handle.cancel(uid, Some(1), "the test is over".to_owned()).await;
    }
    let mut ended = HashMap::new();
    let mut reported = HashMap::new();
    while ended.len() < 3 {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap()
            .unwrap();
        match event {
            TaskEvent::Finished {
                uid,
                attempt,
                outcome,
            } => {
                assert_eq!(attempt, 1);
                ended.insert(uid, outcome);
            }
            // Each re-adopted task's start is reported again (the
            // previous process may have died before its report left):
            // the same process, before its end.
            TaskEvent::Started {
                uid, attempt, pid, ..
            } => {
                assert_eq!(attempt, 1);
                assert!(!ended.contains_key(&uid), "{uid}: its start came after its end");
                reported.insert(uid, pid);
            }
            _ => {}
        }
    }
    assert_eq!(reported, pgids, "each re-adopted task's start, reported again");
    for (uid, outcome) in &ended {
        assert_eq!(
            outcome.reason,
            TaskReason::Cancelled,
            "{uid}: {}",
            outcome.message
        );
    }
    assert!(
        ended["restart-stubborn"].output_tail.contains("before the crash"),
        "{}",
        ended["restart-stubborn"].output_tail
    );
    for (uid, pgid) in &pgids {
        poll_until(&format!("{uid}'s processes are gone"), || {
            group_members(*pgid, false).is_empty()
        })
        .await;
    }
    handle.shutdown().await;
    let _ = helper.wait().await;
}
