//! A fleet of robots on the old agent, each installed in upgrade slots
//! and run by a stand-in for systemd that follows the committed unit, with
//! the next release's artifacts (good and broken) signed with `k8s4r
//! sign-agent` and served over HTTP: what the upgrade tests and the
//! upgrade bench share.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s4r_agent::upgrade::slots::Slots;
use k8s4r_agent::upgrade::FAILPOINT_VARIABLE;
use k8s4r_api::names::ANNOTATION_AGENT_ROLLOUT;
use k8s4r_api::{AgentRollout, Robot, RobotPhase, RobotUpgradePhase, RolloutState};
use k8s4r_e2e::upgrade::{as_aarch64, install_robot, Artifact, Signer, Unit};
use k8s4r_e2e::NEXT_VERSION;
use k8s4r_testbed::http::{serve, Reply};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};

use crate::support::{eventually, Env};

pub const OLD_VERSION: &str = env!("CARGO_PKG_VERSION");
pub const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
pub const NEXT: &str = env!("CARGO_BIN_EXE_e2e-agent-next");
/// A release older than the one the robots run (artifact `older`).
pub const OLDER_VERSION: &str = "0.0.1";
pub const CRASH: &str = env!("CARGO_BIN_EXE_e2e-agent-crash");
pub const LOST: &str = env!("CARGO_BIN_EXE_e2e-agent-lost");
pub const HANG: &str = env!("CARGO_BIN_EXE_e2e-agent-hang");

/// How long a rollout may take in these tests before they fail.
pub const ROLLOUT_DEADLINE: Duration = Duration::from_secs(240);

/// The stack, one unit per robot, and the artifacts on a file server.
pub struct Fleet {
    /// Dropped first: the units stop before the stack and its directory go.
    pub units: BTreeMap<String, Unit>,
    pub env: Env,
    pub files: String,
    pub artifacts: BTreeMap<&'static str, Artifact>,
}

/// Robots on the old agent, each installed in its slots and run by its
/// unit, with `failpoints` (robot, step) armed once; the artifacts signed
/// and served.
pub async fn fleet(robots: &[&str], failpoints: &[(&str, &str)]) -> Fleet {
    let env = Env::start(&[]).await;
    let signer = Signer::new(&env.dir.path().join("signing"));
    let intruder = Signer::new(&env.dir.path().join("intruder"));
    let next = signer.sign("next", Path::new(NEXT));
    let mut artifacts = BTreeMap::new();
    artifacts.insert("crash", signer.sign("crash", Path::new(CRASH)));
    artifacts.insert("lost", signer.sign("lost", Path::new(LOST)));
    artifacts.insert("hang", signer.sign("hang", Path::new(HANG)));
    artifacts.insert("forged", intruder.sign("forged", Path::new(NEXT)));
    // A genuine older release, validly signed: a replay a robot refuses.
    let agent = std::fs::read(AGENT).expect("the agent binary");
    artifacts.insert("older", signer.sign_bytes("older", &agent, OLDER_VERSION));
    artifacts.insert(
        "arm",
        signer.sign_bytes("arm", &as_aarch64(&next.bytes), NEXT_VERSION),
    );
    // The good binary's signature, another binary's digest.
    artifacts.insert(
        "digest",
        Artifact {
            sha256: artifacts["crash"].sha256.clone(),
            ..next.clone()
        },
    );
    artifacts.insert("next", next);
    let routes: Vec<(String, Reply)> = artifacts
        .iter()
        .map(|(name, a)| (format!("/{name}"), Reply::Body(a.bytes.clone())))
        .collect();
    let files = serve(routes.iter().map(|(p, r)| (p.as_str(), r.clone())).collect()).await;
    let token = std::fs::read_to_string(env.data_dir.join("bootstrap-token")).expect("bootstrap token");
    let mut units = BTreeMap::new();
    for robot in robots {
        let state = env.dir.path().join("agents").join(robot);
        let config = env.dir.path().join(format!("{robot}.toml"));
        let toml = format!(
            "robot_id = \"{robot}\"\ntoken = \"{}\"\nbroker_url = \"{}\"\nstate_dir = \"{}\"\n\
             heartbeat_interval = \"1s\"\nraw_exec = true\nallow_root = true\n\
             upgrade_public_keys = [\"{}\"]\nfacts_file = \"{}\"\n",
            token.trim(),
            env.broker_url,
            state.display(),
            signer.public_key(),
            facts_file(&env, robot).display()
        );
        std::fs::write(facts_file(&env, robot), "{}").expect("the robot's facts");
        let unit = install_robot(&state, OLD_VERSION, Path::new(AGENT), &config, &toml);
        let mut vars = vec![("RUST_LOG".to_owned(), "info".to_owned())];
        if let Some((_, step)) = failpoints.iter().find(|(r, _)| r == robot) {
            let marker = env.dir.path().join(format!("{robot}.failpoint"));
            vars.push((
                FAILPOINT_VARIABLE.to_owned(),
                format!("{step}:{}", marker.display()),
            ));
        }
        let log = env.dir.path().join(format!("{robot}.log"));
        units.insert((*robot).to_owned(), Unit::start(unit, vars, &log));
    }
    for robot in robots {
        env.wait_phase(robot, RobotPhase::Online).await;
    }
    Fleet {
        env,
        units,
        files,
        artifacts,
    }
}

/// Where `robot`'s software writes its facts.
fn facts_file(env: &Env, robot: &str) -> PathBuf {
    env.dir.path().join(format!("{robot}-facts.json"))
}

impl Fleet {
    /// Writes `robot`'s facts as a careful robot does (rename into place).
    pub fn set_facts(&self, robot: &str, facts: serde_json::Value) {
        let file = facts_file(&self.env, robot);
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, facts.to_string()).expect("write the facts");
        std::fs::rename(&tmp, &file).expect("rename the facts into place");
    }

    /// Stops the robots' units, then the stack (see [`Env::stop`]).
    pub async fn stop(mut self) {
        for unit in self.units.values_mut() {
            unit.stop();
        }
        self.env.stop().await;
    }

    pub fn robots(&self) -> Api<Robot> {
        Api::all(self.env.client.clone())
    }

    pub fn rollouts(&self) -> Api<AgentRollout> {
        Api::all(self.env.client.clone())
    }

    /// Creates rollout `name` of artifact `artifact` (declared for
    /// `arch`).
    pub async fn roll_out(
        &self,
        name: &str,
        artifact: &str,
        max_parallel: i32,
        max_failed: i32,
        health: &str,
    ) {
        self.roll_out_with(
            name,
            artifact,
            max_parallel,
            max_failed,
            health,
            serde_json::json!({}),
        )
        .await;
    }

    /// Like [`Fleet::roll_out`], with more of the spec (`when`,
    /// `waitForTasks`, ...) from `extra`.
    pub async fn roll_out_with(
        &self,
        name: &str,
        artifact: &str,
        max_parallel: i32,
        max_failed: i32,
        health: &str,
        extra: serde_json::Value,
    ) {
        let a = &self.artifacts[artifact];
        let rollout: AgentRollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "robot.k8s4r.io/v1alpha1",
            "kind": "AgentRollout",
            "metadata": { "name": name },
            "spec": {
                "version": if artifact == "older" { OLDER_VERSION } else { NEXT_VERSION },
                "artifacts": [{
                    "arch": std::env::consts::ARCH,
                    "url": format!("{}/{artifact}", self.files),
                    "sha256": a.sha256,
                    "signature": a.signature,
                }],
                "maxParallel": max_parallel,
                "maxFailed": max_failed,
                "healthTimeout": health,
            }
        }))
        .expect("a valid AgentRollout");
        let mut rollout = serde_json::to_value(rollout).expect("json");
        for (key, value) in extra.as_object().into_iter().flatten() {
            rollout["spec"][key] = value.clone();
        }
        let rollout: AgentRollout = serde_json::from_value(rollout).expect("a valid AgentRollout");
        self.rollouts()
            .create(&PostParams::default(), &rollout)
            .await
            .expect("create the AgentRollout");
    }

    /// Waits until rollout `name` is in `state`, for at most `deadline`.
    pub async fn wait_state(&self, name: &str, state: RolloutState, deadline: Duration) -> AgentRollout {
        let rollouts = self.rollouts();
        k8s4r_testbed::eventually(deadline, &format!("rollout {name} {state:?}"), || {
            let rollouts = rollouts.clone();
            async move {
                let r = rollouts.get(name).await.ok()?;
                (r.status.as_ref()?.state? == state).then_some(r)
            }
        })
        .await
    }

    pub async fn robot(&self, name: &str) -> Robot {
        self.robots().get(name).await.expect("read the Robot")
    }

    pub fn slots(&self, robot: &str) -> Slots {
        Slots::new(&self.env.dir.path().join("agents").join(robot))
    }

    pub async fn delete_rollout(&self, name: &str) {
        self.rollouts()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete the rollout");
        let robots = self.robots();
        eventually("no robot marked for a deleted rollout", || async {
            let list = robots.list(&ListParams::default()).await.ok()?;
            let marked = list.items.iter().any(|r| {
                r.annotations()
                    .get(ANNOTATION_AGENT_ROLLOUT)
                    .is_some_and(|m| m == name)
            });
            (!marked).then_some(())
        })
        .await;
    }
}

pub fn version_of(robot: &Robot) -> Option<&str> {
    robot.status.as_ref()?.agent_version.as_deref()
}

pub fn upgrade_of(robot: &Robot) -> Option<(&str, RobotUpgradePhase, Option<&str>)> {
    let u = robot.status.as_ref()?.agent_upgrade.as_ref()?;
    Some((u.rollout.as_str(), u.phase, u.reason.as_deref()))
}

pub fn slot_of(version: &str, robot_slots: &Slots) -> PathBuf {
    robot_slots.dir().join("slots").join(version).join("k8s4r-agent")
}
