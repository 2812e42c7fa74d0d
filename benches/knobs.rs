//! The runtime's special paths and tuned timings, each measured with and without it in one run:
//! a row per switch, kept only if it pays (5 % or more on sections/s or on the wait p99, or a
//! failure it prevents). The switches are `redis_dlock::bench_hooks::Knobs` (process-wide) and
//! the client option `handoff_courtesy`.
//!
//! Two workloads on one key, the critical section `GET` + `SET` of a counter on the thread's
//! own raw connection, every thread in a `lock()` / section / `unlock()` loop:
//!
//! - token: 8 threads with a `LockClient` each (they meet only in Redis, as processes do),
//!   Token at its defaults (waiters woken by pub/sub); configurations: the defaults, no
//!   handoff courtesy, a 5 ms subscriber tick, no linger of idle channels;
//! - token bursts: the token workload in bursts, 100 ms of contention every 400 ms (every
//!   thread idle in between, as a job that runs in waves): what the linger of idle channels is
//!   for (without it each burst's waiters subscribe again); configurations: the defaults, no
//!   linger;
//! - fair: `Strategy::Fair`, 4 `LockClient`s with 2 threads each, and 8 threads with a
//!   `LockClient` each; configurations: the defaults, no lending of the subscriber connection,
//!   no linger (a fair waiter subscribes to its client's grant channel).
//!
//! Per run: sections/s, the p99 of every `lock()` call's wait, the share of sections whose
//! holder changed, and the check that the counter equals the number of sections. The
//! configurations of a workload run interleaved, in rotated order, for `DLOCK_KNOBS_ROUNDS`
//! rounds (default 15) of `DLOCK_KNOBS_MS` milliseconds (default 700); printed: the median and the
//! lowest–highest over the rounds of each figure and of its ratio to the defaults' run of the
//! same round. `DLOCK_KNOBS_ONLY=<text>` runs only the workloads whose name contains it.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis_dlock::bench_hooks::{set_knobs, Knobs};
use redis_dlock::{DistributedLock, LockClient, Strategy};

#[derive(Clone, Copy)]
struct Config {
    name: &'static str,
    knobs: Knobs,
    /// `None`: the client's default courtesy.
    courtesy: Option<Duration>,
}

#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    fair: bool,
    clients: usize,
    threads_per_client: usize,
    configs: &'static [Config],
    /// Contention in bursts: `(active, period)`, every thread idle for the rest of each period.
    bursts: Option<(Duration, Duration)>,
}

const DEFAULTS: Knobs = Knobs {
    lend: true,
    tick: None,
    linger: None,
};

const NO_LINGER: Config = Config {
    name: "no linger (default 1.5 s)",
    knobs: Knobs {
        linger: Some(Duration::ZERO),
        ..DEFAULTS
    },
    courtesy: None,
};

const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "token, 8 threads with a LockClient each",
        fair: false,
        clients: 8,
        threads_per_client: 1,
        configs: &[
            Config {
                name: "token defaults",
                knobs: DEFAULTS,
                courtesy: None,
            },
            Config {
                name: "no handoff courtesy",
                knobs: DEFAULTS,
                courtesy: Some(Duration::ZERO),
            },
            Config {
                name: "tick 5 ms (default 200 ms)",
                knobs: Knobs {
                    tick: Some(Duration::from_millis(5)),
                    ..DEFAULTS
                },
                courtesy: None,
            },
            NO_LINGER,
        ],
        bursts: None,
    },
    Workload {
        name: "token bursts, 100 ms of every 400 ms",
        fair: false,
        clients: 8,
        threads_per_client: 1,
        configs: &[
            Config {
                name: "token defaults",
                knobs: DEFAULTS,
                courtesy: None,
            },
            NO_LINGER,
        ],
        bursts: Some((Duration::from_millis(100), Duration::from_millis(400))),
    },
    Workload {
        name: "fair, 4 LockClients x 2 threads",
        fair: true,
        clients: 4,
        threads_per_client: 2,
        configs: FAIR_CONFIGS,
        bursts: None,
    },
    Workload {
        name: "fair, 8 threads with a LockClient each",
        fair: true,
        clients: 8,
        threads_per_client: 1,
        configs: FAIR_CONFIGS,
        bursts: None,
    },
];

const FAIR_CONFIGS: &[Config] = &[
    Config {
        name: "fair defaults",
        knobs: DEFAULTS,
        courtesy: None,
    },
    Config {
        name: "no lending",
        knobs: Knobs {
            lend: false,
            ..DEFAULTS
        },
        courtesy: None,
    },
    NO_LINGER,
];

/// One section: `lock()` called, `lock()` returned, the thread.
type Section = (Instant, Instant, usize);

/// The figures of one run.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    sections_per_s: f64,
    wait_p99_us: f64,
    changed_pct: f64,
    exact: bool,
    errors: u64,
}

fn run(url: &str, w: &Workload, c: &Config, key: &str, dur: Duration) -> Run {
    set_knobs(c.knobs);
    let clients: Vec<LockClient> = (0..w.clients)
        .map(|_| {
            let b = LockClient::builder(url);
            let b = match c.courtesy {
                Some(d) => b.handoff_courtesy(d),
                None => b,
            };
            b.build().expect("lock client")
        })
        .collect();
    let n = w.clients * w.threads_per_client;
    let barrier = Arc::new(Barrier::new(n + 1));
    let counter = format!("{key}:counter");
    let start = Instant::now() + Duration::from_millis(100);
    let results: Vec<(Vec<Section>, u64)> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let client = &clients[i / w.threads_per_client];
                let barrier = Arc::clone(&barrier);
                let counter = counter.clone();
                s.spawn(move || {
                    let builder = client.lock(key);
                    let lock = if w.fair {
                        builder.strategy(Strategy::Fair).build()
                    } else {
                        builder.build()
                    }
                    .expect("lock");
                    let mut con = redis::Client::open(url)
                        .and_then(|c| c.get_connection())
                        .expect("raw connection");
                    let mut recs = Vec::with_capacity(1 << 14);
                    let mut errors = 0;
                    barrier.wait();
                    thread::sleep(start.saturating_duration_since(Instant::now()));
                    let stop = start + dur;
                    while Instant::now() < stop {
                        if let Some((active, period)) = w.bursts {
                            // Between bursts: idle until the next period starts.
                            let into = Instant::now().saturating_duration_since(start);
                            let phase =
                                Duration::from_nanos((into.as_nanos() % period.as_nanos()) as u64);
                            if phase >= active {
                                thread::sleep(period - phase);
                                continue;
                            }
                        }
                        let called = Instant::now();
                        let guard = match lock.lock() {
                            Ok(g) => g,
                            Err(e) => {
                                if errors == 0 {
                                    eprintln!("[knobs] thread {i}: {e}");
                                }
                                errors += 1;
                                continue;
                            }
                        };
                        let got = Instant::now();
                        let v: Option<u64> = redis::cmd("GET")
                            .arg(&counter)
                            .query(&mut con)
                            .expect("GET");
                        let _: () = redis::cmd("SET")
                            .arg(&counter)
                            .arg(v.unwrap_or(0) + 1)
                            .query(&mut con)
                            .expect("SET");
                        if !matches!(guard.unlock(), Ok(true)) {
                            errors += 1;
                        }
                        recs.push((called, got, i));
                    }
                    (recs, errors)
                })
            })
            .collect();
        barrier.wait();
        handles
            .into_iter()
            .map(|h| h.join().expect("contender"))
            .collect()
    });
    set_knobs(Knobs::default());
    let errors = results.iter().map(|r| r.1).sum();
    let mut recs: Vec<Section> = results.into_iter().flat_map(|r| r.0).collect();
    recs.sort_by_key(|r| r.1);
    let mut waits: Vec<u64> = recs.iter().map(|r| (r.1 - r.0).as_nanos() as u64).collect();
    let changed = recs.windows(2).filter(|p| p[0].2 != p[1].2).count();
    let counted: Option<u64> = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut con| redis::cmd("GET").arg(&counter).query(&mut con))
        .expect("counter");
    Run {
        sections_per_s: recs.len() as f64 / dur.as_secs_f64(),
        wait_p99_us: Stats::of(&mut waits).p99 / 1e3,
        changed_pct: 100.0 * changed as f64 / recs.len().max(2).saturating_sub(1) as f64,
        exact: counted.unwrap_or(0) == recs.len() as u64,
        errors,
    }
}

fn main() {
    let mut env = BenchEnv::start("knobs");
    if !env.measuring() {
        return;
    }
    let url = env.url();
    let num = env_num;
    let rounds = env.pick(num("DLOCK_KNOBS_ROUNDS", 15), 1) as usize;
    let dur = env.pick(
        Duration::from_millis(num("DLOCK_KNOBS_MS", 700)),
        Duration::from_millis(300),
    );
    println!(
        "[knobs] {} on {}; load average at start: {}",
        env.pinning,
        env.server_version(),
        loadavg()
    );
    // `DLOCK_KNOBS_ONLY=fair`: only the workloads whose name contains it.
    let only = std::env::var("DLOCK_KNOBS_ONLY").unwrap_or_default();
    for (wi, w) in WORKLOADS.iter().enumerate() {
        if !w.name.contains(only.as_str()) {
            continue;
        }
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); w.configs.len()];
        for round in 0..rounds {
            for k in 0..w.configs.len() {
                let ci = (round + k) % w.configs.len();
                let c = &w.configs[ci];
                let key = format!("knobs:{wi}:{ci}:{round}");
                let r = run(&url, w, c, &key, dur);
                println!(
                    "[knobs] round {round} {:<40} {:<34} {:>7.0} sections/s, wait p99 {:>8.0} µs, \
                     {:>5.1} % changed hands, counter {}, errors {}",
                    w.name,
                    c.name,
                    r.sections_per_s,
                    r.wait_p99_us,
                    r.changed_pct,
                    if r.exact { "exact" } else { "WRONG" },
                    r.errors
                );
                runs[ci].push(r);
            }
        }
        println!(
            "\n{}: median (lowest–highest) over {rounds} rounds of {dur:?}\n",
            w.name
        );
        println!(
            "| configuration | sections/s | vs defaults, same round | wait p99 | vs defaults, same round | changed hands | counter |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for (ci, c) in w.configs.iter().enumerate() {
            let rs = &runs[ci];
            let base = &runs[0];
            let col = |f: fn(&Run) -> f64| median_lo_hi(rs.iter().map(f).collect());
            let ratio = |f: fn(&Run) -> f64| {
                median_lo_hi(rs.iter().zip(base).map(|(a, b)| f(a) / f(b)).collect())
            };
            let (sps, sps_r) = (col(|r| r.sections_per_s), ratio(|r| r.sections_per_s));
            let (p99, p99_r) = (col(|r| r.wait_p99_us), ratio(|r| r.wait_p99_us));
            let chg = col(|r| r.changed_pct);
            let exact = rs.iter().all(|r| r.exact);
            let errors: u64 = rs.iter().map(|r| r.errors).sum();
            println!(
                "| {} | {:.0} ({:.0}–{:.0}) | {:.2}× ({:.2}–{:.2}) | {:.0} µs ({:.0}–{:.0}) | {:.2}× ({:.2}–{:.2}) | {:.1} % ({:.1}–{:.1}) | {}{} |",
                c.name,
                sps.0, sps.1, sps.2,
                sps_r.0, sps_r.1, sps_r.2,
                p99.0, p99.1, p99.2,
                p99_r.0, p99_r.1, p99_r.2,
                chg.0, chg.1, chg.2,
                if exact { "exact" } else { "WRONG" },
                if errors > 0 { format!(", {errors} errors") } else { String::new() },
            );
            let name = c.name.replace(' ', "_");
            env.put(
                "knobs",
                &name,
                "sections_per_s_p50",
                format!("{:.0}", sps.0),
            );
            env.put(
                "knobs",
                &name,
                "sections_ratio_p50",
                format!("{:.3}", sps_r.0),
            );
            env.put("knobs", &name, "wait_p99_us_p50", format!("{:.0}", p99.0));
            env.put(
                "knobs",
                &name,
                "wait_p99_ratio_p50",
                format!("{:.3}", p99_r.0),
            );
        }
        println!();
    }
    println!("[knobs] load average at end: {}", loadavg());
    env.finish();
}
