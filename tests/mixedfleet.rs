//! Mixed fleets against a real `redis-server`: waits beside peers that release without
//! publishing, Redisson's exact channel names, and reentrant releases sent twice.
//!
//! The foreign lockers are raw commands, as those clients send them:
//! - a *silent* token locker: `SET key token NX PX ttl`, released by a Lua compare-and-delete
//!   and no `PUBLISH` (what redis-py's `Lock`, node-redlock and most token lockers do);
//! - Redisson's `RLock` scripts (3.x `RedissonLock.tryLockInnerAsync` / `unlockInnerAsync`),
//!   which publish `0` on `redisson_lock__channel` named by Redisson's `prefixName`.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::ReentrantLock;
use redis_dlock::{DistributedLock, LockClient, RetryPolicy, Strategy};
#[cfg(feature = "cluster")]
use support::Cluster;
use support::{init_logging, raw, wait_until, RedisServer};

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

/// Redisson's `RedissonObject.prefixName(prefix, name)`: `prefix:name` when the name contains
/// `{` anywhere, `prefix:{name}` otherwise.
fn redisson_channel(key: &str) -> String {
    if key.contains('{') {
        format!("redisson_lock__channel:{key}")
    } else {
        format!("redisson_lock__channel:{{{key}}}")
    }
}

/// Waits until `channel` has exactly `n` subscribers.
fn wait_numsub(conn: &mut redis::Connection, channel: &str, n: i64) {
    assert!(
        wait_until(Duration::from_secs(5), || raw::numsub(conn, channel) == n),
        "{channel} never had {n} subscribers (has {})",
        raw::numsub(conn, channel)
    );
}

/// A token locker that never publishes: `SET NX PX` to take, compare-and-delete to release.
mod silent {
    const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
        return redis.call('del', KEYS[1]) else return 0 end";

    pub fn acquire(conn: &mut redis::Connection, key: &str, token: &str, ttl_ms: u64) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query(conn)
            .expect("SET NX PX");
        set.is_some()
    }

    pub fn release(conn: &mut redis::Connection, key: &str, token: &str) -> bool {
        let n: i64 = redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg(key)
            .arg(token)
            .query(conn)
            .expect("compare-and-delete");
        n == 1
    }
}

/// What a Java Redisson client sends, verbatim: the Lua of `RedissonLock` (Redisson 3.x,
/// `redisson/src/main/java/org/redisson/RedissonLock.java`, `tryLockInnerAsync` and
/// `unlockInnerAsync`), with the channel named by `prefixName`.
mod redisson {
    pub const LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) \
        or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then \
        redis.call('hincrby', KEYS[1], ARGV[2], 1); \
        redis.call('pexpire', KEYS[1], ARGV[1]); \
        return nil; \
        end; \
        return redis.call('pttl', KEYS[1]);";

    pub const UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
        return nil;\
        end; \
        local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
        if (counter > 0) then \
        redis.call('pexpire', KEYS[1], ARGV[2]); \
        return 0; \
        else \
        redis.call('del', KEYS[1]); \
        redis.call('publish', KEYS[2], ARGV[1]); \
        return 1; \
        end; \
        return nil;";

    pub const OWNER: &str = "6f0c2a7e-4d8b-4c51-9a3e-2b7d1c9e8f40:1";

    pub fn lock(conn: &mut redis::Connection, key: &str, lease_ms: u64) -> Option<i64> {
        redis::cmd("EVAL")
            .arg(LOCK)
            .arg(1)
            .arg(key)
            .arg(lease_ms)
            .arg(OWNER)
            .query(conn)
            .expect("Redisson lock script")
    }

    pub fn unlock(conn: &mut redis::Connection, key: &str, lease_ms: u64) -> Option<i64> {
        redis::cmd("EVAL")
            .arg(UNLOCK)
            .arg(2)
            .arg(key)
            .arg(super::redisson_channel(key))
            .arg(0)
            .arg(lease_ms)
            .arg(OWNER)
            .query(conn)
            .expect("Redisson unlock script")
    }
}

/// One handoff from a silent peer to a Rust waiter with the default settings (pub/sub wake-up,
/// standard retry policy): the peer holds with `peer_ttl`, the waiter waits, the peer releases
/// without publishing. Returns how long after the release the waiter had the lock.
fn silent_handoff(
    server: &RedisServer,
    lock: Arc<dyn DistributedLock>,
    peer_ttl: Duration,
) -> Duration {
    let key = lock.key().to_owned();
    let mut conn = server.conn();
    let token = format!("peer-{:x}", rand::random::<u64>());
    assert!(silent::acquire(
        &mut conn,
        &key,
        &token,
        peer_ttl.as_millis() as u64
    ));
    let waiter = thread::spawn(move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .expect("the waiter gets the lock");
        let got = Instant::now();
        assert!(guard.unlock().expect("unlock"));
        got
    });
    // Release once the waiter listens and has gone to sleep on the holder's lifetime, at a
    // random point of its poll schedule.
    wait_numsub(&mut conn, &redisson_channel(&key), 1);
    // Time under test: a random point of the waiter's poll schedule.
    thread::sleep(Duration::from_millis(300 + rand::random_range(0..200)));
    let released = Instant::now();
    assert!(silent::release(&mut conn, &key, &token));
    let got = waiter.join().expect("waiter thread");
    got.saturating_duration_since(released)
}

#[test]
fn a_waiter_notices_a_silent_release_within_the_poll_not_the_peer_ttl() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let peer_ttl = Duration::from_secs(10);
    // Token: the strategy that shares keys with token lockers.
    let key = "mixed:silent";
    let lock: Arc<dyn DistributedLock> = Arc::new(
        c.lock(key)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("build"),
    );
    // The first handoff is seen by the slow poll beside the subscription, the next ones by
    // the faster poll of a key known to be released silently.
    for round in 0..3 {
        let delay = silent_handoff(&server, Arc::clone(&lock), peer_ttl);
        log::info!("silent handoff {round}: {delay:?} after the release");
        assert!(
            delay < Duration::from_secs(1),
            "round {round}: the waiter took {delay:?} after a silent release (peer TTL \
             {peer_ttl:?})"
        );
    }
}

/// One client's threads wait on a key that another client holds (and releases with a
/// publish) while `window` passes: the commands the waiting client sent per second meanwhile,
/// counted on the wire (its subscriber connection included).
fn waiting_commands_per_second(server: &RedisServer, key: &str, window: Duration) -> f64 {
    let proxy = Proxy::start(server.port());
    let holder_client = client(server);
    let waiter_client = LockClient::open(proxy.url()).expect("client through the proxy");
    let mut conn = server.conn();
    let holder = holder_client
        .lock(key)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("holder");
    let held = holder.try_lock().expect("holder takes the lock");
    // Four threads of one client wait: only the head of the line polls.
    let waiter = Arc::new(
        waiter_client
            .lock(key)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("waiter"),
    );
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let waiter = Arc::clone(&waiter);
            thread::spawn(move || {
                let guard = waiter
                    .try_lock_for(Duration::from_secs(30))
                    .expect("each waiter gets the lock in turn");
                assert!(guard.unlock().expect("unlock"));
            })
        })
        .collect();
    wait_numsub(&mut conn, &redisson_channel(key), 1);
    // All four wait, the head listening.
    support::wait_event(&waiter_client, Event::Queued, 4);
    support::wait_listening(&waiter_client, 1, 2);
    let before = proxy.commands();
    let start = Instant::now();
    // Time under test: the commands of this window are counted.
    thread::sleep(window);
    let served = proxy.commands() - before;
    let elapsed = start.elapsed();
    let per_second = served as f64 / elapsed.as_secs_f64();
    log::info!("{served} commands in {elapsed:?}: {per_second:.1}/s");
    assert!(
        served >= 3,
        "the waiter polls beside its subscription ({served} commands in {elapsed:?})"
    );
    // The holder publishes: the waiters get in as before.
    assert!(held.unlock().expect("holder unlock"));
    for t in threads {
        t.join().expect("waiter thread");
    }
    per_second
}

#[test]
fn waiting_beside_a_publishing_holder_costs_at_most_ten_commands_a_second() {
    init_logging();
    let server = RedisServer::start();
    let window = Duration::from_secs(3);
    let per_second = waiting_commands_per_second(&server, "mixed:budget", window);
    // Differs by server: an attempt is one EVALSHA, or on a server with DELIFEQ (Valkey 9.0+)
    // SET … NX PX … GET pipelined with PTTL, two commands in one round trip.
    let per_attempt = if support::server_kind().has_native_token() {
        2.0
    } else {
        1.0
    };
    // 10 attempts per second, and one for the window's edges.
    assert!(
        per_second <= per_attempt * (10.0 + 1.0 / window.as_secs_f64()),
        "{per_second:.1} commands per second for one waiting client"
    );
}

/// `q`-quantile of sorted `v` (nearest rank).
fn quantile(v: &[Duration], q: f64) -> Duration {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The measurement behind the "Mixed fleets" section of docs/benchmarks.md (not a test: run
/// it with `cargo test --release --test mixedfleet -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement (about two minutes); run with --ignored"]
fn measure_silent_handoff_and_polling_traffic() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let peer_ttl = Duration::from_secs(10);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let report = |what: &str, mut v: Vec<Duration>| {
        v.sort();
        println!(
            "MEASURED {what}: n={} p50={:.1} ms p90={:.1} ms p99={:.1} ms max={:.1} ms",
            v.len(),
            ms(quantile(&v, 0.5)),
            ms(quantile(&v, 0.9)),
            ms(quantile(&v, 0.99)),
            ms(quantile(&v, 1.0))
        );
    };
    // A key never seen released silently: the slow poll beside the subscription.
    let first: Vec<Duration> = (0..100)
        .map(|n| {
            let lock: Arc<dyn DistributedLock> = Arc::new(
                c.lock(format!("measure:first:{n}"))
                    .ttl(Duration::from_secs(10))
                    .build()
                    .expect("build"),
            );
            silent_handoff(&server, lock, peer_ttl)
        })
        .collect();
    report("silent handoff, first on its key", first);
    // One key: after the first silent release it is polled fast.
    let lock: Arc<dyn DistributedLock> = Arc::new(
        c.lock("measure:again")
            .ttl(Duration::from_secs(10))
            .build()
            .expect("build"),
    );
    silent_handoff(&server, Arc::clone(&lock), peer_ttl);
    let again: Vec<Duration> = (0..200)
        .map(|_| silent_handoff(&server, Arc::clone(&lock), peer_ttl))
        .collect();
    report("silent handoff, key marked silent", again);
    for run in 0..3 {
        let rate = waiting_commands_per_second(
            &server,
            &format!("measure:budget:{run}"),
            Duration::from_secs(5),
        );
        println!("MEASURED commands per second of one waiting client (4 threads), 5 s: {rate:.2}");
    }
}

/// Keys whose channel names show Redisson's rule: `{` anywhere keeps the name as it is.
const NAMING_KEYS: [&str; 4] = ["a{b", "a{}b", "{tag}x", "plain"];

#[test]
fn releases_are_published_on_redissons_channel_names() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut pubsub = sub.as_pubsub();
    for key in NAMING_KEYS {
        pubsub.subscribe(redisson_channel(key)).expect("SUBSCRIBE");
    }
    for strategy in [Strategy::Token, Strategy::Reentrant] {
        for key in NAMING_KEYS {
            let key = format!("{key}:{strategy:?}");
            pubsub.subscribe(redisson_channel(&key)).expect("SUBSCRIBE");
            let lock = c
                .lock(&key)
                .strategy(strategy)
                .ttl(Duration::from_secs(10))
                .build()
                .unwrap_or_else(|e| panic!("{key}: every key builds: {e}"));
            assert!(lock.try_lock().expect("free").unlock().expect("unlock"));
            let msg = pubsub.get_message().expect("the release is published");
            assert_eq!(msg.get_channel_name(), redisson_channel(&key), "{key}");
            let payload: String = msg.get_payload().expect("payload");
            assert_eq!(payload, "0", "{key}: Redisson's unlock message");
        }
    }
}

#[test]
fn a_rust_waiter_hears_a_release_published_on_redissons_channel() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for key in NAMING_KEYS {
        let key = format!("{key}:heard");
        assert_eq!(redisson::lock(&mut conn, &key, 30_000), None, "Java holds");
        // A policy that polls every 5 s: only the published release can wake it sooner.
        let lock: ReentrantLock = c
            .lock(&key)
            .strategy(Strategy::Reentrant)
            .ttl(Duration::from_secs(10))
            .retry(RetryPolicy::standard().fixed_delay(Duration::from_secs(5)))
            .build()
            .expect("build")
            .try_into()
            .unwrap();
        let subscribed = c.test_hooks().count(Event::Subscribed);
        let refused = c.stats().refusals;
        let waiting = thread::spawn(move || {
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .expect("the waiter gets the lock");
            let got = Instant::now();
            assert!(guard.unlock().expect("unlock"));
            got
        });
        wait_numsub(&mut conn, &redisson_channel(&key), 1);
        support::wait_listening(&c, subscribed + 1, refused + 2);
        let released = Instant::now();
        assert_eq!(redisson::unlock(&mut conn, &key, 30_000), Some(1));
        let got = waiting.join().expect("waiter");
        let delay = got.saturating_duration_since(released);
        assert!(
            delay < Duration::from_secs(3),
            "{key}: woken {delay:?} after Redisson's release, not by the message"
        );
    }
}

/// A TCP proxy to the server that counts the commands clients send through it, and, once
/// armed, forwards the next reentrant release (an `EVALSHA` naming the release channel) and
/// then closes the connection instead of forwarding the reply: the script ran, the client sees
/// a dropped connection and sends the release again.
struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
    commands: Arc<AtomicUsize>,
}

/// Complete RESP commands (`*<n>` arrays of `$<len>` bulk strings) at the front of `buf`:
/// how many, and how many bytes they take.
fn complete_commands(buf: &[u8]) -> (usize, usize) {
    fn line(buf: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let n = std::str::from_utf8(&buf[at + 1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    let (mut count, mut used) = (0, 0);
    'commands: while used < buf.len() {
        let Some((items, mut at)) = line(buf, used) else {
            break;
        };
        for _ in 0..items {
            let Some((len, data)) = (at < buf.len()).then(|| line(buf, at)).flatten() else {
                break 'commands;
            };
            at = data + len + 2;
            if at > buf.len() {
                break 'commands;
            }
        }
        count += 1;
        used = at;
    }
    (count, used)
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let commands = Arc::new(AtomicUsize::new(0));
        let (a, d, n) = (
            Arc::clone(&armed),
            Arc::clone(&dropped),
            Arc::clone(&commands),
        );
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    return;
                };
                let kill = Arc::new(AtomicBool::new(false));
                let (mut c_in, mut s_out) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                let (armed, kill_up, counted) = (Arc::clone(&a), Arc::clone(&kill), Arc::clone(&n));
                thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    let mut pending = Vec::new();
                    loop {
                        let n = match c_in.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        pending.extend_from_slice(chunk);
                        let (complete, used) = complete_commands(&pending);
                        counted.fetch_add(complete, Ordering::SeqCst);
                        pending.drain(..used);
                        let contains = |s: &[u8]| chunk.windows(s.len()).any(|w| w == s);
                        if contains(b"EVALSHA")
                            && contains(b"redisson_lock__channel")
                            && armed.swap(false, Ordering::SeqCst)
                        {
                            kill_up.store(true, Ordering::SeqCst);
                        }
                        if s_out.write_all(chunk).is_err() {
                            break;
                        }
                    }
                    let _ = s_out.shutdown(Shutdown::Both);
                });
                let (mut s_in, mut c_out, dropped) = (server, client, Arc::clone(&d));
                thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        let n = match s_in.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if kill.load(Ordering::SeqCst) {
                            // Only a reply that is no error (NOSCRIPT: the script did not run)
                            // counts as the lost reply of a release that ran.
                            if buf[0] != b'-' {
                                dropped.fetch_add(1, Ordering::SeqCst);
                            }
                            break;
                        }
                        if c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(Shutdown::Both);
                    let _ = s_in.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy {
            port,
            armed,
            dropped,
            commands,
        }
    }

    /// Commands sent through the proxy so far.
    fn commands(&self) -> usize {
        self.commands.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Arms the proxy, runs `f`, and checks that a reply was dropped.
    fn drop_reply_of<T>(&self, f: impl FnOnce() -> T) -> T {
        let before = self.dropped.load(Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
        let out = f();
        assert!(
            !self.armed.load(Ordering::SeqCst),
            "no release went through"
        );
        assert_eq!(
            self.dropped.load(Ordering::SeqCst),
            before + 1,
            "the reply of a release that ran was dropped"
        );
        out
    }
}

#[test]
fn a_reentrant_release_sent_again_after_a_lost_reply_gives_back_one_hold() {
    init_logging();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let c = LockClient::builder(proxy.url())
        .pool_size(1)
        .build()
        .expect("client through the proxy");
    let mut conn = server.conn();
    let key = "mixed:retried-release";
    let lock: ReentrantLock = c
        .lock(key)
        .strategy(Strategy::Reentrant)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("build")
        .try_into()
        .unwrap();
    let owner = lock.owner_id();
    let count = |conn: &mut redis::Connection| -> Option<i64> {
        redis::cmd("HGET")
            .arg(key)
            .arg(&owner)
            .query(conn)
            .expect("HGET")
    };
    // Load the scripts first: an EVALSHA answered NOSCRIPT did not run.
    let warm = lock.try_acquire().expect("ours");
    assert!(lock.release(&warm).expect("release"));
    let leases: Vec<_> = (0..3).map(|_| lock.try_acquire().expect("ours")).collect();
    assert_eq!(count(&mut conn), Some(3));

    // The script runs, its reply is lost, the client sends the release again on a new
    // connection: one hold is given back, not two.
    let released = proxy.drop_reply_of(|| lock.release(&leases[2]));
    assert!(released.expect("release"), "the hold was ours");
    assert_eq!(
        count(&mut conn),
        Some(2),
        "one release, one hold given back"
    );
    assert!(lock.release(&leases[1]).expect("release"));
    assert_eq!(count(&mut conn), Some(1));
    // Nothing else in the hash is a number, nor an owner id.
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(key)
        .query(&mut conn)
        .expect("HGETALL");
    for (field, value) in &fields {
        assert!(
            field == &owner || value.parse::<i64>().is_err(),
            "{field} = {value}"
        );
    }

    // The last hold: the first copy deletes the key and publishes; the second finds no hold
    // (documented: Ok(false), nothing changed).
    let last = proxy.drop_reply_of(|| lock.release(&leases[0]));
    assert!(!last.expect("release"));
    assert!(!raw::exists(&mut conn, key), "the lock is free");
    // The key can be taken again at once, by anyone.
    assert_eq!(redisson::lock(&mut conn, key, 30_000), None);
    assert_eq!(redisson::unlock(&mut conn, key, 30_000), Some(1));
}

#[cfg(feature = "cluster")]
#[test]
fn every_key_works_on_a_cluster_and_only_the_channel_leaves_the_slot() {
    init_logging();
    let cluster = Cluster::start(3);
    let (a, b) = (
        LockClient::cluster_builder(&cluster.urls())
            .build()
            .expect("cluster client"),
        LockClient::cluster_builder(&cluster.urls())
            .build()
            .expect("cluster client"),
    );
    for key in ["a{b", "a{}b", "}a{b", "{tag}x", "plain"] {
        let slot = cluster.keyslot(key);
        let mut node = cluster.conn_for_key(key);
        for strategy in [Strategy::Token, Strategy::Reentrant] {
            let build = |c: &LockClient| {
                c.lock(key)
                    .strategy(strategy)
                    .fencing()
                    .ttl(Duration::from_secs(10))
                    .build()
                    .unwrap_or_else(|e| panic!("{key}: {e}"))
            };
            let (holder, waiter) = (build(&a), build(&b));
            // Lock key and fencing counter in one script: CROSSSLOT if they were apart.
            let held = holder.try_lock().expect("fenced acquire");
            let fence = held.fence().expect("fence");
            let counters: Vec<String> = redis::cmd("KEYS")
                .arg("dlock_fence:*")
                .query(&mut node)
                .expect("KEYS");
            let counter = counters
                .iter()
                .find(|c| raw::get_i64(&mut node, c) == fence as i64)
                .unwrap_or_else(|| panic!("{key}: the counter is on the lock's node"));
            assert_eq!(cluster.keyslot(counter), slot, "{key}: {counter}");
            // The release publishes on Redisson's name (in ARGV: it may be in another slot)
            // and a waiter of another client hears it.
            let queued = b.test_hooks().count(Event::Queued);
            let waiting = thread::spawn(move || {
                let guard = waiter
                    .try_lock_for(Duration::from_secs(20))
                    .expect("the waiter gets the lock");
                assert!(guard.unlock().expect("unlock"));
            });
            support::wait_event(&b, Event::Queued, queued + 1);
            assert!(held.unlock().expect("release on a cluster"), "{key}");
            waiting.join().expect("waiter");
            raw::del(&mut node, counter);
        }
        // Redisson's own unlock passes the channel as a KEY: for a key whose channel lands in
        // another slot, the cluster refuses it (docs/compatibility.md says so).
        assert_eq!(redisson::lock(&mut node, key, 10_000), None);
        let unlock: redis::RedisResult<Option<i64>> = redis::cmd("EVAL")
            .arg(redisson::UNLOCK)
            .arg(2)
            .arg(key)
            .arg(redisson_channel(key))
            .arg(0)
            .arg(10_000)
            .arg(redisson::OWNER)
            .query(&mut node);
        let apart = cluster.keyslot(&redisson_channel(key)) != slot;
        match unlock {
            Err(e) if apart => assert!(
                e.to_string().to_uppercase().contains("CROSSSLOT"),
                "{key}: {e}"
            ),
            other => {
                assert!(!apart, "{key}: {other:?}");
                assert_eq!(other.expect("Redisson unlock"), Some(1));
            }
        }
        raw::del(&mut node, key);
    }
}
