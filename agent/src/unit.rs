//! Whether systemd is stopping the agent's unit for good or restarting it,
//! for `--stop-left-tasks` (the unit's `ExecStopPost`, which runs after
//! every end of the agent, a restart's too).
//!
//! A restart (`systemctl restart`, an upgrade's switch, a crash or a hang
//! that `Restart=always` brings back) leaves the tasks running for the
//! next agent, which re-adopts them. A stop for good (`systemctl stop`,
//! the machine shutting down) stops them: nothing would supervise or
//! fence them. systemd tells its `ExecStopPost` which it is only through
//! the job it runs on the unit: `systemctl list-jobs` shows a `stop` job
//! then, a `restart` job for a restart, and none when the unit restarts on
//! its own after the agent ended. When it cannot be told (systemctl
//! fails), the stop is taken for good: a task left with no agent is the
//! worse mistake.

/// How the unit ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitEnd {
    /// Not run by systemd as a unit's `ExecStopPost`: a person asked.
    NotAUnit,
    /// systemd stops the unit (or cannot say it does not).
    StopsForGood,
    /// systemd restarts the unit, asked or on its own.
    Restarts,
}

/// How the unit this process belongs to ends (see the module doc).
pub fn how_it_ends() -> UnitEnd {
    if std::env::var_os("SERVICE_RESULT").is_none() {
        return UnitEnd::NotAUnit;
    }
    // The unit names itself (`Environment=K8S4R_UNIT=%n`); else its
    // name is read off the cgroup.
    let named = std::env::var("K8S4R_UNIT").ok().filter(|u| !u.is_empty());
    let Some(unit) = named.or_else(|| {
        std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|c| unit_of(&c))
    }) else {
        return UnitEnd::StopsForGood;
    };
    let jobs = std::process::Command::new("systemctl")
        .args(["list-jobs", "--no-legend", "--plain", "--no-pager", &unit])
        .stderr(std::process::Stdio::null())
        .output();
    match jobs {
        Ok(out) if out.status.success() => from_jobs(&String::from_utf8_lossy(&out.stdout), &unit),
        _ => UnitEnd::StopsForGood,
    }
}

/// The service unit a process is in, from its `/proc/self/cgroup`
/// (systemd runs a delegated unit's control commands in `.control`).
fn unit_of(cgroup: &str) -> Option<String> {
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    path.rsplit('/')
        .find(|c| c.ends_with(".service"))
        .map(str::to_owned)
}

/// What `systemctl list-jobs` says of `unit`: JOB UNIT TYPE STATE lines.
fn from_jobs(listing: &str, unit: &str) -> UnitEnd {
    let job = listing.lines().find_map(|line| {
        let mut columns = line.split_whitespace();
        let (_, name, kind) = (columns.next()?, columns.next()?, columns.next()?);
        (name == unit).then_some(kind)
    });
    match job {
        Some("stop") => UnitEnd::StopsForGood,
        // A restart job, or none: the unit comes back on its own.
        _ => UnitEnd::Restarts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_is_read_off_the_cgroup_of_its_control_commands() {
        let control = "0::/system.slice/k8s4r-agent.service/.control\n";
        assert_eq!(unit_of(control).as_deref(), Some("k8s4r-agent.service"));
        let plain = "0::/system.slice/k8s4r-agent.service\n";
        assert_eq!(unit_of(plain).as_deref(), Some("k8s4r-agent.service"));
        assert_eq!(unit_of("0::/user.slice/session-1.scope\n"), None);
    }

    #[test]
    fn only_a_stop_job_stops_for_good() {
        let unit = "k8s4r-agent.service";
        let stop = "812 k8s4r-agent.service stop running\n813 shutdown.target start waiting\n";
        assert_eq!(from_jobs(stop, unit), UnitEnd::StopsForGood);
        let restart = "901 k8s4r-agent.service restart running\n";
        assert_eq!(from_jobs(restart, unit), UnitEnd::Restarts);
        // A crash: no job while ExecStopPost runs; Restart=always follows.
        assert_eq!(from_jobs("", unit), UnitEnd::Restarts);
        let other = "5 other.service stop running\n";
        assert_eq!(from_jobs(other, unit), UnitEnd::Restarts);
    }
}
