//! Names of the companion keys and channels of a lock.
//!
//! A lock may need more than its key: a pub/sub channel its releases are announced on, and a
//! fencing counter. Two rules, one per kind of name:
//!
//! - **Names Redisson also uses** (the release channel `redisson_lock__channel`) follow
//!   Redisson's `prefixName` exactly: `<prefix>:<key>` when the key contains `{` anywhere,
//!   `<prefix>:{<key>}` otherwise. Java Redisson clients on the same key then hear our releases
//!   and we hear theirs, for every key. For a key with a `{` that is no complete hash tag
//!   (`a{b`, `a{}b`) that name may hash to another cluster slot than the key; the library
//!   therefore never passes a channel as a script KEY (it goes in ARGV: `PUBLISH` inside a
//!   script is not routed by slot, a cluster forwards it to every node).
//! - **Names only this library uses** (the fencing counter `dlock_fence`) are always in the
//!   key's slot, since a script touches them together with the key: `<prefix>:{<key>}`, or
//!   `<prefix>:<key>` when the key has a hash tag, whichever lands in the key's slot; for a key
//!   whose braces defeat both forms (`a{}b`, `}a{b`, `a}b`), `<prefix>:{<n>}:<key>` with the smallest
//!   hexadecimal `n` whose hash tag lands there. Each try hashes only `n` (at most 5 bytes), and
//!   every slot is reached below [`TAG_TRIES`] (a unit test checks all 16 384), so the search is
//!   bounded and never fails. These names are the library's own: Redisson has no such keys.

use crate::error::{LockError, Result};

/// Prefix of the channel on which releases are published (Redisson's `RedissonLock`).
pub(crate) const CHANNEL_PREFIX: &str = "redisson_lock__channel";
/// Prefix of the fencing counter.
pub(crate) const FENCE_PREFIX: &str = "dlock_fence";
/// The message published on a release (Redisson's `UNLOCK_MESSAGE`).
pub(crate) const UNLOCK_MESSAGE: &str = "0";
/// How many hexadecimal hash tags `0, 1, …` are tried for a library-only name of a key whose
/// braces defeat both prefix forms: every one of the 16 384 slots is the slot of one of them
/// (the last first reached by `4cd70`); a slot is hit after about 16 384 tries on average.
const TAG_TRIES: u32 = 314_737;

/// The channel on which releases of `key` are announced: Redisson's name for it.
pub(crate) fn channel(key: &str) -> String {
    redisson_name(CHANNEL_PREFIX, key)
}

/// The fencing counter of `key`, in the key's slot.
pub(crate) fn fence_key(key: &str) -> Result<String> {
    aux_key(FENCE_PREFIX, key)
}

/// Redisson's `prefixName(prefix, name)`: `<prefix>:<key>` if the key contains `{` anywhere,
/// else `<prefix>:{<key>}`. Not necessarily in the key's cluster slot.
pub(crate) fn redisson_name(prefix: &str, key: &str) -> String {
    if key.contains('{') {
        format!("{prefix}:{key}")
    } else {
        format!("{prefix}:{{{key}}}")
    }
}

/// A name for a companion key only this library uses, in the key's cluster slot:
/// Redisson's form if it lands there, else the braced form `<prefix>:{<key>}`, else (a key
/// whose braces defeat both, such as `a{}b`) `<prefix>:{<n>}:<key>` with the smallest
/// hexadecimal `n` whose slot is the key's (the name's first braces are then its hash tag).
pub(crate) fn aux_key(prefix: &str, key: &str) -> Result<String> {
    let slot = hash_slot(key.as_bytes());
    let redisson = redisson_name(prefix, key);
    if hash_slot(redisson.as_bytes()) == slot {
        return Ok(redisson);
    }
    let braced = format!("{prefix}:{{{key}}}");
    if hash_slot(braced.as_bytes()) == slot {
        return Ok(braced);
    }
    if let Some(tag) = tag_of_slot(slot) {
        let name = format!("{prefix}:{{{tag}}}:{key}");
        log::debug!("key {key:?}: companion {name:?} (its braces form no hash tag)");
        return Ok(name);
    }
    let reason = format!(
        "no name for its companion {prefix:?} lands in the key's cluster slot; use a key with a \
         non-empty {{tag}} or no braces"
    );
    Err(LockError::config(key, reason))
}

/// The smallest hexadecimal number whose text hashes to `slot` (as a hash tag): one exists
/// below [`TAG_TRIES`] for every slot.
fn tag_of_slot(slot: u16) -> Option<String> {
    (0..TAG_TRIES)
        .map(|n| format!("{n:x}"))
        .find(|tag| hash_slot(tag.as_bytes()) == slot)
}

/// The part of a key Redis Cluster hashes: the first `{…}` if non-empty, else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    let rest = key
        .iter()
        .position(|&b| b == b'{')
        .map(|open| &key[open + 1..]);
    let tag = rest.and_then(|r| r.iter().position(|&b| b == b'}').map(|close| &r[..close]));
    tag.filter(|tag| !tag.is_empty()).unwrap_or(key)
}

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag, modulo 16384, computed by
/// the `crc16` crate that redis-rs uses for its own routing (redis-rs's `Slot::for_key` does
/// not expose the number, which the watchdog sorts its batches by).
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        // CRC16/XMODEM("123456789") = 0x31C3, below 16384.
        assert_eq!(hash_slot(b"123456789"), 0x31C3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn slots_match_redis_rs_routing() {
        use redis::cluster_routing::{Route, SlotAddr};
        for key in [
            "",
            "a",
            "foo",
            "{user1000}.following",
            "a{b",
            "a{}b",
            "}a{b",
            "x{}{y}",
            "{}",
            "orders:42",
            "dlock_fence:{orders:42}",
            "\u{e9}t\u{e9}",
        ] {
            assert_eq!(
                Route::new(hash_slot(key.as_bytes()), SlotAddr::Master),
                Route::with_key(key, SlotAddr::Master),
                "{key:?}"
            );
        }
    }

    #[test]
    fn channels_follow_redisson_exactly() {
        // Redisson's prefixName: braces anywhere in the name keep it as it is.
        for (key, want) in [
            ("orders:42", "redisson_lock__channel:{orders:42}"),
            ("{tag}x", "redisson_lock__channel:{tag}x"),
            ("a{b", "redisson_lock__channel:a{b"),
            ("a{}b", "redisson_lock__channel:a{}b"),
            ("x}y", "redisson_lock__channel:{x}y}"),
        ] {
            assert_eq!(channel(key), want, "{key}");
        }
    }

    #[test]
    fn library_names_share_the_slot() {
        assert_eq!(
            fence_key("orders:42").expect("plain key"),
            "dlock_fence:{orders:42}"
        );
        assert_eq!(
            fence_key("{user:1}:lock").expect("tagged key"),
            "dlock_fence:{user:1}:lock"
        );
        assert_eq!(fence_key("a{b").expect("open brace"), "dlock_fence:{a{b}");
        let odd = fence_key("a{}b").expect("empty tag");
        assert!(
            odd.starts_with("dlock_fence:{") && odd.ends_with("}:a{}b"),
            "{odd}"
        );
        for key in [
            "a",
            "orders:42",
            "{user:1}:lock",
            "x{y}z",
            "a{b",
            "a{}b",
            "}a{b",
            "{}",
            "x{}{y}",
            "}{",
            "a}b",
            "",
        ] {
            let aux = fence_key(key).expect("same slot");
            assert_eq!(
                hash_slot(aux.as_bytes()),
                hash_slot(key.as_bytes()),
                "{key} -> {aux}"
            );
        }
    }

    /// Every slot has a hexadecimal tag below `TAG_TRIES`, and the bound is tight: the
    /// search for a companion name is bounded and never fails.
    #[test]
    fn every_slot_has_a_hex_tag_below_the_bound() {
        let mut first = vec![None; 16384];
        for n in 0..TAG_TRIES {
            let slot = usize::from(hash_slot(format!("{n:x}").as_bytes()));
            first[slot].get_or_insert(n);
        }
        assert!(first.iter().all(Option::is_some));
        assert_eq!(first.iter().flatten().max(), Some(&(TAG_TRIES - 1)));
        assert_eq!(
            tag_of_slot(hash_slot(b"a{}b")).map(|t| hash_slot(t.as_bytes())),
            Some(hash_slot(b"a{}b"))
        );
    }
}
