//! `MultiLock` against real servers: an all-or-nothing lock over many keys, each holding a
//! Token value.
//!
//! - exclusion under load: multi-locks over overlapping key sets and single-key Token locks on
//!   the same keys, a per-key in-section counter never above 1, everything done within the
//!   budget (no deadlock) and every key free at the end; negative control: a "multi-lock" that
//!   takes only its first key, which the checker catches;
//! - no partial hold visible on the one-slot path: a client polling the keys (`MGET`, one
//!   atomic read) never sees a hold at some of its keys and not at the others; negative
//!   control: a lock that takes its keys one by one, which the poller catches;
//! - interlock with Token both ways, and wake-ups both ways by the published releases (the
//!   waiting client's `wakeups`); negative control: a holder that frees a key without
//!   publishing, whose waiter takes the set by its poll and moves no count;
//! - watched holds renewed past their lease, lost when one key is deleted; negative control:
//!   an explicit ttl, whose keys are gone after the same wait;
//! - a late win (a reply after the lifetime's margin) gives no guard, leaves no key held and
//!   counts no acquire; negative control: the same delay with a longer lifetime wins;
//! - a holder process SIGKILLed: its keys stay held, then free at its lease's end;
//! - a server restart under load, with persistence: holds survive it, no key has two holders,
//!   every thread goes on; negative control: without persistence, a hold taken before the
//!   restart is found gone after it;
//! - on a Cluster (feature `cluster`): overlapping sets across slots, no deadlock within the
//!   budget; a set refused by a key held elsewhere leaves none of its other keys held; negative
//!   control: a lock that takes its keys one by one without undo, which that check catches;
//!   with `test-hooks`, a waiter refused by its second slot's key is not woken by its own
//!   give-back of the first (its attempts stay within its poll); negative control: releases
//!   of the refusing key published in a loop, whose wake-ups the same count reports.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, LockClient, MultiLock, RetryPolicy};
use support::worker::{self, WorkerProcess};
use support::{init_logging, raw, wait_renewals, wait_until, work, RedisServer};

/// The budget of every blocking acquire here: far beyond what any takes on a busy machine.
const BUDGET: Duration = Duration::from_secs(30);

fn patient() -> RetryPolicy {
    RetryPolicy::standard().max_wait(Some(BUDGET))
}

/// Who enters the sections in an exclusion run.
#[derive(Debug, Clone)]
enum Who {
    /// A multi-lock over these keys (indices); watched if `watched`.
    Multi { keys: Vec<usize>, watched: bool },
    /// The negative control: claims these keys but locks only the first (a Token lock).
    FirstOnly(Vec<usize>),
    /// A single-key Token lock.
    Token(usize),
}

/// Per-key in-section counters: an entry that finds another thread inside is a violation.
struct Sections {
    inside: Vec<AtomicUsize>,
    violations: AtomicUsize,
}

impl Sections {
    fn new(n: usize) -> Self {
        Sections {
            inside: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            violations: AtomicUsize::new(0),
        }
    }

    fn run(&self, keys: &[usize], section: Duration) {
        for &k in keys {
            if self.inside[k].fetch_add(1, Ordering::SeqCst) != 0 {
                self.violations.fetch_add(1, Ordering::SeqCst);
            }
        }
        work(section);
        for &k in keys {
            self.inside[k].fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn violations(&self) -> usize {
        self.violations.load(Ordering::SeqCst)
    }
}

/// Runs `who`, each on a thread with a client of its own, `rounds` sections each (the control
/// stops at its first violation). Returns the violations and the sections completed.
fn exclusion_run(
    connect: &(dyn Fn() -> LockClient + Sync),
    keys: &[String],
    who: &[Who],
    rounds: usize,
) -> (usize, usize) {
    let sections = Sections::new(keys.len());
    let done = AtomicUsize::new(0);
    thread::scope(|s| {
        for w in who {
            let (sections, done) = (&sections, &done);
            s.spawn(move || {
                let client = connect();
                let names = |ks: &[usize]| ks.iter().map(|&k| keys[k].clone()).collect::<Vec<_>>();
                let token = |k: usize| {
                    (client.lock(&keys[k]).ttl(Duration::from_secs(10)))
                        .retry(patient())
                        .build()
                        .unwrap()
                };
                match w {
                    Who::Multi { keys: ks, watched } => {
                        let builder = client.multi_lock(&names(ks)).retry(patient());
                        let builder = match watched {
                            true => builder.watchdog_lease(Duration::from_secs(10)),
                            false => builder.ttl(Duration::from_secs(10)),
                        };
                        let lock = builder.build().unwrap();
                        for _ in 0..rounds {
                            let guard = lock.lock().expect("within the budget");
                            sections.run(ks, Duration::from_millis(1));
                            assert!(guard.unlock().unwrap(), "every key still ours");
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Who::FirstOnly(ks) => {
                        let lock = token(ks[0]);
                        for _ in 0..rounds {
                            let guard = lock.lock().expect("within the budget");
                            sections.run(ks, Duration::from_millis(2));
                            guard.unlock().unwrap();
                            done.fetch_add(1, Ordering::SeqCst);
                            if sections.violations() > 0 {
                                break;
                            }
                        }
                    }
                    Who::Token(k) => {
                        let lock = token(*k);
                        for _ in 0..rounds {
                            let guard = lock.lock().expect("within the budget");
                            sections.run(&[*k], Duration::from_millis(1));
                            assert!(guard.unlock().unwrap());
                            done.fetch_add(1, Ordering::SeqCst);
                            if sections.violations() > 0 && rounds > 100 {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    (sections.violations(), done.load(Ordering::SeqCst))
}

fn overlapping(control: bool) -> Vec<Who> {
    let multi = |keys: Vec<usize>, watched| match control {
        false => Who::Multi { keys, watched },
        true => Who::FirstOnly(keys),
    };
    vec![
        multi(vec![0, 1], false),
        multi(vec![1, 2], true),
        multi(vec![0, 2], false),
        multi(vec![0, 1, 2], true),
        Who::Token(0),
        Who::Token(1),
        Who::Token(2),
    ]
}

#[test]
fn overlapping_multi_locks_and_token_locks_exclude_each_other() {
    init_logging();
    let server = RedisServer::start();
    let url = server.url();
    let connect = || LockClient::open(url.as_str()).unwrap();
    let keys: Vec<String> = ["ex:a", "ex:b", "ex:c"].map(String::from).to_vec();
    let who = overlapping(false);
    let rounds = 25;
    let (violations, done) = exclusion_run(&connect, &keys, &who, rounds);
    assert_eq!(violations, 0, "two holders of one key were inside together");
    assert_eq!(
        done,
        who.len() * rounds,
        "every section done within the budget"
    );
    let mut conn = server.conn();
    for key in &keys {
        assert!(!raw::exists(&mut conn, key), "{key} free at the end");
    }

    // Negative control: the same load, each "multi-lock" taking only its first key.
    let (violations, _) = exclusion_run(&connect, &keys, &overlapping(true), 400);
    assert!(
        violations > 0,
        "the checker missed a lock over a subset of its keys"
    );
}

/// Every `MGET` snapshot of `keys` is consistent with the holds: each value found is at
/// exactly the keys of its hold (`holds`: value → key indices). Returns the snapshots that
/// showed a partial hold, and those that showed any hold.
fn partial_snapshots(
    snapshots: &[Vec<Option<Vec<u8>>>],
    holds: &HashMap<Vec<u8>, Vec<usize>>,
) -> (usize, usize) {
    let (mut partial, mut held) = (0, 0);
    for snap in snapshots {
        let mut seen: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for (k, v) in snap.iter().enumerate() {
            if let Some(v) = v {
                seen.entry(v).or_default().push(k);
            }
        }
        held += usize::from(!seen.is_empty());
        if seen
            .iter()
            .any(|(v, at)| holds.get(*v).is_none_or(|want| want != at))
        {
            partial += 1;
        }
    }
    (partial, held)
}

/// A thread's acquires, each hold's value reported as it is taken.
type Taker<'a> = Box<dyn FnOnce(&dyn Fn(Vec<u8>)) + Send + 'a>;

/// Runs `takers` (each a key set and a closure that takes it `rounds` times, reporting each
/// hold's value) while another client polls the keys with `MGET`.
fn poll_while(
    server: &RedisServer,
    keys: &[String],
    takers: Vec<(Vec<usize>, Taker<'_>)>,
) -> (usize, usize) {
    let holds = Mutex::new(HashMap::new());
    let snapshots = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            let mut conn = server.conn();
            let mut local = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let snap: Vec<Option<Vec<u8>>> =
                    redis::cmd("MGET").arg(keys).query(&mut conn).unwrap();
                local.push(snap);
            }
            *snapshots.lock().unwrap() = local;
        });
        let workers: Vec<_> = takers
            .into_iter()
            .map(|(set, take)| {
                let holds = &holds;
                s.spawn(move || {
                    take(&|value| {
                        holds.lock().unwrap().insert(value, set.clone());
                    })
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::SeqCst);
    });
    let holds = holds.into_inner().unwrap();
    partial_snapshots(&snapshots.into_inner().unwrap(), &holds)
}

#[test]
fn no_client_ever_sees_a_partial_hold() {
    init_logging();
    let server = RedisServer::start();
    let keys: Vec<String> = ["np:1", "np:2", "np:3", "np:4"].map(String::from).to_vec();
    let sets = [vec![0, 1, 2], vec![1, 2, 3], vec![0, 3], vec![0, 1, 2, 3]];
    let url = server.url();
    let takers = sets
        .iter()
        .map(|set| {
            let (set, keys, url) = (set.clone(), &keys, url.clone());
            let names: Vec<String> = set.iter().map(|&k| keys[k].clone()).collect();
            let take: Taker<'_> = Box::new(move |report| {
                let client = LockClient::open(url.as_str()).unwrap();
                let lock = (client.multi_lock(&names).ttl(Duration::from_secs(10)))
                    .retry(patient())
                    .build()
                    .unwrap();
                for _ in 0..30 {
                    let guard = lock.lock().expect("within the budget");
                    report(guard.value().to_vec());
                    work(Duration::from_millis(1));
                    assert!(guard.unlock().unwrap());
                }
            });
            (set, take)
        })
        .collect();
    let (partial, held) = poll_while(&server, &keys, takers);
    assert_eq!(partial, 0, "a poller saw a partial hold");
    assert!(held > 0, "the poller never saw a hold: it checked nothing");

    // Negative control: a lock that takes its keys one command at a time (and gives them back
    // when refused) shows partial holds to the same poller.
    let takers = sets
        .iter()
        .map(|set| {
            let (set, keys, server) = (set.clone(), &keys, &server);
            let names: Vec<String> = set.iter().map(|&k| keys[k].clone()).collect();
            let take: Taker<'_> = Box::new(move |report| {
                let mut conn = server.conn();
                for round in 0..300u32 {
                    let value = format!("one-by-one:{}:{round}", names.join(",")).into_bytes();
                    report(value.clone());
                    let mut taken = Vec::new();
                    for name in &names {
                        let set: Option<String> = redis::cmd("SET")
                            .arg(name)
                            .arg(&value)
                            .arg("NX")
                            .arg("PX")
                            .arg(10_000)
                            .query(&mut conn)
                            .unwrap();
                        if set.is_none() {
                            break;
                        }
                        taken.push(name);
                    }
                    for name in taken {
                        raw::del(&mut conn, name);
                    }
                }
            });
            (set, take)
        })
        .collect();
    let (partial, _) = poll_while(&server, &keys, takers);
    assert!(
        partial > 0,
        "the poller missed the one-by-one lock's partial holds"
    );
}

#[test]
fn token_locks_and_multi_locks_interlock_and_wake_each_other() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let multi_client = LockClient::open(server.url()).unwrap();
    let token_client = LockClient::open(server.url()).unwrap();
    let ab = multi_client
        .multi_lock(&["il:b", "il:a"])
        .ttl(Duration::from_secs(20))
        .retry(patient())
        .build()
        .unwrap();
    assert_eq!(ab.keys(), ["il:a", "il:b"], "canonical order");
    let token_b = (token_client.lock("il:b").ttl(Duration::from_secs(20)))
        .retry(patient())
        .build()
        .unwrap();

    // Uncontended, on one server: one script to acquire, one to release (after a first use
    // that loaded the scripts).
    assert!(ab.lock().unwrap().unlock().unwrap());
    let calls = |conn: &mut redis::Connection| {
        let mut c = |name| raw::command_calls(conn, name);
        (c("evalsha"), c("eval"))
    };
    let before = calls(&mut conn);
    assert!(ab.lock().unwrap().unlock().unwrap());
    let after = calls(&mut conn);
    assert_eq!((after.0 - before.0, after.1 - before.1), (2, 0));

    // A multi-lock's hold: the same Token value at every key; a Token lock on one is refused.
    let guard = ab.try_lock().unwrap();
    assert_eq!(guard.value().len(), 32);
    assert!(guard.value().iter().all(u8::is_ascii_hexdigit));
    for key in ab.keys() {
        assert_eq!(raw::get(&mut conn, key).as_deref(), Some(guard.value()));
        let pttl = raw::pttl(&mut conn, key);
        assert!(pttl > 0 && pttl <= 20_000, "{key}: PTTL {pttl}");
    }
    assert!(token_b.try_lock().unwrap_err().is_contention());
    assert!(ab.try_lock().unwrap_err().is_contention());

    // A Token waiter is woken by the multi-lock's published release.
    let woken_before = token_client.stats().wakeups;
    thread::scope(|s| {
        let waiter = s.spawn(|| token_b.lock().map(|g| g.unlock()));
        assert!(
            wait_until(BUDGET, || raw::numsub(
                &mut conn,
                "redisson_lock__channel:{il:b}"
            ) >= 1),
            "the Token waiter subscribed"
        );
        assert!(guard.unlock().unwrap());
        assert!(waiter.join().unwrap().unwrap().unwrap());
    });
    assert!(
        token_client.stats().wakeups > woken_before,
        "the multi-lock's release was heard on the Token channel"
    );

    // A multi-lock waiter is woken by a Token release (of a key it waits for), and takes
    // every key then; nothing of its set was held meanwhile.
    let token_guard = token_b.lock().unwrap();
    // The Token waiter's subscription gone first, so that the count below is the new waiter's.
    let channel = "redisson_lock__channel:{il:b}";
    assert!(wait_until(BUDGET, || raw::numsub(&mut conn, channel) == 0));
    let woken_before = multi_client.stats().wakeups;
    thread::scope(|s| {
        let waiter = s.spawn(|| ab.lock().map(|g| g.unlock()));
        assert!(
            wait_until(BUDGET, || raw::numsub(
                &mut conn,
                "redisson_lock__channel:{il:b}"
            ) >= 1),
            "the multi-lock waiter subscribed"
        );
        assert!(
            !raw::exists(&mut conn, "il:a"),
            "no partial hold while waiting"
        );
        assert!(token_guard.unlock().unwrap());
        assert!(waiter.join().unwrap().unwrap().unwrap());
    });
    assert!(
        multi_client.stats().wakeups > woken_before,
        "the Token release was heard"
    );
    assert!(!raw::exists(&mut conn, "il:a") && !raw::exists(&mut conn, "il:b"));

    // Negative control of the count: a holder that frees the key without publishing (a plain
    // DEL). The waiter takes the set by its poll, and the count above does not move.
    assert!(wait_until(BUDGET, || raw::numsub(&mut conn, channel) == 0));
    let _: () = redis::cmd("SET")
        .arg("il:b")
        .arg("silent holder")
        .arg("PX")
        .arg(20_000)
        .query(&mut conn)
        .unwrap();
    let woken_before = multi_client.stats().wakeups;
    thread::scope(|s| {
        let waiter = s.spawn(|| ab.lock().map(|g| g.unlock()));
        assert!(wait_until(BUDGET, || raw::numsub(&mut conn, channel) >= 1));
        raw::del(&mut conn, "il:b");
        assert!(waiter.join().unwrap().unwrap().unwrap());
    });
    assert_eq!(
        multi_client.stats().wakeups,
        woken_before,
        "no release was published"
    );

    // A key of another type counts as held; it is never touched.
    raw::make_hash(&mut conn, "il:hash");
    let with_hash = multi_client
        .multi_lock(&["il:a", "il:hash"])
        .build()
        .unwrap();
    assert!(with_hash.try_lock().unwrap_err().is_contention());
    let waited = with_hash
        .try_lock_for(Duration::from_millis(100))
        .unwrap_err();
    assert!(
        matches!(waited, redis_dlock::LockError::Timeout { .. }),
        "{waited:?}"
    );
    assert!(!raw::exists(&mut conn, "il:a"));
    assert!(raw::hash_field(&mut conn, "il:hash").is_some());

    // Options refused with a configuration error.
    let refused = |r: redis_dlock::Result<MultiLock>| r.unwrap_err().is_config();
    assert!(refused(multi_client.multi_lock::<&str>(&[]).build()));
    assert!(refused(multi_client.multi_lock(&["x", "y", "x"]).build()));
    assert!(refused(multi_client.multi_lock(&["x", ""]).build()));
    let with_ttl = multi_client.multi_lock(&["x"]).ttl(Duration::from_secs(1));
    assert!(refused(with_ttl.on_lost(|_| {}).build()));
}

#[test]
fn a_watched_hold_is_renewed_past_its_lease_and_lost_with_one_key() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = LockClient::open(server.url()).unwrap();
    // Renewed every 400 ms: a watchdog late by up to ~780 ms on a busy machine still renews
    // in time.
    let lease = Duration::from_millis(1_200);
    let losses = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&losses);
    let keys = ["w:a", "w:b", "w:c"];
    let lock = client
        .multi_lock(&keys)
        .watchdog_lease(lease)
        .on_lost(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let from = client.stats().renewals;
    let taken = Instant::now();
    let guard = lock.lock().unwrap();
    // Four rounds of renewals: the hold has lived past its lease by renewals alone.
    wait_renewals(&client, from, 3, 4);
    assert!(taken.elapsed() > lease);
    for key in keys {
        assert_eq!(
            raw::get(&mut conn, key).as_deref(),
            Some(guard.value()),
            "{key}"
        );
    }
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());

    // One key deleted behind its back: the whole hold is lost, reported once (and counted
    // once, by the watchdog, not again by the release).
    let lost_before = client.stats().lost_holds;
    raw::del(&mut conn, "w:b");
    assert!(wait_until(BUDGET, || guard.is_lost()), "the loss was seen");
    assert!(wait_until(BUDGET, || losses.load(Ordering::SeqCst) >= 1));
    assert!(!guard.unlock().unwrap(), "not every key was still ours");
    assert_eq!(losses.load(Ordering::SeqCst), 1, "on_lost ran once");
    assert_eq!(client.stats().lost_holds, lost_before + 1);
    for key in keys {
        assert!(!raw::exists(&mut conn, key), "{key} released");
    }

    // Negative control: the same keys with an explicit lifetime of the same length are gone
    // after the same wait (the renewals above kept the hold).
    let explicit = client.multi_lock(&keys).ttl(lease).build().unwrap();
    let guard = explicit.lock().unwrap();
    assert!(wait_until(BUDGET, || keys
        .iter()
        .all(|k| !raw::exists(&mut conn, k))));
    assert!(guard.is_lost());
    assert!(!guard.unlock().unwrap());
    assert_eq!(
        client.stats().lost_holds,
        lost_before + 2,
        "found at the release"
    );
}

#[test]
fn a_failed_release_and_a_lost_acquire_reply_are_left_to_the_janitor() {
    use support::proxy::{Mode, Proxy};
    init_logging();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut conn = server.conn();
    let client = LockClient::builder(proxy.url())
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Some(Duration::from_millis(500)))
        .build()
        .unwrap();
    let keys = ["jan:a", "jan:b", "jan:c"];
    let lock = client
        .multi_lock(&keys)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut held = || keys.iter().filter(|k| raw::exists(&mut conn, k)).count();

    // A release that never reaches the server: an error, the keys still held, then deleted
    // by the janitor once the network is back (well before their 60 s lifetime).
    let guard = lock.try_lock().unwrap();
    proxy.set(Mode::Blackhole);
    assert!(guard.unlock().is_err(), "the release failed");
    assert_eq!(held(), 3, "the release did not land");
    assert!(client.pending_cleanups() >= 1, "left to the janitor");
    proxy.set(Mode::Pass);
    assert!(
        wait_until(BUDGET, || held() == 0),
        "the janitor released the keys"
    );

    // An acquire whose reply is lost: the script ran and took the keys, the caller got an
    // error; nothing is left held once the network is back.
    let refusals = client.stats().refusals;
    proxy.set(Mode::DropReplies);
    assert!(lock.try_lock().is_err(), "no reply, no hold");
    proxy.set(Mode::Pass);
    assert_eq!(client.stats().refusals, refusals, "an error is no refusal");
    assert!(
        wait_until(BUDGET, || held() == 0),
        "the lost acquire was undone"
    );
    assert!(wait_until(BUDGET, || client.pending_cleanups() == 0));

    // Negative control: a hold nobody releases stays held, and the check above sees it; a
    // refusal is counted.
    std::mem::forget(lock.try_lock().unwrap());
    assert!(!wait_until(Duration::from_secs(2), || held() == 0));
    assert!(lock.try_lock().unwrap_err().is_contention());
    assert_eq!(client.stats().refusals, refusals + 1);
}

#[test]
fn a_late_win_is_given_back_and_counted_as_no_acquire() {
    use redis_dlock::LockError;
    use support::proxy::{Mode, Proxy};
    init_logging();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut conn = server.conn();
    let client = LockClient::builder(proxy.url())
        .command_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    let keys = ["late:a", "late:b"];
    let lock = |ttl| client.multi_lock(&keys).ttl(ttl).build().unwrap();
    // The scripts loaded first, so that each attempt below is one round trip.
    assert!(lock(Duration::from_secs(5))
        .try_lock()
        .unwrap()
        .unlock()
        .unwrap());
    let delay = Duration::from_millis(200);
    proxy.set(Mode::Delay {
        min: delay,
        max: delay,
    });

    // A 700 ms lifetime and a reply after 400 ms or more: less than the margin (the reply's
    // time) left. No guard; the keys given back; no acquire counted.
    let short = lock(Duration::from_millis(700));
    let acquires = client.stats().acquires;
    let late = short.try_lock().unwrap_err();
    assert!(matches!(late, LockError::LateReply { .. }), "{late:?}");
    assert!(
        keys.iter().all(|k| !raw::exists(&mut conn, k)),
        "given back"
    );
    assert_eq!(
        client.stats().acquires,
        acquires,
        "a late win is no acquire"
    );

    // Negative control: the same round trip with a lifetime that leaves the margin is a win,
    // which the checks above report.
    let long = lock(Duration::from_secs(10));
    let guard = long.try_lock().expect("a win in time");
    assert_eq!(client.stats().acquires, acquires + 1);
    assert!(keys.iter().all(|k| raw::exists(&mut conn, k)));
    proxy.set(Mode::Pass);
    assert!(guard.unlock().unwrap());
}

const WORKER_ENV: &str = "DLOCK_MULTI_WORKER";
const WORKER_TEST: &str = "multi_holder_process";
const LOCKED: &str = "DLOCK-MULTI-LOCKED";
const CRASH_KEYS: [&str; 3] = ["crash:a", "crash:b", "crash:c"];
const CRASH_LEASE: Duration = Duration::from_secs(3);

/// The holder side: does nothing unless [`WORKER_ENV`] is set.
#[test]
fn multi_holder_process() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    let client = LockClient::open(std::env::var("DLOCK_URL").unwrap()).unwrap();
    let lock = client
        .multi_lock(&CRASH_KEYS)
        .watchdog_lease(CRASH_LEASE)
        .build()
        .unwrap();
    let guard = lock.try_lock().expect("the holder takes free keys");
    worker::report(LOCKED, &hex::encode(guard.value()));
    worker::hold_until_killed()
}

#[test]
fn a_killed_holders_keys_are_free_at_its_lease_end() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut holder = WorkerProcess::spawn(
        WORKER_TEST,
        &[(WORKER_ENV, "1".to_owned()), ("DLOCK_URL", server.url())],
    );
    let dead = match holder.wait_marker(LOCKED, Duration::from_secs(30)) {
        Ok(v) => hex::decode(v).unwrap(),
        Err(e) => panic!("no hold reported ({e:?}): {:?}", holder.seen()),
    };
    assert!(!holder.kill().success());
    let killed = Instant::now();
    let client = LockClient::open(server.url()).unwrap();
    let lock = client
        .multi_lock(&CRASH_KEYS)
        .ttl(Duration::from_secs(5))
        .retry(patient())
        .build()
        .unwrap();
    // The dead hold is still there at first (the checker reports a held set).
    let held: Vec<_> = CRASH_KEYS
        .iter()
        .filter(|k| raw::get(&mut conn, k).as_deref() == Some(&dead[..]))
        .collect();
    if killed.elapsed() < CRASH_LEASE / 2 {
        assert_eq!(held.len(), 3, "the dead holder's value at every key");
        assert!(lock.try_lock().unwrap_err().is_contention());
    }
    let guard = lock.lock().expect("free at the dead hold's lease end");
    let waited = killed.elapsed();
    assert!(
        waited < CRASH_LEASE + Duration::from_secs(10),
        "took {waited:?}"
    );
    for key in CRASH_KEYS {
        assert_eq!(raw::get(&mut conn, key).as_deref(), Some(guard.value()));
    }
    assert!(guard.unlock().unwrap());
}

#[cfg(feature = "cluster")]
#[test]
fn cross_slot_sets_on_a_cluster() {
    use support::Cluster;
    init_logging();
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let connect = || {
        LockClient::cluster_builder(&urls)
            .pool_size(4)
            .connect_timeout(Duration::from_secs(2))
            .command_timeout(Some(Duration::from_secs(2)))
            .build()
            .unwrap()
    };
    // One key on each master, and a fourth in the first's slot... by hash tag.
    let (x, y, z) = (
        cluster.key_on(0, "cx"),
        cluster.key_on(1, "cy"),
        cluster.key_on(2, "cz"),
    );
    let keys = vec![x.clone(), y.clone(), z.clone(), format!("{{{x}}}:tagged")];
    let who = vec![
        Who::Multi {
            keys: vec![0, 1],
            watched: false,
        },
        Who::Multi {
            keys: vec![1, 2],
            watched: true,
        },
        Who::Multi {
            keys: vec![2, 0, 3],
            watched: false,
        },
        Who::Multi {
            keys: vec![0, 1, 2, 3],
            watched: true,
        },
        Who::Token(1),
        Who::Token(3),
    ];
    let rounds = 12;
    let (violations, done) = exclusion_run(&connect, &keys, &who, rounds);
    assert_eq!(violations, 0);
    assert_eq!(done, who.len() * rounds, "no deadlock within the budget");
    let free = |key: &str| !raw::exists(&mut cluster.conn_for_key(key), key);
    assert!(keys.iter().all(|k| free(k)), "every key free at the end");

    // A watched set over three slots (two keys each) is renewed by one call per slot and
    // round: fewer calls than holds renewed. (Where the watchdog renews Token holds with
    // `SET … IFEQ` instead of the script, only the renewals are checked.)
    let client = connect();
    let tagged: Vec<String> = [&x, &y, &z]
        .iter()
        .flat_map(|k| [format!("{{{k}}}:1"), format!("{{{k}}}:2")])
        .collect();
    let watched = (client
        .multi_lock(&tagged)
        .watchdog_lease(Duration::from_millis(1_200)))
    .build()
    .unwrap();
    let evalsha = || -> i64 {
        (0..3)
            .map(|i| raw::command_calls(&mut cluster.node(i).conn(), "evalsha"))
            .sum()
    };
    let guard = watched.lock().unwrap();
    let (calls, renewals) = (evalsha(), client.stats().renewals);
    wait_renewals(&client, renewals, 6, 5);
    let renewals = client.stats().renewals - renewals;
    let calls = evalsha() - calls;
    let rounds = renewals / 6;
    if !support::server_kind().has_set_ifeq() {
        // One call per slot per round, and a round may straddle each reading.
        assert!(
            calls as u64 <= 3 * (rounds + 2),
            "{calls} calls for {rounds} rounds"
        );
        assert!(calls > 0);
    }
    assert!(!guard.is_lost());
    assert!(guard.unlock().unwrap());

    // One slot on a Cluster (a hash tag): one script, all or none.
    let tagged = [format!("{{{x}}}:tagged"), x.clone()];
    let one_slot = client
        .multi_lock(&tagged)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let guard = one_slot.try_lock().unwrap();
    for k in &tagged {
        let mut conn = cluster.conn_for_key(k);
        assert_eq!(raw::get(&mut conn, k).as_deref(), Some(guard.value()));
    }
    assert!(guard.unlock().unwrap());

    // A set whose last key is held elsewhere until its budget ends: the keys it took are
    // given back, none left held.
    let other = connect();
    let blocker = other.lock(&z).ttl(Duration::from_secs(20)).build().unwrap();
    let held = blocker.try_lock().unwrap();
    let set = client
        .multi_lock(&[&x, &y, &z])
        .ttl(Duration::from_secs(20))
        .build()
        .unwrap();
    let err = set.try_lock_for(Duration::from_millis(800)).unwrap_err();
    assert!(err.is_contention(), "{err}");
    assert!(free(&x) && free(&y), "the partial holds were released");
    assert!(!free(&z), "the other holder's key untouched");

    // Negative control: the same refusal met by a lock that takes its keys one by one and
    // gives nothing back leaves keys held, and the check above reports it.
    for k in [&x, &y, &z] {
        let set: Option<String> = redis::cmd("SET")
            .arg(k.as_str())
            .arg("one-by-one")
            .arg("NX")
            .arg("PX")
            .arg(20_000)
            .query(&mut cluster.conn_for_key(k))
            .unwrap();
        if set.is_none() {
            break;
        }
    }
    assert!(
        !(free(&x) && free(&y)),
        "the check missed a partial hold left behind"
    );
    assert!(held.unlock().unwrap());
}

/// A waiter refused across slots gives back the group it took (published on that key's
/// channel) and must not be woken by its own give-back: it sleeps until the refusing key's
/// release, or its poll. Counted by the waiter's refusals while the refusing key stays held;
/// negative control: releases published on the refusing key's channel in a loop, which wake
/// it at each and which the same count reports.
#[cfg(all(feature = "cluster", feature = "test-hooks"))]
#[test]
fn a_cross_slot_waiter_is_not_woken_by_its_own_give_backs() {
    use redis_dlock::test_hooks::Event;
    use support::Cluster;
    init_logging();
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let connect = || {
        LockClient::cluster_builder(&urls)
            .connect_timeout(Duration::from_secs(2))
            .command_timeout(Some(Duration::from_secs(2)))
            .build()
            .unwrap()
    };
    let client = connect();
    let pair = [cluster.key_on(0, "own"), cluster.key_on(1, "own")];
    let lock = (client.multi_lock(&pair).ttl(Duration::from_secs(20)))
        .retry(patient())
        .build()
        .unwrap();
    // `first` is taken first, then `second` refuses.
    let (first, second) = (lock.keys()[0].clone(), lock.keys()[1].clone());
    let other = connect();
    let token = |k: &str| other.lock(k).ttl(Duration::from_secs(20)).build().unwrap();
    let (token_first, token_second) = (token(&first), token(&second));
    let held_first = token_first.try_lock().unwrap();
    let held_second = token_second.try_lock().unwrap();
    let channel = format!("redisson_lock__channel:{{{second}}}");
    // The waiter's refusals over `window`, `second` held all along (with `publish`, while
    // releases of `second` are published in a loop): more than its poll allows means it was
    // woken by something other than a release of `second` or its poll.
    let spins = |window: Duration, publish: bool| {
        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            if publish {
                s.spawn(|| {
                    let mut conn = cluster.node(2).conn();
                    while !stop.load(Ordering::SeqCst) {
                        let _: i64 = redis::cmd("PUBLISH")
                            .arg(&channel)
                            .arg("0")
                            .query(&mut conn)
                            .unwrap();
                    }
                });
            }
            let (from, start) = (client.stats().refusals, Instant::now());
            work(window);
            let (made, elapsed) = (client.stats().refusals - from, start.elapsed());
            stop.store(true, Ordering::SeqCst);
            // The poll beside pub/sub is 100 ms or more: at most one attempt per 100 ms, and
            // twice that and some for a busy machine.
            let allowed = 10 + elapsed.as_millis() as u64 / 50;
            (made, allowed)
        })
    };
    thread::scope(|s| {
        let waiter = s.spawn(|| lock.lock().map(|g| g.unlock()));
        // Refused by `first`, subscribed to its channel.
        support::wait_event(&client, Event::Subscribed, 1);
        assert!(held_first.unlock().unwrap());
        // Now it takes `first`, is refused by `second` and gives `first` back (published).
        support::wait_event(&client, Event::Subscribed, 2);
        let (made, allowed) = spins(Duration::from_secs(2), false);
        assert!(
            made <= allowed,
            "{made} attempts in the window, at most {allowed} allowed: woken by its own \
             give-backs"
        );

        // Negative control: releases of `second` published in a loop wake it at each one.
        let (made, allowed) = spins(Duration::from_secs(2), true);
        assert!(
            made > allowed,
            "{made} attempts, at most {allowed} allowed: the count missed a spinning waiter"
        );

        assert!(held_second.unlock().unwrap());
        assert!(waiter.join().unwrap().unwrap().unwrap());
    });
}

/// Whether a multi-lock taken before a restart of its server is still held after it: another
/// client's `try_lock` on the same keys, retried while the server comes back, is refused
/// (`true`) or wins (`false`).
fn held_across_a_restart(server: &mut RedisServer, keys: &[&str]) -> bool {
    let client = LockClient::open(server.url().as_str()).unwrap();
    let lock = client
        .multi_lock(keys)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let guard = lock.try_lock().expect("free keys");
    server.restart();
    let other = LockClient::open(server.url().as_str()).unwrap();
    let probe = other
        .multi_lock(keys)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut outcome = None;
    let answered = wait_until(Duration::from_secs(20), || match probe.try_lock() {
        Ok(g) => {
            outcome = Some(false);
            drop(g);
            true
        }
        Err(e) if e.is_contention() => {
            outcome = Some(true);
            true
        }
        Err(_) => false, // the server is coming back
    });
    assert!(answered, "the restarted server never answered");
    drop(guard);
    outcome.unwrap_or_default()
}

/// A server restart under load, with persistence (`appendonly yes`, `appendfsync always`):
/// threads taking overlapping sets (multi-locks and Token locks, as in the exclusion run) go on
/// through the restart; no key ever has two holders inside, every section is done within the
/// budget, and every key is free at the end. A hold taken before a restart is still held after
/// it; negative control: the same restart without persistence, after which that check finds the
/// hold gone.
#[test]
fn a_server_restart_under_load_keeps_holds_and_exclusion() {
    init_logging();
    let persist = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut server = RedisServer::start_with(&persist);
    assert!(
        held_across_a_restart(&mut server, &["rs:x", "rs:y"]),
        "a hold did not survive a restart with persistence"
    );
    let mut volatile = RedisServer::start();
    assert!(
        !held_across_a_restart(&mut volatile, &["rs:x", "rs:y"]),
        "the check missed a hold lost with the data"
    );

    let url = server.url();
    let keys: Vec<String> = ["rs:a", "rs:b", "rs:c"].map(String::from).to_vec();
    let sections = Sections::new(keys.len());
    let done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let who = overlapping(false);
    thread::scope(|s| {
        for w in &who {
            let (sections, done, stop, keys, url) = (&sections, &done, &stop, &keys, &url);
            s.spawn(move || {
                let client = LockClient::open(url.as_str()).unwrap();
                let (ks, multi, token) = match w {
                    Who::Multi { keys: ks, .. } => {
                        let names: Vec<&str> = ks.iter().map(|&k| keys[k].as_str()).collect();
                        let multi = client.multi_lock(&names).ttl(Duration::from_secs(10));
                        (
                            ks.clone(),
                            Some(multi.retry(patient()).build().unwrap()),
                            None,
                        )
                    }
                    Who::Token(k) => {
                        let token = client.lock(&keys[*k]).ttl(Duration::from_secs(10));
                        (
                            vec![*k],
                            None,
                            Some(token.retry(patient()).build().unwrap()),
                        )
                    }
                    Who::FirstOnly(_) => unreachable!("no control here"),
                };
                while !stop.load(Ordering::SeqCst) {
                    // A connection failure around the restart: try again. A release the
                    // restart interrupted is left to the janitor (or the ttl).
                    let entered = match (&multi, &token) {
                        (Some(m), _) => m.lock().map(|g| {
                            sections.run(&ks, Duration::from_millis(1));
                            let _ = g.unlock();
                        }),
                        (_, Some(t)) => t.lock().map(|g| {
                            sections.run(&ks, Duration::from_millis(1));
                            let _ = g.unlock();
                        }),
                        _ => unreachable!("one of the two"),
                    };
                    match entered {
                        Ok(()) => {
                            done.fetch_add(1, Ordering::SeqCst);
                            work(Duration::from_millis(1));
                        }
                        Err(_) => work(Duration::from_millis(20)),
                    }
                }
            });
        }
        let before = |n: usize| wait_until(BUDGET, || done.load(Ordering::SeqCst) >= n);
        assert!(before(50), "no progress before the restart");
        server.restart();
        let at_restart = done.load(Ordering::SeqCst);
        let went_on = before(at_restart + 50);
        stop.store(true, Ordering::SeqCst);
        eprintln!(
            "multilock/restart: {at_restart} sections before the restart, {} in all",
            done.load(Ordering::SeqCst)
        );
        assert!(went_on, "no progress after the restart");
    });
    assert_eq!(
        sections.violations(),
        0,
        "two holders of one key were inside together"
    );
    let mut conn = server.conn();
    let freed = wait_until(Duration::from_secs(15), || {
        keys.iter().all(|k| !raw::exists(&mut conn, k))
    });
    assert!(freed, "every key free at the end");
}
