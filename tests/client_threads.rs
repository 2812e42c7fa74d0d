//! Short-lived clients do not leave threads behind: each client's pool scheduler stops with
//! it (r2d2's default kept 3 threads per dropped client alive for up to 30 s).
//!
//! Its own test binary with a single test, so that no other test's threads are counted.

mod support;

use std::time::Duration;

use redis_dlock::LockClient;
use support::{init_logging, wait_until, RedisServer};

/// Threads of this process, from `/proc/self/task`.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .count()
}

#[test]
fn dropped_clients_leave_no_threads() {
    init_logging();
    let server = RedisServer::start();
    let before = threads();
    let holder = LockClient::open(server.url()).expect("client");
    for i in 0..20 {
        let client = LockClient::open(server.url()).expect("client");
        let lock = client
            .lock(format!("threads:{i}"))
            .ttl(Duration::from_secs(10))
            .build()
            .expect("lock");
        // A lock cycle, so that the pool opened a connection on its scheduler.
        assert!(lock.try_lock().expect("free").unlock().expect("unlock"));
        // A watched hold (the watchdog thread) and a wait woken by pub/sub (the subscriber
        // thread), held by another client.
        let watched = client.lock(format!("threads:w:{i}")).build().expect("lock");
        let watched_guard = watched.try_lock().expect("free");
        let held = holder.lock(format!("threads:h:{i}")).build().expect("lock");
        let held_guard = held.try_lock().expect("free");
        let waiter = client.lock(format!("threads:h:{i}")).build().expect("lock");
        assert!(waiter.try_lock_for(Duration::from_millis(20)).is_err());
        assert!(held_guard.unlock().expect("unlock"));
        assert!(watched_guard.unlock().expect("unlock"));
        drop((lock, watched, waiter));
        drop(client);
    }
    // The live client `holder` has a few threads (its pool scheduler, its watchdog); 20
    // dropped ones must not add up (61 threads before the fix).
    let bounded = wait_until(Duration::from_secs(10), || threads() <= before + 8);
    assert!(
        bounded,
        "{} threads after 20 dropped clients, {before} before",
        threads()
    );
}
