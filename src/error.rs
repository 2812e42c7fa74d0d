//! The one error type of the crate.

use std::time::Duration;

/// Everything that can go wrong with a lock. Every variant about a lock names its key
/// ([`LockError::key`]); only [`LockError::Setup`], which is about the client, has none.
///
/// Contention is reported as an error too ([`LockError::Held`], [`LockError::Timeout`]) so that
/// `?` works in the common "take the lock or give up" code. Predicates tell the kinds apart:
/// [`is_contention`](LockError::is_contention) (someone else holds the lock),
/// [`is_timeout`](LockError::is_timeout) (a wait or a reply ran out of time) and
/// [`is_setup`](LockError::is_setup) (the client's configuration: retrying will not help).
///
/// As the Rust API guidelines ask, `Display` describes this error only; the underlying cause,
/// if any, is its [`source`](std::error::Error::source). [`LockError::report`] gives the whole
/// chain on one line, for logs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The client could not reach Redis: connecting, pool checkout, I/O or a response timeout.
    #[error("lock {key:?}: connection to Redis failed")]
    Connection {
        /// The lock key.
        key: String,
        /// What the pool or the connection reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Redis answered with an error that is not one of the more specific variants.
    #[error("lock {key:?}: Redis answered with an error")]
    Redis {
        /// The lock key.
        key: String,
        /// The error Redis returned.
        #[source]
        source: redis::RedisError,
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
        plural(*.attempts),
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
    /// Bad input or a request the lock cannot grant by design (e.g. upgrading a read hold of a
    /// [`ReadWriteLock`](crate::ReadWriteLock) to write). Input errors are found before any
    /// command is sent.
    #[error("lock {key:?}: invalid argument: {reason}")]
    InvalidArgument {
        /// The lock key (may be empty when the key itself is the problem).
        key: String,
        /// What is wrong.
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
    /// The client could not be set up (bad URL, pool configuration).
    #[error("redis-dlock client setup failed")]
    Setup {
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl LockError {
    /// True for "someone else has the lock" outcomes ([`Held`](Self::Held),
    /// [`Timeout`](Self::Timeout)), false for failures.
    pub fn is_contention(&self) -> bool {
        matches!(self, LockError::Held { .. } | LockError::Timeout { .. })
    }

    /// True when time ran out: a blocking acquire gave up ([`Timeout`](Self::Timeout)), a win
    /// came back too late ([`LateReply`](Self::LateReply)), or Redis did not answer a command
    /// or a connection attempt in time ([`Connection`](Self::Connection) caused by a timeout).
    pub fn is_timeout(&self) -> bool {
        match self {
            LockError::Timeout { .. } | LockError::LateReply { .. } => true,
            LockError::Connection { source, .. } | LockError::Setup { source } => {
                let redis = source
                    .downcast_ref::<redis::RedisError>()
                    .or_else(|| source.downcast_ref::<Context>().and_then(Context::redis));
                redis.is_some_and(|e| e.is_timeout())
            }
            _ => false,
        }
    }

    /// True for a failure that a failover or a restart causes and that goes away by itself,
    /// so that a blocking acquire retries it until its deadline: the connection was refused,
    /// reset or dropped, or no connection could be opened (no master known yet, no node known
    /// for a Cluster slot); or the server answered `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`,
    /// `READONLY` or `LOADING`; or too few replicas confirmed a write
    /// ([`NotReplicated`](Self::NotReplicated)).
    ///
    /// A command that timed out is not transient: it may still run on a slow or paused server,
    /// and the caller is told at once ([`is_timeout`](Self::is_timeout)).
    pub fn is_transient(&self) -> bool {
        use redis::ServerErrorKind as K;
        match self {
            LockError::NotReplicated { .. } => true,
            LockError::Connection { source, .. } => {
                let redis = source
                    .downcast_ref::<redis::RedisError>()
                    .or_else(|| source.downcast_ref::<Context>().and_then(Context::redis));
                !redis.is_some_and(|e| e.is_timeout())
            }
            LockError::Redis { source, .. } => matches!(
                source.kind(),
                redis::ErrorKind::Server(
                    K::ClusterDown | K::TryAgain | K::MasterDown | K::BusyLoading | K::ReadOnly
                ) | redis::ErrorKind::ClusterConnectionNotFound
                    | redis::ErrorKind::MasterNameNotFoundBySentinel
            ),
            _ => false,
        }
    }

    /// True for a fault of the client's set-up, which retrying will not fix
    /// ([`Setup`](Self::Setup)): a bad URL or option, a wrong password or unknown ACL user, a
    /// database the server lacks, a failed TLS handshake, a user not allowed to run scripts;
    /// at open time also an unreachable server (see
    /// [`ClientBuilder::lazy_connect`](crate::ClientBuilder::lazy_connect)).
    pub fn is_setup(&self) -> bool {
        matches!(self, LockError::Setup { .. })
    }

    /// The error and its chain of causes on one line (`error: cause: cause`), for logs: the
    /// `Display` of this type describes this error only.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cause = c.source();
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
            | LockError::InvalidArgument { key, .. } => Some(key),
            LockError::Setup { .. } => None,
        }
    }

    /// Classifies a Redis error for `key`.
    pub(crate) fn from_redis(key: &str, err: redis::RedisError) -> Self {
        let key = key.to_owned();
        if err.code() == Some("WRONGTYPE")
            || err.detail().is_some_and(|d| d.contains("WRONGTYPE"))
            || err.to_string().contains("WRONGTYPE")
        {
            LockError::WrongType { key }
        } else if err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
        {
            LockError::Connection {
                key,
                source: Box::new(err),
            }
        } else {
            LockError::Redis { key, source: err }
        }
    }

    pub(crate) fn invalid(key: &str, reason: impl Into<String>) -> Self {
        LockError::InvalidArgument {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}

/// A cause with the context a bare Redis error lacks (which server, which step), e.g. "no
/// reply from 127.0.0.1:6379 within 2 s", whose own source is the Redis error.
#[derive(Debug)]
pub(crate) struct Context {
    what: String,
    source: Option<redis::RedisError>,
}

impl Context {
    pub(crate) fn new(what: impl Into<String>, source: Option<redis::RedisError>) -> Self {
        Context {
            what: what.into(),
            source,
        }
    }

    /// The Redis error behind it, if any.
    pub(crate) fn redis(&self) -> Option<&redis::RedisError> {
        self.source.as_ref()
    }
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// True for a Redis error that says the credentials or the user's permissions are wrong:
/// retrying will not help.
pub(crate) fn is_access_denied(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
}

/// "s" unless `n` is 1.
fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A duration as people read it: `850 ms`, `1.5 s`, `12 s`.
pub(crate) struct Rounded(pub(crate) Duration);

impl std::fmt::Display for Rounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1_000 {
            write!(f, "{ms} ms")
        } else if ms < 10_000 {
            let tenths = (ms + 50) / 100;
            if tenths.is_multiple_of(10) {
                write!(f, "{} s", tenths / 10)
            } else {
                write!(f, "{}.{} s", tenths / 10, tenths % 10)
            }
        } else {
            write!(f, "{} s", (ms + 500) / 1_000)
        }
    }
}

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
        let e = LockError::Connection {
            key: "k".into(),
            source: Box::new(cause),
        };
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
        assert!(t.is_contention() && t.is_timeout() && !t.is_setup());
        let t = LockError::Timeout {
            key: "k".into(),
            attempts: 3,
            waited: Duration::from_millis(20),
        };
        assert_eq!(
            t.to_string(),
            "lock \"k\": gave up after 3 attempts in 20 ms"
        );
    }
}
