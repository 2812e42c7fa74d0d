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
//! In both cases the caller gets its error at once, and the lock hands the janitor a job: a
//! [`Cleanup`], which the lock's strategy describes as data (a script of the registry, its keys
//! and arguments exactly as first sent, how to read its reply, and whether it gives back a
//! counted hold); the janitor runs it without knowing whose it is. Every clean-up is
//! owner-checked by the script: a delete of the exact value written, a hold given back only if
//! the owner's count is still the one before, a release resent with its unlock latch, so that
//! it can never touch another owner's lock nor give back a hold twice. The janitor retries it
//! on a pooled connection (broken connections are replaced; on Sentinel a new connection goes
//! to the current primary) every [`RETRY_DELAY`] until it is answered, or until the hold would
//! have expired by itself (the job's deadline), whichever comes first, or until it is refused in
//! a way retrying does not change (see [`retry_later`]). Each outcome is logged.
//!
//! A counted clean-up (a hold given back from a hash's count) must not be mistaken for the
//! owner's next hold: the owner's next acquire of that key first finishes the job itself (or
//! waits for the janitor's try in flight): see [`Janitor::settle`].
//!
//! A Sentinel client remembers its latest release of each key ([`remember`]), and its watcher
//! hands [`Janitor::replay`] those to do again on a new master: the keys of the sweeps are read
//! and the releases sent, pipelined on one connection, and only the ones that fail are queued
//! here.
//!
//! ONE thread per client at most, `dlock-janitor`, started by the first job and ended when no
//! job is left (or the client is dropped), so an idle client has none.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::client::cleanup::{Cleanup, Done, Why, RELEASED_BEFORE_SWITCH};
use crate::client::jobs::{Janitor, Job, Shared};
use crate::client::live;
use crate::client::repeats::log_repeat;
use crate::client::waiters::wait_for;
use crate::client::{LockClient, OnExit, WeakClient};
use crate::error::Result;
use crate::lease::printable;
use crate::LockError;

/// Most commands in one pipeline of a replay (its reads too).
const REPLAY_BATCH: usize = 512;
/// Pause between two tries of a clean-up that failed.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(100);
/// The thread's name (at most 15 bytes: Linux truncates thread names).
const THREAD_NAME: &str = "dlock-janitor";
/// Longest wait of the thread when the only due jobs wait for a try in flight of their key.
const BLOCKED_POLL: Duration = Duration::from_millis(5);
/// Most keys named in the log of a dropped client's clean-ups not done.
const DRAIN_KEYS_LOGGED: usize = 8;

/// Where a clean-up is tried (for the log): on the caller's thread, before the failed call
/// returns;
const IN_LINE: &str = "before the call returned";
/// on the janitor thread, or by the owner's next acquire;
const BACKGROUND: &str = "in the background";
/// by the drain of a dropped client;
const DRAIN: &str = "as the client was dropped";
/// by the replay of a Sentinel switch.
const REPLAY: &str = "on the new master";

impl Janitor {
    /// Runs `cleanup` now, on the caller's thread, within the client's command timeout (and
    /// never past `until`), unless `why` says the server did not answer in time; if that try
    /// fails (or is not made), in the background, trying until it is answered or until
    /// `until`, when the hold expires anyway. A counted clean-up still pending must be settled
    /// by the owner's next acquire of the key ([`settle`](Self::settle)).
    ///
    /// The try in-line is what lets a short-lived caller (a CLI, a cron job) exit with nothing
    /// left behind: a write undone only in the background would be left for its whole lease
    /// when the process exits first.
    ///
    /// `true` when the clean-up was done in-line, before this returned (a release that failed
    /// then reports what that try did: see the releases); `false` when it is still pending
    /// (the janitor owns it now) or was not needed (`until` has passed).
    pub(crate) fn forget(
        &self,
        client: &LockClient,
        cleanup: Cleanup,
        why: Why,
        until: Instant,
    ) -> bool {
        let now = Instant::now();
        if until <= now {
            return false;
        }
        let job = Job::new(cleanup, why.cause, until);
        let (key, value, what) = (job.key().to_owned(), job.value().to_vec(), job.cleanup.what);
        let cause = why.cause;
        if self.shared.queue(job) {
            return false;
        }
        let reason = match why.not_in_line {
            Some(reason) => reason.to_owned(),
            None => {
                log::debug!("lock {key:?}: {cause}; {what} of {} now", printable(&value));
                // One command timeout of the client (its connect timeout without one), which
                // bounds the checkout, a connection's opening and the command alike; as for
                // the drain.
                let bound = crate::time::saturating_add(now, client.command_timeout()).min(until);
                let within = bound.saturating_duration_since(now).as_millis();
                match self.run_own(client, &key, &value, None, Some(bound), IN_LINE) {
                    Ok(true) => return true,
                    Ok(false) => format!("not done within {within} ms"),
                    Err(e) => format!("not done within {within} ms: {}", e.report()),
                }
            }
        };
        // Not a warning: the background tries usually succeed (a failover, a restart); one
        // that gives up, or a client dropped with it undone, warns.
        log::info!(
            "lock {key:?}: {cause} ({reason}); {what} of {} in the background (until it would \
             expire, in {} ms)",
            printable(&value),
            until.saturating_duration_since(Instant::now()).as_millis()
        );
        self.ensure_thread(client);
        false
    }

    /// Runs, on the caller's thread, the pending jobs of `value` at `key`, oldest first (one
    /// at a time, as the thread does), waiting for a try of theirs in flight (`when`, for the
    /// log). Nothing past `bound`; without it, a try in flight is waited for until its hold
    /// would expire. `owner`: the entry of an owner's acquire (see [`settle`](Self::settle)),
    /// paused while it waits and tries. Stops at the first try that fails (its job is back in
    /// the queue) with its error; `Ok(false)` when it stopped for want of time; `Ok(true)` once
    /// none is left.
    fn run_own(
        &self,
        client: &LockClient,
        key: &str,
        value: &[u8],
        owner: Option<u64>,
        bound: Option<Instant>,
        when: &str,
    ) -> Result<bool> {
        loop {
            let job = {
                let mut jobs = self.shared.lock();
                loop {
                    let in_flight = jobs.is_in_flight(key, value);
                    let next = jobs.pick(|j| j.is(key, value));
                    let end = bound.or(in_flight);
                    match (next, in_flight) {
                        (None, None) => return Ok(true),
                        _ if end.is_some_and(|end| end <= Instant::now()) => return Ok(false),
                        (Some(i), _) => break jobs.take(i),
                        // An owner's acquire is not under way while it waits: the try in
                        // flight may be a replay that waits for this owner's attempts (see
                        // `holds_again`).
                        (None, Some(until)) => {
                            let left = bound
                                .unwrap_or(until)
                                .saturating_duration_since(Instant::now());
                            let done = &self.shared.done;
                            jobs = client.live().paused(owner, || wait_for(done, jobs, left));
                        }
                    }
                }
            };
            if owner.is_some() {
                log::debug!(
                    "lock {key:?}: the owner's acquire finishes its pending clean-up first"
                );
            }
            // Older jobs of the key and value run first: stop at the first that fails. The
            // owner's acquire is not under way during the try either: a replayed counted
            // release waits for the owner's attempts (see `holds_again`), and would wait
            // for this very one.
            client
                .live()
                .paused(owner, || attempt(client, job, bound, when))?;
        }
    }

    /// Tries every pending job once more, on the caller's thread, within one command timeout for
    /// them all (and waits as long for the tries in flight on the thread): called when the
    /// last handle of the client is dropped, before its threads stop. What is not done by then
    /// is logged: those locks expire with their leases.
    pub(crate) fn drain(&self, client: &LockClient) {
        // Each key and value once, those with a try in flight last: the wait for it may take
        // the time left.
        let mut pairs: Vec<(bool, String, Vec<u8>)> = {
            let jobs = self.shared.lock();
            let in_flight = |j: &Job| jobs.is_in_flight(j.key(), j.value()).is_some();
            let pair = |j: &Job| (in_flight(j), j.key().to_owned(), j.value().to_vec());
            jobs.list.iter().map(pair).collect()
        };
        if pairs.is_empty() {
            return;
        }
        pairs.sort();
        pairs.dedup();
        let start = Instant::now();
        let bound = crate::time::saturating_add(start, client.command_timeout());
        for (_, key, value) in &pairs {
            if let Ok(false) = self.run_own(client, key, value, None, Some(bound), DRAIN) {
                break;
            }
        }
        let jobs = self.shared.lock();
        let left = jobs.list.len();
        if left == 0 {
            log::debug!("the client is dropped: its pending clean-ups are done");
            return;
        }
        let keys: Vec<&str> = jobs
            .list
            .iter()
            .map(Job::key)
            .take(DRAIN_KEYS_LOGGED)
            .collect();
        log::warn!(
            "the client is dropped with {left} clean-ups not done within {} ms (locks {keys:?}{}); \
             those locks expire with their leases",
            bound.saturating_duration_since(start).as_millis(),
            if left > keys.len() { ", ..." } else { "" }
        );
    }

    /// Does `releases` (done on an old master) again on the current master now, pipelined on
    /// one connection, [`REPLAY_BATCH`] commands per round trip (see [`redos`] for what is
    /// sent); a job that fails is queued for the janitor thread, which retries it until its
    /// deadline.
    pub(crate) fn replay(&self, client: &LockClient, releases: Vec<Job>) {
        let now = Instant::now();
        let releases: Vec<Job> = releases.into_iter().filter(|r| r.until > now).collect();
        for batch in releases.chunks(REPLAY_BATCH) {
            // Counted holds are marked in flight, as the thread's tries are: the owner's next
            // acquire of the key waits for this try (see `settle`), so that it cannot add a
            // hold the job would take for the old one. Marked first, then an owner that
            // acquires or holds the lock already (entered before its acquire settles) is left
            // alone: its count may be its live hold's.
            let batch: Vec<Job> = redos(client, batch)
                .into_iter()
                .map(|j| self.shared.start(j))
                .collect();
            let (alone, batch): (Vec<Job>, Vec<Job>) = batch
                .into_iter()
                .partition(|j| holds_again(client, j, None));
            alone.into_iter().for_each(|j| self.shared.finish(j, false));
            let Some(first) = batch.first().map(|j| j.key().to_owned()) else {
                continue;
            };
            let replies: Result<Vec<redis::Value>> = client.with_conn(&first, |con, s| {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                // The new master may not have the scripts cached: load each one used in front
                // (its reply is not read), so that no EVALSHA is refused.
                let mut loaded: Vec<&str> = Vec::new();
                for j in &batch {
                    let script = (j.cleanup.script)(s);
                    if !loaded.contains(&script.name()) {
                        loaded.push(script.name());
                        pipe.add_command(script.load_cmd()).ignore();
                    }
                }
                for j in &batch {
                    let keys: Vec<&str> = j.cleanup.keys.iter().map(String::as_str).collect();
                    pipe.add_command((j.cleanup.script)(s).evalsha_keys(&keys, &j.cleanup.args));
                }
                pipe.query(con)
            });
            let replies = match replies {
                Ok(r) if r.len() == batch.len() => r,
                failed => {
                    if let Err(e) = &failed {
                        log_repeat!(
                            client.repeats(),
                            "Sentinel: releases not done again on the new master",
                            log::Level::Warn,
                            "Sentinel: {} releases could not be done again on the new master ({}); \
                             retried in the background",
                            batch.len(),
                            e.report()
                        );
                    }
                    batch.into_iter().for_each(|j| self.shared.finish(j, true));
                    self.ensure_thread(client);
                    continue;
                }
            };
            let mut done = 0usize;
            for (j, v) in batch.into_iter().zip(replies) {
                // A server's error (a `NOSCRIPT` when the `SCRIPT LOAD` in front was refused, a
                // `BUSY` script) is retried in the background, whose tries fall back to `EVAL`.
                if let redis::Value::ServerError(_) = v {
                    self.shared.finish(j, true);
                    continue;
                }
                done += usize::from(conclude(client, j, Ok(&v), REPLAY));
            }
            self.ensure_thread(client);
            log::info!("Sentinel: replay batch done, {done} holds released on the new master");
        }
    }

    /// Called by an acquire of `owner` at `key` under way (see `LiveValues::attempt`).
    ///
    /// Runs, on the caller's thread, a pending counted job of `owner` on `key` (and waits for
    /// a try of it in flight on the janitor thread), so that the owner's next acquire cannot be
    /// mistaken by a later try for the hold that job gives back. Errors of that try are
    /// returned (the job is kept for the janitor); `Ok` when there was nothing to do or it is
    /// done.
    pub(crate) fn settle(&self, client: &LockClient, key: &str, owner: &[u8]) -> Result<()> {
        if self.shared.counted.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let attempting = Some(live::attempting(key, owner));
        self.run_own(client, key, owner, attempting, None, BACKGROUND)
            .map(drop)
            .inspect_err(|_| self.ensure_thread(client))
    }

    /// Wakes the janitor thread for the jobs queued, or starts it if it is not running, unless
    /// none is left. Also after a try on the caller's thread that failed: the thread may have
    /// ended while its job was in flight here (marked so in the list), and a job queued again needs
    /// one as much as a new one.
    fn ensure_thread(&self, client: &LockClient) {
        let mut jobs = self.shared.lock();
        let Some(key) = jobs
            .list
            .iter()
            .find(|j| !j.flying)
            .map(|j| j.key().to_owned())
        else {
            return;
        };
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
                "lock {key:?}: cannot start the clean-up thread ({e}); the lock expires with its \
                 lease"
            ),
        }
    }
}

/// Remembers a successful release by `client` (see the module docs), to be done again by
/// `cleanup` (by a sweep with the client's token prefix `sweep`, if its values carry one) until
/// `until`; one sent in switch `generation`, before the last switch the client followed, is
/// replayed at once (it may have reached the old master after the replay).
pub(crate) fn remember(
    client: &LockClient,
    cleanup: Cleanup,
    sweep: Option<&[u8]>,
    generation: u64,
    until: Instant,
) {
    let Some(switches) = client.switches() else {
        return;
    };
    let mut r = Job::new(cleanup, RELEASED_BEFORE_SWITCH, until);
    r.sweep = sweep.map(<[u8]>::to_vec);
    if let Some(late) = switches.remember(r, generation) {
        log::debug!(
            "lock {:?}: released on a connection of the master before the switch; done again \
             on the new master",
            late.key()
        );
        client.janitor().replay(client, vec![late]);
    }
}

/// The janitor thread: runs jobs as they come due; exits when none is left or the client is
/// gone.
fn run(shared: &Shared, client: &WeakClient) {
    // Marks the thread stopped when it exits, also by a panic, so the next job starts another.
    let _off = OnExit(|| shared.lock().running = false);
    loop {
        let due = {
            let mut jobs = shared.lock();
            loop {
                if jobs.shutdown {
                    return;
                }
                let now = Instant::now();
                if let Some(i) = jobs.pick(|j| j.next <= now) {
                    break jobs.take(i);
                }
                let idle = jobs.list.iter().filter(|j| !j.flying);
                let Some(next) = idle.map(|j| j.next).min() else {
                    // Nothing left: the thread ends (the next job starts a new one). Marked
                    // under the lock, so a job pushed meanwhile sees it and starts one.
                    jobs.running = false;
                    return;
                };
                // A due job whose key is being cleaned up by its owner's acquire waits for it
                // (woken by `finish`), or for the next due time.
                let left = next.saturating_duration_since(now).max(BLOCKED_POLL);
                jobs = wait_for(&shared.wake, jobs, left);
            }
        };
        let Some(client) = client.upgrade() else {
            return;
        };
        let _ = attempt(&client, due, None, BACKGROUND);
    }
}

/// What to send again for `releases`: a sweep entry reads its key (one pipeline for them all)
/// and releases the value found if this client wrote it and does not hold it; any other entry
/// is sent again as itself.
fn redos(client: &LockClient, releases: &[Job]) -> Vec<Job> {
    let (sweeps, exact): (Vec<&Job>, Vec<&Job>) = releases.iter().partition(|r| r.sweep.is_some());
    let mut jobs: Vec<Job> = exact.into_iter().cloned().collect();
    let Some(first) = sweeps.first() else {
        return jobs;
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for r in &sweeps {
        pipe.cmd("GET").arg(r.key());
    }
    match client.with_conn(first.key(), |con, _| pipe.query::<Vec<redis::Value>>(con)) {
        Ok(found) => {
            for (r, v) in sweeps.iter().zip(found) {
                let redis::Value::BulkString(value) = v else {
                    continue;
                };
                let ours = r.sweep.as_deref().is_some_and(|p| value.starts_with(p));
                // Read after the value was found: a hold whose write the read saw was
                // registered before it was sent.
                if ours && !client.live().contains(live::value(&value)) {
                    let mut job = (*r).clone();
                    job.cleanup.set_value(value);
                    jobs.push(job);
                }
            }
        }
        Err(e) => {
            // Nothing read: the value last released at each key is the best guess (the
            // janitor retries it; a sweep cannot be, as it must read first).
            log_repeat!(
                client.repeats(),
                "Sentinel: keys not read on the new master",
                log::Level::Warn,
                "Sentinel: could not read {} keys on the new master ({}); releasing the last \
                 value released at each, owner-checked, in the background",
                sweeps.len(),
                e.report()
            );
            jobs.extend(sweeps.into_iter().cloned());
        }
    }
    jobs
}

/// Longest wait of a counted replay for the owner's acquire under way.
const ATTEMPT_WAIT: Duration = Duration::from_secs(5);

/// For a counted release done again after a Sentinel switch, whose try is marked in flight
/// (so the owner's next acquire waits for it in [`Janitor::settle`]): waits for the owner's
/// acquire under way, if any (it may have passed `settle` before the mark; at most
/// [`ATTEMPT_WAIT`], and never past `until`: the bound of a try on a caller's thread), then
/// true if the owner holds the lock again: its count on the new master may then be that live
/// hold's, which the release must not give back. False for any other job.
fn holds_again(client: &LockClient, job: &Job, until: Option<Instant>) -> bool {
    if !job.cleanup.counted || job.cause != RELEASED_BEFORE_SWITCH {
        return false;
    }
    let (key, owner) = (job.key(), job.value());
    let end = crate::time::saturating_add(Instant::now(), ATTEMPT_WAIT);
    let end = until.map_or(end, |u| end.min(u));
    while client.live().contains(live::attempting(key, owner)) && Instant::now() < end {
        thread::sleep(Duration::from_millis(1));
    }
    let holds = client.live().contains(live::holding(key, owner));
    if holds {
        log::debug!("lock {key:?}: the owner holds the lock again; its release is not done again");
    }
    holds
}

/// Tries one job, marked flying in the list meanwhile (`when`, for the log), nothing waiting
/// past `until` (if given), then marks its try ended (see [`conclude`]). The try's error, if
/// any.
fn attempt(client: &LockClient, job: Job, until: Option<Instant>, when: &str) -> Result<()> {
    // A counted release remembered across a Sentinel switch may have reached the new master
    // already, and the owner may hold the lock again since: its count then matches a live
    // hold. Such a job is dropped (the owner's next acquire cannot race it: see `settle`).
    if holds_again(client, &job, until) {
        client.janitor().shared.finish(job, false);
        return Ok(());
    }
    let reply = client.with_conn_until(job.key(), until, |con, s| {
        let keys: Vec<&str> = job.cleanup.keys.iter().map(String::as_str).collect();
        (job.cleanup.script)(s).eval_keys(con, &keys, &job.cleanup.args)
    });
    conclude(client, job, reply.as_ref(), when);
    reply.map(drop)
}

/// Ends a try of `job` (`when`, for the log) that got `reply`: what it did is logged, or the
/// job is queued again if it failed and may be tried again later (see [`retry_later`]). True
/// if it did something.
fn conclude(
    client: &LockClient,
    mut job: Job,
    reply: std::result::Result<&redis::Value, &LockError>,
    when: &str,
) -> bool {
    job.tries = job.tries.saturating_add(1);
    let (again, did) = match reply {
        Ok(v) => {
            // A grant the script made (and published) is also handed directly to a waiter of
            // this client; a clean-up that worked is counted, and one that freed the lock
            // wakes this client's waiters.
            let (did, granted) = (job.cleanup.read)(v);
            if let Some((token, grant)) = granted {
                if client.waiters().deliver_grant(&token, grant) {
                    client.wakeups().nudge();
                    log::trace!("lock {:?}: granted to a thread of this client", job.key());
                }
            }
            if did != Done::Nothing {
                client.counters().orphan_cleaned();
            }
            if did == Done::Freed {
                client.waiters().notify_release(job.key());
            }
            log_done(&job, did, when);
            (false, did)
        }
        Err(e) => (retry_later(client, &mut job, e), Done::Nothing),
    };
    client.janitor().shared.finish(job, again);
    did != Done::Nothing
}

/// Logs what a job's script did: info, since the clean-up worked (what is left behind is
/// what the warnings are for). A replay's is logged when it found something.
fn log_done(job: &Job, did: Done, when: &str) {
    let key = job.key();
    match did {
        Done::Nothing if when == REPLAY => {}
        _ if when == REPLAY => log::info!(
            "lock {key:?}: released on the new master the hold released on the old one only \
             (value {})",
            printable(job.value())
        ),
        Done::Freed | Done::GaveBack => log::info!(
            "lock {key:?}: after {}, {} (value {}) {} {when} (try {})",
            job.cause,
            job.cleanup.what,
            printable(job.value()),
            if did == Done::Freed {
                "freed the lock"
            } else {
                "gave a hold back"
            },
            job.tries
        ),
        Done::Nothing => log::info!(
            "lock {key:?}: after {}, nothing left to clean up {when} (it had run, was never \
             written, expired, or was taken over)",
            job.cause
        ),
    }
}

/// A job whose try failed with `e`: true to try again after [`RETRY_DELAY`] (its next try set),
/// false when the hold expires before that, or when `e` is not worth retrying (a refusal that
/// retrying does not change: no permission, a wrong-type key, a reply that makes no sense).
fn retry_later(client: &LockClient, job: &mut Job, e: &LockError) -> bool {
    let key = job.key();
    if !e.worth_retrying() {
        log::warn!(
            "lock {key:?}: gave up {} of {} after {} ({} tries): the server refused it in a way \
             retrying does not change: {}; the lock expires with its lease",
            job.cleanup.what,
            printable(job.value()),
            job.cause,
            job.tries,
            e.report()
        );
        return false;
    }
    let next = crate::time::after(RETRY_DELAY);
    if next >= job.until {
        log_repeat!(
            client.repeats(),
            "clean-up given up",
            log::Level::Warn,
            "lock {key:?}: gave up cleaning up after {} ({} tries, last error: {}); the lock \
             expires with its lease",
            job.cause,
            job.tries,
            e.report()
        );
        return false;
    }
    log_repeat!(
        client.repeats(),
        "clean-up try failed",
        log::Level::Debug,
        "lock {key:?}: clean-up try {} failed, tried again in {}: {}",
        job.tries,
        crate::error::Rounded(RETRY_DELAY),
        e.report()
    );
    job.next = next;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::cleanup::FAILED_RELEASE;

    /// A client that sends nothing until asked, to a port nothing listens on (refused at once).
    fn refused_client() -> LockClient {
        crate::LockClient::builder("redis://127.0.0.1:1/")
            .lazy_connect()
            .build()
            .expect("client")
    }

    fn counted_replay(key: &str, owner: &[u8]) -> Job {
        let mut cleanup = Cleanup::delete_for_test(key, owner);
        cleanup.counted = true;
        let until = crate::time::after(Duration::from_secs(60));
        Job::new(cleanup, RELEASED_BEFORE_SWITCH, until)
    }

    #[test]
    fn an_owners_acquire_settling_a_replayed_release_does_not_wait_for_itself() {
        let client = refused_client();
        let (key, owner) = ("k", b"owner".as_slice());
        client.janitor().shared.queue(counted_replay(key, owner));
        // The owner's acquire registers itself, then settles its pending clean-ups first (as
        // the reentrant and read-write acquires do).
        let attempt = client.live().attempt(key, owner);
        let start = Instant::now();
        let settled = client.janitor().settle(&client, key, owner);
        let took = start.elapsed();
        drop(attempt);
        // The try is refused (nothing listens): what matters is that it was made at once,
        // not after waiting `ATTEMPT_WAIT` (5 s) for the caller's own attempt.
        assert!(settled.is_err(), "the try was refused");
        assert!(took < Duration::from_millis(2_500), "settle took {took:?}");
        assert!(
            !client.live().contains(live::attempting(key, owner)),
            "registration balanced"
        );
    }

    #[test]
    fn a_clean_up_refused_for_good_is_not_retried() {
        let client = refused_client();
        let job = || {
            let until = crate::time::after(Duration::from_secs(60));
            let mut job = Job::new(Cleanup::delete_for_test("k", b"v"), FAILED_RELEASE, until);
            job.tries = 1;
            job
        };
        let wrong_type = crate::LockError::WrongType {
            key: "k".to_owned(),
        };
        assert!(!retry_later(&client, &mut job(), &wrong_type));
        let denied = crate::LockError::from_redis(
            "k",
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                "no permission",
            )),
        );
        assert!(!retry_later(&client, &mut job(), &denied));
        let reset = crate::LockError::connection(
            "k",
            crate::error::Fault::Unreachable,
            "connection reset".into(),
        );
        assert!(retry_later(&client, &mut job(), &reset));
        let transient = crate::LockError::connection(
            "k",
            crate::error::Fault::NotConnected,
            "no connection".into(),
        );
        assert!(retry_later(&client, &mut job(), &transient));
    }

    #[test]
    fn the_wait_for_an_owners_attempt_ends_at_the_bound() {
        let client = refused_client();
        let (key, owner) = ("k", b"owner".as_slice());
        let _attempt = client.live().attempt(key, owner);
        let start = Instant::now();
        let bound = crate::time::after(Duration::from_millis(100));
        assert!(!holds_again(
            &client,
            &counted_replay(key, owner),
            Some(bound)
        ));
        let took = start.elapsed();
        assert!(took < Duration::from_millis(2_500), "waited {took:?}");
    }
}
