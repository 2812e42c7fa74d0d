//! The watchdog: ONE background thread per [`LockClient`](crate::LockClient) that renews every
//! watched hold of the client before its lease runs out, and reports the holds it fails to
//! renew.
//!
//! A lock built without an explicit lifetime is *watched*: it is written with the watchdog
//! lease (default [`LockBuilder::DEFAULT_WATCHDOG_LEASE`](crate::LockBuilder::DEFAULT_WATCHDOG_LEASE), Redisson's `lockWatchdogTimeout`) and renewed
//! every lease/3 while its holder keeps the [`Lease`](crate::Lease). The holder's lease owns
//! the renewal: the thread keeps only a weak reference, so renewal stops when the hold is
//! released, when its guard (or every clone of the lease) is dropped, and when the process
//! dies. Holds due for renewal together are renewed together, one script call
//! (`lua/renew_batch.lua`) per batch of keys of one hash slot; on a server with
//! `SET … IFEQ` (Valkey 8.1 and later) the Token holds of a batch are renewed instead by a
//! pipeline of `SET key token IFEQ token PX lease`, one round trip too (see
//! [`native`](crate::client::native)).
//!
//! A round takes every hold due now or within a sixth of its lease, so holds acquired around
//! the same time are renewed in the same call, and stay together afterwards (each renewal
//! sets the next one lease/3 after the round's start). Each call carries at most 512 keys.
//!
//! A renewal that finds the hold gone (expired, or taken by another owner) marks it lost at
//! once; renewals that fail (Redis down or paused) are retried every tenth of the lease
//! (10 ms ..= 1 s) until the hold's loss deadline
//! ([`Lease::loss_deadline`](crate::Lease::loss_deadline): the lease's end, counted from the
//! invocation of the latest renewal confirmed, less a clock-drift margin of 1% of the lease
//! plus 2 ms), and then the hold is marked lost. A hold whose renewal is answered only after
//! that deadline is marked lost too: its holder may already have seen it lost, and a lost
//! hold stays lost. Either way the holder sees it
//! ([`LockGuard::is_lost`](crate::LockGuard::is_lost),
//! [`LockGuard::check`](crate::LockGuard::check)) and the lock's `on_lost` callback, if any,
//! runs once, so that the holder hears of the loss before the key can expire on the server.
//!
//! `is_lost` follows the local clock exactly. The callback runs on the watchdog thread, at the
//! deadline, also when Redis does not answer: no call of a round waits past the earliest loss
//! deadline of the holds watched (less [`CAP_ALLOWANCE`]). The pool checkout, the opening of a
//! new connection and every reply are bounded by it as by the client's own timeouts (see
//! `Link::cap` in `pool.rs`; in a cluster, each try of a command gets a third of the time
//! left), and a call cut short is a failed renewal. One exception on a Cluster: a new cluster
//! connection is opened by redis-rs, which connects to every node with its own connection
//! timeout (a fourth of the connect timeout, twice for a node that accepts the connection and
//! answers nothing), so a renewal that must open one may end, and report a loss, up to that
//! much past the deadline (docs/architecture.md). Before each call the holds whose deadline has passed (while earlier calls of the
//! round ran) are reported, and not renewed; the others are retried as above. A call to an
//! unresponsive Redis thus delays the renewal of the client's other holds (up to the command
//! timeout), not the report of their loss. Holds watched while a call is under way are the one
//! exception: that call was bounded before they came, and each of them has most of its lease
//! ahead.
//!
//! The thread holds no strong reference to the client between rounds: once every handle of
//! the client is dropped, the thread exits. A released hold (`stop`ped before its release is
//! sent) is never renewed again, and a late renewal result for it is ignored.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::client::live;
use crate::client::native::{self, Command};
use crate::client::repeats::log_repeat;
use crate::client::waiters::wait_for;
use crate::client::watched::{Entry, Shared, ThreadState, Watchdog};
use crate::client::{OnExit, WeakClient};
use crate::keys;
use crate::lease::{LossReason, RenewKind, WatchState};
use crate::stats::Counters;

/// Most keys renewed by one script call: bounds how long one call keeps Redis busy (it serves
/// nothing else while a script runs) and the size of one command.
const BATCH_MAX: usize = 512;
/// The name of the renewal thread (at most 15 bytes: Linux truncates thread names).
const THREAD_NAME: &str = "dlock-watchdog";
/// A renewal call waits this much less than the earliest loss deadline of the holds watched:
/// the time to return from a call cut short and report the hold at its deadline.
const CAP_ALLOWANCE: Duration = Duration::from_millis(1);

/// How one watched hold came out of a round: when to renew it again, or `None` to stop
/// watching it (lost or released).
type Outcome = Option<Instant>;

impl Watchdog {
    /// Starts renewing `state`, a hold of a lock of `client`, every `state.lease / 3`, the
    /// first renewal at `due` (a third of the lease after the acquire; sooner for a hand-off
    /// grant, whose short lease must be raised soon).
    pub(crate) fn watch(
        &self,
        client: &crate::client::LockClient,
        state: &Arc<WatchState>,
        due: Instant,
    ) {
        let mut list = self.shared.lock();
        // Holds taken and released at a high rate would pile up until the thread's next round
        // (up to lease/3 away): clean up between rounds once the list has doubled.
        if !list.in_round && list.entries.len() >= 2 * list.cleaned_len.max(64) {
            list.entries.retain(|e| e.live().is_some());
            list.cleaned_len = list.entries.len();
        }
        list.entries.push(Entry {
            state: Arc::downgrade(state),
            due,
            gone: false,
        });
        match list.thread {
            ThreadState::Off => {
                let shared = Arc::clone(&self.shared);
                let weak = client.downgrade();
                let spawned = thread::Builder::new()
                    .name(THREAD_NAME.to_owned())
                    .spawn(move || run(&shared, &weak));
                match spawned {
                    // It looks at the entries (this one included) once we unlock.
                    Ok(_) => list.thread = ThreadState::Busy,
                    // Retried by the next watch; until then the hold is not renewed and its
                    // lease reports it lost by the local clock when it runs out.
                    Err(e) => log::error!(
                        "lock {:?}: cannot start the watchdog thread, the hold is not renewed: {e}",
                        state.key
                    ),
                }
            }
            ThreadState::Asleep(at) if at.is_none_or(|at| due < at) => {
                self.shared.wake.notify_one()
            }
            ThreadState::Asleep(_) | ThreadState::Busy => {}
        }
    }
}

/// The watchdog thread: sleeps until the earliest renewal is due, then runs one round; exits
/// when the client is gone.
fn run(shared: &Shared, client: &WeakClient) {
    // Marks the thread stopped when it exits, also by a panic, so that the next `watch`
    // starts another.
    let _off = OnExit(|| shared.lock().thread = ThreadState::Off);
    log::debug!("watchdog thread started");
    while sleep_until_due(shared) {
        // A strong handle only for the round: a client dropped meanwhile is dropped here, after
        // the round, outside the list's lock (its Drop takes it).
        let Some(client) = client.upgrade() else {
            break;
        };
        round(shared, &client);
    }
    log::debug!("watchdog thread exits: its client was dropped");
}

/// Waits until some entry is due; false on shutdown.
fn sleep_until_due(shared: &Shared) -> bool {
    let mut list = shared.lock();
    while !list.shutdown {
        let now = Instant::now();
        let next = list.entries.iter().filter(|e| !e.gone).map(|e| e.due).min();
        if next.is_some_and(|due| due <= now) {
            list.thread = ThreadState::Busy;
            return true;
        }
        list.thread = ThreadState::Asleep(next);
        // Without an entry, until woken (std waits for ever on a timeout this long).
        let left = next.map_or(Duration::MAX, |due| due - now);
        list = wait_for(&shared.wake, list, left);
    }
    false
}

/// One round: renews every entry due now or soon, in as few script calls as the key slots
/// allow.
///
/// No call waits past the earliest loss deadline of the holds watched (less
/// [`CAP_ALLOWANCE`]): a call cut short is a failed renewal. Before each call, the holds whose
/// loss deadline passed meanwhile (while earlier calls ran, or while this thread waited for
/// such a deadline) are reported lost, and are not renewed.
fn round(shared: &Shared, client: &crate::client::LockClient) {
    let start = Instant::now();
    let mut due = take_due(shared, start);
    let mut outcomes = Vec::with_capacity(due.len());
    for batch in batches(&mut due, client.is_cluster()) {
        // Reports the holds past their loss deadline (at the round's start too): not renewed.
        let until = sweep(shared, client.counters());
        // Released or reported lost since the round's start: not renewed.
        let (kept, gone): (Vec<_>, Vec<_>) = batch
            .iter()
            .cloned()
            .partition(|(_, s)| !s.is_stopped() && !s.marked_lost());
        outcomes.extend(gone.into_iter().map(|(i, _)| (i, None)));
        renew(client, start, &kept, until, &mut outcomes);
    }
    let mut list = shared.lock();
    for (i, outcome) in outcomes {
        // Indices are stable: nothing was removed since `take_due`, only appended.
        if let Some(entry) = list.entries.get_mut(i) {
            match outcome {
                Some(at) => entry.due = at,
                None => entry.gone = true,
            }
        }
    }
    list.entries.retain(|e| !e.gone);
    list.cleaned_len = list.entries.len();
    list.in_round = false;
}

/// Removes released and dropped holds, and picks those due by `start` or within a sixth of
/// their lease (holds acquired around the same time then renew together, in one call). Holds
/// already past their loss deadline (the thread was starved, or Redis slow) are among them:
/// the sweep before the first call reports them lost rather than renewed.
fn take_due(shared: &Shared, start: Instant) -> Vec<(usize, Arc<WatchState>)> {
    let mut list = shared.lock();
    list.entries.retain(|e| e.live().is_some());
    list.in_round = true;
    let due = list.entries.iter().enumerate().filter_map(|(i, entry)| {
        let state = entry.state.upgrade()?;
        let slack = crate::time::saturating_add(start, state.lease / 6);
        (entry.due <= slack).then_some((i, state))
    });
    due.collect()
}

/// Before each call of a round: reports lost every watched hold whose loss deadline has
/// passed (while earlier calls ran; waiting for those less than [`CAP_ALLOWANCE`] away), and
/// returns the instant the call must not wait past: the earliest loss deadline of the others,
/// less that allowance. Holds watched during a call are not looked at until the next one: each
/// has most of its lease ahead.
fn sweep(shared: &Shared, stats: &Counters) -> Option<Instant> {
    loop {
        let now = Instant::now();
        let (passed, ahead): (Vec<_>, Vec<_>) = (shared.lock().entries.iter())
            .filter_map(Entry::live)
            .partition(|state| state.loss_deadline() <= now);
        // Outside the list's lock: a callback may watch another hold.
        for state in &passed {
            lost(stats, state, LossReason::Expired);
        }
        match ahead.iter().map(|state| state.loss_deadline()).min() {
            Some(at) if at.saturating_duration_since(now) <= CAP_ALLOWANCE => {
                // Less than the allowance away: report it at its deadline, then go on.
                thread::sleep(at.saturating_duration_since(now));
            }
            Some(at) => return at.checked_sub(CAP_ALLOWANCE),
            None => return None,
        }
    }
}

/// Splits the due holds into the batches of one script call: at most [`BATCH_MAX`] keys, and
/// in a cluster all of one hash slot (a script may only touch keys of one slot).
fn batches<T: AsRef<WatchState>>(items: &mut [(usize, T)], cluster: bool) -> Vec<&[(usize, T)]> {
    if !cluster {
        return items.chunks(BATCH_MAX).collect();
    }
    let slot = |item: &(usize, T)| keys::hash_slot(item.1.as_ref().key.as_bytes());
    items.sort_by_key(slot);
    items
        .chunk_by(|a, b| slot(a) == slot(b))
        .flat_map(|group| group.chunks(BATCH_MAX))
        .collect()
}

/// One renewal call for `batch` (sent at `start`), waiting past `until` for nothing (a call
/// cut short fails); one outcome per hold. After a failed call each hold is tried again soon
/// (at its loss deadline at the latest, to report it then), unless its loss deadline has
/// passed by the local clock (then it is lost: Redis may expire it any moment).
fn renew(
    client: &crate::client::LockClient,
    start: Instant,
    batch: &[(usize, Arc<WatchState>)],
    until: Option<Instant>,
    outcomes: &mut Vec<(usize, Outcome)>,
) {
    let Some((_, first)) = batch.first() else {
        return;
    };
    let results = renew_replies(client, batch, until);
    if let Err(e) = &results {
        log_repeat!(
            client.repeats(),
            "watchdog: renewal failed",
            log::Level::Warn,
            "watchdog: renewal of {} holds ({:?}, ...) failed, retrying until their leases \
             run out: {}",
            batch.len(),
            first.key,
            e.report()
        );
        client.counters().renewals_failed(batch.len());
    }
    let now = Instant::now();
    let mut renewed = 0usize;
    for (n, (i, state)) in batch.iter().enumerate() {
        let deadline = state.loss_deadline();
        // `None`: the call failed.
        let answer = results.as_ref().ok().map(|r| r.get(n) == Some(&1));
        let outcome = if state.is_stopped() {
            // Released (or being released) meanwhile: the holder's release decides.
            None
        } else if answer == Some(false) {
            lost(client.counters(), state, LossReason::Gone);
            None
        } else if now >= deadline {
            // Renewed only after its loss deadline by the local clock (the holder may already
            // have seen it lost, and a lost hold stays lost), or not renewed by then.
            lost(client.counters(), state, LossReason::Expired);
            None
        } else if answer.is_none() {
            Some(crate::time::saturating_add(now, retry_delay(state.lease)).min(deadline))
        } else {
            state.renewed(start, state.lease);
            // It stays in the client's live set for its new lifetime.
            let entry = match state.kind {
                RenewKind::Value(_) | RenewKind::ScriptedValue(_) => live::value(state.value()),
                // A hash field, the read or write holds of a read-write lock.
                _ => live::holding(&state.key, state.value()),
            };
            client.live().renew(entry, state.lease);
            log::trace!("lock {:?}: renewed for {:?}", state.key, state.lease);
            renewed += 1;
            (!state.renews_once()).then(|| crate::time::saturating_add(start, state.lease / 3))
        };
        outcomes.push((*i, outcome));
    }
    if results.is_err() {
        return;
    }
    client.counters().renewed(renewed);
    if renewed > 0 {
        client.note(crate::client::test_hooks::Event::Renewed);
    }
    log::debug!(
        "watchdog: renewed {renewed} of {} holds in one call ({:?}, ...)",
        batch.len(),
        first.key
    );
}

/// The renewal answers for `batch`, one per hold (1 renewed, 0 not the owner's; too few is an
/// error): Token holds by a pipeline of `SET key token IFEQ token PX lease` where the server
/// has it (one round trip; one alone is sent as a command, which redis-rs redirects in a
/// cluster), the others (and all of them elsewhere) by one `lua/renew_batch.lua` call.
///
/// A `SET … IFEQ` refused sends its holds to the script: from now on when the server, asked on
/// this connection, says it lacks the command or the user may not run it; for this call on a
/// full server's `OOM`. A key of another type counts as not the owner's, as in the script.
fn renew_replies(
    client: &crate::client::LockClient,
    batch: &[(usize, Arc<WatchState>)],
    until: Option<Instant>,
) -> crate::error::Result<Vec<i64>> {
    let mut results = vec![0i64; batch.len()];
    let (values, mut scripted): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| matches!(batch[i].1.kind, RenewKind::Value(_)));
    // In a cluster one command at most: redis-rs does not follow a slot's redirection (a
    // migration's ASK or MOVED) inside a pipeline.
    let native = client.native().has(Command::SetIfEq)
        && !values.is_empty()
        && (values.len() == 1 || !client.is_cluster());
    let renewed = native.then(|| {
        let key = &*batch[values[0]].1.key;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in &values {
            let state = &batch[i].1;
            pipe.add_command(native::set_ifeq_px(
                &state.key,
                state.value(),
                lease_ms(state),
            ));
        }
        client.with_conn_confirmed(key, until, |con, _| {
            let replies: Vec<redis::RedisResult<redis::Value>> = match values.as_slice() {
                [_] => pipe.cmd_iter().map(|cmd| cmd.query(con)).collect(),
                _ => (pipe.query::<Vec<redis::Value>>(con)?.into_iter())
                    .map(redis::Value::extract_error)
                    .collect(),
            };
            // The first refusal that sends the holds to the script (`None`) or error ends it.
            let answers = replies.into_iter().map(|reply| match reply {
                Ok(redis::Value::Okay | redis::Value::SimpleString(_)) => Ok(Some(1)),
                Ok(redis::Value::Nil) => Ok(Some(0)),
                Err(e) if e.code() == Some("WRONGTYPE") => Ok(Some(0)),
                Err(e) if native::is_oom(&e) => Ok(None),
                Err(e) if client.native().lacks(con, Command::SetIfEq, key, &e) => Ok(None),
                Err(e) => Err(e),
                Ok(other) => Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "unexpected reply to SET ... IFEQ",
                    format!("{other:?}"),
                ))),
            });
            answers.collect::<redis::RedisResult<Option<Vec<i64>>>>()
        })
    });
    match renewed.transpose()?.flatten() {
        Some(renewed) => values
            .iter()
            .zip(renewed)
            .for_each(|(&i, r)| results[i] = r),
        None => scripted.extend(values),
    }
    if scripted.is_empty() {
        return Ok(results);
    }
    let keys: Vec<&str> = scripted.iter().map(|&i| &*batch[i].1.key).collect();
    // Per hold: its layout's tag, its value, its lease in milliseconds.
    let args: Vec<_> = (scripted.iter().map(|&i| &batch[i].1))
        .map(|state| (state.kind.tag(), state.value(), lease_ms(state)))
        .collect();
    let replies: Vec<i64> = client.with_conn_confirmed(keys[0], until, |con, scripts| {
        let replies: Vec<i64> = scripts.renew_batch.eval_keys(con, &keys, &args)?;
        match replies.len() == keys.len() {
            true => Ok(replies),
            false => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "renewal answered too few results",
                format!("{} for {} holds", replies.len(), keys.len()),
            ))),
        }
    })?;
    for (&i, r) in scripted.iter().zip(replies) {
        results[i] = r;
    }
    Ok(results)
}

/// The wait before retrying a failed renewal: a tenth of the lease, within 10 ms ..= 1 s.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The lease in whole milliseconds as sent (at least 1: `PEXPIRE 0` would delete the key).
fn lease_ms(state: &WatchState) -> u64 {
    u64::try_from(state.lease.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Marks `state` lost (ignored if stopped), keeping the thread alive if the callback panics;
/// counts it in `stats` when this marked it.
fn lost(stats: &Counters, state: &WatchState, reason: LossReason) {
    let kind = state.kind.label();
    // The flag is set before the callback runs: a panicking callback still counts.
    let marked = panic::catch_unwind(AssertUnwindSafe(|| state.mark_lost(reason)));
    match marked {
        Ok(true) => stats.lost_watched(kind),
        Ok(false) => {}
        Err(_) => {
            stats.lost_watched(kind);
            log::error!("lock {:?}: the on_lost callback panicked", state.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::watched::List;
    use crate::lease::RenewKind;
    use crate::stats::Kind;
    use std::sync::{Condvar, Mutex};

    const TEST: Kind = Kind::new("test");

    fn state(key: &str) -> Arc<WatchState> {
        WatchState::new(
            key,
            RenewKind::Value(TEST),
            b"v",
            Duration::from_secs(30),
            Instant::now(),
            None,
        )
    }

    /// The shared state of a watchdog that watches nothing yet (no thread).
    fn unwatched() -> Shared {
        Shared {
            list: Mutex::new(List::default()),
            wake: Condvar::new(),
        }
    }

    #[test]
    fn batches_are_bounded_and_single_slot_in_a_cluster() {
        let mut items: Vec<(usize, Arc<WatchState>)> = (0..1300)
            .map(|i| (i, state(&format!("{{k{}}}:{i}", i % 3))))
            .collect();
        let single: Vec<usize> = batches(&mut items, false).iter().map(|b| b.len()).collect();
        assert_eq!(single, [512, 512, 276]);

        let cluster = batches(&mut items, true);
        assert_eq!(cluster.iter().map(|b| b.len()).sum::<usize>(), 1300);
        for batch in &cluster {
            assert!(batch.len() <= BATCH_MAX);
            let slot = keys::hash_slot(batch[0].1.key.as_bytes());
            assert!(batch
                .iter()
                .all(|(_, s)| keys::hash_slot(s.key.as_bytes()) == slot));
        }
        // Three tags, 434 / 433 / 433 keys: one full batch and one rest each.
        assert_eq!(cluster.len(), 3);
        let mut indices: Vec<usize> = cluster.iter().flat_map(|b| b.iter().map(|x| x.0)).collect();
        indices.sort_unstable();
        assert_eq!(indices, (0..1300).collect::<Vec<_>>());
    }

    #[test]
    fn released_holds_do_not_pile_up_between_rounds() {
        // Connects lazily: nothing is sent within the test (the first renewal is 10 s away).
        let client = crate::LockClient::builder("redis://127.0.0.1:1/")
            .lazy_connect()
            .build()
            .expect("client");
        let dog = client.watchdog();
        let mut live = Vec::new();
        for i in 0..1000 {
            let s = state(&format!("k{i}"));
            dog.watch(&client, &s, crate::time::after(s.lease / 3));
            if i % 100 == 0 {
                live.push(s);
            } else {
                s.stop();
            }
        }
        assert_eq!(dog.watched(), live.len());
        let len = dog.shared.lock().entries.len();
        assert!(
            len < 200,
            "{len} entries kept for {} live holds",
            live.len()
        );
    }

    #[test]
    fn a_sweep_reports_passed_deadlines_and_caps_at_the_earliest_other() {
        let shared = unwatched();
        let stats = Counters::default();
        let now = Instant::now();
        let lease = Duration::from_secs(3);
        let at = |key: &str, start: Instant| {
            WatchState::new(key, RenewKind::Value(TEST), b"v", lease, start, None)
        };
        // Holds past their loss deadline and holds ahead of it.
        let a_passed = at("a-passed", now - Duration::from_secs(4));
        let a_later = at("a-later", now + Duration::from_secs(2));
        let b_passed = at("b-passed", now - Duration::from_secs(5));
        let b_sooner = at("b-sooner", now + Duration::from_secs(1));
        let watch = |s: &Arc<WatchState>| {
            shared.lock().entries.push(Entry {
                state: Arc::downgrade(s),
                due: now,
                gone: false,
            })
        };
        for s in [&a_passed, &a_later, &b_passed, &b_sooner] {
            watch(s);
        }
        let until = sweep(&shared, &stats);
        assert!(a_passed.marked_lost() && b_passed.marked_lost());
        assert!(!a_later.marked_lost() && !b_sooner.marked_lost());
        // Capped by the hold whose deadline comes first.
        assert_eq!(until, b_sooner.loss_deadline().checked_sub(CAP_ALLOWANCE));
        // Once renewed, a hold caps no more before the others.
        b_sooner.renewed(now + Duration::from_secs(2), lease);
        assert_eq!(
            sweep(&shared, &stats),
            a_later.loss_deadline().checked_sub(CAP_ALLOWANCE)
        );
        // A hold watched since is reported once its deadline has passed.
        let other = at("other", now - Duration::from_secs(4));
        watch(&other);
        sweep(&shared, &stats);
        assert!(other.marked_lost());
        assert_eq!(stats.snapshot().lost_holds, 3);
    }

    #[test]
    fn retry_delay_is_a_tenth_within_bounds() {
        assert_eq!(
            retry_delay(Duration::from_millis(50)),
            Duration::from_millis(10)
        );
        assert_eq!(
            retry_delay(Duration::from_secs(3)),
            Duration::from_millis(300)
        );
        assert_eq!(retry_delay(Duration::from_secs(30)), Duration::from_secs(1));
    }

    #[test]
    fn due_entries_within_slack_are_taken_expired_ones_reported() {
        let shared = unwatched();
        let now = Instant::now();
        let lease = Duration::from_secs(3);
        let soon = WatchState::new("soon", RenewKind::Value(TEST), b"v", lease, now, None);
        let later = WatchState::new("later", RenewKind::Value(TEST), b"v", lease, now, None);
        let stale = WatchState::new(
            "stale",
            RenewKind::Value(TEST),
            b"v",
            lease,
            now - Duration::from_secs(4),
            None,
        );
        let stopped = WatchState::new(
            "stopped",
            RenewKind::HashField(TEST),
            b"v",
            lease,
            now,
            None,
        );
        stopped.stop();
        let dropped = WatchState::new("dropped", RenewKind::Value(TEST), b"v", lease, now, None);
        {
            let mut list = shared.lock();
            for (s, due) in [
                (&soon, now + Duration::from_millis(400)), // within lease/6 = 500 ms
                (&later, now + Duration::from_millis(900)),
                (&stale, now),
                (&stopped, now),
                (&dropped, now),
            ] {
                list.entries.push(Entry {
                    state: Arc::downgrade(s),
                    due,
                    gone: false,
                });
            }
        }
        drop(dropped);
        let due = take_due(&shared, now);
        let due: Vec<&str> = due.iter().map(|(_, s)| &*s.key).collect();
        assert_eq!(due, ["soon", "stale"]);
        // The stopped and dropped entries are removed.
        assert_eq!(shared.lock().entries.len(), 3);
        // The stale one is reported lost by the sweep before the round's first call, not
        // renewed (a round renews only the holds not marked lost).
        let stats = Counters::default();
        sweep(&shared, &stats);
        assert!(stale.marked_lost() && !soon.marked_lost());
        assert_eq!(stats.snapshot().lost_holds, 1);
    }
}
