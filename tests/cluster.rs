//! Every strategy against a real local Redis Cluster of 3 masters (`redis-cli --cluster create`),
//! through `LockClient::cluster_builder`:
//!
//! - each strategy and Classic variant on keys served by each of the 3 masters, checked against
//!   the owning node itself;
//! - `NOSCRIPT` recovery on every node after `SCRIPT FLUSH` on all of them;
//! - a lock slot migrating between nodes (`CLUSTER SETSLOT ... MIGRATING/IMPORTING`, `MIGRATE`,
//!   then `SETSLOT ... NODE`), so clients meet `ASK` and then `MOVED`, with held locks moved while
//!   held and 4 threads contending throughout;
//! - mutual exclusion of 4 threads (one client each) on locks spread over the 3 masters.
//!
//! Each test starts its own cluster (about 5 s), so tests do not disturb one another.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{
    DistributedLock, Encoding, LockClient, LockError, RetryPolicy, Strategy, Takeover,
};
use support::expiry::{decode, encode, epoch_ms};
use support::{init_logging, raw, wait_until, Cluster, RedisServer};

const MASTERS: usize = 3;

fn client(cluster: &Cluster) -> LockClient {
    LockClient::cluster_builder(&cluster.urls())
        .pool_size(4)
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Some(Duration::from_secs(2)))
        .build()
        .expect("cluster client")
}

/// One strategy with its options.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Token,
    Classic {
        encoding: Encoding,
        takeover: Takeover,
        key_ttl: bool,
    },
}

impl Variant {
    fn all() -> Vec<Variant> {
        let classic = |encoding, takeover, key_ttl| Variant::Classic {
            encoding,
            takeover,
            key_ttl,
        };
        vec![
            Variant::Token,
            classic(Encoding::Decimal, Takeover::GetSet, false),
            classic(Encoding::BigEndian, Takeover::GetSet, false),
            classic(Encoding::Decimal, Takeover::CompareAndSet, false),
            classic(Encoding::BigEndian, Takeover::CompareAndSet, true),
            classic(Encoding::Decimal, Takeover::GetSet, true),
        ]
    }

    fn name(self) -> String {
        match self {
            Variant::Token => "token".into(),
            Variant::Classic {
                encoding,
                takeover,
                key_ttl,
            } => format!("classic-{encoding:?}-{takeover:?}-ttl{key_ttl}").to_lowercase(),
        }
    }

    fn build(self, client: &LockClient, key: &str, ttl: Duration, retry: RetryPolicy) -> Lock {
        let b = client.lock(key).ttl(ttl).retry(retry);
        match self {
            Variant::Token => b.strategy(Strategy::Token).build(),
            Variant::Classic {
                encoding,
                takeover,
                key_ttl,
            } => b
                .strategy(Strategy::Classic(
                    ClassicOptions::new()
                        .encoding(encoding)
                        .takeover(takeover)
                        .key_ttl(key_ttl),
                ))
                .build(),
        }
        .expect("build lock")
    }
}

/// `ASKING` then `cmd` on one connection: reads a key from a node that is importing its slot.
fn asking<T: redis::FromRedisValue>(conn: &mut redis::Connection, cmd: &redis::Cmd) -> T {
    let _: () = redis::cmd("ASKING").query(conn).expect("ASKING");
    cmd.query(conn).expect("command after ASKING")
}

fn keys_in_slot(node: &RedisServer, slot: u16) -> Vec<String> {
    redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut node.conn())
        .expect("CLUSTER GETKEYSINSLOT")
}

/// One key per master, as a hash tag (`{n:K}`) whose slot that master serves, so every lock of a
/// test can be `{n:K}:name` and stay on that master.
fn tags(cluster: &Cluster, prefix: &str) -> Vec<String> {
    let tags: Vec<String> = (0..MASTERS)
        .map(|i| format!("{{{}}}", cluster.key_on(i, prefix)))
        .collect();
    for (i, tag) in tags.iter().enumerate() {
        let key = format!("{tag}:probe");
        assert_eq!(
            cluster.slot_owner(cluster.keyslot(&key)),
            i,
            "{key} must be served by node {i}"
        );
    }
    tags
}

#[track_caller]
fn assert_held<T: std::fmt::Debug>(r: Result<T, LockError>, what: &str) {
    match r {
        Err(LockError::Held { .. }) => {}
        other => panic!("{what}: expected Err(Held), got {other:?}"),
    }
}

/// Acquire, contend, extend, release and (Classic) stale takeover of one variant on one key,
/// every step checked on the master that owns the key.
fn checked_cycle(owner: &RedisServer, a: &LockClient, b: &LockClient, key: &str, variant: Variant) {
    let what = format!("{} on {key} (node :{})", variant.name(), owner.port());
    let mut conn = owner.conn();
    let ttl = Duration::from_secs(5);
    let la = variant.build(a, key, ttl, RetryPolicy::no_wait());
    let lb = variant.build(b, key, ttl, RetryPolicy::no_wait());

    // Acquire: the value is on the owning node.
    let mut g = la
        .try_lock()
        .unwrap_or_else(|e| panic!("{what}: try_lock: {e}"));
    assert_eq!(
        raw::get(&mut conn, key).as_deref(),
        Some(g.value()),
        "{what}"
    );
    let now = epoch_ms();
    match variant {
        Variant::Token => {
            assert_eq!(g.value().len(), 32, "{what}: a 128-bit hex token");
            let t = raw::pttl(&mut conn, key);
            assert!(t > 0 && t <= 5_000, "{what}: PTTL {t}");
        }
        Variant::Classic {
            encoding, key_ttl, ..
        } => {
            let expiry = decode(encoding, g.value());
            assert!(
                expiry > now && expiry <= now + 5_100,
                "{what}: expiry {expiry} vs now {now}"
            );
            let t = raw::pttl(&mut conn, key);
            if key_ttl {
                assert!(t > 0 && t <= 5_000, "{what}: PTTL {t}");
            } else {
                assert_eq!(t, -1, "{what}: no Redis TTL without key_ttl");
            }
        }
    }

    // Contention from another client (another process).
    assert_held(lb.try_lock(), &what);
    assert!(g.is_held().unwrap(), "{what}: is_held");

    // Extend: a longer life, visible on the owning node.
    g.extend(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{what}: extend: {e}"));
    assert_eq!(
        raw::get(&mut conn, key).as_deref(),
        Some(g.value()),
        "{what}"
    );
    match variant {
        Variant::Token => assert!(
            raw::pttl(&mut conn, key) > 5_000,
            "{what}: PTTL after extend"
        ),
        Variant::Classic {
            encoding, key_ttl, ..
        } => {
            assert!(decode(encoding, g.value()) > epoch_ms() + 15_000, "{what}");
            if key_ttl {
                assert!(
                    raw::pttl(&mut conn, key) > 5_000,
                    "{what}: PTTL after extend"
                );
            }
        }
    }
    assert_held(lb.try_lock(), &what);

    // Release: gone from the owning node, and the other client gets it.
    assert!(g.unlock().unwrap(), "{what}: unlock of a held lock");
    assert_eq!(raw::get(&mut conn, key), None, "{what}: released");
    let lease = la.try_acquire().expect("free again");
    assert!(la.release(&lease).unwrap(), "{what}: release");
    // A Classic value is the expiry timestamp: a hold taken in the same millisecond with the
    // same lifetime has the same value, and a release of the old lease would delete it. Let the
    // clock move on so that the next hold is distinguishable.
    let now = epoch_ms();
    assert!(wait_until(Duration::from_secs(1), || epoch_ms() > now + 1));
    let gb = lb
        .try_lock()
        .unwrap_or_else(|e| panic!("{what}: b after release: {e}"));
    // Owner-checked release: a's old lease does not delete b's hold.
    assert!(!la.release(&lease).unwrap(), "{what}: stale release");
    assert_eq!(
        raw::get(&mut conn, key).as_deref(),
        Some(gb.value()),
        "{what}"
    );
    assert!(gb.unlock().unwrap(), "{what}: b unlock");

    // Classic: a stale expiry written by a dead legacy holder is taken over.
    if let Variant::Classic {
        encoding, key_ttl, ..
    } = variant
    {
        let stale = encode(encoding, epoch_ms() - 10_000);
        raw::set(&mut conn, key, &stale);
        let g = lb
            .try_lock()
            .unwrap_or_else(|e| panic!("{what}: takeover: {e}"));
        assert_eq!(
            raw::get(&mut conn, key).as_deref(),
            Some(g.value()),
            "{what}"
        );
        assert!(decode(encoding, g.value()) > epoch_ms(), "{what}");
        if key_ttl {
            assert!(
                raw::pttl(&mut conn, key) > 0,
                "{what}: takeover sets the TTL"
            );
        }
        assert_held(la.try_lock(), &what);
        assert!(g.unlock().unwrap(), "{what}: unlock after takeover");
        assert_eq!(raw::get(&mut conn, key), None, "{what}");
    }
}

#[test]
fn every_strategy_on_every_master() {
    init_logging();
    let cluster = Cluster::start(MASTERS);
    let (a, b) = (client(&cluster), client(&cluster));
    let tags = tags(&cluster, "spread");

    // A real cluster: a node that does not serve a key answers MOVED instead of serving it.
    for (i, tag) in tags.iter().enumerate() {
        let other = cluster.node((i + 1) % MASTERS);
        let err = redis::cmd("GET")
            .arg(format!("{tag}:probe"))
            .query::<Option<String>>(&mut other.conn())
            .expect_err("a non-owner must redirect");
        assert_eq!(err.kind(), redis::ServerErrorKind::Moved.into(), "{err}");
    }

    for (i, tag) in tags.iter().enumerate() {
        for variant in Variant::all() {
            let key = format!("{tag}:{}", variant.name());
            checked_cycle(cluster.node(i), &a, &b, &key, variant);
        }
    }
}

#[test]
fn noscript_recovery_on_every_node_after_script_flush() {
    init_logging();
    let cluster = Cluster::start(MASTERS);
    let a = client(&cluster);
    let tags = tags(&cluster, "noscript");
    let ttl = Duration::from_secs(10);
    let token_locks: Vec<_> = tags
        .iter()
        .map(|t| Variant::Token.build(&a, &format!("{t}:token"), ttl, RetryPolicy::no_wait()))
        .collect();
    let cas = Variant::Classic {
        encoding: Encoding::Decimal,
        takeover: Takeover::CompareAndSet,
        key_ttl: true,
    };
    let classic_locks: Vec<_> = tags
        .iter()
        .map(|t| cas.build(&a, &format!("{t}:classic"), ttl, RetryPolicy::no_wait()))
        .collect();

    // Load the scripts on every node with one full cycle each.
    for (t, c) in token_locks.iter().zip(&classic_locks) {
        let mut g = t.try_lock().unwrap();
        g.extend(ttl).unwrap();
        assert!(g.unlock().unwrap());
        let mut g = c.try_lock().unwrap();
        g.extend(ttl).unwrap();
        assert!(g.unlock().unwrap());
    }
    // Differs by server: with SET … IFEQ (Valkey 8.1+) the Token extend is no script.
    // The Token release keeps its script in a cluster even with DELIFEQ (its PUBLISH would be
    // pipelined), and Classic's release falls back to unlock.lua where DELIFEQ is missing, so
    // unlock.lua is there on every server.
    let expected = if support::server_kind().has_set_ifeq() {
        2
    } else {
        3
    };
    // The client's open-time check ran a one-line probe (`return 1`, flagged `no-writes` on
    // Redis 7) on one node: not counted.
    let probes = [
        redis::Script::new("#!lua flags=no-writes\nreturn 1"),
        redis::Script::new("return 1"),
    ];
    for node in cluster.nodes() {
        let mut conn = node.conn();
        let probed: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(probes[0].get_hash())
            .arg(probes[1].get_hash())
            .query(&mut conn)
            .unwrap();
        let probed = probed.iter().filter(|p| **p).count();
        assert_eq!(
            raw::cached_scripts(&mut conn) - probed,
            expected,
            "unlock, extend (before Valkey 8.1), compare_and_set"
        );
    }

    // Hold a lock of each kind on each node, then flush every node's script cache.
    let mut held: Vec<_> = token_locks
        .iter()
        .chain(&classic_locks)
        .map(|l| l.try_lock().unwrap())
        .collect();
    for node in cluster.nodes() {
        raw::script_flush(&mut node.conn());
        assert_eq!(raw::cached_scripts(&mut node.conn()), 0);
    }

    // Every script-backed operation still works (EVALSHA -> NOSCRIPT -> EVAL on the owner).
    for g in &mut held {
        g.extend(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("extend {} after SCRIPT FLUSH: {e}", g.key()));
        assert!(g.remaining() > Duration::from_secs(15));
    }
    for g in held {
        let key = g.key().to_owned();
        let value = g.value().to_vec();
        let mut conn = cluster.conn_for_key(&key);
        assert_eq!(raw::get(&mut conn, &key), Some(value));
        assert!(g.unlock().unwrap(), "unlock {key} after SCRIPT FLUSH");
        assert_eq!(raw::get(&mut conn, &key), None);
    }
    for node in cluster.nodes() {
        assert_eq!(
            raw::cached_scripts(&mut node.conn()),
            expected,
            "EVAL cached the scripts again"
        );
    }

    // The fallback keeps the owner check: a lock taken over by someone else is not deleted.
    for lock in &token_locks {
        let g = lock.try_lock().unwrap();
        let mut conn = cluster.conn_for_key(lock.key());
        raw::set(&mut conn, lock.key(), b"someone-else");
        for node in cluster.nodes() {
            raw::script_flush(&mut node.conn());
        }
        assert!(!g.unlock().unwrap(), "not ours any more");
        assert_eq!(
            raw::get(&mut conn, lock.key()).as_deref(),
            Some(&b"someone-else"[..])
        );
    }
}

/// A probe that detects two holders of one lock at once.
#[derive(Default)]
struct Probe {
    inside: AtomicUsize,
    violations: AtomicUsize,
    entries: AtomicUsize,
}

impl Probe {
    fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.entries.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Threads that lock, check, hold briefly and unlock, each with its own client, until `stop`.
/// Contention (timeouts) is fine; any other error and any lost lock is recorded.
struct Contenders {
    stop: Arc<AtomicBool>,
    handles: Vec<thread::JoinHandle<()>>,
    probes: Vec<Arc<Probe>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Contenders {
    fn start(cluster: &Cluster, threads: usize, locks: &[(String, Variant)]) -> Contenders {
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let probes: Vec<Arc<Probe>> = locks.iter().map(|_| Arc::default()).collect();
        let handles = (0..threads)
            .map(|t| {
                let client = client(cluster);
                let locks: Vec<_> = locks
                    .iter()
                    .map(|(key, v)| {
                        v.build(
                            &client,
                            key,
                            Duration::from_secs(10),
                            RetryPolicy::standard(),
                        )
                    })
                    .collect();
                let (stop, errors, probes) = (stop.clone(), errors.clone(), probes.clone());
                thread::Builder::new()
                    .name(format!("contender-{t}"))
                    .spawn(move || {
                        let mut i = t;
                        while !stop.load(Ordering::SeqCst) {
                            let (lock, probe) = (&locks[i % locks.len()], &probes[i % locks.len()]);
                            i += 1;
                            match lock.try_lock_for(Duration::from_secs(3)) {
                                Ok(g) => {
                                    probe.enter();
                                    // The window in which an overlap would be seen.
                                    support::work(Duration::from_millis(5));
                                    probe.leave();
                                    match g.unlock() {
                                        Ok(true) => {}
                                        other => errors
                                            .lock()
                                            .unwrap()
                                            .push(format!("unlock {}: {other:?}", lock.key())),
                                    }
                                }
                                Err(e) if e.is_contention() => {}
                                Err(e) => errors.lock().unwrap().push(e.to_string()),
                            }
                        }
                    })
                    .expect("spawn")
            })
            .collect();
        Contenders {
            stop,
            handles,
            probes,
            errors,
        }
    }

    fn entries(&self) -> usize {
        self.probes
            .iter()
            .map(|p| p.entries.load(Ordering::SeqCst))
            .sum()
    }

    /// Stops the threads; asserts no overlap and no unexpected error.
    /// Waits until every lock had `n` critical sections (at most `timeout`): true if so.
    fn wait_entries(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.probes
                .iter()
                .all(|p| p.entries.load(Ordering::SeqCst) >= n)
        })
    }

    fn finish(self) -> Vec<usize> {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles {
            h.join().expect("contender panicked");
        }
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "unexpected errors: {errors:#?}");
        for (i, p) in self.probes.iter().enumerate() {
            assert_eq!(
                p.violations.load(Ordering::SeqCst),
                0,
                "lock {i}: two holders at once"
            );
        }
        self.probes
            .iter()
            .map(|p| p.entries.load(Ordering::SeqCst))
            .collect()
    }
}

#[test]
fn mutual_exclusion_of_four_threads_across_the_masters() {
    init_logging();
    let cluster = Cluster::start(MASTERS);
    let tags = tags(&cluster, "mx");
    let variants = [
        Variant::Token,
        Variant::Classic {
            encoding: Encoding::Decimal,
            takeover: Takeover::GetSet,
            key_ttl: false,
        },
        Variant::Classic {
            encoding: Encoding::BigEndian,
            takeover: Takeover::CompareAndSet,
            key_ttl: true,
        },
    ];
    let locks: Vec<(String, Variant)> = tags
        .iter()
        .zip(variants)
        .map(|(t, v)| (format!("{t}:{}", v.name()), v))
        .collect();
    let contenders = Contenders::start(&cluster, 4, &locks);
    // Until every lock had 20 critical sections under contention: a count, not a rate (a
    // busy machine takes longer, and the minute is far beyond what any run took).
    let enough = contenders.wait_entries(20, Duration::from_secs(60));
    let entries = contenders.finish();
    assert!(enough, "too few critical sections: {entries:?}");
    for ((key, _), n) in locks.iter().zip(&entries) {
        assert!(*n >= 20, "{key}: only {n} critical sections");
        let mut conn = cluster.conn_for_key(key);
        assert_eq!(raw::get(&mut conn, key), None, "{key} left behind");
    }
}

fn setslot(node: &RedisServer, slot: u16, args: &[&str]) {
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(args)
        .query(&mut node.conn())
        .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {args:?} on :{}: {e}", node.port()));
}

/// `MIGRATE` of `keys` from `src` to `dst` (keys that vanished meanwhile are skipped by Redis).
fn migrate(src: &RedisServer, dst: &RedisServer, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    let reply: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(dst.port())
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(keys)
        .query(&mut src.conn())
        .unwrap_or_else(|e| panic!("MIGRATE {keys:?}: {e}"));
    assert!(reply == "OK" || reply == "NOKEY", "MIGRATE: {reply}");
}

/// Moves `slot` from node `from` to node `to` while clients use it: `IMPORTING` on the target,
/// `MIGRATING` on the source, `MIGRATE` of every key still on the source (repeatedly, for
/// `window`: the keys of locks held by contenders move while held), then `SETSLOT ... NODE` on
/// the target, the source and the rest. `during` runs while the slot is migrating, after the
/// first sweep. Returns how many keys were moved by the repeated sweeps.
fn migrate_slot(
    cluster: &Cluster,
    slot: u16,
    from: usize,
    to: usize,
    window: Duration,
    during: impl FnOnce(),
) -> usize {
    let (src, dst) = (cluster.node(from), cluster.node(to));
    setslot(dst, slot, &["IMPORTING", cluster.node_id(from)]);
    setslot(src, slot, &["MIGRATING", cluster.node_id(to)]);
    during();
    let mut moved = 0;
    let deadline = Instant::now() + window;
    loop {
        let keys = keys_in_slot(src, slot);
        moved += keys.len();
        migrate(src, dst, &keys);
        if Instant::now() >= deadline {
            break;
        }
        // Paced (time under test): the migration lasts the window, locks taken meanwhile.
        support::work(Duration::from_millis(5));
    }
    assert!(
        keys_in_slot(src, slot).is_empty(),
        "a migrating source creates no new keys: they go to the target through ASK"
    );
    let others = (0..MASTERS).filter(|i| *i != from && *i != to);
    for i in [to, from].into_iter().chain(others) {
        setslot(cluster.node(i), slot, &["NODE", cluster.node_id(to)]);
    }
    assert!(wait_until(Duration::from_secs(10), || cluster
        .slot_owners()[usize::from(slot)]
        == Some(to)));
    moved
}

#[test]
fn locks_work_while_their_slot_migrates() {
    init_logging();
    let cluster = Cluster::start(MASTERS);
    let (a, b) = (client(&cluster), client(&cluster));
    let tag = format!("{{{}}}", cluster.key_on(0, "mig"));
    let slot = cluster.keyslot(&tag);
    let key = |name: &str| format!("{tag}:{name}");
    let long = Duration::from_secs(30);
    let cas = Variant::Classic {
        encoding: Encoding::BigEndian,
        takeover: Takeover::CompareAndSet,
        key_ttl: false,
    };
    let getset = Variant::Classic {
        encoding: Encoding::Decimal,
        takeover: Takeover::GetSet,
        key_ttl: true,
    };

    // Held before the migration starts: their keys live on node 0, the slot's owner.
    let held: Vec<(Lock, Lock)> = [("token", Variant::Token), ("cas", cas), ("getset", getset)]
        .into_iter()
        .map(|(name, v)| {
            (
                v.build(&a, &key(name), long, RetryPolicy::no_wait()),
                v.build(&b, &key(name), long, RetryPolicy::no_wait()),
            )
        })
        .collect();
    let mut guards: Vec<_> = held.iter().map(|(la, _)| la.try_lock().unwrap()).collect();
    let mut held_keys: Vec<String> = held.iter().map(|(l, _)| l.key().to_owned()).collect();
    held_keys.sort();
    let mut on_owner = keys_in_slot(cluster.node(0), slot);
    on_owner.sort();
    assert_eq!(on_owner, held_keys);

    // Four threads contend on two locks of the slot throughout.
    let contenders = Contenders::start(
        &cluster,
        4,
        &[(key("mx-token"), Variant::Token), (key("mx-cas"), cas)],
    );
    assert!(wait_until(Duration::from_secs(10), || contenders.entries() >= 20));
    let mut progress = contenders.entries();
    let mut moved_while_held = 0;
    let fresh_a = Variant::Token.build(&a, &key("fresh"), long, RetryPolicy::no_wait());
    let fresh_b = Variant::Token.build(&b, &key("fresh"), long, RetryPolicy::no_wait());
    let mut fresh = None;

    // Round 1, node 0 -> node 1, checked step by step.
    moved_while_held += migrate_slot(&cluster, slot, 0, 1, Duration::from_millis(800), || {
        let (src, dst) = (cluster.node(0), cluster.node(1));
        // Keys still on the source are served there.
        for (g, (_, lb)) in guards.iter().zip(&held) {
            assert!(g.is_held().unwrap(), "{} held before MIGRATE", g.key());
            assert_held(lb.try_lock(), "contention before MIGRATE");
        }
        // A new lock goes to the target through ASK.
        let g = fresh_a.try_lock().expect("a new lock in a migrating slot");
        assert!(!keys_in_slot(src, slot).contains(&key("fresh")));
        let on_dst: Option<Vec<u8>> = asking(&mut dst.conn(), redis::cmd("GET").arg(key("fresh")));
        assert_eq!(on_dst.as_deref(), Some(g.value()), "created on the target");
        assert_held(fresh_b.try_lock(), "contention on the target through ASK");
        fresh = Some(g);

        // Move the held locks while held: the source now answers ASK for them.
        migrate(src, dst, &held_keys);
        let src_keys = keys_in_slot(src, slot);
        assert!(
            held_keys.iter().all(|k| !src_keys.contains(k)),
            "{src_keys:?}"
        );
        for (g, (_, lb)) in guards.iter_mut().zip(&held) {
            let k = g.key().to_owned();
            let v: Option<Vec<u8>> = asking(&mut dst.conn(), redis::cmd("GET").arg(&k));
            assert_eq!(v.as_deref(), Some(g.value()), "{k} moved with its value");
            assert!(g.is_held().unwrap(), "{k} held after MIGRATE (ASK)");
            assert_held(lb.try_lock(), "contention after MIGRATE (ASK)");
            g.extend(Duration::from_secs(40))
                .unwrap_or_else(|e| panic!("extend {k} through ASK: {e}"));
            let v: Option<Vec<u8>> = asking(&mut dst.conn(), redis::cmd("GET").arg(&k));
            assert_eq!(v.as_deref(), Some(g.value()), "{k} extended on the target");
        }
        let t: i64 = asking(&mut dst.conn(), redis::cmd("PTTL").arg(key("token")));
        assert!(t > 30_000, "token PTTL after extend on the target: {t}");
    });
    let fresh = fresh.expect("taken during round 1");

    // Rounds 2 and 3 (node 1 -> 2 -> 0): the contenders keep going, the held locks stay held.
    for (from, to) in [(1, 2), (2, 0)] {
        assert!(
            wait_until(Duration::from_secs(10), || contenders.entries()
                >= progress + 20),
            "contenders made progress before moving the slot from {from} to {to}"
        );
        progress = contenders.entries();
        moved_while_held +=
            migrate_slot(&cluster, slot, from, to, Duration::from_millis(800), || {
                for (g, (_, lb)) in guards.iter().zip(&held) {
                    assert!(g.is_held().unwrap(), "{} held, slot migrating", g.key());
                    assert_held(lb.try_lock(), "contention, slot migrating");
                }
            });
        // The clients' slot maps are stale now: MOVED sends them to the new owner.
        for (g, (_, lb)) in guards.iter_mut().zip(&held) {
            let k = g.key().to_owned();
            assert_eq!(
                raw::get(&mut cluster.node(to).conn(), &k).as_deref(),
                Some(g.value()),
                "{k} on node {to}"
            );
            assert!(
                g.is_held().unwrap(),
                "{k} held after the slot moved to {to}"
            );
            assert_held(lb.try_lock(), "contention after the slot moved");
            g.extend(Duration::from_secs(40))
                .unwrap_or_else(|e| panic!("extend {k} after MOVED: {e}"));
        }
    }
    assert!(
        wait_until(Duration::from_secs(10), || contenders.entries()
            >= progress + 20),
        "contenders made progress after the last move"
    );
    let entries = contenders.finish();
    eprintln!("critical sections {entries:?}; contender keys moved while held: {moved_while_held}");

    let owner = cluster.node(0);
    for (g, (_, lb)) in guards.into_iter().zip(&held) {
        let k = g.key().to_owned();
        assert!(g.unlock().unwrap(), "unlock {k} after three moves");
        assert_eq!(raw::get(&mut owner.conn(), &k), None, "{k} released");
        let gb = lb.try_lock().expect("free for the other client");
        assert!(gb.unlock().unwrap());
    }
    assert!(fresh.unlock().unwrap());
    for node in cluster.nodes() {
        assert!(keys_in_slot(node, slot).is_empty(), "nothing left behind");
    }
}

/// Issue #4 on a cluster: the features that add keys and channels (the fencing counter, the
/// release channel, Redisson's hash layout, the watchdog's batched renewals) on locks served by
/// every master, with keys that carry a hash tag and keys that do not. A script touching keys of
/// two slots would fail with CROSSSLOT; every auxiliary key must sit on the lock key's node.
#[test]
fn auxiliary_keys_and_channels_stay_in_the_lock_slot() {
    init_logging();
    let cluster = Cluster::start(MASTERS);
    let (a, b) = (client(&cluster), client(&cluster));
    let mut keys: Vec<String> = tags(&cluster, "aux")
        .iter()
        .map(|t| format!("{t}:lock"))
        .collect();
    // Untagged keys, one per master: their companions get the key itself as hash tag.
    keys.extend((0..MASTERS).map(|i| cluster.key_on(i, "plain")));
    let node_of = |k: &str| cluster.node(cluster.slot_owner(cluster.keyslot(k)));
    for key in &keys {
        let what = format!("{key} (node :{})", node_of(key).port());

        // Fencing: the counter is on the lock's node and holds the latest token.
        let node = node_of(&format!("{key}:f"));
        let fenced = a
            .lock(format!("{key}:f"))
            .fencing()
            .ttl(Duration::from_secs(5))
            .build()
            .unwrap();
        let f1 = fenced.try_lock().unwrap().fence().expect("fence");
        let guard = fenced.try_lock().unwrap();
        let f2 = guard.fence().expect("fence");
        assert!(f2 > f1, "{what}: {f2} > {f1}");
        let counter = if key.contains('{') {
            format!("dlock_fence:{key}:f")
        } else {
            format!("dlock_fence:{{{key}:f}}")
        };
        let stored: Option<u64> = redis::cmd("GET")
            .arg(&counter)
            .query(&mut node.conn())
            .unwrap();
        assert_eq!(
            stored,
            Some(f2),
            "{what}: counter {counter} on the lock's node"
        );
        drop(guard);

        // Reentrant (Redisson layout) with fencing: hash on the lock's node, count 2 on re-entry.
        let rkey = format!("{key}:r");
        let node = node_of(&rkey);
        let reentrant = a
            .lock(&rkey)
            .strategy(Strategy::Reentrant)
            .fencing()
            .build()
            .unwrap();
        let outer = reentrant.lock().unwrap();
        let inner = reentrant.lock().unwrap();
        assert_eq!(
            outer.fence(),
            inner.fence(),
            "{what}: re-entry keeps the fence"
        );
        let field = String::from_utf8(outer.value().to_vec()).unwrap();
        let count: Option<u64> = redis::cmd("HGET")
            .arg(&rkey)
            .arg(&field)
            .query(&mut node.conn())
            .unwrap();
        assert_eq!(count, Some(2), "{what}: hold count on the lock's node");
        assert!(inner.unlock().unwrap());
        assert!(outer.unlock().unwrap());
        assert!(!raw::exists(&mut node.conn(), &rkey), "{what}: freed");

        // A watched lock is renewed past its lease (renewals grouped by slot).
        let watched = a
            .lock(format!("{key}:w"))
            .watchdog_lease(Duration::from_millis(600))
            .build()
            .unwrap();
        let guard = watched.try_lock().unwrap();
        // Past the lease by renewals alone.
        support::wait_renewals(&a, a.stats().renewals, 1, 4);
        assert!(!guard.is_lost(), "{what}: watched hold renewed");
        assert!(guard.is_held().unwrap(), "{what}: still ours on the server");
        assert!(guard.unlock().unwrap());

        // A waiter of another client is woken by the release's PUBLISH (it would otherwise
        // poll only every 5 s).
        let wkey = format!("{key}:p");
        let holder = a.lock(&wkey).ttl(Duration::from_secs(30)).build().unwrap();
        let waiter = b
            .lock(&wkey)
            .ttl(Duration::from_secs(30))
            .retry(
                RetryPolicy::standard()
                    .fixed_delay(Duration::from_secs(5))
                    .jitter(false),
            )
            .build()
            .unwrap();
        let held = holder.try_lock().unwrap();
        let subscribed = b.test_hooks().count(Event::Subscribed);
        let refused = b.stats().refusals;
        let started = Instant::now();
        let got = thread::scope(|s| {
            let w = s.spawn(|| {
                waiter
                    .try_lock_for(Duration::from_secs(20))
                    .map(|g| g.unlock())
            });
            support::wait_listening(&b, subscribed + 1, refused + 2);
            assert!(held.unlock().unwrap());
            w.join().unwrap()
        });
        assert!(got.is_ok(), "{what}: waiter got the lock: {got:?}");
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(4),
            "{what}: woken by pub/sub, not by its 5 s poll ({waited:?})"
        );
    }
}
