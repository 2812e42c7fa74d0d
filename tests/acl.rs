//! Least privilege: an ACL user with exactly the permissions docs/production.md lists for a
//! strategy can use it fully (lock, unlock, pub/sub wake-ups, watchdog renewal, fencing);
//! take one permission away and the client says which command and NOPERM before the first
//! acquire.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{LockClient, LockError, RetryPolicy, Strategy};
use support::{init_logging, RedisServer};

/// The rules of docs/production.md for locks under `locks:*`, per strategy (kept in sync by
/// hand: the test fails if the documented rule is not enough).
const TOKEN_RULE: &[&str] = &[
    "~locks:*",
    "~dlock_fence:{locks:*}",
    "&redisson_lock__channel:{locks:*}",
    "+set",
    "+get",
    "+del",
    "+pexpire",
    "+pttl",
    "+type",
    "+incr",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+eval",
    "+evalsha",
];
const CLASSIC_RULE: &[&str] = &[
    "~locks:*", "+setnx", "+set", "+get", "+getset", "+pexpire", "+del", "+eval", "+evalsha",
];
const REENTRANT_RULE: &[&str] = &[
    "~locks:*",
    "~dlock_fence:{locks:*}",
    "&redisson_lock__channel:{locks:*}",
    "+exists",
    "+get",
    "+hexists",
    "+hincrby",
    "+hget",
    "+hdel",
    "+hlen",
    "+pexpire",
    "+pttl",
    "+del",
    "+incr",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+eval",
    "+evalsha",
];

/// Creates `user` (password `pw`) with nothing but `rule`.
fn user(server: &RedisServer, user: &str, rule: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">pw")
        .arg("resetkeys")
        .arg("resetchannels")
        .arg("-@all");
    for r in rule {
        cmd.arg(*r);
    }
    let _: () = cmd.query(&mut server.conn()).expect("ACL SETUSER");
}

fn client(server: &RedisServer, user: &str) -> Result<LockClient, LockError> {
    LockClient::builder(&format!("redis://{user}:pw@127.0.0.1:{}/", server.port()))
        .connect_timeout(Duration::from_secs(2))
        .build()
}

/// Everything works with exactly the documented permissions.
fn full_use(server: &RedisServer, name: &str, strategy: Strategy, fencing: bool) {
    let a = client(server, name).unwrap_or_else(|e| panic!("{name}: {}", e.report()));
    let b = client(server, name).unwrap();
    let key = format!("locks:{name}");
    let build = |c: &LockClient, lease: Duration| {
        let builder = c.lock(key.as_str()).strategy(strategy).check_access();
        let builder = if strategy == Strategy::Classic {
            builder
                .ttl(Duration::from_secs(5))
                .retry(RetryPolicy::standard())
        } else {
            builder.watchdog_lease(lease)
        };
        let builder = if fencing { builder.fencing() } else { builder };
        builder
            .build()
            .unwrap_or_else(|e| panic!("{name}: {}", e.report()))
    };
    // A short watched lease: held past it, the watchdog must have renewed it.
    let la = build(&a, Duration::from_millis(600));
    let lb = build(&b, Duration::from_millis(600));
    let guard = la
        .lock()
        .unwrap_or_else(|e| panic!("{name}: {}", e.report()));
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let got = lb.lock().and_then(|g| g.unlock());
        (got.map_err(|e| e.report()), t.elapsed())
    });
    thread::sleep(Duration::from_millis(1_500));
    assert!(
        guard.is_held().unwrap(),
        "{name}: held past its lease (renewed)"
    );
    assert!(guard.unlock().unwrap(), "{name}: unlock");
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, Ok(true), "{name}: the waiter got it after the release");
    assert!(waited < Duration::from_secs(5), "{name}: waited {waited:?}");
}

#[test]
fn documented_rules_are_enough() {
    init_logging();
    let server = RedisServer::start();
    user(&server, "tok", TOKEN_RULE);
    user(&server, "cls", CLASSIC_RULE);
    user(&server, "ren", REENTRANT_RULE);
    full_use(&server, "tok", Strategy::Token, true);
    full_use(&server, "cls", Strategy::Classic, false);
    full_use(&server, "ren", Strategy::Reentrant, true);
}

/// The rule minus `removed`: `check_access` refuses the lock naming what is missing.
fn refused_without(server: &RedisServer, name: &str, removed: &str, mentions: &[&str]) {
    let rule: Vec<&str> = TOKEN_RULE
        .iter()
        .copied()
        .filter(|r| *r != removed)
        .collect();
    user(server, name, &rule);
    let c = client(server, name).unwrap_or_else(|e| panic!("{name}: {}", e.report()));
    let err = c
        .lock(format!("locks:{name}"))
        .check_access()
        .build()
        .expect_err("a permission is missing");
    assert!(err.is_setup(), "{err:?}");
    let report = err.report();
    for m in mentions {
        assert!(report.contains(m), "{report:?} should mention {m:?}");
    }
}

#[test]
fn a_missing_permission_is_named_before_the_first_acquire() {
    init_logging();
    let server = RedisServer::start();
    refused_without(
        &server,
        "nopub",
        "+publish",
        &["PUBLISH", "NOPERM", "locks:nopub"],
    );
    refused_without(
        &server,
        "nochan",
        "&redisson_lock__channel:{locks:*}",
        &[
            "PUBLISH redisson_lock__channel:{locks:nochan}",
            "SUBSCRIBE",
            "NOPERM",
        ],
    );
    refused_without(&server, "nodel", "+del", &["DEL locks:nodel", "NOPERM"]);
    // Without EVALSHA the client cannot even be built: its open-time check names it.
    let rule: Vec<&str> = TOKEN_RULE
        .iter()
        .copied()
        .filter(|r| *r != "+evalsha")
        .collect();
    user(&server, "nosha", &rule);
    let err = client(&server, "nosha").expect_err("EVALSHA is missing");
    assert!(err.is_setup(), "{err:?}");
    let report = err.report();
    assert!(
        report.contains("EVALSHA") && report.contains("NOPERM"),
        "{report}"
    );
}
