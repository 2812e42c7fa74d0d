//! `LockClient::open` and `LockClient::builder` take what redis-rs takes: URLs as `&str` and
//! `&String`, a `ConnectionInfo` built in code, a `ConnectionAddr`, `(host, port)`.

mod support;

use redis_dlock::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use redis_dlock::{LockClient, LockError};
use support::{init_logging, RedisServer};

/// A client works: it takes and releases a lock.
fn works(client: &LockClient, key: &str) {
    let lock = client.lock(key).build().unwrap();
    assert!(lock.try_lock().unwrap().unlock().unwrap(), "{key}");
}

#[test]
fn every_kind_of_target_connects() {
    init_logging();
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("pw")
        .query(&mut server.conn())
        .unwrap();
    let port = server.port();
    let url = format!("redis://:pw@127.0.0.1:{port}/");
    works(&LockClient::open(url.as_str()).unwrap(), "t:str");
    works(&LockClient::open(&url).unwrap(), "t:string-ref");
    works(
        &LockClient::open(url.clone().into_connection_info().unwrap()).unwrap(),
        "t:string",
    );

    // Settings built in code, the password never written into a URL.
    let info: ConnectionInfo = ConnectionAddr::Tcp("127.0.0.1".into(), port)
        .into_connection_info()
        .unwrap();
    let settings = info.redis_settings().clone().set_password("pw");
    let info = info.set_redis_settings(settings);
    works(&LockClient::open(&info).unwrap(), "t:info-ref");
    let client = LockClient::builder(info).pool_size(2).build().unwrap();
    works(&client, "t:info");
    let debug = format!("{:?}", LockClient::builder(url.as_str()));
    assert!(debug.contains(&format!("127.0.0.1:{port}")), "{debug}");
    assert!(!debug.contains("pw"), "no password in Debug: {debug}");

    // Without the password the set-up check names the refusal.
    let err = LockClient::open(("127.0.0.1", port)).unwrap_err();
    assert!(err.is_setup(), "{err:?}");
    let err = LockClient::open(ConnectionAddr::Tcp("127.0.0.1".into(), port)).unwrap_err();
    assert!(err.is_setup(), "{err:?}");
}

#[test]
fn a_malformed_url_fails_at_build() {
    init_logging();
    let builder = LockClient::builder("not a url");
    match builder.build() {
        Err(LockError::Setup { .. }) => {}
        other => panic!("expected Setup, got {other:?}"),
    }
    let server = RedisServer::start();
    works(
        &LockClient::open((String::from("127.0.0.1"), server.port())).unwrap(),
        "t:tuple",
    );
}
