//! Contention and pool pressure.
//!
//! - contended: 8 threads on one key, critical section = `GET` then `SET` of a counter on the
//!   thread's own raw connection, for a fixed wall time per configuration: Token at its defaults
//!   (watched, waiters woken by pub/sub), Token with `WakeUp::Polling` (waiters poll under the
//!   retry policy: the behaviour before waiters were woken by pub/sub), Token with a tuned policy, Reentrant at its
//!   defaults, Classic at its defaults and tuned; each with one shared
//!   `Arc<dyn DistributedLock>`, with one lock object per thread (both served by the in-process
//!   waiter queue of one `LockClient`), and with one `LockClient` per thread (no shared queue:
//!   the threads meet only in Redis, as separate processes would, and learn of a release by
//!   pub/sub or by polling); handoffs to a thread that was already waiting (its `lock()` call
//!   began before the release) are also recorded apart; the handoff comparison's configurations also with one `LockClient` per thread
//!   and a 1 ms pause after each release (so that the releaser does not take the lock straight
//!   back and every release is handed to a waiter). Sections/s, handoff latency (the releasing thread stores a
//!   timestamp right before `unlock()`, the next acquirer measures from it to when its `lock()`
//!   returned), the wait of every `lock()` call, fairness (min/max sections per thread), and a
//!   check that the counter equals the number of sections (mutual exclusion held).
//! - bare pub/sub handoff: the same handoff with bare commands on raw connections (release
//!   script publishing, the waiter reading its own subscriber connection, then `SET NX PX`):
//!   what a pub/sub handoff costs without the library.
//! - many keys: 64 threads, each cycling `try_lock` + `unlock` on its own keys (no lock
//!   contention, only pool contention), with pool sizes 16 and 64, next to the same threads doing
//!   two pooled PINGs per cycle through an r2d2 pool of the same size.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, LockError, RetryPolicy, Strategy, WakeUp};

const THREADS: usize = 8;
const MANY_THREADS: usize = 64;
const KEYS_PER_THREAD: usize = 4;
const NO_STAMP: u64 = u64::MAX;
/// The pause after each release in [`Sharing::NothingThink`]: longer than a section (~4 round
/// trips), shorter than the 8 threads' sections together, so the lock stays contended.
const THINK: Duration = Duration::from_millis(1);

#[derive(Clone, Copy)]
struct Config {
    name: &'static str,
    strategy: Strategy,
    /// `None` = the strategy's default policy.
    retry: Option<fn() -> RetryPolicy>,
    /// `None` = the strategy's default (pub/sub for Token and Reentrant).
    wake: Option<WakeUp>,
    /// The sharing modes measured.
    sharings: &'static [Sharing],
}

fn tuned_token() -> RetryPolicy {
    RetryPolicy::standard().backoff(Duration::from_millis(1), Duration::from_millis(4), 2)
}

fn tuned_classic() -> RetryPolicy {
    RetryPolicy::legacy()
        .fixed_delay(Duration::from_millis(5))
        .max_retries(None)
        .max_wait(Some(Duration::from_secs(10)))
}

const ALL_SHARINGS: &[Sharing] = &[Sharing::Lock, Sharing::Client, Sharing::Nothing];
/// The handoff comparison (pub/sub vs polling) also with a think time.
const WITH_THINK: &[Sharing] = &[
    Sharing::Lock,
    Sharing::Client,
    Sharing::Nothing,
    Sharing::NothingThink,
];

const CONFIGS: [Config; 6] = [
    Config {
        name: "token_default",
        strategy: Strategy::Token,
        retry: None,
        wake: None,
        sharings: WITH_THINK,
    },
    Config {
        name: "token_polling",
        strategy: Strategy::Token,
        retry: None,
        wake: Some(WakeUp::Polling),
        sharings: WITH_THINK,
    },
    Config {
        name: "token_tuned",
        strategy: Strategy::Token,
        retry: Some(tuned_token),
        wake: None,
        sharings: WITH_THINK,
    },
    Config {
        name: "reentrant_default",
        strategy: Strategy::Reentrant,
        retry: None,
        wake: None,
        sharings: WITH_THINK,
    },
    Config {
        name: "classic_default",
        strategy: Strategy::Classic(ClassicOptions::new()),
        retry: None,
        wake: None,
        sharings: ALL_SHARINGS,
    },
    Config {
        name: "classic_tuned",
        strategy: Strategy::Classic(ClassicOptions::new()),
        retry: Some(tuned_classic),
        wake: None,
        sharings: ALL_SHARINGS,
    },
];

/// The configurations criterion also times (shared lock).
const CRITERION_CONFIGS: [&str; 3] = ["token_default", "token_tuned", "classic_tuned"];

fn build(client: &LockClient, cfg: Config, key: &str) -> Lock {
    let mut b = client.lock(key).strategy(cfg.strategy);
    if let Some(retry) = cfg.retry {
        b = b.retry(retry());
    }
    if let Some(wake) = cfg.wake {
        b = b.wake_up(wake);
    }
    b.build().expect("lock")
}

fn main() {
    let mut env = BenchEnv::start("contended");
    let url = env.url();
    let client = lock_client(&url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    let floor_pool16 = floor_pool(&url, 16, 1);

    if env.measuring() {
        let start_floor = measure_ping_floor(&mut env, &floor_pool16);
        env.put("floor_start", "ping_pool", "p50_ns", fmt_f(start_floor));
        let dur = env.pick(Duration::from_secs(4), Duration::from_millis(300));
        for cfg in CONFIGS {
            for &sharing in cfg.sharings {
                contended(&mut env, &client, cfg, sharing, dur);
            }
        }
        let handoffs = env.pick(2_000, 20);
        bare_handoff(&mut env, handoffs);
        let (rounds, slice) = env.pick(
            (6, Duration::from_millis(400)),
            (1, Duration::from_millis(100)),
        );
        for pool_size in [16u32, 64] {
            many_keys(&mut env, pool_size, rounds, slice);
        }
        let end_floor = measure_ping_floor(&mut env, &floor_pool16);
        env.put("floor_end", "ping_pool", "p50_ns", fmt_f(end_floor));
    }

    let mut c = criterion();
    {
        let mut g = c.benchmark_group("contended");
        g.sample_size(10);
        for cfg in CONFIGS
            .into_iter()
            .filter(|c| CRITERION_CONFIGS.contains(&c.name))
        {
            let lock: Arc<dyn DistributedLock> =
                Arc::from(build(&client, cfg, &format!("crit:{}", cfg.name)));
            let redis_client = env.server.client();
            g.bench_function(format!("{}_8threads_per_section", cfg.name), |b| {
                b.iter_custom(|iters| sections_batch(&lock, &redis_client, iters))
            });
        }
        g.finish();
    }
    {
        let mut g = c.benchmark_group("many_keys");
        g.sample_size(10);
        for pool_size in [16u32, 64] {
            let client = lock_client(&url, pool_size);
            g.bench_function(format!("pool{pool_size}_64threads_per_cycle"), |b| {
                b.iter_custom(|iters| cycles_batch(&client, iters))
            });
        }
        g.finish();
    }
    c.final_summary();
    env.finish();
}

/// Per-thread results of a contended run.
#[derive(Default)]
struct ThreadOut {
    sections: u64,
    handoffs: Vec<u64>,
    /// The handoffs to a thread whose `lock()` call began before the release: it was waiting.
    waiter_handoffs: Vec<u64>,
    /// Every successful `lock()` call's duration.
    waits: Vec<u64>,
    self_handoffs: u64,
    timeouts: u64,
    errors: u64,
    lost: u64,
}

fn stamp(base: Instant, me: usize) -> u64 {
    ((base.elapsed().as_nanos() as u64) << 8) | me as u64
}

/// What the 8 contending threads share.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Sharing {
    /// One `Arc<dyn DistributedLock>`.
    Lock,
    /// One `LockClient`, a lock object per thread.
    Client,
    /// A `LockClient` per thread: like 8 processes.
    Nothing,
    /// A `LockClient` per thread, each pausing [`THINK`] after its release (outside the lock),
    /// so that a release finds the others waiting and the releaser not competing: every
    /// handoff goes to a waiter.
    NothingThink,
}

impl Sharing {
    fn label(self) -> &'static str {
        match self {
            Sharing::Lock => "shared",
            Sharing::Client => "per_thread",
            Sharing::Nothing => "client_per_thread",
            Sharing::NothingThink => "client_per_thread_think",
        }
    }
}

fn contended(
    env: &mut BenchEnv,
    client: &LockClient,
    cfg: Config,
    sharing: Sharing,
    dur: Duration,
) {
    let label = format!("{}_{}", cfg.name, sharing.label());
    let think = if sharing == Sharing::NothingThink {
        THINK
    } else {
        Duration::ZERO
    };
    let key = format!("cont:{label}");
    let counter_key = format!("cont:{label}:counter");
    let redis_client = env.server.client();
    let mut con = env.server.conn();
    let _: () = redis::cmd("SET")
        .arg(&counter_key)
        .arg(0)
        .query(&mut con)
        .expect("SET counter");

    let shared_lock: Arc<dyn DistributedLock> = Arc::from(build(client, cfg, &key));
    let stamp_cell = Arc::new(AtomicU64::new(NO_STAMP));
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let base = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|me| {
            let lock: Arc<dyn DistributedLock> = match sharing {
                Sharing::Lock => shared_lock.clone(),
                Sharing::Client => Arc::from(build(client, cfg, &key)),
                Sharing::Nothing | Sharing::NothingThink => Arc::from(build(
                    &lock_client(&env.url(), redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE),
                    cfg,
                    &key,
                )),
            };
            let mut con = redis_client.get_connection().expect("raw connection");
            let (stamp_cell, stop, barrier) = (stamp_cell.clone(), stop.clone(), barrier.clone());
            let counter_key = counter_key.clone();
            thread::spawn(move || {
                let mut out = ThreadOut::default();
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let called = Instant::now();
                    let called_at = base.elapsed().as_nanos() as u64;
                    let guard = match lock.lock() {
                        Ok(g) => g,
                        Err(LockError::Timeout { .. }) => {
                            out.timeouts += 1;
                            continue;
                        }
                        Err(e) => {
                            if out.errors == 0 {
                                eprintln!("[contended] thread {me}: {e}");
                            }
                            out.errors += 1;
                            continue;
                        }
                    };
                    let acquired = base.elapsed().as_nanos() as u64;
                    out.waits.push(called.elapsed().as_nanos() as u64);
                    let prev = stamp_cell.load(Ordering::Acquire);
                    if prev != NO_STAMP {
                        let (at, who) = (prev >> 8, (prev & 0xff) as usize);
                        if who == me {
                            out.self_handoffs += 1;
                        } else {
                            let handoff = acquired.saturating_sub(at);
                            out.handoffs.push(handoff);
                            if called_at < at {
                                out.waiter_handoffs.push(handoff);
                            }
                        }
                    }
                    // The critical section: read-modify-write of a counter.
                    let n: u64 = redis::cmd("GET")
                        .arg(&counter_key)
                        .query(&mut con)
                        .expect("GET");
                    let _: () = redis::cmd("SET")
                        .arg(&counter_key)
                        .arg(n + 1)
                        .query(&mut con)
                        .expect("SET");
                    out.sections += 1;
                    stamp_cell.store(stamp(base, me), Ordering::Release);
                    match guard.unlock() {
                        Ok(true) => {}
                        Ok(false) => out.lost += 1,
                        Err(_) => out.errors += 1,
                    }
                    if !think.is_zero() {
                        thread::sleep(think);
                    }
                }
                out
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    let outs: Vec<ThreadOut> = handles
        .into_iter()
        .map(|h| h.join().expect("contender thread"))
        .collect();
    let drained = t0.elapsed();

    let counter: u64 = redis::cmd("GET")
        .arg(&counter_key)
        .query(&mut con)
        .expect("GET counter");
    let total: u64 = outs.iter().map(|o| o.sections).sum();
    let per_thread: Vec<u64> = outs.iter().map(|o| o.sections).collect();
    let (min, max) = (
        *per_thread.iter().min().unwrap_or(&0),
        *per_thread.iter().max().unwrap_or(&0),
    );
    let mut handoffs: Vec<u64> = outs.iter().flat_map(|o| o.handoffs.clone()).collect();
    let h = Stats::of(&mut handoffs);
    let mut to_waiters: Vec<u64> = outs
        .iter()
        .flat_map(|o| o.waiter_handoffs.clone())
        .collect();
    let hw = Stats::of(&mut to_waiters);
    let mut waits: Vec<u64> = outs.iter().flat_map(|o| o.waits.clone()).collect();
    let w = Stats::of(&mut waits);
    let sum = |f: fn(&ThreadOut) -> u64| outs.iter().map(f).sum::<u64>();
    let rate = total as f64 / elapsed.as_secs_f64();
    let fairness = if max == 0 {
        0.0
    } else {
        min as f64 / max as f64
    };

    let s = "contended";
    env.put(s, &label, "threads", THREADS);
    env.put(s, &label, "think_us", think.as_micros());
    env.put(
        s,
        &label,
        "duration_s",
        format!("{:.3}", elapsed.as_secs_f64()),
    );
    env.put(
        s,
        &label,
        "drain_s",
        format!("{:.3}", drained.as_secs_f64()),
    );
    env.put(s, &label, "sections", total);
    env.put(s, &label, "sections_per_s", fmt_f(rate));
    env.put(s, &label, "fair_min", min);
    env.put(s, &label, "fair_max", max);
    env.put(s, &label, "fairness", format!("{fairness:.3}"));
    env.put(
        s,
        &label,
        "per_thread",
        per_thread
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" "),
    );
    env.put(s, &label, "self_handoffs", sum(|o| o.self_handoffs));
    env.put(s, &label, "timeouts", sum(|o| o.timeouts));
    env.put(s, &label, "errors", sum(|o| o.errors));
    env.put(s, &label, "lost", sum(|o| o.lost));
    env.put(s, &label, "counter_ok", counter == total);
    env.put_stats("handoff", &label, &h);
    env.put("handoff_pct", &label, "q_ns", percentile_points(&handoffs));
    env.put_stats("handoff_waiter", &label, &hw);
    env.put(
        "handoff_waiter_pct",
        &label,
        "q_ns",
        percentile_points(&to_waiters),
    );
    env.put_stats("wait", &label, &w);
    println!(
        "[contended] {label:<28} {rate:>8.0} sections/s  fairness {min}/{max} = {fairness:.2}  \
         handoff p50 {} p99 {} max {}  to a waiter p50 {} p99 {} ({})  wait p50 {} p99 {}  \
         (cross-thread {}, self {}, timeouts {}, errors {}, counter {})",
        us(h.p50),
        us(h.p99),
        us(h.max),
        us(hw.p50),
        us(hw.p99),
        hw.n,
        us(w.p50),
        us(w.p99),
        h.n,
        sum(|o| o.self_handoffs),
        sum(|o| o.timeouts),
        sum(|o| o.errors),
        if counter == total { "ok" } else { "MISMATCH" },
    );
}

/// The pub/sub handoff with bare commands on raw connections, `n` times: thread A holds the
/// key while thread B blocks reading its own subscriber connection; A stamps and releases with
/// the publishing unlock script (`EVALSHA unlock 1 key token 0 channel`, as the Token lock does);
/// B, on the message, sends `SET NX PX` and measures from A's stamp to the `OK`. Then B deletes
/// the key and A takes it again, untimed. Both threads run on the client core, like the
/// contenders. What a pub/sub handoff costs without the library (no subscriber thread, no wait
/// queue, no retry policy): half the release round trip until the message reaches B, plus the
/// acquire round trip.
fn bare_handoff(env: &mut BenchEnv, n: usize) {
    const KEY: &str = "bare:handoff";
    let ch = channel(KEY);
    let sha = load_unlock(&mut env.server.conn());
    let client = env.server.client();
    let base = Instant::now();
    let stamp_cell = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(2));
    let waiter = {
        let (client, ch) = (client.clone(), ch.clone());
        let (stamp_cell, ready) = (stamp_cell.clone(), ready.clone());
        thread::spawn(move || {
            let mut sub = client.get_connection().expect("subscriber connection");
            let mut con = client.get_connection().expect("raw connection");
            let mut ps = sub.as_pubsub();
            ps.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("read timeout");
            ps.subscribe(&ch).expect("SUBSCRIBE");
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                ready.wait(); // A holds the key.
                ps.get_message().expect("release message");
                assert!(set_nx_px(&mut con, KEY, &token(), 10_000), "key still held");
                let at = base.elapsed().as_nanos() as u64;
                lat.push(at.saturating_sub(stamp_cell.load(Ordering::Acquire)));
                let _: () = redis::cmd("DEL").arg(KEY).query(&mut con).expect("DEL");
                ready.wait(); // The key is free again.
            }
            lat
        })
    };
    let mut con = client.get_connection().expect("raw connection");
    let mut release = Vec::with_capacity(n);
    for _ in 0..n {
        let t = token();
        assert!(set_nx_px(&mut con, KEY, &t, 10_000), "key not freed");
        ready.wait();
        // Let B reach its blocking read, as a waiter asleep in lock() would be.
        thread::sleep(Duration::from_micros(200));
        let t0 = Instant::now();
        stamp_cell.store(base.elapsed().as_nanos() as u64, Ordering::Release);
        assert!(evalsha_unlock_publish(&mut con, &sha, KEY, &ch, &t));
        release.push(t0.elapsed().as_nanos() as u64);
        ready.wait();
    }
    let mut lat = waiter.join().expect("bare waiter");
    let h = Stats::of(&mut lat);
    let r = Stats::of(&mut release);
    env.put_stats("bare_handoff", "pubsub", &h);
    env.put_stats("bare_handoff", "release", &r);
    println!(
        "[contended] bare pub/sub handoff p50 {} p99 {} (release round trip p50 {}), {} handoffs",
        us(h.p50),
        us(h.p99),
        us(r.p50),
        h.n
    );
}

/// What each of the 64 threads does per cycle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    /// `try_lock()` + `unlock()` on its own keys through a `LockClient`.
    TokenCycle,
    /// Two PINGs, one r2d2 checkout each.
    Ping2,
    /// The Token cycle's two commands sent bare (`SET NX PX`, `EVALSHA` of the publishing
    /// unlock), one checkout each.
    Bare,
}

impl Work {
    const ALL: [Work; 3] = [Work::TokenCycle, Work::Bare, Work::Ping2];

    fn name(self) -> &'static str {
        match self {
            Work::TokenCycle => "token_cycle",
            Work::Bare => "bare",
            Work::Ping2 => "ping2",
        }
    }
}

/// One slice of the many-keys run: 64 threads doing `work` for `dur`. Returns every cycle's
/// latency (ns), the number of failed cycles and the slice's wall time.
fn many_keys_slice(
    client: &LockClient,
    pool: &r2d2::Pool<redis::Client>,
    sha: &str,
    work: Work,
    dur: Duration,
) -> (Vec<u64>, u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(MANY_THREADS + 1));
    let handles: Vec<_> = (0..MANY_THREADS)
        .map(|me| {
            let (client, pool) = (client.clone(), pool.clone());
            let (stop, barrier, sha) = (stop.clone(), barrier.clone(), sha.to_owned());
            thread::spawn(move || {
                let locks: Vec<_> = (0..KEYS_PER_THREAD)
                    .map(|k| client.lock(format!("mk:{me}:{k}")).build().expect("lock"))
                    .collect();
                let channels: Vec<String> = locks.iter().map(|l| channel(l.key())).collect();
                let mut lat = Vec::with_capacity(1024);
                let mut errors = 0u64;
                barrier.wait();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let ok = match work {
                        Work::Ping2 => {
                            let a = pool.get().map(|mut c| ping(&mut c)).is_ok();
                            a && pool.get().map(|mut c| ping(&mut c)).is_ok()
                        }
                        Work::Bare => {
                            let key = locks[i % KEYS_PER_THREAD].key();
                            let t = token();
                            let a = pool
                                .get()
                                .is_ok_and(|mut c| set_nx_px(&mut c, key, &t, 10_000));
                            let ch = &channels[i % KEYS_PER_THREAD];
                            a && pool.get().is_ok_and(|mut c| {
                                evalsha_unlock_publish(&mut c, &sha, key, ch, &t)
                            })
                        }
                        Work::TokenCycle => match locks[i % KEYS_PER_THREAD].try_lock() {
                            Ok(g) => matches!(g.unlock(), Ok(true)),
                            Err(_) => false,
                        },
                    };
                    if ok {
                        lat.push(t.elapsed().as_nanos() as u64);
                    } else {
                        errors += 1;
                    }
                    i += 1;
                }
                (lat, errors)
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (lat, e) = h.join().expect("many-keys thread");
        all.extend(lat);
        errors += e;
    }
    (all, errors, t0.elapsed())
}

/// 64 threads on their own keys, pool of `pool_size`: the Token cycle, the same commands sent
/// bare, and two PINGs, in `rounds` interleaved slices of `slice` each (so that the machine's
/// drift hits all three alike).
fn many_keys(env: &mut BenchEnv, pool_size: u32, rounds: usize, slice: Duration) {
    let url = env.url();
    let client = lock_client(&url, pool_size);
    let pool = floor_pool(&url, pool_size, pool_size);
    let sha = load_unlock(&mut env.server.conn());
    // Warm-up: open the library pool's connections too.
    for work in Work::ALL {
        many_keys_slice(&client, &pool, &sha, work, slice / 2);
    }
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); 3];
    let mut errors = [0u64; 3];
    let mut secs = [0f64; 3];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for round in 0..rounds {
        for k in 0..3 {
            let w = (round + k) % 3;
            let (l, e, d) = many_keys_slice(&client, &pool, &sha, Work::ALL[w], slice);
            rates[w].push(l.len() as f64 / d.as_secs_f64());
            lat[w].extend(l);
            errors[w] += e;
            secs[w] += d.as_secs_f64();
        }
    }
    let paired = |a: usize, b: usize| {
        let mut r: Vec<f64> = rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let s = "many_keys";
    for (w, work) in Work::ALL.iter().enumerate() {
        let label = format!("{}_pool{pool_size}", work.name());
        let st = Stats::of(&mut lat[w]);
        let rate = st.n as f64 / secs[w];
        env.put(s, &label, "threads", MANY_THREADS);
        env.put(s, &label, "pool_size", pool_size);
        env.put(s, &label, "rounds", rounds);
        env.put(s, &label, "duration_s", format!("{:.3}", secs[w]));
        env.put(s, &label, "cycles_per_s", fmt_f(rate));
        env.put(s, &label, "paired_vs_bare", format!("{:.4}", paired(w, 1)));
        env.put(s, &label, "paired_vs_ping2", format!("{:.4}", paired(w, 2)));
        env.put(s, &label, "errors", errors[w]);
        env.put(
            s,
            &label,
            "connections",
            if *work == Work::TokenCycle {
                client.pool_state().connections
            } else {
                pool.state().connections
            },
        );
        env.put_stats("many_keys_latency", &label, &st);
        println!(
            "[many_keys] {label:<20} {rate:>8.0} cycles/s (paired: {:.3} x bare, {:.3} x ping2)  \
             p50 {} p99 {} (errors {})",
            paired(w, 1),
            paired(w, 2),
            us(st.p50),
            us(st.p99),
            errors[w]
        );
    }
}

/// Criterion: `iters` sections split over 8 threads on one shared lock; wall time scaled to
/// `iters` sections.
fn sections_batch(
    lock: &Arc<dyn DistributedLock>,
    redis_client: &redis::Client,
    iters: u64,
) -> Duration {
    let each = iters.div_ceil(THREADS as u64).max(1);
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let lock = lock.clone();
            let barrier = barrier.clone();
            let mut con = redis_client.get_connection().expect("raw connection");
            let key = format!("{}:counter", lock.key());
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..each {
                    let g = lock.lock().expect("lock within the policy");
                    let n: Option<u64> = redis::cmd("GET").arg(&key).query(&mut con).expect("GET");
                    let _: () = redis::cmd("SET")
                        .arg(&key)
                        .arg(n.unwrap_or(0) + 1)
                        .query(&mut con)
                        .expect("SET");
                    drop(g);
                }
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    for h in handles {
        h.join().expect("section thread");
    }
    t.elapsed()
        .mul_f64(iters as f64 / (each * THREADS as u64) as f64)
}

/// Criterion: `iters` uncontended cycles split over 64 threads on their own keys.
fn cycles_batch(client: &LockClient, iters: u64) -> Duration {
    let each = iters.div_ceil(MANY_THREADS as u64).max(1);
    let barrier = Arc::new(Barrier::new(MANY_THREADS + 1));
    let handles: Vec<_> = (0..MANY_THREADS)
        .map(|me| {
            let client = client.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let lock = client.lock(format!("crit:mk:{me}")).build().expect("lock");
                barrier.wait();
                for _ in 0..each {
                    let g = lock.try_lock().expect("own key is free");
                    assert!(g.unlock().expect("unlock"));
                }
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    for h in handles {
        h.join().expect("cycle thread");
    }
    t.elapsed()
        .mul_f64(iters as f64 / (each * MANY_THREADS as u64) as f64)
}
