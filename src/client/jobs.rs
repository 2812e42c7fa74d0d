//! The janitor's queue of one client: its jobs and the state its thread and the owners'
//! acquires share. State only: the client owns it, and the thread that works it, with the
//! clean-ups it runs, is in `janitor.rs` (which needs the client to send commands).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::client::cleanup::{Cause, Cleanup};

/// Most jobs kept at once: a client that keeps failing must not grow without bound. Past it,
/// the oldest job is dropped (its lock expires with its lease).
pub(crate) const MAX_JOBS: usize = 4_096;

/// One pending owner-checked clean-up, of the value (or the owner id of a counted hold) its
/// [`Cleanup`] checks at its key; also a release a Sentinel client would do again on a new
/// master (see `switches.rs`).
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) cleanup: Cleanup,
    pub(crate) cause: Cause,
    /// After this the hold has expired by itself (or can be taken over): no need to go on.
    pub(crate) until: Instant,
    /// When to try next.
    pub(crate) next: Instant,
    pub(crate) tries: u32,
    /// Creation order, set when it is queued: jobs of one key and value run one at a time,
    /// oldest first (a counted job's count check depends on the ones before it).
    pub(crate) seq: u64,
    /// Being tried: see [`Jobs::list`].
    pub(crate) flying: bool,
    /// A release to do again after a Sentinel switch whose values at the key start with this
    /// prefix (the client's id): the replay is a sweep that releases whatever value of this
    /// client the new master holds there and no thread of it holds, not only this one.
    pub(crate) sweep: Option<Vec<u8>>,
}

impl Job {
    /// A job to try at once.
    pub(crate) fn new(cleanup: Cleanup, cause: Cause, until: Instant) -> Job {
        Job {
            cleanup,
            cause,
            until,
            next: Instant::now(),
            tries: 0,
            seq: 0,
            flying: false,
            sweep: None,
        }
    }

    pub(crate) fn key(&self) -> &str {
        self.cleanup.keys.first().map_or("", String::as_str)
    }

    /// The value written, or the owner id of a counted hold.
    pub(crate) fn value(&self) -> &[u8] {
        self.cleanup
            .args
            .get(self.cleanup.value_arg)
            .map_or(&[], Vec::as_slice)
    }

    pub(crate) fn is(&self, key: &str, value: &[u8]) -> bool {
        self.key() == key && self.value() == value
    }
}

#[derive(Debug, Default)]
pub(crate) struct Jobs {
    /// In creation order (`seq`). A job being tried (by the thread, an owner's acquire or a
    /// replay) stays at its place, marked `flying`, until its try ends.
    pub(crate) list: Vec<Job>,
    /// The next job's `seq`.
    pub(crate) next_seq: u64,
    pub(crate) running: bool,
    pub(crate) shutdown: bool,
    /// For the crate's tests (`LockClient::hold_cleanups_back`): new jobs are queued only,
    /// neither tried in-line nor by the thread, until the client's drain.
    pub(crate) held_back: bool,
}

impl Jobs {
    /// The job to drop when the queue is full (its index), never one being tried: the first
    /// whose hold has expired by `now`, else the oldest job of a key that has a newer one (the
    /// newest per key is kept), else the oldest of all. It runs under the queue's lock, on
    /// every push past the cap.
    pub(crate) fn to_drop_at_cap(&self, now: Instant) -> Option<usize> {
        let mut idle = self.list.iter().enumerate().filter(|(_, j)| !j.flying);
        if let Some((at, _)) = idle.clone().find(|(_, j)| j.until <= now) {
            return Some(at);
        }
        let mut newer: HashSet<&str> = HashSet::with_capacity(self.list.len());
        let mut at = None;
        for (i, j) in self.list.iter().enumerate().rev() {
            if !newer.insert(j.key()) && !j.flying {
                at = Some(i);
            }
        }
        at.or_else(|| idle.next().map(|(i, _)| i))
    }

    /// The deadline of the try in flight of `value` at `key`, if one is.
    pub(crate) fn is_in_flight(&self, key: &str, value: &[u8]) -> Option<Instant> {
        let mut flying = self.list.iter().filter(|j| j.flying);
        flying.find(|j| j.is(key, value)).map(|j| j.until)
    }

    /// The index of the oldest job that `ready` takes whose key and value have no try in
    /// flight and no older job left (due or not): jobs of one key and value run one at a time,
    /// oldest first. The thread takes the jobs due, an owner's acquire its own jobs (due or
    /// not), the drain of a dropped client each job once.
    pub(crate) fn pick(&self, ready: impl Fn(&Job) -> bool) -> Option<usize> {
        let mut blocked: HashSet<(&str, &[u8])> = HashSet::new();
        for (i, j) in self.list.iter().enumerate() {
            let pair = (j.key(), j.value());
            if blocked.contains(&pair) {
                continue;
            }
            if !j.flying && ready(j) {
                return Some(i);
            }
            blocked.insert(pair);
        }
        None
    }

    /// Marks the job at `i` (as [`pick`](Self::pick) found it) in flight: the copy to try.
    pub(crate) fn take(&mut self, i: usize) -> Job {
        let job = &mut self.list[i];
        job.flying = true;
        job.clone()
    }
}

#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) jobs: Mutex<Jobs>,
    /// Wakes the thread: a new job.
    pub(crate) wake: Condvar,
    /// Wakes owners waiting in [`Janitor::settle`]: a try in flight ended.
    pub(crate) done: Condvar,
    /// Counted jobs (see [`Cleanup::counted`]) queued or in flight: lets
    /// [`Janitor::settle`] skip the mutex when zero.
    pub(crate) counted: AtomicUsize,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a job (the thread not woken): whether the crate's tests hold new jobs back
    /// (`LockClient::hold_cleanups_back`). At most [`MAX_JOBS`] are kept (and those in
    /// flight).
    pub(crate) fn queue(&self, job: Job) -> bool {
        self.enter(job).0
    }

    /// A new job of a Sentinel replay, to be tried at once: a counted one (which the owner's
    /// next acquire waits for) is queued marked in flight, and the copy to try returned; any
    /// other is returned as it is.
    pub(crate) fn start(&self, job: Job) -> Job {
        match job.cleanup.counted {
            true => {
                self.enter(Job {
                    flying: true,
                    ..job
                })
                .1
            }
            false => job,
        }
    }

    fn enter(&self, mut job: Job) -> (bool, Job) {
        let mut jobs = self.lock();
        let now = Instant::now();
        // A replay's job in flight drops none (a replay batch is bounded: REPLAY_BATCH).
        let full = !job.flying && jobs.list.len() >= MAX_JOBS;
        if let Some(dropped) = full.then(|| jobs.to_drop_at_cap(now)).flatten() {
            let dropped = jobs.list.remove(dropped);
            self.counted
                .fetch_sub(usize::from(dropped.cleanup.counted), Ordering::AcqRel);
            if dropped.until > now {
                log::warn!(
                    "lock {:?}: too many pending clean-ups, this one is dropped (the lock \
                     expires with its lease)",
                    dropped.key()
                );
            }
        }
        self.counted
            .fetch_add(usize::from(job.cleanup.counted), Ordering::AcqRel);
        job.seq = jobs.next_seq;
        jobs.next_seq = job.seq.wrapping_add(1);
        jobs.list.push(job.clone());
        (jobs.held_back, job)
    }

    /// Marks the try of `job` ended, the job queued again for another try if `again` (else
    /// done: also a job that was not queued), and wakes the thread (it may wait for this key's try to end) and the owners
    /// waiting.
    pub(crate) fn finish(&self, mut job: Job, again: bool) {
        if !job.flying {
            // Never queued (a replay's that no acquire waits for): queued only to try again.
            if again {
                self.queue(job);
            }
            return;
        }
        let mut jobs = self.lock();
        if let Some(at) = jobs.list.iter().position(|j| j.flying && j.seq == job.seq) {
            if again {
                job.flying = false;
                jobs.list[at] = job;
            } else {
                let done = jobs.list.remove(at);
                self.counted
                    .fetch_sub(usize::from(done.cleanup.counted), Ordering::AcqRel);
            }
        }
        drop(jobs);
        self.wake.notify_one();
        self.done.notify_all();
    }
}

/// The clean-up queue of one client (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Janitor {
    pub(crate) shared: Arc<Shared>,
}

impl Drop for Janitor {
    fn drop(&mut self) {
        // Never joins: this may run on the janitor thread itself.
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
    }
}

impl Janitor {
    /// Clean-ups not done yet (for tests and monitoring).
    pub(crate) fn pending(&self) -> usize {
        self.shared.lock().list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::cleanup::FAILED_RELEASE;
    use std::time::Duration;

    fn job(key: &str, value: &[u8], seq: u64, next: Instant) -> Job {
        let cleanup = Cleanup::delete_for_test(key, value);
        let mut job = Job::new(cleanup, FAILED_RELEASE, next + Duration::from_secs(30));
        (job.next, job.seq) = (next, seq);
        job
    }

    #[test]
    fn jobs_of_one_key_and_value_run_oldest_first_one_at_a_time() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let mut jobs = Jobs::default();
        // The older job of ("k", "o") is not due yet: the newer one must wait for it.
        jobs.list.push(job("k", b"o", 1, later));
        jobs.list.push(job("k", b"o", 2, now));
        jobs.list.push(job("x", b"o", 3, now));
        assert_eq!(
            jobs.list.iter().map(|j| j.seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(
            jobs.pick(|j| j.next <= now).map(|i| jobs.list[i].seq),
            Some(3)
        );
        assert_eq!(
            jobs.pick(|j| j.next <= later).map(|i| jobs.list[i].seq),
            Some(1)
        );
        // An owner's acquire takes its own jobs, due or not, oldest first.
        assert_eq!(
            jobs.pick(|j| j.is("k", b"o")).map(|i| jobs.list[i].seq),
            Some(1)
        );
        // While one of ("k", "o") is in flight, none of its others is picked.
        assert_eq!(jobs.take(0).seq, 1);
        assert_eq!(
            jobs.pick(|j| j.next <= later).map(|i| jobs.list[i].seq),
            Some(3)
        );
        assert_eq!(jobs.pick(|j| j.is("k", b"o")), None);
        assert_eq!(
            jobs.is_in_flight("k", b"o"),
            Some(later + Duration::from_secs(30))
        );
        // Its try done: the next of ("k", "o") is picked.
        jobs.list.remove(0);
        assert_eq!(
            jobs.pick(|j| j.next <= later).map(|i| jobs.list[i].seq),
            Some(2)
        );
    }

    #[test]
    fn a_drain_tries_each_job_once_oldest_first_per_key_and_value() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let mut jobs = Jobs::default();
        jobs.list.push(job("k", b"o", 1, later));
        jobs.list.push(job("k", b"o", 2, now));
        jobs.list.push(job("x", b"o", 3, later));
        let mut tried = HashSet::new();
        // Due or not, the oldest of its key and value.
        assert_eq!(
            jobs.pick(|j| !tried.contains(&j.seq))
                .map(|i| jobs.list[i].seq),
            Some(1)
        );
        // Job 1 tried and back in the queue (it failed): job 2 of its key and value waits
        // behind it, job 3 is next.
        tried.insert(1);
        assert_eq!(
            jobs.pick(|j| !tried.contains(&j.seq))
                .map(|i| jobs.list[i].seq),
            Some(3)
        );
        // A try in flight of ("x", "o") blocks its jobs; nothing else is left.
        jobs.list[2].flying = true;
        assert_eq!(jobs.pick(|j| !tried.contains(&j.seq)), None);
        jobs.list[2].flying = false;
        tried.insert(3);
        assert_eq!(jobs.pick(|j| !tried.contains(&j.seq)), None);
    }

    #[test]
    fn at_the_cap_the_oldest_job_of_a_key_with_a_newer_one_is_dropped() {
        let now = Instant::now();
        let dropped = |jobs: &Jobs| jobs.to_drop_at_cap(now).map(|at| jobs.list[at].seq);
        let mut jobs = Jobs::default();
        assert_eq!(jobs.to_drop_at_cap(now), None);
        jobs.list.push(job("a", b"o", 1, now));
        jobs.list.push(job("b", b"o", 2, now));
        jobs.list.push(job("c", b"o", 3, now));
        // Every key has one job: the oldest of all.
        assert_eq!(dropped(&jobs), Some(1));
        jobs.list.push(job("b", b"p", 4, now));
        // "b" has a newer job: its older one goes, "a" (older, but the newest of its key) stays.
        assert_eq!(dropped(&jobs), Some(2));
        // Never one being tried: the next such job, else the oldest of the others.
        jobs.list[1].flying = true;
        assert_eq!(dropped(&jobs), Some(1));
        jobs.list[0].flying = true;
        assert_eq!(dropped(&jobs), Some(3));
        // Many keys: still the first such job in order.
        let mut many = Jobs::default();
        for i in 0..4_096u64 {
            many.list.push(job(&format!("k{i}"), b"o", i, now));
        }
        many.list.push(job("k4000", b"o", 5_000, now));
        assert_eq!(dropped(&many), Some(4_000));
        // A job whose hold has expired goes first.
        many.list[4_090].until = now;
        assert_eq!(dropped(&many), Some(4_090));
    }
}
