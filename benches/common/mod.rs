//! Shared helpers of the bench binaries (`benches/*.rs`): the throw-away Redis server of the test
//! fixture, CPU pinning, the round-trip floors every figure is divided by, simple statistics and
//! the machine-readable results that `benches/bench_report.rs` turns into `docs/benchmarks.md`.
//!
//! Lives in a subdirectory so that cargo does not take it for a bench target of its own.
#![allow(dead_code)]

#[path = "../../tests/support/mod.rs"]
mod support;

use std::fmt::Display;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::Criterion;
#[cfg(feature = "tls-rustls")]
#[allow(unused_imports)] // used by benches/tls.rs only
pub use support::tls::Pki;
pub use support::RedisServer;

/// `lua/unlock.lua`, the compare-and-delete both strategies release with (Token with two more
/// arguments, the message and the channel: it also publishes the release).
pub const UNLOCK_LUA: &str = include_str!("../../lua/unlock.lua");
/// `lua/reentrant_acquire.lua` and `lua/reentrant_release.lua`: the Reentrant lock's commands.
pub const REENTRANT_ACQUIRE_LUA: &str = include_str!("../../lua/reentrant_acquire.lua");
pub const REENTRANT_RELEASE_LUA: &str = include_str!("../../lua/reentrant_release.lua");
/// What a release publishes (Redisson's unlock message).
pub const UNLOCK_MESSAGE: &str = "0";

/// Same timeouts as `LockClient`'s default pool, so floors use the same kind of connection.
pub const POOL_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// How the binary was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `cargo bench`: full measurements, results written for the report.
    Full,
    /// `cargo test --benches` (or `-- --test`): every code path once, briefly; nothing written.
    Smoke,
    /// `-- --list`: criterion lists its benchmarks; nothing measured.
    List,
}

/// One bench binary's environment: its own redis-server, pinning, mode and results.
pub struct BenchEnv {
    pub name: &'static str,
    pub server: RedisServer,
    pub mode: Mode,
    pub pinned: bool,
    pub pinning: String,
    results: Vec<String>,
    started: Instant,
}

impl BenchEnv {
    /// Starts a redis-server for bench `name`, pins it and this process, records the machine.
    pub fn start(name: &'static str) -> BenchEnv {
        Self::start_on(name, RedisServer::start())
    }

    /// Like [`start`](Self::start) on a server the caller started (e.g. one with a TLS port).
    pub fn start_on(name: &'static str, server: RedisServer) -> BenchEnv {
        let args: Vec<String> = std::env::args().collect();
        let has = |flag: &str| args.iter().any(|a| a == flag);
        let mode = if has("--list") {
            Mode::List
        } else if has("--bench") && !has("--test") {
            Mode::Full
        } else {
            Mode::Smoke
        };
        let started = Instant::now();
        let (pinned, pinning) = if std::env::var_os("DLOCK_BENCH_NO_PIN").is_some() {
            (false, "unpinned (DLOCK_BENCH_NO_PIN set)".to_owned())
        } else {
            pin(server.pid())
        };
        let mut env = BenchEnv {
            name,
            server,
            mode,
            pinned,
            pinning,
            results: Vec::new(),
            started,
        };
        println!("[{name}] mode {mode:?}; {}", env.pinning);
        env.record_machine();
        env
    }

    /// The server's product and version (`redis 7.0.15`, `valkey 9.1.2`), by `INFO server`.
    pub fn server_version(&self) -> String {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.server.conn())
            .unwrap_or_default();
        server_version_of(&info)
    }

    pub fn full(&self) -> bool {
        self.mode == Mode::Full
    }

    pub fn measuring(&self) -> bool {
        self.mode != Mode::List
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Picks the full-run value or the smoke-run one.
    pub fn pick<T>(&self, full: T, smoke: T) -> T {
        if self.full() {
            full
        } else {
            smoke
        }
    }

    /// Records one result row: `section,name,metric,value`.
    pub fn put(&mut self, section: &str, name: &str, metric: &str, value: impl Display) {
        self.results
            .push(format!("{section},{name},{metric},{value}"));
    }

    /// Records a [`Stats`] (all in nanoseconds) under `section,name`.
    pub fn put_stats(&mut self, section: &str, name: &str, s: &Stats) {
        self.put(section, name, "n", s.n);
        self.put(section, name, "mean_ns", fmt_f(s.mean));
        self.put(section, name, "min_ns", fmt_f(s.min));
        self.put(section, name, "p50_ns", fmt_f(s.p50));
        self.put(section, name, "p90_ns", fmt_f(s.p90));
        self.put(section, name, "p99_ns", fmt_f(s.p99));
        self.put(section, name, "max_ns", fmt_f(s.max));
    }

    fn record_machine(&mut self) {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let nproc = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count();
        let model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let mut con = self.server.conn();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut con)
            .unwrap_or_default();
        let redis_version = server_version_of(&info);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        let rustc = command_output("rustc", &["-V"]);
        let git = command_output("git", &["describe", "--always", "--dirty"]);
        let date = command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]);
        let loadavg = loadavg();
        let pinning = self.pinning.clone();
        let pinned = self.pinned;
        for (metric, value) in [
            ("nproc", nproc.to_string()),
            ("cpu_model", model),
            ("redis_version", redis_version),
            ("kernel", kernel),
            ("rustc", rustc),
            ("git", git),
            ("date", date),
            ("pinned", pinned.to_string()),
            ("pinning", pinning),
            ("loadavg", loadavg),
        ] {
            let value = value.replace([',', '\n'], " ");
            self.put("meta", "machine", metric, value);
        }
    }

    /// Writes `target/dlock-bench/<name>.csv` (full runs only) and prints the wall time.
    pub fn finish(mut self) {
        let wall = self.started.elapsed();
        self.put(
            "meta",
            "run",
            "wall_s",
            format!("{:.1}", wall.as_secs_f64()),
        );
        self.put("meta", "run", "loadavg_end", loadavg());
        println!("[{}] done in {:.1} s", self.name, wall.as_secs_f64());
        if self.mode != Mode::Full {
            return;
        }
        let dir = results_dir();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("[{}] cannot create {}: {e}", self.name, dir.display());
            return;
        }
        let path = dir.join(format!("{}.csv", self.name));
        let mut text = String::from("section,name,metric,value\n");
        for row in &self.results {
            text.push_str(row);
            text.push('\n');
        }
        match std::fs::write(&path, text) {
            Ok(()) => println!("[{}] results in {}", self.name, path.display()),
            Err(e) => eprintln!("[{}] cannot write {}: {e}", self.name, path.display()),
        }
    }
}

/// The 1, 5 and 15 minute load averages (other work on the machine skews the figures).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Runs a command and returns its trimmed stdout, or "unknown".
pub fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn taskset(cpus: &str, pid: u32) -> Result<(), String> {
    let out = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("taskset: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "taskset -a -pc {cpus} {pid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Pins redis-server (all its threads) to CPU 1 and this process (all threads, so every thread
/// spawned later too) to CPU 0. Falls back to unpinned, undoing a half-done pinning.
fn pin(server_pid: u32) -> (bool, String) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return (
            false,
            format!("unpinned: only {cpus} CPU available to the process"),
        );
    }
    if let Err(e) = taskset("1", server_pid) {
        return (false, format!("unpinned: {e}"));
    }
    if let Err(e) = taskset("0", std::process::id()) {
        let _ = taskset(&format!("0-{}", cpus - 1), server_pid);
        return (false, format!("unpinned: {e}"));
    }
    (
        true,
        "pinned: redis-server on CPU 1; bench process (all threads) on CPU 0".to_owned(),
    )
}

/// Moves redis-server to `cpus` (e.g. "0" to measure the same-core round trip).
pub fn repin_server(env: &BenchEnv, cpus: &str) -> bool {
    taskset(cpus, env.server.pid()).is_ok()
}

/// `target/dlock-bench`, found from this executable's location
/// (`target/<profile>/deps/<bench>` or `target/<profile>/examples/<example>`).
pub fn results_dir() -> PathBuf {
    let exe = std::env::current_exe().ok();
    let target = exe.as_deref().and_then(|exe| {
        let dir = exe.parent()?;
        let name = dir.file_name()?.to_str()?;
        if name == "deps" || name == "examples" {
            Some(dir.parent()?.parent()?.to_path_buf())
        } else {
            None
        }
    });
    target
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
        .join("dlock-bench")
}

/// Criterion with short times, so that the whole `cargo bench` stays within minutes on 2 cores.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .nresamples(20_000)
        .configure_from_args()
}

// ---------------------------------------------------------------------------------------------
// Connections and the floor operations

#[derive(Debug)]
struct Timeouts;

impl r2d2::CustomizeConnection<redis::Connection, redis::RedisError> for Timeouts {
    fn on_acquire(&self, con: &mut redis::Connection) -> Result<(), redis::RedisError> {
        con.set_read_timeout(Some(POOL_COMMAND_TIMEOUT))?;
        con.set_write_timeout(Some(POOL_COMMAND_TIMEOUT))
    }
}

/// An `r2d2::Pool<redis::Client>` configured like `LockClient`'s: no checkout PING, lazy
/// connections, 2 s command timeouts. Warmed with `warm` open connections.
pub fn floor_pool(url: &str, size: u32, warm: u32) -> r2d2::Pool<redis::Client> {
    floor_pool_of(redis::Client::open(url).expect("valid url"), size, warm)
}

/// [`floor_pool`] of a client built by the caller (e.g. with TLS certificates).
pub fn floor_pool_of(client: redis::Client, size: u32, warm: u32) -> r2d2::Pool<redis::Client> {
    let pool = r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .test_on_check_out(false)
        .connection_timeout(Duration::from_secs(5))
        .connection_customizer(Box::new(Timeouts))
        .build_unchecked(client);
    let held: Vec<_> = (0..warm.min(size))
        .map(|_| pool.get().expect("pooled connection"))
        .collect();
    drop(held);
    pool
}

/// A `LockClient` built by its own builder (pool without checkout PING, 2 s timeouts).
pub fn lock_client(url: &str, pool_size: u32) -> redis_dlock::LockClient {
    redis_dlock::LockClient::builder(url)
        .pool_size(pool_size)
        .build()
        .expect("lock client")
}

/// One PING round trip (command built and packed by redis-rs, like every library command).
pub fn ping(con: &mut redis::Connection) {
    let pong: String = redis::cmd("PING").query(con).expect("PING");
    debug_assert_eq!(pong, "PONG");
}

/// One PING round trip from pre-packed bytes: no command building at all.
pub fn ping_prepacked(con: &mut redis::Connection) {
    use redis::ConnectionLike;
    let v = con
        .req_packed_command(b"*1\r\n$4\r\nPING\r\n")
        .expect("PING");
    debug_assert!(matches!(v, redis::Value::SimpleString(_)));
}

/// A 32-hex-character random token, generated exactly as `src/primitives/token.rs` does.
pub fn token() -> [u8; 32] {
    redis_dlock::bench_hooks::token()
}

/// `SET key value NX PX ttl_ms`: true when set.
pub fn set_nx_px(con: &mut redis::Connection, key: &str, value: &[u8], ttl_ms: u64) -> bool {
    let v: redis::Value = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query(con)
        .expect("SET NX PX");
    v == redis::Value::Okay
}

/// `SET key value NX PX ttl_ms GET` (what the Token lock's `try_lock` sends on Redis 7):
/// true when set (the reply is nil: the key was absent).
pub fn set_nx_px_get(con: &mut redis::Connection, key: &str, value: &[u8], ttl_ms: u64) -> bool {
    let v: redis::Value = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .arg("GET")
        .query(con)
        .expect("SET NX PX GET");
    v == redis::Value::Nil
}

/// `SETNX key value`: true when set.
pub fn setnx(con: &mut redis::Connection, key: &str, value: &[u8]) -> bool {
    let v: i64 = redis::cmd("SETNX")
        .arg(key)
        .arg(value)
        .query(con)
        .expect("SETNX");
    v == 1
}

/// `EVALSHA <unlock.lua> 1 key value`: true when deleted.
pub fn evalsha_unlock(con: &mut redis::Connection, sha: &str, key: &str, value: &[u8]) -> bool {
    let v: i64 = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(value)
        .query(con)
        .expect("EVALSHA");
    v == 1
}

/// `EVALSHA <unlock.lua> 1 key value 0 channel`: the Token release exactly as the library
/// sends it (compare-and-delete, then `PUBLISH channel 0`; the channel is an argument, not a
/// key). True when deleted (the reply is then 1 + the message's receivers).
pub fn evalsha_unlock_publish(
    con: &mut redis::Connection,
    sha: &str,
    key: &str,
    channel: &str,
    value: &[u8],
) -> bool {
    let v: i64 = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(value)
        .arg(UNLOCK_MESSAGE)
        .arg(channel)
        .query(con)
        .expect("EVALSHA");
    v >= 1
}

/// The release channel of a key without braces, as the library names it
/// (`redisson_lock__channel:{key}`, Redisson's name, in the key's cluster slot).
pub fn channel(key: &str) -> String {
    assert!(!key.contains('{'), "bench keys carry no hash tag");
    format!("redisson_lock__channel:{{{key}}}")
}

/// `EVALSHA <reentrant_acquire.lua> 1 key lease_ms owner 0`, as the library sends a first
/// hold (the last argument: the thread's own count): true when taken.
pub fn evalsha_reentrant_acquire(
    con: &mut redis::Connection,
    sha: &str,
    key: &str,
    lease_ms: u64,
    owner: &str,
) -> bool {
    let v: (i64, i64) = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(lease_ms)
        .arg(owner)
        .arg(0)
        .query(con)
        .expect("EVALSHA reentrant_acquire");
    v.0 == 1
}

/// `EVALSHA <reentrant_release.lua> 1 key 0 lease_ms owner channel request_id`, as the library
/// sends it (a fresh request id per call): true when this was the last hold (deleted and
/// published; the reply is then 1 + the message's receivers).
pub fn evalsha_reentrant_release(
    con: &mut redis::Connection,
    sha: &str,
    key: &str,
    channel: &str,
    lease_ms: u64,
    owner: &str,
) -> bool {
    let request = token();
    let v: Option<i64> = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(UNLOCK_MESSAGE)
        .arg(lease_ms)
        .arg(owner)
        .arg(channel)
        .arg(&request[..])
        .query(con)
        .expect("EVALSHA reentrant_release");
    // The last hold: 1 + the receivers of the published release.
    v.is_some_and(|n| n >= 1)
}

/// Loads a script on the server and returns its SHA1.
pub fn load_script(con: &mut redis::Connection, code: &str) -> String {
    let script = redis::Script::new(code);
    script.load(con).expect("SCRIPT LOAD");
    script.get_hash().to_owned()
}

/// A fair lock's token: a 16-hex-character client id and 32 random hex characters.
pub fn fair_token() -> [u8; 48] {
    let mut t = [b'0'; 48];
    t[..16].copy_from_slice(b"00000000bec4c1e5");
    t[16..].copy_from_slice(&token());
    t
}

/// `EVALSHA <fair_release.lua> 3 key dlock_fair_q:{key} dlock_fair_d:{key} value 600
/// dlock_fair_ch:`: the fair lock's release as the library sends it when nobody is queued (no
/// `PING` in front: the lock object has not found the lock held). True when released (the
/// reply is 1: deleted, nobody to grant to).
pub fn evalsha_fair_release(
    con: &mut redis::Connection,
    sha: &str,
    key: &str,
    value: &[u8],
) -> bool {
    assert!(!key.contains('{'), "bench keys carry no hash tag");
    let v: redis::Value = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(3)
        .arg(key)
        .arg(format!("dlock_fair_q:{{{key}}}"))
        .arg(format!("dlock_fair_d:{{{key}}}"))
        .arg(value)
        .arg(600)
        .arg("dlock_fair_ch:")
        .query(con)
        .expect("EVALSHA fair_release");
    v == redis::Value::Int(1)
}

/// Loads unlock.lua on the server and returns its SHA1.
pub fn load_unlock(con: &mut redis::Connection) -> String {
    load_script(con, UNLOCK_LUA)
}

/// Wall-clock epoch ms encoded in decimal: the Classic value (`now + ttl + 1`).
pub fn classic_value(ttl_ms: i64) -> ([u8; 20], usize) {
    redis_dlock::bench_hooks::classic_value(
        redis_dlock::Encoding::Decimal,
        Duration::from_millis(ttl_ms as u64),
    )
    .expect("clock after 1970")
}

// ---------------------------------------------------------------------------------------------
// Measurement

/// A named operation measured op by op.
pub struct Variant<'a> {
    pub name: &'static str,
    pub op: Box<dyn FnMut() + 'a>,
}

impl<'a> Variant<'a> {
    pub fn new(name: &'static str, op: impl FnMut() + 'a) -> Self {
        Variant {
            name,
            op: Box::new(op),
        }
    }
}

/// Runs the variants in interleaved rounds (`per_round` timed ops each, the starting variant
/// rotating every round) so that a drift of the machine hits all alike. Returns every op's
/// duration in ns per variant, in the order given.
pub fn interleaved(variants: &mut [Variant<'_>], rounds: usize, per_round: usize) -> Vec<Vec<u64>> {
    let n = variants.len();
    for v in variants.iter_mut() {
        for _ in 0..per_round.min(200) {
            (v.op)();
        }
    }
    let mut out: Vec<Vec<u64>> = (0..n)
        .map(|_| Vec::with_capacity(rounds * per_round))
        .collect();
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let v = &mut variants[i];
            for _ in 0..per_round {
                let t = Instant::now();
                (v.op)();
                out[i].push(t.elapsed().as_nanos() as u64);
            }
        }
    }
    out
}

/// Drift-robust ratio of two interleaved samples (as returned by [`interleaved`], before any
/// sorting): the median over rounds of (median of `a` in the round) / (median of `b` in the
/// round). Adjacent blocks of one round ran within a fraction of a second of each other.
pub fn paired_ratio(a: &[u64], b: &[u64], per: usize) -> f64 {
    let rounds = a.len().min(b.len()) / per.max(1);
    let median = |s: &[u64]| {
        let mut v = s.to_vec();
        v.sort_unstable();
        quantile(&v, 0.5) as f64
    };
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|r| {
            let range = r * per..(r + 1) * per;
            median(&a[range.clone()]) / median(&b[range])
        })
        .collect();
    if ratios.is_empty() {
        return f64::NAN;
    }
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

/// The median, lowest and highest of `v` (the median of an even count is the upper middle one).
pub fn median_lo_hi(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(&lo), Some(&hi)) => (v[v.len() / 2], lo, hi),
        _ => (0.0, 0.0, 0.0),
    }
}

/// The number in the environment variable `k`, or `d`.
pub fn env_num(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Order statistics of a sample of durations (ns).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(sample: &mut [u64]) -> Stats {
        if sample.is_empty() {
            return Stats::default();
        }
        sample.sort_unstable();
        let sum: u128 = sample.iter().map(|&x| x as u128).sum();
        Stats {
            n: sample.len(),
            mean: sum as f64 / sample.len() as f64,
            min: sample[0] as f64,
            p50: quantile(sample, 0.50) as f64,
            p90: quantile(sample, 0.90) as f64,
            p99: quantile(sample, 0.99) as f64,
            max: sample[sample.len() - 1] as f64,
        }
    }
}

/// Nearest-rank quantile of a sorted sample.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Quantiles of a sorted sample on a "nines" scale for percentile plots: `q:value` pairs,
/// space-separated, for q = 1 - 10^(-k/10), k = 0..=35 (0 % … 99.97 %), then `1:max`.
pub fn percentile_points(sorted: &[u64]) -> String {
    let mut out: Vec<String> = (0..=35)
        .map(|k| {
            let q = 1.0 - 10f64.powf(-(k as f64) / 10.0);
            format!("{q:.6}:{}", quantile(sorted, q))
        })
        .collect();
    out.push(format!("1:{}", sorted.last().copied().unwrap_or(0)));
    out.join(" ")
}

pub fn fmt_f(x: f64) -> String {
    format!("{x:.1}")
}

pub fn us(ns: f64) -> String {
    format!("{:.1} µs", ns / 1000.0)
}

/// The single-thread pooled-PING floor of this run, measured interleaved with the raw PING.
/// Records `floor,ping_pool|ping_raw,*` and returns the pooled PING's median (ns).
pub fn measure_ping_floor(env: &mut BenchEnv, pool: &r2d2::Pool<redis::Client>) -> f64 {
    let mut raw = env.server.conn();
    let (rounds, per) = env.pick((10, 300), (2, 20));
    let mut samples = {
        let mut variants = [
            Variant::new("ping_pool", || {
                let mut c = pool.get().expect("pooled connection");
                ping(&mut c);
            }),
            Variant::new("ping_raw", || ping(&mut raw)),
        ];
        interleaved(&mut variants, rounds, per)
    };
    let pool_stats = Stats::of(&mut samples[0]);
    let raw_stats = Stats::of(&mut samples[1]);
    env.put_stats("floor", "ping_pool", &pool_stats);
    env.put_stats("floor", "ping_raw", &raw_stats);
    println!(
        "[{}] floor: PING pooled p50 {}, raw p50 {}",
        env.name,
        us(pool_stats.p50),
        us(raw_stats.p50)
    );
    pool_stats.p50
}

/// `valkey <valkey_version>` for Valkey, else `redis <redis_version>` (Valkey reports a
/// `redis_version` too, for compatibility), from an `INFO server` text.
fn server_version_of(info: &str) -> String {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    match (field("valkey_version:"), field("redis_version:")) {
        (Some(v), _) => format!("valkey {v}"),
        (None, Some(v)) => format!("redis {v}"),
        (None, None) => "unknown".to_owned(),
    }
}
