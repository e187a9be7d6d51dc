//! The little of /proc the supervisor needs: a process's state, parent,
//! process group and start time, and the boot id.

use std::fs;

/// Fields of /proc/<pid>/stat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
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
        start_time: fields.get(19)?.parse().ok()?,
    })
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
        assert_eq!((s.state, s.ppid, s.pgrp, s.start_time), ('S', 1, 4242, 987654));
    }

    #[test]
    fn reads_itself() {
        let me = stat(std::process::id() as i32).unwrap();
        assert!(me.is_live());
        assert!(!boot_id().is_empty());
    }
}
