//! The fair lock (`Strategy::Fair`) next to Token in the same run: the barging
//! baseline (Token with `WakeUp::Polling`) and Token at its defaults (pub/sub, handoff
//! courtesy).
//!
//! Two layouts, each on one key: 8 threads with a `LockClient` each (they meet only in Redis,
//! as processes do), and 4 processes × 2 threads (this binary re-run as child processes, one
//! `LockClient` per process shared by its 2 threads). The critical section is `GET` + `SET` of
//! a counter on the thread's own raw connection. Every section records, by the wall clock
//! (`SystemTime`, the same in every process), when its `lock()` was called, when it returned
//! and when `unlock()` was called; after a run the sections are put in acquire order:
//!
//! - handoff: from the previous section's `unlock()` call to this `lock()`'s return, counted
//!   only when this `lock()` began before that release (the thread was waiting) and the holder
//!   changed;
//! - changed hands: the share of sections whose holder differs from the previous section's;
//! - wait: every `lock()` call's duration; section: `lock()` return to `unlock()` call;
//!   turn: one `lock()`'s return to the next one's (a section and the handoff after it). The
//!   wait p99 is put against contenders × section p50 (the fair lock's target) and against
//!   contenders × turn p50 (what a line of that many waiters served in turn would wait);
//! - violations: sections that began before the previous one ended (the counter must equal
//!   the number of sections too).
//!
//! The RTT is the p50 of 1,000 pooled `PING`s measured before each round. Configurations run
//! interleaved, in rotated order, for `DLOCK_FAIR_ROUNDS` rounds (default 5) of
//! `DLOCK_FAIR_SECS` seconds (default 3) each. Printed: per round, and the median, lowest and
//! highest over the rounds of every figure and of the per-round ratio of sections/s to the
//! barging baseline.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, Strategy, WakeUp};

const THREADS: usize = 8;
const PROCESSES: usize = 4;
const PER_PROCESS: usize = 2;
const CHILD_ENV: &str = "DLOCK_FAIR_BENCH_CHILD";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Fair,
    TokenPolling,
    TokenDefault,
}

const CONFIGS: [Config; 3] = [Config::Fair, Config::TokenPolling, Config::TokenDefault];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Fair => "fair",
            Config::TokenPolling => "token_polling",
            Config::TokenDefault => "token_default",
        }
    }

    fn from_name(s: &str) -> Config {
        CONFIGS
            .into_iter()
            .find(|c| c.name() == s)
            .expect("a config name")
    }

    fn build(self, client: &LockClient, key: &str) -> Lock {
        match self {
            Config::Fair => client.lock(key).strategy(Strategy::Fair).build(),
            Config::TokenPolling => client.lock(key).wake_up(WakeUp::Polling).build(),
            Config::TokenDefault => client.lock(key).build(),
        }
        .expect("lock")
    }
}

/// One section: (lock() called, lock() returned, unlock() called, holder), wall-clock ns.
type Rec = (u64, u64, u64, u32);

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Runs `threads` contenders on `key` from `start` (wall ns) for `dur`, each with the lock
/// `make` builds for it; returns their sections and the errors seen.
fn contend(
    url: &str,
    key: &str,
    threads: usize,
    id_base: u32,
    start: u64,
    dur: Duration,
    make: impl Fn(usize) -> Arc<dyn DistributedLock>,
) -> (Vec<Rec>, u64) {
    let counter = format!("{key}:counter");
    let stop_at = start + dur.as_nanos() as u64;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let lock = make(i);
            let mut con = redis::Client::open(url)
                .and_then(|c| c.get_connection())
                .expect("raw connection");
            let counter = counter.clone();
            let barrier = Arc::clone(&barrier);
            let me = id_base + i as u32;
            thread::spawn(move || {
                let mut recs = Vec::with_capacity(1 << 14);
                let mut errors = 0u64;
                barrier.wait();
                let wait = start.saturating_sub(now_ns());
                thread::sleep(Duration::from_nanos(wait));
                while now_ns() < stop_at {
                    let called = now_ns();
                    let guard = match lock.lock() {
                        Ok(g) => g,
                        Err(e) => {
                            if errors == 0 {
                                eprintln!("[fair bench] {me}: {e}");
                            }
                            errors += 1;
                            continue;
                        }
                    };
                    let got = now_ns();
                    let n: u64 = redis::cmd("GET")
                        .arg(&counter)
                        .query::<Option<u64>>(&mut con)
                        .expect("GET")
                        .unwrap_or(0);
                    let _: () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(n + 1)
                        .query(&mut con)
                        .expect("SET");
                    let released = now_ns();
                    match guard.unlock() {
                        Ok(true) => {}
                        _ => errors += 1,
                    }
                    recs.push((called, got, released, me));
                }
                (recs, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (r, e) = h.join().expect("contender");
        all.extend(r);
        errors += e;
    }
    (all, errors)
}

/// A child process: `PER_PROCESS` threads on one `LockClient`; prints its sections.
fn child() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}"));
    let url = var("DLOCK_URL");
    let key = var("DLOCK_KEY");
    let cfg = Config::from_name(&var("DLOCK_CONFIG"));
    let start: u64 = var("DLOCK_START").parse().expect("start");
    let dur = Duration::from_millis(var("DLOCK_MS").parse().expect("ms"));
    let id_base: u32 = var("DLOCK_ID").parse().expect("id");
    let client = lock_client(&url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    let (recs, errors) = contend(&url, &key, PER_PROCESS, id_base, start, dur, |_| {
        Arc::from(cfg.build(&client, &key))
    });
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (a, b, c, d) in recs {
        writeln!(out, "R {a} {b} {c} {d}").expect("write");
    }
    writeln!(out, "E {errors}").expect("write");
    out.flush().expect("flush");
}

/// The figures of one run.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    sections_per_s: f64,
    changed_pct: f64,
    wait_p99_us: f64,
    section_p50_us: f64,
    /// wait p99 / (contenders × section p50): the target is ≤ 1.5.
    wait_ratio: f64,
    /// The median turn: from one `lock()`'s return to the next one's (in any thread), a
    /// section and the handoff after it.
    turn_p50_us: f64,
    /// wait p99 / (contenders × turn p50): the wait against a line of perfect turns.
    wait_turn_ratio: f64,
    handoff_p50_us: f64,
    handoff_p99_us: f64,
    handoff_p50_rtt: f64,
    violations: u64,
    counter_ok: bool,
    errors: u64,
}

fn analyse(
    mut recs: Vec<Rec>,
    dur: Duration,
    contenders: usize,
    rtt_ns: f64,
    counter: u64,
    errors: u64,
) -> Figures {
    recs.sort_by_key(|r| r.1);
    let n = recs.len();
    let mut changed = 0usize;
    let mut violations = 0u64;
    let mut handoffs = Vec::new();
    let mut waits: Vec<u64> = recs.iter().map(|r| r.1 - r.0).collect();
    let mut sections: Vec<u64> = recs.iter().map(|r| r.2.saturating_sub(r.1)).collect();
    let mut turns: Vec<u64> = recs.windows(2).map(|w| w[1].1 - w[0].1).collect();
    for w in recs.windows(2) {
        let (prev, cur) = (w[0], w[1]);
        if cur.1 < prev.2 {
            violations += 1;
        }
        if cur.3 != prev.3 {
            changed += 1;
            if cur.0 < prev.2 {
                handoffs.push(cur.1.saturating_sub(prev.2));
            }
        }
    }
    let w = Stats::of(&mut waits);
    let s = Stats::of(&mut sections);
    let h = Stats::of(&mut handoffs);
    let t = Stats::of(&mut turns);
    Figures {
        sections_per_s: n as f64 / dur.as_secs_f64(),
        changed_pct: 100.0 * changed as f64 / (n.max(2) - 1) as f64,
        wait_p99_us: w.p99 / 1e3,
        section_p50_us: s.p50 / 1e3,
        wait_ratio: w.p99 / (contenders as f64 * s.p50),
        turn_p50_us: t.p50 / 1e3,
        wait_turn_ratio: w.p99 / (contenders as f64 * t.p50),
        handoff_p50_us: h.p50 / 1e3,
        handoff_p99_us: h.p99 / 1e3,
        handoff_p50_rtt: h.p50 / rtt_ns,
        violations,
        counter_ok: counter == n as u64,
        errors,
    }
}

fn read_counter(url: &str, key: &str) -> u64 {
    let mut con = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("conn");
    redis::cmd("GET")
        .arg(format!("{key}:counter"))
        .query::<Option<u64>>(&mut con)
        .expect("GET")
        .unwrap_or(0)
}

fn run_threads(url: &str, cfg: Config, round: usize, dur: Duration, rtt: f64) -> Figures {
    let key = format!("fairbench:{}:threads:{round}", cfg.name());
    let clients: Vec<LockClient> = (0..THREADS)
        .map(|_| lock_client(url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE))
        .collect();
    let start = now_ns() + 200_000_000;
    let (recs, errors) = contend(url, &key, THREADS, 0, start, dur, |i| {
        Arc::from(cfg.build(&clients[i], &key))
    });
    analyse(recs, dur, THREADS, rtt, read_counter(url, &key), errors)
}

fn run_processes(url: &str, cfg: Config, round: usize, dur: Duration, rtt: f64) -> Figures {
    let key = format!("fairbench:{}:procs:{round}", cfg.name());
    let exe = std::env::current_exe().expect("this binary");
    // Room for the children to start and connect.
    let start = now_ns() + 1_500_000_000;
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            Command::new(&exe)
                .env(CHILD_ENV, "1")
                .env("DLOCK_URL", url)
                .env("DLOCK_KEY", &key)
                .env("DLOCK_CONFIG", cfg.name())
                .env("DLOCK_START", start.to_string())
                .env("DLOCK_MS", dur.as_millis().to_string())
                .env("DLOCK_ID", (p * PER_PROCESS).to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    let mut recs = Vec::new();
    let mut errors = 0;
    for mut child in children {
        let out = child.stdout.take().expect("stdout");
        for line in BufReader::new(out).lines() {
            let line = line.expect("line");
            let mut parts = line.split_whitespace();
            match parts.next() {
                Some("R") => {
                    let v: Vec<u64> = parts.map(|p| p.parse().expect("number")).collect();
                    recs.push((v[0], v[1], v[2], v[3] as u32));
                }
                Some("E") => {
                    errors += parts
                        .next()
                        .and_then(|e| e.parse::<u64>().ok())
                        .unwrap_or(0)
                }
                _ => {}
            }
        }
        assert!(child.wait().expect("wait").success(), "a child failed");
    }
    analyse(
        recs,
        dur,
        PROCESSES * PER_PROCESS,
        rtt,
        read_counter(url, &key),
        errors,
    )
}

fn rtt_ns(url: &str) -> f64 {
    let pool = floor_pool(url, 4, 1);
    let mut con = pool.get().expect("pooled");
    let mut v: Vec<u64> = (0..1_000)
        .map(|_| {
            let t = Instant::now();
            ping(&mut con);
            t.elapsed().as_nanos() as u64
        })
        .collect();
    Stats::of(&mut v).p50
}

/// The uncontended cycle (`lock()` + `unlock()`, watched) of the fair lock and of Token, timed
/// one by one in interleaved rounds with a pooled `PING`; ratio to two PINGs as in
/// `benches/cycle.rs` (median over rounds of the paired medians).
fn uncontended(env: &mut BenchEnv, url: &str) {
    let client = lock_client(url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    let fair = client
        .lock("fairbench:cycle:fair")
        .strategy(Strategy::Fair)
        .build()
        .expect("lock");
    let token = client.lock("fairbench:cycle:token").build().expect("lock");
    let pool = floor_pool(url, 16, 1);
    let (rounds, per) = env.pick((100, 120), (5, 20));
    let (acquire_sha, release_sha) = {
        let scripts = redis_dlock::bench_hooks::Scripts::new();
        let mut con = pool.get().expect("pooled");
        (
            load_script(&mut con, scripts.fair_acquire_code()),
            load_script(&mut con, scripts.fair_release_code()),
        )
    };
    let keys = [
        "fairbench:cycle:bare",
        "dlock_fair_q:{fairbench:cycle:bare}",
        "dlock_fair_d:{fairbench:cycle:bare}",
    ];
    let mut variants = [
        Variant::new("ping", || {
            let mut con = pool.get().expect("pooled");
            ping(&mut con);
        }),
        Variant::new("fair", || {
            let g = fair.lock().expect("lock");
            assert!(g.unlock().expect("unlock"));
        }),
        Variant::new("token", || {
            let g = token.lock().expect("lock");
            assert!(g.unlock().expect("unlock"));
        }),
        Variant::new("bare", || {
            let mut con = pool.get().expect("pooled");
            let t = common::token();
            let _: redis::Value = redis::cmd("EVALSHA")
                .arg(&acquire_sha)
                .arg(3)
                .arg(&keys[..])
                .arg(&t[..])
                .arg(30_000)
                .arg("w")
                .arg(2_000)
                .arg(600)
                .arg("dlock_fair_ch:")
                .query(&mut *con)
                .expect("acquire");
            drop(con);
            let mut con = pool.get().expect("pooled");
            let _: redis::Value = redis::cmd("EVALSHA")
                .arg(&release_sha)
                .arg(3)
                .arg(&keys[..])
                .arg(&t[..])
                .arg(600)
                .arg("dlock_fair_ch:")
                .query(&mut *con)
                .expect("release");
        }),
    ];
    let samples = interleaved(&mut variants, rounds, per);
    let fair_ratio = paired_ratio(&samples[1], &samples[0], per) / 2.0;
    let token_ratio = paired_ratio(&samples[2], &samples[0], per) / 2.0;
    let bare_ratio = paired_ratio(&samples[3], &samples[0], per) / 2.0;
    let over_bare = paired_ratio(&samples[1], &samples[3], per);
    let p50 = |i: usize| Stats::of(&mut samples[i].clone()).p50 / 1e3;
    println!(
        "[fair] uncontended cycle / 2 pooled PINGs: fair {fair_ratio:.3}x, token {token_ratio:.3}x, \
         the fair scripts sent bare {bare_ratio:.3}x, fair / bare {over_bare:.3}x \
         (p50 fair {:.1} µs, token {:.1} µs, PING {:.1} µs; {rounds} rounds of {per})",
        p50(1),
        p50(2),
        p50(0)
    );
    env.put(
        "cycle",
        "fair",
        "ratio_to_2ping",
        format!("{fair_ratio:.3}"),
    );
    env.put(
        "cycle",
        "token",
        "ratio_to_2ping",
        format!("{token_ratio:.3}"),
    );
}

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let mut env = BenchEnv::start("fair");
    if !env.measuring() {
        return;
    }
    let url = env.url();
    let num = env_num;
    let rounds = env.pick(num("DLOCK_FAIR_ROUNDS", 5), 1) as usize;
    let dur = env.pick(
        Duration::from_secs(num("DLOCK_FAIR_SECS", 3)),
        Duration::from_millis(300),
    );
    println!("[fair] load average at start: {}", loadavg());
    uncontended(&mut env, &url);
    let layouts = ["8 threads, a LockClient each", "4 processes x 2 threads"];
    // results[layout][config] = figures per round; rtts per round.
    let mut results = vec![vec![Vec::new(); CONFIGS.len()]; layouts.len()];
    let mut rtts = Vec::new();
    for round in 0..rounds {
        let rtt = rtt_ns(&url);
        rtts.push(rtt);
        for k in 0..CONFIGS.len() {
            let ci = (round + k) % CONFIGS.len();
            let cfg = CONFIGS[ci];
            for (li, layout) in layouts.iter().enumerate() {
                let f = if li == 0 {
                    run_threads(&url, cfg, round, dur, rtt)
                } else {
                    run_processes(&url, cfg, round, dur, rtt)
                };
                println!(
                    "[fair] round {round} {layout:<29} {:<14} {:>8.0} sections/s, {:>5.1} % changed \
                     hands, wait p99 {:>8.0} µs ({:.2} x contenders x section p50 {:.0} µs, \
                     {:.2} x contenders x turn p50 {:.0} µs), handoff p50 {:>6.0} µs ({:.2} RTT) \
                     p99 {:>6.0} µs; violations {}, counter {}, errors {}",
                    cfg.name(),
                    f.sections_per_s,
                    f.changed_pct,
                    f.wait_p99_us,
                    f.wait_ratio,
                    f.section_p50_us,
                    f.wait_turn_ratio,
                    f.turn_p50_us,
                    f.handoff_p50_us,
                    f.handoff_p50_rtt,
                    f.handoff_p99_us,
                    f.violations,
                    if f.counter_ok { "exact" } else { "WRONG" },
                    f.errors
                );
                results[li][ci].push(f);
            }
        }
    }
    println!("[fair] load average at end: {}", loadavg());
    let (rtt_med, rtt_lo, rtt_hi) = median_lo_hi(rtts.clone());
    println!(
        "\n[fair] {rounds} rounds of {dur:?}; RTT (pooled PING p50) median {:.1} µs ({:.1}–{:.1})",
        rtt_med / 1e3,
        rtt_lo / 1e3,
        rtt_hi / 1e3
    );
    env.put("meta", "run", "rounds", rounds);
    env.put("meta", "run", "rtt_p50_ns", format!("{rtt_med:.0}"));
    for (li, layout) in layouts.iter().enumerate() {
        println!("\n{layout}: median (lowest–highest) over {rounds} rounds\n");
        println!(
            "| lock | sections/s | vs Token polling, same round | changed hands | wait p99 / (n × section p50) | wait p99 / (n × turn p50) | handoff p50 | handoff p50 in RTT | handoff p99 | violations | counters |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        let base = &results[li][1];
        for (ci, cfg) in CONFIGS.iter().enumerate() {
            let rs = &results[li][ci];
            let col = |f: fn(&Figures) -> f64| median_lo_hi(rs.iter().map(f).collect());
            let ratio = median_lo_hi(
                rs.iter()
                    .zip(base)
                    .map(|(a, b)| a.sections_per_s / b.sections_per_s)
                    .collect(),
            );
            let (sps, chg, wr, wt, h50, h50r, h99) = (
                col(|f| f.sections_per_s),
                col(|f| f.changed_pct),
                col(|f| f.wait_ratio),
                col(|f| f.wait_turn_ratio),
                col(|f| f.handoff_p50_us),
                col(|f| f.handoff_p50_rtt),
                col(|f| f.handoff_p99_us),
            );
            let violations: u64 = rs.iter().map(|f| f.violations).sum();
            let exact = rs.iter().all(|f| f.counter_ok);
            let errors: u64 = rs.iter().map(|f| f.errors).sum();
            println!(
                "| {} | {:.0} ({:.0}–{:.0}) | {:.2}× ({:.2}–{:.2}) | {:.1} % ({:.1}–{:.1}) | {:.2} ({:.2}–{:.2}) | {:.2} ({:.2}–{:.2}) | {:.0} µs ({:.0}–{:.0}) | {:.2} ({:.2}–{:.2}) | {:.0} µs ({:.0}–{:.0}) | {} | {}{} |",
                cfg.name(),
                sps.0, sps.1, sps.2,
                ratio.0, ratio.1, ratio.2,
                chg.0, chg.1, chg.2,
                wr.0, wr.1, wr.2,
                wt.0, wt.1, wt.2,
                h50.0, h50.1, h50.2,
                h50r.0, h50r.1, h50r.2,
                h99.0, h99.1, h99.2,
                violations,
                if exact { "exact" } else { "WRONG" },
                if errors > 0 { format!(", {errors} errors") } else { String::new() },
            );
            let name = format!(
                "{}_{}",
                cfg.name(),
                if li == 0 { "threads" } else { "processes" }
            );
            env.put("fair", &name, "sections_per_s_p50", format!("{:.0}", sps.0));
            env.put(
                "fair",
                &name,
                "ratio_vs_polling_p50",
                format!("{:.3}", ratio.0),
            );
            env.put("fair", &name, "changed_pct_p50", format!("{:.1}", chg.0));
            env.put("fair", &name, "wait_ratio_p50", format!("{:.3}", wr.0));
            env.put("fair", &name, "wait_turn_ratio_p50", format!("{:.3}", wt.0));
            env.put("fair", &name, "handoff_p50_us", format!("{:.1}", h50.0));
            env.put("fair", &name, "handoff_p99_us", format!("{:.1}", h99.0));
            env.put("fair", &name, "violations", violations);
        }
    }
    env.finish();
}
