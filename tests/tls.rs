//! Locks over TLS (`rediss://`): real `redis-server`s with a TLS port and certificates made at
//! run time (tests/support/tls.rs). A single server, mutual TLS, a wrong CA, the pub/sub
//! subscriber, the watchdog, Sentinel, Cluster and RedLock.
//!
//! Run with `cargo test --features tls-rustls,tls-rustls-insecure --test tls` (the second
//! feature adds the `#insecure` URL test).
#![cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::ClassicOptions;
use redis_dlock::{
    DistributedLock, LockClient, LockError, RedLockClient, RetryPolicy, Strategy, TokenLock,
};
#[cfg(any(feature = "sentinel", all(feature = "cluster", feature = "tls-rustls")))]
use support::tls::tls_args;
use support::tls::Pki;
#[cfg(all(feature = "cluster", feature = "tls-rustls"))]
use support::Cluster;
use support::{init_logging, raw, wait_until, RedisServer};
#[cfg(feature = "sentinel")]
use support::{Launch, SENTINEL_SERVICE};

/// A client of `server`'s TLS port trusting `pki`'s CA (and presenting its client
/// certificate if `client_cert`).
fn tls_client(server: &RedisServer, pki: &Pki, client_cert: bool) -> LockClient {
    LockClient::builder(server.tls_url())
        .tls_certificates(pki.client_certificates(client_cert))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("TLS client")
}

/// A Token lock whose waits poll only every `poll` (no jitter): a wait that ends well before
/// that was ended by pub/sub.
fn slow_poller(client: &LockClient, key: &str, poll: Duration) -> TokenLock {
    client
        .lock(key)
        .ttl(Duration::from_secs(30))
        .retry(RetryPolicy::standard().fixed_delay(poll).jitter(false))
        .build()
        .expect("build token lock")
        .try_into()
        .expect("the strategy built")
}

fn channel(key: &str) -> String {
    format!("redisson_lock__channel:{{{key}}}")
}

/// `CLIENT LIST` entries as field maps, optionally of one `TYPE`.
fn client_list(conn: &mut redis::Connection, kind: Option<&str>) -> Vec<Vec<(String, String)>> {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("LIST");
    if let Some(kind) = kind {
        cmd.arg("TYPE").arg(kind);
    }
    let list: String = cmd.query(conn).expect("CLIENT LIST");
    list.lines()
        .map(|line| {
            line.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> &'a str {
    entry
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// Connections that came in on `port` (the server side of the socket).
fn connections_on(conn: &mut redis::Connection, port: u16) -> usize {
    let suffix = format!(":{port}");
    client_list(conn, None)
        .iter()
        .filter(|c| field(c, "laddr").ends_with(&suffix))
        .count()
}

/// The whole error chain as text.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(" | ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[test]
fn lock_and_unlock_over_tls() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("lock");
    let server = RedisServer::start_tls(&pki, false);
    let client = tls_client(&server, &pki, false);
    let other = tls_client(&server, &pki, false);
    let mut admin = server.conn();
    for strategy in [
        Strategy::Token,
        Strategy::Classic(ClassicOptions::new()),
        Strategy::Reentrant,
    ] {
        let key = format!("tls:lock:{strategy:?}");
        let lock = client
            .lock(&key)
            .strategy(strategy)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("build");
        let guard = lock.try_lock().expect("free lock");
        assert!(raw::exists(&mut admin, &key), "{key} not held in Redis");
        assert!(matches!(
            other
                .lock(&key)
                .strategy(strategy)
                .build()
                .expect("build")
                .try_lock(),
            Err(LockError::Held { .. })
        ));
        assert!(guard.unlock().expect("unlock"), "{key}");
        assert!(!raw::exists(&mut admin, &key), "{key} still in Redis");
    }
    // The commands went over the TLS port: the plain one carries only this test's own
    // connection.
    assert!(connections_on(&mut admin, server.tls_port()) >= 1);
    assert_eq!(connections_on(&mut admin, server.port()), 1);
}

#[cfg(feature = "test-hooks")]
#[test]
fn pubsub_wakes_a_waiter_over_tls_on_one_subscriber_connection() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("pubsub");
    let server = RedisServer::start_tls(&pki, false);
    let (a, b) = (
        tls_client(&server, &pki, false),
        tls_client(&server, &pki, false),
    );
    let mut admin = server.conn();
    let keys = ["tls:wake:1", "tls:wake:2"];
    let holders: Vec<redis_dlock::Lock> = keys
        .iter()
        .map(|k| {
            a.lock(*k)
                .ttl(Duration::from_secs(30))
                .build()
                .expect("build")
        })
        .collect();
    let held: Vec<_> = holders
        .iter()
        .map(|l| l.try_lock().expect("holder"))
        .collect();
    // Two threads of client B wait, each polling only every 10 s.
    let started = Instant::now();
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| {
            let lock = slow_poller(&b, k, Duration::from_secs(10));
            thread::spawn(move || {
                let got = lock.try_lock_for(Duration::from_secs(20)).map(|g| {
                    assert!(g.unlock().expect("unlock"));
                });
                (got, started.elapsed())
            })
        })
        .collect();
    for k in keys {
        assert!(
            wait_until(Duration::from_secs(5), || raw::numsub(
                &mut admin,
                &channel(k)
            ) == 1),
            "nobody subscribed to {k}"
        );
    }
    // One subscriber connection for the client, over TLS, named, with both channels.
    let pubsub = client_list(&mut admin, Some("pubsub"));
    assert_eq!(pubsub.len(), 1, "{pubsub:?}");
    assert_eq!(field(&pubsub[0], "name"), "dlock-subscriber");
    assert_eq!(field(&pubsub[0], "sub"), "2");
    assert!(
        field(&pubsub[0], "laddr").ends_with(&format!(":{}", server.tls_port())),
        "{pubsub:?}"
    );
    support::wait_listening(&b, 2, 4);
    let released = Instant::now();
    for g in held {
        assert!(g.unlock().expect("holder unlock"));
    }
    for w in waiters {
        let (got, _) = w.join().expect("waiter thread");
        got.expect("the waiter got the lock");
    }
    // Woken by the release, not by its 10 s poll nor by the 30 s lease.
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "the waiters took {waited:?} after the release"
    );
}

#[test]
fn watchdog_renews_over_tls() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("watchdog");
    let server = RedisServer::start_tls(&pki, false);
    let client = tls_client(&server, &pki, false);
    let mut admin = server.conn();
    let key = "tls:watched";
    let lease = Duration::from_millis(600);
    let lock = client
        .lock(key)
        .watchdog_lease(lease)
        .build()
        .expect("watched lock");
    let guard = lock.try_lock().expect("free lock");
    assert!(guard.lease().is_watched());
    let start = Instant::now();
    let mut late_max = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let pttl = raw::pttl(&mut admin, key);
        assert!(pttl > 0, "PTTL {pttl} after {:?}", start.elapsed());
        if start.elapsed() >= Duration::from_millis(1500) {
            late_max = late_max.max(pttl);
        }
        // Time under test: the PTTL is sampled over 2 s.
        thread::sleep(Duration::from_millis(50));
    }
    // Unrenewed, the key would have expired 0.6 s after the acquire.
    assert!(late_max > 300, "PTTL after 1.5 s at most {late_max} ms");
    assert!(guard.unlock().expect("unlock"));
    assert!(!raw::exists(&mut admin, key));
}

#[test]
fn mutual_tls_needs_the_client_certificate() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("mtls");
    let server = RedisServer::start_tls(&pki, true);
    let with_cert = tls_client(&server, &pki, true);
    let lock = with_cert.lock("tls:mtls").build().expect("build");
    let guard = lock.try_lock().expect("lock with a client certificate");
    assert!(guard.unlock().expect("unlock"));

    // The client's open-time check makes the handshake: the fault is reported by build(), as
    // a set-up fault, not at the first lock.
    let t = std::time::Instant::now();
    let err = LockClient::builder(server.tls_url())
        .tls_certificates(pki.client_certificates(false))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect_err("no client certificate: refused");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    let text = chain(&err);
    eprintln!("no client certificate: {text}");
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    // The server's alert (TLS 1.3: rustls "received fatal alert: CertificateRequired", OpenSSL
    // "tlsv13 alert certificate required"), or, with OpenSSL when the server's reset comes
    // before its alert is read, "the server closed the connection during the TLS set-up".
    assert!(
        (text.contains("TLS handshake failed")
            || text.contains("the server closed the connection during the TLS set-up"))
            && text.to_lowercase().contains("certificate"),
        "{text}"
    );
}

#[test]
fn wrong_ca_is_a_clear_tls_error() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("server");
    let other = Pki::generate("other");
    let server = RedisServer::start_tls(&pki, false);
    let t = std::time::Instant::now();
    let err = LockClient::builder(server.tls_url())
        .tls_certificates(other.client_certificates(false))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect_err("a server certificate from an unknown CA");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    let text = chain(&err).to_lowercase();
    eprintln!("wrong CA: {}", chain(&err));
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    // A lazy client reports the same at its first lock, as a connection failure.
    let lazy = LockClient::builder(server.tls_url())
        .tls_certificates(other.client_certificates(false))
        .connect_timeout(Duration::from_millis(500))
        .lazy_connect()
        .build()
        .expect("a lazy client does not connect");
    let late = lazy
        .lock("wrong-ca")
        .build()
        .expect("build")
        .try_lock()
        .expect_err("a server certificate from an unknown CA");
    assert!(matches!(late, LockError::Connection { .. }), "{late:?}");
    assert!(
        chain(&late).to_lowercase().contains("certificate"),
        "{}",
        chain(&late)
    );
    assert!(
        text.contains("tls handshake failed") && text.contains("certificate"),
        "the error does not say TLS and certificate: {text}"
    );
}

#[cfg(feature = "sentinel")]
#[test]
fn sentinel_over_tls() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("sentinel");
    let master = RedisServer::start_tls(&pki, false);
    let master_tls = master.tls_port();
    let sentinel = RedisServer::start_custom(|port, dir| {
        let conf = dir.join(format!("sentinel-{port}.conf"));
        let text = format!(
            "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master_tls} 1\n\
             sentinel down-after-milliseconds {SENTINEL_SERVICE} 5000\n\
             sentinel resolve-hostnames no\n\
             tls-replication yes\n"
        );
        std::fs::write(&conf, text).expect("write sentinel config");
        let mut args = vec!["--sentinel".to_owned()];
        args.extend(tls_args(&pki, dir, false));
        Launch {
            conf: Some(conf),
            args,
        }
    });
    // The Sentinel itself reaches the master over TLS.
    let mut sconn = sentinel.conn();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let info: Vec<String> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(SENTINEL_SERVICE)
                .query(&mut sconn)
                .unwrap_or_default();
            info.windows(2)
                .any(|w| w[0] == "role-reported" && w[1] == "master")
                && info.windows(2).any(|w| w[0] == "flags" && w[1] == "master")
        }),
        "the Sentinel did not reach the master over TLS"
    );
    let build = || {
        LockClient::sentinel_builder(&[sentinel.tls_url()], SENTINEL_SERVICE)
            .tls_certificates(pki.client_certificates(false))
            .build()
            .expect("Sentinel TLS client")
    };
    let (a, b) = (build(), build());
    let mut admin = master.conn();
    let key = "tls:sentinel";
    let holder = a
        .lock(key)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("build");
    let held = holder.try_lock().expect("lock through the Sentinel");
    assert!(raw::exists(&mut admin, key));
    let waiter = slow_poller(&b, key, Duration::from_secs(10));
    let waiting = thread::spawn(move || {
        waiter
            .try_lock_for(Duration::from_secs(20))
            .map(|g| assert!(g.unlock().expect("unlock")))
    });
    assert!(wait_until(Duration::from_secs(5), || raw::numsub(
        &mut admin,
        &channel(key)
    ) == 1));
    let released = Instant::now();
    assert!(held.unlock().expect("unlock"));
    waiting
        .join()
        .expect("waiter thread")
        .expect("the waiter got the lock");
    assert!(released.elapsed() < Duration::from_secs(3));
    // Lock traffic and the subscriber reached the master on its TLS port only.
    assert!(connections_on(&mut admin, master_tls) >= 1);
    assert_eq!(connections_on(&mut admin, master.port()), 1);
}

#[cfg(feature = "cluster")]
/// Custom certificates for a cluster need rustls (redis-rs's cluster client takes them only
/// with `tls-rustls`).
#[cfg(feature = "tls-rustls")]
#[test]
fn cluster_over_tls() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("cluster");
    let cluster = Cluster::start_with(3, |_, dir| {
        let mut args = tls_args(&pki, dir, false);
        args.extend(["--tls-cluster".to_owned(), "yes".to_owned()]);
        args
    });
    let tls_urls: Vec<String> = cluster.nodes().iter().map(|n| n.tls_url()).collect();
    let client = LockClient::cluster_builder(&tls_urls)
        .tls_certificates(pki.client_certificates(false))
        .build()
        .expect("cluster TLS client");
    // Keys on every node.
    for node in 0..3 {
        let key = cluster.key_on(node, "tls:cluster");
        let lock = client
            .lock(&key)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("build");
        let guard = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("lock {key} on node {node}: {e}"));
        assert!(raw::exists(&mut cluster.conn_for_key(&key), &key));
        assert!(guard.unlock().expect("unlock"));
        assert!(!raw::exists(&mut cluster.conn_for_key(&key), &key));
    }
    // A waiter is woken through a node's subscriber over TLS.
    let key = cluster.key_on(1, "tls:cluster:wake");
    let holder = client
        .lock(&key)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("build");
    let held = holder.try_lock().expect("holder");
    let other = LockClient::cluster_builder(&tls_urls)
        .tls_certificates(pki.client_certificates(false))
        .build()
        .expect("cluster TLS client");
    let waiter = slow_poller(&other, &key, Duration::from_secs(10));
    let waiting = thread::spawn(move || {
        waiter
            .try_lock_for(Duration::from_secs(20))
            .map(|g| assert!(g.unlock().expect("unlock")))
    });
    let subscribed = || {
        cluster
            .nodes()
            .iter()
            .map(|n| raw::numsub(&mut n.conn(), &channel(&key)))
            .sum::<i64>()
            == 1
    };
    assert!(wait_until(Duration::from_secs(5), subscribed));
    let released = Instant::now();
    assert!(held.unlock().expect("unlock"));
    waiting
        .join()
        .expect("waiter thread")
        .expect("the waiter got the lock");
    assert!(released.elapsed() < Duration::from_secs(3));
    for node in cluster.nodes() {
        assert_eq!(
            connections_on(&mut node.conn(), node.port()),
            1,
            "plain-port connections besides this check on node {}",
            node.port()
        );
    }
}

#[test]
fn redlock_over_tls() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("redlock");
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_tls(&pki, true)).collect();
    let clients: Vec<LockClient> = servers.iter().map(|s| tls_client(s, &pki, true)).collect();
    // A first TLS handshake (mutual, in a debug build) can take longer than the default node
    // timeout on a loaded machine; the votes would then count as failed.
    let redlock = RedLockClient::from_clients(clients)
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("RedLock client");
    let key = "tls:redlock";
    let lock = redlock
        .lock(key)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("build");
    let guard = lock.try_lock().expect("quorum over TLS");
    // A quorum (2 of 3) is enough to win; the third vote may still be on its way.
    let holding = || {
        servers
            .iter()
            .filter(|s| raw::exists(&mut s.conn(), key))
            .count()
    };
    assert!(holding() >= 2, "held on {} of 3 nodes", holding());
    assert!(guard.unlock().expect("unlock"));
    // Each node's release follows its acquire on that node's worker.
    assert!(
        wait_until(Duration::from_secs(5), || holding() == 0),
        "still held on {} nodes after unlock",
        holding()
    );

    // The same nodes given as `rediss://` URLs: each node is built as `LockClient::builder`
    // builds one (TLS from the URL), with the certificates given through `node_options`.
    let certs = pki.client_certificates(true);
    let urls: Vec<String> = servers.iter().map(|s| s.tls_url()).collect();
    let redlock = RedLockClient::builder(&urls)
        .node_timeout(Duration::from_secs(2))
        .node_options(move |node| node.tls_certificates(certs.clone()))
        .build()
        .expect("RedLock client from URLs");
    let lock = redlock.lock(key).build().expect("build");
    let guard = lock.try_lock().expect("quorum over TLS, nodes from URLs");
    assert!(holding() >= 2, "held on {} of 3 nodes", holding());
    assert!(guard.unlock().expect("unlock"));
}

/// `tls-rustls-insecure`: the `#insecure` URL fragment skips certificate checks (for test
/// set-ups only), so a client that does not know the CA still connects.
#[cfg(feature = "tls-rustls-insecure")]
#[test]
fn insecure_fragment_skips_certificate_checks() {
    if !support::tls_available() {
        return;
    }
    init_logging();
    let pki = Pki::generate("insecure");
    let server = RedisServer::start_tls(&pki, false);
    let client = LockClient::open(format!("{}#insecure", server.tls_url())).expect("client");
    let lock = client.lock("tls:insecure").build().expect("build");
    let guard = lock
        .try_lock()
        .expect("lock without checking the certificate");
    assert!(raw::exists(&mut server.conn(), "tls:insecure"));
    assert!(guard.unlock().expect("unlock"));
}
