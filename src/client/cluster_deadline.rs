//! One deadline for a whole Redis Cluster command, its redirections and retries included.
//!
//! redis-rs's blocking cluster connection retries a command by itself: after `MOVED` and `ASK`
//! (at once), after `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN` or `LOADING` (after a sleep), and
//! after an I/O error or a timeout (at once, on the same node). Each try has the whole read
//! timeout, so with its defaults (16 retries, sleeps from 1.28 s up to 655 s) one command
//! during a slot migration or a failover could take minutes, whatever command timeout the user
//! set.
//!
//! Here every node connection of a cluster connection is a [`Deadlined`]: before each send it
//! looks at the deadline the calling thread set for the current command ([`with_deadline`]),
//! sets its socket timeouts to the time left, and fails at once (an I/O timeout) when none is
//! left, also for the connections redis-rs opens during the command (`MOVED` to a new node,
//! slot-map refresh), whose connect timeout is cut to half the time left (redis-rs's set-up
//! waits for up to two replies there, each with the whole connect timeout). The retry sleeps are
//! configured in `client.rs` to stay short, so a command returns at most one retry sleep after
//! its deadline.
//!
//! A [`Deadlined`] also connects only when first used, so that one unreachable node costs only
//! the commands for its own slots. redis-rs opens a connection to every node of the slot map
//! whenever it builds a cluster connection or refreshes its slot map, one node after the other,
//! and waited on each for its connect timeout (twice over, see [`Deadlined::connect`]): with
//! one primary cut off, every new pooled connection cost the thread that opened it two connect
//! timeouts, whatever key it served. Here a cluster connection is built with one round trip to
//! one seed (`CLUSTER SLOTS`), each node connection opened by the first command for that node,
//! within that command's deadline. A node connection that fails (an I/O error, a timeout: a
//! late reply may still come) drops its socket and opens a new one at its next use, so no
//! failure of one node leaves a stale socket among the others.
//!
//! A hold's write on a client that requires replicas to confirm it (see
//! [`confirm`](crate::client::confirm)) runs within [`with_confirm`]: each command a node
//! connection sends for it is followed by `WAIT <n> <timeout>` on that same node connection, in
//! the same round trip, so the `WAIT` goes to the very primary that ran the write, after a
//! `MOVED` or `ASK` redirection too. Its reply is taken off before redis-rs reads the replies,
//! and noted for the caller; the read timeout and the command's deadline grow by `WAIT`'s
//! bound when a `WAIT` is sent (not past a watchdog renewal's cap). Under [`ReplicaAcks::Auto`](crate::ReplicaAcks::Auto) each new socket asks
//! its node `INFO replication` before its first confirmed write, and `n` is what the client
//! learnt of that primary ([`Acks::learn_node`]).
//!
//! A watchdog renewal brings its own, earlier, deadline: the earliest loss deadline of the holds
//! it carries (see [`watchdog`](crate::client::watchdog)). [`with_deadline`] takes the earlier
//! of the two, and [`left_until`] / [`within`] cut the timeouts of a single server's
//! connection, of a new connection and of a pool checkout to that deadline the same way.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::confirm::{Acks, NodeRole};
use super::pool::left_until;

use redis::{
    Cmd, ConnectionInfo, ConnectionLike, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    Value,
};

thread_local! {
    /// The deadline of the cluster command the calling thread is running, if any.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The cap of that command (a watchdog renewal's), and whether its deadline has grown by
    /// a replica confirmation's bound (see [`extend_deadline`]).
    static CAP: Cell<(Option<Instant>, bool)> = const { Cell::new((None, false)) };
    /// The replica confirmation the calling thread's cluster commands ask for, if any.
    static CONFIRM: RefCell<Option<Confirming>> = const { RefCell::new(None) };
}

/// A replica confirmation under way on the calling thread (see [`with_confirm`]).
struct Confirming {
    acks: Arc<Acks>,
    /// The worst shortfall seen: `(confirmed, required)`.
    short: Option<(u32, u32)>,
}

/// Runs `f` (commands on a cluster connection) with each command a node connection sends for
/// it followed by a `WAIT` on that node, when the node's primary needs replicas to confirm its
/// writes. Returns `f`'s result and the worst shortfall, `(confirmed, required)`, if some write
/// was confirmed by fewer replicas than required.
pub(crate) fn with_confirm<T>(acks: &Arc<Acks>, f: impl FnOnce() -> T) -> (T, Option<(u32, u32)>) {
    let before = CONFIRM.with(|c| {
        c.replace(Some(Confirming {
            acks: Arc::clone(acks),
            short: None,
        }))
    });
    let out = f();
    let done = CONFIRM.with(|c| c.replace(before));
    (out, done.and_then(|c| c.short))
}

/// The confirmation settings of the calling thread, if it asks for one.
fn confirming() -> Option<Arc<Acks>> {
    CONFIRM.with(|c| c.borrow().as_ref().map(|c| Arc::clone(&c.acks)))
}

/// Notes a `WAIT` reply for `required` replicas on the calling thread (an error counts as
/// none).
fn note_confirmed(reply: &Value, required: u32) {
    let confirmed = match reply {
        Value::Int(n) => u32::try_from((*n).max(0)).unwrap_or(u32::MAX),
        _ => 0,
    };
    if confirmed >= required {
        return;
    }
    CONFIRM.with(|c| {
        if let Some(c) = c.borrow_mut().as_mut() {
            if c.short.is_none_or(|(least, _)| confirmed < least) {
                c.short = Some((confirmed, required));
            }
        }
    });
}

/// Commands that are not a hold's write: redis-rs's own (`ASKING` before a redirected command,
/// the slot map's `CLUSTER SLOTS`, the greeting) and the confirmation's. A `WAIT` after
/// `ASKING` would spend its one-command permission.
fn needs_no_confirmation(cmd: &[u8]) -> bool {
    // `*<n>\r\n$<len>\r\n<name>\r\n`
    let name = cmd
        .split(|&b| b == b'\n')
        .nth(2)
        .map(|n| n.strip_suffix(b"\r").unwrap_or(n));
    name.is_none_or(|n| {
        [
            &b"ASKING"[..],
            b"CLUSTER",
            b"READONLY",
            b"READWRITE",
            b"PING",
            b"INFO",
            b"ROLE",
            b"WAIT",
        ]
        .iter()
        .any(|c| n.eq_ignore_ascii_case(c))
    })
}

/// A reply that says the command did not run where it was sent (a redirection, a retry asked
/// for, a replica, a missing script): the `WAIT` after it confirms nothing of this write.
fn did_not_run(reply: &Value) -> bool {
    use redis::ServerErrorKind as K;
    matches!(reply, Value::ServerError(e) if matches!(
        e.kind(),
        Some(
            K::Moved
                | K::Ask
                | K::TryAgain
                | K::ClusterDown
                | K::MasterDown
                | K::BusyLoading
                | K::ReadOnly
                | K::NoScript
                | K::CrossSlot
        )
    ))
}

/// Runs `f` (one command on a cluster connection) with every send, connect and read of it,
/// retries included, bounded by `timeout` from now (`None`: no deadline), and by `until` if
/// given (a watchdog renewal's cap: the earliest loss deadline of the holds it carries).
pub(crate) fn with_deadline<T>(
    timeout: Option<Duration>,
    until: Option<Instant>,
    f: impl FnOnce() -> T,
) -> T {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let deadline = match (deadline, until) {
        (Some(d), Some(u)) => Some(d.min(u)),
        (d, u) => d.or(u),
    };
    let before = DEADLINE.with(|d| d.replace(deadline));
    let cap = CAP.with(|c| c.replace((until, false)));
    let out = f();
    DEADLINE.with(|d| d.set(before));
    CAP.with(|c| c.set(cap));
    out
}

/// A node connection is about to send a `WAIT` for the calling thread's command: its deadline
/// grows by `extra` (`WAIT`'s bound), once per command and never past its cap.
fn extend_deadline(extra: Duration) {
    let (until, extended) = CAP.with(Cell::get);
    if extended {
        return;
    }
    CAP.with(|c| c.set((until, true)));
    DEADLINE.with(|d| {
        if let Some(deadline) = d.get() {
            let longer = deadline.checked_add(extra).unwrap_or(deadline);
            d.set(Some(until.map_or(longer, |u| longer.min(u))));
        }
    });
}

/// The time left before the current deadline: `Ok(None)` without one, an I/O timeout error when
/// it has passed.
fn time_left() -> RedisResult<Option<Duration>> {
    left_until(DEADLINE.with(Cell::get))
}

/// Nodes (`host:port`) whose socket failed (an I/O error, a timeout) and that have not answered
/// on a new one since, in the whole process: a cluster connection being built asks them for the
/// slot map last (see `Manager::cluster` in `pool.rs`). Touched only when a socket fails or a
/// new one first answers, never on the path of a command that succeeds on an open socket.
static SUSPECTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn suspects() -> std::sync::MutexGuard<'static, Vec<String>> {
    SUSPECTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// True if the node at `addr` (`host:port`) failed and has not answered since.
pub(crate) fn is_suspect(addr: &str) -> bool {
    suspects().iter().any(|a| a == addr)
}

/// True when the calling thread's deadline has passed.
pub(crate) fn time_is_up() -> bool {
    time_left().is_err()
}

/// [`SETUP_REPLIES`] for a node connection, which sends no `CLIENT SETINFO`: `HELLO` or `AUTH`,
/// and `SELECT`.
const NODE_SETUP_REPLIES: u32 = 2;

/// A node connection of a cluster connection that keeps to the calling thread's deadline, opened
/// by its first command (see the module's documentation).
pub(crate) struct Deadlined {
    /// How to reach the node (without `CLIENT SETINFO`, see [`Deadlined::connect`]).
    info: ConnectionInfo,
    /// redis-rs's connect timeout (the client's), cut to the time left when a deadline is set.
    connect_timeout: Option<Duration>,
    /// The socket: `None` until the first command, and again after an I/O error or a timeout.
    con: Option<redis::Connection>,
    /// The socket is new and has not answered yet (see [`SUSPECTS`]).
    fresh: bool,
    /// Set by [`connect`](redis::cluster::Connect::connect), cleared by the next call: redis-rs
    /// greets every node connection it makes with a `PING` (a `READONLY` with read routing),
    /// which this connection answers itself while it has no socket (see [`Deadlined::greet`]).
    greeting: bool,
    /// The timeouts set by the cluster connection (the user's command timeout), put back on the
    /// socket for commands run without a deadline.
    read: Cell<Option<Duration>>,
    write: Cell<Option<Duration>>,
    /// The timeout currently on the socket (read and write alike while a deadline is armed).
    armed: Option<Duration>,
    /// Replicas that must confirm each write on this socket, once learnt (see
    /// [`Deadlined::required`]); forgotten with the socket.
    required: Option<u32>,
}

/// Timeouts closer than this to the one already set are not set again (one system call each).
const SLACK: Duration = Duration::from_millis(1);

/// The greeting redis-rs sends on each node connection it makes (`cmd("PING")`, packed).
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// An error after which a socket is not used again: an I/O failure or a timeout (the reply may
/// still come, and would answer the next command), or a reply that could not be parsed.
fn loses_socket(e: &RedisError) -> bool {
    e.is_io_error() || e.kind() == ErrorKind::Parse
}

impl Deadlined {
    /// The socket, opened first if needed, with its timeouts cut to the time left; fails when
    /// none is left.
    fn ready(&mut self) -> RedisResult<&mut redis::Connection> {
        self.greeting = false;
        let left = time_left()?;
        if self.con.is_none() {
            let timeout = match (left, self.connect_timeout) {
                (Some(left), Some(t)) => Some(t.min(left / NODE_SETUP_REPLIES)),
                (Some(left), None) => Some(left / NODE_SETUP_REPLIES),
                (None, t) => t,
            };
            let con = <redis::Connection as redis::cluster::Connect>::connect(
                self.info.clone(),
                timeout,
            )?;
            con.set_read_timeout(self.read.get())?;
            con.set_write_timeout(self.write.get())?;
            self.armed = None;
            self.con = Some(con);
            self.fresh = true;
            self.required = None;
        }
        let Some(con) = self.con.as_mut() else {
            return Err(RedisError::from((
                ErrorKind::Io,
                "node connection not opened",
            )));
        };
        Self::arm(
            con,
            left,
            &self.read,
            &self.write,
            &mut self.armed,
            Duration::ZERO,
        )?;
        Ok(con)
    }

    /// Before a send or a read: cut the socket's timeouts to the time left `left`, or put the
    /// cluster connection's back when there is no deadline.
    ///
    /// `extra` lengthens the read timeout (a replica confirmation's bound).
    fn arm(
        con: &redis::Connection,
        left: Option<Duration>,
        read: &Cell<Option<Duration>>,
        write: &Cell<Option<Duration>>,
        armed: &mut Option<Duration>,
        extra: Duration,
    ) -> RedisResult<()> {
        let Some(left) = left else {
            if armed.is_some() || !extra.is_zero() {
                con.set_read_timeout(read.get().map(|r| r.saturating_add(extra)))?;
                con.set_write_timeout(write.get())?;
                // Put back before the next command.
                *armed = (!extra.is_zero()).then_some(Duration::MAX);
            }
            return Ok(());
        };
        let want = read
            .get()
            .map_or(left, |r| r.saturating_add(extra).min(left));
        let close = armed.is_some_and(|a| a >= want && a.saturating_sub(want) <= SLACK);
        if !close {
            con.set_read_timeout(Some(want))?;
            con.set_write_timeout(Some(want))?;
            *armed = Some(want);
        }
        Ok(())
    }

    /// Runs `f` on the socket (opened if needed, timeouts armed); drops the socket after an
    /// error that leaves it unusable ([`loses_socket`]).
    fn io<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let r = self.ready().and_then(f);
        self.after(&r);
        r
    }

    /// Keeps [`SUSPECTS`] and the socket up to date after a call: a failed socket is dropped
    /// and its node suspect; a new socket's first reply clears its node.
    fn after<T>(&mut self, r: &RedisResult<T>) {
        match r {
            Err(e) if loses_socket(e) => {
                self.con = None;
                self.armed = None;
                self.fresh = false;
                let addr = self.info.addr().to_string();
                let mut s = suspects();
                if !s.contains(&addr) {
                    s.push(addr);
                }
            }
            Ok(_) if self.fresh && self.con.is_some() => {
                self.fresh = false;
                let addr = self.info.addr().to_string();
                suspects().retain(|a| *a != addr);
            }
            _ => {}
        }
    }

    /// redis-rs's greeting of a connection it just made: answered here while there is no
    /// socket, so that building a cluster connection or refreshing its slot map opens no
    /// socket to a node no command needs yet. The connection then proves itself at its first
    /// command, which fails, within its deadline, if the node does not answer.
    fn greet(&mut self, cmd: &[u8]) -> Option<Value> {
        (std::mem::take(&mut self.greeting) && self.con.is_none() && cmd == PING)
            .then(|| Value::SimpleString("PONG".to_owned()))
    }

    /// A pipeline (`offset` replies skipped, `count` kept), each reply read within the time
    /// left: redis-rs's own reads every reply with the whole timeout even after one timed out,
    /// so a pipeline of `n` commands to a node that does not answer took `n` timeouts.
    fn pipeline(
        con: &mut redis::Connection,
        cmd: &[u8],
        offset: usize,
        count: usize,
        timeouts: (
            &Cell<Option<Duration>>,
            &Cell<Option<Duration>>,
            &mut Option<Duration>,
        ),
        extra: Duration,
    ) -> RedisResult<Vec<Value>> {
        let (read, write, armed) = timeouts;
        con.send_packed_command(cmd)?;
        let mut replies = Vec::with_capacity(count);
        let mut idx = 0;
        while idx < offset + count {
            Self::arm(con, time_left()?, read, write, armed, extra)?;
            match con.recv_response()? {
                // RESP3 push data between replies is not a reply.
                Value::Push { .. } => continue,
                v if idx >= offset => replies.push(v),
                _ => {}
            }
            idx += 1;
        }
        Ok(replies)
    }
}

/// `INFO replication`, packed.
const INFO_REPLICATION: &[u8] = b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n";

impl Deadlined {
    /// The confirmation the calling thread asks of `cmd` on this node, if one is due: the
    /// client's settings and the replicas required here. Under `Auto` a new socket learns its
    /// node first (`INFO replication`, one round trip; see [`Acks::learn_node`]).
    fn confirmation(&mut self, cmd: &[u8]) -> RedisResult<Option<(Arc<Acks>, u32)>> {
        let Some(acks) = confirming() else {
            return Ok(None);
        };
        if needs_no_confirmation(cmd) {
            return Ok(None);
        }
        let required = match acks.node_fixed() {
            Some(n) => n,
            None => match self.required {
                Some(n) => n,
                None => {
                    let info = self.io(|c| c.req_packed_command(INFO_REPLICATION))?;
                    let addr = self.info.addr().to_string();
                    let n = match redis::from_redis_value::<String>(info) {
                        Ok(text) => acks.learn_node(&addr, &NodeRole::parse(&text)),
                        Err(e) => {
                            log::warn!(
                                "replica confirmation off on the Cluster node {addr}: \
                                 INFO replication was refused ({e})"
                            );
                            0
                        }
                    };
                    // Kept with the socket (`io` may have dropped it).
                    if self.con.is_some() {
                        self.required = Some(n);
                    }
                    n
                }
            },
        };
        Ok((required > 0).then_some((acks, required)))
    }

    /// Sends `cmd` (a command, or a pipeline whose `offset + count` replies are read) then
    /// `WAIT <required>` in one round trip, reads every reply with the read timeout lengthened
    /// by `WAIT`'s bound, notes the `WAIT`'s reply for the calling thread (unless the command
    /// did not run here: a redirection) and returns the others as `req_packed_commands` would.
    fn confirmed(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
        acks: &Acks,
        required: u32,
    ) -> RedisResult<Vec<Value>> {
        extend_deadline(acks.timeout());
        let wait = acks.packed_wait(required);
        let mut packed = Vec::with_capacity(cmd.len() + wait.len());
        packed.extend_from_slice(cmd);
        packed.extend_from_slice(&wait);
        let r = self.ready().map(|_| ()).and_then(|()| {
            let Some(con) = self.con.as_mut() else {
                return Err(RedisError::from((
                    ErrorKind::Io,
                    "node connection not opened",
                )));
            };
            Self::pipeline(
                con,
                &packed,
                0,
                offset + count + 1,
                (&self.read, &self.write, &mut self.armed),
                acks.timeout(),
            )
        });
        self.after(&r);
        let mut replies = r?;
        let wait = replies.pop().unwrap_or(Value::Nil);
        if !replies.iter().any(did_not_run) {
            note_confirmed(&wait, required);
        }
        Ok(replies.split_off(offset.min(replies.len())))
    }
}

impl redis::cluster::Connect for Deadlined {
    /// Opens nothing (see the module's documentation): the socket is opened by the first
    /// command. Fails at once when the calling thread's deadline has passed.
    ///
    /// The node is reached without `CLIENT SETINFO`: redis-rs sends it as two pipelined
    /// commands during the connection's set-up and reads each reply with the whole connect
    /// timeout, so a node that accepts connections and answers nothing (a frozen server, a
    /// cut link behind a proxy or a load balancer) took two connect timeouts to give up on.
    fn connect<T>(info: T, timeout: Option<Duration>) -> RedisResult<Self>
    where
        T: IntoConnectionInfo,
    {
        time_left()?;
        let info = info.into_connection_info()?;
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        Ok(Deadlined {
            info: info.set_redis_settings(settings),
            connect_timeout: timeout,
            con: None,
            fresh: false,
            greeting: true,
            read: Cell::new(None),
            write: Cell::new(None),
            armed: None,
            required: None,
        })
    }

    fn send_packed_command(&mut self, cmd: &[u8]) -> RedisResult<()> {
        // Not `io`: a send that went out is no reply (see `after`).
        let r = self.ready().and_then(|c| c.send_packed_command(cmd));
        if r.is_err() {
            self.after(&r);
        }
        r
    }

    fn set_write_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.write.set(dur);
        match &self.con {
            Some(con) => con.set_write_timeout(dur),
            None => Ok(()),
        }
    }

    fn set_read_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.read.set(dur);
        // A write timeout as long as the read timeout: redis-rs sets none on cluster nodes.
        if self.write.get().is_none() {
            self.write.set(dur);
            if let Some(con) = &self.con {
                con.set_write_timeout(dur)?;
            }
        }
        match &self.con {
            Some(con) => con.set_read_timeout(dur),
            None => Ok(()),
        }
    }

    fn recv_response(&mut self) -> RedisResult<Value> {
        self.io(redis::Connection::recv_response)
    }
}

impl ConnectionLike for Deadlined {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        if let Some(pong) = self.greet(cmd) {
            return Ok(pong);
        }
        if let Some((acks, required)) = self.confirmation(cmd)? {
            let mut replies = self.confirmed(cmd, 0, 1, &acks, required)?;
            return Ok(replies.pop().unwrap_or(Value::Nil));
        }
        self.io(|c| c.req_packed_command(cmd))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if let Some((acks, required)) = self.confirmation(cmd)? {
            return self.confirmed(cmd, offset, count, &acks, required);
        }
        if offset + count <= 1 {
            return self.io(|c| c.req_packed_commands(cmd, offset, count));
        }
        // `self.io`, with the timeouts borrowed beside the socket.
        let r = self.ready().map(|_| ()).and_then(|()| {
            let Some(con) = self.con.as_mut() else {
                return Err(RedisError::from((
                    ErrorKind::Io,
                    "node connection not opened",
                )));
            };
            Self::pipeline(
                con,
                cmd,
                offset,
                count,
                (&self.read, &self.write, &mut self.armed),
                Duration::ZERO,
            )
        });
        self.after(&r);
        r
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        if self.greeting && self.con.is_none() {
            let packed = cmd.get_packed_command();
            if let Some(pong) = self.greet(&packed) {
                return Ok(pong);
            }
        }
        if confirming().is_some() {
            let packed = cmd.get_packed_command();
            if let Some((acks, required)) = self.confirmation(&packed)? {
                let mut replies = self.confirmed(&packed, 0, 1, &acks, required)?;
                return Ok(replies.pop().unwrap_or(Value::Nil));
            }
        }
        self.io(|c| c.req_command(cmd))
    }

    fn get_db(&self) -> i64 {
        self.info.redis_settings().db()
    }

    /// No round trip: redis-rs checks every node connection this way each time it refreshes its
    /// slot map (a `PING` each, one node after the other), and a node that does not answer
    /// would cost the refresh, and the command that caused it, its whole deadline. A node
    /// connection proves itself at its next command instead.
    fn check_connection(&mut self) -> bool {
        self.is_open()
    }

    /// Open unless its socket was closed by the server: a node connection without a socket
    /// opens one at its next command.
    fn is_open(&self) -> bool {
        self.con.as_ref().is_none_or(redis::Connection::is_open)
    }
}
