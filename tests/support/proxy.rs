//! A userspace TCP proxy on loopback, for faults of the network between a client and its
//! server that need no root and no netem: a listener on `127.0.0.1:<free port>` whose every
//! connection is forwarded to the server by two threads per direction (a reader and a writer),
//! in one of four modes, switched at any time for every connection:
//!
//! - [`Mode::Pass`]: bytes are forwarded as they come;
//! - [`Mode::Blackhole`]: every byte read is dropped, in both directions; connections stay
//!   open and new ones are accepted, as behind a cable pulled out (nothing is refused or
//!   reset: the client finds out only by its timeouts);
//! - [`Mode::DropReplies`]: what the client sends is forwarded, what the server answers is
//!   dropped: a command runs and its reply is lost;
//! - [`Mode::Delay`]: each chunk read is written a random delay later (uniform in
//!   `[min, max]`), in order per direction: a chunk is never written before the one read before
//!   it, so the delay of a chunk read right after a slow one can be longer than `max` by the
//!   rest of that one's delay (at most `max` from its arrival, as `due = max(previous due,
//!   arrival + delay)`).
//!
//! Dropped on [`Drop`]: the listener and every connection are shut down.

// Each test binary uses part of the support module.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::RngExt;

/// What the proxy does with the bytes it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwarded at once.
    Pass,
    /// Dropped, both ways.
    Blackhole,
    /// Forwarded to the server; the server's replies are dropped.
    DropReplies,
    /// Forwarded after a random delay in `[min, max]`, in order per direction.
    Delay { min: Duration, max: Duration },
}

struct Shared {
    mode: Mutex<Mode>,
    stop: AtomicBool,
    /// Every stream of every connection (both sides), to shut down on drop.
    streams: Mutex<Vec<TcpStream>>,
    /// Bytes dropped (blackhole, or replies dropped).
    dropped: AtomicU64,
    /// Connections still to close at their next client-to-server chunk, which is not
    /// forwarded (see [`Proxy::reset_next`]).
    resets: AtomicU64,
}

/// The proxy (see the module's documentation).
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy to `127.0.0.1:<target>`, in [`Mode::Pass`].
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            stop: AtomicBool::new(false),
            streams: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        });
        let s = Arc::clone(&shared);
        thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept(listener, target, s))
            .expect("proxy thread");
        Proxy { port, shared }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Switches every connection (and the next ones) to `mode`.
    pub fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Bytes dropped so far ([`Mode::Blackhole`], [`Mode::DropReplies`]).
    /// The next `n` chunks sent by clients are not forwarded: their connection is closed
    /// instead, as a server that went away would (not a timeout).
    #[allow(dead_code)]
    pub fn reset_next(&self, n: u64) {
        self.shared.resets.store(n, Ordering::SeqCst);
    }

    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for s in self.shared.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn accept(listener: TcpListener, target: u16, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut streams = shared.streams.lock().unwrap();
            streams.push(client.try_clone().expect("clone stream"));
            streams.push(server.try_clone().expect("clone stream"));
        }
        for (from, to, replies) in [
            (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
                false,
            ),
            (server, client, true),
        ] {
            let s = Arc::clone(&shared);
            thread::spawn(move || pump(from, to, replies, s));
        }
    }
}

/// One chunk on its way, and when to write it.
struct Queue {
    chunks: VecDeque<(Instant, Vec<u8>)>,
    closed: bool,
}

/// One direction of one connection: reads `from`, writes to `to` by a writer thread.
/// `replies`: the server-to-client direction.
fn pump(mut from: TcpStream, to: TcpStream, replies: bool, shared: Arc<Shared>) {
    let queue = Arc::new((
        Mutex::new(Queue {
            chunks: VecDeque::new(),
            closed: false,
        }),
        Condvar::new(),
    ));
    let q = Arc::clone(&queue);
    let writer = thread::spawn(move || write_out(to, &q));
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_due = Instant::now();
    let mut rng = rand::rng();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !replies
            && shared
                .resets
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
                .is_ok()
        {
            let _ = from.shutdown(Shutdown::Both);
            break;
        }
        let mode = *shared.mode.lock().unwrap();
        let now = Instant::now();
        let due = match mode {
            Mode::Blackhole => {
                shared.dropped.fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
            Mode::DropReplies if replies => {
                shared.dropped.fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
            Mode::Pass | Mode::DropReplies => now,
            Mode::Delay { min, max } => {
                let ns = rng.random_range(min.as_nanos() as u64..=max.as_nanos() as u64);
                now + Duration::from_nanos(ns)
            }
        }
        .max(last_due);
        last_due = due;
        let (lock, cv) = &*queue;
        lock.lock()
            .unwrap()
            .chunks
            .push_back((due, buf[..n].to_vec()));
        cv.notify_one();
    }
    let (lock, cv) = &*queue;
    lock.lock().unwrap().closed = true;
    cv.notify_one();
    let _ = writer.join();
}

/// Writes the queued chunks, each at its due time; on the reader's end, shuts down the write
/// side once the queue is empty.
fn write_out(mut to: TcpStream, queue: &(Mutex<Queue>, Condvar)) {
    let (lock, cv) = queue;
    let mut q = lock.lock().unwrap();
    loop {
        let now = Instant::now();
        match q.chunks.front() {
            Some((due, _)) if *due <= now => {
                let (_, chunk) = q.chunks.pop_front().unwrap();
                drop(q);
                if to.write_all(&chunk).is_err() {
                    return;
                }
                q = lock.lock().unwrap();
            }
            Some((due, _)) => {
                let wait = *due - now;
                q = cv.wait_timeout(q, wait).unwrap().0;
            }
            None if q.closed => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            None => q = cv.wait(q).unwrap(),
        }
    }
}
