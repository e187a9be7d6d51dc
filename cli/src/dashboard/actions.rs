//! What a user may do from the dashboard: cancel and retry a Task,
//! TaskGroup or Job, cordon and uncordon a Robot, through exactly what
//! `k8s4r cancel|retry` and `k8s4r cordon|uncordon` do (the same
//! annotations and patch, as the same user). A GET of an action's URL asks
//! for confirmation, or says why the user may not; only a POST with the
//! dashboard's CSRF token acts.

use std::sync::Arc;

use axum::extract::{Form, Path, State as Extract};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::guard::form_ok;
use super::views::{problem, Page};
use super::State;
use crate::operate::{Manual, Target};

/// A submitted action form.
#[derive(Debug, Deserialize)]
pub struct ActionForm {
    #[serde(rename = "_csrf")]
    csrf: Option<String>,
}

/// A Task, TaskGroup or Job action, from its URL.
struct Work {
    target: Target,
    manual: Manual,
    /// The resource, for the permission it takes.
    plural: &'static str,
}

fn work(kind: &str, name: &str, action: &str) -> Option<Work> {
    let (target, plural) = match kind {
        "tasks" => (Target::Task(name.to_owned()), "tasks"),
        "taskgroups" => (Target::Group(name.to_owned()), "taskgroups"),
        "jobs" => (Target::Job(name.to_owned()), "jobs"),
        _ => return None,
    };
    let manual = match action {
        "cancel" => Manual::Cancel,
        "retry" => Manual::Retry,
        _ => return None,
    };
    Some(Work {
        target,
        manual,
        plural,
    })
}

fn not_allowed(state: &State, verb: &str, what: &str, place: &str, plural: &str) -> String {
    format!(
        "you ({}) may not {verb} {what}{place}: it takes `patch` on {plural}.robot.k8s4r.io",
        state.user.as_deref().unwrap_or("this user")
    )
}

/// Asks to confirm a cancel or retry, or says why it may not be done.
pub async fn work_form(
    Extract(state): Extract<Arc<State>>,
    Path((ns, kind, name, action)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(w) = work(&kind, &name, &action) else {
        return problem(
            &state,
            &headers,
            StatusCode::NOT_FOUND,
            "No such action",
            "no such action",
        );
    };
    let what = w.target.describe();
    let place = format!(" in namespace {ns}");
    if !state.can_i("patch", w.plural, &ns).await {
        let message = not_allowed(&state, w.manual.verb(), &what, &place, w.plural);
        return problem(&state, &headers, StatusCode::FORBIDDEN, "Not allowed", &message);
    }
    confirm(
        &state,
        &headers,
        &format!("{} {what}{place}?", w.manual.verb()),
        &action,
    )
}

/// Cancels or retries, then shows the object.
pub async fn work_action(
    Extract(state): Extract<Arc<State>>,
    Path((ns, kind, name, action)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if !form_ok(&state, form.csrf.as_deref()) {
        return problem(
            &state,
            &headers,
            StatusCode::FORBIDDEN,
            "Refused",
            "the form's token is not this dashboard's: reload the page",
        );
    }
    let Some(w) = work(&kind, &name, &action) else {
        return problem(
            &state,
            &headers,
            StatusCode::NOT_FOUND,
            "No such action",
            "no such action",
        );
    };
    let what = w.target.describe();
    let place = format!(" in namespace {ns}");
    if !state.can_i("patch", w.plural, &ns).await {
        let message = not_allowed(&state, w.manual.verb(), &what, &place, w.plural);
        return problem(&state, &headers, StatusCode::FORBIDDEN, "Not allowed", &message);
    }
    match crate::operate::request(&state.client, &ns, &w.target, w.manual, state.user.as_deref()).await {
        Ok(_) => {
            let back = match kind.as_str() {
                "taskgroups" => "/jobs".to_owned(),
                _ => format!("/ns/{ns}/{kind}/{name}"),
            };
            Redirect::to(&back).into_response()
        }
        Err(e) => problem(
            &state,
            &headers,
            StatusCode::BAD_GATEWAY,
            "Not done",
            &format!("{e:#}"),
        ),
    }
}

fn cordon_of(action: &str) -> Option<bool> {
    match action {
        "cordon" => Some(true),
        "uncordon" => Some(false),
        _ => None,
    }
}

/// Asks to confirm a cordon or uncordon, or says why it may not be done.
pub async fn robot_form(
    Extract(state): Extract<Arc<State>>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if cordon_of(&action).is_none() {
        return problem(
            &state,
            &headers,
            StatusCode::NOT_FOUND,
            "No such action",
            "no such action",
        );
    }
    if !state.can_i("patch", "robots", "").await {
        let message = not_allowed(&state, &action, &format!("robot {name}"), "", "robots");
        return problem(&state, &headers, StatusCode::FORBIDDEN, "Not allowed", &message);
    }
    confirm(&state, &headers, &format!("{action} robot {name}?"), &action)
}

/// Cordons or uncordons, then shows the robot.
pub async fn robot_action(
    Extract(state): Extract<Arc<State>>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if !form_ok(&state, form.csrf.as_deref()) {
        return problem(
            &state,
            &headers,
            StatusCode::FORBIDDEN,
            "Refused",
            "the form's token is not this dashboard's: reload the page",
        );
    }
    let Some(on) = cordon_of(&action) else {
        return problem(
            &state,
            &headers,
            StatusCode::NOT_FOUND,
            "No such action",
            "no such action",
        );
    };
    if !state.can_i("patch", "robots", "").await {
        let message = not_allowed(&state, &action, &format!("robot {name}"), "", "robots");
        return problem(&state, &headers, StatusCode::FORBIDDEN, "Not allowed", &message);
    }
    match crate::drain::set_unschedulable(&state.client, &name, on).await {
        Ok(_) => Redirect::to(&format!("/robots/{name}")).into_response(),
        Err(e) => problem(
            &state,
            &headers,
            StatusCode::BAD_GATEWAY,
            "Not done",
            &format!("{e:#}"),
        ),
    }
}

/// A page asking to confirm `question`, posting back to the same URL.
fn confirm(state: &State, headers: &HeaderMap, question: &str, action: &str) -> Response {
    let live = html! {
        form.action method="post" {
            p { (question) }
            input type="hidden" name="_csrf" value=(state.csrf_token());
            button type="submit" data-action=(action) { "Confirm" }
        }
    };
    Page {
        title: "Confirm".into(),
        watch: "",
        live,
        after: None,
    }
    .render(state, headers)
}
