//! A win whose reply came back too late is never handed out: with the server paused
//! (`CLIENT PAUSE … WRITE`, SIGSTOP) during an acquire, the reply arrives after the lock's
//! lifetime ran out by the local clock. The acquire must release what it won and fail with
//! `LateReply`, and a second client must never hold the lock at the same time as the first.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{
    DistributedLock, LockClient, LockError, RetryPolicy, Strategy, Takeover, WakeUp,
};
use support::{init_logging, raw, RedisServer};

/// The lock's lifetime: shorter than the pause below.
const TTL: Duration = Duration::from_secs(1);
/// How long the server is paused while the acquire is in flight (shorter than the command
/// timeout, so the reply does arrive).
const PAUSE: Duration = Duration::from_millis(1_500);

fn client(server: &RedisServer) -> LockClient {
    LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_secs(5)))
        .build()
        .expect("client")
}

/// The ways to stall the server while an acquire is in flight.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// `CLIENT PAUSE <ms> WRITE`: reads still answer, writes wait.
    ClientPause,
    /// SIGSTOP of the server process, SIGCONT after [`PAUSE`].
    Sigstop,
}

/// Stalls `server` for [`PAUSE`] and runs `acquire` meanwhile (it is sent while the server is
/// stalled); returns its outcome and how long it took.
fn during_stall<T: Send>(
    server: &RedisServer,
    stall: Stall,
    acquire: impl FnOnce() -> T + Send,
) -> (T, Duration) {
    let mut admin = server.conn();
    if let Stall::ClientPause = stall {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(PAUSE.as_millis() as u64)
            .arg("WRITE")
            .query(&mut admin)
            .expect("CLIENT PAUSE");
    } else {
        server.pause();
    }
    thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        let worker = s.spawn(move || {
            let start = Instant::now();
            let _ = tx.send(());
            let out = acquire();
            (out, start.elapsed())
        });
        rx.recv().expect("worker started");
        if let Stall::Sigstop = stall {
            // Time under test: the stall lasts PAUSE.
            thread::sleep(PAUSE);
            server.resume();
        }
        worker.join().expect("worker")
    })
}

/// Asserts a late win was refused with `LateReply` naming `key`, after at least most of the
/// pause, and that the key no longer holds what the refused acquire wrote.
#[track_caller]
fn assert_late<T: std::fmt::Debug>(result: &Result<T, LockError>, key: &str, took: Duration) {
    match result {
        Err(
            e @ LockError::LateReply {
                key: k,
                elapsed,
                ttl,
            },
        ) => {
            assert_eq!(k, key);
            assert_eq!(*ttl, TTL);
            assert!(*elapsed >= PAUSE / 2, "elapsed {elapsed:?}");
            assert!(!e.is_contention(), "a slow server is not contention");
            assert!(e.to_string().contains(key), "{e}");
        }
        other => panic!("expected Err(LateReply) after {took:?}, got {other:?}"),
    }
}

fn classic(c: &LockClient, key: &str, takeover: Takeover, key_ttl: bool) -> Lock {
    let b = c
        .lock(key)
        .strategy(Strategy::Classic(
            ClassicOptions::new().takeover(takeover).key_ttl(key_ttl),
        ))
        .ttl(TTL);
    b.build().expect("classic lock")
}

fn token(c: &LockClient, key: &str) -> Lock {
    c.lock(key).ttl(TTL).build().expect("token lock")
}

/// The report's reproduction: a Classic `try_lock` sent during the pause wins with an expiry
/// that has passed by the time it returns. It must not be handed out, and a second client then
/// gets the lock, alone.
#[test]
fn classic_try_lock_during_pause_is_not_handed_out() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    for stall in [Stall::ClientPause, Stall::Sigstop] {
        for (takeover, key_ttl) in [(Takeover::GetSet, false), (Takeover::CompareAndSet, true)] {
            let key = format!("late:classic:{stall:?}:{takeover:?}");
            let c1 = client(&server);
            let c2 = client(&server);
            let l1 = classic(&c1, &key, takeover, key_ttl);
            let l2 = classic(&c2, &key, takeover, key_ttl);
            let (first, took) =
                during_stall(&server, stall, || l1.try_lock().map(|g| g.into_lease()));
            assert_late(&first, &key, took);
            // What the refused acquire wrote was deleted again.
            assert_eq!(
                raw::get(&mut conn, &key),
                None,
                "{key}: the late win was released"
            );
            // The second client gets the lock, and the first is refused while it holds it.
            let g2 = l2
                .try_lock()
                .unwrap_or_else(|e| panic!("{key}: second client: {e}"));
            assert!(!g2.is_lost());
            assert!(
                matches!(l1.try_lock(), Err(LockError::Held { .. })),
                "{key}"
            );
            assert!(g2.unlock().unwrap());
        }
    }
}

/// Two clients whose acquires are both sent during the pause: each value written carries an
/// expiry that has passed when the server answers, so the second one's takeover of the first
/// one's "stale" value also wins. Neither may be handed out.
#[test]
fn classic_two_clients_during_pause_never_both_hold() {
    init_logging();
    let server = RedisServer::start();
    for stall in [Stall::ClientPause, Stall::Sigstop] {
        let key = format!("late:classic-two:{stall:?}");
        let c1 = client(&server);
        let c2 = client(&server);
        let l1 = classic(&c1, &key, Takeover::GetSet, false);
        let l2 = classic(&c2, &key, Takeover::GetSet, false);
        let ((a, b), took) = during_stall(&server, stall, || {
            thread::scope(|s| {
                let a = s.spawn(|| l1.try_lock().map(|g| g.into_lease()));
                let b = s.spawn(|| l2.try_lock().map(|g| g.into_lease()));
                (a.join().expect("a"), b.join().expect("b"))
            })
        });
        let won: Vec<_> = [&a, &b].into_iter().filter(|r| r.is_ok()).collect();
        assert!(
            won.len() <= 1,
            "{key}: two holders after {took:?}: {a:?} {b:?}"
        );
        for r in [&a, &b] {
            match r {
                Ok(lease) => assert!(!lease.is_expired(), "{key}: an expired hold was handed out"),
                Err(LockError::LateReply { .. }) | Err(LockError::Held { .. }) => {}
                Err(e) => panic!("{key}: {e:?}"),
            }
        }
    }
}

/// Token with an explicit 1 s lifetime: the same pause must refuse the win (and delete the
/// token), so a second client gets the lock at once.
#[test]
fn token_try_lock_during_pause_is_not_handed_out() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    for stall in [Stall::ClientPause, Stall::Sigstop] {
        for fencing in [false, true] {
            let key = format!("late:token:{stall:?}:{fencing}");
            let c1 = client(&server);
            let c2 = client(&server);
            let b = c1.lock(key.as_str()).ttl(TTL);
            let l1 = if fencing { b.fencing() } else { b }.build().unwrap();
            let l2 = token(&c2, &key);
            let (first, took) =
                during_stall(&server, stall, || l1.try_lock().map(|g| g.into_lease()));
            assert_late(&first, &key, took);
            assert_eq!(
                raw::get(&mut conn, &key),
                None,
                "{key}: the late win was released"
            );
            let g2 = l2
                .try_lock()
                .unwrap_or_else(|e| panic!("{key}: second client: {e}"));
            assert!(
                matches!(l1.try_lock(), Err(LockError::Held { .. })),
                "{key}"
            );
            assert!(g2.unlock().unwrap());
        }
    }
}

/// The reentrant lock (explicit 1 s lifetime) under the same pause.
#[test]
fn reentrant_try_lock_during_pause_is_not_handed_out() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "late:reentrant";
    let c1 = client(&server);
    let c2 = client(&server);
    let l1 = c1
        .lock(key)
        .strategy(Strategy::Reentrant)
        .ttl(TTL)
        .build()
        .unwrap();
    let l2 = c2
        .lock(key)
        .strategy(Strategy::Reentrant)
        .ttl(TTL)
        .build()
        .unwrap();
    let (first, took) = during_stall(&server, Stall::ClientPause, || {
        l1.try_lock().map(|g| g.into_lease())
    });
    assert_late(&first, key, took);
    assert!(!raw::exists(&mut conn, key), "the late hold was given back");
    let g2 = l2.try_lock().expect("second client");
    assert!(g2.unlock().unwrap());
}

/// The read-write lock's write side under the same pause.
#[test]
fn rwlock_write_during_pause_is_not_handed_out() {
    init_logging();
    let server = RedisServer::start();
    let key = "late:rw";
    let c1 = client(&server);
    let c2 = client(&server);
    let rw1 = c1.rw_lock(key).ttl(TTL).build().unwrap();
    let rw2 = c2.rw_lock(key).ttl(TTL).build().unwrap();
    let (first, took) = during_stall(&server, Stall::ClientPause, || {
        rw1.write_lock().try_lock().map(|g| g.into_lease())
    });
    assert_late(&first, key, took);
    let g2 = rw2.write_lock().try_lock().expect("second client");
    assert!(g2.unlock().unwrap());
}

/// A blocking `lock()` whose first attempt won too late tries again and returns a fresh hold
/// with (nearly) its whole lifetime left.
#[test]
fn blocking_lock_retries_after_a_late_win() {
    init_logging();
    let server = RedisServer::start();
    for strategy in [Strategy::Classic(ClassicOptions::new()), Strategy::Token] {
        let key = format!("late:blocking:{strategy:?}");
        let c = client(&server);
        let b = c
            .lock(key.as_str())
            .strategy(strategy)
            .ttl(TTL)
            .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(10))));
        let b = if strategy == Strategy::Token {
            b.wake_up(WakeUp::Polling)
        } else {
            b
        };
        let lock = b.build().unwrap();
        let (got, took) = during_stall(&server, Stall::ClientPause, || {
            lock.lock().map(|g| g.into_lease())
        });
        let lease = got.unwrap_or_else(|e| panic!("{key}: lock() after {took:?}: {e}"));
        assert!(
            lease.remaining() > TTL / 2,
            "{key}: handed out with {:?} left",
            lease.remaining()
        );
        assert!(lock.release(&lease).unwrap());
    }
}

/// A blocking acquire whose every attempt wins too late reports `LateReply`, not a timeout
/// (which would read as contention).
#[test]
fn blocking_lock_that_only_wins_late_reports_late_reply() {
    init_logging();
    let server = RedisServer::start();
    let key = "late:only-late";
    let c = client(&server);
    let lock = c
        .lock(key)
        .ttl(TTL)
        .wake_up(WakeUp::Polling)
        .retry(RetryPolicy::no_wait())
        .build()
        .unwrap();
    let (got, took) = during_stall(&server, Stall::ClientPause, || {
        lock.lock().map(|g| g.into_lease())
    });
    assert_late(&got, key, took);
}

/// The check does not refuse holds that are still valid: a watched lock (30 s lease) whose
/// reply took the whole pause keeps its win.
#[test]
fn long_lease_survives_the_same_pause() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "late:watched";
    let c = client(&server);
    let other = client(&server);
    let lock = c.lock(key).build().unwrap();
    let rival = other.lock(key).build().unwrap();
    let (got, took) = during_stall(&server, Stall::ClientPause, || {
        lock.try_lock().map(|g| g.into_lease())
    });
    let lease = got.unwrap_or_else(|e| panic!("try_lock after {took:?}: {e}"));
    assert_eq!(raw::get(&mut conn, key).as_deref(), Some(lease.value()));
    assert!(matches!(rival.try_lock(), Err(LockError::Held { .. })));
    assert!(lock.release(&lease).unwrap());
}
