//! The subscriber connection and its reader thread: connecting, sending the queued commands,
//! reading and dispatching pushes, lending the connection to hand-off waiters, reconnecting.

use std::io;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{ConnectionInfo, RedisResult, Value};

use crate::client::repeats::{log_repeat, Repeats};
use crate::client::subscriber::registry::{End, Link, Reader, State};
use crate::client::test_hooks::Event;
use crate::client::tuning;
use crate::client::waiters::{lock, wait_for, wait_while, WaitQueues};
use crate::error::Rounded;
use crate::stats::Counters;

/// Finds the server to subscribe on, at every (re)connection.
pub(crate) type Resolve = Box<dyn Fn() -> RedisResult<ConnectionInfo> + Send + Sync>;

/// While no channel is subscribed: after this long without hearing from the server the reader
/// sends a `PING`. While channels are subscribed the client's timeout is used instead, so that
/// waiters learn of a frozen server about as soon as polling would have told them.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// While channels are subscribed, the reader's read timeout: the longest a queued
/// `SUBSCRIBE`, `UNSUBSCRIBE` or a shutdown waits for a blocked read to return. Messages are
/// not delayed by it (a read returns as soon as one arrives). A waiter whose `SUBSCRIBE` waits
/// behind such a read does not wait for it: it polls until the confirmation wakes it.
///
/// A bound, not a tuning: 5 ms instead made no difference of 5 % in throughput or wait p99
/// with 8 clients contending for one key (`benches/knobs.rs`, docs/benchmarks.md). Read
/// through `tuning::tick`, which a benchmark may override.
pub(super) const TICK: Duration = Duration::from_millis(200);

/// First and longest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The name of the background thread, and of its connection (`CLIENT LIST`).
pub(super) const THREAD_NAME: &str = "dlock-subscriber";

/// What the waiting threads and the reader thread share.
pub(super) struct Shared {
    pub(super) resolve: Resolve,
    pub(super) waiters: Arc<WaitQueues>,
    /// Bounds connecting, the handshake, each command's reply and the wait for a confirmation.
    pub(super) timeout: Duration,
    pub(super) state: Mutex<State>,
    /// Signalled on every confirmation, every change of [`Link`], every queued command and at
    /// shutdown; and, while borrowers ([`Wakeups::await_grant`]) wait on it (another one is
    /// reading the lent connection), when the connection is put back or a grant was delivered.
    ///
    /// [`Wakeups::await_grant`]: super::Wakeups::await_grant
    pub(super) cv: Condvar,
    /// The client's counters (wake-ups, reconnects).
    pub(super) counters: Arc<Counters>,
    /// The client's log lines that repeat while the server is away.
    pub(super) repeats: Arc<Repeats>,
    /// The reader thread waits here while the connection is lent: signalled when it is
    /// wanted back (a command queued, another kind of waiter, shutdown), when it is put back
    /// while wanted back, and when a borrower's read failed. Not on every grant: waking the
    /// reader thread for nothing would cost the thread switch that lending saves.
    pub(super) reader_cv: Condvar,
}

/// The reader thread: connect, subscribe what is waited on, dispatch pushes; reconnect with
/// backoff when the connection is lost. Exits on shutdown, when pub/sub turns out unavailable,
/// or when a connection attempt fails while nobody waits (the next `subscribe` starts a new
/// reader), so a client whose Redis is down does not retry forever in the background.
pub(super) fn run(shared: &Shared) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let end = match connect(shared) {
            Ok(con) => {
                shared.go_up();
                let started = Instant::now();
                let Err(end) = serve(shared, con);
                shared.go_down();
                // A connection that lived a while was healthy: reconnect promptly.
                if started.elapsed() > BACKOFF_MAX {
                    backoff = BACKOFF_MIN;
                }
                end
            }
            Err(end) => end,
        };
        let mut st = lock(&shared.state);
        // A switch needs no pause: the old connection was healthy.
        let mut backoff_now = backoff;
        // Unless pub/sub turns out unavailable (or the client is gone: the thread exits).
        st.link = Link::Backoff;
        match end {
            _ if st.shutdown => {}
            // Not the client gone (above): the master switched.
            End::Requested => {
                log::info!("pub/sub: the master switched; subscribing again on the new one");
                backoff_now = Duration::ZERO;
            }
            End::Unavailable(why) => {
                log::error!("pub/sub: {why}; waiters of this client poll instead");
                st.link = Link::Unavailable;
            }
            End::Lost(why) => log_repeat!(
                shared.repeats,
                "pub/sub: connection lost or refused",
                log::Level::Info,
                "pub/sub: connection lost or refused ({why}); waiters poll meanwhile, retrying in {}",
                Rounded(backoff)
            ),
            End::CannotConnect(why) => log_repeat!(
                shared.repeats,
                "pub/sub: cannot connect",
                log::Level::Warn,
                "pub/sub: cannot connect ({why}); waiters poll until it works, retrying in {}",
                Rounded(backoff)
            ),
        }
        shared.cv.notify_all();
        if st.shutdown || st.link == Link::Unavailable {
            return;
        }
        st = wait_while(&shared.cv, st, backoff_now, |st| !st.shutdown);
        if st.shutdown || st.channels.values().all(|c| c.lines.is_empty()) {
            st.link = Link::Stopped;
            return;
        }
        st.link = Link::Connecting;
        drop(st);
        shared.cv.notify_all();
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

impl Shared {
    /// Wakes the borrowers asleep on the lent connection (another one is reading it), if any,
    /// to look again. Counted under the mutex they sleep with, so none is missed; with none
    /// asleep (the usual case: the borrower that read a grant is its recipient) no system call
    /// is made.
    pub(super) fn nudge(&self) {
        if lock(&self.state).sleeping > 0 {
            self.cv.notify_all();
        }
    }

    /// True if the connection may be lent (to waiters for grants), or stay lent: nothing is to
    /// be sent, and no channel other than hand-off channels is waited on (its messages wake
    /// lines through the reader thread). It stays lent while no borrower reads it, between one
    /// hand-off waiter's grant and its next wait: only grants to this client's waiters can be
    /// waited for then, and each of those waiters reads it again when it next waits.
    pub(super) fn may_keep_lent(st: &State) -> bool {
        st.queue.is_empty()
            && !st.shutdown
            && !st.reconnect
            && st.link == Link::Up
            && st
                .channels
                .values()
                .all(|c| c.lines.is_empty() || c.hand_off)
    }

    /// True if the reader thread wants the lent connection back: it may not stay lent, or the
    /// keepalive is due. A borrower returns it after its current read (at most [`TICK`]).
    pub(super) fn wanted_back(&self, st: &State, reader: &Reader) -> bool {
        !Self::may_keep_lent(st) || reader.heard.elapsed() >= self.timeout
    }

    /// A new connection is ready: bump the generation, queue a `SUBSCRIBE` of every channel
    /// waited on. Nothing if the client is gone meanwhile (the connection ends at once).
    fn go_up(&self) {
        let mut st = lock(&self.state);
        if st.shutdown {
            return;
        }
        // A connection was up before: this one is a reconnect (logged, counted).
        let again = st.generation > 0;
        st.generation += 1;
        st.channels.retain(|_, c| !c.lines.is_empty());
        let names: Vec<String> = st.channels.keys().cloned().collect();
        for c in st.channels.values_mut() {
            c.sent = true;
        }
        if !names.is_empty() {
            st.queue.push(("SUBSCRIBE", names));
        }
        st.link = Link::Up;
        drop(st);
        self.cv.notify_all();
        if again {
            self.counters.reconnect();
            log_repeat!(
                self.repeats,
                "pub/sub: connected again",
                log::Level::Info,
                "pub/sub: connected again; waiters are woken by releases again"
            );
        }
    }

    /// The connection is gone: nothing is confirmed any more, nor read or lent. The waiters are woken: they
    /// make an attempt (which reports the outage, as polling would have) and then poll until
    /// their channel is confirmed again, when they are woken once more.
    fn go_down(&self) {
        let mut st = lock(&self.state);
        (st.link, st.reading, st.lending) = (Link::Connecting, false, false);
        st.queue.clear();
        let mut lines = Vec::new();
        for c in st.channels.values_mut() {
            c.sent = false;
            c.confirmed = false;
            c.rewake = !c.lines.is_empty();
            lines.extend(c.lines.keys().cloned());
        }
        // None at shutdown: a `Subscription` borrows the `Wakeups` whose drop shuts down.
        self.link_event(st, lines);
    }

    /// The link changed (lost, or channels confirmed): the threads waiting on the state look
    /// again, and `lines` are woken as by a release.
    fn link_event(&self, mut st: MutexGuard<'_, State>, lines: Vec<String>) {
        st.link_events += 1;
        drop(st);
        self.cv.notify_all();
        for line in lines {
            self.waiters.notify_release(&line);
        }
    }

    /// A message on a subscribed channel: a grant goes to the one thread that
    /// expects it (if it is one of this client's); anything else (a malformed grant too) is a
    /// release.
    fn dispatch(&self, channel: &str, payload: &[u8]) {
        if let Some((token, grant)) = crate::client::grants::parse(payload) {
            if self.waiters.deliver_grant(&token, grant) {
                self.nudge();
            }
            return;
        }
        let lines: Vec<String> = match lock(&self.state).channels.get(channel) {
            Some(c) => c.lines.keys().cloned().collect(),
            None => return,
        };
        if !lines.is_empty() {
            self.counters.woken();
        }
        for line in lines {
            self.waiters.notify_release(&line);
        }
    }
}

impl Reader {
    fn set_read_timeout(&mut self, d: Duration) -> Result<(), End> {
        if self.read_timeout != d {
            self.con
                .set_read_timeout(Some(d))
                .map_err(|e| End::Lost(format!("socket options: {e}")))?;
            self.read_timeout = d;
        }
        Ok(())
    }

    /// Sends the command `what` with `names` and reads until its replies came back (one per
    /// name, or one to a `PING`: every value but a message is a reply to it, the only command
    /// on the wire), dispatching any message read meanwhile, each within the client's
    /// timeout. A timeout ends the connection: redis-rs then expects a late reply, and the
    /// server may be frozen anyway.
    fn request(&mut self, shared: &Shared, what: &str, names: &[String]) -> Result<(), End> {
        self.set_read_timeout(shared.timeout)?;
        self.con
            .send_packed_command(&redis::cmd(what).arg(names).get_packed_command())
            .map_err(|e| End::Lost(format!("{what}: {e}")))?;
        let mut replies = names.len().max(1);
        while replies > 0 {
            let value = self.con.recv_response().map_err(|e| {
                End::Lost(if e.is_timeout() {
                    format!("no reply to {what} within {:?}", shared.timeout)
                } else {
                    format!("{what}: {e}")
                })
            })?;
            self.heard = Instant::now();
            if let Value::ServerError(e) = &value {
                // Only our SUBSCRIBE, UNSUBSCRIBE or PING can be refused. A server that is
                // loading or busy may accept them later; any other refusal (an ACL, pub/sub
                // not allowed) will not change.
                let (code, detail) = (e.code(), e.details().unwrap_or(""));
                let why = format!("the server refused {what}: {code} {detail}");
                return Err(match code {
                    "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" => {
                        End::Lost(why)
                    }
                    _ => End::Unavailable(why),
                });
            }
            match redis::Msg::from_owned_value(value) {
                Some(msg) => shared.dispatch(msg.get_channel_name(), msg.get_payload_bytes()),
                None => replies -= 1,
            }
        }
        if what != "SUBSCRIBE" {
            return Ok(());
        }
        // The server confirmed `SUBSCRIBE names` on the current connection.
        let mut st = lock(&shared.state);
        let mut lines = Vec::new();
        for name in names {
            if let Some(c) = st.channels.get_mut(name).filter(|c| c.sent) {
                c.confirmed = true;
                shared.waiters.hooks.note(Event::Subscribed);
                if std::mem::take(&mut c.rewake) {
                    lines.extend(c.lines.keys().cloned());
                }
            }
        }
        // Heard again after an outage: a release in between may have been missed.
        shared.link_event(st, lines);
        Ok(())
    }

    /// Reads one push within `left` (at most [`TICK`]) and dispatches it: the reader thread's
    /// read and a borrower's.
    pub(super) fn read_one(&mut self, shared: &Shared, left: Duration) -> Result<(), End> {
        // Whole milliseconds, so that a borrower reading again and again does not set the
        // socket's timeout for every read.
        let ms = left.min(tuning::tick(TICK)).as_millis().max(1) as u64;
        self.set_read_timeout(Duration::from_millis(ms))?;
        // `PubSub::get_message` reads without expecting a reply, so a read timeout leaves the
        // connection as it was (the parser keeps a value it was in the middle of).
        // `recv_response` would count a timed-out read as a reply still owed and skip the next
        // value. ManuallyDrop: dropping a `PubSub` unsubscribes from everything; it holds only
        // the borrow and an empty queue here, so nothing is leaked.
        let mut pubsub = ManuallyDrop::new(self.con.as_pubsub());
        match pubsub.get_message() {
            Ok(msg) => {
                self.heard = Instant::now();
                shared.dispatch(msg.get_channel_name(), msg.get_payload_bytes());
                Ok(())
            }
            // EINTR: a read with a timeout that the process's SIGSTOP / SIGCONT interrupted
            // (Linux does not restart it; signal(7)). Nothing was read, as on a timeout.
            Err(e) if e.is_timeout() || interrupted(&e) => Ok(()),
            Err(e) => Err(End::Lost(e.to_string())),
        }
    }
}

/// True if `e` is a read that a signal interrupted before any byte arrived (`EINTR`).
fn interrupted(e: &redis::RedisError) -> bool {
    // redis-rs keeps the io::Error behind an `Arc<dyn Error>`, which `source()` returns.
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>())
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|io| io.kind() == io::ErrorKind::Interrupted)
}

/// Runs one connection until it ends: sends the queued commands, reads pushes while channels
/// are subscribed (sleeps while none are: nothing can arrive) or lends the connection to
/// hand-off waiters ([`Wakeups::await_grant`]), and checks a silent server with `PING`.
///
/// [`Wakeups::await_grant`]: super::Wakeups::await_grant
fn serve(shared: &Shared, con: redis::Connection) -> Result<std::convert::Infallible, End> {
    let mut reader = Reader {
        con,
        read_timeout: shared.timeout,
        heard: Instant::now(),
    };
    loop {
        let mut st = lock(&shared.state);
        if st.shutdown || std::mem::take(&mut st.reconnect) {
            return Err(End::Requested);
        }
        let now = Instant::now();
        st.sweep(now);
        if st.queue.is_empty() && !st.subscribed() {
            // Sleep until a command is queued, a linger ends, the keepalive is due or the
            // client is dropped.
            let ping_in = KEEPALIVE.saturating_sub(reader.heard.elapsed());
            let lingers = st.channels.values().filter_map(|c| c.idle_until);
            let left = lingers.fold(ping_in, |d, t| d.min(t.saturating_duration_since(now)));
            if !left.is_zero() {
                drop(wait_for(&shared.cv, st, left));
                continue;
            }
        }
        let ops = std::mem::take(&mut st.queue);
        // As it will be once `ops` are sent (their channels are marked, or removed, already).
        let subscribed = st.subscribed();
        drop(st);
        for (what, names) in ops {
            reader.request(shared, what, &names)?;
        }
        let keepalive = if subscribed {
            shared.timeout
        } else {
            KEEPALIVE
        };
        if reader.heard.elapsed() >= keepalive {
            reader.request(shared, "PING", &[])?;
        }
        if !subscribed {
            continue;
        }
        let mut st = lock(&shared.state);
        // Hand-off waiters wait for grants, and the connection may stay lent to them until it
        // is wanted back (`Shared::wanted_back`): checked when woken and every TICK; a borrower
        // returns it after its current read (at most TICK). A borrower's failed read ends the
        // connection (`go_down` clears the flags).
        if tuning::lend() && st.borrowers > 0 && Shared::may_keep_lent(&st) {
            (st.reading, st.lending, st.lent) = (true, true, Some(reader));
            if st.sleeping > 0 {
                shared.cv.notify_all();
            }
            reader = loop {
                if let Some(end) = st.broken.take() {
                    return Err(end);
                }
                let back = matches!(&st.lent, Some(r) if shared.wanted_back(&st, r));
                if let Some(reader) = st.lent.take_if(|_| back) {
                    break reader;
                }
                st = wait_for(&shared.reader_cv, st, tuning::tick(TICK));
            };
            (st.reading, st.lending) = (false, false);
            continue;
        }
        // Waits up to TICK for a push, not at all if a command was queued meanwhile.
        if !st.queue.is_empty() || st.shutdown {
            continue;
        }
        st.reading = true;
        drop(st);
        reader.read_one(shared, Duration::MAX)?;
        lock(&shared.state).reading = false;
    }
}

/// Opens a connection to the server the resolver names, with redis-rs (TLS, AUTH, RESP3 and
/// the database as the connection info says), and names it (`CLIENT SETNAME`, for operators
/// reading `CLIENT LIST`; a refusal is ignored).
fn connect(shared: &Shared) -> Result<redis::Connection, End> {
    let info = (shared.resolve)().map_err(|e| End::Lost(format!("finding the server: {e}")))?;
    if !info.addr().is_supported() {
        return Err(End::Unavailable(format!(
            "the subscriber cannot connect to {}: this build lacks the feature it needs \
             (a `tls-*` cargo feature for TLS)",
            info.addr()
        )));
    }
    let addr = info.addr().to_string();
    // `open` cannot fail for connection info.
    let mut con = redis::Client::open(info)
        .and_then(|client| client.get_connection_with_timeout(shared.timeout))
        .map_err(|e| {
            // Routine (refused, timed out: the server is down or restarting) or worth a
            // warning (TLS handshake, authentication, anything else).
            let e = crate::client::pool::tls_context(e);
            let why = format!("{addr}: {e}");
            if e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped() {
                End::Lost(why)
            } else {
                End::CannotConnect(why)
            }
        })?;
    con.set_read_timeout(Some(shared.timeout))
        .and_then(|()| con.set_write_timeout(Some(shared.timeout)))
        .map_err(|e| End::Lost(format!("socket options: {e}")))?;
    match redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(THREAD_NAME)
        .exec(&mut con)
    {
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
            Err(End::Lost(format!("{addr}: CLIENT SETNAME: {e}")))
        }
        // Refused (an ACL without CLIENT, or renamed away): the name is only a courtesy.
        _ => Ok(con),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{Parser, PushKind};
    use std::io::Read;

    #[test]
    fn an_interrupted_read_is_told_apart() {
        let err = |kind| redis::RedisError::from(io::Error::from(kind));
        assert!(interrupted(&err(io::ErrorKind::Interrupted)));
        assert!(!interrupted(&err(io::ErrorKind::ConnectionReset)));
        assert!(!interrupted(&err(io::ErrorKind::WouldBlock)));
    }

    /// Hands out its chunks one per read, with a timeout error between them.
    struct Stutter {
        chunks: Vec<&'static [u8]>,
        next: usize,
        timed_out: bool,
    }

    impl Read for Stutter {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if !std::mem::replace(&mut self.timed_out, true) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.timed_out = false;
            let Some(chunk) = self.chunks.get(self.next) else {
                return Ok(0);
            };
            self.next += 1;
            buf[..chunk.len()].copy_from_slice(chunk);
            Ok(chunk.len())
        }
    }

    /// The keepalive relies on this: a read timeout in the middle of a push loses nothing.
    #[test]
    fn parser_resumes_after_a_timeout_mid_value() {
        let mut r = Stutter {
            chunks: vec![
                b"*3\r\n$7\r\nmes",
                b"sage\r\n$2\r\nch\r\n",
                b"$1\r\n0\r\n*2\r\n$4\r\npong\r\n$0\r\n\r\n",
            ],
            next: 0,
            timed_out: false,
        };
        let mut parser = Parser::new();
        let mut values = Vec::new();
        let mut timeouts = 0;
        loop {
            match parser.parse_value(&mut r) {
                Ok(v) => values.push(v),
                Err(e) if e.is_timeout() => timeouts += 1,
                Err(_) => break,
            }
        }
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert!(timeouts >= 3, "{timeouts}");
        assert_eq!(
            values,
            vec![
                Value::Array(vec![bulk("message"), bulk("ch"), bulk("0")]),
                Value::Array(vec![bulk("pong"), bulk("")]),
            ]
        );
    }

    /// The values the reader reads, in RESP2 (arrays) and RESP3 (pushes): a message is
    /// dispatched, anything else counts as a reply to the command on the wire.
    #[test]
    fn reads_resp2_and_resp3_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        for reply in [
            Value::Array(vec![bulk("subscribe"), bulk("ch"), Value::Int(2)]),
            Value::Push {
                kind: PushKind::Subscribe,
                data: vec![bulk("ch"), Value::Int(2)],
            },
            Value::Array(vec![bulk("unsubscribe"), bulk("ch"), Value::Int(0)]),
            Value::Array(vec![bulk("pong"), bulk("")]),
            Value::SimpleString("PONG".into()),
        ] {
            assert!(redis::Msg::from_value(&reply).is_none(), "{reply:?}");
        }
        for message in [
            Value::Array(vec![bulk("message"), bulk("ch"), bulk("0")]),
            Value::Push {
                kind: PushKind::Message,
                data: vec![bulk("ch"), bulk("0")],
            },
        ] {
            let msg = redis::Msg::from_value(&message).expect("a message");
            assert_eq!(
                (msg.get_channel_name(), msg.get_payload_bytes()),
                ("ch", &b"0"[..])
            );
        }
        // `request` sends a PING as the command with no names: a bare PING.
        let ping = redis::cmd("PING")
            .arg(&[] as &[String])
            .get_packed_command();
        assert_eq!(ping, redis::cmd("PING").get_packed_command());
    }
}
