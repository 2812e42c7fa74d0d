//! The Lua scripts under `lua/`, compiled into the binary, and how they are run.
//!
//! Every script is sent as `EVALSHA` with its SHA1 computed once, when the client is built.
//! When the server does not know the script (`NOSCRIPT`: after `SCRIPT FLUSH`, a restart or a
//! failover) the same call is sent once as `EVAL` with the script's text, which runs it and
//! caches it on that server. The common case costs one round trip and the recovery two; `EVAL`
//! is routed by key like `EVALSHA`, so in a Redis Cluster it loads the script on the node that
//! owns the key (a `SCRIPT LOAD` has no key to route by).
//!
//! A script that must be able to write when the server is out of memory (`maxmemory` reached
//! with the `noeviction` policy), like the Classic extend, is sent with the Redis 7 shebang
//! `#!lua flags=allow-oom`. Servers before Redis 7 do not know shebangs: a client that learned
//! at `build()` that its server is one of them (`INFO server`, see [`crate::server`]) sends the
//! same script without the shebang (those servers refuse the script's write under OOM, as
//! before). A client that was not told (built lazily, or from an application's pool) sends the
//! shebang; if a server refuses that script with a plain `ERR`, the client asks it its version
//! on the same connection, and only if it is older than Redis 7 sends the script without the
//! shebang, for that call and the rest of its life. Any other refusal is returned as it is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::{ConnectionLike, FromRedisValue, RedisResult, ToRedisArgs};

use crate::server::{self, Version};

/// The Redis 7 script header that lets a script write when `maxmemory` is reached.
const ALLOW_OOM: &str = "#!lua flags=allow-oom\n";

/// One Lua script with its precomputed SHA1.
#[derive(Debug, Clone)]
pub(crate) struct LuaScript {
    name: &'static str,
    /// The text sent by `EVAL` after a `NOSCRIPT`: owned, as some scripts are assembled.
    code: String,
    script: redis::Script,
    /// For a script with a shebang: the same script without it, for servers before Redis 7.
    plain: Option<Arc<Plain>>,
}

/// The shebang-less variant of a script, and whether this client's server lacks shebangs (as
/// it said: then only the variant is sent).
#[derive(Debug)]
struct Plain {
    script: LuaScript,
    shebang_rejected: AtomicBool,
}

impl LuaScript {
    /// A script, each of its [`INCLUDES`] lines replaced by the piece it names (Redis scripts
    /// cannot load one another).
    fn new(name: &'static str, code: &str) -> Self {
        let code = INCLUDES
            .iter()
            .fold(code.to_owned(), |code, (line, piece)| {
                code.replacen(line, piece, 1)
            });
        LuaScript {
            name,
            script: redis::Script::new(&code),
            code,
            plain: None,
        }
    }

    /// The script with the `allow-oom` flag on Redis 7 and later, and itself (plain) before.
    fn allowing_oom(self) -> Self {
        let flagged = Self::new(self.name, &format!("{ALLOW_OOM}{}", self.code));
        let plain = Plain {
            script: self,
            shebang_rejected: AtomicBool::new(false),
        };
        LuaScript {
            plain: Some(Arc::new(plain)),
            ..flagged
        }
    }

    /// `EVALSHA <sha> 1 key args…`, its buffer sized once for the usual arguments (a value of
    /// up to 64 bytes and two numbers).
    pub(crate) fn evalsha(&self, key: &str, args: &impl ToRedisArgs) -> redis::Cmd {
        self.evalsha_keys(&[key], args)
    }

    /// `EVALSHA <sha> <n> keys… args…`, its buffer sized once like [`evalsha`](Self::evalsha)'s.
    pub(crate) fn evalsha_keys(&self, keys: &[&str], args: &impl ToRedisArgs) -> redis::Cmd {
        let key_bytes: usize = keys.iter().map(|k| k.len() + 16).sum();
        let mut cmd = redis::Cmd::with_capacity(6 + keys.len(), 160 + key_bytes);
        cmd.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    /// The script's name (its file's, for logs).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// `SCRIPT LOAD <code>`: caches the script on the server (for a pipeline of `EVALSHA`s on
    /// a server that may not have it yet).
    pub(crate) fn load_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.code);
        cmd
    }

    /// Runs the script on one key with `args` (a tuple writes one ARGV per element).
    pub(crate) fn eval<T: FromRedisValue>(
        &self,
        con: &mut dyn ConnectionLike,
        key: &str,
        args: impl ToRedisArgs,
    ) -> RedisResult<T> {
        self.eval_keys_after(con, &[key], args, false)
    }

    /// Runs the script on several keys (all of one hash slot in a cluster) with `args`.
    pub(crate) fn eval_keys<T: FromRedisValue>(
        &self,
        con: &mut dyn ConnectionLike,
        keys: &[&str],
        args: impl ToRedisArgs,
    ) -> RedisResult<T> {
        self.eval_keys_after(con, keys, args, false)
    }

    /// As [`eval_keys`](Self::eval_keys), with `PING` sent in front when `ping` (in the same
    /// round trip): the connection then has output in Redis before anything the script
    /// publishes (see `FairLock`'s release). On `NOSCRIPT` only the `EVAL` is sent. A script
    /// with a shebang that the server refuses is sent without it if the server is older than
    /// Redis 7 (see the module notes).
    pub(crate) fn eval_keys_after<T: FromRedisValue>(
        &self,
        con: &mut dyn ConnectionLike,
        keys: &[&str],
        args: impl ToRedisArgs,
        ping: bool,
    ) -> RedisResult<T> {
        let Some(plain) = &self.plain else {
            return self.send(con, keys, &args, ping);
        };
        if plain.shebang_rejected.load(Ordering::Relaxed) {
            return plain.script.send(con, keys, &args, ping);
        }
        match self.send(con, keys, &args, ping) {
            Err(err) => {
                let Some(version) = server::lacks(con, &err, Version::has_shebang) else {
                    return Err(err);
                };
                log::info!(
                    "lock {:?}: {version} does not take script flags (before Redis 7: {err}); \
                     script {} is sent without them from now on",
                    keys.first().unwrap_or(&""),
                    self.name
                );
                plain.shebang_rejected.store(true, Ordering::Relaxed);
                plain.script.send(con, keys, &args, ping)
            }
            ok => ok,
        }
    }

    /// [`eval_keys_after`](Self::eval_keys_after) of this very text (no fallback).
    fn send<T: FromRedisValue>(
        &self,
        con: &mut dyn ConnectionLike,
        keys: &[&str],
        args: &impl ToRedisArgs,
        ping: bool,
    ) -> RedisResult<T> {
        let first = if ping {
            let mut pipe = redis::pipe();
            pipe.cmd("PING")
                .ignore()
                .add_command(self.evalsha_keys(keys, args));
            pipe.query::<(T,)>(con).map(|(reply,)| reply)
        } else {
            self.evalsha_keys(keys, args).query(con)
        };
        self.or_eval(con, keys, args, first)
    }

    /// The script's full text.
    #[cfg(any(test, feature = "bench-hooks"))]
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// [`eval`](Self::eval) with its `EVALSHA <sha> 1 key args…` packed by the caller
    /// (`evalsha`, the bytes [`evalsha`](Self::evalsha) would pack; see
    /// [`sha`](Self::sha)), for a script without a shebang variant: on `NOSCRIPT` the
    /// script is sent with `EVAL` as by `eval`.
    pub(crate) fn eval_packed<T: FromRedisValue>(
        &self,
        con: &mut dyn ConnectionLike,
        evalsha: &[u8],
        key: &str,
        args: &impl ToRedisArgs,
    ) -> RedisResult<T> {
        if self.plain.is_some() {
            return self.eval(con, key, args);
        }
        // What `Cmd::query` does with the reply.
        let first = con
            .req_packed_command(evalsha)
            .and_then(|v| Ok(redis::from_redis_value(v.extract_error()?)?));
        self.or_eval(con, &[key], args, first)
    }

    /// After an `EVALSHA` of this script: on `NOSCRIPT` the same call is sent as `EVAL` with
    /// the script's text.
    fn or_eval<T: FromRedisValue>(
        &self,
        con: &mut dyn ConnectionLike,
        keys: &[&str],
        args: &impl ToRedisArgs,
        first: RedisResult<T>,
    ) -> RedisResult<T> {
        match first {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                log::debug!(
                    "lock {:?}: script {} not on the server (NOSCRIPT), sending it with EVAL",
                    keys.first().unwrap_or(&""),
                    self.name
                );
                redis::cmd("EVAL")
                    .arg(&self.code)
                    .arg(keys.len())
                    .arg(keys)
                    .arg(args)
                    .query(con)
            }
            other => other,
        }
    }
}

/// The line of a `lua/rw_*.lua` script that stands for [`RW_PRELUDE`].
const RW_INCLUDE: &str = "-- #include rw_prelude.lua\n";
/// The opening shared by the read-write lock scripts.
const RW_PRELUDE: &str = include_str!("../lua/rw_prelude.lua");
/// The line of `lua/fair_acquire.lua` and `lua/fair_release.lua` that stands for
/// [`FAIR_LIVE_HEAD`].
const FAIR_INCLUDE: &str = "-- #include fair_live_head.lua\n";
/// The queue walk shared by the fair lock scripts.
const FAIR_LIVE_HEAD: &str = include_str!("../lua/fair_live_head.lua");
/// The pieces scripts share, each by the line that stands for it: the read-write scripts'
/// opening, the fair scripts' queue walk, and the semaphore scripts' opening (the server's
/// time and the give-back of expired permits, `lua/semaphore_reclaim.lua`).
const INCLUDES: [(&str, &str); 3] = [
    (RW_INCLUDE, RW_PRELUDE),
    (FAIR_INCLUDE, FAIR_LIVE_HEAD),
    (
        "-- #include semaphore_reclaim.lua\n",
        include_str!("../lua/semaphore_reclaim.lua"),
    ),
];

/// Declares [`Scripts`], one field per script `lua/<field>.lua`, and builds every one of them
/// as its file has it.
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// All scripts of the crate, built once per client.
        #[derive(Debug, Clone)]
        pub(crate) struct Scripts {
            $($(#[$doc])* pub(crate) $name: LuaScript,)*
        }

        impl Scripts {
            /// Every script as its file has it (no shebang).
            fn plain() -> Self {
                Scripts {
                    $($name: LuaScript::new(
                        stringify!($name),
                        include_str!(concat!("../lua/", stringify!($name), ".lua")),
                    ),)*
                }
            }
        }
    };
}

scripts! {
    /// `lua/unlock.lua`: compare-and-delete.
    unlock,
    /// `lua/extend.lua`: compare-and-pexpire.
    extend,
    /// `lua/token_acquire.lua`: Token acquire reporting the fence or the holder's PTTL.
    token_acquire,
    /// `lua/compare_and_set.lua`: Classic takeover and extend, allowed to write when the
    /// server is out of memory (Redis 7+).
    compare_and_set,
    /// `lua/rw_acquire.lua`: read-write lock, take a read or write hold.
    rw_acquire,
    /// `lua/rw_release.lua`: read-write lock, give back a hold or withdraw a writer intent.
    rw_release,
    /// `lua/rw_extend.lua`: read-write lock, renew the owner's own entry.
    rw_extend,
    /// `lua/rw_held.lua`: read-write lock, does the owner hold it.
    rw_held,
    /// `lua/renew_batch.lua`: the watchdog's renewal of many holds in one call.
    renew_batch,
    /// `lua/reentrant_acquire.lua`: reentrant lock (Redisson layout), take or re-enter a hold.
    reentrant_acquire,
    /// `lua/reentrant_release.lua`: reentrant lock, give back one hold (publish on the last).
    reentrant_release,
    /// `lua/reentrant_extend.lua`: reentrant lock, renew the key while the owner holds it.
    reentrant_extend,
    /// `lua/acl_check.lua`: may the user send these commands (`LockBuilder::check_access`)?
    acl_check,
    /// `lua/reentrant_forget.lua`: the janitor's retry of a reentrant release that failed on a
    /// connection error (gives back one hold only if the owner's count is unchanged).
    reentrant_forget,
    /// `lua/lock_state.lua`: the admin queries' read of a key (type, PTTL, value or mode).
    lock_state,
    /// `lua/force_unlock.lua`: the admin's delete-whoever-holds-it, published.
    force_unlock,
    /// `lua/fair_acquire.lua`: fair lock, take it or join (refresh) the queue.
    fair_acquire,
    /// `lua/fair_release.lua`: fair lock, release and grant to the next waiter, or leave the
    /// queue.
    fair_release,
    /// `lua/multilock_acquire.lua`: MultiLock, take every key of one group, all or none.
    multilock_acquire,
    /// `lua/multilock_release.lua`: MultiLock, owner-checked delete of a group's keys,
    /// published on each key's Token channel.
    multilock_release,
    /// `lua/semaphore_acquire.lua`: semaphore, take permits (all or none).
    semaphore_acquire,
    /// `lua/semaphore_release.lua`: semaphore, give permits back.
    semaphore_release,
    /// `lua/semaphore_count.lua`: semaphore, read (reclaiming expired permits), set or add to
    /// the count.
    semaphore_count,
}

impl Scripts {
    /// The scripts for a server of `version`: without the shebangs before Redis 7 (`None`:
    /// not known; with them, see the module notes).
    pub(crate) fn for_server(version: Option<&Version>) -> Self {
        let mut scripts = Scripts::plain();
        // Classic extend must rewrite the value (it is the expiry) even on a full server.
        if version.is_none_or(Version::has_shebang) {
            scripts.compare_and_set = scripts.compare_and_set.allowing_oom();
        }
        scripts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shas_are_distinct_hex() {
        let s = Scripts::for_server(None);
        let shas = [&s.unlock, &s.extend, &s.compare_and_set].map(|l| l.script.get_hash());
        for sha in shas {
            assert_eq!(sha.len(), 40);
            assert!(sha.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(shas[0], shas[1]);
        assert_ne!(shas[1], shas[2]);
    }

    #[test]
    fn compare_and_set_allows_oom_with_a_plain_fallback() {
        let s = Scripts::for_server(None);
        let cas = &s.compare_and_set;
        assert!(cas.code().starts_with("#!lua flags=allow-oom\n"));
        let plain = cas.plain.as_ref().expect("a fallback");
        assert!(!plain.script.code().starts_with('#'));
        assert_eq!(cas.code(), format!("{ALLOW_OOM}{}", plain.script.code()));
        assert_ne!(cas.script.get_hash(), plain.script.script.get_hash());
        assert!(s.unlock.plain.is_none());
    }

    /// The shebang follows the version the server gave: off before Redis 7, on after and when
    /// not known.
    #[test]
    fn the_shebang_follows_the_version() {
        use crate::server::tests::info;
        let sent_plain = |v: Option<&str>| {
            let version = v.and_then(|t| Version::from_info(&info(t)));
            let s = Scripts::for_server(version.as_ref());
            !s.compare_and_set.code().starts_with('#')
        };
        assert!(sent_plain(Some("redis_version:6.2.14\r\n")));
        assert!(!sent_plain(Some("redis_version:7.0.15\r\n")));
        assert!(!sent_plain(Some("valkey_version:8.1.8\r\n")));
        assert!(!sent_plain(None));
    }
}
