//! End-to-end: what the cluster says about work that waits, read as a
//! person reads it (`kubectl get`, `describe`, Events), and a robot whose
//! agent is gone after a restart of the cluster side, on the whole stack
//! with real agent processes and a real Mosquitto.

use std::time::Duration;

use k8s4r::up::kubeconfig_path;
use k8s4r_api::names::{CONDITION_FAILED, CONDITION_SCHEDULED};
use k8s4r_api::{ConditionStatus, RobotPhase, TaskGroup, TaskReason, TaskState, WorkState};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::Api;

mod support;
use support::*;

/// The notes of the Events with `reason` about the object `name`.
async fn event_notes(env: &Env, name: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let Ok(list) = events.list(&ListParams::default()).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

fn exec_true() -> serde_json::Value {
    serde_json::json!({ "driver": "exec", "command": "/bin/true", "timeout": "1m" })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_waiting_for_a_driver_says_which_and_the_agent_setting_that_offers_it() {
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with("plain", &[], &["--raw-exec", "false"]);
    env.wait_phase("plain", RobotPhase::Online).await;
    let lacking = "1 lack driver raw_exec (agent setting raw_exec = true / --raw-exec true";

    // A count group: the Task waits, REASON Unschedulable, the message and
    // a FailedScheduling Event name the driver and the setting.
    env.create_job(job_json(
        "one",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh("true", "1m") }]),
    ))
    .await;
    let task = eventually("the task waiting, saying why", || async {
        let task = env.job_tasks("one").await.pop()?;
        let status = task.status.as_ref()?;
        (status.reason == Some(TaskReason::Unschedulable)).then_some(task)
    })
    .await;
    let status = task.status.clone().unwrap_or_default();
    assert!(status.robot.is_none(), "{status:?}");
    assert!(
        status.message.as_deref().is_some_and(|m| m.contains(lacking)),
        "{status:?}"
    );
    let name = task.metadata.name.clone().unwrap_or_default();
    let kubeconfig = kubeconfig_path(&env.data_dir);
    let table = kubectl(&kubeconfig, &["get", "rtask", &name, "-n", "default"]);
    assert!(
        table.contains("REASON") && table.contains("Unschedulable"),
        "{table}"
    );
    let described = kubectl(&kubeconfig, &["describe", "rtask", &name, "-n", "default"]);
    assert!(described.contains("lack driver raw_exec"), "{described}");
    eventually("a FailedScheduling Event naming the driver", || async {
        let notes = event_notes(&env, &name, "FailedScheduling").await;
        notes.iter().any(|n| n.contains(lacking)).then_some(())
    })
    .await;

    // An everyRobot group no robot matches: the TaskGroup's condition and
    // one Event say why, and so does the Job.
    env.create_job(job_json(
        "fleet",
        serde_json::json!([{ "name": "update", "mode": "everyRobot", "task": sh("true", "1m") }]),
    ))
    .await;
    let groups: Api<TaskGroup> = Api::namespaced(env.client.clone(), "default");
    let condition = eventually("the group's Scheduled=False condition", || async {
        let status = groups.get("fleet-update").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_SCHEDULED && c.status == ConditionStatus::False)
    })
    .await;
    assert_eq!(condition.reason.as_deref(), Some("NoMatchingRobot"));
    assert!(
        condition.message.as_deref().is_some_and(|m| m.contains(lacking)),
        "{condition:?}"
    );
    eventually("the Job saying why its group waits", || async {
        let status = env.jobs().get("fleet").await.ok()?.status?;
        let message = status.groups.first()?.message.clone()?;
        message.contains(lacking).then_some(())
    })
    .await;
    let notes = eventually("a NoMatchingRobot Event", || async {
        let notes = event_notes(&env, "fleet-update", "NoMatchingRobot").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(notes.iter().all(|n| n.contains(lacking)), "{notes:?}");
    let described = kubectl(
        &kubeconfig,
        &["describe", "taskgroup", "fleet-update", "-n", "default"],
    );
    assert!(described.contains("NoMatchingRobot"), "{described}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_of_the_cluster_side_a_robot_without_its_agent_is_not_online() {
    let mut env = Env::start_persistent(&[("vm", &[])]).await;
    // The cluster side stops first, then the agent, as a Ctrl-C of
    // `k8s4r up` stops both: no server hears the agent go.
    let stack = env.stack.take();
    if let Some(stack) = stack {
        let _ = stack.stop().await;
    }
    env.kill_agent("vm");
    env.restart_cluster().await;

    // The broker has no connection from vm: it is not Online for long
    // (its heartbeat timeout is five minutes).
    let robots: Api<k8s4r_api::Robot> = Api::all(env.client.clone());
    k8s4r_testbed::eventually(
        Duration::from_secs(30),
        "robot vm offline after the restart",
        || async {
            let robot = robots.get("vm").await.ok()?;
            (robot.status?.phase? == RobotPhase::Offline).then_some(())
        },
    )
    .await;

    // A new Job's task is not dispatched to it: it waits, saying why.
    env.create_job(job_json(
        "after",
        serde_json::json!([{ "name": "g", "count": 1, "task": exec_true() }]),
    ))
    .await;
    let task = eventually("the new task waiting", || async {
        let task = env.job_tasks("after").await.pop()?;
        let status = task.status.as_ref()?;
        (status.reason == Some(TaskReason::Unschedulable)).then_some(task)
    })
    .await;
    let status = task.status.unwrap_or_default();
    assert!(status.robot.is_none(), "{status:?}");
    assert!(
        status.message.as_deref().is_some_and(|m| m.contains("offline")),
        "{status:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelled_selector_names_the_label_and_the_pending_deadline_fails_the_task() {
    let env = Env::start(&[("rb1", &["site=lab"])]).await;
    let mut job = job_json(
        "typo",
        serde_json::json!([{ "name": "g", "count": 1, "task": exec_true(),
            "robotSelector": { "matchLabels": { "sitee": "lab" } } }]),
    );
    job["spec"]["pendingDeadlineSeconds"] = serde_json::json!(3);
    env.create_job(job).await;
    let status = eventually("the task failed past its pending deadline", || async {
        let status = env.job_tasks("typo").await.pop()?.status?;
        (status.state == Some(TaskState::Failed)).then_some(status)
    })
    .await;
    assert_eq!(status.reason, Some(TaskReason::Unschedulable), "{status:?}");
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("pendingDeadlineSeconds (3s)")
            && message.contains(r#"no robot has label "sitee" (robots have "site")"#),
        "{message}"
    );
    eventually("the Job failed", || async {
        let state = env.jobs().get("typo").await.ok()?.status?.state?;
        (state == WorkState::Failed).then_some(())
    })
    .await;
    assert_eq!(
        env.job_tasks("typo")
            .await
            .pop()
            .and_then(|t| t.status)
            .map(|s| s.attempt),
        Some(status.attempt),
        "no retry of a task that waited past its deadline"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_active_deadline_fails_and_its_running_task_is_stopped() {
    let env = Env::start(&[("rb1", &[])]).await;
    let mut job = job_json(
        "bounded",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh("echo started; exec sleep 300", "10m") }]),
    );
    job["spec"]["activeDeadlineSeconds"] = serde_json::json!(6);
    env.create_job(job).await;
    eventually("the task runs", || async {
        let status = env.job_tasks("bounded").await.pop()?.status?;
        (status.state == Some(TaskState::Running)).then_some(())
    })
    .await;
    let status = eventually("the Job failed past its deadline", || async {
        let status = env.jobs().get("bounded").await.ok()?.status?;
        (status.state == Some(WorkState::Failed)).then_some(status)
    })
    .await;
    let failed = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_FAILED)
        .expect("a Failed condition");
    assert_eq!(
        (failed.status, failed.reason.as_deref()),
        (ConditionStatus::True, Some("DeadlineExceeded")),
        "{failed:?}"
    );
    // The Job fails only once its task ended on the robot.
    let task = env
        .job_tasks("bounded")
        .await
        .pop()
        .and_then(|t| t.status)
        .unwrap_or_default();
    assert_eq!(task.state, Some(TaskState::Cancelled), "{task:?}");
    assert!(
        serde_json::to_string(&task)
            .unwrap()
            .contains("activeDeadlineSeconds"),
        "the task says what stopped it: {task:?}"
    );
    eventually("a DeadlineExceeded Event", || async {
        let notes = event_notes(&env, "bounded", "DeadlineExceeded").await;
        (!notes.is_empty()).then_some(())
    })
    .await;
    env.stop().await;
}

/// A person's cancel and retry before the deadline: the retry runs the Job
/// for as long again, and the deadline then stops it, the person's old
/// cancel annotation still on the Job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_job_runs_for_its_deadline_again_and_then_fails() {
    let env = Env::start(&[("rb1", &[])]).await;
    let mut job = job_json(
        "again",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh("exec sleep 300", "10m") }]),
    );
    job["spec"]["activeDeadlineSeconds"] = serde_json::json!(8);
    env.create_job(job).await;
    let task_state = |want: TaskState| {
        let env = &env;
        async move {
            eventually(&format!("the task {want:?}"), || async {
                let status = env.job_tasks("again").await.pop()?.status?;
                (status.state == Some(want)).then_some(status)
            })
            .await
        }
    };
    task_state(TaskState::Running).await;
    let kubeconfig = kubeconfig_path(&env.data_dir);
    kubectl(
        &kubeconfig,
        &[
            "annotate",
            "rjob",
            "again",
            "robot.k8s4r.io/cancel=first",
            "-n",
            "default",
        ],
    );
    task_state(TaskState::Cancelled).await;
    kubectl(
        &kubeconfig,
        &[
            "annotate",
            "rjob",
            "again",
            "robot.k8s4r.io/retry=first",
            "-n",
            "default",
        ],
    );
    let retried = std::time::Instant::now();
    task_state(TaskState::Running).await;
    let status = eventually("the Job failed past its deadline", || async {
        let status = env.jobs().get("again").await.ok()?.status?;
        (status.state == Some(WorkState::Failed)).then_some(status)
    })
    .await;
    assert!(
        retried.elapsed() >= Duration::from_secs(7),
        "not before its deadline counted from the retry"
    );
    assert!(status.deadline_time.is_some(), "{status:?}");
    assert_eq!(
        env.job_tasks("again")
            .await
            .pop()
            .and_then(|t| t.status)
            .and_then(|s| s.state),
        Some(TaskState::Cancelled)
    );
    env.stop().await;
}
