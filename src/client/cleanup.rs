//! A clean-up as data: what a strategy hands the janitor and the Sentinel replay (a script of
//! the registry, its keys and arguments exactly as first sent, how to read its reply), and why
//! it exists. Nothing here sends a command.

use crate::client::grants::Grant;
use crate::scripts::{LuaScript, Scripts};

/// Why a clean-up is needed, and whether it is tried before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Why {
    pub(crate) cause: Cause,
    /// `None`: tried on the caller's thread first, within one command timeout (see
    /// [`Janitor::forget`](crate::client::jobs::Janitor::forget)). Else why not (for the log).
    /// Not after a command that timed out: the server did not answer within a whole command
    /// timeout, and a try at once would most likely wait another one for nothing (the janitor
    /// retries it, and the drain of a dropped client tries it once more). Nor when no
    /// connection could be had within the connect timeout (nothing was sent): the checkout or
    /// the connect already took its bound, and a try at once would most likely time out the
    /// same way. A connection refused or reset at once is tried again in-line (it costs no
    /// bound).
    pub(crate) not_in_line: Option<&'static str>,
}

impl Why {
    /// The undo of an acquire that failed with `e` after it was sent: a write that too few
    /// replicas confirmed (the server answered: undone in-line), or a reply that was lost.
    pub(crate) fn acquire(e: &crate::LockError) -> Why {
        let cause = match e {
            crate::LockError::NotReplicated { .. } => NOT_REPLICATED,
            _ => LOST_ACQUIRE_REPLY,
        };
        // Not a timeout for a write the replicas did not confirm: the server answered.
        Why::after(cause, e)
    }

    /// The retry of a release that failed with `e`.
    pub(crate) fn release(e: &crate::LockError) -> Why {
        Why::after(FAILED_RELEASE, e)
    }

    /// A clean-up for `cause` after a call that failed with `e`: in-line unless the command
    /// timed out or no connection could be had in time.
    fn after(cause: Cause, e: &crate::LockError) -> Why {
        let not_in_line = if e.nothing_sent() {
            Some("no connection to the server within the connect timeout")
        } else if e.is_timeout() {
            Some("no reply within the command timeout")
        } else {
            None
        };
        Why { cause, not_in_line }
    }
}

/// Why a clean-up job exists, as the log tells it.
pub(crate) type Cause = &'static str;
/// An acquire whose reply was lost: the value may or may not have been written.
pub(crate) const LOST_ACQUIRE_REPLY: Cause = "an acquire whose reply was lost";
/// An acquire answered, but confirmed by fewer replicas than the client requires: the write
/// stands on the primary and is undone (no reply was lost).
pub(crate) const NOT_REPLICATED: Cause = "an acquire the replicas did not confirm";
/// A release that failed on a connection error.
pub(crate) const FAILED_RELEASE: Cause = "a release that failed";
/// A release done on a Sentinel master shortly before a switch was announced: the new master
/// may still hold the lock (it was replicated before the promotion).
pub(crate) const RELEASED_BEFORE_SWITCH: Cause =
    "a release done on the old master before the switch";

/// What a clean-up's script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// It freed the lock (the key is gone): this client's waiters are woken.
    Freed,
    /// It gave one hold back; the lock may still be held (the owner's other holds, readers).
    GaveBack,
    /// Nothing to do: the release had run, the hold expired, or it was never ours.
    Nothing,
}

/// Reads a clean-up script's reply: what it did, and a grant it made to a waiting token
/// (handed to this client's waiter, if it is one of them).
pub(crate) type ReadReply = fn(&redis::Value) -> (Done, Option<(Vec<u8>, Grant)>);

/// A clean-up as the strategy that needs it describes it, which the janitor (and the Sentinel
/// replay) run without knowing whose it is: a script of the registry with its keys and
/// arguments, exactly as the release (or the undo of an acquire) sends them, and how to read
/// its reply.
#[derive(Debug, Clone)]
pub(crate) struct Cleanup {
    /// The script, from the client's registry.
    pub(crate) script: fn(&Scripts) -> &LuaScript,
    /// KEYS: the lock key first, then the keys of its slot the script also touches.
    pub(crate) keys: Vec<String>,
    /// ARGV.
    pub(crate) args: Vec<Vec<u8>>,
    /// Which of `args` is the value (or owner id) the script checks: a sweep puts there the
    /// value it found.
    pub(crate) value_arg: usize,
    pub(crate) read: ReadReply,
    /// It gives back a counted hold (a hash field's count): the owner's next acquire of the
    /// key settles it first ([`Janitor::settle`](crate::client::jobs::Janitor::settle)), and one remembered across a Sentinel switch
    /// is dropped while the owner holds the lock again (its count would match a live hold).
    pub(crate) counted: bool,
    /// What it does, for the log.
    pub(crate) what: &'static str,
}

impl Cleanup {
    /// Makes it the same clean-up of another value (a sweep's: the value found at the key).
    pub(crate) fn set_value(&mut self, value: Vec<u8>) {
        if let Some(slot) = self.args.get_mut(self.value_arg) {
            *slot = value;
        }
    }
}

#[cfg(test)]
impl Cleanup {
    /// The owner-checked delete of `value` at `key` (`lua/unlock.lua`), for unit tests.
    pub(crate) fn delete_for_test(key: &str, value: &[u8]) -> Cleanup {
        Cleanup {
            script: |s| &s.unlock,
            keys: vec![key.to_owned()],
            args: vec![value.to_vec()],
            value_arg: 0,
            read: read_delete,
            counted: false,
            what: "the owner-checked delete",
        }
    }
}

/// The reply of a script that deletes the lock and answers 1 or more when it did
/// (`lua/unlock.lua`: 1 + the subscribers reached).
pub(crate) fn read_delete(v: &redis::Value) -> (Done, Option<(Vec<u8>, Grant)>) {
    match v {
        redis::Value::Int(n) if *n >= 1 => (Done::Freed, None),
        _ => (Done::Nothing, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Fault;
    use crate::LockError;

    fn failed(fault: Fault) -> LockError {
        LockError::connection("k", fault, "test".into())
    }

    #[test]
    fn only_a_sent_command_that_did_not_time_out_is_cleaned_up_in_line() {
        let refused = Why::release(&failed(Fault::Unreachable));
        assert_eq!(refused.not_in_line, None);
        let timed_out = Why::release(&failed(Fault::Timeout));
        assert_eq!(
            timed_out.not_in_line,
            Some("no reply within the command timeout")
        );
        // A checkout or connect that timed out sent nothing, and took its bound.
        let no_conn = Why::release(&failed(Fault::NotConnected));
        assert_eq!(
            no_conn.not_in_line,
            Some("no connection to the server within the connect timeout")
        );
        assert!(failed(Fault::NotConnected).is_transient());
        assert!(!failed(Fault::NotConnected).is_timeout());
        assert!(Why::acquire(&failed(Fault::NotConnected))
            .not_in_line
            .is_some());
    }
}
