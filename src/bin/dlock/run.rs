//! `dlock run`: take the lock, run the command under it, watch the lock, pass the exit status
//! on.
//!
//! How the hold is kept while the command runs:
//!
//! - Token, reentrant and fair without `--ttl`: a watched lock; the library's watchdog renews
//!   the lease every third of it and reports a loss through `on_lost` (and `Lease::is_lost`).
//! - Classic without `--ttl`: the library has no watchdog for Classic (its legacy peers neither
//!   renew nor publish), so a thread of dlock extends the hold every third of the lease with an
//!   owner-checked compare-and-set of the expiry timestamp, which legacy peers read as a later
//!   expiry. A renewal that finds the value changed reports a loss; renewals that fail are
//!   retried until the lease runs out by the local clock, which is a loss too.
//! - `--ttl`: a fixed lease, never renewed. The lock counts as lost once the ttl, less a
//!   clock-drift margin, has passed (by the local monotonic clock, measured from before the
//!   acquire was sent, so on the early side), and a thread asks Redis every third of the ttl
//!   (at most every 10 s) whether the hold is still ours, so a deleted key is noticed too.
//!
//! - `--permits N`: a permit of the semaphore named by the key instead of the lock, renewed by
//!   the library's watchdog or for a fixed `--ttl`, and judged by the local clock as a lock is.
//!
//! A loss is never silent: a message on stderr, SIGTERM to the command, SIGKILL `--kill-after`
//! later if it is still running, and exit status 79 whatever the command's own. A lease that
//! runs out without a renewal is reported at the library's loss deadline
//! ([`Lease::loss_deadline`]): 1% of the lease plus 2 ms before the lease's end counted from the
//! invocation of the acquire or latest renewal, so the command gets SIGTERM before the key can
//! expire on the server.

use std::io;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis_dlock::{
    DistributedLock, Encoding, Lease, LockClient, LockError, LossReason, LostLock, Permit,
    RetryPolicy, Strategy,
};
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;

use crate::args::{Deployment, RunOpts, Wait};
use crate::{code, say, Failure};

/// Pooled connections: the acquire, the watchdog or renewal thread, and a release.
const POOL_SIZE: u32 = 4;
/// Longest sleep of the supervising loop between looks at the lease's local validity.
const TICK: Duration = Duration::from_millis(100);
/// Longest interval between the checks of a fixed (`--ttl`) hold.
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Clock allowance of the 8-byte legacy locker: it stores `now + ttl + 1000 ms`.
const BIG_ENDIAN_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// What wakes the supervising loop.
enum Event {
    /// A signal to dlock (SIGCHLD: the command may have exited).
    Signal(i32),
    /// The hold was lost, and why.
    Lost(String),
}

/// How the hold is kept while the command runs.
#[derive(Clone, Copy)]
enum Keep {
    /// The library's watchdog renews it (Token, Reentrant, Fair).
    Watchdog,
    /// dlock's renewal thread extends it (Classic).
    Extend(Duration),
    /// A fixed lease (`--ttl`): checked, never renewed.
    Fixed(Duration),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `dlock run`; the exit status.
pub fn run(o: RunOpts) -> Result<u8, Failure> {
    let url = o.target.url.clone();
    let key = o.target.key.clone();
    let fail = |e: &LockError| Failure::from_lock_error(e, &url);
    let builder = match &o.target.deployment {
        Deployment::Single => LockClient::builder(url.as_str()),
        Deployment::Sentinel { sentinels, master } => {
            LockClient::sentinel_builder(sentinels, master.as_str())
        }
        Deployment::Cluster(nodes) => LockClient::cluster_builder(nodes),
    };
    let client = builder
        .pool_size(POOL_SIZE)
        .replica_acks(o.replica_acks)
        .build()
        .map_err(|e| fail(&e))?;
    let (tx, rx) = mpsc::channel::<Event>();
    if let Some(permits) = o.permits {
        return run_permit(&o, &client, permits, tx, &rx);
    }

    let mut builder = client.lock(key.clone()).strategy(o.strategy);
    if let Some(d) = o.at_least {
        builder = builder.lock_at_least(d);
    }
    if o.shedlock {
        builder = builder.strategy(Strategy::ShedLock);
    }
    let (keep, default_retry) = if let Strategy::Classic(mut classic) = o.strategy {
        classic = classic.encoding(o.encoding);
        match o.encoding {
            Encoding::BigEndian => {
                classic = classic.key_ttl(true).clock_skew(BIG_ENDIAN_CLOCK_SKEW);
            }
            // gorlock sets a Redis TTL on the key as well.
            Encoding::Nanos => classic = classic.key_ttl(true),
            _ => {}
        }
        builder = builder.strategy(Strategy::Classic(classic));
        let keep = match o.ttl {
            Some(ttl) => Keep::Fixed(ttl),
            None => Keep::Extend(o.lease),
        };
        builder = builder.ttl(o.ttl.unwrap_or(o.lease));
        (keep, RetryPolicy::legacy())
    } else {
        // Token, Reentrant and Fair: held by the library's watchdog, or for a fixed ttl.
        let keep = match o.ttl {
            Some(ttl) => {
                builder = builder.ttl(ttl);
                Keep::Fixed(ttl)
            }
            None => {
                let tx = tx.clone();
                builder = builder.watchdog_lease(o.lease).on_lost(move |lost| {
                    let _ = tx.send(Event::Lost(loss_reason(lost).to_owned()));
                });
                Keep::Watchdog
            }
        };
        (keep, RetryPolicy::standard())
    };
    if o.wait == Wait::Forever {
        builder = builder.retry(default_retry.max_wait(None).max_retries(None));
    }
    let dlock: Arc<dyn DistributedLock> = Arc::from(builder.build().map_err(|e| fail(&e))?);

    let acquired = match o.wait {
        Wait::No => dlock.try_lock(),
        Wait::For(d) => dlock.try_lock_for(d),
        Wait::Default | Wait::Forever => dlock.lock(),
    }
    .map(|guard| guard.into_lease());
    let lease = match acquired {
        Ok(lease) => lease,
        Err(LockError::Held { .. }) => {
            if !o.quiet {
                say!("lock {key:?} is busy");
            }
            return Ok(code::BUSY);
        }
        Err(LockError::Timeout {
            attempts, waited, ..
        }) => {
            if !o.quiet {
                say!("lock {key:?} is still busy after waiting {waited:.1?} ({attempts} attempts)");
            }
            return Ok(code::BUSY);
        }
        Err(e) => return Err(fail(&e)),
    };
    log::debug!("lock {key:?} acquired: {lease:?}");
    let held = Held {
        dlock,
        lease: Arc::new(Mutex::new(lease)),
        key,
        keep,
    };
    run_command(&o, &held, tx, &rx)
}

/// What `run` needs of a hold, a lock's or a semaphore's permit, while the command runs.
trait Holder {
    /// The lock key, or the semaphore's name.
    fn key(&self) -> &str;
    /// What the hold is, in messages: "lock" or "permit of semaphore".
    fn what(&self) -> &'static str;
    /// When the hold counts as lost by the local clock, and whether it is marked lost already.
    fn look(&self) -> (Instant, bool);
    /// Why the hold counts as lost once its local validity has passed.
    fn expiry_reason(&self) -> String;
    /// Releases; whether the hold was still ours.
    fn release(&self) -> Result<bool, LockError>;
    /// How long the hold has left by the local clock.
    fn remaining(&self) -> Duration;
    /// The renewal or checking thread, if the hold needs one. It stops when `stop`'s sender is
    /// dropped.
    fn start_monitor(&self, tx: Sender<Event>, stop: Receiver<()>) -> Option<JoinHandle<()>>;

    /// Releases after a failure or a loss; the outcome is only logged.
    fn release_quietly(&self) {
        match self.release() {
            Ok(ours) => log::debug!(
                "{} {:?} released (still ours: {ours})",
                self.what(),
                self.key()
            ),
            Err(e) => log::info!("{} {:?}: release failed: {e}", self.what(), self.key()),
        }
    }
}

/// Runs the command under `held`, watches the hold, releases it; the exit status.
fn run_command(
    o: &RunOpts,
    held: &dyn Holder,
    tx: Sender<Event>,
    rx: &Receiver<Event>,
) -> Result<u8, Failure> {
    // Signals are caught from here on: before, a SIGINT or SIGTERM ends dlock as usual (no
    // command runs yet, and a lock taken just then expires within its lease).
    let mut signals =
        match Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD]) {
            Ok(s) => s,
            Err(e) => {
                held.release_quietly();
                return Err(Failure::new(code::OS, format!("cannot catch signals: {e}")));
            }
        };
    let signal_tx = tx.clone();
    let spawned = thread::Builder::new()
        .name("dlock-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if signal_tx.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        held.release_quietly();
        return Err(Failure::new(
            code::OS,
            format!("cannot start a thread: {e}"),
        ));
    }

    let Some((program, program_args)) = o.command.split_first() else {
        held.release_quietly();
        return Err(Failure::new(code::USAGE, "no command given"));
    };
    let mut command = Command::new(program);
    command.args(program_args);
    end_with_dlock(&mut command);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            held.release_quietly();
            let status = if e.kind() == io::ErrorKind::NotFound {
                code::NOT_FOUND
            } else {
                code::CANNOT_RUN
            };
            return Err(Failure::new(
                status,
                format!("cannot run {:?}: {e}", program.to_string_lossy()),
            ));
        }
    };

    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let monitor = held.start_monitor(tx, stop_rx);
    let outcome = supervise(child, held, rx, o.kill_after);
    drop(stop_tx);
    if let Some(m) = monitor {
        let _ = m.join();
    }
    let (status, lost) = match outcome {
        Ok(o) => o,
        Err(f) => {
            held.release_quietly();
            return Err(f);
        }
    };
    let status = exit_code(status);
    if lost {
        held.release_quietly();
        say!(
            "exit {}: the {} was lost (the command's own status was {status})",
            code::LOST,
            held.what()
        );
        return Ok(code::LOST);
    }
    let remaining = held.remaining();
    match held.release() {
        Ok(true) => Ok(status),
        Ok(false) => {
            say!(
                "{} {:?} was lost before the command finished (it expired, or another owner \
                 took it or deleted it): exit {} (the command's own status was {status})",
                held.what(),
                held.key(),
                code::LOST
            );
            Ok(code::LOST)
        }
        Err(e) => {
            say!(
                "the command finished but the {} could not be released ({}); tried once more \
                 before dlock exits, else it expires by itself within {remaining:?}",
                held.what(),
                Failure::from_lock_error(&e, &o.target.url).message,
            );
            Ok(status)
        }
    }
}

/// Why the watchdog reported a hold lost, in messages.
fn loss_reason(lost: &LostLock) -> &'static str {
    match lost.reason() {
        LossReason::Gone => "a renewal found the key deleted or held by another owner",
        _ => "renewals failed until its lease ran out (Redis unreachable or paused?)",
    }
}

/// `dlock run --permits N`: the command runs under one permit of the semaphore named by the
/// key, set to `permits` permits if it was never set.
fn run_permit(
    o: &RunOpts,
    client: &LockClient,
    permits: u64,
    tx: Sender<Event>,
    rx: &Receiver<Event>,
) -> Result<u8, Failure> {
    let key = o.target.key.clone();
    let fail = |e: &LockError| Failure::from_lock_error(e, &o.target.url);
    let mut builder = client.semaphore(&key);
    builder = match o.ttl {
        Some(ttl) => builder.ttl(ttl),
        None => {
            let tx = tx.clone();
            builder.watchdog_lease(o.lease).on_lost(move |lost| {
                let _ = tx.send(Event::Lost(loss_reason(lost).to_owned()));
            })
        }
    };
    if o.wait == Wait::Forever {
        builder = builder.retry(RetryPolicy::standard().max_wait(None).max_retries(None));
    }
    let sem = builder.build().map_err(|e| fail(&e))?;
    if sem.try_set_permits(permits).map_err(|e| fail(&e))? {
        log::info!("semaphore {key:?} set to {permits} permits");
    }
    let acquired = match o.wait {
        Wait::No => sem.try_acquire(),
        Wait::For(d) => sem.try_acquire_for(d),
        Wait::Default | Wait::Forever => sem.acquire(),
    };
    let permit = match acquired {
        Ok(permit) => permit,
        Err(e) if e.is_contention() => {
            if !o.quiet {
                say!("semaphore {key:?} has no free permit: {e}");
            }
            return Ok(code::BUSY);
        }
        Err(e) => return Err(fail(&e)),
    };
    log::debug!("semaphore {key:?}: permit {:?} acquired", permit.ids());
    let lease = o.ttl.unwrap_or(o.lease);
    let held = PermitHeld {
        permit: Mutex::new(Some(permit)),
        key,
        margin: lease / 100 + Duration::from_millis(2),
        fixed: o.ttl,
    };
    run_command(o, &held, tx, rx)
}

/// A semaphore's permit while the command runs: renewed by the library's watchdog, or for a
/// fixed `--ttl`; no thread of dlock's own.
struct PermitHeld<'a> {
    /// Taken by the release.
    permit: Mutex<Option<Permit<'a>>>,
    key: String,
    /// Counted off the permit's validity, as the library's loss deadline of a lock: 1% of the
    /// lease plus 2 ms.
    margin: Duration,
    fixed: Option<Duration>,
}

impl Holder for PermitHeld<'_> {
    fn key(&self) -> &str {
        &self.key
    }

    fn what(&self) -> &'static str {
        "permit of semaphore"
    }

    fn look(&self) -> (Instant, bool) {
        match &*lock(&self.permit) {
            Some(p) => {
                let until = p.valid_until();
                (until.checked_sub(self.margin).unwrap_or(until), p.is_lost())
            }
            None => (Instant::now(), true),
        }
    }

    fn expiry_reason(&self) -> String {
        match self.fixed {
            Some(ttl) => format!(
                "its fixed --ttl of {ttl:?} has passed (less the clock-drift margin, 1% + 2 ms)"
            ),
            None => "its lease ran out (less the clock-drift margin, 1% + 2 ms) before a \
                     renewal succeeded (Redis unreachable or paused?)"
                .to_owned(),
        }
    }

    fn release(&self) -> Result<bool, LockError> {
        match lock(&self.permit).take() {
            Some(p) => p.release(),
            None => Ok(false),
        }
    }

    fn remaining(&self) -> Duration {
        lock(&self.permit).as_ref().map_or(Duration::ZERO, |p| {
            p.valid_until().saturating_duration_since(Instant::now())
        })
    }

    fn start_monitor(&self, _: Sender<Event>, _: Receiver<()>) -> Option<JoinHandle<()>> {
        None
    }
}

/// The hold while the command runs.
struct Held {
    dlock: Arc<dyn DistributedLock>,
    /// The current lease (Classic renewals replace it).
    lease: Arc<Mutex<Lease>>,
    key: String,
    keep: Keep,
}

impl Holder for Held {
    fn key(&self) -> &str {
        &self.key
    }

    fn what(&self) -> &'static str {
        "lock"
    }

    fn look(&self) -> (Instant, bool) {
        let lease = lock(&self.lease);
        (lease.loss_deadline(), lease.is_lost())
    }

    fn release(&self) -> Result<bool, LockError> {
        let lease = lock(&self.lease).clone();
        self.dlock.release(&lease)
    }

    fn remaining(&self) -> Duration {
        lock(&self.lease).remaining()
    }

    fn expiry_reason(&self) -> String {
        match self.keep {
            Keep::Fixed(ttl) => format!(
                "its fixed --ttl of {ttl:?} has passed (less the clock-drift margin, 1% + 2 ms)"
            ),
            Keep::Watchdog | Keep::Extend(_) => {
                "its lease ran out (less the clock-drift margin, 1% + 2 ms) before a renewal \
                 succeeded (Redis unreachable or paused?)"
                    .to_owned()
            }
        }
    }

    /// The renewal thread (Classic) or the checking thread (`--ttl`); none for a watched lock.
    fn start_monitor(&self, tx: Sender<Event>, stop: Receiver<()>) -> Option<JoinHandle<()>> {
        let dlock = Arc::clone(&self.dlock);
        let shared = Arc::clone(&self.lease);
        let key = self.key.clone();
        let body: Box<dyn FnOnce() + Send> = match self.keep {
            Keep::Watchdog => return None,
            Keep::Extend(lease) => {
                Box::new(move || renew_loop(&*dlock, &shared, lease, &key, &tx, &stop))
            }
            Keep::Fixed(ttl) => Box::new(move || check_loop(&*dlock, &shared, ttl, &tx, &stop)),
        };
        match thread::Builder::new()
            .name("dlock-renew".into())
            .spawn(body)
        {
            Ok(handle) => Some(handle),
            Err(e) => {
                // The supervising loop still sees the lease run out by the local clock.
                say!("lock {:?}: cannot start the renewal thread: {e}", self.key);
                None
            }
        }
    }
}

/// Sleeps `d` unless told to stop; true when it must stop.
fn stopped(stop: &Receiver<()>, d: Duration) -> bool {
    !matches!(stop.recv_timeout(d), Err(RecvTimeoutError::Timeout))
}

/// How long a repeated WARN of a loop is held back, as the library's own repeated lines.
const QUIET: Duration = Duration::from_secs(5);

/// One loop's repeated WARN: written at most once per [`QUIET`] while Redis stays away (a short
/// lease retries its renewal every few hundred ms), with the count of those left out.
#[derive(Debug, Default)]
struct Quiet {
    last: Option<Instant>,
    left_out: u32,
}

impl Quiet {
    /// `Some(left out since the last one)` when the line may be written at `now`; otherwise
    /// counts it as left out.
    fn allow(&mut self, now: Instant) -> Option<u32> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < QUIET)
        {
            self.left_out = self.left_out.saturating_add(1);
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.left_out))
    }
}

/// The tail of a line written after some like it were left out.
fn left_out_note(left_out: u32) -> String {
    match left_out {
        0 => String::new(),
        n => format!(
            " ({n} more like this in the last {} s were not logged)",
            QUIET.as_secs()
        ),
    }
}

/// Extends a Classic hold every third of `lease`.
fn renew_loop(
    dlock: &dyn DistributedLock,
    shared: &Mutex<Lease>,
    lease: Duration,
    key: &str,
    tx: &Sender<Event>,
    stop: &Receiver<()>,
) {
    let period = lease / 3;
    let retry = (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut next = period;
    let mut quiet = Quiet::default();
    loop {
        if stopped(stop, next) {
            return;
        }
        let mut current = lock(shared).clone();
        match dlock.extend(&mut current, lease) {
            Ok(()) => {
                log::debug!("lock {key:?} renewed for {lease:?}");
                *lock(shared) = current;
                next = period;
            }
            Err(LockError::Lost { .. }) => {
                let _ = tx.send(Event::Lost(
                    "a renewal found the key deleted or holding another owner's expiry".into(),
                ));
                return;
            }
            Err(e) => {
                if let Some(left_out) = quiet.allow(Instant::now()) {
                    log::warn!(
                        "lock {key:?}: renewal failed, retrying in {retry:?}: {e}{}",
                        left_out_note(left_out)
                    );
                }
                // The supervising loop sees the lease run out by the local clock.
                next = retry;
            }
        }
    }
}

/// Asks Redis every third of `ttl` (at most [`MAX_CHECK_INTERVAL`]) whether the fixed hold is
/// still ours.
fn check_loop(
    dlock: &dyn DistributedLock,
    shared: &Mutex<Lease>,
    ttl: Duration,
    tx: &Sender<Event>,
    stop: &Receiver<()>,
) {
    let period = (ttl / 3).clamp(Duration::from_millis(10), MAX_CHECK_INTERVAL);
    let mut quiet = Quiet::default();
    loop {
        if stopped(stop, period) {
            return;
        }
        let current = lock(shared).clone();
        if current.is_lost() {
            return; // the supervising loop reports it
        }
        match dlock.is_held(&current) {
            Ok(true) => {}
            Ok(false) if current.is_lost() => return,
            Ok(false) => {
                let _ = tx.send(Event::Lost(
                    "the key was deleted or another owner holds it".into(),
                ));
                return;
            }
            Err(e) => {
                if let Some(left_out) = quiet.allow(Instant::now()) {
                    let note = left_out_note(left_out);
                    log::warn!("lock {:?}: check failed: {e}{note}", dlock.key());
                }
            }
        }
    }
}

/// Waits for the command, forwarding signals and acting on a loss. Returns its status and
/// whether the lock was lost meanwhile.
fn supervise(
    mut child: Child,
    held: &dyn Holder,
    rx: &Receiver<Event>,
    kill_after: Duration,
) -> Result<(ExitStatus, bool), Failure> {
    let pid = child.id();
    let mut lost = false;
    let mut kill_at: Option<Instant> = None;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok((status, lost)),
            Ok(None) => {}
            Err(e) => {
                return Err(Failure::new(
                    code::OS,
                    format!("cannot wait for the command: {e}"),
                ))
            }
        }
        let mut loss = None;
        // The next look at the lease: at its loss deadline, or a tick from now.
        let mut tick = TICK;
        if !lost {
            let (deadline, marked_lost) = held.look();
            let now = Instant::now();
            if now >= deadline {
                loss = Some(held.expiry_reason());
            } else if marked_lost {
                // Marked lost by the watchdog before its deadline (its `on_lost` event may
                // still be on its way).
                loss = Some("a renewal found the key deleted or held by another owner".into());
            } else {
                tick = tick.min(deadline - now);
            }
        }
        if let Some(at) = kill_at {
            if Instant::now() >= at {
                say!("the command is still running {kill_after:?} after SIGTERM: sending SIGKILL");
                let _ = forward(pid, SIGKILL);
                kill_at = None;
            }
        }
        if loss.is_none() {
            let timeout = kill_at.map_or(tick, |at| {
                tick.min(at.saturating_duration_since(Instant::now()))
            });
            match rx.recv_timeout(timeout) {
                Ok(Event::Signal(SIGCHLD)) => {}
                Ok(Event::Signal(sig @ (SIGINT | SIGQUIT | SIGHUP)))
                    if in_terminal_foreground() =>
                {
                    // The terminal sent it to its whole foreground process group, the
                    // command included (as for Ctrl-C): forwarding it would deliver it twice.
                    log::debug!("signal {sig} not forwarded: the terminal signalled the command");
                }
                Ok(Event::Signal(sig)) => {
                    log::debug!("forwarding signal {sig} to the command (pid {pid})");
                    if let Err(e) = forward(pid, sig) {
                        say!("cannot forward signal {sig} to the command: {e}");
                    }
                }
                Ok(Event::Lost(why)) if !lost => loss = Some(why),
                Ok(Event::Lost(_)) | Err(RecvTimeoutError::Timeout) => {}
                // Every sender gone: cannot happen while `held`'s threads run; keep polling.
                Err(RecvTimeoutError::Disconnected) => thread::sleep(TICK),
            }
        }
        if let Some(why) = loss {
            lost = true;
            say!(
                "{} {:?} LOST while the command was running: {why}. Another process may hold \
                 it now. Sending SIGTERM to the command (pid {pid}){}",
                held.what(),
                held.key(),
                if kill_after.is_zero() {
                    ", then SIGKILL at once".to_owned()
                } else {
                    format!(", SIGKILL in {kill_after:?} if it is still running")
                }
            );
            let _ = forward(pid, SIGTERM);
            // `None` (no SIGKILL) only for a --kill-after beyond the clock's range.
            kill_at = Instant::now().checked_add(kill_after);
        }
    }
}

/// On Linux, the command gets SIGTERM if dlock dies without forwarding anything (SIGKILL, a
/// crash): its renewals die with it, so the lock is about to be lost.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn end_with_dlock(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // getpid() of dlock, read before the fork: the child compares it with its parent below.
    let dlock_pid = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: prctl(2) and getppid(2) are system calls that
    // allocate nothing and take no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            // dlock died before the prctl: the signal will never come, so act now.
            if u32::try_from(libc::getppid()).ok() != Some(dlock_pid) {
                return Err(io::Error::other("dlock exited before the command started"));
            }
            Ok(())
        });
    }
}

/// Elsewhere the command outlives a dlock that is killed outright.
#[cfg(not(target_os = "linux"))]
fn end_with_dlock(_: &mut Command) {}

/// The shell's view of a status: the code, or 128 + the signal that killed the process.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => code::OS,
    }
}

/// True when dlock (and so the command, which shares its process group) is in the foreground
/// process group of the terminal on its stdin, stdout or stderr: a SIGINT (Ctrl-C), SIGQUIT
/// (Ctrl-\\) or SIGHUP (hang-up) from that terminal went to the command as well as to dlock.
#[allow(unsafe_code)]
fn in_terminal_foreground() -> bool {
    // SAFETY: getpgrp(2) and tcgetpgrp(3) take and return integers and touch no memory of
    // ours; tcgetpgrp on a descriptor that is not a terminal fails with -1.
    let own = unsafe { libc::getpgrp() };
    [0, 1, 2].into_iter().any(|fd| {
        let foreground = unsafe { libc::tcgetpgrp(fd) };
        foreground > 0 && foreground == own
    })
}

/// Sends `sig` to the command. Only called while the command has not been reaped (the
/// supervising loop reaps it and then stops forwarding), so the pid cannot belong to another
/// process yet.
#[allow(unsafe_code)]
fn forward(pid: u32, sig: i32) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes two integers and touches no memory of ours; `pid` is our unreaped
    // child (positive, so never a process group or "every process").
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_written_once_per_quiet_period_with_the_count_left_out() {
        let mut quiet = Quiet::default();
        let t0 = Instant::now();
        assert_eq!(quiet.allow(t0), Some(0));
        // A renewal retried every 300 ms for 4.5 s: held back.
        for i in 1..=15 {
            assert_eq!(quiet.allow(t0 + Duration::from_millis(300 * i)), None);
        }
        // The next one after the quiet period says how many were left out, and starts again.
        assert_eq!(quiet.allow(t0 + QUIET + Duration::from_millis(1)), Some(15));
        assert_eq!(quiet.allow(t0 + QUIET + Duration::from_millis(2)), None);
        assert_eq!(left_out_note(0), "");
        assert_eq!(
            left_out_note(15),
            " (15 more like this in the last 5 s were not logged)"
        );
    }
}
