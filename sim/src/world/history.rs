//! The history of a simulated run: what happened, in order, as the
//! checker reads it and a person reads a failing seed.

use std::fmt;

use k8s4r_api::{TaskReason, TaskState};

use super::{Fault, Ms};

/// One thing that happened.
#[derive(Clone, Debug)]
pub struct Entry {
    pub at: Ms,
    pub what: What,
}

/// What happened.
#[derive(Clone, Debug)]
pub enum What {
    Fault(Fault),
    /// A task process started on a robot.
    Start {
        robot: usize,
        uid: String,
        attempt: u32,
    },
    /// It ended.
    Exit {
        robot: usize,
        uid: String,
        attempt: u32,
        how: String,
    },
    /// The robot was told the cluster recorded this final status.
    Recorded {
        robot: usize,
        uid: String,
        attempt: u32,
        state: TaskState,
    },
    /// The manager placed an attempt.
    Placed {
        uid: String,
        attempt: u32,
        robot: usize,
    },
    /// A write failing an attempt landed (the manager's, or the server's
    /// from a robot's list).
    Failed {
        uid: String,
        attempt: u32,
        reason: TaskReason,
    },
    /// The server applied a robot's status, or ignored it.
    Status {
        uid: String,
        attempt: u32,
        state: TaskState,
        outcome: &'static str,
    },
    /// An agent process started or died.
    Agent {
        robot: usize,
        up: bool,
    },
    /// A server replica started or died.
    Server {
        replica: usize,
        up: bool,
    },
    /// A manager (`kind` 0) or server (1) replica took its kind's leader
    /// Lease, or stepped down.
    Leader {
        kind: usize,
        who: usize,
        leads: bool,
    },
}

impl Entry {
    /// Whether this entry concerns the Task `uid` (faults and restarts
    /// concern every Task).
    pub fn concerns(&self, uid: &str) -> bool {
        match &self.what {
            What::Start { uid: u, .. }
            | What::Exit { uid: u, .. }
            | What::Recorded { uid: u, .. }
            | What::Placed { uid: u, .. }
            | What::Failed { uid: u, .. }
            | What::Status { uid: u, .. } => u == uid,
            What::Fault(_) | What::Agent { .. } | What::Server { .. } | What::Leader { .. } => true,
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>9.3}s ", self.at as f64 / 1000.0)?;
        match &self.what {
            What::Fault(fault) => write!(f, "FAULT {fault:?}"),
            What::Start { robot, uid, attempt } => write!(f, "rb{robot} starts {uid}#{attempt}"),
            What::Exit {
                robot,
                uid,
                attempt,
                how,
            } => write!(f, "rb{robot} {uid}#{attempt} ended: {how}"),
            What::Recorded {
                robot,
                uid,
                attempt,
                state,
            } => {
                write!(f, "rb{robot} told {uid}#{attempt} {} is recorded", state.as_str())
            }
            What::Placed { uid, attempt, robot } => write!(f, "manager places {uid}#{attempt} on rb{robot}"),
            What::Failed { uid, attempt, reason } => write!(f, "cluster failed {uid}#{attempt}: {reason:?}"),
            What::Status {
                uid,
                attempt,
                state,
                outcome,
            } => {
                write!(f, "server: {uid}#{attempt} {} {outcome}", state.as_str())
            }
            What::Agent { robot, up } => {
                write!(f, "rb{robot} agent {}", if *up { "starts" } else { "killed" })
            }
            What::Server { replica, up } => {
                write!(f, "server-{replica} {}", if *up { "starts" } else { "killed" })
            }
            What::Leader { kind, who, leads } => {
                let kind = if *kind == 0 { "manager" } else { "server" };
                write!(f, "{kind}-{who} {}", if *leads { "leads" } else { "steps down" })
            }
        }
    }
}
