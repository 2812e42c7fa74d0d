//! [`Strategy::Classic`](crate::Strategy::Classic): the legacy SETNX + GETSET timestamp lock,
//! wire-compatible with the legacy Java SETNX/GETSET lockers (the "Handling deadlocks" pattern
//! of redis.io's `SETNX` page, jedis-lock and their kin).
//!
//! The value at the key is the lock's expiry in epoch milliseconds by the client's clock,
//! `now + ttl + 1 (+ clock_skew)`, as decimal ASCII or an 8-byte big-endian integer. Wire:
//! 1. `SETNX key <expiry>` (or `SET key <expiry> NX PX <ttl>` with the `key_ttl` option) → won;
//! 2. otherwise `GET key`; an expiry still in the future → held (sleep and retry);
//! 3. a past expiry → take over: `GETSET key <expiry>`, won if the old value equals the one read
//!    (plus `PEXPIRE` with `key_ttl`), or with [`Takeover::CompareAndSet`] one `EVALSHA` of
//!    `compare_and_set.lua` that writes only if the value is still the one read;
//! 4. release: `EVALSHA unlock.lua key <our expiry>` (deletes only our exact value; the legacy
//!    lockers' plain `DEL` could delete a lock another client had since taken over).

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use crate::client::access;
use crate::client::admin;
use crate::client::admin::Detail;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lease::{printable, Lease};
use crate::lock::LockState;
use crate::lock::{self, DistributedLock};
use crate::retry::RetryPolicy;
use crate::stats::Kind;
use crate::strategy::hold;
use crate::strategy::string_value;

/// Default lifetime ("timeout") of a [`Strategy::Classic`](crate::Strategy::Classic) lock, as in the legacy lockers.
pub const CLASSIC_DEFAULT_TTL: Duration = Duration::from_secs(1);
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

/// The options only [`Strategy::Classic`](crate::Strategy::Classic) has, carried by it:
///
/// ```
/// use std::time::Duration;
/// use redis_dlock::{ClassicOptions, Encoding, Strategy, Takeover};
///
/// let strategy = Strategy::Classic(
///     ClassicOptions::new()
///         .encoding(Encoding::BigEndian)
///         .takeover(Takeover::CompareAndSet)
///         .clock_skew(Duration::from_secs(1)),
/// );
/// # let _ = strategy;
/// ```
///
/// The lifetime (the legacy lockers' "timeout") and the retries are the lock's own
/// ([`LockBuilder::ttl`](crate::LockBuilder::ttl), [`LockBuilder::retry`](crate::LockBuilder::retry)),
/// with Classic's defaults: [`CLASSIC_DEFAULT_TTL`] and [`RetryPolicy::legacy`](crate::RetryPolicy::legacy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ClassicOptions {
    /// Value encoding (default [`Encoding::Decimal`]).
    pub encoding: Encoding,
    /// Takeover of stale locks (default [`Takeover::GetSet`]).
    pub takeover: Takeover,
    /// Also give the key a Redis TTL equal to the lifetime when winning (the `EXPIRE` some
    /// legacy lockers send after acquiring; done atomically here with `SET NX PX`). Default
    /// off: the plain legacy SETNX lockers set no TTL and rely on the timestamp.
    pub key_ttl: bool,
    /// Added to the stored expiry so peers with clocks up to this far ahead do not take the
    /// lock over early (some legacy lockers use 1 s). Default zero.
    pub clock_skew: Duration,
}

impl ClassicOptions {
    /// The defaults: decimal values, GETSET takeover, no key TTL, no clock-skew allowance.
    pub const fn new() -> Self {
        ClassicOptions {
            encoding: Encoding::Decimal,
            takeover: Takeover::GetSet,
            key_ttl: false,
            clock_skew: Duration::ZERO,
        }
    }

    /// The value encoding.
    pub const fn encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// How stale locks are taken over.
    pub const fn takeover(mut self, takeover: Takeover) -> Self {
        self.takeover = takeover;
        self
    }

    /// Also set a Redis TTL equal to the lifetime on the key when winning.
    pub const fn key_ttl(mut self, on: bool) -> Self {
        self.key_ttl = on;
        self
    }

    /// Clock-skew allowance added to the stored expiry.
    pub const fn clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }
}

/// How often one attempt goes back to `SETNX` when the key vanished between our commands (a
/// holder released it): bounded, so a flapping key cannot spin us.
const VANISHED_RETRIES: u32 = 3;

/// The stats label of Classic locks.
pub(crate) const KIND: Kind = Kind::new("classic");

/// A lock of [`Strategy::Classic`](crate::Strategy::Classic). Build it with
/// [`LockBuilder`](crate::LockBuilder).
pub struct ClassicLock {
    client: LockClient,
    key: String,
    ttl: Duration,
    retry: RetryPolicy,
    opts: ClassicOptions,
}

/// What one acquire attempt found.
enum Attempt {
    Won,
    TookOver {
        expired_ms_ago: i64,
    },
    Held,
    /// The value at the key is not an expiry in our encoding; it is left alone.
    Corrupt(Vec<u8>, &'static str),
}

/// An encoded expiry: at most 20 decimal digits (with sign) or 8 bytes.
pub(crate) struct Encoded {
    buf: [u8; 20],
    len: usize,
}

impl Encoded {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Encodes an expiry timestamp.
fn encode(encoding: Encoding, expiry_ms: i64) -> Encoded {
    let mut buf = [0u8; 20];
    let len = match encoding {
        Encoding::BigEndian => {
            buf[..8].copy_from_slice(&expiry_ms.to_be_bytes());
            8
        }
        Encoding::Decimal => {
            use std::io::Write;
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            // 20 bytes hold any i64 in decimal, so this cannot fail.
            let _ = write!(cursor, "{expiry_ms}");
            cursor.position() as usize
        }
    };
    Encoded { buf, len }
}

/// 2000-01-01T00:00:00Z in epoch milliseconds. No legacy locker ever wrote an expiry before it,
/// but a later kind of legacy locker, written in Lua, stores the value `1` (with a TTL): read as a timestamp it
/// would look long expired and a live lock would be taken over. Such values are `Corrupt`.
const OLDEST_PLAUSIBLE_EXPIRY_MS: i64 = 946_684_800_000;

/// Decodes a stored expiry, or says why it is not one.
fn decode(encoding: Encoding, value: &[u8]) -> std::result::Result<i64, &'static str> {
    let expiry = decode_raw(encoding, value)?;
    if expiry < OLDEST_PLAUSIBLE_EXPIRY_MS {
        return Err("a timestamp before the year 2000, so not a legacy expiry");
    }
    Ok(expiry)
}

fn decode_raw(encoding: Encoding, value: &[u8]) -> std::result::Result<i64, &'static str> {
    match encoding {
        Encoding::BigEndian => <[u8; 8]>::try_from(value)
            .map(i64::from_be_bytes)
            .map_err(|_| "expected 8 bytes (big-endian encoding)"),
        Encoding::Decimal => std::str::from_utf8(value)
            .ok()
            .filter(|s| !s.is_empty() && s.len() <= 20)
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or("expected a decimal integer (decimal encoding)"),
    }
}

/// Wall-clock epoch milliseconds: the legacy format is defined by the client's clock.
fn now_epoch_ms(key: &str) -> Result<i64> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .map_err(|_| LockError::config(key, "the system clock is before 1970"))
}

/// The value for a hold of `ttl` starting now: `now + ttl + 1 + skew` in epoch ms, encoded.
pub(crate) fn expiry_value(
    key: &str,
    encoding: Encoding,
    ttl: Duration,
    skew: Duration,
) -> Result<Encoded> {
    let expiry = now_epoch_ms(key)? + ttl.as_millis() as i64 + 1 + skew.as_millis() as i64;
    Ok(encode(encoding, expiry))
}

impl std::fmt::Debug for ClassicLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassicLock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("options", &self.opts)
            .finish_non_exhaustive()
    }
}

impl ClassicLock {
    pub(crate) fn new(
        client: LockClient,
        key: String,
        ttl: Duration,
        retry: RetryPolicy,
        opts: ClassicOptions,
    ) -> Self {
        ClassicLock {
            client,
            key,
            ttl,
            retry,
            opts,
        }
    }

    /// The options in force.
    pub fn options(&self) -> &ClassicOptions {
        &self.opts
    }

    /// The value to store for a hold of `ttl` starting now: `now + ttl + 1 + skew`.
    fn expiry_value(&self, ttl: Duration) -> Result<Encoded> {
        expiry_value(&self.key, self.opts.encoding, ttl, self.opts.clock_skew)
    }

    /// One acquire attempt on one connection: SETNX, then GET and a takeover if stale.
    fn attempt(
        &self,
        con: &mut dyn redis::ConnectionLike,
        scripts: &crate::scripts::Scripts,
        value: &[u8],
        now_ms: i64,
        getset_sent: &Cell<bool>,
    ) -> redis::RedisResult<Attempt> {
        for _ in 0..VANISHED_RETRIES {
            if self.set_if_absent(con, value)? {
                return Ok(Attempt::Won);
            }
            let seen: Option<Vec<u8>> = redis::cmd("GET").arg(&self.key).query(con)?;
            let Some(seen) = seen else {
                continue; // released between SETNX and GET: try SETNX again at once
            };
            let expiry = match decode(self.opts.encoding, &seen) {
                Ok(expiry) => expiry,
                Err(reason) => return Ok(Attempt::Corrupt(seen, reason)),
            };
            if expiry >= now_ms {
                return Ok(Attempt::Held);
            }
            if self.opts.takeover == Takeover::GetSet {
                getset_sent.set(true);
            }
            return Ok(if self.take_over(con, scripts, &seen, value)? {
                Attempt::TookOver {
                    expired_ms_ago: now_ms - expiry,
                }
            } else {
                Attempt::Held
            });
        }
        Ok(Attempt::Held)
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// The first step: SETNX, or with `key_ttl` an atomic `SET NX PX` (the legacy SETNX then
    /// EXPIRE left a key without TTL forever if the client died in between).
    fn set_if_absent(
        &self,
        con: &mut dyn redis::ConnectionLike,
        value: &[u8],
    ) -> redis::RedisResult<bool> {
        if self.opts.key_ttl {
            let reply: Value =
                string_value::set_nx_px(&self.key, value, self.ttl_ms()).query(con)?;
            Ok(reply == Value::Okay)
        } else {
            let set: i64 = string_value::setnx(&self.key, value).query(con)?;
            Ok(set == 1)
        }
    }

    /// Takes over a stale lock whose value we read as `seen`. True if we won.
    fn take_over(
        &self,
        con: &mut dyn redis::ConnectionLike,
        scripts: &crate::scripts::Scripts,
        seen: &[u8],
        value: &[u8],
    ) -> redis::RedisResult<bool> {
        match self.opts.takeover {
            Takeover::CompareAndSet => {
                let ttl = if self.opts.key_ttl { self.ttl_ms() } else { 0 };
                let won: i64 = scripts
                    .compare_and_set
                    .eval(con, &self.key, (seen, value, ttl))?;
                if won == 1 {
                    self.client.counters().cas_takeover();
                } else {
                    log::debug!(
                        "lock {:?}: lost a compare-and-set takeover race to another contender \
                         (nothing written)",
                        self.key
                    );
                }
                Ok(won == 1)
            }
            Takeover::GetSet => {
                let old: Option<Vec<u8>> =
                    redis::cmd("GETSET").arg(&self.key).arg(value).query(con)?;
                // `None`: the key vanished just before our GETSET, which then created it: as
                // good as a SETNX win. A different value: another contender won first, and we
                // have just overwritten its expiry (the legacy GETSET flaw, see Takeover).
                let won = old.as_deref().is_none_or(|old| old == seen);
                if won {
                    self.client.counters().getset_takeover();
                } else {
                    self.client.counters().getset_overwrite();
                    log::debug!(
                        "lock {:?}: lost a GETSET takeover race and overwrote the winner's expiry",
                        self.key
                    );
                }
                if won && self.opts.key_ttl {
                    let _: i64 = redis::cmd("PEXPIRE")
                        .arg(&self.key)
                        .arg(self.ttl_ms())
                        .query(con)?;
                }
                Ok(won)
            }
        }
    }
}

impl ClassicLock {
    /// One attempt: `Ok(None)` when another owner holds the lock.
    fn try_take(&self) -> Result<Option<Lease>> {
        let start = Instant::now();
        let value = self.expiry_value(self.ttl)?;
        let value = value.as_bytes();
        let now_ms = now_epoch_ms(&self.key)?;
        // Classic without key_ttl has no Redis expiry: after `ttl` its value is stale and the
        // next acquirer takes it over, so a clean-up is needed until then at most.
        let until = start.checked_add(self.ttl).unwrap_or(start);
        // A GETSET writes our value even when it loses the race: after an unanswered GETSET,
        // our value at the key does not prove that we won, so it is not deleted.
        let getset_sent = Cell::new(false);
        let outcome = string_value::acquire(
            &self.client,
            &self.key,
            value,
            None,
            until,
            || !getset_sent.get(),
            |con, s| self.attempt(con, s, value, now_ms, &getset_sent),
        )?;
        let won =
            |lease| crate::lease::checked_win(&self.key, lease, self.ttl, |l| self.release(l));
        let result = match outcome {
            Attempt::Won => won(Lease::new(value, start, self.ttl)).map(Some),
            Attempt::TookOver { expired_ms_ago } => {
                log::info!(
                    "lock {:?}: took over a stale lock that expired {expired_ms_ago} ms ago",
                    self.key
                );
                won(Lease::new(value, start, self.ttl)).map(Some)
            }
            Attempt::Held => Ok(None),
            Attempt::Corrupt(seen, reason) => Err(LockError::Corrupt {
                key: self.key.clone(),
                value: printable(&seen),
                reason,
            }),
        };
        self.client.counters().outcome_lease(KIND, &result);
        result
    }
}

impl DistributedLock for ClassicLock {
    fn key(&self) -> &str {
        &self.key
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    fn try_acquire(&self) -> Result<Lease> {
        crate::lock::taken_or_held(&self.key, self.try_take())
    }

    fn release(&self, lease: &Lease) -> Result<bool> {
        string_value::release(&self.client, KIND, &self.key, None, None, lease)
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let ext = hold::Extending::start(&self.key, ttl)?;
        let value = self.expiry_value(ext.ttl)?;
        let redis_ttl = if self.opts.key_ttl { ext.ttl_ms() } else { 0 };
        let swapped: i64 = self.client.with_conn(&self.key, |con, s| {
            s.compare_and_set
                .eval(con, &self.key, (lease.value(), value.as_bytes(), redis_ttl))
        })?;
        let value = Some(value.as_bytes());
        ext.finish(&self.client, KIND, &self.key, swapped == 1, lease, value)
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        string_value::is_held(&self.client, &self.key, lease)
    }

    lock::guard_methods!(|this, attempts| {
        let waiters = this.client.waiters();
        let result = crate::client::acquire::acquire_blocking(this, waiters, attempts, || Ok(()));
        this.client.counters().blocking(KIND, &result);
        result
    });
}

impl crate::lock::LockAdmin for ClassicLock {
    /// Held while the stored expiry has not passed by this client's clock (the rule its
    /// acquires follow): see [`LockAdmin::state`](crate::LockAdmin::state).
    fn state(&self) -> Result<LockState> {
        let found = admin::read(&self.client, &self.key, Detail::Value)?;
        if found.is_absent() {
            return Ok(LockState::Unlocked);
        }
        if found.kind != "string" {
            return Err(LockError::WrongType {
                key: self.key.clone(),
            });
        }
        let value = found.detail.unwrap_or_default();
        let expiry = decode(self.opts.encoding, &value).map_err(|reason| LockError::Corrupt {
            key: self.key.clone(),
            value: printable(&value),
            reason,
        })?;
        let now = now_epoch_ms(&self.key)?;
        if expiry < now {
            return Ok(LockState::Unlocked);
        }
        let left = Duration::from_millis(u64::try_from(expiry - now).unwrap_or(0));
        Ok(LockState::Locked {
            ttl: Some(found.pttl.map_or(left, |p| p.min(left))),
        })
    }

    /// Deletes the key whoever holds it; publishes nothing (Classic peers poll).
    fn force_unlock(&self) -> Result<bool> {
        hold::force_unlock(&self.client, &self.key, None)
    }
}

/// The commands of a Classic lock: `SETNX` (or `SET NX PX` with `key_ttl`), `GET`, `GETSET`
/// or the compare-and-set script's `SET`, `PEXPIRE`, and the release's `GET` + `DEL`.
pub(crate) fn access_checks(client: &LockClient, key: &str) -> Vec<access::Check> {
    let mut c = access::native(client, key);
    c.extend([
        access::check("setnx", &[key, "v"]),
        access::check("set", &[key, "v", "NX", "PX", "1000"]),
        access::check("get", &[key]),
        access::check("getset", &[key, "v"]),
        access::check("pexpire", &[key, "1000"]),
        access::check("del", &[key]),
    ]);
    c
}

/// The expiries, in epoch milliseconds, that [`recognize`] takes for a Classic lock's: from
/// 2000-01-01 ([`OLDEST_PLAUSIBLE_EXPIRY_MS`]) to 2500-01-01. The upper bound keeps other
/// values of 8 bytes, or long numbers, from passing for an expiry.
const RECOGNIZED_EXPIRY_MS: std::ops::Range<i64> = OLDEST_PLAUSIBLE_EXPIRY_MS..16_725_225_600_000;

/// The expiry (epoch ms) and encoding of `value`, read at a lock key, if it has the shape of a
/// Classic lock's value in either encoding: 8 bytes that read as a big-endian expiry, or 1 to 19
/// decimal digits (no sign), in [`RECOGNIZED_EXPIRY_MS`] either way. A guess from the shape
/// alone: another tool's number in that range passes too. The two shapes cannot both fit one
/// value (a big-endian expiry starts with two zero bytes, a decimal one has 12 to 14 digits).
pub(crate) fn recognize(value: &[u8]) -> Option<(i64, Encoding)> {
    let plausible = |ms: &i64| RECOGNIZED_EXPIRY_MS.contains(ms);
    let as_encoding = |encoding| {
        decode_raw(encoding, value)
            .ok()
            .filter(plausible)
            .map(|ms| (ms, encoding))
    };
    let digits = (1..=19).contains(&value.len()) && value.iter().all(u8::is_ascii_digit);
    as_encoding(Encoding::BigEndian).or_else(|| digits.then(|| as_encoding(Encoding::Decimal))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        for ms in [0i64, 1, 1_700_000_000_123, i64::MAX, -5] {
            for enc in [Encoding::Decimal, Encoding::BigEndian] {
                assert_eq!(decode_raw(enc, encode(enc, ms).as_bytes()), Ok(ms));
            }
        }
        assert_eq!(
            decode(Encoding::Decimal, b"1700000000123"),
            Ok(1_700_000_000_123)
        );
        assert_eq!(
            encode(Encoding::Decimal, 1_700_000_000_123).as_bytes(),
            b"1700000000123"
        );
        assert_eq!(
            encode(Encoding::BigEndian, 1).as_bytes(),
            &[0, 0, 0, 0, 0, 0, 0, 1]
        );
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(decode(Encoding::Decimal, b"").is_err());
        assert!(decode(Encoding::Decimal, b"12ab").is_err());
        assert!(decode(Encoding::Decimal, b"123456789012345678901234").is_err());
        assert!(decode(Encoding::BigEndian, b"1234567").is_err());
        // A decimal value read with the big-endian encoding is 13 bytes, not 8: rejected.
        assert!(decode(Encoding::BigEndian, b"1700000000123").is_err());
        // A Lua-based legacy locker stores "1": not an expiry, never taken over as a stale one.
        assert!(decode(Encoding::Decimal, b"1").is_err());
        assert!(decode(Encoding::BigEndian, &1i64.to_be_bytes()).is_err());
    }

    #[test]
    fn classic_values_are_recognized() {
        let ms = 1_700_000_000_123;
        for enc in [Encoding::Decimal, Encoding::BigEndian] {
            assert_eq!(recognize(encode(enc, ms).as_bytes()), Some((ms, enc)));
            let written = expiry_value("k", enc, Duration::from_secs(1), Duration::ZERO);
            let written = written.expect("clock");
            assert_eq!(recognize(written.as_bytes()).map(|(_, e)| e), Some(enc));
            // Before 2000 or after 2500: not an expiry.
            assert_eq!(recognize(encode(enc, 1).as_bytes()), None);
            assert_eq!(recognize(encode(enc, 946_684_799_999).as_bytes()), None);
            assert!(recognize(encode(enc, 946_684_800_000).as_bytes()).is_some());
            assert!(recognize(encode(enc, 16_725_225_599_999).as_bytes()).is_some());
            assert_eq!(recognize(encode(enc, 16_725_225_600_000).as_bytes()), None);
            assert_eq!(recognize(encode(enc, -ms).as_bytes()), None);
        }
        // Decimal digits only: no sign, no spaces, at most 19 of them.
        assert_eq!(recognize(b"+1700000000123"), None);
        assert_eq!(recognize(b" 1700000000123"), None);
        assert_eq!(recognize(b"00000001700000000123"), None);
        assert_eq!(
            recognize(b"0000001700000000123"),
            Some((ms, Encoding::Decimal))
        );
        // Eight digits are a number before 2000, and as bytes far beyond 2500.
        assert_eq!(recognize(b"17000000"), None);
        assert_eq!(recognize(b""), None);
        assert_eq!(recognize(b"hello"), None);
    }
}
