//! The `metrics` feature: the counters of `LockClient::stats()` reported through the `metrics`
//! facade, read back by a small in-process recorder. Its own test binary (one global recorder
//! per process): `cargo test --features metrics --test metrics`.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use redis_dlock::ClassicOptions;
use redis_dlock::{DistributedLock, Encoding, LockClient, LockError, Strategy};
use support::expiry::{encode, epoch_ms};
use support::{init_logging, raw, wait_until, RedisServer};

/// Counters by name and sorted labels, e.g. `dlock_acquires_total{strategy=token}`.
#[derive(Default)]
struct Recorder {
    counters: Mutex<HashMap<String, Arc<Count>>>,
}

#[derive(Default)]
struct Count(AtomicU64);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

fn name(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        Counter::from_arc(Arc::clone(counters.entry(name(key)).or_default()))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// The recorder's counters, read through the handle kept before installing it.
struct Reader(&'static Recorder);

impl Reader {
    fn get(&self, name: &str) -> u64 {
        self.0
            .counters
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.0.load(Ordering::Relaxed))
    }
}

#[test]
fn counters_are_reported_through_the_metrics_facade() {
    init_logging();
    let recorder: &'static Recorder = Box::leak(Box::default());
    metrics::set_global_recorder(RecorderRef(recorder)).expect("the only recorder");
    let read = Reader(recorder);

    let server = RedisServer::start();
    let mut conn = server.conn();
    let (a, b) = (
        LockClient::open(server.url()).unwrap(),
        LockClient::open(server.url()).unwrap(),
    );
    let build = |c: &LockClient| {
        c.lock("metrics:token")
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (la, lb) = (build(&a), build(&b));
    let guard = la.try_lock().unwrap();
    assert!(matches!(lb.try_lock(), Err(LockError::Held { .. })));
    let attempts = match lb.try_lock_for(Duration::from_millis(200)) {
        Err(LockError::Timeout { attempts, .. }) => u64::from(attempts),
        other => panic!("expected a timeout, got {other:?}"),
    };
    assert!(guard.unlock().unwrap());

    raw::set(
        &mut conn,
        "metrics:classic",
        &encode(Encoding::Decimal, epoch_ms() - 5_000),
    );
    let classic = a
        .lock("metrics:classic")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .unwrap();
    assert!(classic.try_lock().unwrap().unlock().unwrap());

    assert_eq!(read.get("dlock_acquires_total{strategy=token}"), 1);
    assert_eq!(read.get("dlock_acquires_total{strategy=classic}"), 1);
    assert_eq!(
        read.get("dlock_refusals_total{strategy=token}"),
        1 + attempts
    );
    assert_eq!(read.get("dlock_timeouts_total{strategy=token}"), 1);
    assert_eq!(read.get("dlock_getset_takeovers_total"), 1);
    assert_eq!(read.get("dlock_lost_holds_total{strategy=token}"), 0);
    // The same counts as the clients' own stats.
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        read.get("dlock_acquires_total{strategy=token}")
            + read.get("dlock_acquires_total{strategy=classic}"),
        sa.acquires + sb.acquires
    );
    assert_eq!(
        read.get("dlock_refusals_total{strategy=token}"),
        sa.refusals + sb.refusals
    );

    // A watched Fair hold deleted under it: the watchdog's loss is a fair one, not a token one.
    let fair = a
        .lock("metrics:fair")
        .strategy(Strategy::Fair)
        .watchdog_lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let guard = fair.lock().unwrap();
    assert_eq!(read.get("dlock_acquires_total{strategy=fair}"), 1);
    raw::del(&mut conn, "metrics:fair");
    assert!(
        wait_until(Duration::from_secs(3), || guard.is_lost()),
        "the watchdog found the loss"
    );
    assert!(!guard.unlock().unwrap());
    assert_eq!(read.get("dlock_lost_holds_total{strategy=fair}"), 1);
    assert_eq!(read.get("dlock_lost_holds_total{strategy=token}"), 0);
    assert_eq!(a.stats().lost_holds, 1);
}

/// `set_global_recorder` takes the recorder by value: a forwarding handle to the leaked one.
struct RecorderRef(&'static Recorder);

impl metrics::Recorder for RecorderRef {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_histogram(k, u, d)
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, m)
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, m)
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, m)
    }
}
