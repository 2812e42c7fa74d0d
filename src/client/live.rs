//! The values this client is writing or holds at lock keys (tokens that start
//! with the client's id): a value of the client's found at a key and NOT in this set is a hold
//! nobody will release (released on a primary that lost the release in a failover, or written
//! by an acquire whose reply was lost), which the client may delete, owner-checked on that
//! value, instead of waiting out its lease.
//!
//! A value is entered before the command that writes it is sent, so a read that sees the write
//! and then looks here finds it. Sharded by the value's fingerprint; memory is bounded by the
//! holds and acquires under way.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

const SHARDS: usize = 16;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct LiveValues {
    shards: [Mutex<HashMap<u64, u32>>; SHARDS],
}

/// A 64-bit fingerprint of `value` (FNV-1a). Two values with one fingerprint are both taken
/// for live: the safe side (a stale hold is then left to expire).
fn fingerprint(value: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in value {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl LiveValues {
    fn shard(&self, f: u64) -> &Mutex<HashMap<u64, u32>> {
        &self.shards[(f as usize) % SHARDS]
    }

    /// `value` is about to be written, or is held.
    pub(crate) fn begin(&self, value: &[u8]) {
        let f = fingerprint(value);
        let mut s = self.shard(f).lock().unwrap_or_else(PoisonError::into_inner);
        *s.entry(f).or_insert(0) += 1;
    }

    /// `value` is no longer held (released, lost, or never taken).
    pub(crate) fn end(&self, value: &[u8]) {
        let f = fingerprint(value);
        let mut s = self.shard(f).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = s.get_mut(&f) {
            *n -= 1;
            if *n == 0 {
                s.remove(&f);
            }
        }
    }

    /// True while `value` is being written or held.
    pub(crate) fn contains(&self, value: &[u8]) -> bool {
        let f = fingerprint(value);
        self.shard(f)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&f)
    }
}

#[cfg(test)]
mod tests {
    use super::LiveValues;

    #[test]
    fn a_value_is_live_from_begin_to_its_last_end() {
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
    }
}
