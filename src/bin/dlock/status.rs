//! `dlock status` and `dlock release --force`: plain Redis commands on one connection (to the
//! server, the master the Sentinels name, or the Cluster).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{Connection, ConnectionLike, RedisError};
use redis_dlock::{Recognized, Strategy};

use crate::args::{name_of, Deployment, Target, ENCODINGS};
use crate::{chain, code, redact, Failure};

/// Time allowed to connect and for each reply.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Prefix of the channel on which releases are announced (Redisson's, as the library's).
const CHANNEL_PREFIX: &str = "redisson_lock__channel";

/// A connection to where `target`'s key lives: the server of `--url`, the master the
/// Sentinels name, or the Cluster (each command routed by its key).
fn connect(target: &Target) -> Result<Box<dyn ConnectionLike>, Failure> {
    let open = |url: &str| {
        redis::Client::open(url)
            .map_err(|e| Failure::new(code::USAGE, format!("bad Redis URL {}: {e}", redact(url))))
    };
    let single = |client: redis::Client| -> Result<Connection, Failure> {
        let conn = client
            .get_connection_with_timeout(TIMEOUT)
            .map_err(|e| unavailable(&target.url, &e))?;
        conn.set_read_timeout(Some(TIMEOUT))
            .and_then(|()| conn.set_write_timeout(Some(TIMEOUT)))
            .map_err(|e| unavailable(&target.url, &e))?;
        Ok(conn)
    };
    match &target.deployment {
        Deployment::Single => Ok(Box::new(single(open(&target.url)?)?)),
        Deployment::Sentinel { sentinels, master } => {
            let mut last = None;
            for url in sentinels {
                let named: Result<Option<(String, u16)>, Failure> =
                    single(open(url)?).and_then(|mut c| {
                        redis::cmd("SENTINEL")
                            .arg("GET-MASTER-ADDR-BY-NAME")
                            .arg(master)
                            .query(&mut c)
                            .map_err(|e| unavailable(url, &e))
                    });
                match named {
                    Ok(Some((host, port))) => {
                        // Reached as the Sentinel is: over TLS when its URL is rediss://.
                        let scheme = if url.starts_with("rediss://") {
                            "rediss"
                        } else {
                            "redis"
                        };
                        return Ok(Box::new(single(open(&format!(
                            "{scheme}://{host}:{port}/"
                        ))?)?));
                    }
                    Ok(None) => {
                        last = Some(Failure::new(
                            code::UNAVAILABLE,
                            format!("the Sentinel at {} knows no master {master:?}", redact(url)),
                        ))
                    }
                    Err(f) => last = Some(f),
                }
            }
            Err(last.unwrap_or_else(|| Failure::new(code::USAGE, "no Sentinel given")))
        }
        Deployment::Cluster(nodes) => {
            let conn = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(TIMEOUT)
                .response_timeout(TIMEOUT)
                .build()
                .and_then(|c| c.get_connection())
                .map_err(|e| unavailable(&target.url, &e))?;
            Ok(Box::new(conn))
        }
    }
}

fn unavailable(url: &str, e: &RedisError) -> Failure {
    let url = redact(url);
    let what = if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
    {
        "authentication failed"
    } else if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        "cannot reach Redis"
    } else {
        "Redis refused the command"
    };
    Failure::new(code::UNAVAILABLE, format!("{what} at {url}: {}", chain(e)))
}

fn query<T: redis::FromRedisValue>(
    conn: &mut dyn ConnectionLike,
    target: &Target,
    cmd: &redis::Cmd,
) -> Result<T, Failure> {
    cmd.query(conn).map_err(|e| unavailable(&target.url, &e))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn seconds(ms: i64) -> String {
    format!("{:.3}s", ms as f64 / 1000.0)
}

/// The key's Redis TTL as a line.
fn ttl_line(pttl: i64) -> String {
    match pttl {
        -1 => "ttl: none (the key has no Redis TTL)".to_owned(),
        ms if ms >= 0 => format!("ttl: {}", seconds(ms)),
        _ => "ttl: gone".to_owned(),
    }
}

/// Prints what holds the lock; exit 0 when held, 1 when free.
pub fn status(target: &Target) -> Result<u8, Failure> {
    let mut conn = connect(target)?;
    let key = &target.key;
    let kind: String = query(conn.as_mut(), target, redis::cmd("TYPE").arg(key))?;
    println!("key: {key}");
    match kind.as_str() {
        "none" => {
            println!("free");
            Ok(code::FREE)
        }
        "string" => {
            let value: Option<Vec<u8>> = query(conn.as_mut(), target, redis::cmd("GET").arg(key))?;
            let pttl: i64 = query(conn.as_mut(), target, redis::cmd("PTTL").arg(key))?;
            let Some(value) = value else {
                println!("free");
                return Ok(code::FREE);
            };
            let holder = value.escape_ascii().to_string();
            // The library tells its strategies' values apart.
            match Strategy::recognize(&value) {
                Some(Recognized::Token) => {
                    println!("kind: token\nholder: {holder}\n{}", ttl_line(pttl));
                    Ok(0)
                }
                Some(Recognized::Spring) => {
                    println!(
                        "kind: spring (a RedisLockRegistry instance's id)\nholder: {holder}\n{}",
                        ttl_line(pttl)
                    );
                    Ok(0)
                }
                Some(Recognized::ShedLock) => {
                    println!(
                        "kind: shedlock (a scheduled job's lock)\nholder: {holder}\n{}",
                        ttl_line(pttl)
                    );
                    Ok(0)
                }
                Some(Recognized::Fair) => {
                    println!("kind: fair\nholder: {holder}\n{}", ttl_line(pttl));
                    // Named as the library names it; a key no queue can share a slot with
                    // has no fair lock (building one fails).
                    if let Ok(queue) = redis_dlock::FairLock::queue_key_for(key) {
                        let waiting: i64 =
                            query(conn.as_mut(), target, redis::cmd("ZCARD").arg(&queue))?;
                        println!("waiters: {waiting} (queued in {queue})");
                    }
                    Ok(0)
                }
                Some(Recognized::Classic {
                    expiry_ms,
                    encoding,
                }) => {
                    let left = expiry_ms - now_ms();
                    println!(
                        "kind: classic ({})\nholder: {holder}\nexpiry: {expiry_ms} (epoch ms)",
                        name_of(ENCODINGS, &encoding).unwrap_or("another encoding"),
                    );
                    if pttl != -1 {
                        println!("key {}", ttl_line(pttl));
                    }
                    if left >= 0 {
                        println!("ttl: {}", seconds(left));
                        Ok(0)
                    } else {
                        println!(
                            "expired: {} ago (stale: the next locker takes it over)",
                            seconds(-left)
                        );
                        Ok(code::FREE)
                    }
                }
                _ => {
                    println!(
                        "kind: string (not a format dlock knows)\nholder: {holder}\n{}",
                        ttl_line(pttl)
                    );
                    Ok(0)
                }
            }
        }
        "hash" => {
            let fields: Vec<(Vec<u8>, Vec<u8>)> =
                query(conn.as_mut(), target, redis::cmd("HGETALL").arg(key))?;
            let pttl: i64 = query(conn.as_mut(), target, redis::cmd("PTTL").arg(key))?;
            println!("kind: hash (reentrant lock: owner -> hold count)");
            for (field, count) in &fields {
                println!(
                    "holder: {} (count {})",
                    field.escape_ascii(),
                    count.escape_ascii()
                );
            }
            println!("{}", ttl_line(pttl));
            Ok(if fields.is_empty() { code::FREE } else { 0 })
        }
        other => {
            let pttl: i64 = query(conn.as_mut(), target, redis::cmd("PTTL").arg(key))?;
            println!("kind: {other} (not a lock)\n{}", ttl_line(pttl));
            Ok(0)
        }
    }
}

/// The release channel of `key`: `<prefix>:{key}`, or `<prefix>:key` when the key already has
/// braces (Redisson's rule, which the library follows).
fn channel(key: &str) -> String {
    if key.contains('{') {
        format!("{CHANNEL_PREFIX}:{key}")
    } else {
        format!("{CHANNEL_PREFIX}:{{{key}}}")
    }
}

/// Deletes the lock whoever holds it, and announces the release to waiters.
pub fn release(target: &Target) -> Result<u8, Failure> {
    let mut conn = connect(target)?;
    let key = &target.key;
    let deleted: i64 = query(conn.as_mut(), target, redis::cmd("DEL").arg(key))?;
    if deleted == 0 {
        println!("{key}: no lock to release");
        return Ok(code::FREE);
    }
    // Best effort: waiters woken by pub/sub try at once instead of at their next poll.
    let published: Result<i64, Failure> = query(
        conn.as_mut(),
        target,
        redis::cmd("PUBLISH").arg(channel(key)).arg("0"),
    );
    if let Err(f) = published {
        crate::say!("released, but could not wake the waiters: {}", f.message);
    }
    println!("{key}: released");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_channels() {
        assert_eq!(channel("a"), "redisson_lock__channel:{a}");
        assert_eq!(channel("{a}b"), "redisson_lock__channel:{a}b");
    }
}
