//! End-to-end: the whole stack (embedded API server, server, manager) in
//! this process, a real Mosquitto, and two or three real agent processes,
//! each with its own state dir and labels.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s4r::up::kubeconfig_path;
use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::{Job, RobotPhase, Task, TaskGroup, TaskReason, TaskState, WorkState};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

mod support;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_run_on_their_robots_and_aggregate() {
    let env = Env::start(&[
        ("arm-1", &["role=arm", "site=lab"]),
        ("arm-2", &["role=arm", "site=lab"]),
        ("base-1", &["role=base", "site=lab"]),
    ])
    .await;
    let script = "echo \"hello from $K8S4R_TASK_NAME\"; sleep 0.5; echo bye";
    env.create_job(job_json(
        "mixed",
        serde_json::json!([
            { "name": "arms", "count": 3, "task": sh(script, "1m"),
              "robotSelector": { "matchLabels": { "role": "arm" } } },
            { "name": "bases", "count": 2, "task": sh(script, "1m"),
              "robotSelector": { "matchLabels": { "role": "base" } } },
        ]),
    ))
    .await;

    let tasks = env.wait_tasks_final("mixed", 5).await;
    let mut arm_robots = BTreeSet::new();
    for t in &tasks {
        let name = t.metadata.name.clone().unwrap_or_default();
        let status = t.status.clone().expect("status");
        assert_eq!(status.state, Some(TaskState::Completed), "{name}: {status:?}");
        assert_eq!(status.exit_code, Some(0), "{name}");
        let robot = status.robot.clone().expect("a robot");
        let group = t
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k8s4r_api::names::LABEL_GROUP).cloned());
        let tail = status.output_tail.clone().unwrap_or_default();
        assert!(
            tail.contains(&format!("hello from default/{name}")) && tail.contains("bye"),
            "{name}'s output tail: {tail:?}"
        );
        if name.starts_with("mixed-arms") || group.as_deref() == Some("arms") {
            assert!(robot.starts_with("arm-"), "{name} ran on {robot}");
            arm_robots.insert(robot);
        } else {
            assert_eq!(robot, "base-1", "{name} ran on {robot}");
        }
    }
    assert!(!arm_robots.is_empty());

    let job = eventually("the Job completed 5/5", || async {
        let job = env.jobs().get("mixed").await.ok()?;
        let s = job.status.clone()?;
        (s.state == Some(WorkState::Completed)).then_some(s)
    })
    .await;
    assert_eq!(job.completions.as_deref(), Some("5/5"));
    assert_eq!(
        (job.counts.total, job.counts.completed, job.counts.failed),
        (5, 5, 0)
    );
    let groups: Api<TaskGroup> = Api::namespaced(env.client.clone(), "default");
    for (group, n) in [("mixed-arms", 3), ("mixed-bases", 2)] {
        let s = eventually(&format!("{group} completed"), || async {
            let s = groups.get(group).await.ok()?.status?;
            (s.state == Some(WorkState::Completed)).then_some(s)
        })
        .await;
        assert_eq!(s.completions, Some(format!("{n}/{n}")), "{group}");
        assert_eq!((s.counts.total, s.counts.completed), (n, n), "{group}");
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_timeout_fails_and_its_process_tree_is_gone() {
    let env = Env::start(&[("r1", &["kind=test"]), ("r2", &["kind=test"])]).await;
    let pidfile = env.scratch.join("slow.pid");
    let script = format!("echo $$ > {}; sleep 300 & sleep 300; wait", pidfile.display());
    env.create_job(job_json(
        "slow",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh(&script, "2s") }]),
    ))
    .await;
    let pid = read_pid(&pidfile).await;
    let group = pgrp(pid).expect("the task runs");
    // The shell writes its pid before it starts the sleeps.
    eventually("the shell and its sleeps run", || async {
        (group_members(group).len() >= 2).then_some(())
    })
    .await;

    let tasks = env.wait_tasks_final("slow", 1).await;
    let status = tasks[0].status.clone().expect("status");
    assert_eq!(status.state, Some(TaskState::Failed), "{status:?}");
    assert_eq!(status.reason, Some(TaskReason::Timeout), "{status:?}");
    assert!(matches!(status.exit_code, Some(143 | 137)), "{status:?}");
    eventually("the task's process group is gone", || async {
        group_members(group).is_empty().then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_failing_twice_then_succeeding_shows_three_attempts() {
    let env = Env::start(&[("r1", &["kind=test"]), ("r2", &["kind=test"])]).await;
    let counter = env.scratch.join("counter");
    let script = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; echo attempt $n; [ $n -ge 3 ]",
        c = counter.display()
    );
    env.create_job(job_json(
        "flaky",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh(&script, "1m"),
            "restartPolicy": { "attempts": 3, "delay": "200ms" } }]),
    ))
    .await;
    let tasks = env.wait_tasks_final("flaky", 1).await;
    let status = tasks[0].status.clone().expect("status");
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    assert_eq!(status.attempt, 3, "{status:?}");
    assert_eq!(status.attempts.len(), 2, "{status:?}");
    assert!(
        status.attempts.iter().all(|a| a.state == TaskState::Failed),
        "{status:?}"
    );
    assert_eq!(std::fs::read_to_string(&counter).expect("counter").trim(), "3");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_restarted_on_its_robot_shows_its_restarts_and_keeps_running() {
    let env = Env::start(&[("r1", &["kind=test"])]).await;
    let counter = env.scratch.join("service-runs");
    // Crashes on its first two runs, then stays up.
    let script = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; [ $n -ge 3 ] || exit 7; echo $$ > {p}; exec sleep 600",
        c = counter.display(),
        p = env.scratch.join("service-pid").display()
    );
    let mut task = sh(&script, "1h");
    task["kind"] = serde_json::json!("service");
    task["restart"] = serde_json::json!({"attempts": 3, "interval": "10m", "delay": "200ms"});
    env.create_job(job_json(
        "svc",
        serde_json::json!([{ "name": "g", "count": 1, "task": task }]),
    ))
    .await;
    let status = eventually("the service running after two restarts", || async {
        let tasks = env
            .tasks()
            .list(&ListParams::default().labels(&format!("{LABEL_JOB}=svc")))
            .await
            .ok()?;
        let status = tasks.items.first()?.status.clone()?;
        (status.state == Some(TaskState::Running) && status.restarts.restart_count == 2).then_some(status)
    })
    .await;
    assert_eq!(
        status.attempt, 1,
        "restarts on the robot are not new attempts: {status:?}"
    );
    assert_eq!(status.restarts.last_exit_code, Some(7), "{status:?}");
    assert!(status.restarts.last_restart_time.is_some(), "{status:?}");
    let kubeconfig = kubeconfig_path(&env.data_dir);
    let out = kubectl(&kubeconfig, &["get", "rtask", "-n", "default"]);
    let header = out.lines().next().unwrap_or_default();
    let col = header
        .find("RESTARTS")
        .unwrap_or_else(|| panic!("no RESTARTS column:\n{out}"));
    let row = out
        .lines()
        .find(|l| l.starts_with("svc"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(row.get(col..col + 1), Some("2"), "{out}");
    // Restarts are Events, with the robot's reason (two quick ones may be
    // seen, and recorded, as one).
    let task_name = row.split_whitespace().next().unwrap_or_default().to_owned();
    eventually("the Restarted Events", || async {
        let out = kubectl(&kubeconfig, &["describe", "rtask", &task_name, "-n", "default"]);
        (out.contains("Restarted") && out.contains("exited with code 7")).then_some(())
    })
    .await;
    // A service never completes: its Job is running (the step from pending
    // to running may trail the task's by a second, docs/contract.md).
    eventually("the Job running", || async {
        let job = env.jobs().get("svc").await.ok()?;
        (job.status.and_then(|s| s.state) == Some(WorkState::Running)).then_some(())
    })
    .await;
    let pid = std::fs::read_to_string(env.scratch.join("service-pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok());
    env.stop().await;
    // Services outlive their agent (it would re-adopt them): end this one.
    if let Some(pid) = pid {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Sets the count of the Job's first group, retrying on a conflict.
async fn scale(env: &Env, job: &str, count: i32) {
    eventually(&format!("{job} scaled to {count}"), || async {
        let mut current = env.jobs().get(job).await.ok()?;
        current.spec.task_groups[0].count = Some(count);
        env.jobs()
            .replace(job, &PostParams::default(), &current)
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_a_group_down_then_up_replaces_its_tasks() {
    let env = Env::start(&[("r1", &["kind=test"]), ("r2", &["kind=test"])]).await;
    env.create_job(job_json(
        "scaled",
        serde_json::json!([{ "name": "g", "count": 3, "task": sh("echo ran $K8S4R_TASK_NAME", "1m") }]),
    ))
    .await;
    let first = env.wait_tasks_final("scaled", 3).await;
    let first_uid = |name: &str| first.iter().find(|t| t.name_any() == name).and_then(|t| t.uid());

    scale(&env, "scaled", 1).await;
    let left = eventually("the surplus tasks deleted", || async {
        let tasks = env.job_tasks("scaled").await;
        (tasks.len() == 1).then_some(tasks)
    })
    .await;
    assert_eq!(left[0].name_any(), "scaled-g-0");
    // The Job reports the new shape, for this generation.
    eventually("the job's status to count one task", || async {
        let job = env.jobs().get("scaled").await.ok()?;
        let status = job.status?;
        let current = status.observed_generation == job.metadata.generation;
        (current && status.counts.total == 1 && status.state == Some(WorkState::Completed)).then_some(())
    })
    .await;

    // Scaling back up recreates a Task under a name just deleted; the new
    // object is scheduled and runs like any other.
    scale(&env, "scaled", 2).await;
    let tasks = env.wait_tasks_final("scaled", 2).await;
    let again = tasks
        .iter()
        .find(|t| t.name_any() == "scaled-g-1")
        .expect("scaled-g-1 recreated");
    assert_ne!(again.uid(), first_uid("scaled-g-1"), "a new object");
    let status = again.status.as_ref().expect("status");
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    assert_eq!(status.attempt, 1, "a new object starts over: {status:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agents_task_is_rescheduled_and_completes_elsewhere() {
    let mut env = Env::start(&[("r1", &["pool=x"]), ("r2", &["pool=x"])]).await;
    let script = "echo start; sleep 4; echo finished on $K8S4R_TASK_NAME";
    // Moved once fenced: 5 s without contact, the kill timeout, the
    // server's Lease interval and the manager's grace after the last contact.
    env.create_job(job_json(
        "moved",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh(script, "1m"),
            "robotSelector": { "matchLabels": { "pool": "x" } },
            "disconnect": { "stopAfter": "5s" } }]),
    ))
    .await;
    let first = eventually("the task runs", || async {
        let t = env.job_tasks("moved").await.into_iter().next()?;
        let s = t.status?;
        (s.state == Some(TaskState::Running)).then_some(s.robot?)
    })
    .await;
    env.kill_agent(&first);
    env.wait_phase(&first, RobotPhase::Offline).await;

    let status = eventually("the task completed on another robot", || async {
        let s = env.job_tasks("moved").await.into_iter().next()?.status?;
        (s.state == Some(TaskState::Completed)).then_some(s)
    })
    .await;
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    let second = status.robot.clone().expect("a robot");
    assert_ne!(second, first, "{status:?}");
    assert!(status.attempt >= 2, "{status:?}");
    assert!(
        status
            .attempts
            .iter()
            .any(|a| a.robot.as_deref() == Some(first.as_str()) && a.reason == Some(TaskReason::RobotLost)),
        "{status:?}"
    );
    let job = eventually("the Job completed", || async {
        let s = env.jobs().get("moved").await.ok()?.status?;
        (s.state == Some(WorkState::Completed)).then_some(s)
    })
    .await;
    assert_eq!(job.completions.as_deref(), Some("1/1"));
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_job_cancels_its_processes() {
    let env = Env::start(&[("r1", &["kind=test"]), ("r2", &["kind=test"])]).await;
    let script = format!(
        "echo $$ > {}/${{K8S4R_TASK_NAME#*/}}.pid; sleep 300 & sleep 300; wait",
        env.scratch.display()
    );
    env.create_job(job_json(
        "doomed",
        serde_json::json!([{ "name": "g", "count": 2, "task": sh(&script, "10m") }]),
    ))
    .await;
    let names = eventually("two running tasks", || async {
        let tasks = env.job_tasks("doomed").await;
        let running = tasks
            .iter()
            .filter(|t| t.status.as_ref().and_then(|s| s.state) == Some(TaskState::Running))
            .count();
        (tasks.len() == 2 && running == 2).then(|| {
            tasks
                .iter()
                .map(|t| t.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        })
    })
    .await;
    let mut groups = Vec::new();
    for name in &names {
        let pid = read_pid(&env.scratch.join(format!("{name}.pid"))).await;
        groups.push(pgrp(pid).expect("the task's process lives"));
    }

    env.jobs()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete the Job");
    eventually("the tasks' processes are gone", || async {
        groups.iter().all(|g| group_members(*g).is_empty()).then_some(())
    })
    .await;
    eventually("the tasks are deleted", || async {
        env.job_tasks("doomed").await.is_empty().then_some(())
    })
    .await;
    eventually("the Job is deleted", || async {
        env.jobs().get_opt("doomed").await.ok()?.is_none().then_some(())
    })
    .await;
    env.stop().await;
}

/// A Job with `ttlSecondsAfterFinished` is deleted that long after it
/// completed, its TaskGroup and Tasks with it, and an `Expired` Event keeps
/// what it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_is_deleted_after_its_ttl_and_leaves_an_expired_event() {
    let env = Env::start(&[("r1", &["kind=test"])]).await;
    let mut job = job_json(
        "brief",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh("true", "1m") }]),
    );
    job["spec"]["ttlSecondsAfterFinished"] = serde_json::json!(2);
    env.create_job(job).await;
    let finished = eventually("the Job completed", || async {
        let status = env.jobs().get_opt("brief").await.ok()??.status?;
        (status.state == Some(WorkState::Completed)).then_some(status.completion_time?)
    })
    .await;
    assert_eq!(env.job_tasks("brief").await.len(), 1);

    let kubeconfig = kubeconfig_path(&env.data_dir);
    eventually("kubectl get says the Job is NotFound", || async {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "rjob", "brief", "-n", "default"])
            .output()
            .ok()?;
        let not_found = !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound");
        not_found.then_some(())
    })
    .await;
    let gone_at = jiff::Timestamp::now();
    assert!(
        gone_at >= finished + jiff::SignedDuration::from_secs(2),
        "deleted before its ttl: finished {finished}, gone at {gone_at}"
    );
    eventually("the TaskGroup and the Task are gone", || async {
        let group = groups_api(&env).get_opt("brief-g").await.ok()?;
        (group.is_none() && env.job_tasks("brief").await.is_empty()).then_some(())
    })
    .await;
    // The record outlives the Job.
    let line = eventually("the Expired Event", || async {
        let out = kubectl(&kubeconfig, &["get", "events", "-n", "default"]);
        out.lines()
            .find(|l| l.contains("Expired") && l.contains("brief"))
            .map(str::to_owned)
    })
    .await;
    assert!(line.contains("Normal"), "{line}");
    assert!(
        line.contains("completed job deleted 2s after it finished (ttlSecondsAfterFinished): 1 of 1 tasks succeeded, 0 failed, 0 cancelled"),
        "{line}"
    );
    env.stop().await;
}

/// The cell of `kubectl get` output `table` in the row named `name` and the
/// column headed `column` (cells without spaces), or "" when there is none.
fn cell(table: &str, name: &str, column: &str) -> String {
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    let Some(at) = header.iter().position(|c| *c == column) else {
        return String::new();
    };
    lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .and_then(|cells| cells.get(at).map(|c| (*c).to_owned()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_robots_jobs_and_tasks() {
    let env = Env::start(&[("r1", &["kind=test"]), ("r2", &["kind=test"])]).await;
    env.create_job(job_json(
        "seen",
        serde_json::json!([{ "name": "g", "count": 2, "task": sh("echo hi", "1m") }]),
    ))
    .await;
    env.wait_tasks_final("seen", 2).await;
    let kubeconfig = kubeconfig_path(&env.data_dir);

    let robots = kubectl(&kubeconfig, &["get", "robots"]);
    for col in [
        "NAME",
        "PHASE",
        "CONNECTED",
        "SCHEDULABLE",
        "ARCH",
        "RUNNING",
        "HEARTBEAT",
        "AGE",
    ] {
        assert!(robots.contains(col), "robots lack {col}:\n{robots}");
    }
    for robot in ["r1", "r2"] {
        assert_eq!(cell(&robots, robot, "PHASE"), "Online", "{robots}");
        assert_eq!(cell(&robots, robot, "CONNECTED"), "True", "{robots}");
        assert_eq!(cell(&robots, robot, "SCHEDULABLE"), "true", "{robots}");
    }
    let patch = serde_json::json!({ "spec": { "unschedulable": true } });
    Api::<k8s4r_api::Robot>::all(env.client.clone())
        .patch("r2", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("cordon r2");
    eventually("kubectl shows r2 cordoned", || async {
        let out = kubectl(&kubeconfig, &["get", "robots"]);
        (cell(&out, "r2", "SCHEDULABLE") == "false" && cell(&out, "r1", "SCHEDULABLE") == "true")
            .then_some(())
    })
    .await;
    let wide = kubectl(&kubeconfig, &["get", "robots", "-o", "wide"]);
    assert!(cell(&wide, "r1", "DRIVERS").contains("exec"), "{wide}");
    let job = eventually("kubectl shows the Job completed", || async {
        let out = kubectl(&kubeconfig, &["get", "jobs.robot.k8s4r.io", "-n", "default"]);
        out.lines()
            .any(|l| l.starts_with("seen") && l.contains("completed") && l.contains("2/2"))
            .then_some(out)
    })
    .await;
    for col in ["STATE", "COMPLETIONS", "RUNNING", "FAILED"] {
        assert!(job.contains(col), "jobs lack {col}:\n{job}");
    }
    let tasks = kubectl(&kubeconfig, &["get", "tasks", "-n", "default"]);
    for col in ["STATE", "ROBOT", "ATTEMPT", "EXIT", "REASON"] {
        assert!(tasks.contains(col), "tasks lack {col}:\n{tasks}");
    }
    let done = tasks
        .lines()
        .filter(|l| l.starts_with("seen") && l.contains("completed"))
        .count();
    assert_eq!(done, 2, "{tasks}");
    for task in ["seen-g-0", "seen-g-1"] {
        let robot = cell(&tasks, task, "ROBOT");
        assert!(robot == "r1" || robot == "r2", "ROBOT is status.robot:\n{tasks}");
    }

    // What the manager and the server did, as `kubectl describe` tells it.
    // Events are published in the background, so they may trail the status.
    let steps = ["Scheduled", "Dispatched", "Started", "Completed"];
    let events = eventually("kubectl describe shows the task's Events", || async {
        let out = kubectl(&kubeconfig, &["describe", "rtask", "seen-g-0", "-n", "default"]);
        let events = out.split("\nEvents:").nth(1)?.to_owned();
        steps.iter().all(|r| events.contains(r)).then_some(events)
    })
    .await;
    let from = |reason: &str| {
        let line = events.lines().find(|l| l.contains(reason)).unwrap_or_default();
        ["k8s4r-manager", "k8s4r-server"]
            .into_iter()
            .find(|c| line.contains(c))
            .unwrap_or_else(|| panic!("no reporting program on {line:?}"))
    };
    assert_eq!(from("Scheduled"), "k8s4r-manager", "{events}");
    assert_eq!(from("Dispatched"), "k8s4r-server", "{events}");
    let dispatched = events.lines().filter(|l| l.contains("Dispatched")).count();
    assert_eq!(dispatched, 1, "one Dispatched Event per attempt:\n{events}");
    eventually("kubectl describe shows the Job's Completed Event", || async {
        let out = kubectl(&kubeconfig, &["describe", "rjob", "seen", "-n", "default"]);
        let events = out.split("\nEvents:").nth(1)?.to_owned();
        events.contains("all 2 tasks completed").then_some(())
    })
    .await;
    env.stop().await;
}

fn groups_api(env: &Env) -> Api<TaskGroup> {
    Api::namespaced(env.client.clone(), "default")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_job_waits_for_its_groups_and_skips_what_follows_a_failure() {
    let env = Env::start(&[("ord-1", &[]), ("ord-2", &[])]).await;
    let done = env.scratch.join("first-done");
    // Long enough to be seen running: a young Job's and group's status is
    // paced, written a second or two after their creation (docs/contract.md,
    // "What a task costs").
    let first = format!("sleep 6; touch {}", done.display());
    // The second group fails unless the first one finished before it started.
    let second = format!("test -e {} || echo STARTED-EARLY; exit 3", done.display());
    let mut job = job_json(
        "ordered",
        serde_json::json!([
            { "name": "last", "count": 1, "task": sh("true", "1m"), "after": ["second"] },
            { "name": "first", "count": 1, "task": sh(&first, "1m") },
            { "name": "second", "count": 1, "task": sh(&second, "1m") },
        ]),
    );
    job["spec"]["order"] = serde_json::json!(["first", "second"]);
    env.create_job(job).await;

    // While the first group runs, the others are not even created.
    let status = eventually("the first group running, the second waiting", || async {
        let s = env.jobs().get("ordered").await.ok()?.status?;
        let second = s.groups.iter().find(|g| g.name == "second")?;
        let running = env
            .job_tasks("ordered")
            .await
            .iter()
            .any(|t| t.status.as_ref().and_then(|s| s.state) == Some(TaskState::Running));
        (running && second.message.as_deref() == Some("waits for first")).then_some(s)
    })
    .await;
    let last = status.groups.iter().find(|g| g.name == "last").expect("last");
    assert_eq!(last.message.as_deref(), Some("waits for second"));
    assert!(groups_api(&env)
        .get_opt("ordered-second")
        .await
        .unwrap()
        .is_none());

    let job = eventually("the Job failed", || async {
        let job = env.jobs().get("ordered").await.ok()?;
        (job.status.as_ref()?.state == Some(WorkState::Failed)).then_some(job)
    })
    .await;
    let status = job.status.expect("status");
    let state = |g: &str| status.groups.iter().find(|s| s.name == g).and_then(|s| s.state);
    assert_eq!(state("first"), Some(WorkState::Completed));
    assert_eq!(state("second"), Some(WorkState::Failed));
    assert_eq!(state("last"), Some(WorkState::Skipped));
    let last = status.groups.iter().find(|g| g.name == "last").expect("last");
    assert_eq!(last.message.as_deref(), Some("skipped: group second failed"));
    let failed = k8s4r_api::condition::find_condition(&status.conditions, "Failed").expect("Failed");
    assert_eq!(failed.reason.as_deref(), Some("GroupFailed"));
    assert_eq!(
        failed.message.as_deref(),
        Some("group second failed; skipped: last")
    );
    assert!(groups_api(&env).get_opt("ordered-last").await.unwrap().is_none());
    let tasks = env.job_tasks("ordered").await;
    assert_eq!(tasks.len(), 2, "the skipped group got no task");
    let second_tail = tasks
        .iter()
        .find(|t| t.name_any() == "ordered-second-0")
        .and_then(|t| t.status.as_ref()?.output_tail.clone())
        .unwrap_or_default();
    assert!(!second_tail.contains("STARTED-EARLY"), "{second_tail}");

    // A circle of groups is refused at `kubectl apply`, with the circle named.
    let cyclic = env.dir.path().join("cyclic.yaml");
    std::fs::write(
        &cyclic,
        "apiVersion: robot.k8s4r.io/v1alpha1\nkind: Job\nmetadata: {name: cyclic, namespace: default}\n\
         spec:\n  taskGroups:\n  - {name: a, count: 1, after: [b], task: {driver: raw_exec, command: /bin/true}}\n\
         \x20 - {name: b, count: 1, after: [a], task: {driver: raw_exec, command: /bin/true}}\n",
    )
    .expect("write the manifest");
    let kubeconfig = kubeconfig_path(&env.data_dir);
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "-f"])
        .arg(&cyclic)
        .output()
        .expect("run kubectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kubectl apply took a cyclic Job");
    assert!(
        stderr.contains("admission webhook \"validate.robot.k8s4r.io\" denied the request")
            && stderr.contains("the groups wait for each other in a circle: a -> b -> a"),
        "{stderr}"
    );
    assert!(
        env.jobs().get_opt("cyclic").await.unwrap().is_none(),
        "not stored"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_job_reaches_a_robot_that_registers_later_and_stops_at_max_failed() {
    let mut env = Env::start(&[("fl-1", &["fleet=yes"]), ("fl-2", &["fleet=yes"]), ("other", &[])]).await;
    let mut job = job_json(
        "rollout",
        serde_json::json!([{
            "name": "update", "mode": "everyRobot", "maxParallel": 1,
            // Long enough for the group's paced first status to show it.
            "task": sh("sleep 4", "1m"),
        }]),
    );
    job["spec"]["robotSelector"] = serde_json::json!({ "matchLabels": { "fleet": "yes" } });
    env.create_job(job).await;
    // One robot at a time: the second waits while the first runs.
    eventually("the first robot's task running, one robot waiting", || async {
        let s = groups_api(&env).get("rollout-update").await.ok()?.status?;
        let r = s.rollout?;
        (r.robots == 2 && r.started == 1 && r.waiting == 1).then_some(())
    })
    .await;
    env.spawn_agent("fl-3", &["fleet=yes"]);
    env.wait_phase("fl-3", RobotPhase::Online).await;
    let tasks = env.wait_tasks_final("rollout", 3).await;
    let robots: BTreeSet<String> = tasks
        .iter()
        .map(|t| {
            t.status
                .as_ref()
                .and_then(|s| s.robot.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        robots,
        BTreeSet::from(["fl-1".into(), "fl-2".into(), "fl-3".into()])
    );
    for t in &tasks {
        assert_eq!(
            t.status.as_ref().and_then(|s| s.state),
            Some(TaskState::Completed)
        );
    }
    let job = env
        .jobs()
        .get("rollout")
        .await
        .expect("job")
        .status
        .expect("status");
    assert_eq!(job.state, Some(WorkState::Completed));
    assert_eq!(job.completions.as_deref(), Some("3/3"));
    let rollout = groups_api(&env)
        .get("rollout-update")
        .await
        .expect("group")
        .status
        .and_then(|s| s.rollout)
        .expect("rollout");
    assert_eq!(rollout.per_robot.len(), 3);
    assert!(rollout.per_robot.values().all(|s| *s == TaskState::Completed));

    // A rollout whose every task fails stops after maxFailed.
    let mut risky = job_json(
        "risky",
        serde_json::json!([{
            "name": "update", "mode": "everyRobot", "maxParallel": 1, "maxFailed": 0,
            "task": sh("exit 1", "1m"),
        }]),
    );
    risky["spec"]["robotSelector"] = serde_json::json!({ "matchLabels": { "fleet": "yes" } });
    env.create_job(risky).await;
    let status = eventually("the risky rollout stopped and failed", || async {
        let s = env.jobs().get("risky").await.ok()?.status?;
        (s.state == Some(WorkState::Failed)).then_some(s)
    })
    .await;
    let group = status.groups.first().expect("group");
    assert!(
        group
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("rollout stopped"),
        "{group:?}"
    );
    assert_eq!(
        env.job_tasks("risky").await.len(),
        1,
        "no robot after the failure"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_job_with_forbid_never_overlaps_a_slow_run() {
    let env = Env::start(&[("cron-1", &[])]).await;
    let lock = env.scratch.join("running");
    let overlap = env.scratch.join("overlap");
    let script = format!(
        "mkdir {lock} 2>/dev/null || echo overlap >> {overlap}; sleep 3; rmdir {lock}",
        lock = lock.display(),
        overlap = overlap.display()
    );
    let periodic: k8s4r_api::PeriodicJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1",
        "kind": "PeriodicJob",
        "metadata": { "name": "tick", "namespace": "default" },
        "spec": {
            "schedule": "*/1 * * * * *",
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 2,
            "jobTemplate": { "spec": { "taskGroups": [
                { "name": "work", "count": 1, "task": sh(&script, "1m") }
            ] } },
        },
    }))
    .expect("a valid PeriodicJob");
    let api: Api<k8s4r_api::PeriodicJob> = Api::namespaced(env.client.clone(), "default");
    api.create(&PostParams::default(), &periodic)
        .await
        .expect("create");
    let runs = || async {
        env.jobs()
            .list(&ListParams::default().labels("robot.k8s4r.io/periodic-job=tick"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    };
    // Every second a run is due, each runs 3 s: with Forbid they queue.
    let most_active = std::sync::atomic::AtomicUsize::new(0);
    eventually("two runs completed", || async {
        let jobs = runs().await;
        let active = jobs
            .iter()
            .filter(|j| {
                !j.status
                    .as_ref()
                    .and_then(|s| s.state)
                    .is_some_and(WorkState::is_finished)
            })
            .count();
        most_active.fetch_max(active, std::sync::atomic::Ordering::Relaxed);
        let status = api.get("tick").await.ok()?.status?;
        (status.last_successful_time.is_some() && jobs.len() >= 2 && status.active_count <= 1)
            .then_some(())?;
        let completed = jobs
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.state) == Some(WorkState::Completed))
            .count();
        (completed >= 2).then_some(())
    })
    .await;
    let most_active = most_active.into_inner();
    assert!(most_active <= 1, "{most_active} runs were active at once");
    assert!(!overlap.exists(), "two runs' processes overlapped");
    api.delete("tick", &DeleteParams::background())
        .await
        .expect("delete");
    env.stop().await;
}

/// A person's retry of a failed task of an old run of a PeriodicJob that
/// forbids overlapping runs, while a newer run is active: refused and said
/// why, the task left failed (its new attempt would run beside the active
/// run). The randomized fault run found such retries making runs overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_never_makes_a_forbid_periodic_jobs_runs_overlap() {
    let env = Env::start(&[("pr-1", &[])]).await;
    let first = env.scratch.join("first");
    // The first run fails at once; every later one runs 30 s.
    let script = format!(
        "if [ ! -e {f} ]; then touch {f}; exit 1; fi; sleep 30",
        f = first.display()
    );
    let periodic: k8s4r_api::PeriodicJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1",
        "kind": "PeriodicJob",
        "metadata": { "name": "gate", "namespace": "default" },
        "spec": {
            "schedule": "*/1 * * * * *",
            "concurrencyPolicy": "Forbid",
            "jobTemplate": { "spec": { "taskGroups": [
                { "name": "work", "count": 1, "task": sh(&script, "1m") }
            ] } },
        },
    }))
    .expect("a valid PeriodicJob");
    let api: Api<k8s4r_api::PeriodicJob> = Api::namespaced(env.client.clone(), "default");
    api.create(&PostParams::default(), &periodic)
        .await
        .expect("create");
    let (failed, active) = eventually("a failed run, and a later one running", || async {
        let jobs = env
            .jobs()
            .list(&ListParams::default().labels("robot.k8s4r.io/periodic-job=gate"))
            .await
            .ok()?
            .items;
        let state = |j: &Job| j.status.as_ref().and_then(|s| s.state);
        let failed = jobs.iter().find(|j| state(j) == Some(WorkState::Failed))?;
        let active = jobs
            .iter()
            .find(|j| !state(j).is_some_and(WorkState::is_finished))?;
        let running = env
            .job_tasks(&active.name_any())
            .await
            .into_iter()
            .any(|t| t.status.and_then(|s| s.state) == Some(TaskState::Running));
        running.then(|| (failed.name_any(), active.name_any()))
    })
    .await;
    let task = format!("{failed}-work-0");
    let patch = serde_json::json!({ "metadata": { "annotations": {
        "robot.k8s4r.io/retry": "now",
    }}});
    env.tasks()
        .patch(&task, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the retry is asked for");
    let status = eventually("the retry recorded", || async {
        let s = env.tasks().get(&task).await.ok()?.status?;
        s.retry.is_some().then_some(s)
    })
    .await;
    let retry = status.retry.clone().unwrap();
    assert!(retry.noop, "the retry was carried out: {status:?}");
    let message = retry.message.unwrap_or_default();
    assert!(
        message.contains(&active) && message.contains("Forbid"),
        "{message}"
    );
    assert_eq!(status.state, Some(TaskState::Failed), "{status:?}");
    assert_eq!(status.attempt, 1, "{status:?}");
    api.delete("gate", &DeleteParams::background())
        .await
        .expect("delete");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_affinity_places_one_task_per_robot_and_leaves_the_rest_pending() {
    let env = Env::start(&[("aa-1", &[]), ("aa-2", &[])]).await;
    env.create_job(job_json(
        "spread",
        serde_json::json!([{
            "name": "guard", "count": 3, "antiAffinity": {},
            "task": sh("sleep 30", "1m"),
        }]),
    ))
    .await;
    let (running, pending) = eventually("two running on two robots, one pending", || async {
        let tasks = env.job_tasks("spread").await;
        let running: Vec<&Task> = tasks
            .iter()
            .filter(|t| t.status.as_ref().and_then(|s| s.state) == Some(TaskState::Running))
            .collect();
        let pending: Vec<&Task> = tasks
            .iter()
            .filter(|t| {
                let s = t.status.as_ref();
                s.and_then(|s| s.state) == Some(TaskState::Pending)
                    && s.and_then(|s| s.message.as_deref()).is_some()
            })
            .collect();
        (running.len() == 2 && pending.len() == 1).then(|| {
            let robots: BTreeSet<String> = running
                .iter()
                .filter_map(|t| t.status.as_ref()?.robot.clone())
                .collect();
            let message = pending[0].status.as_ref().and_then(|s| s.message.clone());
            (robots, message.unwrap_or_default())
        })
    })
    .await;
    assert_eq!(running.len(), 2, "one task per robot: {running:?}");
    assert_eq!(
        pending,
        "0/2 robots: 2 already run a task of this group (anti-affinity)"
    );
    env.jobs()
        .delete("spread", &DeleteParams::background())
        .await
        .expect("delete");
    env.stop().await;
}

/// A person's retry through `kubectl annotate`: a failed task runs again
/// with its retry budget counted afresh, and the same value acts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_annotate_retries_a_failed_task_once_per_value() {
    let env = Env::start(&[("rt-1", &[])]).await;
    let runs = env.scratch.join("runs");
    // Fails on its first two runs, succeeds on the third.
    let script = format!(
        "echo run >> {runs}; [ $(wc -l < {runs}) -ge 3 ]",
        runs = runs.display()
    );
    env.create_job(job_json(
        "flaky",
        serde_json::json!([{ "name": "w", "count": 1, "task": sh(&script, "1m") }]),
    ))
    .await;
    let tasks = env.tasks();
    let failed = |attempt: u32| {
        let tasks = tasks.clone();
        async move {
            eventually(&format!("attempt {attempt} failed for good"), || async {
                let s = tasks.get("flaky-w-0").await.ok()?.status?;
                (s.state == Some(TaskState::Failed) && s.attempt == attempt).then_some(s)
            })
            .await
        }
    };
    failed(1).await;
    let kubeconfig = kubeconfig_path(&env.data_dir);
    let annotate = |value: &str| {
        kubectl(
            &kubeconfig,
            &[
                "annotate",
                "--overwrite",
                "-n",
                "default",
                "rtask",
                "flaky-w-0",
                &format!("robot.k8s4r.io/retry={value}"),
            ],
        )
    };
    annotate("first");
    let status = failed(2).await;
    let retry = status.retry.expect("the retry is recorded");
    assert_eq!(retry.value, "first");
    assert_eq!(retry.by.as_deref(), Some("kubectl-annotate"), "{retry:?}");
    assert_eq!(status.attempts.len(), 1, "attempt 1 kept in the history");
    // The same value again (a no-op write, then a real one with an
    // unrelated annotation) does not retry.
    annotate("first");
    kubectl(
        &kubeconfig,
        &["annotate", "-n", "default", "rtask", "flaky-w-0", "note=hello"],
    );
    tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let s = env.tasks().get("flaky-w-0").await.unwrap().status.unwrap();
            assert_eq!(s.attempt, 2, "the same value acted twice: {s:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_err();
    annotate("second");
    let done = eventually("attempt 3 completed", || async {
        let s = env.tasks().get("flaky-w-0").await.ok()?.status?;
        (s.state == Some(TaskState::Completed)).then_some(s)
    })
    .await;
    assert_eq!(done.attempt, 3);
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 3);
    let job = eventually("the Job completed", || async {
        let s = env.jobs().get("flaky").await.ok()?.status?;
        (s.state == Some(WorkState::Completed)).then_some(s)
    })
    .await;
    assert_eq!(job.completions.as_deref(), Some("1/1"));
    env.stop().await;
}

/// `k8s4r cancel job/NAME`: every process of the running Job is gone, its
/// Tasks stay, cancelled, with who asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_stops_its_processes_and_keeps_its_history() {
    let env = Env::start(&[("cx-1", &[]), ("cx-2", &[])]).await;
    let pids = env.scratch.join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let script = format!("echo $$ > {}/$K8S4R_TASK_UID; exec sleep 300", pids.display());
    env.create_job(job_json(
        "long",
        serde_json::json!([
            { "name": "a", "count": 2, "task": sh(&script, "10m") },
            { "name": "b", "count": 1, "task": sh("true", "1m"), "after": ["a"] },
        ]),
    ))
    .await;
    let running: Vec<i32> = eventually("two tasks running with their pids written", || async {
        let tasks = env.job_tasks("long").await;
        let running: Vec<&Task> = tasks
            .iter()
            .filter(|t| t.status.as_ref().and_then(|s| s.state) == Some(TaskState::Running))
            .collect();
        if running.len() < 2 {
            return None;
        }
        let pids: Vec<i32> = running
            .iter()
            .filter_map(|t| {
                let uid = t.metadata.uid.clone()?;
                std::fs::read_to_string(pids.join(uid)).ok()?.trim().parse().ok()
            })
            .collect();
        (pids.len() == 2).then_some(pids)
    })
    .await;
    let args = k8s4r::operate::ManualArgs {
        target: Some("job/long".into()),
        job: None,
        group: None,
        no_wait: false,
        timeout: Duration::from_secs(30),
        kube: k8s4r::operate::KubeArgs {
            kubeconfig: Some(kubeconfig_path(&env.data_dir)),
            context: None,
            namespace: Some("default".into()),
        },
    };
    k8s4r::operate::run(k8s4r::operate::Manual::Cancel, args, &env.data_dir)
        .await
        .expect("k8s4r cancel");
    let tasks = eventually("both tasks cancelled", || async {
        let tasks = env.job_tasks("long").await;
        tasks
            .iter()
            .all(|t| t.status.as_ref().and_then(|s| s.state) == Some(TaskState::Cancelled))
            .then_some(tasks)
    })
    .await;
    assert_eq!(tasks.len(), 2, "the tasks stay, and group b never started");
    for t in &tasks {
        let s = t.status.as_ref().unwrap();
        let c = s.cancellation.as_ref().expect("recorded");
        assert_eq!(c.by.as_deref(), Some("apiserver-lite:admin"), "{c:?}");
        assert!(
            s.message
                .as_deref()
                .unwrap_or_default()
                .starts_with("cancelled by apiserver-lite:admin"),
            "{s:?}"
        );
    }
    for pid in running {
        eventually(&format!("process {pid} gone"), || async {
            (!Path::new(&format!("/proc/{pid}")).exists() || pgrp(pid).is_none()).then_some(())
        })
        .await;
    }
    let job = eventually("the Job cancelled", || async {
        let s = env.jobs().get("long").await.ok()?.status?;
        (s.state == Some(WorkState::Cancelled)).then_some(s)
    })
    .await;
    let b = job.groups.iter().find(|g| g.name == "b").unwrap();
    assert_eq!(b.state, Some(WorkState::Skipped));
    assert_eq!(b.message.as_deref(), Some("skipped: the Job was cancelled"));
    env.stop().await;
}

/// Reads a whole log answer (until the stream ends), with the notice.
async fn read_log(client: &kube::Client, task: &str, query: &str) -> (Option<String>, String) {
    use futures::StreamExt;
    let mut reading = k8s4r::logs::open(client, "default", task, query)
        .await
        .expect("the logs API answers");
    let mut text = Vec::new();
    while let Some(chunk) = reading.body.next().await {
        text.extend_from_slice(&chunk.expect("the stream holds"));
    }
    (reading.notice, String::from_utf8_lossy(&text).into_owned())
}

/// `k8s4r logs -f` against real agents: lines arrive within a second of
/// being written and the stream ends with the task; a finished task's log
/// is read whole, across its rotated files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_follow_live_and_read_whole_after_rotation() {
    use futures::StreamExt;
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with("lg-1", &[], &["--log-max-bytes", "8192", "--log-max-files", "3"]);
    env.wait_phase("lg-1", RobotPhase::Online).await;
    let live = "for i in $(seq 1 15); do echo \"$(date +%s%3N) line $i\"; sleep 0.2; done";
    env.create_job(job_json(
        "live",
        serde_json::json!([{ "name": "t", "count": 1, "task": sh(live, "1m") }]),
    ))
    .await;
    eventually("the task running", || async {
        let s = env.tasks().get("live-t-0").await.ok()?.status?;
        (s.state == Some(TaskState::Running)).then_some(())
    })
    .await;
    let mut reading = k8s4r::logs::open(&env.client, "default", "live-t-0", "follow=true")
        .await
        .expect("follow");
    assert_eq!(reading.notice, None);
    assert_eq!(reading.robot.as_deref(), Some("lg-1"));
    // Lines written before the follow began come at once with it; only
    // those written since are timed.
    let opened = jiff::Timestamp::now().as_millisecond();
    let mut live = 0;
    let mut partial = String::new();
    let mut lines = Vec::new();
    let mut worst = 0i64;
    let followed = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = reading.body.next().await {
            partial.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            let now = jiff::Timestamp::now().as_millisecond();
            while let Some(end) = partial.find('\n') {
                let line: String = partial.drain(..=end).collect();
                let written: i64 = line
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .expect("a timestamp");
                if written >= opened {
                    live += 1;
                    worst = worst.max(now - written);
                }
                lines.push(line.trim().split_once(' ').unwrap().1.to_owned());
            }
        }
    })
    .await;
    assert!(followed.is_ok(), "the follow did not end with the task");
    let expected: Vec<String> = (1..=15).map(|i| format!("line {i}")).collect();
    assert_eq!(lines, expected);
    assert!(live >= 5, "only {live} lines were written while followed");
    assert!(
        worst < 1000,
        "a line took {worst} ms from the robot's file to the reader"
    );

    let chatty = "for i in $(seq 1 400); do printf '%05d %090d\\n' $i 0; done";
    env.create_job(job_json(
        "chatty",
        serde_json::json!([{ "name": "t", "count": 1, "task": sh(chatty, "1m") }]),
    ))
    .await;
    env.wait_tasks_final("chatty", 1).await;
    let (notice, text) = read_log(&env.client, "chatty-t-0", "").await;
    assert_eq!(notice, None);
    // The oldest file may start inside a line (rotation cuts by size).
    let numbers: Vec<u32> = text
        .lines()
        .filter(|l| l.len() == 96)
        .map(|l| l[..5].parse().expect("numbered"))
        .collect();
    assert_eq!(numbers.last(), Some(&400), "ends with the last line");
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "contiguous, oldest first: {:?}",
        &numbers[..5]
    );
    assert!(
        numbers.len() > 8192 / 96 + 1,
        "more than the current file holds: {} lines",
        numbers.len()
    );
    assert!(numbers[0] > 1, "the oldest output is gone with the rotation");
    let (_, tail) = read_log(&env.client, "chatty-t-0", "tailLines=3").await;
    assert_eq!(
        tail.lines().map(|l| &l[..5]).collect::<Vec<_>>(),
        ["00398", "00399", "00400"]
    );
    env.stop().await;
}

/// A robot that is offline is said so at once, with the last output the
/// cluster has; a user without `get` on `tasks/log` is refused until a
/// RoleBinding gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_of_an_offline_robot_and_for_a_user_without_permission() {
    let mut env = Env::start(&[("off-1", &[])]).await;
    env.create_job(job_json(
        "said",
        serde_json::json!([{ "name": "t", "count": 1, "task": sh("echo hello from the robot", "1m") }]),
    ))
    .await;
    env.wait_tasks_final("said", 1).await;
    let (notice, text) = read_log(&env.client, "said-t-0", "").await;
    assert_eq!(notice, None, "read live from the robot");
    assert_eq!(text, "hello from the robot\n");

    let bob = env.stack.as_ref().unwrap().client_as("bob", &[]).await.unwrap();
    let refused = k8s4r::logs::open(&bob, "default", "said-t-0", "")
        .await
        .err()
        .expect("refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains("you may not read the logs of task said-t-0"),
        "{message}"
    );
    let kubeconfig = kubeconfig_path(&env.data_dir);
    kubectl(
        &kubeconfig,
        &[
            "create",
            "rolebinding",
            "bob-logs",
            "-n",
            "default",
            "--clusterrole=k8s4r-log-reader",
            "--user=bob",
        ],
    );

    env.kill_agent("off-1");
    env.wait_phase("off-1", RobotPhase::Offline).await;
    let started = std::time::Instant::now();
    let (notice, text) = read_log(&bob, "said-t-0", "").await;
    assert!(started.elapsed() < Duration::from_secs(3), "said at once");
    let notice = notice.expect("a notice");
    assert!(notice.contains("robot off-1 is offline"), "{notice}");
    assert!(text.contains("hello from the robot"), "the output tail: {text:?}");
    env.stop().await;
}
