//! Integration-test fixture: real, throw-away `redis-server` processes.
//!
//! Every [`RedisServer`] runs its own `redis-server` child on a free loopback
//! port with a private temporary directory and no persistence. Fault
//! injection (pause/resume/stop/kill/restart) only ever signals this
//! server's own pid, and `Drop` always kills the child and removes its
//! directory, also when a test panics.
#![allow(dead_code)]

use std::io::{ErrorKind, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long to wait for a freshly spawned server to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports `start()` tries before giving up.
const START_ATTEMPTS: usize = 5;
/// How many times `restart()` retries binding the same port.
const RESTART_ATTEMPTS: usize = 20;
/// Grace period between SIGTERM and SIGKILL in `stop()`.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Read/write timeout of connections returned by `conn()`.
const CONN_TIMEOUT: Duration = Duration::from_secs(5);

const NOT_FOUND_MSG: &str = "redis-server not found on PATH: install it \
     (Debian/Ubuntu: apt-get install redis-server) and rerun";

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A real `redis-server` child process owned by a test.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    pid: u32,
    paused: AtomicBool,
}

/// Why one attempt at bringing a server up failed.
enum SpawnFailure {
    /// The process exited (typically: port already in use).
    Exited(String),
    /// The process did not answer PING in time (it has been killed).
    TimedOut,
    /// `redis-server` could not be spawned at all (fatal, no retry).
    Spawn(String),
}

impl RedisServer {
    /// Starts a new server on a free loopback port and waits until it answers PING.
    ///
    /// Panics if `redis-server` is not on PATH or if no server could be started.
    pub fn start() -> RedisServer {
        let dir = fresh_dir();
        let mut last_error = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            match spawn_and_wait(port, &dir) {
                Ok(child) => {
                    let pid = child.id();
                    return RedisServer {
                        port,
                        dir,
                        child: Mutex::new(Some(child)),
                        pid,
                        paused: AtomicBool::new(false),
                    };
                }
                Err(SpawnFailure::Spawn(msg)) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    panic!("{msg}");
                }
                Err(failure) => {
                    last_error = describe(failure, attempt, port, &dir);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("could not start redis-server after {START_ATTEMPTS} attempts: {last_error}");
    }

    /// The TCP port this server listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:P/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The pid of the current `redis-server` process (changes on `restart()`).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's private temporary directory (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A `redis::Client` for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid redis url")
    }

    /// A raw connection with a 5 s connect/read/write timeout.
    pub fn conn(&self) -> redis::Connection {
        let conn = self
            .client()
            .get_connection_with_timeout(CONN_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to redis-server on {}: {e}", self.url()));
        conn.set_read_timeout(Some(CONN_TIMEOUT))
            .expect("set read timeout");
        conn.set_write_timeout(Some(CONN_TIMEOUT))
            .expect("set write timeout");
        conn
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing is answered.
    pub fn pause(&self) {
        if self.is_running() {
            signal(self.pid, "STOP");
            self.paused.store(true, Ordering::SeqCst);
        }
    }

    /// Undoes `pause()` with SIGCONT.
    pub fn resume(&self) {
        if self.paused.swap(false, Ordering::SeqCst) && self.is_running() {
            signal(self.pid, "CONT");
        }
    }

    /// Graceful shutdown: SIGTERM, then SIGKILL if still alive after 3 s.
    pub fn stop(&mut self) {
        let mut guard = lock(&self.child);
        let Some(child) = guard.as_mut() else { return };
        if matches!(child.try_wait(), Ok(None)) {
            // A stopped process does not act on SIGTERM until continued.
            if self.paused.swap(false, Ordering::SeqCst) {
                signal(self.pid, "CONT");
            }
            signal(self.pid, "TERM");
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
        }
        reap(child);
        *guard = None;
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Abrupt crash: SIGKILL and reap.
    pub fn kill(&mut self) {
        let mut guard = lock(&self.child);
        if let Some(child) = guard.as_mut() {
            reap(child);
        }
        *guard = None;
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Stops the server if it is running and starts a fresh one on the same port.
    ///
    /// The data set is empty afterwards (no persistence).
    pub fn restart(&mut self) {
        self.stop();
        let mut last_error = String::new();
        for attempt in 1..=RESTART_ATTEMPTS {
            match spawn_and_wait(self.port, &self.dir) {
                Ok(child) => {
                    self.pid = child.id();
                    *lock(&self.child) = Some(child);
                    return;
                }
                Err(SpawnFailure::Spawn(msg)) => panic!("{msg}"),
                Err(failure) => {
                    last_error = describe(failure, attempt, self.port, &self.dir);
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!(
            "could not restart redis-server on port {} after {RESTART_ATTEMPTS} attempts: {last_error}",
            self.port
        );
    }

    /// Whether the child process is alive (a paused server counts as running).
    pub fn is_running(&self) -> bool {
        match lock(&self.child).as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let mut guard = lock(&self.child);
        if let Some(child) = guard.as_mut() {
            if self.paused.swap(false, Ordering::SeqCst) && matches!(child.try_wait(), Ok(None)) {
                signal(self.pid, "CONT");
            }
            reap(child);
        }
        *guard = None;
        drop(guard);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `f` every 5 ms until it returns true or `timeout` elapses.
/// Returns whether `f` returned true.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Installs a tiny stderr logger once, if `DLOCK_TEST_LOG` is set.
///
/// The variable's value may name a level (`error`, `warn`, `info`, `debug`,
/// `trace`); anything else means `debug`. Safe to call from every test; it
/// does nothing if the variable is unset or another logger is installed.
pub fn init_logging() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let Some(value) = std::env::var_os("DLOCK_TEST_LOG") else {
            return;
        };
        let level = value
            .to_str()
            .and_then(|s| s.trim().parse::<log::LevelFilter>().ok())
            .filter(|l| *l != log::LevelFilter::Off)
            .unwrap_or(log::LevelFilter::Debug);
        if log::set_logger(&STDERR_LOGGER).is_ok() {
            log::set_max_level(level);
        }
    });
}

struct StderrLogger;

static STDERR_LOGGER: StderrLogger = StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let thread = thread::current();
        // eprintln! goes through the test harness's output capture.
        eprintln!(
            "[{}.{:03} {:<5} {} {}] {}",
            now.as_secs(),
            now.subsec_millis(),
            record.level(),
            thread.name().unwrap_or("?"),
            record.target(),
            record.args()
        );
    }

    fn flush(&self) {}
}

// ---------------------------------------------------------------------------
// internals

fn lock(m: &Mutex<Option<Child>>) -> MutexGuard<'_, Option<Child>> {
    // A panic while holding the lock must not prevent Drop from killing the child.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fresh_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "redis-dlock-test-{}-{}-{}",
        std::process::id(),
        DIR_COUNTER.fetch_add(1, Ordering::SeqCst),
        nanos
    ));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("create temp dir {}: {e}", dir.display()));
    dir
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Sends `SIG<name>` to `pid` with the `kill` binary. Errors are ignored
/// (the process may already be gone).
fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// SIGKILLs the child unless it has already exited, then reaps it.
fn reap(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        // Child::kill sends SIGKILL to exactly this (not yet reaped) pid.
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Spawns `redis-server` on `port` and waits until it answers PING.
fn spawn_and_wait(port: u16, dir: &Path) -> Result<Child, SpawnFailure> {
    let logfile = dir.join("redis.log");
    // Start each attempt with an empty log so failures show the right reason.
    let _ = std::fs::remove_file(&logfile);
    let spawned = Command::new("redis-server")
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg("no")
        .arg("--daemonize")
        .arg("no")
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&logfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(SpawnFailure::Spawn(NOT_FOUND_MSG.to_string()))
        }
        Err(e) => {
            return Err(SpawnFailure::Spawn(format!(
                "failed to spawn redis-server: {e}"
            )))
        }
    };
    let pid = child.id();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("valid url");
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(SpawnFailure::Exited(format!(
                    "redis-server exited with {status}"
                )))
            }
            Ok(None) => {}
            Err(e) => {
                reap(&mut child);
                return Err(SpawnFailure::Exited(format!("try_wait failed: {e}")));
            }
        }
        // Only accept an answer from *our* process: another test's server may
        // have grabbed the same port first, in which case ours will exit.
        if server_pid(&client) == Some(pid) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            reap(&mut child);
            return Err(SpawnFailure::TimedOut);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// PINGs the server and returns its `process_id`, if it answers.
fn server_pid(client: &redis::Client) -> Option<u32> {
    let timeout = Duration::from_millis(500);
    let mut conn = client.get_connection_with_timeout(timeout).ok()?;
    conn.set_read_timeout(Some(timeout)).ok()?;
    conn.set_write_timeout(Some(timeout)).ok()?;
    let pong: String = redis::cmd("PING").query(&mut conn).ok()?;
    if pong != "PONG" {
        return None;
    }
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

fn describe(failure: SpawnFailure, attempt: usize, port: u16, dir: &Path) -> String {
    let what = match failure {
        SpawnFailure::Exited(why) | SpawnFailure::Spawn(why) => why,
        SpawnFailure::TimedOut => {
            format!("no PING answer within {STARTUP_TIMEOUT:?} (killed)")
        }
    };
    format!(
        "attempt {attempt} on port {port}: {what}; log tail:\n{}",
        log_tail(&dir.join("redis.log"))
    )
}

fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
