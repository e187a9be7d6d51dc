//! Taking a task's output files off its directory (blocking I/O): finding
//! what the template's patterns name, and putting each into the spool,
//! reached through no symbolic link, with its size and sha256.
//!
//! The task owns its directory and may plant links anywhere in it: the
//! walk never descends into a link, and a file is opened one directory at
//! a time with `O_NOFOLLOW`, so a link swapped in after the walk is refused
//! rather than followed. The spool holds a hard link to the very inode
//! opened (through `/proc/self/fd`), so the task's directory can be
//! retired while the upload goes on; where a link cannot be made (another
//! file system, no `/proc`) the file is copied.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use k8s4r_api::output::{matcher, walk_root, Output};
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::Mode;
use sha2::{Digest, Sha256};

use crate::supervisor::artifacts::{hex, parent_of};

/// Most files one attempt's outputs may name (the Task lists as many).
pub const MAX_FILES: usize = 100;
/// Most directory entries one walk looks at, and its deepest level: a task
/// that wrote a million files does not hold the agent up.
const MAX_ENTRIES: usize = 100_000;
const MAX_DEPTH: usize = 32;

/// A file in the spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub size: u64,
    pub sha256: String,
    /// Whether it is a link to the task's file (false: a copy).
    pub linked: bool,
}

/// The regular files under `work_dir` that `outputs` name, as paths
/// relative to it, in order, at most [`MAX_FILES`]; `skip` names files
/// taken already.
pub fn find(work_dir: &Path, outputs: &[&Output], skip: &BTreeSet<String>) -> Vec<String> {
    let mut found = BTreeSet::new();
    let mut seen = 0;
    for output in outputs {
        let Ok(m) = matcher(&output.path) else {
            continue;
        };
        let root = walk_root(&output.path);
        let mut stack = vec![(work_dir.join(root), root.to_owned(), 0)];
        while let Some((dir, rel, depth)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_ENTRIES {
                    tracing::warn!(dir = %work_dir.display(), "more than {MAX_ENTRIES} entries; outputs looked no further");
                    return found.into_iter().take(MAX_FILES).collect();
                }
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let path = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                // The entry's own type: a symbolic link is neither.
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() && depth < MAX_DEPTH {
                    stack.push((entry.path(), path, depth + 1));
                } else if kind.is_file() && m.is_match(&path) && !skip.contains(&path) {
                    found.insert(path);
                }
            }
        }
    }
    if found.len() > MAX_FILES {
        tracing::warn!(dir = %work_dir.display(), files = found.len(), "outputs name more than {MAX_FILES} files; the first {MAX_FILES} in order are taken");
    }
    found.into_iter().take(MAX_FILES).collect()
}

/// The size of `work_dir/path`, a regular file reached through no link.
pub fn size_of(work_dir: &Path, path: &str) -> Result<u64, String> {
    let file = open(work_dir, path)?;
    Ok(file.metadata().map_err(|e| e.to_string())?.len())
}

/// The size and modification time of `work_dir/path`, a regular file
/// reached through no link.
pub fn seen(work_dir: &Path, path: &str) -> Result<(u64, i128), String> {
    let meta = open(work_dir, path)?.metadata().map_err(|e| e.to_string())?;
    Ok((
        meta.len(),
        i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    ))
}

/// Puts `work_dir/path` into the spool as `spooled` (a new name) and
/// reads its size and sha256 there.
pub fn take(work_dir: &Path, path: &str, spooled: &Path) -> Result<Taken, String> {
    let mut file = open(work_dir, path)?;
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let linked = nix::unistd::linkat(
        AT_FDCWD,
        proc_path.as_str(),
        AT_FDCWD,
        spooled,
        AtFlags::AT_SYMLINK_FOLLOW,
    )
    .is_ok();
    if !linked {
        let mut copy = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(spooled)
            .map_err(|e| format!("cannot create {}: {e}", spooled.display()))?;
        std::io::copy(&mut file, &mut copy).map_err(|e| format!("cannot copy {path}: {e}"))?;
        copy.sync_all().map_err(|e| format!("cannot copy {path}: {e}"))?;
    }
    let (size, sha256) = hash(spooled)?;
    Ok(Taken { size, sha256, linked })
}

/// The size and sha256 of a file, read through a small buffer.
pub fn hash(path: &Path) -> Result<(u64, String), String> {
    let mut file = File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

/// Removes `work_dir/path` if it is still the file `spooled` links to,
/// of the `size` uploaded (a task may have written a new one under the
/// name since, or appended to it).
pub fn remove_original(work_dir: &Path, path: &str, spooled: &Path, size: u64) {
    // The original has two names now, ours and its own: looked at by
    // hand, not through `open`, which takes files with one.
    let Some((dir, name)) = parent_of(work_dir, path) else {
        return;
    };
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let Ok(fd) = openat(&dir, name, flags, Mode::empty()) else {
        return;
    };
    let (Ok(meta), Ok(ours)) = (File::from(fd).metadata(), std::fs::metadata(spooled)) else {
        return;
    };
    if (meta.dev(), meta.ino()) != (ours.dev(), ours.ino()) || meta.len() != size {
        return;
    }
    if let Err(e) = nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        tracing::warn!(path, error = %e, "cannot remove an uploaded output");
    }
}

/// `work_dir/path` opened for reading, reached through no symbolic link,
/// if it is a regular file.
fn open(work_dir: &Path, path: &str) -> Result<File, String> {
    let (dir, name) = parent_of(work_dir, path)
        .ok_or_else(|| format!("{path}: its directory is gone or reached through a symbolic link"))?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = openat(&dir, name, flags, Mode::empty()).map_err(|e| match e {
        nix::errno::Errno::ELOOP => format!("{path} is a symbolic link; outputs never follow one"),
        e => format!("cannot open {path}: {e}"),
    })?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("{path} is not a regular file"));
    }
    // A hard link is a regular file too: one to a file outside the task's
    // directory (`ln /etc/shadow out.txt`, where the kernel lets a user
    // link what it does not own) would be read as root. A task's own
    // output has one name.
    if meta.nlink() != 1 {
        return Err(format!(
            "{path} has {} names (hard links); outputs take only files with one",
            meta.nlink()
        ));
    }
    Ok(file)
}

/// `path`, relative to the working directory `within` the task's
/// directory (unset: the task's directory), relative to the latter.
pub fn inside(within: Option<&str>, path: &str) -> String {
    match within {
        Some(within) => format!("{}/{path}", within.trim_end_matches('/')),
        None => path.to_owned(),
    }
}

/// The spool's own directory under the state directory: root's alone.
pub fn spool_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("outputs")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(path: &str) -> Output {
        Output {
            path: path.into(),
            ..Output::default()
        }
    }

    fn write(root: &Path, path: &str, data: &[u8]) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    #[test]
    fn patterns_find_regular_files_and_never_go_through_links() {
        let work = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        write(outside.path(), "secret.mcap", b"not the task's");
        write(work.path(), "bags/a.mcap", b"a");
        write(work.path(), "bags/old/b.mcap", b"b");
        write(work.path(), "report.xml", b"<ok/>");
        std::os::unix::fs::symlink(outside.path(), work.path().join("bags/escape")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret.mcap"),
            work.path().join("bags/c.mcap"),
        )
        .unwrap();
        let (deep, flat, report) = (
            output("bags/**/*.mcap"),
            output("bags/*.mcap"),
            output("report.xml"),
        );
        assert_eq!(
            find(work.path(), &[&deep], &BTreeSet::new()),
            vec!["bags/a.mcap", "bags/old/b.mcap"]
        );
        assert_eq!(
            find(work.path(), &[&flat, &report], &BTreeSet::new()),
            vec!["bags/a.mcap", "report.xml"]
        );
        let skip = BTreeSet::from(["bags/a.mcap".to_owned()]);
        assert_eq!(find(work.path(), &[&flat], &skip), Vec::<String>::new());
    }

    #[test]
    fn a_file_is_linked_into_the_spool_with_its_hash_and_a_link_is_refused() {
        let work = tempfile::tempdir().unwrap();
        let spool = tempfile::tempdir().unwrap();
        write(work.path(), "out/run.bag", b"test");
        let spooled = spool.path().join("1");
        let taken = take(work.path(), "out/run.bag", &spooled).unwrap();
        assert_eq!(taken.size, 4);
        assert_eq!(
            taken.sha256,
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert!(taken.linked);
        // The task's directory can go: the spool keeps the data.
        std::fs::remove_dir_all(work.path().join("out")).unwrap();
        assert_eq!(std::fs::read(&spooled).unwrap(), b"test");

        std::fs::create_dir_all(work.path().join("real")).unwrap();
        write(work.path(), "real/x", b"x");
        std::os::unix::fs::symlink("/etc/passwd", work.path().join("real/link")).unwrap();
        std::os::unix::fs::symlink(work.path().join("real"), work.path().join("via")).unwrap();
        let err = take(work.path(), "real/link", &spool.path().join("2")).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        let err = take(work.path(), "via/x", &spool.path().join("3")).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!spool.path().join("2").exists() && !spool.path().join("3").exists());
    }

    #[test]
    fn only_the_file_that_was_uploaded_is_removed() {
        let work = tempfile::tempdir().unwrap();
        let spool = tempfile::tempdir().unwrap();
        write(work.path(), "a.log", b"first");
        write(work.path(), "b.log", b"first");
        write(work.path(), "c.log", b"first");
        take(work.path(), "a.log", &spool.path().join("a")).unwrap();
        take(work.path(), "b.log", &spool.path().join("b")).unwrap();
        take(work.path(), "c.log", &spool.path().join("c")).unwrap();
        remove_original(work.path(), "a.log", &spool.path().join("a"), 5);
        assert!(!work.path().join("a.log").exists());
        // A new b.log under the same name stays.
        std::fs::remove_file(work.path().join("b.log")).unwrap();
        write(work.path(), "b.log", b"second");
        remove_original(work.path(), "b.log", &spool.path().join("b"), 5);
        assert!(work.path().join("b.log").exists());
        // So does one the task appended to since.
        std::fs::OpenOptions::new()
            .append(true)
            .open(work.path().join("c.log"))
            .unwrap()
            .write_all(b" and more")
            .unwrap();
        remove_original(work.path(), "c.log", &spool.path().join("c"), 5);
        assert!(work.path().join("c.log").exists());
    }

    #[test]
    fn a_hard_link_to_another_file_is_refused() {
        let work = tempfile::tempdir().unwrap();
        let spool = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let elsewhere = other.path().join("not-the-tasks");
        std::fs::write(&elsewhere, b"secret").unwrap();
        std::fs::hard_link(&elsewhere, work.path().join("out.txt")).unwrap();
        let err = take(work.path(), "out.txt", &spool.path().join("1")).unwrap_err();
        assert!(err.contains("hard links"), "{err}");
        assert!(!spool.path().join("1").exists());
    }
}
