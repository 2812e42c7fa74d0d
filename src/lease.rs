//! A hold as the layers above see it: the [`Lease`] an acquire hands out, the outcome of one
//! attempt, and the state the watchdog renews ([`WatchState`]), with what a lost hold reports.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{LockError, Result};
use crate::ids::Inline;

/// One successful acquire: the owner value written to Redis, how long the hold is valid and,
/// when asked for, its fencing token.
///
/// The lease of a *watched* lock (built without an explicit lifetime) keeps the watchdog
/// renewing the hold for as long as the lease, or a clone of it, lives and has not been
/// released: dropping every copy stops the renewals, and the hold then expires by itself.
#[derive(Clone)]
pub struct Lease {
    value: Inline,
    acquired_at: Instant,
    valid_until: Instant,
    fence: Option<u64>,
    watch: Option<Arc<WatchState>>,
    /// This lease was found lost and counted in the client's stats.
    loss_noted: bool,
    /// How long before `valid_until` the hold counts as lost ([`loss_margin`] of the latest
    /// grant's lifetime); `None` for a validity that has the drift taken off already (RedLock):
    /// no margin, on renewals either.
    margin: Option<Duration>,
    /// The hold is its owner thread's (Reentrant, read-write lock): its guard stays there.
    thread_owned: bool,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        self.value() == other.value()
            && self.acquired_at == other.acquired_at
            && self.valid_until == other.valid_until
            && self.fence == other.fence
            && self.watch.as_ref().map(Arc::as_ptr) == other.watch.as_ref().map(Arc::as_ptr)
    }
}

impl Eq for Lease {}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("value", &printable(self.value()))
            .field("remaining", &self.remaining())
            .field("fence", &self.fence)
            .field("watched", &self.watch.is_some())
            .finish()
    }
}

impl Lease {
    /// A lease for `value`, valid for `ttl` from `start` (taken before the command was sent, so
    /// the validity errs on the short side).
    pub(crate) fn new(value: &[u8], start: Instant, ttl: Duration) -> Self {
        Lease {
            value: Inline::new(&[value]),
            acquired_at: start,
            valid_until: crate::time::saturating_add(start, ttl),
            fence: None,
            watch: None,
            loss_noted: false,
            margin: Some(loss_margin(ttl)),
            thread_owned: false,
        }
    }

    /// The hold belongs to the thread that took it (its owner id names the thread): its guard
    /// must not leave that thread (see [`LockGuard`](crate::LockGuard)).
    pub(crate) fn owned_by_thread(mut self) -> Self {
        self.thread_owned = true;
        self
    }

    /// True when the hold belongs to the thread that took it: a hold of
    /// [`Strategy::Reentrant`](crate::Strategy::Reentrant) or of a read-write lock, whose owner
    /// id is `<instance>:<thread>`. That thread may re-enter while it holds the lock, so its
    /// guard stays on it (see [`LockGuard::into_send`](crate::LockGuard::into_send)). The lease
    /// itself may still be sent elsewhere, for callers who manage the hold themselves: it keeps
    /// naming the thread that took it, which still counts as the owner.
    pub fn is_thread_owned(&self) -> bool {
        self.thread_owned
    }

    /// The validity given (and given by every renewal) has the clock-drift allowance taken off
    /// already (RedLock's): [`is_lost`](Self::is_lost) adds no margin of its own.
    pub(crate) fn drift_included(mut self) -> Self {
        self.margin = None;
        self
    }

    /// With the fencing token the acquire returned.
    pub(crate) fn with_fence(mut self, fence: Option<u64>) -> Self {
        self.fence = fence;
        self
    }

    /// Renewed by the watchdog through `watch`.
    pub(crate) fn with_watch(mut self, watch: Arc<WatchState>) -> Self {
        self.watch = Some(watch);
        self
    }

    /// The hold is being released: the watchdog must not renew it any more.
    pub(crate) fn stop_renewal(&self) {
        if let Some(w) = &self.watch {
            w.stop();
        }
    }

    /// After an extend: valid for `ttl` from `start`, with `new_value` if the strategy changed
    /// the stored value (Classic stores a new expiry).
    pub(crate) fn renew(&mut self, new_value: Option<&[u8]>, start: Instant, ttl: Duration) {
        if let Some(value) = new_value {
            self.value = Inline::new(&[value]);
        }
        self.valid_until = crate::time::saturating_add(start, ttl);
        // No margin stays none (a validity with the drift taken off).
        self.margin = self.margin.map(|_| loss_margin(ttl));
        if let Some(w) = &self.watch {
            w.renewed(start, ttl);
        }
    }

    /// The owner value stored at the key (a token, or a legacy expiry timestamp).
    pub fn value(&self) -> &[u8] {
        self.value.as_bytes()
    }

    /// When the lock was acquired (monotonic clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The monotonic instant until which the hold is valid, measured from before the acquire
    /// (or the latest extend or watchdog renewal) was sent.
    pub fn valid_until(&self) -> Instant {
        self.watch
            .as_ref()
            .map_or(self.valid_until, |w| w.valid_until())
    }

    /// Time left before the hold expires (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// True once the lifetime has passed by the local monotonic clock. Costs no round trip.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until()
    }

    /// True once the hold must be taken as lost, without a round trip: its
    /// [`loss_deadline`](Self::loss_deadline) passed by the local clock, or (watched locks) the
    /// watchdog found it gone. False does not prove the hold is still ours (another client may
    /// have deleted the key); [`DistributedLock::is_held`](crate::DistributedLock::is_held)
    /// asks Redis.
    pub fn is_lost(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.marked_lost())
            || Instant::now() >= self.loss_deadline()
    }

    /// The monotonic instant from which the hold counts as lost by the local clock alone
    /// ([`is_lost`](Self::is_lost), `check`, a watched lock's `on_lost`): the lease's end
    /// ([`valid_until`](Self::valid_until), counted from the invocation of the acquire or of
    /// the latest renewal confirmed) less a clock-drift allowance of 1% of the lifetime plus
    /// 2 ms, as RedLock's validity. So the holder hears of the loss before the key can
    /// expire on the server, even with the server's clock up to 1% faster than ours: e.g. at
    /// least 32 ms before for a 3 s lease, 302 ms for the 30 s watchdog lease. A RedLock
    /// lease's validity has that allowance taken off already: its `loss_deadline` is its
    /// `valid_until`.
    pub fn loss_deadline(&self) -> Instant {
        match &self.watch {
            Some(w) => w.loss_deadline(),
            // The lease's end itself if the clock cannot go back that far (a young process).
            None => self
                .valid_until
                .checked_sub(self.margin.unwrap_or_default())
                .unwrap_or(self.valid_until),
        }
    }

    /// True if the watchdog renews this hold.
    pub fn is_watched(&self) -> bool {
        self.watch.is_some()
    }

    /// The fencing token of this hold, for locks built with
    /// [`fencing`](crate::LockBuilder::fencing): strictly greater than the token of every
    /// earlier hold of the same key (see `docs/fencing.md`). `None` for other locks.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Notes that the hold was found lost; true the first time (for the stats). A watched
    /// hold is also marked lost for the watchdog, quietly (the caller is told by an error), so
    /// that the watchdog neither counts nor reports it again.
    pub(crate) fn note_lost(&mut self) -> bool {
        if self.loss_noted {
            return false;
        }
        self.loss_noted = true;
        self.watch.as_ref().is_none_or(|w| w.set_lost_quietly())
    }

    /// True once the hold's loss was noted (by this lease, or for a watched hold by the
    /// watchdog).
    pub(crate) fn loss_noted(&self) -> bool {
        self.loss_noted || self.watch.as_ref().is_some_and(|w| w.marked_lost())
    }
}

/// Printable form of a stored value: ASCII as is, other bytes as `\xNN`.
pub(crate) fn printable(value: &[u8]) -> String {
    value.escape_ascii().to_string()
}

/// The outcome of one acquire attempt: a [`Lease`], or what a primitive that hands out more
/// than one lease per acquire (a semaphore's permits) takes.
#[derive(Debug)]
pub(crate) enum Attempt<T = Lease> {
    /// Taken.
    Acquired(T),
    /// Held by another owner; `pttl` is the hold's remaining lifetime when the attempt's reply
    /// carried it (a waiter woken by pub/sub sleeps at most that long). `wake`: the channel a
    /// release of that hold is published on, when it is not the line's own (a primitive over
    /// many keys, refused by one of them); `None` for the line's channel.
    Held {
        pttl: Option<Duration>,
        wake: Option<String>,
    },
}

/// The clock-drift allowance of a lifetime `ttl`: 1% of it plus 2 ms (RedLock's; see
/// [`RedLock::clock_drift`](crate::RedLock::clock_drift)).
pub(crate) fn clock_drift(ttl: Duration) -> Duration {
    (ttl / 100).saturating_add(Duration::from_millis(2))
}

/// How long before the end of its lease (counted from the invocation of the acquire or
/// renewal that granted it) a hold of lifetime `ttl` counts as lost by the local clock: the
/// [`clock_drift`] allowance. The server's clock may run up to 1% faster than ours, and its
/// `PX` counts whole milliseconds: the holder must have stopped by then. Zero with the
/// `test-hooks` knob [`set_zero_loss_margin`] (a negative control of the crate's tests).
pub(crate) fn loss_margin(ttl: Duration) -> Duration {
    #[cfg(feature = "test-hooks")]
    if ZERO_LOSS_MARGIN.load(Ordering::Relaxed) {
        return Duration::ZERO;
    }
    clock_drift(ttl)
}

#[cfg(feature = "test-hooks")]
static ZERO_LOSS_MARGIN: AtomicBool = AtomicBool::new(false);

/// Test hook: with `true`, holds granted from now on in this process count as lost only at the
/// end of their lease, with no margin (the behaviour before 0.2, for the negative controls of
/// the crate's tests). Process-wide.
#[cfg(feature = "test-hooks")]
pub fn set_zero_loss_margin(zero: bool) {
    ZERO_LOSS_MARGIN.store(zero, Ordering::Relaxed);
}

/// The safety margin a won acquire must leave: the larger of the time its reply took and a
/// clock-drift allowance of 1% of the lifetime plus 2 ms (RedLock's). See
/// [`DistributedLock::try_acquire`](crate::DistributedLock::try_acquire).
pub(crate) fn arrival_margin(ttl: Duration, elapsed: Duration) -> Duration {
    elapsed.max(clock_drift(ttl))
}

/// Checks a win read at `now` against the time its command was sent (`lease.acquired_at()`):
/// a hold whose lifetime `ttl` leaves less than [`arrival_margin`] by the local clock is
/// handed back with `release` (owner-checked) and reported as [`LockError::LateReply`];
/// otherwise the lease is returned as it is.
pub(crate) fn checked_win(
    key: &str,
    mut lease: Lease,
    ttl: Duration,
    now: Instant,
    release: impl FnOnce(&Lease) -> Result<bool>,
) -> Result<Lease> {
    let elapsed = now.saturating_duration_since(lease.acquired_at());
    let left = ttl.saturating_sub(elapsed);
    if left > arrival_margin(ttl, elapsed) {
        return Ok(lease);
    }
    lease.stop_renewal();
    // Never handed out: a release that finds it gone is no lost hold (see `Stats`).
    lease.loss_noted = true;
    let released = release(&lease);
    log::warn!(
        "lock {key:?}: acquired, but the reply came {} ms after the acquire was sent, of a {} ms \
         lifetime; not handed out, released again ({})",
        elapsed.as_millis(),
        ttl.as_millis(),
        match &released {
            Ok(true) => "deleted".to_owned(),
            Ok(false) => "already gone, taken over, or past its lifetime".to_owned(),
            Err(e) => format!("release failed: {}; it expires by itself", e.report()),
        }
    );
    Err(LockError::LateReply {
        key: key.to_owned(),
        elapsed,
        ttl,
    })
}

/// The default lease of a watched lock, renewed every third of it: 30 s, as Redisson.
pub const WATCHDOG_DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A callback told that a watched hold was lost. It runs on the watchdog's renewal or deadline
/// thread: keep it short (set a flag, send on a channel), and do not block on the lock's
/// client in it.
pub type LostCallback = Arc<dyn Fn(&LostLock) + Send + Sync>;

/// What an `on_lost` callback is told.
#[derive(Debug, Clone)]
pub struct LostLock {
    key: String,
    reason: LossReason,
}

impl LostLock {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Why the hold is considered lost.
    pub fn reason(&self) -> LossReason {
        self.reason
    }
}

/// Why a watched hold was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal found the key gone or held by another owner.
    Gone,
    /// Renewals failed (Redis unreachable, paused or erroring) until the hold's loss deadline
    /// by the local clock ([`Lease::loss_deadline`]): the lock may expire on the server any
    /// moment, so it must be assumed lost.
    Expired,
}

/// Which kind of lock an event is about: the `strategy` label of the `metrics` counters. Each
/// lock type defines its own (`token`, `classic`, `reentrant`, `fair`, `read`, `write`,
/// `redlock`); the runtime passes it through without knowing the algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind(pub(crate) &'static str);

impl Kind {
    /// The kind labelled `label`.
    pub(crate) const fn new(label: &'static str) -> Kind {
        Kind(label)
    }
}

/// How a hold is renewed: which owner check runs before the `PEXPIRE` (the layout of the
/// hold), and the stats label its loss is counted under (the lock type's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewKind {
    /// A string value: `GET key == value`; renewed by `SET … IFEQ … PX` where the server has
    /// it.
    Value(Kind),
    /// A string value renewed by the script only (a lock type whose commands all stay
    /// scripts).
    ScriptedValue(Kind),
    /// A hash field (Redisson's `RLock` layout): `HEXISTS key value`.
    HashField(Kind),
    /// The owner's read holds of a read-write lock (Redisson's layout: the count in field
    /// `<owner>`, one timeout key per hold).
    ReadEntry(Kind),
    /// The owner's write holds of a read-write lock (field `<owner>:write`).
    WriteEntry(Kind),
    /// A member of a sorted set scored by its expiry in epoch milliseconds (Redisson's
    /// permit layout): `ZSCORE key value`, then the score becomes the server's time plus the
    /// lease.
    ScoredMember(Kind),
}

impl RenewKind {
    /// The kind's tag in `lua/renew_batch.lua`'s arguments, and the stats label of the hold's
    /// lock type.
    fn parts(self) -> (&'static str, Kind) {
        match self {
            RenewKind::Value(k) | RenewKind::ScriptedValue(k) => ("v", k),
            RenewKind::HashField(k) => ("h", k),
            RenewKind::ReadEntry(k) => ("r", k),
            RenewKind::WriteEntry(k) => ("w", k),
            RenewKind::ScoredMember(k) => ("z", k),
        }
    }

    /// The kind's tag in `lua/renew_batch.lua`'s arguments.
    pub(crate) fn tag(self) -> &'static str {
        self.parts().0
    }

    /// The stats label of the hold's lock type.
    pub(crate) fn label(self) -> Kind {
        self.parts().1
    }
}

/// One watched hold, shared by the holder's lease (strong) and the watchdog (weak).
pub(crate) struct WatchState {
    /// Shared with the lock (no copy per hold).
    pub(crate) key: Arc<str>,
    pub(crate) kind: RenewKind,
    /// The owner value, inline (no allocation per hold beyond the state itself).
    value: Inline,
    /// The lease each renewal grants.
    pub(crate) lease: Duration,
    /// Base of `valid_until_ns`.
    base: Instant,
    /// End of validity, in nanoseconds after `base`: renewed by the watchdog.
    valid_until_ns: AtomicU64,
    /// The [`loss_margin`] of the latest grant's lifetime, in nanoseconds.
    margin_ns: AtomicU64,
    lost: AtomicBool,
    stopped: AtomicBool,
    /// Renewed once, then no more (a fair lock's grant to a lock with an explicit ttl: the
    /// short grant lease is raised to the ttl once).
    once: AtomicBool,
    on_lost: Option<LostCallback>,
}

impl WatchState {
    /// The state of a hold of `key` by `value`, acquired with `lease` from `start` (taken
    /// before the acquire was sent).
    pub(crate) fn new(
        key: impl Into<Arc<str>>,
        kind: RenewKind,
        value: &[u8],
        lease: Duration,
        start: Instant,
        on_lost: Option<LostCallback>,
    ) -> Arc<Self> {
        Arc::new(WatchState {
            key: key.into(),
            kind,
            value: Inline::new(&[value]),
            lease,
            base: start,
            valid_until_ns: AtomicU64::new(nanos(lease)),
            margin_ns: AtomicU64::new(nanos(loss_margin(lease))),
            lost: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            once: AtomicBool::new(false),
            on_lost,
        })
    }

    pub(crate) fn value(&self) -> &[u8] {
        self.value.as_bytes()
    }

    /// A fair lock's grant: the hold is valid for only `valid` from its start until the first
    /// renewal (which gives it the full lease). With `once`, that renewal (raising the grant's
    /// short lease to the lock's ttl) is the only one: the hold is watched no more after it.
    /// Call before the state is watched.
    pub(crate) fn granted_for(&self, valid: Duration, once: bool) {
        let valid = valid.min(self.lease);
        self.margin_ns
            .store(nanos(loss_margin(valid)), Ordering::Release);
        self.valid_until_ns.store(nanos(valid), Ordering::Release);
        self.once.store(once, Ordering::Release);
    }

    /// True if the hold is renewed once only (see [`granted_for`](Self::granted_for)).
    pub(crate) fn renews_once(&self) -> bool {
        self.once.load(Ordering::Acquire)
    }

    /// Until when the hold is valid by the local clock, after the latest renewal.
    pub(crate) fn valid_until(&self) -> Instant {
        let since_base = Duration::from_nanos(self.valid_until_ns.load(Ordering::Acquire));
        crate::time::saturating_add(self.base, since_base)
    }

    /// A renewal (or an extend) sent at `start` gave the hold `ttl` more.
    pub(crate) fn renewed(&self, start: Instant, ttl: Duration) {
        let since_base = start.saturating_duration_since(self.base);
        let until = nanos(since_base.saturating_add(ttl));
        // The margin first: a reader that sees the new validity sees its margin.
        self.margin_ns
            .store(nanos(loss_margin(ttl)), Ordering::Release);
        self.valid_until_ns.fetch_max(until, Ordering::AcqRel);
    }

    /// From when the hold counts as lost by the local clock: its validity less the margin
    /// (see [`Lease::loss_deadline`]).
    pub(crate) fn loss_deadline(&self) -> Instant {
        let margin = Duration::from_nanos(self.margin_ns.load(Ordering::Acquire));
        let end = self.valid_until();
        end.checked_sub(margin).unwrap_or(end)
    }

    /// Marks the hold lost without telling anyone (the holder learnt it from an error): the
    /// watchdog then drops it without a report. True if it was not marked before.
    pub(crate) fn set_lost_quietly(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }

    /// True once marked lost (not merely past its validity).
    pub(crate) fn marked_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the hold lost (once): logs it and runs the callback. Ignored after [`stop`].
    /// True if this call marked it.
    ///
    /// [`stop`]: Self::stop
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        if self.is_stopped() || self.lost.swap(true, Ordering::AcqRel) {
            return false;
        }
        let why = match reason {
            LossReason::Gone => "the renewal found it gone or held by another owner",
            LossReason::Expired => "renewals failed until its loss deadline",
        };
        log::warn!("lock {:?}: watched hold lost ({why})", self.key);
        if let Some(cb) = &self.on_lost {
            cb(&LostLock {
                key: self.key.to_string(),
                reason,
            });
        }
        true
    }

    /// The holder released (or is releasing) the hold: renew it no more.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keeps_value_and_validity() {
        let start = Instant::now();
        let l = Lease::new(b"abc", start, Duration::from_secs(1));
        assert_eq!(l.value(), b"abc");
        assert_eq!(l.valid_until(), start + Duration::from_secs(1));
        assert!(!l.is_expired());
        let old = Lease::new(b"x", start - Duration::from_secs(2), Duration::from_secs(1));
        assert!(old.is_expired());
        assert_eq!(old.remaining(), Duration::ZERO);
    }

    #[test]
    fn loss_deadline_is_the_lease_end_less_the_drift() {
        let ms = Duration::from_millis;
        let start = Instant::now();
        let mut l = Lease::new(b"a", start, ms(3_000));
        assert_eq!(l.loss_deadline(), start + ms(2_968));
        assert!(!l.is_lost());
        l.renew(None, start + ms(1_000), ms(1_000));
        assert_eq!(l.loss_deadline(), start + ms(1_988));
        // RedLock: the validity has the drift taken off already.
        let mut r = Lease::new(b"a", start, ms(970)).drift_included();
        assert_eq!(r.loss_deadline(), start + ms(970));
        r.renew(None, start, ms(980));
        assert_eq!(r.loss_deadline(), start + ms(980));
        // Past the deadline but not the lease's end: lost, not expired.
        let Some(sent) = Instant::now().checked_sub(ms(995)) else {
            return;
        };
        let near = Lease::new(b"a", sent, ms(1_000));
        assert!(near.is_lost());
        assert!(!near.is_expired());
        // A watched hold: the margin of the lease each renewal grants.
        let w = WatchState::new(
            "k",
            RenewKind::Value(crate::stats::Kind::new("t")),
            b"a",
            ms(3_000),
            start,
            None,
        );
        assert_eq!(w.loss_deadline(), start + ms(2_968));
        w.granted_for(ms(100), false);
        assert_eq!(w.loss_deadline(), start + ms(97));
        w.renewed(start + ms(50), ms(3_000));
        assert_eq!(w.loss_deadline(), start + ms(3_018));
    }

    #[test]
    fn arrival_margin_is_the_reply_time_or_the_drift() {
        let ms = Duration::from_millis;
        // Drift: 1% of the lifetime plus 2 ms.
        assert_eq!(arrival_margin(ms(1_000), ms(1)), ms(12));
        assert_eq!(arrival_margin(Duration::from_secs(30), ms(1)), ms(302));
        // A slow reply: its own duration.
        assert_eq!(arrival_margin(ms(1_000), ms(400)), ms(400));
        assert_eq!(
            arrival_margin(Duration::MAX, ms(1)),
            Duration::MAX / 100 + ms(2)
        );
    }

    #[test]
    fn late_wins_are_released_and_refused() {
        let ms = Duration::from_millis;
        let ttl = ms(1_000);
        let fresh = Lease::new(b"a", Instant::now(), ttl);
        let kept = checked_win("k", fresh, ttl, Instant::now(), |_| {
            panic!("a timely win is not released")
        });
        assert!(kept.is_ok());
        // Sent 600 ms ago: 400 ms left < 600 ms margin.
        let Some(sent) = Instant::now().checked_sub(ms(600)) else {
            return; // a monotonic clock this young cannot date the lease back
        };
        let mut released = false;
        let late = checked_win("k", Lease::new(b"a", sent, ttl), ttl, Instant::now(), |l| {
            released = l.value() == b"a";
            Ok(true)
        });
        assert!(released);
        match late {
            Err(LockError::LateReply {
                key,
                elapsed,
                ttl: t,
            }) => {
                assert_eq!((key.as_str(), t), ("k", ttl));
                assert!(elapsed >= ms(600));
            }
            other => panic!("{other:?}"),
        }
        // A release that fails still refuses the win.
        let failed = checked_win(
            "k",
            Lease::new(b"a", sent, ttl),
            ttl,
            Instant::now(),
            |_| Err(LockError::Lost { key: "k".into() }),
        );
        assert!(matches!(failed, Err(LockError::LateReply { .. })));
    }

    #[test]
    fn printable_escapes_binary() {
        assert_eq!(printable(b"12\x00\xff"), "12\\x00\\xff");
    }
}
