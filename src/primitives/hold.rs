//! What the Token and reentrant locks share beyond their wire format: a lease that is either
//! explicit or watched, an optional fencing token, and waits woken by pub/sub. Also the parts
//! of `extend`, `state` and `force_unlock` that are the same for every lock whose hold is its
//! key alone (Token, Fair, Reentrant, Classic), and the forwarding `impl`s of a lock that is
//! another one underneath (`Lock`, `SpringLock`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::client::acquire::{Line, Wake};
use crate::client::admin;
use crate::client::live;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::keys;
use crate::lease::{Attempt, Lease, LostCallback, RenewKind, WatchState, WATCHDOG_DEFAULT_LEASE};
use crate::lock::{check_lock_options, LockState};
use crate::retry::RetryPolicy;
use crate::stats::Kind;
use crate::time::check_duration;

/// How blocked threads learn that a lock was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WakeUp {
    /// Subscribe to the lock's release channel (one shared subscriber connection per client)
    /// and sleep until a release is published, at most the holder's remaining lifetime, and
    /// poll beside it for holders that release without publishing (redis-py's `Lock`,
    /// node-redlock, legacy lockers): every 100–120 ms, or every 20–30 ms for a while once the
    /// client saw the key freed without a message (at least the retry policy's longest sleep
    /// either way; only the head of the client's line of waiters polls). The default for
    /// [`Strategy::Token`](crate::Strategy::Token) and
    /// [`Strategy::Reentrant`](crate::Strategy::Reentrant).
    #[default]
    PubSub,
    /// Poll by the retry policy only (the only way of
    /// [`Strategy::Classic`](crate::Strategy::Classic), whose legacy peers do not publish).
    Polling,
}

/// The lease options a builder collected for a lock held at its key, not checked yet: see
/// [`HoldOptions::checked`].
#[derive(Clone, Default)]
pub(crate) struct HoldSettings {
    pub(crate) ttl: Option<Duration>,
    pub(crate) watchdog_lease: Option<Duration>,
    pub(crate) on_lost: Option<LostCallback>,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) wake_up: Option<WakeUp>,
    pub(crate) fencing: bool,
    pub(crate) at_least: Option<Duration>,
}

/// The options of a Token or reentrant lock that the builder checked.
#[derive(Clone)]
pub(crate) struct HoldOptions {
    /// The lock key, shared with the watchdog's records of its holds.
    pub(crate) key: Arc<str>,
    /// The lifetime written with each acquire: the explicit ttl, or the watchdog lease.
    pub(crate) lease: Duration,
    /// Renewed by the client's watchdog (built without an explicit ttl).
    pub(crate) watched: bool,
    pub(crate) on_lost: Option<LostCallback>,
    pub(crate) retry: RetryPolicy,
    pub(crate) wake_up: WakeUp,
    /// The lock's release channel (also published on with [`WakeUp::Polling`], for other
    /// clients' waiters).
    pub(crate) channel: String,
    /// The fencing counter, when fencing tokens were asked for.
    pub(crate) fence_key: Option<String>,
    /// A release keeps the hold until this long after the acquire (Token, Spring).
    pub(crate) at_least: Option<Duration>,
}

impl std::fmt::Debug for HoldOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.debug_fields(&mut f.debug_struct("HoldOptions"))
            .finish()
    }
}

impl HoldOptions {
    /// Writes what a user set (lifetime or watchdog lease, retry policy, wake-up, fencing) into
    /// the `Debug` of a lock, as fields of its own: the lock's `Debug` names no crate-private
    /// type.
    pub(crate) fn debug_fields<'a, 'b, 'c>(
        &self,
        d: &'a mut std::fmt::DebugStruct<'b, 'c>,
    ) -> &'a mut std::fmt::DebugStruct<'b, 'c> {
        d.field("ttl", &self.lease)
            .field("watched", &self.watched)
            .field("on_lost", &self.on_lost.is_some())
            .field("retry", &self.retry)
            .field("wake_up", &self.wake_up)
            .field("fencing", &self.fence_key.is_some())
    }

    /// Checks a builder's lease options: an explicit `ttl` turns the watchdog off (and then
    /// `watchdog_lease` and `on_lost` make no sense); without one the hold is watched with
    /// `watchdog_lease` (default [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE)).
    pub(crate) fn checked(key: &str, s: HoldSettings) -> Result<Self> {
        if let Some(d) = s.at_least {
            check_duration(key, "lock_at_least", d, false)?;
        }
        let watched = s.ttl.is_none();
        if !watched && (s.watchdog_lease.is_some() || s.on_lost.is_some()) {
            return Err(LockError::config(
                key,
                "watchdog_lease and on_lost apply to watched locks, built without ttl",
            ));
        }
        let lease = s.ttl.or(s.watchdog_lease).unwrap_or(WATCHDOG_DEFAULT_LEASE);
        let (lease, retry) =
            check_lock_options(key, lease, s.retry.unwrap_or_else(RetryPolicy::standard))?;
        if watched && lease < Duration::from_millis(3) {
            return Err(LockError::config(
                key,
                "a watchdog lease must be at least 3 ms (it is renewed every third)",
            ));
        }
        Ok(HoldOptions {
            key: Arc::from(key),
            lease,
            watched,
            on_lost: s.on_lost,
            retry,
            wake_up: s.wake_up.unwrap_or_default(),
            // The channel and fencing key names of `key` (both in its hash slot).
            channel: keys::channel(key),
            fence_key: s.fencing.then(|| keys::fence_key(key)).transpose()?,
            at_least: s
                .at_least
                .map(|d| Duration::from_millis(d.as_millis() as u64)),
        })
    }

    /// The lease's lifetime in milliseconds, as sent.
    pub(crate) fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    /// The line `name` (the key, or a mode's line) of `client` in which a blocking acquire of
    /// this lock waits, `fifo` and `barge` as [`Line`] says, woken by pub/sub if enabled: on the
    /// lock's channel, and on `also` if given.
    pub(crate) fn line<'a>(
        &'a self,
        client: &'a LockClient,
        name: &'a str,
        fifo: bool,
        barge: bool,
        also: Option<&'a str>,
    ) -> Line<'a> {
        let wake = (self.wake_up == WakeUp::PubSub).then(|| Wake {
            wakeups: client.wakeups(),
            channel: Some(&self.channel),
            also,
        });
        Line {
            queues: client.waiters(),
            name,
            fifo,
            barge,
            wake,
        }
    }

    /// A fresh hold: with its fencing token, and handed to the watchdog if the lock is watched.
    /// `seen`: when the acquire's reply was read, if the caller read the clock then (the
    /// watchdog's first renewal is counted from it, without reading the clock again).
    pub(crate) fn lease(
        &self,
        client: &LockClient,
        kind: RenewKind,
        value: &[u8],
        start: Instant,
        fence: Option<u64>,
        seen: Option<Instant>,
    ) -> Lease {
        let lease = Lease::new(value, start, self.lease).with_fence(fence);
        if !self.watched {
            return lease;
        }
        let state = WatchState::new(
            Arc::clone(&self.key),
            kind,
            value,
            self.lease,
            start,
            self.on_lost.clone(),
        );
        let due = crate::time::saturating_add(seen.unwrap_or_else(Instant::now), self.lease / 3);
        client.watchdog().watch(client, &state, due);
        lease.with_watch(Arc::clone(&state))
    }
}

/// What a release publishes in the same step as its delete: `message` on each of `channels`,
/// in order (Token: `0` on Redisson's channel; Spring: the key on the registry's two channels).
/// The first channel is the one this lock's own waiters wait on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Notice<'a> {
    pub(crate) message: &'a [u8],
    pub(crate) channels: &'a [String],
}

/// After a release that was published to `receivers` subscriber connections: if any belongs
/// to another client, this client's next blocking acquire of `line` first waits the client's
/// handoff courtesy ([`ClientBuilder::handoff_courtesy`](crate::ClientBuilder::handoff_courtesy),
/// via [`WaitQueues::yield_to`](crate::client::waiters::WaitQueues::yield_to)), so that a waiter woken
/// elsewhere gets in.
pub(crate) fn after_publish(client: &LockClient, line: &str, channel: &str, receivers: i64) {
    let courtesy = client.handoff_courtesy();
    if receivers <= 0 || courtesy.is_zero() {
        return;
    }
    if receivers > i64::from(client.wakeups().hears(channel)) {
        client
            .waiters()
            .yield_to(line, crate::time::after(courtesy));
    }
}

/// Why the janitor retries a release that failed with `reply`: a connection error or a
/// transient refusal (a failover, a restart) would leave the lock for the rest of its lease.
/// None when the release was answered, or failed for good.
pub(crate) fn failed_release<T>(reply: &Result<T>) -> Option<crate::client::cleanup::Why> {
    let e = reply.as_ref().err()?;
    e.worth_retrying()
        .then(|| crate::client::cleanup::Why::release(e))
}

/// The `extend` of a lock whose hold is its key alone, or (`holding`) an owner's field of it:
/// checks `ttl` and drops its sub-millisecond part; `send(value, ttl_ms)` is the strategy's
/// owner-checked extend of the lease's value, as sent: whether it extended, and the value it
/// wrote instead, if any. The lease is renewed from when it was sent, else [`LockError::Lost`],
/// counted as a loss.
pub(crate) fn extend(
    client: &LockClient,
    kind: Kind,
    key: &str,
    lease: &mut Lease,
    ttl: Duration,
    holding: bool,
    send: impl FnOnce(&[u8], u64) -> Result<(bool, Option<Vec<u8>>)>,
) -> Result<()> {
    check_duration(key, "ttl", ttl, false)?;
    let (ttl_ms, start) = (ttl.as_millis() as u64, Instant::now());
    let ttl = Duration::from_millis(ttl_ms);
    let (done, new_value) = send(lease.value(), ttl_ms)?;
    if done {
        lease.renew(new_value.as_deref(), start, ttl);
        log::debug!("lock {key:?}: extended by {ttl:?}");
        // A value of the client's live set (an owner's hold, `holding`) stays live for the new
        // lifetime.
        let live = match holding {
            true => live::holding(key, lease.value()),
            false => live::value(lease.value()),
        };
        client.live().renew(live, ttl);
        return Ok(());
    }
    // Returned as `LockError::Lost`: not also a warning.
    log::debug!("lock {key:?}: lost, extend found another owner or none");
    client.counters().lost_on_extend(kind, lease);
    Err(LockError::lost(key))
}

/// The `state` of a lock whose hold is its key alone, of Redis type `kind` (`string`, or
/// `hash` for Redisson's layout): see [`admin::KeyState::plain`].
pub(crate) fn state(client: &LockClient, key: &str, kind: &str) -> Result<LockState> {
    admin::read(client, key, "")?.plain(key, kind)
}

/// The `force_unlock` of a lock whose hold is its key alone: deletes the key and wakes this
/// client's waiters for it; publishes a release's `notice` if given (on its first channel in the
/// same script, on the others after it), else nothing.
pub(crate) fn force_unlock(
    client: &LockClient,
    key: &str,
    notice: Option<Notice<'_>>,
) -> Result<bool> {
    let (message, channels) = notice.map_or((&b""[..], &[][..]), |n| (n.message, n.channels));
    let message = std::str::from_utf8(message).unwrap_or(keys::UNLOCK_MESSAGE);
    let first = channels.first().map(String::as_str);
    let deleted = admin::force_delete(client, key, first, message, None, &[key])?;
    for channel in channels.iter().skip(1).filter(|_| deleted) {
        client.with_conn(key, |con, _| {
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg(message)
                .query::<i64>(con)
        })?;
    }
    Ok(deleted)
}

/// The `DistributedLock` and `LockAdmin` of a lock that is another one underneath (a `Lock`, a
/// `SpringLock`): each method is the one of its `underneath()`.
macro_rules! forward_lock {
    ($ty:ty) => {
        $crate::primitives::hold::forward_lock!(DistributedLock for $ty {
            key() -> &str;
            ttl() -> ::std::time::Duration;
            retry_policy() -> &$crate::retry::RetryPolicy;
            try_acquire() -> $crate::error::Result<$crate::lease::Lease>;
            release(lease: &$crate::lease::Lease) -> $crate::error::Result<bool>;
            extend(lease: &mut $crate::lease::Lease, ttl: ::std::time::Duration)
                -> $crate::error::Result<()>;
            is_held(lease: &$crate::lease::Lease) -> $crate::error::Result<bool>;
            try_lock() -> $crate::error::Result<$crate::lock::LockGuard<'_>>;
            lock() -> $crate::error::Result<$crate::lock::LockGuard<'_>>;
            try_lock_for(wait: ::std::time::Duration)
                -> $crate::error::Result<$crate::lock::LockGuard<'_>>;
        });
        $crate::primitives::hold::forward_lock!(LockAdmin for $ty {
            state() -> $crate::error::Result<$crate::lock::LockState>;
            force_unlock() -> $crate::error::Result<bool>;
        });
    };
    // One trait's methods, each given as `name(args) -> type;`.
    ($trait:ident for $ty:ty { $($name:ident($($arg:ident: $arg_ty:ty),*) -> $ret:ty;)* }) => {
        impl $trait for $ty {
            $(fn $name(&self, $($arg: $arg_ty),*) -> $ret {
                self.underneath().$name($($arg),*)
            })*
        }
    };
}
pub(crate) use forward_lock;

/// `key`, `ttl` and `retry_policy` of a lock, written inside its `impl DistributedLock`: read
/// from the fields of `self` given (`key: key, ttl: ttl, retry: retry`), or of a lock whose `key`
/// and `opts` ([`HoldOptions`]) are fields of `self` (or of the field path given, e.g. `shared`).
macro_rules! hold_accessors {
    (key: $($key:ident).+, ttl: $($ttl:ident).+, retry: $($retry:ident).+) => {
        fn key(&self) -> &str {
            &self.$($key).+
        }

        fn ttl(&self) -> ::std::time::Duration {
            self.$($ttl).+
        }

        fn retry_policy(&self) -> &$crate::retry::RetryPolicy {
            &self.$($retry).+
        }
    };
    ($($field:ident),*) => {
        $crate::primitives::hold::hold_accessors!(
            key: $($field.)* key, ttl: $($field.)* opts.lease, retry: $($field.)* opts.retry
        );
    };
}
pub(crate) use hold_accessors;

/// Builder methods that each set one field and return the builder, given as
/// `name(arg: Type) => field = value;` (or `name() => field = value;`) after their docs.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty)?) => $($field:ident).+ = $value:expr;)*) => {
        $($(#[$doc])*
        pub fn $name(mut self, $($arg: $ty)?) -> Self {
            self.$($field).+ = $value;
            self
        })*
    };
}
pub(crate) use setters;

/// Decodes the reply of an acquire script: `{1, fence}` (taken; fence 0 = no fencing) or
/// `{0, pttl}` (held; pttl as Redis's `PTTL`: -1 no expiry, -2 gone).
pub(crate) fn decode_acquire(key: &str, reply: &Value) -> Result<AcquireReply> {
    match redis::from_redis_value_ref::<(i64, i64)>(reply) {
        Ok((1, fence)) => Ok(AcquireReply::Taken {
            fence: u64::try_from(fence).ok().filter(|&f| f > 0),
        }),
        Ok((0, pttl)) => Ok(AcquireReply::Held {
            pttl: pttl_of(pttl),
        }),
        _ => Err(LockError::unexpected_reply(key, "an acquire script", reply)),
    }
}

/// The lease of a won attempt; [`LockError::Held`] when another owner holds the lock.
pub(crate) fn taken(key: &str, attempt: Result<Attempt>) -> Result<Lease> {
    match attempt? {
        Attempt::Acquired(lease) => Ok(lease),
        Attempt::Held { .. } => Err(LockError::Held {
            key: key.to_owned(),
        }),
    }
}

/// A holder's `PTTL` reply as time left: none when the key has no TTL (-1), zero when it is
/// gone (-2).
pub(crate) fn pttl_of(pttl: i64) -> Option<Duration> {
    match pttl {
        -2 => Some(Duration::ZERO),
        p if p >= 0 => Some(Duration::from_millis(p as u64)),
        _ => None,
    }
}

/// An acquire script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Taken { fence: Option<u64> },
    Held { pttl: Option<Duration> },
}
