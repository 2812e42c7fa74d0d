//! Contention demo: 8 threads fight over one lock, per strategy (Token, Reentrant, Classic),
//! against a real Redis.
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! Uses `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server` on a free
//! loopback port (no persistence, private temporary directory) and kills it at the end, also
//! when the demo fails. Each critical section increments a counter in Redis with a deliberately
//! non-atomic `GET` + `SET`, and an in-process probe counts how many threads are inside at once:
//! a correct lock loses no increment and never sees two holders. The demo exits non-zero if it
//! does.

use std::error::Error;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::RngExt;
use redis_dlock::ClassicOptions;
use redis_dlock::{DistributedLock, LockClient, LockError, Strategy};

/// Contending worker threads per strategy.
const WORKERS: usize = 8;
/// How long the workers keep taking the lock, per strategy.
const RUN_FOR: Duration = Duration::from_secs(3);
/// Simulated work inside the critical section, between the counter's GET and SET: it widens
/// the window in which a broken lock would lose an update.
const WORK_INSIDE: Duration = Duration::from_millis(1);
/// Most time a worker spends outside the lock between two sections (uniformly random).
const MAX_THINK_MS: u64 = 10;
/// Timeouts of the demo's own counter connections.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

type BoxError = Box<dyn Error + Send + Sync>;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: the lock did not provide mutual exclusion (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs both strategies; `Ok(false)` when a run found a correctness problem.
fn run() -> Result<bool, BoxError> {
    // Declared first so it is dropped (the server killed) last, on every return path.
    let mut _server: Option<LocalRedis> = None;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            println!("redis: using REDIS_URL");
            url
        }
        _ => {
            let server = LocalRedis::start()?;
            println!(
                "redis: started a throw-away redis-server on 127.0.0.1:{} (pid {})",
                server.port,
                server.child.id()
            );
            let url = server.url();
            _server = Some(server);
            url
        }
    };
    println!(
        "{WORKERS} threads, each with its own LockClient, contend for one key for {RUN_FOR:?} per \
         strategy (default options);\neach critical section is a non-atomic GET+SET increment of \
         a Redis counter. wait = time in lock() until\nacquired; timeouts = lock() calls that \
         gave up under the retry policy.\n"
    );

    let mut ok = true;
    for (name, strategy) in [
        ("token", Strategy::Token),
        ("reentrant", Strategy::Reentrant),
        ("classic", Strategy::Classic(ClassicOptions::new())),
    ] {
        let report = contend(&url, name, strategy)?;
        report.print();
        ok &= report.passed();
        println!();
    }
    println!("{}", if ok { "all good" } else { "FAILED" });
    Ok(ok)
}

/// What one worker saw.
#[derive(Debug, Default)]
struct WorkerStats {
    acquired: u64,
    wait_total: Duration,
    wait_max: Duration,
    timeouts: u64,
    violations: u64,
    lost: u64,
    error: Option<String>,
}

/// One strategy's run.
struct Report {
    workers: Vec<WorkerStats>,
    counter: i64,
    elapsed: Duration,
}

impl Report {
    fn total(&self, f: impl Fn(&WorkerStats) -> u64) -> u64 {
        self.workers.iter().map(f).sum()
    }

    fn expected(&self) -> i64 {
        self.total(|w| w.acquired) as i64
    }

    fn passed(&self) -> bool {
        self.total(|w| w.violations) == 0
            && self.counter == self.expected()
            && self.workers.iter().all(|w| w.error.is_none())
    }

    fn print(&self) {
        println!("  worker  acquired  mean wait   max wait  timeouts");
        for (i, w) in self.workers.iter().enumerate() {
            println!(
                "  {i:>6}  {:>8}  {:>9}  {:>9}  {:>8}",
                w.acquired,
                ms(mean(w.wait_total, w.acquired)),
                ms(w.wait_max),
                w.timeouts
            );
        }
        let acquired = self.total(|w| w.acquired);
        let wait_total: Duration = self.workers.iter().map(|w| w.wait_total).sum();
        let wait_max = self.workers.iter().map(|w| w.wait_max).max();
        println!(
            "  {:>6}  {acquired:>8}  {:>9}  {:>9}  {:>8}   ({:.0} locks/s)",
            "total",
            ms(mean(wait_total, acquired)),
            ms(wait_max.unwrap_or_default()),
            self.total(|w| w.timeouts),
            acquired as f64 / self.elapsed.as_secs_f64()
        );
        let verdict = if self.passed() { "OK" } else { "FAILED" };
        println!(
            "  violations: {} | lost leases: {} | counter: {} (expected {}) | {verdict}",
            self.total(|w| w.violations),
            self.total(|w| w.lost),
            self.counter,
            self.expected()
        );
        for (i, w) in self.workers.iter().enumerate() {
            if let Some(e) = &w.error {
                println!("  worker {i} stopped on an error: {e}");
            }
        }
    }
}

fn mean(total: Duration, n: u64) -> Duration {
    if n == 0 {
        Duration::ZERO
    } else {
        total / n as u32
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Runs `WORKERS` threads on one lock of `strategy` for `RUN_FOR`. Each worker has its own
/// [`LockClient`] (its own pool), as separate processes would, so every hand-over between
/// workers goes through Redis.
fn contend(url: &str, name: &str, strategy: Strategy) -> Result<Report, BoxError> {
    let key = format!("redis-dlock:demo:{name}");
    let counter_key = format!("{key}:counter");
    let redis = redis::Client::open(url)?;
    let mut admin = connect(&redis)?;
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .arg(&counter_key)
        .query(&mut admin)?;

    // Default options of the strategy: Token and Reentrant watched by the watchdog (30 s lease),
    // standard retry, waiters woken by pub/sub; Classic 1 s / legacy retry, polling.
    let locks = (0..WORKERS)
        .map(|_| {
            let client = LockClient::builder(url).pool_size(2).build()?;
            client.lock(key.as_str()).strategy(strategy).build()
        })
        .collect::<Result<Vec<_>, LockError>>()?;
    let policy = locks[0].retry_policy();
    let title = format!(
        "{strategy:?}  key {key}  ttl {:?}  retry: {}",
        locks[0].ttl(),
        match (policy.max_retries, policy.max_wait) {
            (Some(n), _) => format!("{n} retries, {:?} apart", policy.delay),
            (None, Some(w)) => format!(
                "up to {w:?}, {:?}..{:?} backoff",
                policy.delay, policy.max_delay
            ),
            (None, None) => "unbounded".to_owned(),
        }
    );
    // The heading goes out before the run, so a reader sees what the next seconds are for.
    println!("{title}\n  running {WORKERS} threads for {RUN_FOR:?} ...");

    let holders = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let deadline = started + RUN_FOR;
    let handles: Vec<_> = locks
        .into_iter()
        .map(|lock| {
            let holders = Arc::clone(&holders);
            let redis = redis.clone();
            let counter_key = counter_key.clone();
            thread::spawn(move || worker(&lock, &redis, &counter_key, &holders, deadline))
        })
        .collect();
    let workers = handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| WorkerStats {
                error: Some("worker thread panicked".into()),
                ..WorkerStats::default()
            })
        })
        .collect();
    let elapsed = started.elapsed();

    let counter: Option<i64> = redis::cmd("GET").arg(&counter_key).query(&mut admin)?;
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .arg(&counter_key)
        .query(&mut admin)?;
    Ok(Report {
        workers,
        counter: counter.unwrap_or(0),
        elapsed,
    })
}

/// One contending thread: take the lock, increment the counter non-atomically, release, think.
fn worker(
    lock: &dyn DistributedLock,
    redis: &redis::Client,
    counter_key: &str,
    holders: &AtomicU32,
    deadline: Instant,
) -> WorkerStats {
    let mut stats = WorkerStats::default();
    let mut con = match connect(redis) {
        Ok(con) => con,
        Err(e) => {
            stats.error = Some(e.to_string());
            return stats;
        }
    };
    let mut rng = rand::rng();
    while Instant::now() < deadline {
        let asked = Instant::now();
        let guard = match lock.lock() {
            Ok(guard) => guard,
            Err(LockError::Timeout { .. }) => {
                stats.timeouts += 1;
                continue;
            }
            Err(e) => {
                stats.error = Some(e.to_string());
                break;
            }
        };
        let waited = asked.elapsed();
        stats.acquired += 1;
        stats.wait_total += waited;
        stats.wait_max = stats.wait_max.max(waited);

        // Critical section. The probe counts threads inside; more than one is a violation.
        if holders.fetch_add(1, Ordering::SeqCst) != 0 {
            stats.violations += 1;
        }
        let step = increment(&mut con, counter_key);
        holders.fetch_sub(1, Ordering::SeqCst);

        match guard.unlock() {
            Ok(true) => {}
            Ok(false) => stats.lost += 1,
            Err(e) => stats.error = Some(e.to_string()),
        }
        if let Err(e) = step {
            stats.error = Some(format!("counter increment: {e}"));
        }
        if stats.error.is_some() {
            break;
        }
        thread::sleep(Duration::from_millis(rng.random_range(0..=MAX_THINK_MS)));
    }
    stats
}

/// The non-atomic increment a lock has to protect.
fn increment(con: &mut redis::Connection, key: &str) -> redis::RedisResult<()> {
    let value: Option<i64> = redis::cmd("GET").arg(key).query(con)?;
    thread::sleep(WORK_INSIDE);
    redis::cmd("SET")
        .arg(key)
        .arg(value.unwrap_or(0) + 1)
        .query(con)
}

fn connect(redis: &redis::Client) -> redis::RedisResult<redis::Connection> {
    let con = redis.get_connection_with_timeout(IO_TIMEOUT)?;
    con.set_read_timeout(Some(IO_TIMEOUT))?;
    con.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(con)
}

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `redis-server` child of this process, killed (by its own pid) and its directory removed
/// when dropped: on normal exit, on `?` error paths and when a worker panics.
struct LocalRedis {
    child: Child,
    port: u16,
    // Dropped after `Drop::drop` has killed the child.
    _dir: TempDir,
}

impl LocalRedis {
    /// Starts `redis-server` on a free loopback port and waits until it answers.
    fn start() -> Result<LocalRedis, BoxError> {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = TempDir(
            std::env::temp_dir().join(format!("redis-dlock-demo-{}-{stamp}", std::process::id())),
        );
        std::fs::create_dir_all(&dir.0)?;
        let log = dir.0.join("redis.log");
        let mut last = String::new();
        // A port found free can be taken by someone else before redis-server binds it: retry.
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let _ = std::fs::remove_file(&log);
            let mut child = Command::new(server_binary())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&dir.0)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| -> BoxError {
                    if e.kind() == ErrorKind::NotFound {
                        "redis-server is not on PATH. Install it (Debian/Ubuntu: \
                         `sudo apt-get install redis-server`; macOS: `brew install redis`), \
                         or set REDIS_URL to a running server, e.g. \
                         REDIS_URL=redis://127.0.0.1:6379/"
                            .into()
                    } else {
                        format!("could not start {}: {e}", server_binary()).into()
                    }
                })?;
            match wait_ready(&mut child, port, Duration::from_secs(5)) {
                Ok(()) => {
                    return Ok(LocalRedis {
                        child,
                        port,
                        _dir: dir,
                    })
                }
                Err(e) => {
                    kill(&mut child);
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                    last = format!(
                        "port {port}: {e}\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
            }
        }
        Err(format!("could not start redis-server: {last}").into())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// SIGKILLs exactly this child (not yet reaped, so its pid cannot have been reused) and reaps it.
fn kill(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Waits until our own process (not another one that grabbed the port) answers PING.
fn wait_ready(child: &mut Child, port: u16, timeout: Duration) -> Result<(), String> {
    let pid = child.id();
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server exited with {status}"));
        }
        if server_pid(&client) == Some(pid) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("no PING answer within {timeout:?}"));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// PINGs the server and returns its `process_id`.
fn server_pid(client: &redis::Client) -> Option<u32> {
    let timeout = Duration::from_millis(500);
    let mut con = client.get_connection_with_timeout(timeout).ok()?;
    con.set_read_timeout(Some(timeout)).ok()?;
    let pong: String = redis::cmd("PING").query(&mut con).ok()?;
    if pong != "PONG" {
        return None;
    }
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
}

/// The server binary the demo starts: `DLOCK_TEST_SERVER` (as the tests and benchmarks; e.g. a
/// `valkey-server`), else `redis-server` on PATH.
fn server_binary() -> String {
    std::env::var("DLOCK_TEST_SERVER")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}
