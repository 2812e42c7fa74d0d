//! Integration tests of `Strategy::Classic(ClassicOptions::new())` (the legacy SETNX + GETSET timestamp lock) against a
//! real `redis-server`, for both encodings, with and without `key_ttl`.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{
    ClassicLock, DistributedLock, Encoding, LockClient, LockError, RetryPolicy, Strategy, Takeover,
};
use support::expiry::{decode, encode, epoch_ms};
use support::{init_logging, raw, RedisServer};

/// The script the library runs for a CompareAndSet takeover, to play a contender with it.
const COMPARE_AND_SET_LUA: &str = include_str!("../lua/compare_and_set.lua");

/// Every (encoding, key_ttl) combination, with a name for keys and messages.
const VARIANTS: [(Encoding, bool, &str); 4] = [
    (Encoding::Decimal, false, "dec"),
    (Encoding::Decimal, true, "dec-ttl"),
    (Encoding::BigEndian, false, "be"),
    (Encoding::BigEndian, true, "be-ttl"),
];

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

fn classic(
    client: &LockClient,
    key: &str,
    ttl: Duration,
    encoding: Encoding,
    key_ttl: bool,
) -> ClassicLock {
    let b = client
        .lock(key)
        .strategy(Strategy::Classic(
            ClassicOptions::new().encoding(encoding).key_ttl(key_ttl),
        ))
        .ttl(ttl);
    b.build()
        .expect("build classic lock")
        .try_into()
        .expect("the strategy built")
}

/// Checks the Redis TTL of a Classic lock key: none without `key_ttl`, at most `ttl` with it.
fn assert_key_ttl(conn: &mut redis::Connection, key: &str, key_ttl: bool, ttl: Duration) {
    let p = raw::pttl(conn, key);
    if key_ttl {
        assert!(
            p > 0 && p <= ttl.as_millis() as i64,
            "{key}: PTTL {p}, ttl {ttl:?}"
        );
    } else {
        assert_eq!(p, -1, "{key}: a legacy Classic key has no Redis TTL");
    }
}

#[test]
fn defaults() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let lock: ClassicLock = c
        .lock("cl:defaults")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(lock.ttl(), redis_dlock::ClassicLock::DEFAULT_TTL);
    assert_eq!(lock.retry_policy(), &RetryPolicy::legacy());
    let lock: ClassicLock = c
        .lock("cl:defaults")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(lock.options().encoding, Encoding::Decimal);
    assert_eq!(lock.options().takeover, Takeover::GetSet);
    assert!(!lock.options().key_ttl);
    assert_eq!(lock.options().clock_skew, Duration::ZERO);
}

#[test]
fn acquire_held_timeout_release() {
    init_logging();
    let server = RedisServer::start();
    let (c1, c2) = (client(&server), client(&server));
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:basic:{name}");
        let a = classic(&c1, &key, Duration::from_secs(10), enc, key_ttl);
        let b = c2
            .lock(&key)
            .strategy(Strategy::Classic(ClassicOptions::new().encoding(enc)))
            .retry(
                RetryPolicy::legacy()
                    .max_retries(Some(2))
                    .fixed_delay(Duration::from_millis(20)),
            )
            .build()
            .unwrap();

        let guard = a.try_lock().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));
        let err = b.try_lock().expect_err("held");
        assert!(
            matches!(&err, LockError::Held { key: k } if *k == key),
            "{name}: {err:?}"
        );
        match b.lock() {
            Err(LockError::Timeout {
                key: k, attempts, ..
            }) => {
                assert_eq!(k, key);
                assert_eq!(attempts, 3, "{name}");
            }
            other => panic!("{name}: expected Timeout, got {other:?}"),
        }
        let err = b
            .try_lock_for(Duration::from_millis(60))
            .expect_err("timeout");
        assert!(matches!(err, LockError::Timeout { .. }), "{name}: {err:?}");
        assert!(b.try_acquire().is_err_and(|e| e.is_contention()));

        assert!(guard.unlock().unwrap(), "{name}");
        assert_eq!(raw::get(&mut conn, &key), None, "{name}: key deleted");
        let g = b.try_lock().expect("free again");
        assert!(g.unlock().unwrap());
        assert_eq!(raw::get(&mut conn, &key), None);
    }
}

#[test]
fn release_after_takeover_returns_false_and_keeps_the_other_value() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:stolen:{name}");
        let lock = classic(&c, &key, Duration::from_secs(10), enc, key_ttl);
        let guard = lock.try_lock().unwrap();
        let other = encode(enc, epoch_ms() + 60_000);
        raw::set(&mut conn, &key, &other);
        assert!(!guard.unlock().unwrap(), "{name}");
        assert_eq!(raw::get(&mut conn, &key), Some(other), "{name}");
        raw::del(&mut conn, &key);

        // Lost via the low-level API too, and release twice finds nothing.
        let lease = lock.try_acquire().expect("free");
        assert!(lock.release(&lease).unwrap());
        assert!(!lock.release(&lease).unwrap());
    }
}

#[test]
fn extend_stores_a_later_expiry() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:extend:{name}");
        let ttl = Duration::from_secs(1);
        let lock = classic(&c, &key, ttl, enc, key_ttl);
        let mut guard = lock.try_lock().unwrap();
        let old = decode(enc, guard.value());
        let old_until = guard.valid_until();
        assert_key_ttl(&mut conn, &key, key_ttl, ttl);

        let new_ttl = Duration::from_secs(30);
        let before = epoch_ms();
        guard
            .extend(new_ttl)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = epoch_ms();
        let stored = raw::get(&mut conn, &key).expect("still there");
        assert_eq!(stored, guard.value(), "{name}: the lease has the new value");
        let new = decode(enc, &stored);
        assert!(new > old, "{name}: {new} <= {old}");
        assert!(
            new > before + 30_000 && new <= after + 30_000 + 1,
            "{name}: {new} not in ({}, {}]",
            before + 30_000,
            after + 30_001
        );
        if key_ttl {
            let p = raw::pttl(&mut conn, &key);
            assert!(p > 1_000 && p <= 30_000, "{name}: PTTL {p}");
        } else {
            assert_eq!(raw::pttl(&mut conn, &key), -1, "{name}");
        }
        assert!(guard.valid_until() > old_until);
        assert!(guard.valid_until() <= Instant::now() + new_ttl);
        assert!(guard.is_held().unwrap());
        assert!(guard.unlock().unwrap(), "{name}: unlock after extend");
        assert_eq!(raw::get(&mut conn, &key), None);
    }
}

#[test]
fn extend_after_loss_is_lost() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:extend-lost:{name}");
        let lock = classic(&c, &key, Duration::from_secs(10), enc, key_ttl);
        let mut guard = lock.try_lock().unwrap();
        raw::del(&mut conn, &key);
        let err = guard.extend(Duration::from_secs(10)).expect_err("lost");
        assert!(
            matches!(&err, LockError::Lost { key: k } if *k == key),
            "{name}: {err:?}"
        );
        assert_eq!(raw::get(&mut conn, &key), None, "{name}: not recreated");

        let other = encode(enc, epoch_ms() + 60_000);
        raw::set(&mut conn, &key, &other);
        let err = guard.extend(Duration::from_secs(10)).expect_err("lost");
        assert!(matches!(err, LockError::Lost { .. }), "{name}: {err:?}");
        assert_eq!(raw::get(&mut conn, &key), Some(other), "{name}");
        assert_eq!(raw::pttl(&mut conn, &key), -1, "{name}: no TTL added");
        assert!(!guard.unlock().unwrap());
    }
}

#[test]
fn is_held_and_check() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:check:{name}");
        let lock = classic(&c, &key, Duration::from_secs(10), enc, key_ttl);
        let guard = lock.try_lock().unwrap();
        assert!(guard.is_held().unwrap(), "{name}");
        guard.check().unwrap();
        raw::set(&mut conn, &key, &encode(enc, epoch_ms() + 60_000));
        assert!(!guard.is_held().unwrap(), "{name}");
        assert!(
            matches!(guard.check(), Err(LockError::Lost { key: k }) if k == key),
            "{name}"
        );
        raw::del(&mut conn, &key);
        assert!(!guard.is_held().unwrap());
        assert!(!guard.unlock().unwrap());
    }
}

#[test]
fn expired_lock_goes_to_another_owner_and_first_unlock_is_false() {
    init_logging();
    let server = RedisServer::start();
    let (c1, c2) = (client(&server), client(&server));
    let mut conn = server.conn();
    let ttl = Duration::from_millis(200);
    for (enc, key_ttl, name) in VARIANTS {
        for takeover in [Takeover::GetSet, Takeover::CompareAndSet] {
            let key = format!("cl:expiry:{name}:{takeover:?}");
            let first = classic(&c1, &key, ttl, enc, key_ttl);
            let b = c2
                .lock(&key)
                .strategy(Strategy::Classic(
                    ClassicOptions::new()
                        .encoding(enc)
                        .takeover(takeover)
                        .key_ttl(key_ttl),
                ))
                .ttl(Duration::from_secs(10))
                .retry(RetryPolicy::legacy().fixed_delay(Duration::from_millis(10)));
            let second = b.build().unwrap();

            let before = Instant::now();
            let guard = first.try_lock().unwrap();
            assert!(guard.valid_until() >= before + ttl);
            assert!(guard.valid_until() <= Instant::now() + ttl);
            assert!(matches!(second.try_lock(), Err(LockError::Held { .. })));

            let g2 = second
                .try_lock_for(Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("{name}/{takeover:?}: {e}"));
            let took = before.elapsed();
            assert!(
                took >= Duration::from_millis(150),
                "{name}/{takeover:?}: acquired after {took:?}, before the ttl ran out"
            );
            assert!(guard.is_expired());
            assert!(!guard.is_held().unwrap());
            let v2 = g2.value().to_vec();
            assert_ne!(guard.value(), &v2[..]);
            assert_key_ttl(&mut conn, &key, key_ttl, Duration::from_secs(10));

            assert!(!guard.unlock().unwrap(), "{name}/{takeover:?}");
            assert_eq!(
                raw::get(&mut conn, &key),
                Some(v2),
                "{name}/{takeover:?}: the new owner's lock survives"
            );
            assert!(g2.unlock().unwrap());
            assert_eq!(raw::get(&mut conn, &key), None);
        }
    }
}

/// A hold released after its lifetime passed is reported lost (`Ok(false)`), as a Token hold
/// is, even though nobody asked for the lock meanwhile and (without `key_ttl`) its value was
/// still at the key. The value is deleted all the same: the lock is free at once.
#[test]
fn an_expired_hold_nobody_took_unlocks_as_lost() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let ttl = Duration::from_millis(200);
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:overran:{name}");
        let lock = classic(&c, &key, ttl, enc, key_ttl);
        let lost_before = c.stats().lost_holds;
        let guard = lock.try_lock().unwrap();
        assert!(support::wait_until(Duration::from_secs(10), || guard.is_expired()));
        assert!(
            matches!(guard.check(), Err(LockError::Lost { .. })),
            "{name}"
        );
        if !key_ttl {
            assert_eq!(
                raw::get(&mut conn, &key).as_deref(),
                Some(guard.value()),
                "{name}: the stale value stays until taken over"
            );
        }
        assert!(!guard.unlock().unwrap(), "{name}: an overrun is reported");
        assert_eq!(raw::get(&mut conn, &key), None, "{name}: released");
        assert!(c.stats().lost_holds > lost_before, "{name}: counted lost");
    }
}

#[test]
fn without_key_ttl_a_stale_key_stays_until_taken_over() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let lock = classic(
        &c,
        "cl:stale-stays",
        // Long enough that a loaded machine's reply time never makes the win a late one.
        Duration::from_millis(300),
        Encoding::Decimal,
        false,
    );
    let lease = lock.try_acquire().unwrap();
    // Until the expiry timestamp written in the value has passed.
    let expiry = decode(Encoding::Decimal, lease.value());
    assert!(support::wait_until(Duration::from_secs(5), || epoch_ms() > expiry));
    // Legacy behaviour: no Redis TTL, the timestamp alone says the lock is free.
    assert_eq!(
        raw::get(&mut conn, "cl:stale-stays").as_deref(),
        Some(lease.value())
    );
    assert_eq!(raw::pttl(&mut conn, "cl:stale-stays"), -1);
    assert!(!lock.is_held(&lease).unwrap(), "past its lifetime");
    // The stale lock is taken over by a single attempt.
    let g = lock.try_lock().expect("takeover of our own stale lock");
    assert_ne!(g.value(), lease.value());
    assert!(!lock.release(&lease).unwrap());
    assert!(g.unlock().unwrap());
}

#[test]
fn drop_releases_and_into_lease_keeps() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:drop:{name}");
        let lock = classic(&c, &key, Duration::from_secs(10), enc, key_ttl);
        {
            let g = lock.try_lock().unwrap();
            assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(g.value()));
        }
        assert_eq!(raw::get(&mut conn, &key), None, "{name}: drop released");

        {
            let _g = lock.try_lock().unwrap();
            raw::set(&mut conn, &key, b"foreign");
        }
        assert_eq!(
            raw::get(&mut conn, &key).as_deref(),
            Some(&b"foreign"[..]),
            "{name}: a lost guard's drop deletes nothing"
        );
        raw::del(&mut conn, &key);

        let lease = lock.try_lock().unwrap().into_lease();
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(lease.value()));
        assert!(matches!(lock.try_lock(), Err(LockError::Held { .. })));
        assert!(lock.is_held(&lease).unwrap());
        assert!(lock.release(&lease).unwrap());
        assert_eq!(raw::get(&mut conn, &key), None);
    }
}

#[test]
fn usable_as_box_and_arc_dyn_across_threads() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    for (enc, key_ttl, name) in [VARIANTS[0], VARIANTS[3]] {
        let key = format!("cl:dyn:{name}");
        let boxed: Lock = {
            let b = c
                .lock(&key)
                .strategy(Strategy::Classic(
                    ClassicOptions::new().encoding(enc).key_ttl(key_ttl),
                ))
                .ttl(Duration::from_secs(10))
                .retry(
                    RetryPolicy::legacy()
                        .max_retries(None)
                        .max_wait(Some(Duration::from_secs(20)))
                        .fixed_delay(Duration::from_millis(2)),
                );
            b.build().unwrap()
        };
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
                let (lock, inside, entries) = (
                    Arc::clone(&shared),
                    Arc::clone(&inside),
                    Arc::clone(&entries),
                );
                thread::spawn(move || {
                    for _ in 0..10 {
                        let g = lock.lock().expect("lock");
                        assert!(!inside.swap(true, Ordering::SeqCst), "mutual exclusion");
                        entries.fetch_add(1, Ordering::SeqCst);
                        // The window in which another thread inside would be seen.
                        support::work(Duration::from_millis(1));
                        inside.store(false, Ordering::SeqCst);
                        assert!(g.unlock().expect("unlock"));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked");
        }
        assert_eq!(entries.load(Ordering::SeqCst), 40, "{name}");
        assert_eq!(raw::get(&mut server.conn(), &key), None);
    }
}

#[test]
fn wire_values() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        for skew in [Duration::ZERO, Duration::from_millis(500)] {
            let key = format!("cl:wire:{name}:{}", skew.as_millis());
            let ttl = Duration::from_millis(3_000);
            let b = c
                .lock(&key)
                .strategy(Strategy::Classic(
                    ClassicOptions::new()
                        .encoding(enc)
                        .clock_skew(skew)
                        .key_ttl(key_ttl),
                ))
                .ttl(ttl);
            let lock = b.build().unwrap();
            let before = epoch_ms();
            let guard = lock.try_lock().unwrap();
            let after = epoch_ms();
            let stored = raw::get(&mut conn, &key).expect("set");
            assert_eq!(stored, guard.value());
            match enc {
                Encoding::BigEndian => assert_eq!(stored.len(), 8, "{name}"),
                _ => assert!(
                    !stored.is_empty() && stored.iter().all(u8::is_ascii_digit),
                    "{name}: {:?}",
                    String::from_utf8_lossy(&stored)
                ),
            }
            let expiry = decode(enc, &stored);
            // `now + ttl + 1 + skew`, with `now` read during the acquire: between the clock
            // readings around it (which are within a few ms of each other unless the machine
            // stalls, so this is at least as tight as a fixed +50 ms window, and never flaky).
            let low = before + 3_000 + skew.as_millis() as i64;
            let high = after + 3_000 + skew.as_millis() as i64 + 1;
            assert!(
                (low..=high).contains(&expiry),
                "{name}/skew {skew:?}: {expiry} not in [{low}, {high}]"
            );
            assert_key_ttl(&mut conn, &key, key_ttl, ttl);
            assert!(guard.unlock().unwrap());
        }
    }
}

#[test]
fn corrupt_values_are_reported_and_left_alone() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let cases: [(Encoding, bool, &[u8], &str); 7] = [
        // Seed 001's Lua SETNX+EXPIRE locker stores "1": a live lock, not a 1970 expiry.
        (Encoding::Decimal, false, b"1", "1"),
        (
            Encoding::BigEndian,
            false,
            b"\x00\x00\x00\x00\x00\x00\x00\x01",
            "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01",
        ),
        (Encoding::Decimal, false, b"not-a-number", "not-a-number"),
        (Encoding::Decimal, true, b"not-a-number", "not-a-number"),
        (
            Encoding::BigEndian,
            false,
            b"\x01\x02\x03\x04\x05",
            "\\x01\\x02\\x03\\x04\\x05",
        ),
        (Encoding::BigEndian, true, b"12345", "12345"),
        // A decimal legacy value read by a big-endian locker: 13 bytes, not 8.
        (
            Encoding::BigEndian,
            false,
            b"1700000000123",
            "1700000000123",
        ),
    ];
    for (i, (enc, key_ttl, bad, printable)) in cases.into_iter().enumerate() {
        for takeover in [Takeover::GetSet, Takeover::CompareAndSet] {
            let key = format!("cl:corrupt:{i}:{takeover:?}");
            raw::set(&mut conn, &key, bad);
            let b = c
                .lock(&key)
                .strategy(Strategy::Classic(
                    ClassicOptions::new()
                        .encoding(enc)
                        .takeover(takeover)
                        .key_ttl(key_ttl),
                ))
                .retry(RetryPolicy::legacy().fixed_delay(Duration::from_millis(10)));
            let lock = b.build().unwrap();
            let err = lock.try_lock().expect_err("corrupt");
            match &err {
                LockError::Corrupt { key: k, value, .. } => {
                    assert_eq!(k, &key);
                    assert_eq!(value, printable);
                }
                other => panic!("case {i}: expected Corrupt, got {other:?}"),
            }
            assert!(!err.is_contention());
            let shown = err.to_string();
            assert!(shown.contains(&key) && shown.contains(printable), "{shown}");
            // A blocking acquire fails at once rather than waiting on a value it cannot read.
            let started = Instant::now();
            assert!(
                matches!(lock.lock(), Err(LockError::Corrupt { .. })),
                "case {i}"
            );
            assert!(started.elapsed() < Duration::from_millis(500));
            assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(bad), "case {i}");
            assert_eq!(raw::pttl(&mut conn, &key), -1, "case {i}: no TTL added");
        }
    }
}

#[test]
fn wrong_type_key() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:hash:{name}");
        raw::make_hash(&mut conn, &key);
        let lock = classic(&c, &key, Duration::from_secs(10), enc, key_ttl);
        let err = lock.try_lock().expect_err("hash");
        assert!(
            matches!(&err, LockError::WrongType { key: k } if *k == key),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains(&key));
        assert!(matches!(lock.lock(), Err(LockError::WrongType { .. })));

        // A held lock whose key became a hash.
        let key2 = format!("cl:becomes-hash:{name}");
        let lock2 = classic(&c, &key2, Duration::from_secs(10), enc, key_ttl);
        let mut lease = lock2.try_lock().unwrap().into_lease();
        raw::del(&mut conn, &key2);
        raw::make_hash(&mut conn, &key2);
        assert!(
            matches!(lock2.release(&lease), Err(LockError::WrongType { .. })),
            "{name}: release"
        );
        assert!(
            matches!(lock2.is_held(&lease), Err(LockError::WrongType { .. })),
            "{name}: is_held"
        );
        assert!(
            matches!(
                lock2.extend(&mut lease, Duration::from_secs(1)),
                Err(LockError::WrongType { .. })
            ),
            "{name}: extend"
        );
        assert_eq!(raw::hash_field(&mut conn, &key).as_deref(), Some("value"));
        assert_eq!(raw::hash_field(&mut conn, &key2).as_deref(), Some("value"));
    }
}

#[test]
fn takeover_sets_the_redis_ttl_with_key_ttl() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        for takeover in [Takeover::GetSet, Takeover::CompareAndSet] {
            let key = format!("cl:takeover-ttl:{name}:{takeover:?}");
            // A stale legacy value without TTL, as the legacy lockers leave it.
            raw::set(&mut conn, &key, &encode(enc, epoch_ms() - 1_000));
            let b = c
                .lock(&key)
                .strategy(Strategy::Classic(
                    ClassicOptions::new()
                        .encoding(enc)
                        .takeover(takeover)
                        .key_ttl(key_ttl),
                ))
                .ttl(Duration::from_secs(5));
            let lock = b.build().unwrap();
            let g = lock.try_lock().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(g.value()));
            assert_key_ttl(&mut conn, &key, key_ttl, Duration::from_secs(5));
            assert!(g.unlock().unwrap());
        }
    }
}

#[test]
fn getset_takeover_flaw_loser_overwrites_winner() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for enc in [Encoding::Decimal, Encoding::BigEndian] {
        let key = format!("cl:getset-flaw:{enc:?}");
        let stale = encode(enc, epoch_ms() - 1_000);
        raw::set(&mut conn, &key, &stale);

        // A takes the stale lock over with GETSET.
        let a = c
            .lock(&key)
            .strategy(Strategy::Classic(
                ClassicOptions::new()
                    .encoding(enc)
                    .takeover(Takeover::GetSet),
            ))
            .build()
            .unwrap();
        let guard = a.try_lock().expect("takeover");
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));

        // A legacy contender that had read the same stale value now sends its GETSET.
        let contender = encode(enc, epoch_ms() + 5_000);
        let old: Option<Vec<u8>> = redis::cmd("GETSET")
            .arg(&key)
            .arg(&contender)
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            old.as_deref(),
            Some(guard.value()),
            "contender sees A's value"
        );
        assert_ne!(old, Some(stale), "so the contender knows it lost");

        // But it has overwritten A's expiry: A finds a foreign value and deletes nothing.
        assert!(!guard.is_held().unwrap());
        assert!(!guard.unlock().unwrap(), "the documented GETSET flaw");
        assert_eq!(
            raw::get(&mut conn, &key),
            Some(contender),
            "the key stays locked for the loser's lifetime"
        );
    }
}

/// A Classic contender of this library that loses a GETSET takeover race puts the winner's
/// value back (a legacy loser, above, leaves its own). Our contender reaches the server through
/// a proxy that delays every command by 300 ms, so that the winner's GETSET lands between our
/// `GET` (seen by the server's command count) and our `GETSET`; the winner's value is at the
/// key afterwards, and its holder's release works. The check can fail: a contender that leaves
/// its own value (the legacy loser above) fails it, as that test shows.
#[test]
fn a_lost_getset_race_puts_the_winners_value_back() {
    init_logging();
    let server = RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port());
    let delay = Duration::from_millis(300);
    proxy.set(support::proxy::Mode::Delay {
        min: delay,
        max: delay,
    });
    let slow = LockClient::builder(proxy.url())
        .command_timeout(Some(Duration::from_secs(10)))
        .build()
        .unwrap();
    let mut conn = server.conn();
    let key = "cl:restore";
    let stale = encode(Encoding::Decimal, epoch_ms() - 1_000);
    raw::set(&mut conn, key, &stale);
    let lock = slow
        .lock(key)
        .strategy(Strategy::Classic(
            ClassicOptions::new().takeover(Takeover::GetSet),
        ))
        .ttl(Duration::from_secs(30))
        .retry(RetryPolicy::no_wait())
        .build()
        .unwrap();
    let gets = raw::command_calls(&mut conn, "get");
    let winner = encode(Encoding::Decimal, epoch_ms() + 60_000);
    thread::scope(|s| {
        let ours = s.spawn(|| lock.try_lock().map(|g| g.value().to_vec()));
        // Our GET has run on the server; our GETSET is at least two delays away.
        assert!(
            support::wait_until(Duration::from_secs(20), || {
                raw::command_calls(&mut conn, "get") > gets
            }),
            "our GET never reached the server"
        );
        let old: Option<Vec<u8>> = redis::cmd("GETSET")
            .arg(key)
            .arg(&winner)
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            old.as_deref(),
            Some(&stale[..]),
            "the winner took the stale value"
        );
        let outcome = ours.join().unwrap();
        assert!(
            matches!(outcome, Err(LockError::Held { .. })),
            "our contender lost the race: {outcome:?}"
        );
    });
    assert_eq!(slow.stats().getset_overwrites, 1, "one lost race");
    assert_eq!(
        raw::get(&mut conn, key),
        Some(winner),
        "the winner's value is back at the key"
    );
}

#[test]
fn compare_and_set_takeover_loser_writes_nothing() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:cas:{name}");
        let stale = encode(enc, epoch_ms() - 1_000);
        raw::set(&mut conn, &key, &stale);
        let b = c.lock(&key).strategy(Strategy::Classic(
            ClassicOptions::new()
                .encoding(enc)
                .takeover(Takeover::CompareAndSet)
                .key_ttl(key_ttl),
        ));
        let a = b.build().unwrap();
        let guard = a.try_lock().expect("takeover");
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));

        // A contender that had read the same stale value runs the same compare-and-set.
        let contender = encode(enc, epoch_ms() + 5_000);
        let won: i64 = redis::cmd("EVAL")
            .arg(COMPARE_AND_SET_LUA)
            .arg(1)
            .arg(&key)
            .arg(&stale)
            .arg(&contender)
            .arg(0)
            .query(&mut conn)
            .unwrap();
        assert_eq!(won, 0, "{name}: the loser must not write");
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));
        assert!(guard.is_held().unwrap());
        assert!(guard.unlock().unwrap(), "{name}: the winner's unlock works");
        assert_eq!(raw::get(&mut conn, &key), None);
    }
}

/// Outcome of one 8-thread takeover race: the winner's value and its unlock result.
struct RaceRound {
    winner_value: Vec<u8>,
    winner_unlock: bool,
}

/// Races `clients.len()` ClassicLocks (one client each, released together by a Barrier) on a
/// stale key. Asserts exactly one winner; the winner unlocks after every contender has tried.
fn race_round(
    server: &RedisServer,
    clients: &[LockClient],
    key: &str,
    takeover: Takeover,
    vary_ttl: bool,
) -> RaceRound {
    let mut conn = server.conn();
    raw::set(
        &mut conn,
        key,
        &encode(Encoding::Decimal, epoch_ms() - 5_000),
    );
    let start = Barrier::new(clients.len());
    let tried = Barrier::new(clients.len());
    let results: Vec<Option<(Vec<u8>, bool)>> = thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (start, tried) = (&start, &tried);
                s.spawn(move || {
                    let ttl = if vary_ttl {
                        Duration::from_millis(10_000 + 7 * i as u64)
                    } else {
                        Duration::from_secs(10)
                    };
                    let lock = c
                        .lock(key)
                        .strategy(Strategy::Classic(ClassicOptions::new().takeover(takeover)))
                        .ttl(ttl)
                        .build()
                        .unwrap();
                    start.wait();
                    let outcome = lock.try_lock();
                    tried.wait();
                    match outcome {
                        Ok(g) => {
                            let v = g.value().to_vec();
                            Some((v, g.unlock().expect("winner unlock")))
                        }
                        Err(LockError::Held { .. }) => None,
                        Err(e) => panic!("contender {i}: {e}"),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(
        winners.len(),
        1,
        "{takeover:?}: exactly one contender may win, got {}",
        winners.len()
    );
    let (winner_value, winner_unlock) = winners.into_iter().next().unwrap();
    RaceRound {
        winner_value,
        winner_unlock,
    }
}

fn race_clients(server: &RedisServer) -> Vec<LockClient> {
    (0..8).map(|_| client(server)).collect()
}

#[test]
fn compare_and_set_race_of_8_threads_has_one_winner_whose_unlock_works() {
    init_logging();
    let server = RedisServer::start();
    let clients = race_clients(&server);
    let mut conn = server.conn();
    for round in 0..25 {
        for vary_ttl in [false, true] {
            let r = race_round(
                &server,
                &clients,
                "cl:race-cas",
                Takeover::CompareAndSet,
                vary_ttl,
            );
            assert!(
                r.winner_unlock,
                "round {round}: a CompareAndSet loser overwrote the winner"
            );
            assert_eq!(raw::get(&mut conn, "cl:race-cas"), None, "round {round}");
        }
    }
}

#[test]
fn getset_race_of_8_threads_has_one_winner() {
    init_logging();
    let server = RedisServer::start();
    let clients = race_clients(&server);
    let mut conn = server.conn();
    const ROUNDS: usize = 25;
    for vary_ttl in [false, true] {
        let mut false_unlocks = 0;
        for round in 0..ROUNDS {
            let r = race_round(
                &server,
                &clients,
                "cl:race-getset",
                Takeover::GetSet,
                vary_ttl,
            );
            let left = raw::get(&mut conn, "cl:race-getset");
            if r.winner_unlock {
                assert_eq!(left, None, "round {round}");
            } else {
                false_unlocks += 1;
                // The flaw: a loser's GETSET replaced the winner's value, and the put-back
                // did not restore it (several losers overwrote one after the other).
                let left = left.expect("the loser's value stays");
                assert_ne!(left, r.winner_value);
                assert!(decode(Encoding::Decimal, &left) > epoch_ms());
                raw::del(&mut conn, "cl:race-getset");
            }
        }
        eprintln!(
            "GetSet 8-thread race ({}): the winner's unlock returned false in {false_unlocks} \
             of {ROUNDS} rounds",
            if vary_ttl {
                "ttl differs per contender"
            } else {
                "same ttl for all"
            }
        );
    }
}

#[test]
fn max_ttl_and_skew_are_accepted() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let max_ms = redis_dlock::MAX_TTL.as_millis() as i64;
    for (enc, key_ttl, name) in VARIANTS {
        let key = format!("cl:max:{name}");
        let b = c
            .lock(&key)
            .strategy(Strategy::Classic(
                ClassicOptions::new()
                    .clock_skew(redis_dlock::MAX_TTL)
                    .encoding(enc)
                    .key_ttl(key_ttl),
            ))
            .ttl(redis_dlock::MAX_TTL);
        let lock = b.build().unwrap();
        let before = epoch_ms();
        let mut guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{name}: MAX_TTL acquire: {e}"));
        let expiry = decode(enc, guard.value());
        assert!(expiry > before + 2 * max_ms, "{name}: {expiry}");
        if key_ttl {
            let p = raw::pttl(&mut conn, &key);
            assert!(p > max_ms - 60_000 && p <= max_ms, "{name}: PTTL {p}");
        } else {
            assert_eq!(raw::pttl(&mut conn, &key), -1);
        }
        guard
            .extend(redis_dlock::MAX_TTL)
            .unwrap_or_else(|e| panic!("{name}: MAX_TTL extend: {e}"));
        assert!(guard.unlock().unwrap(), "{name}");
    }
}
