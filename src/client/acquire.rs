//! The blocking acquire loop every lock shares: the in-process line of waiters, pub/sub
//! wake-ups, the retry policy's sleeps, and transient failures retried until the deadline.

use std::time::{Duration, Instant};

use crate::client::subscriber::{Delivery, Subscription, Wakeups};
use crate::client::test_hooks::Event;
use crate::client::waiters::WaitQueues;
use crate::error::{LockError, Result};
use crate::lease::Attempt;
use crate::lock::{DistributedLock, LockGuard};
use crate::retry::Attempts;

/// The blocking acquire of a lock that waits in the in-process line named by its key, FIFO,
/// with `try_acquire` as the attempt.
pub(crate) fn acquire_blocking<'a, L: DistributedLock>(
    lock: &'a L,
    queues: &WaitQueues,
    attempts: Attempts<'_>,
) -> Result<LockGuard<'a>> {
    let line = Line {
        queues,
        name: lock.key(),
        fifo: true,
        barge: false,
        wake: None,
    };
    acquire_in_line(
        lock,
        line,
        attempts,
        // A lock's public `try_acquire`: `LockError::Held` is a refusal.
        || match lock.try_acquire() {
            Err(LockError::Held { .. }) => Ok(Attempt::Held {
                pttl: None,
                wake: None,
            }),
            other => other.map(Attempt::Acquired),
        },
        |_| Ok(()),
    )
}

/// Where a blocking acquire waits in this process, and how.
pub(crate) struct Line<'q> {
    /// The client's waiter lines.
    pub(crate) queues: &'q WaitQueues,
    /// The line's name: the lock key, or one name per mode of a read-write lock.
    pub(crate) name: &'q str,
    /// Wait to be the head of the line before each attempt. Without it the line only wakes
    /// the thread early when a local holder releases (readers, who may all get in together).
    pub(crate) fifo: bool,
    /// Make the first attempt even if others wait in the line (a thread that already holds
    /// the lock and would otherwise wait behind a thread waiting for it).
    pub(crate) barge: bool,
    /// Releases are published on this channel: wait for the message instead of polling.
    pub(crate) wake: Option<Wake<'q>>,
}

/// Pub/sub wake-ups of a line: the client's subscriber and the channel to wait on.
pub(crate) struct Wake<'q> {
    pub(crate) wakeups: &'q Wakeups,
    /// The lock's channel, waited on after a refusal that names none ([`Attempt::Held`]'s
    /// `wake`) and after an attempt that failed. `None` for a line whose refusals name their
    /// channel, one that may change from attempt to attempt (a primitive over many keys): it
    /// waits on no channel after a failed attempt.
    pub(crate) channel: Option<&'q str>,
    /// A second channel whose messages also wake the line, subscribed beside `channel` (a
    /// foreign fleet whose older releases publish elsewhere). Best effort: the wait relies on
    /// `channel`'s confirmation alone, and the poll covers a release missed on this one.
    pub(crate) also: Option<&'q str>,
}

/// The blocking acquire loop shared by every lock.
///
/// The first attempt goes straight to Redis unless other threads of this client already wait
/// in the line (and `barge` is off); then the thread joins the line ([`WaitQueues`]): only its
/// head makes attempts (with `fifo`), and a local release wakes it at once.
///
/// Between attempts the thread sleeps by the retry policy, unless the line has a pub/sub
/// [`Wake`]: after its first refused attempt it subscribes to the lock's channel (confirmed by
/// the server before the next attempt, so no release in between goes unheard) and then sleeps
/// until a release is published, at most the holder's remaining lifetime as the refused
/// attempt reported it, never past the deadline, and never longer than the poll interval
/// ([`WaitQueues::poll_interval`]: 100–120 ms, or 20–30 ms for a line whose lock was last
/// freed without a published release; at least the policy's longest sleep). A holder that
/// releases without publishing (a foreign or legacy locker) is thus noticed within the poll
/// interval, whatever its lifetime. Without a confirmed subscription (pub/sub unavailable,
/// subscriber reconnecting) or without a reported lifetime it falls back to the policy's
/// sleeps.
///
/// A refusal that names its channel ([`Attempt::Held`]'s `wake`) is waited on there instead:
/// when the channel named changes, the thread subscribes to the new one (and tries again at
/// once if that is confirmed at once, as after the first refusal) and then drops the old one,
/// so it is woken by releases of the hold that refused it last and by no other; on a line
/// without a channel of its own it waits on none after a failed attempt. Such a wait neither
/// marks the line silent nor clears the mark: the silence is the refusing hold's, not the
/// line's.
///
/// The handoff courtesy ([`WaitQueues::take_courtesy`]) is slept before the first attempt,
/// never past the deadline. A thread that reaches its deadline still waiting for its turn
/// first waits for the outcome of the attempt on the wire ahead of it, if any (at most as long
/// as it has waited, and at least 1 s); when the line's latest attempt failed to reach Redis,
/// or is still without a reply, it reports [`LockError::Connection`] naming that failure, not
/// a contention timeout.
///
/// `on_give_up` gets the number of attempts made and may replace the final
/// [`LockError::Timeout`] with a more precise error.
pub(crate) fn acquire_in_line<'a, L: DistributedLock>(
    lock: &'a L,
    line: Line<'_>,
    attempts: Attempts<'_>,
    attempt: impl FnMut() -> Result<Attempt>,
    on_give_up: impl FnOnce(u32) -> Result<()>,
) -> Result<LockGuard<'a>> {
    let floor = lock.retry_policy().max_delay;
    wait_in_line(lock.key(), floor, line, attempts, attempt, on_give_up)
        .map(|lease| LockGuard::new(lock, lease))
}

/// [`acquire_in_line`] for any outcome `T` an attempt takes (a lease, or the several leases of
/// a primitive that hands out more than one per acquire), on the line of `key`, whose retry
/// policy's longest sleep is `floor`: returns what the winning attempt took.
pub(crate) fn wait_in_line<T>(
    key: &str,
    floor: Duration,
    line: Line<'_>,
    mut attempts: Attempts<'_>,
    mut attempt: impl FnMut() -> Result<Attempt<T>>,
    on_give_up: impl FnOnce(u32) -> Result<()>,
) -> Result<T> {
    let mut pttl = None;
    // The channel the latest refusal named, if any.
    let mut named = None;
    // The deadline, or for a count-limited policy the longest its retries could take, so a
    // retry limit still ends every wait; `None` only for a wait without any limit.
    let deadline = attempts.queue_deadline();
    if !line.barge {
        if let Some(until) = line.queues.take_courtesy(line.name) {
            // This client just released the lock while other clients waited: let them in,
            // but never past the caller's deadline.
            let until = deadline.map_or(until, |d| until.min(d));
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
    }
    // The last attempt won too late (a slow server): reported instead of a timeout.
    let mut late = None;
    if line.barge || !line.queues.has_waiters(line.name) {
        attempts.record();
        match refused_if_late(attempt(), &mut late)? {
            Attempt::Acquired(taken) => return Ok(taken),
            Attempt::Held { pttl: p, wake } => (pttl, named) = (p, wake),
        }
    }
    let mut ticket = line.queues.enqueue(line.name);
    line.queues.hooks.note(Event::Queued);
    log::trace!(
        "lock {key:?}: waiting behind {} threads of this process",
        ticket.ahead()
    );
    let mut subscription: Option<Subscription<'_>> = None;
    let mut also = None;
    let mut polled = false;
    let stalled = loop {
        if attempts.made() > 0 {
            let Some(backoff) = attempts.next_sleep() else {
                break None;
            };
            let mut fresh = false;
            // Waiting on the line's own channel, not on one the latest refusal named.
            let own = named.is_none();
            if let Some(wake) = &line.wake {
                match named.as_deref().or(wake.channel) {
                    // A failed attempt on a line without a channel of its own: none to hear.
                    None => (subscription, also) = (None, None),
                    Some(ch) if subscription.as_ref().is_none_or(|s| s.channel() != ch) => {
                        // Made before the previous one (of another channel) is dropped.
                        subscription =
                            wake.wakeups
                                .subscribe(ch, line.name, Delivery::Release, deadline);
                        // Confirmed just now: a release since the refused attempt may have
                        // been missed, so try again at once.
                        fresh = subscription.as_ref().is_some_and(|s| s.is_confirmed());
                        also = wake.also.and_then(|ch| {
                            wake.wakeups
                                .subscribe(ch, line.name, Delivery::Release, deadline)
                        });
                    }
                    Some(_) => {}
                }
            }
            let listening = subscription.as_ref().is_some_and(|s| s.is_confirmed());
            // Beside the subscription, a poll: a holder that frees the lock without
            // publishing (a foreign or legacy locker) is noticed within the poll interval.
            let mut poll = None;
            let sleep = match pttl {
                _ if fresh => Duration::ZERO,
                // Bounded by the deadline, or for a count-limited policy by the longest its
                // retries could take, so a retry limit still ends the wait.
                Some(p) if listening => {
                    let interval = line.queues.poll_interval(line.name, floor);
                    poll = (interval < p).then_some(interval);
                    let p = p.min(interval);
                    deadline.map_or(p, |d| p.min(d.saturating_duration_since(Instant::now())))
                }
                _ => backoff,
            };
            log::trace!(
                "lock {key:?}: refused, attempt {} failed, next in at most {sleep:?}{}",
                attempts.made(),
                if listening {
                    " (or when a release is published)"
                } else {
                    ""
                }
            );
            let woken = ticket.sleep(sleep);
            if woken && listening && own {
                line.queues.heard_release(line.name);
            }
            // Woken by the poll, before the holder's lifetime ran out, and first in line (the
            // attempt follows at once): a win now means the holder freed the lock without
            // publishing.
            polled = own && poll.is_some() && !woken && (!line.fifo || ticket.ahead() == 0);
        }
        if line.fifo && !ticket.wait_turn(deadline) {
            // Gave up before its turn: because the lock is held, or because the threads
            // ahead could not reach Redis (an outage is not contention).
            // The attempt ahead normally ends within the client's timeouts; without a
            // command timeout, give it at most as long as this thread waited (1 s or more).
            break ticket.outage(attempts.waited().max(Duration::from_secs(1)));
        }
        ticket.mark();
        attempts.record();
        ticket.attempt_started();
        let result = attempt();
        ticket.attempt_finished(match &result {
            Err(e @ LockError::Connection { .. }) => Some(e.report()),
            _ => None,
        });
        match refused_if_late(result, &mut late)? {
            Attempt::Acquired(taken) => {
                // Unless a release was heard while the attempt was on the wire.
                if polled && !ticket.released_since_mark() {
                    line.queues.mark_silent(line.name);
                }
                log::debug!(
                    "lock {key:?}: acquired after {} attempts in {:?}",
                    attempts.made(),
                    attempts.waited()
                );
                return Ok(taken);
            }
            Attempt::Held { pttl: p, wake } => (pttl, named) = (p, wake),
        }
    };
    drop((also, subscription, ticket));
    let err = match stalled {
        // An outage seen by the attempts ahead, as they would have reported it.
        Some(why) => LockError::connection(
            key,
            crate::error::Fault::Unreachable,
            format!(
                "gave up after {} and {} own attempt{}, waiting in line behind other threads \
                 of this client: {why}",
                crate::error::Rounded(attempts.waited()),
                attempts.made(),
                if attempts.made() == 1 { "" } else { "s" }
            )
            .into(),
        ),
        None => {
            on_give_up(attempts.made())?;
            late.unwrap_or_else(|| LockError::Timeout {
                key: key.to_owned(),
                attempts: attempts.made(),
                waited: attempts.waited(),
            })
        }
    };
    // Returned to the caller, who decides what it means: logged for debugging only (an outage
    // is logged by the paths that meet it, a few lines per cause, not by every caller's
    // acquire).
    log::debug!(
        "lock {key:?}: gave up after {} attempts in {:?}: {}",
        attempts.made(),
        attempts.waited(),
        err.report()
    );
    Err(err)
}

/// An attempt that met a transient failure ([`LockError::is_transient`]: a failover, a
/// restart, a win that came back too late and was released, a RedLock majority lost for want
/// of answers) counts as refused in a blocking acquire, which retries it with the policy's
/// backoff until its deadline; the error is kept in `late` until an attempt ends otherwise,
/// and returned instead of a timeout if it was the last. One predicate decides: what a
/// blocking acquire retries is what `is_transient` says.
fn refused_if_late<T>(
    outcome: Result<Attempt<T>>,
    late: &mut Option<LockError>,
) -> Result<Attempt<T>> {
    match outcome {
        Err(e) if e.is_transient() => {
            log::debug!("{}; retried until the deadline", e.report());
            *late = Some(e);
            Ok(Attempt::Held {
                pttl: None,
                wake: None,
            })
        }
        other => {
            *late = None;
            other
        }
    }
}

/// After a release: wakes this process's waiters, or logs a lock found lost. Passes `ours` on.
pub(crate) fn note_release(waiters: &WaitQueues, key: &str, ours: bool) -> bool {
    if ours {
        waiters.notify_release(key);
    } else {
        // Returned to the caller as `Ok(false)`; a guard dropped without `unlock` warns.
        log::debug!(
            "lock {key:?}: lost before release (it expired, or another owner took it over); \
             no other owner's lock was deleted"
        );
    }
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking acquire retries exactly the failures `is_transient` names: one
    /// classification for the predicate users read and the retry loop.
    #[test]
    fn a_blocking_acquire_retries_what_is_transient_says() {
        let key = "k".to_string();
        let redis = |kind, text| LockError::from_redis("k", redis::RedisError::from((kind, text)));
        let failures = [
            LockError::LateReply {
                key: key.clone(),
                elapsed: Duration::from_millis(9),
                ttl: Duration::from_millis(10),
            },
            LockError::NoQuorum {
                key: key.clone(),
                granted: 1,
                refused: 0,
                failed: 2,
                nodes: 3,
                quorum: 2,
                source: None,
            },
            LockError::NotReplicated {
                key: key.clone(),
                confirmed: 0,
                required: 1,
            },
            redis(redis::ErrorKind::Io, "reset"),
            LockError::Lost { key: key.clone() },
            LockError::WrongType { key: key.clone() },
            LockError::config("k", "bad"),
        ];
        for e in failures {
            let transient = e.is_transient();
            let expected = matches!(
                e,
                LockError::LateReply { .. }
                    | LockError::NoQuorum { .. }
                    | LockError::NotReplicated { .. }
                    | LockError::Connection { .. }
            );
            assert_eq!(transient, expected, "{e:?}");
            let shown = format!("{e:?}");
            let mut late = None;
            let retried = matches!(
                refused_if_late::<crate::lease::Lease>(Err(e), &mut late),
                Ok(Attempt::Held {
                    pttl: None,
                    wake: None
                })
            );
            assert_eq!(retried, transient, "{shown}");
            assert_eq!(late.is_some(), transient, "{shown}");
        }
    }
}
