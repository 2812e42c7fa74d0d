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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, Encoding, LockClient, RetryPolicy, Strategy, Takeover};
use support::expiry::{decode, epoch_ms};
use support::worker::{self, WorkerProcess};
use support::{init_logging, raw, RedisServer};

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
fn build_lock(client: &LockClient, kind: Kind) -> Lock {
    build_lock_with(
        client,
        kind,
        RetryPolicy::standard().max_wait(Some(TTL + Duration::from_secs(10))),
    )
}

fn build_lock_with(client: &LockClient, kind: Kind, retry: RetryPolicy) -> Lock {
    let builder = client.lock(KEY).ttl(TTL).retry(retry);
    match kind {
        Kind::Token => builder.strategy(Strategy::Token).build(),
        Kind::Classic(encoding, takeover) => builder
            .strategy(Strategy::Classic(
                ClassicOptions::new().encoding(encoding).takeover(takeover),
            ))
            .build(),
    }
    .expect("valid lock options")
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
    worker::report(LOCKED_MARKER, &to_hex(guard.value()));
    // Until killed; leaves without releasing, like a crash.
    worker::hold_until_killed()
}

/// Runs [`crash_holder_process`] as a child process that takes the lock of `kind` on `url`.
fn spawn_holder(url: &str, kind: Kind) -> WorkerProcess {
    WorkerProcess::spawn(
        WORKER_TEST,
        &[
            (WORKER_ENV, "1".to_owned()),
            ("DLOCK_URL", url.to_owned()),
            ("DLOCK_STRATEGY", kind.to_env()),
        ],
    )
}

/// Waits for the holder's marker line and returns the value it stored.
fn wait_locked(holder: &mut WorkerProcess, timeout: Duration) -> Vec<u8> {
    match holder.wait_marker(LOCKED_MARKER, timeout) {
        Ok(hex) => from_hex(&hex),
        Err(e) => panic!(
            "the holder did not report the lock ({e:?}); its output:\n{}",
            holder.seen().join("\n")
        ),
    }
}

/// SIGKILL, then reap.
fn kill_holder(holder: &mut WorkerProcess) {
    let status = holder.kill();
    assert!(!status.success(), "the holder exited on its own: {status}");
}

// ---------------------------------------------------------------------------------------------
// The tests

fn crash_and_recover(kind: Kind) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let lock = build_lock(&client, kind);

    let mut holder = spawn_holder(&server.url(), kind);
    let dead_value = wait_locked(&mut holder, Duration::from_secs(30));
    assert_eq!(
        raw::get(&mut conn, KEY).as_deref(),
        Some(&dead_value[..]),
        "the holder's value is at the key"
    );
    match kind {
        Kind::Classic(..) => assert_eq!(raw::pttl(&mut conn, KEY), -1, "Classic sets no Redis TTL"),
        Kind::Token => {
            let pttl = raw::pttl(&mut conn, KEY);
            assert!(
                pttl > 0 && pttl <= TTL.as_millis() as i64,
                "Token key TTL {pttl}"
            );
        }
    }

    let killed = Instant::now();
    kill_holder(&mut holder);
    if let Kind::Classic(..) = kind {
        // Nothing removes it: no TTL, and the holder is dead.
        assert_eq!(raw::get(&mut conn, KEY).as_deref(), Some(&dead_value[..]));
    }
    let guard = match kind {
        Kind::Token => lock.lock(),
        Kind::Classic(..) => lock.try_lock_for(TTL + Duration::from_secs(10)),
    }
    .unwrap_or_else(|e| panic!("{kind:?}: the dead holder's lock was not recovered: {e}"));
    let recovery = killed.elapsed();
    let acquired_wall_ms = epoch_ms();
    eprintln!("crash/{kind:?}: recovered {recovery:.2?} after SIGKILL of the holder (ttl {TTL:?})");
    assert!(
        recovery <= TTL + MARGIN,
        "{kind:?}: recovery took {recovery:?}, more than ttl {TTL:?} + {MARGIN:?}"
    );

    let stored = raw::get(&mut conn, KEY).expect("the key holds our lock");
    assert_eq!(stored, guard.value(), "the stored value is ours");
    assert_ne!(stored, dead_value, "the dead holder's value was replaced");

    match kind {
        Kind::Classic(encoding, takeover) => {
            let dead_expiry = decode(encoding, &dead_value);
            // The takeover needs the expiry passed by the client's nanosecond clock, and this
            // clock is read after it in whole milliseconds: the same millisecond is possible.
            assert!(
                acquired_wall_ms >= dead_expiry,
                "taken over before the dead holder's expiry ({dead_expiry}, now {acquired_wall_ms})"
            );
            let our_expiry = decode(encoding, &stored);
            let now = epoch_ms();
            assert!(
                our_expiry > now && our_expiry <= now + TTL.as_millis() as i64 + 1,
                "our stored expiry {our_expiry} is not now ({now}) + ttl"
            );
            assert_eq!(
                raw::pttl(&mut conn, KEY),
                -1,
                "still no Redis TTL after the takeover"
            );
            // The key never went away, so only the stale-timestamp takeover can have replaced it.
            let getsets = raw::command_calls(&mut conn, "getset");
            match takeover {
                Takeover::GetSet => assert!(getsets >= 1, "no GETSET was sent"),
                _ => {
                    assert_eq!(getsets, 0, "compare-and-set mode sent GETSET");
                    assert!(raw::command_calls(&mut conn, "evalsha") >= 1);
                }
            }
        }
        Kind::Token => {
            let pttl = raw::pttl(&mut conn, KEY);
            assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "our TTL {pttl}");
        }
    }

    assert!(guard.unlock().unwrap(), "our recovered lock is released");
    assert_eq!(raw::get(&mut conn, KEY), None);
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
    let mut holder = spawn_holder(&server.url(), kind);
    let dead_value = wait_locked(&mut holder, Duration::from_secs(30));
    let clients: Vec<LockClient> = (0..CONTENDERS)
        .map(|_| LockClient::open(server.url()).unwrap())
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
                // The window in which an overlap would be seen.
                support::work(Duration::from_millis(20));
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
        kill_holder(&mut holder);
        barrier.wait();
        Instant::now()
    });
    let total = killed.elapsed();
    let mut times = acquired_after.into_inner().unwrap();
    times.sort();
    let getsets = raw::command_calls(&mut conn, "getset");
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
    let value = raw::get(&mut conn, KEY);
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
