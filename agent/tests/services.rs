//! Services and restarts on the robot, with real agent processes against a
//! real Mosquitto: what keeps running while the robot is cut off.

mod support;

use std::time::Duration;

use k8s4r_api::protocol::{encode, StatusUpdate};
use k8s4r_api::{DurationString, LocalRestart, LocalRestartMode, TaskKind, TaskState};
use support::{eventually, shell_dispatch, Agent, Broker, Server};

const LONG: Duration = Duration::from_secs(30);

/// A robot online: a broker, the test's server, and an agent with a fresh
/// state dir, approved.
struct Online {
    broker: Broker,
    server: Server,
    agent: Agent,
    tmp: tempfile::TempDir,
    state: std::path::PathBuf,
}

impl Online {
    async fn start(robot: &str) -> Online {
        let broker = Broker::start();
        let mut server = Server::connect(&broker, robot).await;
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let agent = Agent::start(&broker, robot, &state, &[]);
        server.approve(robot).await;
        Online {
            broker,
            server,
            agent,
            tmp,
            state,
        }
    }
}

/// Runs `k8s4r-agent --stop-left-tasks` for `robot`, as the unit's
/// ExecStopPost does after the agent ended; it must succeed.
fn stop_left_tasks(broker: &Broker, robot: &str, state: &std::path::Path) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_k8s4r-agent"))
        .args([
            "--config",
            "/dev/null",
            "--broker-url",
            &broker.url(),
            "--robot-id",
            robot,
        ])
        .arg("--state-dir")
        .arg(state)
        .arg("--stop-left-tasks")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Whether `pid` runs (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.split_whitespace().nth(2) != Some("Z"))
}

/// Kills, when dropped, the process groups of the pids listed in these
/// files: services outlive the agent, and a test must not leave them
/// behind, passed or failed.
struct Services(Vec<std::path::PathBuf>);

impl Drop for Services {
    fn drop(&mut self) {
        for file in &self.0 {
            for pid in pids_in(file) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

#[tokio::test]
async fn a_service_crashing_while_cut_off_is_restarted_each_time_and_reports_it_after_the_network_heals() {
    let Online {
        mut broker,
        mut server,
        mut agent,
        tmp,
        state: _,
    } = Online::start("rs1").await;

    // Each run appends its pid to `starts`. The first three crash (once
    // `go` exists, so that they crash while the broker is down); the
    // fourth stays up.
    let starts = tmp.path().join("starts");
    let _services = Services(vec![starts.clone()]);
    let go = tmp.path().join("go");
    let script = format!(
        "echo $$ >> {starts}; while [ ! -e {go} ]; do sleep 0.05; done; \
         if [ $(wc -l < {starts}) -le 3 ]; then exit 3; fi; exec sleep 600",
        starts = starts.display(),
        go = go.display()
    );
    let mut dispatch = shell_dispatch("u-svc", 1, &script);
    dispatch.spec.kind = TaskKind::Service;
    dispatch.spec.restart = Some(LocalRestart {
        attempts: 5,
        interval: Some(DurationString::from("1h")),
        delay: Some(DurationString::from("100ms")),
        max_delay: Some(DurationString::from("500ms")),
        mode: LocalRestartMode::Fail,
    });
    server
        .publish(server.topics.dispatch("rs1"), encode(&dispatch))
        .await;
    let running: StatusUpdate = server.next("/tasks/u-svc/status", LONG).await.decode();
    assert_eq!(
        (running.state, running.restarts.restart_count),
        (TaskState::Running, 0)
    );

    broker.stop();
    std::fs::write(&go, b"").unwrap();
    let pids = eventually("three restarts while the broker is down", LONG, || {
        let text = std::fs::read_to_string(&starts).unwrap_or_default();
        let pids: Vec<String> = text.lines().map(str::to_owned).collect();
        (pids.len() >= 4).then_some(pids)
    })
    .await;
    assert_eq!(pids.len(), 4, "{pids:?}");
    let distinct: std::collections::HashSet<&String> = pids.iter().collect();
    assert_eq!(distinct.len(), 4, "each restart is a new process: {pids:?}");
    assert!(agent.is_running(), "the agent died during the outage");

    broker.restart();
    server.approve("rs1").await;
    let mut seen = Vec::new();
    while seen.last().map(|u: &StatusUpdate| u.restarts.restart_count) != Some(3) {
        let update: StatusUpdate = server.next("/tasks/u-svc/status", LONG).await.decode();
        assert_eq!(update.state, TaskState::Running, "{update:#?}");
        seen.push(update);
    }
    let counts: Vec<u32> = seen.iter().map(|u| u.restarts.restart_count).collect();
    assert!(
        counts.windows(2).all(|w| w[0] <= w[1]),
        "restart counts go back: {counts:?}"
    );
    let last = seen.last().unwrap();
    assert_eq!(last.restarts.last_exit_code, Some(3), "{last:#?}");
    assert!(last.restarts.last_restart_time.is_some());
    // The fourth run stays up: nothing terminal follows.
    let more = server.drain(Duration::from_millis(500)).await;
    for m in more.iter().filter(|m| m.topic.ends_with("/tasks/u-svc/status")) {
        let update: StatusUpdate = m.decode();
        assert_eq!(update.state, TaskState::Running, "{update:#?}");
    }
}

/// Its dispatch: a service that appends its pid to `starts` and stays up.
fn staying_service(uid: &str, starts: &std::path::Path) -> k8s4r_api::protocol::Dispatch {
    let script = format!("echo $$ >> {}; exec sleep 600", starts.display());
    let mut dispatch = shell_dispatch(uid, 1, &script);
    dispatch.spec.kind = TaskKind::Service;
    dispatch
}

fn pids_in(path: &std::path::Path) -> Vec<i32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[tokio::test]
async fn a_service_runs_again_within_five_seconds_after_a_power_cut_without_a_broker() {
    let Online {
        mut broker,
        mut server,
        mut agent,
        tmp,
        state,
    } = Online::start("rs2").await;
    let starts = tmp.path().join("starts");
    let _services = Services(vec![starts.clone()]);
    server
        .publish(
            server.topics.dispatch("rs2"),
            encode(&staying_service("u-boot", &starts)),
        )
        .await;
    let running: StatusUpdate = server.next("/tasks/u-boot/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    let first = eventually("the service's pid", LONG, || pids_in(&starts).first().copied()).await;

    // The robot loses the broker, then its agent is SIGKILLed (an OOM kill)
    // and comes back with no broker: the service never stopped, and the
    // new agent re-adopts it.
    broker.stop();
    agent.kill();
    let mut agent = Agent::start(&broker, "rs2", &state, &[]);
    eventually("the new agent re-adopting the service", LONG, || {
        agent
            .log()
            .contains("re-adopting a service of the previous run")
            .then_some(())
    })
    .await;
    assert_eq!(pids_in(&starts), vec![first], "the service was started again");
    assert!(alive(first), "the service died with the agent");

    // Then the robot loses power: the agent and the service die without a
    // word, and the agent comes back with no broker.
    agent.kill();
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    );
    let started = std::time::Instant::now();
    let _agent = Agent::start(&broker, "rs2", &state, &[]);
    let second = eventually("the service started again", LONG, || {
        pids_in(&starts).get(1).copied()
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the service took {took:?} to run again"
    );
    assert_ne!(first, second);
    eventually("the old process gone", LONG, || (!alive(first)).then_some(())).await;

    // Back online: the same attempt, running, one restart on the robot.
    broker.restart();
    server.approve("rs2").await;
    let update = loop {
        let update: StatusUpdate = server.next("/tasks/u-boot/status", LONG).await.decode();
        if update.restarts.restart_count > 0 {
            break update;
        }
    };
    assert_eq!(
        (update.state, update.attempt),
        (TaskState::Running, 1),
        "{update:#?}"
    );
    assert_eq!(update.restarts.restart_count, 1, "{update:#?}");
}

#[tokio::test]
async fn a_failing_exec_health_check_restarts_the_service_and_says_why() {
    let Online {
        broker: _broker,
        mut server,
        agent: _agent,
        tmp,
        state: _,
    } = Online::start("rs3").await;
    let starts = tmp.path().join("starts");
    let _services = Services(vec![starts.clone()]);
    let sick = tmp.path().join("sick");
    let mut dispatch = staying_service("u-hc", &starts);
    dispatch.spec.restart = Some(LocalRestart {
        attempts: 5,
        interval: Some(DurationString::from("1h")),
        delay: Some(DurationString::from("100ms")),
        max_delay: None,
        mode: LocalRestartMode::Fail,
    });
    dispatch.spec.checks = vec![k8s4r_api::HealthCheck {
        name: Some("not-sick".into()),
        exec: Some(k8s4r_api::ExecCheck {
            command: "sh".into(),
            args: vec!["-c".into(), format!("test ! -e {}", sick.display())],
        }),
        interval: Some(DurationString::from("200ms")),
        timeout: Some(DurationString::from("200ms")),
        failure_threshold: Some(2),
        ..Default::default()
    }];
    server
        .publish(server.topics.dispatch("rs3"), encode(&dispatch))
        .await;
    let running: StatusUpdate = server.next("/tasks/u-hc/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    let first = eventually("the service's pid", LONG, || pids_in(&starts).first().copied()).await;

    // Healthy: left alone for a dozen checks (a window to watch, not a wait
    // for a condition).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(pids_in(&starts), vec![first], "restarted while healthy");

    std::fs::write(&sick, b"").unwrap();
    let update = loop {
        let update: StatusUpdate = server.next("/tasks/u-hc/status", LONG).await.decode();
        if update.restarts.restart_count > 0 {
            break update;
        }
    };
    std::fs::remove_file(&sick).unwrap();
    assert_eq!(update.state, TaskState::Running, "{update:#?}");
    let message = update.message.clone().unwrap_or_default();
    assert!(
        message.contains("health check \"not-sick\" failed 2 times in a row"),
        "{message}"
    );
    // The status says it started again; the new shell writes its pid a
    // moment later.
    let pids = eventually("the service's second pid", LONG, || {
        let pids = pids_in(&starts);
        (pids.len() >= 2).then_some(pids)
    })
    .await;
    assert_ne!(pids[1], first, "{pids:?}");
    eventually("the unhealthy process gone", LONG, || {
        (!alive(first)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_agent_restart_leaves_a_service_running_and_still_enforces_its_timeout() {
    let Online {
        broker,
        mut server,
        mut agent,
        tmp,
        state,
    } = Online::start("rs4").await;
    let starts = tmp.path().join("starts");
    let _services = Services(vec![starts.clone()]);
    // It writes all the time: with its output piped through the agent it
    // would die of SIGPIPE once the agent is gone.
    let script = format!(
        "echo $$ >> {}; while true; do echo tick; sleep 0.05; done",
        starts.display()
    );
    let mut dispatch = shell_dispatch("u-keep", 1, &script);
    dispatch.spec.kind = TaskKind::Service;
    dispatch.spec.timeout = Some(DurationString::from("6s"));
    dispatch.spec.kill_timeout = Some(DurationString::from("1s"));
    server
        .publish(server.topics.dispatch("rs4"), encode(&dispatch))
        .await;
    let running: StatusUpdate = server.next("/tasks/u-keep/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    let pid = eventually("the service's pid", LONG, || pids_in(&starts).first().copied()).await;

    // An upgrade: SIGTERM, the agent exits, a new one starts.
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    eventually("the agent to exit", LONG, || (!agent.is_running()).then_some(())).await;
    assert!(alive(pid), "the service died with the agent");
    let log = state.join("tasks/u-keep-1/logs/stdout.log");
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    eventually("the service still writing its log with no agent", LONG, || {
        (std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) > size).then_some(())
    })
    .await;
    let _agent = Agent::start(&broker, "rs4", &state, &[]);
    // It reports the re-adopted attempt from its first registration on.
    let register = server.approve("rs4").await;
    assert!(
        register
            .held
            .running
            .iter()
            .any(|a| a.uid == "u-keep" && a.attempt == 1),
        "{:?}",
        register.held.running
    );

    // The same process, and its timeout (6s from its start) still holds.
    let updates = server.statuses_until_terminal("u-keep", LONG).await;
    let last = updates.last().unwrap();
    assert_eq!(
        (last.state, last.reason),
        (TaskState::Failed, Some(k8s4r_api::TaskReason::Timeout)),
        "{updates:#?}"
    );
    assert_eq!(
        pids_in(&starts),
        vec![pid],
        "it was started again instead of re-adopted"
    );
    assert!(!alive(pid), "the timed-out service still runs");
    assert!(
        last.output_tail.as_deref().unwrap_or_default().contains("tick"),
        "{last:#?}"
    );
}

#[tokio::test]
async fn after_an_agent_crash_stop_left_tasks_kills_batch_tasks_and_spares_services() {
    let Online {
        broker,
        mut server,
        mut agent,
        tmp,
        state,
    } = Online::start("rs5").await;
    let service_pids = tmp.path().join("service");
    let batch_pids = tmp.path().join("batch");
    let _services = Services(vec![service_pids.clone(), batch_pids.clone()]);
    server
        .publish(
            server.topics.dispatch("rs5"),
            encode(&staying_service("u-svc5", &service_pids)),
        )
        .await;
    let batch = shell_dispatch(
        "u-batch5",
        1,
        &format!("echo $$ >> {}; exec sleep 600", batch_pids.display()),
    );
    server
        .publish(server.topics.dispatch("rs5"), encode(&batch))
        .await;
    let service = eventually("the service's pid", LONG, || {
        pids_in(&service_pids).first().copied()
    })
    .await;
    let batch = eventually("the batch task's pid", LONG, || {
        pids_in(&batch_pids).first().copied()
    })
    .await;
    // A status leaves the agent only once the journal holds the start it
    // reports: from then on `--stop-left-tasks` can find the task.
    let running: StatusUpdate = server.next("/tasks/u-batch5/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);

    agent.kill();
    stop_left_tasks(&broker, "rs5", &state);
    eventually("the batch task killed", LONG, || (!alive(batch)).then_some(())).await;
    assert!(alive(service), "the service was killed too");
}

#[tokio::test]
async fn stop_left_tasks_stops_a_left_task_with_its_stop_signal_before_any_sigkill() {
    let mut robot = Online::start("rs7").await;
    let pids = robot.tmp.path().join("graceful");
    let marks = robot.tmp.path().join("graceful.marks");
    let _services = Services(vec![pids.clone()]);
    let mut task = shell_dispatch(
        "u-int7",
        1,
        &format!(
            "trap 'echo stopped on SIGINT >> {m}; exit 0' INT; trap '' TERM; echo $$ >> {p}; while :; do sleep 0.1; done",
            m = marks.display(),
            p = pids.display()
        ),
    );
    task.spec.stop_signal = Some(k8s4r_api::StopSignal::Int);
    task.spec.kill_timeout = Some(DurationString::from("20s"));
    let topic = robot.server.topics.dispatch("rs7");
    robot.server.publish(topic, encode(&task)).await;
    let pid = eventually("the task's pid", LONG, || pids_in(&pids).first().copied()).await;
    let running: StatusUpdate = robot.server.next("/tasks/u-int7/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);

    robot.agent.kill();
    let began = std::time::Instant::now();
    stop_left_tasks(&robot.broker, "rs7", &robot.state);
    assert!(!alive(pid), "gone when the command returns");
    assert_eq!(
        std::fs::read_to_string(&marks).unwrap_or_default(),
        "stopped on SIGINT\n",
        "stopped by its own signal, not SIGKILL"
    );
    assert!(
        began.elapsed() < std::time::Duration::from_secs(10),
        "not the whole kill timeout: {:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_re_adopted_service_that_dies_is_restarted_by_the_new_agent() {
    let Online {
        broker,
        mut server,
        mut agent,
        tmp,
        state,
    } = Online::start("rs6").await;
    let starts = tmp.path().join("starts");
    let _services = Services(vec![starts.clone()]);
    let mut dispatch = staying_service("u-re", &starts);
    dispatch.spec.restart = Some(LocalRestart {
        attempts: 3,
        interval: Some(DurationString::from("1h")),
        delay: Some(DurationString::from("100ms")),
        max_delay: None,
        mode: LocalRestartMode::Fail,
    });
    server
        .publish(server.topics.dispatch("rs6"), encode(&dispatch))
        .await;
    // The agent's own report, not the pid file: a service still launching
    // when SIGTERM comes is stopped, not left for the next agent.
    let running: StatusUpdate = server.next("/tasks/u-re/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    let first = eventually("the service's pid", LONG, || pids_in(&starts).first().copied()).await;
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    eventually("the agent to exit", LONG, || (!agent.is_running()).then_some(())).await;
    let agent = Agent::start(&broker, "rs6", &state, &[]);
    server.approve("rs6").await;
    eventually("the new agent re-adopting the service", LONG, || {
        agent
            .log()
            .contains("re-adopting a service of the previous run")
            .then_some(())
    })
    .await;

    // The re-adopted process dies: the new agent, which is not its parent,
    // notices and restarts it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let second = eventually("the service restarted", LONG, || pids_in(&starts).get(1).copied()).await;
    assert_ne!(first, second);
    let update = loop {
        let update: StatusUpdate = server.next("/tasks/u-re/status", LONG).await.decode();
        if update.restarts.restart_count > 0 {
            break update;
        }
    };
    assert_eq!(
        (update.state, update.restarts.restart_count),
        (TaskState::Running, 1),
        "{update:#?}"
    );
}

/// The configuration a dispatch or a change carries: `params`' key `value`
/// as the file `conf/value` and the variable `VALUE`, at `generation`.
fn params(generation: u64, file: &str, var: &str) -> k8s4r_api::protocol::TaskConfig {
    use k8s4r_api::config_ref::{ConfigSource, ObjectKind};
    use k8s4r_api::protocol::{ConfigFile, ConfigVar, TaskConfig};
    TaskConfig {
        env: vec![ConfigVar {
            name: "VALUE".into(),
            value: var.into(),
            secret: false,
        }],
        files: vec![ConfigFile::new(
            "conf/value".into(),
            0o644,
            false,
            file.as_bytes(),
        )],
        sources: vec![ConfigSource {
            kind: ObjectKind::ConfigMap,
            name: "params".into(),
            resource_version: format!("{}", 100 + generation),
        }],
        generation,
    }
}

/// A service taking `params` (file and variable) that does `on_change`.
fn configured_service(
    uid: &str,
    script: &str,
    on_change: k8s4r_api::config_ref::OnConfigChange,
) -> k8s4r_api::protocol::Dispatch {
    use k8s4r_api::config_ref::{ConfigFiles, ConfigMapFiles, EnvVarSource, KeySelector};
    let mut dispatch = shell_dispatch(uid, 1, script);
    dispatch.spec.kind = TaskKind::Service;
    dispatch.spec.files = vec![ConfigFiles {
        path: "conf".into(),
        config_map: Some(ConfigMapFiles {
            name: "params".into(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    dispatch.spec.env = vec![k8s4r_api::EnvVar {
        name: "VALUE".into(),
        value: String::new(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(KeySelector {
                name: "params".into(),
                key: "value".into(),
                optional: None,
            }),
            ..Default::default()
        }),
    }];
    dispatch.spec.on_config_change = on_change;
    dispatch.config = Some(params(0, "1", "v1"));
    dispatch
}

fn change(uid: &str, config: k8s4r_api::protocol::TaskConfig) -> Vec<u8> {
    encode(&k8s4r_api::protocol::ConfigUpdate {
        v: 1,
        task_uid: uid.into(),
        attempt: 1,
        config,
    })
}

/// Waits for a line holding `needle` in `log`; says what is there, and
/// the agent's log, when none comes.
async fn wait_line(log: &std::path::Path, needle: &str, agent: &Agent) {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {needle:?} in:\n{text}\nagent log:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next status of `uid` that reports its configuration.
async fn config_report(server: &mut Server, uid: &str) -> StatusUpdate {
    let suffix = format!("/tasks/{uid}/status");
    loop {
        let update: StatusUpdate = server.next(&suffix, LONG).await.decode();
        if update.config.is_some() {
            return update;
        }
        assert!(!update.state.is_terminal(), "{uid} ended: {update:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_change_is_in_place_before_its_signal_and_a_restart_takes_the_new_values() {
    use k8s4r_api::config_ref::OnConfigChange;
    // Every part is kept to the end: a field left to `..` would drop
    // (the broker stopping) here.
    let Online {
        broker: _broker,
        mut server,
        agent,
        tmp,
        state: _state,
    } = Online::start("rc1").await;
    let log = tmp.path().join("seen");
    std::fs::write(&log, b"").unwrap();

    // signal: the file changes in place, then SIGHUP; the variable keeps
    // its value until a start. (A short foreground sleep: dash runs a trap
    // that comes as it forks `sleep 3600 &` only once `wait` returns.)
    let script = format!(
        "trap 'echo \"hup $(cat conf/value) $VALUE\" >> {log}' HUP; echo \"sig-start $(cat conf/value) $VALUE\" >> {log}; while true; do sleep 0.1; done",
        log = log.display()
    );
    let dispatch = configured_service("u-sig", &script, OnConfigChange::Signal);
    server
        .publish(server.topics.dispatch("rc1"), encode(&dispatch))
        .await;
    let first = config_report(&mut server, "u-sig").await;
    let config = first.config.clone().unwrap();
    assert_eq!((config.generation, config.sources.len()), (0, 1), "{first:?}");
    wait_line(&log, "sig-start 1 v1", &agent).await;
    server
        .publish(
            server.topics.config_update("rc1"),
            change("u-sig", params(1, "2", "v2")),
        )
        .await;
    let applied = config_report(&mut server, "u-sig").await.config.unwrap();
    assert_eq!(applied.generation, 1);
    assert!(
        applied
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("sent SIGHUP"),
        "{applied:?}"
    );
    wait_line(&log, "hup 2 v1", &agent).await;
    // The same change delivered again is dropped; a newer one with the
    // same values is recorded, nothing signalled.
    server
        .publish(
            server.topics.config_update("rc1"),
            change("u-sig", params(1, "2", "v2")),
        )
        .await;
    server
        .publish(
            server.topics.config_update("rc1"),
            change("u-sig", params(2, "2", "v2")),
        )
        .await;
    let same = config_report(&mut server, "u-sig").await.config.unwrap();
    assert_eq!(same.generation, 2, "{same:?}");
    assert!(
        same.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("unchanged"),
        "{same:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("hup ").count(), 1, "{text}");

    // restart: stopped and started again at once with the new file and
    // variable, the restart counted, in the same attempt.
    let script = format!(
        "echo \"rst-start $(cat conf/value) $VALUE\" >> {log}; exec sleep 3600",
        log = log.display()
    );
    let dispatch = configured_service("u-rst", &script, OnConfigChange::Restart);
    server
        .publish(server.topics.dispatch("rc1"), encode(&dispatch))
        .await;
    config_report(&mut server, "u-rst").await;
    wait_line(&log, "rst-start 1 v1", &agent).await;
    server
        .publish(
            server.topics.config_update("rc1"),
            change("u-rst", params(1, "3", "v3")),
        )
        .await;
    let restarted = config_report(&mut server, "u-rst").await;
    assert_eq!(
        (
            restarted.state,
            restarted.attempt,
            restarted.restarts.restart_count,
            restarted.config.as_ref().map(|c| c.generation)
        ),
        (TaskState::Running, 1, 1, Some(1)),
        "{restarted:?}"
    );
    wait_line(&log, "rst-start 3 v3", &agent).await;
    // A change for an attempt this robot does not run is dropped.
    let mut other = k8s4r_api::protocol::ConfigUpdate {
        v: 1,
        task_uid: "u-rst".into(),
        attempt: 7,
        config: params(5, "9", "v9"),
    };
    server
        .publish(server.topics.config_update("rc1"), encode(&other))
        .await;
    other.attempt = 1;
    other.config = params(6, "3", "v3");
    server
        .publish(server.topics.config_update("rc1"), encode(&other))
        .await;
    let last = config_report(&mut server, "u-rst").await.config.unwrap();
    assert_eq!(
        last.generation, 6,
        "the change for attempt 7 was not taken: {last:?}"
    );
    assert!(!std::fs::read_to_string(&log).unwrap().contains(" 9 "));
}
