//! One Cluster shard cut off from the clients, under load: the other shards keep their rate.
//!
//! A 3-primary Cluster from the harness, each node behind a userspace TCP proxy on loopback
//! (tests/support/proxy.rs) that the clients use: the seeds are the proxies, and every node
//! announces its proxy's port (`CONFIG SET cluster-announce-port`), so that `CLUSTER SLOTS`
//! and the `MOVED`/`ASK` redirections name the proxies too and no client connection bypasses
//! them. The cluster bus is not proxied: the nodes keep seeing one another, as when only the
//! clients' link to one primary is cut.
//!
//! Load: two clients (connect and command timeout 1 s), each with [`THREADS_PER_SHARD`] threads
//! per shard; a thread takes random keys among its shard's of the 64 (`try_lock_for`
//! [`BUDGET`], Token locks with a 2 s ttl, held 2 ms). Every hold is recorded
//! (tests/support/history.rs) and every call timed.
//!
//! Phases: load [`PRE`]; shard 1's proxy drops every byte, both ways, for [`CUT`] (connections
//! stay open, nothing is refused: the clients find out by their timeouts); heal and load
//! [`AFTER`]; then, as the negative control, every shard's proxy drops everything for
//! [`ALL_CUT`]; heal and load [`AFTER`].
//!
//! Asserted: during the one-shard cut, each other shard's rate (holds acquired per second) is
//! at least [`MIN_RATE_FRACTION`] of its own rate before the cut, in the same run; every call
//! returns within [`CALL_BOUND`]: its budget plus the Cluster bound of one checkout, one command
//! and the replacement of a broken connection, plus [`SLACK`] (a hold or an error: none hangs);
//! no two validity windows
//! overlap. Negative control: the same rate analysis on the all-shards cut must report the two
//! other shards stalled (it is printed with the figures).
//!
//! Figures: docs/reliability.md, "A Cluster shard cut off from the clients". The rate analysis
//! is also checked on made-up data.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rand::RngExt;
use redis_dlock::{DistributedLock, Lock, LockClient, LockError, Strategy};
use support::history::{self, now_ns, overlaps, Hold, Recorder};
use support::proxy::{Mode, Proxy};
use support::{init_logging, wait_until, Cluster};

const SHARDS: usize = 3;
const KEYS: usize = 64;
/// The shard whose link is cut.
const VICTIM: usize = 1;
const THREADS_PER_SHARD: usize = 2;
const BUDGET: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// The clients' connect timeout: a checkout that opens a connection takes at most this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(2);
const HOLD: Duration = Duration::from_millis(2);
/// Added to a call's budget, one checkout and one command timeout: scheduling on a busy
/// 2-core machine.
const SLACK: Duration = Duration::from_millis(500);
const PRE: Duration = Duration::from_secs(3);
const CUT: Duration = Duration::from_secs(4);
const AFTER: Duration = Duration::from_secs(2);
const ALL_CUT: Duration = Duration::from_secs(3);
/// A shard not cut keeps at least this fraction of its pre-cut rate during a cut.
const MIN_RATE_FRACTION: f64 = 0.5;

/// One `try_lock_for` call, timed.
#[derive(Debug, Clone, Copy)]
struct Call {
    shard: usize,
    invoked: u64,
    returned: u64,
    ok: bool,
    /// The error was contention (the key held by another thread), not a timeout or a
    /// connection error.
    contention: bool,
}

/// A window of the run, `[start, end)` in ns of [`now_ns`].
#[derive(Debug, Clone, Copy)]
struct Window {
    start: u64,
    end: u64,
}

impl Window {
    fn secs(&self) -> f64 {
        (self.end - self.start) as f64 / 1e9
    }
}

/// Holds acquired per second on each shard within `w`.
fn rates(holds: &[Hold], shard_of: &[usize], w: Window) -> Vec<f64> {
    let mut n = [0u64; SHARDS];
    for h in holds
        .iter()
        .filter(|h| h.acquired >= w.start && h.acquired < w.end)
    {
        n[shard_of[h.key as usize]] += 1;
    }
    n.iter().map(|&c| c as f64 / w.secs()).collect()
}

/// The rate analysis: the shards other than `cut` whose rate during a cut fell below
/// [`MIN_RATE_FRACTION`] of their rate before it.
fn stalled(before: &[f64], during: &[f64], cut: usize) -> Vec<String> {
    (0..SHARDS)
        .filter(|&s| s != cut && during[s] < MIN_RATE_FRACTION * before[s])
        .map(|s| {
            format!(
                "shard {s}: {:.1} holds/s during the cut, {:.1} before",
                during[s], before[s]
            )
        })
        .collect()
}

/// The longest a call may take, by docs/deployments.md's Cluster bound: an attempt started just
/// before the budget ends may open a new cluster connection (seeds for at most the connect
/// timeout, then a connect to every node, half of it for the cut one), wait for its command
/// (the command timeout, the retry sleeps below 0.15 of it, and a node connection's set-up of
/// at most half the connect timeout), and, when that command failed, replace its connection
/// (seeds for at most half the connect timeout, half of it again for the cut node). redis-rs's
/// blocking cluster client has no deadline for a whole command (docs/architecture.md).
const CALL_BOUND: Duration = BUDGET
    .saturating_add(CONNECT_TIMEOUT.saturating_mul(3).checked_div(2).unwrap())
    .saturating_add(COMMAND_TIMEOUT.saturating_mul(23).checked_div(20).unwrap())
    .saturating_add(CONNECT_TIMEOUT.checked_div(2).unwrap())
    .saturating_add(CONNECT_TIMEOUT)
    .saturating_add(SLACK);

/// Calls that took longer than [`CALL_BOUND`].
fn overlong(calls: &[Call]) -> Vec<Call> {
    let bound = CALL_BOUND.as_nanos() as u64;
    calls
        .iter()
        .filter(|c| c.returned - c.invoked > bound)
        .copied()
        .collect()
}

/// The made-up check of the rate analysis: a shard that stops is reported, a shard that slows
/// by less than the fraction is not, the cut shard itself never is.
#[test]
fn the_rate_analysis_reports_a_stalled_shard_and_only_it() {
    let before = [100.0, 100.0, 100.0];
    assert!(stalled(&before, &[80.0, 0.0, 60.0], VICTIM).is_empty());
    let found = stalled(&before, &[0.0, 0.0, 60.0], VICTIM);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("shard 0"), "{found:?}");
    assert_eq!(stalled(&before, &[49.0, 0.0, 49.0], VICTIM).len(), 2);
}

fn client(proxies: &[Proxy]) -> LockClient {
    let seeds: Vec<String> = proxies.iter().map(Proxy::url).collect();
    LockClient::cluster_builder(&seeds)
        .pool_size((SHARDS * THREADS_PER_SHARD) as u32 + 2)
        .connect_timeout(CONNECT_TIMEOUT)
        .command_timeout(Some(COMMAND_TIMEOUT))
        .build()
        .expect("cluster client")
}

/// Every node announces its proxy's port, and every node's `CLUSTER SLOTS` names only proxies.
fn announce_proxies(cluster: &Cluster, proxies: &[Proxy]) {
    for (node, proxy) in cluster.nodes().iter().zip(proxies) {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-announce-port")
            .arg(proxy.port())
            .query(&mut node.conn())
            .expect("CONFIG SET cluster-announce-port");
    }
    let ports: Vec<i64> = proxies.iter().map(|p| i64::from(p.port())).collect();
    let announced = wait_until(Duration::from_secs(20), || {
        cluster.nodes().iter().all(|node| {
            let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query(&mut node.conn())
                .unwrap_or_default();
            slots.len() >= SHARDS
                && slots.iter().all(|range| {
                    range[2..].iter().all(|n| match n {
                        redis::Value::Array(n) => {
                            matches!(n.get(1), Some(redis::Value::Int(p)) if ports.contains(p))
                        }
                        _ => false,
                    })
                })
        })
    });
    assert!(announced, "the nodes did not all announce their proxies");
}

/// See docs/reliability.md, "A Cluster shard cut off from the clients". `DLOCK_CUT_DEBUG=1`
/// prints each shard's holds per 250 ms, the clients' stats and the calls longer than 600 ms.
#[test]
fn one_shard_cut_off_the_others_keep_their_rate() {
    init_logging();
    let started = Instant::now();
    let cluster = Cluster::start(SHARDS);
    let proxies: Vec<Proxy> = cluster
        .nodes()
        .iter()
        .map(|n| Proxy::start(n.port()))
        .collect();
    announce_proxies(&cluster, &proxies);

    let keys: Vec<String> = (0..KEYS).map(|k| format!("cut:{k}")).collect();
    let owners = cluster.slot_owners();
    let shard_of: Vec<usize> = keys
        .iter()
        .map(|k| owners[usize::from(cluster.keyslot(k))].expect("an owner"))
        .collect();
    let per_shard: Vec<Vec<u32>> = (0..SHARDS)
        .map(|s| {
            (0..KEYS as u32)
                .filter(|&k| shard_of[k as usize] == s)
                .collect()
        })
        .collect();
    assert!(
        per_shard.iter().all(|k| k.len() >= 8),
        "64 keys spread over the shards: {:?}",
        per_shard.iter().map(Vec::len).collect::<Vec<_>>()
    );

    let clients = [client(&proxies), client(&proxies)];
    let locks: Vec<Vec<Lock>> = clients
        .iter()
        .map(|c| {
            keys.iter()
                .map(|k| {
                    c.lock(k)
                        .strategy(Strategy::Token)
                        .ttl(TTL)
                        .build()
                        .unwrap()
                })
                .collect()
        })
        .collect();
    let stop = AtomicBool::new(false);
    let (holds, calls, marks) = thread::scope(|s| {
        let mut workers = Vec::new();
        for (c, locks) in locks.iter().enumerate() {
            for (shard, mine) in per_shard.iter().enumerate() {
                for t in 0..THREADS_PER_SHARD {
                    let stop = &stop;
                    let holder =
                        (c * SHARDS * THREADS_PER_SHARD + shard * THREADS_PER_SHARD + t) as u64;
                    workers.push(s.spawn(move || {
                        let mut rec = Recorder::new(holder);
                        let mut calls = Vec::new();
                        let mut rng = rand::rng();
                        while !stop.load(Ordering::Relaxed) {
                            let key = mine[rng.random_range(0..mine.len())];
                            let open = rec.begin(key);
                            let invoked = now_ns();
                            let result = locks[key as usize].try_lock_for(BUDGET);
                            let returned = now_ns();
                            let contention =
                                matches!(&result, Err(e) if e.is_contention() && !outage(e));
                            calls.push(Call {
                                shard,
                                invoked,
                                returned,
                                ok: result.is_ok(),
                                contention,
                            });
                            match result {
                                Ok(guard) => {
                                    let held = open.acquired();
                                    support::work(HOLD);
                                    rec.release(held, guard.remaining(), guard.is_lost());
                                    let _ = guard.unlock();
                                }
                                Err(_) if contention => {}
                                // As an application would: a pause after an error.
                                Err(_) => support::work(Duration::from_millis(20)),
                            }
                        }
                        (rec.holds().to_vec(), calls)
                    }));
                }
            }
        }
        // The phases (their lengths are the test's load).
        support::work(Duration::from_millis(500));
        let pre = now_ns();
        support::work(PRE);
        let cut = now_ns();
        proxies[VICTIM].set(Mode::Blackhole);
        support::work(CUT);
        let heal = now_ns();
        proxies[VICTIM].set(Mode::Pass);
        support::work(AFTER);
        let all_cut = now_ns();
        for p in &proxies {
            p.set(Mode::Blackhole);
        }
        support::work(ALL_CUT);
        let all_heal = now_ns();
        for p in &proxies {
            p.set(Mode::Pass);
        }
        support::work(AFTER);
        let end = now_ns();
        stop.store(true, Ordering::Relaxed);
        let mut holds = Vec::new();
        let mut calls = Vec::new();
        for w in workers {
            let (h, c) = w.join().expect("a worker thread");
            holds.extend(h);
            calls.extend(c);
        }
        (holds, calls, [pre, cut, heal, all_cut, all_heal, end])
    });
    let [pre, cut, heal, all_cut, all_heal, end] = marks;
    let before = rates(
        &holds,
        &shard_of,
        Window {
            start: pre,
            end: cut,
        },
    );
    let during = rates(
        &holds,
        &shard_of,
        Window {
            start: cut,
            end: heal,
        },
    );
    let after = rates(
        &holds,
        &shard_of,
        Window {
            start: heal,
            end: all_cut,
        },
    );
    let during_all = rates(
        &holds,
        &shard_of,
        Window {
            start: all_cut,
            end: all_heal,
        },
    );
    let after_all = rates(
        &holds,
        &shard_of,
        Window {
            start: all_heal,
            end,
        },
    );
    let one_cut = stalled(&before, &during, VICTIM);
    let control = stalled(&before, &during_all, VICTIM);
    let found = overlaps(&holds);
    let long = overlong(&calls);
    let in_cut = |c: &&Call| c.invoked >= cut && c.invoked < heal;
    let victim_calls: Vec<&Call> = calls
        .iter()
        .filter(|c| c.shard == VICTIM)
        .filter(in_cut)
        .collect();
    let worst = |cs: &mut dyn Iterator<Item = &Call>| {
        cs.map(|c| (c.returned - c.invoked) as f64 / 1e6)
            .fold(0.0, f64::max)
    };
    let fmt = |r: &[f64]| {
        r.iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    eprintln!(
        "cluster_cut: holds/s per shard (0/1/2; shard {VICTIM} cut): before {}, during the cut \
         {}, after {}; all cut {}, after {}. {} holds, {} calls; calls on shard {VICTIM} during \
         its cut: {} ({} Ok, {} contention, {} errors), longest {:.0} ms (bound {:.0} ms); \
         longest call of the whole run {:.0} ms; {}; run {:.1} s",
        fmt(&before),
        fmt(&during),
        fmt(&after),
        fmt(&during_all),
        fmt(&after_all),
        holds.len(),
        calls.len(),
        victim_calls.len(),
        victim_calls.iter().filter(|c| c.ok).count(),
        victim_calls.iter().filter(|c| c.contention).count(),
        victim_calls
            .iter()
            .filter(|c| !c.ok && !c.contention)
            .count(),
        worst(&mut victim_calls.iter().copied()),
        CALL_BOUND.as_secs_f64() * 1e3,
        worst(&mut calls.iter()),
        history::describe(&found, pre),
        started.elapsed().as_secs_f64()
    );
    let kept: Vec<String> = (0..SHARDS)
        .filter(|&s| s != VICTIM)
        .map(|s| {
            format!(
                "shard {s} {:.2}",
                during[s] / before[s].max(f64::MIN_POSITIVE)
            )
        })
        .collect();
    eprintln!(
        "cluster_cut: during the cut, rate / rate before: {} (required {MIN_RATE_FRACTION}); \
         negative control (every shard cut), the analysis reports: {}",
        kept.join(", "),
        if control.is_empty() {
            "nothing (the control failed)".to_owned()
        } else {
            control.join("; ")
        }
    );
    if std::env::var_os("DLOCK_CUT_DEBUG").is_some() {
        let bucket = 250_000_000u64;
        for shard in 0..SHARDS {
            let mut n = vec![0u32; ((end - pre) / bucket + 1) as usize];
            for h in holds
                .iter()
                .filter(|h| shard_of[h.key as usize] == shard && h.acquired >= pre)
            {
                n[((h.acquired - pre) / bucket) as usize] += 1;
            }
            eprintln!("shard {shard} per 250 ms: {n:?}");
        }
        for c in &clients {
            eprintln!("client stats: {:?}", c.stats());
        }
        eprintln!(
            "marks (ms after pre): cut {} heal {} all_cut {} all_heal {} end {}",
            (cut - pre) / 1_000_000,
            (heal - pre) / 1_000_000,
            (all_cut - pre) / 1_000_000,
            (all_heal - pre) / 1_000_000,
            (end - pre) / 1_000_000
        );
        let mut lc: Vec<&Call> = calls
            .iter()
            .filter(|c| c.returned - c.invoked > 600_000_000)
            .collect();
        lc.sort_by_key(|c| c.invoked);
        for c in lc.iter().take(60) {
            eprintln!(
                "long call shard {} at {} ms took {} ms ok {} contention {}",
                c.shard,
                (c.invoked as i64 - pre as i64) / 1_000_000,
                (c.returned - c.invoked) / 1_000_000,
                c.ok,
                c.contention
            );
        }
    }
    assert!(
        before.iter().all(|&r| r > 10.0 * MIN_RATE_FRACTION),
        "the load ran on every shard before the cut: {}",
        fmt(&before)
    );
    // The negative control: with every shard cut, the analysis reports the others stalled.
    assert_eq!(
        control.len(),
        SHARDS - 1,
        "the rate analysis did not report the other shards stalled with every shard cut: {} \
         (all cut: {})",
        control.join("; "),
        fmt(&during_all)
    );
    assert!(
        one_cut.is_empty(),
        "shards not cut stalled: {}",
        one_cut.join("; ")
    );
    assert!(
        !victim_calls.is_empty() && victim_calls.iter().any(|c| !c.ok && !c.contention),
        "calls on the cut shard met errors (else the link was not cut)"
    );
    assert!(
        long.is_empty(),
        "{} calls took longer than {CALL_BOUND:?} (budget + checkout + command + replacement + slack), \
         e.g. {:?}",
        long.len(),
        long.first()
    );
    assert!(
        found.is_empty(),
        "holds overlapped: {}",
        history::describe(&found, pre)
    );
}

/// A `Timeout` after which nothing was tried is an outage, not contention.
fn outage(e: &LockError) -> bool {
    matches!(e, LockError::Timeout { attempts: 0, .. })
}
