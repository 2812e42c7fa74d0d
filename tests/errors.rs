//! Errors are classified when they are made, from the kind of the reply or of the I/O failure:
//! each test provokes a real failure on a real server (WRONGTYPE, NOPERM, a wrong password, a
//! database the server lacks, READONLY and MASTERDOWN on a replica, a refused connection, a
//! frozen server) and checks every predicate of the error the library returns.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use redis_dlock::{ClassicOptions, LockAdmin};
use redis_dlock::{DistributedLock, LockClient, LockError, Strategy};
use support::{init_logging, wait_until, RedisServer};

/// Which predicates hold: (contention, timeout, transient, config).
fn predicates(e: &LockError) -> (bool, bool, bool, bool) {
    (
        e.is_contention(),
        e.is_timeout(),
        e.is_transient(),
        e.is_config(),
    )
}

const NONE: (bool, bool, bool, bool) = (false, false, false, false);
const TRANSIENT: (bool, bool, bool, bool) = (false, false, true, false);
const CONFIG: (bool, bool, bool, bool) = (false, false, false, true);

/// The server's error code behind a `Redis` error.
fn code(e: &LockError) -> Option<String> {
    match e {
        LockError::Redis { source, .. } => source.code().map(str::to_owned),
        _ => None,
    }
}

fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn wrongtype_from_a_command_and_from_a_script() {
    init_logging();
    let server = RedisServer::start();
    redis::cmd("HSET")
        .arg("e:hash")
        .arg("f")
        .arg("v")
        .exec(&mut server.conn())
        .expect("hset");
    let client = LockClient::open(server.url()).expect("client");
    // Token: a plain command (or its script); Classic: always a script.
    for strategy in [Strategy::Token, Strategy::Classic(ClassicOptions::new())] {
        let lock = client
            .lock("e:hash")
            .strategy(strategy)
            .build()
            .expect("lock");
        let err = lock.try_lock().expect_err("a hash is no lock");
        assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");
        assert_eq!(predicates(&err), NONE, "{err:?}");
    }
}

#[test]
fn noperm_and_a_wrong_password_are_not_transient() {
    init_logging();
    let server = RedisServer::start();
    redis::cmd("ACL")
        .arg(vec![
            "SETUSER", "u", "on", ">pw", "~*", "&*", "+@all", "-set",
        ])
        .exec(&mut server.conn())
        .expect("acl setuser");
    let port = server.port();
    // Classic acquires by script, Token by `SET`, which the user may not send.
    let client = LockClient::open(format!("redis://u:pw@127.0.0.1:{port}/")).expect("client");
    let lock = client.lock("e:noperm").build().expect("lock");
    let err = lock.try_lock().expect_err("SET is denied");
    assert_eq!(code(&err).as_deref(), Some("NOPERM"), "{err:?}");
    assert_eq!(predicates(&err), NONE, "{err:?}");
    assert!(err.is_access_denied(), "{err:?}");

    let err =
        LockClient::open(format!("redis://u:nope@127.0.0.1:{port}/")).expect_err("wrong password");
    assert!(err.is_access_denied(), "{err:?}");
    assert!(
        matches!(err, LockError::Config { key: None, .. }),
        "{err:?}"
    );
    assert_eq!(predicates(&err), CONFIG, "{err:?}");
    assert!(err.to_string().contains("authentication"), "{err}");
    // At lock time (a lazy client), after the pool's connect timeout.
    let lazy = LockClient::builder(format!("redis://u:nope@127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(300))
        .lazy_connect()
        .build()
        .expect("lazy client");
    let err = lazy.lock("e:lazy").build().unwrap().try_lock().unwrap_err();
    assert!(
        matches!(err, LockError::Config { key: Some(_), .. }),
        "{err:?}"
    );
    assert_eq!(predicates(&err), CONFIG, "{err:?}");
    assert!(err.is_access_denied(), "{err:?}");
}

#[test]
fn a_database_the_server_lacks_is_config() {
    init_logging();
    let server = RedisServer::start();
    let err = LockClient::open(format!("redis://127.0.0.1:{}/99", server.port()))
        .expect_err("no database 99");
    assert_eq!(predicates(&err), CONFIG, "{err:?}");
    assert!(err.to_string().contains("no database 99"), "{err}");
    assert!(!err.is_access_denied(), "{err:?}");
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
}

#[test]
fn readonly_and_masterdown_on_a_replica_are_transient() {
    init_logging();
    let mut master = RedisServer::start();
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let client = LockClient::open(replica.url()).expect("a replica runs the set-up check");
    let lock = client.lock("e:replica").build().expect("lock");
    let err = lock.try_lock().expect_err("a replica refuses writes");
    assert_eq!(code(&err).as_deref(), Some("READONLY"), "{err:?}");
    assert_eq!(predicates(&err), TRANSIENT, "{err:?}");

    // The master gone, and the replica told not to serve stale data.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-serve-stale-data")
        .arg("no")
        .exec(&mut replica.conn())
        .expect("config set");
    master.stop();
    // A write still gets READONLY; a read (the state query's script) gets MASTERDOWN.
    let mut last = None;
    let answered = wait_until(Duration::from_secs(10), || {
        let Err(err) = lock.state() else {
            return false;
        };
        let down = code(&err).as_deref() == Some("MASTERDOWN");
        last = Some(err);
        down
    });
    let err = last.expect("tried");
    assert!(answered, "the replica never answered MASTERDOWN: {err:?}");
    assert_eq!(predicates(&err), TRANSIENT, "{err:?}");
}

#[test]
fn a_refused_connection_is_transient() {
    init_logging();
    let client = LockClient::builder(format!("redis://127.0.0.1:{}/", closed_port()))
        .connect_timeout(Duration::from_millis(300))
        .lazy_connect()
        .build()
        .expect("lazy client");
    let err = client
        .lock("e:refused")
        .build()
        .unwrap()
        .try_lock()
        .unwrap_err();
    assert!(matches!(err, LockError::Connection { .. }), "{err:?}");
    assert_eq!(predicates(&err), TRANSIENT, "{err:?}");
    // At open time: a Config error of the set-up step, but no mistake: transient, so that a
    // service that starts while Redis restarts retries instead of giving up.
    let err = LockClient::open(format!("redis://127.0.0.1:{}/", closed_port())).unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    assert_eq!(predicates(&err), TRANSIENT, "{err:?}");
    assert!(!err.is_access_denied(), "{err:?}");
    assert!(err.to_string().contains("refused"), "{err}");
}

/// `report()` writes each cause once: redis-rs's errors print their own source in their
/// `Display` as well, which gave "Connection refused (os error 111): Connection refused (os
/// error 111)".
#[track_caller]
fn assert_no_repeated_cause(report: &str) {
    let parts: Vec<&str> = report.split(": ").map(str::trim).collect();
    for (i, a) in parts.iter().enumerate() {
        for b in &parts[i + 1..] {
            assert!(
                a.len() < 8 || a != b,
                "{a:?} is written twice in {report:?}"
            );
        }
    }
    // Any repeated run of 20 characters or more.
    let bytes = report.as_bytes();
    for len in [20usize] {
        for start in 0..bytes.len().saturating_sub(len) {
            let piece = &report[start..];
            let Some(piece) = piece.get(..len) else {
                continue;
            };
            assert!(
                report.matches(piece).count() == 1,
                "{piece:?} is written twice in {report:?}"
            );
        }
    }
}

#[test]
fn report_writes_each_cause_once() {
    init_logging();
    // Refused, at open time and at lock time (a lazy client).
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    let err = LockClient::open(url.as_str()).unwrap_err();
    assert!(err.report().contains("refused"), "{}", err.report());
    assert_no_repeated_cause(&err.report());
    let lazy = LockClient::builder(url.as_str())
        .connect_timeout(Duration::from_millis(300))
        .lazy_connect()
        .build()
        .expect("lazy client");
    let err = lazy
        .lock("e:report")
        .build()
        .unwrap()
        .try_lock()
        .unwrap_err();
    assert!(
        err.report().to_lowercase().contains("refused"),
        "{}",
        err.report()
    );
    assert_no_repeated_cause(&err.report());

    // NOAUTH: a server with a password, a client without one.
    let server = RedisServer::start();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("secret")
        .exec(&mut server.conn())
        .expect("CONFIG SET requirepass");
    let err = LockClient::open(server.url()).unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert!(err.report().contains("NOAUTH"), "{}", err.report());
    assert_no_repeated_cause(&err.report());
    // A wrong password, at lock time.
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let lazy = LockClient::builder(wrong)
        .connect_timeout(Duration::from_millis(500))
        .lazy_connect()
        .build()
        .expect("lazy client");
    let err = lazy
        .lock("e:report")
        .build()
        .unwrap()
        .try_lock()
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert_no_repeated_cause(&err.report());
}

/// The check above can fail: a chain whose cause prints its source in its own `Display`, as
/// redis-rs's do, is caught when written naively.
#[test]
#[should_panic(expected = "written twice")]
fn the_repeat_check_sees_a_repeated_cause() {
    assert_no_repeated_cause(
        "redis-dlock client: connection to 127.0.0.1:1 refused: Connection refused (os error \
         111): Connection refused (os error 111)",
    );
}

#[test]
fn no_reply_from_a_frozen_server_is_a_timeout_and_not_transient() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .command_timeout(Some(Duration::from_millis(300)))
        .build()
        .expect("client");
    let lock = client.lock("e:frozen").build().expect("lock");
    lock.try_lock().expect("free").unlock().expect("unlock");
    server.pause();
    let silent = lock.try_lock();
    let opened = LockClient::builder(server.url())
        .connect_timeout(Duration::from_millis(300))
        .build();
    server.resume();
    let err = silent.expect_err("no reply");
    assert!(matches!(err, LockError::Connection { .. }), "{err:?}");
    assert_eq!(predicates(&err), (false, true, false, false), "{err:?}");
    // At open time: a Config error of the set-up step that says the server did not answer:
    // transient, not a mistake.
    let err = opened.expect_err("no answer");
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    assert_eq!(predicates(&err), TRANSIENT, "{err:?}");
}
