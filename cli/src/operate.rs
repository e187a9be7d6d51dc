//! `k8s4r retry` and `k8s4r cancel`: thin wrappers around the annotations
//! the manager acts on (`robot.k8s4r.io/retry`, `robot.k8s4r.io/cancel`),
//! so that what they do is what `kubectl annotate` does, plus who asked,
//! a wait for the manager to act, and errors a person understands.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use k8s4r_api::names::{ANNOTATION_CANCEL, ANNOTATION_REQUESTED_BY, ANNOTATION_RETRY};
use k8s4r_api::{Job, ManualAction, Task, TaskGroup};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

/// The field manager of the CLI's writes.
pub const FIELD_MANAGER: &str = "k8s4r-cli";

/// Where to find the cluster, as kubectl's flags say it.
#[derive(Debug, Clone, ClapArgs)]
pub struct KubeArgs {
    /// The kubeconfig (default: $KUBECONFIG, ~/.kube/config, else the one
    /// `k8s4r up` wrote).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
    /// The namespace (default: the context's, else `default`).
    #[arg(short, long)]
    pub namespace: Option<String>,
}

impl KubeArgs {
    /// A client and the namespace to work in.
    pub async fn connect(&self, data_dir: &Path) -> anyhow::Result<(Client, String)> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let from_env = std::env::var_os("KUBECONFIG").is_some_and(|k| !k.is_empty());
        let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config"));
        let path = match &self.kubeconfig {
            Some(path) => Some(path.clone()),
            None if from_env || home.as_deref().is_some_and(Path::exists) => None,
            None => Some(crate::data_dir::kubeconfig_path(data_dir)).filter(|p| p.exists()),
        };
        let config = match path {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(&path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await
            }
            None => Config::from_kubeconfig(&options).await,
        }
        .context("no usable kubeconfig (set KUBECONFIG, pass --kubeconfig, or run `k8s4r up`)")?;
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let url = config.cluster_url.to_string();
        let client =
            Client::try_from(config).with_context(|| format!("connecting to the API server at {url}"))?;
        Ok((client, namespace))
    }
}

/// Which object a command is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Task.
    Task(String),
    /// A TaskGroup.
    Group(String),
    /// A Job.
    Job(String),
}

impl Target {
    /// Reads `kind/name` (task, rtask, taskgroup, rtg, job, rjob) or a bare
    /// task name.
    pub fn parse(arg: &str) -> anyhow::Result<Target> {
        let (kind, name) = arg.split_once('/').unwrap_or(("task", arg));
        if name.is_empty() {
            bail!("no name in {arg:?}");
        }
        let kind = kind.split('.').next().unwrap_or(kind).to_ascii_lowercase();
        Ok(match kind.as_str() {
            "task" | "tasks" | "rtask" => Target::Task(name.to_owned()),
            "taskgroup" | "taskgroups" | "rtg" => Target::Group(name.to_owned()),
            "job" | "jobs" | "rjob" => Target::Job(name.to_owned()),
            other => bail!("{other:?} is not a task, taskgroup or job (write e.g. job/{name})"),
        })
    }

    /// `task NAME`, `task group NAME`, `job NAME`.
    pub fn describe(&self) -> String {
        match self {
            Target::Task(n) => format!("task {n}"),
            Target::Group(n) => format!("task group {n}"),
            Target::Job(n) => format!("job {n}"),
        }
    }
}

/// `k8s4r retry` and `k8s4r cancel`.
#[derive(Debug, Clone, ClapArgs)]
pub struct ManualArgs {
    /// What: TASK, task/NAME, taskgroup/NAME or job/NAME.
    #[arg(required_unless_present = "job")]
    pub target: Option<String>,
    /// The Job (all of it; with --group, that group of it).
    #[arg(long, conflicts_with = "target")]
    pub job: Option<String>,
    /// With --job: only this group of the Job.
    #[arg(long, requires = "job")]
    pub group: Option<String>,
    /// Return once the request is written, without waiting for the manager.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the manager to act.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
}

impl ManualArgs {
    fn target(&self) -> anyhow::Result<Target> {
        match (&self.target, &self.job, &self.group) {
            (Some(t), _, _) => Target::parse(t),
            (None, Some(job), Some(group)) => Ok(Target::Group(format!("{job}-{group}"))),
            (None, Some(job), None) => Ok(Target::Job(job.clone())),
            (None, None, _) => bail!("say what: TASK, kind/NAME or --job"),
        }
    }
}

/// Which request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manual {
    /// `robot.k8s4r.io/retry`.
    Retry,
    /// `robot.k8s4r.io/cancel`.
    Cancel,
}

impl Manual {
    fn annotation(self) -> &'static str {
        match self {
            Manual::Retry => ANNOTATION_RETRY,
            Manual::Cancel => ANNOTATION_CANCEL,
        }
    }

    /// `retry` or `cancel`.
    pub fn verb(self) -> &'static str {
        match self {
            Manual::Retry => "retry",
            Manual::Cancel => "cancel",
        }
    }
}

/// Who the kubeconfig's credentials are (SelfSubjectReview), if the server
/// says.
pub async fn whoami(client: &Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = SelfSubjectReview::default();
    let answer = api.create(&PostParams::default(), &review).await.ok()?;
    answer.status?.user_info?.username
}

/// Writes the request (`manual`) on `target` in `ns`, as `by` when known:
/// the annotation the manager acts on, and who asked. Returns the
/// request's value (a timestamp; the status records it once acted on).
pub async fn request(
    client: &Client,
    ns: &str,
    target: &Target,
    manual: Manual,
    by: Option<&str>,
) -> anyhow::Result<String> {
    let value = jiff::Timestamp::now().to_string();
    let mut annotations = serde_json::Map::new();
    annotations.insert(manual.annotation().to_owned(), value.clone().into());
    if let Some(by) = by {
        annotations.insert(ANNOTATION_REQUESTED_BY.to_owned(), by.into());
    }
    let patch = json!({ "metadata": { "annotations": annotations } });
    let what = target.describe();
    match target {
        Target::Task(name) => annotate::<Task>(client, ns, name, &patch, manual, &what).await?,
        Target::Group(name) => annotate::<TaskGroup>(client, ns, name, &patch, manual, &what).await?,
        Target::Job(name) => annotate::<Job>(client, ns, name, &patch, manual, &what).await?,
    }
    Ok(value)
}

/// Writes the request on `target` and, unless told not to, waits until the
/// manager recorded acting on it.
pub async fn run(manual: Manual, args: ManualArgs, data_dir: &Path) -> anyhow::Result<()> {
    let target = args.target()?;
    let (client, ns) = args.kube.connect(data_dir).await?;
    let by = whoami(&client).await;
    let value = request(&client, &ns, &target, manual, by.as_deref()).await?;
    let what = target.describe();
    println!(
        "{} of {what} in namespace {ns} requested ({value})",
        manual.verb()
    );
    if args.no_wait {
        return Ok(());
    }
    let deadline = Instant::now() + args.timeout;
    let (mut said, mut waiting) = (false, false);
    loop {
        let acted = match &target {
            Target::Task(name) => {
                acted_on::<Task>(&client, &ns, name, manual, |t| {
                    let s = t.status.as_ref()?;
                    Some((
                        pick(manual, &s.retry, &s.cancellation)?,
                        s.state.map(|s| s.as_str().to_owned()),
                        s.state.is_some_and(k8s4r_api::TaskState::is_terminal),
                    ))
                })
                .await?
            }
            Target::Group(name) => {
                acted_on::<TaskGroup>(&client, &ns, name, manual, |g| {
                    let s = g.status.as_ref()?;
                    Some((
                        pick(manual, &s.retry, &s.cancellation)?,
                        s.state.map(|s| format!("{s:?}")),
                        s.state.is_some_and(k8s4r_api::WorkState::is_finished),
                    ))
                })
                .await?
            }
            Target::Job(name) => {
                acted_on::<Job>(&client, &ns, name, manual, |j| {
                    let s = j.status.as_ref()?;
                    Some((
                        pick(manual, &s.retry, &s.cancellation)?,
                        s.state.map(|s| format!("{s:?}")),
                        s.state.is_some_and(k8s4r_api::WorkState::is_finished),
                    ))
                })
                .await?
            }
        };
        if let Some((action, state, finished)) = acted.filter(|(a, _, _)| a.value == value) {
            let state = state
                .map(|s| format!(" (now {})", s.to_lowercase()))
                .unwrap_or_default();
            if !said {
                println!("{what}: {}", action.message.unwrap_or_default());
                said = true;
            }
            // A cancel is done when what ran has stopped on its robot.
            if manual == Manual::Cancel && !finished {
                if !waiting {
                    eprintln!("waiting for its robot to stop what runs...");
                    waiting = true;
                }
            } else {
                println!("{what}: done{state}");
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            if said {
                bail!(
                    "{what} has not stopped within {:?}: its robot may be offline (it is stopped when the robot is back)",
                    args.timeout
                );
            }
            bail!(
                "the manager has not acted on the {} of {what} within {:?}: is k8s4r-manager running? \
                 (the request stays and is acted on when it is)",
                manual.verb(),
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pick(manual: Manual, retry: &Option<ManualAction>, cancel: &Option<ManualAction>) -> Option<ManualAction> {
    match manual {
        Manual::Retry => retry.clone(),
        Manual::Cancel => cancel.clone(),
    }
}

async fn annotate<K>(
    client: &Client,
    ns: &str,
    name: &str,
    patch: &serde_json::Value,
    manual: Manual,
    what: &str,
) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch(name, &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let place = format!(" in namespace {ns}");
            Err(explain(e, manual.verb(), what, &place, &K::plural(&())))
        }
    }
}

/// What a refused patch of `what` means for a person: not found, not
/// allowed (and the permission it takes: `patch` on `plural`), credentials
/// not accepted; else the error with what was being done. `place` follows
/// `what` (` in namespace NS`, or nothing for a cluster-wide object).
pub fn explain(error: kube::Error, verb: &str, what: &str, place: &str, plural: &str) -> anyhow::Error {
    match error {
        kube::Error::Api(e) if e.code == 404 => anyhow::anyhow!("{what} not found{place}"),
        kube::Error::Api(e) if e.code == 403 => anyhow::anyhow!(
            "you may not {verb} {what}{place}: it takes `patch` on {plural} ({})",
            e.message
        ),
        kube::Error::Api(e) if e.code == 401 => {
            anyhow::anyhow!("the API server did not accept your credentials: {}", e.message)
        }
        e => anyhow::Error::new(e).context(format!("asking the API server to {verb} {what}")),
    }
}

async fn acted_on<K>(
    client: &Client,
    ns: &str,
    name: &str,
    manual: Manual,
    read: impl Fn(&K) -> Option<(ManualAction, Option<String>, bool)>,
) -> anyhow::Result<Option<(ManualAction, Option<String>, bool)>>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let obj = api
        .get(name)
        .await
        .with_context(|| format!("reading {} {name} back after the {}", K::kind(&()), manual.verb()))?;
    Ok(read(&obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_read_like_kubectl() {
        assert_eq!(Target::parse("j-g-0").unwrap(), Target::Task("j-g-0".into()));
        assert_eq!(Target::parse("rjob/j").unwrap(), Target::Job("j".into()));
        assert_eq!(
            Target::parse("taskgroups.robot.k8s4r.io/j-g").unwrap(),
            Target::Group("j-g".into())
        );
        assert!(Target::parse("pod/x")
            .unwrap_err()
            .to_string()
            .contains("not a task"));
        assert!(Target::parse("job/").is_err());
    }
}
