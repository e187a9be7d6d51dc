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

/// What an action URL asks, in words, and the permission it takes.
struct Asked {
    /// `cancel`, `retry`, `cordon`, `uncordon`.
    verb: &'static str,
    /// `task NAME`, `robot NAME`, ...
    what: String,
    /// ` in namespace NS`, or nothing for a Robot.
    place: String,
    /// The resource it patches.
    plural: &'static str,
    /// Its namespace; empty for a Robot.
    ns: String,
}

impl Asked {
    fn question(&self) -> String {
        format!("{} {}{}?", self.verb, self.what, self.place)
    }

    /// The page that refuses it when the API server says the user may not
    /// patch that resource there.
    async fn refusal(&self, state: &State, headers: &HeaderMap) -> Option<Response> {
        if state.can_i("patch", self.plural, &self.ns).await {
            return None;
        }
        let message = format!(
            "you ({}) may not {} {}{}: it takes `patch` on {}.robot.k8s4r.io",
            state.user.as_deref().unwrap_or("this user"),
            self.verb,
            self.what,
            self.place,
            self.plural
        );
        Some(problem(
            state,
            headers,
            StatusCode::FORBIDDEN,
            "Not allowed",
            &message,
        ))
    }
}

/// The page that refuses a POST whose form lacks this dashboard's token.
fn forged(state: &State, headers: &HeaderMap, form: &ActionForm) -> Option<Response> {
    let message = "the form's token is not this dashboard's: reload the page";
    (!form_ok(state, form.csrf.as_deref()))
        .then(|| problem(state, headers, StatusCode::FORBIDDEN, "Refused", message))
}

fn no_such_action(state: &State, headers: &HeaderMap) -> Response {
    problem(
        state,
        headers,
        StatusCode::NOT_FOUND,
        "No such action",
        "no such action",
    )
}

fn not_done(state: &State, headers: &HeaderMap, error: &anyhow::Error) -> Response {
    problem(
        state,
        headers,
        StatusCode::BAD_GATEWAY,
        "Not done",
        &format!("{error:#}"),
    )
}

impl Work {
    fn asked(&self, ns: &str) -> Asked {
        Asked {
            verb: self.manual.verb(),
            what: self.target.describe(),
            place: format!(" in namespace {ns}"),
            plural: self.plural,
            ns: ns.to_owned(),
        }
    }
}

/// Asks to confirm a cancel or retry, or says why it may not be done.
pub async fn work_form(
    Extract(state): Extract<Arc<State>>,
    Path((ns, kind, name, action)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(w) = work(&kind, &name, &action) else {
        return no_such_action(&state, &headers);
    };
    let asked = w.asked(&ns);
    if let Some(refused) = asked.refusal(&state, &headers).await {
        return refused;
    }
    confirm(&state, &headers, &asked.question(), &action)
}

/// Cancels or retries, then shows the object.
pub async fn work_action(
    Extract(state): Extract<Arc<State>>,
    Path((ns, kind, name, action)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = forged(&state, &headers, &form) {
        return refused;
    }
    let Some(w) = work(&kind, &name, &action) else {
        return no_such_action(&state, &headers);
    };
    let asked = w.asked(&ns);
    if let Some(refused) = asked.refusal(&state, &headers).await {
        return refused;
    }
    match crate::operate::request(&state.client, &ns, &w.target, w.manual, state.user.as_deref()).await {
        Ok(_) => {
            let back = match kind.as_str() {
                "taskgroups" => "/jobs".to_owned(),
                _ => format!("/ns/{ns}/{kind}/{name}"),
            };
            Redirect::to(&back).into_response()
        }
        Err(e) => not_done(&state, &headers, &e),
    }
}

/// A cordon or uncordon of robot `name`: whether it cordons, and its words.
fn cordon_of(name: &str, action: &str) -> Option<(bool, Asked)> {
    let (on, verb) = match action {
        "cordon" => (true, "cordon"),
        "uncordon" => (false, "uncordon"),
        _ => return None,
    };
    let asked = Asked {
        verb,
        what: format!("robot {name}"),
        place: String::new(),
        plural: "robots",
        ns: String::new(),
    };
    Some((on, asked))
}

/// Asks to confirm a cordon or uncordon, or says why it may not be done.
pub async fn robot_form(
    Extract(state): Extract<Arc<State>>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some((_, asked)) = cordon_of(&name, &action) else {
        return no_such_action(&state, &headers);
    };
    if let Some(refused) = asked.refusal(&state, &headers).await {
        return refused;
    }
    confirm(&state, &headers, &asked.question(), &action)
}

/// Cordons or uncordons, then shows the robot.
pub async fn robot_action(
    Extract(state): Extract<Arc<State>>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = forged(&state, &headers, &form) {
        return refused;
    }
    let Some((on, asked)) = cordon_of(&name, &action) else {
        return no_such_action(&state, &headers);
    };
    if let Some(refused) = asked.refusal(&state, &headers).await {
        return refused;
    }
    match crate::drain::set_unschedulable(&state.client, &name, on).await {
        Ok(_) => Redirect::to(&format!("/robots/{name}")).into_response(),
        Err(e) => not_done(&state, &headers, &e),
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
        terminal: false,
    }
    .render(state, headers)
}
