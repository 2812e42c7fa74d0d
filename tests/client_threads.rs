//! The threads the crate runs, counted by name from `/proc/self/task/*/comm`: an idle client
//! runs none of its own (the process shares one pool scheduler), the watchdog and the
//! subscriber come with their first use, a RedLock over N masters runs N workers, and dropped
//! clients leave no threads behind. `docs/production.md` lists them.
//!
//! Its own test binary with a single test, so that no other test's threads are counted.

mod support;

use std::time::Duration;

use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, RedLockClient};
use support::{init_logging, wait_until, RedisServer};

/// Threads of this process, from `/proc/self/task`.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .count()
}

/// The names of this process's threads that the crate started (`dlock-*`, `redlock-*`; Linux
/// keeps 15 bytes of a name), sorted.
fn crate_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_owned())
        .filter(|name| name.contains("dlock"))
        .collect();
    names.sort();
    names
}

/// Waits (a thread exits shortly after its client is dropped) until the crate's threads are
/// `want`, and says which they are if they never are.
fn expect_threads(what: &str, want: &[&str]) {
    let matches = || crate_threads() == want;
    assert!(
        wait_until(Duration::from_secs(10), matches),
        "{what}: the crate's threads are {:?}, expected {want:?}",
        crate_threads()
    );
}

/// A lock on `key` with a 10 s lifetime, taken and released once, so that the client's pool
/// opened a connection on its scheduler.
fn cycled(client: &LockClient, key: &str) -> Lock {
    let lock = client
        .lock(key)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("lock");
    assert!(lock.try_lock().expect("free").unlock().expect("unlock"));
    lock
}

#[test]
fn threads_of_each_configuration() {
    init_logging();
    let server = RedisServer::start();
    expect_threads("no client", &[]);

    // An idle client: one thread, the pool scheduler the process shares.
    let client = LockClient::open(server.url()).expect("client");
    let idle = cycled(&client, "threads:idle");
    expect_threads("an idle client", &["dlock-pool"]);
    let other = LockClient::open(server.url()).expect("client");
    let lock = cycled(&other, "threads:other");
    expect_threads("two idle clients", &["dlock-pool"]);
    drop((lock, other));

    // A watched hold starts the client's watchdog; a wait woken by pub/sub, its subscriber.
    let watched = client.lock("threads:watched").build().expect("lock");
    let watched_guard = watched.try_lock().expect("free");
    expect_threads("a watched hold", &["dlock-pool", "dlock-watchdog"]);
    let held = client
        .lock("threads:held")
        .ttl(Duration::from_secs(10))
        .build()
        .expect("lock");
    let held_guard = held.try_lock().expect("free");
    assert!(held.try_lock_for(Duration::from_millis(20)).is_err());
    // `dlock-subscriber`, as Linux keeps it.
    expect_threads(
        "a watched hold and a wait",
        &["dlock-pool", "dlock-subscribe", "dlock-watchdog"],
    );
    assert!(held_guard.unlock().expect("unlock"));
    assert!(watched_guard.unlock().expect("unlock"));
    drop((idle, watched, held, client));
    expect_threads("a dropped client", &["dlock-pool"]);

    // RedLock over 5 masters (5 databases of one server: the threads are the same): one
    // worker per master, no scheduler of their own.
    let urls: Vec<String> = (0..5).map(|db| format!("{}{db}", server.url())).collect();
    let redlock = RedLockClient::builder(&urls)
        .node_timeout(Duration::from_secs(1))
        .build()
        .expect("RedLock client");
    let lock = redlock
        .lock("threads:redlock")
        .ttl(Duration::from_secs(10))
        .build()
        .expect("lock");
    assert!(lock.try_lock().expect("free").unlock().expect("unlock"));
    expect_threads(
        "RedLock over 5 masters",
        &[
            "dlock-pool",
            "redlock-0.0",
            "redlock-1.0",
            "redlock-2.0",
            "redlock-3.0",
            "redlock-4.0",
        ],
    );
    drop((lock, redlock));
    expect_threads("a dropped RedLock client", &["dlock-pool"]);

    dropped_clients_leave_no_threads(&server);
    expect_threads("20 dropped clients", &["dlock-pool"]);

    a_server_that_does_not_answer_holds_up_no_other_client(&server);
}

/// The shared scheduler opens no connection itself: a client whose server is paused (its
/// connects wait out a 5 s timeout) does not hold up the connections that other clients open
/// meanwhile (each of which would fail after 2 s if it waited behind one).
fn a_server_that_does_not_answer_holds_up_no_other_client(server: &RedisServer) {
    let frozen = RedisServer::start();
    let stuck = LockClient::builder(frozen.url())
        .connect_timeout(Duration::from_secs(5))
        .command_timeout(Some(Duration::from_secs(5)))
        .lazy_connect()
        .build()
        .expect("client");
    frozen.pause();
    let (started, ready) = std::sync::mpsc::channel();
    let attempt = std::thread::spawn(move || {
        let lock = stuck.lock("threads:frozen").build().expect("lock");
        started.send(()).expect("main thread");
        // Fails once its connect times out; only the wait matters here.
        let _ = lock.try_lock();
    });
    ready.recv().expect("attempt started");
    for i in 0..5 {
        let client = LockClient::builder(server.url())
            .connect_timeout(Duration::from_secs(2))
            .lazy_connect()
            .build()
            .expect("client");
        let lock = client
            .lock(format!("threads:beside-frozen:{i}"))
            .ttl(Duration::from_secs(10))
            .build()
            .expect("lock");
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("a client beside a paused server: {e}"));
        assert!(guard.unlock().expect("unlock"));
    }
    frozen.resume();
    attempt.join().expect("attempt");
}

/// Short-lived clients with their watchdog and subscriber started leave no threads behind
/// (r2d2's default scheduler kept 3 threads per dropped client alive for up to 30 s).
fn dropped_clients_leave_no_threads(server: &RedisServer) {
    let before = threads();
    let holder = LockClient::open(server.url()).expect("client");
    for i in 0..20 {
        let client = LockClient::open(server.url()).expect("client");
        let lock = cycled(&client, &format!("threads:{i}"));
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
