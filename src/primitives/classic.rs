//! [`Strategy::Classic`](crate::Strategy::Classic): the legacy SETNX + GETSET timestamp lock,
//! wire-compatible with the legacy SETNX/GETSET lockers (the "Handling deadlocks" pattern of
//! redis.io's `SETNX` page, jedis-lock, redis-py's first `Lock`, retools, gorlock and their kin).
//!
//! The value at the key is the lock's expiry by the client's clock, `now + ttl (+ clock_skew)`,
//! in the format of one legacy family ([`Encoding`]): epoch milliseconds as decimal ASCII or an
//! 8-byte big-endian integer, epoch seconds as a Python float, `<uuid>:<epoch ms>`, or epoch
//! nanoseconds. Wire:
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
use crate::client::cleanup::NOT_REPLICATED;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lease::{printable, Lease};
use crate::lock::{self, DistributedLock, LockState};
use crate::primitives::hold;
use crate::primitives::spring::recognizes as is_uuid;
use crate::primitives::string_value;
use crate::retry::RetryPolicy;
use crate::stats::Kind;

/// How a Classic lock encodes its expiry timestamp in the value: the format of the legacy
/// family that shares its keys. Every client of one key must use one encoding (a value in
/// another format is [`LockError::Corrupt`] to us, and some families take it over as expired:
/// see `docs/compatibility.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Encoding {
    /// Epoch milliseconds in decimal ASCII, `now + ttl + 1`, e.g. `1700000000123` (the redis.io
    /// SETNX pattern; jedis-lock 1.0.0; Java `String.valueOf`).
    #[default]
    Decimal,
    /// Epoch milliseconds as an 8-byte big-endian signed integer (Java `ByteBuffer.putLong`).
    BigEndian,
    /// Epoch **seconds** as a Python float, written as Python's `repr(float)` does: the
    /// shortest digits that read back as the same float, with at least one decimal, e.g.
    /// `1764262805.123456` or `1764262806.0` (redis-py's `Lock` before 2.10, retools' `Lock`
    /// up to 0.3). We write `now + ttl` to the microsecond; we read any `<digits>.<digits>`,
    /// so redis-py's "forever" (`2147483649.0`, in 2038) reads as held.
    FloatSeconds,
    /// `<uuid>:<epoch ms>`, e.g. `8743c9c0-0795-4907-87fd-6c719a6b4586:1700000000123` (jedis-lock
    /// after 1.0.0: a UUID per lock object, then `now + ttl + 1`). Our UUID is the client's
    /// [`instance_id`](crate::LockClient::instance_id), in the canonical lowercase 8-4-4-4-12
    /// form. jedis-lock also takes over a live value that carries its own UUID (re-entry); we
    /// do not: a live value with our UUID is another thread's hold of this client, and is held.
    UuidMs,
    /// Epoch **nanoseconds** in decimal ASCII, `now + ttl`, e.g. `1764262805123456789` (Go's
    /// gorlock, which also sets a Redis TTL: give the lock `key_ttl` to match).
    Nanos,
}

/// How a Classic lock takes over a lock whose expiry timestamp has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Takeover {
    /// The legacy way: `GETSET key new`, won if the old value equals the one read. Every loser
    /// of a takeover race also overwrites the winner's value (the legacy flaw). This client,
    /// when it loses, puts the winner's value back at once with a compare-and-set (one more
    /// round trip, on a lost race only), unless the key changed since; a legacy locker that
    /// loses leaves its own value, so the winner's release finds a foreign value. Otherwise
    /// exactly what the legacy lockers send.
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
/// with Classic's defaults: [`ClassicLock::DEFAULT_TTL`](crate::ClassicLock::DEFAULT_TTL) and [`RetryPolicy::legacy`](crate::RetryPolicy::legacy).
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
    pub(crate) client: LockClient,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) opts: ClassicOptions,
}

/// What one acquire attempt found.
enum Attempt {
    /// Set, or taken over from a stale hold.
    Won,
    Held,
    /// The value at the key is not an expiry in our encoding; it is left alone.
    Corrupt(Vec<u8>, &'static str),
}

const NS_PER_US: i128 = 1_000;
const NS_PER_MS: i128 = 1_000_000;
const NS_PER_S: i128 = 1_000_000_000;

/// Encodes an expiry, `expiry_ns` epoch nanoseconds, in `encoding` (millisecond encodings drop
/// the sub-millisecond part, the float one the sub-microsecond part). `owner`: the UUID of a
/// [`Encoding::UuidMs`] value. At most 20 decimal digits (with sign), a float of at most 24
/// characters, 8 bytes, or a 36-character UUID, `:` and 20 digits.
fn encode(encoding: Encoding, owner: &str, expiry_ns: i128) -> Vec<u8> {
    let ms = expiry_ns.div_euclid(NS_PER_MS) as i64;
    match encoding {
        Encoding::BigEndian => ms.to_be_bytes().to_vec(),
        Encoding::Decimal => ms.to_string().into_bytes(),
        Encoding::UuidMs => format!("{owner}:{ms}").into_bytes(),
        Encoding::Nanos => (expiry_ns as i64).to_string().into_bytes(),
        Encoding::FloatSeconds => {
            let secs = expiry_ns.div_euclid(NS_PER_US) as f64 / 1e6;
            // Rust's `{:?}` for f64 is the shortest round-trip digits with `.0` for a whole
            // number, as Python's repr (no exponent below 1e16 s).
            format!("{secs:?}").into_bytes()
        }
    }
}

/// 2000-01-01T00:00:00Z in epoch milliseconds. No legacy locker ever wrote an expiry before it,
/// but a later kind of legacy locker, written in Lua, stores the value `1` (with a TTL): read as a timestamp it
/// would look long expired and a live lock would be taken over. Such values are `Corrupt`.
const OLDEST_PLAUSIBLE_EXPIRY_MS: i64 = 946_684_800_000;

/// The same instant in epoch nanoseconds.
const OLDEST_PLAUSIBLE_EXPIRY_NS: i128 = OLDEST_PLAUSIBLE_EXPIRY_MS as i128 * NS_PER_MS;

/// Decodes a stored expiry into epoch nanoseconds, or says why it is not one. Why: the format
/// the value has if it is another family's or strategy's ([`found_format`]), else what this
/// encoding expected.
fn decode(encoding: Encoding, value: &[u8]) -> std::result::Result<i128, &'static str> {
    decode_raw(encoding, value)
        .and_then(|ns| {
            if ns < OLDEST_PLAUSIBLE_EXPIRY_NS {
                Err("a timestamp before the year 2000, so not a legacy expiry")
            } else if encoding == Encoding::Decimal && ns >= NANOS_AS_MS_NS {
                // 18 or more digits: epoch nanoseconds, read as milliseconds (a live gorlock
                // value would read as held for millions of years).
                Err("a number of milliseconds after the year 30,000,000")
            } else {
                Ok(ns)
            }
        })
        .map_err(|reason| found_format(encoding, value).unwrap_or(reason))
}

/// The oldest plausible nanosecond expiry read as milliseconds, in nanoseconds: a decimal
/// value this large is an [`Encoding::Nanos`] value, not milliseconds.
const NANOS_AS_MS_NS: i128 = OLDEST_PLAUSIBLE_EXPIRY_NS * NS_PER_MS;

/// What a value that `encoding` rejects is, if it has the shape of another encoding's expiry or
/// of another strategy's value: the reason of its [`LockError::Corrupt`].
fn found_format(encoding: Encoding, value: &[u8]) -> Option<&'static str> {
    if crate::primitives::token::recognizes(value) {
        return Some("it is a Token lock's value (32 hex digits), not an expiry timestamp");
    }
    if crate::primitives::fair::recognizes(value) {
        return Some("it is a Fair lock's value (48 hex digits), not an expiry timestamp");
    }
    let (_, found) = recognize(value).filter(|(_, found)| *found != encoding)?;
    macro_rules! other {
        ($format:literal) => {
            concat!(
                "it is another family's format: ",
                $format,
                ", not this lock's encoding"
            )
        };
    }
    Some(match found {
        Encoding::Decimal => other!("decimal epoch milliseconds (Encoding::Decimal)"),
        Encoding::BigEndian => other!("8-byte big-endian epoch milliseconds (Encoding::BigEndian)"),
        Encoding::FloatSeconds => other!("float epoch seconds (Encoding::FloatSeconds)"),
        Encoding::UuidMs => other!("<uuid>:<epoch ms> (Encoding::UuidMs)"),
        Encoding::Nanos => other!("decimal epoch nanoseconds (Encoding::Nanos)"),
    })
}

/// A decimal integer of at most 20 characters (with sign), as Java's `Long.parseLong` and
/// Go's `strconv.ParseInt` read it.
fn decimal_i64(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value)
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 20)
        .and_then(|s| s.parse::<i64>().ok())
}

/// A float written by Python's `repr` (or `str`) of a timestamp: `<digits>.<digits>`, at
/// most 24 characters; its value in nanoseconds, read as the exact decimal (digits past the
/// ninth decimal dropped), not through an `f64` whose rounding would move it.
fn float_seconds_ns(value: &[u8]) -> Option<i128> {
    if value.len() > 24 {
        return None;
    }
    let dot = value.iter().position(|b| *b == b'.')?;
    let (int, frac) = (&value[..dot], &value[dot + 1..]);
    let digits = |p: &[u8]| !p.is_empty() && p.iter().all(u8::is_ascii_digit);
    if !digits(int) || !digits(frac) {
        return None;
    }
    let number = |p: &[u8]| p.iter().fold(0i128, |n, d| n * 10 + i128::from(d - b'0'));
    let frac_ns = (0..9).fold(0i128, |n, i| {
        n * 10 + frac.get(i).map_or(0, |d| i128::from(d - b'0'))
    });
    Some(number(int) * NS_PER_S + frac_ns)
}

fn decode_raw(encoding: Encoding, value: &[u8]) -> std::result::Result<i128, &'static str> {
    let ms = |ms: i64| i128::from(ms) * NS_PER_MS;
    match encoding {
        Encoding::BigEndian => <[u8; 8]>::try_from(value)
            .map(|b| ms(i64::from_be_bytes(b)))
            .map_err(|_| "expected 8 bytes (big-endian encoding)"),
        Encoding::Decimal => decimal_i64(value)
            .map(ms)
            .ok_or("expected a decimal integer (decimal encoding)"),
        Encoding::Nanos => decimal_i64(value)
            .map(i128::from)
            .ok_or("expected a decimal integer of nanoseconds (nanos encoding)"),
        Encoding::FloatSeconds => float_seconds_ns(value)
            .ok_or("expected a float of seconds such as 1764262805.12 (float-seconds encoding)"),
        Encoding::UuidMs => value
            .get(..36)
            .filter(|uuid| is_uuid(uuid) && value.get(36) == Some(&b':'))
            .and_then(|_| decimal_i64(&value[37..]))
            .map(ms)
            .ok_or("expected <uuid>:<epoch ms> (uuid-ms encoding)"),
    }
}

/// Wall-clock epoch nanoseconds: the legacy formats are defined by the client's clock.
fn now_epoch_ns(key: &str) -> Result<i128> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .map_err(|_| LockError::config(key, "the system clock is before 1970"))
}

/// The value for a hold of `ttl` starting now, encoded as `opts` say: its expiry is
/// `now + ttl + skew` (`opts.clock_skew`), plus
/// 1 ms in the millisecond encodings (as the Java lockers write), to the microsecond in the
/// float one and to the nanosecond in the nanosecond one. `owner`: the UUID of an
/// [`Encoding::UuidMs`] value (the client's instance id).
pub(crate) fn expiry_value(
    key: &str,
    opts: ClassicOptions,
    owner: &str,
    ttl: Duration,
) -> Result<Vec<u8>> {
    let now = now_epoch_ns(key)?;
    // The unit of the encoding, and what it adds (the millisecond ones 1 ms).
    let (unit, plus) = match opts.encoding {
        Encoding::Decimal | Encoding::BigEndian | Encoding::UuidMs => (NS_PER_MS, 1),
        Encoding::FloatSeconds => (NS_PER_US, 0),
        Encoding::Nanos => (1, 0),
    };
    let per = |d: Duration| (d.as_nanos() as i128).div_euclid(unit);
    let expiry = (now.div_euclid(unit) + per(ttl) + plus + per(opts.clock_skew)) * unit;
    Ok(encode(opts.encoding, owner, expiry))
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
    /// Default lifetime ("timeout") of a Classic lock, as in the legacy lockers: 1 s.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(1);

    /// The options in force.
    pub fn options(&self) -> &ClassicOptions {
        &self.opts
    }

    /// One acquire attempt on one connection: SETNX, then GET and a takeover if stale.
    fn attempt(
        &self,
        con: &mut dyn redis::ConnectionLike,
        scripts: &crate::scripts::Scripts,
        value: &[u8],
        now_ns: i128,
    ) -> redis::RedisResult<Attempt> {
        for _ in 0..VANISHED_RETRIES {
            // SETNX, or with `key_ttl` an atomic `SET NX PX` (the legacy SETNX then EXPIRE left
            // a key without TTL forever if the client died in between).
            let set = if self.opts.key_ttl {
                let set = string_value::set_nx_px(&self.key, value, self.ttl_ms());
                set.query::<Value>(con)? == Value::Okay
            } else {
                string_value::setnx(&self.key, value).query::<i64>(con)? == 1
            };
            if set {
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
            // Held while the expiry has not passed, whoever wrote it (a live `<uuid>:<ms>` value
            // with our own UUID is another thread's hold: Classic does not re-enter).
            if expiry >= now_ns || !self.take_over(con, scripts, &seen, value)? {
                return Ok(Attempt::Held);
            }
            log::info!(
                "lock {:?}: took over a stale lock that expired {} ms ago",
                self.key,
                (now_ns - expiry) / NS_PER_MS
            );
            return Ok(Attempt::Won);
        }
        Ok(Attempt::Held)
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// Takes over a stale lock whose value we read as `seen`. True if we won.
    fn take_over(
        &self,
        con: &mut dyn redis::ConnectionLike,
        scripts: &crate::scripts::Scripts,
        seen: &[u8],
        value: &[u8],
    ) -> redis::RedisResult<bool> {
        let counters = self.client.counters();
        if self.opts.takeover == Takeover::CompareAndSet {
            let ttl = if self.opts.key_ttl { self.ttl_ms() } else { 0 };
            let won: i64 = scripts
                .compare_and_set
                .eval(con, &self.key, (seen, value, ttl))?;
            if won == 1 {
                counters.cas_takeover();
            } else {
                log::debug!(
                    "lock {:?}: lost a compare-and-set takeover race to another contender \
                     (nothing written)",
                    self.key
                );
            }
            return Ok(won == 1);
        }
        let old: Option<Vec<u8>> = redis::cmd("GETSET").arg(&self.key).arg(value).query(con)?;
        // `None`: the key vanished just before our GETSET, which then created it: as good as a
        // SETNX win. A different value: another contender won first, and we have just
        // overwritten its expiry (the legacy GETSET flaw, see Takeover).
        if let Some(winner) = old.filter(|old| old != seen) {
            counters.getset_overwrite();
            // Put the winner's expiry back, unless someone wrote since. Ours ends no hold of
            // ours, and it may be older than the winner's (computed before a server pause that
            // held our GETSET): left there, it would let a third contender take over while the
            // winner is still inside.
            let ttl = if self.opts.key_ttl { self.ttl_ms() } else { 0 };
            let restored: i64 =
                scripts
                    .compare_and_set
                    .eval(con, &self.key, (value, &winner[..], ttl))?;
            log::debug!(
                "lock {:?}: lost a GETSET takeover race and overwrote the winner's expiry \
                 ({})",
                self.key,
                if restored == 1 {
                    "put back"
                } else {
                    "changed since: not put back"
                }
            );
            return Ok(false);
        }
        counters.getset_takeover();
        if self.opts.key_ttl {
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(&self.key)
                .arg(self.ttl_ms())
                .query(con)?;
        }
        Ok(true)
    }
}

impl ClassicLock {
    /// One attempt: `Ok(None)` when another owner holds the lock.
    fn try_take(&self) -> Result<Option<Lease>> {
        let start = Instant::now();
        let owner = self.client.instance_id();
        let value = expiry_value(&self.key, self.opts, owner, self.ttl)?;
        let value = value.as_slice();
        let now_ns = now_epoch_ns(&self.key)?;
        // Undone only if the reply said we wrote: a Classic value is an expiry, not an owner,
        // and a contender that wrote in the same millisecond wrote the same bytes, so after a
        // lost reply deleting "our" value could free its lock. Unknown writes go stale after
        // their lifetime. (Known writes: a win whose replicas did not confirm it.)
        let wrote = Cell::new(false);
        let until = start.checked_add(self.ttl).unwrap_or(start);
        let outcome = string_value::acquire_undone_by(
            &self.client,
            &self.key,
            until,
            |con, s| {
                let attempt = self.attempt(con, s, value, now_ns)?;
                wrote.set(matches!(attempt, Attempt::Won));
                Ok(attempt)
            },
            |why| {
                if wrote.get() {
                    return Some(string_value::delete_cleanup(&self.key, value, None));
                } else if why.cause == NOT_REPLICATED {
                    // Answered, and it wrote nothing (refused): nothing to undo.
                    log::debug!(
                        "lock {:?}: a refused acquire not confirmed by the replicas wrote \
                         nothing",
                        self.key
                    )
                } else {
                    log::warn!(
                        "lock {:?}: no reply to an acquire; if it ran, the key holds our \
                         expiry until it goes stale (a Classic value does not name its owner, \
                         so it is not deleted)",
                        self.key
                    )
                }
                None
            },
        )?;
        let won = |lease| {
            crate::lease::checked_win(&self.key, lease, self.ttl, Instant::now(), |l| {
                self.release(l)
            })
        };
        let result = match outcome {
            Attempt::Won => won(Lease::new(value, start, self.ttl)).map(Some),
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
    crate::primitives::hold::hold_accessors!(key: key, ttl: ttl, retry: retry);

    fn try_acquire(&self) -> Result<Lease> {
        crate::lock::taken_or_held(&self.key, self.try_take())
    }

    fn release(&self, lease: &Lease) -> Result<bool> {
        string_value::release(&self.client, KIND, &self.key, None, None, None, lease)
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let (client, key) = (&self.client, self.key.as_str());
        hold::extend(client, KIND, key, lease, ttl, false, |seen, ttl_ms| {
            let ttl = Duration::from_millis(ttl_ms);
            let value = expiry_value(key, self.opts, client.instance_id(), ttl)?;
            let redis_ttl = if self.opts.key_ttl { ttl_ms } else { 0 };
            let args = (seen, &value[..], redis_ttl);
            let swapped: i64 =
                client.with_conn(key, |con, s| s.compare_and_set.eval(con, key, args))?;
            Ok((swapped == 1, Some(value)))
        })
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        string_value::is_held(&self.client, &self.key, lease)
    }

    lock::guard_methods!(|this, attempts| {
        let waiters = this.client.waiters();
        let result = crate::client::acquire::acquire_blocking(this, waiters, attempts);
        this.client.counters().blocking(KIND, &result);
        result
    });
}

impl crate::lock::LockAdmin for ClassicLock {
    /// Held while the stored expiry has not passed by this client's clock (the rule its
    /// acquires follow): see [`LockAdmin::state`](crate::LockAdmin::state).
    fn state(&self) -> Result<LockState> {
        let found = admin::read(&self.client, &self.key, "value")?;
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
        let now = now_epoch_ns(&self.key)?;
        if expiry < now {
            return Ok(LockState::Unlocked);
        }
        let left = Duration::from_nanos(u64::try_from(expiry - now).unwrap_or(u64::MAX));
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

/// The expiries, in epoch nanoseconds, that [`recognize`] takes for a Classic lock's: from
/// 2000-01-01 ([`OLDEST_PLAUSIBLE_EXPIRY_MS`]) to 2500-01-01. The upper bound keeps other
/// values of 8 bytes, or long numbers, from passing for an expiry.
const RECOGNIZED_EXPIRY_NS: std::ops::Range<i128> =
    OLDEST_PLAUSIBLE_EXPIRY_NS..16_725_225_600_000 * NS_PER_MS;

/// The expiry (epoch ms) and encoding of `value`, read at a lock key, if it has the shape of a
/// Classic lock's value in one of the encodings, with an expiry in [`RECOGNIZED_EXPIRY_NS`]:
/// 8 bytes that read as a big-endian expiry; 1 to 19 decimal digits (no sign), milliseconds or
/// nanoseconds by their value; `<digits>.<digits>` (float seconds); a UUID, `:` and 1 to 19
/// digits. A guess from the shape alone: another tool's number in that range passes too. No
/// value fits two shapes: a big-endian expiry starts with two zero bytes, a millisecond one has
/// 12 to 14 digits and a nanosecond one 18 or 19, and only the float has a `.`, only the UUID
/// form a `:`.
pub(crate) fn recognize(value: &[u8]) -> Option<(i64, Encoding)> {
    let digits = |v: &[u8]| (1..=19).contains(&v.len()) && v.iter().all(u8::is_ascii_digit);
    let shaped = |encoding| match encoding {
        Encoding::BigEndian => value.len() == 8,
        Encoding::Decimal | Encoding::Nanos => digits(value),
        Encoding::FloatSeconds => value.contains(&b'.'),
        Encoding::UuidMs => value.len() > 37 && digits(&value[37..]),
    };
    [
        Encoding::BigEndian,
        Encoding::Decimal,
        Encoding::Nanos,
        Encoding::FloatSeconds,
        Encoding::UuidMs,
    ]
    .into_iter()
    .filter(|&encoding| shaped(encoding))
    .find_map(|encoding| {
        decode_raw(encoding, value)
            .ok()
            .filter(|ns| RECOGNIZED_EXPIRY_NS.contains(ns))
            .map(|ns| (ns.div_euclid(NS_PER_MS) as i64, encoding))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "8743c9c0-0795-4907-87fd-6c719a6b4586";
    const ALL: [Encoding; 5] = [
        Encoding::Decimal,
        Encoding::BigEndian,
        Encoding::FloatSeconds,
        Encoding::UuidMs,
        Encoding::Nanos,
    ];

    fn enc(encoding: Encoding, ms: i64) -> Vec<u8> {
        encode(encoding, OWNER, i128::from(ms) * NS_PER_MS)
    }

    #[test]
    fn encodings_round_trip() {
        let ms_encodings = [Encoding::Decimal, Encoding::BigEndian, Encoding::UuidMs];
        // Every millisecond i64 in the millisecond encodings; plausible times in the others.
        let cases = [0i64, 1, 1_700_000_000_123, i64::MAX / 1_000_000, -5]
            .into_iter()
            .flat_map(|ms| ms_encodings.map(|e| (e, ms)))
            .chain(
                [1_700_000_000_123i64, 946_684_800_000, 2_147_483_649_000]
                    .into_iter()
                    .flat_map(|ms| [Encoding::FloatSeconds, Encoding::Nanos].map(|e| (e, ms))),
            );
        for (e, ms) in cases {
            let ns = i128::from(ms) * NS_PER_MS;
            assert_eq!(decode_raw(e, &enc(e, ms)), Ok(ns), "{e:?} {ms}");
        }
        assert_eq!(
            decode(Encoding::Decimal, b"1700000000123"),
            Ok(1_700_000_000_123 * NS_PER_MS)
        );
        assert_eq!(enc(Encoding::Decimal, 1_700_000_000_123), b"1700000000123");
        assert_eq!(enc(Encoding::BigEndian, 1), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(
            enc(Encoding::UuidMs, 1_700_000_000_123),
            b"8743c9c0-0795-4907-87fd-6c719a6b4586:1700000000123"
        );
        assert_eq!(
            enc(Encoding::Nanos, 1_700_000_000_123),
            b"1700000000123000000"
        );
    }

    #[test]
    fn float_seconds_are_written_as_python_repr() {
        let at = |us: i128| {
            let v = encode(Encoding::FloatSeconds, OWNER, us * NS_PER_US);
            String::from_utf8(v).expect("ascii")
        };
        // repr(1764262805.123456), repr(1764262806.0), repr(2147483649.0), repr(1764262805.1)
        assert_eq!(at(1_764_262_805_123_456), "1764262805.123456");
        assert_eq!(at(1_764_262_806_000_000), "1764262806.0");
        assert_eq!(at(2_147_483_649_000_000), "2147483649.0");
        assert_eq!(at(1_764_262_805_100_000), "1764262805.1");
        assert_eq!(at(1_764_262_805_000_010), "1764262805.00001");
        // Python 2's str() kept 12 significant digits: read as well.
        assert_eq!(
            decode(Encoding::FloatSeconds, b"1764262805.12"),
            Ok(1_764_262_805_120 * NS_PER_MS)
        );
        // Sub-nanosecond float error is rounded away.
        assert_eq!(
            decode(Encoding::FloatSeconds, b"1764262805.123456"),
            Ok(1_764_262_805_123_456_000)
        );
        let opts = ClassicOptions::new().encoding(Encoding::FloatSeconds);
        let written = expiry_value("k", opts, OWNER, Duration::from_secs(1)).expect("clock");
        let text = std::str::from_utf8(&written).expect("ascii");
        let (int, frac) = text.split_once('.').expect("a decimal point");
        assert_eq!(int.len(), 10, "{text}");
        assert!((1..=6).contains(&frac.len()), "{text}");
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
        let float_bad: [&[u8]; 10] = [
            b"1764262805",
            b"1764262805.",
            b".5",
            b"1.7e9",
            b"inf",
            b"nan",
            b"-1764262805.0",
            b"+1764262805.0",
            b" 1764262805.0",
            b"1764262805.0.1",
        ];
        let uuid = "8743c9c0-0795-4907-87fd-6c719a6b4586";
        let uuid_bad = [
            uuid.to_owned(),
            format!("{uuid}:"),
            format!("{uuid}:x"),
            format!("{uuid}.1700000000123"),
            format!("{uuid}:1"),
            "zz43c9c0-0795-4907-87fd-6c719a6b4586:1700000000123".to_owned(),
            "8743c9c0079549070787fd6c719a6b4586aa:1700000000123".to_owned(),
            "1700000000123".to_owned(),
        ];
        let bad = (float_bad
            .iter()
            .map(|v| (Encoding::FloatSeconds, v.to_vec())))
        .chain(uuid_bad.map(|v| (Encoding::UuidMs, v.into_bytes())));
        for (e, v) in bad {
            assert!(decode(e, &v).is_err(), "{e:?} {v:?}");
        }
        // Milliseconds read as nanoseconds are in 1970; nanoseconds read as milliseconds are
        // millions of years away: both refused.
        assert!(decode(Encoding::Nanos, b"1700000000123").is_err());
        assert!(decode(Encoding::Decimal, b"1700000000123000000").is_err());
    }

    #[test]
    fn corrupt_reasons_name_the_format_found() {
        let cases: [(Encoding, &[u8], &str); 6] = [
            (
                Encoding::Decimal,
                b"1764262805.123",
                "Encoding::FloatSeconds",
            ),
            (Encoding::Decimal, b"1764262805123456789", "Encoding::Nanos"),
            (Encoding::Nanos, b"1764262805123", "Encoding::Decimal"),
            (
                Encoding::FloatSeconds,
                b"8743c9c0-0795-4907-87fd-6c719a6b4586:1764262805123",
                "Encoding::UuidMs",
            ),
            (
                Encoding::UuidMs,
                b"0123456789abcdef0123456789abcdef",
                "a Token lock's value",
            ),
            (Encoding::BigEndian, b"1764262805123", "Encoding::Decimal"),
        ];
        for (encoding, value, named) in cases {
            let reason = decode(encoding, value).expect_err("corrupt");
            assert!(reason.contains(named), "{encoding:?} {value:?}: {reason}");
        }
        // A value of no known shape says what the encoding expected.
        let reason = decode(Encoding::Nanos, b"hello").expect_err("corrupt");
        assert!(reason.contains("nanos encoding"), "{reason}");
    }

    #[test]
    fn classic_values_are_recognized() {
        let ms = 1_700_000_000_123;
        for e in ALL {
            assert_eq!(recognize(&enc(e, ms)), Some((ms, e)), "{e:?}");
            let opts = ClassicOptions::new().encoding(e);
            let written = expiry_value("k", opts, OWNER, Duration::from_secs(1));
            let written = written.expect("clock");
            assert_eq!(recognize(&written).map(|(_, e)| e), Some(e));
            // Before 2000 or after 2500: not an expiry.
            assert_eq!(recognize(&enc(e, 1)), None, "{e:?}");
            assert_eq!(recognize(&enc(e, 946_684_799_999)), None, "{e:?}");
            assert!(recognize(&enc(e, 946_684_800_000)).is_some(), "{e:?}");
            if e != Encoding::Nanos {
                // Nanoseconds end in 2262 (i64).
                assert!(recognize(&enc(e, 16_725_225_599_999)).is_some(), "{e:?}");
                assert_eq!(recognize(&enc(e, 16_725_225_600_000)), None, "{e:?}");
            }
        }
        for e in [Encoding::Decimal, Encoding::BigEndian, Encoding::UuidMs] {
            assert_eq!(recognize(&enc(e, -ms)), None);
        }
        // redis-py's "forever".
        assert_eq!(
            recognize(b"2147483649.0"),
            Some((2_147_483_649_000, Encoding::FloatSeconds))
        );
        // Decimal digits only: no sign, no spaces, at most 19 of them.
        assert_eq!(recognize(b"+1700000000123"), None);
        assert_eq!(recognize(b" 1700000000123"), None);
        assert_eq!(recognize(b"00000001700000000123"), None);
        assert_eq!(
            recognize(b"0000001700000000123"),
            Some((ms, Encoding::Decimal))
        );
        assert_eq!(
            recognize(b"1700000000123456789"),
            Some((ms, Encoding::Nanos))
        );
        // Eight digits are a number before 2000, and as bytes far beyond 2500.
        assert_eq!(recognize(b"17000000"), None);
        assert_eq!(recognize(b""), None);
        assert_eq!(recognize(b"hello"), None);
        assert_eq!(recognize(b"8743c9c0-0795-4907-87fd-6c719a6b4586:1"), None);
    }
}
