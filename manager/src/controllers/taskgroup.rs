//! TaskGroupController: `count` Tasks per group, named by index (or, for an
//! everyRobot group, one per matching robot, named by robot: see
//! [`crate::fleet`]), and the group's status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{stream, StreamExt, TryStreamExt};
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::names::{
    ANNOTATION_CANCEL, CONDITION_SCHEDULED, LABEL_GROUP, LABEL_INDEX, LABEL_JOB, LABEL_ROBOT,
};
use k8s4r_api::{
    Condition, ConditionStatus, GroupMode, RobotPhase, Task, TaskGroup, TaskGroupStatus, TaskSpec, TaskState,
    WorkState,
};
use kube::api::{DeleteParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;

use super::context::Note;
use super::pacing::group_progress_only;
use super::{key_of, task, Context, Look, Requests};
use crate::aggregate::{group_status, TaskView};
use crate::error::{Error, Result};
use crate::fleet;
use crate::lifecycle::{effective_state, LifecycleConfig};
use crate::scheduler::{self, Request};

/// How many Tasks one reconcile creates or deletes at once.
const PARALLEL_WRITES: usize = 16;

/// Reconciles one TaskGroup.
#[instrument(skip_all, fields(taskgroup = %key_of(group.as_ref())))]
pub async fn reconcile(group: Arc<TaskGroup>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = ctx.as_ref();
    let look = Look {
        store: Some(&ctx.stores.groups),
        written: Some(&ctx.written_groups),
    };
    ctx.instrumented("taskgroup", group, look, |group| async move {
        reconcile_group(&group, ctx).await
    })
    .await
}

/// Backs off a TaskGroup whose reconcile failed.
pub fn error_policy(group: Arc<TaskGroup>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("taskgroup", &key_of(group.as_ref()), error)
}

/// The Task at `index` of `group`, as it should be created.
pub fn desired_task(group: &TaskGroup, index: i32) -> Result<Task> {
    new_task(group, &index.to_string(), (LABEL_INDEX, index.to_string()), None)
}

/// The Task of an everyRobot `group` for `robot`, as it should be created:
/// named and labelled after the robot where a name and a label value can
/// hold it (robot ids may be longer than either), else after a hash of it;
/// `spec.robotName` always holds it.
pub fn robot_task(group: &TaskGroup, robot: &str) -> Result<Task> {
    let full = format!("{}-{robot}", group.name_any());
    let suffix = if full.len() <= 253 {
        robot.to_owned()
    } else {
        short_hash(robot)
    };
    let label = if robot.len() <= 63 {
        robot.to_owned()
    } else {
        short_hash(robot)
    };
    new_task(group, &suffix, (LABEL_ROBOT, label), Some(robot.to_owned()))
}

/// 16 hex digits of the SHA-256 of `s`.
fn short_hash(s: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(s.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What each task of an everyRobot group asks of a robot, as far as the
/// robot's policy goes.
fn fleet_demand(group: &TaskGroup) -> scheduler::Demand {
    let template = &group.spec.template.task;
    scheduler::Demand {
        user: template.user.clone(),
        groups: template.groups.clone(),
        ..scheduler::Demand::default()
    }
}

fn new_task(group: &TaskGroup, suffix: &str, slot: (&str, String), robot: Option<String>) -> Result<Task> {
    let owner = group.controller_owner_ref(&()).ok_or_else(|| Error::Malformed {
        kind: "TaskGroup",
        name: group.name_any(),
        reason: "no uid to own tasks with".into(),
    })?;
    let template = &group.spec.template;
    let labels = BTreeMap::from([
        (LABEL_JOB.to_owned(), group.spec.job.clone()),
        (LABEL_GROUP.to_owned(), template.name.clone()),
        (slot.0.to_owned(), slot.1),
    ]);
    Ok(Task {
        metadata: ObjectMeta {
            name: Some(format!("{}-{suffix}", group.name_any())),
            namespace: group.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: TaskSpec {
            template: template.task.clone(),
            robot_selector: template.robot_selector.clone(),
            constraints: template.constraints.clone(),
            restart_policy: template.restart_policy.clone(),
            disconnect: template.disconnect.clone(),
            priority: group.spec.priority,
            pending_deadline_seconds: group.spec.pending_deadline_seconds,
            anti_affinity: template.anti_affinity.clone(),
            affinity: template.affinity.clone(),
            robot_name: robot,
            target_robot: None,
        },
        status: None,
    })
}

fn index_of(task: &Task) -> Option<i32> {
    task.labels().get(LABEL_INDEX)?.parse().ok()
}

async fn reconcile_group(group: &TaskGroup, ctx: &Context) -> Result<Action> {
    if group.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    let owned: Vec<Arc<Task>> = ctx.group_tasks.of(&ctx.stores.tasks, &uid);
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let lifecycle = &ctx.config.lifecycle;

    // A person's cancel or retry of the group goes to its Tasks.
    let previous = group.status.clone().unwrap_or_default();
    let (children, retry_to) = requests_to_pass(&owned, lifecycle);
    let requests = ctx
        .pass_on_requests(
            group,
            (previous.cancellation.as_ref(), previous.retry.as_ref()),
            &api,
            &children,
            &retry_to,
            "tasks",
        )
        .await?;

    let fleet = match group.spec.template.mode {
        GroupMode::Count => None,
        GroupMode::EveryRobot => Some(fleet_view(ctx, group)),
    };
    let plan = plan_group(group, &owned, fleet.as_ref(), requests, lifecycle)?;
    create_tasks(ctx, &api, plan.create).await?;
    delete_tasks(ctx, &api, plan.delete).await?;
    if let Some(status) = plan.status {
        let progress = group_progress_only(group.status.as_ref(), &status);
        if let Some(wait) = ctx.progress_due(group, progress) {
            return Ok(Action::requeue(wait));
        }
        let groups: Api<TaskGroup> = Api::namespaced(ctx.client(), &ns);
        let written: TaskGroup = ctx
            .patch_status(&groups, &group.name_any(), None, &status)
            .await?;
        ctx.written_groups.record(written);
        if let Some(note) = waiting_note(group.status.as_ref(), &status) {
            ctx.publish(group, note);
        }
    }
    Ok(Action::await_change())
}

/// What a cancel or retry of the group is passed to: every Task (name, its
/// cancel annotation), and the names of those a retry has work for (failed
/// or cancelled).
fn requests_to_pass(
    owned: &[Arc<Task>],
    lifecycle: &LifecycleConfig,
) -> (Vec<(String, Option<String>)>, Vec<String>) {
    let children = owned
        .iter()
        .map(|t| (t.name_any(), t.annotations().get(ANNOTATION_CANCEL).cloned()))
        .collect();
    let retry_to = owned
        .iter()
        .filter(|t| {
            matches!(
                effective_state(&t.spec, t.status.as_ref(), lifecycle),
                TaskState::Failed | TaskState::Cancelled
            )
        })
        .map(|t| t.name_any())
        .collect();
    (children, retry_to)
}

/// The robots as an everyRobot group sees them, read from the scheduler's
/// state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetView {
    /// The robots the group's task can ever run on: the scheduler's lasting
    /// filters (approval, cordon, selector, constraints, driver, the
    /// robot's policy, the anti-affinity label); being offline, busy, full
    /// or short of a start condition passes, and the task waits.
    pub matched: BTreeSet<String>,
    /// Every robot the scheduler knows.
    pub known: BTreeSet<String>,
    /// The robots online and taking tasks.
    pub online: BTreeSet<String>,
    /// When no robot matches: why, robot by robot (`0/2 robots: 2 lack
    /// driver raw_exec (agent setting ...)`).
    pub unmatched: Option<String>,
}

/// Reads the robots an everyRobot `group` may reach.
fn fleet_view(ctx: &Context, group: &TaskGroup) -> FleetView {
    let template = &group.spec.template;
    let request = Request {
        group: "",
        selector: template.robot_selector.as_ref(),
        constraints: &template.constraints,
        driver: &template.task.driver,
        demand: fleet_demand(group),
        avoid: None,
        robot: None,
        anti_affinity: template.anti_affinity.as_ref(),
        affinity: &template.affinity,
        reserved: &[],
        when: &template.task.when,
        config: None,
    };
    let sched = ctx.sched();
    let mut nofit = scheduler::NoFit {
        total: sched.robots.len(),
        driver: template.task.driver.as_str().into(),
        topology_key: template
            .anti_affinity
            .as_ref()
            .and_then(|a| a.topology_key.as_deref().map(Into::into)),
        conditions: template.task.when.iter().map(ToString::to_string).collect(),
        ..scheduler::NoFit::default()
    };
    let mut matched = BTreeSet::new();
    for robot in sched.robots.values() {
        let checked = scheduler::check(robot, &request, None);
        if scheduler::may_take_later(checked) {
            matched.insert(robot.name.clone());
        } else if let Err(why) = checked {
            *nofit.rejections.entry(why).or_default() += 1;
        }
    }
    let online = sched
        .robots
        .values()
        .filter(|r| r.phase == Some(RobotPhase::Online) && r.refusing.is_none())
        .map(|r| r.name.clone())
        .collect();
    FleetView {
        unmatched: matched.is_empty().then(|| nofit.to_string()),
        matched,
        known: sched.robots.keys().cloned().collect(),
        online,
    }
}

/// What a TaskGroup's reconcile writes.
#[derive(Clone, Debug, Default)]
pub struct GroupPlan {
    /// Tasks to create.
    pub create: Vec<Task>,
    /// Tasks to delete, by name, after the creates.
    pub delete: Vec<String>,
    /// The new status; `None` when the group's says the same.
    pub status: Option<TaskGroupStatus>,
}

/// Plans one reconcile of a TaskGroup from the Tasks it owns, the robots
/// (for an everyRobot group: `fleet`) and what became of a person's cancel
/// and retry. Fails only for a group without a uid to own Tasks with.
pub fn plan_group(
    group: &TaskGroup,
    owned: &[Arc<Task>],
    fleet: Option<&FleetView>,
    requests: Requests,
    lifecycle: &LifecycleConfig,
) -> Result<GroupPlan> {
    let (mut plan, status) = match fleet {
        None => plan_count(group, owned, requests.cancelled, lifecycle)?,
        Some(fleet) => plan_every_robot(group, owned, fleet, requests.cancelled, lifecycle)?,
    };
    let mut status = TaskGroupStatus {
        cancellation: requests.cancellation,
        retry: requests.retry,
        ..status
    };
    let c = &status.counts;
    if requests.cancelled && c.running + c.dispatching + c.pending == 0 {
        // Nothing runs or waits: a group cancelled before its tasks were
        // made is done too.
        status.state = Some(WorkState::Cancelled);
    }
    plan.status = (group.status.as_ref() != Some(&status)).then_some(status);
    Ok(plan)
}

/// A `count` group: one Task per index, the Tasks of other indexes deleted.
fn plan_count(
    group: &TaskGroup,
    owned: &[Arc<Task>],
    cancelled: bool,
    lifecycle: &LifecycleConfig,
) -> Result<(GroupPlan, TaskGroupStatus)> {
    let count = group.spec.template.count();
    let mut present = vec![false; count as usize];
    let mut extra = Vec::new();
    for task in owned {
        match index_of(task) {
            Some(i) if (0..count).contains(&i) => present[i as usize] = true,
            _ => extra.push(task.name_any()),
        }
    }
    let missing: Vec<Task> = present
        .iter()
        .enumerate()
        // A cancelled group makes no new task.
        .filter(|(_, here)| !**here && !cancelled)
        .map(|(i, _)| desired_task(group, i as i32))
        .collect::<Result<_>>()?;
    let views = owned
        .iter()
        .filter(|t| index_of(t).is_some_and(|i| (0..count).contains(&i)))
        .map(|t| view_of(t, lifecycle));
    let mut status = group_status(count, views, group.status.as_ref(), group.meta().generation);
    status.desired = Some(count);
    let plan = GroupPlan {
        create: missing,
        delete: extra,
        status: None,
    };
    Ok((plan, status))
}

/// An everyRobot group: one Task per robot it matches, rolled out as
/// [`fleet::plan`] says.
fn plan_every_robot(
    group: &TaskGroup,
    owned: &[Arc<Task>],
    fleet: &FleetView,
    cancelled: bool,
    lifecycle: &LifecycleConfig,
) -> Result<(GroupPlan, TaskGroupStatus)> {
    let template = &group.spec.template;
    let mut existing = BTreeMap::new();
    let mut strays = Vec::new();
    for task in owned {
        match &task.spec.robot_name {
            Some(robot) => {
                let state = effective_state(&task.spec, task.status.as_ref(), lifecycle);
                existing.insert(
                    robot.clone(),
                    fleet::Existing {
                        task: task.name_any(),
                        state,
                        placed: task.status.as_ref().is_some_and(|s| s.attempt > 0),
                        parked: state == TaskState::Pending && !fleet.online.contains(robot),
                    },
                );
            }
            None => strays.push(task.name_any()),
        }
    }
    // A completed rollout reaches no robot that comes later; a
    // failed one goes on once its failures are retried.
    let finished = cancelled || group.status.as_ref().and_then(|s| s.state) == Some(WorkState::Completed);
    let plan = fleet::plan(
        &fleet.matched,
        &fleet.known,
        &existing,
        template.max_parallel,
        template.max_failed.as_ref(),
        finished,
    );
    let new: Vec<Task> = plan
        .create
        .iter()
        .map(|robot| robot_task(group, robot))
        .collect::<Result<_>>()?;
    strays.extend(plan.delete.iter().cloned());
    let mut status = every_robot_status(group, owned, &plan, lifecycle);
    matching_condition(&mut status, fleet, plan.desired);
    let writes = GroupPlan {
        create: new,
        delete: strays,
        status: None,
    };
    Ok((writes, status))
}

/// Reason of an everyRobot group's `Scheduled=False` condition.
pub const REASON_NO_MATCHING_ROBOT: &str = "NoMatchingRobot";

/// An everyRobot group's `Scheduled` condition: False with why while no
/// robot matches (the group waits, and says for what), True once some do.
fn matching_condition(status: &mut TaskGroupStatus, fleet: &FleetView, desired: i32) {
    let condition = match (&fleet.unmatched, desired) {
        (Some(why), 0) => Condition::new(
            CONDITION_SCHEDULED,
            ConditionStatus::False,
            REASON_NO_MATCHING_ROBOT,
            format!("no robot matches the group: {why}"),
        ),
        _ if find_condition(&status.conditions, CONDITION_SCHEDULED).is_none() => return,
        _ => Condition::new(
            CONDITION_SCHEDULED,
            ConditionStatus::True,
            "RobotsMatched",
            format!("{desired} robots match the group"),
        ),
    };
    set_condition(&mut status.conditions, condition);
}

/// The waiting Event of an everyRobot group whose new status says no robot
/// matches, when the previous status did not say the same: one Event per
/// change of the reason, not one per reconcile.
pub fn waiting_note(previous: Option<&TaskGroupStatus>, new: &TaskGroupStatus) -> Option<Note> {
    let waiting = |s: &TaskGroupStatus| {
        find_condition(&s.conditions, CONDITION_SCHEDULED)
            .filter(|c| c.status == ConditionStatus::False)
            .and_then(|c| c.message.clone())
    };
    let message = waiting(new)?;
    (previous.and_then(waiting).as_ref() != Some(&message))
        .then(|| Note::warning(REASON_NO_MATCHING_ROBOT, message))
}

/// The status of an everyRobot group: its kept Tasks, and those still to
/// come counted as pending.
fn every_robot_status(
    group: &TaskGroup,
    owned: &[Arc<Task>],
    plan: &fleet::Plan,
    lifecycle: &LifecycleConfig,
) -> TaskGroupStatus {
    let deleted: BTreeSet<&String> = plan.delete.iter().collect();
    let to_come = plan.create.len() + usize::try_from(plan.waiting).unwrap_or(0);
    let views = owned
        .iter()
        .filter(|t| t.spec.robot_name.is_some() && !deleted.contains(&t.name_any()))
        .map(|t| view_of(t, lifecycle))
        .chain(std::iter::repeat_n(
            TaskView {
                state: TaskState::Pending,
                robot: None,
            },
            to_come,
        ));
    let mut status = group_status(
        plan.desired,
        views,
        group.status.as_ref(),
        group.meta().generation,
    );
    if plan.desired == 0 {
        // No robot matches yet: the group waits for one rather than
        // being done with nothing.
        status = group_status(
            1,
            std::iter::empty(),
            group.status.as_ref(),
            group.meta().generation,
        );
        status.completions = Some("0/0".into());
    }
    status.desired = Some(plan.desired);
    status.rollout = Some(plan.rollout.clone());
    status
}

fn view_of<'a>(t: &'a Task, lifecycle: &LifecycleConfig) -> TaskView<'a> {
    TaskView {
        state: effective_state(&t.spec, t.status.as_ref(), lifecycle),
        robot: t
            .status
            .as_ref()
            .and_then(|s| s.robot.as_deref())
            .or(t.spec.target_robot.as_deref()),
    }
}

/// Creates `tasks`, each placed first where a robot fits
/// ([`task::place_new`]), so it is created naming its robot. Every create
/// is tried (a placement whose create failed is taken back); the first
/// error is returned.
async fn create_tasks(ctx: &Context, api: &Api<Task>, tasks: Vec<Task>) -> Result<()> {
    let results: Vec<Result<()>> = stream::iter(tasks)
        .map(|mut task| {
            let api = api.clone();
            async move {
                task::place_new(&mut task, ctx);
                let name = task.name_any();
                let created = ctx
                    .api::<Task, _>("create", &name, api.create(&ctx.kube.post_params(), &task))
                    .await;
                if created.is_err() {
                    task::unplace_new(&task, ctx);
                }
                match created {
                    Ok(_) => Ok(()),
                    // The cache had not seen it yet.
                    Err(Error::Api(e)) if e.is_conflict() => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn delete_tasks(ctx: &Context, api: &Api<Task>, names: Vec<String>) -> Result<()> {
    stream::iter(names.into_iter().map(Ok))
        .try_for_each_concurrent(PARALLEL_WRITES, |name| {
            let api = api.clone();
            async move {
                match ctx
                    .api::<Task, _>("delete", &name, api.delete(&name, &DeleteParams::background()))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(Error::Api(e)) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{TaskGroupSpec, TaskGroupTemplate, TaskStatus};

    /// TaskGroup `j-g` of Job `j`, with a uid to own its Tasks with.
    fn group(mode: GroupMode, count: Option<i32>) -> TaskGroup {
        let mut g = TaskGroup::new(
            "j-g",
            TaskGroupSpec {
                template: TaskGroupTemplate {
                    name: "g".into(),
                    count,
                    mode,
                    ..TaskGroupTemplate::default()
                },
                job: "j".into(),
                priority: 0,
                pending_deadline_seconds: None,
            },
        );
        g.metadata.namespace = Some("ns".into());
        g.metadata.uid = Some("uid-g".into());
        g
    }

    fn in_state(mut task: Task, state: TaskState) -> Arc<Task> {
        task.status = Some(TaskStatus {
            state: Some(state),
            attempt: 1,
            ..TaskStatus::default()
        });
        Arc::new(task)
    }

    fn names(tasks: &[Task]) -> Vec<String> {
        tasks.iter().map(|t| t.name_any()).collect()
    }

    fn robots(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_count_group_makes_its_missing_indexes_and_drops_the_rest() {
        let g = group(GroupMode::Count, Some(3));
        let owned = vec![
            in_state(desired_task(&g, 1).unwrap(), TaskState::Running),
            in_state(desired_task(&g, 5).unwrap(), TaskState::Pending),
        ];
        let lifecycle = LifecycleConfig::default();
        let plan = plan_group(&g, &owned, None, Requests::default(), &lifecycle).unwrap();
        assert_eq!(names(&plan.create), ["j-g-0", "j-g-2"]);
        assert_eq!(plan.delete, ["j-g-5"]);
        let status = plan.status.unwrap();
        assert_eq!(status.desired, Some(3));
        assert_eq!(status.counts.running, 1);
        assert_eq!(status.state, Some(WorkState::Running));
    }

    #[test]
    fn an_unchanged_status_is_not_written() {
        let mut g = group(GroupMode::Count, Some(1));
        let owned = vec![in_state(desired_task(&g, 0).unwrap(), TaskState::Completed)];
        let lifecycle = LifecycleConfig::default();
        let plan = plan_group(&g, &owned, None, Requests::default(), &lifecycle).unwrap();
        assert!(plan.create.is_empty());
        g.status = plan.status;
        let again = plan_group(&g, &owned, None, Requests::default(), &lifecycle).unwrap();
        assert_eq!(again.status, None);
    }

    #[test]
    fn a_cancelled_group_makes_nothing_and_is_done_when_nothing_runs() {
        let g = group(GroupMode::Count, Some(2));
        let owned = vec![in_state(desired_task(&g, 0).unwrap(), TaskState::Cancelled)];
        let requests = Requests {
            cancelled: true,
            ..Requests::default()
        };
        let lifecycle = LifecycleConfig::default();
        let plan = plan_group(&g, &owned, None, requests, &lifecycle).unwrap();
        assert!(plan.create.is_empty());
        assert_eq!(plan.status.unwrap().state, Some(WorkState::Cancelled));
    }

    #[test]
    fn an_every_robot_group_reaches_the_robots_it_matches() {
        let g = group(GroupMode::EveryRobot, None);
        let mut stray = desired_task(&g, 0).unwrap();
        stray.metadata.name = Some("j-g-stray".into());
        let owned = vec![
            in_state(robot_task(&g, "a").unwrap(), TaskState::Running),
            // Never placed, for a robot the group no longer matches.
            Arc::new(robot_task(&g, "c").unwrap()),
            Arc::new(stray),
        ];
        let fleet = FleetView {
            matched: robots(&["a", "b"]),
            known: robots(&["a", "b", "c"]),
            online: robots(&["a", "b", "c"]),
            unmatched: None,
        };
        let lifecycle = LifecycleConfig::default();
        let plan = plan_group(&g, &owned, Some(&fleet), Requests::default(), &lifecycle).unwrap();
        assert_eq!(names(&plan.create), ["j-g-b"]);
        assert_eq!(plan.create[0].spec.robot_name.as_deref(), Some("b"));
        assert_eq!(plan.delete, ["j-g-stray", "j-g-c"]);
        let status = plan.status.unwrap();
        assert_eq!(status.desired, Some(2));
        assert_eq!(status.counts.running, 1);
        assert_eq!(status.counts.pending, 1);
        assert_eq!(status.rollout.unwrap().started, 2);
    }

    #[test]
    fn an_every_robot_group_without_robots_waits_for_one() {
        let g = group(GroupMode::EveryRobot, None);
        let fleet = FleetView::default();
        let lifecycle = LifecycleConfig::default();
        let plan = plan_group(&g, &[], Some(&fleet), Requests::default(), &lifecycle).unwrap();
        assert!(plan.create.is_empty());
        let status = plan.status.unwrap();
        assert_eq!(status.state, Some(WorkState::Pending));
        assert_eq!(status.completions.as_deref(), Some("0/0"));
        assert_eq!(status.desired, Some(0));
    }

    #[test]
    fn an_every_robot_group_no_robot_matches_says_why_once() {
        let g = group(GroupMode::EveryRobot, None);
        let why = "0/2 robots: 2 lack driver raw_exec (agent setting raw_exec = true / --raw-exec true)";
        let fleet = FleetView {
            known: robots(&["a", "b"]),
            online: robots(&["a", "b"]),
            unmatched: Some(why.into()),
            ..FleetView::default()
        };
        let lifecycle = LifecycleConfig::default();
        let plan = plan_group(&g, &[], Some(&fleet), Requests::default(), &lifecycle).unwrap();
        let status = plan.status.unwrap();
        let condition = find_condition(&status.conditions, CONDITION_SCHEDULED).unwrap();
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(condition.reason.as_deref(), Some(REASON_NO_MATCHING_ROBOT));
        assert!(condition.message.as_deref().unwrap().contains(why));
        let note = waiting_note(None, &status).unwrap();
        assert_eq!(note.reason, REASON_NO_MATCHING_ROBOT);
        // The same reason again: no second Event.
        assert_eq!(waiting_note(Some(&status), &status), None);
        // A robot matches: the condition turns True, no waiting Event.
        let mut g = g;
        g.status = Some(status);
        let fleet = FleetView {
            matched: robots(&["a"]),
            known: robots(&["a", "b"]),
            online: robots(&["a", "b"]),
            unmatched: None,
        };
        let plan = plan_group(&g, &[], Some(&fleet), Requests::default(), &lifecycle).unwrap();
        let status = plan.status.unwrap();
        let condition = find_condition(&status.conditions, CONDITION_SCHEDULED).unwrap();
        assert_eq!(condition.status, ConditionStatus::True);
        assert_eq!(waiting_note(g.status.as_ref(), &status), None);
    }
}
