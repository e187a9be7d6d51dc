//! Files only their owner may read: the TLS key, kubeconfigs (they hold
//! the token) and the redb file (it holds Secrets).
//!
//! Each is created with mode 0600 by the call that creates it, never
//! written first and narrowed afterwards: in between, anyone on the machine
//! could open it, and an open file stays readable after a `chmod`. Files
//! written whole go to a fresh temporary file beside the target and are
//! renamed over it, so a reader that opened an older, looser file never sees
//! the new contents through it. The directories made for them are 0700.
//!
//! The server runs on Unix only (it waits for SIGTERM), so modes are Unix
//! modes.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Read and write for the owner only.
pub const FILE_MODE: u32 = 0o600;
/// The directories created to hold private files.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` and its missing parents, each 0700; an existing
/// directory is left as it is (its owner chose its mode).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Replaces `path` with a 0600 file holding `contents`: written to a
/// temporary file created 0600 in the same directory, flushed, then renamed
/// over `path`. A symbolic link at `path` is replaced, not followed.
pub fn write(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    create_dir(dir)?;
    let prefix = format!(".{}.", path.file_name().unwrap_or_default().to_string_lossy());
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(Permissions::from_mode(FILE_MODE))
        .tempfile_in(dir)?;
    tmp.write_all(contents)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Opens `path` for reading and writing, creating it 0600 when missing and
/// narrowing it to 0600 when it exists with a looser mode.
pub fn open(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)?;
    narrow(&file, path)?;
    Ok(file)
}

/// Narrows an existing file (one this server did not create, or created
/// before it took care) to 0600.
pub fn narrow_existing(path: &Path) -> std::io::Result<()> {
    narrow(&File::open(path)?, path)
}

fn narrow(file: &File, path: &Path) -> std::io::Result<()> {
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & !FILE_MODE != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "narrowing a private file to 0600");
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn writes_replace_the_file_rather_than_reuse_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/kubeconfig");
        write(&path, b"first").unwrap();
        assert_eq!(mode(&path), FILE_MODE);
        assert_eq!(mode(&dir.path().join("sub")), DIR_MODE);
        assert_eq!(std::fs::read(&path).unwrap(), b"first");

        // Someone opened the file while it was readable by all: what is
        // written next does not reach them.
        std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        let early_reader = File::open(&path).unwrap();
        write(&path, b"second").unwrap();
        assert_eq!(mode(&path), FILE_MODE);
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::io::read_to_string(early_reader).unwrap(), "first");
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("kubeconfig")]);
    }

    #[test]
    fn opening_creates_0600_or_narrows_and_keeps_contents() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("fresh.redb");
        drop(open(&fresh).unwrap());
        assert_eq!(mode(&fresh), FILE_MODE);

        let loose = dir.path().join("loose.redb");
        std::fs::write(&loose, b"data").unwrap();
        std::fs::set_permissions(&loose, Permissions::from_mode(0o664)).unwrap();
        drop(open(&loose).unwrap());
        assert_eq!(mode(&loose), FILE_MODE);
        assert_eq!(std::fs::read(&loose).unwrap(), b"data");

        let key = dir.path().join("tls.key");
        std::fs::write(&key, b"key").unwrap();
        std::fs::set_permissions(&key, Permissions::from_mode(0o640)).unwrap();
        narrow_existing(&key).unwrap();
        assert_eq!(mode(&key), FILE_MODE);
        // A stricter mode is not widened.
        std::fs::set_permissions(&key, Permissions::from_mode(0o400)).unwrap();
        narrow_existing(&key).unwrap();
        assert_eq!(mode(&key), 0o400);
    }
}
