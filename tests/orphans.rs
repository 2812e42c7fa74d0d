//! No orphaned locks after a lost reply or a failed release: the client deletes what it may
//! have written, owner-checked, in the background, so other clients do not wait out a lease.
//!
//! The server is paused with SIGSTOP while an acquire is in flight: the caller's command times
//! out, but the command sits in the server's socket buffer and runs when the server is
//! resumed, leaving a lock nobody holds.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::ReentrantLock;
use redis_dlock::{
    DistributedLock, FairLock, LockClient, LockError, RetryPolicy, Strategy, Takeover,
};
use support::proxy::{Mode, Proxy};
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
    impatient_at(server.url())
}

/// [`impatient`] at any URL (a proxy's).
fn impatient_at(url: String) -> LockClient {
    let c = LockClient::builder(url)
        .connect_timeout(TIMEOUT)
        .command_timeout(Some(TIMEOUT))
        .pool_size(1)
        .build()
        .expect("client");
    let warm = c.lock("orphan:warm-up").build().expect("lock");
    assert!(warm.try_lock().expect("warm-up").unlock().expect("warm-up"));
    c
}

fn patient(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
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
    // Time under test: the server stays paused for PAUSE.
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
    let after = taken_after(&l2, resumed);
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
    let after = taken_after(&l2, resumed);
    assert!(after < TIMEOUT + SLACK, "waited {after:?} after resume");
}

/// A Classic acquire whose reply was lost is not cleaned up (its value names no owner: see the
/// next test): what it wrote goes stale after the lock's lifetime, and then the next contender
/// takes it over.
#[test]
fn classic_acquire_whose_reply_was_lost_goes_stale_after_its_lifetime() {
    init_logging();
    let server = RedisServer::start();
    let ttl = Duration::from_secs(3);
    for takeover in [Takeover::GetSet, Takeover::CompareAndSet] {
        let key = format!("orphan:classic:{takeover:?}");
        let c1 = impatient(&server);
        let c2 = patient(&server);
        let build = |c: &LockClient| {
            c.lock(key.as_str())
                .strategy(Strategy::Classic(ClassicOptions::new().takeover(takeover)))
                .ttl(ttl)
                .retry(RetryPolicy::legacy().max_wait(Some(Duration::from_secs(10))))
                .build()
                .unwrap()
        };
        let (l1, l2) = (build(&c1), build(&c2));
        let sent = Instant::now();
        let resumed = acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
        assert_eq!(c1.pending_cleanups(), 0, "{key}: nothing queued");
        // The orphan's expiry was taken when the acquire was sent.
        let after = taken_after(&l2, resumed);
        assert!(
            sent.elapsed() >= ttl && after < ttl + SLACK,
            "{key}: taken {after:?} after resume"
        );
    }
}

/// Two contenders that write in the same millisecond write the same Classic value: an expiry
/// names no owner. When one's reply is lost and the other wins, deleting "our" value would free
/// the winner's lock, so a lost Classic acquire is left to go stale instead (a fault-suite run
/// under SIGSTOP once found one overlapping pair of holds this way). The loser's write is held
/// back by `CLIENT PAUSE … WRITE` past its command timeout and never runs; the winner's runs
/// when the pause ends. Both values are taken just after one barrier, so most rounds share a
/// millisecond (before the fix, the winner's lock was deleted in each such round).
#[test]
fn a_lost_classic_acquire_never_frees_a_lock_with_the_same_value() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let loser = impatient(&server);
    let winner = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_secs(10)))
        .build()
        .expect("client");
    for round in 0..4 {
        let key = format!("orphan:classic-same-value:{round}");
        let build = |c: &LockClient| {
            c.lock(key.as_str())
                .strategy(Strategy::Classic(ClassicOptions::new()))
                .ttl(Duration::from_secs(20))
                .retry(RetryPolicy::no_wait())
                .build()
                .unwrap()
        };
        let (lw, ll) = (build(&winner), build(&loser));
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg((2 * TIMEOUT).as_millis() as u64)
            .arg("WRITE")
            .query(&mut conn)
            .unwrap();
        let barrier = std::sync::Barrier::new(2);
        let (won, lost) = thread::scope(|s| {
            let w = s.spawn(|| {
                barrier.wait();
                lw.try_lock().map(|g| g.into_lease())
            });
            let l = s.spawn(|| {
                barrier.wait();
                ll.try_lock().map(|g| g.into_lease())
            });
            (w.join().unwrap(), l.join().unwrap())
        });
        assert!(
            matches!(lost, Err(LockError::Connection { .. })),
            "{key}: the loser's write must time out: {lost:?}"
        );
        let won = won.unwrap_or_else(|e| panic!("{key}: the winner: {e}"));
        assert!(wait_until(Duration::from_secs(10), || loser
            .pending_cleanups()
            == 0));
        assert_eq!(
            raw::get(&mut conn, &key).as_deref(),
            Some(won.value()),
            "{key}: the winner's lock was freed by the loser's clean-up"
        );
        assert!(lw.release(&won).unwrap(), "{key}");
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
/// Pauses the server's writes for [`PAUSE`] (`CLIENT PAUSE … WRITE`: the release blocks, and
/// never runs once its connection is dropped on the timeout), runs `release`, which must fail
/// on the timeout and leave one clean-up queued on `client`, and returns when the pause ends.
fn release_during_write_pause(
    server: &RedisServer,
    client: &LockClient,
    release: impl FnOnce() -> Result<bool, LockError>,
) -> Instant {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE.as_millis() as u64)
        .arg("WRITE")
        .query(&mut server.conn())
        .unwrap();
    let paused = Instant::now();
    let released = release();
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert_eq!(
        client.pending_cleanups(),
        1,
        "the release is queued for a retry"
    );
    paused + PAUSE
}

/// `lock` is taken by another client within a command timeout (plus slack) of `resumed`, and
/// `client`'s clean-ups are all done soon after.
fn taken_soon_after(lock: &dyn DistributedLock, resumed: Instant, client: &LockClient) {
    let after = taken_after(lock, resumed);
    assert!(
        after < TIMEOUT + SLACK,
        "waited {after:?} after the pause ended"
    );
    assert!(wait_until(Duration::from_secs(5), || client
        .pending_cleanups()
        == 0));
}

#[test]
fn failed_release_is_retried_in_the_background() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:release";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).build().unwrap();
    let l2 = c2.lock(key).build().unwrap();
    let guard = l1.try_lock().unwrap();
    let resumed = release_during_write_pause(&server, &c1, || guard.unlock());
    taken_soon_after(&l2, resumed, &c1);
}

/// A fair lock on `key` whose waiters poll only every 10 s: they get the lock sooner only by
/// a grant.
fn slow_polling_fair(client: &LockClient, key: &str) -> FairLock {
    client
        .lock(key)
        .retry(RetryPolicy::standard().fixed_delay(Duration::from_secs(10)))
        .strategy(Strategy::Fair)
        .build()
        .unwrap()
        .try_into()
        .expect("the strategy built")
}

/// Waits (bounded) until the queue of the fair `lock` has `n` entries.
fn fair_queued(conn: &mut redis::Connection, lock: &impl DistributedLock, n: usize) -> bool {
    let queue = FairLock::queue_key_for(lock.key()).expect("queue key");
    wait_until(Duration::from_secs(5), || {
        redis::cmd("ZCARD")
            .arg(&queue)
            .query::<usize>(conn)
            .unwrap()
            == n
    })
}

/// A waiter got the lock at `got`, within a command timeout (plus slack) of `resumed`.
fn granted_soon_after(got: Instant, resumed: Instant) {
    let after = got.saturating_duration_since(resumed);
    assert!(
        after < TIMEOUT + SLACK,
        "the waiter got the lock {after:?} after the server answered again"
    );
}

/// `client`'s clean-ups are all done soon, and `key` is free.
fn cleaned_up(client: &LockClient, conn: &mut redis::Connection, key: &str) {
    assert!(wait_until(Duration::from_secs(5), || client
        .pending_cleanups()
        == 0));
    assert!(!raw::exists(conn, key));
}

/// Waits for `lock` (up to 30 s), releases it and returns when it was taken.
fn taken_at(lock: &FairLock) -> Instant {
    let g = lock
        .try_lock_for(Duration::from_secs(30))
        .expect("the waiter gets the lock");
    let at = Instant::now();
    assert!(g.unlock().unwrap());
    at
}

/// A fair lock release that failed is sent again in the background as the same script: the
/// waiter queued behind it is granted the lock when that retry runs, not at its next poll
/// (made 10 s away here by its retry policy).
#[test]
fn fair_failed_release_is_retried_and_grants_the_next_waiter() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:fair";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).strategy(Strategy::Fair).build().unwrap();
    let l2 = slow_polling_fair(&c2, key);
    let guard = l1.try_lock().unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| taken_at(&l2));
        assert!(fair_queued(&mut conn, &l2, 1));
        let resumed = release_during_write_pause(&server, &c1, || guard.unlock());
        granted_soon_after(waiter.join().unwrap(), resumed);
    });
    cleaned_up(&c1, &mut conn, key);
}

/// A fair waiter whose poll got no reply (the server stopped with SIGSTOP) gives up with the
/// error. The poll runs when the server comes back, after or before the holder's release that
/// was sent meanwhile, which grants the lock to that waiter: so the lock is granted to a
/// waiter that left (and raised to the full lease if the poll ran second). The janitor sends
/// the waiter's fair release: the lock passes to the next waiter, whose own polls are 10 s
/// apart, within a command timeout of the server's return.
#[test]
fn fair_waiter_whose_poll_reply_was_lost_passes_the_lock_on() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:fair-poll";
    let c0 = patient(&server);
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let holder = c0.lock(key).strategy(Strategy::Fair).build().unwrap();
    let w1 = c1.lock(key).strategy(Strategy::Fair).build().unwrap();
    let w2 = slow_polling_fair(&c2, key);
    let held = support::send(holder.try_lock().unwrap());
    thread::scope(|s| {
        let first = s.spawn(|| w1.try_lock_for(Duration::from_secs(20)).map(|_| ()));
        assert!(fair_queued(&mut conn, &w1, 1));
        let second = s.spawn(|| taken_at(&w2));
        assert!(fair_queued(&mut conn, &w1, 2));
        server.pause();
        let paused = Instant::now();
        // Sent into the stopped server: runs when it is resumed.
        let release = s.spawn(|| held.unlock());
        let gave_up = first.join().unwrap();
        assert!(
            matches!(gave_up, Err(LockError::Connection { .. })),
            "{gave_up:?}"
        );
        // Time under test: the server stays paused for PAUSE.
        thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
        server.resume();
        let resumed = Instant::now();
        assert!(release.join().unwrap().unwrap(), "the holder's release");
        granted_soon_after(second.join().unwrap(), resumed);
    });
    cleaned_up(&c1, &mut conn, key);
}

/// A reentrant release that timed out (the server paused) but ran when the server came back is
/// not given back a second time by the janitor's retry: the janitor gives a hold back only if
/// the owner's count is still the one before the release (`lua/reentrant_forget.lua`).
#[test]
fn reentrant_release_that_ran_late_is_not_given_back_twice() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:reentrant-late";
    let c1 = impatient(&server);
    let lock: ReentrantLock = c1
        .lock(key)
        .strategy(Strategy::Reentrant)
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let outer = lock.try_lock().unwrap();
    let inner = lock.try_lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    server.pause();
    let released = inner.unlock();
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert_eq!(
        c1.pending_cleanups(),
        1,
        "the release is queued for a retry"
    );
    // Time under test: the server stays paused for PAUSE.
    thread::sleep(PAUSE);
    // The release sits in the server's socket buffer and runs now; the janitor's tries find
    // the count already lower and change nothing.
    server.resume();
    assert!(wait_until(Duration::from_secs(10), || c1
        .pending_cleanups()
        == 0));
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "one hold given back, not two"
    );
    assert!(outer.unlock().unwrap());
    assert!(!raw::exists(&mut server.conn(), key));
}

/// A reentrant release that failed before it reached the server (the server was down; it comes
/// back with its data from the AOF) is given back by the janitor exactly once, also when the
/// owner asks for the lock again meanwhile: its next acquire first finishes that job, so the new
/// hold is never taken for the old one.
#[test]
fn reentrant_release_that_never_ran_is_given_back_once() {
    init_logging();
    let mut server = RedisServer::start_with(&["--appendonly", "yes"]);
    let key = "orphan:reentrant-lost";
    let c1 = impatient(&server);
    let lock: ReentrantLock = c1
        .lock(key)
        .strategy(Strategy::Reentrant)
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let only = lock.try_lock().unwrap();
    raw::set(&mut server.conn(), "orphan:marker", b"1");
    server.stop();
    let released = only.unlock();
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert_eq!(c1.pending_cleanups(), 1);
    let again = lock.try_lock();
    assert!(again.is_err(), "the server is down: {again:?}");
    assert_eq!(c1.pending_cleanups(), 1, "the job is kept");
    server.restart();
    assert!(
        raw::exists(&mut server.conn(), "orphan:marker"),
        "the data came back from the AOF"
    );
    // The next acquire gives the old hold back first (or the janitor did), then takes a new
    // one: count 1, not 2 (a hold nobody releases) and not 0 (a later try deleting it).
    let fresh = lock.try_lock().expect("acquire after the restart");
    assert_eq!(lock.hold_count().unwrap(), 1, "the old hold was given back");
    assert_eq!(c1.pending_cleanups(), 0);
    // A later try that would delete it is given time to.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "no later try took the new hold"
    );
    assert!(fresh.unlock().unwrap());
    assert!(!raw::exists(&mut server.conn(), key));
}

/// A reentrant acquire whose reply was lost (it ran when the server came back) does not leave a
/// hold nobody releases: the janitor gives it back if the owner's count is the one the acquire
/// left, so another owner gets the lock within a command timeout, not a 30 s lease.
#[test]
fn reentrant_acquire_whose_reply_was_lost_leaves_no_orphan() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "orphan:reentrant-acquire";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let l2 = c2
        .lock(key)
        .strategy(Strategy::Reentrant)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(10))))
        .build()
        .unwrap();
    let resumed = acquire_during_sigstop(&server, || l1.try_lock().map(|g| g.into_lease()));
    let after = taken_after(&l2, resumed);
    assert!(
        after < TIMEOUT + SLACK,
        "the second client waited {after:?} after the server answered again"
    );
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
    assert!(!raw::exists(&mut conn, key));
}

/// A clean-up that the owner's next acquire took from the queue and tried itself, in vain, is
/// still the janitor's afterwards: the janitor thread, which found its queue empty while the
/// owner had the job and ended, is started again for it. (It was not: the job waited for the
/// owner's next acquire of that key, and the hold for its lease.)
#[test]
fn cleanup_tried_by_the_owner_is_retried_in_the_background() {
    init_logging();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut conn = server.conn();
    let key = "orphan:tried-by-the-owner";
    let client = LockClient::builder(proxy.url())
        .connect_timeout(TIMEOUT)
        .command_timeout(Some(TIMEOUT))
        .pool_size(1)
        .build()
        .expect("client");
    let rw = client.rw_lock(key).build().expect("rw lock");
    // A pooled connection, opened while replies got through (a connection's set-up needs them).
    assert!(rw
        .write_lock()
        .try_lock()
        .expect("warm-up")
        .unlock()
        .expect("warm-up"));
    // The acquire runs on the server and its reply is lost; once it ran, nothing gets through,
    // so no clean-up of it can run yet. Then the same owner (the same thread) acquires again:
    // it tries the undo first, itself, in vain, and fails.
    proxy.set(Mode::DropReplies);
    let (lost, again) = thread::scope(|s| {
        let owner = s.spawn(|| {
            let lost = rw.write_lock().try_lock().map(|g| g.into_lease());
            let again = rw.write_lock().try_lock().map(|g| g.into_lease());
            (lost, again)
        });
        assert!(
            wait_until(support::EVENT_TIMEOUT, || raw::exists(&mut conn, key)),
            "the acquire never ran"
        );
        proxy.set(Mode::Blackhole);
        owner.join().expect("owner thread")
    });
    assert!(
        matches!(lost, Err(LockError::Connection { .. })),
        "expected the acquire to time out, got {lost:?}"
    );
    assert!(again.is_err(), "the owner's acquire got through: {again:?}");
    proxy.set(Mode::Pass);
    // Nobody acquires the key again: the janitor alone must give the hold back.
    assert!(
        wait_until(TIMEOUT + SLACK, || !raw::exists(&mut conn, key)),
        "the hold whose acquire reply was lost was not given back (pending clean-ups: {})",
        client.pending_cleanups()
    );
    assert!(wait_until(TIMEOUT + SLACK, || client.pending_cleanups() == 0));
}

/// The same with a hold already taken: the lost re-entry is given back, the first hold stays.
#[test]
fn reentrant_reentry_whose_reply_was_lost_is_given_back_once() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:reentrant-reentry";
    let c1 = impatient(&server);
    let lock: ReentrantLock = c1
        .lock(key)
        .strategy(Strategy::Reentrant)
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let outer = lock.try_lock().unwrap();
    acquire_during_sigstop(&server, || lock.try_lock().map(|g| g.into_lease()));
    assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "the lost re-entry was given back"
    );
    assert!(outer.unlock().unwrap());
    assert!(!raw::exists(&mut server.conn(), key));
}

/// The reentrant lock's release that failed on a connection error is retried in the
/// background, at the owner's count before the release (so never twice).
#[test]
fn reentrant_failed_release_is_retried_in_the_background() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:reentrant-release";
    let c1 = impatient(&server);
    let c2 = patient(&server);
    let l1 = c1.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let l2 = c2.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    let guard = l1.try_lock().unwrap();
    let resumed = release_during_write_pause(&server, &c1, || guard.unlock());
    taken_soon_after(&l2, resumed, &c1);
}

/// A read-write lock release that failed (the server paused for writes: the command never ran
/// and the connection was dropped) is sent again in the background with its unlock latch, so
/// another client gets the lock within a command timeout of the pause's end, not after the
/// 30 s lease. Both modes.
#[test]
fn rw_failed_release_is_retried_in_the_background() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    for write in [true, false] {
        let key = if write { "orphan:rw-w" } else { "orphan:rw-r" };
        let c1 = impatient(&server);
        let c2 = patient(&server);
        let rw1 = c1.rw_lock(key).build().unwrap();
        let rw2 = c2.rw_lock(key).build().unwrap();
        let guard = if write {
            rw1.write_lock().try_lock().unwrap()
        } else {
            rw1.read_lock().try_lock().unwrap()
        };
        let resumed = release_during_write_pause(&server, &c1, || guard.unlock());
        // The other side must wait for the hold: the writer for a reader's, anyone for a
        // writer's.
        taken_soon_after(rw2.write_lock(), resumed, &c1);
        assert!(!raw::exists(&mut conn, key), "write {write}: nothing left");
    }
}

/// A read-write lock release that timed out (the server stopped with SIGSTOP) but ran when the
/// server came back is not done twice: the janitor's resend carries the same unlock latch, and
/// the server answers it from there. The owner's other hold stays.
#[test]
fn rw_release_that_ran_late_is_not_given_back_twice() {
    init_logging();
    let server = RedisServer::start();
    let key = "orphan:rw-late";
    let c1 = impatient(&server);
    // Both scripts cached, so that the release sent into the stopped server runs as sent.
    let warm = c1.rw_lock("orphan:rw-warm").build().unwrap();
    assert!(warm.write_lock().try_lock().unwrap().unlock().unwrap());
    let rw = c1.rw_lock(key).build().unwrap();
    let outer = rw.write_lock().try_lock().unwrap();
    let inner = rw.write_lock().try_lock().unwrap();
    let before = rw_holds(&server, key);
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0].1, "2", "two write holds: {before:?}");
    server.pause();
    let released = inner.unlock();
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert_eq!(
        c1.pending_cleanups(),
        1,
        "the release is queued for a retry"
    );
    // Time under test: the server stays paused for PAUSE.
    thread::sleep(PAUSE);
    // The release sits in the server's socket buffer and runs now; the janitor's resend is
    // answered from its latch.
    server.resume();
    assert!(wait_until(Duration::from_secs(10), || c1
        .pending_cleanups()
        == 0));
    // A later try that would give back a second hold is given time to.
    thread::sleep(Duration::from_millis(300));
    let after = rw_holds(&server, key);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].1, "1", "one hold given back, not two: {after:?}");
    assert!(outer.unlock().unwrap());
    assert!(!raw::exists(&mut server.conn(), key));
}

/// The owners' fields of a read-write lock's hash and their counts (`mode` left out).
fn rw_holds(server: &RedisServer, key: &str) -> Vec<(String, String)> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    all.into_iter().filter(|(f, _)| f != "mode").collect()
}

/// An impatient client whose read-write scripts are already cached on the server, so that a
/// command sent into a stopped server runs as sent when the server is resumed.
fn impatient_rw(server: &RedisServer) -> LockClient {
    let c = impatient(server);
    let warm = c.rw_lock("orphan:rw-warm").build().unwrap();
    assert!(warm.write_lock().try_lock().unwrap().unlock().unwrap());
    c
}

/// A read-write lock acquire whose reply was lost (it ran when the server came back) does not
/// leave a hold nobody releases: the janitor gives it back if the owner's holds add up to what
/// the acquire left, so another client gets the lock within a command timeout. Both modes.
#[test]
fn rw_acquire_whose_reply_was_lost_leaves_no_orphan() {
    init_logging();
    let server = RedisServer::start();
    for write in [true, false] {
        let key = if write {
            "orphan:rw-acq-w"
        } else {
            "orphan:rw-acq-r"
        };
        let c1 = impatient_rw(&server);
        let c2 = patient(&server);
        let rw1 = c1.rw_lock(key).build().unwrap();
        let rw2 = c2.rw_lock(key).build().unwrap();
        let resumed = acquire_during_sigstop(&server, || {
            if write {
                rw1.write_lock().try_lock().map(|g| g.into_lease())
            } else {
                rw1.read_lock().try_lock().map(|g| g.into_lease())
            }
        });
        let after = taken_after(rw2.write_lock(), resumed);
        assert!(
            after < TIMEOUT + SLACK,
            "write {write}: the second client waited {after:?} after the server answered again"
        );
        assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
        assert!(!raw::exists(&mut server.conn(), key), "write {write}");
    }
}

/// The same with a write hold already taken: a lost re-entry that ran late (SIGSTOP) is given
/// back once, and one that never ran (`CLIENT PAUSE … WRITE`, its connection dropped on the
/// timeout) gives back nothing; either way the first hold stays, and it is the owner's last
/// release that frees the lock.
#[test]
fn rw_reentry_whose_reply_was_lost_is_given_back_once() {
    init_logging();
    let server = RedisServer::start();
    for ran in [true, false] {
        let key = if ran {
            "orphan:rw-reentry-ran"
        } else {
            "orphan:rw-reentry-not"
        };
        let c1 = impatient_rw(&server);
        let rw = c1.rw_lock(key).build().unwrap();
        let first = rw.write_lock().try_lock().unwrap();
        let again = || rw.write_lock().try_lock().map(|g| g.into_lease());
        if ran {
            acquire_during_sigstop(&server, again);
        } else {
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(PAUSE.as_millis() as u64)
                .arg("WRITE")
                .query(&mut server.conn())
                .unwrap();
            let lost = again();
            assert!(
                matches!(lost, Err(LockError::Connection { .. })),
                "{lost:?}"
            );
            // Time under test: the writes stay paused for PAUSE.
            thread::sleep(PAUSE);
        }
        assert!(wait_until(Duration::from_secs(5), || c1.pending_cleanups() == 0));
        let holds = rw_holds(&server, key);
        assert_eq!(holds.len(), 1, "ran {ran}: {holds:?}");
        assert_eq!(holds[0].1, "1", "ran {ran}: one write hold left: {holds:?}");
        assert!(first.unlock().unwrap(), "ran {ran}");
        assert!(!raw::exists(&mut server.conn(), key), "ran {ran}");
    }
}

/// A release whose first send fails on a dropped connection (not a timeout: it is retried
/// in-line) and whose in-line retry is answered reports the release done, not the error: the
/// lock is free, nothing is left for the janitor. For a reentrant owner holding twice, the
/// hold given back in-line is the only one: the outer hold still keeps others out.
#[test]
fn release_whose_in_line_retry_succeeded_reports_it_done() {
    init_logging();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let c1 = impatient_at(proxy.url());
    let c2 = patient(&server);

    let key = "orphan:redone-token";
    let l1 = c1.lock(key).build().unwrap();
    let guard = l1.try_lock().unwrap();
    // The pooled connection and the fresh one the release falls back to.
    proxy.reset_next(2);
    assert!(matches!(guard.unlock(), Ok(true)));
    assert_eq!(c1.pending_cleanups(), 0);
    assert!(!raw::exists(&mut server.conn(), key));

    let key = "orphan:redone-reentrant";
    let lock: ReentrantLock = c1
        .lock(key)
        .strategy(Strategy::Reentrant)
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let outer = lock.try_lock().unwrap();
    let inner = lock.try_lock().unwrap();
    proxy.reset_next(2);
    assert!(matches!(inner.unlock(), Ok(true)));
    assert_eq!(c1.pending_cleanups(), 0);
    assert_eq!(lock.hold_count().unwrap(), 1, "one hold given back");
    let other = c2.lock(key).strategy(Strategy::Reentrant).build().unwrap();
    assert!(other.try_lock().is_err(), "the outer hold keeps others out");
    assert!(outer.unlock().unwrap());
    assert!(!raw::exists(&mut server.conn(), key));
    assert!(other.try_lock().is_ok());

    let key = "orphan:redone-rw";
    let rw = c1
        .rw_lock(key)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let write = rw.write_lock().try_lock().unwrap();
    proxy.reset_next(2);
    assert!(matches!(write.unlock(), Ok(true)));
    assert_eq!(c1.pending_cleanups(), 0);
    assert!(!raw::exists(&mut server.conn(), key));

    let key = "orphan:redone-fair";
    let fair = slow_polling_fair(&c1, key);
    let held = fair.try_lock().unwrap();
    proxy.reset_next(2);
    assert!(matches!(held.unlock(), Ok(true)));
    assert_eq!(c1.pending_cleanups(), 0);
    let rival = slow_polling_fair(&c2, key);
    assert!(rival.try_lock().is_ok(), "free at once");
}
