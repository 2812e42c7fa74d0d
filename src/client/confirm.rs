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

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::{ConnectionLike, RedisResult, Value};

/// Whether a client's hold writes (acquires, extends, watchdog renewals) wait for replicas
/// to confirm them; see [`ClientBuilder::replica_acks`](crate::ClientBuilder::replica_acks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaAcks {
    /// Sentinel clients: one replica must confirm each write when the primary had a replica
    /// when the client learnt it (at its first connection and after each master switch), none
    /// otherwise. Single-server and Cluster clients: none.
    #[default]
    Auto,
    /// At least this many replicas must confirm each write, whatever the deployment.
    Require(u32),
    /// No confirmation: a write is a hold as soon as the primary acknowledges it.
    Off,
}

/// The default bound of each confirmation (`WAIT`'s timeout), as Redisson's
/// `slavesSyncTimeout`.
pub const DEFAULT_REPLICA_ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// A client's confirmation settings, and what it learnt of its primary.
#[derive(Debug)]
pub(crate) struct Acks {
    mode: ReplicaAcks,
    timeout_ms: u64,
    /// Replicas that must confirm now (0: off).
    required: AtomicU32,
    /// The primary `required` was learnt from (host, port).
    learnt: Mutex<Option<(String, u16)>>,
}

impl Acks {
    /// `sentinel`: the client follows a Sentinel-managed primary (where `Auto` is on).
    pub(crate) fn new(mode: ReplicaAcks, timeout: Duration, sentinel: bool) -> Acks {
        let required = match mode {
            ReplicaAcks::Require(n) => n,
            ReplicaAcks::Auto | ReplicaAcks::Off => 0,
        };
        Acks {
            mode: if sentinel || mode != ReplicaAcks::Auto {
                mode
            } else {
                ReplicaAcks::Off
            },
            timeout_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            required: AtomicU32::new(required),
            learnt: Mutex::new(None),
        }
    }

    /// A connection to the primary at `addr` found it with `replicas` replicas: the first
    /// report from a primary sets what `Auto` requires until the client connects to another.
    pub(crate) fn learn(&self, addr: &(String, u16), replicas: usize) {
        if self.mode != ReplicaAcks::Auto {
            return;
        }
        {
            let mut learnt = self.learnt.lock().unwrap_or_else(PoisonError::into_inner);
            if learnt.as_ref() == Some(addr) {
                return;
            }
            *learnt = Some(addr.clone());
        }
        let required = u32::from(replicas > 0);
        let before = self.required.swap(required, Ordering::AcqRel);
        if before != required {
            log::info!(
                "replica confirmation {}: the primary {}:{} has {replicas} replicas",
                if required > 0 { "on" } else { "off" },
                addr.0,
                addr.1
            );
        }
    }

    /// Replicas that must confirm each hold write now (0: none).
    pub(crate) fn required(&self) -> u32 {
        self.required.load(Ordering::Acquire)
    }

    /// The `WAIT` to send after a write, when one is required.
    pub(crate) fn wait(&self) -> Option<Wait> {
        let required = self.required();
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
    timeout: Duration,
    packed: Vec<u8>,
    least: Option<i64>,
}

impl Wait {
    /// `WAIT`'s bound.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `cmd` (one or more packed commands) with the `WAIT` after it.
    fn append(&self, cmd: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(cmd.len() + self.packed.len());
        out.extend_from_slice(cmd);
        out.extend_from_slice(&self.packed);
        out
    }

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

    /// Sends `cmd` then the `WAIT` in one round trip; returns `cmd`'s reply.
    pub(crate) fn command(
        &mut self,
        con: &mut (impl ConnectionLike + ?Sized),
        cmd: &[u8],
    ) -> RedisResult<Value> {
        let mut replies = con.req_packed_commands(&self.append(cmd), 0, 2)?;
        let wait = replies.pop();
        self.note(wait);
        Ok(replies.pop().unwrap_or(Value::Nil))
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
        let mut replies = con.req_packed_commands(&self.append(cmd), offset, count + 1)?;
        let wait = replies.pop();
        self.note(wait);
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_learns_once_per_primary_and_only_for_sentinel() {
        let (m1, m2) = (("a".to_owned(), 1), ("b".to_owned(), 2));
        let acks = Acks::new(ReplicaAcks::Auto, DEFAULT_REPLICA_ACK_TIMEOUT, true);
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
        let single = Acks::new(ReplicaAcks::Auto, DEFAULT_REPLICA_ACK_TIMEOUT, false);
        single.learn(&m1, 3);
        assert_eq!(single.required(), 0);
        let required = Acks::new(ReplicaAcks::Require(2), DEFAULT_REPLICA_ACK_TIMEOUT, false);
        required.learn(&m1, 0);
        assert_eq!(required.required(), 2);
        let off = Acks::new(ReplicaAcks::Off, DEFAULT_REPLICA_ACK_TIMEOUT, true);
        off.learn(&m1, 3);
        assert_eq!(off.required(), 0);
        assert!(off.wait().is_none());
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
