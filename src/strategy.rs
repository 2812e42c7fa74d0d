//! [`Strategy`] picks the algorithm; [`LockBuilder`] holds every option with its default.

use crate::primitives::{classic, fair, hold, shedlock, spring, token};
use crate::primitives::{
    ClassicLock, ClassicOptions, Encoding, FairLock, ReentrantLock, SpringLock, SpringOptions,
    TokenLock, WakeUp,
};

use std::time::Duration;

use std::sync::Arc;

use crate::client::access;
use crate::client::builder::ClientBuilder;
use crate::client::native::needs_scripts;
use crate::client::target::ConnectionTarget;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lease::LostLock;
use crate::lock::{check_lock_options, DistributedLock, LockAdmin};
use crate::primitives::hold::{HoldOptions, HoldSettings};
use crate::primitives::redlock::{NodeClient, NodeSpec, RedLockClient, RedLockClientBuilder};
use crate::retry::RetryPolicy;
use crate::time::check_duration;

/// The locking algorithm, with the options that only it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// `SET key token NX PX ttl` with a token of the client's id and 64 random bits; release
    /// and extend by Lua
    /// compare-and-delete / compare-and-pexpire. The default, and the one to pick unless legacy
    /// lockers share the keys or a thread must re-enter its own lock. Without an explicit
    /// [`ttl`](LockBuilder::ttl) the hold is renewed by the watchdog (lease
    /// [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE)); retry policy [`RetryPolicy::standard`]; waiters woken by
    /// pub/sub.
    #[default]
    Token,
    /// The legacy SETNX + GETSET timestamp lock, wire-compatible with Java lockers on the same
    /// keys: the value is the expiry in epoch milliseconds (`now + ttl + 1`). Default lifetime
    /// [`ClassicLock::DEFAULT_TTL`](crate::ClassicLock::DEFAULT_TTL), retry policy [`RetryPolicy::legacy`]. Carries its own options
    /// (value encoding, takeover, key TTL, clock skew): `Strategy::Classic(ClassicOptions::new())`
    /// for the defaults. Never watched, fenced or woken by pub/sub: its legacy peers neither
    /// renew, count nor publish.
    Classic(ClassicOptions),
    /// A re-entrant lock in Redisson's `RLock` layout: a hash at the key whose field is the
    /// owner id `<client UUID>:<thread number>` and whose value is the hold count. A thread
    /// that holds it may take it again; it is free when every hold is released. Release
    /// publishes `0` on `redisson_lock__channel:{key}`, so Java Redisson clients and this crate
    /// can share the lock. Same defaults as [`Strategy::Token`]. See `docs/reentrant.md`.
    Reentrant,
    /// A first-come, first-served lock whose release hands it to the next waiter inside
    /// Redis: waiters queue in a sorted set in the key's slot, the release script writes the
    /// head waiter's token at the key with a short grant lease
    /// ([`FairLock::GRANT_LEASE`](crate::FairLock::GRANT_LEASE)) and publishes the grant, and the
    /// waiter's `lock()` returns on that message without another command. Same value format,
    /// lifetimes, watchdog and fencing as [`Strategy::Token`]; waiters are always woken by
    /// pub/sub ([`wake_up`](LockBuilder::wake_up) does not apply). Not wire-compatible with
    /// Token lockers or Redisson's `RFairLock` on the same key. See `docs/fair.md`.
    ///
    Fair,
    /// Beside Java services on Spring Integration's `RedisLockRegistry` (registry key in
    /// [`SpringOptions`]), on its keys `<registryKey>:<lockKey>`: Token's protocol, but each
    /// hold writes a random UUID (a registry instance's id, of which each hold of ours is one),
    /// and a release publishes the lock key on both of the registry's release channels
    /// (`<registryKey>-channel:<key>`, and `<registryKey>-channel` of its earlier versions) in
    /// the same step, so that its waiters wake at once rather than after `expireAfter`; our
    /// waiters listen on both. Same lifetimes, watchdog, retry policy and fencing as
    /// [`Strategy::Token`]. A strategy rather than an option of Token: the value is another
    /// format, whose owner is a registry instance (which re-enters its own holds), and the
    /// release publishes another message on other channels. See `docs/compatibility.md`.
    Spring(SpringOptions),
    /// For scheduled jobs beside Java services on ShedLock (`@SchedulerLock`, its Redis
    /// providers), on the job's key ([`shedlock_key`](crate::shedlock_key): `job-lock:<env>:<name>`): Token's
    /// protocol (`SET NX PX`, owner-checked release and extend), with ShedLock's values,
    /// `ADDED:<ISO-8601 UTC with ms>@<hostname>:<uuid>`, so that a Rust job and a Java job of
    /// the same name never both run. The lock's lifetime is ShedLock's `lockAtMostFor`, and
    /// [`lock_at_least`](LockBuilder::lock_at_least) its `lockAtLeastFor`. Built as a
    /// [`Lock::Token`]. A strategy, as [`Strategy::Spring`] is, because the value is another
    /// format. See `docs/compatibility.md`.
    ShedLock,
}

/// The kind of lock whose value a string at a lock key has the shape of: the answer of
/// [`Strategy::recognize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recognized {
    /// A [`Strategy::Token`] lock's value: 32 hex digits.
    Token,
    /// A [`Strategy::Fair`] lock's value: 48 hex digits (the holder client's id, then its
    /// random part).
    Fair,
    /// A [`Strategy::Spring`] lock's value, or a Spring `RedisLockRegistry`'s: a UUID in its
    /// 36-character text form.
    Spring,
    /// A [`Strategy::ShedLock`] lock's value, or a ShedLock job's:
    /// `ADDED:<time>@<hostname>[:<uuid>]`.
    ShedLock,
    /// A [`Strategy::Classic`] lock's value: an expiry timestamp between the years 2000 and
    /// 2500 in one of the [`Encoding`]s: epoch milliseconds as 8 big-endian bytes or in
    /// decimal digits, epoch seconds as a float (`1764262805.123456`), `<uuid>:<epoch ms>`, or
    /// epoch nanoseconds in decimal digits (18 or 19 of them).
    Classic {
        /// The expiry in epoch milliseconds (whatever unit the value has), by the clock of the
        /// locker that wrote it.
        expiry_ms: i64,
        /// How it was encoded: the legacy family that wrote it.
        encoding: Encoding,
    },
}

impl Strategy {
    /// Which kind of lock `value`, a string read at a lock key (`GET key`), looks like it was
    /// written by, told from its format alone; `None` for a value that no strategy of this crate
    /// writes (another tool's lock, say). Sends nothing to Redis. The formats do not overlap,
    /// so at most one kind fits.
    ///
    /// A guess from the shape: another tool's value of the same shape (32 or 48 hex digits, a
    /// number in the timestamp range) is taken for one of ours. A [`Strategy::Reentrant`] lock
    /// is a hash, not a string: tell it by the key's Redis type (`TYPE key` is `hash`).
    ///
    /// ```
    /// use redis_dlock::{Encoding, Recognized, Strategy};
    ///
    /// assert_eq!(
    ///     Strategy::recognize(b"1700000000123"),
    ///     Some(Recognized::Classic { expiry_ms: 1_700_000_000_123, encoding: Encoding::Decimal })
    /// );
    /// assert_eq!(
    ///     Strategy::recognize(b"1700000000.123"),
    ///     Some(Recognized::Classic { expiry_ms: 1_700_000_000_123, encoding: Encoding::FloatSeconds })
    /// );
    /// assert_eq!(Strategy::recognize(b"9f0c4b2e8d61a7350c2f9e4b1d8a6c73"), Some(Recognized::Token));
    /// assert_eq!(Strategy::recognize(b"1"), None);
    /// ```
    pub fn recognize(value: &[u8]) -> Option<Recognized> {
        if token::recognizes(value) {
            Some(Recognized::Token)
        } else if fair::recognizes(value) {
            Some(Recognized::Fair)
        } else if spring::recognizes(value) {
            Some(Recognized::Spring)
        } else if shedlock::recognizes(value) {
            Some(Recognized::ShedLock)
        } else {
            classic::recognize(value).map(|(expiry_ms, encoding)| Recognized::Classic {
                expiry_ms,
                encoding,
            })
        }
    }
}

/// Builds one lock. Start from [`LockClient::lock`]; [`build`](Self::build) makes a [`Lock`].
///
/// | option | applies to | default |
/// | --- | --- | --- |
/// | [`strategy`](Self::strategy) | | [`Strategy::Token`] |
/// | [`ttl`](Self::ttl) (lifetime) | every strategy | Token, Reentrant, Fair, Spring, ShedLock: none, the watchdog renews a lease of [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE) (30 s); Classic: [`ClassicLock::DEFAULT_TTL`](crate::ClassicLock::DEFAULT_TTL) (1 s) |
/// | [`retry`](Self::retry) | every strategy | all but Classic: [`RetryPolicy::standard`] (up to 10 s, 4→32 ms jittered); Classic: [`RetryPolicy::legacy`] (5 retries, 200 ms) |
/// | [`check_access`](Self::check_access) | every strategy | off |
/// | [`watchdog_lease`](Self::watchdog_lease) | watched locks (every strategy but Classic) | [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE), renewed every third |
/// | [`on_lost`](Self::on_lost) | watched locks | none |
/// | [`fencing`](Self::fencing) | Token, Reentrant, Fair, Spring, ShedLock | off |
/// | [`wake_up`](Self::wake_up) | Token, Reentrant, Spring, ShedLock | [`WakeUp::PubSub`] |
/// | [`lock_at_least`](Self::lock_at_least) | Token, Spring, ShedLock | none: a release frees the lock |
///
/// Classic's and Spring's own options travel in their [`Strategy`] variant ([`ClassicOptions`],
/// [`SpringOptions`]). The options of the watched locks given to a Classic lock, `wake_up` given
/// to a Fair one, and `lock_at_least` given to a Reentrant, Fair or Classic one, are refused by
/// `build` with [`LockError::Config`].
#[derive(Clone)]
#[must_use]
pub struct LockBuilder {
    client: LockClient,
    key: String,
    strategy: Strategy,
    /// Every option but the strategy's own and `check_access`.
    hold: HoldSettings,
    check_access: bool,
}

impl std::fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBuilder")
            .field("key", &self.key)
            .field("strategy", &self.strategy)
            .field("ttl", &self.hold.ttl)
            .field("retry", &self.hold.retry)
            .field("watchdog_lease", &self.hold.watchdog_lease)
            .field("on_lost", &self.hold.on_lost.is_some())
            .field("fencing", &self.hold.fencing)
            .field("wake_up", &self.hold.wake_up)
            .finish_non_exhaustive()
    }
}

/// The facade's way in: the client's builder of locks. (The client itself, in `client/`, is the
/// runtime and names no lock type.)
impl LockClient {
    /// Starts building a lock on `key`: a mutex by [`Strategy`]. See [`LockBuilder`] for the
    /// options and defaults. A read-write lock comes from [`rw_lock`](Self::rw_lock), a RedLock
    /// from [`RedLockClient::lock`](crate::RedLockClient::lock).
    pub fn lock(&self, key: impl Into<String>) -> LockBuilder {
        LockBuilder {
            client: self.clone(),
            key: key.into(),
            strategy: Strategy::default(),
            hold: HoldSettings::default(),
            check_access: false,
        }
    }
}

impl LockBuilder {
    /// Default lease of a watched lock ([`watchdog_lease`](Self::watchdog_lease)): 30 s,
    /// Redisson's `lockWatchdogTimeout`.
    pub const DEFAULT_WATCHDOG_LEASE: Duration = crate::lease::WATCHDOG_DEFAULT_LEASE;

    crate::primitives::hold::setters! {
        /// The algorithm, with its own options ([`Strategy::Classic`] carries [`ClassicOptions`]).
        strategy(strategy: Strategy) => strategy = strategy;
        /// The lifetime of a hold (Classic calls it "timeout"). At least 1 ms, at most [`MAX_TTL`](crate::MAX_TTL);
        /// sub-millisecond parts are dropped. An explicit lifetime turns the watchdog off: the hold
        /// expires after `ttl` unless the holder extends it.
        ttl(ttl: Duration) => hold.ttl = Some(ttl);
        /// How [`DistributedLock::lock`] waits.
        retry(policy: RetryPolicy) => hold.retry = Some(policy);
        /// Watched locks (Token, Reentrant, Fair built without [`ttl`](Self::ttl)): the lease,
        /// renewed by the client's watchdog every third of it while the hold lives. Default
        /// [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE). A holder that dies stops
        /// renewing, so its lock frees within one lease.
        watchdog_lease(lease: Duration) => hold.watchdog_lease = Some(lease);
        /// Watched locks: called (on the watchdog's thread) when a hold is lost: a renewal found it
        /// gone, or renewals failed until its loss deadline
        /// ([`Lease::loss_deadline`](crate::Lease::loss_deadline): before the lease can end on the
        /// server), when it is called at the latest. The holder's guard reports it too
        /// ([`LockGuard::is_lost`](crate::LockGuard::is_lost)). Keep it short; it must not block.
        on_lost(callback: impl Fn(&LostLock) + Send + Sync + 'static)
            => hold.on_lost = Some(Arc::new(callback));
        /// Token, Reentrant and Fair: each new hold gets a fencing token, a `u64` strictly greater
        /// than every earlier hold's ([`LockGuard::fence`](crate::LockGuard::fence)), from an `INCR`
        /// of the counter `dlock_fence:{key}` in the acquire script. See `docs/fencing.md` for how
        /// the protected resource must check it.
        fencing() => hold.fencing = true;
        /// Token and Reentrant: how waiters learn of a release (default [`WakeUp::PubSub`]). Fair
        /// waiters are always woken by the grant message.
        wake_up(wake_up: WakeUp) => hold.wake_up = Some(wake_up);
        /// [`build`](Self::build) also asks the server (one round trip, nothing run) whether the
        /// client's ACL user may send every command this lock will send, on its key, companion
        /// keys and channel (Redis 7.0+, `redis.acl_check_cmd`). A denied command is a
        /// [`LockError::Config`] naming the command, its key or channel, and NOPERM, before the
        /// first acquire: without the check, a user who may `SET` but not run the release script or
        /// `PUBLISH` on the channel acquires and then cannot release. Worth calling once at start-up
        /// with a representative key; docs/production.md lists the rules.
        ///
        /// For [`Strategy::Fair`] the check covers the fair lock's key, its queue's two sorted
        /// sets, the fencing counter, and the grant channels: this client's own
        /// `dlock_fair_ch:<client id>`, and a representative other client's, since a release
        /// publishes its grant on the grantee's channel (the ACL needs `&dlock_fair_ch:*`).
        ///
        /// Where the client uses native commands (Valkey: `DELIFEQ`, `SET … IFEQ`), they are
        /// checked too. A client whose user may not run scripts (possible on Valkey 9.0 and later)
        /// cannot ask by script: it sends each of the lock's commands once, in one pipeline, in a
        /// form that changes nothing (the release's `PUBLISH` wakes the lock's waiters, who find it
        /// as it was), and reports each `NOPERM`; the subscriber's `SUBSCRIBE` is not checked then.
        check_access() => check_access = true;
        /// Token and Spring: a release within `at_least` of the acquire does not free the lock: it
        /// keeps the hold until `at_least` after the acquire (an owner-checked `PEXPIRE` to the
        /// rest of it, one round trip) and lets it expire then, as ShedLock's `lockAtLeastFor`
        /// does, so that a job that finished early is not run again by another node meanwhile. A
        /// release after `at_least` frees the lock at once. The release is published (and this
        /// client's waiters woken) only when it frees the lock. At least 1 ms, at most
        /// [`MAX_TTL`](crate::MAX_TTL).
        lock_at_least(at_least: Duration) => hold.at_least = Some(at_least);
    }

    /// Checks the options and builds the lock. Sends nothing to Redis, unless
    /// [`check_access`](Self::check_access) was asked for.
    pub fn build(self) -> Result<Lock> {
        self.check_applies()?;
        let (client, key) = (self.client.clone(), self.key.clone());
        let lock = match self.strategy {
            Strategy::Classic(opts) => Lock::Classic(self.build_classic(opts)?),
            strategy => {
                let opts = HoldOptions::checked(&self.key, self.hold.clone())?;
                // Reentrant and Fair always run scripts, Token's protocol only for fencing.
                let fenced = opts.fence_key.is_some();
                let scripted = match strategy {
                    Strategy::Reentrant => Some("a reentrant lock"),
                    Strategy::Fair => Some("a fair lock"),
                    Strategy::Spring(_) => fenced.then_some("a Spring lock with fencing"),
                    _ => fenced.then_some("a Token lock with fencing"),
                };
                if let Some(what) = scripted {
                    needs_scripts(self.client.native(), &self.key, what)?;
                }
                match strategy {
                    Strategy::Reentrant => Lock::Reentrant(ReentrantLock::new(client, key, opts)),
                    Strategy::Fair => Lock::Fair(FairLock::new(client, key, opts)?),
                    Strategy::Spring(spring) => {
                        Lock::Spring(SpringLock::new(client, key, opts, spring)?)
                    }
                    _ => {
                        let dialect = if strategy == Strategy::ShedLock {
                            shedlock::dialect(&opts.channel)
                        } else {
                            token::Dialect::token(&opts.channel)
                        };
                        Lock::Token(TokenLock::with_dialect(client, key, opts, dialect))
                    }
                }
            }
        };
        if self.check_access {
            self.verify(&lock)?;
        }
        Ok(lock)
    }

    /// [`check_access`](Self::check_access): asks the server whether the client may send the
    /// commands of `lock`.
    fn verify(&self, lock: &Lock) -> Result<()> {
        let (client, key) = (&self.client, self.key.as_str());
        let (what, checks) = match lock {
            Lock::Token(l) => ("Token lock", token::access_checks(client, key, l)),
            Lock::Classic(_) => ("Classic lock", classic::access_checks(client, key)),
            Lock::Reentrant(l) => ("reentrant lock", l.access_checks()),
            Lock::Fair(l) => ("fair lock", l.access_checks()),
            Lock::Spring(l) => (
                "Spring lock",
                token::access_checks(client, key, l.underneath()),
            ),
        };
        access::verify(client, key, what, &checks)
    }

    /// Refuses the options that do not apply to the strategy: those of Token (Spring,
    /// ShedLock) alone, `wake_up` for Fair, those of the watched locks for Classic.
    fn check_applies(&self) -> Result<()> {
        let h = &self.hold;
        let watched = h.watchdog_lease.is_some() || h.on_lost.is_some() || h.fencing;
        let at_least = |name| {
            format!("lock_at_least applies to Strategy::Token, Spring and ShedLock, not {name}")
        };
        let refused = match self.strategy {
            Strategy::Reentrant if h.at_least.is_some() => at_least("Reentrant"),
            Strategy::Fair if h.at_least.is_some() => at_least("Fair"),
            Strategy::Classic(_) if h.at_least.is_some() => at_least("Classic"),
            Strategy::Fair if h.wake_up.is_some() => "wake_up does not apply to Strategy::Fair \
                (its waiters are always woken by the grant message)"
                .into(),
            Strategy::Classic(_) if watched || h.wake_up.is_some() => {
                "watchdog_lease, on_lost, fencing and wake_up do not apply to Strategy::Classic \
                 (its legacy peers neither renew, count nor publish)"
                    .into()
            }
            _ => return Ok(()),
        };
        Err(LockError::config(&self.key, refused))
    }

    fn build_classic(&self, opts: ClassicOptions) -> Result<ClassicLock> {
        let (ttl, retry) = check_lock_options(
            &self.key,
            self.hold.ttl.unwrap_or(ClassicLock::DEFAULT_TTL),
            self.hold.retry.clone().unwrap_or_else(RetryPolicy::legacy),
        )?;
        check_duration(&self.key, "clock_skew", opts.clock_skew, true)?;
        needs_scripts(self.client.native(), &self.key, "a Classic lock")?;
        Ok(ClassicLock {
            client: self.client.clone(),
            key: self.key.clone(),
            ttl,
            retry,
            opts,
        })
    }
}

/// A lock built by [`LockBuilder::build`]: one variant per [`Strategy`], each the typed lock
/// with what only that algorithm offers (a [`FairLock`]'s queue key, a [`ReentrantLock`]'s hold
/// count). `Lock` itself is a [`DistributedLock`] and a [`LockAdmin`]: most code never looks
/// inside.
///
/// ```no_run
/// use redis_dlock::{DistributedLock, Lock, LockClient, Strategy};
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let lock = client.lock("jobs:import").strategy(Strategy::Reentrant).build()?;
/// let _guard = lock.lock()?;
/// if let Lock::Reentrant(reentrant) = &lock {
///     assert_eq!(reentrant.hold_count()?, 1);
/// }
/// # Ok(()) }
/// ```
#[non_exhaustive]
pub enum Lock {
    /// [`Strategy::Token`].
    Token(TokenLock),
    /// [`Strategy::Classic`].
    Classic(ClassicLock),
    /// [`Strategy::Reentrant`].
    Reentrant(ReentrantLock),
    /// [`Strategy::Fair`].
    Fair(FairLock),
    /// [`Strategy::Spring`].
    Spring(SpringLock),
}

/// The typed lock's own: `TokenLock { key: .., .. }`.
impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.underneath().fmt(f)
    }
}

impl Lock {
    /// The typed lock inside, which does the work of every method.
    fn underneath(&self) -> &dyn LockAdmin {
        match self {
            Lock::Token(l) => l,
            Lock::Classic(l) => l,
            Lock::Reentrant(l) => l,
            Lock::Fair(l) => l,
            Lock::Spring(l) => l,
        }
    }

    /// The strategy the lock was built with, with its options.
    pub fn strategy(&self) -> Strategy {
        match self {
            Lock::Token(l) if l.dialect.shedlock => Strategy::ShedLock,
            Lock::Token(_) => Strategy::Token,
            Lock::Classic(l) => Strategy::Classic(*l.options()),
            Lock::Reentrant(_) => Strategy::Reentrant,
            Lock::Fair(_) => Strategy::Fair,
            Lock::Spring(l) => Strategy::Spring(*l.options()),
        }
    }

    /// True when its holds are renewed by the client's watchdog (built without a `ttl`; never
    /// for Classic).
    pub fn is_watched(&self) -> bool {
        match self {
            Lock::Token(l) => l.is_watched(),
            Lock::Classic(_) => false,
            Lock::Reentrant(l) => l.is_watched(),
            Lock::Fair(l) => l.is_watched(),
            Lock::Spring(l) => l.is_watched(),
        }
    }
}

/// `FairLock::try_from(lock)` and `<&FairLock>::try_from(&lock)`: the typed lock inside a
/// [`Lock`], or the `Lock` back when it is of another strategy.
macro_rules! typed {
    ($($variant:ident($ty:ty)),*) => {$(
        impl TryFrom<Lock> for $ty {
            type Error = Lock;
            fn try_from(lock: Lock) -> std::result::Result<Self, Lock> {
                match lock {
                    Lock::$variant(l) => Ok(l),
                    other => Err(other),
                }
            }
        }

        impl<'a> TryFrom<&'a Lock> for &'a $ty {
            type Error = &'a Lock;
            fn try_from(lock: &'a Lock) -> std::result::Result<Self, &'a Lock> {
                match lock {
                    Lock::$variant(l) => Ok(l),
                    other => Err(other),
                }
            }
        }
    )*};
}

typed!(
    Token(TokenLock),
    Classic(ClassicLock),
    Reentrant(ReentrantLock),
    Fair(FairLock),
    Spring(SpringLock)
);

hold::forward_lock!(Lock);

/// A RedLock's nodes given as URLs: each one a [`LockClient`] built by a [`ClientBuilder`].
impl RedLockClient {
    /// Connects to the independent masters at `nodes` (`redis://host:port/db`, or anything else
    /// [`LockClient::open`] takes) with the default settings ([`RedLockClientBuilder::DEFAULT_NODE_TIMEOUT`](crate::RedLockClientBuilder::DEFAULT_NODE_TIMEOUT),
    /// [`RedLockClientBuilder::DEFAULT_WORKERS`](crate::RedLockClientBuilder::DEFAULT_WORKERS)).
    pub fn open<T: ConnectionTarget + Clone>(nodes: &[T]) -> Result<Self> {
        Self::builder(nodes).build()
    }

    /// A builder for the independent masters at `nodes`, to tune the node timeout and workers.
    /// Each node gets its own [`LockClient`], built as [`LockClient::builder`] builds one (its
    /// defaults, among them the connect timeout, and TLS for `rediss://` URLs), with a command
    /// timeout equal to the node timeout, a pool of one connection per worker and a lazy
    /// connect; [`node_options`](RedLockClientBuilder::node_options) changes any of it (TLS
    /// certificates, the connect timeout, …). A malformed URL is reported by
    /// [`RedLockClientBuilder::build`].
    pub fn builder<T: ConnectionTarget + Clone>(nodes: &[T]) -> RedLockClientBuilder {
        let infos = nodes
            .iter()
            .cloned()
            .map(ConnectionTarget::into_target_info)
            .collect();
        RedLockClientBuilder::new(NodeSpec::Targets(infos, redlock_node(|node| node)))
    }
}

/// How a RedLock node given as a URL becomes a client: [`LockClient::builder`] with the
/// RedLock settings (the node timeout as the command timeout, a connection per worker, a lazy
/// connect), then the application's `options`.
fn redlock_node(
    options: impl Fn(ClientBuilder) -> ClientBuilder + Send + Sync + 'static,
) -> NodeClient {
    Arc::new(move |info, workers, node_timeout| {
        let node = LockClient::builder(info)
            .pool_size(workers)
            .command_timeout(Some(node_timeout))
            .lazy_connect();
        options(node).build()
    })
}

impl RedLockClientBuilder {
    /// Settings for every node given as a URL: `options` gets the node's [`ClientBuilder`],
    /// with the RedLock settings already applied (the node timeout as its command timeout, a
    /// connection per worker, a lazy connect), and returns it changed: TLS certificates, a
    /// connect or command timeout, replica confirmation, a pool size. Nodes given as clients
    /// ([`RedLockClient::from_clients`]) are left as they are. A later call replaces an earlier
    /// one.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redis_dlock::RedLockClient;
    /// # fn main() -> Result<(), redis_dlock::LockError> {
    /// let client = RedLockClient::builder(&[
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .node_options(|node| node.connect_timeout(Duration::from_millis(500)))
    /// .build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// With the `tls-rustls` or `tls-native-tls` feature, certificates for `rediss://` nodes:
    /// `.node_options(move |node| node.tls_certificates(certs.clone()))`.
    pub fn node_options(
        mut self,
        options: impl Fn(ClientBuilder) -> ClientBuilder + Send + Sync + 'static,
    ) -> Self {
        if let NodeSpec::Targets(_, node_client) = &mut self.nodes {
            *node_client = redlock_node(options);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_recognized() {
        let ms = 1_700_000_000_123;
        let classic = |encoding| {
            Some(Recognized::Classic {
                expiry_ms: ms,
                encoding,
            })
        };
        assert_eq!(
            Strategy::recognize(b"0123456789abcdef0123456789abcdef"),
            Some(Recognized::Token)
        );
        assert_eq!(
            Strategy::recognize(b"0123456789abcdef0123456789abcdef0123456789abcdef"),
            Some(Recognized::Fair)
        );
        let be = ms.to_be_bytes();
        for (value, encoding) in [
            (&b"1700000000123"[..], Encoding::Decimal),
            (&be[..], Encoding::BigEndian),
            (b"1700000000.123", Encoding::FloatSeconds),
            (
                b"8743c9c0-0795-4907-87fd-6c719a6b4586:1700000000123",
                Encoding::UuidMs,
            ),
            (b"1700000000123000000", Encoding::Nanos),
        ] {
            assert_eq!(Strategy::recognize(value), classic(encoding), "{value:?}");
        }
        for other in [
            &b""[..],
            b"1",
            b"hello",
            b"0123456789abcdef",
            b"0123456789abcdef0123456789abcdef0",
            b"8743c9c0-0795-4907-87fd-6c719a6b4586:1",
        ] {
            assert_eq!(Strategy::recognize(other), None, "{other:?}");
        }
    }
}
