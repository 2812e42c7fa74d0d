//! The [`DistributedLock`] trait, the [`Lease`] it hands out and the RAII [`LockGuard`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::subscriber::Wakeups;
use crate::client::waiters::WaitQueues;
use crate::client::watchdog::WatchState;
use crate::error::{LockError, Result};
use crate::retry::{Attempts, RetryPolicy};

/// A lock on one Redis key, shared by threads (`Send + Sync`) and usable as
/// `Box<dyn DistributedLock>` / `Arc<dyn DistributedLock>`.
///
/// The names follow `parking_lot`/`std::sync`: [`try_lock`](Self::try_lock) makes one attempt,
/// [`lock`](Self::lock) waits under the lock's [`RetryPolicy`], and
/// [`try_lock_for`](Self::try_lock_for) waits at most the caller's duration. Each returns a
/// [`LockGuard`] that releases the lock when dropped. The lower-level methods
/// ([`try_acquire`](Self::try_acquire), [`release`](Self::release), [`extend`](Self::extend),
/// [`is_held`](Self::is_held)) work on a [`Lease`] for callers who manage the hold themselves.
///
/// Unlike an in-process mutex, a distributed lock can be lost while held: its lifetime can run
/// out. That is never silent here: [`LockGuard::unlock`] returns `Ok(false)`,
/// [`LockGuard::extend`] and [`LockGuard::check`] return [`LockError::Lost`], and a guard dropped
/// after losing its lock logs a warning.
pub trait DistributedLock: Send + Sync + fmt::Debug {
    /// The Redis key of the lock.
    fn key(&self) -> &str;

    /// The lock's lifetime: how long a hold lasts unless extended.
    fn ttl(&self) -> Duration;

    /// The policy [`lock`](Self::lock) follows.
    fn retry_policy(&self) -> &RetryPolicy;

    /// One attempt: `Ok(Some(lease))` when taken, `Ok(None)` when held by another owner.
    ///
    /// A win is checked against the time the command was sent: if the reply came so late that
    /// less than a safety margin of the lifetime is left by the local clock, the hold is
    /// released again (owner-checked) and the attempt fails with [`LockError::LateReply`]
    /// instead of handing out a hold that may already have expired in Redis (and been taken
    /// by another client). The margin is the larger of the time the reply took (a release or
    /// extend may take as long) and a clock-drift allowance of 1% of the lifetime plus 2 ms.
    /// So a hold is handed out only while `ttl − elapsed > max(elapsed, ttl/100 + 2 ms)`, e.g.
    /// for a 1 s lifetime only if the reply came within about 495 ms. Blocking acquires count
    /// such an attempt as refused and try again.
    fn try_acquire(&self) -> Result<Option<Lease>>;

    /// Releases the hold described by `lease` if it is still ours: `Ok(true)` when it was ours and
    /// is now free, `Ok(false)` when it had expired or belonged to another owner (nothing is
    /// deleted then).
    fn release(&self, lease: &Lease) -> Result<bool>;

    /// Gives our hold a new lifetime of `ttl` from now. [`LockError::Lost`] when it is no longer
    /// ours. Updates `lease` (validity, and the value for strategies that change it).
    ///
    /// The new lifetime *replaces* the time left; it is not added to it. `extend(30 s)` on a
    /// hold with 10 s left leaves 30 s, not 40 s, and a `ttl` shorter than the time left
    /// shortens the hold (except a [`ReadWriteLock`](crate::ReadWriteLock) hold, whose extend
    /// never shortens anything). redis-py's `Lock.extend(t)` adds `t` by default; this is its
    /// `extend(t, replace_ttl=True)`.
    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()>;

    /// Asks Redis whether the hold is still ours and within its lifetime.
    fn is_held(&self, lease: &Lease) -> Result<bool>;

    /// One attempt; [`LockError::Held`] when another owner holds the lock.
    fn try_lock(&self) -> Result<LockGuard<'_>>;

    /// Waits for the lock under [`retry_policy`](Self::retry_policy);
    /// [`LockError::Timeout`] when the policy gives up. A policy without `max_wait` and
    /// without `max_retries` waits forever; see [`RetryPolicy`] for the bounds.
    ///
    /// A thread that gives up while other threads of the same client ahead of it in line
    /// could not reach Redis gets [`LockError::Connection`] instead: an outage is not
    /// contention.
    fn lock(&self) -> Result<LockGuard<'_>>;

    /// Waits for the lock at most `wait` (the policy's sleeps, the caller's deadline; the
    /// policy's `max_retries` and `max_wait` do not apply); [`LockError::Timeout`] when the
    /// time runs out. The call returns within `wait` plus the time of the attempt under way at
    /// the deadline and of one check after it: normally a round trip or two; against an
    /// unresponsive server, bounded by the client's connect and command timeouts (RedLock: its
    /// node timeout). A `wait` so long that the deadline
    /// cannot be represented (e.g. `Duration::MAX`) means no deadline: wait forever.
    /// Errors as for [`lock`](Self::lock).
    fn try_lock_for(&self, wait: Duration) -> Result<LockGuard<'_>>;

    /// Waits for the lock until `deadline` at the latest (the policy's sleeps, the caller's
    /// deadline); [`LockError::Timeout`] when it passes. A deadline already past makes one
    /// attempt. The same as [`try_lock_for`](Self::try_lock_for) with the time left.
    fn try_lock_until(&self, deadline: Instant) -> Result<LockGuard<'_>> {
        self.try_lock_for(deadline.saturating_duration_since(Instant::now()))
    }

    /// Asks the server whether anyone holds the lock now, and for how long (one round trip;
    /// RedLock: one to each node, at once). Whoever holds it: this caller, another thread,
    /// another process. [`is_locked`](Self::is_locked) and
    /// [`remaining_ttl`](Self::remaining_ttl) are this answer's two halves.
    ///
    /// Per lock type:
    /// - Token, Fair, Reentrant: the key exists (a string, or Redisson's hash); `ttl` is its
    ///   `PTTL`.
    /// - Classic: the key holds an expiry that has not passed by this client's clock (a stale
    ///   value is [`LockState::Unlocked`](crate::LockState::Unlocked): the next acquire takes it over); `ttl` is the time
    ///   left until that expiry, or the key's `PTTL` if shorter (`key_ttl`). A value that is no
    ///   expiry in the lock's encoding is [`LockError::Corrupt`].
    /// - [`ReadLock`](crate::ReadLock) / [`WriteLock`](crate::WriteLock): the hash is in read
    ///   (write) mode, as Redisson's `isLocked` of its read (write) lock; `ttl` is the hash's
    ///   `PTTL` (the latest hold's lifetime).
    /// - RedLock: a majority of the nodes hold one same value; `ttl` is the time until fewer
    ///   than a majority of them will (the majority's shortest remaining `PTTL`, counted from
    ///   the longest). Nodes that fail or do not answer within the node timeout count for
    ///   nothing; when the answers cannot tell (the unanswered nodes would decide), the call
    ///   fails with [`LockError::Connection`].
    ///
    /// A key of another Redis type than the lock writes is [`LockError::WrongType`], as for
    /// its acquires. Sends `EVALSHA` of a read-only script (`TYPE`, `PTTL`, and `GET` or
    /// `HGET`): an ACL user needs those commands on the key besides the lock's own.
    ///
    /// The default implementation, for lock types outside this crate, returns
    /// [`LockError::InvalidArgument`] ("not supported"); every lock of this crate answers.
    fn state(&self) -> Result<crate::LockState> {
        Err(LockError::invalid(
            self.key(),
            "this lock type does not implement the server-side queries (state)",
        ))
    }

    /// True when anyone holds the lock now, by asking the server: see [`state`](Self::state)
    /// for what "held" means per lock type. Redisson's `isLocked`.
    fn is_locked(&self) -> Result<bool> {
        Ok(self.state()?.is_locked())
    }

    /// The time left before the current hold ends unless renewed, as the server counts it
    /// (`PTTL`; not the local estimate of [`Lease::remaining`]), whoever holds it. `None` when
    /// nobody holds the lock, or when the holder's key has no expiry in Redis (a value written
    /// by another program); [`is_locked`](Self::is_locked) or [`state`](Self::state) tell the
    /// two apart. See [`state`](Self::state) for the per-type meaning (Classic: the stored
    /// expiry; RedLock: the majority's). Redisson's `remainTimeToLive`.
    fn remaining_ttl(&self) -> Result<Option<Duration>> {
        Ok(self.state()?.ttl())
    }

    /// **Dangerous, for administrators**: deletes the lock whoever holds it, and publishes the
    /// release on the lock's channel so that waiters (here, in other processes, in Redisson)
    /// wake at once, as Redisson's `forceUnlock`. `Ok(true)` when something was deleted,
    /// `Ok(false)` when the lock was free.
    ///
    /// The holder is not told: it finds out at its next `extend`, `check`, `unlock` or (watched
    /// locks) renewal, and until then it goes on working while another owner may already hold
    /// the lock. Use it to clear a lock left by a holder known to be dead, not to break a live
    /// one. Per lock type: Token and Reentrant publish Redisson's release message; Classic
    /// publishes nothing (its legacy peers poll); Fair publishes nothing and keeps its queue
    /// (the head waiter takes the lock at its next poll, within about 120 ms); a [`ReadLock`](crate::ReadLock)
    /// ([`WriteLock`](crate::WriteLock)) deletes the hash only while it is in read (write)
    /// mode, as Redisson's (the per-read-hold timeout keys expire by themselves); RedLock
    /// deletes the key on every node and fails with [`LockError::Connection`] when fewer than
    /// a majority answered (the lock may then live on). Sends `EVALSHA` of a script that
    /// runs `DEL` and `PUBLISH` (and `TYPE`, `HGET` for the read-write lock).
    ///
    /// The default implementation, for lock types outside this crate, returns
    /// [`LockError::InvalidArgument`] ("not supported").
    fn force_unlock(&self) -> Result<bool> {
        Err(LockError::invalid(
            self.key(),
            "this lock type does not implement force_unlock",
        ))
    }
}

/// Owned guards for locks behind an [`Arc`], like `lock_api`'s `lock_arc`: the guard keeps the
/// lock alive, so a hold can cross function and thread boundaries and sit in a struct.
/// Implemented for `Arc<dyn DistributedLock>` and for `Arc` of every lock type.
///
/// ```no_run
/// use std::sync::Arc;
/// use redis_dlock::{ArcLockExt, DistributedLock, LockClient};
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let lock: Arc<dyn DistributedLock> = Arc::from(client.lock("jobs:import").build()?);
/// let guard = lock.lock_arc()?; // OwnedLockGuard: 'static, Send
/// std::thread::spawn(move || {
///     // ... work under the lock on another thread ...
///     guard.unlock()
/// })
/// .join()
/// .expect("worker")?;
/// # Ok(()) }
/// ```
pub trait ArcLockExt<L: DistributedLock + ?Sized> {
    /// [`DistributedLock::lock`], returning an owned guard.
    fn lock_arc(&self) -> Result<OwnedLockGuard<L>>;
    /// [`DistributedLock::try_lock`], returning an owned guard.
    fn try_lock_arc(&self) -> Result<OwnedLockGuard<L>>;
    /// [`DistributedLock::try_lock_for`], returning an owned guard.
    fn try_lock_arc_for(&self, wait: Duration) -> Result<OwnedLockGuard<L>>;
    /// [`DistributedLock::try_lock_until`], returning an owned guard.
    fn try_lock_arc_until(&self, deadline: Instant) -> Result<OwnedLockGuard<L>>;
}

impl<L: DistributedLock + ?Sized> ArcLockExt<L> for Arc<L> {
    fn lock_arc(&self) -> Result<OwnedLockGuard<L>> {
        let lease = self.lock()?.into_lease();
        Ok(OwnedLockGuard::new(Arc::clone(self), lease))
    }

    fn try_lock_arc(&self) -> Result<OwnedLockGuard<L>> {
        let lease = self.try_lock()?.into_lease();
        Ok(OwnedLockGuard::new(Arc::clone(self), lease))
    }

    fn try_lock_arc_for(&self, wait: Duration) -> Result<OwnedLockGuard<L>> {
        let lease = self.try_lock_for(wait)?.into_lease();
        Ok(OwnedLockGuard::new(Arc::clone(self), lease))
    }

    fn try_lock_arc_until(&self, deadline: Instant) -> Result<OwnedLockGuard<L>> {
        let lease = self.try_lock_until(deadline)?.into_lease();
        Ok(OwnedLockGuard::new(Arc::clone(self), lease))
    }
}

/// A held lock that owns an `Arc` of its lock ([`ArcLockExt`]); releases it when dropped, like
/// [`LockGuard`].
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct OwnedLockGuard<L: DistributedLock + ?Sized = dyn DistributedLock> {
    lock: Arc<L>,
    lease: Lease,
    armed: bool,
}

impl<L: DistributedLock + ?Sized> fmt::Debug for OwnedLockGuard<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLockGuard")
            .field("key", &self.lock.key())
            .field("lease", &self.lease)
            .finish()
    }
}

impl<L: DistributedLock + ?Sized> OwnedLockGuard<L> {
    /// Wraps a fresh lease of `lock`.
    pub fn new(lock: Arc<L>, lease: Lease) -> Self {
        OwnedLockGuard {
            lock,
            lease,
            armed: true,
        }
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &Arc<L> {
        &self.lock
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// The lease behind the guard (value, validity, fencing token).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The fencing token of this hold, if the lock was built with fencing.
    pub fn fence(&self) -> Option<u64> {
        self.lease.fence()
    }

    /// Time left before the hold expires, by the local clock.
    pub fn remaining(&self) -> Duration {
        self.lease.remaining()
    }

    /// True once the hold must be taken as lost, without a round trip: see [`Lease::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Asks Redis whether the lock is still ours and within its lifetime.
    pub fn is_held(&self) -> Result<bool> {
        self.lock.is_held(&self.lease)
    }

    /// `Ok(())` while the lock is ours, [`LockError::Lost`] otherwise; see
    /// [`LockGuard::check`].
    pub fn check(&self) -> Result<()> {
        check_hold(self.lock.as_ref(), &self.lease)
    }

    /// Extends the hold to `ttl` from now; [`LockError::Lost`] if it is no longer ours. `ttl`
    /// replaces the time left, it is not added to it (see [`DistributedLock::extend`]).
    pub fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.lock.extend(&mut self.lease, ttl)
    }

    /// Releases the lock now: `Ok(true)` if it was still ours, `Ok(false)` if it had been lost.
    pub fn unlock(mut self) -> Result<bool> {
        self.armed = false;
        self.lock.release(&self.lease)
    }

    /// Gives up the guard without releasing; see [`LockGuard::into_lease`].
    pub fn into_lease(mut self) -> Lease {
        self.armed = false;
        self.lease.clone()
    }
}

impl<L: DistributedLock + ?Sized> Drop for OwnedLockGuard<L> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        release_on_drop(self.lock.as_ref(), &self.lease);
    }
}

/// What a guard's `check()` does, for both guard kinds: a hold already known lost fails
/// without a round trip; otherwise Redis is asked.
fn check_hold<L: DistributedLock + ?Sized>(lock: &L, lease: &Lease) -> Result<()> {
    if !lease.is_lost() && lock.is_held(lease)? {
        Ok(())
    } else {
        Err(LockError::Lost {
            key: lock.key().to_owned(),
        })
    }
}

/// What dropping an armed guard does, for both guard kinds: stop renewals even if the release
/// fails, then release owner-checked. Nobody sees the outcome, so a failure and a loss are
/// logged here (`release` itself returns them without a warning).
fn release_on_drop<L: DistributedLock + ?Sized>(lock: &L, lease: &Lease) {
    lease.stop_renewal();
    match lock.release(lease) {
        Ok(true) => {}
        Ok(false) => log::warn!(
            "lock {:?}: guard dropped after the lock was lost (it expired, or another owner \
             took it over); no other owner's lock was deleted",
            lock.key()
        ),
        Err(e) => log::error!(
            "lock {:?}: release on drop failed: {}",
            lock.key(),
            e.report()
        ),
    }
}

/// The safety margin a won acquire must leave: the larger of the time its reply took and a
/// clock-drift allowance of 1% of the lifetime plus 2 ms (RedLock's). See
/// [`DistributedLock::try_acquire`].
pub(crate) fn arrival_margin(ttl: Duration, elapsed: Duration) -> Duration {
    let drift = (ttl / 100).saturating_add(Duration::from_millis(2));
    elapsed.max(drift)
}

/// Checks a win against the time its command was sent (`lease.acquired_at()`): a hold whose
/// lifetime `ttl` leaves less than [`arrival_margin`] by the local clock is handed back with
/// `release` (owner-checked) and reported as [`LockError::LateReply`]; otherwise the lease is
/// returned as it is.
pub(crate) fn checked_win(
    key: &str,
    lease: Lease,
    ttl: Duration,
    release: impl FnOnce(&Lease) -> Result<bool>,
) -> Result<Lease> {
    let elapsed = lease.acquired_at().elapsed();
    let left = ttl.saturating_sub(elapsed);
    if left > arrival_margin(ttl, elapsed) {
        return Ok(lease);
    }
    lease.stop_renewal();
    // Never handed out: a release that finds it gone is no lost hold (see `Stats`).
    let mut lease = lease;
    lease.loss_noted = true;
    let released = release(&lease);
    log::warn!(
        "lock {key:?}: acquired, but the reply came {} ms after the acquire was sent, of a {} ms \
         lifetime; not handed out, released again ({})",
        elapsed.as_millis(),
        ttl.as_millis(),
        match &released {
            Ok(true) => "deleted".to_owned(),
            Ok(false) => "already gone or taken over".to_owned(),
            Err(e) => format!("release failed: {}; it expires by itself", e.report()),
        }
    );
    Err(LockError::LateReply {
        key: key.to_owned(),
        elapsed,
        ttl,
    })
}

/// [`checked_win`] for the outcome of an attempt: a refusal passes unchanged.
pub(crate) fn checked_attempt(
    key: &str,
    attempt: Attempt,
    ttl: Duration,
    release: impl FnOnce(&Lease) -> Result<bool>,
) -> Result<Attempt> {
    match attempt {
        Attempt::Acquired(lease) => checked_win(key, lease, ttl, release).map(Attempt::Acquired),
        held => Ok(held),
    }
}

/// The longest owner value a lease stores inline (no allocation per acquire): room for a
/// 128-bit token in hex, or an owner id `<128-bit instance in hex>:<thread number>`.
pub(crate) const VALUE_CAPACITY: usize = 64;

/// One successful acquire: the owner value written to Redis, how long the hold is valid and,
/// when asked for, its fencing token.
///
/// The lease of a *watched* lock (built without an explicit lifetime) keeps the watchdog
/// renewing the hold for as long as the lease, or a clone of it, lives and has not been
/// released: dropping every copy stops the renewals, and the hold then expires by itself.
#[derive(Clone)]
pub struct Lease {
    value: [u8; VALUE_CAPACITY],
    len: u8,
    acquired_at: Instant,
    valid_until: Instant,
    fence: Option<u64>,
    watch: Option<Arc<WatchState>>,
    /// This lease was found lost and counted in the client's stats.
    loss_noted: bool,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        self.value() == other.value()
            && self.acquired_at == other.acquired_at
            && self.valid_until == other.valid_until
            && self.fence == other.fence
            && match (&self.watch, &other.watch) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
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
        let mut buf = [0u8; VALUE_CAPACITY];
        let len = value.len().min(VALUE_CAPACITY);
        buf[..len].copy_from_slice(&value[..len]);
        Lease {
            value: buf,
            len: len as u8,
            acquired_at: start,
            valid_until: crate::time::saturating_add(start, ttl),
            fence: None,
            watch: None,
            loss_noted: false,
        }
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
            let fresh = Lease::new(value, start, ttl);
            self.value = fresh.value;
            self.len = fresh.len;
        }
        self.valid_until = crate::time::saturating_add(start, ttl);
        if let Some(w) = &self.watch {
            w.renewed(start, ttl);
        }
    }

    /// The owner value stored at the key (a token, or a legacy expiry timestamp).
    pub fn value(&self) -> &[u8] {
        &self.value[..usize::from(self.len)]
    }

    /// When the lock was acquired (monotonic clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The monotonic instant until which the hold is valid, measured from before the acquire
    /// (or the latest extend or watchdog renewal) was sent.
    pub fn valid_until(&self) -> Instant {
        match &self.watch {
            Some(w) => w.valid_until(),
            None => self.valid_until,
        }
    }

    /// Time left before the hold expires (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// True once the lifetime has passed by the local monotonic clock. Costs no round trip.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until()
    }

    /// True once the hold must be taken as lost, without a round trip: its lifetime passed by
    /// the local clock, or (watched locks) the watchdog found it gone or could not renew it in
    /// time. False does not prove the hold is still ours (another client may have deleted the
    /// key); [`DistributedLock::is_held`] asks Redis.
    pub fn is_lost(&self) -> bool {
        match &self.watch {
            Some(w) => w.is_lost(),
            None => self.is_expired(),
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
}

impl crate::stats::LossNote for Lease {
    fn note_lost(&mut self) -> bool {
        Lease::note_lost(self)
    }

    fn loss_noted(&self) -> bool {
        Lease::loss_noted(self)
    }
}

/// Printable form of a stored value: ASCII as is, other bytes as `\xNN`.
pub(crate) fn printable(value: &[u8]) -> String {
    value.escape_ascii().to_string()
}

/// A held lock; releases it when dropped.
///
/// Dropping releases with an owner check and logs the outcome (a release error or a lost lock is
/// logged, never a panic). Call [`unlock`](Self::unlock) to see the result instead.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<'a> {
    lock: &'a dyn DistributedLock,
    lease: Lease,
    armed: bool,
}

impl fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("lease", &self.lease)
            .finish()
    }
}

impl<'a> LockGuard<'a> {
    /// Wraps a fresh lease of `lock`.
    pub fn new(lock: &'a dyn DistributedLock, lease: Lease) -> Self {
        LockGuard {
            lock,
            lease,
            armed: true,
        }
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// The owner value stored at the key.
    pub fn value(&self) -> &[u8] {
        self.lease.value()
    }

    /// The monotonic instant until which the hold is valid.
    pub fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }

    /// Time left before the hold expires.
    pub fn remaining(&self) -> Duration {
        self.lease.remaining()
    }

    /// True once the lifetime has passed by the local clock (no round trip).
    pub fn is_expired(&self) -> bool {
        self.lease.is_expired()
    }

    /// The lease behind the guard.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The fencing token of this hold (locks built with
    /// [`fencing`](crate::LockBuilder::fencing)); pass it to the resource the lock protects.
    pub fn fence(&self) -> Option<u64> {
        self.lease.fence()
    }

    /// True once the hold must be taken as lost, without a round trip: see [`Lease::is_lost`].
    /// For a watched lock this is how the watchdog tells the holder that renewal failed.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Asks Redis whether the lock is still ours and within its lifetime.
    pub fn is_held(&self) -> Result<bool> {
        self.lock.is_held(&self.lease)
    }

    /// `Ok(())` while the lock is ours, [`LockError::Lost`] otherwise: for `guard.check()?`
    /// before a step that must run under the lock. A hold already known lost
    /// ([`is_lost`](Self::is_lost)) fails without a round trip; otherwise Redis is asked.
    pub fn check(&self) -> Result<()> {
        check_hold(self.lock, &self.lease)
    }

    /// Extends the hold to `ttl` from now; [`LockError::Lost`] if it is no longer ours. `ttl`
    /// replaces the time left, it is not added to it (see [`DistributedLock::extend`]).
    pub fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.lock.extend(&mut self.lease, ttl)
    }

    /// Releases the lock now: `Ok(true)` if it was still ours, `Ok(false)` if it had been lost
    /// (expired, or taken over by another owner), in which case no other owner's lock was deleted.
    pub fn unlock(mut self) -> Result<bool> {
        self.armed = false;
        self.lock.release(&self.lease)
    }

    /// Gives up the guard without releasing: the hold stays until it expires or
    /// [`DistributedLock::release`] is called with the returned lease. A watched hold stays
    /// renewed while the returned lease (or a clone) lives.
    pub fn into_lease(mut self) -> Lease {
        self.armed = false;
        self.lease.clone()
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        release_on_drop(self.lock, &self.lease);
    }
}

/// The outcome of one acquire attempt.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Taken.
    Acquired(Lease),
    /// Held by another owner; `pttl` is the hold's remaining lifetime when the attempt's reply
    /// carried it (a waiter woken by pub/sub sleeps at most that long).
    Held { pttl: Option<Duration> },
}

impl crate::stats::Outcome for Attempt {
    fn won(&self) -> bool {
        matches!(self, Attempt::Acquired(_))
    }
}

impl From<Option<Lease>> for Attempt {
    fn from(lease: Option<Lease>) -> Self {
        match lease {
            Some(lease) => Attempt::Acquired(lease),
            None => Attempt::Held { pttl: None },
        }
    }
}

/// The blocking acquire of a lock that waits in the in-process line named by its key, FIFO,
/// with `try_acquire` as the attempt. `on_give_up` may turn the final [`LockError::Timeout`]
/// into a more precise error (e.g. a wrong-type key).
pub(crate) fn acquire_blocking<'a, L: DistributedLock>(
    lock: &'a L,
    queues: &WaitQueues,
    attempts: Attempts<'_>,
    on_give_up: impl FnOnce() -> Result<()>,
) -> Result<LockGuard<'a>> {
    let line = Line {
        queues,
        name: lock.key(),
        fifo: true,
        barge: false,
        wake: None,
    };
    acquire_in_line(
        lock,
        line,
        attempts,
        || lock.try_acquire().map(Attempt::from),
        |_| on_give_up(),
    )
}

/// Where a blocking acquire waits in this process, and how.
pub(crate) struct Line<'q> {
    /// The client's waiter lines.
    pub(crate) queues: &'q WaitQueues,
    /// The line's name: the lock key, or one name per mode of a read-write lock.
    pub(crate) name: &'q str,
    /// Wait to be the head of the line before each attempt. Without it the line only wakes
    /// the thread early when a local holder releases (readers, who may all get in together).
    pub(crate) fifo: bool,
    /// Make the first attempt even if others wait in the line (a thread that already holds
    /// the lock and would otherwise wait behind a thread waiting for it).
    pub(crate) barge: bool,
    /// Releases are published on this channel: wait for the message instead of polling.
    pub(crate) wake: Option<Wake<'q>>,
}

/// Pub/sub wake-ups of a line: the client's subscriber and the lock's channel.
pub(crate) struct Wake<'q> {
    pub(crate) wakeups: &'q Wakeups,
    pub(crate) channel: &'q str,
}

/// The blocking acquire loop shared by every lock.
///
/// The first attempt goes straight to Redis unless other threads of this client already wait
/// in the line (and `barge` is off); then the thread joins the line ([`WaitQueues`]): only its
/// head makes attempts (with `fifo`), and a local release wakes it at once.
///
/// Between attempts the thread sleeps by the retry policy, unless the line has a pub/sub
/// [`Wake`]: after its first refused attempt it subscribes to the lock's channel (confirmed by
/// the server before the next attempt, so no release in between goes unheard) and then sleeps
/// until a release is published, at most the holder's remaining lifetime as the refused
/// attempt reported it, never past the deadline, and never longer than the poll interval
/// ([`WaitQueues::poll_interval`]: 100–120 ms, or 20–30 ms for a line whose lock was last
/// freed without a published release; at least the policy's longest sleep). A holder that
/// releases without publishing (a foreign or legacy locker) is thus noticed within the poll
/// interval, whatever its lifetime. Without a confirmed subscription (pub/sub unavailable,
/// subscriber reconnecting) or without a reported lifetime it falls back to the policy's
/// sleeps.
///
/// The handoff courtesy ([`WaitQueues::take_courtesy`]) is slept before the first attempt,
/// never past the deadline. A thread that reaches its deadline still waiting for its turn
/// first waits for the outcome of the attempt on the wire ahead of it, if any (at most as long
/// as it has waited, and at least 1 s); when the line's latest attempt failed to reach Redis,
/// or is still without a reply, it reports [`LockError::Connection`] naming that failure, not
/// a contention timeout.
///
/// `on_give_up` gets the number of attempts made and may replace the final
/// [`LockError::Timeout`] with a more precise error.
pub(crate) fn acquire_in_line<'a, L: DistributedLock>(
    lock: &'a L,
    line: Line<'_>,
    mut attempts: Attempts<'_>,
    mut attempt: impl FnMut() -> Result<Attempt>,
    on_give_up: impl FnOnce(u32) -> Result<()>,
) -> Result<LockGuard<'a>> {
    let key = lock.key();
    let mut pttl = None;
    // The deadline, or for a count-limited policy the longest its retries could take, so a
    // retry limit still ends every wait; `None` only for a wait without any limit.
    let deadline = attempts.queue_deadline();
    if !line.barge {
        if let Some(until) = line.queues.take_courtesy(line.name) {
            // This client just released the lock while other clients waited: let them in,
            // but never past the caller's deadline.
            let until = deadline.map_or(until, |d| until.min(d));
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
    }
    // The last attempt won too late (a slow server): reported instead of a timeout.
    let mut late = None;
    if line.barge || !line.queues.has_waiters(line.name) {
        attempts.record();
        match refused_if_late(attempt(), &mut late)? {
            Attempt::Acquired(lease) => return Ok(LockGuard::new(lock, lease)),
            Attempt::Held { pttl: p } => pttl = p,
        }
    }
    let mut ticket = line.queues.enqueue(line.name);
    log::trace!(
        "lock {key:?}: waiting behind {} threads of this process",
        ticket.ahead()
    );
    let mut subscription = None;
    let mut stalled = None;
    let mut polled = false;
    loop {
        if attempts.made() > 0 {
            let Some(backoff) = attempts.next_sleep() else {
                break;
            };
            let mut fresh = false;
            if subscription.is_none() {
                if let Some(wake) = &line.wake {
                    subscription = wake.wakeups.subscribe(wake.channel, line.name, deadline);
                    // Confirmed just now: a release since the refused attempt may have been
                    // missed, so try again at once.
                    fresh = subscription.as_ref().is_some_and(|s| s.is_confirmed());
                }
            }
            let listening = subscription.as_ref().is_some_and(|s| s.is_confirmed());
            // Beside the subscription, a poll: a holder that frees the lock without
            // publishing (a foreign or legacy locker) is noticed within the poll interval.
            let mut poll = None;
            let sleep = match pttl {
                _ if fresh => Duration::ZERO,
                // Bounded by the deadline, or for a count-limited policy by the longest its
                // retries could take, so a retry limit still ends the wait.
                Some(p) if listening => {
                    let floor = lock.retry_policy().max_delay;
                    let interval = line.queues.poll_interval(line.name, floor);
                    poll = (interval < p).then_some(interval);
                    let p = p.min(interval);
                    deadline.map_or(p, |d| p.min(d.saturating_duration_since(Instant::now())))
                }
                _ => backoff,
            };
            log::trace!(
                "lock {key:?}: refused, attempt {} failed, next in at most {sleep:?}{}",
                attempts.made(),
                if listening {
                    " (or when a release is published)"
                } else {
                    ""
                }
            );
            let woken = ticket.sleep(sleep);
            if woken && listening {
                line.queues.heard_release(line.name);
            }
            // Woken by the poll, before the holder's lifetime ran out, and first in line (the
            // attempt follows at once): a win now means the holder freed the lock without
            // publishing.
            polled = poll.is_some() && !woken && (!line.fifo || ticket.ahead() == 0);
        }
        if line.fifo && !ticket.wait_turn(deadline) {
            // Gave up before its turn: because the lock is held, or because the threads
            // ahead could not reach Redis (an outage is not contention).
            // The attempt ahead normally ends within the client's timeouts; without a
            // command timeout, give it at most as long as this thread waited (1 s or more).
            stalled = ticket.outage(attempts.waited().max(Duration::from_secs(1)));
            break;
        }
        ticket.mark();
        attempts.record();
        ticket.attempt_started();
        let result = attempt();
        ticket.attempt_finished(match &result {
            Err(e @ LockError::Connection { .. }) => Some(e.report()),
            _ => None,
        });
        match refused_if_late(result, &mut late)? {
            Attempt::Acquired(lease) => {
                // Unless a release was heard while the attempt was on the wire.
                if polled && !ticket.released_since_mark() {
                    line.queues.mark_silent(line.name);
                }
                log::debug!(
                    "lock {key:?}: acquired after {} attempts in {:?}",
                    attempts.made(),
                    attempts.waited()
                );
                return Ok(LockGuard::new(lock, lease));
            }
            Attempt::Held { pttl: p } => pttl = p,
        }
    }
    drop(subscription);
    drop(ticket);
    if let Some(why) = stalled {
        log::warn!(
            "lock {key:?}: gave up after {:?} in line behind other threads of this client \
             without a reply from Redis: {why}",
            attempts.waited()
        );
        return Err(LockError::Connection {
            key: key.to_owned(),
            source: format!(
                "gave up after {} and {} own attempt{}, waiting in line behind other threads \
                 of this client: {why}",
                crate::error::Rounded(attempts.waited()),
                attempts.made(),
                if attempts.made() == 1 { "" } else { "s" }
            )
            .into(),
        });
    }
    on_give_up(attempts.made())?;
    if let Some(err) = late {
        log::info!(
            "lock {key:?}: gave up after {} attempts in {:?}, the last failed: {}",
            attempts.made(),
            attempts.waited(),
            err.report()
        );
        return Err(err);
    }
    log::info!(
        "lock {key:?}: gave up after {} attempts in {:?}",
        attempts.made(),
        attempts.waited()
    );
    Err(LockError::Timeout {
        key: key.to_owned(),
        attempts: attempts.made(),
        waited: attempts.waited(),
    })
}

/// An attempt that won too late ([`LockError::LateReply`], already released), got no RedLock
/// majority for want of answers ([`LockError::NoQuorum`]), or met a transient failure
/// ([`LockError::is_transient`]: a failover, a restart) counts as refused in a blocking
/// acquire, which retries it with the policy's backoff until its deadline; the error is kept
/// in `late` until an attempt ends otherwise, and returned instead of a timeout if it was the
/// last.
fn refused_if_late(outcome: Result<Attempt>, late: &mut Option<LockError>) -> Result<Attempt> {
    match outcome {
        Err(e @ (LockError::LateReply { .. } | LockError::NoQuorum { .. })) => {
            *late = Some(e);
            Ok(Attempt::Held { pttl: None })
        }
        Err(e) if e.is_transient() => {
            log::debug!("{}; retried until the deadline", e.report());
            *late = Some(e);
            Ok(Attempt::Held { pttl: None })
        }
        other => {
            *late = None;
            other
        }
    }
}

/// `try_lock` in terms of `try_acquire`.
pub(crate) fn acquire_once<L: DistributedLock>(lock: &L) -> Result<LockGuard<'_>> {
    match lock.try_acquire()? {
        Some(lease) => Ok(LockGuard::new(lock, lease)),
        None => Err(LockError::Held {
            key: lock.key().to_owned(),
        }),
    }
}

/// After a release: wakes this process's waiters, or logs a lock found lost. Passes `ours` on.
pub(crate) fn note_release(waiters: &WaitQueues, key: &str, ours: bool) -> bool {
    if ours {
        waiters.notify_release(key);
    } else {
        // Returned to the caller as `Ok(false)`; a guard dropped without `unlock` warns.
        log::debug!(
            "lock {key:?}: lost before release (it expired, or another owner took it over); \
             no other owner's lock was deleted"
        );
    }
    ours
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
        let kept = checked_win("k", fresh, ttl, |_| panic!("a timely win is not released"));
        assert!(kept.is_ok());
        // Sent 600 ms ago: 400 ms left < 600 ms margin.
        let Some(sent) = Instant::now().checked_sub(ms(600)) else {
            return; // a monotonic clock this young cannot date the lease back
        };
        let mut released = false;
        let late = checked_win("k", Lease::new(b"a", sent, ttl), ttl, |l| {
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
        let failed = checked_win("k", Lease::new(b"a", sent, ttl), ttl, |_| {
            Err(LockError::Lost { key: "k".into() })
        });
        assert!(matches!(failed, Err(LockError::LateReply { .. })));
    }

    #[test]
    fn printable_escapes_binary() {
        assert_eq!(printable(b"12\x00\xff"), "12\\x00\\xff");
    }
}
