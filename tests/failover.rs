//! Failovers and resharding under load, against real servers: a Redis Cluster with replicas
//! whose primary is SIGKILLed, a Cluster whose slot moves between nodes while its locks are
//! taken and released, and a Sentinel group whose master is SIGKILLed or handed over with
//! `SENTINEL FAILOVER`.
//!
//! The load: threads, each with its own client, take Token and Reentrant locks (watched: a
//! 30 s lease) on a few keys and, inside each critical section, increment a counter with a
//! non-atomic `GET`, sleep, `SET` on a separate `redis-server`. Two holders at once lose an
//! increment, so `0 lost updates` is mutual exclusion as the protected resource saw it.
//!
//! Recovery: for every key, the time from the fault to the first critical section entered
//! after it. A release that failed during the failover and were left for its lease would
//! block its key for 30 s; the tests require every key back within the failover (as the test
//! observed it) plus one command timeout plus a generous slack for a loaded 2-core machine.
//! The numbers printed (`--nocapture`) are the ones in docs/deployments.md.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ReentrantLock;
use redis_dlock::{DistributedLock, LockClient, Strategy};
use support::{init_logging, role, wait_until, Cluster, RedisServer, Sentinel, SENTINEL_SERVICE};

/// The clients' connect and command timeout.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Load threads (one client each).
const THREADS: usize = 4;
/// Time inside each critical section, between the counter's GET and SET.
const SECTION: Duration = Duration::from_millis(1);
/// Slack on top of "failover + one command timeout", for a loaded 2-core machine. Far below
/// the 30 s lease that a stranded lock would cost.
const SLACK: Duration = Duration::from_secs(3);
/// How long each slot move keeps its slot half-migrated.
const DWELL: Duration = Duration::from_secs(1);
/// `cluster-node-timeout` of the cluster with replicas.
const NODE_TIMEOUT_MS: u64 = 2_000;

/// One critical section of the load.
#[derive(Debug, Clone)]
struct Section {
    key: String,
    entered: Instant,
    /// After the counter's `SET`: `[entered, left]` covers the protected read and write, so two
    /// sections whose increments interleaved (a lost update) overlap.
    left: Instant,
    /// `unlock()`: Some(true) released, Some(false) found lost, None failed.
    released: Option<bool>,
    unlock_took: Duration,
    owner: String,
}

/// The load: [`THREADS`] threads taking locks on `keys` until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<HashMap<String, u64>>>,
    log: Arc<Mutex<Vec<Section>>>,
    errors: Arc<Mutex<Vec<String>>>,
    counter: String,
    /// The threads' clients, for their test hooks.
    clients: Arc<Mutex<Vec<LockClient>>>,
}

fn strategy_of(key: &str) -> Strategy {
    if key.contains("reentrant") {
        Strategy::Reentrant
    } else {
        Strategy::Token
    }
}

impl Load {
    fn start(
        make_client: impl Fn() -> LockClient + Send + Sync + 'static,
        keys: &[String],
        counter: &RedisServer,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let make_client = Arc::new(make_client);
        let clients = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..THREADS)
            .map(|t| {
                let (stop, log, errors) = (stop.clone(), log.clone(), errors.clone());
                let clients = clients.clone();
                let (keys, make_client) = (keys.to_vec(), make_client.clone());
                let counter = counter.client();
                thread::spawn(move || {
                    let client = make_client();
                    clients.lock().unwrap().push(client.clone());
                    let mut con = counter.get_connection().expect("counter server");
                    con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut counts: HashMap<String, u64> = HashMap::new();
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let key = &keys[(rng % keys.len() as u64) as usize];
                        // Keys with `:rw:` take the write side of a read-write lock.
                        let (plain, rw);
                        let lock: &dyn DistributedLock = if key.contains(":rw:") {
                            rw = client.rw_lock(key.as_str()).build().expect("rw lock");
                            rw.write_lock()
                        } else {
                            plain = client
                                .lock(key.as_str())
                                .strategy(strategy_of(key))
                                .build()
                                .expect("lock");
                            &plain
                        };
                        let guard = match lock.try_lock_for(Duration::from_millis(300)) {
                            Ok(g) => g,
                            Err(e) => {
                                if !matches!(e, redis_dlock::LockError::Timeout { .. }) {
                                    log::debug!("LOAD {key}: lock: {}", e.report());
                                    errors
                                        .lock()
                                        .unwrap()
                                        .push(format!("{key}: lock: {}", e.report()));
                                    // A pause after an error, as an application would make.
                                    support::work(Duration::from_millis(20));
                                }
                                continue;
                            }
                        };
                        let entered = Instant::now();
                        let owner = String::from_utf8_lossy(guard.value()).into_owned();
                        let ck = format!("counter:{key}");
                        let v: Option<i64> = redis::cmd("GET").arg(&ck).query(&mut con).unwrap();
                        // The section's work: the load's holds last a while.
                        support::work(SECTION);
                        redis::cmd("SET")
                            .arg(&ck)
                            .arg(v.unwrap_or(0) + 1)
                            .exec(&mut con)
                            .unwrap();
                        *counts.entry(key.clone()).or_default() += 1;
                        let left = Instant::now();
                        let t0 = left;
                        let released = match guard.unlock() {
                            Ok(r) => Some(r),
                            Err(e) => {
                                errors
                                    .lock()
                                    .unwrap()
                                    .push(format!("{key}: unlock: {}", e.report()));
                                None
                            }
                        };
                        log.lock().unwrap().push(Section {
                            key: key.clone(),
                            entered,
                            left,
                            released,
                            unlock_took: t0.elapsed(),
                            owner,
                        });
                    }
                    // The client's background clean-ups end with it: let them finish.
                    wait_until(Duration::from_secs(10), || client.pending_cleanups() == 0);
                    counts
                })
            })
            .collect();
        Load {
            stop,
            threads,
            log,
            errors,
            counter: counter.url(),
            clients,
        }
    }

    /// Waits until `n` more sections were entered than now: the load runs on meanwhile.
    fn run_sections(&self, n: usize) {
        let target = self.log.lock().unwrap().len() + n;
        assert!(
            wait_until(support::EVENT_TIMEOUT, || self.log.lock().unwrap().len()
                >= target),
            "the load made no progress"
        );
    }

    /// Waits until every client of the load followed a master switch (Sentinel).
    fn wait_switched(&self) {
        for c in self.clients.lock().unwrap().iter() {
            support::wait_event(c, redis_dlock::test_hooks::Event::Switched, 1);
        }
    }

    /// Sections entered so far.
    fn sections(&self) -> Vec<Section> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (up to `timeout`) until every key of `keys` had a section entered after `since`.
    fn wait_all_entered(&self, keys: &[String], since: Instant, timeout: Duration) {
        wait_until(timeout, || {
            let log = self.log.lock().unwrap();
            keys.iter()
                .all(|k| log.iter().any(|s| &s.key == k && s.entered > since))
        });
    }

    /// Stops the threads and returns the report.
    fn stop(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        let mut counts: HashMap<String, u64> = HashMap::new();
        for t in self.threads {
            for (k, n) in t.join().expect("load thread") {
                *counts.entry(k).or_default() += n;
            }
        }
        let mut con = redis::Client::open(self.counter.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let lost = counts
            .iter()
            .map(|(k, n)| {
                let v: Option<u64> = redis::cmd("GET")
                    .arg(format!("counter:{k}"))
                    .query(&mut con)
                    .unwrap();
                (k.clone(), n - v.unwrap_or(0))
            })
            .filter(|(_, lost)| *lost > 0)
            .collect();
        let sections = self.log.lock().unwrap().clone();
        let errors = self.errors.lock().unwrap().clone();
        Report {
            counts,
            lost,
            sections,
            errors,
        }
    }
}

struct Report {
    counts: HashMap<String, u64>,
    /// Keys whose counter lost increments, and how many.
    lost: Vec<(String, u64)>,
    sections: Vec<Section>,
    errors: Vec<String>,
}

impl Report {
    /// For every write hold still on a key of `keys` (read through `con`), prints its owner's
    /// sections, timed from `since`: when a left hold was taken and released tells which
    /// failover step left it.
    fn print_left_holders(
        &self,
        keys: &[String],
        con: &mut impl redis::ConnectionLike,
        since: Instant,
    ) {
        let ms = |t: Instant| match t.checked_duration_since(since) {
            Some(d) => d.as_millis() as i64,
            None => -(since.duration_since(t).as_millis() as i64),
        };
        for k in keys {
            let kind: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
            let owners: Vec<String> = match kind.as_str() {
                "hash" => {
                    let fields: Vec<String> = redis::cmd("HKEYS").arg(k).query(con).unwrap();
                    fields
                        .iter()
                        .filter_map(|f| f.strip_suffix(":write").map(str::to_owned))
                        .collect()
                }
                "string" => {
                    let v: Option<String> = redis::cmd("GET").arg(k).query(con).unwrap();
                    v.into_iter().collect()
                }
                _ => Vec::new(),
            };
            for owner in owners {
                for s in self.sections.iter().filter(|s| s.owner == owner) {
                    eprintln!(
                        "left on {k}: owner {owner} entered at {} ms, left at {} ms, unlock {:?} \
                         in {:?}",
                        ms(s.entered),
                        ms(s.left),
                        s.released,
                        s.unlock_took
                    );
                }
            }
        }
    }

    fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// For each key, how long after `since` its first section was entered (None: never).
    fn recovery(&self, keys: &[String], since: Instant) -> Vec<(String, Option<Duration>)> {
        keys.iter()
            .map(|k| {
                let first = self
                    .sections
                    .iter()
                    .filter(|s| &s.key == k && s.entered > since)
                    .map(|s| s.entered)
                    .min();
                (k.clone(), first.map(|t| t - since))
            })
            .collect()
    }

    /// The longest time any key went without a section entered, from `since` on (what a
    /// waiter saw), and the key.
    fn longest_gap(&self, since: Instant) -> (Duration, String) {
        let mut by_key: HashMap<&str, Vec<Instant>> = HashMap::new();
        for s in &self.sections {
            by_key.entry(s.key.as_str()).or_default().push(s.entered);
        }
        let mut worst = (Duration::ZERO, String::new());
        for (k, mut times) in by_key {
            times.sort_unstable();
            let before = times.iter().filter(|t| **t <= since).max().copied();
            let after: Vec<Instant> = times.into_iter().filter(|t| *t > since).collect();
            let gaps = before
                .into_iter()
                .chain(after.iter().copied())
                .collect::<Vec<_>>()
                .windows(2)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or_default();
            if gaps > worst.0 {
                worst = (gaps, k.to_owned());
            }
        }
        worst
    }

    /// Pairs of sections of one key that overlapped in time, as (the earlier one's entry, the
    /// later one's entry).
    fn overlaps(&self, key: &str) -> Vec<(Instant, Instant)> {
        let mut mine: Vec<&Section> = self.sections.iter().filter(|s| s.key == key).collect();
        mine.sort_by_key(|s| s.entered);
        let mut pairs = Vec::new();
        for (i, a) in mine.iter().enumerate() {
            for b in &mine[i + 1..] {
                if b.entered >= a.left {
                    break;
                }
                pairs.push((a.entered, b.entered));
            }
        }
        pairs
    }

    /// As [`check`](Self::check), but lost updates are allowed where a failover cannot prevent
    /// them (docs/deployments.md, "The window that remains"): every lost update must come with
    /// an overlap of two sections of its key, and no two sections that both entered after
    /// `window_end` may overlap.
    fn check_window(
        &self,
        what: &str,
        keys: &[String],
        since: Instant,
        bound: Duration,
        window_end: Instant,
    ) -> Duration {
        let mut in_window = 0;
        for k in keys {
            let pairs = self.overlaps(k);
            // Sorted by entry: the earlier one entered after the window's end, so both did.
            let first_late = pairs.iter().find(|(a, _)| *a > window_end);
            assert!(
                first_late.is_none(),
                "{what}: key {k}: two sections entered after the window overlapped ({:?} and \
                 {:?} after the fault)",
                first_late.map(|(a, _)| *a - since),
                first_late.map(|(_, b)| *b - since)
            );
            let lost = self
                .lost
                .iter()
                .find(|(key, _)| key == k)
                .map_or(0, |(_, n)| *n);
            assert!(
                lost as usize <= pairs.len(),
                "{what}: key {k}: {lost} lost updates but only {} overlapping sections",
                pairs.len()
            );
            in_window += pairs.len();
        }
        eprintln!(
            "{what}: {in_window} overlapping pairs of sections, each with one entered before the \
             window's end ({:.2?} after the fault)",
            window_end - since
        );
        self.check_all_but_lost(what, keys, since, bound)
    }

    /// Asserts 0 lost updates and every key back within `bound` after `since`; prints the
    /// numbers. Returns the slowest key's recovery.
    fn check(&self, what: &str, keys: &[String], since: Instant, bound: Duration) -> Duration {
        let worst = self.check_all_but_lost(what, keys, since, bound);
        assert!(self.lost.is_empty(), "{what}: lost updates {:?}", self.lost);
        worst
    }

    /// Prints the numbers and asserts every key back within `bound` after `since`.
    fn check_all_but_lost(
        &self,
        what: &str,
        keys: &[String],
        since: Instant,
        bound: Duration,
    ) -> Duration {
        let rec = self.recovery(keys, since);
        let unlocks_lost = self
            .sections
            .iter()
            .filter(|s| s.released == Some(false))
            .count();
        let unlocks_failed = self
            .sections
            .iter()
            .filter(|s| s.released.is_none())
            .count();
        let worst = rec.iter().filter_map(|(_, d)| *d).max().unwrap_or_default();
        let (gap, gap_key) = self.longest_gap(since);
        let unlock_errors: Vec<&String> = self
            .errors
            .iter()
            .filter(|e| e.contains(": unlock: "))
            .collect();
        eprintln!("{what}: unlock errors: {unlock_errors:?}");
        eprintln!(
            "{what}: {} sections, lost updates {:?}, unlock() Ok(false) {unlocks_lost}, unlock() \
             Err {unlocks_failed}, other errors {}; longest time a key went without a section \
             {gap:.2?} ({gap_key}); recovery per key after the fault: {:?} (bound {bound:?})",
            self.total(),
            self.lost,
            self.errors.len().saturating_sub(unlocks_failed),
            rec.iter()
                .map(|(k, d)| format!("{k}: {}", d.map_or("never".into(), |d| format!("{d:.2?}"))))
                .collect::<Vec<_>>()
        );
        for (k, d) in &rec {
            let d =
                d.unwrap_or_else(|| panic!("{what}: key {k} never taken again after the fault"));
            assert!(d <= bound, "{what}: key {k} blocked {d:?} > {bound:?}");
        }
        assert!(
            gap <= bound,
            "{what}: key {gap_key} went {gap:?} without a section"
        );
        worst
    }
}

/// Once the load stopped (every guard released, every clean-up done), no lock key is left: a
/// hold nobody releases (say, a reentrant acquire whose reply was lost in the failover) would
/// keep other owners out for its whole lease.
fn no_lock_left(keys: &[String], con: &mut impl redis::ConnectionLike) {
    let left: Vec<(&String, i64, String)> = keys
        .iter()
        .filter_map(|k| {
            let pttl: i64 = redis::cmd("PTTL").arg(k).query(con).unwrap();
            (pttl != -2).then(|| {
                // What holds it, for the report: the token, or the hash's fields.
                let kind: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
                let content = if kind == "hash" {
                    let fields: Vec<String> = redis::cmd("HGETALL").arg(k).query(con).unwrap();
                    fields.join(" ")
                } else {
                    let v: Option<Vec<u8>> = redis::cmd("GET").arg(k).query(con).unwrap();
                    v.map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_default()
                };
                (k, pttl, content)
            })
        })
        .collect();
    assert!(
        left.is_empty(),
        "locks left after the load (key, pttl, holder): {left:?}"
    );
}

fn cluster_client(urls: &[String]) -> LockClient {
    cluster_client_with(urls, TIMEOUT)
}

/// A cluster client with the command timeout [`TIMEOUT`] and `connect` to connect (and wait
/// for a pooled connection).
fn cluster_client_with(urls: &[String], connect: Duration) -> LockClient {
    LockClient::cluster_builder(urls)
        .connect_timeout(connect)
        .command_timeout(Some(TIMEOUT))
        .pool_size(4)
        .build()
        .expect("cluster client")
}

fn sentinel_client(urls: &[String]) -> LockClient {
    LockClient::sentinel_builder(urls, SENTINEL_SERVICE)
        .connect_timeout(TIMEOUT)
        .command_timeout(Some(TIMEOUT))
        .pool_size(4)
        .build()
        .expect("sentinel client")
}

fn cluster_client_raw(cluster: &Cluster) -> redis::cluster::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// `count` keys `"<prefix>:<n>"` whose slots node `node` serves.
fn keys_on(cluster: &Cluster, node: usize, prefix: &str, count: usize) -> Vec<String> {
    let owners = cluster.slot_owners();
    let mut conn = cluster.node(0).conn();
    (0..100_000)
        .map(|n| format!("{prefix}:{n}"))
        .filter(|key| {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query(&mut conn)
                .unwrap();
            owners[usize::from(slot)] == Some(node)
        })
        .take(count)
        .collect()
}

/// `cluster_state:ok` on node `i`.
fn cluster_ok(cluster: &Cluster, i: usize) -> bool {
    support::cluster_info(cluster.node(i)).is_some_and(|s| s.contains("cluster_state:ok"))
}

#[test]
fn cluster_primary_sigkilled_under_load() {
    init_logging();
    let mut cluster = Cluster::start_with_replicas(3, 1, NODE_TIMEOUT_MS);
    let counter = RedisServer::start();
    let victim = cluster.slot_owner(0);
    let replica = *cluster
        .replicas_of(victim)
        .first()
        .expect("the victim has a replica");
    let other = (0..cluster.nodes().len())
        .find(|&i| {
            i != victim && i != replica && role(cluster.node(i)).as_deref() == Some("master")
        })
        .expect("another master");
    let mut keys = keys_on(&cluster, victim, "fo:token", 3);
    keys.extend(keys_on(&cluster, victim, "fo:reentrant", 3));
    keys.extend(keys_on(&cluster, other, "fo:token-control", 1));
    keys.extend(keys_on(&cluster, other, "fo:reentrant-control", 1));
    let urls = cluster.urls();
    let load = Load::start(move || cluster_client(&urls), &keys, &counter);
    let warm = Instant::now();
    load.wait_all_entered(&keys, warm, Duration::from_secs(10));
    load.run_sections(50);

    cluster.node_mut(victim).kill();
    let killed = Instant::now();
    assert!(
        wait_until(Duration::from_secs(30), || {
            role(cluster.node(replica)).as_deref() == Some("master")
                && cluster_ok(&cluster, replica)
        }),
        "the replica was not promoted"
    );
    let failover = killed.elapsed();
    load.wait_all_entered(&keys, killed, failover + TIMEOUT + SLACK);
    load.run_sections(50);
    let report = load.stop();
    let live: Vec<String> = (0..cluster.nodes().len())
        .filter(|&i| i != victim)
        .map(|i| cluster.node(i).url())
        .collect();
    let mut con = redis::cluster::ClusterClient::new(live)
        .unwrap()
        .get_connection()
        .unwrap();
    no_lock_left(&keys, &mut con);
    let worst = report.check(
        "cluster primary SIGKILL",
        &keys,
        killed,
        failover + TIMEOUT + SLACK,
    );
    eprintln!("cluster primary SIGKILL: failover seen after {failover:.2?}, slowest key back after {worst:.2?}");
    assert!(report.total() > 0);
}

/// A release whose reply is lost while a Cluster primary dies is retried by the janitor on the
/// promoted replica, owner-checked: a reentrant hold is given back once, not twice.
#[test]
fn cluster_failover_release_retried_on_new_primary() {
    init_logging();
    let mut cluster = Cluster::start_with_replicas(3, 1, NODE_TIMEOUT_MS);
    let victim = cluster.slot_owner(0);
    let replica = cluster.replicas_of(victim)[0];
    let token_key = keys_on(&cluster, victim, "fo:janitor-token", 1).remove(0);
    let reentrant_key = keys_on(&cluster, victim, "fo:janitor-reentrant", 1).remove(0);
    let client = cluster_client(&cluster.urls());
    let other = cluster_client(&cluster.urls());
    let token = client.lock(token_key.as_str()).build().unwrap();
    let reentrant: ReentrantLock = client
        .lock(reentrant_key.as_str())
        .strategy(Strategy::Reentrant)
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let t = token.try_lock().expect("token");
    let r1 = reentrant.try_lock().expect("reentrant");
    let r2 = reentrant.try_lock().expect("reentrant again");
    assert_eq!(reentrant.hold_count().unwrap(), 2);
    // Both holds are on the replica before the primary dies (WAIT counts only the writes of
    // its own connection: compare replication offsets instead).
    let offset: u64 = support::info_field(
        &mut cluster.node(victim).conn(),
        "replication",
        "master_repl_offset",
    )
    .and_then(|v| v.parse().ok())
    .expect("master_repl_offset");
    let mut rconn = cluster.node(replica).conn();
    assert!(
        wait_until(Duration::from_secs(10), || {
            support::info_field(&mut rconn, "replication", "slave_repl_offset")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|o| o >= offset)
        }),
        "the replica did not catch up"
    );

    cluster.node_mut(victim).kill();
    let killed = Instant::now();
    assert!(matches!(
        t.unlock(),
        Err(redis_dlock::LockError::Connection { .. })
    ));
    assert!(matches!(
        r2.unlock(),
        Err(redis_dlock::LockError::Connection { .. })
    ));
    assert_eq!(client.pending_cleanups(), 2);
    assert!(
        wait_until(Duration::from_secs(30), || client.pending_cleanups() == 0),
        "the clean-ups did not finish"
    );
    let done = killed.elapsed();
    assert_eq!(role(cluster.node(replica)).as_deref(), Some("master"));
    // The token lock is gone; the reentrant one keeps exactly one hold.
    let mut new_primary = cluster.node(replica).conn();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&token_key)
        .query(&mut new_primary)
        .unwrap();
    assert!(!exists, "the failed Token release was not retried");
    assert_eq!(
        reentrant.hold_count().unwrap(),
        1,
        "given back once, not twice"
    );
    let other_lock = other.lock(token_key.as_str()).build().unwrap();
    assert!(other_lock.try_lock().expect("token free").unlock().unwrap());
    assert!(r1.unlock().unwrap());
    let exists: bool = redis::cmd("EXISTS")
        .arg(&reentrant_key)
        .query(&mut new_primary)
        .unwrap();
    assert!(!exists);
    eprintln!("failed releases done on the promoted replica {done:.2?} after the SIGKILL");
}

/// Moves `slot` from node `from` to node `to`: IMPORTING/MIGRATING, then its keys one by one
/// with `pause` between them, for at least [`DWELL`] (locks taken and released meanwhile keep
/// creating keys on either side), then `SETSLOT NODE` everywhere. `during` runs once the slot
/// is migrating and the first key has moved (or at once if it holds none).
fn migrate_slot(
    cluster: &Cluster,
    slot: u16,
    from: usize,
    to: usize,
    pause: Duration,
    mut during: impl FnMut(),
) -> usize {
    let mut src = cluster.node(from).conn();
    let mut dst = cluster.node(to).conn();
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(cluster.node_id(from))
        .exec(&mut dst)
        .unwrap();
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(cluster.node_id(to))
        .exec(&mut src)
        .unwrap();
    let mut moved = 0;
    let mut called = false;
    let started = Instant::now();
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1)
            .query(&mut src)
            .unwrap();
        if let Some(key) = keys.first() {
            let r: redis::RedisResult<()> = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(cluster.node(to).port())
                .arg(key)
                .arg(0)
                .arg(5_000)
                .exec(&mut src);
            if r.is_ok() {
                moved += 1;
            }
            if !called {
                called = true;
                during();
            }
        } else if started.elapsed() >= DWELL {
            break;
        }
        // Paced (time under test): the migration lasts at least DWELL, locks taken and
        // released meanwhile.
        support::work(pause);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "migration never ends"
        );
    }
    if !called {
        during();
    }
    for i in 0..cluster.nodes().len() {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(cluster.node_id(to))
            .exec(&mut cluster.node(i).conn())
            .unwrap();
    }
    moved
}

#[test]
fn cluster_slot_migration_with_live_locks() {
    init_logging();
    let cluster = Cluster::start(3);
    let counter = RedisServer::start();
    // Every key in one slot (one hash tag): the load keeps taking and releasing them while the
    // slot moves 0 -> 1 -> 2 -> 0.
    let keys: Vec<String> = (0..3)
        .map(|i| format!("{{mig}}:token:{i}"))
        .chain((0..3).map(|i| format!("{{mig}}:reentrant:{i}")))
        .collect();
    let slot = cluster.keyslot(&keys[0]);
    let urls = cluster.urls();
    // A patient pool: opening a cluster connection on a loaded machine can take a while, and
    // this test is about the commands.
    let load = Load::start(
        move || cluster_client_with(&urls, Duration::from_secs(3)),
        &keys,
        &counter,
    );
    load.wait_all_entered(&keys, Instant::now(), Duration::from_secs(10));

    // A lock the test holds through the whole migration.
    let client = cluster_client(&cluster.urls());
    let held_key = "{mig}:held";
    let held = client.lock(held_key).build().unwrap();
    let guard = held.try_lock().expect("held");
    let channel = "redisson_lock__channel:{mig}:held";
    let mut tryagain_seen = false;
    let start = Instant::now();
    let mut owner = cluster.slot_owner(slot);
    let mut moved = 0;
    for _ in 0..3 {
        let to = (owner + 1) % 3;
        let (from, at) = (owner, cluster.node(owner).port());
        moved += migrate_slot(&cluster, slot, from, to, Duration::from_millis(40), || {
            // Control: the old release script's second key (the channel, which never exists)
            // makes a node in the middle of a migration refuse the script with TRYAGAIN.
            for (node, asking) in [(from, false), (to, true)] {
                let mut con = cluster.node(node).conn();
                if asking {
                    redis::cmd("ASKING").exec(&mut con).unwrap();
                }
                // The source answers ASK for a key it no longer has.
                let exists: redis::RedisResult<bool> =
                    redis::cmd("EXISTS").arg(held_key).query(&mut con);
                if !exists.unwrap_or(false) {
                    continue;
                }
                if asking {
                    redis::cmd("ASKING").exec(&mut con).unwrap();
                }
                let r: redis::RedisResult<i64> = redis::cmd("EVAL")
                    .arg("return 1")
                    .arg(2)
                    .arg(held_key)
                    .arg(channel)
                    .query(&mut con);
                let e = r.expect_err("a two-key script during a migration");
                assert_eq!(
                    e.code(),
                    Some("TRYAGAIN"),
                    "{e} (slot moving away from port {at})"
                );
                tryagain_seen = true;
            }
        });
        owner = to;
        assert_eq!(cluster.slot_owner(slot), to);
    }
    let took = start.elapsed();
    assert!(
        guard.is_held().unwrap(),
        "the held lock moved with its slot"
    );
    assert!(guard.unlock().unwrap());
    let during: Vec<Section> = load
        .sections()
        .into_iter()
        .filter(|s| s.entered >= start)
        .collect();
    load.run_sections(30);
    let report = load.stop();
    no_lock_left(&keys, &mut cluster_client_raw(&cluster));
    let slowest = during
        .iter()
        .map(|s| s.unlock_took)
        .max()
        .unwrap_or_default();
    let mut took_ms: Vec<u128> = during.iter().map(|s| s.unlock_took.as_micros()).collect();
    took_ms.sort_unstable();
    let p99 = took_ms
        .get(took_ms.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or(0);
    eprintln!(
        "slot migration: 3 moves of slot {slot} in {took:.2?} ({moved} keys migrated), {} \
         sections during them, unlock p99 {p99} us, slowest {slowest:.2?}; TRYAGAIN control \
         seen: {tryagain_seen}; errors: {:?}",
        during.len(),
        report.errors
    );
    assert!(
        during.len() > 20,
        "the load kept going during the migration"
    );
    assert!(
        tryagain_seen,
        "the control never caught the held key mid-migration"
    );
    assert!(report.lost.is_empty(), "lost updates {:?}", report.lost);
    assert!(
        report.sections.iter().all(|s| s.released == Some(true)),
        "every release during the migration completed"
    );
    assert!(report.errors.is_empty(), "errors: {:?}", report.errors);
    // Well under the 1.28 s that one TRYAGAIN retry of redis-rs's defaults sleeps.
    assert!(slowest < TIMEOUT, "slowest unlock {slowest:?}");
}

/// `INFO commandstats` calls of the lock commands (`SET`, `EVALSHA`, `EVAL`) on `server`.
fn lock_commands(server: &RedisServer) -> Option<u64> {
    let mut con = support::quick_conn(server)?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .ok()?;
    Some(
        info.lines()
            .filter(|l| {
                l.starts_with("cmdstat_set:")
                    || l.starts_with("cmdstat_evalsha:")
                    || l.starts_with("cmdstat_eval:")
            })
            .filter_map(|l| {
                l.split([':', ','])
                    .find_map(|f| f.strip_prefix("calls=")?.parse::<u64>().ok())
            })
            .sum(),
    )
}

fn sentinel_keys() -> Vec<String> {
    (0..4)
        .map(|i| format!("fo:token:{i}"))
        .chain((0..4).map(|i| format!("fo:reentrant:{i}")))
        .chain((0..4).map(|i| format!("fo:rw:{i}")))
        .collect()
}

#[test]
fn sentinel_master_sigkilled_under_load() {
    init_logging();
    let mut set = Sentinel::start(3, 2);
    let counter = RedisServer::start();
    let keys = sentinel_keys();
    let urls = set.sentinel_urls();
    let load = Load::start(move || sentinel_client(&urls), &keys, &counter);
    load.wait_all_entered(&keys, Instant::now(), Duration::from_secs(10));
    load.run_sections(50);
    let old_port = set.server(0).port();
    set.server_mut(0).kill();
    let killed = Instant::now();
    let new = set
        .wait_for_failover(old_port, Duration::from_secs(30))
        .expect("failover");
    assert_eq!(new, 1);
    let failover = killed.elapsed();
    load.wait_all_entered(&keys, killed, failover + TIMEOUT + SLACK);
    load.run_sections(50);
    let report = load.stop();
    no_lock_left(&keys, &mut set.server(1).conn());
    let worst = report.check(
        "sentinel master SIGKILL",
        &keys,
        killed,
        failover + TIMEOUT + SLACK,
    );
    eprintln!("sentinel master SIGKILL: failover seen after {failover:.2?}, slowest key back after {worst:.2?}");
}

#[test]
fn sentinel_graceful_failover_is_followed_at_once() {
    init_logging();
    let set = Sentinel::start(3, 2);
    let counter = RedisServer::start();
    let keys = sentinel_keys();
    let urls = set.sentinel_urls();
    let load = Load::start(move || sentinel_client(&urls), &keys, &counter);
    load.wait_all_entered(&keys, Instant::now(), Duration::from_secs(10));
    load.run_sections(50);
    let old_port = set.server(0).port();
    let asked = Instant::now();
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SENTINEL_SERVICE)
        .exec(&mut set.sentinels()[0].conn())
        .expect("SENTINEL FAILOVER");
    let new = set
        .wait_for_failover(old_port, Duration::from_secs(30))
        .expect("failover");
    assert_eq!(new, 1);
    let failover = asked.elapsed();
    // The old master still answers as a master until Sentinel reconfigures it (its INFO period
    // is 10 s): the clients must have left it already.
    load.wait_switched();
    let before = lock_commands(set.server(0));
    // Commands that must not come are given time to.
    thread::sleep(Duration::from_secs(2));
    let after = lock_commands(set.server(0));
    let still_master = role(set.server(0)).as_deref() == Some("master");
    load.wait_all_entered(&keys, asked, failover + TIMEOUT + SLACK);
    let report = load.stop();
    // Until the switch was seen plus one command timeout, a section begun on the old primary
    // may overlap one on the new (the window docs/deployments.md describes); none after.
    let worst = report.check_window(
        "sentinel graceful failover",
        &keys,
        asked,
        failover + TIMEOUT + SLACK,
        asked + failover + TIMEOUT,
    );
    report.print_left_holders(&keys, &mut set.server(1).conn(), asked);
    no_lock_left(&keys, &mut set.server(1).conn());
    eprintln!(
        "sentinel graceful failover: seen after {failover:.2?}, slowest key back after \
         {worst:.2?}; lock commands on the old master 0.5-2.5 s after: {before:?} -> {after:?} \
         (still a master: {still_master})"
    );
    assert!(
        still_master,
        "the old master was reconfigured too early for this check"
    );
    assert_eq!(
        before, after,
        "lock commands reached the old master after the switch"
    );
}

/// One command against a frozen Cluster node (SIGSTOP) returns within its command timeout,
/// redis-rs's own retries included (it retries a timed-out command at once, each try with the
/// whole read timeout, so without one deadline per command the call took 6 timeouts).
#[test]
fn cluster_command_bounded_by_its_timeout_on_a_frozen_node() {
    init_logging();
    let cluster = Cluster::start(3);
    let client = cluster_client(&cluster.urls());
    let key = cluster.key_on(1, "fo:frozen");
    let lock = client.lock(key.as_str()).build().unwrap();
    assert!(lock.try_lock().expect("warm-up").unlock().unwrap());
    cluster.node(1).pause();
    let start = Instant::now();
    let r = lock.try_lock();
    let took = start.elapsed();
    cluster.node(1).resume();
    eprintln!("try_lock on a frozen cluster node: {took:.2?} ({r:?})");
    assert!(
        matches!(r, Err(redis_dlock::LockError::Connection { .. })),
        "{r:?}"
    );
    // The bound is the timeout plus at most one retry sleep (a tenth of it); the rest is slack
    // for a loaded machine, far below the 6 timeouts (3 s) of unbounded retries.
    assert!(took < TIMEOUT * 2, "took {took:?}");
}

/// The overlap detector of [`Report::check_window`], on made-up sections: interleaved sections
/// are found, touching or separate ones are not; a lost update no overlap explains, and an
/// overlap after the window, fail the check.
#[test]
fn overlapping_sections_are_found() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let section = |entered: u64, left: u64| Section {
        key: "k".into(),
        entered: at(entered),
        left: at(left),
        released: Some(true),
        unlock_took: Duration::ZERO,
        owner: String::new(),
    };
    let report = |sections: Vec<Section>, lost: u64| Report {
        counts: HashMap::from([("k".to_owned(), sections.len() as u64)]),
        lost: if lost > 0 {
            vec![("k".to_owned(), lost)]
        } else {
            Vec::new()
        },
        sections,
        errors: Vec::new(),
    };
    let keys = ["k".to_owned()];
    let bound = Duration::from_secs(1);
    // [0, 10] and [5, 15] overlap; [15, 20] only touches the second; [30, 40] is apart.
    let r = report(
        vec![
            section(0, 10),
            section(5, 15),
            section(15, 20),
            section(30, 40),
        ],
        1,
    );
    assert_eq!(r.overlaps("k"), vec![(at(0), at(5))]);
    // Inside the window (it ends at 8 ms): allowed, and it explains the lost update.
    r.check_window("made up", &keys, t0, bound, at(8));
    // Two lost updates, one overlap: fails.
    let r = report(vec![section(0, 10), section(5, 15)], 2);
    let unexplained =
        std::panic::catch_unwind(|| r.check_window("made up", &keys, t0, bound, at(8)));
    assert!(unexplained.is_err());
    // An overlap of two sections entered after the window's end: fails.
    let r = report(vec![section(100, 110), section(105, 115)], 0);
    let late = std::panic::catch_unwind(|| r.check_window("made up", &keys, t0, bound, at(8)));
    assert!(late.is_err());
}
