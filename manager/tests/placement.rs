//! Where a Task's robot is written: a Task a robot fits when the manager
//! makes it is created naming that robot, so its placement costs one write
//! more (the status), not two. Watched version by version against the
//! embedded API server.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s4r_api::{LabelSelector, Task, TaskState};
use kube::api::{WatchEvent, WatchParams};
use kube::{Api, ResourceExt};

const WAIT: Duration = Duration::from_secs(20);

/// Every version of each Task the watch shows, in order, until `done`
/// holds for what was seen (or `WAIT` passes: a failure). `between` runs
/// after each event, with what was seen so far.
async fn versions_until(
    tasks: &Api<Task>,
    done: impl Fn(&HashMap<String, Vec<Task>>) -> bool,
    mut between: impl AsyncFnMut(&HashMap<String, Vec<Task>>),
) -> HashMap<String, Vec<Task>> {
    let mut events = tasks
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch tasks")
        .boxed();
    let mut seen: HashMap<String, Vec<Task>> = HashMap::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(&seen) {
        let event = tokio::time::timeout_at(deadline, events.try_next())
            .await
            .unwrap_or_else(|_| panic!("timed out; saw {:#?}", summary(&seen)))
            .expect("watch event")
            .expect("watch open");
        if let WatchEvent::Added(t) | WatchEvent::Modified(t) = event {
            seen.entry(t.name_any()).or_default().push(t);
        }
        between(&seen).await;
    }
    seen
}

/// A Task's versions as (target robot, state).
type Steps<'a> = Vec<(Option<&'a str>, Option<TaskState>)>;

/// Per Task, each version's target robot and state.
fn summary(seen: &HashMap<String, Vec<Task>>) -> HashMap<&str, Steps<'_>> {
    seen.iter()
        .map(|(name, versions)| {
            let steps = versions
                .iter()
                .map(|t| (t.spec.target_robot.as_deref(), state_of(t)))
                .collect();
            (name.as_str(), steps)
        })
        .collect()
}

fn dispatched(seen: &HashMap<String, Vec<Task>>, name: &str) -> bool {
    seen.get(name)
        .is_some_and(|v| v.iter().any(|t| dispatching_on(t).is_some()))
}

#[tokio::test]
async fn a_task_a_robot_fits_is_created_naming_it_and_one_none_fits_is_placed_later() {
    let (env, manager) = start(config()).await;
    let c = &env.client;
    let tasks: Api<Task> = Api::namespaced(c.clone(), NS);
    robot("lab-1").label("site", "lab").create(c).await;
    let lab = LabelSelector::from_labels([("site", "lab")]);
    let field = LabelSelector::from_labels([("site", "field")]);
    create_job(c, "now", Some(lab), vec![group("g", 2)]).await;
    create_job(c, "later", Some(field), vec![group("g", 1)]).await;

    let mut field_robot = false;
    let seen = versions_until(
        &tasks,
        |seen| {
            ["now-g-0", "now-g-1", "later-g-0"]
                .iter()
                .all(|n| dispatched(seen, n))
        },
        async |seen| {
            // The field robot comes once the Task it is for was created
            // without one.
            if !field_robot && seen.contains_key("later-g-0") {
                field_robot = true;
                robot("field-1").label("site", "field").create(c).await;
            }
        },
    )
    .await;

    for name in ["now-g-0", "now-g-1"] {
        let versions = &seen[name];
        let created = &versions[0];
        assert_eq!(
            created.spec.target_robot.as_deref(),
            Some("lab-1"),
            "{name} is created naming its robot: {:#?}",
            summary(&seen)
        );
        assert_eq!(state_of(created), None, "{name}: no status at creation");
        let to_dispatch = versions.iter().position(|t| dispatching_on(t).is_some()).unwrap();
        assert_eq!(
            to_dispatch,
            1,
            "{name}: one write (the status) from creation to dispatching: {:#?}",
            summary(&seen)
        );
        let dispatching = &versions[to_dispatch];
        assert_eq!(dispatching_on(dispatching), Some("lab-1"));
        assert_eq!(dispatching.status.as_ref().unwrap().attempt, 1);
    }

    let later = &seen["later-g-0"];
    assert_eq!(
        later[0].spec.target_robot,
        None,
        "no robot fit when it was made: {:#?}",
        summary(&seen)
    );
    let last = later.last().unwrap();
    assert_eq!(dispatching_on(last), Some("field-1"));
    assert_eq!(last.spec.target_robot.as_deref(), Some("field-1"));
    assert_eq!(last.status.as_ref().unwrap().attempt, 1);
    manager.stop().await;
}
