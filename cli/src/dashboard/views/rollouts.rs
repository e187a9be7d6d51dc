//! The AgentRollouts page: each rollout's version, state and message, and
//! its robots with their phase and why each waits (its facts, the
//! maintenance window, its running tasks, or its turn).

use std::sync::Arc;

use axum::extract::State as Extract;
use axum::http::HeaderMap;
use axum::response::Response;
use k8s4r_api::{AgentRollout, RobotUpgradePhase, RolloutState};
use kube::ResourceExt;
use maud::{html, Markup};

use super::{age, badge, url_encode, Page};
use crate::dashboard::State;

fn state_word(state: Option<RolloutState>) -> &'static str {
    match state {
        None => "Pending",
        Some(RolloutState::Progressing) => "Progressing",
        Some(RolloutState::Paused) => "Paused",
        Some(RolloutState::PausedOnFailures) => "PausedOnFailures",
        Some(RolloutState::Complete) => "Complete",
        Some(RolloutState::Aborted) => "Aborted",
    }
}

fn phase_word(phase: RobotUpgradePhase) -> &'static str {
    match phase {
        RobotUpgradePhase::Pending => "Pending",
        RobotUpgradePhase::Downloading => "Downloading",
        RobotUpgradePhase::Staged => "Staged",
        RobotUpgradePhase::Restarting => "Restarting",
        RobotUpgradePhase::Healthy => "Healthy",
        RobotUpgradePhase::RolledBack => "RolledBack",
        RobotUpgradePhase::Failed => "Failed",
    }
}

/// One rollout: its summary and the robots its status lists.
fn rollout(r: &AgentRollout) -> Markup {
    let name = r.name_any();
    let status = r.status.clone().unwrap_or_default();
    html! {
        section.rollout id=(format!("rollout-{name}")) {
            h2 { (name) " → " (r.spec.version) " " (badge(state_word(status.state))) }
            p.message { (status.message.as_deref().unwrap_or("")) }
            p { (status.upgraded) " of " (status.robots) " robots upgraded, " (status.failed) " failed or rolled back" }
            @if !status.robot_upgrades.is_empty() {
                table.robots {
                    caption { "Robots of " (name) }
                    thead { tr { th scope="col" { "Robot" } th scope="col" { "Phase" } th scope="col" { "Why" } th scope="col" { "Since" } } }
                    tbody { @for u in &status.robot_upgrades { tr {
                        th scope="row" { a href=(format!("/robots/{}", url_encode(&u.robot))) { (u.robot) } }
                        td { (badge(phase_word(u.phase))) }
                        td.reason { (u.reason.as_deref().unwrap_or("")) }
                        td { (age(u.since)) }
                    } } }
                }
            }
        }
    }
}

/// `GET /rollouts`.
pub async fn rollouts(Extract(state): Extract<Arc<State>>, headers: HeaderMap) -> Response {
    let mut all = state.rollouts.state();
    all.sort_by_key(|r| r.name_any());
    let live = html! {
        @if all.is_empty() { p { "No AgentRollouts." } }
        @for r in &all { (rollout(r)) }
    };
    Page {
        title: "Agent rollouts".into(),
        watch: "agentrollout",
        live,
        after: None,
        terminal: false,
    }
    .render(&state, &headers)
}
