//! The server-side admin queries of every lock type against real servers: `state`,
//! `is_locked`, `remaining_ttl` (the server's PTTL, whoever holds the lock) and
//! `force_unlock` (deletes whoever holds it and publishes the release), and the locks' `Debug`.

mod support;

use std::thread;
use std::time::Duration;

use redis_dlock::{ClassicOptions, LockAdmin};
use redis_dlock::{
    DistributedLock, Encoding, LockClient, LockError, LockState, RedLockClient, Strategy,
};
use support::expiry::{encode, epoch_ms};
use support::{init_logging, raw, wait_until, RedisServer};

/// A raw subscriber on `channel`, confirmed before it is returned.
fn subscriber(server: &RedisServer, channel: &str) -> redis::Connection {
    let mut conn = server.conn();
    let _: () = redis::cmd("SUBSCRIBE")
        .arg(channel)
        .query(&mut conn)
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    conn
}

/// The next message published on the subscriber's channel: its payload. Once: the
/// connection leaves pub/sub mode (unsubscribes) afterwards.
fn next_message(conn: &mut redis::Connection) -> String {
    let mut pubsub = conn.as_pubsub();
    let msg = pubsub
        .get_message()
        .expect("a published message within 3 s");
    msg.get_payload().unwrap()
}

fn ms(d: Option<Duration>) -> u128 {
    d.expect("a ttl").as_millis()
}

#[test]
fn token_and_reentrant_report_the_servers_pttl_and_force_unlock_publishes() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let holder = LockClient::open(server.url()).unwrap();
    let admin = LockClient::open(server.url()).unwrap();
    for strategy in [Strategy::Token, Strategy::Reentrant] {
        let key = format!("admin:{strategy:?}");
        let build = |c: &LockClient| {
            c.lock(key.as_str())
                .strategy(strategy)
                .ttl(Duration::from_secs(10))
                .build()
                .unwrap()
        };
        let (lock, other) = (build(&holder), build(&admin));

        assert_eq!(other.state().unwrap(), LockState::Unlocked, "{key}");
        assert!(!other.is_locked().unwrap());
        assert_eq!(other.remaining_ttl().unwrap(), None);

        let guard = lock.lock().unwrap();
        // Time under test: the TTL read below has run down by this much.
        thread::sleep(Duration::from_millis(300));
        // Another client, which holds nothing, sees the holder's lock and the server's PTTL.
        assert!(other.is_locked().unwrap(), "{key}");
        let ttl = ms(other.remaining_ttl().unwrap());
        let pttl = raw::pttl(&mut conn, &key) as u128;
        assert!((6_000..=9_750).contains(&ttl), "{key}: {ttl} ms");
        assert!(ttl.abs_diff(pttl) < 200, "{key}: {ttl} vs PTTL {pttl}");
        assert!(lock.is_locked().unwrap(), "the holder sees it too");

        // force_unlock from the other client: deleted, published, the holder finds it lost.
        let mut sub = subscriber(&server, &format!("redisson_lock__channel:{{{key}}}"));
        assert!(other.force_unlock().unwrap(), "{key}");
        assert_eq!(
            next_message(&mut sub),
            "0",
            "{key}: Redisson's unlock message"
        );
        assert!(!raw::exists(&mut conn, &key), "{key}");
        assert!(!other.is_locked().unwrap());
        assert!(
            !other.force_unlock().unwrap(),
            "{key}: nothing left to delete"
        );
        assert!(
            !guard.unlock().unwrap(),
            "{key}: the holder's release finds it lost"
        );
    }
}

#[test]
fn force_unlock_wakes_a_waiter_of_another_client_at_once() {
    init_logging();
    let server = RedisServer::start();
    let holder = LockClient::open(server.url()).unwrap();
    let waiter = LockClient::open(server.url()).unwrap();
    let lock = holder.lock("admin:wake").build().unwrap(); // watched: 30 s lease
    let guard = lock.lock().unwrap();
    let key = "admin:wake".to_owned();
    let listener = waiter.clone();
    let woken = thread::spawn(move || {
        let lock = waiter.lock(key.as_str()).build().unwrap();
        let start = std::time::Instant::now();
        let got = lock
            .try_lock_for(Duration::from_secs(20))
            .map(|g| g.unlock());
        (got.is_ok(), start.elapsed())
    });
    // Once the waiter listens, sleeping on the holder's 30 s lease.
    support::wait_listening(&listener, 1, 2);
    assert!(holder
        .lock("admin:wake")
        .build()
        .unwrap()
        .force_unlock()
        .unwrap());
    let (acquired, waited) = woken.join().unwrap();
    assert!(acquired);
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    // The holder's watchdog finds its hold gone at the next renewal (10 s); its guard sees it
    // at once when asked.
    assert!(guard.check().is_err());
}

#[test]
fn classic_state_follows_the_stored_expiry() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    for encoding in [Encoding::Decimal, Encoding::BigEndian] {
        let key = format!("admin:classic:{encoding:?}");
        let lock = client
            .lock(key.as_str())
            .strategy(Strategy::Classic(ClassicOptions::new().encoding(encoding)))
            .ttl(Duration::from_secs(5))
            .build()
            .unwrap();
        assert_eq!(lock.state().unwrap(), LockState::Unlocked);
        let guard = lock.try_lock().unwrap();
        // No Redis TTL (the legacy layout): the time left is the stored expiry's.
        assert_eq!(raw::pttl(&mut conn, &key), -1);
        let ttl = ms(lock.remaining_ttl().unwrap());
        assert!((2_500..=5_100).contains(&ttl), "{key}: {ttl} ms");
        assert!(lock.force_unlock().unwrap());
        assert!(!guard.unlock().unwrap());

        // A stale value (a dead legacy holder) is unlocked: the next acquire takes it over.
        raw::set(&mut conn, &key, &encode(encoding, epoch_ms() - 1_000));
        assert_eq!(lock.state().unwrap(), LockState::Unlocked, "{key}");
        assert!(
            lock.force_unlock().unwrap(),
            "{key}: but there was a value to delete"
        );

        // A value of a live foreign holder 3 s ahead.
        raw::set(&mut conn, &key, &encode(encoding, epoch_ms() + 3_000));
        let ttl = ms(lock.remaining_ttl().unwrap());
        assert!((1_000..=3_000).contains(&ttl), "{key}: {ttl} ms");
        raw::del(&mut conn, &key);

        // Not an expiry: reported, never guessed.
        raw::set(&mut conn, &key, b"garbage");
        assert!(
            matches!(lock.is_locked(), Err(LockError::Corrupt { .. })),
            "{key}"
        );
        raw::del(&mut conn, &key);
    }

    // With key_ttl the key's PTTL caps the time left.
    let lock = client
        .lock("admin:classic:key_ttl")
        .strategy(Strategy::Classic(
            ClassicOptions::new()
                .key_ttl(true)
                .clock_skew(Duration::from_secs(60)),
        ))
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let _guard = lock.try_lock().unwrap();
    let ttl = ms(lock.remaining_ttl().unwrap());
    assert!(
        (500..=2_000).contains(&ttl),
        "{ttl} ms: the PTTL, not expiry + 60 s skew"
    );
}

#[test]
fn a_key_of_another_type_is_wrong_type() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    raw::make_hash(&mut conn, "admin:hash");
    raw::set(&mut conn, "admin:string", b"x");
    let token = client.lock("admin:hash").build().unwrap();
    assert!(matches!(token.state(), Err(LockError::WrongType { .. })));
    let reentrant = client
        .lock("admin:string")
        .strategy(Strategy::Reentrant)
        .build()
        .unwrap();
    assert!(matches!(
        reentrant.is_locked(),
        Err(LockError::WrongType { .. })
    ));
    // A string without a TTL, written by another program: locked, no expiry.
    let foreign = client.lock("admin:string").build().unwrap();
    assert_eq!(foreign.state().unwrap(), LockState::Locked { ttl: None });
    assert_eq!(foreign.remaining_ttl().unwrap(), None);
    assert!(foreign.is_locked().unwrap());
}

#[test]
fn read_write_handles_answer_for_their_own_mode_as_redisson() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let rw = client
        .rw_lock("admin:rw")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let admin = LockClient::open(server.url())
        .unwrap()
        .rw_lock("admin:rw")
        .build()
        .unwrap();
    let (read, write) = (admin.read_lock(), admin.write_lock());
    assert!(!read.is_locked().unwrap() && !write.is_locked().unwrap());

    let guard = rw.read_lock().lock().unwrap();
    assert!(read.is_locked().unwrap());
    assert!(!write.is_locked().unwrap(), "held for reading, not writing");
    let ttl = ms(read.remaining_ttl().unwrap());
    assert!((6_000..=10_000).contains(&ttl), "{ttl} ms");
    assert_eq!(write.remaining_ttl().unwrap(), None);
    // The write side's force_unlock leaves a read-mode hash alone, as Redisson's.
    assert!(!write.force_unlock().unwrap());
    assert!(raw::exists(&mut conn, "admin:rw"));
    let mut sub = subscriber(&server, "redisson_rwlock:{admin:rw}");
    assert!(read.force_unlock().unwrap());
    assert_eq!(next_message(&mut sub), "0");
    assert!(!raw::exists(&mut conn, "admin:rw"));
    assert!(!guard.unlock().unwrap());

    let guard = rw.write_lock().lock().unwrap();
    assert!(write.is_locked().unwrap() && !read.is_locked().unwrap());
    assert!(!read.force_unlock().unwrap());
    let mut sub = subscriber(&server, "redisson_rwlock:{admin:rw}");
    assert!(write.force_unlock().unwrap());
    assert_eq!(
        next_message(&mut sub),
        "1",
        "Redisson's message after a write"
    );
    assert!(!guard.unlock().unwrap());
    assert!(!write.is_locked().unwrap());
}

#[test]
fn redlock_answers_by_majority() {
    init_logging();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let mut conns: Vec<redis::Connection> = servers.iter().map(|s| s.conn()).collect();
    let client = RedLockClient::builder(&urls)
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let lock = client
        .lock("admin:redlock")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(lock.state().unwrap(), LockState::Unlocked);
    let guard = lock.lock().unwrap();
    let ttl = ms(lock.remaining_ttl().unwrap());
    assert!((6_000..=10_000).contains(&ttl), "{ttl} ms");

    // One node paused: the two others still make a majority.
    servers[0].pause();
    assert!(lock.is_locked().unwrap());
    // Two paused: the answers cannot tell.
    servers[1].pause();
    assert!(matches!(lock.state(), Err(LockError::Connection { .. })));
    servers[0].resume();
    servers[1].resume();
    // The paused nodes' workers may still be on their timed-out jobs.
    assert!(wait_until(Duration::from_secs(5), || lock
        .is_locked()
        .unwrap_or(false)));

    assert!(lock.force_unlock().unwrap());
    for (i, conn) in conns.iter_mut().enumerate() {
        assert!(!raw::exists(conn, "admin:redlock"), "node {i}");
    }
    assert!(!lock.is_locked().unwrap());
    assert!(
        !guard.unlock().unwrap(),
        "the holder's release finds no majority"
    );

    // A foreign value on one node only is no lock; on two of three it is, with the shorter
    // PTTL of the two (the majority breaks when it runs out).
    let set_px = |conn: &mut redis::Connection, ms: u64| {
        let _: () = redis::cmd("SET")
            .arg("admin:redlock")
            .arg("other")
            .arg("PX")
            .arg(ms)
            .query(conn)
            .unwrap();
    };
    set_px(&mut conns[0], 60_000);
    assert_eq!(lock.state().unwrap(), LockState::Unlocked);
    set_px(&mut conns[2], 20_000);
    let ttl = ms(lock.remaining_ttl().unwrap());
    assert!((16_000..=20_000).contains(&ttl), "{ttl} ms");
    // Different values on two nodes: no majority holds one value.
    raw::set(&mut conns[2], "admin:redlock", b"third");
    assert!(!lock.is_locked().unwrap());
    assert!(lock.force_unlock().unwrap());
    assert!(!lock.force_unlock().unwrap());
}

#[test]
fn debug_shows_no_crate_private_types() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let mut shown = Vec::new();
    for strategy in [
        Strategy::Token,
        Strategy::Reentrant,
        Strategy::Classic(ClassicOptions::new()),
    ] {
        shown.push(format!(
            "{:?}",
            client
                .lock("admin:debug")
                .strategy(strategy)
                .build()
                .unwrap()
        ));
    }
    let rw = client.rw_lock("admin:debug").build().unwrap();
    shown.push(format!("{rw:?} {:?} {:?}", rw.read_lock(), rw.write_lock()));
    for text in &shown {
        for private in [
            "HoldOptions",
            "Scripts",
            "WaitQueues",
            "Watchdog",
            "Janitor",
        ] {
            assert!(!text.contains(private), "{text}");
        }
        assert!(text.contains("admin:debug"), "{text}");
    }
    assert!(shown[0].starts_with("TokenLock {"), "{}", shown[0]);
    assert!(shown[0].contains("watched: true"), "{}", shown[0]);
}

#[test]
fn fair_lock_answers_and_force_unlock_lets_the_queue_in() {
    init_logging();
    let server = RedisServer::start();
    let (holder, waiter) = (
        LockClient::open(server.url()).unwrap(),
        LockClient::open(server.url()).unwrap(),
    );
    let build = |c: &LockClient| {
        c.lock("admin:fair")
            .strategy(Strategy::Fair)
            .ttl(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let lock = build(&holder);
    assert_eq!(lock.state().unwrap(), LockState::Unlocked);
    let guard = lock.lock().unwrap();
    let ttl = ms(lock.remaining_ttl().unwrap());
    assert!((26_000..=30_000).contains(&ttl), "{ttl} ms");
    let listener = waiter.clone();
    let queued = thread::spawn(move || {
        let lock = build(&waiter);
        let start = std::time::Instant::now();
        let got = lock
            .try_lock_for(Duration::from_secs(20))
            .map(|g| g.unlock());
        (got.is_ok(), start.elapsed())
    });
    support::wait_listening(&listener, 1, 2);
    assert!(lock.force_unlock().unwrap());
    let (acquired, waited) = queued.join().unwrap();
    assert!(acquired);
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert!(!guard.unlock().unwrap());
    assert!(!lock.is_locked().unwrap());
}
