//! What the robots' own record of their runs says: tasks finished, tasks
//! run twice, and how long each Job waited for its task to start.

use std::collections::{HashMap, HashSet};

use k8s4r_sim::{End, Run};
use kube::ResourceExt;

/// Tasks a run finished (completed or failed; a cancelled run did not):
/// counted by task, so a task run twice counts once.
pub fn finished_tasks(runs: &[Run]) -> usize {
    runs.iter()
        .filter(|r| matches!(r.end, Some((_, End::Completed | End::Failed))))
        .map(|r| r.uid.as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// Tasks whose current attempt a robot reported completed and the cluster
/// does not show completed: a status lost. (A replaced attempt's late
/// report is refused by design, so only the current attempt counts.)
pub fn lost_statuses(tasks: &[k8s4r_api::Task], runs: &[Run]) -> usize {
    let completed: HashSet<(&str, u32)> = runs
        .iter()
        .filter(|r| matches!(r.end, Some((_, End::Completed))))
        .map(|r| (r.uid.as_str(), r.attempt))
        .collect();
    tasks
        .iter()
        .filter(|t| {
            let status = t.status.as_ref();
            let attempt = status.map_or(0, |s| s.attempt);
            let reported = t
                .metadata
                .uid
                .as_deref()
                .is_some_and(|uid| completed.contains(&(uid, attempt)));
            reported && status.and_then(|s| s.state) != Some(k8s4r_api::TaskState::Completed)
        })
        .count()
}

/// What the robots' runs say about running twice.
pub struct Twice {
    /// Tasks two of whose runs were under way at the same moment.
    pub at_once: usize,
    /// Tasks completed by more than one run.
    pub completed: usize,
    /// Tasks that ran twice either way (each counted once).
    pub tasks: usize,
}

impl Twice {
    pub fn of(runs: &[Run]) -> Twice {
        let mut by_task: HashMap<&str, Vec<&Run>> = HashMap::new();
        for run in runs {
            by_task.entry(&run.uid).or_default().push(run);
        }
        let mut twice = Twice {
            at_once: 0,
            completed: 0,
            tasks: 0,
        };
        for runs in by_task.values() {
            let at_once = runs
                .iter()
                .enumerate()
                .any(|(i, a)| runs[i + 1..].iter().any(|b| a.overlaps(b)));
            let completed = runs
                .iter()
                .filter(|r| matches!(r.end, Some((_, End::Completed))))
                .count()
                > 1;
            twice.at_once += usize::from(at_once);
            twice.completed += usize::from(completed);
            twice.tasks += usize::from(at_once || completed);
        }
        twice
    }
}

/// Created → started of each Job, in milliseconds, sorted: the start is
/// the robot's start of the first run of the Job's task. A Job whose task
/// never started counts with the time it has waited until `now`, so the
/// percentiles are lower bounds, not flattered.
pub struct Latencies {
    sorted: Vec<f64>,
    /// Jobs whose task a robot started.
    pub started: usize,
}

impl Latencies {
    pub fn of(
        tasks: &[k8s4r_api::Task],
        runs: &[Run],
        created: &HashMap<String, jiff::Timestamp>,
        now: jiff::Timestamp,
    ) -> Latencies {
        let mut first_start: HashMap<&str, jiff::Timestamp> = HashMap::new();
        for run in runs {
            let start = first_start.entry(&run.uid).or_insert(run.start);
            *start = (*start).min(run.start);
        }
        let ms =
            |from: &jiff::Timestamp, to: &jiff::Timestamp| to.duration_since(*from).as_secs_f64() * 1000.0;
        let mut sorted = Vec::with_capacity(created.len());
        let mut waiting = created.clone();
        for t in tasks {
            let job = t
                .labels()
                .get(k8s4r_api::names::LABEL_JOB)
                .cloned()
                .unwrap_or_default();
            let start = t.metadata.uid.as_deref().and_then(|uid| first_start.get(uid));
            if let (Some(at), Some(start)) = (created.get(&job), start) {
                sorted.push(ms(at, start));
                waiting.remove(&job);
            }
        }
        let started = sorted.len();
        sorted.extend(waiting.values().map(|at| ms(at, &now)));
        sorted.sort_by(f64::total_cmp);
        Latencies { sorted, started }
    }

    /// Where the time went, for the Jobs whose task started: created →
    /// placed (the manager: TaskGroup, Task, placement; the Task's
    /// `dispatchTime`) and placed → started (the server's send, MQTT and
    /// the robot), each as `p50/p99` ms.
    pub fn stages(
        tasks: &[k8s4r_api::Task],
        runs: &[Run],
        created: &HashMap<String, jiff::Timestamp>,
    ) -> String {
        let mut first_start: HashMap<&str, jiff::Timestamp> = HashMap::new();
        for run in runs {
            let start = first_start.entry(&run.uid).or_insert(run.start);
            *start = (*start).min(run.start);
        }
        let ms = |from: jiff::Timestamp, to: jiff::Timestamp| to.duration_since(from).as_secs_f64() * 1000.0;
        let (mut placing, mut sending) = (Vec::new(), Vec::new());
        for t in tasks {
            let job = t.labels().get(k8s4r_api::names::LABEL_JOB);
            let at = job.and_then(|job| created.get(job));
            let placed = t.status.as_ref().and_then(|s| s.dispatch_time);
            let start = t.metadata.uid.as_deref().and_then(|uid| first_start.get(uid));
            if let (Some(at), Some(placed), Some(start)) = (at, placed, start) {
                placing.push(ms(*at, placed));
                sending.push(ms(placed, *start));
            }
        }
        let pcts = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let l = Latencies {
                sorted: v,
                started: 0,
            };
            if l.sorted.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.1}/{:.1}", l.pct(50.0), l.pct(99.0))
            }
        };
        format!(
            "created → placed p50/p99 {} ms, placed → started {} ms (the last attempt's placement)",
            pcts(placing),
            pcts(sending)
        )
    }

    /// The `p`th percentile, nearest rank.
    pub fn pct(&self, p: f64) -> f64 {
        let rank = ((p / 100.0) * self.sorted.len() as f64).ceil() as usize;
        self.sorted[rank.clamp(1, self.sorted.len()) - 1]
    }
}
