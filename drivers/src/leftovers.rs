//! What a task that ran as a uid of its own leaves outside its task
//! directory: files in the places every user may write (`/tmp`,
//! `/var/tmp`, `/dev/shm`, POSIX message queues in `/dev/mqueue`) and
//! System V IPC objects (shared memory, semaphores, message queues). They
//! are removed before the uid is handed to another task, so that no task
//! reads what an earlier task of another author left: what systemd's
//! `RemoveIPC=` does when a user's last session ends, extended to the
//! temporary directories (as `PrivateTmp=` would keep them apart).
//!
//! The walk never follows a symbolic link and never leaves the file system
//! it started on; it goes down only into directories others may write to
//! (where a file of the uid can hide) and removes whatever the uid owns,
//! a directory with everything in it. Blocking: run it off the supervisor.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sys::{remove_ipc, Ipc};

/// Where any user may leave files.
pub const SHARED_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"];
/// How deep the walk goes below each shared directory.
const MAX_DEPTH: usize = 16;

/// What a clean-up removed, and what it could not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    /// Files and directories (a directory counts once).
    pub files: Vec<PathBuf>,
    /// System V IPC objects.
    pub ipc: usize,
    /// What could not be removed, for the log.
    pub errors: Vec<String>,
}

/// Removes everything `uid` owns in [`SHARED_DIRS`] and its System V IPC
/// objects.
pub fn remove(uid: u32) -> Removed {
    let dirs: Vec<&Path> = SHARED_DIRS.iter().map(Path::new).collect();
    let mut removed = remove_files(&dirs, uid);
    remove_sysv_ipc(uid, Path::new("/proc/sysvipc"), &mut removed);
    removed
}

/// Removes everything `uid` owns under `dirs` (not the directories
/// themselves).
pub fn remove_files(dirs: &[&Path], uid: u32) -> Removed {
    let mut removed = Removed::default();
    for dir in dirs {
        let Ok(meta) = dir.symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            walk(dir, meta.dev(), uid, 0, &mut removed);
        }
    }
    removed
}

fn walk(dir: &Path, dev: u64, uid: u32, depth: usize, removed: &mut Removed) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if meta.uid() == uid {
            // remove_dir_all does not follow symbolic links.
            let result = if meta.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match result {
                Ok(()) => removed.files.push(path),
                Err(e) => removed.errors.push(format!("{}: {e}", path.display())),
            }
        } else if meta.is_dir() && meta.dev() == dev && depth < MAX_DEPTH && meta.mode() & 0o022 != 0 {
            walk(&path, dev, uid, depth + 1, removed);
        }
    }
}

/// Removes the System V IPC objects `uid` owns or created, as listed in
/// `proc` (`/proc/sysvipc`).
fn remove_sysv_ipc(uid: u32, proc: &Path, removed: &mut Removed) {
    for (file, kind) in [("shm", Ipc::Shm), ("sem", Ipc::Sem), ("msg", Ipc::Msg)] {
        let Ok(text) = std::fs::read_to_string(proc.join(file)) else {
            continue;
        };
        for id in owned_ids(&text, uid) {
            match remove_ipc(kind, id) {
                Ok(()) => removed.ipc += 1,
                Err(e) => removed.errors.push(format!("System V {file} {id}: {e}")),
            }
        }
    }
}

/// The ids of the objects in a `/proc/sysvipc/*` table whose owner or
/// creator is `uid`. The columns are named in the first line; the id is
/// the second column (`shmid`, `semid`, `msqid`).
fn owned_ids(table: &str, uid: u32) -> Vec<i32> {
    let mut lines = table.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let columns: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| columns.iter().position(|c| *c == name);
    let (Some(owner), Some(creator)) = (at("uid"), at("cuid")) else {
        return Vec::new();
    };
    lines
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let is = |i: usize| fields.get(i).and_then(|f| f.parse::<u32>().ok()) == Some(uid);
            if is(owner) || is(creator) {
                fields.get(1)?.parse().ok()
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_tables_are_read_by_their_column_names() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                   0x00000000         7   600                  1024  4242     0      0 70001 70001 70001 70001          0          0 1764000000                     0                     0\n\
                   0x00000000         8   600                  1024  4242     0      0     0     0     0     0          0          0 1764000000                     0                     0\n\
                   0x00000000         9   600                  1024  4242     0      0     0     0 70001 70001          0          0 1764000000                     0                     0\n";
        assert_eq!(owned_ids(shm, 70001), vec![7, 9], "owned or created");
        assert!(owned_ids(shm, 70002).is_empty());
        assert!(owned_ids("", 1).is_empty());
    }

    #[test]
    fn only_what_the_uid_owns_goes_and_links_are_not_followed() {
        if !nix::unistd::geteuid().is_root() {
            return; // files of another uid need root (the root CI run covers it)
        }
        use std::os::unix::fs::{chown, symlink, PermissionsExt};
        let shared = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = shared.path();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let own = |p: &Path| chown(p, Some(70_123), Some(70_123)).unwrap();
        std::fs::write(root.join("left"), b"secret").unwrap();
        own(&root.join("left"));
        std::fs::create_dir(root.join("dir")).unwrap();
        std::fs::write(root.join("dir/inside"), b"x").unwrap();
        own(&root.join("dir"));
        // A shared directory of someone else, with a file of the uid in it.
        std::fs::create_dir(root.join("common")).unwrap();
        std::fs::set_permissions(root.join("common"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::write(root.join("common/deep"), b"x").unwrap();
        own(&root.join("common/deep"));
        // Someone else's file, and the uid's link to a file outside.
        std::fs::write(root.join("others"), b"x").unwrap();
        std::fs::write(outside.path().join("target"), b"keep").unwrap();
        symlink(outside.path().join("target"), root.join("link")).unwrap();
        std::os::unix::fs::lchown(root.join("link"), Some(70_123), Some(70_123)).unwrap();

        let removed = remove_files(&[root], 70_123);
        assert!(removed.errors.is_empty(), "{removed:?}");
        let mut gone: Vec<String> = removed
            .files
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        gone.sort();
        assert_eq!(gone, ["common/deep", "dir", "left", "link"]);
        assert!(root.join("others").exists() && root.join("common").exists());
        assert_eq!(std::fs::read(outside.path().join("target")).unwrap(), b"keep");
    }
}
