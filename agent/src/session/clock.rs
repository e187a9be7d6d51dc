//! The agent's clocks for the core: the boot clock fencing counts silence
//! on, and the wall clock beside it.

use std::time::Duration;

use super::core::Now;

/// Now, on the clock that keeps running while the robot is suspended
/// (`CLOCK_BOOTTIME`): fencing counts silence on it, so a robot that slept
/// through a replacement does not think it was silent for a moment only.
pub fn boot_clock() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        // Linux has it since 2.6.39; a monotonic fallback for anything else.
        .unwrap_or_else(|_| START.get_or_init(std::time::Instant::now).elapsed())
}

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Now, for the core.
pub(super) fn now() -> Now {
    Now {
        mono: boot_clock(),
        wall: jiff::Timestamp::now(),
    }
}
