//! A Task's page: its state and actions, its attempts, conditions and
//! Events, and the current attempt's output, which follows a retry.

use std::sync::Arc;

use axum::extract::{Path, State as Extract};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::{Task, TaskState, TaskStatus};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use maud::{html, Markup};

use super::{action_button, badge, confirm_button, events_of, events_table, problem, task_state, time, Page};
use crate::dashboard::State;

pub async fn task(
    Extract(state): Extract<Arc<State>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(task) = state.tasks.get(&ObjectRef::new(&name).within(&ns)) else {
        let message = format!("task {name} not found in namespace {ns} (or you may not see it)");
        return problem(&state, &headers, StatusCode::NOT_FOUND, &name, &message);
    };
    let s = task.status.clone().unwrap_or_default();
    let events = events_of(&state, "Task", &name, Some(&ns)).await;
    let can = state.can_i("patch", "tasks", &ns).await;
    // What the output pane follows: the current attempt, once it began; a
    // pending task waits to start the attempt after its last.
    let (phase, pane_attempt) = match s.state {
        None | Some(TaskState::Pending) => ("waiting", s.attempt + 1),
        Some(TaskState::Running) => ("running", s.attempt),
        Some(state) if state.is_terminal() => ("ended", s.attempt),
        Some(_) => ("waiting", s.attempt),
    };
    let running = matches!(s.state, Some(TaskState::Running | TaskState::Dispatching));
    let retryable = matches!(s.state, Some(TaskState::Failed | TaskState::Cancelled));
    let cancel_url = format!("/ns/{ns}/tasks/{name}/cancel");
    let job = task.labels().get(LABEL_JOB).cloned();
    let live = html! {
        p { (badge(task_state(&task))) " attempt " (s.attempt)
            @if let Some(r) = &s.robot { " on " a href=(format!("/robots/{r}")) { (r) } }
            @if let Some(j) = &job { " · job " a href=(format!("/ns/{ns}/jobs/{j}")) { (j) } } }
        @if let Some(m) = &s.message { p.message { (m) } }
        span #attempt-now hidden data-attempt=(pane_attempt) data-phase=(phase) {}
        div.actions {
            @if running {
                (confirm_button(&state, &cancel_url, "Cancel", &format!("Stop attempt {} on robot {} and cancel the task?", s.attempt, s.robot.as_deref().unwrap_or("?")), can))
            } @else if phase != "ended" {
                (action_button(&state, &cancel_url, "Cancel", can))
            }
            @if retryable { (action_button(&state, &format!("/ns/{ns}/tasks/{name}/retry"), "Retry", can)) }
        }
        h2 { "Attempts" }
        (attempts_table(&task, &s))
        h2 { "Conditions" }
        ul { @for c in &s.conditions { li { (c.type_) ": " (format!("{:?}", c.status)) " " (c.reason.as_deref().unwrap_or("")) " — " (c.message.as_deref().unwrap_or("")) } } }
        (events_table(&events))
    };
    let after = html! {
        section.log aria-labelledby="log-h" {
            h2 #log-h { "Output" }
            p #log-status role="status" aria-live="polite" {}
            pre #log tabindex="0" aria-label="The task's output" data-base=(format!("/ns/{ns}/tasks/{name}/log")) {}
        }
    };
    Page {
        title: format!("Task {name}"),
        watch: "task",
        live,
        after: Some(after),
    }
    .render(&state, &headers)
}

/// Every attempt of the task, each with its start and end, its message
/// on a row of its own; the current one last.
fn attempts_table(task: &Task, s: &TaskStatus) -> Markup {
    html! {
            table.attempts { thead { tr { th scope="col" { "Attempt" } th scope="col" { "Robot" } th scope="col" { "Started" } th scope="col" { "Ended" } th scope="col" { "State" } th scope="col" { "Reason" } th scope="col" { "Exit" } th scope="col" { "Restarts" } } }
                tbody {
                    @for a in &s.attempts {
                        tr {
                            th scope="row" { (a.attempt) } td { (a.robot.as_deref().unwrap_or("-")) } td { (time(a.start_time)) } td { (time(a.finish_time)) }
                            td { (badge(a.state.as_str())) } td { (a.reason.map(|r| format!("{r:?}")).unwrap_or_default()) }
                            td { (a.exit_code.map(|c| c.to_string()).unwrap_or_default()) } td { "-" }
                        }
                        @if let Some(m) = &a.message { tr.said { td.message colspan="8" { (m) } } }
                    }
                    tr.current {
                        th scope="row" { (s.attempt) " (current)" } td { (s.robot.as_deref().unwrap_or("-")) } td { (time(s.start_time)) } td { (time(s.finish_time)) }
                        td { (badge(task_state(task))) } td { (s.reason.map(|r| format!("{r:?}")).unwrap_or_default()) }
                        td { (s.exit_code.map(|c| c.to_string()).unwrap_or_default()) } td { (s.restarts.restart_count) }
                    }
                } }
    }
}
