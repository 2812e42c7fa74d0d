//! [`Strategy::Reentrant`](crate::Strategy::Reentrant): a reentrant lock in Redisson's `RLock`
//! layout, so that this crate and Java Redisson clients can share one lock.
//!
//! The lock is a hash at the key: the field is the owner id `<client UUID>:<thread number>`
//! ([`ReentrantLock::owner_id`]), the value the owner's hold count, and the key's `PEXPIRE` the
//! lease. A thread that holds the lock may take it again (the count goes up); it is free when
//! every hold is given back. See `docs/reentrant.md`.
//!
//! Wire, per operation (one round trip each):
//! - acquire: `EVALSHA <reentrant_acquire.lua> 1|2 key [dlock_fence:{key}] <lease ms> <owner>
//!   <the thread's own count>`
//!   → `{1, fence}` (taken or re-entered) or `{0, pttl}` (held by another owner);
//! - release: `EVALSHA <reentrant_release.lua> 1 key 0 <lease ms> <owner>
//!   redisson_lock__channel:{key} <request id>` → 1 + subscribers reached (last hold: deleted
//!   and published), 0 (count decremented) or nil (the owner holds nothing; nothing changed).
//!   A release that leaves holds records its request id in the hash (field
//!   `dlock_unlock_latch`), so a copy sent again after a dropped connection gives back one
//!   hold, not two (see `docs/reentrant.md`);
//! - extend: `EVALSHA <reentrant_extend.lua> 1 key <owner> <ttl ms>` → 1 or 0;
//! - check: `HEXISTS key <owner>`; hold count: `HGET key <owner>`.
//!
//! A lock built without an explicit ttl is watched: the client's watchdog renews each hold
//! (`HEXISTS` + `PEXPIRE`, see [`crate::client::watchdog`]) until that hold is released.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ToRedisArgs, Value};

use crate::client::access;
use crate::client::cleanup::{Cleanup, Done};
use crate::client::grants::Grant;
use crate::client::janitor;
use crate::client::live;
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::ids::OwnerId;
use crate::keys;
use crate::lease::RenewKind;
use crate::lease::{printable, Attempt, Lease};
use crate::lock::LockState;
use crate::lock::{self, DistributedLock, LockGuard};
use crate::primitives::hold::{self, AcquireReply, HoldOptions};
use crate::primitives::string_value::{self, Lazy};
use crate::retry::Attempts;
use crate::scripts::Scripts;
use crate::stats::Kind;

thread_local! {
    /// The calling thread's holds of reentrant locks as its own acquires and releases last
    /// saw them. Only used to let a thread that holds a lock skip this process's line of
    /// threads waiting for it (it would otherwise wait for itself). Kept per thread because
    /// the owner *is* the thread: no lock object or mutex needs to be shared, and every lock
    /// object on the key sees the same holds.
    ///
    /// A short list scanned linearly (a thread holds few locks at once) rather than maps of
    /// owned strings: entries share the lock's key (`Arc`) and the list keeps its capacity when
    /// emptied, so acquires and releases allocate nothing here in steady state.
    static LOCAL_HOLDS: RefCell<Vec<LocalHold>> = const { RefCell::new(Vec::new()) };
}

/// The stats label of reentrant locks.
pub(crate) const KIND: Kind = Kind::new("reentrant");

/// One entry of [`LOCAL_HOLDS`].
struct LocalHold {
    /// The thread's owner id for the client the hold is through (the thread part is the same
    /// for every entry: it stands for the client).
    owner: OwnerId,
    key: Arc<str>,
    count: u32,
}

/// What an operation of the calling thread learnt about its own holds of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// One more hold (taken or re-entered).
    Taken,
    /// One hold given back, others remain.
    Decremented,
    /// The thread holds nothing (refused, freed, or found lost).
    Nothing,
}

/// Records what an operation of the calling thread, as `owner`, learnt about its holds of `key`.
fn note_local(owner: &OwnerId, key: &Arc<str>, seen: Seen) {
    LOCAL_HOLDS.with(|holds| {
        let mut holds = holds.borrow_mut();
        let at = holds
            .iter()
            .position(|h| *h.key == **key && h.owner == *owner);
        match (seen, at) {
            (Seen::Taken, Some(i)) => holds[i].count = holds[i].count.saturating_add(1),
            (Seen::Taken, None) => holds.push(LocalHold {
                owner: owner.clone(),
                key: Arc::clone(key),
                count: 1,
            }),
            // Redis said holds remain: keep at least one even if our count was off (a hold
            // taken through another thread's lease, say).
            (Seen::Decremented, Some(i)) => {
                holds[i].count = holds[i].count.saturating_sub(1).max(1);
            }
            (Seen::Nothing, Some(i)) => {
                holds.swap_remove(i);
            }
            (Seen::Decremented | Seen::Nothing, None) => {}
        }
    });
}

/// The calling thread's hold count of `key` as `owner`, as its own acquires and releases last
/// saw it.
fn local_count(owner: &OwnerId, key: &str) -> Option<u32> {
    LOCAL_HOLDS.with(|holds| {
        holds
            .borrow()
            .iter()
            .find(|h| &*h.key == key && h.owner == *owner)
            .map(|h| h.count)
    })
}

/// A lock of [`Strategy::Reentrant`](crate::Strategy::Reentrant), wire-compatible with
/// Redisson's `RLock` (`RedissonClient.getLock(key)`). Build it with
/// [`LockBuilder`](crate::LockBuilder).
///
/// **Owners.** A hold belongs to the calling thread through this client: the owner id is
/// `<client UUID>:<thread number>` ([`owner_id`](Self::owner_id)), as Redisson's
/// `<UUID>:<thread id>`. Other threads, other clients and Java Redisson clients are other
/// owners and are refused while the lock is held.
///
/// **Re-entry.** The owner may take the lock again while it holds it; each acquire returns its
/// own guard (or [`Lease`]) and counts one hold; each release gives one back. The lock is free,
/// its key deleted and `0` published on `redisson_lock__channel:{key}` (waking waiters here
/// and in Redisson), when the owner's last hold is released. Holds of one owner are one count
/// in Redis, not individual entries: release each hold once. A thread that holds the lock never
/// waits behind this process's threads that wait for it.
///
/// **Release answers.** `release` returns `Ok(true)` when the lease's owner held the lock (one
/// hold given back, whether or not it was the last), `Ok(false)` when the owner holds nothing
/// (its hold expired, or it never held it): nothing is changed then, so a release by a
/// non-owner can never free or decrement another owner's hold (Redisson answers such a call
/// with `IllegalMonitorStateException`). A hold whose own lease had run out by the local clock
/// before its release is `Ok(false)` too (its section overran), although the release gives it
/// back as usual.
///
/// **Threads.** A hold is its thread's, so its guard stays on that thread: it is not `Send`,
/// and [`LockGuard::into_send`] hands it back (see [`LockGuard`]).
///
/// **Lifetime.** Every acquire, re-entry and partial release sets the key's expiry to the
/// lock's lease ([`ttl`](DistributedLock::ttl)); all holds of the key share it. A watched lock
/// (built without ttl) has each hold renewed by the client's watchdog until that hold is
/// released, so the key lives while any hold of the owner does.
pub struct ReentrantLock {
    client: LockClient,
    key: String,
    opts: HoldOptions,
    // The commands of every acquire and release, packed by redis-rs once but for the owner and
    // the argument that changes (see `string_value::Packed`), at their second use:
    // the same bytes as built afresh, without the building. Owners of other lengths, counts of
    // more than one digit and fenced acquires are sent the usual way.
    /// `EVALSHA <reentrant_acquire.lua> 1 key <lease ms> <owner> <count>`, packed.
    wire_acquire: Lazy<string_value::Packed>,
    /// `EVALSHA <reentrant_release.lua> 1 key 0 <lease ms> <owner> <channel> <request id>`,
    /// packed.
    wire_release: Lazy<string_value::Packed>,
}

impl std::fmt::Debug for ReentrantLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ReentrantLock");
        d.field("key", &self.key)
            .field("instance", &self.client.instance_id());
        self.opts.debug_fields(&mut d).finish_non_exhaustive()
    }
}

impl ReentrantLock {
    pub(crate) fn new(client: LockClient, key: String, opts: HoldOptions) -> Self {
        ReentrantLock {
            client,
            key,
            opts,
            wire_acquire: Lazy::default(),
            wire_release: Lazy::default(),
        }
    }

    /// The commands of a reentrant lock (Redisson's `RLock` scripts and the library's own).
    pub(crate) fn access_checks(&self) -> Vec<access::Check> {
        let (key, opts) = (self.key.as_str(), &self.opts);
        let channel = opts.channel.as_str();
        let mut c = vec![
            access::check("exists", &[key]),
            access::check("hexists", &[key, "owner"]),
            access::check("hincrby", &[key, "owner", "1"]),
            access::check("hget", &[key, "owner"]),
            access::check("hdel", &[key, "owner"]),
            access::check("hlen", &[key]),
            access::check("pexpire", &[key, "1000"]),
            access::check("pttl", &[key]),
            access::check("del", &[key]),
            access::check("publish", &[channel, "0"]),
        ];
        if let Some(f) = &opts.fence_key {
            c.push(access::check("incr", &[f]));
            // A re-entry reads the counter's current value.
            c.push(access::check("get", &[f]));
        }
        if opts.wake_up == hold::WakeUp::PubSub {
            c.extend(access::subscriber(channel));
        }
        c
    }

    /// True if the watchdog renews this lock's holds (built without an explicit ttl).
    pub fn is_watched(&self) -> bool {
        self.opts.watched
    }

    /// The calling thread's owner id, `<client UUID>:<thread number>`: the hash field its holds
    /// are counted in, and the value of the leases it gets. The thread number is
    /// process-unique and never reused (not the OS thread id).
    pub fn owner_id(&self) -> String {
        self.owner().to_string()
    }

    /// How many holds the calling thread has on the lock, as Redis counts them (`HGET`; 0 when
    /// it holds none). Redisson's `getHoldCount`.
    pub fn hold_count(&self) -> Result<u32> {
        let owner = self.owner();
        let count: Option<i64> = self.client.with_conn(&self.key, |con, _| {
            redis::Commands::hget(con, &self.key, owner.as_bytes())
        })?;
        Ok(count.map_or(0, |n| u32::try_from(n).unwrap_or(0)))
    }

    /// The calling thread's owner id, without allocating (see [`owner_id`](Self::owner_id)).
    fn owner(&self) -> OwnerId {
        OwnerId::new(self.client.instance_id())
    }

    /// True when `lease` names another thread of this client than the calling one.
    fn of_another_thread(&self, lease: &Lease, owner: &OwnerId) -> bool {
        let value = lease.value();
        let instance = self.client.instance_id().as_bytes();
        value.len() > instance.len()
            && value.starts_with(instance)
            && value.get(instance.len()) == Some(&b':')
            && value != owner.as_bytes()
    }

    /// One attempt by `lua/reentrant_acquire.lua`: take, re-enter, or learn the holder's PTTL.
    fn attempt(&self) -> Result<Attempt> {
        let owner = self.owner();
        // Under way from before it settles: a Sentinel replay of this owner's release waits
        // for it (see `Janitor::replay`).
        let attempt_live = self.client.live().attempt(&self.key, owner.as_bytes());
        // A release of ours that failed on a connection error may still be retried by the
        // janitor: finish it first, so that a later try cannot take the new hold for the old.
        self.client
            .janitor()
            .settle(&self.client, &self.key, owner.as_bytes())?;
        let start = Instant::now();
        // What this thread holds: more on the server is a stale hold of its own (a release lost
        // in a failover), which the script sets back first.
        let known = local_count(&owner, &self.key).unwrap_or(0);
        // Sent and unanswered, or answered but not confirmed by the replicas the client
        // requires: the hold it may have counted is given back, owner-checked.
        let acquire = |con: &mut Conn, s: &Scripts| {
            // Its bytes: the same argument as its text, without the UTF-8 check.
            let args = (self.opts.lease_ms(), owner.as_bytes(), known);
            match &self.opts.fence_key {
                Some(fence) => {
                    s.reentrant_acquire
                        .eval_keys(con, &[self.key.as_str(), fence], args)
                }
                None => match self.packed_acquire(s, owner.as_bytes(), known) {
                    Some(bytes) => s
                        .reentrant_acquire
                        .eval_packed(con, &bytes, &self.key, &args),
                    None => s.reentrant_acquire.eval(con, &self.key, args),
                },
            }
        };
        // An acquire sent whose reply was lost (a failover, a timeout) may have counted a hold
        // that nobody will release, which would keep every other owner out for the whole
        // lease. The janitor gives that hold back in the background if the owner's count is
        // the one the acquire would have left (`known` plus one); if the acquire never ran,
        // the count is lower and nothing changes.
        let until = start.checked_add(self.opts.lease).unwrap_or(start);
        let reply: Value =
            string_value::acquire_undone_by(&self.client, &self.key, until, acquire, |_| {
                Some(self.forget_cleanup(owner.as_bytes(), known.saturating_add(1)))
            })?;
        let result = match hold::decode_acquire(&self.key, &reply)? {
            AcquireReply::Taken { fence } => {
                log::trace!("lock {:?}: hold taken by {owner}", self.key);
                // One reading of the clock after the reply for the live set, the watchdog's
                // first renewal and the late-reply check.
                let now = Instant::now();
                attempt_live.took_at(self.opts.lease, now);
                note_local(&owner, &self.opts.key, Seen::Taken);
                let (kind, value) = (RenewKind::HashField(KIND), owner.as_bytes());
                let lease = (self.opts).lease(&self.client, kind, value, start, fence, Some(now));
                let release = |l: &Lease| self.release(l);
                let ttl = self.opts.lease;
                crate::lease::checked_win(&self.key, lease.owned_by_thread(), ttl, now, release)
                    .map(Attempt::Acquired)
            }
            AcquireReply::Held { pttl } => {
                // Refused, so this owner holds nothing (else the script had let it re-enter).
                note_local(&owner, &self.opts.key, Seen::Nothing);
                Ok(Attempt::Held { pttl, wake: None })
            }
        };
        self.client.counters().outcome(KIND, &result);
        result
    }

    /// The blocking acquire: FIFO in this client's line for the key, woken by the release
    /// channel, except that a thread already holding the lock makes its attempt at once (its
    /// re-entry succeeds; queueing would make it wait for the threads that wait for it).
    fn acquire_blocking(&self, attempts: Attempts<'_>) -> Result<LockGuard<'_>> {
        let barge = local_count(&self.owner(), &self.key).is_some();
        let line = self.opts.line(&self.client, &self.key, true, barge, None);
        // A key of another type fails the attempt itself (WRONGTYPE), so giving up needs no
        // extra check.
        let result = crate::client::acquire::acquire_in_line(
            self,
            line,
            attempts,
            || self.attempt(),
            |_| Ok(()),
        );
        self.client.counters().blocking(KIND, &result);
        result
    }

    /// Gives back one hold of `owner` if its count is still `count` (`lua/reentrant_forget.lua`):
    /// the clean-up of a release that failed or was lost, or of an acquire whose reply was lost.
    fn forget_cleanup(&self, owner: &[u8], count: u32) -> Cleanup {
        let (lease_ms, channel) = (self.opts.lease_ms(), &self.opts.channel);
        Cleanup {
            script: |s| &s.reentrant_forget,
            keys: vec![self.key.clone()],
            args: (owner, count, lease_ms, channel, keys::UNLOCK_MESSAGE).to_redis_args(),
            value_arg: 0,
            read: read_forget,
            counted: true,
            what: "giving back one hold if the owner's count is unchanged",
        }
    }

    /// The acquire's bytes for `owner` with `known` (see `wire_acquire`), if packed.
    fn packed_acquire(&self, s: &Scripts, owner: &[u8], known: u32) -> Option<Vec<u8>> {
        // One digit: the packed count's length.
        let digit = u8::try_from(known).ok().filter(|k| *k < 10)?;
        let (lease_ms, lens) = (self.opts.lease_ms(), [owner.len(), 1]);
        self.wire_acquire
            .bytes(&lens, &[owner, &[b'0' + digit]], |v| {
                (s.reentrant_acquire).evalsha(&self.key, &(lease_ms, v[0], v[1]))
            })
    }

    /// The release's bytes for `owner` with `request` (see `wire_release`), if packed.
    fn packed_release(&self, s: &Scripts, owner: &[u8], request: &[u8]) -> Option<Vec<u8>> {
        let (lease_ms, channel) = (self.opts.lease_ms(), self.opts.channel.as_str());
        let lens = [owner.len(), request.len()];
        self.wire_release.bytes(&lens, &[owner, request], |v| {
            let args = (keys::UNLOCK_MESSAGE, lease_ms, v[0], channel, v[1]);
            s.reentrant_release.evalsha(&self.key, &args)
        })
    }
}

impl DistributedLock for ReentrantLock {
    hold::hold_accessors!();

    fn try_acquire(&self) -> Result<Lease> {
        hold::taken(&self.key, self.attempt())
    }

    /// Gives back the hold of `lease`: `Ok(true)` when its owner held the lock (one hold given
    /// back; the lock is free once the owner's last hold is), `Ok(false)` when the owner holds
    /// nothing, in which case nothing was changed.
    ///
    /// Only on the thread that took the hold: a lease of another thread of this client (moved
    /// here) is refused with [`LockError::Unsupported`] and nothing changes, the lease still
    /// renewed if it is watched. Release it on its own thread (see `docs/reentrant.md`):
    /// that thread's record of its holds, which its later acquires and failed releases rely
    /// on, is kept there.
    fn release(&self, lease: &Lease) -> Result<bool> {
        let owner = self.owner();
        if self.of_another_thread(lease, &owner) {
            return Err(LockError::unsupported(
                &self.key,
                format!(
                    "a Reentrant hold is released on the thread that took it: owner {} is \
                     another thread of this client; nothing was changed",
                    printable(lease.value())
                ),
            ));
        }
        // A hold whose lifetime passed is reported lost even if the owner's count was still
        // there (kept alive by a later re-entry, say): its section overran.
        let overran = lease.is_expired();
        // Only this hold stops being renewed: every other hold of the owner has its own
        // renewal, and any of them keeps the shared key alive.
        lease.stop_renewal();
        let (client, key, value) = (&self.client, self.key.as_str(), lease.value());
        // Only the calling thread's own holds are recorded (a lease of another client may be
        // released here): their count before this release, as its record last saw it.
        let own = value == owner.as_bytes();
        let count = || own.then(|| local_count(&owner, key)).flatten();
        // One id per call: a copy of the command sent again after a dropped connection
        // carries the same id, and the script does not give back a second hold for it.
        let request = crate::ids::new_token();
        let generation = client.switch_generation();
        let reply: Result<Option<i64>> = client.with_conn(key, |con, s| {
            let args = (
                keys::UNLOCK_MESSAGE,
                self.opts.lease_ms(),
                value,
                self.opts.channel.as_str(),
                &request[..],
            );
            match self.packed_release(s, value, &request) {
                Some(bytes) => s.reentrant_release.eval_packed(con, &bytes, key, &args),
                None => s.reentrant_release.eval(con, key, args),
            }
        });
        // One hold of the owner fewer, whatever the answer (a failed release is the
        // janitor's now).
        (client.live()).release(live::holding(key, value), Some(self.opts.lease));
        // A release that failed on a connection error (a failover, a restart) may or may not
        // have run. The janitor gives the hold back in the background if the owner's count is
        // still the one it had before (`lua/reentrant_forget.lua`), so the lock is not left for
        // the rest of its lease and a hold is never given back twice. Only the calling thread's
        // own holds are known well enough (their count); another client's lease (another
        // thread's is refused above) expires with its lease.
        if let Some(why) = hold::failed_release(&reply) {
            match count() {
                None => log::warn!(
                    "lock {:?}: a release by owner {} failed on a connection error and is not \
                     retried (its hold count is not known on this thread); the hold expires \
                     with its lease",
                    self.key,
                    printable(lease.value())
                ),
                Some(count) => {
                    // Given back if the owner's count is still `count`, while a hold may live.
                    let (undo, until) = (self.forget_cleanup(value, count), lease.valid_until());
                    let done = (client.janitor()).forget(client, undo, why, until);
                    // The janitor makes it happen (or the hold expires): count it given back.
                    let seen = if count > 1 {
                        Seen::Decremented
                    } else {
                        Seen::Nothing
                    };
                    note_local(&owner, &self.opts.key, seen);
                    if done {
                        // The in-line retry gave the hold back (owner-checked by the count, so at
                        // most once): released. Sending this release again would give back a
                        // second hold.
                        return Ok(string_value::redone_release(
                            client, KIND, key, lease, overran,
                        ));
                    }
                }
            }
        }
        let reply = reply?;
        // A Sentinel client remembers a release of the calling thread's own hold for a while: if
        // a master switch is announced meanwhile, the release may have been done on the old
        // master only, and is done again on the new one (see `crate::client::sentinel_watch`),
        // unless the owner acquires or holds the lock again by then (the client's live set,
        // entered before an acquire settles: see `Janitor::replay`).
        if matches!(reply, Some(n) if n >= 0) && client.switches().is_some() {
            if let Some(count) = count() {
                let (undo, until) = (self.forget_cleanup(value, count), lease.valid_until());
                janitor::remember(client, undo, None, generation, until);
            }
        }
        let (seen, ours) = match reply {
            // The owner keeps other holds: the lock stays taken, so waiters keep waiting.
            Some(0) => (Seen::Decremented, true),
            // The last hold: 1 + the subscriber connections the release was published to.
            Some(freed) if freed >= 1 => {
                hold::after_publish(client, key, &self.opts.channel, freed - 1);
                crate::client::acquire::note_release(client.waiters(), key, true);
                (Seen::Nothing, true)
            }
            // Returned as `Ok(false)`; a guard dropped without `unlock` warns.
            None => {
                let owner = printable(lease.value());
                log::debug!(
                    "lock {:?}: release by owner {owner} found no hold of it (it expired, the \
                     owner never held the lock, or a copy sent before a dropped connection freed \
                     it and its reply was lost); nothing was changed",
                    self.key
                );
                (Seen::Nothing, false)
            }
            Some(other) => {
                let what = "the reentrant release script";
                return Err(LockError::unexpected_reply(&self.key, what, &other));
            }
        };
        if !ours || overran {
            self.client.counters().lost_on_release(KIND, lease);
        }
        if own {
            note_local(&owner, &self.opts.key, seen);
        }
        Ok(ours && !overran)
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let (client, key) = (&self.client, self.key.as_str());
        hold::extend(client, KIND, key, lease, ttl, true, |owner, ttl_ms| {
            let renewed: i64 = client.with_conn_confirmed(key, None, |con, s| {
                s.reentrant_extend.eval(con, key, (owner, ttl_ms))
            })?;
            Ok((renewed == 1, None))
        })
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        let held: bool = self.client.with_conn(&self.key, |con, _| {
            redis::Commands::hexists(con, &self.key, lease.value())
        })?;
        Ok(held && !lease.is_expired())
    }

    lock::guard_methods!(|this, attempts| this.acquire_blocking(attempts));
}

impl crate::lock::LockAdmin for ReentrantLock {
    fn state(&self) -> Result<LockState> {
        hold::state(&self.client, &self.key, "hash")
    }

    fn force_unlock(&self) -> Result<bool> {
        let notice = hold::Notice {
            message: keys::UNLOCK_MESSAGE.as_bytes(),
            channels: std::slice::from_ref(&self.opts.channel),
        };
        hold::force_unlock(&self.client, &self.key, Some(notice))
    }
}

/// Reads `lua/reentrant_forget.lua`'s reply: 1 or more when it gave back the owner's last hold
/// (the key is gone), 0 when it gave back one of several, nil when it changed nothing.
fn read_forget(v: &redis::Value) -> (Done, Option<(Vec<u8>, Grant)>) {
    match v {
        redis::Value::Int(n) if *n >= 1 => (Done::Freed, None),
        redis::Value::Int(0) => (Done::GaveBack, None),
        _ => (Done::Nothing, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids as owner;

    /// True if the calling thread, as `owner`, last saw itself holding `key`.
    fn holds_local(owner: &OwnerId, key: &str) -> bool {
        local_count(owner, key).is_some()
    }

    #[test]
    fn local_holds_count_per_instance_and_key() {
        let (a, b) = (OwnerId::new("instance-a"), OwnerId::new("instance-b"));
        let (k, other, t): (Arc<str>, Arc<str>, Arc<str>) =
            ("k".into(), "other".into(), "t".into());
        assert!(!holds_local(&a, "k"));
        note_local(&a, &k, Seen::Taken);
        // Another lock object on the key: another `Arc`, the same key.
        note_local(&a, &Arc::from("k"), Seen::Taken);
        assert!(holds_local(&a, "k"));
        assert!(!holds_local(&b, "k"), "another client is another owner");
        assert!(!holds_local(&a, "other"));
        note_local(&b, &other, Seen::Taken);
        note_local(&a, &k, Seen::Decremented);
        note_local(&a, &k, Seen::Decremented);
        assert!(
            holds_local(&a, "k"),
            "a decrement never forgets the last hold"
        );
        note_local(&a, &k, Seen::Nothing);
        assert!(!holds_local(&a, "k"));
        assert!(holds_local(&b, "other"), "other entries are kept");
        note_local(&b, &other, Seen::Nothing);
        note_local(&b, &other, Seen::Decremented);
        assert!(!holds_local(&b, "other"), "no hold is made up");
        let there = std::thread::spawn(move || {
            let a = OwnerId::new("instance-a");
            note_local(&a, &t, Seen::Taken);
            holds_local(&a, "t")
        })
        .join()
        .expect("thread");
        assert!(there);
        assert!(!holds_local(&a, "t"), "holds are per thread");
        assert!(LOCAL_HOLDS.with(|h| h.borrow().is_empty()));
    }

    #[test]
    fn local_holds_count_down_to_the_last() {
        let a = OwnerId::new("instance-a");
        let k: Arc<str> = "count".into();
        for _ in 0..3 {
            note_local(&a, &k, Seen::Taken);
        }
        let count = || {
            LOCAL_HOLDS.with(|h| {
                h.borrow()
                    .iter()
                    .find(|h| &*h.key == "count" && h.owner == a)
                    .map(|h| h.count)
            })
        };
        assert_eq!(count(), Some(3));
        note_local(&a, &k, Seen::Decremented);
        assert_eq!(count(), Some(2));
        note_local(&a, &k, Seen::Nothing);
        assert_eq!(count(), None);
    }

    #[test]
    fn owner_ids_fit_a_lease() {
        let id = OwnerId::new(&owner::new_uuid()).to_string();
        let longest = format!("{}:{}", owner::new_uuid(), u64::MAX);
        assert!(longest.len() <= 64, "{longest}");
        let lease = Lease::new(longest.as_bytes(), Instant::now(), Duration::from_secs(1));
        assert_eq!(lease.value(), longest.as_bytes());
        assert!(id.len() > 36 + 1, "{id}");
    }

    #[test]
    fn scripts_are_registered() {
        let s = crate::scripts::Scripts::for_server(None);
        assert!(s.reentrant_acquire.code().contains("hincrby"));
        assert!(s.reentrant_release.code().contains("publish"));
        assert!(s.reentrant_extend.code().contains("pexpire"));
    }
}
