//! [`LockClient`]: the connection pool and shared state that locks are built from.
//!
//! One client talks to one deployment: a single server, a Redis Cluster, or the master that
//! Sentinel names. Its pool hands out [`Conn`]s; a connection that saw an I/O error, a timeout
//! or a `READONLY` reply (a master demoted by a failover) marks itself broken and is replaced,
//! so a client recovers from restarts and failovers without being rebuilt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::{
    ConnectionAddr, ConnectionInfo, ConnectionLike, IntoConnectionInfo, RedisResult, Value,
};

use crate::error::{LockError, Result};
use crate::scripts::Scripts;
use crate::strategy::LockBuilder;
use crate::waiters::WaitQueues;
use crate::wakeup::{Resolve, Wakeups};
use crate::watchdog::Watchdog;

/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: u32 = 16;
/// Default time allowed to open a connection (and to wait for a free pooled one).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for Redis to answer one command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Default head start a releasing client gives other clients' waiters: see
/// [`ClientBuilder::handoff_courtesy`].
pub const DEFAULT_HANDOFF_COURTESY: Duration = Duration::from_millis(3);

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
    pub fn cluster_builder<S: AsRef<str>>(nodes: &[S]) -> ClientBuilder {
        ClientBuilder::new(TargetSpec::Cluster(
            nodes.iter().map(|n| n.as_ref().to_owned()).collect(),
        ))
    }

    /// A builder for the master that the Sentinels at `sentinels` name for `service`. After a
    /// failover, new connections go to the new master; connections to the old one are dropped
    /// on their first `READONLY` or I/O error.
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
        )
    }

    fn with_pool(
        pool: Pool,
        resolve: Option<Resolve>,
        cluster: bool,
        timeout: Duration,
        courtesy: Duration,
    ) -> Self {
        let waiters = Arc::new(WaitQueues::default());
        LockClient {
            inner: Arc::new(Inner {
                pool,
                scripts: Scripts::new(),
                wakeups: Wakeups::new(resolve, Arc::clone(&waiters), timeout),
                waiters,
                instance: crate::owner::new_uuid(),
                watchdog: Watchdog::new(),
                cluster,
                courtesy,
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
    fn conn(&self, key: &str) -> Result<Conn> {
        let got = match &self.inner.pool {
            Pool::Managed(p) => p.get().map(Conn::Managed),
            Pool::External(p) => p.get().map(Conn::External),
        };
        got.map_err(|e| LockError::Connection {
            key: key.to_owned(),
            source: Box::new(e),
        })
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
    /// expires with the lease) and a repeated release gives back one too many. With a restart,
    /// the common cause of a dropped pooled connection, the first send never reached a server.
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
                other => return other.map_err(|e| LockError::from_redis(key, e)),
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

impl ClientBuilder {
    fn new(target: TargetSpec) -> Self {
        ClientBuilder {
            target,
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: Some(DEFAULT_COMMAND_TIMEOUT),
            courtesy: DEFAULT_HANDOFF_COURTESY,
            #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
            tls: None,
        }
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
    /// (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Time allowed for one reply from Redis (default [`DEFAULT_COMMAND_TIMEOUT`]); `None` waits
    /// without limit. A connection that timed out is dropped from the pool, never reused.
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
    pub fn handoff_courtesy(mut self, d: Duration) -> Self {
        self.courtesy = d;
        self
    }

    /// Creates the pool. It connects lazily: a Redis that is down now is reported by the first
    /// lock operation, and the client starts working when Redis comes up.
    pub fn build(self) -> Result<LockClient> {
        let setup = |e: Box<dyn std::error::Error + Send + Sync>| LockError::Setup { source: e };
        if self.pool_size == 0 {
            return Err(setup("pool size must be at least 1".into()));
        }
        if self.connect_timeout.is_zero() || self.command_timeout.is_some_and(|d| d.is_zero()) {
            return Err(setup("timeouts must be greater than zero".into()));
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
        let resolve: Option<Resolve>;
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
                let mut b = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(self.connect_timeout);
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
                Target::Sentinel {
                    sentinels,
                    service: service.clone(),
                    first: AtomicUsize::new(0),
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
        let pool = r2d2::Pool::builder()
            .max_size(self.pool_size)
            .min_idle(Some(0))
            // A checkout PING would double every lock operation's cost; broken connections mark
            // themselves (see `Conn`) and are replaced instead.
            .test_on_check_out(false)
            .connection_timeout(self.connect_timeout)
            .build_unchecked(manager);
        Ok(LockClient::with_pool(
            Pool::Managed(pool),
            resolve,
            cluster,
            timeout,
            self.courtesy,
        ))
    }
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
    fn sentinel_master(
        &self,
        sentinels: &[redis::Client],
        service: &str,
        first: &AtomicUsize,
        master_tls: Option<&ConnectionAddr>,
    ) -> RedisResult<Link> {
        let mut tried: Vec<(String, u16)> = Vec::new();
        let mut last_err = None;
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
            let master = master_info(master_tls, addr.clone())
                .and_then(redis::Client::open)
                .and_then(|client| {
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
                });
            match master {
                Ok(link) => {
                    first.store(i, Ordering::Relaxed);
                    return Ok(link);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::EmptySentinelList, "no Sentinel to ask"))
        }))
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Link;
    type Error = redis::RedisError;

    fn connect(&self) -> RedisResult<Link> {
        let link = match &self.target {
            Target::Single(client) => self.single(client),
            Target::Cluster(client) => {
                Ok(Link::new(Node::Cluster(Box::new(client.get_connection()?))))
            }
            // Ask the Sentinels for the current master each time: after a failover the next
            // connection goes to the new one.
            Target::Sentinel {
                sentinels,
                service,
                first,
                master_tls,
            } => self.sentinel_master(sentinels, service, first, master_tls.as_ref()),
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
        con.broken || !con.node.is_open()
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
}

enum Node {
    Single(redis::Connection),
    /// Boxed: a cluster connection is four times the size of a single one.
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Node {
    fn as_dyn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Node::Single(c) => c,
            Node::Cluster(c) => c.as_mut(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Node::Single(c) => c.is_open(),
            Node::Cluster(c) => c.is_open(),
        }
    }
}

impl Link {
    fn new(node: Node) -> Self {
        Link {
            node,
            broken: false,
            used: false,
        }
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
        let r = self.node.as_dyn().req_packed_command(cmd);
        self.note(r)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let r = self.node.as_dyn().req_packed_commands(cmd, offset, count);
        self.note(r)
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let r = self.node.as_dyn().req_command(cmd);
        self.note(r)
    }

    fn get_db(&self) -> i64 {
        match &self.node {
            Node::Single(c) => c.get_db(),
            Node::Cluster(c) => c.get_db(),
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
