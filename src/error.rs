//! The one error type of the crate.

use std::time::Duration;

/// Everything that can go wrong with a lock. Every variant about a lock names its key
/// ([`LockError::key`]); a [`LockError::Config`] about the client names none.
///
/// Contention is reported as an error too ([`LockError::Held`], [`LockError::Timeout`]) so that
/// `?` works in the common "take the lock or give up" code. Predicates tell the kinds apart:
/// [`is_contention`](LockError::is_contention) (someone else holds the lock),
/// [`is_timeout`](LockError::is_timeout) (a wait or a reply ran out of time),
/// [`is_transient`](LockError::is_transient) (a failover, a restart, a server that is down: it
/// goes away by itself) and [`is_config`](LockError::is_config) (a configuration mistake:
/// retrying will not help). [`Timeout`](LockError::Timeout) is both contention and a timeout,
/// so a caller that tells them apart asks [`is_contention`](LockError::is_contention) first:
///
/// ```
/// use redis_dlock::LockError;
///
/// /// What a service does with a failed acquire.
/// fn action(e: &LockError) -> &'static str {
///     if e.is_contention() {
///         "busy: someone else holds the lock (Held, Timeout); skip or try later"
///     } else if e.is_config() {
///         "misconfigured: fix the settings and redeploy; retrying will not help"
///     } else {
///         "down or slow (is_transient, is_timeout, ...): retry later"
///     }
/// }
/// # let e = LockError::Held { key: "k".into() };
/// # assert!(action(&e).starts_with("busy"));
/// ```
/// They read what the error was classified as when it was made, from the kind of the reply or
/// of the I/O failure, never from its text.
///
/// As the Rust API guidelines ask, `Display` describes this error only; the underlying cause,
/// if any, is its [`source`](std::error::Error::source). [`LockError::report`] gives the whole
/// chain on one line, for logs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The client could not reach Redis: connecting, pool checkout, I/O or a response timeout.
    #[error("lock {key:?}: connection to Redis failed")]
    #[non_exhaustive]
    Connection {
        /// The lock key.
        key: String,
        /// What the pool or the connection reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// The classification, made with the error.
        #[doc(hidden)]
        fault: Fault,
    },
    /// Redis answered with an error that is not one of the more specific variants.
    #[error("lock {key:?}: Redis answered with an error")]
    #[non_exhaustive]
    Redis {
        /// The lock key.
        key: String,
        /// The error Redis returned.
        #[source]
        source: redis::RedisError,
        /// The classification, made with the error.
        #[doc(hidden)]
        fault: Fault,
    },
    /// A single attempt (`try_lock`) found the lock held by someone else.
    #[error("lock {key:?} is held by another owner")]
    Held {
        /// The lock key.
        key: String,
    },
    /// A blocking acquire gave up: its deadline passed or its retries ran out.
    #[error(
        "lock {key:?}: gave up after {attempts} attempt{} in {}",
        if *.attempts == 1 { "" } else { "s" },
        Rounded(*.waited)
    )]
    Timeout {
        /// The lock key.
        key: String,
        /// How many acquire attempts were made.
        attempts: u32,
        /// How long the caller waited in total.
        waited: Duration,
    },
    /// An acquire won the lock, but its reply came back so late that less than the safety
    /// margin of the lifetime was left by the local clock (a paused or overloaded server, a
    /// stalled network). The win was released again (owner-checked) and no guard was handed
    /// out: another client may already have taken the lock over. Not contention: the server or
    /// the network was too slow for the lock's lifetime. A blocking acquire counts such an
    /// attempt as refused and tries again; this error is what it returns if its last attempt
    /// ended so. See [`DistributedLock::try_acquire`](crate::DistributedLock::try_acquire) for
    /// the margin.
    #[error(
        "lock {key:?}: won, but the reply came {} ms after the acquire was sent, of a {} ms \
         lifetime: less than the safety margin was left, so it was released again",
        .elapsed.as_millis(),
        .ttl.as_millis()
    )]
    LateReply {
        /// The lock key.
        key: String,
        /// From sending the acquire until its reply (milliseconds precision).
        elapsed: Duration,
        /// The lifetime the acquire asked for.
        ttl: Duration,
    },
    /// Fewer replicas than the client requires confirmed a write of the hold (an acquire, an
    /// extend or a renewal) within the confirmation's bound (see
    /// [`ClientBuilder::replica_acks`](crate::ClientBuilder::replica_acks)). A failover could
    /// lose the write, so it is not taken for a hold: an acquire's write is deleted again,
    /// owner-checked, and an extend leaves the lease as it was. Transient: a blocking acquire
    /// retries until its deadline and returns this if its last attempt ended so.
    #[error(
        "lock {key:?}: the write was confirmed by {confirmed} of the {required} replicas it \
         needs, so a failover could lose it"
    )]
    NotReplicated {
        /// The lock key.
        key: String,
        /// Replicas that confirmed the write in time.
        confirmed: u32,
        /// Replicas the client requires.
        required: u32,
    },
    /// The lock is no longer ours: it expired and was deleted or taken by another owner.
    #[error("lock {key:?} was lost: it expired or another owner holds it now")]
    Lost {
        /// The lock key.
        key: String,
    },
    /// A legacy (Classic) lock value that is not an expiry timestamp in the configured encoding.
    /// It is never overwritten: a human has to look at it.
    #[error("lock {key:?}: value {value} is not a legacy expiry timestamp ({reason})")]
    Corrupt {
        /// The lock key.
        key: String,
        /// The value found, printable (non-ASCII bytes escaped).
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The key holds a value of another Redis type (WRONGTYPE), e.g. a hash or a list.
    #[error("lock {key:?}: the key holds a value of the wrong Redis type")]
    WrongType {
        /// The lock key.
        key: String,
    },
    /// A request the lock does not grant by design: upgrading a read hold of a
    /// [`ReadWriteLock`](crate::ReadWriteLock) to write, re-entering a hold more than 10,000
    /// times, or an admin query of a lock type outside this crate. Found before any command
    /// is sent, or from the script's answer; the lock is left as it was.
    #[error("lock {key:?}: {reason}")]
    Unsupported {
        /// The lock key.
        key: String,
        /// What was asked, and why it cannot be.
        reason: String,
    },
    /// A RedLock acquire got no majority, and not because the lock is held: too many nodes
    /// failed or did not answer in time. Not contention; a blocking acquire retries it and
    /// returns it if its last attempt ended so.
    #[error(
        "lock {key:?}: no RedLock majority: {granted} granted, {refused} refused (held by \
         another owner), {failed} failed or did not answer, of {nodes} nodes (a majority is {quorum})"
    )]
    NoQuorum {
        /// The lock key.
        key: String,
        /// Nodes that granted the lock (their token was deleted again).
        granted: usize,
        /// Nodes where another owner holds the key.
        refused: usize,
        /// Nodes that failed or did not answer within the node timeout.
        failed: usize,
        /// All nodes.
        nodes: usize,
        /// Votes needed.
        quorum: usize,
        /// The first node error, if a node answered with one.
        #[source]
        source: Option<Box<LockError>>,
    },
    /// The client or a lock could not be set up: a configuration mistake, which retrying will
    /// not fix ([`is_config`](Self::is_config)): a bad URL or option of the client, an option
    /// or key a lock cannot take, a wrong password or unknown ACL user, a database the server
    /// lacks, a failed TLS handshake, a user not allowed to run the lock's commands.
    ///
    /// Or, from [`ClientBuilder::build`](crate::ClientBuilder::build) only, a server that
    /// could not be reached (connection refused or reset, no answer within the connect or
    /// command timeout): that is no mistake, and says so: [`is_config`](Self::is_config) is
    /// false and [`is_transient`](Self::is_transient) true. Build the client again later, or
    /// build it with [`lazy_connect`](crate::ClientBuilder::lazy_connect), which sends nothing
    /// until the first lock operation.
    #[error("{}: {reason}", subject(.key))]
    #[non_exhaustive]
    Config {
        /// The lock key, when a lock's options are at fault; `None` for the client's.
        key: Option<String>,
        /// What is wrong, and where (the server, the step, the option).
        reason: String,
        /// What Redis or the connection reported, if anything.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
        /// The classification, made with the error.
        #[doc(hidden)]
        fault: Fault,
    },
}

impl LockError {
    /// True for a release error after which the release may still be needed and can be tried
    /// again: a connection error (it may or may not have run), or a server's transient refusal
    /// (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`, `READONLY`: it did not run; a
    /// Cluster answers `CLUSTERDOWN` on every node while a failed primary is replaced).
    pub(crate) fn worth_retrying(&self) -> bool {
        matches!(self, LockError::Connection { .. }) || self.is_transient()
    }

    /// True for "someone else has the lock" outcomes ([`Held`](Self::Held),
    /// [`Timeout`](Self::Timeout)), false for failures.
    pub fn is_contention(&self) -> bool {
        matches!(self, LockError::Held { .. } | LockError::Timeout { .. })
    }

    /// True when time ran out: a blocking acquire gave up ([`Timeout`](Self::Timeout)), a win
    /// came back too late ([`LateReply`](Self::LateReply)), or Redis did not answer a command
    /// in time (an I/O timeout). A pool checkout or a client's `build()` that could not open
    /// a connection in time sent no command: that is [`is_transient`](Self::is_transient)
    /// instead.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            LockError::Timeout { .. } | LockError::LateReply { .. }
        ) || self.fault() == Some(Fault::Timeout)
    }

    /// True for a failure that a failover or a restart causes and that goes away by itself,
    /// so that a blocking acquire retries it until its deadline: the connection was refused,
    /// reset or dropped, or no connection could be opened (no master known yet, no node known
    /// for a Cluster slot); or the server answered `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`,
    /// `READONLY` or `LOADING`; or too few replicas confirmed a write
    /// ([`NotReplicated`](Self::NotReplicated)); or a win came back too late and was released
    /// again ([`LateReply`](Self::LateReply)); or a RedLock acquire got no majority because too
    /// many nodes failed or did not answer ([`NoQuorum`](Self::NoQuorum)). A blocking acquire
    /// retries exactly the failures this is true for.
    ///
    /// Also a [`Config`](Self::Config) error of
    /// [`ClientBuilder::build`](crate::ClientBuilder::build) that says the server could not be
    /// reached (refused, reset, no answer in time): building the client again later works
    /// once the server is back.
    ///
    /// A command that timed out is not transient: it may still run on a slow or paused server,
    /// and the caller is told at once ([`is_timeout`](Self::is_timeout)).
    pub fn is_transient(&self) -> bool {
        match self {
            LockError::NotReplicated { .. }
            | LockError::LateReply { .. }
            | LockError::NoQuorum { .. } => true,
            _ => self.fault().is_some_and(Fault::is_transient),
        }
    }

    /// True for a configuration mistake ([`Config`](Self::Config)), which retrying will not
    /// fix: a bad URL or option, an option a lock cannot take, a wrong password or unknown ACL
    /// user, a database the server lacks, a failed TLS handshake, a user not allowed to run
    /// scripts. False for a server that could not be reached when the client was built, which
    /// is [`is_transient`](Self::is_transient) instead.
    pub fn is_config(&self) -> bool {
        matches!(self, LockError::Config { fault, .. } if !fault.is_transient())
    }

    /// True when Redis refused the client's credentials or permissions: a wrong password, an
    /// unknown ACL user, no `AUTH` where one is required (`WRONGPASS`, `NOAUTH`), or a command
    /// the ACL user may not run (`NOPERM`). Read from the reply's kind, like the other
    /// predicates. Such an error is also [`is_config`](Self::is_config) when the client is
    /// built; a command refused later is a [`Redis`](Self::Redis) error.
    pub fn is_access_denied(&self) -> bool {
        self.fault() == Some(Fault::Denied)
    }

    /// The error and its chain of causes on one line (`error: cause: cause`), for logs: the
    /// `Display` of this type describes this error only. A cause whose text is already on the
    /// line is left out: some causes (redis-rs's errors) print their own source in their
    /// `Display` too, and no cause is written twice.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        for cause in std::iter::successors(std::error::Error::source(self), |c| c.source()) {
            let text = cause.to_string();
            if !text.is_empty() && !out.contains(&text) {
                out = format!("{out}: {text}");
            }
        }
        out
    }

    /// The lock key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Connection { key, .. }
            | LockError::Redis { key, .. }
            | LockError::Held { key }
            | LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::LateReply { key, .. }
            | LockError::NotReplicated { key, .. }
            | LockError::NoQuorum { key, .. }
            | LockError::Corrupt { key, .. }
            | LockError::WrongType { key }
            | LockError::Unsupported { key, .. } => Some(key),
            LockError::Config { key, .. } => key.as_deref(),
        }
    }

    /// True when no command was sent because no connection could be had for it within the
    /// connect timeout (a checkout or connect that timed out). An outage
    /// ([`is_transient`](Self::is_transient)), not a command timeout.
    pub(crate) fn nothing_sent(&self) -> bool {
        self.fault() == Some(Fault::NotConnected)
    }

    /// The classification of an error that has one.
    fn fault(&self) -> Option<Fault> {
        match self {
            LockError::Connection { fault, .. }
            | LockError::Redis { fault, .. }
            | LockError::Config { fault, .. } => Some(*fault),
            _ => None,
        }
    }

    /// Classifies a Redis error for `key`: WRONGTYPE by its code, a failure of the connection
    /// (I/O, timeout, a connection redis-rs says must be replaced) as
    /// [`Connection`](Self::Connection), any other answer as [`Redis`](Self::Redis).
    pub(crate) fn from_redis(key: &str, err: redis::RedisError) -> Self {
        let key = key.to_owned();
        if has_code(&err, &["WRONGTYPE"]) {
            LockError::WrongType { key }
        } else if is_connection_failure(&err) {
            LockError::connection(&key, Fault::of(&err), Box::new(err))
        } else {
            LockError::Redis {
                key,
                fault: Fault::of(&err),
                source: err,
            }
        }
    }

    /// A reply of a lock's script or command (`what`) that none of its outcomes matches.
    pub(crate) fn unexpected_reply(key: &str, what: &str, reply: &dyn std::fmt::Debug) -> Self {
        let detail = format!("{what}: {reply:?}");
        let err = redis::RedisError::from((redis::ErrorKind::Client, "unexpected reply", detail));
        LockError::from_redis(key, err)
    }

    /// A failure to reach Redis about `key`, classified as `fault`.
    pub(crate) fn connection(key: &str, fault: Fault, source: Cause) -> Self {
        LockError::Connection {
            key: key.to_owned(),
            source,
            fault,
        }
    }

    /// A lock option or key that cannot be (a [`Config`](Self::Config) error about `key`).
    pub(crate) fn config(key: &str, reason: impl Into<String>) -> Self {
        LockError::setup(Some(key), reason.into(), Fault::Other, None)
    }

    /// A mistake in the client's configuration (a [`Config`](Self::Config) error about no
    /// lock).
    pub(crate) fn client_config(reason: impl Into<String>) -> Self {
        LockError::setup(None, reason.into(), Fault::Other, None)
    }

    /// A set-up step of the client that failed: a [`Config`](Self::Config) error whose cause
    /// is `err`. With `down` no server was found to talk to (refused, reset, no answer in
    /// time): an error that is [`is_transient`](Self::is_transient), not
    /// [`is_config`](Self::is_config); otherwise a mistake, whatever the error's kind.
    pub(crate) fn setup_failed(
        reason: impl Into<String>,
        err: redis::RedisError,
        down: bool,
    ) -> Self {
        let fault = match Fault::of(&err) {
            _ if down => Fault::Unreachable,
            f if f.is_transient() || f == Fault::Timeout => Fault::Other,
            f => f,
        };
        LockError::setup(None, reason.into(), fault, Some(Box::new(err)))
    }

    /// A [`Config`](Self::Config) error.
    fn setup(key: Option<&str>, reason: String, fault: Fault, source: Option<Cause>) -> Self {
        LockError::Config {
            key: key.map(str::to_owned),
            reason,
            source,
            fault,
        }
    }

    /// The same error with `cause` as its source, for a [`Config`](Self::Config) error that
    /// has none (other variants are returned unchanged).
    pub(crate) fn caused_by(mut self, cause: Cause) -> Self {
        if let LockError::Config { source, .. } = &mut self {
            source.get_or_insert(cause);
        }
        self
    }

    /// The hold on `key` is no longer ours ([`Lost`](Self::Lost)).
    pub(crate) fn lost(key: &str) -> Self {
        LockError::Lost { key: key.into() }
    }

    /// A request the lock does not grant ([`Unsupported`](Self::Unsupported)).
    pub(crate) fn unsupported(key: &str, reason: impl Into<String>) -> Self {
        LockError::Unsupported {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}

/// What an error is about, in its `Display`: the lock, or the client.
fn subject(key: &Option<String>) -> String {
    key.as_ref()
        .map_or_else(|| "redis-dlock client".into(), |k| format!("lock {k:?}"))
}

/// A cause with the context a bare Redis error lacks (which server, which step), e.g. "no
/// reply from 127.0.0.1:6379 within 2 s", whose own source is the Redis error.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub(crate) struct Context {
    what: String,
    #[source]
    source: Option<redis::RedisError>,
}

impl Context {
    pub(crate) fn new(what: impl Into<String>, source: Option<redis::RedisError>) -> Self {
        Context {
            what: what.into(),
            source,
        }
    }
}

/// What kind of failure an error with a cause is, decided when the error is made from the kind
/// redis-rs gives the reply or the I/O failure (never from its text); the predicates of
/// [`LockError`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No reply, or no connection, within the time allowed.
    Timeout,
    /// The connection was refused, reset, dropped or garbled, or there is no server to connect
    /// to yet (no master named, no node for a slot, no connection free).
    Unreachable,
    /// No connection could be had for a command within the connect timeout (connecting, or
    /// waiting for a free pooled connection, timed out): nothing was sent. Retried as an
    /// outage.
    NotConnected,
    /// A server in a state that a failover or a restart passes through.
    Failover,
    /// Wrong credentials, or a command the user may not run.
    Denied,
    /// Anything else: a refusal that retrying does not change.
    Other,
}

impl Fault {
    /// The classification of a Redis error, from its kind, its server error codes and the kind
    /// of its I/O error.
    pub(crate) fn of(e: &redis::RedisError) -> Fault {
        use redis::{ErrorKind as E, ServerErrorKind as S};
        match e.kind() {
            _ if e.is_timeout() => Fault::Timeout,
            E::Server(
                S::ClusterDown | S::TryAgain | S::MasterDown | S::BusyLoading | S::ReadOnly,
            ) => Fault::Failover,
            E::Server(S::NoPerm) | E::AuthenticationFailed => Fault::Denied,
            E::Io
            | E::Parse
            | E::ClusterConnectionNotFound
            | E::MasterNameNotFoundBySentinel
            | E::NoValidReplicasFoundBySentinel => Fault::Unreachable,
            _ if has_code(e, &["NOAUTH", "WRONGPASS", "NOPERM"]) => Fault::Denied,
            _ => Fault::Other,
        }
    }

    /// Goes away by itself: see [`LockError::is_transient`].
    fn is_transient(self) -> bool {
        matches!(
            self,
            Fault::Unreachable | Fault::NotConnected | Fault::Failover
        )
    }
}

/// True when the server answered `e` with one of `codes` (also inside a pipeline's or a
/// transaction's errors, whose code redis-rs's `code()` does not give).
fn has_code(e: &redis::RedisError, codes: &[&str]) -> bool {
    e.code().is_some_and(|c| codes.contains(&c))
        || e.clone()
            .into_server_errors()
            .is_some_and(|errs| errs.iter().any(|(_, s)| codes.contains(&s.code())))
}

/// True for a failure of the connection rather than an answer: I/O, a timeout (a late reply
/// could still arrive), or a connection redis-rs says must be replaced.
pub(crate) fn is_connection_failure(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// True for a Redis error that says the credentials or the user's permissions are wrong:
/// retrying will not help.
pub(crate) fn is_access_denied(e: &redis::RedisError) -> bool {
    Fault::of(e) == Fault::Denied
}

/// A duration as people read it: `850 ms`, `1.5 s`, `12 s`.
pub(crate) struct Rounded(pub(crate) Duration);

impl std::fmt::Display for Rounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_millis() {
            ms @ 0..1_000 => write!(f, "{ms} ms"),
            // Tenths, exact in an `f64`, which prints `1.5` or `2`.
            ms @ 1_000..10_000 => write!(f, "{} s", ((ms + 50) / 100) as f64 / 10.0),
            ms => write!(f, "{} s", (ms + 500) / 1_000),
        }
    }
}

/// The cause of an error that is not a Redis error of its own (a pool's, a connection's).
pub(crate) type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Shorthand for results of this crate.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_rounded() {
        let ms = Duration::from_millis;
        assert_eq!(
            Rounded(Duration::from_nanos(1_003_142_480)).to_string(),
            "1 s"
        );
        assert_eq!(Rounded(ms(0)).to_string(), "0 ms");
        assert_eq!(Rounded(ms(850)).to_string(), "850 ms");
        assert_eq!(Rounded(ms(1_549)).to_string(), "1.5 s");
        assert_eq!(Rounded(ms(9_960)).to_string(), "10 s");
        assert_eq!(Rounded(ms(12_400)).to_string(), "12 s");
        assert!(!Rounded(Duration::MAX).to_string().is_empty());
    }

    #[test]
    fn display_says_this_error_only_and_source_gives_the_cause() {
        let cause = redis::RedisError::from((redis::ErrorKind::Io, "boom"));
        let e = LockError::from_redis("k", cause);
        assert!(matches!(e, LockError::Connection { .. }), "{e:?}");
        assert_eq!(e.to_string(), "lock \"k\": connection to Redis failed");
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.to_string().contains("boom"));
        assert!(e
            .report()
            .starts_with("lock \"k\": connection to Redis failed: "));
        assert!(e.report().contains("boom"));
        let t = LockError::Timeout {
            key: "k".into(),
            attempts: 1,
            waited: Duration::from_nanos(1_003_142_480),
        };
        assert_eq!(t.to_string(), "lock \"k\": gave up after 1 attempt in 1 s");
        assert!(t.is_contention() && t.is_timeout() && !t.is_config() && !t.is_transient());
        let t = LockError::Timeout {
            key: "k".into(),
            attempts: 3,
            waited: Duration::from_millis(20),
        };
        assert_eq!(
            t.to_string(),
            "lock \"k\": gave up after 3 attempts in 20 ms"
        );
        let c = LockError::config("k", "ttl must be at least 1 ms");
        assert_eq!(c.to_string(), "lock \"k\": ttl must be at least 1 ms");
        assert_eq!(c.key(), Some("k"));
        let c = LockError::client_config("pool size must be at least 1");
        assert_eq!(
            c.to_string(),
            "redis-dlock client: pool size must be at least 1"
        );
        assert_eq!(c.key(), None);
        assert!(std::error::Error::source(&c).is_none());
    }
}
