//! Task outputs, the server's part: a robot asks for what an upload needs
//! next (`outputs/ask`), the server checks that the attempt ran on that
//! robot, starts or completes the multipart upload with the bucket's
//! credentials, presigns the parts' URLs, answers (`outputs/answer`) and
//! records the output in the Task's status.
//!
//! [`plan`] decides, without I/O, what an ask may do; [`Outputs`] does it
//! off the robot's message lane (a bucket call may take seconds; the
//! robot's heartbeats must not wait behind it), a bounded number at once.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::protocol::outputs::{Answer, OutputAnswer, OutputAsk, PartUrl, Want, MAX_PARTS};
use k8s4r_api::protocol::Topics;
use k8s4r_api::{OutputState, OutputStatus, Task};
use k8s4r_service::Kube;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::bucket::{Bucket, BucketConfig};
use crate::mqtt::Publisher;

/// Asks handled at once; more are answered "not now".
const AT_ONCE: usize = 16;
/// How long a part's URL is valid.
pub const URL_VALID: Duration = Duration::from_secs(15 * 60);
/// Outputs a Task's status lists, over all its attempts.
pub const MAX_OUTPUTS: usize = 100;
/// Tries of a status write that met a newer Task.
const CONFLICT_TRIES: u32 = 5;

/// What an ask may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Start the upload of `key`, then sign `parts`.
    Begin { key: String, parts: Vec<u32> },
    /// Sign `parts` of upload `upload_id`.
    Sign {
        key: String,
        upload_id: String,
        parts: Vec<u32>,
    },
    /// Complete upload `upload_id` from `etags`.
    Complete {
        key: String,
        upload_id: String,
        etags: Vec<String>,
    },
    /// Record that the robot gave the output up.
    /// Nothing: the Task lists this file uploaded already.
    Uploaded { key: String },
    /// Record that the robot gave the output up; abort its multipart
    /// upload, if it began one.
    Drop {
        key: String,
        reason: String,
        upload_id: Option<String>,
    },
}

/// Why an ask is refused: said to the robot, which tries again later only
/// when `retry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    pub retry: bool,
}

impl Plan {
    /// The object it is about.
    pub fn key(&self) -> &str {
        match self {
            Plan::Begin { key, .. }
            | Plan::Sign { key, .. }
            | Plan::Complete { key, .. }
            | Plan::Drop { key, .. }
            | Plan::Uploaded { key } => key,
        }
    }
}

fn never(reason: String) -> Refusal {
    Refusal { reason, retry: false }
}

/// Whether one of a template's `outputs` names `path`.
fn named_by(outputs: &[k8s4r_api::output::Output], path: &str) -> bool {
    outputs
        .iter()
        .filter_map(|o| k8s4r_api::output::matcher(&o.path).ok())
        .any(|m| m.is_match(path))
}

/// Whether `ask` from `robot` may be answered at all (its attempt ran
/// there, its path is one the task's outputs name, its sizes and sha256
/// are sound); the number of parts of its file.
fn admissible(ask: &OutputAsk, task: &Task, name: &str, robot: &str) -> Result<u32, Refusal> {
    if !ran_on(task, ask.attempt, robot) {
        return Err(never(format!(
            "attempt {} of task {name} did not run on robot {robot}",
            ask.attempt
        )));
    }
    if let Err(why) = check_path(&ask.path) {
        return Err(never(format!("output {:?}: {why}", ask.path)));
    }
    if !named_by(&task.spec.template.outputs, &ask.path) {
        return Err(never(format!(
            "output {:?} is not named by the outputs of task {name}",
            ask.path
        )));
    }
    let parts = k8s4r_api::protocol::outputs::parts_of(ask.size, ask.part_size);
    if parts > MAX_PARTS || ask.part_size == 0 {
        return Err(never(format!(
            "output {:?}: {} bytes in parts of {} make more than {MAX_PARTS} parts",
            ask.path, ask.size, ask.part_size
        )));
    }
    // A file the robot never took (its quota was full) was never read.
    let unread = ask.sha256.is_empty() && matches!(ask.want, Want::Dropped { .. });
    if !is_sha256(&ask.sha256) && !unread {
        return Err(never(format!(
            "output {:?}: {:?} is not a sha256",
            ask.path, ask.sha256
        )));
    }
    Ok(parts)
}

/// What `ask` from `robot` may do, given the Task it names (None: not in
/// the cache).
pub fn plan(ask: &OutputAsk, task: Option<&Task>, robot: &str) -> Result<Plan, Refusal> {
    let Some(task) = task else {
        return Err(never(format!("task {} is not known (deleted?)", ask.task_uid)));
    };
    let name = task.name_any();
    let parts = admissible(ask, task, &name, robot)?;
    let key = object_key(task, ask.attempt, robot, &ask.path);
    // Uploaded already, this very file (an agent that restarted took it
    // again): nothing to send.
    let uploaded = task.status.as_ref().is_some_and(|s| {
        s.outputs.iter().any(|o| {
            o.attempt == ask.attempt
                && o.path == ask.path
                && o.state == OutputState::Uploaded
                && o.sha256 == ask.sha256
        })
    });
    if uploaded && matches!(ask.want, Want::Parts { upload_id: None, .. }) {
        return Ok(Plan::Uploaded { key });
    }
    let known = task.status.as_ref().is_some_and(|s| {
        s.outputs
            .iter()
            .any(|o| o.attempt == ask.attempt && o.path == ask.path)
    });
    let listed = task.status.as_ref().map_or(0, |s| s.outputs.len());
    match &ask.want {
        Want::Parts { upload_id: None, .. } if !known && listed >= MAX_OUTPUTS => Err(never(format!(
            "task {name} lists {MAX_OUTPUTS} outputs already, the most it may have"
        ))),
        Want::Parts { parts: wanted, .. } if wanted.iter().any(|p| *p == 0 || *p > parts) => {
            Err(never(format!(
                "output {:?} has parts 1 to {parts}; asked for {wanted:?}",
                ask.path
            )))
        }
        Want::Parts {
            upload_id: None,
            parts,
        } => Ok(Plan::Begin {
            key,
            parts: parts.clone(),
        }),
        Want::Parts {
            upload_id: Some(id),
            parts,
        } => Ok(Plan::Sign {
            key,
            upload_id: id.clone(),
            parts: parts.clone(),
        }),
        Want::Complete { upload_id, etags } if etags.len() != parts as usize => Err(never(format!(
            "output {:?} has {parts} parts; {} ETags came to complete it",
            ask.path,
            etags.len()
        ))),
        Want::Complete { upload_id, etags } => Ok(Plan::Complete {
            key,
            upload_id: upload_id.clone(),
            etags: etags.clone(),
        }),
        Want::Dropped { reason, upload_id } => Ok(Plan::Drop {
            upload_id: upload_id.clone(),
            key,
            reason: reason.clone(),
        }),
    }
}

/// Whether attempt `attempt` of `task` was placed on `robot`.
fn ran_on(task: &Task, attempt: u32, robot: &str) -> bool {
    let Some(status) = &task.status else { return false };
    if status.attempt == attempt {
        return status.robot.as_deref() == Some(robot);
    }
    status
        .attempts
        .iter()
        .any(|a| a.attempt == attempt && a.robot.as_deref() == Some(robot))
}

/// A path inside the task's working directory: relative, no `..`, no
/// empty or `.` step, printable.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() || path.starts_with('/') {
        return Err("not a relative path");
    }
    if path.chars().any(char::is_control) {
        return Err("control characters");
    }
    if path.split('/').any(|step| matches!(step, "" | "." | "..")) {
        return Err("an empty, '.' or '..' step");
    }
    Ok(())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The object of an output: namespace, Job, Task, attempt and robot, then
/// the file's path (`default/survey/survey-scan-0/2/rb7/out/run.bag`).
pub fn object_key(task: &Task, attempt: u32, robot: &str, path: &str) -> String {
    let ns = task.namespace().unwrap_or_default();
    let job = task.labels().get(LABEL_JOB).map_or("-", String::as_str);
    format!("{ns}/{job}/{}/{attempt}/{robot}/{path}", task.name_any())
}

/// The Task's outputs with `entry` in place of the one of its attempt and
/// path (or added last); None when that one has ended (uploaded, dropped)
/// and `entry` is a late step of its upload, which never takes it back.
pub fn with_output(outputs: &[OutputStatus], entry: OutputStatus) -> Option<Vec<OutputStatus>> {
    let ended = outputs
        .iter()
        .any(|o| o.attempt == entry.attempt && o.path == entry.path && o.state != OutputState::Uploading);
    if ended && entry.state == OutputState::Uploading {
        return None;
    }
    let mut list: Vec<OutputStatus> = outputs
        .iter()
        .filter(|o| !(o.attempt == entry.attempt && o.path == entry.path))
        .cloned()
        .collect();
    list.push(entry);
    Some(list)
}

/// The Task's line for output `ask` as object `key`, now.
fn status_of(ask: &OutputAsk, key: &str, state: OutputState, message: Option<String>) -> OutputStatus {
    OutputStatus {
        attempt: ask.attempt,
        path: ask.path.clone(),
        key: key.to_owned(),
        size: ask.size,
        sha256: ask.sha256.clone(),
        state,
        message,
        time: Some(Timestamp::now()),
    }
}

/// The shell: the bucket, and the ways to the robots and the API server.
pub struct Outputs {
    bucket: Option<Bucket>,
    /// Why there is no bucket.
    missing: String,
    kube: Kube,
    publisher: Publisher,
    topics: Topics,
    slots: Arc<Semaphore>,
    recorder: k8s4r_service::events::Recorder,
}

impl Outputs {
    pub fn new(config: Option<&BucketConfig>, kube: Kube, publisher: Publisher, topics: Topics) -> Outputs {
        let (bucket, missing) = match config.map(Bucket::new) {
            None => (
                None,
                "no bucket is configured for task outputs (k8s4r-server --outputs-endpoint and --outputs-bucket)"
                    .to_owned(),
            ),
            Some(Ok(bucket)) => (Some(bucket), String::new()),
            Some(Err(error)) => (None, format!("the outputs bucket is misconfigured: {error}")),
        };
        Outputs {
            bucket,
            missing,
            publisher,
            topics,
            slots: Arc::new(Semaphore::new(AT_ONCE)),
            recorder: k8s4r_service::events::Recorder::new(
                kube.client().clone(),
                kube::runtime::events::Reporter {
                    controller: k8s4r_api::names::MANAGER_SERVER.to_owned(),
                    instance: None,
                },
            ),
            kube,
        }
    }

    /// Takes `ask` from `robot`, about `task`: answered off the lane. What
    /// became of it, for the message counter.
    pub fn offer(self: &Arc<Self>, robot: &str, ask: OutputAsk, task: Option<Arc<Task>>) -> &'static str {
        let decided = plan(&ask, task.as_deref(), robot);
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.answer(
                robot,
                &ask,
                Answer::Refused {
                    reason: "the server is busy with other uploads".into(),
                    retry: true,
                },
            );
            return "output_busy";
        };
        let (this, robot) = (self.clone(), robot.to_owned());
        tokio::spawn(async move {
            let answer = match decided {
                Err(refusal) => {
                    warn!(robot, task = %ask.task_uid, path = %ask.path, reason = %refusal.reason, "output ask refused");
                    Answer::Refused {
                        reason: refusal.reason,
                        retry: refusal.retry,
                    }
                }
                Ok(plan) => this.carry_out(plan, &ask, &robot, task).await,
            };
            this.answer(&robot, &ask, answer);
            drop(permit);
        });
        "output"
    }

    fn answer(&self, robot: &str, ask: &OutputAsk, answer: Answer) {
        let message = OutputAnswer {
            v: k8s4r_api::protocol::PROTOCOL_VERSION,
            task_uid: ask.task_uid.clone(),
            attempt: ask.attempt,
            path: ask.path.clone(),
            answer,
        };
        self.publisher.send(
            self.topics.output_answer(robot),
            k8s4r_api::protocol::encode(&message),
        );
    }

    /// Does `plan` with the bucket; the answer for the robot.
    async fn carry_out(&self, plan: Plan, ask: &OutputAsk, robot: &str, task: Option<Arc<Task>>) -> Answer {
        let entry = |key: &str, state, message| status_of(ask, key, state, message);
        if let Plan::Uploaded { key } = plan {
            return Answer::Completed { key };
        }
        let reason = match (&plan, &self.bucket) {
            (Plan::Drop { reason, .. }, _) => Some(reason.clone()),
            (_, None) => Some(self.missing.clone()),
            (_, Some(_)) => None,
        };
        if let Some(reason) = reason {
            return self.dropped(&plan, ask, robot, task, reason).await;
        }
        let Some(bucket) = &self.bucket else {
            return Answer::Refused {
                reason: self.missing.clone(),
                retry: false,
            };
        };
        let not_now = |error: crate::bucket::BucketError| Answer::Refused {
            reason: error.to_string(),
            retry: true,
        };
        match plan {
            Plan::Begin { key, parts } => {
                let upload_id = match bucket.start_upload(&key, &ask.sha256).await {
                    Ok(id) => id,
                    Err(error) => return not_now(error),
                };
                self.record(task, entry(&key, OutputState::Uploading, None)).await;
                sign(bucket, key, upload_id, &parts)
            }
            Plan::Sign {
                key,
                upload_id,
                parts,
            } => sign(bucket, key, upload_id, &parts),
            Plan::Complete {
                key,
                upload_id,
                etags,
            } => {
                let completed = bucket.complete(&key, &upload_id, &etags).await;
                // Completed before (its answer was lost): the object is
                // there, with this sha256.
                let whole = match completed {
                    Ok(()) => true,
                    Err(error) => match bucket.head(&key).await {
                        Ok(Some(info)) => info.sha256.as_deref() == Some(ask.sha256.as_str()),
                        _ => return not_now(error),
                    },
                };
                if !whole {
                    return Answer::Refused {
                        reason: format!("the bucket did not complete {key}"),
                        retry: true,
                    };
                }
                info!(robot, key, size = ask.size, "output uploaded");
                self.record(task, entry(&key, OutputState::Uploaded, None)).await;
                Answer::Completed { key }
            }
            // Recorded above.
            Plan::Uploaded { key } => Answer::Completed { key },
            Plan::Drop { reason, .. } => Answer::Refused {
                reason: format!("dropped: {reason}"),
                retry: false,
            },
        }
    }

    /// An output the robot gave up, or that no bucket can take: never
    /// silent, the Task lists it dropped and a Warning Event says why; its
    /// multipart upload, if one began, is aborted.
    async fn dropped(
        &self,
        plan: &Plan,
        ask: &OutputAsk,
        robot: &str,
        task: Option<Arc<Task>>,
        reason: String,
    ) -> Answer {
        warn!(robot, key = plan.key(), %reason, "an output dropped");
        let note = format!(
            "output {} of attempt {} on robot {robot} dropped: {reason}",
            ask.path, ask.attempt
        );
        if let Some(task) = &task {
            self.warn_on(task, note).await;
        }
        // Its parts would wait in the bucket for its lifecycle rule.
        if let (
            Plan::Drop {
                upload_id: Some(id),
                key,
                ..
            },
            Some(bucket),
        ) = (plan, &self.bucket)
        {
            if let Err(e) = bucket.abort(key, id).await {
                warn!(key, error = %e, "cannot abort a dropped output's upload");
            }
        }
        let listed = status_of(ask, plan.key(), OutputState::Dropped, Some(reason.clone()));
        self.record(task, listed).await;
        Answer::Refused {
            reason: format!("dropped: {reason}"),
            retry: false,
        }
    }

    /// A Warning Event about `task`, reason `OutputDropped`.
    async fn warn_on(&self, task: &Task, note: String) {
        let event = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: "OutputDropped".into(),
            note: Some(note),
            action: "Upload".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &task.object_ref(&())).await {
            warn!(error = %e, "cannot record an output's Event");
        }
    }

    /// Writes `entry` into the Task's status, re-reading it after a
    /// conflict. A write that fails is logged: the upload goes on.
    async fn record(&self, task: Option<Arc<Task>>, entry: OutputStatus) {
        let Some(mut task) = task.map(|t| (*t).clone()) else {
            return;
        };
        let ns = task.namespace().unwrap_or_default();
        let name = task.name_any();
        let api: Api<Task> = Api::namespaced(self.kube.client().clone(), &ns);
        for _ in 0..CONFLICT_TRIES {
            let listed = task
                .status
                .as_ref()
                .map(|s| s.outputs.as_slice())
                .unwrap_or_default();
            let Some(outputs) = with_output(listed, entry.clone()) else {
                return;
            };
            let status = serde_json::json!({ "outputs": outputs });
            let written = self
                .kube
                .patch_status(
                    "task_outputs",
                    &api,
                    &name,
                    task.metadata.resource_version.as_deref(),
                    &status,
                    || format!("recording output {} of task {name}", entry.path),
                )
                .await;
            match written {
                Ok(_) => return,
                Err(error) if error.is_conflict() => {
                    match self
                        .kube
                        .read(|| format!("reading task {name}"), api.get_opt(&name))
                        .await
                    {
                        Ok(Some(fresh)) if fresh.metadata.uid == task.metadata.uid => task = fresh,
                        _ => return,
                    }
                }
                Err(error) => {
                    warn!(task = %name, %error, "could not record an output in the task's status");
                    return;
                }
            }
        }
    }
}

/// URLs for `parts` of upload `upload_id` of `key`.
fn sign(bucket: &Bucket, key: String, upload_id: String, parts: &[u32]) -> Answer {
    let urls = parts
        .iter()
        .filter_map(|p| {
            let part = u16::try_from(*p).ok()?;
            Some(PartUrl {
                part: *p,
                url: bucket.part_url(&key, &upload_id, part, URL_VALID),
            })
        })
        .collect();
    Answer::Parts {
        key,
        upload_id,
        urls,
        valid_ms: u64::try_from(URL_VALID.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests;
