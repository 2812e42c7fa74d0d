//! Set-up faults fail fast and say what is wrong: `build()` opens and checks one connection
//! (AUTH, SELECT, scripting), and lock-time failures name their cause instead of reading as
//! contention or a bare OS error.

mod support;

use std::time::{Duration, Instant};

use redis_dlock::{DistributedLock, LockClient, LockError, RetryPolicy};
use support::{init_logging, RedisServer};

const CONNECT: Duration = Duration::from_millis(500);
/// Slack for a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(2_000);

/// A server whose default user needs the password `secret` (set after start: the fixture's
/// readiness check sends an unauthenticated PING).
fn server_with_password() -> RedisServer {
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("secret")
        .query(&mut server.conn())
        .expect("CONFIG SET requirepass");
    server
}

fn url_with(server: &RedisServer, userinfo: &str, db: u32) -> String {
    format!("redis://{userinfo}127.0.0.1:{}/{db}", server.port())
}

fn open(url: &str) -> (Result<LockClient, LockError>, Duration) {
    let t = Instant::now();
    let r = LockClient::builder(url)
        .connect_timeout(CONNECT)
        .command_timeout(Some(CONNECT))
        .build();
    (r, t.elapsed())
}

/// Asserts a fast `Config` error whose report mentions every word of `mentions`.
#[track_caller]
fn assert_setup(r: Result<LockClient, LockError>, took: Duration, mentions: &[&str]) {
    match r {
        Err(e @ LockError::Config { .. }) => {
            assert!(e.is_config() && !e.is_contention(), "{e:?}");
            let report = e.report();
            for m in mentions {
                assert!(
                    report.to_lowercase().contains(&m.to_lowercase()),
                    "{report:?} should mention {m:?}"
                );
            }
            assert!(
                std::error::Error::source(&e).is_some(),
                "the cause is the source"
            );
            assert!(took < CONNECT + SLACK, "took {took:?}");
        }
        Err(other) => panic!("expected Config, got {other:?}"),
        Ok(_) => panic!("expected Config, got a client"),
    }
}

#[test]
fn wrong_password_unknown_user_and_noauth_fail_at_open() {
    init_logging();
    let server = server_with_password();
    let (r, took) = open(&url_with(&server, ":wrong@", 0));
    assert_setup(r, took, &["authentication", "127.0.0.1"]);
    let (r, took) = open(&url_with(&server, "nobody:secret@", 0));
    assert_setup(r, took, &["authentication"]);
    let (r, took) = open(&url_with(&server, "", 0));
    assert_setup(r, took, &["NOAUTH"]);
    let (r, _) = open(&url_with(&server, ":secret@", 0));
    let c = r.expect("the right password works");
    let lock = c.lock("setup:ok").build().unwrap();
    assert!(lock.try_lock().unwrap().unlock().unwrap());
}

#[test]
fn missing_database_fails_at_open() {
    init_logging();
    let server = RedisServer::start_with(&["--databases", "2"]);
    let (r, took) = open(&url_with(&server, "", 5));
    assert_setup(r, took, &["database"]);
    let (r, _) = open(&url_with(&server, "", 1));
    r.expect("db 1 exists");
}

#[test]
fn unreachable_server_fails_at_open_unless_lazy() {
    init_logging();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let (r, took) = open(&url);
    // A set-up error that names the server and says "refused", fast; but no configuration
    // mistake: transient, to be retried.
    let e = r.expect_err("nothing listens");
    assert!(matches!(e, LockError::Config { .. }), "{e:?}");
    assert!(
        e.is_transient() && !e.is_config() && !e.is_contention(),
        "{e:?}"
    );
    let report = e.report();
    assert!(
        report.contains("refused") && report.contains(&port.to_string()),
        "{report}"
    );
    assert!(took < CONNECT + SLACK, "took {took:?}");
    let lazy = LockClient::builder(&url)
        .connect_timeout(CONNECT)
        .lazy_connect()
        .build()
        .expect("a lazy client does not connect");
    let lock = lazy.lock("setup:lazy").build().unwrap();
    let err = lock.try_lock().expect_err("nothing listens");
    assert!(matches!(err, LockError::Connection { .. }), "{err:?}");
    assert!(!err.is_contention());
}

/// A user without `@scripting`. Differs by server: where the server has `DELIFEQ` and
/// `SET … IFEQ` (Valkey 9.0+), a Token lock without fencing needs no script, so the client is
/// built and such a lock works end to end (wait, release, extend, watchdog renewal), while the
/// locks that run scripts are refused at their `build()`; on other servers (Redis 7.0, Valkey
/// 8.1: no `DELIFEQ`) the client itself is refused at `build()`, saying why.
#[test]
fn user_without_scripting() {
    init_logging();
    let server = RedisServer::start();
    let mut admin = server.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noscript")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-@scripting")
        .query(&mut admin)
        .unwrap();
    let url = url_with(&server, "noscript:pw@", 0);
    let kind = support::server_kind();
    if !kind.has_native_token() {
        let (r, took) = open(&url);
        assert_setup(r, took, &["EVAL", "NOPERM", "DELIFEQ"]);
        return;
    }
    let client = LockClient::builder(&url)
        .connect_timeout(CONNECT)
        .build()
        .unwrap_or_else(|e| panic!("{kind:?}: no script is needed for Token locks: {e}"));
    // check_access() probes without scripts, on the lock's own key: a hold another client has
    // there is left as it was (its value, its lifetime), whatever the probes send.
    let holder = LockClient::open(server.url()).unwrap();
    let held = holder
        .lock("setup:noscript:held")
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let hold = held.try_lock().expect("a free key");
    client
        .lock("setup:noscript:held")
        .check_access()
        .build()
        .expect("everything allowed");
    assert_eq!(
        support::raw::get(&mut admin, "setup:noscript:held").as_deref(),
        Some(hold.value()),
        "the probes changed another client's hold"
    );
    let left = support::raw::pttl(&mut admin, "setup:noscript:held");
    assert!(
        left > 20_000,
        "the probes cut another client's hold to {left} ms"
    );
    assert!(
        hold.unlock().unwrap(),
        "the holder's lock was still its own"
    );
    // Watched (no ttl): the watchdog renews it, natively. check_access() probes without
    // scripts and finds everything allowed.
    let lock = client
        .lock("setup:noscript")
        .watchdog_lease(Duration::from_millis(600))
        .check_access()
        .build()
        .expect("a Token lock without fencing");
    let waiter = client
        .lock("setup:noscript")
        .retry(RetryPolicy::standard().fixed_delay(Duration::from_millis(20)))
        .build()
        .unwrap();
    let mut guard = lock.try_lock().expect("acquire");
    // Past the lease by renewals alone.
    support::wait_renewals(&client, 0, 1, 4);
    assert!(!guard.is_lost(), "renewed by the watchdog");
    guard.extend(Duration::from_secs(5)).expect("extend");
    let queued = client
        .test_hooks()
        .count(redis_dlock::test_hooks::Event::Queued);
    std::thread::scope(|s| {
        let w = s.spawn(|| {
            waiter
                .try_lock_for(Duration::from_secs(5))
                .map(|g| g.unlock())
        });
        support::wait_event(&client, redis_dlock::test_hooks::Event::Queued, queued + 1);
        assert!(guard.unlock().expect("release"));
        let taken = w.join().unwrap().expect("the waiter takes it");
        assert!(taken.expect("and releases it"));
    });
    assert_eq!(support::raw::get(&mut admin, "setup:noscript"), None);
    // The locks that run scripts say so at build().
    let err = client
        .lock("setup:noscript:r")
        .strategy(redis_dlock::Strategy::Reentrant)
        .build()
        .expect_err("a reentrant lock runs scripts");
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    assert!(err.report().contains("scripts"), "{}", err.report());
    let err = client
        .lock("setup:noscript:f")
        .fencing()
        .build()
        .expect_err("fencing runs a script");
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    // A user denied DELIFEQ as well is told so by check_access(), without scripts.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noscript")
        .arg("-delifeq")
        .query(&mut admin)
        .unwrap();
    let err = client
        .lock("setup:noscript")
        .check_access()
        .build()
        .expect_err("DELIFEQ denied");
    assert!(err.report().contains("DELIFEQ"), "{}", err.report());
}

#[test]
fn renamed_eval_fails_at_open() {
    init_logging();
    let server = RedisServer::start_with(&["--rename-command", "EVALSHA", "\"\""]);
    let (r, took) = open(&server.url());
    assert_setup(r, took, &["EVALSHA", "renamed or disabled"]);
}

/// At lock time: a command without a reply names the server and the timeout.
#[test]
fn no_reply_names_the_server_and_the_timeout() {
    init_logging();
    let server = RedisServer::start();
    let c = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_millis(300)))
        .build()
        .unwrap();
    let lock = c.lock("setup:noreply").build().unwrap();
    assert!(lock.try_lock().unwrap().unlock().unwrap());
    server.pause();
    let err = lock.try_lock().expect_err("paused");
    server.resume();
    assert!(matches!(err, LockError::Connection { .. }), "{err:?}");
    assert!(err.is_timeout() && !err.is_contention(), "{err:?}");
    let report = err.report();
    let expected = format!("no reply from 127.0.0.1:{} within 300 ms", server.port());
    assert!(report.contains(&expected), "{report}");
}

/// At lock time (a lazy client): a wrong password is a set-up fault, reported once the pool
/// gives up opening a connection, never as contention, and not retried for the whole wait.
#[test]
fn wrong_password_at_lock_time_is_setup_not_contention() {
    init_logging();
    let server = server_with_password();
    let c = LockClient::builder(url_with(&server, ":wrong@", 0))
        .connect_timeout(CONNECT)
        .lazy_connect()
        .build()
        .unwrap();
    let lock = c
        .lock("setup:lazy-auth")
        .retry(RetryPolicy::standard().max_wait(Some(Duration::from_secs(20))))
        .build()
        .unwrap();
    let t = Instant::now();
    let err = lock.lock().expect_err("wrong password");
    assert!(err.is_config() && !err.is_contention(), "{err:?}");
    assert!(
        err.report().to_lowercase().contains("auth"),
        "{}",
        err.report()
    );
    assert!(t.elapsed() < CONNECT + SLACK, "took {:?}", t.elapsed());
}

/// A server paused for writes (`CLIENT PAUSE … WRITE`, as Redis's own `FAILOVER` does) still
/// answers the open-time check at once: its probe script is flagged `no-writes`. Unflagged,
/// the check waited for the rest of the pause, and past the connect timeout open failed.
#[test]
fn open_answers_at_once_while_the_server_is_paused_for_writes() {
    init_logging();
    let server = RedisServer::start();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3_000)
        .arg("WRITE")
        .query(&mut server.conn())
        .unwrap();
    let (client, took) = open(&server.url());
    let client = client.expect("open while paused for writes");
    assert!(took < Duration::from_millis(1_500), "open took {took:?}");
    drop(client);
}
