//! The least-privilege check of [`LockBuilder::check_access`](crate::LockBuilder::check_access):
//! asks the server whether the client's ACL user may send every command a lock will send, on
//! the lock's own keys and channel, before the first acquire (`lua/acl_check.lua`, one round
//! trip, nothing run). Without it, a user who may `SET` but not run the release script (or
//! not `PUBLISH` on the lock's channel) acquires fine and then cannot release: the lock stays
//! for its whole lifetime.

use crate::client::native::Command;
use crate::client::LockClient;
use crate::error::{LockError, Result};

/// One command a lock sends, with its arguments (keys, channels, placeholder values).
pub(crate) type Check = (&'static str, Vec<String>);

pub(crate) fn check(name: &'static str, args: &[&str]) -> Check {
    (name, args.iter().map(|a| (*a).to_owned()).collect())
}

/// What a waiter's subscriber connection sends.
pub(crate) fn subscriber(channel: &str) -> Vec<Check> {
    vec![
        check("subscribe", &[channel]),
        check("unsubscribe", &[channel]),
        check("ping", &[]),
    ]
}

/// The native commands the client sends for a string-value lock on `key` (none on a server
/// without them).
pub(crate) fn native(client: &LockClient, key: &str) -> Vec<Check> {
    let mut c = Vec::new();
    if client.native().has(Command::DelIfEq) {
        c.push(check("delifeq", &[key, "v"]));
    }
    if client.native().has(Command::SetIfEq) {
        c.push(check("set", &[key, "v", "IFEQ", "v", "PX", "1000"]));
    }
    c
}

/// Sends the check for the lock on `key` (`what` names its kind: "Token lock", "semaphore"):
/// `Ok` when everything is allowed, else [`LockError::Config`] naming the lock, each denied
/// command with its key or channel, and NOPERM.
pub(crate) fn verify(client: &LockClient, key: &str, what: &str, checks: &[Check]) -> Result<()> {
    if client.native().detected.scripts_denied {
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
/// options, so an acquire is sent as `SET key v NX … XX` (refused as a syntax error when
/// allowed); `DELIFEQ` and `SET … IFEQ` compare with a random value no lock writes; the
/// `PUBLISH` of a release is sent as it is (its waiters wake, find the lock as it was, and
/// wait on). The subscriber's `SUBSCRIBE` cannot be sent on a pooled connection: it is not
/// checked (a waiter that cannot subscribe polls). `DEL` and `PEXPIRE`, which only the scripts
/// send, are not probed: they would change a hold another client has.
fn verify_by_probes(client: &LockClient, key: &str, what: &str, checks: &[Check]) -> Result<()> {
    let probe_value = hex::encode(crate::ids::new_token());
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut sent: Vec<String> = Vec::new();
    for (name, args) in checks {
        // `DEL` and `PEXPIRE` are what the scripts run: a client without scripts releases and
        // renews by `DELIFEQ` and `SET … IFEQ`, probed below, and sends neither. Sent as they
        // are, they would delete or cut a hold another client has on the key.
        if matches!(
            *name,
            "subscribe" | "unsubscribe" | "ping" | "del" | "pexpire"
        ) {
            continue;
        }
        // The value `SET` and `DELIFEQ` compare or write (never the key, which may be `v` too):
        // one no lock writes.
        let probe = matches!(*name, "set" | "delifeq");
        let probed: Vec<&String> = (args.iter().enumerate())
            .map(|(i, a)| {
                if probe && i > 0 && a == "v" {
                    &probe_value
                } else {
                    a
                }
            })
            .collect();
        let cmd = pipe.cmd(name).arg(&probed);
        // An acquire, `SET … NX`, with `XX` too: checked, then refused by its syntax.
        if *name == "set" && args.iter().any(|a| a == "NX") {
            cmd.arg("XX");
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

/// `Ok` when nothing was denied, else the [`LockError::Config`] that lists what was.
fn denied_error(key: &str, what: &str, denied: &[String]) -> Result<()> {
    if denied.is_empty() {
        return Ok(());
    }
    Err(LockError::config(
        key,
        format!(
            "the {what} needs commands this client's user may not send (NOPERM): {}; see \
             the ACL rules in docs/production.md",
            denied.join("; ")
        ),
    ))
}
