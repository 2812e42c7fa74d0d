//! Fault injection against a real `redis-server`: scripts flushed (NOSCRIPT), Redis restarted,
//! Redis paused (SIGSTOP).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, LockError, RetryPolicy, Strategy, Takeover};
use support::expiry::epoch_ms;
use support::{init_logging, raw, wait_until, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(500);
/// Slack on top of a timeout for a slow, busy CI machine.
const MARGIN: Duration = Duration::from_millis(2_500);

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

/// A client that gives up quickly when Redis does not answer.
fn impatient_client(server: &RedisServer, pool_size: u32) -> LockClient {
    LockClient::builder(server.url())
        .pool_size(pool_size)
        .connect_timeout(TIMEOUT)
        .command_timeout(Some(TIMEOUT))
        .build()
        .expect("client")
}

/// Asserts `err` is a Connection error about `key`.
#[track_caller]
fn assert_connection_error<T: std::fmt::Debug>(result: Result<T, LockError>, key: &str) {
    match result {
        Err(LockError::Connection { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected Err(Connection) for {key:?}, got {other:?}"),
    }
}

/// A full token cycle whose every step is checked against Redis itself.
fn checked_token_cycle(server: &RedisServer, lock: &dyn DistributedLock, round: usize) {
    let mut conn = server.conn();
    let key = lock.key().to_owned();
    let mut guard = lock
        .try_lock()
        .unwrap_or_else(|e| panic!("round {round}: try_lock: {e}"));
    assert_eq!(
        raw::get(&mut conn, &key).as_deref(),
        Some(guard.value()),
        "round {round}: the lock in Redis holds our token"
    );
    assert!(guard.is_held().unwrap(), "round {round}");
    guard.extend(Duration::from_secs(20)).unwrap();
    let p = raw::pttl(&mut conn, &key);
    assert!(p > 10_000 && p <= 20_000, "round {round}: PTTL {p}");
    assert!(
        matches!(lock.try_lock(), Err(LockError::Held { .. })),
        "round {round}"
    );
    assert!(guard.unlock().unwrap(), "round {round}: unlock");
    assert_eq!(raw::get(&mut conn, &key), None, "round {round}");
}

#[test]
fn noscript_recovery_token() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = c
        .lock("f:noscript")
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut conn = server.conn();

    // Release after a flush.
    let guard = lock.try_lock().unwrap();
    assert!(guard.unlock().unwrap());
    raw::script_flush(&mut conn);
    assert_eq!(raw::cached_scripts(&mut conn), 0);
    let guard = lock.try_lock().unwrap();
    assert!(guard.unlock().expect("unlock after SCRIPT FLUSH"));
    assert_eq!(raw::get(&mut conn, "f:noscript"), None);
    if support::server_kind().has_native_token() {
        // Differs by server: with DELIFEQ (Valkey 9.0+) the release is no script at all.
        assert_eq!(raw::cached_scripts(&mut conn), 0, "a native release");
    } else {
        assert!(
            raw::cached_scripts(&mut conn) >= 1,
            "the script was loaded again"
        );
    }

    // Extend after a flush.
    let mut guard = lock.try_lock().unwrap();
    raw::script_flush(&mut conn);
    guard
        .extend(Duration::from_secs(30))
        .expect("extend after SCRIPT FLUSH");
    assert!(raw::pttl(&mut conn, "f:noscript") > 5_000);

    // A lost lock after a flush is still reported as lost, not as an error.
    raw::set(&mut conn, "f:noscript", b"other");
    raw::script_flush(&mut conn);
    assert!(matches!(
        guard.extend(Duration::from_secs(1)),
        Err(LockError::Lost { .. })
    ));
    raw::script_flush(&mut conn);
    assert!(!guard.unlock().unwrap());
    assert_eq!(
        raw::get(&mut conn, "f:noscript").as_deref(),
        Some(&b"other"[..])
    );
}

#[test]
fn noscript_recovery_classic() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for key_ttl in [false, true] {
        let key = format!("f:noscript-classic:{key_ttl}");
        let b = c
            .lock(&key)
            .strategy(Strategy::Classic(
                ClassicOptions::new()
                    .takeover(Takeover::CompareAndSet)
                    .key_ttl(key_ttl),
            ))
            .ttl(Duration::from_secs(5));
        let lock = b.build().unwrap();

        // Takeover of a stale lock with compare_and_set.lua after a flush.
        raw::set(&mut conn, &key, (epoch_ms() - 1_000).to_string().as_bytes());
        raw::script_flush(&mut conn);
        let mut guard = lock.try_lock().expect("CompareAndSet takeover after FLUSH");
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));

        // Extend (compare_and_set.lua) and release (unlock.lua) after flushes.
        raw::script_flush(&mut conn);
        let before = guard.value().to_vec();
        guard
            .extend(Duration::from_secs(30))
            .expect("extend after FLUSH");
        assert_ne!(guard.value(), &before[..]);
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));
        raw::script_flush(&mut conn);
        assert!(guard.unlock().expect("unlock after FLUSH"));
        assert_eq!(raw::get(&mut conn, &key), None);
    }
}

#[test]
fn noscript_recovery_under_concurrent_flushes() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let flusher = s.spawn(|| {
            let mut conn = server.conn();
            let mut flushes = 0u32;
            while !stop.load(Ordering::SeqCst) {
                raw::script_flush(&mut conn);
                flushes += 1;
                // Paced: a flush every few ms while the locks run.
                support::work(Duration::from_millis(5));
            }
            flushes
        });
        let workers: Vec<_> = (0..4)
            .map(|i| {
                let c = c.clone();
                s.spawn(move || {
                    let lock = c
                        .lock(format!("f:flushing:{i}"))
                        .ttl(Duration::from_secs(10))
                        .build()
                        .unwrap();
                    for round in 0..40 {
                        let mut g = lock.try_lock().expect("free");
                        g.extend(Duration::from_secs(10))
                            .unwrap_or_else(|e| panic!("worker {i} round {round}: extend: {e}"));
                        assert!(
                            g.unlock()
                                .unwrap_or_else(|e| panic!("worker {i} round {round}: {e}")),
                            "worker {i} round {round}"
                        );
                    }
                })
            })
            .collect();
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::SeqCst);
        let flushes = flusher.join().unwrap();
        assert!(flushes > 0);
        for r in results {
            if let Err(panic) = r {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

#[test]
fn restart_outage_fails_fast_then_same_client_recovers() {
    init_logging();
    let mut server = RedisServer::start();
    let c = impatient_client(&server, 4);
    let token = c
        .lock("f:restart")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let classic = c
        .lock("f:restart-classic")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    for round in 0..3 {
        checked_token_cycle(&server, &token, round);
    }
    let held = token.try_lock().unwrap();

    server.stop();
    let outage = |what: &str, op: &dyn Fn() -> Result<(), LockError>, key: &str| {
        let started = Instant::now();
        assert_connection_error(op(), key);
        let took = started.elapsed();
        assert!(
            took < TIMEOUT + MARGIN,
            "{what} took {took:?} during the outage"
        );
    };
    outage("try_lock", &|| token.try_lock().map(drop), "f:restart");
    outage("is_held", &|| held.is_held().map(drop), "f:restart");
    outage(
        "release",
        &|| token.release(held.lease()).map(drop),
        "f:restart",
    );
    outage(
        "classic try_lock",
        &|| classic.try_lock().map(drop),
        "f:restart-classic",
    );
    // A blocking acquire retries a refused connection until its deadline, then reports the
    // last failure (not a contention timeout).
    let started = Instant::now();
    let budget = Duration::from_millis(300);
    let err = token.try_lock_for(budget).expect_err("no Redis");
    let took = started.elapsed();
    assert!(matches!(err, LockError::Connection { .. }), "{err:?}");
    assert!(err.is_transient(), "{}", err.report());
    assert!(
        took >= budget && took < budget + TIMEOUT + MARGIN,
        "try_lock_for retries until its deadline: {took:?}"
    );
    assert!(err.to_string().contains("f:restart"), "{err}");
    assert!(!err.is_contention());

    server.restart();
    // The restarted server has no data: the lock held before is gone.
    assert!(!held.is_held().expect("is_held after restart"));
    assert!(!held.unlock().expect("unlock after restart"));
    for round in 0..5 {
        checked_token_cycle(&server, &token, round);
        let g = classic.try_lock().expect("classic after restart");
        assert!(g.unlock().unwrap());
    }
}

/// Fills the pool with `n` idle connections (threads overlapping on the same client).
fn fill_pool(c: &LockClient, n: u32) -> u32 {
    for _ in 0..20 {
        thread::scope(|s| {
            for i in 0..n {
                let c = c.clone();
                s.spawn(move || {
                    let lock = c.lock(format!("f:fill:{i}")).build().unwrap();
                    for _ in 0..50 {
                        assert!(lock.try_lock().unwrap().unlock().unwrap());
                    }
                });
            }
        });
        if c.pool_state().connections >= n {
            break;
        }
    }
    c.pool_state().connections
}

#[test]
fn restart_while_idle_same_client_recovers() {
    init_logging();
    let mut server = RedisServer::start();
    let c = impatient_client(&server, 4);
    let pooled = fill_pool(&c, 4);
    assert!(pooled >= 1);

    // No lock operation while Redis is down: every pooled connection is now stale.
    server.restart();

    // Every operation after the restart must work, including the first ones, and a blocking
    // lock() must not fail on a stale connection either.
    let lock = c
        .lock("f:idle")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let g = lock.lock().expect("first lock() after the restart");
    assert!(g.unlock().expect("unlock"));
    for round in 0..(pooled as usize + 3) {
        checked_token_cycle(&server, &lock, round);
    }
}

/// What the client does today after a restart while idle: at most one failed operation per
/// stale pooled connection, each a Connection error, then it works. (Passes with or without the
/// fix that `restart_while_idle_same_client_recovers` waits for.)
#[test]
fn restart_while_idle_recovers_within_pool_size_failures() {
    init_logging();
    let mut server = RedisServer::start();
    let c = impatient_client(&server, 4);
    let pooled = fill_pool(&c, 4);
    server.restart();

    let lock = c
        .lock("f:idle-bounded")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut failures = 0;
    loop {
        match lock.try_lock() {
            Ok(g) => {
                assert!(g.unlock().unwrap());
                break;
            }
            Err(LockError::Connection { key, .. }) => {
                assert_eq!(key, "f:idle-bounded");
                failures += 1;
                assert!(
                    failures <= pooled,
                    "{failures} failures with {pooled} pooled connections"
                );
            }
            Err(e) => panic!("unexpected error after restart: {e}"),
        }
    }
    for round in 0..5 {
        checked_token_cycle(&server, &lock, round);
    }
}

#[test]
fn pause_times_out_then_same_client_answers_the_right_commands() {
    init_logging();
    let server = RedisServer::start();
    let c = impatient_client(&server, 2);
    let lock = c
        .lock("f:pause")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let orphan_ttl = Duration::from_millis(1_500);
    let orphan = c.lock("f:orphan").ttl(orphan_ttl).build().unwrap();
    let classic = c
        .lock("f:pause-classic")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    // Warm up: a pooled connection exists and the scripts are loaded.
    for round in 0..3 {
        checked_token_cycle(&server, &lock, round);
    }
    let held = lock.try_lock().unwrap();

    server.pause();
    let started = Instant::now();
    assert_connection_error(orphan.try_lock(), "f:orphan");
    let took = started.elapsed();
    assert!(
        took < TIMEOUT + MARGIN,
        "a paused Redis blocked try_lock for {took:?}"
    );
    let started = Instant::now();
    assert_connection_error(held.is_held(), "f:pause");
    assert_connection_error(classic.try_lock(), "f:pause-classic");
    assert!(started.elapsed() < 2 * (TIMEOUT + MARGIN));
    server.resume();

    // The held lock is still ours and the replies line up with the commands.
    assert!(held.is_held().expect("is_held after resume"));
    assert!(held.unlock().expect("unlock after resume"));
    let mut conn = server.conn();
    assert_eq!(raw::get(&mut conn, "f:pause"), None);
    for round in 0..10 {
        checked_token_cycle(&server, &lock, round);
        let g = classic.try_lock().expect("classic after resume");
        assert_eq!(
            raw::get(&mut conn, "f:pause-classic").as_deref(),
            Some(g.value())
        );
        assert!(g.unlock().unwrap());
    }

    // The timed-out acquire may still have been applied once Redis woke up, with a token
    // nobody knows: it must carry the lock's TTL, so it frees itself.
    if let Some(v) = raw::get(&mut conn, "f:orphan") {
        assert_eq!(v.len(), 32);
        let p = raw::pttl(&mut conn, "f:orphan");
        assert!(
            p == -2 || (p > 0 && p <= orphan_ttl.as_millis() as i64),
            "PTTL {p}"
        );
    }
    let g = orphan
        .try_lock_for(orphan_ttl + MARGIN)
        .expect("the orphan expires");
    assert!(g.unlock().unwrap());
}

#[test]
fn pause_blocking_lock_fails_with_connection_error() {
    init_logging();
    let server = RedisServer::start();
    let c = impatient_client(&server, 2);
    let holder = c.lock("f:pause-wait").build().unwrap();
    let waiter = c
        .lock("f:pause-wait")
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(30))))
        .build()
        .unwrap();
    let held = holder.try_lock().unwrap();
    let started = Instant::now();
    thread::scope(|s| {
        let w = s.spawn(|| waiter.lock().map(drop));
        support::wait_event(&c, Event::Queued, 1);
        server.pause();
        let result = w.join().unwrap();
        server.resume();
        assert_connection_error(result, "f:pause-wait");
    });
    assert!(
        started.elapsed() < Duration::from_millis(100) + 2 * (TIMEOUT + MARGIN),
        "a paused Redis must not hold a waiter for its whole max_wait"
    );
    assert!(held.unlock().unwrap());
    assert!(wait_until(Duration::from_secs(5), || waiter
        .try_lock()
        .map(|g| g.unlock().unwrap())
        .unwrap_or(false)));
}

/// A blocking `lock()` waits out an outage shorter than its wait budget: a restart (connection
/// refused meanwhile) is retried with the policy's backoff, and the lock is taken once the
/// server is back, by every strategy (Classic with a policy that waits as long). `try_lock()`
/// still fails at once.
#[test]
fn blocking_lock_rides_through_a_restart_within_its_budget() {
    init_logging();
    let mut server = RedisServer::start();
    let c = impatient_client(&server, 4);
    let policy = RetryPolicy::standard().max_wait(Some(Duration::from_secs(10)));
    let locks: Vec<Lock> = [
        Strategy::Token,
        Strategy::Reentrant,
        Strategy::Classic(ClassicOptions::new()),
        Strategy::Fair,
    ]
    .into_iter()
    .map(|strategy| {
        c.lock(format!("f:ride:{strategy:?}"))
            .strategy(strategy)
            .ttl(Duration::from_secs(10))
            .retry(policy.clone())
            .build()
            .unwrap()
    })
    .collect();
    for l in &locks {
        assert!(l.try_lock().unwrap().unlock().unwrap());
    }
    server.stop();
    for l in &locks {
        let started = Instant::now();
        assert_connection_error(l.try_lock().map(drop), l.key());
        assert!(started.elapsed() < TIMEOUT + MARGIN, "try_lock fails fast");
    }
    let started = Instant::now();
    thread::scope(|s| {
        let waiting: Vec<_> = locks
            .iter()
            .map(|l| s.spawn(move || l.lock().map(|g| g.unlock())))
            .collect();
        // Time under test: an outage this long must not make lock() give up.
        thread::sleep(Duration::from_millis(1_500));
        assert!(
            waiting.iter().all(|w| !w.is_finished()),
            "a lock() gave up during the outage"
        );
        server.restart();
        for (w, l) in waiting.into_iter().zip(&locks) {
            let result = w.join().unwrap();
            assert!(
                matches!(result, Ok(Ok(true))),
                "{}: lock() after the restart: {result:?}",
                l.key()
            );
        }
        let took = started.elapsed();
        eprintln!("lock() through a restart: {took:?}");
        assert!(took < Duration::from_secs(6), "took {took:?}");
    });
}

/// A release that fails because no connection could be had (a paused server: its pooled
/// connection timed out and was dropped, and a new one cannot be set up) fails within about one
/// bound, not two: nothing was sent, so the clean-up is not tried again before the call
/// returns, but left to the background (and the drain of the dropped client).
#[test]
fn a_release_with_no_connection_fails_within_one_bound() {
    init_logging();
    let server = RedisServer::start();
    let (connect, command) = (Duration::from_secs(2), Duration::from_secs(6));
    let c = LockClient::builder(server.url())
        .pool_size(1)
        .connect_timeout(connect)
        .command_timeout(Some(command))
        .build()
        .expect("client");
    let lock = c
        .lock("f:no-conn")
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = lock.try_lock().unwrap();

    server.pause();
    // The pooled connection times out and is dropped (a read: it leaves no clean-up behind,
    // nor a background try competing for the pool): the release needs a new connection.
    assert!(held.is_held().expect_err("paused").is_timeout());

    let started = Instant::now();
    let released = held.unlock();
    let took = started.elapsed();
    server.resume();
    let e = released.expect_err("no connection to the paused server");
    assert!(e.is_transient() && !e.is_timeout(), "{}", e.report());
    // One checkout of a connection that cannot be set up (about 2 connect timeouts here: 4 s);
    // a second try in-line took as long again (about 8 s). Between the two, with 2 s of margin
    // either way.
    assert!(took < 3 * connect, "unlock took {took:?}");
}
