//! [`Semaphore`]: a leased counting semaphore in Redisson's `RPermitExpirableSemaphore` layout.
//!
//! The count of free permits is a string integer at the semaphore's name; the permits taken
//! are the members of the sorted set `{name}:timeout` (Redisson's `suffixName`: `name:timeout`
//! when the name contains `{`), raw 16-byte ids scored by their expiry in epoch milliseconds.
//! Releases, reclaims and count changes are published on Redisson's `redisson_sc:{name}`
//! (`prefixName`). So Java services on `redisson.getPermitExpirableSemaphore(name)` and this
//! crate share one semaphore. The acquire, release and `available` scripts first reclaim the
//! expired permits (remove them, add them back to the count), as Redisson's do. Our scripts score permits on the server's
//! clock (`TIME`); Redisson's on the Java client's. `docs/semaphore.md` has the layout, the
//! clock, the guarantees and the limits.
//!
//! Wire, per operation (one round trip each, all `EVALSHA`):
//! - acquire: `lua/semaphore_acquire.lua` keys `name {name}:timeout`, args `<n> <lease ms>
//!   redisson_sc:{name} <id>…`;
//! - release: `lua/semaphore_release.lua` keys `name {name}:timeout`, args
//!   `redisson_sc:{name} <id>…`;
//! - count: `lua/semaphore_count.lua` keys `name {name}:timeout`, args
//!   `available|set|add redisson_sc:{name} <permits>`;
//! - watched permits: the watchdog's `lua/renew_batch.lua`, layout `z` (the member's score
//!   becomes the server's time plus the lease).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::client::access;
use crate::client::acquire::wait_in_line;
use crate::client::cleanup::{Cleanup, Done};
use crate::client::grants::Grant;
use crate::client::janitor;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::keys;
use crate::lease::{checked_win, Attempt, Lease, LostLock, RenewKind};
use crate::primitives::hold::{self, HoldOptions, HoldSettings};
use crate::primitives::string_value;
use crate::retry::{Attempts, RetryPolicy};
use crate::stats::Kind;

/// The stats label of semaphore permits.
const KIND: Kind = Kind::new("semaphore");
/// Prefix of Redisson's semaphore channel (`RedissonPermitExpirableSemaphore`'s
/// `prefixName("redisson_sc", name)`).
const CHANNEL_PREFIX: &str = "redisson_sc";
/// Suffix of Redisson's sorted set of permits (`suffixName(name, "timeout")`).
const TIMEOUT_SUFFIX: &str = "timeout";
/// The most permits one acquire takes: the scripts pass the ids to one `ZADD` and `ZREM`
/// loop, which stay short.
const MAX_PER_ACQUIRE: u32 = 1000;
/// How long a refused waiter may sleep when no permit expires (none taken, or only Redisson's
/// permits without a lease): it is woken by a published release, and polls within the client's
/// poll interval anyway.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Redisson's `suffixName(name, suffix)`: `<name>:<suffix>` if the name contains `{`, else
/// `{<name>}:<suffix>` (in the name's cluster slot unless its braces form no hash tag).
fn suffix_name(name: &str, suffix: &str) -> String {
    if name.contains('{') {
        format!("{name}:{suffix}")
    } else {
        format!("{{{name}}}:{suffix}")
    }
}

/// A fresh permit id: 16 random bytes, as Redisson's `ServiceManager.generateId` (3.17+).
fn new_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    // Cannot fail: 32 hex characters always decode to 16 bytes.
    let _ = hex::decode_to_slice(crate::ids::new_token(), &mut id);
    id
}

impl LockClient {
    /// Starts building a counting semaphore named `name`, wire-compatible with Redisson's
    /// `RPermitExpirableSemaphore` (`redisson.getPermitExpirableSemaphore(name)`). The
    /// defaults: permits watched by the client's watchdog (lease
    /// [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE),
    /// 30 s), retry policy [`RetryPolicy::standard`], waiters woken by pub/sub on Redisson's
    /// `redisson_sc:{name}`.
    pub fn semaphore(&self, name: &str) -> SemaphoreBuilder {
        SemaphoreBuilder {
            client: self.clone(),
            name: name.to_owned(),
            hold: HoldSettings::default(),
            check_access: false,
        }
    }
}

/// Builds a [`Semaphore`]. Start from [`LockClient::semaphore`].
///
/// | option | default |
/// | --- | --- |
/// | [`ttl`](Self::ttl) (each permit's lease) | none: permits are watched, renewed by the watchdog |
/// | [`watchdog_lease`](Self::watchdog_lease) | [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE) (30 s), renewed every third |
/// | [`on_lost`](Self::on_lost) | none |
/// | [`retry`](Self::retry) | [`RetryPolicy::standard`] (up to 10 s) |
/// | [`check_access`](Self::check_access) | off |
#[derive(Clone)]
#[must_use]
pub struct SemaphoreBuilder {
    client: LockClient,
    name: String,
    hold: HoldSettings,
    check_access: bool,
}

impl fmt::Debug for SemaphoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphoreBuilder")
            .field("name", &self.name)
            .field("ttl", &self.hold.ttl)
            .field("watchdog_lease", &self.hold.watchdog_lease)
            .field("retry", &self.hold.retry)
            .field("on_lost", &self.hold.on_lost.is_some())
            .field("check_access", &self.check_access)
            .finish_non_exhaustive()
    }
}

impl SemaphoreBuilder {
    hold::setters! {
        /// Each permit's lease: a permit not released by then expires, and the next acquire,
        /// release or count of free permits on the semaphore (ours or Redisson's) gives it
        /// back. At least 1 ms, at most [`MAX_TTL`](crate::MAX_TTL); sub-millisecond parts
        /// are dropped. An explicit lease turns the watchdog off.
        ttl(lease: Duration) => hold.ttl = Some(lease);
        /// The lease of watched permits (built without [`ttl`](Self::ttl)), renewed by the
        /// client's watchdog every third of it. Default
        /// [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE)
        /// (30 s).
        watchdog_lease(lease: Duration) => hold.watchdog_lease = Some(lease);
        /// How [`Semaphore::acquire`] and [`Semaphore::acquire_many`] wait (and how
        /// `try_acquire_for` sleeps when pub/sub is unavailable). Default
        /// [`RetryPolicy::standard`].
        retry(policy: RetryPolicy) => hold.retry = Some(policy);
        /// Watched permits: called on the watchdog's thread when a permit is lost (its renewal
        /// found it gone, or renewals failed until its loss deadline). The [`LostLock`]'s key
        /// is the permits' sorted set, `{name}:timeout`.
        on_lost(f: impl Fn(&LostLock) + Send + Sync + 'static)
            => hold.on_lost = Some(Arc::new(f));
        /// [`build`](Self::build) also asks the server (one round trip, nothing run) whether
        /// the client's ACL user may send every command the semaphore sends, as
        /// [`LockBuilder::check_access`](crate::LockBuilder::check_access) does for a lock:
        /// `EVALSHA` (and `EVAL`, sent after a `NOSCRIPT`) on `name` and `{name}:timeout`, the
        /// commands its scripts and the watchdog's renewal run on those keys, the `PUBLISH` on
        /// `redisson_sc:{name}`, and the waiters' `SUBSCRIBE`. A denied one is a
        /// [`LockError::Config`] naming it with its key or channel, and NOPERM.
        check_access() => check_access = true;
    }

    /// Checks the options and builds the semaphore. Sends nothing to Redis, unless
    /// [`check_access`](Self::check_access) was asked for.
    ///
    /// Fails with [`LockError::Config`] on options locks refuse too (a zero or too long lease,
    /// `watchdog_lease` or `on_lost` with an explicit `ttl`, an invalid retry policy), for a
    /// client whose user may not run scripts, on a Redis Cluster for a name that contains `{`
    /// without a complete, non-empty hash tag (Redisson's `{name}:timeout` would be in another
    /// slot), and, with [`check_access`](Self::check_access), for a command the user may not
    /// send.
    pub fn build(self) -> Result<Semaphore> {
        let (name, check) = (self.name, self.check_access);
        crate::client::native::needs_scripts(self.client.native(), &name, "a semaphore")?;
        let mut opts = HoldOptions::checked(&name, self.hold)?;
        let timeout = suffix_name(&name, TIMEOUT_SUFFIX);
        if self.client.is_cluster()
            && keys::hash_slot(timeout.as_bytes()) != keys::hash_slot(name.as_bytes())
        {
            return Err(LockError::config(
                &name,
                "the name contains '{' without a complete, non-empty hash tag, so Redisson's \
                 sorted set of permits, <name>:timeout, would be in another cluster slot; use a \
                 name with a {tag} or without braces",
            ));
        }
        // Watched permits are renewed in the sorted set; waiters listen on Redisson's channel.
        opts.key = Arc::from(timeout.as_str());
        opts.channel = keys::redisson_name(CHANNEL_PREFIX, &name);
        let shared = Shared {
            line: format!("{name}\0semaphore"),
            client: self.client,
            name,
            timeout,
            opts,
        };
        if check {
            access::verify(
                &shared.client,
                &shared.name,
                "semaphore",
                &shared.access_checks(),
            )?;
        }
        Ok(Semaphore {
            shared: Arc::new(shared),
        })
    }
}

/// A distributed counting semaphore: at most the count of permits are held at a time, each
/// with a lease, wire-compatible with Redisson's `RPermitExpirableSemaphore`.
///
/// ```no_run
/// use std::time::Duration;
/// use redis_dlock::LockClient;
///
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/")?;
/// let pool = client.semaphore("reports:workers").ttl(Duration::from_secs(60)).build()?;
/// pool.try_set_permits(4)?; // only the first caller sets the count
/// let permit = pool.acquire()?; // waits within the retry policy's bound
/// // ... at most 4 holders here ...
/// assert!(permit.release()?, "a permit expired before the release");
/// # Ok(()) }
/// ```
///
/// The count lives in Redis at the name: a semaphore that was never set (no
/// [`try_set_permits`](Self::try_set_permits) nor [`add_permits`](Self::add_permits)) has no
/// permit to give, and every acquire waits. Permits are not owned by a thread: a [`Permit`]
/// may be sent to another thread and released there.
///
/// Permits with an explicit [`ttl`](SemaphoreBuilder::ttl) expire at its end; without one they
/// are watched, their expiry pushed forward by the client's watchdog while the [`Permit`]
/// lives, so that a holder that dies gives them back at most one watchdog lease later.
/// Expired permits are given back by the next acquire, release or
/// [`available`](Self::available) on the semaphore, ours or a Java client's (not by
/// [`try_set_permits`](Self::try_set_permits) nor [`add_permits`](Self::add_permits)).
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        let mut d = f.debug_struct("Semaphore");
        d.field("name", &s.name);
        s.opts.debug_fields(&mut d).finish_non_exhaustive()
    }
}

/// What a semaphore's clones share.
struct Shared {
    client: LockClient,
    /// The count's key, Redisson's name.
    name: String,
    /// Redisson's sorted set of permits, `{name}:timeout`.
    timeout: String,
    /// Lease or watchdog, retry policy; `channel` is `redisson_sc:{name}` and `key` the sorted
    /// set (where the watchdog renews permits).
    opts: HoldOptions,
    /// This client's line of waiters for the semaphore.
    line: String,
}

impl Semaphore {
    /// The semaphore's name: the Redis key of its count.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Takes one permit, waiting within the retry policy's bound (woken by the releases
    /// published on `redisson_sc:{name}`). [`LockError::Timeout`] when none was free in time.
    pub fn acquire(&self) -> Result<Permit<'_>> {
        self.acquire_many(1)
    }

    /// Takes one permit if one is free now, without waiting: else [`LockError::Held`] (a
    /// contention error, as `try_lock` gives).
    pub fn try_acquire(&self) -> Result<Permit<'_>> {
        match self.shared.attempt(1)? {
            Attempt::Acquired(leases) => Ok(self.permit(leases)),
            Attempt::Held { .. } => Err(LockError::Held {
                key: self.shared.name.clone(),
            }),
        }
    }

    /// Takes one permit, waiting at most `wait`.
    pub fn try_acquire_for(&self, wait: Duration) -> Result<Permit<'_>> {
        self.try_acquire_many_for(1, wait)
    }

    /// Takes `permits` permits at once, all or none, in one guard, waiting within the retry
    /// policy's bound. `permits` must be 1 to 1000 ([`LockError::Config`] otherwise).
    ///
    /// The threads of one client that wait on one name are served in arrival order: a thread
    /// waiting for many permits holds back those behind it, even those that want fewer than
    /// are free, until it gets its permits or gives up.
    pub fn acquire_many(&self, permits: u32) -> Result<Permit<'_>> {
        let attempts = Attempts::new(&self.shared.opts.retry);
        self.wait(permits, attempts)
    }

    /// Takes `permits` permits at once, all or none, waiting at most `wait`.
    pub fn try_acquire_many_for(&self, permits: u32, wait: Duration) -> Result<Permit<'_>> {
        let attempts = Attempts::for_duration(&self.shared.opts.retry, wait);
        self.wait(permits, attempts)
    }

    /// The free permits now, after the expired ones were given back (as Redisson's
    /// `availablePermits`, which also publishes the new count when it reclaimed some). 0 for
    /// a semaphore never set, and while the count is negative (after a negative
    /// [`add_permits`](Self::add_permits)).
    pub fn available(&self) -> Result<u64> {
        let n = self.shared.count("available", 0)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Sets the count to `permits` only if the semaphore was never set (Redisson's
    /// `trySetPermits`): true if it was set now. `permits` is at most `i64::MAX`.
    pub fn try_set_permits(&self, permits: u64) -> Result<bool> {
        let permits = i64::try_from(permits)
            .map_err(|_| LockError::config(&self.shared.name, "permits above i64::MAX"))?;
        Ok(self.shared.count("set", permits)? == 1)
    }

    /// Adds `permits` to the count, which may be negative (Redisson's `addPermits`); an unset
    /// semaphore counts from 0. A positive change is published, so waiters wake.
    pub fn add_permits(&self, permits: i64) -> Result<()> {
        self.shared.count("add", permits).map(drop)
    }

    fn permit(&self, leases: Vec<Lease>) -> Permit<'_> {
        Permit {
            semaphore: self,
            leases,
        }
    }

    fn wait(&self, permits: u32, attempts: Attempts<'_>) -> Result<Permit<'_>> {
        let s = &self.shared;
        s.check_count(permits)?;
        let line = s.opts.line(&s.client, &s.line, true, false, None);
        let floor = s.opts.retry.max_delay;
        let attempt = || s.attempt(permits);
        let leases = wait_in_line(&s.name, floor, line, attempts, attempt, |_| Ok(()));
        s.client.counters().blocking(KIND, &leases);
        Ok(self.permit(leases?))
    }
}

impl Shared {
    fn check_count(&self, permits: u32) -> Result<()> {
        if (1..=MAX_PER_ACQUIRE).contains(&permits) {
            return Ok(());
        }
        Err(LockError::config(
            &self.name,
            format!("an acquire takes 1 to {MAX_PER_ACQUIRE} permits, not {permits}"),
        ))
    }

    fn keys(&self) -> [&str; 2] {
        [&self.name, &self.timeout]
    }

    /// For [`SemaphoreBuilder::check_access`]: the scripts on the two keys, the commands they
    /// run (acquire, release, count: each opens with the reclaim; the watchdog's layout `z`
    /// runs `ZSCORE`, `TIME`, `ZADD`), and the waiters' subscription.
    fn access_checks(&self) -> Vec<access::Check> {
        let (name, t) = (self.name.as_str(), self.timeout.as_str());
        let channel = self.opts.channel.as_str();
        let script = |cmd, body| access::check(cmd, &[body, "2", name, t, "v"]);
        let mut c = vec![
            script("evalsha", "0000000000000000000000000000000000000000"),
            script("eval", "return 0"),
            access::check("time", &[]),
            access::check("get", &[name]),
            access::check("set", &[name, "1"]),
            access::check("incrby", &[name, "1"]),
            access::check("decrby", &[name, "1"]),
            access::check("pttl", &[name]),
            access::check("zrangebyscore", &[t, "0", "1", "limit", "0", "100"]),
            access::check("zrange", &[t, "0", "0", "WITHSCORES"]),
            access::check("zscore", &[t, "v"]),
            access::check("zadd", &[t, "1", "v"]),
            access::check("zrem", &[t, "v"]),
            access::check("pexpire", &[t, "1000"]),
            access::check("publish", &[channel, "1"]),
        ];
        if self.opts.wake_up == hold::WakeUp::PubSub {
            c.extend(access::subscriber(channel));
        }
        c
    }

    /// `lua/semaphore_count.lua` with `op` and `permits`.
    fn count(&self, op: &str, permits: i64) -> Result<i64> {
        let (keys, channel) = (self.keys(), &self.opts.channel);
        let n = self.client.with_conn(&self.name, |con, s| {
            s.semaphore_count
                .eval_keys(con, &keys, (op, channel, permits))
        })?;
        if op != "available" {
            // Our own waiters need not wait for the message.
            self.client.waiters().notify_release(&self.line);
        }
        Ok(n)
    }

    /// The release of `ids` (`lua/semaphore_release.lua`), as sent and as the janitor or a
    /// Sentinel replay sends it again: giving an id back twice gives it back once.
    fn release_cleanup<'i>(&self, ids: impl Iterator<Item = &'i [u8]>) -> Cleanup {
        let mut args = vec![self.opts.channel.as_bytes().to_vec()];
        args.extend(ids.map(<[u8]>::to_vec));
        Cleanup {
            script: |s| &s.semaphore_release,
            keys: vec![self.name.clone(), self.timeout.clone()],
            args,
            value_arg: 1,
            read: read_release,
            counted: false,
            what: "the semaphore release of its permits",
        }
    }

    /// Sends `release` (see [`release_cleanup`](Self::release_cleanup)): `(given back, of
    /// those past their expiry)`.
    fn send(&self, release: &Cleanup) -> Result<(i64, i64)> {
        let keys = self.keys();
        let reply: Value = self.client.with_conn(&self.name, |con, s| {
            (release.script)(s).eval_keys(con, &keys, &release.args)
        })?;
        redis::from_redis_value_ref::<(i64, i64)>(&reply)
            .map_err(|_| LockError::unexpected_reply(&self.name, "a semaphore release", &reply))
    }

    /// One attempt at `permits` permits: the leases of the permits taken, or refused with how
    /// long until the earliest permit expires.
    fn attempt(&self, permits: u32) -> Result<Attempt<Vec<Lease>>> {
        self.check_count(permits)?;
        let ids: Vec<[u8; 16]> = (0..permits).map(|_| new_id()).collect();
        let lease = self.opts.lease;
        let mut args = vec![
            permits.to_string().into_bytes(),
            self.opts.lease_ms().to_string().into_bytes(),
            self.opts.channel.as_bytes().to_vec(),
        ];
        args.extend(ids.iter().map(|id| id.to_vec()));
        let keys = self.keys();
        let start = Instant::now();
        let until = crate::time::saturating_add(start, lease);
        let reply = string_value::acquire_undone_by(
            &self.client,
            &self.name,
            until,
            |con, s| s.semaphore_acquire.eval_keys::<Value>(con, &keys, &args),
            // Sent and unanswered: the ids may have been taken; give them back.
            |_| Some(self.release_cleanup(ids.iter().map(|id| &id[..]))),
        )?;
        let seen = Instant::now();
        match redis::from_redis_value_ref::<Vec<i64>>(&reply).as_deref() {
            Ok([1, _]) => {
                let kind = RenewKind::ScoredMember(KIND);
                let mut leases: Vec<Lease> = ids
                    .iter()
                    .map(|id| (self.opts).lease(&self.client, kind, id, start, None, Some(seen)))
                    .collect();
                log::trace!("semaphore {:?}: {permits} permits taken", self.name);
                // A reply that came too late: the permits are given back, none handed out, so
                // none is counted lost if the release finds it gone or past its lease.
                if let Some(first) = leases.first().cloned() {
                    checked_win(&self.name, first, lease, seen, |_| {
                        for l in leases.iter_mut() {
                            let _ = l.note_lost();
                        }
                        self.release(&leases)
                    })?;
                }
                self.client.counters().attempt(KIND, true);
                Ok(Attempt::Acquired(leases))
            }
            Ok([0, _, wait]) => {
                let pttl = u64::try_from(*wait)
                    .map(|ms| Duration::from_millis(ms.saturating_add(1)))
                    .unwrap_or(IDLE_WAIT);
                self.client.counters().attempt(KIND, false);
                Ok(Attempt::Held {
                    pttl: Some(pttl),
                    wake: None,
                })
            }
            _ => Err(LockError::unexpected_reply(
                &self.name,
                "a semaphore acquire",
                &reply,
            )),
        }
    }

    /// Gives back the permits of `leases`: true if every one was still ours and within its
    /// lease. A release that fails on the connection (or a transient refusal) is sent again
    /// by the janitor until answered or the permits would have expired; one done shortly
    /// before a Sentinel switch is sent again to the new master.
    fn release(&self, leases: &[Lease]) -> Result<bool> {
        let sent = Instant::now();
        // By the local clock, read once: a permit past its lease is reported lost.
        let overran = leases.iter().any(|l| sent >= l.valid_until());
        leases.iter().for_each(Lease::stop_renewal);
        let until = leases.iter().map(Lease::valid_until).min().unwrap_or(sent);
        let client = &self.client;
        let release = self.release_cleanup(leases.iter().map(Lease::value));
        let generation = client.switch_generation();
        let reply = self.send(&release);
        let redone = hold::failed_release(&reply)
            .is_some_and(|why| (client.janitor()).forget(client, release.clone(), why, until));
        let ours = redone || {
            let (given, late) = reply?;
            usize::try_from(given) == Ok(leases.len()) && late == 0
        };
        if ours && client.switches().is_some() {
            janitor::remember(client, release, None, generation, until);
        }
        // Permits are free now (ours, or reclaimed): our own waiters try at once.
        client.waiters().notify_release(&self.line);
        if !ours || overran {
            // Once per guard, unless the watchdog counted a loss of its permits already.
            if let Some(first) = leases
                .first()
                .filter(|_| !leases.iter().any(Lease::loss_noted))
            {
                client.counters().lost_on_release(KIND, first);
            }
            log::debug!(
                "semaphore {:?}: a permit was lost before its release (it expired and was \
                 reclaimed, or was removed)",
                self.name
            );
        }
        Ok(ours && !overran)
    }
}

/// Reads `lua/semaphore_release.lua`'s reply sent again by the janitor or a Sentinel replay:
/// `{given back, late}`.
fn read_release(v: &Value) -> (Done, Option<(Vec<u8>, Grant)>) {
    match redis::from_redis_value_ref::<(i64, i64)>(v) {
        Ok((given, _)) if given > 0 => (Done::GaveBack, None),
        _ => (Done::Nothing, None),
    }
}

/// One or more permits of a [`Semaphore`], taken by one acquire: released together by
/// [`release`](Self::release), or on drop.
///
/// Not owned by a thread: it may be sent to another thread and released there.
#[must_use = "dropping a permit releases it at once"]
pub struct Permit<'a> {
    semaphore: &'a Semaphore,
    /// One lease per permit, whose value is its raw 16-byte id; empty once released.
    leases: Vec<Lease>,
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.semaphore.name())
            .field("ids", &self.ids())
            .field("watched", &self.leases.iter().any(Lease::is_watched))
            .finish()
    }
}

impl Permit<'_> {
    /// The permits' ids as Redisson's API shows them: 32 lowercase hex characters each (the
    /// members of `{name}:timeout` are the raw 16 bytes).
    pub fn ids(&self) -> Vec<String> {
        self.leases.iter().map(|l| hex::encode(l.value())).collect()
    }

    /// How many permits this guard holds.
    pub fn count(&self) -> u32 {
        u32::try_from(self.leases.len()).unwrap_or(u32::MAX)
    }

    /// Until when the permits are valid by the local monotonic clock, counted from before the
    /// acquire (or, watched permits, the latest renewal) was sent.
    pub fn valid_until(&self) -> Instant {
        let now = Instant::now();
        self.leases
            .iter()
            .map(Lease::valid_until)
            .min()
            .unwrap_or(now)
    }

    /// True once a permit must be taken as lost, without a round trip: its loss deadline (its
    /// lease's end less a clock-drift allowance of 1% plus 2 ms) passed by the local clock, or
    /// (watched permits) the watchdog found it gone. False does not prove the permits are
    /// still held: another client may have removed one since.
    pub fn is_lost(&self) -> bool {
        self.leases.iter().any(Lease::is_lost)
    }

    /// Gives the permits back: `Ok(true)` if every one was still ours and within its lease,
    /// `Ok(false)` if one had expired (and may have been reclaimed and taken by another) or
    /// was removed: the section may have run with more holders than the count.
    pub fn release(mut self) -> Result<bool> {
        let leases = std::mem::take(&mut self.leases);
        self.semaphore.shared.release(&leases)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let leases = std::mem::take(&mut self.leases);
        let name = self.semaphore.name();
        match self.semaphore.shared.release(&leases) {
            Ok(true) => {}
            Ok(false) => log::warn!(
                "semaphore {name:?}: a permit dropped unreleased was lost before the drop \
                 released it (it expired, or was removed)"
            ),
            Err(e) => log::warn!(
                "semaphore {name:?}: the drop of a permit could not release it ({}); it \
                 expires with its lease",
                e.report()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_redissons_rules() {
        assert_eq!(suffix_name("s", "timeout"), "{s}:timeout");
        assert_eq!(suffix_name("{u}:s", "timeout"), "{u}:s:timeout");
        assert_eq!(keys::redisson_name(CHANNEL_PREFIX, "s"), "redisson_sc:{s}");
        assert_eq!(
            keys::hash_slot(suffix_name("jobs", TIMEOUT_SUFFIX).as_bytes()),
            keys::hash_slot(b"jobs")
        );
    }

    #[test]
    fn handles_and_permits_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Semaphore>();
        send_sync::<SemaphoreBuilder>();
        send::<Permit<'static>>();
    }

    #[test]
    fn ids_are_16_random_bytes() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert_eq!(hex::encode(a).len(), 32);
    }

    #[test]
    fn release_replies_are_read() {
        let reply = |a, b| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(read_release(&reply(2, 0)).0, Done::GaveBack);
        assert_eq!(read_release(&reply(0, 0)).0, Done::Nothing);
        assert_eq!(read_release(&Value::Nil).0, Done::Nothing);
    }

    #[test]
    fn scripts_bound_their_loops() {
        let built = crate::scripts::Scripts::for_server(None);
        for script in [
            &built.semaphore_acquire,
            &built.semaphore_release,
            &built.semaphore_count,
        ] {
            let code = script.code();
            assert!(code.starts_with("-- "));
            assert!(code.contains("KEYS[2]") && code.contains("ARGV[1]"));
            // The shared opening is in, once.
            assert_eq!(code.matches("local function reclaim(").count(), 1);
            // Every reclaim is limited.
            assert_eq!(
                code.matches("zrangebyscore").count(),
                code.matches("'limit', 0,").count()
            );
        }
    }
}
