//! Client-side costs of one cycle, without the network: token generation, the Classic value,
//! building and packing the `SET` / `SETNX` / `EVALSHA` commands, a pool checkout; and heap
//! allocations counted per step and per uncontended cycle against the real server, with a
//! counting global allocator.
//!
//! `token()`, `classic_value()` and the command builders call the library's own code through
//! its hidden `redis_dlock::bench_hooks` module (cargo feature `bench-hooks`, enabled in
//! benches/Cargo.toml), so these figures are the library's.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use redis::ConnectionLike;
use redis_dlock::ClassicOptions;
use redis_dlock::{bench_hooks, DistributedLock, Encoding, LockClient, Strategy};

// ---------------------------------------------------------------------------------------------
// Counting allocator

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// With `DLOCK_BENCH_TRACE_ALLOC` set, one library cycle of each strategy is run with this on and
/// every allocation's call site (the first frames in redis, r2d2 or this crate) is printed.
static TRACE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// Prints where an allocation comes from (called from the allocator, guarded against recursion).
fn trace(what: &str, size: usize) {
    if !TRACE.load(Ordering::Relaxed) || IN_TRACE.with(|t| t.replace(true)) {
        return;
    }
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let frames: Vec<&str> = bt
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.starts_with("at ")
                && (l.contains("redis::") || l.contains("r2d2::") || l.contains("redis_dlock::"))
        })
        .take(3)
        .collect();
    eprintln!("  {what} {size:>4} B  <- {}", frames.join("  <- "));
    IN_TRACE.with(|t| t.set(false));
}

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        trace("alloc  ", layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        trace("alloc  ", layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(
            new_size.saturating_sub(layout.size()) as u64,
            Ordering::Relaxed,
        );
        trace("realloc", new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Debug, Clone, Copy)]
struct AllocCount {
    allocs: f64,
    reallocs: f64,
    bytes: f64,
    ns: f64,
}

/// Runs `op` `n` times (after a warm-up) and returns allocations, reallocations, bytes and
/// wall time per call. Process-wide counters: nothing else runs meanwhile (r2d2's reaper wakes
/// every 30 s at most).
fn count(n: u64, mut op: impl FnMut()) -> AllocCount {
    for _ in 0..n.min(100) {
        op();
    }
    let (a0, r0, b0) = (
        ALLOCS.load(Ordering::SeqCst),
        REALLOCS.load(Ordering::SeqCst),
        BYTES.load(Ordering::SeqCst),
    );
    let t = Instant::now();
    for _ in 0..n {
        op();
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let per = |x: u64| x as f64 / n as f64;
    AllocCount {
        allocs: per(ALLOCS.load(Ordering::SeqCst) - a0),
        reallocs: per(REALLOCS.load(Ordering::SeqCst) - r0),
        bytes: per(BYTES.load(Ordering::SeqCst) - b0),
        ns,
    }
}

// ---------------------------------------------------------------------------------------------
// The operations

const KEY: &str = "micro:lock";
const TTL_MS: u64 = 10_000;

fn classic_be_value() -> ([u8; 20], usize) {
    bench_hooks::classic_value(Encoding::BigEndian, Duration::from_millis(1000))
        .expect("clock after 1970")
}

fn set_cmd(t: &[u8]) -> redis::Cmd {
    bench_hooks::set_nx_px_cmd(KEY, t, TTL_MS)
}

fn setnx_cmd(v: &[u8]) -> redis::Cmd {
    bench_hooks::setnx_cmd(KEY, v)
}

/// The release channel of [`KEY`].
fn key_channel() -> &'static str {
    static CHANNEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CHANNEL.get_or_init(|| channel(KEY))
}

/// The scripts as a client holds them, built once.
fn scripts() -> &'static bench_hooks::Scripts {
    static SCRIPTS: std::sync::OnceLock<bench_hooks::Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(bench_hooks::Scripts::new)
}

/// True if `cmd` calls the script with SHA `sha` (as loaded on the server, which must be the
/// one the library computed).
fn calls_sha(cmd: &redis::Cmd, sha: &str) -> bool {
    cmd.args_iter()
        .any(|a| matches!(a, redis::Arg::Simple(b) if b == sha.as_bytes()))
}

/// The library's Token release command, `EVALSHA sha 1 key token 0 channel`.
fn evalsha_publish_cmd(sha: &str, t: &[u8]) -> redis::Cmd {
    let cmd = scripts().unlock_publish_cmd(KEY, key_channel(), t);
    debug_assert!(calls_sha(&cmd, sha));
    cmd
}

/// The library's 1-key release command (Classic's), `EVALSHA sha 1 key value`.
fn evalsha_cmd(sha: &str, t: &[u8]) -> redis::Cmd {
    let cmd = scripts().unlock_cmd(KEY, t);
    debug_assert!(calls_sha(&cmd, sha));
    cmd
}

fn main() {
    let mut env = BenchEnv::start("micro");
    let url = env.url();
    let pool = floor_pool(&url, 16, 1);
    let client = lock_client(&url, redis_dlock::ClientBuilder::DEFAULT_POOL_SIZE);
    let sha = load_unlock(&mut env.server.conn());

    if env.measuring() {
        measure_ping_floor(&mut env, &pool);
        allocations(&mut env, &pool, &client, &sha);
    }

    let t = token();
    let (v, len) = classic_value(1000);
    let mut ops = vec![
        Variant::new("token_generate", || {
            black_box(token());
        }),
        Variant::new("classic_value_decimal", || {
            black_box(classic_value(1000));
        }),
        Variant::new("classic_value_bigendian", || {
            black_box(classic_be_value());
        }),
        Variant::new("set_nx_px_build_and_pack", || {
            black_box(set_cmd(black_box(&t)).get_packed_command());
        }),
        Variant::new("evalsha_build_and_pack", || {
            black_box(evalsha_cmd(black_box(&sha), black_box(&t)).get_packed_command());
        }),
        Variant::new("evalsha_publish_build_and_pack", || {
            black_box(evalsha_publish_cmd(black_box(&sha), black_box(&t)).get_packed_command());
        }),
        Variant::new("setnx_build_and_pack", || {
            black_box(setnx_cmd(black_box(&v[..len])).get_packed_command());
        }),
        Variant::new("pool_checkout_return", || {
            black_box(pool.get().expect("pooled connection"));
        }),
        Variant::new("lock_client_pool_state", || {
            black_box(client.pool_state());
        }),
        Variant::new("token_cycle_client_side", || {
            let t = token();
            let c1 = pool.get().expect("conn");
            let p1 = set_cmd(&t).get_packed_command();
            drop(c1);
            let c2 = pool.get().expect("conn");
            let p2 = evalsha_publish_cmd(&sha, &t).get_packed_command();
            drop(c2);
            black_box((p1, p2));
        }),
        Variant::new("script_sha1_once_per_client", || {
            black_box(redis::Script::new(black_box(UNLOCK_LUA)));
        }),
    ];

    if env.measuring() {
        // Our own figure: many short batches, interleaved; other work on the machine only ever
        // adds time, so the best batch is the code's own cost and the median batch a
        // conservative one.
        let (rounds, per) = env.pick((40, 2_000), (2, 10));
        env.put("cpu", "all", "rounds", rounds);
        env.put("cpu", "all", "per_round", per);
        let mut batches: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
        for _ in 0..rounds {
            for (i, v) in ops.iter_mut().enumerate() {
                let t0 = Instant::now();
                for _ in 0..per {
                    (v.op)();
                }
                batches[i].push(t0.elapsed().as_nanos() as f64 / per as f64);
            }
        }
        for (v, mut b) in ops.iter().zip(batches) {
            let name = v.name;
            b.sort_by(f64::total_cmp);
            let (best, median) = (b[0], b[b.len() / 2]);
            env.put("cpu", name, "best_ns", fmt_f(best));
            env.put("cpu", name, "median_ns", fmt_f(median));
            println!("[micro] cpu {name:<30} best {best:>8.1} ns  median {median:>8.1} ns");
        }
    }

    let mut c = criterion();
    {
        let mut g = c.benchmark_group("micro");
        for v in ops.iter_mut() {
            g.bench_function(v.name, |b| b.iter(&mut v.op));
        }
        g.finish();
    }
    c.final_summary();
    env.finish();
}

fn allocations(
    env: &mut BenchEnv,
    pool: &r2d2::Pool<redis::Client>,
    client: &LockClient,
    sha: &str,
) {
    let n = env.pick(5_000, 50);
    let io_n = env.pick(2_000, 20);
    let mut raw = env.server.conn();
    let token_lock = client.lock("micro:token").build().expect("lock");
    let token_ttl_lock = client
        .lock("micro:token:ttl")
        .ttl(Duration::from_secs(10))
        .build()
        .expect("lock");
    let reentrant_lock = client
        .lock("micro:reentrant")
        .strategy(Strategy::Reentrant)
        .build()
        .expect("lock");
    let classic_lock = client
        .lock("micro:classic")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .expect("lock");
    let classic_be = client
        .lock("micro:classic:be")
        .strategy(Strategy::Classic(
            ClassicOptions::new().encoding(Encoding::BigEndian),
        ))
        .build()
        .expect("lock");
    let classic_ttl = client
        .lock("micro:classic:ttl")
        .strategy(Strategy::Classic(ClassicOptions::new().key_ttl(true)))
        .build()
        .expect("lock");
    let cycle = |l: &dyn DistributedLock| {
        let g = l.try_lock().expect("uncontended");
        assert!(g.unlock().expect("unlock"));
    };
    let t = token();
    let prebuilt_set = set_cmd(&t);
    let packed_set_plain = redis::cmd("SET")
        .arg("micro:plain")
        .arg(&t[..])
        .get_packed_command();
    let packed_evalsha_miss = evalsha_cmd(sha, b"not-the-owner").get_packed_command();
    let mut buf: Vec<u8> = Vec::with_capacity(256);

    let steps: Vec<(&str, &str, AllocCount)> = vec![
        (
            "step",
            "token_generate",
            count(n, || {
                black_box(token());
            }),
        ),
        (
            "step",
            "classic_value_decimal",
            count(n, || {
                black_box(classic_value(1000));
            }),
        ),
        (
            "step",
            "set_nx_px_build",
            count(n, || {
                black_box(set_cmd(&t));
            }),
        ),
        (
            "step",
            "set_nx_px_pack",
            count(n, || {
                black_box(prebuilt_set.get_packed_command());
            }),
        ),
        (
            "step",
            "evalsha_build",
            count(n, || {
                black_box(evalsha_cmd(sha, &t));
            }),
        ),
        (
            "step",
            "evalsha_publish_build",
            count(n, || {
                black_box(evalsha_publish_cmd(sha, &t));
            }),
        ),
        (
            "step",
            "pool_checkout_return",
            count(n, || {
                black_box(pool.get().expect("conn"));
            }),
        ),
        (
            "step",
            "reply_ok_prepacked_set",
            count(io_n, || {
                let v = raw.req_packed_command(&packed_set_plain).expect("SET");
                assert_eq!(v, redis::Value::Okay);
            }),
        ),
        (
            "step",
            "reply_int_prepacked_evalsha",
            count(io_n, || {
                let v = raw
                    .req_packed_command(&packed_evalsha_miss)
                    .expect("EVALSHA");
                assert_eq!(v, redis::Value::Int(0));
            }),
        ),
        (
            "cycle",
            "bare_prepacked_reused_buffer",
            count(io_n, || {
                let t = token();
                buf.clear();
                set_cmd(&t).write_packed_command(&mut buf);
                assert_eq!(
                    raw.req_packed_command(&buf).expect("SET"),
                    redis::Value::Okay
                );
                buf.clear();
                evalsha_cmd(sha, &t).write_packed_command(&mut buf);
                assert_eq!(
                    raw.req_packed_command(&buf).expect("EVALSHA"),
                    redis::Value::Int(1)
                );
            }),
        ),
        (
            "cycle",
            "bare_set_nx_px_evalsha_raw",
            count(io_n, || {
                let t = token();
                assert!(set_nx_px(&mut raw, KEY, &t, TTL_MS));
                assert!(evalsha_unlock(&mut raw, sha, KEY, &t));
            }),
        ),
        (
            "cycle",
            "bare_set_nx_px_evalsha_pub_raw",
            count(io_n, || {
                let t = token();
                assert!(set_nx_px(&mut raw, KEY, &t, TTL_MS));
                assert!(evalsha_unlock_publish(
                    &mut raw,
                    sha,
                    KEY,
                    key_channel(),
                    &t
                ));
            }),
        ),
        (
            "cycle",
            "bare_set_nx_px_evalsha_pool",
            count(io_n, || {
                let t = token();
                assert!(set_nx_px(&mut pool.get().expect("conn"), KEY, &t, TTL_MS));
                assert!(evalsha_unlock(&mut pool.get().expect("conn"), sha, KEY, &t));
            }),
        ),
        (
            "cycle",
            "bare_setnx_evalsha_raw",
            count(io_n, || {
                let (v, len) = classic_value(1000);
                assert!(setnx(&mut raw, KEY, &v[..len]));
                assert!(evalsha_unlock(&mut raw, sha, KEY, &v[..len]));
            }),
        ),
        ("cycle", "token", count(io_n, || cycle(&token_lock))),
        ("cycle", "token_ttl", count(io_n, || cycle(&token_ttl_lock))),
        ("cycle", "reentrant", count(io_n, || cycle(&reentrant_lock))),
        (
            "cycle",
            "classic_decimal",
            count(io_n, || cycle(&classic_lock)),
        ),
        (
            "cycle",
            "classic_bigendian",
            count(io_n, || cycle(&classic_be)),
        ),
        (
            "cycle",
            "classic_key_ttl",
            count(io_n, || cycle(&classic_ttl)),
        ),
        (
            "setup",
            "lock_build_token",
            count(n, || {
                black_box(client.lock("micro:built").build().expect("lock"));
            }),
        ),
    ];
    if std::env::var_os("DLOCK_BENCH_TRACE_ALLOC").is_some() {
        for (name, lock) in [
            ("token (watched)", &token_lock),
            ("token with ttl", &token_ttl_lock),
            ("reentrant", &reentrant_lock),
            ("classic", &classic_lock),
        ] {
            eprintln!("[micro] allocations of one {name} cycle (try_lock + unlock):");
            TRACE.store(true, Ordering::SeqCst);
            cycle(lock);
            TRACE.store(false, Ordering::SeqCst);
        }
    }
    for (kind, name, a) in steps {
        let section = format!("alloc_{kind}");
        env.put(&section, name, "allocs", format!("{:.2}", a.allocs));
        env.put(&section, name, "reallocs", format!("{:.2}", a.reallocs));
        env.put(&section, name, "bytes", format!("{:.1}", a.bytes));
        env.put(&section, name, "ns", fmt_f(a.ns));
        println!(
            "[micro] {section:<12} {name:<30} {:>6.2} allocs {:>6.2} reallocs {:>8.1} bytes  \
             {:>10.1} ns/op",
            a.allocs, a.reallocs, a.bytes, a.ns
        );
    }
}
