//! Events of a client's runtime that the crate's own tests wait for instead of sleeping: a
//! subscription confirmed, a waiter queued, a renewal done, a master switch followed. With the
//! cargo feature `test-hooks` each event bumps a per-client count that a test can block on
//! ([`TestHooks::wait_for`]); without it [`TestHooks`] is empty and noting an event compiles to
//! nothing. Hidden, unstable, no semver promise: do not enable the feature in a dependent crate.

#[cfg(feature = "test-hooks")]
use std::time::Duration;

/// What happened, as the tests wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The server confirmed a `SUBSCRIBE` of the client's subscriber connection.
    Subscribed,
    /// A blocking acquire waits: it was refused and joined its client's line of waiters. A
    /// lock whose waiters queue in Redis counts a waiter once when it waits behind another
    /// thread of its client, and once when its place in the queue in Redis is taken, or
    /// offered to the holder's release that queues it.
    Queued,
    /// The watchdog renewed a batch of holds (one event per call that renewed any).
    Renewed,
    /// A Sentinel client followed a master switch (its recent releases replayed).
    #[cfg(feature = "sentinel")]
    Switched,
    /// A fair waiter took a grant made to it by a release (heard as a message or handed over
    /// by a thread of its client), before it checks the grant's age or confirms it.
    Granted,
    /// A fair waiter listens (once per blocking acquire): its subscription was confirmed
    /// before its latest attempt (or before a release could take its offer), so it sends
    /// nothing until its poll and a grant from now on is heard.
    Listening,
}

impl Event {
    /// Enough counts for every event, indexed by `event as usize`.
    #[cfg(feature = "test-hooks")]
    const ALL: usize = 6;
}

/// The events one client has seen (see the module's documentation).
#[derive(Debug, Default)]
pub struct TestHooks {
    #[cfg(feature = "test-hooks")]
    counts: std::sync::Mutex<[u64; Event::ALL]>,
    #[cfg(feature = "test-hooks")]
    changed: std::sync::Condvar,
}

impl TestHooks {
    /// Counts `event` and wakes the tests waiting for it; nothing without the feature.
    #[inline(always)]
    pub(crate) fn note(&self, event: Event) {
        #[cfg(feature = "test-hooks")]
        {
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            counts[event as usize] += 1;
            drop(counts);
            self.changed.notify_all();
        }
        #[cfg(not(feature = "test-hooks"))]
        let _ = event;
    }

    /// How many times `event` happened since the client was built.
    #[cfg(feature = "test-hooks")]
    pub fn count(&self, event: Event) -> u64 {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())[event as usize]
    }

    /// Waits until `event` has happened at least `n` times since the client was built, at
    /// most `timeout`: true if it has.
    #[cfg(feature = "test-hooks")]
    pub fn wait_for(&self, event: Event, n: u64, timeout: Duration) -> bool {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (counts, _) = self
            .changed
            .wait_timeout_while(counts, timeout, |c| c[event as usize] < n)
            .unwrap_or_else(|p| p.into_inner());
        counts[event as usize] >= n
    }
}
