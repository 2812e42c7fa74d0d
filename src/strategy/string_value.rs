//! What Token and Classic locks share: the lock is one string value at the key, and the owner
//! is whoever wrote that exact value. Release is compare-and-delete (`lua/unlock.lua`), the
//! check is a `GET` compared with our value, and an extend either renews the lease or reports
//! the lock lost.

use std::time::Instant;

use std::cell::Cell;

use redis::{ConnectionLike, RedisResult, Value};

use crate::client::cleanup::{Cause, Cleanup};
use crate::client::native::{self, Command};
use crate::client::sentinel_watch;
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::lease::Lease;
use crate::scripts::Scripts;
use crate::stats::Kind;
use crate::strategy::hold;

/// What a release publishes in the same step as its delete: `message` on each of `channels`,
/// in order (Token: `0` on Redisson's channel; Spring: the key on the registry's two channels).
/// The first channel is the one this lock's own waiters wait on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Notice<'a> {
    pub(crate) message: &'a [u8],
    pub(crate) channels: &'a [String],
}

impl<'a> Notice<'a> {
    /// The channel this lock's own waiters wait on.
    fn first(&self) -> Option<&'a str> {
        self.channels.first().map(String::as_str)
    }
}

/// Bytes a command needs beyond its key and value: the command name, short arguments and
/// decimal numbers. Sizing the buffer once avoids the growth steps of an empty `Cmd`.
const CMD_OVERHEAD: usize = 48;

/// A command (or a pipeline of commands) in RESP, packed once but for one argument of its first
/// command, a lock's value: the bytes before it and after it. A lock sends the same commands
/// with a new value each time; this spares each send building a `redis::Cmd` (three buffers)
/// and packing it. The bytes are those redis-rs packs (see the tests).
#[derive(Debug, Clone)]
pub(crate) struct Packed {
    head: Vec<u8>,
    tail: Vec<u8>,
    /// Commands in it.
    commands: usize,
}

impl Packed {
    /// `before…, value, after…` as one command, followed by the commands `then`.
    pub(crate) fn new(before: &[&[u8]], after: &[&[u8]], then: &[redis::Cmd]) -> Self {
        let mut head = Vec::new();
        head.push(b'*');
        push_decimal(&mut head, before.len() + 1 + after.len());
        head.extend_from_slice(b"\r\n");
        for arg in before {
            push_bulk(&mut head, arg);
        }
        let mut tail = Vec::new();
        for arg in after {
            push_bulk(&mut tail, arg);
        }
        for cmd in then {
            tail.extend_from_slice(&cmd.get_packed_command());
        }
        Packed {
            head,
            tail,
            commands: 1 + then.len(),
        }
    }

    /// The bytes to send for `value`.
    pub(crate) fn with(&self, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.head.len() + value.len() + 24 + self.tail.len());
        out.extend_from_slice(&self.head);
        push_bulk(&mut out, value);
        out.extend_from_slice(&self.tail);
        out
    }

    /// Sends the single command with `value`: the reply as `Cmd::query::<Value>` gives it.
    pub(crate) fn query(&self, con: &mut dyn ConnectionLike, value: &[u8]) -> RedisResult<Value> {
        debug_assert_eq!(self.commands, 1);
        con.req_packed_command(&self.with(value))
            .and_then(Value::extract_error)
    }

    /// Sends the pipeline with `value`: its integer replies, as `pipeline().query::<Vec<i64>>`
    /// gives them; any other reply (an error) is read by redis-rs's pipeline (`pipeline()`,
    /// the same commands), as if it had sent them.
    fn query_ints(
        &self,
        con: &mut dyn ConnectionLike,
        value: &[u8],
        pipeline: impl FnOnce() -> redis::Pipeline,
    ) -> RedisResult<Vec<i64>> {
        let replies = con.req_packed_commands(&self.with(value), 0, self.commands)?;
        let ints: Option<Vec<i64>> = replies
            .iter()
            .map(|r| match r {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect();
        match ints {
            Some(ints) => Ok(ints),
            None => pipeline().query(&mut Replies(Some(replies))),
        }
    }
}

/// Replies already read, handed to redis-rs's pipeline as its connection's answer.
struct Replies(Option<Vec<Value>>);

impl ConnectionLike for Replies {
    fn req_packed_command(&mut self, _cmd: &[u8]) -> RedisResult<Value> {
        Err(unanswered())
    }

    fn req_packed_commands(
        &mut self,
        _cmd: &[u8],
        _offset: usize,
        _count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.0.take().ok_or_else(unanswered)
    }

    fn get_db(&self) -> i64 {
        0
    }

    fn check_connection(&mut self) -> bool {
        true
    }

    fn is_open(&self) -> bool {
        true
    }
}

fn unanswered() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Client, "no replies to read"))
}

/// `$<len>\r\n<arg>\r\n`.
fn push_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    out.push(b'$');
    push_decimal(out, arg.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The owner-checked, published release of one lock ([`release`]), packed but for the value:
/// `DELIFEQ key value` with the `PUBLISH`es of its notice, and the `EVALSHA` of
/// `lua/unlock.lua` with the same notice.
#[derive(Debug, Clone)]
pub(crate) struct PackedRelease {
    native: Packed,
    script: Packed,
}

impl PackedRelease {
    pub(crate) fn new(scripts: &Scripts, key: &str, notice: Notice<'_>) -> Self {
        let publishes: Vec<redis::Cmd> = notice
            .channels
            .iter()
            .map(|ch| {
                let mut cmd = redis::cmd("PUBLISH");
                cmd.arg(ch).arg(notice.message);
                cmd
            })
            .collect();
        let mut after: Vec<&[u8]> = vec![notice.message];
        after.extend(notice.channels.iter().map(|ch| ch.as_bytes()));
        PackedRelease {
            native: Packed::new(&[b"DELIFEQ", key.as_bytes()], &[], &publishes),
            script: Packed::new(
                &[
                    b"EVALSHA",
                    scripts.unlock.sha().as_bytes(),
                    b"1",
                    key.as_bytes(),
                ],
                &after,
                &[],
            ),
        }
    }
}

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

/// The owner-checked delete of `value` at `key` (`lua/unlock.lua`), published as `notice`
/// says (Token, Spring): the clean-up of a release that failed or was lost, or of an acquire
/// whose reply was lost.
pub(crate) fn delete_cleanup(key: &str, value: &[u8], notice: Option<Notice<'_>>) -> Cleanup {
    let mut args = vec![value.to_vec()];
    if let Some(n) = notice.filter(|n| !n.channels.is_empty()) {
        args.push(n.message.to_vec());
        args.extend(n.channels.iter().map(|ch| ch.as_bytes().to_vec()));
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
    notice: Option<Notice<'_>>,
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
                delete_cleanup(key, value, notice),
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

/// Deletes the key if it still holds our value: `Ok(true)` if it did. With a `notice` (Token,
/// Spring) the release is published as it says in the same step, for waiters in other
/// processes.
///
/// `sweep`: the prefix of every value this client writes at the key (Token), for the replay
/// after a Sentinel switch; `None` when values carry no owner (Classic).
pub(crate) fn release(
    client: &LockClient,
    kind: Kind,
    key: &str,
    notice: Option<Notice<'_>>,
    sweep: Option<&[u8]>,
    packed: Option<&PackedRelease>,
    lease: &Lease,
) -> Result<bool> {
    lease.stop_renewal();
    let generation = client.switch_generation();
    let reply = compare_and_delete(client, key, lease.value(), notice, packed);
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
            delete_cleanup(key, lease.value(), notice),
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
            delete_cleanup(key, lease.value(), notice),
            sweep,
            generation,
            lease.valid_until(),
        );
    }
    if let Some(ch) = notice.and_then(|n| n.first()) {
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

/// Deletes `key` if it holds `value`, publishing the release as `notice` says (Token,
/// Spring): `DELIFEQ` (pipelined with the `PUBLISH`es) where the server has it, else
/// `lua/unlock.lua`. 0 when the key did not hold `value`, else 1 + the subscribers reached.
/// `packed`: the same commands packed for this key and notice (see [`PackedRelease`]).
pub(crate) fn compare_and_delete(
    client: &LockClient,
    key: &str,
    value: &[u8],
    notice: Option<Notice<'_>>,
    packed: Option<&PackedRelease>,
) -> Result<i64> {
    let notice = notice.filter(|n| !n.channels.is_empty());
    let packed = packed.filter(|_| notice.is_some());
    // In a cluster only the single command: redis-rs does not follow a slot's redirection
    // (a migration's ASK or MOVED) inside a pipeline, so the publishing release keeps the script.
    let native_here = !client.is_cluster() || notice.is_none();
    client.with_conn(key, |con, s| {
        if native_here && client.native().has(Command::DelIfEq) {
            match native_release(con, key, value, notice, packed.map(|p| &p.native)) {
                Err(e) if native::is_unsupported(&e) => {
                    client.native().refused(Command::DelIfEq, key, &e)
                }
                other => return other,
            }
        }
        match notice {
            None => s.unlock.eval(con, key, value),
            Some(n) => match (n.channels, packed) {
                ([ch], Some(p)) => s.unlock.eval_packed(
                    con,
                    &p.script.with(value),
                    key,
                    &(value, n.message, ch.as_bytes()),
                ),
                ([ch], None) => s.unlock.eval(con, key, (value, n.message, ch.as_bytes())),
                (channels, _) => {
                    let mut args: Vec<&[u8]> = Vec::with_capacity(2 + channels.len());
                    args.extend([value, n.message]);
                    args.extend(channels.iter().map(|ch| ch.as_bytes()));
                    s.unlock.eval(con, key, args)
                }
            },
        }
    })
}

/// The release by `DELIFEQ key value`, with a `notice` pipelined with the `PUBLISH`es of the
/// release (one round trip): the same answer as `lua/unlock.lua`, 0 when not ours, else 1 + the
/// subscribers reached. Unlike the script, the `PUBLISH`es go out also when the value was not
/// ours: its waiters then wake, find the lock held and wait again.
fn native_release(
    con: &mut Conn,
    key: &str,
    value: &[u8],
    notice: Option<Notice<'_>>,
    packed: Option<&Packed>,
) -> RedisResult<i64> {
    let Some(n) = notice else {
        return native::delifeq(key, value).query(con);
    };
    let pipeline = || {
        let mut pipe = redis::pipe();
        pipe.add_command(native::delifeq(key, value));
        for ch in n.channels {
            pipe.cmd("PUBLISH").arg(ch).arg(n.message);
        }
        pipe
    };
    let replies: Vec<i64> = match packed {
        Some(p) => p.query_ints(con, value, pipeline)?,
        None => pipeline().query(con)?,
    };
    let reached: i64 = replies.iter().skip(1).map(|r| (*r).max(0)).sum();
    Ok(if replies.first() == Some(&1) {
        1 + reached
    } else {
        0
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies given in advance, and the bytes sent.
    struct Canned {
        replies: Vec<Value>,
        sent: Vec<u8>,
    }

    impl ConnectionLike for Canned {
        fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
            self.sent.extend_from_slice(cmd);
            Ok(self.replies.remove(0))
        }

        fn req_packed_commands(
            &mut self,
            cmd: &[u8],
            _offset: usize,
            count: usize,
        ) -> RedisResult<Vec<Value>> {
            self.sent.extend_from_slice(cmd);
            Ok(self.replies.drain(..count).collect())
        }

        fn get_db(&self) -> i64 {
            0
        }

        fn check_connection(&mut self) -> bool {
            true
        }

        fn is_open(&self) -> bool {
            true
        }
    }

    #[test]
    fn packed_commands_are_the_bytes_redis_rs_packs() {
        let key = "orders:42";
        let ttl = 30_000u64.to_string();
        let get = Packed::new(
            &[b"SET", key.as_bytes()],
            &[b"NX", b"PX", ttl.as_bytes(), b"GET"],
            &[],
        );
        for value in [&b"0123456789abcdef0123456789abcdef"[..], b"", b"v"] {
            assert_eq!(
                get.with(value),
                set_nx_px_get(key, value, 30_000).get_packed_command()
            );
        }
        let channels = vec!["ch:a".to_owned(), "ch:bb".to_owned()];
        let notice = Notice {
            message: b"0",
            channels: &channels,
        };
        let scripts = Scripts::new();
        let release = PackedRelease::new(&scripts, key, notice);
        let value = b"0123456789abcdef0123456789abcdef";
        let mut pipe = redis::pipe();
        pipe.add_command(native::delifeq(key, value));
        for ch in &channels {
            pipe.cmd("PUBLISH").arg(ch).arg("0");
        }
        assert_eq!(release.native.with(value), pipe.get_packed_pipeline());
        assert_eq!(release.native.commands, 3);
        let args: Vec<&[u8]> = vec![value, b"0", b"ch:a", b"ch:bb"];
        assert_eq!(
            release.script.with(value),
            scripts.unlock.evalsha(key, &args).get_packed_command()
        );
    }

    #[test]
    fn packed_replies_read_as_redis_rs_reads_them() {
        let packed = Packed::new(&[b"DELIFEQ", b"k"], &[], &[redis::cmd("PING")]);
        let pipeline = || {
            let mut pipe = redis::pipe();
            pipe.cmd("DELIFEQ").arg("k").arg("v").cmd("PING");
            pipe
        };
        let mut con = Canned {
            replies: vec![Value::Int(1), Value::Int(2)],
            sent: Vec::new(),
        };
        assert_eq!(packed.query_ints(&mut con, b"v", pipeline).unwrap(), [1, 2]);
        assert_eq!(con.sent, pipeline().get_packed_pipeline());
        // A server error in a pipeline: redis-rs's own pipeline error.
        let error = || {
            let parsed = redis::parse_redis_value(b"-ERR unknown command 'DELIFEQ'\r\n");
            parsed.expect("an error reply")
        };
        let mut con = Canned {
            replies: vec![error(), Value::Int(0)],
            sent: Vec::new(),
        };
        let ours = packed.query_ints(&mut con, b"v", pipeline).unwrap_err();
        let mut con = Canned {
            replies: vec![error(), Value::Int(0)],
            sent: Vec::new(),
        };
        let theirs = pipeline().query::<Vec<i64>>(&mut con).unwrap_err();
        assert_eq!(ours.to_string(), theirs.to_string());
        assert_eq!(ours.code(), theirs.code());
        // A single command's error reply is an error, as from `Cmd::query`.
        let single = Packed::new(&[b"SET", b"k"], &[b"NX"], &[]);
        let mut con = Canned {
            replies: vec![error()],
            sent: Vec::new(),
        };
        assert!(single.query(&mut con, b"v").is_err());
    }
}
