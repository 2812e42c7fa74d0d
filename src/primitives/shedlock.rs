//! ShedLock's key and value format ([`Strategy::ShedLock`](crate::Strategy::ShedLock)), so that
//! a Rust job and a Java `@SchedulerLock` job of the same name never both run.
//!
//! ShedLock's Redis providers (`RedisLockProvider`, the Jedis and Lettuce ones): the key is
//! `<prefix>:<env>:<name>` (prefix `job-lock`, env `default`), the value
//! `ADDED:<ISO-8601 UTC with milliseconds>@<hostname>:<uuid>` (providers before the UUID was
//! added write `ADDED:<time>@<hostname>`). Lock: `SET key value NX PX <lockAtMostFor>`, no
//! waiting: a busy job is skipped. Unlock: while `lockAtLeastFor` has not passed,
//! `SET key value XX PX <the rest of it>`, else `DEL`; neither checks the owner unless the
//! provider's safe update is on (then both are compare-first scripts).
//!
//! A lock in this format keeps Token's protocol (its release and extend check the owner
//! first); [`LockBuilder::lock_at_least`](crate::LockBuilder::lock_at_least) is ShedLock's
//! `lockAtLeastFor`, and the lock's lease its `lockAtMostFor`.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::client::LockClient;
use crate::primitives::token::Dialect;

/// The key ShedLock's Redis providers lock for the job `name` in environment `env` (ShedLock's
/// default environment is `default`) with the default prefix: `job-lock:<env>:<name>`.
pub fn shedlock_key(env: &str, name: &str) -> String {
    format!("job-lock:{env}:{name}")
}

/// True for a value in ShedLock's format: `ADDED:<time>@<hostname>[:<uuid>]`.
pub(crate) fn recognizes(value: &[u8]) -> bool {
    value.starts_with(b"ADDED:") && value.contains(&b'@')
}

/// Token's protocol with ShedLock's values; the release publishes as Token's does (ShedLock
/// neither publishes nor listens).
pub(crate) fn dialect(channel: &str) -> Dialect {
    Dialect {
        new_value: |_: &LockClient| value(SystemTime::now()).into_bytes(),
        shedlock: true,
        ..Dialect::token(channel)
    }
}

/// ShedLock's value for a lock taken at `now` on this host.
fn value(now: SystemTime) -> String {
    format!(
        "ADDED:{}@{}:{}",
        iso_millis(now),
        hostname(),
        crate::ids::new_uuid()
    )
}

/// `now` as ShedLock's `Utils.toIsoString` writes it: UTC, always three fractional digits.
fn iso_millis(now: SystemTime) -> String {
    let ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let secs = ms_of_day / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms_of_day % 1000
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The host's name, as Java's `InetAddress.getLocalHost().getHostName()` usually gives it;
/// `unknown` when it cannot be read (ShedLock's fallback).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_owned())
        // At most HOST_NAME_MAX (64) bytes, so that the value fits a lease.
        .filter(|h| !h.is_empty() && h.len() <= 64)
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn values_follow_shedlock() {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_261_605_007);
        assert_eq!(iso_millis(at), "2025-11-27T16:40:05.007Z");
        assert_eq!(iso_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            iso_millis(UNIX_EPOCH + Duration::from_millis(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
        let v = value(at);
        let rest = v
            .strip_prefix("ADDED:2025-11-27T16:40:05.007Z@")
            .unwrap_or_else(|| panic!("{v}"));
        let (host, uuid) = rest.rsplit_once(':').expect("host:uuid");
        assert!(!host.is_empty());
        assert_eq!(uuid.len(), 36);
        assert_eq!(shedlock_key("default", "report"), "job-lock:default:report");
    }
}
