//! `LockClient::open` and `LockClient::builder` take what redis-rs takes: URLs as `&str`,
//! `String` and `url::Url`, a `ConnectionInfo` built in code, a `ConnectionAddr`,
//! `(host, port)`; and `&String`, `&ConnectionInfo`.

mod support;

use redis_dlock::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use redis_dlock::{DistributedLock, LockClient, LockError};
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
    works(&LockClient::open(url.clone()).unwrap(), "t:string");
    works(
        &LockClient::builder(format!("redis://:pw@127.0.0.1:{port}/"))
            .build()
            .unwrap(),
        "t:format",
    );
    let parsed = url::Url::parse(&url).unwrap();
    works(&LockClient::open(parsed).unwrap(), "t:url");
    works(
        &LockClient::open(url.clone().into_connection_info().unwrap()).unwrap(),
        "t:string-info",
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
    assert!(err.is_config(), "{err:?}");
    let err = LockClient::open(ConnectionAddr::Tcp("127.0.0.1".into(), port)).unwrap_err();
    assert!(err.is_config(), "{err:?}");
}

#[test]
fn a_malformed_url_fails_at_build() {
    init_logging();
    let builder = LockClient::builder("not a url");
    match builder.build() {
        Err(LockError::Config { .. }) => {}
        other => panic!("expected Config, got {other:?}"),
    }
    let server = RedisServer::start();
    works(
        &LockClient::open((String::from("127.0.0.1"), server.port())).unwrap(),
        "t:tuple",
    );
}

#[cfg(feature = "cluster")]
#[cfg(feature = "sentinel")]
#[test]
fn sentinel_and_cluster_builders_take_targets_too() {
    init_logging();
    let set = support::Sentinel::start(1, 1);
    let infos: Vec<ConnectionInfo> = set
        .sentinel_urls()
        .iter()
        .map(|u| u.as_str().into_connection_info().unwrap())
        .collect();
    let client = LockClient::sentinel_builder(&infos, support::SENTINEL_SERVICE)
        .build()
        .unwrap();
    works(&client, "t:sentinel-info");
    let urls: Vec<String> = set.sentinel_urls();
    let client = LockClient::sentinel_builder(&urls, support::SENTINEL_SERVICE)
        .build()
        .unwrap();
    works(&client, "t:sentinel-string");
    // A malformed node is reported by build(), as for one server.
    for err in [
        LockClient::sentinel_builder(&["not a url"], support::SENTINEL_SERVICE)
            .build()
            .unwrap_err(),
        LockClient::cluster_builder(&["redis://127.0.0.1:1/", "not a url"])
            .build()
            .unwrap_err(),
    ] {
        assert!(
            matches!(err, LockError::Config { key: None, .. }),
            "{err:?}"
        );
    }
}
