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
//! slot-map refresh), whose connect timeout is cut to a fourth of the time left (redis-rs's
//! set-up waits for up to four replies, each with the whole connect timeout). The retry sleeps are
//! configured in `client.rs` to stay short, so a command returns at most one retry sleep after
//! its deadline.
//!
//! A watchdog renewal brings its own, earlier, deadline: the earliest loss deadline of the holds
//! it carries (see [`watchdog`](crate::client::watchdog)). [`with_deadline`] takes the earlier
//! of the two, and [`left_until`] / [`within`] cut the timeouts of a single server's
//! connection, of a new connection and of a pool checkout to that deadline the same way.

use std::cell::Cell;
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionLike, IntoConnectionInfo, RedisError, RedisResult, Value};

thread_local! {
    /// The deadline of the cluster command the calling thread is running, if any.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
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
    let out = f();
    DEADLINE.with(|d| d.set(before));
    out
}

/// The time left before the current deadline: `Ok(None)` without one, an I/O timeout error when
/// it has passed.
fn time_left() -> RedisResult<Option<Duration>> {
    left_until(DEADLINE.with(Cell::get))
}

/// The time left until `until`: `Ok(None)` without one, an I/O timeout error (a command that
/// did not answer in time) when it has passed.
pub(crate) fn left_until(until: Option<Instant>) -> RedisResult<Option<Duration>> {
    let Some(deadline) = until else {
        return Ok(None);
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the command's deadline ran out (cluster redirections and retries included, \
             or a watchdog renewal bounded by a hold's loss deadline)",
        )));
    }
    Ok(Some(left))
}

/// `timeout`, cut to the time left until `until`; an I/O timeout error when none is left.
pub(crate) fn within(timeout: Duration, until: Option<Instant>) -> RedisResult<Duration> {
    Ok(left_until(until)?.map_or(timeout, |left| left.min(timeout)))
}

/// The replies redis-rs's connection set-up may wait for, each with the whole connect timeout
/// left after the TCP connect: `HELLO` or `AUTH`, `SELECT`, and two `CLIENT SETINFO` (it reads
/// every reply of its set-up pipeline, even after one timed out).
const SETUP_REPLIES: u32 = 4;

/// The connect timeout to give redis-rs for a connection that must be open, set-up included,
/// within `left` (`None`: `timeout` as it is): a fourth of it at most (see [`SETUP_REPLIES`]).
pub(crate) fn connect_timeout(timeout: Duration, left: Option<Duration>) -> Duration {
    left.map_or(timeout, |left| timeout.min(left / SETUP_REPLIES))
}

/// [`connect_timeout`] for a connection to open by `until`; an I/O timeout error when that
/// has passed.
pub(crate) fn connect_within(timeout: Duration, until: Option<Instant>) -> RedisResult<Duration> {
    Ok(connect_timeout(timeout, left_until(until)?))
}

/// [`within`] for an optional timeout (`None`: none, unless `until` gives one).
pub(crate) fn within_opt(
    timeout: Option<Duration>,
    until: Option<Instant>,
) -> RedisResult<Option<Duration>> {
    Ok(match (timeout, left_until(until)?) {
        (Some(t), Some(left)) => Some(t.min(left)),
        (t, left) => t.or(left),
    })
}

/// A node connection of a cluster connection that keeps to the calling thread's deadline.
pub(crate) struct Deadlined {
    con: redis::Connection,
    /// The timeouts set by the cluster connection (the user's command timeout), put back on the
    /// socket for commands run without a deadline.
    read: Cell<Option<Duration>>,
    write: Cell<Option<Duration>>,
    /// The timeout currently on the socket (read and write alike while a deadline is armed).
    armed: Option<Duration>,
}

/// Timeouts closer than this to the one already set are not set again (one system call each).
const SLACK: Duration = Duration::from_millis(1);

impl Deadlined {
    /// Before a send: cut the socket's timeouts to the time left, or fail when none is left.
    fn arm(&mut self) -> RedisResult<()> {
        let Some(left) = time_left()? else {
            if self.armed.is_some() {
                self.con.set_read_timeout(self.read.get())?;
                self.con.set_write_timeout(self.write.get())?;
                self.armed = None;
            }
            return Ok(());
        };
        let want = self.read.get().map_or(left, |r| r.min(left));
        let close = self
            .armed
            .is_some_and(|a| a >= want && a.saturating_sub(want) <= SLACK);
        if !close {
            self.con.set_read_timeout(Some(want))?;
            self.con.set_write_timeout(Some(want))?;
            self.armed = Some(want);
        }
        Ok(())
    }
}

impl redis::cluster::Connect for Deadlined {
    fn connect<T>(info: T, timeout: Option<Duration>) -> RedisResult<Self>
    where
        T: IntoConnectionInfo,
    {
        let timeout = match (time_left()?, timeout) {
            (Some(left), Some(t)) => Some(connect_timeout(t, Some(left))),
            (Some(left), None) => Some(left / SETUP_REPLIES),
            (None, t) => t,
        };
        let con = <redis::Connection as redis::cluster::Connect>::connect(info, timeout)?;
        Ok(Deadlined {
            con,
            read: Cell::new(None),
            write: Cell::new(None),
            armed: None,
        })
    }

    fn send_packed_command(&mut self, cmd: &[u8]) -> RedisResult<()> {
        self.arm()?;
        self.con.send_packed_command(cmd)
    }

    fn set_write_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.write.set(dur);
        self.con.set_write_timeout(dur)
    }

    fn set_read_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.read.set(dur);
        // A write timeout as long as the read timeout: redis-rs sets none on cluster nodes.
        if self.write.get().is_none() {
            self.write.set(dur);
            self.con.set_write_timeout(dur)?;
        }
        self.con.set_read_timeout(dur)
    }

    fn recv_response(&mut self) -> RedisResult<Value> {
        self.arm()?;
        self.con.recv_response()
    }
}

impl ConnectionLike for Deadlined {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.arm()?;
        self.con.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.arm()?;
        self.con.req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.arm()?;
        self.con.req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.con.check_connection()
    }

    fn is_open(&self) -> bool {
        self.con.is_open()
    }
}
