//! Internals exposed for the crate's own benchmarks (`benches/`), so that they measure the code
//! the locks run rather than copies of it. Only with the cargo feature `bench-hooks`, which the
//! benchmarks' package (`benches/Cargo.toml`) enables. Hidden from the docs; not part of the API
//! and without any stability promise: do not enable the feature in a dependent crate.

use std::time::Duration;

use crate::error::Result;
use crate::primitives::{ClassicOptions, Encoding};

/// Makes `client`'s Token (and Classic) locks use their scripts even where the server has the
/// native commands (`DELIFEQ`, `SET … IFEQ`), to measure one against the other in one run.
pub fn use_scripts(client: &crate::LockClient) {
    client.force_native(false);
}

/// True if `client` releases Token locks with `DELIFEQ` (learned at `build()`).
pub fn releases_natively(client: &crate::LockClient) -> bool {
    client.native().has(crate::client::native::Command::DelIfEq)
}

/// A fresh Token owner value (what `try_acquire` generates).
pub fn token() -> [u8; 32] {
    crate::ids::new_token()
}

/// A Classic value for a hold of `ttl` from now, as stored at the key: the bytes are
/// `buf[..len]`.
pub fn classic_value(encoding: Encoding, ttl: Duration) -> Result<([u8; 20], usize)> {
    let owner = "00000000-0000-4000-8000-000000000000";
    let opts = ClassicOptions::new().encoding(encoding);
    let encoded = crate::primitives::classic::expiry_value("bench", opts, owner, ttl)?;
    let mut buf = [0u8; 20];
    let fits = buf.get_mut(..encoded.len()).ok_or_else(|| {
        crate::LockError::config("bench", "this encoding's values do not fit 20 bytes")
    })?;
    fits.copy_from_slice(&encoded);
    Ok((buf, encoded.len()))
}

/// The Token acquire command (also Classic's with `key_ttl`): `SET key value NX PX ttl_ms`.
pub fn set_nx_px_cmd(key: &str, value: &[u8], ttl_ms: u64) -> redis::Cmd {
    crate::primitives::string_value::set_nx_px(key, value, ttl_ms)
}

/// Classic's acquire command: `SETNX key value`.
pub fn setnx_cmd(key: &str, value: &[u8]) -> redis::Cmd {
    crate::primitives::string_value::setnx(key, value)
}

/// The scripts as a client holds them (SHAs computed once).
#[derive(Debug)]
pub struct Scripts(crate::scripts::Scripts);

impl Scripts {
    /// Builds the scripts, as `LockClient` does once.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Scripts(crate::scripts::Scripts::for_server(None))
    }

    /// The release command: `EVALSHA <unlock.lua> 1 key value` (Classic's).
    pub fn unlock_cmd(&self, key: &str, value: &[u8]) -> redis::Cmd {
        self.0.unlock.evalsha(key, &value)
    }

    /// `lua/fair_acquire.lua` as the client sends it (the shared queue walk included).
    pub fn fair_acquire_code(&self) -> &str {
        self.0.fair_acquire.code()
    }

    /// `lua/fair_release.lua` as the client sends it (the shared queue walk included).
    pub fn fair_release_code(&self) -> &str {
        self.0.fair_release.code()
    }

    /// The publishing release command: `EVALSHA <unlock.lua> 1 key value 0 channel` (Token's;
    /// `channel` is the key's release channel), built as the library builds it.
    pub fn unlock_publish_cmd(&self, key: &str, channel: &str, value: &[u8]) -> redis::Cmd {
        self.0
            .unlock
            .evalsha_keys(&[key], &(value, crate::keys::UNLOCK_MESSAGE, channel))
    }
}

/// Switches of the runtime's special paths and tuned timings, process-wide, so that a bench
/// runs the same workload with and without one in interleaved rounds (see `benches/knobs.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// The subscriber lends its connection to hand-off (fair) waiters, which then read their
    /// grant themselves.
    pub lend: bool,
    /// The subscriber's read tick (`None`: the default, 200 ms).
    pub tick: Option<Duration>,
    /// How long an idle channel stays subscribed (`None`: the default, 1.5 s).
    pub linger: Option<Duration>,
}

impl Default for Knobs {
    /// The library's behaviour.
    fn default() -> Self {
        Knobs {
            lend: true,
            tick: None,
            linger: None,
        }
    }
}

/// Sets the switches for every client of the process from now on.
pub fn set_knobs(k: Knobs) {
    use crate::client::tuning::overrides as o;
    use std::sync::atomic::Ordering::SeqCst;
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX - 1);
    o::NO_LEND.store(!k.lend, SeqCst);
    o::TICK_US.store(k.tick.map_or(0, |d| us(d).max(1)), SeqCst);
    o::LINGER_US.store(k.linger.map_or(u64::MAX, us), SeqCst);
}
