//! What a Sentinel client knows of its service's switches (see `sentinel_watch`): the
//! generation of the master its connections go to, and the releases it would do again on a new
//! master, one per key (and owner). State only: the watcher thread and the replay are in
//! `sentinel_watch.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::client::jobs::Job;

/// Most releases remembered, a backstop: there is one entry per key (per owner, for the hash
/// layouts) whose hold could still live, so a client that locks fewer keys never reaches it.
/// Past it, the entries closest to their expiry are forgotten first.
pub(crate) const MAX_RECENT: usize = 65_536;

/// The switches seen for one client's service.
#[derive(Debug, Default)]
pub(crate) struct Switches {
    /// Bumped on every switch of the service's master.
    generation: AtomicU64,
    #[cfg(feature = "sentinel")]
    /// The master the last switch announced (or the watcher last learnt), if any.
    master: Mutex<Known>,
    /// The latest release per key (and owner, for the hash layouts) whose hold would not have
    /// expired yet.
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    map: HashMap<(String, Vec<u8>), Job>,
    /// Releases recorded since the last pass over `map` that drops expired entries.
    since_prune: usize,
}

/// What the watcher knows of the master.
#[derive(Debug, Default)]
#[cfg(feature = "sentinel")]
struct Known {
    master: Option<(String, u16)>,
    /// Sentinel's configuration epoch of `master` is at least this: an answer with a lower one
    /// comes from a Sentinel that has not heard of the last switch yet, and is ignored.
    epoch: u64,
}

impl Switches {
    /// The current generation: connections opened in an older one are discarded.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    #[cfg(feature = "sentinel")]
    /// The master the Sentinels announced last, if the watcher has heard of one.
    pub(crate) fn announced(&self) -> Option<(String, u16)> {
        self.master
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .master
            .clone()
    }

    /// Remembers a successful release, until its hold would have expired by itself (see the
    /// module docs): it replaces the one before of its key (and owner). A release sent in an
    /// older `generation` than the current one is handed back: it may have gone to the old
    /// master after the replay, and is to be replayed at once.
    pub(crate) fn remember(&self, r: Job, generation: u64) -> Option<Job> {
        if generation < self.generation() {
            return Some(r);
        }
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        recent.since_prune += 1;
        // Expired entries are dropped in passes, each after as many releases as there are
        // entries: amortised O(1) per release.
        if recent.since_prune > recent.map.len().max(64) {
            recent.since_prune = 0;
            recent.map.retain(|_, e| e.until > now);
        }
        // The entry this release replaces: one per key, or per key and owner for counted
        // holds, whose owners hold the lock side by side.
        let owner = r.cleanup.counted.then(|| r.value().to_vec());
        let slot = (r.key().to_owned(), owner.unwrap_or_default());
        if recent.map.len() >= MAX_RECENT && !recent.map.contains_key(&slot) {
            if let Some(first) = recent
                .map
                .iter()
                .min_by_key(|(_, e)| e.until)
                .map(|(k, _)| k.clone())
            {
                recent.map.remove(&first);
            }
        }
        recent.map.insert(slot, r);
        None
    }

    #[cfg(feature = "sentinel")]
    /// The releases remembered whose holds would not have expired yet.
    pub(crate) fn take_recent(&self) -> Vec<Job> {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.since_prune = 0;
        recent
            .map
            .drain()
            .map(|(_, r)| r)
            .filter(|r| r.until > now)
            .collect()
    }

    /// Entries remembered (for tests).
    #[cfg(all(test, feature = "sentinel"))]
    pub(crate) fn remembered(&self) -> usize {
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .len()
    }

    #[cfg(feature = "sentinel")]
    /// Records `master` as the current master, announced by `+switch-master` (`epoch` `None`)
    /// or named by a Sentinel whose configuration epoch is `epoch` (ignored when older than
    /// what was learnt before). A change of master bumps the generation; true if it did.
    pub(crate) fn learn(&self, master: (String, u16), epoch: Option<u64>, why: &str) -> bool {
        let mut guard = self.master.lock().unwrap_or_else(PoisonError::into_inner);
        let known = &mut *guard;
        match epoch {
            Some(e) if e < known.epoch => {
                log::debug!(
                    "Sentinel: ignoring {}:{} named with epoch {e} < {} (a Sentinel that has not \
                     heard of the last switch)",
                    master.0,
                    master.1,
                    known.epoch
                );
                return false;
            }
            Some(e) => known.epoch = e,
            None => {}
        }
        match known.master.replace(master.clone()) {
            None => log::debug!("Sentinel: current master {}:{} ({why})", master.0, master.1),
            Some(old) if old != master => {
                // An announced switch raises the epoch by one at least. An announcement of the
                // master already known (the periodic check got there first) leaves it, so that
                // the next check, which names that master with its real epoch, is not taken for
                // a stale Sentinel.
                if epoch.is_none() {
                    known.epoch = known.epoch.saturating_add(1);
                }
                let gen = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                log::warn!(
                    "Sentinel: master switched from {}:{} to {}:{} ({why}); connections to the \
                     old master are dropped (generation {gen})",
                    old.0,
                    old.1,
                    master.0,
                    master.1
                );
                return true;
            }
            Some(_) => {}
        }
        false
    }
}

// The tests of the Sentinel feature: `#[cfg(test)]` outside, as the layer check expects.
#[allow(clippy::mixed_attributes_style)]
#[cfg(test)]
mod tests {
    #![cfg(feature = "sentinel")]

    use super::*;
    use crate::client::cleanup::RELEASED_BEFORE_SWITCH;
    use std::time::Duration;

    fn addr(port: u16) -> (String, u16) {
        ("127.0.0.1".to_owned(), port)
    }

    /// The epochs of what the watcher learns, by announcement (`None`) and by asking a
    /// Sentinel (`Some`): a Sentinel naming an older epoch is ignored, and an announcement of
    /// the master the periodic check found first does not raise the epoch past the real one
    /// (the next check would then be ignored).
    #[test]
    fn epochs_of_checks_and_announcements() {
        let s = Switches::default();
        let epoch = |s: &Switches| s.master.lock().unwrap().epoch;
        assert!(!s.learn(addr(1), Some(0), "start"));
        assert_eq!((s.generation(), s.announced()), (0, Some(addr(1))));
        // The periodic check finds the new master first, then its announcement arrives.
        assert!(s.learn(addr(2), Some(1), "check"));
        assert!(!s.learn(addr(2), None, "+switch-master"));
        assert_eq!((s.generation(), epoch(&s)), (1, 1));
        // The next check names it with its real epoch: not taken for a stale Sentinel.
        assert!(!s.learn(addr(2), Some(1), "check"));
        assert_eq!(epoch(&s), 1);
        // A Sentinel that has not heard of the switch names the old master: ignored.
        assert!(!s.learn(addr(1), Some(0), "stale"));
        assert_eq!(s.announced(), Some(addr(2)));
        // An announced switch first: the epoch goes up by one, and a stale check is ignored.
        assert!(s.learn(addr(3), None, "+switch-master"));
        assert_eq!((s.generation(), epoch(&s)), (2, 2));
        assert!(!s.learn(addr(2), Some(1), "stale"));
        assert_eq!(s.announced(), Some(addr(3)));
        assert!(!s.learn(addr(3), Some(2), "check"));
        assert_eq!(s.generation(), 2);
    }

    fn released(until: Instant, key: &str, value: &[u8]) -> Job {
        let cleanup = crate::client::cleanup::Cleanup::delete_for_test(key, value);
        let mut job = Job::new(cleanup, RELEASED_BEFORE_SWITCH, until);
        job.sweep = Some(b"ab".to_vec());
        job
    }

    /// A release is remembered until its hold would have expired by itself, however long ago
    /// it was made: the Sentinels may take longer than any fixed window from the promotion to
    /// the announcement (13.8 s in a test under load, where a 10 s window left holds behind).
    #[test]
    fn releases_are_remembered_while_their_holds_could_live() {
        let s = Switches::default();
        let now = Instant::now();
        let Some(long_ago) = now.checked_sub(Duration::from_secs(15)) else {
            return;
        };
        let later = now + Duration::from_secs(15);
        s.remember(
            released(long_ago + Duration::from_secs(1), "expired", b"v"),
            0,
        );
        s.remember(released(later, "lives", b"v"), 0);
        s.remember(released(later, "recent", b"v"), 0);
        let mut keys: Vec<String> = s.take_recent().iter().map(|r| r.key().to_owned()).collect();
        keys.sort();
        assert_eq!(keys, ["lives", "recent"]);
        assert!(s.take_recent().is_empty(), "taken once");
    }

    /// What is remembered is bounded by the keys, not by the rate of releases: a key's latest
    /// release replaces the one before (per owner, for the hash layouts, whose owners hold
    /// side by side), so 100,000 releases on 64 keys leave 64 entries.
    #[test]
    fn one_release_is_remembered_per_key_and_owner() {
        let s = Switches::default();
        let now = Instant::now();
        let later = now + Duration::from_secs(30);
        for i in 0..100_000u32 {
            let key = format!("k{}", i % 64);
            assert!(s
                .remember(released(later, &key, &i.to_be_bytes()), 0)
                .is_none());
        }
        assert_eq!(s.remembered(), 64);
        for owner in [b"o1", b"o2"] {
            for _ in 0..10 {
                let mut r = released(later, "hash", owner);
                r.sweep = None;
                r.cleanup.counted = true;
                assert!(s.remember(r, 0).is_none());
            }
        }
        assert_eq!(s.remembered(), 66);
        let last = s
            .take_recent()
            .into_iter()
            .find(|r| r.key() == "k31")
            .map(|r| r.value().to_vec());
        assert_eq!(
            last,
            Some(99_999u32.to_be_bytes().to_vec()),
            "the latest is kept"
        );
    }

    /// A release sent before a switch and answered after the client followed it may have gone
    /// to the old master after the replay: it is not remembered but handed back to be done
    /// again at once.
    #[test]
    fn a_release_sent_before_a_switch_is_replayed_at_once() {
        let s = Switches::default();
        assert!(!s.learn(addr(1), Some(0), "start"));
        assert!(s.learn(addr(2), None, "+switch-master"));
        let now = Instant::now();
        let r = released(now + Duration::from_secs(5), "k", b"v");
        assert!(s.remember(r, 0).is_some(), "generation 0 < 1");
        let r = released(now + Duration::from_secs(5), "k", b"v");
        assert!(s.remember(r, s.generation()).is_none());
    }
}
