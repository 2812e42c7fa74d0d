//! The distributed read-write lock ([`ReadWriteLock`]) against real `redis-server` processes:
//!
//! - many readers at once, a writer excluding readers and writers, checked in the hash itself;
//! - re-entry per owner (also past a writer waiting in this client's line), owner-only release
//!   (the seed's shared `read` field bug), downgrade, and the refused upgrade;
//! - 8 reader + 2 writer threads hammering one lock with a probe: zero violations;
//! - deaths: a reader process and a writer process SIGKILLed while holding, a writer process
//!   SIGKILLed while waiting (its intent must not keep readers out for long), per-owner expiry
//!   while other owners renew, and the key disappearing with its last entry;
//! - a writer not starved by a continuous stream of overlapping readers;
//! - wrong types, foreign hashes and bad input;
//! - a short run on a local 3-master Redis Cluster.
//!
//! Dead holders are this test binary re-run as a child process ([`rw_holder_process`]), which
//! takes the lock, prints a marker line with its owner id and blocks reading its stdin until
//! the parent kills it.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rand::RngExt;
use redis_dlock::test_hooks::Event;
use redis_dlock::{DistributedLock, LockClient, LockError, ReadWriteLock, RetryPolicy, MAX_TTL};
use support::worker::{self, WorkerProcess};
#[cfg(feature = "cluster")]
use support::Cluster;
use support::{init_logging, raw, wait_event, wait_until, RedisServer};

// ---------------------------------------------------------------------------------------------
// Helpers

fn client(server: &RedisServer) -> LockClient {
    LockClient::builder(server.url())
        .pool_size(8)
        .build()
        .expect("client")
}

fn rw(client: &LockClient, key: &str, ttl: Duration) -> ReadWriteLock {
    client
        .rw_lock(key)
        .ttl(ttl)
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(20))))
        .build()
        .expect("read-write lock")
}

/// The lock's hash, field by field.
fn hash(conn: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(conn).expect("HGETALL")
}

/// The fields of the hash in Redisson's layout: `"r:"` the readers' `<owner>` fields, `"w:"`
/// the writers' `<owner>:write` fields.
fn fields_with(h: &BTreeMap<String, String>, kind: &str) -> Vec<String> {
    h.keys()
        .filter(|f| *f != "mode")
        .filter(|f| f.ends_with(":write") == (kind == "w:"))
        .cloned()
        .collect()
}

/// A hold count (the value of an `<owner>` or `<owner>:write` field).
fn count(h: &BTreeMap<String, String>, field: &str) -> Option<u64> {
    h.get(field).map(|v| v.parse().expect("count"))
}

/// The owners with a live writer intent (the library's sorted set beside the hash).
fn intents(conn: &mut redis::Connection, key: &str) -> Vec<String> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    redis::cmd("ZRANGEBYSCORE")
        .arg(format!("dlock_rwlock_writers:{{{key}}}"))
        .arg(now_ms)
        .arg("+inf")
        .query(conn)
        .expect("ZRANGEBYSCORE")
}

fn owner_of(lease_value: &[u8]) -> String {
    String::from_utf8(lease_value.to_vec()).expect("owner ids are ASCII")
}

#[track_caller]
fn assert_held<T: std::fmt::Debug>(r: Result<T, LockError>) {
    match r {
        Err(LockError::Held { .. }) => {}
        other => panic!("expected Held, got {other:?}"),
    }
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(r: Result<T, LockError>, mentions: &str) {
    match r {
        Err(LockError::Config { reason, .. } | LockError::Unsupported { reason, .. }) => {
            assert!(reason.contains(mentions), "{reason:?} vs {mentions:?}")
        }
        other => panic!("expected Config or Unsupported ({mentions}), got {other:?}"),
    }
}

/// Detects a reader overlapping a writer or two writers overlapping: readers add 1, a writer
/// adds a big negative sentinel.
#[derive(Default)]
struct Probe {
    state: AtomicIsize,
    violations: AtomicUsize,
    max_readers: AtomicIsize,
    reads: AtomicUsize,
    writes: AtomicUsize,
}

const WRITER: isize = -1_000_000;

impl Probe {
    fn enter_read(&self) {
        let prev = self.state.fetch_add(1, Ordering::SeqCst);
        if prev < 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        } else {
            self.max_readers.fetch_max(prev + 1, Ordering::SeqCst);
        }
    }

    fn leave_read(&self) {
        if self.state.fetch_sub(1, Ordering::SeqCst) < 1 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.reads.fetch_add(1, Ordering::SeqCst);
    }

    fn enter_write(&self) {
        if self.state.fetch_add(WRITER, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave_write(&self) {
        if self.state.fetch_sub(WRITER, Ordering::SeqCst) != WRITER {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
    }
}

/// `readers` reader threads and `writers` writer threads, on `locks[i % locks.len()]`, until
/// `holds` holds in all or `limit` has passed. Returns the longest a writer waited.
fn hammer(
    locks: &[ReadWriteLock],
    readers: usize,
    writers: usize,
    probe: &Arc<Probe>,
    holds: usize,
    limit: Duration,
) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let longest_write_wait = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for i in 0..readers + writers {
        let lock = locks[i % locks.len()].clone();
        let (probe, stop, longest) = (
            Arc::clone(probe),
            Arc::clone(&stop),
            Arc::clone(&longest_write_wait),
        );
        let writer = i >= readers;
        threads.push(thread::spawn(move || {
            let mut rng = rand::rng();
            while !stop.load(Ordering::SeqCst) {
                if writer {
                    let asked = Instant::now();
                    let guard = lock.write_lock().lock().expect("write lock");
                    longest.fetch_max(asked.elapsed().as_micros() as u64, Ordering::SeqCst);
                    probe.enter_write();
                    // Random holds and pauses: the load under which exclusion is checked.
                    support::work(Duration::from_micros(rng.random_range(100..600)));
                    probe.leave_write();
                    assert!(guard.unlock().expect("write unlock"), "write hold lost");
                    support::work(Duration::from_micros(rng.random_range(1000..6000)));
                } else {
                    let guard = lock.read_lock().lock().expect("read lock");
                    probe.enter_read();
                    support::work(Duration::from_micros(rng.random_range(100..1500)));
                    probe.leave_read();
                    assert!(guard.unlock().expect("read unlock"), "read hold lost");
                    support::work(Duration::from_micros(rng.random_range(0..500)));
                }
            }
        }));
    }
    wait_until(limit, || {
        probe.reads.load(Ordering::SeqCst) + probe.writes.load(Ordering::SeqCst) >= holds
    });
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("hammer thread");
    }
    Duration::from_micros(longest_write_wait.load(Ordering::SeqCst))
}

// ---------------------------------------------------------------------------------------------
// Dead holders: this binary re-run as a child process

const WORKER_ENV: &str = "DLOCK_RW_WORKER";
const WORKER_TEST: &str = "rw_holder_process";
const MARKER: &str = "DLOCK-RW-MARK";

/// The child side: does nothing unless [`WORKER_ENV`] is set (`read`, `write`: take that hold
/// and report it; `wait-write`: report, then block in a write `lock()`), so it passes at once
/// in a normal run.
#[test]
fn rw_holder_process() {
    let Some(mode) = std::env::var_os(WORKER_ENV) else {
        return;
    };
    init_logging();
    let url = std::env::var("DLOCK_URL").expect("DLOCK_URL");
    let key = std::env::var("DLOCK_KEY").expect("DLOCK_KEY");
    let ttl_ms: u64 = std::env::var("DLOCK_TTL_MS").unwrap().parse().unwrap();
    let client = LockClient::open(&url).unwrap();
    let rw = rw(&client, &key, Duration::from_millis(ttl_ms));
    let report = |what: &str| worker::report(MARKER, what);
    match mode.to_str().unwrap() {
        "read" => report(&owner_of(
            rw.read_lock().try_lock().unwrap().into_lease().value(),
        )),
        "write" => report(&owner_of(
            rw.write_lock().try_lock().unwrap().into_lease().value(),
        )),
        "wait-write" => {
            report(&rw.owner_id());
            let _ = rw.write_lock().lock();
        }
        other => panic!("unknown worker mode {other}"),
    }
    worker::hold_until_killed()
}

/// Runs [`rw_holder_process`] as a child process in `mode` on the lock `key` at `url`.
fn spawn_holder(url: &str, key: &str, mode: &str, ttl: Duration) -> WorkerProcess {
    WorkerProcess::spawn(
        WORKER_TEST,
        &[
            (WORKER_ENV, mode.to_owned()),
            ("DLOCK_URL", url.to_owned()),
            ("DLOCK_KEY", key.to_owned()),
            ("DLOCK_TTL_MS", ttl.as_millis().to_string()),
        ],
    )
}

/// Waits for the child's marker line; returns the owner id it carries.
fn wait_marker(child: &mut WorkerProcess) -> String {
    child
        .wait_marker(MARKER, Duration::from_secs(20))
        .unwrap_or_else(|e| {
            panic!(
                "no marker from the child ({e:?}); output:\n{:?}",
                child.seen()
            )
        })
}

/// SIGKILL, then reap.
fn kill_holder(child: &mut WorkerProcess) {
    let status = child.kill();
    assert!(!status.success(), "the child exited on its own: {status}");
}

// ---------------------------------------------------------------------------------------------
// Sharing and exclusion

#[test]
fn many_readers_hold_at_once_and_a_writer_excludes_everyone() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:share";
    let c = client(&server);
    let shared = Arc::new(rw(&c, key, Duration::from_secs(10)));
    const READERS: usize = 6;
    let all_in = Arc::new(Barrier::new(READERS + 1));
    let go = Arc::new(Barrier::new(READERS + 1));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (rw, all_in, go) = (Arc::clone(&shared), Arc::clone(&all_in), Arc::clone(&go));
            thread::spawn(move || {
                let guard = rw.read_lock().lock().expect("read lock");
                all_in.wait();
                go.wait();
                assert!(guard.unlock().expect("unlock"), "read hold lost");
            })
        })
        .collect();
    all_in.wait();
    let h = hash(&mut conn, key);
    assert_eq!(h.get("mode").map(String::as_str), Some("read"), "{h:?}");
    let entries = fields_with(&h, "r:");
    assert_eq!(entries.len(), READERS, "one entry per reader thread: {h:?}");
    assert!(entries.iter().all(|f| count(&h, f) == Some(1)), "{h:?}");
    assert!(
        raw::pttl(&mut conn, key) > 5_000,
        "the key expires with the holds"
    );

    // A writer (other client) is refused, and a bounded wait times out and withdraws its
    // intent.
    let other = client(&server);
    let writer = rw(&other, key, Duration::from_secs(10));
    assert_held(writer.write_lock().try_lock());
    match writer.write_lock().try_lock_for(Duration::from_millis(150)) {
        Err(LockError::Timeout { attempts, .. }) => assert!(attempts >= 2),
        other => panic!("expected Timeout, got {other:?}"),
    }
    let h = hash(&mut conn, key);
    assert!(
        intents(&mut conn, key).is_empty(),
        "intent withdrawn: {h:?}"
    );
    // One more reader still gets in (a third client: the writer's client is the writer's
    // owner on this thread).
    let extra = rw(&client(&server), key, Duration::from_secs(10));
    let extra_guard = extra.read_lock().try_lock().expect("another reader");
    go.wait();
    for t in readers {
        t.join().expect("reader");
    }
    assert!(extra_guard.unlock().unwrap());
    assert!(
        !raw::exists(&mut conn, key),
        "the last release deletes the key"
    );

    // A writer excludes readers and writers.
    let wguard = writer.write_lock().lock().expect("write lock");
    let h = hash(&mut conn, key);
    assert_eq!(h.get("mode").map(String::as_str), Some("write"), "{h:?}");
    assert_eq!(
        fields_with(&h, "w:"),
        vec![format!("{}:write", owner_of(wguard.value()))]
    );
    assert!(fields_with(&h, "r:").is_empty());
    assert_held(shared.read_lock().try_lock());
    assert_held(extra.write_lock().try_lock());
    assert!(matches!(
        shared.read_lock().try_lock_for(Duration::from_millis(150)),
        Err(LockError::Timeout { .. })
    ));
    // Readers blocked behind the writer, all of one client, get in together once it leaves.
    let queued = c.test_hooks().count(Event::Queued);
    let blocked: Vec<_> = (0..3)
        .map(|_| {
            let rw = Arc::clone(&shared);
            thread::spawn(move || {
                let g = rw.read_lock().lock().expect("read after writer");
                let at = Instant::now();
                // Held long enough that the three holds overlap.
                support::work(Duration::from_millis(300));
                assert!(g.unlock().unwrap());
                at
            })
        })
        .collect();
    // All three wait (refused, in the client's line).
    wait_event(&c, Event::Queued, queued + 3);
    let released = Instant::now();
    assert!(wguard.unlock().expect("write unlock"));
    let got: Vec<Instant> = blocked.into_iter().map(|t| t.join().unwrap()).collect();
    let spread = got
        .iter()
        .max()
        .unwrap()
        .duration_since(*got.iter().min().unwrap());
    eprintln!(
        "rwlock/share: 3 blocked readers in after {:?}, spread {spread:?}",
        got.iter().max().unwrap().duration_since(released)
    );
    assert!(spread < Duration::from_millis(300), "readers overlapped");
    assert!(!raw::exists(&mut conn, key));
}

// ---------------------------------------------------------------------------------------------
// Re-entry, owner-only release, downgrade, upgrade

#[test]
fn reads_and_writes_are_reentrant_per_owner() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:reentrant";
    let c = client(&server);
    let lock = Arc::new(rw(&c, key, Duration::from_secs(10)));
    let owner = lock.owner_id();
    let rfield = owner.clone();
    let wfield = format!("{owner}:write");
    let stranger = rw(&client(&server), key, Duration::from_secs(10));

    // Reads.
    let r1 = lock.read_lock().try_lock().expect("first read");
    assert_eq!(owner_of(r1.value()), owner);
    let r2 = lock.read_lock().lock().expect("second read");
    assert_eq!(count(&hash(&mut conn, key), &rfield), Some(2));
    assert!(r1.unlock().unwrap());
    assert_eq!(count(&hash(&mut conn, key), &rfield), Some(1));
    assert_held(stranger.write_lock().try_lock());
    assert!(r2.is_held().unwrap());
    assert!(r2.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));

    // Writes, also while another thread of the same handle waits in this client's line for
    // write: the holder must not queue behind a writer that waits for it.
    let w1 = lock.write_lock().lock().expect("first write");
    let w2 = lock.write_lock().try_lock().expect("second write");
    let waiter = {
        let lock = Arc::clone(&lock);
        thread::spawn(move || {
            let g = lock.write_lock().lock().expect("waiting writer");
            let other = owner_of(g.value());
            assert!(g.unlock().unwrap());
            other
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), || !intents(&mut conn, key)
            .is_empty()),
        "the waiting writer leaves an intent"
    );
    let t = Instant::now();
    let w3 = lock
        .write_lock()
        .lock()
        .expect("third write, past the line");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(count(&hash(&mut conn, key), &wfield), Some(3));
    // Re-entrant read while other writers wait (the writer may always take read).
    let r = lock.read_lock().lock().expect("read while writing");
    for g in [w1, w2, w3, r] {
        assert!(g.unlock().unwrap());
    }
    let other = waiter.join().unwrap();
    assert_ne!(other, owner, "threads of one handle are distinct owners");
    assert!(!raw::exists(&mut conn, key));

    // Re-entrant read while a writer waits: refused to newcomers, granted to holders.
    let r1 = lock.read_lock().lock().unwrap();
    let writer = {
        let stranger = stranger.clone();
        thread::spawn(move || {
            let g = stranger.write_lock().lock().expect("writer after readers");
            assert!(g.unlock().unwrap());
        })
    };
    assert!(wait_until(Duration::from_secs(5), || !intents(
        &mut conn, key
    )
    .is_empty()));
    // Another client: through `c`, this thread is the reader `lock` is.
    let fresh = rw(&client(&server), key, Duration::from_secs(10));
    assert_held(fresh.read_lock().try_lock());
    let r2 = lock
        .read_lock()
        .try_lock()
        .expect("re-entry past the intent");
    assert_eq!(count(&hash(&mut conn, key), &rfield), Some(2));
    assert!(r1.unlock().unwrap() && r2.unlock().unwrap());
    writer.join().unwrap();
    assert!(!raw::exists(&mut conn, key));
}

#[test]
fn only_the_owner_releases_its_hold() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:owner";
    let c = client(&server);
    // Two clients: two handles of one client are one owner on this thread.
    let a = rw(&c, key, Duration::from_secs(10));
    let b = rw(&client(&server), key, Duration::from_secs(10));
    let ga = a.read_lock().lock().unwrap();
    let gb = b.read_lock().lock().unwrap();
    let lease_a = ga.lease().clone();
    let lease_b = gb.into_lease();
    let before = hash(&mut conn, key);
    assert_eq!(fields_with(&before, "r:").len(), 2, "{before:?}");

    // A lease of another lock (a Token lock's random token) releases nothing here.
    let token = c.lock("rw:owner:token").build().unwrap();
    let foreign = token.try_lock().unwrap().into_lease();
    assert!(!b.read_lock().release(&foreign).unwrap());
    assert!(!b.write_lock().release(&foreign).unwrap());
    // A's read lease through the write side: A holds no write.
    assert!(!a.write_lock().release(&lease_a).unwrap());
    assert!(!a.write_lock().is_held(&lease_a).unwrap());
    assert_eq!(hash(&mut conn, key), before, "nothing changed");

    // B releases its own hold, once; the second release (a stale lease) changes nothing:
    // A's entry is exactly as it was (the seed's single `read` field lost it here).
    assert!(b.read_lock().release(&lease_b).unwrap());
    let after = hash(&mut conn, key);
    assert!(!b.read_lock().release(&lease_b).unwrap());
    assert_eq!(hash(&mut conn, key), after);
    let a_field = owner_of(lease_a.value());
    assert_eq!(after.get(&a_field), before.get(&a_field));
    assert_eq!(fields_with(&after, "r:"), vec![a_field]);
    let mut stale = lease_b.clone();
    assert!(matches!(
        b.read_lock().extend(&mut stale, Duration::from_secs(5)),
        Err(LockError::Lost { .. })
    ));
    assert!(!b.read_lock().is_held(&lease_b).unwrap());
    assert_eq!(hash(&mut conn, key), after);
    assert!(ga.is_held().unwrap());
    assert!(ga.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
}

/// Handles of one key built on one client are one owner on a thread (`<client>:<thread>`, as
/// Redisson's): the second handle re-enters instead of waiting for the first until it gives up,
/// and an upgrade through it is refused at once. Other threads are still other owners.
#[test]
fn two_handles_of_one_client_are_one_owner_on_a_thread() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:two-handles";
    let c = client(&server);
    let (a, b) = (
        rw(&c, key, Duration::from_secs(10)),
        rw(&c, key, Duration::from_secs(10)),
    );
    assert_eq!(a.owner_id(), b.owner_id());
    assert_eq!(a.instance_id(), c.instance_id());
    let w1 = a.write_lock().try_lock().expect("write through a");
    let w2 = b
        .write_lock()
        .try_lock_for(Duration::from_secs(5))
        .expect("write through b: a re-entry, not a wait");
    let wfield = format!("{}:write", a.owner_id());
    assert_eq!(count(&hash(&mut conn, key), &wfield), Some(2));
    let r = b.read_lock().try_lock().expect("the writer may read");
    // Another thread through the same handle is another owner, refused.
    thread::scope(|s| {
        s.spawn(|| assert_held(a.write_lock().try_lock()));
        s.spawn(|| assert_held(b.read_lock().try_lock()));
    });
    // While another thread waits for write in this client's line, a blocking write through
    // the other handle re-enters at once: the holder never waits behind a writer that waits
    // for it (which would last until the policy gave up).
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let g = a.write_lock().lock().expect("the waiting writer, after us");
            assert!(g.unlock().unwrap());
        });
        assert!(
            wait_until(Duration::from_secs(10), || !intents(&mut conn, key)
                .is_empty()),
            "the waiting writer leaves an intent"
        );
        let w3 = b.write_lock().lock().expect("a re-entry past the line");
        assert_eq!(count(&hash(&mut conn, key), &wfield), Some(3));
        for g in [w1, w2, w3, r] {
            assert!(g.unlock().unwrap());
        }
        waiter.join().expect("waiter");
    });
    assert!(!raw::exists(&mut conn, key));

    // A read through one handle, a write through the other: an upgrade, refused at once.
    let r = a.read_lock().try_lock().unwrap();
    let t = Instant::now();
    assert!(matches!(
        b.write_lock().try_lock_for(Duration::from_secs(20)),
        Err(LockError::Unsupported { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(20), "did not wait it out");
    assert!(r.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
}

/// A hold belongs to its thread: its guard stays there (`into_send` gives it back), and the
/// thread's lease says so. (That it cannot be sent is the `compile_fail` doctest on
/// `LockGuard`.)
#[test]
fn a_guard_of_a_hold_stays_with_its_thread() {
    use redis_dlock::ArcLockExt;
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:thread-owned";
    let c = client(&server);
    let lock = rw(&c, key, Duration::from_secs(10));
    for write in [true, false] {
        let side: &dyn DistributedLock = if write {
            lock.write_lock()
        } else {
            lock.read_lock()
        };
        let g = side.try_lock().unwrap();
        assert!(g.lease().is_thread_owned());
        let g = g.into_send().expect_err("a thread's hold");
        assert!(g.is_held().unwrap(), "given back still holding");
        assert!(g.unlock().unwrap());
    }
    let owned = Arc::new(lock.write_lock().clone()).lock_arc().unwrap();
    let owned = owned.into_send().expect_err("a thread's hold");
    assert!(owned.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
}

/// A hold released after its own lifetime passed is reported lost (`Ok(false)`), even though
/// the owner's later hold kept the hash alive and the release gave one hold back.
#[test]
fn a_hold_released_after_its_lifetime_is_reported_lost() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:overran";
    let c = client(&server);
    let lock = rw(&c, key, Duration::from_millis(300));
    let wfield = format!("{}:write", lock.owner_id());
    let first = lock.write_lock().try_lock().unwrap();
    let mut second = lock.write_lock().try_lock().unwrap();
    second.extend(Duration::from_secs(30)).unwrap();
    assert!(wait_until(Duration::from_secs(10), || first.is_expired()));
    assert!(matches!(first.check(), Err(LockError::Lost { .. })));
    assert!(!first.unlock().unwrap(), "its section overran");
    assert_eq!(count(&hash(&mut conn, key), &wfield), Some(1), "given back");
    assert!(second.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
}

#[test]
fn the_writer_downgrades_and_readers_cannot_upgrade() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:downgrade";
    let c = client(&server);
    let lock = rw(&c, key, Duration::from_secs(10));
    let other = rw(&client(&server), key, Duration::from_secs(10));
    let owner = lock.owner_id();

    let w = lock.write_lock().lock().unwrap();
    let r = lock.read_lock().try_lock().expect("the writer takes read");
    let h = hash(&mut conn, key);
    assert_eq!(h.get("mode").map(String::as_str), Some("write"));
    assert_eq!(count(&h, &format!("{owner}:write")), Some(1));
    assert_eq!(count(&h, &owner), Some(1));
    assert_held(other.read_lock().try_lock());
    assert!(w.unlock().unwrap());
    let h = hash(&mut conn, key);
    assert_eq!(h.get("mode").map(String::as_str), Some("read"), "{h:?}");
    assert_eq!(
        h.keys().cloned().collect::<Vec<_>>(),
        vec![owner.clone(), "mode".to_owned()]
    );
    // Now a plain reader: others read along, writers wait.
    let r2 = other
        .read_lock()
        .try_lock()
        .expect("readers after the downgrade");
    let third = rw(&client(&server), key, Duration::from_secs(10));
    assert_held(third.write_lock().try_lock());
    assert!(r2.unlock().unwrap());

    // No upgrade: refused at once, nothing left behind, with either call.
    assert_invalid(lock.write_lock().try_lock(), "upgrade");
    let t = Instant::now();
    assert_invalid(lock.write_lock().lock(), "upgrade");
    assert_invalid(
        lock.write_lock().try_lock_for(Duration::from_secs(5)),
        "upgrade",
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    let h = hash(&mut conn, key);
    assert!(fields_with(&h, "w:").is_empty() && intents(&mut conn, key).is_empty());
    assert!(r.unlock().unwrap());
    // Having released its read, the same thread may write.
    let w = lock
        .write_lock()
        .try_lock()
        .expect("write after the read is gone");
    assert!(w.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
}

// ---------------------------------------------------------------------------------------------
// Concurrency

#[test]
fn eight_readers_and_two_writers_never_overlap() {
    init_logging();
    let server = RedisServer::start();
    let key = "rw:hammer";
    // Two clients, each shared by 4 readers and 1 writer (mixed lines in one process), plus
    // one lock handle per client: owners differ by thread.
    let locks: Vec<ReadWriteLock> = (0..2)
        .map(|_| rw(&client(&server), key, Duration::from_secs(5)))
        .collect();
    let probe = Arc::new(Probe::default());
    let start = Instant::now();
    let longest = hammer(&locks, 8, 2, &probe, 3_000, Duration::from_secs(12));
    let (reads, writes) = (
        probe.reads.load(Ordering::SeqCst),
        probe.writes.load(Ordering::SeqCst),
    );
    eprintln!(
        "rwlock/hammer: {reads} reads + {writes} writes in {:?}, up to {} readers at once, \
         longest writer wait {longest:?}, {} violations",
        start.elapsed(),
        probe.max_readers.load(Ordering::SeqCst),
        probe.violations.load(Ordering::SeqCst)
    );
    assert_eq!(probe.violations.load(Ordering::SeqCst), 0);
    assert!(reads + writes >= 1_000, "too few holds: {reads} + {writes}");
    assert!(writes >= 20, "writers starved: {writes} writes");
    assert!(reads >= 50, "readers starved: {reads} reads");
    assert!(
        probe.max_readers.load(Ordering::SeqCst) >= 2,
        "readers shared"
    );
    assert!(!raw::exists(&mut server.conn(), key));
}

#[test]
fn a_writer_is_not_starved_by_overlapping_readers() {
    init_logging();
    let server = RedisServer::start();
    let key = "rw:starve";
    let run = |intent: Option<Duration>, wait: Duration| -> (Result<Duration, LockError>, isize) {
        let probe = Arc::new(Probe::default());
        let stop = Arc::new(AtomicBool::new(false));
        // 4 readers, each with its own client, holding 30 ms, staggered so holds overlap.
        let readers: Vec<_> = (0..4)
            .map(|i| {
                let c = client(&server);
                let lock = rw(&c, key, Duration::from_secs(5));
                let (probe, stop) = (Arc::clone(&probe), Arc::clone(&stop));
                thread::spawn(move || {
                    // Staggered starts and 30 ms holds: the overlapping reads are the load.
                    support::work(Duration::from_millis(8 * i));
                    while !stop.load(Ordering::SeqCst) {
                        let g = lock.read_lock().lock().expect("reader");
                        probe.enter_read();
                        support::work(Duration::from_millis(30));
                        probe.leave_read();
                        assert!(g.unlock().unwrap());
                    }
                })
            })
            .collect();
        // Every reader has held once: their holds overlap from now on.
        assert!(wait_until(support::EVENT_TIMEOUT, || probe
            .reads
            .load(Ordering::SeqCst)
            >= 4));
        let c = client(&server);
        let mut b = c.rw_lock(key).ttl(Duration::from_secs(5));
        if let Some(intent) = intent {
            b = b.writer_intent(intent);
        }
        let writer = b.build().unwrap();
        let asked = Instant::now();
        let got = writer.write_lock().try_lock_for(wait).map(|g| {
            let waited = asked.elapsed();
            probe.enter_write();
            probe.leave_write();
            assert!(g.unlock().unwrap());
            waited
        });
        stop.store(true, Ordering::SeqCst);
        for t in readers {
            t.join().unwrap();
        }
        assert_eq!(probe.violations.load(Ordering::SeqCst), 0);
        (got, probe.max_readers.load(Ordering::SeqCst))
    };
    let (got, overlap) = run(None, Duration::from_secs(15));
    let waited = got.expect("the writer gets in despite the reader stream");
    eprintln!("rwlock/starve: with writer preference the writer waited {waited:?} ({overlap} readers at once)");
    assert!(overlap >= 2, "the readers overlapped");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // For the record (no assertion: timing): the same stream without writer preference.
    let (got, _) = run(Some(Duration::ZERO), Duration::from_secs(2));
    eprintln!("rwlock/starve: without writer preference (intent 0): {got:?}");
}

// ---------------------------------------------------------------------------------------------
// Deaths and expiry

#[test]
fn a_killed_reader_expires_while_another_reader_renews() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:dead-reader";
    let ttl = Duration::from_secs(1);
    let mut child = spawn_holder(&server.url(), key, "read", ttl);
    let dead = wait_marker(&mut child);
    let marked = Instant::now();
    let c = client(&server);
    let live = rw(&c, key, ttl);
    let mut guard = live.read_lock().lock().expect("a second reader");
    kill_holder(&mut child);
    // Redisson's layout: the count in field <owner>, each hold's lifetime in its own key.
    let dead_hold = format!("{{{key}}}:{dead}:rwlock_timeout:1");
    let live_field = owner_of(guard.value());
    let live_hold = format!("{{{key}}}:{live_field}:rwlock_timeout:1");
    assert!(hash(&mut conn, key).contains_key(&dead));
    assert!(raw::exists(&mut conn, &dead_hold));

    // A writer waits meanwhile.
    let writer = rw(&client(&server), key, ttl);
    let (tx, rx) = mpsc::channel();
    let wt = thread::spawn(move || {
        let g = writer
            .write_lock()
            .try_lock_for(Duration::from_secs(15))
            .expect("the writer gets in");
        tx.send(Instant::now()).unwrap();
        assert!(g.unlock().unwrap());
    });

    // The live reader renews every 200 ms for 2.5 ttl; the dead one's hold goes by its own
    // lifetime, although the key is kept alive.
    let mut gone_at = None;
    while marked.elapsed() < ttl * 5 / 2 {
        guard.extend(ttl).expect("the live reader renews");
        let h = hash(&mut conn, key);
        assert!(h.contains_key(&live_field), "{h:?}");
        assert!(raw::exists(&mut conn, &live_hold));
        if gone_at.is_none() && !raw::exists(&mut conn, &dead_hold) {
            gone_at = Some(marked.elapsed());
        }
        assert!(
            rx.try_recv().is_err(),
            "the writer got in past a live reader"
        );
        // Time under test: the live reader renews every 200 ms while the dead one's lifetime
        // runs out.
        thread::sleep(Duration::from_millis(200));
    }
    let gone_at = gone_at.expect("the dead reader's hold expired");
    eprintln!(
        "rwlock/dead-reader: dead reader's hold gone {gone_at:?} after its marker (ttl {ttl:?})"
    );
    assert!(gone_at <= ttl + Duration::from_secs(1), "{gone_at:?}");
    // As in Redisson, the dead reader's count stays in the hash until the last live reader
    // leaves; the release then finds no live hold and deletes the key.
    assert_eq!(
        fields_with(&hash(&mut conn, key), "r:").len(),
        2,
        "dead count kept beside the live one"
    );
    let released = Instant::now();
    assert!(guard.unlock().unwrap());
    let got = rx.recv_timeout(Duration::from_secs(5)).expect("writer in");
    eprintln!(
        "rwlock/dead-reader: writer in {:?} after the live reader left",
        got.duration_since(released)
    );
    assert!(got >= released);
    wt.join().unwrap();
}

#[test]
fn a_killed_writer_expires_and_readers_get_in() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:dead-writer";
    let ttl = Duration::from_secs(1);
    let spawned = Instant::now();
    let mut child = spawn_holder(&server.url(), key, "write", ttl);
    let dead = wait_marker(&mut child);
    let marked = Instant::now();
    kill_holder(&mut child);
    let h = hash(&mut conn, key);
    assert_eq!(h.get("mode").map(String::as_str), Some("write"));
    assert!(h.contains_key(&format!("{dead}:write")), "{h:?}");
    let c = client(&server);
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let lock = rw(&c, key, Duration::from_secs(5));
            thread::spawn(move || {
                let g = lock
                    .read_lock()
                    .try_lock_for(Duration::from_secs(10))
                    .expect("readers after the dead writer");
                let at = Instant::now();
                // Held long enough that the three holds overlap.
                support::work(Duration::from_millis(100));
                assert!(g.unlock().unwrap());
                at
            })
        })
        .collect();
    let got: Vec<Instant> = readers.into_iter().map(|t| t.join().unwrap()).collect();
    let first = *got.iter().min().unwrap();
    eprintln!(
        "rwlock/dead-writer: readers in {:?} after the marker (ttl {ttl:?})",
        first.duration_since(marked)
    );
    assert!(first.duration_since(spawned) >= ttl - Duration::from_millis(50));
    assert!(first.duration_since(marked) <= ttl + Duration::from_secs(2));
    assert!(!raw::exists(&mut conn, key));
}

#[test]
fn a_writer_killed_while_waiting_keeps_readers_out_only_briefly() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:dead-waiter";
    let c = client(&server);
    let holder = rw(&c, key, Duration::from_secs(10));
    let intent = holder.writer_intent();
    assert_eq!(
        intent,
        Duration::from_millis(128),
        "default with the standard policy"
    );
    let held = holder.read_lock().lock().unwrap();
    let mut child = spawn_holder(&server.url(), key, "wait-write", Duration::from_secs(10));
    let waiter = wait_marker(&mut child);
    assert!(
        wait_until(Duration::from_secs(10), || intents(&mut conn, key)
            .contains(&waiter)),
        "the waiting writer's intent"
    );
    assert!(
        !hash(&mut conn, key).values().any(|v| v.len() > 9),
        "no timestamp in Redisson's hash"
    );
    // Writer preference: while it waits, newcomers are refused.
    let newcomer = rw(&client(&server), key, Duration::from_secs(10));
    assert_held(newcomer.read_lock().try_lock());
    kill_holder(&mut child);
    let killed = Instant::now();
    let g = newcomer
        .read_lock()
        .try_lock_for(Duration::from_secs(10))
        .expect("readers get in once the dead writer's intent expires");
    let after = killed.elapsed();
    eprintln!("rwlock/dead-waiter: a new reader got in {after:?} after the waiting writer was killed (intent {intent:?})");
    assert!(after <= intent + Duration::from_secs(2), "{after:?}");
    assert!(!intents(&mut conn, key).contains(&waiter));
    assert!(g.unlock().unwrap() && held.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
}

#[test]
fn each_hold_expires_by_itself_and_the_key_with_the_last() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:expiry";
    let c = client(&server);
    // Two owners: two clients (handles of one client are one owner on this thread).
    let short = rw(&c, key, Duration::from_millis(400));
    let long = rw(&client(&server), key, Duration::from_secs(3));

    // An in-process dead writer (its lease is dropped without release) blocks readers for its
    // lifetime only.
    let t = Instant::now();
    let leaked = short.write_lock().try_lock().unwrap().into_lease();
    let g = long
        .read_lock()
        .try_lock_for(Duration::from_secs(5))
        .expect("reader after the leaked writer");
    assert!(
        t.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );
    assert!(!short.write_lock().is_held(&leaked).unwrap());
    assert!(g.unlock().unwrap());

    // The key expires with its latest entry: a leaked short reader and a long one.
    let leaked = short.read_lock().try_lock().unwrap().into_lease();
    let mut lg = long.read_lock().try_lock().unwrap();
    assert!(raw::pttl(&mut conn, key) > 2_000);
    assert!(short.read_lock().is_held(&leaked).unwrap());
    lg.extend(Duration::from_secs(3)).unwrap();
    assert!(lg.unlock().unwrap());
    let left = raw::pttl(&mut conn, key);
    assert!(
        (1..=400).contains(&left),
        "PTTL follows the short entry: {left}"
    );
    // Nothing runs now: Redis alone removes the abandoned lock.
    assert!(
        wait_until(Duration::from_secs(2), || !raw::exists(&mut conn, key)),
        "the abandoned key disappears"
    );
    assert!(!short.read_lock().is_held(&leaked).unwrap());
    assert!(!short.read_lock().release(&leaked).unwrap());
}

#[test]
fn guards_check_extend_and_report_loss() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:guard";
    let c = client(&server);
    let lock = c.rw_lock(key).build().unwrap();
    // Without an explicit ttl, holds are watched with the watchdog's lease.
    assert_eq!(lock.ttl(), redis_dlock::LockBuilder::DEFAULT_WATCHDOG_LEASE);
    assert!(lock.is_watched());
    assert_eq!(lock.key(), key);
    assert_eq!(
        lock.instance_id().len(),
        36,
        "a UUID, like a Redisson client's id"
    );
    assert!(lock
        .owner_id()
        .starts_with(&format!("{}:", lock.instance_id())));
    let as_dyn: &dyn DistributedLock = lock.write_lock();
    let mut g = as_dyn.try_lock().unwrap();
    g.check().unwrap();
    let before: i64 = raw::pttl(&mut conn, key);
    g.extend(Duration::from_secs(60)).unwrap();
    assert!(raw::pttl(&mut conn, key) > before.max(50_000));
    // Extend never shortens.
    g.extend(Duration::from_secs(1)).unwrap();
    assert!(raw::pttl(&mut conn, key) > 50_000);
    let _: () = redis::cmd("DEL").arg(key).query(&mut conn).unwrap();
    assert!(!g.is_held().unwrap());
    assert!(matches!(g.check(), Err(LockError::Lost { .. })));
    assert!(matches!(
        g.extend(Duration::from_secs(1)),
        Err(LockError::Lost { .. })
    ));
    assert!(!g.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));

    // For the record (no assertion): uncontended cycles, next to a Token lock's.
    const CYCLES: u32 = 300;
    let t = Instant::now();
    for _ in 0..CYCLES {
        assert!(lock.read_lock().try_lock().unwrap().unlock().unwrap());
    }
    let read = t.elapsed() / CYCLES;
    let t = Instant::now();
    for _ in 0..CYCLES {
        assert!(lock.write_lock().try_lock().unwrap().unlock().unwrap());
    }
    let write = t.elapsed() / CYCLES;
    let token = c.lock("rw:guard:token").build().unwrap();
    let t = Instant::now();
    for _ in 0..CYCLES {
        assert!(token.try_lock().unwrap().unlock().unwrap());
    }
    let tok = t.elapsed() / CYCLES;
    eprintln!("rwlock/cost: acquire+release read {read:?}, write {write:?}, token lock {tok:?}");
}

// ---------------------------------------------------------------------------------------------
// Wrong types, foreign hashes, bad input

#[test]
fn wrong_types_foreign_hashes_and_bad_input_are_errors() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);

    let _: () = redis::cmd("SET")
        .arg("rw:string")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let lock = rw(&c, "rw:string", Duration::from_secs(1));
    assert!(matches!(
        lock.read_lock().try_lock(),
        Err(LockError::WrongType { .. })
    ));
    let t = Instant::now();
    assert!(matches!(
        lock.write_lock().lock(),
        Err(LockError::WrongType { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(1));

    // A hash that is not a read-write lock's is never taken or changed: Redisson's RLock
    // (counts without 'mode'), a 'mode' other than read/write, a count that is not a number.
    type Fields = &'static [(&'static str, &'static str)];
    let foreign: [(&str, Fields, &str); 3] = [
        ("rw:rlock", &[("8a1f-uuid:1", "1")], "mode"),
        ("rw:mode", &[("mode", "banana")], "banana"),
        ("rw:count", &[("mode", "read")], "x1"),
    ];
    for (key, fields, mentions) in foreign {
        let lock = rw(&c, key, Duration::from_secs(1));
        for (f, v) in fields {
            let _: () = redis::cmd("HSET")
                .arg(key)
                .arg(f)
                .arg(v)
                .query(&mut conn)
                .unwrap();
        }
        if key == "rw:count" {
            // The damaged count is this very owner's field.
            let _: () = redis::cmd("HSET")
                .arg(key)
                .arg(lock.owner_id())
                .arg("x1")
                .query(&mut conn)
                .unwrap();
        }
        let before = hash(&mut conn, key);
        for r in [
            lock.read_lock().try_lock().map(|_| ()),
            lock.write_lock().try_lock().map(|_| ()),
        ] {
            match r {
                Err(LockError::Corrupt { value, .. }) => {
                    assert!(value.contains(mentions), "{key}: {value}")
                }
                other => panic!("{key}: expected Corrupt, got {other:?}"),
            }
        }
        assert_eq!(hash(&mut conn, key), before, "{key}");
    }

    // Bad input, before anything is sent.
    assert_invalid(c.rw_lock("").build(), "empty");
    assert_invalid(c.rw_lock("k").ttl(Duration::ZERO).build(), "ttl");
    assert_invalid(
        c.rw_lock("k").ttl(MAX_TTL + Duration::from_secs(1)).build(),
        "MAX_TTL",
    );
    assert_invalid(
        c.rw_lock("k").writer_intent(MAX_TTL * 2).build(),
        "writer_intent",
    );
    assert_invalid(
        c.rw_lock("k")
            .retry(RetryPolicy::standard().backoff(
                Duration::from_millis(10),
                Duration::from_millis(1),
                2,
            ))
            .build(),
        "max_delay",
    );
    let ok = rw(&c, "rw:valid", Duration::from_secs(1));
    let mut g = ok.read_lock().try_lock().unwrap();
    assert_invalid(g.extend(Duration::ZERO), "ttl");
    assert!(g.unlock().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster

#[cfg(feature = "cluster")]
#[test]
fn works_on_a_three_master_cluster() {
    init_logging();
    let cluster = Cluster::start(3);
    let cluster_client = || {
        LockClient::cluster_builder(&cluster.urls())
            .pool_size(8)
            .build()
            .expect("cluster client")
    };
    // Three clients: handles of one client are one owner on this thread.
    let (c, c2, c3) = (cluster_client(), cluster_client(), cluster_client());
    for node in 0..3 {
        let key = cluster.key_on(node, "rw:cluster");
        let mut conn = cluster.conn_for_key(&key);
        let a = rw(&c, &key, Duration::from_secs(5));
        let b = rw(&c2, &key, Duration::from_secs(5));
        let ra = a.read_lock().try_lock().unwrap();
        let rb = b.read_lock().try_lock().unwrap();
        let h = hash(&mut conn, &key);
        assert_eq!(h.get("mode").map(String::as_str), Some("read"), "{h:?}");
        assert_eq!(fields_with(&h, "r:").len(), 2);
        // Not `a` or `b`: this thread holds read through them, so they refuse the upgrade.
        let third = rw(&c3, &key, Duration::from_secs(5));
        assert_held(third.write_lock().try_lock());
        assert!(ra.unlock().unwrap() && rb.unlock().unwrap());
        let w = b.write_lock().lock().unwrap();
        assert_eq!(
            hash(&mut conn, &key).get("mode").map(String::as_str),
            Some("write")
        );
        assert_held(a.read_lock().try_lock());
        assert!(w.unlock().unwrap());
        assert!(!raw::exists(&mut conn, &key));
    }
    // A key with a hash tag: every companion key (timeout keys, writers, latch) follows the
    // tag, as Redisson names them; a key whose braces are not a tag is refused.
    let key = "{rw:tag}:lock";
    let a = rw(&c, key, Duration::from_secs(5));
    let r = a.read_lock().try_lock().unwrap();
    let mut conn = cluster.conn_for_key(key);
    assert!(raw::exists(
        &mut conn,
        &format!("{key}:{}:rwlock_timeout:1", a.owner_id())
    ));
    assert_eq!(a.channel(), "redisson_rwlock:{rw:tag}:lock");
    let third = rw(&c3, key, Duration::from_secs(5));
    assert_held(third.write_lock().try_lock());
    assert!(r.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key));
    assert_invalid(c.rw_lock("rw{open").build(), "hash tag");
    assert_invalid(c.rw_lock("rw{}empty").build(), "hash tag");

    // A short hammer on one key.
    let key = cluster.key_on(1, "rw:cluster-hammer");
    let locks: Vec<ReadWriteLock> = (0..2)
        .map(|_| rw(&c, &key, Duration::from_secs(5)))
        .collect();
    let probe = Arc::new(Probe::default());
    let longest = hammer(&locks, 4, 1, &probe, 600, Duration::from_secs(4));
    let (reads, writes) = (
        probe.reads.load(Ordering::SeqCst),
        probe.writes.load(Ordering::SeqCst),
    );
    eprintln!(
        "rwlock/cluster: {reads} reads + {writes} writes, longest writer wait {longest:?}, {} \
         violations",
        probe.violations.load(Ordering::SeqCst)
    );
    assert_eq!(probe.violations.load(Ordering::SeqCst), 0);
    assert!(writes >= 5 && reads >= 50, "{reads} + {writes}");
    assert!(!raw::exists(&mut cluster.conn_for_key(&key), &key));
}

/// Without an explicit ttl, read and write holds are watched: the client's watchdog renews
/// the owner's own entry past the lease while the hold lives, and stops when the lease is gone.
#[test]
fn watched_holds_are_renewed_while_held_and_expire_when_dropped() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let key = "rw:watched";
    let c = client(&server);
    let lock = c
        .rw_lock(key)
        .watchdog_lease(Duration::from_millis(600))
        .build()
        .unwrap();
    assert!(lock.is_watched());
    let read = lock.read_lock().try_lock().unwrap();
    assert!(read.lease().is_watched());
    // Past the lease by renewals alone.
    support::wait_renewals(&c, 0, 1, 4);
    assert!(!read.is_lost(), "read hold renewed past its 600 ms lease");
    assert!(read.is_held().unwrap());
    assert!(raw::pttl(&mut conn, key) > 0);
    let hold = format!("{{{key}}}:{}:rwlock_timeout:1", lock.owner_id());
    assert!(
        raw::pttl(&mut conn, &hold) > 0,
        "the hold's own timeout key is renewed too"
    );
    assert!(read.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "the only hold is gone");

    let write = lock.write_lock().try_lock().unwrap();
    // Past the lease by renewals alone.
    support::wait_renewals(&c, c.stats().renewals, 1, 4);
    assert!(!write.is_lost(), "write hold renewed past its 600 ms lease");
    assert!(write.is_held().unwrap());
    // Dropping the lease without releasing stops the renewals: the entry expires by itself.
    drop(write.into_lease());
    assert!(
        wait_until(Duration::from_secs(3), || !raw::exists(&mut conn, key)),
        "an abandoned watched hold expires within its lease"
    );
}

/// A writer of another client that waits for readers is woken by the release's PUBLISH, not by
/// its retry policy (which would poll only every 5 s).
#[test]
fn waiting_writer_is_woken_by_the_readers_release() {
    init_logging();
    let server = RedisServer::start();
    let key = "rw:wake";
    let (a, b) = (client(&server), client(&server));
    let readers = a.rw_lock(key).ttl(Duration::from_secs(30)).build().unwrap();
    let writers = b
        .rw_lock(key)
        .ttl(Duration::from_secs(30))
        .retry(
            RetryPolicy::standard()
                .fixed_delay(Duration::from_secs(5))
                .jitter(false),
        )
        // No writer intent: the writer must not be woken by its own intent's refresh.
        .writer_intent(Duration::ZERO)
        .build()
        .unwrap();
    let read = readers.read_lock().try_lock().unwrap();
    let started = Instant::now();
    let got = thread::scope(|s| {
        let w = s.spawn(|| {
            writers
                .write_lock()
                .try_lock_for(Duration::from_secs(20))
                .map(|g| g.unlock())
        });
        // The writer listens: a release from now on is heard, not found by its 5 s poll.
        support::wait_listening(&b, 1, 2);
        assert!(read.unlock().unwrap());
        w.join().unwrap()
    });
    assert!(got.is_ok(), "writer got the lock: {got:?}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(4),
        "woken by pub/sub, not by its 5 s poll ({waited:?})"
    );
}

/// Writes into the hash what a failover leaves of a released hold of `owner`: a release done
/// on a primary that was killed before replicating it, so the promoted replica still counts
/// it. `mode`: `read` (the `<owner>` count and its timeout key) or `write` (`<owner>:write`).
fn plant_stale_hold(conn: &mut redis::Connection, key: &str, owner: &str, mode: &str) {
    let ttl_ms = 30_000;
    if !raw::exists(conn, key) {
        redis::cmd("HSET")
            .arg(key)
            .arg("mode")
            .arg(mode)
            .exec(conn)
            .unwrap();
    }
    if mode == "read" {
        let n: i64 = redis::cmd("HINCRBY")
            .arg(key)
            .arg(owner)
            .arg(1)
            .query(conn)
            .unwrap();
        redis::cmd("SET")
            .arg(format!("{{{key}}}:{owner}:rwlock_timeout:{n}"))
            .arg(1)
            .arg("PX")
            .arg(ttl_ms)
            .exec(conn)
            .unwrap();
    } else {
        redis::cmd("HINCRBY")
            .arg(key)
            .arg(format!("{owner}:write"))
            .arg(1)
            .exec(conn)
            .unwrap();
    }
    redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ttl_ms)
        .exec(conn)
        .unwrap();
}

/// The read timeout keys of `owner` that exist, by hold number.
fn timeout_keys(conn: &mut redis::Connection, key: &str, owner: &str) -> Vec<u32> {
    (1..=4)
        .filter(|n| raw::exists(conn, &format!("{{{key}}}:{owner}:rwlock_timeout:{n}")))
        .collect()
}

/// A hold the owner gave up but the server kept (a release done on a primary that then failed
/// over before replicating it) does not outlive the owner's next release, in either mode: its
/// next acquire sets the owner's counts back to what it holds. (It re-entered the stale hold,
/// and the lock was held by nobody for a lease after the release, as for the reentrant lock.)
#[test]
fn a_stale_hold_of_the_owner_does_not_outlive_its_next_release() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let key = "rw:stale-own-hold";
    let lock = rw(&c, key, Duration::from_secs(30));
    let owner = lock.owner_id();
    let wfield = format!("{owner}:write");
    let other = rw(&client(&server), key, Duration::from_secs(30));

    // Write: the stale write hold is not re-entered.
    plant_stale_hold(&mut conn, key, &owner, "write");
    let w = lock
        .write_lock()
        .try_lock()
        .expect("its own stale hold does not refuse it");
    assert_eq!(count(&hash(&mut conn, key), &wfield), Some(1), "re-entered");
    assert!(w.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "{:?}", hash(&mut conn, key));
    other.write_lock().try_lock().unwrap().unlock().unwrap();

    // Read: the stale read hold and its timeout key go, another reader's stay.
    let theirs = other.read_lock().try_lock().unwrap();
    plant_stale_hold(&mut conn, key, &owner, "read");
    let r = lock.read_lock().try_lock().unwrap();
    assert_eq!(count(&hash(&mut conn, key), &owner), Some(1), "re-entered");
    assert_eq!(timeout_keys(&mut conn, key, &owner), vec![1]);
    assert_eq!(count(&hash(&mut conn, key), &other.owner_id()), Some(1));
    assert!(r.unlock().unwrap());
    assert!(theirs.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "{:?}", hash(&mut conn, key));
    assert!(timeout_keys(&mut conn, key, &owner).is_empty());

    // A stale write under a read acquire: not taken for a downgrade (its read release would
    // leave the lock in mode write, held by nobody).
    plant_stale_hold(&mut conn, key, &owner, "write");
    let r = lock.read_lock().try_lock().unwrap();
    let h = hash(&mut conn, key);
    assert_eq!(h.get("mode").map(String::as_str), Some("read"), "{h:?}");
    assert_eq!(count(&h, &wfield), None, "{h:?}");
    assert!(r.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "{:?}", hash(&mut conn, key));

    // A stale read under a write acquire: not refused as an upgrade.
    plant_stale_hold(&mut conn, key, &owner, "read");
    let w = lock
        .write_lock()
        .try_lock()
        .expect("a stale read is no upgrade");
    assert_eq!(count(&hash(&mut conn, key), &owner), None);
    assert!(timeout_keys(&mut conn, key, &owner).is_empty());
    assert!(w.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "{:?}", hash(&mut conn, key));

    // Real re-entries still count, and a stale extra above them goes: write, then read taken
    // while writing (a downgrade), each with stale holds added on the server.
    let w1 = lock.write_lock().try_lock().unwrap();
    let w2 = lock.write_lock().try_lock().unwrap();
    let r1 = lock.read_lock().try_lock().unwrap();
    assert!(w2.unlock().unwrap());
    plant_stale_hold(&mut conn, key, &owner, "write");
    plant_stale_hold(&mut conn, key, &owner, "read");
    let r2 = lock.read_lock().try_lock().unwrap();
    let h = hash(&mut conn, key);
    assert_eq!(count(&h, &wfield), Some(1), "w1 only: {h:?}");
    assert_eq!(count(&h, &owner), Some(2), "r1 and r2: {h:?}");
    assert_eq!(timeout_keys(&mut conn, key, &owner), vec![1, 2]);
    assert!(w1.unlock().unwrap());
    assert!(r1.unlock().unwrap());
    assert!(r2.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "{:?}", hash(&mut conn, key));

    // A lease released on another thread is still given back in the owner's count.
    let r = lock.read_lock().try_lock().unwrap().into_lease();
    let reader = lock.read_lock().clone();
    thread::spawn(move || assert!(reader.release(&r).unwrap()))
        .join()
        .unwrap();
    plant_stale_hold(&mut conn, key, &owner, "read");
    let r = lock.read_lock().try_lock().unwrap();
    assert_eq!(count(&hash(&mut conn, key), &owner), Some(1));
    assert!(r.unlock().unwrap());
    assert!(!raw::exists(&mut conn, key), "{:?}", hash(&mut conn, key));
}
