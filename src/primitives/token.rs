//! [`Strategy::Token`](crate::Strategy::Token): `SET key token NX PX ttl`, released and extended
//! by Lua compare-and-delete / compare-and-pexpire.
//!
//! Wire, per operation (one round trip each):
//! - acquire: `SET key <32 hex chars> NX PX <ttl ms> GET` → nil (ours), the value found
//!   (held), or `WRONGTYPE` (a key of another type, reported at once); on servers before Redis
//!   7.0, which refuse `NX` with `GET`, `SET key <token> NX PX <ttl ms>` → `OK` or nil;
//! - acquire while waiting, or with fencing: `EVALSHA <token_acquire.lua> 1|2 key
//!   [dlock_fence:{key}] <token> <ttl ms>` → `{1, fence}` or `{0, pttl}`;
//! - release: `EVALSHA <unlock.lua> 1 key <token> 0 redisson_lock__channel:{key}` → 1 + the
//!   subscribers reached (deleted and published) or 0 (not ours); the channel is Redisson's
//!   name for it (see [`crate::keys`]), passed as an argument;
//! - extend: `EVALSHA <extend.lua> 1 key <token> <ttl ms>` → 1 or 0;
//! - check: `GET key`, compared with our token.
//!
//! Where the server has them (see [`crate::client::native`]; Valkey 9.0 and later for the
//! first two, 8.1 for the third), without scripts:
//! - release: `DELIFEQ key <token>` pipelined with `PUBLISH redisson_lock__channel:{key} 0`
//!   (one round trip; the `PUBLISH` goes out also when the token was not ours);
//! - acquire while waiting, without fencing: `SET key <token> NX PX <ttl ms> GET` pipelined
//!   with `PTTL key` (the holder's PTTL, as the script reports it);
//! - extend: `SET key <token> IFEQ <token> PX <ttl ms>` → `OK` or nil.
//!
//! In a cluster only the single commands are used (redis-rs follows no redirection inside a
//! pipeline): the release and the waiting attempts keep their scripts there.
//!
//! A lock built without an explicit ttl is watched: the client's watchdog renews its holds
//! (see [`crate::client::watchdog`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use crate::client::access;
use crate::client::cleanup::Why;
use crate::client::live::{self, LiveValue};
use crate::client::native::{self, Command};
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::ids::new_token;
use crate::lease::{Attempt, Lease, RenewKind};
use crate::lock::{self, DistributedLock, LockGuard, LockState};
use crate::primitives::hold::{self, AcquireReply, HoldOptions, WakeUp};
use crate::primitives::string_value::{self, Lazy};
use crate::retry::Attempts;
use crate::scripts::Scripts;
use crate::stats::Kind;

/// The stats label of Token locks.
pub(crate) const KIND: Kind = Kind::new("token");

/// A lock of [`Strategy::Token`](crate::Strategy::Token). Build it with
/// [`LockBuilder`](crate::LockBuilder).
pub struct TokenLock {
    client: LockClient,
    key: String,
    /// The checked options of its holds.
    pub(crate) opts: HoldOptions,
    /// The values it writes and what its releases publish: Token's, or another fleet's
    /// (ShedLock's, for a lock of [`Strategy::ShedLock`](crate::Strategy::ShedLock)).
    pub(crate) dialect: Dialect,
    /// A value without TTL was reported (see `note_no_ttl`).
    warned_no_ttl: AtomicBool,
    /// Its acquire and release, packed once but for the value.
    wire: Wire,
}

/// The commands of every acquire and release of a lock with Token values, packed by redis-rs
/// once but for the value (see [`Packed`](string_value::Packed)), at their second use: the
/// same bytes as built afresh, without the building. Values of other lengths (other
/// dialects') are sent the usual way.
#[derive(Default)]
struct Wire {
    /// `SET key <value> NX PX <ttl ms>` (servers before Redis 7.0), then the same with `GET`.
    set_nx_px: [Lazy<string_value::Packed>; 2],
    /// The release, published as the dialect says.
    release: Lazy<string_value::PackedRelease>,
}

impl TokenLock {
    /// Sends `SET key <token> NX PX <lease ms>`, with `GET` if `get`: packed from the second
    /// send on (see [`Wire`]).
    fn send_set(&self, con: &mut Conn, token: &[u8], get: bool) -> redis::RedisResult<Value> {
        let (ttl, key, i) = (self.opts.lease_ms(), self.key.as_str(), usize::from(get));
        let make = [string_value::set_nx_px, string_value::set_nx_px_get][i];
        let cmd = |v: &[u8]| make(key, v, ttl);
        self.wire.set_nx_px[i].query(con, TOKEN_VALUE_LEN, token, cmd)
    }

    fn packed_release(&self) -> Option<&string_value::PackedRelease> {
        self.wire.release.get(|| {
            Some(string_value::PackedRelease::new(
                self.client.scripts(),
                &self.key,
                self.dialect.notice(),
                TOKEN_VALUE_LEN,
            ))
        })
    }
}

/// What a lock of Token's protocol writes and publishes. The protocol is the same for each:
/// `SET NX PX` (or the acquire script, which also takes a key that holds the acquire's own
/// value), compare-and-delete, compare-and-pexpire. Token's own dialect ([`Dialect::token`])
/// writes 32 hex digits and publishes Redisson's `0`; another fleet's (Spring Integration's
/// registry, `primitives/spring.rs`; ShedLock's value format) writes its values and publishes
/// where its waiters listen.
pub(crate) struct Dialect {
    /// The stats label of its holds.
    pub(crate) kind: Kind,
    /// A fresh value for one acquire (every attempt of a blocking acquire sends the same).
    pub(crate) new_value: fn(&LockClient) -> Vec<u8>,
    /// What a release publishes on each of `channels`.
    pub(crate) message: Vec<u8>,
    /// The channels a release publishes on. This lock's waiters listen on the first two.
    pub(crate) channels: Vec<String>,
    /// ShedLock's values ([`Strategy::ShedLock`](crate::Strategy::ShedLock)).
    pub(crate) shedlock: bool,
}

impl Dialect {
    /// Token's own: 32 hex digits (the client's id, then random bits), `0` published on
    /// Redisson's channel `channel`.
    pub(crate) fn token(channel: &str) -> Self {
        Dialect {
            kind: KIND,
            // The client's id (16 hex digits, see `LockClient::token_prefix`), then 64 random
            // bits in hex; 32 characters, as `new_token`'s.
            new_value: |client| {
                let mut t = new_token();
                let prefix = client.token_prefix();
                t[..prefix.len()].copy_from_slice(&prefix);
                t.to_vec()
            },
            message: crate::keys::UNLOCK_MESSAGE.as_bytes().to_vec(),
            channels: vec![channel.to_owned()],
            shedlock: false,
        }
    }

    fn notice(&self) -> hold::Notice<'_> {
        hold::Notice {
            message: &self.message,
            channels: &self.channels,
        }
    }
}

/// The length of a Token value.
const TOKEN_VALUE_LEN: usize = 32;

/// The value a refused attempt found at the key, if it says.
type Holder = Option<Vec<u8>>;

/// What one acquire carries from attempt to attempt (see
/// `TokenLock::acquire_blocking`).
struct Acquiring {
    /// Sent by every attempt.
    token: Vec<u8>,
    /// Set when an attempt's reply was lost (or its write not confirmed by the replicas):
    /// until when what it may have written lives, and why it is undone.
    lost_until: Cell<Option<(Instant, Why)>>,
}

impl std::fmt::Debug for TokenLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TokenLock");
        d.field("key", &self.key);
        self.opts.debug_fields(&mut d).finish_non_exhaustive()
    }
}

impl TokenLock {
    /// A lock of Token's protocol in another fleet's `dialect`.
    pub(crate) fn with_dialect(
        client: LockClient,
        key: String,
        opts: HoldOptions,
        dialect: Dialect,
    ) -> Self {
        TokenLock {
            client,
            key,
            opts,
            dialect,
            warned_no_ttl: AtomicBool::new(false),
            wire: Wire::default(),
        }
    }

    /// True if the watchdog renews this lock's holds (built without an explicit ttl).
    pub fn is_watched(&self) -> bool {
        self.opts.watched
    }

    /// One attempt with the acquire's token: a plain `SET … NX PX` if `set` ([`set_once`](Self::set_once)),
    /// else one made while waiting, by `lua/token_acquire.lua` ([`scripted_once`](Self::scripted_once))
    /// or without a script where the server releases natively ([`pipelined_once`](Self::pipelined_once)):
    /// both report the fence or the holder's PTTL, and take a key that already holds the token
    /// (an earlier attempt of the same acquire whose reply was lost). A refusal by a stale hold
    /// of this client's own is cleared and tried again once.
    fn attempt(&self, acq: &Acquiring, set: bool) -> Result<Attempt> {
        let once = || {
            let start = Instant::now();
            // Before it is sent: a Sentinel replay that reads the key after the write sees it live.
            let mut live = self.client.live().write(&acq.token, start);
            let (reply, holder) = if set {
                self.set_once(acq, start)
            } else if self.pipelined_attempts() {
                self.pipelined_once(acq, start)
            } else {
                self.scripted_once(acq, start)
            }?;
            Ok::<_, LockError>((self.finish_attempt(&mut live, start, reply)?, holder))
        };
        match once()? {
            (Attempt::Held { .. }, Some(holder)) if self.clear_stale(&holder) => Ok(once()?.0),
            (attempt, _) => Ok(attempt),
        }
    }

    /// `SET key token NX PX ttl`, with `GET` where the server takes it (then a refusal also
    /// returns the value held).
    fn set_once(&self, acq: &Acquiring, start: Instant) -> Result<(AcquireReply, Holder)> {
        let token = &acq.token[..];
        let held = |holder| (AcquireReply::Held { pttl: None }, holder);
        let reply = self.send_acquire(acq, start, |con, _| {
            if self.client.set_get() {
                match self.send_set(con, token, true) {
                    Err(e) if self.client.lacks_set_get(con, &e) => {}
                    // Nil: set; the value found: held (or ours, if this is a resend of an
                    // acquire that landed); a WRONGTYPE error: a key of another type.
                    Ok(Value::Nil) => return Ok(Value::Okay),
                    Ok(Value::BulkString(v)) if v == token => return Ok(Value::Okay),
                    other => return other,
                }
            }
            self.send_set(con, token, false)
        })?;
        Ok(match reply {
            Value::Okay => (AcquireReply::Taken { fence: None }, None),
            Value::BulkString(v) => held(Some(v)),
            _ => held(None),
        })
    }

    /// One attempt by `lua/token_acquire.lua`: a refusal also returns the value held.
    fn scripted_once(&self, acq: &Acquiring, start: Instant) -> Result<(AcquireReply, Holder)> {
        let token = &acq.token[..];
        let mut reply: Value = self.send_acquire(acq, start, |con, s| {
            let args = (token, self.opts.lease_ms());
            match &self.opts.fence_key {
                Some(fence) => s
                    .token_acquire
                    .eval_keys(con, &[self.key.as_str(), fence], args),
                None => s.token_acquire.eval(con, &self.key, args),
            }
        })?;
        // A refusal's third element: the value held ('' for a key of another type).
        let mut holder = None;
        if let Value::Array(items) = &mut reply {
            if items.len() == 3 {
                if let Some(Value::BulkString(v)) = items.pop() {
                    holder = Some(v).filter(|v| !v.is_empty());
                }
            }
        }
        let decoded = hold::decode_acquire(&self.key, &reply)?;
        if decoded == (AcquireReply::Held { pttl: None }) {
            self.note_no_ttl();
        }
        Ok((decoded, holder))
    }

    /// One attempt without a script, where the server has the native release (so that a Token
    /// lock without fencing sends no script at all): `SET key token NX PX ttl GET` pipelined
    /// with `PTTL key` (one round trip), which reports the holder's PTTL as the script does.
    /// A key that holds the acquire's own token (an earlier attempt whose reply was lost) is
    /// taken with a fresh lifetime by `SET … IFEQ … PX` (one more round trip, only then). A
    /// refusal also returns the value held.
    fn pipelined_once(&self, acq: &Acquiring, start: Instant) -> Result<(AcquireReply, Holder)> {
        let token = &acq.token[..];
        let ttl = self.opts.lease_ms();
        let (set, pttl): (Value, i64) = self.send_acquire(acq, start, |con, _| {
            let mut pipe = redis::pipe();
            pipe.add_command(string_value::set_nx_px_get(&self.key, token, ttl))
                .cmd("PTTL")
                .arg(&self.key);
            let (set, pttl): (Value, i64) = pipe.query(con)?;
            if set == Value::BulkString(token.to_vec()) {
                // Ours already: renewed only if it still is.
                let renewed: Option<Value> =
                    native::set_ifeq_px(&self.key, token, ttl).query(con)?;
                return Ok((renewed.map_or(Value::Okay, |_| Value::Nil), -2));
            }
            Ok((set, pttl))
        })?;
        if set == Value::Nil {
            // Set (or, above, found ours and renewed).
            return Ok((AcquireReply::Taken { fence: None }, None));
        }
        if pttl == -1 {
            self.note_no_ttl();
        }
        let holder = match set {
            Value::BulkString(v) => Some(v),
            _ => None,
        };
        let pttl = hold::pttl_of(pttl);
        Ok((AcquireReply::Held { pttl }, holder))
    }

    /// Turns an attempt's answer into its outcome (a won hold is checked against its lease).
    fn finish_attempt(
        &self,
        live: &mut LiveValue<'_>,
        start: Instant,
        reply: AcquireReply,
    ) -> Result<Attempt> {
        let result = match reply {
            AcquireReply::Taken { fence } => {
                // One reading of the clock after the reply for the late-reply check, the
                // watchdog's first renewal and the live set.
                let now = Instant::now();
                let kind = RenewKind::Value(self.dialect.kind);
                let lease =
                    (self.opts).lease(&self.client, kind, live.value(), start, fence, Some(now));
                let won = crate::lease::checked_win(&self.key, lease, self.opts.lease, now, |l| {
                    self.release(l)
                });
                if won.is_ok() {
                    live.keep_at(self.opts.lease, now);
                }
                won.map(Attempt::Acquired)
            }
            AcquireReply::Held { pttl } => Ok(Attempt::Held { pttl, wake: None }),
        };
        self.client.counters().outcome(self.dialect.kind, &result);
        result
    }
    /// A refused attempt found `holder` at the key: if it is a token of this client that no
    /// thread of it holds or is writing, it is a hold nobody will release (released on a
    /// primary that lost the release in a failover, or written by an acquire whose reply was
    /// lost). It is deleted, owner-checked on that exact value and published, so that the
    /// waiters need not wait out its lease. True if it was.
    fn clear_stale(&self, holder: &[u8]) -> bool {
        if !self.client.is_stale_own(holder) {
            return false;
        }
        let (notice, packed) = (Some(self.dialect.notice()), self.packed_release());
        match string_value::compare_and_delete(&self.client, &self.key, holder, notice, packed) {
            Ok(n) if n >= 1 => {
                self.client.counters().orphan_cleaned();
                log::warn!(
                    "lock {:?}: deleted a hold of this client that nobody held any more (value \
                     {}; its release was lost in a failover, or its acquire's reply)",
                    self.key,
                    crate::lease::printable(holder)
                );
                return true;
            }
            Ok(_) => {}
            Err(e) => log::debug!(
                "lock {:?}: could not delete a stale hold of this client: {}",
                self.key,
                e.report()
            ),
        }
        false
    }

    /// Sends an acquire of `acq`'s token. One whose reply is lost may still run (or have run)
    /// and leave a lock nobody holds: within a blocking acquire, the next attempt, which sends
    /// the same token, takes it, and only an acquire that gives up leaves it to the janitor
    /// ([`forget_lost`](Self::forget_lost), see `acquire_blocking`); a `try_acquire` leaves it
    /// to the janitor at once, which deletes it in the background, owner-checked.
    fn send_acquire<T>(
        &self,
        acq: &Acquiring,
        start: Instant,
        f: impl FnMut(&mut Conn, &Scripts) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let until = start.checked_add(self.opts.lease).unwrap_or(start);
        string_value::acquire_undone_by(&self.client, &self.key, until, f, |why| {
            // Left to the janitor only if the acquire gives up (see `forget_lost`).
            acq.lost_until.set(Some((until, why)));
            None
        })
    }

    /// The janitor deletes `acq`'s token at the key if an attempt whose reply was lost wrote it.
    fn forget_lost(&self, acq: &Acquiring) {
        if let Some((until, why)) = acq.lost_until.get() {
            let token = &acq.token[..];
            let notice = Some(self.dialect.notice());
            let cleanup = string_value::delete_cleanup(&self.key, token, notice);
            (self.client.janitor()).forget(&self.client, cleanup, why, until);
        }
    }

    /// A refused attempt found a value without a TTL at the key: not written by a Token lock
    /// (which always sets one), so it never expires by itself. Warned once per lock object.
    fn note_no_ttl(&self) {
        if !self.warned_no_ttl.swap(true, Ordering::Relaxed) {
            log::warn!(
                "lock {:?}: held by a value with no TTL, which no Token lock writes: it never \
                 expires by itself, so waiters wait until someone deletes the key",
                self.key
            );
        }
    }

    /// The blocking acquire: the first attempt is a plain `SET NX PX` (unless fencing), later
    /// ones (made while waiting) use the script, whose refusal carries the holder's PTTL.
    /// Every attempt sends the same token, so one whose reply was lost (a failover) and that
    /// landed is taken by the next: the acquire leaves nothing behind unless it gives up.
    fn acquire_blocking(&self, attempts: Attempts<'_>) -> Result<LockGuard<'_>> {
        // FIFO, no barging; also woken on the dialect's second channel (Spring's registry-wide).
        let also = self.dialect.channels.get(1).map(String::as_str);
        let line = self.opts.line(&self.client, &self.key, true, false, also);
        let acq = self.acquiring();
        let mut set = self.opts.fence_key.is_none();
        let attempt = || self.attempt(&acq, std::mem::take(&mut set));
        let result = crate::client::acquire::acquire_in_line(self, line, attempts, attempt, |_| {
            self.check_type()
        });
        if result.is_err() {
            self.forget_lost(&acq);
        }
        self.client.counters().blocking(self.dialect.kind, &result);
        result
    }

    /// A new acquire, with a fresh token.
    fn acquiring(&self) -> Acquiring {
        Acquiring {
            token: (self.dialect.new_value)(&self.client),
            lost_until: Cell::new(None),
        }
    }

    /// True if attempts made while waiting go without the script: no fencing, and the server
    /// releases natively (`DELIFEQ`) and takes `SET … NX PX … GET`.
    fn pipelined_attempts(&self) -> bool {
        // Not in a cluster: redis-rs does not follow redirections inside a pipeline.
        self.opts.fence_key.is_none()
            && !self.client.is_cluster()
            && self.client.set_get()
            && self.client.native().has(Command::DelIfEq)
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

impl TokenLock {
    /// A release within `lock_at_least` of the acquire: the hold stays until `rest` from now
    /// (owner-checked `PEXPIRE`), renewed no more, and then expires; nothing is published. Its
    /// value stays in the client's live set meanwhile, so that no attempt of this client
    /// clears it as a stale hold. True if it was still ours.
    fn keep_at_least(&self, lease: &Lease, rest: Duration) -> Result<bool> {
        // A hold whose lifetime passed is reported lost, as by `string_value::release`.
        let overran = lease.is_expired();
        lease.stop_renewal();
        // Rounded up: `lock_at_least` is a least, and whole milliseconds cut down would end the
        // hold up to 1 ms before it (a ShedLock peer then ran its job that much early).
        let rest_ms = u64::try_from(rest.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let kept = string_value::extend(&self.client, &self.key, lease.value(), rest_ms);
        if matches!(kept, Ok(true)) {
            self.client.live().renew(live::value(lease.value()), rest);
            log::debug!(
                "lock {:?}: kept for {rest:?} more (lock_at_least)",
                self.key
            );
        } else {
            self.client.live().release(live::value(lease.value()), None);
        }
        // Lost: no longer ours, or kept after its lifetime had passed.
        if matches!(kept, Ok(false)) || (overran && matches!(kept, Ok(true))) {
            self.client
                .counters()
                .lost_on_release(self.dialect.kind, lease);
        }
        kept.map(|kept| kept && !overran)
    }
}

impl DistributedLock for TokenLock {
    super::hold::hold_accessors!();

    fn try_acquire(&self) -> Result<Lease> {
        let acq = self.acquiring();
        let attempt = self.attempt(&acq, self.opts.fence_key.is_none());
        self.forget_lost(&acq);
        hold::taken(&self.key, attempt)
    }

    fn release(&self, lease: &Lease) -> Result<bool> {
        if let Some(rest) = self.opts.at_least.and_then(|d| {
            crate::time::saturating_add(lease.acquired_at(), d)
                .checked_duration_since(Instant::now())
                .filter(|rest| !rest.is_zero())
        }) {
            return self.keep_at_least(lease, rest);
        }
        string_value::release(
            &self.client,
            self.dialect.kind,
            &self.key,
            Some(self.dialect.notice()),
            Some(&self.client.token_prefix()),
            self.packed_release(),
            lease,
        )
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let (client, key, kind) = (&self.client, self.key.as_str(), self.dialect.kind);
        hold::extend(client, kind, key, lease, ttl, false, |token, ttl_ms| {
            Ok((string_value::extend(client, key, token, ttl_ms)?, None))
        })
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        string_value::is_held(&self.client, &self.key, lease)
    }

    lock::guard_methods!(|this, attempts| this.acquire_blocking(attempts));
}

impl crate::lock::LockAdmin for TokenLock {
    fn state(&self) -> Result<LockState> {
        hold::state(&self.client, &self.key, "string")
    }

    fn force_unlock(&self) -> Result<bool> {
        hold::force_unlock(&self.client, &self.key, Some(self.dialect.notice()))
    }
}

/// The commands of a Token lock (see `token.rs`): acquire (`SET … NX PX … GET`, or by script
/// `SET` + `PTTL` and `INCR` of the fencing counter), release (`GET`, `DEL`, `PUBLISH`),
/// extend and renewal (`GET`, `PEXPIRE`), the check (`GET`), the type check of a wait that
/// gives up (`TYPE`), and the subscriber's commands when waiters are woken by pub/sub. The same
/// on the dialect's other release channels (Spring's registry-wide one, on which the release
/// publishes the key).
///
/// Where the client uses the native commands (see [`crate::client::native`]), `DELIFEQ` and
/// `SET … IFEQ … PX` are checked too.
pub(crate) fn access_checks(
    client: &LockClient,
    key: &str,
    lock: &TokenLock,
) -> Vec<access::Check> {
    let opts = &lock.opts;
    let channel = opts.channel.as_str();
    let mut c = access::native(client, key);
    c.extend([
        access::check("set", &[key, "v", "NX", "PX", "1000", "GET"]),
        access::check("get", &[key]),
        access::check("del", &[key]),
        access::check("pexpire", &[key, "1000"]),
        access::check("pttl", &[key]),
        access::check("type", &[key]),
        access::check("publish", &[channel, "0"]),
    ]);
    if let Some(f) = &opts.fence_key {
        c.push(access::check("incr", &[f]));
    }
    let pubsub = opts.wake_up == WakeUp::PubSub;
    if pubsub {
        c.extend(access::subscriber(channel));
    }
    for other in lock.dialect.channels.iter().skip(1) {
        c.push(access::check("publish", &[other, key]));
        if pubsub {
            c.extend(access::subscriber(other));
        }
    }
    c
}

/// True if `value`, read at a lock key, has the shape of a Token lock's value: 32 hex digits,
/// as `Dialect::token` builds them (the client's id, then random bits; lowercase as this
/// crate writes them, though either case is accepted). A guess from the shape alone: any other
/// value of 32 hex digits passes too.
pub(crate) fn recognizes(value: &[u8]) -> bool {
    value.len() == 32 && value.iter().all(u8::is_ascii_hexdigit)
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

    #[test]
    fn token_values_are_recognized() {
        assert!(recognizes(&new_token()));
        assert!(recognizes(b"0123456789abcdef0123456789ABCDEF"));
        assert!(!recognizes(b"0123456789abcdef0123456789abcde"));
        assert!(!recognizes(b"0123456789abcdef0123456789abcdefa"));
        assert!(!recognizes(b"0123456789abcdef0123456789abcdeg"));
        assert!(!recognizes(b""));
    }
}
