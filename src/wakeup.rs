//! Waiters woken by pub/sub: ONE subscriber connection per [`LockClient`](crate::LockClient),
//! read by one background thread ("dlock-subscriber") that wakes the threads waiting for a lock
//! when its release is published.
//!
//! How it works:
//! - A waiting thread calls [`Wakeups::subscribe`] with the lock's channel and its line name.
//!   If the channel is not yet subscribed on the current connection, the thread writes
//!   `SUBSCRIBE` itself (a blocked reader cannot be asked to) and waits until the reader sees
//!   the server's confirmation. Threads waiting on the same channel share one subscription.
//! - The reader parses the pushes: a `message` wakes every line of its channel
//!   ([`WaitQueues::notify_release`]); a `subscribe` confirms the channel for the current
//!   connection.
//! - A channel nobody waits on stays subscribed for [`LINGER`] (steady contention then costs
//!   no re-subscription) and is unsubscribed lazily, by a later `subscribe`, drop or keepalive.
//! - A lost connection (an error, EOF, or no answer to a `PING` within the client's timeout)
//!   makes every subscription unconfirmed and wakes the waiters: they make an attempt, which
//!   reports an outage as polling would have, and then poll. The reader reconnects with
//!   backoff, re-subscribes, and wakes them again when the server confirms, since a release
//!   may have gone unheard in between.
//! - Waits never depend on this thread for correctness: each is bounded by the holder's
//!   remaining lifetime and the caller's deadline.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, Parser, RedisResult, Value};

use crate::waiters::WaitQueues;

/// Finds the server to subscribe on, at every (re)connection.
pub(crate) type Resolve = Box<dyn Fn() -> RedisResult<ConnectionInfo> + Send + Sync>;

/// How long a channel nobody waits on stays subscribed.
const LINGER: Duration = Duration::from_millis(1500);
/// While no channel is subscribed: after this long without a byte from the server the reader
/// sends a `PING`, and a second such silence means the peer is gone. While channels are
/// subscribed the client's timeout is used instead, so that waiters learn of a frozen server
/// about as soon as polling would have told them.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// First and longest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The name of the background thread, and of its connection (`CLIENT LIST`).
const THREAD_NAME: &str = "dlock-subscriber";

/// The subscriber of one client.
pub(crate) struct Wakeups {
    /// `None` when the client has no address to subscribe on: its waiters poll.
    shared: Option<Arc<Shared>>,
}

/// What the waiting threads and the reader thread share.
struct Shared {
    resolve: Resolve,
    waiters: Arc<WaitQueues>,
    /// Bounds connecting, the handshake, writes and the wait for a confirmation.
    timeout: Duration,
    state: Mutex<State>,
    /// Signalled on every confirmation and every change of [`Link`].
    cv: Condvar,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// Bumped at every connection: a confirmation counts only for the connection it came on.
    generation: u64,
    link: Link,
    /// A reader thread is running (it clears this, under the lock, as it exits).
    thread: bool,
    /// The client is gone: the reader exits.
    shutdown: bool,
}

/// The subscriber connection's state.
#[derive(Default)]
enum Link {
    /// No reader thread.
    #[default]
    Stopped,
    /// The reader is connecting.
    Connecting,
    /// Connected; the write half, for `SUBSCRIBE`/`UNSUBSCRIBE` by the waiting threads.
    Up(Stream),
    /// The last connection attempt failed; the reader retries after a pause.
    Backoff,
    /// Pub/sub cannot be used (TLS, or the server refuses `SUBSCRIBE`): waiters poll.
    Unavailable,
}

#[derive(Debug, Default)]
struct Channel {
    /// Lines woken by a message, with how many subscriptions named each.
    lines: Vec<(String, usize)>,
    /// Live subscriptions.
    users: usize,
    /// `SUBSCRIBE` was written on this connection generation.
    sent: Option<u64>,
    /// The server confirmed the subscription on this generation.
    confirmed: Option<u64>,
    /// Since when nobody has waited on the channel.
    idle_since: Option<Instant>,
    /// The connection was lost while threads waited: wake them once confirmed again.
    rewake: bool,
}

/// Mutex poisoning only means a thread panicked while holding it; the state is still
/// consistent (every change is a few field updates), so carry on rather than panic too.
fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
    ) -> Self {
        Wakeups {
            shared: resolve.map(|resolve| {
                Arc::new(Shared {
                    resolve,
                    waiters,
                    timeout,
                    state: Mutex::new(State::default()),
                    cv: Condvar::new(),
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
        deadline: Option<Instant>,
    ) -> Option<Subscription<'_>> {
        let shared = self.shared.as_ref()?;
        let now = Instant::now();
        let longest = crate::time::saturating_add(now, shared.timeout);
        let until = deadline.map_or(longest, |d| d.min(longest));
        let mut st = lock(&shared.state);
        if st.shutdown || matches!(st.link, Link::Unavailable) {
            return None;
        }
        if !st.thread {
            if let Err(e) = start_thread(shared) {
                log::warn!("pub/sub: cannot start the subscriber thread ({e}); waiters poll");
                return None;
            }
            st.thread = true;
            st.link = Link::Connecting;
        }
        let generation = st.generation;
        let ch = st.channels.entry(channel.to_owned()).or_default();
        ch.users += 1;
        ch.idle_since = None;
        match ch.lines.iter_mut().find(|(name, _)| name == line) {
            Some((_, n)) => *n += 1,
            None => ch.lines.push((line.to_owned(), 1)),
        }
        let must_send = ch.sent != Some(generation);
        // After counting this user, so that a lingering `channel` is kept, not re-subscribed.
        st.sweep(now);
        if must_send {
            if let Link::Up(writer) = &mut st.link {
                let cmd = redis::cmd("SUBSCRIBE").arg(channel).get_packed_command();
                match writer.write_all(&cmd) {
                    Ok(()) => {
                        if let Some(ch) = st.channels.get_mut(channel) {
                            ch.sent = Some(generation);
                        }
                    }
                    // The reader sees the broken socket too, reconnects and re-subscribes.
                    Err(e) => {
                        log::info!("pub/sub: SUBSCRIBE {channel:?} failed ({e}), reconnecting");
                        writer.shutdown();
                    }
                }
            }
        }
        let subscription = Subscription {
            wakeups: self,
            channel: channel.to_owned(),
            line: line.to_owned(),
        };
        loop {
            if st.is_confirmed(channel) {
                break;
            }
            // Connecting (or waiting for the reply) is worth waiting for; a reader that
            // failed to connect is not (it pauses before retrying): poll meanwhile.
            if st.shutdown || matches!(st.link, Link::Backoff | Link::Unavailable) {
                break;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::debug!("pub/sub: {channel:?} not confirmed in time; polling meanwhile");
                break;
            }
            st = shared
                .cv
                .wait_timeout(st, left)
                .map(|(st, _)| st)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        if !st.is_confirmed(channel) {
            // The waiter polls meanwhile: wake it once the channel is confirmed, since a
            // release published before that went unheard.
            if let Some(ch) = st.channels.get_mut(channel) {
                ch.rewake = true;
            }
        }
        drop(st);
        Some(subscription)
    }

    /// True if this client's subscriber connection is subscribed (or subscribing) to
    /// `channel` on the current connection: a message published there reaches this client too,
    /// so a `PUBLISH` reply counts it among the receivers.
    pub(crate) fn hears(&self, channel: &str) -> bool {
        let Some(shared) = &self.shared else {
            return false;
        };
        let st = lock(&shared.state);
        let current = Some(st.generation);
        st.channels
            .get(channel)
            .is_some_and(|c| c.sent == current || c.confirmed == current)
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
    /// Tells the reader to exit and unblocks it by shutting its socket; never joins it (it may
    /// be connecting, bounded by the timeout).
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            let mut st = lock(&shared.state);
            st.shutdown = true;
            if let Link::Up(writer) = &st.link {
                writer.shutdown();
            }
            drop(st);
            shared.cv.notify_all();
        }
    }
}

/// A thread's interest in a channel; unsubscribes (after a linger) when the last one drops.
#[derive(Debug)]
pub(crate) struct Subscription<'a> {
    wakeups: &'a Wakeups,
    channel: String,
    line: String,
}

impl Subscription<'_> {
    /// True while the server has confirmed the subscription on the current connection: a
    /// release will be heard. False after the connection dropped, until it is re-established.
    pub(crate) fn is_confirmed(&self) -> bool {
        self.wakeups
            .shared
            .as_ref()
            .is_some_and(|s| lock(&s.state).is_confirmed(&self.channel))
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let Some(shared) = &self.wakeups.shared else {
            return;
        };
        let mut st = lock(&shared.state);
        if let Some(ch) = st.channels.get_mut(&self.channel) {
            ch.users = ch.users.saturating_sub(1);
            if let Some(i) = ch.lines.iter().position(|(l, _)| *l == self.line) {
                ch.lines[i].1 -= 1;
                if ch.lines[i].1 == 0 {
                    ch.lines.swap_remove(i);
                }
            }
            if ch.users == 0 {
                ch.idle_since = Some(Instant::now());
            }
        }
        st.sweep(Instant::now());
    }
}

impl State {
    fn is_confirmed(&self, channel: &str) -> bool {
        matches!(self.link, Link::Up(_))
            && self
                .channels
                .get(channel)
                .is_some_and(|c| c.confirmed == Some(self.generation))
    }

    /// Forgets the channels nobody waits on: at once if they are not subscribed on this
    /// connection, after the linger (with `UNSUBSCRIBE`) if they are. A channel whose
    /// `SUBSCRIBE` is not confirmed yet stays: its late confirmation would otherwise be taken
    /// for that of a new `SUBSCRIBE` sent after the `UNSUBSCRIBE`.
    fn sweep(&mut self, now: Instant) {
        let generation = self.generation;
        let up = matches!(self.link, Link::Up(_));
        let mut unsubscribe: Vec<String> = Vec::new();
        self.channels.retain(|name, ch| {
            let Some(idle) = ch.idle_since.filter(|_| ch.users == 0) else {
                return true;
            };
            if !up || ch.sent != Some(generation) {
                return false;
            }
            if ch.confirmed != Some(generation) || now.saturating_duration_since(idle) < LINGER {
                return true;
            }
            unsubscribe.push(name.clone());
            false
        });
        if unsubscribe.is_empty() {
            return;
        }
        if let Link::Up(writer) = &mut self.link {
            let cmd = redis::cmd("UNSUBSCRIBE")
                .arg(&unsubscribe)
                .get_packed_command();
            // A failed write leaves nothing to undo: the reader reconnects and subscribes only
            // the channels still waited on.
            if let Err(e) = writer.write_all(&cmd) {
                log::info!("pub/sub: UNSUBSCRIBE failed ({e}), reconnecting");
                writer.shutdown();
            }
        }
    }
}

fn start_thread(shared: &Arc<Shared>) -> io::Result<()> {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || run(&shared))
        .map(|_| ())
}

/// Why a connection ended.
enum End {
    /// I/O error, EOF, or a silent peer: reconnect.
    Lost(String),
    /// Pub/sub cannot work with this server: stop.
    Unavailable(String),
    /// The client is gone.
    Shutdown,
}

/// The reader thread: connect, subscribe what is waited on, dispatch pushes; reconnect with
/// backoff when the connection is lost. Exits on shutdown, when pub/sub turns out unavailable,
/// or when a connection attempt fails while nobody waits (the next `subscribe` starts a new
/// reader), so a client whose Redis is down does not retry forever in the background.
fn run(shared: &Shared) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let end = match connect(shared) {
            Ok((reader, writer, parser)) => match shared.go_up(writer) {
                true => {
                    let started = Instant::now();
                    let end = read_loop(shared, reader, parser);
                    shared.go_down();
                    // A connection that lived a while was healthy: reconnect promptly.
                    if started.elapsed() > BACKOFF_MAX {
                        backoff = BACKOFF_MIN;
                    }
                    end
                }
                false => End::Shutdown,
            },
            Err(end) => end,
        };
        let mut st = lock(&shared.state);
        match end {
            End::Shutdown => {}
            _ if st.shutdown => {}
            End::Unavailable(why) => {
                log::error!("pub/sub: {why}; waiters of this client poll instead");
                st.link = Link::Unavailable;
                st.channels.clear();
            }
            End::Lost(why) => {
                log::info!("pub/sub: connection lost or refused ({why}); retrying in {backoff:?}");
                st.link = Link::Backoff;
            }
        }
        shared.cv.notify_all();
        if st.shutdown || matches!(st.link, Link::Unavailable) {
            st.thread = false;
            return;
        }
        let until = crate::time::after(backoff);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if st.shutdown || left.is_zero() {
                break;
            }
            st = shared
                .cv
                .wait_timeout(st, left)
                .map(|(st, _)| st)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        if st.shutdown || st.channels.values().all(|c| c.users == 0) {
            st.channels.clear();
            st.link = Link::Stopped;
            st.thread = false;
            return;
        }
        st.link = Link::Connecting;
        drop(st);
        shared.cv.notify_all();
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

impl Shared {
    /// A new connection is ready: bump the generation, subscribe every channel waited on.
    /// False if the client is gone meanwhile.
    fn go_up(&self, mut writer: Stream) -> bool {
        let mut st = lock(&self.state);
        if st.shutdown {
            writer.shutdown();
            return false;
        }
        st.generation += 1;
        let generation = st.generation;
        st.channels.retain(|_, c| c.users > 0);
        let names: Vec<&String> = st.channels.keys().collect();
        if !names.is_empty() {
            let cmd = redis::cmd("SUBSCRIBE").arg(&names).get_packed_command();
            if let Err(e) = writer.write_all(&cmd) {
                // The reader fails next and reconnects.
                log::info!("pub/sub: re-SUBSCRIBE failed ({e})");
                writer.shutdown();
            }
            for c in st.channels.values_mut() {
                c.sent = Some(generation);
            }
        }
        st.link = Link::Up(writer);
        drop(st);
        self.cv.notify_all();
        true
    }

    /// The connection is gone: nothing is confirmed any more. The waiters are woken: they
    /// make an attempt (which reports the outage, as polling would have) and then poll until
    /// their channel is confirmed again, when they are woken once more.
    fn go_down(&self) {
        let mut st = lock(&self.state);
        if let Link::Up(writer) = &st.link {
            writer.shutdown();
        }
        st.link = Link::Connecting;
        let mut lines = Vec::new();
        for c in st.channels.values_mut() {
            c.sent = None;
            c.confirmed = None;
            c.rewake = c.users > 0;
            if c.users > 0 {
                lines.extend(c.lines.iter().map(|(l, _)| l.clone()));
            }
        }
        let shutdown = st.shutdown;
        drop(st);
        self.cv.notify_all();
        if !shutdown {
            for line in lines {
                self.waiters.notify_release(&line);
            }
        }
    }

    /// Handles one push from the server.
    fn dispatch(&self, value: Value) -> Result<(), End> {
        let items = match value {
            Value::Array(items) | Value::Push { data: items, .. } => items,
            Value::ServerError(e) => {
                // Only our SUBSCRIBE, UNSUBSCRIBE or PING can be refused. A server that is
                // loading or busy may accept them later; any other refusal (an ACL, pub/sub
                // not allowed) will not change.
                let why = format!(
                    "the server refused: {} {}",
                    e.code(),
                    e.details().unwrap_or("")
                );
                return Err(match e.code() {
                    "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" => {
                        End::Lost(why)
                    }
                    _ => End::Unavailable(why),
                });
            }
            _ => return Ok(()),
        };
        let (Some(kind), Some(channel)) =
            (items.first().and_then(text), items.get(1).and_then(text))
        else {
            return Ok(());
        };
        match kind {
            "message" => {
                let st = lock(&self.state);
                let lines: Vec<String> = match st.channels.get(channel) {
                    Some(c) => c.lines.iter().map(|(l, _)| l.clone()).collect(),
                    None => return Ok(()),
                };
                drop(st);
                for line in lines {
                    self.waiters.notify_release(&line);
                }
            }
            "subscribe" => {
                let mut st = lock(&self.state);
                let generation = st.generation;
                let mut lines = Vec::new();
                if let Some(c) = st.channels.get_mut(channel) {
                    if c.sent == Some(generation) {
                        c.confirmed = Some(generation);
                        if std::mem::take(&mut c.rewake) {
                            lines = c.lines.iter().map(|(l, _)| l.clone()).collect();
                        }
                    }
                }
                drop(st);
                self.cv.notify_all();
                // Heard again after an outage: a release in between may have been missed.
                for line in lines {
                    self.waiters.notify_release(&line);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A push element as text (channel names and kinds are bulk strings in RESP2).
fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Reads pushes until the connection ends. A read that times out (no byte for the
/// keepalive: the client's timeout while channels are subscribed, [`KEEPALIVE`] otherwise)
/// sends a `PING`; a second one in a row ends the connection. The parser keeps a value it
/// was in the middle of across a timeout, so resuming is safe.
fn read_loop(shared: &Shared, mut reader: Stream, mut parser: Parser) -> End {
    let mut pinged = false;
    let mut keepalive = Duration::ZERO;
    loop {
        // An idle reader blocked with the long keepalive is woken by the reply to the next
        // SUBSCRIBE, and shortens it then.
        let wanted = if lock(&shared.state).channels.is_empty() {
            KEEPALIVE
        } else {
            shared.timeout
        };
        if wanted != keepalive {
            if let Err(e) = reader.set_read_timeout(wanted) {
                return End::Lost(format!("socket options: {e}"));
            }
            keepalive = wanted;
        }
        match parser.parse_value(&mut reader) {
            Ok(value) => {
                pinged = false;
                if let Err(end) = shared.dispatch(value) {
                    return end;
                }
            }
            Err(e) if e.is_timeout() && !pinged => {
                let mut st = lock(&shared.state);
                if st.shutdown {
                    return End::Shutdown;
                }
                st.sweep(Instant::now());
                let ping = redis::cmd("PING").get_packed_command();
                let sent = match &mut st.link {
                    Link::Up(writer) => writer.write_all(&ping),
                    _ => Err(io::ErrorKind::NotConnected.into()),
                };
                if let Err(e) = sent {
                    return End::Lost(format!("PING: {e}"));
                }
                pinged = true;
            }
            Err(e) => {
                if lock(&shared.state).shutdown {
                    return End::Shutdown;
                }
                return End::Lost(if e.is_timeout() {
                    format!("no answer to PING in {keepalive:?}")
                } else {
                    e.to_string()
                });
            }
        }
    }
}

/// Opens the connection the resolver names and authenticates it: the read half (with its
/// parser) for the reader, the write half for the subscribing threads.
fn connect(shared: &Shared) -> Result<(Stream, Stream, Parser), End> {
    let lost = |what: &str, e: &dyn std::fmt::Display| End::Lost(format!("{what}: {e}"));
    let info = (shared.resolve)().map_err(|e| lost("finding the server", &e))?;
    let timeout = shared.timeout;
    let mut stream = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Stream::Tcp(connect_tcp(host, *port, timeout)?),
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => Stream::Unix(
            UnixStream::connect(path).map_err(|e| lost(&path.display().to_string(), &e))?,
        ),
        other => {
            return Err(End::Unavailable(format!(
                "the subscriber connection cannot use {other} (TLS is not supported for it)"
            )))
        }
    };
    stream
        .set_timeouts(timeout)
        .map_err(|e| lost("socket options", &e))?;
    let mut parser = Parser::new();
    handshake(&mut stream, &mut parser, &info).map_err(|e| lost("handshake", &e))?;
    let writer = stream.try_clone().map_err(|e| lost("socket clone", &e))?;
    Ok((stream, writer, parser))
}

fn connect_tcp(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, End> {
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| End::Lost(format!("{host}:{port}: {e}")))?;
    let mut last = format!("{host}:{port}: no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                // Small writes (SUBSCRIBE) must go out at once.
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(End::Lost(last))
}

/// `AUTH` when the URL has a password, and `CLIENT SETNAME` (for operators reading
/// `CLIENT LIST`; a refusal is ignored). The database does not matter to pub/sub.
fn handshake(stream: &mut Stream, parser: &mut Parser, info: &ConnectionInfo) -> RedisResult<()> {
    let settings = info.redis_settings();
    let mut out = Vec::new();
    let auth = settings.password().is_some();
    if let Some(password) = settings.password() {
        let mut cmd = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            cmd.arg(user);
        }
        out.extend(cmd.arg(password).get_packed_command());
    }
    out.extend(
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(THREAD_NAME)
            .get_packed_command(),
    );
    stream.write_all(&out)?;
    if auth {
        if let Value::ServerError(e) = parser.parse_value(&mut *stream)? {
            return Err(redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "AUTH refused",
                format!("{e:?}"),
            )));
        }
    }
    parser.parse_value(&mut *stream)?;
    Ok(())
}

/// The subscriber's socket.
#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            #[cfg(unix)]
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn set_timeouts(&self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(d)?;
        match self {
            Stream::Tcp(s) => s.set_write_timeout(Some(d)),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_write_timeout(Some(d)),
        }
    }

    fn set_read_timeout(&self, d: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(d)),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_read_timeout(Some(d)),
        }
    }

    /// Shuts both directions: a reader blocked on the socket returns at once.
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            #[cfg(unix)]
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn without_resolver_nothing_subscribes() {
        let w = Wakeups::new(
            None,
            Arc::new(WaitQueues::default()),
            Duration::from_secs(1),
        );
        assert!(w.subscribe("ch", "line", None).is_none());
        assert_eq!(w.subscribed_channels(), 0);
    }

    #[test]
    fn tls_makes_pubsub_unavailable() {
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
        );
        // The first call waits while the reader finds out; later ones return None at once.
        let first = w.subscribe("ch", "line", None);
        assert!(first.as_ref().is_none_or(|s| !s.is_confirmed()));
        drop(first);
        assert!(w.subscribe("ch", "line", None).is_none());
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
        );
        let start = Instant::now();
        let s = w.subscribe("ch", "line", None).expect("pub/sub configured");
        assert!(!s.is_confirmed());
        // Refused at once: no wait for the (5 s) timeout.
        assert!(start.elapsed() < Duration::from_secs(4));
        drop(s);
        assert_eq!(w.subscribed_channels(), 0);
    }
}
