//! The least-privilege check of [`LockBuilder::check_access`](crate::LockBuilder::check_access):
//! asks the server whether the client's ACL user may send every command a lock will send, on
//! the lock's own keys and channel, before the first acquire (`lua/acl_check.lua`, one round
//! trip, nothing run). Without it, a user who may `SET` but not run the release script (or
//! not `PUBLISH` on the lock's channel) acquires fine and then cannot release: the lock stays
//! for its whole lifetime.

use crate::client::native::Command;
use crate::client::LockClient;
use crate::error::{Context, LockError, Result};

/// One command a lock sends, with its arguments (keys, channels, placeholder values).
pub(crate) type Check = (&'static str, Vec<String>);

fn check(name: &'static str, args: &[&str]) -> Check {
    (name, args.iter().map(|a| (*a).to_owned()).collect())
}

/// What a waiter's subscriber connection sends.
fn subscriber(channel: &str) -> Vec<Check> {
    vec![
        check("subscribe", &[channel]),
        check("unsubscribe", &[channel]),
        check("ping", &[]),
    ]
}

/// The commands of a Token lock (see `token.rs`): acquire (`SET … NX PX … GET`, or by script
/// `SET` + `PTTL` and `INCR` of the fencing counter), release (`GET`, `DEL`, `PUBLISH`),
/// extend and renewal (`GET`, `PEXPIRE`), the check (`GET`), the type check of a wait that
/// gives up (`TYPE`), and the subscriber's commands when waiters are woken by pub/sub.
///
/// Where the client uses the native commands (see [`crate::client::native`]), `DELIFEQ` and
/// `SET … IFEQ … PX` are checked too.
pub(crate) fn token(
    client: &LockClient,
    key: &str,
    channel: &str,
    fence: Option<&str>,
    pubsub: bool,
) -> Vec<Check> {
    let mut c = native(client, key);
    c.extend([
        check("set", &[key, "v", "NX", "PX", "1000", "GET"]),
        check("get", &[key]),
        check("del", &[key]),
        check("pexpire", &[key, "1000"]),
        check("pttl", &[key]),
        check("type", &[key]),
        check("publish", &[channel, "0"]),
    ]);
    if let Some(f) = fence {
        c.push(check("incr", &[f]));
    }
    if pubsub {
        c.extend(subscriber(channel));
    }
    c
}

/// The native commands the client sends for a string-value lock on `key` (none on a server
/// without them).
fn native(client: &LockClient, key: &str) -> Vec<Check> {
    let mut c = Vec::new();
    if client.native().has(Command::DelIfEq) {
        c.push(check("delifeq", &[key, "v"]));
    }
    if client.native().has(Command::SetIfEq) {
        c.push(check("set", &[key, "v", "IFEQ", "v", "PX", "1000"]));
    }
    c
}

/// The commands of a Classic lock: `SETNX` (or `SET NX PX` with `key_ttl`), `GET`, `GETSET`
/// or the compare-and-set script's `SET`, `PEXPIRE`, and the release's `GET` + `DEL`.
pub(crate) fn classic(client: &LockClient, key: &str) -> Vec<Check> {
    let mut c = native(client, key);
    c.extend([
        check("setnx", &[key, "v"]),
        check("set", &[key, "v", "NX", "PX", "1000"]),
        check("get", &[key]),
        check("getset", &[key, "v"]),
        check("pexpire", &[key, "1000"]),
        check("del", &[key]),
    ]);
    c
}

/// The commands of a reentrant lock (Redisson's `RLock` scripts and the library's own).
pub(crate) fn reentrant(key: &str, channel: &str, fence: Option<&str>, pubsub: bool) -> Vec<Check> {
    let mut c = vec![
        check("exists", &[key]),
        check("hexists", &[key, "owner"]),
        check("hincrby", &[key, "owner", "1"]),
        check("hget", &[key, "owner"]),
        check("hdel", &[key, "owner"]),
        check("hlen", &[key]),
        check("pexpire", &[key, "1000"]),
        check("pttl", &[key]),
        check("del", &[key]),
        check("publish", &[channel, "0"]),
    ];
    if let Some(f) = fence {
        c.push(check("incr", &[f]));
        // A re-entry reads the counter's current value.
        c.push(check("get", &[f]));
    }
    if pubsub {
        c.extend(subscriber(channel));
    }
    c
}

/// The keys and channels of a fair lock, for [`fair`].
pub(crate) struct FairNames<'a> {
    pub(crate) key: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) deadlines: &'a str,
    pub(crate) fence: Option<&'a str>,
    /// This client's grant channel (`dlock_fair_ch:<our client id>`): subscribed to, and
    /// published on when a release grants the lock to another thread of this client.
    pub(crate) own_channel: &'a str,
    /// Another client's grant channel (`dlock_fair_ch:<some other id>`): a release publishes
    /// its grant on the grantee's channel, whoever that is, so the user needs the whole
    /// pattern `dlock_fair_ch:*`. One representative name is checked.
    pub(crate) other_channel: &'a str,
}

/// The commands of a fair lock (see `fair.rs`, `lua/fair_acquire.lua`, `lua/fair_release.lua`,
/// `lua/fair_live_head.lua`): the plain acquire (`SET … NX PX`), the scripts themselves
/// (`EVALSHA`, and `EVAL` after a `NOSCRIPT`) on their keys, and what the scripts run: `GET`,
/// `EXISTS`, `SET … PX`, `TIME`, `ZADD`, `ZREM`, `ZPOPMIN`, `ZRANGEBYSCORE`, `ZSCORE`, `ZRANK`,
/// `PTTL`, `PEXPIRE`, `DEL`, `PUBLISH` of grants (on another client's channel and on ours),
/// `INCR` and `GET` of the fencing counter; extend and renewal (`GET`, `PEXPIRE`); the
/// clean-up of a lost reply or failed release (`GET`, `DEL`); and the subscriber's commands on
/// this client's own grant channel.
pub(crate) fn fair(n: &FairNames<'_>) -> Vec<Check> {
    let (key, q, d) = (n.key, n.queue, n.deadlines);
    let mut script_keys = vec![key, q, d];
    if let Some(f) = n.fence {
        script_keys.push(f);
    }
    let numkeys = script_keys.len().to_string();
    let script = |name: &'static str, body: &str| {
        let mut args = vec![body, numkeys.as_str()];
        args.extend_from_slice(&script_keys);
        args.push("v");
        check(name, &args)
    };
    let grant = "dlock-grant:v:0:0:0";
    let mut c = vec![
        check("set", &[key, "v", "NX", "PX", "1000"]),
        script("evalsha", "0000000000000000000000000000000000000000"),
        script("eval", "return 0"),
        check("get", &[key]),
        check("exists", &[q]),
        check("set", &[key, "v", "px", "1000"]),
        check("time", &[]),
        check("zadd", &[q, "NX", "1", "v"]),
        check("zadd", &[d, "1", "v"]),
        check("zrem", &[q, "v"]),
        check("zrem", &[d, "v"]),
        check("zpopmin", &[q]),
        check("zrangebyscore", &[d, "-inf", "1", "limit", "0", "100"]),
        check("zscore", &[d, "v"]),
        check("zrank", &[q, "v"]),
        check("pttl", &[key]),
        check("pttl", &[q]),
        check("pexpire", &[key, "1000"]),
        check("pexpire", &[q, "1000"]),
        check("pexpire", &[d, "1000"]),
        check("del", &[key]),
        check("publish", &[n.other_channel, grant]),
        check("publish", &[n.own_channel, grant]),
    ];
    if let Some(f) = n.fence {
        c.push(check("incr", &[f]));
        c.push(check("get", &[f]));
    }
    c.extend(subscriber(n.own_channel));
    c
}

/// Sends the check for the lock on `key` (`what` names its kind): `Ok` when everything is
/// allowed, else [`LockError::Setup`] naming the lock, each denied command with its key or
/// channel, and NOPERM.
pub(crate) fn verify(client: &LockClient, key: &str, what: &str, checks: &[Check]) -> Result<()> {
    if !client.native().scripting() {
        return verify_by_probes(client, key, what, checks);
    }
    let mut args: Vec<String> = Vec::new();
    for (name, a) in checks {
        args.push((*name).to_owned());
        args.push(a.len().to_string());
        args.extend(a.iter().cloned());
    }
    let denied: Vec<String> =
        client.with_conn(key, |con, s| s.acl_check.eval_keys(con, &[], &args))?;
    denied_error(key, what, &denied)
}

/// The check of a client whose user may not run scripts (so `lua/acl_check.lua` cannot ask
/// for it), on a server where a Token lock without fencing needs none: each command the lock
/// sends on its connections is sent once, in one pipeline, in a form that changes nothing,
/// and a `NOPERM` answer marks it denied. The server checks the ACL before it looks at the
/// options, so an acquire is sent as `SET key v NX XX …` (refused as a syntax error when
/// allowed); `DELIFEQ` and `SET … IFEQ` compare with a random value no lock writes; the
/// `PUBLISH` of a release is sent as it is (its waiters wake, find the lock as it was, and
/// wait on). The subscriber's `SUBSCRIBE` cannot be sent on a pooled connection: it is not
/// checked (a waiter that cannot subscribe polls).
fn verify_by_probes(client: &LockClient, key: &str, what: &str, checks: &[Check]) -> Result<()> {
    let probe_value = hex::encode(crate::strategy::token::new_token());
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut sent: Vec<String> = Vec::new();
    for (name, args) in checks {
        if matches!(*name, "subscribe" | "unsubscribe" | "ping") {
            continue;
        }
        let cmd = pipe.cmd(name);
        match *name {
            "set" if args.iter().any(|a| a == "NX") => {
                // SET key v NX XX PX 1000 [GET]: checked, then refused by its syntax.
                cmd.arg(&args[0]).arg(&probe_value).arg("NX").arg("XX");
                cmd.arg(&args[2..]);
            }
            "set" | "delifeq" => {
                let args: Vec<&str> = args
                    .iter()
                    .map(|a| if a == "v" { probe_value.as_str() } else { a })
                    .collect();
                cmd.arg(&args);
            }
            _ => {
                cmd.arg(args);
            }
        }
        sent.push(format!("{} {}", name.to_ascii_uppercase(), args.join(" ")));
    }
    let replies: Vec<redis::Value> = client.with_conn(key, |con, _| pipe.query(con))?;
    let denied: Vec<String> = sent
        .into_iter()
        .zip(replies)
        .filter_map(|(shown, reply)| match reply {
            redis::Value::ServerError(e) => {
                let e = redis::RedisError::from(e);
                crate::error::is_access_denied(&e).then(|| format!("{shown} ({e})"))
            }
            _ => None,
        })
        .collect();
    denied_error(key, what, &denied)
}

/// `Ok` when nothing was denied, else the [`LockError::Setup`] that lists what was.
fn denied_error(key: &str, what: &str, denied: &[String]) -> Result<()> {
    if denied.is_empty() {
        return Ok(());
    }
    Err(LockError::Setup {
        source: Box::new(Context::new(
            format!(
                "the {what} lock on {key:?} needs commands this client's user may not send \
                 (NOPERM): {}; see the ACL rules in docs/production.md",
                denied.join("; ")
            ),
            None,
        )),
    })
}
