//! [`LockClient`]: the connection pool and shared state that locks are built from.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{LockError, Result};
use crate::scripts::Scripts;
use crate::strategy::LockBuilder;
use crate::waiters::WaitQueues;

/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: u32 = 16;
/// Default time allowed to open a connection (and to wait for a free pooled one).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for Redis to answer one command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A handle to one Redis server: a pool of connections plus the Lua scripts' SHAs.
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
    waiters: WaitQueues,
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

    /// A builder to tune the pool and timeouts before connecting.
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: Some(DEFAULT_COMMAND_TIMEOUT),
        }
    }

    /// Uses a pool the application already has.
    ///
    /// The pool's own settings apply. For the one-round-trip hot path, build it with
    /// `test_on_check_out(false)`: r2d2's default sends a `PING` on every checkout, which doubles
    /// the cost of every lock operation. Set read timeouts on its connections, or a paused Redis
    /// blocks callers for as long as the OS lets a socket wait.
    pub fn from_pool(pool: r2d2::Pool<redis::Client>) -> Self {
        Self::with_pool(Pool::External(pool))
    }

    fn with_pool(pool: Pool) -> Self {
        LockClient {
            inner: Arc::new(Inner {
                pool,
                scripts: Scripts::new(),
                waiters: WaitQueues::default(),
            }),
        }
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

    pub(crate) fn scripts(&self) -> &Scripts {
        &self.inner.scripts
    }

    /// A pooled connection; failures are reported against `key`.
    pub(crate) fn conn(&self, key: &str) -> Result<Conn> {
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
    pub(crate) fn with_conn<T>(
        &self,
        key: &str,
        f: impl FnOnce(&mut redis::Connection, &Scripts) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = self.conn(key)?;
        f(&mut conn, &self.inner.scripts).map_err(|e| LockError::from_redis(key, e))
    }
}

/// Settings for [`LockClient`], with documented defaults.
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientBuilder {
    url: String,
    pool_size: u32,
    connect_timeout: Duration,
    command_timeout: Option<Duration>,
}

impl ClientBuilder {
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
    /// without limit. After a timeout the connection stays in the pool and skips the late reply
    /// (redis-rs tracks it), so it never answers the wrong command.
    pub fn command_timeout(mut self, d: Option<Duration>) -> Self {
        self.command_timeout = d;
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
        let client = redis::Client::open(self.url.as_str()).map_err(|e| setup(Box::new(e)))?;
        let manager = Manager {
            client,
            connect_timeout: self.connect_timeout,
            command_timeout: self.command_timeout,
        };
        let pool = r2d2::Pool::builder()
            .max_size(self.pool_size)
            .min_idle(Some(0))
            // A checkout PING would double every lock operation's cost; broken connections are
            // detected by `has_broken` instead and retried by the caller's retry policy.
            .test_on_check_out(false)
            .connection_timeout(self.connect_timeout)
            .build_unchecked(manager);
        Ok(LockClient::with_pool(Pool::Managed(pool)))
    }
}

/// r2d2 manager that sets connect and command timeouts, which `redis::Client`'s own does not.
#[derive(Debug)]
pub(crate) struct Manager {
    client: redis::Client,
    connect_timeout: Duration,
    command_timeout: Option<Duration>,
}

impl r2d2::ManageConnection for Manager {
    type Connection = redis::Connection;
    type Error = redis::RedisError;

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let con = self
            .client
            .get_connection_with_timeout(self.connect_timeout)?;
        con.set_read_timeout(self.command_timeout)?;
        con.set_write_timeout(self.command_timeout)?;
        Ok(con)
    }

    fn is_valid(&self, con: &mut redis::Connection) -> redis::RedisResult<()> {
        redis::cmd("PING").query(con)
    }

    fn has_broken(&self, con: &mut redis::Connection) -> bool {
        !redis::ConnectionLike::is_open(con)
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

impl Deref for Conn {
    type Target = redis::Connection;
    fn deref(&self) -> &redis::Connection {
        match self {
            Conn::Managed(c) => c,
            Conn::External(c) => c,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut redis::Connection {
        match self {
            Conn::Managed(c) => c,
            Conn::External(c) => c,
        }
    }
}
