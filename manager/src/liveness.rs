//! Robot decisions: approval of a registration, and Online/Offline from
//! the liveness the server records.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s4r_api::{ConditionStatus, RobotPhase};

/// The timing rules for robots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Liveness older than this makes an Online robot Offline.
    pub heartbeat_timeout: Duration,
    /// How long `Connected=False` may last before Offline. The robot says
    /// `online: false` itself as it stops, and its last will says the same
    /// when its connection drops, so the two cannot be told apart; zero
    /// (the default) makes the phase follow `Connected` at once, as the
    /// README promises. A longer grace keeps a robot on a flaky link
    /// schedulable through short drops, at the price of a phase that lags.
    pub disconnect_grace: Duration,
    /// How long a robot just registered (or just approved) may go without
    /// its first heartbeat before Offline, when longer than the timeout,
    /// as Kubernetes gives a starting node `--node-startup-grace-period`.
    /// A robot heartbeats only once its registration is answered, and in a
    /// storm of many thousands the answer and the first heartbeat's record
    /// can take minutes: without the grace a healthy robot still waiting
    /// was timed out and written Offline, which made the storm longer.
    pub startup_grace: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            heartbeat_timeout: Duration::from_secs(300),
            disconnect_grace: Duration::ZERO,
            startup_grace: Duration::from_secs(600),
        }
    }
}

/// What the server recorded about a robot's liveness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    /// `status.lastHeartbeatTime`.
    pub last_heartbeat: Option<Timestamp>,
    /// The robot's Lease `spec.renewTime`.
    pub lease_renew: Option<Timestamp>,
    /// The robot's Lease `spec.leaseDurationSeconds`: how long the server
    /// promised the robot counts as alive after a renewal (three times the
    /// interval it renews at; long for an idle robot).
    pub lease_duration: Option<Duration>,
    /// `status.lastRegistrationTime`.
    pub last_registration: Option<Timestamp>,
    /// When the `Approved` condition last became True: the robot could not
    /// heartbeat before its registration was answered, which follows this.
    pub approved: Option<Timestamp>,
    /// The `Connected` condition: status and when it last changed.
    pub connected: Option<(ConditionStatus, Option<Timestamp>)>,
}

impl Liveness {
    /// How long without a sign of life makes a robot Offline: the
    /// configured timeout, or the Lease's duration when that is longer (the
    /// server renews an idle robot's Lease rarely, and says so in it).
    /// A robot not heard since it registered or was approved gets the
    /// startup grace when that is longer.
    pub fn timeout(&self, cfg: &LivenessConfig) -> Duration {
        let timeout = self
            .lease_duration
            .map_or(cfg.heartbeat_timeout, |d| d.max(cfg.heartbeat_timeout));
        if self.starting() {
            timeout.max(cfg.startup_grace)
        } else {
            timeout
        }
    }

    /// Whether the robot registered (or was approved) and has not been
    /// heard since: it waits for its answer, or its first heartbeat waits
    /// to be recorded.
    pub fn starting(&self) -> bool {
        let started = self.last_registration.max(self.approved);
        started.is_some() && self.last_heartbeat.max(self.lease_renew) < started
    }

    /// The freshest sign of life from the robot itself.
    pub fn last_heard(&self) -> Option<Timestamp> {
        [self.last_heartbeat, self.lease_renew, self.last_registration]
            .into_iter()
            .flatten()
            .max()
    }

    /// The freshest sign of life, or the approval when later: the robot's
    /// first heartbeat cannot come before it.
    pub fn last_seen(&self) -> Option<Timestamp> {
        self.last_heard().max(self.approved)
    }
}

/// What to do with an approved robot's phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the phase; look again after the duration (or on a change).
    Stay(Option<Duration>),
    /// Becomes Online.
    Online {
        /// Condition reason.
        reason: &'static str,
        /// For a person.
        message: String,
    },
    /// Becomes Offline.
    Offline {
        /// Condition reason.
        reason: &'static str,
        /// For a person.
        message: String,
    },
}

fn since(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or(Duration::ZERO)
}

/// Decides Online/Offline for a robot in `phase` (Online or Offline).
pub fn verdict(phase: RobotPhase, live: &Liveness, now: Timestamp, cfg: &LivenessConfig) -> Verdict {
    let timeout = live.timeout(cfg);
    let age = live.last_seen().map(|t| since(now, t));
    let stale = age.is_none_or(|a| a >= timeout);
    let disconnected_for = match live.connected {
        Some((ConditionStatus::False, at)) => Some(at.map_or(Duration::MAX, |t| since(now, t))),
        _ => None,
    };
    match phase {
        RobotPhase::Online => {
            if stale {
                return Verdict::Offline {
                    reason: "HeartbeatTimeout",
                    message: format!("no heartbeat for more than {}s", timeout.as_secs()),
                };
            }
            if let Some(d) = disconnected_for {
                if d >= cfg.disconnect_grace {
                    return Verdict::Offline {
                        reason: "Disconnected",
                        message: "the robot disconnected from the broker".into(),
                    };
                }
                return Verdict::Stay(Some(cfg.disconnect_grace - d));
            }
            let left = age.map(|a| timeout.saturating_sub(a));
            Verdict::Stay(left)
        }
        RobotPhase::Offline => {
            // Back only on a sign of life from the robot itself: an approval
            // holds off the timeout of a robot starting, it does not say the
            // robot is there.
            let unheard = live.last_heard().is_none_or(|t| since(now, t) >= timeout);
            if !unheard && disconnected_for.is_none() {
                Verdict::Online {
                    reason: "HeartbeatResumed",
                    message: "heartbeats resumed".into(),
                }
            } else {
                Verdict::Stay(None)
            }
        }
        RobotPhase::Pending | RobotPhase::Rejected => Verdict::Stay(None),
    }
}

/// The outcome of a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Approve: the token matched, or auto-approval is on.
    Approve(String),
    /// Reject with this message.
    Reject(String),
    /// Cannot tell yet (no token list to check against).
    Wait(String),
}

/// Decides a registration from the hash of the token the robot presented
/// and the hashes of the known bootstrap tokens (`None`: no Secret).
pub fn approval(presented: Option<&str>, known: Option<&[String]>, auto_approve: bool) -> Approval {
    if auto_approve {
        return Approval::Approve("auto-approved".into());
    }
    let Some(known) = known else {
        return Approval::Wait("no bootstrap token Secret to check the robot's token against".into());
    };
    match presented {
        None => Approval::Reject("the robot presented no bootstrap token".into()),
        Some(hash) if known.iter().any(|k| k.eq_ignore_ascii_case(hash)) => {
            Approval::Approve("bootstrap token accepted".into())
        }
        Some(_) => Approval::Reject("bootstrap token not recognised".into()),
    }
}

/// When liveness turns stale, as a Timestamp (for requeues and tests).
pub fn stale_at(live: &Liveness, cfg: &LivenessConfig) -> Option<Timestamp> {
    let d = SignedDuration::try_from(live.timeout(cfg)).ok()?;
    live.last_seen().and_then(|t| t.checked_add(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn cfg() -> LivenessConfig {
        LivenessConfig {
            heartbeat_timeout: Duration::from_secs(60),
            disconnect_grace: Duration::from_secs(5),
            startup_grace: Duration::ZERO,
        }
    }

    /// The default timings: no disconnect grace.
    fn default_cfg() -> LivenessConfig {
        LivenessConfig {
            heartbeat_timeout: Duration::from_secs(60),
            startup_grace: Duration::ZERO,
            ..LivenessConfig::default()
        }
    }

    #[test]
    fn a_robot_not_yet_heard_since_it_registered_has_the_startup_grace() {
        let cfg = LivenessConfig {
            heartbeat_timeout: Duration::from_secs(300),
            startup_grace: Duration::from_secs(600),
            ..LivenessConfig::default()
        };
        // Registered at 0, approved at 100 (the manager behind a storm),
        // answered late: not heard yet at 500.
        let waiting = Liveness {
            last_registration: Some(t(0)),
            approved: Some(t(100)),
            connected: Some((ConditionStatus::True, Some(t(0)))),
            ..Liveness::default()
        };
        assert!(waiting.starting());
        assert_eq!(
            verdict(RobotPhase::Online, &waiting, t(500), &cfg),
            Verdict::Stay(Some(Duration::from_secs(200))),
            "600 s from the approval, not 300 s from the registration"
        );
        assert!(matches!(
            verdict(RobotPhase::Online, &waiting, t(700), &cfg),
            Verdict::Offline { reason: "HeartbeatTimeout", message } if message.contains("600s")
        ));
        // Once heard, the usual timeout: from its heartbeat.
        let heard = Liveness {
            last_heartbeat: Some(t(400)),
            ..waiting.clone()
        };
        assert!(!heard.starting());
        assert_eq!(
            verdict(RobotPhase::Online, &heard, t(500), &cfg),
            Verdict::Stay(Some(Duration::from_secs(200)))
        );
        // A robot registered again after it was heard is starting again.
        let again = Liveness {
            last_registration: Some(t(450)),
            ..heard
        };
        assert!(again.starting());
        assert_eq!(again.timeout(&cfg), Duration::from_secs(600));
        // An Offline robot is not brought back by its approval alone.
        let approved_only = Liveness {
            approved: Some(t(100)),
            ..Liveness::default()
        };
        assert_eq!(
            verdict(RobotPhase::Offline, &approved_only, t(101), &cfg),
            Verdict::Stay(None)
        );
        // A disconnect still makes it Offline at once.
        let gone = Liveness {
            connected: Some((ConditionStatus::False, Some(t(200)))),
            ..waiting
        };
        assert!(matches!(
            verdict(RobotPhase::Online, &gone, t(201), &cfg),
            Verdict::Offline {
                reason: "Disconnected",
                ..
            }
        ));
    }

    #[test]
    fn liveness_is_the_freshest_signal() {
        let live = Liveness {
            last_heartbeat: Some(t(10)),
            lease_renew: Some(t(50)),
            last_registration: Some(t(0)),
            ..Liveness::default()
        };
        assert_eq!(live.last_seen(), Some(t(50)));
        assert_eq!(stale_at(&live, &cfg()), Some(t(110)));
    }

    #[test]
    fn an_idle_robots_lease_stretches_its_timeout() {
        // The server renews an idle robot every 600 s and says so: 1800 s.
        let live = Liveness {
            lease_renew: Some(t(0)),
            lease_duration: Some(Duration::from_secs(1800)),
            connected: Some((ConditionStatus::True, Some(t(0)))),
            ..Liveness::default()
        };
        assert_eq!(
            verdict(RobotPhase::Online, &live, t(700), &cfg()),
            Verdict::Stay(Some(Duration::from_secs(1100))),
            "not heard for 700 s, but the Lease promised no renewal before 600 s"
        );
        assert_eq!(stale_at(&live, &cfg()), Some(t(1800)));
        assert!(matches!(
            verdict(RobotPhase::Online, &live, t(1800), &cfg()),
            Verdict::Offline { reason: "HeartbeatTimeout", message } if message.contains("1800s")
        ));
        // A Lease shorter than the configured timeout changes nothing.
        let busy = Liveness {
            lease_duration: Some(Duration::from_secs(30)),
            ..live
        };
        assert_eq!(busy.timeout(&cfg()), Duration::from_secs(60));
    }

    #[test]
    fn online_goes_offline_when_heartbeats_stop() {
        let live = Liveness {
            last_heartbeat: Some(t(0)),
            ..Liveness::default()
        };
        assert_eq!(
            verdict(RobotPhase::Online, &live, t(45), &cfg()),
            Verdict::Stay(Some(Duration::from_secs(15)))
        );
        assert!(matches!(
            verdict(RobotPhase::Online, &live, t(60), &cfg()),
            Verdict::Offline {
                reason: "HeartbeatTimeout",
                ..
            }
        ));
        assert!(matches!(
            verdict(RobotPhase::Online, &Liveness::default(), t(0), &cfg()),
            Verdict::Offline { .. }
        ));
    }

    #[test]
    fn a_configured_grace_holds_a_disconnected_robot_online_that_long() {
        let live = Liveness {
            last_heartbeat: Some(t(0)),
            connected: Some((ConditionStatus::False, Some(t(1)))),
            ..Liveness::default()
        };
        assert_eq!(
            verdict(RobotPhase::Online, &live, t(3), &cfg()),
            Verdict::Stay(Some(Duration::from_secs(3)))
        );
        assert!(matches!(
            verdict(RobotPhase::Online, &live, t(6), &cfg()),
            Verdict::Offline {
                reason: "Disconnected",
                ..
            }
        ));
        assert_eq!(
            verdict(RobotPhase::Offline, &live, t(7), &cfg()),
            Verdict::Stay(None)
        );
    }

    #[test]
    fn by_default_a_disconnect_makes_the_robot_offline_at_once() {
        assert_eq!(LivenessConfig::default().disconnect_grace, Duration::ZERO);
        // A clean stop: the agent's own `online: false` a second after its
        // last heartbeat; the phase follows in the same reconcile.
        let live = Liveness {
            last_heartbeat: Some(t(0)),
            connected: Some((ConditionStatus::False, Some(t(1)))),
            ..Liveness::default()
        };
        assert_eq!(
            verdict(RobotPhase::Online, &live, t(1), &default_cfg()),
            Verdict::Offline {
                reason: "Disconnected",
                message: "the robot disconnected from the broker".into(),
            }
        );
        // A transition time ahead of the manager's clock (another
        // machine's) changes nothing.
        assert!(matches!(
            verdict(RobotPhase::Online, &live, t(0), &default_cfg()),
            Verdict::Offline { .. }
        ));
        assert_eq!(
            verdict(RobotPhase::Offline, &live, t(2), &default_cfg()),
            Verdict::Stay(None),
            "fresh liveness alone does not bring a disconnected robot back"
        );
    }

    #[test]
    fn a_robot_that_reconnects_quickly_is_online_again() {
        // Disconnected at t(1), registered again at t(3): the server set
        // Connected=True with the registration.
        let back = Liveness {
            last_heartbeat: Some(t(0)),
            last_registration: Some(t(3)),
            connected: Some((ConditionStatus::True, Some(t(3)))),
            ..Liveness::default()
        };
        assert!(matches!(
            verdict(RobotPhase::Offline, &back, t(3), &default_cfg()),
            Verdict::Online {
                reason: "HeartbeatResumed",
                ..
            }
        ));
        assert_eq!(
            verdict(RobotPhase::Online, &back, t(4), &default_cfg()),
            Verdict::Stay(Some(Duration::from_secs(59)))
        );
    }

    #[test]
    fn offline_comes_back_when_heartbeats_resume() {
        let live = Liveness {
            lease_renew: Some(t(100)),
            connected: Some((ConditionStatus::True, Some(t(100)))),
            ..Liveness::default()
        };
        assert!(matches!(
            verdict(RobotPhase::Offline, &live, t(101), &cfg()),
            Verdict::Online { .. }
        ));
        assert_eq!(
            verdict(RobotPhase::Offline, &live, t(200), &cfg()),
            Verdict::Stay(None),
            "still stale"
        );
    }

    #[test]
    fn approval_by_token_hash_or_auto() {
        let known = vec!["ABCD".to_string()];
        assert!(matches!(
            approval(Some("abcd"), Some(&known), false),
            Approval::Approve(_)
        ));
        assert!(matches!(
            approval(Some("beef"), Some(&known), false),
            Approval::Reject(_)
        ));
        assert!(matches!(approval(None, Some(&known), false), Approval::Reject(_)));
        assert!(matches!(approval(Some("abcd"), None, false), Approval::Wait(_)));
        assert!(matches!(approval(None, None, true), Approval::Approve(_)));
    }
}
