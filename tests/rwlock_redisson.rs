//! The read-write lock beside Java services on Redisson's `RReadWriteLock`, against a real
//! `redis-server`: the foreign client is Redisson's exact Lua, sent by raw `EVAL` with the
//! KEYS and ARGV Redisson passes ([`redisson`] below).
//!
//! - readers and writers exclude each other both ways, and readers share both ways;
//! - re-entry and the downgrade (write → read) on both sides, seen by the other;
//! - crash recovery both ways: a holder that stops renewing loses its hold after its lease;
//! - wake-ups both ways on Redisson's channel `redisson_rwlock:{key}` and messages;
//! - Redisson's read-unlock and write-unlock (and renewals) run on every state this library
//!   leaves at the key: each finishes at once, the server still answers, and our holds stay
//!   (Redisson's read-unlock walks every numeric hash field; a numeric intent field in the hash
//!   once made it loop ~1.8e12 times and froze the server);
//! - a release sent twice with the same unlock latch gives back one hold, also end to end: a
//!   proxy drops the reply of a release that ran, the client resends it on a new connection,
//!   and the latch answers (without it, the resend gave back a second hold).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::{DistributedLock, Lease, LockClient, LockError, ReadWriteLock, RetryPolicy};
use support::{init_logging, raw, wait_until, RedisServer};

/// What a Java service on `redisson.getReadWriteLock(name)` sends, verbatim.
///
/// Copied from redisson/redisson at commit 0482efe14713f6ef660cccbd66118154d72f1425 (a 3.x
/// release line with the unlock latch): `redisson/src/main/java/org/redisson/`
/// `RedissonReadLock.java` (tryLockInnerAsync, unlockInnerAsync, renewExpirationAsync) and
/// `RedissonWriteLock.java` (tryLockInnerAsync, unlockInnerAsync); the write lock's renewal
/// is `RedissonBaseLock.renewExpirationAsync` (stored at commit
/// 00d758eb9310839415c23bf3a26fd72496387163), falling back to the read lock's. Names:
/// `RedissonObject.prefixName` / `suffixName` (commit 017b8306b450d6970ef7a5244e89c1c14bbab571);
/// messages: `LockPubSub.UNLOCK_MESSAGE` = 0, `READ_UNLOCK_MESSAGE` = 1.
/// Each Java string literal of the script is one fragment below, in order.
mod redisson {
    /// `RedissonReadLock.tryLockInnerAsync`. KEYS: name, `{name}:<lockName>:rwlock_timeout`;
    /// ARGV: leaseMs, lockName, lockName + ":write". nil when acquired, else the PTTL.
    pub const READ_LOCK: &str = concat!(
        "local mode = redis.call('hget', KEYS[1], 'mode'); ",
        "if (mode == false) then ",
        "redis.call('hset', KEYS[1], 'mode', 'read'); ",
        "redis.call('hset', KEYS[1], ARGV[2], 1); ",
        "redis.call('set', KEYS[2] .. ':1', 1); ",
        "redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]); ",
        "redis.call('pexpire', KEYS[1], ARGV[1]); ",
        "return nil; ",
        "end; ",
        "if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then ",
        "local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1); ",
        "local key = KEYS[2] .. ':' .. ind;",
        "redis.call('set', key, 1); ",
        "redis.call('pexpire', key, ARGV[1]); ",
        "local remainTime = redis.call('pttl', KEYS[1]); ",
        "redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1])); ",
        "return nil; ",
        "end;",
        "return redis.call('pttl', KEYS[1]);",
    );

    /// `RedissonReadLock.unlockInnerAsync`. KEYS: name, `redisson_rwlock:{name}`,
    /// timeoutPrefix, keyPrefix `{name}`, `redisson_unlock_latch:{name}:<requestId>`; ARGV:
    /// UNLOCK_MESSAGE (0), lockName, the publish command, the latch's lifetime (ms).
    pub const READ_UNLOCK: &str = concat!(
        "local val = redis.call('get', KEYS[5]); ",
        "if val ~= false then ",
        "return tonumber(val);",
        "end; ",
        "local mode = redis.call('hget', KEYS[1], 'mode'); ",
        "if (mode == false) then ",
        "redis.call(ARGV[3], KEYS[2], ARGV[1]); ",
        "redis.call('set', KEYS[5], 1, 'px', ARGV[4]); ",
        "return 1; ",
        "end; ",
        "local lockExists = redis.call('hexists', KEYS[1], ARGV[2]); ",
        "if (lockExists == 0) then ",
        "return nil;",
        "end; ",
        "local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1); ",
        "if (counter == 0) then ",
        "redis.call('hdel', KEYS[1], ARGV[2]); ",
        "end;",
        "redis.call('del', KEYS[3] .. ':' .. (counter+1)); ",
        "if (redis.call('hlen', KEYS[1]) > 1) then ",
        "local maxRemainTime = -3; ",
        "local keys = redis.call('hkeys', KEYS[1]); ",
        "for n, key in ipairs(keys) do ",
        "counter = tonumber(redis.call('hget', KEYS[1], key)); ",
        "if type(counter) == 'number' then ",
        "for i=counter, 1, -1 do ",
        "local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i); ",
        "maxRemainTime = math.max(remainTime, maxRemainTime);",
        "end; ",
        "end; ",
        "end; ",
        "if maxRemainTime > 0 then ",
        "redis.call('pexpire', KEYS[1], maxRemainTime); ",
        "redis.call('set', KEYS[5], 0, 'px', ARGV[4]); ",
        "return 0; ",
        "end;",
        "if mode == 'write' then ",
        "redis.call('set', KEYS[5], 0, 'px', ARGV[4]); ",
        "return 0;",
        "end; ",
        "end; ",
        "redis.call('del', KEYS[1]); ",
        "redis.call(ARGV[3], KEYS[2], ARGV[1]); ",
        "redis.call('set', KEYS[5], 1, 'px', ARGV[4]); ",
        "return 1; ",
    );

    /// `RedissonReadLock.renewExpirationAsync`. KEYS: name, keyPrefix `{name}`; ARGV:
    /// internalLockLeaseTime, lockName. 1 renewed, 0 not held.
    pub const READ_RENEW: &str = concat!(
        "local counter = redis.call('hget', KEYS[1], ARGV[2]); ",
        "if (counter ~= false) then ",
        "redis.call('pexpire', KEYS[1], ARGV[1]); ",
        "if (redis.call('hlen', KEYS[1]) > 1) then ",
        "local keys = redis.call('hkeys', KEYS[1]); ",
        "for n, key in ipairs(keys) do ",
        "counter = tonumber(redis.call('hget', KEYS[1], key)); ",
        "if type(counter) == 'number' then ",
        "for i=counter, 1, -1 do ",
        "redis.call('pexpire', KEYS[2] .. ':' .. key .. ':rwlock_timeout:' .. i, ARGV[1]); ",
        "end; ",
        "end; ",
        "end; ",
        "end; ",
        "return 1; ",
        "end; ",
        "return 0;",
    );

    /// `RedissonWriteLock.tryLockInnerAsync`. KEYS: name; ARGV: leaseMs, lockName + ":write".
    pub const WRITE_LOCK: &str = concat!(
        "local mode = redis.call('hget', KEYS[1], 'mode'); ",
        "if (mode == false) then ",
        "redis.call('hset', KEYS[1], 'mode', 'write'); ",
        "redis.call('hset', KEYS[1], ARGV[2], 1); ",
        "redis.call('pexpire', KEYS[1], ARGV[1]); ",
        "return nil; ",
        "end; ",
        "if (mode == 'write') then ",
        "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then ",
        "redis.call('hincrby', KEYS[1], ARGV[2], 1); ",
        "local currentExpire = redis.call('pttl', KEYS[1]); ",
        "redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]); ",
        "return nil; ",
        "end; ",
        "end;",
        "return redis.call('pttl', KEYS[1]);",
    );

    /// `RedissonWriteLock.unlockInnerAsync`. KEYS: name, `redisson_rwlock:{name}`, the latch;
    /// ARGV: READ_UNLOCK_MESSAGE (1), internalLockLeaseTime, lockName + ":write", the publish
    /// command, the latch's lifetime (ms).
    pub const WRITE_UNLOCK: &str = concat!(
        "local val = redis.call('get', KEYS[3]); ",
        "if val ~= false then ",
        "return tonumber(val);",
        "end; ",
        "local mode = redis.call('hget', KEYS[1], 'mode'); ",
        "if (mode == false) then ",
        "redis.call(ARGV[4], KEYS[2], ARGV[1]); ",
        "redis.call('set', KEYS[3], 1, 'px', ARGV[5]); ",
        "return 1; ",
        "end;",
        "if (mode == 'write') then ",
        "local lockExists = redis.call('hexists', KEYS[1], ARGV[3]); ",
        "if (lockExists == 0) then ",
        "return nil;",
        "else ",
        "local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); ",
        "if (counter > 0) then ",
        "redis.call('pexpire', KEYS[1], ARGV[2]); ",
        "redis.call('set', KEYS[3], 0, 'px', ARGV[5]); ",
        "return 0; ",
        "else ",
        "redis.call('hdel', KEYS[1], ARGV[3]); ",
        "if (redis.call('hlen', KEYS[1]) == 1) then ",
        "redis.call('del', KEYS[1]); ",
        "redis.call(ARGV[4], KEYS[2], ARGV[1]); ",
        "else ",
        "redis.call('hset', KEYS[1], 'mode', 'read'); ",
        "end; ",
        "redis.call('set', KEYS[3], 1, 'px', ARGV[5]); ",
        "return 1; ",
        "end; ",
        "end; ",
        "end; ",
        "return nil;",
    );

    /// `RedissonBaseLock.renewExpirationAsync` (the write lock's first renewal). KEYS: name;
    /// ARGV: internalLockLeaseTime, lockName + ":write".
    pub const BASE_RENEW: &str = concat!(
        "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then ",
        "redis.call('pexpire', KEYS[1], ARGV[1]); ",
        "return 1; ",
        "end; ",
        "return 0;",
    );

    /// `RedissonObject.prefixName`.
    pub fn prefix_name(prefix: &str, name: &str) -> String {
        if name.contains('{') {
            format!("{prefix}:{name}")
        } else {
            format!("{prefix}:{{{name}}}")
        }
    }

    /// `RedissonObject.suffixName`.
    pub fn suffix_name(name: &str, suffix: &str) -> String {
        if name.contains('{') {
            format!("{name}:{suffix}")
        } else {
            format!("{{{name}}}:{suffix}")
        }
    }

    /// A Java thread on `getReadWriteLock(name)`: lockName `<client uuid>:<thread id>`.
    pub struct Java {
        pub lock_name: String,
    }

    /// The latch lifetime Redisson computes from its defaults ((3000 + 1500) × 3 ms).
    const LATCH_MS: u64 = 13_500;

    impl Java {
        pub fn new() -> Java {
            Java {
                lock_name: format!(
                    "{}:{}",
                    super::random_uuid(),
                    1 + u32::from(rand::random::<u16>())
                ),
            }
        }

        fn write_name(&self) -> String {
            format!("{}:write", self.lock_name)
        }

        fn latch(name: &str) -> String {
            format!(
                "{}:{}",
                prefix_name("redisson_unlock_latch", name),
                super::random_uuid()
            )
        }

        /// `readLock().tryLock()` once: None when acquired, else the PTTL.
        pub fn read_lock(
            &self,
            c: &mut redis::Connection,
            name: &str,
            lease_ms: u64,
        ) -> Option<i64> {
            let timeout_prefix = suffix_name(name, &self.lock_name) + ":rwlock_timeout";
            redis::cmd("EVAL")
                .arg(READ_LOCK)
                .arg(2)
                .arg(name)
                .arg(timeout_prefix)
                .arg(lease_ms)
                .arg(&self.lock_name)
                .arg(self.write_name())
                .query(c)
                .expect("Redisson read lock script")
        }

        /// `readLock().unlock()`: Some(1) freed, Some(0) others still hold, None not held.
        pub fn read_unlock(&self, c: &mut redis::Connection, name: &str) -> Option<i64> {
            let timeout_prefix = suffix_name(name, &self.lock_name) + ":rwlock_timeout";
            // getKeyPrefix: timeoutPrefix.split(":" + lockName)[0]
            let key_prefix = timeout_prefix
                .split(&format!(":{}", self.lock_name))
                .next()
                .unwrap()
                .to_owned();
            redis::cmd("EVAL")
                .arg(READ_UNLOCK)
                .arg(5)
                .arg(name)
                .arg(prefix_name("redisson_rwlock", name))
                .arg(timeout_prefix)
                .arg(key_prefix)
                .arg(Self::latch(name))
                .arg(0)
                .arg(&self.lock_name)
                .arg("publish")
                .arg(LATCH_MS)
                .query(c)
                .expect("Redisson read unlock script")
        }

        /// The read lock's watchdog renewal: 1 renewed, 0 not held.
        pub fn read_renew(&self, c: &mut redis::Connection, name: &str, lease_ms: u64) -> i64 {
            let key_prefix = if name.contains('{') {
                name.to_owned()
            } else {
                format!("{{{name}}}")
            };
            redis::cmd("EVAL")
                .arg(READ_RENEW)
                .arg(2)
                .arg(name)
                .arg(key_prefix)
                .arg(lease_ms)
                .arg(&self.lock_name)
                .query(c)
                .expect("Redisson read renew script")
        }

        /// `writeLock().tryLock()` once: None when acquired, else the PTTL.
        pub fn write_lock(
            &self,
            c: &mut redis::Connection,
            name: &str,
            lease_ms: u64,
        ) -> Option<i64> {
            redis::cmd("EVAL")
                .arg(WRITE_LOCK)
                .arg(1)
                .arg(name)
                .arg(lease_ms)
                .arg(self.write_name())
                .query(c)
                .expect("Redisson write lock script")
        }

        /// `writeLock().unlock()`: Some(1) released, Some(0) re-entered holds remain, None not
        /// held.
        pub fn write_unlock(
            &self,
            c: &mut redis::Connection,
            name: &str,
            lease_ms: u64,
        ) -> Option<i64> {
            redis::cmd("EVAL")
                .arg(WRITE_UNLOCK)
                .arg(3)
                .arg(name)
                .arg(prefix_name("redisson_rwlock", name))
                .arg(Self::latch(name))
                .arg(1)
                .arg(lease_ms)
                .arg(self.write_name())
                .arg("publish")
                .arg(LATCH_MS)
                .query(c)
                .expect("Redisson write unlock script")
        }

        /// The write lock's watchdog renewal (base renewal, then the read lock's).
        pub fn write_renew(&self, c: &mut redis::Connection, name: &str, lease_ms: u64) -> i64 {
            let r: i64 = redis::cmd("EVAL")
                .arg(BASE_RENEW)
                .arg(1)
                .arg(name)
                .arg(lease_ms)
                .arg(self.write_name())
                .query(c)
                .expect("Redisson base renew script");
            if r == 1 {
                return 1;
            }
            self.read_renew(c, name, lease_ms)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn random_uuid() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn client(server: &RedisServer) -> LockClient {
    LockClient::builder(server.url())
        .pool_size(8)
        .build()
        .expect("client")
}

fn rw(client: &LockClient, key: &str, ttl: Duration) -> ReadWriteLock {
    client
        .rw_lock(key)
        .ttl(ttl)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(20))))
        .build()
        .expect("read-write lock")
}

fn hash(conn: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(conn).expect("HGETALL")
}

fn owner_of(lease: &Lease) -> String {
    String::from_utf8(lease.value().to_vec()).expect("owner ids are ASCII")
}

fn timeout_key(key: &str, owner: &str, i: u32) -> String {
    redisson::suffix_name(key, &format!("{owner}:rwlock_timeout:{i}"))
}

#[track_caller]
fn assert_held<T: std::fmt::Debug>(r: Result<T, LockError>) {
    match r {
        Err(LockError::Held { .. }) => {}
        other => panic!("expected Held, got {other:?}"),
    }
}

fn ping(conn: &mut redis::Connection) -> bool {
    redis::cmd("PING")
        .query::<String>(conn)
        .map(|p| p == "PONG")
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------

#[test]
fn readers_and_writers_exclude_each_other_both_ways() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let key = "rwr:exclusion";
    let lock = rw(&c, key, Duration::from_secs(10));
    let java = redisson::Java::new();
    let java2 = redisson::Java::new();

    // A Java reader holds: Rust readers share, Rust writers are refused.
    assert_eq!(java.read_lock(&mut conn, key, 30_000), None);
    assert_held(lock.write_lock().try_lock());
    let ours = lock.read_lock().try_lock().expect("readers share");
    let owner = owner_of(ours.lease());
    let h = hash(&mut conn, key);
    assert_eq!(
        h,
        BTreeMap::from([
            ("mode".to_owned(), "read".to_owned()),
            (java.lock_name.clone(), "1".to_owned()),
            (owner.clone(), "1".to_owned()),
        ]),
        "our read hold in Redisson's layout"
    );
    assert!(raw::pttl(&mut conn, &timeout_key(key, &owner, 1)) > 0);
    // A Java writer is refused by the mixed readers (Redisson's answer: the PTTL).
    let pttl = java2
        .write_lock(&mut conn, key, 30_000)
        .expect("Java writer refused");
    assert!(pttl > 0, "{pttl}");

    // The Java reader leaves: our read still excludes the Java writer.
    assert_eq!(java.read_unlock(&mut conn, key), Some(0), "we still hold");
    assert!(java2.write_lock(&mut conn, key, 30_000).is_some());
    assert!(ours.unlock().unwrap());
    assert!(
        !raw::exists(&mut conn, key),
        "the last read deletes the hash"
    );

    // A Rust writer holds: Java readers and writers are refused.
    let w = lock.write_lock().try_lock().expect("free");
    let h = hash(&mut conn, key);
    assert_eq!(
        h,
        BTreeMap::from([
            ("mode".to_owned(), "write".to_owned()),
            (format!("{}:write", owner_of(w.lease())), "1".to_owned()),
        ])
    );
    assert!(java.read_lock(&mut conn, key, 30_000).is_some());
    assert!(java.write_lock(&mut conn, key, 30_000).is_some());
    // Java's unlocks of holds it does not have change nothing.
    assert_eq!(java.read_unlock(&mut conn, key), None);
    assert_eq!(java.write_unlock(&mut conn, key, 30_000), None);
    assert_eq!(hash(&mut conn, key), h);
    assert!(w.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));

    // A Java writer holds: Rust readers and writers are refused.
    assert_eq!(java.write_lock(&mut conn, key, 30_000), None);
    assert_held(lock.read_lock().try_lock());
    assert_held(lock.write_lock().try_lock());
    assert_eq!(java.write_unlock(&mut conn, key, 30_000), Some(1));
    assert!(!raw::exists(&mut conn, key));
    let r = lock.read_lock().try_lock().expect("free again");
    r.unlock().unwrap();
}

#[test]
fn reentry_and_downgrade_are_seen_by_the_other_side() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let key = "rwr:reentry";
    let lock = rw(&c, key, Duration::from_secs(10));
    let java = redisson::Java::new();

    // Our re-entrant read: count 2 and one timeout key per hold, as Redisson's.
    let r1 = lock.read_lock().try_lock().unwrap();
    let r2 = lock.read_lock().try_lock().unwrap();
    let owner = owner_of(r1.lease());
    assert_eq!(
        hash(&mut conn, key).get(&owner).map(String::as_str),
        Some("2")
    );
    assert!(raw::exists(&mut conn, &timeout_key(key, &owner, 1)));
    assert!(raw::exists(&mut conn, &timeout_key(key, &owner, 2)));
    assert!(java.write_lock(&mut conn, key, 30_000).is_some());
    r2.unlock().unwrap();
    assert!(!raw::exists(&mut conn, &timeout_key(key, &owner, 2)));
    assert!(
        java.write_lock(&mut conn, key, 30_000).is_some(),
        "one hold left"
    );
    r1.unlock().unwrap();
    assert!(!raw::exists(&mut conn, key));

    // Our re-entrant write, then our downgrade: write → read → release write.
    let w1 = lock.write_lock().try_lock().unwrap();
    let w2 = lock.write_lock().try_lock().unwrap();
    let wfield = format!("{owner}:write");
    assert_eq!(
        hash(&mut conn, key).get(&wfield).map(String::as_str),
        Some("2")
    );
    let r = lock.read_lock().try_lock().expect("the writer takes read");
    assert!(
        java.read_lock(&mut conn, key, 30_000).is_some(),
        "still in write mode"
    );
    w2.unlock().unwrap();
    w1.unlock().unwrap();
    assert_eq!(
        hash(&mut conn, key),
        BTreeMap::from([
            ("mode".to_owned(), "read".to_owned()),
            (owner.clone(), "1".to_owned()),
        ]),
        "downgraded: mode read, our read count"
    );
    assert!(java.write_lock(&mut conn, key, 30_000).is_some());
    assert_eq!(
        java.read_lock(&mut conn, key, 30_000),
        None,
        "Java reads beside us"
    );
    assert_eq!(java.read_unlock(&mut conn, key), Some(0));
    r.unlock().unwrap();
    assert!(!raw::exists(&mut conn, key));

    // Java's re-entrant read and its downgrade, as we see them.
    assert_eq!(java.read_lock(&mut conn, key, 30_000), None);
    assert_eq!(java.read_lock(&mut conn, key, 30_000), None);
    assert_held(lock.write_lock().try_lock());
    assert_eq!(java.read_unlock(&mut conn, key), Some(0));
    assert_held(lock.write_lock().try_lock());
    assert_eq!(java.read_unlock(&mut conn, key), Some(1));
    assert_eq!(java.write_lock(&mut conn, key, 30_000), None);
    assert_eq!(
        java.write_lock(&mut conn, key, 30_000),
        None,
        "Java re-enters write"
    );
    assert_eq!(
        java.read_lock(&mut conn, key, 30_000),
        None,
        "Java's writer takes read"
    );
    assert_held(lock.read_lock().try_lock());
    assert_eq!(java.write_unlock(&mut conn, key, 30_000), Some(0));
    assert_held(lock.read_lock().try_lock());
    assert_eq!(java.write_unlock(&mut conn, key, 30_000), Some(1));
    assert_eq!(
        hash(&mut conn, key).get("mode").map(String::as_str),
        Some("read")
    );
    let ours = lock
        .read_lock()
        .try_lock()
        .expect("Java downgraded: we read beside it");
    // Another client: through `c`, this thread is the reader `lock` is.
    let other = rw(&client(&server), key, Duration::from_secs(10));
    assert_held(other.write_lock().try_lock());
    assert_eq!(java.read_unlock(&mut conn, key), Some(0), "we still read");
    ours.unlock().unwrap();
    assert!(!raw::exists(&mut conn, key));
}

#[test]
fn a_holder_that_stops_renewing_loses_its_hold_both_ways() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let ttl = Duration::from_millis(800);
    let java = redisson::Java::new();

    // A Rust writer dies (its lease is leaked: nobody renews or releases it).
    let key = "rwr:dead-rust-writer";
    let lock = rw(&c, key, ttl);
    let leaked = lock.write_lock().try_lock().unwrap().into_lease();
    let died = Instant::now();
    assert!(java.read_lock(&mut conn, key, 30_000).is_some());
    assert!(
        wait_until(Duration::from_secs(5), || java
            .read_lock(&mut conn, key, 30_000)
            .is_none()),
        "a Java reader gets in once the dead writer's lease ran out"
    );
    let after = died.elapsed();
    assert!(after >= ttl - Duration::from_millis(50), "{after:?}");
    assert!(
        !lock.write_lock().release(&leaked).unwrap(),
        "our hold is gone"
    );
    assert_eq!(java.read_unlock(&mut conn, key), Some(1));

    // A Rust reader dies while a Java reader keeps renewing: Redisson's renewal renews every
    // reader's timeout key (also ours), so the dead hold lasts until the Java reader leaves,
    // then at most one Java lease.
    let key = "rwr:dead-rust-reader";
    let lock = rw(&c, key, ttl);
    let java_lease = 1000;
    assert_eq!(java.read_lock(&mut conn, key, java_lease), None);
    let leaked = lock.read_lock().try_lock().unwrap().into_lease();
    let ours = timeout_key(key, &owner_of(&leaked), 1);
    // Another client: through `c`, this thread is the dead reader.
    let writer = rw(&client(&server), key, Duration::from_secs(10));
    for _ in 0..6 {
        // Time under test: the Java reader renews while our leaked hold's lifetime runs out.
        thread::sleep(Duration::from_millis(250));
        assert_eq!(java.read_renew(&mut conn, key, java_lease), 1);
    }
    assert!(
        raw::pttl(&mut conn, &ours) > 0,
        "1.5 s > our ttl, yet alive: Redisson's renewal renewed our timeout key"
    );
    assert_held(writer.write_lock().try_lock());
    assert_eq!(
        java.read_unlock(&mut conn, key),
        Some(0),
        "our dead hold counts"
    );
    let java_left = Instant::now();
    let w = writer
        .write_lock()
        .try_lock_for(Duration::from_secs(5))
        .expect("the writer gets in when the dead reader's key expires");
    let waited = java_left.elapsed();
    assert!(waited <= Duration::from_millis(2500), "{waited:?}");
    w.unlock().unwrap();

    // A Java writer dies (stops renewing): our reader gets in after its lease.
    let key = "rwr:dead-java-writer";
    let lock = rw(&c, key, Duration::from_secs(10));
    assert_eq!(java.write_lock(&mut conn, key, 800), None);
    let died = Instant::now();
    let r = lock
        .read_lock()
        .try_lock_for(Duration::from_secs(5))
        .expect("in after the Java lease");
    assert!(died.elapsed() >= Duration::from_millis(700));
    r.unlock().unwrap();

    // A Java reader dies while our reader renews (only its own holds): our writer gets in
    // once our reader leaves and the Java hold has expired.
    let key = "rwr:dead-java-reader";
    let lock = rw(&c, key, Duration::from_millis(600));
    assert_eq!(java.read_lock(&mut conn, key, 800), None);
    let mut ours = lock.read_lock().try_lock().unwrap();
    for _ in 0..5 {
        // Time under test: ours renews while the Java hold's lifetime runs out.
        thread::sleep(Duration::from_millis(250));
        ours.extend(Duration::from_millis(600)).unwrap();
    }
    let jkey = timeout_key(key, &java.lock_name, 1);
    assert!(
        !raw::exists(&mut conn, &jkey),
        "the Java hold expired: we never renew it"
    );
    assert!(ours.unlock().unwrap());
    assert!(
        !raw::exists(&mut conn, key),
        "our release saw no live hold and freed the key"
    );
    let writer = rw(&c, key, Duration::from_secs(10));
    let w = writer.write_lock().try_lock().expect("free");
    w.unlock().unwrap();
}

#[test]
fn waiters_are_woken_on_redissons_channel_both_ways() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let key = "rwr:wake";
    let channel = redisson::prefix_name("redisson_rwlock", key);
    let java = redisson::Java::new();
    // Polling alone would take 5 s after the release; intents off so the writer's sleep is
    // not cut to half an intent.
    let slow = |c: &LockClient| {
        Arc::new(
            c.rw_lock(key)
                .ttl(Duration::from_secs(20))
                .writer_intent(Duration::ZERO)
                .retry(
                    RetryPolicy::standard()
                        .fixed_delay(Duration::from_secs(5))
                        .max_wait(Some(Duration::from_secs(30))),
                )
                .build()
                .unwrap(),
        )
    };
    let lock = slow(&c);
    assert_eq!(lock.channel(), channel);

    // A Rust writer waits for a Java reader; Redisson's read-unlock publishes "0".
    assert_eq!(java.read_lock(&mut conn, key, 20_000), None);
    let subscribed = c.test_hooks().count(Event::Subscribed);
    let refused = c.stats().refusals;
    let waiter = {
        let lock = Arc::clone(&lock);
        thread::spawn(move || {
            let g = lock.write_lock().lock().expect("woken");
            (g.into_lease(), Instant::now())
        })
    };
    assert!(wait_until(Duration::from_secs(10), || raw::numsub(
        &mut conn, &channel
    ) >= 1));
    // The waiter listens: its sleep has begun.
    support::wait_listening(&c, subscribed + 1, refused + 2);
    let released = Instant::now();
    assert_eq!(java.read_unlock(&mut conn, key), Some(1));
    let (lease, got) = waiter.join().unwrap();
    let woken = got.saturating_duration_since(released);
    assert!(
        woken < Duration::from_secs(3),
        "woken by Redisson's publish: {woken:?}"
    );
    assert!(lock.write_lock().release(&lease).unwrap());

    // A Rust reader waits for a Java writer; Redisson's write-unlock publishes "1".
    assert_eq!(java.write_lock(&mut conn, key, 20_000), None);
    let refused = c.stats().refusals;
    let waiter = {
        let lock = Arc::clone(&lock);
        thread::spawn(move || {
            let g = lock.read_lock().lock().expect("woken");
            (g.into_lease(), Instant::now())
        })
    };
    assert!(wait_until(Duration::from_secs(10), || raw::numsub(
        &mut conn, &channel
    ) >= 1));
    // The channel is still subscribed: one refused attempt and the waiter sleeps.
    support::wait_listening(&c, 1, refused + 1);
    let released = Instant::now();
    assert_eq!(java.write_unlock(&mut conn, key, 20_000), Some(1));
    let (lease, got) = waiter.join().unwrap();
    let woken = got.saturating_duration_since(released);
    assert!(
        woken < Duration::from_secs(3),
        "woken by Redisson's publish: {woken:?}"
    );

    // Our releases on Redisson's channel, with Redisson's messages, as a Java waiter hears
    // them: "0" after the last read, "1" after a write.
    let mut sub_conn = server.conn();
    let mut pubsub = sub_conn.as_pubsub();
    pubsub.subscribe(&channel).expect("SUBSCRIBE");
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(lock.read_lock().release(&lease).unwrap());
    let msg = pubsub.get_message().expect("the read release is published");
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    let w = lock.write_lock().try_lock().unwrap();
    assert!(w.unlock().unwrap());
    let msg = pubsub
        .get_message()
        .expect("the write release is published");
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "1");
    drop(pubsub);
    assert!(!raw::exists(&mut conn, key));
}

/// Runs `f` and returns its result with how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// A state of the key this library can leave, built on a fresh key, with the leases that hold
/// it (they must all still be held after Redisson's scripts ran).
struct State {
    name: &'static str,
    key: String,
    /// (lock, lease, is_write)
    holds: Vec<(Arc<ReadWriteLock>, Lease, bool)>,
    /// A waiting writer thread (left an intent), stopped at the end.
    waiter: Option<thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

fn build_state(
    c: &LockClient,
    conn: &mut redis::Connection,
    name: &'static str,
    java_reads: bool,
) -> State {
    let key = format!("rwr:state:{name}:{java_reads}");
    let mk = || Arc::new(rw(c, &key, Duration::from_secs(20)));
    let a = mk();
    let b = mk();
    let mut holds = Vec::new();
    let take = |l: &Arc<ReadWriteLock>, write: bool| {
        let lease = if write {
            l.write_lock().try_acquire()
        } else {
            l.read_lock().try_acquire()
        };
        (Arc::clone(l), lease.expect("state hold"), write)
    };
    let mut waiter = None;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    match name {
        "empty" => {}
        "reader" => holds.push(take(&a, false)),
        "reader-reentered" => {
            for _ in 0..3 {
                holds.push(take(&a, false));
            }
        }
        "two-readers" => {
            holds.push(take(&a, false));
            holds.push(take(&b, false));
        }
        "writer" => holds.push(take(&a, true)),
        "writer-reentered" => {
            holds.push(take(&a, true));
            holds.push(take(&a, true));
        }
        "writer-and-its-read" => {
            holds.push(take(&a, true));
            holds.push(take(&a, false));
        }
        "downgraded" => {
            let (l, w, _) = take(&a, true);
            holds.push(take(&a, false));
            assert!(l.write_lock().release(&w).unwrap());
        }
        "intent-only" => {
            // A writer that died while waiting: its intent outlives it (as recorded by a
            // refused blocking writer: member = its owner id, score = expiry in server ms).
            let (l, lease, _) = take(&a, false);
            let w = Arc::clone(&b);
            let t = thread::spawn(move || {
                let r = w.write_lock().try_lock_for(Duration::from_millis(400));
                assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
            });
            let writers = format!("dlock_rwlock_writers:{{{key}}}");
            assert!(wait_until(Duration::from_secs(5), || redis::cmd("ZCARD")
                .arg(&writers)
                .query::<i64>(conn)
                .unwrap()
                >= 1));
            let intent: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(&writers)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)
                .unwrap();
            t.join().unwrap();
            assert!(l.read_lock().release(&lease).unwrap());
            let (member, score) = intent[0].clone();
            let _: () = redis::cmd("ZADD")
                .arg(&writers)
                .arg(score + 20_000.0)
                .arg(member)
                .query(conn)
                .unwrap();
        }
        "reader-and-waiting-writer" | "writer-and-waiting-writer" => {
            holds.push(take(&a, name == "writer-and-waiting-writer"));
            // Another owner's blocking writer leaves its intent and keeps refreshing it.
            let w = Arc::clone(&b);
            let stop2 = Arc::clone(&stop);
            waiter = Some(thread::spawn(move || {
                while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Ok(g) = w.write_lock().try_lock_for(Duration::from_millis(300)) {
                        g.unlock().unwrap();
                    }
                }
            }));
            let writers = format!("dlock_rwlock_writers:{{{key}}}");
            assert!(
                wait_until(Duration::from_secs(5), || redis::cmd("ZCARD")
                    .arg(&writers)
                    .query::<i64>(conn)
                    .unwrap()
                    >= 1),
                "the waiting writer's intent is recorded"
            );
        }
        other => panic!("unknown state {other}"),
    }
    State {
        name,
        key,
        holds,
        waiter,
        stop,
    }
}

const STATES: [&str; 11] = [
    "empty",
    "reader",
    "reader-reentered",
    "two-readers",
    "writer",
    "writer-reentered",
    "writer-and-its-read",
    "downgraded",
    "reader-and-waiting-writer",
    "writer-and-waiting-writer",
    "intent-only",
];

#[test]
fn redissons_scripts_finish_at_once_on_every_state_we_leave_and_keep_our_holds() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let bound = Duration::from_secs(1);
    for java_reads in [false, true] {
        for name in STATES {
            let state = build_state(&c, &mut conn, name, java_reads);
            let key = state.key.clone();
            let java = redisson::Java::new();
            // Optionally a Java reader holds too (where readers may), so that its unlock
            // walks the whole hash and deletes or keeps it.
            let java_holds = java_reads && java.read_lock(&mut conn, &key, 20_000).is_none();
            if java_reads && (name == "reader-and-waiting-writer" || name == "intent-only") {
                // Redisson's readers do not see our writer intents.
                assert!(
                    java_holds,
                    "{name}: a Java reader enters past our waiting writer"
                );
            }
            let before: BTreeMap<String, String> = hash(&mut conn, &key)
                .into_iter()
                .filter(|(f, _)| *f != java.lock_name)
                .collect();
            let stranger = redisson::Java::new();
            for (what, run) in [
                ("Redisson read-unlock", 0),
                ("Redisson write-unlock", 1),
                ("Redisson read renewal", 2),
                ("Redisson write renewal", 3),
                ("Redisson read-unlock (holder)", 4),
            ] {
                let (_, took) = timed(|| match run {
                    0 => {
                        let r = stranger.read_unlock(&mut conn, &key);
                        if raw::exists(&mut conn, &key) {
                            assert_eq!(r, None, "{name}: a stranger's read-unlock is refused");
                        }
                    }
                    1 => {
                        let r = stranger.write_unlock(&mut conn, &key, 20_000);
                        if raw::exists(&mut conn, &key) {
                            assert_eq!(r, None, "{name}: a stranger's write-unlock is refused");
                        }
                    }
                    2 => {
                        // The Java reader's renewal walks every field (a stranger's stops).
                        let who = if java_holds { &java } else { &stranger };
                        let r = who.read_renew(&mut conn, &key, 20_000);
                        assert_eq!(r, i64::from(java_holds), "{name}: renewal");
                    }
                    3 => {
                        stranger.write_renew(&mut conn, &key, 20_000);
                    }
                    _ => {
                        if java_holds {
                            let r = java.read_unlock(&mut conn, &key);
                            assert!(r.is_some(), "{name}: the Java reader's unlock");
                        }
                    }
                });
                assert!(took < bound, "{name} ({java_reads}): {what} took {took:?}");
                assert!(ping(&mut conn), "{name}: the server answers after {what}");
            }
            let after: BTreeMap<String, String> = hash(&mut conn, &key)
                .into_iter()
                .filter(|(f, _)| *f != java.lock_name)
                .collect();
            if name == "empty" || name == "intent-only" {
                assert!(after.is_empty(), "{name}: {after:?}");
            } else {
                assert_eq!(
                    after, before,
                    "{name} ({java_reads}): our fields are intact"
                );
            }
            for (lock, lease, write) in &state.holds {
                let held = if *write {
                    lock.write_lock().is_held(lease).unwrap()
                } else {
                    lock.read_lock().is_held(lease).unwrap()
                };
                assert!(
                    held,
                    "{name} ({java_reads}): our hold survived Redisson's scripts"
                );
            }
            // Our own release path still works on the state.
            state.stop.store(true, std::sync::atomic::Ordering::SeqCst);
            for (lock, lease, write) in state.holds.iter().rev() {
                let ok = if *write {
                    lock.write_lock().release(lease).unwrap()
                } else {
                    lock.read_lock().release(lease).unwrap()
                };
                assert!(ok, "{}: release", state.name);
            }
            if let Some(w) = state.waiter {
                w.join().unwrap();
            }
        }
    }
}

#[test]
fn a_release_sent_twice_with_one_latch_gives_back_one_hold() {
    // The script as the client sends it: lua/rw_release.lua with its prelude in place.
    let script = include_str!("../lua/rw_release.lua").replacen(
        "-- #include rw_prelude.lua\n",
        include_str!("../lua/rw_prelude.lua"),
        1,
    );
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    let key = "rwr:latch";
    let lock = rw(&c, key, Duration::from_secs(10));
    let r1 = lock.read_lock().try_acquire().unwrap();
    let _r2 = lock.read_lock().try_acquire().unwrap();
    let owner = owner_of(&r1);
    let latch = format!("redisson_unlock_latch:{{{key}}}:{}", random_uuid());
    let send = |conn: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("EVAL")
            .arg(&script)
            .arg(3)
            .arg(key)
            .arg(format!("dlock_rwlock_writers:{{{key}}}"))
            .arg(&latch)
            .arg("read")
            .arg(&owner)
            .arg(format!("redisson_rwlock:{{{key}}}"))
            .arg(10_000)
            .arg(10_000)
            .query(conn)
            .expect("release script")
    };
    assert_eq!(send(&mut conn), vec![1, 1], "one hold given back, one left");
    assert_eq!(
        send(&mut conn),
        vec![1, 1],
        "the resend answers from the latch"
    );
    assert_eq!(
        hash(&mut conn, key).get(&owner).map(String::as_str),
        Some("1")
    );
    assert!(lock.read_lock().is_held(&r1).unwrap());
    assert!(
        raw::pttl(&mut conn, &latch) > 0,
        "the latch expires by itself"
    );
}

/// A TCP proxy to the server that, when armed, swallows the next reply from the server and
/// closes the client's socket instead: the server ran the command, the client never hears.
struct DropReplyProxy {
    port: u16,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl DropReplyProxy {
    fn start(server_port: u16) -> DropReplyProxy {
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let armed2 = Arc::clone(&armed);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = c_in.read(&mut buf) {
                        if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_out.shutdown(Shutdown::Both);
                });
                let (mut s_in, mut c_out) = (server, client);
                let armed = Arc::clone(&armed2);
                thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = s_in.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if armed.swap(false, Ordering::SeqCst) {
                            // The reply is dropped and the connection closed.
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
        DropReplyProxy { port, armed }
    }
}

#[test]
fn a_release_resent_after_a_lost_reply_gives_back_one_hold() {
    init_logging();
    let server = RedisServer::start();
    let proxy = DropReplyProxy::start(server.port());
    // One pooled connection, so the release goes out on a connection used before (the
    // client resends only on such a connection).
    let c = LockClient::builder(format!("redis://127.0.0.1:{}/", proxy.port))
        .pool_size(1)
        .build()
        .expect("client through the proxy");
    let mut conn = server.conn();
    let key = "rwr:lost-reply";
    let lock = rw(&c, key, Duration::from_secs(10));
    // Load the scripts first: a dropped NOSCRIPT reply would not test the resend of a release
    // that ran.
    for side in [
        lock.read_lock() as &dyn DistributedLock,
        lock.write_lock() as &dyn DistributedLock,
    ] {
        assert!(side.try_lock().unwrap().unlock().unwrap());
    }
    for (mode, write) in [("read", false), ("write", true)] {
        let side: &dyn DistributedLock = if write {
            lock.write_lock()
        } else {
            lock.read_lock()
        };
        let l1 = side.try_acquire().expect("first hold");
        let l2 = side.try_acquire().expect("second hold");
        let field = if write {
            format!("{}:write", owner_of(&l1))
        } else {
            owner_of(&l1)
        };
        assert_eq!(
            hash(&mut conn, key).get(&field).map(String::as_str),
            Some("2")
        );
        proxy.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(
            side.release(&l1).unwrap(),
            "{mode}: the resent release answers from the latch"
        );
        assert!(
            !proxy.armed.load(std::sync::atomic::Ordering::SeqCst),
            "a reply was dropped"
        );
        assert_eq!(
            hash(&mut conn, key).get(&field).map(String::as_str),
            Some("1"),
            "{mode}: one hold given back, not two"
        );
        assert!(side.is_held(&l2).unwrap(), "{mode}: the other hold stays");
        assert!(side.release(&l2).unwrap());
        assert!(!raw::exists(&mut conn, key));
    }
}
