//! The task logger: one small process per task that writes the task's
//! output to its rotated log files, as Nomad's logmon and conmon do. The
//! agent starts it (its own binary, `--task-logger DIR MAX_BYTES
//! MAX_FILES`) with the read ends of the task's stdout pipe (its stdin)
//! and stderr pipe (fd 3), in a session of its own and outside the task's
//! cgroup. It ends when both pipes are closed: when the task and
//! everything it started are gone.
//!
//! So the output of a task reaches its files while no agent runs (a
//! restart, an upgrade), and a disk that stops answering stalls only the
//! logger: the task then waits on a full pipe, a wait its stop signal
//! interrupts, where a task writing to the disk itself could not be
//! killed until the disk answered.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::supervisor::logs::{RotatingLog, Stream};

/// Bytes read from a pipe at a time.
const CHUNK: usize = 64 * 1024;

/// The logger's arguments after its flag: the logs directory and the caps.
pub(crate) fn args(logs_dir: &std::path::Path, max_bytes: u64, max_files: u32) -> Vec<OsString> {
    vec![
        logs_dir.as_os_str().to_owned(),
        max_bytes.to_string().into(),
        max_files.to_string().into(),
    ]
}

/// The logger's whole life; `args` are its arguments after its flag.
pub fn main(args: &[OsString]) -> ExitCode {
    let parsed = match args {
        [dir, max_bytes, max_files] => max_bytes
            .to_str()
            .and_then(|b| b.parse::<u64>().ok())
            .zip(max_files.to_str().and_then(|f| f.parse::<u32>().ok()))
            .map(|(b, f)| (PathBuf::from(dir), b, f)),
        _ => None,
    };
    let Some((dir, max_bytes, max_files)) = parsed else {
        eprintln!("k8s4r task logger: usage: --task-logger DIR MAX_BYTES MAX_FILES");
        return ExitCode::from(2);
    };
    let stdout = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => {
            eprintln!("k8s4r task logger: no stdout pipe: {e}");
            return ExitCode::from(2);
        }
    };
    let stderr = k8s4r_drivers::shim::take_fd(k8s4r_drivers::shim::REPORT_FD);
    let logs = [Stream::Stdout, Stream::Stderr]
        .map(|s| RotatingLog::new(dir.join(s.file_name()), max_bytes, max_files));
    copy([Some(stdout), Some(stderr)], logs);
    ExitCode::SUCCESS
}

/// Copies each pipe to its log until both are closed. A log that cannot be
/// written is said once and its output dropped: the task never waits on
/// a broken log.
fn copy(mut pipes: [Option<std::fs::File>; 2], mut logs: [RotatingLog; 2]) {
    let mut buf = vec![0u8; CHUNK];
    let mut failed = [false; 2];
    loop {
        let open: Vec<usize> = (0..2).filter(|i| pipes[*i].is_some()).collect();
        if open.is_empty() {
            return;
        }
        let ready: Vec<usize> = {
            let mut fds: Vec<PollFd> = open
                .iter()
                .filter_map(|i| pipes[*i].as_ref())
                .map(|p| PollFd::new(p.as_fd(), PollFlags::POLLIN))
                .collect();
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    eprintln!("k8s4r task logger: poll: {e}");
                    return;
                }
            }
            open.iter()
                .zip(&fds)
                .filter(|(_, fd)| fd.revents().is_some_and(|r| !r.is_empty()))
                .map(|(i, _)| *i)
                .collect()
        };
        for i in ready {
            let Some(pipe) = pipes[i].as_mut() else {
                continue;
            };
            match pipe.read(&mut buf) {
                Ok(0) => pipes[i] = None,
                Ok(n) => {
                    if let Err(e) = logs[i].write(&buf[..n]) {
                        if !std::mem::replace(&mut failed[i], true) {
                            eprintln!("k8s4r task logger: cannot write a log, its output is dropped: {e}");
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => pipes[i] = None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_pipes_reach_their_rotated_logs_until_both_close() {
        let dir = tempfile::tempdir().unwrap();
        let (out_r, out_w) = nix::unistd::pipe().unwrap();
        let (err_r, err_w) = nix::unistd::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let (mut out, mut err) = (std::fs::File::from(out_w), std::fs::File::from(err_w));
            for i in 0..20 {
                writeln!(out, "out {i:02}").unwrap();
                writeln!(err, "err {i:02}").unwrap();
            }
        });
        let logs =
            [Stream::Stdout, Stream::Stderr].map(|s| RotatingLog::new(dir.path().join(s.file_name()), 70, 2));
        copy([Some(out_r.into()), Some(err_r.into())], logs);
        writer.join().unwrap();
        // 20 lines of 7 bytes in files of 70: the last 10 and the 10 before.
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        let lines = |s: &str, from: u32| {
            (from..from + 10)
                .map(|i| format!("{s} {i:02}\n"))
                .collect::<String>()
        };
        assert_eq!(read("stdout.log.1"), lines("out", 0));
        assert_eq!(read("stdout.log"), lines("out", 10));
        assert_eq!(read("stderr.log"), lines("err", 10));
    }
}
