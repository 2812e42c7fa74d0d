//! Owned guards (`ArcLockExt`) and `try_lock_until`: a hold that crosses threads and sits in a
//! struct, released by drop or by `unlock()` from another thread.

mod support;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::ClassicOptions;
use redis_dlock::{
    ArcLockExt, DistributedLock, GuardSend, LockClient, LockError, OwnedLockGuard, Strategy,
};
use support::{init_logging, raw, RedisServer};

/// A worker that keeps its hold between calls, as a service object would.
struct Job {
    hold: Option<OwnedLockGuard<dyn DistributedLock, GuardSend>>,
}

#[test]
fn owned_guards_cross_threads_and_release() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = LockClient::open(server.url()).unwrap();
    for strategy in [Strategy::Token, Strategy::Classic(ClassicOptions::new())] {
        let key = format!("owned:{strategy:?}");
        let lock: Arc<dyn DistributedLock> = Arc::from(
            c.lock(key.as_str())
                .strategy(strategy)
                .ttl(Duration::from_secs(10))
                .build()
                .unwrap(),
        );
        let other = c
            .lock(key.as_str())
            .strategy(strategy)
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap();

        // Taken here, kept in a struct, released on another thread by unlock().
        let mut job = Job {
            hold: Some(lock.lock_arc().unwrap().into_send().unwrap()),
        };
        assert_eq!(
            raw::get(&mut conn, &key).as_deref(),
            job.hold.as_ref().map(|g| g.lease().value())
        );
        assert!(matches!(other.try_lock(), Err(LockError::Held { .. })));
        let guard = job.hold.take().unwrap();
        let released = thread::spawn(move || guard.unlock()).join().unwrap();
        assert!(released.unwrap(), "{key}: unlocked from another thread");
        assert!(!raw::exists(&mut conn, &key), "{key}");

        // Dropped on another thread: released too.
        let guard = lock.try_lock_arc().unwrap().into_send().unwrap();
        thread::spawn(move || drop(guard)).join().unwrap();
        assert!(!raw::exists(&mut conn, &key), "{key}: released on drop");

        // The guard keeps the lock object alive after the caller's Arc is gone.
        let guard = Arc::clone(&lock)
            .try_lock_arc_for(Duration::from_secs(1))
            .unwrap();
        assert!(guard.is_held().unwrap() && guard.check().is_ok());
        assert!(Arc::strong_count(guard.lock()) >= 2);
        drop(guard);
    }
}

#[test]
fn try_lock_until_honours_the_deadline() {
    init_logging();
    let server = RedisServer::start();
    let c = LockClient::open(server.url()).unwrap();
    let lock: Arc<dyn DistributedLock> = Arc::from(
        c.lock("owned:until")
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let held = lock.try_lock_arc().unwrap();
    // A deadline in the past: one attempt, refused.
    let t = Instant::now();
    let past = lock.try_lock_until(t);
    assert!(
        matches!(past, Err(LockError::Timeout { attempts: 1, .. })),
        "{past:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    // A deadline 300 ms away: gives up after about that long.
    let t = Instant::now();
    let r = lock.try_lock_until(t + Duration::from_millis(300));
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Released meanwhile: taken before the deadline.
    let queued = c.test_hooks().count(Event::Queued);
    let waiter = {
        let lock = Arc::clone(&lock);
        thread::spawn(move || {
            lock.try_lock_arc_until(Instant::now() + Duration::from_secs(5))
                .map(|g| g.unlock())
        })
    };
    support::wait_event(&c, Event::Queued, queued + 1);
    assert!(held.unlock().unwrap());
    assert!(waiter.join().unwrap().unwrap().unwrap());
}

/// The guard of a hold that is not the thread's (its token's or value's) takes the `Send` form
/// and is released from another thread; a Reentrant hold is its thread's, and its guard is
/// given back unchanged, still holding.
#[test]
fn guards_take_the_send_form_unless_the_hold_is_the_threads() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = LockClient::open(server.url()).unwrap();
    for strategy in [
        Strategy::Token,
        Strategy::Classic(ClassicOptions::new()),
        Strategy::Fair,
        Strategy::Reentrant,
    ] {
        let key = format!("send:{strategy:?}");
        let lock = c
            .lock(key.as_str())
            .strategy(strategy)
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap();
        let guard = lock.try_lock().unwrap();
        let thread_owned = matches!(strategy, Strategy::Reentrant);
        assert_eq!(guard.lease().is_thread_owned(), thread_owned, "{key}");
        match guard.into_send() {
            Ok(guard) => {
                assert!(!thread_owned, "{key}");
                let released = thread::scope(|s| s.spawn(move || guard.unlock()).join().unwrap());
                assert!(released.unwrap(), "{key}: unlocked from another thread");
            }
            Err(guard) => {
                assert!(thread_owned, "{key}");
                assert!(guard.is_held().unwrap(), "{key}: still held");
                // Another thread is another owner: refused while this one holds.
                thread::scope(|s| {
                    s.spawn(|| assert!(matches!(lock.try_lock(), Err(LockError::Held { .. }))));
                });
                assert!(guard.unlock().unwrap(), "{key}");
            }
        }
        assert!(!raw::exists(&mut conn, &key), "{key}: released");
    }
}

/// A guard of a thread-owned lease is built on the thread that took it: built elsewhere it
/// warns (no panic), and its release there is refused, the lease untouched.
#[test]
fn a_guard_of_another_threads_lease_warns_and_its_release_is_refused() {
    support::init_logging();
    let server = support::RedisServer::start();
    let client = redis_dlock::LockClient::open(server.url()).unwrap();
    let lock: std::sync::Arc<redis_dlock::ReentrantLock> = std::sync::Arc::new(
        client
            .lock("owned:moved-lease")
            .strategy(redis_dlock::Strategy::Reentrant)
            .build()
            .unwrap()
            .try_into()
            .unwrap(),
    );
    let lease = {
        let lock = std::sync::Arc::clone(&lock);
        std::thread::spawn(move || redis_dlock::DistributedLock::try_acquire(&*lock).unwrap())
            .join()
            .unwrap()
    };
    let guard = redis_dlock::OwnedLockGuard::new(std::sync::Arc::clone(&lock), lease);
    assert!(matches!(
        guard.unlock(),
        Err(redis_dlock::LockError::Unsupported { .. })
    ));
}
