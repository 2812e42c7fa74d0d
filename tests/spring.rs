//! `Strategy::Spring` beside Java services on Spring Integration's `RedisLockRegistry`, against a
//! real `redis-server`.
//!
//! The foreign client ([`Registry`]) is written here from the registry's public behaviour, and
//! sends the registry's exact Lua scripts ([`java`]) by raw `EVAL` with the KEYS and ARGV it
//! passes: one UUID per registry instance, key `<registryKey>:<lockKey>`, `expireAfter` as
//! the lock's TTL; in its pub/sub mode a waiter that was refused waits up to `expireAfter` for
//! the lock key to be published on the registry's channel (pattern `<registryKey>-channel:*`
//! in newer versions, the channel `<registryKey>-channel` in earlier ones), then tries again.
//!
//! - threads of both on one key with a non-atomic counter: 0 lost updates, no two inside at
//!   once; the checker's negative control is a locker that ignores the lock;
//! - wake-ups both ways, both channel generations: a Spring waiter (`expireAfter` 60 s) woken
//!   by our release; ours woken by a Spring release (counted as a wake-up by the client, not
//!   found by the poll); negative controls: a Token release does not wake a Spring waiter, and
//!   a Spring spin-lock release (no message) does not count as a wake-up of ours;
//! - holders SIGKILLed mid-hold in child processes, taken over after their lease both ways,
//!   with the takeover check's negative control (an early takeover is reported);
//! - both at once: holders of each side SIGKILLed while threads of both contend (none enters
//!   before the dead hold's TTL ends, both go on after it); negative control as above.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, Lock, LockClient, LockError, SpringOptions, Strategy};
use support::fleet::{DeadHold, DeadHolds};
use support::worker;
use support::{init_logging, raw, wait_listening, wait_until, RedisServer, EVENT_TIMEOUT};

/// `RedisLockRegistry`'s scripts, verbatim: the Java text blocks of
/// spring-projects/spring-integration, `spring-integration-redis/src/main/java/org/
/// springframework/integration/redis/util/RedisLockRegistry.java` (the 6.x/7.x line; the
/// scripts are the same in both channel generations, which differ in the channel passed).
/// A text block keeps the tabs beyond its common indentation and ends with a newline.
mod java {
    /// `RedisLock.OBTAIN_LOCK_SCRIPT`. KEYS: the lock key; ARGV: clientId, expireAfter (ms).
    pub const OBTAIN_LOCK: &str = "local lockClientId = redis.call('GET', KEYS[1])\n\
if lockClientId == ARGV[1] then\n\
\tredis.call('PEXPIRE', KEYS[1], ARGV[2])\n\
\treturn true\n\
elseif not lockClientId then\n\
\tredis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n\
\treturn true\n\
end\n\
return false\n";

    /// `RedisPubSubLock.UNLINK_UNLOCK_SCRIPT`. KEYS: the lock key; ARGV: clientId, the
    /// channel.
    pub const PUBSUB_UNLOCK: &str = "local lockClientId = redis.call('GET', KEYS[1])\n\
if (lockClientId == ARGV[1] and redis.call('UNLINK', KEYS[1]) == 1) then\n\
\tredis.call('PUBLISH', ARGV[2], KEYS[1])\n\
\treturn true\n\
end\n\
return false\n";

    /// `RedisSpinLock.UNLINK_UNLOCK_SCRIPT`. KEYS: the lock key; ARGV: clientId.
    pub const SPIN_UNLOCK: &str = "local lockClientId = redis.call('GET', KEYS[1])\n\
if lockClientId == ARGV[1] then\n\
\tredis.call('UNLINK', KEYS[1])\n\
\treturn true\n\
end\n\
return false\n";
}

const REGISTRY: &str = "orders";
const COUNTER_KEY: &str = "spring:counter";

/// Which channel a registry's pub/sub releases use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Generation {
    /// 6.4.8+, 6.5.3+, 7.x: `<registryKey>-channel:<lock key>`, heard by a pattern
    /// subscription `<registryKey>-channel:*`.
    PerLock,
    /// Earlier pub/sub releases: `<registryKey>-channel`, heard by a channel subscription.
    Shared,
}

/// A random UUID in Java's `toString()` form (the registry's `clientId`).
fn random_uuid() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// One `RedisLockRegistry` instance (its id, its connection), for one lock key.
struct Registry {
    conn: redis::Connection,
    url: String,
    client_id: String,
    key: String,
    expire_after: Duration,
    generation: Generation,
}

impl Registry {
    fn new(url: &str, path: &str, expire_after: Duration, generation: Generation) -> Registry {
        Registry {
            conn: redis::Client::open(url).unwrap().get_connection().unwrap(),
            url: url.to_owned(),
            client_id: random_uuid(),
            key: format!("{REGISTRY}:{path}"),
            expire_after,
            generation,
        }
    }

    /// `obtainLock`: the obtain script; Lua `true` is 1, `false` nil.
    fn obtain(&mut self) -> bool {
        let reply: Option<i64> = redis::cmd("EVAL")
            .arg(java::OBTAIN_LOCK)
            .arg(1)
            .arg(&self.key)
            .arg(&self.client_id)
            .arg(self.expire_after.as_millis() as u64)
            .query(&mut self.conn)
            .expect("obtain script");
        reply == Some(1)
    }

    fn channel(&self) -> String {
        match self.generation {
            Generation::PerLock => format!("{REGISTRY}-channel:{}", self.key),
            Generation::Shared => format!("{REGISTRY}-channel"),
        }
    }

    /// The pub/sub mode's unlock: compare, `UNLINK`, publish the key. True if it was ours.
    fn unlock(&mut self) -> bool {
        let reply: Option<i64> = redis::cmd("EVAL")
            .arg(java::PUBSUB_UNLOCK)
            .arg(1)
            .arg(&self.key)
            .arg(&self.client_id)
            .arg(self.channel())
            .query(&mut self.conn)
            .expect("unlock script");
        reply == Some(1)
    }

    /// The spin-lock mode's unlock: no message.
    fn unlock_spin(&mut self) -> bool {
        let reply: Option<i64> = redis::cmd("EVAL")
            .arg(java::SPIN_UNLOCK)
            .arg(1)
            .arg(&self.key)
            .arg(&self.client_id)
            .query(&mut self.conn)
            .expect("unlock script");
        reply == Some(1)
    }

    /// The pub/sub mode's `lock()`: obtain; else listen on the registry's channel and, in a
    /// loop, obtain, wait up to `expireAfter` for this key's release message, obtain. Returns
    /// how many waits ended by the message (not by `expireAfter`).
    fn lock_pubsub(&mut self) -> usize {
        if self.obtain() {
            return 0;
        }
        let mut sub_conn = redis::Client::open(self.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let mut sub = sub_conn.as_pubsub();
        match self.generation {
            Generation::PerLock => sub.psubscribe(format!("{REGISTRY}-channel:*")).unwrap(),
            Generation::Shared => sub.subscribe(format!("{REGISTRY}-channel")).unwrap(),
        }
        let mut heard = 0;
        loop {
            if self.obtain() {
                return heard;
            }
            // future.get(expireAfter): completed by a message whose body is this lock key.
            let until = Instant::now() + self.expire_after;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                sub.set_read_timeout(Some(left)).unwrap();
                match sub.get_message() {
                    Ok(msg) if msg.get_payload_bytes() == self.key.as_bytes() => {
                        heard += 1;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.is_timeout() => break,
                    Err(e) => panic!("pub/sub: {e}"),
                }
            }
            if self.obtain() {
                return heard;
            }
        }
    }
}

fn spring_lock(client: &LockClient, path: &str) -> Lock {
    let spring = SpringOptions::new(REGISTRY);
    client
        .lock(spring.key(path))
        .strategy(Strategy::Spring(spring))
        .retry(redis_dlock::RetryPolicy::standard().max_wait(Some(Duration::from_secs(60))))
        .build()
        .expect("valid lock options")
}

// ---------------------------------------------------------------------------------------------
// Threads of both on one key

const THREADS: usize = 3;
const SECTIONS: usize = 60;

#[derive(Debug, Default)]
struct Report {
    lost_updates: i64,
    overlaps: usize,
    handoffs: usize,
}

/// One section of a run: its side (1: the registries, 2: ours), when it began and ended.
#[derive(Debug, Clone, Copy)]
struct Section {
    side: usize,
    start: Instant,
    end: Instant,
}

/// [`THREADS`] registries (pub/sub, newer channels) and [`THREADS`] threads of ours taking turns
/// on one key, each section a non-atomic increment, and what they saw.
struct Contenders {
    /// The registries' threads enter without the lock (a negative control).
    ignore: bool,
    /// Set to end the threads' loops early.
    stop: AtomicBool,
    barrier: Barrier,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    last: AtomicUsize,
    handoffs: AtomicUsize,
    sections: Mutex<Vec<Section>>,
}

impl Contenders {
    fn new(ignore: bool) -> Contenders {
        Contenders {
            ignore,
            stop: AtomicBool::new(false),
            barrier: Barrier::new(2 * THREADS),
            inside: AtomicUsize::new(0),
            overlaps: AtomicUsize::new(0),
            last: AtomicUsize::new(0),
            handoffs: AtomicUsize::new(0),
            sections: Mutex::new(Vec::new()),
        }
    }

    fn section(&self, side: usize, conn: &mut redis::Connection) {
        let start = Instant::now();
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let before = self.last.swap(side, Ordering::SeqCst);
        if before != 0 && before != side {
            self.handoffs.fetch_add(1, Ordering::SeqCst);
        }
        raw::bump_counter(conn, COUNTER_KEY);
        let end = Instant::now();
        self.inside.fetch_sub(1, Ordering::SeqCst);
        let section = Section { side, start, end };
        self.sections.lock().unwrap().push(section);
    }

    /// Starts the threads in `s` on the registry's `path`: each runs `per_thread` sections, or
    /// fewer if [`stop`](Self::stop) is set.
    fn spawn<'scope, 'env>(
        &'env self,
        s: &'scope thread::Scope<'scope, 'env>,
        server: &RedisServer,
        path: &str,
        lock: &'env Lock,
        per_thread: usize,
    ) {
        let go_on = move |i: usize| i < per_thread && !self.stop.load(Ordering::SeqCst);
        for _ in 0..THREADS {
            let mut reg = Registry::new(
                &server.url(),
                path,
                Duration::from_secs(10),
                Generation::PerLock,
            );
            let mut conn = server.conn();
            s.spawn(move || {
                self.barrier.wait();
                let mut i = 0;
                while go_on(i) {
                    if !self.ignore {
                        reg.lock_pubsub();
                    }
                    self.section(1, &mut conn);
                    if !self.ignore {
                        assert!(reg.unlock(), "the registry's unlock found its hold");
                    }
                    support::work(Duration::from_millis(1));
                    i += 1;
                }
            });
        }
        for _ in 0..THREADS {
            let mut conn = server.conn();
            s.spawn(move || {
                self.barrier.wait();
                let mut i = 0;
                while go_on(i) {
                    let guard = lock.lock().expect("our lock");
                    self.section(2, &mut conn);
                    assert!(guard.unlock().unwrap(), "our release found our hold");
                    support::work(Duration::from_millis(1));
                    i += 1;
                }
            });
        }
    }

    /// Sections of `side` that began at or after `from`.
    fn sections_from(&self, side: usize, from: Instant) -> usize {
        let sections = self.sections.lock().unwrap();
        sections
            .iter()
            .filter(|x| x.side == side && x.start >= from)
            .count()
    }

    /// What they saw, the counter read by `conn`.
    fn report(&self, conn: &mut redis::Connection) -> Report {
        let sections = self.sections.lock().unwrap().len() as i64;
        Report {
            lost_updates: sections - raw::get_i64(conn, COUNTER_KEY),
            overlaps: self.overlaps.load(Ordering::SeqCst),
            handoffs: self.handoffs.load(Ordering::SeqCst),
        }
    }
}

/// The threads of both sides run [`SECTIONS`] sections each; `ignore`: the registries' threads
/// enter without the lock (the negative control).
fn contention(ignore: bool) -> Report {
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let lock = spring_lock(&client, "contended");
    let threads = Contenders::new(ignore);
    let started = Instant::now();
    thread::scope(|s| threads.spawn(s, &server, "contended", &lock, SECTIONS));
    let mut conn = server.conn();
    let sections = (2 * THREADS * SECTIONS) as i64;
    let r = threads.report(&mut conn);
    eprintln!(
        "spring/contention (ignore={ignore}): {sections} sections in {:.2?}: {r:?}",
        started.elapsed()
    );
    r
}

#[test]
fn registry_and_our_threads_exclude_each_other() {
    init_logging();
    let r = contention(false);
    assert_eq!(r.overlaps, 0, "{r:?}");
    assert_eq!(r.lost_updates, 0, "{r:?}");
    assert!(r.handoffs > 0, "the two sides took turns: {r:?}");
}

#[test]
fn the_checker_reports_a_locker_that_ignores_the_lock() {
    init_logging();
    let caught = (0..5).any(|_| {
        let r = contention(true);
        r.overlaps > 0 || r.lost_updates > 0
    });
    assert!(
        caught,
        "five runs beside a locker that ignores the lock looked clean"
    );
}

// ---------------------------------------------------------------------------------------------
// Wake-ups both ways

/// The Spring waiters' `expireAfter` in the wake-up tests: a waiter not woken by a message
/// waits this long.
const EXPIRE_AFTER: Duration = Duration::from_secs(60);

/// Whether a Spring waiter that got the lock `elapsed` after the release (with `heard`
/// messages) was woken by it, not by the end of its `expireAfter` wait.
fn woken_by_release(elapsed: Duration, heard: usize, expire_after: Duration) -> bool {
    heard > 0 && elapsed < expire_after / 2
}

/// A Spring waiter of `generation` waits on a key held by `holder`; the holder releases: how
/// long after the release the waiter got the lock, and the messages it heard.
fn spring_waiter_after(
    server: &RedisServer,
    path: &str,
    holder: &Lock,
    generation: Generation,
    expire_after: Duration,
) -> (Duration, usize) {
    let guard = holder.try_lock().expect("free");
    let key = holder.key().to_owned();
    let mut reg = Registry::new(&server.url(), path, expire_after, generation);
    let mut probe = server.conn();
    let waiter = thread::spawn(move || {
        let heard = reg.lock_pubsub();
        let got = Instant::now();
        assert!(reg.unlock_spin(), "the waiter holds");
        (got, heard)
    });
    // Listening once the registry's subscription is up.
    let listening = |conn: &mut redis::Connection| match generation {
        Generation::PerLock => {
            let n: i64 = redis::cmd("PUBSUB")
                .arg("NUMPAT")
                .query(conn)
                .expect("NUMPAT");
            n > 0
        }
        Generation::Shared => raw::numsub(conn, &format!("{REGISTRY}-channel")) > 0,
    };
    assert!(support::wait_until(Duration::from_secs(20), || listening(
        &mut probe
    )));
    // Its attempt after subscribing (the DCL obtain) was refused: give it the time to be sent.
    support::work(Duration::from_millis(100));
    assert_eq!(raw::get(&mut probe, &key).as_deref(), Some(guard.value()));
    let released = Instant::now();
    assert!(guard.unlock().unwrap());
    let (got, heard) = waiter.join().unwrap();
    (got.saturating_duration_since(released), heard)
}

#[test]
fn our_release_wakes_spring_waiters_of_both_generations() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    for (generation, path) in [
        (Generation::PerLock, "wake-per-lock"),
        (Generation::Shared, "wake-shared"),
    ] {
        let ours = spring_lock(&client, path);
        let (elapsed, heard) = spring_waiter_after(&server, path, &ours, generation, EXPIRE_AFTER);
        eprintln!(
            "spring/wake {generation:?}: Spring waiter got the lock {elapsed:?} after our \
             release ({heard} messages heard; expireAfter {EXPIRE_AFTER:?})"
        );
        assert!(
            woken_by_release(elapsed, heard, EXPIRE_AFTER),
            "{generation:?}: {elapsed:?}, {heard} messages"
        );
    }
}

/// The negative control of [`woken_by_release`]: a Token lock on the registry's key releases
/// without the registry's message, so its waiter sits out `expireAfter` (3 s here).
#[test]
fn the_wake_check_reports_a_release_spring_waiters_do_not_hear() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let path = "wake-token";
    let token = client
        .lock(SpringOptions::new(REGISTRY).key(path))
        .strategy(Strategy::Token)
        .build()
        .unwrap();
    let expire_after = Duration::from_secs(3);
    let (elapsed, heard) =
        spring_waiter_after(&server, path, &token, Generation::PerLock, expire_after);
    eprintln!("spring/wake by a Token release: {elapsed:?}, {heard} messages");
    assert!(
        !woken_by_release(elapsed, heard, expire_after),
        "a Token release passed as a wake-up: {elapsed:?}, {heard} messages"
    );
}

/// Our waiter on a key a Spring service holds; the service releases by `unlock`: how long our
/// waiter took, and whether the client counted the release as a wake-up (a message woke its
/// waiter) rather than finding it by its poll.
fn our_waiter_after(
    server: &RedisServer,
    path: &str,
    generation: Generation,
    unlock: fn(&mut Registry) -> bool,
) -> (Duration, bool) {
    let client = LockClient::open(server.url()).unwrap();
    let lock = spring_lock(&client, path);
    let mut reg = Registry::new(&server.url(), path, EXPIRE_AFTER, generation);
    assert!(reg.obtain());
    let waiter = thread::scope(|s| {
        let waiter = s.spawn(|| {
            let guard = lock.lock().expect("taken after their release");
            let got = Instant::now();
            drop(guard);
            got
        });
        // Both channels subscribed, and its attempt after subscribing refused.
        wait_listening(&client, 2, 2);
        // The second channel's confirmation wakes the waiter for one more attempt (a release
        // may have been missed before it): that one refused too, the waiter only listens.
        let refused = client.stats().refusals;
        assert!(wait_until(EVENT_TIMEOUT, || client.stats().refusals > refused));
        let wakeups = client.stats().wakeups;
        let released = Instant::now();
        assert!(unlock(&mut reg));
        let got = waiter.join().unwrap();
        (
            got.saturating_duration_since(released),
            client.stats().wakeups > wakeups,
        )
    });
    waiter
}

#[test]
fn spring_releases_of_both_generations_wake_our_waiters() {
    init_logging();
    let server = RedisServer::start();
    for (generation, path) in [
        (Generation::PerLock, "woken-per-lock"),
        (Generation::Shared, "woken-shared"),
    ] {
        let (elapsed, woken) = our_waiter_after(&server, path, generation, Registry::unlock);
        eprintln!(
            "spring/woken {generation:?}: our waiter got the lock {elapsed:?} after the Spring \
             release (woken by its message: {woken})"
        );
        assert!(
            woken,
            "{generation:?}: not woken by the message ({elapsed:?})"
        );
    }
}

/// The negative control: a Spring spin-lock release publishes nothing; our waiter finds it by
/// its poll, which the check above does not count as a wake-up.
#[test]
fn the_wake_count_reports_a_release_that_publishes_nothing() {
    init_logging();
    let server = RedisServer::start();
    let (elapsed, woken) = our_waiter_after(
        &server,
        "woken-spin",
        Generation::PerLock,
        Registry::unlock_spin,
    );
    eprintln!("spring/woken by a spin-lock release: {elapsed:?}, woken {woken}");
    assert!(!woken, "a release without a message counted as a wake-up");
}

// ---------------------------------------------------------------------------------------------
// Holders SIGKILLed mid-hold, taken over after their lease, both ways

const WORKER_ENV: &str = "DLOCK_SPRING_WORKER";
const WORKER_TEST: &str = "spring_holder_process";
const LOCKED_MARKER: &str = "DLOCK-SPRING-LOCKED";
const DEAD_TTL: Duration = Duration::from_secs(1);
/// Set for a holder on a key others contend for: it polls until it wins.
const CONTENDED_ENV: &str = "DLOCK_SPRING_CONTENDED";

/// The holder process: takes the lock on the registry's `DLOCK_PATH` as `ours` (a Spring
/// lock with a 1 s ttl) or `spring` (a registry with `expireAfter` 1 s), on a free key (or,
/// with [`CONTENDED_ENV`], polling every millisecond), prints its value and holds until
/// killed. Does nothing in a normal test run.
#[test]
fn spring_holder_process() {
    let Ok(side) = std::env::var(WORKER_ENV) else {
        return;
    };
    init_logging();
    let url = std::env::var("DLOCK_URL").expect("DLOCK_URL");
    let path = std::env::var("DLOCK_PATH").expect("DLOCK_PATH");
    let contended = std::env::var_os(CONTENDED_ENV).is_some();
    let started = Instant::now();
    let poll = |what: &dyn std::fmt::Display| {
        assert!(
            contended && started.elapsed() < Duration::from_secs(20),
            "{side}: {what}"
        );
        support::work(Duration::from_millis(1));
    };
    let value = if side == "ours" {
        let client = LockClient::open(url.as_str()).unwrap();
        let spring = SpringOptions::new(REGISTRY);
        let lock = client
            .lock(spring.key(&path))
            .strategy(Strategy::Spring(spring))
            .ttl(DEAD_TTL)
            .build()
            .unwrap();
        let lease = loop {
            match lock.try_acquire() {
                Ok(lease) => break lease,
                Err(e) => poll(&e),
            }
        };
        let value = lease.value().to_vec();
        std::mem::forget(lease);
        value
    } else {
        let mut reg = Registry::new(&url, &path, DEAD_TTL, Generation::PerLock);
        while !reg.obtain() {
            poll(&"the key is held");
        }
        reg.client_id.clone().into_bytes()
    };
    worker::report(LOCKED_MARKER, &hex::encode(value));
    worker::hold_until_killed()
}

/// Starts a holder process, waits for its lock, kills it: the value it left, and the earliest
/// moment its key can expire (a reading of the clock before the `PTTL`, plus the `PTTL`).
fn killed_holder(server: &RedisServer, path: &str, side: &str) -> (Vec<u8>, Instant) {
    let (value, _, free_from) = killed_contended_holder(server, path, side, false);
    (value, free_from)
}

/// [`killed_holder`] (`contended`: polling for the lock), with when it reported its lock.
fn killed_contended_holder(
    server: &RedisServer,
    path: &str,
    side: &str,
    contended: bool,
) -> (Vec<u8>, Instant, Instant) {
    let mut envs = vec![
        (WORKER_ENV, side.to_owned()),
        ("DLOCK_URL", server.url()),
        ("DLOCK_PATH", path.to_owned()),
    ];
    if contended {
        envs.push((CONTENDED_ENV, "1".to_owned()));
    }
    let (value, reported) = worker::killed_holder_value_at(WORKER_TEST, &envs, LOCKED_MARKER, side);
    let mut conn = server.conn();
    let before = Instant::now();
    let pttl = raw::pttl(&mut conn, &format!("{REGISTRY}:{path}"));
    assert!(pttl > 0, "{side}: the dead hold has a TTL ({pttl})");
    (value, reported, before + Duration::from_millis(pttl as u64))
}

fn check_takeover(who: &str, won_at: Instant, free_from: Instant) -> Result<(), String> {
    if won_at >= free_from {
        Ok(())
    } else {
        Err(format!(
            "{who}: took over {:?} before the dead hold could end",
            free_from - won_at
        ))
    }
}

#[test]
fn the_takeover_check_reports_an_early_takeover() {
    init_logging();
    let server = RedisServer::start();
    let (_, free_from) = killed_holder(&server, "impatient", "ours");
    let mut conn = server.conn();
    raw::set(&mut conn, &format!("{REGISTRY}:impatient"), b"impatient");
    assert!(check_takeover("impatient", Instant::now(), free_from).is_err());
}

#[test]
fn killed_holders_are_taken_over_both_ways() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let mut conn = server.conn();

    // The registry takes over our dead hold once Redis expired it.
    let (dead, free_from) = killed_holder(&server, "dead-ours", "ours");
    let key = format!("{REGISTRY}:dead-ours");
    assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(&dead[..]));
    let mut reg = Registry::new(
        &server.url(),
        "dead-ours",
        Duration::from_secs(5),
        Generation::PerLock,
    );
    let start = Instant::now();
    while !reg.obtain() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never taken over"
        );
        support::work(Duration::from_millis(5));
    }
    check_takeover("the registry", Instant::now(), free_from).unwrap();
    // While it holds, ours is refused; its release frees the key.
    let ours = spring_lock(&client, "dead-ours");
    assert!(matches!(ours.try_lock(), Err(LockError::Held { .. })));
    assert!(reg.unlock());
    assert!(!raw::exists(&mut conn, &key));

    // Ours takes over the registry's dead hold.
    let (dead, free_from) = killed_holder(&server, "dead-spring", "spring");
    let key = format!("{REGISTRY}:dead-spring");
    assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(&dead[..]));
    let ours = spring_lock(&client, "dead-spring");
    let guard = ours
        .try_lock_for(Duration::from_secs(30))
        .expect("their dead lock taken over");
    check_takeover("ours", Instant::now(), free_from).unwrap();
    // A registry reads our value as another instance's live lock.
    let mut reg = Registry::new(
        &server.url(),
        "dead-spring",
        Duration::from_secs(5),
        Generation::PerLock,
    );
    assert!(!reg.obtain());
    assert!(guard.unlock().unwrap());
    assert!(!raw::exists(&mut conn, &key));
}

// ---------------------------------------------------------------------------------------------
// Both at once: holders SIGKILLed mid-hold while threads of both sides contend

/// How many sections of each side the combined run waits for before a holder, and after each
/// dead hold's end.
const SECTIONS_AROUND: usize = 5;

/// A combined run: [`Report`], and what its sections say about the dead holds.
#[derive(Debug)]
struct KilledRun {
    report: Report,
    holds: DeadHolds<Instant>,
}

/// While the threads of [`Contenders`] run (`ignore`: the registries' without the lock, the
/// negative control), a holder of ours, then a registry's, each a child process that polls for
/// the lock among them, is SIGKILLed mid-hold; after each dead hold's end, the run waits for
/// [`SECTIONS_AROUND`] sections of each side.
fn killed_mid_contention(ignore: bool) -> KilledRun {
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let path = "contended-killed";
    let lock = spring_lock(&client, path);
    let threads = Contenders::new(ignore);
    let started = Instant::now();
    let both_from = |from: Instant| {
        let go_on = wait_until(Duration::from_secs(30), || {
            (1..=2).all(|side| threads.sections_from(side, from) >= SECTIONS_AROUND)
        });
        assert!(
            go_on,
            "the threads stopped: {:?}",
            threads.report(&mut server.conn())
        );
    };
    let dead = thread::scope(|s| {
        threads.spawn(s, &server, path, &lock, usize::MAX);
        let mut dead: Vec<DeadHold<Instant>> = Vec::new();
        for side in ["ours", "spring"] {
            both_from(dead.last().map_or(started, |d| d.free_from));
            let (_, held_from, free_from) = killed_contended_holder(&server, path, side, true);
            dead.push(DeadHold {
                name: side.to_owned(),
                held_from,
                free_from,
            });
        }
        both_from(dead.last().map_or(started, |d| d.free_from));
        threads.stop.store(true, Ordering::SeqCst);
        dead
    });
    let report = threads.report(&mut server.conn());
    let sections: Vec<_> = threads
        .sections
        .into_inner()
        .unwrap()
        .iter()
        .map(|x| (x.side, x.start, x.end))
        .collect();
    let run = KilledRun {
        report,
        holds: DeadHolds::of(&sections, dead),
    };
    eprintln!(
        "spring/killed (ignore={ignore}): {:.2?}, {:?}, {} sections inside a dead hold, \
         sections (theirs, ours) after each: {:?}; {:?}",
        started.elapsed(),
        run.report,
        run.holds.early.len(),
        run.holds.after,
        run.holds.takeovers("the registries"),
    );
    run
}

/// Checks a combined run: no overlap, no lost update, no section inside a dead hold, and both
/// sides went on after each dead hold's end.
fn killed_run_failures(run: &KilledRun) -> Vec<String> {
    let mut failures = Vec::new();
    let r = &run.report;
    if r.overlaps > 0 || r.lost_updates > 0 {
        failures.push(format!("two inside at once: {r:?}"));
    }
    failures.extend(run.holds.failures("theirs"));
    failures
}

#[test]
fn holders_killed_while_both_contend() {
    init_logging();
    let run = killed_mid_contention(false);
    let failures = killed_run_failures(&run);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The negative control of [`killed_run_failures`]: the registries' threads enter without the
/// lock, during the dead holds too; the check must name the entries inside a dead hold.
#[test]
fn the_killed_run_check_reports_a_locker_that_ignores_the_lock() {
    init_logging();
    let run = killed_mid_contention(true);
    let failures = killed_run_failures(&run);
    assert!(
        failures.iter().any(|f| f.contains("inside a dead hold")),
        "entries beside dead holds were not reported: {failures:#?}"
    );
}
