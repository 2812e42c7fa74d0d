//! # redis-dlock
//!
//! Blocking distributed locks on Redis for thread-based (non-async) services.
//!
//! Every lock is built the same way, from its client: [`LockClient::lock`] (a mutex by
//! [`Strategy`]), [`LockClient::rw_lock`] (read-write), [`RedLockClient::lock`] (over
//! independent masters). Each is a [`DistributedLock`] (one object-safe trait: what every lock
//! does with its own holds) and a [`LockAdmin`] (server-side reads and force-unlock). The
//! [`Strategy`] picks the algorithm and carries the options only it has:
//!
//! - [`Strategy::Token`] (default): `SET key <random token> NX PX <ttl>`, released and extended
//!   by Lua compare-and-delete / compare-and-pexpire scripts. One round trip to acquire, one to
//!   release.
//! - [`Strategy::Classic`] ([`ClassicOptions`]): the SETNX + GETSET timestamp lock of the legacy Java lockers,
//!   wire-compatible with them on the same keys (value = expiry in epoch milliseconds), with an
//!   owner-checked release and an optional atomic takeover that fixes GETSET's overwrite flaw.
//! - [`Strategy::Reentrant`]: a lock a thread may take again, in Redisson's `RLock` layout (a
//!   hash of `<client UUID>:<thread>` → hold count), shared with Java Redisson services.
//! - [`Strategy::Fair`]: first come, first served across processes; the release grants the
//!   lock to the next waiter inside Redis, and the waiter returns on the grant message.
//!
//! Around them, what Redisson users rely on:
//!
//! - a **watchdog** (one thread per [`LockClient`]): a lock built without an
//!   explicit `ttl` is renewed while its holder keeps the guard, and a hold it cannot renew is
//!   reported ([`LockGuard::is_lost`], [`LockBuilder::on_lost`]);
//! - **pub/sub wake-ups**: releases publish on the lock's channel and blocked
//!   threads wait on one shared subscriber connection per client ([`WakeUp`]);
//! - **fencing tokens** ([`LockBuilder::fencing`], [`LockGuard::fence`]);
//! - **server-side queries** on every lock, whoever holds it
//!   ([`is_locked`](LockAdmin::is_locked), [`remaining_ttl`](LockAdmin::remaining_ttl),
//!   and for administrators [`force_unlock`](LockAdmin::force_unlock));
//! - **counters** per client ([`LockClient::stats`]), also reported through the `metrics` crate
//!   with the cargo feature `metrics`;
//! - [`ReadWriteLock`], and [`RedLock`] over independent masters; every companion key shares
//!   the lock key's hash slot, and release channels (Redisson's names) are script arguments,
//!   so all of it works on a Cluster.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_dlock::{DistributedLock, LockClient, Strategy};
//!
//! # fn main() -> Result<(), redis_dlock::LockError> {
//! let client = LockClient::open("redis://127.0.0.1:6379/")?;
//! let lock = client
//!     .lock("jobs:nightly-report")
//!     .strategy(Strategy::Token)
//!     .ttl(Duration::from_secs(30))
//!     .build()?;
//!
//! let mut guard = lock.try_lock_for(Duration::from_secs(5))?;
//! // ... work; extend before the lifetime runs out ...
//! guard.extend(Duration::from_secs(30))?; // Err(LockError::Lost) if it expired meanwhile
//! if !guard.unlock()? {
//!     eprintln!("the lock expired before we released it: the work was not exclusive");
//! }
//! # Ok(()) }
//! ```
//!
//! What a lock on one Redis server does and does not guarantee is in the README. The guides
//! it links to (`docs/*.md`: algorithms, compatibility, deployments, production, ...) ship in
//! the crate's package, in its `docs/` directory
//! (<https://docs.rs/crate/redis-dlock/latest/source/docs/>).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

// The vocabulary: the trait and its guards, errors, retry policies, key names, scripts.
mod error;
mod ids;
mod keys;
mod lease;
mod lock;
mod retry;
mod scripts;
mod server;
mod stats;
mod time;

// The per-client runtime: connections, subscriber, watchdog, waiter lines, janitor.
mod client;

// Every primitive, one module each, in one home.
mod primitives;

// The builder that picks a lock's algorithm.
mod strategy;

/// Internals for the crate's own benchmarks; cargo feature `bench-hooks`. Unstable: not part
/// of the API, no semver promise.
#[cfg(feature = "bench-hooks")]
#[doc(hidden)]
pub mod bench_hooks;

/// For the crate's own tests: events to wait for instead of sleeping; cargo feature
/// `test-hooks`. Unstable: not part of the API, no semver promise.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod test_hooks {
    pub use crate::client::test_hooks::{Event, TestHooks};
    pub use crate::lease::set_zero_loss_margin;
    pub use crate::primitives::rwlock::owner_entries as rw_owner_entries;
}

pub use client::builder::ClientBuilder;
pub use client::confirm::ReplicaAcks;
pub use client::target::ConnectionTarget;
pub use client::LockClient;
// The defaults and bounds are associated constants of the types they configure
// (`ClientBuilder::DEFAULT_POOL_SIZE`, `RedLock::DEFAULT_TTL`, ...), each defined there once.
// One bound also has a crate-internal name: the longest timeout, which `RedLockClientBuilder`
// (a layer below `ClientBuilder`, which it may not name) checks its node timeout against;
// `ClientBuilder::MAX_TIMEOUT` is this constant.
pub(crate) use client::MAX_CLIENT_TIMEOUT;
pub use error::{LockError, Result};
pub use lease::{Lease, LossReason, LostLock};
pub use lock::{
    ArcLockExt, DistributedLock, Guard, GuardNoSend, GuardSend, LockAdmin, LockGuard, LockState,
    OwnedLockGuard,
};
/// The `r2d2` crate of [`LockClient::from_pool`] and [`LockClient::pool_state`].
pub use r2d2;
/// The `redis` crate this one is built on, whose types appear in its API
/// ([`LockClient::from_pool`], `ClientBuilder::tls_certificates`).
pub use redis;
pub use retry::RetryPolicy;
pub use stats::Stats;
// Every primitive's public names: primitives/mod.rs lists them.
pub use primitives::*;
// Strategy and LockBuilder, which pick a lock's algorithm.
pub use strategy::{Lock, LockBuilder, Recognized, Strategy};
pub use time::MAX_TTL;

// Every Rust block of README.md and docs/*.md, compiled by `cargo test --doc`.
#[cfg(doctest)]
mod doctests;
