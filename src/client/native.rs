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
//! A client built with `lazy_connect`, or from an application's pool, asked nothing: it uses
//! the scripts. A node that answers a native command with "unknown command" (a mixed cluster,
//! a failover to an older server) or a syntax error makes the client switch that command back
//! to its script, for the call at hand and from then on, said once in the log.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;

use crate::error::{LockError, Result};

/// One native command of [`Native`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// `DELIFEQ key value`: the release.
    DelIfEq,
    /// `SET key value IFEQ value PX ttl`: the extend and the watchdog's renewal.
    SetIfEq,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::DelIfEq => "DELIFEQ",
            Command::SetIfEq => "SET ... IFEQ",
        }
    }
}

/// What a server said about itself at `build()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Detected {
    /// `valkey 9.1.2`, `redis 7.0.15`, or empty when `INFO server` was not answered.
    pub(crate) server: String,
    /// `DELIFEQ` is known (`COMMAND INFO DELIFEQ` describes it).
    pub(crate) delifeq: bool,
    /// `SET … IFEQ` is known (Valkey 8.1 and later, by `valkey_version`).
    pub(crate) set_ifeq: bool,
    /// The user may run scripts (`EVAL` and `EVALSHA`).
    pub(crate) scripting: bool,
}

impl Detected {
    /// What a client that asked nothing assumes: scripts only.
    pub(crate) fn scripts_only() -> Self {
        Detected {
            scripting: true,
            ..Detected::default()
        }
    }

    /// Reads the replies of `INFO server` and `COMMAND INFO DELIFEQ` (either may be an error,
    /// e.g. for a user without `@slow`: then nothing native is assumed).
    pub(crate) fn from_replies(info: &Value, command_info: &Value) -> Self {
        let text = match info {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::VerbatimString { text, .. } => text.clone(),
            Value::SimpleString(s) => s.clone(),
            _ => String::new(),
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let valkey = field("valkey_version:");
        let server = match (&valkey, field("redis_version:")) {
            (Some(v), _) => format!("valkey {v}"),
            (None, Some(v)) => format!("redis {v}"),
            (None, None) => String::new(),
        };
        let delifeq = matches!(command_info,
            Value::Array(items) if items.first().is_some_and(|i| matches!(i, Value::Array(_))));
        // `SET … IFEQ` cannot be asked about (COMMAND INFO lists no options): Valkey 8.1+.
        let set_ifeq = valkey.as_deref().is_some_and(|v| at_least(v, (8, 1)));
        Detected {
            server,
            delifeq,
            set_ifeq,
            scripting: true,
        }
    }
}

/// True if the version `v` ("8.1.8") is at least `major.minor`.
fn at_least(v: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

/// The native commands a client uses, each until a server refuses it.
#[derive(Debug)]
pub(crate) struct Native {
    delifeq: AtomicBool,
    set_ifeq: AtomicBool,
    scripting: bool,
    server: String,
}

impl Native {
    pub(crate) fn new(d: &Detected) -> Self {
        if d.delifeq || d.set_ifeq {
            log::debug!(
                "{}: DELIFEQ {}, SET ... IFEQ {}: Token locks use them instead of scripts",
                d.server,
                if d.delifeq { "yes" } else { "no" },
                if d.set_ifeq { "yes" } else { "no" },
            );
        }
        Native {
            delifeq: AtomicBool::new(d.delifeq),
            set_ifeq: AtomicBool::new(d.set_ifeq),
            scripting: d.scripting,
            server: d.server.clone(),
        }
    }

    /// Whether `command` is used (not refused so far).
    pub(crate) fn has(&self, command: Command) -> bool {
        self.flag(command).load(Ordering::Relaxed)
    }

    /// Whether the client's user may run scripts (false only when a server with both native
    /// commands refused `EVAL` at `build()`).
    pub(crate) fn scripting(&self) -> bool {
        self.scripting
    }

    /// `valkey 9.1.2`, `redis 7.0.15`, or empty when not known.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    fn flag(&self, command: Command) -> &AtomicBool {
        match command {
            Command::DelIfEq => &self.delifeq,
            Command::SetIfEq => &self.set_ifeq,
        }
    }

    /// Stops using `command` (the scripts take over), said once.
    pub(crate) fn refused(&self, command: Command, key: &str, e: &redis::RedisError) {
        if self.flag(command).swap(false, Ordering::Relaxed) {
            log::warn!(
                "lock {key:?}: a server refused {} ({e}); this client uses the script instead \
                 from now on",
                command.name()
            );
        }
    }

    /// For the benchmarks: use the scripts (`false`) or what the server offers (`true`, as
    /// detected).
    #[cfg(feature = "bench-hooks")]
    pub(crate) fn force(&self, d: &Detected, native: bool) {
        self.delifeq.store(native && d.delifeq, Ordering::Relaxed);
        self.set_ifeq.store(native && d.set_ifeq, Ordering::Relaxed);
    }
}

/// True for an answer that says the server does not have a native command in this form: an
/// unknown command (a server before Valkey 9.0 asked `DELIFEQ`), a syntax error (before Valkey
/// 8.1 asked `SET … IFEQ`), or a command denied to the user (the script may be allowed).
pub(crate) fn is_unsupported(e: &redis::RedisError) -> bool {
    if crate::error::is_access_denied(e) {
        return true;
    }
    let text = e.to_string().to_ascii_lowercase();
    e.code() == Some("ERR") && (text.contains("unknown command") || text.contains("syntax error"))
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
    if native.scripting() {
        return Ok(());
    }
    Err(LockError::config(
        key,
        format!(
            "{what} runs Lua scripts, which this client's user may not (NOPERM on EVAL when \
             the client was built); on {} only a Token lock without fencing needs none",
            native.server()
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
        assert!(d.delifeq && d.set_ifeq && d.scripting);
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
        assert!(!at_least("8.0.2", (8, 1)) && at_least("10.0", (8, 1)));
    }

    #[test]
    fn unsupported_answers_are_recognised() {
        let err = |code: &str, msg: &str| {
            let resp = format!("-{code} {msg}\r\n");
            match redis::parse_redis_value(resp.as_bytes()) {
                Ok(Value::ServerError(e)) => redis::RedisError::from(e),
                other => panic!("not a server error: {other:?}"),
            }
        };
        assert!(is_unsupported(&err(
            "ERR",
            "unknown command 'delifeq', with args beginning with: 'k' 'a'"
        )));
        assert!(is_unsupported(&err("ERR", "syntax error")));
        assert!(!is_unsupported(&err(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value"
        )));
        assert!(is_oom(&err(
            "OOM",
            "command not allowed when used memory > 'maxmemory'."
        )));
    }
}
