//! The [`DistributedLock`] trait, the [`Lease`] it hands out and the RAII [`LockGuard`].

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{LockError, Result};
use crate::retry::{Attempts, RetryPolicy};
use crate::waiters::WaitQueues;

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
    fn try_acquire(&self) -> Result<Option<Lease>>;

    /// Releases the hold described by `lease` if it is still ours: `Ok(true)` when it was ours and
    /// is now free, `Ok(false)` when it had expired or belonged to another owner (nothing is
    /// deleted then).
    fn release(&self, lease: &Lease) -> Result<bool>;

    /// Gives our hold a new lifetime of `ttl` from now. [`LockError::Lost`] when it is no longer
    /// ours. Updates `lease` (validity, and the value for strategies that change it).
    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()>;

    /// Asks Redis whether the hold is still ours and within its lifetime.
    fn is_held(&self, lease: &Lease) -> Result<bool>;

    /// One attempt; [`LockError::Held`] when another owner holds the lock.
    fn try_lock(&self) -> Result<LockGuard<'_>>;

    /// Waits for the lock under [`retry_policy`](Self::retry_policy);
    /// [`LockError::Timeout`] when the policy gives up.
    fn lock(&self) -> Result<LockGuard<'_>>;

    /// Waits for the lock at most `wait` (the policy's sleeps, the caller's deadline);
    /// [`LockError::Timeout`] when the time runs out.
    fn try_lock_for(&self, wait: Duration) -> Result<LockGuard<'_>>;
}

/// The longest owner value a lease stores inline (no allocation per acquire): room for a
/// 128-bit token in hex, or an owner id `<128-bit instance in hex>:<thread number>`.
const VALUE_CAPACITY: usize = 64;

/// One successful acquire: the owner value written to Redis and how long the hold is valid.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    value: [u8; VALUE_CAPACITY],
    len: u8,
    acquired_at: Instant,
    valid_until: Instant,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("value", &printable(self.value()))
            .field("remaining", &self.remaining())
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
            valid_until: start + ttl,
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
        self.valid_until = start + ttl;
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
    /// command was sent.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Time left before the hold expires (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// True once the lifetime has passed by the local monotonic clock. Costs no round trip.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until
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

    /// Asks Redis whether the lock is still ours and within its lifetime.
    pub fn is_held(&self) -> Result<bool> {
        self.lock.is_held(&self.lease)
    }

    /// `Ok(())` while the lock is ours, [`LockError::Lost`] otherwise: for `guard.check()?`
    /// before a step that must run under the lock.
    pub fn check(&self) -> Result<()> {
        if self.is_held()? {
            Ok(())
        } else {
            Err(self.lost())
        }
    }

    /// Extends the hold to `ttl` from now; [`LockError::Lost`] if it is no longer ours.
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
    /// [`DistributedLock::release`] is called with the returned lease.
    pub fn into_lease(mut self) -> Lease {
        self.armed = false;
        self.lease.clone()
    }

    fn lost(&self) -> LockError {
        LockError::Lost {
            key: self.key().to_owned(),
        }
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match self.lock.release(&self.lease) {
            Ok(true) => {}
            // release() already logged the loss with the key.
            Ok(false) => {}
            Err(e) => log::error!("lock {:?}: release on drop failed: {e}", self.key()),
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
    };
    acquire_in_line(
        lock,
        line,
        attempts,
        || lock.try_acquire(),
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
}

/// The blocking acquire loop shared by every lock.
///
/// The first attempt goes straight to Redis unless other threads of this client already wait
/// in the line (and `barge` is off); then the thread joins the line ([`WaitQueues`]): only its
/// head polls Redis (with `fifo`), sleeping by the retry policy and waking early when a local
/// holder releases. `on_give_up` gets the number of attempts made and may replace the final
/// [`LockError::Timeout`] with a more precise error.
pub(crate) fn acquire_in_line<'a, L: DistributedLock>(
    lock: &'a L,
    line: Line<'_>,
    mut attempts: Attempts<'_>,
    mut attempt: impl FnMut() -> Result<Option<Lease>>,
    on_give_up: impl FnOnce(u32) -> Result<()>,
) -> Result<LockGuard<'a>> {
    let key = lock.key();
    if line.barge || !line.queues.has_waiters(line.name) {
        attempts.record();
        if let Some(lease) = attempt()? {
            return Ok(LockGuard::new(lock, lease));
        }
    }
    let mut ticket = line.queues.enqueue(line.name);
    log::trace!(
        "lock {key:?}: waiting behind {} threads of this process",
        ticket.ahead()
    );
    let deadline = attempts.queue_deadline();
    loop {
        if attempts.made() > 0 {
            let Some(sleep) = attempts.next_sleep() else {
                break;
            };
            log::debug!(
                "lock {key:?}: refused, attempt {} failed, retrying in {sleep:?}",
                attempts.made()
            );
            ticket.sleep(sleep);
        }
        if line.fifo && !ticket.wait_turn(deadline) {
            break;
        }
        ticket.mark();
        attempts.record();
        if let Some(lease) = attempt()? {
            log::debug!(
                "lock {key:?}: acquired after {} attempts in {:?}",
                attempts.made(),
                attempts.waited()
            );
            return Ok(LockGuard::new(lock, lease));
        }
    }
    drop(ticket);
    on_give_up(attempts.made())?;
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
        log::warn!(
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
    fn printable_escapes_binary() {
        assert_eq!(printable(b"12\x00\xff"), "12\\x00\\xff");
    }
}
