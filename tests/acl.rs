//! Least privilege: an ACL user with exactly the permissions docs/production.md lists for a
//! strategy can use it fully (lock, unlock, pub/sub wake-ups, watchdog renewal, fencing);
//! take one permission away and the client says which command and NOPERM before the first
//! acquire.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::{DistributedLock, LockClient, LockError, RetryPolicy, Strategy, WakeUp};
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

/// The fair lock's rule: its key, the queue's two sorted sets and the fencing counter, and
/// every client's grant channel (a release publishes the grant on the grantee's channel).
const FAIR_RULE: &[&str] = &[
    "~locks:*",
    "~dlock_fair_q:{locks:*}",
    "~dlock_fair_d:{locks:*}",
    "~dlock_fence:{locks:*}",
    "&dlock_fair_ch:*",
    "+set",
    "+get",
    "+exists",
    "+del",
    "+incr",
    "+time",
    "+zadd",
    "+zrem",
    "+zpopmin",
    "+zrangebyscore",
    "+zscore",
    "+zrank",
    "+pttl",
    "+pexpire",
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
    LockClient::builder(format!("redis://{user}:pw@127.0.0.1:{}/", server.port()))
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
        let builder = if strategy == Strategy::Classic(ClassicOptions::new()) {
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
    // Time under test: held past its lease.
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
    full_use(
        &server,
        "cls",
        Strategy::Classic(ClassicOptions::new()),
        false,
    );
    full_use(&server, "ren", Strategy::Reentrant, true);
}

/// The fair lock with exactly its documented rule, fenced and not: the waiter in another
/// client is granted the lock by the release, published on that client's channel.
#[test]
fn documented_fair_rule_is_enough() {
    init_logging();
    let server = RedisServer::start();
    user(&server, "fair", FAIR_RULE);
    user(&server, "fairplain", FAIR_RULE);
    full_use(&server, "fair", Strategy::Fair, true);
    full_use(&server, "fairplain", Strategy::Fair, false);
}

/// The rule minus `removed`: `check_access` refuses the lock naming what is missing.
fn refused_without(server: &RedisServer, name: &str, removed: &str, mentions: &[&str]) {
    refused_without_in(server, TOKEN_RULE, Strategy::Token, name, removed, mentions);
}

/// [`refused_without`] for `strategy` with its `rule` (fenced, so that the counter is checked).
fn refused_without_in(
    server: &RedisServer,
    rule: &[&str],
    strategy: Strategy,
    name: &str,
    removed: &str,
    mentions: &[&str],
) {
    assert!(rule.contains(&removed), "{removed} is in the rule");
    let rule: Vec<&str> = rule.iter().copied().filter(|r| *r != removed).collect();
    user(server, name, &rule);
    let c = client(server, name).unwrap_or_else(|e| panic!("{name}: {}", e.report()));
    let err = c
        .lock(format!("locks:{name}"))
        .strategy(strategy)
        .fencing()
        .check_access()
        .build()
        .expect_err("a permission is missing");
    assert!(err.is_config(), "{err:?}");
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
    assert!(err.is_config(), "{err:?}");
    let report = err.report();
    assert!(
        report.contains("EVALSHA") && report.contains("NOPERM"),
        "{report}"
    );
}

#[test]
fn a_missing_fair_permission_is_named_before_the_first_acquire() {
    init_logging();
    let server = RedisServer::start();
    refused_without_in(
        &server,
        FAIR_RULE,
        Strategy::Fair,
        "nozadd",
        "+zadd",
        &[
            "ZADD dlock_fair_q:{locks:nozadd}",
            "ZADD dlock_fair_d:{locks:nozadd}",
            "NOPERM",
        ],
    );
    refused_without_in(
        &server,
        FAIR_RULE,
        Strategy::Fair,
        "notime",
        "+time",
        &["TIME", "NOPERM"],
    );
    refused_without_in(
        &server,
        FAIR_RULE,
        Strategy::Fair,
        "noqueue",
        "~dlock_fair_q:{locks:*}",
        &["EVALSHA", "dlock_fair_q:{locks:noqueue}", "NOPERM"],
    );
    refused_without_in(
        &server,
        FAIR_RULE,
        Strategy::Fair,
        "nofence",
        "~dlock_fence:{locks:*}",
        &["INCR dlock_fence:{locks:nofence}", "NOPERM"],
    );
    refused_without_in(
        &server,
        FAIR_RULE,
        Strategy::Fair,
        "nofairch",
        "&dlock_fair_ch:*",
        &[
            "PUBLISH dlock_fair_ch:",
            "SUBSCRIBE dlock_fair_ch:",
            "NOPERM",
        ],
    );

    // Its own grant channel is not enough: a release publishes on the next waiter's client's
    // channel, whoever that is.
    user(&server, "ownch", FAIR_RULE);
    let c = client(&server, "ownch").unwrap();
    let own = c
        .lock("locks:ownch")
        .strategy(Strategy::Fair)
        .build()
        .map(|l| {
            <&redis_dlock::FairLock>::try_from(&l)
                .unwrap()
                .channel()
                .to_owned()
        })
        .unwrap();
    let own_rule = format!("&{own}");
    let rule: Vec<&str> = FAIR_RULE
        .iter()
        .map(|r| {
            if *r == "&dlock_fair_ch:*" {
                own_rule.as_str()
            } else {
                *r
            }
        })
        .collect();
    user(&server, "ownch", &rule);
    let err = c
        .lock("locks:ownch")
        .strategy(Strategy::Fair)
        .check_access()
        .build()
        .expect_err("another client's grant channel is denied");
    assert!(err.is_config(), "{err:?}");
    let report = err.report();
    assert!(
        report.contains("PUBLISH dlock_fair_ch:") && report.contains("NOPERM"),
        "{report}"
    );
    assert!(
        !report.contains(&format!("PUBLISH {own} ")) && !report.contains("SUBSCRIBE"),
        "its own channel is allowed: {report}"
    );

    // wake_up stays refused for the fair lock, with or without the check.
    let err = c
        .lock("locks:ownch")
        .strategy(Strategy::Fair)
        .wake_up(WakeUp::Polling)
        .check_access()
        .build()
        .expect_err("wake_up does not apply");
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
}

/// Differs by server: on Valkey the client learns the native commands when its user may ask
/// (`+info +command`), and a Token lock then sends `DELIFEQ` (9.0+) and `SET … IFEQ` (8.1+):
/// `check_access()` checks them, and names `DELIFEQ` when the rule lacks it. Where the user may
/// not ask, or on Redis, the documented rule is enough (covered by the tests above).
#[test]
fn on_valkey_the_native_commands_are_checked_too() {
    init_logging();
    let kind = support::server_kind();
    let server = RedisServer::start();
    let mut rule: Vec<&str> = TOKEN_RULE.to_vec();
    rule.extend(["+info", "+command|info"]);
    user(&server, "asks", &rule);
    let c = client(&server, "asks").unwrap_or_else(|e| panic!("asks: {}", e.report()));
    let r = c.lock("locks:asks").check_access().build();
    if !kind.has_native_token() {
        // Redis 7.0 has neither command; Valkey 8.1 has SET … IFEQ, which `+set` allows.
        r.unwrap_or_else(|e| panic!("{kind:?}: {}", e.report()));
        return;
    }
    let err = r.expect_err("DELIFEQ is not in the rule");
    assert!(
        err.report().contains("DELIFEQ locks:asks"),
        "{}",
        err.report()
    );
    rule.push("+delifeq");
    user(&server, "asks", &rule);
    let c = client(&server, "asks").unwrap();
    let lock = c
        .lock("locks:asks")
        .check_access()
        .build()
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let guard = lock.try_lock().expect("acquire");
    assert!(guard.unlock().expect("a native release"));
}
