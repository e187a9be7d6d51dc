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

pub mod context;
pub mod facts;
mod informers;
pub mod job;
pub mod periodic;
pub mod robot;
pub mod task;
pub mod taskgroup;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::unbounded;
use futures::StreamExt;
use k8s4r_api::names::MANAGER_CONTROLLERS;
use k8s4r_api::{Job, PeriodicJob, Robot, Task, TaskGroup};
use k8s4r_service::backoff::Failures;
use k8s4r_service::Kube;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::Controller;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::config::ManagerConfig;
use crate::error::Result;
use crate::metrics::Metrics;

use context::{publish_events, EventSink, Triggers};
pub use context::{Context, SchedState, Stores};
pub use facts::{demand_of, facts_of, group_of, key_of, placement_of};
use informers::informer;

/// Starts the caches and the five controllers; returns when `shutdown` is
/// cancelled and the controllers have drained.
pub async fn run(
    client: Client,
    config: ManagerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    shutdown: CancellationToken,
) -> Result<()> {
    let (task_tx, task_rx) = unbounded();
    let (group_tx, group_rx) = unbounded();
    let (job_tx, job_rx) = unbounded();
    let (robot_tx, robot_rx) = unbounded();
    let (periodic_tx, periodic_rx) = unbounded();

    let (tasks, task_writer) = reflector::store::<Task>();
    let (groups, group_writer) = reflector::store::<TaskGroup>();
    let (robots, robot_writer) = reflector::store::<Robot>();
    let (jobs, job_writer) = reflector::store::<Job>();
    let (leases, lease_writer) = reflector::store::<Lease>();
    let (periodics, periodic_writer) = reflector::store::<PeriodicJob>();

    let (events_tx, events_rx) = tokio::sync::mpsc::channel(4096);
    let events = config
        .events
        .then(|| EventSink::new(events_tx, config.event_qps, config.event_burst));
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

    let ctx = Arc::new(Context {
        kube: Kube::new(client.clone(), config.api_timeout, MANAGER_CONTROLLERS),
        metrics: metrics.clone(),
        stores: Stores {
            tasks: tasks.clone(),
            groups: groups.clone(),
            robots: robots.clone(),
            leases: leases.clone(),
            jobs: jobs.clone(),
        },
        sched: Mutex::default(),
        triggers: Triggers {
            task: task_tx,
            group: group_tx,
            job: job_tx,
            robot: robot_tx,
            periodic: periodic_tx,
        },
        events,
        failures: Failures::default(),
        seen: Mutex::default(),
        every_robot_groups: Mutex::default(),
        allocation_written: Mutex::default(),
        group_tasks: Default::default(),
        job_groups: Default::default(),
        config,
    });

    // The Job cache is filled before its controller starts, like the others
    // (a controller with a cache of its own waits for it even while shutting
    // down).
    let lease_api = Api::<Lease>::namespaced(client.clone(), &ctx.config.robot_lease_namespace);
    let informers = {
        let (c1, c2, c3, c4, c5, c6) = (
            ctx.clone(),
            ctx.clone(),
            ctx.clone(),
            ctx.clone(),
            ctx.clone(),
            ctx.clone(),
        );
        let periodic_watch = informer(
            Api::all(client.clone()),
            periodic_writer,
            "periodicjob watch",
            move |e| c6.on_periodic(e),
        );
        let all = futures::future::join5(
            informer(Api::all(client.clone()), task_writer, "task watch", move |e| {
                c1.on_task(e)
            }),
            informer(Api::all(client.clone()), robot_writer, "robot watch", move |e| {
                c2.on_robot(e)
            }),
            informer(
                Api::all(client.clone()),
                group_writer,
                "taskgroup watch",
                move |e| c3.on_group(e),
            ),
            informer(lease_api, lease_writer, "robot lease watch", move |e| {
                c4.on_lease(e)
            }),
            informer(Api::all(client.clone()), job_writer, "job watch", move |e| {
                c5.on_job(e)
            }),
        );
        tokio::spawn(async move {
            futures::future::join(all, periodic_watch).await;
        })
    };

    // Scheduling before every robot and every assignment is known would
    // double-book robots: wait for the caches first.
    let ready = async {
        let _ = tokio::join!(
            tasks.wait_until_ready(),
            groups.wait_until_ready(),
            robots.wait_until_ready(),
            leases.wait_until_ready(),
            jobs.wait_until_ready(),
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

    let stop = || shutdown.clone().cancelled_owned();
    // Every trigger comes from the watch handlers through `reconcile_on`.
    let task_ctrl = Controller::for_stream(futures::stream::pending(), tasks)
        .reconcile_on(task_rx)
        .graceful_shutdown_on(stop())
        .run(task::reconcile, task::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let status_config = || kube::runtime::controller::Config::default().debounce(ctx.config.status_debounce);
    let group_ctrl = Controller::for_stream(futures::stream::pending(), groups)
        .with_config(status_config())
        .reconcile_on(group_rx)
        .graceful_shutdown_on(stop())
        .run(taskgroup::reconcile, taskgroup::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let job_ctrl = Controller::for_stream(futures::stream::pending(), jobs)
        .with_config(status_config())
        .reconcile_on(job_rx)
        .graceful_shutdown_on(stop())
        .run(job::reconcile, job::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let robot_ctrl = Controller::for_stream(futures::stream::pending(), robots)
        .with_config(kube::runtime::controller::Config::default().debounce(ctx.config.robot_debounce))
        .reconcile_on(robot_rx)
        .graceful_shutdown_on(stop())
        .run(robot::reconcile, robot::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let periodic_ctrl = Controller::for_stream(futures::stream::pending(), periodics)
        .reconcile_on(periodic_rx)
        .graceful_shutdown_on(stop())
        .run(periodic::reconcile, periodic::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let drained = async {
        tokio::join!(task_ctrl, group_ctrl, job_ctrl, robot_ctrl, periodic_ctrl);
    };
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
