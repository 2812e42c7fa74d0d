//! The watchdog's list of one client: the watched holds and the state its thread and the
//! lock holders share. State only: the client owns it, and the thread that renews the holds is
//! in `watchdog.rs` (which needs the client to send commands).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use crate::lease::WatchState;

/// The renewal thread of one client: ONE thread, started by the first `watch` (in `watchdog.rs`),
/// that renews every watched hold every lease/3, and reports the holds whose loss deadline
/// passes: no call of a round waits past the earliest of those deadlines.
///
/// The thread holds only a `WeakClient` between rounds, so dropping every handle of the
/// client drops the client, and with it this struct, whose `Drop` tells the thread to exit
/// (without joining it: the client may be dropped on the watchdog thread itself, by the
/// round's temporary handle).
#[derive(Default)]
pub(crate) struct Watchdog {
    pub(crate) shared: Arc<Shared>,
}

/// What the client's side and the thread share.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) list: Mutex<List>,
    /// Signalled when an entry is due before the thread's planned wake-up, and on shutdown.
    pub(crate) wake: Condvar,
}

#[derive(Default)]
pub(crate) struct List {
    /// The watched holds. Entries are removed only while no round is under way: a round
    /// refers to entries by index, and meanwhile `watch` only appends.
    pub(crate) entries: Vec<Entry>,
    /// The length of `entries` after its latest cleanup, to clean up again when it doubles.
    pub(crate) cleaned_len: usize,
    /// A round holds indices into `entries`: nothing may be removed.
    pub(crate) in_round: bool,
    pub(crate) thread: ThreadState,
    /// The client is gone: the thread must exit.
    pub(crate) shutdown: bool,
}

/// One watched hold.
pub(crate) struct Entry {
    pub(crate) state: Weak<WatchState>,
    /// When to renew it next.
    pub(crate) due: Instant,
    /// Lost or released: to be removed at the end of the round.
    pub(crate) gone: bool,
}

impl Entry {
    /// Its hold, unless it is gone: released, dropped by its holder, or lost.
    pub(crate) fn live(&self) -> Option<Arc<WatchState>> {
        let state = self.state.upgrade()?;
        (!self.gone && !state.is_stopped() && !state.marked_lost()).then_some(state)
    }
}

/// What the thread is doing, for `watch` to decide whether to wake it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ThreadState {
    /// Not started (or exited).
    #[default]
    Off,
    /// In a round, or about to look at the entries: it sees a new entry without being woken.
    Busy,
    /// Waiting until this instant (`None`: until woken, no entry is watched).
    Asleep(Option<Instant>),
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, List> {
        // A panic elsewhere while holding the lock leaves the list consistent (every change is
        // one assignment or push): keep going rather than stop renewing.
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Watchdog {
    /// Holds currently watched: neither released, dropped by their holder, nor lost.
    pub(crate) fn watched(&self) -> usize {
        let list = self.shared.lock();
        list.entries.iter().filter(|e| e.live().is_some()).count()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Never joins: this may run on the watchdog thread itself.
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
    }
}
