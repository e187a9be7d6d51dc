//! Downloading a task's artifacts before it starts, with a size cap, a
//! timeout per attempt, retries with backoff for transient failures, and
//! the sha256 checked before the file appears under its name.
//!
//! The agent downloads as root, and the task's directory belongs to the
//! task's user: a process of that user could plant a symbolic link there
//! (`x.partial -> /etc/shadow`) and have root write through it. So the
//! download goes into a directory only root can write (`fetch/`, beside
//! the task's `work/`), and is then handed over without following any
//! link: every directory on the way down is opened with `O_NOFOLLOW`
//! relative to its parent (`openat`), created ones are given to the task's
//! user by descriptor (`fchown`), and the file is renamed into place
//! (`renameat`, which replaces a link at the last component rather than
//! following it).

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use k8s4r_api::Artifact;
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, mkdirat, Mode};
use nix::unistd::{fchown, Gid, Uid};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// First retry delay; doubled each time, capped at [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Download limits, from the supervisor's config.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
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
pub fn client() -> Result<reqwest::Client, String> {
    k8s4r_mqtt::install_crypto_provider();
    reqwest::Client::builder()
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// Where one task's artifacts go.
#[derive(Clone, Debug)]
pub(crate) struct Places {
    /// Only root can write here; downloads land here first.
    pub fetch_dir: PathBuf,
    /// The task's own directory, where they end up.
    pub work_dir: PathBuf,
    /// The task's user and group, who get the files.
    pub owner: Option<(u32, u32)>,
}

/// Fetches every artifact and hands each to the task; the error names the
/// artifact and says why.
pub(crate) async fn fetch_all(
    client: reqwest::Client,
    artifacts: Vec<Artifact>,
    places: Places,
    limits: Limits,
) -> Result<(), String> {
    for (i, artifact) in artifacts.iter().enumerate() {
        // A task started again from the journal kept its directory, and may
        // start with no network: what is there already is not fetched again.
        let (work_dir, wanted) = (places.work_dir.clone(), artifact.clone());
        if tokio::task::spawn_blocking(move || in_place(&work_dir, &wanted, limits.max_bytes))
            .await
            .unwrap_or(false)
        {
            continue;
        }
        let download = places.fetch_dir.join(format!("{i}.partial"));
        fetch_with_retries(&client, artifact, &download, limits)
            .await
            .map_err(|e| format!("artifact {i} ({}): {e}", artifact.url))?;
        let places = places.clone();
        let destination = artifact.destination.clone();
        let name = format!("{i}.partial");
        tokio::task::spawn_blocking(move || hand_over(&places, &name, &destination, ARTIFACT_MODE))
            .await
            .map_err(|e| format!("artifact {i}: {e}"))?
            .map_err(|e| format!("artifact {i} ({}): {e}", artifact.destination))?;
    }
    Ok(())
}

/// Executable: an artifact is often the program the task runs.
const ARTIFACT_MODE: u32 = 0o755;

/// Moves `fetch_dir/name` to `work_dir/destination` with `mode`, creating
/// the directories on the way, following no symbolic link. Blocking.
pub(crate) fn hand_over(places: &Places, name: &str, destination: &str, mode: u32) -> Result<(), String> {
    let owner = places.owner.map(|(u, g)| (Uid::from_raw(u), Gid::from_raw(g)));
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let open_dir = |path: &Path| {
        openat(AT_FDCWD, path, dir_flags, Mode::empty())
            .map_err(|e| format!("cannot open {}: {e}", path.display()))
    };
    let fetch = open_dir(&places.fetch_dir)?;
    let file = openat(
        &fetch,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the download: {e}"))?;
    if let Some((uid, gid)) = owner {
        fchown(&file, Some(uid), Some(gid)).map_err(|e| format!("cannot give the file to the task: {e}"))?;
    }
    fchmod(&file, Mode::from_bits_truncate(mode)).map_err(|e| format!("cannot set the file's mode: {e}"))?;
    let path = Path::new(destination);
    let Some(file_name) = path.file_name() else {
        return Err("names no file".to_owned());
    };
    let mut dir: OwnedFd = open_dir(&places.work_dir)?;
    let mut walked = PathBuf::new();
    for part in path.parent().into_iter().flat_map(Path::components) {
        let Component::Normal(part) = part else {
            continue; // `.`; validation refused everything else
        };
        walked.push(part);
        let created = match mkdirat(&dir, part, Mode::from_bits_truncate(0o755)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(format!("cannot create directory {}: {e}", walked.display())),
        };
        dir = openat(&dir, part, dir_flags, Mode::empty()).map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR => format!(
                "{} is a symbolic link or not a directory; files are never written through links",
                walked.display()
            ),
            e => format!("cannot open directory {}: {e}", walked.display()),
        })?;
        if let (true, Some((uid, gid))) = (created, owner) {
            fchown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give directory {} to the task: {e}", walked.display()))?;
        }
    }
    renameat(&fetch, name, &dir, file_name).map_err(|e| format!("cannot move the file into place: {e}"))
}

/// Whether `artifact` is at its destination under `work_dir` already, with
/// its sha256: a regular file reached through no symbolic link (they are
/// the task's to plant). Blocking.
fn in_place(work_dir: &Path, artifact: &Artifact, max_bytes: u64) -> bool {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Some((dir, file_name)) = parent_of(work_dir, &artifact.destination) else {
        return false;
    };
    let Ok(file) = openat(
        &dir,
        file_name,
        flags | OFlag::O_RDONLY | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut file = std::fs::File::from(file);
    // No hashing of whatever size the task made it (it is the task's file).
    if !file.metadata().is_ok_and(|m| m.is_file() && m.len() <= max_bytes) {
        return false;
    }
    let mut hasher = Sha256::new();
    if std::io::copy(&mut file, &mut hasher).is_err() {
        return false;
    }
    hex(&hasher.finalize()).eq_ignore_ascii_case(&artifact.sha256)
}

/// The directory `destination` (relative to `work_dir`) is in, opened, and
/// its file name: reached through no symbolic link. Blocking.
pub(crate) fn parent_of<'a>(work_dir: &Path, destination: &'a str) -> Option<(OwnedFd, &'a std::ffi::OsStr)> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_DIRECTORY;
    let mut dir = openat(AT_FDCWD, work_dir, flags, Mode::empty()).ok()?;
    let path = Path::new(destination);
    let file_name = path.file_name()?;
    for part in path.parent().into_iter().flat_map(Path::components) {
        if let Component::Normal(part) = part {
            dir = openat(&dir, part, flags, Mode::empty()).ok()?;
        }
    }
    Some((dir, file_name))
}

/// Removes the file at `destination` under `work_dir` that the agent
/// placed there, reaching it through no symbolic link (the task may have
/// planted one). Blocking; what is not there is not an error.
pub(crate) fn remove_placed(work_dir: &Path, destination: &str) -> Result<(), String> {
    let Some((dir, file_name)) = parent_of(work_dir, destination) else {
        return Ok(());
    };
    match nix::unistd::unlinkat(&dir, file_name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(format!("cannot remove {destination}: {e}")),
    }
}

pub(crate) async fn fetch_with_retries(
    client: &reqwest::Client,
    artifact: &Artifact,
    dest: &Path,
    limits: Limits,
) -> Result<(), String> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        let result =
            match tokio::time::timeout(limits.timeout, fetch_once(client, artifact, dest, limits)).await {
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
        let _ = tokio::fs::remove_file(dest).await;
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

/// Downloads into `dest` (in the fetch directory, which only root writes).
async fn fetch_once(
    client: &reqwest::Client,
    artifact: &Artifact,
    dest: &Path,
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
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(dest)
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
    Ok(())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fetch directory holding one download, and an empty work directory.
    fn places() -> (tempfile::TempDir, Places) {
        let dir = tempfile::tempdir().unwrap();
        let fetch_dir = dir.path().join("fetch");
        let work_dir = dir.path().join("work");
        std::fs::create_dir(&fetch_dir).unwrap();
        std::fs::create_dir(&work_dir).unwrap();
        std::fs::write(fetch_dir.join("0.partial"), b"payload").unwrap();
        let places = Places {
            fetch_dir,
            work_dir,
            owner: None,
        };
        (dir, places)
    }

    #[test]
    fn a_file_is_moved_into_place_with_its_directories() {
        let (_dir, places) = places();
        hand_over(&places, "0.partial", "./bin/tools/payload", ARTIFACT_MODE).unwrap();
        let placed = places.work_dir.join("bin/tools/payload");
        assert_eq!(std::fs::read(&placed).unwrap(), b"payload");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&placed).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert!(!places.fetch_dir.join("0.partial").exists());
    }

    #[test]
    fn a_planted_link_on_the_way_is_refused_and_one_at_the_end_replaced() {
        let (dir, places) = places();
        let victim_dir = dir.path().join("victim-dir");
        std::fs::create_dir(&victim_dir).unwrap();
        std::os::unix::fs::symlink(&victim_dir, places.work_dir.join("bin")).unwrap();
        let err = hand_over(&places, "0.partial", "bin/payload", ARTIFACT_MODE).unwrap_err();
        assert!(err.contains("bin is a symbolic link"), "{err}");
        assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);

        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::os::unix::fs::symlink(&victim, places.work_dir.join("payload")).unwrap();
        hand_over(&places, "0.partial", "payload", ARTIFACT_MODE).unwrap();
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"secret",
            "the link's target is untouched"
        );
        let placed = places.work_dir.join("payload");
        assert!(!std::fs::symlink_metadata(&placed)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&placed).unwrap(), b"payload");
    }

    #[test]
    fn files_and_new_directories_go_to_the_task_user() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let (_dir, mut places) = places();
        places.owner = Some((70_002, 70_002));
        hand_over(&places, "0.partial", "sub/file", ARTIFACT_MODE).unwrap();
        use std::os::unix::fs::MetadataExt;
        for path in ["sub", "sub/file"] {
            let meta = std::fs::metadata(places.work_dir.join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (70_002, 70_002), "{path}");
        }
    }
}
