//! Waiters woken by pub/sub: one subscriber connection (and thread) per client, woken on a
//! published release, robust to a lost connection and a restarted Redis.
//!
//! The waiters here poll only every 5-10 s (fixed delay, no jitter), so a wait that ends well
//! before that was ended by a message (or a re-subscription), not by polling.

mod support;

use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::{
    DistributedLock, FairLock, LockClient, LockError, RetryPolicy, Strategy, TokenLock,
};
use support::{init_logging, raw, wait_event, wait_listening, wait_until, RedisServer};

/// The thread-count test takes this for writing, every other test for reading, so that no
/// other test starts or stops subscriber threads while it counts them.
static THREADS: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    THREADS.read().unwrap_or_else(|p| p.into_inner())
}

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

/// A lock with an explicit lifetime (not watched).
fn holder_lock(client: &LockClient, key: &str, ttl: Duration) -> TokenLock {
    client
        .lock(key)
        .ttl(ttl)
        .build()
        .expect("build token lock")
        .try_into()
        .expect("the strategy built")
}

/// A lock whose waits poll only every `poll` (no jitter).
fn slow_poller(client: &LockClient, key: &str, poll: Duration) -> TokenLock {
    client
        .lock(key)
        .ttl(Duration::from_secs(30))
        .retry(RetryPolicy::standard().fixed_delay(poll).jitter(false))
        .build()
        .expect("build token lock")
        .try_into()
        .expect("the strategy built")
}

fn channel(key: &str) -> String {
    format!("redisson_lock__channel:{{{key}}}")
}

/// Waits until `channel` has exactly `n` subscribers.
fn wait_numsub(conn: &mut redis::Connection, channel: &str, n: i64) {
    assert!(
        wait_until(Duration::from_secs(5), || raw::numsub(conn, channel) == n),
        "{channel} never had {n} subscribers (has {})",
        raw::numsub(conn, channel)
    );
}

/// The connections of `CLIENT LIST` in pub/sub mode: (name, channels subscribed).
fn pubsub_clients(conn: &mut redis::Connection) -> Vec<(String, i64)> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(conn)
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or("")
                    .to_owned()
            };
            let sub: i64 = field("sub").parse().unwrap_or(0);
            (sub > 0).then(|| (field("name"), sub))
        })
        .collect()
}

/// Lock attempts and releases Redis has served (`SET NX` and scripts).
fn lock_commands(conn: &mut redis::Connection) -> i64 {
    ["set", "evalsha", "eval"]
        .iter()
        .map(|c| raw::command_calls(conn, c))
        .sum()
}

/// Threads of this process named like the subscriber (the kernel keeps 15 bytes of a name).
fn subscriber_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end().starts_with("dlock-subscrib"))
        .count()
}

#[test]
fn release_wakes_a_waiter_by_pubsub_not_polling() {
    init_logging();
    let _serial = shared();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let mut conn = server.conn();
    let key = "wake:pubsub";
    let holder = holder_lock(&a, key, Duration::from_secs(30));
    let held = holder.try_lock().expect("holder");
    let waiter = slow_poller(&b, key, Duration::from_secs(5));
    let before = lock_commands(&mut conn);

    let started = Instant::now();
    let waiting = thread::spawn(move || {
        let got = waiter.try_lock_for(Duration::from_secs(10)).map(|g| {
            assert!(g.unlock().expect("unlock"));
        });
        (got, started.elapsed())
    });
    // Release only once the waiter listens (subscribed, and refused once more after that).
    wait_numsub(&mut conn, &channel(key), 1);
    wait_listening(&b, 1, 2);
    assert!(held.unlock().expect("holder unlock"));

    let (got, elapsed) = waiting.join().expect("waiter thread");
    got.expect("the waiter gets the lock");
    assert!(
        elapsed < Duration::from_secs(3),
        "woken by the release, not by the 5 s poll: {elapsed:?}"
    );
    // Waiter: SET, a re-attempt once subscribed, the attempt after the message, its unlock;
    // holder: its unlock; plus at most one EVAL per NOSCRIPT fallback. Polling every 4-32 ms
    // (the default policy) would have made dozens.
    let made = lock_commands(&mut conn) - before;
    assert!(made <= 9, "{made} lock commands");
}

/// The subscriber connection is redis-rs's, opened from the client's URL: an ACL user and
/// RESP3 apply to it as to the pool. A waiter is woken by the release over it.
#[test]
fn subscriber_uses_the_url_acl_user_and_resp3() {
    init_logging();
    let _serial = shared();
    let server =
        RedisServer::start_with(&["--user", "locker", "on", ">s3cret", "~*", "&*", "+@all"]);
    let mut conn = server.conn();
    for (n, query) in ["", "?protocol=resp3"].iter().enumerate() {
        // The previous round's clients are dropped: their subscriber goes away.
        assert!(
            wait_until(Duration::from_secs(5), || pubsub_clients(&mut conn)
                .is_empty()),
            "a subscriber connection outlived its client"
        );
        let url = format!("redis://locker:s3cret@127.0.0.1:{}/{query}", server.port());
        let (a, b) = (
            LockClient::open(&url).expect("client"),
            LockClient::open(&url).expect("client"),
        );
        let key = format!("wake:acl:{n}");
        let holder = holder_lock(&a, &key, Duration::from_secs(30));
        let held = holder.try_lock().expect("holder");
        let waiter = slow_poller(&b, &key, Duration::from_secs(10));
        let waiting = thread::spawn(move || {
            waiter
                .try_lock_for(Duration::from_secs(15))
                .map(|g| assert!(g.unlock().expect("unlock")))
        });
        wait_numsub(&mut conn, &channel(&key), 1);
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut conn)
            .expect("CLIENT LIST");
        let line = list
            .lines()
            .find(|l| l.contains("name=dlock-subscriber"))
            .unwrap_or_else(|| panic!("no subscriber connection: {list}"));
        assert!(line.contains(" user=locker "), "{line}");
        let resp = if query.is_empty() { "resp=2" } else { "resp=3" };
        assert!(line.contains(resp), "{line}");
        wait_listening(&b, 1, 2);
        let released = Instant::now();
        assert!(held.unlock().expect("holder unlock"));
        waiting
            .join()
            .expect("waiter thread")
            .expect("the waiter gets the lock");
        assert!(
            released.elapsed() < Duration::from_secs(3),
            "woken by the release ({query:?}), not by the 10 s poll: {:?}",
            released.elapsed()
        );
    }
}

#[test]
fn one_subscriber_connection_per_client() {
    init_logging();
    let _serial = shared();
    let server = RedisServer::start();
    let (holder, waiters) = (client(&server), client(&server));
    let mut conn = server.conn();
    assert!(pubsub_clients(&mut conn).is_empty());
    let keys: Vec<String> = (0..16).map(|i| format!("wake:many:{i}")).collect();
    let held: Vec<_> = keys
        .iter()
        .map(|k| holder_lock(&holder, k, Duration::from_secs(30)))
        .collect();
    let guards: Vec<_> = held.iter().map(|l| l.try_lock().expect("holder")).collect();

    let threads: Vec<_> = keys
        .iter()
        .map(|k| {
            let lock = slow_poller(&waiters, k, Duration::from_secs(5));
            thread::spawn(move || {
                lock.try_lock_for(Duration::from_secs(10)).map(|g| {
                    assert!(g.unlock().expect("unlock"));
                })
            })
        })
        .collect();
    for k in &keys {
        wait_numsub(&mut conn, &channel(k), 1);
    }
    let subscribers = pubsub_clients(&mut conn);
    assert_eq!(
        subscribers,
        vec![("dlock-subscriber".to_owned(), 16)],
        "one connection subscribes all 16 channels"
    );

    let released = Instant::now();
    for g in guards {
        assert!(g.unlock().expect("holder unlock"));
    }
    for t in threads {
        t.join()
            .expect("waiter thread")
            .expect("every waiter gets its lock");
    }
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "woken by the releases, not by the 5 s poll: {:?}",
        released.elapsed()
    );
}

#[test]
fn idle_release_channels_go_at_once_and_grant_channels_linger() {
    init_logging();
    let _serial = shared();
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server), client(&server));
    let mut conn = server.conn();
    let key = "wake:idle:token";
    let _held = holder_lock(&holder, key, Duration::from_secs(30))
        .try_lock()
        .expect("holder")
        .into_lease();
    let err = slow_poller(&waiter, key, Duration::from_secs(5))
        .try_lock_for(Duration::from_millis(200))
        .expect_err("held");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    // Nobody waits on the release channel any more: unsubscribed without a linger (within a
    // read tick of the subscriber, 200 ms, where a linger would have kept it for 1.5 s).
    let idle = Instant::now();
    wait_numsub(&mut conn, &channel(key), 0);
    assert!(
        idle.elapsed() < Duration::from_millis(1500),
        "the release channel lingered for {:?}",
        idle.elapsed()
    );

    // A Fair waiter's grant channel (one per client) stays subscribed for the client's next
    // fair wait, for the linger (1.5 s), then goes.
    let fair_key = "wake:idle:fair";
    let fair = |c: &LockClient| -> FairLock {
        c.lock(fair_key)
            .strategy(Strategy::Fair)
            .build()
            .expect("fair lock")
            .try_into()
            .expect("a fair lock")
    };
    let _fair_held = fair(&holder).try_lock().expect("fair holder").into_lease();
    let waiting = fair(&waiter);
    let err = waiting
        .try_lock_for(Duration::from_millis(200))
        .expect_err("held");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let idle = Instant::now();
    assert_eq!(
        raw::numsub(&mut conn, waiting.channel()),
        1,
        "the grant channel lingers"
    );
    wait_numsub(&mut conn, waiting.channel(), 0);
    assert!(
        idle.elapsed() >= Duration::from_secs(1),
        "the grant channel went after {:?}, before its linger",
        idle.elapsed()
    );
    assert_eq!(
        pubsub_clients(&mut conn),
        vec![],
        "nothing stays subscribed"
    );
}

#[test]
fn lost_subscriber_connection_costs_at_most_the_holder_lifetime() {
    init_logging();
    let _serial = shared();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let mut conn = server.conn();
    let key = "wake:lost";
    // Never released: the key expires after 1.5 s, and an expiry publishes nothing.
    let _lease = holder_lock(&a, key, Duration::from_millis(1500))
        .try_lock()
        .expect("holder")
        .into_lease();
    let waiter = slow_poller(&b, key, Duration::from_secs(10));

    let started = Instant::now();
    let waiting = thread::spawn(move || {
        let got = waiter.try_lock_for(Duration::from_secs(8)).map(|g| {
            assert!(g.unlock().expect("unlock"));
        });
        (got, started.elapsed())
    });
    wait_numsub(&mut conn, &channel(key), 1);
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut conn)
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    // The subscriber reconnects and re-subscribes while the waiter waits.
    wait_numsub(&mut conn, &channel(key), 1);

    let (got, elapsed) = waiting.join().expect("waiter thread");
    got.expect("the waiter gets the lock once the holder's key expires");
    assert!(
        elapsed < Duration::from_secs(5),
        "retried at the holder's expiry, not at the 8 s deadline: {elapsed:?}"
    );
}

#[test]
fn subscriber_recovers_after_a_redis_restart() {
    init_logging();
    let _serial = shared();
    let mut server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let key = "wake:restart";
    let holder = holder_lock(&a, key, Duration::from_secs(30));
    let _lease = holder.try_lock().expect("holder").into_lease();
    let waiter = Arc::new(slow_poller(&b, key, Duration::from_secs(20)));

    let waiting = {
        let waiter = Arc::clone(&waiter);
        thread::spawn(move || {
            waiter.try_lock_for(Duration::from_secs(15)).map(|g| {
                assert!(g.unlock().expect("unlock"));
            })
        })
    };
    {
        let mut conn = server.conn();
        wait_numsub(&mut conn, &channel(key), 1);
    }
    wait_listening(&b, 1, 2);
    // The restarted server is empty: the lock is free, but no release is ever published.
    let restarting = Instant::now();
    server.restart();
    // The lost subscriber connection woke the waiter: it reports the outage if its attempt
    // met the server down (as polling would have), or gets the lock once it is back. Either
    // way it does not sleep on until its 15 s deadline.
    match waiting.join().expect("waiter thread") {
        Ok(()) => {}
        Err(e) => assert!(matches!(e, LockError::Connection { .. }), "{e:?}"),
    }
    assert!(
        restarting.elapsed() < Duration::from_secs(10),
        "woken by the lost connection, not at the 15 s deadline: {:?}",
        restarting.elapsed()
    );

    // Later waits are woken by pub/sub again.
    let mut conn = server.conn();
    let held = holder.try_lock().expect("holder again");
    let refused = b.stats().refusals;
    let started = Instant::now();
    let waiting = {
        let waiter = Arc::clone(&waiter);
        thread::spawn(move || {
            waiter.try_lock_for(Duration::from_secs(10)).map(|g| {
                assert!(g.unlock().expect("unlock"));
            })
        })
    };
    wait_numsub(&mut conn, &channel(key), 1);
    // Listening again: re-subscribed after the restart, refused once more since.
    wait_listening(&b, 2, refused + 2);
    assert!(held.unlock().expect("holder unlock"));
    waiting
        .join()
        .expect("waiter thread")
        .expect("the waiter gets the lock");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the release, not by the 20 s poll: {:?}",
        started.elapsed()
    );
}

#[test]
fn dropping_the_client_stops_its_subscriber() {
    init_logging();
    let _alone = THREADS.write().unwrap_or_else(|p| p.into_inner());
    let server = RedisServer::start();
    let mut conn = server.conn();
    let holder = client(&server);
    let keys = ["wake:drop:1", "wake:drop:2"];
    let _guards: Vec<_> = keys
        .iter()
        .map(|k| {
            holder_lock(&holder, k, Duration::from_secs(30))
                .try_lock()
                .expect("holder")
                .into_lease()
        })
        .collect();
    let before = subscriber_threads();

    let c = client(&server);
    assert_eq!(
        subscriber_threads(),
        before,
        "no thread before the first wait"
    );
    for k in keys {
        let lock = slow_poller(&c, k, Duration::from_secs(5));
        let err = lock
            .try_lock_for(Duration::from_millis(300))
            .expect_err("held by the holder");
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
        assert_eq!(
            subscriber_threads(),
            before + 1,
            "one subscriber thread for all the waits of a client"
        );
    }
    assert_eq!(pubsub_clients(&mut conn).len(), 1);

    drop(c);
    assert!(
        wait_until(Duration::from_secs(5), || subscriber_threads() == before),
        "the subscriber thread exits with its client ({} left)",
        subscriber_threads() - before
    );
    assert!(
        wait_until(Duration::from_secs(5), || pubsub_clients(&mut conn)
            .is_empty()),
        "its connection is closed"
    );
}

/// A thread that releases and at once asks again through a blocking call gives a waiter of
/// another client (whose subscriber heard the release) a head start, the handoff courtesy.
/// With a courtesy of 300 ms the waiter must win; `try_lock` never waits.
#[test]
fn releasing_client_lets_a_woken_waiter_of_another_client_in_first() {
    init_logging();
    let _shared = shared();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "wake:courtesy";
    let a = LockClient::builder(server.url())
        .handoff_courtesy(Duration::from_millis(300))
        .build()
        .expect("client");
    let b = client(&server);
    let mine = holder_lock(&a, key, Duration::from_secs(30));
    let theirs = slow_poller(&b, key, Duration::from_secs(10));
    let held = mine.try_lock().expect("A takes the free lock");
    let (got_at, relocked_at) = thread::scope(|s| {
        let waiter = s.spawn(|| {
            let guard = theirs
                .try_lock_for(Duration::from_secs(20))
                .expect("B gets the lock");
            let at = Instant::now();
            assert!(guard.unlock().expect("B's unlock"));
            at
        });
        wait_numsub(&mut conn, &channel(key), 1);
        assert!(held.unlock().expect("A's unlock"));
        // A asks again at once: B's subscriber heard the release, so A waits its courtesy.
        let again = mine
            .try_lock_for(Duration::from_secs(20))
            .expect("A again, after B");
        let at = Instant::now();
        assert!(again.unlock().expect("A's second unlock"));
        (waiter.join().expect("waiter"), at)
    });
    assert!(got_at < relocked_at, "the waiting client went first");

    // Nobody else listens any more once B's subscription lapses: no courtesy then.
    assert!(wait_until(Duration::from_secs(5), || raw::numsub(
        &mut conn,
        &channel(key)
    ) == 0));
    let first = mine.try_lock().expect("free");
    assert!(first.unlock().expect("unlock"));
    let started = Instant::now();
    let second = mine.try_lock_for(Duration::from_secs(5)).expect("re-lock");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "no courtesy without listeners ({:?})",
        started.elapsed()
    );
    assert!(second.unlock().expect("unlock"));
}

/// A client whose subscriber is busy reading (it listens on another channel) queues a new
/// channel's `SUBSCRIBE` until that read ends (up to its 200 ms tick). A thread that needs
/// the channel meanwhile polls rather than waits for the confirmation: the head of a line of
/// this client's threads must not hold the line until the tick. Here W1 queues the
/// `SUBSCRIBE` right after the reader began a fresh read, takes the lock at its next poll and
/// holds it 20 ms; W2, then the head, is refused and must have the lock soon after W1's
/// release (a local release wakes it), long before the read ends.
#[test]
fn a_waiter_does_not_wait_for_a_subscribe_queued_behind_a_read() {
    init_logging();
    let _serial = shared();
    let server = RedisServer::start();
    let (c, d) = (client(&server), client(&server));
    let mut conn = server.conn();
    // C's subscriber listens on `busy` (a waiter of C, held there by D).
    let busy = "wake:behind-read:busy";
    let busy_lock = holder_lock(&d, busy, Duration::from_secs(30));
    let busy_held = busy_lock.try_lock().expect("busy");
    let busy_waiter = slow_poller(&c, busy, Duration::from_secs(5));
    let busy_wait = thread::spawn(move || busy_waiter.try_lock_for(Duration::from_secs(3)).is_ok());
    wait_numsub(&mut conn, &channel(busy), 1);
    wait_listening(&c, 1, 2);

    let key = "wake:behind-read";
    let holder = holder_lock(&d, key, Duration::from_secs(30));
    let held = holder.try_lock().expect("holder");
    let poller = |c: &LockClient| {
        c.lock(key)
            .ttl(Duration::from_secs(30))
            .retry(
                RetryPolicy::standard()
                    .fixed_delay(Duration::from_millis(10))
                    .jitter(false),
            )
            .build()
            .expect("build token lock")
    };
    let (w1, w2) = (poller(&c), poller(&c));
    // A message on `busy` ends the reader's current read: the next one starts now and lasts
    // its whole tick.
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel(busy))
        .arg("nothing")
        .query(&mut conn)
        .expect("PUBLISH");
    let first = thread::spawn(move || {
        let g = w1.try_lock_for(Duration::from_secs(3)).expect("W1");
        // Held a while (the test's premise: W2 is the head and refused meanwhile).
        support::work(Duration::from_millis(20));
        assert!(g.unlock().expect("W1 unlock"));
    });
    // W1 waits (the busy waiter was C's first), then W2 joins the line behind it.
    wait_event(&c, Event::Queued, 2);
    let second = thread::spawn(move || {
        let started = Instant::now();
        let g = w2.try_lock_for(Duration::from_secs(3)).expect("W2");
        let waited = started.elapsed();
        assert!(g.unlock().expect("W2 unlock"));
        waited
    });
    wait_event(&c, Event::Queued, 3);
    // Published while C is not yet subscribed to the key's channel: W1 takes the lock at a poll.
    assert!(held.unlock().expect("holder unlock"));
    first.join().expect("W1 thread");
    let waited = second.join().expect("W2 thread");
    assert!(
        waited < Duration::from_millis(120),
        "W2 waited {waited:?}: it waited for the SUBSCRIBE behind the subscriber's read"
    );
    drop(busy_held);
    assert!(
        busy_wait.join().expect("busy waiter"),
        "the waiter on the other channel gets that lock once it is released"
    );
}
