//! Integration tests of `Strategy::Fair` against real `redis-server` processes started by the
//! fixture: FIFO grants made inside Redis, the grant message as the only reply a waiter needs,
//! and the failure cases (dead, frozen and impatient waiters, a server restart).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::{DistributedLock, FairLock, LockClient, LockError, RetryPolicy, Strategy};
use support::worker::{self, WorkerProcess};
#[cfg(feature = "cluster")]
use support::Cluster;
use support::{init_logging, raw, RedisServer};

const SECOND: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url()).expect("client")
}

fn fair(client: &LockClient, key: &str) -> FairLock {
    client
        .lock(key)
        .strategy(Strategy::Fair)
        .build()
        .expect("build fair lock")
        .try_into()
        .expect("the strategy built")
}

fn fair_fenced(client: &LockClient, key: &str) -> FairLock {
    client
        .lock(key)
        .fencing()
        .strategy(Strategy::Fair)
        .build()
        .expect("build fair lock")
        .try_into()
        .expect("the strategy built")
}

/// A retry policy whose longest sleep (the poll floor beside pub/sub) is `poll`: a waiter then
/// sends nothing between its enqueue and its grant unless `poll` passes.
fn slow_poll(poll: Duration) -> RetryPolicy {
    RetryPolicy::standard().backoff(ms(4), poll, 2)
}

fn zcard(conn: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("ZCARD").arg(key).query(conn).expect("ZCARD")
}

/// Waits until the queue of `lock` has `n` entries.
fn wait_queued(conn: &mut redis::Connection, lock: &impl DistributedLock, n: usize) {
    let queue = FairLock::queue_key_for(lock.key()).expect("queue key");
    assert!(
        support::wait_until(Duration::from_secs(10), || zcard(conn, &queue) == n),
        "the queue never reached {n} entries (has {})",
        zcard(conn, &queue)
    );
}

/// Commands sent by clients that a lock and its subscriber send (not GET: INFO commandstats
/// also counts the commands run inside scripts, and those are never sent on their own here),
/// including the INFO of each earlier call of this function.
fn total_calls(conn: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let top_level = [
        "evalsha",
        "eval",
        "subscribe",
        "unsubscribe",
        "ping",
        "client",
        "info",
    ];
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(":calls="))
        .filter(|(name, _)| top_level.contains(name))
        .filter_map(|(_, rest)| rest.split(',').next())
        .map(|n| n.parse::<i64>().expect("a call count"))
        .sum()
}

/// Records every command the server runs (`MONITOR` on a connection of its own) until
/// stopped: one line per command.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stream: std::net::TcpStream,
    port: u16,
}

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        use std::io::{BufRead, BufReader, Write};
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("+OK");
        assert!(ok.starts_with("+OK"), "{ok}");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        Monitor {
            lines,
            stream,
            port: server.port(),
        }
    }

    /// The lines recorded so far (and clears them): every command the server ran before this
    /// call. MONITOR reports in the order the server runs commands, so once a marker sent now
    /// is seen, all that came before it has been read.
    fn take(&self) -> Vec<String> {
        static MARKERS: AtomicU32 = AtomicU32::new(0);
        let marker = format!("monitor-sync-{}", MARKERS.fetch_add(1, Ordering::SeqCst));
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .and_then(|c| c.get_connection())
            .expect("conn");
        let _: String = redis::cmd("ECHO")
            .arg(&marker)
            .query(&mut conn)
            .expect("ECHO");
        let seen = support::wait_until(support::EVENT_TIMEOUT, || {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(&marker))
        });
        assert!(seen, "MONITOR never showed the marker");
        let mut buf = self.lines.lock().unwrap();
        let at = buf.iter().position(|l| l.contains(&marker)).unwrap_or(0);
        // The marker's connection (`[db addr]`), whose set-up commands (`CLIENT SETINFO`, which
        // Valkey logs and Redis 7.0 does not know) are the test's, not the lock's.
        let own = buf[at]
            .split_once(" [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(who, _)| format!("[{who}]"));
        // What came after the marker stays for the next call.
        let after = buf.split_off(at + 1);
        let mut lines = std::mem::replace(&mut *buf, after);
        lines.truncate(at);
        lines.retain(|l| own.as_ref().is_none_or(|own| !l.contains(own.as_str())));
        lines
    }

    /// Stops recording and returns the commands clients sent (not those run by scripts).
    fn sent(self) -> Vec<String> {
        self.take()
            .into_iter()
            .filter(|l| !l.contains("[0 lua]"))
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

#[test]
fn uncontended_cycle_is_one_command_each_way() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let mut conn = server.conn();
    for fenced in [false, true] {
        let key = format!("fair:uncontended:{fenced}");
        let lock = if fenced {
            fair_fenced(&c, &key)
        } else {
            fair(&c, &key)
        };
        // Warm up: the scripts are loaded (a NOSCRIPT + EVAL the first time).
        lock.lock().expect("lock").unlock().expect("unlock");
        let monitor = Monitor::start(&server);
        let guard = lock.lock().expect("lock");
        assert!(guard.fence().is_some() == fenced);
        let value = guard.value().to_vec();
        assert!(guard.unlock().expect("unlock"));
        let sent = monitor.sent();
        // One command each way: `SET NX PX` (fenced: the acquire script) and the release
        // script.
        assert_eq!(sent.len(), 2, "{sent:#?}");
        let first = if fenced { "\"EVALSHA\"" } else { "\"SET\"" };
        assert!(sent[0].contains(first), "{sent:#?}");
        assert!(sent[1].contains("\"EVALSHA\""), "{sent:#?}");
        let guard = lock.lock().expect("lock");
        assert_ne!(guard.value(), &value[..]);
        assert_eq!(raw::get(&mut conn, &key).as_deref(), Some(guard.value()));
        drop(guard);
        assert!(!raw::exists(&mut conn, &key));
        assert_eq!(zcard(&mut conn, lock.queue_key()), 0);
    }
}

#[test]
fn try_lock_does_not_queue_and_a_free_lock_goes_to_the_queue_head() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let mut conn = server.conn();
    let la = fair(&a, "fair:try");
    let lb = fair(&b, "fair:try");
    let held = la.try_lock().expect("free");
    assert!(matches!(lb.try_lock(), Err(LockError::Held { .. })));
    assert_eq!(zcard(&mut conn, la.queue_key()), 0, "try_lock never queues");
    // A waiter queues; the holder's hold then vanishes without a release (as if expired):
    // a try_lock by a third party must grant it to the waiter, not take it.
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let lb = &lb;
    thread::scope(|s| {
        let waiter = s.spawn(move || {
            lb.try_lock_for(Duration::from_secs(10)).map(|g| {
                // Held until the third party below has tried: it finds it held, not free.
                let _ = wait_done.recv_timeout(support::EVENT_TIMEOUT);
                g.unlock()
            })
        });
        wait_queued(&mut conn, lb, 1);
        // A third party that has seen the lock held (so its attempts go to the script; a lock
        // object that has not, for a second, first sends a plain SET NX, see docs/fair.md).
        let c = client(&server);
        let third = fair(&c, "fair:try");
        assert!(matches!(third.try_lock(), Err(LockError::Held { .. })));
        let _kept = held.into_lease(); // not released
        raw::del(&mut conn, "fair:try");
        assert!(
            matches!(third.try_lock(), Err(LockError::Held { .. })),
            "a try_lock jumped the queue"
        );
        done.send(()).expect("send");
        let got = waiter.join().expect("waiter");
        assert!(matches!(got, Ok(Ok(true))), "{got:?}");
    });
}

/// The waiter returns on the grant message: no command of its own between the release and
/// the return (its poll floor is made 5 s, so it cannot poll in between).
#[test]
fn a_granted_waiter_returns_without_a_command_and_gets_the_full_lease() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let mut conn = server.conn();
    let holder = fair_fenced(&a, "fair:grant");
    let waiter = b
        .lock("fair:grant")
        .fencing()
        .retry(slow_poll(Duration::from_secs(5)))
        .strategy(Strategy::Fair)
        .build()
        .expect("waiter lock");
    let held = holder.lock().expect("free");
    let first_fence = held.fence().expect("fenced");
    thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = &waiter;
        let w = s.spawn(move || {
            let g = support::send(
                waiter
                    .try_lock_for(Duration::from_secs(20))
                    .expect("granted"),
            );
            let at_return = (g.remaining(), Instant::now());
            tx.send(()).expect("send");
            (g, at_return)
        });
        wait_queued(&mut conn, waiter, 1);
        // Once the waiter listens (its attempt made once subscribed is done), record.
        support::wait_event(&b, Event::Listening, 1);
        let monitor = Monitor::start(&server);
        let released_at = Instant::now();
        assert!(held.unlock().expect("release"));
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the waiter got the lock");
        let handoff = released_at.elapsed();
        let seen = monitor.take();
        // Top-level commands only (script-run ones show as "lua" in MONITOR).
        let sent: Vec<&String> = seen.iter().filter(|l| !l.contains("[0 lua]")).collect();
        // The release, and possibly the watchdog's raise of the grant lease (renew_batch,
        // whose owner tag is "v"); no acquire attempt of the waiter (mode "w").
        assert!(
            sent.iter().all(|l| !l.contains("\"w\"")),
            "the waiter sent an acquire: {sent:#?}"
        );
        let releases = sent
            .iter()
            .filter(|l| l.contains("\"EVALSHA\"") && l.contains("\"fair:grant\""))
            .filter(|l| !l.contains("\"v\""))
            .count();
        assert_eq!(releases, 1, "{sent:#?}");
        assert!(sent.len() <= 2, "{sent:#?}");
        let (guard, (remaining, _)) = w.join().expect("waiter thread");
        assert!(handoff < SECOND, "handoff took {handoff:?}");
        let _ = total_calls;
        assert!(
            remaining <= redis_dlock::FairLock::GRANT_LEASE,
            "a fresh grant reports at most the grant lease, got {remaining:?}"
        );
        assert!(guard.fence().expect("fenced") > first_fence);
        assert_eq!(
            raw::get(&mut conn, "fair:grant").as_deref(),
            Some(guard.value())
        );
        // The watchdog raises the grant lease to the watched lease (30 s) soon after.
        assert!(
            support::wait_until(Duration::from_secs(2), || guard.remaining() > 5 * SECOND),
            "remaining stayed {:?}",
            guard.remaining()
        );
        assert!(raw::pttl(&mut conn, "fair:grant") > 5_000);
        assert!(!guard.is_lost());
        // Time under test: past the grant lease, the raised hold must still be there.
        thread::sleep(redis_dlock::FairLock::GRANT_LEASE);
        assert!(guard.is_held().expect("is_held"), "the grant lapsed");
        assert!(guard.unlock().expect("unlock"));
    });
}

/// The client address of a MONITOR line (`<time> [<db> <addr>] "CMD" ...`).
fn monitor_addr(line: &str) -> &str {
    line.split(['[', ']'])
        .nth(1)
        .and_then(|inside| inside.split_whitespace().nth(1))
        .unwrap_or("")
}

/// A release by a lock object that found the lock held lately (others may be queued) sends a
/// `PING` in front of its script, in the same round trip, so that Redis writes the grant
/// before the release's reply; it still grants after a `SCRIPT FLUSH` (the `EVAL` fallback).
/// An uncontended release sends the script alone (`uncontended_cycle_is_one_command_each_way`).
#[test]
fn a_release_that_may_grant_sends_a_ping_in_front() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let mut conn = server.conn();
    const KEY: &str = "fair:grant-first";
    let mine = fair(&a, KEY);
    let theirs = b
        .lock(KEY)
        .retry(slow_poll(Duration::from_secs(5)))
        .strategy(Strategy::Fair)
        .build()
        .expect("their lock");
    for flush in [false, true] {
        // `mine` waits behind `theirs` (so it has found the lock held), then holds while
        // `theirs` waits.
        let first = theirs.lock().expect("free");
        let held = thread::scope(|s| {
            let w = s.spawn(|| {
                mine.try_lock_for(Duration::from_secs(10))
                    .map(support::send)
            });
            wait_queued(&mut conn, &mine, 1);
            assert!(first.unlock().expect("unlock"));
            w.join().expect("waiter").expect("granted")
        });
        thread::scope(|s| {
            let w = s.spawn(|| {
                theirs
                    .try_lock_for(Duration::from_secs(10))
                    .map(support::send)
            });
            wait_queued(&mut conn, &theirs, 1);
            support::wait_event(&b, Event::Subscribed, 1);
            if flush {
                raw::script_flush(&mut conn);
            }
            let monitor = Monitor::start(&server);
            assert!(held.unlock().expect("release"));
            let granted = w.join().expect("waiter").expect("granted");
            assert_eq!(raw::get(&mut conn, KEY).as_deref(), Some(granted.value()));
            let sent = monitor.sent();
            let release = sent
                .iter()
                // Not the watchdog's raise (owner tag "v") nor an attempt of the waiter (mode
                // "w") that a loaded machine may still have in flight.
                .position(|l| {
                    l.contains("\"EVALSHA\"")
                        && l.contains(KEY)
                        && !l.contains("\"v\"")
                        && !l.contains("\"w\"")
                })
                .unwrap_or_else(|| panic!("no release script: {sent:#?}"));
            let addr = monitor_addr(&sent[release]);
            // The connection's command just before the release (a watchdog renewal may have
            // used the same pooled connection earlier).
            let before = sent[..release]
                .iter()
                .rev()
                .find(|l| monitor_addr(l) == addr);
            assert!(before.is_some_and(|l| l.contains("\"PING\"")), "{sent:#?}");
            if flush {
                // NOSCRIPT, then the script sent whole.
                assert!(
                    sent[release + 1..]
                        .iter()
                        .any(|l| monitor_addr(l) == addr && l.contains("\"EVAL\"")),
                    "{sent:#?}"
                );
            }
            assert!(granted.unlock().expect("unlock"));
        });
    }
    assert!(!raw::exists(&mut conn, KEY));
    assert_eq!(zcard(&mut conn, mine.queue_key()), 0);
}

/// A lock with an explicit ttl: the grant's short lease is raised to the ttl once.
#[test]
fn a_grant_of_a_ttl_lock_is_raised_to_the_ttl() {
    init_logging();
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let mut conn = server.conn();
    let ttl = Duration::from_secs(5);
    let holder: FairLock = a
        .lock("fair:ttl")
        .ttl(ttl)
        .strategy(Strategy::Fair)
        .build()
        .expect("lock")
        .try_into()
        .unwrap();
    let waiter = b
        .lock("fair:ttl")
        .ttl(ttl)
        .strategy(Strategy::Fair)
        .build()
        .expect("lock");
    let held = holder.lock().expect("free");
    thread::scope(|s| {
        let w = s.spawn(|| {
            waiter
                .try_lock_for(Duration::from_secs(10))
                .map(support::send)
        });
        wait_queued(&mut conn, &waiter, 1);
        // Its subscription confirmed: the grant comes by message (a release before that is
        // found by the waiter's next attempt, which sets the ttl itself).
        support::wait_event(&b, Event::Listening, 1);
        held.unlock().expect("release");
        let guard = w.join().expect("thread").expect("granted");
        // The grant comes with its short lease; the watchdog raises it at once, which on a
        // busy machine can be before this thread reads it: the raise is noted (after the
        // lease is raised), so a lease above the grant's is only allowed once it was.
        let granted = guard.remaining();
        let raised = b.test_hooks().count(Event::Renewed) > 0;
        assert!(
            raised || granted <= redis_dlock::FairLock::GRANT_LEASE,
            "granted with {granted:?} before any raise"
        );
        assert!(support::wait_until(Duration::from_secs(2), || guard
            .remaining()
            > 2 * SECOND));
        assert!(guard.remaining() <= ttl);
        let pttl = raw::pttl(&mut conn, "fair:ttl");
        assert!(pttl > 2_000 && pttl <= 5_000, "pttl {pttl}");
        // Raised once, not renewed: it expires after the ttl (the key goes; a renewal would
        // keep it).
        assert!(support::wait_until(ttl + 5 * SECOND, || !raw::exists(
            &mut conn, "fair:ttl"
        )));
        assert!(guard.is_lost());
        assert!(!raw::exists(&mut conn, "fair:ttl"));
    });
}

/// Several clients, several threads each, one key: a non-atomic counter in Redis (GET, pause,
/// SET) and an in-process overlap detector.
#[test]
fn mutual_exclusion_under_contention() {
    init_logging();
    let server = RedisServer::start();
    const CLIENTS: usize = 4;
    const THREADS: usize = 3;
    const ROUNDS: usize = 40;
    let inside = AtomicBool::new(false);
    let overlaps = AtomicUsize::new(0);
    let fences = Mutex::new(Vec::new());
    let clients: Vec<LockClient> = (0..CLIENTS).map(|_| client(&server)).collect();
    thread::scope(|s| {
        for c in &clients {
            let lock = Arc::new(fair_fenced(c, "fair:excl"));
            for _ in 0..THREADS {
                let (lock, inside, overlaps, fences) =
                    (Arc::clone(&lock), &inside, &overlaps, &fences);
                let server = &server;
                s.spawn(move || {
                    let mut conn = server.conn();
                    for _ in 0..ROUNDS {
                        let g = lock.try_lock_for(Duration::from_secs(30)).expect("lock");
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        raw::bump_counter(&mut conn, "fair:excl:counter");
                        fences.lock().unwrap().push(g.fence().expect("fenced"));
                        inside.store(false, Ordering::SeqCst);
                        assert!(g.unlock().expect("unlock"), "lost a hold");
                    }
                });
            }
        }
    });
    let mut conn = server.conn();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(
        raw::get_i64(&mut conn, "fair:excl:counter"),
        (CLIENTS * THREADS * ROUNDS) as i64
    );
    // Fences in the order the sections ran strictly increase.
    let fences = fences.into_inner().unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not increasing"
    );
    assert_eq!(zcard(&mut conn, "dlock_fair_q:{fair:excl}"), 0);
}

/// Locks `key` with `holder`, queues one waiter per client of `clients` (each once the previous
/// one is queued; each holds for 5 ms when granted), runs `meanwhile` while they all wait,
/// releases, and returns the clients in the order they were granted, with their fences.
fn grant_order(
    conn: &mut redis::Connection,
    holder: &FairLock,
    clients: &[LockClient],
    fenced: bool,
    meanwhile: impl FnOnce(&mut redis::Connection),
) -> Vec<(usize, Option<u64>)> {
    let key = holder.key();
    let held = holder.lock().expect("free");
    let order = Mutex::new(Vec::new());
    thread::scope(|s| {
        for (i, c) in clients.iter().enumerate() {
            let order = &order;
            let lock = if fenced {
                fair_fenced(c, key)
            } else {
                fair(c, key)
            };
            s.spawn(move || {
                let g = lock.try_lock_for(Duration::from_secs(30)).expect("lock");
                order.lock().unwrap().push((i, g.fence()));
                g.unlock().expect("unlock");
            });
            wait_queued(conn, holder, i + 1);
        }
        meanwhile(conn);
        held.unlock().expect("release");
    });
    order.into_inner().unwrap()
}

/// Waiters in separate clients, each arriving well after the previous one is queued: grants
/// follow arrival. Each winner records its number while it holds the lock.
#[test]
fn fifo_across_clients() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const N: usize = 6;
    let holder_client = client(&server);
    let holder = fair_fenced(&holder_client, "fair:fifo");
    let clients: Vec<LockClient> = (0..N).map(|_| client(&server)).collect();
    let order = grant_order(&mut conn, &holder, &clients, true, |_| {});
    let who: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        who,
        (0..N).collect::<Vec<_>>(),
        "grants out of arrival order"
    );
    let fences: Vec<u64> = order.iter().map(|(_, f)| f.expect("fenced")).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]));
}

/// A waiter whose retry policy sleeps longer than a queue entry lives (here 5 s against 2 s)
/// still refreshes its entry in time: it keeps its place ahead of a later waiter.
#[test]
fn a_slow_retry_policy_does_not_let_the_queue_entry_lapse() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "fair:slow-policy";
    let holder_client = client(&server);
    let holder = fair(&holder_client, key);
    let held = holder.lock().expect("free");
    let (ca, cb) = (client(&server), client(&server));
    let slow = ca
        .lock(key)
        .strategy(Strategy::Fair)
        .retry(RetryPolicy::standard().fixed_delay(Duration::from_secs(5)))
        .build()
        .expect("lock");
    let later = fair(&cb, key);
    let order = Mutex::new(Vec::new());
    thread::scope(|s| {
        let order = &order;
        let slow = &slow;
        let later = &later;
        s.spawn(move || {
            let g = slow.try_lock_for(Duration::from_secs(30)).expect("slow");
            order.lock().unwrap().push("slow");
            g.unlock().expect("unlock");
        });
        wait_queued(&mut conn, &holder, 1);
        s.spawn(move || {
            let g = later.try_lock_for(Duration::from_secs(30)).expect("later");
            order.lock().unwrap().push("later");
            g.unlock().expect("unlock");
        });
        wait_queued(&mut conn, &holder, 2);
        // Time under test: past the entry's lifetime (2 s); the later waiter's polls drop
        // lapsed entries.
        thread::sleep(ms(3_000));
        assert_eq!(
            zcard(&mut conn, holder.queue_key()),
            2,
            "both waiters still queued"
        );
        held.unlock().expect("release");
    });
    assert_eq!(order.into_inner().unwrap(), ["slow", "later"]);
}

/// The queue's deadlines: (waiter token, when its entry lapses).
fn deadlines(conn: &mut redis::Connection, key: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(format!("dlock_fair_d:{{{key}}}"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .expect("ZRANGE")
}

/// Waiters keep their place while they wait long enough to refresh their queue entries many
/// times (the head polls every 100–120 ms, the others up to every 600 ms): each poll refreshes
/// the entry's deadline but not its arrival, so grants still follow arrival.
#[test]
fn fifo_survives_the_waiters_refreshes() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const N: usize = 4;
    let key = "fair:refresh";
    let holder_client = client(&server);
    let holder = fair(&holder_client, key);
    let clients: Vec<LockClient> = (0..N).map(|_| client(&server)).collect();
    let order = grant_order(&mut conn, &holder, &clients, false, |conn| {
        // Until every waiter has polled (each poll refreshes its entry).
        let first = deadlines(conn, key);
        let refreshed = |later: &[(String, f64)]| {
            first.iter().all(|(token, was)| {
                later
                    .iter()
                    .find(|(t, _)| t == token)
                    .is_some_and(|(_, d)| d > was)
            })
        };
        let mut later = deadlines(conn, key);
        let all = support::wait_until(support::EVENT_TIMEOUT, || {
            later = deadlines(conn, key);
            refreshed(&later)
        });
        assert_eq!(later.len(), N, "every waiter still queued");
        assert!(
            all,
            "an entry was not refreshed while waiting: {first:?} {later:?}"
        );
    });
    let who: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        who,
        (0..N).collect::<Vec<_>>(),
        "grants out of arrival order"
    );
}

// ---------------------------------------------------------------------------------------------
// Worker processes: waiters in other processes

const WORKER_ENV: &str = "DLOCK_FAIR_WORKER";
const WORKER_TEST: &str = "fair_waiter_process";
const GOT_MARKER: &str = "DLOCK-FAIR-GOT";

/// The waiter side: does nothing unless [`WORKER_ENV`] is set. Waits for `DLOCK_KEY`, pushes
/// its `DLOCK_ID` (and fence) to the list `<key>:order` while holding it, reports, holds
/// `DLOCK_HOLD_MS`, releases and exits.
#[test]
fn fair_waiter_process() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    init_logging();
    let url = std::env::var("DLOCK_URL").expect("DLOCK_URL");
    let key = std::env::var("DLOCK_KEY").expect("DLOCK_KEY");
    let id = std::env::var("DLOCK_ID").expect("DLOCK_ID");
    let hold: u64 = std::env::var("DLOCK_HOLD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    // DLOCK_TTL_MS: an explicit ttl (not watched); DLOCK_EXPECT_LOST: the test freezes this
    // process while it holds, so the hold must be found lost at release.
    let ttl: Option<u64> = std::env::var("DLOCK_TTL_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    let expect_lost = std::env::var_os("DLOCK_EXPECT_LOST").is_some();
    let client = LockClient::open(&url).expect("client");
    let lock = match ttl {
        Some(ms) => client
            .lock(&key)
            .fencing()
            .ttl(Duration::from_millis(ms))
            .strategy(Strategy::Fair)
            .build()
            .expect("build fair lock")
            .try_into()
            .unwrap(),
        None => fair_fenced(&client, &key),
    };
    let guard = lock.try_lock_for(Duration::from_secs(60)).expect("lock");
    let mut conn = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("conn");
    let entry = format!("{id}:{}", guard.fence().expect("fenced"));
    let _: () = redis::cmd("RPUSH")
        .arg(format!("{key}:order"))
        .arg(&entry)
        .query(&mut conn)
        .expect("RPUSH");
    worker::report(GOT_MARKER, &entry);
    // The hold lasts past (or within) its ttl, as the caller asks.
    support::work(ms(hold));
    if expect_lost {
        assert!(
            guard.is_lost(),
            "a hold frozen past its ttl is not reported lost"
        );
        assert!(
            !guard.unlock().expect("unlock"),
            "released a hold it had lost"
        );
        return;
    }
    assert!(guard.unlock().expect("unlock"), "lost its hold");
}

fn spawn_waiter(server: &RedisServer, key: &str, id: usize, hold_ms: u64) -> WorkerProcess {
    WorkerProcess::spawn(
        WORKER_TEST,
        &[
            (WORKER_ENV, "1".to_owned()),
            ("DLOCK_URL", server.url()),
            ("DLOCK_KEY", key.to_owned()),
            ("DLOCK_ID", id.to_string()),
            ("DLOCK_HOLD_MS", hold_ms.to_string()),
        ],
    )
}

fn order_list(conn: &mut redis::Connection, key: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(format!("{key}:order"))
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("LRANGE")
}

#[test]
fn fifo_across_processes() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:procs";
    const N: usize = 4;
    let c = client(&server);
    let holder = fair_fenced(&c, KEY);
    let held = holder.lock().expect("free");
    let mut workers = Vec::new();
    for i in 0..N {
        workers.push(spawn_waiter(&server, KEY, i, 5));
        // The next one arrives once this one is queued in Redis (arrivals far apart).
        wait_queued(&mut conn, &holder, i + 1);
    }
    held.unlock().expect("release");
    for w in workers {
        let (status, out, _) = w.finish(Duration::from_secs(30));
        assert!(status.success(), "worker failed: {out}");
    }
    let order = order_list(&mut conn, KEY);
    let ids: Vec<usize> = order
        .iter()
        .map(|e| e.split(':').next().unwrap().parse().unwrap())
        .collect();
    let fences: Vec<u64> = order
        .iter()
        .map(|e| e.split(':').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (0..N).collect::<Vec<_>>(), "grant order {order:?}");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{order:?}");
}

/// A waiter process SIGKILLed while queued, ahead of a live waiter: the live one gets the lock
/// within 1 s of the release (the dead one's grant lapses after the grant lease).
#[test]
fn a_killed_waiter_delays_the_next_by_at_most_a_second() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:killed";
    let c = client(&server);
    let holder = fair_fenced(&c, KEY);
    let held = holder.lock().expect("free");
    let mut dead = spawn_waiter(&server, KEY, 0, 5);
    wait_queued(&mut conn, &holder, 1);
    let live_client = client(&server);
    let live = fair_fenced(&live_client, KEY);
    thread::scope(|s| {
        let w = s.spawn(|| {
            let g = live
                .try_lock_for(Duration::from_secs(30))
                .expect("live waiter");
            (Instant::now(), support::send(g))
        });
        wait_queued(&mut conn, &holder, 2);
        dead.kill();
        let released = Instant::now();
        held.unlock().expect("release");
        let (got_at, g) = w.join().expect("thread");
        let delay = got_at - released;
        eprintln!("live waiter got the lock {delay:?} after the release");
        assert!(
            delay <= SECOND,
            "the dead waiter delayed the line by {delay:?}"
        );
        assert!(g.unlock().expect("unlock"));
    });
    assert!(
        order_list(&mut conn, KEY).is_empty(),
        "the killed waiter ran"
    );
}

/// A queued waiter whose process is frozen (SIGSTOP) while the lock is granted to it: the next
/// waiter gets the lock within 1 s, and when the frozen one resumes, with the stale grant
/// message in its socket, it does not take itself for the holder.
#[test]
fn a_frozen_waiter_neither_stalls_the_line_nor_holds_twice() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:frozen";
    let c = client(&server);
    let holder = fair_fenced(&c, KEY);
    let held = holder.lock().expect("free");
    let frozen = spawn_waiter(&server, KEY, 0, 5);
    wait_queued(&mut conn, &holder, 1);
    let live_client = client(&server);
    let live = fair_fenced(&live_client, KEY);
    let pid = frozen.pid();
    thread::scope(|s| {
        let w = s.spawn(|| {
            support::send(
                live.try_lock_for(Duration::from_secs(30))
                    .expect("live waiter"),
            )
        });
        wait_queued(&mut conn, &holder, 2);
        support::freeze(pid);
        let released = Instant::now();
        held.unlock().expect("release");
        let g = w.join().expect("thread");
        let delay = released.elapsed();
        assert!(
            delay <= SECOND + ms(200),
            "the frozen waiter delayed the line by {delay:?}"
        );
        // Resume the frozen waiter while the live one holds: it must wait its turn.
        signal(pid, "CONT");
        // Something that must not happen is given time to.
        thread::sleep(SECOND);
        assert!(
            order_list(&mut conn, KEY).is_empty(),
            "the resumed waiter ran while held"
        );
        assert!(g.is_held().expect("is_held"));
        assert!(g.unlock().expect("unlock"));
    });
    let (status, out, _) = frozen.finish(Duration::from_secs(30));
    assert!(status.success(), "{out}");
    assert_eq!(order_list(&mut conn, KEY).len(), 1);
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// A waiter frozen (SIGSTOP) right after the lock was granted to it, as a long GC pause would:
/// the line goes on once its hold's ttl has run out (the grant lease, 600 ms, raised to the
/// lock's ttl by its client 200 ms after the grant), the next holder's fence is higher, and the
/// resumed waiter's guard reports the hold lost and its `unlock()` returns `Ok(false)`.
#[test]
fn a_waiter_frozen_after_its_grant_loses_the_hold_and_says_so() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:frozen-grantee";
    const TTL_MS: u64 = 1_000;
    let c = client(&server);
    let holder = fair_fenced(&c, KEY);
    let held = holder.lock().expect("free");
    let mut grantee = WorkerProcess::spawn(
        WORKER_TEST,
        &[
            (WORKER_ENV, "1".to_owned()),
            ("DLOCK_URL", server.url()),
            ("DLOCK_KEY", KEY.to_owned()),
            ("DLOCK_ID", "0".to_owned()),
            ("DLOCK_HOLD_MS", "1500".to_owned()),
            ("DLOCK_TTL_MS", TTL_MS.to_string()),
            ("DLOCK_EXPECT_LOST", "1".to_owned()),
        ],
    );
    wait_queued(&mut conn, &holder, 1);
    let pid = grantee.pid();
    let live_client = client(&server);
    let live = fair_fenced(&live_client, KEY);
    thread::scope(|s| {
        let w = s.spawn(|| {
            support::send(
                live.try_lock_for(Duration::from_secs(30))
                    .expect("live waiter"),
            )
        });
        wait_queued(&mut conn, &holder, 2);
        held.unlock().expect("release");
        let got = grantee
            .wait_marker(GOT_MARKER, Duration::from_secs(10))
            .is_ok();
        assert!(got, "the first waiter was not granted the lock");
        support::freeze(pid);
        let frozen_at = Instant::now();
        let g = w.join().expect("thread");
        let waited = frozen_at.elapsed();
        assert!(
            waited <= ms(TTL_MS + 500),
            "the frozen grantee held up the line for {waited:?}"
        );
        let order = order_list(&mut conn, KEY);
        assert_eq!(order.len(), 1, "{order:?}");
        let stale: u64 = order[0]
            .split(':')
            .nth(1)
            .and_then(|f| f.parse().ok())
            .expect("fence");
        let fence = g.fence().expect("fenced");
        assert!(
            fence > stale,
            "fence {fence} after the frozen grantee's {stale}"
        );
        signal(pid, "CONT");
        let (status, out, _) = grantee.finish(Duration::from_secs(30));
        assert!(status.success(), "{out}");
        assert!(
            g.is_held().expect("is_held"),
            "the resumed grantee took the hold back"
        );
        assert!(g.unlock().expect("unlock"));
    });
}

/// Queues a waiter entry the way `lua/fair_acquire.lua` does for a client that then vanishes
/// (it never refreshes the entry nor comes back for a grant).
/// Waits until every queue entry of the fair lock on `key` has passed its deadline, by the
/// server's clock (the one the scripts judge by).
fn wait_lapsed(conn: &mut redis::Connection, key: &str) {
    let last = deadlines(conn, key)
        .iter()
        .map(|(_, d)| *d)
        .fold(0.0, f64::max);
    assert!(support::wait_until(support::EVENT_TIMEOUT, || {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
        (s * 1000 + us / 1000) as f64 > last
    }));
}

fn enqueue_vanished(conn: &mut redis::Connection, key: &str, token: &str, entry_ttl_ms: u64) {
    let lua = |f: &str| {
        std::fs::read_to_string(format!("{}/lua/{f}", env!("CARGO_MANIFEST_DIR"))).expect("script")
    };
    // The script as the client sends it: its include line replaced by the shared queue walk.
    let script = lua("fair_acquire.lua").replacen(
        "-- #include fair_live_head.lua\n",
        &lua("fair_live_head.lua"),
        1,
    );
    let _: redis::Value = redis::cmd("EVAL")
        .arg(&script)
        .arg(3)
        .arg(key)
        .arg(format!("dlock_fair_q:{{{key}}}"))
        .arg(format!("dlock_fair_d:{{{key}}}"))
        .arg(token)
        .arg(30_000)
        .arg("w")
        .arg(entry_ttl_ms)
        .arg(redis_dlock::FairLock::GRANT_LEASE.as_millis() as u64)
        .arg("dlock_fair_ch:")
        .query(conn)
        .expect("EVAL fair_acquire.lua");
}

/// A queue entry whose client is gone (it joined and never came back): once its deadline
/// (the entry ttl, 2 s) passes it is skipped, and the next grant goes to a live waiter at once.
#[test]
fn an_entry_of_a_vanished_client_lapses() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:vanished";
    let c = client(&server);
    let holder = fair(&c, KEY);
    let held = holder.lock().expect("free");
    enqueue_vanished(&mut conn, KEY, &"f".repeat(32), 2_000);
    assert_eq!(zcard(&mut conn, holder.queue_key()), 1);
    // Until the entry's deadline has passed on the server's clock.
    wait_lapsed(&mut conn, KEY);
    let c2 = client(&server);
    let next = fair(&c2, KEY);
    thread::scope(|s| {
        let w = s.spawn(|| {
            next.try_lock_for(Duration::from_secs(10))
                .map(support::send)
        });
        // Queued: the lapsed entry is dropped by the waiter's own call, or still there.
        assert!(support::wait_until(Duration::from_secs(10), || {
            let n = zcard(&mut conn, next.queue_key());
            let lapsed: Option<f64> = redis::cmd("ZSCORE")
                .arg(next.queue_key())
                .arg("f".repeat(32))
                .query(&mut conn)
                .expect("ZSCORE");
            n == 2 || (n == 1 && lapsed.is_none())
        }));
        let released = Instant::now();
        held.unlock().expect("release");
        let g = w.join().expect("thread").expect("granted");
        // A grant to the lapsed entry would hold the lock for its grant lease (600 ms).
        assert!(
            released.elapsed() < redis_dlock::FairLock::GRANT_LEASE - ms(50),
            "a grant went to the lapsed entry ({:?})",
            released.elapsed()
        );
        g.unlock().expect("unlock");
    });
    assert_eq!(zcard(&mut conn, holder.queue_key()), 0);
}

/// A waiter that gives up leaves the queue: the next grant goes past it at once.
#[test]
fn a_timed_out_waiter_leaves_the_queue() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:timeout";
    let (a, b, c) = (client(&server), client(&server), client(&server));
    let holder = fair(&a, KEY);
    let impatient = fair(&b, KEY);
    let patient = fair(&c, KEY);
    let held = holder.lock().expect("free");
    thread::scope(|s| {
        let t = s.spawn(|| {
            let start = Instant::now();
            let r = impatient.try_lock_for(ms(400));
            (r.map(|g| g.unlock()), start.elapsed())
        });
        wait_queued(&mut conn, &holder, 1);
        let p = s.spawn(|| {
            patient
                .try_lock_for(Duration::from_secs(10))
                .map(support::send)
        });
        wait_queued(&mut conn, &holder, 2);
        let (r, took) = t.join().expect("thread");
        assert!(
            matches!(r, Err(LockError::Timeout { .. })),
            "the impatient waiter: {r:?}"
        );
        assert!(took < ms(400) + SECOND, "gave up after {took:?}");
        assert_eq!(zcard(&mut conn, holder.queue_key()), 1, "it left the queue");
        let released = Instant::now();
        held.unlock().expect("release");
        let g = p.join().expect("thread").expect("patient waiter");
        // A grant to the waiter that gave up would hold the lock for its grant lease (600 ms).
        assert!(
            released.elapsed() < redis_dlock::FairLock::GRANT_LEASE - ms(50),
            "the grant went to the waiter that gave up ({:?})",
            released.elapsed()
        );
        g.unlock().expect("unlock");
    });
}

/// Give-up racing a grant: many short waits against a holder that releases at once. Whatever
/// the interleaving, a grant that reached a waiter as it gave up is passed on (no lock is
/// left behind), and nobody holds twice.
#[test]
fn giving_up_while_granted_passes_the_grant_on() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:race";
    let clients: Vec<LockClient> = (0..3).map(|_| client(&server)).collect();
    let inside = AtomicBool::new(false);
    let overlaps = AtomicUsize::new(0);
    let wins = AtomicU32::new(0);
    let timeouts = AtomicU32::new(0);
    thread::scope(|s| {
        for c in &clients {
            let lock = fair(c, KEY);
            let (inside, overlaps, wins, timeouts) = (&inside, &overlaps, &wins, &timeouts);
            s.spawn(move || {
                let end = Instant::now() + Duration::from_secs(3);
                let mut n = 0u64;
                while Instant::now() < end {
                    n += 1;
                    // Waits of 0–3 ms: most give up, some while a grant is on its way.
                    match lock.try_lock_for(Duration::from_micros(n % 4 * 1000)) {
                        Ok(g) => {
                            if inside.swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            // The window in which an overlap would be seen.
                            support::work(Duration::from_micros(300));
                            inside.store(false, Ordering::SeqCst);
                            wins.fetch_add(1, Ordering::SeqCst);
                            assert!(g.unlock().expect("unlock"));
                        }
                        Err(LockError::Timeout { .. }) => {
                            timeouts.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    eprintln!(
        "wins {}, timeouts {}",
        wins.load(Ordering::SeqCst),
        timeouts.load(Ordering::SeqCst)
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(wins.load(Ordering::SeqCst) > 0 && timeouts.load(Ordering::SeqCst) > 0);
    // Nothing left behind: no hold, no queue entry (a grant given up was passed on or
    // released; one to nobody would lapse within the grant lease).
    assert!(
        support::wait_until(
            redis_dlock::FairLock::GRANT_LEASE + SECOND,
            || !raw::exists(&mut conn, KEY)
        ),
        "a lock was left behind"
    );
    assert!(support::wait_until(
        redis_dlock::FairLock::GRANT_LEASE + SECOND,
        || zcard(&mut conn, "dlock_fair_q:{fair:race}") == 0
    ));
}

/// The server restarts (no persistence) while waiters are queued and a holder holds: every
/// wait ends within its deadline plus the client's timeouts, holds never overlap, and the
/// lock keeps working afterwards. The restart drops every lock by design (docs/deployments.md):
/// a hold granted by the server before it went down may still run when the restarted server
/// grants the next, which the fences tell apart (the restarted server counts from 1 again), and
/// which is counted, not failed. Any other overlap fails.
#[test]
fn server_restart_with_waiters_queued() {
    init_logging();
    let mut server = RedisServer::start();
    const KEY: &str = "fair:restart";
    const WAIT: Duration = Duration::from_secs(2);
    // Timeouts of the client bound an attempt on a dead server.
    let slack = Duration::from_secs(3);
    let clients: Vec<LockClient> = (0..4)
        .map(|_| {
            LockClient::builder(server.url())
                .command_timeout(Some(SECOND))
                .connect_timeout(SECOND)
                .build()
                .expect("client")
        })
        .collect();
    let stop = AtomicBool::new(false);
    // The fence of the hold inside its section (0: none).
    let inside = AtomicU64::new(0);
    let overlaps = AtomicUsize::new(0);
    let dropped_by_restart = AtomicUsize::new(0);
    let late = Mutex::new(Vec::new());
    let wins_after = AtomicU32::new(0);
    let restarted = AtomicBool::new(false);
    thread::scope(|s| {
        for c in &clients {
            let lock = fair_fenced(c, KEY);
            let (stop, inside, overlaps, dropped, late, wins_after, restarted) = (
                &stop,
                &inside,
                &overlaps,
                &dropped_by_restart,
                &late,
                &wins_after,
                &restarted,
            );
            s.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let start = Instant::now();
                    let r = lock.try_lock_for(WAIT);
                    let took = start.elapsed();
                    if took > WAIT + slack {
                        late.lock().unwrap().push(took);
                    }
                    match r {
                        Ok(g) => {
                            let fence = g.fence().expect("a fenced lock");
                            match inside.swap(fence, Ordering::SeqCst) {
                                0 => {}
                                // Granted by the server before its restart: dropped by it.
                                before if fence < before => {
                                    dropped.fetch_add(1, Ordering::SeqCst);
                                }
                                _ => {
                                    overlaps.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            // Held a while: the restart must find holders and waiters.
                            support::work(ms(30));
                            let _ = inside.compare_exchange(
                                fence,
                                0,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            );
                            if restarted.load(Ordering::SeqCst) {
                                wins_after.fetch_add(1, Ordering::SeqCst);
                            }
                            let _ = g.unlock();
                        }
                        // A pause after a failure, as an application would make.
                        Err(_) => support::work(ms(20)),
                    }
                }
            });
        }
        let mut conn = server.conn();
        assert!(
            support::wait_until(support::EVENT_TIMEOUT, || zcard(
                &mut conn,
                "dlock_fair_q:{fair:restart}"
            ) > 0),
            "nobody queued"
        );
        drop(conn);
        server.restart();
        restarted.store(true, Ordering::SeqCst);
        // The run after the restart lasts a while: its length is the test's load.
        support::work(Duration::from_secs(4));
        stop.store(true, Ordering::SeqCst);
    });
    eprintln!(
        "restart: {} holds of the old server still in their section when the restarted one \
         granted the next",
        dropped_by_restart.load(Ordering::SeqCst)
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(
        late.lock().unwrap().is_empty(),
        "waits past their deadline: {:?}",
        late.lock().unwrap()
    );
    assert!(
        wins_after.load(Ordering::SeqCst) > 0,
        "no progress after the restart"
    );
}

/// One client, Token locks on some keys and fair locks on others, all contended: the one
/// subscriber connection carries both kinds of messages, and every counter is exact.
#[test]
fn mixed_with_token_locks_on_other_keys() {
    init_logging();
    let server = RedisServer::start();
    let clients: Vec<LockClient> = (0..3).map(|_| client(&server)).collect();
    const ROUNDS: usize = 25;
    let keys = ["mix:token:a", "mix:token:b", "mix:fair:a", "mix:fair:b"];
    thread::scope(|s| {
        for c in &clients {
            for key in keys {
                let server = &server;
                s.spawn(move || {
                    let strategy = if key.contains("fair") {
                        Strategy::Fair
                    } else {
                        Strategy::Token
                    };
                    let lock = c.lock(key).strategy(strategy).build().expect("lock");
                    let mut conn = server.conn();
                    for _ in 0..ROUNDS {
                        let g = lock.try_lock_for(Duration::from_secs(30)).expect("lock");
                        raw::bump_counter(&mut conn, &format!("{key}:n"));
                        assert!(g.unlock().expect("unlock"));
                    }
                });
            }
        }
    });
    let mut conn = server.conn();
    for key in keys {
        assert_eq!(
            raw::get_i64(&mut conn, &format!("{key}:n")),
            (clients.len() * ROUNDS) as i64,
            "{key}"
        );
    }
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut conn)
        .expect("CLIENT LIST");
    let subscribers = list
        .lines()
        .filter(|l| l.contains("name=dlock-subscriber"))
        .count();
    assert!(
        subscribers <= clients.len(),
        "{subscribers} subscriber connections"
    );
}

/// A fair-lock waiter reads its client's subscriber connection itself while it waits (the
/// reader thread lends it). A Token waiter of the same client that starts waiting meanwhile
/// needs its channel subscribed and its release heard: the connection is taken back for the
/// `SUBSCRIBE`, and the release wakes the Token waiter long before its 5 s poll would.
#[test]
fn a_token_waiter_beside_a_waiting_fair_waiter_is_woken_by_the_release() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    // A 10 s command timeout: the subscriber's keepalive (which also takes a lent connection
    // back) is then far beyond this test's bound.
    let other = client(&server);
    let shared = LockClient::builder(server.url().as_str())
        .command_timeout(Some(Duration::from_secs(10)))
        .build()
        .expect("client");
    let fair_holder = fair(&other, "lend:fair");
    let token_holder = other.lock("lend:token").build().expect("token lock");
    let fair_waiter = fair(&shared, "lend:fair");
    let token_waiter = shared
        .lock("lend:token")
        .retry(
            RetryPolicy::standard()
                .fixed_delay(Duration::from_secs(5))
                .jitter(false),
        )
        .build()
        .expect("token lock");
    let held_fair = fair_holder.lock().expect("free");
    let held_token = token_holder.lock().expect("free");
    thread::scope(|s| {
        let f = s.spawn(|| {
            support::send(
                fair_waiter
                    .try_lock_for(Duration::from_secs(30))
                    .expect("fair waiter"),
            )
        });
        wait_queued(&mut conn, &fair_holder, 1);
        // The fair waiter now reads the subscriber connection (lent after its subscription).
        support::wait_listening(&shared, 1, 2);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = s.spawn(move || {
            let g = token_waiter
                .try_lock_for(Duration::from_secs(30))
                .expect("token waiter");
            tx.send(Instant::now()).expect("send");
            assert!(g.unlock().expect("unlock"));
        });
        // Its first attempt is refused at once; then its subscription is confirmed.
        support::wait_listening(&shared, 2, 4);
        let released = Instant::now();
        assert!(held_token.unlock().expect("release"));
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the token waiter got the lock");
        let waited = got - released;
        assert!(
            waited < SECOND,
            "the token waiter was woken after {waited:?} (its poll is 5 s): the release was not heard"
        );
        t.join().expect("token waiter thread");
        assert!(held_fair.unlock().expect("release"));
        let g = f.join().expect("fair waiter thread");
        assert!(g.unlock().expect("unlock"));
    });
}

/// 1,000 waiting threads (20 clients x 50) on one key: only each client's head waits in
/// Redis, so the queue holds at most 20 entries; commands stay within three per section (two
/// round trips) plus the polls; and 1,000 entries of vanished waiters lapse and are dropped in bounded steps.
#[test]
fn a_thousand_waiters_stay_bounded() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:thousand";
    const CLIENTS: usize = 20;
    const PER_CLIENT: usize = 50;
    let clients: Vec<LockClient> = (0..CLIENTS).map(|_| client(&server)).collect();
    let holder_client = client(&server);
    let holder = fair(&holder_client, KEY);
    let held = holder.lock().expect("free");
    // 1,000 entries of waiters that vanished at once (their tokens never come back); they
    // lapse after 1 s, while the real waiters wait behind them.
    for i in 0..1000 {
        enqueue_vanished(&mut conn, KEY, &format!("{i:032x}"), 1_000);
    }
    assert_eq!(zcard(&mut conn, holder.queue_key()), 1000);
    let mem_full: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(holder.queue_key())
        .query(&mut conn)
        .expect("MEMORY USAGE");
    let max_queue = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let before = total_calls(&mut conn);
    let started = Instant::now();
    thread::scope(|s| {
        for c in &clients {
            let lock = Arc::new(fair(c, KEY));
            for _ in 0..PER_CLIENT {
                let (lock, done) = (Arc::clone(&lock), &done);
                s.spawn(move || {
                    let g = lock.try_lock_for(Duration::from_secs(120)).expect("lock");
                    assert!(g.unlock().expect("unlock"));
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        }
        // The real waiters queue behind the vanished ones, which then lapse.
        for c in &clients {
            support::wait_event(c, Event::Queued, 1);
        }
        wait_lapsed(&mut conn, KEY);
        held.unlock().expect("release");
        let mut probe = server.conn();
        let all_done = support::wait_until(Duration::from_secs(120), || {
            let n = zcard(&mut probe, holder.queue_key());
            max_queue.fetch_max(n, Ordering::SeqCst);
            done.load(Ordering::SeqCst) == CLIENTS * PER_CLIENT
        });
        assert!(all_done, "not every waiter got the lock");
    });
    let took = started.elapsed();
    let calls = total_calls(&mut conn) - before;
    let sections = (CLIENTS * PER_CLIENT) as i64;
    // Per section: an acquire, and a release with the PING sent in front of it (two round
    // trips); beside them the first two waiters in the queue poll at most 10 times a second
    // and the others at most twice; plus the INFO.
    let queue = max_queue.load(Ordering::SeqCst) as i64;
    let bound = 3 * sections + (2 * 10 + queue * 2) * (took.as_secs() as i64 + 1) + 1;
    eprintln!(
        "1000 sections in {took:?}: {calls} commands (bound {bound}), queue at most {}, \
         {mem_full} bytes for 1000 entries",
        max_queue.load(Ordering::SeqCst)
    );
    assert!(
        max_queue.load(Ordering::SeqCst) <= CLIENTS,
        "queue grew past one entry per client"
    );
    assert!(
        calls <= bound,
        "{calls} commands for {sections} sections in {took:?}"
    );
    assert_eq!(zcard(&mut conn, holder.queue_key()), 0);
    assert!(!raw::exists(&mut conn, "dlock_fair_d:{fair:thousand}"));
}

/// Two fair waiters of one client on two keys share its subscriber connection: one reads it,
/// the other sleeps until woken. A grant read by the one for the other is handed over and
/// wakes it, long before its 10 s poll. Both release orders are run, so that in one of them
/// the first grant goes to the waiter that was not reading.
#[test]
fn a_grant_read_by_another_waiter_of_the_client_wakes_its_recipient() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let holders = client(&server);
    let waiters = LockClient::builder(server.url().as_str())
        .command_timeout(Some(Duration::from_secs(10)))
        .build()
        .expect("client");
    let slow = |key: &str| {
        waiters
            .lock(key)
            .retry(slow_poll(Duration::from_secs(10)))
            .strategy(Strategy::Fair)
            .build()
            .expect("fair lock")
    };
    for (first, second) in [("cross:a", "cross:b"), ("cross:b", "cross:a")] {
        let (ha, hb) = (fair(&holders, "cross:a"), fair(&holders, "cross:b"));
        let (wa, wb) = (slow("cross:a"), slow("cross:b"));
        let mut held = vec![
            ("cross:a", ha.lock().expect("free")),
            ("cross:b", hb.lock().expect("free")),
        ];
        thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            for (key, lock) in [("cross:a", &wa), ("cross:b", &wb)] {
                let tx = tx.clone();
                s.spawn(move || {
                    let g = lock.try_lock_for(Duration::from_secs(30)).expect("waiter");
                    tx.send((key, Instant::now())).expect("send");
                    assert!(g.unlock().expect("unlock"));
                });
            }
            wait_queued(&mut conn, &ha, 1);
            wait_queued(&mut conn, &hb, 1);
            // Both waiting, their client's grant channel subscribed: one reads the connection,
            // the other sleeps.
            support::wait_event(&waiters, Event::Subscribed, 1);
            for key in [first, second] {
                let i = held.iter().position(|(k, _)| *k == key).expect("held");
                let (_, guard) = held.swap_remove(i);
                let released = Instant::now();
                assert!(guard.unlock().expect("release"));
                let (got, at) = rx.recv_timeout(Duration::from_secs(20)).expect("granted");
                assert_eq!(got, key);
                let took = at.duration_since(released);
                assert!(
                    took < Duration::from_secs(2),
                    "{key} granted {took:?} after its release (the poll is 10 s)"
                );
            }
        });
    }
}

/// Waiters that die before their first refresh leave entries that only the refreshes, the
/// queue walk of a release and the joins behind a long queue drop. With the lock held all along
/// and nobody refreshing, the joins behind 16 or more entries keep such a crowd bounded: each
/// drops up to 10 lapsed entries. (The joins are sent as the client sends them, each with a
/// new token, so that each is exactly one first call.)
#[test]
fn joins_behind_a_long_queue_drop_lapsed_entries() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    const KEY: &str = "fair:crowd";
    let holder_client = client(&server);
    let holder = fair(&holder_client, KEY);
    let held = holder.lock().expect("free");
    for i in 0..100 {
        enqueue_vanished(&mut conn, KEY, &format!("{i:032x}"), 300);
    }
    assert_eq!(zcard(&mut conn, holder.queue_key()), 100);
    // Until the entries' 300 ms lifetime has passed on the server's clock.
    wait_lapsed(&mut conn, KEY);
    let live = |i: usize| format!("live{i:028x}");
    enqueue_vanished(&mut conn, KEY, &live(0), 60_000);
    assert_eq!(zcard(&mut conn, holder.queue_key()), 91);
    for i in 1..10 {
        enqueue_vanished(&mut conn, KEY, &live(i), 60_000);
    }
    // The tenth join still had 19 ahead (10 lapsed, 9 live): every lapsed entry is gone.
    let mut queued: Vec<String> = redis::cmd("ZRANGE")
        .arg(holder.queue_key())
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("ZRANGE");
    queued.sort();
    assert_eq!(queued, (0..10).map(live).collect::<Vec<_>>());
    assert!(held.unlock().expect("release"));
}

#[cfg(feature = "cluster")]
/// A Redis Cluster: the queue, deadlines and fence keys share the lock key's slot, and a
/// grant works across clients.
#[test]
fn works_in_a_cluster_slot() {
    init_logging();
    let cluster = Cluster::start(3);
    let mk = || {
        LockClient::cluster_builder(&cluster.urls())
            .build()
            .expect("cluster client")
    };
    let (a, b) = (mk(), mk());
    for key in ["fair:cl:{tag}", "fair:cl:plain"] {
        let holder = fair_fenced(&a, key);
        let waiter = fair_fenced(&b, key);
        let held = holder.lock().expect("free");
        let mut conn = cluster.conn_for_key(key);
        thread::scope(|s| {
            let w = s.spawn(|| {
                waiter
                    .try_lock_for(Duration::from_secs(10))
                    .map(support::send)
            });
            wait_queued(&mut conn, &holder, 1);
            let released = Instant::now();
            let fence = held.fence().unwrap();
            held.unlock().expect("release");
            let g = w.join().expect("thread").expect("granted");
            assert!(released.elapsed() < SECOND);
            assert!(g.fence().unwrap() > fence);
            assert_eq!(raw::get(&mut conn, key).as_deref(), Some(g.value()));
            g.unlock().expect("unlock");
        });
        assert_eq!(
            cluster.keyslot(holder.queue_key()),
            cluster.keyslot(key),
            "{key}"
        );
    }
}

/// A grant whose lease cannot be raised (the server freezes right after the grant) is
/// reported lost by the local clock within the grant lease, and the watchdog's late answer
/// keeps it lost: `is_lost` is honest about the short grant lease.
#[test]
fn a_grant_that_cannot_be_raised_is_reported_lost() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let build = |c: &LockClient| {
        c.lock("fair:lost")
            .on_lost(|_| {})
            .strategy(Strategy::Fair)
            .build()
            .expect("lock")
    };
    let (a, b) = (client(&server), client(&server));
    let (holder, waiter) = (build(&a), build(&b));
    let held = holder.lock().expect("free");
    thread::scope(|s| {
        let w = s.spawn(|| {
            waiter
                .try_lock_for(Duration::from_secs(10))
                .map(support::send)
        });
        wait_queued(&mut conn, &waiter, 1);
        support::wait_event(&b, Event::Listening, 1);
        held.unlock().expect("release");
        let guard = w.join().expect("thread").expect("granted");
        // Freeze the server before the watchdog raises the grant lease (a third of it after
        // the grant, 200 ms).
        server.pause();
        // Lost only if the test was slow: within the loss margin of the grant's end.
        assert!(
            !guard.is_lost()
                || guard.remaining() <= redis_dlock::FairLock::GRANT_LEASE / 100 + ms(2)
        );
        assert!(guard.remaining() <= redis_dlock::FairLock::GRANT_LEASE);
        assert!(
            support::wait_until(redis_dlock::FairLock::GRANT_LEASE + ms(200), || guard
                .is_lost()),
            "still not lost after the grant lease, remaining {:?}",
            guard.remaining()
        );
        // Lost a margin before the grant's end (the loss deadline): the server is resumed
        // only once the grant has run out there too, so that the renewal it holds back finds
        // the key gone (resumed earlier, the renewal would give the key a full lease, though
        // its holder was told the hold is lost).
        assert!(support::wait_until(
            redis_dlock::FairLock::GRANT_LEASE,
            || guard.remaining().is_zero()
        ));
        support::work(redis_dlock::FairLock::GRANT_LEASE / 10);
        server.resume();
        // Its key expired in Redis meanwhile: the check agrees, and it stays lost.
        assert!(support::wait_until(
            support::EVENT_TIMEOUT,
            || !raw::exists(&mut conn, "fair:lost")
        ));
        assert!(guard.is_lost());
        assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
        assert!(
            !guard.unlock().expect("unlock"),
            "released a lock it no longer held"
        );
    });
}

/// Threads of one client: the head of the client's line, waiting behind a thread of the same
/// client that holds the lock, sends nothing. The holder's release queues it (behind the
/// waiters of other clients, who keep their turn) or, with nobody else waiting, grants it the
/// lock, in the release's one script; its grant then comes as any grant does.
#[test]
fn the_holders_release_queues_the_next_thread_of_its_client() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (a, b) = (client(&server), client(&server));
    let slow = |c: &LockClient| {
        c.lock("fair:sibling")
            .fencing()
            .retry(slow_poll(Duration::from_secs(10)))
            .strategy(Strategy::Fair)
            .build()
            .expect("fair lock")
    };
    for other_waits in [true, false] {
        let first = slow(&b);
        let (t1, t2, w) = (slow(&a), slow(&a), slow(&b));
        let queued = a.test_hooks().count(Event::Queued);
        let (a_listening, b_listening) = (
            a.test_hooks().count(Event::Listening),
            b.test_hooks().count(Event::Listening),
        );
        let held = first.lock().expect("free");
        let first_fence = held.fence().expect("fenced");
        let order = Mutex::new(Vec::new());
        // Unlocks done: the recording is read once all were sent.
        let unlocked = AtomicUsize::new(0);
        let sent = thread::scope(|s| {
            let (go, wait_go) = std::sync::mpsc::channel::<()>();
            let (took, t1_took) = std::sync::mpsc::channel::<()>();
            let (order, unlocked) = (&order, &unlocked);
            let t1 = &t1;
            s.spawn(move || {
                let g = t1.try_lock_for(Duration::from_secs(30)).expect("t1");
                order.lock().unwrap().push(("t1", g.fence()));
                took.send(()).expect("send");
                wait_go.recv().expect("go");
                assert!(g.unlock().expect("t1 unlock"));
                unlocked.fetch_add(1, Ordering::SeqCst);
            });
            wait_queued(&mut conn, &first, 1);
            let t2 = &t2;
            s.spawn(move || {
                let g = t2.try_lock_for(Duration::from_secs(30)).expect("t2");
                order.lock().unwrap().push(("t2", g.fence()));
                assert!(g.unlock().expect("t2 unlock"));
                unlocked.fetch_add(1, Ordering::SeqCst);
            });
            // t2 waits in its client's line, behind t1: one entry in Redis all along.
            support::wait_event(&a, Event::Queued, queued + 2);
            assert_eq!(
                zcard(&mut conn, &FairLock::queue_key_for(first.key()).unwrap()),
                1
            );
            // t1 listens: its grant comes by message, and its client's channel stays
            // confirmed for t2.
            support::wait_event(&a, Event::Listening, a_listening + 1);
            assert!(held.unlock().expect("release"));
            t1_took
                .recv_timeout(Duration::from_secs(5))
                .expect("t1 granted");
            if other_waits {
                let w = &w;
                s.spawn(move || {
                    let g = w.try_lock_for(Duration::from_secs(30)).expect("w");
                    order.lock().unwrap().push(("w", g.fence()));
                    assert!(g.unlock().expect("w unlock"));
                    unlocked.fetch_add(1, Ordering::SeqCst);
                });
                wait_queued(&mut conn, &first, 1);
                // w listens: its attempts are all made before the recording starts. (Not a
                // count of refusals: a fenced lock makes no plain try, and a waiter polls at
                // its backoff until its subscription is confirmed, so the count of attempts
                // before it listens varies; a wait for one too many lasts until its first
                // poll, 10 s on, and t2's own poll, as far off, may come first.)
                support::wait_event(&b, Event::Listening, b_listening + 1);
            }
            // t2 now heads its line and has offered its token; t1 holds. Nothing of t2 is in
            // Redis, and it listens: it sends nothing until its poll (10 s).
            support::wait_event(&a, Event::Queued, queued + 3);
            support::wait_event(&a, Event::Listening, a_listening + 2);
            assert_eq!(
                zcard(&mut conn, &FairLock::queue_key_for(first.key()).unwrap()),
                usize::from(other_waits)
            );
            let monitor = Monitor::start(&server);
            go.send(()).expect("go");
            assert!(
                support::wait_until(Duration::from_secs(5), || unlocked.load(Ordering::SeqCst)
                    == 2 + usize::from(other_waits)),
                "not granted in turn: {:?}",
                order.lock().unwrap()
            );
            monitor.sent()
        });
        let order = order.into_inner().unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| *n).collect();
        if other_waits {
            assert_eq!(names, ["t1", "w", "t2"]);
        } else {
            assert_eq!(names, ["t1", "t2"]);
        }
        let fences: Vec<u64> = order.iter().map(|(_, f)| f.expect("fenced")).collect();
        assert!(
            fences.windows(2).all(|p| p[0] < p[1]) && fences[0] > first_fence,
            "{fences:?}"
        );
        // Only releases (and the watchdog's raises of grant leases, owner tag "v"): no acquire
        // (mode "w" or "t") and no SET NX from anyone after t1 began its release.
        assert!(
            sent.iter()
                .all(|l| !l.contains("\"w\"") && !l.contains("\"t\"") && !l.contains("\"NX\"")),
            "{sent:#?}"
        );
        let releases = sent
            .iter()
            .filter(|l| l.contains("\"EVALSHA\"") && !l.contains("\"v\""))
            .count();
        assert_eq!(releases, 2 + usize::from(other_waits), "{sent:#?}");
        assert_eq!(
            zcard(&mut conn, &FairLock::queue_key_for(first.key()).unwrap()),
            0
        );
        assert_eq!(raw::get(&mut conn, "fair:sibling"), None);
    }
}

/// Brings `t2` (a thread of client `a`) to offer its token behind `t1` (also of `a`), which
/// holds the lock: `other` (of another client) holds first, `t1` queues, `t2` waits in its
/// client's line, and `other`'s release grants the lock to `t1`. Runs `then` with `t1`'s
/// guard while `t2` runs `t2_wait` in its own thread; returns what `t2_wait` returned.
fn with_t2_offered<R: Send>(
    conn: &mut redis::Connection,
    a: &LockClient,
    other: &FairLock,
    t1: &FairLock,
    t2_wait: impl FnOnce() -> R + Send,
    then: impl FnOnce(&mut redis::Connection, redis_dlock::LockGuard<'_, redis_dlock::GuardSend>),
) -> R {
    let held = other.lock().expect("free");
    let queued = a.test_hooks().count(Event::Queued);
    thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let t1_thread = s.spawn(move || {
            let g = t1.try_lock_for(Duration::from_secs(30)).expect("t1");
            tx.send(()).expect("send");
            support::send(g)
        });
        wait_queued(conn, other, 1);
        let t2 = s.spawn(t2_wait);
        // t2 waits in its client's line, behind t1.
        support::wait_event(a, Event::Queued, queued + 2);
        assert!(held.unlock().expect("release"));
        rx.recv_timeout(Duration::from_secs(5)).expect("t1 granted");
        let g = t1_thread.join().expect("t1 thread");
        // t2 heads its line now and has offered its token: nothing of it is in Redis.
        support::wait_event(a, Event::Queued, queued + 3);
        then(conn, g);
        t2.join().expect("t2 thread")
    })
}

/// The hold of the thread ahead is lost before its release (deleted here): its release finds
/// the lock not ours and queues nobody, and the offering thread takes the lock at its next
/// poll (100–120 ms), not later.
#[test]
fn an_offering_thread_behind_a_lost_hold_takes_the_lock_at_its_poll() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (a, b) = (client(&server), client(&server));
    let key = "fair:offer-lost";
    let (other, t1, t2) = (fair(&b, key), fair(&a, key), fair(&a, key));
    let mut released = None;
    let (guard_value, got_at) = with_t2_offered(
        &mut conn,
        &a,
        &other,
        &t1,
        || {
            let g = t2.try_lock_for(Duration::from_secs(10)).expect("t2");
            let at = Instant::now();
            let v = g.value().to_vec();
            assert!(g.unlock().expect("t2 unlock"));
            (v, at)
        },
        |conn, g| {
            assert_eq!(zcard(conn, other.queue_key()), 0);
            let _: () = redis::cmd("DEL").arg(key).query(conn).expect("DEL");
            released = Some(Instant::now());
            assert!(!g.unlock().expect("t1 unlock"), "the hold was lost");
        },
    );
    let took = got_at.duration_since(released.expect("released"));
    assert!(
        took < SECOND,
        "t2 took the lock {took:?} after the lost release"
    );
    assert!(!guard_value.is_empty());
    assert_eq!(zcard(&mut conn, other.queue_key()), 0);
    assert_eq!(raw::get(&mut conn, key), None);
}

/// A thread that gives up while its offer is still open (before its first poll) leaves
/// nothing behind: the holder's release queues nobody and grants nothing, the key is deleted,
/// and the next newcomer takes the lock at once.
#[test]
fn an_offering_thread_that_gives_up_leaves_nothing_behind() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (a, b, c) = (client(&server), client(&server), client(&server));
    let key = "fair:offer-give-up";
    let (other, t1) = (fair(&b, key), fair(&a, key));
    let t2 = a
        .lock(key)
        .retry(slow_poll(Duration::from_secs(10)))
        .strategy(Strategy::Fair)
        .build()
        .expect("t2 lock");
    let r = with_t2_offered(
        &mut conn,
        &a,
        &other,
        &t1,
        || {
            let start = Instant::now();
            let r = t2.try_lock_for(ms(400)).map(|g| g.unlock());
            (r, start.elapsed())
        },
        |conn, g| {
            assert_eq!(zcard(conn, other.queue_key()), 0);
            // Time under test: past t2's deadline; its poll (10 s) never came.
            thread::sleep(ms(500));
            assert!(g.unlock().expect("t1 unlock"));
        },
    );
    let (r, took) = r;
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    assert!(took < SECOND, "gave up after {took:?}");
    assert_eq!(zcard(&mut conn, other.queue_key()), 0);
    assert_eq!(
        raw::get(&mut conn, key),
        None,
        "granted to the thread that gave up"
    );
    let newcomer = fair(&c, key);
    let g = newcomer.try_lock().expect("free at once");
    assert!(g.unlock().expect("unlock"));
}

/// An offering thread sends nothing before its poll, also when it cannot listen (its client
/// may not SUBSCRIBE here, so its waiters poll): not at its retry policy's backoff, which
/// withdrew the offer and queued it in Redis a few milliseconds after it offered, while a
/// thread of its client held the lock. The holder's release grants it the lock.
#[test]
fn an_offering_thread_that_cannot_listen_waits_for_the_holders_release() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nosub",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-subscribe",
            "-psubscribe",
            "-ssubscribe",
        ])
        .query(&mut conn)
        .expect("ACL SETUSER");
    let a =
        LockClient::open(format!("redis://nosub:pw@127.0.0.1:{}/", server.port())).expect("client");
    let b = client(&server);
    let key = "fair:offer-no-pubsub";
    let slow = || -> FairLock {
        a.lock(key)
            .retry(slow_poll(Duration::from_secs(10)))
            .strategy(Strategy::Fair)
            .build()
            .expect("lock")
            .try_into()
            .expect("fair")
    };
    let (other, t1, t2) = (fair(&b, key), slow(), slow());
    let mut released = None;
    let got_at = with_t2_offered(
        &mut conn,
        &a,
        &other,
        &t1,
        || {
            let g = t2.try_lock_for(Duration::from_secs(20)).expect("t2");
            let at = Instant::now();
            assert!(g.unlock().expect("t2 unlock"));
            at
        },
        |conn, g| {
            let refusals = a.stats().refusals;
            // Time under test: t2's backoff (4 ms, then 8 ms, ...) passes several times over;
            // its poll (10 s) does not come.
            let polled = support::wait_until(ms(300), || a.stats().refusals > refusals);
            assert!(!polled, "t2 polled while its offer stood");
            assert_eq!(zcard(conn, other.queue_key()), 0);
            released = Some(Instant::now());
            assert!(g.unlock().expect("t1 unlock"));
        },
    );
    let took = got_at.duration_since(released.expect("released"));
    assert!(took < SECOND, "t2 took the lock {took:?} after the release");
    assert_eq!(zcard(&mut conn, other.queue_key()), 0);
    assert_eq!(raw::get(&mut conn, key), None);
}

/// A hold released after its lifetime passed by the local clock is reported lost
/// (`Ok(false)`), even while its key still lives in Redis (made to outlive it here): the
/// section overran. The key is deleted all the same.
#[test]
fn a_hold_released_after_its_lifetime_is_reported_lost() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let key = "fair:overran";
    let lock = c
        .lock(key)
        .strategy(Strategy::Fair)
        .ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    let guard = lock.try_lock().unwrap();
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(30_000)
        .query(&mut conn)
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(10), || guard.is_expired()));
    assert_eq!(raw::get(&mut conn, key).as_deref(), Some(guard.value()));
    assert!(!guard.unlock().unwrap(), "its section overran");
    assert!(!raw::exists(&mut conn, key), "deleted");
}
