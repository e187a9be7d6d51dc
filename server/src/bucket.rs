//! The bucket task outputs go to, as the server alone reaches it: the
//! credentials stay here; a robot gets a presigned URL for each part it
//! sends, valid for a short while and for one object only (SigV4 query
//! signing, by `rusty-s3`). The calls that need the credentials (starting
//! a multipart upload, completing it, reading what an object holds) are
//! made here.
//!
//! Every object carries its sha256 as user metadata (`x-amz-meta-sha256`),
//! set when its upload starts: S3 itself cannot check a whole-object
//! sha256 of a multipart upload, so the reader can.

use std::time::Duration;

use rusty_s3::actions::{CompleteMultipartUpload, CreateMultipartUpload, S3Action as _};
use rusty_s3::{Bucket as S3Bucket, Credentials, UrlStyle};

/// The metadata key of an object's sha256 (hex).
pub const SHA256_META: &str = "x-amz-meta-sha256";
/// How long a call to the bucket may take before it is given up.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server's own signed calls are valid (they are made at once).
const OWN_CALL: Duration = Duration::from_secs(60);

/// What goes wrong with the bucket, said for an operator.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    #[error("the bucket's endpoint {0:?} is not a URL: {1}")]
    Endpoint(String, String),
    #[error("the bucket {bucket} could not be reached to {what}: {error}")]
    Unreachable {
        bucket: String,
        what: &'static str,
        error: String,
    },
    #[error("the bucket {bucket} refused to {what}: HTTP {status}: {body}")]
    Refused {
        bucket: String,
        what: &'static str,
        status: u16,
        body: String,
    },
    #[error("the bucket {bucket} answered {what} with what is not S3's answer: {error}")]
    Answer {
        bucket: String,
        what: &'static str,
        error: String,
    },
}

/// Where the bucket is and the key to it (its Debug hides the secret).
#[derive(Clone, PartialEq, Eq)]
pub struct BucketConfig {
    /// `http(s)://host[:port]`: path-style requests go to it.
    pub endpoint: String,
    pub bucket: String,
    /// The region signatures name (`us-east-1` for most S3-compatible stores).
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for BucketConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketConfig")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// An object as the bucket holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    /// The sha256 its upload declared (hex), if it has one.
    pub sha256: Option<String>,
}

/// The bucket, with its key and an HTTP client.
#[derive(Clone)]
pub struct Bucket {
    bucket: S3Bucket,
    credentials: Credentials,
    http: reqwest::Client,
    name: String,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Bucket {
    pub fn new(config: &BucketConfig) -> Result<Bucket, BucketError> {
        let endpoint = config
            .endpoint
            .parse()
            .map_err(|e: url::ParseError| BucketError::Endpoint(config.endpoint.clone(), e.to_string()))?;
        let bucket = S3Bucket::new(
            endpoint,
            UrlStyle::Path,
            config.bucket.clone(),
            config.region.clone(),
        )
        .map_err(|e| BucketError::Endpoint(config.endpoint.clone(), e.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| BucketError::Endpoint(config.endpoint.clone(), e.to_string()))?;
        Ok(Bucket {
            bucket,
            credentials: Credentials::new(config.access_key.clone(), config.secret_key.clone()),
            http,
            name: config.bucket.clone(),
        })
    }

    /// Starts a multipart upload of `key`, declaring its sha256; its
    /// upload id.
    pub async fn start_upload(&self, key: &str, sha256: &str) -> Result<String, BucketError> {
        let mut action = CreateMultipartUpload::new(&self.bucket, Some(&self.credentials), key);
        action.headers_mut().insert(SHA256_META, sha256.to_owned());
        let url = action.sign(OWN_CALL);
        let request = self.http.post(url).header(SHA256_META, sha256);
        let body = self.call(request, "start an upload").await?;
        let parsed =
            CreateMultipartUpload::parse_response(&body).map_err(|e| self.answer("start an upload", e))?;
        Ok(parsed.upload_id().to_owned())
    }

    /// A URL that lets its holder send part `part` (from 1) of upload
    /// `upload_id` of `key`, and nothing else, for `valid`.
    pub fn part_url(&self, key: &str, upload_id: &str, part: u16, valid: Duration) -> String {
        self.bucket
            .upload_part(Some(&self.credentials), key, part, upload_id)
            .sign(valid)
            .to_string()
    }

    /// Completes upload `upload_id` of `key` from its parts' ETags, in
    /// part order.
    pub async fn complete(&self, key: &str, upload_id: &str, etags: &[String]) -> Result<(), BucketError> {
        let action = CompleteMultipartUpload::new(
            &self.bucket,
            Some(&self.credentials),
            key,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(OWN_CALL);
        let request = self.http.post(url).body(action.body());
        let body = self.call(request, "complete an upload").await?;
        // S3 may answer 200 with an error in the body.
        if body.contains("<Error>") {
            return Err(BucketError::Refused {
                bucket: self.name.clone(),
                what: "complete an upload",
                status: 200,
                body: short(&body),
            });
        }
        Ok(())
    }

    /// Gives up upload `upload_id` of `key`: its parts are removed.
    pub async fn abort(&self, key: &str, upload_id: &str) -> Result<(), BucketError> {
        let url = self
            .bucket
            .abort_multipart_upload(Some(&self.credentials), key, upload_id)
            .sign(OWN_CALL);
        self.call(self.http.delete(url), "abort an upload")
            .await
            .map(drop)
    }

    /// What the bucket holds at `key`; None when nothing.
    pub async fn head(&self, key: &str) -> Result<Option<ObjectInfo>, BucketError> {
        let url = self
            .bucket
            .head_object(Some(&self.credentials), key)
            .sign(OWN_CALL);
        let response = self
            .http
            .head(url)
            .send()
            .await
            .map_err(|e| self.unreachable("read an object", &e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(BucketError::Refused {
                bucket: self.name.clone(),
                what: "read an object",
                status: response.status().as_u16(),
                body: String::new(),
            });
        }
        let headers = response.headers();
        let size = headers
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let sha256 = headers
            .get(SHA256_META)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(Some(ObjectInfo { size, sha256 }))
    }

    /// A URL that reads `key`, for `valid`.
    pub fn download_url(&self, key: &str, valid: Duration) -> String {
        self.bucket
            .get_object(Some(&self.credentials), key)
            .sign(valid)
            .to_string()
    }

    /// Sends `request`; the body of a 2xx answer.
    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        what: &'static str,
    ) -> Result<String, BucketError> {
        let response = request.send().await.map_err(|e| self.unreachable(what, &e))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| self.unreachable(what, &e))?;
        if !status.is_success() {
            return Err(BucketError::Refused {
                bucket: self.name.clone(),
                what,
                status: status.as_u16(),
                body: short(&body),
            });
        }
        Ok(body)
    }

    fn unreachable(&self, what: &'static str, error: &reqwest::Error) -> BucketError {
        BucketError::Unreachable {
            bucket: self.name.clone(),
            what,
            error: error.to_string(),
        }
    }

    fn answer(&self, what: &'static str, error: impl std::fmt::Display) -> BucketError {
        BucketError::Answer {
            bucket: self.name.clone(),
            what,
            error: error.to_string(),
        }
    }
}

/// At most 300 characters of an answer, for a message.
fn short(body: &str) -> String {
    body.chars().take(300).collect()
}
