//! Replica confirmation of hold writes: each acquire, extend and renewal is followed by
//! `WAIT <n> <timeout ms>` in the same round trip (pipelined on the same connection), so that
//! a write the primary acknowledged but no replica has is not taken for a hold. Without it, a
//! failover to a replica that had not copied the key yet, or a Sentinel split brain, lets
//! another client take a lock that its holder still believes it has (docs/deployments.md).
//!
//! How many replicas must confirm ([`ReplicaAcks`]) is fixed when the client learns its primary:
//! at its first connection to a primary, from that primary's `ROLE` reply, and again at the
//! first connection to each other primary (a master switch). A replica that drops out later (a
//! partition) does not lower it: that is when the confirmation matters.
//!
//! On a Cluster the `WAIT` rides in the same pipeline as the write: redis-rs routes a pipeline
//! by its first command's key and follows a `MOVED` or `ASK` with the whole pipeline, so the
//! `WAIT` goes to the very primary that ran the write. Each slot's primary is learnt on its own
//! ([`Acks::learn_node`]): from `INFO replication`, routed by redis-rs to the primary of the
//! slot, at the first confirmed write in that slot, and again after a write that fell short or
//! failed (a failover: a promoted replica starts a new replication ID, so it is learnt afresh;
//! without that, the first write on it would wait `WAIT`'s whole bound for a replica it does
//! not have).

#[cfg(feature = "cluster")]
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(any(feature = "cluster", feature = "sentinel"))]
use std::sync::Mutex;
use std::time::Duration;

#[cfg(any(feature = "cluster", feature = "sentinel"))]
use super::waiters::lock;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{Route, SlotAddr};
use redis::{ConnectionLike, RedisResult, Value};

/// Whether a client's hold writes (acquires, extends, watchdog renewals) wait for replicas
/// to confirm them; see [`ClientBuilder::replica_acks`](crate::ClientBuilder::replica_acks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaAcks {
    /// Sentinel and Cluster clients: one replica must confirm each write when the primary
    /// that takes it had a replica when the client learnt it, none otherwise. A Sentinel
    /// client learns its primary at its first connection and after each master switch; a
    /// Cluster client learns each shard's primary on its own, when it first writes a hold
    /// there, and again after a failover (a promoted replica is a new primary). A replica that
    /// drops out later (a partition) does not turn it off. Single-server clients: none.
    #[default]
    Auto,
    /// At least this many replicas must confirm each write, whatever the deployment (on a
    /// Cluster: replicas of the shard's primary that took the write).
    Require(u32),
    /// No confirmation: a write is a hold as soon as the primary acknowledges it.
    Off,
}

/// A client's confirmation settings, and what it learnt of its primary.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    mode: ReplicaAcks,
    timeout_ms: u64,
    /// Replicas that must confirm now (0: off).
    required: AtomicU32,
    #[cfg(feature = "sentinel")]
    /// The primary `required` was learnt from (host, port).
    learnt: Mutex<Option<(String, u16)>>,
    #[cfg(feature = "cluster")]
    /// Cluster clients: the replicas `Auto` requires of each primary, by replication ID.
    primaries: Mutex<HashMap<String, u32>>,
    #[cfg(feature = "cluster")]
    /// Cluster clients: the same, by slot (its route), for the slots written so far.
    slots: Mutex<HashMap<Route, u32>>,
}

/// What `INFO replication` says of a node, for [`Acks::learn_node`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg(feature = "cluster")]
pub(crate) struct NodeRole {
    pub(crate) primary: bool,
    pub(crate) replicas: usize,
    pub(crate) replid: String,
}

#[cfg(feature = "cluster")]
impl NodeRole {
    /// Parses `INFO replication`'s text (Redis and Valkey alike: each field by either name).
    pub(crate) fn parse(info: &str) -> NodeRole {
        let info = redis::InfoDict::new(info);
        let get = |names: &[&str]| names.iter().find_map(|n| info.get::<String>(n));
        NodeRole {
            primary: matches!(get(&["role"]).as_deref(), Some("master" | "primary")),
            replicas: get(&["connected_slaves", "connected_replicas"])
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            replid: get(&["master_replid", "primary_replid"]).unwrap_or_default(),
        }
    }
}

impl Acks {
    /// `auto`: the client follows a Sentinel-managed primary or a Cluster (where `Auto` is
    /// on).
    // The learnt state (`..Acks::default()`) exists only with `cluster` or `sentinel`.
    #[cfg_attr(
        not(any(feature = "cluster", feature = "sentinel")),
        allow(clippy::needless_update)
    )]
    pub(crate) fn new(mode: ReplicaAcks, timeout: Duration, auto: bool) -> Acks {
        let acks = Acks {
            mode: match mode {
                ReplicaAcks::Auto if !auto => ReplicaAcks::Off,
                mode => mode,
            },
            timeout_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            ..Acks::default()
        };
        // `Require(n)`'s `n`; under `Auto` none until a primary is learnt.
        let required = acks.node_fixed().unwrap_or(0);
        acks.required.store(required, Ordering::Relaxed);
        acks
    }

    /// True if some writes may need confirming: `Require(n > 0)`, or `Auto` where it is on.
    pub(crate) fn may_confirm(&self) -> bool {
        self.node_fixed() != Some(0)
    }

    /// The replicas each write needs, when no primary has to be learnt first: `Require(n)`'s
    /// `n`, `Off`'s 0, or `None` under `Auto` (see [`learn_node`](Self::learn_node)).
    pub(crate) fn node_fixed(&self) -> Option<u32> {
        match self.mode {
            ReplicaAcks::Require(n) => Some(n),
            ReplicaAcks::Off => Some(0),
            ReplicaAcks::Auto => None,
        }
    }

    #[cfg(feature = "cluster")]
    /// Cluster, `Auto`: the primary of the slot `slot` was found as `role` says; returns the
    /// replicas each write there needs from now on. A primary met for the first time (by its
    /// replication ID: a promoted replica starts a new one) needs one replica if it has any,
    /// none otherwise; a primary met again keeps what it needed, whatever replicas it has now
    /// (one that dropped out during a partition does not turn the confirmation off). A node
    /// that is no primary needs none.
    pub(crate) fn learn_node(&self, slot: Route, role: &NodeRole) -> u32 {
        let required = if role.primary {
            *lock(&self.primaries)
                .entry(role.replid.clone())
                .or_insert_with(|| {
                    let required = u32::from(role.replicas > 0);
                    log::info!(
                        "replica confirmation {} on the Cluster primary {}: it has {} replicas",
                        if required > 0 { "on" } else { "off" },
                        role.replid,
                        role.replicas
                    );
                    required
                })
        } else {
            0
        };
        lock(&self.slots).insert(slot, required);
        required
    }

    #[cfg(feature = "cluster")]
    /// Cluster: the `WAIT` a write of `key` needs, if any: `Require(n)`'s, or under `Auto`
    /// what the primary of `key`'s slot needs (asked once with `role`, see
    /// [`learn_node`](Self::learn_node)).
    pub(crate) fn cluster_wait(
        &self,
        key: &str,
        role: impl FnOnce() -> RedisResult<Option<NodeRole>>,
    ) -> RedisResult<Option<Wait>> {
        let slot = Route::with_key(key, SlotAddr::Master);
        let known = || lock(&self.slots).get(&slot).copied();
        let required = match self.node_fixed().or_else(known) {
            Some(n) => n,
            None => role()?.map_or(0, |role| self.learn_node(slot, &role)),
        };
        Ok(self.wait_for(required))
    }

    /// Cluster: what was learnt of each slot's primary is asked again at the slot's next
    /// confirmed write (after a failure, which may be a failover). The primaries stay known
    /// by their replication IDs.
    #[cfg(feature = "cluster")]
    pub(crate) fn forget_slots(&self) {
        lock(&self.slots).clear();
    }

    #[cfg(feature = "cluster")]
    /// Cluster, after a write of `key` that `missed` (`(confirmed, required)`): under `Auto`
    /// the slot's primary is asked again (`role`), and a new one (a failover) is learnt afresh;
    /// returns the shortfall that stands.
    pub(crate) fn cluster_recheck(
        &self,
        key: &str,
        role: impl FnOnce() -> RedisResult<Option<NodeRole>>,
        missed: (u32, u32),
    ) -> Option<(u32, u32)> {
        match self.node_fixed().is_none().then(role) {
            Some(Ok(Some(role))) => {
                let required = self.learn_node(Route::with_key(key, SlotAddr::Master), &role);
                (missed.0 < required).then_some((missed.0, required))
            }
            _ => Some(missed),
        }
    }

    #[cfg(feature = "sentinel")]
    /// A connection to the primary at `addr` found it with `replicas` replicas: the first
    /// report from a primary sets what `Auto` requires until the client connects to another.
    pub(crate) fn learn(&self, addr: &(String, u16), replicas: usize) {
        if self.mode != ReplicaAcks::Auto {
            return;
        }
        let mut learnt = lock(&self.learnt);
        if learnt.replace(addr.clone()).as_ref() == Some(addr) {
            return;
        }
        let required = u32::from(replicas > 0);
        if self.required.swap(required, Ordering::AcqRel) != required {
            let ((host, port), on) = (addr, if required > 0 { "on" } else { "off" });
            log::info!(
                "replica confirmation {on}: the primary {host}:{port} has {replicas} replicas"
            );
        }
    }

    /// Replicas that must confirm each hold write now (0: none).
    pub(crate) fn required(&self) -> u32 {
        self.required.load(Ordering::Acquire)
    }

    /// The `WAIT` to send after a write, when one is required.
    pub(crate) fn wait(&self) -> Option<Wait> {
        self.wait_for(self.required())
    }

    /// The `WAIT` for `required` replicas, if any.
    fn wait_for(&self, required: u32) -> Option<Wait> {
        (required > 0).then(|| Wait {
            required,
            timeout: Duration::from_millis(self.timeout_ms),
            packed: redis::cmd("WAIT")
                .arg(required)
                .arg(self.timeout_ms)
                .get_packed_command(),
            least: None,
        })
    }
}

/// One confirmation under way on a connection: the `WAIT` appended to each command sent, and
/// the fewest replicas any of them reported.
#[derive(Debug)]
pub(crate) struct Wait {
    required: u32,
    /// `WAIT`'s bound.
    pub(super) timeout: Duration,
    packed: Vec<u8>,
    least: Option<i64>,
}

impl Wait {
    /// `WAIT`'s reply: the replicas that confirmed (an error counts as none).
    fn note(&mut self, reply: Option<Value>) {
        let n = match reply {
            Some(Value::Int(n)) => n,
            _ => 0,
        };
        self.least = Some(self.least.map_or(n, |l| l.min(n)));
    }

    /// `(confirmed, required)` if a command was sent and fewer replicas than required
    /// confirmed it.
    pub(crate) fn shortfall(&self) -> Option<(u32, u32)> {
        let least = self.least?;
        (least < i64::from(self.required))
            .then(|| (u32::try_from(least.max(0)).unwrap_or(0), self.required))
    }

    /// Sends the pipeline `cmd` then the `WAIT` in one round trip; returns the pipeline's
    /// replies as `req_packed_commands` would.
    pub(crate) fn commands(
        &mut self,
        con: &mut (impl ConnectionLike + ?Sized),
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let sent = [cmd, &self.packed].concat();
        let mut replies = con.req_packed_commands(&sent, offset, count + 1)?;
        let wait = replies.pop();
        self.note(wait);
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sentinel")]
    #[test]
    fn auto_learns_once_per_primary_and_only_for_sentinel() {
        let (m1, m2) = (("a".to_owned(), 1), ("b".to_owned(), 2));
        let acks = Acks::new(
            ReplicaAcks::Auto,
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            true,
        );
        assert_eq!(acks.required(), 0);
        acks.learn(&m1, 1);
        assert_eq!(acks.required(), 1);
        // The replica drops out: a later connection to the same primary changes nothing.
        acks.learn(&m1, 0);
        assert_eq!(acks.required(), 1);
        // A switch to a primary without replicas.
        acks.learn(&m2, 0);
        assert_eq!(acks.required(), 0);
        acks.learn(&m2, 2);
        assert_eq!(acks.required(), 0);
        let single = Acks::new(
            ReplicaAcks::Auto,
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            false,
        );
        single.learn(&m1, 3);
        assert_eq!(single.required(), 0);
        let required = Acks::new(
            ReplicaAcks::Require(2),
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            false,
        );
        required.learn(&m1, 0);
        assert_eq!(required.required(), 2);
        let off = Acks::new(
            ReplicaAcks::Off,
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            true,
        );
        off.learn(&m1, 3);
        assert_eq!(off.required(), 0);
        assert!(off.wait().is_none());
    }

    #[cfg(feature = "cluster")]
    fn slot(n: u16) -> Route {
        Route::new(n, SlotAddr::Master)
    }

    #[cfg(feature = "cluster")]
    fn primary(replicas: usize, replid: &str) -> NodeRole {
        NodeRole {
            primary: true,
            replicas,
            replid: replid.to_owned(),
        }
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn cluster_auto_learns_each_primary_once_per_replication_id() {
        let acks = Acks::new(
            ReplicaAcks::Auto,
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            true,
        );
        assert!(acks.may_confirm());
        assert_eq!(acks.node_fixed(), None);
        // Two shards: one with a replica, one without.
        assert_eq!(acks.learn_node(slot(1), &primary(1, "r1")), 1);
        assert_eq!(acks.learn_node(slot(2), &primary(0, "r2")), 0);
        // a's replica drops out (a partition), a new socket learns again: still 1.
        assert_eq!(acks.learn_node(slot(1), &primary(0, "r1")), 1);
        // Another slot of a's primary, first written after that: still 1.
        assert_eq!(acks.learn_node(slot(4), &primary(0, "r1")), 1);
        // b gains a replica: still 0 (learnt once, as a Sentinel primary).
        assert_eq!(acks.learn_node(slot(2), &primary(1, "r2")), 0);
        // a failover: a's replica, promoted at c, without a replica of its own.
        assert_eq!(acks.learn_node(slot(3), &primary(0, "r3")), 0);
        // The old primary back at a's address as a replica: forgotten...
        let replica = NodeRole {
            primary: false,
            replicas: 0,
            replid: "r3".to_owned(),
        };
        assert_eq!(acks.learn_node(slot(1), &replica), 0);
        // ... and promoted again (a new replication ID) without replicas: learnt afresh.
        assert_eq!(acks.learn_node(slot(1), &primary(0, "r4")), 0);
        // Same address, new replication ID without the replica-role sighting (a restart with
        // a new data set): learnt afresh too.
        assert_eq!(acks.learn_node(slot(2), &primary(1, "r5")), 1);
        // Fixed modes learn nothing.
        let required = Acks::new(
            ReplicaAcks::Require(2),
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            true,
        );
        assert_eq!(required.node_fixed(), Some(2));
        let off = Acks::new(
            ReplicaAcks::Off,
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            true,
        );
        assert!(!off.may_confirm());
        // Auto where it is off (a single server).
        let single = Acks::new(
            ReplicaAcks::Auto,
            crate::ClientBuilder::DEFAULT_REPLICA_ACK_TIMEOUT,
            false,
        );
        assert!(!single.may_confirm());
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn info_replication_is_parsed() {
        let redis = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                     slave0:ip=127.0.0.1,port=7001,state=online,offset=1,lag=0\r\n\
                     master_failover_state:no-failover\r\n\
                     master_replid:abc\r\nmaster_replid2:000\r\n";
        assert_eq!(NodeRole::parse(redis), primary(2, "abc"));
        let replica = NodeRole::parse("role:slave\r\nmaster_host:x\r\nmaster_replid:def\r\n");
        assert!(!replica.primary);
        assert_eq!(NodeRole::parse(""), NodeRole::default());
    }

    #[test]
    fn the_fewest_confirmations_count() {
        let acks = Acks::new(ReplicaAcks::Require(1), Duration::from_millis(250), false);
        let mut wait = acks.wait().expect("a wait");
        assert_eq!(wait.shortfall(), None, "nothing sent yet");
        wait.note(Some(Value::Int(1)));
        assert_eq!(wait.shortfall(), None);
        wait.note(Some(Value::Int(0)));
        assert_eq!(wait.shortfall(), Some((0, 1)));
        let mut failed = acks.wait().expect("a wait");
        failed.note(None);
        assert_eq!(failed.shortfall(), Some((0, 1)));
        assert!(String::from_utf8_lossy(&wait.packed).contains("250"));
    }
}
