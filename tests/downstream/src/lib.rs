//! A downstream user of redis-dlock; the code is in `tests/package.rs`.
