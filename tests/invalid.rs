//! Bad input is rejected with `Config` (naming the lock, or none for the client) before any command is
//! sent. Locks are built on a client pointed at a closed port: if a command were sent, the
//! error would be `Connection`.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use redis_dlock::ClassicOptions;
use redis_dlock::{
    DistributedLock, Encoding, LockBuilder, LockClient, LockError, RetryPolicy, Strategy, Takeover,
    MAX_TTL,
};
use support::{init_logging, RedisServer};

/// A loopback URL where nothing listens (the port was free a moment ago).
fn closed_url() -> String {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().unwrap().port()
    };
    format!("redis://127.0.0.1:{port}/")
}

fn dead_client() -> LockClient {
    LockClient::builder(closed_url())
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Some(Duration::from_millis(300)))
        .lazy_connect()
        .build()
        .expect("a lazy client does not connect in build()")
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(result: Result<T, LockError>, key: &str, mentions: &str) {
    match result {
        Err(err @ LockError::Config { .. }) => {
            let LockError::Config {
                key: Some(k),
                reason,
                ..
            } = &err
            else {
                panic!("a lock's Config error names its key: {err:?}")
            };
            assert_eq!(k, key);
            assert!(err.is_config() && !err.is_transient() && !err.is_timeout());
            assert!(
                reason.contains(mentions),
                "reason {reason:?} should mention {mentions:?}"
            );
            assert_eq!(err.key(), Some(key));
            assert!(!err.is_contention());
            let shown = err.to_string();
            assert!(shown.contains(&format!("{key:?}")), "{shown}");
            assert!(shown.contains(reason.as_str()), "{shown}");
        }
        other => panic!("expected Config for {key:?}, got {other:?}"),
    }
}

/// Sets one option on a builder.
type SetOption = fn(LockBuilder) -> LockBuilder;

/// Both ways to build each strategy, for a builder-producing closure.
fn build_all(make: impl Fn() -> LockBuilder, key: &str, mentions: &str) {
    assert_invalid(make().build(), key, mentions);
    assert_invalid(make().strategy(Strategy::Token).build(), key, mentions);
    assert_invalid(
        make()
            .strategy(Strategy::Classic(ClassicOptions::new()))
            .build(),
        key,
        mentions,
    );
    assert_invalid(make().build(), key, mentions);
    assert_invalid(
        make()
            .strategy(Strategy::Classic(ClassicOptions::new()))
            .build(),
        key,
        mentions,
    );
}

#[test]
fn the_closed_port_really_fails_with_connection() {
    init_logging();
    let c = dead_client();
    let lock = c.lock("inv:premise").build().unwrap();
    assert!(matches!(lock.try_lock(), Err(LockError::Connection { .. })));
    let lock = c
        .lock("inv:premise")
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .unwrap();
    assert!(matches!(lock.try_lock(), Err(LockError::Connection { .. })));
}

#[test]
fn empty_key() {
    init_logging();
    let c = dead_client();
    build_all(|| c.lock(""), "", "empty");
    build_all(
        || c.lock(String::new()).ttl(Duration::from_secs(1)),
        "",
        "empty",
    );
}

#[test]
fn bad_ttls() {
    init_logging();
    let c = dead_client();
    build_all(|| c.lock("inv:ttl").ttl(Duration::ZERO), "inv:ttl", "ttl");
    build_all(
        || c.lock("inv:ttl").ttl(Duration::from_micros(500)),
        "inv:ttl",
        "at least 1 ms",
    );
    build_all(
        || c.lock("inv:ttl").ttl(Duration::MAX),
        "inv:ttl",
        "MAX_TTL",
    );
    build_all(
        || c.lock("inv:ttl").ttl(MAX_TTL + Duration::from_millis(1)),
        "inv:ttl",
        "MAX_TTL",
    );
    // The limits themselves are accepted.
    for ttl in [Duration::from_millis(1), MAX_TTL] {
        let lock = c.lock("inv:ttl").ttl(ttl).build().expect("valid ttl");
        assert_eq!(lock.ttl(), ttl);
        let lock = c
            .lock("inv:ttl")
            .ttl(ttl)
            .strategy(Strategy::Classic(ClassicOptions::new()))
            .build()
            .expect("valid ttl");
        assert_eq!(lock.ttl(), ttl);
    }
}

#[test]
fn bad_ttl_on_extend() {
    init_logging();
    let server = RedisServer::start();
    let live = LockClient::open(server.url()).unwrap();
    let dead = dead_client();
    let mut conn = server.conn();
    let bad = [
        (Duration::ZERO, "at least 1 ms"),
        (Duration::from_micros(500), "at least 1 ms"),
        (MAX_TTL + Duration::from_millis(1), "MAX_TTL"),
        (Duration::MAX, "MAX_TTL"),
    ];
    for strategy in [Strategy::Token, Strategy::Classic(ClassicOptions::new())] {
        let key = format!("inv:extend:{strategy:?}");
        let lock = live
            .lock(&key)
            .strategy(strategy)
            .ttl(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut guard = lock.try_lock().unwrap();
        let value = guard.value().to_vec();
        let mut lease = guard.lease().clone();
        // The same key on a client that cannot reach Redis: only a check before sending can
        // answer Config.
        let dead_lock = dead.lock(&key).strategy(strategy).build().unwrap();
        for (ttl, mentions) in bad {
            assert_invalid(dead_lock.extend(&mut lease, ttl), &key, mentions);
            assert_invalid(guard.extend(ttl), &key, mentions);
        }
        // Nothing changed in Redis.
        let stored: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
        assert_eq!(stored, Some(value.clone()));
        assert_eq!(guard.value(), &value[..]);
        assert!(guard.unlock().unwrap());
    }
}

#[test]
fn classic_options_travel_in_the_strategy() {
    init_logging();
    let c = dead_client();
    let key = "inv:classic-opts";
    let options = ClassicOptions::new()
        .encoding(Encoding::BigEndian)
        .takeover(Takeover::CompareAndSet)
        .key_ttl(true)
        .clock_skew(Duration::from_millis(100));
    let lock = c
        .lock(key)
        .strategy(Strategy::Classic(options))
        .build()
        .unwrap();
    assert_eq!(lock.strategy(), Strategy::Classic(options));
    let classic: redis_dlock::ClassicLock = lock.try_into().unwrap();
    assert_eq!(classic.options(), &options);
    // The options of the watched locks do not apply to Classic.
    let watched: [(&str, SetOption); 4] = [
        ("watchdog_lease", |b| {
            b.watchdog_lease(Duration::from_secs(3))
        }),
        ("on_lost", |b| b.on_lost(|_| {})),
        ("fencing", |b| b.fencing()),
        ("wake_up", |b| b.wake_up(redis_dlock::WakeUp::Polling)),
    ];
    for (what, set) in watched {
        let r = set(c.lock(key))
            .strategy(Strategy::Classic(options))
            .build();
        assert!(matches!(r, Err(LockError::Config { .. })), "{what}: {r:?}");
        set(c.lock(key))
            .build()
            .unwrap_or_else(|e| panic!("{what} on Token: {e}"));
    }
}

#[test]
fn bad_clock_skew() {
    init_logging();
    let c = dead_client();
    assert_invalid(
        c.lock("inv:skew")
            .strategy(Strategy::Classic(
                ClassicOptions::new().clock_skew(MAX_TTL + Duration::from_millis(1)),
            ))
            .build(),
        "inv:skew",
        "clock_skew",
    );
    assert_invalid(
        c.lock("inv:skew")
            .strategy(Strategy::Classic(
                ClassicOptions::new().clock_skew(Duration::MAX),
            ))
            .build(),
        "inv:skew",
        "clock_skew",
    );
}

#[test]
fn bad_retry_policy() {
    init_logging();
    let c = dead_client();
    let short_max =
        RetryPolicy::standard().backoff(Duration::from_millis(10), Duration::from_millis(1), 2);
    build_all(
        || c.lock("inv:retry").retry(short_max.clone()),
        "inv:retry",
        "max_delay",
    );
    let mut zero_factor = RetryPolicy::legacy();
    zero_factor.backoff = 0;
    build_all(
        || c.lock("inv:retry").retry(zero_factor.clone()),
        "inv:retry",
        "backoff",
    );
    // Edge cases that are valid.
    for ok in [
        RetryPolicy::no_wait(),
        RetryPolicy::legacy().fixed_delay(Duration::ZERO),
        RetryPolicy::standard().max_wait(None).max_retries(None),
    ] {
        c.lock("inv:retry").retry(ok.clone()).build().unwrap();
        c.lock("inv:retry")
            .retry(ok)
            .strategy(Strategy::Classic(ClassicOptions::new()))
            .build()
            .unwrap();
    }
}

#[test]
fn client_setup_errors() {
    init_logging();
    let url = closed_url();
    let setup = |r: Result<LockClient, LockError>, what: &str| match r {
        Err(err @ LockError::Config { .. }) => {
            assert_eq!(err.key(), None, "{what}");
            assert!(err.is_config() && !err.is_contention() && !err.is_transient());
            assert!(
                err.to_string().starts_with("redis-dlock client: "),
                "{what}: {err}"
            );
        }
        other => panic!("{what}: expected Config, got {other:?}"),
    };
    setup(
        LockClient::builder(&url).pool_size(0).build(),
        "pool size 0",
    );
    setup(
        LockClient::builder(&url)
            .connect_timeout(Duration::ZERO)
            .build(),
        "zero connect timeout",
    );
    setup(
        LockClient::builder(&url)
            .command_timeout(Some(Duration::ZERO))
            .build(),
        "zero command timeout",
    );
    setup(LockClient::open("not a url"), "garbage URL");
    setup(LockClient::open("http://127.0.0.1:1/"), "wrong scheme");
    setup(LockClient::builder("").build(), "empty URL");

    // No limit on the command time is allowed.
    LockClient::builder(&url)
        .command_timeout(None)
        .pool_size(1)
        .lazy_connect()
        .build()
        .unwrap();
}
