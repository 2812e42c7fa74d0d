//! Mutual exclusion under real contention, for both strategies:
//!
//! - 16 threads of one process on one key, spread over 4 clients (threads of one client line up
//!   in its in-process waiter queue; clients race through Redis), checked by an in-process
//!   holder probe and by a non-atomic read-modify-write counter in Redis;
//! - 4 OS processes (this test binary re-run as workers) on one key, checked by a holder probe
//!   kept in Redis itself (`INCR holders` must return 1) and the same Redis counter.
//!
//! After each section a contender does 1 ms of "other work", so that holds change hands often
//! instead of one contender re-acquiring in a burst; the hand-offs and the attempts that found
//! the lock held are counted and printed, to show the contention was real.
//!
//! Classic runs with its defaults (decimal encoding, GETSET takeover, no key TTL) but a lifetime
//! of 5 s, so no hold expires during a run, and a retry policy that waits long enough.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, RetryPolicy, Strategy};
use support::worker::WorkerProcess;
use support::{init_logging, raw, RedisServer};

/// The lock key every contender uses.
const LOCK_KEY: &str = "exclusion:lock";
/// The non-atomic counter bumped inside each critical section.
const COUNTER_KEY: &str = "exclusion:counter";
/// Cross-process holder probe: `INCR` on entry must return 1.
const HOLDERS_KEY: &str = "exclusion:holders";
/// Violations seen by the cross-process probe.
const VIOLATIONS_KEY: &str = "exclusion:violations";
/// Start barrier of the worker processes.
const READY_KEY: &str = "exclusion:ready";
/// The pid of the last process that entered, to count hand-offs between processes.
const LAST_KEY: &str = "exclusion:last";
const HANDOFFS_KEY: &str = "exclusion:handoffs";

const THREADS: usize = 16;
/// The threads are spread over this many clients (each with its own pool and waiter queues).
const CLIENTS: usize = 4;
const SECTIONS_PER_THREAD: usize = 375;
/// Work outside the critical section after each one, in microseconds.
const OUTSIDE_WORK_MICROS: u64 = 1000;
const PROCESSES: usize = 4;
const SECTIONS_PER_PROCESS: usize = 750;

/// Longest a single `lock()` may wait before the test counts it as a failure.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Classic lifetime: long enough that no hold expires during a run.
const CLASSIC_TTL: Duration = Duration::from_secs(5);

/// Set (to anything) in the environment of a child process that must act as a worker.
const WORKER_ENV: &str = "DLOCK_EXCLUSION_WORKER";
const WORKER_TEST: &str = "exclusion_worker_process";

/// The heavy tests of this file run one at a time, so that their timings mean something on a
/// small machine and they do not starve one another.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Token,
    Classic,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Token => "token",
            Kind::Classic => "classic",
        }
    }

    fn parse(s: &str) -> Kind {
        match s {
            "token" => Kind::Token,
            "classic" => Kind::Classic,
            other => panic!("unknown strategy {other:?}"),
        }
    }
}

/// Token: the default strategy and lifetime. Classic: default options, 5 s lifetime. Both wait
/// up to [`MAX_WAIT`] under the standard backoff.
fn build_lock(client: &LockClient, kind: Kind) -> Lock {
    let retry = RetryPolicy::standard().max_wait(Some(MAX_WAIT));
    let builder = client.lock(LOCK_KEY).retry(retry);
    let builder = match kind {
        Kind::Token => builder,
        Kind::Classic => builder
            .strategy(Strategy::Classic(ClassicOptions::new()))
            .ttl(CLASSIC_TTL),
    };
    builder.build().expect("valid lock options")
}

fn raw_conn(url: &str) -> redis::Connection {
    let conn = redis::Client::open(url)
        .expect("valid url")
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    conn
}

/// Work outside the critical section: gives the waiters a chance to take the lock, so that
/// holds change hands often instead of one thread re-acquiring in a burst.
fn outside_work() {
    support::work(Duration::from_micros(OUTSIDE_WORK_MICROS));
}

/// Acquire attempts that found the lock held: every attempt sends one `SET .. NX` (Token) or
/// one `SETNX` (Classic); the counter's own `SET`s are subtracted.
fn failed_attempts(conn: &mut redis::Connection, kind: Kind, sections: usize) -> i64 {
    let sections = sections as i64;
    match kind {
        Kind::Token => raw::command_calls(conn, "set") - 2 * sections,
        Kind::Classic => raw::command_calls(conn, "setnx") - sections,
    }
}

// ---------------------------------------------------------------------------------------------
// 16 threads, one process

fn threads_on_one_key(kind: Kind) {
    init_logging();
    let _serial = serial();
    let server = RedisServer::start();
    // Threads of one client queue up in-process and only the head polls Redis; threads of
    // different clients race through Redis. Both kinds of contention run here at once.
    let clients: Vec<LockClient> = (0..CLIENTS)
        .map(|_| LockClient::open(server.url()).unwrap())
        .collect();
    let locks: Vec<_> = clients.iter().map(|c| build_lock(c, kind)).collect();

    let probe = AtomicUsize::new(0);
    let violations = AtomicUsize::new(0);
    let lost = AtomicUsize::new(0);
    let sections = AtomicUsize::new(0);
    let last_holder = AtomicUsize::new(usize::MAX);
    let handoffs = AtomicUsize::new(0);
    let last_client = AtomicUsize::new(usize::MAX);
    let client_handoffs = AtomicUsize::new(0);
    let longest_wait = Mutex::new(Duration::ZERO);
    let barrier = Barrier::new(THREADS);
    let mut started = Instant::now();

    thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (probe, violations, lost, sections, barrier) =
                    (&probe, &violations, &lost, &sections, &barrier);
                let (last_holder, handoffs) = (&last_holder, &handoffs);
                let (last_client, client_handoffs) = (&last_client, &client_handoffs);
                let longest_wait = &longest_wait;
                let c = t % CLIENTS;
                let lock = &locks[c];
                let mut conn = server.conn();
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..SECTIONS_PER_THREAD {
                        let asked = Instant::now();
                        let guard = lock.lock().unwrap_or_else(|e| {
                            panic!("thread {t}, section {i}: lock() failed: {e}")
                        });
                        let waited = asked.elapsed();
                        {
                            let mut longest = longest_wait.lock().unwrap();
                            *longest = (*longest).max(waited);
                        }
                        if probe.fetch_add(1, Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        if last_holder.swap(t, Ordering::SeqCst) != t {
                            handoffs.fetch_add(1, Ordering::SeqCst);
                        }
                        if last_client.swap(c, Ordering::SeqCst) != c {
                            client_handoffs.fetch_add(1, Ordering::SeqCst);
                        }
                        raw::bump_counter(&mut conn, COUNTER_KEY);
                        if probe.fetch_sub(1, Ordering::SeqCst) != 1 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        sections.fetch_add(1, Ordering::SeqCst);
                        match guard.unlock() {
                            Ok(true) => {}
                            Ok(false) => {
                                lost.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => panic!("thread {t}, section {i}: unlock failed: {e}"),
                        }
                        outside_work();
                    }
                })
            })
            .collect();
        started = Instant::now();
        for h in handles {
            h.join().expect("worker thread panicked");
        }
    });
    let elapsed = started.elapsed();

    let total = THREADS * SECTIONS_PER_THREAD;
    let mut conn = server.conn();
    let counter = raw::get_i64(&mut conn, COUNTER_KEY);
    let contended = failed_attempts(&mut conn, kind, total);
    eprintln!(
        "exclusion/threads/{}: {THREADS} threads ({CLIENTS} clients) x {SECTIONS_PER_THREAD} = {} \
         critical sections in {elapsed:.2?} ({:.0}/s), {} hand-offs between threads ({} between \
         clients), {contended} attempts found it held, longest wait {:.2?}; probe violations {}, \
         lost at unlock {}, redis counter {counter}",
        kind.name(),
        sections.load(Ordering::SeqCst),
        total as f64 / elapsed.as_secs_f64(),
        handoffs.load(Ordering::SeqCst),
        client_handoffs.load(Ordering::SeqCst),
        longest_wait.lock().unwrap(),
        violations.load(Ordering::SeqCst),
        lost.load(Ordering::SeqCst),
    );
    assert_eq!(sections.load(Ordering::SeqCst), total);
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    assert_eq!(
        lost.load(Ordering::SeqCst),
        0,
        "a hold was lost before release"
    );
    assert_eq!(counter, total as i64, "lost updates: exclusion was broken");
    assert!(
        !raw::exists(&mut conn, LOCK_KEY),
        "the lock key must be gone after the last release"
    );
}

#[test]
fn token_threads_exclusive_on_one_key() {
    threads_on_one_key(Kind::Token);
}

#[test]
fn classic_threads_exclusive_on_one_key() {
    threads_on_one_key(Kind::Classic);
}

// ---------------------------------------------------------------------------------------------
// 4 processes

/// The worker side of the multi-process tests. Does nothing unless [`WORKER_ENV`] is set: in a
/// normal test run it passes at once.
#[test]
fn exclusion_worker_process() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    init_logging();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let url = var("DLOCK_URL");
    let kind = Kind::parse(&var("DLOCK_STRATEGY"));
    let sections: usize = var("DLOCK_SECTIONS").parse().unwrap();
    let workers: i64 = var("DLOCK_WORKERS").parse().unwrap();
    let me = std::process::id();

    let client = LockClient::open(&url).unwrap();
    let lock = build_lock(&client, kind);
    let mut conn = raw_conn(&url);

    // Start together, so that every section is contended.
    let _: i64 = redis::cmd("INCR").arg(READY_KEY).query(&mut conn).unwrap();
    assert!(
        support::wait_until(Duration::from_secs(30), || raw::get_i64(
            &mut conn, READY_KEY
        ) >= workers),
        "worker {me}: the other workers did not start"
    );

    let started = Instant::now();
    let mut lost = 0;
    for i in 0..sections {
        let guard = lock
            .lock()
            .unwrap_or_else(|e| panic!("worker {me}, section {i}: lock() failed: {e}"));
        let holders: i64 = redis::cmd("INCR")
            .arg(HOLDERS_KEY)
            .query(&mut conn)
            .unwrap();
        if holders != 1 {
            let _: i64 = redis::cmd("INCR")
                .arg(VIOLATIONS_KEY)
                .query(&mut conn)
                .unwrap();
        }
        let last: Option<u32> = redis::cmd("GETSET")
            .arg(LAST_KEY)
            .arg(me)
            .query(&mut conn)
            .unwrap();
        if last != Some(me) {
            let _: i64 = redis::cmd("INCR")
                .arg(HANDOFFS_KEY)
                .query(&mut conn)
                .unwrap();
        }
        raw::bump_counter(&mut conn, COUNTER_KEY);
        let holders: i64 = redis::cmd("DECR")
            .arg(HOLDERS_KEY)
            .query(&mut conn)
            .unwrap();
        if holders != 0 {
            let _: i64 = redis::cmd("INCR")
                .arg(VIOLATIONS_KEY)
                .query(&mut conn)
                .unwrap();
        }
        if !guard
            .unlock()
            .unwrap_or_else(|e| panic!("worker {me}, section {i}: unlock failed: {e}"))
        {
            lost += 1;
        }
        outside_work();
    }
    println!(
        "worker {me}: {sections} sections in {:.2?}, lost {lost}",
        started.elapsed()
    );
    assert_eq!(lost, 0, "worker {me}: holds lost before release");
}

fn processes_on_one_key(kind: Kind) {
    init_logging();
    let _serial = serial();
    let server = RedisServer::start();
    let envs = [
        (WORKER_ENV, "1".to_owned()),
        ("DLOCK_URL", server.url()),
        ("DLOCK_STRATEGY", kind.name().to_owned()),
        ("DLOCK_SECTIONS", SECTIONS_PER_PROCESS.to_string()),
        ("DLOCK_WORKERS", PROCESSES.to_string()),
    ];
    let started = Instant::now();
    let workers: Vec<WorkerProcess> = (0..PROCESSES)
        .map(|_| WorkerProcess::spawn_captured(WORKER_TEST, &envs))
        .collect();
    let mut reports = Vec::new();
    for w in workers {
        let (status, out, err) = w.finish(Duration::from_secs(150));
        assert!(
            status.success(),
            "worker failed ({status})\n--- stdout\n{out}\n--- stderr\n{err}"
        );
        assert!(
            out.contains("sections in"),
            "the worker did not run (filtered out?)\n--- stdout\n{out}\n--- stderr\n{err}"
        );
        reports.extend(
            out.lines()
                .filter(|l| l.contains("worker "))
                .map(str::to_owned),
        );
    }
    let elapsed = started.elapsed();

    let total = PROCESSES * SECTIONS_PER_PROCESS;
    let mut conn = server.conn();
    let counter = raw::get_i64(&mut conn, COUNTER_KEY);
    let violations = raw::get_i64(&mut conn, VIOLATIONS_KEY);
    let holders = raw::get_i64(&mut conn, HOLDERS_KEY);
    let handoffs = raw::get_i64(&mut conn, HANDOFFS_KEY);
    let contended = failed_attempts(&mut conn, kind, total);
    eprintln!(
        "exclusion/processes/{}: {PROCESSES} processes x {SECTIONS_PER_PROCESS} = {total} critical \
         sections in {elapsed:.2?} (incl. process start), {handoffs} hand-offs between processes, \
         {contended} attempts found it held; redis probe violations {violations}, \
         redis counter {counter}\n  {}",
        kind.name(),
        reports.join("\n  ")
    );
    assert_eq!(violations, 0, "two processes were inside at once");
    assert_eq!(holders, 0);
    assert_eq!(counter, total as i64, "lost updates: exclusion was broken");
    assert!(
        !raw::exists(&mut conn, LOCK_KEY),
        "the lock key must be gone after the last release"
    );
}

#[test]
fn token_processes_exclusive_on_one_key() {
    processes_on_one_key(Kind::Token);
}

#[test]
fn classic_processes_exclusive_on_one_key() {
    processes_on_one_key(Kind::Classic);
}
