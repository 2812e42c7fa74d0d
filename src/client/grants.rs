//! The hand-off mailbox: grants expected by threads of this client, for locks whose release
//! hands the lock to the next waiter inside Redis (hand-off locks): a thread waiting in such a
//! lock's queue in Redis registers its token here before its
//! first attempt; the subscriber thread (or a release by this client, which learns the grant
//! from its own script's reply) fills the entry when a grant to that token is published, and
//! wakes the thread's line. The waiting thread then returns a guard without another command.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A hand-off waiter's token: the waiting client's id (16 hex characters, the first of its
/// instance id: the grant is published on that client's channel) and 128 random bits (32 hex
/// characters).
pub(crate) type Token = [u8; TOKEN_LEN];
/// The length of a [`Token`].
pub(crate) const TOKEN_LEN: usize = 48;
/// The length of the client id at the start of a [`Token`].
pub(crate) const CLIENT_ID_LEN: usize = 16;

/// The prefix of a grant message: `dlock-grant:<token>:<fence>:<seconds>:<microseconds>` (the
/// server's `TIME` when it granted).
pub(crate) const GRANT_PREFIX: &[u8] = b"dlock-grant:";

/// The grants this client's waiting threads expect, by token: the line (lock key) to wake, and
/// the grant once it arrived.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    map: Mutex<HashMap<Token, Expected>>,
}

type Expected = (String, Option<Grant>);

/// A grant as published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The fencing token (0: the lock has no fencing).
    pub(crate) fence: u64,
    /// The server's time of the grant, in microseconds since the epoch.
    pub(crate) at_us: u64,
}

fn lock(m: &Mutex<HashMap<Token, Expected>>) -> MutexGuard<'_, HashMap<Token, Expected>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Parses a grant message: the token and the grant, or `None` if it is none.
pub(crate) fn parse(payload: &[u8]) -> Option<(Token, Grant)> {
    let mut parts = std::str::from_utf8(payload.strip_prefix(GRANT_PREFIX)?)
        .ok()?
        .split(':');
    let token: Token = parts.next()?.as_bytes().try_into().ok()?;
    let mut number = || parts.next()?.parse().ok();
    let (fence, secs, micros) = (number()?, number()?, number()?);
    parts
        .next()
        .is_none()
        .then(|| (token, Grant::new(fence, secs, micros)))
}

impl Grant {
    /// A grant with `fence`, made at the server time `secs`.`micros`.
    pub(crate) fn new(fence: u64, secs: u64, micros: u64) -> Self {
        Grant {
            fence,
            at_us: secs.saturating_mul(1_000_000).saturating_add(micros),
        }
    }
}

impl Grants {
    /// Expects a grant to `token` for the waiters of `line`; forgotten when `forget` is called.
    pub(crate) fn register(&self, token: &Token, line: &str) {
        lock(&self.map).insert(*token, (line.to_owned(), None));
    }

    /// No longer expected (the thread got the lock or gave up).
    pub(crate) fn forget(&self, token: &Token) {
        lock(&self.map).remove(token);
    }

    /// The grant to `token`, if one arrived since the last call (it is taken out).
    pub(crate) fn take(&self, token: &Token) -> Option<Grant> {
        lock(&self.map).get_mut(token)?.1.take()
    }

    /// True if a grant to `token` arrived and was not taken yet.
    pub(crate) fn is_granted(&self, token: &Token) -> bool {
        lock(&self.map)
            .get(token)
            .is_some_and(|(_, grant)| grant.is_some())
    }

    /// A grant to `token` was published (or returned by this client's own release): records
    /// it and returns the line to wake, if a thread of this client expects it.
    pub(crate) fn deliver(&self, token: &[u8], grant: Grant) -> Option<String> {
        let token: Token = token.try_into().ok()?;
        let mut map = lock(&self.map);
        let (line, slot) = map.get_mut(&token)?;
        *slot = Some(grant);
        Some(line.clone())
    }

    /// Grants expected now.
    #[cfg(test)]
    pub(crate) fn expected(&self) -> usize {
        lock(&self.map).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_messages_parse() {
        let t = [b'a'; TOKEN_LEN];
        let mut msg = GRANT_PREFIX.to_vec();
        msg.extend_from_slice(&t);
        msg.extend_from_slice(b":17:1700000000:000042");
        assert_eq!(parse(&msg), Some((t, Grant::new(17, 1_700_000_000, 42))));
        assert_eq!(Grant::new(1, 2, 3).at_us, 2_000_003);
        assert_eq!(parse(b"0"), None);
        assert_eq!(parse(b"dlock-grant:short:1:2:3"), None);
        msg.truncate(msg.len() - 7);
        assert_eq!(parse(&msg), None);
    }

    #[test]
    fn only_expected_tokens_are_delivered() {
        let g = Grants::default();
        let (a, b) = ([b'a'; TOKEN_LEN], [b'b'; TOKEN_LEN]);
        let grant = |f| Grant::new(f, 1, 0);
        assert_eq!(g.deliver(&a, grant(1)), None);
        g.register(&a, "k");
        assert!(!g.is_granted(&a));
        assert_eq!(g.deliver(&b, grant(2)), None);
        assert_eq!(g.deliver(&a, grant(3)).as_deref(), Some("k"));
        assert!(g.is_granted(&a));
        assert_eq!(g.take(&a), Some(grant(3)));
        assert_eq!(g.take(&a), None);
        g.forget(&a);
        assert_eq!(g.expected(), 0);
        assert_eq!(g.deliver(&a, grant(4)), None);
    }
}
