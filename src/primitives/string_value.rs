//! What Token and Classic locks share: the lock is one string value at the key, and the owner
//! is whoever wrote that exact value. Release is compare-and-delete (`lua/unlock.lua`), the
//! check is a `GET` compared with our value, and an extend either renews the lease or reports
//! the lock lost.

use std::cell::Cell;
use std::time::Instant;

use redis::{ConnectionLike, RedisResult, Value};

use crate::client::cleanup::{Cleanup, Why};
use crate::client::janitor;
use crate::client::live;
use crate::client::native::{self, Command};
use crate::client::{Conn, LockClient};
use crate::error::{LockError, Result};
use crate::lease::Lease;
use crate::primitives::hold::{self, Notice};
use crate::scripts::Scripts;
use crate::stats::Kind;

/// Bytes a command needs beyond its key and value: the command name, short arguments and
/// decimal numbers. Sizing the buffer once avoids the growth steps of an empty `Cmd`.
const CMD_OVERHEAD: usize = 48;

/// A command (or a pipeline of commands) as redis-rs packs it, kept for values of given
/// lengths: the bytes before, between and after the values. A lock sends the same commands
/// with new values each time; this spares each send building a `redis::Cmd` (three buffers)
/// and packing it. The bytes are redis-rs's own: it packs the commands with placeholder values
/// of the lengths, once more for each value with another placeholder there, and the bytes
/// where two packings differ are that value's place (no RESP is written here). Values of
/// other lengths are sent the usual way.
#[derive(Debug, Clone, Default)]
pub(crate) struct Packed {
    /// The bytes around the values: one part more than values.
    parts: Vec<Vec<u8>>,
    /// The values' lengths.
    lens: Vec<usize>,
    /// The length of the bytes to send.
    size: usize,
    /// Commands in it.
    commands: usize,
}

impl Packed {
    /// `pack(values)`: redis-rs's bytes for the `commands` commands with `values` in them.
    /// None unless each value of its length in `lens` stands in one place of them, in order.
    pub(crate) fn new(
        lens: &[usize],
        commands: usize,
        pack: impl Fn(&[&[u8]]) -> Vec<u8>,
    ) -> Option<Self> {
        let placeholders: Vec<Vec<u8>> = lens.iter().map(|&len| vec![b'a'; len]).collect();
        // Packed with the placeholders, but `other` as the `i`th value.
        let pack_with = |i: usize, other: &[u8]| {
            let mut values: Vec<&[u8]> = placeholders.iter().map(Vec::as_slice).collect();
            if let Some(value) = values.get_mut(i) {
                *value = other;
            }
            pack(&values)
        };
        let base = pack_with(usize::MAX, &[]);
        let (mut parts, mut at) = (Vec::with_capacity(lens.len() + 1), 0);
        for (i, &len) in lens.iter().enumerate() {
            let (start, end) = differing_span(&base, &pack_with(i, &vec![b'b'; len]), len)?;
            if start < at {
                return None;
            }
            parts.push(base[at..start].to_vec());
            at = end;
        }
        parts.push(base[at..].to_vec());
        Some(Packed {
            parts,
            lens: lens.to_vec(),
            size: base.len(),
            commands,
        })
    }

    /// The bytes to send for `values`, if they have the packed lengths.
    pub(crate) fn with(&self, values: &[&[u8]]) -> Option<Vec<u8>> {
        let fits = |(v, len): (&&[u8], &usize)| v.len() == *len;
        if values.len() != self.lens.len() || !values.iter().zip(&self.lens).all(fits) {
            return None;
        }
        let mut out = Vec::with_capacity(self.size);
        out.extend_from_slice(&self.parts[0]);
        for (value, part) in values.iter().zip(&self.parts[1..]) {
            out.extend_from_slice(value);
            out.extend_from_slice(part);
        }
        Some(out)
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
        let Some(bytes) = self.with(&[value]) else {
            return pipeline().query(con);
        };
        let replies = con.req_packed_commands(&bytes, 0, self.commands)?;
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

/// Where `other` differs from `base`, as `start..end`, if it differs over exactly `len` bytes
/// in one place: a placeholder value's place in redis-rs's packing.
fn differing_span(base: &[u8], other: &[u8], len: usize) -> Option<(usize, usize)> {
    if len == 0 || other.len() != base.len() {
        return None;
    }
    let start = base.iter().zip(other).position(|(x, y)| x != y)?;
    let end = base.len()
        - base
            .iter()
            .rev()
            .zip(other.iter().rev())
            .position(|(x, y)| x != y)?;
    (end - start == len).then_some((start, end))
}

/// What a lock packs (a [`Packed`], a [`PackedRelease`]) made at its second send of the
/// command, not when the lock is built: a lock built for one acquire and release, as many
/// callers build them, packs nothing more than before.
#[derive(Debug, Default)]
pub(crate) struct Lazy<T> {
    sent: std::sync::atomic::AtomicBool,
    packed: std::sync::OnceLock<Option<T>>,
}

impl<T> Lazy<T> {
    /// The packed form, made by `make` from the second call on; None on the first call (send
    /// the command the usual way) or when `make` gave none.
    pub(crate) fn get(&self, make: impl FnOnce() -> Option<T>) -> Option<&T> {
        if let Some(packed) = self.packed.get() {
            return packed.as_ref();
        }
        if !self.sent.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.packed.get_or_init(make).as_ref()
    }
}

impl Lazy<Packed> {
    /// The bytes of the single command `cmd(values)`, packed for values of `lens` bytes from
    /// the second send on; None on the first, or for values of other lengths.
    pub(crate) fn bytes(
        &self,
        lens: &[usize],
        values: &[&[u8]],
        cmd: impl Fn(&[&[u8]]) -> redis::Cmd,
    ) -> Option<Vec<u8>> {
        (self.get(|| Packed::new(lens, 1, |v| cmd(v).get_packed_command()))?).with(values)
    }

    /// Sends the single command `cmd(value)`, packed for values of `len` bytes from the second
    /// send on: the reply as `Cmd::query::<Value>` gives it.
    pub(crate) fn query(
        &self,
        con: &mut dyn ConnectionLike,
        len: usize,
        value: &[u8],
        cmd: impl Fn(&[u8]) -> redis::Cmd,
    ) -> RedisResult<Value> {
        match self.bytes(&[len], &[value], |v| cmd(v[0])) {
            Some(bytes) => con
                .req_packed_command(&bytes)
                .and_then(Value::extract_error),
            None => cmd(value).query(con),
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

/// The owner-checked, published release of one lock ([`release`]) for values of one length,
/// packed by redis-rs but for the value (see [`Packed`]): `DELIFEQ key value` with the
/// `PUBLISH`es of its notice, and the `EVALSHA` of `lua/unlock.lua` with the same notice.
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedRelease {
    native: Option<Packed>,
    script: Option<Packed>,
}

impl PackedRelease {
    pub(crate) fn new(scripts: &Scripts, key: &str, notice: Notice<'_>, len: usize) -> Self {
        let native = Packed::new(&[len], 1 + notice.channels.len(), |value| {
            native_pipeline(key, value[0], notice).get_packed_pipeline()
        });
        let script = Packed::new(&[len], 1, |value| {
            let args = (value[0], notice.message, notice.channels);
            scripts.unlock.evalsha(key, &args).get_packed_command()
        });
        PackedRelease { native, script }
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

/// Runs an acquire `f` on a pooled connection; if it was sent but not answered (a connection
/// error), or answered but not confirmed by the replicas the client requires, calls `undo`
/// with that cause. What it gives, the clean-up that undoes the write, owner-checked, is
/// handed to the janitor, to run now, before the call returns, or later until `until` (when
/// the acquire's lifetime would end).
pub(crate) fn acquire_undone_by<T>(
    client: &LockClient,
    key: &str,
    until: Instant,
    mut f: impl FnMut(&mut Conn, &Scripts) -> RedisResult<T>,
    undo: impl FnOnce(Why) -> Option<Cleanup>,
) -> Result<T> {
    let sent = Cell::new(false);
    let reply = client.with_conn_confirmed(key, None, |con, s| {
        sent.set(true);
        f(con, s)
    });
    if let Err(e @ (LockError::Connection { .. } | LockError::NotReplicated { .. })) = &reply {
        let why = Why::acquire(e);
        if let Some(cleanup) = sent.get().then(|| undo(why)).flatten() {
            (client.janitor()).forget(client, cleanup, why, until);
        }
    }
    reply
}

/// Deletes the key if it still holds our value: `Ok(true)` if it did and the hold's lifetime had
/// not passed when the release was called. A hold released after its lifetime is `Ok(false)`
/// whoever holds the key: a Classic value carries no expiry in Redis, so nobody may have taken
/// it over yet, and a Token key may outlive our local reckoning by the acquire's round trip;
/// either way the section overran. With a `notice` (Token, Spring) the release is published
/// as it says in the same step, for waiters in other processes.
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
    // By the local clock, which costs no round trip; read before sending.
    let overran = lease.is_expired();
    lease.stop_renewal();
    let generation = client.switch_generation();
    let value = lease.value();
    let reply = compare_and_delete(client, key, value, notice, packed);
    // A release that failed on a connection error or a transient refusal (a failover, a
    // restart) would leave the lock for the rest of its lease: the janitor retries it in the
    // background, owner-checked.
    let cleanup = || delete_cleanup(key, value, notice);
    let redone = hold::failed_release(&reply).is_some_and(|why| {
        client
            .janitor()
            .forget(client, cleanup(), why, lease.valid_until())
    });
    // Held no longer, whatever the answer: a failed release is the janitor's now.
    client.live().release(live::value(value), None);
    if redone {
        // The in-line retry deleted the key if it was still ours: released.
        return Ok(redone_release(client, kind, key, lease, overran));
    }
    let reply = reply?;
    if reply >= 1 && client.switches().is_some() {
        // Done again on the new master if a Sentinel switch is announced soon.
        let until = lease.valid_until();
        janitor::remember(client, cleanup(), sweep, generation, until);
    }
    if let Some(ch) = notice.and_then(|n| n.channels.first()) {
        hold::after_publish(client, key, ch, reply - 1);
    }
    let deleted = reply >= 1;
    if deleted && overran {
        log::debug!(
            "lock {key:?}: released after its lifetime had passed (nobody had taken it over); \
             reported as lost"
        );
    }
    if !deleted || overran {
        client.counters().lost_on_release(kind, lease);
    }
    // Waiters are woken by what happened to the key; the caller hears of the hold.
    Ok(crate::client::acquire::note_release(client.waiters(), key, deleted) && !overran)
}

/// What a release whose first send failed reports when its in-line retry (owner-checked)
/// was done before the call returned: the hold is given back (or was already gone), so it
/// was released unless its lifetime had passed. Waiters are told as for a release.
pub(crate) fn redone_release(
    client: &LockClient,
    kind: Kind,
    key: &str,
    lease: &Lease,
    overran: bool,
) -> bool {
    if overran {
        client.counters().lost_on_release(kind, lease);
    }
    crate::client::acquire::note_release(client.waiters(), key, true) && !overran
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
            match native_release(
                con,
                key,
                value,
                notice,
                packed.and_then(|p| p.native.as_ref()),
            ) {
                Err(e) if client.native().lacks(con, Command::DelIfEq, key, &e) => {}
                other => return other,
            }
        }
        let packed = packed.and_then(|p| p.script.as_ref()?.with(&[value]));
        match (notice, packed) {
            (None, _) => s.unlock.eval(con, key, value),
            (Some(n), None) => s.unlock.eval(con, key, (value, n.message, n.channels)),
            (Some(n), Some(evalsha)) => {
                let args = (value, n.message, n.channels);
                s.unlock.eval_packed(con, &evalsha, key, &args)
            }
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
    let pipeline = || native_pipeline(key, value, n);
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

/// `DELIFEQ key value` and the `PUBLISH`es of `notice`, in one pipeline.
fn native_pipeline(key: &str, value: &[u8], notice: Notice<'_>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.add_command(native::delifeq(key, value));
    for ch in notice.channels {
        pipe.cmd("PUBLISH").arg(ch).arg(notice.message);
    }
    pipe
}

/// The compare-and-extend of a string value: `SET key value IFEQ value PX ttl` where the
/// server has it, else `lua/extend.lua` (compare-and-pexpire). True if extended. A full server
/// (`maxmemory` reached) refuses the `SET`, so that call is sent as the script, which it takes.
pub(crate) fn extend(client: &LockClient, key: &str, value: &[u8], ttl_ms: u64) -> Result<bool> {
    client.with_conn_confirmed(key, None, |con, s| {
        if client.native().has(Command::SetIfEq) {
            match native::set_ifeq_px(key, value, ttl_ms).query::<Option<redis::Value>>(con) {
                Err(e) if native::is_oom(&e) => {}
                Err(e) if client.native().lacks(con, Command::SetIfEq, key, &e) => {}
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
    fn packed_pairs_are_the_bytes_redis_rs_packs() {
        let cmd = |a: &[u8], b: &[u8]| {
            redis::cmd("EVALSHA")
                .arg("sha")
                .arg(1)
                .arg("k")
                .arg(30_000)
                .arg(a)
                .arg("ch")
                .arg(b)
                .get_packed_command()
        };
        let pair = Packed::new(&[5, 3], 1, |v| cmd(v[0], v[1])).expect("one place for each value");
        for (a, b) in [
            (&b"owner"[..], &b"123"[..]),
            (&[b'\r'; 5], &[b'$'; 3]),
            (&b"ch\r\nk"[..], &b"aaa"[..]),
        ] {
            assert_eq!(pair.with(&[a, b]), Some(cmd(a, b)));
        }
        // Other lengths are not packed (their length prefixes differ).
        assert_eq!(pair.with(&[b"owner2", b"123"]), None);
        assert_eq!(pair.with(&[b"owner", b"1234"]), None);
        // A value in two places has no one place; the second before the first is refused.
        assert!(Packed::new(&[4, 4], 1, |v| redis::cmd("SET")
            .arg(v[0])
            .arg(v[0])
            .arg(v[1])
            .get_packed_command())
        .is_none());
        assert!(Packed::new(&[4, 4], 1, |v| redis::cmd("SET")
            .arg(v[1])
            .arg(v[0])
            .get_packed_command())
        .is_none());
    }

    #[test]
    fn packed_commands_are_the_bytes_redis_rs_packs() {
        let key = "orders:42";
        let get = Packed::new(&[32], 1, |v| {
            set_nx_px_get(key, v[0], 30_000).get_packed_command()
        })
        .expect("one place for the value");
        for value in [
            &b"0123456789abcdef0123456789abcdef"[..],
            &[b'\r'; 32],
            &[b'$'; 32],
        ] {
            assert_eq!(
                get.with(&[value]),
                Some(set_nx_px_get(key, value, 30_000).get_packed_command())
            );
        }
        // Another length is not packed (its length prefix differs).
        assert_eq!(get.with(&[b"short"]), None);
        // A value in two places has no one place.
        assert!(Packed::new(&[8], 1, |v| redis::cmd("SET")
            .arg(v[0])
            .arg(v[0])
            .get_packed_command())
        .is_none());
        let channels = vec!["ch:a".to_owned(), "ch:bb".to_owned()];
        let notice = Notice {
            message: b"0",
            channels: &channels,
        };
        let scripts = Scripts::for_server(None);
        let release = PackedRelease::new(&scripts, key, notice, 32);
        let value = b"0123456789abcdef0123456789abcdef";
        let mut pipe = redis::pipe();
        pipe.add_command(native::delifeq(key, value));
        for ch in &channels {
            pipe.cmd("PUBLISH").arg(ch).arg("0");
        }
        let native = release.native.as_ref().expect("packed");
        assert_eq!(native.with(&[value]), Some(pipe.get_packed_pipeline()));
        assert_eq!(native.commands, 3);
        // The script's form, each channel an argument.
        let args: (&[u8], &[u8], &[u8], &[u8]) = (value, b"0", b"ch:a", b"ch:bb");
        assert_eq!(
            release.script.as_ref().expect("packed").with(&[value]),
            Some(scripts.unlock.evalsha(key, &args).get_packed_command())
        );
        let one = vec!["ch:a".to_owned()];
        let release = PackedRelease::new(
            &scripts,
            key,
            Notice {
                message: b"0",
                channels: &one,
            },
            32,
        );
        let args: (&[u8], &[u8], &[u8]) = (value, b"0", b"ch:a");
        assert_eq!(
            release.script.as_ref().expect("packed").with(&[value]),
            Some(scripts.unlock.evalsha(key, &args).get_packed_command())
        );
    }

    #[test]
    fn a_lazy_packing_is_made_at_the_second_send_and_once() {
        let lazy: Lazy<u32> = Lazy::default();
        let made = std::cell::Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            Some(7)
        };
        assert_eq!(lazy.get(make), None, "the first send packs nothing");
        assert_eq!(lazy.get(make), Some(&7));
        assert_eq!(lazy.get(make), Some(&7));
        assert_eq!(made.get(), 1);
    }

    #[test]
    fn packed_replies_read_as_redis_rs_reads_them() {
        let packed = Packed::new(&[1], 2, |v| {
            let mut pipe = redis::pipe();
            pipe.cmd("DELIFEQ").arg("k").arg(v[0]).cmd("PING");
            pipe.get_packed_pipeline()
        })
        .expect("one place for the value");
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
        let set = |v: &[u8]| {
            let mut cmd = redis::cmd("SET");
            cmd.arg("k").arg(v).arg("NX");
            cmd
        };
        let single: Lazy<Packed> = Lazy::default();
        let mut con = Canned {
            replies: vec![Value::Okay, error()],
            sent: Vec::new(),
        };
        assert!(matches!(
            single.query(&mut con, 1, b"v", set),
            Ok(Value::Okay)
        ));
        assert!(single.packed.get().is_none(), "packed at the second send");
        assert!(single.query(&mut con, 1, b"v", set).is_err());
        assert!(single.packed.get().is_some_and(Option::is_some));
        assert_eq!(con.sent, set(b"v").get_packed_command().repeat(2));
    }
}
