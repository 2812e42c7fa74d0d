//! Log lines that repeat while something stays wrong (a server down, a password refused), kept
//! to about one per cause per [`EVERY`] for each client: the first line of a cause is written
//! at once; the ones after it within the interval are counted instead, and the next line
//! written for the cause says how many were left out ("12 more like this in the last 5 s were
//! not logged"). A cause is a fixed name given at the call site, so that lines about different
//! keys or servers of one cause count together.
//!
//! One [`Repeats`] per client, shared by its background threads (watchdog, subscriber,
//! janitor) and its pool: an outage seen by every thread of a client is told once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per cause per this interval, per client.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// The log lines of one client, by cause: when each was last written, and how many were left
/// out since.
#[derive(Debug, Default)]
pub(crate) struct Repeats {
    slots: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

/// A line may be written: how many of its cause were left out before it (written after the
/// message by its `Display`, nothing when none were).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeftOut(u64, Duration);

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(
                f,
                " ({n} more like this in the last {} were not logged)",
                crate::error::Rounded(self.1)
            ),
        }
    }
}

impl Repeats {
    /// `Some` when a line of `cause` may be written at `now` (with the count of those left
    /// out before it), `None` when it is left out (and counted).
    pub(crate) fn admit_at(&self, cause: &'static str, now: Instant) -> Option<LeftOut> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Some((written, left_out)) = slots.get_mut(cause) else {
            slots.insert(cause, (now, 0));
            return Some(LeftOut(0, Duration::ZERO));
        };
        let since = now.saturating_duration_since(*written);
        if since < EVERY {
            *left_out = left_out.saturating_add(1);
            return None;
        }
        *written = now;
        Some(LeftOut(std::mem::take(left_out), since))
    }
}

/// `log::log!` for a line that repeats while something stays wrong: written through the
/// client's [`Repeats`] under `cause`, with the count of the lines of that cause left out
/// before it appended. Nothing is counted at a level the logger does not take.
macro_rules! log_repeat {
    ($repeats:expr, $cause:expr, $level:expr, $($arg:tt)+) => {{
        let level: log::Level = $level;
        if log::log_enabled!(level) {
            if let Some(left_out) = $repeats.admit_at($cause, std::time::Instant::now()) {
                log::log!(level, "{}{}", format_args!($($arg)+), left_out);
            }
        }
    }};
}
pub(crate) use log_repeat;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_cause_per_interval_then_the_count_left_out() {
        let r = Repeats::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(r.admit_at("a", t0), Some(LeftOut(0, Duration::ZERO)));
        // Another cause is not held back by the first.
        assert!(r.admit_at("b", t0).is_some());
        for i in 1..=9 {
            assert_eq!(r.admit_at("a", t0 + ms(100 * i)), None);
        }
        let next = r.admit_at("a", t0 + EVERY).expect("a new interval");
        assert_eq!(next, LeftOut(9, EVERY));
        assert_eq!(
            next.to_string(),
            " (9 more like this in the last 5 s were not logged)"
        );
        // Counting starts again.
        assert_eq!(r.admit_at("a", t0 + EVERY + ms(1)), None);
        assert_eq!(
            r.admit_at("a", t0 + EVERY * 2 + ms(1)),
            Some(LeftOut(1, EVERY + ms(1)))
        );
        assert_eq!(LeftOut(0, EVERY).to_string(), "");
    }
}
