//! Integration tests of `Strategy::Token` against a real `redis-server`.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::Lock;
use redis_dlock::{
    DistributedLock, LockClient, LockError, RetryPolicy, Strategy, TokenLock, MAX_TTL,
};
use support::{init_logging, raw, RedisServer};

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

fn token_lock(client: &LockClient, key: &str, ttl: Duration) -> TokenLock {
    client
        .lock(key)
        .ttl(ttl)
        .build()
        .expect("build token lock")
        .try_into()
        .expect("the strategy built")
}

fn is_lower_hex_token(v: &[u8]) -> bool {
    v.len() == 32 && v.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[test]
fn acquire_then_second_try_lock_is_held() {
    init_logging();
    let server = RedisServer::start();
    let (c1, c2) = (client(&server), client(&server));
    let a = token_lock(&c1, "tok:held", Duration::from_secs(10));
    let b = token_lock(&c2, "tok:held", Duration::from_secs(10));

    let guard = a.try_lock().expect("first try_lock wins");
    assert_eq!(guard.key(), "tok:held");
    let err = b
        .try_lock()
        .expect_err("second owner must not get the lock");
    assert!(
        matches!(&err, LockError::Held { key } if key == "tok:held"),
        "{err:?}"
    );
    assert!(err.is_contention());
    assert_eq!(err.key(), Some("tok:held"));
    assert!(err.to_string().contains("tok:held"), "{err}");
    // The same lock object is not reentrant either.
    assert!(matches!(a.try_lock(), Err(LockError::Held { .. })));
    // try_acquire reports contention as Ok(None).
    assert!(b.try_acquire().is_err_and(|e| e.is_contention()));

    let mut conn = server.conn();
    assert_eq!(
        raw::get(&mut conn, "tok:held").as_deref(),
        Some(guard.value())
    );
    assert!(guard.unlock().expect("unlock"));
    // Free again: the other owner gets it now.
    let g2 = b.try_lock().expect("free after unlock");
    assert!(g2.unlock().unwrap());
}

#[test]
fn lock_times_out_with_small_retry_policy() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let holder = token_lock(&c, "tok:timeout", Duration::from_secs(30));
    let _held = holder.try_lock().expect("holder");

    // A bounded count of retries.
    let counted = c
        .lock("tok:timeout")
        .retry(RetryPolicy::standard().max_wait(None).max_retries(Some(3)))
        .build()
        .unwrap();
    match counted.lock() {
        Err(LockError::Timeout {
            key,
            attempts,
            waited,
        }) => {
            assert_eq!(key, "tok:timeout");
            assert_eq!(attempts, 4, "1 attempt + 3 retries");
            assert!(waited < Duration::from_secs(5), "{waited:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }

    // A bounded wait.
    let timed = c
        .lock("tok:timeout")
        .retry(
            RetryPolicy::standard()
                .max_wait(Some(Duration::from_millis(200)))
                .fixed_delay(Duration::from_millis(20)),
        )
        .build()
        .unwrap();
    let started = Instant::now();
    let err = timed.lock().expect_err("must time out");
    let elapsed = started.elapsed();
    match &err {
        LockError::Timeout {
            attempts, waited, ..
        } => {
            assert!(*attempts >= 2, "retried at least once: {attempts}");
            assert!(*waited >= Duration::from_millis(190), "{waited:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(err.is_contention());
    assert!(err.to_string().contains("tok:timeout"), "{err}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");

    // try_lock_for uses the caller's wait.
    let started = Instant::now();
    let err = timed
        .try_lock_for(Duration::from_millis(100))
        .expect_err("must time out");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(95));
    assert!(started.elapsed() < Duration::from_secs(5));

    // no_wait: exactly one attempt.
    let once = c
        .lock("tok:timeout")
        .retry(RetryPolicy::no_wait())
        .build()
        .unwrap();
    assert!(matches!(
        once.lock(),
        Err(LockError::Timeout { attempts: 1, .. })
    ));
}

#[test]
fn lock_waits_for_a_release() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = Arc::new(token_lock(&c, "tok:wait", Duration::from_secs(10)));
    let guard = lock.try_lock().unwrap();
    let queued = c.test_hooks().count(Event::Queued);
    let waiter = {
        let lock = Arc::clone(&lock);
        thread::spawn(move || {
            let g = lock.try_lock_for(Duration::from_secs(10)).map(|g| {
                let v = g.value().to_vec();
                assert!(g.unlock().unwrap());
                v
            });
            g
        })
    };
    support::wait_event(&c, Event::Queued, queued + 1);
    let first = guard.value().to_vec();
    assert!(guard.unlock().unwrap());
    let second = waiter.join().unwrap().expect("waiter gets the lock");
    assert_ne!(first, second, "every acquire writes a fresh token");
}

#[test]
fn release_returns_true_and_deletes_the_key() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:release", Duration::from_secs(10));
    let mut conn = server.conn();

    let guard = lock.try_lock().unwrap();
    assert!(raw::get(&mut conn, "tok:release").is_some());
    assert!(guard.unlock().expect("unlock"));
    assert_eq!(raw::get(&mut conn, "tok:release"), None);

    // Low-level API: release twice, the second finds nothing.
    let lease = lock.try_acquire().expect("free");
    assert!(lock.release(&lease).unwrap());
    assert!(!lock.release(&lease).unwrap());
    assert_eq!(raw::get(&mut conn, "tok:release"), None);
}

#[test]
fn release_after_takeover_returns_false_and_keeps_the_other_value() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:stolen", Duration::from_secs(10));
    let mut conn = server.conn();

    // Someone else overwrote the key (e.g. after our lock expired).
    let guard = lock.try_lock().unwrap();
    raw::set(&mut conn, "tok:stolen", b"someone-else");
    assert!(!guard.unlock().expect("unlock"), "not ours any more");
    assert_eq!(
        raw::get(&mut conn, "tok:stolen").as_deref(),
        Some(&b"someone-else"[..])
    );

    // Our key expired/was deleted and another TokenLock took it.
    raw::del(&mut conn, "tok:stolen");
    let guard = lock.try_lock().unwrap();
    raw::del(&mut conn, "tok:stolen");
    let other = token_lock(&c, "tok:stolen", Duration::from_secs(10));
    let other_guard = other.try_lock().expect("free again");
    assert!(!guard.unlock().unwrap());
    assert_eq!(
        raw::get(&mut conn, "tok:stolen").as_deref(),
        Some(other_guard.value()),
        "the other owner's lock must survive our release"
    );
    assert!(other_guard.is_held().unwrap());
    assert!(other_guard.unlock().unwrap());
}

#[test]
fn extend_grows_the_redis_ttl() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:extend", Duration::from_secs(2));
    let mut conn = server.conn();

    let mut guard = lock.try_lock().unwrap();
    let before = raw::pttl(&mut conn, "tok:extend");
    assert!(before > 0 && before <= 2_000, "{before}");
    let old_until = guard.valid_until();
    let value = guard.value().to_vec();

    guard.extend(Duration::from_secs(30)).expect("extend");
    let after = raw::pttl(&mut conn, "tok:extend");
    assert!(after > 2_000 && after <= 30_000, "{after}");
    assert!(guard.valid_until() > old_until);
    assert!(guard.remaining() > Duration::from_secs(2));
    assert!(guard.valid_until() <= Instant::now() + Duration::from_secs(30));
    assert_eq!(guard.value(), &value[..], "a token lock keeps its token");
    assert_eq!(raw::get(&mut conn, "tok:extend"), Some(value));

    // Shorter works too: extend sets the lifetime, it does not add.
    guard.extend(Duration::from_millis(1500)).unwrap();
    let shorter = raw::pttl(&mut conn, "tok:extend");
    assert!(shorter > 0 && shorter <= 1_500, "{shorter}");
    assert!(guard.unlock().unwrap());
}

#[test]
fn extend_after_loss_is_lost_and_touches_nothing() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:extend-lost", Duration::from_secs(10));
    let mut conn = server.conn();

    let mut guard = lock.try_lock().unwrap();
    raw::del(&mut conn, "tok:extend-lost");
    let err = guard.extend(Duration::from_secs(10)).expect_err("lost");
    assert!(
        matches!(&err, LockError::Lost { key } if key == "tok:extend-lost"),
        "{err:?}"
    );
    assert!(!err.is_contention());
    assert!(err.to_string().contains("tok:extend-lost"));
    assert_eq!(
        raw::get(&mut conn, "tok:extend-lost"),
        None,
        "not recreated"
    );

    // Another owner's value (without TTL) is neither overwritten nor given a TTL.
    raw::set(&mut conn, "tok:extend-lost", b"other");
    let err = guard.extend(Duration::from_secs(10)).expect_err("lost");
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");
    assert_eq!(
        raw::get(&mut conn, "tok:extend-lost").as_deref(),
        Some(&b"other"[..])
    );
    assert_eq!(raw::pttl(&mut conn, "tok:extend-lost"), -1);
    assert!(!guard.unlock().unwrap());
    assert_eq!(
        raw::get(&mut conn, "tok:extend-lost").as_deref(),
        Some(&b"other"[..])
    );
}

#[test]
fn is_held_and_check() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:check", Duration::from_secs(10));
    let mut conn = server.conn();

    let guard = lock.try_lock().unwrap();
    assert!(guard.is_held().unwrap());
    guard.check().expect("still ours");
    assert!(lock.is_held(guard.lease()).unwrap());
    assert!(!guard.is_expired());

    raw::set(&mut conn, "tok:check", b"intruder");
    assert!(!guard.is_held().unwrap());
    let err = guard.check().expect_err("lost");
    assert!(
        matches!(&err, LockError::Lost { key } if key == "tok:check"),
        "{err:?}"
    );
    raw::del(&mut conn, "tok:check");
    assert!(!guard.is_held().unwrap());
    assert!(!guard.unlock().unwrap());
}

#[test]
fn expired_lock_goes_to_another_owner_and_first_unlock_is_false() {
    init_logging();
    let server = RedisServer::start();
    let (c1, c2) = (client(&server), client(&server));
    let ttl = Duration::from_millis(200);
    let first = token_lock(&c1, "tok:expiry", ttl);
    let second = c2
        .lock("tok:expiry")
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut conn = server.conn();

    let before = Instant::now();
    let guard = first.try_lock().unwrap();
    assert!(guard.valid_until() >= before + ttl);
    assert!(guard.valid_until() <= Instant::now() + ttl);
    assert!(matches!(second.try_lock(), Err(LockError::Held { .. })));

    let g2 = second
        .try_lock_for(Duration::from_secs(5))
        .expect("the first lock expires in Redis");
    let took = before.elapsed();
    assert!(
        took >= Duration::from_millis(190),
        "acquired after {took:?}, before the first lock's ttl"
    );
    assert!(guard.is_expired(), "our local clock agrees it has expired");
    assert!(!guard.is_held().unwrap());
    let value2 = g2.value().to_vec();
    assert_ne!(guard.value(), &value2[..]);

    assert!(!guard.unlock().unwrap(), "the first owner lost the lock");
    assert_eq!(
        raw::get(&mut conn, "tok:expiry"),
        Some(value2),
        "the second owner's lock survives the first owner's unlock"
    );
    assert!(g2.unlock().unwrap());
}

#[test]
fn is_held_is_false_once_the_local_lifetime_passed() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:local-expiry", Duration::from_millis(300));
    let guard = lock.try_lock().unwrap();
    // Until the local lifetime has passed.
    assert!(support::wait_until(Duration::from_secs(5), || guard.is_expired()));
    assert_eq!(guard.remaining(), Duration::ZERO);
    assert!(!guard.is_held().unwrap());
    assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
}

#[test]
fn drop_releases_the_lock() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:drop", Duration::from_secs(10));
    let mut conn = server.conn();
    {
        let guard = lock.try_lock().unwrap();
        assert_eq!(
            raw::get(&mut conn, "tok:drop").as_deref(),
            Some(guard.value())
        );
    }
    assert_eq!(raw::get(&mut conn, "tok:drop"), None);

    // Dropping a lost guard deletes nothing.
    {
        let _guard = lock.try_lock().unwrap();
        raw::set(&mut conn, "tok:drop", b"other");
    }
    assert_eq!(
        raw::get(&mut conn, "tok:drop").as_deref(),
        Some(&b"other"[..])
    );
}

#[test]
fn into_lease_keeps_the_lock() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:lease", Duration::from_secs(10));
    let mut conn = server.conn();

    let guard = lock.try_lock().unwrap();
    let until = guard.valid_until();
    let mut lease = guard.into_lease();
    assert_eq!(lease.valid_until(), until);
    assert_eq!(
        raw::get(&mut conn, "tok:lease").as_deref(),
        Some(lease.value())
    );
    assert!(matches!(lock.try_lock(), Err(LockError::Held { .. })));
    assert!(lock.is_held(&lease).unwrap());
    lock.extend(&mut lease, Duration::from_secs(20)).unwrap();
    assert!(raw::pttl(&mut conn, "tok:lease") > 10_000);
    assert!(lock.release(&lease).unwrap());
    assert_eq!(raw::get(&mut conn, "tok:lease"), None);
}

#[test]
fn usable_as_box_and_arc_dyn_across_threads() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);

    let boxed: Lock = c
        .lock("tok:dyn")
        .strategy(Strategy::Token)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(boxed.key(), "tok:dyn");
    assert_eq!(boxed.ttl(), Duration::from_secs(10));
    // A Box moves into another thread.
    let boxed = thread::spawn(move || {
        let g = boxed.try_lock().unwrap();
        assert!(g.unlock().unwrap());
        boxed
    })
    .join()
    .unwrap();

    let shared: Arc<dyn DistributedLock> = Arc::from(boxed);
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicU32::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let lock = Arc::clone(&shared);
            let inside = Arc::clone(&inside);
            let entries = Arc::clone(&entries);
            thread::spawn(move || {
                for _ in 0..15 {
                    let guard = lock.try_lock_for(Duration::from_secs(20)).expect("lock");
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "two threads inside the critical section"
                    );
                    entries.fetch_add(1, Ordering::SeqCst);
                    // The window in which another thread inside would be seen.
                    support::work(Duration::from_millis(1));
                    inside.store(false, Ordering::SeqCst);
                    assert!(guard.unlock().expect("unlock"));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker panicked");
    }
    assert_eq!(entries.load(Ordering::SeqCst), 60);
    assert_eq!(raw::get(&mut server.conn(), "tok:dyn"), None);
}

#[test]
fn wire_value_is_a_32_char_lowercase_hex_token_with_pttl() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let ttl = Duration::from_millis(5_000);
    let lock = token_lock(&c, "tok:wire", ttl);
    let mut conn = server.conn();

    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let guard = lock.try_lock().unwrap();
        let stored = raw::get(&mut conn, "tok:wire").expect("key set");
        assert_eq!(stored, guard.value());
        assert!(
            is_lower_hex_token(&stored),
            "{:?}",
            String::from_utf8_lossy(&stored)
        );
        let p = raw::pttl(&mut conn, "tok:wire");
        assert!(p > 0 && p <= 5_000, "PTTL {p}");
        assert!(seen.insert(stored), "token reused");
        assert!(guard.unlock().unwrap());
    }
}

#[test]
fn defaults_and_ttl_rounding() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = c.lock("tok:defaults").build().unwrap();
    // Without an explicit ttl the lock is watched, with the watchdog's lease.
    assert_eq!(lock.ttl(), redis_dlock::LockBuilder::DEFAULT_WATCHDOG_LEASE);
    assert!(lock.is_watched());
    assert_eq!(lock.retry_policy(), &RetryPolicy::standard());
    let guard = lock.try_lock().unwrap();
    assert!(guard.lease().is_watched());
    let p = raw::pttl(&mut server.conn(), "tok:defaults");
    assert!(p > 20_000 && p <= 30_000, "{p}");
    drop(guard);

    // Sub-millisecond parts are dropped.
    let lock = c
        .lock("tok:defaults")
        .ttl(Duration::from_micros(2_999))
        .build()
        .unwrap();
    assert_eq!(lock.ttl(), Duration::from_millis(2));
}

#[test]
fn max_ttl_is_accepted_by_redis() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:max", MAX_TTL);
    let mut conn = server.conn();
    let mut guard = lock.try_lock().expect("MAX_TTL acquire");
    let p = raw::pttl(&mut conn, "tok:max");
    let max_ms = MAX_TTL.as_millis() as i64;
    assert!(p > max_ms - 60_000 && p <= max_ms, "{p}");
    guard.extend(MAX_TTL).expect("MAX_TTL extend");
    assert!(guard.unlock().unwrap());
}

#[test]
fn wrong_type_key() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    raw::make_hash(&mut conn, "tok:hash");

    let lock = c
        .lock("tok:hash")
        .retry(
            RetryPolicy::standard()
                .max_wait(Some(Duration::from_millis(100)))
                .fixed_delay(Duration::from_millis(10)),
        )
        .build()
        .unwrap();
    let err = lock.lock().expect_err("a hash can never be locked");
    assert!(
        matches!(&err, LockError::WrongType { key } if key == "tok:hash"),
        "{err:?}"
    );
    assert!(!err.is_contention());
    assert!(err.to_string().contains("tok:hash"), "{err}");
    let err = lock
        .try_lock_for(Duration::from_millis(50))
        .expect_err("wrong type");
    assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");
    // A single attempt tells too (`SET … NX PX … GET` answers WRONGTYPE on Redis 7+), and so
    // does the first attempt of a wait: lock() fails at once, not after its whole wait.
    let err = lock.try_lock().expect_err("not lockable");
    assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");
    let patient = c
        .lock("tok:hash")
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(30))))
        .build()
        .unwrap();
    let t = std::time::Instant::now();
    let err = patient.lock().expect_err("wrong type");
    assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}: the first attempt must tell",
        t.elapsed()
    );
    for make in [
        |c: &mut redis::Connection| {
            let _: () = redis::cmd("RPUSH")
                .arg("tok:list")
                .arg("x")
                .query(c)
                .unwrap();
        },
        |c: &mut redis::Connection| {
            let _: () = redis::cmd("SADD").arg("tok:set").arg("x").query(c).unwrap();
        },
    ] {
        make(&mut conn);
    }
    for key in ["tok:list", "tok:set"] {
        let l = token_lock(&c, key, Duration::from_secs(1));
        assert!(
            matches!(l.try_lock(), Err(LockError::WrongType { .. })),
            "{key}"
        );
    }

    // Release/is_held/extend on a lease whose key became a hash.
    let other = token_lock(&c, "tok:becomes-hash", Duration::from_secs(10));
    let guard = other.try_lock().unwrap();
    let mut lease = guard.into_lease();
    raw::del(&mut conn, "tok:becomes-hash");
    raw::make_hash(&mut conn, "tok:becomes-hash");
    assert!(
        matches!(other.release(&lease), Err(LockError::WrongType { .. })),
        "release"
    );
    assert!(
        matches!(other.is_held(&lease), Err(LockError::WrongType { .. })),
        "is_held"
    );
    let err = other
        .extend(&mut lease, Duration::from_secs(5))
        .expect_err("extend on a hash");
    assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");

    assert_eq!(
        raw::hash_field(&mut conn, "tok:hash").as_deref(),
        Some("value")
    );
    assert_eq!(
        raw::hash_field(&mut conn, "tok:becomes-hash").as_deref(),
        Some("value")
    );
}

/// A hold of this client's that nobody holds any more (its release was lost with a failed
/// primary, or its acquire's reply was lost) is recognised by the client's id at the start of
/// the token, and deleted, owner-checked, by the next acquire it refuses, instead of being
/// waited out: another client waits for it, and a hold that a thread of the client does hold
/// is never taken for one.
#[test]
fn a_stale_hold_of_this_client_is_cleared_by_its_next_acquire() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let key = "tok:stale-own";
    let la = token_lock(&a, key, Duration::from_secs(60));
    let lb = token_lock(&b, key, Duration::from_secs(60));
    let g = la.try_lock().unwrap();
    let ours = g.value().to_vec();
    assert!(g.unlock().unwrap());
    // What a lost release leaves: a token of client a, with its lease, that no thread holds.
    let stale = format!(
        "{}{}",
        String::from_utf8_lossy(&ours[..16]),
        "0123456789abcdef"
    );
    let mut con = server.conn();
    let put_stale = |con: &mut redis::Connection| {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(&stale)
            .arg("PX")
            .arg(60_000)
            .query(con)
            .unwrap();
    };
    put_stale(&mut con);
    // Another client's acquire does not touch it.
    assert!(matches!(lb.try_lock(), Err(LockError::Held { .. })));
    assert!(matches!(
        lb.try_lock_for(Duration::from_millis(200)),
        Err(LockError::Timeout { .. })
    ));
    assert_eq!(raw::get(&mut con, key).as_deref(), Some(stale.as_bytes()));
    // Client a's own acquire finds it stale, deletes it and takes the lock at once, by the
    // plain attempt (try_lock) and by the waiting one's script alike.
    let started = Instant::now();
    let g = la.try_lock().expect("a stale hold of a's is cleared");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_ne!(g.value(), stale.as_bytes());
    assert_eq!(a.stats().orphan_cleanups, 1);
    // A live hold of a's own is not stale: another lock object of a is refused.
    let la2 = token_lock(&a, key, Duration::from_secs(60));
    assert!(matches!(la2.try_lock(), Err(LockError::Held { .. })));
    assert!(matches!(
        la2.try_lock_for(Duration::from_millis(200)),
        Err(LockError::Timeout { .. })
    ));
    assert_eq!(raw::get(&mut con, key).as_deref(), Some(g.value()));
    assert!(g.unlock().unwrap());
    put_stale(&mut con);
    // A fenced lock attempts by the script, whose refusal names the holder.
    let fenced = a
        .lock(key)
        .ttl(Duration::from_secs(60))
        .fencing()
        .build()
        .unwrap();
    let g = fenced.try_lock().expect("cleared by the script's attempt");
    assert!(g.fence().is_some());
    assert!(g.unlock().unwrap());
    assert_eq!(a.stats().orphan_cleanups, 2);
}

// ---------------------------------------------------------------------------------------------
// Native commands (DELIFEQ, SET … IFEQ) where the server has them

/// The calls of each command a Token cycle sends, by `INFO commandstats`: acquire, extend and
/// release of a lock with an explicit ttl, then a contended acquire (a waiter's second attempt).
fn cycle_calls(server: &RedisServer, client: &LockClient) -> [i64; 5] {
    let mut conn = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    let lock = token_lock(client, "tok:native", Duration::from_secs(5));
    let mut guard = lock.try_lock().expect("acquire");
    guard.extend(Duration::from_secs(5)).expect("extend");
    assert!(guard.unlock().expect("release"));
    let held = lock.try_lock().expect("acquire again");
    let waiter = client
        .lock("tok:native")
        .ttl(Duration::from_secs(5))
        .retry(RetryPolicy::standard().fixed_delay(Duration::from_millis(20)))
        .build()
        .unwrap();
    let r = waiter.try_lock_for(Duration::from_millis(150));
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    assert!(held.unlock().expect("release"));
    ["evalsha", "eval", "delifeq", "set", "pttl"].map(|c| raw::command_calls(&mut conn, c))
}

/// Differs by server, and checks which one it runs against: on a server with `DELIFEQ` and
/// `SET … IFEQ` (Valkey 9.0+) a Token cycle (acquire, extend, release, and a waiter's
/// attempts) sends no script at all; on the others (Redis 7.0, and Valkey 8.1 for the
/// release) the release is `EVALSHA`.
#[test]
fn token_cycle_sends_no_script_where_the_server_has_native_commands() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let [evalsha, eval, delifeq, set, pttl] = cycle_calls(&server, &c);
    let kind = support::server_kind();
    eprintln!(
        "{kind:?}: EVALSHA {evalsha}, EVAL {eval}, DELIFEQ {delifeq}, SET {set}, PTTL {pttl}"
    );
    if kind.has_native_token() {
        assert_eq!((evalsha, eval), (0, 0), "no script on {kind:?}");
        assert_eq!(delifeq, 2, "two releases");
        // Two acquires, one extend, the waiter's attempts (at least its first and a second).
        assert!(set >= 5, "{set} SET");
        assert!(
            pttl >= 1,
            "the waiter's later attempts report the holder's PTTL"
        );
    } else {
        assert_eq!(delifeq, 0, "{kind:?} has no DELIFEQ");
        // Two releases, the waiter's later attempts, and the extend where SET … IFEQ is missing.
        let extend = if kind.has_set_ifeq() { 0 } else { 1 };
        assert!(
            evalsha + eval >= 3 + extend,
            "{evalsha} EVALSHA on {kind:?}"
        );
    }
}

/// A server that loses `DELIFEQ` after the client was built (here: restarted on the same port
/// with the command renamed away, as after a failover to an older server): the release that
/// meets "unknown command" is done by the script in the same call, and the client keeps to the
/// script from then on (it does not try `DELIFEQ` again). Needs a server with `DELIFEQ`.
#[test]
fn a_server_that_lost_delifeq_gets_the_script_at_once_and_from_then_on() {
    init_logging();
    let kind = support::server_kind();
    if !kind.has_native_token() {
        eprintln!("skipped: {kind:?} has no DELIFEQ to lose (Valkey 9.0 and later have it)");
        return;
    }
    let mut server = RedisServer::start();
    let c = client(&server);
    let lock = token_lock(&c, "tok:lost-delifeq", Duration::from_secs(5));
    assert!(lock.try_lock().unwrap().unlock().unwrap());
    server.restart_with(&["--rename-command", "DELIFEQ", "\"\""]);
    let mut conn = server.conn();
    for round in 0..3 {
        let guard = lock.try_lock().expect("acquire");
        assert!(
            guard.unlock().expect("released by the script"),
            "round {round}"
        );
        assert_eq!(raw::get(&mut conn, "tok:lost-delifeq"), None);
    }
    let errors = support::info_field(&mut conn, "errorstats", "errorstat_ERR").unwrap_or_default();
    assert_eq!(errors, "count=1", "DELIFEQ was tried once");
    assert_eq!(raw::command_calls(&mut conn, "evalsha"), 3);
}

/// A hold released after its lifetime passed by the local clock is reported lost
/// (`Ok(false)`), even while its key still lives in Redis (made to outlive it here, as it
/// does by the acquire's round trip): the section overran. The key is deleted all the same.
#[test]
fn a_hold_released_after_its_lifetime_is_reported_lost() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let key = "token:overran";
    let lock = token_lock(&c, key, Duration::from_millis(300));
    let guard = lock.try_lock().unwrap();
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(30_000)
        .query(&mut conn)
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(10), || guard.is_expired()));
    assert_eq!(raw::get(&mut conn, key).as_deref(), Some(guard.value()));
    assert!(!guard.unlock().unwrap(), "its section overran");
    assert!(!raw::exists(&mut conn, key), "deleted");
}
