//! Fencing tokens (`LockBuilder::fencing`) of `Strategy::Token` and `Strategy::Reentrant`
//! against real `redis-server` processes: tokens grow over holds, clients and lock expiry; the
//! counter's name, slot and lifetime; no counter without fencing; fences from the blocking
//! path; and a holder paused past its lease (a sleeping thread, a SIGSTOPped process) fenced
//! off by the resource. See `docs/fencing.md`.

mod support;

#[path = "../examples/fencing/store.rs"]
mod store;

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, LockError, Strategy};
use store::{FencedStore, Stale};
use support::worker::{self, WorkerProcess};
#[cfg(feature = "cluster")]
use support::Cluster;
use support::{init_logging, raw, wait_until, RedisServer};

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

fn fenced(client: &LockClient, strategy: Strategy, key: &str, ttl: Duration) -> Lock {
    client
        .lock(key)
        .strategy(strategy)
        .ttl(ttl)
        .fencing()
        .build()
        .expect("build fenced lock")
}

/// The counter name for a key without braces (see src/keys.rs).
fn counter_of(key: &str) -> String {
    format!("dlock_fence:{{{key}}}")
}

/// Every key of the server (test servers hold only what the test wrote).
fn all_keys(conn: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
    keys.sort();
    keys
}

/// Script calls the server has served (`EVALSHA`, and `EVAL` for a script not yet cached).
/// The calls of attempts made while waiting: scripts, and `PTTL`, which a Token lock without
/// fencing sends with its `SET … NX PX … GET` instead of the script on a server with
/// `DELIFEQ` (Valkey 9.0+; see docs/production.md, "Servers").
fn script_calls(conn: &mut redis::Connection) -> i64 {
    raw::command_calls(conn, "evalsha")
        + raw::command_calls(conn, "eval")
        + raw::command_calls(conn, "pttl")
}

// ---------------------------------------------------------------------------------------------
// Tokens over holds and clients

fn tokens_strictly_increase(strategy: Strategy) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "fence:seq";
    let (c1, c2) = (client(&server), client(&server));
    let a = fenced(&c1, strategy, key, Duration::from_secs(10));
    let b = fenced(&c2, strategy, key, Duration::from_secs(10));

    let mut fences = Vec::new();
    for round in 0..4 {
        let (mine, other) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let mut guard = mine.try_lock().expect("free lock");
        let fence = guard.fence().expect("a fenced lock's guard has a fence");
        // Extending is the same hold: the same token, no increment.
        guard.extend(Duration::from_secs(10)).expect("extend");
        assert_eq!(guard.fence(), Some(fence));
        // A refused attempt (try_lock, try_acquire, a timed-out wait) takes no token.
        assert!(matches!(other.try_lock(), Err(LockError::Held { .. })));
        assert!(other.try_acquire().is_err_and(|e| e.is_contention()));
        assert!(matches!(
            other.try_lock_for(Duration::from_millis(50)),
            Err(LockError::Timeout { .. })
        ));
        if strategy == Strategy::Reentrant {
            // A re-entry is the same hold: the same token, no increment.
            let inner = mine.try_lock().expect("re-entry");
            assert_eq!(inner.fence(), Some(fence));
            assert!(inner.unlock().expect("unlock the re-entry"));
        }
        assert_eq!(raw::get_i64(&mut conn, &counter_of(key)), fence as i64);
        fences.push(fence);
        assert!(guard.unlock().expect("unlock"));
    }
    // The lease path (try_acquire) counts on the same counter.
    let lease = a.try_acquire().expect("free lock");
    fences.push(lease.fence().expect("a fenced lease has a fence"));
    assert!(a.release(&lease).expect("release"));

    // A fresh server's counter starts at 1, and only the holds above incremented it.
    assert_eq!(fences, (1..=5).collect::<Vec<u64>>());
}

#[test]
fn token_tokens_strictly_increase_across_holds_and_clients() {
    tokens_strictly_increase(Strategy::Token);
}

#[test]
fn reentrant_tokens_strictly_increase_across_holds_and_clients() {
    tokens_strictly_increase(Strategy::Reentrant);
}

// ---------------------------------------------------------------------------------------------
// A holder paused past its lease (the scenario of examples/fencing.rs)

fn stale_holder_is_refused(strategy: Strategy) {
    init_logging();
    let server = RedisServer::start();
    let key = "fence:paused";
    let ttl = Duration::from_millis(300);
    let (ca, cb) = (client(&server), client(&server));
    let a = fenced(&ca, strategy, key, ttl);
    // B's hold must outlast the rest of the test on a loaded machine; only A's lease matters.
    let b = fenced(&cb, strategy, key, Duration::from_secs(10));
    let store = FencedStore::new();
    let (to_b, from_a) = mpsc::channel::<u64>();
    let (to_a, from_b) = mpsc::channel::<()>();
    // Borrowed by both writers; the channel ends move into writer A.
    let (a, store) = (&a, &store);

    let (fence_a, fence_b) = thread::scope(|s| {
        let writer_a = s.spawn(move || {
            let guard = a.try_lock().expect("A takes the free lock");
            let fence = guard.fence().expect("fence");
            // One hold writes several times with the same token.
            store.write(fence, "A1").expect("A's first write");
            store
                .write(fence, "A2")
                .expect("A's second write, same token");
            to_b.send(fence).unwrap();
            // The "GC pause": until the lease ran out by A's own clock, and (so the order is
            // fixed) until B wrote.
            assert!(support::wait_until(support::EVENT_TIMEOUT, || guard.is_expired()));
            from_b.recv().expect("B's signal");
            assert!(guard.is_expired(), "A's lease ran out by its own clock");
            let refused = store.write(fence, "A3 (stale)");
            assert!(!guard.unlock().expect("unlock"), "the lock is B's now");
            (fence, refused)
        });

        let fence_a = from_a.recv().expect("A's fence");
        let asked = Instant::now();
        // Blocks until A's key expires: A never releases it.
        let guard = b.lock().expect("B gets the lock once A's lease ran out");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "B waited for the expiry, not for its 10 s retry budget"
        );
        let fence_b = guard.fence().expect("fence");
        assert!(fence_b > fence_a, "B's token {fence_b} after A's {fence_a}");
        store.write(fence_b, "B1").expect("B's write");
        to_a.send(()).unwrap();
        let (_, refused) = writer_a.join().expect("writer A");
        assert_eq!(
            refused,
            Err(Stale {
                fence: fence_a,
                highest: fence_b
            })
        );
        // B still writes after A's attempt, and can release its hold.
        store.write(fence_b, "B2").expect("B's second write");
        assert!(guard.unlock().expect("unlock"));
        (fence_a, fence_b)
    });
    assert_eq!((fence_a, fence_b), (1, 2));
    assert_eq!(store.read().as_deref(), Some("B2"));
    assert_eq!(store.highest(), fence_b);
}

#[test]
fn token_stale_holder_paused_past_its_lease_is_refused_by_the_resource() {
    stale_holder_is_refused(Strategy::Token);
}

#[test]
fn reentrant_stale_holder_paused_past_its_lease_is_refused_by_the_resource() {
    stale_holder_is_refused(Strategy::Reentrant);
}

// ---------------------------------------------------------------------------------------------
// A SIGSTOPped holder process and a Redis resource

/// The Redis Lua check of `docs/fencing.md` ("A Redis resource"; the same lines, without its
/// comment): writes `ARGV[2]` to the hash at `KEYS[1]` if the token `ARGV[1]` is at least the
/// largest one seen.
const FENCED_WRITE_LUA: &str = r"
local highest = tonumber(redis.call('hget', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < highest then
    return 0
end
redis.call('hset', KEYS[1], 'fence', ARGV[1], 'data', ARGV[2])
return 1
";

fn fenced_write(conn: &mut redis::Connection, resource: &str, fence: u64, data: &str) -> bool {
    let written: i64 = redis::Script::new(FENCED_WRITE_LUA)
        .key(resource)
        .arg(fence)
        .arg(data)
        .invoke(conn)
        .expect("fenced write script");
    written == 1
}

const WORKER_TEST: &str = "fenced_writer_process";
const WORKER_ENV: &str = "DLOCK_FENCE_WORKER";
const PAUSED_TTL: Duration = Duration::from_millis(400);

fn parse_strategy(name: &str) -> Strategy {
    match name {
        "token" => Strategy::Token,
        "reentrant" => Strategy::Reentrant,
        other => panic!("strategy {other:?}"),
    }
}

/// The writer process of the SIGSTOP tests: does nothing unless [`WORKER_ENV`] is set to
/// `<strategy> <Redis URL>`. Takes the lock, writes once, reports its token and pid, then
/// writes with the same token every 20 ms until the resource refuses it.
#[test]
fn fenced_writer_process() {
    let Some(setting) = std::env::var_os(WORKER_ENV) else {
        return;
    };
    init_logging();
    let setting = setting.into_string().expect("UTF-8");
    let (strategy, url) = setting.split_once(' ').expect("`<strategy> <url>`");
    let client = LockClient::open(url).expect("client");
    let lock = fenced(
        &client,
        parse_strategy(strategy),
        "fence:sigstop",
        PAUSED_TTL,
    );
    let guard = lock.try_lock().expect("the worker takes the free lock");
    let fence = guard.fence().expect("fence");
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    assert!(fenced_write(&mut conn, "fence:resource", fence, "worker 0"));
    worker::report("FENCE", &format!("{fence} {}", std::process::id()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 1;
    while Instant::now() < deadline {
        if !fenced_write(&mut conn, "fence:resource", fence, &format!("worker {n}")) {
            worker::report("REFUSED", &n.to_string());
            return;
        }
        n += 1;
        // Paced writes while the other process takes the lock.
        support::work(Duration::from_millis(20));
    }
    worker::report("NEVER_REFUSED", &n.to_string());
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

fn sigstopped_holder_is_refused(strategy: &str) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let setting = format!("{strategy} {}", server.url());
    let mut writer = WorkerProcess::spawn(WORKER_TEST, &[(WORKER_ENV, setting)]);
    let report = writer
        .wait_marker("FENCE", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("no FENCE from the worker ({e:?}): {:?}", writer.seen()));
    let (fence, pid) = report.split_once(' ').expect("`fence pid`");
    let (stale_fence, pid): (u64, u32) = (fence.parse().unwrap(), pid.parse().unwrap());
    // Freeze the whole holder process (all its threads), as a long GC pause would.
    support::freeze(pid);

    let c = client(&server);
    let lock = fenced(
        &c,
        parse_strategy(strategy),
        "fence:sigstop",
        Duration::from_secs(10),
    );
    let guard = lock
        .lock()
        .expect("taken once the frozen holder's lease ran out");
    let fence = guard.fence().expect("fence");
    assert!(fence > stale_fence, "{fence} after {stale_fence}");
    assert!(fenced_write(&mut conn, "fence:resource", fence, "parent"));

    signal(pid, "CONT");
    let refused = writer.wait_marker("REFUSED", Duration::from_secs(30));
    assert!(
        refused.is_ok(),
        "the woken holder was not refused: {:?}",
        writer.seen()
    );
    let stored: (Option<u64>, Option<String>) = redis::cmd("HMGET")
        .arg("fence:resource")
        .arg("fence")
        .arg("data")
        .query(&mut conn)
        .expect("HMGET");
    assert_eq!(stored, (Some(fence), Some("parent".to_owned())));
    assert!(guard.unlock().expect("unlock"));
}

#[test]
fn token_sigstopped_holder_is_refused_by_a_redis_resource() {
    sigstopped_holder_is_refused("token");
}

#[test]
fn reentrant_sigstopped_holder_is_refused_by_a_redis_resource() {
    sigstopped_holder_is_refused("reentrant");
}

// ---------------------------------------------------------------------------------------------
// The counter key

fn counter_name_and_lifetime(strategy: Strategy) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);

    // A hash-tagged key: the counter keeps the key's own tag (Redisson's naming).
    let tagged = fenced(&c, strategy, "{user:1}:lock", Duration::from_millis(200));
    let guard = tagged.try_lock().expect("free lock");
    let first = guard.fence().expect("fence");
    assert_eq!(
        raw::get_i64(&mut conn, "dlock_fence:{user:1}:lock"),
        first as i64
    );
    assert_eq!(raw::pttl(&mut conn, "dlock_fence:{user:1}:lock"), -1);
    // Let the hold expire without a release: the counter stays, the next token is larger.
    let lease = guard.into_lease();
    assert!(wait_until(Duration::from_secs(5), || !raw::exists(
        &mut conn,
        "{user:1}:lock"
    )));
    assert!(!tagged.release(&lease).expect("release after expiry"));
    assert!(raw::exists(&mut conn, "dlock_fence:{user:1}:lock"));
    let guard = tagged.try_lock().expect("free after expiry");
    assert_eq!(guard.fence(), Some(first + 1));
    assert!(guard.unlock().expect("unlock"));
    assert_eq!(
        raw::get_i64(&mut conn, "dlock_fence:{user:1}:lock"),
        (first + 1) as i64
    );

    // A plain key is wrapped in braces; keys have counters of their own.
    let plain = fenced(&c, strategy, "orders:42", Duration::from_secs(10));
    let guard = plain.try_lock().expect("free lock");
    assert_eq!(guard.fence(), Some(1));
    assert_eq!(raw::get_i64(&mut conn, "dlock_fence:{orders:42}"), 1);
    assert!(guard.unlock().expect("unlock"));
    assert_eq!(
        all_keys(&mut conn),
        ["dlock_fence:{orders:42}", "dlock_fence:{user:1}:lock"],
        "only the counters outlive the holds"
    );

    // Deleting the counter restarts the tokens (the caveat of docs/fencing.md).
    raw::del(&mut conn, "dlock_fence:{orders:42}");
    let guard = plain.try_lock().expect("free lock");
    assert_eq!(guard.fence(), Some(1));
    drop(guard);
}

#[test]
fn token_counter_is_named_after_the_key_has_no_ttl_and_outlives_holds() {
    counter_name_and_lifetime(Strategy::Token);
}

#[test]
fn reentrant_counter_is_named_after_the_key_has_no_ttl_and_outlives_holds() {
    counter_name_and_lifetime(Strategy::Reentrant);
}

#[cfg(feature = "cluster")]
#[test]
fn counters_share_their_keys_slot_on_a_cluster() {
    init_logging();
    let cluster = Cluster::start(3);
    let c = LockClient::cluster_builder(&cluster.urls())
        .build()
        .expect("cluster client");
    // One plain key on each master, and keys with braces: a hash tag is kept as it is, braces
    // that are no tag are wrapped.
    let mut keys: Vec<(String, String)> = (0..3)
        .map(|n| cluster.key_on(n, "fence"))
        .map(|key| (counter_of(&key), key))
        .collect();
    for (counter, key) in [
        ("dlock_fence:{user:1}:lock", "{user:1}:lock"),
        ("dlock_fence:x{y}z", "x{y}z"),
        ("dlock_fence:{a{b}", "a{b"),
    ] {
        keys.push((counter.to_owned(), key.to_owned()));
    }
    for strategy in [Strategy::Token, Strategy::Reentrant] {
        for (counter, key) in &keys {
            let lock = fenced(&c, strategy, key, Duration::from_secs(10));
            // Both keys in one script: a counter in another slot would fail with CROSSSLOT.
            let guard = lock.try_lock().expect("fenced acquire on a cluster");
            let fence = guard.fence().expect("fence");
            assert_eq!(
                cluster.keyslot(counter),
                cluster.keyslot(key),
                "{counter} and {key}"
            );
            let mut conn = cluster.conn_for_key(key);
            assert_eq!(raw::get_i64(&mut conn, counter), fence as i64, "{counter}");
            assert!(guard.unlock().expect("unlock"));
            let guard = lock.try_lock().expect("again");
            assert_eq!(guard.fence(), Some(fence + 1), "{strategy:?} {key}");
            drop(guard);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Without fencing, and the blocking path

/// Takes `holder`'s lock, runs `wait` on another thread, releases once that thread's first
/// scripted attempt was refused, and returns the holder's fence and what `wait` returned.
fn release_to_waiter(
    server: &RedisServer,
    holder: &dyn DistributedLock,
    wait: impl FnOnce() -> Option<u64> + Send,
) -> (Option<u64>, Option<u64>) {
    let mut conn = server.conn();
    let guard = holder.try_lock().expect("free lock");
    let held = guard.fence();
    let before = script_calls(&mut conn);
    thread::scope(|s| {
        let blocked = s.spawn(wait);
        assert!(
            wait_until(Duration::from_secs(5), || script_calls(&mut conn) > before),
            "the waiter made a (refused) attempt"
        );
        // Refused attempts take no token.
        if let Some(held) = held {
            assert_eq!(
                raw::get_i64(&mut conn, &counter_of(holder.key())),
                held as i64
            );
        }
        assert!(guard.unlock().expect("unlock"));
        (held, blocked.join().expect("waiter"))
    })
}

fn no_fencing_no_counter(strategy: Strategy) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "fence:off";
    let (c1, c2) = (client(&server), client(&server));
    let unfenced = |c: &LockClient| {
        c.lock(key)
            .strategy(strategy)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("build")
    };
    let (a, b) = (unfenced(&c1), unfenced(&c2));

    let guard = a.try_lock().expect("free lock");
    assert_eq!(guard.fence(), None);
    assert_eq!(guard.lease().fence(), None);
    assert_eq!(all_keys(&mut conn), [key]);
    drop(guard);
    // The waiting path uses the acquire script, with the lock key only.
    let (held, got) = release_to_waiter(&server, &a, || {
        b.lock().expect("lock() after the release").fence()
    });
    assert_eq!((held, got), (None, None));
    let lease = a.try_acquire().expect("free lock");
    assert_eq!(lease.fence(), None);
    assert!(a.release(&lease).unwrap());
    assert!(!raw::exists(&mut conn, &counter_of(key)));
    assert!(all_keys(&mut conn).is_empty(), "{:?}", all_keys(&mut conn));
}

#[test]
fn token_without_fencing_there_is_no_fence_and_no_counter() {
    no_fencing_no_counter(Strategy::Token);
}

#[test]
fn reentrant_without_fencing_there_is_no_fence_and_no_counter() {
    no_fencing_no_counter(Strategy::Reentrant);
}

#[test]
fn classic_refuses_fencing() {
    let server = RedisServer::start();
    let err = client(&server)
        .lock("fence:classic")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .fencing()
        .build()
        .expect_err("Classic with fencing");
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
}

fn blocking_lock_returns_a_fence(strategy: Strategy) {
    init_logging();
    let server = RedisServer::start();
    let key = "fence:blocking";
    let (c1, c2) = (client(&server), client(&server));
    let holder = fenced(&c1, strategy, key, Duration::from_secs(10));
    let waiter = fenced(&c2, strategy, key, Duration::from_secs(10));

    let (held, got) = release_to_waiter(&server, &holder, || {
        waiter.lock().expect("lock() after the release").fence()
    });
    assert_eq!((held, got), (Some(1), Some(2)));
    let (held, got) = release_to_waiter(&server, &holder, || {
        let guard = waiter.try_lock_for(Duration::from_secs(5));
        guard.expect("try_lock_for after the release").fence()
    });
    assert_eq!((held, got), (Some(3), Some(4)));
}

#[test]
fn token_blocking_lock_returns_a_fence() {
    blocking_lock_returns_a_fence(Strategy::Token);
}

#[test]
fn reentrant_blocking_lock_returns_a_fence() {
    blocking_lock_returns_a_fence(Strategy::Reentrant);
}
