//! The `k8s4r` commands an operator meets first, against a running stack:
//! `join-command` (its agent.toml and its command line start agents that
//! register), `status`, `version`, and the bootstrap token where the docs
//! say it is.

use std::process::{Command, Stdio};

use k8s4r::join::{self, JoinArgs};
use k8s4r::status::{server_version, Summary};
use k8s4r_api::names::{BOOTSTRAP_TOKEN_KEY, DEFAULT_BOOTSTRAP_SECRET, DEFAULT_NAMESPACE};
use k8s4r_api::{Job, Robot, RobotPhase, Task};
use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::Api;

// Not every test file uses every helper.
#[allow(unused_imports)]
mod support;
use support::*;

fn agent(args: &[String], log: &std::path::Path) -> Proc {
    let log = std::fs::File::create(log).expect("agent log");
    Proc(
        Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the agent starts"),
    )
}

/// The agent.toml `join-command --write-config` writes, and the command
/// line it prints, each start an agent that registers with the labels
/// asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_command_starts_agents_that_register() {
    let env = Env::start(&[]).await;
    let config = env.dir.path().join("agent.toml");
    join::run(
        JoinArgs {
            robot: Some("joined-1".into()),
            labels: vec!["site=lab".into()],
            write_config: Some(config.clone()),
            broker_url: None,
            state_dir: None,
        },
        &env.data_dir,
    )
    .expect("join-command writes the config");
    let check = Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .expect("check-config runs");
    assert!(
        check.status.success(),
        "--check-config refused the written config: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let _first = agent(
        &["--config".into(), config.to_string_lossy().into_owned()],
        &env.dir.path().join("joined-1.log"),
    );
    env.wait_phase("joined-1", RobotPhase::Online).await;

    let mut recipe = join::Recipe::new(&env.data_dir, &env.broker_url, Some("joined-2"));
    recipe.labels = vec![("site".into(), "yard".into())];
    let line = recipe.command();
    assert!(line.starts_with("k8s4r-agent "), "{line}");
    // The printed line as a shell would split it (its words are plain here).
    let words: Vec<String> = line.split_whitespace().skip(1).map(str::to_owned).collect();
    let _second = agent(&words, &env.dir.path().join("joined-2.log"));
    env.wait_phase("joined-2", RobotPhase::Online).await;

    let robots: Api<Robot> = Api::all(env.client.clone());
    let labels = |name: &'static str| {
        let robots = robots.clone();
        async move {
            robots
                .get(name)
                .await
                .expect("the robot")
                .metadata
                .labels
                .unwrap_or_default()
        }
    };
    assert_eq!(
        labels("joined-1").await.get("site").map(String::as_str),
        Some("lab")
    );
    assert_eq!(
        labels("joined-2").await.get("site").map(String::as_str),
        Some("yard")
    );
    env.stop().await;
}

/// `up` keeps the bootstrap token under the key the docs name; `status`
/// counts what the cluster holds; `version` names the API server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_key_status_and_version() {
    let env = Env::start(&[("st-1", &[])]).await;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), DEFAULT_NAMESPACE);
    let secret = secrets
        .get(DEFAULT_BOOTSTRAP_SECRET)
        .await
        .expect("the token Secret");
    let keys: Vec<String> = secret.data.unwrap_or_default().into_keys().collect();
    assert_eq!(keys, vec![BOOTSTRAP_TOKEN_KEY.to_owned()]);

    // A task no robot can take: it waits, and status says why.
    env.create_job(job_json(
        "stuck",
        serde_json::json!([{
            "name": "t", "count": 1, "task": sh("true", "1m"),
            "robotSelector": { "matchLabels": { "site": "moon" } },
        }]),
    ))
    .await;
    let screen = eventually("status shows the waiting task and why", || async {
        let robots = Api::<Robot>::all(env.client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let jobs = Api::<Job>::all(env.client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let tasks = Api::<Task>::all(env.client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let summary = Summary::of(&robots, &jobs, &tasks);
        let reason_known = summary
            .waiting
            .iter()
            .any(|(_, why)| why != "no reason given yet");
        reason_known.then(|| summary.render("all namespaces"))
    })
    .await;
    assert!(screen.contains("ROBOTS  1: 1 Online\n"), "{screen}");
    assert!(screen.contains("TASKS   1: 1 pending\n"), "{screen}");
    assert!(screen.contains("WHY TASKS WAIT"), "{screen}");

    let version = server_version(&env.client).await.expect("the API server answers");
    assert!(version.starts_with('v'), "{version}");
    env.stop().await;
}
