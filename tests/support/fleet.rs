//! The combined runs of the mixed-fleet tests (tests/families.rs, spring.rs, shedlock.rs):
//! threads of both sides contend on one key while holders are SIGKILLed mid-hold; what the
//! sections of such a run say about the holds the dead left.
#![allow(dead_code)] // not every test binary uses every helper

use std::fmt::Debug;

/// A hold a SIGKILLed holder left on the contended key: its name, from when it held (its
/// report), and the earliest moment it could be free (its value's expiry, or its key's TTL).
#[derive(Debug, Clone)]
pub struct DeadHold<T> {
    pub name: String,
    pub held_from: T,
    pub free_from: T,
}

/// What the sections of a combined run say about its dead holds.
#[derive(Debug)]
pub struct DeadHolds<T> {
    pub dead: Vec<DeadHold<T>>,
    /// The sections that began or ran inside a dead hold: the hold's name, and the section's
    /// side, start and end.
    pub early: Vec<(String, usize, T, T)>,
    /// Per dead hold, the sections of side 1 (theirs) and side 2 (ours) that began after its end.
    pub after: Vec<(usize, usize)>,
    /// Per dead hold, the side whose section began first after its end (0: none).
    pub first: Vec<usize>,
}

impl<T: Copy + Ord + Debug> DeadHolds<T> {
    /// `sections`: (side, start, end) of every section of the run.
    pub fn of(sections: &[(usize, T, T)], dead: Vec<DeadHold<T>>) -> Self {
        let early = dead
            .iter()
            .flat_map(|d| {
                sections
                    .iter()
                    .filter(|(_, start, end)| *start < d.free_from && *end > d.held_from)
                    .map(|&(side, start, end)| (d.name.clone(), side, start, end))
            })
            .collect();
        let after = dead
            .iter()
            .map(|d| {
                let count = |want| {
                    sections
                        .iter()
                        .filter(|(side, start, _)| *side == want && *start >= d.free_from)
                        .count()
                };
                (count(1), count(2))
            })
            .collect();
        let first = dead
            .iter()
            .map(|d| {
                sections
                    .iter()
                    .filter(|(_, start, _)| *start >= d.free_from)
                    .min_by_key(|(_, start, _)| *start)
                    .map_or(0, |(side, _, _)| *side)
            })
            .collect();
        DeadHolds {
            dead,
            early,
            after,
            first,
        }
    }

    /// A section inside a dead hold, and a side that did not go on after one (`theirs`: how
    /// the other side is named in the messages).
    pub fn failures(&self, theirs: &str) -> Vec<String> {
        let mut failures = Vec::new();
        if !self.early.is_empty() {
            failures.push(format!(
                "entered inside a dead hold: {:?} (dead holds: {:?})",
                &self.early[..self.early.len().min(5)],
                self.dead
            ));
        }
        for (d, (them, ours)) in self.dead.iter().zip(&self.after) {
            if *them == 0 || *ours == 0 {
                failures.push(format!(
                    "after the dead hold of {}: {them} sections of {theirs}, {ours} of ours",
                    d.name
                ));
            }
        }
        failures
    }

    /// Who first took each dead hold over, for the log.
    pub fn takeovers(&self, theirs: &str) -> Vec<String> {
        self.dead
            .iter()
            .zip(&self.first)
            .map(|(d, side)| {
                let who = match side {
                    1 => theirs,
                    2 => "ours",
                    _ => "nobody",
                };
                format!("the dead hold of {} first taken over by {who}", d.name)
            })
            .collect()
    }
}
