//! A robot's facts into its Robot's `status.facts` and `status.shownFacts`
//! (the FACTS column of `kubectl get robots -o wide`, marked stale while
//! the robot is Offline): what to write and when. Pure state per robot with the clock passed in, kept by the worker
//! that serves the robot, as [`crate::held`] is.
//!
//! Facts are written at once, outside the heartbeat's coalescing: a task
//! waiting for `battery Gt 30` starts when they land. They are untrusted:
//! bounded when the heartbeat was decoded (`check_facts`), taken only from
//! the robot's own topic (whose id the body must repeat), written only to
//! that robot's Robot, and a robot that changes them in a flood costs at
//! most [`WRITE_BURST`] writes at once, then [`WRITE_RATE`] a second (per
//! server replica): its newest facts wait for the next write, and the ones
//! in between are never written.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s4r_api::backoff::exponential;
use k8s4r_api::facts::{shown, FactValue, Facts};
use k8s4r_api::{Robot, RobotStatus};
use serde::Serialize;
use tokio::time::Instant;

use crate::ingress::Bucket;

/// Fact writes one robot may cost at once.
pub const WRITE_BURST: f64 = 10.0;
/// Fact writes one robot may cost a second, after its burst.
pub const WRITE_RATE: f64 = 5.0;
/// How long what this server wrote stands for the Robot rather than its
/// cache, which shows the write only a moment later.
pub const OWN_WRITE_TRUSTED: Duration = Duration::from_secs(10);
/// The first retry delay after a failed write; doubled per failure.
const RETRY_BASE: Duration = Duration::from_millis(500);
/// The longest retry delay.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The facts part of a Robot's status, as a merge patch.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FactsPatch {
    /// Every fact the robot reports, and null for each one it no longer
    /// reports (a merge patch merges maps key by key).
    pub facts: BTreeMap<String, Option<FactValue>>,
    /// What the show-facts label names; null (no label) removes it.
    pub shown_facts: Option<String>,
}

/// `status.shownFacts` alone, as a merge patch (null removes it).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShownFactsPatch {
    /// What the show-facts label names.
    pub shown_facts: Option<String>,
}

/// What to do about a robot's facts now.
#[derive(Debug, Clone, PartialEq)]
pub enum FactsStep {
    /// Nothing: nothing waits, or the Robot shows it already.
    Idle,
    /// Newer facts wait until then (the robot's write budget, or a retry).
    Wait(Instant),
    /// Write this patch of the Robot's status now.
    Write(FactsPatch),
}

/// What this server last wrote.
#[derive(Debug, Clone)]
struct Written {
    facts: Facts,
    shown: Option<String>,
    at: Instant,
}

/// One robot's facts: the newest not yet written, and its write budget.
#[derive(Debug, Default)]
pub struct FactsMemory {
    /// Made full on first use.
    budget: Option<Bucket>,
    written: Option<Written>,
    /// The newest facts reported and not written.
    pending: Option<Facts>,
    /// Not written before then.
    not_before: Option<Instant>,
    /// Failed writes in a row.
    failures: u32,
}

impl FactsMemory {
    /// Takes the facts a heartbeat carried: they replace any still waiting.
    /// [`FactsMemory::step`] says what to do about them.
    pub fn offer(&mut self, facts: Facts) {
        self.pending = Some(facts);
    }

    /// When facts waiting for their write may go (None: none wait).
    pub fn due(&self) -> Option<Instant> {
        self.pending.as_ref().and(self.not_before)
    }

    /// What to do now about the waiting facts, `robot` as cached: nothing
    /// when the Robot shows them (with what its labels name), wait when
    /// the budget is spent, else write (remembered as written).
    pub fn step(&mut self, robot: &Robot, now: Instant) -> FactsStep {
        let Some(facts) = self.pending.as_ref() else {
            return FactsStep::Idle;
        };
        let empty = BTreeMap::new();
        let labels = robot.metadata.labels.as_ref().unwrap_or(&empty);
        let text = shown(labels, facts, offline(robot));
        let none = RobotStatus::default();
        let status = robot.status.as_ref().unwrap_or(&none);
        let trusted = self
            .written
            .as_ref()
            .filter(|w| now.saturating_duration_since(w.at) < OWN_WRITE_TRUSTED);
        let showing = match trusted {
            Some(w) => w.facts == *facts && w.shown == text,
            None => status.facts == *facts && status.shown_facts == text,
        };
        if showing {
            self.pending = None;
            self.not_before = None;
            return FactsStep::Idle;
        }
        if let Some(at) = self.not_before.filter(|at| *at > now) {
            return FactsStep::Wait(at);
        }
        let budget = self.budget.get_or_insert_with(|| Bucket::full(WRITE_BURST, now));
        if !budget.take(WRITE_RATE, WRITE_BURST, now) {
            let at = budget.ready_at(WRITE_RATE, now);
            self.not_before = Some(at);
            return FactsStep::Wait(at);
        }
        let Some(facts) = self.pending.take() else {
            return FactsStep::Idle;
        };
        let before = self.written.as_ref().map(|w| &w.facts);
        let patch = facts_patch(&status.facts, before, &facts, text.clone());
        self.written = Some(Written {
            facts,
            shown: text,
            at: now,
        });
        self.not_before = None;
        FactsStep::Write(patch)
    }

    /// Drops the facts that wait (their Robot is gone); the budget stays.
    pub fn forget_waiting(&mut self) {
        self.pending = None;
        self.not_before = None;
    }

    /// The last write succeeded.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// The write of `facts` failed: they wait again (unless newer ones
    /// came meanwhile), after a delay that doubles per failure.
    pub fn failed(&mut self, facts: Facts, now: Instant) {
        self.written = None;
        self.pending.get_or_insert(facts);
        self.not_before = Some(now + exponential(RETRY_BASE, RETRY_MAX, self.failures));
        self.failures = self.failures.saturating_add(1);
    }
}

/// The patch that makes a Robot show `facts`: each of them, and null for
/// every other fact it shows (`shows`) or this server wrote (`written`,
/// which the cache may not show yet).
fn facts_patch(shows: &Facts, written: Option<&Facts>, facts: &Facts, text: Option<String>) -> FactsPatch {
    let mut patch: BTreeMap<String, Option<FactValue>> =
        facts.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    for key in shows.keys().chain(written.into_iter().flat_map(|w| w.keys())) {
        patch.entry(key.clone()).or_insert(None);
    }
    FactsPatch {
        facts: patch,
        shown_facts: text,
    }
}

/// Whether the Robot is Offline: its facts are shown as stale.
fn offline(robot: &Robot) -> bool {
    robot.status.as_ref().and_then(|s| s.phase) == Some(k8s4r_api::RobotPhase::Offline)
}

/// The `shownFacts` a Robot should have when its labels or its phase
/// changed since it was written (None: it has it, or it has no status
/// yet).
pub fn shown_facts_stale(robot: &Robot) -> Option<ShownFactsPatch> {
    let status = robot.status.as_ref()?;
    let empty = BTreeMap::new();
    let labels = robot.metadata.labels.as_ref().unwrap_or(&empty);
    let text = shown(labels, &status.facts, offline(robot));
    (text != status.shown_facts).then_some(ShownFactsPatch { shown_facts: text })
}

#[cfg(test)]
mod tests;
