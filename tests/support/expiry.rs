//! The wall clock and the expiry-timestamp values of Classic (and legacy) locks.

use std::time::{SystemTime, UNIX_EPOCH};

use redis_dlock::Encoding;

/// Milliseconds since the Unix epoch (Java `System.currentTimeMillis()`).
pub fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// An expiry timestamp as a Classic lock stores it.
pub fn encode(encoding: Encoding, ms: i64) -> Vec<u8> {
    match encoding {
        Encoding::BigEndian => ms.to_be_bytes().to_vec(),
        _ => ms.to_string().into_bytes(),
    }
}

/// A stored expiry timestamp, read the way the legacy lockers read it; panics on a malformed
/// value.
pub fn decode(encoding: Encoding, v: &[u8]) -> i64 {
    match encoding {
        Encoding::BigEndian => {
            i64::from_be_bytes(v.try_into().unwrap_or_else(|_| panic!("8 bytes: {v:?}")))
        }
        _ => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("decimal: {:?}", String::from_utf8_lossy(v))),
    }
}
