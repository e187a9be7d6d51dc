//! One output's upload, decided without I/O: [`Upload::step`] takes what
//! happened (the server's answer, a part sent or failed, the time passing)
//! and the time, and returns what to do, in order: journal a step, ask the
//! server, send a part. A thin shell does it. A shell that journals before
//! it does what follows a [`Do::Journal`] loses, on any crash, at most the
//! part that was on its way: [`Upload::resume`] starts again from the
//! journal, and parts the bucket confirmed are never sent again.
//!
//! One part is on its way at a time; URLs are asked for a few parts
//! ahead, and a URL near its end is not used (asked again instead).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s4r_api::protocol::outputs::{parts_of, Answer, Want};

/// URLs asked for in one ask.
pub const PARTS_AHEAD: usize = 8;
/// An ask without an answer is made again after this.
pub const ASK_AGAIN: Duration = Duration::from_secs(15);
/// A URL this close to its end is not used: a part may take that long.
pub const URL_MARGIN: Duration = Duration::from_secs(30);
/// The first wait after a failure; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Begin (or, after [`Upload::resume`], go on).
    Start,
    /// Time passed.
    Tick,
    /// The server answered.
    Answer(Answer),
    /// The bucket took a part.
    PartSent { part: u32, etag: String },
    /// A part did not get there; `refused`: the bucket refused its URL
    /// (expired, or not valid), which is asked for again.
    PartFailed { part: u32, refused: bool },
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Do {
    /// Record this step in the journal before doing what follows.
    Journal(Step),
    /// Ask the server.
    Ask(Want),
    /// Send bytes `offset..offset + len` of the file as `part` to `url`.
    Send {
        part: u32,
        url: String,
        offset: u64,
        len: u64,
    },
    /// The object is whole in the bucket.
    Finished { key: String },
    /// The upload is given up, for `reason`.
    GaveUp { reason: String },
}

/// A step of an upload the journal keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "step")]
pub enum Step {
    /// The bucket began upload `upload_id` of `key`.
    Begun { upload_id: String, key: String },
    /// The bucket took `part`.
    PartSent { part: u32, etag: String },
    /// The object is whole.
    Completed { key: String },
    /// Given up.
    Dropped { reason: String },
}

/// Where an upload stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Parts are being sent.
    Sending,
    /// Every part is sent; the server is asked to complete the object.
    Completing,
    /// The object is whole.
    Done { key: String },
    /// Given up.
    Dropped { reason: String },
}

/// One file's upload.
#[derive(Debug, Clone)]
pub struct Upload {
    size: u64,
    part_size: u64,
    upload_id: Option<String>,
    key: Option<String>,
    /// ETags of the parts the bucket took.
    sent: BTreeMap<u32, String>,
    /// URLs given, each with when it stops being used.
    urls: BTreeMap<u32, (String, Duration)>,
    on_the_way: Option<u32>,
    /// When the ask that has not been answered went out.
    asked: Option<Duration>,
    /// Nothing is tried before this (after a failure).
    wait_until: Option<Duration>,
    failures: u32,
    phase: Phase,
}

impl Upload {
    /// A new upload of a file of `size` bytes in parts of `part_size`.
    pub fn new(size: u64, part_size: u64) -> Upload {
        Upload {
            size,
            part_size: part_size.max(1),
            upload_id: None,
            key: None,
            sent: BTreeMap::new(),
            urls: BTreeMap::new(),
            on_the_way: None,
            asked: None,
            wait_until: None,
            failures: 0,
            phase: Phase::Sending,
        }
    }

    /// The upload as its journal left it: `steps` in the order written.
    pub fn resume(size: u64, part_size: u64, steps: &[Step]) -> Upload {
        let mut upload = Upload::new(size, part_size);
        for step in steps {
            match step {
                Step::Begun { upload_id, key } => {
                    upload.upload_id = Some(upload_id.clone());
                    upload.key = Some(key.clone());
                }
                Step::PartSent { part, etag } => {
                    upload.sent.insert(*part, etag.clone());
                }
                Step::Completed { key } => upload.phase = Phase::Done { key: key.clone() },
                Step::Dropped { reason } => {
                    upload.phase = Phase::Dropped {
                        reason: reason.clone(),
                    }
                }
            }
        }
        upload
    }

    /// The bucket's upload, once begun.
    pub fn upload_id(&self) -> Option<&str> {
        self.upload_id.as_deref()
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Bytes the bucket has confirmed.
    pub fn confirmed_bytes(&self) -> u64 {
        self.sent.keys().map(|p| self.len_of(*p)).sum()
    }

    /// What to do after `event` at `now`.
    pub fn step(&mut self, event: Event, now: Duration) -> Vec<Do> {
        if matches!(self.phase, Phase::Done { .. } | Phase::Dropped { .. }) {
            return Vec::new();
        }
        let mut out = Vec::new();
        match event {
            Event::Start => {}
            Event::Tick => {
                if self.asked.is_some_and(|at| now >= at + ASK_AGAIN) {
                    self.asked = None;
                }
                if self.wait_until.is_some_and(|t| now >= t) {
                    self.wait_until = None;
                }
            }
            Event::Answer(answer) => {
                if !self.answered(answer, now, &mut out) {
                    return out;
                }
            }
            Event::PartSent { part, etag } => {
                if self.on_the_way == Some(part) {
                    self.on_the_way = None;
                }
                self.urls.remove(&part);
                self.failures = 0;
                if self.sent.insert(part, etag.clone()).is_none() {
                    out.push(Do::Journal(Step::PartSent { part, etag }));
                }
            }
            Event::PartFailed { part, refused } => {
                if self.on_the_way == Some(part) {
                    self.on_the_way = None;
                }
                if refused {
                    self.urls.remove(&part);
                }
                self.back_off(now);
            }
        }
        self.next(now, &mut out);
        out
    }

    /// Takes the server's answer; false when it ends the upload.
    fn answered(&mut self, answer: Answer, now: Duration, out: &mut Vec<Do>) -> bool {
        match answer {
            Answer::Parts {
                key,
                upload_id,
                urls,
                valid_ms,
            } => {
                match &self.upload_id {
                    // An answer about another upload (a stale one, from
                    // before a restart): not this one's URLs.
                    Some(known) if *known != upload_id => return true,
                    Some(_) => {}
                    None => {
                        out.push(Do::Journal(Step::Begun {
                            upload_id: upload_id.clone(),
                            key: key.clone(),
                        }));
                        self.upload_id = Some(upload_id);
                        self.key = Some(key);
                    }
                }
                self.asked = None;
                let until = now + Duration::from_millis(valid_ms);
                let parts = self.parts();
                for u in urls {
                    if (1..=parts).contains(&u.part) && !self.sent.contains_key(&u.part) {
                        self.urls.insert(u.part, (u.url, until));
                    }
                }
                true
            }
            Answer::Completed { key } => {
                out.push(Do::Journal(Step::Completed { key: key.clone() }));
                out.push(Do::Finished { key: key.clone() });
                self.phase = Phase::Done { key };
                false
            }
            Answer::Refused { retry: true, .. } => {
                self.asked = None;
                self.back_off(now);
                true
            }
            Answer::Refused { reason, retry: false } => {
                out.push(Do::Journal(Step::Dropped {
                    reason: reason.clone(),
                }));
                out.push(Do::GaveUp {
                    reason: reason.clone(),
                });
                self.phase = Phase::Dropped { reason };
                false
            }
        }
    }

    /// The next thing to do, if nothing is on its way.
    fn next(&mut self, now: Duration, out: &mut Vec<Do>) {
        if self.on_the_way.is_some() || self.wait_until.is_some() {
            return;
        }
        self.urls.retain(|_, (_, until)| now + URL_MARGIN < *until);
        let missing: Vec<u32> = (1..=self.parts())
            .filter(|p| !self.sent.contains_key(p))
            .collect();
        if missing.is_empty() {
            self.phase = Phase::Completing;
            if self.asked.is_none() {
                if let Some(upload_id) = self.upload_id.clone() {
                    self.asked = Some(now);
                    out.push(Do::Ask(Want::Complete {
                        upload_id,
                        etags: self.sent.values().cloned().collect(),
                    }));
                }
            }
            return;
        }
        if let Some((part, url)) = missing
            .iter()
            .find_map(|p| self.urls.get(p).map(|(url, _)| (*p, url.clone())))
        {
            self.on_the_way = Some(part);
            out.push(Do::Send {
                part,
                url,
                offset: u64::from(part - 1) * self.part_size,
                len: self.len_of(part),
            });
            return;
        }
        if self.asked.is_none() {
            self.asked = Some(now);
            out.push(Do::Ask(Want::Parts {
                upload_id: self.upload_id.clone(),
                parts: missing.into_iter().take(PARTS_AHEAD).collect(),
            }));
        }
    }

    fn back_off(&mut self, now: Duration) {
        let doubled = FIRST_BACKOFF.saturating_mul(1 << self.failures.min(16));
        self.wait_until = Some(now + doubled.min(MAX_BACKOFF));
        self.failures = self.failures.saturating_add(1);
    }

    fn parts(&self) -> u32 {
        parts_of(self.size, self.part_size)
    }

    /// The length of `part` (the last may be short; an empty file's one
    /// part is empty).
    fn len_of(&self, part: u32) -> u64 {
        let offset = u64::from(part - 1) * self.part_size;
        self.size.saturating_sub(offset).min(self.part_size)
    }
}

#[cfg(test)]
mod tests;
