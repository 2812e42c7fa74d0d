//! The uncontended Token cycle over TLS (rustls), as a ratio to a pooled TLS `PING` measured
//! interleaved with it, next to the same ratio over plain TCP on the same server in the same
//! run. Repeated `runs` times in one process; the median and the spread of the runs are
//! printed and recorded in `target/dlock-bench/tls.csv`.
//!
//! `cargo bench -p redis-dlock-benches --features tls-rustls --bench tls`

mod common;

use std::time::Duration;

use common::*;
use redis_dlock::{DistributedLock, LockClient, Strategy, DEFAULT_POOL_SIZE};

/// One uncontended cycle through the public API.
fn cycle(lock: &dyn DistributedLock) {
    let guard = lock.try_lock().expect("uncontended try_lock");
    assert!(guard.unlock().expect("unlock"), "lost an uncontended lock");
}

fn token(client: &LockClient, key: &str, ttl: Option<Duration>) -> Box<dyn DistributedLock> {
    let b = client.lock(key).strategy(Strategy::Token);
    match ttl {
        Some(t) => b.ttl(t),
        None => b,
    }
    .build()
    .expect("token lock")
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
        .pool_size(DEFAULT_POOL_SIZE)
        .tls_certificates(pki.client_certificates(false))
        .build()
        .expect("TLS lock client");
    let plain_locks = lock_client(&env.url(), DEFAULT_POOL_SIZE);
    let token_tls = token(&tls_locks, "tls:token", None);
    let token_ttl_tls = token(&tls_locks, "tls:token:ttl", Some(Duration::from_secs(10)));
    let token_plain = token(&plain_locks, "plain:token", None);

    if env.measuring() {
        let runs = env.pick(5, 1);
        let (rounds, per) = env.pick((60, 100), (2, 5));
        let mut ratios: Vec<[f64; 4]> = Vec::new();
        for run in 0..runs {
            let mut variants = vec![
                Variant::new("ping_pool_tls", || {
                    ping(&mut tls_pool.get().expect("pooled TLS connection"))
                }),
                Variant::new("token_tls", || cycle(token_tls.as_ref())),
                Variant::new("token_ttl_tls", || cycle(token_ttl_tls.as_ref())),
                Variant::new("ping_pool_plain", || {
                    ping(&mut plain_pool.get().expect("pooled connection"))
                }),
                Variant::new("token_plain", || cycle(token_plain.as_ref())),
            ];
            let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
            let mut samples = interleaved(&mut variants, rounds, per);
            drop(variants);
            let r = [
                paired_ratio(&samples[1], &samples[0], per) / 2.0,
                paired_ratio(&samples[2], &samples[0], per) / 2.0,
                paired_ratio(&samples[4], &samples[3], per) / 2.0,
                paired_ratio(&samples[0], &samples[3], per),
            ];
            let section = format!("run{run}");
            for (name, sample) in names.iter().zip(samples.iter_mut()) {
                let s = Stats::of(sample);
                env.put_stats(&section, name, &s);
                println!(
                    "[tls] run {run} {name:<16} p50 {:>10}  p99 {:>10}",
                    us(s.p50),
                    us(s.p99)
                );
            }
            for (metric, v) in [
                "token_tls_2ping_tls",
                "token_ttl_tls_2ping_tls",
                "token_plain_2ping_plain",
                "ping_tls_ping_plain",
            ]
            .iter()
            .zip(r)
            {
                env.put(&section, "ratio", metric, format!("{v:.4}"));
            }
            println!(
                "[tls] run {run}: Token over TLS = {:.3} x 2 TLS PING (explicit ttl {:.3}); \
                 plain TCP {:.3} x 2 PING; TLS PING = {:.3} x plain PING",
                r[0], r[1], r[2], r[3]
            );
            ratios.push(r);
        }
        let labels = [
            "Token (watched) over TLS / 2 TLS PING",
            "Token (explicit ttl) over TLS / 2 TLS PING",
            "Token (watched) over plain TCP / 2 plain PING",
            "TLS PING / plain PING",
        ];
        for (i, label) in labels.iter().enumerate() {
            let mut v: Vec<f64> = ratios.iter().map(|r| r[i]).collect();
            v.sort_by(f64::total_cmp);
            let median = v[v.len() / 2];
            let (lo, hi) = (v[0], v[v.len() - 1]);
            println!(
                "[tls] {label}: median {median:.3} (runs {lo:.3}-{hi:.3}, n={})",
                v.len()
            );
            env.put(
                "summary",
                &format!("ratio{i}"),
                "median",
                format!("{median:.4}"),
            );
            env.put("summary", &format!("ratio{i}"), "min", format!("{lo:.4}"));
            env.put("summary", &format!("ratio{i}"), "max", format!("{hi:.4}"));
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
        g.bench_function("token_tls", |b| b.iter(|| cycle(token_tls.as_ref())));
        g.finish();
    }
    c.final_summary();
    env.finish();
}
