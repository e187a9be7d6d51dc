//! Per-task log files: where they are, their rotation and their tail.
//!
//! A task's output never passes through the agent. Under the agent's
//! binary, the task logger (a process of its own per task, `crate::logger`)
//! reads it from pipes and writes it with [`RotatingLog`]: it outlives the
//! agent with the task, and a stalled disk stalls only the logger (the task
//! then waits on a full pipe, which a signal still interrupts). Elsewhere
//! (a supervisor in another process, as `k8s4r up`'s) a task writes to its
//! log files itself, and the supervisor rotates them (copy and truncate)
//! each time it measures the disk and once more when the task ends.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Which stream a chunk of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(crate) fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout.log",
            Stream::Stderr => "stderr.log",
        }
    }
}

/// One stream's log: `name`, then `name.1` (newest) to `name.<max_files-1>`,
/// written by the task logger (its own process: see `crate::logger`).
pub(crate) struct RotatingLog {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_bytes: u64,
    max_files: u32,
    /// When each part was written (`--since`), rotated with the file.
    marks: Option<super::log_times::Marks>,
}

impl RotatingLog {
    pub(crate) fn new(path: PathBuf, max_bytes: u64, max_files: u32) -> Self {
        RotatingLog {
            marks: super::log_times::Marks::new(&path, max_bytes.max(1)),
            path,
            file: None,
            size: 0,
            max_bytes: max_bytes.max(1),
            max_files: max_files.max(1),
        }
    }

    pub(crate) fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        use std::io::Write;
        while !data.is_empty() {
            if self.size >= self.max_bytes {
                self.rotate()?;
            }
            let file = match &mut self.file {
                Some(file) => file,
                None => {
                    let file = super::log_times::open_appending(&self.path)?;
                    self.size = file.metadata()?.len();
                    self.file.insert(file)
                }
            };
            if self.size >= self.max_bytes {
                continue;
            }
            let room = usize::try_from(self.max_bytes - self.size).unwrap_or(usize::MAX);
            let n = room.min(data.len());
            if let Some(marks) = &mut self.marks {
                marks.mark(self.size, super::log_times::now_ms());
            }
            file.write_all(&data[..n])?;
            self.size += n as u64;
            data = &data[n..];
        }
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        self.size = 0;
        if let Some(marks) = &mut self.marks {
            marks.rotated();
            // The index follows its file; it only makes `--since` finer.
            let _ = shift(marks.path(), self.max_files);
        }
        shift(&self.path, self.max_files)
    }
}

/// `path` becomes `path.1`, `path.1` becomes `path.2`, ..., `max_files`
/// kept in all (the current one included).
fn shift(path: &Path, max_files: u32) -> io::Result<()> {
    let kept = max_files - 1;
    if kept == 0 {
        return remove_if_exists(path);
    }
    remove_if_exists(&numbered(path, kept))?;
    for i in (1..kept).rev() {
        rename_if_exists(&numbered(path, i), &numbered(path, i + 1))?;
    }
    rename_if_exists(path, &numbered(path, 1))
}

fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn rename_if_exists(from: &Path, to: &Path) -> io::Result<()> {
    match fs::rename(from, to) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Rotates a log file another process writes: a service's, opened with
/// `O_APPEND` and handed to it, so that its output reaches the disk with or
/// without the agent. Once the file holds `max_bytes`, its content is
/// copied to `.1` (older ones shifted, `max_files` kept in all) and it is
/// truncated in place; the writer goes on at its start. What it writes
/// between the copy and the truncation is lost. Blocking.
pub(crate) fn rotate_shared(path: &Path, max_bytes: u64, max_files: u32) -> io::Result<()> {
    let len = match fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if len < max_bytes {
        return Ok(());
    }
    let kept = max_files.saturating_sub(1);
    if kept > 0 {
        remove_if_exists(&numbered(path, kept))?;
        for i in (1..kept).rev() {
            rename_if_exists(&numbered(path, i), &numbered(path, i + 1))?;
        }
        fs::copy(path, numbered(path, 1))?;
    }
    OpenOptions::new().write(true).open(path)?.set_len(0)
}

/// The last `max` bytes of a task's output from its log files: stdout's,
/// then stderr's.
pub(crate) fn files_tail(logs_dir: &Path, max: usize) -> Vec<u8> {
    let mut tail = read_tail(&logs_dir.join(Stream::Stdout.file_name()), max);
    tail.extend(read_tail(&logs_dir.join(Stream::Stderr.file_name()), max));
    tail.split_off(tail.len().saturating_sub(max))
}

/// The last `max` bytes of a file (for the output tail of a task found in
/// the journal after a restart).
pub(crate) fn read_tail(path: &Path, max: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max as u64);
    let mut buf = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_ok() {
        let _ = file.take(max as u64).read_to_end(&mut buf);
    }
    buf
}

/// Text of bytes that may start in the middle of a UTF-8 character.
pub(crate) fn lossy_tail(bytes: &[u8]) -> String {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count();
    String::from_utf8_lossy(&bytes[skip..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let mut log = RotatingLog::new(path.clone(), 10, 3);
        for chunk in [&b"0123456789abc"[..], b"defghijklmnopqrstu", b"vwxyz"] {
            log.write(chunk).unwrap();
        }
        // 36 bytes in files of 10: the current file and two rotated ones.
        assert_eq!(fs::read(&path).unwrap(), b"uvwxyz");
        assert_eq!(fs::read(numbered(&path, 1)).unwrap(), b"klmnopqrst");
        assert_eq!(fs::read(numbered(&path, 2)).unwrap(), b"abcdefghij");
        assert!(!numbered(&path, 3).exists());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_file_over_its_cap_is_copied_away_and_truncated_keeping_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        for chunk in ["0123456789abc", "defghijklmnopqrstu", "vwxyz"] {
            fs::write(&path, chunk).unwrap();
            rotate_shared(&path, 10, 3).unwrap();
        }
        // Under the cap: left alone.
        assert_eq!(fs::read(&path).unwrap(), b"vwxyz");
        assert_eq!(fs::read(numbered(&path, 1)).unwrap(), b"defghijklmnopqrstu");
        assert_eq!(fs::read(numbered(&path, 2)).unwrap(), b"0123456789abc");
        fs::write(&path, "0123456789").unwrap();
        rotate_shared(&path, 10, 3).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"");
        assert_eq!(fs::read(numbered(&path, 2)).unwrap(), b"defghijklmnopqrstu");
        assert!(!numbered(&path, 3).exists());
        // One file in all: truncated only.
        let single = dir.path().join("stderr.log");
        fs::write(&single, "abcdefghij").unwrap();
        rotate_shared(&single, 4, 1).unwrap();
        assert_eq!(fs::read(&single).unwrap(), b"");
        assert!(!numbered(&single, 1).exists());
    }

    #[test]
    fn tail_drops_a_cut_character() {
        let bytes = "aé€".as_bytes(); // 1 + 2 + 3 bytes
        assert_eq!(lossy_tail(&bytes[2..]), "€");
    }

    #[test]
    fn tail_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        fs::write(&path, b"hello world").unwrap();
        assert_eq!(read_tail(&path, 5), b"world");
        assert_eq!(read_tail(&path, 100), b"hello world");
        assert!(read_tail(&dir.path().join("missing"), 5).is_empty());
    }
}
