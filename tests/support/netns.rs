//! Network namespaces for tests that cut the network: throw-away namespaces joined by veth pairs
//! to a bridge in a namespace of their own, and a link cut and healed by setting one veth down
//! and up inside that bridge namespace. Needs root (CI and the test machine run as root).
//!
//! Nothing here touches the host's interfaces or addresses: every interface is created inside a
//! namespace the test made, every address (10.213.0.0/24) lives only on those interfaces, and
//! the namespaces are named after this process (`dlk<pid>-<n><side>`) and deleted on drop, also
//! when a test panics.
//!
//! Processes and connections are put in a namespace by [`Netns::enter`]: the closure runs on a
//! thread of its own that first joins the namespace (`setns`, which moves only that thread), so
//! every socket it opens and every child it spawns (a [`RedisServer`](super::RedisServer), a
//! [`WorkerProcess`](super::worker::WorkerProcess)) lives there. The fixture's own code (free
//! port, readiness by PING on 127.0.0.1) then works unchanged inside the namespace.

// Each test binary uses part of the support module.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// One network namespace (`ip netns add`), deleted on drop. Its loopback is up.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace `name` (unique to this test run: see [`Split`]).
    pub fn add(name: &str) -> Netns {
        // A namespace left by a killed earlier run of the same pid would make `add` fail.
        let _ = quiet("ip", &["netns", "del", name]);
        ip(&["netns", "add", name]);
        let ns = Netns {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> args...`; panics (with `ip`'s message) if it fails.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all);
    }

    /// Runs `f` on a thread that has joined this namespace: the sockets it opens and the
    /// processes it spawns belong to the namespace (sockets stay there when used later from
    /// any thread; children for their whole life).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        thread::scope(|s| {
            s.spawn(|| {
                let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                // SAFETY: a valid namespace file descriptor; CLONE_NEWNET moves only this
                // thread, which ends with the scope.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace destroys its interfaces (and their veth peers); processes still
        // in it keep it alive until they end (the fixture kills its servers on drop).
        if let Err(e) = quiet("ip", &["netns", "del", &self.name]) {
            eprintln!("ip netns del {}: {e}", self.name);
        }
    }
}

/// Two sides whose link can be cut: namespaces `a` and `b`, each with `eth0` (`a`:
/// [`Split::A_ADDR`], `b`: [`Split::B_ADDR`], /24) on a veth pair whose other end is a port of a
/// bridge in a third namespace. [`cut`](Split::cut) sets `a`'s port down there: `a` and `b` then
/// keep their interfaces, addresses and routes (the carrier is lost, nothing is refused), and
/// every packet between them is dropped, as in a real partition; [`heal`](Split::heal) sets it
/// up again.
pub struct Split {
    /// Side A.
    pub a: Netns,
    /// Side B.
    pub b: Netns,
    wire: Netns,
}

impl Split {
    /// Side A's address.
    pub const A_ADDR: &'static str = "10.213.0.1";
    /// Side B's address.
    pub const B_ADDR: &'static str = "10.213.0.2";

    /// Creates the three namespaces and the links, up.
    pub fn new() -> Split {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let base = format!("dlk{}-{n}", std::process::id());
        // Built field by field so that a failure half way still deletes what exists.
        let wire = Netns::add(&format!("{base}w"));
        let a = Netns::add(&format!("{base}a"));
        let b = Netns::add(&format!("{base}b"));
        wire.ip(&["link", "add", "name", "bridge0", "type", "bridge"]);
        wire.ip(&["link", "set", "bridge0", "up"]);
        for (port, side, addr) in [("pa", &a, Self::A_ADDR), ("pb", &b, Self::B_ADDR)] {
            wire.ip(&[
                "link",
                "add",
                "name",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                side.name(),
            ]);
            wire.ip(&["link", "set", port, "master", "bridge0"]);
            wire.ip(&["link", "set", port, "up"]);
            side.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            side.ip(&["link", "set", "eth0", "up"]);
        }
        Split { a, b, wire }
    }

    /// Cuts A off: every packet between A and B is dropped from now on.
    pub fn cut(&self) {
        self.wire.ip(&["link", "set", "pa", "down"]);
    }

    /// Undoes [`cut`](Self::cut).
    pub fn heal(&self) {
        self.wire.ip(&["link", "set", "pa", "up"]);
    }
}

impl Default for Split {
    fn default() -> Self {
        Self::new()
    }
}

/// `ip args...`; panics with its output if it fails.
fn ip(args: &[&str]) {
    if let Err(e) = quiet("ip", args) {
        panic!("ip {}: {e}", args.join(" "));
    }
}

/// Runs `program args...` to completion; its stderr if it failed.
fn quiet(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("spawn {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
