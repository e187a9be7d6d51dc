//! The pages, rendered on the server from the caches. Each page has a URL
//! of its own; its changing part (`#live`) is fetched again, alone, when
//! the cluster changes (the request then carries `x-fragment: 1`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State as Extract};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use jiff::Timestamp;
use k8s4r_api::condition::find_condition;
use k8s4r_api::names::{CONDITION_ACCEPTING_TASKS, LABEL_JOB, LABEL_PERIODIC_JOB};
use k8s4r_api::{GroupMode, Job, PeriodicJob, Robot, RobotPhase, Task, TaskGroup};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::graph;
use super::State;

/// Robots on one page of the fleet view.
pub const PAGE: usize = 100;

/// The files a page may load, all compiled in: the dashboard's own, and
/// the terminal's emulator (xterm.js from npm, by scripts/vendor-xterm.sh;
/// its licence sits beside it).
const ASSETS: [(&str, &str, &str); 6] = [
    ("app.js", JS, include_str!("assets/app.js")),
    ("app.css", CSS, include_str!("assets/app.css")),
    ("terminal.js", JS, include_str!("assets/terminal.js")),
    ("xterm.js", JS, include_str!("assets/vendor/xterm.js")),
    ("addon-fit.js", JS, include_str!("assets/vendor/addon-fit.js")),
    ("xterm.css", CSS, include_str!("assets/vendor/xterm.css")),
];
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// `GET /assets/{file}`.
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, ..)| *name == file) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "max-age=3600"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    }
}

/// 200 once every watch has listed; what the caches hold.
pub async fn healthz(Extract(state): Extract<Arc<State>>) -> Response {
    let body = serde_json::json!({
        "ready": state.ready(),
        "robots": state.robots.state().len(),
        "jobs": state.jobs.state().len(),
        "tasks": state.tasks.state().len(),
    });
    let status = if state.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

pub async fn home() -> Redirect {
    Redirect::to("/fleet")
}

/// A page: the whole document, or only its live part when the script asks.
pub struct Page {
    pub title: String,
    /// The kinds whose changes refresh it.
    pub watch: &'static str,
    pub live: Markup,
    /// Outside the live part (a task's log).
    pub after: Option<Markup>,
    /// Whether it holds a terminal: its emulator's scripts and styles,
    /// and the policy that lets them draw.
    pub terminal: bool,
}

impl Page {
    pub fn render(self, state: &State, headers: &HeaderMap) -> Response {
        let fragment = headers.get("x-fragment").is_some();
        let live = html! {
            @for notice in state.notices() { p.notice role="alert" { (notice) } }
            (self.live)
        };
        if fragment {
            return html_response(live);
        }
        let doc = html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    meta name="color-scheme" content="light dark";
                    meta name="csrf" content=(state.csrf_token());
                    title { (self.title) " · k8s4r" }
                    link rel="stylesheet" href="/assets/app.css";
                    script src="/assets/app.js" defer {}
                    @if self.terminal {
                        link rel="stylesheet" href="/assets/xterm.css";
                        script src="/assets/xterm.js" defer {}
                        script src="/assets/addon-fit.js" defer {}
                        script src="/assets/terminal.js" defer {}
                    }
                }
                body {
                    a.skip href="#main" { "Skip to content" }
                    header {
                        nav aria-label="Sections" {
                            strong { "k8s4r" }
                            a href="/fleet" { "Fleet" }
                            a href="/jobs" { "Jobs" }
                            a href="/rollouts" { "Rollouts" }
                        }
                        span.who { "as " (state.user.as_deref().unwrap_or("(unknown user)")) }
                    }
                    div #conn role="status" aria-live="polite" hidden { "Connection to the dashboard lost: retrying…" }
                    main #main {
                        h1 { (self.title) }
                        div #live data-watch=(self.watch) { (live) }
                        @if let Some(after) = self.after { (after) }
                    }
                }
            }
        };
        let mut response = html_response(doc);
        if self.terminal {
            response.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                header::HeaderValue::from_static(super::guard::TERMINAL_CSP),
            );
        }
        response
    }
}

fn html_response(markup: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// A page that says what went wrong.
pub fn problem(
    state: &State,
    headers: &HeaderMap,
    status: StatusCode,
    title: &str,
    message: &str,
) -> Response {
    let page = Page {
        title: title.to_owned(),
        watch: "",
        live: html! { p.problem role="alert" { (message) } },
        after: None,
        terminal: false,
    };
    let mut response = page.render(state, headers);
    *response.status_mut() = status;
    response
}

// ------------------------------------------------------------------ helpers

/// "12s", "5m", "3h", "2d" since `t`.
pub fn age(t: Option<Timestamp>) -> String {
    let Some(t) = t else {
        return "-".to_owned();
    };
    let secs = Timestamp::now().duration_since(t).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn time(t: Option<Timestamp>) -> Markup {
    match t {
        Some(t) => html! { time datetime=(t.to_string()) title=(t.to_string()) { (age(Some(t))) " ago" } },
        None => html! { "-" },
    }
}

fn phase_of(robot: &Robot) -> &'static str {
    match robot.status.as_ref().and_then(|s| s.phase) {
        Some(RobotPhase::Online) => "Online",
        Some(RobotPhase::Offline) => "Offline",
        Some(RobotPhase::Rejected) => "Rejected",
        _ => "Pending",
    }
}

const PHASES: [&str; 4] = ["Online", "Offline", "Pending", "Rejected"];

fn task_state(task: &Task) -> &'static str {
    task.status
        .as_ref()
        .and_then(|s| s.state)
        .map_or("pending", |s| s.as_str())
}

fn work_state(state: Option<k8s4r_api::WorkState>) -> String {
    state.map_or_else(|| "pending".to_owned(), |s| format!("{s:?}").to_lowercase())
}

fn badge(state: &str) -> Markup {
    html! { span class=(format!("badge state-{}", state.to_lowercase())) { (state) } }
}

fn ns_of<K: ResourceExt>(obj: &K) -> String {
    obj.namespace().unwrap_or_default()
}

// -------------------------------------------------------------------- fleet

#[derive(Debug, Default, Deserialize)]
pub struct FleetQuery {
    #[serde(default)]
    selector: String,
    #[serde(default)]
    phase: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    sort: String,
    #[serde(default)]
    page: usize,
}

/// The robots a fleet query shows, its counts per phase (of the robots
/// its selector and search match), and how many match in all.
pub struct FleetPage {
    pub counts: BTreeMap<&'static str, usize>,
    pub total: usize,
    pub rows: Vec<Arc<Robot>>,
}

/// Filters, counts, sorts and pages `robots` as `query` asks.
/// `heartbeat` says when a robot was last heard of.
pub fn select(
    robots: Vec<Arc<Robot>>,
    query: &FleetQuery,
    heartbeat: impl Fn(&Robot) -> Option<Timestamp>,
) -> Result<FleetPage, String> {
    let selector = apiserver_lite::selectors::LabelSelector::parse(query.selector.trim())
        .map_err(|e| format!("the label selector {:?} is not valid: {e}", query.selector))?;
    let q = query.q.trim().to_lowercase();
    let mut counts: BTreeMap<&'static str, usize> = PHASES.iter().map(|p| (*p, 0)).collect();
    let mut rows: Vec<Arc<Robot>> = robots
        .into_iter()
        .filter(|r| selector.matches_labels(r.labels()))
        .filter(|r| q.is_empty() || r.name_any().to_lowercase().contains(&q))
        .inspect(|r| *counts.entry(phase_of(r)).or_default() += 1)
        .filter(|r| query.phase.is_empty() || phase_of(r).eq_ignore_ascii_case(&query.phase))
        .collect();
    match query.sort.as_str() {
        "phase" => rows.sort_by_key(|r| (phase_of(r), r.name_any())),
        "heartbeat" => rows.sort_by_key(|r| (std::cmp::Reverse(heartbeat(r)), r.name_any())),
        _ => rows.sort_by_key(|r| r.name_any()),
    }
    let total = rows.len();
    let rows = rows.into_iter().skip(query.page * PAGE).take(PAGE).collect();
    Ok(FleetPage { counts, total, rows })
}

fn fleet_link(query: &FleetQuery, phase: &str, page: usize) -> String {
    let enc = |s: &str| url_encode(s);
    format!(
        "/fleet?selector={}&phase={}&q={}&sort={}&page={page}",
        enc(&query.selector),
        enc(phase),
        enc(&query.q),
        enc(&query.sort)
    )
}

/// Percent-encodes a query value.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What marks a figure of an Offline robot: it is as old as its last
/// heartbeat. Nothing for a robot that is not Offline.
fn stale(robot: &Robot, heartbeat: Option<Timestamp>) -> Markup {
    html! { @if phase_of(robot) == "Offline" {
        span.stale title="the robot is offline: this is what it reported last" { "stale, " (age(heartbeat)) " old" } " "
    } }
}

fn robot_row(robot: &Robot, heartbeat: Option<Timestamp>) -> Markup {
    let name = robot.name_any();
    let status = robot.status.clone().unwrap_or_default();
    let accepting = find_condition(&status.conditions, CONDITION_ACCEPTING_TASKS);
    let used = status.allocated.as_ref().map_or(0, |a| a.tasks);
    let capacity = status.capacity.as_ref().map_or(0, |c| c.tasks);
    let usage = status.usage.as_ref();
    let facts = k8s4r_api::facts::shown(robot.labels(), &status.facts, false).unwrap_or_default();
    html! {
        tr id=(format!("robot-{name}")) data-rv=(robot.resource_version().unwrap_or_default()) {
            th scope="row" { a href=(format!("/robots/{name}")) { (name) } }
            td { (badge(phase_of(robot))) @if robot.spec.unschedulable { " " span.badge.cordoned { "cordoned" } } }
            td { @match accepting {
                Some(c) => { (format!("{:?}", c.status)) @if let Some(r) = &c.reason { " · " (r) } }
                None => { "-" }
            } }
            td { (time(heartbeat)) }
            td { (status.device.as_ref().map_or("-", |d| d.arch.as_str())) }
            td { (status.agent_version.as_deref().unwrap_or("-")) }
            td { (used) "/" (capacity) }
            td.usage { @if let Some(u) = usage {
                (stale(robot, heartbeat))
                (format!("{:.0}%", u.cpu_percent)) " cpu, "
                (format!("{:.0}%", 100.0 * u.memory_used_bytes as f64 / u.memory_total_bytes.max(1) as f64)) " mem"
            } @else { "-" } }
            td.facts { @if !facts.is_empty() { (stale(robot, heartbeat)) } (facts) }
        }
    }
}

pub async fn fleet(
    Extract(state): Extract<Arc<State>>,
    Query(query): Query<FleetQuery>,
    headers: HeaderMap,
) -> Response {
    let page = match select(state.robots.state(), &query, |r| state.last_heartbeat(r)) {
        Ok(p) => p,
        Err(e) => return problem(&state, &headers, StatusCode::BAD_REQUEST, "Fleet", &e),
    };
    let all: usize = page.counts.values().sum();
    let first = query.page * PAGE;
    let live = html! {
        form.filters method="get" action="/fleet" {
            label { "Label selector " input type="text" name="selector" value=(query.selector) placeholder="site=lab,arch in (aarch64)"; }
            label { "Name contains " input type="search" name="q" value=(query.q); }
            label { "Phase " select name="phase" {
                option value="" selected[query.phase.is_empty()] { "any" }
                @for p in PHASES { option value=(p) selected[query.phase == p] { (p) } }
            } }
            label { "Sort by " select name="sort" {
                option value="name" selected[query.sort.is_empty() || query.sort == "name"] { "name" }
                option value="phase" selected[query.sort == "phase"] { "phase" }
                option value="heartbeat" selected[query.sort == "heartbeat"] { "last heartbeat" }
            } }
            button type="submit" { "Show" }
        }
        ul.counts aria-label="Robots per phase" {
            li { a href=(fleet_link(&query, "", 0)) { "All " strong #count-all { (all) } } }
            @for (phase, n) in &page.counts {
                li { a href=(fleet_link(&query, phase, 0)) { (phase) " " strong id=(format!("count-{}", phase.to_lowercase())) { (n) } } }
            }
        }
        table.robots {
            caption { "Robots " (first.min(page.total) + usize::from(page.total > 0)) "–" (first + page.rows.len()) " of " (page.total) }
            thead { tr {
                th scope="col" { "Robot" } th scope="col" { "Phase" } th scope="col" { "Accepting tasks" }
                th scope="col" { "Heartbeat" } th scope="col" { "Arch" } th scope="col" { "Agent" }
                th scope="col" { "Tasks" } th scope="col" { "Usage" } th scope="col" { "Facts" }
            } }
            tbody { @for r in &page.rows { (robot_row(r, state.last_heartbeat(r))) } }
        }
        nav.pages aria-label="Pages" {
            @if query.page > 0 { a href=(fleet_link(&query, &query.phase, query.page - 1)) rel="prev" { "← previous" } }
            @if first + PAGE < page.total { a href=(fleet_link(&query, &query.phase, query.page + 1)) rel="next" { "next →" } }
        }
    };
    Page {
        title: "Fleet".into(),
        watch: "robot",
        live,
        after: None,
        terminal: false,
    }
    .render(&state, &headers)
}

// -------------------------------------------------------------------- robot

async fn events_of(state: &State, kind: &str, name: &str, ns: Option<&str>) -> Vec<Event> {
    let api: Api<Event> = match ns {
        Some(ns) => Api::namespaced(state.client.clone(), ns),
        None => Api::all(state.client.clone()),
    };
    let fields = format!("regarding.kind={kind},regarding.name={name}");
    let mut events = api
        .list(&ListParams::default().fields(&fields))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    events.sort_by_key(|e| {
        std::cmp::Reverse(
            e.event_time
                .as_ref()
                .map(|t| t.0)
                .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0)),
        )
    });
    events.truncate(20);
    events
}

fn events_table(events: &[Event]) -> Markup {
    html! {
        section aria-labelledby="events-h" {
            h2 #events-h { "Events" }
            @if events.is_empty() { p { "No Events." } } @else {
                table { thead { tr { th scope="col" { "Type" } th scope="col" { "Reason" } th scope="col" { "Age" } th scope="col" { "Message" } } }
                    tbody { @for e in events { tr {
                        td { (e.type_.as_deref().unwrap_or("")) }
                        td { (e.reason.as_deref().unwrap_or("")) }
                        td { (age(e.event_time.as_ref().map(|t| t.0).or(e.deprecated_last_timestamp.as_ref().map(|t| t.0)))) }
                        td { (e.note.as_deref().unwrap_or("")) }
                    } } }
                }
            }
        }
    }
}

/// A form that posts `action` to `url`, or nothing when not `allowed`.
/// An action that asks first (`question`), for one that stops work: its
/// button shows only once the person opened the question.
pub fn confirm_button(state: &State, url: &str, label: &str, question: &str, allowed: bool) -> Markup {
    html! {
        @if allowed {
            details.confirm id=(format!("confirm-{}", label.to_lowercase())) {
                summary data-action=(format!("{label}?")) { (label) "…" }
                form.action method="post" action=(url) {
                    p { (question) }
                    input type="hidden" name="_csrf" value=(state.csrf_token());
                    button type="submit" data-action=(label) { "Yes, " (label.to_lowercase()) }
                }
            }
        }
    }
}

pub fn action_button(state: &State, url: &str, label: &str, allowed: bool) -> Markup {
    html! {
        @if allowed {
            form.action method="post" action=(url) {
                input type="hidden" name="_csrf" value=(state.csrf_token());
                button type="submit" data-action=(label) { (label) }
            }
        }
    }
}

fn tasks_table(tasks: &[Arc<Task>], show_robot: bool) -> Markup {
    html! {
        table { thead { tr {
            th scope="col" { "Task" } th scope="col" { "State" } @if show_robot { th scope="col" { "Robot" } }
            th scope="col" { "Attempt" } th scope="col" { "Reason" } th scope="col" { "Exit" }
        } }
        tbody { @for t in tasks {
            @let s = t.status.clone().unwrap_or_default();
            tr id=(format!("task-{}", t.name_any())) {
                th scope="row" { a href=(format!("/ns/{}/tasks/{}", ns_of(t.as_ref()), t.name_any())) { (t.name_any()) } }
                td { (badge(task_state(t))) }
                @if show_robot { td { @if let Some(r) = &s.robot { a href=(format!("/robots/{r}")) { (r) } } @else { "-" } } }
                td { (s.attempt) }
                td { (s.reason.map(|r| format!("{r:?}")).unwrap_or_default()) }
                td { (s.exit_code.map(|c| c.to_string()).unwrap_or_default()) }
            }
        } } }
    }
}

pub async fn robot(
    Extract(state): Extract<Arc<State>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(robot) = state.robots.get(&ObjectRef::new(&name)) else {
        let message = format!("robot {name} not found (or you may not see it)");
        return problem(&state, &headers, StatusCode::NOT_FOUND, &name, &message);
    };
    let status = robot.status.clone().unwrap_or_default();
    let mut tasks: Vec<Arc<Task>> = state
        .tasks
        .state()
        .into_iter()
        .filter(|t| t.status.as_ref().and_then(|s| s.robot.as_deref()) == Some(name.as_str()))
        .collect();
    tasks.sort_by_key(|t| {
        let s = t.status.as_ref();
        (
            s.and_then(|s| s.state)
                .is_some_and(k8s4r_api::TaskState::is_terminal),
            std::cmp::Reverse(s.and_then(|s| s.finish_time.or(s.start_time))),
        )
    });
    tasks.truncate(50);
    let events = events_of(&state, "Robot", &name, None).await;
    let can = state.can_i("patch", "robots", "").await;
    let (verb, label) = if robot.spec.unschedulable {
        ("uncordon", "Uncordon")
    } else {
        ("cordon", "Cordon")
    };
    let live = html! {
        p { (badge(phase_of(&robot))) @if robot.spec.unschedulable { " " span.badge.cordoned { "cordoned" } }
            " " (status.message.as_deref().unwrap_or("")) }
        (action_button(&state, &format!("/robots/{name}/{verb}"), label, can))
        dl.facts-list {
            dt { "Heartbeat" } dd { (time(state.last_heartbeat(&robot))) }
            dt { "Registered" } dd { (time(status.last_registration_time)) }
            dt { "Agent" } dd { (status.agent_version.as_deref().unwrap_or("-")) }
            dt { "Device" } dd { @if let Some(d) = &status.device { (d.arch) ", " (d.os) " " (d.os_version.as_deref().unwrap_or("")) ", " (d.cpus) " CPUs" } @else { "-" } }
            dt { "Drivers" } dd { (status.drivers.join(", ")) }
            dt { "Tasks" } dd { (status.allocated.as_ref().map_or(0, |a| a.tasks)) " of " (status.capacity.as_ref().map_or(0, |a| a.tasks)) }
            @if let Some(u) = &status.usage { dt { "Usage" } dd { (stale(&robot, state.last_heartbeat(&robot))) (format!("{:.0}% cpu, load {:.2}, {} MiB of {} MiB memory, {} MiB disk free", u.cpu_percent, u.load1, u.memory_used_bytes >> 20, u.memory_total_bytes >> 20, u.disk_free_bytes >> 20)) } }
        }
        h2 { "Conditions" }
        table { thead { tr { th scope="col" { "Type" } th scope="col" { "Status" } th scope="col" { "Reason" } th scope="col" { "Since" } th scope="col" { "Message" } } }
            tbody { @for c in &status.conditions { tr {
                th scope="row" { (c.type_) } td { (format!("{:?}", c.status)) } td { (c.reason.as_deref().unwrap_or("")) }
                td { (time(c.last_transition_time)) } td { (c.message.as_deref().unwrap_or("")) }
            } } } }
        h2 { "Labels" }
        p { @for (k, v) in robot.labels() { code { (k) "=" (v) } " " } }
        @if !status.facts.is_empty() {
            h2 { "Facts" }
            p { (stale(&robot, state.last_heartbeat(&robot))) @for (k, v) in &status.facts { code { (k) "=" (v.to_string()) } " " } }
        }
        h2 { "Tasks, now and recently" }
        (tasks_table(&tasks, false))
        (events_table(&events))
    };
    Page {
        title: format!("Robot {name}"),
        watch: "robot,task",
        live,
        after: None,
        terminal: false,
    }
    .render(&state, &headers)
}

// --------------------------------------------------------------------- jobs

fn job_progress(job: &Job) -> Markup {
    let s = job.status.clone().unwrap_or_default();
    let done = s.counts.completed;
    let total = s.counts.total.max(1);
    html! {
        progress value=(done) max=(total) aria-label=(format!("{done} of {} tasks completed", s.counts.total)) {}
        " " (s.completions.as_deref().unwrap_or(""))
    }
}

pub async fn jobs(Extract(state): Extract<Arc<State>>, headers: HeaderMap) -> Response {
    let mut jobs = state.jobs.state();
    jobs.sort_by_key(|j| {
        (
            std::cmp::Reverse(j.creation_timestamp().map(|t| t.0)),
            j.name_any(),
        )
    });
    let mut periodics = state.periodics.state();
    periodics.sort_by_key(|p| (ns_of(p.as_ref()), p.name_any()));
    let live = html! {
        @if !periodics.is_empty() { (periodic_table(&periodics, &jobs)) }
        table.jobs {
            caption { (jobs.len()) " Jobs" @if let Some(ns) = &state.namespace { " in namespace " (ns) } }
            thead { tr { th scope="col" { "Job" } th scope="col" { "Namespace" } th scope="col" { "State" } th scope="col" { "Progress" } th scope="col" { "Groups" } th scope="col" { "Age" } } }
            tbody { @for j in &jobs { tr id=(format!("job-{}-{}", ns_of(j.as_ref()), j.name_any())) {
                th scope="row" { a href=(format!("/ns/{}/jobs/{}", ns_of(j.as_ref()), j.name_any())) { (j.name_any()) } }
                td { (ns_of(j.as_ref())) }
                td { (badge(&work_state(j.status.as_ref().and_then(|s| s.state)))) }
                td { (job_progress(j)) }
                td { (j.spec.task_groups.len()) }
                td { (age(j.creation_timestamp().map(|t| t.0))) }
            } } }
        }
    };
    Page {
        title: "Jobs".into(),
        watch: "job,periodicjob",
        live,
        after: None,
        terminal: false,
    }
    .render(&state, &headers)
}

/// The PeriodicJobs: schedule, next run, and their newest runs.
fn periodic_table(periodics: &[Arc<PeriodicJob>], jobs: &[Arc<Job>]) -> Markup {
    html! {
        table.periodic {
            caption { (periodics.len()) " periodic Jobs" }
            thead { tr { th scope="col" { "Periodic job" } th scope="col" { "Namespace" } th scope="col" { "Schedule" }
                th scope="col" { "Next run" } th scope="col" { "Last scheduled" } th scope="col" { "Recent runs" } } }
            tbody { @for p in periodics {
                @let s = p.status.clone().unwrap_or_default();
                @let ns = ns_of(p.as_ref());
                @let runs: Vec<&Arc<Job>> = jobs.iter()
                    .filter(|j| ns_of(j.as_ref()) == ns && j.labels().get(LABEL_PERIODIC_JOB) == Some(&p.name_any()))
                    .take(5).collect();
                tr id=(format!("periodic-{ns}-{}", p.name_any())) {
                    th scope="row" { (p.name_any()) }
                    td { (ns) }
                    td { code { (p.spec.schedule) } @if let Some(tz) = &p.spec.time_zone { " " (tz) } @if p.spec.suspend { " " span.badge.cordoned { "suspended" } } }
                    td { @match s.next_schedule_time { Some(t) => { time datetime=(t.to_string()) { (t.to_string()) } } None => { "-" } } }
                    td { (time(s.last_schedule_time)) }
                    td { @for j in runs {
                        a href=(format!("/ns/{ns}/jobs/{}", j.name_any())) { (j.name_any()) } " "
                        (badge(&work_state(j.status.as_ref().and_then(|s| s.state)))) " "
                    } }
                }
            } }
        }
    }
}

fn rollout_of(group: &TaskGroup) -> Markup {
    let t = &group.spec.template;
    let Some(r) = group.status.as_ref().and_then(|s| s.rollout.clone()) else {
        return html! {};
    };
    let done = r
        .per_robot
        .values()
        .filter(|s| matches!(s, k8s4r_api::TaskState::Completed))
        .count();
    html! {
        div.rollout {
            progress value=(r.started) max=(r.robots.max(1)) aria-label=(format!("{} of {} robots reached", r.started, r.robots)) {}
            " " (r.started) " of " (r.robots) " robots reached, " (r.waiting) " waiting, " (done) " done; maxParallel "
            (t.max_parallel.map_or("unlimited".to_owned(), |m| m.to_string()))
            ", maxFailed " (t.max_failed.as_ref().map_or("0".to_owned(), |m| serde_json::to_value(m).map(|v| v.to_string()).unwrap_or_default()))
            @if let Some(s) = &r.stopped { " — stopped: " (s) }
            ul.per-robot { @for (robot, s) in &r.per_robot { li { (robot) " " (badge(s.as_str())) } } }
        }
    }
}

pub async fn job(
    Extract(state): Extract<Arc<State>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(job) = state.jobs.get(&ObjectRef::new(&name).within(&ns)) else {
        let message = format!("job {name} not found in namespace {ns} (or you may not see it)");
        return problem(&state, &headers, StatusCode::NOT_FOUND, &name, &message);
    };
    let status = job.status.clone().unwrap_or_default();
    let summaries: BTreeMap<&str, &k8s4r_api::GroupSummary> =
        status.groups.iter().map(|g| (g.name.as_str(), g)).collect();
    let nodes: Vec<graph::Node> = job
        .spec
        .task_groups
        .iter()
        .map(|g| graph::Node {
            name: g.name.clone(),
            state: work_state(summaries.get(g.name.as_str()).and_then(|s| s.state)),
            after: job
                .spec
                .dependencies_of(g)
                .into_iter()
                .map(str::to_owned)
                .collect(),
        })
        .collect();
    let groups: BTreeMap<String, Arc<TaskGroup>> = state
        .groups
        .state()
        .into_iter()
        .filter(|g| ns_of(g.as_ref()) == ns && g.spec.job == name)
        .map(|g| (g.spec.template.name.clone(), g))
        .collect();
    let mut tasks: Vec<Arc<Task>> = state
        .tasks
        .state()
        .into_iter()
        .filter(|t| ns_of(t.as_ref()) == ns && t.labels().get(LABEL_JOB) == Some(&name))
        .collect();
    tasks.sort_by_key(|t| t.name_any());
    let can = state.can_i("patch", "jobs", &ns).await;
    let can_groups = state.can_i("patch", "taskgroups", &ns).await;
    let live = html! {
        p { (badge(&work_state(status.state))) " " (job_progress(&job)) }
        div.actions {
            (action_button(&state, &format!("/ns/{ns}/jobs/{name}/cancel"), "Cancel", can))
            (action_button(&state, &format!("/ns/{ns}/jobs/{name}/retry"), "Retry", can))
        }
        h2 { "Groups" }
        div.graph-wrap { (graph::svg(&nodes)) }
        table.groups { thead { tr { th scope="col" { "Group" } th scope="col" { "State" } th scope="col" { "Waits for" } th scope="col" { "Tasks" } th scope="col" { "Note" } @if can_groups { th scope="col" { "Actions" } } } }
            tbody { @for n in &nodes {
                @let summary = summaries.get(n.name.as_str());
                tr { th scope="row" { (n.name) } td { (badge(&n.state)) } td { (n.after.join(", ")) }
                    td { @if let Some(s) = summary { (s.counts.completed) " of " (s.counts.total) " completed" } }
                    td { (summary.and_then(|s| s.message.as_deref()).unwrap_or(""))
                        @if let Some(g) = groups.get(&n.name).filter(|g| g.spec.template.mode == GroupMode::EveryRobot) { (rollout_of(g)) } }
                    @if can_groups { td { @if let Some(g) = groups.get(&n.name) {
                        (action_button(&state, &format!("/ns/{ns}/taskgroups/{}/cancel", g.name_any()), "Cancel group", true))
                        (action_button(&state, &format!("/ns/{ns}/taskgroups/{}/retry", g.name_any()), "Retry group", true))
                    } } }
                }
            } } }
        h2 { "Tasks" }
        (tasks_table(&tasks, true))
    };
    Page {
        title: format!("Job {name}"),
        watch: "job,taskgroup,task",
        live,
        after: None,
        terminal: false,
    }
    .render(&state, &headers)
}

mod rollouts;
pub use rollouts::rollouts;
mod task;
pub use task::{output, task};

#[cfg(test)]
mod tests;
