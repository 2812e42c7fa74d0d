//! [`ClientBuilder`]: what a [`LockClient`] connects to (a URL, Sentinels or Cluster seeds,
//! TLS certificates) and its pool and timeout settings, checked when the client is built.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, RedisResult};

use super::confirm::{Acks, ReplicaAcks};
use super::native::Detected;
#[cfg(feature = "sentinel")]
use super::pool::Sentinels;
use super::pool::{unreaped, Lazy, Manager, Pool, Target};
#[cfg(feature = "cluster")]
use super::pool::{CLUSTER_TRIES, SETUP_REPLIES};
#[cfg(feature = "sentinel")]
use super::sentinel_watch;
use super::subscriber::Resolve;
use super::target::ConnectionTarget;
use super::{LockClient, MAX_CLIENT_TIMEOUT};
use crate::error::{LockError, Result};

/// Builder methods that set the field of their name to their argument.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $t:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, value: $t) -> Self {
            self.$name = value;
            self
        }
    )*};
}

/// Settings for [`LockClient`], with documented defaults.
#[derive(Clone)]
#[must_use]
pub struct ClientBuilder {
    target: TargetSpec,
    /// The server, the seeds or the Sentinels; a malformed URL is reported by `build`.
    nodes: RedisResult<Vec<redis::ConnectionInfo>>,
    pool_size: u32,
    connect_timeout: Duration,
    command_timeout: Option<Duration>,
    handoff_courtesy: Duration,
    lazy: bool,
    replica_acks: ReplicaAcks,
    replica_ack_timeout: Duration,
    /// Custom root certificate and client certificate for `rediss://` URLs.
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    tls: Option<redis::TlsCertificates>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target as `host:port` only: a URL or connection info may carry a password.
        f.debug_struct("ClientBuilder")
            .field("target", &self.describe())
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("handoff_courtesy", &self.handoff_courtesy)
            .field("lazy_connect", &self.lazy)
            .finish_non_exhaustive()
    }
}

/// The facade's ways in: a client is built from its target.
impl LockClient {
    /// Connects to one Redis server with the default pool settings: a URL
    /// (`redis://[user:password@]host:port/db`, `rediss://…`, `unix:///path`), or anything
    /// else redis-rs's `IntoConnectionInfo` takes, such as a [`redis::ConnectionInfo`] built in
    /// code ([`ConnectionTarget`] lists them).
    ///
    /// ```no_run
    /// use redis_dlock::LockClient;
    /// use redis_dlock::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = LockClient::open("redis://127.0.0.1:6379/")?;
    /// let url: String = std::env::var("REDIS_URL")?;
    /// let client = LockClient::open(&url)?;
    /// let client = LockClient::open(url)?;
    /// // Settings built in code: the password need not be written into a URL.
    /// let info: ConnectionInfo = ConnectionAddr::Tcp("10.0.0.7".into(), 6379)
    ///     .into_connection_info()?;
    /// let settings = info.redis_settings().clone().set_password("s3cret");
    /// let client = LockClient::open(info.set_redis_settings(settings))?;
    /// # Ok(()) }
    /// ```
    pub fn open(target: impl ConnectionTarget) -> Result<Self> {
        Self::builder(target).build()
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
        let courtesy = ClientBuilder::DEFAULT_HANDOFF_COURTESY;
        Self::with_pool(
            Pool::External(pool),
            None,
            None,
            courtesy,
            Detected::default(),
        )
    }

    /// A builder for one server, to tune the pool and timeouts; `target` as for
    /// [`open`](Self::open). A malformed URL is reported by [`ClientBuilder::build`].
    pub fn builder(target: impl ConnectionTarget) -> ClientBuilder {
        ClientBuilder::new(
            TargetSpec::Single,
            target.into_target_info().map(|i| vec![i]),
        )
    }

    #[cfg(feature = "cluster")]
    /// A builder for a Redis Cluster reached through any of `nodes` (`redis://host:port`, or
    /// any other [`ConnectionTarget`]; a malformed URL is reported by
    /// [`ClientBuilder::build`]). Commands follow `MOVED`/`ASK` redirections; every key of one lock lives in one slot.
    /// Needs the cargo feature `cluster`.
    ///
    /// Each command, its redirections and retries included (`TRYAGAIN`, `CLUSTERDOWN`, a
    /// failed-over node), returns within the command timeout plus the retry sleeps (less than
    /// a sixth of it): redis-rs's cluster client tries it at most three times, each try waiting a third
    /// of the command timeout for its reply. A node connection redis-rs opens meanwhile is
    /// bounded by a fourth of the connect timeout. A command that fails on an I/O error or a
    /// timeout replaces its pooled cluster connection before it returns (seeds tried for at
    /// most half the connect timeout). See `docs/deployments.md`.
    pub fn cluster_builder<S: ConnectionTarget + Clone>(nodes: &[S]) -> ClientBuilder {
        ClientBuilder::new(TargetSpec::Cluster, targets(nodes))
    }

    #[cfg(feature = "sentinel")]
    /// A builder for the master that the Sentinels at `sentinels` (URLs, or any other
    /// [`ConnectionTarget`]) name for `service`. After a
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
    ///
    /// Needs the cargo feature `sentinel`.
    pub fn sentinel_builder<S: ConnectionTarget + Clone>(
        sentinels: &[S],
        service: &str,
    ) -> ClientBuilder {
        ClientBuilder::new(TargetSpec::Sentinel(service.to_owned()), targets(sentinels))
    }
}

#[cfg(any(feature = "cluster", feature = "sentinel"))]
/// The connection settings of every node, or the first that is not one.
fn targets<S: ConnectionTarget + Clone>(nodes: &[S]) -> RedisResult<Vec<redis::ConnectionInfo>> {
    nodes.iter().map(|n| n.clone().into_target_info()).collect()
}

/// What a client connects to through its nodes: one server, a Cluster, or the master that
/// the Sentinels name for a service.
#[derive(Debug, Clone)]
pub(super) enum TargetSpec {
    Single,
    #[cfg(feature = "cluster")]
    Cluster,
    #[cfg(feature = "sentinel")]
    Sentinel(String),
}

impl ClientBuilder {
    /// Default number of pooled connections ([`pool_size`](Self::pool_size)): 16.
    pub const DEFAULT_POOL_SIZE: u32 = 16;
    /// Default time to open a connection ([`connect_timeout`](Self::connect_timeout)): 2 s.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default time allowed for one reply ([`command_timeout`](Self::command_timeout)): 2 s.
    pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
    /// The longest connect or command timeout [`build`](Self::build) accepts (one year; no
    /// command timeout at all is `command_timeout(None)`): longer values overflow deadline
    /// arithmetic on some platforms' clocks and mean "never" in practice.
    pub const MAX_TIMEOUT: Duration = MAX_CLIENT_TIMEOUT;
    /// Default bound of a replica confirmation
    /// ([`replica_ack_timeout`](Self::replica_ack_timeout)): 1 s, as Redisson's
    /// `slavesSyncTimeout`.
    pub const DEFAULT_REPLICA_ACK_TIMEOUT: Duration = Duration::from_secs(1);
    /// Default pause before a thread takes again a lock its client just released while
    /// another client waits ([`handoff_courtesy`](Self::handoff_courtesy)): 3 ms.
    pub const DEFAULT_HANDOFF_COURTESY: Duration = Duration::from_millis(3);
    /// The longest handoff courtesy [`build`](Self::build) accepts: 1 s.
    pub const MAX_HANDOFF_COURTESY: Duration = Duration::from_secs(1);

    pub(super) fn new(target: TargetSpec, nodes: RedisResult<Vec<redis::ConnectionInfo>>) -> Self {
        ClientBuilder {
            target,
            nodes,
            pool_size: Self::DEFAULT_POOL_SIZE,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            command_timeout: Some(Self::DEFAULT_COMMAND_TIMEOUT),
            handoff_courtesy: Self::DEFAULT_HANDOFF_COURTESY,
            lazy: false,
            replica_acks: ReplicaAcks::Auto,
            replica_ack_timeout: Self::DEFAULT_REPLICA_ACK_TIMEOUT,
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

    /// Where the client connects, for messages: `host:port` (no credentials).
    fn describe(&self) -> String {
        let addrs = |nodes: &[redis::ConnectionInfo]| {
            let addrs = nodes.iter().map(|n| n.addr().to_string());
            addrs.collect::<Vec<_>>().join(", ")
        };
        match (&self.target, &self.nodes) {
            #[cfg(feature = "sentinel")]
            (TargetSpec::Sentinel(service), _) => {
                format!("the master of Sentinel service {service:?}")
            }
            (_, Err(_)) => "an unparsable URL".to_owned(),
            #[cfg(feature = "cluster")]
            (TargetSpec::Cluster, Ok(nodes)) => format!("the cluster ({})", addrs(nodes)),
            (_, Ok(nodes)) => addrs(nodes),
        }
    }

    setters! {
        /// Most connections the pool opens (default [`ClientBuilder::DEFAULT_POOL_SIZE`](crate::ClientBuilder::DEFAULT_POOL_SIZE)). A thread waiting on a
        /// lock holds no connection while it sleeps, so this bounds concurrent commands, not waiters.
        pool_size: u32;

        /// Time allowed to connect, and to wait for a free connection when all are in use
        /// (default [`ClientBuilder::DEFAULT_CONNECT_TIMEOUT`](crate::ClientBuilder::DEFAULT_CONNECT_TIMEOUT)). More than zero and at most
        /// [`ClientBuilder::MAX_TIMEOUT`](crate::ClientBuilder::MAX_TIMEOUT), or [`build`](Self::build) fails.
        connect_timeout: Duration;

        /// Time allowed for one reply from Redis (default [`ClientBuilder::DEFAULT_COMMAND_TIMEOUT`](crate::ClientBuilder::DEFAULT_COMMAND_TIMEOUT)); `None` waits
        /// without limit. A connection that timed out is dropped from the pool, never reused.
        /// More than zero and at most [`ClientBuilder::MAX_TIMEOUT`](crate::ClientBuilder::MAX_TIMEOUT), or [`build`](Self::build) fails.
        command_timeout: Option<Duration>;

        /// How long a thread of this client that just released a Token or reentrant lock waits
        /// before taking the same lock again with a blocking call (`lock()`, `try_lock_for()`),
        /// when the release's `PUBLISH` reached another client's subscriber (default
        /// [`ClientBuilder::DEFAULT_HANDOFF_COURTESY`](crate::ClientBuilder::DEFAULT_HANDOFF_COURTESY); zero turns it off; `try_lock()` never waits).
        ///
        /// Why: a waiter woken by pub/sub needs a round trip and two thread wake-ups (its
        /// subscriber's, then its own) before its attempt reaches Redis, while a thread that asks
        /// again right after its release gets there in half a round trip. Without a head start the
        /// releasing client wins nearly every time. Measured on 2 loaded cores with 8 clients in a
        /// tight loop on one key, the share of the least served client relative to the most
        /// served one was 0.01–0.07 without it, 0.15 with 1 ms, 0.3–0.6 with 2–2.5 ms and 0.98 with
        /// 3 ms. The cost: a client that re-locks at once while another client waits on the
        /// channel waits this long once.
        ///
        /// At most [`ClientBuilder::MAX_HANDOFF_COURTESY`](crate::ClientBuilder::MAX_HANDOFF_COURTESY), or [`build`](Self::build) fails. The wait never runs
        /// past the blocking call's deadline (`try_lock_for`'s duration, the policy's `max_wait`,
        /// or for a count-limited policy the longest its retries could take).
        handoff_courtesy: Duration;

        /// Whether each write of a hold (an acquire, an extend, a watchdog renewal) waits until
        /// replicas of the primary confirm it, with `WAIT` sent in the same round trip. A write
        /// that too few replicas confirm within [`replica_ack_timeout`](Self::replica_ack_timeout)
        /// is not taken for a hold: the acquire fails with [`LockError::NotReplicated`], a
        /// transient error that a blocking acquire retries, and what it wrote is deleted again,
        /// owner-checked. Without it a failover to a replica that had not copied the key, or a
        /// Sentinel split brain, can grant a lock twice (docs/deployments.md). A Fair lock's
        /// hand-off (written by the releasing client) is confirmed by the grantee's own write
        /// before its `lock()` returns, and given up if too few replicas confirm it.
        ///
        /// [`ReplicaAcks::Auto`] (the default) requires one replica on a Sentinel client whose
        /// primary had replicas when the client learnt it (at its first connection and after
        /// every master switch; a replica lost in between does not turn it off), on a Cluster
        /// client for each shard whose primary had replicas when the client first wrote a hold
        /// there (learnt again after a failover), and none on single-server clients. On a
        /// Cluster the `WAIT` goes to the primary that ran the write, after a redirection too.
        replica_acks: ReplicaAcks;

        /// How long each write waits for its replicas at most (`WAIT`'s timeout; default
        /// [`ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT`](crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT), 1 s, as Redisson's `slavesSyncTimeout`). Only the
        /// writes of a client that requires confirmation wait (see
        /// [`replica_acks`](Self::replica_acks)), and only as long as the replicas take.
        replica_ack_timeout: Duration;
    }

    /// Creates the pool and checks the deployment, so that set-up faults fail here, fast, and
    /// say what is wrong: it opens one connection (AUTH, SELECT and the TLS handshake, as the
    /// URL asks) and runs a one-line script by `EVAL` and by `EVALSHA` (the release and extend
    /// scripts need both). A wrong password or unknown ACL user, a database the server lacks,
    /// a user without scripting permission are each a [`LockError::Config`] naming the server
    /// and the step, returned one reply after the server's answer, with
    /// [`is_config`](LockError::is_config) true. An unreachable server (within the connect
    /// timeout, saying refused or timed out) is a [`LockError::Config`] naming the server too,
    /// but no mistake: [`is_config`](LockError::is_config) is false and
    /// [`is_transient`](LockError::is_transient) true, and building again once the server is
    /// up works. That connection is then
    /// closed; the pool opens its own on demand. With [`lazy_connect`](Self::lazy_connect)
    /// nothing is sent: a Redis that is down now is reported by the first lock operation, and
    /// the client starts working when Redis comes up.
    ///
    /// In the round trip of the first `EVAL` it also asks `INFO server` and `COMMAND INFO
    /// DELIFEQ`, to learn whether the server has native compare-and-delete (`DELIFEQ`, Valkey
    /// 9.0+) and compare-and-extend (`SET … IFEQ`, Valkey 8.1+), which Token locks then use
    /// instead of scripts (docs/production.md, "Servers"). On a server with both (not through
    /// a Cluster client), a user without scripting permission is no fault: the client is
    /// built, Token locks without fencing work, and the locks that run scripts are refused at
    /// their own `build()`. A lazy client asks nothing and uses the scripts.
    ///
    /// At lock time, a connection that cannot be opened because access is denied is reported
    /// as [`LockError::Config`] too (as soon as the server refuses it, never as contention or
    /// a timeout), and a command without a reply as [`LockError::Connection`] whose cause reads
    /// "no reply from host:port within 2 s".
    pub fn build(self) -> Result<LockClient> {
        let bad_url =
            |e| LockError::setup_failed("invalid Redis URL or connection settings", e, false);
        if self.pool_size == 0 {
            return Err(LockError::client_config("pool size must be at least 1"));
        }
        let out_of_range = |d: Duration| d.is_zero() || d > MAX_CLIENT_TIMEOUT;
        if out_of_range(self.connect_timeout) || self.command_timeout.is_some_and(out_of_range) {
            return Err(LockError::client_config(format!(
                "timeouts must be greater than zero and at most MAX_CLIENT_TIMEOUT \
                 ({MAX_CLIENT_TIMEOUT:?}); command_timeout(None) waits without limit"
            )));
        }
        let (courtesy, max) = (self.handoff_courtesy, Self::MAX_HANDOFF_COURTESY);
        if courtesy > max {
            return Err(LockError::client_config(format!(
                "handoff courtesy {courtesy:?} is longer than MAX_HANDOFF_COURTESY ({max:?})"
            )));
        }
        #[cfg(any(feature = "cluster", feature = "sentinel"))]
        let timeout = self.command_timeout.unwrap_or(self.connect_timeout);
        let infos = self.nodes.as_ref().map_err(|e| bad_url(e.clone()))?;
        let tls = infos
            .iter()
            .map(redis::ConnectionInfo::addr)
            .find(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
        if let Some(url) =
            tls.filter(|_| !cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")))
        {
            return Err(LockError::client_config(format!(
                "{url}: a rediss:// (TLS) URL needs one of redis-dlock's cargo features \
                 `tls-rustls`, `tls-rustls-webpki-roots` or `tls-native-tls`"
            )));
        }
        let addr = self.describe();
        // A `redis::Client` for each node, with the custom certificates if any.
        let mut clients = infos
            .iter()
            .map(|info| {
                #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
                if let Some(certs) = &self.tls {
                    return redis::Client::build_with_tls(info.clone(), certs.clone());
                }
                redis::Client::open(info.clone())
            })
            .collect::<RedisResult<Vec<_>>>()
            .map_err(bad_url)?;
        // The subscriber's server: the one server, or any node of a cluster in turn (PUBLISH
        // reaches every node); a Sentinel client's follows the master (see below).
        let nodes: Vec<_> = clients
            .iter()
            .map(|c| c.get_connection_info().clone())
            .collect();
        let next = AtomicUsize::new(0);
        #[cfg_attr(not(feature = "sentinel"), allow(unused_mut))]
        let mut resolve: Option<Resolve> = Some(Box::new(move || {
            let i = next.fetch_add(1, Ordering::Relaxed) % nodes.len().max(1);
            nodes.get(i).cloned().ok_or_else(|| {
                redis::RedisError::from((redis::ErrorKind::Client, "no cluster node"))
            })
        }));
        #[cfg_attr(not(feature = "sentinel"), allow(unused_mut))]
        let mut switches = None;
        let target = match &self.target {
            TargetSpec::Single => Target::Single(clients.pop().ok_or_else(|| {
                bad_url(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "no URL",
                )))
            })?),
            #[cfg(feature = "cluster")]
            TargetSpec::Cluster => {
                // Retry sleeps of a fortieth to a tenth of the command timeout, at least 1 and
                // 2 ms (see `CLUSTER_TRIES`).
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                let min_wait = (ms / 40).max(1);
                // One client per seed, that seed first (see `Manager::cluster`).
                let mut clients = Vec::with_capacity(infos.len());
                for first in 0..infos.len().max(1) {
                    let mut seeds = infos.to_vec();
                    seeds.rotate_left(first);
                    // redis-rs's set-up of a node connection waits for up to four replies, each
                    // with the whole connection timeout: a fourth of the connect timeout.
                    let mut b = redis::cluster::ClusterClientBuilder::new(seeds)
                        .connection_timeout(self.connect_timeout / SETUP_REPLIES)
                        .retries(CLUSTER_TRIES - 1)
                        .min_retry_wait(min_wait)
                        .max_retry_wait((ms / 10).max(min_wait + 1))
                        .retry_wait_formula(min_wait, 2);
                    #[cfg(feature = "tls-rustls")]
                    if let Some(certs) = &self.tls {
                        b = b.certs(certs.clone());
                    }
                    #[cfg(all(feature = "tls-native-tls", not(feature = "tls-rustls")))]
                    if self.tls.is_some() {
                        return Err(LockError::client_config(
                            "custom TLS certificates for a cluster need the `tls-rustls` feature \
                             (redis-rs's cluster client takes them only with rustls)",
                        ));
                    }
                    if let Some(t) = self.command_timeout {
                        b = b.response_timeout(t / CLUSTER_TRIES);
                    }
                    clients.push(b.build().map_err(bad_url)?);
                }
                Target::Cluster(clients)
            }
            #[cfg(feature = "sentinel")]
            TargetSpec::Sentinel(service) => {
                if infos.is_empty() {
                    return Err(LockError::client_config(
                        "at least one Sentinel address is required",
                    ));
                }
                switches = Some(Arc::default());
                Target::Sentinel(Sentinels {
                    clients,
                    service: service.clone(),
                })
            }
        };
        if self.replica_ack_timeout.is_zero() {
            return Err(LockError::client_config(
                "replica_ack_timeout is zero (WAIT would block until every replica confirms)",
            ));
        }
        let manager = Arc::new(Manager {
            acks: Arc::new(Acks::new(
                self.replica_acks,
                self.replica_ack_timeout,
                !matches!(self.target, TargetSpec::Single),
            )),
            counters: Arc::default(),
            target,
            addr,
            connect_timeout: self.connect_timeout,
            command_timeout: self.command_timeout,
            tls: tls.is_some(),
            #[cfg(any(feature = "cluster", feature = "sentinel"))]
            first: AtomicUsize::new(0),
            switches,
        });
        #[cfg(feature = "sentinel")]
        let mut watch = None;
        #[cfg(feature = "sentinel")]
        if let Target::Sentinel(s) = &manager.target {
            // The subscriber follows the current master too (see `Manager::named_master`).
            let m = Arc::clone(&manager);
            resolve = Some(Box::new(move || m.named_master()));
            watch = Some(sentinel_watch::Watch {
                sentinels: s.clients.clone(),
                service: s.service.clone(),
                connect_timeout: self.connect_timeout,
                timeout,
            });
        }
        let detected = if self.lazy {
            Detected::default()
        } else {
            manager.check()?
        };
        let pool = unreaped()
            .max_size(self.pool_size)
            .min_idle(Some(0))
            // A checkout PING would double every lock operation's cost; broken connections mark
            // themselves (see `Conn`) and are replaced instead.
            .test_on_check_out(false)
            .connection_timeout(self.connect_timeout)
            .build_unchecked(Lazy(Arc::clone(&manager)));
        let client = LockClient::with_pool(
            Pool::Managed(pool),
            Some(&manager),
            resolve,
            self.handoff_courtesy,
            detected,
        );
        #[cfg(feature = "sentinel")]
        if let Some(watch) = watch {
            sentinel_watch::start(watch, &client);
        }
        Ok(client)
    }
}
