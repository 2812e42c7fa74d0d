//! Classic with a client whose clock runs ahead: the mode's limit.
//!
//! Classic (the legacy SETNX/GETSET lock) stores the holder's expiry as a wall-clock timestamp,
//! `now + ttl + clock_skew`, and every contender judges it by its **own** wall clock. A
//! contender whose clock is ahead of the holder's by `J` therefore sees the hold expire
//! `J - clock_skew` before it does; when `J` exceeds `clock_skew` it takes over a live hold.
//!
//! Here the holder is this process (the host's clock) and the contender a child process, this
//! test binary re-run under `faketime -f +Js` (Debian's `faketime`, an `LD_PRELOAD` library that
//! shifts `CLOCK_REALTIME` only: `FAKETIME_DONT_FAKE_MONOTONIC=1` keeps `CLOCK_MONOTONIC`, which
//! the histories are recorded on, common to both processes). The holder takes a Classic hold of
//! [`TTL`] with a [`SKEW`] allowance and keeps it until its lease is nearly over; the contender
//! starts waiting for the key at once. Both record their holds (tests/support/history.rs).
//!
//! - **Within the allowance** (`J` = [`SKEW`] / 2): the contender gets the key only after the
//!   holder released it; no two validity windows overlap.
//! - **Beyond it** (`J` = [`SKEW`] + 2 s, still less than `TTL + SKEW`): the contender takes the
//!   live hold over about `TTL + SKEW - J` after it was written, and the history checker
//!   reports the double grant. This case is the checker's negative control.
//!
//! Needs `faketime` on PATH (`apt-get install faketime`; .ci/run installs it).
//! docs/compatibility.md describes the limit, docs/reliability.md the figures.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_dlock::{ClassicOptions, DistributedLock, Lock, LockAdmin, LockClient, Strategy};
use support::history::{self, decode, now_ns, overlaps, Hold, Recorder};
use support::{init_logging, RedisServer};

/// The holds' lifetime.
const TTL: Duration = Duration::from_secs(3);
/// The Classic clock-skew allowance of both clients.
const SKEW: Duration = Duration::from_secs(2);
/// The holder releases when this much of its lease is left.
const RELEASE_BEFORE_END: Duration = Duration::from_millis(150);
/// How long the contender keeps the key it got.
const CONTENDER_HOLD: Duration = Duration::from_millis(200);
/// How long the contender waits for the key: past the holder's release in every case.
const CONTENDER_WAIT: Duration = Duration::from_secs(8);

const ENV_WORKER: &str = "DLOCK_JUMP_WORKER";
const ENV_URL: &str = "DLOCK_JUMP_URL";
const ENV_KEY: &str = "DLOCK_JUMP_KEY";
const ENV_OUT: &str = "DLOCK_JUMP_OUT";

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

fn classic(client: &LockClient, key: &str) -> Lock {
    client
        .lock(key)
        .ttl(TTL)
        .strategy(Strategy::Classic(ClassicOptions::new().clock_skew(SKEW)))
        .build()
        .expect("a Classic lock")
}

/// What one case saw.
struct Outcome {
    holder: Hold,
    contender: Option<Hold>,
    /// The contender's wall clock minus the host's, as it measured them (ms).
    offset_ms: i64,
    /// The contender's `CLOCK_MONOTONIC` minus the host's, as it measured them (ms): about 0.
    monotonic_offset_ms: i64,
    /// The holder's `unlock()`: `Ok(true)` unless its hold was taken over.
    released_intact: bool,
    found: Vec<history::Overlap>,
}

/// Runs one case: a hold by this process, a contender whose clock is ahead by `jump`.
fn case(jump: Duration) -> Outcome {
    init_logging();
    let server = RedisServer::start();
    let key = format!("jump:{}", jump.as_millis());
    let out = server.dir().join("contender-history");
    let client = LockClient::open(server.url()).expect("client");
    let lock = classic(&client, &key);
    let mut rec = Recorder::new(1);

    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new("faketime")
        .arg("-f")
        .arg(format!("+{}s", jump.as_secs_f64()))
        .arg(exe)
        .args([
            "--exact",
            "clock_jump_worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env(ENV_WORKER, "1")
        .env(ENV_URL, server.url())
        .env(ENV_KEY, &key)
        .env(ENV_OUT, &out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("faketime is installed (apt-get install faketime)");
    // Its stdout, line by line: it says when it is ready to wait for the key (connected), so
    // that its start-up time does not count against the hold's lease.
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("the contender's stdout");
    let reader = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    let ready = Instant::now() + Duration::from_secs(30);
    loop {
        match lines.recv_timeout(ready.saturating_duration_since(Instant::now())) {
            Ok(line) if line.starts_with("JUMP_READY") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the contender did not get ready: {e}");
            }
        }
    }

    let open = rec.begin(0);
    let guard = lock.try_lock().expect("the key is free");
    let held = open.acquired();
    // The holder keeps its hold until its lease is nearly over, as a holder that trusts it.
    assert!(support::wait_until(Duration::from_secs(60), || guard
        .remaining()
        <= RELEASE_BEFORE_END));
    rec.release(held, guard.remaining(), guard.is_lost());
    let released_intact = matches!(guard.unlock(), Ok(true));

    let mut status = None;
    let finished = support::wait_until(CONTENDER_WAIT + Duration::from_secs(20), || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    if !finished {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the contender did not finish");
    }
    let status = status.expect("finished");
    let output = child.wait_with_output().expect("the contender's output");
    let stdout = reader.join().expect("the reader of the contender's stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        status.success(),
        "the contender failed ({status})\n{stdout}\n{stderr}"
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("JUMP_CLOCKS "))
        .unwrap_or_else(|| panic!("no clocks from the contender (filtered out?)\n{stdout}"));
    let n: Vec<i64> = line
        .split_whitespace()
        .map(|x| x.parse().expect("numbers"))
        .collect();
    let (offset_ms, monotonic_offset_ms) = (n[0], n[1]);
    let contender = decode(&std::fs::read(&out).expect("the contender's history"));
    let mut holds = rec.holds().to_vec();
    holds.extend_from_slice(&contender);
    let found = overlaps(&holds);
    let epoch = held_epoch(&holds);
    eprintln!(
        "clock_jump +{jump:?} (skew {SKEW:?}, ttl {TTL:?}): contender's clock measured {offset_ms} \
         ms ahead (monotonic {monotonic_offset_ms} ms); holder [{:.0}, {:.0}) ms, released \
         Ok(true): {released_intact}; contender {}; {}",
        ms(holds[0].window().0, epoch),
        ms(holds[0].window().1, epoch),
        contender.first().map_or("took nothing".to_owned(), |h| format!(
            "[{:.0}, {:.0}) ms",
            ms(h.window().0, epoch),
            ms(h.window().1, epoch)
        )),
        history::describe(&found, epoch)
    );
    Outcome {
        holder: holds[0],
        contender: contender.first().copied(),
        offset_ms,
        monotonic_offset_ms,
        released_intact,
        found,
    }
}

fn held_epoch(holds: &[Hold]) -> u64 {
    holds.iter().map(|h| h.invoked).min().unwrap_or(0)
}

fn ms(t: u64, epoch: u64) -> f64 {
    (t as i64 - epoch as i64) as f64 / 1e6
}

/// The clock of the child really was shifted by about `jump`, and only the wall clock.
fn check_clocks(o: &Outcome, jump: Duration) {
    let jump_ms = jump.as_millis() as i64;
    assert!(
        (o.offset_ms - jump_ms).abs() < 500,
        "the contender's wall clock is {} ms ahead, not about {jump_ms} ms: faketime did not \
         take",
        o.offset_ms
    );
    assert!(
        o.monotonic_offset_ms.abs() < 500,
        "the contender's CLOCK_MONOTONIC is {} ms off ours: the histories do not merge",
        o.monotonic_offset_ms
    );
}

#[test]
fn a_clock_ahead_within_the_skew_allowance_does_not_take_a_live_hold_over() {
    let jump = SKEW / 2;
    let o = case(jump);
    check_clocks(&o, jump);
    let contender = o
        .contender
        .expect("the contender got the key once it was free");
    assert!(
        o.found.is_empty(),
        "holds overlapped: {}",
        history::describe(&o.found, o.holder.invoked)
    );
    // Its window ends at its release, or at its lease's end (3 s) if a stall delayed the
    // release: the contender's takeover would come 1 s after that.
    assert!(
        contender.acquired >= o.holder.window().1,
        "the contender got the key while the holder held it"
    );
}

/// The negative control: the same run with the clock ahead by more than the allowance. The
/// contender takes the live hold over, and the history checker reports it.
#[test]
fn a_clock_ahead_beyond_the_skew_allowance_takes_a_live_hold_over() {
    let jump = SKEW + Duration::from_secs(2);
    assert!(
        jump < TTL + SKEW,
        "the takeover happens while the hold is live"
    );
    let o = case(jump);
    check_clocks(&o, jump);
    let contender = o.contender.expect("the contender took the key over");
    assert!(
        !o.found.is_empty(),
        "no overlap reported with a clock {jump:?} ahead (allowance {SKEW:?}): the checker or \
         the clock jump failed"
    );
    assert!(
        contender.acquired < o.holder.released,
        "the contender took the key while the holder still held it"
    );
    assert!(
        !o.released_intact,
        "the holder's release found its value, though the key was taken over"
    );
}

/// The contender, under `faketime`: reports its clocks, waits for the key, keeps it a moment,
/// writes its history.
#[test]
fn clock_jump_worker() {
    if std::env::var_os(ENV_WORKER).is_none() {
        return;
    }
    init_logging();
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let client = LockClient::open(env(ENV_URL)).expect("client");
    let key = env(ENV_KEY);
    let lock = classic(&client, &key);
    let mut rec = Recorder::new(2);
    // Connected (a lock state read opens a pooled connection), ready: the holder takes the key
    // now; we wait for it to exist, then wait for the key as a contender.
    let mut raw = redis::Client::open(env(ENV_URL))
        .expect("url")
        .get_connection()
        .expect("connect");
    let _: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query(&mut raw)
        .expect("EXISTS");
    assert!(
        !lock.is_locked().expect("the lock's state"),
        "the key is free"
    );
    println!("\nJUMP_READY");
    let seen = support::wait_until(Duration::from_secs(30), || {
        redis::cmd("EXISTS")
            .arg(&key)
            .query::<bool>(&mut raw)
            .expect("EXISTS")
    });
    assert!(seen, "the holder did not take the key");
    let open = rec.begin(0);
    let result = lock.try_lock_for(CONTENDER_WAIT);
    if let Ok(guard) = result {
        let held = open.acquired();
        support::work(CONTENDER_HOLD);
        rec.release(held, guard.remaining(), guard.is_lost());
        let _ = guard.unlock();
    }
    std::fs::write(PathBuf::from(env(ENV_OUT)), rec.encode()).expect("write the history");
    report_clocks();
}

/// Prints `JUMP_CLOCKS <wall offset ms> <monotonic offset ms>`: our clocks as the library
/// reads them (through libc, which `faketime` wraps) minus the host's (the same clocks read by
/// raw system calls, past the wrapper).
fn report_clocks() {
    let wall = epoch_ms() - raw_clock(libc::CLOCK_REALTIME) / 1_000_000;
    let mono = (now_ns() as i64 - raw_clock(libc::CLOCK_MONOTONIC)) / 1_000_000;
    println!("\nJUMP_CLOCKS {wall} {mono}");
}

/// The host's clock `clock` in ns: `clock_gettime` by a raw system call, past `faketime`'s
/// `LD_PRELOAD` wrapper of the libc function.
fn raw_clock(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write; both clocks always exist.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clock_gettime,
            clock,
            &mut ts as *mut libc::timespec,
        )
    };
    assert_eq!(rc, 0, "clock_gettime system call");
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}
