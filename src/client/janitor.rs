//! The janitor: owner-checked clean-ups that could not be done in the caller's call, retried in
//! the background until they succeed or are no longer needed.
//!
//! Two failures leave a lock behind that nobody will release:
//!
//! - **A lost acquire reply.** The `SET NX PX` (or `SETNX`, or a takeover) was sent, but no
//!   reply came (command timeout, reset connection, paused server). The command may still run
//!   when the server answers again, leaving a lock that no caller holds: every other client
//!   would wait out its whole lease (30 s for a watched lock).
//! - **A failed release.** `unlock()` (or a guard's drop) failed on a connection error, e.g.
//!   while a primary fails over. The key lives on with its lease; the caller, whose guard was
//!   consumed, cannot retry.
//!
//! In both cases the caller gets its error at once, and the client hands the janitor a job: an
//! owner-checked delete of the exact value written (`lua/unlock.lua`: deletes only if the key
//! still holds that value, so it can never touch another owner's lock), with the release
//! published for waiters. The janitor retries it on a pooled connection (broken connections
//! are replaced; on Sentinel a new connection goes to the current primary) every
//! [`RETRY_DELAY`] until it is answered, or until the hold would have expired by itself (the
//! job's deadline), whichever comes first. Each outcome is logged.
//!
//! A reentrant lock's release is not a delete but one hold given back, so repeating it could give
//! back two. Its job (`lua/reentrant_forget.lua`) gives back one hold only if the owner's count
//! is still the one it had before the release that failed (the count the thread's own acquires
//! and releases last saw): if the first try ran after all, the count is lower and nothing
//! changes. So that the owner's next hold cannot be mistaken for the old one, the owner's next
//! acquire of that key first finishes the job itself (or waits for the janitor's try in
//! flight): see [`Janitor::settle`].
//!
//! A read-write lock's release carries an unlock latch (Redisson's `redisson_unlock_latch`, a
//! fresh request id per release): its job sends the same release again, with the same latch,
//! so a release that ran after all answers from the latch and gives back nothing more. Its
//! deadline is also bounded by the latch's lifetime.
//!
//! A fair lock's release that failed, or that is remembered across a Sentinel switch, is sent
//! again as itself (`lua/fair_release.lua` with the same token): owner-checked by the token
//! like a delete, it also grants the lock to the live head of the queue and publishes the
//! grant, as the release would have (or did, on the old master).
//!
//! ONE thread per client at most, `dlock-janitor`, started by the first job and ended when no
//! job is left (or the client is dropped), so an idle client has none.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::client::grants::Grant;
use crate::client::sentinel_watch::Released;
use crate::client::{LockClient, WeakClient};
use crate::error::Result;
use crate::keys;
use crate::lock::printable;
use crate::scripts::{LuaScript, Scripts};
use crate::strategy::fair::CHANNEL_PREFIX as FAIR_CHANNEL_PREFIX;

/// Most commands in one pipeline of a replay.
const REPLAY_BATCH: usize = 512;
/// Pause between two tries of a clean-up that failed.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(100);
/// The thread's name (at most 15 bytes: Linux truncates thread names).
const THREAD_NAME: &str = "dlock-janitor";
/// Longest wait of the thread when the only due jobs wait for a try in flight of their key.
const BLOCKED_POLL: Duration = Duration::from_millis(5);
/// Most jobs kept at once: a client that keeps failing must not grow without bound. Past it,
/// the oldest job is dropped (its lock expires with its lease).
const MAX_JOBS: usize = 4_096;

/// True for a release error after which the release may still be needed and can be tried
/// again: a connection error (it may or may not have run), or a server's transient refusal
/// (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`, `READONLY`: it did not run; a Cluster
/// answers `CLUSTERDOWN` on every node while a failed primary is replaced).
pub(crate) fn worth_retrying(e: &crate::LockError) -> bool {
    use redis::ServerErrorKind as K;
    match e {
        crate::LockError::Connection { .. } => true,
        crate::LockError::Redis { source, .. } => matches!(
            source.kind(),
            redis::ErrorKind::Server(
                K::ClusterDown | K::TryAgain | K::MasterDown | K::BusyLoading | K::ReadOnly
            )
        ),
        _ => false,
    }
}

/// Why a clean-up job exists (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// An acquire whose reply was lost: the value may or may not have been written.
    LostAcquireReply,
    /// A release that failed on a connection error.
    FailedRelease,
    /// A release done on a Sentinel master shortly before a switch was announced: the new
    /// master may still hold the lock (it was replicated before the promotion).
    ReleasedBeforeSwitch,
}

impl Cause {
    fn describe(self) -> &'static str {
        match self {
            Cause::LostAcquireReply => "an acquire whose reply was lost",
            Cause::FailedRelease => "a release that failed",
            Cause::ReleasedBeforeSwitch => "a release done on the old master before the switch",
        }
    }
}

/// What a job does.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    /// Delete the key if it holds `value` (`lua/unlock.lua`), publishing on `channel` (Token).
    Delete { channel: Option<String> },
    /// Give back one hold of the owner `value` if its count is still `count`
    /// (`lua/reentrant_forget.lua`), publishing on `channel` when it was the last.
    ReentrantRelease {
        count: u32,
        lease_ms: u64,
        channel: String,
    },
    /// Send a read-write lock's release of the owner `value` again, with its unlock latch
    /// (`lua/rw_release.lua`).
    RwRelease(RwRelease),
    /// Send a fair lock's release of the token `value` again (`lua/fair_release.lua`): it
    /// deletes the key only if it still holds that token and, if a live waiter heads the
    /// queue, grants it the lock and publishes the grant, as the release did.
    FairRelease(FairRelease),
}

impl Work {
    /// Gives back a hold counted in a hash (reentrant, read-write): the owner's next acquire
    /// of the key runs it first ([`Janitor::settle`]), so that it cannot take the new hold
    /// for the old one.
    fn counts_holds(&self) -> bool {
        matches!(self, Work::ReentrantRelease { .. } | Work::RwRelease(_))
    }
}

impl Work {
    /// The script that does the job.
    fn script<'s>(&self, s: &'s Scripts) -> &'s LuaScript {
        match self {
            Work::Delete { .. } => &s.unlock,
            Work::ReentrantRelease { .. } => &s.reentrant_forget,
            Work::RwRelease(_) => &s.rw_release,
            Work::FairRelease(_) => &s.fair_release,
        }
    }

    /// The script's keys and arguments for the job on `key` with `value`: exactly those of
    /// the release (or acquire) it stands for.
    fn keys_and_args(&self, key: &str, value: &[u8]) -> (Vec<String>, Vec<Vec<u8>>) {
        let b = |x: &str| x.as_bytes().to_vec();
        let n = |x: u64| x.to_string().into_bytes();
        let value = value.to_vec();
        match self {
            Work::Delete { channel: None } => (vec![key.to_owned()], vec![value]),
            Work::Delete { channel: Some(ch) } => (
                vec![key.to_owned()],
                vec![value, b(keys::UNLOCK_MESSAGE), b(ch)],
            ),
            Work::ReentrantRelease {
                count,
                lease_ms,
                channel,
            } => (
                vec![key.to_owned()],
                vec![
                    value,
                    n(u64::from(*count)),
                    n(*lease_ms),
                    b(channel),
                    b(keys::UNLOCK_MESSAGE),
                ],
            ),
            Work::RwRelease(rw) => {
                let mut args = vec![
                    b(rw.mode),
                    value,
                    b(&rw.channel),
                    n(rw.lease_ms),
                    n(rw.latch_ms),
                ];
                // A nil ARGV is not sent at all (as by the release's own call).
                if let Some(e) = rw.expect {
                    args.push(e.to_string().into_bytes());
                }
                (
                    vec![key.to_owned(), rw.writers.clone(), rw.latch.clone()],
                    args,
                )
            }
            Work::FairRelease(f) => {
                let mut keys = vec![key.to_owned(), f.queue.clone(), f.deadlines.clone()];
                if let Some(fence) = &f.fence {
                    keys.push(fence.clone());
                }
                (keys, vec![value, n(f.grant_ms), b(FAIR_CHANNEL_PREFIX)])
            }
        }
    }

    /// Reads the script's reply: 1 or more when done (deleted, given back), 0 when there was
    /// nothing to do (a reentrant job: the count did not match), -1 for anything else; and a
    /// fair release's grant, if it granted the lock.
    fn read(&self, v: &redis::Value) -> (i64, Option<(Vec<u8>, Grant)>) {
        use redis::Value as V;
        match self {
            Work::Delete { .. } => (if let V::Int(n) = v { *n } else { -1 }, None),
            // nil (nothing changed) is -1 here.
            Work::ReentrantRelease { .. } => (if let V::Int(n) = v { *n } else { -1 }, None),
            // {code, holds}: code 1 when a hold was given back (by this try or, answered from
            // the latch, by the release that ran before); anything else changed nothing.
            Work::RwRelease(_) => match v {
                V::Array(items) => match items.first() {
                    Some(V::Int(code)) => (*code, None),
                    _ => (-1, None),
                },
                _ => (-1, None),
            },
            // {1, receivers, granted token, fence, seconds, microseconds} when released and
            // granted, 1 when released with nobody to grant to, 0 when the key no longer held
            // our token (nothing to do).
            Work::FairRelease(_) => match crate::strategy::fair::parse_release(v) {
                Some(r) => {
                    let granted = (!r.granted.is_empty()).then_some((r.granted, r.grant));
                    (i64::from(r.ours), granted)
                }
                None => (-1, None),
            },
        }
    }
}

/// A release to do again on a new master (see `sentinel_watch`): the job's key, value and
/// work, and until when its hold could live.
#[derive(Debug)]
pub(crate) struct Redo {
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    pub(crate) work: Work,
    pub(crate) until: Instant,
}

impl Redo {
    /// The release `r` again, of `value` (the value it deleted, or one a sweep found).
    pub(crate) fn exact(r: &Released, value: Vec<u8>) -> Redo {
        let work = if let Some(fair) = &r.fair {
            Work::FairRelease(fair.clone())
        } else if let Some(rw) = &r.rw {
            Work::RwRelease(rw.clone())
        } else if let Some((count, lease_ms)) = r.reentrant {
            Work::ReentrantRelease {
                count,
                lease_ms,
                channel: r.channel.clone().unwrap_or_default(),
            }
        } else {
            Work::Delete {
                channel: r.channel.clone(),
            }
        };
        Redo {
            key: r.key.clone(),
            value,
            work,
            until: r.until,
        }
    }
}

impl From<Released> for Redo {
    fn from(r: Released) -> Redo {
        let value = r.value.clone();
        Redo::exact(&r, value)
    }
}

/// A read-write lock release to send again: the arguments of `lua/rw_release.lua` but the
/// owner id (the job's value).
#[derive(Debug, Clone)]
pub(crate) struct RwRelease {
    /// `read` or `write`.
    pub(crate) mode: &'static str,
    /// The lock's set of waiting writers (the script's second key).
    pub(crate) writers: String,
    /// The release's unlock latch key, request id included (the script's third key).
    pub(crate) latch: String,
    pub(crate) channel: String,
    pub(crate) lease_ms: u64,
    pub(crate) latch_ms: u64,
    /// Give the hold back only if the owner's read and write holds add up to this (the undo
    /// of an acquire whose reply was lost: the count it would have left).
    pub(crate) expect: Option<i64>,
}

/// A fair lock's release to send again: the keys and arguments of `lua/fair_release.lua` but
/// the token (the job's value).
#[derive(Debug, Clone)]
pub(crate) struct FairRelease {
    /// The queue's order (the script's second key).
    pub(crate) queue: String,
    /// The queue's deadlines (the script's third key).
    pub(crate) deadlines: String,
    /// The fencing counter, if the lock is fenced (the fourth key).
    pub(crate) fence: Option<String>,
    /// The lease of a grant to the next waiter, in ms.
    pub(crate) grant_ms: u64,
}

/// One pending owner-checked clean-up.
#[derive(Debug)]
struct Job {
    key: String,
    /// The value written (Token, Classic), or the owner id (reentrant).
    value: Vec<u8>,
    work: Work,
    cause: Cause,
    /// After this the hold has expired by itself (or can be taken over): no need to go on.
    until: Instant,
    /// When to try next.
    next: Instant,
    tries: u32,
    /// Creation order: jobs of one key and value run one at a time, oldest first (a reentrant
    /// job's count check depends on the ones before it).
    seq: u64,
}

#[derive(Debug, Default)]
struct Jobs {
    /// Ordered by `seq`.
    list: Vec<Job>,
    /// The next job's `seq`.
    next_seq: u64,
    /// Jobs taken off `list` and being tried (by the thread, or by an owner's acquire): their
    /// key, value and deadline.
    in_flight: Vec<(String, Vec<u8>, Instant)>,
    running: bool,
    shutdown: bool,
}

impl Jobs {
    fn is_in_flight(&self, key: &str, value: &[u8]) -> Option<Instant> {
        self.in_flight
            .iter()
            .find(|(k, v, _)| k == key && v == value)
            .map(|(_, _, until)| *until)
    }

    /// Puts a job back (or in) at its place in creation order.
    fn insert(&mut self, job: Job) {
        let at = self.list.partition_point(|j| j.seq < job.seq);
        self.list.insert(at, job);
    }

    /// The index of the job to run next: the oldest job of its key and value, due at `now`,
    /// none of its key and value in flight. With `only`, jobs of that key and value alone,
    /// due or not.
    fn pick(&self, now: Instant, only: Option<(&str, &[u8])>) -> Option<usize> {
        let mut blocked: HashSet<(&str, &[u8])> = HashSet::new();
        for (i, j) in self.list.iter().enumerate() {
            let pair = (j.key.as_str(), j.value.as_slice());
            if only.is_some_and(|o| o != pair) || blocked.contains(&pair) {
                continue;
            }
            if self.is_in_flight(pair.0, pair.1).is_some() {
                blocked.insert(pair);
                continue;
            }
            if only.is_some() || j.next <= now {
                return Some(i);
            }
            blocked.insert(pair);
        }
        None
    }

    fn finished(&mut self, key: &str, value: &[u8]) {
        if let Some(i) = self
            .in_flight
            .iter()
            .position(|(k, v, _)| k == key && v == value)
        {
            self.in_flight.swap_remove(i);
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    jobs: Mutex<Jobs>,
    /// Wakes the thread: a new job.
    wake: Condvar,
    /// Wakes owners waiting in [`Janitor::settle`]: a try in flight ended.
    done: Condvar,
    /// Jobs that count holds (reentrant and read-write) queued or in flight: lets
    /// [`Janitor::settle`] skip the mutex when zero.
    counted: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The clean-up queue of one client (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Janitor {
    shared: Arc<Shared>,
}

impl Drop for Janitor {
    fn drop(&mut self) {
        // Never joins: this may run on the janitor thread itself.
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
    }
}

impl Janitor {
    /// Deletes `key` in the background if it still holds `value` (publishing on `channel` when
    /// it does), trying until it is answered or until `until`, when the hold expires anyway.
    pub(crate) fn forget(
        &self,
        client: &LockClient,
        key: &str,
        value: &[u8],
        channel: Option<&str>,
        cause: Cause,
        until: Instant,
    ) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        log::info!(
            "lock {key:?}: {}; deleting value {} in the background if it was written (until \
             it would expire, in {} ms)",
            cause.describe(),
            printable(value),
            until.saturating_duration_since(now).as_millis()
        );
        let work = Work::Delete {
            channel: channel.map(str::to_owned),
        };
        self.push(client, key, value, work, cause, until);
    }

    /// Gives back, in the background, one hold of the reentrant lock `key` of `owner` if the
    /// owner's count is `count`: the count before a release that failed on a connection error,
    /// or the count an acquire whose reply was lost would have left. Tried until it is answered
    /// or until `until`, when the hold expires anyway. The owner's next acquire of `key` must
    /// call [`settle`](Self::settle) first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forget_reentrant(
        &self,
        client: &LockClient,
        key: &str,
        owner: &[u8],
        count: u32,
        lease_ms: u64,
        channel: &str,
        cause: Cause,
        until: Instant,
    ) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        log::info!(
            "lock {key:?}: {}; giving back a hold of owner {} in the background if its count \
             is {count} (until it would expire, in {} ms)",
            cause.describe(),
            printable(owner),
            until.saturating_duration_since(now).as_millis()
        );
        let work = Work::ReentrantRelease {
            count,
            lease_ms,
            channel: channel.to_owned(),
        };
        self.push(client, key, owner, work, cause, until);
    }

    /// Sends, in the background, a read-write lock's release of `owner` on `key` again, with the
    /// same unlock latch: a release that ran already answers from its latch, so at most one
    /// hold is given back. Tried until it is answered or until `until` (the hold's expiry, or
    /// sooner, while the latch is sure to live).
    pub(crate) fn forget_rw(
        &self,
        client: &LockClient,
        key: &str,
        owner: &[u8],
        release: RwRelease,
        cause: Cause,
        until: Instant,
    ) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        log::info!(
            "lock {key:?}: {}; sending the {} release of owner {} again in the background, \
             with its unlock latch (until {} ms from now)",
            cause.describe(),
            release.mode,
            printable(owner),
            until.saturating_duration_since(now).as_millis()
        );
        self.push(client, key, owner, Work::RwRelease(release), cause, until);
    }

    /// Sends, in the background, a fair lock's release of the token `value` on `key` again
    /// (owner-checked by the token; a live waiter at the head of the queue is granted the lock
    /// and told, as by the release). Tried until it is answered or until `until`, when the hold
    /// expires anyway.
    pub(crate) fn forget_fair(
        &self,
        client: &LockClient,
        key: &str,
        value: &[u8],
        release: FairRelease,
        cause: Cause,
        until: Instant,
    ) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        log::info!(
            "lock {key:?}: {}; sending the fair release of token {} again in the background \
             (until it would expire, in {} ms)",
            cause.describe(),
            printable(value),
            until.saturating_duration_since(now).as_millis()
        );
        self.push(client, key, value, Work::FairRelease(release), cause, until);
    }

    /// Does `jobs` (releases done on an old master) on the current master now, pipelined on
    /// one connection, [`REPLAY_BATCH`] commands per round trip; a job that fails, or whose
    /// reply says nothing, is queued for the janitor thread, which retries it until `until`.
    pub(crate) fn replay(&self, client: &LockClient, jobs: Vec<Redo>) {
        let now = Instant::now();
        let mut jobs: Vec<Redo> = jobs.into_iter().filter(|j| j.until > now).collect();
        // A reentrant hold given back on the old master whose owner holds the lock again:
        // its count now matches a live hold (see `attempt`).
        jobs.retain(|j| {
            !(matches!(j.work, Work::ReentrantRelease { .. })
                && client.watchdog().holds(&j.key, &j.value))
        });
        let mut iter = jobs.into_iter().peekable();
        while iter.peek().is_some() {
            let batch: Vec<Redo> = iter.by_ref().take(REPLAY_BATCH).collect();
            let Some(first) = batch.first().map(|j| j.key.clone()) else {
                break;
            };
            // Counted holds: the owner's next acquire of the key waits for this try (see
            // `settle`), so that it cannot add a hold the job would take for the old one.
            let counted: Vec<(String, Vec<u8>)> = batch
                .iter()
                .filter(|j| j.work.counts_holds())
                .map(|j| (j.key.clone(), j.value.clone()))
                .collect();
            if !counted.is_empty() {
                let mut list = self.shared.lock();
                for j in batch.iter().filter(|j| j.work.counts_holds()) {
                    list.in_flight
                        .push((j.key.clone(), j.value.clone(), j.until));
                }
                self.shared
                    .counted
                    .fetch_add(counted.len(), Ordering::AcqRel);
            }
            let settled = Settled {
                janitor: self,
                counted,
            };
            let replies: Result<Vec<redis::Value>> = client.with_conn(&first, |con, s| {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                // The new master may not have the scripts cached: load each one used in front
                // (its reply is not read), so that no EVALSHA is refused.
                let mut loaded: Vec<&str> = Vec::new();
                for j in &batch {
                    let script = j.work.script(s);
                    if !loaded.contains(&script.name()) {
                        loaded.push(script.name());
                        pipe.add_command(script.load_cmd()).ignore();
                    }
                }
                for j in &batch {
                    let (keys, args) = j.work.keys_and_args(&j.key, &j.value);
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    pipe.add_command(j.work.script(s).evalsha_keys(&keys, &args));
                }
                pipe.query(con)
            });
            let replies = match replies {
                Ok(r) if r.len() == batch.len() => r,
                Ok(_) | Err(_) => {
                    if let Err(e) = &replies {
                        log::warn!(
                            "Sentinel: {} releases could not be done again on the new master ({}); \
                             retried in the background",
                            batch.len(),
                            e.report()
                        );
                    }
                    for j in batch {
                        self.queue(client, j);
                    }
                    continue;
                }
            };
            let mut done = 0usize;
            for (j, v) in batch.into_iter().zip(replies) {
                if matches!(v, redis::Value::ServerError(_)) {
                    log::debug!(
                        "lock {:?}: replay answered {v:?}; retried in the background",
                        j.key
                    );
                    self.queue(client, j);
                    continue;
                }
                let (n, granted) = j.work.read(&v);
                // A reentrant job answers 0 when it gave back a hold that was not the last.
                let gave_back =
                    n >= 1 || (n == 0 && matches!(j.work, Work::ReentrantRelease { .. }));
                if let Some((token, grant)) = granted {
                    if client.waiters().deliver_grant(&token, grant) {
                        client.wakeups().nudge();
                    }
                }
                if gave_back {
                    done += 1;
                    client.counters().orphan_cleaned();
                    log::warn!(
                        "lock {:?}: released on the new master the hold released on the old one \
                         only (value {})",
                        j.key,
                        printable(&j.value)
                    );
                    if !matches!(j.work, Work::RwRelease(_) | Work::ReentrantRelease { .. }) {
                        client.waiters().notify_release(&j.key);
                    }
                }
            }
            drop(settled);
            log::info!("Sentinel: replay batch done, {done} holds released on the new master");
        }
    }

    /// Queues a replay job for the janitor thread.
    fn queue(&self, client: &LockClient, j: Redo) {
        self.push(
            client,
            &j.key,
            &j.value,
            j.work,
            Cause::ReleasedBeforeSwitch,
            j.until,
        );
    }

    /// Runs, on the caller's thread, a pending reentrant job of `owner` on `key` (and waits for
    /// a try of it in flight on the janitor thread), so that the owner's next acquire cannot be
    /// mistaken by a later try for the hold that job gives back. Errors of that try are
    /// returned (the job is kept for the janitor); `Ok` when there was nothing to do or it is
    /// done.
    pub(crate) fn settle(&self, client: &LockClient, key: &str, owner: &[u8]) -> Result<()> {
        if self.shared.counted.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        loop {
            let job = {
                let mut jobs = self.shared.lock();
                loop {
                    if let Some(until) = jobs.is_in_flight(key, owner) {
                        let now = Instant::now();
                        if until <= now || jobs.shutdown {
                            break None;
                        }
                        jobs = self
                            .shared
                            .done
                            .wait_timeout(jobs, until.saturating_duration_since(now))
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                        continue;
                    }
                    let Some(i) = jobs.pick(Instant::now(), Some((key, owner))) else {
                        break None;
                    };
                    let job = jobs.list.remove(i);
                    jobs.in_flight
                        .push((job.key.clone(), job.value.clone(), job.until));
                    break Some(job);
                }
            };
            let Some(job) = job else {
                return Ok(());
            };
            log::debug!("lock {key:?}: the owner's acquire finishes its pending clean-up first");
            let (again, result) = attempt(client, job);
            self.finish(key, owner, again);
            // Every job of the owner runs before its acquire: stop at the first that fails.
            result?;
        }
    }

    /// Marks the try of the job on `key`/`value` ended; `again` is queued for another try.
    fn finish(&self, key: &str, value: &[u8], again: Option<Job>) {
        let mut jobs = self.shared.lock();
        jobs.finished(key, value);
        if let Some(job) = again {
            jobs.insert(job);
        }
        drop(jobs);
        // The thread may wait for this key's try to end.
        self.shared.wake.notify_one();
        self.shared.done.notify_all();
    }

    fn push(
        &self,
        client: &LockClient,
        key: &str,
        value: &[u8],
        work: Work,
        cause: Cause,
        until: Instant,
    ) {
        let now = Instant::now();
        let mut jobs = self.shared.lock();
        if jobs.list.len() >= MAX_JOBS {
            // Past their holds' expiry first, then the oldest job of a key that has a newer
            // one (the newest per key is kept), then the oldest of all.
            jobs.list.retain(|j| {
                let keep = j.until > now;
                if !keep {
                    j.gone(&self.shared);
                }
                keep
            });
            if jobs.list.len() >= MAX_JOBS {
                let at = jobs
                    .list
                    .iter()
                    .position(|j| {
                        jobs.list
                            .iter()
                            .rev()
                            .any(|later| later.key == j.key && later.seq > j.seq)
                    })
                    .unwrap_or(0);
                let dropped = jobs.list.remove(at);
                dropped.gone(&self.shared);
                log::warn!(
                    "lock {:?}: too many pending clean-ups, this one is dropped (the lock \
                     expires with its lease)",
                    dropped.key
                );
            }
        }
        if work.counts_holds() {
            self.shared.counted.fetch_add(1, Ordering::AcqRel);
        }
        let seq = jobs.next_seq;
        jobs.next_seq = seq.wrapping_add(1);
        jobs.list.push(Job {
            key: key.to_owned(),
            value: value.to_vec(),
            work,
            cause,
            until,
            next: now,
            tries: 0,
            seq,
        });
        if jobs.running {
            self.shared.wake.notify_one();
            return;
        }
        let shared = Arc::clone(&self.shared);
        let weak = client.downgrade();
        match thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || run(&shared, &weak))
        {
            Ok(_) => jobs.running = true,
            Err(e) => log::error!(
                "lock {key:?}: cannot start the clean-up thread ({e}); the lock expires with \
                 its lease"
            ),
        }
    }

    /// Clean-ups not done yet (for tests and monitoring).
    pub(crate) fn pending(&self) -> usize {
        let jobs = self.shared.lock();
        jobs.list.len() + jobs.in_flight.len()
    }
}

impl Job {
    /// The job is done or given up: no longer counted.
    fn gone(&self, shared: &Shared) {
        if self.work.counts_holds() {
            shared.counted.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A job of `client`'s janitor is done or given up (reentrant ones are counted).
fn job_gone(client: &LockClient, counted: bool) {
    if counted {
        client
            .janitor()
            .shared
            .counted
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// Ends the tries of a replay batch's counted jobs (whatever their outcome: a failed one is
/// queued again before this is dropped) and wakes the owners waiting for them.
struct Settled<'a> {
    janitor: &'a Janitor,
    counted: Vec<(String, Vec<u8>)>,
}

impl Drop for Settled<'_> {
    fn drop(&mut self) {
        if self.counted.is_empty() {
            return;
        }
        let shared = &self.janitor.shared;
        let mut jobs = shared.lock();
        for (k, v) in &self.counted {
            jobs.finished(k, v);
        }
        drop(jobs);
        shared
            .counted
            .fetch_sub(self.counted.len(), Ordering::AcqRel);
        shared.wake.notify_one();
        shared.done.notify_all();
    }
}

/// Marks the thread stopped when it exits, also by a panic, so the next job starts another.
struct OffOnExit<'a>(&'a Shared);

impl Drop for OffOnExit<'_> {
    fn drop(&mut self) {
        self.0.lock().running = false;
    }
}

/// The janitor thread: runs jobs as they come due; exits when none is left or the client is
/// gone.
fn run(shared: &Shared, client: &WeakClient) {
    let _off = OffOnExit(shared);
    loop {
        let due = {
            let mut jobs = shared.lock();
            loop {
                if jobs.shutdown {
                    return;
                }
                let now = Instant::now();
                if let Some(i) = jobs.pick(now, None) {
                    let job = jobs.list.remove(i);
                    jobs.in_flight
                        .push((job.key.clone(), job.value.clone(), job.until));
                    break job;
                }
                let Some(next) = jobs.list.iter().map(|j| j.next).min() else {
                    // Nothing left: the thread ends (the next job starts a new one). Marked
                    // under the lock, so a job pushed meanwhile sees it and starts one.
                    jobs.running = false;
                    return;
                };
                // A due job whose key is being cleaned up by its owner's acquire waits for it
                // (woken by `finish`), or for the next due time.
                let wait = next.saturating_duration_since(now).max(BLOCKED_POLL);
                jobs = shared
                    .wake
                    .wait_timeout(jobs, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        let Some(client) = client.upgrade() else {
            return;
        };
        let (key, value) = (due.key.clone(), due.value.clone());
        let (again, _) = attempt(&client, due);
        let mut jobs = shared.lock();
        jobs.finished(&key, &value);
        if let Some(job) = again {
            jobs.insert(job);
        }
        drop(jobs);
        shared.done.notify_all();
    }
}

/// Tries one job: `Some(job)` to try again later, and the try's error, if any.
fn attempt(client: &LockClient, mut job: Job) -> (Option<Job>, Result<()>) {
    job.tries = job.tries.saturating_add(1);
    let key = job.key.as_str();
    let reentrant = matches!(job.work, Work::ReentrantRelease { .. });
    let counted = job.work.counts_holds();
    // A release remembered across a Sentinel switch may have reached the new master already,
    // and the owner may hold the lock again since: its count then matches a live hold. Such a
    // job is dropped (the owner's next acquire cannot race it: see `settle`).
    if reentrant
        && job.cause == Cause::ReleasedBeforeSwitch
        && client.watchdog().holds(key, &job.value)
    {
        log::debug!("lock {key:?}: the owner holds the lock again; the release is not done again");
        job_gone(client, true);
        return (None, Ok(()));
    }
    let reply: Result<redis::Value> = client.with_conn(key, |con, s| {
        let script = job.work.script(s);
        let (keys, args) = job.work.keys_and_args(key, &job.value);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        script.eval_keys(con, &keys, args)
    });
    let (reply, granted) = match reply {
        Ok(v) => {
            let (n, granted) = job.work.read(&v);
            (Ok(n), granted)
        }
        Err(e) => (Err(e), None),
    };
    if let Some((token, grant)) = granted {
        // The script published the grant; a waiter of this client is also told directly.
        if client.waiters().deliver_grant(&token, grant) {
            client.wakeups().nudge();
            log::trace!("lock {key:?}: granted to a thread of this client");
        }
    }
    let (again, result) = match reply {
        Ok(0) if reentrant => {
            client.counters().orphan_cleaned();
            log::warn!(
                "lock {key:?}: gave back the hold left by {} (try {}); the owner keeps its \
                 other holds",
                job.cause.describe(),
                job.tries
            );
            (None, Ok(()))
        }
        Err(e) => (retry_later(job, &e), Err(e)),
        Ok(n) => {
            done(client, &job, n);
            (None, Ok(()))
        }
    };
    if again.is_none() {
        job_gone(client, counted);
    }
    (again, result)
}

/// Logs the answer `n` of a job's script (1 or more: deleted; else nothing to do).
fn done(client: &LockClient, job: &Job, n: i64) {
    let key = job.key.as_str();
    if let Work::RwRelease(rw) = &job.work {
        match n {
            1 => {
                client.counters().orphan_cleaned();
                log::warn!(
                    "lock {key:?}: the {} release left by {} is done (try {}; it ran now, or \
                     had run and its latch answered)",
                    rw.mode,
                    job.cause.describe(),
                    job.tries
                )
            }
            _ => log::info!(
                "lock {key:?}: nothing to give back after {} (the hold expired or was never \
                 ours)",
                job.cause.describe()
            ),
        }
        return;
    }
    match n {
        n if n >= 1 => {
            client.counters().orphan_cleaned();
            log::warn!(
                "lock {key:?}: deleted the lock left by {} (try {})",
                job.cause.describe(),
                job.tries
            );
            client.waiters().notify_release(key);
        }
        _ => log::info!(
            "lock {key:?}: nothing to clean up after {} (it had run, was never written, \
             expired, or was taken over)",
            job.cause.describe()
        ),
    }
}

/// A job whose try failed with `e`: `Some(job)` to try again after [`RETRY_DELAY`], `None` when
/// the hold expires before that.
fn retry_later(mut job: Job, e: &crate::LockError) -> Option<Job> {
    let key = job.key.as_str();
    let now = Instant::now();
    let next = now.checked_add(RETRY_DELAY).unwrap_or(now);
    if next >= job.until {
        log::warn!(
            "lock {key:?}: gave up cleaning up after {} ({} tries, last error: {}); the lock \
             expires with its lease",
            job.cause.describe(),
            job.tries,
            e.report()
        );
        return None;
    }
    log::debug!(
        "lock {key:?}: clean-up try {} failed: {}",
        job.tries,
        e.report()
    );
    job.next = next;
    Some(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(key: &str, value: &[u8], seq: u64, next: Instant) -> Job {
        Job {
            key: key.to_owned(),
            value: value.to_vec(),
            work: Work::Delete { channel: None },
            cause: Cause::FailedRelease,
            until: next + Duration::from_secs(30),
            next,
            tries: 0,
            seq,
        }
    }

    #[test]
    fn jobs_of_one_key_and_value_run_oldest_first_one_at_a_time() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let mut jobs = Jobs::default();
        // The older job of ("k", "o") is not due yet: the newer one must wait for it.
        jobs.insert(job("k", b"o", 2, now));
        jobs.insert(job("k", b"o", 1, later));
        jobs.insert(job("x", b"o", 3, now));
        assert_eq!(
            jobs.list.iter().map(|j| j.seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(jobs.pick(now, None).map(|i| jobs.list[i].seq), Some(3));
        assert_eq!(jobs.pick(later, None).map(|i| jobs.list[i].seq), Some(1));
        // An owner's acquire takes its own jobs, due or not, oldest first.
        assert_eq!(
            jobs.pick(now, Some(("k", b"o"))).map(|i| jobs.list[i].seq),
            Some(1)
        );
        // While one of ("k", "o") is in flight, none of its others is picked.
        let first = jobs.list.remove(0);
        jobs.in_flight.push((first.key, first.value, first.until));
        assert_eq!(jobs.pick(later, None).map(|i| jobs.list[i].seq), Some(3));
        assert_eq!(jobs.pick(later, Some(("k", b"o"))), None);
        jobs.finished("k", b"o");
        assert_eq!(jobs.pick(later, None).map(|i| jobs.list[i].seq), Some(2));
    }
}
