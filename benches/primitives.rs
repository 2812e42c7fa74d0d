//! The semaphore and the multi-lock, as ratios to two PINGs measured in the same run.
//!
//! - `two_pings`: two PING round trips, each on a connection checked out of a pool (as the
//!   library sends its acquire and its release): the floor of a one-command acquire and a
//!   one-command release.
//! - `semaphore_cycle`: `Semaphore::try_acquire` + `Permit::release`, uncontended, with an
//!   explicit lease (a watched permit costs the same round trips; its renewal is the
//!   watchdog's).
//! - `multilock_2`, `multilock_8`: `MultiLock::try_lock` + `MultiGuard::unlock` over 2 and 8
//!   keys of one hash slot, uncontended.
//! - contended: 8 threads, each with its own client (8 clients), on a semaphore of 2 permits;
//!   each section is one PING on another connection. Reported as sections per second and as
//!   that rate over the rate of back-to-back two-PING cycles of one thread.
//!
//! The op-by-op variants run interleaved in rounds (`interleaved`); each ratio is the median
//! over rounds of the round's median over the round's two-PING median (`paired_ratio`), and the
//! per-round ratios' range is printed beside it. Run it a few times: these machines are noisy.
//!
//!   cargo bench -p redis-dlock-benches --bench primitives

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis_dlock::{LockClient, Semaphore};

const LEASE: Duration = Duration::from_secs(10);

fn main() {
    let mut env = BenchEnv::start("primitives");
    if !env.measuring() {
        return;
    }
    let url = env.url();
    let client = lock_client(&url, 4);
    let pool = floor_pool(&url, 4, 1);
    let sem = client
        .semaphore("bench:sem")
        .ttl(LEASE)
        .build()
        .expect("semaphore");
    sem.try_set_permits(1).expect("try_set_permits");
    let keys = |n: usize| -> Vec<String> { (0..n).map(|i| format!("{{bench:ml}}:{i}")).collect() };
    let multi2 = client
        .multi_lock(&keys(2))
        .ttl(LEASE)
        .build()
        .expect("multi-lock of 2");
    let multi8 = client
        .multi_lock(&keys(8))
        .ttl(LEASE)
        .build()
        .expect("multi-lock of 8");

    let (rounds, per) = env.pick((40, 200), (2, 20));
    let mut samples = {
        let mut variants = [
            Variant::new("two_pings", || {
                ping(&mut pool.get().expect("conn"));
                ping(&mut pool.get().expect("conn"));
            }),
            Variant::new("semaphore_cycle", || {
                let permit = sem.try_acquire().expect("a free permit");
                assert!(permit.release().expect("release"));
            }),
            Variant::new("multilock_2", || {
                let guard = multi2.try_lock().expect("2 free keys");
                assert!(guard.unlock().expect("unlock"));
            }),
            Variant::new("multilock_8", || {
                let guard = multi8.try_lock().expect("8 free keys");
                assert!(guard.unlock().expect("unlock"));
            }),
        ];
        let names: Vec<_> = variants.iter().map(|v| v.name).collect();
        let out = interleaved(&mut variants, rounds, per);
        names.into_iter().zip(out).collect::<Vec<_>>()
    };
    let pings = samples[0].1.clone();
    let mut two_pings_ns = 0.0;
    for (name, sample) in samples.iter_mut() {
        let per_round = per_round_ratios(sample, &pings, per);
        let paired = paired_ratio(sample, &pings, per);
        let (_, lo, hi) = median_lo_hi(per_round);
        let s = Stats::of(sample);
        if *name == "two_pings" {
            two_pings_ns = s.p50;
        }
        println!(
            "[primitives] {name:<16} p50 {:>9}  p99 {:>9}  = {paired:.3} x two PINGs \
             (rounds {lo:.3}-{hi:.3})",
            us(s.p50),
            us(s.p99),
        );
        env.put_stats("primitives", name, &s);
        env.put(
            "primitives",
            name,
            "paired_ratio_two_pings",
            format!("{paired:.4}"),
        );
    }

    let dur = env.pick(Duration::from_secs(4), Duration::from_millis(300));
    let runs = env.pick(3, 1);
    let mut rates = Vec::new();
    for run in 0..runs {
        let rate = contended(&url, run, dur);
        let ratio = rate * two_pings_ns / 1e9;
        println!(
            "[primitives] contended 8 clients, 2 permits, run {run}: {rate:.0} sections/s = \
             {ratio:.2} x one thread's two-PING cycles"
        );
        rates.push(ratio);
        env.put(
            "primitives",
            &format!("contended_8c_2p_run{run}"),
            "sections_per_s",
            format!("{rate:.0}"),
        );
    }
    let (m, lo, hi) = median_lo_hi(rates);
    println!("[primitives] contended: median {m:.2} x ({lo:.2}-{hi:.2}) over {runs} runs");
    env.finish();
}

/// Each round's median of `a` over its median of `b`.
fn per_round_ratios(a: &[u64], b: &[u64], per: usize) -> Vec<f64> {
    let median = |s: &[u64]| {
        let mut v = s.to_vec();
        v.sort_unstable();
        quantile(&v, 0.5) as f64
    };
    (0..a.len().min(b.len()) / per.max(1))
        .map(|r| median(&a[r * per..(r + 1) * per]) / median(&b[r * per..(r + 1) * per]))
        .collect()
}

/// 8 threads, a client each, on a fresh semaphore of 2 permits for `dur`; sections per second.
/// Each section counts how many are inside and fails if more than 2 are.
fn contended(url: &str, run: usize, dur: Duration) -> f64 {
    const THREADS: usize = 8;
    let name = format!("bench:sem:contended:{run}");
    let setup = lock_client(url, 2);
    let sem = setup
        .semaphore(&name)
        .ttl(LEASE)
        .build()
        .expect("semaphore");
    assert!(sem.try_set_permits(2).expect("try_set_permits"));
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicU64::new(0));
    let sections = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (url, name) = (url.to_owned(), name.clone());
            let (stop, inside, sections, barrier) = (
                Arc::clone(&stop),
                Arc::clone(&inside),
                Arc::clone(&sections),
                Arc::clone(&barrier),
            );
            thread::spawn(move || {
                let client: LockClient = lock_client(&url, 2);
                let sem: Semaphore = client
                    .semaphore(&name)
                    .ttl(LEASE)
                    .build()
                    .expect("semaphore");
                let mut conn = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .expect("connection");
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let permit = sem.acquire().expect("a permit within the wait");
                    assert!(inside.fetch_add(1, Ordering::SeqCst) < 2, "3 inside");
                    ping(&mut conn);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(permit.release().expect("release"), "a permit lost");
                    sections.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    thread::sleep(dur);
    let done = sections.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    done as f64 / elapsed.as_secs_f64()
}
