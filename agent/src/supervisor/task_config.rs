//! A task's configuration from ConfigMaps and Secrets on the robot.
//!
//! The dispatch carries it (the server resolved it for this robot). The
//! agent keeps it in the task's directory, readable by root alone
//! (`<dir>/config.json`, 0600), so that an attempt started again without
//! the network (an agent restart, a reboot) starts with it; the journal
//! keeps the spec's references only, never a value. Its files are written
//! under the task's working directory, owned by the task's user, through
//! no symbolic link; its variables reach the process, its exec checks and
//! its `preStop`. When the attempt ends, its files and the kept copy are
//! removed.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use k8s4r_api::protocol::{ConfigSource, TaskConfig};
use k8s4r_drivers::ConfigEnv;

use super::artifacts::{hand_over, remove_placed, Places};

/// The kept copy, in the task's directory.
const KEPT: &str = "config.json";

/// Keeps `config` in `dir` (root alone reads it), replacing what was there.
pub(crate) fn keep(dir: &Path, config: &TaskConfig) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(config).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".{KEPT}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, dir.join(KEPT))?;
    File::open(dir).and_then(|d| d.sync_all())
}

/// The copy kept in `dir`, if there is one.
pub(crate) fn kept(dir: &Path) -> std::io::Result<Option<TaskConfig>> {
    match fs::read(dir.join(KEPT)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `config`'s files into place (see [`Places`]), each with its
/// mode. Blocking.
pub(crate) fn place(places: &Places, config: &TaskConfig) -> Result<(), String> {
    for (i, file) in config.files.iter().enumerate() {
        let content = file
            .content()
            .map_err(|e| format!("configuration file {}: {e}", file.path))?;
        let name = format!("config-{i}.partial");
        let staged = places.fetch_dir.join(&name);
        let _ = fs::remove_file(&staged);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&staged)
            .and_then(|mut f| f.write_all(&content));
        let placed = written
            .map_err(|e| e.to_string())
            .and_then(|()| hand_over(places, &name, &file.path, file.mode));
        if let Err(e) = placed {
            // Nothing of it stays behind, even root's alone.
            let _ = fs::remove_file(&staged);
            return Err(format!("configuration file {}: {e}", file.path));
        }
    }
    Ok(())
}

/// The variables `config` sets.
pub(crate) fn env(config: &TaskConfig) -> ConfigEnv {
    ConfigEnv(
        config
            .env
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect(),
    )
}

/// What taking a change of configuration did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Not newer than the one kept: nothing done.
    Stale,
    /// The values and files are those kept: only the versions recorded.
    Same,
    /// Files rewritten (each replaced whole: a reader sees the old file or
    /// the new one), those no longer taken removed; the variables it sets
    /// now.
    Changed(ConfigEnv),
    /// It could not be taken (why): the attempt keeps the configuration it
    /// had, from these objects (its files put back as they were).
    Failed { why: String, kept: Vec<ConfigSource> },
}

/// Takes a change of a running attempt's configuration in `dir` (the
/// attempt's directory): its files rewritten under `dir/work`, owned as
/// that directory is (by the task's user), and the kept copy replaced.
/// Blocking.
pub(crate) fn update(dir: &Path, config: &TaskConfig) -> Applied {
    let old = match kept(dir) {
        Ok(old) => old.unwrap_or_default(),
        Err(e) => {
            return Applied::Failed {
                why: format!("cannot read the kept configuration: {e}"),
                kept: Vec::new(),
            }
        }
    };
    if config.generation <= old.generation {
        return Applied::Stale;
    }
    match rewrite(dir, &old, config) {
        Ok(applied) => applied,
        Err(why) => Applied::Failed {
            why,
            kept: old.sources,
        },
    }
}

fn rewrite(dir: &Path, old: &TaskConfig, config: &TaskConfig) -> Result<Applied, String> {
    let same = old.env == config.env && old.files == config.files;
    if !same {
        use std::os::unix::fs::MetadataExt;
        let work_dir = dir.join("work");
        let owner = fs::symlink_metadata(&work_dir)
            .map(|m| (m.uid(), m.gid()))
            .map_err(|e| format!("cannot read the task's directory: {e}"))?;
        let places = Places {
            fetch_dir: dir.join("fetch"),
            work_dir: work_dir.clone(),
            owner: Some(owner),
        };
        if let Err(why) = place(&places, config) {
            // Some files may be new already: the old ones go back (best
            // effort), so that the task's files match what it runs with.
            let _ = place(&places, old);
            return Err(why);
        }
        for gone in old
            .files
            .iter()
            .filter(|f| !config.files.iter().any(|n| n.path == f.path))
        {
            if let Err(error) = remove_placed(&work_dir, &gone.path) {
                tracing::warn!(%error, "cannot remove a configuration file the task no longer takes");
            }
        }
    }
    keep(dir, config).map_err(|e| format!("cannot keep the configuration: {e}"))?;
    Ok(if same {
        Applied::Same
    } else {
        Applied::Changed(env(config))
    })
}

/// Removes what an attempt that ended put on the robot of its
/// configuration, and closes its directory to everyone but root, as the end
/// of an attempt does: for attempts settled or refused as an agent starts,
/// which never reach that end. Blocking.
pub(crate) fn forget(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    remove(dir, &dir.join("work"));
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
}

/// Removes what the configuration kept in `dir` put on the robot: its
/// files under `work_dir`, then the kept copy. Blocking; best effort, what
/// fails is said.
pub(crate) fn remove(dir: &Path, work_dir: &Path) {
    let config = match kept(dir) {
        Ok(Some(config)) => config,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot read a task's kept configuration to remove it");
            let _ = fs::remove_file(dir.join(KEPT));
            return;
        }
    };
    for file in &config.files {
        if let Err(error) = remove_placed(work_dir, &file.path) {
            tracing::warn!(%error, "cannot remove a task's configuration file");
        }
    }
    if let Err(error) = fs::remove_file(dir.join(KEPT)) {
        tracing::warn!(dir = %dir.display(), %error, "cannot remove a task's kept configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::protocol::{ConfigFile, ConfigVar};
    use std::os::unix::fs::PermissionsExt;

    fn config() -> TaskConfig {
        TaskConfig {
            env: vec![ConfigVar {
                name: "TOKEN".into(),
                value: "s3cr3t".into(),
                secret: true,
            }],
            files: vec![
                ConfigFile::new("conf/params.yaml".into(), 0o644, false, b"rate: 10\n"),
                ConfigFile::new("secrets/token".into(), 0o400, true, b"s3cr3t"),
            ],
            sources: Vec::new(),
            generation: 0,
        }
    }

    fn places(root: &Path) -> Places {
        let fetch_dir = root.join("fetch");
        let work_dir = root.join("work");
        fs::create_dir_all(&fetch_dir).unwrap();
        fs::create_dir_all(&work_dir).unwrap();
        Places {
            fetch_dir,
            work_dir,
            owner: None,
        }
    }

    #[test]
    fn files_are_placed_with_their_modes_and_removed_with_the_kept_copy() {
        let root = tempfile::tempdir().unwrap();
        let places = places(root.path());
        keep(root.path(), &config()).unwrap();
        let kept_mode = fs::metadata(root.path().join(KEPT)).unwrap().permissions().mode();
        assert_eq!(kept_mode & 0o777, 0o600);
        place(&places, &config()).unwrap();
        let params = places.work_dir.join("conf/params.yaml");
        assert_eq!(fs::read_to_string(&params).unwrap(), "rate: 10\n");
        assert_eq!(fs::metadata(&params).unwrap().permissions().mode() & 0o777, 0o644);
        let token = places.work_dir.join("secrets/token");
        assert_eq!(fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o400);
        // Placed again (a restart): replaced, not refused.
        place(&places, &config()).unwrap();
        assert_eq!(kept(root.path()).unwrap(), Some(config()));
        assert_eq!(env(&config()).0, vec![("TOKEN".to_owned(), "s3cr3t".to_owned())]);
        assert!(!format!("{:?}", env(&config())).contains("s3cr3t"));
        remove(root.path(), &places.work_dir);
        assert!(!token.exists() && !params.exists());
        assert_eq!(kept(root.path()).unwrap(), None);
    }

    #[test]
    fn a_change_rewrites_the_files_removes_those_no_longer_taken_and_keeps_the_newest_only() {
        let root = tempfile::tempdir().unwrap();
        let places = places(root.path());
        keep(root.path(), &config()).unwrap();
        place(&places, &config()).unwrap();
        let params = places.work_dir.join("conf/params.yaml");
        let token = places.work_dir.join("secrets/token");
        let mut changed = config();
        changed.generation = 1;
        changed.files = vec![ConfigFile::new(
            "conf/params.yaml".into(),
            0o644,
            false,
            b"rate: 20\n",
        )];
        changed.env[0].value = "n3w".into();
        match update(root.path(), &changed) {
            Applied::Changed(env) => assert_eq!(env.0, vec![("TOKEN".to_owned(), "n3w".to_owned())]),
            other => panic!("expected a change, got {other:?}"),
        }
        assert_eq!(fs::read_to_string(&params).unwrap(), "rate: 20\n");
        assert!(!token.exists(), "a file no longer taken is removed");
        assert_eq!(kept(root.path()).unwrap(), Some(changed.clone()));
        // The same change again, or an older one: nothing.
        assert_eq!(update(root.path(), &changed), Applied::Stale);
        let mut older = config();
        older.generation = 1;
        assert_eq!(update(root.path(), &older), Applied::Stale);
        assert_eq!(fs::read_to_string(&params).unwrap(), "rate: 20\n");
        // Newer versions of the objects with the same values: recorded only.
        let mut same = changed.clone();
        same.generation = 2;
        same.sources = vec![k8s4r_api::protocol::ConfigSource {
            kind: k8s4r_api::config_ref::ObjectKind::ConfigMap,
            name: "calibration".into(),
            resource_version: "9".into(),
        }];
        assert_eq!(update(root.path(), &same), Applied::Same);
        assert_eq!(kept(root.path()).unwrap(), Some(same.clone()));
        // A file the task replaced by a link is refused, never written through.
        fs::remove_file(&params).unwrap();
        let outside = root.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::remove_dir(places.work_dir.join("conf")).unwrap();
        std::os::unix::fs::symlink(&outside, places.work_dir.join("conf")).unwrap();
        let mut third = changed.clone();
        third.generation = 3;
        third.files[0] = ConfigFile::new("conf/params.yaml".into(), 0o644, false, b"rate: 30\n");
        let Applied::Failed { why, kept } = update(root.path(), &third) else {
            panic!("a link is refused");
        };
        assert!(why.contains("symbolic link"), "{why}");
        assert_eq!(kept, same.sources, "it runs on with what it had");
        assert!(!outside.join("params.yaml").exists());
    }

    #[test]
    fn an_attempt_settled_as_an_agent_starts_is_forgotten_and_closed() {
        let root = tempfile::tempdir().unwrap();
        let places = places(root.path());
        keep(root.path(), &config()).unwrap();
        place(&places, &config()).unwrap();
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o711)).unwrap();
        forget(root.path());
        assert!(!places.work_dir.join("secrets/token").exists());
        assert_eq!(kept(root.path()).unwrap(), None);
        let mode = fs::metadata(root.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_file_that_cannot_be_placed_leaves_nothing_staged() {
        let root = tempfile::tempdir().unwrap();
        let places = places(root.path());
        std::os::unix::fs::symlink("/", places.work_dir.join("secrets")).unwrap();
        place(&places, &config()).unwrap_err();
        assert_eq!(fs::read_dir(&places.fetch_dir).unwrap().count(), 0);
    }

    #[test]
    fn a_symbolic_link_the_task_planted_is_never_written_through_nor_removed_through() {
        let root = tempfile::tempdir().unwrap();
        let places = places(root.path());
        let outside = root.path().join("outside");
        fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, places.work_dir.join("secrets")).unwrap();
        let err = place(&places, &config()).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!outside.join("token").exists());
        fs::write(outside.join("token"), "theirs").unwrap();
        keep(root.path(), &config()).unwrap();
        remove(root.path(), &places.work_dir);
        assert_eq!(fs::read_to_string(outside.join("token")).unwrap(), "theirs");
    }
}
