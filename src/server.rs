//! What a server is, as it says itself (`INFO server`: `redis_version`, `valkey_version`), and
//! the features the locks use that follow from its version. A capability is learned by asking
//! the server, never read from the text of an error: the client asks once when it is built
//! (see `client/native.rs`), and again on the connection at hand only when a command that
//! needs a capability is refused, to tell "this server lacks it" from any other refusal.

use std::fmt;

use redis::{ConnectionLike, Value};

/// A server's family and version, from `INFO server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    /// Valkey, or else Redis. Valkey says both `redis_version` (the Redis it forked from, 7.2)
    /// and `valkey_version`.
    valkey: bool,
    /// `(major, minor)`, for the comparisons.
    number: (u32, u32),
    /// As the server wrote it (`9.1.2`), for messages.
    text: String,
}

impl Version {
    /// Reads the reply to `INFO server`; `None` for anything else (an error, a user that may
    /// not run `INFO`). A Cluster connection sends `INFO` to every primary and answers with a
    /// map of their replies: the oldest server is the one read (what every node has).
    pub(crate) fn from_info(info: &Value) -> Option<Version> {
        let text: String = match info {
            Value::Map(nodes) => {
                let versions = nodes.iter().map(|(_, reply)| Version::from_info(reply));
                // Any node that does not say leaves the answer unknown.
                let versions: Option<Vec<Version>> = versions.collect();
                return versions?.into_iter().min_by_key(|v| (v.valkey, v.number));
            }
            // A path in `INFO` (`executable:`, `config_file:`) may not be UTF-8.
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            // A verbatim or simple string, read by redis-rs.
            other => redis::from_redis_value_ref(other).ok()?,
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let (valkey, text) = match (field("valkey_version:"), field("redis_version:")) {
            (Some(v), _) => (true, v),
            (None, v) => (false, v?),
        };
        let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let number = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Some(Version {
            valkey,
            number,
            text,
        })
    }

    /// Script shebangs and their flags (`#!lua flags=allow-oom`): Redis 7.0 and later, and
    /// every Valkey (forked from Redis 7.2).
    pub(crate) fn has_shebang(&self) -> bool {
        self.valkey || self.number >= (7, 0)
    }

    /// `SET … NX … GET` (NX with GET): Redis 7.0 and later, like [`has_shebang`](Self::has_shebang).
    pub(crate) fn has_set_nx_get(&self) -> bool {
        self.has_shebang()
    }

    /// `DELIFEQ`: Valkey 9.0 and later (by version; `COMMAND INFO DELIFEQ` also says whether a
    /// server has it under that name).
    pub(crate) fn has_delifeq(&self) -> bool {
        self.valkey && self.number >= (9, 0)
    }

    /// `SET … IFEQ`: Valkey 8.1 and later (`COMMAND INFO` lists no options to ask about).
    pub(crate) fn has_set_ifeq(&self) -> bool {
        self.valkey && self.number >= (8, 1)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = if self.valkey { "valkey" } else { "redis" };
        write!(f, "{family} {}", self.text)
    }
}

/// Asks the server on `con` what it is (`INFO server`, one round trip); `None` if it does not
/// say.
pub(crate) fn ask(con: &mut dyn ConnectionLike) -> Option<Version> {
    let reply: Value = redis::cmd("INFO").arg("server").query(con).ok()?;
    Version::from_info(&reply)
}

/// After a command that needs a capability was refused with `e` on `con`: the server's version
/// if the refusal is a plain `ERR` and the server, asked on `con`, gives a version for which
/// `has` is false. `None` for a refusal of any other cause, or a server that does not say.
pub(crate) fn lacks(
    con: &mut dyn ConnectionLike,
    e: &redis::RedisError,
    has: impl FnOnce(&Version) -> bool,
) -> Option<Version> {
    if !may_lack_capability(e) {
        return None;
    }
    ask(con).filter(|v| !has(v))
}

/// True for a refusal that may mean the server lacks a capability and is worth asking about:
/// a plain `ERR` reply (an unknown command, a syntax error, a script that does not compile all
/// answer so), by its code. Other refusals (`WRONGTYPE`, `OOM`, `NOPERM`, …) say what they are.
pub(crate) fn may_lack_capability(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A connection that answers every command with `replies` (one each, in turn), and counts
    /// the commands.
    pub(crate) struct Canned {
        pub(crate) replies: Vec<Value>,
        pub(crate) sent: usize,
    }

    impl Canned {
        pub(crate) fn new(replies: Vec<Value>) -> Self {
            Canned { replies, sent: 0 }
        }

        fn next(&mut self) -> Value {
            let reply = self.replies.get(self.sent).cloned().unwrap_or(Value::Nil);
            self.sent += 1;
            reply
        }
    }

    impl ConnectionLike for Canned {
        fn req_packed_command(&mut self, _: &[u8]) -> redis::RedisResult<Value> {
            Ok(self.next())
        }

        fn req_packed_commands(
            &mut self,
            _: &[u8],
            offset: usize,
            count: usize,
        ) -> redis::RedisResult<Vec<Value>> {
            Ok((0..offset + count)
                .map(|_| self.next())
                .skip(offset)
                .collect())
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

    pub(crate) fn server_error(code: &str, msg: &str) -> redis::RedisError {
        let resp = format!("-{code} {msg}\r\n");
        match redis::parse_redis_value(resp.as_bytes()) {
            Ok(Value::ServerError(e)) => redis::RedisError::from(e),
            other => panic!("not a server error: {other:?}"),
        }
    }

    pub(crate) fn info(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// A syntax error is asked about: only a server that says it is older than the feature
    /// turns it off; any other refusal is not even asked about.
    #[test]
    fn a_refusal_is_asked_about_not_read() {
        let syntax = server_error("ERR", "syntax error");
        let mut redis_6 = Canned::new(vec![info("redis_version:6.2.14\r\n")]);
        let lacking = lacks(&mut redis_6, &syntax, Version::has_set_nx_get);
        assert_eq!(
            lacking.map(|v| v.to_string()).as_deref(),
            Some("redis 6.2.14")
        );
        assert_eq!(redis_6.sent, 1);
        let mut redis_7 = Canned::new(vec![info("redis_version:7.0.15\r\n")]);
        assert_eq!(lacks(&mut redis_7, &syntax, Version::has_set_nx_get), None);
        assert_eq!(redis_7.sent, 1);
        let mut silent = Canned::new(vec![]);
        assert_eq!(lacks(&mut silent, &syntax, Version::has_shebang), None);
        let mut never = Canned::new(vec![info("redis_version:6.2.14\r\n")]);
        let oom = server_error("OOM", "command not allowed when used memory > 'maxmemory'.");
        assert_eq!(lacks(&mut never, &oom, Version::has_shebang), None);
        assert_eq!(never.sent, 0, "only a plain ERR is asked about");
    }

    #[test]
    fn versions_and_what_follows_from_them() {
        let v = Version::from_info(&info(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n",
        ))
        .expect("a version");
        assert_eq!(v.to_string(), "valkey 8.1.8");
        assert!(v.has_shebang() && v.has_set_nx_get() && v.has_set_ifeq());
        let v = Version::from_info(&info("redis_version:7.0.15\r\n")).expect("a version");
        assert_eq!(v.to_string(), "redis 7.0.15");
        assert!(v.has_shebang() && v.has_set_nx_get() && !v.has_set_ifeq());
        let v = Version::from_info(&info("redis_version:6.2.14\r\n")).expect("a version");
        assert!(!v.has_shebang() && !v.has_set_nx_get() && !v.has_set_ifeq());
        let v = Version::from_info(&info("valkey_version:8.0.2\r\n")).expect("a version");
        assert!(v.has_set_nx_get() && !v.has_set_ifeq());
        let v = Version::from_info(&info("valkey_version:10.0\r\n")).expect("a version");
        assert!(v.has_set_ifeq());
        assert_eq!(Version::from_info(&Value::Nil), None);
        // A Cluster's answer: one reply per primary, the oldest read.
        let node =
            |addr: &str, text: &str| (Value::BulkString(addr.as_bytes().to_vec()), info(text));
        let mixed = Value::Map(vec![
            node("a:1", "valkey_version:9.1.2\r\n"),
            node("b:2", "valkey_version:8.1.8\r\n"),
        ]);
        let v = Version::from_info(&mixed).expect("a version");
        assert_eq!(v.to_string(), "valkey 8.1.8");
        assert!(v.has_set_ifeq() && !v.has_delifeq());
        let unknown = Value::Map(vec![
            node("a:1", "valkey_version:9.1.2\r\n"),
            (Value::Nil, Value::Nil),
        ]);
        assert_eq!(Version::from_info(&unknown), None);
        assert_eq!(Version::from_info(&info("# Server\r\n")), None);
    }
}
