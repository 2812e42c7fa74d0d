//! Uncontended acquire + release: `try_lock()` then `unlock()` on the guard (and, for the default
//! Token lock with and without scripts, `lock()` then `unlock()`: the `_lock` rows), for Token (default:
//! watched by the client's watchdog, release published; and with an explicit ttl: not watched,
//! release still published), Reentrant, Classic (decimal, big-endian, with the key TTL option,
//! with the compare-and-set takeover) and Fair (watched), measured interleaved with the floors
//! of the same run: a pooled PING and the bare commands of each algorithm sent on a raw
//! connection.
//!
//! The interleaved measurement is repeated in `runs` runs (5; `DLOCK_CYCLE_RUNS=n` changes it):
//! each ratio is recorded as the median of the runs with the lowest and the highest run, and
//! the latencies over all runs' samples.
//!
//! For profiling, `DLOCK_CYCLE_PROBE=<op>:<n>` runs one operation `n` times and exits without
//! measuring (`ping`: a pooled PING; `token`, `token_lock`: the default Token cycle by
//! `try_lock()` or `lock()`; `token_ttl`; `bare`: the Token cycle's bare commands on a raw
//! connection, native where the server has `DELIFEQ`; `reentrant`: the Reentrant cycle;
//! `bare_reentrant`: its bare EVALSHAs on a raw connection, as `floor_reentrant_raw`; `none`);
//! run the bench binary under `valgrind --tool=callgrind --toggle-collect='*probe_loop*'`
//! (with `DLOCK_BENCH_NO_PIN=1`): the instructions of the loop on the calling thread, divided
//! by `n`.

mod common;

use std::time::Duration;

use common::*;
use redis_dlock::ClassicOptions;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, Encoding, LockClient, Strategy, Takeover};

/// Lease of the bare Reentrant floor (the library's watched lease is 30 s; only the number's
/// length reaches the wire).
const REENTRANT_LEASE_MS: u64 = 30_000;

/// The lock configurations measured (each needs 2 round trips per cycle). `scripted` is a
/// client made to use the scripts where the server has native commands (Valkey 9: `DELIFEQ`,
/// `SET … IFEQ`): its Token locks are the `_scripts` rows, measured beside the native ones.
fn locks(client: &LockClient, scripted: &LockClient) -> Vec<(&'static str, Lock)> {
    let classic =
        |key: &str, options: ClassicOptions| client.lock(key).strategy(Strategy::Classic(options));
    vec![
        (
            "token_scripts",
            scripted
                .lock("cycle:token:s")
                .strategy(Strategy::Token)
                .build()
                .expect("token lock"),
        ),
        (
            "token_ttl_scripts",
            scripted
                .lock("cycle:token:ttl:s")
                .strategy(Strategy::Token)
                .ttl(Duration::from_secs(10))
                .build()
                .expect("token lock"),
        ),
        (
            "token",
            client
                .lock("cycle:token")
                .strategy(Strategy::Token)
                .build()
                .expect("token lock"),
        ),
        (
            "token_ttl",
            client
                .lock("cycle:token:ttl")
                .strategy(Strategy::Token)
                .ttl(Duration::from_secs(10))
                .build()
                .expect("token lock"),
        ),
        (
            "reentrant",
            client
                .lock("cycle:reentrant")
                .strategy(Strategy::Reentrant)
                .build()
                .expect("reentrant lock"),
        ),
        (
            "classic_decimal",
            classic("cycle:classic:dec", ClassicOptions::new())
                .build()
                .expect("classic"),
        ),
        (
            "classic_bigendian",
            classic(
                "cycle:classic:be",
                ClassicOptions::new().encoding(Encoding::BigEndian),
            )
            .build()
            .expect("classic"),
        ),
        (
            "classic_key_ttl",
            classic("cycle:classic:ttl", ClassicOptions::new().key_ttl(true))
                .build()
                .expect("classic"),
        ),
        (
            "classic_cas",
            classic(
                "cycle:classic:cas",
                ClassicOptions::new().takeover(Takeover::CompareAndSet),
            )
            .build()
            .expect("classic"),
        ),
        (
            "fair",
            client
                .lock("cycle:fair")
                .strategy(Strategy::Fair)
                .build()
                .expect("fair lock"),
        ),
    ]
}

/// One uncontended cycle through the public API.
fn cycle(lock: &dyn DistributedLock) {
    let guard = lock.try_lock().expect("uncontended try_lock");
    assert!(guard.unlock().expect("unlock"), "lost an uncontended lock");
}

/// The same cycle by `lock()`, the blocking acquire users call (its uncontended path is one
/// attempt, as `try_lock()`'s, after the in-process line's checks).
fn cycle_blocking(lock: &dyn DistributedLock) {
    let guard = lock.lock().expect("uncontended lock");
    assert!(guard.unlock().expect("unlock"), "lost an uncontended lock");
}

/// The locks whose cycle is also timed by `lock()`, as `<name>_lock`.
const BLOCKING: [&str; 2] = ["token", "token_scripts"];

fn main() {
    let mut env = BenchEnv::start("cycle");
    let url = env.url();
    let client = lock_client(&url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    let scripted = lock_client(&url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    redis_dlock::bench_hooks::use_scripts(&scripted);
    let native = redis_dlock::bench_hooks::releases_natively(&client);
    println!(
        "[cycle] server {}: Token release by {}",
        env.server_version(),
        if native { "DELIFEQ (native)" } else { "script" }
    );
    env.put("cycle", "all", "native_release", native);
    let pool = floor_pool(&url, 16, 1);
    let locks = locks(&client, &scripted);
    let shas = {
        let mut con = env.server.conn();
        Shas {
            unlock: load_unlock(&mut con),
            reentrant_acquire: load_script(&mut con, REENTRANT_ACQUIRE_LUA),
            reentrant_release: load_script(&mut con, REENTRANT_RELEASE_LUA),
            fair_release: load_script(
                &mut con,
                redis_dlock::bench_hooks::Scripts::new().fair_release_code(),
            ),
        }
    };

    if let Ok(spec) = std::env::var("DLOCK_CYCLE_PROBE") {
        let (name, n) = spec.split_once(':').expect("DLOCK_CYCLE_PROBE=<op>:<n>");
        let n: u32 = n.parse().expect("DLOCK_CYCLE_PROBE=<op>:<n>");
        probe(&env, &pool, &locks, &shas, native, name, n);
        return;
    }

    if env.measuring() {
        custom(&mut env, &pool, &locks, &shas, native);
    }

    let mut c = criterion();
    {
        let mut g = c.benchmark_group("cycle");
        g.bench_function("floor_ping_pool", |b| {
            b.iter(|| ping(&mut pool.get().expect("pooled connection")))
        });
        for (name, lock) in &locks {
            g.bench_function(*name, |b| b.iter(|| cycle(lock)));
            if BLOCKING.contains(name) {
                g.bench_function(format!("{name}_lock"), |b| b.iter(|| cycle_blocking(lock)));
            }
        }
        g.finish();
    }
    c.final_summary();
    env.finish();
}

/// `DLOCK_CYCLE_PROBE`: runs operation `name` `n` times and prints the wall time per operation.
fn probe(
    env: &BenchEnv,
    pool: &r2d2::Pool<redis::Client>,
    locks: &[(&'static str, Lock)],
    shas: &Shas,
    native: bool,
    name: &str,
    n: u32,
) {
    let lock = |l: &str| &locks.iter().find(|(x, _)| *x == l).expect("lock").1;
    let mut raw = env.server.conn();
    let reentrant_channel = channel("cycle:floor:r");
    let channel = channel("cycle:floor:probe");
    let mut raw_reentrant = env.server.conn();
    let owner = format!("{}:1", String::from_utf8_lossy(&token()));
    let bare_reentrant =
        move || bare_reentrant_cycle(&mut raw_reentrant, shas, &reentrant_channel, &owner);
    let bare = || {
        let t = token();
        assert!(set_nx_px(&mut raw, "cycle:floor:probe", &t, 10_000));
        if native {
            let (deleted, _): (i64, i64) = redis::pipe()
                .cmd("DELIFEQ")
                .arg("cycle:floor:probe")
                .arg(&t[..])
                .cmd("PUBLISH")
                .arg(&channel)
                .arg("0")
                .query(&mut raw)
                .expect("DELIFEQ + PUBLISH");
            assert_eq!(deleted, 1);
        } else {
            assert!(evalsha_unlock_publish(
                &mut raw,
                &shas.unlock,
                "cycle:floor:probe",
                &channel,
                &t
            ));
        }
    };
    let mut op: Box<dyn FnMut() + '_> = match name {
        "ping" => Box::new(|| ping(&mut pool.get().expect("pooled connection"))),
        "token" => Box::new(|| cycle(lock("token"))),
        "token_ttl" => Box::new(|| cycle(lock("token_ttl"))),
        "token_lock" => Box::new(|| cycle_blocking(lock("token"))),
        "bare" => Box::new(bare),
        "reentrant" => Box::new(|| cycle(lock("reentrant"))),
        "bare_reentrant" => Box::new(bare_reentrant),
        "none" => Box::new(|| {}),
        other => panic!("unknown operation {other}"),
    };
    let start = std::time::Instant::now();
    eprintln!("[probe] start {name} x {n}");
    probe_loop(n, &mut *op);
    eprintln!(
        "[probe] end {name}: wall {:.2} us/op",
        start.elapsed().as_secs_f64() * 1e6 / f64::from(n.max(1))
    );
}

/// The probe's loop, not inlined: `valgrind --tool=callgrind --toggle-collect='*probe_loop*'`
/// counts only what it runs (on this thread).
#[inline(never)]
fn probe_loop(n: u32, op: &mut dyn FnMut()) {
    for _ in 0..n {
        op();
    }
}

/// The Reentrant cycle's bare commands on a raw connection: its acquire and release
/// EVALSHAs for `owner` at the floor's key.
fn bare_reentrant_cycle(con: &mut redis::Connection, shas: &Shas, channel: &str, owner: &str) {
    assert!(evalsha_reentrant_acquire(
        con,
        &shas.reentrant_acquire,
        "cycle:floor:r",
        REENTRANT_LEASE_MS,
        owner
    ));
    assert!(evalsha_reentrant_release(
        con,
        &shas.reentrant_release,
        "cycle:floor:r",
        channel,
        REENTRANT_LEASE_MS,
        owner
    ));
}

/// SHA1s of the scripts the bare floors send.
struct Shas {
    unlock: String,
    reentrant_acquire: String,
    reentrant_release: String,
    fair_release: String,
}

fn custom(
    env: &mut BenchEnv,
    pool: &r2d2::Pool<redis::Client>,
    locks: &[(&'static str, Lock)],
    shas: &Shas,
    native: bool,
) {
    let sha = shas.unlock.as_str();
    let mut raw_token = env.server.conn();
    let mut raw_token_pub = env.server.conn();
    let mut raw_classic = env.server.conn();
    let mut raw_classic_px = env.server.conn();
    let mut raw_reentrant = env.server.conn();
    let mut raw_fair = env.server.conn();
    let mut raw_native = env.server.conn();
    let native_channel = channel("cycle:floor:tn");
    let token_pub_channel = channel("cycle:floor:tp");
    let reentrant_channel = channel("cycle:floor:r");
    // A Redisson-style owner id: <uuid>:<thread number>.
    let owner = format!("{}:1", String::from_utf8_lossy(&token()));
    let (rounds, per) = env.pick((100, 120), (2, 5));
    let runs = env.pick(
        std::env::var("DLOCK_CYCLE_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(5usize)
            .max(1),
        1,
    );
    // Per variant: every run's samples, and each run's paired ratios (to 2 PING, to bare).
    let mut names: Vec<&str> = Vec::new();
    let mut all: Vec<Vec<u64>> = Vec::new();
    let mut runs_to_ping: Vec<Vec<f64>> = Vec::new();
    let mut runs_to_bare: Vec<Vec<f64>> = Vec::new();
    let mut lock_vs_try: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for run in 0..runs {
        let mut variants = vec![
            Variant::new("floor_ping_pool", || {
                ping(&mut pool.get().expect("pooled connection"))
            }),
            Variant::new("floor_set_nx_px_evalsha_raw", || {
                let t = token();
                assert!(set_nx_px(&mut raw_token, "cycle:floor:t", &t, 10_000));
                assert!(evalsha_unlock(&mut raw_token, sha, "cycle:floor:t", &t));
            }),
            Variant::new("floor_set_nx_px_evalsha_pub_raw", || {
                let t = token();
                assert!(set_nx_px(&mut raw_token_pub, "cycle:floor:tp", &t, 10_000));
                assert!(evalsha_unlock_publish(
                    &mut raw_token_pub,
                    sha,
                    "cycle:floor:tp",
                    &token_pub_channel,
                    &t
                ));
            }),
            Variant::new("floor_reentrant_raw", || {
                bare_reentrant_cycle(&mut raw_reentrant, shas, &reentrant_channel, &owner)
            }),
            Variant::new("floor_setnx_evalsha_raw", || {
                let (buf, len) = classic_value(1000);
                assert!(setnx(&mut raw_classic, "cycle:floor:c", &buf[..len]));
                assert!(evalsha_unlock(
                    &mut raw_classic,
                    sha,
                    "cycle:floor:c",
                    &buf[..len]
                ));
            }),
            Variant::new("floor_classic_set_nx_px_evalsha_raw", || {
                let (buf, len) = classic_value(1000);
                assert!(set_nx_px(
                    &mut raw_classic_px,
                    "cycle:floor:cp",
                    &buf[..len],
                    1000
                ));
                assert!(evalsha_unlock(
                    &mut raw_classic_px,
                    sha,
                    "cycle:floor:cp",
                    &buf[..len]
                ));
            }),
            Variant::new("floor_fair_raw", || {
                let t = fair_token();
                assert!(set_nx_px(&mut raw_fair, "cycle:floor:f", &t, 30_000));
                assert!(evalsha_fair_release(
                    &mut raw_fair,
                    &shas.fair_release,
                    "cycle:floor:f",
                    &t
                ));
            }),
        ];
        if native {
            // The native Token cycle's bare commands: SET NX PX, then DELIFEQ + PUBLISH in one
            // pipeline.
            variants.push(Variant::new("floor_set_nx_px_delifeq_pub_raw", || {
                let t = token();
                assert!(set_nx_px(&mut raw_native, "cycle:floor:tn", &t, 10_000));
                let (deleted, _): (i64, i64) = redis::pipe()
                    .cmd("DELIFEQ")
                    .arg("cycle:floor:tn")
                    .arg(&t[..])
                    .cmd("PUBLISH")
                    .arg(&native_channel)
                    .arg("0")
                    .query(&mut raw_native)
                    .expect("DELIFEQ + PUBLISH");
                assert_eq!(deleted, 1);
            }));
        }
        for (name, lock) in locks {
            variants.push(Variant::new(name, move || cycle(lock)));
        }
        for (name, lock) in locks.iter().filter(|(n, _)| BLOCKING.contains(n)) {
            let name: &'static str = match *name {
                "token" => "token_lock",
                _ => "token_scripts_lock",
            };
            variants.push(Variant::new(name, move || cycle_blocking(lock)));
        }
        names = variants.iter().map(|v| v.name).collect();
        let samples = interleaved(&mut variants, rounds, per);
        drop(variants);
        // Paired ratios first (they need the samples in time order).
        let index = |n: &str| names.iter().position(|x| *x == n).expect("variant");
        let ping = &samples[index("floor_ping_pool")];
        all.resize(names.len(), Vec::new());
        runs_to_ping.resize(names.len(), Vec::new());
        runs_to_bare.resize(names.len(), Vec::new());
        for (i, name) in names.iter().enumerate() {
            runs_to_ping[i].push(paired_ratio(&samples[i], ping, per) / 2.0);
            if let Some(b) = bare_of(name, native) {
                runs_to_bare[i].push(paired_ratio(&samples[i], &samples[index(b)], per));
            }
        }
        let (token, scripts) = (index("token"), index("token_scripts"));
        // `lock()` against `try_lock()` on the same lock object, paired in the same rounds.
        let lock_over_try = |blocking: &str, once: &str| {
            paired_ratio(&samples[index(blocking)], &samples[index(once)], per)
        };
        lock_vs_try[0].push(lock_over_try("token_lock", "token"));
        lock_vs_try[1].push(lock_over_try("token_scripts_lock", "token_scripts"));
        println!(
            "[cycle] run {}/{runs}: token {:.3} x 2 PING, with the scripts forced {:.3}; \
             lock() / try_lock() {:.4} (scripts {:.4})",
            run + 1,
            runs_to_ping[token][run],
            runs_to_ping[scripts][run],
            lock_vs_try[0][run],
            lock_vs_try[1][run]
        );
        for (a, s) in all.iter_mut().zip(samples) {
            a.extend(s);
        }
    }
    let mut floor = 0.0;
    for (i, name) in names.iter().enumerate() {
        let s = Stats::of(&mut all[i]);
        if *name == "floor_ping_pool" {
            floor = s.p50;
            env.put_stats("floor", "ping_pool", &s);
            continue;
        }
        env.put_stats("cycle", name, &s);
        let to_ping = spread(&runs_to_ping[i]);
        put_spread(env, name, "paired_ratio_2ping", to_ping);
        let to_bare = (!runs_to_bare[i].is_empty()).then(|| spread(&runs_to_bare[i]));
        if let Some(b) = to_bare {
            put_spread(env, name, "paired_ratio_bare", b);
        }
        println!(
            "[cycle] {name:<38} p50 {:>10}  p99 {:>10}  = {:.3} x 2 PING (paired median of {runs} \
             runs {:.3}, {:.3}-{:.3}; to bare {})",
            us(s.p50),
            us(s.p99),
            s.p50 / (2.0 * floor),
            to_ping.0,
            to_ping.1,
            to_ping.2,
            to_bare.map_or("-".to_owned(), |b| format!("{:.3}", b.0)),
        );
    }
    for (i, name) in ["token_lock_over_try", "token_scripts_lock_over_try"]
        .into_iter()
        .enumerate()
    {
        let r = spread(&lock_vs_try[i]);
        println!(
            "[cycle] {name}: lock() / try_lock() paired, median of {runs} runs {:.4} ({:.4}-{:.4})",
            r.0, r.1, r.2
        );
        put_spread(env, name, "paired_ratio", r);
    }
    env.put("cycle", "all", "rounds", rounds);
    env.put("cycle", "all", "per_round", per);
    env.put("cycle", "all", "runs", runs);
}

/// The bare commands a lock configuration is compared with (`native`: the server has
/// `DELIFEQ`, which the client's Token locks use).
fn bare_of(name: &str, native: bool) -> Option<&'static str> {
    match name {
        "token" | "token_lock" | "token_ttl" if native => Some("floor_set_nx_px_delifeq_pub_raw"),
        "token" | "token_lock" | "token_ttl" | "token_scripts" | "token_scripts_lock"
        | "token_ttl_scripts" => Some("floor_set_nx_px_evalsha_pub_raw"),
        "reentrant" => Some("floor_reentrant_raw"),
        "fair" => Some("floor_fair_raw"),
        "classic_key_ttl" => Some("floor_classic_set_nx_px_evalsha_raw"),
        n if n.starts_with("classic") => Some("floor_setnx_evalsha_raw"),
        _ => None,
    }
}

/// The median, lowest and highest of the runs' values.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (median, v[0], v[v.len() - 1])
}

/// Records `metric` as the median of the runs, with `metric_lo` and `metric_hi`.
fn put_spread(env: &mut BenchEnv, name: &str, metric: &str, (median, lo, hi): (f64, f64, f64)) {
    env.put("cycle", name, metric, format!("{median:.4}"));
    env.put("cycle", name, &format!("{metric}_lo"), format!("{lo:.4}"));
    env.put("cycle", name, &format!("{metric}_hi"), format!("{hi:.4}"));
}
