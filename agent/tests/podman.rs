//! The podman driver against real parts: Debian's podman (vfs storage,
//! runc), a real registry (`docker-registry`) holding an image built here
//! with buildah from scratch and pushed by digest, and the supervisor with
//! its shims as the agent runs them. No sleeps to wait for anything: every
//! wait polls a condition with a deadline.

use std::time::Duration;

use k8s4r_agent::supervisor::{self, Policy, SupervisorConfig};
use k8s4r_api::{PreStop, StopSignal, TaskReason, TaskState, TaskTemplate};
use k8s4r_drivers::PodmanConfig;
use k8s4r_testbed::registry::{PodmanStore, Registry};

mod supervising;
use supervising::*;

/// A podman task from `image`; `script` run by the image's shell, or the
/// image's own command when None.
fn container(image: &str, script: Option<&str>) -> TaskTemplate {
    let (command, args) = match script {
        Some(script) => ("/bin/sh".to_owned(), vec!["-c".to_owned(), script.to_owned()]),
        None => (String::new(), Vec::new()),
    };
    TaskTemplate {
        driver: "podman".into(),
        command,
        args,
        image: Some(image.to_owned()),
        ..TaskTemplate::default()
    }
}

/// A supervisor that offers podman on `store`, pulling from a plain-HTTP
/// registry.
fn podman_config(config: &mut SupervisorConfig, store: &PodmanStore) {
    config.podman = Some(PodmanConfig {
        global_args: store.args(),
        tls_verify: false,
        pull_timeout: Duration::from_secs(20),
        run_dir: config.state_dir.join("podman"),
        ..PodmanConfig::default()
    });
    // Tasks run as uids of their own, as on a robot.
    config.policy = Policy {
        raw_exec: false,
        allow_root: false,
        ..config.policy.clone()
    };
}

/// Processes whose real uid is `uid`.
fn processes_of_uid(uid: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        let zombie = status.lines().any(|l| l.starts_with("State:") && l.contains('Z'));
        if real == Some(uid) && !zombie {
            found.push(pid);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_from_an_image_pulled_by_digest_as_its_own_user_in_its_directory() {
    let registry = Registry::start();
    let image = registry.push_test_image("hello");
    let store = PodmanStore::new();
    let mut h = Harness::with_config(|c| podman_config(c, &store));

    // The image's own command, its output the task's log.
    let outcome = h.run("img-default", container(&image, None)).await;
    assert_eq!(outcome.state, TaskState::Completed, "{outcome:?}");
    assert!(h
        .log("img-default", "stdout.log")
        .contains("hello from the image"));

    // A command of the template's, with its variables, as the task's own
    // uid, in the task's directory (mounted at the same path), its exit
    // code the task's.
    let mut t = container(
        &image,
        Some("echo \"GREETING=$GREETING\"; id -u; cat /image-marker; echo made > made-here; exit 3"),
    );
    t.env.push(k8s4r_api::EnvVar {
        name: "GREETING".into(),
        value: "hi there".into(),
        value_from: None,
    });
    let outcome = h.run("img-cmd", t).await;
    assert_eq!(outcome.state, TaskState::Failed, "{outcome:?}");
    assert_eq!(outcome.exit_code, Some(3), "{outcome:?}");
    let log = h.log("img-cmd", "stdout.log");
    assert!(log.contains("GREETING=hi there"), "{log}");
    assert!(log.contains("from the image"), "{log}");
    let uid: u32 = log
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("id -u");
    assert_ne!(uid, 0, "the task ran as root in its container: {log}");
    let made = h.dir.path().join("tasks/img-cmd-1/work/made-here");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "made\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&made).unwrap().uid(),
        uid,
        "written as the task's uid"
    );
    // Nothing is left of either container.
    assert!(store.containers().is_empty(), "{:?}", store.containers());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_sends_the_stop_signal_into_the_container_then_sigkill_and_leaves_nothing() {
    let registry = Registry::start();
    let image = registry.push_test_image("stubborn");
    let store = PodmanStore::new();
    let mut h = Harness::with_config(|c| podman_config(c, &store));

    // It notes SIGINT (its stop signal) and goes on: SIGKILL after the
    // kill timeout ends it and every process in its container.
    let mut t = container(
        &image,
        Some("trap 'echo got SIGINT' INT; trap '' TERM; id -u > uid; while :; do sleep 0.1; done"),
    )
    .with_timeout("1s")
    .with_kill_timeout("2s");
    t.stop_signal = Some(StopSignal::Int);
    h.submit("img-stubborn", t).await;
    let uid_file = h.dir.path().join("tasks/img-stubborn-1/work/uid");
    let uid_of = || {
        std::fs::read_to_string(&uid_file)
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    poll_until("the container runs", || uid_of().is_some()).await;
    let uid = uid_of().unwrap();
    let outcome = h.finished("img-stubborn").await;
    assert_eq!(outcome.reason, TaskReason::Timeout, "{outcome:?}");
    assert!(
        outcome.message.contains("SIGKILL after the kill timeout of 2s"),
        "{}",
        outcome.message
    );
    assert!(elapsed(&outcome) >= Duration::from_secs(3), "{outcome:?}");
    assert!(h.log("img-stubborn", "stdout.log").contains("got SIGINT"));
    poll_until("no process of the task is left", || {
        processes_of_uid(uid).is_empty()
    })
    .await;
    poll_until("its container is removed", || store.containers().is_empty()).await;

    // A program with no handler of its own stops on the stop signal at
    // once (catatonit is PID 1 and passes it on), well before SIGKILL.
    let t = container(&image, Some(": > up; exec sleep 1000")).with_kill_timeout("20s");
    h.submit("img-polite", t).await;
    let up = h.dir.path().join("tasks/img-polite-1/work/up");
    poll_until("the container runs", || up.exists()).await;
    h.handle
        .cancel("img-polite", Some(1), "the test is over".to_owned())
        .await;
    let outcome = h.finished("img-polite").await;
    assert_eq!(outcome.reason, TaskReason::Cancelled, "{outcome:?}");
    assert!(elapsed(&outcome) < Duration::from_secs(15), "{outcome:?}");
    poll_until("its container is removed", || store.containers().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_stop_runs_inside_the_container() {
    let registry = Registry::start();
    let image = registry.push_test_image("inside");
    let store = PodmanStore::new();
    let mut h = Harness::with_config(|c| podman_config(c, &store));

    let mut t = container(
        &image,
        Some("trap 'exit 0' TERM; : > up; while :; do sleep 0.1; done"),
    )
    .with_kill_timeout("10s");
    // /image-marker exists only in the image: run on the robot, these
    // would fail.
    t.pre_stop = Some(PreStop {
        command: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            "cat /image-marker > pre-stop-saw; echo \"$K8S4R_STOP_REASON\" >> pre-stop-saw".into(),
        ],
        timeout: None,
    });
    h.submit("img-prestop", t).await;
    let work = h.dir.path().join("tasks/img-prestop-1/work");
    poll_until("the container runs", || work.join("up").exists()).await;
    h.handle
        .cancel("img-prestop", Some(1), "the test is over".to_owned())
        .await;
    let outcome = h.finished("img-prestop").await;
    assert_eq!(outcome.reason, TaskReason::Cancelled, "{outcome:?}");
    let saw = std::fs::read_to_string(work.join("pre-stop-saw")).unwrap_or_default();
    assert!(
        saw.starts_with("from the image\n"),
        "preStop ran outside: {saw:?}"
    );
    assert!(
        elapsed(&outcome) < Duration::from_secs(10),
        "stopped by its TERM: {outcome:?}"
    );
    poll_until("its container is removed", || store.containers().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_neither_on_the_robot_nor_pullable_is_unavailable_not_a_failure_of_the_task() {
    let store = PodmanStore::new();
    let mut h = Harness::with_config(|c| podman_config(c, &store));
    // Nothing listens there.
    let nowhere = format!(
        "127.0.0.1:{}/nav@sha256:{}",
        k8s4r_testbed::free_port(),
        "0".repeat(64)
    );
    let outcome = h.run("img-missing", container(&nowhere, None)).await;
    assert_eq!(outcome.reason, TaskReason::ImageUnavailable, "{outcome:?}");
    assert!(
        outcome.message.contains("is unavailable") && outcome.message.contains("pull failed"),
        "{}",
        outcome.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_keeps_its_container_across_an_agent_restart() {
    let registry = Registry::start();
    let image = registry.push_test_image("service");
    let store = PodmanStore::new();
    let dir = state_dir();
    let config = {
        let mut c = config(dir.path());
        podman_config(&mut c, &store);
        // As the agent's own process runs: a restart or an upgrade leaves
        // its tasks running for the next one.
        c.leave_tasks_running = true;
        c
    };
    let (handle, _events) = supervisor::spawn(config.clone()).unwrap();
    let mut t = container(
        &image,
        Some("trap 'exit 0' TERM; : > up; while :; do sleep 0.1; done"),
    );
    t.kind = k8s4r_api::TaskKind::Service;
    handle.submit(request("img-svc", 1, t)).await.unwrap();
    let up = dir.path().join("tasks/img-svc-1/work/up");
    poll_until("the service's container runs", || up.exists()).await;
    let id_of = || {
        store.podman(&[
            "inspect",
            "--format",
            "{{.Id}} {{.State.StartedAt}}",
            "k8s4r-img-svc-1",
        ])
    };
    let before = id_of();
    handle.shutdown().await;
    assert_eq!(id_of(), before, "the agent's shutdown stopped the container");

    // The next agent takes it over: the same container, still running.
    let (handle, mut events) = supervisor::spawn(config).unwrap();
    let running: Vec<String> = handle.running().await.into_iter().map(|a| a.uid).collect();
    assert_eq!(running, ["img-svc"]);
    assert_eq!(id_of(), before, "the container was started again");
    handle
        .cancel("img-svc", Some(1), "the test is over".to_owned())
        .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("the service ends")
            .expect("events");
        if let supervisor::TaskEvent::Finished { uid, outcome, .. } = event {
            assert_eq!(uid, "img-svc");
            assert_eq!(outcome.reason, TaskReason::Cancelled, "{outcome:?}");
            break;
        }
    }
    poll_until("its container is removed", || store.containers().is_empty()).await;
    handle.shutdown().await;
}

/// Writes the contact the agent keeps for its shims, `age` old.
fn write_contact(state_dir: &std::path::Path, age: Duration) {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
    let run = state_dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let line = k8s4r_drivers::shim::contact_line(boot_id.trim(), Duration::from(now).saturating_sub(age));
    std::fs::write(run.join("contact"), line).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_agent_running_the_shims_fence_kills_the_container_too() {
    let registry = Registry::start();
    let image = registry.push_test_image("fenced");
    let store = PodmanStore::new();
    let dir = state_dir();
    let mut config = config(dir.path());
    podman_config(&mut config, &store);
    config.leave_tasks_running = true;
    // Contact now: the fence is far off while the container starts.
    write_contact(dir.path(), Duration::ZERO);
    let (handle, _events) = supervisor::spawn(config).unwrap();
    // It ignores its stop signal: only SIGKILL ends it.
    let t = container(
        &image,
        Some("trap '' TERM; id -u > uid; while :; do sleep 0.1; done"),
    )
    .with_kill_timeout("1s");
    let mut fenced = request("img-fenced", 1, t);
    fenced.stop_after = Some(Duration::from_secs(120));
    handle.submit(fenced).await.unwrap();
    let uid_file = dir.path().join("tasks/img-fenced-1/work/uid");
    let uid_of = || {
        std::fs::read_to_string(&uid_file)
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    poll_until("the container runs", || uid_of().is_some()).await;
    let uid = uid_of().unwrap();
    // The agent goes (a crash loop, a unit stopped): nobody but the shim
    // is left to fence the attempt. Its last contact is long past.
    handle.shutdown().await;
    assert!(
        !processes_of_uid(uid).is_empty(),
        "the agent's shutdown stopped the task"
    );
    write_contact(dir.path(), Duration::from_secs(600));
    poll_until("the fence killed every process of the container", || {
        processes_of_uid(uid).is_empty()
    })
    .await;
}

/// Sets the time of the agent's mark of `image` (its last use) to
/// `hours` ago, as if that much time had passed.
fn age_mark(state_dir: &std::path::Path, image: &str, hours: u32) {
    let hex = image.rsplit_once("@sha256:").expect("a pinned image").1;
    let mark = state_dir.join("podman/images").join(hex);
    assert!(mark.exists(), "the agent noted no use of {image}");
    let status = std::process::Command::new("touch")
        .args(["-m", "-d", &format!("{hours} hours ago")])
        .arg(&mark)
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_the_agent_brought_are_removed_but_not_a_held_tasks_or_anothers() {
    let registry = Registry::start();
    let [old, older, held, last, foreign] =
        ["old", "older", "held", "last", "foreign"].map(|name| registry.push_test_image_with(name, 4096));
    let store = PodmanStore::new();
    // Somebody else's image in the same store: no mark, never touched.
    store.podman(&["pull", "--quiet", "--tls-verify=false", &foreign]);
    let mut h = Harness::with_config(|c| {
        podman_config(c, &store);
        c.image_keep = 0;
    });
    let state = h.dir.path().to_path_buf();

    for (uid, image) in [("gc-old", &old), ("gc-older", &older)] {
        let outcome = h.run(uid, container(image, None)).await;
        assert_eq!(outcome.state, TaskState::Completed, "{outcome:?}");
    }
    // Used within the grace: still there after the collections their
    // ends started.
    assert!(store.has_image(&old) && store.has_image(&older));
    age_mark(&state, &old, 2);
    age_mark(&state, &older, 3);

    // A task that holds its image for as long as it runs, its use long ago.
    h.submit("gc-held", container(&held, Some(": > up; exec sleep 300")))
        .await;
    let up = state.join("tasks/gc-held-1/work/up");
    poll_until("the held task runs", || up.exists()).await;
    age_mark(&state, &held, 4);

    // Another podman task ends: unused and old, the first two go.
    let outcome = h.run("gc-last", container(&last, None)).await;
    assert_eq!(outcome.state, TaskState::Completed, "{outcome:?}");
    poll_until("the unused images are removed", || {
        !store.has_image(&old) && !store.has_image(&older)
    })
    .await;
    assert!(store.has_image(&held), "the image of a running task was removed");
    assert!(store.has_image(&last), "an image used a moment ago was removed");
    assert!(
        store.has_image(&foreign),
        "an image the agent did not bring was removed"
    );
    let marks: Vec<_> = std::fs::read_dir(state.join("podman/images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(marks.len(), 2, "the marks of the removed images stay: {marks:?}");

    // A removed image is pulled again when a task needs it.
    let outcome = h.run("gc-again", container(&old, None)).await;
    assert_eq!(outcome.state, TaskState::Completed, "{outcome:?}");
    h.handle
        .cancel("gc-held", Some(1), "the test is over".to_owned())
        .await;
    h.finished("gc-held").await;
    poll_until("its container is removed", || store.containers().is_empty()).await;
}
