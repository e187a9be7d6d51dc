//! A Task's page: its state and actions, its attempts, conditions and
//! Events, the current attempt's output, which follows a retry, and a
//! terminal in the running task for a user who may exec.

use std::sync::Arc;

use axum::extract::{Path, State as Extract};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::{OutputState, Task, TaskState, TaskStatus};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use maud::{html, Markup};

use super::{action_button, badge, confirm_button, events_of, events_table, problem, task_state, time, Page};
use crate::dashboard::terminal::DEFAULT_COMMAND;
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
    let can_exec = state.can_exec(&ns).await;
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
        @if !s.outputs.is_empty() {
            h2 { "Outputs" }
            (outputs_table(&ns, &name, &s))
        }
        h2 { "Conditions" }
        ul { @for c in &s.conditions { li { (c.type_) ": " (format!("{:?}", c.status)) " " (c.reason.as_deref().unwrap_or("")) " — " (c.message.as_deref().unwrap_or("")) } } }
        (events_table(&events))
    };
    let after = html! {
        section.log aria-labelledby="log-h" {
            h2 #log-h { "Output" }
            p #log-status role="status" aria-live="polite" {}
            pre #log role="log" tabindex="0" aria-label="The task's output" data-base=(format!("/ns/{ns}/tasks/{name}/log")) {}
        }
        @if can_exec { (terminal_section(&ns, &name)) }
    };
    Page {
        title: format!("Task {name}"),
        watch: "task",
        live,
        after: Some(after),
        terminal: can_exec,
    }
    .render(&state, &headers)
}

/// A terminal in the running task, for a user who may exec (as
/// `k8s4r exec -it TASK -- COMMAND`): the command to run, and the
/// emulator once it is opened.
fn terminal_section(ns: &str, name: &str) -> Markup {
    html! {
        section.terminal aria-labelledby="term-h" {
            h2 #term-h { "Terminal" }
            form #term-form {
                label for="term-command" { "Command" }
                input #term-command name="command" value=(DEFAULT_COMMAND) autocomplete="off" spellcheck="false";
                button #term-open type="submit" { "Open a terminal" }
                button #term-close type="button" hidden { "Close" }
            }
            p #term-status role="status" aria-live="polite" {}
            div #terminal hidden data-url=(format!("/ns/{ns}/tasks/{name}/terminal")) {}
        }
    }
}

/// The files the task's robot uploaded: a download link for each one the
/// bucket holds (through the cluster, with the viewer's permissions), the
/// reason for each one dropped.
fn outputs_table(ns: &str, name: &str, s: &TaskStatus) -> Markup {
    html! {
        table.outputs { thead { tr { th scope="col" { "Attempt" } th scope="col" { "Path" } th scope="col" { "Size" } th scope="col" { "State" } th scope="col" { "Key or reason" } } }
            tbody {
                @for o in &s.outputs {
                    tr {
                        th scope="row" { (o.attempt) }
                        td { @if o.state == OutputState::Uploaded {
                            a href=(format!("/ns/{ns}/tasks/{name}/outputs?attempt={}&path={}", o.attempt, super::url_encode(&o.path))) download { (o.path) }
                        } @else { (o.path) } }
                        td { (o.size) }
                        td { (badge(match o.state { OutputState::Uploading => "Uploading", OutputState::Uploaded => "Uploaded", OutputState::Dropped => "Dropped" })) }
                        td { @if o.state == OutputState::Dropped { (o.message.as_deref().unwrap_or("")) } @else { code { (o.key) } } }
                    }
                }
            } }
    }
}

/// Which output to download.
#[derive(Debug, serde::Deserialize)]
pub struct OutputQuery {
    path: String,
    attempt: Option<u32>,
}

/// One output, downloaded through the cluster as the viewer (`get` on
/// `tasks/outputs`), as an attachment.
pub async fn output(
    Extract(state): Extract<Arc<State>>,
    Path((ns, name)): Path<(String, String)>,
    axum::extract::Query(query): axum::extract::Query<OutputQuery>,
    headers: HeaderMap,
) -> Response {
    let opened = crate::outputs::open(&state.client, &ns, &name, &query.path, query.attempt).await;
    let download = match opened {
        Ok(d) => d,
        Err(e) => {
            let message = format!("{e:#}");
            let code = if message.contains("you may not") {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::NOT_FOUND
            };
            return problem(&state, &headers, code, &name, &message);
        }
    };
    let file = query
        .path
        .rsplit('/')
        .next()
        .unwrap_or("output")
        .replace(['"', '\\'], "_");
    let mut answer = Response::builder()
        .header("content-type", "application/octet-stream")
        .header("content-disposition", format!("attachment; filename=\"{file}\""));
    if let Some(sha) = &download.sha256 {
        answer = answer.header("x-k8s4r-sha256", sha.as_str());
    }
    if let Some(size) = download.size {
        answer = answer.header("content-length", size);
    }
    answer
        .body(axum::body::Body::from_stream(download.body))
        .unwrap_or_else(|e| {
            problem(
                &state,
                &headers,
                StatusCode::INTERNAL_SERVER_ERROR,
                &name,
                &e.to_string(),
            )
        })
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
