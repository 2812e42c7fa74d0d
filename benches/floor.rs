//! The round-trip floor: what one PING, and one `SET NX PX` + one `EVALSHA` (compare-and-delete),
//! cost on this machine in this run, on a pooled connection (r2d2, no checkout PING, like
//! `LockClient`'s pool) and on a raw `redis::Connection`.
//!
//! Every other figure of the report is divided by a floor measured the same way in its own run.

mod common;

use common::*;

const TTL_MS: u64 = 10_000;

fn main() {
    let mut env = BenchEnv::start("floor");
    let url = env.url();
    let pool = floor_pool(&url, 16, 1);
    let mut raw = env.server.conn();
    let sha = load_unlock(&mut raw);

    if env.measuring() {
        custom(&mut env, &pool, &sha);
    }

    let mut c = criterion();
    {
        let mut g = c.benchmark_group("floor");
        let mut raw = env.server.conn();
        g.bench_function("ping_pool", |b| {
            b.iter(|| ping(&mut pool.get().expect("pooled connection")))
        });
        g.bench_function("ping_raw", |b| b.iter(|| ping(&mut raw)));
        g.bench_function("ping_raw_prepacked", |b| {
            b.iter(|| ping_prepacked(&mut raw))
        });
        g.bench_function("set_nx_px_evalsha_raw", |b| {
            b.iter(|| token_floor(&mut raw, &sha, "floor:crit:raw"))
        });
        g.bench_function("set_nx_px_evalsha_pool", |b| {
            b.iter(|| token_floor_pool(&pool, &sha, "floor:crit:pool"))
        });
        g.bench_function("setnx_evalsha_raw", |b| {
            b.iter(|| classic_floor(&mut raw, &sha, "floor:crit:classic"))
        });
        g.finish();
    }
    c.final_summary();
    env.finish();
}

/// `SET key token NX PX` then `EVALSHA unlock key token` on one connection.
fn token_floor(con: &mut redis::Connection, sha: &str, key: &str) {
    let t = token();
    assert!(set_nx_px(con, key, &t, TTL_MS), "{key} unexpectedly held");
    assert!(evalsha_unlock(con, sha, key, &t));
}

/// The same with one pool checkout per command, as the library does.
fn token_floor_pool(pool: &r2d2::Pool<redis::Client>, sha: &str, key: &str) {
    let t = token();
    assert!(set_nx_px(&mut pool.get().expect("conn"), key, &t, TTL_MS));
    assert!(evalsha_unlock(&mut pool.get().expect("conn"), sha, key, &t));
}

/// Classic's minimum: `SETNX key expiry` then `EVALSHA unlock key expiry`.
fn classic_floor(con: &mut redis::Connection, sha: &str, key: &str) {
    let (buf, len) = classic_value(1000);
    assert!(setnx(con, key, &buf[..len]), "{key} unexpectedly held");
    assert!(evalsha_unlock(con, sha, key, &buf[..len]));
}

fn custom(env: &mut BenchEnv, pool: &r2d2::Pool<redis::Client>, sha: &str) {
    let mut raw = env.server.conn();
    let mut raw2 = env.server.conn();
    let mut raw3 = env.server.conn();
    let mut raw4 = env.server.conn();
    let mut raw5 = env.server.conn();
    let mut raw5b = env.server.conn();
    let (rounds, per) = env.pick((50, 150), (2, 10));
    let names;
    let mut samples = {
        let mut variants = [
            Variant::new("ping_pool", || ping(&mut pool.get().expect("conn"))),
            Variant::new("ping_raw", || ping(&mut raw)),
            Variant::new("ping_raw_prepacked", || ping_prepacked(&mut raw2)),
            Variant::new("set_nx_px_evalsha_raw", || {
                token_floor(&mut raw3, sha, "floor:raw")
            }),
            Variant::new("set_nx_px_evalsha_pool", || {
                token_floor_pool(pool, sha, "floor:pool")
            }),
            Variant::new("setnx_evalsha_raw", || {
                classic_floor(&mut raw4, sha, "floor:classic")
            }),
            Variant::new("set_px_raw", || {
                let v: redis::Value = redis::cmd("SET")
                    .arg("floor:set")
                    .arg(&token()[..])
                    .arg("PX")
                    .arg(TTL_MS)
                    .query(&mut raw5)
                    .expect("SET PX");
                assert_eq!(v, redis::Value::Okay);
            }),
            Variant::new("evalsha_miss_raw", || {
                assert!(!evalsha_unlock(&mut raw5b, sha, "floor:set", b"not-ours"));
            }),
        ];
        names = variants.iter().map(|v| v.name).collect::<Vec<_>>();
        interleaved(&mut variants, rounds, per)
    };
    let ping_samples = samples[0].clone();
    let paired: Vec<f64> = samples
        .iter()
        .map(|s| paired_ratio(s, &ping_samples, per))
        .collect();
    let mut ping_pool = 0.0;
    for ((name, sample), paired) in names.iter().zip(samples.iter_mut()).zip(paired) {
        let s = Stats::of(sample);
        if *name == "ping_pool" {
            ping_pool = s.p50;
        }
        println!(
            "[floor] {name:<24} p50 {:>10}  p99 {:>10}  = {:.3} x PING(pool) (paired {paired:.3})",
            us(s.p50),
            us(s.p99),
            s.p50 / ping_pool
        );
        env.put_stats("floor", name, &s);
        env.put("floor", name, "paired_ratio_ping", format!("{paired:.4}"));
    }
    env.put("floor", "all", "rounds", rounds);
    env.put("floor", "all", "per_round", per);

    // For the record: the same raw PING with redis-server moved onto the client's core.
    if env.pinned && repin_server(env, "0") {
        let mut s = {
            let mut v = [Variant::new("ping_raw_same_core", || ping(&mut raw))];
            interleaved(&mut v, rounds / 2, per)
        };
        let st = Stats::of(&mut s[0]);
        println!(
            "[floor] ping_raw with server on the client's core: p50 {}",
            us(st.p50)
        );
        env.put_stats("floor_info", "ping_raw_same_core", &st);
        if !repin_server(env, "1") {
            eprintln!("[floor] could not move redis-server back to CPU 1");
        }
    }
}
