//! The controllers against the embedded API server, over real HTTP with the
//! real kube client. Robots are simulated by writing their status.

mod common;

use std::time::Duration;

use common::*;
use k8s4r_api::condition::find_condition;
use k8s4r_api::names::{ANNOTATION_EVICT, LABEL_JOB};
use k8s4r_api::{
    ConditionStatus, FactOperator, FactRequirement, Job, LabelSelector, Robot, RobotPhase, Task, TaskGroup,
    TaskReason, TaskState, WorkState,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn job_fans_out_and_schedules_onto_matching_online_robots_only() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("lab-1").label("site", "lab").create(c).await;
    robot("lab-off")
        .label("site", "lab")
        .phase(Some(RobotPhase::Offline))
        .create(c)
        .await;
    robot("field-1").label("site", "field").create(c).await;
    let selector = LabelSelector::from_labels([("site", "lab")]);
    create_job(c, "fan", Some(selector), vec![group("g", 3)]).await;

    let groups: Api<TaskGroup> = Api::namespaced(c.clone(), NS);
    let tg = eventually(WAIT, "task group", || async {
        groups.get_opt("fan-g").await.ok().flatten()
    })
    .await;
    let owner = &tg.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("Job", Some(true)));
    assert_eq!(tg.labels().get(LABEL_JOB).map(String::as_str), Some("fan"));

    for i in 0..3 {
        let t = task_where(c, &format!("fan-g-{i}"), "dispatching", |t| {
            dispatching_on(t).is_some()
        })
        .await;
        assert_eq!(
            dispatching_on(&t),
            Some("lab-1"),
            "only lab-1 is Online and matches"
        );
        assert_eq!(t.spec.target_robot.as_deref(), Some("lab-1"));
        assert_eq!(t.status.as_ref().unwrap().attempt, 1);
        assert_eq!(t.owner_references()[0].name, "fan-g");
    }
    let jobs: Api<Job> = Api::namespaced(c.clone(), NS);
    eventually(WAIT, "job status counts", || async {
        let job = jobs.get("fan").await.ok()?;
        let s = job.status?;
        (s.counts.dispatching == 3 && s.state == Some(WorkState::Running) && s.groups.len() == 1)
            .then_some(())
    })
    .await;

    for i in 0..3 {
        let name = format!("fan-g-{i}");
        report(c, &name, TaskState::Running, None, None).await;
        report(c, &name, TaskState::Completed, None, Some(0)).await;
    }
    let done = eventually(WAIT, "job completed", || async {
        let s = jobs.get("fan").await.ok()?.status?;
        (s.state == Some(WorkState::Completed)).then_some(s)
    })
    .await;
    assert_eq!(done.completions.as_deref(), Some("3/3"));
    assert!(done.completion_time.is_some() && done.start_time.is_some());
    manager.stop().await;
}

#[tokio::test]
async fn a_group_spreads_across_robots() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    for name in ["r1", "r2", "r3"] {
        robot(name).create(c).await;
    }
    create_job(c, "spread", None, vec![group("g", 6)]).await;
    let mut per_robot = std::collections::BTreeMap::<String, u32>::new();
    for i in 0..6 {
        let t = task_where(c, &format!("spread-g-{i}"), "dispatching", |t| {
            dispatching_on(t).is_some()
        })
        .await;
        *per_robot
            .entry(dispatching_on(&t).unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        per_robot.values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2],
        "{per_robot:?}"
    );
    let robots: Api<Robot> = Api::all(c.clone());
    eventually(WAIT, "allocated written", || async {
        let r = robots.get("r1").await.ok()?;
        (r.status?.allocated?.tasks == 2).then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_full_robot_gets_no_more_and_waiting_tasks_say_why() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("small").cpu("2").create(c).await;
    robot("gone").phase(Some(RobotPhase::Offline)).create(c).await;
    create_job(c, "fit", None, vec![group("g", 3).cpu("1")]).await;

    let mut placed = 0;
    let mut waiting = None;
    for i in 0..3 {
        let name = format!("fit-g-{i}");
        let t = task_where(c, &name, "decided", |t| {
            dispatching_on(t).is_some()
                || t.status
                    .as_ref()
                    .and_then(|s| find_condition(&s.conditions, "Scheduled"))
                    .is_some()
        })
        .await;
        if dispatching_on(&t).is_some() {
            placed += 1;
        } else {
            waiting = Some((name, t));
        }
    }
    assert_eq!(placed, 2, "two 1-CPU tasks fill a 2-CPU robot");
    let (name, t) = waiting.expect("one task waits");
    let status = t.status.unwrap();
    assert_eq!(status.state, Some(TaskState::Pending));
    let cond = find_condition(&status.conditions, "Scheduled").unwrap();
    assert_eq!(cond.status, ConditionStatus::False);
    assert_eq!(
        cond.message.as_deref(),
        Some("0/2 robots: 1 offline, 1 insufficient cpu")
    );

    // A new robot is a reason to look again; no polling loop needed.
    robot("big").create(c).await;
    let t = task_where(c, &name, "placed on the new robot", |t| {
        dispatching_on(t).is_some()
    })
    .await;
    assert_eq!(dispatching_on(&t), Some("big"));
    manager.stop().await;
}

#[tokio::test]
async fn failed_attempts_are_retried_with_backoff_then_fail_for_good() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("r1").create(c).await;
    create_job(c, "retry", None, vec![group("g", 1).retries(1, "300ms")]).await;
    let name = "retry-g-0";
    task_where(c, name, "attempt 1", |t| dispatching_on(t).is_some()).await;
    report(c, name, TaskState::Running, None, None).await;
    report(c, name, TaskState::Failed, Some(TaskReason::Error), Some(3)).await;

    let t = task_where(c, name, "attempt 2 dispatched", |t| {
        dispatching_on(t).is_some() && t.status.as_ref().unwrap().attempt == 2
    })
    .await;
    let status = t.status.unwrap();
    assert_eq!(status.attempts.len(), 1);
    assert_eq!(status.attempts[0].exit_code, Some(3));
    assert_eq!(status.attempts[0].reason, Some(TaskReason::Error));
    let failed_at = status.attempts[0].finish_time.unwrap();
    let redispatched = status.dispatch_time.unwrap();
    assert!(
        redispatched.duration_since(failed_at) >= jiff::SignedDuration::from_millis(250),
        "backoff respected: {failed_at} -> {redispatched}"
    );

    report(c, name, TaskState::Failed, Some(TaskReason::Error), Some(3)).await;
    let jobs: Api<Job> = Api::namespaced(c.clone(), NS);
    eventually(WAIT, "job failed", || async {
        let s = jobs.get("retry").await.ok()?.status?;
        (s.state == Some(WorkState::Failed)).then_some(())
    })
    .await;
    let t = task(c, name).await.unwrap();
    assert_eq!(state_of(&t), Some(TaskState::Failed), "no retries left");
    assert_eq!(t.status.unwrap().attempt, 2);
    manager.stop().await;
}

/// A task with a start condition waits while no robot's facts meet it,
/// says which rule, and is placed as soon as a robot's facts change.
#[tokio::test]
async fn a_task_waits_for_a_robots_facts_and_starts_when_they_change() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("low").create(c).await;
    set_facts(c, "low", serde_json::json!({ "battery": 10 })).await;
    robot("gone").phase(Some(RobotPhase::Offline)).create(c).await;
    let mut g = group("g", 1);
    g.task.when = vec![FactRequirement {
        key: "battery".into(),
        operator: FactOperator::Gt,
        values: vec!["30".into()],
        ..FactRequirement::default()
    }];
    create_job(c, "facts", None, vec![g]).await;
    let name = "facts-g-0";
    let t = task_where(c, name, "waiting", |t| {
        t.status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, "Scheduled"))
            .is_some()
    })
    .await;
    let cond = find_condition(&t.status.as_ref().unwrap().conditions, "Scheduled").unwrap();
    assert_eq!(
        cond.message.as_deref(),
        Some("0/2 robots: 1 offline, 1 don't meet battery Gt 30")
    );

    let changed = std::time::Instant::now();
    set_facts(c, "low", serde_json::json!({ "battery": 80 })).await;
    let t = task_where(c, name, "placed", |t| dispatching_on(t).is_some()).await;
    let took = changed.elapsed();
    assert_eq!(dispatching_on(&t), Some("low"));
    assert!(
        took < Duration::from_secs(2),
        "placed {took:?} after the facts changed"
    );

    // The robot's fresher view refuses it: it waits again, no retry used.
    report(c, name, TaskState::Failed, Some(TaskReason::NotReady), None).await;
    set_facts(c, "low", serde_json::json!({ "battery": 5 })).await;
    let t = task_where(c, name, "pending again", |t| {
        t.status
            .as_ref()
            .is_some_and(|s| s.attempts.len() == 1 && s.state == Some(TaskState::Pending))
    })
    .await;
    assert_eq!(t.status.unwrap().attempts[0].reason, Some(TaskReason::NotReady));
    set_facts(c, "low", serde_json::json!({ "battery": 90 })).await;
    let t = task_where(c, name, "attempt 2", |t| {
        dispatching_on(t).is_some() && t.status.as_ref().unwrap().attempt == 2
    })
    .await;
    assert_eq!(dispatching_on(&t), Some("low"));
    manager.stop().await;
}

/// `k8s4r drain`'s eviction: recorded for the server, the attempt runs on
/// until its robot reports its end (here as an older agent does,
/// Cancelled), then the task runs elsewhere, never cancelled, no retry used.
#[tokio::test]
async fn an_evicted_task_runs_elsewhere_once_its_robot_stopped_it() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("a").create(c).await;
    create_job(c, "drain", None, vec![group("g", 1)]).await;
    let name = "drain-g-0";
    task_where(c, name, "dispatched", |t| dispatching_on(t).is_some()).await;
    report(c, name, TaskState::Running, None, None).await;
    robot("b").create(c).await;

    annotate_task(c, name, ANNOTATION_EVICT, "drain-1").await;
    let t = task_where(c, name, "eviction recorded", |t| {
        t.status.as_ref().is_some_and(|s| s.eviction.is_some())
    })
    .await;
    let status = t.status.unwrap();
    assert!(status.eviction_requested(), "what the server acts on");
    assert_eq!(status.eviction.as_ref().unwrap().attempt, 1);
    assert_eq!(status.state, Some(TaskState::Running), "nothing replaces it yet");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = task(c, name).await.unwrap();
    assert_eq!(
        (state_of(&t), t.status.unwrap().attempt),
        (Some(TaskState::Running), 1)
    );

    report(c, name, TaskState::Failed, Some(TaskReason::Cancelled), Some(143)).await;
    let t = task_where(c, name, "attempt 2 elsewhere", |t| {
        dispatching_on(t).is_some() && t.status.as_ref().unwrap().attempt == 2
    })
    .await;
    assert_eq!(dispatching_on(&t), Some("b"), "the drained robot is avoided");
    let status = t.status.unwrap();
    assert_eq!(status.attempts[0].reason, Some(TaskReason::Drained));
    assert!(!status.cancel_requested());
    manager.stop().await;
}

#[tokio::test]
async fn an_unacknowledged_dispatch_moves_to_another_robot_once_fenced() {
    let mut cfg = config();
    cfg.lifecycle.dispatch_timeout = Duration::from_secs(8);
    let (env, manager) = start(cfg).await;
    let c = &env.client;
    robot("a").create(c).await;
    robot("b").create(c).await;
    // The robot that got the dispatch goes quiet: it may have taken it, so
    // it is fenced (stopAfter 5 s + kill timeout 1 s after it was last
    // heard from), and it may still take it until the dispatch's deadline
    // (8 s), before the attempt moves.
    let fenced = fenced_group("g");
    create_job(c, "ack", None, vec![fenced]).await;
    let first = task_where(c, "ack-g-0", "attempt 1", |t| dispatching_on(t).is_some()).await;
    let first_robot = dispatching_on(&first).unwrap().to_owned();
    let other = if first_robot == "a" { "b" } else { "a" };
    let t = eventually(WAIT, "attempt 2 dispatched", || async {
        heartbeat(c, other).await;
        let t = task(c, "ack-g-0").await?;
        (dispatching_on(&t).is_some() && t.status.as_ref()?.attempt == 2).then_some(t)
    })
    .await;
    let status = t.status.as_ref().unwrap();
    // It never said it took the attempt: a dispatch timeout, not a robot
    // that stopped what it ran.
    assert_eq!(status.attempts[0].reason, Some(TaskReason::DispatchTimeout));
    assert_eq!(dispatching_on(&t), Some(other), "the silent robot is avoided");
    let deadline = first.status.as_ref().and_then(|s| s.dispatch_deadline).unwrap();
    let given_up = status.attempts[0].finish_time.unwrap();
    assert!(
        given_up >= deadline,
        "attempt 1 given up at {given_up}, before its deadline {deadline}, while its robot could still take it"
    );
    // Each attempt's Scheduled Event says where that attempt went (not one
    // series that keeps the first attempt's words).
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::namespaced(c.clone(), "default");
    let want = [
        format!("attempt 1 assigned to robot {first_robot}"),
        format!("attempt 2 assigned to robot {other}"),
    ];
    eventually(WAIT, "one Scheduled Event per attempt", || async {
        let list = events.list(&Default::default()).await.ok()?;
        let notes: Vec<String> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("ack-g-0"))
            .filter(|e| e.reason.as_deref() == Some("Scheduled"))
            .filter_map(|e| e.note)
            .collect();
        want.iter().all(|w| notes.contains(w)).then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn tasks_of_an_offline_robot_are_lost_and_rescheduled() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("a").create(c).await;
    let fenced = fenced_group("g");
    create_job(c, "lost", None, vec![fenced]).await;
    task_where(c, "lost-g-0", "dispatched to a", |t| {
        dispatching_on(t) == Some("a")
    })
    .await;
    report(c, "lost-g-0", TaskState::Running, None, None).await;
    robot("b").create(c).await;
    disconnect(c, "a").await;

    let robots: Api<Robot> = Api::all(c.clone());
    eventually(WAIT, "a offline", || async {
        let s = robots.get("a").await.ok()?.status?;
        (s.phase == Some(RobotPhase::Offline)).then_some(())
    })
    .await;
    let t = eventually(WAIT, "rescheduled on b", || async {
        // b is alive: the server records its heartbeats.
        heartbeat(c, "b").await;
        task(c, "lost-g-0")
            .await
            .filter(|t| dispatching_on(t) == Some("b"))
    })
    .await;
    let status = t.status.unwrap();
    assert_eq!(status.attempt, 2);
    assert_eq!(status.attempts[0].reason, Some(TaskReason::RobotLost));
    assert_eq!(status.attempts[0].robot.as_deref(), Some("a"));
    manager.stop().await;
}

#[tokio::test]
async fn a_silent_robot_hits_the_timeout_backstop() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("a").create(c).await;
    create_job(c, "slow", None, vec![group("g", 1).timeout("1s", "1s")]).await;
    task_where(c, "slow-g-0", "dispatched", |t| dispatching_on(t).is_some()).await;
    report(c, "slow-g-0", TaskState::Running, None, None).await;
    let t = task_where(c, "slow-g-0", "backstop", |t| {
        state_of(t) == Some(TaskState::Failed)
    })
    .await;
    let status = t.status.unwrap();
    assert_eq!(status.reason, Some(TaskReason::TimeoutBackstop));
    let ran = status
        .finish_time
        .unwrap()
        .duration_since(status.start_time.unwrap());
    assert!(
        ran >= jiff::SignedDuration::from_millis(2200),
        "timeout + kill + grace: {ran:?}"
    );
    manager.stop().await;
}

#[tokio::test]
async fn registrations_are_approved_by_token_and_rejected_otherwise() {
    let mut cfg = config();
    cfg.auto_approve = false;
    let (env, manager) = start(cfg).await;
    let c = &env.client;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "k8s4r-system");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("k8s4r-bootstrap-tokens".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                "fleet".to_string(),
                k8s_openapi::ByteString(b"s3cret-token\n".to_vec()),
            )]
            .into(),
        ),
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let good = k8s4r_manager::controllers::robot::sha256_hex(b"s3cret-token");
    robot("good")
        .phase(Some(RobotPhase::Pending))
        .token_hash(&good)
        .create(c)
        .await;
    robot("bad")
        .phase(Some(RobotPhase::Pending))
        .token_hash(&k8s4r_manager::controllers::robot::sha256_hex(b"guess"))
        .create(c)
        .await;
    let robots: Api<Robot> = Api::all(c.clone());
    let phase_of = |name: &'static str, want: RobotPhase| {
        let robots = robots.clone();
        async move {
            let s = robots.get(name).await.ok()?.status?;
            (s.phase == Some(want)).then_some(s)
        }
    };
    let ok = eventually(WAIT, "good approved", || phase_of("good", RobotPhase::Online)).await;
    assert_eq!(
        find_condition(&ok.conditions, "Approved").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    let no = eventually(WAIT, "bad rejected", || phase_of("bad", RobotPhase::Rejected)).await;
    assert_eq!(no.message.as_deref(), Some("bootstrap token not recognised"));
    manager.stop().await;
}

#[tokio::test]
async fn deleting_a_job_removes_everything_it_owns() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("r").create(c).await;
    create_job(c, "gone", None, vec![group("a", 2), group("b", 1)]).await;
    let tasks: Api<Task> = Api::namespaced(c.clone(), NS);
    eventually(WAIT, "3 tasks", || async {
        (tasks.list(&ListParams::default()).await.ok()?.items.len() == 3).then_some(())
    })
    .await;
    let jobs: Api<Job> = Api::namespaced(c.clone(), NS);
    jobs.delete("gone", &DeleteParams::background())
        .await
        .expect("delete");
    let groups: Api<TaskGroup> = Api::namespaced(c.clone(), NS);
    eventually(WAIT, "children collected", || async {
        let t = tasks.list(&ListParams::default()).await.ok()?.items.len();
        let g = groups.list(&ListParams::default()).await.ok()?.items.len();
        (t == 0 && g == 0).then_some(())
    })
    .await;
    let robots: Api<Robot> = Api::all(c.clone());
    eventually(WAIT, "allocation released", || async {
        let a = robots.get("r").await.ok()?.status?.allocated?;
        (a.tasks == 0).then_some(())
    })
    .await;
    manager.stop().await;
}

/// Read-modify-write of the first group's count, again on a conflict (the
/// manager writes the Job's status meanwhile).
async fn set_count(jobs: &Api<Job>, name: &str, count: i32) {
    eventually(WAIT, "count updated", || async {
        let mut job = jobs.get(name).await.ok()?;
        job.spec.task_groups[0].count = Some(count);
        jobs.replace(name, &PostParams::default(), &job)
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn scaling_a_group_adds_and_removes_tasks() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    robot("r").create(c).await;
    create_job(c, "scale", None, vec![group("g", 2)]).await;
    let old = task_where(c, "scale-g-1", "placed", |t| dispatching_on(t).is_some()).await;
    let jobs: Api<Job> = Api::namespaced(c.clone(), NS);
    set_count(&jobs, "scale", 1).await;
    eventually(WAIT, "task 1 removed", || async {
        task(c, "scale-g-1").await.is_none().then_some(())
    })
    .await;
    // Scaling up again recreates scale-g-1 under the name just deleted: the
    // new object is placed like any other.
    set_count(&jobs, "scale", 3).await;
    for name in ["scale-g-1", "scale-g-2"] {
        task_where(c, name, "the new task placed", |t| {
            t.uid() != old.uid() && dispatching_on(t) == Some("r")
        })
        .await;
    }
    manager.stop().await;
}

#[tokio::test]
async fn two_managers_elect_one_leader_and_fail_over() {
    let env = api_server().await;
    let c = &env.client;
    let leader_cfg = |id: &str| {
        let mut cfg = config();
        cfg.leader = Some(k8s4r_manager::LeaderConfig {
            lease_name: "k8s4r-manager".into(),
            identity: id.into(),
            lease_seconds: 2,
            renew_grace_seconds: 1,
        });
        cfg
    };
    let one = Manager::start(c, leader_cfg("one"));
    let two = Manager::start(c, leader_cfg("two"));
    let leaders = || [&one, &two].iter().filter(|m| m.metrics.is_leader()).count();
    eventually(WAIT, "a leader", || async { (leaders() == 1).then_some(()) }).await;
    robot("r").create(c).await;
    create_job(c, "le", None, vec![group("g", 1)]).await;
    task_where(c, "le-g-0", "scheduled by the leader", |t| {
        dispatching_on(t).is_some()
    })
    .await;
    assert_eq!(leaders(), 1, "never two");

    let (leader, follower) = if one.metrics.is_leader() {
        (one, two)
    } else {
        (two, one)
    };
    // A follower standing by passes its readiness probe, or a rolling
    // update of the Deployment would wait for it forever.
    eventually(WAIT, "the follower to be ready", || async {
        follower.metrics.is_ready().then_some(())
    })
    .await;
    assert!(leader.metrics.is_ready());
    leader.stop().await;
    eventually(WAIT, "the follower takes over", || async {
        follower.metrics.is_leader().then_some(())
    })
    .await;
    create_job(c, "le2", None, vec![group("g", 1)]).await;
    task_where(c, "le2-g-0", "scheduled by the new leader", |t| {
        dispatching_on(t).is_some()
    })
    .await;
    follower.stop().await;
}

/// Every state a Job or TaskGroup of this namespace was written with, in
/// order, by name (`None`: a version with no state).
type Written = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<Option<WorkState>>>>>;

fn watch_states<K>(
    api: Api<K>,
    written: &Written,
    state: fn(&K) -> Option<WorkState>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    use futures::TryStreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let written = written.clone();
    tokio::spawn(async move {
        let events = api.watch(&WatchParams::default(), "0").await.expect("watch");
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.try_next().await.expect("watch event") {
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) = event {
                let name = format!("{}/{}", K::kind(&()), o.name_any());
                written.lock().unwrap().entry(name).or_default().push(state(&o));
            }
        }
    })
}

/// A TaskGroup's and Job's step to `running` waits its turn (up to the
/// progress interval from when the manager first saw it), as their first
/// `pending` does: a
/// Job whose task ends within it writes neither, and its end goes at once.
/// One whose task runs on past it shows `running`.
#[tokio::test]
async fn a_job_whose_task_ends_within_its_first_interval_never_writes_running() {
    let interval = Duration::from_secs(5);
    let mut config = config();
    config.progress_interval = interval;
    let (env, manager) = start(config).await;
    let c = &env.client;
    robot("r1").create(c).await;
    let written = Written::default();
    let watches = [
        watch_states(Api::<Job>::namespaced(c.clone(), NS), &written, |j| {
            j.status.as_ref()?.state
        }),
        watch_states(Api::<TaskGroup>::namespaced(c.clone(), NS), &written, |g| {
            g.status.as_ref()?.state
        }),
    ];
    let jobs: Api<Job> = Api::namespaced(c.clone(), NS);
    let states = |name: &str| written.lock().unwrap().get(name).cloned().unwrap_or_default();

    let created = std::time::Instant::now();
    create_job(c, "quick", None, vec![group("g", 1)]).await;
    task_where(c, "quick-g-0", "dispatching", |t| dispatching_on(t).is_some()).await;
    report(c, "quick-g-0", TaskState::Running, None, None).await;
    report(c, "quick-g-0", TaskState::Completed, None, Some(0)).await;
    let ended = created.elapsed();
    eventually(WAIT, "the quick job's end", || async {
        (states("Job/quick").last() == Some(&Some(WorkState::Completed))).then_some(())
    })
    .await;
    let shown = created.elapsed();
    assert!(
        shown.saturating_sub(ended) < Duration::from_secs(2),
        "an end is written at once, not at its turn: the task ended {ended:?} and the Job showed it {shown:?} after its creation"
    );
    if shown < interval {
        for name in ["Job/quick", "TaskGroup/quick-g"] {
            let seen = states(name);
            assert_eq!(
                seen.iter().flatten().collect::<Vec<_>>(),
                [&WorkState::Completed],
                "{name}: only its end is written ({seen:?})"
            );
        }
    } else {
        // On a machine this slow the earlier steps had their turn.
        eprintln!(
            "skipped the check: the task ended {ended:?} and the Job showed it {shown:?} after its creation"
        );
    }

    let created = std::time::Instant::now();
    create_job(c, "long", None, vec![group("g", 1)]).await;
    task_where(c, "long-g-0", "dispatching", |t| dispatching_on(t).is_some()).await;
    report(c, "long-g-0", TaskState::Running, None, None).await;
    eventually(WAIT, "the long job running", || async {
        let s = jobs.get("long").await.ok()?.status?;
        (s.state == Some(WorkState::Running)).then_some(())
    })
    .await;
    // The group's `running` came at its turn, so the Job never said only
    // `pending` (it waited for that), unless the machine was too slow for
    // the group's turn to come before the Job stopped waiting.
    let quick_enough = created.elapsed() < 2 * interval;
    report(c, "long-g-0", TaskState::Completed, None, Some(0)).await;
    eventually(WAIT, "the long job's end", || async {
        (states("Job/long").last() == Some(&Some(WorkState::Completed))).then_some(())
    })
    .await;
    for name in ["Job/long", "TaskGroup/long-g"] {
        let seen = states(name);
        let steps: Vec<_> = seen
            .iter()
            .flatten()
            .filter(|s| quick_enough || **s != WorkState::Pending)
            .collect();
        assert_eq!(
            steps,
            [&WorkState::Running, &WorkState::Completed],
            "{name}: running once, then its end ({seen:?})"
        );
    }
    watches.iter().for_each(|w| w.abort());
    manager.stop().await;
}

#[tokio::test]
async fn with_routine_events_off_only_warnings_are_written() {
    let mut config = config();
    config.routine_events = false;
    let (env, manager) = start(config).await;
    let c = &env.client;
    robot("r1").create(c).await;
    create_job(c, "quiet", None, vec![group("g", 1)]).await;
    task_where(c, "quiet-g-0", "dispatching", |t| dispatching_on(t).is_some()).await;
    report(c, "quiet-g-0", TaskState::Running, None, None).await;
    report(c, "quiet-g-0", TaskState::Completed, None, Some(0)).await;
    let jobs: Api<Job> = Api::namespaced(c.clone(), NS);
    eventually(WAIT, "the quiet job's end", || async {
        let s = jobs.get("quiet").await.ok()?.status?;
        (s.state == Some(WorkState::Completed)).then_some(())
    })
    .await;
    // A failure afterwards still says so; Events go out in order, so once
    // its Warning is in, any routine Event of the first Job would be too.
    create_job(c, "loud", None, vec![group("g", 1)]).await;
    task_where(c, "loud-g-0", "dispatching", |t| dispatching_on(t).is_some()).await;
    report(c, "loud-g-0", TaskState::Failed, None, Some(3)).await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), NS);
    let list = eventually(WAIT, "the failure's Warning", || async {
        let list = events.list(&Default::default()).await.ok()?.items;
        list.iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("loud-g-0")
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("Failed")
            })
            .then_some(list)
    })
    .await;
    let routine: Vec<_> = list
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Normal"))
        .map(|e| {
            (
                e.reason.clone(),
                e.regarding.as_ref().and_then(|r| r.name.clone()),
            )
        })
        .collect();
    assert!(routine.is_empty(), "routine Events written: {routine:?}");
    manager.stop().await;
}
