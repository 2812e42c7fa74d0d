//! `dlock`: flock(1) across hosts. Runs a command while holding a redis-dlock lock, renewed
//! while the command runs; reports the lock's state; force-releases it. Unix only.
//!
//! The full reference is `docs/cli.md`. Built with the cargo feature `cli`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod args;
mod run;
mod status;

use std::fmt;
use std::process::ExitCode;

use redis_dlock::LockError;

/// Exit codes of `dlock` itself (sysexits.h where one fits).
pub mod code {
    /// The lock is free (`status`), or there was nothing to release (`release`).
    pub const FREE: u8 = 1;
    /// EX_USAGE: bad command line.
    pub const USAGE: u8 = 64;
    /// EX_DATAERR: the key holds something that is not a lock of the chosen strategy.
    pub const DATA: u8 = 65;
    /// EX_UNAVAILABLE: Redis could not be reached, or refused us (authentication, errors).
    pub const UNAVAILABLE: u8 = 69;
    /// EX_OSERR: a signal handler or thread could not be set up.
    pub const OS: u8 = 71;
    /// EX_TEMPFAIL: the lock is busy (`--no-wait`) or the wait timed out.
    pub const BUSY: u8 = 75;
    /// The lock was lost while the command ran: not in sysexits (64–78), so that it cannot be
    /// mistaken for one of them.
    pub const LOST: u8 = 79;
    /// The command was found but could not be run (as env(1), timeout(1)).
    pub const CANNOT_RUN: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

/// A failure of dlock itself: its message and exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    /// What to print after `dlock: `.
    pub message: String,
}

impl Failure {
    /// A failure with exit status `code`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A library error met while talking to the Redis at `url` about `key`. The exit code
    /// follows the error's classification (its predicates and its cause's kind), never its text.
    pub fn from_lock_error(e: &LockError, url: &str) -> Self {
        let url = redact(url);
        let unavailable = |what: &str, detail: String| {
            Failure::new(code::UNAVAILABLE, format!("{what} {url}: {detail}"))
        };
        match e {
            _ if e.is_access_denied() => {
                let what = if causes(e).any(|r| {
                    r.kind() == redis::ErrorKind::AuthenticationFailed
                        || matches!(r.code(), Some("NOAUTH" | "WRONGPASS"))
                }) {
                    "authentication failed at"
                } else {
                    "the ACL user may not run a command the lock needs at"
                };
                unavailable(what, e.report())
            }
            LockError::Connection { source, .. } => {
                unavailable("cannot reach Redis at", chain(source.as_ref()))
            }
            LockError::Redis { source, .. } => {
                unavailable("the command was refused by Redis at", chain(source))
            }
            LockError::WrongType { key } => Failure::new(
                code::DATA,
                format!("key {key:?} holds a value of another Redis type: it is not a lock of this strategy"),
            ),
            LockError::Corrupt { key, value, reason } => Failure::new(
                code::DATA,
                format!("key {key:?} holds {value}, which is not a legacy expiry timestamp ({reason}): left alone"),
            ),
            LockError::Unsupported { reason, .. } => Failure::new(code::USAGE, reason.clone()),
            LockError::Config { reason, source, .. } => {
                let detail = match source {
                    Some(source) => format!("{reason}: {}", chain(source.as_ref())),
                    None => reason.clone(),
                };
                // The client checks its connection when it is built: a server that is down,
                // or that answered the check with an error (no such database, scripts not
                // allowed), is "unavailable", not a usage error.
                if e.is_transient() || e.is_timeout() {
                    unavailable("cannot reach Redis at", detail)
                } else if server_answered(e) {
                    unavailable("the set-up was refused by Redis at", detail)
                } else if e.key().is_some() {
                    // A lock option or key.
                    Failure::new(code::USAGE, reason.clone())
                } else {
                    Failure::new(code::USAGE, format!("bad Redis URL {url}: {detail}"))
                }
            }
            LockError::NotReplicated {
                confirmed,
                required,
                ..
            } => Failure::new(
                code::UNAVAILABLE,
                format!(
                    "the lock was confirmed by {confirmed} of the {required} replicas it needs \
                     in time, so a failover could lose it: not taken"
                ),
            ),
            LockError::LateReply { .. } | LockError::NoQuorum { .. } => {
                Failure::new(code::BUSY, e.report())
            }
            other => Failure::new(code::UNAVAILABLE, other.to_string()),
        }
    }
}

/// True when a cause of `e` is an error reply of the server (it has an error code), as opposed
/// to a URL or an option redis-rs or the library refused before sending anything.
fn server_answered(e: &LockError) -> bool {
    causes(e).any(|r| r.code().is_some())
}

/// The redis-rs errors among the causes of `e`.
fn causes(e: &LockError) -> impl Iterator<Item = &redis::RedisError> {
    std::iter::successors(std::error::Error::source(e), |c| c.source())
        .filter_map(|c| c.downcast_ref::<redis::RedisError>())
}

/// An error and its sources, `: `-separated, without repeats (r2d2 and redis often repeat the
/// inner message in the outer one).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The URL with its password (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> Redacted<'_> {
    Redacted(url)
}

/// See [`redact`].
pub struct Redacted<'a>(&'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
            return f.write_str(url);
        };
        let rest = &url[scheme_end..];
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let Some(at) = rest[..authority_end].rfind('@') else {
            return f.write_str(url);
        };
        let userinfo = &rest[..at];
        match userinfo.find(':') {
            Some(colon) => write!(
                f,
                "{}{}:***{}",
                &url[..scheme_end],
                &userinfo[..colon],
                &rest[at..]
            ),
            // `redis://password@host` is not a password form the redis crate reads, but
            // hide it all the same.
            None => write!(f, "{}***{}", &url[..scheme_end], &rest[at..]),
        }
    }
}

/// Prints dlock's own messages: `dlock: ...` on stderr.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("dlock: {}", format_args!($($arg)*))
    };
}

/// `DLOCK_LOG=debug` (or error, warn, info, trace) prints the library's log on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("dlock [{}] {}", record.level(), record.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: StderrLog = StderrLog;

fn init_log() {
    let Some(level) = std::env::var("DLOCK_LOG")
        .ok()
        .and_then(|v| v.trim().parse::<log::LevelFilter>().ok())
    else {
        return;
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

fn main() -> ExitCode {
    init_log();
    let argv: Vec<_> = std::env::args_os().skip(1).collect();
    let cmd = match args::parse(argv, std::env::var("REDIS_URL").ok()) {
        Ok(cmd) => cmd,
        Err(args::Usage(msg)) => {
            say!("{msg}");
            eprint!("\n{}", args::USAGE);
            return ExitCode::from(code::USAGE);
        }
    };
    let outcome = match cmd {
        args::Cmd::Help(text) => {
            print!("{text}");
            Ok(0)
        }
        args::Cmd::Version => {
            println!("dlock (redis-dlock) {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        args::Cmd::Run(opts) => run::run(*opts),
        args::Cmd::Status(target) => status::status(&target),
        args::Cmd::Release(target) => status::release(&target),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            say!("{}", f.message);
            ExitCode::from(f.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_hidden() {
        let r = |u: &str| redact(u).to_string();
        assert_eq!(r("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
        assert_eq!(r("redis://:s3cret@h:1/"), "redis://:***@h:1/");
        assert_eq!(r("rediss://user:p@ss@h/2"), "rediss://user:***@h/2");
        assert_eq!(r("redis://token@h"), "redis://***@h");
        assert_eq!(r("redis://h/?x=a@b"), "redis://h/?x=a@b");
    }
}
