//! [`Strategy`] picks the algorithm; [`LockBuilder`] holds every option with its default.

use std::time::Duration;

use crate::classic::ClassicLock;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lock::DistributedLock;
use crate::retry::RetryPolicy;
use crate::token::TokenLock;

/// The locking algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// `SET key token NX PX ttl` with a random 128-bit token; release and extend by Lua
    /// compare-and-delete / compare-and-pexpire. The default, and the one to pick unless legacy
    /// lockers share the keys. Default lifetime [`TOKEN_DEFAULT_TTL`], retry policy
    /// [`RetryPolicy::standard`].
    #[default]
    Token,
    /// The legacy SETNX + GETSET timestamp lock, wire-compatible with Java lockers on the same
    /// keys: the value is the expiry in epoch milliseconds (`now + ttl + 1`). Default lifetime
    /// [`CLASSIC_DEFAULT_TTL`], retry policy [`RetryPolicy::legacy`]. See [`ClassicOptions`].
    Classic,
}

/// Default lifetime of a [`Strategy::Token`] lock.
pub const TOKEN_DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Default lifetime ("timeout") of a [`Strategy::Classic`] lock, as in the legacy lockers.
pub const CLASSIC_DEFAULT_TTL: Duration = Duration::from_secs(1);
/// The longest lifetime accepted: far below the point where `now + ttl` in milliseconds
/// overflows Redis's 64-bit expiry (which Redis rejects with "invalid expire time").
pub const MAX_TTL: Duration = Duration::from_millis(1 << 52);

/// How a Classic lock encodes its expiry timestamp (epoch milliseconds) in the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Encoding {
    /// Decimal ASCII, e.g. `1700000000123` (the redis.io SETNX pattern; Java `String.valueOf`).
    #[default]
    Decimal,
    /// 8-byte big-endian signed integer (Java `ByteBuffer.putLong`).
    BigEndian,
}

/// How a Classic lock takes over a lock whose expiry timestamp has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Takeover {
    /// The legacy way: `GETSET key new`, won if the old value equals the one read. Every loser
    /// of a takeover race also overwrites the winner's value, so the winner's release finds a
    /// foreign value and the key stays locked for one more lifetime. Exactly what the legacy
    /// lockers send.
    #[default]
    GetSet,
    /// One Lua compare-and-set: replace the value only if it still equals the one read. Losers
    /// write nothing. Same value format, so legacy GETSET peers on the same key interoperate.
    CompareAndSet,
}

/// Options of [`Strategy::Classic`]; set through [`LockBuilder`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ClassicOptions {
    /// Value encoding (default [`Encoding::Decimal`]).
    pub encoding: Encoding,
    /// Takeover of stale locks (default [`Takeover::GetSet`]).
    pub takeover: Takeover,
    /// Also give the key a Redis TTL equal to the lifetime when winning (seed 001's EXPIRE
    /// after acquiring; done atomically here with `SET NX PX`). Default off: the legacy
    /// SETNX lockers set no TTL and rely on the timestamp.
    pub key_ttl: bool,
    /// Added to the stored expiry so peers with clocks up to this far ahead do not take the
    /// lock over early (seed 001 used 1 s). Default zero.
    pub clock_skew: Duration,
}

/// Builds one lock. Start from [`LockClient::lock`].
///
/// | option | default |
/// | --- | --- |
/// | [`strategy`](Self::strategy) | [`Strategy::Token`] |
/// | [`ttl`](Self::ttl) (lifetime) | Token: [`TOKEN_DEFAULT_TTL`] (10 s); Classic: [`CLASSIC_DEFAULT_TTL`] (1 s) |
/// | [`retry`](Self::retry) | Token: [`RetryPolicy::standard`] (up to 10 s, 4→32 ms jittered); Classic: [`RetryPolicy::legacy`] (5 retries, 200 ms) |
/// | [`encoding`](Self::encoding) (Classic) | [`Encoding::Decimal`] |
/// | [`takeover`](Self::takeover) (Classic) | [`Takeover::GetSet`] |
/// | [`key_ttl`](Self::key_ttl) (Classic) | off |
/// | [`clock_skew`](Self::clock_skew) (Classic) | 0 |
#[derive(Debug, Clone)]
#[must_use]
pub struct LockBuilder {
    client: LockClient,
    key: String,
    strategy: Strategy,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
    classic: ClassicOptions,
    classic_set: bool,
}

impl LockBuilder {
    pub(crate) fn new(client: LockClient, key: String) -> Self {
        LockBuilder {
            client,
            key,
            strategy: Strategy::default(),
            ttl: None,
            retry: None,
            classic: ClassicOptions::default(),
            classic_set: false,
        }
    }

    /// The algorithm.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The lifetime of a hold (Classic calls it "timeout"). At least 1 ms, at most [`MAX_TTL`];
    /// sub-millisecond parts are dropped.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How [`DistributedLock::lock`] waits.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Classic only: the value encoding.
    pub fn encoding(mut self, encoding: Encoding) -> Self {
        self.classic.encoding = encoding;
        self.classic_set = true;
        self
    }

    /// Classic only: how stale locks are taken over.
    pub fn takeover(mut self, takeover: Takeover) -> Self {
        self.classic.takeover = takeover;
        self.classic_set = true;
        self
    }

    /// Classic only: also set a Redis TTL equal to the lifetime on the key when winning.
    pub fn key_ttl(mut self) -> Self {
        self.classic.key_ttl = true;
        self.classic_set = true;
        self
    }

    /// Classic only: clock-skew allowance added to the stored expiry.
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.classic.clock_skew = skew;
        self.classic_set = true;
        self
    }

    /// Checks the options and builds the lock. Sends nothing to Redis.
    pub fn build(self) -> Result<Box<dyn DistributedLock>> {
        Ok(match self.strategy {
            Strategy::Token => Box::new(self.build_token()?),
            Strategy::Classic => Box::new(self.build_classic()?),
        })
    }

    /// Builds a [`TokenLock`] whatever [`strategy`](Self::strategy) says.
    pub fn build_token(self) -> Result<TokenLock> {
        if self.classic_set {
            return Err(LockError::invalid(
                &self.key,
                "encoding, takeover, key_ttl and clock_skew apply to Strategy::Classic only",
            ));
        }
        let (ttl, retry) = self.validate(TOKEN_DEFAULT_TTL, RetryPolicy::standard())?;
        Ok(TokenLock::new(self.client, self.key, ttl, retry))
    }

    /// Builds a [`ClassicLock`] whatever [`strategy`](Self::strategy) says.
    pub fn build_classic(self) -> Result<ClassicLock> {
        let (ttl, retry) = self.validate(CLASSIC_DEFAULT_TTL, RetryPolicy::legacy())?;
        check_duration(&self.key, "clock_skew", self.classic.clock_skew, true)?;
        Ok(ClassicLock::new(
            self.client,
            self.key,
            ttl,
            retry,
            self.classic,
        ))
    }

    fn validate(
        &self,
        default_ttl: Duration,
        default_retry: RetryPolicy,
    ) -> Result<(Duration, RetryPolicy)> {
        check_lock_options(
            &self.key,
            self.ttl.unwrap_or(default_ttl),
            self.retry.clone().unwrap_or(default_retry),
        )
    }
}

/// The checks every lock builder makes before anything is sent: a key, a lifetime of whole
/// milliseconds within [`MAX_TTL`] (returned truncated to them), a consistent retry policy.
pub(crate) fn check_lock_options(
    key: &str,
    ttl: Duration,
    retry: RetryPolicy,
) -> Result<(Duration, RetryPolicy)> {
    if key.is_empty() {
        return Err(LockError::invalid("", "the lock key is empty"));
    }
    check_duration(key, "ttl", ttl, false)?;
    retry
        .validate()
        .map_err(|reason| LockError::invalid(key, reason))?;
    Ok((Duration::from_millis(ttl.as_millis() as u64), retry))
}

/// Checks a lifetime-like duration: whole milliseconds count, at most [`MAX_TTL`].
pub(crate) fn check_duration(key: &str, what: &str, d: Duration, zero_ok: bool) -> Result<()> {
    if !zero_ok && d.as_millis() == 0 {
        return Err(LockError::invalid(
            key,
            format!("{what} must be at least 1 ms, got {d:?}"),
        ));
    }
    if d > MAX_TTL {
        return Err(LockError::invalid(
            key,
            format!("{what} {d:?} is beyond the longest Redis accepts (MAX_TTL = {MAX_TTL:?})"),
        ));
    }
    Ok(())
}
