//! Histories of holds, and a checker that no two holders' validity windows overlap.
//!
//! Every worker records each hold it took: when it invoked the acquire and when the acquire
//! completed, until when the lock said the hold was valid, and when it invoked the release.
//! The times are read from one monotonic clock (`CLOCK_MONOTONIC`, the same for every process
//! of the host), in nanoseconds, so that the histories of several processes can be merged.
//!
//! A hold's validity window runs from the acquire's completion to the earliest of: the
//! release's invocation, the end of the lease as the lock counted it (from the invocation of
//! the winning attempt, or of the last renewal that succeeded: the guard's `remaining()` read
//! just before the release), and the moment the holder was told the hold was lost. A correct
//! lock never has two windows of one key overlap; [`overlaps`] lists those that do. Unlike a
//! count of lost updates, it says which two holds overlapped, and it catches a holder that
//! went on past its lease even when no update was lost.
//!
//! The checker is checked too: on made-up histories here, and on a real load with a "lock"
//! that writes its key without `NX` (tests/history.rs), whose overlaps it must report.

// Each test binary uses part of the support module.
#![allow(dead_code)]

use std::time::Duration;

/// Nanoseconds on the host's monotonic clock (`CLOCK_MONOTONIC`), comparable across processes.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC is always available on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One hold, as its holder saw it. Times in ns of [`now_ns`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The lock key's index in the workload.
    pub key: u32,
    /// Who held it: the process and thread (any number unique per holder).
    pub holder: u64,
    /// The acquire was invoked.
    pub invoked: u64,
    /// The acquire completed (the hold was handed to the caller).
    pub acquired: u64,
    /// The end of the lease as the lock counted it, read just before the release.
    pub valid_until: u64,
    /// The release was invoked.
    pub released: u64,
    /// The holder was told the hold was lost (0: never, or not before the release).
    pub lost: u64,
}

impl Hold {
    const BYTES: usize = 4 + 6 * 8;

    /// The validity window `[start, end)`.
    pub fn window(&self) -> (u64, u64) {
        let mut end = self.released.min(self.valid_until);
        if self.lost != 0 {
            end = end.min(self.lost);
        }
        (self.acquired, end.max(self.acquired))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key.to_le_bytes());
        for v in [
            self.holder,
            self.invoked,
            self.acquired,
            self.valid_until,
            self.released,
            self.lost,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn decode(b: &[u8]) -> Hold {
        let u = |i: usize| u64::from_le_bytes(b[4 + 8 * i..12 + 8 * i].try_into().unwrap());
        Hold {
            key: u32::from_le_bytes(b[..4].try_into().unwrap()),
            holder: u(0),
            invoked: u(1),
            acquired: u(2),
            valid_until: u(3),
            released: u(4),
            lost: u(5),
        }
    }
}

/// Records the holds of one thread.
#[derive(Debug, Default)]
pub struct Recorder {
    holder: u64,
    holds: Vec<Hold>,
}

/// A hold being recorded: [`Recorder::begin`] before the acquire, then [`Open::acquired`].
#[derive(Debug, Clone, Copy)]
pub struct Open {
    key: u32,
    invoked: u64,
}

/// A hold acquired and not yet released.
#[derive(Debug, Clone, Copy)]
pub struct Acquired {
    key: u32,
    invoked: u64,
    acquired: u64,
}

impl Recorder {
    /// A recorder for holder `holder` (e.g. `process id << 16 | thread`).
    pub fn new(holder: u64) -> Recorder {
        Recorder {
            holder,
            holds: Vec::with_capacity(1 << 14),
        }
    }

    /// The acquire of `key` is about to be invoked.
    pub fn begin(&self, key: u32) -> Open {
        Open {
            key,
            invoked: now_ns(),
        }
    }

    /// The release is about to be invoked: `remaining` is the guard's time left (read now),
    /// `lost` whether the guard already says the hold is lost.
    pub fn release(&mut self, held: Acquired, remaining: Duration, lost: bool) {
        let now = now_ns();
        let valid_until = now.saturating_add(remaining.as_nanos().min(u64::MAX as u128) as u64);
        self.holds.push(Hold {
            key: held.key,
            holder: self.holder,
            invoked: held.invoked,
            acquired: held.acquired,
            valid_until,
            released: now,
            // Told before the release: at the latest now (the window ends no later anyway).
            lost: if lost { now } else { 0 },
        });
    }

    /// The holds recorded, as bytes (see [`decode`]).
    pub fn encode(&self) -> Vec<u8> {
        encode(&self.holds)
    }

    /// The holds recorded.
    pub fn holds(&self) -> &[Hold] {
        &self.holds
    }
}

impl Open {
    /// The acquire completed with a hold.
    pub fn acquired(self) -> Acquired {
        Acquired {
            key: self.key,
            invoked: self.invoked,
            acquired: now_ns(),
        }
    }
}

/// `holds` as bytes, for another process (see [`decode`]).
pub fn encode(holds: &[Hold]) -> Vec<u8> {
    let mut out = Vec::with_capacity(holds.len() * Hold::BYTES);
    for h in holds {
        h.encode(&mut out);
    }
    out
}

/// Holds from [`encode`]'s bytes (of one or several recorders, concatenated).
pub fn decode(bytes: &[u8]) -> Vec<Hold> {
    assert_eq!(bytes.len() % Hold::BYTES, 0, "a history of whole holds");
    bytes.chunks_exact(Hold::BYTES).map(Hold::decode).collect()
}

/// Two holds of one key by different holders whose validity windows overlap, by how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    pub first: Hold,
    pub second: Hold,
    pub ns: u64,
}

/// Every pair of holds of one key, by different holders, whose validity windows overlap
/// (empty windows never do). Sorted by key, then start.
pub fn overlaps(holds: &[Hold]) -> Vec<Overlap> {
    let mut by_key: std::collections::BTreeMap<u32, Vec<Hold>> = Default::default();
    for h in holds {
        by_key.entry(h.key).or_default().push(*h);
    }
    let mut found = Vec::new();
    for (_, mut hs) in by_key {
        hs.sort_by_key(|h| h.window());
        // A sweep: every earlier window still open when a later one starts overlaps it.
        let mut open: Vec<Hold> = Vec::new();
        for h in hs {
            let (start, end) = h.window();
            if start == end {
                continue;
            }
            open.retain(|o| o.window().1 > start);
            for o in &open {
                if o.holder != h.holder {
                    found.push(Overlap {
                        first: *o,
                        second: h,
                        ns: o.window().1.min(end) - start,
                    });
                }
            }
            open.push(h);
        }
    }
    found
}

/// When a holder cut off from its server was told that its hold was lost, against when the
/// key expired on the server. Times in ns of [`now_ns`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LossReport {
    /// Which hold (for messages).
    pub what: String,
    /// The report: `is_lost()` seen true, `on_lost` called, the command signalled (0: never).
    pub reported: u64,
    /// The key's expiry on the server, at the earliest (a `PTTL` answer added to the time its
    /// command was sent).
    pub expired: u64,
    /// The margin the report must leave before the expiry: it must come before
    /// `expired - margin / 2`.
    pub margin: u64,
}

/// The reports that came too late: none at all, or not before `expired - margin / 2` (the
/// other half of the margin is the time the holder has to stop).
pub fn late_reports(reports: &[LossReport]) -> Vec<&LossReport> {
    reports
        .iter()
        .filter(|r| r.reported == 0 || r.reported.saturating_add(r.margin / 2) >= r.expired)
        .collect()
}

/// Holds used past their lease: released (the work ended) after `lease_end(hold)`.
pub fn used_past_lease(holds: &[Hold], lease_end: impl Fn(&Hold) -> u64) -> Vec<Hold> {
    holds
        .iter()
        .filter(|h| h.released > lease_end(h))
        .copied()
        .collect()
}

/// A short account of overlaps for a failed check: how many, and the first few, with times in
/// ms from `epoch_ns`.
pub fn describe(found: &[Overlap], epoch_ns: u64) -> String {
    let ms = |t: u64| (t as i64 - epoch_ns as i64) as f64 / 1e6;
    let mut s = format!("{} overlapping pairs of holds", found.len());
    for o in found.iter().take(5) {
        let (a0, a1) = o.first.window();
        let (b0, b1) = o.second.window();
        s.push_str(&format!(
            "; key {}: holder {:x} [{:.3}, {:.3}) ms and holder {:x} [{:.3}, {:.3}) ms, {:.3} ms \
             together",
            o.first.key,
            o.first.holder,
            ms(a0),
            ms(a1),
            o.second.holder,
            ms(b0),
            ms(b1),
            o.ns as f64 / 1e6
        ));
    }
    s
}
