//! A Sentinel split brain in real network namespaces (tests/support/netns.rs; needs root).
//!
//! Side A holds the master and client process A; side B the replica, three Sentinels (quorum
//! 2) and client process B. Both processes run 4 threads over 16 keys with Token locks (12 with
//! 1 s `ttl` leases, 4 watched with a 2 s lease) and record every hold (tests/support/history.rs).
//! Under load the link is cut until the Sentinels in B have promoted the replica, plus 3 s; then
//! it heals, the load stops, and the merged history is checked for overlapping holds.
//!
//! With replica confirmation (`ReplicaAcks::Auto`, the default) A's writes on the cut-off master
//! are refused (`NotReplicated`) and no two holds overlap. The negative control, the same run
//! with confirmation off, must show overlaps: A goes on locking on the old master while B locks
//! on the new one.

mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::Lock;
use redis_dlock::{DistributedLock, LockClient, LockError, ReplicaAcks};
use support::history::{self, decode, now_ns, overlaps, Hold, Recorder};
use support::netns::Split;
use support::worker::{report, WorkerProcess};
use support::{info_field, init_logging, quick_conn, role, wait_until, RedisServer};

const SERVICE: &str = "partitioned";
const THREADS: u64 = 4;
const KEYS: u32 = 16;
/// Keys below this have 1 s `ttl` leases; the others are watched.
const TTL_KEYS: u32 = 12;
const TTL: Duration = Duration::from_secs(1);
const WATCHDOG_LEASE: Duration = Duration::from_secs(2);
/// How long a holder keeps a key.
const WORK: Duration = Duration::from_millis(20);
/// Load before the cut, and after the heal.
const SETTLE: Duration = Duration::from_secs(2);
/// How long the partition lasts after B's replica is a master.
const AFTER_PROMOTION: Duration = Duration::from_secs(3);
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(20);
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Env of the worker: the Sentinels, `auto` or `off`, the history file, the stop file, the side.
const ENV_WORKER: &str = "DLOCK_PARTITION_WORKER";
const ENV_SENTINELS: &str = "DLOCK_PARTITION_SENTINELS";
const ENV_ACKS: &str = "DLOCK_PARTITION_ACKS";
const ENV_OUT: &str = "DLOCK_PARTITION_OUT";
const ENV_STOP: &str = "DLOCK_PARTITION_STOP";
const ENV_SIDE: &str = "DLOCK_PARTITION_SIDE";

/// Launch arguments of a server of one side: reachable on its side's address (and on loopback,
/// where the fixture checks it is up).
fn bind(addr: &str) -> Vec<String> {
    ["--bind", addr, "127.0.0.1", "--protected-mode", "no"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The deployment across the split: master in A, replica and Sentinels in B.
struct Deployment {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
}

impl Deployment {
    fn start(split: &Split) -> Deployment {
        let master = split.a.enter(|| {
            let args = bind(Split::A_ADDR);
            RedisServer::start_custom(|_, _| support::Launch {
                conf: None,
                args: args.clone(),
            })
        });
        let master_port = master.port().to_string();
        let (replica, sentinels) = split.b.enter(|| {
            let mut args = bind(Split::B_ADDR);
            args.extend([
                "--replicaof".into(),
                Split::A_ADDR.into(),
                master_port.clone(),
            ]);
            let replica = RedisServer::start_custom(|_, _| support::Launch {
                conf: None,
                args: args.clone(),
            });
            let mut rconn = replica.conn();
            assert!(
                wait_until(READY_TIMEOUT, || info_field(
                    &mut rconn,
                    "replication",
                    "master_link_status"
                )
                .as_deref()
                    == Some("up")),
                "the replica in B did not sync with the master in A"
            );
            let sentinels: Vec<RedisServer> = (0..3)
                .map(|_| {
                    RedisServer::start_custom(|port, dir| {
                        let conf = dir.join(format!("sentinel-{port}.conf"));
                        let text = format!(
                            "sentinel monitor {SERVICE} {} {master_port} 2\n\
                             sentinel down-after-milliseconds {SERVICE} {}\n\
                             sentinel failover-timeout {SERVICE} 5000\n\
                             sentinel parallel-syncs {SERVICE} 1\n\
                             sentinel resolve-hostnames no\n",
                            Split::A_ADDR,
                            support::SENTINEL_DOWN_AFTER_MS
                        );
                        std::fs::write(&conf, text).expect("write sentinel config");
                        let mut args = bind(Split::B_ADDR);
                        args.push("--sentinel".into());
                        support::Launch {
                            conf: Some(conf),
                            args,
                        }
                    })
                })
                .collect();
            let ready = wait_until(READY_TIMEOUT, || {
                sentinels.iter().all(|s| {
                    let Some(mut conn) = quick_conn(s) else {
                        return false;
                    };
                    let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(SERVICE)
                        .query(&mut conn)
                        .unwrap_or_default();
                    let peers: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                        .arg("SENTINELS")
                        .arg(SERVICE)
                        .query(&mut conn)
                        .unwrap_or_default();
                    replicas.len() == 1
                        && replicas[0].get("flags").is_some_and(|f| f == "slave")
                        && peers.len() == 2
                })
            });
            assert!(
                ready,
                "the Sentinels in B did not discover the replica and each other"
            );
            (replica, sentinels)
        });
        Deployment {
            master,
            replica,
            sentinels,
        }
    }

    fn sentinel_urls(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("redis://{}:{}/", Split::B_ADDR, s.port()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What one side's worker reported.
#[derive(Debug, Default)]
struct Side {
    holds: Vec<Hold>,
    not_replicated: u64,
    other_errors: u64,
    /// Releases that returned `Ok(true)`: the holder was never told of a loss.
    released_intact: u64,
}

/// One run of the scenario: each side's history and figures, and when the link was cut, the
/// replica was found promoted and the link healed (ns of [`now_ns`]).
struct Run {
    a: Side,
    b: Side,
    cut: u64,
    promoted: u64,
    heal: u64,
}

fn scenario(acks: &str) -> Run {
    init_logging();
    let started = Instant::now();
    let split = Split::new();
    let deployment = Deployment::start(&split);
    let dir = deployment.master.dir().to_owned();
    let stop = dir.join("stop");
    let sentinels = deployment.sentinel_urls();
    let spawn = |side: u64| -> (WorkerProcess, PathBuf) {
        let out = dir.join(format!("history-{side}"));
        let ns = if side == 0 { &split.a } else { &split.b };
        let envs = [
            (ENV_WORKER, "1".to_owned()),
            (ENV_SENTINELS, sentinels.clone()),
            (ENV_ACKS, acks.to_owned()),
            (ENV_OUT, out.display().to_string()),
            (ENV_STOP, stop.display().to_string()),
            (ENV_SIDE, side.to_string()),
        ];
        let worker = ns.enter(|| WorkerProcess::spawn_captured("partition_worker", &envs));
        (worker, out)
    };
    let (mut wa, out_a) = spawn(0);
    let (mut wb, out_b) = spawn(1);
    for w in [&mut wa, &mut wb] {
        w.wait_marker("ready", READY_TIMEOUT)
            .expect("the worker built its client and started");
    }
    // Time under test: the load runs whole before the cut.
    thread::sleep(SETTLE);

    let cut = now_ns();
    split.cut();
    // Promoted: the replica says it is a master, and every Sentinel names it (clients ask them).
    let promoted = split.b.enter(|| {
        wait_until(PROMOTION_TIMEOUT, || {
            role(&deployment.replica).as_deref() == Some("master")
                && deployment.sentinels.iter().all(|s| {
                    let addr: Option<(String, u16)> = quick_conn(s).and_then(|mut c| {
                        redis::cmd("SENTINEL")
                            .arg("get-master-addr-by-name")
                            .arg(SERVICE)
                            .query(&mut c)
                            .ok()
                    });
                    addr.is_some_and(|(_, port)| port == deployment.replica.port())
                })
        })
    });
    let promoted_at = now_ns();
    let promoted_after = Duration::from_nanos(promoted_at - cut);
    assert!(
        promoted,
        "the Sentinels in B did not promote the replica within {PROMOTION_TIMEOUT:?}"
    );
    // Time under test: both sides run split past the promotion, then healed.
    thread::sleep(AFTER_PROMOTION);
    let heal = now_ns();
    split.heal();
    thread::sleep(SETTLE);
    std::fs::write(&stop, b"").expect("write the stop file");

    let mut sides = Vec::new();
    for (w, out) in [(wa, out_a), (wb, out_b)] {
        let (status, stdout, stderr) = w.finish(Duration::from_secs(20));
        assert!(status.success(), "worker: {status}\n{stdout}\n{stderr}");
        let counts: HashMap<String, u64> = stdout
            .lines()
            .find_map(|l| l.strip_prefix("counts "))
            .unwrap_or_else(|| panic!("no counts from the worker:\n{stdout}\n{stderr}"))
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(0)))
            .collect();
        sides.push(Side {
            holds: decode(&std::fs::read(&out).expect("read the worker's history")),
            not_replicated: counts["not_replicated"],
            other_errors: counts["other"],
            released_intact: counts["intact"],
        });
    }
    let b = sides.pop().unwrap();
    let a = sides.pop().unwrap();
    eprintln!(
        "acks {acks}: replica promoted {:.1} s after the cut, partition {:.1} s, run {:.1} s",
        promoted_after.as_secs_f64(),
        (heal - cut) as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    drop(deployment);
    drop(split);
    Run {
        a,
        b,
        cut,
        promoted: promoted_at,
        heal,
    }
}

impl Run {
    /// Checks the merged history; returns the overlaps, after printing the figures.
    fn check(&self, acks: &str) -> Vec<history::Overlap> {
        let mut holds = self.a.holds.clone();
        holds.extend_from_slice(&self.b.holds);
        let found = overlaps(&holds);
        let during = |side: &Side| {
            side.holds
                .iter()
                .filter(|h| h.acquired >= self.cut && h.acquired < self.heal)
                .count()
        };
        eprintln!(
            "acks {acks}: A {} holds ({} during the cut, {} released Ok(true)), {} NotReplicated, \
             {} other errors; B {} holds ({} during the cut, {} released Ok(true)), {} \
             NotReplicated, {} other errors; {}",
            self.a.holds.len(),
            during(&self.a),
            self.a.released_intact,
            self.a.not_replicated,
            self.a.other_errors,
            self.b.holds.len(),
            during(&self.b),
            self.b.released_intact,
            self.b.not_replicated,
            self.b.other_errors,
            history::describe(&found, self.cut)
        );
        assert!(
            self.a.holds.len() > 20 && self.b.holds.len() > 20,
            "the load ran on both sides"
        );
        // A's holds taken while cut off, in ms after the cut (with confirmation: the few whose
        // write reached the replica before the cut took effect).
        let a_cut: Vec<String> = self
            .a
            .holds
            .iter()
            .filter(|h| h.acquired >= self.cut && h.acquired < self.heal)
            .take(5)
            .map(|h| format!("{:.1}", (h.invoked as i64 - self.cut as i64) as f64 / 1e6))
            .collect();
        eprintln!("acks {acks}: A's first holds during the cut invoked at {a_cut:?} ms");
        assert!(
            self.b.holds.iter().any(|h| h.invoked > self.promoted),
            "B locked on the promoted replica"
        );
        found
    }
}

#[test]
fn a_split_brain_with_replica_confirmation_grants_no_lock_twice() {
    let run = scenario("auto");
    let found = run.check("auto");
    assert!(
        run.a.not_replicated > 0,
        "A's writes on the cut-off master were refused (else the link was not cut)"
    );
    assert!(
        found.is_empty(),
        "holds overlapped: {}",
        history::describe(&found, run.cut)
    );
}

#[test]
fn a_split_brain_without_replica_confirmation_grants_locks_twice() {
    let run = scenario("off");
    let found = run.check("off");
    assert_eq!(run.a.not_replicated + run.b.not_replicated, 0);
    assert!(
        !found.is_empty(),
        "no overlap without replica confirmation: the checker or the partition failed"
    );
}

/// The worker: one client (built while the link is up), [`THREADS`] threads taking random keys
/// with `try_lock` until the stop file appears; writes its history and prints its counts.
#[test]
fn partition_worker() {
    if std::env::var_os(ENV_WORKER).is_none() {
        return;
    }
    init_logging();
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let sentinels: Vec<String> = env(ENV_SENTINELS).split(',').map(str::to_owned).collect();
    let acks = match env(ENV_ACKS).as_str() {
        "off" => ReplicaAcks::Off,
        _ => ReplicaAcks::Auto,
    };
    let side: u64 = env(ENV_SIDE).parse().unwrap();
    let stop_file = PathBuf::from(env(ENV_STOP));
    let client = LockClient::sentinel_builder(&sentinels, SERVICE)
        .pool_size(THREADS as u32 + 2)
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Some(Duration::from_secs(1)))
        .replica_acks(acks)
        .build()
        .expect("sentinel client");
    let locks: Vec<Lock> = (0..KEYS)
        .map(|k| {
            let b = client.lock(format!("partition:{k}"));
            if k < TTL_KEYS {
                b.ttl(TTL)
            } else {
                b.watchdog_lease(WATCHDOG_LEASE)
            }
            .build()
            .unwrap()
        })
        .collect();
    let stop = AtomicBool::new(false);
    let not_replicated = AtomicU64::new(0);
    let other = AtomicU64::new(0);
    let intact = AtomicU64::new(0);
    report("ready", "");
    let holds: Vec<u8> = thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (stop, locks) = (&stop, &locks);
                let (not_replicated, other, intact) = (&not_replicated, &other, &intact);
                s.spawn(move || {
                    let mut rec = Recorder::new(side << 32 | t);
                    while !stop.load(Ordering::Relaxed) {
                        let key = rand::random::<u32>() % KEYS;
                        let open = rec.begin(key);
                        match locks[key as usize].try_lock() {
                            Ok(guard) => {
                                let held = open.acquired();
                                support::work(WORK);
                                rec.release(held, guard.remaining(), guard.is_lost());
                                if matches!(guard.unlock(), Ok(true)) {
                                    intact.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            // A pause before the next key.
                            Err(LockError::Held { .. }) => support::work(Duration::from_millis(2)),
                            Err(LockError::NotReplicated { .. }) => {
                                not_replicated.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                log::debug!("side {side} thread {t}: {e}");
                                other.fetch_add(1, Ordering::Relaxed);
                                // No busy loop on an error returned at once.
                                support::work(Duration::from_millis(20));
                            }
                        }
                    }
                    rec.encode()
                })
            })
            .collect();
        assert!(wait_until(Duration::from_secs(600), || stop_file.exists()));
        stop.store(true, Ordering::Relaxed);
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    std::fs::write(env(ENV_OUT), holds).expect("write the history");
    report(
        "counts",
        &format!(
            "not_replicated={} other={} intact={}",
            not_replicated.load(Ordering::Relaxed),
            other.load(Ordering::Relaxed),
            intact.load(Ordering::Relaxed)
        ),
    );
}
