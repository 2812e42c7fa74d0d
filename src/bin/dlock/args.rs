//! The command line, parsed with the standard library alone (no parser crate: the grammar is
//! three subcommands with long options, and library users should not compile a parser).

use std::ffi::OsString;
use std::time::Duration;

use redis_dlock::{ClassicOptions, Encoding, ReplicaAcks, SpringOptions, Strategy};

/// What the command line asks for.
#[derive(Debug)]
pub enum Cmd {
    /// `dlock run ... -- COMMAND [ARGS...]`.
    Run(Box<RunOpts>),
    /// `dlock status`.
    Status(Target),
    /// `dlock release --force`.
    Release(Target),
    /// `dlock help` / `--help`: the text to print.
    Help(&'static str),
    /// `dlock --version`.
    Version,
}

/// The lock a subcommand is about.
#[derive(Debug)]
pub struct Target {
    /// `--url`, else `$REDIS_URL`; with `--sentinel` or `--cluster`, the first of their URLs
    /// (for messages).
    pub url: String,
    /// `--key`.
    pub key: String,
    /// Where the lock lives.
    pub deployment: Deployment,
}

/// The Redis deployment a subcommand talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// One server: `--url`, else `$REDIS_URL`.
    Single,
    /// `--sentinel URL` (repeated) with `--master NAME`.
    Sentinel {
        /// The Sentinels' URLs.
        sentinels: Vec<String>,
        /// The monitored master's name.
        master: String,
    },
    /// `--cluster URL` (repeated): seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

/// How long `run` waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// No `--wait` nor `--no-wait`: the strategy's default retry policy.
    Default,
    /// `--no-wait`: one attempt.
    No,
    /// `--wait DUR`.
    For(Duration),
    /// `--wait forever`.
    Forever,
}

/// The names `--strategy` takes, and the library's strategies they stand for.
pub const STRATEGIES: &[(&str, Strategy)] = &[
    ("token", Strategy::Token),
    ("classic", Strategy::Classic(ClassicOptions::new())),
    ("reentrant", Strategy::Reentrant),
    ("fair", Strategy::Fair),
];

/// The names `--classic-encoding` takes (and `status` prints), and the library's encodings
/// they stand for.
pub const ENCODINGS: &[(&str, Encoding)] = &[
    ("decimal", Encoding::Decimal),
    ("big-endian", Encoding::BigEndian),
    ("float-seconds", Encoding::FloatSeconds),
    ("uuid-ms", Encoding::UuidMs),
    ("nanos", Encoding::Nanos),
];

/// The value `name` stands for in `table`.
fn named<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// The name of `value` in `table`.
pub fn name_of<T: PartialEq>(table: &[(&'static str, T)], value: &T) -> Option<&'static str> {
    table.iter().find(|(_, v)| v == value).map(|(n, _)| *n)
}

/// The names of `table` as a choice: `a, b or c`.
fn choices<T>(table: &[(&str, T)]) -> String {
    let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The options of `run`.
#[derive(Debug)]
pub struct RunOpts {
    pub target: Target,
    pub wait: Wait,
    /// `--ttl`: a fixed lease, not renewed.
    pub ttl: Option<Duration>,
    /// `--lease`: the renewed lease (without `--ttl`).
    pub lease: Duration,
    pub strategy: Strategy,
    pub encoding: Encoding,
    pub kill_after: Duration,
    pub quiet: bool,
    /// `--replica-acks`.
    pub replica_acks: ReplicaAcks,
    /// `--at-least`: a release keeps the hold until this long after the acquire.
    pub at_least: Option<Duration>,
    /// `--shedlock`: the key is a ShedLock job's, the value in ShedLock's format.
    pub shedlock: bool,
    /// `--permits N`: a permit of the semaphore named by the key (N permits in all), not the
    /// lock.
    pub permits: Option<u64>,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Lease of a renewed hold when `--lease` is not given (the library's watchdog default).
pub const DEFAULT_LEASE: Duration = redis_dlock::LockBuilder::DEFAULT_WATCHDOG_LEASE;
/// Time between SIGTERM and SIGKILL after a loss when `--kill-after` is not given.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);
/// The shortest lease `--lease` accepts: renewals run every third of it.
const MIN_LEASE: Duration = Duration::from_millis(300);

pub const USAGE: &str = "\
Usage:
  dlock run     [REDIS] --key KEY [--wait DUR | --no-wait] [--ttl DUR | --lease DUR]
                [--strategy token|classic|reentrant|fair] [--classic-encoding E]
                [--spring-registry REGISTRY] [--at-least DUR] [--kill-after DUR]
                [--replica-acks auto|off|N] [--quiet] -- COMMAND [ARGS...]
  dlock run     [REDIS] --shedlock NAME [--shedlock-env ENV] [options] -- COMMAND [ARGS...]
  dlock run     [REDIS] --key NAME --permits N [--wait DUR | --no-wait] [--ttl DUR | --lease DUR]
                [--kill-after DUR] [--quiet] -- COMMAND [ARGS...]
  dlock status  [REDIS] --key KEY
  dlock release [REDIS] --key KEY --force
  dlock --help | --version

Run 'dlock help run', 'dlock help status' or 'dlock help release' for details.
";

pub const HELP: &str = "\
dlock: flock(1) across hosts, on Redis.

Usage:
  dlock run     [REDIS] --key KEY [--wait DUR | --no-wait] [--ttl DUR | --lease DUR]
                [--strategy token|classic|reentrant|fair] [--classic-encoding E]
                [--spring-registry REGISTRY] [--at-least DUR] [--kill-after DUR]
                [--replica-acks auto|off|N] [--quiet] -- COMMAND [ARGS...]
  dlock run     [REDIS] --shedlock NAME [--shedlock-env ENV] [options] -- COMMAND [ARGS...]
  dlock run     [REDIS] --key NAME --permits N [--wait DUR | --no-wait] [--ttl DUR | --lease DUR]
                [--kill-after DUR] [--quiet] -- COMMAND [ARGS...]
  dlock status  [REDIS] --key KEY
  dlock release [REDIS] --key KEY --force

REDIS: --url URL (default $REDIS_URL), or --sentinel URL... --master NAME, or
--cluster URL... (each repeatable). DUR: 500ms, 10s, 1.5s, 5m, 2h, or a number of seconds.

Exit status of run: the command's own (128+N if a signal N killed it), or
  75  the lock is busy (--no-wait) or the wait timed out
  79  the lock was lost while the command ran (the command got SIGTERM, then SIGKILL)
  69  Redis unreachable or refusing (wrong password, ...)
  65  the key holds something that is not a lock of the chosen strategy
  64  usage error
  126 / 127  the command could not be run / was not found
status exits 0 when the lock is held, 1 when it is free; release 0 when it deleted a lock,
1 when there was none. Full reference: docs/cli.md.
";

pub const HELP_RUN: &str = "\
dlock run [--url URL | --sentinel URL... --master NAME | --cluster URL...] --key KEY [options]
          -- COMMAND [ARGS...]

Takes the lock, runs COMMAND while holding it, releases it, and exits with COMMAND's status.
stdin, stdout and stderr pass through; SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
are forwarded to COMMAND (except those its terminal already sent it, like Ctrl-C).

  --url URL            Redis URL (redis://[:password@]host:port/db); default $REDIS_URL
  --sentinel URL       a Sentinel of the deployment (repeat for each), with --master NAME:
                       the lock is on the master they name; each write of the lock waits for a
                       replica to confirm it when the master has one, and a lock no replica
                       confirmed is not taken: COMMAND does not run (exit 69)
  --master NAME        the master's name in Sentinel (with --sentinel)
  --replica-acks A     auto (default: one replica through Sentinel or Cluster when the
                       primary has one when dlock meets it), off, or N replicas that must
                       confirm every write
                       (a job that must not run on a master cut off from its replicas when
                       dlock starts passes 1)
  --cluster URL        a node of a Redis Cluster (repeat for more seeds)
  --key KEY            the lock key
  --wait DUR           wait at most DUR for the lock (or 'forever'); default: the strategy's
                       retry policy (token, reentrant, fair: 10 s; classic: 5 retries 200 ms
                       apart)
  --no-wait            one attempt: exit 75 at once if the lock is busy (flock -n)
  --lease DUR          the lease, renewed every third of it while COMMAND runs (default 30s)
  --ttl DUR            a fixed lease instead, never renewed: COMMAND must finish within DUR;
                       when DUR passes the lock counts as lost (exit 79)
  --strategy S         token (default), classic (the legacy SETNX/GETSET timestamp lock),
                       reentrant (Redisson's RLock hash) or fair (first come, first served:
                       waiters queue in Redis and a release hands the lock to the first)
  --classic-encoding E the legacy family whose value format the key holds:
                       decimal (default: epoch ms, jedis-lock 1.0.0 and the SETNX recipe),
                       big-endian (8-byte epoch ms, plus a Redis TTL on the key and 1 s of
                       clock allowance, as the 8-byte legacy locker does), float-seconds
                       (redis-py's Lock before 2.10, retools), uuid-ms (<uuid>:<epoch ms>,
                       jedis-lock after 1.0.0) or nanos (epoch ns plus a Redis TTL on the key,
                       gorlock)
  --spring-registry R  beside Java services on Spring Integration's RedisLockRegistry with
                       registry key R: the lock is R:KEY (the registry's lock KEY), its value
                       a UUID, and the release wakes the registry's waiters on its channels
                       (instead of --strategy)
  --at-least DUR       a release before DUR after the acquire keeps the lock until then
                       (ShedLock's lockAtLeastFor): a job that ended early is not run
                       again elsewhere meanwhile (token locks)
  --shedlock NAME      instead of --key: the lock of ShedLock's job NAME (key
                       job-lock:ENV:NAME, ShedLock's value format), so that this command and
                       a Java @SchedulerLock job of that name never both run; the lease
                       (--ttl, or --lease) is its lockAtMostFor; use --no-wait to skip a busy
                       job as ShedLock does
  --shedlock-env ENV   ShedLock's environment (default: default)
  --permits N          at most N copies of COMMAND across hosts: take one permit of the
                       semaphore named by --key (Redisson's RPermitExpirableSemaphore
                       layout), set to N permits if it has never been set; the permit's
                       lease is --lease (renewed) or --ttl (fixed), as for a lock
  --kill-after DUR     after a loss, SIGKILL this long after SIGTERM (default 10s)
  --quiet              no message when the lock is busy or the wait timed out

Exit status: COMMAND's own (128+N if signal N killed it); 75 busy or timed out; 79 lock lost;
69 Redis unreachable; 65 the key is not a lock of this strategy; 64 usage; 126/127 COMMAND
could not be run / not found.
";

pub const HELP_STATUS: &str = "\
dlock status [--url URL | --sentinel URL... --master NAME | --cluster URL...] --key KEY

Prints the holder value, the kind of lock (token, classic, hash, fair) and its remaining
time; for a fair lock also how many waiters are queued.
Exit status: 0 held, 1 free (a classic lock whose expiry passed counts as free), 69 Redis
unreachable, 64 usage.
";

pub const HELP_RELEASE: &str = "\
dlock release [--url URL | --sentinel URL... --master NAME | --cluster URL...] --key KEY --force

Deletes the lock whoever holds it (a holder's 'dlock run' then sees it lost) and wakes the
waiters (a fair lock's queue stays: its first waiter takes the lock at its next poll).
--force is required. Exit status: 0 deleted, 1 there was no lock, 69 Redis unreachable,
64 usage.
";

/// A usage error: printed with a hint, exit 64.
#[derive(Debug)]
pub struct Usage(pub String);

fn usage<T>(msg: impl Into<String>) -> Result<T, Usage> {
    Err(Usage(msg.into()))
}

/// Parses `args` (without the program name); `env_url` is `$REDIS_URL`.
pub fn parse(args: Vec<OsString>, env_url: Option<String>) -> Result<Cmd, Usage> {
    let mut it = args.into_iter();
    let Some(sub) = it.next() else {
        return usage("no subcommand given (run, status or release)");
    };
    let sub = utf8(sub)?;
    match sub.as_str() {
        "-h" | "--help" => return Ok(Cmd::Help(HELP)),
        "-V" | "--version" => return Ok(Cmd::Version),
        "help" => {
            let topic = it.next().map(utf8).transpose()?;
            return match topic.as_deref() {
                None => Ok(Cmd::Help(HELP)),
                Some("run") => Ok(Cmd::Help(HELP_RUN)),
                Some("status") => Ok(Cmd::Help(HELP_STATUS)),
                Some("release") => Ok(Cmd::Help(HELP_RELEASE)),
                Some(other) => usage(format!("no help on {other:?}")),
            };
        }
        "run" | "status" | "release" => {}
        other => return usage(format!("unknown subcommand {other:?}")),
    }
    let mut o = Raw::default();
    while let Some(arg) = it.next() {
        // The command starts at `--` or at the first word that is not an option.
        if arg == "--" {
            o.command.extend(it.by_ref());
            break;
        }
        let is_option = arg.to_str().is_some_and(|s| s.starts_with('-') && s != "-");
        if !is_option {
            if sub != "run" {
                return usage(format!("unexpected argument {:?}", arg.to_string_lossy()));
            }
            o.command.push(arg);
            o.command.extend(it.by_ref());
            break;
        }
        let arg = utf8(arg)?;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, Usage> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => match it.next() {
                    Some(v) => utf8(v),
                    None => usage(format!("{name} needs a value")),
                },
            }
        };
        let flag = |name: &str| -> Result<(), Usage> {
            if inline.is_some() {
                usage(format!("{name} takes no value"))
            } else {
                Ok(())
            }
        };
        let run_only = |name: &str| -> Result<(), Usage> {
            if sub == "run" {
                Ok(())
            } else {
                usage(format!(
                    "{name} is an option of 'dlock run', not of 'dlock {sub}'"
                ))
            }
        };
        match name.as_str() {
            "-h" | "--help" => {
                return Ok(Cmd::Help(match sub.as_str() {
                    "run" => HELP_RUN,
                    "status" => HELP_STATUS,
                    _ => HELP_RELEASE,
                }))
            }
            "--url" => set(&mut o.url, &name, value(&name)?)?,
            "--sentinel" => o.sentinels.push(value(&name)?),
            "--master" => set(&mut o.master, &name, value(&name)?)?,
            "--cluster" => o.cluster.push(value(&name)?),
            "--replica-acks" => {
                run_only(&name)?;
                let v = value(&name)?;
                let acks = match v.as_str() {
                    "auto" => ReplicaAcks::Auto,
                    "off" => ReplicaAcks::Off,
                    n => match n.parse::<u32>() {
                        Ok(n) => ReplicaAcks::Require(n),
                        Err(_) => {
                            return usage(format!(
                                "--replica-acks must be auto, off or a number, not {v:?}"
                            ))
                        }
                    },
                };
                set(&mut o.replica_acks, &name, acks)?;
            }
            "--key" => set(&mut o.key, &name, value(&name)?)?,
            "--force" => {
                flag(&name)?;
                if sub != "release" {
                    return usage("--force is an option of 'dlock release'");
                }
                o.force = true;
            }
            "--wait" => {
                run_only(&name)?;
                let v = value(&name)?;
                let w = if v == "forever" {
                    Wait::Forever
                } else {
                    Wait::For(duration(&name, &v)?)
                };
                set(&mut o.wait, &name, w)?;
            }
            "--no-wait" => {
                run_only(&name)?;
                flag(&name)?;
                set(&mut o.wait, &name, Wait::No)?;
            }
            "--ttl" => {
                run_only(&name)?;
                let d = positive(&name, &value(&name)?)?;
                set(&mut o.ttl, &name, d)?;
            }
            "--lease" => {
                run_only(&name)?;
                let d = positive(&name, &value(&name)?)?;
                if d < MIN_LEASE {
                    return usage(format!("--lease must be at least {MIN_LEASE:?}"));
                }
                set(&mut o.lease, &name, d)?;
            }
            "--strategy" => {
                run_only(&name)?;
                let v = value(&name)?;
                let Some(s) = named(STRATEGIES, &v) else {
                    return usage(format!(
                        "--strategy must be {}, not {v:?}",
                        choices(STRATEGIES)
                    ));
                };
                set(&mut o.strategy, &name, s)?;
            }
            "--classic-encoding" => {
                run_only(&name)?;
                let v = value(&name)?;
                let Some(e) = named(ENCODINGS, &v) else {
                    return usage(format!(
                        "--classic-encoding must be {}, not {v:?}",
                        choices(ENCODINGS)
                    ));
                };
                set(&mut o.encoding, &name, e)?;
            }
            "--at-least" => {
                run_only(&name)?;
                let d = positive(&name, &value(&name)?)?;
                set(&mut o.at_least, &name, d)?;
            }
            "--shedlock" => {
                run_only(&name)?;
                let v = value(&name)?;
                set(&mut o.shedlock, &name, v)?;
            }
            "--shedlock-env" => {
                run_only(&name)?;
                let v = value(&name)?;
                set(&mut o.shedlock_env, &name, v)?;
            }
            "--spring-registry" => {
                run_only(&name)?;
                let v = value(&name)?;
                set(&mut o.spring_registry, &name, v)?;
            }
            "--permits" => {
                run_only(&name)?;
                let v = value(&name)?;
                match v.parse::<u64>() {
                    Ok(n) if n > 0 => set(&mut o.permits, &name, n)?,
                    _ => return usage(format!("--permits must be a number above 0, not {v:?}")),
                }
            }
            "--kill-after" => {
                run_only(&name)?;
                let d = duration(&name, &value(&name)?)?;
                set(&mut o.kill_after, &name, d)?;
            }
            "--quiet" | "-q" => {
                run_only(&name)?;
                flag(&name)?;
                o.quiet = true;
            }
            other => return usage(format!("unknown option {other:?}")),
        }
    }
    o.finish(&sub, env_url)
}

/// Options as given, before the checks that involve several of them.
#[derive(Default)]
struct Raw {
    url: Option<String>,
    replica_acks: Option<ReplicaAcks>,
    sentinels: Vec<String>,
    master: Option<String>,
    cluster: Vec<String>,
    key: Option<String>,
    force: bool,
    wait: Option<Wait>,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    strategy: Option<Strategy>,
    encoding: Option<Encoding>,
    spring_registry: Option<String>,
    at_least: Option<Duration>,
    shedlock: Option<String>,
    shedlock_env: Option<String>,
    permits: Option<u64>,
    kill_after: Option<Duration>,
    quiet: bool,
    command: Vec<OsString>,
}

impl Raw {
    fn finish(self, sub: &str, env_url: Option<String>) -> Result<Cmd, Usage> {
        let given = [
            self.url.is_some(),
            !self.sentinels.is_empty(),
            !self.cluster.is_empty(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return usage("pass one of --url, --sentinel and --cluster");
        }
        if self.master.is_some() && self.sentinels.is_empty() {
            return usage("--master names the master of --sentinel");
        }
        let (url, deployment) = if let Some(first) = self.sentinels.first() {
            let Some(master) = self.master else {
                return usage("--sentinel needs --master NAME (the master's name in Sentinel)");
            };
            let first = first.clone();
            (
                first,
                Deployment::Sentinel {
                    sentinels: self.sentinels,
                    master,
                },
            )
        } else if let Some(first) = self.cluster.first() {
            (first.clone(), Deployment::Cluster(self.cluster))
        } else {
            match self.url.or(env_url.filter(|u| !u.is_empty())) {
                Some(url) => (url, Deployment::Single),
                None => {
                    return usage(
                        "no Redis URL: pass --url URL (or --sentinel, or --cluster) or set \
                         REDIS_URL",
                    )
                }
            }
        };
        if self.shedlock_env.is_some() && self.shedlock.is_none() {
            return usage("--shedlock-env goes with --shedlock NAME");
        }
        let shedlock_key = match &self.shedlock {
            Some(_) if self.key.is_some() => {
                return usage("--shedlock NAME names the key: drop --key")
            }
            Some(_) if self.strategy.is_some() || self.spring_registry.is_some() => {
                return usage("--shedlock locks as ShedLock does (a token lock): drop --strategy")
            }
            Some(name) if name.is_empty() => return usage("--shedlock is empty"),
            Some(name) => Some(redis_dlock::shedlock_key(
                self.shedlock_env.as_deref().unwrap_or("default"),
                name,
            )),
            None => None,
        };
        let mut key = match self.key.or(shedlock_key) {
            Some(k) if !k.is_empty() => k,
            Some(_) => return usage("--key is empty"),
            None => return usage("--key KEY is required"),
        };
        let mut strategy = self.strategy;
        if let Some(registry) = &self.spring_registry {
            if strategy.is_some() {
                return usage("--spring-registry picks the strategy: drop --strategy");
            }
            let spring = SpringOptions::new(registry);
            if spring.registry() != registry {
                return usage(format!(
                    "--spring-registry: a registry key is at most {} bytes",
                    redis_dlock::SpringOptions::MAX_REGISTRY_LEN
                ));
            }
            // The registry's Redis key for its lock KEY.
            key = spring.key(&key);
            strategy = Some(Strategy::Spring(spring));
        }
        let target = Target {
            url,
            key,
            deployment,
        };
        match sub {
            "status" => Ok(Cmd::Status(target)),
            "release" => {
                if !self.force {
                    return usage(
                        "release deletes the lock whoever holds it: pass --force to confirm",
                    );
                }
                Ok(Cmd::Release(target))
            }
            _ => {
                if self.command.is_empty() {
                    return usage("no command given: dlock run ... -- COMMAND [ARGS...]");
                }
                if self.ttl.is_some() && self.lease.is_some() {
                    return usage(
                        "--ttl (a fixed lease) and --lease (a renewed one) exclude each other",
                    );
                }
                if self.permits.is_some()
                    && (strategy.is_some()
                        || self.encoding.is_some()
                        || self.at_least.is_some()
                        || self.shedlock.is_some())
                {
                    return usage(
                        "--permits takes a semaphore's permit, not a lock: drop --strategy, \
                         --classic-encoding, --spring-registry, --shedlock and --at-least",
                    );
                }
                let strategy = strategy.unwrap_or(Strategy::Token);
                if self.encoding.is_some() && !matches!(strategy, Strategy::Classic(_)) {
                    return usage("--classic-encoding needs --strategy classic");
                }
                if self.at_least.is_some()
                    && !matches!(strategy, Strategy::Token | Strategy::Spring(_))
                {
                    return usage("--at-least applies to token locks (and --spring-registry)");
                }
                Ok(Cmd::Run(Box::new(RunOpts {
                    target,
                    wait: self.wait.unwrap_or(Wait::Default),
                    ttl: self.ttl,
                    lease: self.lease.unwrap_or(DEFAULT_LEASE),
                    strategy,
                    encoding: self.encoding.unwrap_or(Encoding::Decimal),
                    kill_after: self.kill_after.unwrap_or(DEFAULT_KILL_AFTER),
                    quiet: self.quiet,
                    replica_acks: self.replica_acks.unwrap_or_default(),
                    at_least: self.at_least,
                    shedlock: self.shedlock.is_some(),
                    permits: self.permits,
                    command: self.command,
                })))
            }
        }
    }
}

fn set<T>(slot: &mut Option<T>, name: &str, value: T) -> Result<(), Usage> {
    if slot.is_some() {
        return usage(format!(
            "{name} given twice (or with an option it excludes)"
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn utf8(arg: OsString) -> Result<String, Usage> {
    arg.into_string().or_else(|a| {
        usage(format!(
            "argument {:?} is not valid UTF-8",
            a.to_string_lossy()
        ))
    })
}

fn positive(name: &str, s: &str) -> Result<Duration, Usage> {
    let d = duration(name, s)?;
    if d.as_millis() == 0 {
        return usage(format!("{name} must be at least 1ms"));
    }
    Ok(d)
}

/// `500ms`, `10s`, `1.5s`, `5m`, `2h`, or a plain number of seconds (as flock's `-w`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return None;
    }
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    // Bounded far below what Duration holds (and below the library's MAX_TTL).
    if !secs.is_finite() || !(0.0..=1.0e9).contains(&secs) {
        return None;
    }
    Some(Duration::from_secs_f64(secs))
}

fn duration(name: &str, s: &str) -> Result<Duration, Usage> {
    match parse_duration(s) {
        Some(d) => Ok(d),
        None => usage(format!(
            "{name}: {s:?} is not a duration (examples: 500ms, 10s, 1.5s, 5m, 2h)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        for bad in ["", "s", "-1", "1x", "1e3", "ten", ".", "1.2.3"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn run_line() {
        let cmd = parse(
            args(&[
                "run",
                "--key=k",
                "--no-wait",
                "--ttl",
                "5s",
                "--",
                "echo",
                "--key",
                "x",
            ]),
            Some("redis://h/".into()),
        )
        .expect("valid");
        let Cmd::Run(o) = cmd else {
            panic!("not run: {cmd:?}")
        };
        assert_eq!(o.target.url, "redis://h/");
        assert_eq!(o.target.key, "k");
        assert_eq!(o.wait, Wait::No);
        assert_eq!(o.ttl, Some(Duration::from_secs(5)));
        assert_eq!(o.command, args(&["echo", "--key", "x"]));
        // Without `--`, the first non-option word starts the command.
        let Ok(Cmd::Run(o)) = parse(args(&["run", "--url", "u", "--key", "k", "ls", "-l"]), None)
        else {
            panic!("valid")
        };
        assert_eq!(o.command, args(&["ls", "-l"]));
        assert_eq!(o.target.url, "u");
        let Ok(Cmd::Run(o)) = parse(
            args(&["run", "--key", "k", "--strategy", "fair", "--", "true"]),
            Some("redis://h/".into()),
        ) else {
            panic!("valid")
        };
        assert_eq!(o.strategy, Strategy::Fair);
        // The registry's key of its lock `k`, and the strategy.
        let Ok(Cmd::Run(o)) = parse(
            args(&[
                "run",
                "--spring-registry",
                "orders",
                "--key",
                "k",
                "--",
                "true",
            ]),
            Some("redis://h/".into()),
        ) else {
            panic!("valid")
        };
        assert_eq!(o.target.key, "orders:k");
        assert_eq!(o.strategy, Strategy::Spring(SpringOptions::new("orders")));
        let both = parse(
            args(&[
                "run",
                "--spring-registry",
                "orders",
                "--strategy",
                "token",
                "--key",
                "k",
                "--",
                "true",
            ]),
            Some("redis://h/".into()),
        );
        assert!(both.is_err(), "{both:?}");
    }

    #[test]
    fn names_map_onto_the_library() {
        for (name, strategy) in STRATEGIES {
            let Ok(Cmd::Run(o)) = parse(
                args(&["run", "--key", "k", "--strategy", name, "--", "true"]),
                Some("redis://h/".into()),
            ) else {
                panic!("valid: {name}")
            };
            assert_eq!(o.strategy, *strategy);
            assert_eq!(name_of(STRATEGIES, strategy), Some(*name));
        }
        for (name, encoding) in ENCODINGS {
            let flag = format!("--classic-encoding={name}");
            let run = [
                "run",
                "--key",
                "k",
                "--strategy=classic",
                &flag,
                "--",
                "true",
            ];
            let Ok(Cmd::Run(o)) = parse(args(&run), Some("redis://h/".into())) else {
                panic!("{name} is valid")
            };
            assert_eq!(o.encoding, *encoding, "{name}");
            assert_eq!(name_of(ENCODINGS, encoding), Some(*name));
        }
        assert_eq!(name_of(ENCODINGS, &Encoding::Decimal), Some("decimal"));
        let Err(Usage(msg)) = parse(
            args(&["run", "--key", "k", "--strategy", "bogus", "--", "true"]),
            None,
        ) else {
            panic!("invalid")
        };
        assert_eq!(
            msg,
            "--strategy must be token, classic, reentrant or fair, not \"bogus\""
        );
        let Err(Usage(msg)) = parse(
            args(&[
                "run",
                "--key",
                "k",
                "--strategy",
                "classic",
                "--classic-encoding",
                "hex",
                "--",
                "true",
            ]),
            None,
        ) else {
            panic!("invalid")
        };
        assert_eq!(
            msg,
            "--classic-encoding must be decimal, big-endian, float-seconds, uuid-ms or nanos, \
             not \"hex\""
        );
    }

    #[test]
    fn permits() {
        let run = |a: &[&str]| parse(args(a), Some("redis://env/".into()));
        let Ok(Cmd::Run(o)) = run(&["run", "--key", "k", "--permits", "3", "--", "true"]) else {
            panic!("valid")
        };
        assert_eq!(o.permits, Some(3));
        let Ok(Cmd::Run(o)) = run(&["run", "--key", "k", "--", "true"]) else {
            panic!("valid")
        };
        assert_eq!(o.permits, None);
        for bad in [
            &["run", "--key", "k", "--permits", "0", "--", "true"][..],
            &["run", "--key", "k", "--permits", "two", "--", "true"],
            &[
                "run",
                "--key",
                "k",
                "--permits",
                "2",
                "--strategy",
                "fair",
                "--",
                "true",
            ],
            &[
                "run",
                "--key",
                "k",
                "--permits",
                "2",
                "--at-least",
                "1s",
                "--",
                "true",
            ],
            &["run", "--shedlock", "job", "--permits", "2", "--", "true"],
            &["status", "--key", "k", "--permits", "2"],
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deployments() {
        let run = |a: &[&str]| parse(args(a), Some("redis://env/".into()));
        let Ok(Cmd::Run(o)) = run(&[
            "run",
            "--sentinel",
            "redis://s1/",
            "--sentinel",
            "redis://s2/",
            "--master",
            "m",
            "--key",
            "k",
            "--replica-acks",
            "2",
            "--",
            "true",
        ]) else {
            panic!("valid")
        };
        assert_eq!(
            o.target.deployment,
            Deployment::Sentinel {
                sentinels: vec!["redis://s1/".into(), "redis://s2/".into()],
                master: "m".into()
            }
        );
        assert_eq!(o.target.url, "redis://s1/");
        assert_eq!(o.replica_acks, ReplicaAcks::Require(2));
        let Ok(Cmd::Status(t)) = run(&["status", "--cluster", "redis://c/", "--key", "k"]) else {
            panic!("valid")
        };
        assert_eq!(t.deployment, Deployment::Cluster(vec!["redis://c/".into()]));
        let Ok(Cmd::Run(o)) = run(&["run", "--key", "k", "--", "true"]) else {
            panic!("valid")
        };
        assert_eq!(
            (o.target.deployment, o.replica_acks),
            (Deployment::Single, ReplicaAcks::Auto)
        );
        for bad in [
            &["status", "--sentinel", "redis://s/", "--key", "k"][..],
            &["status", "--master", "m", "--key", "k"],
            &["status", "--url", "u", "--cluster", "c", "--key", "k"],
            &["status", "--replica-acks", "1", "--key", "k"],
            &["run", "--replica-acks", "some", "--key", "k", "--", "true"],
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn usage_errors() {
        let url = || Some("redis://h/".to_owned());
        for bad in [
            &["run", "--key", "k"][..],
            &[
                "run",
                "--key",
                "k",
                "--wait",
                "1",
                "--no-wait",
                "--",
                "true",
            ],
            &[
                "run", "--key", "k", "--ttl", "1", "--lease", "1", "--", "true",
            ],
            &[
                "run",
                "--key",
                "k",
                "--classic-encoding",
                "decimal",
                "--",
                "true",
            ],
            &["run", "--key", "k", "--strategy", "bogus", "--", "true"],
            &["run", "--key", "k", "--bogus", "--", "true"],
            &["run", "--key", "k", "--wait", "soon", "--", "true"],
            &["status"],
            &["status", "--key", "k", "--no-wait"],
            &["release", "--key", "k"],
            &["frobnicate"],
            &[],
        ] {
            assert!(parse(args(bad), url()).is_err(), "{bad:?}");
        }
        assert!(parse(args(&["status", "--key", "k"]), None).is_err());
        assert!(matches!(
            parse(args(&["release", "--key", "k", "--force"]), url()),
            Ok(Cmd::Release(_))
        ));
    }
}
