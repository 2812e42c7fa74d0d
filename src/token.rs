//! [`Strategy::Token`](crate::Strategy::Token): `SET key token NX PX ttl`, released and extended
//! by Lua compare-and-delete / compare-and-pexpire.
//!
//! Wire, per operation (one round trip each):
//! - acquire: `SET key <32 hex chars> NX PX <ttl ms>` → `OK` (ours) or nil (held);
//! - release: `EVALSHA <unlock.lua> 1 key <token>` → 1 (deleted) or 0 (not ours);
//! - extend: `EVALSHA <extend.lua> 1 key <token> <ttl ms>` → 1 or 0;
//! - check: `GET key`, compared with our token.

use std::time::{Duration, Instant};

use rand::Rng;
use redis::Value;

use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lock::{self, DistributedLock, Lease, LockGuard};
use crate::retry::{Attempts, RetryPolicy};
use crate::strategy::check_duration;
use crate::string_value;

/// A lock of [`Strategy::Token`](crate::Strategy::Token). Build it with
/// [`LockBuilder`](crate::LockBuilder).
#[derive(Debug)]
pub struct TokenLock {
    client: LockClient,
    key: String,
    ttl: Duration,
    ttl_ms: u64,
    retry: RetryPolicy,
}

/// A fresh random owner token: 128 bits from the thread-local CSPRNG, as 32 lowercase hex
/// characters, without allocating.
pub(crate) fn new_token() -> [u8; 32] {
    let bytes: [u8; 16] = rand::rng().random();
    let mut out = [0u8; 32];
    // Cannot fail: 16 bytes always fill exactly 32 hex characters.
    let _ = hex::encode_to_slice(bytes, &mut out);
    out
}

impl TokenLock {
    pub(crate) fn new(client: LockClient, key: String, ttl: Duration, retry: RetryPolicy) -> Self {
        TokenLock {
            client,
            key,
            ttl,
            ttl_ms: ttl.as_millis() as u64,
            retry,
        }
    }

    /// Called when a blocking acquire gives up: a key of another type can never be locked, so
    /// say that rather than "timeout". Costs one `TYPE`, only on this slow path.
    fn check_type(&self) -> Result<()> {
        let kind: String = self.client.with_conn(&self.key, |con, _| {
            redis::cmd("TYPE").arg(&self.key).query(con)
        })?;
        match kind.as_str() {
            "string" | "none" => Ok(()),
            _ => Err(LockError::WrongType {
                key: self.key.clone(),
            }),
        }
    }
}

impl DistributedLock for TokenLock {
    fn key(&self) -> &str {
        &self.key
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    fn try_acquire(&self) -> Result<Option<Lease>> {
        let token = new_token();
        let start = Instant::now();
        let reply: Value = self.client.with_conn(&self.key, |con, _| {
            string_value::set_nx_px(&self.key, &token, self.ttl_ms).query(con)
        })?;
        Ok(match reply {
            Value::Okay => Some(Lease::new(&token, start, self.ttl)),
            _ => None,
        })
    }

    fn release(&self, lease: &Lease) -> Result<bool> {
        string_value::release(&self.client, &self.key, lease)
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        check_duration(&self.key, "ttl", ttl, false)?;
        let ttl = Duration::from_millis(ttl.as_millis() as u64);
        let start = Instant::now();
        let extended: i64 = self.client.with_conn(&self.key, |con, s| {
            s.extend
                .eval(con, &self.key, (lease.value(), ttl.as_millis() as u64))
        })?;
        string_value::extended(&self.key, extended == 1, lease, None, start, ttl)
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        string_value::is_held(&self.client, &self.key, lease)
    }

    fn try_lock(&self) -> Result<LockGuard<'_>> {
        lock::acquire_once(self)
    }

    fn lock(&self) -> Result<LockGuard<'_>> {
        lock::acquire_blocking(
            self,
            self.client.waiters(),
            Attempts::new(&self.retry),
            || self.check_type(),
        )
    }

    fn try_lock_for(&self, wait: Duration) -> Result<LockGuard<'_>> {
        lock::acquire_blocking(
            self,
            self.client.waiters(),
            Attempts::for_duration(&self.retry, wait),
            || self.check_type(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_hex_and_distinct() {
        let a = new_token();
        let b = new_token();
        assert!(a.iter().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
