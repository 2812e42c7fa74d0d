//! [`ReadWriteLock`]: a distributed read-write lock kept in one Redis hash.
//!
//! Many readers or one writer. Every hold belongs to an *owner* (`<instance>:<thread>`, see
//! [`ReadWriteLock::owner_id`]), is counted per owner (re-entrant) and expires by its own
//! lifetime, so a dead owner's hold goes away even while other owners keep renewing theirs.
//! All state lives in the hash at the lock key and every script touches only that key, so the
//! lock works unchanged on a Redis Cluster. The layout, the scripts step by step, the fairness
//! policy and the failure modes are in `docs/rwlock.md`.
//!
//! Wire, per operation (one round trip each, all `EVALSHA` on the lock key):
//! - acquire: `lua/rw_acquire.lua key read|write <owner> <ttl ms> <intent ms>`;
//! - release: `lua/rw_release.lua key read|write <owner>` (also `wait`: withdraw an intent);
//! - extend: `lua/rw_extend.lua key read|write <owner> <ttl ms>`;
//! - check: `lua/rw_held.lua key read|write <owner>`.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::Value;

use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::hold::{HoldOptions, WakeUp};
use crate::lock::{self, printable, Attempt, DistributedLock, Lease, Line, LockGuard};
use crate::retry::{Attempts, RetryPolicy};
use crate::strategy::check_duration;
use crate::watchdog::{LostCallback, LostLock, RenewKind};

/// The shortest default writer intent: see [`ReadWriteLockBuilder::writer_intent`].
pub const RW_MIN_WRITER_INTENT: Duration = Duration::from_millis(100);

/// How many retry sleeps (at the policy's longest) a writer intent outlives by default.
const INTENT_SLEEPS: u32 = 4;

/// Hex digits of the random instance id: 128 bits, like a token. An owner id (32 hex digits,
/// `:`, at most 7 hex digits of the thread number) fits a [`Lease`] value.
const INSTANCE_HEX: usize = 32;

/// Thread numbers are taken modulo 2^28 so that they print in at most 7 hex digits.
const THREAD_MASK: u64 = 0x0FFF_FFFF;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number: process-unique, assigned on first use, never reused.
    static THREAD_NUM: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's number in owner ids.
fn thread_num() -> u64 {
    THREAD_NUM.with(|n| *n) & THREAD_MASK
}

/// Which side of the lock a handle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// A distributed read-write lock on one Redis key: any number of readers, or one writer.
///
/// Take holds through the two handles, which implement the crate's [`DistributedLock`], so
/// `try_lock`, `lock`, `try_lock_for`, guards, `extend`, `is_held` and `check` work as for
/// any other lock:
///
/// ```no_run
/// use std::time::Duration;
/// use redis_dlock::{DistributedLock, LockClient, ReadWriteLock};
///
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let rw = ReadWriteLock::builder(&client, "config:pricing")
///     .ttl(Duration::from_secs(30))
///     .build()?;
///
/// {
///     let guard = rw.read_lock().lock()?; // shared with other readers
///     // ... read ...
///     guard.unlock()?;
/// }
/// let mut guard = rw.write_lock().try_lock_for(Duration::from_secs(5))?; // exclusive
/// guard.extend(Duration::from_secs(30))?;
/// // ... write ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
///
/// **Owners and re-entry.** A hold belongs to the owner id of the thread that took it:
/// `<instance>:<thread>` (see [`owner_id`](Self::owner_id)). The instance id is random per
/// `ReadWriteLock` value, shared by its clones, so threads sharing one handle (clone it, or
/// put it in an `Arc`) are distinct owners, and the same thread re-entering through the same
/// handle is the same owner. Holds are counted per owner and mode: a thread may take read (or
/// write) again while it holds it, and each hold is given back by one release. A release or
/// extend only ever touches the entry of the owner named by its lease.
///
/// **Downgrade, no upgrade.** The writer may take read holds too (they are granted even while
/// other writers wait); releasing its write holds then leaves it a reader. A thread that holds
/// read but not write and asks for write gets [`LockError::InvalidArgument`] at once: waiting
/// could never succeed while it keeps its read (two such threads would deadlock), so it must
/// release its read holds and ask again.
///
/// **Fairness: writer preference with an expiring intent.** A blocking write acquire that is
/// refused leaves a "writer waiting" intent in the hash, refreshed by each of its attempts and
/// expiring after [`writer_intent`](ReadWriteLockBuilder::writer_intent). While an intent of
/// another owner lives, owners that hold nothing are refused read (owners holding read or
/// write may still re-enter), so a stream of overlapping readers drains and the writer gets in.
/// A writer that dies while waiting blocks new readers for at most one intent lifetime.
/// Single attempts (`try_lock`, `try_acquire`) leave no intent.
///
/// **Lifetimes.** Each owner's read entry and write entry carry their own expiry (server
/// time); a hold not renewed with `extend` expires after the lock's [`ttl`](Self::ttl) even if
/// other owners keep renewing theirs, and the key itself expires with the latest live entry, so
/// an abandoned lock disappears entirely. `extend` renews only the caller's own entry and
/// never shortens it (the entry lives until the later of its expiry and now + ttl).
#[derive(Clone)]
pub struct ReadWriteLock {
    read: ReadLock,
    write: WriteLock,
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.read.shared;
        f.debug_struct("ReadWriteLock")
            .field("key", &s.key)
            .field("instance", &s.instance_str())
            .field("ttl", &s.opts.lease)
            .field("writer_intent", &s.intent)
            .finish_non_exhaustive()
    }
}

impl ReadWriteLock {
    /// A read-write lock on `key` with the defaults: holds watched by the client's watchdog
    /// (lease [`WATCHDOG_DEFAULT_LEASE`](crate::WATCHDOG_DEFAULT_LEASE)), retry policy
    /// [`RetryPolicy::standard`], waiters woken by pub/sub, writer intent from the policy (see
    /// [`ReadWriteLockBuilder::writer_intent`]). Sends nothing to Redis.
    pub fn new(client: &LockClient, key: impl Into<String>) -> Result<Self> {
        Self::builder(client, key).build()
    }

    /// A builder to set the lifetime, the retry policy and the writer intent.
    pub fn builder(client: &LockClient, key: impl Into<String>) -> ReadWriteLockBuilder {
        ReadWriteLockBuilder {
            client: client.clone(),
            key: key.into(),
            ttl: None,
            retry: None,
            intent: None,
            watchdog_lease: None,
            on_lost: None,
            wake_up: None,
        }
    }

    /// The handle that takes shared (read) holds.
    pub fn read_lock(&self) -> &ReadLock {
        &self.read
    }

    /// The handle that takes the exclusive (write) hold.
    pub fn write_lock(&self) -> &WriteLock {
        &self.write
    }

    /// The Redis key of the lock (a hash).
    pub fn key(&self) -> &str {
        &self.read.shared.key
    }

    /// The lifetime of a hold unless extended or (watched locks) renewed.
    pub fn ttl(&self) -> Duration {
        self.read.shared.opts.lease
    }

    /// True if the client's watchdog renews this lock's holds (built without an explicit ttl).
    pub fn is_watched(&self) -> bool {
        self.read.shared.opts.watched
    }

    /// The policy `lock()` follows, for both modes.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.read.shared.opts.retry
    }

    /// How long a refused blocking writer's intent keeps new readers out (zero: no writer
    /// preference).
    pub fn writer_intent(&self) -> Duration {
        self.read.shared.intent
    }

    /// The random instance id of this handle and its clones (32 hex digits, 128 bits).
    pub fn instance_id(&self) -> &str {
        self.read.shared.instance_str()
    }

    /// The calling thread's owner id, `<instance id>:<thread number in hex>`: the value of the
    /// leases this thread gets, and the hash fields `r:<owner>` / `w:<owner>` /
    /// `wait:<owner>` that hold its entries. The thread number is process-unique (assigned on
    /// first use, not the OS thread id), taken modulo 2^28 so the id fits a lease's 32 bytes.
    pub fn owner_id(&self) -> String {
        self.read.shared.owner()
    }
}

/// Builds a [`ReadWriteLock`]. Start from [`ReadWriteLock::builder`].
///
/// | option | default |
/// | --- | --- |
/// | [`ttl`](Self::ttl) (lifetime of each hold) | none: holds are watched, renewed by the watchdog |
/// | [`watchdog_lease`](Self::watchdog_lease) | [`WATCHDOG_DEFAULT_LEASE`](crate::WATCHDOG_DEFAULT_LEASE) (30 s), renewed every third |
/// | [`on_lost`](Self::on_lost) | none |
/// | [`wake_up`](Self::wake_up) | [`WakeUp::PubSub`] |
/// | [`retry`](Self::retry) | [`RetryPolicy::standard`] (up to 10 s, 4→32 ms jittered) |
/// | [`writer_intent`](Self::writer_intent) | 4 × the policy's longest sleep, at least [`RW_MIN_WRITER_INTENT`] (100 ms; 128 ms with the standard policy) |
#[derive(Clone)]
#[must_use]
pub struct ReadWriteLockBuilder {
    client: LockClient,
    key: String,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
    intent: Option<Duration>,
    watchdog_lease: Option<Duration>,
    on_lost: Option<LostCallback>,
    wake_up: Option<WakeUp>,
}

impl fmt::Debug for ReadWriteLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLockBuilder")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("intent", &self.intent)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("on_lost", &self.on_lost.is_some())
            .field("wake_up", &self.wake_up)
            .finish_non_exhaustive()
    }
}

impl ReadWriteLockBuilder {
    /// The lifetime of each hold. At least 1 ms, at most [`MAX_TTL`](crate::MAX_TTL);
    /// sub-millisecond parts are dropped. An explicit lifetime turns the watchdog off.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The lease of watched holds (built without [`ttl`](Self::ttl)), renewed by the client's
    /// watchdog every third of it. Default [`WATCHDOG_DEFAULT_LEASE`](crate::WATCHDOG_DEFAULT_LEASE).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.watchdog_lease = Some(lease);
        self
    }

    /// Watched holds: called on the watchdog thread when a hold is lost (see
    /// [`LockBuilder::on_lost`](crate::LockBuilder::on_lost)).
    pub fn on_lost(mut self, callback: impl Fn(&LostLock) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(callback));
        self
    }

    /// How waiters learn of a release (default [`WakeUp::PubSub`]: every release that ends an
    /// owner's entry publishes on `redisson_lock__channel:{key}`).
    pub fn wake_up(mut self, wake_up: WakeUp) -> Self {
        self.wake_up = Some(wake_up);
        self
    }

    /// How `lock()` and `try_lock_for()` wait, for both modes.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// How long a "writer waiting" intent lives after the waiting writer's latest attempt.
    ///
    /// While one lives, owners that hold nothing are refused read holds. It must outlast the
    /// writer's sleep between attempts plus a round trip, or readers slip in between; the
    /// longer it is, the longer a writer that dies while waiting keeps readers out. Zero turns
    /// writer preference off (readers then may starve writers). Default: 4 × the retry
    /// policy's longest sleep, at least [`RW_MIN_WRITER_INTENT`].
    pub fn writer_intent(mut self, intent: Duration) -> Self {
        self.intent = Some(intent);
        self
    }

    /// Checks the options and builds the lock. Sends nothing to Redis.
    pub fn build(self) -> Result<ReadWriteLock> {
        let opts = HoldOptions::checked(
            &self.key,
            self.ttl,
            self.watchdog_lease,
            self.on_lost.clone(),
            self.retry.clone(),
            self.wake_up,
            false,
        )?;
        let intent = self.intent.unwrap_or_else(|| {
            opts.retry
                .max_delay
                .saturating_mul(INTENT_SLEEPS)
                .max(RW_MIN_WRITER_INTENT)
        });
        check_duration(&self.key, "writer_intent", intent, true)?;
        let intent = Duration::from_millis(intent.as_millis() as u64);
        let shared = Arc::new(Shared {
            read_line: format!("{}\0read", self.key),
            write_line: format!("{}\0write", self.key),
            client: self.client,
            key: self.key,
            opts,
            intent,
            instance: new_instance(),
            holds: Mutex::new(HashMap::new()),
        });
        Ok(ReadWriteLock {
            read: ReadLock {
                shared: Arc::clone(&shared),
            },
            write: WriteLock { shared },
        })
    }
}

/// A random 128-bit instance id in hex.
fn new_instance() -> [u8; INSTANCE_HEX] {
    let bytes: [u8; INSTANCE_HEX / 2] = rand::rng().random();
    let mut out = [0u8; INSTANCE_HEX];
    // Cannot fail: 16 bytes always fill exactly 32 hex characters.
    let _ = hex::encode_to_slice(bytes, &mut out);
    out
}

/// The state shared by a lock's two handles and all its clones.
#[derive(Debug)]
struct Shared {
    client: LockClient,
    key: String,
    /// Lease or watchdog, retry policy, wake-up and the release channel.
    opts: HoldOptions,
    intent: Duration,
    instance: [u8; INSTANCE_HEX],
    /// In-process wake-up line of blocked readers (never waited on in turn: readers do not
    /// queue behind each other).
    read_line: String,
    /// In-process FIFO line of blocked writers: only its head polls Redis.
    write_line: String,
    /// Holds (read + write) that Redis reported for each owner of this instance after our
    /// latest operation for it; only used to let a thread that already holds the lock skip
    /// the writers' line (it must never wait behind a writer that waits for it).
    holds: Mutex<HashMap<String, i64>>,
}

impl Shared {
    fn instance_str(&self) -> &str {
        // The instance id is ASCII hex by construction.
        std::str::from_utf8(&self.instance).unwrap_or("")
    }

    fn owner(&self) -> String {
        format!("{}:{:x}", self.instance_str(), thread_num())
    }

    fn local_holds(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the owner's hold count that a script reported.
    fn note_holds(&self, owner: &[u8], holds: i64) {
        let Ok(owner) = std::str::from_utf8(owner) else {
            return;
        };
        let mut map = self.local_holds();
        if holds > 0 {
            map.insert(owner.to_owned(), holds);
        } else {
            map.remove(owner);
        }
    }

    fn holds_any(&self, owner: &str) -> bool {
        self.local_holds().contains_key(owner)
    }

    /// Runs one script and decodes its `{code, holds}` reply, recording the holds.
    fn run(
        &self,
        script: fn(&crate::scripts::Scripts) -> &crate::scripts::LuaScript,
        mode: &str,
        owner: &[u8],
        extra: &[u64],
    ) -> Result<(i64, i64)> {
        let reply: Value = self.client.with_conn(&self.key, |con, s| {
            script(s).eval(con, &self.key, (mode, owner, extra))
        })?;
        let (code, holds, wait) = self.decode(reply)?;
        self.note_holds(owner, holds);
        Ok((code, wait))
    }

    /// `{code, holds}` or (acquire) `{code, holds, wait ms}`.
    fn decode(&self, reply: Value) -> Result<(i64, i64, i64)> {
        match reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(code), Value::Int(holds)] => Ok((*code, *holds, 0)),
                [Value::Int(code), Value::Int(holds), Value::Int(wait)] => {
                    Ok((*code, *holds, *wait))
                }
                _ => Err(self.unexpected(&Value::Array(items))),
            },
            Value::BulkString(entry) => Err(LockError::Corrupt {
                key: self.key.clone(),
                value: printable(&entry),
                reason: "a hash entry the read-write lock did not write (another lock type \
                         or a damaged hash); it is left alone",
            }),
            other => Err(self.unexpected(&other)),
        }
    }

    fn unexpected(&self, reply: &Value) -> LockError {
        LockError::Redis {
            key: self.key.clone(),
            source: redis::RedisError::from((
                redis::ErrorKind::Client,
                "unexpected reply from a read-write lock script",
                format!("{reply:?}"),
            )),
        }
    }

    /// One acquire attempt: held when another owner holds the lock (or, for a read, when a
    /// writer waits), with how long the waiter may sleep if no release is published: until
    /// the soonest other entry expires, and for a writer that leaves an intent at most half
    /// of it (it must come back before its intent lapses, or readers slip in).
    /// `intent_ms` > 0 leaves a writer intent when a write is refused.
    fn attempt(&self, mode: Mode, owner: &str, intent_ms: u64) -> Result<Attempt> {
        let start = Instant::now();
        let (code, wait) = self.run(
            |s| &s.rw_acquire,
            mode.as_str(),
            owner.as_bytes(),
            &[self.opts.lease_ms(), intent_ms],
        )?;
        match code {
            1 => {
                log::trace!(
                    "lock {:?}: {} hold taken by {owner}",
                    self.key,
                    mode.as_str()
                );
                let kind = match mode {
                    Mode::Read => RenewKind::ReadEntry,
                    Mode::Write => RenewKind::WriteEntry,
                };
                let lease =
                    self.opts
                        .lease(&self.client, &self.key, kind, owner.as_bytes(), start, None);
                lock::checked_win(&self.key, lease, self.opts.lease, |l| self.release(mode, l))
                    .map(Attempt::Acquired)
            }
            0 | -1 => {
                let mut wait = Duration::from_millis(u64::try_from(wait).unwrap_or(0));
                if intent_ms > 0 {
                    wait = wait.min(Duration::from_millis(intent_ms / 2));
                }
                Ok(Attempt::Held { pttl: Some(wait) })
            }
            -2 => Err(LockError::invalid(
                &self.key,
                format!(
                    "owner {owner} holds a read lock and asked for the write lock: read holds \
                     cannot be upgraded (release them first, or take write first and downgrade)"
                ),
            )),
            other => Err(self.unexpected(&Value::Int(other))),
        }
    }

    fn try_acquire(&self, mode: Mode) -> Result<Option<Lease>> {
        Ok(match self.attempt(mode, &self.owner(), 0)? {
            Attempt::Acquired(lease) => Some(lease),
            Attempt::Held { .. } => None,
        })
    }

    fn release(&self, mode: Mode, lease: &Lease) -> Result<bool> {
        lease.stop_renewal();
        // Published when the owner's entry goes, for waiters in other clients.
        let reply: Value = self.client.with_conn(&self.key, |con, s| {
            s.rw_release.eval(
                con,
                &self.key,
                (mode.as_str(), lease.value(), self.opts.channel.as_str()),
            )
        })?;
        let (code, holds, _) = self.decode(reply)?;
        self.note_holds(lease.value(), holds);
        let ours = code == 1;
        if ours {
            // Any release may let the other side in: a write release (or a downgrade) frees
            // readers, a read release may free a writer.
            let waiters = self.client.waiters();
            waiters.notify_release(&self.read_line);
            waiters.notify_release(&self.write_line);
        }
        Ok(lock::note_release(self.client.waiters(), &self.key, ours))
    }

    fn extend(&self, mode: Mode, lease: &mut Lease, ttl: Duration) -> Result<()> {
        check_duration(&self.key, "ttl", ttl, false)?;
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        let start = Instant::now();
        let (code, _) = self.run(
            |s| &s.rw_extend,
            mode.as_str(),
            lease.value(),
            &[ttl.as_millis() as u64],
        )?;
        if code == 1 {
            lease.renew(None, start, ttl);
            log::debug!(
                "lock {:?}: {} hold extended by {ttl:?}",
                self.key,
                mode.as_str()
            );
            Ok(())
        } else {
            log::warn!(
                "lock {:?}: {} hold lost, extend found no live entry of its owner",
                self.key,
                mode.as_str()
            );
            Err(LockError::Lost {
                key: self.key.clone(),
            })
        }
    }

    fn is_held(&self, mode: Mode, lease: &Lease) -> Result<bool> {
        let (code, _) = self.run(|s| &s.rw_held, mode.as_str(), lease.value(), &[])?;
        Ok(code == 1 && !lease.is_expired())
    }

    /// The blocking acquire of both modes.
    ///
    /// Writers line up FIFO in this client's line for the key (only the head polls Redis, and
    /// a local release wakes it), as the crate's other locks do. Readers never wait for a turn:
    /// they only join a separate wake-up line so a local release cuts their sleep short, and
    /// each polls on its own schedule, so blocked readers of one client get in together. A
    /// thread that already holds this lock (either mode) skips the writers' line: it would
    /// otherwise wait behind a writer that waits for it (re-entry, downgrade, refused upgrade).
    fn acquire_blocking<'a, L: DistributedLock>(
        &self,
        handle: &'a L,
        mode: Mode,
        attempts: Attempts<'_>,
    ) -> Result<LockGuard<'a>> {
        let owner = self.owner();
        let (line, fifo, intent_ms) = match mode {
            Mode::Read => (self.read_line.as_str(), false, 0),
            Mode::Write => (
                self.write_line.as_str(),
                true,
                self.intent.as_millis() as u64,
            ),
        };
        let line = Line {
            queues: self.client.waiters(),
            name: line,
            fifo,
            barge: !fifo || self.holds_any(&owner),
            wake: self.opts.wake(&self.client),
        };
        let attempt = || self.attempt(mode, &owner, intent_ms);
        lock::acquire_in_line(handle, line, attempts, attempt, |made| {
            if intent_ms > 0 && made > 0 {
                // Withdraw our intent so that readers need not wait for it to expire.
                if let Err(e) = self.run(|s| &s.rw_release, "wait", owner.as_bytes(), &[]) {
                    log::warn!(
                        "lock {:?}: could not withdraw the writer intent ({}); it expires in {:?}",
                        self.key,
                        e.report(),
                        self.intent
                    );
                }
            }
            Ok(())
        })
    }
}

/// The shared (read) side of a [`ReadWriteLock`]; get it with [`ReadWriteLock::read_lock`].
///
/// A [`DistributedLock`]: its leases hold the owner id; `release`, `extend` and `is_held` act
/// on the read entry of the lease's owner only. See [`ReadWriteLock`] for the rules.
#[derive(Clone)]
pub struct ReadLock {
    shared: Arc<Shared>,
}

/// The exclusive (write) side of a [`ReadWriteLock`]; get it with
/// [`ReadWriteLock::write_lock`].
///
/// A [`DistributedLock`]: its leases hold the owner id; `release`, `extend` and `is_held` act
/// on the write entry of the lease's owner only. A thread holding only read gets
/// [`LockError::InvalidArgument`] (no upgrades). See [`ReadWriteLock`] for the rules.
#[derive(Clone)]
pub struct WriteLock {
    shared: Arc<Shared>,
}

impl fmt::Debug for ReadLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadLock")
            .field("key", &self.shared.key)
            .field("instance", &self.shared.instance_str())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for WriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteLock")
            .field("key", &self.shared.key)
            .field("instance", &self.shared.instance_str())
            .finish_non_exhaustive()
    }
}

/// The trait for one side; `$mode` picks it.
macro_rules! side {
    ($handle:ty, $mode:expr) => {
        impl DistributedLock for $handle {
            fn key(&self) -> &str {
                &self.shared.key
            }

            fn ttl(&self) -> Duration {
                self.shared.opts.lease
            }

            fn retry_policy(&self) -> &RetryPolicy {
                &self.shared.opts.retry
            }

            fn try_acquire(&self) -> Result<Option<Lease>> {
                self.shared.try_acquire($mode)
            }

            fn release(&self, lease: &Lease) -> Result<bool> {
                self.shared.release($mode, lease)
            }

            fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
                self.shared.extend($mode, lease, ttl)
            }

            fn is_held(&self, lease: &Lease) -> Result<bool> {
                self.shared.is_held($mode, lease)
            }

            fn try_lock(&self) -> Result<LockGuard<'_>> {
                lock::acquire_once(self)
            }

            fn lock(&self) -> Result<LockGuard<'_>> {
                self.shared
                    .acquire_blocking(self, $mode, Attempts::new(&self.shared.opts.retry))
            }

            fn try_lock_for(&self, wait: Duration) -> Result<LockGuard<'_>> {
                self.shared.acquire_blocking(
                    self,
                    $mode,
                    Attempts::for_duration(&self.shared.opts.retry, wait),
                )
            }
        }
    };
}

side!(ReadLock, Mode::Read);
side!(WriteLock, Mode::Write);

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPTS: [(&str, &str); 4] = [
        ("rw_acquire", include_str!("../lua/rw_acquire.lua")),
        ("rw_release", include_str!("../lua/rw_release.lua")),
        ("rw_extend", include_str!("../lua/rw_extend.lua")),
        ("rw_held", include_str!("../lua/rw_held.lua")),
    ];

    #[test]
    fn scripts_include_the_shared_prelude_once() {
        let prelude = include_str!("../lua/rw_prelude.lua");
        assert!(prelude.contains("KEYS[1]"));
        for (name, code) in SCRIPTS {
            assert_eq!(
                code.matches("-- #include rw_prelude.lua\n").count(),
                1,
                "{name}.lua must include the prelude exactly once"
            );
            assert!(
                code.contains("local owner") || code.contains("owner ="),
                "{name}.lua must set owner before the prelude"
            );
            // One key per script: rw_release's release channel is an argument.
            if name == "rw_release" {
                assert!(
                    code.contains("ARGV[3] (optional) release channel"),
                    "{name}"
                );
            }
            assert!(!code.contains("KEYS[2]"), "{name}");
        }
        let built = crate::scripts::Scripts::new();
        for s in [
            &built.rw_acquire,
            &built.rw_release,
            &built.rw_extend,
            &built.rw_held,
        ] {
            assert!(s.code().contains(prelude));
            assert!(!s.code().contains("-- #include rw_prelude.lua\n"));
        }
    }

    #[test]
    fn owner_ids_fit_a_lease() {
        let id = format!(
            "{}:{:x}",
            std::str::from_utf8(&new_instance()).unwrap(),
            THREAD_MASK
        );
        assert_eq!(id.len(), 40);
        let lease = Lease::new(id.as_bytes(), Instant::now(), Duration::from_secs(1));
        assert_eq!(lease.value(), id.as_bytes());
        assert_ne!(new_instance(), new_instance());
    }

    #[test]
    fn threads_get_distinct_numbers() {
        let here = thread_num();
        assert_eq!(here, thread_num());
        let there = std::thread::spawn(thread_num).join().unwrap();
        assert_ne!(here, there);
    }
}
