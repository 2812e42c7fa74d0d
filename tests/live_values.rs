//! The client's live set (the values it writes or holds, which its orphan clean-up must leave
//! alone) is bounded by the holds that may still live, not by the number of acquires: a lease
//! given up with `into_lease()` and left to expire leaves it by itself.

mod support;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, LockClient, LockError, Strategy};
use support::{init_logging, RedisServer};

/// The lifetime of every hold here: short, so that they expire while the loop runs.
const TTL: Duration = Duration::from_millis(200);

/// `try_lock` again while its reply comes too late for the short lifetime (a busy machine):
/// such a win is released at once and refused, which is not what is tested here.
fn take<T>(mut f: impl FnMut() -> Result<T, LockError>) -> T {
    loop {
        match f() {
            Err(LockError::LateReply { .. }) => continue,
            other => return other.expect("free"),
        }
    }
}

/// How long after an acquire returned its value may stay in the live set at most: the
/// lifetime counted from the reply, plus the clock-drift allowance (1 % and 2 ms).
fn window() -> Duration {
    TTL + TTL / 100 + Duration::from_millis(2)
}

/// Takes `n` holds with `acquire(i)` (each on its own key), gives each up as a bare lease and
/// drops it, and checks every 500 holds that the client's live set has no more entries than
/// the holds whose lifetime may not have run out; then that it empties once they all have.
fn given_up_leases_leave(
    what: &str,
    client: &LockClient,
    n: usize,
    mut acquire: impl FnMut(usize),
) {
    // When each acquire returned, oldest first; only those within `window()` may be live.
    let mut returned: VecDeque<Instant> = VecDeque::new();
    let mut peak = 0;
    for i in 0..n {
        acquire(i);
        returned.push_back(Instant::now());
        if i % 500 == 499 {
            let now = Instant::now();
            while returned.front().is_some_and(|t| *t + window() <= now) {
                returned.pop_front();
            }
            let entries = client.live_values();
            peak = peak.max(entries);
            assert!(
                entries <= returned.len(),
                "{what}: {entries} entries in the live set after {} given-up leases, of which \
                 at most {} may still live",
                i + 1,
                returned.len()
            );
        }
    }
    // Time under test: every given-up lease's lifetime runs out.
    std::thread::sleep(window());
    assert_eq!(
        client.live_values(),
        0,
        "{what}: entries left once every given-up lease expired"
    );
    eprintln!("{what}: {n} leases given up, at most {peak} entries in the live set");
}

#[test]
fn leases_left_to_expire_leave_the_live_set() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).expect("client");

    for (what, strategy, n) in [
        ("token", Strategy::Token, 100_000),
        ("reentrant", Strategy::Reentrant, 2_000),
    ] {
        given_up_leases_leave(what, &client, n, |i| {
            let lock = client
                .lock(format!("live:{what}:{i}"))
                .strategy(strategy)
                .ttl(TTL)
                .build()
                .expect("lock");
            // Reentrant: two counted holds of one owner, both given up.
            let holds = if strategy == Strategy::Reentrant {
                2
            } else {
                1
            };
            let leases: Vec<_> = (0..holds)
                .map(|_| take(|| lock.try_lock()).into_lease())
                .collect();
            drop(leases);
        });
    }

    given_up_leases_leave("fair", &client, 2_000, |i| {
        let lock = client
            .lock(format!("live:f:{i}"))
            .ttl(TTL)
            .strategy(Strategy::Fair)
            .build()
            .expect("lock");
        drop(take(|| lock.try_lock()).into_lease());
    });

    given_up_leases_leave("read-write", &client, 2_000, |i| {
        let rw = client
            .rw_lock(format!("live:rw:{i}"))
            .ttl(TTL)
            .build()
            .expect("lock");
        let lease = if i % 2 == 0 {
            take(|| rw.read_lock().try_lock()).into_lease()
        } else {
            take(|| rw.write_lock().try_lock()).into_lease()
        };
        drop(lease);
    });

    // A hold that is kept (and extended past its first lifetime) stays live meanwhile: its
    // value is never taken for a stale one.
    let lock = client.lock("live:kept").ttl(TTL).build().expect("lock");
    let mut lease = take(|| lock.try_acquire());
    lock.extend(&mut lease, Duration::from_secs(30))
        .expect("extend");
    // Time under test: past the kept hold's first lifetime.
    std::thread::sleep(window() * 2);
    assert_eq!(client.live_values(), 1, "the kept hold");
    assert!(lock.release(&lease).expect("release"));
    assert_eq!(client.live_values(), 0, "released");

    // Watched holds stay live past their first lease while the watchdog renews them (a value
    // and a counted hold), and leave once given up and expired.
    let lease = Duration::from_millis(600);
    let token = client
        .lock("live:watched:t")
        .watchdog_lease(lease)
        .build()
        .expect("lock");
    let counted = client
        .lock("live:watched:r")
        .watchdog_lease(lease)
        .strategy(Strategy::Reentrant)
        .build()
        .expect("lock");
    let held = [
        take(|| token.try_lock()).into_lease(),
        take(|| counted.try_lock()).into_lease(),
    ];
    // Time under test: past the first lease, renewed meanwhile.
    std::thread::sleep(lease * 5 / 2);
    // A renewal late on a busy machine loses its hold: only those still held must be live.
    let kept = held.iter().filter(|l| !l.is_lost()).count();
    assert!(
        client.live_values() >= kept,
        "{} entries for {kept} watched holds renewed past their first lease",
        client.live_values()
    );
    drop(held);
    assert!(
        support::wait_until(Duration::from_secs(5), || client.live_values() == 0),
        "{} entries left after the watched holds were given up",
        client.live_values()
    );
}
