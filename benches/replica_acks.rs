//! What replica confirmation costs: the uncontended Token cycle (`try_lock()` then `unlock()`,
//! an explicit ttl) on a primary with one replica, with `ReplicaAcks::Require(1)` (each
//! acquire followed by `WAIT 1 1000` in the same round trip) and with `ReplicaAcks::Off`,
//! measured interleaved with a pooled `PING` and with the bare commands of the confirmed cycle
//! (`SET NX PX` + `WAIT` pipelined, then the publishing release script) on a raw connection.
//!
//! Each ratio is the median of `runs` runs (5; `DLOCK_CYCLE_RUNS=n` changes it), with the
//! lowest and the highest run.
//!
//! ```text
//! cargo bench -p redis-dlock-benches --bench replica_acks
//! ```

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis_dlock::{DistributedLock, LockClient, ReplicaAcks};

fn client(url: &str, acks: ReplicaAcks) -> LockClient {
    LockClient::builder(url)
        .pool_size(redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE)
        .replica_acks(acks)
        .build()
        .expect("lock client")
}

fn cycle(lock: &dyn DistributedLock) {
    let guard = lock.try_lock().expect("uncontended try_lock");
    assert!(guard.unlock().expect("unlock"), "lost an uncontended lock");
}

/// The median, lowest and highest of the runs' values.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let mut env = BenchEnv::start("replica_acks");
    // One replica of the bench's server, connected before anything is measured.
    let replica = RedisServer::start();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(env.server.port())
        .exec(&mut replica.conn())
        .expect("REPLICAOF");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(100)
            .query(&mut env.server.conn())
            .expect("WAIT");
        if n == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never connected");
    }
    let url = env.url();
    let ttl = Duration::from_secs(10);
    let off = client(&url, ReplicaAcks::Off);
    let on = client(&url, ReplicaAcks::Require(1));
    let lock_off = off.lock("acks:off").ttl(ttl).build().expect("lock");
    let lock_on = on.lock("acks:on").ttl(ttl).build().expect("lock");
    let pool = floor_pool(&url, 16, 1);
    let sha = load_unlock(&mut env.server.conn());
    let channel = channel("acks:floor");
    let mut raw = env.server.conn();

    if env.measuring() {
        let (rounds, per) = env.pick((100, 60), (2, 5));
        let runs = env.pick(
            std::env::var("DLOCK_CYCLE_RUNS")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(5usize)
                .max(1),
            1,
        );
        let names = [
            "floor_ping_pool",
            "floor_set_nx_px_wait_raw",
            "token_off",
            "token_acks",
        ];
        let mut to_ping: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let mut acks_over_off = Vec::new();
        for run in 0..runs {
            let mut variants = vec![
                Variant::new(names[0], || {
                    ping(&mut pool.get().expect("pooled connection"))
                }),
                Variant::new(names[1], || {
                    let t = token();
                    let (set, acked): (redis::Value, i64) = redis::pipe()
                        .cmd("SET")
                        .arg("acks:floor")
                        .arg(&t[..])
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .cmd("WAIT")
                        .arg(1)
                        .arg(1_000)
                        .query(&mut raw)
                        .expect("SET NX PX + WAIT");
                    assert_eq!((set, acked), (redis::Value::Okay, 1));
                    assert!(evalsha_unlock_publish(
                        &mut raw,
                        &sha,
                        "acks:floor",
                        &channel,
                        &t
                    ));
                }),
                Variant::new(names[2], || cycle(&lock_off)),
                Variant::new(names[3], || cycle(&lock_on)),
            ];
            let samples = interleaved(&mut variants, rounds, per);
            drop(variants);
            for (i, s) in samples.iter().enumerate() {
                to_ping[i].push(paired_ratio(s, &samples[0], per) / 2.0);
            }
            acks_over_off.push(paired_ratio(&samples[3], &samples[2], per));
            println!(
                "[replica_acks] run {}/{runs}: token off {:.3} x 2 PING, with replica acks {:.3} \
                 ({:.3} x off)",
                run + 1,
                to_ping[2][run],
                to_ping[3][run],
                acks_over_off[run]
            );
        }
        for (i, name) in names.iter().enumerate().skip(1) {
            let (m, lo, hi) = spread(&to_ping[i]);
            env.put(
                "replica_acks",
                name,
                "paired_ratio_2ping",
                format!("{m:.4}"),
            );
            println!("[replica_acks] {name:<26} {m:.3} x 2 PING (median of {runs} runs, {lo:.3}-{hi:.3})");
        }
        let (m, lo, hi) = spread(&acks_over_off);
        env.put(
            "replica_acks",
            "token_acks",
            "paired_ratio_off",
            format!("{m:.4}"),
        );
        println!("[replica_acks] token with acks over off: {m:.3} (median of {runs} runs, {lo:.3}-{hi:.3})");
    }
    let mut c = criterion();
    {
        let mut g = c.benchmark_group("replica_acks");
        g.bench_function("token_off", |b| b.iter(|| cycle(&lock_off)));
        g.bench_function("token_acks", |b| b.iter(|| cycle(&lock_on)));
        g.finish();
    }
    c.final_summary();
    env.finish();
}
