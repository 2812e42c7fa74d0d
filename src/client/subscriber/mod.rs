//! Waiters woken by pub/sub: ONE subscriber connection per [`LockClient`](crate::LockClient),
//! owned by one background thread ("dlock-subscriber") that wakes the threads waiting for a
//! lock when its release is published.
//!
//! The connection is a `redis::Connection` opened from the client's own connection info, so
//! TLS (custom CA, client certificates), RESP3, unix sockets, AUTH/ACL users and every URL form
//! redis-rs knows work for it as for the pool.
//!
//! How it works:
//! - A waiting thread calls [`Wakeups::subscribe`] with the lock's channel and its line name.
//!   If the channel is not yet subscribed on the current connection, the thread queues a
//!   `SUBSCRIBE` for the reader and waits until the server confirms it (or, if the reader is in
//!   the middle of a read, polls until the confirmation wakes it). Threads waiting on the same
//!   channel share one subscription.
//! - Only the reader thread touches the connection (redis-rs cannot split a connection, a TLS
//!   one least of all, into a read and a write half, nor interrupt a blocked read). It sends
//!   the queued `SUBSCRIBE`/`UNSUBSCRIBE` commands and reads their confirmations, then reads
//!   pushes: a `message` wakes every line of its channel ([`WaitQueues::notify_release`]).
//!   While channels are subscribed it reads with a timeout ([`TICK`]), so that a queued
//!   command waits at most that long; with nothing subscribed nothing can arrive, and it
//!   sleeps until a command is queued.
//! - A release channel nobody waits on is unsubscribed at once; a hand-off channel (a Fair
//!   client's grant channel, one per client) stays subscribed for [`LINGER`], so that a
//!   client's next fair wait costs no re-subscription (both measured: see [`LINGER`]).
//! - A lost connection (an error, EOF, or no answer to a `PING` within the client's timeout)
//!   makes every subscription unconfirmed and wakes the waiters: they make an attempt, which
//!   reports an outage as polling would have, and then poll. The reader reconnects with
//!   backoff, re-subscribes, and wakes them again when the server confirms, since a release
//!   may have gone unheard in between.
//! - Waits never depend on this thread for correctness: each is bounded by the holder's
//!   remaining lifetime and the caller's deadline.
//!
//! [`TICK`]: reader::TICK
//! [`LINGER`]: registry::LINGER

mod reader;
mod registry;

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::client::grants::Token;
use crate::client::repeats::Repeats;
use crate::client::subscriber::reader::{run, Shared, THREAD_NAME};
use crate::client::subscriber::registry::{Link, State, LINGER};
use crate::client::waiters::{lock, wait_for, wait_while, WaitQueues};
use crate::stats::Counters;

pub(crate) use crate::client::subscriber::reader::Resolve;

/// The subscriber of one client.
pub(crate) struct Wakeups {
    /// `None` when the client has no address to subscribe on: its waiters poll.
    shared: Option<Arc<Shared>>,
}

/// How the messages of a channel reach its waiters, as the lock that subscribes says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// A message is a release: the reader thread wakes the channel's lines, whose heads try
    /// again.
    Release,
    /// A message hands the lock to one waiter (a grant, see `grants.rs`): the waiter may
    /// borrow the connection and read its grant itself ([`Wakeups::await_grant`]).
    HandOff,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("available", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    /// A subscriber that connects with `resolve` when first needed (never, if `None`: the
    /// client's locks then poll), waking lines of `waiters`; `timeout` bounds connecting and
    /// waiting for a subscription's confirmation.
    pub(crate) fn new(
        resolve: Option<Resolve>,
        waiters: Arc<WaitQueues>,
        timeout: Duration,
        counters: Arc<Counters>,
        repeats: Arc<Repeats>,
    ) -> Self {
        Wakeups {
            shared: resolve.map(|resolve| {
                Arc::new(Shared {
                    resolve,
                    waiters,
                    timeout,
                    state: Mutex::new(State::default()),
                    cv: Condvar::new(),
                    counters,
                    repeats,
                    reader_cv: Condvar::new(),
                })
            }),
        }
    }

    /// Subscribes to `channel`; every message on it wakes the waiters of line `line`
    /// ([`WaitQueues::notify_release`]). Waits for the server's confirmation until `deadline`
    /// (at most the timeout), so that a release published after this returns is not missed.
    /// `None` when pub/sub is unavailable: the caller polls. An unconfirmed subscription
    /// (server unreachable, reconnecting) may become confirmed later: check
    /// [`Subscription::is_confirmed`] before relying on it.
    pub(crate) fn subscribe(
        &self,
        channel: &str,
        line: &str,
        delivery: Delivery,
        deadline: Option<Instant>,
    ) -> Option<Subscription<'_>> {
        let shared = self.shared.as_ref()?;
        let now = Instant::now();
        let left = deadline.map_or(shared.timeout, |d| {
            shared.timeout.min(d.saturating_duration_since(now))
        });
        let mut st = lock(&shared.state);
        if st.shutdown || st.link == Link::Unavailable {
            return None;
        }
        if st.link == Link::Stopped {
            let reader = Arc::clone(shared);
            let thread = std::thread::Builder::new().name(THREAD_NAME.into());
            if let Err(e) = thread.spawn(move || run(&reader)) {
                log::warn!("pub/sub: cannot start the subscriber thread ({e}); waiters poll");
                return None;
            }
            st.link = Link::Connecting;
        }
        let up = st.link == Link::Up;
        let ch = st.channels.entry(channel.to_owned()).or_default();
        *ch.lines.entry(line.to_owned()).or_default() += 1;
        ch.idle_until = None;
        ch.hand_off = delivery == Delivery::HandOff;
        // Its `SUBSCRIBE` is (or is about to be) queued: while the reader reads, every one it
        // sent is confirmed.
        let queued = if ch.sent { !ch.confirmed } else { up };
        // While connecting, the reader subscribes every waited-on channel once it is up.
        if up && !ch.sent {
            ch.sent = true;
            st.queue.push(("SUBSCRIBE", vec![channel.to_owned()]));
            shared.cv.notify_all();
        }
        // After counting this user, so that a lingering `channel` is kept, not re-subscribed.
        st.sweep(now);
        // Sent only once the reader's current read returns (up to TICK): poll meanwhile
        // rather than wait; the confirmation wakes this waiter (`rewake`). So also when
        // another thread queued the channel's `SUBSCRIBE` and it still waits behind that read
        // (a thread at the head of its line would otherwise hold the line until the tick).
        let behind_a_read = st.reading && queued;
        // Connecting (or waiting for the reply) is worth waiting for; a reader that failed to
        // connect is not (it pauses before retrying): poll meanwhile.
        let mut waiting = |st: &mut State| {
            let polling = st.shutdown || matches!(st.link, Link::Backoff | Link::Unavailable);
            !(st.is_confirmed(channel) || behind_a_read || polling)
        };
        st = wait_while(&shared.cv, st, left, &mut waiting);
        if waiting(&mut st) {
            log::debug!("pub/sub: {channel:?} not confirmed in time; polling meanwhile");
        }
        // Unconfirmed, the waiter polls meanwhile: wake it once the channel is confirmed,
        // since a release published before that went unheard.
        let confirmed = st.is_confirmed(channel);
        if let Some(ch) = st.channels.get_mut(channel) {
            ch.rewake |= !confirmed;
        }
        // A lent connection is taken back for this (a command to send, or a channel whose
        // messages the reader thread dispatches); otherwise the reader thread is not woken
        // (one system call and two thread switches fewer per waiting hand-off `lock()`).
        let take_back = st.lending && !Shared::may_keep_lent(&st);
        drop(st);
        if take_back {
            shared.reader_cv.notify_all();
        }
        Some(Subscription {
            shared,
            channel: channel.to_owned(),
            line: line.to_owned(),
        })
    }

    /// Waits until a grant to `token` is in the client's grants, until `until`, or until the
    /// subscriber's link changes (lost, or a subscription confirmed): the caller then looks
    /// again. While it waits, this thread reads the subscriber connection itself whenever the
    /// reader thread lends it (it does while only hand-off waiters need it): a grant message
    /// then wakes this thread directly, one thread switch fewer than through the reader
    /// thread. Messages for other threads are dispatched as the reader thread would. `false`
    /// when this client has no subscriber (the caller sleeps as it would otherwise).
    pub(crate) fn await_grant(&self, token: &Token, until: Instant) -> bool {
        let Some(shared) = self.shared.as_ref() else {
            return false;
        };
        let mut st = lock(&shared.state);
        st.borrowers += 1;
        let link = st.link_events;
        loop {
            let now = Instant::now();
            if shared.waiters.grants.is_granted(token) || st.link_events != link || now >= until {
                break;
            }
            // Not if the reader thread wants it back.
            let lend = !matches!(&st.lent, Some(r) if shared.wanted_back(&st, r));
            let Some(mut reader) = st.lent.take_if(|_| lend) else {
                st.sleeping += 1;
                st = wait_for(&shared.cv, st, until - now);
                st.sleeping -= 1;
                continue;
            };
            drop(st);
            let read = reader.read_one(shared, until - now);
            // Put back; this thread takes it again at once if it still waits (it keeps the lock).
            st = lock(&shared.state);
            // Wake the reader thread if it waits for the connection back, or it broke.
            let wake = read.is_err() || shared.wanted_back(&st, &reader);
            match read {
                Ok(()) => st.lent = Some(reader),
                Err(end) => st.broken = Some(end),
            }
            if wake {
                shared.reader_cv.notify_all();
            }
        }
        st.borrowers -= 1;
        // Another borrower may read the connection now.
        if st.sleeping > 0 {
            shared.cv.notify_all();
        }
        true
    }

    /// A grant was delivered to a thread of this client by other means than the subscriber
    /// (the client's own release): a borrower waiting in [`await_grant`](Self::await_grant)
    /// looks again.
    pub(crate) fn nudge(&self) {
        if let Some(shared) = &self.shared {
            shared.nudge();
        }
    }

    #[cfg(feature = "sentinel")]
    /// The master switched (a Sentinel failover): a graceful one leaves the old master up and
    /// answering, so the subscriber connection would stay on it and hear no release published
    /// on the new one (waiters would poll). The reader drops it and connects again at once.
    pub(crate) fn reconnect(&self) {
        let Some(shared) = &self.shared else {
            return;
        };
        let mut st = lock(&shared.state);
        // Not connected: the next connection resolves the new master anyway.
        if st.link == Link::Up {
            st.reconnect = true;
            st.link_events += 1;
            drop(st);
            shared.cv.notify_all();
            shared.reader_cv.notify_all();
        }
    }

    /// True if this client's subscriber connection is subscribed (or subscribing) to
    /// `channel` on the current connection: a message published there reaches this client too,
    /// so a `PUBLISH` reply counts it among the receivers.
    pub(crate) fn hears(&self, channel: &str) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| lock(&s.state).channels.get(channel).is_some_and(|c| c.sent))
    }

    /// The connection generation on which `channel` is confirmed now, if it is: a message
    /// published while the same generation stays confirmed was heard.
    pub(crate) fn confirmed_on(&self, channel: &str) -> Option<u64> {
        let shared = self.shared.as_ref()?;
        let st = lock(&shared.state);
        st.is_confirmed(channel).then_some(st.generation)
    }

    /// Channels currently subscribed (or being subscribed), lingering ones included.
    #[cfg(test)]
    pub(crate) fn subscribed_channels(&self) -> usize {
        self.shared
            .as_ref()
            .map_or(0, |s| lock(&s.state).channels.len())
    }
}

impl Drop for Wakeups {
    /// Tells the reader to exit (it notices within [`TICK`], or at once if it is idle); never
    /// joins it (it may be connecting, bounded by the timeout).
    ///
    /// [`TICK`]: reader::TICK
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            lock(&shared.state).shutdown = true;
            shared.cv.notify_all();
            shared.reader_cv.notify_all();
        }
    }
}

/// A thread's interest in a channel; unsubscribes (after a linger) when the last one drops.
pub(crate) struct Subscription<'a> {
    shared: &'a Shared,
    channel: String,
    line: String,
}

impl Subscription<'_> {
    /// True while the server has confirmed the subscription on the current connection: a
    /// release will be heard. False after the connection dropped, until it is re-established.
    pub(crate) fn is_confirmed(&self) -> bool {
        lock(&self.shared.state).is_confirmed(&self.channel)
    }

    /// The channel subscribed to.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        let now = Instant::now();
        if let Some(ch) = st.channels.get_mut(&self.channel) {
            if let Some(n) = ch.lines.get_mut(&self.line) {
                *n = n.saturating_sub(1);
            }
            ch.lines.retain(|_, n| *n > 0);
            if ch.lines.is_empty() {
                // [`LINGER`] (or a benchmark's override of it) for a hand-off channel, none for
                // a release channel.
                let linger = ch.hand_off.then(|| crate::client::tuning::linger(LINGER));
                ch.idle_until = Some(crate::time::saturating_add(now, linger.unwrap_or_default()));
            }
        }
        // A channel past its linger is queued for UNSUBSCRIBE by the reader's own sweep.
        st.sweep(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_resolver_nothing_subscribes() {
        let w = Wakeups::new(
            None,
            Arc::new(WaitQueues::default()),
            Duration::from_secs(1),
            Arc::default(),
            Arc::default(),
        );
        assert!(w.subscribe("ch", "line", Delivery::Release, None).is_none());
        assert_eq!(w.subscribed_channels(), 0);
    }

    /// Without a TLS feature a TLS address cannot be used: pub/sub is reported unavailable
    /// (logged as an error) and the waiters poll.
    #[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
    #[test]
    fn tls_without_the_feature_makes_pubsub_unavailable() {
        use redis::ConnectionAddr;
        // As a TLS URL resolves (this build has no TLS feature to parse one).
        let resolve: Resolve = Box::new(|| {
            redis::Client::open("redis://127.0.0.1:1/").map(|c| {
                c.get_connection_info()
                    .clone()
                    .set_addr(ConnectionAddr::TcpTls {
                        host: "127.0.0.1".into(),
                        port: 1,
                        insecure: false,
                        tls_params: None,
                    })
            })
        });
        let w = Wakeups::new(
            Some(resolve),
            Arc::new(WaitQueues::default()),
            Duration::from_secs(1),
            Arc::default(),
            Arc::default(),
        );
        // The first call waits while the reader finds out; later ones return None at once.
        let first = w.subscribe("ch", "line", Delivery::Release, None);
        assert!(first.as_ref().is_none_or(|s| !s.is_confirmed()));
        drop(first);
        assert!(w.subscribe("ch", "line", Delivery::Release, None).is_none());
        assert_eq!(w.subscribed_channels(), 0);
    }

    #[test]
    fn unreachable_server_leaves_subscription_unconfirmed() {
        // A port nobody listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let resolve: Resolve = Box::new(move || {
            redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .map(|c| c.get_connection_info().clone())
        });
        let w = Wakeups::new(
            Some(resolve),
            Arc::new(WaitQueues::default()),
            Duration::from_secs(5),
            Arc::default(),
            Arc::default(),
        );
        let start = Instant::now();
        let s = w
            .subscribe("ch", "line", Delivery::Release, None)
            .expect("pub/sub configured");
        assert!(!s.is_confirmed());
        // Refused at once: no wait for the (5 s) timeout.
        assert!(start.elapsed() < Duration::from_secs(4));
        drop(s);
        assert_eq!(w.subscribed_channels(), 0);
    }
}
