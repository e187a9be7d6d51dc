//! PeriodicJob schedules: when runs are due, read in the job's time zone.
//! Plain functions over timestamps; the PeriodicJob controller
//! ([`crate::controllers::periodic`]) acts on them.
//!
//! The cron expression is parsed by `croner` (standard five fields, or six
//! with seconds first, and the `@daily` family). It matches wall-clock time
//! in the schedule's zone, resolved by jiff from the system's tz database:
//! a time skipped by a DST change runs at the first instant after the gap,
//! and a time that occurs twice runs once, at its first occurrence.

use std::str::FromStr;
use std::time::Duration;

use croner::Cron;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};
use k8s4r_api::validation::{validate_periodic_job_name, validate_periodic_job_spec};
use k8s4r_api::{ConcurrencyPolicy, PeriodicJobSpec};

/// Validates a PeriodicJob (its name and spec) and parses its schedule:
/// every problem at once, each with its field.
pub fn schedule_of(name: &str, spec: &PeriodicJobSpec) -> Result<Schedule, String> {
    let mut problems: Vec<String> = validate_periodic_job_name(name)
        .err()
        .map(|e| format!("metadata.name: {e}"))
        .into_iter()
        .collect();
    problems.extend(validate_periodic_job_spec(spec).err().map(|e| e.to_string()));
    let schedule = if spec.schedule.trim().is_empty() {
        None
    } else {
        match Schedule::parse(&spec.schedule, spec.time_zone.as_deref()) {
            Ok(s) => Some(s),
            Err(e) => {
                problems.push(format!("spec.schedule: {e}"));
                None
            }
        }
    };
    match schedule {
        Some(s) if problems.is_empty() => Ok(s),
        _ => Err(problems.join("; ")),
    }
}

/// What a PeriodicJob should do now about its runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No run is due.
    Nothing,
    /// The run due at this time exists already: record it as scheduled.
    Started(Timestamp),
    /// Start the run due at this time (after deleting the active runs when
    /// `replace`).
    Start {
        /// Its scheduled time.
        due: Timestamp,
        /// concurrencyPolicy Replace with runs active.
        replace: bool,
    },
    /// The run due at this time waits for the active one (Forbid); look
    /// again after `until_too_late`, when its deadline passes.
    Wait {
        /// Its scheduled time.
        due: Timestamp,
        /// How long it may still wait, if it has a deadline.
        until_too_late: Option<Duration>,
    },
    /// The run due at this time is past its starting deadline: skip it.
    Missed(Timestamp),
}

/// Decides about the latest run due in `(since, now]`.
///
/// `active` counts the runs not finished; `exists` says whether the run of
/// a scheduled time was created already (by this manager before a restart,
/// or by another).
pub fn decide(
    schedule: &Schedule,
    since: Timestamp,
    now: Timestamp,
    policy: ConcurrencyPolicy,
    deadline: Option<Duration>,
    active: usize,
    exists: impl Fn(Timestamp) -> bool,
) -> Decision {
    let Some(due) = schedule.last_due(since, now) else {
        return Decision::Nothing;
    };
    if exists(due) {
        return Decision::Started(due);
    }
    let late = Duration::try_from(now.duration_since(due)).unwrap_or_default();
    if deadline.is_some_and(|d| late > d) {
        return Decision::Missed(due);
    }
    match policy {
        ConcurrencyPolicy::Forbid if active > 0 => Decision::Wait {
            due,
            until_too_late: deadline.map(|d| d.saturating_sub(late)),
        },
        ConcurrencyPolicy::Replace => Decision::Start {
            due,
            replace: active > 0,
        },
        _ => Decision::Start { due, replace: false },
    }
}

/// A parsed schedule in its time zone.
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: Cron,
    tz: TimeZone,
}

/// The most scheduled times one look walks over; a schedule missed for
/// longer is caught up by its latest time only.
const MAX_STEPS: usize = 1000;

impl Schedule {
    /// Parses `expr` read in `zone` (an IANA name; UTC when `None`).
    pub fn parse(expr: &str, zone: Option<&str>) -> Result<Schedule, String> {
        let cron = Cron::from_str(expr.trim()).map_err(|e| format!("schedule {expr:?}: {e}"))?;
        let tz = match zone {
            None => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|e| format!("time zone {name:?}: {e}"))?,
        };
        Ok(Schedule { cron, tz })
    }

    /// The first scheduled time strictly after `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let mut from = after;
        for _ in 0..4 {
            let wall = self.wall(from);
            let next = self.cron.find_next_occurrence(&wall, false).ok()?;
            let at = self.instant(next)?;
            if at > after {
                return Some(at);
            }
            // A wall-clock time that repeats (DST ends) resolved to its first
            // instant, which is not after `after`: look past it.
            from = from.checked_add(Span::new().hours(1)).ok()?;
        }
        None
    }

    /// Whether a window that opens at every scheduled time and stays open
    /// `length` is open at `now`.
    pub fn open_at(&self, now: Timestamp, length: std::time::Duration) -> bool {
        let wall = self.wall(now);
        let Ok(previous) = self.cron.find_previous_occurrence(&wall, true) else {
            return false;
        };
        let Some(opened) = self.instant(previous) else {
            return false;
        };
        let Ok(length) = jiff::SignedDuration::try_from(length) else {
            return false;
        };
        opened <= now && opened.checked_add(length).is_ok_and(|closes| now < closes)
    }

    /// The latest scheduled time in `(after, now]`, if any.
    pub fn last_due(&self, after: Timestamp, now: Timestamp) -> Option<Timestamp> {
        let mut due = None;
        let mut at = after;
        for _ in 0..MAX_STEPS {
            match self.next_after(at) {
                Some(next) if next <= now => {
                    due = Some(next);
                    at = next;
                }
                _ => return due,
            }
        }
        // Too many missed to walk: the latest is the one before `now`'s next.
        let wall = self.wall(now);
        let previous = self.cron.find_previous_occurrence(&wall, true).ok()?;
        self.instant(previous).filter(|t| *t > after).or(due)
    }

    /// `at` as wall-clock time in the zone, carried in a UTC chrono value
    /// (croner matches the fields it is given).
    fn wall(&self, at: Timestamp) -> chrono::DateTime<chrono::Utc> {
        let civil = self.tz.to_datetime(at);
        let seconds = civil
            .to_zoned(TimeZone::UTC)
            .map_or(at.as_second(), |z| z.timestamp().as_second());
        chrono::DateTime::from_timestamp(seconds, 0).unwrap_or_default()
    }

    /// A wall-clock time found by croner, as an instant in the zone.
    fn instant(&self, wall: chrono::DateTime<chrono::Utc>) -> Option<Timestamp> {
        let civil: DateTime = Timestamp::from_second(wall.timestamp())
            .ok()?
            .to_zoned(TimeZone::UTC)
            .datetime();
        self.tz
            .to_ambiguous_zoned(civil)
            .compatible()
            .ok()
            .map(|z| z.timestamp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn five_and_six_field_schedules() {
        let s = Schedule::parse("*/15 * * * *", None).unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-23T10:07:00Z")),
            Some(ts("2026-11-23T10:15:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2026-11-23T10:15:00Z")),
            Some(ts("2026-11-23T10:30:00Z")),
            "strictly after"
        );
        let s = Schedule::parse("*/5 * * * * *", None).unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-23T10:07:01Z")),
            Some(ts("2026-11-23T10:07:05Z"))
        );
        let s = Schedule::parse("@daily", None).unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-23T10:07:01Z")),
            Some(ts("2026-11-24T00:00:00Z"))
        );
    }

    #[test]
    fn the_time_zone_is_honoured() {
        let s = Schedule::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            s.next_after(ts("2026-11-23T00:00:00Z")),
            Some(ts("2026-11-23T08:00:00Z")),
            "09:00 CET"
        );
        assert_eq!(
            s.next_after(ts("2026-07-01T00:00:00Z")),
            Some(ts("2026-07-01T07:00:00Z")),
            "09:00 CEST"
        );
    }

    #[test]
    fn dst_gaps_and_repeats() {
        // Europe/Berlin: 2026-03-29 02:00 -> 03:00; 2026-10-25 03:00 -> 02:00.
        let s = Schedule::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            s.next_after(ts("2026-03-29T00:00:00Z")),
            Some(ts("2026-03-29T01:30:00Z")),
            "02:30 does not exist: the first instant after the gap"
        );
        let first = s.next_after(ts("2026-10-24T23:00:00Z")).unwrap();
        assert_eq!(first, ts("2026-10-25T00:30:00Z"), "02:30 CEST");
        let next = s.next_after(first).unwrap();
        assert_eq!(next, ts("2026-10-26T01:30:00Z"), "not again at 02:30 CET");
    }

    #[test]
    fn the_latest_missed_time_is_due() {
        let s = Schedule::parse("* * * * *", None).unwrap();
        assert_eq!(
            s.last_due(ts("2026-11-23T10:00:00Z"), ts("2026-11-23T10:05:30Z")),
            Some(ts("2026-11-23T10:05:00Z"))
        );
        assert_eq!(
            s.last_due(ts("2026-11-23T10:05:00Z"), ts("2026-11-23T10:05:30Z")),
            None
        );
        assert_eq!(
            s.last_due(ts("2026-01-01T00:00:00Z"), ts("2026-11-23T10:05:30Z")),
            Some(ts("2026-11-23T10:05:00Z")),
            "months missed"
        );
    }

    #[test]
    fn each_concurrency_policy_and_the_deadline() {
        let s = Schedule::parse("*/10 * * * *", None).unwrap();
        let since = ts("2026-11-23T10:00:00Z");
        let now = ts("2026-11-23T10:12:00Z");
        let due = ts("2026-11-23T10:10:00Z");
        let none = |_| false;
        use ConcurrencyPolicy::*;
        assert_eq!(
            decide(&s, since, now, Allow, None, 3, none),
            Decision::Start { due, replace: false },
            "Allow starts whatever runs"
        );
        assert_eq!(
            decide(&s, since, now, Forbid, None, 0, none),
            Decision::Start { due, replace: false }
        );
        assert_eq!(
            decide(&s, since, now, Forbid, Some(Duration::from_secs(300)), 1, none),
            Decision::Wait {
                due,
                until_too_late: Some(Duration::from_secs(180))
            },
            "Forbid waits for the active run, as long as the deadline allows"
        );
        assert_eq!(
            decide(&s, since, now, Forbid, Some(Duration::from_secs(60)), 1, none),
            Decision::Missed(due),
            "two minutes late with a one-minute deadline"
        );
        assert_eq!(
            decide(&s, since, now, Replace, None, 1, none),
            Decision::Start { due, replace: true }
        );
        assert_eq!(
            decide(&s, since, now, Allow, None, 0, |t| t == due),
            Decision::Started(due),
            "a run created before a restart is not created again"
        );
        assert_eq!(decide(&s, due, now, Allow, None, 0, none), Decision::Nothing);
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        assert!(Schedule::parse("61 * * * *", None)
            .unwrap_err()
            .contains("schedule"));
        assert!(Schedule::parse("* * *", None).is_err());
        assert!(Schedule::parse("0 9 * * *", Some("Mars/Olympus"))
            .unwrap_err()
            .contains("time zone"));
    }
}
