//! `LockClient::stats()`: each counter driven against real servers and its value asserted.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use redis_dlock::test_hooks::Event;
use redis_dlock::ClassicOptions;
use redis_dlock::{
    DistributedLock, Encoding, LockClient, LockError, RedLockClient, RetryPolicy, Stats, Strategy,
    Takeover,
};
use support::expiry::{encode, epoch_ms};
use support::{init_logging, raw, wait_event, wait_until, RedisServer, EVENT_TIMEOUT};

/// The lease of the watched holds below (and twice the short ttl): short, so that the watchdog
/// renews (every third of it) and finds a deletion quickly, yet long enough that a first
/// acquire whose reply a busy machine delays by a few hundred ms is not a late win (a 300 ms
/// lease once was, at 169 ms).
const WATCHED_LEASE: Duration = Duration::from_secs(1);

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).unwrap()
}

#[test]
fn acquires_refusals_and_timeouts() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let build = |c: &LockClient| {
        c.lock("stats:contended")
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (la, lb) = (build(&a), build(&b));
    assert_eq!(a.stats(), Stats::default());

    let guard = la.lock().unwrap();
    assert!(matches!(lb.try_lock(), Err(LockError::Held { .. })));
    let attempts = match lb.try_lock_for(Duration::from_millis(300)) {
        Err(LockError::Timeout { attempts, .. }) => u64::from(attempts),
        other => panic!("expected a timeout, got {other:?}"),
    };
    assert!(attempts >= 2, "{attempts}");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.acquires, sa.refusals, sa.timeouts), (1, 0, 0));
    assert_eq!(sb.acquires, 0);
    assert_eq!(sb.refusals, 1 + attempts, "one per refused attempt");
    assert_eq!(sb.timeouts, 1);
    assert!(guard.unlock().unwrap());
    assert_eq!(a.stats().lost_holds, 0);
}

#[test]
fn every_lock_type_counts() {
    init_logging();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let (a, b) = (client(&servers[0]), client(&servers[0]));

    // Reentrant: a re-entry is a hold handed out; another thread is refused.
    let lock = Arc::new(
        a.lock("stats:reentrant")
            .strategy(Strategy::Reentrant)
            .build()
            .unwrap(),
    );
    let (g1, g2) = (lock.try_lock().unwrap(), lock.try_lock().unwrap());
    let other = Arc::clone(&lock);
    let refused = thread::spawn(move || other.try_lock().map(|g| g.unlock()))
        .join()
        .unwrap();
    assert!(matches!(refused, Err(LockError::Held { .. })));
    assert!(g2.unlock().unwrap() && g1.unlock().unwrap());
    let s = a.stats();
    assert_eq!((s.acquires, s.refusals), (2, 1));

    // Read-write: two readers, a refused writer.
    let rw = b.rw_lock("stats:rw").build().unwrap();
    let r1 = rw.read_lock().try_lock().unwrap();
    let rw2 = rw.clone();
    let r2 = thread::spawn(move || rw2.read_lock().try_lock().map(|g| g.into_lease()))
        .join()
        .unwrap()
        .unwrap();
    let rw3 = rw.clone();
    let w = thread::spawn(move || rw3.write_lock().try_lock().map(|g| g.into_lease()))
        .join()
        .unwrap();
    assert!(matches!(w, Err(LockError::Held { .. })));
    assert!(rw.read_lock().release(&r2).unwrap());
    assert!(r1.unlock().unwrap());
    let s = b.stats();
    assert_eq!((s.acquires, s.refusals), (2, 1));

    // Fair: a hold, a refusal, a timeout.
    let fair = |c: &LockClient| {
        c.lock("stats:fair")
            .strategy(Strategy::Fair)
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (c, d) = (client(&servers[1]), client(&servers[1]));
    let (fc, fd) = (fair(&c), fair(&d));
    let held = fc.try_lock().unwrap();
    assert!(matches!(fd.try_lock(), Err(LockError::Held { .. })));
    assert!(matches!(
        fd.try_lock_for(Duration::from_millis(200)),
        Err(LockError::Timeout { .. })
    ));
    assert!(held.unlock().unwrap());
    assert_eq!(c.stats().acquires, 1);
    let s = d.stats();
    assert_eq!((s.acquires, s.timeouts), (0, 1));
    assert!(s.refusals >= 2, "{s:?}");

    // RedLock: counted on the RedLockClient.
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let red = RedLockClient::open(&urls).unwrap();
    let l1 = red.lock("stats:redlock").build().unwrap();
    let l2 = red.lock("stats:redlock").build().unwrap();
    let g = l1.try_lock().unwrap();
    assert!(matches!(l2.try_lock(), Err(LockError::Held { .. })));
    // Long enough that a slow machine's attempt ends by the deadline, not by a late reply.
    let waited = l2.try_lock_for(Duration::from_secs(1));
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    assert!(g.unlock().unwrap());
    let s = red.stats();
    assert_eq!((s.acquires, s.timeouts), (1, 1));
    assert!(s.refusals >= 2, "{s:?}");
}

#[test]
fn lost_holds_are_counted_once_each() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);

    // An explicit lifetime that runs out: the extend says so, the release agrees; one loss.
    let short = c
        .lock("stats:short")
        .ttl(WATCHED_LEASE / 2)
        .build()
        .unwrap();
    let mut guard = short.lock().unwrap();
    assert!(wait_until(EVENT_TIMEOUT, || !raw::exists(
        &mut conn,
        "stats:short"
    )));
    assert!(matches!(
        guard.extend(Duration::from_secs(1)),
        Err(LockError::Lost { .. })
    ));
    assert_eq!(c.stats().lost_holds, 1);
    assert!(!guard.unlock().unwrap());
    assert_eq!(c.stats().lost_holds, 1, "the release found the same loss");

    // Released after it expired: found by the release.
    let guard = short.lock().unwrap();
    assert!(wait_until(EVENT_TIMEOUT, || !raw::exists(
        &mut conn,
        "stats:short"
    )));
    assert!(!guard.unlock().unwrap());
    assert_eq!(c.stats().lost_holds, 2);

    // A watched hold deleted under it: the watchdog finds it (renewal every third of the lease).
    let watched = c
        .lock("stats:watched")
        .watchdog_lease(WATCHED_LEASE)
        .build()
        .unwrap();
    let guard = watched.lock().unwrap();
    raw::del(&mut conn, "stats:watched");
    assert!(wait_until(Duration::from_secs(3), || c.stats().lost_holds == 3));
    assert!(guard.is_lost());
    assert!(!guard.unlock().unwrap());
    // A second count, which must not come, is given time to.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(c.stats().lost_holds, 3);
    assert_eq!(c.stats().acquires, 3);
}

/// Watched Fair holds lost under the watchdog, taken at once or granted by a release: each is
/// counted once (under the `fair` strategy label of the `metrics` feature, not `token`: see
/// tests/metrics.rs).
#[test]
fn lost_fair_holds_are_counted_once_each() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "stats:fair-lost";
    let (c, d) = (client(&server), client(&server));
    let build = |cl: &LockClient| {
        cl.lock(key)
            .strategy(Strategy::Fair)
            .watchdog_lease(WATCHED_LEASE)
            .build()
            .unwrap()
    };
    let (lc, ld) = (build(&c), build(&d));

    // Taken at once, then deleted under it: the watchdog finds it (renewal every third of the lease).
    let guard = lc.lock().unwrap();
    raw::del(&mut conn, key);
    assert!(wait_until(Duration::from_secs(3), || c.stats().lost_holds == 1));
    assert!(guard.is_lost());
    assert!(!guard.unlock().unwrap());
    // A second count, which must not come, is given time to.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(c.stats().lost_holds, 1, "the release found the same loss");

    // Granted to a waiter of another client by the release, then deleted under it.
    let held = lc.lock().unwrap();
    let waiter = thread::spawn(move || {
        let lease = ld.lock().map(|g| g.into_lease());
        (ld, lease)
    });
    let queued = wait_until(Duration::from_secs(5), || {
        redis::cmd("ZCARD")
            .arg(format!("dlock_fair_q:{{{key}}}"))
            .query::<i64>(&mut server.conn())
            .unwrap_or(0)
            == 1
    });
    assert!(queued, "the waiter queued");
    assert!(held.unlock().unwrap());
    let (ld, lease) = waiter.join().unwrap();
    let lease = lease.unwrap();
    assert_eq!(d.stats().acquires, 1);
    // Past the raise of the grant lease: the watchdog renews it.
    wait_event(&d, Event::Renewed, 1);
    assert!(ld.is_held(&lease).unwrap(), "renewed past the grant lease");
    raw::del(&mut conn, key);
    assert!(wait_until(Duration::from_secs(3), || d.stats().lost_holds == 1));
    assert!(lease.is_lost());
    assert!(!ld.release(&lease).unwrap());
    // A second count, which must not come, is given time to.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(d.stats().lost_holds, 1);
    assert_eq!(c.stats().lost_holds, 1);
}

#[test]
fn renewals_and_failed_renewals() {
    init_logging();
    let server = RedisServer::start();
    let c = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_millis(150)))
        .connect_timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let lock = c
        .lock("stats:renewed")
        .watchdog_lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = lock.lock().unwrap();
    // Renewed every 200 ms.
    assert!(wait_until(Duration::from_secs(3), || c.stats().renewals >= 2));
    assert_eq!(c.stats().failed_renewals, 0);
    server.pause();
    // Renewals time out until the 600 ms lease runs out: lost.
    let lost = wait_until(Duration::from_secs(5), || c.stats().lost_holds == 1);
    server.resume();
    assert!(lost);
    let s = c.stats();
    assert!(s.failed_renewals >= 1, "{s:?}");
    assert!(guard.is_lost());
    let _ = guard.unlock();
    assert_eq!(c.stats().lost_holds, 1);
}

#[test]
fn wakeups_come_from_published_releases() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let la = a
        .lock("stats:wake")
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let guard = la.lock().unwrap();
    let listener = b.clone();
    let waiter = thread::spawn(move || {
        // Polls beside the subscription no more often than the policy's 5 s sleep: within
        // this test only the published release can wake it.
        let lb = b
            .lock("stats:wake")
            .ttl(Duration::from_secs(30))
            .retry(RetryPolicy::standard().fixed_delay(Duration::from_secs(5)))
            .build()
            .unwrap();
        let got = lb.try_lock_for(Duration::from_secs(10)).map(|g| g.unlock());
        (got.is_ok(), b)
    });
    // The waiter subscribes, then sleeps (and polls every 100-120 ms) until the release.
    support::wait_listening(&listener, 1, 2);
    assert!(guard.unlock().unwrap());
    let released = std::time::Instant::now();
    let (acquired, b) = waiter.join().unwrap();
    assert!(acquired);
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the release, not a poll"
    );
    assert_eq!(b.stats().wakeups, 1, "one published release heard");
    assert_eq!(a.stats().wakeups, 0);
}

#[test]
fn classic_takeovers() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let stale = || encode(Encoding::Decimal, epoch_ms() - 5_000);
    for (key, takeover) in [
        ("stats:getset", Takeover::GetSet),
        ("stats:cas", Takeover::CompareAndSet),
    ] {
        raw::set(&mut conn, key, &stale());
        let lock = c
            .lock(key)
            .strategy(Strategy::Classic(ClassicOptions::new().takeover(takeover)))
            .build()
            .unwrap();
        assert!(lock.try_lock().unwrap().unlock().unwrap());
    }
    let s = c.stats();
    assert_eq!(
        (s.getset_takeovers, s.cas_takeovers, s.getset_overwrites),
        (1, 1, 0)
    );
    assert_eq!(s.acquires, 2);

    // A GETSET that loses the race: another contender writes between our GET and our GETSET
    // (a proxy holds our GETSET back until it has).
    let proxy = RacingProxy::start(server.port(), "stats:race");
    let racer = LockClient::open(proxy.url()).unwrap();
    let lock = racer
        .lock("stats:race")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .unwrap();
    raw::set(&mut conn, "stats:race", &stale());
    assert!(matches!(lock.try_lock(), Err(LockError::Held { .. })));
    let s = racer.stats();
    assert_eq!((s.getset_overwrites, s.getset_takeovers), (1, 0));
    assert_eq!((s.acquires, s.refusals), (0, 1));
    // Our GETSET replaced the winner's value with ours (the legacy flaw), and we put the
    // winner's back at once.
    assert_eq!(raw::get(&mut conn, "stats:race").unwrap(), proxy.winner());
}

#[test]
fn orphan_cleanups_and_reconnects() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let timeout = Duration::from_millis(300);
    let c = LockClient::builder(server.url())
        .command_timeout(Some(timeout))
        .connect_timeout(timeout)
        .pool_size(1)
        .build()
        .unwrap();
    let lock = c
        .lock("stats:orphan")
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    assert!(lock.try_lock().unwrap().unlock().unwrap());
    assert_eq!(c.stats().reconnects, 0);

    // Killed while idle in the pool: replaced, the command resent.
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut conn)
        .unwrap();
    assert!(lock.try_lock().unwrap().unlock().unwrap());
    assert_eq!(c.stats().reconnects, 1);

    // An acquire whose reply is lost (the server is paused): it runs when the server resumes,
    // and the client's clean-up thread deletes the lock nobody holds.
    server.pause();
    assert!(matches!(lock.try_lock(), Err(LockError::Connection { .. })));
    // Time under test: kept paused a while, so the clean-up's first tries meet the paused
    // server.
    thread::sleep(Duration::from_millis(800));
    server.resume();
    assert!(wait_until(Duration::from_secs(10), || c.pending_cleanups() == 0));
    assert!(!raw::exists(&mut conn, "stats:orphan"));
    let s = c.stats();
    assert_eq!(s.orphan_cleanups, 1, "{s:?}");
    assert!(
        s.reconnects >= 2,
        "the timed-out connection was replaced: {s:?}"
    );

    // The subscriber's connection killed while a thread waits: it reconnects.
    let before = c.stats().reconnects;
    let holder = client(&server);
    let held = holder.lock("stats:orphan").build().unwrap();
    let guard = held.lock().unwrap();
    let waiter = thread::spawn(move || {
        lock.try_lock_for(Duration::from_secs(10))
            .map(|g| g.unlock())
    });
    wait_event(&c, Event::Subscribed, 1);
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut conn)
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || c.stats().reconnects > before));
    assert!(guard.unlock().unwrap());
    assert!(waiter.join().unwrap().is_ok());
}

/// A TCP proxy in front of a server that, when a client sends `GETSET <key>`, first writes a
/// fresh expiry of another contender at the key over its own connection, then forwards the
/// command: the client's takeover loses the race every time.
struct RacingProxy {
    port: u16,
    winner: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl RacingProxy {
    fn start(server_port: u16, key: &'static str) -> RacingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let winner = Arc::new(std::sync::Mutex::new(Vec::new()));
        let won = Arc::clone(&winner);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                let won = Arc::clone(&won);
                let (mut c_read, mut u_write) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let (mut u_read, mut c_write) = (upstream, client);
                thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let chunk = &buf[..n];
                        if contains(chunk, b"GETSET") && contains(chunk, key.as_bytes()) {
                            let value = encode(Encoding::Decimal, epoch_ms() + 60_000);
                            let mut direct =
                                redis::Client::open(format!("redis://127.0.0.1:{server_port}/"))
                                    .unwrap()
                                    .get_connection()
                                    .unwrap();
                            raw::set(&mut direct, key, &value);
                            *won.lock().unwrap() = value;
                        }
                        if u_write.write_all(chunk).is_err() {
                            break;
                        }
                    }
                });
                thread::spawn(move || {
                    let _ = std::io::copy(&mut u_read, &mut c_write);
                });
            }
        });
        RacingProxy { port, winner }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The value the other contender wrote.
    fn winner(&self) -> Vec<u8> {
        self.winner.lock().unwrap().clone()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
