//! Task outputs on the wire: a robot asks the server for what it needs to
//! upload a file (presigned URLs for some of its parts, the completion of
//! the upload), and the server answers. The robot never holds the
//! bucket's credentials: each URL lets it send one part of one object for
//! a short while.
//!
//! An upload is identified by (task uid, attempt, path): the server keeps
//! nothing between messages that the robot's journal does not also hold,
//! so either side may restart between any two of them.

use serde::{Deserialize, Serialize};

use super::{bound, version, Message, ProtocolError};

/// URLs asked or given in one message.
pub const MAX_PARTS_PER_MESSAGE: usize = 16;
/// The most parts an upload may have (S3's limit).
pub const MAX_PARTS: u32 = 10_000;
/// Longest path of an output (relative to the task's working directory).
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest reason (it is written into the Task's status).
pub const MAX_REASON_BYTES: usize = 1024;
/// Longest presigned URL.
pub const MAX_URL_BYTES: usize = 4096;
/// Longest part ETag (S3's are a quoted MD5).
pub const MAX_ETAG_BYTES: usize = 128;

/// `outputs/ask`, robot to server: what an upload needs next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputAsk {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    pub robot_id: String,
    pub task_uid: String,
    pub attempt: u32,
    /// The file, relative to the task's working directory.
    pub path: String,
    /// Its size and sha256 (hex), read before its upload began.
    pub size: u64,
    pub sha256: String,
    /// The size of every part but the last.
    pub part_size: u64,
    pub want: Want,
}

/// What a robot asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Want {
    /// URLs for these parts (numbered from 1) of upload `upload_id`, or
    /// of a new upload when there is none yet.
    Parts {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upload_id: Option<String>,
        parts: Vec<u32>,
    },
    /// Every part is sent: complete the upload from their ETags, in order.
    Complete { upload_id: String, etags: Vec<String> },
    /// The robot gives the output up (its quota is full, the file went
    /// away), and says why.
    Dropped {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upload_id: Option<String>,
        reason: String,
    },
}

impl Message for OutputAsk {
    const KIND: &'static str = "output ask";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        bound(Self::KIND, "path", self.path.len(), MAX_PATH_BYTES)?;
        match &self.want {
            Want::Parts { parts, .. } => bound(Self::KIND, "parts", parts.len(), MAX_PARTS_PER_MESSAGE),
            Want::Complete { etags, .. } => {
                bound(Self::KIND, "etags", etags.len(), MAX_PARTS as usize)?;
                let longest = etags.iter().map(String::len).max().unwrap_or(0);
                bound(Self::KIND, "etag", longest, MAX_ETAG_BYTES)
            }
            Want::Dropped { reason, .. } => bound(Self::KIND, "reason", reason.len(), MAX_REASON_BYTES),
        }
    }
}

/// `outputs/answer`, server to robot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputAnswer {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    pub task_uid: String,
    pub attempt: u32,
    pub path: String,
    pub answer: Answer,
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// URLs for parts of upload `upload_id` of object `key`, each valid
    /// for `valid_ms` from when the server signed it.
    Parts {
        key: String,
        upload_id: String,
        urls: Vec<PartUrl>,
        valid_ms: u64,
    },
    /// The object is whole in the bucket.
    Completed { key: String },
    /// Not now (`retry`: the bucket is away, ask again later) or never.
    Refused { reason: String, retry: bool },
}

/// Where to send one part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartUrl {
    pub part: u32,
    pub url: String,
}

impl Message for OutputAnswer {
    const KIND: &'static str = "output answer";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        bound(Self::KIND, "path", self.path.len(), MAX_PATH_BYTES)?;
        match &self.answer {
            Answer::Parts { urls, .. } => {
                bound(Self::KIND, "urls", urls.len(), MAX_PARTS_PER_MESSAGE)?;
                let longest = urls.iter().map(|u| u.url.len()).max().unwrap_or(0);
                bound(Self::KIND, "url", longest, MAX_URL_BYTES)
            }
            Answer::Completed { .. } => Ok(()),
            Answer::Refused { reason, .. } => bound(Self::KIND, "reason", reason.len(), MAX_REASON_BYTES),
        }
    }
}

/// The part size of a file of `size` bytes: `preferred`, or larger when
/// the file would need more than [`MAX_PARTS`] of it (rounded up to MiB).
pub fn part_size(size: u64, preferred: u64) -> u64 {
    const MIB: u64 = 1024 * 1024;
    let needed = size.div_ceil(u64::from(MAX_PARTS)).div_ceil(MIB) * MIB;
    preferred.max(needed).max(1)
}

/// How many parts a file of `size` has at `part_size` (one, empty, for an
/// empty file).
pub fn parts_of(size: u64, part_size: u64) -> u32 {
    u32::try_from(size.div_ceil(part_size.max(1)).max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{decode, encode};

    #[test]
    fn parts_stay_within_s3s_limit() {
        let mib = 1024 * 1024;
        assert_eq!(part_size(200 * mib, 8 * mib), 8 * mib);
        assert_eq!(parts_of(200 * mib, 8 * mib), 25);
        assert_eq!(parts_of(200 * mib + 1, 8 * mib), 26);
        assert_eq!(parts_of(0, 8 * mib), 1);
        // 1 TB at 8 MiB would be 119,210 parts: the part grows.
        let huge = 1_000_000_000_000;
        let size = part_size(huge, 8 * mib);
        assert!(parts_of(huge, size) <= MAX_PARTS);
        assert_eq!(size % mib, 0);
    }

    #[test]
    fn asks_and_answers_round_trip_and_are_bounded() {
        let ask = OutputAsk {
            v: 1,
            robot_id: "rb1".into(),
            task_uid: "u".into(),
            attempt: 1,
            path: "out/run.bag".into(),
            size: 10,
            sha256: "ab".into(),
            part_size: 8,
            want: Want::Parts {
                upload_id: None,
                parts: vec![1, 2],
            },
        };
        let bytes = encode(&ask);
        assert_eq!(decode::<OutputAsk>(&bytes).unwrap(), ask);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains(r#""want":{"parts":{"parts":[1,2]}}"#), "{text}");
        let flood = OutputAsk {
            want: Want::Parts {
                upload_id: None,
                parts: (1..=100).collect(),
            },
            ..ask
        };
        assert!(decode::<OutputAsk>(&encode(&flood)).is_err());
        let answer = OutputAnswer {
            v: 1,
            task_uid: "u".into(),
            attempt: 1,
            path: "out/run.bag".into(),
            answer: Answer::Refused {
                reason: "x".repeat(MAX_REASON_BYTES + 1),
                retry: true,
            },
        };
        assert!(decode::<OutputAnswer>(&encode(&answer)).is_err());
    }
}
