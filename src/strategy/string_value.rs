//! What Token and Classic locks share: the lock is one string value at the key, and the owner
//! is whoever wrote that exact value. Release is compare-and-delete (`lua/unlock.lua`), the
//! check is a `GET` compared with our value, and an extend either renews the lease or reports
//! the lock lost.

use std::time::Instant;

use std::cell::Cell;

use redis::RedisResult;

use crate::client::cleanup::{Cause, Cleanup};
use crate::client::native::{self, Command};
use crate::client::sentinel_watch;
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::keys;
use crate::lease::Lease;
use crate::scripts::Scripts;
use crate::stats::Kind;
use crate::strategy::hold;

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

/// `SET key value NX PX ttl_ms GET` (Redis 7.0 and later): as [`set_nx_px`], but the reply
/// tells more. Nil when set (the key was absent); the value found when the key exists (not
/// set); a `WRONGTYPE` error when the key holds another type, so a key that can never be
/// locked is reported on the first attempt, not after a whole wait.
pub(crate) fn set_nx_px_get(key: &str, value: &[u8], ttl_ms: u64) -> redis::Cmd {
    let mut cmd = set_nx_px(key, value, ttl_ms);
    cmd.arg("GET");
    cmd
}

/// True for the error a server before 7.0 answers to `SET … NX … GET` (NX with GET is new in
/// 7.0).
pub(crate) fn is_syntax_error(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.to_string().to_ascii_lowercase().contains("syntax")
}

/// `SETNX key value`: the legacy Classic acquire. Replies 1 when set.
pub(crate) fn setnx(key: &str, value: &[u8]) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3, CMD_OVERHEAD + key.len() + value.len());
    cmd.arg("SETNX").arg(key).arg(value);
    cmd
}

/// The owner-checked delete of `value` at `key` (`lua/unlock.lua`), published on `channel`
/// (Token): the clean-up of a release that failed or was lost, or of an acquire whose reply
/// was lost.
pub(crate) fn delete_cleanup(key: &str, value: &[u8], channel: Option<&str>) -> Cleanup {
    let mut args = vec![value.to_vec()];
    if let Some(ch) = channel {
        args.push(keys::UNLOCK_MESSAGE.as_bytes().to_vec());
        args.push(ch.as_bytes().to_vec());
    }
    Cleanup {
        script: |s| &s.unlock,
        keys: vec![key.to_owned()],
        args,
        value_arg: 0,
        read: crate::client::cleanup::read_delete,
        counted: false,
        what: "the owner-checked delete",
    }
}

/// Runs an acquire that writes `value` at `key` (`f`, on a pooled connection). If it was sent
/// but not answered (a connection error: timeout, reset, paused server), it may still run on
/// the server and leave a lock nobody holds: the client's janitor then deletes `value` in the
/// background, owner-checked, until `until` (when the hold would expire by itself), unless
/// `may_forget` says that finding `value` at the key would not prove the write was ours to
/// delete (a legacy GETSET writes even when it loses).
pub(crate) fn acquire<T>(
    client: &LockClient,
    key: &str,
    value: &[u8],
    channel: Option<&str>,
    until: Instant,
    may_forget: impl Fn() -> bool,
    f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
) -> Result<T> {
    acquire_undone_by(client, key, f, || {
        if may_forget() {
            client.janitor().forget(
                client,
                key,
                value,
                delete_cleanup(key, value, channel),
                Cause::LostAcquireReply,
                until,
            );
        } else {
            log::warn!(
                "lock {key:?}: no reply to a GETSET takeover; if it ran, the key holds our \
                 value until it goes stale (a legacy GETSET writes even when it loses, so the \
                 value is not deleted)"
            );
        }
    })
}

/// Runs an acquire `f` on a pooled connection; if it was sent but not answered (a connection
/// error), or answered but not confirmed by the replicas the client requires, calls `undo`,
/// which hands the janitor what undoes, owner-checked, whatever the acquire may have written
/// (now, or when it runs late).
pub(crate) fn acquire_undone_by<T>(
    client: &LockClient,
    key: &str,
    mut f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
    undo: impl FnOnce(),
) -> Result<T> {
    let sent = Cell::new(false);
    let reply = client.with_conn_confirmed(key, |con, s| {
        sent.set(true);
        f(con, s)
    });
    if let Err(LockError::Connection { .. } | LockError::NotReplicated { .. }) = &reply {
        if sent.get() {
            undo();
        }
    }
    reply
}

/// Deletes the key if it still holds our value: `Ok(true)` if it did. With a `channel`
/// (Token) the release is published there in the same script, for waiters in other processes.
///
/// `sweep`: the prefix of every value this client writes at the key (Token), for the replay
/// after a Sentinel switch; `None` when values carry no owner (Classic).
pub(crate) fn release(
    client: &LockClient,
    kind: Kind,
    key: &str,
    channel: Option<&str>,
    sweep: Option<&[u8]>,
    lease: &Lease,
) -> Result<bool> {
    lease.stop_renewal();
    let generation = client.switch_generation();
    let reply = compare_and_delete(client, key, lease.value(), channel);
    // A release that failed on a connection error or a transient refusal (a failover, a
    // restart) would leave the lock for the rest of its lease: the janitor retries it in the
    // background, owner-checked.
    if reply
        .as_ref()
        .is_err_and(crate::client::cleanup::worth_retrying)
    {
        client.janitor().forget(
            client,
            key,
            lease.value(),
            delete_cleanup(key, lease.value(), channel),
            Cause::FailedRelease,
            lease.valid_until(),
        );
    }
    // Held no longer, whatever the answer: a failed release is the janitor's now.
    client.hold_released(lease.value());
    let reply = reply?;
    if reply >= 1 && client.switches().is_some() {
        // Done again on the new master if a Sentinel switch is announced soon.
        sentinel_watch::remember(
            client,
            key,
            lease.value(),
            delete_cleanup(key, lease.value(), channel),
            sweep,
            generation,
            lease.valid_until(),
        );
    }
    if let Some(ch) = channel {
        hold::after_publish(client, key, ch, reply - 1);
    }
    if reply < 1 {
        client.counters().lost_on_release(kind, lease);
    }
    Ok(crate::client::acquire::note_release(
        client.waiters(),
        key,
        reply >= 1,
    ))
}

/// Deletes `key` if it holds `value`, publishing the release on `channel` (Token): `DELIFEQ`
/// (pipelined with the `PUBLISH`) where the server has it, else `lua/unlock.lua`. 0 when the
/// key did not hold `value`, else 1 + the subscribers reached.
pub(crate) fn compare_and_delete(
    client: &LockClient,
    key: &str,
    value: &[u8],
    channel: Option<&str>,
) -> Result<i64> {
    // In a cluster only the single command: redis-rs does not follow a slot's redirection
    // (a migration's ASK or MOVED) inside a pipeline, so the publishing release keeps the script.
    let native_here = !client.is_cluster() || channel.is_none();
    client.with_conn(key, |con, s| {
        if native_here && client.native().has(Command::DelIfEq) {
            match native_release(con, key, value, channel) {
                Err(e) if native::is_unsupported(&e) => {
                    client.native().refused(Command::DelIfEq, key, &e)
                }
                other => return other,
            }
        }
        match channel {
            None => s.unlock.eval(con, key, value),
            Some(ch) => s.unlock.eval(con, key, (value, keys::UNLOCK_MESSAGE, ch)),
        }
    })
}

/// The release by `DELIFEQ key value`, with a `channel` pipelined with the `PUBLISH` of the
/// release (one round trip): the same answer as `lua/unlock.lua`, 0 when not ours, else 1 + the
/// subscribers reached. Unlike the script, the `PUBLISH` goes out also when the value was not
/// ours: its waiters then wake, find the lock held and wait again.
fn native_release(
    con: &mut Conn,
    key: &str,
    value: &[u8],
    channel: Option<&str>,
) -> RedisResult<i64> {
    let Some(ch) = channel else {
        return native::delifeq(key, value).query(con);
    };
    let mut pipe = redis::pipe();
    pipe.add_command(native::delifeq(key, value))
        .cmd("PUBLISH")
        .arg(ch)
        .arg(keys::UNLOCK_MESSAGE);
    let (deleted, reached): (i64, i64) = pipe.query(con)?;
    Ok(if deleted == 1 { 1 + reached.max(0) } else { 0 })
}

/// The compare-and-extend of a string value: `SET key value IFEQ value PX ttl` where the
/// server has it, else `lua/extend.lua` (compare-and-pexpire). True if extended. A full server
/// (`maxmemory` reached) refuses the `SET`, so that call is sent as the script, which it takes.
pub(crate) fn extend(client: &LockClient, key: &str, value: &[u8], ttl_ms: u64) -> Result<bool> {
    client.with_conn_confirmed(key, |con, s| {
        if client.native().has(Command::SetIfEq) {
            match native::set_ifeq_px(key, value, ttl_ms).query::<Option<redis::Value>>(con) {
                Err(e) if native::is_unsupported(&e) => {
                    client.native().refused(Command::SetIfEq, key, &e)
                }
                Err(e) if native::is_oom(&e) => {}
                Ok(reply) => return Ok(reply.is_some()),
                Err(e) => return Err(e),
            }
        }
        s.extend
            .eval::<i64>(con, key, (value, ttl_ms))
            .map(|n| n == 1)
    })
}

/// True if the key holds our value and the lease has not run out locally.
pub(crate) fn is_held(client: &LockClient, key: &str, lease: &Lease) -> Result<bool> {
    let current: Option<Vec<u8>> =
        client.with_conn(key, |con, _| redis::cmd("GET").arg(key).query(con))?;
    Ok(!lease.is_expired() && current.as_deref() == Some(lease.value()))
}
