//! [`LockClient`]: the connection pool and shared state that locks are built from.
//!
//! One client talks to one deployment: a single server, a Redis Cluster, or the master that
//! Sentinel names. Its pool hands out [`Conn`]s; a connection that saw an I/O error, a timeout
//! or a `READONLY` reply (a master demoted by a failover) marks itself broken and is replaced,
//! so a client recovers from restarts and failovers without being rebuilt.

pub(crate) mod cluster_deadline;
pub(crate) mod janitor;
pub(crate) mod sentinel_watch;
pub(crate) mod subscriber;
pub(crate) mod waiters;
pub(crate) mod watchdog;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::{
    ConnectionAddr, ConnectionInfo, ConnectionLike, IntoConnectionInfo, RedisResult, Value,
};

use crate::client::cluster_deadline::{with_deadline, Deadlined};
use crate::client::janitor::Janitor;
use crate::client::sentinel_watch::Switches;
use crate::client::subscriber::{Resolve, Wakeups};
use crate::client::waiters::WaitQueues;
use crate::client::watchdog::Watchdog;
use crate::error::{self, Context, LockError, Result, Rounded};
use crate::scripts::Scripts;
use crate::strategy::LockBuilder;

/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: u32 = 16;
/// Default time allowed to open a connection (and to wait for a free pooled one).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for Redis to answer one command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Default head start a releasing client gives other clients' waiters: see
/// [`ClientBuilder::handoff_courtesy`].
pub const DEFAULT_HANDOFF_COURTESY: Duration = Duration::from_millis(3);
/// The longest handoff courtesy [`ClientBuilder::build`] accepts: the courtesy is a head start
/// of a few round trips, and a longer one would only stall the releasing client.
pub const MAX_HANDOFF_COURTESY: Duration = Duration::from_secs(1);
/// The longest connect or command timeout [`ClientBuilder::build`] accepts (one year; no
/// command timeout at all is `command_timeout(None)`). Longer values overflow deadline
/// arithmetic on some platforms' clocks and mean "never" in practice.
pub const MAX_CLIENT_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// Threads of each client's connection pool scheduler, which opens connections in the
/// background and closes idle ones (r2d2's default).
const SCHEDULER_THREADS: usize = 3;

/// A handle to one Redis deployment: a pool of connections, the Lua scripts' SHAs and the
/// in-process waiter lines.
///
/// Cheap to clone (an `Arc`); build it once per process and make locks from it with
/// [`LockClient::lock`].
///
/// ```no_run
/// use redis_dlock::{LockClient, Strategy};
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let lock = client.lock("orders:42").strategy(Strategy::Token).build()?;
/// let guard = lock.lock()?;
/// // ... critical section ...
/// assert!(guard.unlock()?, "the lock expired while we held it");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    scripts: Scripts,
    waiters: Arc<WaitQueues>,
    /// Random UUID: the instance part of this client's owner ids (reentrant locks).
    instance: String,
    /// Renews this client's watched holds (one thread, started with the first).
    watchdog: Watchdog,
    /// The shared subscriber connection that wakes waiters (one thread, started with the
    /// first wait).
    wakeups: Wakeups,
    /// Talks to a Redis Cluster: multi-key scripts must keep to one slot.
    cluster: bool,
    /// See [`ClientBuilder::handoff_courtesy`].
    courtesy: Duration,
    /// Background owner-checked deletes after lost acquire replies and failed releases.
    janitor: Janitor,
    /// The server takes `SET … NX PX … GET` (Redis 7.0+): until a server refuses it.
    set_get: AtomicBool,
    /// Where the client connects, for error messages ("127.0.0.1:6379", ...).
    addr: String,
    /// The command timeout (or the connect timeout without one), for error messages.
    timeout: Duration,
    /// The pool's latest failure to open a connection (for errors at checkout).
    connect_errors: Arc<ConnectErrors>,
    /// Sentinel clients: the master switches seen, to discard connections to an old master.
    switches: Option<Arc<Switches>>,
}

/// The latest failure of the pool to open a connection: r2d2 reports only "timed out waiting
/// for connection", so its error handler keeps what actually went wrong.
#[derive(Debug, Default)]
pub(crate) struct ConnectErrors {
    last: std::sync::Mutex<Option<(bool, String)>>,
}

impl ConnectErrors {
    fn note(&self, e: &redis::RedisError) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        *last = Some((error::is_access_denied(e), e.to_string()));
    }

    /// The latest failure: whether access was denied, and what it said.
    fn last(&self) -> Option<(bool, String)> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl r2d2::HandleError<redis::RedisError> for ConnectErrors {
    fn handle_error(&self, e: redis::RedisError) {
        log::debug!("pool: opening a connection failed: {e}");
        self.note(&e);
    }
}

/// Lets the pool own an `Arc` of the client's [`ConnectErrors`].
#[derive(Debug)]
struct SharedErrors(Arc<ConnectErrors>);

impl r2d2::HandleError<redis::RedisError> for SharedErrors {
    fn handle_error(&self, e: redis::RedisError) {
        r2d2::HandleError::handle_error(self.0.as_ref(), e);
    }
}

/// A reference to a client that does not keep it alive (held by its background threads).
#[derive(Clone)]
pub(crate) struct WeakClient {
    inner: Weak<Inner>,
}

impl WeakClient {
    /// The client, unless every handle to it has been dropped.
    pub(crate) fn upgrade(&self) -> Option<LockClient> {
        self.inner.upgrade().map(|inner| LockClient { inner })
    }

    /// False once every handle to the client has been dropped.
    pub(crate) fn is_alive(&self) -> bool {
        self.inner.strong_count() > 0
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
    /// Connects to the Redis at `url` (`redis://host:port/db`) with the default pool settings.
    pub fn open(url: &str) -> Result<Self> {
        Self::builder(url).build()
    }

    /// A builder for one server at `url`, to tune the pool and timeouts.
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder::new(TargetSpec::Single(url.to_owned()))
    }

    /// A builder for a Redis Cluster reached through any of `nodes` (`redis://host:port`).
    /// Commands follow `MOVED`/`ASK` redirections; every key of one lock lives in one slot.
    ///
    /// Each command, its redirections and retries included (`TRYAGAIN`, `CLUSTERDOWN`, a
    /// failed-over node), returns within the command timeout plus at most one retry sleep of a
    /// tenth of it: every read, write and connect of it is cut to the time left before one
    /// deadline. Waiting for a pooled connection and opening a new one are bounded by the
    /// connect timeout, as for a single server. See `docs/deployments.md`.
    pub fn cluster_builder<S: AsRef<str>>(nodes: &[S]) -> ClientBuilder {
        ClientBuilder::new(TargetSpec::Cluster(
            nodes.iter().map(|n| n.as_ref().to_owned()).collect(),
        ))
    }

    /// A builder for the master that the Sentinels at `sentinels` name for `service`. After a
    /// failover, new connections go to the new master. The client follows the Sentinels'
    /// `+switch-master` announcements (one background thread per client, `dlock-sentinel`):
    /// pooled connections opened before an announced switch are discarded at their next
    /// checkout, so a graceful failover, whose old master keeps answering as a master for a
    /// while, is followed at once. Connections to an old master are also dropped on their first
    /// `READONLY` or I/O error.
    ///
    /// Every new connection asks the Sentinels in turn (`SENTINEL GET-MASTER-ADDR-BY-NAME`) and
    /// checks with `ROLE` that the server named is a master. Each of these steps is bounded by
    /// the connect and command timeouts (the connect timeout if the command timeout is `None`),
    /// so a frozen Sentinel or old master delays a reconnection but never blocks it.
    pub fn sentinel_builder<S: AsRef<str>>(sentinels: &[S], service: &str) -> ClientBuilder {
        ClientBuilder::new(TargetSpec::Sentinel {
            sentinels: sentinels.iter().map(|n| n.as_ref().to_owned()).collect(),
            service: service.to_owned(),
        })
    }

    /// Uses a pool the application already has.
    ///
    /// The pool's own settings apply. For the one-round-trip hot path, build it with
    /// `test_on_check_out(false)`: r2d2's default sends a `PING` on every checkout, which doubles
    /// the cost of every lock operation. Set read timeouts on its connections, or a paused Redis
    /// blocks callers for as long as the OS lets a socket wait.
    ///
    /// Such a client has no address to open its subscriber connection to, so its waiters poll
    /// (by their retry policy) instead of being woken by pub/sub.
    pub fn from_pool(pool: r2d2::Pool<redis::Client>) -> Self {
        Self::with_pool(
            Pool::External(pool),
            None,
            false,
            DEFAULT_COMMAND_TIMEOUT,
            DEFAULT_HANDOFF_COURTESY,
            ("the application's pool".to_owned(), Arc::default()),
            None,
        )
    }

    fn with_pool(
        pool: Pool,
        resolve: Option<Resolve>,
        cluster: bool,
        timeout: Duration,
        courtesy: Duration,
        (addr, connect_errors): (String, Arc<ConnectErrors>),
        switches: Option<Arc<Switches>>,
    ) -> Self {
        let waiters = Arc::new(WaitQueues::default());
        LockClient {
            inner: Arc::new(Inner {
                pool,
                scripts: Scripts::new(),
                wakeups: Wakeups::new(resolve, Arc::clone(&waiters), timeout),
                waiters,
                instance: crate::strategy::owner::new_uuid(),
                watchdog: Watchdog::new(),
                cluster,
                courtesy,
                janitor: Janitor::default(),
                set_get: AtomicBool::new(true),
                addr,
                timeout,
                connect_errors,
                switches,
            }),
        }
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

    /// True for a Redis Cluster client.
    pub(crate) fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// The client's renewal thread.
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.inner.watchdog
    }

    /// See [`ClientBuilder::handoff_courtesy`].
    pub(crate) fn handoff_courtesy(&self) -> Duration {
        self.inner.courtesy
    }

    /// The client's pub/sub subscriber.
    pub(crate) fn wakeups(&self) -> &Wakeups {
        &self.inner.wakeups
    }

    /// True until a server refused `SET … NX PX … GET` (servers before Redis 7.0).
    pub(crate) fn set_get(&self) -> bool {
        self.inner.set_get.load(Ordering::Relaxed)
    }

    /// A server refused `SET … NX PX … GET`: use plain `SET … NX PX` from now on.
    pub(crate) fn no_set_get(&self) {
        if self.inner.set_get.swap(false, Ordering::Relaxed) {
            log::info!(
                "the server does not take SET ... NX PX ... GET (Redis < 7.0): Token acquires \
                 use SET ... NX PX, and a key of another type is found only when a wait ends"
            );
        }
    }

    /// Sentinel clients: the master switches seen, and the recent releases to do again after
    /// one.
    pub(crate) fn switches(&self) -> Option<&Switches> {
        self.inner.switches.as_deref()
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

    /// Watched holds the watchdog currently renews (for tests and monitoring).
    pub fn watched_count(&self) -> usize {
        self.inner.watchdog.watched()
    }

    /// Starts building a lock on `key`. See [`LockBuilder`] for the options and defaults.
    pub fn lock(&self, key: impl Into<String>) -> LockBuilder {
        LockBuilder::new(self.clone(), key.into())
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

    /// A pooled connection; failures are reported against `key`.
    ///
    /// A Sentinel client discards connections opened before the last master switch it heard
    /// of (see [`crate::client::sentinel_watch`]): they may lead to the old master, which goes on
    /// answering as a master until Sentinel reconfigures it. At most one per pooled connection
    /// is discarded, then a new one is opened (to the new master, `ROLE` checked).
    fn conn(&self, key: &str) -> Result<Conn> {
        let err = |e: r2d2::Error| self.checkout_error(key, e);
        match &self.inner.pool {
            Pool::Managed(p) => {
                let Some(switches) = &self.inner.switches else {
                    return p.get().map(Conn::Managed).map_err(err);
                };
                let mut stale_left = p.max_size();
                loop {
                    let mut con = p.get().map_err(err)?;
                    let now = switches.generation();
                    if con.generation >= now || stale_left == 0 {
                        return Ok(Conn::Managed(con));
                    }
                    log::debug!(
                        "lock {key:?}: dropping a connection opened before the master switch \
                         (generation {} < {now})",
                        con.generation
                    );
                    // Not returned to the pool (see `has_broken`).
                    con.broken = true;
                    stale_left -= 1;
                }
            }
            Pool::External(p) => p.get().map(Conn::External).map_err(err),
        }
    }

    /// A failed checkout, with what the pool's latest connection attempt said: access denied
    /// is a set-up fault, anything else an outage.
    fn checkout_error(&self, key: &str, e: r2d2::Error) -> LockError {
        match self.inner.connect_errors.last() {
            // A wrong password, unknown user or missing permission: not an outage.
            Some((true, why)) => LockError::Setup {
                source: Box::new(Context::new(
                    format!("cannot open a connection to {}: {why}", self.inner.addr),
                    None,
                )),
            },
            Some((false, why)) => LockError::Connection {
                key: key.to_owned(),
                source: Box::new(Context::new(
                    format!("no connection to {}: {why}", self.inner.addr),
                    None,
                )),
            },
            None => LockError::Connection {
                key: key.to_owned(),
                source: Box::new(e),
            },
        }
    }

    /// Maps a Redis error of a command for `key`, saying which server did not answer in time.
    fn command_error(&self, key: &str, e: redis::RedisError) -> LockError {
        if e.is_timeout() {
            return LockError::Connection {
                key: key.to_owned(),
                source: Box::new(Context::new(
                    format!(
                        "no reply from {} within {}",
                        self.inner.addr,
                        Rounded(self.inner.timeout)
                    ),
                    Some(e),
                )),
            };
        }
        if error::is_access_denied(&e) {
            log::warn!("lock {key:?}: the server refused a command: {e}");
        }
        LockError::from_redis(key, e)
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
        mut f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
    ) -> Result<T> {
        // Sized on the first dropped connection only: the pool's state takes its mutex.
        let mut stale_left: Option<u32> = None;
        loop {
            let mut conn = self.conn(key)?;
            let reused = conn.was_used();
            match f(&mut conn, &self.inner.scripts) {
                Err(e) if reused && is_dropped(&e) && stale_left != Some(0) => {
                    log::info!("lock {key:?}: pooled connection was dropped ({e}), retrying");
                    let left = stale_left.unwrap_or_else(|| self.pool_state().connections + 1);
                    stale_left = Some(left - 1);
                }
                other => return other.map_err(|e| self.command_error(key, e)),
            }
        }
    }
}

/// An error that says the socket is dead (the peer closed or reset it), as opposed to a timeout
/// after which the command may still run.
fn is_dropped(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

/// Settings for [`LockClient`], with documented defaults.
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientBuilder {
    target: TargetSpec,
    pool_size: u32,
    connect_timeout: Duration,
    command_timeout: Option<Duration>,
    courtesy: Duration,
    lazy: bool,
    /// Custom root certificate and client certificate for `rediss://` URLs.
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    tls: Option<redis::TlsCertificates>,
}

#[derive(Debug, Clone)]
enum TargetSpec {
    Single(String),
    Cluster(Vec<String>),
    Sentinel {
        sentinels: Vec<String>,
        service: String,
    },
}

impl TargetSpec {
    /// Where the client connects, for messages: `host:port` (no credentials).
    fn describe(&self) -> String {
        let addr = |url: &str| {
            redis::Client::open(url)
                .map(|c| c.get_connection_info().addr().to_string())
                .unwrap_or_else(|_| "an unparsable URL".to_owned())
        };
        match self {
            TargetSpec::Single(url) => addr(url),
            TargetSpec::Cluster(nodes) => format!(
                "the cluster ({})",
                nodes.iter().map(|n| addr(n)).collect::<Vec<_>>().join(", ")
            ),
            TargetSpec::Sentinel { service, .. } => {
                format!("the master of Sentinel service {service:?}")
            }
        }
    }
}

impl ClientBuilder {
    fn new(target: TargetSpec) -> Self {
        ClientBuilder {
            target,
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: Some(DEFAULT_COMMAND_TIMEOUT),
            courtesy: DEFAULT_HANDOFF_COURTESY,
            lazy: false,
            #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
            tls: None,
        }
    }

    /// Builds the client without connecting: for services that start before their Redis
    /// does. Set-up faults (a wrong password, a missing permission) then show at the first
    /// lock operation instead of in [`build`](Self::build).
    pub fn lazy_connect(mut self) -> Self {
        self.lazy = true;
        self
    }

    /// Certificates for TLS connections (`rediss://` URLs; needs the `tls-rustls` or
    /// `tls-native-tls` feature): `root_cert`, a PEM CA certificate to trust instead of the
    /// system's (or the compiled-in webpki) roots, and `client_tls`, a PEM certificate and key
    /// to present when the server requires client certificates (mutual TLS, `tls-auth-clients
    /// yes`). They apply to every connection of the client: the pool, the pub/sub subscriber,
    /// the Sentinels and the master they name, or every node of a cluster (custom certificates
    /// for a cluster need `tls-rustls`, as in redis-rs). Every URL must then be `rediss://`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let certs = redis::TlsCertificates {
    ///     client_tls: Some(redis::ClientTlsConfig {
    ///         client_cert: std::fs::read("client.crt")?,
    ///         client_key: std::fs::read("client.key")?,
    ///     }),
    ///     root_cert: Some(std::fs::read("ca.crt")?),
    /// };
    /// let client = redis_dlock::LockClient::builder("rediss://redis.internal:6380/")
    ///     .tls_certificates(certs)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    pub fn tls_certificates(mut self, certificates: redis::TlsCertificates) -> Self {
        self.tls = Some(certificates);
        self
    }

    /// A `redis::Client` for `url`, with the custom certificates if any.
    fn open_client(&self, url: &str) -> RedisResult<redis::Client> {
        #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
        if let Some(certs) = &self.tls {
            return redis::Client::build_with_tls(url, certs.clone());
        }
        redis::Client::open(url)
    }

    /// Most connections the pool opens (default [`DEFAULT_POOL_SIZE`]). A thread waiting on a
    /// lock holds no connection while it sleeps, so this bounds concurrent commands, not waiters.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    /// Time allowed to connect, and to wait for a free connection when all are in use
    /// (default [`DEFAULT_CONNECT_TIMEOUT`]). More than zero and at most
    /// [`MAX_CLIENT_TIMEOUT`], or [`build`](Self::build) fails.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Time allowed for one reply from Redis (default [`DEFAULT_COMMAND_TIMEOUT`]); `None` waits
    /// without limit. A connection that timed out is dropped from the pool, never reused.
    /// More than zero and at most [`MAX_CLIENT_TIMEOUT`], or [`build`](Self::build) fails.
    pub fn command_timeout(mut self, d: Option<Duration>) -> Self {
        self.command_timeout = d;
        self
    }

    /// How long a thread of this client that just released a Token or reentrant lock waits
    /// before taking the same lock again with a blocking call (`lock()`, `try_lock_for()`),
    /// when the release's `PUBLISH` reached another client's subscriber (default
    /// [`DEFAULT_HANDOFF_COURTESY`]; zero turns it off; `try_lock()` never waits).
    ///
    /// Why: a waiter woken by pub/sub needs a round trip and two thread wake-ups (its
    /// subscriber's, then its own) before its attempt reaches Redis, while a thread that asks
    /// again right after its release gets there in half a round trip. Without a head start the
    /// releasing client wins nearly every time. Measured on 2 loaded cores with 8 clients in a
    /// tight loop on one key, the share of the least served client relative to the most
    /// served one was 0.01–0.07 without it, 0.15 with 1 ms, 0.3–0.6 with 2–2.5 ms and 0.98 with
    /// 3 ms. The cost: a client that re-locks at once while another client's subscription is
    /// still lingering on the channel (up to 1.5 s after it last waited) waits this long once.
    ///
    /// At most [`MAX_HANDOFF_COURTESY`], or [`build`](Self::build) fails. The wait never runs
    /// past the blocking call's deadline (`try_lock_for`'s duration, the policy's `max_wait`,
    /// or for a count-limited policy the longest its retries could take).
    pub fn handoff_courtesy(mut self, d: Duration) -> Self {
        self.courtesy = d;
        self
    }

    /// Creates the pool and checks the deployment, so that set-up faults fail here, fast, and
    /// say what is wrong: it opens one connection (AUTH, SELECT and the TLS handshake, as the
    /// URL asks) and runs a one-line script by `EVAL` and by `EVALSHA` (the release and extend
    /// scripts need both). A wrong password or unknown ACL user, a database the server lacks,
    /// a user without scripting permission, an unreachable server (within the connect
    /// timeout, saying refused or timed out) are each a [`LockError::Setup`] naming the server
    /// and the step, returned one reply after the server's answer. That connection is then
    /// closed; the pool opens its own on demand. With [`lazy_connect`](Self::lazy_connect)
    /// nothing is sent: a Redis that is down now is reported by the first lock operation, and
    /// the client starts working when Redis comes up.
    ///
    /// At lock time, a connection that cannot be opened because access is denied is reported
    /// as [`LockError::Setup`] too (after the connect timeout, never as contention or a
    /// timeout), and a command without a reply as [`LockError::Connection`] whose cause reads
    /// "no reply from host:port within 2 s".
    pub fn build(self) -> Result<LockClient> {
        let setup = |e: Box<dyn std::error::Error + Send + Sync>| LockError::Setup { source: e };
        if self.pool_size == 0 {
            return Err(setup("pool size must be at least 1".into()));
        }
        if self.connect_timeout.is_zero() || self.command_timeout.is_some_and(|d| d.is_zero()) {
            return Err(setup("timeouts must be greater than zero".into()));
        }
        if self.connect_timeout > MAX_CLIENT_TIMEOUT
            || self.command_timeout.is_some_and(|d| d > MAX_CLIENT_TIMEOUT)
        {
            return Err(setup(
                format!(
                    "timeouts must be at most MAX_CLIENT_TIMEOUT ({MAX_CLIENT_TIMEOUT:?}); \
                     command_timeout(None) waits without limit"
                )
                .into(),
            ));
        }
        if self.courtesy > MAX_HANDOFF_COURTESY {
            return Err(setup(
                format!(
                    "handoff courtesy {:?} is longer than MAX_HANDOFF_COURTESY ({:?})",
                    self.courtesy, MAX_HANDOFF_COURTESY
                )
                .into(),
            ));
        }
        let timeout = self.command_timeout.unwrap_or(self.connect_timeout);
        let (connect_timeout, cluster) = (
            self.connect_timeout,
            matches!(self.target, TargetSpec::Cluster(_)),
        );
        let urls: Vec<&str> = match &self.target {
            TargetSpec::Single(url) => vec![url.as_str()],
            TargetSpec::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
            TargetSpec::Sentinel { sentinels, .. } => {
                sentinels.iter().map(String::as_str).collect()
            }
        };
        if let Some(url) = urls.iter().find(|u| u.starts_with("rediss://")) {
            if !cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")) {
                return Err(setup(
                    format!(
                        "{url}: a rediss:// (TLS) URL needs one of redis-dlock's cargo features \
                         `tls-rustls`, `tls-rustls-webpki-roots` or `tls-native-tls`"
                    )
                    .into(),
                ));
            }
        }
        let addr = self.target.describe();
        let resolve: Option<Resolve>;
        let mut switches = None;
        let mut watch = None;
        let target = match &self.target {
            TargetSpec::Single(url) => {
                let client = self.open_client(url).map_err(|e| setup(Box::new(e)))?;
                let info = client.get_connection_info().clone();
                resolve = Some(Box::new(move || Ok(info.clone())));
                Target::Single(client)
            }
            TargetSpec::Cluster(nodes) => {
                // PUBLISH reaches every node of a cluster: any node serves as the subscriber.
                let infos = nodes
                    .iter()
                    .map(|n| self.open_client(n).map(|c| c.get_connection_info().clone()))
                    .collect::<RedisResult<Vec<_>>>()
                    .map_err(|e| setup(Box::new(e)))?;
                let next = AtomicUsize::new(0);
                resolve = Some(Box::new(move || {
                    let i = next.fetch_add(1, Ordering::Relaxed) % infos.len().max(1);
                    infos.get(i).cloned().ok_or_else(|| {
                        redis::RedisError::from((redis::ErrorKind::Client, "no cluster node"))
                    })
                }));
                let (retries, min_wait, max_wait) = cluster_retries(timeout);
                let mut b = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(self.connect_timeout)
                    .retries(retries)
                    .min_retry_wait(min_wait)
                    .max_retry_wait(max_wait)
                    .retry_wait_formula(min_wait, 2);
                #[cfg(feature = "tls-rustls")]
                if let Some(certs) = &self.tls {
                    b = b.certs(certs.clone());
                }
                #[cfg(all(feature = "tls-native-tls", not(feature = "tls-rustls")))]
                if self.tls.is_some() {
                    return Err(setup(
                        "custom TLS certificates for a cluster need the `tls-rustls` feature \
                         (redis-rs's cluster client takes them only with rustls)"
                            .into(),
                    ));
                }
                if let Some(t) = self.command_timeout {
                    b = b.response_timeout(t);
                }
                Target::Cluster(b.build().map_err(|e| setup(Box::new(e)))?)
            }
            TargetSpec::Sentinel { sentinels, service } => {
                if sentinels.is_empty() {
                    return Err(setup("at least one Sentinel address is required".into()));
                }
                let sentinels = sentinels
                    .iter()
                    .map(|url| self.open_client(url))
                    .collect::<RedisResult<Vec<_>>>()
                    .map_err(|e| setup(Box::new(e)))?;
                // The master is reached as the Sentinels are: over TLS, with the same
                // certificates, when their URLs are `rediss://`.
                let master_tls = sentinels
                    .first()
                    .map(|s| s.get_connection_info().addr().clone())
                    .filter(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
                // The subscriber follows the current master too (PUBLISH on a master reaches
                // its replicas' subscribers as well, so a stale answer still hears releases).
                let (asked, svc, tls) = (sentinels.clone(), service.clone(), master_tls.clone());
                resolve = Some(Box::new(move || {
                    let addr = sentinel_master_addr(&asked, &svc, connect_timeout, timeout)?;
                    master_info(tls.as_ref(), addr)
                }));
                let found = Arc::new(Switches::default());
                watch = Some(sentinel_watch::Watch {
                    sentinels: sentinels.clone(),
                    service: service.clone(),
                    connect_timeout,
                    timeout,
                });
                switches = Some(Arc::clone(&found));
                Target::Sentinel {
                    sentinels,
                    service: service.clone(),
                    first: AtomicUsize::new(0),
                    switches: found,
                    master_tls,
                }
            }
        };
        let manager = Manager {
            target,
            connect_timeout: self.connect_timeout,
            command_timeout: self.command_timeout,
            tls: urls.iter().any(|u| u.starts_with("rediss://")),
        };
        // The pool's own scheduler, shut down with the pool: r2d2's default keeps its threads
        // until the next idle-connection sweep (up to 30 s after the client is dropped).
        let scheduler = scheduled_thread_pool::ScheduledThreadPool::builder()
            .num_threads(SCHEDULER_THREADS)
            .thread_name_pattern("redis-dlock-pool-{}")
            .on_drop_behavior(scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled)
            .build();
        if !self.lazy {
            manager.check(&addr)?;
        }
        let connect_errors = Arc::new(ConnectErrors::default());
        let pool = r2d2::Pool::builder()
            .thread_pool(Arc::new(scheduler))
            .error_handler(Box::new(SharedErrors(Arc::clone(&connect_errors))))
            .max_size(self.pool_size)
            .min_idle(Some(0))
            // A checkout PING would double every lock operation's cost; broken connections mark
            // themselves (see `Conn`) and are replaced instead.
            .test_on_check_out(false)
            .connection_timeout(self.connect_timeout)
            .build_unchecked(manager);
        let client = LockClient::with_pool(
            Pool::Managed(pool),
            resolve,
            cluster,
            timeout,
            self.courtesy,
            (addr, connect_errors),
            switches,
        );
        if let Some(watch) = watch {
            sentinel_watch::start(watch, &client);
        }
        Ok(client)
    }
}

/// Retries of redis-rs's cluster connection for a command timeout `t`: the number of retries
/// and the bounds of the sleep before a retry after `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`,
/// `LOADING` or `READONLY` (in ms).
///
/// redis-rs sleeps a random time in `[min, min(max, min · 2^retry))` before retry number
/// `retry` (1, 2, …). With `min = t/40` and `max = t/10` (at least 1 and 2 ms) the five sleeps
/// of a command add up to less than `18 · t/40 = 0.45 t`, where redis-rs's defaults (16
/// retries, 1.28 s to 655 s each) add up to minutes. Redirections (`MOVED`, `ASK`) need no
/// sleep; five retries cover a `MOVED` and an `ASK` of a slot in migration with room to spare.
/// The whole command, redirections and retries included, is bounded by its deadline (see
/// [`crate::client::cluster_deadline`]); the short sleeps make it return at most one sleep (`t/10`)
/// after it.
pub(crate) fn cluster_retries(t: Duration) -> (u32, u64, u64) {
    let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
    let min = (ms / 40).max(1);
    let max = (ms / 10).max(min + 1);
    (5, min, max)
}

/// How to reach the master at `addr` that a Sentinel named: over TLS like `tls` (a Sentinel's
/// `rediss://` address, whose certificates and `insecure` flag are reused), or in plain TCP.
fn master_info(
    tls: Option<&ConnectionAddr>,
    (host, port): (String, u16),
) -> RedisResult<ConnectionInfo> {
    match tls {
        Some(ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        }) => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        }
        .into_connection_info(),
        _ => ConnectionAddr::Tcp(host, port).into_connection_info(),
    }
}

/// Asks each Sentinel in turn for `service`'s master address; each step bounded by the
/// timeouts.
fn sentinel_master_addr(
    sentinels: &[redis::Client],
    service: &str,
    connect_timeout: Duration,
    timeout: Duration,
) -> RedisResult<(String, u16)> {
    let mut last_err = None;
    for sentinel in sentinels {
        let named: RedisResult<Option<(String, u16)>> = sentinel
            .get_connection_with_timeout(connect_timeout)
            .and_then(|con| {
                con.set_read_timeout(Some(timeout))?;
                con.set_write_timeout(Some(timeout))?;
                Ok(con)
            })
            .and_then(|mut con| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(service)
                    .query(&mut con)
            });
        match named {
            Ok(Some(addr)) => return Ok(addr),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "no Sentinel named a master for the service",
        ))
    }))
}

/// Where connections go.
enum Target {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
    /// Sentinels asked for the current master of `service` on every new connection. Not
    /// `redis::sentinel::SentinelClient`: its blocking lookup sets no read timeout on the
    /// Sentinel connections nor on its `ROLE` check of the master, so one frozen server hung
    /// every later reconnection of the pool for good.
    Sentinel {
        sentinels: Vec<redis::Client>,
        service: String,
        /// The Sentinel that answered last, asked first next time (the Sentinel clients
        /// guideline), so a dead or frozen one costs one timeout, not one per connection.
        first: AtomicUsize,
        /// The master switches announced by the Sentinels (`+switch-master`).
        switches: Arc<Switches>,
        /// A Sentinel's TLS address when they are reached over TLS: the master is too.
        master_tls: Option<ConnectionAddr>,
    },
}

/// r2d2 manager that sets connect and command timeouts (which `redis::Client`'s own does not)
/// and drops connections that marked themselves broken.
pub(crate) struct Manager {
    target: Target,
    connect_timeout: Duration,
    command_timeout: Option<Duration>,
    /// Connects with TLS (`rediss://`): connection errors may be the handshake's.
    tls: bool,
}

impl Manager {
    fn single(&self, client: &redis::Client) -> RedisResult<Link> {
        let con = client.get_connection_with_timeout(self.connect_timeout)?;
        con.set_read_timeout(self.command_timeout)?;
        con.set_write_timeout(self.command_timeout)?;
        Ok(Link::new(Node::Single(con)))
    }

    /// A connection for the discovery steps of [`Target::Sentinel`]: never without a timeout.
    fn discovery(&self, client: &redis::Client) -> RedisResult<redis::Connection> {
        let timeout = Some(self.command_timeout.unwrap_or(self.connect_timeout));
        let con = client.get_connection_with_timeout(self.connect_timeout)?;
        con.set_read_timeout(timeout)?;
        con.set_write_timeout(timeout)?;
        Ok(con)
    }

    /// Asks each Sentinel in turn for `service`'s master and connects to the first one named
    /// that answers `ROLE` as a master. An address is tried once per call even if several
    /// Sentinels name it, so a frozen old master costs one timeout, not one per Sentinel.
    ///
    /// The master the last `+switch-master` announced, if any, is tried first: a Sentinel that
    /// has not heard of the switch yet would still name the old master, which answers `ROLE` as
    /// a master until Sentinel reconfigures it.
    fn sentinel_master(
        &self,
        sentinels: &[redis::Client],
        service: &str,
        first: &AtomicUsize,
        switches: &Switches,
        master_tls: Option<&ConnectionAddr>,
    ) -> RedisResult<Link> {
        // Read before asking: a switch during this connect makes the link stale at once.
        let generation = switches.generation();
        let mut tried: Vec<(String, u16)> = Vec::new();
        let mut last_err = None;
        if let Some(addr) = switches.announced() {
            tried.push(addr.clone());
            match self.checked_master(addr, master_tls) {
                Ok(link) => return Ok(link.of_generation(generation)),
                Err(e) => last_err = Some(e),
            }
        }
        let start = first.load(Ordering::Relaxed);
        for i in (0..sentinels.len()).map(|k| (start + k) % sentinels.len()) {
            let sentinel = &sentinels[i];
            let named: RedisResult<Option<(String, u16)>> =
                self.discovery(sentinel).and_then(|mut con| {
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(service)
                        .query(&mut con)
                });
            let addr = match named {
                Ok(Some(addr)) => addr,
                Ok(None) => {
                    last_err = Some(redis::RedisError::from((
                        redis::ErrorKind::MasterNameNotFoundBySentinel,
                        "the Sentinel does not know the service",
                        service.to_owned(),
                    )));
                    continue;
                }
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            if tried.contains(&addr) {
                continue;
            }
            tried.push(addr.clone());
            match self.checked_master(addr, master_tls) {
                Ok(link) => {
                    first.store(i, Ordering::Relaxed);
                    return Ok(link.of_generation(generation));
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::EmptySentinelList, "no Sentinel to ask"))
        }))
    }
}

impl Manager {
    /// The check of [`ClientBuilder::build`]: opens one connection (which sends AUTH, SELECT
    /// and the TLS handshake as the URL asks) and runs a one-line script by `EVAL` and by
    /// `EVALSHA`, the two ways the library runs its scripts. Any failure is a
    /// [`LockError::Setup`] that names the step and the server.
    fn check(&self, addr: &str) -> Result<()> {
        let setup = |what: String, e: redis::RedisError| LockError::Setup {
            source: Box::new(Context::new(what, Some(e))),
        };
        let mut con = r2d2::ManageConnection::connect(self).map_err(|e| {
            let what = if error::is_access_denied(&e) {
                format!("authentication to {addr} failed (check the user name and password)")
            } else if e.to_string().contains("DB index") {
                format!("{addr} has no such database (the URL's /db number)")
            } else if e.is_timeout() {
                format!(
                    "no answer from {addr} within {} (connect timeout)",
                    Rounded(self.connect_timeout)
                )
            } else if e.kind() == redis::ErrorKind::Io
                && e.to_string().to_ascii_lowercase().contains("refused")
            {
                format!("connection to {addr} refused (is Redis running there?)")
            } else {
                format!("cannot connect to {addr}")
            };
            setup(what, e)
        })?;
        let probe = redis::Script::new("return 1");
        let scripting = |e: redis::RedisError, cmd: &str| {
            let why = if e.code() == Some("NOAUTH") {
                "the server requires authentication (NOAUTH): give the user and password in \
                 the URL"
            } else if error::is_access_denied(&e) {
                "the user may not run it (NOPERM); the locks' release and extend need EVAL and \
                 EVALSHA (ACL category @scripting)"
            } else {
                "the server refused it (renamed or disabled command?); the locks' release and \
                 extend need EVAL and EVALSHA"
            };
            setup(format!("{cmd} on {addr}: {why}"), e)
        };
        let _: i64 = redis::cmd("EVAL")
            .arg("return 1")
            .arg(0)
            .query(&mut con)
            .map_err(|e| scripting(e, "EVAL"))?;
        // NOSCRIPT also proves that EVALSHA exists and is allowed (on a cluster the EVAL above
        // may have gone to another node).
        match redis::cmd("EVALSHA")
            .arg(probe.get_hash())
            .arg(0)
            .query::<i64>(&mut con)
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                Ok(())
            }
            Err(e) => Err(scripting(e, "EVALSHA")),
        }
    }

    /// A connection to `addr` once `ROLE` says it is a master.
    fn checked_master(
        &self,
        addr: (String, u16),
        master_tls: Option<&ConnectionAddr>,
    ) -> RedisResult<Link> {
        let client = master_info(master_tls, addr.clone()).and_then(redis::Client::open)?;
        let mut con = self.discovery(&client)?;
        let role: redis::Role = redis::cmd("ROLE").query(&mut con)?;
        if !matches!(role, redis::Role::Primary { .. }) {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the server the Sentinel named is not a master (failover under way?)",
                format!("{}:{}", addr.0, addr.1),
            )));
        }
        con.set_read_timeout(self.command_timeout)?;
        con.set_write_timeout(self.command_timeout)?;
        Ok(Link::new(Node::Single(con)))
    }

    /// The generation a link must have to be used: that of the last master switch heard of.
    fn generation(&self) -> u64 {
        match &self.target {
            Target::Sentinel { switches, .. } => switches.generation(),
            _ => 0,
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Link;
    type Error = redis::RedisError;

    fn connect(&self) -> RedisResult<Link> {
        let link = match &self.target {
            Target::Single(client) => self.single(client),
            // `get_generic_connection` is redis-rs's (hidden) way to give a cluster connection
            // node connections of our own type.
            Target::Cluster(client) => Ok(Link::new(Node::Cluster(
                Box::new(client.get_generic_connection::<Deadlined>()?),
                self.command_timeout,
            ))),
            // Ask the Sentinels for the current master each time: after a failover the next
            // connection goes to the new one.
            Target::Sentinel {
                sentinels,
                service,
                first,
                switches,
                master_tls,
            } => self.sentinel_master(sentinels, service, first, switches, master_tls.as_ref()),
        };
        match link {
            Err(e) if self.tls => Err(tls_context(e)),
            other => other,
        }
    }

    fn is_valid(&self, con: &mut Link) -> RedisResult<()> {
        redis::cmd("PING").query(con)
    }

    fn has_broken(&self, con: &mut Link) -> bool {
        con.broken || !con.node.is_open() || con.generation < self.generation()
    }
}

/// Says "TLS" in a connection error that is the TLS handshake's: an I/O failure that is not a
/// refusal, a timeout or a closed socket (rustls reports "invalid peer certificate:
/// UnknownIssuer", native-tls OpenSSL's "certificate verify failed"; neither names TLS).
pub(crate) fn tls_context(e: redis::RedisError) -> redis::RedisError {
    if e.kind() == redis::ErrorKind::Io
        && !e.is_connection_refusal()
        && !e.is_timeout()
        && !e.is_connection_dropped()
    {
        redis::RedisError::from((
            redis::ErrorKind::Io,
            "TLS handshake failed (check the CA certificate, the server name and the client \
             certificate)",
            e.to_string(),
        ))
    } else {
        e
    }
}

/// A connection of the managed pool: one server's or a cluster's.
pub(crate) struct Link {
    node: Node,
    broken: bool,
    /// Has carried a command: such a connection may have gone stale while idle in the pool.
    used: bool,
    /// Sentinel clients: the master-switch generation the link was opened in (0 otherwise).
    generation: u64,
}

enum Node {
    Single(redis::Connection),
    /// Boxed: a cluster connection is four times the size of a single one. Its node
    /// connections keep to each command's deadline (see [`crate::client::cluster_deadline`]).
    /// The second field is the command timeout: each command's deadline.
    Cluster(
        Box<redis::cluster::ClusterConnection<Deadlined>>,
        Option<Duration>,
    ),
}

impl Node {
    fn as_dyn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Node::Single(c) => c,
            Node::Cluster(c, _) => c.as_mut(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Node::Single(c) => c.is_open(),
            Node::Cluster(c, _) => c.is_open(),
        }
    }
}

impl Link {
    fn new(node: Node) -> Self {
        Link {
            node,
            broken: false,
            used: false,
            generation: 0,
        }
    }

    fn of_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// Marks the connection for replacement after an error that leaves it unusable or pointed
    /// at the wrong server: I/O failure or timeout (a late reply could still arrive), or
    /// `READONLY` (the server is a replica now, after a failover).
    fn note<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        self.used = true;
        if let Err(e) = &result {
            if e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_unrecoverable_error()
                || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            {
                self.broken = true;
            }
        }
        result
    }
}

impl ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        let r = match &mut self.node {
            Node::Single(c) => c.req_packed_command(cmd),
            Node::Cluster(c, t) => with_deadline(*t, || c.req_packed_command(cmd)),
        };
        self.note(r)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let r = match &mut self.node {
            Node::Single(c) => c.req_packed_commands(cmd, offset, count),
            Node::Cluster(c, t) => with_deadline(*t, || c.req_packed_commands(cmd, offset, count)),
        };
        self.note(r)
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let r = match &mut self.node {
            Node::Single(c) => c.req_command(cmd),
            Node::Cluster(c, t) => with_deadline(*t, || c.req_command(cmd)),
        };
        self.note(r)
    }

    fn get_db(&self) -> i64 {
        match &self.node {
            Node::Single(c) => c.get_db(),
            Node::Cluster(c, _) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        self.node.as_dyn().check_connection()
    }

    fn is_open(&self) -> bool {
        !self.broken && self.node.is_open()
    }
}

pub(crate) enum Pool {
    Managed(r2d2::Pool<Manager>),
    External(r2d2::Pool<redis::Client>),
}

/// A pooled connection from either kind of pool.
pub(crate) enum Conn {
    Managed(r2d2::PooledConnection<Manager>),
    External(r2d2::PooledConnection<redis::Client>),
}

impl Conn {
    /// True if the connection carried commands before this checkout. Connections of an
    /// application's own pool are not tracked: they count as fresh, so never retried.
    fn was_used(&self) -> bool {
        match self {
            Conn::Managed(c) => c.used,
            Conn::External(_) => false,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match self {
            Conn::Managed(c) => c.req_packed_command(cmd),
            Conn::External(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Managed(c) => c.req_packed_commands(cmd, offset, count),
            Conn::External(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        match self {
            Conn::Managed(c) => c.req_command(cmd),
            Conn::External(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(c) => c.get_db(),
            Conn::External(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Conn::Managed(c) => c.check_connection(),
            Conn::External(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Managed(c) => c.is_open(),
            Conn::External(c) => c.is_open(),
        }
    }
}
