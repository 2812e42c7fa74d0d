//! Instant arithmetic that cannot panic: `Instant + Duration` panics on overflow, and every
//! duration a caller or a builder hands in (up to `Duration::MAX`) reaches such a sum somewhere.

use std::time::{Duration, Instant};

use crate::error::{LockError, Result};

/// `start + d`, or the latest instant this platform can represent after `start` when the sum
/// overflows: a deadline that far away is as good as none.
pub(crate) fn saturating_add(start: Instant, d: Duration) -> Instant {
    if let Some(t) = start.checked_add(d) {
        return t;
    }
    // Greedy: add the largest halving of `d` that still fits, until nothing more does. At
    // most ~2 × 96 steps (a Duration has 96 significant bits); only reached for absurd `d`.
    let (mut t, mut step) = (start, d);
    while !step.is_zero() {
        match t.checked_add(step) {
            Some(next) => t = next,
            None => step /= 2,
        }
    }
    t
}

/// `Instant::now() + d`, saturating (see [`saturating_add`]).
pub(crate) fn after(d: Duration) -> Instant {
    saturating_add(Instant::now(), d)
}

/// The deadline of a wait of `d` from now: `None` when it cannot be represented, which
/// callers treat as "no deadline" (a wait of `Duration::MAX` is a wait forever).
pub(crate) fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// The longest lifetime accepted: far below the point where `now + ttl` in milliseconds
/// overflows Redis's 64-bit expiry (which Redis rejects with "invalid expire time").
pub const MAX_TTL: Duration = Duration::from_millis(1 << 52);

/// Checks a lifetime-like duration: whole milliseconds count, at most [`MAX_TTL`]. Returns
/// its whole milliseconds.
pub(crate) fn check_duration(key: &str, what: &str, d: Duration, zero: bool) -> Result<Duration> {
    if !zero && d.as_millis() == 0 {
        let reason = format!("{what} must be at least 1 ms, got {d:?}");
        return Err(LockError::config(key, reason));
    }
    if d > MAX_TTL {
        return Err(LockError::config(
            key,
            format!("{what} {d:?} is beyond the longest Redis accepts (MAX_TTL = {MAX_TTL:?})"),
        ));
    }
    Ok(Duration::from_millis(d.as_millis() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sums_are_exact() {
        let now = Instant::now();
        assert_eq!(saturating_add(now, Duration::ZERO), now);
        assert_eq!(
            saturating_add(now, Duration::from_millis(5)),
            now + Duration::from_millis(5)
        );
        assert_eq!(
            saturating_add(now, Duration::from_nanos(1)),
            now + Duration::from_nanos(1)
        );
        let d = deadline_after(Duration::from_secs(1)).expect("1 s fits");
        assert!(d > now && d <= Instant::now() + Duration::from_secs(1));
    }

    #[test]
    fn huge_sums_saturate_without_panic() {
        let now = Instant::now();
        let far = saturating_add(now, Duration::MAX);
        // Far beyond any real wait, and nothing more can be added to it.
        assert!(far >= now + Duration::from_secs(100 * 365 * 24 * 3600));
        assert_eq!(saturating_add(far, Duration::MAX), far);
        assert_eq!(saturating_add(far, Duration::from_secs(1)), far);
        assert!(after(Duration::MAX) >= far);
        assert!(after(Duration::MAX) > Instant::now());
        // `checked_add` fails here, so the deadline is "none".
        assert_eq!(deadline_after(Duration::MAX), None);
    }

    #[test]
    fn saturated_instant_is_the_largest_reachable() {
        let now = Instant::now();
        let far = saturating_add(now, Duration::MAX);
        // One nanosecond more overflows: the result is the maximum, not just some large value.
        assert!(far.checked_add(Duration::from_nanos(1)).is_none());
    }
}
