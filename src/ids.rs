//! Random ids and owner values: tokens of the string-value locks, and owner ids of the
//! hash-based locks: `<instance>:<thread>`, as Redisson writes them
//! (`<UUID of the Redisson instance>:<Java thread id>`).
//!
//! The instance part is a random UUID (version 4, in its 36-character text form) per
//! [`LockClient`](crate::LockClient); the thread part is a process-unique number assigned to a
//! thread on first use and never reused. So threads are distinct owners, and one thread that
//! asks again through the same client is the same owner (re-entry).

use std::sync::atomic::{AtomicU64, Ordering};

use rand::RngExt;

/// Length of a UUID in text form.
#[cfg(test)]
pub(crate) const UUID_LEN: usize = 36;

/// The longest owner value a lease stores inline (no allocation per acquire): room for a
/// 128-bit token in hex, an owner id `<128-bit instance in hex>:<thread number>`, or ShedLock's
/// value `ADDED:<24-character time>@<host name of up to 64 bytes>:<UUID>` (132 bytes at most).
pub(crate) const VALUE_CAPACITY: usize = 136;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number (process-unique, assigned on first use, never reused) and its
    /// decimal digits, as owner ids write it.
    static THREAD: (u64, String) = {
        let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        (n, n.to_string())
    };
}

/// The calling thread's number in owner ids.
pub(crate) fn thread_num() -> u64 {
    THREAD.with(|t| t.0)
}

/// True when `owner` (`<instance>:<thread>`) names the calling thread.
pub(crate) fn names_this_thread(owner: &[u8]) -> bool {
    THREAD.with(|(_, digits)| {
        owner
            .strip_suffix(digits.as_bytes())
            .is_some_and(|rest| rest.ends_with(b":"))
    })
}

/// A random version-4 UUID in text form, e.g. `8743c9c0-0795-4907-87fd-6c719a6b4586`.
pub(crate) fn new_uuid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    [&h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]].join("-")
}

/// Bytes held inline, without touching the heap (an owner value of a lease, an owner id): at
/// most [`VALUE_CAPACITY`], which every value and id the crate writes fits (a longer one
/// would be cut).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Inline {
    buf: [u8; VALUE_CAPACITY],
    len: u8,
}

impl Inline {
    /// `parts`, one after the other.
    pub(crate) fn new(parts: &[&[u8]]) -> Self {
        let mut inline = Inline {
            buf: [0; VALUE_CAPACITY],
            len: 0,
        };
        for part in parts {
            let (at, n) = (usize::from(inline.len), part.len());
            let n = n.min(VALUE_CAPACITY - at);
            inline.buf[at..at + n].copy_from_slice(&part[..n]);
            // Fits: `at + n <= VALUE_CAPACITY` (136).
            inline.len = (at + n) as u8;
        }
        inline
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

/// The owner id of the calling thread, `<instance>:<thread number>`, built without touching the
/// heap (it is built on every acquire and release of a reentrant lock); its text (`to_string`)
/// for an owner id as a `String`. Instance ids are UUIDs: the id always fits [`Inline`].
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct OwnerId(Inline);

impl OwnerId {
    /// The calling thread's owner id for the client with instance id `instance`.
    pub(crate) fn new(instance: &str) -> Self {
        THREAD.with(|(_, n)| OwnerId(Inline::new(&[instance.as_bytes(), b":", n.as_bytes()])))
    }

    /// The id as text.
    pub(crate) fn as_str(&self) -> &str {
        // Valid UTF-8: a `&str`, an ASCII ':' and ASCII digits (a UUID is ASCII: never cut).
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// The id's bytes, as stored in a lease.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fresh random owner token: 128 bits from the thread-local CSPRNG, as 32 lowercase hex
/// characters, without allocating.
pub(crate) fn new_token() -> [u8; 32] {
    let bytes: [u8; 16] = rand::rng().random();
    let mut out = [0u8; 32];
    // Cannot fail: 16 bytes always fill exactly 32 hex characters.
    let _ = hex::encode_to_slice(bytes, &mut out);
    out
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
        let here = OwnerId::new(&u).to_string();
        assert_eq!(here, OwnerId::new(&u).to_string());
        let there = std::thread::spawn(move || OwnerId::new(&u).to_string())
            .join()
            .expect("thread");
        assert_ne!(here, there);
    }

    #[test]
    fn inline_owner_ids_match_the_formatted_text() {
        let u = new_uuid();
        let id = OwnerId::new(&u);
        assert_eq!(id.as_str(), format!("{u}:{}", thread_num()));
        assert_eq!(id.as_bytes(), id.as_str().as_bytes());
        assert_eq!(id, OwnerId::new(&u));
        assert_eq!(id.to_string(), format!("{u}:{}", thread_num()));
        // Cut, never a panic, for an instance id no client has.
        let long = "x".repeat(VALUE_CAPACITY);
        assert_eq!(OwnerId::new(&long).as_str(), long);
        let parts = Inline::new(&[b"ab", b"", b"c"]);
        assert_eq!(parts.as_bytes(), b"abc");
        assert!(parts == Inline::new(&[b"abc"]));
    }

    #[test]
    fn owner_ids_name_their_thread() {
        let here = OwnerId::new("inst");
        assert!(names_this_thread(here.as_bytes()));
        let there = std::thread::spawn(|| OwnerId::new("inst")).join().unwrap();
        assert!(!names_this_thread(there.as_bytes()));
        assert!(!names_this_thread(b"inst"));
    }
}
