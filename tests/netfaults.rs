//! Network faults between a holder and its server, under load, through a userspace TCP proxy
//! on loopback (`tests/support/proxy.rs`; no root, no netem):
//!
//! 1. **A holder cut off** (the proxy drops every byte, both ways) for longer than its lease:
//!    watched holds (watchdog lease) and holds with a fixed `ttl`, of the library and of
//!    `dlock run`. Every holder must hear of the loss (`is_lost()`, `on_lost`, the command's
//!    SIGTERM) before the key expires on the server, with half the loss margin (1% of the
//!    lease plus 2 ms) to spare: `report < expiry - margin / 2`, the expiry read by `PTTL`
//!    from a connection that is not cut off. Negative control: the same holds in a worker
//!    process with the margin set to zero (a test hook) must be reported late.
//! 2. **A slow link**: every chunk delayed by a random 100–500 ms, both ways, in order per
//!    direction. Two clients, 64 keys, Token locks with a 1 s or 2 s ttl and watched ones:
//!    no hold is handed out already lost, no two validity windows overlap
//!    (tests/support/history.rs), and no hold is used past its lease. Negative control: a raw
//!    `SET NX PX` locker through the same proxy, which counts its lease from the reply, is
//!    reported (overlaps, or holds used past the lease counted from the send).
//!
//! Figures: docs/reliability.md, "Network faults between a holder and its server".

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::RngExt;
use redis_dlock::{DistributedLock, LockClient, LockError};
use support::history::{
    self, late_reports, now_ns, overlaps, used_past_lease, Hold, LossReport, Recorder,
};
use support::proxy::{Mode, Proxy};
use support::worker::WorkerProcess;
use support::{wait_until, work, RedisServer};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// The lease of the cut-off holds: long enough that half its margin (21 ms) covers a busy
/// machine's scheduling delays, short enough for a test.
const CUT_LEASE: Duration = Duration::from_secs(4);
/// Holds of each kind (watched, ttl) of the library in the cut-off scenario.
const CUT_HOLDS: usize = 6;
/// `dlock run`s of each kind (`--lease`, `--ttl`).
const CUT_RUNS: usize = 2;

/// The loss margin of a lease (the library's: 1% plus 2 ms).
fn margin(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// `Instant` to ns of [`now_ns`] (both CLOCK_MONOTONIC on Linux).
fn instant_ns(t: Instant) -> u64 {
    let (now, at) = (Instant::now(), now_ns());
    if t <= now {
        at - ns(now - t)
    } else {
        at + ns(t - now)
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A holder cut off from Redis.

/// What one cut-off hold measured.
struct Measured {
    what: String,
    key: String,
    reported: u64,
}

/// The SIGTERM time of a command run by `dlock run`, written to a file by the command (this
/// test binary's [`sigterm_child`]).
struct Run {
    what: String,
    key: String,
    child: Child,
    file: PathBuf,
}

static SIGTERM_AT: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigterm(_: libc::c_int) {
    // clock_gettime is async-signal-safe.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    SIGTERM_AT.store(
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        Ordering::SeqCst,
    );
}

/// The command of the `dlock run`s: notes when SIGTERM came (in the signal handler), writes it
/// to `$NETFAULTS_SIGTERM_FILE` and exits. Does nothing in a normal run.
#[test]
fn sigterm_child() {
    let Some(file) = std::env::var_os("NETFAULTS_SIGTERM_FILE") else {
        return;
    };
    let file = PathBuf::from(file);
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };
    std::fs::write(file.with_extension("ready"), b"").unwrap();
    assert!(wait_until(Duration::from_secs(600), || {
        SIGTERM_AT.load(Ordering::SeqCst) != 0
    }));
    std::fs::write(&file, SIGTERM_AT.load(Ordering::SeqCst).to_string()).unwrap();
    std::process::exit(0);
}

/// Starts `dlock run` through `url` on `key` with `extra` (`--lease`/`--ttl`).
fn dlock_run(url: &str, key: &str, extra: &[&str], dir: &Path, what: String) -> Run {
    let file = dir.join(key.replace(':', "_"));
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(DLOCK)
        .args(["run", "--url", url, "--key", key, "--no-wait"])
        .args(extra)
        .arg("--")
        .arg(exe)
        .args([
            "--exact",
            "sigterm_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NETFAULTS_SIGTERM_FILE", &file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock");
    Run {
        what,
        key: key.to_owned(),
        child,
        file,
    }
}

/// Background load: `threads` threads of `client` taking and releasing keys `prefix:0..16`
/// until `stop`, with a 20 ms pause after an error.
fn background<'s>(
    s: &'s thread::Scope<'s, '_>,
    client: &'s LockClient,
    prefix: &'s str,
    threads: usize,
    stop: &'s AtomicBool,
    sections: &'s AtomicUsize,
) {
    for _ in 0..threads {
        s.spawn(move || {
            let mut rng = rand::rng();
            let locks: Vec<_> = (0..16)
                .map(|i| {
                    client
                        .lock(format!("{prefix}:{i}"))
                        .ttl(Duration::from_secs(1))
                        .build()
                        .unwrap()
                })
                .collect();
            while !stop.load(Ordering::SeqCst) {
                match locks[rng.random_range(0..locks.len())].try_lock() {
                    Ok(g) => {
                        work(Duration::from_millis(rng.random_range(1..5)));
                        let _ = g.unlock();
                        sections.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(LockError::Held { .. }) => work(Duration::from_millis(1)),
                    Err(_) => work(Duration::from_millis(20)),
                }
            }
        });
    }
}

/// Polls `is_lost()` of `guard` until true: its time. Sleeps until shortly before the loss
/// deadline the lease announces, then polls every 200 µs.
fn wait_lost(guard: &redis_dlock::LockGuard<'_>, give_up: Instant) -> u64 {
    loop {
        if guard.is_lost() {
            return now_ns();
        }
        if Instant::now() > give_up {
            return 0;
        }
        let left = guard
            .lease()
            .loss_deadline()
            .saturating_duration_since(Instant::now());
        // Time under test: the report is sampled ever closer to the loss deadline.
        thread::sleep(
            left.saturating_sub(Duration::from_millis(3))
                .clamp(Duration::from_micros(200), Duration::from_millis(50)),
        );
    }
}

/// The cut-off scenario: library holds (and, with `runs`, `dlock run`s) through a proxy, under
/// load; the proxy drops everything once the watched holds were renewed; the keys' expiry is
/// read on the server. One report per measurement (a watched hold gives two: `is_lost` and
/// `on_lost`).
fn cut_off(runs: bool) -> (Vec<LossReport>, String) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let cut_client = LockClient::open(proxy.url()).unwrap();
    let direct_client = LockClient::open(server.url()).unwrap();
    let dir = server.dir().to_owned();
    let lease_s = format!("{}ms", CUT_LEASE.as_millis());

    let mut keys: Vec<(String, &'static str)> = Vec::new();
    for i in 0..CUT_HOLDS {
        keys.push((format!("cut:w{i}"), "watched"));
        keys.push((format!("cut:t{i}"), "ttl"));
    }
    let mut run_list = Vec::new();
    if runs {
        for i in 0..CUT_RUNS {
            run_list.push(dlock_run(
                &proxy.url(),
                &format!("run:w{i}"),
                &["--lease", &lease_s],
                &dir,
                format!("dlock run --lease (run:w{i}): SIGTERM"),
            ));
            run_list.push(dlock_run(
                &proxy.url(),
                &format!("run:t{i}"),
                &["--ttl", &lease_s],
                &dir,
                format!("dlock run --ttl (run:t{i}): SIGTERM"),
            ));
        }
    }

    let stop = AtomicBool::new(false);
    let sections = AtomicUsize::new(0);
    let ready = AtomicUsize::new(0);
    let cut = AtomicBool::new(false);
    let measured: Mutex<Vec<Measured>> = Mutex::new(Vec::new());
    let on_lost_at: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let give_up = Instant::now() + CUT_LEASE * 4 + Duration::from_secs(10);
    let mut observer = server.conn();
    let mut expiry: HashMap<String, (u64, u64)> = HashMap::new();
    let mut summary = String::new();

    thread::scope(|s| {
        background(s, &cut_client, "bg-cut", 2, &stop, &sections);
        background(s, &direct_client, "bg-direct", 2, &stop, &sections);
        for (key, kind) in &keys {
            let (client, ready, measured, on_lost_at, stop) =
                (&cut_client, &ready, &measured, &on_lost_at, &stop);
            s.spawn(move || {
                let builder = client.lock(key.clone());
                let lock = if *kind == "watched" {
                    let seen = Arc::clone(on_lost_at);
                    let k = key.clone();
                    builder
                        .watchdog_lease(CUT_LEASE)
                        .on_lost(move |_| {
                            seen.lock().unwrap().insert(k.clone(), now_ns());
                        })
                        .build()
                        .unwrap()
                } else {
                    builder.ttl(CUT_LEASE).build().unwrap()
                };
                let guard = lock.try_lock().expect("an uncontended key");
                ready.fetch_add(1, Ordering::SeqCst);
                let at = wait_lost(&guard, give_up);
                // Known lost: `check` answers without a round trip (the link is cut).
                let t = Instant::now();
                let checked = guard.check();
                assert!(
                    matches!(checked, Err(LockError::Lost { .. })),
                    "{key}: check after is_lost: {checked:?}"
                );
                assert!(
                    t.elapsed() < Duration::from_millis(500),
                    "check sent something"
                );
                measured.lock().unwrap().push(Measured {
                    what: format!("{kind} hold {key}: is_lost"),
                    key: key.clone(),
                    reported: at,
                });
                // Kept until every report is in: a hold released meanwhile would not be
                // reported by `on_lost` (the release stops its watch).
                assert!(wait_until(Duration::from_secs(600), || stop.load(Ordering::SeqCst)));
                drop(guard);
            });
        }
        // Every hold taken and every command started.
        let all_ready = wait_until(Duration::from_secs(30), || {
            ready.load(Ordering::SeqCst) == keys.len()
                && run_list
                    .iter()
                    .all(|r| r.file.with_extension("ready").exists())
        });
        assert!(all_ready, "holds or dlock runs not ready");
        let taken = Instant::now();
        // Past the first renewal (a third of the lease): the loss is counted from it.
        work(CUT_LEASE / 2);
        let mut renewed = 0;
        for (key, kind) in
            keys.iter()
                .map(|(k, kind)| (k.clone(), *kind))
                .chain(run_list.iter().map(|r| {
                    (
                        r.key.clone(),
                        if r.key.contains(":w") {
                            "watched"
                        } else {
                            "ttl"
                        },
                    )
                }))
        {
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut observer).unwrap();
            assert!(pttl > 0, "{key} not held before the cut: PTTL {pttl}");
            if kind == "watched" {
                // Not renewed, it would have less than half its lease left.
                assert!(
                    pttl as u128 > (CUT_LEASE / 2).as_millis() + 100,
                    "{key}: PTTL {pttl} ms, not renewed"
                );
                renewed += 1;
            }
        }
        proxy.set(Mode::Blackhole);
        let cut_at = now_ns();
        cut.store(true, Ordering::SeqCst);
        // The server's expiry of every measured key, read from a connection not cut off: the
        // latest lower bound (sent + PTTL) of the answers sent once in-flight renewals landed.
        let all_keys: Vec<String> = keys
            .iter()
            .map(|(k, _)| k.clone())
            .chain(run_list.iter().map(|r| r.key.clone()))
            .collect();
        let settle = cut_at + ns(Duration::from_millis(20));
        let gone = wait_until(CUT_LEASE * 3, || {
            let sent = now_ns();
            let mut pipe = redis::pipe();
            for k in &all_keys {
                pipe.cmd("PTTL").arg(k);
            }
            let pttls: Vec<i64> = pipe.query(&mut observer).unwrap();
            let recv = now_ns();
            for (k, p) in all_keys.iter().zip(&pttls) {
                if *p >= 0 && sent >= settle {
                    let lo = sent + ns(Duration::from_millis(*p as u64));
                    let hi = recv + ns(Duration::from_millis(*p as u64 + 1));
                    let e = expiry.entry(k.clone()).or_insert((lo, hi));
                    e.0 = e.0.max(lo);
                    e.1 = e.1.min(hi);
                }
            }
            pttls.iter().all(|p| *p == -2)
        });
        assert!(gone, "keys not expired on the server");
        let watched = keys.iter().filter(|(_, kind)| *kind == "watched").count();
        let all_measured = wait_until(CUT_LEASE, || {
            measured.lock().unwrap().len() == keys.len()
                && on_lost_at.lock().unwrap().len() == watched
                && run_list
                    .iter()
                    .all(|r| r.file.exists() && !std::fs::read(&r.file).unwrap().is_empty())
        });
        assert!(all_measured, "not every holder heard of the loss");
        stop.store(true, Ordering::SeqCst);
        proxy.set(Mode::Pass);
        summary = format!(
            "{} holds and {} dlock runs taken, {renewed} watched ones renewed before the cut \
             {:.0} ms after they were taken; {} background sections; {} bytes dropped",
            keys.len(),
            run_list.len(),
            (cut_at - instant_ns(taken)) as f64 / 1e6,
            sections.load(Ordering::Relaxed),
            proxy.dropped()
        );
    });

    let margin_ns = ns(margin(CUT_LEASE));
    let mut reports = Vec::new();
    let on_lost_at = on_lost_at.lock().unwrap().clone();
    let mut all: Vec<Measured> = measured.into_inner().unwrap();
    for (key, at) in &on_lost_at {
        all.push(Measured {
            what: format!("watched hold {key}: on_lost"),
            key: key.clone(),
            reported: *at,
        });
    }
    for (key, kind) in &keys {
        if *kind == "watched" && !on_lost_at.contains_key(key) {
            all.push(Measured {
                what: format!("watched hold {key}: on_lost"),
                key: key.clone(),
                reported: 0,
            });
        }
    }
    for mut run in run_list {
        let status = run.child.wait().expect("dlock exits");
        assert_eq!(status.code(), Some(79), "{}: dlock's status", run.what);
        let at: u64 = std::fs::read_to_string(&run.file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        all.push(Measured {
            what: run.what,
            key: run.key,
            reported: at,
        });
    }
    for m in all {
        let (lo, _) = expiry[&m.key];
        reports.push(LossReport {
            what: m.what,
            reported: m.reported,
            expired: lo,
            margin: margin_ns,
        });
    }
    let spread: Vec<f64> = reports
        .iter()
        .map(|r| (r.expired as f64 - r.reported as f64) / 1e6)
        .collect();
    let (min, max) = spread
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let uncertainty = expiry
        .values()
        .map(|(lo, hi)| (hi - lo) as f64 / 1e6)
        .fold(0.0, f64::max);
    summary.push_str(&format!(
        "; {} reports came {min:.1}..{max:.1} ms before the server's expiry (margin {:.0} ms, \
         required > {:.0} ms; expiry read within {uncertainty:.1} ms)",
        reports.len(),
        margin_ns as f64 / 1e6,
        margin_ns as f64 / 2e6,
    ));
    (reports, summary)
}

#[test]
fn a_holder_cut_off_hears_of_the_loss_before_the_server_expires_its_key() {
    let (reports, summary) = cut_off(true);
    eprintln!("netfaults [cut off, margin 1% + 2 ms]: {summary}");
    let late = late_reports(&reports);
    assert!(late.is_empty(), "late loss reports: {late:#?}");
    assert_eq!(
        reports.len(),
        CUT_HOLDS * 3 + CUT_RUNS * 2,
        "one report per measurement"
    );
}

/// The negative control's worker: the library's holds with the loss margin set to zero.
#[test]
fn cut_off_worker_with_zero_margin() {
    if std::env::var_os("NETFAULTS_ZERO_MARGIN").is_none() {
        return;
    }
    redis_dlock::test_hooks::set_zero_loss_margin(true);
    let (reports, summary) = cut_off(false);
    println!("\nSUMMARY {summary}");
    for r in reports {
        println!(
            "REPORT {} {} {} {}",
            r.reported,
            r.expired,
            r.margin,
            r.what.replace(' ', "_")
        );
    }
}

#[test]
fn negative_control_without_the_margin_the_checker_reports_late_reports() {
    let worker = WorkerProcess::spawn_captured(
        "cut_off_worker_with_zero_margin",
        &[("NETFAULTS_ZERO_MARGIN", "1")],
    );
    let (status, out, err) = worker.finish(Duration::from_secs(60));
    assert!(status.success(), "worker failed: {status}\n{out}\n{err}");
    let reports: Vec<LossReport> = out
        .lines()
        .filter_map(|l| l.strip_prefix("REPORT "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            LossReport {
                reported: f[0].parse().unwrap(),
                expired: f[1].parse().unwrap(),
                // The margin the lock should have kept (the worker's is zero).
                margin: ns(margin(CUT_LEASE)),
                what: f[3].replace('_', " "),
            }
        })
        .collect();
    let summary = out
        .lines()
        .find_map(|l| l.strip_prefix("SUMMARY "))
        .unwrap_or("");
    let late = late_reports(&reports);
    eprintln!(
        "netfaults [cut off, negative control: margin 0]: {summary}; {} of {} reports late",
        late.len(),
        reports.len()
    );
    for r in &reports {
        eprintln!(
            "  {}: {:.1} ms before the expiry",
            r.what,
            (r.expired as f64 - r.reported as f64) / 1e6
        );
    }
    assert_eq!(reports.len(), CUT_HOLDS * 3);
    assert!(
        !late.is_empty(),
        "with no margin, no report came late: the check would not see a missing margin"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A slow link.

const SLOW_KEYS: u32 = 64;
/// Keys most picks go to, so that holders race for them.
const SLOW_HOT: u32 = 8;
const SLOW_MIN: Duration = Duration::from_millis(100);
const SLOW_MAX: Duration = Duration::from_millis(500);
const SLOW_RUN: Duration = Duration::from_secs(20);
const SLOW_CONTROL_RUN: Duration = Duration::from_secs(8);
const THREADS_PER_CLIENT: usize = 3;
const WATCHED_LEASE: Duration = Duration::from_secs(3);

/// The lock of key `k`: watched (every fourth key), else a Token lock with a 1 s or 2 s ttl.
fn slow_ttl(k: u32) -> Option<Duration> {
    match k % 4 {
        0 => None,
        1 => Some(Duration::from_secs(1)),
        _ => Some(Duration::from_secs(2)),
    }
}

fn pick(rng: &mut impl rand::Rng) -> u32 {
    if rng.random_bool(0.5) {
        rng.random_range(0..SLOW_HOT)
    } else {
        rng.random_range(0..SLOW_KEYS)
    }
}

#[derive(Default)]
struct Tally {
    holds: AtomicUsize,
    late_replies: AtomicUsize,
    handed_out_lost: AtomicUsize,
    lost_in_work: AtomicUsize,
    errors: AtomicUsize,
}

/// One thread of a library client: takes random keys with `try_lock`, works under the hold
/// (a ttl hold until a quarter of its ttl is left or a random 50–400 ms, a watched hold a
/// random 0.3–4 s, through renewals), stopping at once if the hold is lost, and records it.
fn library_thread(client: &LockClient, holder: u64, until: Instant, tally: &Tally) -> Vec<Hold> {
    let locks: Vec<_> = (0..SLOW_KEYS)
        .map(|k| {
            let b = client.lock(format!("slow:{k}"));
            match slow_ttl(k) {
                Some(ttl) => b.ttl(ttl).build().unwrap(),
                None => b.watchdog_lease(WATCHED_LEASE).build().unwrap(),
            }
        })
        .collect();
    let mut rec = Recorder::new(holder);
    let mut rng = rand::rng();
    while Instant::now() < until {
        let k = pick(&mut rng);
        let open = rec.begin(k);
        match locks[k as usize].try_lock() {
            Ok(guard) => {
                let held = open.acquired();
                tally.holds.fetch_add(1, Ordering::Relaxed);
                if guard.is_lost() || guard.remaining().is_zero() {
                    tally.handed_out_lost.fetch_add(1, Ordering::Relaxed);
                }
                let (plan, keep) = match slow_ttl(k) {
                    Some(ttl) => (Duration::from_millis(rng.random_range(50..400)), ttl / 4),
                    None => (
                        Duration::from_millis(rng.random_range(300..4000)),
                        Duration::ZERO,
                    ),
                };
                let end = Instant::now() + plan;
                while Instant::now() < end && guard.remaining() > keep {
                    if guard.is_lost() {
                        tally.lost_in_work.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    work(Duration::from_millis(5));
                }
                rec.release(held, guard.remaining(), guard.is_lost());
                let _ = guard.unlock();
            }
            Err(LockError::Held { .. }) => work(Duration::from_millis(rng.random_range(5..30))),
            Err(LockError::LateReply { .. }) => {
                tally.late_replies.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                work(Duration::from_millis(20));
            }
        }
    }
    rec.holds().to_vec()
}

/// The negative control's locker: `SET key token NX PX ttl` through the proxy, its lease
/// counted from the reply; it works until a quarter of that lease is left, and releases by
/// compare-and-delete.
fn raw_thread(url: &str, holder: u64, until: Instant, tally: &Tally) -> Vec<Hold> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let mut rec = Recorder::new(holder);
    let mut rng = rand::rng();
    let ttl = Duration::from_secs(1);
    while Instant::now() < until {
        let k = pick(&mut rng);
        let key = format!("raw:{k}");
        let token = format!("{holder:x}-{}", rng.random::<u64>());
        let open = rec.begin(k);
        let reply: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query(&mut con)
            .unwrap();
        if reply.is_none() {
            work(Duration::from_millis(rng.random_range(5..30)));
            continue;
        }
        let held = open.acquired();
        tally.holds.fetch_add(1, Ordering::Relaxed);
        let valid_until = Instant::now() + ttl;
        while valid_until.saturating_duration_since(Instant::now()) > ttl / 4 {
            work(Duration::from_millis(5));
        }
        rec.release(
            held,
            valid_until.saturating_duration_since(Instant::now()),
            false,
        );
        let _: i64 = release.key(&key).arg(&token).invoke(&mut con).unwrap();
    }
    rec.holds().to_vec()
}

/// The lease end a hold must not be used past: a ttl hold's lease counted from the invocation
/// of its acquire (the server's starts later); a watched hold's as the guard counted it.
fn lease_end(h: &Hold, ttl: Option<Duration>) -> u64 {
    match ttl {
        Some(ttl) => h.invoked + ns(ttl),
        None => h.valid_until,
    }
}

fn describe_tally(t: &Tally) -> String {
    format!(
        "{} holds, {} late replies refused, {} handed out lost, {} lost while working, {} errors",
        t.holds.load(Ordering::Relaxed),
        t.late_replies.load(Ordering::Relaxed),
        t.handed_out_lost.load(Ordering::Relaxed),
        t.lost_in_work.load(Ordering::Relaxed),
        t.errors.load(Ordering::Relaxed),
    )
}

/// A server behind a proxy that delays every chunk by 100–500 ms.
fn slow_link() -> (RedisServer, Proxy) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set(Mode::Delay {
        min: SLOW_MIN,
        max: SLOW_MAX,
    });
    (server, proxy)
}

#[test]
fn a_slow_link_hands_out_no_late_win_and_no_hold_past_its_lease() {
    let (_server, proxy) = slow_link();
    let clients: Vec<LockClient> = (0..2)
        .map(|_| LockClient::open(proxy.url()).unwrap())
        .collect();
    let tally = Tally::default();
    let start = now_ns();
    let until = Instant::now() + SLOW_RUN;
    let holds: Vec<Hold> = thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .flat_map(|(c, client)| {
                let tally = &tally;
                (0..THREADS_PER_CLIENT).map(move |t| {
                    s.spawn(move || {
                        library_thread(client, (c as u64) << 16 | t as u64, until, tally)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let found = overlaps(&holds);
    let past = used_past_lease(&holds, |h| lease_end(h, slow_ttl(h.key)));
    eprintln!(
        "netfaults [slow link {}-{} ms, 2 clients x {THREADS_PER_CLIENT} threads, {SLOW_KEYS} \
         keys, {:.0} s]: {}; {} overlapping pairs, {} used past the lease",
        SLOW_MIN.as_millis(),
        SLOW_MAX.as_millis(),
        SLOW_RUN.as_secs_f64(),
        describe_tally(&tally),
        found.len(),
        past.len()
    );
    assert!(found.is_empty(), "{}", history::describe(&found, start));
    assert!(past.is_empty(), "holds used past their lease: {past:?}");
    assert_eq!(tally.handed_out_lost.load(Ordering::Relaxed), 0);
    assert!(holds.len() > 20, "too few holds: {}", holds.len());
    // The link was slow enough to make late wins, and none was handed out.
    assert!(
        tally.late_replies.load(Ordering::Relaxed) > 0,
        "no late reply: was the link slow?"
    );
}

#[test]
fn negative_control_a_raw_locker_counting_from_the_reply_is_reported() {
    let (_server, proxy) = slow_link();
    let tally = Tally::default();
    let until = Instant::now() + SLOW_CONTROL_RUN;
    let url = proxy.url();
    let holds: Vec<Hold> = thread::scope(|s| {
        let handles: Vec<_> = (0..2 * THREADS_PER_CLIENT)
            .map(|t| {
                let (url, tally) = (&url, &tally);
                s.spawn(move || raw_thread(url, t as u64, until, tally))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let found = overlaps(&holds);
    let past = used_past_lease(&holds, |h| lease_end(h, Some(Duration::from_secs(1))));
    eprintln!(
        "netfaults [slow link, negative control: raw SET NX PX, lease from the reply, {:.0} s]: \
         {} holds; {} overlapping pairs, {} used past the lease",
        SLOW_CONTROL_RUN.as_secs_f64(),
        holds.len(),
        found.len(),
        past.len()
    );
    assert!(holds.len() > 10, "too few holds: {}", holds.len());
    assert!(
        !found.is_empty() || !past.is_empty(),
        "the checker saw nothing wrong with a lease counted from the reply"
    );
}
