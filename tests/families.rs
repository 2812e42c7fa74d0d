//! `Strategy::Classic(ClassicOptions::new())` beside the other legacy SETNX/GETSET families, on the same keys.
//!
//! Each family's client is re-implemented here with raw commands, from its public behaviour
//! and value format (not from the crate's code):
//!
//! - **redis-py's `Lock` before 2.10**: value `time.time() + timeout` as Python writes a float
//!   (`repr`), no Redis TTL. `SETNX`; else `float(GET or 1)`, and if that is before now,
//!   `float(GETSET or 1)`: won if *that* is before now (no equality check). Release: `GET`, and
//!   `DEL` if the stored value is not earlier than its own expiry.
//! - **retools' `Lock` up to 0.3**: value `time.time() + expires + 1` (a float), `EXPIRE key
//!   expires` after winning. `SETNX`; else `GET`, and if non-empty and `float(value) < now`,
//!   `GETSET`: won if the old value equals the one read. Release: `DEL` if its own deadline
//!   (`expires` after it won) has not passed.
//! - **jedis-lock after 1.0.0**: value `<uuid>:<now ms + expiry + 1>`, one UUID per lock object,
//!   no TTL. `SETNX`; else `GET`, parsed as `UUID.fromString(part 0)` and
//!   `Long.parseLong(part 1)` of `split(":")` (a value it cannot parse counts as expired); if
//!   expired *or its own UUID*, `GETSET`: won if the old value equals the one read. Release: `DEL`.
//! - **gorlock** (Go): value `time.Now().Add(timeout).UnixNano()`, `SET key v EX secs NX`;
//!   else `GET` parsed as an int64 (an error otherwise); if before now, `GETSET`: won if the old
//!   value equals the one read, then `EXPIRE key ceil(secs)`. Release: `DEL`.
//!
//! For each family: threads of both on one key with a non-atomic counter (0 lost updates, no
//! two inside at once), and holders SIGKILLed mid-hold in child processes, taken over after
//! their lease in both directions; and both at once (a Classic holder, then one of the family's,
//! SIGKILLed while the threads contend: none enters before the dead hold's end, both go on after
//! it). The checkers' negative control: a locker that ignores the lock, which they must report.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, Encoding, LockClient, LockError, RetryPolicy, Strategy};
use support::fleet::{DeadHold, DeadHolds};
use support::worker;
use support::{init_logging, raw, wait_until, RedisServer};

const COUNTER_KEY: &str = "families:counter";

fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// Python's `time.time()`.
fn now_secs() -> f64 {
    since_epoch().as_secs_f64()
}

/// Java's `System.currentTimeMillis()`.
fn now_ms() -> i64 {
    since_epoch().as_millis() as i64
}

/// Go's `time.Now().UnixNano()`.
fn now_ns() -> i64 {
    since_epoch().as_nanos() as i64
}

/// Python's `repr(float)`: the shortest digits that read back as the same float, `.0` for a
/// whole number (Rust's `{:?}` of an `f64` prints the same for timestamps).
fn py_repr(f: f64) -> String {
    format!("{f:?}")
}

/// Python's `float(value)`; panics where Python would raise.
fn py_float(value: &[u8]) -> f64 {
    let text = std::str::from_utf8(value).expect("float() of bytes");
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("float({text:?}) raises ValueError"))
}

/// Java's `UUID.fromString`: five `-`-separated hex groups, as two longs.
fn java_uuid(text: &str) -> Option<u128> {
    let parts: Vec<&str> = text.split('-').collect();
    let [a, b, c, d, e] = parts[..] else {
        return None;
    };
    let hex = |p: &str, bits: u32| {
        (!p.is_empty() && p.len() <= 16)
            .then(|| u128::from_str_radix(p, 16).ok())
            .flatten()
            .map(|v| v & ((1u128 << bits) - 1))
    };
    let msb = hex(a, 32)? << 32 | hex(b, 16)? << 16 | hex(c, 16)?;
    let lsb = hex(d, 16)? << 48 | hex(e, 48)?;
    Some(msb << 64 | lsb)
}

/// A random UUID in Java's `toString()` form.
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

// ---------------------------------------------------------------------------------------------
// The families

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    RedisPy,
    Retools,
    JedisLock,
    Gorlock,
    /// The negative control: "wins" every time without sending anything.
    Ignores,
}

impl Family {
    const ALL: [Family; 5] = [
        Family::RedisPy,
        Family::Retools,
        Family::JedisLock,
        Family::Gorlock,
        Family::Ignores,
    ];

    fn name(self) -> &'static str {
        match self {
            Family::RedisPy => "redis-py",
            Family::Retools => "retools",
            Family::JedisLock => "jedis-lock",
            Family::Gorlock => "gorlock",
            Family::Ignores => "ignores",
        }
    }

    fn named(name: &str) -> Family {
        Family::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("no family {name:?}"))
    }

    /// The encoding of Classic locks that share this family's keys.
    fn encoding(self) -> Encoding {
        match self {
            Family::RedisPy | Family::Retools => Encoding::FloatSeconds,
            Family::JedisLock => Encoding::UuidMs,
            Family::Gorlock => Encoding::Nanos,
            Family::Ignores => Encoding::Decimal,
        }
    }

    /// The expiry a value of this family's format stands for, in epoch ms, as the family
    /// reads it (`None`: it cannot read it).
    fn expiry_ms(self, value: &[u8]) -> Option<i64> {
        let text = std::str::from_utf8(value).ok()?;
        match self {
            Family::RedisPy | Family::Retools => text
                .parse::<f64>()
                .ok()
                .map(|s| (s * 1000.0).floor() as i64),
            Family::JedisLock => text.split(':').nth(1)?.parse().ok(),
            Family::Gorlock => text.parse::<i64>().ok().map(|ns| ns / 1_000_000),
            Family::Ignores => None,
        }
    }
}

/// One attempt's outcome.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// Won; the value written.
    Won(Vec<u8>),
    Busy,
    /// The client reported an error (gorlock, when the key vanished between its commands).
    Error(String),
}

/// One client of a family on one key, with its own connection.
struct Peer {
    family: Family,
    conn: redis::Connection,
    key: String,
    /// The lock's lifetime (redis-py `timeout`, retools `expires`, jedis-lock `expiryTimeMillis`,
    /// gorlock `LockTimeout`): whole seconds, as retools takes them.
    timeout: Duration,
    /// jedis-lock: the lock object's UUID.
    uuid: String,
    /// redis-py: `acquired_until`; retools: its deadline (epoch seconds).
    until: f64,
    /// How often this peer's `GETSET` replaced a value other than the one it had read
    /// ([`note_getset`](Self::note_getset)): redis-py and jedis-lock read a missing key as an
    /// expired lock and send `GETSET` on it, and every family's takeover of a stale value can
    /// lose the race to another client's.
    stray_overwrites: usize,
    /// The values those `GETSET`s replaced, and when (epoch ns, after the reply).
    overwritten: Vec<(Vec<u8>, i64)>,
}

impl Peer {
    fn new(server: &RedisServer, key: &str, family: Family, timeout: Duration) -> Peer {
        Peer {
            family,
            conn: server.conn(),
            key: key.to_owned(),
            timeout,
            uuid: random_uuid(),
            until: 0.0,
            stray_overwrites: 0,
            overwritten: Vec::new(),
        }
    }

    fn cmd<T: redis::FromRedisValue>(&mut self, name: &str, args: &[&[u8]]) -> T {
        let mut c = redis::cmd(name);
        c.arg(&self.key);
        for a in args {
            c.arg(*a);
        }
        c.query(&mut self.conn)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn try_lock(&mut self) -> Attempt {
        match self.family {
            Family::RedisPy => self.redis_py(),
            Family::Retools => self.retools(),
            Family::JedisLock => self.jedis_lock(),
            Family::Gorlock => self.gorlock(),
            Family::Ignores => Attempt::Won(Vec::new()),
        }
    }

    fn redis_py(&mut self) -> Attempt {
        let unixtime = now_secs();
        let timeout_at = unixtime + self.timeout.as_secs_f64();
        let value = py_repr(timeout_at).into_bytes();
        if self.cmd::<i64>("SETNX", &[&value]) == 1 {
            self.until = timeout_at;
            return Attempt::Won(value);
        }
        // float(self.redis.get(self.name) or 1)
        let or_one = |v: Option<Vec<u8>>| v.filter(|v| !v.is_empty()).map_or(1.0, |v| py_float(&v));
        let current: Option<Vec<u8>> = self.cmd("GET", &[]);
        if or_one(current.clone()) < unixtime {
            let old: Option<Vec<u8>> = self.cmd("GETSET", &[&value]);
            self.note_getset(current.as_deref(), old.as_deref());
            if or_one(old) < unixtime {
                self.until = timeout_at;
                return Attempt::Won(value);
            }
        }
        Attempt::Busy
    }

    fn retools(&mut self) -> Attempt {
        let expires = self.timeout.as_secs();
        let value = py_repr(now_secs() + expires as f64 + 1.0).into_bytes();
        let won = |p: &mut Peer| {
            p.until = now_secs() + expires as f64;
            let _: i64 = p.cmd("EXPIRE", &[expires.to_string().as_bytes()]);
        };
        if self.cmd::<i64>("SETNX", &[&value]) == 1 {
            won(self);
            return Attempt::Won(value);
        }
        let current: Option<Vec<u8>> = self.cmd("GET", &[]);
        if let Some(current) = current.filter(|c| !c.is_empty()) {
            if py_float(&current) < now_secs() {
                let old: Option<Vec<u8>> = self.cmd("GETSET", &[&value]);
                self.note_getset(Some(&current), old.as_deref());
                if old.as_deref() == Some(&current[..]) {
                    won(self);
                    return Attempt::Won(value);
                }
            }
        }
        Attempt::Busy
    }

    fn jedis_lock(&mut self) -> Attempt {
        let expiry = now_ms() + self.timeout.as_millis() as i64 + 1;
        let value = format!("{}:{expiry}", self.uuid).into_bytes();
        if self.cmd::<i64>("SETNX", &[&value]) == 1 {
            return Attempt::Won(value);
        }
        let current: Option<String> = self.cmd("GET", &[]);
        // Lock.fromString: any exception (null, no ':', a bad UUID or number) is NO_LOCK, a
        // lock of UUID 0 that expired in 1970.
        let (uuid, time) = current
            .as_deref()
            .and_then(|text| {
                let parts: Vec<&str> = text.split(':').collect();
                Some((
                    java_uuid(parts.first()?)?,
                    parts.get(1)?.parse::<i64>().ok()?,
                ))
            })
            .unwrap_or((0, 0));
        let mine = java_uuid(&self.uuid) == Some(uuid);
        if time < now_ms() || mine {
            let old: Option<String> = self.cmd("GETSET", &[&value]);
            self.note_getset(
                current.as_ref().map(|c| c.as_bytes()),
                old.as_ref().map(|o| o.as_bytes()),
            );
            if old.is_some() && old == current {
                return Attempt::Won(value);
            }
        }
        Attempt::Busy
    }

    fn gorlock(&mut self) -> Attempt {
        let timeout = self.timeout;
        let value = (now_ns() + timeout.as_nanos() as i64)
            .to_string()
            .into_bytes();
        // go-redis SetNX with an expiration: EX in whole seconds, PX otherwise.
        let mut set = redis::cmd("SET");
        set.arg(&self.key).arg(&value);
        if timeout.subsec_nanos() == 0 {
            set.arg("EX").arg(timeout.as_secs());
        } else {
            set.arg("PX").arg(timeout.as_millis() as u64);
        }
        let set: Option<String> = set.arg("NX").query(&mut self.conn).expect("SET NX");
        let int64 = |v: Option<Vec<u8>>| -> Result<i64, String> {
            let v = v.ok_or("redis: nil")?;
            let text = String::from_utf8_lossy(&v).into_owned();
            text.parse()
                .map_err(|_| format!("strconv.ParseInt: {text:?}"))
        };
        if set.is_none() {
            let current: Option<Vec<u8>> = self.cmd("GET", &[]);
            let expires = match int64(current.clone()) {
                Ok(n) => n,
                Err(e) => return Attempt::Error(e),
            };
            if expires < now_ns() {
                let fresh = (now_ns() + timeout.as_nanos() as i64).to_string();
                let old: Option<Vec<u8>> = self.cmd("GETSET", &[fresh.as_bytes()]);
                self.note_getset(current.as_deref(), old.as_deref());
                match int64(old) {
                    Ok(old) if old == expires => return self.gorlock_won(fresh.into_bytes()),
                    Ok(_) => {}
                    Err(e) => return Attempt::Error(e),
                }
            }
            return Attempt::Busy;
        }
        self.gorlock_won(value)
    }

    /// Counts a `GETSET` that replaced a value other than the one its `GET` read (`read`): the
    /// key was read as missing and another client's `SETNX` got in between (a blind `GETSET`),
    /// or another client's takeover of the same stale value got in first (a lost race). Either
    /// way the peer overwrote a live holder's value, by its own algorithm.
    fn note_getset(&mut self, read: Option<&[u8]>, found: Option<&[u8]>) {
        if let Some(old) = found.filter(|&old| Some(old) != read) {
            self.stray_overwrites += 1;
            self.overwritten.push((old.to_vec(), now_ns()));
        }
    }

    /// gorlock after a win: `EXPIRE key ceil(timeout in seconds)`.
    fn gorlock_won(&mut self, value: Vec<u8>) -> Attempt {
        let secs = self.timeout.as_secs_f64().ceil() as u64;
        let _: i64 = self.cmd("EXPIRE", &[secs.to_string().as_bytes()]);
        Attempt::Won(value)
    }

    fn unlock(&mut self) {
        match self.family {
            Family::RedisPy => {
                let existing: Option<Vec<u8>> = self.cmd("GET", &[]);
                let existing = existing
                    .filter(|v| !v.is_empty())
                    .map_or(1.0, |v| py_float(&v));
                if existing >= self.until {
                    let _: i64 = self.cmd("DEL", &[]);
                }
            }
            Family::Retools => {
                if now_secs() < self.until {
                    let _: i64 = self.cmd("DEL", &[]);
                }
            }
            Family::JedisLock | Family::Gorlock => {
                let _: i64 = self.cmd("DEL", &[]);
            }
            Family::Ignores => {}
        }
    }

    /// Polls [`try_lock`](Self::try_lock) every `interval` until it wins (an error counts as
    /// busy: gorlock's callers retry). Panics after `deadline`.
    fn lock_polling(&mut self, interval: Duration, deadline: Duration) -> Vec<u8> {
        let start = Instant::now();
        loop {
            if let Attempt::Won(value) = self.try_lock() {
                return value;
            }
            assert!(
                start.elapsed() < deadline,
                "{} got no lock within {deadline:?}",
                self.family.name()
            );
            support::work(interval);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A Classic lock in `family`'s format on `key` (without `key_ttl`: the value's expiry alone
/// ends a hold, so takeovers go through GETSET).
fn classic(client: &LockClient, key: &str, family: Family, ttl: Duration) -> Lock {
    client
        .lock(key)
        .strategy(Strategy::Classic(
            ClassicOptions::new().encoding(family.encoding()),
        ))
        .ttl(ttl)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(60))))
        .build()
        .expect("valid lock options")
}

// ---------------------------------------------------------------------------------------------
// Threads of both kinds on one key

const PEER_THREADS: usize = 3;
const CLASSIC_THREADS: usize = 3;
const SECTIONS_PER_THREAD: usize = 100;
/// The peers' lifetime in these runs: no hold expires during a section (each takes well under
/// a millisecond), and a redis-py value left at the key by its `GETSET` on a missing key (see
/// [`Peer::stray_overwrites`]), which nobody holds and nobody releases, keeps everyone out for
/// this long (a few times per run).
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// What the checker saw in one run.
#[derive(Debug, Default)]
struct Report {
    sections: usize,
    /// Sections minus the counter's value: increments lost to overlapping sections.
    lost_updates: i64,
    /// Times a section started while another was inside.
    overlaps: usize,
    handoffs: usize,
    /// Classic unlocks that returned `Ok(false)`.
    classic_lost: usize,
    /// The peers' `GETSET`s that replaced a value other than the one they had read: a blind
    /// one on a key read as missing, or a takeover race lost ([`Peer::stray_overwrites`]).
    stray_overwrites: usize,
    /// Our own Classic threads' `GETSET` takeovers of one stale value that lost the race and
    /// overwrote the winner's value (the legacy flaw, counted by the client's stats): the
    /// winner's unlock then finds its hold lost, as it should.
    classic_overwrites: usize,
}

impl Report {
    fn clean(&self) -> bool {
        self.lost_updates == 0 && self.overlaps == 0 && self.classic_lost == 0
    }
}

/// One section of a run: its side (1: theirs, 2: ours) and when it began and ended (epoch ns,
/// read inside it).
#[derive(Debug, Clone, Copy)]
struct Section {
    side: usize,
    start: i64,
    end: i64,
}

/// [`PEER_THREADS`] threads of `family` and [`CLASSIC_THREADS`] Classic threads taking turns on
/// one key, each section a non-atomic increment of a counter, and what they saw.
struct Contenders {
    family: Family,
    key: String,
    /// Their threads enter without the lock (a negative control).
    ignore: bool,
    /// Set to end the threads' loops early.
    stop: AtomicBool,
    barrier: Barrier,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    last_side: AtomicUsize,
    handoffs: AtomicUsize,
    classic_lost: AtomicUsize,
    blind: AtomicUsize,
    /// Every value the peers' stray `GETSET`s replaced, and when ([`Peer::overwritten`]).
    overwritten: Mutex<Vec<(Vec<u8>, i64)>>,
    sections: Mutex<Vec<Section>>,
}

impl Contenders {
    fn new(family: Family, key: &str, ignore: bool) -> Contenders {
        Contenders {
            family,
            key: key.to_owned(),
            ignore,
            stop: AtomicBool::new(false),
            barrier: Barrier::new(PEER_THREADS + CLASSIC_THREADS),
            inside: AtomicUsize::new(0),
            overlaps: AtomicUsize::new(0),
            last_side: AtomicUsize::new(0),
            handoffs: AtomicUsize::new(0),
            classic_lost: AtomicUsize::new(0),
            blind: AtomicUsize::new(0),
            overwritten: Mutex::new(Vec::new()),
            sections: Mutex::new(Vec::new()),
        }
    }

    fn section(&self, side: usize, conn: &mut redis::Connection) {
        let start = now_ns();
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let before = self.last_side.swap(side, Ordering::SeqCst);
        if before != 0 && before != side {
            self.handoffs.fetch_add(1, Ordering::SeqCst);
        }
        raw::bump_counter(conn, COUNTER_KEY);
        let end = now_ns();
        self.inside.fetch_sub(1, Ordering::SeqCst);
        let section = Section { side, start, end };
        self.sections.lock().unwrap().push(section);
    }

    /// Starts the threads in `s`: each runs `per_thread` sections, or fewer if
    /// [`stop`](Self::stop) is set; lifetimes of 5 s (ours) and [`PEER_TIMEOUT`] (theirs), so
    /// that no hold expires during a section.
    fn spawn<'scope, 'env>(
        &'env self,
        s: &'scope thread::Scope<'scope, 'env>,
        server: &RedisServer,
        lock: &'env Lock,
        per_thread: usize,
    ) {
        let go_on = move |i: usize| i < per_thread && !self.stop.load(Ordering::SeqCst);
        for _ in 0..PEER_THREADS {
            let mut peer = Peer::new(server, &self.key, self.family, PEER_TIMEOUT);
            let mut conn = server.conn();
            s.spawn(move || {
                self.barrier.wait();
                let mut i = 0;
                while go_on(i) {
                    if !self.ignore {
                        peer.lock_polling(Duration::from_millis(2), Duration::from_secs(60));
                    }
                    self.section(1, &mut conn);
                    if !self.ignore {
                        peer.unlock();
                    }
                    support::work(Duration::from_millis(1));
                    i += 1;
                }
                self.blind
                    .fetch_add(peer.stray_overwrites, Ordering::SeqCst);
                self.overwritten
                    .lock()
                    .unwrap()
                    .append(&mut peer.overwritten);
            });
        }
        for t in 0..CLASSIC_THREADS {
            let mut conn = server.conn();
            s.spawn(move || {
                self.barrier.wait();
                let mut i = 0;
                while go_on(i) {
                    let guard = lock
                        .lock()
                        .unwrap_or_else(|e| panic!("Classic thread {t}, section {i}: {e}"));
                    self.section(2, &mut conn);
                    if !guard.unlock().unwrap() {
                        self.classic_lost.fetch_add(1, Ordering::SeqCst);
                    }
                    support::work(Duration::from_millis(1));
                    i += 1;
                }
            });
        }
    }

    /// Sections of `side` that began at or after `from` (epoch ns).
    fn sections_from(&self, side: usize, from: i64) -> usize {
        let sections = self.sections.lock().unwrap();
        sections
            .iter()
            .filter(|x| x.side == side && x.start >= from)
            .count()
    }

    /// What they saw, the counter read by `conn`.
    fn report(&self, conn: &mut redis::Connection) -> Report {
        let sections = self.sections.lock().unwrap().len();
        Report {
            sections,
            lost_updates: sections as i64 - raw::get_i64(conn, COUNTER_KEY),
            overlaps: self.overlaps.load(Ordering::SeqCst),
            handoffs: self.handoffs.load(Ordering::SeqCst),
            classic_lost: self.classic_lost.load(Ordering::SeqCst),
            stray_overwrites: self.blind.load(Ordering::SeqCst),
            // Set by the caller, which has the client.
            classic_overwrites: 0,
        }
    }
}

/// The threads of both kinds run [`SECTIONS_PER_THREAD`] sections each.
fn contention(family: Family) -> Report {
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let key = format!("families:{}", family.name());
    let lock = classic(&client, &key, family, Duration::from_secs(5));
    let threads = Contenders::new(family, &key, false);
    let started = Instant::now();
    thread::scope(|s| threads.spawn(s, &server, &lock, SECTIONS_PER_THREAD));
    let mut conn = server.conn();
    let mut report = threads.report(&mut conn);
    report.classic_overwrites = client.stats().getset_overwrites as usize;
    eprintln!(
        "families/contention/{}: {} sections in {:.2?}, {} hand-offs between the two kinds, \
         {} lost updates, {} overlaps, {} Classic holds lost, \
         {} stray GETSET overwrites by the peers",
        family.name(),
        report.sections,
        started.elapsed(),
        report.handoffs,
        report.lost_updates,
        report.overlaps,
        report.classic_lost,
        report.stray_overwrites,
    );
    if family != Family::Ignores {
        assert_eq!(
            raw::get(&mut conn, &key),
            None,
            "the key is free at the end"
        );
    }
    report
}

/// Checks a run: no lost update, no two inside at once (nor, `early`, inside a dead hold), every
/// Classic unlock `Ok(true)`; except what the peers' own flaw explains (docs/compatibility.md):
/// a `GETSET` on a key read as missing, or a takeover that lost the race to another client's,
/// replaces a holder's value (that holder's unlock then returns `Ok(false)`), and jedis-lock,
/// whose next attempt re-enters that value of its own UUID, may then enter beside the holder.
/// Each such failure must come with one of those overwrites. The failures left, described.
fn exclusion_failures(family: Family, r: &Report, early: usize) -> Vec<String> {
    let blind = r.stray_overwrites;
    let (inside_another, lost_updates) = match family {
        Family::JedisLock => (
            (r.overlaps + early).saturating_sub(blind),
            r.lost_updates - blind as i64,
        ),
        _ => (r.overlaps + early, r.lost_updates),
    };
    let name = family.name();
    let mut failures = Vec::new();
    if inside_another > 0 {
        failures.push(format!(
            "{name}: entered while another held (overlaps, or inside a dead hold: {early}): {r:?}"
        ));
    }
    if lost_updates > 0 {
        failures.push(format!("{name}: lost updates: {r:?}"));
    }
    if r.classic_lost > blind + r.classic_overwrites {
        failures.push(format!("{name}: Classic holds lost: {r:?}"));
    }
    failures
}

fn excludes_each_other(family: Family) {
    init_logging();
    let r = contention(family);
    let failures = exclusion_failures(family, &r, 0);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn redis_py_and_classic_threads_exclude_each_other() {
    excludes_each_other(Family::RedisPy);
}

#[test]
fn retools_and_classic_threads_exclude_each_other() {
    excludes_each_other(Family::Retools);
}

#[test]
fn jedis_lock_and_classic_threads_exclude_each_other() {
    excludes_each_other(Family::JedisLock);
}

#[test]
fn gorlock_and_classic_threads_exclude_each_other() {
    excludes_each_other(Family::Gorlock);
}

/// The negative control of the checker above: a "locker" that enters without the lock. The
/// checker must report it (lost updates or overlapping sections) within a few runs.
#[test]
fn the_checker_reports_a_locker_that_ignores_the_lock() {
    init_logging();
    let caught = (0..5).any(|_| !contention(Family::Ignores).clean());
    assert!(
        caught,
        "five runs beside a locker that ignores the lock looked clean"
    );
}

// ---------------------------------------------------------------------------------------------
// Holders SIGKILLed mid-hold, taken over after their lease, both ways

const WORKER_ENV: &str = "DLOCK_FAMILIES_WORKER";
const WORKER_TEST: &str = "families_holder_process";
const LOCKED_MARKER: &str = "DLOCK-FAMILIES-LOCKED";
/// The dead holders' lifetime.
const DEAD_TTL: Duration = Duration::from_secs(1);

/// Set for a holder on a key others contend for: it polls until it wins.
const CONTENDED_ENV: &str = "DLOCK_FAMILIES_CONTENDED";

/// The holder process: takes the lock on `DLOCK_KEY` as `classic:<family>` (a Classic lock in
/// that family's format) or `<family>` (that family's client), on a free key (or, with
/// [`CONTENDED_ENV`], polling every millisecond), prints the value it stored, and holds until
/// killed. Does nothing in a normal test run.
#[test]
fn families_holder_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    init_logging();
    let url = std::env::var("DLOCK_URL").expect("DLOCK_URL");
    let key = std::env::var("DLOCK_KEY").expect("DLOCK_KEY");
    let contended = std::env::var_os(CONTENDED_ENV).is_some();
    let value = match spec.strip_prefix("classic:") {
        Some(family) => {
            let client = LockClient::open(url.as_str()).unwrap();
            let lock = classic(&client, &key, Family::named(family), DEAD_TTL);
            // Kept past the end of this block: the process exits without releasing it.
            let started = Instant::now();
            let lease = loop {
                match lock.try_acquire() {
                    Ok(lease) => break lease,
                    Err(e) if contended && started.elapsed() < Duration::from_secs(20) => {
                        log::debug!("the holder waits: {e}");
                        support::work(Duration::from_millis(1));
                    }
                    Err(e) => panic!("classic:{family}: {e}"),
                }
            };
            let value = lease.value().to_vec();
            std::mem::forget(lease);
            value
        }
        None => {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut peer = Peer {
                family: Family::named(&spec),
                conn: client.get_connection().unwrap(),
                key,
                timeout: DEAD_TTL,
                uuid: random_uuid(),
                until: 0.0,
                stray_overwrites: 0,
                overwritten: Vec::new(),
            };
            if contended {
                peer.lock_polling(Duration::from_millis(1), Duration::from_secs(20))
            } else {
                match peer.try_lock() {
                    Attempt::Won(value) => value,
                    other => panic!("{spec} on a free key: {other:?}"),
                }
            }
        }
    };
    worker::report(LOCKED_MARKER, &hex::encode(value));
    worker::hold_until_killed()
}

/// Starts a holder process of `spec` on `key`, waits for its lock, kills it: the value it left.
fn killed_holder(server: &RedisServer, key: &str, spec: &str) -> Vec<u8> {
    worker::killed_holder_value(
        WORKER_TEST,
        &[
            (WORKER_ENV, spec.to_owned()),
            ("DLOCK_URL", server.url()),
            ("DLOCK_KEY", key.to_owned()),
        ],
        LOCKED_MARKER,
        spec,
    )
}

/// The check of every takeover below: a lock taken at `won_at` (epoch ms, read after the win)
/// was free by then, `free_from` being the earliest moment it could be free.
fn check_takeover(who: &str, won_at: i64, free_from: i64) -> Result<(), String> {
    if won_at >= free_from {
        Ok(())
    } else {
        Err(format!(
            "{who}: took over at {won_at}, {} ms before the dead hold ended ({free_from})",
            free_from - won_at
        ))
    }
}

/// The negative control of [`check_takeover`]: a client that does not wait for the dead
/// holder's expiry (a plain `SET` at once) is reported.
#[test]
fn the_takeover_check_reports_an_early_takeover() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "families:impatient";
    let family = Family::JedisLock;
    let dead = killed_holder(&server, key, &format!("classic:{}", family.name()));
    let expiry = family.expiry_ms(&dead).expect("our value");
    raw::set(&mut conn, key, b"impatient");
    let won_at = now_ms();
    assert!(
        check_takeover("impatient", won_at, expiry).is_err(),
        "a takeover {} ms after a 1 s hold began passed the check",
        won_at - (expiry - DEAD_TTL.as_millis() as i64)
    );
}

/// Both ways: the family's client takes over a dead Classic holder's lock, by `GETSET` once its
/// expiry passed; a Classic lock takes over a dead client's lock once its expiry passed (or
/// Redis expired its key, for the families that set a TTL).
fn killed_holders_are_taken_over_both_ways(family: Family) {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();

    // Theirs takes over our dead hold.
    let key = format!("families:dead-classic:{}", family.name());
    let dead = killed_holder(&server, &key, &format!("classic:{}", family.name()));
    assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(&dead[..]));
    assert_eq!(
        raw::pttl(&mut conn, &key),
        -1,
        "no Redis TTL: the value alone expires"
    );
    let expiry = family
        .expiry_ms(&dead)
        .unwrap_or_else(|| panic!("{}: cannot read our value {dead:?}", family.name()));
    let getsets = raw::command_calls(&mut conn, "getset");
    let mut peer = Peer::new(&server, &key, family, Duration::from_secs(5));
    let theirs = peer.lock_polling(Duration::from_millis(5), Duration::from_secs(30));
    check_takeover(family.name(), now_ms(), expiry).unwrap();
    assert!(
        raw::command_calls(&mut conn, "getset") > getsets,
        "won by GETSET"
    );
    assert_eq!(raw::get(&mut conn, &key), Some(theirs.clone()));
    // While they hold, Classic is refused.
    let lock = classic(&client, &key, family, Duration::from_secs(1));
    assert!(matches!(lock.try_lock(), Err(LockError::Held { .. })));
    peer.unlock();
    assert!(
        !raw::exists(&mut conn, &key),
        "{}: their release",
        family.name()
    );

    // Ours takes over their dead hold.
    let key = format!("families:dead-{}", family.name());
    let before_ttl = now_ms();
    let dead = killed_holder(&server, &key, family.name());
    let pttl = raw::pttl(&mut conn, &key);
    let expiry = family.expiry_ms(&dead).expect("their own format");
    // The earliest the lock may go: the value's expiry, or the key's own expiry (no earlier
    // than the PTTL counted from a reading taken before it).
    let free_from = if pttl >= 0 {
        expiry.min(before_ttl + pttl)
    } else {
        expiry
    };
    let lock = classic(&client, &key, family, Duration::from_secs(1));
    let guard = lock
        .try_lock_for(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{}: their dead lock was not taken over: {e}", family.name()));
    check_takeover("Classic", now_ms(), free_from).unwrap();
    assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));
    // Their client reads our value as a live lock.
    let mut peer = Peer::new(&server, &key, family, Duration::from_secs(5));
    assert_eq!(peer.try_lock(), Attempt::Busy, "{}", family.name());
    assert!(guard.unlock().unwrap());
    assert!(!raw::exists(&mut conn, &key));
}

#[test]
fn redis_py_killed_holders_are_taken_over_both_ways() {
    killed_holders_are_taken_over_both_ways(Family::RedisPy);
}

#[test]
fn retools_killed_holders_are_taken_over_both_ways() {
    killed_holders_are_taken_over_both_ways(Family::Retools);
}

#[test]
fn jedis_lock_killed_holders_are_taken_over_both_ways() {
    killed_holders_are_taken_over_both_ways(Family::JedisLock);
}

#[test]
fn gorlock_killed_holders_are_taken_over_both_ways() {
    killed_holders_are_taken_over_both_ways(Family::Gorlock);
}

// ---------------------------------------------------------------------------------------------
// Both at once: holders SIGKILLed mid-hold while threads of both kinds contend

/// How many sections of each side the combined run waits for before a holder, and after each
/// dead hold's end.
const SECTIONS_AROUND: usize = 5;

/// A combined run: [`Report`], and what its sections say about the dead holds (times in epoch
/// ns).
#[derive(Debug)]
struct KilledRun {
    report: Report,
    holds: DeadHolds<i64>,
}

/// While the threads of [`Contenders`] run (`ignore`: theirs without the lock, the negative
/// control), a Classic holder in `family`'s format, then a holder of `family`'s client, each a
/// child process that polls for the lock among them, is SIGKILLed mid-hold; after each dead
/// hold's end, the run waits for [`SECTIONS_AROUND`] sections of each side.
fn killed_mid_contention(family: Family, ignore: bool) -> KilledRun {
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let key = format!("families:killed:{}", family.name());
    let lock = classic(&client, &key, family, Duration::from_secs(5));
    let threads = Contenders::new(family, &key, ignore);
    let mut conn = server.conn();
    let started = Instant::now();
    let both_from = |from: i64| {
        let go_on = wait_until(Duration::from_secs(30), || {
            (1..=2).all(|side| threads.sections_from(side, from) >= SECTIONS_AROUND)
        });
        assert!(
            go_on,
            "the threads stopped: {:?}",
            threads.report(&mut server.conn())
        );
    };
    let (mut dead, values) = thread::scope(|s| {
        threads.spawn(s, &server, &lock, usize::MAX);
        let mut dead = Vec::new();
        let mut values = Vec::new();
        for spec in [
            format!("classic:{}", family.name()),
            family.name().to_owned(),
        ] {
            both_from(dead.last().map_or(0, |d: &DeadHold<i64>| d.free_from));
            let (value, reported) = worker::killed_holder_value_at(
                WORKER_TEST,
                &[
                    (WORKER_ENV, spec.clone()),
                    (CONTENDED_ENV, "1".to_owned()),
                    ("DLOCK_URL", server.url()),
                    ("DLOCK_KEY", key.clone()),
                ],
                LOCKED_MARKER,
                &spec,
            );
            let before_ttl = now_ns();
            let pttl = raw::pttl(&mut conn, &key);
            let expiry = family
                .expiry_ms(&value)
                .unwrap_or_else(|| panic!("{spec}: cannot read {value:?}"));
            let mut free_from = expiry * 1_000_000;
            if pttl >= 0 {
                free_from = free_from.min(before_ttl + pttl * 1_000_000);
            }
            let held_from = now_ns() - reported.elapsed().as_nanos() as i64;
            values.push(value);
            dead.push(DeadHold {
                name: spec,
                held_from,
                free_from,
            });
        }
        both_from(dead.last().map_or(0, |d| d.free_from));
        threads.stop.store(true, Ordering::SeqCst);
        (dead, values)
    });
    // A peer's stray `GETSET` (jedis-lock, redis-py: sent after reading the key as missing)
    // that replaced a dead hold's value ended that hold then: the key held the peer's value
    // from that moment, by the peer's own algorithm, not by a takeover of ours or theirs.
    for (d, value) in dead.iter_mut().zip(&values) {
        let overwritten = threads.overwritten.lock().unwrap();
        if let Some(&(_, at)) = overwritten.iter().find(|(old, _)| old == value) {
            eprintln!(
                "{}: its value was replaced by a peer's stray GETSET",
                d.name
            );
            d.free_from = d.free_from.min(at);
        }
    }
    let mut report = threads.report(&mut conn);
    report.classic_overwrites = client.stats().getset_overwrites as usize;
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
        "families/killed/{} (ignore={ignore}): {:.2?}, {:?}, {} sections inside a dead hold, \
         sections (theirs, ours) after each: {:?}; {:?}",
        family.name(),
        started.elapsed(),
        run.report,
        run.holds.early.len(),
        run.holds.after,
        run.holds.takeovers("theirs"),
    );
    run
}

/// Checks a combined run: [`exclusion_failures`] (a section inside a dead hold counts as an
/// overlap), and both sides went on after each dead hold's end.
fn killed_run_failures(family: Family, run: &KilledRun) -> Vec<String> {
    let mut failures = exclusion_failures(family, &run.report, run.holds.early.len());
    failures.extend(run.holds.failures("theirs"));
    failures
}

fn killed_mid_contention_both_ways(family: Family) {
    init_logging();
    let run = killed_mid_contention(family, false);
    let failures = killed_run_failures(family, &run);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn redis_py_holders_killed_while_both_contend() {
    killed_mid_contention_both_ways(Family::RedisPy);
}

#[test]
fn retools_holders_killed_while_both_contend() {
    killed_mid_contention_both_ways(Family::Retools);
}

#[test]
fn jedis_lock_holders_killed_while_both_contend() {
    killed_mid_contention_both_ways(Family::JedisLock);
}

#[test]
fn gorlock_holders_killed_while_both_contend() {
    killed_mid_contention_both_ways(Family::Gorlock);
}

/// The negative control of [`killed_run_failures`]: gorlock's threads enter without the lock,
/// during the dead holds too; the check must name the entries inside a dead hold.
#[test]
fn the_killed_run_check_reports_a_locker_that_ignores_the_lock() {
    init_logging();
    let run = killed_mid_contention(Family::Gorlock, true);
    let failures = killed_run_failures(Family::Gorlock, &run);
    assert!(
        failures.iter().any(|f| f.contains("inside a dead hold")),
        "entries beside dead holds were not reported: {failures:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// One family per key: what a key shared by two families does

#[test]
fn a_key_shared_by_two_families() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    let live = Duration::from_secs(30);

    // A live decimal Classic lock: jedis-lock after 1.0.0 cannot parse it, counts it as expired
    // and takes it over; gorlock reads its milliseconds as nanoseconds (1970) and does too.
    for family in [Family::JedisLock, Family::Gorlock] {
        let key = format!("families:shared:decimal:{}", family.name());
        let decimal = client
            .lock(&key)
            .strategy(Strategy::Classic(ClassicOptions::new()))
            .ttl(live)
            .build()
            .unwrap();
        let held = decimal.try_lock().expect("free");
        let mut peer = Peer::new(&server, &key, family, live);
        assert!(
            matches!(peer.try_lock(), Attempt::Won(_)),
            "{} takes over a live decimal lock",
            family.name()
        );
        assert!(
            !held.unlock().unwrap(),
            "our release finds their value and keeps it"
        );
        peer.unlock();
    }

    // A live Classic lock of any format: redis-py reads a millisecond or nanosecond number as
    // seconds thousands of years away, so it waits; a live redis-py lock is Corrupt to every
    // other Classic encoding, which names the format found.
    for encoding in [Encoding::Decimal, Encoding::Nanos] {
        let key = format!("families:shared:py:{encoding:?}");
        let lock = client
            .lock(&key)
            .strategy(Strategy::Classic(ClassicOptions::new().encoding(encoding)))
            .ttl(live)
            .build()
            .unwrap();
        let held = lock.try_lock().expect("free");
        let mut peer = Peer::new(&server, &key, Family::RedisPy, live);
        assert_eq!(peer.try_lock(), Attempt::Busy);
        assert!(held.unlock().unwrap());
    }
    let key = "families:shared:float";
    let mut peer = Peer::new(&server, key, Family::RedisPy, live);
    let theirs = match peer.try_lock() {
        Attempt::Won(v) => v,
        other => panic!("{other:?}"),
    };
    for encoding in [Encoding::Decimal, Encoding::UuidMs, Encoding::Nanos] {
        let lock = client
            .lock(key)
            .strategy(Strategy::Classic(ClassicOptions::new().encoding(encoding)))
            .build()
            .unwrap();
        let refused = lock.try_lock().map(|g| g.value().to_vec());
        match refused {
            Err(e @ LockError::Corrupt { .. }) => {
                assert!(e.to_string().contains("Encoding::FloatSeconds"), "{e}")
            }
            other => panic!("{encoding:?}: expected Corrupt, got {other:?}"),
        }
    }
    assert_eq!(raw::get(&mut conn, key), Some(theirs), "left alone");
}
