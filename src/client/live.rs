//! The values this client is writing or holds at lock keys (tokens that start
//! with the client's id): a value of the client's found at a key and NOT in this set is a hold
//! nobody will release (released on a primary that lost the release in a failover, or written
//! by an acquire whose reply was lost), which the client may delete, owner-checked on that
//! value, instead of waiting out its lease.
//!
//! A value is entered before the command that writes it is sent, so a read that sees the write
//! and then looks here finds it. A write under way stays until it is over; a hold it took stays
//! until its release or until its deadline passes: the latest lifetime written for it (by the
//! acquire, an extend or a renewal), counted from after the reply, plus the clock-drift
//! allowance. By then the server has let the value expire, and no lease of it is valid any
//! more, so a hold given up (`into_lease()` and dropped) or lost leaves the set by itself.
//! Entries past their deadline are dropped by the next write begun or hold taken on their shard
//! (an index by deadline finds them), so memory is bounded by the writes under way and the
//! holds whose lifetime has not run out, never by the number of acquires.
//!
//! Sharded by the value's fingerprint, which also keys the entries as it is (it is a hash
//! already: hashing it again cost every acquire and release a SipHash).

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

const SHARDS: usize = 16;

/// Hashes a fingerprint (a `u64`) to itself.
#[derive(Debug, Default)]
struct Fingerprint(u64);

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; anything else is folded in as [`fingerprint_of`] does.
        self.0 ^= fingerprint_of(&[bytes]);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct LiveValues {
    shards: [Mutex<Shard>; SHARDS],
}

/// One value's entry.
#[derive(Debug, Default)]
struct Entry {
    /// Writes of the value under way (acquires sent, or waiting for a grant).
    writing: u32,
    /// Holds of the value taken and not released (counted holds: one per re-entry).
    holds: u32,
    /// With `holds`: the holds' deadline, also in the shard's index.
    until: Option<Instant>,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<u64, Entry, BuildHasherDefault<Fingerprint>>,
    /// `(deadline, fingerprint)` of every entry with holds: the first ones are those to drop.
    by_deadline: BTreeSet<(Instant, u64)>,
}

impl Shard {
    /// Drops the holds whose deadline is `now` or earlier (and their entries, unless a write
    /// of the value is under way).
    fn purge(&mut self, now: Instant) {
        while let Some(&(_, f)) = self.by_deadline.first().filter(|(until, _)| *until <= now) {
            self.by_deadline.pop_first();
            if let Some(e) = self.entries.get_mut(&f) {
                e.holds = 0;
                e.until = None;
                if e.writing == 0 {
                    self.entries.remove(&f);
                }
            }
        }
    }

    /// Moves `f`'s deadline to `until` if that is later.
    fn push_deadline(&mut self, f: u64, until: Instant) {
        let later = |e: &&mut Entry| e.until.is_none_or(|old| old < until);
        let Some(e) = self.entries.get_mut(&f).filter(later) else {
            return;
        };
        if let Some(old) = e.until.replace(until) {
            self.by_deadline.remove(&(old, f));
        }
        self.by_deadline.insert((until, f));
    }

    /// Removes `f`'s entry if nothing keeps it.
    fn settle(&mut self, f: u64) {
        let Some(e) = self.entries.get_mut(&f).filter(|e| e.holds == 0) else {
            return;
        };
        if let Some(old) = e.until.take() {
            self.by_deadline.remove(&(old, f));
        }
        if e.writing == 0 {
            self.entries.remove(&f);
        }
    }
}

/// The entry of a value written at a lock key (a token): a 64-bit fingerprint of `value`
/// (FNV-1a, its bits then spread by MurmurHash3's finalizer step, a bijection: the shard, the
/// table's index and its tags each take other bits). Two values with one fingerprint are both
/// taken for live: the safe side (a stale hold is then left to expire).
pub(crate) fn value(value: &[u8]) -> u64 {
    fingerprint_of(&[value])
}

/// The entry of `owner` holding a counted hold (a hash field) at `key`: the fingerprint of
/// `\0 h key \0 owner` (a NUL cannot start a token), not built.
pub(crate) fn holding(key: &str, owner: &[u8]) -> u64 {
    fingerprint_of(&[b"\0h", key.as_bytes(), b"\0", owner])
}

/// The entry of an acquire of a counted hold of `owner` at `key` under way (see
/// [`LiveValues::attempt`]): as [`holding`], with `a`.
pub(crate) fn attempting(key: &str, owner: &[u8]) -> u64 {
    fingerprint_of(&[b"\0a", key.as_bytes(), b"\0", owner])
}

/// The fingerprint of the concatenation of `parts`, without building it (FNV-1a runs
/// byte by byte, so the parts give the same fingerprint as the whole).
fn fingerprint_of(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    // Nested loops, not `flat_map`: its per-byte bookkeeping tripled the cost.
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Until when a hold written with lifetime `ttl` by a reply read `now` may still live: the
/// server counts the lifetime from before the reply, and its clock may run slow by the drift
/// allowance (RedLock's: 1 % plus 2 ms).
fn deadline(now: Instant, ttl: Duration) -> Instant {
    let drift = (ttl / 100).saturating_add(Duration::from_millis(2));
    crate::time::saturating_add(now, ttl.saturating_add(drift))
}

/// Every entry is named by its fingerprint: [`value`], [`holding`] or [`attempting`].
impl LiveValues {
    /// The shard of fingerprint `f`, its expired holds dropped.
    fn shard(&self, f: u64, now: Instant) -> MutexGuard<'_, Shard> {
        let mut s = self.shard_of(f);
        s.purge(now);
        s
    }

    /// The shard of fingerprint `f` as it is.
    fn shard_of(&self, f: u64) -> MutexGuard<'_, Shard> {
        // Bits the entries' hash table neither indexes by (the low ones) nor tags with (the
        // top 7).
        self.shards[((f >> 32) as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A write of entry `f` is about to be sent (or an owner's acquire begins), the clock
    /// read by the caller at `now`.
    pub(crate) fn begin(&self, f: u64, now: Instant) {
        let mut s = self.shard(f, now);
        let e = s.entries.entry(f).or_default();
        e.writing = e.writing.saturating_add(1);
    }

    /// The write of entry `f` is over and took no hold (one that did: [`hold`](Self::hold)).
    pub(crate) fn end(&self, f: u64, now: Instant) {
        let mut s = self.shard(f, now);
        if let Some(e) = s.entries.get_mut(&f) {
            e.writing = e.writing.saturating_sub(1);
            s.settle(f);
        }
    }

    /// A hold of entry `f` was taken, written with lifetime `ttl`, the reply having been read
    /// at `now`; with `write_over`, the write that took it is over too ([`end`](Self::end) at
    /// once).
    pub(crate) fn hold(&self, f: u64, ttl: Duration, write_over: bool, now: Instant) {
        let mut s = self.shard(f, now);
        let e = s.entries.entry(f).or_default();
        if write_over {
            e.writing = e.writing.saturating_sub(1);
        }
        e.holds = e.holds.saturating_add(1);
        s.push_deadline(f, deadline(now, ttl));
    }

    /// The holds of entry `f` were renewed or extended to lifetime `ttl` (ignored unless
    /// held).
    pub(crate) fn renew(&self, f: u64, ttl: Duration) {
        let now = Instant::now();
        let mut s = self.shard(f, now);
        if s.entries.get(&f).is_some_and(|e| e.holds > 0) {
            s.push_deadline(f, deadline(now, ttl));
        }
    }

    /// One hold of entry `f` was released (or its release handed to the janitor), then, with
    /// `renew`, the holds left (if any) renewed to that lifetime, as [`renew`](Self::renew):
    /// under one lock of the shard, and the clock read only if holds are left. Drops no other
    /// entry (that would read the clock on every release): the next write or hold on the
    /// shard does.
    pub(crate) fn release(&self, f: u64, renew: Option<Duration>) {
        let mut s = self.shard_of(f);
        let Some(e) = s.entries.get_mut(&f) else {
            return;
        };
        e.holds = e.holds.saturating_sub(1);
        match renew {
            Some(ttl) if e.holds > 0 => {
                let now = Instant::now();
                s.purge(now);
                // Purged if its deadline had passed: then nothing is left to renew.
                if s.entries.get(&f).is_some_and(|e| e.holds > 0) {
                    s.push_deadline(f, deadline(now, ttl));
                }
            }
            _ => s.settle(f),
        }
    }

    /// True while entry `f` is being written, or held and within its deadline.
    pub(crate) fn contains(&self, f: u64) -> bool {
        self.shard(f, Instant::now()).entries.contains_key(&f)
    }

    /// Runs `run` with the write (or owner's acquire) of entry `f`, if any, not under way.
    pub(crate) fn paused<T>(&self, f: Option<u64>, run: impl FnOnce() -> T) -> T {
        f.inspect(|&f| self.end(f, Instant::now()));
        let out = run();
        f.inspect(|&f| self.begin(f, Instant::now()));
        out
    }

    /// `value` (a token) is about to be written, the clock read by the caller at `now`: nothing
    /// may delete it as a stale hold of this client's until the returned guard is dropped,
    /// unless the write took a hold, recorded by [`LiveValue::keep_at`].
    pub(crate) fn write<'a>(&'a self, value: &'a [u8], now: Instant) -> LiveValue<'a> {
        let f = self::value(value);
        self.begin(f, now);
        LiveValue {
            live: self,
            value,
            f,
            kept: false,
        }
    }

    /// An acquire of a counted hold of `owner` at `key` begins: until the returned guard is
    /// dropped, its [`attempting`] entry is live; [`OwnerAttempt::took_at`] counts the hold it
    /// took (its [`holding`] entry) until its release or the end of its lifetime. A Sentinel
    /// replay of a counted release waits for the owner's attempts under way and then leaves an
    /// owner that holds the lock alone (see `Janitor::replay`).
    pub(crate) fn attempt<'a>(&'a self, key: &'a str, owner: &'a [u8]) -> OwnerAttempt<'a> {
        let attempting = attempting(key, owner);
        self.begin(attempting, Instant::now());
        OwnerAttempt {
            live: self,
            key,
            owner,
            attempting,
            seen: std::cell::Cell::new(None),
        }
    }

    /// Entries kept, after dropping the holds past their deadline.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) fn len(&self) -> usize {
        let now = Instant::now();
        self.shards
            .iter()
            .map(|m| {
                let mut s = m.lock().unwrap_or_else(PoisonError::into_inner);
                s.purge(now);
                s.entries.len()
            })
            .sum()
    }

    /// Entries kept, as they are (for the tests: what the ordinary operations drop).
    #[cfg(test)]
    fn stored(&self) -> usize {
        self.shards
            .iter()
            .map(|m| {
                m.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .len()
            })
            .sum()
    }
}

/// A value being written by an acquire (see [`LiveValues::write`]).
pub(crate) struct LiveValue<'a> {
    live: &'a LiveValues,
    value: &'a [u8],
    f: u64,
    kept: bool,
}

impl LiveValue<'_> {
    /// The value being written.
    pub(crate) fn value(&self) -> &[u8] {
        self.value
    }

    /// The acquire took the lock with lifetime `ttl`, its reply read at `now`: the write is
    /// over, and the value stays live until its release, or until that lifetime (or a later
    /// one written by an extend or renewal) has run out.
    pub(crate) fn keep_at(&mut self, ttl: Duration, now: Instant) {
        if !std::mem::replace(&mut self.kept, true) {
            self.live.hold(self.f, ttl, true, now);
        }
    }
}

impl Drop for LiveValue<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.live.end(self.f, Instant::now());
        }
    }
}

/// An acquire of a counted hold under way (see [`LiveValues::attempt`]).
pub(crate) struct OwnerAttempt<'a> {
    live: &'a LiveValues,
    key: &'a str,
    owner: &'a [u8],
    /// Fingerprint of the attempting entry (computed once for its begin and end).
    attempting: u64,
    /// When the reply that took the hold was read: the clock reading the end reuses.
    seen: std::cell::Cell<Option<Instant>>,
}

impl OwnerAttempt<'_> {
    /// The server counted a hold for the owner, with lifetime `ttl`, its reply read at `now`:
    /// counted until its release or the end of its lifetime.
    pub(crate) fn took_at(&self, ttl: Duration, now: Instant) {
        let f = holding(self.key, self.owner);
        self.live.hold(f, ttl, false, now);
        self.seen.set(Some(now));
    }
}

impl Drop for OwnerAttempt<'_> {
    fn drop(&mut self) {
        let now = self.seen.get().unwrap_or_else(Instant::now);
        self.live.end(self.attempting, now);
    }
}

#[cfg(test)]
mod tests {
    use super::{value, LiveValues};
    use std::time::{Duration, Instant};

    /// The operations on the entry of a value, as the tests use them.
    impl LiveValues {
        fn begin_v(&self, v: &[u8]) {
            self.begin(value(v), Instant::now());
        }
        fn end_v(&self, v: &[u8]) {
            self.end(value(v), Instant::now());
        }
        fn hold_v(&self, v: &[u8], ttl: Duration, write_over: bool) {
            self.hold(value(v), ttl, write_over, Instant::now());
        }
        fn has(&self, v: &[u8]) -> bool {
            self.contains(value(v))
        }
    }

    #[test]
    fn a_write_is_live_from_begin_to_its_last_end() {
        let live = LiveValues::default();
        assert!(!live.has(b"t"));
        live.begin_v(b"t");
        live.begin_v(b"t");
        live.end_v(b"t");
        assert!(live.has(b"t"));
        live.end_v(b"t");
        assert!(!live.has(b"t"));
        live.end_v(b"t");
        assert!(!live.has(b"t"));
        live.begin_v(b"u");
        assert!(!live.has(b"t"));
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn a_hold_is_live_until_its_release_or_deadline() {
        let live = LiveValues::default();
        let long = Duration::from_secs(60);
        // Taken: the write ends as the hold is recorded, and the value stays.
        live.begin_v(b"t");
        live.hold_v(b"t", long, true);
        assert!(live.has(b"t"));
        live.release(value(b"t"), None);
        assert!(!live.has(b"t"));
        // Counted holds: live until the last release.
        live.hold_v(b"c", long, false);
        live.hold_v(b"c", long, false);
        live.release(value(b"c"), None);
        assert!(live.has(b"c"));
        live.release(value(b"c"), None);
        assert!(!live.has(b"c"));
        // A renewal of a value not held adds nothing.
        live.renew(value(b"x"), long);
        assert!(!live.has(b"x"));
        assert_eq!(live.len(), 0);
        // A hold whose lifetime ran out leaves by itself; one renewed in time stays.
        live.hold_v(b"e", Duration::ZERO, false);
        live.hold_v(b"r", Duration::ZERO, false);
        live.renew(value(b"r"), long);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!live.has(b"e"));
        assert!(live.has(b"r"));
        // A write under way keeps the value past its hold's deadline.
        live.begin_v(b"w");
        live.hold_v(b"w", Duration::ZERO, false);
        std::thread::sleep(Duration::from_millis(5));
        assert!(live.has(b"w"));
        live.end_v(b"w");
        assert!(!live.has(b"w"));
    }

    #[test]
    fn holds_left_to_expire_do_not_pile_up() {
        let live = LiveValues::default();
        // Given up: taken, never released, with a lifetime that has run out (2 ms of drift).
        for i in 0..10_000u32 {
            let v = i.to_be_bytes();
            live.begin_v(&v);
            live.hold_v(&v, Duration::ZERO, true);
        }
        std::thread::sleep(Duration::from_millis(5));
        // Ordinary operations on every shard drop them: what stays is what is live.
        for i in 0..1_000u32 {
            live.begin_v(format!("w{i}").as_bytes());
        }
        assert_eq!(live.stored(), 1_000);
        assert_eq!(live.len(), 1_000);
    }
}
