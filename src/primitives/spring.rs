//! [`Strategy::Spring`](crate::Strategy::Spring): a lock beside Java services on Spring
//! Integration's `RedisLockRegistry`, on the registry's keys, values and channels.
//!
//! The registry's layout, as its obtain and unlock scripts use it:
//! - key `<registryKey>:<lockKey>`, a string: the id of the registry instance that holds it (one
//!   random UUID per `RedisLockRegistry` object), with a Redis TTL of `expireAfter` (60 s by
//!   default);
//! - obtain: `GET`; the same id → `PEXPIRE` (re-entry by that registry instance); no key →
//!   `SET … PX`; another id → refused;
//! - unlock: `GET` compared with its id, then `UNLINK`; in its pub/sub mode it then publishes the
//!   lock key on `<registryKey>-channel:<registryKey>:<lockKey>` (6.4.8 and 6.5.3 on, 7.x: a
//!   pattern subscription on `<registryKey>-channel:*`) or on `<registryKey>-channel` (its
//!   earlier pub/sub releases). Its waiters wait up to `expireAfter` for that message before
//!   they try again.
//!
//! This lock speaks Token's protocol (see `token.rs`) in the registry's dialect:
//! - every hold writes a fresh random UUID: each hold of ours is a registry instance of its own,
//!   so the registry's re-entry (same id → `PEXPIRE`) never lets a Spring service into our
//!   hold, nor us into theirs; our acquire script takes a key that holds the acquire's own UUID,
//!   as the registry's obtain does (an earlier attempt of the same acquire whose reply was lost);
//! - release: compare-and-delete, then `PUBLISH` of the lock key on both channels, in the same
//!   script (or `DELIFEQ` and the two `PUBLISH`es in one pipeline): one round trip;
//! - waiters subscribe to both channels (the registry-wide one of earlier releases is shared by
//!   every lock of the registry: a release of another of its locks wakes our waiters for one
//!   refused attempt);
//! - renewal and extend: compare-and-`PEXPIRE`, as the registry's renew script.

use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lock::{DistributedLock, LockAdmin};
use crate::primitives::hold::HoldOptions;
use crate::primitives::token::{Dialect, TokenLock};
use crate::stats::Kind;

/// The stats label of Spring locks.
pub(crate) const KIND: Kind = Kind::new("spring");

/// The options of [`Strategy::Spring`](crate::Strategy::Spring): the registry key of the Spring
/// services' `RedisLockRegistry` (its constructor's `registryKey`).
///
/// The lock's key is the Redis key, `<registryKey>:<lockKey>`: build it with
/// [`key`](Self::key).
///
/// ```no_run
/// use redis_dlock::{DistributedLock, LockClient, SpringOptions, Strategy};
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// // new RedisLockRegistry(connectionFactory, "orders").obtain("invoice-42")
/// let spring = SpringOptions::new("orders");
/// let lock = client
///     .lock(spring.key("invoice-42"))
///     .strategy(Strategy::Spring(spring))
///     .build()?;
/// let _guard = lock.lock()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SpringOptions {
    registry: [u8; SpringOptions::MAX_REGISTRY_LEN],
    /// `u8::MAX`: a registry key longer than [`MAX_REGISTRY_LEN`](Self::MAX_REGISTRY_LEN), refused by `build`.
    len: u8,
}

impl SpringOptions {
    /// The longest registry key it holds: 64 bytes (kept inline, so that a
    /// [`Strategy`](crate::Strategy) stays `Copy`).
    ///
    /// The longest registry key [`SpringOptions`] holds.
    pub const MAX_REGISTRY_LEN: usize = 64;

    /// The registry key `registry` (at most [`MAX_REGISTRY_LEN`](Self::MAX_REGISTRY_LEN) bytes: a longer one is
    /// refused by [`build`](crate::LockBuilder::build) with [`LockError::Config`]).
    pub fn new(registry: &str) -> Self {
        let mut buf = [0u8; SpringOptions::MAX_REGISTRY_LEN];
        // Too long: `len` u8::MAX, refused when the lock is built.
        let len = match buf.get_mut(..registry.len()) {
            Some(slot) => {
                slot.copy_from_slice(registry.as_bytes());
                registry.len() as u8
            }
            None => u8::MAX,
        };
        SpringOptions { registry: buf, len }
    }

    /// The registry key (empty if it was too long).
    pub fn registry(&self) -> &str {
        let bytes = self.registry.get(..usize::from(self.len)).unwrap_or(&[]);
        std::str::from_utf8(bytes).unwrap_or("")
    }

    /// The Redis key of the registry's lock `lock_key` (what `obtain(lockKey)` locks):
    /// `<registryKey>:<lockKey>`.
    pub fn key(&self, lock_key: &str) -> String {
        format!("{}:{lock_key}", self.registry())
    }

    /// The channel of the registry's newer pub/sub releases for the lock at `key`:
    /// `<registryKey>-channel:<key>`.
    pub fn channel(&self, key: &str) -> String {
        format!("{}-channel:{key}", self.registry())
    }

    /// The registry-wide channel of its earlier pub/sub releases: `<registryKey>-channel`.
    pub fn registry_channel(&self) -> String {
        format!("{}-channel", self.registry())
    }
}

impl std::fmt::Debug for SpringOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpringOptions")
            .field("registry", &self.registry())
            .finish()
    }
}

/// A lock of [`Strategy::Spring`](crate::Strategy::Spring). Build it with
/// [`LockBuilder`](crate::LockBuilder).
#[derive(Debug)]
pub struct SpringLock {
    spring: SpringOptions,
    inner: TokenLock,
}

impl SpringLock {
    /// Checks `key` against the registry and builds the lock.
    pub(crate) fn new(
        client: LockClient,
        key: String,
        mut opts: HoldOptions,
        spring: SpringOptions,
    ) -> Result<Self> {
        if spring.len == u8::MAX {
            return Err(LockError::config(
                &key,
                format!(
                    "a Spring registry key is at most {} bytes",
                    SpringOptions::MAX_REGISTRY_LEN
                ),
            ));
        }
        let prefix = format!("{}:", spring.registry());
        if !key.starts_with(&prefix) {
            return Err(LockError::config(
                &key,
                format!(
                    "a Spring lock's key is <registryKey>:<lockKey>, here {prefix:?} and the lock \
                     key (SpringOptions::key builds it)"
                ),
            ));
        }
        let channels = vec![spring.channel(&key), spring.registry_channel()];
        opts.channel = channels[0].clone();
        let dialect = Dialect {
            kind: KIND,
            new_value: |_| crate::ids::new_uuid().into_bytes(),
            message: key.as_bytes().to_vec(),
            channels,
            shedlock: false,
        };
        Ok(SpringLock {
            spring,
            inner: TokenLock::with_dialect(client, key, opts, dialect),
        })
    }

    /// The Token lock that does the work.
    pub(crate) fn underneath(&self) -> &TokenLock {
        &self.inner
    }

    /// The registry's options it was built with.
    pub fn options(&self) -> &SpringOptions {
        &self.spring
    }

    /// True if the watchdog renews this lock's holds (built without an explicit ttl).
    pub fn is_watched(&self) -> bool {
        self.inner.is_watched()
    }
}

crate::primitives::hold::forward_lock!(SpringLock);

/// True if `value` has the shape of a registry's id: a UUID in its 36-character text form
/// (`8-4-4-4-12` hex digits), as Java's `UUID.toString()` writes it. (Also Classic's test of
/// the UUID of an [`Encoding::UuidMs`](crate::Encoding::UuidMs) value.)
pub(crate) fn recognizes(value: &[u8]) -> bool {
    value.len() == 36
        && value.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_registry_keys_and_channels() {
        let s = SpringOptions::new("orders");
        assert_eq!(s.registry(), "orders");
        assert_eq!(s.key("invoice:42"), "orders:invoice:42");
        assert_eq!(
            s.channel("orders:invoice:42"),
            "orders-channel:orders:invoice:42"
        );
        assert_eq!(s.registry_channel(), "orders-channel");
        assert_eq!(format!("{s:?}"), "SpringOptions { registry: \"orders\" }");
        let long = "r".repeat(SpringOptions::MAX_REGISTRY_LEN + 1);
        assert_eq!(SpringOptions::new(&long).len, u8::MAX);
        let max = "r".repeat(SpringOptions::MAX_REGISTRY_LEN);
        assert_eq!(SpringOptions::new(&max).registry(), max);
    }

    #[test]
    fn registry_ids_are_recognized() {
        assert!(recognizes(crate::ids::new_uuid().as_bytes()));
        assert!(recognizes(b"8743C9C0-0795-4907-87FD-6C719A6B4586"));
        assert!(!recognizes(b"8743c9c0-0795-4907-87fd-6c719a6b458"));
        assert!(!recognizes(b"8743c9c0x0795-4907-87fd-6c719a6b4586"));
        assert!(!recognizes(b"0123456789abcdef0123456789abcdef"));
    }
}
