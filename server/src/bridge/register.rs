//! Registrations: a robot says who it is and is answered with the phase
//! the manager decided (at once, or once the manager has decided).

use jiff::Timestamp;
use k8s4r_api::protocol::{encode, Register, RegisterResponse};
use k8s4r_api::{Robot, RobotPhase};
use k8s4r_service::lock;
use k8s4r_service::patch::Guarded;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, instrument, warn};

use super::{set_values, Bridge, Outcome, CONFLICT_TRIES};
use crate::decide::{self, plan_register};
use crate::error::Result;

/// The answer to a registration that carried `nonce`.
fn response_body(phase: RobotPhase, message: Option<String>, nonce: Option<String>) -> Vec<u8> {
    encode(&RegisterResponse {
        server_time: Some(Timestamp::now()),
        status_acks: true,
        usage_when_moved: true,
        nonce,
        ..RegisterResponse::new(phase, message)
    })
}

impl Bridge {
    #[instrument(skip_all, fields(robot = %msg.robot_id))]
    pub(super) async fn register(&self, msg: &Register) -> Result<Outcome> {
        let name = msg.robot_id.as_str();
        // Most registrations in a reconnect storm say nothing new: they are
        // answered from the cache, without a read. A cache that lags can
        // only make one go unwritten that should have been (a `Connected`
        // the last will set False a moment ago); the robot's heartbeats
        // write it once the cache shows it.
        if let Some(cached) = self.robot_cache.get(&ObjectRef::new(name)) {
            if let Ok(plan) = plan_register(msg, Some(&cached), Timestamp::now()) {
                if !plan.create && plan.metadata.is_empty() && !plan.write_status {
                    debug!(respond = ?plan.respond, "robot registered again, nothing new");
                    self.answer(name, plan.respond, msg.nonce.clone()).await;
                    return Ok(Outcome::Done("applied"));
                }
            }
        }
        // The first try goes by the cache, without a read: a robot it does
        // not show is created at once (a storm of new robots costs one read
        // less each), and every other write is guarded by the version the
        // cache shows. A cache behind the API server makes the write fail
        // (409: the robot exists, or changed), and the next try reads it.
        let mut existing = self
            .robot_cache
            .get(&ObjectRef::new(name))
            .map(|cached| Robot::clone(&cached));
        let mut tries = 0;
        let respond = loop {
            tries += 1;
            let plan = match plan_register(msg, existing.as_ref(), Timestamp::now()) {
                Ok(plan) => plan,
                Err(rejection) => return Ok(Outcome::Rejected(rejection.to_string(), rejection.outcome())),
            };
            match self.apply_register(name, existing, &plan).await {
                Ok(()) => break plan.respond,
                Err(e) if (e.is_conflict() || e.is_not_found()) && tries < CONFLICT_TRIES => {
                    debug!(error = %e, "robot changed meanwhile; reading it again");
                    existing = self.get_robot(name).await?;
                }
                Err(e) => return Err(e),
            }
        };
        info!(respond = ?respond, "robot registered");
        self.answer(name, respond, msg.nonce.clone()).await;
        Ok(Outcome::Done("applied"))
    }

    /// Answers a registration with the phase the manager decided, or
    /// remembers that the robot waits for the decision (`respond` None).
    async fn answer(&self, name: &str, respond: Option<RobotPhase>, nonce: Option<String>) {
        match respond {
            Some(phase) => {
                let message = self
                    .robot_cache
                    .get(&ObjectRef::new(name))
                    .and_then(|r| r.status.as_ref().and_then(|s| s.message.clone()));
                self.respond(name, phase, message, nonce);
            }
            None => self.await_decision(name, nonce).await,
        }
    }

    async fn apply_register(
        &self,
        name: &str,
        existing: Option<Robot>,
        plan: &decide::RegisterPlan,
    ) -> Result<()> {
        let mut rv = existing.and_then(|r| r.metadata.resource_version);
        if plan.create {
            let mut robot = Robot::new(name, Default::default());
            robot.metadata = ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(set_values(&plan.metadata.labels)),
                annotations: Some(set_values(&plan.metadata.annotations)),
                ..Default::default()
            };
            let created = self
                .kube
                .write(
                    "robot_create",
                    || format!("creating robot {name}"),
                    self.robots.create(&self.kube.post_params(), &robot),
                )
                .await?;
            rv = created.metadata.resource_version;
        } else if !plan.metadata.is_empty() {
            let body = Guarded::metadata(rv.as_deref(), &plan.metadata);
            let patched = self
                .kube
                .patch("robot_metadata", &self.robots, name, &body, || {
                    format!("patching labels of robot {name}")
                })
                .await?;
            rv = patched.metadata.resource_version;
        }
        if !plan.write_status {
            return Ok(());
        }
        self.patch_robot_status(name, &plan.status, rv.as_deref(), "robot_register")
            .await
    }

    /// Remembers that `name` waits for the manager's decision; answers at
    /// once if the cache already shows it (the watch may have gone by).
    async fn await_decision(&self, name: &str, nonce: Option<String>) {
        lock(&self.awaiting_response).insert(name.to_owned(), nonce);
        if let Some(robot) = self.robot_cache.get(&ObjectRef::new(name)) {
            self.robot_changed(&robot).await;
        }
    }

    /// Called for every Robot the watch sees: answers a waiting robot once
    /// its phase is decided, and sends a marked robot its upgrade order.
    /// (The shown facts follow the Robot's label and phase beside it:
    /// [`Bridge::follow_show_facts`].)
    pub async fn robot_changed(&self, robot: &Robot) {
        self.order_on_mark(robot).await;
        let Some(status) = robot.status.as_ref() else {
            return;
        };
        let Some(phase @ (RobotPhase::Online | RobotPhase::Rejected)) = status.phase else {
            return;
        };
        let name = robot.metadata.name.clone().unwrap_or_default();
        let Some(nonce) = lock(&self.awaiting_response).remove(&name) else {
            return;
        };
        self.respond(&name, phase, status.message.clone(), nonce);
    }

    /// Answers the registration that carried `nonce`, without waiting for
    /// the broker: the robot's worker, or the Robot-watch loop that
    /// answers every robot whose registration waited for the manager, goes
    /// on at once (in a storm of 100,000, one PUBACK at a time held every
    /// robot's heartbeats behind the answers, and the watch loop minutes
    /// behind), and a lost answer is repaired by the robot's next register.
    fn respond(&self, name: &str, phase: RobotPhase, message: Option<String>, nonce: Option<String>) {
        let body = response_body(phase, message, nonce);
        if self.publisher.send(self.topics.response(name), body) {
            info!(robot = name, ?phase, "registration answered");
            self.metrics.message_out("response", "queued");
        } else {
            warn!(
                robot = name,
                "registration answer not sent; the robot's next register retries"
            );
            self.metrics.message_out("response", "failed");
        }
    }
}
