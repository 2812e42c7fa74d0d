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
//! ONE thread per client at most, `dlock-janitor`, started by the first job and ended when no
//! job is left (or the client is dropped), so an idle client has none.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::client::{LockClient, WeakClient};
use crate::keys;
use crate::lock::printable;

/// Pause between two tries of a clean-up that failed.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(100);
/// The thread's name (at most 15 bytes: Linux truncates thread names).
const THREAD_NAME: &str = "dlock-janitor";
/// Most jobs kept at once: a client that keeps failing must not grow without bound. Past it,
/// the oldest job is dropped (its lock expires with its lease).
const MAX_JOBS: usize = 4_096;

/// Why a clean-up job exists (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// An acquire whose reply was lost: the value may or may not have been written.
    LostAcquireReply,
    /// A release that failed on a connection error.
    FailedRelease,
}

impl Cause {
    fn describe(self) -> &'static str {
        match self {
            Cause::LostAcquireReply => "acquire whose reply was lost",
            Cause::FailedRelease => "release that failed",
        }
    }
}

/// What a clean-up undoes, owner-checked.
#[derive(Debug, Clone)]
pub(crate) enum Undo {
    /// A string value (Token, Classic): delete the key if it holds exactly `value`, and
    /// publish the release on `channel` (Token) when it does.
    Value {
        value: Vec<u8>,
        channel: Option<String>,
    },
    /// One hold of a reentrant lock: give it back only if `owner`'s count is exactly `count`
    /// (`lua/reentrant_undo.lua`); the remaining holds get `lease_ms`, and the release is
    /// published on `channel` when the lock becomes free.
    Hold {
        owner: Vec<u8>,
        count: u32,
        lease_ms: u64,
        channel: String,
    },
}

impl Undo {
    fn describe(&self) -> String {
        match self {
            Undo::Value { value, .. } => format!("value {}", printable(value)),
            Undo::Hold { owner, count, .. } => {
                format!("hold {count} of owner {}", printable(owner))
            }
        }
    }
}

/// One pending owner-checked clean-up.
#[derive(Debug)]
struct Job {
    key: String,
    undo: Undo,
    cause: Cause,
    /// After this the hold has expired by itself (or can be taken over): no need to go on.
    until: Instant,
    /// When to try next.
    next: Instant,
    tries: u32,
}

#[derive(Debug, Default)]
struct Jobs {
    list: Vec<Job>,
    /// Jobs taken off `list` by the thread and being tried.
    in_flight: usize,
    running: bool,
    shutdown: bool,
}

#[derive(Debug, Default)]
struct Shared {
    jobs: Mutex<Jobs>,
    wake: Condvar,
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
        let undo = Undo::Value {
            value: value.to_vec(),
            channel: channel.map(str::to_owned),
        };
        self.undo(client, key, undo, cause, until);
    }

    /// Undoes `undo` at `key` in the background, owner-checked, trying until it is answered
    /// or until `until`, when the hold expires anyway.
    pub(crate) fn undo(
        &self,
        client: &LockClient,
        key: &str,
        undo: Undo,
        cause: Cause,
        until: Instant,
    ) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        log::info!(
            "lock {key:?}: {}; undoing {} in the background if it is there (until it would \
             expire, in {} ms)",
            cause.describe(),
            undo.describe(),
            until.saturating_duration_since(now).as_millis()
        );
        let mut jobs = self.shared.lock();
        if jobs.list.len() >= MAX_JOBS {
            let dropped = jobs.list.remove(0);
            log::warn!(
                "lock {:?}: too many pending clean-ups, this one is dropped (the lock expires \
                 with its lease)",
                dropped.key
            );
        }
        jobs.list.push(Job {
            key: key.to_owned(),
            undo,
            cause,
            until,
            next: now,
            tries: 0,
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
        jobs.list.len() + jobs.in_flight
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
                if let Some(i) = jobs.list.iter().position(|j| j.next <= now) {
                    jobs.in_flight += 1;
                    break jobs.list.swap_remove(i);
                }
                let Some(next) = jobs.list.iter().map(|j| j.next).min() else {
                    // Nothing left: the thread ends (the next job starts a new one). Marked
                    // under the lock, so a job pushed meanwhile sees it and starts one.
                    jobs.running = false;
                    return;
                };
                jobs = shared
                    .wake
                    .wait_timeout(jobs, next.saturating_duration_since(now))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        let Some(client) = client.upgrade() else {
            return;
        };
        let again = attempt(&client, due);
        let mut jobs = shared.lock();
        jobs.in_flight = jobs.in_flight.saturating_sub(1);
        if let Some(job) = again {
            jobs.list.push(job);
        }
    }
}

/// Tries one job: `Some(job)` to try again later.
fn attempt(client: &LockClient, mut job: Job) -> Option<Job> {
    job.tries = job.tries.saturating_add(1);
    let key = job.key.as_str();
    let reply: crate::Result<i64> = client.with_conn(key, |con, s| match &job.undo {
        Undo::Value {
            value,
            channel: None,
        } => s.unlock.eval(con, key, value.as_slice()),
        Undo::Value {
            value,
            channel: Some(ch),
        } => s.unlock.eval(
            con,
            key,
            (value.as_slice(), keys::UNLOCK_MESSAGE, ch.as_str()),
        ),
        Undo::Hold {
            owner,
            count,
            lease_ms,
            channel,
        } => s.reentrant_undo.eval(
            con,
            key,
            (
                owner.as_slice(),
                *count,
                *lease_ms,
                channel.as_str(),
                keys::UNLOCK_MESSAGE,
            ),
        ),
    });
    match reply {
        Ok(n) if n >= 1 => {
            log::warn!(
                "lock {key:?}: undid the {} left by an {} (try {})",
                job.undo.describe(),
                job.cause.describe(),
                job.tries
            );
            client.waiters().notify_release(key);
            None
        }
        Ok(_) => {
            log::info!(
                "lock {key:?}: nothing to clean up after the {} (never written, expired, or \
                 changed since)",
                job.cause.describe()
            );
            None
        }
        Err(e) => {
            let now = Instant::now();
            let next = now.checked_add(RETRY_DELAY).unwrap_or(now);
            if next >= job.until {
                log::warn!(
                    "lock {key:?}: gave up cleaning up after an {} ({} tries, last error: {}); \
                     the lock expires with its lease",
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
    }
}
