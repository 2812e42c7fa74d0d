//! The registry of subscriptions: which channels are waited on, by which lines, what is
//! queued for the reader to send, the state of the link, and the connection while it is lent
//! (its types are here, so that the reader's module depends on this one and not the reverse).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a hand-off channel (a Fair client's grant channel) nobody waits on stays
/// subscribed. A release channel is unsubscribed as soon as nobody waits on it: its linger
/// made Token lines slower (benches/knobs.rs: 1.3× sections/s without it, in steady and in
/// bursty contention), where the grant channel's saves Fair waiters a re-subscription per
/// wait (0.8× sections/s and 1.2–1.3× the wait p99 without it).
pub(super) const LINGER: Duration = Duration::from_millis(1500);

#[derive(Default)]
pub(super) struct State {
    pub(super) channels: HashMap<String, Channel>,
    /// Commands for the reader to send on the current connection, in order: `SUBSCRIBE` or
    /// `UNSUBSCRIBE`, and its channels.
    pub(super) queue: Vec<(&'static str, Vec<String>)>,
    /// Bumped at every connection (each one after the first is a reconnect): a grant waiter
    /// that saw the same generation confirmed before and after a wait heard every message of it
    /// ([`Wakeups::confirmed_on`]).
    ///
    /// [`Wakeups::confirmed_on`]: super::Wakeups::confirmed_on
    pub(super) generation: u64,
    pub(super) link: Link,
    /// The client is gone: the reader exits.
    pub(super) shutdown: bool,
    /// The master switched (Sentinel): the reader drops its connection, which leads to the
    /// old master, and connects again, to the master it resolves now.
    pub(super) reconnect: bool,
    /// The reader is blocked reading pushes (up to [`TICK`]), or has lent the connection: a
    /// command queued now waits.
    ///
    /// [`TICK`]: super::reader::TICK
    pub(super) reading: bool,
    /// Hand-off waiters waiting for a grant in [`Wakeups::await_grant`].
    ///
    /// [`Wakeups::await_grant`]: super::Wakeups::await_grant
    pub(super) borrowers: usize,
    /// The reader thread lends the connection to the borrowers (it waits in `serve`): while
    /// one of them waits for a grant, that waiting thread reads the connection itself, so the
    /// grant message wakes it directly rather than through the reader thread.
    pub(super) lending: bool,
    /// The connection, while lent and not being read by a borrower.
    pub(super) lent: Option<Reader>,
    /// A borrower's read failed: the reader thread ends the connection with this.
    pub(super) broken: Option<End>,
    /// Bumped when the link changes (lost, or a subscription confirmed): a borrower returns.
    pub(super) link_events: u64,
    /// Borrowers blocked on `cv` (another one is reading).
    pub(super) sleeping: usize,
}

/// The subscriber connection's state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// No reader thread (it sets this, under the lock, as it exits while nobody waits; it
    /// exits leaving [`Link::Unavailable`], or at shutdown, for good).
    #[default]
    Stopped,
    /// The reader is connecting.
    Connecting,
    /// Connected: commands queued now are sent on this connection.
    Up,
    /// The last connection attempt failed; the reader retries after a pause.
    Backoff,
    /// Pub/sub cannot be used (the server refuses `SUBSCRIBE`, or the connection info cannot
    /// be used in this build): waiters poll.
    Unavailable,
}

/// Why a connection ended.
pub(super) enum End {
    /// I/O error, EOF, or a silent peer: reconnect.
    Lost(String),
    /// Connecting failed for a cause unlikely to go away by itself (a TLS handshake or
    /// authentication failure): reconnect, logged as a warning rather than as routine.
    CannotConnect(String),
    /// Pub/sub cannot work with this server: stop.
    Unavailable(String),
    /// Ended on request: the client is gone (the reader exits), or the master switched
    /// (connect again at once, to the new one).
    Requested,
}

/// The reader's side of one connection.
pub(super) struct Reader {
    pub(super) con: redis::Connection,
    /// The read timeout currently set on the connection.
    pub(super) read_timeout: Duration,
    /// When the server was last heard (by the reader thread, or a borrower).
    pub(super) heard: Instant,
}

#[derive(Default)]
pub(super) struct Channel {
    /// Lines woken by a message, with how many live subscriptions named each (none: nobody
    /// waits on the channel).
    pub(super) lines: HashMap<String, usize>,
    /// `SUBSCRIBE` was queued (or sent) on the current connection. Both flags are cleared
    /// when a connection ends, so a confirmation counts only for the connection it came on.
    pub(super) sent: bool,
    /// The server confirmed the subscription on the current connection.
    pub(super) confirmed: bool,
    /// Its waiters take grants (see [`Delivery::HandOff`]): the connection may be lent to them.
    ///
    /// [`Delivery::HandOff`]: super::Delivery::HandOff
    pub(super) hand_off: bool,
    /// Nobody waits on the channel: when its linger ends.
    pub(super) idle_until: Option<Instant>,
    /// The connection was lost while threads waited: wake them once confirmed again.
    pub(super) rewake: bool,
}

impl State {
    /// True if a channel is subscribed (or its `SUBSCRIBE` queued) on the current connection:
    /// pushes may arrive.
    pub(super) fn subscribed(&self) -> bool {
        self.channels.values().any(|c| c.sent)
    }

    pub(super) fn is_confirmed(&self, channel: &str) -> bool {
        self.link == Link::Up && self.channels.get(channel).is_some_and(|c| c.confirmed)
    }

    /// Forgets the channels nobody waits on: at once if they are not subscribed on this
    /// connection, after their linger (queueing an `UNSUBSCRIBE`) if they are. A channel whose
    /// `SUBSCRIBE` is not confirmed yet stays until it is.
    pub(super) fn sweep(&mut self, now: Instant) {
        let up = self.link == Link::Up;
        let mut unsubscribe: Vec<String> = Vec::new();
        self.channels.retain(|name, ch| match ch.idle_until {
            None => true,
            Some(_) if !up || !ch.sent => false,
            Some(until) if !ch.confirmed || now < until => true,
            Some(_) => {
                unsubscribe.push(name.clone());
                false
            }
        });
        if !unsubscribe.is_empty() {
            self.queue.push(("UNSUBSCRIBE", unsubscribe));
        }
    }
}
