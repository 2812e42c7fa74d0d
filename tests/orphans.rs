//! No orphaned locks after a lost reply or a failed release: the client deletes what it may
//! have written, owner-checked, in the background, so other clients do not wait out a lease.
//!
//! The server is paused with SIGSTOP while an acquire is in flight: the caller's command times
//! out, but the command sits in the server's socket buffer and runs when the server is
//! resumed, leaving a lock nobody holds.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, LockClient, LockError, RetryPolicy, Strategy, Takeover};
use support::{init_logging, raw, wait_until, RedisServer};

/// The impatient client's command timeout.
const TIMEOUT: Duration = Duration::from_millis(500);
/// How long the server stays paused: well past [`TIMEOUT`].
const PAUSE: Duration = Duration::from_millis(1_500);
/// Slack for a loaded 2-core machine on top of "one command timeout after the server answers".
const SLACK: Duration = Duration::from_millis(2_500);

/// A client with short timeouts whose pool already holds a connection (one lock cycle on
/// another key), so that the acquire under test is really sent, as in a running service.
fn impatient(server: &RedisServer) -> LockClient {
    let c = LockClient::builder(&server.url())
        .connect_timeout(TIMEOUT)
        .command_timeout(Some(TIMEOUT))
        .pool_size(1)
        .build()
        .expect("client");
    let warm = c.lock("orphan:warm-up").build_token().expect("lock");
    assert!(warm.try_lock().expect("warm-up").unlock().expect("warm-up"));
    c
}

fn patient(server: &RedisServer) -> LockClient {
    LockClient::open(&server.url()).expect("client")
}

/// SIGSTOPs the server, runs `acquire` (which must fail on the timeout), and resumes the server
/// after [`PAUSE`]. Returns when the server was resumed.
fn acquire_during_sigstop<T: std::fmt::Debug>(
    server: &RedisServer,
    acquire: impl FnOnce() -> Result<T, LockError>,
) -> Instant {
    server.pause();
    let paused = Instant::now();
    let result = acquire();
    match result {
        Err(LockError::Connection { .. }) => {}
        other => {
            server.resume();
            panic!("expected a timeout (Connection error) while paused, got {other:?}");
        }
    }
    thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
    server.resume();
    Instant::now()
}

/// Waits (bounded) until `lock` can be taken by a fresh client and returns how long after
/// `since` that was.
fn taken_after(lock: &dyn DistributedLock, since: Instant) -> Duration {
    let guard = lock
        .try_lock_for(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("second client: {e} ({:?} after resume)", since.elapsed()));
    let after = since.elapsed();
    assert!(guard.unlock().unwrap());
    after
}

#[test]
fn token_acquire_whose_reply_was_lost_leaves_no_orphan() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:token";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    // Watched: a 30 s lease, so an orphan would block the second client for 30 s.
    let l1 = c1.lock(key).build().unwrap();
    let l2 = c2
        .lock(key)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(10))))
        .build()
        .unwrap();
    let resumed = acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
    let after = taken_after(l2.as_ref(), resumed);
    assert!(
        after < TIMEOUT + SLACK,
        "the second client waited {after:?} after the server answered again"
    );
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
    assert!(!raw::exists(&mut conn, key));
}

#[test]
fn token_blocking_acquire_whose_reply_was_lost_leaves_no_orphan() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:token-blocking";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).fencing().build().unwrap();
    let l2 = c2.lock(key).build().unwrap();
    // Once through, so the server has the acquire script cached (else the paused EVALSHA would
    // only be answered NOSCRIPT and never write).
    assert!(l1.try_lock().unwrap().unlock().unwrap());
    let resumed = acquire_during_sigstop(&server, || {
        l1.try_lock_for(Duration::from_secs(1))
            .map(|g| g.into_lease())
    });
    let after = taken_after(l2.as_ref(), resumed);
    assert!(after < TIMEOUT + SLACK, "waited {after:?} after resume");
}

#[test]
fn classic_acquire_whose_reply_was_lost_leaves_no_orphan() {
    init_logging();
    let server = RedisServer::start();
    for takeover in [Takeover::GetSet, Takeover::CompareAndSet] {
        let key = format!("orphan:classic:{takeover:?}");
        let c1 = impatient(&server);
        let c2 = patient(&server);
        // A long lifetime: without the clean-up, the orphan would be stale only after 20 s.
        let build = |c: &LockClient| {
            c.lock(key.as_str())
                .strategy(Strategy::Classic)
                .takeover(takeover)
                .ttl(Duration::from_secs(20))
                .build()
                .unwrap()
        };
        let (l1, l2) = (build(&c1), build(&c2));
        let resumed = acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
        let after = taken_after(l2.as_ref(), resumed);
        assert!(
            after < TIMEOUT + SLACK,
            "{key}: waited {after:?} after resume"
        );
    }
}

/// The clean-up only ever deletes its own value: here another owner held the key all along, so
/// the lost `SET NX` never wrote, and the clean-up must leave the other owner's lock alone.
#[test]
fn cleanup_never_deletes_another_owners_lock() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:foreign";
    raw::set(&mut conn, key, b"foreign-owner");
    let c1 = impatient(&server);
    let l1 = c1.lock(key).build().unwrap();
    acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
    assert_eq!(
        raw::get(&mut conn, key).as_deref(),
        Some(&b"foreign-owner"[..])
    );
}

/// A release that fails on a connection error (writes paused past the command timeout) is
/// retried in the background: the caller learns of the failure at once, and the key is freed
/// soon after the server takes writes again, not at the end of the lease.
#[test]
fn failed_release_is_retried_in_the_background() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:release";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).build().unwrap();
    let l2 = c2.lock(key).build().unwrap();
    let guard = l1.try_lock().unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE.as_millis() as u64)
        .arg("WRITE")
        .query(&mut conn)
        .unwrap();
    let paused = Instant::now();
    let released = guard.unlock();
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert_eq!(
        c1.pending_cleanups(),
        1,
        "the release is queued for a retry"
    );
    let resumed = paused + PAUSE;
    let after = taken_after(l2.as_ref(), resumed);
    assert!(
        after < TIMEOUT + SLACK,
        "waited {after:?} after the pause ended"
    );
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
}

/// The reentrant lock: a lost first acquire is given back (the owner's count is 1 exactly), so
/// a second client does not wait out the 30 s lease.
#[test]
fn reentrant_acquire_whose_reply_was_lost_leaves_no_orphan() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:reentrant";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let l2 = c2.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    // Once through, so the acquire script is cached on the server.
    assert!(l1.try_lock().unwrap().unlock().unwrap());
    let resumed = acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
    let after = taken_after(l2.as_ref(), resumed);
    assert!(after < TIMEOUT + SLACK, "waited {after:?} after resume");
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
}

/// A lost re-entry is given back only at the count it would have made: the thread's first
/// hold stays, and its release frees the lock.
#[test]
fn reentrant_lost_reentry_keeps_the_first_hold() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:reentry";
    let c1 = impatient(&server);
    let l1 = c1.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let first = l1.try_lock().unwrap();
    let owner = String::from_utf8(first.value().to_vec()).unwrap();
    acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
    let count: Option<String> = redis::cmd("HGET")
        .arg(key)
        .arg(&owner)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        count.as_deref(),
        Some("1"),
        "the first hold stays, the lost one is gone"
    );
    assert!(first.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "the last hold freed the lock");
}

/// The reentrant lock's release that failed on a connection error is retried in the
/// background, at the owner's count before the release (so never twice).
#[test]
fn reentrant_failed_release_is_retried_in_the_background() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:reentrant-release";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let l2 = c2.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let guard = l1.try_lock().unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE.as_millis() as u64)
        .arg("WRITE")
        .query(&mut conn)
        .unwrap();
    let paused = Instant::now();
    let released = guard.unlock();
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert_eq!(
        c1.pending_cleanups(),
        1,
        "the release is queued for a retry"
    );
    let after = taken_after(l2.as_ref(), paused + PAUSE);
    assert!(
        after < TIMEOUT + SLACK,
        "waited {after:?} after the pause ended"
    );
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
}
