//! The simulated fleet, whichever way it runs: in this process, or above
//! [`shards::per_process`] robots in simulator processes of their own.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s4r_sim::{Fleet, Run, SimConfig};
use k8s4r_testbed::bench_arg as arg;

use crate::{shards, sim, Cluster, TOKEN};

pub enum Sims {
    Here(Fleet),
    Shards(shards::Shards),
}

/// How the robots of a run behave.
pub struct Behaviour {
    pub heartbeat: Duration,
    /// How long a task runs, from..to (each picks a time in between).
    pub tasks: (Duration, Duration),
}

impl Behaviour {
    /// Heartbeats every `heartbeat`, the simulator's short tasks.
    pub fn heartbeat(heartbeat: Duration) -> Behaviour {
        Behaviour {
            heartbeat,
            tasks: SimConfig::default().task_duration,
        }
    }
}

impl Sims {
    /// The fleet for `cluster`'s brokers, connecting at `--connect-rate`
    /// robots a second (0: all at once).
    pub fn start(cluster: &Cluster, robots: usize, behaviour: Behaviour) -> Sims {
        let connect_rate = u32::try_from(arg("--connect-rate", 0)).unwrap_or(0);
        if cluster.edges.is_empty() {
            Sims::Here(Fleet::start(SimConfig {
                connect_rate,
                task_duration: behaviour.tasks,
                ..sim(cluster, robots, behaviour.heartbeat)
            }))
        } else {
            Sims::Shards(shards::Shards::start(
                &cluster.edges,
                &behaviour,
                TOKEN,
                connect_rate,
            ))
        }
    }

    pub fn connects(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.connects.load(Ordering::Relaxed) as u64,
            Sims::Shards(s) => s.connects(),
        }
    }

    pub fn online(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.online.load(Ordering::Relaxed) as u64,
            Sims::Shards(s) => s.online(),
        }
    }

    pub fn heartbeats(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.heartbeats.load(Ordering::Relaxed),
            Sims::Shards(s) => s.heartbeats(),
        }
    }

    /// MQTT payload bytes sent and received.
    pub fn bytes(&self) -> u64 {
        match self {
            Sims::Here(f) => {
                f.counters.bytes_out.load(Ordering::Relaxed) + f.counters.bytes_in.load(Ordering::Relaxed)
            }
            Sims::Shards(s) => s.bytes(),
        }
    }

    pub fn dispatches(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.dispatches.load(Ordering::Relaxed),
            Sims::Shards(s) => s.dispatches(),
        }
    }

    /// Dispatches of an attempt a robot had already taken, refused by its
    /// fence (a task that ran twice shows in [`Sims::runs`]).
    pub fn resent_dispatches(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.duplicate_dispatches.load(Ordering::Relaxed),
            Sims::Shards(s) => s.resent_dispatches(),
        }
    }

    pub fn finished(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.finished.load(Ordering::Relaxed),
            Sims::Shards(s) => s.finished(),
        }
    }

    /// Status updates sent again because the broker did not confirm them.
    pub fn resent_statuses(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.resent_statuses.load(Ordering::Relaxed),
            Sims::Shards(s) => s.resent_statuses(),
        }
    }

    /// Dispatches the robots refused as come after their deadline.
    pub fn expired_dispatches(&self) -> u64 {
        match self {
            Sims::Here(f) => f.counters.expired_dispatches.load(Ordering::Relaxed),
            Sims::Shards(s) => s.expired_dispatches(),
        }
    }

    /// The processes that simulate the robots: this one, or the shards.
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Sims::Here(_) => vec![std::process::id()],
            Sims::Shards(s) => s.pids(),
        }
    }

    /// How many robots were answered Online at or after `since`.
    pub fn registered_since(&self, since: Instant) -> usize {
        match self {
            Sims::Here(f) => f.registered_since(since),
            Sims::Shards(s) => s.registered_since(since),
        }
    }

    /// Every run of an attempt on a robot so far, every process's.
    pub fn runs(&self) -> Vec<Run> {
        match self {
            Sims::Here(f) => f.runs(),
            Sims::Shards(s) => s.runs(),
        }
    }

    pub fn vanish(&self, n: usize) {
        match self {
            Sims::Here(f) => f.vanish(n),
            Sims::Shards(s) => s.vanish(n),
        }
    }

    pub async fn stop(self) {
        match self {
            Sims::Here(f) => f.stop().await,
            Sims::Shards(s) => tokio::task::block_in_place(|| s.stop()),
        }
    }
}
