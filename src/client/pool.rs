//! The connection pool: the one place that knows how to reach the deployment (a URL, the
//! master that Sentinels name, a Cluster) and opens, checks and hands out connections through
//! redis-rs, TLS and AUTH/ACL included.

#[cfg(any(feature = "cluster", feature = "sentinel"))]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use scheduled_thread_pool::ScheduledThreadPool;

#[cfg(feature = "sentinel")]
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use redis::{ConnectionLike, RedisError, RedisResult, Value};

#[cfg(feature = "cluster")]
use super::confirm::NodeRole;
use super::confirm::{Acks, Wait};
use super::native::Detected;
use super::switches::Switches;
use crate::error::{self, LockError, Result, Rounded};
use crate::server::{self, Version};

/// A pool builder on the scheduler that every client pool of the process shares: ONE thread
/// (`dlock-pool`), started with the first client built and kept for the life of the process.
/// r2d2 adds a pool's connections on it when a checkout finds none idle; the pools schedule
/// nothing else, so an idle client costs it nothing. It sends nothing and never waits for a
/// server: what it adds is an unopened [`Link`], which the checkout that takes it opens on its
/// own thread (see [`Lazy`]), so a server slow to answer delays no other client's connections.
///
/// Without r2d2's idle-connection reaper: the reaper is a job repeated every 30 s on the
/// scheduler that nothing cancels when its pool is dropped, so on a shared scheduler each
/// client built would leave one behind. A pooled connection thus stays open until its client
/// is dropped or it breaks (a server's idle `timeout` closing it included: it is then replaced
/// at its next use).
pub(crate) fn unreaped<M: r2d2::ManageConnection>() -> r2d2::Builder<M> {
    static SCHEDULER: OnceLock<Arc<ScheduledThreadPool>> = OnceLock::new();
    let scheduler = SCHEDULER.get_or_init(|| {
        Arc::new(
            ScheduledThreadPool::builder()
                .num_threads(1)
                .thread_name_pattern("dlock-pool")
                .build(),
        )
    });
    r2d2::Pool::builder()
        .thread_pool(Arc::clone(scheduler))
        .idle_timeout(None)
        .max_lifetime(None)
}

#[cfg(feature = "cluster")]
/// The tries of one Cluster command: each waits for at most this fraction of the command's
/// time `t`.
///
/// Two retries: a `MOVED` and an `ASK` of a slot in migration, or one timeout and one
/// redirection, so that the whole command returns within `t` plus the retry sleeps.
/// redis-rs sleeps a random time in `[min, min(max, min · 2^retry))` before retry number
/// `retry` (after `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` or `READONLY`);
/// `ClientBuilder::build` gives it `min = t/40` and `max = t/10` (at least 1 and 2 ms), so
/// that the two sleeps add up to less than `0.15 t`, where redis-rs's defaults (16 retries,
/// 1.28 s to 655 s each) add up to minutes.
pub(crate) const CLUSTER_TRIES: u32 = 3;

#[cfg(feature = "cluster")]
/// Each try's timeout of a Cluster command whose whole time is `t` (see [`CLUSTER_TRIES`]).
fn per_try(t: Duration) -> Duration {
    (t / CLUSTER_TRIES).max(Duration::from_micros(1))
}

#[cfg(any(feature = "cluster", feature = "sentinel"))]
/// Asks `ask(i)` of each of `n` servers (Sentinels, Cluster seeds) in turn, starting with the
/// one that answered last, until one answers (`None`: passed over). The next call starts with
/// the one that answered, or after the first one asked if it failed (unless another thread's
/// call moved it meanwhile), so that a dead or frozen one costs one timeout, not one per
/// connection. `last_err`: the error if none answers and none fails.
fn in_turn<T>(
    n: usize,
    first: &AtomicUsize,
    mut last_err: Option<RedisError>,
    mut ask: impl FnMut(usize) -> Option<RedisResult<T>>,
) -> RedisResult<T> {
    let start = first.load(Ordering::Relaxed);
    for i in (0..n).map(|k| (start + k) % n) {
        match ask(i) {
            Some(Ok(t)) => {
                first.store(i, Ordering::Relaxed);
                return Ok(t);
            }
            Some(Err(e)) => {
                if i == start {
                    let next = (i + 1) % n;
                    let _ = first.compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
                }
                last_err = Some(e);
            }
            None => {}
        }
    }
    Err(last_err
        .unwrap_or_else(|| RedisError::from((redis::ErrorKind::Client, "no server to ask"))))
}

/// Where connections go.
pub(super) enum Target {
    Single(redis::Client),
    #[cfg(feature = "cluster")]
    /// One client per seed, each with the seeds in turn from that one: see
    /// [`Manager::cluster`].
    Cluster(Vec<redis::cluster::ClusterClient>),
    #[cfg(feature = "sentinel")]
    Sentinel(Sentinels),
}

#[cfg(feature = "sentinel")]
/// Sentinels asked for the current master of `service` on every new connection. Not
/// `redis::sentinel::SentinelClient`: its blocking lookup sets no read timeout on the Sentinel
/// connections nor on its `ROLE` check of the master, so one frozen server hung every later
/// reconnection of the pool for good.
pub(super) struct Sentinels {
    pub(super) clients: Vec<redis::Client>,
    pub(super) service: String,
}

#[cfg(feature = "sentinel")]
/// A server's address as a Sentinel names it.
type Addr = (String, u16);

#[cfg(feature = "sentinel")]
impl Sentinels {
    /// How to reach the master at `addr` that a Sentinel named: as the Sentinels are reached,
    /// over TLS when their URLs are `rediss://` (with their certificates and `insecure` flag),
    /// or in plain TCP.
    fn master_info(&self, (host, port): Addr) -> RedisResult<ConnectionInfo> {
        let sentinel = self.clients.first().map(|c| c.get_connection_info().addr());
        let addr = match sentinel.cloned() {
            Some(ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            }) => ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        addr.into_connection_info()
    }
}

impl Target {
    pub(super) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if let Target::Cluster(_) = self {
            return true;
        }
        false
    }
}

/// The script that [`Manager::check`] runs by `EVAL` and `EVALSHA` on every new connection.
const PROBE: &str = "#!lua flags=no-writes\nreturn 1";

/// r2d2 manager that sets connect and command timeouts (which `redis::Client`'s own does not)
/// and drops connections that marked themselves broken.
pub(crate) struct Manager {
    pub(super) target: Target,
    /// The client's counters: broken connections count as reconnects.
    pub(super) counters: Arc<crate::stats::Counters>,
    pub(super) connect_timeout: Duration,
    pub(super) command_timeout: Option<Duration>,
    /// Connects with TLS (`rediss://`): connection errors may be the handshake's.
    pub(super) tls: bool,
    /// Where the client connects, for messages ("127.0.0.1:6379", ...).
    pub(super) addr: String,
    #[cfg(any(feature = "cluster", feature = "sentinel"))]
    /// The Sentinel or Cluster seed that answered last, asked first next time (the Sentinel
    /// clients guideline), so a dead or frozen one costs one timeout, not one per connection.
    pub(super) first: AtomicUsize,
    /// Sentinel clients: the master switches announced by the Sentinels (`+switch-master`).
    pub(super) switches: Option<Arc<Switches>>,
    /// Replica confirmation: a Sentinel client learns the primary's replicas from its `ROLE`.
    pub(super) acks: Arc<Acks>,
}

#[cfg(feature = "sentinel")]
impl Manager {
    /// A connection for the discovery steps of [`Target::Sentinel`]: never without a timeout,
    /// none past `until`.
    fn discovery(
        &self,
        client: &redis::Client,
        until: Option<Instant>,
    ) -> RedisResult<redis::Connection> {
        let con =
            client.get_connection_with_timeout(connect_within(self.connect_timeout, until)?)?;
        let timeout = self.command_timeout.unwrap_or(self.connect_timeout);
        let timeout = Some(within(timeout, until)?);
        con.set_read_timeout(timeout)?;
        con.set_write_timeout(timeout)?;
        Ok(con)
    }

    /// Where Sentinel `i` says the service's master is; no step waits past `until`.
    fn named_by(&self, s: &Sentinels, i: usize, until: Option<Instant>) -> RedisResult<Addr> {
        let mut con = self.discovery(&s.clients[i], until)?;
        let named: Option<Addr> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&s.service)
            .query(&mut con)?;
        named.ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the Sentinel does not know the service",
                s.service.clone(),
            ))
        })
    }

    /// Where the Sentinels say the master is, for the subscriber: asked in turn (the one that
    /// answered last first), not checked with `ROLE` (`PUBLISH` on a master reaches its
    /// replicas' subscribers as well, so a stale answer still hears releases).
    pub(super) fn named_master(&self) -> RedisResult<ConnectionInfo> {
        let Target::Sentinel(s) = &self.target else {
            return Err(RedisError::from((redis::ErrorKind::Client, "no Sentinel")));
        };
        in_turn(s.clients.len(), &self.first, None, |i| {
            Some(self.named_by(s, i, None).and_then(|a| s.master_info(a)))
        })
    }

    /// Connects to the first master the Sentinels name that answers `ROLE` as a master,
    /// asking each Sentinel in turn, the one that answered last first. An address is tried
    /// once per call even if several Sentinels name it, so a frozen old master costs one
    /// timeout, not one per Sentinel.
    ///
    /// The master the last `+switch-master` announced, if any, is tried first: a Sentinel that
    /// has not heard of the switch yet would still name the old master, which answers `ROLE` as
    /// a master until Sentinel reconfigures it.
    ///
    /// No step waits past `until`.
    fn sentinel_master(
        self: &Arc<Self>,
        s: &Sentinels,
        until: Option<Instant>,
    ) -> RedisResult<Link> {
        // Read before asking: a switch during this connect makes the link stale at once.
        let generation = self.generation();
        // The master this client follows, and why its check failed, if it did.
        let followed = self.switches.as_ref().and_then(|s| s.announced());
        let mut passed_over = None;
        if let Some(addr) = &followed {
            match self.checked_master(s, addr.clone(), generation, until) {
                Ok(link) => return Ok(link),
                Err(e) => passed_over = Some(e),
            }
        }
        let mut tried: Vec<Addr> = followed.iter().cloned().collect();
        in_turn(s.clients.len(), &self.first, passed_over.clone(), |i| {
            let mut check = |addr: Addr| {
                if tried.contains(&addr) {
                    return Ok(None);
                }
                tried.push(addr.clone());
                let link = self.checked_master(s, addr.clone(), generation, until)?;
                if let (Some(why), Some((was, was_port))) = (&passed_over, &followed) {
                    let (host, port) = &addr;
                    log::info!(
                        "Sentinel: a new connection goes to {host}:{port}, which a Sentinel \
                         names, not to {was}:{was_port}, the master this client follows ({why})"
                    );
                }
                Ok(Some(link))
            };
            self.named_by(s, i, until).and_then(&mut check).transpose()
        })
    }

    /// A connection to `addr` once `ROLE` says it is a master, of the master-switch
    /// `generation`; the master's replicas are learnt (see [`Acks::learn`]). No step waits past
    /// `until`.
    fn checked_master(
        self: &Arc<Self>,
        s: &Sentinels,
        addr: Addr,
        generation: u64,
        until: Option<Instant>,
    ) -> RedisResult<Link> {
        let client = s.master_info(addr.clone()).and_then(redis::Client::open)?;
        let mut con = self.discovery(&client, until)?;
        let role: redis::Role = redis::cmd("ROLE").query(&mut con)?;
        let redis::Role::Primary { replicas, .. } = role else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the server the Sentinel named is not a master (failover under way?)",
                format!("{}:{}", addr.0, addr.1),
            )));
        };
        let mut link = Link::opened(self, Node::Single(con), self.command_timeout)?;
        link.generation = generation;
        self.acks.learn(&addr, replicas.len());
        Ok(link)
    }
}

impl Manager {
    /// The check of [`ClientBuilder::build`](crate::ClientBuilder::build): opens one connection (which sends AUTH, SELECT
    /// and the TLS handshake as the URL asks) and runs a one-line script by `EVAL` and by
    /// `EVALSHA`, the two ways the library runs its scripts. The `EVAL` and `EVALSHA` go in one round trip
    /// with `INFO server` and `COMMAND INFO DELIFEQ`, which tell the native commands the
    /// server has (see [`native`](super::native)). Any failure is a [`LockError::Config`] that
    /// names the step and the server; a user denied scripts is no failure on a server with
    /// both native commands (Token locks without fencing need no script there).
    pub(super) fn check(self: &Arc<Self>) -> Result<Detected> {
        let addr = &self.addr;
        // The database the URL names: refused by `SELECT` during the connection's set-up, which
        // redis-rs reports as a plain `ERR` reply.
        let db = match &self.target {
            Target::Single(client) => client.get_connection_info().redis_settings().db(),
            #[allow(unreachable_patterns)]
            _ => 0,
        };
        let mut con = self.open(None).map_err(|e| {
            let what = if error::is_access_denied(&e) {
                format!("authentication to {addr} failed (check the user name and password)")
            } else if db != 0
                && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
            {
                format!("{addr} has no database {db} (the URL's /db number)")
            } else if e.is_timeout() {
                let connect = Rounded(self.connect_timeout);
                format!("no answer from {addr} within {connect} (connect timeout)")
            } else if e.is_connection_refusal() {
                format!("connection to {addr} refused (is Redis running there?)")
            } else {
                format!("cannot connect to {addr}")
            };
            // No server answered (refused, reset, no answer in time, no Sentinel or Cluster node
            // reachable): an outage that building the client again later outlives. A failed
            // TLS handshake (with TLS, any other I/O failure of the set-up is the handshake's,
            // see `tls_context`), a wrong password, a master name no Sentinel knows are
            // mistakes instead.
            let down = e.is_timeout()
                || e.is_connection_refusal()
                || (e.kind() == redis::ErrorKind::Io && !self.tls)
                || matches!(
                    e.kind(),
                    redis::ErrorKind::ClusterConnectionNotFound
                        | redis::ErrorKind::NoValidReplicasFoundBySentinel
                );
            // An outage (`down`: building the client again later may work), or a mistake.
            LockError::setup_failed(what, e, down)
        })?;
        let scripting = |e: redis::RedisError, cmd: &str, server: &str| {
            let transient = e.is_timeout() || e.is_io_error();
            let why = if e.code() == Some("NOAUTH") {
                "the server requires authentication (NOAUTH): give the user and password in the \
                 URL"
                .to_owned()
            } else if error::is_access_denied(&e) {
                format!(
                    "the user may not run it (NOPERM); the locks' release and extend need EVAL \
                     and EVALSHA (ACL category @scripting) on {}, which lacks DELIFEQ and \
                     SET ... IFEQ (Valkey 9.0 and later have both: there a Token lock without \
                     fencing needs no script)",
                    Some(server)
                        .filter(|s| !s.is_empty())
                        .unwrap_or("this server")
                )
            } else if transient {
                "no reply in time (a paused, overloaded or unreachable server?)".to_owned()
            } else {
                "the server refused it (renamed or disabled command?); the locks' release and \
                 extend need EVAL and EVALSHA"
                    .to_owned()
            };
            LockError::setup_failed(format!("{cmd} on {addr}: {why}"), e, transient)
        };
        // Flagged `no-writes` (Redis 7), so that a server paused for writes (`CLIENT PAUSE …
        // WRITE`, as during a `FAILOVER`) answers at once instead of holding the new connection
        // for the rest of the pause; servers before 7 refuse the shebang and run it plain.
        // The capability questions ride with the first EVAL; a user denied them (no @slow) is
        // told nothing and the client keeps to the scripts.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("INFO").arg("server");
        pipe.cmd("COMMAND").arg("INFO").arg("DELIFEQ");
        pipe.cmd("EVAL").arg(PROBE).arg(0);
        // NOSCRIPT also proves that EVALSHA exists and is allowed.
        pipe.cmd("EVALSHA")
            .arg(redis::Script::new(PROBE).get_hash())
            .arg(0);
        let replies: Vec<Value> = pipe.query(&mut con).map_err(|e| scripting(e, "EVAL", ""))?;
        let reply = |i: usize| replies.get(i).cloned().unwrap_or(Value::Nil);
        let script = |i: usize| -> RedisResult<i64> {
            Ok(redis::from_redis_value(reply(i).extract_error()?)?)
        };
        let mut detected = Detected::from_replies(&reply(0), &reply(1));
        match script(2) {
            Ok(_) => {}
            // A plain `ERR` from a server whose version has no shebangs (before Redis 7), or
            // that did not say its version: the probe runs plain, as the client's scripts will.
            Err(e)
                if server::may_lack_capability(&e)
                    && !detected.version.as_ref().is_some_and(Version::has_shebang) =>
            {
                let plain = PROBE.lines().last().unwrap_or_default();
                let eval = redis::cmd("EVAL").arg(plain).arg(0).query::<i64>(&mut con);
                eval.map_err(|e| scripting(e, "EVAL", &detected.server))?;
            }
            // Not in a cluster, where the Token release's PUBLISH keeps the script.
            Err(e)
                if error::is_access_denied(&e)
                    && detected.delifeq
                    && detected.set_ifeq
                    && !self.target.is_cluster() =>
            {
                log::info!(
                    "{addr} ({}): the user may not run scripts ({e}); Token locks without \
                     fencing need none on this server, every other lock does",
                    detected.server
                );
                detected.scripts_denied = true;
                return Ok(detected);
            }
            Err(e) => return Err(scripting(e, "EVAL", &detected.server)),
        }
        match script(3) {
            Err(e) if e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                Err(scripting(e, "EVALSHA", &detected.server))
            }
            _ => Ok(detected),
        }
    }

    /// The generation a link must have to be used: that of the last master switch heard of.
    fn generation(&self) -> u64 {
        self.switches.as_deref().map_or(0, Switches::generation)
    }

    #[cfg(feature = "cluster")]
    /// A cluster connection, built by redis-rs from the first seed that answers, starting with
    /// the one that answered last; no seed is tried past the connect timeout or `until` (a
    /// watchdog renewal's cap), whichever comes first.
    ///
    /// redis-rs connects to its seeds in their order only until one connection is made, then
    /// asks that seed for the slot map and fails if it does not answer, and it tries every
    /// seed in one call, so the seeds are tried here, one client of one seed each; the next
    /// connection starts with the seed after one that failed. redis-rs then connects to every
    /// node of the slot map, one after the other, each within its connection timeout (a fourth
    /// of the client's connect timeout, see `ClientBuilder::build`, twice for a node that
    /// accepts the connection and answers nothing): such a node costs every new cluster
    /// connection that much, and is left out of it until a command needs it.
    fn cluster(
        self: &Arc<Self>,
        clients: &[redis::cluster::ClusterClient],
        until: Option<Instant>,
    ) -> RedisResult<Link> {
        let by = Instant::now().checked_add(self.connect_timeout);
        let until = until.into_iter().chain(by).min();
        // Once the time is up no seed is tried: the error is the last seed's, if any.
        in_turn(clients.len(), &self.first, left_until(until).err(), |i| {
            left_until(until).ok()?;
            let con = clients[i].get_connection().inspect_err(|e| {
                log::debug!("cluster: seed {i} did not give the slot map: {e}");
            });
            let per_try = self.command_timeout.map(per_try);
            Some(con.and_then(|con| Link::opened(self, Node::Cluster(Box::new(con)), per_try)))
        })
    }

    /// Opens a connection to the target (the Sentinels' master, for a Sentinel client),
    /// waiting past `until` for nothing (a watchdog renewal's cap, see [`Link::cap`]).
    fn open(self: &Arc<Self>, until: Option<Instant>) -> RedisResult<Link> {
        let link = match &self.target {
            Target::Single(client) => connect_within(self.connect_timeout, until)
                .and_then(|t| client.get_connection_with_timeout(t))
                .and_then(|con| Link::opened(self, Node::Single(con), self.command_timeout)),
            #[cfg(feature = "cluster")]
            Target::Cluster(clients) => self.cluster(clients, until),
            // Ask the Sentinels for the current master each time: after a failover the next
            // connection goes to the new one.
            #[cfg(feature = "sentinel")]
            Target::Sentinel(s) => self.sentinel_master(s, until),
        };
        link.map_err(|e| if self.tls { tls_context(e) } else { e })
    }
}

/// The managed pool's connection manager: the pool "connects" on the shared scheduler
/// thread (see [`unreaped`]) by adding an unopened [`Link`] at once, and the checkout
/// that takes it opens it ([`Link::open_if_needed`]), on the caller's thread and within the
/// client's connect timeout. A failed open leaves the link unopened in the pool, for the next
/// checkout to try again.
pub(crate) struct Lazy(pub(super) Arc<Manager>);

impl r2d2::ManageConnection for Lazy {
    type Connection = Link;
    type Error = redis::RedisError;

    fn connect(&self) -> RedisResult<Link> {
        Link::opened(&self.0, Node::Unopened, None)
    }

    fn is_valid(&self, con: &mut Link) -> RedisResult<()> {
        con.open_if_needed(None)?;
        redis::cmd("PING").query(con)
    }

    fn has_broken(&self, con: &mut Link) -> bool {
        // An unopened link is opened by the checkout that takes it.
        let broken = !matches!(con.node, Node::Unopened)
            && (con.broken || !con.node.is_open() || con.generation < self.0.generation());
        if broken {
            // Replaced by a new connection when next needed.
            self.0.counters.reconnect();
        }
        broken
    }
}

/// Says "TLS" in an error of opening a TLS connection (neither TLS library names TLS itself):
/// - the handshake's: an I/O failure that is not a refusal, a timeout or a closed socket
///   (rustls: "invalid peer certificate: UnknownIssuer", "received fatal alert:
///   CertificateRequired"), or redis-rs's "SSL Handshake error" (native-tls: OpenSSL's
///   "certificate verify failed"; redis-rs gives it the kind of a dropped connection);
/// - a connection the server closed during the set-up: with TLS 1.3 the client's side of the
///   handshake ends before the server has checked the client certificate, so a server that
///   refuses it (or wants one) is seen by OpenSSL as a reset on the first command.
pub(crate) fn tls_context(e: redis::RedisError) -> redis::RedisError {
    if e.kind() != redis::ErrorKind::Io || e.is_connection_refusal() || e.is_timeout() {
        return e;
    }
    let text = e.to_string();
    let what = if text.starts_with("SSL Handshake error") || !e.is_connection_dropped() {
        "TLS handshake failed (check the CA certificate, the server name and the client \
         certificate)"
    } else {
        "the server closed the connection during the TLS set-up (a server that requires a \
         client certificate does so when none or an unknown one is given)"
    };
    redis::RedisError::from((redis::ErrorKind::Io, what, text))
}

/// A connection that has waited this long in the pool since it was opened counts as used (see
/// [`Conn::was_used`]); one opened for the checkout that takes it is younger.
const IDLE_STALE: Duration = Duration::from_millis(10);

/// A connection of the managed pool: one server's or a cluster's.
pub(crate) struct Link {
    node: Node,
    /// The pool's manager: opens the link, and again in place when it went stale or broke.
    manager: Arc<Manager>,
    broken: bool,
    /// Has carried a command: such a connection may have gone stale while idle in the pool.
    used: bool,
    /// When it was opened: one the pool opened ahead of need may have gone stale too.
    opened: Instant,
    /// Sentinel clients: the master-switch generation the link was opened in (0 otherwise).
    generation: u64,
    /// The command timeout: the socket's write timeout (each try's of a cluster command).
    timeout: Option<Duration>,
    /// The read timeout: the command timeout, lengthened by a replica confirmation's bound
    /// while it waits (see [`Conn::set_wait`]).
    read_timeout: Option<Duration>,
    /// The instant no command may wait past (a watchdog renewal's cap, see [`Link::cap`]);
    /// the socket's timeouts may have been cut for it, to restore once it is lifted.
    until: Option<Instant>,
    /// The replica confirmation every command sent waits for, if any (see
    /// [`confirm`](super::confirm)).
    wait: Option<Wait>,
}

enum Node {
    /// Not opened yet: the checkout that takes it opens it.
    Unopened,
    Single(redis::Connection),
    #[cfg(feature = "cluster")]
    /// Boxed: a cluster connection is four times the size of a single one. Its timeouts are
    /// each try's (see [`per_try`]); it is replaced in place once broken (see
    /// [`Link::renew_if_broken`]).
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Node {
    fn is_open(&self) -> bool {
        match self {
            Node::Unopened => true,
            Node::Single(c) => c.is_open(),
            #[cfg(feature = "cluster")]
            Node::Cluster(c) => c.is_open(),
        }
    }

    /// The opened connection; an error for an unopened one (none is sent a command, as
    /// `LockClient::conn` opens it first).
    fn con(&mut self) -> RedisResult<&mut dyn ConnectionLike> {
        match self {
            Node::Unopened => Err(RedisError::from((
                redis::ErrorKind::Io,
                "connection not opened",
            ))),
            Node::Single(c) => Ok(c),
            #[cfg(feature = "cluster")]
            Node::Cluster(c) => Ok(&mut **c),
        }
    }
}

impl Link {
    /// A link on a connection just opened (or to open, see [`Lazy`]), with `timeout` as its
    /// command timeout.
    fn opened(manager: &Arc<Manager>, node: Node, timeout: Option<Duration>) -> RedisResult<Self> {
        let mut link = Link {
            node,
            manager: Arc::clone(manager),
            broken: false,
            used: false,
            opened: Instant::now(),
            generation: 0,
            timeout,
            read_timeout: timeout,
            until: None,
            wait: None,
        };
        link.set_timeouts(timeout, timeout)?;
        Ok(link)
    }

    /// Sets the read and write timeouts: a single server's socket's, or each try's of a
    /// cluster command. A failure marks the link broken.
    fn set_timeouts(&mut self, read: Option<Duration>, write: Option<Duration>) -> RedisResult<()> {
        let set = match &self.node {
            Node::Unopened => Ok(()),
            Node::Single(c) => c
                .set_read_timeout(read)
                .and_then(|()| c.set_write_timeout(write)),
            #[cfg(feature = "cluster")]
            Node::Cluster(c) => c
                .set_read_timeout(read)
                .and_then(|()| c.set_write_timeout(write)),
        };
        self.broken |= set.is_err();
        set
    }

    /// The symmetric of [`Conn::set_wait`]'s longer read timeout: no command sent
    /// from now on waits past `until` (a watchdog renewal's cap: the earliest loss deadline of
    /// the holds it carries), or no cap (`None`: the timeouts are restored). A single server's
    /// socket timeouts are cut to the time left before each command, a cluster command's
    /// tries to a third of it each (see [`CLUSTER_TRIES`]); a command with no time left fails
    /// at once with a timeout, sending nothing. A failure to restore marks the link broken.
    pub(super) fn cap(&mut self, until: Option<Instant>) {
        let lifted = std::mem::replace(&mut self.until, until).is_some() && until.is_none();
        if lifted {
            let _ = self.set_timeouts(self.read_timeout, self.timeout);
        }
    }

    /// Before a command: cuts the timeouts to the time left before the cap, if any (a third of
    /// it for each try of a cluster command); a timeout error (nothing sent) when none is left.
    fn arm(&mut self) -> RedisResult<()> {
        let Some(until) = self.until else {
            return Ok(());
        };
        let left = left_until(Some(until))?.unwrap_or_default();
        #[cfg(feature = "cluster")]
        let left = match self.node {
            Node::Cluster(..) => per_try(left),
            _ => left,
        };
        let cut = |t: Option<Duration>| Some(t.map_or(left, |t| t.min(left)));
        self.set_timeouts(cut(self.read_timeout), cut(self.timeout))
    }

    /// Opens the link if the pool added it unopened (see [`Lazy`]), waiting past `until` for
    /// nothing. A Sentinel client's link opened before the last master switch it heard of
    /// (see [`crate::client::sentinel_watch`]) may lead to the old master, which goes on
    /// answering as a master until Sentinel reconfigures it: it is closed and opened again (to
    /// the new master, `ROLE` checked). A failed open leaves it unopened.
    pub(super) fn open_if_needed(&mut self, until: Option<Instant>) -> RedisResult<()> {
        let now = self.manager.generation();
        if !matches!(self.node, Node::Unopened) && self.generation < now {
            log::debug!(
                "dropping a connection opened before the master switch (generation {} < {now})",
                self.generation
            );
            self.manager.counters.reconnect();
            self.node = Node::Unopened;
        }
        if let Node::Unopened = self.node {
            *self = self.manager.open(until)?;
        }
        Ok(())
    }

    /// A broken cluster link is replaced in place, on the thread that saw it break, before it
    /// goes back to the pool: opening a cluster connection connects to every node (redis-rs),
    /// which costs the connection timeouts of a node that does not answer, and a link the pool
    /// replaced would be opened by whichever checkout took it next, for any key, on any shard.
    /// No seed is tried past half the connect timeout; a failed replacement leaves the link
    /// broken: the pool drops it.
    #[cfg(feature = "cluster")]
    fn renew_if_broken(&mut self) {
        if self.broken && matches!(self.node, Node::Cluster(_)) {
            let until = Instant::now().checked_add(self.manager.connect_timeout / 2);
            if let Ok(new) = self.manager.open(until) {
                self.manager.counters.reconnect();
                *self = new;
            }
        }
    }

    /// Marks the connection for replacement after an error that leaves it unusable or pointed
    /// at the wrong server: I/O failure or timeout (a late reply could still arrive), or
    /// `READONLY` (the server is a replica now, after a failover).
    ///
    /// A cluster connection is replaced after such an error on any of its nodes too: its slot
    /// map may be stale (a failover), and redis-rs refreshes it only on `MOVED` or `READONLY`. Its
    /// replacement costs one seed's slot map and a connect to each node (see
    /// [`Manager::cluster`]).
    fn note<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        self.used = true;
        self.broken |= result.as_ref().is_err_and(|e| {
            error::is_connection_failure(e)
                || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        });
        result
    }
}

impl ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        if self.wait.is_some() {
            // With the `WAIT`, as a pipeline of one.
            return Ok(self
                .req_packed_commands(cmd, 0, 1)?
                .pop()
                .unwrap_or(Value::Nil));
        }
        self.arm()?;
        let r = self.node.con().and_then(|c| c.req_packed_command(cmd));
        self.note(r)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if let Some(mut wait) = self.wait.take() {
            let replies = wait.commands(self, cmd, offset, count);
            self.wait = Some(wait);
            return replies;
        }
        self.arm()?;
        let r = match (&mut self.node, self.until) {
            (Node::Single(c), Some(until)) if offset == 0 => {
                capped_commands(c, self.read_timeout, until, cmd, count)
            }
            (node, _) => node
                .con()
                .and_then(|c| c.req_packed_commands(cmd, offset, count)),
        };
        self.note(r)
    }

    fn get_db(&self) -> i64 {
        match &self.node {
            Node::Single(c) => c.get_db(),
            // A cluster has database 0 only.
            _ => 0,
        }
    }

    fn check_connection(&mut self) -> bool {
        self.node.con().is_ok_and(|c| c.check_connection())
    }

    fn is_open(&self) -> bool {
        !self.broken && self.node.is_open()
    }
}

/// `req_packed_commands` of a single server's connection with no reply waited for past
/// `until`: redis-rs's reads every reply of a pipeline even after one timed out, each with the
/// whole read timeout, so a pipeline of `n` commands to an unresponsive server would take `n`
/// times the time left. Here the read timeout (`read`, uncut) is cut to the time left before
/// each reply, and the first failure ends the call. As redis-rs's: server errors stay in their
/// place, RESP3 push messages are skipped. (Transactions, `offset > 0`, which the watchdog never
/// sends, go to redis-rs's.)
fn capped_commands(
    c: &mut redis::Connection,
    read: Option<Duration>,
    until: Instant,
    cmd: &[u8],
    count: usize,
) -> RedisResult<Vec<Value>> {
    let within = || within(read.unwrap_or(Duration::MAX), Some(until)).map(Some);
    c.send_packed_command(cmd)?;
    let mut replies = Vec::with_capacity(count);
    // The timeout `arm` set for the first reply.
    let mut armed = within()?;
    while replies.len() < count {
        let want = within()?;
        if want < armed {
            c.set_read_timeout(want)?;
            armed = want;
        }
        match c.recv_response()? {
            Value::Push { .. } => {}
            reply => replies.push(reply),
        }
    }
    Ok(replies)
}

pub(crate) enum Pool {
    Managed(r2d2::Pool<Lazy>),
    External(r2d2::Pool<redis::Client>),
}

/// A pooled connection from either kind of pool.
pub(crate) enum Conn {
    Managed(r2d2::PooledConnection<Lazy>),
    External(r2d2::PooledConnection<redis::Client>),
}

impl Conn {
    /// The managed pool's link; `None` for a connection of an application's own pool.
    fn own_link(&mut self) -> Option<&mut Link> {
        match self {
            Conn::Managed(c) => Some(c),
            Conn::External(_) => None,
        }
    }

    /// True if the connection carried commands before this checkout, or waited in the pool
    /// since it was opened ([`IDLE_STALE`] or more): either may have gone stale meanwhile (a
    /// restart, an idle timeout), so a dropped-connection error on it may be sent again on a
    /// fresh one. Connections of an application's own pool are not tracked: they count as
    /// fresh, so never retried.
    pub(super) fn was_used(&mut self) -> bool {
        self.own_link()
            .is_some_and(|c| c.used || c.opened.elapsed() >= IDLE_STALE)
    }

    /// Every command sent from now on is followed by `wait`'s `WAIT` (`None`: by none), in the
    /// same round trip; returns the confirmation of the commands sent since the last call. The
    /// read timeout grows by the `WAIT`'s bound meanwhile, so that a confirmation that takes
    /// its time is not taken for a server that does not answer; a failure to set it marks the
    /// link broken. (A client on an application's own pool confirms nothing: it never sets one.)
    pub(super) fn set_wait(&mut self, wait: Option<Wait>) -> Option<Wait> {
        let c = self.own_link()?;
        if c.wait.is_some() || wait.is_some() {
            let grow = |t: Duration| wait.as_ref().map_or(t, |w| t.saturating_add(w.timeout));
            c.read_timeout = c.timeout.map(grow);
            let _ = c.set_timeouts(c.read_timeout, c.timeout);
        }
        std::mem::replace(&mut c.wait, wait)
    }

    #[cfg(feature = "cluster")]
    /// Cluster: what `INFO replication` says of the primary that serves `key`'s slot (routed
    /// there by redis-rs); `None` on another kind of connection.
    pub(super) fn primary_role(&mut self, key: &str) -> RedisResult<Option<NodeRole>> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let Some(link) = self.own_link() else {
            return Ok(None);
        };
        let Node::Cluster(c) = &mut link.node else {
            return Ok(None);
        };
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
            key,
            SlotAddr::Master,
        )));
        let info = c.route_command(redis::cmd("INFO").arg("replication"), route);
        let info: String = redis::from_redis_value(link.note(info)?)?;
        Ok(Some(NodeRole::parse(&info)))
    }
}

impl Drop for Conn {
    /// Back to the pool without a cap (see [`Link::cap`]), a broken cluster link replaced.
    fn drop(&mut self) {
        // A confirmation never outlives its checkout, whatever way the caller left.
        self.set_wait(None);
        if let Some(c) = self.own_link() {
            c.cap(None);
            #[cfg(feature = "cluster")]
            c.renew_if_broken();
        }
    }
}

/// `$e` with `$c` bound to the pooled connection of either kind of pool.
macro_rules! either {
    ($conn:expr, $c:ident => $e:expr) => {
        match $conn {
            Conn::Managed($c) => $e,
            Conn::External($c) => $e,
        }
    };
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        either!(self, c => c.req_packed_command(cmd))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        either!(self, c => c.req_packed_commands(cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        either!(self, c => c.get_db())
    }

    fn check_connection(&mut self) -> bool {
        either!(self, c => c.check_connection())
    }

    fn is_open(&self) -> bool {
        either!(self, c => c.is_open())
    }
}

/// The time left until `until`: `Ok(None)` without one, an I/O timeout error (a command that
/// did not answer in time) when it has passed.
pub(crate) fn left_until(until: Option<Instant>) -> RedisResult<Option<Duration>> {
    let Some(deadline) = until else {
        return Ok(None);
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the command's deadline ran out (cluster redirections and retries included, \
             a cluster connection's opening bounded by the connect timeout, or a watchdog \
             renewal bounded by a hold's loss deadline)",
        )));
    }
    Ok(Some(left))
}

/// `timeout`, cut to the time left until `until`; an I/O timeout error when none is left.
pub(crate) fn within(timeout: Duration, until: Option<Instant>) -> RedisResult<Duration> {
    Ok(left_until(until)?.map_or(timeout, |left| left.min(timeout)))
}

/// The replies redis-rs's connection set-up may wait for, each with the whole connect timeout
/// left after the TCP connect: `HELLO` or `AUTH`, `SELECT`, and two `CLIENT SETINFO` (it reads
/// every reply of its set-up pipeline, even after one timed out).
pub(crate) const SETUP_REPLIES: u32 = 4;

/// The connect timeout to give redis-rs for a connection that must be open, set-up included,
/// by `until` (`None`: `timeout` as it is): a fourth of the time left at most (see
/// [`SETUP_REPLIES`]); an I/O timeout error when that has passed.
fn connect_within(timeout: Duration, until: Option<Instant>) -> RedisResult<Duration> {
    Ok(left_until(until)?.map_or(timeout, |left| timeout.min(left / SETUP_REPLIES)))
}

#[cfg(test)]
mod tests {
    use super::tls_context;
    use std::io;

    fn io_error(kind: io::ErrorKind) -> redis::RedisError {
        redis::RedisError::from(io::Error::from(kind))
    }

    #[test]
    fn tls_errors_say_tls() {
        // native-tls, through redis-rs: a handshake error with a dropped connection's kind.
        let native = redis::RedisError::from((
            redis::ErrorKind::Io,
            "SSL Handshake error",
            "certificate verify failed".to_owned(),
        ));
        assert!(native.is_connection_dropped());
        let said = tls_context(native).to_string();
        assert!(said.starts_with("TLS handshake failed"), "{said}");
        assert!(said.contains("certificate verify failed"), "{said}");
        // rustls: an I/O error of another kind.
        let rustls = io_error(io::ErrorKind::InvalidData);
        let said = tls_context(rustls).to_string();
        assert!(said.starts_with("TLS handshake failed"), "{said}");
        // A reset during the set-up.
        let said = tls_context(io_error(io::ErrorKind::ConnectionReset)).to_string();
        assert!(
            said.starts_with("the server closed the connection during the TLS set-up"),
            "{said}"
        );
        // Refusals and timeouts are not the TLS layer's.
        for kind in [io::ErrorKind::ConnectionRefused, io::ErrorKind::TimedOut] {
            let e = io_error(kind);
            let before = e.to_string();
            assert_eq!(tls_context(e).to_string(), before);
        }
    }
}
