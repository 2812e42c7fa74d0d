//! The semaphore (`LockClient::semaphore`) against real servers:
//!
//! - the API: counts, all-or-none acquires, contention and config errors, Redisson's layout
//!   (raw 16-byte ids in `{name}:timeout` scored by expiry, the count at the name);
//! - exclusion and counts under load: threads of two clients and two worker processes on a
//!   2-permit semaphore never have more than 2 in the section, and the count is 2 again at the
//!   end; the negative control (permits whose lease is shorter than the section) is reported
//!   by the same checker;
//! - beside Java services on Redisson's `RPermitExpirableSemaphore`: Redisson's exact scripts
//!   ([`redisson`]) and ours on one name keep the count, the bound and the wake-ups, and each
//!   side reclaims the other's expired permits; a Java clock ahead reclaims a permit with an
//!   explicit lease early, not a watched one;
//! - a holder process SIGKILLed with its (watched) permits: they come back at the end of the
//!   lease; negative control: a dead Redisson holder without a lease never gives them back;
//! - a server restart under load (no persistence: the count is gone until set again);
//! - lost replies (a proxy drops them): an acquire undone, a release sent again, the count
//!   exact;
//! - watched permits renewed past their lease; lost ones reported by `is_lost`, `on_lost` and
//!   `release`;
//! - a Redis Cluster (with the `cluster` feature).

mod support;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_dlock::{LockClient, LockError, RetryPolicy, Semaphore};
use support::worker::{self, WorkerProcess};
use support::{init_logging, wait_until, RedisServer};

/// What a Java service on `redisson.getPermitExpirableSemaphore(name)` sends, verbatim.
///
/// Copied from redisson/redisson at commit 017b8306b450d6970ef7a5244e89c1c14bbab571
/// (copyright 2013-2024, permit ids raw 16 bytes as since 3.17), file
/// `redisson/src/main/java/org/redisson/RedissonPermitExpirableSemaphore.java`: the scripts of
/// `tryAcquireAsync(List<String> ids, long timeoutDate)`, `tryReleaseAsync(String permitId)`,
/// `availablePermitsAsync()`, `trySetPermitsAsync(int)` and `addPermitsAsync(int)`. Each Java
/// string literal is one fragment below, in order. Names: `timeoutName = suffixName(name,
/// "timeout")`, `channelName = prefixName("redisson_sc", name)`; `nonExpirableTimeout =
/// 922337203685477L`; the publish command is `publish` (no sharded pub/sub).
mod redisson {
    /// KEYS: name, timeoutName, channelName. ARGV: permits, timeoutDate (client ms, or
    /// nonExpirableTimeout), System.currentTimeMillis(), nonExpirableTimeout, publish, ids….
    /// 'OK' when taken; ':<score>' (the earliest expiry) or nil when refused.
    pub const TRY_ACQUIRE: &str = concat!(
        "local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1]); ",
        "if #expiredIds > 0 then ",
        "redis.call('zrem', KEYS[2], unpack(expiredIds)); ",
        "local value = redis.call('incrby', KEYS[1], #expiredIds); ",
        "if tonumber(value) > 0 then ",
        "redis.call(ARGV[5], KEYS[3], value); ",
        "end;",
        "end; ",
        "local value = redis.call('get', KEYS[1]); ",
        "if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then ",
        "redis.call('decrby', KEYS[1], ARGV[1]); ",
        "for i = 6, #ARGV, 1 do ",
        "redis.call('zadd', KEYS[2], ARGV[2], ARGV[i]); ",
        "end; ",
        "local ttl = redis.call('pttl', KEYS[1]); ",
        "if ttl > 0 then ",
        "redis.call('pexpire', KEYS[2], ttl); ",
        "end; ",
        "return 'OK'; ",
        "end; ",
        "local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES'); ",
        "if v[1] ~= nil and v[2] ~= ARGV[4] then ",
        "return ':' .. tostring(v[2]); ",
        "end ",
        "return nil;",
    );

    /// KEYS: name, channelName, timeoutName. ARGV: id, 1, System.currentTimeMillis(),
    /// publish. 1 if released within its lease.
    pub const TRY_RELEASE: &str = concat!(
        "local expire = redis.call('zscore', KEYS[3], ARGV[1]);",
        "local removed = redis.call('zrem', KEYS[3], ARGV[1]);",
        "if tonumber(removed) ~= 1 then ",
        "return 0;",
        "end;",
        "local value = redis.call('incrby', KEYS[1], ARGV[2]); ",
        "redis.call(ARGV[4], KEYS[2], value); ",
        "if tonumber(expire) <= tonumber(ARGV[3]) then ",
        "return 0;",
        "end;",
        "return 1;",
    );

    /// KEYS: name, timeoutName, channelName. ARGV: System.currentTimeMillis(), publish.
    pub const AVAILABLE_PERMITS: &str = concat!(
        "local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1], 'limit', 0, -1); ",
        "if #expiredIds > 0 then ",
        "redis.call('zrem', KEYS[2], unpack(expiredIds)); ",
        "local value = redis.call('incrby', KEYS[1], #expiredIds); ",
        "if tonumber(value) > 0 then ",
        "redis.call(ARGV[2], KEYS[3], value); ",
        "end;",
        "return value; ",
        "end; ",
        "local ret = redis.call('get', KEYS[1]); ",
        "return ret == false and 0 or ret;",
    );

    /// KEYS: name, channelName. ARGV: permits, publish.
    pub const TRY_SET_PERMITS: &str = concat!(
        "local value = redis.call('get', KEYS[1]); ",
        "if (value == false) then ",
        "redis.call('set', KEYS[1], ARGV[1]); ",
        "redis.call(ARGV[2], KEYS[2], ARGV[1]); ",
        "return 1;",
        "end;",
        "return 0;",
    );

    /// KEYS: name, channelName. ARGV: permits, publish.
    pub const ADD_PERMITS: &str = concat!(
        "local value = redis.call('get', KEYS[1]); ",
        "if (value == false) then ",
        "value = 0;",
        "end;",
        "redis.call('set', KEYS[1], tonumber(value) + tonumber(ARGV[1])); ",
        "if tonumber(ARGV[1]) > 0 then ",
        "redis.call(ARGV[2], KEYS[2], ARGV[1]); ",
        "end;",
    );

    pub const NON_EXPIRABLE: i64 = 922337203685477;
}

/// A Java client as Redisson drives the scripts: its own clock, its own random ids.
struct Java {
    conn: redis::Connection,
    name: String,
    timeout: String,
    channel: String,
    /// How far this Java host's clock is ahead of the server's (ms).
    skew: i64,
}

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl Java {
    fn new(server: &RedisServer, name: &str) -> Java {
        Java {
            conn: server.conn(),
            name: name.to_owned(),
            timeout: format!("{{{name}}}:timeout"),
            channel: format!("redisson_sc:{{{name}}}"),
            skew: 0,
        }
    }

    /// `System.currentTimeMillis()` on this Java host.
    fn now(&self) -> i64 {
        epoch_ms() + self.skew
    }

    /// `tryAcquire(permits, leaseTime)` once (no wait): the ids taken, or none. `lease` None:
    /// Redisson's permit without a lease (nonExpirableTimeout).
    fn try_acquire(&mut self, permits: usize, lease: Option<Duration>) -> Option<Vec<String>> {
        let ids: Vec<[u8; 16]> = (0..permits).map(|_| rand_id()).collect();
        let timeout_date = lease.map_or(redisson::NON_EXPIRABLE, |l| {
            self.now() + l.as_millis() as i64
        });
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(redisson::TRY_ACQUIRE)
            .arg(3)
            .arg(&self.name)
            .arg(&self.timeout)
            .arg(&self.channel)
            .arg(permits)
            .arg(timeout_date)
            .arg(self.now())
            .arg(redisson::NON_EXPIRABLE)
            .arg("publish");
        for id in &ids {
            cmd.arg(&id[..]);
        }
        let reply: Option<String> = cmd.query(&mut self.conn).unwrap();
        (reply.as_deref() == Some("OK")).then(|| ids.iter().map(hex::encode).collect())
    }

    /// `tryRelease(permitId)`.
    fn try_release(&mut self, id: &str) -> bool {
        let n: i64 = redis::cmd("EVAL")
            .arg(redisson::TRY_RELEASE)
            .arg(3)
            .arg(&self.name)
            .arg(&self.channel)
            .arg(&self.timeout)
            .arg(hex::decode(id).unwrap())
            .arg(1)
            .arg(self.now())
            .arg("publish")
            .query(&mut self.conn)
            .unwrap();
        n == 1
    }

    fn available(&mut self) -> i64 {
        redis::cmd("EVAL")
            .arg(redisson::AVAILABLE_PERMITS)
            .arg(3)
            .arg(&self.name)
            .arg(&self.timeout)
            .arg(&self.channel)
            .arg(self.now())
            .arg("publish")
            .query(&mut self.conn)
            .unwrap()
    }

    fn try_set_permits(&mut self, permits: i64) -> bool {
        let n: i64 = redis::cmd("EVAL")
            .arg(redisson::TRY_SET_PERMITS)
            .arg(2)
            .arg(&self.name)
            .arg(&self.channel)
            .arg(permits)
            .arg("publish")
            .query(&mut self.conn)
            .unwrap();
        n == 1
    }

    fn add_permits(&mut self, permits: i64) {
        let _: () = redis::cmd("EVAL")
            .arg(redisson::ADD_PERMITS)
            .arg(2)
            .arg(&self.name)
            .arg(&self.channel)
            .arg(permits)
            .arg("publish")
            .query(&mut self.conn)
            .unwrap();
    }
}

fn rand_id() -> [u8; 16] {
    rand::random()
}

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

/// Members of the permits' sorted set with their scores.
fn permits_in(conn: &mut redis::Connection, name: &str) -> Vec<(Vec<u8>, i64)> {
    redis::cmd("ZRANGE")
        .arg(format!("{{{name}}}:timeout"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap()
}

fn server_ms(conn: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1000 + us / 1000
}

#[test]
fn api_counts_errors_and_layout() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let mut conn = server.conn();
    let sem = client
        .semaphore("api")
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_millis(300))))
        .build()
        .unwrap();
    assert_eq!(sem.name(), "api");
    // Never set: nothing to take.
    let e = sem.try_acquire().unwrap_err();
    assert!(e.is_contention(), "{e:?}");
    assert_eq!(sem.available().unwrap(), 0);
    assert!(sem.try_set_permits(3).unwrap());
    assert!(!sem.try_set_permits(7).unwrap());
    assert_eq!(sem.available().unwrap(), 3);

    let two = sem.acquire_many(2).unwrap();
    assert_eq!(two.count(), 2);
    let ids = two.ids();
    assert_eq!(ids.len(), 2);
    for id in &ids {
        assert_eq!(id.len(), 32);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }
    // Redisson's layout: the count at the name, raw ids scored by expiry (server ms).
    assert_eq!(support::raw::get_i64(&mut conn, "api"), 1);
    let now = server_ms(&mut conn);
    let members = permits_in(&mut conn, "api");
    assert_eq!(members.len(), 2);
    for (member, score) in &members {
        assert_eq!(member.len(), 16);
        assert!(ids.contains(&hex::encode(member)));
        assert!(
            (now + 8_000..=now + 10_500).contains(score),
            "{score} vs {now}"
        );
    }
    assert!(two.valid_until() > Instant::now() + Duration::from_secs(8));
    assert!(!two.is_lost());

    // All or none: 2 more are not there.
    let e = sem
        .try_acquire_many_for(2, Duration::from_millis(200))
        .unwrap_err();
    assert!(
        e.is_contention() && matches!(e, LockError::Timeout { .. }),
        "{e:?}"
    );
    assert_eq!(sem.available().unwrap(), 1);
    let one = sem.try_acquire().unwrap();
    assert!(sem.try_acquire().unwrap_err().is_contention());
    let e = sem.acquire().unwrap_err();
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");
    // A permit may be released on another thread.
    let released = thread::scope(|s| s.spawn(move || two.release().unwrap()).join().unwrap());
    assert!(released);
    drop(one);
    assert_eq!(sem.available().unwrap(), 3);
    // Counted as locks are: attempts won and refused, blocking acquires that gave up.
    let stats = client.stats();
    assert_eq!(
        (stats.acquires, stats.timeouts, stats.lost_holds),
        (2, 2, 0)
    );
    assert!(stats.refusals >= 4, "{stats:?}");
    assert!(permits_in(&mut conn, "api").is_empty());

    // Redisson's addPermits, negative too.
    sem.add_permits(-4).unwrap();
    assert_eq!(sem.available().unwrap(), 0);
    assert_eq!(support::raw::get_i64(&mut conn, "api"), -1);
    sem.add_permits(3).unwrap();
    assert_eq!(sem.available().unwrap(), 2);

    // Options and counts checked as for locks.
    let is_config = |r: Result<Semaphore, LockError>| matches!(r, Err(LockError::Config { .. }));
    assert!(is_config(
        client
            .semaphore("api")
            .ttl(Duration::from_secs(1))
            .on_lost(|_| {})
            .build()
    ));
    assert!(is_config(
        client.semaphore("api").ttl(Duration::ZERO).build()
    ));
    assert!(matches!(sem.acquire_many(0), Err(LockError::Config { .. })));
    assert!(matches!(
        sem.try_acquire_many_for(1001, Duration::ZERO),
        Err(LockError::Config { .. })
    ));
    // A name with braces: Redisson's `name:timeout`.
    let tagged = client
        .semaphore("{t}:jobs")
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    tagged.add_permits(1).unwrap();
    let p = tagged.try_acquire().unwrap();
    let z: i64 = redis::cmd("ZCARD")
        .arg("{t}:jobs:timeout")
        .query(&mut conn)
        .unwrap();
    assert_eq!(z, 1);
    assert!(p.release().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Exclusion and counts under load.

const LOAD_NAME: &str = "load:sem";
const INSIDE: &str = "load:inside";
const MAX_SEEN: &str = "load:max";
const LOAD_WORKER_ENV: &str = "DLOCK_SEM_LOAD_WORKER";
const LOAD_WORKER_TEST: &str = "semaphore_load_worker";
const LOAD_DONE: &str = "DLOCK-SEM-LOAD-DONE";

/// What a run of sections saw.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    sections: u64,
    /// Releases that said a permit was lost.
    lost: u64,
}

/// One holder's loop: `rounds` sections under `sem`, each counted in Redis (`INCR`/`DECR` of
/// [`INSIDE`], the highest value kept in [`MAX_SEEN`] by a script): the checker's view, shared
/// by every thread and process.
fn sections(sem: &Semaphore, conn: &mut redis::Connection, rounds: u32, hold: Duration) -> Seen {
    let enter = redis::Script::new(
        "local n = redis.call('incr', KEYS[1]) \
         if n > tonumber(redis.call('get', KEYS[2]) or '0') then redis.call('set', KEYS[2], n) end \
         return n",
    );
    let mut seen = Seen::default();
    for _ in 0..rounds {
        let permit = sem.acquire().expect("a permit within the policy's wait");
        let _: i64 = enter.key(INSIDE).key(MAX_SEEN).invoke(conn).unwrap();
        thread::sleep(hold);
        let _: i64 = redis::cmd("DECR").arg(INSIDE).query(conn).unwrap();
        seen.sections += 1;
        if !permit.release().unwrap() {
            seen.lost += 1;
        }
    }
    seen
}

/// Runs `threads` threads (over two clients) and `processes` worker processes of 2 threads
/// each, `rounds` sections each, on a 2-permit semaphore with permits of `lease`: the most
/// holders seen in the section at once, and what they saw.
fn load(server: &RedisServer, lease: Duration, hold: Duration, processes: usize) -> (i64, Seen) {
    let mut conn = server.conn();
    support::raw::del(&mut conn, INSIDE);
    support::raw::del(&mut conn, MAX_SEEN);
    let clients = [client(server), client(server)];
    let policy = RetryPolicy::standard().max_wait(Some(Duration::from_secs(30)));
    let build = |c: &LockClient| {
        c.semaphore(LOAD_NAME)
            .ttl(lease)
            .retry(policy.clone())
            .build()
            .unwrap()
    };
    build(&clients[0]).try_set_permits(2).unwrap();
    let workers: Vec<WorkerProcess> = (0..processes)
        .map(|_| {
            WorkerProcess::spawn_captured(
                LOAD_WORKER_TEST,
                &[
                    (LOAD_WORKER_ENV, "1".to_owned()),
                    ("DLOCK_URL", server.url()),
                    ("DLOCK_LEASE_MS", lease.as_millis().to_string()),
                    ("DLOCK_HOLD_MS", hold.as_millis().to_string()),
                ],
            )
        })
        .collect();
    let total = Mutex::new(Seen::default());
    thread::scope(|s| {
        for t in 0..8 {
            let (client, total) = (&clients[t % 2], &total);
            let url = server.url();
            s.spawn(move || {
                let sem = build(client);
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let seen = sections(&sem, &mut conn, 12, hold);
                let mut t = total.lock().unwrap();
                t.sections += seen.sections;
                t.lost += seen.lost;
            });
        }
    });
    let mut total = total.into_inner().unwrap();
    for w in workers {
        let (status, out, err) = w.finish(Duration::from_secs(60));
        assert!(status.success(), "worker failed: {out}\n{err}");
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(LOAD_DONE))
            .unwrap_or_else(|| panic!("no report from the worker: {out}\n{err}"));
        let mut parts = line.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        total.sections += parts.next().unwrap();
        total.lost += parts.next().unwrap();
    }
    let max = support::raw::get_i64(&mut conn, MAX_SEEN);
    (max, total)
}

/// A load worker process: 2 threads of its own client run the sections.
#[test]
fn semaphore_load_worker() {
    if std::env::var_os(LOAD_WORKER_ENV).is_none() {
        return;
    }
    init_logging();
    let url = std::env::var("DLOCK_URL").unwrap();
    let ms = |v: &str| Duration::from_millis(std::env::var(v).unwrap().parse().unwrap());
    let (lease, hold) = (ms("DLOCK_LEASE_MS"), ms("DLOCK_HOLD_MS"));
    let client = LockClient::open(&url).unwrap();
    let sem = client
        .semaphore(LOAD_NAME)
        .ttl(lease)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(30))))
        .build()
        .unwrap();
    let (sections, lost) = thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let (sem, url) = (&sem, url.clone());
                s.spawn(move || {
                    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                    sections(sem, &mut conn, 12, hold)
                })
            })
            .collect();
        runs.into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |(a, b), s| (a + s.sections, b + s.lost))
    });
    worker::report(LOAD_DONE, &format!("{sections} {lost}"));
}

#[test]
fn at_most_the_count_hold_under_load_and_the_count_comes_back() {
    init_logging();
    let server = RedisServer::start();
    let (max, seen) = load(
        &server,
        Duration::from_secs(10),
        Duration::from_millis(3),
        2,
    );
    // 8 threads + 2 processes × 2 threads, 12 sections each.
    assert_eq!(seen.sections, 12 * 12);
    assert_eq!(seen.lost, 0);
    assert!(max <= 2, "{max} holders in the section at once");
    assert_eq!(max, 2, "12 holders on 2 permits never overlapped");
    let sem = client(&server)
        .semaphore(LOAD_NAME)
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(sem.available().unwrap(), 2);
    let mut conn = server.conn();
    assert!(permits_in(&mut conn, LOAD_NAME).is_empty());

    // Negative control: permits whose lease (60 ms) ends long before the section (200 ms)
    // does. They are reclaimed and taken by others mid-section: the same checker must see
    // more than 2 inside, and the releases report the loss.
    let (max, seen) = load(
        &server,
        Duration::from_millis(60),
        Duration::from_millis(200),
        0,
    );
    eprintln!("negative control: {max} holders at once, {seen:?}");
    assert!(
        max > 2,
        "the checker missed a semaphore that ignores its count: {max}"
    );
    assert!(seen.lost > 0, "{seen:?}");
}

// ---------------------------------------------------------------------------------------------
// Beside Redisson.

#[test]
fn redisson_and_this_crate_share_one_semaphore() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let name = "mixed";
    let mut java = Java::new(&server, name);
    let sem = client
        .semaphore(name)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();

    // The count: set by Java, seen and kept by us, and the other way round.
    assert!(java.try_set_permits(2));
    assert!(!sem.try_set_permits(5).unwrap());
    assert!(!java.try_set_permits(5));
    assert_eq!(sem.available().unwrap(), 2);
    let theirs = java.try_acquire(1, Some(Duration::from_secs(10))).unwrap();
    let ours = sem.try_acquire().unwrap();
    assert_eq!((java.available(), sem.available().unwrap()), (0, 0));
    assert!(sem.try_acquire().unwrap_err().is_contention());
    assert!(java.try_acquire(1, Some(Duration::from_secs(10))).is_none());
    // Redisson releases our permit by its id, as a Java service handed the id would.
    let mut java2 = Java::new(&server, name);
    assert!(java2.try_release(&ours.ids()[0]));
    assert!(
        !ours.release().unwrap(),
        "a permit released by another is reported lost"
    );
    assert_eq!(java.available(), 1);
    assert!(java.try_release(&theirs[0]));
    assert_eq!(sem.available().unwrap(), 2);
    java.add_permits(1);
    assert_eq!(sem.available().unwrap(), 3);
    sem.add_permits(-1).unwrap();
    assert_eq!(java.available(), 2);

    // Wake-ups: a Java release wakes our waiter, which listens on Redisson's channel.
    let all = sem.acquire_many(2).unwrap();
    drop(all);
    let theirs = java.try_acquire(2, Some(Duration::from_secs(30))).unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            let p = sem.try_acquire_for(Duration::from_secs(20)).unwrap();
            (start.elapsed(), p.release().unwrap())
        });
        let mut conn = server.conn();
        let channel = format!("redisson_sc:{{{name}}}");
        assert!(
            wait_until(Duration::from_secs(10), || {
                let (_, n): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query(&mut conn)
                    .unwrap();
                n > 0
            }),
            "our waiter does not listen on Redisson's channel"
        );
        assert!(java.try_release(&theirs[0]));
        let (waited, released) = waiter.join().unwrap();
        assert!(released);
        assert!(waited < Duration::from_secs(15), "{waited:?}");
    });
    assert!(java.try_release(&theirs[1]));

    // Our releases wake Java's waiters: Redisson's SemaphorePubSub releases its latch by the
    // count published on redisson_sc:{name}.
    let held = sem.acquire_many(2).unwrap();
    let mut sub = server.conn();
    let _: () = redis::cmd("SUBSCRIBE")
        .arg(format!("redisson_sc:{{{name}}}"))
        .query(&mut sub)
        .unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(held.release().unwrap());
    let msg = sub
        .as_pubsub()
        .get_message()
        .expect("our release is published");
    let count: i64 = msg.get_payload::<String>().unwrap().parse().unwrap();
    assert!(count >= 1, "Redisson's latch would not wake on {count}");
    assert!(java.try_acquire(2, Some(Duration::from_secs(10))).is_some());
    drop(sub);

    // Expired permits are reclaimed by either side: Java's 1 s permits by our acquire (1 s, not
    // less: the refusal right after must not be late on a busy machine)...
    let mut java = Java::new(&server, name);
    support::raw::del(&mut java.conn, name);
    support::raw::del(&mut java.conn, &java.timeout.clone());
    assert!(java.try_set_permits(1));
    let _dead = java.try_acquire(1, Some(Duration::from_secs(1))).unwrap();
    assert!(sem.try_acquire().unwrap_err().is_contention());
    let start = Instant::now();
    let p = sem.try_acquire_for(Duration::from_secs(10)).unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    // ...and ours (1 s, never released) by Java's.
    let short = client
        .semaphore(name)
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    drop(p);
    let lapsed = short.try_acquire().unwrap();
    std::mem::forget(lapsed);
    assert!(java.try_acquire(1, Some(Duration::from_secs(1))).is_none());
    assert!(wait_until(Duration::from_secs(10), || java
        .try_acquire(1, Some(Duration::from_secs(1)))
        .is_some()));
}

/// 3 Rust and 3 Java threads, `rounds` sections each of `hold`, on the 2-permit semaphore
/// `name` (set by Java), every permit with the lease `lease`: the most holders inside at once
/// (an in-process counter, as every holder runs here) and the releases that found their permit
/// lost.
fn mixed(
    server: &RedisServer,
    name: &str,
    lease: Duration,
    hold: Duration,
    rounds: u32,
) -> (i64, usize) {
    let mut setup = Java::new(server, name);
    assert!(setup.try_set_permits(2));
    let inside = AtomicI64::new(0);
    let max = AtomicI64::new(0);
    let lost = AtomicUsize::new(0);
    let section = || {
        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(n, Ordering::SeqCst);
        thread::sleep(hold);
        inside.fetch_sub(1, Ordering::SeqCst);
    };
    let client = client(server);
    thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let sem = client
                    .semaphore(name)
                    .ttl(lease)
                    .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(30))))
                    .build()
                    .unwrap();
                for _ in 0..rounds {
                    let p = sem.acquire().unwrap();
                    section();
                    if !p.release().unwrap() {
                        lost.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        for _ in 0..3 {
            s.spawn(|| {
                let mut java = Java::new(server, name);
                let mut done = 0;
                let deadline = Instant::now() + Duration::from_secs(30);
                while done < rounds && Instant::now() < deadline {
                    let Some(ids) = java.try_acquire(1, Some(lease)) else {
                        thread::sleep(Duration::from_millis(2));
                        continue;
                    };
                    section();
                    if !java.try_release(&ids[0]) {
                        lost.fetch_add(1, Ordering::SeqCst);
                    }
                    done += 1;
                }
                assert_eq!(done, rounds, "a Java holder starved");
            });
        }
    });
    (max.load(Ordering::SeqCst), lost.load(Ordering::SeqCst))
}

/// Java and Rust holders together on a 2-permit semaphore: never more than 2 inside, and the
/// count is 2 at the end, for both. The checker's negative control: permits whose lease (50 ms)
/// ends long before the section (150 ms) are reclaimed by either side mid-section, and the
/// same counter sees more than 2 inside.
#[test]
fn redisson_and_rust_holders_never_exceed_the_count() {
    init_logging();
    let server = RedisServer::start();
    let name = "mixed:load";
    let (max, lost) = mixed(
        &server,
        name,
        Duration::from_secs(10),
        Duration::from_millis(2),
        15,
    );
    assert!((1..=2).contains(&max), "{max} holders at once");
    assert_eq!(lost, 0);
    let mut setup = Java::new(&server, name);
    assert_eq!(setup.available(), 2);
    let sem = client(&server).semaphore(name).build().unwrap();
    assert_eq!(sem.available().unwrap(), 2);

    let (max, lost) = mixed(
        &server,
        "mixed:control",
        Duration::from_millis(50),
        Duration::from_millis(150),
        4,
    );
    eprintln!("negative control: {max} holders at once, {lost} releases found their permit lost");
    assert!(
        max > 2,
        "the checker missed permits held past their lease: {max}"
    );
    assert!(lost > 0);
}

/// Java hosts whose clock runs ahead of the server's by d reclaim our permits d early (they
/// score and reclaim on their own clock, we on the server's): a permit with an explicit lease
/// is lost; a watched permit survives a skew below two thirds of its lease (the negative
/// control of the same check: the one with the explicit lease is reported lost).
#[test]
fn a_java_clock_ahead_reclaims_early_what_the_watchdog_does_not_renew() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let name = "skew";
    let mut java = Java::new(&server, name);
    java.skew = 1_000;
    assert!(java.try_set_permits(2));
    let fixed = client
        .semaphore(name)
        .ttl(Duration::from_millis(1_500))
        .build()
        .unwrap();
    let watched = client
        .semaphore(name)
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let (f, w) = (fixed.try_acquire().unwrap(), watched.try_acquire().unwrap());
    // 1 s ahead: Java reclaims the fixed permit 1 s early, 0.5 s after it was taken.
    let start = Instant::now();
    assert!(wait_until(Duration::from_secs(5), || java.available() >= 1));
    let early = start.elapsed();
    assert!(early < Duration::from_millis(1_400), "{early:?}");
    assert!(
        !f.release().unwrap(),
        "a permit reclaimed early is reported lost"
    );
    // The watched one, renewed every second to 3 s ahead, is never within Java's 1 s, past
    // the 2 s at which Java would have reclaimed it unrenewed.
    while start.elapsed() < Duration::from_millis(3_500) {
        assert_eq!(java.available(), 1, "the watched permit was reclaimed");
        thread::sleep(Duration::from_millis(50));
    }
    assert!(!w.is_lost());
    assert!(w.release().unwrap());
    assert_eq!(java.available(), 2);
}

// ---------------------------------------------------------------------------------------------
// A holder killed; a server restarted.

const KILL_ENV: &str = "DLOCK_SEM_KILL_WORKER";
const KILL_TEST: &str = "semaphore_killed_holder";
const KILL_MARKER: &str = "DLOCK-SEM-HELD";
const KILL_NAME: &str = "killed:sem";
const KILL_LEASE: Duration = Duration::from_millis(1_500);

/// A worker that takes both permits, watched with a 1.5 s lease, reports their ids and waits
/// to be killed.
#[test]
fn semaphore_killed_holder() {
    if std::env::var_os(KILL_ENV).is_none() {
        return;
    }
    init_logging();
    let client = LockClient::open(std::env::var("DLOCK_URL").unwrap()).unwrap();
    let sem = client
        .semaphore(KILL_NAME)
        .watchdog_lease(KILL_LEASE)
        .build()
        .unwrap();
    let permit = sem.acquire_many(2).unwrap();
    worker::report(KILL_MARKER, &permit.ids().join(""));
    worker::hold_until_killed()
}

#[test]
fn a_killed_holders_permits_come_back_at_lease_end() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let sem = client
        .semaphore(KILL_NAME)
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(sem.try_set_permits(2).unwrap());
    let mut holder = WorkerProcess::spawn(
        KILL_TEST,
        &[(KILL_ENV, "1".to_owned()), ("DLOCK_URL", server.url())],
    );
    let ids = holder
        .wait_marker(KILL_MARKER, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("no permits reported ({e:?}): {:?}", holder.seen()));
    assert_eq!(ids.len(), 64);
    // Held past its first lease by the watchdog before the kill.
    let mut conn = server.conn();
    let first = permits_in(&mut conn, KILL_NAME)[0].1;
    assert!(wait_until(Duration::from_secs(10), || permits_in(
        &mut conn, KILL_NAME
    )
    .first()
    .is_some_and(|(_, s)| *s > first)));
    assert!(!holder.kill().success());
    let killed = Instant::now();
    assert!(sem.try_acquire().unwrap_err().is_contention());
    // The checker: both permits come back by themselves within the lease plus a margin.
    fn recovered(sem: &Semaphore, bound: Duration) -> Result<redis_dlock::Permit<'_>, LockError> {
        sem.try_acquire_many_for(2, bound)
    }
    let back = recovered(&sem, KILL_LEASE + Duration::from_secs(5)).expect("permits back");
    let after = killed.elapsed();
    assert!(after <= KILL_LEASE + Duration::from_secs(5), "{after:?}");
    let members = permits_in(&mut conn, KILL_NAME);
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|(m, _)| !ids.contains(&hex::encode(m))));
    assert!(back.release().unwrap());

    // Negative control: a dead Redisson holder that took its permits without a lease
    // (nonExpirableTimeout) never gives them back: the same checker reports it.
    let mut java = Java::new(&server, KILL_NAME);
    assert!(java.try_acquire(2, None).is_some());
    let e = recovered(&sem, Duration::from_millis(1_500)).unwrap_err();
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");
}

#[test]
fn a_server_restart_under_load_loses_the_count_until_it_is_set_again() {
    init_logging();
    let mut server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_secs(1)))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let build = || {
        client
            .semaphore("restart:sem")
            .ttl(Duration::from_secs(10))
            .retry(RetryPolicy::standard().max_wait(Some(Duration::from_millis(500))))
            .build()
            .unwrap()
    };
    assert!(build().try_set_permits(2).unwrap());
    let stop = AtomicBool::new(false);
    let (won, lost) = (AtomicUsize::new(0), AtomicUsize::new(0));
    // `lost`: releases that found their permit gone (those held across the restart).
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let sem = build();
                while !stop.load(Ordering::SeqCst) {
                    // Refusals and failures while the server is down are expected.
                    let Ok(p) = sem.acquire() else { continue };
                    won.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(5));
                    if !matches!(p.release(), Ok(true)) {
                        lost.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        assert!(wait_until(Duration::from_secs(20), || won
            .load(Ordering::SeqCst)
            >= 20));
        server.restart();
        // No persistence: the count is gone, nothing can be taken until it is set again.
        let sem = build();
        assert!(
            wait_until(Duration::from_secs(10), || sem.available().is_ok()),
            "the client does not come back"
        );
        let before = won.load(Ordering::SeqCst);
        assert!(sem.try_acquire().unwrap_err().is_contention());
        assert!(
            sem.try_set_permits(2).unwrap(),
            "the count survived a restart without data"
        );
        assert!(
            wait_until(Duration::from_secs(20), || won.load(Ordering::SeqCst)
                >= before + 20),
            "the holders do not recover"
        );
        stop.store(true, Ordering::SeqCst);
    });
    eprintln!(
        "{} sections, {} releases found their permit gone",
        won.load(Ordering::SeqCst),
        lost.load(Ordering::SeqCst)
    );
    assert_eq!(build().available().unwrap(), 2);
    let mut conn = server.conn();
    assert!(permits_in(&mut conn, "restart:sem").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Lost replies.

/// An acquire whose reply is lost is undone (its ids given back), and a release whose reply is
/// lost is sent again: either way the count is exactly what it was, never one more (giving an
/// id back twice gives it back once).
#[test]
fn lost_replies_leave_the_count_exact() {
    init_logging();
    let server = RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port());
    let client = LockClient::builder(proxy.url())
        .command_timeout(Some(Duration::from_millis(300)))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let sem = client
        .semaphore("replies")
        .ttl(Duration::from_secs(20))
        .build()
        .unwrap();
    assert!(sem.try_set_permits(2).unwrap());
    let mut conn = server.conn();
    let settled = |conn: &mut redis::Connection| {
        wait_until(Duration::from_secs(15), || {
            client.pending_cleanups() == 0 && permits_in(conn, "replies").is_empty()
        })
    };

    // The scripts loaded on the server: with replies dropped, a NOSCRIPT would go unseen.
    assert!(sem.acquire_many(2).unwrap().release().unwrap());

    let evalshas = |conn: &mut redis::Connection| support::raw::command_calls(conn, "evalsha");
    let count = |conn: &mut redis::Connection| support::raw::get_i64(conn, "replies");

    // The acquire runs, its reply is lost: the janitor gives its permit back (its tries
    // cannot reach the server while replies are lost, not even a new connection's greeting),
    // and the count is 2 again.
    let before = evalshas(&mut conn);
    proxy.set(support::proxy::Mode::DropReplies);
    assert!(sem.try_acquire().is_err());
    assert!(evalshas(&mut conn) > before, "the acquire did not run");
    assert_eq!(client.pending_cleanups(), 1);
    // The checker's control: until the undo runs, the count shows the permit taken.
    assert_eq!(count(&mut conn), 1, "the lost acquire took no permit");
    proxy.set(support::proxy::Mode::Pass);
    assert!(settled(&mut conn), "the lost acquire was not settled");
    assert_eq!(count(&mut conn), 2);

    // The release runs, its reply is lost: the janitor sends it again, which is answered (the
    // job is done) and gives back nothing more.
    let p = sem.acquire_many(2).unwrap();
    proxy.set(support::proxy::Mode::DropReplies);
    assert!(p.release().is_err());
    assert_eq!(count(&mut conn), 2, "the release did not run");
    assert_eq!(client.pending_cleanups(), 1);
    proxy.set(support::proxy::Mode::Pass);
    assert!(settled(&mut conn), "the release was not settled");
    assert_eq!(count(&mut conn), 2);
    assert_eq!(sem.available().unwrap(), 2);
}

// ---------------------------------------------------------------------------------------------
// Watched permits.

#[test]
fn watched_permits_are_renewed_and_a_lost_one_is_reported() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let mut conn = server.conn();
    // 2 s: a renewal (every 667 ms) late by a busy machine's stall still lands in time.
    let lease = Duration::from_secs(2);
    let lost = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&lost);
    let keys = Arc::new(Mutex::new(Vec::new()));
    let told = Arc::clone(&keys);
    let sem = client
        .semaphore("watched")
        .watchdog_lease(lease)
        .on_lost(move |l| {
            told.lock().unwrap().push(l.key().to_owned());
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    assert!(sem.try_set_permits(3).unwrap());
    let p = sem.acquire().unwrap();
    thread::sleep(lease * 5 / 2);
    assert!(!p.is_lost());
    assert!(p.valid_until() > Instant::now());
    let (_, score) = permits_in(&mut conn, "watched")[0].clone();
    assert!(
        score > server_ms(&mut conn),
        "the permit's score was not renewed"
    );
    assert!(
        p.release().unwrap(),
        "a watched permit held past its lease was lost"
    );
    assert_eq!(sem.available().unwrap(), 3);

    // Lost: its member removed (and, for another, the set deleted).
    let a = sem.acquire().unwrap();
    let id = hex::decode(&a.ids()[0]).unwrap();
    let _: i64 = redis::cmd("ZREM")
        .arg("{watched}:timeout")
        .arg(id)
        .query(&mut conn)
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || a.is_lost()));
    assert!(wait_until(Duration::from_secs(5), || lost
        .load(Ordering::SeqCst)
        == 1));
    assert!(!a.release().unwrap());
    let b = sem.acquire_many(2).unwrap();
    support::raw::del(&mut conn, "{watched}:timeout");
    assert!(wait_until(Duration::from_secs(10), || b.is_lost()));
    assert!(!b.release().unwrap());
    assert!(lost.load(Ordering::SeqCst) >= 2);
    assert!(keys
        .lock()
        .unwrap()
        .iter()
        .all(|k| k == "{watched}:timeout"));

    // Negative control: a permit of the same lease, not watched, held past it is lost.
    let fixed = client.semaphore("watched").ttl(lease).build().unwrap();
    sem.add_permits(2).unwrap();
    let f = fixed.acquire().unwrap();
    thread::sleep(lease * 2);
    assert!(f.is_lost());
    assert!(!f.release().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Cluster.

#[cfg(feature = "cluster")]
#[test]
fn a_semaphore_on_a_cluster() {
    init_logging();
    let cluster = support::Cluster::start(3);
    let client = LockClient::cluster_builder(&cluster.urls())
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Some(Duration::from_secs(2)))
        .build()
        .expect("cluster client");
    // One name in each third of the slots: one per master (the slots are split evenly).
    let mut names: Vec<String> = Vec::new();
    for i in 0.. {
        let name = format!("sem:{i}");
        let third = usize::from(cluster.keyslot(&name)) * 3 / support::CLUSTER_SLOTS;
        if names.len() == third {
            names.push(name);
        }
        if names.len() == 3 {
            break;
        }
    }
    names.push("{user7}:sem".to_owned());
    // 2 s: renewals slot by slot on a busy machine still land within the lease.
    let lease = Duration::from_secs(2);
    let sems: Vec<Semaphore> = names
        .iter()
        .map(|name| {
            client
                .semaphore(name)
                .watchdog_lease(lease)
                .build()
                .unwrap()
        })
        .collect();
    let mut held = Vec::new();
    for sem in &sems {
        assert!(sem.try_set_permits(2).unwrap());
        held.push(sem.acquire_many(2).unwrap());
        assert!(sem.try_acquire().unwrap_err().is_contention());
    }
    // Held past the lease: renewed by the watchdog, slot by slot.
    thread::sleep(lease * 2);
    for (sem, p) in sems.iter().zip(held) {
        assert!(!p.is_lost(), "{}: not renewed on the cluster", sem.name());
        assert!(p.release().unwrap());
        assert_eq!(sem.available().unwrap(), 2);
    }
    // A name whose braces form no hash tag would split Redisson's keys across slots.
    let e = client.semaphore("a{b").build().unwrap_err();
    assert!(matches!(e, LockError::Config { .. }), "{e:?}");
}

// ---------------------------------------------------------------------------------------------
// Replays and late replies.

/// Our script `text` as the library sends it: its include line replaced by the semaphore
/// scripts' opening (`lua/semaphore_reclaim.lua`).
fn ours(text: &str) -> String {
    text.replacen(
        "-- #include semaphore_reclaim.lua\n",
        include_str!("../lua/semaphore_reclaim.lua"),
        1,
    )
}

/// Runs our acquire script (`lua/semaphore_acquire.lua`) with `ids` on `name`, as the library
/// sends it: `[taken, count, wait]`.
fn acquire_script(conn: &mut redis::Connection, name: &str, ids: &[[u8; 16]]) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(ours(include_str!("../lua/semaphore_acquire.lua")))
        .arg(2)
        .arg(name)
        .arg(format!("{{{name}}}:timeout"))
        .arg(ids.len())
        .arg(10_000)
        .arg(format!("redisson_sc:{{{name}}}"));
    for id in ids {
        cmd.arg(&id[..]);
    }
    cmd.query(conn).unwrap()
}

/// An acquire sent again with the same ids (redis-rs resends a command that timed out on a
/// Cluster, the pool one whose connection dropped) takes its permits once: the count is not
/// decremented twice for permits the set holds once, which no release could give back. The
/// checker's control: new ids do take again. Released, the count is exactly what was set.
#[test]
fn an_acquire_sent_again_takes_its_permits_once() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let name = "resent";
    let sem = client
        .semaphore(name)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(sem.try_set_permits(5).unwrap());
    let mut conn = server.conn();
    let ids = [rand_id(), rand_id()];
    assert_eq!(acquire_script(&mut conn, name, &ids)[0], 1);
    assert_eq!(support::raw::get_i64(&mut conn, name), 3);
    assert_eq!(
        acquire_script(&mut conn, name, &ids)[0],
        1,
        "a resend is answered as taken"
    );
    assert_eq!(
        support::raw::get_i64(&mut conn, name),
        3,
        "a resend took its permits again"
    );
    // Control: other ids are another acquire, which the same check sees take.
    let more = [rand_id(), rand_id()];
    assert_eq!(acquire_script(&mut conn, name, &more)[0], 1);
    assert_eq!(support::raw::get_i64(&mut conn, name), 1);
    assert_eq!(permits_in(&mut conn, name).len(), 4);
    // Every permit given back: the count is 5 again, not 3.
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(ours(include_str!("../lua/semaphore_release.lua")))
        .arg(2)
        .arg(name)
        .arg(format!("{{{name}}}:timeout"))
        .arg(format!("redisson_sc:{{{name}}}"));
    for id in ids.iter().chain(&more) {
        cmd.arg(&id[..]);
    }
    let (given, late): (i64, i64) = cmd.query(&mut conn).unwrap();
    assert_eq!((given, late), (4, 0));
    assert_eq!(sem.available().unwrap(), 5);
}

/// A release that leaves the count at or below 0 (after a negative `add_permits`) publishes
/// nothing: Redisson's waiters release their latch by the number published, and a negative
/// one throws in its listener. The next positive change is the first message.
#[test]
fn a_release_publishes_no_count_below_one() {
    init_logging();
    let server = RedisServer::start();
    let client = client(&server);
    let name = "negative";
    let sem = client
        .semaphore(name)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(sem.try_set_permits(2).unwrap());
    let both = sem.acquire_many(2).unwrap();
    sem.add_permits(-3).unwrap();
    let mut sub = server.conn();
    let _: () = redis::cmd("SUBSCRIBE")
        .arg(format!("redisson_sc:{{{name}}}"))
        .query(&mut sub)
        .unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(both.release().unwrap());
    assert_eq!(support::raw::get_i64(&mut server.conn(), name), -1);
    sem.add_permits(2).unwrap();
    let first: String = sub
        .as_pubsub()
        .get_message()
        .expect("add_permits publishes")
        .get_payload()
        .unwrap();
    assert_eq!(first, "2", "a release published a count below 1");
}

/// A win whose reply comes back after the permit's lease (the server stopped meanwhile) hands
/// out no permit: the acquire fails with `LateReply`, gives the permit back, and counts no
/// lost hold (it never had one). Control: a permit handed out and released after its lease is
/// counted lost by the same stats.
#[test]
fn a_late_win_hands_out_no_permit_and_counts_no_loss() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_secs(10)))
        .build()
        .unwrap();
    let lease = Duration::from_millis(500);
    let sem = client.semaphore("late").ttl(lease).build().unwrap();
    assert!(sem.try_set_permits(2).unwrap());
    server.pause();
    let result = thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let sem = &sem;
        let attempt = s.spawn(move || {
            let _ = tx.send(());
            sem.try_acquire().map(|p| p.ids())
        });
        rx.recv().unwrap();
        // The attempt is on its way: its reply comes after the server is resumed.
        thread::sleep(lease * 3);
        server.resume();
        attempt.join().unwrap()
    });
    assert!(
        matches!(result, Err(LockError::LateReply { .. })),
        "{result:?}"
    );
    assert_eq!(
        sem.available().unwrap(),
        2,
        "the late permit was not given back"
    );
    assert_eq!(
        client.stats().lost_holds,
        0,
        "a permit never handed out counted lost"
    );
    // Control: the same stats count a permit held past its lease.
    let p = sem.try_acquire().unwrap();
    thread::sleep(lease * 2);
    assert!(!p.release().unwrap());
    assert_eq!(client.stats().lost_holds, 1);
}
