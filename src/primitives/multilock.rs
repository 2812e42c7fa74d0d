//! [`MultiLock`]: an all-or-nothing lock over many keys, each holding the same Token value
//! (`SET NX PX`'s 32 hex digits), so that a Token lock on any one of the keys interlocks with
//! it.
//!
//! Wire, per operation:
//! - acquire: one `EVALSHA <multilock_acquire.lua> n key… <token> <ttl ms>` per group of keys
//!   → `{1}` (every key of the group taken) or `{0, i, pttl, holder}` (key `i` held; nothing
//!   written);
//! - release, and the undo of a partial hold: one `EVALSHA <multilock_release.lua> n key…
//!   <token> 0 <channel of each key>…` per group → `{deleted, reached}`: owner-checked per key,
//!   published on each deleted key's Token channel.
//!
//! A group is every key on a single server (or Sentinel), and the keys of one hash slot on a
//! Cluster: the uncontended acquire and release of keys in one slot cost one round trip each.
//! Groups are taken in the canonical order (hash slot, then key); a group refused gives back
//! the groups taken before it (owner-checked) and the acquire waits with nothing held, then
//! tries again from the first group: so no hold ever waits while holding, and two multi-locks
//! over overlapping keys cannot deadlock.
//!
//! A blocking acquire waits in the runtime's loop, as the locks do: its refusals name the
//! Token channel of the key that refused them, to which the waiter subscribes (the client's one
//! subscriber connection), so a Token release or a multi-lock release of that key wakes it; it
//! also polls beside it, as Token waiters do.
//!
//! Without an explicit ttl each key's hold is given to the client's watchdog as a string-value
//! hold ([`RenewKind::Value`]): the watchdog renews the holds due together in one call per hash
//! slot. One key found lost marks the whole hold lost.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::Value;

use crate::client::access;
use crate::client::acquire::{wait_in_line, Line, Wake};
use crate::client::cleanup::{Cleanup, Done, Why};
use crate::client::grants::Grant;
use crate::client::janitor;
use crate::client::live;
use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::keys;
use crate::lease::{Attempt, LostCallback, LostLock, RenewKind, WatchState};
use crate::primitives::hold::{self, HoldOptions, HoldSettings};
use crate::primitives::string_value;
use crate::retry::{Attempts, RetryPolicy};
use crate::stats::Kind;

/// The stats label of multi-lock holds.
pub(crate) const KIND: Kind = Kind::new("multi");

/// The most keys one multi-lock takes: bounds every script's loop and every command's size.
pub(crate) const MAX_KEYS: usize = 1000;

impl LockClient {
    /// A builder of a [`MultiLock`] over `keys`: all of them are held together, or none.
    ///
    /// Every key holds a Token value, the same at each, so a Token lock
    /// ([`Strategy::Token`](crate::Strategy::Token), the default) on any of the keys excludes
    /// the multi-lock and is excluded by it. See `docs/multilock.md`.
    pub fn multi_lock<K: AsRef<str>>(&self, keys: &[K]) -> MultiLockBuilder {
        MultiLockBuilder {
            client: self.clone(),
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
            settings: HoldSettings::default(),
            check_access: false,
        }
    }
}

/// Options of a [`MultiLock`], from [`LockClient::multi_lock`].
#[must_use]
#[derive(Clone)]
pub struct MultiLockBuilder {
    client: LockClient,
    keys: Vec<String>,
    settings: HoldSettings,
    check_access: bool,
}

impl std::fmt::Debug for MultiLockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockBuilder")
            .field("keys", &self.keys)
            .field("ttl", &self.settings.ttl)
            .field("watchdog_lease", &self.settings.watchdog_lease)
            .field("retry", &self.settings.retry)
            .field("check_access", &self.check_access)
            .finish_non_exhaustive()
    }
}

impl MultiLockBuilder {
    /// An explicit lifetime for every hold: written at each key, never renewed. Without it the
    /// hold is watched (renewed by the client's watchdog while the guard lives).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = Some(ttl);
        self
    }

    /// The lease of a watched hold (default 30 s, as for locks), renewed every third of it.
    /// Refused with [`ttl`](Self::ttl).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.settings.watchdog_lease = Some(lease);
        self
    }

    /// How a blocking acquire waits: ONE budget for the whole set of keys (default
    /// [`RetryPolicy::standard`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.settings.retry = Some(policy);
        self
    }

    /// Told once when a watched hold is found lost (any one of its keys); it runs on the
    /// watchdog's thread: keep it short. Refused with [`ttl`](Self::ttl).
    pub fn on_lost(mut self, f: impl Fn(&LostLock) + Send + Sync + 'static) -> Self {
        self.settings.on_lost = Some(Arc::new(f));
        self
    }

    /// [`build`](Self::build) also asks the server (one round trip, nothing run) whether the
    /// client's ACL user may send every command the multi-lock sends, as
    /// [`LockBuilder::check_access`](crate::LockBuilder::check_access) does for a lock: per
    /// group of keys (every key on one server, one hash slot's on a Cluster) `EVALSHA` (and
    /// `EVAL`, sent after a `NOSCRIPT`) on the group's keys; per key (every key is checked,
    /// not a representative one) the commands the scripts and the watchdog's renewal run on
    /// it, the release's `PUBLISH` on its Token channel `redisson_lock__channel:{key}`, and
    /// the `SUBSCRIBE` of a waiter it refused. A denied one is a [`LockError::Config`] naming
    /// it with its key or channel, and NOPERM.
    pub fn check_access(mut self) -> Self {
        self.check_access = true;
        self
    }

    /// Checks the options and builds the lock. Sends nothing to Redis, unless
    /// [`check_access`](Self::check_access) was asked for. [`LockError::Config`] for an empty
    /// key list, an empty key, a key given twice (refused, not merged: it is most likely a
    /// mistake), more than 1,000 keys, lease options a lock would refuse, a client whose user
    /// may not run scripts, and, with [`check_access`](Self::check_access), a command the user
    /// may not send.
    pub fn build(self) -> Result<MultiLock> {
        let mut keys = self.keys;
        if keys.is_empty() {
            return Err(LockError::config("", "a multi-lock needs at least one key"));
        }
        if keys.len() > MAX_KEYS {
            let reason = format!("a multi-lock takes at most {MAX_KEYS} keys");
            return Err(LockError::config(&keys[0], reason));
        }
        if keys.iter().any(String::is_empty) {
            return Err(LockError::config("", "a multi-lock key is empty"));
        }
        // The canonical order: hash slot, then key (the same on every deployment).
        keys.sort_by(|a, b| (slot(a), a).cmp(&(slot(b), b)));
        if let Some(twice) = keys.windows(2).find(|w| w[0] == w[1]) {
            return Err(LockError::config(
                &twice[0],
                "a multi-lock key is given twice",
            ));
        }
        crate::client::native::needs_scripts(self.client.native(), &keys[0], "a multi-lock")?;
        let opts = HoldOptions::checked(&keys[0], self.settings)?;
        let groups = if self.client.is_cluster() {
            let mut groups: Vec<Range<usize>> = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                match groups.last_mut() {
                    Some(g) if slot(&keys[g.start]) == slot(key) => g.end = i + 1,
                    _ => groups.push(i..i + 1),
                }
            }
            groups
        } else {
            std::iter::once(0..keys.len()).collect()
        };
        let lock = MultiLock {
            channels: keys.iter().map(|k| keys::channel(k)).collect(),
            client: self.client,
            keys,
            groups,
            opts,
        };
        if self.check_access {
            let checks = lock.access_checks();
            access::verify(&lock.client, &lock.keys[0], "multi-lock", &checks)?;
        }
        Ok(lock)
    }
}

fn slot(key: &str) -> u16 {
    keys::hash_slot(key.as_bytes())
}

/// An all-or-nothing lock over many keys (see `docs/multilock.md`). Build it with
/// [`LockClient::multi_lock`].
pub struct MultiLock {
    client: LockClient,
    /// In the canonical order: hash slot, then key.
    keys: Vec<String>,
    /// The Token release channel of each key.
    channels: Vec<String>,
    /// The ranges of `keys` taken by one script each.
    groups: Vec<Range<usize>>,
    opts: HoldOptions,
}

impl std::fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("MultiLock");
        d.field("keys", &self.keys)
            .field("groups", &self.groups.len());
        self.opts.debug_fields(&mut d).finish_non_exhaustive()
    }
}

/// What one acquire carries from attempt to attempt.
struct Acquiring {
    /// The value written at every key, by every attempt.
    token: Vec<u8>,
    /// Per group: a write of ours may be there that no answered script took or undid (an
    /// acquire whose reply was lost, an undo that failed), until when, and why. The next
    /// attempt takes or undoes it; an acquire that gives up leaves it to the janitor.
    unsure: Vec<Cell<Option<(Instant, Why)>>>,
}

/// One group's acquire answer.
enum GroupReply {
    Taken,
    /// The group's `i`th key is held, with this much left.
    Held(usize, Option<Duration>),
}

/// One attempt's outcome.
enum Step<'a> {
    Won(MultiGuard<'a>),
    /// Refused by `keys[key]`.
    Refused {
        key: usize,
        pttl: Option<Duration>,
    },
}

impl MultiLock {
    /// The keys, in the canonical order: by Cluster hash slot, then by key.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Takes every key, waiting by the lock's retry policy (one budget for the set).
    /// [`LockError::Timeout`] when the budget ends with some key still held elsewhere.
    pub fn lock(&self) -> Result<MultiGuard<'_>> {
        self.acquire_blocking(Attempts::new(&self.opts.retry))
    }

    /// One attempt, no wait: [`LockError::Held`] (a contention error) if any key is held.
    pub fn try_lock(&self) -> Result<MultiGuard<'_>> {
        let acq = self.acquiring();
        let result = match self.attempt(&acq) {
            Ok(Step::Won(guard)) => Ok(guard),
            Ok(Step::Refused { key, .. }) => Err(LockError::Held {
                key: self.keys[key].clone(),
            }),
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.forget_unsure(&acq);
        }
        result
    }

    /// As [`lock`](Self::lock), waiting at most `wait` in all.
    pub fn try_lock_for(&self, wait: Duration) -> Result<MultiGuard<'_>> {
        self.acquire_blocking(Attempts::for_duration(&self.opts.retry, wait))
    }

    /// For [`MultiLockBuilder::check_access`]: each group's two scripts (one check: the same
    /// command on the same keys), then per key what they run (`GET`, `PTTL`, `SET … PX`,
    /// `DEL`, the `PUBLISH`), the renewal's `PEXPIRE`, and the subscription on its channel.
    fn access_checks(&self) -> Vec<access::Check> {
        let mut c = Vec::new();
        for range in &self.groups {
            let keys = &self.keys[range.clone()];
            let n = keys.len().to_string();
            for (cmd, body) in [
                ("evalsha", "0000000000000000000000000000000000000000"),
                ("eval", "return 0"),
            ] {
                let mut args = vec![body, n.as_str()];
                args.extend(keys.iter().map(String::as_str));
                args.extend(["v", "1000"]);
                c.push(access::check(cmd, &args));
            }
        }
        for (i, (key, channel)) in self.keys.iter().zip(&self.channels).enumerate() {
            c.extend([
                access::check("get", &[key]),
                access::check("pttl", &[key]),
                access::check("set", &[key, "v", "PX", "1000"]),
                access::check("del", &[key]),
                access::check("pexpire", &[key, "1000"]),
                access::check("publish", &[channel, keys::UNLOCK_MESSAGE]),
            ]);
            // The subscriber's `PING` once, not once per key.
            let sub = access::subscriber(channel).into_iter();
            c.extend(sub.filter(|(cmd, _)| i == 0 || *cmd != "ping"));
        }
        c
    }

    fn acquiring(&self) -> Acquiring {
        let mut token = crate::ids::new_token();
        // As Token's values: the client's id first, so that its stale holds are recognised.
        let prefix = self.client.token_prefix();
        token[..prefix.len()].copy_from_slice(&prefix);
        Acquiring {
            token: token.to_vec(),
            unsure: self.groups.iter().map(|_| Cell::new(None)).collect(),
        }
    }

    fn group_keys(&self, g: usize) -> Vec<&str> {
        let range = self.groups[g].clone();
        self.keys[range].iter().map(String::as_str).collect()
    }

    /// The blocking acquire: attempts until every key is taken or the budget ends, in the
    /// runtime's loop ([`wait_in_line`]). Between attempts nothing is held; each refusal names
    /// the channel of the key that refused it, so the thread waits on that key's releases
    /// only (not on those its own give-backs publish on the other keys' channels), on none
    /// after a failed attempt.
    fn acquire_blocking(&self, attempts: Attempts<'_>) -> Result<MultiGuard<'_>> {
        let acq = self.acquiring();
        // A line of its own (no key is named so: a NUL starts it), woken by the subscriptions.
        let name = format!("\0multi:{}", String::from_utf8_lossy(&acq.token));
        let line = Line {
            queues: self.client.waiters(),
            name: &name,
            fifo: false,
            // Alone in its line: no courtesy to wait for, no one to wait behind.
            barge: true,
            wake: Some(Wake {
                wakeups: self.client.wakeups(),
                channel: None,
                also: None,
            }),
        };
        // The key that refused the latest attempt, named by a timeout.
        let last = Cell::new(0);
        let attempt = || match self.attempt(&acq)? {
            Step::Won(guard) => Ok(Attempt::Acquired(guard)),
            Step::Refused { key, pttl } => {
                last.set(key);
                let wake = Some(self.channels[key].clone());
                Ok(Attempt::Held { pttl, wake })
            }
        };
        let floor = self.opts.retry.max_delay;
        let result = match wait_in_line(&self.keys[0], floor, line, attempts, attempt, |_| Ok(())) {
            Err(LockError::Timeout {
                attempts, waited, ..
            }) => Err(LockError::Timeout {
                key: self.keys[last.get()].clone(),
                attempts,
                waited,
            }),
            other => other,
        };
        if result.is_err() {
            self.forget_unsure(&acq);
        }
        self.client.counters().blocking(KIND, &result);
        result
    }

    /// One attempt: the groups in order, each by one script; a refusal or a failure gives back
    /// what this attempt took (and any unsure group), owner-checked.
    fn attempt<'a>(&'a self, acq: &Acquiring) -> Result<Step<'a>> {
        let mut live = self.client.live().write(&acq.token, Instant::now());
        let mut starts = Vec::with_capacity(self.groups.len());
        for g in 0..self.groups.len() {
            let start = Instant::now();
            let refused = match self.send_acquire(acq, g, start) {
                Ok(GroupReply::Taken) => {
                    acq.unsure[g].set(None);
                    starts.push(start);
                    continue;
                }
                Ok(GroupReply::Held(i, pttl)) => {
                    // A refusal is counted; an error is not (as for the other locks).
                    self.client.counters().attempt(KIND, false);
                    Ok(Step::Refused {
                        key: self.groups[g].start + i,
                        pttl,
                    })
                }
                Err(e) => Err(e),
            };
            self.undo(acq, &starts);
            return refused;
        }
        let now = Instant::now();
        let (first, lease) = (starts[0], self.opts.lease);
        let elapsed = now.saturating_duration_since(first);
        if lease.saturating_sub(elapsed) <= crate::lease::arrival_margin(lease, elapsed) {
            log::warn!(
                "multi-lock {:?}: taken, but {} ms after the first group was sent, of a {} ms \
                 lifetime; not handed out, released again",
                self.keys[0],
                elapsed.as_millis(),
                lease.as_millis()
            );
            self.undo(acq, &starts);
            return Err(LockError::LateReply {
                key: self.keys[0].clone(),
                elapsed,
                ttl: lease,
            });
        }
        // Counted once handed out: a late win given back is not (see `Stats::acquires`).
        self.client.counters().attempt(KIND, true);
        live.keep_at(lease, now);
        Ok(Step::Won(self.guard(acq.token.clone(), &starts, now)))
    }

    /// Sends group `g`'s acquire. One whose reply is lost (or not confirmed by the replicas)
    /// marks the group unsure.
    fn send_acquire(&self, acq: &Acquiring, g: usize, start: Instant) -> Result<GroupReply> {
        let keys = self.group_keys(g);
        let until = crate::time::saturating_add(start, self.opts.lease);
        let args = (&acq.token[..], self.opts.lease_ms());
        let reply: Value = string_value::acquire_undone_by(
            &self.client,
            keys[0],
            until,
            |con, s| s.multilock_acquire.eval_keys(con, &keys, args),
            |why| {
                acq.unsure[g].set(Some((until, why)));
                None
            },
        )?;
        let Value::Array(items) = &reply else {
            return Err(LockError::unexpected_reply(
                keys[0],
                "multilock_acquire",
                &reply,
            ));
        };
        match items.as_slice() {
            [Value::Int(1)] => Ok(GroupReply::Taken),
            [Value::Int(0), Value::Int(i), Value::Int(pttl), ..] => {
                let i = usize::try_from(i.saturating_sub(1)).unwrap_or(0);
                let i = i.min(keys.len().saturating_sub(1));
                Ok(GroupReply::Held(i, hold::pttl_of(*pttl)))
            }
            _ => Err(LockError::unexpected_reply(
                keys[0],
                "multilock_acquire",
                &reply,
            )),
        }
    }

    /// Gives back the groups this attempt took (started at `taken`) and every unsure group,
    /// owner-checked. One whose undo fails stays unsure.
    fn undo(&self, acq: &Acquiring, taken: &[Instant]) {
        for (g, cell) in acq.unsure.iter().enumerate() {
            let until = match (taken.get(g), cell.get()) {
                (Some(&start), _) => crate::time::saturating_add(start, self.opts.lease),
                (None, Some((until, _))) => until,
                (None, None) => continue,
            };
            match self.release_group(&acq.token, g) {
                Ok(_) => cell.set(None),
                Err(e) => {
                    log::debug!(
                        "multi-lock {:?}: could not give back a partial hold: {}",
                        self.keys[self.groups[g].start],
                        e.report()
                    );
                    cell.set(Some((until, Why::release(&e))));
                }
            }
        }
    }

    /// An acquire that gives up hands every unsure group to the janitor (owner-checked
    /// deletes, in-line first).
    fn forget_unsure(&self, acq: &Acquiring) {
        for (g, cell) in acq.unsure.iter().enumerate() {
            if let Some((until, why)) = cell.take() {
                let cleanup = self.cleanup(&acq.token, g);
                self.client
                    .janitor()
                    .forget(&self.client, cleanup, why, until);
            }
        }
    }

    /// The arguments of `lua/multilock_release.lua` for group `g`.
    fn release_args(&self, token: &[u8], g: usize) -> Vec<Vec<u8>> {
        let mut args = Vec::with_capacity(2 + self.groups[g].len());
        args.push(token.to_vec());
        args.push(keys::UNLOCK_MESSAGE.as_bytes().to_vec());
        let range = self.groups[g].clone();
        args.extend(self.channels[range].iter().map(|c| c.as_bytes().to_vec()));
        args
    }

    /// The owner-checked, published delete of group `g`: keys deleted, subscribers reached.
    fn release_group(&self, token: &[u8], g: usize) -> Result<(i64, i64)> {
        let keys = self.group_keys(g);
        let args = self.release_args(token, g);
        self.client.with_conn(keys[0], |con, s| {
            s.multilock_release.eval_keys(con, &keys, &args)
        })
    }

    /// Group `g`'s release as a clean-up for the janitor.
    fn cleanup(&self, token: &[u8], g: usize) -> Cleanup {
        Cleanup {
            script: |s| &s.multilock_release,
            keys: self.group_keys(g).into_iter().map(str::to_owned).collect(),
            args: self.release_args(token, g),
            value_arg: 0,
            read: read_release,
            counted: false,
            what: "the owner-checked delete of a multi-lock's keys",
        }
    }

    /// The guard of a hold taken, group `g` sent at `starts[g]`, the last reply read at `now`;
    /// watched holds are handed to the watchdog, every key due together.
    fn guard(&self, token: Vec<u8>, starts: &[Instant], now: Instant) -> MultiGuard<'_> {
        let loss = Arc::new(Loss::default());
        let mut watches = Vec::new();
        if self.opts.watched {
            let report: LostCallback = {
                let loss = Arc::clone(&loss);
                let user = self.opts.on_lost.clone();
                Arc::new(move |l: &LostLock| loss.report(l, user.as_ref()))
            };
            for (g, range) in self.groups.iter().enumerate() {
                for key in &self.keys[range.clone()] {
                    watches.push(WatchState::new(
                        key.as_str(),
                        RenewKind::Value(KIND),
                        &token,
                        self.opts.lease,
                        starts[g],
                        Some(Arc::clone(&report)),
                    ));
                }
            }
            // Known to the loss before the watchdog has any of them: the first loss it
            // reports stops the others, however soon.
            let _ = loss
                .states
                .set(watches.iter().map(Arc::downgrade).collect());
            let due = crate::time::saturating_add(now, self.opts.lease / 3);
            for state in &watches {
                self.client.watchdog().watch(&self.client, state, due);
            }
        }
        MultiGuard {
            lock: self,
            token,
            acquired_at: starts[0],
            watches,
            loss,
            released: false,
        }
    }
}

/// Reads `lua/multilock_release.lua`'s reply for the janitor: freed if it deleted a key.
fn read_release(v: &Value) -> (Done, Option<(Vec<u8>, Grant)>) {
    match redis::from_redis_value_ref::<(i64, i64)>(v) {
        Ok((deleted, _)) if deleted >= 1 => (Done::Freed, None),
        _ => (Done::Nothing, None),
    }
}

/// A watched hold's loss, shared by its keys' watch states (each reports through it).
#[derive(Default)]
struct Loss {
    lost: AtomicBool,
    /// The keys' watch states: the first loss stops renewing the others.
    states: OnceLock<Vec<Weak<WatchState>>>,
}

impl Loss {
    /// One key was found lost: the first time, the hold is lost, `user` is told, and the
    /// other keys are renewed no more (they expire unless released first).
    fn report(&self, lost: &LostLock, user: Option<&LostCallback>) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(f) = user {
            f(lost);
        }
        for state in self.states.get().into_iter().flatten() {
            if let Some(state) = state.upgrade() {
                state.stop();
            }
        }
    }
}

/// A hold of every key of a [`MultiLock`]: released (owner-checked) when dropped. `Send`: the
/// hold belongs to no thread (Token values).
#[must_use = "the keys are released when the guard is dropped"]
pub struct MultiGuard<'a> {
    lock: &'a MultiLock,
    token: Vec<u8>,
    /// When the first group's acquire was sent.
    acquired_at: Instant,
    /// One per key, in the lock's order, for a watched hold.
    watches: Vec<Arc<WatchState>>,
    loss: Arc<Loss>,
    released: bool,
}

impl std::fmt::Debug for MultiGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("keys", &self.lock.keys)
            .field("value", &crate::lease::printable(&self.token))
            .field("watched", &!self.watches.is_empty())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl MultiGuard<'_> {
    /// The Token value written at every key.
    pub fn value(&self) -> &[u8] {
        &self.token
    }

    /// Until when every key is held by the local clock (the earliest key's end, counted from
    /// when its acquire, or latest renewal, was sent).
    pub fn valid_until(&self) -> Instant {
        let explicit = || crate::time::saturating_add(self.acquired_at, self.lock.opts.lease);
        let watched = self.watches.iter().map(|w| w.valid_until()).min();
        watched.unwrap_or_else(explicit)
    }

    /// True once the hold must be taken as lost, without a round trip: a watched key was found
    /// gone (or not renewed in time), or the earliest key's loss deadline passed (its end less
    /// the clock-drift allowance, as for a [`Lease`](crate::Lease)).
    pub fn is_lost(&self) -> bool {
        if self.loss.lost.load(Ordering::Acquire) {
            return true;
        }
        let deadline = match self.watches.iter().map(|w| w.loss_deadline()).min() {
            Some(d) => d,
            None => {
                let end = self.valid_until();
                let margin = crate::lease::loss_margin(self.lock.opts.lease);
                end.checked_sub(margin).unwrap_or(end)
            }
        };
        Instant::now() >= deadline
    }

    /// Releases every key still holding this hold's value (owner-checked; published on each
    /// key's Token channel). True only if every key was still ours and the hold was neither
    /// lost nor past its lifetime.
    pub fn unlock(mut self) -> Result<bool> {
        self.release()
    }

    fn release(&mut self) -> Result<bool> {
        self.released = true;
        let lock = self.lock;
        let client = &lock.client;
        let until = self.valid_until();
        let overran = Instant::now() >= until;
        for w in &self.watches {
            w.stop();
        }
        let lost = self.loss.lost.load(Ordering::Acquire);
        let generation = client.switch_generation();
        let (mut all, mut error) = (true, None);
        for (g, range) in lock.groups.iter().enumerate() {
            let reply = lock.release_group(&self.token, g);
            let deleted = match &reply {
                Ok((deleted, _)) => *deleted,
                Err(_) => match hold::failed_release(&reply) {
                    // Retried by the janitor: in-line first, which deleted our keys if done.
                    Some(why) => {
                        let cleanup = lock.cleanup(&self.token, g);
                        if client.janitor().forget(client, cleanup, why, until) {
                            range.len() as i64
                        } else {
                            -1
                        }
                    }
                    None => -1,
                },
            };
            if deleted < 0 {
                if let Err(e) = reply {
                    error.get_or_insert(e);
                }
                continue;
            }
            all &= deleted == range.len() as i64;
            if deleted > 0 {
                if client.switches().is_some() {
                    let cleanup = lock.cleanup(&self.token, g);
                    janitor::remember(client, cleanup, None, generation, until);
                }
                for key in &lock.keys[range.clone()] {
                    client.waiters().notify_release(key);
                }
            }
        }
        client.live().release(live::value(&self.token), None);
        if let Some(e) = error {
            return Err(e);
        }
        if (!all || overran) && !lost {
            // A loss found here; one the watchdog found was counted by it.
            client.counters().lost_watched(KIND);
        }
        if !all || overran || lost {
            log::debug!(
                "multi-lock {:?}: lost before release (a key expired or was taken over); no \
                 other owner's key was deleted",
                lock.keys[0]
            );
        }
        Ok(all && !overran && !lost)
    }
}

impl Drop for MultiGuard<'_> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        match self.release() {
            Ok(true) => {}
            Ok(false) => log::warn!(
                "multi-lock {:?}: dropped after the hold was lost (a key expired or was taken)",
                self.lock.keys[0]
            ),
            Err(e) => log::warn!(
                "multi-lock {:?}: release on drop failed: {}",
                self.lock.keys[0],
                e.report()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}

    #[test]
    fn guards_are_send_and_locks_send_and_sync() {
        assert_send::<MultiGuard<'static>>();
        assert_send::<MultiLock>();
        assert_sync::<MultiLock>();
        assert_send::<MultiLockBuilder>();
    }

    /// The first key found lost tells the user once and stops the other keys' renewals.
    #[test]
    fn one_key_lost_loses_the_hold_once() {
        use crate::lease::LossReason;
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let user: LostCallback = {
            let told = Arc::clone(&told);
            Arc::new(move |_: &LostLock| {
                told.fetch_add(1, Ordering::SeqCst);
            })
        };
        let loss = Arc::new(Loss::default());
        let report: LostCallback = {
            let loss = Arc::clone(&loss);
            Arc::new(move |l: &LostLock| loss.report(l, Some(&user)))
        };
        let lease = Duration::from_secs(1);
        let states: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|k| {
                let kind = RenewKind::Value(KIND);
                let cb = Some(Arc::clone(&report));
                WatchState::new(k, kind, b"v", lease, Instant::now(), cb)
            })
            .collect();
        let _ = loss.states.set(states.iter().map(Arc::downgrade).collect());
        assert!(states[1].mark_lost(LossReason::Gone));
        assert!(loss.lost.load(Ordering::SeqCst));
        assert!(states[0].is_stopped() && states[2].is_stopped());
        // The others, stopped, report nothing more.
        assert!(!states[0].mark_lost(LossReason::Expired));
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_release_reply_reads_as_freed_only_when_a_key_was_deleted() {
        let reply = |d| Value::Array(vec![Value::Int(d), Value::Int(0)]);
        assert_eq!(read_release(&reply(2)).0, Done::Freed);
        assert_eq!(read_release(&reply(0)).0, Done::Nothing);
        assert_eq!(read_release(&Value::Nil).0, Done::Nothing);
    }
}
