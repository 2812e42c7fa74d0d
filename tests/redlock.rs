//! RedLock over 5 real, independent `redis-server` masters: the algorithm's wire effects on every
//! node, majority and validity rules, and fault tolerance (paused, killed and restarted nodes)
//! with mutual exclusion checked across 8 threads throughout.

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, LockClient, LockError, RedLock, RedLockClient, RetryPolicy};
use support::{init_logging, raw, wait_until, RedisServer};

const KEY: &str = "redlock:test";
/// Slack on top of a computed bound, for a slow, busy CI machine.
const MARGIN: Duration = Duration::from_secs(2);
/// A node timeout for tests without faults, so a loaded machine never turns a slow answer into
/// a failed vote and single attempts are deterministic.
const PATIENT: Duration = Duration::from_secs(1);
/// Node timeout of the fault tests whose unlock/extend need every live node's vote (3 of 3 with
/// two nodes down): short, but a scheduling hiccup on a busy machine is not a failed vote.
const FAULT_TIMEOUT: Duration = Duration::from_millis(200);

/// Starts `n` servers in parallel.
fn start_nodes(n: usize) -> Vec<RedisServer> {
    init_logging();
    thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(RedisServer::start)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("start redis-server"))
            .collect()
    })
}

fn urls(nodes: &[RedisServer]) -> Vec<String> {
    nodes.iter().map(|n| n.url()).collect()
}

/// Default settings: 50 ms per node.
fn client(nodes: &[RedisServer]) -> RedLockClient {
    RedLockClient::open(&urls(nodes)).expect("RedLock client")
}

fn patient_client(nodes: &[RedisServer]) -> RedLockClient {
    client_with_timeout(nodes, PATIENT)
}

fn client_with_timeout(nodes: &[RedisServer], timeout: Duration) -> RedLockClient {
    RedLockClient::builder(&urls(nodes))
        .node_timeout(timeout)
        .build()
        .expect("RedLock client")
}

/// True once a hold has the token on every node of `which` (a node that just came back may
/// first fail one vote on a pooled connection its restart broke).
fn eventually_all_hold(nodes: &[RedisServer], which: &[usize], lock: &dyn DistributedLock) -> bool {
    wait_until(Duration::from_secs(5), || {
        let Ok(guard) = lock.try_lock_for(Duration::from_secs(2)) else {
            return false;
        };
        let token = guard.value().to_vec();
        let all = wait_until(Duration::from_millis(300), || {
            holding(nodes, which, KEY, &token).len() == which.len()
        });
        let _ = guard.unlock();
        all
    })
}

/// `GET key` on one (running, unpaused) node.
fn get(node: &RedisServer, key: &str) -> Option<Vec<u8>> {
    raw::get(&mut node.conn(), key)
}

fn pttl(node: &RedisServer, key: &str) -> i64 {
    raw::pttl(&mut node.conn(), key)
}

/// Another owner's lock on one node, written directly.
fn set_foreign(node: &RedisServer, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(30_000)
        .query(&mut node.conn())
        .expect("SET");
}

fn del(node: &RedisServer, key: &str) {
    raw::del(&mut node.conn(), key);
}

/// `KEY` with lifetime `ttl` and the default retry policy.
fn lock_with_ttl(client: &RedLockClient, ttl: Duration) -> RedLock {
    client.lock(KEY).ttl(ttl).build().expect("lock")
}

/// Whether every node of `which` holds `token` at `KEY` within [`MARGIN`].
fn soon_held_by(nodes: &[RedisServer], which: &[usize], token: &[u8]) -> bool {
    wait_until(MARGIN, || {
        holding(nodes, which, KEY, token).len() == which.len()
    })
}

/// Indices of the nodes (among `which`) whose `key` holds `value`.
fn holding(nodes: &[RedisServer], which: &[usize], key: &str, value: &[u8]) -> Vec<usize> {
    which
        .iter()
        .copied()
        .filter(|&i| get(&nodes[i], key).as_deref() == Some(value))
        .collect()
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(r: Result<T, LockError>) {
    match r {
        Err(LockError::Config { .. }) => {}
        other => panic!("expected Err(Config), got {other:?}"),
    }
}

#[test]
fn invalid_settings_are_rejected() {
    assert_invalid(RedLockClient::from_clients(vec![]).build());
    assert_invalid(RedLockClient::open::<&str>(&[]));
    let c = RedLockClient::open(&["redis://127.0.0.1:1/"]).expect("lazy client");
    assert_eq!((c.node_count(), c.quorum()), (1, 1));
    assert_eq!(
        c.node_timeout(),
        redis_dlock::RedLockClientBuilder::DEFAULT_NODE_TIMEOUT
    );
    assert_invalid(c.lock("").build());
    // 2 ms cannot cover the drift allowance (1% + 2 ms).
    assert_invalid(c.lock(KEY).ttl(Duration::from_millis(2)).build());
    assert_invalid(c.lock(KEY).ttl(Duration::ZERO).build());
    assert!(c.lock(KEY).ttl(Duration::from_millis(3)).build().is_ok());
    assert!(matches!(
        RedLockClient::open(&["redis://127.0.0.1:1/"; 3])
            .expect("client")
            .lock(KEY)
            .retry(RetryPolicy::standard().backoff(
                Duration::from_millis(10),
                Duration::from_millis(1),
                2
            ))
            .build(),
        Err(LockError::Config { .. })
    ));
    assert!(matches!(
        RedLockClient::builder(&["redis://127.0.0.1:1/"])
            .node_timeout(Duration::ZERO)
            .build(),
        Err(LockError::Config { key: None, .. })
    ));
    // Each node is built by a `ClientBuilder` that `node_options` changes: its checks apply.
    assert!(matches!(
        RedLockClient::builder(&["redis://127.0.0.1:1/"])
            .node_options(|node| node.connect_timeout(Duration::ZERO))
            .build(),
        Err(LockError::Config { key: None, .. })
    ));
    assert!(RedLockClient::builder(&["redis://127.0.0.1:1/"])
        .node_options(|node| node.connect_timeout(Duration::from_millis(500)))
        .build()
        .is_ok());
}

#[test]
fn acquire_extend_release_on_every_node() {
    let nodes = start_nodes(5);
    let all = [0, 1, 2, 3, 4];
    let client = patient_client(&nodes);
    assert_eq!((client.node_count(), client.quorum()), (5, 3));
    let ttl = Duration::from_secs(5);
    let lock = lock_with_ttl(&client, ttl);
    let drift = RedLock::clock_drift(ttl);
    assert_eq!(lock.drift(), Duration::from_millis(52));

    let before = Instant::now();
    let mut guard = lock.try_lock().expect("free lock");
    let token = guard.value().to_vec();
    assert_eq!(token.len(), 32);
    assert!(token.iter().all(u8::is_ascii_hexdigit));
    // Validity: counted from before the commands were sent, minus the drift allowance.
    let lease = guard.lease().clone();
    assert_eq!(lease.valid_until(), lease.acquired_at() + ttl - drift);
    assert!(lease.acquired_at() >= before);
    assert!(guard.remaining() <= ttl - drift);
    assert!(guard.remaining() > Duration::ZERO);
    // The same token on all five nodes (the decision may come before the last replies).
    assert!(soon_held_by(&nodes, &all, &token));
    for node in &nodes {
        let left = pttl(node, KEY);
        assert!(left > 3_000 && left <= 5_000, "PTTL {left}");
    }
    assert!(guard.is_held().expect("is_held"));

    // Held for everyone else: another lock object, and another client (another process).
    let other = client.lock(KEY).build().expect("lock");
    assert!(matches!(other.try_lock(), Err(LockError::Held { .. })));
    let elsewhere = patient_client(&nodes);
    let remote = elsewhere.lock(KEY).build().expect("lock");
    assert!(matches!(remote.try_lock(), Err(LockError::Held { .. })));
    // The failed attempts left nothing behind: still our token everywhere.
    assert!(soon_held_by(&nodes, &all, &token));

    // Extend: new PX on every node, new validity.
    let before = Instant::now();
    guard.extend(Duration::from_secs(20)).expect("extend");
    assert!(guard.valid_until() >= before + Duration::from_secs(20) - Duration::from_millis(202));
    assert!(guard.remaining() <= Duration::from_secs(20) - Duration::from_millis(202));
    assert!(wait_until(MARGIN, || nodes
        .iter()
        .all(|n| pttl(n, KEY) > 15_000)));
    assert_eq!(guard.value(), &token[..]);

    // A waiter in another client gets the lock once we release.
    let refused = elsewhere.stats().refusals;
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let g = remote.lock().expect("acquired after release");
            let v = g.value().to_vec();
            assert!(g.unlock().expect("unlock"));
            v
        });
        // The waiter was refused once: it waits.
        assert!(wait_until(support::EVENT_TIMEOUT, || elsewhere
            .stats()
            .refusals
            > refused));
        assert!(
            guard.unlock().expect("unlock"),
            "our token was on every node"
        );
        let theirs = waiter.join().expect("waiter");
        assert_ne!(theirs, token);
    });
    assert!(wait_until(MARGIN, || nodes
        .iter()
        .all(|n| get(n, KEY).is_none())));

    // Lease-level API: a second release finds nothing of ours.
    let lease = lock.try_acquire().expect("free");
    assert!(lock.is_held(&lease).expect("is_held"));
    assert!(lock.release(&lease).expect("release"));
    assert!(!lock.release(&lease).expect("release again"));
    assert!(!lock.is_held(&lease).expect("is_held"));
}

/// A hold released after its validity passed is reported lost (`Ok(false)`), even while every
/// node still has its token (their keys made to outlive it here): the section overran. The
/// token is deleted all the same.
#[test]
fn a_hold_released_after_its_validity_is_reported_lost() {
    let nodes = start_nodes(3);
    let c = patient_client(&nodes);
    let lock = lock_with_ttl(&c, Duration::from_millis(300));
    let guard = lock.try_lock().expect("free");
    let token = guard.value().to_vec();
    // try_lock returns on a majority: the third SET may still be on its way.
    assert!(soon_held_by(&nodes, &[0, 1, 2], &token));
    for node in &nodes {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(KEY)
            .arg(30_000)
            .query(&mut node.conn())
            .expect("PEXPIRE");
    }
    assert!(wait_until(Duration::from_secs(10), || guard.is_expired()));
    assert_eq!(holding(&nodes, &[0, 1, 2], KEY, &token), vec![0, 1, 2]);
    assert!(!guard.unlock().unwrap(), "its section overran");
    // The release returns on a majority of deletes: the third may still be on its way.
    assert!(
        wait_until(MARGIN, || holding(&nodes, &[0, 1, 2], KEY, &token)
            .is_empty()),
        "deleted"
    );
}

#[test]
fn majority_wins_minority_loses_and_a_lost_attempt_cleans_up() {
    let nodes = start_nodes(5);
    let client = patient_client(&nodes);
    let lock = client
        .lock(KEY)
        .retry(RedLock::default_retry_policy().max_wait(Some(Duration::from_millis(300))))
        .build()
        .expect("lock");

    // Two nodes held by someone else: 3 of 5 is still a majority.
    set_foreign(&nodes[0], KEY, "other-0");
    set_foreign(&nodes[1], KEY, "other-1");
    let guard = lock.try_lock().expect("3 of 5 free");
    let token = guard.value().to_vec();
    assert!(soon_held_by(&nodes, &[2, 3, 4], &token));
    assert!(guard.is_held().expect("is_held"));
    assert!(guard.unlock().expect("a majority deleted our token"));
    assert_eq!(get(&nodes[0], KEY).as_deref(), Some(&b"other-0"[..]));
    assert_eq!(get(&nodes[1], KEY).as_deref(), Some(&b"other-1"[..]));
    assert!(wait_until(MARGIN, || (2..5).all(|i| get(&nodes[i], KEY).is_none())));

    // Three held by someone else: no majority. The attempt's SETs that won on nodes 3 and 4
    // are deleted again, and the foreign values are untouched.
    set_foreign(&nodes[2], KEY, "other-2");
    assert!(matches!(lock.try_lock(), Err(LockError::Held { .. })));
    // Deleted before the attempt returned (it waits for its deletes, one node timeout at
    // most), so a program that exits on the refusal leaves nothing behind.
    assert!(
        get(&nodes[3], KEY).is_none() && get(&nodes[4], KEY).is_none(),
        "a lost attempt must release on every node before it returns"
    );
    for (i, v) in ["other-0", "other-1", "other-2"].iter().enumerate() {
        assert_eq!(get(&nodes[i], KEY).as_deref(), Some(v.as_bytes()));
    }
    let t = Instant::now();
    match lock.lock() {
        Err(LockError::Timeout { attempts, .. }) => assert!(attempts >= 2, "{attempts}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_millis(300) + MARGIN);
    assert!(wait_until(MARGIN, || get(&nodes[3], KEY).is_none()
        && get(&nodes[4], KEY).is_none()));

    // One foreign value goes away: a majority again.
    del(&nodes[2], KEY);
    let guard = lock.lock().expect("3 of 5 free again");
    assert!(guard.unlock().expect("unlock"));
}

#[test]
fn validity_subtracts_elapsed_time_and_drift() {
    let nodes = start_nodes(5);
    let client = patient_client(&nodes);
    let mut conns: Vec<redis::Connection> = nodes.iter().map(|n| n.conn()).collect();
    let pause_writes = |conns: &mut Vec<redis::Connection>, ms: u64| {
        for c in conns.iter_mut() {
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg("WRITE")
                .query(c)
                .expect("CLIENT PAUSE");
        }
    };

    // Every node holds writes back for 150 ms: the majority comes at least 150 ms after the
    // pause began, and that time is taken off the validity.
    let ttl = Duration::from_secs(2);
    let drift = RedLock::clock_drift(ttl);
    let lock = lock_with_ttl(&client, ttl);
    let paused_at = Instant::now();
    pause_writes(&mut conns, 150);
    let lease = lock.try_acquire().expect("won");
    let returned = Instant::now();
    assert!(returned >= paused_at + Duration::from_millis(150));
    assert_eq!(lease.valid_until(), lease.acquired_at() + ttl - drift);
    assert!(lease.acquired_at() >= paused_at && lease.acquired_at() <= returned);
    let validity = lease.valid_until().saturating_duration_since(returned);
    assert!(validity <= ttl - drift - (returned - lease.acquired_at()));
    assert!(validity < ttl - drift);
    assert!(lock.release(&lease).expect("release"));

    // A majority that arrives after ttl − drift is no lock at all.
    let short = lock_with_ttl(&client, Duration::from_millis(100));
    pause_writes(&mut conns, 250);
    // Votes that come after the lifetime ran out must not win: either they came before the
    // node timeout and are a majority too late, or they did not come in time at all. Neither
    // is contention.
    match short.try_acquire() {
        Err(LockError::LateReply { .. }) | Err(LockError::NoQuorum { refused: 0, .. }) => {}
        other => panic!("votes after the lifetime ran out must not win: {other:?}"),
    }
    // Once the nodes answer promptly again (their pause ends), the same lock is won.
    let mut won = None;
    assert!(wait_until(support::EVENT_TIMEOUT, || {
        won = short.try_acquire().ok();
        won.is_some()
    }));
    let lease = won.expect("won");
    assert!(
        lease.remaining()
            <= Duration::from_millis(100) - RedLock::clock_drift(Duration::from_millis(100))
    );
}

/// Lock, check a majority of the live nodes holds our token, extend, unlock: `rounds` times.
fn cycles(nodes: &[RedisServer], live: &[usize], lock: &dyn DistributedLock, rounds: usize) {
    for round in 0..rounds {
        let t = Instant::now();
        let mut guard = lock
            .try_lock_for(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(
            t.elapsed() < Duration::from_secs(1) + MARGIN,
            "round {round}: acquire took {:?}",
            t.elapsed()
        );
        let token = guard.value().to_vec();
        assert!(
            wait_until(MARGIN, || holding(nodes, live, KEY, &token).len() >= 3),
            "round {round}: a majority of nodes holds our token"
        );
        assert!(guard.remaining() <= lock.ttl() - RedLock::clock_drift(lock.ttl()));
        guard.extend(lock.ttl()).expect("extend with a majority up");
        assert!(guard.is_held().expect("is_held"));
        assert!(guard.unlock().expect("unlock"), "round {round}: released");
    }
}

#[test]
fn works_with_one_and_two_nodes_paused() {
    let nodes = start_nodes(5);
    let client = client_with_timeout(&nodes, FAULT_TIMEOUT);
    let lock = lock_with_ttl(&client, Duration::from_secs(3));
    cycles(&nodes, &[0, 1, 2, 3, 4], &lock, 3);

    nodes[0].pause();
    let t = Instant::now();
    cycles(&nodes, &[1, 2, 3, 4], &lock, 10);
    let one_paused = t.elapsed();

    nodes[1].pause();
    let t = Instant::now();
    cycles(&nodes, &[2, 3, 4], &lock, 10);
    let two_paused = t.elapsed();
    eprintln!("10 cycles: 1 paused {one_paused:?}, 2 paused {two_paused:?}");

    nodes[0].resume();
    nodes[1].resume();
    // Writes buffered while paused may land now and leave stale tokens for up to a TTL; the
    // other nodes still make a majority.
    cycles(&nodes, &[0, 1, 2, 3, 4], &lock, 3);
}

/// Calls of `command` a node has executed (INFO commandstats).
fn calls(node: &RedisServer, command: &str) -> i64 {
    raw::command_calls(&mut node.conn(), command)
}

/// A paused node executes the writes it buffered when it resumes. Our deletes for those tokens
/// could not reach it while it was paused; they are resent once it answers again, so it does
/// not keep stale tokens (and vote no) for a whole TTL.
#[test]
fn resumed_node_loses_the_stale_writes_it_buffered() {
    let nodes = start_nodes(5);
    let client = client_with_timeout(&nodes, FAULT_TIMEOUT);
    let ttl = Duration::from_secs(10);
    let lock = lock_with_ttl(&client, ttl);
    cycles(&nodes, &[0, 1, 2, 3, 4], &lock, 3);
    let sets = calls(&nodes[0], "set");

    // Paused for several node timeouts, so commands to it time out and its connections are
    // dropped with writes still unread in their buffers.
    nodes[0].pause();
    let t = Instant::now();
    while t.elapsed() < 5 * FAULT_TIMEOUT {
        cycles(&nodes, &[1, 2, 3, 4], &lock, 1);
    }
    nodes[0].resume();
    assert!(
        wait_until(MARGIN, || calls(&nodes[0], "set") > sets),
        "the SET written before the pause runs on resume"
    );
    let t = Instant::now();
    assert!(
        wait_until(ttl / 2, || {
            let Ok(g) = lock.try_lock_for(Duration::from_secs(2)) else {
                return false;
            };
            let _ = g.unlock();
            wait_until(Duration::from_millis(300), || get(&nodes[0], KEY).is_none())
        }),
        "node 0 still holds a stale token: {:?}",
        get(&nodes[0], KEY).map(|v| String::from_utf8_lossy(&v).into_owned())
    );
    eprintln!("node 0 clean {:?} after resume", t.elapsed());
}

#[test]
fn works_with_one_and_two_nodes_killed() {
    let mut nodes = start_nodes(5);
    let client = client_with_timeout(&nodes, FAULT_TIMEOUT);
    let lock = lock_with_ttl(&client, Duration::from_secs(3));
    cycles(&nodes, &[0, 1, 2, 3, 4], &lock, 3);

    nodes[3].kill();
    cycles(&nodes, &[0, 1, 2, 4], &lock, 10);
    nodes[1].kill();
    cycles(&nodes, &[0, 2, 4], &lock, 10);

    // Back (empty: no persistence): they take part again.
    nodes[1].restart();
    nodes[3].restart();
    assert!(
        eventually_all_hold(&nodes, &[1, 3], &lock),
        "restarted nodes hold the token again"
    );
    cycles(&nodes, &[0, 1, 2, 3, 4], &lock, 3);
}

/// With 3 of 5 nodes gone, everything fails cleanly (no panic, errors of the documented kinds)
/// and fast; and works again once they are back.
fn check_three_down(client: &RedLockClient) {
    let max_wait = Duration::from_secs(1);
    let lock = client
        .lock(KEY)
        .ttl(Duration::from_secs(1))
        .retry(RedLock::default_retry_policy().max_wait(Some(max_wait)))
        .build()
        .expect("lock");

    // Nobody holds the lock: a vote lost to an unreachable node is a failure, not contention.
    let no_quorum = |r: Result<redis_dlock::LockGuard<'_>, LockError>| match r {
        Err(
            e @ LockError::NoQuorum {
                granted,
                refused,
                failed,
                nodes,
                quorum,
                ..
            },
        ) => {
            assert!(!e.is_contention(), "{e}");
            assert_eq!((nodes, quorum), (5, 3));
            assert_eq!(refused, 0, "{e}");
            assert!(failed >= 3 && granted <= 2, "{e}");
            assert!(e.to_string().contains("failed or did not answer"), "{e}");
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    };
    let t = Instant::now();
    no_quorum(lock.lock());
    assert!(t.elapsed() >= max_wait, "gave up after {:?}", t.elapsed());
    assert!(t.elapsed() < max_wait + MARGIN, "took {:?}", t.elapsed());

    let t = Instant::now();
    no_quorum(lock.try_lock());
    assert!(t.elapsed() < client.node_timeout() + MARGIN);

    let t = Instant::now();
    no_quorum(lock.try_lock_for(Duration::from_millis(300)));
    assert!(t.elapsed() < Duration::from_millis(300) + MARGIN);
}

#[test]
fn fails_cleanly_and_fast_with_three_nodes_paused() {
    let nodes = start_nodes(5);
    let client = client(&nodes);
    let lock = lock_with_ttl(&client, Duration::from_secs(1));
    let mut held = lock.try_lock_for(Duration::from_secs(5)).expect("lock");

    for n in &nodes[..3] {
        n.pause();
    }
    // The hold we had can be neither confirmed, extended nor released by a majority.
    let t = Instant::now();
    assert!(!held.is_held().expect("is_held"));
    assert!(matches!(
        held.extend(Duration::from_secs(1)),
        Err(LockError::Lost { .. })
    ));
    assert!(!held.unlock().expect("unlock"), "only 2 of 5 could confirm");
    assert!(t.elapsed() < 3 * client.node_timeout() + MARGIN);

    check_three_down(&client);

    for n in &nodes[..3] {
        n.resume();
    }
    // Stale writes the paused nodes buffered expire within the 1 s TTL.
    let guard = lock
        .try_lock_for(Duration::from_secs(1) + MARGIN)
        .expect("a majority is back");
    assert!(guard.unlock().expect("unlock"));
}

#[test]
fn fails_cleanly_and_fast_with_three_nodes_killed() {
    let mut nodes = start_nodes(5);
    let client = client(&nodes);
    let lock = lock_with_ttl(&client, Duration::from_secs(1));
    let held = lock.try_lock_for(Duration::from_secs(5)).expect("lock");
    for n in &mut nodes[2..] {
        n.kill();
    }
    assert!(!held.is_held().expect("is_held"));
    assert!(!held.unlock().expect("unlock"), "only 2 of 5 could confirm");

    check_three_down(&client);

    for n in &mut nodes[2..] {
        n.restart();
    }
    let guard = lock
        .try_lock_for(Duration::from_secs(1) + MARGIN)
        .expect("a majority is back");
    drop(guard);
    assert!(eventually_all_hold(&nodes, &[2, 3, 4], &lock));
}

#[test]
fn extend_and_release_need_a_majority() {
    let nodes = start_nodes(5);
    let all = [0, 1, 2, 3, 4];
    let client = patient_client(&nodes);
    let lock = client.lock(KEY).build().expect("lock");

    // Our key replaced on 2 nodes (expired there and taken): still a majority.
    let mut guard = lock.try_lock().expect("lock");
    let token = guard.value().to_vec();
    assert!(soon_held_by(&nodes, &all, &token));
    set_foreign(&nodes[0], KEY, "other-0");
    set_foreign(&nodes[1], KEY, "other-1");
    assert!(guard.is_held().expect("is_held"));
    guard
        .extend(Duration::from_secs(10))
        .expect("3 of 5 extended");
    assert!(guard.unlock().expect("3 of 5 deleted"));
    assert_eq!(get(&nodes[0], KEY).as_deref(), Some(&b"other-0"[..]));
    assert!(wait_until(MARGIN, || (2..5).all(|i| get(&nodes[i], KEY).is_none())));
    del(&nodes[0], KEY);
    del(&nodes[1], KEY);

    // Replaced on 3 nodes: lost. Extend says so and deletes our token on the other two.
    let mut guard = lock.try_lock().expect("lock");
    let token = guard.value().to_vec();
    assert!(soon_held_by(&nodes, &all, &token));
    for n in &nodes[..3] {
        set_foreign(n, KEY, "other");
    }
    assert!(!guard.is_held().expect("is_held"));
    assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
    assert!(matches!(
        guard.extend(Duration::from_secs(10)),
        Err(LockError::Lost { .. })
    ));
    assert!(
        wait_until(MARGIN, || get(&nodes[3], KEY).is_none()
            && get(&nodes[4], KEY).is_none()),
        "a lost hold is cleaned up everywhere"
    );
    assert!(!guard.unlock().expect("unlock"));
    for n in &nodes[..3] {
        assert_eq!(get(n, KEY).as_deref(), Some(&b"other"[..]));
    }

    // Replaced on 3 nodes, then released: Ok(false), and only our copies are deleted.
    for n in &nodes[..3] {
        del(n, KEY);
    }
    let guard = lock.try_lock().expect("lock");
    let token = guard.value().to_vec();
    assert!(soon_held_by(&nodes, &all, &token));
    for n in &nodes[2..] {
        set_foreign(n, KEY, "other");
    }
    assert!(!guard.unlock().expect("unlock"));
    assert!(wait_until(MARGIN, || (0..2).all(|i| get(&nodes[i], KEY).is_none())));
    for n in &nodes[2..] {
        assert_eq!(get(n, KEY).as_deref(), Some(&b"other"[..]));
    }
}

#[test]
fn two_node_deployment_needs_both() {
    let mut nodes = start_nodes(2);
    let client = patient_client(&nodes);
    assert_eq!(client.quorum(), 2);
    let lock = client.lock(KEY).build().expect("lock");
    let guard = lock.try_lock().expect("both up");
    assert!(guard.unlock().expect("unlock"));
    nodes[1].kill();
    assert!(matches!(lock.try_lock(), Err(LockError::NoQuorum { .. })));
}

/// Mutual exclusion across 8 threads in two clients (two "processes", whose threads do not
/// share in-process waiter lines) while nodes are paused, resumed, killed and restarted.
/// Restarts are delayed by the lock's TTL, as the Redis page requires of nodes without
/// persistence.
#[test]
fn mutual_exclusion_across_8_threads_under_faults() {
    let mut nodes = start_nodes(5);
    let clients = [client(&nodes), client(&nodes)];
    let ttl = Duration::from_secs(2);
    let phase = AtomicUsize::new(0);
    const PHASES: usize = 7;
    let per_phase: [AtomicU64; PHASES] = Default::default();
    let inside = AtomicUsize::new(0);
    let violations = AtomicUsize::new(0);
    let overruns = AtomicUsize::new(0);
    let not_confirmed = AtomicUsize::new(0);
    let waits_given_up = AtomicUsize::new(0);
    let acquired = AtomicU64::new(0);
    // Read-modify-write without atomicity: lost updates if two holders overlap.
    let counter = AtomicU64::new(0);
    let errors = Mutex::new(Vec::<String>::new());

    thread::scope(|s| {
        for t in 0..8 {
            let client = &clients[t % 2];
            let (phase, per_phase, inside, violations, overruns) =
                (&phase, &per_phase, &inside, &violations, &overruns);
            let (not_confirmed, waits_given_up, acquired, counter, errors) = (
                &not_confirmed,
                &waits_given_up,
                &acquired,
                &counter,
                &errors,
            );
            s.spawn(move || {
                let lock = lock_with_ttl(client, ttl);
                loop {
                    let p = phase.load(Ordering::SeqCst);
                    if p >= PHASES {
                        break;
                    }
                    match lock.try_lock_for(Duration::from_secs(3)) {
                        Ok(guard) => {
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                violations.fetch_add(1, Ordering::SeqCst);
                            }
                            let c = counter.load(Ordering::SeqCst);
                            // The window in which an overlap would lose an update.
                            support::work(Duration::from_micros(300));
                            counter.store(c + 1, Ordering::SeqCst);
                            if guard.is_expired() {
                                overruns.fetch_add(1, Ordering::SeqCst);
                            }
                            inside.fetch_sub(1, Ordering::SeqCst);
                            acquired.fetch_add(1, Ordering::SeqCst);
                            per_phase[p].fetch_add(1, Ordering::SeqCst);
                            match guard.unlock() {
                                Ok(true) => {}
                                Ok(false) => {
                                    not_confirmed.fetch_add(1, Ordering::SeqCst);
                                }
                                Err(e) => errors.lock().unwrap().push(format!("unlock: {e}")),
                            }
                        }
                        Err(e) if e.is_contention() => {
                            waits_given_up.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => errors.lock().unwrap().push(format!("lock: {e}")),
                    }
                }
            });
        }

        // If a fault step panics (a node that cannot be restarted), the workers must still
        // stop, or the scope would wait for them for ever: the test fails instead of hanging.
        struct StopOnDrop<'a>(&'a AtomicUsize);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(PHASES, Ordering::SeqCst);
            }
        }
        let _stop = StopOnDrop(&phase);
        let next = |p: usize| phase.store(p, Ordering::SeqCst);
        // A phase without a time to wait out lasts until it has seen a few acquisitions.
        let step = |p: usize| {
            assert!(
                wait_until(support::EVENT_TIMEOUT, || per_phase[p]
                    .load(Ordering::SeqCst)
                    >= 5),
                "no progress in phase {p}"
            );
        };
        // 0: healthy
        step(0);
        // 1: one node paused
        nodes[0].pause();
        next(1);
        step(1);
        // 2: two nodes paused
        nodes[1].pause();
        next(2);
        step(2);
        // 3: resumed. Writes they buffered while paused may land now and leave stale tokens
        // for up to a TTL, so they count as recovered only a TTL later (before the next
        // fault), as the Redis page assumes of a node that comes back.
        nodes[0].resume();
        nodes[1].resume();
        next(3);
        // Time under test: a TTL passes.
        thread::sleep(ttl + Duration::from_millis(200));
        // 4: one node killed, then a second
        nodes[2].kill();
        next(4);
        step(4);
        nodes[3].kill();
        // 5: two killed, kept down for a TTL (delayed restart; time under test)
        next(5);
        thread::sleep(ttl + Duration::from_millis(200));
        nodes[2].restart();
        nodes[3].restart();
        // 6: all back
        next(6);
        step(6);
        next(PHASES);
    });

    let errors = errors.into_inner().unwrap();
    let per_phase: Vec<u64> = per_phase.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    eprintln!(
        "acquired {} per phase {per_phase:?}; unlock not confirmed {}; waits given up {}; \
         overruns {}",
        acquired.load(Ordering::SeqCst),
        not_confirmed.load(Ordering::SeqCst),
        waits_given_up.load(Ordering::SeqCst),
        overruns.load(Ordering::SeqCst)
    );
    assert!(errors.is_empty(), "unexpected errors: {errors:?}");
    assert_eq!(
        overruns.load(Ordering::SeqCst),
        0,
        "a hold outlived its validity"
    );
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(
        counter.load(Ordering::SeqCst),
        acquired.load(Ordering::SeqCst),
        "lost updates: holders overlapped"
    );
    for (p, n) in per_phase.iter().enumerate() {
        assert!(*n > 0, "no acquisition in phase {p}: {per_phase:?}");
    }
}

/// An immediate restart (no delay, no persistence) in the middle of a run: operations go on,
/// the restarted node takes part again (scripts reloaded by the EVAL fallback).
#[test]
fn node_restarted_mid_run_operation_continues() {
    let mut nodes = start_nodes(5);
    let client = client(&nodes);
    let lock = lock_with_ttl(&client, Duration::from_secs(2));
    let done = AtomicUsize::new(0);
    let stop = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::<String>::new());
    let after_restart = thread::scope(|s| {
        s.spawn(|| {
            while stop.load(Ordering::SeqCst) == 0 {
                match lock.try_lock_for(Duration::from_secs(3)) {
                    Ok(g) => {
                        done.fetch_add(1, Ordering::SeqCst);
                        if let Err(e) = g.unlock() {
                            errors.lock().unwrap().push(format!("unlock: {e}"));
                        }
                    }
                    Err(e) => errors.lock().unwrap().push(format!("lock: {e}")),
                }
            }
        });
        // Each restart comes in the middle of the run: after some acquisitions.
        let going = |n: usize| {
            assert!(wait_until(support::EVENT_TIMEOUT, || done
                .load(Ordering::SeqCst)
                >= n));
        };
        going(10);
        nodes[0].restart();
        going(done.load(Ordering::SeqCst) + 10);
        nodes[3].restart();
        let at_restart = done.load(Ordering::SeqCst);
        assert!(
            wait_until(Duration::from_secs(5), || done.load(Ordering::SeqCst)
                > at_restart + 20),
            "acquisitions go on after the restarts"
        );
        stop.store(1, Ordering::SeqCst);
        done.load(Ordering::SeqCst) - at_restart
    });
    let errors = errors.into_inner().unwrap();
    assert!(errors.is_empty(), "unexpected errors: {errors:?}");
    eprintln!("{after_restart} acquisitions after the last restart");

    assert!(
        eventually_all_hold(&nodes, &[0, 3], &lock),
        "the restarted nodes hold the token"
    );
    assert!(wait_until(MARGIN, || nodes
        .iter()
        .all(|n| get(n, KEY).is_none())));
}

/// The documented limit of RedLock without persistence: a node that restarts at once forgets
/// the locks it had, and if it was part of the holder's bare majority, another client can win
/// a majority while the first lease is still valid. `is_held` (and `extend`) see the loss. A
/// restart delayed by the TTL, as the Redis page recommends, prevents it.
#[test]
fn restart_without_persistence_immediate_vs_delayed() {
    let mut nodes = start_nodes(5);
    let ttl = Duration::from_secs(1);
    let a_client = patient_client(&nodes);
    let b_client = patient_client(&nodes);
    let a = lock_with_ttl(&a_client, ttl);
    let b = lock_with_ttl(&b_client, ttl);

    // A wins a bare majority {0, 1, 2}: nodes 3 and 4 are busy with another owner.
    set_foreign(&nodes[3], KEY, "other");
    set_foreign(&nodes[4], KEY, "other");
    let mut a_lease = a.try_acquire().expect("3 of 5");
    // A returns once it has a majority; its `SET NX` to nodes 3 and 4 may still be on the way.
    // Let them land (refused: the key is the other owner's) before clearing those nodes, or a
    // late one would give A node 3 or 4 after all.
    assert!(wait_until(MARGIN, || calls(&nodes[3], "set") >= 2
        && calls(&nodes[4], "set") >= 2));
    del(&nodes[3], KEY);
    del(&nodes[4], KEY);

    // Immediate restart of node 0: it forgets A's key, and B wins {0, 3, 4}.
    nodes[0].restart();
    let b_lease = b.try_acquire().expect("B wins too");
    assert!(
        !a_lease.is_expired(),
        "A's lease is still valid by its clock"
    );
    assert!(
        !a.is_held(&a_lease).expect("is_held"),
        "A can see that it lost its majority"
    );
    assert!(matches!(
        a.extend(&mut a_lease, ttl),
        Err(LockError::Lost { .. })
    ));
    assert!(b.release(&b_lease).expect("release"));

    // Delayed restart: the node stays down for a TTL, so A's hold runs out first.
    for n in &nodes[..3] {
        del(n, KEY);
    }
    set_foreign(&nodes[3], KEY, "other");
    set_foreign(&nodes[4], KEY, "other");
    let a_lease = a
        .try_lock_for(MARGIN)
        .expect("3 of 5 (node 0 may first fail one vote on a connection its restart broke)")
        .into_lease();
    del(&nodes[3], KEY);
    del(&nodes[4], KEY);
    nodes[0].kill();
    assert!(
        b.try_acquire().is_err_and(|e| e.is_contention()),
        "with node 0 down, B cannot outvote A"
    );
    // Until A's TTL has run out.
    assert!(wait_until(support::EVENT_TIMEOUT, || a_lease.is_expired()));
    nodes[0].restart();
    assert!(a_lease.is_expired());
    let b_guard = b.try_lock_for(ttl + MARGIN).expect("after A's TTL, B wins");
    assert!(b_guard.unlock().expect("unlock"));
}

/// Nodes given as ready-made clients (the application's own pools and timeouts).
#[test]
fn from_existing_clients() {
    let nodes = start_nodes(3);
    let clients: Vec<LockClient> = nodes
        .iter()
        .map(|n| {
            LockClient::builder(n.url())
                .connect_timeout(Duration::from_millis(200))
                .command_timeout(Some(Duration::from_millis(200)))
                .build()
                .expect("client")
        })
        .collect();
    let red = RedLockClient::from_clients(clients)
        .node_timeout(PATIENT)
        .workers_per_node(1)
        .build()
        .expect("RedLock client");
    assert_eq!((red.node_count(), red.quorum()), (3, 2));
    assert!(red.node(2).is_some() && red.node(3).is_none());
    let lock = red.lock(KEY).build().expect("lock");
    let guard = lock.try_lock().expect("lock");
    let token = guard.value().to_vec();
    assert!(soon_held_by(&nodes, &[0, 1, 2], &token));
    assert!(guard.unlock().expect("unlock"));
}
