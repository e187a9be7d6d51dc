//! systemd's watchdog: the unit's `WatchdogSec=` makes systemd kill and
//! restart an agent that stops saying it is alive. The agent says so
//! (`WATCHDOG=1` on the socket systemd names in `NOTIFY_SOCKET`, the
//! sd_notify protocol) from its session's event loop, the loop that stops
//! turning when the agent hangs, at half the interval systemd gives in
//! `WATCHDOG_USEC`. A binary on trial that hangs is then restarted, and
//! the unit's boot check rolls it back (see [`crate::upgrade::slots`]).
//!
//! A few lines over a Unix datagram socket, as sd_notify(3) describes,
//! rather than a crate: nothing else of libsystemd is needed.

use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use tokio::time::Instant;

/// Where systemd listens: a path, or a name in the abstract namespace
/// (`@name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socket {
    Path(std::path::PathBuf),
    Abstract(Vec<u8>),
}

/// What the environment says of the watchdog: the socket, and how often
/// to say the agent is alive (half of `WATCHDOG_USEC`). None when there
/// is no watchdog for this process: no socket, no interval, or one meant
/// for another process (`WATCHDOG_PID`).
pub fn settings(
    socket: Option<OsString>,
    usec: Option<OsString>,
    pid: Option<OsString>,
    own_pid: u32,
) -> Option<(Socket, Duration)> {
    let socket = socket?;
    let usec: u64 = usec?.to_str()?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid {
        if pid.to_str()?.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(socket.as_os_str());
    let socket = match bytes.strip_prefix(b"@") {
        Some(name) => Socket::Abstract(name.to_vec()),
        None if bytes.starts_with(b"/") => Socket::Path(socket.into()),
        None => return None,
    };
    Some((socket, Duration::from_micros(usec) / 2))
}

/// The agent's side of the watchdog.
#[derive(Debug)]
pub struct Watchdog {
    socket: Socket,
    every: Duration,
    next: Instant,
}

impl Watchdog {
    /// The watchdog systemd set up for this process, if any.
    pub fn from_env() -> Option<Self> {
        let (socket, every) = settings(
            std::env::var_os("NOTIFY_SOCKET"),
            std::env::var_os("WATCHDOG_USEC"),
            std::env::var_os("WATCHDOG_PID"),
            std::process::id(),
        )?;
        tracing::info!(every = ?every, "telling systemd's watchdog the agent is alive");
        Some(Watchdog {
            socket,
            every,
            next: Instant::now(),
        })
    }

    /// When it is next to be told.
    pub fn due(&self) -> Instant {
        self.next
    }

    /// Tells systemd the agent is alive, now; next at `now` plus the
    /// interval. A send that fails is logged: systemd then restarts the
    /// agent, which is what a socket gone away calls for.
    pub fn ping(&mut self, now: Instant) {
        self.next = now + self.every;
        if let Err(e) = notify(&self.socket, b"WATCHDOG=1") {
            tracing::warn!(error = %e, "cannot tell systemd's watchdog the agent is alive");
        }
    }
}

fn notify(socket: &Socket, message: &[u8]) -> std::io::Result<()> {
    let sender = UnixDatagram::unbound()?;
    match socket {
        Socket::Path(path) => sender.send_to(message, path)?,
        Socket::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sender.send_to_addr(message, &addr)?
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(s.into())
    }

    #[test]
    fn the_watchdog_is_this_process_s_only_when_systemd_says_so() {
        let path = Socket::Path("/run/systemd/notify".into());
        assert_eq!(
            settings(os("/run/systemd/notify"), os("30000000"), None, 7),
            Some((path.clone(), Duration::from_secs(15)))
        );
        assert_eq!(
            settings(os("/run/systemd/notify"), os("30000000"), os("7"), 7),
            Some((path, Duration::from_secs(15)))
        );
        assert_eq!(
            settings(os("@sd-notify"), os("1000000"), None, 7),
            Some((
                Socket::Abstract(b"sd-notify".to_vec()),
                Duration::from_millis(500)
            ))
        );
        // Another process's watchdog, none at all, or nonsense: no pings.
        assert_eq!(
            settings(os("/run/systemd/notify"), os("30000000"), os("8"), 7),
            None
        );
        assert_eq!(settings(None, os("30000000"), None, 7), None);
        assert_eq!(settings(os("/run/systemd/notify"), None, None, 7), None);
        assert_eq!(settings(os("/run/systemd/notify"), os("0"), None, 7), None);
        assert_eq!(settings(os("relative"), os("30000000"), None, 7), None);
    }

    #[tokio::test]
    async fn a_ping_reaches_the_socket_and_sets_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let mut dog = Watchdog {
            socket: Socket::Path(path),
            every: Duration::from_secs(15),
            next: Instant::now(),
        };
        let now = Instant::now();
        dog.ping(now);
        assert_eq!(dog.due(), now + Duration::from_secs(15));
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }
}
