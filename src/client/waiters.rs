//! In-process waiter queues: threads of one [`LockClient`](crate::LockClient) that wait for the
//! same key line up FIFO, and only the head of the line polls Redis.
//!
//! Why: with plain polling, a thread that releases a lock and asks for it again wins the race
//! against waiters that are asleep between attempts, so they starve; and every waiter's poll is
//! a round trip. Here a releasing thread also wakes the head waiter of this process at once
//! (the head does not sleep out its backoff), so a local handoff costs one round trip. Waiters
//! in other processes still compete through Redis with their own retry policies.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::RngExt;

use crate::client::grants::Token;

/// While a waiter listens for a published release, it also polls: the sleep until the
/// holder's lifetime runs out is cut to at most this long (or the retry policy's longest
/// sleep, if longer), plus up to a fifth at random. A holder that releases without publishing
/// (a legacy or foreign locker) is thus noticed within about that long, whatever its lifetime.
/// Only the head of a line polls, so a client waiting on a key sends at most 10 extra
/// commands per second (about 9 on average) while a publishing holder keeps the lock.
pub(crate) const POLL_BESIDE_PUBSUB: Duration = Duration::from_millis(100);
/// The poll of a line marked silent (its lock was last freed without a published release):
/// at most this long (or the policy's longest sleep, if longer), plus up to a half at random.
pub(crate) const POLL_SILENT: Duration = Duration::from_millis(20);
/// How long a line stays marked silent after its last silent release, unless a published
/// release is heard first.
pub(crate) const SILENT_MEMORY: Duration = Duration::from_secs(30);

/// The queues of one client, by key. A queue exists only while some thread waits on its key.
#[derive(Debug, Default)]
pub(crate) struct WaitQueues {
    map: Mutex<HashMap<String, Arc<Queue>>>,
    /// Threads waiting on any key: lets the uncontended path skip the map's mutex. A release
    /// that reads 0 while a waiter is joining only costs that waiter one backoff sleep.
    waiting: AtomicUsize,
    /// Lines whose last release by this client was heard by other clients' waiters: until the
    /// instant, a blocking acquire of this client lets them go first (see [`Self::yield_to`]).
    courtesy: Mutex<HashMap<String, Instant>>,
    /// Entries in `courtesy`: lets the uncontended path skip its mutex.
    courtesies: AtomicUsize,
    /// Lines whose lock was last freed without a published release (a peer that does not
    /// publish), until when to poll them fast (see [`Self::poll_interval`]).
    silent: Mutex<HashMap<String, Instant>>,
    /// Grants of hand-off locks that this client's waiting threads expect (see
    /// [`Grants`](crate::client::grants::Grants)).
    pub(crate) grants: crate::client::grants::Grants,
    /// The events the crate's tests wait for (empty without the feature `test-hooks`): here
    /// because every part of the runtime that reports one reaches the client's lines.
    pub(crate) hooks: crate::client::test_hooks::TestHooks,
}

#[derive(Debug, Default)]
struct Queue {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Tickets in arrival order; the front one is the head.
    order: VecDeque<u64>,
    next_ticket: u64,
    /// Bumped by every local release of the key.
    releases: u64,
    /// The latest attempt made from the line that failed (no answer: connection error,
    /// command timeout), and when; cleared by an answered attempt.
    failed: Option<(Instant, String)>,
    /// The ticket whose attempt is on the wire without a reply yet, and since when.
    in_flight: Option<(u64, Instant)>,
    /// Threads asleep on the line's condvar (see [`Queue::wait`]): a change with none asleep
    /// notifies nobody (a notify costs a system call even then).
    sleepers: usize,
    /// Hand-off locks: a thread of this client took the key's lock since the line's latest
    /// release by this client (a hint: see [`WaitQueues::offer`]).
    held_here: bool,
    /// Hand-off locks: the head's offer to be queued by the holder's release.
    offer: Option<Offer>,
    /// Hand-off locks: a head that gives up waits for the release that took its offer (see
    /// [`WaitQueues::withdraw_offer`]); only then does the release's reply wake the line.
    withdrawing: bool,
}

/// The hand-over of a hand-off lock (one whose release grants it to the next waiter)
/// between threads of one client: while another thread of
/// the client holds the lock, the head of the line does not queue itself in Redis; it offers
/// its token, and the holder's release queues it (or grants it the lock) in the same script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Offered; no release has taken it yet.
    Open(Token),
    /// A release that carries it was sent at `sent` and has no reply yet.
    Taken { token: Token, sent: Instant },
    /// That release came back: run by the server at its time `at_us` (µs), or failed or found
    /// the lock not ours (`at_us` `None`: the token may or may not be queued).
    Settled {
        token: Token,
        sent: Instant,
        at_us: Option<u64>,
    },
}

impl Offer {
    fn token(&self) -> &Token {
        match self {
            Offer::Open(t) | Offer::Taken { token: t, .. } | Offer::Settled { token: t, .. } => t,
        }
    }
}

impl Queue {
    /// Waits on the line's condvar while `cond` holds, at most `left` (`Duration::MAX`: without
    /// limit), counted in [`State::sleepers`] meanwhile.
    fn wait_while<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        left: Duration,
        cond: impl FnMut(&mut State) -> bool,
    ) -> MutexGuard<'a, State> {
        st.sleepers += 1;
        let mut st = wait_while(&self.cv, st, left, cond);
        st.sleepers -= 1;
        st
    }

    /// Wakes the threads asleep on the line's condvar, if any; `st` is the line's state,
    /// changed by the caller.
    fn wake(&self, st: MutexGuard<'_, State>) {
        let asleep = st.sleepers > 0;
        drop(st);
        if asleep {
            self.cv.notify_all();
        }
    }
}

/// `m`'s guard, also after a thread panicked while it held it: poisoning only means that, and
/// the states the runtime's mutexes guard (a queue of numbers, the subscriber's registry, the
/// replica confirmation's learnt primaries and slots, the pool's latest connect error: each
/// change a few field updates) are still consistent, so carry on rather than panic too.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits on `cv` while `cond` holds, at most `left` (`Duration::MAX`: without limit; a poisoned
/// mutex is taken as it is, as by [`lock`]).
pub(crate) fn wait_while<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    left: Duration,
    cond: impl FnMut(&mut T) -> bool,
) -> MutexGuard<'a, T> {
    cv.wait_timeout_while(guard, left, cond)
        .map_or_else(|p| p.into_inner().0, |(g, _)| g)
}

/// Waits on `cv` at most `left`, or until notified (a poisoned mutex is taken as it is).
pub(crate) fn wait_for<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    left: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, left)
        .map(|(guard, _)| guard)
        .unwrap_or_else(|p| p.into_inner().0)
}

impl WaitQueues {
    /// True if a thread of this client is waiting for `key`.
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        self.line(key).is_some()
    }

    /// Joins the line for `key`. The ticket leaves the line when dropped.
    pub(crate) fn enqueue<'a>(&'a self, key: &'a str) -> Ticket<'a> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let queue = Arc::clone(lock(&self.map).entry(key.to_owned()).or_default());
        let mut st = lock(&queue.state);
        let id = st.next_ticket;
        st.next_ticket += 1;
        st.order.push_back(id);
        let seen_releases = st.releases;
        drop(st);
        Ticket {
            queues: self,
            key,
            queue,
            id,
            seen_releases,
        }
    }

    /// This client released `line` and other clients' waiters heard it (the release's
    /// `PUBLISH` reached them): until `until`, a blocking acquire of the line by this client
    /// waits before its first attempt, so that a woken waiter elsewhere gets in first.
    ///
    /// Why: a woken waiter's attempt reaches Redis a round trip and two thread wake-ups (its
    /// subscriber's, then its own) after the release, while a thread of the releasing client
    /// that asks again at once gets there in half a round trip and wins almost every time.
    pub(crate) fn yield_to(&self, line: &str, until: Instant) {
        let mut courtesy = lock(&self.courtesy);
        let now = Instant::now();
        courtesy.retain(|_, u| *u > now);
        courtesy.insert(line.to_owned(), until);
        self.courtesies.store(courtesy.len(), Ordering::SeqCst);
    }

    /// Until when a blocking acquire of `line` should let other clients' waiters go first,
    /// if at all. Consumed: only the first acquire after the release waits.
    pub(crate) fn take_courtesy(&self, line: &str) -> Option<Instant> {
        if self.courtesies.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let mut courtesy = lock(&self.courtesy);
        let until = courtesy.remove(line);
        self.courtesies.store(courtesy.len(), Ordering::SeqCst);
        until.filter(|u| *u > Instant::now())
    }

    /// How long a waiter listening for a published release of `line` sleeps at most before it
    /// polls: `max(POLL_BESIDE_PUBSUB, floor)` plus up to a fifth at random, or while the line
    /// is marked silent `max(POLL_SILENT, floor)` plus up to a half. `floor` is the retry
    /// policy's longest sleep: a policy that polls slowly polls slowly here too.
    pub(crate) fn poll_interval(&self, line: &str, floor: Duration) -> Duration {
        let now = Instant::now();
        let silent = {
            let mut marks = lock(&self.silent);
            marks.retain(|_, until| *until > now);
            marks.contains_key(line)
        };
        let (base, spread) = if silent {
            (POLL_SILENT.max(floor), 2)
        } else {
            (POLL_BESIDE_PUBSUB.max(floor), 5)
        };
        let extra = base / spread;
        base.saturating_add(rand::rng().random_range(Duration::ZERO..=extra))
    }

    /// A waiter's poll found `line`'s lock free before the holder's lifetime ran out and no
    /// release was heard: its holders free it without publishing. Poll it fast for
    /// [`SILENT_MEMORY`].
    pub(crate) fn mark_silent(&self, line: &str) {
        let until = crate::time::saturating_add(Instant::now(), SILENT_MEMORY);
        if lock(&self.silent).insert(line.to_owned(), until).is_none() {
            log::debug!(
                "lock {line:?}: freed without a published release; waiters poll it every \
                 {POLL_SILENT:?} or so for {SILENT_MEMORY:?}"
            );
        }
    }

    /// A release of `line` was heard (published, or by a holder of this client): its holders
    /// publish, so the line is polled slowly again.
    pub(crate) fn heard_release(&self, line: &str) {
        lock(&self.silent).remove(line);
    }

    /// True if `line` is marked silent.
    #[cfg(test)]
    pub(crate) fn is_silent(&self, line: &str) -> bool {
        lock(&self.silent)
            .get(line)
            .is_some_and(|until| *until > Instant::now())
    }

    /// A grant to `token` was published (or returned by this client's own
    /// release): if a thread of this client expects it, record it and wake its line.
    pub(crate) fn deliver_grant(&self, token: &[u8], grant: crate::client::grants::Grant) -> bool {
        let line = self.grants.deliver(token, grant);
        line.inspect(|line| self.notify_release(line)).is_some()
    }

    /// The line of `key`, if a thread of this client waits for it.
    fn line(&self, key: &str) -> Option<Arc<Queue>> {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return None;
        }
        lock(&self.map).get(key).map(Arc::clone)
    }

    /// `f` on the line of `key` and its state, locked, if a thread of this client waits for it.
    fn in_line<R>(
        &self,
        key: &str,
        f: impl for<'q> FnOnce(&'q Queue, MutexGuard<'q, State>) -> R,
    ) -> Option<R> {
        let q = self.line(key)?;
        let st = lock(&q.state);
        Some(f(&q, st))
    }

    /// Hand-off locks: a thread of this client took `key`'s lock. Noted only while other threads
    /// of this client wait for it.
    pub(crate) fn note_local_hold(&self, key: &str) {
        self.in_line(key, |_, mut st| st.held_here = true);
    }

    /// Hand-off locks: the head of `key`'s line offers `token` to be queued by the release of the
    /// thread of this client that holds the lock. False (nothing offered) when no such hold is
    /// known: the head then queues itself. A hold that ends without a release by this client
    /// (lost, or its guard leaked) leaves the offer open; the head's next poll queues it
    /// (see [`reclaim_offer`](Self::reclaim_offer)).
    pub(crate) fn offer(&self, key: &str, token: &Token) -> bool {
        self.in_line(key, |_, mut st| {
            let free = st.held_here && st.offer.is_none();
            if free {
                st.offer = Some(Offer::Open(*token));
            }
            free
        })
        .unwrap_or(false)
    }

    /// Hand-off locks: a release of `key` by this client is about to be sent. Takes the open offer,
    /// if any (its token goes with the release), and forgets the hold.
    pub(crate) fn take_offer(&self, key: &str) -> Option<Token> {
        self.in_line(key, |_, mut st| {
            st.held_here = false;
            let Some(Offer::Open(token)) = st.offer else {
                return None;
            };
            let sent = Instant::now();
            st.offer = Some(Offer::Taken { token, sent });
            Some(token)
        })
        .flatten()
    }

    /// Hand-off locks: the release that took the offer of `token` came back (see [`Offer`]).
    pub(crate) fn offer_settled(&self, key: &str, token: &Token, at_us: Option<u64>) {
        self.in_line(key, |q, mut st| {
            if let Some(Offer::Taken { token, sent }) = st.offer.filter(|o| o.token() == token) {
                st.offer = Some(Offer::Settled { token, sent, at_us });
                if std::mem::take(&mut st.withdrawing) {
                    q.wake(st);
                }
            }
        });
    }

    /// Hand-off locks: the offer of `token`, as it stands.
    pub(crate) fn offer_state(&self, key: &str, token: &Token) -> Option<Offer> {
        self.in_line(key, |_, st| st.offer.filter(|o| o.token() == token))
            .flatten()
    }

    /// Hand-off locks: the head that offered `token` polls Redis itself. An offer no release took
    /// is withdrawn, and the hold it waited for is forgotten (it ended without a release by
    /// this client, or lasts longer than a poll): the next heads queue themselves until a
    /// thread of this client takes the lock again.
    pub(crate) fn reclaim_offer(&self, key: &str, token: &Token) {
        self.in_line(key, |_, mut st| {
            if st.offer.take_if(|o| *o == Offer::Open(*token)).is_some() {
                st.held_here = false;
            }
        });
    }

    /// Hand-off locks: the head that offered `token` stops waiting. With `patience`, a release
    /// that carries the token and has no reply yet is waited for (at most that long), so that
    /// the head's withdrawal from the queue reaches Redis after it.
    pub(crate) fn withdraw_offer(&self, key: &str, token: &Token, patience: Option<Duration>) {
        self.in_line(key, |q, mut st| {
            if let Some(patience) = patience {
                st.withdrawing = true;
                st = q.wait_while(
                    st,
                    patience,
                    |st| matches!(st.offer, Some(Offer::Taken { token: t, .. }) if t == *token),
                );
            }
            st.withdrawing = false;
            st.offer.take_if(|o| o.token() == token);
        });
    }

    /// A holder of this process released `key`: wake its waiters.
    pub(crate) fn notify_release(&self, key: &str) {
        self.in_line(key, |q, mut st| {
            st.releases += 1;
            q.wake(st);
        });
    }
}

/// One thread's place in the line for a key.
pub(crate) struct Ticket<'a> {
    queues: &'a WaitQueues,
    key: &'a str,
    queue: Arc<Queue>,
    id: u64,
    seen_releases: u64,
}

impl Ticket<'_> {
    /// How many threads are ahead of this one.
    pub(crate) fn ahead(&self) -> usize {
        let st = lock(&self.queue.state);
        st.order.iter().take_while(|&&t| t != self.id).count()
    }

    /// Waits until this ticket is the head of the line. False if `deadline` passed first.
    pub(crate) fn wait_turn(&mut self, deadline: Option<Instant>) -> bool {
        let left = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let id = Some(self.id);
        let st = lock(&self.queue.state);
        let st = self
            .queue
            .wait_while(st, left, |st| st.order.front().copied() != id);
        let head = st.order.front().copied() == id;
        if head {
            self.seen_releases = st.releases;
        }
        head
    }

    /// Remembers the release count before an attempt, so a release that happens while the
    /// attempt is on the wire still cuts the following sleep short.
    pub(crate) fn mark(&mut self) {
        self.seen_releases = lock(&self.queue.state).releases;
    }

    /// An attempt by this thread (the head of a FIFO line) is going on the wire.
    pub(crate) fn attempt_started(&self) {
        lock(&self.queue.state).in_flight = Some((self.id, Instant::now()));
    }

    /// The attempt announced by [`attempt_started`](Self::attempt_started) came back:
    /// answered by Redis (`None`, whatever the answer), or with `Some(failure)` when Redis
    /// could not be reached or did not reply in time.
    pub(crate) fn attempt_finished(&self, failure: Option<String>) {
        let mut st = lock(&self.queue.state);
        st.in_flight.take_if(|(id, _)| *id == self.id);
        st.failed = failure.map(|err| (Instant::now(), err));
        // Threads that gave up wait for this outcome (see `outage`).
        self.queue.wake(st);
    }

    /// For a thread that reached its deadline still waiting for its turn: why it must not
    /// report contention, if so. First waits for the outcome of the attempt of the thread
    /// ahead that is on the wire (it ends within the client's timeouts), at most `patience`
    /// (for a client without a command timeout), then: `Some(reason)` when the line's latest
    /// attempt failed to reach Redis and none was answered since, or when the attempt still
    /// has no reply after `patience` (an outage); `None` when the attempts were answered (the
    /// lock is held).
    pub(crate) fn outage(&self, patience: Duration) -> Option<String> {
        let st = lock(&self.queue.state);
        let st = self
            .queue
            .wait_while(st, patience, |st| st.in_flight.is_some());
        if let Some((_, since)) = st.in_flight {
            return Some(format!(
                "an attempt of another thread of this client waiting for the lock has had no \
                 reply from Redis for {:?}",
                since.elapsed()
            ));
        }
        let (at, err) = st.failed.as_ref()?;
        Some(format!(
            "the latest attempt of another thread of this client waiting for the lock failed \
             {:?} ago: {err}",
            at.elapsed()
        ))
    }

    /// True if a release woke the line (a local holder, or a published release) since
    /// [`mark`](Self::mark).
    pub(crate) fn released_since_mark(&self) -> bool {
        lock(&self.queue.state).releases != self.seen_releases
    }

    /// Sleeps up to `d`, returning early if a local holder released the key since [`mark`]
    /// (or a published release was heard): true if so, false if the time ran out.
    ///
    /// [`mark`]: Self::mark
    pub(crate) fn sleep(&self, d: Duration) -> bool {
        let seen = self.seen_releases;
        let st = lock(&self.queue.state);
        self.queue
            .wait_while(st, d, |st| st.releases == seen)
            .releases
            != seen
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        // Lock order everywhere: map, then queue.
        let mut map = lock(&self.queues.map);
        let mut st = lock(&self.queue.state);
        st.order.retain(|&t| t != self.id);
        // Unwound mid-attempt: nobody must wait for its outcome.
        st.in_flight.take_if(|(id, _)| *id == self.id);
        if st.order.is_empty() {
            map.remove(self.key);
        }
        drop(map);
        self.queues.waiting.fetch_sub(1, Ordering::SeqCst);
        // The next ticket may be the head now.
        self.queue.wake(st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn fifo_order_and_cleanup() {
        let q = WaitQueues::default();
        assert!(!q.has_waiters("k"));
        let mut a = q.enqueue("k");
        let mut b = q.enqueue("k");
        assert!(q.has_waiters("k"));
        assert_eq!(a.ahead(), 0);
        assert_eq!(b.ahead(), 1);
        assert!(a.wait_turn(Some(Instant::now())));
        assert!(!b.wait_turn(Some(Instant::now() + Duration::from_millis(20))));
        drop(a);
        assert!(b.wait_turn(Some(Instant::now())));
        drop(b);
        assert!(!q.has_waiters("k"));
    }

    #[test]
    fn outage_is_told_from_contention() {
        let q = WaitQueues::default();
        let head = q.enqueue("k");
        let behind = q.enqueue("k");
        let patience = Duration::from_secs(30);
        // Nothing known: contention.
        assert_eq!(behind.outage(patience), None);
        head.attempt_started();
        head.attempt_finished(Some("timed out".into()));
        let why = behind.outage(patience).expect("the head's attempt failed");
        assert!(why.contains("timed out"), "{why}");
        // An answered attempt since: contention again.
        head.attempt_started();
        head.attempt_finished(None);
        assert_eq!(behind.outage(patience), None);
        // An attempt on the wire: its outcome decides, waited for.
        head.attempt_started();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| behind.outage(patience));
            std::thread::sleep(Duration::from_millis(30));
            assert!(
                !waiter.is_finished(),
                "must wait for the attempt on the wire"
            );
            head.attempt_finished(Some("connection refused".into()));
            let why = waiter.join().expect("waiter").expect("failed attempt");
            assert!(why.contains("connection refused"), "{why}");
        });
        // An attempt without a reply for longer than the patience: an outage too.
        head.attempt_started();
        let why = behind
            .outage(Duration::from_millis(20))
            .expect("no reply in time");
        assert!(why.contains("no reply"), "{why}");
        // A head dropped mid-attempt does not leave the others waiting forever.
        drop(head);
        assert!(
            behind.outage(patience).is_some(),
            "the last outcome was a failure"
        );
    }

    /// Only counted sleepers are notified: a ticket asleep in its turn, or in a sleep, is
    /// woken by the change it waits for, and the count is back to zero afterwards.
    #[test]
    fn sleepers_are_counted_and_woken() {
        let q = WaitQueues::default();
        let head = q.enqueue("k");
        let mut behind = q.enqueue("k");
        let queue = Arc::clone(&behind.queue);
        let sleepers = || lock(&queue.state).sleepers;
        std::thread::scope(|s| {
            let b = &mut behind;
            let waiter = s.spawn(move || {
                let start = Instant::now();
                let turn = b.wait_turn(Some(Instant::now() + Duration::from_secs(20)));
                (turn, start.elapsed())
            });
            while sleepers() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(head);
            let (turn, waited) = waiter.join().expect("waiter");
            assert!(turn && waited < Duration::from_secs(10), "{waited:?}");
        });
        assert_eq!(sleepers(), 0);
        behind.mark();
        std::thread::scope(|s| {
            let b = &behind;
            let sleeper = s.spawn(move || {
                let start = Instant::now();
                (b.sleep(Duration::from_secs(20)), start.elapsed())
            });
            while sleepers() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            q.notify_release("k");
            let (released, slept) = sleeper.join().expect("sleeper");
            assert!(released && slept < Duration::from_secs(10), "{slept:?}");
        });
        assert_eq!(sleepers(), 0);
    }

    #[test]
    fn huge_sleep_does_not_overflow() {
        let q = WaitQueues::default();
        let mut tk = q.enqueue("k");
        tk.mark();
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| tk.sleep(Duration::MAX));
            std::thread::sleep(Duration::from_millis(30));
            assert!(!sleeper.is_finished());
            q.notify_release("k");
            sleeper.join().expect("no panic on Duration::MAX");
        });
    }

    #[test]
    fn release_cuts_sleep_short() {
        let q = Arc::new(WaitQueues::default());
        let woke = Arc::new(AtomicUsize::new(0));
        let (q2, woke2) = (Arc::clone(&q), Arc::clone(&woke));
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let mut tk = q2.enqueue("k");
            tk.mark();
            tx.send(()).ok();
            let start = Instant::now();
            let woken = tk.sleep(Duration::from_secs(30));
            woke2.store(1, Ordering::SeqCst);
            (start.elapsed(), woken)
        });
        rx.recv().ok();
        q.notify_release("k");
        let (slept, woken) = t.join().expect("sleeper thread");
        assert!(woken);
        assert_eq!(woke.load(Ordering::SeqCst), 1);
        assert!(slept < Duration::from_secs(30));
        // Without a release the sleep runs out and says so.
        let tk = q.enqueue("k");
        assert!(!tk.sleep(Duration::from_millis(5)));
    }

    #[test]
    fn silent_lines_poll_fast_until_a_release_is_heard() {
        let q = WaitQueues::default();
        let ms = Duration::from_millis;
        let within = |d: Duration, low: u64, high: u64| ms(low) <= d && d <= ms(high);
        let floor = ms(32);
        for _ in 0..50 {
            assert!(within(q.poll_interval("k", floor), 100, 120));
        }
        q.mark_silent("k");
        assert!(q.is_silent("k"));
        assert!(!q.is_silent("other"));
        for _ in 0..50 {
            assert!(within(q.poll_interval("k", floor), 32, 48));
            assert!(within(q.poll_interval("k", Duration::ZERO), 20, 30));
            assert!(within(q.poll_interval("other", floor), 100, 120));
        }
        // A slow policy polls slowly beside pub/sub too.
        assert!(within(q.poll_interval("other", ms(5_000)), 5_000, 6_000));
        q.heard_release("k");
        assert!(!q.is_silent("k"));
        assert!(within(q.poll_interval("k", floor), 100, 120));
    }

    #[test]
    fn a_head_offers_only_behind_a_hold_of_its_client_and_the_release_takes_it() {
        let q = WaitQueues::default();
        let (t1, t2) = ([b'1'; 48], [b'2'; 48]);
        // No line: nothing is noted or offered.
        q.note_local_hold("k");
        assert_eq!(q.take_offer("k"), None);
        let holder = q.enqueue("k");
        let next = q.enqueue("k");
        // No hold known: the head queues itself.
        assert!(!q.offer("k", &t2));
        q.note_local_hold("k");
        drop(holder);
        assert!(q.offer("k", &t2));
        assert!(!q.offer("k", &t1), "one offer at a time");
        assert_eq!(q.offer_state("k", &t2), Some(Offer::Open(t2)));
        assert_eq!(q.offer_state("k", &t1), None);
        // The release takes it, and forgets the hold.
        let before = Instant::now();
        assert_eq!(q.take_offer("k"), Some(t2));
        let Some(Offer::Taken { token, sent }) = q.offer_state("k", &t2) else {
            panic!("taken");
        };
        assert!(token == t2 && sent >= before);
        assert_eq!(q.take_offer("k"), None, "taken once");
        // A taken offer stays with its release.
        q.reclaim_offer("k", &t2);
        q.offer_settled("k", &t1, Some(7));
        assert!(matches!(q.offer_state("k", &t2), Some(Offer::Taken { .. })));
        q.offer_settled("k", &t2, Some(7));
        assert_eq!(
            q.offer_state("k", &t2),
            Some(Offer::Settled {
                token: t2,
                sent,
                at_us: Some(7)
            })
        );
        q.withdraw_offer("k", &t2, None);
        assert_eq!(q.offer_state("k", &t2), None);
        // The hold was forgotten by the release: no new offer until a thread takes the lock.
        assert!(!q.offer("k", &t1));
        drop(next);
    }

    #[test]
    fn an_offer_no_release_takes_is_reclaimed_and_the_hold_forgotten() {
        let q = WaitQueues::default();
        let t = [b'3'; 48];
        let _head = q.enqueue("k");
        q.note_local_hold("k");
        assert!(q.offer("k", &t));
        q.reclaim_offer("k", &t);
        assert_eq!(q.offer_state("k", &t), None);
        assert_eq!(q.take_offer("k"), None);
        assert!(!q.offer("k", &t), "the hold was forgotten");
    }

    #[test]
    fn a_waiter_giving_up_waits_for_the_release_that_carries_its_token() {
        let q = WaitQueues::default();
        let t = [b'4'; 48];
        let _head = q.enqueue("k");
        q.note_local_hold("k");
        assert!(q.offer("k", &t));
        assert_eq!(q.take_offer("k"), Some(t));
        let start = Instant::now();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                q.withdraw_offer("k", &t, Some(Duration::from_secs(30)));
                start.elapsed()
            });
            std::thread::sleep(Duration::from_millis(50));
            q.offer_settled("k", &t, None);
            let waited = waiter.join().expect("waiter");
            assert!(waited >= Duration::from_millis(50), "{waited:?}");
            assert!(waited < Duration::from_secs(30), "{waited:?}");
        });
        assert_eq!(q.offer_state("k", &t), None);
        // With a release that never answers, at most the patience.
        q.note_local_hold("k");
        assert!(q.offer("k", &t));
        assert_eq!(q.take_offer("k"), Some(t));
        let start = Instant::now();
        q.withdraw_offer("k", &t, Some(Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(q.offer_state("k", &t), None);
    }
}
