//! The I/O side of [`crate::facts`]: a robot's facts written to its Robot
//! from the worker that serves the robot, and the shown facts following
//! the Robot's show-facts label.

use k8s4r_api::facts::Facts;
use k8s4r_api::Robot;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{not_approved, Bridge, Memory};
use crate::facts::{shown_facts_stale, FactsMemory, FactsStep};

impl Memory {
    /// When the first of the facts waiting for their write may go.
    pub(super) fn facts_due(&self) -> Option<Instant> {
        self.facts_waiting
            .iter()
            .filter_map(|robot| self.robots.get(robot)?.facts.due())
            .min()
    }

    /// Notes whether `robot`'s facts wait for their write.
    fn track_facts(&mut self, robot: &str) {
        let waits = self.robots.get(robot).and_then(|m| m.facts.due()).is_some();
        if waits {
            self.facts_waiting.insert(robot.to_owned());
        } else {
            self.facts_waiting.remove(robot);
        }
    }
}

impl Bridge {
    /// Takes the facts `robot`'s heartbeat carried and writes them now if
    /// they are new and its budget allows, else when it does.
    pub(super) async fn offer_facts(&self, robot: &Robot, facts: Facts, memory: &mut Memory) {
        let name = robot.metadata.name.clone().unwrap_or_default();
        let mine = &mut memory.robot(&name).facts;
        mine.offer(facts);
        self.step_facts(&name, robot, mine).await;
        memory.track_facts(&name);
    }

    /// Writes the facts whose time has come, each against its Robot as
    /// cached; a Robot gone or no longer approved drops them, and so does
    /// one that cannot be read now (the robot's next heartbeat brings
    /// them again).
    pub(super) async fn write_due_facts(&self, memory: &mut Memory) {
        let now = Instant::now();
        let due: Vec<String> = memory
            .facts_waiting
            .iter()
            .filter(|r| {
                memory
                    .robots
                    .get(*r)
                    .and_then(|m| m.facts.due())
                    .is_some_and(|d| d <= now)
            })
            .cloned()
            .collect();
        for name in due {
            let robot = self.robot(&name).await;
            let mine = &mut memory.robot(&name).facts;
            match robot {
                Ok(Some(robot)) if not_approved(&robot).is_none() => {
                    self.step_facts(&name, &robot, mine).await;
                }
                Ok(_) => mine.forget_waiting(),
                Err(error) => {
                    warn!(robot = %name, %error, "robot facts not written: the robot could not be read");
                    mine.forget_waiting();
                }
            }
            memory.track_facts(&name);
        }
    }

    /// Does what `mine` says about the facts that wait. A failed write is
    /// logged and tried again later: the heartbeat goes on (its Lease
    /// must not wait for facts).
    async fn step_facts(&self, name: &str, robot: &Robot, mine: &mut FactsMemory) {
        let patch = match mine.step(robot, Instant::now()) {
            FactsStep::Idle => return,
            FactsStep::Wait(at) => {
                debug!(robot = name, wait = ?at.saturating_duration_since(Instant::now()), "facts wait for the robot's write budget");
                return;
            }
            FactsStep::Write(patch) => patch,
        };
        match self.patch_robot_status(name, &patch, None, "robot_facts").await {
            Ok(()) => {
                debug!(robot = name, facts = patch.facts.len(), "robot facts written");
                mine.succeeded();
            }
            Err(error) => {
                warn!(robot = name, %error, "robot facts not written; trying again");
                let facts = patch
                    .facts
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, v?)))
                    .collect();
                mine.failed(facts, Instant::now());
            }
        }
    }

    /// Rewrites `status.shownFacts` when the Robot's show-facts label no
    /// longer matches it, guarded by the version seen: if anything changed
    /// since, the next event looks again.
    /// [`Bridge::follow_show_facts`] for `name` as the cache shows it now.
    pub async fn follow_show_facts_of(&self, name: &str) {
        let robot = self
            .robot_cache
            .get(&kube::runtime::reflector::ObjectRef::new(name));
        if let Some(robot) = robot {
            self.follow_show_facts(&robot).await;
        }
    }

    pub async fn follow_show_facts(&self, robot: &Robot) {
        let Some(patch) = shown_facts_stale(robot) else {
            return;
        };
        let name = robot.metadata.name.clone().unwrap_or_default();
        let rv = robot.metadata.resource_version.as_deref();
        match self
            .patch_robot_status(&name, &patch, rv, "robot_shown_facts")
            .await
        {
            Ok(()) => {
                info!(robot = %name, shown = ?patch.shown_facts, "shown facts follow the robot's label")
            }
            Err(e) if e.is_conflict() || e.is_not_found() => {}
            Err(error) => warn!(robot = %name, %error, "shown facts not written"),
        }
    }
}
