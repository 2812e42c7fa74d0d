//! Integration-test fixture: real, throw-away `redis-server` processes.
//!
//! The binary is `redis-server` on PATH, or the one named in the environment variable
//! `DLOCK_TEST_SERVER` (e.g. a `valkey-server`): see [`server_binary`] and [`server_kind`].
//! Every [`RedisServer`] runs its own server child on a free loopback
//! port with a private temporary directory and no persistence. Fault
//! injection (pause/resume/stop/kill/restart) only ever signals this
//! server's own pid, and `Drop` always kills the child and removes its
//! directory, also when a test panics.
//!
//! Shared by the test files as well: [`raw`] (raw Redis commands to set up and check keys),
//! [`expiry`] (the wall clock and Classic expiry-timestamp values) and [`worker`] (this test
//! binary re-run as a child process), [`netns`] (network namespaces and a link to cut; needs
//! root), and with a TLS feature [`tls`] (generated certificates and servers with a TLS port).
//! Each test binary uses a subset, hence `dead_code`.
#![allow(dead_code)]

pub mod expiry;
pub mod fleet;
pub mod history;
pub mod netns;
pub mod proxy;
pub mod raw;
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
pub mod tls;
pub mod worker;

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

/// The environment variable naming the server binary the fixture starts (a path, or a name
/// looked up on PATH): `DLOCK_TEST_SERVER=/opt/valkey/bin/valkey-server cargo test`.
pub const SERVER_ENV: &str = "DLOCK_TEST_SERVER";

/// The server binary the fixture starts: [`SERVER_ENV`] if set and not empty, else
/// `redis-server` on PATH. Sentinels are the same binary with `--sentinel`.
pub fn server_binary() -> String {
    std::env::var(SERVER_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// Which server [`server_binary`] is, by its `--version`: the product and its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `Redis server v=7.0.15 …`
    Redis(u32, u32),
    /// `Valkey server v=9.1.2 …`
    Valkey(u32, u32),
}

impl ServerKind {
    /// True for Valkey 9.0 and later: `DELIFEQ` and `SET … IFEQ`, which the client uses for
    /// Token locks instead of scripts.
    pub fn has_native_token(self) -> bool {
        matches!(self, ServerKind::Valkey(major, _) if major >= 9)
    }

    /// True for Valkey 8.1 and later: `SET … IFEQ`, which the client uses to extend and renew
    /// Token holds instead of a script.
    pub fn has_set_ifeq(self) -> bool {
        matches!(self, ServerKind::Valkey(major, minor) if (major, minor) >= (8, 1))
    }
}

/// True if [`server_binary`] was built with TLS support (Debian's `redis-server` is; the Valkey
/// binaries `.ci/valkey` installs are not). Asked once per test binary: the server is started
/// with a TLS port and no certificate, and exits at once either way, saying "Failed finding
/// TLS support" (Valkey) or "TLS not supported" when it has none.
pub fn has_tls() -> bool {
    static TLS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TLS.get_or_init(|| {
        let bin = server_binary();
        let Ok(mut child) = Command::new(&bin)
            .args([
                "--port",
                "0",
                "--tls-port",
                "1",
                "--save",
                "",
                "--daemonize",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
        else {
            return false;
        };
        wait_until(STARTUP_TIMEOUT, || !matches!(child.try_wait(), Ok(None)));
        reap(&mut child);
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let out = out.to_ascii_lowercase();
        !(out.contains("tls support") || out.contains("tls not supported"))
    })
}

/// For a test that needs TLS: false (and says so) when [`server_binary`] has no TLS support.
pub fn tls_available() -> bool {
    let ok = has_tls();
    if !ok {
        eprintln!(
            "skipped: {} is built without TLS (DLOCK_TEST_SERVER names another server)",
            server_binary()
        );
    }
    ok
}

/// The kind of [`server_binary`], asked once per test binary (`<server> --version`).
pub fn server_kind() -> ServerKind {
    static KIND: std::sync::OnceLock<ServerKind> = std::sync::OnceLock::new();
    *KIND.get_or_init(|| {
        let bin = server_binary();
        let out = Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("{bin} --version: {e} ({})", not_found_msg()));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let version = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("0.0");
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if text.to_ascii_lowercase().starts_with("valkey") {
            ServerKind::Valkey(major, minor)
        } else {
            ServerKind::Redis(major, minor)
        }
    })
}

fn not_found_msg() -> String {
    let bin = server_binary();
    if bin == "redis-server" {
        "redis-server not found on PATH: install it (Debian/Ubuntu: apt-get install \
         redis-server), or name another server binary in DLOCK_TEST_SERVER, and rerun"
            .to_owned()
    } else {
        format!("{bin} (from {SERVER_ENV}) not found: give a path to a redis-server or valkey-server binary")
    }
}

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A real `redis-server` child process owned by a test.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    pid: u32,
    paused: AtomicBool,
    /// How this server is launched (also on `restart()`).
    launch: Launch,
}

/// Extra launch settings of a server: an optional config file (passed first, as
/// `redis-server` requires) and extra command-line arguments, appended after the
/// fixture's own (`--port`, `--bind`, no persistence, `--dir`, `--logfile`).
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Config file given as the first argument (e.g. a Sentinel config, which
    /// Sentinel rewrites, so it must live in the server's directory).
    pub conf: Option<PathBuf>,
    /// Extra arguments, e.g. `["--replicaof", "127.0.0.1", "7000"]`.
    pub args: Vec<String>,
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
        Self::start_custom(|_, _| Launch::default())
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments (each flag and
    /// value a separate element: `&["--replicaof", "127.0.0.1", "7000"]`). They are
    /// kept for `restart()`.
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        let args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        Self::start_custom(move |_, _| Launch {
            conf: None,
            args: args.clone(),
        })
    }

    /// Like [`start`](Self::start), with launch settings made per attempt by `make`
    /// from the chosen port and the server's directory (for settings that name more
    /// ports, like a cluster bus port, or a config file to write). The settings of the
    /// attempt that succeeded are kept for `restart()`.
    pub fn start_custom(make: impl Fn(u16, &Path) -> Launch) -> RedisServer {
        let dir = fresh_dir();
        let mut last_error = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            let launch = make(port, &dir);
            match spawn_and_wait(port, &dir, &launch) {
                Ok(child) => {
                    let pid = child.id();
                    return RedisServer {
                        port,
                        dir,
                        child: Mutex::new(Some(child)),
                        pid,
                        paused: AtomicBool::new(false),
                        launch,
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
            freeze(self.pid);
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
            wait_until(STOP_GRACE, || !matches!(child.try_wait(), Ok(None)));
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
            match spawn_and_wait(self.port, &self.dir, &self.launch) {
                Ok(child) => {
                    self.pid = child.id();
                    *lock(&self.child) = Some(child);
                    return;
                }
                Err(SpawnFailure::Spawn(msg)) => panic!("{msg}"),
                Err(failure) => {
                    last_error = describe(failure, attempt, self.port, &self.dir);
                    // The port may be free again a moment later (another process held it).
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!(
            "could not restart redis-server on port {} after {RESTART_ATTEMPTS} attempts: {last_error}",
            self.port
        );
    }

    /// Like [`restart`](Self::restart), with `extra_args` added to the launch settings from now
    /// on (e.g. `["--rename-command", "DELIFEQ", "\"\""]`: the server at this address then
    /// lacks a command it had, as after a failover to an older server).
    pub fn restart_with(&mut self, extra_args: &[&str]) {
        self.launch
            .args
            .extend(extra_args.iter().map(|a| a.to_string()));
        self.restart();
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
pub fn wait_until(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    wait_until_every(timeout, Duration::from_millis(5), f)
}

/// [`wait_until`], polling every `interval` (a condition that is costly to ask).
#[allow(dead_code)] // not every test binary uses every helper
pub fn wait_until_every(
    timeout: Duration,
    interval: Duration,
    mut f: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(interval);
    }
}

/// Time spent as the test's load: a hold's critical section (the window in which an overlap
/// would be seen), a pause between sections or after an error, the pace or the length of a
/// run. Never a wait for something to happen: those wait for the event ([`wait_event`]) or
/// poll the condition ([`wait_until`]).
pub fn work(d: Duration) {
    thread::sleep(d);
}

/// The guard of a hold that is not the thread's (Token, Classic, Fair, …) in the form that may
/// cross threads (guards stay on their thread by default).
pub fn send(
    guard: redis_dlock::LockGuard<'_>,
) -> redis_dlock::LockGuard<'_, redis_dlock::GuardSend> {
    guard.into_send().expect("a hold that is not the thread's")
}

/// How long the helpers below wait for an event before the test fails: far beyond what any
/// of them takes on a busy machine, so only a missing event reaches it.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Waits until `client` has seen `event` at least `n` times since it was built (the crate's
/// test hooks: a subscription confirmed, a waiter queued, a renewal, a master switch); fails
/// the test after [`EVENT_TIMEOUT`].
#[cfg(feature = "test-hooks")]
pub fn wait_event(client: &redis_dlock::LockClient, event: redis_dlock::test_hooks::Event, n: u64) {
    assert!(
        client.test_hooks().wait_for(event, n, EVENT_TIMEOUT),
        "{event:?} seen {} times, waited for {n}",
        client.test_hooks().count(event)
    );
}

/// Waits until `client` sees `event` once more than it has now.
#[cfg(feature = "test-hooks")]
pub fn wait_next_event(client: &redis_dlock::LockClient, event: redis_dlock::test_hooks::Event) {
    let n = client.test_hooks().count(event) + 1;
    wait_event(client, event, n);
}

/// Waits until `client`'s watchdog has renewed its `holds` watched holds `rounds` times each
/// (`holds * rounds` renewals more than `from`, a `stats().renewals` reading). Renewals come a
/// third of a lease apart, so after 4 rounds the holds have lived past their lease by renewals
/// alone; fails the test after [`EVENT_TIMEOUT`].
pub fn wait_renewals(client: &redis_dlock::LockClient, from: u64, holds: u64, rounds: u64) {
    let target = from + holds * rounds;
    assert!(
        wait_until(EVENT_TIMEOUT, || client.stats().renewals >= target),
        "{} renewals, waited for {target}",
        client.stats().renewals
    );
}

/// Waits until a waiter of `client` listens for the release: it waits (queued), its
/// subscription is confirmed (`subscribed` of them in all), and the attempt it makes once
/// subscribed was refused (`refusals` of the client's attempts in all). A release from now on
/// is heard, not found by a poll. (A fair waiter notes `Event::Listening` itself: wait for that.)
#[cfg(feature = "test-hooks")]
pub fn wait_listening(client: &redis_dlock::LockClient, subscribed: u64, refusals: u64) {
    use redis_dlock::test_hooks::Event;
    wait_event(client, Event::Queued, 1);
    wait_event(client, Event::Subscribed, subscribed);
    assert!(
        wait_until(EVENT_TIMEOUT, || client.stats().refusals >= refusals),
        "{} refusals, waited for {refusals}",
        client.stats().refusals
    );
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

/// A free loopback port for a server, chosen below the kernel's ephemeral range: a port from
/// that range (what binding port 0 gives) can be taken by any outgoing connection's local end
/// while its server is down, and then `restart()` cannot bind it again.
fn free_port() -> u16 {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            r.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    const LOW: u16 = 10_000;
    if ephemeral_low > LOW + 1_000 {
        for _ in 0..500 {
            let port = LOW + rand::random::<u16>() % (ephemeral_low - LOW);
            if port == 6379 || port == 26379 {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Sends `SIG<name>` to `pid` with the `kill` binary. Errors are ignored
/// (the process may already be gone).
/// Sends SIGSTOP to `pid` and returns once every thread of it is stopped. `kill` returns as
/// soon as the signal is queued: one thread then takes it and stops the others, and on a busy
/// machine the process's threads were seen to go on running for up to 3.4 ms after `kill`
/// returned (59 rounds of 100, a C probe beside a CPU hog). A test that acts "while the process
/// is frozen" must wait for this.
pub fn freeze(pid: u32) {
    signal(pid, "STOP");
    let stopped = wait_until(Duration::from_secs(10), || all_threads_stopped(pid));
    assert!(stopped, "process {pid} did not stop within 10 s of SIGSTOP");
}

/// True if every thread of `pid` is in the stopped state (`T`, or `t` when traced), or the
/// process is gone.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return true; // the thread ended
        };
        // `tid (comm) S ...`: the state follows the last ')' (comm may hold anything).
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        matches!(state, Some('T' | 't' | 'Z' | 'X'))
    })
}

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
fn spawn_and_wait(port: u16, dir: &Path, launch: &Launch) -> Result<Child, SpawnFailure> {
    let logfile = dir.join("redis.log");
    // Start each attempt with an empty log so failures show the right reason.
    let _ = std::fs::remove_file(&logfile);
    let mut command = Command::new(server_binary());
    if let Some(conf) = &launch.conf {
        command.arg(conf);
    }
    let spawned = command
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
        .args(&launch.args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(SpawnFailure::Spawn(not_found_msg()))
        }
        Err(e) => {
            return Err(SpawnFailure::Spawn(format!(
                "failed to spawn {}: {e}",
                server_binary()
            )))
        }
    };
    let pid = child.id();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("valid url");
    let mut outcome = None;
    wait_until(STARTUP_TIMEOUT, || {
        outcome = match child.try_wait() {
            Ok(Some(status)) => Some(Err(SpawnFailure::Exited(format!(
                "redis-server exited with {status}"
            )))),
            Err(e) => Some(Err(SpawnFailure::Exited(format!("try_wait failed: {e}")))),
            // Only accept an answer from *our* process: another test's server may
            // have grabbed the same port first, in which case ours will exit.
            Ok(None) => (server_pid(&client) == Some(pid)).then_some(Ok(())),
        };
        outcome.is_some()
    });
    match outcome {
        Some(Ok(())) => Ok(child),
        Some(Err(e)) => {
            reap(&mut child);
            Err(e)
        }
        None => {
            reap(&mut child);
            Err(SpawnFailure::TimedOut)
        }
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

// ---------------------------------------------------------------------------
// Redis Cluster

/// `cluster-node-timeout` of test clusters: short enough for quick agreement, long
/// enough that a busy 2-core machine does not get nodes flagged as failing.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 5_000;
/// Number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: usize = 16_384;
/// How long `Cluster::start` waits for `redis-cli --cluster create` and agreement.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A real Redis Cluster of masters ([`Cluster::start`]) or masters with replicas
/// ([`Cluster::start_with_replicas`]), each node a [`RedisServer`] with
/// `cluster-enabled yes`, its own `nodes.conf` in its temporary directory, and a
/// free cluster-bus port (`cluster-port`) chosen like its data port. Dropping the
/// cluster kills every node.
pub struct Cluster {
    nodes: Vec<RedisServer>,
    ids: Vec<String>,
}

impl Cluster {
    /// Starts `masters` (at least 3) nodes, joins them with
    /// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes` and waits
    /// until every node reports `cluster_state:ok`, knows all nodes and sees all slots
    /// assigned.
    pub fn start(masters: usize) -> Cluster {
        Self::start_full(masters, 0, CLUSTER_NODE_TIMEOUT_MS, |_, _| Vec::new())
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments for each node from
    /// `extra(port, dir)` (e.g. a TLS port and certificate files).
    pub fn start_with(masters: usize, extra: impl Fn(u16, &Path) -> Vec<String>) -> Cluster {
        Self::start_full(masters, 0, CLUSTER_NODE_TIMEOUT_MS, extra)
    }

    /// Like [`start`](Self::start), with `replicas` replicas per master
    /// (`--cluster-replicas`) and `cluster-node-timeout` `node_timeout_ms` (a primary that
    /// stops answering is failed over about that long after, plus an election of about a
    /// second). Also waits until every replica's replication link is up.
    pub fn start_with_replicas(masters: usize, replicas: usize, node_timeout_ms: u64) -> Cluster {
        Self::start_full(masters, replicas, node_timeout_ms, |_, _| Vec::new())
    }

    /// The general form of [`start_with`](Self::start_with) and
    /// [`start_with_replicas`](Self::start_with_replicas).
    pub fn start_full(
        masters: usize,
        replicas: usize,
        node_timeout_ms: u64,
        extra: impl Fn(u16, &Path) -> Vec<String>,
    ) -> Cluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs 3 masters or more"
        );
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start_custom(|port, dir| {
                    let bus = loop {
                        let p = free_port();
                        if p != port {
                            break p;
                        }
                    };
                    let mut args: Vec<String> = vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        dir.join(format!("nodes-{port}.conf"))
                            .to_string_lossy()
                            .into_owned(),
                        "--cluster-node-timeout".into(),
                        node_timeout_ms.to_string(),
                        "--cluster-port".into(),
                        bus.to_string(),
                    ];
                    args.extend(extra(port, dir));
                    Launch { conf: None, args }
                })
            })
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
        args.extend(["--cluster-replicas".to_string(), replicas.to_string()]);
        args.push("--cluster-yes".into());
        run_tool("redis-cli", &args, nodes[0].dir(), CLUSTER_READY_TIMEOUT);
        let ids = nodes
            .iter()
            .map(|n| {
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query(&mut n.conn())
                    .expect("CLUSTER MYID")
            })
            .collect();
        let cluster = Cluster { nodes, ids };
        assert!(
            cluster.wait_ready(CLUSTER_READY_TIMEOUT),
            "the cluster did not reach cluster_state:ok on all nodes: {:?}",
            cluster
                .nodes
                .iter()
                .map(|n| cluster_info(n).unwrap_or_default())
                .collect::<Vec<_>>()
        );
        if replicas > 0 {
            assert!(
                wait_until(CLUSTER_READY_TIMEOUT, || {
                    let mut linked = 0;
                    for n in &cluster.nodes {
                        let Some(mut conn) = quick_conn(n) else {
                            return false;
                        };
                        if info_field(&mut conn, "replication", "master_link_status").as_deref()
                            == Some("up")
                        {
                            linked += 1;
                        }
                    }
                    linked == masters * replicas
                }),
                "the cluster's replicas did not sync with their masters"
            );
        }
        cluster
    }

    /// Node `i`, mutable (to kill it).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The indexes of the nodes that are replicas of node `master` by their own account
    /// (`ROLE`).
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let port = i64::from(self.nodes[master].port());
        (0..self.nodes.len())
            .filter(|&i| {
                let Some(mut conn) = quick_conn(&self.nodes[i]) else {
                    return false;
                };
                let reply: Vec<redis::Value> =
                    redis::cmd("ROLE").query(&mut conn).unwrap_or_default();
                matches!(reply.as_slice(),
                    [redis::Value::BulkString(r), _, redis::Value::Int(p), ..]
                        if r.as_slice() == b"slave" && *p == port)
            })
            .collect()
    }

    /// Waits until every node reports `cluster_state:ok`, knows every node and has all
    /// slots assigned.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let n = self.nodes.len().to_string();
        wait_until(timeout, || {
            self.nodes.iter().all(|node| {
                cluster_info(node).is_some_and(|info| {
                    let field = |name: &str| {
                        info.lines()
                            .find_map(|l| l.strip_prefix(name))
                            .map(|v| v.trim().to_owned())
                    };
                    field("cluster_state:").as_deref() == Some("ok")
                        && field("cluster_known_nodes:").as_deref() == Some(n.as_str())
                        && field("cluster_slots_assigned:").as_deref() == Some("16384")
                })
            })
        })
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Every node's `redis://127.0.0.1:P/` (seed list for a cluster client).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i`'s cluster node id.
    pub fn node_id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn keyslot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].conn())
            .expect("CLUSTER KEYSLOT")
    }

    /// For every slot, the index of the node that serves it, each node speaking for
    /// itself (the `myself` line of its own `CLUSTER NODES`; migration markers such
    /// as `[123->-id]` are not ownership and are skipped).
    pub fn slot_owners(&self) -> Vec<Option<usize>> {
        let mut owners = vec![None; CLUSTER_SLOTS];
        for (i, node) in self.nodes.iter().enumerate() {
            let text: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut node.conn())
                .expect("CLUSTER NODES");
            let me = text
                .lines()
                .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
                .expect("a myself line in CLUSTER NODES");
            for range in me.split(' ').skip(8).filter(|r| !r.starts_with('[')) {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let (lo, hi): (usize, usize) = (lo.parse().unwrap(), hi.parse().unwrap());
                for slot in owners.iter_mut().take(hi + 1).skip(lo) {
                    *slot = Some(i);
                }
            }
        }
        owners
    }

    /// The index of the node that serves `slot` by its own account.
    pub fn slot_owner(&self, slot: u16) -> usize {
        self.slot_owners()[usize::from(slot)]
            .unwrap_or_else(|| panic!("no node claims slot {slot}"))
    }

    /// The first key `"{prefix}:{n}"` (n = 0, 1, ...) whose slot node `node` serves.
    pub fn key_on(&self, node: usize, prefix: &str) -> String {
        let owners = self.slot_owners();
        let mut conn = self.nodes[0].conn();
        (0..100_000)
            .map(|n| format!("{prefix}:{n}"))
            .find(|key| {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query(&mut conn)
                    .expect("CLUSTER KEYSLOT");
                owners[usize::from(slot)] == Some(node)
            })
            .expect("some key hashes to every node")
    }

    /// A raw connection to the node that serves `key`'s slot.
    pub fn conn_for_key(&self, key: &str) -> redis::Connection {
        self.nodes[self.slot_owner(self.keyslot(key))].conn()
    }
}

/// `CLUSTER INFO` of one node, or `None` if it does not answer.
pub fn cluster_info(node: &RedisServer) -> Option<String> {
    let client = node.client();
    let timeout = Duration::from_millis(500);
    let mut conn = client.get_connection_with_timeout(timeout).ok()?;
    conn.set_read_timeout(Some(timeout)).ok()?;
    redis::cmd("CLUSTER").arg("INFO").query(&mut conn).ok()
}

/// Runs a helper program (e.g. `redis-cli`) to completion, with its output in
/// `dir`; panics with that output if it fails or takes longer than `timeout`.
fn run_tool(program: &str, args: &[String], dir: &Path, timeout: Duration) {
    let out_path = dir.join(format!("{program}.out"));
    let out = std::fs::File::create(&out_path).expect("create tool output file");
    let err = out.try_clone().expect("clone file handle");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let mut status = None;
    wait_until(timeout, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if status.is_none() {
        reap(&mut child);
    }
    if status.is_none_or(|s| !s.success()) {
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        panic!("{program} {args:?} failed ({status:?}):\n{output}");
    }
}

// ---------------------------------------------------------------------------
// Sentinel

/// The service name the test Sentinels monitor.
pub const SENTINEL_SERVICE: &str = "mymaster";
/// `sentinel down-after-milliseconds` of the test Sentinels.
pub const SENTINEL_DOWN_AFTER_MS: u64 = 1_000;
/// How long `Sentinel::start` waits for replication and for the Sentinels to see
/// the replica (and each other).
const SENTINEL_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A Sentinel deployment: a master, one replica of it (`--replicaof`), and Sentinels
/// (`redis-server <conf> --sentinel`, each with its own config file in its own
/// directory) monitoring the master as [`SENTINEL_SERVICE`], with
/// `down-after-milliseconds` [`SENTINEL_DOWN_AFTER_MS`] and `failover-timeout` 5 s.
/// Every process is a [`RedisServer`], so pause/kill/Drop work as for one server.
pub struct Sentinel {
    /// `[initial master, initial replica]`; roles change on failover.
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl Sentinel {
    /// Starts the master, the replica (waits for `master_link_status:up`) and
    /// `sentinels` Sentinels with `quorum`, and waits until every Sentinel sees the
    /// replica and the other Sentinels.
    pub fn start(sentinels: usize, quorum: usize) -> Sentinel {
        assert!(sentinels >= 1 && (1..=sentinels).contains(&quorum));
        let master = RedisServer::start();
        let master_port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port]);
        let mut rconn = replica.conn();
        assert!(
            wait_until(SENTINEL_READY_TIMEOUT, || {
                info_field(&mut rconn, "replication", "master_link_status").as_deref() == Some("up")
            }),
            "the replica did not sync with the master"
        );
        let sentinels: Vec<RedisServer> = (0..sentinels)
            .map(|_| {
                RedisServer::start_custom(|port, dir| {
                    let conf = dir.join(format!("sentinel-{port}.conf"));
                    let text = format!(
                        "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master_port} {quorum}\n\
                         sentinel down-after-milliseconds {SENTINEL_SERVICE} {SENTINEL_DOWN_AFTER_MS}\n\
                         sentinel failover-timeout {SENTINEL_SERVICE} 5000\n\
                         sentinel parallel-syncs {SENTINEL_SERVICE} 1\n\
                         sentinel resolve-hostnames no\n"
                    );
                    std::fs::write(&conf, text).expect("write sentinel config");
                    Launch {
                        conf: Some(conf),
                        args: vec!["--sentinel".into()],
                    }
                })
            })
            .collect();
        let set = Sentinel {
            data: vec![master, replica],
            sentinels,
        };
        let others = set.sentinels.len() - 1;
        let ready = wait_until(SENTINEL_READY_TIMEOUT, || {
            set.sentinels.iter().all(|s| {
                let Some(mut conn) = quick_conn(s) else {
                    return false;
                };
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(SENTINEL_SERVICE)
                        .query(&mut conn)
                        .unwrap_or_default();
                let peers: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(SENTINEL_SERVICE)
                    .query(&mut conn)
                    .unwrap_or_default();
                replicas.len() == 1
                    && replicas[0].get("flags").is_some_and(|f| f == "slave")
                    && peers.len() == others
            })
        });
        assert!(
            ready,
            "the Sentinels did not discover the replica and each other"
        );
        set
    }

    /// The data node that started as master (index 0) or replica (index 1).
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.data[i]
    }

    /// Mutable access to a data node, for `kill()`/`stop()`/`restart()`.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.data[i]
    }

    /// The index of the data node listening on `port`.
    pub fn server_index(&self, port: u16) -> Option<usize> {
        self.data.iter().position(|s| s.port() == port)
    }

    /// The Sentinel processes.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Sentinel `i`, mutable (to pause or kill it).
    pub fn sentinel_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.sentinels[i]
    }

    /// Freezes the replica (`server(1)`) and closes its replication link from the master's
    /// side: frozen, it cannot reconnect, so what the master acknowledges next never reaches
    /// it. `server(1).resume()` lets it back.
    pub fn cut_the_replica_off(&self) {
        self.server(1).pause();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query(&mut self.server(0).conn())
            .expect("CLIENT KILL TYPE replica");
        assert_eq!(killed, 1, "the replica's link was closed");
    }

    /// Every Sentinel's `redis://127.0.0.1:P/`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// Each Sentinel's answer to `SENTINEL get-master-addr-by-name` (the port; `None`
    /// for a Sentinel that did not answer).
    pub fn master_ports(&self) -> Vec<Option<u16>> {
        self.sentinels
            .iter()
            .map(|s| {
                let mut conn = quick_conn(s)?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(SENTINEL_SERVICE)
                    .query(&mut conn)
                    .ok()?;
                addr.map(|(_, port)| port)
            })
            .collect()
    }

    /// Waits until every Sentinel that answers (at least one) names the same master,
    /// other than `old_port`, and that server answers `ROLE` as a master; returns its
    /// data-node index. Paused or killed Sentinels are left out.
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> Option<usize> {
        let mut found = None;
        wait_until(timeout, || {
            let ports: Vec<u16> = self.master_ports().into_iter().flatten().collect();
            let Some(port) = ports.first().copied() else {
                return false;
            };
            if port == old_port || ports.iter().any(|p| *p != port) {
                return false;
            }
            let Some(i) = self.server_index(port) else {
                return false;
            };
            if role(&self.data[i]).as_deref() == Some("master") {
                found = Some(i);
                return true;
            }
            false
        });
        found
    }
}

/// The first element of `ROLE` ("master", "slave", "sentinel"), if the server answers.
pub fn role(server: &RedisServer) -> Option<String> {
    let mut conn = quick_conn(server)?;
    let reply: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).ok()?;
    match reply.first()? {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// One field of `INFO <section>`, e.g. `info_field(conn, "replication", "role")`.
pub fn info_field(conn: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(conn).ok()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().to_owned())
}

/// A connection with 500 ms timeouts, or `None` if the server does not accept one
/// (for polling servers that may be down or paused).
pub fn quick_conn(server: &RedisServer) -> Option<redis::Connection> {
    let timeout = Duration::from_millis(500);
    let conn = server.client().get_connection_with_timeout(timeout).ok()?;
    conn.set_read_timeout(Some(timeout)).ok()?;
    conn.set_write_timeout(Some(timeout)).ok()?;
    Some(conn)
}
