//! A changed ConfigMap reaching running services, on the real programs
//! (API server, server, manager, Mosquitto and agents, each a process):
//! from the change written to the new file in place in every service that
//! takes it. Each service takes a file of the ConfigMap with
//! `onConfigChange: signal`; on SIGHUP (which comes once its file is
//! rewritten) it notes the time and what the file holds.

use std::time::Duration;

use k8s4r_api::TaskState;
use k8s4r_testbed::eventually;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

use crate::faults::{Binaries, Options, Stack, NS};

/// How long everything of a round may take.
const ROUND_DEADLINE: Duration = Duration::from_secs(120);

/// The service: notes `<unix nanos> <file content>` on each SIGHUP, and
/// otherwise sleeps a second at a time (the signal ends the sleep; `sleep
/// 3600 & wait` would leave a signal that comes as dash forks pending for
/// the hour).
fn service_script(marks: &str) -> String {
    format!(
        "trap 'echo \"$(date +%s%N) $(cat conf/value)\" >> {marks}' HUP; \
         echo \"$(date +%s%N) start\" >> {marks}; \
         while true; do sleep 1; done"
    )
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// `rounds` changes of one ConfigMap taken by `services` services spread
/// over `robots` agents: for each service and round, the time from the
/// change's write to the service seeing the new file on its SIGHUP.
pub async fn config_change_latencies(
    bins: &Binaries,
    robots: usize,
    services: usize,
    rounds: usize,
) -> Vec<Duration> {
    let names: Vec<String> = (0..robots).map(|i| format!("cfg{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let stack = Stack::start(bins, Options::robots(&refs)).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(stack.client.clone(), NS);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "bench-params", "namespace": NS },
        "data": { "value": "0" },
    }))
    .expect("a ConfigMap");
    config_maps
        .create(&PostParams::default(), &cm)
        .await
        .expect("create the ConfigMap");
    let marks = stack.marks_file().display().to_string();
    let shape = serde_json::json!({
        "count": services,
        "task": {
            "driver": "exec",
            "command": "/bin/sh",
            "args": ["-c", service_script(&marks)],
            "kind": "service",
            "killTimeout": "2s",
            "files": [{ "path": "conf", "configMap": { "name": "bench-params" } }],
            "onConfigChange": "signal",
        },
    });
    stack
        .submit_group("services", shape, 0.0, serde_json::json!({}))
        .await;
    stack.wait_all("services", services, TaskState::Running).await;
    eventually(
        ROUND_DEADLINE,
        "every service reporting the configuration it runs with",
        || async {
            let tasks = stack.tasks("services").await;
            (tasks.len() == services
                && tasks
                    .iter()
                    .all(|t| t.status.as_ref().is_some_and(|s| s.config.is_some())))
            .then_some(())
        },
    )
    .await;
    let mut latencies = Vec::with_capacity(services * rounds);
    for round in 1..=rounds {
        let written = unix_nanos();
        config_maps
            .patch(
                "bench-params",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "data": { "value": round.to_string() } })),
            )
            .await
            .expect("change the ConfigMap");
        let suffix = format!(" {round}");
        let seen = eventually(
            ROUND_DEADLINE,
            &format!("round {round} reaching {services} services"),
            || async {
                let text = std::fs::read_to_string(stack.marks_file()).ok()?;
                let seen: Vec<u128> = text
                    .lines()
                    .filter(|l| l.ends_with(&suffix))
                    .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                    .collect();
                (seen.len() >= services).then_some(seen)
            },
        )
        .await;
        for at in seen {
            let nanos = u64::try_from(at.saturating_sub(written)).unwrap_or(u64::MAX);
            latencies.push(Duration::from_nanos(nanos));
        }
    }
    stack.delete_job("services").await;
    latencies
}
