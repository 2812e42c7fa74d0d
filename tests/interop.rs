//! Interoperation of [`Strategy::Classic(ClassicOptions::new())`] with legacy lockers on the same keys.
//!
//! The legacy lockers are re-implemented here with raw Redis commands, exactly as the Java
//! lockers of the seed documents send them:
//!
//! - seed 000 (decimal): value `now + timeout + 1` as a decimal string, no Redis TTL.
//!   `SETNX key v` → won; else `GET key`, and if the value is non-empty and
//!   `< currentTimeMillis()`, `GETSET key v` → won if the old value equals the one read.
//!   Release: `DEL key`.
//! - seed 001 (8-byte big-endian): value `now + lockSeconds * 1000 + 1000` (1 s clock-skew
//!   allowance) as `ByteBuffer.putLong`; `SETNX` → `EXPIRE key lockSeconds`, won; else `GET`,
//!   and if `bytesToLong(old) < now`, `GETSET` → won if `Arrays.equals(old, old2)`, then
//!   `EXPIRE`. Release: `DEL key`. A client that dies between `SETNX` and `EXPIRE` leaves a key
//!   without TTL: modelled by `expire: false`.
//!
//! Classic peers of seed-001 lockers use the same 1 s clock-skew allowance.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{
    DistributedLock, Encoding, LockClient, LockError, RetryPolicy, Strategy, Takeover,
};
use support::expiry::epoch_ms;
use support::{init_logging, raw, RedisServer};

const KEY: &str = "interop:lock";
const COUNTER_KEY: &str = "interop:counter";
/// The clock-skew allowance of the seed-001 locker, also given to its Classic peers.
const SEED_001_SKEW: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// The legacy lockers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// Seed 000: decimal string, `timeout` in milliseconds, no Redis TTL.
    Seed000 { timeout_ms: i64 },
    /// Seed 001: 8-byte big-endian, `lockSeconds`, 1 s skew, `EXPIRE` after winning unless the
    /// client "crashed" before sending it (`expire: false`).
    Seed001 { lock_seconds: i64, expire: bool },
}

impl Flavour {
    fn encoding(self) -> Encoding {
        match self {
            Flavour::Seed000 { .. } => Encoding::Decimal,
            Flavour::Seed001 { .. } => Encoding::BigEndian,
        }
    }
}

/// How a legacy locker won.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Won {
    /// `SETNX` on a free key; the value written.
    Setnx(Vec<u8>),
    /// The stale-timestamp `GETSET` takeover; the value written.
    GetSet(Vec<u8>),
}

impl Won {
    fn value(&self) -> &[u8] {
        match self {
            Won::Setnx(v) | Won::GetSet(v) => v,
        }
    }
}

/// One legacy client on one key, with its own connection.
struct Legacy {
    conn: redis::Connection,
    key: String,
    flavour: Flavour,
}

impl Legacy {
    fn new(server: &RedisServer, key: &str, flavour: Flavour) -> Legacy {
        Legacy {
            conn: server.conn(),
            key: key.to_owned(),
            flavour,
        }
    }

    fn encode(&self, ms: i64) -> Vec<u8> {
        match self.flavour {
            Flavour::Seed000 { .. } => ms.to_string().into_bytes(),
            Flavour::Seed001 { .. } => ms.to_be_bytes().to_vec(),
        }
    }

    /// `Long.parseLong` / `bytesToLong`; `None` where Java would throw.
    fn parse(&self, value: &[u8]) -> Option<i64> {
        legacy_parse(self.flavour.encoding(), value)
    }

    /// One `tryLock`.
    fn try_lock(&mut self) -> Option<Won> {
        let now = epoch_ms();
        let value = match self.flavour {
            Flavour::Seed000 { timeout_ms } => self.encode(now + timeout_ms + 1),
            Flavour::Seed001 { lock_seconds, .. } => self.encode(now + lock_seconds * 1000 + 1000),
        };
        let set: i64 = redis::cmd("SETNX")
            .arg(&self.key)
            .arg(&value)
            .query(&mut self.conn)
            .unwrap();
        if set == 1 {
            self.after_win();
            return Some(Won::Setnx(value));
        }
        let current: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.key)
            .query(&mut self.conn)
            .unwrap();
        let current = current.filter(|v| !v.is_empty())?;
        // Seed 000 compares with a fresh currentTimeMillis(), seed 001 with the time taken at the
        // start of the attempt.
        let now = match self.flavour {
            Flavour::Seed000 { .. } => epoch_ms(),
            Flavour::Seed001 { .. } => now,
        };
        if self.parse(&current)? >= now {
            return None;
        }
        let old: Option<Vec<u8>> = redis::cmd("GETSET")
            .arg(&self.key)
            .arg(&value)
            .query(&mut self.conn)
            .unwrap();
        if old.as_deref() == Some(&current[..]) {
            self.after_win();
            Some(Won::GetSet(value))
        } else {
            None
        }
    }

    fn after_win(&mut self) {
        if let Flavour::Seed001 {
            lock_seconds,
            expire: true,
        } = self.flavour
        {
            let _: i64 = redis::cmd("EXPIRE")
                .arg(&self.key)
                .arg(lock_seconds)
                .query(&mut self.conn)
                .unwrap();
        }
    }

    /// The polling `tryLock(.., tryIntervalMillis, ..)`, bounded by `deadline`.
    fn lock_polling(&mut self, interval: Duration, deadline: Duration) -> Won {
        let start = Instant::now();
        loop {
            if let Some(won) = self.try_lock() {
                return won;
            }
            assert!(
                start.elapsed() < deadline,
                "legacy locker ({:?}) got no lock within {deadline:?}",
                self.flavour
            );
            // The legacy locker's own poll interval.
            support::work(interval);
        }
    }

    /// `unlock()`: a plain `DEL`.
    fn unlock(&mut self) {
        let _: i64 = redis::cmd("DEL")
            .arg(&self.key)
            .query(&mut self.conn)
            .unwrap();
    }
}

fn legacy_parse(encoding: Encoding, value: &[u8]) -> Option<i64> {
    match encoding {
        Encoding::BigEndian => value.try_into().ok().map(i64::from_be_bytes),
        _ => std::str::from_utf8(value).ok()?.parse().ok(),
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A fresh server, a raw connection to it, and a lock client for it.
fn setup() -> (RedisServer, redis::Connection, LockClient) {
    init_logging();
    let server = RedisServer::start();
    let conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    (server, conn, client)
}

/// The legacy locker of an encoding, holding for about `secs` seconds.
fn flavour(encoding: Encoding, secs: i64, expire: bool) -> Flavour {
    match encoding {
        Encoding::BigEndian => Flavour::Seed001 {
            lock_seconds: secs,
            expire,
        },
        _ => Flavour::Seed000 {
            timeout_ms: secs * 1000,
        },
    }
}

/// A Classic lock speaking the legacy peer's encoding (with seed 001's 1 s skew allowance for
/// the big-endian one).
fn classic(
    client: &LockClient,
    key: &str,
    encoding: Encoding,
    ttl: Duration,
    takeover: Takeover,
) -> Lock {
    let builder = client
        .lock(key)
        .strategy(Strategy::Classic(
            ClassicOptions::new()
                .encoding(encoding)
                .takeover(takeover)
                .clock_skew(if encoding == Encoding::BigEndian {
                    SEED_001_SKEW
                } else {
                    Duration::ZERO
                }),
        ))
        .ttl(ttl)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(60))));
    builder.build().expect("valid lock options")
}

fn assert_held<T: std::fmt::Debug>(result: Result<T, LockError>, what: &str) {
    match result {
        Err(LockError::Held { .. }) => {}
        other => panic!("{what}: expected Err(Held), got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// (a) legacy holds → Classic is refused; legacy releases → Classic acquires

fn legacy_holds_then_classic_acquires(encoding: Encoding) {
    let (server, mut conn, client) = setup();
    let lock = classic(
        &client,
        KEY,
        encoding,
        Duration::from_secs(1),
        Takeover::GetSet,
    );
    let mut legacy = Legacy::new(&server, KEY, flavour(encoding, 5, true));

    let won = legacy
        .try_lock()
        .expect("the legacy locker takes a free key");
    assert!(matches!(won, Won::Setnx(_)), "{won:?}");

    assert_held(lock.try_lock(), "Classic while the legacy locker holds");
    match lock.try_lock_for(Duration::from_millis(200)) {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(
        raw::get(&mut conn, KEY).as_deref(),
        Some(won.value()),
        "Classic must not have touched the legacy locker's value"
    );

    legacy.unlock();
    let guard = lock
        .try_lock()
        .expect("Classic takes the lock the legacy locker released");
    let stored = raw::get(&mut conn, KEY).expect("our lock is stored");
    assert_eq!(stored, guard.value());
    let expiry = legacy_parse(encoding, &stored).expect("the legacy locker can read our value");
    assert!(expiry > epoch_ms(), "our expiry {expiry} is in the future");
    // The legacy locker now sees a live lock.
    assert_eq!(legacy.try_lock(), None);
    assert_eq!(raw::get(&mut conn, KEY), Some(stored));
    assert!(guard.unlock().unwrap());
    assert_eq!(raw::get(&mut conn, KEY), None);
}

#[test]
fn decimal_legacy_holds_then_classic_acquires() {
    legacy_holds_then_classic_acquires(Encoding::Decimal);
}

#[test]
fn big_endian_legacy_holds_then_classic_acquires() {
    legacy_holds_then_classic_acquires(Encoding::BigEndian);
}

// ---------------------------------------------------------------------------------------------
// (b) Classic holds → legacy is refused

fn classic_holds_legacy_is_refused(encoding: Encoding) {
    let (server, mut conn, client) = setup();
    let lock = classic(
        &client,
        KEY,
        encoding,
        Duration::from_secs(5),
        Takeover::GetSet,
    );
    let mut legacy = Legacy::new(&server, KEY, flavour(encoding, 5, true));

    let guard = lock.try_lock().expect("Classic takes a free key");
    let expiry = legacy.parse(guard.value()).expect("legacy format");
    assert!(
        expiry > epoch_ms() + 3_000,
        "a 5 s Classic lock reads as a live lock to the legacy locker ({expiry})"
    );
    for _ in 0..3 {
        assert_eq!(legacy.try_lock(), None, "legacy locker got a held lock");
    }
    assert_eq!(raw::get(&mut conn, KEY).as_deref(), Some(guard.value()));
    assert_eq!(
        raw::command_calls(&mut conn, "getset"),
        0,
        "the legacy locker must not have tried a takeover of a live lock"
    );
    assert_eq!(
        raw::pttl(&mut conn, KEY),
        -1,
        "Classic sets no Redis TTL by default"
    );

    assert!(guard.unlock().unwrap());
    let won = legacy
        .try_lock()
        .expect("legacy locker takes the released lock");
    assert!(matches!(won, Won::Setnx(_)), "{won:?}");
    legacy.unlock();
    assert_eq!(raw::get(&mut conn, KEY), None);
}

#[test]
fn decimal_classic_holds_legacy_is_refused() {
    classic_holds_legacy_is_refused(Encoding::Decimal);
}

#[test]
fn big_endian_classic_holds_legacy_is_refused() {
    classic_holds_legacy_is_refused(Encoding::BigEndian);
}

// ---------------------------------------------------------------------------------------------
// (c) legacy abandons a lock → Classic takes it over once its expiry passed (both modes)

fn classic_takes_over_abandoned_legacy_lock(encoding: Encoding) {
    let (server, mut conn, client) = setup();
    let modes = [
        ("interop:abandoned:getset", Takeover::GetSet),
        ("interop:abandoned:cas", Takeover::CompareAndSet),
    ];

    // The legacy lockers win and die without releasing (the seed-001 one before its EXPIRE).
    let mut abandoned = Vec::new();
    for (key, _) in modes {
        let mut legacy = Legacy::new(&server, key, flavour(encoding, 1, false));
        let won = legacy.try_lock().expect("free key");
        assert_eq!(raw::pttl(&mut conn, key), -1, "no TTL on the abandoned key");
        abandoned.push(won.value().to_vec());
    }
    let locks: Vec<_> = modes
        .iter()
        .map(|&(key, takeover)| classic(&client, key, encoding, Duration::from_secs(1), takeover))
        .collect();
    // Not before the legacy expiry (at least 1 s away).
    for lock in &locks {
        assert_held(lock.try_lock(), "Classic before the legacy expiry");
    }

    let latest_expiry = abandoned
        .iter()
        .map(|v| legacy_parse(encoding, v).unwrap())
        .max()
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(60), || epoch_ms() > latest_expiry + 5));

    for (i, ((key, takeover), lock)) in modes.iter().zip(&locks).enumerate() {
        assert_eq!(
            raw::get(&mut conn, key).as_deref(),
            Some(&abandoned[i][..]),
            "the abandoned value is still there"
        );
        let getsets_before = raw::command_calls(&mut conn, "getset");
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{takeover:?}: no takeover of the stale lock: {e}"));
        let stored = raw::get(&mut conn, key).expect("our lock is stored");
        assert_eq!(
            stored,
            guard.value(),
            "{takeover:?}: the stored value is ours"
        );
        assert_ne!(stored, abandoned[i]);
        assert!(legacy_parse(encoding, &stored).unwrap() > epoch_ms());
        assert_eq!(raw::pttl(&mut conn, key), -1);
        let getsets = raw::command_calls(&mut conn, "getset") - getsets_before;
        match takeover {
            Takeover::GetSet => assert_eq!(getsets, 1, "one GETSET takeover"),
            _ => assert_eq!(getsets, 0, "compare-and-set mode sent GETSET"),
        }
        // A legacy locker sees the taken-over lock as live.
        let mut other = Legacy::new(&server, key, flavour(encoding, 1, false));
        assert_eq!(other.try_lock(), None);
        assert!(guard.unlock().unwrap(), "{takeover:?}: release");
        assert_eq!(raw::get(&mut conn, key), None);
    }
}

#[test]
fn decimal_classic_takes_over_abandoned_legacy_lock() {
    classic_takes_over_abandoned_legacy_lock(Encoding::Decimal);
}

#[test]
fn big_endian_classic_takes_over_abandoned_legacy_lock() {
    classic_takes_over_abandoned_legacy_lock(Encoding::BigEndian);
}

// ---------------------------------------------------------------------------------------------
// (d) Classic abandons → legacy takes over by GETSET; Classic's stale release deletes nothing

fn legacy_takes_over_abandoned_classic_lock(encoding: Encoding, takeover: Takeover) {
    let (server, mut conn, client) = setup();
    let lock = classic(&client, KEY, encoding, Duration::from_secs(1), takeover);
    let mut legacy = Legacy::new(&server, KEY, flavour(encoding, 5, true));

    let mut lease = lock.try_lock().expect("free key").into_lease();
    let classic_expiry = legacy_parse(encoding, lease.value()).unwrap();
    assert_eq!(
        legacy.try_lock(),
        None,
        "legacy locker before the Classic expiry"
    );

    let won = legacy.lock_polling(Duration::from_millis(5), Duration::from_secs(10));
    let won_at = epoch_ms();
    let Won::GetSet(legacy_value) = won else {
        panic!("the key never went away, yet the legacy locker won by {won:?}")
    };
    assert!(
        won_at > classic_expiry,
        "the legacy locker took over before the Classic expiry ({classic_expiry} vs {won_at})"
    );
    assert_eq!(raw::get(&mut conn, KEY), Some(legacy_value.clone()));

    // The old Classic lease is dead, and must not hurt the legacy locker's lock.
    assert!(!lock.is_held(&lease).unwrap());
    assert!(
        !lock.release(&lease).unwrap(),
        "release of the lost lease must report false"
    );
    assert_eq!(
        raw::get(&mut conn, KEY),
        Some(legacy_value.clone()),
        "Classic's stale release deleted the legacy locker's lock"
    );
    match lock.extend(&mut lease, Duration::from_secs(1)) {
        Err(LockError::Lost { .. }) => {}
        other => panic!("extend of the lost lease: expected Lost, got {other:?}"),
    }
    assert_eq!(raw::get(&mut conn, KEY), Some(legacy_value.clone()));
    assert_held(lock.try_lock(), "Classic while the legacy locker holds");
    assert_eq!(raw::get(&mut conn, KEY), Some(legacy_value));

    legacy.unlock();
    let guard = lock.try_lock().expect("free again");
    assert!(guard.unlock().unwrap());
    assert_eq!(raw::get(&mut conn, KEY), None);
}

#[test]
fn decimal_legacy_takes_over_abandoned_classic_lock() {
    legacy_takes_over_abandoned_classic_lock(Encoding::Decimal, Takeover::GetSet);
}

#[test]
fn big_endian_legacy_takes_over_abandoned_classic_lock() {
    legacy_takes_over_abandoned_classic_lock(Encoding::BigEndian, Takeover::CompareAndSet);
}

// ---------------------------------------------------------------------------------------------
// (e) mixed contention: 4 legacy threads and 4 Classic threads on one key

const LEGACY_THREADS: usize = 4;
const CLASSIC_THREADS: usize = 4;
const SECTIONS_PER_THREAD: usize = 400;

fn mixed_contention(encoding: Encoding, takeover: Takeover) {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    // Lifetimes of 5 s: nobody expires during the run, so the legacy plain DEL is safe.
    let lock = classic(&client, KEY, encoding, Duration::from_secs(5), takeover);

    let probe = AtomicUsize::new(0);
    let violations = AtomicUsize::new(0);
    let lost = AtomicUsize::new(0);
    let legacy_sections = AtomicUsize::new(0);
    let classic_sections = AtomicUsize::new(0);
    // 0 = nobody yet, 1 = legacy, 2 = Classic: counts hand-offs between the two kinds.
    let last_side = AtomicUsize::new(0);
    let side_changes = AtomicUsize::new(0);
    let barrier = Barrier::new(LEGACY_THREADS + CLASSIC_THREADS);

    let section = |side: usize, conn: &mut redis::Connection| {
        if probe.fetch_add(1, Ordering::SeqCst) != 0 {
            violations.fetch_add(1, Ordering::SeqCst);
        }
        if last_side.swap(side, Ordering::SeqCst) != side {
            side_changes.fetch_add(1, Ordering::SeqCst);
        }
        raw::bump_counter(conn, COUNTER_KEY);
        if probe.fetch_sub(1, Ordering::SeqCst) != 1 {
            violations.fetch_add(1, Ordering::SeqCst);
        }
    };
    let started = Instant::now();
    thread::scope(|s| {
        for _ in 0..LEGACY_THREADS {
            let mut legacy = Legacy::new(&server, KEY, flavour(encoding, 5, true));
            let mut conn = server.conn();
            let (section, barrier, legacy_sections) = (&section, &barrier, &legacy_sections);
            s.spawn(move || {
                barrier.wait();
                for _ in 0..SECTIONS_PER_THREAD {
                    legacy.lock_polling(Duration::from_millis(5), Duration::from_secs(60));
                    section(1, &mut conn);
                    legacy_sections.fetch_add(1, Ordering::SeqCst);
                    legacy.unlock();
                    // A pause between sections: the others get their turn.
                    support::work(Duration::from_millis(1));
                }
            });
        }
        for t in 0..CLASSIC_THREADS {
            let mut conn = server.conn();
            let (section, barrier, classic_sections, lock, lost) =
                (&section, &barrier, &classic_sections, &lock, &lost);
            s.spawn(move || {
                barrier.wait();
                for i in 0..SECTIONS_PER_THREAD {
                    let guard = lock
                        .lock()
                        .unwrap_or_else(|e| panic!("Classic thread {t}, section {i}: {e}"));
                    section(2, &mut conn);
                    classic_sections.fetch_add(1, Ordering::SeqCst);
                    if !guard.unlock().unwrap() {
                        lost.fetch_add(1, Ordering::SeqCst);
                    }
                    // A pause between sections: the others get their turn.
                    support::work(Duration::from_millis(1));
                }
            });
        }
    });
    let elapsed = started.elapsed();

    let mut conn = server.conn();
    let counter: i64 = redis::cmd("GET").arg(COUNTER_KEY).query(&mut conn).unwrap();
    let total = (LEGACY_THREADS + CLASSIC_THREADS) * SECTIONS_PER_THREAD;
    let getsets = raw::command_calls(&mut conn, "getset");
    eprintln!(
        "interop/contention/{encoding:?}/{takeover:?}: {} legacy + {} Classic = {total} critical \
         sections in {elapsed:.2?}, {} hand-offs between legacy and Classic; violations {}, \
         lost {}, GETSETs {getsets}, redis counter {counter}",
        legacy_sections.load(Ordering::SeqCst),
        classic_sections.load(Ordering::SeqCst),
        side_changes.load(Ordering::SeqCst),
        violations.load(Ordering::SeqCst),
        lost.load(Ordering::SeqCst),
    );
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    assert_eq!(lost.load(Ordering::SeqCst), 0, "a Classic hold was lost");
    assert_eq!(counter, total as i64, "lost updates: exclusion was broken");
    assert_eq!(
        getsets, 0,
        "nobody may have found an expired lock (the run's premise)"
    );
    assert_eq!(raw::get(&mut conn, KEY), None);
}

#[test]
fn decimal_legacy_and_classic_threads_exclude_each_other() {
    mixed_contention(Encoding::Decimal, Takeover::GetSet);
}

#[test]
fn big_endian_legacy_and_classic_threads_exclude_each_other() {
    mixed_contention(Encoding::BigEndian, Takeover::CompareAndSet);
}
