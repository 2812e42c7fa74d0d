//! [`Strategy::Fair`](crate::Strategy::Fair): a first-come, first-served lock whose release
//! hands the lock to the next waiter inside Redis.
//!
//! The lock key holds the holder's token: this client's id (16 hex characters) and 128 random
//! bits. Waiters queue in two sorted sets in the key's hash slot: `dlock_fair_q:{key}` (token →
//! arrival, the server's time in µs: the order) and `dlock_fair_d:{key}` (token → the server
//! time in ms at which the entry lapses unless refreshed). The release script deletes our hold
//! and, if a live waiter heads the queue, writes that waiter's token at the key with a short
//! grant lease ([`FairLock::GRANT_LEASE`](crate::FairLock::GRANT_LEASE)), increments the fencing counter if the lock is fenced, and
//! publishes
//! `dlock-grant:<token>:<fence>:<seconds>:<microseconds>` on `dlock_fair_ch:<grantee's client
//! id>`. The grantee client's subscriber thread hands the message to the one thread that
//! expects it ([`crate::client::grants`]), whose `lock()` returns without another command;
//! the client's watchdog raises the grant lease to the lock's lease (or ttl) a third of the
//! grant lease later, unless the hold is released first.
//!
//! A client that requires replicas to confirm its hold writes (`ClientBuilder::replica_acks`)
//! sends `WAIT` after each acquire and extend in the same round trip, as for Token; a write
//! too few replicas confirmed is undone by our release (which may pass the lock on) and the
//! attempt fails with [`LockError::NotReplicated`]. A grant is a write of the releasing
//! client, which our `WAIT` does not cover: before `lock()` returns, the grantee raises the
//! grant lease to the lock's lease at once (`lua/extend.lua`, owner-checked) with `WAIT`
//! pipelined, and gives the grant up (released, passed on) if too few replicas confirmed it
//! (`FairLock::confirm_grant`). Without required confirmation none of this is sent.
//!
//! Wire, per operation (one round trip each):
//! - acquire by a lock object that has not found the lock held for a second (unfenced):
//!   `SET key <token> NX PX <lease ms>` → `OK` or nil (then the script below at once);
//! - acquire: `EVALSHA <fair_acquire.lua> 3|4 key dlock_fair_q:{key} dlock_fair_d:{key}
//!   [dlock_fence:{key}] <token> <lease ms> w|t <entry ttl ms> <grant ms> dlock_fair_ch:`
//!   → `{1, fence}` (ours) or `{0, rank, seconds, microseconds}` (queued: `w`; not queued:
//!   `t`, rank -1);
//! - release, and a waiter's withdrawal: `EVALSHA <fair_release.lua> 3|4 … <token> <grant ms>
//!   dlock_fair_ch: [<successor> <entry ttl ms>]` → `{1, receivers, granted token, fence,
//!   seconds, microseconds}` (granted, or a successor was given), `1` (released, nobody to
//!   grant to) or `0` (not ours). The successor is the token of the thread of this client that
//!   heads its line and waits for the lock held by another of its threads: it sends nothing
//!   and the release queues it (or grants it the lock) in the same script
//!   ([`WaitQueues::offer`](crate::client::waiters::WaitQueues::offer));
//! - extend: `EVALSHA <extend.lua> 1 key <token> <ttl ms>`; check: `GET key`;
//! - with replica confirmation required, `WAIT <n> <ms>` after each acquire and extend, and a
//!   grant heard: `EVALSHA <extend.lua> 1 key <token> <lease ms>` + `WAIT` (one round trip).
//!
//! See `docs/fair.md` for the failure cases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{ToRedisArgs, Value};

use crate::client::access;
use crate::client::cleanup::{Cleanup, Done};
use crate::client::grants::{Grant, Token, CLIENT_ID_LEN, TOKEN_LEN};
use crate::client::live;
use crate::client::subscriber::Delivery;
use crate::client::waiters::Offer;
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::ids::new_token;
use crate::keys;
use crate::lease::{Lease, RenewKind, WatchState};
use crate::lock::{self, DistributedLock, LockGuard, LockState};
use crate::primitives::hold::{self, HoldOptions};
use crate::primitives::string_value;
use crate::retry::Attempts;
use crate::scripts::Scripts;
use crate::stats::Kind;

/// The stats label of fair locks.
pub(crate) const KIND: Kind = Kind::new("fair");

/// How long a lock object that found the lock held sends its first attempts as the script
/// (which queues) rather than as a plain `SET NX PX` (which cannot).
const CONTENDED_MEMORY: Duration = Duration::from_secs(1);
/// The poll of a waiter behind the first two in the queue (plus up to a fifth at random).
const POLL_DEEP: Duration = Duration::from_millis(500);
/// Prefixes of the queue's sorted sets and of the grant channel (all in the key's slot).
const QUEUE_PREFIX: &str = "dlock_fair_q";
const DEADLINES_PREFIX: &str = "dlock_fair_d";
/// Grants to a client's waiters are published on `dlock_fair_ch:<client id>`: one channel per
/// client (whatever the key), so a grant wakes only the subscriber of the client it is for.
pub(crate) const CHANNEL_PREFIX: &str = "dlock_fair_ch:";

/// A lock of [`Strategy::Fair`](crate::Strategy::Fair). Build it with
/// [`LockBuilder`](crate::LockBuilder).
#[derive(Debug)]
pub struct FairLock {
    client: LockClient,
    key: String,
    opts: HoldOptions,
    queue: String,
    deadlines: String,
    channel: String,
    grant: Duration,
    /// How long this lock's queue entries live without a refresh (see
    /// [`FairLock::QUEUE_ENTRY_TTL`](crate::FairLock::QUEUE_ENTRY_TTL)).
    entry_ttl: Duration,
    /// Base of `contended_until_ms`.
    base: Instant,
    /// Until when (ms after `base`) this lock object saw the lock held: until then attempts
    /// go straight to the script; after it, a first attempt is a plain `SET NX PX`.
    contended_until_ms: AtomicU64,
}

/// How one attempt came out.
enum Outcome {
    Taken(Lease),
    /// Refused (and queued, when asked to wait): the server's time of the refusal in µs and
    /// how many waiters are ahead of us in Redis (-1: not queued).
    Refused {
        at_us: u64,
        rank: i64,
    },
}

/// How long the queue entries of a lock whose retry policy sleeps at most `max_delay` live
/// without a refresh: [`FairLock::QUEUE_ENTRY_TTL`](crate::FairLock::QUEUE_ENTRY_TTL), or three times its waiters' longest poll floor
/// (`max(POLL_DEEP, max_delay)`; a poll adds up to a half of it at random), if that is longer.
/// At most a day (the scripts double it for the queue's own lifetime).
fn entry_ttl(max_delay: Duration) -> Duration {
    const LONGEST: Duration = Duration::from_secs(24 * 3600);
    let ttl = FairLock::QUEUE_ENTRY_TTL.max(POLL_DEEP.max(max_delay).saturating_mul(3));
    // Whole milliseconds, as sent.
    Duration::from_millis(ttl.min(LONGEST).as_millis() as u64)
}

/// A reply of `lua/fair_release.lua`.
#[derive(Debug, PartialEq, Eq)]
struct ReleaseReply {
    /// The lock held our token (and was released or passed on).
    ours: bool,
    /// The token the lock was granted to (empty when nothing was granted).
    granted: Vec<u8>,
    /// The grant's fence and server time (zero when nothing was granted).
    grant: Grant,
}

/// Reads a reply of `lua/fair_release.lua` sent again by the janitor or a Sentinel replay: the
/// lock freed (and maybe granted) when the token was ours, else nothing done.
fn read_release(v: &Value) -> (Done, Option<(Vec<u8>, Grant)>) {
    match parse_release(v) {
        Some(r) if r.ours => {
            let granted = (!r.granted.is_empty()).then_some((r.granted, r.grant));
            (Done::Freed, granted)
        }
        _ => (Done::Nothing, None),
    }
}

/// Parses a reply of `lua/fair_release.lua`: `0` (not ours), `1` (released, nobody to grant
/// to) or `{1, receivers, token, fence, seconds, microseconds}` (granted). `None` for anything
/// else.
fn parse_release(reply: &Value) -> Option<ReleaseReply> {
    let (ok, _, granted, fence, secs, micros): (i64, i64, Vec<u8>, u64, u64, u64) = match reply {
        Value::Int(ok @ (0 | 1)) => (*ok, 0, Vec::new(), 0, 0, 0),
        Value::Array(_) => redis::from_redis_value_ref(reply).ok()?,
        _ => return None,
    };
    Some(ReleaseReply {
        ours: ok == 1,
        granted,
        grant: Grant::new(fence, secs, micros),
    })
}

/// When a thread stops waiting, however it leaves: withdraws its offer to be queued by
/// another thread's release, if it made one (see
/// [`WaitQueues::offer`](crate::client::waiters::WaitQueues::offer)), then removes its
/// expected grant.
struct Expecting<'a> {
    lock: &'a FairLock,
    token: Token,
    offered: bool,
}

impl Drop for Expecting<'_> {
    fn drop(&mut self) {
        let waiters = self.lock.client.waiters();
        if self.offered {
            waiters.withdraw_offer(&self.lock.key, &self.token, None);
        }
        waiters.grants.forget(&self.token);
    }
}

impl FairLock {
    /// The short lease a release gives the next waiter's grant, until the waiter's watchdog
    /// raises it: 600 ms.
    ///
    /// The lease a release writes when it grants the lock to the next waiter (shorter if the
    /// lock's own lease is shorter). A grant to a waiter that died meanwhile therefore blocks the
    /// line for at most this long (plus the next waiter's poll, 100–120 ms). A living waiter's
    /// client raises it to the lock's lease a third of it after the grant (at once, before its
    /// `lock()` returns, when the client requires replicas to confirm its writes).
    pub const GRANT_LEASE: Duration = Duration::from_millis(600);
    /// How long a waiter's queue entry lives without a refresh: 2 s.
    ///
    /// How long a waiter's queue entry lives without a refresh. A waiting thread refreshes it with
    /// each poll (every 100–600 ms), so the entry of a waiter that died lapses within this long and
    /// is skipped by the next grant. A lock whose retry policy sleeps longer polls no faster than
    /// its longest sleep (plus up to a half at random): its entries live three times that sleep
    /// instead, when that is longer, so that they never lapse between two polls.
    pub const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(2);

    pub(crate) fn new(client: LockClient, key: String, opts: HoldOptions) -> Result<Self> {
        // The client's id in fair-lock tokens: the first 16 hex digits of its instance id.
        let id = client.token_prefix();
        Ok(FairLock {
            queue: Self::queue_key_for(&key)?,
            deadlines: keys::aux_key(DEADLINES_PREFIX, &key)?,
            channel: format!("{CHANNEL_PREFIX}{}", String::from_utf8_lossy(&id)),
            grant: FairLock::GRANT_LEASE.min(opts.lease),
            entry_ttl: entry_ttl(opts.retry.max_delay),
            base: Instant::now(),
            contended_until_ms: AtomicU64::new(0),
            client,
            key,
            opts,
        })
    }

    /// True if the watchdog renews this lock's holds (built without an explicit ttl).
    pub fn is_watched(&self) -> bool {
        self.opts.watched
    }

    /// The sorted set holding the queue's order (token → arrival: the server's time in µs).
    pub fn queue_key(&self) -> &str {
        &self.queue
    }

    /// The name of the queue of the fair lock on `key`, as every client names it (the same as
    /// [`queue_key`](Self::queue_key) of a lock built on `key`), without a client: for
    /// monitoring, `ZCARD` of it counts the waiters queued in Redis (one per client and key;
    /// a client's other threads wait in its own line). `dlock_fair_q:{key}` for a key without
    /// braces; for a key with braces, a name in the key's cluster slot.
    ///
    /// # Errors
    ///
    /// None in practice: every key has such a name (see `docs/deployments.md`); the `Result`
    /// is kept for the API's stability.
    pub fn queue_key_for(key: &str) -> Result<String> {
        keys::aux_key(QUEUE_PREFIX, key)
    }

    /// The channel grants to this client's waiters are published on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// A fresh owner token: this client's id, then 128 random bits in hex.
    fn new_token(&self) -> Token {
        let mut t = [0u8; TOKEN_LEN];
        t[..CLIENT_ID_LEN].copy_from_slice(&self.client.token_prefix());
        t[CLIENT_ID_LEN..].copy_from_slice(&new_token());
        t
    }

    fn script_keys(&self) -> Vec<&str> {
        let mut k = vec![self.key.as_str(), &self.queue, &self.deadlines];
        k.extend(self.opts.fence_key.as_deref());
        k
    }

    /// True if this lock object has not found the lock held for [`CONTENDED_MEMORY`] and has
    /// no fencing: its first attempt is then a plain `SET NX PX`, as Token's. Such an attempt
    /// does not look at the queue, so it can take a lock that is free while waiters are queued;
    /// that happens only after a holder or a grantee died, until the next waiter's poll.
    fn quiet(&self) -> bool {
        self.opts.fence_key.is_none() && !self.seen_held()
    }

    /// True if this lock object found the lock held within [`CONTENDED_MEMORY`]: others may
    /// be queued, so a release may grant.
    fn seen_held(&self) -> bool {
        (self.base.elapsed().as_millis() as u64) < self.contended_until_ms.load(Ordering::Relaxed)
    }

    /// The lock was found held: attempts go to the script for a while.
    fn contended(&self) {
        let until = (self.base.elapsed() + CONTENDED_MEMORY).as_millis() as u64;
        self.contended_until_ms.store(until, Ordering::Relaxed);
    }

    /// One plain `SET key <token> NX PX <lease>`: the lease if taken, `None` if held.
    fn attempt_plain(&self, token: &Token) -> Result<Option<Lease>> {
        let start = Instant::now();
        let reply: Value = self.acquire_undone(token, start, |con, _| {
            string_value::set_nx_px(&self.key, token, self.opts.lease_ms()).query(con)
        })?;
        let result = if reply == Value::Okay {
            self.won(token, start, 0).map(Some)
        } else {
            self.contended();
            Ok(None)
        };
        self.client.counters().outcome_lease(KIND, &result);
        result
    }

    /// Sends an acquire with `token` (or a grant's raise), started at `start`, by `send`. If it
    /// got no reply, it may still run (or have run) and leave the lock ours, granted or taken, or
    /// our entry in the queue, with nobody waiting for either: the janitor sends our release
    /// (`lua/fair_release.lua`) until it is answered or until a lease from `start` has passed;
    /// it passes the lock on to the next waiter if it is ours, else removes our entry.
    fn acquire_undone<T>(
        &self,
        token: &Token,
        start: Instant,
        send: impl FnMut(&mut Conn, &Scripts) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let until = crate::time::saturating_add(start, self.opts.lease);
        string_value::acquire_undone_by(&self.client, &self.key, until, send, |_| {
            Some(self.fair_release(token))
        })
    }

    /// The release of `token` sent again (`lua/fair_release.lua`, owner-checked by the token):
    /// it deletes the key only if it still holds that token and, if a live waiter heads the
    /// queue, grants it the lock and publishes the grant, as the release did; a token that only
    /// waited in the queue is removed from it.
    fn fair_release(&self, token: &[u8]) -> Cleanup {
        Cleanup {
            script: |s| &s.fair_release,
            keys: self.script_keys().into_iter().map(str::to_owned).collect(),
            args: (token, self.grant_ms(), CHANNEL_PREFIX).to_redis_args(),
            value_arg: 0,
            read: read_release,
            counted: false,
            what: "the fair release, which grants the lock to the next live waiter",
        }
    }

    fn grant_ms(&self) -> u64 {
        self.grant.as_millis() as u64
    }

    /// A quiet lock object's attempt (see [`quiet`](Self::quiet)): one plain `SET NX PX`, and
    /// the guard if it took the lock. `None` without an attempt when not quiet.
    fn plain_if_quiet(&self, attempts: &mut Attempts<'_>) -> Result<Option<LockGuard<'_>>> {
        if !self.quiet() {
            return Ok(None);
        }
        attempts.record();
        Ok(self
            .try_take(true)?
            .map(|lease| LockGuard::new(self, lease)))
    }

    /// One `lua/fair_acquire.lua` call; `wait`: join (or refresh) the queue when refused.
    fn attempt(&self, token: &Token, wait: bool, start: Instant) -> Result<Outcome> {
        let reply: Vec<i64> = self.acquire_undone(token, start, |con, s| {
            s.fair_acquire.eval_keys(
                con,
                &self.script_keys(),
                (
                    &token[..],
                    self.opts.lease_ms(),
                    if wait { "w" } else { "t" },
                    self.entry_ttl.as_millis() as u64,
                    self.grant_ms(),
                    CHANNEL_PREFIX,
                ),
            )
        })?;
        match reply.as_slice() {
            [1, fence] => {
                let lease = self.won(token, start, u64::try_from(*fence).unwrap_or(0))?;
                self.client.counters().attempt(KIND, true);
                Ok(Outcome::Taken(lease))
            }
            [0, rank, secs, micros] => {
                self.contended();
                self.client.counters().attempt(KIND, false);
                log::trace!(
                    "lock {:?}: refused, {rank} waiters ahead in Redis",
                    self.key
                );
                let u = |v: &i64| u64::try_from(*v).unwrap_or(0);
                let at_us = Grant::new(0, u(secs), u(micros)).at_us;
                Ok(Outcome::Refused { at_us, rank: *rank })
            }
            _ => Err(LockError::unexpected_reply(
                &self.key,
                "fair_acquire.lua",
                &reply,
            )),
        }
    }

    /// How long a listening waiter sleeps before it polls (which also refreshes its queue
    /// entry): 100–120 ms at the head of the queue or next to it (the poll catches a lost
    /// grant message, and a grant to a dead head that lapsed), 500–600 ms further back (well
    /// within [`FairLock::QUEUE_ENTRY_TTL`](crate::FairLock::QUEUE_ENTRY_TTL)); at least the retry policy's longest sleep, which the
    /// entry's lifetime then covers (`entry_ttl`).
    fn poll_interval(&self, rank: i64) -> Duration {
        let floor = self.opts.retry.max_delay;
        if rank <= 1 {
            return self.client.waiters().poll_interval(&self.key, floor);
        }
        let base = POLL_DEEP.max(floor);
        base.saturating_add(rand::RngExt::random_range(
            &mut rand::rng(),
            Duration::ZERO..=base / 5,
        ))
    }

    /// The lease of a grant that arrived by message. Our latest attempt was sent at `sent`
    /// and run by the server at its time `attempt_us`; the grant was made at the server's time
    /// `grant.at_us`, not earlier (older grants are dropped before). So it was made at least
    /// `grant.at_us - attempt_us` after `sent` (less 1% for the clocks' rates), and the lease
    /// counts from there: it never outlives the grant lease in Redis. `None` if less than the
    /// margin of [`crate::lease::checked_win`] is left (the message took as long as what is left):
    /// then Redis is asked.
    fn granted_lease(
        &self,
        token: &Token,
        sent: Instant,
        attempt_us: u64,
        grant: Grant,
    ) -> Option<Lease> {
        // attempt_us 0: no attempt of ours; `sent` is when the release that queued us was sent.
        let after = if attempt_us == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(grant.at_us.saturating_sub(attempt_us))
        };
        let now = Instant::now();
        let start = crate::time::saturating_add(sent, after - after / 100).min(now);
        let elapsed = now - start;
        let left = self.grant.saturating_sub(elapsed);
        if left <= crate::lease::arrival_margin(self.grant, elapsed) {
            log::debug!(
                "lock {:?}: grant heard {} ms after it was made; asking Redis",
                self.key,
                elapsed.as_millis()
            );
            return None;
        }
        // Ours: while other threads of this client wait for it, the head of their line offers
        // to be queued by our release (see `acquire_blocking`).
        self.client.waiters().note_local_hold(&self.key);
        let lease = Lease::new(token, start, self.grant).with_fence(self.fence(grant.fence));
        let state = WatchState::new(
            std::sync::Arc::clone(&self.opts.key),
            RenewKind::ScriptedValue(KIND),
            token,
            self.opts.lease,
            start,
            self.opts.on_lost.clone().filter(|_| self.opts.watched),
        );
        state.granted_for(self.grant, !self.opts.watched);
        let due = crate::time::saturating_add(start, self.grant / 3);
        self.client.watchdog().watch(&self.client, &state, due);
        Some(lease.with_watch(state))
    }

    /// One `lua/fair_release.lua` call; `successor`: the token of this client's thread that
    /// heads the line, to be queued (or granted the lock) by this release.
    fn release_script(&self, value: &[u8], successor: Option<&Token>) -> Result<ReleaseReply> {
        let keys = self.script_keys();
        // The successor and its entry's lifetime, or no ARGV at all.
        let successor = successor.map(|t| (&t[..], self.entry_ttl.as_millis() as u64));
        let args = (value, self.grant_ms(), CHANNEL_PREFIX, successor);
        // Grant first. Redis writes what an event-loop turn produced client by client, the
        // client that got its first output last going first (Redis 7's pending-write list),
        // so the reply to a bare EVALSHA would leave before the grant it published. A PING in
        // front gives our connection its first output before the grant: the grant is written
        // first, and the next holder starts before this thread has its reply (and, in a loop,
        // sends its next queueing call). Only when others may be queued: one command more, in
        // the same round trip; not on a cluster connection, which routes a keyless PING apart.
        let grant_first = self.seen_held() && !self.client.is_cluster();
        let reply: Value = self.client.with_conn(&self.key, |con, s| {
            s.fair_release
                .eval_keys_after(con, &keys, args, grant_first)
        })?;
        parse_release(&reply)
            .ok_or_else(|| LockError::unexpected_reply(&self.key, "fair_release.lua", &reply))
    }

    fn timeout(&self, attempts: &Attempts<'_>) -> LockError {
        // Returned to the caller: logged for debugging only.
        log::debug!(
            "lock {:?}: gave up after {} attempts in {:?}",
            self.key,
            attempts.made(),
            attempts.waited()
        );
        LockError::Timeout {
            key: self.key.clone(),
            attempts: attempts.made(),
            waited: attempts.waited(),
        }
    }

    /// A grant heard by a client that requires replicas to confirm its hold writes: the grant
    /// is a write of the releasing client (its `SET key <token> PX <grant>`), which no `WAIT`
    /// of ours covers, so a failover could lose it while we take it for a hold. Our own write
    /// on it is confirmed instead: the grant lease raised at once to the lock's lease
    /// (`lua/extend.lua`, owner-checked by the token), with `WAIT` in the same round trip, so
    /// the watchdog has no grant lease to raise later. The lease then counts from this call,
    /// as an acquire's. `Ok(None)`: the key no longer held our token (the grant lapsed or was
    /// deleted first): Redis is asked. [`LockError::NotReplicated`] (or a lost reply): the
    /// raise may stand on the primary; the janitor sends our release (which passes the lock on)
    /// and the caller leaves the queue, as after a failed attempt.
    fn confirm_grant(&self, token: &Token, grant: Grant) -> Result<Option<Lease>> {
        let start = Instant::now();
        let raised: i64 = self.acquire_undone(token, start, |con, s| {
            s.extend
                .eval(con, &self.key, (&token[..], self.opts.lease_ms()))
        })?;
        if raised != 1 {
            log::debug!(
                "lock {:?}: the grant was gone before its confirmed raise; asking Redis",
                self.key
            );
            return Ok(None);
        }
        self.won(token, start, grant.fence).map(Some)
    }

    /// The fencing token of a hold, if the lock is fenced: `fence` unless 0 (none).
    fn fence(&self, fence: u64) -> Option<u64> {
        self.opts
            .fence_key
            .as_ref()
            .and(Some(fence).filter(|&f| f > 0))
    }

    /// The lock is ours (taken, or a grant confirmed) by a call sent at `start`: the hold,
    /// checked against its lease.
    fn won(&self, token: &Token, start: Instant, fence: u64) -> Result<Lease> {
        self.client.waiters().note_local_hold(&self.key);
        let kind = RenewKind::ScriptedValue(KIND);
        let fence = self.fence(fence);
        let lease = self
            .opts
            .lease(&self.client, kind, token, start, fence, None);
        crate::lease::checked_win(&self.key, lease, self.opts.lease, Instant::now(), |l| {
            self.release(l)
        })
    }

    /// The blocking acquire: wait for our turn among this client's threads, then take the lock
    /// or join the queue in Redis in one script call (or, while another thread of this client
    /// holds the lock, offer our token to be queued by its release, and send nothing), and
    /// wait for the grant message (polling slowly beside it, which also refreshes our queue
    /// entry).
    ///
    /// A transient failure ([`LockError::is_transient`]: a failover, a restart) is retried with
    /// the policy's backoff until the deadline, the last one returned then.
    fn acquire_blocking(&self, mut attempts: Attempts<'_>) -> Result<LockGuard<'_>> {
        let result = loop {
            match self.acquire_blocking_once(&mut attempts) {
                Err(e) if e.is_transient() => {
                    let Some(sleep) = attempts.next_sleep() else {
                        break Err(e);
                    };
                    log::debug!("{}; retried in {sleep:?}", e.report());
                    std::thread::sleep(sleep);
                }
                other => break other,
            }
        };
        self.client.counters().blocking(KIND, &result);
        result
    }

    /// One blocking acquire, until the deadline or the first failure.
    fn acquire_blocking_once(&self, attempts: &mut Attempts<'_>) -> Result<LockGuard<'_>> {
        let queues = self.client.waiters();
        let wakeups = self.client.wakeups();
        let deadline = attempts.queue_deadline();
        // Uncontended: a lock object that has not found the lock held lately, with no thread
        // of this client waiting for it, tries at once, as the other locks do
        // (`crate::client::acquire::acquire_in_line`); the line is joined only if that fails.
        if !queues.has_waiters(&self.key) {
            if let Some(guard) = self.plain_if_quiet(attempts)? {
                return Ok(guard);
            }
        }
        // Threads of this client meet in its line first: only its head is in the queue in
        // Redis (joined before its first attempt there, so a burst of threads does not all
        // go).
        let mut ticket = queues.enqueue(&self.key);
        if ticket.ahead() > 0 {
            self.client.note(crate::client::test_hooks::Event::Queued);
            if !ticket.wait_turn(deadline) {
                return Err(self.timeout(attempts));
            }
        }
        if let Some(guard) = self.plain_if_quiet(attempts)? {
            return Ok(guard);
        }
        let token = self.new_token();
        // Live until taken or given up: a grant to it may be written by any release.
        let mut live = self.client.live().write(&token, Instant::now());
        let mut hold = |lease| {
            live.keep_at(self.opts.lease, Instant::now());
            Ok(LockGuard::new(self, lease))
        };
        queues.grants.register(&token, &self.key);
        // The subscriber generation confirmed when the latest attempt was sent: a grant
        // published later, while it stays confirmed, is heard.
        let mut heard = wakeups.confirmed_on(&self.channel);
        // While another thread of this client holds the lock, its release queues us (or
        // grants us the lock) in the same script: we offer our token and send nothing now.
        let mut offered = queues.offer(&self.key, &token);
        let expecting = Expecting {
            lock: self,
            token,
            offered,
        };
        let (mut sent, mut last_us, mut rank) = (Instant::now(), 0, 0);
        if !offered {
            attempts.record();
            (last_us, rank) = match self.attempt(&token, true, sent)? {
                Outcome::Taken(lease) => return hold(lease),
                Outcome::Refused { at_us, rank } => (at_us, rank),
            };
        }
        // In the queue in Redis, or offered to the holder's release that queues us.
        self.client.note(crate::client::test_hooks::Event::Queued);
        let subscription = wakeups.subscribe(&self.channel, &self.key, Delivery::HandOff, deadline);
        let mut late = None;
        let mut noted_listening = false;
        // Ends with a failure that gives up at once, or `None` at the deadline.
        let failed = 'wait: loop {
            'ask: {
                if let Some(grant) = queues.grants.take(&token) {
                    self.client.note(crate::client::test_hooks::Event::Granted);
                    if grant.at_us < last_us {
                        // Made before our latest attempt, which did not find the lock ours:
                        // that grant lapsed (or was released) already. A late message; ignored.
                        log::debug!("lock {:?}: ignored a grant heard late", self.key);
                    } else {
                        let confirmed = self.client.confirms_writes();
                        let lease = if confirmed {
                            // The grant is a write of another client's release, which no
                            // `WAIT` of ours covers: our own write on it is confirmed before it
                            // is a hold.
                            match self.confirm_grant(&token, grant) {
                                // Too late to be used (released again): Redis is asked.
                                Err(LockError::LateReply { .. }) => None,
                                // None: the grant was gone before our raise.
                                Ok(lease) => lease,
                                Err(e) => break 'wait Some(e),
                            }
                        } else {
                            // What the grant's lease is counted from: our latest attempt, or,
                            // while we have made none, the release that queued us.
                            let basis = match offered.then(|| queues.offer_state(&self.key, &token))
                            {
                                None => Some((sent, last_us)),
                                Some(Some(Offer::Taken { sent, .. })) => Some((sent, 0)),
                                Some(Some(Offer::Settled { sent, at_us, .. })) => {
                                    Some((sent, at_us.unwrap_or(0)))
                                }
                                Some(_) => None,
                            };
                            basis.and_then(|(sent, attempt_us)| {
                                self.granted_lease(&token, sent, attempt_us, grant)
                            })
                        };
                        // No hold from the grant: Redis is asked.
                        let Some(lease) = lease else {
                            break 'ask;
                        };
                        self.client.counters().attempt(KIND, true);
                        log::debug!(
                            "lock {:?}: granted{} after {} attempts in {:?}",
                            self.key,
                            if confirmed { " (confirmed)" } else { "" },
                            attempts.made(),
                            attempts.waited()
                        );
                        return hold(lease);
                    }
                }
                // A grant is heard only while the subscription that was confirmed at our
                // latest attempt stays confirmed; otherwise ask Redis at once.
                let listening = wakeups.confirmed_on(&self.channel);
                // While our offer stands (no release has taken it), nothing of ours is in
                // Redis and nothing can be granted to our token but by the release that takes
                // the offer, which runs after the confirmation just read: a subscription
                // confirmed since is no reason to ask Redis, and without one there is nothing
                // to poll for before the poll interval (a hold that ended without a release
                // of this client). Asking sooner would withdraw the offer and queue us in
                // Redis while a thread of our client holds the lock.
                let standing = offered
                    && matches!(queues.offer_state(&self.key, &token), Some(Offer::Open(_)));
                if standing {
                    heard = listening;
                }
                if listening.is_some() && listening != heard {
                    break 'ask;
                }
                if listening.is_some() && !noted_listening {
                    noted_listening = true;
                    self.client
                        .note(crate::client::test_hooks::Event::Listening);
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    break 'wait None;
                }
                let polling = listening.is_some() || standing;
                let nap = polling.then(|| self.poll_interval(rank));
                let Some(nap) = nap.or_else(|| attempts.next_sleep()) else {
                    break 'wait None;
                };
                let nap = deadline.map_or(nap, |d| nap.min(d.saturating_duration_since(now)));
                // Woken early by a grant, or by the subscriber after a reconnection. While
                // listening, this thread reads the subscriber connection itself when it
                // can, so that its grant wakes it directly.
                let until = crate::time::saturating_add(Instant::now(), nap);
                if !(listening.is_some() && wakeups.await_grant(&token, until)) {
                    ticket.sleep(nap);
                }
                if queues.grants.is_granted(&token) {
                    continue 'wait;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break 'wait None;
                }
                if polling && Instant::now() < until {
                    // Woken early, not by a grant: the subscriber's link changed (a
                    // subscription confirmed, or lost). Look at the subscription again (a
                    // lost or renewed one is asked about at once); while it stays as it
                    // was, a grant is heard and there is nothing to poll for yet.
                    ticket.mark();
                    continue 'wait;
                }
            }
            if offered {
                // From now on we queue ourselves (our entry, if the release queued us, keeps
                // its place); an offer no release took yet is withdrawn.
                queues.reclaim_offer(&self.key, &token);
                offered = false;
            }
            ticket.mark();
            heard = wakeups.confirmed_on(&self.channel);
            let at = Instant::now();
            attempts.record();
            match self.attempt(&token, true, at) {
                Ok(Outcome::Taken(lease)) => return hold(lease),
                // `sent` and `last_us`: the pair a grant's lease is counted from (see
                // `granted_lease`).
                Ok(Outcome::Refused { at_us, rank: r }) => {
                    (sent, last_us, rank, late) = (at, at_us, r, None);
                }
                Err(e @ LockError::LateReply { .. }) => late = Some(e),
                Err(e) => break 'wait Some(e),
            }
        };
        drop(subscription);
        // A release that carries our offered token and has no reply yet is waited for (at most
        // the grant lease), so that our withdrawal reaches Redis after it and removes what it
        // queued or granted. While our ticket holds the line, which the offer lives in.
        if expecting.offered {
            queues.withdraw_offer(&self.key, &token, Some(self.grant));
        }
        // At the deadline the line goes to the next thread at once; after a failure it goes
        // after the withdrawal, so that the next thread's attempt does not find our entry
        // still heading the queue and grant the lock to us as we leave.
        let ticket = failed.is_some().then_some(ticket);
        // Withdraw: our entry goes, or a grant that reached us meanwhile is released and passed
        // on (owner-checked by the token).
        match self.release_script(&token, None) {
            Ok(reply) if reply.ours => log::info!(
                "lock {:?}: granted to us as we gave up; released and passed on",
                self.key
            ),
            Ok(_) => {}
            // The entry lapses by itself. A failure (an attempt's, or a grant's confirmation)
            // is returned itself: leaving is logged for debugging only then.
            Err(e) => {
                let level = match failed {
                    Some(_) => log::Level::Debug,
                    None => log::Level::Warn,
                };
                log::log!(
                    level,
                    "lock {:?}: giving up, could not leave the queue ({}); the entry lapses \
                     within {:?}, a grant to it within {:?}",
                    self.key,
                    e.report(),
                    self.entry_ttl,
                    self.grant
                );
            }
        }
        drop(ticket);
        Err(failed.or(late).unwrap_or_else(|| self.timeout(attempts)))
    }

    /// One attempt with a fresh token, kept live for the lease if it took the lock: a plain
    /// `SET NX PX` when `quiet`, else the script (without queueing). `Ok(None)` when another
    /// owner holds the lock.
    fn try_take(&self, quiet: bool) -> Result<Option<Lease>> {
        let token = self.new_token();
        let mut live = self.client.live().write(&token, Instant::now());
        let lease = match quiet {
            true => self.attempt_plain(&token)?,
            false => match self.attempt(&token, false, Instant::now())? {
                Outcome::Taken(lease) => Some(lease),
                Outcome::Refused { .. } => None,
            },
        };
        if lease.is_some() {
            live.keep_at(self.opts.lease, Instant::now());
        }
        Ok(lease)
    }

    /// The commands of a fair lock (see `fair.rs`, `lua/fair_acquire.lua`, `lua/fair_release.lua`,
    /// `lua/fair_live_head.lua`): the plain acquire (`SET … NX PX`), the scripts themselves
    /// (`EVALSHA`, and `EVAL` after a `NOSCRIPT`) on their keys, and what the scripts run: `GET`,
    /// `EXISTS`, `SET … PX`, `TIME`, `ZADD`, `ZREM`, `ZPOPMIN`, `ZRANGEBYSCORE`, `ZSCORE`, `ZRANK`,
    /// `PTTL`, `PEXPIRE`, `DEL`, `PUBLISH` of grants (on another client's channel and on ours),
    /// `INCR` and `GET` of the fencing counter; extend and renewal (`GET`, `PEXPIRE`); the
    /// clean-up of a lost reply or failed release (`GET`, `DEL`); and the subscriber's commands on
    /// this client's own grant channel.
    ///
    /// Grants are published on this client's channel (`dlock_fair_ch:<our client id>`) when a
    /// release grants the lock to another thread of this client, and on another client's
    /// (`dlock_fair_ch:<some other id>`): a release publishes its grant on the grantee's
    /// channel, whoever that is, so the user needs the whole pattern `dlock_fair_ch:*`. One
    /// representative name is checked.
    ///
    /// For [`LockBuilder::check_access`](crate::LockBuilder::check_access): a release grants
    /// to whoever heads the queue, so the user needs the pattern `dlock_fair_ch:*`, not only
    /// its own channel.
    pub(crate) fn access_checks(&self) -> Vec<access::Check> {
        // Every digit of our id turned into another hex digit: surely another client's id.
        let other: String = (self.client.token_prefix())
            .iter()
            .map(|&b| if b == b'0' { '1' } else { '0' })
            .collect();
        let other_channel = &format!("{CHANNEL_PREFIX}{other}");
        let (key, q, d) = (&self.key[..], &self.queue[..], &self.deadlines[..]);
        let script_keys = self.script_keys();
        let numkeys = script_keys.len().to_string();
        let script = |name: &'static str, body: &str| {
            let mut args = vec![body, numkeys.as_str()];
            args.extend_from_slice(&script_keys);
            args.push("v");
            access::check(name, &args)
        };
        let grant = "dlock-grant:v:0:0:0";
        let mut c = vec![
            access::check("set", &[key, "v", "NX", "PX", "1000"]),
            script("evalsha", "0000000000000000000000000000000000000000"),
            script("eval", "return 0"),
            access::check("get", &[key]),
            access::check("exists", &[q]),
            access::check("set", &[key, "v", "px", "1000"]),
            access::check("time", &[]),
            access::check("zadd", &[q, "NX", "1", "v"]),
            access::check("zadd", &[d, "1", "v"]),
            access::check("zrem", &[q, "v"]),
            access::check("zrem", &[d, "v"]),
            access::check("zpopmin", &[q]),
            access::check("zrangebyscore", &[d, "-inf", "1", "limit", "0", "100"]),
            access::check("zscore", &[d, "v"]),
            access::check("zrank", &[q, "v"]),
            access::check("pttl", &[key]),
            access::check("pttl", &[q]),
            access::check("pexpire", &[key, "1000"]),
            access::check("pexpire", &[q, "1000"]),
            access::check("pexpire", &[d, "1000"]),
            access::check("del", &[key]),
            access::check("publish", &[other_channel, grant]),
            access::check("publish", &[&self.channel, grant]),
        ];
        if let Some(f) = &self.opts.fence_key {
            c.push(access::check("incr", &[f]));
            c.push(access::check("get", &[f]));
        }
        c.extend(access::subscriber(&self.channel));
        c
    }
}

impl DistributedLock for FairLock {
    hold::hold_accessors!();

    fn try_acquire(&self) -> Result<Lease> {
        crate::lock::taken_or_held(&self.key, self.try_take(self.quiet()))
    }

    fn release(&self, lease: &Lease) -> Result<bool> {
        // A hold whose lifetime passed is reported lost even if the key was still ours.
        let overran = lease.is_expired();
        lease.stop_renewal();
        let (client, key, value, until) =
            (&self.client, &self.key, lease.value(), lease.valid_until());
        let waiters = client.waiters();
        let successor = waiters.take_offer(key);
        let generation = client.switch_generation();
        let reply = self.release_script(value, successor.as_ref());
        // Held no longer, whatever the answer: a failed release is the janitor's now.
        client.live().release(live::value(value), None);
        if let Some(token) = &successor {
            // The server's time of the release, which the successor's grant is counted from;
            // none when the lock was not ours (the successor was not queued) or no reply came.
            let at_us = match &reply {
                Ok(r) if r.ours && r.grant.at_us > 0 => Some(r.grant.at_us),
                _ => None,
            };
            waiters.offer_settled(key, token, at_us);
        }
        // The same release, retried (in-line first): owner-checked by the token, and granting
        // the lock to the head of the queue as this one would have.
        let redone = hold::failed_release(&reply).is_some_and(|why| {
            (client.janitor()).forget(client, self.fair_release(value), why, until)
        });
        if redone {
            // Done before the call returned: released.
            return Ok(string_value::redone_release(
                client, KIND, key, lease, overran,
            ));
        }
        let reply = reply?;
        let ours = reply.ours;
        if ours && client.switches().is_some() {
            // Done again on the new master if a Sentinel switch is announced soon: the same
            // script with the token of this client that the new master holds, if any, so it
            // deletes (and grants) only what this client wrote and no longer holds.
            let (undo, sweep) = (self.fair_release(value), client.token_prefix());
            crate::client::janitor::remember(client, undo, Some(&sweep), generation, until);
        }
        if !reply.granted.is_empty() && waiters.deliver_grant(&reply.granted, reply.grant) {
            client.wakeups().nudge();
            log::trace!("lock {:?}: granted to a thread of this client", self.key);
        }
        if !ours {
            // Returned as `Ok(false)`; a guard dropped without `unlock` warns.
            log::debug!(
                "lock {:?}: lost before release (it expired, or another owner took it over); \
                 no other owner's lock was deleted",
                self.key
            );
        }
        if !ours || overran {
            client.counters().lost_on_release(KIND, lease);
        }
        Ok(ours && !overran)
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let (client, key) = (&self.client, self.key.as_str());
        hold::extend(client, KIND, key, lease, ttl, false, |token, ttl_ms| {
            // Confirmed by the replicas the client requires, as Token's: an extend too few
            // confirmed is `NotReplicated` and leaves the lease as it was.
            let extended: i64 = client.with_conn_confirmed(key, None, |con, s| {
                s.extend.eval(con, key, (token, ttl_ms))
            })?;
            Ok((extended == 1, None))
        })
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        string_value::is_held(&self.client, &self.key, lease)
    }

    lock::guard_methods!(|this, attempts| this.acquire_blocking(attempts));
}

impl crate::lock::LockAdmin for FairLock {
    fn state(&self) -> Result<LockState> {
        hold::state(&self.client, &self.key, "string")
    }

    /// Deletes the hold whoever has it; the queue stays, so its head takes the lock at its
    /// next poll (fair waiters listen for grants, not releases: nothing is published).
    fn force_unlock(&self) -> Result<bool> {
        hold::force_unlock(&self.client, &self.key, None)
    }
}

/// True if `value`, read at a lock key, has the shape of a fair lock's value: [`TOKEN_LEN`] (48)
/// hex digits, as `FairLock::new_token` builds them (the holder client's id, then 128 random
/// bits; lowercase as this crate writes them, though either case is accepted). A guess from the
/// shape alone: any other value of 48 hex digits passes too.
pub(crate) fn recognizes(value: &[u8]) -> bool {
    value.len() == TOKEN_LEN && value.iter().all(u8::is_ascii_hexdigit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_stay_in_the_key_slot() {
        assert_eq!(FairLock::queue_key_for("a").unwrap(), "dlock_fair_q:{a}");
        assert_eq!(
            FairLock::queue_key_for("x{a}b").unwrap(),
            "dlock_fair_q:x{a}b"
        );
        // Braces that form no hash tag: another name, in the key's slot.
        for key in ["a{}b", "a{b", "job{}x", "a}b"] {
            let q = FairLock::queue_key_for(key).unwrap();
            assert_eq!(
                crate::keys::hash_slot(q.as_bytes()),
                crate::keys::hash_slot(key.as_bytes()),
                "{key} -> {q}"
            );
        }
    }

    #[test]
    fn release_replies_parse() {
        let int = Value::Int;
        let none = |ours| ReleaseReply {
            ours,
            granted: Vec::new(),
            grant: Grant::new(0, 0, 0),
        };
        assert_eq!(parse_release(&int(0)), Some(none(false)));
        assert_eq!(parse_release(&int(1)), Some(none(true)));
        assert_eq!(parse_release(&int(2)), None);
        let granted = Value::Array(vec![
            int(1),
            int(1),
            Value::BulkString(b"tok".to_vec()),
            int(7),
            int(1_700_000_000),
            int(42),
        ]);
        assert_eq!(
            parse_release(&granted),
            Some(ReleaseReply {
                ours: true,
                granted: b"tok".to_vec(),
                grant: Grant::new(7, 1_700_000_000, 42),
            })
        );
        assert_eq!(parse_release(&Value::Array(vec![int(1), int(0)])), None);
        assert_eq!(parse_release(&Value::Okay), None);
    }

    #[test]
    fn entries_outlive_the_longest_poll() {
        let ms = Duration::from_millis;
        // Defaults and short sleeps: the documented 2 s.
        assert_eq!(entry_ttl(ms(0)), FairLock::QUEUE_ENTRY_TTL);
        assert_eq!(entry_ttl(ms(500)), FairLock::QUEUE_ENTRY_TTL);
        // A poll floor of 5 s polls within 7.5 s (a half more at random): 15 s.
        assert_eq!(entry_ttl(ms(5_000)), ms(15_000));
        assert_eq!(entry_ttl(Duration::MAX), Duration::from_secs(24 * 3600));
    }

    #[test]
    fn fair_values_are_recognized() {
        let mut token = [b'0'; TOKEN_LEN];
        token[CLIENT_ID_LEN..].copy_from_slice(&new_token());
        assert!(recognizes(&token));
        assert!(recognizes(
            b"0123456789abcdef0123456789abcdef0123456789ABCDEF"
        ));
        // A Token lock's value is shorter.
        assert!(!recognizes(&new_token()));
        assert!(!recognizes(
            b"0123456789abcdef0123456789abcdef0123456789abcdeg"
        ));
        assert!(!recognizes(b""));
    }
}
