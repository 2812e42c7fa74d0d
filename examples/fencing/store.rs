//! The resource of the fencing example (and of `tests/fencing.rs`): an in-memory storage
//! service that only accepts writes carrying a fencing token at least as large as the largest
//! it has seen.

use std::fmt;
use std::sync::Mutex;

/// A storage service protected by a fencing-token lock. It trusts nobody's lock: it checks the
/// token of every write itself.
#[derive(Debug, Default)]
pub struct FencedStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The largest token of an accepted write (0: none yet; tokens start at 1).
    highest: u64,
    value: Option<String>,
}

/// A write refused because a newer holder has already written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale {
    /// The token of the refused write.
    pub fence: u64,
    /// The largest token the store had accepted.
    pub highest: u64,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale fencing token {} (the store has accepted {})",
            self.fence, self.highest
        )
    }
}

impl std::error::Error for Stale {}

impl FencedStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `value` if `fence` is at least the largest token accepted so far, and records
    /// `fence` as the largest. `>=`, not `>`: one hold has one token and may write several
    /// times. The check and the store happen under one mutex, so no write can slip in between.
    pub fn write(&self, fence: u64, value: &str) -> Result<(), Stale> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if fence < state.highest {
            return Err(Stale {
                fence,
                highest: state.highest,
            });
        }
        state.highest = fence;
        state.value = Some(value.to_owned());
        Ok(())
    }

    /// The value of the last accepted write.
    pub fn read(&self) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.value.clone()
    }

    /// The largest token accepted so far (0 before the first write).
    pub fn highest(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).highest
    }
}
