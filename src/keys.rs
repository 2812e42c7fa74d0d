//! Names of the auxiliary keys and channels of a lock, all in the lock key's hash slot.
//!
//! A lock may need more than its key: a pub/sub channel its releases are announced on, and a
//! fencing counter. In a Redis Cluster a script may only touch keys of one slot, so every name
//! is derived from the lock key the way Redisson derives its own (`prefixName`):
//! `<prefix>:{<key>}`, or `<prefix>:<key>` when the key already has a hash tag, which then
//! decides the slot of both. The channel is Redisson's, so Java Redisson waiters on the same
//! key are woken by our releases and we by theirs.

use crate::error::{LockError, Result};

/// Prefix of the channel on which releases are published (Redisson's `RedissonLock`).
pub(crate) const CHANNEL_PREFIX: &str = "redisson_lock__channel";
/// Prefix of the fencing counter.
pub(crate) const FENCE_PREFIX: &str = "dlock_fence";
/// The message published on a release (Redisson's `UNLOCK_MESSAGE`).
pub(crate) const UNLOCK_MESSAGE: &str = "0";

/// The channel on which releases of `key` are announced.
pub(crate) fn channel(key: &str) -> Result<String> {
    aux_key(CHANNEL_PREFIX, key)
}

/// The fencing counter of `key`.
pub(crate) fn fence_key(key: &str) -> Result<String> {
    aux_key(FENCE_PREFIX, key)
}

/// `<prefix>:{<key>}`, or `<prefix>:<key>` if the key contains `{` (Redisson's rule), checked
/// to land in the key's slot; when Redisson's form would not (`a{b`: no closing brace), the
/// braced form is used. A key whose braces defeat both (`a{}b`) is refused.
pub(crate) fn aux_key(prefix: &str, key: &str) -> Result<String> {
    let slot = hash_slot(key.as_bytes());
    let braced = format!("{prefix}:{{{key}}}");
    if !key.contains('{') {
        return Ok(braced);
    }
    let plain = format!("{prefix}:{key}");
    if hash_slot(plain.as_bytes()) == slot {
        return Ok(plain);
    }
    if hash_slot(braced.as_bytes()) != slot {
        let aux = plain;
        return Err(LockError::invalid(
            key,
            format!(
                "the key's braces do not form a Redis hash tag, so its companion {aux:?} would \
                 be in another cluster slot; use a key with a non-empty {{tag}} or no braces"
            ),
        ));
    }
    Ok(braced)
}

/// The part of a key Redis Cluster hashes: the first `{…}` if non-empty, else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The Redis Cluster slot of `key` (CRC16/XMODEM of its hash tag, modulo 16384).
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in hash_tag(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
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

    #[test]
    fn aux_names_follow_redisson_and_share_the_slot() {
        assert_eq!(
            channel("orders:42").expect("plain key"),
            "redisson_lock__channel:{orders:42}"
        );
        assert_eq!(
            fence_key("{user:1}:lock").expect("tagged key"),
            "dlock_fence:{user:1}:lock"
        );
        for key in ["a", "orders:42", "{user:1}:lock", "x{y}z", "a{b"] {
            let aux = fence_key(key).expect("same slot");
            assert_eq!(
                hash_slot(aux.as_bytes()),
                hash_slot(key.as_bytes()),
                "{key}"
            );
        }
        assert!(channel("a{}b").is_err());
    }
}
