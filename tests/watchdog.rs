//! The watchdog: watched locks (built without a ttl) are renewed every lease/3 by ONE thread
//! per client, in batches, until released or dropped; holds it cannot renew are reported lost.
//!
//! Two tests count this process's "dlock-watchdog" threads. They take [`THREADS`] for writing,
//! every other test for reading, so no other test's client (and its watchdog thread) lives
//! while they count.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, LossReason, LostLock};
use support::worker::{self, WorkerProcess};
use support::{init_logging, raw, wait_until, RedisServer};

/// Held for writing by the tests that count watchdog threads.
static THREADS: RwLock<()> = RwLock::new(());

fn shared_threads() -> RwLockReadGuard<'static, ()> {
    THREADS.read().unwrap_or_else(|p| p.into_inner())
}

fn exclusive_threads() -> RwLockWriteGuard<'static, ()> {
    THREADS.write().unwrap_or_else(|p| p.into_inner())
}

/// This process's threads named "dlock-watchdog".
fn watchdog_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "dlock-watchdog")
        .count()
}

/// With every other test's client gone, their watchdog threads exit (test 4 checks that this
/// happens): wait for them, so that counts taken from here on are this test's alone.
fn no_watchdog_threads() {
    assert!(
        wait_until(Duration::from_secs(10), || watchdog_threads() == 0),
        "{} watchdog threads linger without any client",
        watchdog_threads()
    );
}

fn watched(client: &LockClient, key: &str, lease: Duration) -> Lock {
    client
        .lock(key)
        .watchdog_lease(lease)
        .build()
        .expect("watched lock")
}

/// Every `on_lost` call: (key, reason).
type Losses = Arc<Mutex<Vec<(String, LossReason)>>>;

fn watched_reporting(client: &LockClient, key: &str, lease: Duration, losses: &Losses) -> Lock {
    let losses = Arc::clone(losses);
    client
        .lock(key)
        .watchdog_lease(lease)
        .on_lost(move |lost: &LostLock| {
            losses
                .lock()
                .unwrap()
                .push((lost.key().to_owned(), lost.reason()))
        })
        .build()
        .expect("watched lock")
}

fn losses_of(losses: &Losses, key: &str) -> Vec<LossReason> {
    losses
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, r)| *r)
        .collect()
}

#[test]
fn renewal_keeps_a_watched_lock_alive() {
    init_logging();
    let _threads = shared_threads();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let lease = Duration::from_millis(600);
    let lock = watched(&client, "wd:alive", lease);

    let guard = lock.try_lock().expect("free lock");
    assert!(guard.lease().is_watched());
    assert_eq!(client.watched_count(), 1);
    let acquired = guard.lease().acquired_at();
    let mut late_max = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let pttl = raw::pttl(&mut conn, "wd:alive");
        assert!(
            pttl > 0,
            "PTTL {pttl} after {:?}: not renewed",
            start.elapsed()
        );
        if start.elapsed() >= Duration::from_millis(1500) {
            late_max = late_max.max(pttl);
        }
        // Time under test: the PTTL is sampled over 2.5 leases.
        thread::sleep(Duration::from_millis(50));
    }
    // Unrenewed, it would have expired 0.6 s after the acquire.
    assert!(late_max > 300, "PTTL after 1.5 s at most {late_max} ms");
    assert_eq!(
        raw::get(&mut conn, "wd:alive").as_deref(),
        Some(guard.value())
    );
    assert!(guard.is_held().unwrap());
    assert!(!guard.is_lost());
    // The local validity moved on with the renewals.
    assert!(guard.valid_until() > acquired + lease + Duration::from_millis(900));
    assert!(guard.unlock().unwrap(), "still ours at the release");
    assert_eq!(client.watched_count(), 0);
}

#[test]
fn renewal_stops_on_unlock_guard_drop_and_lease_drop() {
    init_logging();
    let _threads = shared_threads();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let lease = Duration::from_millis(600);
    let keys = ["wd:stop:unlock", "wd:stop:drop", "wd:stop:lease"];
    let locks: Vec<_> = keys.iter().map(|k| watched(&client, k, lease)).collect();
    let mut guards: Vec<_> = locks.iter().map(|l| l.try_lock().unwrap()).collect();
    assert_eq!(client.watched_count(), 3);
    // Past one lease by renewals alone: all three were renewed.
    support::wait_renewals(&client, 0, 3, 4);
    for k in keys {
        assert!(raw::pttl(&mut conn, k) > 0, "{k} was not renewed");
    }

    let lease_guard = guards.pop().unwrap();
    let drop_guard = guards.pop().unwrap();
    let unlock_guard = guards.pop().unwrap();

    assert!(unlock_guard.unlock().unwrap());
    assert!(!raw::exists(&mut conn, "wd:stop:unlock"));
    assert!(wait_until(Duration::from_secs(2), || client
        .watched_count()
        == 2));

    drop(drop_guard);
    assert!(!raw::exists(&mut conn, "wd:stop:drop"));
    assert!(wait_until(Duration::from_secs(2), || client
        .watched_count()
        == 1));

    // Kept without a guard: still renewed while the lease lives (past a lease).
    let kept = lease_guard.into_lease();
    support::wait_renewals(&client, client.stats().renewals, 1, 4);
    assert_eq!(client.watched_count(), 1);
    assert_eq!(
        raw::get(&mut conn, "wd:stop:lease").as_deref(),
        Some(kept.value())
    );
    drop(kept);
    assert!(wait_until(Duration::from_secs(2), || client
        .watched_count()
        == 0));
    // Nobody renews it any more: it expires within its lease (plus margin).
    let dropped = Instant::now();
    assert!(
        wait_until(lease + Duration::from_secs(2), || !raw::exists(
            &mut conn,
            "wd:stop:lease"
        )),
        "the dropped lease's key still lives (PTTL {})",
        raw::pttl(&mut conn, "wd:stop:lease")
    );
    eprintln!(
        "watchdog/stop: dropped lease's key gone {:.2?} after the drop",
        dropped.elapsed()
    );
    // The released keys did not come back either.
    assert!(!raw::exists(&mut conn, "wd:stop:unlock"));
    assert!(!raw::exists(&mut conn, "wd:stop:drop"));
}

#[test]
fn thousand_holds_share_one_thread_and_batched_renewals() {
    init_logging();
    let _threads = exclusive_threads();
    no_watchdog_threads();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let lease = Duration::from_millis(1500);
    let keys: Vec<String> = (0..1000).map(|i| format!("wd:many:{i}")).collect();
    let locks: Vec<_> = keys.iter().map(|k| watched(&client, k, lease)).collect();

    let guards: Vec<_> = locks
        .iter()
        .map(|l| l.try_lock().expect("free lock"))
        .collect();
    let taken = Instant::now();
    assert_eq!(client.watched_count(), 1000);
    assert!(
        wait_until(Duration::from_secs(2), || watchdog_threads() == 1),
        "{} watchdog threads for one client",
        watchdog_threads()
    );
    // The acquires (scripts too) are done: count the renewals' calls from here. Differs by
    // server: with SET … IFEQ (Valkey 8.1+) a batch is a pipeline of one SET per hold (still
    // one round trip, which commandstats cannot show), counted here per 512-hold batch.
    let native = support::server_kind().has_set_ifeq();
    let command = if native { "set" } else { "evalsha" };
    let before = raw::command_calls(&mut conn, command);
    // Time under test: the renewal calls of 3 s are counted.
    thread::sleep(Duration::from_secs(3));
    let mut renewal_calls = raw::command_calls(&mut conn, command) - before;
    if native {
        assert!(
            renewal_calls >= 1000,
            "{renewal_calls} SET … IFEQ: every hold renewed"
        );
        renewal_calls = (renewal_calls + 511) / 512;
    }
    let held = taken.elapsed();
    assert_eq!(watchdog_threads(), 1, "still one watchdog thread");

    for (guard, key) in guards.iter().zip(&keys) {
        assert!(!guard.is_lost(), "{key} reported lost");
        assert_eq!(
            raw::get(&mut conn, key).as_deref(),
            Some(guard.value()),
            "{key} not held after {held:?} (lease {lease:?})"
        );
    }
    eprintln!(
        "watchdog/many: 1000 holds over {held:.2?}: {renewal_calls} renewal script calls \
         (one per key and round would be {})",
        1000 * (held.as_millis() / (lease / 3).as_millis())
    );
    // Held twice the lease: renewed, and by batches (~6 rounds of 2 calls of <= 512 keys).
    assert!(renewal_calls >= 2, "{renewal_calls} renewal calls");
    assert!(renewal_calls < 50, "{renewal_calls} renewal calls");
    drop(guards);
    assert_eq!(client.watched_count(), 0);
}

#[test]
fn dropped_client_stops_its_watchdog_thread() {
    init_logging();
    let _threads = exclusive_threads();
    no_watchdog_threads();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let lease = Duration::from_millis(600);
    let lock = watched(&client, "wd:client-drop", lease);
    assert_eq!(watchdog_threads(), 0, "started lazily, not with the client");
    let kept = lock.try_lock().unwrap().into_lease();
    // The new thread names itself once it runs.
    assert!(wait_until(Duration::from_secs(2), || watchdog_threads() == 1));
    // Past one lease by renewals alone.
    support::wait_renewals(&client, 0, 1, 4);
    assert_eq!(
        raw::get(&mut conn, "wd:client-drop").as_deref(),
        Some(kept.value()),
        "renewed while the client lives"
    );

    drop(lock);
    drop(client);
    assert!(
        wait_until(Duration::from_secs(5), || watchdog_threads() == 0),
        "the watchdog thread outlived its client"
    );
    // The lease still lives, but nothing renews it: the key expires, the lease sees it lost.
    assert!(
        wait_until(lease + Duration::from_secs(2), || !raw::exists(
            &mut conn,
            "wd:client-drop"
        )),
        "the key is still renewed after the client was dropped"
    );
    assert!(wait_until(Duration::from_secs(1), || kept.is_lost()));
}

// ---------------------------------------------------------------------------------------------
// A holder process killed while holding a watched lock

const WORKER_ENV: &str = "DLOCK_WATCHDOG_WORKER";
const WORKER_TEST: &str = "watchdog_holder_process";
const LOCKED_MARKER: &str = "DLOCK-WATCHDOG-LOCKED";
const CRASH_KEY: &str = "wd:crash";
const CRASH_LEASE: Duration = Duration::from_secs(1);

/// The holder side: does nothing unless [`WORKER_ENV`] is set.
#[test]
fn watchdog_holder_process() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    init_logging();
    let client = LockClient::open(std::env::var("DLOCK_URL").expect("DLOCK_URL")).unwrap();
    let lock = watched(&client, CRASH_KEY, CRASH_LEASE);
    let guard = lock.try_lock().expect("the holder takes a free lock");
    worker::report(LOCKED_MARKER, &String::from_utf8_lossy(guard.value()));
    // Until killed; renewed meanwhile by this process's watchdog.
    worker::hold_until_killed()
}

#[test]
fn killed_holder_frees_its_watched_lock_within_a_lease() {
    init_logging();
    let _threads = shared_threads();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut holder = WorkerProcess::spawn(
        WORKER_TEST,
        &[(WORKER_ENV, "1".to_owned()), ("DLOCK_URL", server.url())],
    );
    let dead_value = holder
        .wait_marker(LOCKED_MARKER, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("no lock report ({e:?}): {:?}", holder.seen()));
    // Past its lease (time under test), the live holder's watchdog keeps it.
    thread::sleep(CRASH_LEASE + Duration::from_millis(500));
    assert_eq!(
        raw::get(&mut conn, CRASH_KEY).as_deref(),
        Some(dead_value.as_bytes()),
        "the live holder's lock was not renewed"
    );

    let client = LockClient::open(server.url()).unwrap();
    let lock = watched(&client, CRASH_KEY, CRASH_LEASE);
    let killed = Instant::now();
    assert!(!holder.kill().success());
    let guard = lock
        .try_lock_for(Duration::from_secs(3))
        .expect("the dead holder's lock frees within its lease");
    eprintln!(
        "watchdog/crash: acquired {:.2?} after SIGKILL of the holder (lease {CRASH_LEASE:?})",
        killed.elapsed()
    );
    assert_ne!(guard.value(), dead_value.as_bytes());
    assert_eq!(
        raw::get(&mut conn, CRASH_KEY).as_deref(),
        Some(guard.value())
    );
    assert!(guard.unlock().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Holds that cannot be renewed

#[test]
fn paused_redis_past_the_lease_marks_the_hold_expired() {
    init_logging();
    let _threads = shared_threads();
    let server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_millis(500)))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let losses: Losses = Arc::default();
    let lease = Duration::from_secs(1);
    let lock = watched_reporting(&client, "wd:paused", lease, &losses);
    let guard = lock.try_lock().unwrap();
    // Renewed once: the watchdog works before the pause.
    support::wait_event(&client, Event::Renewed, 1);
    assert!(!guard.is_lost());

    server.pause();
    let paused = Instant::now();
    let lost_seen = wait_until(Duration::from_secs(3), || guard.is_lost());
    let reported = wait_until(Duration::from_secs(5), || {
        !losses_of(&losses, "wd:paused").is_empty()
    });
    let reported_after = paused.elapsed();
    // Keep Redis paused well past the lease (time under test): the key expires on the
    // server meanwhile.
    thread::sleep(Duration::from_millis(2500).saturating_sub(paused.elapsed()));
    server.resume();
    assert!(lost_seen, "is_lost() stayed false with Redis paused");
    assert!(reported, "on_lost was not called with Redis paused");
    eprintln!("watchdog/paused: on_lost called {reported_after:.2?} after the pause");

    // Redis answers again: the hold stays lost, reported once (given time to be reported
    // again, which must not happen).
    thread::sleep(Duration::from_millis(800));
    assert!(guard.is_lost());
    assert_eq!(losses_of(&losses, "wd:paused"), [LossReason::Expired]);
    assert_eq!(client.watched_count(), 0);
    match guard.unlock() {
        Ok(true) => panic!("unlock found a hold that expired while Redis was paused"),
        Ok(false) => {}
        Err(e) => eprintln!("watchdog/paused: unlock after the pause: {e}"),
    }
    assert_eq!(losses.lock().unwrap().len(), 1);
}

#[test]
fn deleted_or_taken_key_marks_the_hold_gone_once() {
    init_logging();
    let _threads = shared_threads();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let losses: Losses = Arc::default();
    let lease = Duration::from_millis(600);
    let deleted = watched_reporting(&client, "wd:gone:deleted", lease, &losses);
    let taken = watched_reporting(&client, "wd:gone:taken", lease, &losses);
    let calls = Arc::new(AtomicUsize::new(0));
    let other = {
        let calls = Arc::clone(&calls);
        client
            .lock("wd:gone:other")
            .watchdog_lease(lease)
            .on_lost(move |_: &LostLock| {
                calls.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap()
    };
    let g_deleted = deleted.try_lock().unwrap();
    let g_taken = taken.try_lock().unwrap();
    let g_other = other.try_lock().unwrap();
    assert_eq!(client.watched_count(), 3);

    raw::del(&mut conn, "wd:gone:deleted");
    let _: () = redis::cmd("SET")
        .arg("wd:gone:taken")
        .arg("someone-else")
        .arg("PX")
        .arg(10_000)
        .query(&mut conn)
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(3), || losses.lock().unwrap().len() >= 2),
        "lost holds not reported: {:?}",
        losses.lock().unwrap()
    );
    assert!(g_deleted.is_lost());
    assert!(g_taken.is_lost());
    assert!(wait_until(Duration::from_secs(1), || client
        .watched_count()
        == 1));
    // More rounds: still one report each, and the untouched hold is fine.
    let renewed = client.test_hooks().count(Event::Renewed);
    support::wait_event(&client, Event::Renewed, renewed + 2);
    assert_eq!(losses_of(&losses, "wd:gone:deleted"), [LossReason::Gone]);
    assert_eq!(losses_of(&losses, "wd:gone:taken"), [LossReason::Gone]);
    assert_eq!(losses.lock().unwrap().len(), 2);
    assert!(!g_other.is_lost());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The other owner's key was neither renewed nor deleted by us.
    assert_eq!(
        raw::get(&mut conn, "wd:gone:taken").as_deref(),
        Some(&b"someone-else"[..])
    );
    // A renewal by us would have cut its PTTL to our 600 ms lease; the other owner's 10 s stand
    // (how much of them is left depends on how fast the rounds above went).
    let pttl = raw::pttl(&mut conn, "wd:gone:taken");
    assert!((2_000..=10_000).contains(&pttl), "PTTL {pttl}: touched");
    assert!(!g_taken.unlock().unwrap());
    assert!(!g_deleted.unlock().unwrap());
    assert_eq!(
        raw::get(&mut conn, "wd:gone:taken").as_deref(),
        Some(&b"someone-else"[..])
    );
    assert!(g_other.unlock().unwrap());
}

#[cfg(feature = "cluster")]
#[test]
fn cluster_holds_are_renewed_per_slot() {
    init_logging();
    let _threads = shared_threads();
    let cluster = support::Cluster::start(3);
    let client = LockClient::cluster_builder(&cluster.urls())
        .build()
        .unwrap();
    let lease = Duration::from_millis(900);
    // Keys on every node; some share a slot through a hash tag (one batch for them).
    let mut keys: Vec<String> = (0..3).map(|n| cluster.key_on(n, "wd:cl")).collect();
    keys.extend((0..5).map(|i| format!("{{wd:tag}}:{i}")));
    let locks: Vec<_> = keys.iter().map(|k| watched(&client, k, lease)).collect();
    let guards: Vec<_> = locks.iter().map(|l| l.try_lock().unwrap()).collect();
    // Two leases pass, lived through by renewals alone.
    support::wait_renewals(&client, 0, guards.len() as u64, 7);
    for (guard, key) in guards.iter().zip(&keys) {
        assert!(!guard.is_lost(), "{key} reported lost");
        let mut conn = cluster.conn_for_key(key);
        assert_eq!(
            raw::get(&mut conn, key).as_deref(),
            Some(guard.value()),
            "{key} not renewed"
        );
    }
    assert_eq!(client.watched_count(), keys.len());
    drop(guards);
    assert_eq!(client.watched_count(), 0);
}

/// `lua/renew_batch.lua` on its own: each key is checked by its kind, and only the owner's
/// keys get the new expiry; a key of the wrong type does not fail the batch.
#[test]
fn renew_batch_script_renews_only_the_owners_keys() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    raw::set(&mut conn, "s:ours", b"tok");
    raw::set(&mut conn, "s:theirs", b"other");
    let _: i64 = redis::cmd("HSET")
        .arg("h:ours")
        .arg("owner:1")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg("h:theirs")
        .arg("owner:2")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let keys = [
        "s:ours", "s:theirs", "s:absent", "h:ours", "h:theirs", "h:ours", "s:ours",
    ];
    let args = [
        "v", "tok", "5000", "v", "tok", "5000", "v", "tok", "5000", "h", "owner:1", "6000", "h",
        "owner:1", "6000", "v", "owner:1", "7000", "h", "tok", "7000",
    ];
    let result: Vec<i64> = redis::cmd("EVAL")
        .arg(include_str!("../lua/renew_batch.lua"))
        .arg(keys.len())
        .arg(&keys[..])
        .arg(&args[..])
        .query(&mut conn)
        .unwrap();
    // The last two: a hash read as a string and a string read as a hash are not the owner's.
    assert_eq!(result, [1, 0, 0, 1, 0, 0, 0]);
    let pttl = |conn: &mut redis::Connection, k| raw::pttl(conn, k);
    assert!((2000..=5000).contains(&pttl(&mut conn, "s:ours")));
    assert_eq!(pttl(&mut conn, "s:theirs"), -1);
    assert_eq!(pttl(&mut conn, "s:absent"), -2);
    assert!((3000..=6000).contains(&pttl(&mut conn, "h:ours")));
    assert_eq!(pttl(&mut conn, "h:theirs"), -1);
}
