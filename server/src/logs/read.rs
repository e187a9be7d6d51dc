//! The log relay's decisions, without I/O: which attempt a read is of and
//! on which robot, and, for each chunk the robot sends and each tick of the
//! relay's clock, what to tell the reader and the robot. The shell in
//! [`super`] performs the steps (writes to the reader's connection,
//! publishes to the robot); it decides nothing itself.

use std::time::{Duration, Instant};

use k8s4r_api::protocol::{LogChunk, LogStream};
use k8s4r_api::Task;

/// A read (not a follow) that hears nothing from its robot this long ends.
pub(crate) const IDLE: Duration = Duration::from_secs(10);
/// After the attempt ended, how long to wait for the last of its output.
pub(crate) const DRAIN: Duration = Duration::from_millis(1500);
/// Silence that says the robot has sent what it had (its reader polls
/// faster than this).
const QUIET: Duration = Duration::from_millis(500);
/// Delivered chunks between two acknowledgements.
pub(crate) const ACK_EVERY: u64 = 32;

/// The attempt a read is of, and the robot that has its output; `Err` says
/// why there is none (the reader's mistake, answered 400).
pub(crate) fn attempt_to_read(task: &Task, name: &str, previous: bool) -> Result<(u32, String), String> {
    let st = task.status.clone().unwrap_or_default();
    let (attempt, robot) = if previous {
        let before = st.attempt.saturating_sub(1);
        let robot = st
            .attempts
            .iter()
            .find(|a| a.attempt == before)
            .and_then(|a| a.robot.clone());
        (before, robot)
    } else {
        (st.attempt, st.robot.clone().or(task.spec.target_robot.clone()))
    };
    match robot.filter(|_| attempt > 0) {
        Some(robot) => Ok((attempt, robot)),
        None => {
            let why = st.message.unwrap_or_else(|| "waiting for a robot".into());
            let what = if previous {
                "has no previous attempt"
            } else {
                "has not been placed on a robot yet"
            };
            Err(format!("task {name} {what} ({why})"))
        }
    }
}

/// The stream a reader asked for (`stdout` when it named none).
pub(crate) fn stream_asked(asked: Option<&str>) -> Result<LogStream, String> {
    match asked {
        None | Some("" | "stdout") => Ok(LogStream::Stdout),
        Some("stderr") => Ok(LogStream::Stderr),
        Some("all") => Ok(LogStream::All),
        Some(other) => Err(format!("stream must be stdout, stderr or all, not {other:?}")),
    }
}

/// What a relay says to its reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Output(String),
    /// Some output is missing.
    Warning(String),
    /// The answer is complete.
    End,
}

/// One thing for the shell to do, in order. Once a `Say` cannot be
/// delivered (the reader is gone), the shell does nothing more: the relay
/// ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Say(Piece),
    /// Tell the robot this many chunks reached the reader (it may send
    /// more).
    Ack(u64),
    /// The relay ends: the shell closes the reader and stops the robot's.
    Finish,
}

/// One reader's relay: what it has seen of the robot's chunks.
#[derive(Debug)]
pub(crate) struct Relaying {
    follow: bool,
    robot: String,
    next_seq: u64,
    acked: u64,
    caught_up: bool,
    last_chunk: Instant,
    over_since: Option<Instant>,
}

impl Relaying {
    /// A relay that starts at `now` (a follow waits for the history to be
    /// through before it may end).
    pub(crate) fn new(follow: bool, robot: &str, now: Instant) -> Self {
        Self {
            follow,
            robot: robot.to_owned(),
            next_seq: 0,
            acked: 0,
            caught_up: !follow,
            last_chunk: now,
            over_since: None,
        }
    }

    /// The count a timed renewal acknowledges: everything delivered.
    pub(crate) fn delivered(&self) -> u64 {
        self.next_seq
    }

    /// A chunk from the robot.
    pub(crate) fn on_chunk(&mut self, chunk: LogChunk, now: Instant) -> Vec<Step> {
        self.last_chunk = now;
        if chunk.seq < self.next_seq {
            // Numbered from the start again: not the reader that began.
            let note = "the robot's log reader started over; stopping".to_owned();
            return vec![Step::Say(Piece::Warning(note)), Step::Finish];
        }
        let mut steps = Vec::new();
        self.caught_up |= chunk.caught_up;
        if chunk.seq > self.next_seq {
            let note = format!("{} chunk(s) of output lost on the way", chunk.seq - self.next_seq);
            steps.push(Step::Say(Piece::Warning(note)));
        }
        self.next_seq = chunk.seq + 1;
        if chunk.skipped > 0 {
            let note = format!("{} bytes of output skipped on the robot", chunk.skipped);
            steps.push(Step::Say(Piece::Warning(note)));
        }
        if !chunk.data.is_empty() {
            steps.push(Step::Say(Piece::Output(chunk.data)));
        }
        if let Some(error) = chunk.error {
            steps.extend([Step::Say(Piece::Warning(error)), Step::Finish]);
            return steps;
        }
        if chunk.eof {
            steps.extend([Step::Say(Piece::End), Step::Finish]);
            return steps;
        }
        // Delivered to the reader's connection: the robot may send more.
        // A lost acknowledgement is repaired by the next, or by the timed
        // renewal, which carries the same count.
        if self.next_seq - self.acked >= ACK_EVERY {
            self.acked = self.next_seq;
            steps.push(Step::Ack(self.acked));
        }
        steps
    }

    /// The relay's clock ticked at `now`; `over` says whether the attempt
    /// read has ended (or its Task is gone).
    pub(crate) fn on_tick(&mut self, now: Instant, over: bool) -> Vec<Step> {
        let silent = now.saturating_duration_since(self.last_chunk);
        if !self.follow {
            // A read has its output coming: silence is a robot gone mid-read.
            if silent >= IDLE {
                let note = format!("robot {} stopped answering; the output is cut short", self.robot);
                return vec![Step::Say(Piece::Warning(note)), Step::Finish];
            }
            return Vec::new();
        }
        if !over {
            return Vec::new();
        }
        let since = now.saturating_duration_since(*self.over_since.get_or_insert(now));
        // The last output arrives within the robot's poll, once what was on
        // disk is through.
        let quiet = silent >= QUIET;
        if self.caught_up && since >= DRAIN && quiet {
            return vec![Step::Say(Piece::End), Step::Finish];
        }
        if since >= IDLE && quiet {
            let note = "the task ended before all of its output arrived".to_owned();
            return vec![Step::Say(Piece::Warning(note)), Step::Finish];
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{AttemptRecord, TaskStatus};

    fn chunk(seq: u64, data: &str) -> LogChunk {
        LogChunk {
            v: k8s4r_api::protocol::PROTOCOL_VERSION,
            request_id: "r".into(),
            seq,
            data: data.into(),
            skipped: 0,
            eof: false,
            caught_up: false,
            error: None,
        }
    }

    fn said(steps: &[Step]) -> Vec<Piece> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Say(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn output_is_relayed_in_order_and_a_gap_is_said_before_what_follows_it() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(false, "rb1", t0);
        assert_eq!(
            relay.on_chunk(chunk(0, "a"), t0),
            vec![Step::Say(Piece::Output("a".into()))]
        );
        let steps = relay.on_chunk(chunk(3, "d"), t0);
        assert_eq!(
            said(&steps),
            vec![
                Piece::Warning("2 chunk(s) of output lost on the way".into()),
                Piece::Output("d".into())
            ]
        );
        assert_eq!(relay.delivered(), 4);
    }

    #[test]
    fn a_reader_that_starts_over_ends_the_relay() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(true, "rb1", t0);
        relay.on_chunk(chunk(0, "a"), t0);
        relay.on_chunk(chunk(1, "b"), t0);
        let steps = relay.on_chunk(chunk(0, "a"), t0);
        assert_eq!(steps.last(), Some(&Step::Finish));
        assert!(matches!(&steps[0], Step::Say(Piece::Warning(w)) if w.contains("started over")));
    }

    #[test]
    fn the_robot_is_acknowledged_every_window_step_and_not_between() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(true, "rb1", t0);
        let acks: Vec<u64> = (0..100)
            .flat_map(|seq| relay.on_chunk(chunk(seq, "x"), t0))
            .filter_map(|s| match s {
                Step::Ack(n) => Some(n),
                _ => None,
            })
            .collect();
        assert_eq!(acks, vec![32, 64, 96]);
    }

    #[test]
    fn an_error_or_the_end_of_output_finishes_after_what_came_with_it() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(false, "rb1", t0);
        let mut last = chunk(0, "tail");
        last.eof = true;
        assert_eq!(
            relay.on_chunk(last, t0),
            vec![
                Step::Say(Piece::Output("tail".into())),
                Step::Say(Piece::End),
                Step::Finish
            ]
        );
        let mut relay = Relaying::new(false, "rb1", t0);
        let mut failed = chunk(0, "");
        failed.error = Some("no such attempt".into());
        assert_eq!(
            relay.on_chunk(failed, t0),
            vec![Step::Say(Piece::Warning("no such attempt".into())), Step::Finish]
        );
    }

    #[test]
    fn a_read_whose_robot_falls_silent_is_cut_short_after_the_idle_time_not_before() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(false, "rb1", t0);
        relay.on_chunk(chunk(0, "a"), t0);
        assert!(relay
            .on_tick(t0 + IDLE - Duration::from_millis(1), false)
            .is_empty());
        let steps = relay.on_tick(t0 + IDLE, false);
        assert_eq!(steps.last(), Some(&Step::Finish));
        assert!(
            matches!(&steps[0], Step::Say(Piece::Warning(w)) if w.contains("robot rb1 stopped answering"))
        );
    }

    #[test]
    fn a_follow_ends_cleanly_once_the_attempt_is_over_caught_up_drained_and_quiet() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(true, "rb1", t0);
        // A follow never ends on silence alone while the attempt runs.
        assert!(relay.on_tick(t0 + IDLE * 10, false).is_empty());
        let mut history = chunk(0, "a");
        history.caught_up = true;
        relay.on_chunk(history, t0);
        let over_at = t0 + Duration::from_secs(1);
        assert!(
            relay.on_tick(over_at, true).is_empty(),
            "the drain starts when the end is seen"
        );
        assert!(relay
            .on_tick(over_at + DRAIN - Duration::from_millis(1), true)
            .is_empty());
        assert_eq!(
            relay.on_tick(over_at + DRAIN, true),
            vec![Step::Say(Piece::End), Step::Finish]
        );
    }

    #[test]
    fn a_follow_that_never_caught_up_says_its_output_is_incomplete() {
        let t0 = Instant::now();
        let mut relay = Relaying::new(true, "rb1", t0);
        relay.on_chunk(chunk(0, "a"), t0);
        assert!(relay.on_tick(t0, true).is_empty());
        assert!(
            relay.on_tick(t0 + DRAIN, true).is_empty(),
            "not caught up: no clean end"
        );
        let steps = relay.on_tick(t0 + IDLE, true);
        assert!(
            matches!(&steps[0], Step::Say(Piece::Warning(w)) if w.contains("ended before all of its output"))
        );
    }

    fn task(attempt: u32, robot: Option<&str>, attempts: Vec<AttemptRecord>) -> Task {
        let mut task = Task::new("t", Default::default());
        task.status = Some(TaskStatus {
            attempt,
            robot: robot.map(str::to_owned),
            attempts,
            ..TaskStatus::default()
        });
        task
    }

    #[test]
    fn a_read_is_of_the_current_attempt_or_with_previous_the_one_before_on_its_own_robot() {
        let earlier = AttemptRecord {
            start_time: None,
            attempt: 1,
            robot: Some("rb1".into()),
            state: k8s4r_api::TaskState::Failed,
            exit_code: Some(1),
            reason: None,
            message: None,
            finish_time: None,
        };
        let t = task(2, Some("rb2"), vec![earlier]);
        assert_eq!(attempt_to_read(&t, "t", false), Ok((2, "rb2".into())));
        assert_eq!(attempt_to_read(&t, "t", true), Ok((1, "rb1".into())));
        let first = task(1, Some("rb1"), Vec::new());
        assert!(attempt_to_read(&first, "t", true)
            .unwrap_err()
            .contains("has no previous attempt"));
        let waiting = task(0, None, Vec::new());
        assert!(attempt_to_read(&waiting, "t", false)
            .unwrap_err()
            .contains("has not been placed on a robot yet (waiting for a robot)"));
    }

    #[test]
    fn a_stream_is_stdout_stderr_or_all_and_nothing_else() {
        assert_eq!(stream_asked(None), Ok(LogStream::Stdout));
        assert_eq!(stream_asked(Some("all")), Ok(LogStream::All));
        assert!(stream_asked(Some("stdin")).is_err());
    }
}
