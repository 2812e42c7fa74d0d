//! The runtime's special paths and tuned timings as the crate's own benchmarks switch them
//! (hidden feature `bench-hooks`, through `bench_hooks.rs`), to measure each with and without
//! it in one run. Without the feature every one is its default, a constant.

use std::time::Duration;

/// Overrides set by a benchmark: process-wide, read on every use.
#[cfg(feature = "bench-hooks")]
pub(crate) mod overrides {
    use std::sync::atomic::{AtomicBool, AtomicU64};

    /// The subscriber's reader thread never lends its connection to hand-off waiters.
    pub(crate) static NO_LEND: AtomicBool = AtomicBool::new(false);
    /// The subscriber's read tick, in µs (0: the default).
    pub(crate) static TICK_US: AtomicU64 = AtomicU64::new(0);
    /// How long an idle channel stays subscribed, in µs (`u64::MAX`: the default).
    pub(crate) static LINGER_US: AtomicU64 = AtomicU64::new(u64::MAX);
}

/// True if the subscriber may lend its connection to hand-off waiters.
#[inline]
pub(crate) fn lend() -> bool {
    #[cfg(feature = "bench-hooks")]
    {
        !overrides::NO_LEND.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "bench-hooks"))]
    {
        true
    }
}

/// `default`, or the benchmark's override of it (`unset` when none).
#[inline]
#[cfg_attr(not(feature = "bench-hooks"), allow(unused_variables))]
fn timing(default: Duration, which: &'static str) -> Duration {
    #[cfg(feature = "bench-hooks")]
    {
        use std::sync::atomic::Ordering::Relaxed;
        let (v, unset) = match which {
            "tick" => (overrides::TICK_US.load(Relaxed), 0),
            _ => (overrides::LINGER_US.load(Relaxed), u64::MAX),
        };
        if v != unset {
            return Duration::from_micros(v);
        }
    }
    default
}

/// The subscriber's read tick (`default` unless overridden).
#[inline]
pub(crate) fn tick(default: Duration) -> Duration {
    timing(default, "tick")
}

/// How long an idle channel stays subscribed (`default` unless overridden).
#[inline]
pub(crate) fn linger(default: Duration) -> Duration {
    timing(default, "linger")
}
