//! Fencing tokens: a lock holder that pauses past its lease is stopped by the resource, not by
//! the lock (see `docs/fencing.md`).
//!
//! ```text
//! cargo run --example fencing
//! ```
//!
//! Uses `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server` on a free
//! loopback port (no persistence) and kills it at the end.
//!
//! Writer A takes the lock (lease 500 ms, no watchdog), writes, then "pauses" for 1 s (think
//! of a GC pause). Its lease runs out meanwhile, so writer B takes the lock, with a larger
//! fencing token, and writes. When A wakes up it still believes it holds the lock and writes:
//! the store refuses it, because A's token is older than B's. Exits non-zero if anything else
//! happens.

#[path = "fencing/store.rs"]
mod store;

use std::error::Error;
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, Lock, LockClient};
use store::FencedStore;

type BoxError = Box<dyn Error + Send + Sync>;

const KEY: &str = "redis-dlock:example:fencing";
const LEASE: Duration = Duration::from_millis(500);
const PAUSE: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("UNEXPECTED: a current write was refused or the stale one accepted");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A fenced lock on [`KEY`] with an explicit lease (so no watchdog renews it), on a client of
/// its own, as a separate process would have.
fn fenced_lock(url: &str) -> Result<Lock, BoxError> {
    let client = LockClient::open(url)?;
    Ok(client.lock(KEY).ttl(LEASE).fencing().build()?)
}

fn write(store: &FencedStore, who: &str, fence: u64, value: &str) -> bool {
    match store.write(fence, value) {
        Ok(()) => {
            println!("{who}: write {value:?} with fence {fence} -> accepted");
            true
        }
        Err(stale) => {
            println!("{who}: write {value:?} with fence {fence} -> REFUSED: {stale}");
            false
        }
    }
}

fn run() -> Result<bool, BoxError> {
    // Kept until the end: dropping it kills the server.
    let local = match std::env::var("REDIS_URL") {
        Ok(_) => None,
        Err(_) => Some(LocalRedis::start()?),
    };
    let url = match &local {
        Some(redis) => redis.url(),
        None => std::env::var("REDIS_URL")?,
    };
    println!("Redis {url}, lock {KEY}, counter dlock_fence:{{{KEY}}}");
    let store = FencedStore::new();
    let (a, b) = (fenced_lock(&url)?, fenced_lock(&url)?);

    let guard_a = a.try_lock()?;
    let fence_a = guard_a
        .fence()
        .ok_or("no fence: lock built without .fencing()")?;
    println!("A: acquired, fence {fence_a}, lease {LEASE:?}");
    // One hold, several writes: the store accepts an equal token.
    for value in ["A: step 1", "A: step 2"] {
        if !write(&store, "A", fence_a, value) {
            return Ok(false);
        }
    }

    let as_expected = thread::scope(|s| -> Result<bool, BoxError> {
        let writer_b = s.spawn(|| -> Result<bool, BoxError> {
            let asked = Instant::now();
            let guard_b = b.lock()?; // waits until A's lease has run out
            let fence_b = guard_b.fence().ok_or("no fence")?;
            println!(
                "B: acquired after {} ms (A's lease ran out), fence {fence_b}",
                asked.elapsed().as_millis()
            );
            let written = write(&store, "B", fence_b, "B: step 1");
            guard_b.unlock()?;
            Ok(written)
        });

        println!("A: pauses for {PAUSE:?}");
        thread::sleep(PAUSE);
        // Only so that the output reads in order should B be slower than A's pause.
        let b_written = writer_b.join().map_err(|_| "writer B panicked")??;
        println!(
            "A: wakes up, lease expired by its own clock: {}",
            guard_a.is_expired()
        );
        Ok(b_written && !write(&store, "A", fence_a, "A: step 3"))
    })?;

    println!(
        "A: unlock -> {} (the lock is no longer A's)",
        guard_a.unlock()?
    );
    println!(
        "store: {:?}, highest fence {}",
        store.read().unwrap_or_default(),
        store.highest()
    );
    Ok(as_expected)
}

/// A `redis-server` child on a free loopback port, killed (by its own pid) when dropped.
struct LocalRedis {
    child: Child,
    port: u16,
}

impl LocalRedis {
    fn start() -> Result<LocalRedis, BoxError> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        // The binary of `DLOCK_TEST_SERVER` (as the tests; e.g. a `valkey-server`), else
        // `redis-server` on PATH.
        let bin = std::env::var("DLOCK_TEST_SERVER")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "redis-server".to_owned());
        let child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not start {bin} ({e}); install it or set REDIS_URL"))?;
        let mut redis = LocalRedis { child, port };
        let client = redis::Client::open(redis.url())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = redis.child.try_wait()? {
                return Err(
                    format!("redis-server exited with {status} (port {port} taken?)").into(),
                );
            }
            let pong = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut con| redis::cmd("PING").query::<String>(&mut con));
            if pong.is_ok() {
                return Ok(redis);
            }
            if Instant::now() >= deadline {
                return Err(format!("redis-server on port {port} did not answer").into());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        // SIGKILL exactly this child (not yet reaped, so its pid cannot have been reused).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
