//! Owner ids of the hash-based locks: `<instance>:<thread>`, as Redisson writes them
//! (`<UUID of the Redisson instance>:<Java thread id>`).
//!
//! The instance part is a random UUID (version 4, in its 36-character text form) per
//! [`LockClient`](crate::LockClient); the thread part is a process-unique number assigned to a
//! thread on first use and never reused. So threads are distinct owners, and one thread that
//! asks again through the same client is the same owner (re-entry).

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

/// Length of a UUID in text form.
#[cfg(test)]
pub(crate) const UUID_LEN: usize = 36;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number: process-unique, assigned on first use, never reused.
    static THREAD_NUM: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's number in owner ids.
pub(crate) fn thread_num() -> u64 {
    THREAD_NUM.with(|n| *n)
}

/// A random version-4 UUID in text form, e.g. `8743c9c0-0795-4907-87fd-6c719a6b4586`.
pub(crate) fn new_uuid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The owner id of the calling thread for the client with instance id `instance`.
pub(crate) fn owner_id(instance: &str) -> String {
    format!("{instance}:{}", thread_num())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_shape_and_owner_ids() {
        let u = new_uuid();
        assert_eq!(u.len(), UUID_LEN);
        assert_eq!(u.as_bytes()[14], b'4');
        assert_ne!(u, new_uuid());
        let here = owner_id(&u);
        assert_eq!(here, owner_id(&u));
        let there = std::thread::spawn(move || owner_id(&u)).join().expect("thread");
        assert_ne!(here, there);
    }
}
