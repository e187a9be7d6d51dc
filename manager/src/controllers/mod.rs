//! The four controllers, the caches they share and the plumbing between them.
//!
//! - [`context`]: what every reconcile gets (client, caches, scheduler
//!   state, triggers, Events, error backoff);
//! - [`informers`]: one watch per kind fills one shared cache; its handlers
//!   keep the scheduler's state current and trigger the controllers;
//! - [`facts`]: the scheduler's view of Tasks and Robots;
//! - [`job`], [`taskgroup`], [`task`], [`robot`], [`periodic`]: the
//!   reconcilers.
//!
//! A Task change is read off the wire once however many controllers care.
//! What the informers learn that should reconcile another object enters
//! that object's controller through a channel (`reconcile_on`).

mod config;
pub mod context;
pub mod facts;
mod informers;
pub mod job;
mod pacing;
pub mod periodic;
pub mod robot;
pub mod rollout;
pub mod task;
pub mod taskgroup;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedReceiver};
use futures::StreamExt;
use jiff::Timestamp;
use k8s4r_api::names::MANAGER_CONTROLLERS;
use k8s4r_api::{AgentRollout, Condition, ConditionStatus, Job, PeriodicJob, Robot, Task, TaskGroup};
use k8s4r_service::backoff::Failures;
use k8s4r_service::events::Recorder;
use k8s4r_service::Kube;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};
use kube::runtime::Controller;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::config::ManagerConfig;
use crate::error::Result;
use crate::metrics::Metrics;

use context::{publish_events, EventSink, Triggers};
pub use context::{Context, Look, Note, Requests, SchedState, Stores};
pub use facts::{demand_of, facts_of, group_of, key_of, placement_of};
use informers::{informer, keep};
use k8s4r_service::watch::trim;
use pacing::Pacer;

/// A condition that changed at `now`. (`Condition::new` reads the clock;
/// the plans are given it, so that they can be tested.)
pub(crate) fn condition_at(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status,
        reason: Some(reason.to_owned()),
        message: Some(message.into()),
        last_transition_time: Some(now),
        observed_generation: None,
    }
}

/// Starts the caches and the five controllers; returns when `shutdown` is
/// cancelled and the controllers have drained.
pub async fn run(
    client: Client,
    config: ManagerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    shutdown: CancellationToken,
) -> Result<()> {
    let (triggers, receivers) = triggers();
    let (stores, periodics, writers) = caches();
    let events = event_sink(&client, &config, identity);
    let ctx = Arc::new(Context {
        kube: Kube::new(client.clone(), config.api_timeout, MANAGER_CONTROLLERS),
        metrics: metrics.clone(),
        stores: stores.clone(),
        sched: Mutex::default(),
        triggers,
        events,
        failures: Failures::default(),
        seen: Mutex::default(),
        slots: context::reconcile_slots(config.concurrency),
        group_views: Mutex::default(),
        written_jobs: Default::default(),
        written_groups: Default::default(),
        every_robot_groups: Mutex::default(),
        lease_durations: Mutex::default(),
        allocations: Pacer::new(config.allocation_interval),
        progress: Pacer::new(config.progress_interval),
        group_tasks: Default::default(),
        job_groups: Default::default(),
        config_asked: Mutex::default(),
        config_turns: tokio::sync::Mutex::default(),
        config,
    });
    let informers = start_informers(&client, &ctx, writers);

    // Scheduling before every robot and every assignment is known would
    // double-book robots: wait for the caches first.
    let ready = async {
        let _ = tokio::join!(
            stores.tasks.wait_until_ready(),
            stores.groups.wait_until_ready(),
            stores.robots.wait_until_ready(),
            stores.leases.wait_until_ready(),
            stores.jobs.wait_until_ready(),
            stores.rollouts.wait_until_ready(),
            stores.config_maps.wait_until_ready(),
            stores.secrets.wait_until_ready(),
            periodics.wait_until_ready()
        );
    };
    tokio::select! {
        _ = ready => {}
        _ = shutdown.cancelled() => {
            informers.abort();
            return Ok(());
        }
    }
    tracing::info!("caches filled, starting controllers");
    metrics.set_ready(true);

    let drained = controllers(&ctx, stores, periodics, receivers, &shutdown);
    // Reconciles in flight finish (each API call is bounded by the API
    // timeout); past the grace period the controllers are dropped, so that
    // a stop or a lost Lease always ends.
    let grace = ctx.config.api_timeout + Duration::from_secs(5);
    tokio::select! {
        () = drained => {}
        () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "controllers did not drain in time; stopping them");
        }
    }
    informers.abort();
    metrics.set_ready(false);
    tracing::info!("controllers stopped");
    Ok(())
}

/// The receiving ends of the triggers, one per controller.
struct Receivers {
    task: UnboundedReceiver<ObjectRef<Task>>,
    group: UnboundedReceiver<ObjectRef<TaskGroup>>,
    job: UnboundedReceiver<ObjectRef<Job>>,
    robot: UnboundedReceiver<ObjectRef<Robot>>,
    periodic: UnboundedReceiver<ObjectRef<PeriodicJob>>,
    rollout: UnboundedReceiver<ObjectRef<AgentRollout>>,
}

/// A channel into each controller.
fn triggers() -> (Triggers, Receivers) {
    let (task_tx, task_rx) = unbounded();
    let (group_tx, group_rx) = unbounded();
    let (job_tx, job_rx) = unbounded();
    let (robot_tx, robot_rx) = unbounded();
    let (periodic_tx, periodic_rx) = unbounded();
    let (rollout_tx, rollout_rx) = unbounded();
    let triggers = Triggers {
        task: task_tx,
        group: group_tx,
        job: job_tx,
        robot: robot_tx,
        periodic: periodic_tx,
        rollout: rollout_tx,
    };
    let receivers = Receivers {
        task: task_rx,
        group: group_rx,
        job: job_rx,
        robot: robot_rx,
        periodic: periodic_rx,
        rollout: rollout_rx,
    };
    (triggers, receivers)
}

/// What fills the caches, one per kind.
struct Writers {
    task: Writer<Task>,
    group: Writer<TaskGroup>,
    robot: Writer<Robot>,
    job: Writer<Job>,
    lease: Writer<Lease>,
    periodic: Writer<PeriodicJob>,
    rollout: Writer<AgentRollout>,
    config_map: Writer<ConfigMap>,
    secret: Writer<Secret>,
}

/// The empty caches: those the reconciles share, the PeriodicJobs' (only
/// their controller reads it), and their writers.
fn caches() -> (Stores, Store<PeriodicJob>, Writers) {
    let (tasks, task) = reflector::store::<Task>();
    let (groups, group) = reflector::store::<TaskGroup>();
    let (robots, robot) = reflector::store::<Robot>();
    let (jobs, job) = reflector::store::<Job>();
    let (leases, lease) = reflector::store::<Lease>();
    let (periodics, periodic) = reflector::store::<PeriodicJob>();
    let (rollouts, rollout) = reflector::store::<AgentRollout>();
    let (config_maps, config_map) = reflector::store::<ConfigMap>();
    let (secrets, secret) = reflector::store::<Secret>();
    let stores = Stores {
        tasks,
        groups,
        robots,
        leases,
        jobs,
        rollouts,
        config_maps,
        secrets,
    };
    let writers = Writers {
        task,
        group,
        robot,
        job,
        lease,
        periodic,
        rollout,
        config_map,
        secret,
    };
    (stores, periodics, writers)
}

/// Where Events go, with their publisher started; `None` when the
/// configuration turns Events off.
fn event_sink(client: &Client, config: &ManagerConfig, identity: String) -> Option<EventSink> {
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(4096);
    let events = config.events.then(|| {
        let routine = k8s4r_service::events::RoutineBudget::configured(
            config.routine_events,
            config.event_qps,
            config.event_burst,
        );
        EventSink::new(events_tx, routine)
    });
    if events.is_some() {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER_CONTROLLERS.to_owned(),
                instance: Some(identity),
            },
        );
        tokio::spawn(publish_events(recorder, events_rx, config.api_timeout));
    }
    events
}

/// Starts one watch per kind, each filling its cache and calling its
/// handler on `ctx`.
fn start_informers(client: &Client, ctx: &Arc<Context>, writers: Writers) -> tokio::task::JoinHandle<()> {
    // The Job cache is filled before its controller starts, like the others
    // (a controller with a cache of its own waits for it even while shutting
    // down).
    let lease_api = Api::<Lease>::namespaced(client.clone(), &ctx.config.robot_lease_namespace);
    let (c1, c2, c3, c4, c5, c6, c7, c8, c9) = (
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
        ctx.clone(),
    );
    let periodic_watch = informer(
        Api::all(client.clone()),
        writers.periodic,
        keep,
        "periodicjob watch",
        move |e| c6.on_periodic(e),
    );
    let rollout_watch = informer(
        Api::all(client.clone()),
        writers.rollout,
        keep,
        "agentrollout watch",
        move |e| c7.on_rollout(e),
    );
    // What tasks take from ConfigMaps and Secrets: keys and sizes only.
    let config_watch = futures::future::join(
        informer(
            Api::all(client.clone()),
            writers.config_map,
            config::keys_of_config_map,
            "configmap watch",
            move |e| c8.on_config_map(e),
        ),
        informer(
            Api::all(client.clone()),
            writers.secret,
            config::keys_of_secret,
            "secret watch",
            move |e| c9.on_secret(e),
        ),
    );
    let all = futures::future::join5(
        informer(
            Api::all(client.clone()),
            writers.task,
            keep,
            "task watch",
            move |e| c1.on_task(e),
        ),
        // As many Robots and Leases as robots: cached without managedFields.
        informer(
            Api::all(client.clone()),
            writers.robot,
            trim,
            "robot watch",
            move |e| c2.on_robot(e),
        ),
        informer(
            Api::all(client.clone()),
            writers.group,
            keep,
            "taskgroup watch",
            move |e| c3.on_group(e),
        ),
        informer(lease_api, writers.lease, trim, "robot lease watch", move |e| {
            c4.on_lease(e)
        }),
        informer(
            Api::all(client.clone()),
            writers.job,
            keep,
            "job watch",
            move |e| c5.on_job(e),
        ),
    );
    tokio::spawn(async move {
        futures::future::join4(all, periodic_watch, rollout_watch, config_watch).await;
    })
}

/// The five controllers, run until `shutdown` and drained.
async fn controllers(
    ctx: &Arc<Context>,
    stores: Stores,
    periodics: Store<PeriodicJob>,
    receivers: Receivers,
    shutdown: &CancellationToken,
) {
    let stop = || shutdown.clone().cancelled_owned();
    let close = async {
        shutdown.cancelled().await;
        ctx.close_slots();
    };
    // At most `concurrency` reconciles of each controller run at once (each
    // may hold a connection to the API server), waiting in a fair queue for
    // a slot (`Context::instrumented`): kube-runtime's own limit is off.
    let config = kube::runtime::controller::Config::default;
    // Every trigger comes from the watch handlers through `reconcile_on`.
    let task_ctrl = Controller::for_stream(futures::stream::pending(), stores.tasks)
        .with_config(config())
        .reconcile_on(receivers.task)
        .graceful_shutdown_on(stop())
        .run(task::reconcile, task::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let status_config = || config().debounce(ctx.config.status_debounce);
    let group_ctrl = Controller::for_stream(futures::stream::pending(), stores.groups)
        .with_config(status_config())
        .reconcile_on(receivers.group)
        .graceful_shutdown_on(stop())
        .run(taskgroup::reconcile, taskgroup::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let job_ctrl = Controller::for_stream(futures::stream::pending(), stores.jobs)
        .with_config(status_config())
        .reconcile_on(receivers.job)
        .graceful_shutdown_on(stop())
        .run(job::reconcile, job::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let robot_ctrl = Controller::for_stream(futures::stream::pending(), stores.robots)
        .with_config(config().debounce(ctx.config.robot_debounce))
        .reconcile_on(receivers.robot)
        .graceful_shutdown_on(stop())
        .run(robot::reconcile, robot::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let periodic_ctrl = Controller::for_stream(futures::stream::pending(), periodics)
        .with_config(config())
        .reconcile_on(receivers.periodic)
        .graceful_shutdown_on(stop())
        .run(periodic::reconcile, periodic::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    // Robots change often; a rollout looks at all of them once a second at
    // most.
    let rollout_ctrl = Controller::for_stream(futures::stream::pending(), stores.rollouts)
        .with_config(config().debounce(Duration::from_secs(1)))
        .reconcile_on(receivers.rollout)
        .graceful_shutdown_on(stop())
        .run(rollout::reconcile, rollout::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    tokio::join!(
        close,
        task_ctrl,
        group_ctrl,
        job_ctrl,
        robot_ctrl,
        periodic_ctrl,
        rollout_ctrl
    );
}
