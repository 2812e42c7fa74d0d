//! [`ReadWriteLock`]: a distributed read-write lock in Redisson's `RReadWriteLock` layout.
//!
//! Many readers or one writer. The state is Redisson's: a hash at the lock key (`mode` =
//! `read`|`write`, field `<owner>` = the owner's read count, `<owner>:write` = its write count)
//! and one string key per read hold, `{key}:<owner>:rwlock_timeout:<n>`, whose expiry is that
//! hold's lifetime. So Java services on `redisson.getReadWriteLock(key)` and this crate
//! interlock: readers and writers exclude each other both ways, and releases are published on
//! Redisson's channel `redisson_rwlock:{key}` with its messages (`0` after the last read, `1`
//! after a write). The library's writer preference lives in a separate sorted set,
//! `dlock_rwlock_writers:{key}`, that Redisson never reads. All keys are in the lock key's hash
//! slot. The layout, the scripts, the fairness policy and the failure modes are in
//! `docs/rwlock.md`.
//!
//! Wire, per operation (one round trip each, all `EVALSHA`):
//! - acquire: `lua/rw_acquire.lua` keys `key dlock_rwlock_writers:{key}`, args `read|write
//!   <owner> <ttl ms> <intent ms> <known read holds> <known write holds>`;
//! - release: `lua/rw_release.lua` keys `key dlock_rwlock_writers:{key}
//!   redisson_unlock_latch:{key}:<request id>`, args `read|write <owner> redisson_rwlock:{key}
//!   <lease ms> <latch ms>` (also `wait`: withdraw an intent);
//! - extend: `lua/rw_extend.lua key read|write <owner> <ttl ms>`;
//! - check: `lua/rw_held.lua key read|write <owner>`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::{ToRedisArgs, Value};

use crate::client::admin;
use crate::client::cleanup::{Cleanup, Done};
use crate::client::grants::Grant;
use crate::client::janitor;
use crate::client::live;
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::ids as owner;
use crate::keys;
use crate::lease::{printable, Attempt, Lease, LostLock, RenewKind};
use crate::lock::{self, DistributedLock, LockGuard, LockState};
use crate::primitives::hold::{self, HoldOptions, HoldSettings, WakeUp};
use crate::primitives::string_value;
use crate::retry::{Attempts, RetryPolicy};
use crate::scripts::Scripts;
use crate::stats::Kind;
use crate::time::check_duration;

/// How many retry sleeps (at the policy's longest) a writer intent outlives by default.
const INTENT_SLEEPS: u32 = 4;

/// Prefix of Redisson's read-write lock channel (`RedissonReadLock.getChannelName`).
const CHANNEL_PREFIX: &str = "redisson_rwlock";
/// Prefix of Redisson's unlock latch (`RedissonBaseLock.getUnlockLatchName`).
const LATCH_PREFIX: &str = "redisson_unlock_latch";
/// Prefix of the library's own set of waiting writers (never read by Redisson).
const WRITERS_PREFIX: &str = "dlock_rwlock_writers";
/// How long an unlock latch lives: longer than a release and its resend after a dropped
/// connection (the pool's connect timeout plus a command timeout, 2 s each by default).
const LATCH_MS: u64 = 10_000;
/// How long after a release was sent it may be sent again (by the janitor, or after a Sentinel
/// switch): half the latch's lifetime, so that a resend delayed in a paused server still finds
/// the latch.
const LATCH_RESEND: Duration = Duration::from_millis(LATCH_MS / 2);

/// A random request id for an unlock latch (128 bits in hex).
fn request_id() -> String {
    // The Token lock's 128-bit random hex token, which is ASCII.
    String::from_utf8_lossy(&crate::ids::new_token()).into_owned()
}

/// Which side of the lock a handle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

impl Mode {
    /// The kind of lock in the client's stats.
    fn kind(self) -> Kind {
        Kind::new(self.as_str())
    }

    fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// A distributed read-write lock on one Redis key: any number of readers, or one writer,
/// wire-compatible with Redisson's `RReadWriteLock` (`redisson.getReadWriteLock(key)`).
///
/// Take holds through the two handles, which implement the crate's [`DistributedLock`], so
/// `try_lock`, `lock`, `try_lock_for`, guards, `extend`, `is_held` and `check` work as for
/// any other lock:
///
/// ```no_run
/// use std::time::Duration;
/// use redis_dlock::{DistributedLock, LockClient};
///
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let rw = client
///     .rw_lock("config:pricing")
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
/// `<instance>:<thread>` (see [`owner_id`](Self::owner_id)), as Redisson's
/// `<client UUID>:<thread id>`: the instance is the [`LockClient`]'s, as for
/// [`Strategy::Reentrant`](crate::Strategy::Reentrant). So threads are distinct owners, and
/// one thread is one owner through every `ReadWriteLock` of the key built on the same client:
/// two handles in one thread re-enter (or refuse an upgrade) rather than wait for each other.
/// Other clients (in this process or elsewhere) are other owners. The hold belongs to the
/// thread: its guard cannot be sent to another thread (see [`LockGuard`]).
/// Holds are counted per owner and mode: a thread may take read (or write) again while it
/// holds it, and each hold is given back by one release. A release or extend only ever
/// touches the holds of the owner named by its lease.
///
/// **Downgrade, no upgrade.** The writer may take read holds too (they are granted even while
/// other writers wait), as Redisson allows; releasing its write holds then leaves it a reader.
/// A thread that holds read but not write and asks for write gets
/// [`LockError::Unsupported`] at once: waiting could never succeed while it keeps its read
/// (Redisson's thread would wait until its timeout), so it must release its read holds and ask
/// again.
///
/// **Fairness: writer preference with an expiring intent.** A blocking write acquire that is
/// refused records a "writer waiting" intent in the sorted set `dlock_rwlock_writers:{key}`,
/// refreshed by each of its attempts and expiring after
/// [`writer_intent`](ReadWriteLockBuilder::writer_intent). While an intent of another owner
/// lives, this library's owners that hold nothing are refused read (owners holding read or
/// write may still re-enter), so a stream of overlapping readers drains and the writer gets
/// in. Redisson's readers do not know of intents: they enter whenever no writer holds, so
/// beside Java readers a Rust writer can still be starved (see `docs/rwlock.md`).
/// Single attempts (`try_lock`, `try_acquire`) leave no intent.
///
/// **Lifetimes.** Each read hold has its own timeout key (Redisson's layout), and the hash
/// lives as long as the latest hold; a write hold lives as long as the hash. A hold not
/// renewed (with `extend`, or by the watchdog) expires after the lock's [`ttl`](Self::ttl)
/// even if other owners keep renewing theirs. `extend` renews only the caller's own holds and
/// never shortens anything.
#[derive(Clone)]
pub struct ReadWriteLock {
    read: ReadLock,
    write: WriteLock,
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.read.shared.debug("ReadWriteLock", f)
    }
}

impl LockClient {
    /// Starts building a read-write lock on `key`, in Redisson's `RReadWriteLock` layout. The
    /// defaults: holds watched by the client's watchdog (lease
    /// [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE), Redisson's
    /// `lockWatchdogTimeout`), retry policy [`RetryPolicy::standard`], waiters woken by pub/sub,
    /// writer intent from the policy (see [`ReadWriteLockBuilder::writer_intent`]).
    pub fn rw_lock(&self, key: impl Into<String>) -> ReadWriteLockBuilder {
        ReadWriteLockBuilder {
            client: self.clone(),
            key: key.into(),
            hold: HoldSettings::default(),
            intent: None,
        }
    }
}

impl ReadWriteLock {
    /// The shortest writer intent: 100 ms (see [`ReadWriteLockBuilder::writer_intent`]).
    pub const MIN_WRITER_INTENT: Duration = Duration::from_millis(100);

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

    /// How long a refused blocking writer's intent keeps this library's new readers out
    /// (zero: no writer preference).
    pub fn writer_intent(&self) -> Duration {
        self.read.shared.intent
    }

    /// The instance id of the client the lock was built on (the first part of its owner ids):
    /// a UUID in text form (36 characters), like a Redisson client's id.
    pub fn instance_id(&self) -> &str {
        self.read.shared.client.instance_id()
    }

    /// The calling thread's owner id, `<instance id>:<thread number>` (decimal): the value of
    /// the leases this thread gets and, as in Redisson, the hash field `<owner>` of its read
    /// count and `<owner>:write` of its write count. The thread number is process-unique
    /// (assigned on first use, not the OS thread id).
    pub fn owner_id(&self) -> String {
        self.read.shared.owner()
    }

    /// The channel releases are published on: Redisson's `redisson_rwlock:{key}` (`prefixName`:
    /// no braces added when the key contains `{`).
    pub fn channel(&self) -> &str {
        &self.read.shared.opts.channel
    }
}

/// Builds a [`ReadWriteLock`]. Start from [`LockClient::rw_lock`].
///
/// | option | default |
/// | --- | --- |
/// | [`ttl`](Self::ttl) (lifetime of each hold) | none: holds are watched, renewed by the watchdog |
/// | [`watchdog_lease`](Self::watchdog_lease) | [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE) (30 s), renewed every third |
/// | [`on_lost`](Self::on_lost) | none |
/// | [`wake_up`](Self::wake_up) | [`WakeUp::PubSub`] |
/// | [`retry`](Self::retry) | [`RetryPolicy::standard`] (up to 10 s, 4→32 ms jittered) |
/// | [`writer_intent`](Self::writer_intent) | 4 × the policy's longest sleep, at least [`ReadWriteLock::MIN_WRITER_INTENT`](crate::ReadWriteLock::MIN_WRITER_INTENT) (100 ms; 128 ms with the standard policy) |
#[derive(Clone)]
#[must_use]
pub struct ReadWriteLockBuilder {
    client: LockClient,
    key: String,
    /// The lease options, as a [`LockBuilder`](crate::LockBuilder) collects them.
    hold: HoldSettings,
    intent: Option<Duration>,
}

impl fmt::Debug for ReadWriteLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLockBuilder")
            .field("key", &self.key)
            .field("ttl", &self.hold.ttl)
            .field("retry", &self.hold.retry)
            .field("intent", &self.intent)
            .field("watchdog_lease", &self.hold.watchdog_lease)
            .field("on_lost", &self.hold.on_lost.is_some())
            .field("wake_up", &self.hold.wake_up)
            .finish_non_exhaustive()
    }
}

impl ReadWriteLockBuilder {
    crate::primitives::hold::setters! {
        /// The lifetime of each hold. At least 1 ms, at most [`MAX_TTL`](crate::MAX_TTL);
        /// sub-millisecond parts are dropped. An explicit lifetime turns the watchdog off.
        ttl(ttl: Duration) => hold.ttl = Some(ttl);
        /// The lease of watched holds (built without [`ttl`](Self::ttl)), renewed by the client's
        /// watchdog every third of it. Default [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE).
        watchdog_lease(lease: Duration) => hold.watchdog_lease = Some(lease);
        /// Watched holds: called on the watchdog's thread when a hold is lost (see
        /// [`LockBuilder::on_lost`](crate::LockBuilder::on_lost)).
        on_lost(callback: impl Fn(&LostLock) + Send + Sync + 'static)
            => hold.on_lost = Some(Arc::new(callback));
        /// How waiters learn of a release (default [`WakeUp::PubSub`]: they subscribe to
        /// Redisson's `redisson_rwlock:{key}`, on which this library and Redisson publish
        /// releases).
        wake_up(wake_up: WakeUp) => hold.wake_up = Some(wake_up);
        /// How `lock()` and `try_lock_for()` wait, for both modes.
        retry(policy: RetryPolicy) => hold.retry = Some(policy);
        /// How long a "writer waiting" intent lives after the waiting writer's latest attempt.
        ///
        /// While one lives, this library's owners that hold nothing are refused read holds (Java
        /// Redisson readers do not look at intents). It must outlast the writer's sleep between
        /// attempts plus a round trip, or readers slip in between; the longer it is, the longer a
        /// writer that dies while waiting keeps readers out. Zero turns writer preference off
        /// (readers then may starve writers, as in Redisson). Default: 4 × the retry policy's
        /// longest sleep, at least [`ReadWriteLock::MIN_WRITER_INTENT`](crate::ReadWriteLock::MIN_WRITER_INTENT). Intents are kept in the sorted set
        /// `dlock_rwlock_writers:{key}`, never in the lock's hash.
        /// At most [`MAX_TTL`](crate::MAX_TTL), or [`build`](Self::build) fails with
        /// [`LockError::Config`] (also when the default is beyond it: a policy whose
        /// `max_delay` exceeds a quarter of `MAX_TTL` needs an explicit intent).
        writer_intent(intent: Duration) => intent = Some(intent);
    }

    /// Checks the options and builds the lock. Sends nothing to Redis.
    ///
    /// On a Redis Cluster, a key that contains `{` without a complete, non-empty hash tag is
    /// refused: Redisson's companion keys of it (`<key>:<owner>:rwlock_timeout:<n>`) would be
    /// in other slots.
    pub fn build(self) -> Result<ReadWriteLock> {
        crate::client::native::needs_scripts(self.client.native(), &self.key, "a read-write lock")?;
        let mut opts = HoldOptions::checked(&self.key, self.hold)?;
        let (intent, what) = match self.intent {
            Some(intent) => (intent, "writer_intent"),
            None => (
                (opts.retry.max_delay.saturating_mul(INTENT_SLEEPS))
                    .max(ReadWriteLock::MIN_WRITER_INTENT),
                "the default writer_intent (4 × the retry policy's max_delay; set one explicitly)",
            ),
        };
        let intent = check_duration(&self.key, what, intent, true)?;
        // Releases are published on Redisson's channel `redisson_rwlock:{key}`.
        opts.channel = keys::redisson_name(CHANNEL_PREFIX, &self.key);
        let writers = keys::redisson_name(WRITERS_PREFIX, &self.key);
        if self.client.is_cluster() {
            let slot = keys::hash_slot(self.key.as_bytes());
            let timeout = match self.key.contains('{') {
                true => format!("{}:x:rwlock_timeout:1", self.key),
                false => format!("{{{}}}:x:rwlock_timeout:1", self.key),
            };
            if keys::hash_slot(timeout.as_bytes()) != slot
                || keys::hash_slot(writers.as_bytes()) != slot
            {
                return Err(LockError::config(
                    &self.key,
                    "the key contains '{' without a complete, non-empty hash tag, so the read \
                     holds' timeout keys Redisson derives from it would be in other cluster \
                     slots; use a key with a {tag} or without braces",
                ));
            }
        }
        let shared = Arc::new(Shared {
            read_line: format!("{}\0read", self.key),
            write_line: format!("{}\0write", self.key),
            latch_base: keys::redisson_name(LATCH_PREFIX, &self.key),
            writers,
            client: self.client,
            key: self.key,
            opts,
            intent,
        });
        Ok(ReadWriteLock {
            read: ReadLock {
                shared: Arc::clone(&shared),
            },
            write: WriteLock { shared },
        })
    }
}

/// The state shared by a lock's two handles and all its clones.
#[derive(Debug)]
struct Shared {
    client: LockClient,
    key: String,
    /// Lease or watchdog, retry policy, wake-up.
    opts: HoldOptions,
    intent: Duration,
    /// `redisson_unlock_latch:{key}`; a release appends `:<request id>`.
    latch_base: String,
    /// The sorted set of waiting writers' intents, `dlock_rwlock_writers:{key}`.
    writers: String,
    /// In-process wake-up line of blocked readers (never waited on in turn: readers do not
    /// queue behind each other).
    read_line: String,
    /// In-process FIFO line of blocked writers: only its head polls Redis.
    write_line: String,
}

/// What this process knows of the holds of one owner of a key, by `<owner>\0<key>` in
/// [`OWNERS`].
///
/// Per owner and key, not per `ReadWriteLock` value: the owner is `<client instance>:<thread>`,
/// as Redisson's, so every handle of the key built on one client is the same owner on one
/// thread (two handles in one thread re-enter instead of waiting for each other), and they
/// must all see the same counts. An entry goes when all of it is zero, and all of a thread's
/// when it exits ([`PruneOnExit`]), so the map is bounded by the live threads' owners and the
/// keys they hold or held without a release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holds {
    /// Holds (read + write) that Redis reported for the owner after our latest operation for
    /// it; only used to let a thread that already holds the lock skip the writers' line (it
    /// must never wait behind a writer that waits for it).
    reported: i64,
    /// The owner's read and write holds as its own acquires and the releases of its leases
    /// counted them (not as Redis reported them). Never below the holds a lease of the owner
    /// still has: only the owner's thread acquires as that owner, and a hold leaves it only
    /// when a lease is released. The acquire sends them, and Redis sets larger counts of the
    /// owner back to them: stale holds, whose releases a failover lost.
    read: u32,
    write: u32,
}

static OWNERS: LazyLock<Mutex<HashMap<String, Holds>>> = LazyLock::new(Mutex::default);

/// Prunes the exiting thread's entries from [`OWNERS`]: once a thread is gone nobody acquires
/// as its owners (thread numbers are never reused), so what they count can only go stale, and
/// a hold of theirs that is never released (a lease dropped unreleased, a guard forgotten, a
/// release that failed for good) would otherwise keep its entry for good.
struct PruneOnExit(u64);

impl Drop for PruneOnExit {
    fn drop(&mut self) {
        let digits = format!(":{}", self.0);
        let mut owners = OWNERS.lock().unwrap_or_else(|p| p.into_inner());
        owners.retain(|slot, _| {
            !slot
                .split_once('\0')
                .is_some_and(|(o, _)| o.ends_with(&digits))
        });
    }
}

thread_local! {
    static PRUNE_ON_EXIT: PruneOnExit = PruneOnExit(owner::thread_num());
}

/// The entries of the process's record of read-write lock owners: for the crate's tests,
/// which check that it does not grow with threads that exited.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub fn owner_entries() -> usize {
    OWNERS.lock().unwrap_or_else(|p| p.into_inner()).len()
}

impl Shared {
    /// The `Debug` of the lock or of one side, `name`.
    fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct(name);
        d.field("key", &self.key)
            .field("instance", &self.client.instance_id());
        self.opts
            .debug_fields(&mut d)
            .field("writer_intent", &self.intent)
            .finish_non_exhaustive()
    }

    /// Redisson's owner: the client's instance id and the thread.
    fn owner(&self) -> String {
        format!("{}:{}", self.client.instance_id(), owner::thread_num())
    }

    /// Reads or changes what is known of `owner`'s holds on this key (see [`Holds`]); an entry
    /// left at zero goes. Makes sure the calling thread's entries go when it exits (registers
    /// its [`PruneOnExit`] on first use; nothing once the thread is exiting).
    fn holds<R>(&self, owner: &[u8], f: impl FnOnce(&mut Holds) -> R) -> R {
        let _ = PRUNE_ON_EXIT.try_with(|_| ());
        let slot = format!("{}\0{}", String::from_utf8_lossy(owner), self.key);
        let mut owners = OWNERS.lock().unwrap_or_else(|p| p.into_inner());
        let mut holds = owners.get(&slot).copied().unwrap_or_default();
        let result = f(&mut holds);
        if holds == Holds::default() {
            owners.remove(&slot);
        } else {
            owners.insert(slot, holds);
        }
        result
    }

    /// One hold of the owner more (`taken`) or fewer in `mode`. Changes are counted, never
    /// set, so that releases of the owner's leases on other threads cannot race its acquires.
    fn note_known(&self, owner: &[u8], mode: Mode, taken: bool) {
        self.holds(owner, |h| {
            let n = match mode {
                Mode::Read => &mut h.read,
                Mode::Write => &mut h.write,
            };
            *n = n.saturating_add_signed(if taken { 1 } else { -1 });
        });
    }

    /// Sends `lua/rw_release.lua` with the keys and arguments of `release` (see
    /// [`release_cleanup`](Self::release_cleanup)), recording the holds of `owner`.
    fn send(&self, release: &Cleanup, owner: &[u8]) -> Result<(i64, i64, Option<i64>)> {
        let keys: Vec<&str> = release.keys.iter().map(String::as_str).collect();
        let reply = self.client.with_conn(&self.key, |con, s| {
            (release.script)(s).eval_keys(con, &keys, &release.args)
        })?;
        self.decode(owner, reply)
    }

    /// `{code, holds}` or (acquire) `{code, holds, wait ms}`, recording the holds of `owner`
    /// as the script reported them.
    fn decode(&self, owner: &[u8], reply: Value) -> Result<(i64, i64, Option<i64>)> {
        if let Value::BulkString(entry) = &reply {
            return Err(LockError::Corrupt {
                key: self.key.clone(),
                value: printable(entry),
                reason: "a hash that is not a read-write lock's (another lock type, or a \
                         damaged hash); it is left alone",
            });
        }
        let (code, holds, wait) = match redis::from_redis_value_ref::<Vec<i64>>(&reply).as_deref() {
            Ok([code, holds]) => (*code, *holds, None),
            Ok([code, holds, wait]) => (*code, *holds, Some(*wait)),
            _ => return Err(self.unexpected(&reply)),
        };
        self.holds(owner, |h| h.reported = holds.max(0));
        Ok((code, holds, wait))
    }

    fn unexpected(&self, reply: &Value) -> LockError {
        LockError::unexpected_reply(&self.key, "a read-write lock script", reply)
    }

    /// One acquire attempt: held when another owner holds the lock (or, for a read, when a
    /// writer of this library waits), with how long the waiter may sleep if no release is
    /// published: the hash's remaining lifetime (or the refusing intent's), and for a writer
    /// that leaves an intent at most half of it (it must come back before its intent lapses,
    /// or readers slip in). `intent_ms` > 0 leaves a writer intent when a write is refused.
    fn attempt(&self, mode: Mode, owner: &str, intent_ms: u64) -> Result<Attempt> {
        // Under way from before it settles: a Sentinel replay of this owner's release waits
        // for it (see `Janitor::replay`).
        let id = owner.as_bytes();
        let attempt_live = self.client.live().attempt(&self.key, id);
        // A release or an undo of ours may still be pending with the janitor: finish it first,
        // so that a later try cannot take the new hold for the old one.
        self.client.janitor().settle(&self.client, &self.key, id)?;
        let start = Instant::now();
        // What this thread holds: more on the server is a stale hold of its own (a release lost
        // in a failover), which the script sets back first.
        let known = self.holds(id, |h| *h);
        let acquire = |con: &mut Conn, s: &Scripts| {
            let keys = [self.key.as_str(), self.writers.as_str()];
            let (lease_ms, side) = (self.opts.lease_ms(), mode.as_str());
            let args = (side, owner, lease_ms, intent_ms, known.read, known.write);
            s.rw_acquire.eval_keys(con, &keys, args)
        };
        // Sent and unanswered, or answered but not confirmed by the replicas: it may have
        // counted a hold that a failover would lose, or that nobody releases.
        let until = start.checked_add(self.opts.lease).unwrap_or(start);
        let reply =
            string_value::acquire_undone_by(&self.client, &self.key, until, acquire, |_| {
                // The janitor gives one hold back in the background if the owner's holds add up to
                // what the acquire would have left (as this lock last saw them, plus one); if the
                // acquire never ran, they are fewer and nothing changes.
                let before = self.holds(id, |h| h.reported);
                let expect = Some(before.saturating_add(1));
                Some(self.release_cleanup(mode.as_str(), id, true, expect))
            });
        let (code, holds, wait) = self.decode(id, reply?)?;
        let result = match code {
            1 => {
                // Counted before `checked_win`, whose release of a late hold counts it off.
                self.note_known(id, mode, true);
                log::trace!(
                    "lock {:?}: {} hold taken by {owner}",
                    self.key,
                    mode.as_str()
                );
                attempt_live.took_at(self.opts.lease, Instant::now());
                let kind = match mode {
                    Mode::Read => RenewKind::ReadEntry(mode.kind()),
                    Mode::Write => RenewKind::WriteEntry(mode.kind()),
                };
                let lease = self
                    .opts
                    .lease(&self.client, kind, id, start, None, None)
                    .owned_by_thread();
                crate::lease::checked_win(&self.key, lease, self.opts.lease, Instant::now(), |l| {
                    self.release(mode, l)
                })
                .map(Attempt::Acquired)
            }
            0 | -1 => {
                if holds == 0 {
                    // Redis counts no hold of the owner: it holds nothing (a hold it counts
                    // expired or was lost). Only this thread can add holds of the owner, and
                    // other threads' releases only count down, so this cannot lose a live hold.
                    self.holds(id, |h| (h.read, h.write) = (0, 0));
                }
                let mut wait = wait
                    .and_then(|w| u64::try_from(w).ok())
                    .map(Duration::from_millis);
                if intent_ms > 0 {
                    let half = Duration::from_millis(intent_ms / 2);
                    wait = Some(wait.map_or(half, |w| w.min(half)));
                }
                Ok(Attempt::Held {
                    pttl: wait,
                    wake: None,
                })
            }
            -2 => Err(LockError::unsupported(
                &self.key,
                format!(
                    "owner {owner} holds a read lock and asked for the write lock: read holds \
                     cannot be upgraded (release them first, or take write first and downgrade)"
                ),
            )),
            -3 => Err(LockError::unsupported(
                &self.key,
                format!(
                    "owner {owner} already holds 10000 {} holds: re-entry is limited",
                    mode.as_str()
                ),
            )),
            other => Err(self.unexpected(&Value::Int(other))),
        };
        // A win or a refusal is counted, an error is not.
        self.client.counters().outcome(mode.kind(), &result);
        result
    }

    /// The release of `owner` on `side` (`lua/rw_release.lua`), as sent and as sent again,
    /// `latched`: with a fresh unlock latch (the script's third key,
    /// `redisson_unlock_latch:{key}:<request id>`): a release that ran already answers from the
    /// latch, so at most one hold is given back. With `expect`, the hold is given back only if
    /// the owner's read and write holds add up to it (the undo of an acquire whose reply was
    /// lost: the count it would have left). `side` `wait` with no latch: the withdrawal of a
    /// writer intent.
    fn release_cleanup(
        &self,
        side: &str,
        owner: &[u8],
        latched: bool,
        expect: Option<i64>,
    ) -> Cleanup {
        let mut keys = vec![self.key.clone(), self.writers.clone()];
        keys.extend(latched.then(|| format!("{}:{}", self.latch_base, request_id())));
        // A nil ARGV (no `expect`) is not sent at all (as by the release's own call).
        let (lease_ms, channel) = (self.opts.lease_ms(), &self.opts.channel);
        let args = (side, owner, channel, lease_ms, LATCH_MS, expect).to_redis_args();
        Cleanup {
            script: |s| &s.rw_release,
            keys,
            args,
            value_arg: 1,
            read: read_release,
            counted: true,
            what: "the read-write release with its unlock latch",
        }
    }

    /// Gives back one hold. The unlock latch (a fresh request id, the same for the resend of
    /// [`LockClient::with_conn`] after a dropped connection) makes a resent release answer
    /// from the first one's outcome instead of giving back a second hold.
    ///
    /// A release that fails on a connection error or a transient refusal (a failover, a
    /// restart) is sent again by the client's janitor, with the same latch, until it is
    /// answered; one done shortly before a Sentinel switch is announced is sent again to the
    /// new master. Either way at most one hold is given back.
    fn release(&self, mode: Mode, lease: &Lease) -> Result<bool> {
        // A hold whose lifetime passed is reported lost even if the owner's count was still
        // there (kept alive by its later holds, say): its section overran.
        // By the local clock, read once: the lifetime check and the latch's start.
        let sent = Instant::now();
        let overran = sent >= lease.valid_until();
        lease.stop_renewal();
        let (client, owner) = (&self.client, lease.value());
        // Sent as the janitor or a Sentinel replay would send it again.
        let release = self.release_cleanup(mode.as_str(), owner, true, None);
        let generation = self.client.switch_generation();
        let reply = self.send(&release, owner);
        // One hold of the owner fewer, whatever the answer (a failed release is the
        // janitor's now).
        client
            .live()
            .release(live::holding(&self.key, owner), Some(self.opts.lease));
        // The lease's hold is gone from the owner's known count once Redis answered (given
        // back, or found gone) or the janitor took the release over (it gives it back, or gives
        // up and leaves a hold that no lease has). After another error the caller may still
        // release this lease again: it stays counted.
        if reply.as_ref().err().is_none_or(LockError::worth_retrying) {
            self.note_known(owner, mode, false);
        }
        // Resent only while the latch is sure to live (it starts when the release first runs,
        // which is after `sent`): a resend that found it gone could give back a second hold.
        let until = lease
            .valid_until()
            .min(sent.checked_add(LATCH_RESEND).unwrap_or(sent));
        let redone = hold::failed_release(&reply).is_some_and(|why| {
            // Done in-line: the hold is given back (at most once: the latch), released.
            let janitor = client.janitor();
            let done = janitor.forget(client, release.clone(), why, until);
            // The janitor makes it happen (or the hold expires): count it given back.
            self.holds(owner, |h| h.reported = (h.reported - 1).max(0));
            done
        });
        let ours = redone || reply?.0 == 1;
        if !ours || overran {
            self.client.counters().lost_on_release(mode.kind(), lease);
        }
        if ours {
            if self.client.switches().is_some() {
                janitor::remember(client, release, None, generation, until);
            }
            // Any release may let the other side in: a write release (or a downgrade) frees
            // readers, a read release may free a writer.
            let waiters = self.client.waiters();
            waiters.notify_release(&self.read_line);
            waiters.notify_release(&self.write_line);
        }
        let released = crate::client::acquire::note_release(client.waiters(), &self.key, ours);
        Ok(released && !overran)
    }

    fn extend(&self, mode: Mode, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let (client, key, kind) = (&self.client, self.key.as_str(), mode.kind());
        hold::extend(client, kind, key, lease, ttl, true, |owner, ttl_ms| {
            // A hold write, confirmed by the replicas the client requires.
            let reply = client.with_conn_confirmed(key, None, |con, s| {
                s.rw_extend.eval(con, key, (mode.as_str(), owner, ttl_ms))
            })?;
            Ok((self.decode(owner, reply)?.0 == 1, None))
        })
    }

    /// Locked in `mode`, as Redisson's `isLocked` of that side: the hash's field `mode`.
    fn state(&self, mode: Mode) -> Result<LockState> {
        let found = admin::read(&self.client, &self.key, "mode")?;
        let in_mode = found.detail.as_deref() == Some(mode.as_str().as_bytes());
        let state = found.plain(&self.key, "hash")?;
        Ok(if in_mode { state } else { LockState::Unlocked })
    }

    /// Deletes the hash if it is in `mode` (Redisson's `forceUnlock` of that side), publishing
    /// Redisson's message for a release of that mode.
    fn force_unlock(&self, mode: Mode) -> Result<bool> {
        admin::force_delete(
            &self.client,
            &self.key,
            Some(&self.opts.channel),
            if mode == Mode::Write { "1" } else { "0" },
            Some(mode.as_str()),
            &[&self.key, &self.read_line, &self.write_line],
        )
    }

    fn is_held(&self, mode: Mode, lease: &Lease) -> Result<bool> {
        let reply = self.client.with_conn(&self.key, |con, s| {
            s.rw_held
                .eval(con, &self.key, (mode.as_str(), lease.value()))
        })?;
        let (code, ..) = self.decode(lease.value(), reply)?;
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
        // Writers wait in turn and leave an intent; readers do neither.
        let fifo = mode == Mode::Write;
        let (name, intent_ms) = match mode {
            Mode::Write => (&self.write_line, self.intent.as_millis() as u64),
            Mode::Read => (&self.read_line, 0),
        };
        let barge = !fifo || self.holds(owner.as_bytes(), |h| h.reported > 0);
        let line = self.opts.line(&self.client, name, fifo, barge, None);
        let attempt = || self.attempt(mode, &owner, intent_ms);
        let result =
            crate::client::acquire::acquire_in_line(handle, line, attempts, attempt, |made| {
                if intent_ms > 0 && made > 0 {
                    // Withdraw our intent so that readers need not wait for it to expire.
                    let withdraw = self.release_cleanup("wait", owner.as_bytes(), false, None);
                    if let Err(e) = self.send(&withdraw, owner.as_bytes()) {
                        log::warn!(
                        "lock {:?}: could not withdraw the writer intent ({}); it expires in {:?}",
                        self.key,
                        e.report(),
                        self.intent
                    );
                    }
                }
                Ok(())
            });
        self.client.counters().blocking(mode.kind(), &result);
        result
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
/// [`LockError::Unsupported`] (no upgrades). See [`ReadWriteLock`] for the rules.
#[derive(Clone)]
pub struct WriteLock {
    shared: Arc<Shared>,
}

/// The trait and `Debug` for one side; `$mode` picks it.
macro_rules! side {
    ($handle:ty, $mode:expr) => {
        impl fmt::Debug for $handle {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.shared.debug(stringify!($handle), f)
            }
        }

        impl DistributedLock for $handle {
            hold::hold_accessors!(shared);

            fn try_acquire(&self) -> Result<Lease> {
                let shared = &self.shared;
                hold::taken(&shared.key, shared.attempt($mode, &shared.owner(), 0))
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

            lock::guard_methods!(|this, attempts| this
                .shared
                .acquire_blocking(this, $mode, attempts));
        }

        impl lock::LockAdmin for $handle {
            fn state(&self) -> Result<LockState> {
                self.shared.state($mode)
            }

            fn force_unlock(&self) -> Result<bool> {
                self.shared.force_unlock($mode)
            }
        }
    };
}

side!(ReadLock, Mode::Read);
side!(WriteLock, Mode::Write);

/// Reads `lua/rw_release.lua`'s reply sent again by the janitor or a Sentinel replay:
/// `{code, holds}`, code 1 when a hold was given back (by this try or, answered from the
/// latch, by the release that ran before); anything else changed nothing.
fn read_release(v: &redis::Value) -> (Done, Option<(Vec<u8>, Grant)>) {
    match v {
        Value::Array(items) if items.first() == Some(&Value::Int(1)) => (Done::GaveBack, None),
        _ => (Done::Nothing, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::redisson_name as prefix_name;

    const SCRIPTS: [(&str, &str); 4] = [
        ("rw_acquire", include_str!("../../lua/rw_acquire.lua")),
        ("rw_release", include_str!("../../lua/rw_release.lua")),
        ("rw_extend", include_str!("../../lua/rw_extend.lua")),
        ("rw_held", include_str!("../../lua/rw_held.lua")),
    ];

    #[test]
    fn scripts_include_the_shared_prelude_once() {
        let prelude = include_str!("../../lua/rw_prelude.lua");
        assert!(prelude.contains("KEYS[1]"));
        for (name, code) in SCRIPTS {
            assert_eq!(
                code.matches("-- #include rw_prelude.lua\n").count(),
                1,
                "{name}.lua must include the prelude exactly once"
            );
            assert!(
                code.contains("local want, owner"),
                "{name}.lua must set owner before the prelude"
            );
        }
        let built = crate::scripts::Scripts::for_server(None);
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
    fn no_script_walks_without_a_bound() {
        // Every `for` over a count read from Redis is bounded by MAX_COUNT or the budget.
        for (name, code) in SCRIPTS
            .into_iter()
            .chain([("rw_prelude", include_str!("../../lua/rw_prelude.lua"))])
        {
            assert!(!code.contains("tonumber(redis.call('hget'"), "{name}");
        }
    }

    #[test]
    fn names_follow_redissons_prefix_rule() {
        assert_eq!(prefix_name("redisson_rwlock", "a"), "redisson_rwlock:{a}");
        assert_eq!(
            prefix_name("redisson_rwlock", "{u}:x"),
            "redisson_rwlock:{u}:x"
        );
        assert_eq!(prefix_name("redisson_rwlock", "a{b"), "redisson_rwlock:a{b");
        assert_eq!(
            prefix_name("redisson_unlock_latch", "k"),
            "redisson_unlock_latch:{k}"
        );
        assert_ne!(request_id(), request_id());
        assert_eq!(request_id().len(), 32);
    }

    #[test]
    fn owner_ids_fit_a_lease() {
        let id = format!("{}:{}", owner::new_uuid(), u64::MAX);
        assert!(id.len() <= crate::ids::VALUE_CAPACITY, "{}", id.len());
        let lease = Lease::new(id.as_bytes(), Instant::now(), Duration::from_secs(1));
        assert_eq!(lease.value(), id.as_bytes());
    }
}
