//! The server-side queries every lock answers, whoever holds it: [`LockState`], and the
//! one-round-trip reads and deletes behind [`LockAdmin::state`](crate::LockAdmin::state)
//! and [`LockAdmin::force_unlock`](crate::LockAdmin::force_unlock).

use std::time::Duration;

use redis::Value;

use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::lock::LockState;

/// One `lua/lock_state.lua` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyState {
    /// The Redis type, `none` when the key is absent.
    pub(crate) kind: String,
    /// `PTTL` as a duration; `None` without expiry (or when absent).
    pub(crate) pttl: Option<Duration>,
    /// The value or mode asked for, if any.
    pub(crate) detail: Option<Vec<u8>>,
}

impl KeyState {
    /// True when the key does not exist.
    pub(crate) fn is_absent(&self) -> bool {
        self.kind == "none"
    }

    /// Decodes the script's `{type, pttl, detail}`.
    pub(crate) fn decode(key: &str, reply: Value) -> Result<KeyState> {
        let (kind, pttl, detail): (String, i64, Option<Vec<u8>>) =
            redis::from_redis_value_ref(&reply)
                .map_err(|_| LockError::unexpected_reply(key, "the lock state script", &reply))?;
        Ok(KeyState {
            kind,
            pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            detail,
        })
    }

    /// The state of a lock whose key must be of type `want` (`string` or `hash`): absent is
    /// unlocked, any value of that type locked with its PTTL, a key of another type
    /// [`LockError::WrongType`] (its acquires fail the same way).
    pub(crate) fn plain(self, key: &str, want: &str) -> Result<LockState> {
        if self.is_absent() {
            return Ok(LockState::Unlocked);
        }
        if self.kind != want {
            return Err(LockError::WrongType {
                key: key.to_owned(),
            });
        }
        Ok(LockState::Locked { ttl: self.pttl })
    }
}

/// Reads `key` with `lua/lock_state.lua` (one round trip), and besides its type and PTTL
/// `detail`: `"value"`, a string key's value; `"mode"`, a hash's field `mode` (read-write
/// lock); `""`, nothing.
pub(crate) fn read(client: &LockClient, key: &str, detail: &str) -> Result<KeyState> {
    let reply: Value = client.with_conn(key, |con, s| s.lock_state.eval(con, key, detail))?;
    KeyState::decode(key, reply)
}

/// Deletes `key` whoever holds it with `lua/force_unlock.lua` (one round trip), publishing
/// `message` on `channel` if given and a key was deleted, and only when the hash's mode is
/// `mode` if given; then wakes this client's waiters of `lines`. True if a key was deleted.
pub(crate) fn force_delete(
    client: &LockClient,
    key: &str,
    channel: Option<&str>,
    message: &str,
    mode: Option<&str>,
    lines: &[&str],
) -> Result<bool> {
    let deleted: i64 = client.with_conn(key, |con, s| {
        s.force_unlock.eval(
            con,
            key,
            (channel.unwrap_or(""), message, mode.unwrap_or("")),
        )
    })?;
    let deleted = deleted == 1;
    if deleted {
        log::info!("lock {key:?}: force-unlocked (deleted whoever held it)");
        for line in lines {
            client.waiters().notify_release(line);
        }
    } else {
        log::debug!("lock {key:?}: force unlock found nothing to delete");
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_state_script() {
        let reply = Value::Array(vec![
            Value::SimpleString("string".into()),
            Value::Int(1500),
            Value::BulkString(b"v".to_vec()),
        ]);
        let s = KeyState::decode("k", reply).expect("decoded");
        assert_eq!(s.kind, "string");
        assert_eq!(s.pttl, Some(Duration::from_millis(1500)));
        assert_eq!(s.detail.as_deref(), Some(&b"v"[..]));
        assert_eq!(
            s.clone().plain("k", "string").expect("state"),
            LockState::Locked {
                ttl: Some(Duration::from_millis(1500))
            }
        );
        assert!(matches!(
            s.plain("k", "hash"),
            Err(LockError::WrongType { .. })
        ));
        let none = Value::Array(vec![
            Value::BulkString(b"none".to_vec()),
            Value::Int(-2),
            Value::Nil,
        ]);
        let s = KeyState::decode("k", none).expect("decoded");
        assert!(s.is_absent());
        assert_eq!(s.pttl, None);
        assert_eq!(s.plain("k", "hash").expect("state"), LockState::Unlocked);
        assert!(KeyState::decode("k", Value::Int(1)).is_err());
        assert_eq!(LockState::Unlocked.ttl(), None);
        assert!(!LockState::Unlocked.is_locked());
        assert!(LockState::Locked { ttl: None }.is_locked());
    }
}
