//! The little of /proc the supervisor needs: a process's state, parent,
//! process group, session, start time and real uid, every process at once,
//! and the boot id.

use std::fs;

/// Fields of /proc/<pid>/stat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// Clock ticks after boot: with the pid, identifies a process.
    pub start_time: u64,
}

impl Stat {
    /// Neither a zombie nor dead: the process still runs code.
    pub(crate) fn is_live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

pub(crate) fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(line: &str) -> Option<Stat> {
    // The command name may contain spaces and parentheses: fields start
    // after the last ')'.
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Every process on the machine with its stat, in one pass over /proc.
pub(crate) fn snapshot() -> Vec<(i32, Stat)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect()
}

/// The real uid of a process, from /proc/<pid>/status. (Not the owner of
/// /proc/<pid>: a process that makes itself non-dumpable shows as root
/// there.)
pub(crate) fn real_uid(pid: i32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_real_uid(&status)
}

fn parse_real_uid(status: &str) -> Option<u32> {
    // The last Uid line: a process name cannot forge one after it, as the
    // name comes first (and the kernel escapes newlines in it anyway).
    let line = status.lines().rev().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process's environment holds `var` exactly (`NAME=value`).
pub(crate) fn environ_has(pid: i32, var: &[u8]) -> bool {
    fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == var))
}

pub(crate) fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Direct children of this process (every thread's), from
/// /proc/self/task/*/children.
pub(crate) fn own_children() -> Vec<i32> {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = fs::read_to_string(task.path().join("children")) {
            children.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    children
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_name_with_spaces_and_parens() {
        let line =
            "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            (s.state, s.ppid, s.pgrp, s.session, s.start_time),
            ('S', 1, 4242, 4242, 987654)
        );
    }

    #[test]
    fn the_real_uid_is_the_first_field_of_the_last_uid_line() {
        let status = "Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t5\nUid:\t70001\t70001\t70001\t70001\n";
        assert_eq!(parse_real_uid(status), Some(70001));
        assert_eq!(
            real_uid(std::process::id() as i32),
            Some(nix::unistd::getuid().as_raw())
        );
    }

    #[test]
    fn sees_every_process_and_its_environment() {
        let me = std::process::id() as i32;
        assert!(snapshot().iter().any(|(pid, _)| *pid == me));
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .env("K8S4R_PROCFS_TEST", "yes")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Until the child has exec'd, its environment is still ours.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !environ_has(pid, b"K8S4R_PROCFS_TEST=yes") {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never showed its environment"
            );
            std::thread::yield_now();
        }
        assert!(!environ_has(pid, b"K8S4R_PROCFS_TEST=no"));
        assert!(!environ_has(pid, b"K8S4R_PROCFS_TEST"));
        let stat = stat(pid).unwrap();
        assert_eq!(stat.ppid, me);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn reads_itself() {
        let me = stat(std::process::id() as i32).unwrap();
        assert!(me.is_live());
        assert!(!boot_id().is_empty());
    }
}
