//! Extreme settings (0, 1 ns, `Duration::MAX`, `u32::MAX`) on every builder and every blocking
//! call, against a real `redis-server` with the lock held by another client: no call panics,
//! each returns within its documented bound (with generous slack for a loaded machine), and a
//! builder either accepts a value or rejects it with `Config`.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::test_hooks::Event;
use redis_dlock::ClassicOptions;
use redis_dlock::{
    DistributedLock, LockClient, LockError, LockGuard, ReadWriteLock, RedLockClient, RetryPolicy,
    Strategy, WakeUp, MAX_TTL,
};
use support::{init_logging, raw, wait_until, RedisServer};

/// Slack on every time bound: the machine is shared and noisy; the bounds tested are far
/// apart from the failures they catch (a panic, an hour-long or endless wait).
const SLACK: Duration = Duration::from_secs(3);
/// The bounded wait used throughout.
const WAIT: Duration = Duration::from_millis(300);
/// Lifetime of the holds (long enough never to expire during a test).
const HOLD: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Classic,
    TokenPolling,
    TokenPubSub,
    Reentrant,
    Read,
    Write,
    RedLock,
}

const KINDS: [Kind; 7] = [
    Kind::Classic,
    Kind::TokenPolling,
    Kind::TokenPubSub,
    Kind::Reentrant,
    Kind::Read,
    Kind::Write,
    Kind::RedLock,
];

/// One client, and a one-node RedLock client over it (locks of one `Client` share their
/// in-process waiter lines).
struct Client {
    c: LockClient,
    red: RedLockClient,
}

fn client(server: &RedisServer) -> Client {
    let c = LockClient::open(server.url()).expect("client");
    // A generous node timeout: the default 50 ms counts a vote as missing on a loaded machine.
    let red = RedLockClient::from_clients(vec![c.clone()])
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("redlock client");
    Client { c, red }
}

/// A lock of some kind, kept with what it borrows from.
enum Made {
    Boxed(Box<dyn DistributedLock>),
    Rw(ReadWriteLock, bool),
}

impl Made {
    fn get(&self) -> &dyn DistributedLock {
        match self {
            Made::Boxed(b) => b.as_ref(),
            Made::Rw(rw, true) => rw.write_lock(),
            Made::Rw(rw, false) => rw.read_lock(),
        }
    }
}

fn make(kind: Kind, client: &Client, key: &str, retry: RetryPolicy) -> Made {
    let b = client.c.lock(key).ttl(HOLD).retry(retry.clone());
    match kind {
        Kind::Classic => Made::Boxed(Box::new(
            b.strategy(Strategy::Classic(ClassicOptions::new()))
                .build()
                .expect("classic"),
        )),
        Kind::TokenPolling => {
            Made::Boxed(Box::new(b.wake_up(WakeUp::Polling).build().expect("token")))
        }
        Kind::TokenPubSub => Made::Boxed(Box::new(b.build().expect("token"))),
        Kind::Reentrant => Made::Boxed(Box::new(
            b.strategy(Strategy::Reentrant).build().expect("reentrant"),
        )),
        Kind::Read | Kind::Write => {
            let b = client.c.rw_lock(key).ttl(HOLD).retry(retry.clone());
            let rw = match b.clone().build() {
                Ok(rw) => rw,
                // The default writer intent, 4 × max_delay, is beyond MAX_TTL: refused, and
                // accepted with an explicit intent.
                Err(LockError::Config { reason, .. })
                    if retry.max_delay.saturating_mul(4) > MAX_TTL =>
                {
                    assert!(reason.contains("writer_intent"), "{reason}");
                    b.writer_intent(Duration::from_secs(1)).build().expect("rw")
                }
                Err(e) => panic!("rw: {e}"),
            };
            Made::Rw(rw, kind == Kind::Write)
        }
        Kind::RedLock => Made::Boxed(
            client
                .red
                .lock(key)
                .ttl(HOLD)
                .retry(retry)
                .build()
                .map(Box::new)
                .expect("redlock"),
        ),
    }
}

/// Waiters woken by pub/sub (the default of Token, reentrant and read-write locks).
fn pubsub(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::TokenPubSub | Kind::Reentrant | Kind::Read | Kind::Write
    )
}

/// The hold that keeps `kind`'s waiters out: a write hold for the read-write lock.
fn holder_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Read => Kind::Write,
        k => k,
    }
}

#[track_caller]
fn assert_timeout(result: redis_dlock::Result<LockGuard<'_>>, took: Duration, bound: Duration) {
    match result {
        Err(e @ LockError::Timeout { .. }) => assert!(e.is_contention()),
        Err(e) => panic!("expected Timeout, got {e}"),
        Ok(g) => panic!("expected Timeout, got the lock {g:?}"),
    }
    assert!(
        took <= bound + SLACK,
        "took {took:?}, documented bound {bound:?}"
    );
}

/// Every blocking call of a lock built with `retry`, held by another client: each gives up
/// within the deadline it was given (`bound` for `lock()`).
fn blocked_calls(server: &RedisServer, kind: Kind, key: &str, retry: RetryPolicy, bound: Duration) {
    let (c1, c2) = (client(server), client(server));
    let holder = make(holder_kind(kind), &c1, key, RetryPolicy::no_wait());
    let held = holder.get().try_lock().expect("holder takes the lock");
    let waiter = make(kind, &c2, key, retry.clone());
    let w = waiter.get();
    let what = format!("{kind:?} with {retry:?}");

    let start = Instant::now();
    match w.try_lock() {
        Err(LockError::Held { .. }) => {}
        other => panic!("{what}: try_lock: expected Held, got {other:?}"),
    }
    assert!(start.elapsed() <= SLACK, "{what}: try_lock");

    let start = Instant::now();
    let r = w.lock();
    assert_timeout(r, start.elapsed(), bound);

    for wait in [Duration::ZERO, Duration::from_nanos(1), WAIT] {
        let start = Instant::now();
        let r = w.try_lock_for(wait);
        assert_timeout(r, start.elapsed(), wait);
    }
    assert!(held.unlock().expect("holder unlocks"), "{what}");
    // The waiter gets in now, and its own extend and unlock behave.
    let mut g = w.try_lock_for(SLACK).expect("free after the release");
    g.extend(Duration::from_secs(5)).expect("extend");
    assert!(g.unlock().expect("unlock"), "{what}");
}

/// Policies with extreme values, each ending within `WAIT` (or at once).
fn bounded_policies() -> Vec<(RetryPolicy, Duration)> {
    let w = Some(WAIT);
    vec![
        (
            RetryPolicy::standard()
                .fixed_delay(Duration::ZERO)
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::legacy()
                .fixed_delay(Duration::ZERO)
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::standard()
                .fixed_delay(Duration::from_nanos(1))
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::standard()
                .fixed_delay(Duration::MAX)
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::standard()
                .fixed_delay(Duration::MAX)
                .jitter(true)
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::standard()
                .backoff(Duration::from_nanos(1), Duration::MAX, u32::MAX)
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::standard()
                .max_retries(Some(u32::MAX))
                .max_wait(w),
            WAIT,
        ),
        (
            RetryPolicy::standard().max_wait(Some(Duration::ZERO)),
            Duration::ZERO,
        ),
        (
            RetryPolicy::standard().max_wait(Some(Duration::from_nanos(1))),
            Duration::ZERO,
        ),
        // A max_wait the clock cannot represent is no time limit: the 2 retries end it.
        (
            RetryPolicy::standard()
                .max_wait(Some(Duration::MAX))
                .max_retries(Some(2))
                .fixed_delay(Duration::from_millis(10)),
            Duration::from_millis(30),
        ),
        (RetryPolicy::no_wait(), Duration::ZERO),
        (RetryPolicy::legacy().max_retries(Some(0)), Duration::ZERO),
    ]
}

fn run_bounded(kind: Kind) {
    init_logging();
    let server = RedisServer::start();
    for (i, (policy, bound)) in bounded_policies().into_iter().enumerate() {
        blocked_calls(&server, kind, &format!("xs:{kind:?}:{i}"), policy, bound);
    }
}

#[test]
fn bounded_classic() {
    run_bounded(Kind::Classic);
}

#[test]
fn bounded_token_polling() {
    run_bounded(Kind::TokenPolling);
}

#[test]
fn bounded_token_pubsub() {
    run_bounded(Kind::TokenPubSub);
}

#[test]
fn bounded_reentrant() {
    run_bounded(Kind::Reentrant);
}

#[test]
fn bounded_read() {
    run_bounded(Kind::Read);
}

#[test]
fn bounded_write() {
    run_bounded(Kind::Write);
}

#[test]
fn bounded_redlock() {
    run_bounded(Kind::RedLock);
}

/// The panic: sleeps of `Duration::MAX` with one retry and no time limit. The waiter
/// sleeps until a release of its own client wakes the line (the documented bound: forever
/// otherwise), then takes the lock. Before the fix, `lock()` panicked with "overflow when
/// adding duration to instant".
#[test]
fn sleep_of_duration_max_waits_for_a_local_release() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    let policy = RetryPolicy::standard()
        .fixed_delay(Duration::MAX)
        .max_wait(None)
        .max_retries(Some(1));
    for kind in KINDS {
        let key = format!("xs:max-sleep:{kind:?}");
        let holder = make(holder_kind(kind), &c, &key, RetryPolicy::no_wait());
        let waiter = make(kind, &c, &key, policy.clone());
        let held = holder.get().try_lock().expect("holder");
        thread::scope(|s| {
            let t = s.spawn(|| {
                let start = Instant::now();
                let g = waiter.get().lock();
                (g.map(|g| g.unlock()), start.elapsed())
            });
            // Given time to return early, which it must not.
            thread::sleep(WAIT);
            let early = t.is_finished();
            assert!(held.unlock().expect("release"), "{kind:?}");
            let (r, took) = t.join().expect("no panic in lock()");
            if early {
                // Pub/sub waiters retry at once when their subscription is confirmed, which
                // uses up the one retry: a prompt Timeout after 2 attempts.
                assert!(
                    pubsub(kind),
                    "{kind:?}: polling waiters must still wait: {r:?}"
                );
                match r {
                    Err(LockError::Timeout { attempts: 2, .. }) => {}
                    other => panic!("{kind:?}: {other:?}"),
                }
            } else {
                assert!(matches!(r, Ok(Ok(true))), "{kind:?}: {r:?}");
            }
            assert!(took <= WAIT + SLACK, "{kind:?}: {took:?}");
        });
        // Against another client's hold, a caller deadline still ends the wait.
        let other = client(&server);
        let holder = make(holder_kind(kind), &other, &key, RetryPolicy::no_wait());
        let held = holder.get().try_lock().expect("holder");
        let start = Instant::now();
        let r = waiter.get().try_lock_for(WAIT);
        assert_timeout(r, start.elapsed(), WAIT);
        assert!(held.unlock().expect("release"), "{kind:?}");
    }
}

/// `try_lock_for(Duration::MAX)` waits without a deadline (documented as forever): it returns
/// the lock once the other client releases it.
#[test]
fn try_lock_for_duration_max_waits_until_released() {
    init_logging();
    let server = RedisServer::start();
    let (c1, c2) = (client(&server), client(&server));
    for kind in KINDS {
        let key = format!("xs:forever:{kind:?}");
        let holder = make(holder_kind(kind), &c1, &key, RetryPolicy::no_wait());
        let waiter = make(
            kind,
            &c2,
            &key,
            RetryPolicy::standard().fixed_delay(Duration::from_millis(10)),
        );
        let held = holder.get().try_lock().expect("holder");
        thread::scope(|s| {
            let t = s.spawn(|| {
                let g = waiter.get().try_lock_for(Duration::MAX);
                g.map(|g| g.unlock())
            });
            // Given time to return early, which it must not.
            thread::sleep(WAIT);
            assert!(!t.is_finished(), "{kind:?}: must wait while held");
            let released = Instant::now();
            assert!(held.unlock().expect("release"), "{kind:?}");
            let r = t.join().expect("no panic");
            assert!(matches!(r, Ok(Ok(true))), "{kind:?}: {r:?}");
            assert!(released.elapsed() <= SLACK, "{kind:?}");
        });
    }
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(r: redis_dlock::Result<T>, what: &str) {
    match r {
        Err(LockError::Config { key: Some(_), .. }) => {}
        other => panic!("{what}: expected a lock's Config error, got {other:?}"),
    }
}

#[track_caller]
fn assert_setup<T>(r: redis_dlock::Result<T>, what: &str) {
    match r {
        Err(e @ LockError::Config { key: None, .. }) => assert!(!e.is_contention(), "{what}"),
        Err(e) => panic!("{what}: expected a client's Config error, got {e}"),
        Ok(_) => panic!("{what}: expected a client's Config error, got a client"),
    }
}

/// What the builders refuse, and the extreme values they accept.
#[test]
fn builders_accept_or_reject_extremes() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server).c;
    for ttl in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        let what = format!("ttl {ttl:?}");
        assert_invalid(c.lock("xs:b").ttl(ttl).build(), &what);
        assert_invalid(
            c.lock("xs:b")
                .ttl(ttl)
                .strategy(Strategy::Classic(ClassicOptions::new()))
                .build(),
            &what,
        );
        assert_invalid(c.lock("xs:b").ttl(ttl).build(), &what);
        assert_invalid(
            c.lock("xs:b")
                .ttl(ttl)
                .strategy(Strategy::Reentrant)
                .build(),
            &what,
        );
        assert_invalid(c.rw_lock("xs:b").ttl(ttl).build(), &what);
        let red = RedLockClient::from_clients(vec![c.clone()])
            .build()
            .expect("redlock");
        assert_invalid(red.lock("xs:b").ttl(ttl).build(), &what);
    }
    let mut zero_factor = RetryPolicy::standard();
    zero_factor.backoff = 0;
    assert_invalid(c.lock("xs:b").retry(zero_factor).build(), "backoff 0");
    // Every retry value above is accepted by every builder (they ran in the other tests);
    // the longest lifetime is accepted too.
    c.lock("xs:b")
        .ttl(MAX_TTL)
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .expect("MAX_TTL");
    c.rw_lock("xs:b").ttl(MAX_TTL).build().expect("MAX_TTL");

    let url = server.url();
    for d in [
        Duration::MAX,
        redis_dlock::ClientBuilder::MAX_TIMEOUT + Duration::from_nanos(1),
    ] {
        assert_setup(
            LockClient::builder(&url).connect_timeout(d).build(),
            "connect timeout",
        );
        assert_setup(
            LockClient::builder(&url).command_timeout(Some(d)).build(),
            "command timeout",
        );
        assert_setup(
            RedLockClient::builder(&[&url]).node_timeout(d).build(),
            "node timeout",
        );
    }
    for d in [
        Duration::MAX,
        redis_dlock::ClientBuilder::MAX_HANDOFF_COURTESY + Duration::from_nanos(1),
    ] {
        assert_setup(
            LockClient::builder(&url).handoff_courtesy(d).build(),
            "courtesy",
        );
    }
    // The longest accepted timeouts work: one lock cycle.
    let long = LockClient::builder(&url)
        .connect_timeout(redis_dlock::ClientBuilder::MAX_TIMEOUT)
        .command_timeout(Some(redis_dlock::ClientBuilder::MAX_TIMEOUT))
        .handoff_courtesy(redis_dlock::ClientBuilder::MAX_HANDOFF_COURTESY)
        .build()
        .expect("longest timeouts");
    let l = long.lock("xs:b:long").ttl(HOLD).build().expect("lock");
    assert!(l.try_lock().expect("free").unlock().expect("unlock"));
    let red = RedLockClient::builder(&[&url])
        .node_timeout(redis_dlock::ClientBuilder::MAX_TIMEOUT)
        .build()
        .expect("longest node timeout");
    let l = red.lock("xs:b:red").ttl(HOLD).build().expect("lock");
    assert!(l.try_lock().expect("free").unlock().expect("unlock"));
}

/// `extend` with extreme lifetimes on every kind: out-of-range values are refused before
/// anything is sent, `MAX_TTL` is granted, and the hold stays ours.
#[test]
fn extend_with_extreme_lifetimes() {
    init_logging();
    let server = RedisServer::start();
    let c = client(&server);
    for kind in KINDS {
        let key = format!("xs:extend:{kind:?}");
        let lock = make(kind, &c, &key, RetryPolicy::no_wait());
        let mut g = lock.get().try_lock().expect("free");
        for ttl in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            assert_invalid(g.extend(ttl), &format!("{kind:?} extend {ttl:?}"));
        }
        let start = Instant::now();
        g.extend(MAX_TTL).expect("MAX_TTL");
        g.extend(HOLD).expect("back to 30 s");
        assert!(g.is_held().expect("is_held"), "{kind:?}");
        // Last: a 1 ms lifetime may run out before the next command on a loaded machine.
        g.extend(Duration::from_millis(1) + Duration::from_nanos(1))
            .or_else(|e| match e {
                // RedLock refuses a lifetime within its drift allowance.
                LockError::Config { .. } if kind == Kind::RedLock => Ok(()),
                e => Err(e),
            })
            .expect("1 ms");
        assert!(start.elapsed() <= SLACK, "{kind:?}");
        // The 1 ms lease may be gone by now, so `unlock()` may say it was no longer ours
        // (a loaded CI machine did); RedLock kept its 30 s lease and must say it was.
        let ours = g.unlock().expect("unlock");
        assert!(ours || kind != Kind::RedLock, "{kind:?}");
        // Either way, the lock is free now.
        assert!(
            lock.get()
                .try_lock()
                .expect("free again")
                .unlock()
                .expect("unlock"),
            "{kind:?}"
        );
    }
}

fn channel(key: &str) -> String {
    format!("redisson_lock__channel:{{{key}}}")
}

/// The longest handoff courtesy: `unlock()` heard by another client's waiter returns at once
/// (before the fix, `Duration::MAX` panicked there), and the releasing client's next blocking
/// call waits no longer than its own deadline (before, the whole courtesy).
#[test]
fn handoff_courtesy_is_bounded_by_the_deadline() {
    init_logging();
    let server = RedisServer::start();
    let key = "xs:courtesy";
    let a = LockClient::builder(server.url())
        .handoff_courtesy(redis_dlock::ClientBuilder::MAX_HANDOFF_COURTESY)
        .build()
        .expect("client");
    let b = client(&server).c;
    let la = a.lock(key).ttl(HOLD).build().expect("lock");
    let lb = b.lock(key).ttl(HOLD).build().expect("lock");
    let mut conn = server.conn();
    let held = la.try_lock().expect("free");
    thread::scope(|s| {
        let waiter = s.spawn(|| lb.try_lock_for(Duration::from_secs(20)).map(|g| g.unlock()));
        assert!(
            wait_until(SLACK, || raw::numsub(&mut conn, &channel(key)) >= 1),
            "b's waiter never subscribed"
        );
        let start = Instant::now();
        assert!(held.unlock().expect("unlock"));
        assert!(
            start.elapsed() <= SLACK,
            "unlock took {:?}",
            start.elapsed()
        );
        let r = waiter.join().expect("no panic");
        assert!(matches!(r, Ok(Ok(true))), "{r:?}");
    });
    // a's release was heard by b: a's next blocking call owes a courtesy of 1 s, but its
    // deadline is 50 ms. b released already, so a gets the lock after its deadline-bounded
    // courtesy.
    let start = Instant::now();
    let g = la.try_lock_for(Duration::from_millis(50)).expect("free");
    let took = start.elapsed();
    assert!(g.unlock().expect("unlock"));
    assert!(
        took < redis_dlock::ClientBuilder::MAX_HANDOFF_COURTESY - Duration::from_millis(100),
        "the courtesy ran past the 50 ms deadline: {took:?}"
    );
}

/// `fixed_delay(0)` with polling: one waiter sends at most one attempt per
/// `redis_dlock::RetryPolicy::MIN_DELAY`, not tens of thousands a second.
#[test]
fn zero_delay_polling_is_floored() {
    init_logging();
    let server = RedisServer::start();
    let (c1, c2) = (client(&server), client(&server));
    let mut conn = server.conn();
    let wait = Duration::from_millis(500);
    let most = (wait.as_nanos() / redis_dlock::RetryPolicy::MIN_DELAY.as_nanos()) as i64;
    for kind in [Kind::Classic, Kind::TokenPolling] {
        let key = format!("xs:floor:{kind:?}");
        let holder = make(kind, &c1, &key, RetryPolicy::no_wait());
        let waiter = make(
            kind,
            &c2,
            &key,
            RetryPolicy::standard().fixed_delay(Duration::ZERO),
        );
        let held = holder.get().try_lock().expect("holder");
        // Classic's attempt is SETNX then GET; Token's one EVALSHA, or on a server with
        // DELIFEQ (Valkey 9.0+) SET … NX PX … GET pipelined with PTTL.
        let command = if kind == Kind::Classic {
            "setnx"
        } else if support::server_kind().has_native_token() {
            "pttl"
        } else {
            "evalsha"
        };
        let before = raw::command_calls(&mut conn, command);
        let start = Instant::now();
        let r = waiter.get().try_lock_for(wait);
        assert_timeout(r, start.elapsed(), wait);
        let attempts = raw::command_calls(&mut conn, command) - before;
        assert!(
            attempts >= 2,
            "{kind:?}: the waiter polled only {attempts} times"
        );
        assert!(
            attempts <= most + 10,
            "{kind:?}: {attempts} attempts in {wait:?} (floor {:?})",
            redis_dlock::RetryPolicy::MIN_DELAY
        );
        assert!(held.unlock().expect("release"));
    }
}

/// Classic waiters of one client queued behind a head whose attempt hangs on a frozen server
/// (SIGSTOP): they give up with a failure that is not contention, naming the cause, within
/// their deadline plus the attempt under way (the command timeout).
#[test]
fn waiters_behind_an_outage_do_not_report_contention() {
    outage(Some(Duration::from_secs(2)));
}

/// The same without a command timeout: the head's attempt never ends while the server is
/// frozen; the queued threads still give up (deadline plus at most as long again, at least
/// 1 s) with a failure that is not contention.
#[test]
fn waiters_behind_an_outage_without_command_timeout() {
    outage(None);
}

fn outage(command_timeout: Option<Duration>) {
    init_logging();
    let server = RedisServer::start();
    let key = "xs:outage";
    let other = client(&server).c;
    let holder = other
        .lock(key)
        .ttl(HOLD)
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .expect("lock");
    let held = holder.try_lock().expect("free");
    let c = LockClient::builder(server.url())
        .command_timeout(command_timeout)
        .build()
        .expect("client");
    // The legacy policy: 5 retries 200 ms apart, so a queued thread gives up after 1.2 s,
    // before the head's hanging attempt times out.
    let lock = c
        .lock(key)
        .ttl(HOLD)
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .expect("lock");
    let deadline = Duration::from_millis(1200);
    let bound = deadline + command_timeout.unwrap_or(deadline);
    let run = || {
        let start = Instant::now();
        (lock.lock().map(|g| g.unlock()), start.elapsed())
    };
    let (head, queued) = thread::scope(|s| {
        let head = s.spawn(run);
        // The head's first attempt is refused (held), then it sleeps 200 ms in the line.
        support::wait_event(&c, Event::Queued, 1);
        server.pause();
        let queued: Vec<_> = (0..3).map(|_| s.spawn(run)).collect();
        let queued: Vec<_> = queued
            .into_iter()
            .map(|t| t.join().expect("no panic"))
            .collect();
        // Without a command timeout the head waits for the server.
        server.resume();
        (head.join().expect("no panic"), queued)
    });
    for (r, took) in &queued {
        match r {
            Err(e @ LockError::Connection { .. }) => {
                assert!(!e.is_contention());
                let why = e.report();
                assert!(
                    why.contains("other thread") || why.contains("timed out"),
                    "{why}"
                );
            }
            other => panic!("expected a connection failure, got {other:?}"),
        }
        assert!(*took <= bound + SLACK, "took {took:?}");
    }
    match (command_timeout, &head.0) {
        (Some(_), Err(e @ LockError::Connection { .. })) => {
            assert!(!e.is_contention());
            assert!(head.1 <= bound + SLACK, "took {:?}", head.1);
        }
        // Answered once the server is back: the lock is still held by the other client.
        (None, Err(LockError::Timeout { .. })) => {}
        (_, other) => panic!("head: {other:?}"),
    }
    assert!(held.unlock().expect("unlock after the outage"));
}

/// Classic `extend` on a full server (`maxmemory` reached, `noeviction`): the compare-and-set
/// script is flagged `allow-oom` (Redis 7+), so the hold is renewed like Token's.
#[test]
fn classic_extend_on_a_full_server() {
    init_logging();
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let c = client(&server).c;
    let mut conn = server.conn();
    let classic = c
        .lock("xs:oom:classic")
        .ttl(HOLD)
        .strategy(Strategy::Classic(ClassicOptions::new()))
        .build()
        .expect("lock");
    let classic_ttl = c
        .lock("xs:oom:classic-px")
        .ttl(HOLD)
        .strategy(Strategy::Classic(ClassicOptions::new().key_ttl(true)))
        .build()
        .expect("lock");
    let token = c.lock("xs:oom:token").ttl(HOLD).build().expect("lock");
    let mut guards = vec![
        classic.try_lock().expect("free"),
        classic_ttl.try_lock().expect("free"),
        token.try_lock().expect("free"),
    ];
    // Full: the limit below what is in use, so every write that needs memory is refused.
    let used: i64 = support::info_field(&mut conn, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg((used / 2).max(1).to_string())
        .query(&mut conn)
        .expect("CONFIG SET maxmemory");
    // Negative controls: a plain SET and the flagless script are refused with OOM.
    let set: redis::RedisResult<()> = redis::cmd("SET").arg("xs:oom:x").arg("1").query(&mut conn);
    assert!(
        set.as_ref().is_err_and(|e| e.to_string().contains("OOM")),
        "{set:?}"
    );
    let value = guards[0].value().to_vec();
    let plain: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg(include_str!("../lua/compare_and_set.lua"))
        .arg(1)
        .arg("xs:oom:classic")
        .arg(&value[..])
        .arg(&value[..])
        .arg(0)
        .query(&mut conn);
    assert!(
        plain.as_ref().is_err_and(|e| e.to_string().contains("OOM")),
        "{plain:?}"
    );
    for g in &mut guards {
        g.extend(Duration::from_secs(20))
            .expect("extend on a full server");
        assert!(g.is_held().expect("is_held"));
    }
    // A Classic extend writes a new expiry: the stored value changed.
    assert_ne!(
        raw::get(&mut conn, "xs:oom:classic").as_deref(),
        Some(&value[..])
    );
    assert!(raw::pttl(&mut conn, "xs:oom:classic-px") > 15_000);
    for g in guards {
        assert!(g.unlock().expect("unlock on a full server"));
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut conn)
        .expect("CONFIG SET maxmemory 0");
}
