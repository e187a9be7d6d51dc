//! Kubernetes → MQTT: a kube-runtime controller over Tasks that publishes
//! dispatches and cancels and holds the cancel finalizer.
//!
//! Exactly once per (uid, attempt), as far as the agent can tell: before
//! the publish, one write guarded by the Task's resourceVersion adds the
//! finalizer and sets `robot.k8s4r.io/sending-attempt` to the attempt; the
//! broker's PUBACK is kept in memory only. A new process (a restart, a new
//! leader) publishes a still-dispatching attempt again, which the agent
//! drops as one it accepted before (across its own restarts too); a crash
//! before the PUBACK publishes it again, which is what at-least-once needs.
//!
//! The guarded write before the publish closes the window in which a
//! cancel could find the attempt "never sent" while it is on its way: the
//! manager's cancel is guarded by the same resourceVersion, so either the
//! cancel lands first (this write fails, nothing is published) or the
//! sending annotation does (the manager sees it and has the robot stop the
//! attempt). A new process that sends an attempt again finds the record
//! there and does not write it again: the manager already treats the
//! attempt as possibly on its robot. Across reconciles only what this
//! process published is remembered, and only while it leads and the Task
//! is dispatching.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt};
use k8s4r_api::backoff::exponential;
use k8s4r_api::names::{ANNOTATION_SENDING_ATTEMPT, FINALIZER_CANCEL};
use k8s4r_api::protocol::{encode, ConfigUpdate, Dispatch, MAX_MESSAGE_BYTES};
use k8s4r_api::{DisconnectPolicy, DurationString, Robot, Task, TaskReason, TaskState};
use k8s4r_service::backoff::Failures;
use k8s4r_service::events::{Recorder, RoutineBudget};
use k8s4r_service::lock;
use k8s4r_service::patch::Guarded;
use k8s4r_service::watch::InSync;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument, warn};

use crate::bridge::Bridge;
use crate::decide::{self, decide_task, Stop, TaskAction};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::task_config;

/// How often a Task waiting for its robot to stop is looked at again (and
/// the cancel published again).
const CANCEL_RETRY: Duration = Duration::from_secs(30);
/// The first retry delay of a failed reconcile; doubled per failure.
const RETRY_BASE: Duration = Duration::from_millis(500);
/// How often a replica that is not the leader looks again.
const FOLLOWER_RECHECK: Duration = Duration::from_secs(5);

/// What the reconciler needs.
pub struct Context {
    bridge: Arc<Bridge>,
    recorder: Recorder,
    /// Routine Events beyond this budget are not recorded.
    routine: RoutineBudget,
    leadership: Leadership,
    failures: Failures<String>,
    /// The attempt this process last published per uid, while the Task is
    /// dispatching: a reconcile woken by the sending record's own write
    /// must not publish the same attempt again.
    published: Mutex<HashMap<String, u32>>,
    /// The attempt and configuration generation this process last sent
    /// per uid (`robot.k8s4r.io/config-refresh`): sent once each; a new
    /// process sends an unreported one again, which the robot drops if it
    /// applied it.
    config_sent: Mutex<HashMap<String, (u32, u64)>>,
}

/// Metadata fields of the finalizer patch (guarded: the list replaces
/// the whole list, so it must be the list that was read).
#[derive(Debug, Serialize)]
struct Finalizers {
    finalizers: Vec<String>,
}

/// Metadata fields written before a publish (guarded): the finalizer when
/// it is missing, and the attempt about to be sent.
#[derive(Debug, Serialize)]
struct Sending {
    #[serde(skip_serializing_if = "Option::is_none")]
    finalizers: Option<Vec<String>>,
    annotations: BTreeMap<String, String>,
}

/// Builds the Task controller; `tasks_cache` is filled by its watch, whose
/// health the returned flag follows. Robot changes wake the Tasks being
/// deleted on that robot, so that a robot going Offline releases their
/// finalizers.
pub fn controller(client: kube::Client) -> (Controller<Task>, InSync) {
    let tasks: Api<Task> = Api::all(client.clone());
    let robots: Api<Robot> = Api::all(client);
    let (cache, writer) = kube::runtime::reflector::store();
    let in_sync = InSync::default();
    let events = in_sync
        .track(
            watcher(tasks, watcher::Config::default())
                .modify(k8s4r_service::watch::trim)
                .default_backoff(),
        )
        .reflect(writer);
    // A Task a relist brings is reconciled once the cache holds it (else a
    // Task made dispatching while the watch was down would be skipped).
    let triggers = k8s4r_service::watch::settle_relists(events, cache.clone()).applied_objects();
    let controller = Controller::for_stream(triggers, cache.clone());
    // Only a Robot gone, or one that cannot be reached, changes what a
    // deleted Task on it may do (its finalizer may go): every other Robot
    // change (each heartbeat's status write) wakes nothing, so that the
    // status writes of 100,000 robots do not each scan every cached Task.
    let robot_changes = watcher(robots, watcher::Config::default())
        .modify(k8s4r_service::watch::trim)
        .default_backoff()
        .filter_map(|event| {
            futures::future::ready(match event {
                Ok(watcher::Event::Delete(robot)) => Some(Ok(robot)),
                Ok(watcher::Event::Apply(robot) | watcher::Event::InitApply(robot))
                    if !decide::reachable(decide::phase_of(&robot)) =>
                {
                    Some(Ok(robot))
                }
                Ok(_) => None,
                Err(error) => Some(Err(error)),
            })
        });
    let controller = controller.watches_stream(robot_changes, move |robot: Robot| {
        let name = robot.name_any();
        cache
            .state()
            .into_iter()
            .filter(|t| {
                t.metadata.deletion_timestamp.is_some()
                    && t.spec.target_robot.as_deref() == Some(name.as_str())
            })
            .map(|t| ObjectRef::from_obj(t.as_ref()))
            .collect::<Vec<_>>()
    });
    (controller, in_sync)
}

/// Runs the controller until `shutdown`.
pub async fn run(
    controller: Controller<Task>,
    bridge: Arc<Bridge>,
    leadership: Leadership,
    shutdown: CancellationToken,
) {
    let recorder = Recorder::new(
        bridge.kube().client().clone(),
        Reporter {
            controller: k8s4r_api::names::MANAGER_SERVER.to_owned(),
            instance: Some(bridge.config().identity.clone()),
        },
    );
    let config = bridge.config();
    let routine = RoutineBudget::configured(config.routine_events, config.event_qps, config.event_burst);
    let context = Arc::new(Context {
        recorder,
        routine,
        bridge,
        leadership,
        failures: Failures::default(),
        published: Mutex::default(),
        config_sent: Mutex::default(),
    });
    let tasks = controller.store();
    let run = controller
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            match result {
                // A watch of Tasks or Robots failed: it is watched again, and
                // listed again when its version is too old (410), which at
                // scale takes a while; an operator should see it.
                Err(kube::runtime::controller::Error::QueueError(error)) => {
                    warn!(%error, "the task controller's watch failed; watching again");
                }
                Err(error) => tracing::debug!(%error, "task controller"),
                Ok(_) => {}
            }
        });
    // kube-runtime holds reconciles back until the Task cache has its first
    // list, and its graceful shutdown then waits for that list forever (the
    // shutdown has stopped the watch that would bring it). Stopped before
    // the list, nothing was reconciled: the controller is dropped at once.
    let unlisted_at_shutdown = async {
        shutdown.cancelled().await;
        if tasks.wait_until_ready().now_or_never().is_some() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = run => {}
        () = unlisted_at_shutdown => tracing::debug!("stopped before the Tasks were listed: nothing in flight"),
    }
}

fn robot_phase(cache: &Store<Robot>, name: &str) -> Option<k8s4r_api::RobotPhase> {
    Some(decide::phase_of(cache.get(&ObjectRef::new(name))?.as_ref()))
}

#[instrument(skip_all, fields(task = %decide::task_name(&task)))]
async fn reconcile(task: Arc<Task>, ctx: Arc<Context>) -> Result<Action> {
    ctx.bridge.index_task(&task);
    if !ctx.leadership.is_leader() {
        // A leader again later sends what still dispatches again, as a new
        // process would.
        if let Some(uid) = task.metadata.uid.as_deref() {
            lock(&ctx.published).remove(uid);
            lock(&ctx.config_sent).remove(uid);
        }
        return Ok(Action::requeue(FOLLOWER_RECHECK));
    }
    let seen = Instant::now();
    let phase = target_phase(&ctx, &task).await?;
    let uid = task.metadata.uid.clone().unwrap_or_default();
    let now = jiff::Timestamp::now();
    let action = {
        let mut published = lock(&ctx.published);
        let action = decide_task(&task, phase, published.get(&uid).copied(), now);
        if decide::dispatching(&task) == 0 {
            // Running, over or not placed: nothing of it is published again.
            published.remove(&uid);
        }
        action
    };
    note_expired(&ctx, &task, &action, now);
    if action == TaskAction::Nothing {
        let sent = lock(&ctx.config_sent).get(&uid).copied();
        if let Some(send) = decide::config_to_send(&task, sent) {
            send_config(&ctx, &task, &uid, send).await?;
        }
    }
    let next = carry_out(&ctx, &task, action, seen, &uid).await?;
    ctx.failures.succeeded(&uid);
    Ok(next)
}

/// Counts a dispatch found too late to send (the manager fails it once its
/// deadline has passed), each time a reconcile finds one.
fn note_expired(ctx: &Context, task: &Task, action: &TaskAction, now: jiff::Timestamp) {
    if matches!(action, TaskAction::Nothing) && decide::expired_unsent(task, now) {
        ctx.bridge.metrics().message_out("dispatch", "expired");
        debug!("dispatch found past its deadline before it was sent; not sent");
    }
}

/// Counts how long the dispatch of `task` waited for this server, from its
/// dispatchTime to the sending record written.
fn note_wait(ctx: &Context, task: &Task) {
    let since = task.status.as_ref().and_then(|s| s.dispatch_time);
    let waited =
        since.and_then(|t| std::time::Duration::try_from(jiff::Timestamp::now().duration_since(t)).ok());
    if let Some(waited) = waited {
        ctx.bridge.metrics().dispatch_wait(waited);
    }
}

/// The phase of the robot `task` targets: from the API server for a
/// deleted Task (whether it may go hinges on it), else from the cache.
async fn target_phase(ctx: &Context, task: &Task) -> Result<Option<k8s4r_api::RobotPhase>> {
    let bridge = &ctx.bridge;
    let target = task.spec.target_robot.as_deref();
    Ok(match target {
        // Whether a deleted Task may go hinges on the robot being Offline;
        // the robot watch that woke this reconcile may be ahead of the
        // cache, so ask the API server (rare: deletions only).
        Some(robot) if task.metadata.deletion_timestamp.is_some() && decide::has_finalizer(task) => bridge
            .kube()
            .read(
                || format!("reading robot {robot}"),
                bridge.robots().get_opt(robot),
            )
            .await?
            .map(|r| decide::phase_of(&r)),
        Some(robot) => robot_phase(bridge.robot_cache(), robot),
        None => None,
    })
}

/// Does what [`decide_task`] decided about `task`.
async fn carry_out(
    ctx: &Context,
    task: &Task,
    action: TaskAction,
    seen: Instant,
    uid: &str,
) -> Result<Action> {
    let bridge = &ctx.bridge;
    match action {
        TaskAction::Nothing => Ok(Action::await_change()),
        TaskAction::Dispatch { robot, attempt } => {
            if dispatch(ctx, task, &robot, attempt, seen).await? {
                Ok(Action::await_change())
            } else {
                // A conflict on the sending write left nothing published;
                // the change that caused it wakes this Task again (and
                // this, if it does not).
                Ok(Action::requeue(RETRY_BASE))
            }
        }
        TaskAction::CancelAndWait { robot, attempt } => {
            cancel(bridge, task, &robot, attempt).await?;
            let note = format!("asked robot {robot} to stop attempt {attempt}; waiting for its report");
            record(ctx, task, "CancelSent", "Cancel", note).await;
            Ok(Action::requeue(CANCEL_RETRY))
        }
        TaskAction::Cancel { robot, attempt } => {
            cancel(bridge, task, &robot, attempt).await?;
            let note =
                format!("cancelled: asked robot {robot} to stop attempt {attempt}; waiting for its report");
            record(ctx, task, "CancelSent", "Cancel", note).await;
            Ok(Action::requeue(CANCEL_RETRY))
        }
        TaskAction::Evict { robot, attempt } => {
            let stop = Stop::eviction(task.status.as_ref().unwrap_or(&Default::default()));
            publish_stop(bridge, task, &robot, attempt, &stop).await?;
            let note = format!(
                "robot {robot} is drained: asked it to stop attempt {attempt}, which then runs elsewhere; waiting for its report"
            );
            record(ctx, task, "EvictionSent", "Evict", note).await;
            Ok(Action::requeue(CANCEL_RETRY))
        }
        TaskAction::CancelAndRelease { robot, attempt } => {
            lock(&ctx.published).remove(uid);
            lock(&ctx.config_sent).remove(uid);
            if let Err(error) = cancel(bridge, task, &robot, attempt).await {
                warn!(%error, "cancel not delivered; releasing the task anyway (robot offline or never dispatched)");
            }
            release(bridge, task).await?;
            Ok(Action::await_change())
        }
        TaskAction::Release => {
            lock(&ctx.published).remove(uid);
            lock(&ctx.config_sent).remove(uid);
            release(bridge, task).await?;
            Ok(Action::await_change())
        }
    }
}

fn error_policy(task: Arc<Task>, error: &Error, ctx: Arc<Context>) -> Action {
    let uid = task.metadata.uid.clone().unwrap_or_default();
    let failures = ctx.failures.failed(uid);
    let delay = exponential(RETRY_BASE, ctx.bridge.config().max_backoff, failures);
    warn!(task = %decide::task_name(&task), %error, retry_in = ?delay, "task reconcile failed");
    Action::requeue(delay)
}

fn api_for(bridge: &Bridge, task: &Task) -> Api<Task> {
    Api::namespaced(
        bridge.kube().client().clone(),
        task.metadata.namespace.as_deref().unwrap_or_default(),
    )
}

/// Records the attempt as being sent (unless a server did before) and
/// publishes it; false when the Task changed first (nothing sent).
async fn dispatch(ctx: &Context, task: &Task, robot: &str, attempt: u32, seen: Instant) -> Result<bool> {
    let bridge = ctx.bridge.as_ref();
    let recorded = decide::sent_attempt(task) >= attempt && decide::has_finalizer(task);
    // Built before anything is recorded: a dispatch that cannot carry the
    // task's configuration is not sent.
    let body = match body_of(bridge, task, robot, attempt).await? {
        Ok(body) => body,
        Err((_, why)) if recorded => {
            // It may be on the robot already: nothing is said of the
            // attempt here; its dispatch deadline decides.
            warn!(robot, attempt, %why, "configuration no longer resolves; attempt not sent again");
            return Ok(true);
        }
        Err((reason, why)) => {
            refuse(ctx, task, robot, attempt, reason, why).await?;
            return Ok(true);
        }
    };
    if !recorded && !record_sending(bridge, task, robot, attempt).await? {
        return Ok(false);
    }
    if !recorded {
        note_wait(ctx, task);
    }
    let published = bridge
        .publisher()
        .publish(bridge.topics().dispatch(robot), body)
        .await;
    if let Err(e) = published {
        bridge.metrics().message_out("dispatch", "failed");
        return Err(e);
    }
    lock(&ctx.published).insert(task.metadata.uid.clone().unwrap_or_default(), attempt);
    // Sent again (a new process, or the publish after a recorded send
    // failed): counted apart, and the wait since placement is not this
    // send's. The Dispatched Event is the first send's.
    if recorded {
        bridge.metrics().message_out("dispatch", "resent");
        info!(robot, attempt, "task dispatched again");
        return Ok(true);
    }
    bridge.metrics().message_out("dispatch", "acked");
    bridge.metrics().dispatch_latency(seen.elapsed());
    info!(robot, attempt, "task dispatched");
    let note = format!("attempt {attempt} sent to robot {robot}");
    record(ctx, task, "Dispatched", "Dispatch", note).await;
    Ok(true)
}

/// The dispatch of `attempt` of `task` to `robot`, encoded, with what its
/// ConfigMap and Secret references come to there; `Err` with the reason
/// and why, when those do not allow it to be sent.
async fn body_of(
    bridge: &Bridge,
    task: &Task,
    robot: &str,
    attempt: u32,
) -> Result<std::result::Result<Vec<u8>, (TaskReason, String)>> {
    let config = match task_config::resolve(bridge, task, robot).await? {
        None => None,
        Some(Ok(config)) => Some(config),
        Some(Err(problem)) => return Ok(Err((problem.reason(), problem.to_string()))),
    };
    // The robot fences the attempt only when a replacement may start
    // (replace: true); without one it keeps running until it is back.
    let policy = task.spec.disconnect.as_ref();
    let stop_after = DisconnectPolicy::replace(policy, task.spec.template.kind)
        .then(|| DurationString::from_duration(DisconnectPolicy::stop_after(policy)));
    let message = Dispatch {
        expires_at: task.status.as_ref().and_then(|s| s.dispatch_deadline),
        stop_after,
        config,
        ..Dispatch::new(
            task.metadata.uid.clone().unwrap_or_default(),
            decide::task_name(task),
            attempt,
            task.spec.template.clone(),
        )
    };
    let body = encode(&message);
    if body.len() > MAX_MESSAGE_BYTES {
        let why = format!(
            "its dispatch would be {} KiB with its configuration, over the {} KiB a message to a robot may be",
            body.len().div_ceil(1024),
            MAX_MESSAGE_BYTES / 1024
        );
        return Ok(Err((TaskReason::ConfigInvalid, why)));
    }
    Ok(Ok(body))
}

/// Ends `attempt` of `task`, never sent, as `reason` says (its
/// configuration does not resolve on `robot`): the manager returns it to
/// waiting, using no retry, and its scheduler says what is missing.
async fn refuse(
    ctx: &Context,
    task: &Task,
    robot: &str,
    attempt: u32,
    reason: TaskReason,
    why: String,
) -> Result<()> {
    let status = task.status.clone().unwrap_or_default();
    let message = format!("attempt {attempt} not sent to robot {robot}: {why}");
    info!(robot, attempt, %why, "task's configuration does not resolve; not sent");
    let patch = decide::TaskStatusPatch {
        state: TaskState::Failed,
        seq: status.seq,
        exit_code: None,
        signal: None,
        reason: Some(reason),
        message: Some(message.clone()),
        start_time: None,
        finish_time: Some(jiff::Timestamp::now()),
        output_tail: None,
        observed_running_time: None,
        restarts: None,
        config: None,
    };
    match ctx.bridge.write_status(task, &patch).await {
        Ok(()) => {
            record_warning(ctx, task, reason, message).await;
            Ok(())
        }
        Err(e) if e.is_conflict() || e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes that `attempt` of `task` is being sent, with the cancel
/// finalizer when it is missing, guarded by the version the decision was
/// made on; false when the Task changed first.
async fn record_sending(bridge: &Bridge, task: &Task, robot: &str, attempt: u32) -> Result<bool> {
    let api = api_for(bridge, task);
    let full = decide::task_name(task);
    let finalizers = (!decide::has_finalizer(task)).then(|| {
        let mut finalizers = task.finalizers().to_vec();
        finalizers.push(FINALIZER_CANCEL.to_owned());
        finalizers
    });
    let body = Guarded::metadata(
        task.metadata.resource_version.as_deref(),
        Sending {
            finalizers,
            annotations: [(ANNOTATION_SENDING_ATTEMPT.to_owned(), attempt.to_string())].into(),
        },
    );
    let written = bridge
        .kube()
        .patch("task_sending", &api, &task.name_any(), &body, || {
            format!("recording that attempt {attempt} of task {full} is being sent")
        })
        .await
        .map_err(Error::from);
    match written {
        Ok(written) => {
            bridge.record_written(written);
            Ok(true)
        }
        // The Task changed since it was read (a cancel, a deletion, a new
        // attempt): nothing was sent; the next reconcile reads it again.
        Err(e) if e.is_conflict() || e.is_not_found() => {
            info!(robot, attempt, "task changed before its dispatch; not sent");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Sends a running attempt its configuration as the objects are now (the
/// manager asked: one of them changed). When they no longer resolve, the
/// attempt runs on with what it has; its status says so at the asked
/// generation (so that a rolling restart does not wait for it), with a
/// Warning Event.
async fn send_config(ctx: &Context, task: &Task, uid: &str, send: decide::ConfigSend) -> Result<()> {
    let bridge = ctx.bridge.as_ref();
    let decide::ConfigSend {
        robot,
        attempt,
        generation,
    } = send;
    let problem = match task_config::resolve(bridge, task, &robot).await? {
        None => None,
        Some(Err(problem)) => Some(problem.to_string()),
        Some(Ok(mut config)) => {
            config.generation = generation;
            let body = encode(&ConfigUpdate {
                v: k8s4r_api::protocol::PROTOCOL_VERSION,
                task_uid: uid.to_owned(),
                attempt,
                config,
            });
            if body.len() > MAX_MESSAGE_BYTES {
                Some(format!(
                    "it would be {} KiB, over the {} KiB a message to a robot may be",
                    body.len().div_ceil(1024),
                    MAX_MESSAGE_BYTES / 1024
                ))
            } else {
                let published = bridge
                    .publisher()
                    .publish(bridge.topics().config_update(&robot), body)
                    .await;
                if let Err(e) = published {
                    bridge.metrics().message_out("config", "failed");
                    return Err(e);
                }
                bridge.metrics().message_out("config", "acked");
                info!(robot, attempt, generation, "changed configuration sent");
                None
            }
        }
    };
    let Some(why) = problem else {
        lock(&ctx.config_sent).insert(uid.to_owned(), (attempt, generation));
        return Ok(());
    };
    warn!(robot, attempt, generation, %why, "changed configuration not sent");
    let mut config = task
        .status
        .as_ref()
        .and_then(|s| s.config.clone())
        .unwrap_or_default();
    config.generation = generation;
    config.message = Some(format!("not sent: {why}; it runs on with what it had"));
    #[derive(Debug, Serialize)]
    struct ConfigOnly {
        config: k8s4r_api::TaskConfigStatus,
    }
    bridge.write_status(task, &ConfigOnly { config }).await?;
    lock(&ctx.config_sent).insert(uid.to_owned(), (attempt, generation));
    let note = format!("attempt {attempt} on robot {robot}: the changed configuration was not sent: {why}; it runs on with what it had");
    record_event(
        ctx,
        task,
        EventType::Warning,
        "ConfigChangeFailed",
        "Reconfigure",
        note,
    )
    .await;
    Ok(())
}

/// Records an Event on the Task for `kubectl describe`; best effort, since
/// a lost Event must not hold up a dispatch.
async fn record(ctx: &Context, task: &Task, reason: &str, action: &str, note: String) {
    record_event(ctx, task, EventType::Normal, reason, action, note).await;
}

/// A Warning on the Task: its configuration kept an attempt from its robot.
async fn record_warning(ctx: &Context, task: &Task, reason: TaskReason, note: String) {
    let reason = format!("{reason:?}");
    record_event(ctx, task, EventType::Warning, &reason, "Dispatch", note).await;
}

async fn record_event(
    ctx: &Context,
    task: &Task,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    if !ctx.routine.admits(type_) {
        if !ctx.routine.is_off() {
            ctx.bridge.metrics().event_dropped();
        }
        return;
    }
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: None,
    };
    let reference = task.object_ref(&());
    let recorded = ctx
        .bridge
        .kube()
        .write(
            "event",
            || format!("recording {reason} on task {}", decide::task_name(task)),
            ctx.recorder.publish(&event, &reference),
        )
        .await;
    if let Err(error) = recorded {
        warn!(reason, %error, "could not record an event");
    }
}

/// Publishes the cancel of a deleted or cancelled Task's attempt.
async fn cancel(bridge: &Bridge, task: &Task, robot: &str, attempt: u32) -> Result<()> {
    publish_stop(bridge, task, robot, attempt, &Stop::of_task(task)).await
}

/// Publishes a cancel of `attempt` saying `stop`, and waits for the
/// broker's PUBACK.
async fn publish_stop(bridge: &Bridge, task: &Task, robot: &str, attempt: u32, stop: &Stop) -> Result<()> {
    let message = stop.message(task.metadata.uid.clone().unwrap_or_default(), attempt);
    match bridge
        .publisher()
        .publish(bridge.topics().cancel(robot), encode(&message))
        .await
    {
        Ok(()) => {
            bridge.metrics().message_out("cancel", "acked");
            info!(robot, attempt, drain = stop.drain, "cancel published");
            Ok(())
        }
        Err(e) => {
            bridge.metrics().message_out("cancel", "failed");
            Err(e)
        }
    }
}

async fn release(bridge: &Bridge, task: &Task) -> Result<()> {
    let api = api_for(bridge, task);
    let name = task.name_any();
    let finalizers = task
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != FINALIZER_CANCEL)
        .cloned()
        .collect();
    let body = Guarded::metadata(
        task.metadata.resource_version.as_deref(),
        Finalizers { finalizers },
    );
    let result = bridge
        .kube()
        .patch("task_finalizer", &api, &name, &body, || {
            format!("releasing the finalizer of task {}", decide::task_name(task))
        })
        .await
        .map_err(Error::from);
    match result {
        Ok(_) => {
            info!(task = %decide::task_name(task), "finalizer released");
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}
