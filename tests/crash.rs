//! Crash recovery: a holder process is SIGKILLed while it holds the lock, and another client
//! must get the lock once the dead holder's lifetime has run out, and no earlier.
//!
//! The holder is this test binary re-run as a child process (see [`crash_holder_process`]). It
//! takes the lock, prints a marker line with the value it stored, and then blocks reading its
//! stdin (so it also goes away if the parent dies) until the parent kills it.
//!
//! - Classic without `key_ttl`: the key has no Redis TTL (PTTL -1), so the dead holder's key
//!   stays forever and recovery must go through the stale-timestamp takeover (GETSET or the
//!   compare-and-set script), for both encodings.
//! - Token: the key's Redis TTL removes it; the next `SET NX PX` wins.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_dlock::{DistributedLock, Encoding, LockClient, RetryPolicy, Strategy, Takeover};
use support::{init_logging, RedisServer};

const KEY: &str = "crash:lock";
/// The lifetime of the dead holder's lock (and of ours).
const TTL: Duration = Duration::from_secs(1);
/// Recovery must happen within the lifetime plus this margin (generous: a noisy 2-core box).
const MARGIN: Duration = Duration::from_secs(3);

const WORKER_ENV: &str = "DLOCK_CRASH_WORKER";
const WORKER_TEST: &str = "crash_holder_process";
const LOCKED_MARKER: &str = "DLOCK-CRASH-LOCKED";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Token,
    Classic(Encoding, Takeover),
}

impl Kind {
    fn to_env(self) -> String {
        match self {
            Kind::Token => "token".into(),
            Kind::Classic(e, t) => format!(
                "classic,{},{}",
                match e {
                    Encoding::BigEndian => "bigendian",
                    _ => "decimal",
                },
                match t {
                    Takeover::CompareAndSet => "cas",
                    _ => "getset",
                }
            ),
        }
    }

    fn from_env(s: &str) -> Kind {
        let parts: Vec<&str> = s.split(',').collect();
        match parts.as_slice() {
            ["token"] => Kind::Token,
            ["classic", e, t] => Kind::Classic(
                match *e {
                    "bigendian" => Encoding::BigEndian,
                    "decimal" => Encoding::Decimal,
                    other => panic!("unknown encoding {other:?}"),
                },
                match *t {
                    "cas" => Takeover::CompareAndSet,
                    "getset" => Takeover::GetSet,
                    other => panic!("unknown takeover {other:?}"),
                },
            ),
            _ => panic!("bad strategy spec {s:?}"),
        }
    }
}

/// Both sides build the same lock: lifetime [`TTL`], Classic without `key_ttl`, and a retry
/// policy that keeps trying well past the lifetime.
fn build_lock(client: &LockClient, kind: Kind) -> Box<dyn DistributedLock> {
    build_lock_with(
        client,
        kind,
        RetryPolicy::standard().max_wait(Some(TTL + Duration::from_secs(10))),
    )
}

fn build_lock_with(
    client: &LockClient,
    kind: Kind,
    retry: RetryPolicy,
) -> Box<dyn DistributedLock> {
    let builder = client.lock(KEY).ttl(TTL).retry(retry);
    match kind {
        Kind::Token => builder.strategy(Strategy::Token).build(),
        Kind::Classic(encoding, takeover) => builder
            .strategy(Strategy::Classic)
            .encoding(encoding)
            .takeover(takeover)
            .build(),
    }
    .expect("valid lock options")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Decodes a legacy expiry timestamp the way the legacy lockers do.
fn decode(encoding: Encoding, value: &[u8]) -> i64 {
    match encoding {
        Encoding::BigEndian => i64::from_be_bytes(
            value
                .try_into()
                .unwrap_or_else(|_| panic!("not 8 bytes: {value:?}")),
        ),
        _ => std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a decimal timestamp: {value:?}")),
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn get(conn: &mut redis::Connection) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(KEY).query(conn).unwrap()
}

fn pttl(conn: &mut redis::Connection) -> i64 {
    redis::cmd("PTTL").arg(KEY).query(conn).unwrap()
}

/// How many calls of `command` Redis has served (INFO commandstats).
fn command_calls(conn: &mut redis::Connection, command: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The holder process

/// The holder side: does nothing unless [`WORKER_ENV`] is set, so it passes at once in a normal
/// test run.
#[test]
fn crash_holder_process() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    init_logging();
    let url = std::env::var("DLOCK_URL").expect("DLOCK_URL");
    let kind = Kind::from_env(&std::env::var("DLOCK_STRATEGY").expect("DLOCK_STRATEGY"));
    let client = LockClient::open(&url).unwrap();
    let lock = build_lock(&client, kind);
    let guard = lock.try_lock().expect("the holder takes a free lock");
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{LOCKED_MARKER} {}", to_hex(guard.value())).unwrap();
    out.flush().unwrap();
    drop(out);
    // "Sleep forever": until killed, or until the parent goes away and closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    // Leave without releasing, like a crash.
    std::process::exit(0);
}

/// A running holder process; killed and reaped on drop.
struct Holder {
    child: Child,
    _stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Holder {
    fn spawn(url: &str, kind: Kind) -> Holder {
        let exe = std::env::current_exe().expect("current test binary");
        let mut child = Command::new(exe)
            .args(["--exact", WORKER_TEST, "--nocapture", "--test-threads=1"])
            .env(WORKER_ENV, "1")
            .env("DLOCK_URL", url)
            .env("DLOCK_STRATEGY", kind.to_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn holder process");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Holder {
            child,
            _stdin: stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for the marker line and returns the value the holder stored.
    fn wait_locked(&mut self, timeout: Duration) -> Vec<u8> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(LOCKED_MARKER) {
                        return from_hex(rest.trim());
                    }
                    self.seen.push(line);
                }
                Err(e) => panic!(
                    "the holder did not report the lock ({e:?}); its output:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// SIGKILL, then reap.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the holder");
        let status = self.child.wait().expect("reap the holder");
        assert!(!status.success(), "the holder exited on its own: {status}");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

fn crash_and_recover(kind: Kind) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(&server.url()).unwrap();
    let lock = build_lock(&client, kind);

    let mut holder = Holder::spawn(&server.url(), kind);
    let dead_value = holder.wait_locked(Duration::from_secs(30));
    assert_eq!(
        get(&mut conn).as_deref(),
        Some(&dead_value[..]),
        "the holder's value is at the key"
    );
    match kind {
        Kind::Classic(..) => assert_eq!(pttl(&mut conn), -1, "Classic sets no Redis TTL"),
        Kind::Token => {
            let pttl = pttl(&mut conn);
            assert!(
                pttl > 0 && pttl <= TTL.as_millis() as i64,
                "Token key TTL {pttl}"
            );
        }
    }

    let killed = Instant::now();
    holder.kill();
    if let Kind::Classic(..) = kind {
        // Nothing removes it: no TTL, and the holder is dead.
        assert_eq!(get(&mut conn).as_deref(), Some(&dead_value[..]));
    }
    let guard = match kind {
        Kind::Token => lock.lock(),
        Kind::Classic(..) => lock.try_lock_for(TTL + Duration::from_secs(10)),
    }
    .unwrap_or_else(|e| panic!("{kind:?}: the dead holder's lock was not recovered: {e}"));
    let recovery = killed.elapsed();
    let acquired_wall_ms = now_ms();
    eprintln!("crash/{kind:?}: recovered {recovery:.2?} after SIGKILL of the holder (ttl {TTL:?})");
    assert!(
        recovery <= TTL + MARGIN,
        "{kind:?}: recovery took {recovery:?}, more than ttl {TTL:?} + {MARGIN:?}"
    );

    let stored = get(&mut conn).expect("the key holds our lock");
    assert_eq!(stored, guard.value(), "the stored value is ours");
    assert_ne!(stored, dead_value, "the dead holder's value was replaced");

    match kind {
        Kind::Classic(encoding, takeover) => {
            let dead_expiry = decode(encoding, &dead_value);
            assert!(
                acquired_wall_ms > dead_expiry,
                "taken over before the dead holder's expiry ({dead_expiry}, now {acquired_wall_ms})"
            );
            let our_expiry = decode(encoding, &stored);
            let now = now_ms();
            assert!(
                our_expiry > now && our_expiry <= now + TTL.as_millis() as i64 + 1,
                "our stored expiry {our_expiry} is not now ({now}) + ttl"
            );
            assert_eq!(pttl(&mut conn), -1, "still no Redis TTL after the takeover");
            // The key never went away, so only the stale-timestamp takeover can have replaced it.
            let getsets = command_calls(&mut conn, "getset");
            match takeover {
                Takeover::GetSet => assert!(getsets >= 1, "no GETSET was sent"),
                _ => {
                    assert_eq!(getsets, 0, "compare-and-set mode sent GETSET");
                    assert!(command_calls(&mut conn, "evalsha") >= 1);
                }
            }
        }
        Kind::Token => {
            let pttl = pttl(&mut conn);
            assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "our TTL {pttl}");
        }
    }

    assert!(guard.unlock().unwrap(), "our recovered lock is released");
    assert_eq!(get(&mut conn), None);
}

#[test]
fn classic_decimal_getset_recovers_from_a_killed_holder() {
    crash_and_recover(Kind::Classic(Encoding::Decimal, Takeover::GetSet));
}

#[test]
fn classic_big_endian_getset_recovers_from_a_killed_holder() {
    crash_and_recover(Kind::Classic(Encoding::BigEndian, Takeover::GetSet));
}

#[test]
fn classic_decimal_compare_and_set_recovers_from_a_killed_holder() {
    crash_and_recover(Kind::Classic(Encoding::Decimal, Takeover::CompareAndSet));
}

#[test]
fn classic_big_endian_compare_and_set_recovers_from_a_killed_holder() {
    crash_and_recover(Kind::Classic(Encoding::BigEndian, Takeover::CompareAndSet));
}

#[test]
fn token_recovers_from_a_killed_holder() {
    crash_and_recover(Kind::Token);
}

// ---------------------------------------------------------------------------------------------
// Several clients race to recover the dead holder's lock

const CONTENDERS: usize = 4;

/// After the holder is killed, [`CONTENDERS`] clients (each with its own connection pool, as
/// separate services would be) wait for the lock at once. Exactly one may hold it at a time;
/// all must get it in the end. They poll every millisecond without jitter, so that several of
/// them find the stale lock at once and race for the takeover.
fn crash_then_contenders(kind: Kind) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut holder = Holder::spawn(&server.url(), kind);
    let dead_value = holder.wait_locked(Duration::from_secs(30));
    let clients: Vec<LockClient> = (0..CONTENDERS)
        .map(|_| LockClient::open(&server.url()).unwrap())
        .collect();
    let retry = RetryPolicy::standard()
        .fixed_delay(Duration::from_millis(1))
        .jitter(false);
    let locks: Vec<_> = clients
        .iter()
        .map(|c| build_lock_with(c, kind, retry.clone()))
        .collect();

    let probe = AtomicUsize::new(0);
    let violations = AtomicUsize::new(0);
    let released = AtomicUsize::new(0);
    let overwritten = AtomicUsize::new(0);
    let barrier = Barrier::new(CONTENDERS + 1);
    let acquired_after: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

    let killed = thread::scope(|s| {
        for (i, lock) in locks.iter().enumerate() {
            let (probe, violations, released, overwritten, barrier, acquired_after) = (
                &probe,
                &violations,
                &released,
                &overwritten,
                &barrier,
                &acquired_after,
            );
            s.spawn(move || {
                let killed: Instant = {
                    barrier.wait();
                    Instant::now()
                };
                let guard = lock
                    .try_lock_for(Duration::from_secs(30))
                    .unwrap_or_else(|e| panic!("{kind:?}: contender {i} got no lock: {e}"));
                acquired_after.lock().unwrap().push(killed.elapsed());
                if probe.fetch_add(1, Ordering::SeqCst) != 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                thread::sleep(Duration::from_millis(20));
                if probe.fetch_sub(1, Ordering::SeqCst) != 1 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                match guard.unlock() {
                    Ok(true) => released.fetch_add(1, Ordering::SeqCst),
                    Ok(false) => overwritten.fetch_add(1, Ordering::SeqCst),
                    Err(e) => panic!("{kind:?}: contender {i}: unlock failed: {e}"),
                };
            });
        }
        holder.kill();
        barrier.wait();
        Instant::now()
    });
    let total = killed.elapsed();
    let mut times = acquired_after.into_inner().unwrap();
    times.sort();
    let getsets = command_calls(&mut conn, "getset");
    eprintln!(
        "crash/contenders/{kind:?}: {CONTENDERS} contenders after SIGKILL: first got the lock \
         after {:.2?}, all done in {total:.2?} (acquired after {times:.2?}); released {}, found \
         overwritten at release {}, GETSETs {getsets}",
        times[0],
        released.load(Ordering::SeqCst),
        overwritten.load(Ordering::SeqCst),
    );
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(times.len(), CONTENDERS);
    assert!(
        times[0] <= TTL + MARGIN,
        "{kind:?}: first recovery after {:?}",
        times[0]
    );
    let value = get(&mut conn);
    assert_ne!(value.as_deref(), Some(&dead_value[..]));
    match kind {
        Kind::Classic(_, Takeover::GetSet) => {
            // Losing GETSETs overwrite the winner's value (the legacy flaw, documented on
            // Takeover::GetSet): that winner's release then deletes nothing.
            assert_eq!(
                released.load(Ordering::SeqCst) + overwritten.load(Ordering::SeqCst),
                CONTENDERS
            );
        }
        _ => {
            // Compare-and-set and Token never overwrite a holder: every release is clean.
            assert_eq!(released.load(Ordering::SeqCst), CONTENDERS);
            assert_eq!(value, None, "the key is free at the end");
        }
    }
}

#[test]
fn classic_decimal_getset_contenders_recover_one_at_a_time() {
    crash_then_contenders(Kind::Classic(Encoding::Decimal, Takeover::GetSet));
}

#[test]
fn classic_big_endian_compare_and_set_contenders_recover_one_at_a_time() {
    crash_then_contenders(Kind::Classic(Encoding::BigEndian, Takeover::CompareAndSet));
}

#[test]
fn token_contenders_recover_one_at_a_time() {
    crash_then_contenders(Kind::Token);
}
