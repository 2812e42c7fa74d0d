//! A Token lock in ShedLock's key and value format (`Strategy::ShedLock`, `lock_at_least`)
//! beside Java jobs on ShedLock's Redis provider, against a real `redis-server`.
//!
//! The foreign client ([`ShedLock`]) is written here from ShedLock's public behaviour with raw
//! commands: key `job-lock:<env>:<name>`, value `ADDED:<ISO-8601 UTC ms>@<host>:<uuid>`; lock
//! `SET key value NX PX <lockAtMostFor>`, no waiting (a busy job is skipped); unlock, while
//! `lockAtLeastFor` has not passed, `SET key value XX PX <rest>`, else `DEL` (no owner check,
//! the default).
//!
//! - jobs of both sides fired on one name: never two running at once, 0 lost updates; the
//!   negative control is a job that ignores the lock;
//! - `lock_at_least` both ways: a job of either side that ends early keeps the other out until
//!   `lockAtLeastFor` after its start; the negative control (a release without it) is reported;
//! - holders SIGKILLed mid-run, taken over after `lockAtMostFor` both ways;
//! - both at once: holders of each side SIGKILLed while jobs of both fire (none runs before
//!   the dead hold's `lockAtMostFor` ends, both go on after it); negative control as above.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_dlock::{shedlock_key, DistributedLock, Lock, LockClient, Strategy};
use support::fleet::{DeadHold, DeadHolds};
use support::worker;
use support::{init_logging, raw, wait_until, RedisServer};

const COUNTER_KEY: &str = "shedlock:counter";

/// ShedLock's `Utils.toIsoString`, written independently: epoch ms → `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn iso(ms: u64) -> String {
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, sod) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to civil date (1970-based, walking years then months).
    let (mut y, mut d) = (1970i64, days);
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    while d >= if leap(y) { 366 } else { 365 } {
        d -= if leap(y) { 366 } else { 365 };
        y += 1;
    }
    let months = [
        31,
        if leap(y) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut m = 0;
    while d >= months[m] {
        d -= months[m];
        m += 1;
    }
    format!(
        "{y:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        m + 1,
        d + 1,
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One ShedLock `LockProvider` (Redis) for one job name.
struct ShedLock {
    conn: redis::Connection,
    key: String,
    value: String,
    /// `lockAtLeastUntil` of the current hold (epoch ms).
    at_least_until: u64,
}

impl ShedLock {
    fn new(url: &str, name: &str) -> ShedLock {
        ShedLock {
            conn: redis::Client::open(url).unwrap().get_connection().unwrap(),
            key: format!("job-lock:default:{name}"),
            value: String::new(),
            at_least_until: 0,
        }
    }

    /// `lock(config)`: `SET NX PX lockAtMostFor`. True if the job may run.
    fn lock(&mut self, at_most: Duration, at_least: Duration) -> bool {
        let now = now_ms();
        self.value = format!(
            "ADDED:{}@javahost:{}",
            iso(now),
            format_uuid(rand::random::<u128>())
        );
        self.at_least_until = now + at_least.as_millis() as u64;
        let set: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(&self.value)
            .arg("NX")
            .arg("PX")
            .arg(at_most.as_millis() as u64)
            .query(&mut self.conn)
            .unwrap();
        set.is_some()
    }

    /// `unlock()`: keep until `lockAtLeastUntil` (`SET XX PX`), else `DEL`; no owner check.
    fn unlock(&mut self) {
        let keep = self.at_least_until as i64 - now_ms() as i64;
        if keep <= 0 {
            let _: i64 = redis::cmd("DEL")
                .arg(&self.key)
                .query(&mut self.conn)
                .unwrap();
        } else {
            let _: Option<String> = redis::cmd("SET")
                .arg(&self.key)
                .arg(&self.value)
                .arg("XX")
                .arg("PX")
                .arg(keep)
                .query(&mut self.conn)
                .unwrap();
        }
    }
}

fn format_uuid(n: u128) -> String {
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn our_job(client: &LockClient, name: &str, at_most: Duration, at_least: Option<Duration>) -> Lock {
    let mut b = client
        .lock(shedlock_key("default", name))
        .strategy(Strategy::ShedLock)
        .ttl(at_most);
    if let Some(d) = at_least {
        b = b.lock_at_least(d);
    }
    b.build().unwrap()
}

#[test]
fn our_values_have_shedlocks_format() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let lock = our_job(&client, "format", Duration::from_secs(5), None);
    let guard = lock.try_lock().unwrap();
    let v = String::from_utf8(guard.value().to_vec()).unwrap();
    let rest = v.strip_prefix("ADDED:").expect(&v);
    let (time, rest) = rest.split_once('@').expect(&v);
    assert_eq!(time.len(), 24, "{v}");
    assert!(time.ends_with('Z') && &time[19..20] == ".", "{v}");
    let ms = now_ms();
    assert!(
        time[..16] == iso(ms)[..16] || time[..16] == iso(ms - 60_000)[..16],
        "{v} at {}",
        iso(ms)
    );
    let (host, uuid) = rest.rsplit_once(':').expect(&v);
    assert!(!host.is_empty() && uuid.len() == 36, "{v}");
    // A ShedLock job of that name is skipped while ours runs.
    let mut java = ShedLock::new(&server.url(), "format");
    assert!(!java.lock(Duration::from_secs(5), Duration::ZERO));
    assert!(guard.unlock().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Jobs of both sides on one name

const THREADS: usize = 3;
const FIRINGS: usize = 80;

/// One run of the job: its side (1: Java, 2: ours), when it began and ended.
#[derive(Debug, Clone, Copy)]
struct Run {
    side: usize,
    start: Instant,
    end: Instant,
}

/// [`THREADS`] threads of each side firing the job on one name (skipped when busy), a run a
/// non-atomic increment, and what they saw.
struct Firings {
    /// The Java side runs without the lock (a negative control).
    ignore: bool,
    /// Set to end the threads' loops early.
    stop: AtomicBool,
    barrier: Barrier,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    runs: Mutex<Vec<Run>>,
}

impl Firings {
    fn new(ignore: bool) -> Firings {
        Firings {
            ignore,
            stop: AtomicBool::new(false),
            barrier: Barrier::new(2 * THREADS),
            inside: AtomicUsize::new(0),
            overlaps: AtomicUsize::new(0),
            runs: Mutex::new(Vec::new()),
        }
    }

    fn run(&self, side: usize, conn: &mut redis::Connection) {
        let start = Instant::now();
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        raw::bump_counter(conn, COUNTER_KEY);
        let end = Instant::now();
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.runs.lock().unwrap().push(Run { side, start, end });
    }

    /// Starts the threads in `s` on the job `name`: each fires it `firings` times, or fewer if
    /// [`stop`](Self::stop) is set.
    fn spawn<'scope, 'env>(
        &'env self,
        s: &'scope thread::Scope<'scope, 'env>,
        server: &RedisServer,
        name: &str,
        lock: &'env Lock,
        firings: usize,
    ) {
        let go_on = move |i: usize| i < firings && !self.stop.load(Ordering::SeqCst);
        for _ in 0..THREADS {
            let mut java = ShedLock::new(&server.url(), name);
            let mut conn = server.conn();
            s.spawn(move || {
                self.barrier.wait();
                let mut i = 0;
                while go_on(i) {
                    if self.ignore {
                        self.run(1, &mut conn);
                    } else if java.lock(Duration::from_secs(10), Duration::ZERO) {
                        self.run(1, &mut conn);
                        java.unlock();
                    }
                    support::work(Duration::from_micros(300));
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
                    if let Ok(guard) = lock.try_lock() {
                        self.run(2, &mut conn);
                        assert!(guard.unlock().unwrap());
                    }
                    support::work(Duration::from_micros(300));
                    i += 1;
                }
            });
        }
    }

    /// Runs of `side` that began at or after `from`.
    fn runs_from(&self, side: usize, from: Instant) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .filter(|x| x.side == side && x.start >= from)
            .count()
    }

    /// Lost updates (the counter read by `conn`), overlaps, runs.
    fn report(&self, conn: &mut redis::Connection) -> (i64, usize, usize) {
        let runs = self.runs.lock().unwrap().len();
        let lost = runs as i64 - raw::get_i64(conn, COUNTER_KEY);
        (lost, self.overlaps.load(Ordering::SeqCst), runs)
    }
}

/// Each thread fires the job `FIRINGS` times; `ignore`: the Java side runs without the lock
/// (negative control).
fn fire(ignore: bool) -> (i64, usize, usize) {
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let lock = our_job(&client, "contended", Duration::from_secs(10), None);
    let firings = Firings::new(ignore);
    thread::scope(|s| firings.spawn(s, &server, "contended", &lock, FIRINGS));
    let (lost, overlaps, runs) = firings.report(&mut server.conn());
    eprintln!(
        "shedlock/fire (ignore={ignore}): {runs} runs, {lost} lost updates, {overlaps} overlaps"
    );
    (lost, overlaps, runs)
}

#[test]
fn jobs_of_both_sides_never_both_run() {
    init_logging();
    let (lost, overlaps, runs) = fire(false);
    assert!(runs > 0);
    assert_eq!((lost, overlaps), (0, 0));
}

#[test]
fn the_checker_reports_a_job_that_ignores_the_lock() {
    init_logging();
    assert!(
        (0..5).any(|_| {
            let (lost, overlaps, _) = fire(true);
            lost > 0 || overlaps > 0
        }),
        "five runs beside a job that ignores the lock looked clean"
    );
}

// ---------------------------------------------------------------------------------------------
// lockAtLeastFor both ways

const AT_LEAST: Duration = Duration::from_millis(1500);

/// After a hold that started at `started` and was released early: polls the other side's
/// attempt until it wins; when it won, from the start.
fn first_win_after(started: Instant, mut attempt: impl FnMut() -> bool) -> Duration {
    loop {
        if attempt() {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never free");
        support::work(Duration::from_millis(5));
    }
}

/// A job that ended early was kept until `lockAtLeastFor` after its start.
fn kept_at_least(won_after: Duration) -> bool {
    won_after >= AT_LEAST
}

#[test]
fn lock_at_least_holds_both_ways() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();

    // Ours ends early; ShedLock is skipped until AT_LEAST after our start.
    let lock = our_job(&client, "at-least", Duration::from_secs(10), Some(AT_LEAST));
    let started = Instant::now();
    let guard = lock.try_lock().unwrap();
    let value = guard.value().to_vec();
    assert!(guard.unlock().unwrap());
    let mut conn = server.conn();
    assert_eq!(
        raw::get(&mut conn, "job-lock:default:at-least"),
        Some(value)
    );
    let mut java = ShedLock::new(&server.url(), "at-least");
    let won = first_win_after(started, || {
        java.lock(Duration::from_secs(10), Duration::ZERO)
    });
    eprintln!("shedlock/at-least: ShedLock got the job {won:?} after our early end ({AT_LEAST:?})");
    assert!(kept_at_least(won), "{won:?}");
    java.unlock();

    // Theirs ends early; ours is refused until AT_LEAST after their start.
    let mut java = ShedLock::new(&server.url(), "at-least-java");
    let started = Instant::now();
    assert!(java.lock(Duration::from_secs(10), AT_LEAST));
    java.unlock();
    let lock = our_job(&client, "at-least-java", Duration::from_secs(10), None);
    let won = first_win_after(started, || match lock.try_lock() {
        Ok(g) => {
            std::mem::forget(g);
            true
        }
        Err(_) => false,
    });
    eprintln!("shedlock/at-least: ours got the job {won:?} after their early end");
    assert!(kept_at_least(won), "{won:?}");
}

/// The negative control: without `lock_at_least` our early end frees the job at once.
#[test]
fn the_at_least_check_reports_an_early_release() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let lock = our_job(&client, "no-at-least", Duration::from_secs(10), None);
    let started = Instant::now();
    assert!(lock.try_lock().unwrap().unlock().unwrap());
    let mut java = ShedLock::new(&server.url(), "no-at-least");
    let won = first_win_after(started, || {
        java.lock(Duration::from_secs(10), Duration::ZERO)
    });
    assert!(!kept_at_least(won), "{won:?}");
}

// ---------------------------------------------------------------------------------------------
// Holders SIGKILLed mid-run, taken over after lockAtMostFor, both ways

const WORKER_ENV: &str = "DLOCK_SHEDLOCK_WORKER";
const AT_MOST: Duration = Duration::from_secs(1);
/// Set for a holder of a job others fire too: it polls until it wins.
const CONTENDED_ENV: &str = "DLOCK_SHEDLOCK_CONTENDED";

/// The holder process: runs the job `DLOCK_NAME` as `ours` or `java` (lockAtMostFor 1 s; with
/// [`CONTENDED_ENV`], polling every millisecond until it may) and is killed mid-run. Does
/// nothing in a normal test run.
#[test]
fn shedlock_holder_process() {
    let Ok(side) = std::env::var(WORKER_ENV) else {
        return;
    };
    let url = std::env::var("DLOCK_URL").unwrap();
    let name = std::env::var("DLOCK_NAME").unwrap();
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
        let job = our_job(&client, &name, AT_MOST, None);
        let lease = loop {
            match job.try_acquire() {
                Ok(lease) => break lease,
                Err(e) => poll(&e),
            }
        };
        let v = lease.value().to_vec();
        std::mem::forget(lease);
        v
    } else {
        let mut java = ShedLock::new(&url, &name);
        while !java.lock(AT_MOST, Duration::ZERO) {
            poll(&"the job is running");
        }
        java.value.into_bytes()
    };
    worker::report("DLOCK-SHEDLOCK-LOCKED", &hex::encode(value));
    worker::hold_until_killed()
}

#[test]
fn killed_jobs_are_taken_over_both_ways() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let mut conn = server.conn();
    for side in ["ours", "java"] {
        let name = format!("dead-{side}");
        let key = shedlock_key("default", &name);
        let dead = worker::killed_holder_value(
            "shedlock_holder_process",
            &[
                (WORKER_ENV, side.to_owned()),
                ("DLOCK_URL", server.url()),
                ("DLOCK_NAME", name.clone()),
            ],
            "DLOCK-SHEDLOCK-LOCKED",
            side,
        );
        let before = Instant::now();
        let pttl = raw::pttl(&mut conn, &key);
        assert!(pttl > 0, "{side}: {pttl}");
        let free_from = before + Duration::from_millis(pttl as u64);
        assert_eq!(raw::get(&mut conn, &key), Some(dead));
        let won_at = if side == "ours" {
            let mut java = ShedLock::new(&server.url(), &name);
            first_win_after(before, || java.lock(Duration::from_secs(5), Duration::ZERO));
            Instant::now()
        } else {
            let lock = our_job(&client, &name, Duration::from_secs(5), None);
            let g = lock.try_lock_for(Duration::from_secs(20)).unwrap();
            let at = Instant::now();
            assert!(g.unlock().unwrap());
            at
        };
        assert!(
            won_at >= free_from,
            "{side}: taken over before its lockAtMostFor ended"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Both at once: holders SIGKILLed mid-run while jobs of both sides fire

/// How many runs of each side the combined scenario waits for before a holder, and after each
/// dead hold's end.
const RUNS_AROUND: usize = 5;

/// A combined run: lost updates, overlaps, and what its runs say about the dead holds (side 1:
/// Java, 2: ours).
#[derive(Debug)]
struct KilledRun {
    lost: i64,
    overlaps: usize,
    holds: DeadHolds<Instant>,
}

/// While the threads of [`Firings`] fire (`ignore`: the Java side without the lock, the
/// negative control), a job of ours, then a Java job, each a child process that polls for the
/// lock among them, is SIGKILLed mid-run; after each dead hold's end (its `lockAtMostFor`),
/// the scenario waits for [`RUNS_AROUND`] runs of each side.
fn killed_mid_firing(ignore: bool) -> KilledRun {
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    let name = "contended-killed";
    let key = shedlock_key("default", name);
    let lock = our_job(&client, name, Duration::from_secs(10), None);
    let firings = Firings::new(ignore);
    let mut conn = server.conn();
    let started = Instant::now();
    let both_from = |from: Instant| {
        let go_on = wait_until(Duration::from_secs(30), || {
            (1..=2).all(|side| firings.runs_from(side, from) >= RUNS_AROUND)
        });
        assert!(
            go_on,
            "the jobs stopped: {:?}",
            firings.report(&mut server.conn())
        );
    };
    let dead = thread::scope(|s| {
        firings.spawn(s, &server, name, &lock, usize::MAX);
        let mut dead: Vec<DeadHold<Instant>> = Vec::new();
        for side in ["ours", "java"] {
            both_from(dead.last().map_or(started, |d| d.free_from));
            let (_, held_from) = worker::killed_holder_value_at(
                "shedlock_holder_process",
                &[
                    (WORKER_ENV, side.to_owned()),
                    (CONTENDED_ENV, "1".to_owned()),
                    ("DLOCK_URL", server.url()),
                    ("DLOCK_NAME", name.to_owned()),
                ],
                "DLOCK-SHEDLOCK-LOCKED",
                side,
            );
            let before = Instant::now();
            let pttl = raw::pttl(&mut conn, &key);
            assert!(pttl > 0, "{side}: the dead hold has a TTL ({pttl})");
            dead.push(DeadHold {
                name: side.to_owned(),
                held_from,
                free_from: before + Duration::from_millis(pttl as u64),
            });
        }
        both_from(dead.last().map_or(started, |d| d.free_from));
        firings.stop.store(true, Ordering::SeqCst);
        dead
    });
    let (lost, overlaps, _) = firings.report(&mut conn);
    let runs: Vec<_> = firings
        .runs
        .into_inner()
        .unwrap()
        .iter()
        .map(|x| (x.side, x.start, x.end))
        .collect();
    let run = KilledRun {
        lost,
        overlaps,
        holds: DeadHolds::of(&runs, dead),
    };
    eprintln!(
        "shedlock/killed (ignore={ignore}): {:.2?}, {} runs, {} lost updates, {} overlaps, {} runs \
         inside a dead hold, runs (Java, ours) after each: {:?}; {:?}",
        started.elapsed(),
        runs.len(),
        run.lost,
        run.overlaps,
        run.holds.early.len(),
        run.holds.after,
        run.holds.takeovers("Java"),
    );
    run
}

/// Checks a combined scenario: no overlap, no lost update, no run inside a dead hold, and both
/// sides went on after each dead hold's end.
fn killed_run_failures(run: &KilledRun) -> Vec<String> {
    let mut failures = Vec::new();
    if run.overlaps > 0 || run.lost > 0 {
        failures.push(format!(
            "two running at once: {} overlaps, {} lost updates",
            run.overlaps, run.lost
        ));
    }
    failures.extend(run.holds.failures("Java"));
    failures
}

#[test]
fn holders_killed_while_both_fire() {
    init_logging();
    let run = killed_mid_firing(false);
    let failures = killed_run_failures(&run);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The negative control of [`killed_run_failures`]: the Java side runs without the lock,
/// during the dead holds too; the check must name the runs inside a dead hold.
#[test]
fn the_killed_run_check_reports_a_job_that_ignores_the_lock() {
    init_logging();
    let run = killed_mid_firing(true);
    let failures = killed_run_failures(&run);
    assert!(
        failures.iter().any(|f| f.contains("inside a dead hold")),
        "runs beside dead holds were not reported: {failures:#?}"
    );
}
