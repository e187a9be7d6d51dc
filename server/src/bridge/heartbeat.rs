//! Heartbeats, connections and the robots' Leases: what the server
//! records of a robot being alive, and the Lease renewals that the
//! manager's fences run from.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_api::protocol::Heartbeat;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use tracing::{info, instrument, warn};

use super::{not_approved, Bridge, Memory, Outcome, CONFLICT_TRIES};
use crate::decide::{self, connected, plan_heartbeat, HeartbeatMemory, LeaseRecord, RobotStatusPatch};
use crate::error::{Error, Result};

/// Whether the newest of these records of a robot's Lease still holds its
/// promise at `now`.
fn promise_now(records: [Option<LeaseRecord>; 2], now: Timestamp) -> bool {
    records
        .into_iter()
        .flatten()
        .max_by_key(|l| l.renewed)
        .is_some_and(|l| l.covers(now))
}

impl Bridge {
    #[instrument(skip_all, fields(robot = %msg.robot_id))]
    pub(super) async fn heartbeat(&self, msg: &Heartbeat, memory: &mut Memory) -> Result<Outcome> {
        let name = msg.robot_id.as_str();
        let Some(robot) = self.robot(name).await? else {
            let r = decide::Rejection::UnknownRobot {
                robot: name.to_owned(),
            };
            return Ok(Outcome::Rejected(r.to_string(), r.outcome()));
        };
        if let Some(refusal) = not_approved(&robot) {
            return Ok(refusal);
        }
        // Before the heartbeat's own writes: a task may wait for them.
        if let Some(facts) = &msg.facts {
            self.offer_facts(&robot, facts.clone(), memory).await;
        }
        self.record_upgrade(&robot, msg.upgrade.as_ref()).await?;
        self.order_upgrade(
            &robot,
            msg.upgrade.as_ref(),
            &mut memory.robot(name).upgrade_ordered,
        )
        .await;
        let entry = &mut memory.robot(name).heartbeat;
        let now = Timestamp::now();
        let lease = self.lease_record(name);
        // The promise the Lease holds now (this replica's last renewal, or
        // the watch's if newer): a renewal that only shortens it is not
        // needed to confirm this heartbeat.
        let promised = promise_now([entry.lease, lease], now);
        let plan = plan_heartbeat(
            entry,
            &robot,
            lease,
            !msg.held.running.is_empty(),
            msg.usage.as_ref(),
            msg.health.as_ref(),
            now,
            self.config.coalescing,
        );
        if plan.is_empty() {
            return Ok(Outcome::Done("coalesced"));
        }
        let result = async {
            if let Some(interval) = plan.renew_lease {
                let renewed = self.renew_lease(name, now, interval).await;
                if let Err(error) = renewed {
                    if !promised {
                        return Err(error);
                    }
                    // Best effort: the robot took work while its Lease still
                    // promised the idle interval, which the manager allows
                    // for; shortening it only moves a lost robot's work
                    // sooner. Under API trouble the heartbeat is confirmed
                    // anyway, so a healthy robot never fences its new work
                    // for want of this write.
                    warn!(%error, "could not shorten the robot's Lease; it keeps its longer promise");
                    entry.lease = None;
                }
            }
            if let Some(status) = &plan.status {
                // Only a Connected flip rewrites the shared conditions list
                // and needs the guard; time and usage are the server's alone.
                let rv = status
                    .conditions
                    .as_ref()
                    .and(robot.metadata.resource_version.as_deref());
                self.patch_robot_status(name, status, rv, "robot_heartbeat")
                    .await?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            // Forget what was planned so the next heartbeat tries again.
            *entry = HeartbeatMemory::default();
            return Err(e);
        }
        Ok(Outcome::Done("applied"))
    }

    /// The robot's Lease as this replica's watch shows it.
    fn lease_record(&self, name: &str) -> Option<LeaseRecord> {
        let lease = self
            .lease_cache
            .get(&ObjectRef::new(name).within(&self.config.lease_namespace))?;
        let spec = lease.spec.as_ref()?;
        Some(LeaseRecord::read(
            spec.renew_time.as_ref()?.0,
            spec.lease_duration_seconds,
        ))
    }

    /// Renews the Lease of a robot heard holding work now, when it promised
    /// a renewal interval longer than work allows (the robot was idle): the
    /// manager's fence time of the attempt then runs from now, at the short
    /// interval, and not from a renewal up to the idle interval old.
    ///
    /// Best effort while the Lease's longer promise still holds (see
    /// [`Bridge::heartbeat`]): the status is applied either way.
    pub(super) async fn renew_for_work(&self, name: &str, lease: &mut Option<LeaseRecord>) -> Result<()> {
        let now = Timestamp::now();
        let cached = self.lease_record(name);
        let promised = promise_now([*lease, cached], now);
        let Some(interval) = decide::plan_lease(lease, cached, true, now, self.config.coalescing) else {
            return Ok(());
        };
        match self.renew_lease(name, now, interval).await {
            Ok(()) => Ok(()),
            Err(error) => {
                *lease = None;
                if !promised {
                    return Err(error);
                }
                warn!(%error, "could not shorten the robot's Lease; it keeps its longer promise");
                Ok(())
            }
        }
    }

    async fn renew_lease(&self, name: &str, now: Timestamp, interval: Duration) -> Result<()> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.config.lease_namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.to_owned()),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(LeaseRecord::duration_seconds(interval)),
                ..Default::default()
            }),
        };
        let pp = PatchParams::apply(MANAGER_SERVER).force();
        self.kube
            .write(
                "lease",
                || format!("renewing lease {}/{name}", self.config.lease_namespace),
                self.leases.patch(name, &pp, &Patch::Apply(&lease)),
            )
            .await?;
        Ok(())
    }

    /// Marks not connected every Robot that still says `Connected=True`
    /// although the broker knew no `online: true` presence for it when this
    /// server started (`present`) and it has not been heard from since
    /// `started`. Guarded by each Robot's `resourceVersion`: a robot heard
    /// from meanwhile wrote its status, and is left alone.
    pub async fn forget_absent(&self, present: &HashSet<String>, started: Timestamp) {
        let robots = self.robot_cache.state();
        // A robot heard since (a renewal of its Lease, which an unchanged
        // registration does not write) is not absent either.
        let heard: HashSet<String> = robots
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .filter(|name| self.lease_record(name).is_some_and(|l| l.renewed >= started))
            .collect();
        let absent = decide::absent_at_start(
            robots.iter().map(|r| r.as_ref()),
            &present.union(&heard).cloned().collect(),
            started,
            Timestamp::now(),
        );
        for (name, conditions) in absent {
            let rv = robots
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|r| r.metadata.resource_version.clone());
            let status = RobotStatusPatch {
                conditions: Some(conditions),
                ..Default::default()
            };
            match self
                .patch_robot_status(&name, &status, rv.as_deref(), "robot_absent_at_start")
                .await
            {
                Ok(()) => {
                    info!(robot = %name, "robot not connected to the broker at start: marked disconnected")
                }
                Err(error) => warn!(robot = %name, %error, "could not mark a robot absent at start"),
            }
        }
    }

    /// Records what robot `name` said of its connection; `held_since`:
    /// when a held `online: false` was received (see
    /// [`crate::ingress::Inbound::held_since`]).
    #[instrument(skip(self))]
    pub(super) async fn online(
        &self,
        name: &str,
        online: bool,
        held_since: Option<Timestamp>,
    ) -> Result<Outcome> {
        let mut robot = match self.robot(name).await? {
            Some(robot) => robot,
            // An agent announces itself online as it connects, just before it
            // registers, and the registration records the connection; so this
            // is the normal first message of a new robot, not a bad one.
            None => return Ok(Outcome::Done("ignored_unregistered")),
        };
        if let Some(since) = held_since.filter(|_| !online) {
            if decide::heard_after(&robot, self.lease_record(name).map(|l| l.renewed), since) {
                return Ok(Outcome::Done("superseded"));
            }
        }
        for tries in 1.. {
            let conditions = robot
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let Some(conditions) = connected(conditions, online, Timestamp::now()) else {
                return Ok(Outcome::Done("unchanged"));
            };
            let status = RobotStatusPatch {
                conditions: Some(conditions),
                ..Default::default()
            };
            let rv = robot.metadata.resource_version.as_deref();
            match self
                .patch_robot_status(name, &status, rv, "robot_connected")
                .await
            {
                Ok(()) => {
                    info!(online, "robot connection recorded");
                    return Ok(Outcome::Done("applied"));
                }
                Err(e) if e.is_conflict() && tries < CONFLICT_TRIES => match self.get_robot(name).await? {
                    Some(fresh) => robot = Arc::new(fresh),
                    None => return Ok(Outcome::Done("unchanged")),
                },
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }
}
