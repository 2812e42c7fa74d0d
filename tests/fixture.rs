//! Tests of the integration-test fixture itself (`tests/support`).

mod support;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{init_logging, wait_until, RedisServer};

fn ping(server: &RedisServer) -> redis::RedisResult<String> {
    let mut conn = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    redis::cmd("PING").query(&mut conn)
}

/// `kill -0 pid`: does a process with this pid exist (and may we signal it)?
fn pid_alive(pid: u32) -> bool {
    Command::new("kill")
        .arg("-0")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn two_servers_started_concurrently_get_different_ports() {
    init_logging();
    let (a, b) = thread::scope(|s| {
        let a = s.spawn(RedisServer::start);
        let b = s.spawn(RedisServer::start);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    assert_ne!(a.port(), 6379);
    assert_ne!(b.port(), 6379);
    assert_eq!(a.url(), format!("redis://127.0.0.1:{}/", a.port()));
    assert_eq!(ping(&a).unwrap(), "PONG");
    assert_eq!(ping(&b).unwrap(), "PONG");
    assert!(a.is_running());
    assert!(b.is_running());

    // They really are separate data sets.
    let mut ca = a.conn();
    let mut cb = b.conn();
    let _: () = redis::cmd("SET").arg("k").arg("a").query(&mut ca).unwrap();
    let got: Option<String> = redis::cmd("GET").arg("k").query(&mut cb).unwrap();
    assert_eq!(got, None);
}

#[test]
fn pause_times_out_and_resume_recovers() {
    init_logging();
    let server = RedisServer::start();
    let mut conn = server.conn();
    conn.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");

    server.pause();
    assert!(server.is_running(), "a paused server is still running");
    let started = Instant::now();
    let err = redis::cmd("PING")
        .query::<String>(&mut conn)
        .expect_err("PING against a paused server must fail");
    let elapsed = started.elapsed();
    assert!(err.is_timeout(), "expected a timeout error, got: {err:?}");
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3),
        "timeout took {elapsed:?}"
    );

    server.resume();
    // The timed-out connection is out of sync; a fresh one must work.
    let mut conn = server.conn();
    conn.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn stop_makes_connections_fail() {
    init_logging();
    let mut server = RedisServer::start();
    let pid = server.pid();
    let mut conn = server.conn();
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");

    server.stop();
    assert!(!server.is_running());
    assert!(!pid_alive(pid), "process {pid} still exists after stop()");

    let err = redis::cmd("PING")
        .query::<String>(&mut conn)
        .expect_err("existing connection must fail after stop()");
    assert!(err.is_io_error() || err.is_connection_dropped(), "{err:?}");

    let err = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .err()
        .expect("new connection must fail after stop()");
    assert!(err.is_connection_refusal(), "{err:?}");

    // stop() on a stopped server is a no-op.
    server.stop();
}

#[test]
fn stop_of_a_paused_server_works() {
    init_logging();
    let mut server = RedisServer::start();
    let pid = server.pid();
    server.pause();
    let started = Instant::now();
    server.stop();
    assert!(!server.is_running());
    assert!(!pid_alive(pid));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn restart_same_port_answers_and_data_is_gone() {
    init_logging();
    let mut server = RedisServer::start();
    let port = server.port();
    let old_pid = server.pid();
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("key")
        .arg("v")
        .query(&mut conn)
        .unwrap();
    let got: Option<String> = redis::cmd("GET").arg("key").query(&mut conn).unwrap();
    assert_eq!(got.as_deref(), Some("v"));

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(server.is_running());
    assert!(!pid_alive(old_pid));
    assert_eq!(ping(&server).unwrap(), "PONG");
    let mut conn = server.conn();
    let got: Option<String> = redis::cmd("GET").arg("key").query(&mut conn).unwrap();
    assert_eq!(got, None, "data must not survive a restart");

    // Restart after a crash also works.
    server.kill();
    assert!(!server.is_running());
    assert!(ping(&server).is_err());
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(ping(&server).unwrap(), "PONG");
}

#[test]
fn kill_is_immediate() {
    init_logging();
    let mut server = RedisServer::start();
    let pid = server.pid();
    server.kill();
    assert!(!server.is_running());
    assert!(!pid_alive(pid));
    server.kill();
}

#[test]
fn drop_kills_the_process_and_removes_the_dir() {
    init_logging();
    let server = RedisServer::start();
    let pid = server.pid();
    let port = server.port();
    let dir = server.dir().to_path_buf();
    assert!(pid_alive(pid));
    assert!(dir.join("redis.log").exists());
    drop(server);
    assert!(!dir.exists(), "temp dir {} survived drop", dir.display());
    assert!(!pid_alive(pid), "redis-server {pid} survived drop");
    assert!(redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(1))
        .is_err());
}

#[test]
fn drop_of_a_paused_server_kills_it() {
    init_logging();
    let server = RedisServer::start();
    let pid = server.pid();
    server.pause();
    drop(server);
    assert!(!pid_alive(pid));
}

#[test]
fn drop_during_panic_kills_the_process() {
    init_logging();
    let (tx, rx) = std::sync::mpsc::channel();
    let result = thread::spawn(move || {
        let server = RedisServer::start();
        tx.send(server.pid()).unwrap();
        panic!("simulated test failure");
    })
    .join();
    assert!(result.is_err());
    let pid = rx.recv().unwrap();
    assert!(!pid_alive(pid), "redis-server {pid} leaked after a panic");
}

#[test]
fn wait_until_polls_until_true_or_timeout() {
    let start = Instant::now();
    let mut calls = 0;
    assert!(wait_until(Duration::from_secs(2), || {
        calls += 1;
        calls >= 3
    }));
    assert_eq!(calls, 3);
    assert!(start.elapsed() < Duration::from_secs(1));

    let start = Instant::now();
    assert!(!wait_until(Duration::from_millis(50), || false));
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(50), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
}

#[test]
fn init_logging_is_idempotent() {
    init_logging();
    init_logging();
    log::info!("fixture logging works");
}
