//! The [`DistributedLock`] trait, the [`Lease`] it hands out and the RAII [`LockGuard`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{LockError, Result};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use crate::time::check_duration;

/// What every lock does with its own holds: a lock on one Redis key, shared by threads
/// (`Send + Sync`) and usable as `Box<dyn DistributedLock>` / `Arc<dyn DistributedLock>`.
/// The server-side reads of a lock whoever holds it, and the administrator's force-unlock,
/// are [`LockAdmin`]'s.
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

    /// One attempt: the [`Lease`] when taken, [`LockError::Held`] when another owner holds the
    /// lock (the same convention as [`try_lock`](Self::try_lock), and std's `Mutex::try_lock`
    /// with its `WouldBlock`).
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
    fn try_acquire(&self) -> Result<Lease>;

    /// Releases the hold described by `lease` if it is still ours: `Ok(true)` when it was ours,
    /// within its lifetime, and is now given back; `Ok(false)` when it had expired or belonged
    /// to another owner. Every lock type answers alike: a hold whose lifetime had passed by the
    /// local clock when `release` was called ([`Lease::is_expired`]) is `Ok(false)` even if
    /// nobody had taken it over (its value is still removed then, so the lock is free at
    /// once); another owner's hold is never deleted. The check is local: the release is still
    /// one round trip.
    ///
    /// A release that fails on a connection error or a transient refusal is tried once more
    /// before it returns; if that try is answered, the release reports as above. An `Err`
    /// means it is still pending: the client retries it in the background until it is
    /// answered or the lease ends (see `docs/production.md`). Do not release the same lease
    /// again yourself: for a counted hold (Reentrant, read-write) a second release would give
    /// back a second hold.
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
}

/// What the server says about a lock whoever holds it, and the administrator's force-unlock:
/// implemented by every lock of this crate ([`Lock`](crate::Lock) and each typed lock,
/// [`ReadLock`](crate::ReadLock), [`WriteLock`](crate::WriteLock), [`RedLock`](crate::RedLock)),
/// apart from [`DistributedLock`], which is what every lock does with its own holds.
pub trait LockAdmin: DistributedLock {
    /// Asks the server whether anyone holds the lock now, and for how long (one round trip;
    /// RedLock: one to each node, at once). Whoever holds it: this caller, another thread,
    /// another process. [`is_locked`](LockAdmin::is_locked) and
    /// [`remaining_ttl`](Self::remaining_ttl) are this answer's two halves.
    ///
    /// Per lock type:
    /// - Token, Fair, Reentrant: the key exists (a string, or Redisson's hash); `ttl` is its
    ///   `PTTL`.
    /// - Classic: the key holds an expiry that has not passed by this client's clock (a stale
    ///   value is [`LockState::Unlocked`]: the next acquire takes it over); `ttl` is the time
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
    fn state(&self) -> Result<LockState>;

    /// True when anyone holds the lock now, by asking the server: see [`state`](Self::state)
    /// for what "held" means per lock type. Redisson's `isLocked`.
    fn is_locked(&self) -> Result<bool> {
        Ok(self.state()?.is_locked())
    }

    /// The time left before the current hold ends unless renewed, as the server counts it
    /// (`PTTL`; not the local estimate of [`Lease::remaining`]), whoever holds it. `None` when
    /// nobody holds the lock, or when the holder's key has no expiry in Redis (a value written
    /// by another program); [`is_locked`](LockAdmin::is_locked) or [`state`](Self::state) tell the
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
    fn force_unlock(&self) -> Result<bool>;
}

/// Owned guards for locks behind an [`Arc`], like `lock_api`'s `lock_arc`: the guard keeps the
/// lock alive, so a hold can cross function boundaries and sit in a struct. Like every guard it
/// stays on its thread until [`into_send`](OwnedLockGuard::into_send) lets it go (for holds
/// that are not the thread's: see [`LockGuard`]).
/// Implemented for `Arc<dyn DistributedLock>` and for `Arc` of every lock type.
///
/// ```no_run
/// use std::sync::Arc;
/// use redis_dlock::{ArcLockExt, DistributedLock, LockClient};
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let lock: Arc<dyn DistributedLock> = Arc::from(client.lock("jobs:import").build()?);
/// // A Token hold is its token's, not the thread's: the guard may go to another thread.
/// let guard = lock.lock_arc()?.into_send().expect("a Token hold");
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
    fn try_lock_arc_until(&self, deadline: Instant) -> Result<OwnedLockGuard<L>> {
        self.try_lock_arc_for(deadline.saturating_duration_since(Instant::now()))
    }
}

impl<L: DistributedLock + ?Sized> ArcLockExt<L> for Arc<L> {
    fn lock_arc(&self) -> Result<OwnedLockGuard<L>> {
        Ok(Guard::wrap(Arc::clone(self), self.lock()?.into_lease()))
    }

    fn try_lock_arc(&self) -> Result<OwnedLockGuard<L>> {
        Ok(Guard::wrap(Arc::clone(self), self.try_lock()?.into_lease()))
    }

    fn try_lock_arc_for(&self, wait: Duration) -> Result<OwnedLockGuard<L>> {
        let lease = self.try_lock_for(wait)?.into_lease();
        Ok(Guard::wrap(Arc::clone(self), lease))
    }
}

/// A held lock that owns an `Arc` of its lock ([`ArcLockExt`]); releases it when dropped, like
/// [`LockGuard`]: the same [`Guard`], with an `Arc` where [`LockGuard`] has a reference. `M`
/// says whether it may leave its thread, as for [`LockGuard`]: not by default
/// ([`GuardNoSend`]); [`into_send`](Guard::into_send) gives the [`GuardSend`] form for a hold
/// that is not the thread's.
///
/// ```compile_fail
/// # fn f(lock: std::sync::Arc<redis_dlock::ReentrantLock>) -> redis_dlock::Result<()> {
/// use redis_dlock::ArcLockExt;
/// let guard = lock.lock_arc()?; // a Reentrant hold is its thread's
/// std::thread::spawn(move || drop(guard)); // error: the guard is not `Send`
/// # Ok(()) }
/// ```
pub type OwnedLockGuard<L = dyn DistributedLock, M = GuardNoSend> = Guard<Arc<L>, M>;

/// A held lock; releases it when dropped.
///
/// Dropping releases with an owner check and logs the outcome (a release error or a lost lock is
/// logged, never a panic). Call [`unlock`](Guard::unlock) to see the result instead.
///
/// **Threads.** Some holds belong to the thread that took them: those of
/// [`Strategy::Reentrant`](crate::Strategy::Reentrant) and of the read-write lock, whose owner
/// is `<instance>:<thread>` (as Redisson's, whose locks belong to their thread). That thread
/// re-enters while it holds the lock, so a guard that went to another thread would let the
/// first thread in again while the second works under the lock. So a guard is not `Send`, as
/// std's `MutexGuard` and `parking_lot`'s guards are not:
///
/// ```compile_fail
/// # fn f(rw: redis_dlock::ReadWriteLock) -> redis_dlock::Result<()> {
/// use redis_dlock::DistributedLock;
/// let guard = rw.write_lock().lock()?;
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard)); // error: the guard is not `Send`
/// });
/// # Ok(()) }
/// ```
///
/// The holds of the other strategies (Token, Classic, Fair, Spring, ShedLock, RedLock) are
/// their stored value's, whichever thread has it: [`into_send`](Guard::into_send) turns their
/// guard into a `LockGuard<'_, GuardSend>`, which is `Send`, and gives a thread-owned one back
/// as it is. The strategy of a [`Lock`](crate::Lock) or a `dyn DistributedLock` is known at run
/// time only, so the check is made there, on the hold ([`Lease::is_thread_owned`]).
pub type LockGuard<'a, M = GuardNoSend> = Guard<&'a dyn DistributedLock, M>;

/// What both guard kinds are and do: a lease of the lock reached through `R` (a reference for
/// [`LockGuard`], an `Arc` for [`OwnedLockGuard`]), released when the guard is dropped unless
/// it was unlocked or given up first. Named by those two aliases; see [`LockGuard`].
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard<R: Deref<Target: DistributedLock>, M = GuardNoSend> {
    lock: R,
    lease: Lease,
    /// Cleared by `unlock` and `into_lease`, so that the guard's drop releases nothing.
    armed: bool,
    marker: PhantomData<M>,
}

impl<R: Deref<Target: DistributedLock>, M> fmt::Debug for Guard<R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lock.key())
            .field("lease", &self.lease)
            .finish()
    }
}

impl<'a> LockGuard<'a> {
    /// Wraps a fresh lease of `lock`. The guard stays on the calling thread: see
    /// [`into_send`](Guard::into_send). Build the guard of a thread-owned lease
    /// ([`Lease::is_thread_owned`]: Reentrant, read-write) on the thread that took it: a
    /// Reentrant release elsewhere is refused, and a guard of a thread's hold on another
    /// thread breaks the thread's exclusion; a guard built elsewhere logs a warning.
    pub fn new(lock: &'a dyn DistributedLock, lease: Lease) -> Self {
        Guard::wrap(lock, lease)
    }
}

impl<L: DistributedLock + ?Sized> OwnedLockGuard<L> {
    /// Wraps a fresh lease of `lock`, as [`LockGuard::new`].
    pub fn new(lock: Arc<L>, lease: Lease) -> Self {
        Guard::wrap(lock, lease)
    }
}

impl<L: DistributedLock + ?Sized, M> OwnedLockGuard<L, M> {
    /// The lock this guard holds.
    pub fn lock(&self) -> &Arc<L> {
        &self.lock
    }
}

impl<R: Deref<Target: DistributedLock>> Guard<R> {
    /// The same guard in a form that may be sent to another thread (`Send`), if the hold is
    /// not the thread's ([`Lease::is_thread_owned`]: Token, Classic, Fair, Spring, ShedLock,
    /// RedLock); otherwise (Reentrant, read-write lock) the guard back, unchanged, still
    /// holding the lock. Costs no round trip.
    ///
    /// ```no_run
    /// use redis_dlock::{DistributedLock, LockClient};
    /// # fn main() -> Result<(), redis_dlock::LockError> {
    /// let client = LockClient::open("redis://127.0.0.1:6379/")?;
    /// let lock = client.lock("jobs:import").build()?; // Token
    /// let guard = lock.lock()?.into_send().expect("a Token hold is not the thread's");
    /// std::thread::scope(|s| {
    ///     s.spawn(move || guard.unlock()).join().expect("worker")
    /// })?;
    /// # Ok(()) }
    /// ```
    // The guard itself comes back on refusal, as from `Arc::try_unwrap`: boxing it would
    // allocate for every caller.
    #[allow(clippy::result_large_err)]
    pub fn into_send(mut self) -> std::result::Result<Guard<R, GuardSend>, Self>
    where
        R: Clone,
    {
        if self.lease.is_thread_owned() {
            return Err(self);
        }
        // The lease is cloned, as for `into_lease`; a watched hold's renewals follow the clone.
        Ok(Guard::wrap(self.lock.clone(), self.give_up()))
    }
}

impl<R: Deref<Target: DistributedLock>, M> Guard<R, M> {
    fn wrap(lock: R, lease: Lease) -> Self {
        if lease.is_thread_owned() && !crate::ids::names_this_thread(lease.value()) {
            // Not refused (the constructors return the guard): its release will be refused
            // or will not know the owner's count; the caller learns of it here.
            log::warn!(
                "lock {:?}: a guard built for a thread-owned lease of another thread ({}); \
                 build it on the thread that took the lease",
                lock.key(),
                crate::lease::printable(lease.value())
            );
        }
        Guard {
            lock,
            lease,
            armed: true,
            marker: PhantomData,
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

    /// Time left before the hold expires, by the local clock.
    pub fn remaining(&self) -> Duration {
        self.lease.remaining()
    }

    /// True once the lifetime has passed by the local clock (no round trip).
    pub fn is_expired(&self) -> bool {
        self.lease.is_expired()
    }

    /// The lease behind the guard (value, validity, fencing token).
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
        if !self.lease.is_lost() && self.lock.is_held(&self.lease)? {
            Ok(())
        } else {
            Err(LockError::lost(self.lock.key()))
        }
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
        self.give_up()
    }

    /// Disarms the guard and clones its lease, as the guard (which implements `Drop`) cannot
    /// give its own away.
    fn give_up(&mut self) -> Lease {
        self.armed = false;
        self.lease.clone()
    }
}

/// The guard's drop, unless disarmed: stop renewals even if the release fails, then release
/// owner-checked. Nobody sees the outcome, so a failure and a loss are logged here (`release`
/// itself returns them without a warning).
impl<R: Deref<Target: DistributedLock>, M> Drop for Guard<R, M> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (key, lease) = (self.lock.key(), &self.lease);
        lease.stop_renewal();
        match self.lock.release(lease) {
            Ok(true) => {}
            Ok(false) => log::warn!(
                "lock {key:?}: guard dropped after the lock was lost (it expired, or another \
                 owner took it over); no other owner's lock was deleted"
            ),
            // Queued for the client's janitor: not lost yet.
            Err(e) if e.worth_retrying() => log::warn!(
                "lock {key:?}: release on drop failed: {}; retried in the background",
                e.report()
            ),
            Err(e) => log::error!("lock {key:?}: release on drop failed: {}", e.report()),
        }
    }
}

/// Marker of a guard that stays on the thread that took its hold: the guard is not `Send`, as
/// std's `MutexGuard` and `lock_api`'s guards with `GuardNoSend`. The default of [`LockGuard`]
/// and [`OwnedLockGuard`].
#[derive(Debug, Clone, Copy)]
// std's guard: not `Send` but still `Sync` (a `&guard` may be shared, as before), no `unsafe`.
pub struct GuardNoSend(PhantomData<std::sync::MutexGuard<'static, ()>>);

/// Marker of a guard that may be sent to another thread (`lock_api`'s `GuardSend`): what
/// [`into_send`](Guard::into_send) gives for a hold that is not the thread's.
#[derive(Debug, Clone, Copy)]
pub struct GuardSend(());

/// The public answer of one attempt made by a lock's own code: taken, or [`LockError::Held`].
pub(crate) fn taken_or_held(key: &str, attempt: Result<Option<Lease>>) -> Result<Lease> {
    attempt?.ok_or_else(|| LockError::Held {
        key: key.to_owned(),
    })
}

/// `try_lock`, `lock` and `try_lock_for` of a lock of this crate, written inside its
/// `impl DistributedLock`: one attempt (`try_acquire`), or the lock's blocking acquire
/// `|this, attempts| …` (a [`LockGuard`] of `this`) given the attempts of its retry policy, or
/// the policy's sleeps within the caller's wait. A macro, not default methods: a default body
/// cannot make the guard's `&dyn DistributedLock` of a `Self` that may be unsized.
macro_rules! guard_methods {
    (|$this:ident, $attempts:ident| $blocking:expr) => {
        fn try_lock(&self) -> $crate::error::Result<$crate::lock::LockGuard<'_>> {
            let lease = $crate::lock::DistributedLock::try_acquire(self)?;
            Ok($crate::lock::LockGuard::new(self, lease))
        }

        fn lock(&self) -> $crate::error::Result<$crate::lock::LockGuard<'_>> {
            let $this = self;
            let $attempts =
                $crate::retry::Attempts::new($crate::lock::DistributedLock::retry_policy(self));
            $blocking
        }

        fn try_lock_for(
            &self,
            wait: ::std::time::Duration,
        ) -> $crate::error::Result<$crate::lock::LockGuard<'_>> {
            let $this = self;
            let $attempts = $crate::retry::Attempts::for_duration(
                $crate::lock::DistributedLock::retry_policy(self),
                wait,
            );
            $blocking
        }
    };
}
pub(crate) use guard_methods;

/// What the server says about a lock now, whoever holds it: the answer of
/// [`LockAdmin::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// Nobody holds the lock (for a Classic lock: also a value whose expiry has passed, which
    /// the next acquire takes over; for a read-write lock's handle: not held in that handle's
    /// mode).
    Unlocked,
    /// Someone holds the lock: this caller or any other owner.
    Locked {
        /// How long until the hold ends unless it is renewed, as the server counts it (the
        /// key's `PTTL`, read now; not the local estimate of a lease). `None`: the key has no
        /// expiry in Redis, e.g. a value written by another program. Classic: the time left
        /// until the expiry stored in the value, by this client's wall clock (or the key's
        /// `PTTL` with `key_ttl`, whichever is shorter). RedLock: until fewer than a majority
        /// of nodes hold the value that a majority holds now.
        ttl: Option<Duration>,
    },
}

impl LockState {
    /// True for [`LockState::Locked`].
    pub fn is_locked(&self) -> bool {
        matches!(self, LockState::Locked { .. })
    }

    /// The `ttl` of [`LockState::Locked`]; `None` when unlocked or held without expiry.
    pub fn ttl(&self) -> Option<Duration> {
        match self {
            LockState::Locked { ttl } => *ttl,
            LockState::Unlocked => None,
        }
    }
}

/// The checks every lock builder makes before anything is sent: a key, a lifetime of whole
/// milliseconds within [`MAX_TTL`](crate::MAX_TTL) (returned truncated to them), a consistent retry policy.
pub(crate) fn check_lock_options(
    key: &str,
    ttl: Duration,
    retry: RetryPolicy,
) -> Result<(Duration, RetryPolicy)> {
    if key.is_empty() {
        return Err(LockError::config("", "the lock key is empty"));
    }
    let ttl = check_duration(key, "ttl", ttl, false)?;
    retry
        .validate()
        .map_err(|reason| LockError::config(key, reason))?;
    Ok((ttl, retry))
}
