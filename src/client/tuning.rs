//! The runtime's special paths and tuned timings as the crate's own benchmarks switch them
//! (hidden feature `bench-hooks`, through `bench_hooks.rs`), to measure each with and without
//! it in one run. Without the feature every one is its default, a constant.

use std::time::Duration;

/// Overrides set by a benchmark: process-wide, read on every use.
#[cfg(feature = "bench-hooks")]
pub(crate) mod overrides {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::time::Duration;

    /// The subscriber's reader thread never lends its connection to hand-off waiters.
    pub(crate) static NO_LEND: AtomicBool = AtomicBool::new(false);
    /// The subscriber's read tick, in µs (0: the default).
    pub(crate) static TICK_US: AtomicU64 = AtomicU64::new(0);
    /// How long an idle channel stays subscribed, in µs (`u64::MAX`: the default).
    pub(crate) static LINGER_US: AtomicU64 = AtomicU64::new(u64::MAX);

    /// The timing `v` overrides, unless it is `unset`.
    pub(super) fn timing(v: &AtomicU64, unset: u64) -> Option<Duration> {
        let v = v.load(Relaxed);
        (v != unset).then(|| Duration::from_micros(v))
    }
}

/// True if the subscriber may lend its connection to hand-off waiters.
#[inline]
pub(crate) fn lend() -> bool {
    #[cfg(feature = "bench-hooks")]
    if overrides::NO_LEND.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    true
}

/// The subscriber's read tick (`default` unless overridden).
#[inline]
pub(crate) fn tick(default: Duration) -> Duration {
    #[cfg(feature = "bench-hooks")]
    if let Some(d) = overrides::timing(&overrides::TICK_US, 0) {
        return d;
    }
    default
}

/// How long an idle channel stays subscribed (`default` unless overridden).
#[inline]
pub(crate) fn linger(default: Duration) -> Duration {
    #[cfg(feature = "bench-hooks")]
    if let Some(d) = overrides::timing(&overrides::LINGER_US, u64::MAX) {
        return d;
    }
    default
}
