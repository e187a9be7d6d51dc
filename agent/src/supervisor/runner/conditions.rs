//! The runner's side of tasks' start conditions (`when`): a new task whose
//! conditions the robot's facts do not meet is refused (reason NotReady:
//! the cluster lets it wait again, no retry used), and a task whose
//! `whileRunning: stop` condition stops holding is stopped through its
//! escalation (reason ConditionLost).

use k8s4r_api::facts::{unmet, FactRequirement, Facts};
use k8s4r_api::WhileRunning;

use super::*;

impl Runner {
    /// Why the robot cannot start a task of `spec` now, if it cannot.
    pub(super) fn not_ready_for(&self, spec: &k8s4r_api::TaskTemplate) -> Option<String> {
        if spec.when.is_empty() {
            return None;
        }
        let Some(facts) = &self.facts else {
            return Some(
                "the robot has reported no facts yet; the task's `when` cannot be checked".to_owned(),
            );
        };
        let condition = unmet(&spec.when, facts)?;
        Some(format!(
            "the robot's facts do not meet {condition} ({})",
            fact_now(condition, facts)
        ))
    }

    /// New facts: kept for admissions, and every task whose `whileRunning:
    /// stop` condition they fail is stopped.
    pub(super) fn on_facts(&mut self, facts: Facts) {
        let lost: Vec<(u64, String)> = self
            .table
            .tasks()
            .filter(|(_, task)| task.stop.is_none())
            .filter_map(|(id, task)| {
                let condition = task
                    .template
                    .when
                    .iter()
                    .filter(|c| c.while_running == WhileRunning::Stop)
                    .find(|c| !c.admits(&facts))?;
                Some((
                    id,
                    format!("{condition} no longer holds ({})", fact_now(condition, &facts)),
                ))
            })
            .collect();
        self.facts = Some(facts);
        for (id, why) in lost {
            if let Some(task) = self.table.get(id) {
                tracing::warn!(uid = %task.uid, attempt = task.attempt, %why, "a task's condition no longer holds; stopping it");
            }
            self.stop(id, StopCause::ConditionLost(why));
        }
    }
}

/// What the robot says of the fact a condition names.
fn fact_now(condition: &FactRequirement, facts: &Facts) -> String {
    match facts.get(&condition.key) {
        Some(value) => format!("{} is {value}", condition.key),
        None => format!("{} is not reported", condition.key),
    }
}
