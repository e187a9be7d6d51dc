//! Downloading a task's artifacts before it starts: into the task
//! directory, with a size cap, a timeout per attempt, retries with backoff
//! for transient failures, and the sha256 checked before the file appears
//! under its name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s4r_api::Artifact;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// First retry delay; doubled each time, capped at [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Download limits, from the supervisor's config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_bytes: u64,
    pub timeout: Duration,
    pub retries: u32,
}

/// Why one attempt failed; `retry` for what may pass next time.
#[derive(Debug)]
struct Failure {
    retry: bool,
    message: String,
}

impl Failure {
    fn permanent(message: String) -> Self {
        Failure {
            retry: false,
            message,
        }
    }

    fn transient(message: String) -> Self {
        Failure { retry: true, message }
    }
}

/// A client for artifacts. rustls needs a crypto provider; the process may
/// have installed one already, which is fine.
pub(crate) fn client() -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// Fetches every artifact; the error names the artifact and says why.
pub(crate) async fn fetch_all(
    client: reqwest::Client,
    artifacts: Vec<Artifact>,
    task_dir: PathBuf,
    owner: Option<(u32, u32)>,
    limits: Limits,
) -> Result<(), String> {
    for (i, artifact) in artifacts.iter().enumerate() {
        let dest = task_dir.join(&artifact.destination);
        fetch_with_retries(&client, artifact, &dest, owner, limits)
            .await
            .map_err(|e| format!("artifact {i} ({}): {e}", artifact.url))?;
        if let Some((uid, gid)) = owner {
            // Directories created for the artifact belong to the task too.
            for dir in dest.ancestors().skip(1).take_while(|d| *d != task_dir) {
                std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                    .map_err(|e| format!("artifact {i}: cannot chown {}: {e}", dir.display()))?;
            }
        }
    }
    Ok(())
}

async fn fetch_with_retries(
    client: &reqwest::Client,
    artifact: &Artifact,
    dest: &Path,
    owner: Option<(u32, u32)>,
    limits: Limits,
) -> Result<(), String> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        let result =
            match tokio::time::timeout(limits.timeout, fetch_once(client, artifact, dest, owner, limits))
                .await
            {
                Ok(result) => result,
                Err(_) => Err(Failure::transient(format!(
                    "timed out after {}",
                    k8s4r_api::duration::format_duration(limits.timeout)
                ))),
            };
        let failure = match result {
            Ok(()) => return Ok(()),
            Err(failure) => failure,
        };
        let _ = tokio::fs::remove_file(partial(dest)).await;
        if !failure.retry || attempt >= limits.retries {
            let tries = attempt + 1;
            return Err(if tries > 1 {
                format!("{} (after {tries} attempts)", failure.message)
            } else {
                failure.message
            });
        }
        attempt += 1;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn partial(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

async fn fetch_once(
    client: &reqwest::Client,
    artifact: &Artifact,
    dest: &Path,
    owner: Option<(u32, u32)>,
    limits: Limits,
) -> Result<(), Failure> {
    let mut response = client
        .get(&artifact.url)
        .send()
        .await
        .map_err(|e| Failure::transient(format!("request failed: {e}")))?;
    let status = response.status();
    if status.is_server_error() {
        return Err(Failure::transient(format!("server answered {status}")));
    }
    if !status.is_success() {
        return Err(Failure::permanent(format!("server answered {status}")));
    }
    let too_big = |size: u64| {
        Failure::permanent(format!(
            "larger than the cap of {} bytes ({size} bytes or more)",
            limits.max_bytes
        ))
    };
    if let Some(length) = response.content_length() {
        if length > limits.max_bytes {
            return Err(too_big(length));
        }
    }
    let io_error =
        |what: &str, e: std::io::Error| Failure::permanent(format!("cannot {what} {}: {e}", dest.display()));
    if let Some(parent) = dest.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| io_error("create the directory of", e))?;
    }
    let tmp = partial(dest);
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .map_err(|e| io_error("create", e))?;
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Failure::transient(format!("download interrupted: {e}")))?
    {
        size += chunk.len() as u64;
        if size > limits.max_bytes {
            return Err(too_big(size));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(|e| io_error("write", e))?;
    }
    file.flush().await.map_err(|e| io_error("write", e))?;
    drop(file);
    let digest = hex(&hasher.finalize());
    if !digest.eq_ignore_ascii_case(&artifact.sha256) {
        return Err(Failure::permanent(format!(
            "sha256 mismatch: expected {}, got {digest}",
            artifact.sha256.to_ascii_lowercase()
        )));
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&tmp, Some(uid), Some(gid)).map_err(|e| io_error("chown", e))?;
    }
    tokio::fs::rename(&tmp, dest)
        .await
        .map_err(|e| io_error("rename into", e))?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
