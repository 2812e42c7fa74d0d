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

/// The semaphore's rule for names under `locks:*`: its count at the name, Redisson's sorted
/// set of permits `{name}:timeout`, and its channel `redisson_sc:{name}`.
const SEMAPHORE_RULE: &[&str] = &[
    "~locks:*",
    "~{locks:*}:timeout",
    "&redisson_sc:{locks:*}",
    "+get",
    "+set",
    "+incrby",
    "+decrby",
    "+pttl",
    "+pexpire",
    "+time",
    "+zadd",
    "+zrem",
    "+zscore",
    "+zrange",
    "+zrangebyscore",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+eval",
    "+evalsha",
];

/// The multi-lock's rule for keys under `locks:*`: the keys, and their Token channels.
const MULTI_RULE: &[&str] = &[
    "~locks:*",
    "&redisson_lock__channel:{locks:*}",
    "+get",
    "+set",
    "+pttl",
    "+del",
    "+pexpire",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+eval",
    "+evalsha",
];

/// A client of user `name`, whose rule is `rule` without `removed` (the client itself builds).
fn client_without(server: &RedisServer, rule: &[&str], name: &str, removed: &str) -> LockClient {
    assert!(rule.contains(&removed), "{removed} is in the rule");
    let rule: Vec<&str> = rule.iter().copied().filter(|r| *r != removed).collect();
    user(server, name, &rule);
    client(server, name).unwrap_or_else(|e| panic!("{name}: {}", e.report()))
}

/// `err` is the configuration error of a denied command, naming each of `mentions`; its report.
fn assert_denied(err: LockError, mentions: &[&str]) -> String {
    assert!(err.is_config(), "{err:?}");
    let report = err.report();
    for m in mentions {
        assert!(report.contains(m), "{report:?} should mention {m:?}");
    }
    report
}

/// A semaphore with exactly its documented rule: checked at `build()`, its watched permit
/// renewed past its lease, released, and the waiter of another client given it.
#[test]
fn documented_semaphore_rule_is_enough() {
    init_logging();
    let server = RedisServer::start();
    user(&server, "sem", SEMAPHORE_RULE);
    let a = client(&server, "sem").unwrap_or_else(|e| panic!("sem: {}", e.report()));
    let b = client(&server, "sem").unwrap();
    let build = |c: &LockClient| {
        c.semaphore("locks:sem")
            .watchdog_lease(Duration::from_millis(600))
            .check_access()
            .build()
            .unwrap_or_else(|e| panic!("sem: {}", e.report()))
    };
    let (sa, sb) = (build(&a), build(&b));
    assert!(sa.try_set_permits(1).unwrap(), "the count is set");
    let permit = sa
        .acquire()
        .unwrap_or_else(|e| panic!("sem: {}", e.report()));
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let got = sb.acquire().and_then(|p| p.release());
        (got.map_err(|e| e.report()), t.elapsed())
    });
    // Time under test: held past its lease.
    thread::sleep(Duration::from_millis(1_500));
    assert!(!permit.is_lost(), "held past its lease (renewed)");
    assert_eq!(sa.available().unwrap(), 0);
    assert!(permit.release().unwrap(), "released, still ours");
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, Ok(true), "the waiter got it after the release");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

/// A multi-lock with exactly its documented rule: checked at `build()`, renewed past its
/// lease, released, and the waiter of another client (over an overlapping set) given it.
#[test]
fn documented_multi_lock_rule_is_enough() {
    init_logging();
    let server = RedisServer::start();
    user(&server, "multi", MULTI_RULE);
    let a = client(&server, "multi").unwrap_or_else(|e| panic!("multi: {}", e.report()));
    let b = client(&server, "multi").unwrap();
    let build = |c: &LockClient, keys: &[&str]| {
        c.multi_lock(keys)
            .watchdog_lease(Duration::from_millis(600))
            .check_access()
            .build()
            .unwrap_or_else(|e| panic!("multi: {}", e.report()))
    };
    // The largest multi-lock: every one of its 1,000 keys checked in the one round trip.
    let many: Vec<String> = (0..1000).map(|i| format!("locks:many{i}")).collect();
    (a.multi_lock(&many).check_access().build())
        .unwrap_or_else(|e| panic!("1,000 keys: {}", e.report()));
    let la = build(&a, &["locks:m1", "locks:m2"]);
    let lb = build(&b, &["locks:m2", "locks:m3"]);
    let guard = la
        .lock()
        .unwrap_or_else(|e| panic!("multi: {}", e.report()));
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let got = lb.lock().and_then(|g| g.unlock());
        (got.map_err(|e| e.report()), t.elapsed())
    });
    // Time under test: held past its lease.
    thread::sleep(Duration::from_millis(1_500));
    assert!(!guard.is_lost(), "held past its lease (renewed)");
    assert!(guard.unlock().unwrap(), "unlock");
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, Ok(true), "the waiter got it after the release");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

#[test]
fn a_missing_semaphore_permission_is_named_before_the_first_acquire() {
    init_logging();
    let server = RedisServer::start();
    let c = client_without(&server, SEMAPHORE_RULE, "nopubsem", "+publish");
    let err =
        (c.semaphore("locks:nopubsem").check_access().build()).expect_err("PUBLISH is missing");
    let report = assert_denied(err, &["PUBLISH redisson_sc:{locks:nopubsem}", "NOPERM"]);
    assert!(
        !report.contains("EVALSHA"),
        "only PUBLISH is denied: {report}"
    );
    // The control: without the check the same user builds it (and would find out at its
    // first release).
    assert!(c.semaphore("locks:nopubsem").build().is_ok());

    let c = client_without(&server, SEMAPHORE_RULE, "nozset", "~{locks:*}:timeout");
    let err = (c.semaphore("locks:nozset").check_access().build())
        .expect_err("the permits' sorted set is denied");
    assert_denied(
        err,
        &[
            "EVALSHA",
            "ZADD {locks:nozset}:timeout",
            "ZRANGEBYSCORE {locks:nozset}:timeout",
            "NOPERM",
        ],
    );

    let c = client_without(&server, SEMAPHORE_RULE, "nosemch", "&redisson_sc:{locks:*}");
    let err =
        (c.semaphore("locks:nosemch").check_access().build()).expect_err("the channel is denied");
    assert_denied(
        err,
        &[
            "PUBLISH redisson_sc:{locks:nosemch}",
            "SUBSCRIBE redisson_sc:{locks:nosemch}",
            "NOPERM",
        ],
    );
}

#[test]
fn a_missing_multi_lock_permission_is_named_before_the_first_acquire() {
    init_logging();
    let server = RedisServer::start();
    let keys = ["locks:nochm1", "locks:nochm2"];
    let c = client_without(
        &server,
        MULTI_RULE,
        "nochm",
        "&redisson_lock__channel:{locks:*}",
    );
    let err = (c.multi_lock(&keys).check_access().build()).expect_err("the channels are denied");
    assert_denied(
        err,
        &[
            "PUBLISH redisson_lock__channel:{locks:nochm1}",
            "PUBLISH redisson_lock__channel:{locks:nochm2}",
            "SUBSCRIBE redisson_lock__channel:{locks:nochm2}",
            "NOPERM",
        ],
    );
    // The control: without the check the same user builds it.
    assert!(c.multi_lock(&keys).build().is_ok());

    let c = client_without(&server, MULTI_RULE, "nodelm", "+del");
    let err = (c
        .multi_lock(&["locks:nodelm1", "locks:nodelm2"])
        .check_access())
    .build()
    .expect_err("DEL is missing");
    assert_denied(err, &["DEL locks:nodelm1", "DEL locks:nodelm2", "NOPERM"]);

    // Every key is checked, not one per group: a key outside the pattern is named.
    user(&server, "onekey", MULTI_RULE);
    let c = client(&server, "onekey").unwrap();
    let err = (c.multi_lock(&["locks:ok", "other:k"]).check_access())
        .build()
        .expect_err("other:k is outside the rule's keys");
    let report = assert_denied(err, &["EVALSHA", "GET other:k", "DEL other:k", "NOPERM"]);
    assert!(
        !report.contains("GET locks:ok"),
        "the allowed key is not named: {report}"
    );
}
