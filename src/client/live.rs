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
        // Only `u64`s are hashed here; anything else is folded in, FNV-1a style.
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
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
        while let Some(&(until, f)) = self.by_deadline.first() {
            if until > now {
                break;
            }
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
        let Some(e) = self.entries.get_mut(&f) else {
            return;
        };
        if e.until.is_some_and(|old| old >= until) {
            return;
        }
        if let Some(old) = e.until.replace(until) {
            self.by_deadline.remove(&(old, f));
        }
        self.by_deadline.insert((until, f));
    }

    /// Removes `f`'s entry if nothing keeps it.
    fn settle(&mut self, f: u64) {
        if let Some(e) = self.entries.get_mut(&f) {
            if e.holds == 0 {
                if let Some(old) = e.until.take() {
                    self.by_deadline.remove(&(old, f));
                }
                if e.writing == 0 {
                    self.entries.remove(&f);
                }
            }
        }
    }
}

/// A 64-bit fingerprint of `value` (FNV-1a, its bits then spread by MurmurHash3's finalizer
/// step, a bijection: the shard, the table's index and its tags each take other bits). Two
/// values with one fingerprint are both taken for live: the safe side (a stale hold is then
/// left to expire).
fn fingerprint(value: &[u8]) -> u64 {
    fingerprint_of(&[value])
}

/// The [`fingerprint`] of the concatenation of `parts`, without building it (FNV-1a runs
/// byte by byte, so the parts give the same fingerprint as the whole).
pub(crate) fn fingerprint_of(parts: &[&[u8]]) -> u64 {
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

    /// A write of `value` is about to be sent.
    #[cfg(test)]
    pub(crate) fn begin(&self, value: &[u8]) {
        self.begin_at(value, Instant::now());
    }

    /// [`begin`](Self::begin) with the time read by the caller.
    pub(crate) fn begin_at(&self, value: &[u8], now: Instant) {
        self.begin_fp(fingerprint(value), now);
    }

    /// [`begin_at`](Self::begin_at) of the value of fingerprint `f` ([`fingerprint_of`]).
    pub(crate) fn begin_fp(&self, f: u64, now: Instant) {
        let mut s = self.shard(f, now);
        let e = s.entries.entry(f).or_default();
        e.writing = e.writing.saturating_add(1);
    }

    /// The write of `value` is over and took no hold (one that did: [`took`](Self::took)).
    pub(crate) fn end(&self, value: &[u8]) {
        self.end_fp(fingerprint(value), Instant::now());
    }

    /// [`end`](Self::end) of the value of fingerprint `f`, the clock read by the caller.
    pub(crate) fn end_fp(&self, f: u64, now: Instant) {
        let mut s = self.shard(f, now);
        if let Some(e) = s.entries.get_mut(&f) {
            e.writing = e.writing.saturating_sub(1);
            s.settle(f);
        }
    }

    /// A hold of `value` was taken, written with lifetime `ttl`.
    #[cfg(test)]
    pub(crate) fn hold(&self, value: &[u8], ttl: Duration) {
        self.add_hold(fingerprint(value), ttl, false, Instant::now());
    }

    /// [`hold`](Self::hold) of the value of fingerprint `f`, the reply having been read at
    /// `now`.
    pub(crate) fn hold_fp(&self, f: u64, ttl: Duration, now: Instant) {
        self.add_hold(f, ttl, false, now);
    }

    /// The write of `value` took a hold, written with lifetime `ttl`: [`hold`](Self::hold)
    /// and [`end`](Self::end) at once.
    pub(crate) fn took(&self, value: &[u8], ttl: Duration) {
        self.add_hold(fingerprint(value), ttl, true, Instant::now());
    }

    /// [`took`](Self::took), the reply having been read at `now`.
    pub(crate) fn took_at(&self, value: &[u8], ttl: Duration, now: Instant) {
        self.add_hold(fingerprint(value), ttl, true, now);
    }

    fn add_hold(&self, f: u64, ttl: Duration, write_over: bool, now: Instant) {
        let mut s = self.shard(f, now);
        let e = s.entries.entry(f).or_default();
        if write_over {
            e.writing = e.writing.saturating_sub(1);
        }
        e.holds = e.holds.saturating_add(1);
        s.push_deadline(f, deadline(now, ttl));
    }

    /// A hold of `value` was renewed or extended to lifetime `ttl` (ignored unless held).
    pub(crate) fn renew(&self, value: &[u8], ttl: Duration) {
        self.renew_fp(fingerprint(value), ttl);
    }

    /// [`renew`](Self::renew) of the value of fingerprint `f`.
    pub(crate) fn renew_fp(&self, f: u64, ttl: Duration) {
        let now = Instant::now();
        let mut s = self.shard(f, now);
        if s.entries.get(&f).is_some_and(|e| e.holds > 0) {
            s.push_deadline(f, deadline(now, ttl));
        }
    }

    /// One hold of `value` was released (or its release handed to the janitor). Drops no other
    /// entry (that would read the clock on every release): the next write or hold on the
    /// shard does.
    pub(crate) fn release(&self, value: &[u8]) {
        self.release_fp(fingerprint(value), None);
    }

    /// [`release`](Self::release) of the value of fingerprint `f`, then, with `renew`, the
    /// holds left (if any) renewed to that lifetime, as [`renew_fp`](Self::renew_fp): under
    /// one lock of the shard, and the clock read only if holds are left.
    pub(crate) fn release_fp(&self, f: u64, renew: Option<Duration>) {
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

    /// True while `value` is being written, or held and within its deadline.
    pub(crate) fn contains(&self, value: &[u8]) -> bool {
        self.contains_fp(fingerprint(value))
    }

    /// [`contains`](Self::contains) of the value of fingerprint `f`.
    pub(crate) fn contains_fp(&self, f: u64) -> bool {
        self.shard(f, Instant::now()).entries.contains_key(&f)
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

#[cfg(test)]
mod tests {
    use super::LiveValues;
    use std::time::Duration;

    #[test]
    fn a_write_is_live_from_begin_to_its_last_end() {
        let live = LiveValues::default();
        assert!(!live.contains(b"t"));
        live.begin(b"t");
        live.begin(b"t");
        live.end(b"t");
        assert!(live.contains(b"t"));
        live.end(b"t");
        assert!(!live.contains(b"t"));
        live.end(b"t");
        assert!(!live.contains(b"t"));
        live.begin(b"u");
        assert!(!live.contains(b"t"));
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn a_hold_is_live_until_its_release_or_deadline() {
        let live = LiveValues::default();
        let long = Duration::from_secs(60);
        // Taken: the write ends as the hold is recorded, and the value stays.
        live.begin(b"t");
        live.took(b"t", long);
        assert!(live.contains(b"t"));
        live.release(b"t");
        assert!(!live.contains(b"t"));
        // Counted holds: live until the last release.
        live.hold(b"c", long);
        live.hold(b"c", long);
        live.release(b"c");
        assert!(live.contains(b"c"));
        live.release(b"c");
        assert!(!live.contains(b"c"));
        // A renewal of a value not held adds nothing.
        live.renew(b"x", long);
        assert!(!live.contains(b"x"));
        assert_eq!(live.len(), 0);
        // A hold whose lifetime ran out leaves by itself; one renewed in time stays.
        live.hold(b"e", Duration::ZERO);
        live.hold(b"r", Duration::ZERO);
        live.renew(b"r", long);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!live.contains(b"e"));
        assert!(live.contains(b"r"));
        // A write under way keeps the value past its hold's deadline.
        live.begin(b"w");
        live.hold(b"w", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(live.contains(b"w"));
        live.end(b"w");
        assert!(!live.contains(b"w"));
    }

    #[test]
    fn holds_left_to_expire_do_not_pile_up() {
        let live = LiveValues::default();
        // Given up: taken, never released, with a lifetime that has run out (2 ms of drift).
        for i in 0..10_000u32 {
            let v = i.to_be_bytes();
            live.begin(&v);
            live.took(&v, Duration::ZERO);
        }
        std::thread::sleep(Duration::from_millis(5));
        // Ordinary operations on every shard drop them: what stays is what is live.
        for i in 0..1_000u32 {
            live.begin(format!("w{i}").as_bytes());
        }
        assert_eq!(live.stored(), 1_000);
        assert_eq!(live.len(), 1_000);
    }
}
