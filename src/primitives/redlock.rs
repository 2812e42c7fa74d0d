//! RedLock: one lock over N independent Redis masters, the algorithm of the Redis page
//! "Distributed Locks with Redis". See `docs/redlock.md` for the algorithm step by step and
//! what it does and does not guarantee.
//!
//! Wire, per node (every operation goes to all N nodes at once, one worker thread per node):
//! - acquire: `SET key <32 hex chars> NX PX <ttl ms>` → `OK` (a yes vote) or nil (no);
//! - release, and cleanup after a failed acquire: `EVALSHA <unlock.lua> 1 key <token>`;
//! - extend: `EVALSHA <extend.lua> 1 key <token> <ttl ms>`;
//! - check: `GET key`, compared with our token.
//!
//! A node that errors or does not answer within the node timeout casts a failed vote; the
//! operation itself only fails when too few nodes vote yes.
//!
//! ## Why per-node worker threads
//!
//! Each node has one long-lived worker thread, or a few (`workers_per_node`): the "lanes",
//! each with a FIFO job channel; all operations on one key go to the same lane of every node.
//! Compared with spawning N threads per attempt (`std::thread::scope`), this
//! - costs no thread spawn per operation (a channel send and a wake-up instead);
//! - lets the caller return as soon as the outcome is decided (a majority said yes, or a
//!   majority can no longer be reached) instead of joining every thread: with a node paused,
//!   operations still finish in about one round trip of the fast nodes, not the node timeout;
//! - keeps the commands of one key in order on each node, so the cleanup `unlock` of a failed
//!   attempt always runs after that attempt's `SET` on the same node, even when the caller has
//!   stopped waiting for it (a `SET` that lands late is still deleted).
//!
//! A job that has not started by the time its caller stopped waiting is skipped, not sent, so a
//! paused node's lane never builds an unbounded backlog. The one exception are deletes of a
//! token that this lane may have written to its node (a `SET` or extend that succeeded, or
//! failed without a definite answer, e.g. timed out on a paused node): they are always sent,
//! even late, and if the node is unreachable they are sent again after the lane's next
//! successful command to it. A paused node executes the writes it buffered when it resumes;
//! without this it would keep those stale tokens, and vote no, for a whole TTL. Each such
//! delete follows one write that was really sent, so these stay bounded too.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use crate::client::admin;
use crate::client::repeats::{log_repeat, Repeats};
use crate::client::waiters::WaitQueues;
use crate::client::LockClient;
use crate::error::{Fault, LockError, Result};
use crate::ids::new_token;
use crate::lease::Lease;
use crate::lock::{self, check_lock_options, DistributedLock, LockState};
use crate::retry::RetryPolicy;
use crate::stats::{Counters, Kind, Stats};
use crate::time::check_duration;

/// The stats label of RedLocks.
pub(crate) const KIND: Kind = Kind::new("redlock");

/// A job run by a node's worker thread.
type Job = Box<dyn FnOnce(&mut Lane) + Send + 'static>;

/// The state of one worker thread of one node.
struct Lane {
    client: LockClient,
    /// Tokens this lane may have left on its node (a write that succeeded or got no definite
    /// answer), with when they expire there at the latest. A delete of one of them is never
    /// skipped.
    written: HashMap<Box<[u8]>, Instant>,
    /// Deletes that failed (node unreachable) for tokens that may still be on the node: key,
    /// token, expiry. Resent after the lane's next successful command, i.e. once the node
    /// answers again, and after any writes it buffered while it was paused.
    redo: Vec<(String, Box<[u8]>, Instant)>,
}

/// Most failed deletes a lane keeps for resending (each one cost a node timeout to fail, so
/// this is only reached after minutes of a node being down; the tokens expire there anyway).
const MAX_REDO: usize = 1024;

impl Lane {
    /// Tracks a token written (or maybe written) with lifetime `ttl`.
    fn wrote(&mut self, token: &[u8], ttl: Duration) {
        let now = Instant::now();
        if self.written.len() >= 64 {
            self.written.retain(|_, until| *until > now);
        }
        self.written
            .insert(token.into(), crate::time::saturating_add(now, ttl));
    }

    fn may_hold(&self, token: &[u8]) -> bool {
        self.written
            .get(token)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Compare-and-delete of `token`. Once the node answered, the lane forgets the token; if
    /// it did not and the token may be there, the delete is kept for [`redo`](Self::redo).
    fn delete(&mut self, key: &str, token: &[u8]) -> Result<bool> {
        match self
            .client
            .with_conn(key, |con, s| s.unlock.eval::<i64>(con, key, token))
        {
            Ok(deleted) => {
                self.written.remove(token);
                Ok(deleted == 1)
            }
            Err(e) => {
                log::debug!(
                    "lock {key:?}: RedLock delete failed (resent once the node answers again if \
                     this lane may have written the token; else it expires by its TTL there): {}",
                    e.report()
                );
                let now = Instant::now();
                if let Some(&until) = self.written.get(token).filter(|u| **u > now) {
                    if self.redo.len() >= MAX_REDO {
                        self.redo.retain(|(_, _, u)| *u > now);
                    }
                    if self.redo.len() < MAX_REDO {
                        self.redo.push((key.to_owned(), token.into(), until));
                    }
                }
                Err(e)
            }
        }
    }

    /// After a successful command: resends the deletes that failed while the node was
    /// unreachable (stops at the first failure; drops those whose token has expired).
    fn redo(&mut self) {
        if self.redo.is_empty() {
            return;
        }
        let now = Instant::now();
        let pending = std::mem::take(&mut self.redo).into_iter();
        let mut rest = pending.filter(|(_, _, until)| *until > now);
        // A delete that fails again is kept by `delete` (its token is still in `written`).
        for (key, token, _) in rest.by_ref() {
            let Ok(deleted) = self.delete(&key, &token) else {
                break;
            };
            log::debug!(
                "lock {key:?}: RedLock resent a failed delete (token was there: {deleted})"
            );
        }
        self.redo.extend(rest);
    }
}

/// A handle to N independent Redis masters for [`RedLock`]s: one [`LockClient`] per node, the
/// per-node worker threads, and the in-process waiter lines.
///
/// Cheap to clone (an `Arc`). The worker threads stop when the last clone (and the last lock
/// made from it) is dropped, after finishing the jobs already queued.
///
/// ```no_run
/// use std::time::Duration;
/// use redis_dlock::{DistributedLock, RedLockClient};
///
/// # fn main() -> Result<(), redis_dlock::LockError> {
/// let client = RedLockClient::builder(&[
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
///     "redis://10.0.0.4:6379/",
///     "redis://10.0.0.5:6379/",
/// ])
/// .node_timeout(Duration::from_millis(50))
/// .build()?;
/// let lock = client.lock("jobs:nightly-report").ttl(Duration::from_secs(30)).build()?;
/// // Err(Timeout) if other owners kept it for the whole wait, Err(NoQuorum) if too few nodes
/// // answered on the last attempt.
/// let guard = lock.lock()?;
/// // ... work, finished well before guard.valid_until() ...
/// if !guard.unlock()? {
///     eprintln!("a majority of nodes no longer had our token: the work was not exclusive");
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedLockClient {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    nodes: Vec<NodeHandle>,
    quorum: usize,
    node_timeout: Duration,
    waiters: WaitQueues,
    /// What the RedLock operations counted ([`RedLockClient::stats`]).
    counters: Counters,
    /// Its log lines that repeat while nodes are down.
    repeats: Repeats,
}

struct NodeHandle {
    client: LockClient,
    /// One job channel per worker thread of this node.
    lanes: Vec<Sender<Job>>,
}

impl fmt::Debug for RedLockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLockClient")
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.inner.quorum)
            .field("node_timeout", &self.inner.node_timeout)
            .field("workers_per_node", &self.workers())
            .finish_non_exhaustive()
    }
}

impl RedLockClient {
    /// A builder over clients the application already has, one per independent master. Their
    /// own pool settings and timeouts apply to their commands: build them with short timeouts
    /// (e.g. `LockClient::builder(url).connect_timeout(t).command_timeout(Some(t))`) or a dead
    /// node holds a worker thread for the client's full timeout (the operation itself still
    /// only waits the node timeout for each node).
    pub fn from_clients(nodes: Vec<LockClient>) -> RedLockClientBuilder {
        RedLockClientBuilder::new(NodeSpec::Clients(nodes))
    }

    /// Starts building a lock on `key`. See [`RedLockBuilder`] for the options and defaults.
    pub fn lock(&self, key: impl Into<String>) -> RedLockBuilder {
        RedLockBuilder {
            client: self.clone(),
            key: key.into(),
            ttl: None,
            retry: None,
        }
    }

    /// Number of nodes, N.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Votes needed to win: N/2 + 1 (3 of 5, 2 of 3, 2 of 2, 3 of 4).
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// How long an operation waits for each node's answer.
    pub fn node_timeout(&self) -> Duration {
        self.inner.node_timeout
    }

    /// The client of node `index` (in the order given), if there is one.
    pub fn node(&self, index: usize) -> Option<&LockClient> {
        self.inner.nodes.get(index).map(|n| &n.client)
    }

    /// What this client's RedLock operations counted since it was built: acquires, refusals,
    /// timeouts and lost holds of its locks (the other [`Stats`] fields stay zero; each node's
    /// [`LockClient::stats`] counts its reconnects). See [`LockClient::stats`].
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    fn workers(&self) -> usize {
        self.inner.nodes.first().map_or(0, |n| n.lanes.len())
    }
}

/// Settings for [`RedLockClient`], with documented defaults.
///
/// | option | default |
/// | --- | --- |
/// | [`node_timeout`](Self::node_timeout) | [`RedLockClientBuilder::DEFAULT_NODE_TIMEOUT`](crate::RedLockClientBuilder::DEFAULT_NODE_TIMEOUT) (50 ms) |
/// | [`workers_per_node`](Self::workers_per_node) | [`RedLockClientBuilder::DEFAULT_WORKERS`](crate::RedLockClientBuilder::DEFAULT_WORKERS) (1) |
/// | [`node_options`](Self::node_options) | none: each node built from a URL has the [`ClientBuilder`](crate::ClientBuilder) defaults but for its command timeout (the node timeout), its pool size (the workers) and a lazy connect |
///
/// N = 0 nodes is rejected with [`LockError::Config`]. Any N ≥ 1 works, but an odd N
/// is recommended: an even N tolerates no more failed nodes than N − 1 (4 nodes need 3 votes
/// and survive 1 failure, like 3 nodes), and N = 2 needs both.
#[derive(Clone)]
#[must_use]
pub struct RedLockClientBuilder {
    pub(crate) nodes: NodeSpec,
    node_timeout: Duration,
    workers: u32,
}

/// Builds the client of one node given as a URL: its settings, the workers per node, the node
/// timeout.
pub(crate) type NodeClient =
    Arc<dyn Fn(redis::ConnectionInfo, u32, Duration) -> Result<LockClient> + Send + Sync>;

impl fmt::Debug for RedLockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The node count only: a URL may carry a password.
        f.debug_struct("RedLockClientBuilder")
            .field("nodes", &self.nodes.len())
            .field("node_timeout", &self.node_timeout)
            .field("workers_per_node", &self.workers)
            .finish()
    }
}

#[derive(Clone)]
pub(crate) enum NodeSpec {
    /// Nodes given as URLs, and how each becomes a client (made by the facade, which owns
    /// `ClientBuilder`).
    Targets(Vec<redis::RedisResult<redis::ConnectionInfo>>, NodeClient),
    Clients(Vec<LockClient>),
}

impl NodeSpec {
    fn len(&self) -> usize {
        match self {
            NodeSpec::Targets(u, _) => u.len(),
            NodeSpec::Clients(c) => c.len(),
        }
    }
}

impl RedLockClientBuilder {
    /// Default node timeout ([`node_timeout`](Self::node_timeout)): 50 ms.
    ///
    /// Default per-node timeout: how long an operation waits for each node's answer, and the
    /// command timeout of nodes built from URLs. The Redis page suggests 5–50 ms for a
    /// 10 s lock: far shorter than the lifetime, so a dead node costs little of it.
    pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
    /// Default worker threads per node ([`workers_per_node`](Self::workers_per_node)): 1.
    ///
    /// Default number of worker threads (and pooled connections, for nodes built from URLs) per
    /// node: one, the threads that asking every node at once needs. Operations on one key use one
    /// of them per node; different keys spread over them, so more of them work on more keys at
    /// once.
    pub const DEFAULT_WORKERS: u32 = 1;

    pub(crate) fn new(nodes: NodeSpec) -> Self {
        RedLockClientBuilder {
            nodes,
            node_timeout: RedLockClientBuilder::DEFAULT_NODE_TIMEOUT,
            workers: RedLockClientBuilder::DEFAULT_WORKERS,
        }
    }

    crate::primitives::hold::setters! {
        /// How long an operation waits for each node's answer before counting it as a failed vote
        /// (default [`RedLockClientBuilder::DEFAULT_NODE_TIMEOUT`](crate::RedLockClientBuilder::DEFAULT_NODE_TIMEOUT)). For nodes given as URLs it is also each
        /// connection's command timeout (a later reply is a lost vote anyway); their connect
        /// timeout is [`ClientBuilder`](crate::ClientBuilder)'s, so that a TLS handshake is not cut short: a node that
        /// is slow to connect holds its worker, never the operation. Keep it far below the lock's lifetime: every
        /// millisecond an acquire waits is taken off the validity. More than zero and at most
        /// [`ClientBuilder::MAX_TIMEOUT`](crate::ClientBuilder::MAX_TIMEOUT), or [`build`](Self::build) fails.
        node_timeout(d: Duration) => node_timeout = d;
        /// Worker threads per node (default [`RedLockClientBuilder::DEFAULT_WORKERS`](crate::RedLockClientBuilder::DEFAULT_WORKERS)); for nodes given as URLs
        /// also the connection pool size. Each key is served by one worker per node, so this bounds
        /// how many different keys are worked on at once, not how many threads may wait.
        workers_per_node(n: u32) => workers = n;
    }

    /// Creates the node clients (they connect lazily: a node that is down now just votes no
    /// until it comes up) and starts the worker threads.
    ///
    /// Errors: [`LockError::Config`] for zero nodes, a zero or too long node timeout, a zero
    /// worker count, a bad URL, or a worker thread that could not be started.
    pub fn build(self) -> Result<RedLockClient> {
        let setup = |msg: &str| LockError::client_config(msg);
        let count = self.nodes.len();
        if count == 0 {
            return Err(setup(
                "RedLock needs at least one Redis master (an odd number, e.g. 5, is recommended)",
            ));
        }
        if self.node_timeout.is_zero() || self.node_timeout > crate::MAX_CLIENT_TIMEOUT {
            return Err(LockError::client_config(format!(
                "the RedLock node timeout must be greater than zero and at most \
                 MAX_CLIENT_TIMEOUT ({:?})",
                crate::MAX_CLIENT_TIMEOUT
            )));
        }
        if self.workers == 0 {
            return Err(setup("RedLock needs at least one worker per node"));
        }
        let clients = match self.nodes {
            NodeSpec::Clients(c) => c,
            NodeSpec::Targets(targets, node_client) => targets
                .into_iter()
                .map(|target| {
                    let info = target.map_err(|e| {
                        setup("a RedLock node is not a valid Redis URL").caused_by(Box::new(e))
                    })?;
                    node_client(info, self.workers, self.node_timeout)
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let mut nodes = Vec::with_capacity(clients.len());
        for (index, client) in clients.into_iter().enumerate() {
            let lanes = (0..self.workers)
                .map(|lane| spawn_worker(index, lane, client.clone()))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| {
                    setup("could not start a RedLock worker thread").caused_by(Box::new(e))
                })?;
            nodes.push(NodeHandle { client, lanes });
        }
        if count.is_multiple_of(2) {
            log::info!(
                "RedLock over {count} nodes: an even count tolerates no more failures than \
                 {} nodes; an odd count is recommended",
                count - 1
            );
        }
        Ok(RedLockClient {
            inner: Arc::new(Inner {
                nodes,
                quorum: count / 2 + 1,
                node_timeout: self.node_timeout,
                ..Inner::default()
            }),
        })
    }
}

/// Starts one worker thread of node `node`. It runs jobs in arrival order until every sender
/// is gone; a panicking job is logged and the worker carries on.
fn spawn_worker(node: usize, lane: u32, client: LockClient) -> std::io::Result<Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let mut state = Lane {
        client,
        written: HashMap::new(),
        redo: Vec::new(),
    };
    thread::Builder::new()
        .name(format!("redlock-{node}.{lane}"))
        .spawn(move || {
            for job in rx {
                if panic::catch_unwind(AssertUnwindSafe(|| job(&mut state))).is_err() {
                    log::error!("RedLock worker {node}.{lane}: a job panicked; carrying on");
                }
            }
        })?;
    Ok(tx)
}

/// One node's answer: `Ok(true)` when the command took effect (acquired, deleted, extended,
/// or our token is there), `Ok(false)` when it answered no (not ours / held by another owner),
/// an error when it failed or could not be reached. A job that had not started when the caller
/// stopped waiting sends nothing.
type Vote = Result<bool>;

/// The votes of one operation.
#[derive(Debug, Default)]
struct Tally {
    yes: usize,
    no: usize,
    failed: usize,
    /// Not answered: the deadline passed (or the job was skipped because the node's worker was
    /// still busy), or the outcome was decided before the answer came.
    unanswered: usize,
    first_error: Option<LockError>,
}

impl Tally {
    fn answered(&self) -> usize {
        self.yes + self.no + self.failed
    }

    fn add(&mut self, vote: Vote) {
        match vote {
            Ok(true) => self.yes += 1,
            Ok(false) => self.no += 1,
            Err(e) => {
                self.failed += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }

    /// Nodes that did not give a real answer.
    fn unreachable(&self) -> usize {
        self.failed + self.unanswered
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes = self.answered() + self.unanswered;
        write!(
            f,
            "{} yes, {} no, {} failed, {} not answered of {nodes} nodes",
            self.yes, self.no, self.failed, self.unanswered
        )?;
        if let Some(e) = &self.first_error {
            write!(f, " (first error: {})", e.report())?;
        }
        Ok(())
    }
}

/// Collects the votes arriving on `rx` until the outcome is decided (`quorum` yes votes, or too
/// few nodes left to reach it), every node answered, or `deadline` passed. Nodes still out
/// count as unanswered.
fn count(rx: &Receiver<Vote>, deadline: Instant, nodes: usize, quorum: usize) -> Tally {
    let mut tally = Tally::default();
    // Until decided: a majority yes, or too few nodes left to reach one (all answered included).
    while tally.yes < quorum && tally.yes + (nodes - tally.answered()) >= quorum {
        // A vote that comes after the deadline is an unanswered node's (docs/redlock.md).
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(vote) if !left.is_zero() => tally.add(vote),
            _ => break,
        }
    }
    tally.unanswered = nodes - tally.answered();
    tally
}

/// Settings of one [`RedLock`]. Start from [`RedLockClient::lock`].
///
/// | option | default |
/// | --- | --- |
/// | [`ttl`](Self::ttl) (lifetime) | [`RedLock::DEFAULT_TTL`](crate::RedLock::DEFAULT_TTL) (10 s) |
/// | [`retry`](Self::retry) | [`RedLock::default_retry_policy`] (up to 10 s, random 12–25 ms growing to 100–200 ms) |
#[derive(Debug, Clone)]
#[must_use]
pub struct RedLockBuilder {
    client: RedLockClient,
    key: String,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
}

impl RedLockBuilder {
    crate::primitives::hold::setters! {
        /// The lifetime of a hold: the `PX` sent to every node. Whole milliseconds count; it must
        /// exceed the clock-drift allowance ([`RedLock::clock_drift`], at least 3 ms in all) and
        /// should be far longer than the node timeout.
        ttl(ttl: Duration) => ttl = Some(ttl);
        /// How [`DistributedLock::lock`] waits between attempts.
        retry(policy: RetryPolicy) => retry = Some(policy);
    }

    /// Checks the options and builds the lock. Sends nothing to Redis.
    pub fn build(self) -> Result<RedLock> {
        let (ttl, retry) = check_lock_options(
            &self.key,
            self.ttl.unwrap_or(RedLock::DEFAULT_TTL),
            self.retry.unwrap_or_else(RedLock::default_retry_policy),
        )?;
        let ttl = checked_ttl(&self.key, ttl)?;
        let workers = self.client.workers().max(1);
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(&self.key);
        let lane = (hash % workers as u64) as usize;
        Ok(RedLock {
            client: self.client,
            key: self.key,
            ttl,
            retry,
            lane,
        })
    }
}

/// A lifetime in whole milliseconds that leaves a positive validity after the drift allowance.
fn checked_ttl(key: &str, ttl: Duration) -> Result<Duration> {
    let ttl = check_duration(key, "ttl", ttl, false)?;
    let drift = RedLock::clock_drift(ttl);
    if ttl <= drift {
        return Err(LockError::config(
            key,
            format!("RedLock ttl {ttl:?} must exceed its clock-drift allowance {drift:?}"),
        ));
    }
    Ok(ttl)
}

/// A lock held by a majority of N independent Redis masters (RedLock). Build it with
/// [`RedLockClient::lock`].
///
/// - **Acquire**: the same key and a fresh random token go to all N nodes at once as
///   `SET key token NX PX ttl`. The lock is won iff at least N/2 + 1 nodes said `OK` and the
///   validity `ttl − elapsed − drift` is still positive, where `elapsed` runs from before the
///   commands were sent until the votes decided and `drift` is [`RedLock::clock_drift`]. The
///   lease is then valid until `start + ttl − drift` (monotonic clock); at the moment of return
///   its [`remaining`](Lease::remaining) time is the validity. A lost attempt deletes its token
///   (compare-and-delete) on every node where its `SET` may have landed: those that said `OK`,
///   failed or did not answer in time (a node that answered nil has nothing of ours). Then
///   [`lock`](DistributedLock::lock) sleeps a random delay ([`RetryPolicy`]) and tries again.
/// - **Release**: compare-and-delete on all nodes; `Ok(true)` iff a majority deleted our token.
///   `Ok(false)` means fewer than N/2 + 1 nodes confirmed it (it had expired or been replaced
///   there, or those nodes did not answer): the hold may not have been exclusive up to the end,
///   and any copies left expire by their TTL.
/// - **Extend**: compare-and-pexpire on all nodes; succeeds iff a majority extended and the
///   new validity (`ttl − elapsed − drift`, from before the commands were sent) is positive.
///   Otherwise [`LockError::Lost`], and the token is deleted everywhere (best effort): once
///   reported lost, a hold only keeps others out.
/// - **Check** ([`is_held`](DistributedLock::is_held)): the lease has not expired locally and
///   a majority of nodes still hold our token.
///
/// Every operation sends its N commands at once (each node has its own worker threads, see the
/// module notes in `docs/redlock.md`) and returns as soon as the outcome is decided, so a slow
/// or paused minority costs nothing once a majority has answered.
///
/// A node that returns an error or does not answer within the node timeout is a failed vote,
/// never an error of the call by itself. What a lost majority gives depends on the votes:
/// - some node refused (it holds the key for another owner): contention,
///   [`LockError::Held`] from [`try_lock`](DistributedLock::try_lock), and
///   [`LockError::Timeout`] from [`lock`](DistributedLock::lock) if it stays so until the
///   deadline;
/// - no node refused, the majority was lost only to nodes that failed or did not answer (too
///   few nodes up): [`LockError::NoQuorum`] with the vote counts (a warning is logged), from
///   `try_lock` at once and from `lock` if its last attempt ended so (it is
///   [transient](LockError::is_transient): retried until the deadline);
/// - a majority said yes, but after the validity ran out: [`LockError::LateReply`] (also
///   transient), the token deleted again.
#[derive(Debug)]
pub struct RedLock {
    client: RedLockClient,
    key: String,
    ttl: Duration,
    retry: RetryPolicy,
    /// The worker of each node that serves this key.
    lane: usize,
}

impl RedLock {
    /// Default lifetime of a RedLock hold ([`RedLockBuilder::ttl`]): 10 s.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

    /// The clock-drift allowance for a lifetime of `ttl`: 1% of it plus 2 ms, as in the Redis
    /// page. Subtracted from every validity, it covers the nodes' clocks running up to 1% fast
    /// relative to ours, plus the millisecond granularity of `PX`.
    pub fn clock_drift(ttl: Duration) -> Duration {
        ttl / 100 + Duration::from_millis(2)
    }

    /// The default retry policy: wait up to 10 s, sleeping a random delay between attempts
    /// (uniform in `[d/2, d]`, `d` from 25 ms doubling to 200 ms), so clients that collided
    /// spread out as the Redis page asks. Waiters of the same client are also woken at once by
    /// a local release.
    pub fn default_retry_policy() -> RetryPolicy {
        RetryPolicy::standard()
            .backoff(Duration::from_millis(25), Duration::from_millis(200), 2)
            .jitter(true)
            .max_wait(Some(Duration::from_secs(10)))
    }

    /// The clock-drift allowance of this lock's lifetime.
    pub fn drift(&self) -> Duration {
        RedLock::clock_drift(self.ttl)
    }

    /// The client (nodes) this lock runs on.
    pub fn client(&self) -> &RedLockClient {
        &self.client
    }

    fn inner(&self) -> &Inner {
        &self.client.inner
    }

    /// Runs `op` (given the lane, the key and `token`) on every node, on this lock's lane, and
    /// returns the receiver of the answers. A job that has not started by `deadline` (never, if
    /// `None`) is skipped and answers nothing, except a delete (`deletes`) of a token the lane
    /// may have written, which is always sent. After an answer, the lane resends its failed
    /// deletes. The receiver disconnects once every node's job is done or skipped.
    fn run<T, F>(
        &self,
        token: &[u8],
        deadline: Option<Instant>,
        deletes: bool,
        op: F,
    ) -> Receiver<Result<T>>
    where
        T: Send + 'static,
        F: Fn(&mut Lane, &str, &[u8]) -> Result<T> + Send + Sync + 'static,
    {
        let (tx, rx) = mpsc::channel();
        // One copy of the operation, key and token, shared by the N jobs.
        let shared = Arc::new((op, self.key.clone(), token.to_vec()));
        for (i, node) in self.inner().nodes.iter().enumerate() {
            let (reply, shared) = (tx.clone(), Arc::clone(&shared));
            let job: Job = Box::new(move |lane| {
                let (op, key, token) = &*shared;
                let in_time = deadline.is_some_and(|d| Instant::now() < d);
                if in_time || (deletes && lane.may_hold(token)) {
                    let answer = op(lane, key, token);
                    let answered = answer.is_ok();
                    // The caller may have stopped waiting; then nobody needs the answer.
                    let _ = reply.send(answer);
                    if answered {
                        lane.redo();
                    }
                }
            });
            if node.lanes[self.lane].send(job).is_err() {
                let e = LockError::connection(
                    &self.key,
                    Fault::Unreachable,
                    format!("the RedLock worker thread of node {i} is gone").into(),
                );
                log::error!("lock {:?}: {}", self.key, e.report());
                let _ = tx.send(Err(e));
            }
        }
        rx
    }

    /// Sends `op` to every node (see [`run`](Self::run)) within a node timeout, and counts the
    /// votes. `op` returns the node's vote: `Ok(true)` yes, `Ok(false)` no. `writes`: the
    /// lifetime a yes vote, or no definite answer, may leave `token` on the node for (`SET NX
    /// PX`, extend); a definite no means it is not (or no longer) there. Returns the votes and
    /// the instant before anything was sent.
    fn broadcast<F>(&self, token: &[u8], writes: Option<Duration>, op: F) -> (Tally, Instant)
    where
        F: Fn(&mut Lane, &str, &[u8]) -> Result<bool> + Send + Sync + 'static,
    {
        let (start, inner) = (Instant::now(), self.inner());
        let deadline = crate::time::saturating_add(start, inner.node_timeout);
        let rx = self.run(token, Some(deadline), false, move |lane, key, v| {
            let vote = op(lane, key, v);
            match (writes, &vote) {
                (Some(ttl), Ok(true) | Err(_)) => lane.wrote(v, ttl),
                (Some(_), Ok(false)) => drop(lane.written.remove(v)),
                (None, _) => {}
            }
            vote
        });
        (count(&rx, deadline, inner.nodes.len(), inner.quorum), start)
    }

    /// Compare-and-delete of `token` on every node (see [`run`](Self::run)): `Ok(true)` where
    /// it was ours.
    fn delete(&self, token: &[u8], deadline: Option<Instant>) -> Receiver<Vote> {
        self.run(token, deadline, true, |lane, key, v| lane.delete(key, v))
    }

    /// Runs `op` on every node, on this lock's lane, and collects the answers until a node
    /// timeout has passed (a job not started by then is skipped): the answers, and the first
    /// error a node answered with; nodes missing from them failed or did not answer in time.
    fn ask<T, F>(&self, op: F) -> (Vec<T>, Option<LockError>)
    where
        T: Send + 'static,
        F: Fn(&mut Lane, &str, &[u8]) -> Result<T> + Send + Sync + 'static,
    {
        let deadline = crate::time::after(self.inner().node_timeout);
        let rx = self.run(&[], Some(deadline), false, op);
        let (mut answers, mut first_error) = (Vec::new(), None);
        // Not until the receiver disconnects: a lane resends its failed deletes after answering.
        for _ in 0..self.inner().nodes.len() {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(answer)) => answers.push(answer),
                Ok(Err(e)) => first_error = first_error.or(Some(e)),
                Err(_) => break,
            }
        }
        (answers, first_error)
    }

    /// A query that too few nodes answered to decide.
    fn undecided(&self, what: &str, answered: usize, first: Option<LockError>) -> LockError {
        let (nodes, quorum) = (self.inner().nodes.len(), self.inner().quorum);
        // No answer from a majority goes away as nodes come back, like a refused connection.
        LockError::connection(
            &self.key,
            Fault::Unreachable,
            format!(
                "RedLock {what}: {answered} of {nodes} nodes answered, too few to decide (a \
                 majority is {quorum}){}",
                first
                    .map(|e| format!("; first error: {}", e.report()))
                    .unwrap_or_default()
            )
            .into(),
        )
    }

    /// Logs an operation that failed because too few nodes answered at all.
    fn note_unreachable(&self, what: &str, tally: &Tally) {
        let inner = self.inner();
        if inner.nodes.len() - tally.unreachable() < inner.quorum {
            log_repeat!(
                inner.repeats,
                "RedLock: too few nodes reachable",
                log::Level::Warn,
                "lock {:?}: RedLock {what}: fewer than {} of {} nodes reachable: {tally}",
                self.key,
                inner.quorum,
                inner.nodes.len()
            );
        } else {
            log::trace!("lock {:?}: RedLock {what} not won: {tally}", self.key);
        }
    }
}

impl RedLock {
    /// One attempt: `Ok(None)` when another owner holds the lock.
    fn try_take(&self) -> Result<Option<Lease>> {
        let (token, inner) = (new_token(), self.inner());
        let ttl_ms = self.ttl.as_millis() as u64;
        let (tally, start) = self.broadcast(&token, Some(self.ttl), move |lane, key, v| {
            let reply: Value = lane.client.with_conn(key, |con, _| {
                crate::primitives::string_value::set_nx_px(key, v, ttl_ms).query(con)
            })?;
            Ok(matches!(reply, Value::Okay))
        });
        // validity = ttl − elapsed − drift > 0  ⇔  now < start + ttl − drift
        let lifetime = self.ttl - self.drift();
        let valid = Instant::now() < crate::time::saturating_add(start, lifetime);
        if tally.yes >= inner.quorum && valid {
            log::trace!("lock {:?}: RedLock acquired: {tally}", self.key);
            inner.counters.attempt(KIND, true);
            return Ok(Some(Lease::new(&token, start, lifetime).drift_included()));
        }
        if tally.yes >= inner.quorum {
            log::warn!(
                "lock {:?}: RedLock majority reached too late (after {:?}, ttl {:?}): no validity \
                 left; releasing",
                self.key,
                start.elapsed(),
                self.ttl
            );
        } else {
            self.note_unreachable("acquire", &tally);
        }
        // Delete our token wherever the SET may have landed (nodes that said OK, failed or
        // did not answer in time); queued behind the SETs, so one still in flight is deleted
        // after it lands. Waited for, one node timeout at most, so that a caller that exits
        // next (a CLI, a cron job) leaves nothing behind where a node answers; a node that
        // does not gets the delete when it answers again (see `Lane::redo`), if the process
        // still runs.
        let undone = self.delete(&token, None);
        let deadline = crate::time::after(inner.node_timeout);
        let left = || deadline.saturating_duration_since(Instant::now());
        while undone.recv_timeout(left()).is_ok() {}
        if left().is_zero() {
            log::debug!(
                "lock {:?}: RedLock's undo of a failed acquire not done on every node within the \
                 node timeout: sent when they answer again",
                self.key
            );
        }
        if tally.yes >= inner.quorum {
            return Err(LockError::LateReply {
                key: self.key.clone(),
                elapsed: start.elapsed(),
                ttl: self.ttl,
            });
        }
        if tally.no > 0 {
            // Some node holds it for another owner, who may hold a majority (counting nodes we
            // could not hear): contention.
            inner.counters.attempt(KIND, false);
            return Ok(None);
        }
        // No node refused: the majority was lost only to nodes that failed or did not
        // answer. Nobody is known to hold the lock: a failure, not contention.
        Err(LockError::NoQuorum {
            key: self.key.clone(),
            granted: tally.yes,
            refused: tally.no,
            failed: tally.unreachable(),
            nodes: inner.nodes.len(),
            quorum: inner.quorum,
            source: tally.first_error.map(Box::new),
        })
    }
}

impl DistributedLock for RedLock {
    crate::primitives::hold::hold_accessors!(key: key, ttl: ttl, retry: retry);

    fn try_acquire(&self) -> Result<Lease> {
        crate::lock::taken_or_held(&self.key, self.try_take())
    }

    fn release(&self, lease: &Lease) -> Result<bool> {
        // A hold whose validity passed is reported lost even if a majority still had it.
        let overran = lease.is_expired();
        let deadline = crate::time::after(self.inner().node_timeout);
        let deleted = self.delete(lease.value(), Some(deadline));
        let (nodes, quorum) = (self.inner().nodes.len(), self.inner().quorum);
        let tally = count(&deleted, deadline, nodes, quorum);
        let ours = tally.yes >= quorum;
        if !ours {
            self.note_unreachable("release", &tally);
        }
        if !ours || overran {
            self.inner().counters.lost_on_release(KIND, lease);
        }
        let released = crate::client::acquire::note_release(&self.inner().waiters, &self.key, ours);
        Ok(released && !overran)
    }

    fn extend(&self, lease: &mut Lease, ttl: Duration) -> Result<()> {
        let (ttl, inner) = (checked_ttl(&self.key, ttl)?, self.inner());
        let lifetime = ttl - RedLock::clock_drift(ttl);
        let ttl_ms = ttl.as_millis() as u64;
        let (tally, start) = self.broadcast(lease.value(), Some(ttl), move |lane, key, v| {
            let extended: i64 = lane
                .client
                .with_conn(key, |con, s| s.extend.eval(con, key, (v, ttl_ms)))?;
            Ok(extended == 1)
        });
        if tally.yes >= inner.quorum
            && Instant::now() < crate::time::saturating_add(start, lifetime)
        {
            lease.renew(None, start, lifetime);
            log::debug!("lock {:?}: RedLock extended by {ttl:?}: {tally}", self.key);
            return Ok(());
        }
        // Returned as `LockError::Lost`: not also a warning.
        log::debug!(
            "lock {:?}: RedLock lost, extend not confirmed by a majority in time: {tally}",
            self.key
        );
        inner.counters.lost_on_extend(KIND, lease);
        // Fire and forget: the caller is told its hold is lost at once.
        let deadline = Some(crate::time::after(inner.node_timeout));
        drop(self.delete(lease.value(), deadline));
        Err(LockError::lost(&self.key))
    }

    fn is_held(&self, lease: &Lease) -> Result<bool> {
        if lease.is_expired() {
            return Ok(false);
        }
        let (tally, _) = self.broadcast(lease.value(), None, |lane, key, v| {
            let current: Option<Vec<u8>> = lane
                .client
                .with_conn(key, |con, _| redis::cmd("GET").arg(key).query(con))?;
            Ok(current.as_deref() == Some(v))
        });
        Ok(tally.yes >= self.inner().quorum && !lease.is_expired())
    }

    lock::guard_methods!(|this, attempts| {
        let waiters = &this.inner().waiters;
        let result = crate::client::acquire::acquire_blocking(this, waiters, attempts);
        this.inner().counters.blocking(KIND, &result);
        result
    });
}

impl crate::lock::LockAdmin for RedLock {
    /// Locked when a majority of the nodes hold one same value: see
    /// [`LockAdmin::state`](crate::LockAdmin::state).
    fn state(&self) -> Result<LockState> {
        let (answers, first_error) =
            self.ask(|lane, key, _| admin::read(&lane.client, key, "value"));
        let (nodes, quorum) = (self.inner().nodes.len(), self.inner().quorum);
        let unanswered = nodes - answers.len();
        // Each value found, with the PTTL of every node that holds it.
        let mut held: HashMap<Vec<u8>, Vec<Option<Duration>>> = HashMap::new();
        for found in answers.into_iter().filter(|found| !found.is_absent()) {
            // A key of another type is some value nobody else has.
            let value = match found.detail {
                Some(v) if found.kind == "string" => v,
                _ => format!("<{}>", found.kind).into_bytes(),
            };
            held.entry(value).or_default().push(found.pttl);
        }
        // Only one value can be held by a majority: the most common one.
        let mut ttls = held.into_values().max_by_key(Vec::len).unwrap_or_default();
        let count = ttls.len();
        if count >= quorum {
            // The majority breaks when the quorum-th longest PTTL runs out (no expiry sorts
            // as the longest).
            ttls.sort_by_key(|t| std::cmp::Reverse(t.unwrap_or(Duration::MAX)));
            return Ok(LockState::Locked {
                ttl: ttls.get(quorum - 1).copied().flatten(),
            });
        }
        if count + unanswered < quorum {
            return Ok(LockState::Unlocked);
        }
        Err(self.undecided("state", nodes - unanswered, first_error))
    }

    /// Deletes the key on every node whoever holds it: see
    /// [`LockAdmin::force_unlock`](crate::LockAdmin::force_unlock). RedLock publishes nothing (its waiters poll); this
    /// client's waiters are woken.
    fn force_unlock(&self) -> Result<bool> {
        let (answers, first_error) = self.ask(|lane, key, _| {
            lane.client.with_conn(key, |con, s| {
                s.force_unlock.eval::<i64>(con, key, ("", "", ""))
            })
        });
        let (nodes, quorum) = (self.inner().nodes.len(), self.inner().quorum);
        let (answered, deleted) = (answers.len(), answers.iter().filter(|n| **n == 1).count());
        if deleted > 0 {
            log::info!(
                "lock {:?}: RedLock force-unlocked (deleted on {deleted} of {nodes} nodes)",
                self.key
            );
            self.inner().waiters.notify_release(&self.key);
        }
        if answered < quorum {
            return Err(self.undecided("force unlock", answered, first_error));
        }
        Ok(deleted > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(
            RedLock::clock_drift(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
        assert_eq!(
            RedLock::clock_drift(Duration::from_millis(3)),
            Duration::from_micros(2_030)
        );
    }

    #[test]
    fn ttl_must_exceed_drift() {
        assert!(checked_ttl("k", Duration::from_millis(2)).is_err());
        assert!(checked_ttl("k", Duration::ZERO).is_err());
        assert_eq!(
            checked_ttl("k", Duration::from_micros(3_900)).unwrap(),
            Duration::from_millis(3)
        );
    }

    #[test]
    fn zero_nodes_is_invalid() {
        let err = RedLockClient::from_clients(vec![]).build().unwrap_err();
        assert!(
            matches!(err, LockError::Config { key: None, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn quorum_is_majority() {
        let urls = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("redis://127.0.0.1:{}/", 1 + i))
                .collect()
        };
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)] {
            let c = RedLockClient::builder(&urls(n))
                .workers_per_node(1)
                .build()
                .unwrap();
            assert_eq!((c.node_count(), c.quorum()), (n, q));
        }
    }

    #[test]
    fn tally_stops_when_decided() {
        let (tx, rx) = mpsc::channel();
        let deadline = Instant::now() + Duration::from_secs(30);
        // 3 of 5 no: the outcome is decided without waiting for the other two.
        for _ in 0..3 {
            tx.send(Ok(false)).unwrap();
        }
        let t = count(&rx, deadline, 5, 3);
        assert_eq!((t.yes, t.no, t.unanswered), (0, 3, 2));
        for _ in 0..3 {
            tx.send(Ok(true)).unwrap();
        }
        let t = count(&rx, deadline, 5, 3);
        assert_eq!((t.yes, t.unanswered), (3, 2));
    }
}
