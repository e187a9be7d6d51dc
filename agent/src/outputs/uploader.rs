//! The uploader: a tokio task of its own that empties the spool, oldest
//! file first, one at a time. [`Upload`] decides each step; this shell
//! journals, asks the server over MQTT, and PUTs parts to the URLs it
//! gets, within the robot's upload rate. A file the robot gave up (a full
//! quota) is reported until the server has it on the Task.
//!
//! Uploads go to the bucket on connections of their own, never through
//! the MQTT connection: an upload cannot hold a heartbeat or a status
//! behind it there, and the rate keeps it from filling the link.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s4r_api::protocol::outputs::{Answer, OutputAnswer, OutputAsk, Want};
use k8s4r_api::protocol::{Topics, PROTOCOL_VERSION};
use rumqttc::AsyncClient;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::journal::{Entry, Pending};
use super::spool::{Notice, Spool};
use super::take;
use super::upload::{Do, Event, Phase, Step, Upload, ASK_AGAIN};
use crate::reach::Rate;

/// How often the uploader looks at the time.
const TICK: Duration = Duration::from_secs(1);
/// Bytes read from the file for one write to the connection.
const CHUNK: usize = 64 * 1024;
/// The slowest a part may go before it is given up (and sent again).
const MIN_PART_RATE: u64 = 16 * 1024;

/// Where the uploader sends: the server's topic, and who asks.
#[derive(Clone)]
pub struct Asking {
    pub client: AsyncClient,
    pub topics: Topics,
    pub robot_id: String,
}

/// Starts the uploader of `spool` (once; a second call does nothing).
pub fn spawn(spool: Arc<Spool>, asking: Asking, stop: CancellationToken) {
    let Some((notices, pending)) = spool.receiver() else {
        return;
    };
    let http = match crate::supervisor::artifacts::client() {
        Ok(http) => http,
        Err(e) => {
            tracing::error!(error = %e, "outputs are not uploaded");
            return;
        }
    };
    let rate = Arc::new(Rate::new(spool.config().bytes_per_second));
    let uploader = Uploader {
        spool,
        asking,
        http,
        rate,
        queue: VecDeque::new(),
        active: None,
        reports: Vec::new(),
        sending: JoinSet::new(),
        began: Instant::now(),
    };
    tokio::spawn(uploader.run(pending, notices, stop));
}

/// The file being uploaded.
struct Active {
    entry: Entry,
    upload: Upload,
}

/// A file the robot gave up, said to the server until it answers (at once,
/// not behind an upload).
struct Report {
    entry: Entry,
    reason: String,
    /// The bucket's upload, when one began: the server aborts it.
    upload_id: Option<String>,
    asked: Option<Duration>,
}

/// What became of one part.
struct Sent {
    id: u64,
    part: u32,
    result: Result<String, Failure>,
}

struct Failure {
    refused: bool,
    why: String,
    /// The upload cannot go on at all (the file changed after it was
    /// taken, the bucket no longer has the upload): given up, and said.
    lost: bool,
}

struct Uploader {
    spool: Arc<Spool>,
    asking: Asking,
    http: reqwest::Client,
    rate: Arc<Rate>,
    queue: VecDeque<Pending>,
    active: Option<Active>,
    reports: Vec<Report>,
    sending: JoinSet<Sent>,
    began: Instant,
}

impl Uploader {
    async fn run(
        mut self,
        pending: Vec<Pending>,
        mut notices: tokio::sync::mpsc::UnboundedReceiver<Notice>,
        stop: CancellationToken,
    ) {
        for p in pending {
            self.added(p);
        }
        self.report();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.active.is_none() {
                self.next();
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                notice = notices.recv() => match notice {
                    Some(notice) => self.heard(notice),
                    None => break,
                },
                Some(joined) = self.sending.join_next() => {
                    if let Ok(sent) = joined {
                        self.sent(sent);
                    }
                }
                _ = tick.tick() => self.ticked(),
            }
        }
        self.sending.abort_all();
    }

    fn now(&self) -> Duration {
        self.began.elapsed()
    }

    /// A file to upload, or (given up before its upload) to report.
    fn added(&mut self, Pending { entry, steps }: Pending) {
        // Refused when taken, or dropped for a newer file (journaled).
        let given_up = entry.refused.clone().or_else(|| {
            steps.iter().find_map(|s| match s {
                Step::Dropped { reason } => Some(reason.clone()),
                _ => None,
            })
        });
        let upload_id = begun(&steps);
        match given_up {
            Some(reason) => self.reports.push(Report {
                entry,
                reason,
                upload_id,
                asked: None,
            }),
            None => self.queue.push_back(Pending { entry, steps }),
        }
    }

    /// Takes the oldest waiting file up.
    fn next(&mut self) {
        let Some(Pending { entry, steps }) = self.queue.pop_front() else {
            return;
        };
        tracing::info!(task = %entry.task_uid, attempt = entry.attempt, path = %entry.path, size = entry.size, "output upload");
        let upload = Upload::resume(entry.size, entry.part_size, &steps);
        self.active = Some(Active { entry, upload });
        self.step(Event::Start);
    }

    fn heard(&mut self, notice: Notice) {
        match notice {
            Notice::Added(entry) => {
                self.added(Pending {
                    entry,
                    steps: Vec::new(),
                });
                self.report();
            }
            Notice::Dropped { id, reason } => {
                let dropped = if self.active.as_ref().is_some_and(|a| a.entry.id == id) {
                    self.active.take().map(|a| {
                        let upload_id = a.upload.upload_id().map(str::to_owned);
                        (a.entry, upload_id)
                    })
                } else {
                    let at = self.queue.iter().position(|p| p.entry.id == id);
                    at.and_then(|i| self.queue.remove(i)).map(|p| {
                        let upload_id = begun(&p.steps);
                        (p.entry, upload_id)
                    })
                };
                if let Some((entry, upload_id)) = dropped {
                    self.reports.push(Report {
                        entry,
                        reason,
                        upload_id,
                        asked: None,
                    });
                    self.report();
                }
            }
            Notice::Answer(answer) => self.answered(answer),
        }
    }

    fn answered(&mut self, answer: OutputAnswer) {
        let about =
            |e: &Entry| e.task_uid == answer.task_uid && e.attempt == answer.attempt && e.path == answer.path;
        if let Some(i) = self.reports.iter().position(|r| about(&r.entry)) {
            // The server has it (or never will): reported. (URLs or a
            // completion answer what was asked before the file was given
            // up.)
            if matches!(answer.answer, Answer::Refused { retry: false, .. }) {
                let report = self.reports.swap_remove(i);
                self.spool.done(report.entry.id);
            }
            return;
        }
        if self.active.as_ref().is_some_and(|a| about(&a.entry)) {
            self.step(Event::Answer(answer.answer));
        } else {
            tracing::debug!(task = %answer.task_uid, path = %answer.path, "an outputs answer for no upload under way");
        }
    }

    fn sent(&mut self, sent: Sent) {
        if self.active.as_ref().is_none_or(|a| a.entry.id != sent.id) {
            return;
        }
        let event = match sent.result {
            Ok(etag) => Event::PartSent {
                part: sent.part,
                etag,
            },
            Err(Failure { why, lost: true, .. }) => return self.give_up_active(why),
            Err(Failure { refused, why, .. }) => {
                tracing::warn!(part = sent.part, refused, error = %why, "an output's part did not get there");
                Event::PartFailed {
                    part: sent.part,
                    refused,
                }
            }
        };
        self.step(event);
    }

    /// The active upload cannot go on: journaled as dropped (a restart
    /// reports it too), reported to the server, which lists it and aborts
    /// the bucket's upload.
    fn give_up_active(&mut self, reason: String) {
        let Some(active) = self.active.take() else {
            return;
        };
        tracing::warn!(task = %active.entry.task_uid, path = %active.entry.path, %reason, "output given up");
        let _ = self.spool.step(
            active.entry.id,
            &Step::Dropped {
                reason: reason.clone(),
            },
        );
        self.reports.push(Report {
            upload_id: active.upload.upload_id().map(str::to_owned),
            entry: active.entry,
            reason,
            asked: None,
        });
        self.report();
    }

    fn ticked(&mut self) {
        self.report();
        self.step(Event::Tick);
    }

    /// Says each given-up file to the server, again if unanswered.
    fn report(&mut self) {
        let now = self.now();
        for report in &mut self.reports {
            if report.asked.is_none_or(|at| now >= at + ASK_AGAIN) {
                report.asked = Some(now);
                let want = Want::Dropped {
                    upload_id: report.upload_id.clone(),
                    reason: report.reason.clone(),
                };
                publish(&self.asking, ask_of(&self.asking, &report.entry, want));
            }
        }
    }

    /// Steps the active upload with `event` and does what it says.
    fn step(&mut self, event: Event) {
        let now = self.now();
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let upload = &mut active.upload;
        // A journal that resumed to an end: nothing more to do.
        let ended = match upload.phase() {
            Phase::Done { key } => Some(Ok(key.clone())),
            Phase::Dropped { reason } => Some(Err(reason.clone())),
            _ => None,
        };
        let actions = if ended.is_some() {
            Vec::new()
        } else {
            upload.step(event, now)
        };
        let entry = active.entry.clone();
        for action in actions {
            match action {
                // Not recorded (the disk refused it, and said so in the
                // log): the upload goes on; after a crash it would only
                // send that part again, or begin a new upload.
                Do::Journal(step) => {
                    let _ = self.spool.step(entry.id, &step);
                }
                Do::Ask(want) => publish(&self.asking, ask_of(&self.asking, &entry, want)),
                Do::Send {
                    part,
                    url,
                    offset,
                    len,
                } => {
                    let (http, rate) = (self.http.clone(), self.rate.clone());
                    let file = self.spool.file(entry.id);
                    let (id, size) = (entry.id, entry.size);
                    self.sending.spawn(async move {
                        let result = put_part(&http, &rate, (&file, size), &url, offset, len).await;
                        Sent { id, part, result }
                    });
                }
                Do::Finished { key } => return self.finished(&entry, Ok(key)),
                Do::GaveUp { reason } => return self.finished(&entry, Err(reason)),
            }
        }
        if let Some(end) = ended {
            self.finished(&entry, end);
        }
    }

    fn finished(&mut self, entry: &Entry, end: Result<String, String>) {
        match end {
            Ok(key) => {
                tracing::info!(task = %entry.task_uid, attempt = entry.attempt, path = %entry.path, key, "output uploaded");
                if entry.delete_after {
                    let inside = take::inside(entry.within.as_deref(), &entry.path);
                    take::remove_original(&entry.work_dir, &inside, &self.spool.file(entry.id), entry.size);
                }
            }
            Err(reason) => {
                tracing::warn!(task = %entry.task_uid, attempt = entry.attempt, path = %entry.path, %reason, "output not uploaded")
            }
        }
        self.active = None;
        self.spool.done(entry.id);
    }
}

/// The bucket's upload the journal's steps say began.
fn begun(steps: &[Step]) -> Option<String> {
    steps.iter().find_map(|s| match s {
        Step::Begun { upload_id, .. } => Some(upload_id.clone()),
        _ => None,
    })
}

fn ask_of(asking: &Asking, entry: &Entry, want: Want) -> OutputAsk {
    OutputAsk {
        v: PROTOCOL_VERSION,
        robot_id: asking.robot_id.clone(),
        task_uid: entry.task_uid.clone(),
        attempt: entry.attempt,
        path: entry.path.clone(),
        size: entry.size,
        sha256: entry.sha256.clone(),
        part_size: entry.part_size,
        want,
    }
}

/// Sends `ask` at QoS 0: one that does not get there is asked again after
/// [`ASK_AGAIN`]. (QoS 1 is the session's: its packet ids are matched to
/// what its outbox handed over, in order.)
fn publish(asking: &Asking, ask: OutputAsk) {
    let topic = asking.topics.output_ask(&asking.robot_id);
    let payload = k8s4r_api::protocol::encode(&ask);
    if let Err(e) = asking
        .client
        .try_publish(topic, rumqttc::QoS::AtMostOnce, false, payload)
    {
        tracing::debug!(error = %e, "an outputs ask not sent now; asked again later");
    }
}

/// PUTs bytes `offset..offset + len` of `file` to `url`, read a chunk at
/// a time within `rate`; the part's ETag.
async fn put_part(
    http: &reqwest::Client,
    rate: &Arc<Rate>,
    (file, size): (&std::path::Path, u64),
    url: &str,
    offset: u64,
    len: u64,
) -> Result<String, Failure> {
    let failed = |why: String| Failure {
        refused: false,
        why,
        lost: false,
    };
    let mut f = tokio::fs::File::open(file)
        .await
        .map_err(|e| failed(format!("cannot open the spooled file: {e}")))?;
    // The spool holds the task's own inode: a task still running (or
    // another name of it) may have changed it since it was read.
    let now = f.metadata().await.map_err(|e| failed(e.to_string()))?.len();
    if now != size {
        return Err(Failure {
            refused: false,
            why: format!("the file changed after it was taken ({now} bytes, {size} when read)"),
            lost: true,
        });
    }
    f.seek(std::io::SeekFrom::Start(offset))
        .await
        .map_err(|e| failed(e.to_string()))?;
    let floor = part_timeout(len, rate.per_second());
    let rate = rate.clone();
    let body = futures::stream::unfold((f, len), move |(mut f, left)| {
        let rate = rate.clone();
        async move {
            if left == 0 {
                return None;
            }
            let mut buf = vec![0u8; left.min(CHUNK as u64) as usize];
            let read = match f.read_exact(&mut buf).await {
                Ok(_) => Ok(buf),
                Err(e) => Err(e),
            };
            let n = read.as_ref().map_or(0, |b: &Vec<u8>| b.len() as u64);
            rate.spend(n as usize).await;
            let left = if read.is_ok() { left - n } else { 0 };
            Some((read, (f, left)))
        }
    });
    let response = http
        .put(url)
        .header(reqwest::header::CONTENT_LENGTH, len)
        .body(reqwest::Body::wrap_stream(body.boxed()))
        .timeout(floor)
        .send()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        // 403: the URL expired or is not valid; asked for again. 404: the
        // bucket no longer has the upload (aborted by a lifecycle rule
        // while the robot was away): it cannot be finished.
        return Err(Failure {
            refused: status == reqwest::StatusCode::FORBIDDEN,
            why: format!("the bucket answered {status}"),
            lost: status == reqwest::StatusCode::NOT_FOUND,
        });
    }
    response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| failed("the bucket's answer has no ETag".into()))
}

/// How long a part of `len` bytes may take: at [`MIN_PART_RATE`] (or the
/// robot's rate, when lower), plus a minute.
fn part_timeout(len: u64, per_second: u64) -> Duration {
    let slowest = match per_second {
        0 => MIN_PART_RATE,
        rate => rate.min(MIN_PART_RATE),
    };
    Duration::from_secs(60 + len / slowest)
}
