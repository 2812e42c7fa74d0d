//! When and how long a blocking acquire waits between attempts.

use std::time::{Duration, Instant};

use rand::RngExt;

/// How a blocking [`lock`](crate::DistributedLock::lock) retries.
///
/// An acquire makes one attempt, then sleeps and retries until the lock is taken, `max_retries`
/// retries have been made, or `max_wait` has passed since the call, whichever comes first.
/// [`try_lock_for`](crate::DistributedLock::try_lock_for) uses the caller's duration instead of
/// both limits. Sleeps start at `delay`, grow by `backoff` after each failed attempt up to
/// `max_delay`, and with `jitter` each sleep is drawn uniformly from `[d/2, d]` so waiters that
/// started together spread out. A sleep never runs past the deadline; the last attempt is made
/// at the deadline. No sleep is shorter than [`RetryPolicy::MIN_DELAY`](crate::RetryPolicy::MIN_DELAY) (except the last one, cut by
/// the deadline).
///
/// Bounds with extreme values, all accepted:
/// - `max_wait(None)` and `max_retries(None)` together: [`lock`](crate::DistributedLock::lock)
///   waits forever ([`is_unbounded`](Self::is_unbounded)).
/// - a `max_wait` whose deadline the platform's clock cannot represent (e.g. `Duration::MAX`)
///   counts as no time limit.
/// - with only `max_retries`, a thread waiting behind other threads of its client gives up
///   after `max_delay × (max_retries + 1)` (saturating); with a `delay` of `Duration::MAX`
///   that is forever, and each sleep lasts until a release wakes the line (a release by the
///   same client, or for pub/sub waiters a published one).
/// - `max_retries(Some(u32::MAX))` is as good as no count limit.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retries after the first attempt; `None` means no count limit.
    pub max_retries: Option<u32>,
    /// Longest total wait; `None` means no time limit.
    pub max_wait: Option<Duration>,
    /// First sleep between attempts.
    pub delay: Duration,
    /// Longest sleep between attempts.
    pub max_delay: Duration,
    /// Factor applied to the sleep after each failed attempt (1 = constant).
    pub backoff: u32,
    /// Randomise each sleep within `[d/2, d]`.
    pub jitter: bool,
}

impl RetryPolicy {
    /// The shortest sleep between two attempts of a polling wait: 1 ms.
    ///
    /// The shortest sleep between two polling attempts of one waiter, whatever the policy says
    /// (`fixed_delay(Duration::ZERO)` included): without it a single waiter would send tens of
    /// thousands of commands a second. It does not delay the first attempt, a waiter woken by a
    /// release of its own client or by a published release, nor the immediate retry right after a
    /// fresh pub/sub subscription is confirmed.
    pub const MIN_DELAY: Duration = Duration::from_millis(1);

    /// The legacy lockers' policy: 5 retries, a constant 200 ms sleep, no
    /// jitter; about one second of waiting in all. The default for
    /// [`Strategy::Classic`](crate::Strategy::Classic).
    pub fn legacy() -> Self {
        Self::standard()
            .max_retries(Some(5))
            .max_wait(None)
            .fixed_delay(Duration::from_millis(200))
            .jitter(false)
    }

    /// Waits up to 10 s, sleeping 4 ms at first, doubling to at most 32 ms, with jitter. The
    /// default for [`Strategy::Token`](crate::Strategy::Token): a released lock is seen within
    /// ~32 ms by every waiter.
    pub fn standard() -> Self {
        RetryPolicy {
            max_retries: None,
            max_wait: Some(Duration::from_secs(10)),
            delay: Duration::from_millis(4),
            max_delay: Duration::from_millis(32),
            backoff: 2,
            jitter: true,
        }
    }

    /// Only ever one attempt: `lock()` behaves like `try_lock()`.
    pub fn no_wait() -> Self {
        Self::standard().max_retries(Some(0))
    }

    /// Sets the retry count limit (`None` for none).
    #[must_use]
    pub fn max_retries(mut self, n: Option<u32>) -> Self {
        self.max_retries = n;
        self
    }

    /// Sets the total wait limit (`None` for none).
    #[must_use]
    pub fn max_wait(mut self, d: Option<Duration>) -> Self {
        self.max_wait = d;
        self
    }

    /// Sets a constant sleep `d` between attempts (no backoff).
    #[must_use]
    pub fn fixed_delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self.max_delay = d;
        self.backoff = 1;
        self
    }

    /// Sets exponential backoff from `first` to `max` by `factor`.
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration, factor: u32) -> Self {
        self.delay = first;
        self.max_delay = max;
        self.backoff = factor;
        self
    }

    /// Turns jitter on or off.
    #[must_use]
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// True when the policy could wait forever.
    pub fn is_unbounded(&self) -> bool {
        self.max_retries.is_none() && self.max_wait.is_none()
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_delay < self.delay {
            return Err("retry max_delay is shorter than delay".into());
        }
        if self.backoff == 0 {
            return Err("retry backoff factor must be at least 1".into());
        }
        Ok(())
    }
}

/// The state of one blocking acquire: attempts made, time left, next sleep.
#[derive(Debug)]
pub(crate) struct Attempts<'a> {
    policy: &'a RetryPolicy,
    started: Instant,
    deadline: Option<Instant>,
    max_retries: Option<u32>,
    made: u32,
    next_delay: Duration,
}

impl<'a> Attempts<'a> {
    /// Limits from the policy.
    pub(crate) fn new(policy: &'a RetryPolicy) -> Self {
        Self::with_limits(policy, policy.max_wait, policy.max_retries)
    }

    /// The caller's wait instead of the policy's limits (no deadline when it cannot be
    /// represented: a wait of `Duration::MAX` is a wait forever).
    pub(crate) fn for_duration(policy: &'a RetryPolicy, wait: Duration) -> Self {
        Self::with_limits(policy, Some(wait), None)
    }

    fn with_limits(policy: &'a RetryPolicy, wait: Option<Duration>, retries: Option<u32>) -> Self {
        Attempts {
            policy,
            started: Instant::now(),
            deadline: wait.and_then(crate::time::deadline_after),
            max_retries: retries,
            made: 0,
            next_delay: policy.delay,
        }
    }

    /// Counts an attempt about to be made.
    pub(crate) fn record(&mut self) {
        self.made = self.made.saturating_add(1);
    }

    /// Attempts made so far.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }

    /// Time since the acquire started.
    pub(crate) fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// How long a thread may wait in the in-process line before its first own attempt: the
    /// deadline, or for a count-limited policy the longest its retries could take.
    pub(crate) fn queue_deadline(&self) -> Option<Instant> {
        self.deadline.or_else(|| {
            let attempts = self.max_retries?.saturating_add(1);
            let longest = self.policy.max_delay.saturating_mul(attempts);
            self.started.checked_add(longest)
        })
    }

    /// After a failed attempt: how long to sleep before the next one, or `None` to give up.
    pub(crate) fn next_sleep(&mut self) -> Option<Duration> {
        let retries_made = self.made.saturating_sub(1);
        if self.max_retries.is_some_and(|max| retries_made >= max) {
            return None;
        }
        let mut sleep = self.next_delay;
        if self.policy.jitter && !sleep.is_zero() {
            let half = sleep / 2;
            sleep = half.saturating_add(rand::rng().random_range(Duration::ZERO..=sleep - half));
        }
        sleep = sleep.max(RetryPolicy::MIN_DELAY);
        let grown = self.next_delay.saturating_mul(self.policy.backoff);
        self.next_delay = grown.min(self.policy.max_delay);
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            sleep = sleep.min(left);
        }
        Some(sleep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_allows_five_retries_at_200ms() {
        let p = RetryPolicy::legacy();
        let mut a = Attempts::new(&p);
        let mut sleeps = vec![];
        loop {
            a.record();
            match a.next_sleep() {
                Some(d) => sleeps.push(d),
                None => break,
            }
        }
        assert_eq!(a.made(), 6);
        assert_eq!(sleeps, vec![Duration::from_millis(200); 5]);
    }

    #[test]
    fn backoff_grows_to_max_and_jitter_stays_in_range() {
        let p = RetryPolicy::standard().max_wait(None).max_retries(Some(20));
        let mut a = Attempts::new(&p);
        let mut last = Duration::ZERO;
        for i in 0..20 {
            a.record();
            let d = a.next_sleep().expect("within retry limit");
            let nominal = (p.delay * 2u32.pow(i.min(3))).min(p.max_delay);
            assert!(d >= nominal / 2 && d <= nominal, "{d:?} vs {nominal:?}");
            last = d;
        }
        assert!(last <= p.max_delay);
        a.record();
        assert_eq!(a.next_sleep(), None);
    }

    #[test]
    fn deadline_caps_sleep() {
        let p = RetryPolicy::legacy();
        let mut a = Attempts::for_duration(&p, Duration::from_millis(50));
        a.record();
        let d = a.next_sleep().expect("deadline not reached");
        assert!(d <= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        a.record();
        assert_eq!(a.next_sleep(), None);
    }

    #[test]
    fn zero_delay_is_floored() {
        let p = RetryPolicy::standard().fixed_delay(Duration::ZERO);
        let mut a = Attempts::new(&p);
        for _ in 0..5 {
            a.record();
            assert_eq!(a.next_sleep(), Some(RetryPolicy::MIN_DELAY));
        }
        // With jitter a 1 ns delay would draw 0 or 1 ns: floored as well.
        let p = RetryPolicy::standard()
            .fixed_delay(Duration::from_nanos(1))
            .jitter(true);
        let mut a = Attempts::new(&p);
        a.record();
        assert_eq!(a.next_sleep(), Some(RetryPolicy::MIN_DELAY));
    }

    #[test]
    fn extreme_values_saturate() {
        // A deadline the clock cannot represent is no deadline.
        let p = RetryPolicy::standard().max_wait(Some(Duration::MAX));
        let a = Attempts::new(&p);
        assert_eq!(a.deadline, None);
        assert_eq!(a.queue_deadline(), None);
        let a = Attempts::for_duration(&p, Duration::MAX);
        assert_eq!(a.queue_deadline(), None);
        // Sleeps of Duration::MAX, with and without jitter, and a retry limit: no overflow.
        for jitter in [false, true] {
            let p = RetryPolicy::standard()
                .fixed_delay(Duration::MAX)
                .jitter(jitter)
                .max_wait(None)
                .max_retries(Some(1));
            let mut a = Attempts::new(&p);
            // max_delay × 2 saturates to Duration::MAX: no representable deadline.
            assert_eq!(a.queue_deadline(), None);
            a.record();
            let d = a.next_sleep().expect("one retry allowed");
            assert!(d >= Duration::MAX / 2, "{d:?}");
            a.record();
            assert_eq!(a.next_sleep(), None);
        }
        // u32::MAX retries and a backoff factor of u32::MAX: the delay saturates at max_delay.
        let p = RetryPolicy::standard()
            .backoff(Duration::from_millis(1), Duration::MAX, u32::MAX)
            .jitter(false)
            .max_wait(None)
            .max_retries(Some(u32::MAX));
        let mut a = Attempts::new(&p);
        let mut last = Duration::ZERO;
        for _ in 0..4 {
            a.record();
            last = a.next_sleep().expect("far from the retry limit");
        }
        assert_eq!(last, Duration::MAX);
        // The queue deadline of u32::MAX retries of 1 ms: about 50 days, representable.
        let p = RetryPolicy::legacy()
            .fixed_delay(Duration::from_millis(1))
            .max_retries(Some(u32::MAX));
        let a = Attempts::new(&p);
        let qd = a.queue_deadline().expect("representable");
        assert!(qd > Instant::now() + Duration::from_secs(40 * 24 * 3600));
    }

    #[test]
    fn validation() {
        assert!(RetryPolicy::standard().validate().is_ok());
        let bad =
            RetryPolicy::standard().backoff(Duration::from_millis(10), Duration::from_millis(1), 2);
        assert!(bad.validate().is_err());
        assert!(RetryPolicy::standard().max_wait(None).is_unbounded());
    }
}
