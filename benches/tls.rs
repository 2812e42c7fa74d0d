//! The uncontended Token cycle over TLS (rustls), as a ratio to a pooled TLS `PING` measured
//! interleaved with it, next to the same ratio over plain TCP on the same server in the same
//! run. Repeated `runs` times in one process; the median and the spread of the runs are
//! printed and recorded in `target/dlock-bench/tls.csv`.
//!
//! `cargo bench -p redis-dlock-benches --features tls-rustls --bench tls`
//!
//! Where a cycle's time above two `PING`s goes is measured in the same interleaved rounds:
//! - **bare**: the same two commands the lock sends (`SET key token NX PX ttl GET`, then
//!   `EVALSHA <unlock.lua> 1 key token 0 channel`), built with `redis::cmd`, one checkout of a
//!   pool like the floor's per command: the commands' own cost, without the library;
//! - the same Token lock on a `LockClient::from_pool` of the floor's own pool: the library's
//!   pool and connection wrapper against the floor's;
//! - **SET + DEL**: the same `SET … NX PX … GET`, then a plain `DEL` instead of the script: the
//!   same two round trips and about the same bytes, without Lua;
//! - the server's own execution time per command (`INFO commandstats`, `usec_per_call`, reset
//!   before each run): what each command costs inside `redis-server`, not counting the
//!   network, the event loop or the TLS record layer.
//!
//! `DLOCK_TLS_RUNS=n` changes the number of runs (default 5). For profiling,
//! `DLOCK_TLS_PROBE=<op>:<n>` runs one operation `n` times and exits without measuring
//! (`ping_tls`, `cycle_tls`, `cycle_ttl_tls`, `bare_tls`, `set_del_tls`, the same with `_plain`,
//! or `none`), printing the client's and the server's CPU time per operation and the server's
//! command statistics; run the bench binary under `strace -f -c` or
//! `valgrind --tool=callgrind` (with `DLOCK_BENCH_NO_PIN=1`) with two values of `n` and take
//! the difference.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, Strategy};

/// One uncontended cycle through the public API.
fn cycle(lock: &dyn DistributedLock) {
    let guard = lock.try_lock().expect("uncontended try_lock");
    assert!(guard.unlock().expect("unlock"), "lost an uncontended lock");
}

fn token(client: &LockClient, key: &str, ttl: Option<Duration>) -> Lock {
    let b = client.lock(key).strategy(Strategy::Token);
    match ttl {
        Some(t) => b.ttl(t),
        None => b,
    }
    .build()
    .expect("token lock")
}

/// Lifetime of the bare commands' holds (the library's watched lease is 30 s; only the
/// number's length reaches the wire).
const BARE_TTL_MS: u64 = 30_000;

/// The Token cycle's two commands sent bare, one pool checkout each (as the library does).
fn bare(pool: &r2d2::Pool<redis::Client>, sha: &str, key: &str, channel: &str) {
    let t = common::token();
    assert!(set_nx_px_get(
        &mut pool.get().expect("pooled connection"),
        key,
        &t,
        BARE_TTL_MS
    ));
    assert!(evalsha_unlock_publish(
        &mut pool.get().expect("pooled connection"),
        sha,
        key,
        channel,
        &t
    ));
}

/// The same acquire, released by a plain `DEL` (no script): two round trips without Lua.
fn set_del(pool: &r2d2::Pool<redis::Client>, key: &str) {
    let t = common::token();
    assert!(set_nx_px_get(
        &mut pool.get().expect("pooled connection"),
        key,
        &t,
        BARE_TTL_MS
    ));
    let n: i64 = redis::cmd("DEL")
        .arg(key)
        .query(&mut pool.get().expect("pooled connection"))
        .expect("DEL");
    assert_eq!(n, 1);
}

/// The variants, in the order of the interleaved rounds.
const VARIANTS: [&str; 10] = [
    "ping_pool_tls",
    "token_tls",
    "token_ttl_tls",
    "token_tls_floor_pool",
    "bare_tls",
    "set_del_tls",
    "ping_pool_plain",
    "token_plain",
    "bare_plain",
    "set_del_plain",
];

/// The ratios reported: (metric, label, numerator, denominator, divided by 2 — a cycle of two
/// round trips against one `PING`).
const RATIOS: [(&str, &str, &str, &str, bool); 11] = [
    (
        "token_tls_2ping_tls",
        "Token (watched) over TLS / 2 TLS PING",
        "token_tls",
        "ping_pool_tls",
        true,
    ),
    (
        "token_ttl_tls_2ping_tls",
        "Token (explicit ttl) over TLS / 2 TLS PING",
        "token_ttl_tls",
        "ping_pool_tls",
        true,
    ),
    (
        "bare_tls_2ping_tls",
        "bare SET NX PX GET + EVALSHA over TLS / 2 TLS PING",
        "bare_tls",
        "ping_pool_tls",
        true,
    ),
    (
        "set_del_tls_2ping_tls",
        "SET NX PX GET + DEL over TLS / 2 TLS PING",
        "set_del_tls",
        "ping_pool_tls",
        true,
    ),
    (
        "token_tls_bare_tls",
        "Token (watched) over TLS / bare commands over TLS",
        "token_tls",
        "bare_tls",
        false,
    ),
    (
        "token_tls_floor_pool",
        "Token (watched) over TLS / the same on the floor's own pool (LockClient::from_pool)",
        "token_tls",
        "token_tls_floor_pool",
        false,
    ),
    (
        "token_plain_2ping_plain",
        "Token (watched) over plain TCP / 2 plain PING",
        "token_plain",
        "ping_pool_plain",
        true,
    ),
    (
        "bare_plain_2ping_plain",
        "bare SET NX PX GET + EVALSHA over plain TCP / 2 plain PING",
        "bare_plain",
        "ping_pool_plain",
        true,
    ),
    (
        "set_del_plain_2ping_plain",
        "SET NX PX GET + DEL over plain TCP / 2 plain PING",
        "set_del_plain",
        "ping_pool_plain",
        true,
    ),
    (
        "token_plain_bare_plain",
        "Token (watched) over plain TCP / bare commands over plain TCP",
        "token_plain",
        "bare_plain",
        false,
    ),
    (
        "ping_tls_ping_plain",
        "TLS PING / plain PING",
        "ping_pool_tls",
        "ping_pool_plain",
        false,
    ),
];

/// Commands whose server-side execution time is recorded (`INFO commandstats`).
const SERVER_COMMANDS: [&str; 6] = ["ping", "set", "evalsha", "del", "get", "publish"];

/// `usec_per_call` of each command in `INFO commandstats` (0 for one not called).
fn server_usec_per_call(con: &mut redis::Connection) -> Vec<(&'static str, f64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    SERVER_COMMANDS
        .iter()
        .map(|&cmd| {
            let prefix = format!("cmdstat_{cmd}:");
            let v = info
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|fields| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix("usec_per_call="))
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0);
            (cmd, v)
        })
        .collect()
}

fn reset_server_stats(con: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(con)
        .expect("CONFIG RESETSTAT");
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let pki = Pki::generate("bench");
    let server = RedisServer::start_tls(&pki, false);
    let mut env = BenchEnv::start_on("tls", server);
    let tls_url = env.server.tls_url();
    let tls_client =
        redis::Client::build_with_tls(tls_url.as_str(), pki.client_certificates(false))
            .expect("TLS client");
    let tls_pool = floor_pool_of(tls_client, 16, 1);
    let plain_pool = floor_pool(&env.url(), 16, 1);
    let tls_locks = LockClient::builder(&tls_url)
        .pool_size(redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE)
        .tls_certificates(pki.client_certificates(false))
        .build()
        .expect("TLS lock client");
    let plain_locks = lock_client(&env.url(), redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    let token_tls = token(&tls_locks, "tls:token", None);
    let token_ttl_tls = token(&tls_locks, "tls:token:ttl", Some(Duration::from_secs(10)));
    let token_plain = token(&plain_locks, "plain:token", None);
    // The control for the pool: the same lock on the floor's own pool and connections.
    let floor_pool_locks = LockClient::from_pool(tls_pool.clone());
    let token_tls_floor_pool = token(&floor_pool_locks, "tls:token:floor-pool", None);
    let mut admin = env.server.conn();
    let sha = load_unlock(&mut admin);
    let (bare_tls_ch, bare_plain_ch) = (channel("tls:bare"), channel("plain:bare"));

    let op = |name: &str| -> Box<dyn Fn() + '_> {
        match name {
            "ping_pool_tls" | "ping_tls" => {
                Box::new(|| ping(&mut tls_pool.get().expect("pooled TLS connection")))
            }
            "token_tls" | "cycle_tls" => Box::new(|| cycle(&token_tls)),
            "token_ttl_tls" | "cycle_ttl_tls" => Box::new(|| cycle(&token_ttl_tls)),
            "token_tls_floor_pool" => Box::new(|| cycle(&token_tls_floor_pool)),
            "bare_tls" => Box::new(|| bare(&tls_pool, &sha, "tls:bare", &bare_tls_ch)),
            "set_del_tls" => Box::new(|| set_del(&tls_pool, "tls:setdel")),
            "ping_pool_plain" | "ping_plain" => {
                Box::new(|| ping(&mut plain_pool.get().expect("pooled connection")))
            }
            "token_plain" | "cycle_plain" => Box::new(|| cycle(&token_plain)),
            "bare_plain" => Box::new(|| bare(&plain_pool, &sha, "plain:bare", &bare_plain_ch)),
            "set_del_plain" => Box::new(|| set_del(&plain_pool, "plain:setdel")),
            "none" => Box::new(|| {}),
            other => panic!("unknown operation {other}"),
        }
    };

    if let Ok(spec) = std::env::var("DLOCK_TLS_PROBE") {
        let (name, n) = spec.split_once(':').expect("DLOCK_TLS_PROBE=<op>:<n>");
        let n: u32 = n.parse().expect("DLOCK_TLS_PROBE=<op>:<n>");
        probe(&env, &mut admin, op(name).as_ref(), name, n);
        return;
    }

    if env.measuring() {
        let runs = env.pick(
            std::env::var("DLOCK_TLS_RUNS")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(5usize),
            1,
        );
        let (rounds, per) = env.pick((60, 100), (2, 5));
        let index = |n: &str| VARIANTS.iter().position(|v| *v == n).expect("variant");
        let mut ratios: Vec<Vec<f64>> = Vec::new();
        let mut p50s: Vec<Vec<f64>> = Vec::new();
        let mut server: Vec<Vec<(&str, f64)>> = Vec::new();
        for run in 0..runs {
            let ops: Vec<Box<dyn Fn() + '_>> = VARIANTS.iter().map(|n| op(n)).collect();
            let mut variants: Vec<Variant<'_>> = VARIANTS
                .iter()
                .zip(ops.iter())
                .map(|(name, f)| Variant::new(name, f))
                .collect();
            reset_server_stats(&mut admin);
            let mut samples = interleaved(&mut variants, rounds, per);
            let usec = server_usec_per_call(&mut admin);
            drop(variants);
            let r: Vec<f64> = RATIOS
                .iter()
                .map(|(_, _, num, den, two)| {
                    let ratio = paired_ratio(&samples[index(num)], &samples[index(den)], per);
                    if *two {
                        ratio / 2.0
                    } else {
                        ratio
                    }
                })
                .collect();
            let section = format!("run{run}");
            let mut p = Vec::new();
            for (name, sample) in VARIANTS.iter().zip(samples.iter_mut()) {
                let s = Stats::of(sample);
                env.put_stats(&section, name, &s);
                p.push(s.p50);
                println!(
                    "[tls] run {run} {name:<16} p50 {:>10}  p99 {:>10}",
                    us(s.p50),
                    us(s.p99)
                );
            }
            for ((metric, ..), v) in RATIOS.iter().zip(&r) {
                env.put(&section, "ratio", metric, format!("{v:.4}"));
            }
            for (cmd, v) in &usec {
                env.put(&section, "server", &format!("{cmd}_usec_per_call"), v);
            }
            println!(
                "[tls] run {run}: Token over TLS = {:.3} x 2 TLS PING (explicit ttl {:.3}; bare \
                 commands {:.3}, SET + DEL {:.3}); plain TCP {:.3} x 2 PING (bare {:.3}, SET + \
                 DEL {:.3}); TLS PING = {:.3} x plain PING",
                r[0], r[1], r[2], r[3], r[6], r[7], r[8], r[10]
            );
            println!(
                "[tls] run {run}: server usec per call: {}",
                usec.iter()
                    .map(|(c, v)| format!("{c} {v:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            ratios.push(r);
            p50s.push(p);
            server.push(usec);
        }
        for (i, (metric, label, ..)) in RATIOS.iter().enumerate() {
            let (med, lo, hi) = median(ratios.iter().map(|r| r[i]).collect());
            println!(
                "[tls] {label}: median {med:.3} (runs {lo:.3}-{hi:.3}, n={})",
                ratios.len()
            );
            env.put("summary", metric, "median", format!("{med:.4}"));
            env.put("summary", metric, "min", format!("{lo:.4}"));
            env.put("summary", metric, "max", format!("{hi:.4}"));
        }
        for (i, name) in VARIANTS.iter().enumerate() {
            let (med, lo, hi) = median(p50s.iter().map(|p| p[i]).collect());
            env.put("summary", name, "p50_ns_median", fmt_f(med));
            env.put("summary", name, "p50_ns_min", fmt_f(lo));
            env.put("summary", name, "p50_ns_max", fmt_f(hi));
        }
        for (i, cmd) in SERVER_COMMANDS.iter().enumerate() {
            let (med, lo, hi) = median(server.iter().map(|s| s[i].1).collect());
            println!("[tls] server {cmd}: median {med:.2} us per call (runs {lo:.2}-{hi:.2})");
            let name = format!("server_{cmd}");
            env.put(
                "summary",
                &name,
                "usec_per_call_median",
                format!("{med:.2}"),
            );
            env.put("summary", &name, "usec_per_call_min", format!("{lo:.2}"));
            env.put("summary", &name, "usec_per_call_max", format!("{hi:.2}"));
        }
        env.put("summary", "all", "runs", runs);
        env.put("summary", "all", "rounds", rounds);
        env.put("summary", "all", "per_round", per);
    }

    let mut c = criterion();
    {
        let mut g = c.benchmark_group("tls");
        g.bench_function("ping_pool_tls", |b| {
            b.iter(|| ping(&mut tls_pool.get().expect("pooled TLS connection")))
        });
        g.bench_function("token_tls", |b| b.iter(|| cycle(&token_tls)));
        g.finish();
    }
    c.final_summary();
    env.finish();
}

/// `DLOCK_TLS_PROBE`: runs `f` `n` times, then prints the wall time, the CPU time of this
/// process and of `redis-server` per operation (`/proc/<pid>/stat`, 10 ms ticks: use a large
/// `n`) and the server's command statistics.
fn probe(env: &BenchEnv, admin: &mut redis::Connection, f: &dyn Fn(), name: &str, n: u32) {
    let cpu = |pid: &str| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        tick(11).unwrap_or(0.0) + tick(12).unwrap_or(0.0)
    };
    let server = env.server.pid().to_string();
    reset_server_stats(admin);
    let (c0, s0, t0) = (cpu("self"), cpu(&server), Instant::now());
    eprintln!("[probe] start {name} x {n}");
    for _ in 0..n {
        f();
    }
    let (c1, s1, t1) = (cpu("self"), cpu(&server), t0.elapsed());
    let per = |ticks: f64| ticks * 1e4 / f64::from(n.max(1));
    eprintln!(
        "[probe] end {name}: wall {:.2} us/op, client CPU {:.2} us/op, server CPU {:.2} us/op",
        t1.as_secs_f64() * 1e6 / f64::from(n.max(1)),
        per(c1 - c0),
        per(s1 - s0)
    );
    for (cmd, v) in server_usec_per_call(admin) {
        eprintln!("[probe] server {cmd}: {v:.2} us per call");
    }
}
