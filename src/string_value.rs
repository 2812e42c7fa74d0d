//! What Token and Classic locks share: the lock is one string value at the key, and the owner
//! is whoever wrote that exact value. Release is compare-and-delete (`lua/unlock.lua`), the
//! check is a `GET` compared with our value, and an extend either renews the lease or reports
//! the lock lost.

use std::time::{Duration, Instant};

use crate::client::LockClient;
use crate::error::{LockError, Result};
use crate::hold;
use crate::keys;
use crate::lock::{self, Lease};

/// Bytes a command needs beyond its key and value: the command name, short arguments and
/// decimal numbers. Sizing the buffer once avoids the growth steps of an empty `Cmd`.
const CMD_OVERHEAD: usize = 48;

/// `SET key value NX PX ttl_ms`: the one-round-trip acquire of Token (and of Classic with
/// `key_ttl`). Replies `OK` when set, nil when the key exists.
pub(crate) fn set_nx_px(key: &str, value: &[u8], ttl_ms: u64) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(6, CMD_OVERHEAD + key.len() + value.len());
    cmd.arg("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms);
    cmd
}

/// `SETNX key value`: the legacy Classic acquire. Replies 1 when set.
pub(crate) fn setnx(key: &str, value: &[u8]) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3, CMD_OVERHEAD + key.len() + value.len());
    cmd.arg("SETNX").arg(key).arg(value);
    cmd
}

/// Deletes the key if it still holds our value: `Ok(true)` if it did. With a `channel`
/// (Token) the release is published there in the same script, for waiters in other processes.
pub(crate) fn release(
    client: &LockClient,
    key: &str,
    channel: Option<&str>,
    lease: &Lease,
) -> Result<bool> {
    lease.stop_renewal();
    let reply: i64 = client.with_conn(key, |con, s| match channel {
        None => s.unlock.eval(con, key, lease.value()),
        Some(ch) => s
            .unlock
            .eval(con, key, (lease.value(), keys::UNLOCK_MESSAGE, ch)),
    })?;
    if let Some(ch) = channel {
        hold::after_publish(client, key, ch, reply - 1);
    }
    Ok(lock::note_release(client.waiters(), key, reply >= 1))
}

/// True if the key holds our value and the lease has not run out locally.
pub(crate) fn is_held(client: &LockClient, key: &str, lease: &Lease) -> Result<bool> {
    let current: Option<Vec<u8>> =
        client.with_conn(key, |con, _| redis::cmd("GET").arg(key).query(con))?;
    Ok(!lease.is_expired() && current.as_deref() == Some(lease.value()))
}

/// Applies the answer of an extend script: renews the lease (with the new value, if the
/// strategy wrote one) when `done`, else reports the lock lost.
pub(crate) fn extended(
    key: &str,
    done: bool,
    lease: &mut Lease,
    new_value: Option<&[u8]>,
    start: Instant,
    ttl: Duration,
) -> Result<()> {
    if done {
        lease.renew(new_value, start, ttl);
        log::debug!("lock {key:?}: extended by {ttl:?}");
        Ok(())
    } else {
        log::warn!("lock {key:?}: lost, extend found another owner or none");
        Err(LockError::Lost {
            key: key.to_owned(),
        })
    }
}
