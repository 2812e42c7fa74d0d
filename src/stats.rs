//! Counters since a client started ([`LockClient::stats`](crate::LockClient::stats)): one
//! relaxed atomic add each, no lock, nothing sent. With the cargo feature `metrics` every count
//! is also reported through the [`metrics`](https://docs.rs/metrics) facade.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{LockError, Result};
use crate::lease::{Attempt, Lease};
// The label each strategy gives its events, defined with the holds it labels (`RenewKind`).
pub(crate) use crate::lease::Kind;

/// Adds `n` to a counter, and reports it through `metrics` when that feature is on (with the
/// `strategy` label of the kind, if given).
macro_rules! count {
    ($self:ident . $field:ident, $n:expr $(, $kind:expr)?) => {{
        let n: u64 = $n;
        $self.$field.fetch_add(n, Ordering::Relaxed);
        $(
            #[cfg(not(feature = "metrics"))]
            let _: Kind = $kind;
        )?
        #[cfg(feature = "metrics")]
        metrics::counter!(
            concat!("dlock_", stringify!($field), "_total")
            $(, "strategy" => $kind.0)?
        )
        .increment(n);
    }};
}

/// Declares [`Stats`] as written, [`Counters`] with an atomic per field of it, their
/// snapshot, and for a field marked `=> fn name` a method `name()` that counts one event of
/// it (with no `strategy` label).
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct Stats {
            $($(#[$doc:meta])* pub $field:ident: u64 $(=> fn $adder:ident)?,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Stats {
            $($(#[$doc])* pub $field: u64,)*
        }

        /// The live counters of one client.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($field: AtomicU64,)*
        }

        impl Counters {
            /// A snapshot.
            pub(crate) fn snapshot(&self) -> Stats {
                Stats {
                    $($field: self.$field.load(Ordering::Relaxed),)*
                }
            }

            $($(
                /// Counts one event of its field.
                pub(crate) fn $adder(&self) {
                    count!(self.$field, 1);
                }
            )?)*
        }
    };
}

counters! {
    /// What a client has counted since it was built: a snapshot from
    /// [`LockClient::stats`](crate::LockClient::stats) (or
    /// [`RedLockClient::stats`](crate::RedLockClient::stats)).
    ///
    /// Every counter only grows; take the difference of two snapshots for a rate. Counting costs
    /// one relaxed atomic add on the path where the event happens: no lock and no round trip.
    /// With the cargo feature `metrics`, the same events are reported as `metrics` counters named
    /// `dlock_<field>_total` (e.g. `dlock_acquires_total`), with a `strategy` label (`token`,
    /// `classic`, `reentrant`, `fair`, `read`, `write`, `redlock`) on acquires, refusals, timeouts
    /// and lost holds.
    pub struct Stats {
        /// Holds handed out: acquire attempts that won (re-entries of a reentrant or read-write
        /// lock included), whether by `try_acquire`, `try_lock`, `lock` or `try_lock_for`. A win
        /// released again because its reply came too late ([`LockError::LateReply`]) is not
        /// counted.
        ///
        /// [`LockError::LateReply`]: LockError::LateReply
        pub acquires: u64,
        /// Acquire attempts refused because another owner held the lock (contention). A blocking
        /// acquire counts one per attempt it made.
        pub refusals: u64,
        /// Blocking acquires (`lock`, `try_lock_for`, `try_lock_until`) that gave up with
        /// [`LockError::Timeout`](LockError::Timeout).
        pub timeouts: u64,
        /// Holds found lost, each hold at most once: the watchdog found a watched hold gone or
        /// could not renew it before its lease ran out, an `extend` found the hold gone
        /// ([`LockError::Lost`]), or a release found it gone (`unlock()`
        /// returned `Ok(false)`).
        pub lost_holds: u64,
        /// Watched holds the watchdog renewed (one per hold per renewal).
        pub renewals: u64,
        /// Renewals of watched holds that failed (Redis unreachable, erroring or too slow), one per
        /// hold per failed call; they are retried until the lease runs out.
        pub failed_renewals: u64,
        /// Release messages heard on the pub/sub subscriber that woke waiters of this client.
        pub wakeups: u64 => fn woken,
        /// Classic takeovers of a stale lock won by `GETSET` ([`Takeover::GetSet`]).
        ///
        /// [`Takeover::GetSet`]: crate::Takeover::GetSet
        pub getset_takeovers: u64 => fn getset_takeover,
        /// Classic `GETSET` takeovers lost to another contender, whose value the losing `GETSET`
        /// overwrote anyway (the legacy flaw that [`Takeover::CompareAndSet`] avoids).
        ///
        /// [`Takeover::CompareAndSet`]: crate::Takeover::CompareAndSet
        pub getset_overwrites: u64 => fn getset_overwrite,
        /// Classic takeovers of a stale lock won by compare-and-set
        /// ([`Takeover::CompareAndSet`](crate::Takeover::CompareAndSet)).
        pub cas_takeovers: u64 => fn cas_takeover,
        /// Orphans the client's clean-up thread removed: locks left by an acquire whose reply was
        /// lost, or by a release that failed on a connection error (see
        /// [`LockClient::pending_cleanups`](crate::LockClient::pending_cleanups)).
        pub orphan_cleanups: u64 => fn orphan_cleaned,
        /// Connections re-established after one was lost: pooled connections discarded as broken
        /// (an I/O error, a timeout, `READONLY` after a failover, or opened before a Sentinel
        /// master switch; the pool opens a new one when next needed), and reconnections of the
        /// pub/sub subscriber.
        pub reconnects: u64 => fn reconnect,
    }
}

impl Counters {
    /// One acquire attempt's outcome: won, or refused by another owner.
    pub(crate) fn attempt(&self, kind: Kind, won: bool) {
        if won {
            count!(self.acquires, 1, kind);
        } else {
            count!(self.refusals, 1, kind);
        }
    }

    /// The outcome of one attempt (after the late-reply check): a win or a refusal is counted,
    /// an error is not.
    pub(crate) fn outcome(&self, kind: Kind, result: &Result<Attempt>) {
        if let Ok(attempt) = result {
            self.attempt(kind, matches!(attempt, Attempt::Acquired(_)));
        }
    }

    /// [`outcome`](Self::outcome) for a `try_acquire` result.
    pub(crate) fn outcome_lease<T>(&self, kind: Kind, result: &Result<Option<T>>) {
        if let Ok(lease) = result {
            self.attempt(kind, lease.is_some());
        }
    }

    /// A blocking acquire ended with `result`: counted if it timed out.
    pub(crate) fn blocking<T>(&self, kind: Kind, result: &Result<T>) {
        if let Err(LockError::Timeout { .. }) = result {
            count!(self.timeouts, 1, kind);
        }
    }

    /// A hold found lost by an `extend`: counted unless this lease (or the watchdog) already
    /// counted it; the lease remembers it.
    pub(crate) fn lost_on_extend(&self, kind: Kind, lease: &mut Lease) {
        if lease.note_lost() {
            count!(self.lost_holds, 1, kind);
        }
    }

    /// A release found the hold lost: counted unless the lease (or the watchdog) already did.
    pub(crate) fn lost_on_release(&self, kind: Kind, lease: &Lease) {
        if !lease.loss_noted() {
            count!(self.lost_holds, 1, kind);
        }
    }

    /// The watchdog marked a hold lost.
    pub(crate) fn lost_watched(&self, kind: Kind) {
        count!(self.lost_holds, 1, kind);
    }

    /// The watchdog renewed `n` holds.
    pub(crate) fn renewed(&self, n: usize) {
        count!(self.renewals, n as u64);
    }

    /// A renewal call for `n` holds failed.
    pub(crate) fn renewals_failed(&self, n: usize) {
        count!(self.failed_renewals, n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;
    use std::time::{Duration, Instant};

    #[test]
    fn counts_and_snapshots() {
        let c = Counters::default();
        c.attempt(Kind::new("token"), true);
        c.attempt(Kind::new("token"), false);
        c.attempt(Kind::new("classic"), false);
        c.renewed(3);
        c.blocking::<()>(
            Kind::new("token"),
            &Err(crate::LockError::Timeout {
                key: "k".into(),
                attempts: 1,
                waited: Duration::ZERO,
            }),
        );
        c.blocking(Kind::new("token"), &Ok(()));
        let mut lease = Lease::new(b"v", Instant::now(), Duration::from_secs(1));
        c.lost_on_extend(Kind::new("token"), &mut lease);
        c.lost_on_extend(Kind::new("token"), &mut lease);
        c.lost_on_release(Kind::new("token"), &lease);
        let s = c.snapshot();
        assert_eq!((s.acquires, s.refusals, s.timeouts), (1, 2, 1));
        assert_eq!(s.renewals, 3);
        assert_eq!(s.lost_holds, 1, "one hold, counted once");
        let fresh = Lease::new(b"v", Instant::now(), Duration::from_secs(1));
        c.lost_on_release(Kind::new("token"), &fresh);
        assert_eq!(c.snapshot().lost_holds, 2);
    }
}
