//! The README's and the guides' code blocks as doctests, so that they cannot rot: `cargo test
//! --doc` compiles every Rust block of README.md and docs/*.md (those that talk to Redis are
//! `no_run`: compiled, not run). Blocks in other languages are marked as such (`sh`, `text`,
//! `lua`, ...). Compiled only for doctests.

#[doc = include_str!("../README.md")]
pub struct Readme;

macro_rules! guides {
    ($($name:ident = $file:literal;)*) => {$(
        #[doc = include_str!(concat!("../docs/", $file))]
        pub struct $name;
    )*};
}

guides! {
    Algorithms = "algorithms.md";
    Architecture = "architecture.md";
    Benchmarks = "benchmarks.md";
    Cli = "cli.md";
    Compatibility = "compatibility.md";
    Deployments = "deployments.md";
    Fair = "fair.md";
    Fencing = "fencing.md";
    Multilock = "multilock.md";
    Production = "production.md";
    Redlock = "redlock.md";
    Reentrant = "reentrant.md";
    Reliability = "reliability.md";
    Rwlock = "rwlock.md";
    Semaphore = "semaphore.md";
    Wakeup = "wakeup.md";
    Watchdog = "watchdog.md";
}
