//! The history checker (tests/support/history.rs) on made-up histories, and on real traffic:
//! it must report the overlaps of a "lock" that writes its key without `NX` (the negative
//! control of every check that uses it), and find none in a Token lock's history under the
//! same load.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient};
use support::history::{self, decode, overlaps, Hold, Recorder};
use support::{init_logging, RedisServer};

fn hold(key: u32, holder: u64, acquired: u64, released: u64, valid_until: u64) -> Hold {
    Hold {
        key,
        holder,
        invoked: acquired.saturating_sub(1),
        acquired,
        valid_until,
        released,
        lost: 0,
    }
}

#[test]
fn windows_end_at_the_release_the_lease_or_the_loss() {
    assert_eq!(hold(0, 1, 10, 20, 30).window(), (10, 20));
    assert_eq!(hold(0, 1, 10, 20, 15).window(), (10, 15));
    let mut lost = hold(0, 1, 10, 20, 30);
    lost.lost = 12;
    assert_eq!(lost.window(), (10, 12));
    // A lease that ended before the acquire completed: an empty window.
    assert_eq!(hold(0, 1, 10, 20, 5).window(), (10, 10));
}

#[test]
fn overlaps_are_found_and_only_they() {
    // Back to back, other keys, one holder's own holds: none.
    let fine = [
        hold(0, 1, 10, 20, 100),
        hold(0, 2, 20, 30, 100),
        hold(1, 3, 15, 25, 100),
        hold(0, 1, 30, 40, 100),
    ];
    assert!(overlaps(&fine).is_empty());
    // Holder 2 starts before holder 1 released.
    let bad = [hold(0, 1, 10, 20, 100), hold(0, 2, 19, 30, 100)];
    let found = overlaps(&bad);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].ns, 1);
    // Holder 1 kept on after its lease ended at 15: no overlap with a start at 16 ...
    let late = [hold(0, 1, 10, 20, 15), hold(0, 2, 16, 30, 100)];
    assert!(overlaps(&late).is_empty());
    // ... while a window that outlives a long one is caught past the next.
    let long = [
        hold(0, 1, 10, 50, 100),
        hold(0, 2, 20, 21, 100),
        hold(0, 3, 30, 31, 100),
    ];
    assert_eq!(overlaps(&long).len(), 2);
}

#[test]
fn histories_survive_their_bytes() {
    let mut r = Recorder::new(7);
    let open = r.begin(3);
    let held = open.acquired();
    r.release(held, Duration::from_millis(5), false);
    let bytes = r.encode();
    assert_eq!(decode(&bytes), r.holds());
    assert!(r.holds()[0].valid_until > r.holds()[0].released);
}

/// Threads and keys of the real-traffic runs: more threads than keys, so that they contend.
const THREADS: usize = 8;
const KEYS: u32 = 4;
/// How long each run loads the server.
const RUN: Duration = Duration::from_millis(1_500);

/// A way of taking keys: a real lock, or the broken one of the negative control.
trait Locker: Sync {
    /// What a holder keeps until it gives the key back.
    type Held;
    /// One attempt: the hold, or `None` if someone else has the key.
    fn take(&self, key: u32) -> Option<Self::Held>;
    /// The hold's time left, as the lock counts it.
    fn left(&self, held: &Self::Held) -> Duration;
    /// The release.
    fn give(&self, key: u32, held: Self::Held);
}

/// Runs [`THREADS`] threads for [`RUN`], each taking random keys, with a counter's `GET` and
/// `SET` on the server while it holds one; returns every hold of every thread.
fn load<L: Locker>(server: &RedisServer, locker: &L) -> Vec<Hold> {
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (stop, mut con) = (&stop, server.conn());
                s.spawn(move || {
                    let mut rec = Recorder::new(t as u64);
                    let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ (t as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let key = (rng % u64::from(KEYS)) as u32;
                        let open = rec.begin(key);
                        let Some(held) = locker.take(key) else {
                            continue;
                        };
                        let acquired = open.acquired();
                        let ck = format!("history:counter:{key}");
                        let v: Option<i64> = redis::cmd("GET").arg(&ck).query(&mut con).unwrap();
                        redis::cmd("SET")
                            .arg(&ck)
                            .arg(v.unwrap_or(0) + 1)
                            .exec(&mut con)
                            .unwrap();
                        rec.release(acquired, locker.left(&held), false);
                        locker.give(key, held);
                    }
                    rec.holds().to_vec()
                })
            })
            .collect();
        // Time under test: the traffic runs this long.
        thread::sleep(RUN);
        stop.store(true, Ordering::Relaxed);
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    })
}

/// The negative control: `SET key value PX 1000` without `NX` (every attempt wins), released
/// by `DEL`. Its holders overlap, and the checker must say so.
struct NoNx {
    client: redis::Client,
}

impl Locker for NoNx {
    type Held = Instant;

    fn take(&self, key: u32) -> Option<Instant> {
        let invoked = Instant::now();
        let mut con = self.client.get_connection().unwrap();
        redis::cmd("SET")
            .arg(format!("history:lock:{key}"))
            .arg("x")
            .arg("PX")
            .arg(1_000)
            .exec(&mut con)
            .unwrap();
        Some(invoked + Duration::from_secs(1))
    }

    fn left(&self, until: &Instant) -> Duration {
        until.saturating_duration_since(Instant::now())
    }

    fn give(&self, key: u32, _: Instant) {
        let mut con = self.client.get_connection().unwrap();
        redis::cmd("DEL")
            .arg(format!("history:lock:{key}"))
            .exec(&mut con)
            .unwrap();
    }
}

/// Token locks of one client, one per key, taken by `try_lock` and released by `unlock`.
struct Token {
    locks: Vec<Lock>,
}

impl Locker for Token {
    type Held = redis_dlock::Lease;

    fn take(&self, key: u32) -> Option<redis_dlock::Lease> {
        match self.locks[key as usize].try_acquire() {
            Ok(lease) => Some(lease),
            Err(e) if e.is_contention() => None,
            Err(e) => panic!("{e}"),
        }
    }

    fn left(&self, lease: &redis_dlock::Lease) -> Duration {
        lease.remaining()
    }

    fn give(&self, key: u32, lease: redis_dlock::Lease) {
        assert!(self.locks[key as usize].release(&lease).unwrap());
    }
}

#[test]
fn a_lock_without_nx_is_reported() {
    init_logging();
    let server = RedisServer::start();
    let broken = NoNx {
        client: server.client(),
    };
    let holds = load(&server, &broken);
    let found = overlaps(&holds);
    eprintln!(
        "no NX: {} holds, {}",
        holds.len(),
        history::describe(&found, holds.iter().map(|h| h.invoked).min().unwrap_or(0))
    );
    assert!(holds.len() > 100, "the load ran: {} holds", holds.len());
    assert!(
        !found.is_empty(),
        "the checker found no overlap in a lock without NX"
    );
}

#[test]
fn token_holds_never_overlap() {
    init_logging();
    let server = RedisServer::start();
    for (what, ttl) in [("ttl", Some(Duration::from_secs(1))), ("watched", None)] {
        let clients: Vec<LockClient> = (0..2)
            .map(|_| LockClient::open(server.url().as_str()).unwrap())
            .collect();
        // Two clients, each with its own locks on the same keys: threads of both contend.
        let lockers: Vec<Token> = clients
            .iter()
            .map(|c| Token {
                locks: (0..KEYS)
                    .map(|k| {
                        let b = c.lock(format!("history:lock:{k}").as_str());
                        match ttl {
                            Some(ttl) => b.ttl(ttl),
                            None => b,
                        }
                        .build()
                        .unwrap()
                    })
                    .collect(),
            })
            .collect();
        let holds: Vec<Hold> = thread::scope(|s| {
            let runs: Vec<_> = lockers
                .iter()
                .map(|l| s.spawn(|| load(&server, l)))
                .collect();
            runs.into_iter()
                .enumerate()
                .flat_map(|(i, r)| {
                    // Holders of the two clients apart.
                    r.join().unwrap().into_iter().map(move |mut h| {
                        h.holder |= (i as u64) << 32;
                        h
                    })
                })
                .collect()
        });
        let found = overlaps(&holds);
        eprintln!(
            "token, {what}: {} holds, {} overlaps",
            holds.len(),
            found.len()
        );
        assert!(holds.len() > 100, "the load ran: {} holds", holds.len());
        assert!(
            found.is_empty(),
            "token, {what}: {}",
            history::describe(&found, holds.iter().map(|h| h.invoked).min().unwrap_or(0))
        );
    }
}
