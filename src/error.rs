//! The one error type of the crate.

use std::time::Duration;

/// Everything that can go wrong with a lock. Each variant names the lock key.
///
/// Contention is reported as an error too ([`LockError::Held`], [`LockError::Timeout`]) so that
/// `?` works in the common "take the lock or give up" code; [`LockError::is_contention`] tells
/// those apart from real failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The client could not reach Redis: connecting, pool checkout, I/O or a response timeout.
    #[error("lock {key:?}: connection to Redis failed: {source}")]
    Connection {
        /// The lock key.
        key: String,
        /// What the pool or the connection reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Redis answered with an error that is not one of the more specific variants.
    #[error("lock {key:?}: Redis error: {source}")]
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
    #[error("lock {key:?}: gave up after {attempts} attempts in {waited:?}")]
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
    /// The client could not be set up (bad URL, pool configuration).
    #[error("redis-dlock client setup failed: {source}")]
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

    /// The lock key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Connection { key, .. }
            | LockError::Redis { key, .. }
            | LockError::Held { key }
            | LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::LateReply { key, .. }
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

/// Shorthand for results of this crate.
pub type Result<T, E = LockError> = std::result::Result<T, E>;
