//! [`LockClient`]: the connection pool and shared state that locks are built from.
//!
//! One client talks to one deployment: a single server, a Redis Cluster, or the master that
//! Sentinel names. Its pool hands out [`Conn`]s; a connection that saw an I/O error, a timeout
//! or a `READONLY` reply (a master demoted by a failover) marks itself broken and is replaced,
//! so a client recovers from restarts and failovers without being rebuilt.

pub(crate) mod access;
pub(crate) mod acquire;
pub(crate) mod admin;
pub(crate) mod builder;
pub(crate) mod cleanup;
pub(crate) mod confirm;
pub(crate) mod grants;
pub(crate) mod janitor;
pub(crate) mod jobs;
pub(crate) mod live;
pub(crate) mod native;
pub(crate) mod pool;
pub(crate) mod repeats;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel_watch;
pub(crate) mod subscriber;
pub(crate) mod switches;
pub(crate) mod target;
pub(crate) mod test_hooks;
pub(crate) mod tuning;
pub(crate) mod waiters;
pub(crate) mod watchdog;
pub(crate) mod watched;

pub(crate) use pool::*;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::client::confirm::{Acks, ReplicaAcks};
use crate::client::jobs::Janitor;
use crate::client::live::LiveValues;
use crate::client::native::{Detected, Native};
use crate::client::pool::within;
use crate::client::repeats::log_repeat;
use crate::client::subscriber::{Resolve, Wakeups};
use crate::client::switches::Switches;
use crate::client::waiters::{lock, WaitQueues};
use crate::client::watched::Watchdog;
use crate::error::{self, Context, Fault, LockError, Result, Rounded};
use crate::scripts::Scripts;
use crate::stats::{Counters, Stats};

/// The longest connect or command timeout [`ClientBuilder::build`](crate::ClientBuilder::build) accepts (one year; no
/// command timeout at all is `command_timeout(None)`). Longer values overflow deadline
/// arithmetic on some platforms' clocks and mean "never" in practice.
pub const MAX_CLIENT_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// Hex digits of the client's id at the start of the tokens its locks write.
pub(crate) const TOKEN_PREFIX_LEN: usize = 16;

/// A handle to one Redis deployment: a pool of connections, the Lua scripts' SHAs and the
/// in-process waiter lines.
///
/// Cheap to clone (an `Arc`); build it once per process and make locks from it with
/// [`LockClient::lock`].
///
/// When its last handle is dropped (the client, its clones and the locks built from it), the
/// clean-ups still pending (see [`pending_cleanups`](Self::pending_cleanups)) are tried once
/// more on the dropping thread, within one command timeout for them all, before the client's
/// threads stop; what is not done by then is logged. Drop it before the process exits
/// (`std::process::exit` runs no destructors).
///
/// ```no_run
/// use redis_dlock::{DistributedLock, LockClient, Strategy};
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let lock = client.lock("orders:42").strategy(Strategy::Token).build()?;
/// let guard = lock.lock()?;
/// // ... critical section ...
/// assert!(guard.unlock()?, "the lock expired while we held it");
/// # Ok(()) }
/// ```
pub struct LockClient {
    inner: Arc<Inner>,
    /// A handle of the application's (counted in `Inner::handles`), not a background
    /// thread's upgrade of its [`WeakClient`].
    counted: bool,
}

impl Clone for LockClient {
    fn clone(&self) -> Self {
        if self.counted {
            self.inner.handles.fetch_add(1, Ordering::Relaxed);
        }
        LockClient {
            inner: Arc::clone(&self.inner),
            counted: self.counted,
        }
    }
}

/// The last handle of the application (a clone, or a lock's) drains the janitor: its pending
/// clean-ups are tried once more, within one command timeout, before its threads stop with
/// the client (see `Janitor::drain`). A background thread's handle is not counted: it lives
/// for one round of its work.
impl Drop for LockClient {
    fn drop(&mut self) {
        if self.counted && self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.janitor.drain(self);
        }
    }
}

struct Inner {
    /// The application's handles (see [`LockClient`]'s `Drop`).
    handles: std::sync::atomic::AtomicUsize,
    pool: Pool,
    scripts: Scripts,
    waiters: Arc<WaitQueues>,
    /// Random UUID: the instance part of this client's owner ids (reentrant locks).
    instance: String,
    /// The first 16 hex digits of `instance` (see [`LockClient::token_prefix`]), computed
    /// once: every acquire and release of a token-valued lock reads them.
    token_prefix: [u8; TOKEN_PREFIX_LEN],
    /// Renews this client's watched holds (one thread, started with the first).
    watchdog: Watchdog,
    /// The shared subscriber connection that wakes waiters (one thread, started with the
    /// first wait).
    wakeups: Wakeups,
    /// Talks to a Redis Cluster: multi-key scripts must keep to one slot.
    cluster: bool,
    /// See [`ClientBuilder::handoff_courtesy`](crate::ClientBuilder::handoff_courtesy).
    courtesy: Duration,
    /// Background owner-checked deletes after lost acquire replies and failed releases.
    janitor: Janitor,
    /// Values this client is writing or holds (see `client/live.rs`).
    live: LiveValues,
    /// The server takes `SET … NX PX … GET` (Redis 7.0+), as it said at `build()` (assumed
    /// when it was not asked), until a server that refused it says it lacks it.
    set_get: AtomicBool,
    /// The native commands the server has (learned at `build()`), until a server refuses one.
    native: Native,
    /// Where the client connects, for error messages ("127.0.0.1:6379", ...).
    addr: String,
    /// The command timeout (or the connect timeout without one), for error messages.
    timeout: Duration,
    /// The pool's latest failure to open a connection, for errors at checkout: r2d2 reports
    /// only "timed out waiting for connection". (r2d2's own error handler is never called:
    /// [`Lazy`] adds connections unopened, and no checkout is tested.)
    connect_error: Mutex<Option<redis::RedisError>>,
    /// The client's log lines that repeat while something stays wrong (shared with its
    /// subscriber).
    repeats: Arc<repeats::Repeats>,
    /// Sentinel clients: the master switches seen, to discard connections to an old master.
    switches: Option<Arc<Switches>>,
    /// What happened since the client was built ([`LockClient::stats`]); shared with the
    /// pool's manager and the subscriber.
    counters: Arc<Counters>,
    /// Replica confirmation of hold writes; shared with the pool's manager, which learns the
    /// primary's replicas.
    acks: Arc<Acks>,
}

/// A reference to a client that does not keep it alive (held by its background threads).
#[derive(Clone)]
pub(crate) struct WeakClient {
    inner: Weak<Inner>,
}

impl WeakClient {
    /// The client, unless every handle to it has been dropped.
    pub(crate) fn upgrade(&self) -> Option<LockClient> {
        self.inner.upgrade().map(|inner| LockClient {
            inner,
            counted: false,
        })
    }
}

/// Runs its closure when dropped, also by a panic: a worker thread's mark that it stopped, a
/// replay batch's end of its tries.
pub(crate) struct OnExit<F: FnMut()>(pub(crate) F);

impl<F: FnMut()> Drop for OnExit<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.pool_state();
        f.debug_struct("LockClient")
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// A client on `pool`, whose connections `manager` opens (`None`: an application's own
    /// pool, which is no cluster, follows no master switch and confirms no write).
    fn with_pool(
        pool: Pool,
        manager: Option<&Manager>,
        resolve: Option<Resolve>,
        courtesy: Duration,
        detected: Detected,
    ) -> Self {
        let timeout = manager.map_or(crate::ClientBuilder::DEFAULT_COMMAND_TIMEOUT, |m| {
            m.command_timeout.unwrap_or(m.connect_timeout)
        });
        let counters = manager.map_or_else(Arc::default, |m| Arc::clone(&m.counters));
        let waiters = Arc::new(WaitQueues::default());
        let instance = crate::ids::new_uuid();
        let repeats = Arc::<repeats::Repeats>::default();
        LockClient {
            counted: true,
            inner: Arc::new(Inner {
                handles: std::sync::atomic::AtomicUsize::new(1),
                token_prefix: token_prefix_of(&instance),
                pool,
                scripts: Scripts::for_server(detected.version.as_ref()),
                wakeups: Wakeups::new(
                    resolve,
                    Arc::clone(&waiters),
                    timeout,
                    Arc::clone(&counters),
                    Arc::clone(&repeats),
                ),
                waiters,
                instance,
                watchdog: Watchdog::default(),
                cluster: manager.is_some_and(|m| m.target.is_cluster()),
                courtesy,
                janitor: Janitor::default(),
                live: LiveValues::default(),
                set_get: AtomicBool::new(
                    detected
                        .version
                        .as_ref()
                        .is_none_or(crate::server::Version::has_set_nx_get),
                ),
                native: Native::new(detected),
                addr: manager
                    .map_or_else(|| "the application's pool".to_owned(), |m| m.addr.clone()),
                timeout,
                connect_error: Mutex::default(),
                repeats,
                switches: manager.and_then(|m| m.switches.clone()),
                counters,
                // The application's pool: no confirmation, so no `WAIT` bound.
                acks: manager.map_or_else(
                    || Arc::new(Acks::new(ReplicaAcks::Off, Duration::ZERO, false)),
                    |m| Arc::clone(&m.acks),
                ),
            }),
        }
    }

    /// The client's log lines that repeat while something stays wrong (see
    /// [`repeats`](self::repeats)).
    pub(crate) fn repeats(&self) -> &repeats::Repeats {
        &self.inner.repeats
    }

    /// What this client counted since it was built: acquires, refusals, timeouts, lost holds,
    /// renewals, wake-ups, Classic takeovers, clean-ups and reconnects ([`Stats`] says what
    /// each counts). Reads a few atomics; sends nothing. With the cargo feature `metrics` the
    /// same counts are reported through the `metrics` crate.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redis_dlock::LockError> {
    /// let client = redis_dlock::LockClient::open("redis://127.0.0.1:6379/")?;
    /// let before = client.stats();
    /// // ... work ...
    /// let now = client.stats();
    /// println!("{} holds, {} timeouts", now.acquires - before.acquires, now.timeouts - before.timeouts);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    /// The live counters behind [`stats`](Self::stats).
    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// A reference for background threads that does not keep the client alive.
    pub(crate) fn downgrade(&self) -> WeakClient {
        WeakClient {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The client's instance id (a random UUID): the first part of its owner ids.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance
    }

    /// The client's command timeout (its connect timeout without one): the bound of a
    /// clean-up tried on the caller's thread.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// True for a Redis Cluster client.
    pub(crate) fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// True if this client may require replicas to confirm its hold writes
    /// ([`with_conn_confirmed`](Self::with_conn_confirmed) sends `WAIT`): a Sentinel or
    /// single-server client that requires any replica now, a Cluster client whose mode may
    /// (each shard's primary is learnt on its own, at its first confirmed write). False means
    /// no write of this client is confirmed: a caller adds no write for the confirmation's
    /// sake.
    pub(crate) fn confirms_writes(&self) -> bool {
        if self.inner.cluster {
            self.inner.acks.may_confirm()
        } else {
            self.inner.acks.required() > 0
        }
    }

    /// The client's renewal thread.
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.inner.watchdog
    }

    /// See [`ClientBuilder::handoff_courtesy`](crate::ClientBuilder::handoff_courtesy).
    pub(crate) fn handoff_courtesy(&self) -> Duration {
        self.inner.courtesy
    }

    /// The client's pub/sub subscriber.
    pub(crate) fn wakeups(&self) -> &Wakeups {
        &self.inner.wakeups
    }

    /// True while the client sends `SET … NX PX … GET` (the server has it: Redis 7.0+).
    pub(crate) fn set_get(&self) -> bool {
        self.inner.set_get.load(Ordering::Relaxed)
    }

    /// After `SET … NX PX … GET` was answered with `e` on `con`: true if the client is to send
    /// plain `SET … NX PX` instead, for this call and from now on, which is only when the
    /// server, asked on `con` (`INFO server`), says it lacks it (before Redis 7.0). Any other
    /// error is the caller's to return.
    pub(crate) fn lacks_set_get(
        &self,
        con: &mut dyn redis::ConnectionLike,
        e: &redis::RedisError,
    ) -> bool {
        let lacks = crate::server::lacks(con, e, crate::server::Version::has_set_nx_get).is_some();
        if lacks && self.inner.set_get.swap(false, Ordering::Relaxed) {
            log::info!(
                "the server does not take SET ... NX PX ... GET (Redis < 7.0): Token acquires \
                 use SET ... NX PX, and a key of another type is found only when a wait ends"
            );
        }
        lacks
    }

    /// The client's scripts (their SHAs, for commands packed in advance).
    pub(crate) fn scripts(&self) -> &Scripts {
        &self.inner.scripts
    }

    /// The native commands this client uses instead of scripts (see [`native`]).
    pub(crate) fn native(&self) -> &Native {
        &self.inner.native
    }

    /// For the benchmarks: the Token lock's scripts (`native == false`) or the native commands
    /// the server has (`true`).
    #[cfg(feature = "bench-hooks")]
    pub(crate) fn force_native(&self, native: bool) {
        self.inner.native.force(native);
    }

    /// Sentinel clients: the master switches seen, and the recent releases to do again after
    /// one.
    pub(crate) fn switches(&self) -> Option<&Switches> {
        self.inner.switches.as_deref()
    }

    /// The switch generation of a Sentinel client (0 for others): taken before a release is
    /// sent, so that one answered after a switch is replayed (see `janitor::remember`).
    pub(crate) fn switch_generation(&self) -> u64 {
        self.switches().map_or(0, Switches::generation)
    }

    /// The client's id as it opens the tokens its token-valued locks write: the first 16 hex
    /// digits of its instance id (a random UUID). After a Sentinel switch, a value of the
    /// client's that the new master still holds is recognised by it.
    pub(crate) fn token_prefix(&self) -> [u8; TOKEN_PREFIX_LEN] {
        self.inner.token_prefix
    }

    /// Values this client is writing or holds (see `client/live.rs`).
    pub(crate) fn live(&self) -> &LiveValues {
        &self.inner.live
    }

    /// Entries of the client's live set (see `client/live.rs`): the writes under way and the
    /// holds whose lifetime has not run out. For the tests that check it stays bounded: only
    /// with the hidden feature `test-hooks`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn live_values(&self) -> usize {
        self.inner.live.len()
    }

    /// True if `value`, found at a lock key, was written by this client (a token)
    /// and is neither held nor being written by it: a hold nobody will release.
    pub(crate) fn is_stale_own(&self, value: &[u8]) -> bool {
        value.len() > TOKEN_PREFIX_LEN
            && value.starts_with(&self.token_prefix())
            && !self.inner.live.contains(live::value(value))
    }

    /// The client's background clean-ups.
    pub(crate) fn janitor(&self) -> &Janitor {
        &self.inner.janitor
    }

    /// Clean-ups the client still has to do in the background (for tests and monitoring): an
    /// owner-checked delete of a lock whose acquire reply was lost or whose release failed on a
    /// connection error, retried until it is answered or the lock would have expired anyway.
    /// See `docs/production.md`.
    pub fn pending_cleanups(&self) -> usize {
        self.inner.janitor.pending()
    }

    /// For the crate's own tests: while `on`, a clean-up is queued only, neither tried before
    /// the call returns nor by the janitor thread, so that a test can see what the drain of a
    /// dropped client does with it.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn hold_cleanups_back(&self, on: bool) {
        self.inner.janitor.shared.lock().held_back = on;
    }

    /// Watched holds the watchdog currently renews (for tests and monitoring).
    pub fn watched_count(&self) -> usize {
        self.inner.watchdog.watched()
    }

    /// Connections open and idle in the pool.
    pub fn pool_state(&self) -> r2d2::State {
        match &self.inner.pool {
            Pool::Managed(p) => p.state(),
            Pool::External(p) => p.state(),
        }
    }

    /// The in-process waiter lines of this client.
    pub(crate) fn waiters(&self) -> &WaitQueues {
        &self.inner.waiters
    }

    /// Counts an event the crate's tests may wait for (nothing without the feature
    /// `test-hooks`).
    #[inline(always)]
    pub(crate) fn note(&self, event: test_hooks::Event) {
        self.inner.waiters.hooks.note(event);
    }

    /// For the crate's own tests: the events this client has seen (subscriptions confirmed,
    /// waiters queued, renewals, master switches), to wait for instead of sleeping.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn test_hooks(&self) -> &test_hooks::TestHooks {
        &self.inner.waiters.hooks
    }

    /// A pooled connection; failures are reported against `key`.
    ///
    /// A connection the pool added unopened is opened here, on the caller's thread (see
    /// [`Lazy`](crate::client::pool::Lazy)), and so is again a Sentinel client's connection
    /// opened before the last master switch it heard of (see [`Link::open_if_needed`]).
    ///
    /// Neither the checkout, the opening nor any command sent on it waits past `until` (a
    /// watchdog renewal's cap, see [`Link::cap`]): their timeouts are cut to the time left.
    fn conn(&self, key: &str, until: Option<Instant>) -> Result<Conn> {
        let err = |e: r2d2::Error| self.checkout_error(key, e);
        let left = |t: Duration| within(t, until).map_err(|e| self.command_error(key, e));
        let p = match &self.inner.pool {
            Pool::Managed(p) => p,
            Pool::External(p) => {
                let con = p.get_timeout(left(p.connection_timeout())?);
                return con.map(Conn::External).map_err(err);
            }
        };
        // An idle connection first: r2d2's `try_get` reads the clock once where `get_timeout`
        // reads it three times (its deadline and checkout event), a cost of every lock
        // operation. The same connection either way; without one idle, `get_timeout` opens or
        // waits as before.
        let mut con = match until.is_none().then(|| p.try_get()).flatten() {
            Some(con) => con,
            None => p.get_timeout(left(p.connection_timeout())?).map_err(err)?,
        };
        if let Err(e) = con.open_if_needed(until) {
            log_repeat!(
                self.repeats(),
                "pool: opening a connection failed",
                log::Level::Debug,
                "pool: opening a connection failed: {e}"
            );
            *lock(&self.inner.connect_error) = Some(e.clone());
            return Err(self.checkout_error(key, e));
        }
        // Lifted when the connection goes back to the pool (`Conn`'s drop). A connection of an
        // application's own pool keeps its read timeouts (they are the application's, and
        // could not be restored).
        con.cap(until);
        Ok(Conn::Managed(con))
    }

    /// A failed checkout, with what the pool's latest connection attempt said: access denied
    /// is a configuration fault, anything else an outage. r2d2's own error says only that it
    /// timed out waiting.
    fn checkout_error(
        &self,
        key: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> LockError {
        let addr = &self.inner.addr;
        let last = lock(&self.inner.connect_error).clone();
        match last {
            // A wrong password, unknown user or missing permission: not an outage.
            Some(last) if error::is_access_denied(&last) => LockError::Config {
                key: Some(key.to_owned()),
                reason: format!("cannot open a connection to {addr}: access denied"),
                fault: Fault::of(&last),
                source: Some(Box::new(last)),
            },
            // No command was sent: an outage, retried as one even when connecting timed out.
            // One that took the whole connect timeout (connecting, or waiting for a free
            // connection) says so: a clean-up is not tried again at once (see `Why`).
            Some(last) => LockError::connection(
                key,
                if last.is_timeout() {
                    Fault::NotConnected
                } else {
                    Fault::Unreachable
                },
                Box::new(Context::new(format!("no connection to {addr}"), Some(last))),
            ),
            None => LockError::connection(key, Fault::NotConnected, Box::new(e)),
        }
    }

    /// Maps a Redis error of a command for `key`, saying which server did not answer in time.
    fn command_error(&self, key: &str, e: redis::RedisError) -> LockError {
        if e.is_timeout() {
            let (addr, timeout) = (&self.inner.addr, Rounded(self.inner.timeout));
            let what = format!("no reply from {addr} within {timeout}");
            return LockError::connection(
                key,
                Fault::Timeout,
                Box::new(Context::new(what, Some(e))),
            );
        }
        if error::is_access_denied(&e) {
            log_repeat!(
                self.repeats(),
                "a command refused (access)",
                log::Level::Warn,
                "lock {key:?}: the server refused a command for this user: {e}"
            );
        }
        LockError::from_redis(key, e)
    }

    /// [`with_conn`](Self::with_conn) for a write of a hold (an acquire, an extend, a
    /// renewal): where the client requires replicas to confirm writes (see
    /// [`confirm`](crate::client::confirm)), every command `f` sends is followed by `WAIT` in
    /// the same round trip, and a write that fewer replicas confirmed is
    /// [`LockError::NotReplicated`]. The write may stand on the primary then: the caller undoes
    /// it as it undoes an acquire whose reply was lost.
    ///
    /// Nothing (checkout, connecting, any command) waits past `until`, if given: a call cut
    /// short fails with a timeout. The watchdog's renewals, bounded by the earliest loss
    /// deadline of the holds they carry.
    pub(crate) fn with_conn_confirmed<T>(
        &self,
        key: &str,
        until: Option<Instant>,
        mut f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
    ) -> Result<T> {
        if !self.confirms_writes() {
            return self.with_conn_until(key, until, f);
        }
        let acks = &self.inner.acks;
        let mut short = None;
        let reply = self.with_conn_until(key, until, |con, s| {
            // On a Cluster the `WAIT` rides with the write too: redis-rs sends a pipeline to
            // the node of its first command's key, and follows its redirections with the whole
            // pipeline, so the `WAIT` reaches the primary that ran the write.
            #[cfg(feature = "cluster")]
            let wait = match self.inner.cluster {
                true => acks.cluster_wait(key, || con.primary_role(key))?,
                false => acks.wait(),
            };
            #[cfg(not(feature = "cluster"))]
            let wait = acks.wait();
            con.set_wait(wait);
            let reply = f(con, s);
            short = con.set_wait(None).and_then(|w| w.shortfall());
            #[cfg(feature = "cluster")]
            if let Some(missed) = short.filter(|_| self.inner.cluster) {
                short = acks.cluster_recheck(key, || con.primary_role(key), missed);
            }
            reply
        });
        // On a Cluster a failure may be a failover: each slot's primary is asked again at its
        // next confirmed write, so that a promoted replica is learnt afresh (no slot is known
        // on other deployments).
        #[cfg(feature = "cluster")]
        let reply = reply.inspect_err(|_| acks.forget_slots());
        let reply = reply?;
        // Fewer replicas than required confirmed the write: `(confirmed, required)`.
        if let Some((confirmed, required)) = short {
            log::debug!("lock {key:?}: a write confirmed by {confirmed} of {required} replicas");
            return Err(LockError::NotReplicated {
                key: key.to_owned(),
                confirmed,
                required,
            });
        }
        Ok(reply)
    }

    /// Runs `f` on a pooled connection, mapping Redis errors to [`LockError`] for `key`.
    ///
    /// A connection that sat idle in the pool while Redis restarted fails its next command with
    /// "connection dropped" (EOF, reset, broken pipe) although the server is back. Such a
    /// connection is discarded and `f` runs again on another one, up to once per pooled
    /// connection; a fresh connection that fails is a real outage and is reported.
    ///
    /// Repeating `f` is safe for the single-value locks (Token, Classic, RedLock nodes) even in
    /// the rare case where the server ran the command and then closed the socket itself
    /// (`CLIENT KILL`, idle `timeout`): a repeated acquire finds its own value and reports the
    /// lock held (our orphan expires by itself), a repeated release or extend finds its work
    /// done and reports the lock lost. Counted holds (the reentrant and read-write locks) are
    /// not idempotent: in that rare case a repeated acquire counts one hold too many (it
    /// expires with the lease) and a repeated reentrant release gives back one too many (a
    /// read-write release carries an unlock latch, so its resend answers from the first
    /// run). With a restart, the common cause of a dropped pooled connection, the first send
    /// never reached a server.
    pub(crate) fn with_conn<T>(
        &self,
        key: &str,
        f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
    ) -> Result<T> {
        self.with_conn_until(key, None, f)
    }

    /// [`with_conn`](Self::with_conn), waiting past `until` (if given) for nothing: see
    /// [`with_conn_confirmed`](Self::with_conn_confirmed).
    pub(crate) fn with_conn_until<T>(
        &self,
        key: &str,
        until: Option<Instant>,
        mut f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
    ) -> Result<T> {
        // Sized on the first dropped connection only: the pool's state takes its mutex.
        let mut stale_left: Option<u32> = None;
        let mut redirects_left = MOVED_RESENDS;
        loop {
            let mut conn = self.conn(key, until)?;
            let reused = conn.was_used();
            match f(&mut conn, &self.inner.scripts) {
                Err(e) if reused && is_dropped(&e) && stale_left != Some(0) => {
                    log_repeat!(
                        self.repeats(),
                        "pool: pooled connection dropped",
                        log::Level::Info,
                        "lock {key:?}: a pooled connection was found closed ({e}); the command \
                         is sent again on another"
                    );
                    let left = stale_left.unwrap_or_else(|| self.pool_state().connections + 1);
                    stale_left = Some(left - 1);
                }
                // A Cluster slot that moved again while redis-rs followed its redirections
                // (a migration under way): the command did not run where it was last sent, so
                // it is sent again, on the slot map that redirection refreshed.
                Err(e) if matches!(e.code(), Some("MOVED" | "ASK")) && redirects_left > 0 => {
                    log::debug!("lock {key:?}: {e} after redis-rs's redirections; sent again");
                    redirects_left -= 1;
                }
                other => return other.map_err(|e| self.command_error(key, e)),
            }
        }
    }
}

/// The first [`TOKEN_PREFIX_LEN`] hex digits of a client's instance id, lowercase (see
/// [`LockClient::token_prefix`]).
fn token_prefix_of(instance: &str) -> [u8; TOKEN_PREFIX_LEN] {
    let mut id = [b'0'; TOKEN_PREFIX_LEN];
    let hex = instance.bytes().filter(u8::is_ascii_hexdigit);
    for (slot, b) in id.iter_mut().zip(hex) {
        *slot = b.to_ascii_lowercase();
    }
    id
}

/// How many times a command that still met `MOVED` or `ASK` after redis-rs's own redirections
/// is sent again (each within its own command timeout).
const MOVED_RESENDS: u32 = 2;
/// An error that says the socket is dead (the peer closed or reset it), as opposed to a timeout
/// after which the command may still run.
fn is_dropped(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}
