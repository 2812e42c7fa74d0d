//! What the server offers beyond scripts, learned when the client is built, and the native
//! commands that replace the Token lock's compare-and-delete and compare-and-extend scripts.
//!
//! [`ClientBuilder::build`](crate::ClientBuilder::build) sends `INFO server` and
//! `COMMAND INFO DELIFEQ` in the same round trip as its scripting probe (`EVAL`). Two commands
//! are used where the server has them:
//! - `DELIFEQ key value` (Valkey 9.0 and later): delete only if the value is ours; 1 or 0;
//! - `SET key value IFEQ value PX ttl` (Valkey 8.1 and later): set the same value and a new
//!   expiry only if the value is ours; `OK` or nil.
//!
//! Redis 8.4 has `SET … IFEQ` and `DELEX key IFEQ value` too, but no such server runs in this
//! crate's tests, so they are not used there (Redis servers keep the scripts).
//!
//! The same answer tells which Redis 7 features the server has (`SET … NX … GET`, script
//! shebangs): see [`crate::server`].
//!
//! A client built with `lazy_connect`, or from an application's pool, asked nothing: it uses
//! the scripts. A node that refuses a native command with a plain `ERR` (a mixed cluster, a
//! failover to an older server) is asked the same two questions on that connection; only if it
//! says it lacks the command does the client switch that command back to its script, for the
//! call at hand and from then on, said once in the log. Any other refusal is returned as it is.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::{ConnectionLike, Value};

use crate::error::{LockError, Result};
use crate::server::{self, Version};

/// One native command of [`Native`] (its index in [`Native`]'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// `DELIFEQ key value`: the release.
    DelIfEq,
    /// `SET key value IFEQ value PX ttl`: the extend and the watchdog's renewal.
    SetIfEq,
}

/// The names of the [`Command`]s, for the log.
const NAMES: [&str; 2] = ["DELIFEQ", "SET ... IFEQ"];

/// What a server said about itself at `build()`; by default, what a client that asked
/// nothing assumes: scripts only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Detected {
    /// `valkey 9.1.2`, `redis 7.0.15`, or empty when `INFO server` was not answered.
    pub(crate) server: String,
    /// The server's version, when `INFO server` was answered.
    pub(crate) version: Option<Version>,
    /// `DELIFEQ` is known (`COMMAND INFO DELIFEQ` describes it).
    pub(crate) delifeq: bool,
    /// `SET … IFEQ` is known (Valkey 8.1 and later, by `valkey_version`).
    pub(crate) set_ifeq: bool,
    /// The user may not run scripts (`EVAL` and `EVALSHA`).
    pub(crate) scripts_denied: bool,
}

impl Detected {
    /// Reads the replies of `INFO server` and `COMMAND INFO DELIFEQ` (either may be an error,
    /// e.g. for a user without `@slow`: then nothing native is assumed).
    pub(crate) fn from_replies(info: &Value, command_info: &Value) -> Self {
        let version = Version::from_info(info);
        Detected {
            server: version.as_ref().map(Version::to_string).unwrap_or_default(),
            delifeq: describes_a_command(command_info) == Some(true),
            // `SET … IFEQ` cannot be asked about (COMMAND INFO lists no options): by version.
            set_ifeq: version.as_ref().is_some_and(Version::has_set_ifeq),
            version,
            scripts_denied: false,
        }
    }
}

/// Whether a reply to `COMMAND INFO <name>` describes the command (`Some(false)`: the server
/// answered and does not know it; `None`: no answer, e.g. an error).
fn describes_a_command(command_info: &Value) -> Option<bool> {
    match command_info {
        Value::Array(items) => Some(items.first().is_some_and(|i| matches!(i, Value::Array(_)))),
        _ => None,
    }
}

/// Asks the server on `con` whether it lacks `command` (`INFO server`, and `COMMAND INFO
/// DELIFEQ` for `DELIFEQ`, as at `build()`; one command at a time, as a Cluster connection
/// takes `INFO` outside a pipeline only, and sends it to every primary); false when it does
/// not say.
fn server_lacks(con: &mut dyn ConnectionLike, command: Command) -> bool {
    let version = server::ask(con);
    match command {
        Command::SetIfEq => version.is_some_and(|v| !v.has_set_ifeq()),
        Command::DelIfEq => {
            let described = redis::cmd("COMMAND")
                .arg("INFO")
                .arg("DELIFEQ")
                .query::<Value>(con)
                .ok()
                .and_then(|reply| describes_a_command(&reply));
            described == Some(false) || version.is_some_and(|v| !v.has_delifeq())
        }
    }
}

/// The native commands a client uses, each until a server refuses it.
#[derive(Debug)]
pub(crate) struct Native {
    /// Whether each [`Command`] is used.
    flags: [AtomicBool; 2],
    /// What `build()` learned: whether the client's user may not run scripts (only when a
    /// server with both native commands refused `EVAL`), the server's name and version.
    pub(crate) detected: Detected,
}

impl Native {
    pub(crate) fn new(d: Detected) -> Self {
        if d.delifeq || d.set_ifeq {
            log::debug!(
                "{}: DELIFEQ {}, SET ... IFEQ {}: Token locks use them instead of scripts",
                d.server,
                if d.delifeq { "yes" } else { "no" },
                if d.set_ifeq { "yes" } else { "no" },
            );
        }
        Native {
            flags: [d.delifeq, d.set_ifeq].map(AtomicBool::new),
            detected: d,
        }
    }

    /// Whether `command` is used (not refused so far).
    pub(crate) fn has(&self, command: Command) -> bool {
        self.flags[command as usize].load(Ordering::Relaxed)
    }

    /// After `command` was answered with `e` on `con`: true if the client is to use the script
    /// instead, for this call and from now on. So only when the user may not run the command
    /// (`NOPERM`: the script may be allowed), or when the server, asked on `con`, says it lacks
    /// the command (after a plain `ERR`: an unknown command, a syntax error). Any other error
    /// (a full server's `OOM` included) is the caller's to handle.
    pub(crate) fn lacks(
        &self,
        con: &mut dyn ConnectionLike,
        command: Command,
        key: &str,
        e: &redis::RedisError,
    ) -> bool {
        let lacks = crate::error::is_access_denied(e)
            || (server::may_lack_capability(e) && server_lacks(con, command));
        // Stops using `command` (the scripts take over), said once.
        if lacks && self.flags[command as usize].swap(false, Ordering::Relaxed) {
            log::warn!(
                "lock {key:?}: a server refused {} ({e}); this client uses the script instead \
                 from now on",
                NAMES[command as usize]
            );
        }
        lacks
    }

    /// For the benchmarks: use the scripts (`false`) or what the server offers (`true`, as
    /// detected).
    #[cfg(feature = "bench-hooks")]
    pub(crate) fn force(&self, native: bool) {
        let d = &self.detected;
        for (flag, has) in self.flags.iter().zip([d.delifeq, d.set_ifeq]) {
            flag.store(native && has, Ordering::Relaxed);
        }
    }
}

/// True for the refusal of a write on a full server (`maxmemory` reached, `noeviction`):
/// `SET … IFEQ` is refused there, the compare-and-pexpire script is not.
pub(crate) fn is_oom(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
}

/// `DELIFEQ key value`.
pub(crate) fn delifeq(key: &str, value: &[u8]) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3, 32 + key.len() + value.len());
    cmd.arg("DELIFEQ").arg(key).arg(value);
    cmd
}

/// `SET key value IFEQ value PX ttl_ms`.
pub(crate) fn set_ifeq_px(key: &str, value: &[u8], ttl_ms: u64) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(7, 64 + key.len() + 2 * value.len());
    cmd.arg("SET")
        .arg(key)
        .arg(value)
        .arg("IFEQ")
        .arg(value)
        .arg("PX")
        .arg(ttl_ms);
    cmd
}

/// Refuses to build a lock that runs scripts (`what`) on a client whose user may not run them
/// (see [`crate::client::native`]): only a Token lock without fencing goes without.
pub(crate) fn needs_scripts(native: &Native, key: &str, what: &str) -> Result<()> {
    if !native.detected.scripts_denied {
        return Ok(());
    }
    Err(LockError::config(
        key,
        format!(
            "{what} runs Lua scripts, which this client's user may not (NOPERM on EVAL when \
             the client was built); on {} only a Token lock without fencing needs none",
            native.detected.server
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn valkey_9_has_both() {
        let d = Detected::from_replies(
            &info(
                "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n",
            ),
            &Value::Array(vec![Value::Array(vec![Value::BulkString(
                b"delifeq".to_vec(),
            )])]),
        );
        assert_eq!(d.server, "valkey 9.1.2");
        assert!(d.delifeq && d.set_ifeq && !d.scripts_denied);
    }

    #[test]
    fn valkey_8_1_has_set_ifeq_only() {
        let d = Detected::from_replies(
            &info("redis_version:7.2.4\r\nvalkey_version:8.1.8\r\n"),
            &Value::Array(vec![Value::Nil]),
        );
        assert_eq!((d.delifeq, d.set_ifeq), (false, true));
    }

    #[test]
    fn redis_and_errors_have_neither() {
        let d = Detected::from_replies(
            &info("redis_version:7.0.15\r\n"),
            &Value::Array(vec![Value::Nil]),
        );
        assert_eq!(d.server, "redis 7.0.15");
        assert_eq!((d.delifeq, d.set_ifeq), (false, false));
        let d = Detected::from_replies(&Value::Nil, &Value::Nil);
        assert_eq!(
            (d.server.as_str(), d.delifeq, d.set_ifeq),
            ("", false, false)
        );
    }

    /// A native command refused with a plain `ERR` is turned off only when the server, asked,
    /// says it lacks it; a `NOPERM` turns it off (the script may be allowed) without asking.
    #[test]
    fn a_refused_native_command_is_asked_about() {
        use crate::server::tests::{info, server_error, Canned};
        let detected = Detected::from_replies(
            &info("valkey_version:9.1.2\r\n"),
            &Value::Array(vec![Value::Array(vec![])]),
        );
        let syntax = server_error("ERR", "syntax error");
        // Valkey 9.1 says it has both: the error is the caller's, the commands stay on.
        let native = Native::new(detected.clone());
        let mut has_both = Canned::new(vec![
            info("valkey_version:9.1.2\r\n"),
            Value::Array(vec![Value::Array(vec![])]),
        ]);
        assert!(!native.lacks(&mut has_both, Command::DelIfEq, "k", &syntax));
        assert!(!native.lacks(&mut has_both, Command::SetIfEq, "k", &syntax));
        assert!(native.has(Command::DelIfEq) && native.has(Command::SetIfEq));
        // A node of Valkey 8.0 (a mixed fleet): it lacks both.
        let mut older = Canned::new(vec![
            info("valkey_version:8.0.2\r\n"),
            Value::Array(vec![Value::Nil]),
            info("valkey_version:8.0.2\r\n"),
            Value::Array(vec![Value::Nil]),
        ]);
        assert!(native.lacks(&mut older, Command::DelIfEq, "k", &syntax));
        assert!(native.lacks(&mut older, Command::SetIfEq, "k", &syntax));
        assert!(!native.has(Command::DelIfEq) && !native.has(Command::SetIfEq));
        // NOPERM: by its code, nothing asked.
        let native = Native::new(detected);
        let mut nothing = Canned::new(vec![]);
        let denied = server_error(
            "NOPERM",
            "User u has no permissions to run the 'delifeq' command",
        );
        assert!(native.lacks(&mut nothing, Command::DelIfEq, "k", &denied));
        assert_eq!(nothing.sent, 0);
        // WRONGTYPE is an answer, not a missing command.
        let wrongtype = server_error(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value",
        );
        assert!(!native.lacks(&mut nothing, Command::SetIfEq, "k", &wrongtype));
        assert!(native.has(Command::SetIfEq));
    }

    #[test]
    fn a_full_server_is_recognised_by_its_code() {
        let err = |code: &str, msg: &str| {
            let resp = format!("-{code} {msg}\r\n");
            match redis::parse_redis_value(resp.as_bytes()) {
                Ok(Value::ServerError(e)) => redis::RedisError::from(e),
                other => panic!("not a server error: {other:?}"),
            }
        };
        assert!(is_oom(&err(
            "OOM",
            "command not allowed when used memory > 'maxmemory'."
        )));
        assert!(!is_oom(&err("ERR", "syntax error")));
        assert_eq!(
            describes_a_command(&Value::Array(vec![Value::Nil])),
            Some(false)
        );
        assert_eq!(describes_a_command(&Value::Nil), None);
    }
}
