//! Follows Sentinel's `+switch-master` announcements, so that a Sentinel client stops using the
//! old master as soon as a failover is announced, not when the old master is reconfigured.
//!
//! Without it, pooled connections find out about a failover only by an error: an I/O error or
//! a timeout when the old master died, a `READONLY` reply once Sentinel has turned the old
//! master into a replica. After a graceful failover (`SENTINEL FAILOVER`, or a master that was
//! only partitioned away) the old master keeps answering as a master until Sentinel reconfigures
//! it, which takes up to its 10 s `INFO` period: meanwhile connections opened before the switch
//! take locks on the old master while connections opened after it take them on the new one, so
//! two clients can hold one lock.
//!
//! Each Sentinel client has ONE thread, `dlock-sentinel`, started with the client, holding only
//! a weak reference to the client, and ending once the client is dropped: within [`POLL`]
//! while subscribed, or after the connect or lookup under way (bounded by the client's
//! timeouts). It keeps a pub/sub connection to one Sentinel at a time, subscribed to
//! `+switch-master` (as Redisson and Lettuce do), with a read timeout of [`POLL`] (a silent
//! Sentinel is normal: switches are rare), and moves to the next Sentinel after any other error,
//! [`RECONNECT_DELAY`] later. After every (re)subscription, and every [`CHECK_EVERY`] beside the
//! announcements, it asks the same Sentinel for the current master (`SENTINEL MASTER`, on a
//! second connection), so that a switch announced while it was not subscribed, or one whose
//! announcement this connection has not delivered, is followed anyway. An answer carries
//! Sentinel's configuration epoch: one older than a switch already followed comes from a
//! Sentinel that has not heard of it, and is ignored.
//!
//! A switch for the client's service bumps the generation in [`Switches`](crate::client::switches::Switches) and records the new
//! master's address: every pooled connection remembers the generation it was opened in, and a
//! checkout discards connections of an older one (see `client.rs`); new connections go to the
//! announced master first, after the usual `ROLE` check.
//!
//! A switch also loses releases. A lock held when the replica was promoted exists on the new
//! master (it had been replicated); if its holder released it on the old master only, the key
//! stays on the new master for the rest of its lease, and every other client waits that long
//! (30 s for a watched lock). The new master holds, at each key, the last value written before
//! the old master's stream was cut, so at most one hold per key (per owner for the hash
//! layouts) can be left, but not necessarily the one released last: clients go on locking on
//! the old master for seconds after the promotion. So a Sentinel client remembers its latest
//! release per key (and owner) while its hold could live, and on a switch replays them on the
//! new master (`Janitor::replay`). Each is the release's own owner-checked clean-up (see
//! [`Cleanup`](crate::client::cleanup::Cleanup)), as its strategy describes it; a release whose values carry the client's id
//! (a sweep prefix) is done on whatever value of the client's the key holds on the new master,
//! unless a thread of the client holds it (see `client/live.rs`), not only on the value it
//! released (the releases are remembered by `janitor::remember`). Pipelined; what fails goes
//! to the janitor. See docs/deployments.md, "the replay rule".

use std::thread;
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::client::{LockClient, WeakClient};

/// Read timeout of the subscribed connection: how often the thread checks that its client is
/// still alive.
pub(crate) const POLL: Duration = Duration::from_millis(500);
/// Pause before subscribing again (to the next Sentinel) after an error.
pub(crate) const RECONNECT_DELAY: Duration = Duration::from_millis(200);
/// How often the thread also asks its Sentinel for the current master, beside the
/// announcements: a switch whose `+switch-master` this connection did not deliver is followed
/// within about this long (Redisson's Sentinel scan runs every second too).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The Sentinel channel that announces a completed failover.
const SWITCH_CHANNEL: &str = "+switch-master";
/// The thread's name (at most 15 bytes: Linux truncates thread names).
const THREAD_NAME: &str = "dlock-sentinel";

/// `client` learnt that the master is `master`: after a switch, its recent releases are done
/// again on the new master, owner-checked. False once the client is dropped.
fn learn(client: &WeakClient, master: (String, u16), epoch: Option<u64>, why: &str) -> bool {
    let Some(client) = client.upgrade() else {
        return false;
    };
    let Some(switches) = client.switches() else {
        return true;
    };
    if !switches.learn(master, epoch, why) {
        return true;
    }
    // Releases published on the new master must reach this client's waiters.
    client.wakeups().reconnect();
    let recent = switches.take_recent();
    if !recent.is_empty() {
        log::info!(
            "Sentinel: {} keys released while their holds could still live may hold a value \
             of this client on the new master; releasing it there, owner-checked",
            recent.len()
        );
    }
    client.janitor().replay(&client, recent);
    client.note(crate::client::test_hooks::Event::Switched);
    true
}

/// Settings of the watcher thread.
pub(crate) struct Watch {
    pub(crate) sentinels: Vec<redis::Client>,
    pub(crate) service: String,
    pub(crate) connect_timeout: Duration,
    /// For the Sentinel lookup after each subscription.
    pub(crate) timeout: Duration,
}

/// Starts the watcher thread of `client` (held weakly).
pub(crate) fn start(watch: Watch, client: &LockClient) {
    let weak = client.downgrade();
    if let Err(e) = thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || run(&watch, &weak))
    {
        log::error!(
            "Sentinel: cannot start the thread that follows +switch-master ({e}); connections \
             to an old master are dropped only on their first error"
        );
    }
}

fn run(watch: &Watch, client: &WeakClient) {
    let mut sentinels = watch.sentinels.iter().cycle();
    while client.upgrade().is_some() {
        let Some(sentinel) = sentinels.next() else {
            return;
        };
        match follow(watch, sentinel, client) {
            Ok(()) => return,
            Err(e) => {
                log::debug!(
                    "Sentinel: +switch-master subscription to {:?} ended ({e}); trying the next \
                     Sentinel",
                    sentinel.get_connection_info().addr()
                );
                thread::sleep(RECONNECT_DELAY);
            }
        }
    }
    log::trace!("Sentinel: client dropped, watcher thread ends");
}

/// Subscribes on `sentinel` and follows its announcements until an error (`Err`) or until the
/// client is dropped (`Ok`).
fn follow(watch: &Watch, sentinel: &redis::Client, client: &WeakClient) -> RedisResult<()> {
    let mut con = sentinel.get_connection_with_timeout(watch.connect_timeout)?;
    con.set_write_timeout(Some(watch.timeout))?;
    con.set_read_timeout(Some(watch.timeout))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(SWITCH_CHANNEL)?;
    pubsub.set_read_timeout(Some(POLL))?;
    // Subscribed: a switch from now on is heard. One that happened before is found by asking
    // the same Sentinel at once, on a connection of its own, which is kept for the periodic
    // check.
    let mut query = sentinel.get_connection_with_timeout(watch.connect_timeout)?;
    query.set_write_timeout(Some(watch.timeout))?;
    query.set_read_timeout(Some(watch.timeout))?;
    let mut checked: Option<Instant> = None;
    loop {
        // Beside the announcements, ask every CHECK_EVERY: an announcement this connection
        // did not deliver (seen in tests under load: the Sentinels named the new master while
        // no client heard `+switch-master` for seconds) is not waited for until the old
        // master's first READONLY.
        if checked.is_none_or(|at| at.elapsed() >= CHECK_EVERY) {
            let why = match checked {
                None => "named by a Sentinel",
                Some(_) => "named by a Sentinel, periodic check",
            };
            checked = Some(Instant::now());
            let (named, epoch) = current_master(&mut query, &watch.service)?;
            if !learn(client, named, Some(epoch), why) {
                return Ok(());
            }
        }
        let msg = match pubsub.get_message() {
            Ok(msg) => msg,
            Err(e) if !e.is_timeout() => return Err(e),
            // A silent Sentinel: the client is looked at every `POLL`.
            Err(_) if client.upgrade().is_none() => return Ok(()),
            Err(_) => continue,
        };
        let payload: String = msg.get_payload()?;
        // "<master name> <old ip> <old port> <new ip> <new port>"
        let parts: Vec<&str> = payload.split(' ').collect();
        let [name, _, _, ip, port] = parts.as_slice() else {
            log::debug!("Sentinel: unexpected +switch-master message {payload:?}");
            continue;
        };
        // Another service's switch, or a port that is not one.
        let Some(port) = port.parse::<u16>().ok().filter(|_| *name == watch.service) else {
            continue;
        };
        if !learn(client, ((*ip).to_owned(), port), None, "+switch-master") {
            return Ok(());
        }
    }
}

/// The master the Sentinel on `con` names for `service`, with its configuration epoch
/// (`SENTINEL MASTER`).
fn current_master(con: &mut redis::Connection, service: &str) -> RedisResult<((String, u16), u64)> {
    let fields: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(service)
        .query(con)?;
    let field = |name: &str| fields.get(name).map(String::as_str);
    match (
        field("ip"),
        field("port").and_then(|p| p.parse::<u16>().ok()),
    ) {
        (Some(ip), Some(port)) => {
            let epoch = field("config-epoch").and_then(|e| e.parse().ok());
            Ok(((ip.to_owned(), port), epoch.unwrap_or(0)))
        }
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "SENTINEL MASTER reply without an ip and a port",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    /// Threads of this process named like the watcher (Linux only: `None` elsewhere).
    fn watchers() -> Option<usize> {
        let tasks = std::fs::read_dir("/proc/self/task").ok()?;
        Some(
            tasks
                .filter_map(|t| t.ok())
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|name| name.trim() == super::THREAD_NAME)
                })
                .count(),
        )
    }

    fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        f()
    }

    /// One watcher thread per Sentinel client, started with it and gone once it is dropped,
    /// also while it cannot reach any Sentinel (a port nobody listens on).
    #[test]
    fn the_watcher_thread_ends_with_its_client() {
        if watchers().is_none() {
            return;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let client =
            crate::LockClient::sentinel_builder(&[format!("redis://127.0.0.1:{port}/")], "nobody")
                .connect_timeout(Duration::from_millis(100))
                .lazy_connect()
                .build()
                .expect("client");
        assert!(wait(Duration::from_secs(2), || watchers() == Some(1)));
        drop(client);
        assert!(
            wait(Duration::from_secs(3), || watchers() == Some(0)),
            "the watcher outlived its client"
        );
    }
}
