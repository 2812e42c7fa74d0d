//! Uncontended acquire + release: `try_lock()` then `unlock()` on the guard, for Token and for
//! Classic (decimal, big-endian, with the key TTL option, with the compare-and-set takeover),
//! measured interleaved with the floors of the same run: a pooled PING and the bare commands of
//! each algorithm sent on a raw connection.

mod common;

use common::*;
use redis_dlock::{DistributedLock, Encoding, LockClient, Strategy, Takeover};

/// The lock configurations measured, with their minimum number of round trips per cycle.
fn locks(client: &LockClient) -> Vec<(&'static str, Box<dyn DistributedLock>)> {
    let classic = |key: &str| client.lock(key).strategy(Strategy::Classic);
    vec![
        (
            "token",
            client
                .lock("cycle:token")
                .strategy(Strategy::Token)
                .build()
                .expect("token lock"),
        ),
        (
            "classic_decimal",
            classic("cycle:classic:dec").build().expect("classic"),
        ),
        (
            "classic_bigendian",
            classic("cycle:classic:be")
                .encoding(Encoding::BigEndian)
                .build()
                .expect("classic"),
        ),
        (
            "classic_key_ttl",
            classic("cycle:classic:ttl")
                .key_ttl()
                .build()
                .expect("classic"),
        ),
        (
            "classic_cas",
            classic("cycle:classic:cas")
                .takeover(Takeover::CompareAndSet)
                .build()
                .expect("classic"),
        ),
    ]
}

/// One uncontended cycle through the public API.
fn cycle(lock: &dyn DistributedLock) {
    let guard = lock.try_lock().expect("uncontended try_lock");
    assert!(guard.unlock().expect("unlock"), "lost an uncontended lock");
}

fn main() {
    let mut env = BenchEnv::start("cycle");
    let url = env.url();
    let client = lock_client(&url, redis_dlock::DEFAULT_POOL_SIZE);
    let pool = floor_pool(&url, 16, 1);
    let locks = locks(&client);
    let sha = load_unlock(&mut env.server.conn());

    if env.measuring() {
        custom(&mut env, &pool, &locks, &sha);
    }

    let mut c = criterion();
    {
        let mut g = c.benchmark_group("cycle");
        g.bench_function("floor_ping_pool", |b| {
            b.iter(|| ping(&mut pool.get().expect("pooled connection")))
        });
        for (name, lock) in &locks {
            g.bench_function(*name, |b| b.iter(|| cycle(lock.as_ref())));
        }
        g.finish();
    }
    c.final_summary();
    env.finish();
}

fn custom(
    env: &mut BenchEnv,
    pool: &r2d2::Pool<redis::Client>,
    locks: &[(&'static str, Box<dyn DistributedLock>)],
    sha: &str,
) {
    let mut raw_token = env.server.conn();
    let mut raw_classic = env.server.conn();
    let mut raw_classic_px = env.server.conn();
    let (rounds, per) = env.pick((100, 120), (2, 5));
    let mut variants = vec![
        Variant::new("floor_ping_pool", || {
            ping(&mut pool.get().expect("pooled connection"))
        }),
        Variant::new("floor_set_nx_px_evalsha_raw", || {
            let t = token();
            assert!(set_nx_px(&mut raw_token, "cycle:floor:t", &t, 10_000));
            assert!(evalsha_unlock(&mut raw_token, sha, "cycle:floor:t", &t));
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
    ];
    for (name, lock) in locks {
        variants.push(Variant::new(name, move || cycle(lock.as_ref())));
    }
    let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
    let mut samples = interleaved(&mut variants, rounds, per);
    drop(variants);
    // Paired ratios first (they need the samples in time order).
    let index = |n: &str| names.iter().position(|x| *x == n).expect("variant");
    let ping = samples[index("floor_ping_pool")].clone();
    let mut paired = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let to_ping = paired_ratio(&samples[i], &ping, per) / 2.0;
        let bare = match *name {
            "token" => Some("floor_set_nx_px_evalsha_raw"),
            "classic_key_ttl" => Some("floor_classic_set_nx_px_evalsha_raw"),
            n if n.starts_with("classic") => Some("floor_setnx_evalsha_raw"),
            _ => None,
        };
        let to_bare = bare.map(|b| paired_ratio(&samples[i], &samples[index(b)], per));
        paired.push((to_ping, to_bare));
    }
    let mut floor = 0.0;
    for ((name, sample), (to_ping, to_bare)) in names.iter().zip(samples.iter_mut()).zip(paired) {
        let s = Stats::of(sample);
        if *name == "floor_ping_pool" {
            floor = s.p50;
            env.put_stats("floor", "ping_pool", &s);
            continue;
        }
        env.put_stats("cycle", name, &s);
        env.put("cycle", name, "paired_ratio_2ping", format!("{to_ping:.4}"));
        if let Some(b) = to_bare {
            env.put("cycle", name, "paired_ratio_bare", format!("{b:.4}"));
        }
        println!(
            "[cycle] {name:<38} p50 {:>10}  p99 {:>10}  = {:.3} x 2 PING (paired {:.3}, to bare {})",
            us(s.p50),
            us(s.p99),
            s.p50 / (2.0 * floor),
            to_ping,
            to_bare.map_or("-".to_owned(), |b| format!("{b:.3}")),
        );
    }
    env.put("cycle", "all", "rounds", rounds);
    env.put("cycle", "all", "per_round", per);
}
