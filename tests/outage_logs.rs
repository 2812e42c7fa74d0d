//! While Redis is down, one client under load writes a bounded number of log lines per cause:
//! a few threads lock and unlock in a loop and one holds a watched lock, the server is stopped
//! for 10 s and started again (then, with a new client, frozen for 10 s and continued), and a logger of this test counts the lines of each call site
//! (file and line of the `log!`). Every line that repeats during an outage is written about
//! once per cause per 5 s per client; the lines left out are counted, and the next line of
//! the cause says how many ("12 more like this in the last 5 s were not logged"). Those counts
//! are the negative control: they show the repeats were there, many more than the bound.
//!
//! A test binary of its own: one logger per process.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use redis_dlock::{DistributedLock, LockClient};
use support::RedisServer;

/// One logged line: level, call site, message.
type Line = (log::Level, String, String);

struct Counting {
    lines: Mutex<Vec<Line>>,
}

impl log::Log for Counting {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Debug && metadata.target().starts_with("redis_dlock")
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let site = format!(
            "{}:{}",
            record.file().unwrap_or("?"),
            record.line().unwrap_or(0)
        );
        let line = (record.level(), site, record.args().to_string());
        if std::env::var_os("DLOCK_TEST_LOG").is_some() {
            eprintln!("{:<5} {} {}", line.0, line.1, line.2);
        }
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    fn flush(&self) {}
}

static LOGGER: Counting = Counting {
    lines: Mutex::new(Vec::new()),
};

/// The count a line says was left out before it, if it says one.
fn left_out(message: &str) -> u64 {
    let Some(end) = message.find(" more like this in the last ") else {
        return 0;
    };
    let digits: String = message[..end]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .chars()
        .rev()
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

/// The library's interval: at most one line of a cause per this long, per client.
const EVERY: Duration = Duration::from_secs(5);
/// Threads that lock and unlock during the outage.
const WORKERS: usize = 3;

/// Lines per call site at INFO and above allowed for a run that logged for `window`: a cause
/// that repeats all along writes one line at its start and one per [`EVERY`] after it (2 more
/// allow for the first and the last interval being cut). Measured, not assumed: a loaded
/// machine that takes longer to restart the server allows more.
fn bound(window: Duration) -> usize {
    (window.as_secs_f64() / EVERY.as_secs_f64()).floor() as usize + 2
}

/// A line told once per event of one hold, not once per attempt: the background clean-up of
/// what an operation in flight when the server went away left behind (each thread has at most
/// a failed release and an acquire whose reply was lost), and its outcome.
fn per_event(message: &str) -> bool {
    message.contains("in the background (until it would expire")
        || message.contains("nothing to clean up after")
        || message.contains(" left by ")
        || message.contains("watched hold lost")
}

/// At most this many lines of a [`per_event`] call site.
const PER_EVENT: usize = 2 * WORKERS + 1;

/// How the server goes away.
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// Stopped and started again: connections refused, the data set empty afterwards.
    Stopped,
    /// Frozen (SIGSTOP) and continued: connections open but nothing answers.
    Frozen,
}

#[test]
fn an_outage_under_load_logs_a_bounded_number_of_lines_per_cause() {
    log::set_logger(&LOGGER).expect("the only logger of this binary");
    log::set_max_level(log::LevelFilter::Debug);
    // One after the other: the logger counts the lines of the whole process.
    for outage in [Outage::Stopped, Outage::Frozen] {
        LOGGER
            .lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let window = under_load(outage);
        let lines = LOGGER
            .lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        check(outage, &lines, bound(window));
    }
}

/// A client under load while the server goes away for 10 s; how long lines may have come.
fn under_load(outage: Outage) -> Duration {
    let mut server = RedisServer::start();
    let client = LockClient::builder(server.url())
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Some(Duration::from_millis(500)))
        .build()
        .expect("client");
    let stop = Arc::new(AtomicBool::new(false));

    // A watched hold whose renewals fail during the outage (a lease of 6 s: renewed every
    // 2 s, lost when renewals have failed for 4 s).
    let hold = {
        let lock = client
            .lock("outage:held")
            .watchdog_lease(Duration::from_secs(6))
            .build()
            .expect("lock");
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let guard = lock.lock().expect("free before the outage");
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = guard.unlock();
        })
    };
    // Three threads contend for one key: some wait (subscribed), some hold.
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let lock = client.lock("outage:busy").build().expect("lock");
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    let mut ok = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        match lock.try_lock_for(Duration::from_millis(300)) {
                            Ok(guard) => {
                                thread::sleep(Duration::from_millis(5));
                                let _ = guard.unlock();
                                ok += 1;
                            }
                            Err(_) => thread::sleep(Duration::from_millis(20)),
                        }
                    }
                    ok
                })
                .expect("spawn")
        })
        .collect();

    thread::sleep(Duration::from_secs(1));
    let began = std::time::Instant::now();
    match outage {
        Outage::Stopped => server.stop(),
        Outage::Frozen => server.pause(),
    }
    thread::sleep(Duration::from_secs(10));
    match outage {
        Outage::Stopped => server.restart(),
        Outage::Frozen => server.resume(),
    }
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    hold.join().expect("holder");
    drop(client);
    began.elapsed()
}

/// At most `bound` lines per call site at INFO and above, and the left-out counts show the
/// repeats the limit kept out.
fn check(outage: Outage, lines: &[Line], bound: usize) {
    let mut per_site: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (level, site, message) in lines {
        if *level <= log::Level::Info {
            let e = per_site.entry(site).or_insert((0, message));
            e.0 += 1;
        }
    }
    let allowed = |first: &str| {
        if per_event(first) {
            bound.max(PER_EVENT)
        } else {
            bound
        }
    };
    let suppressed: u64 = lines.iter().map(|(_, _, m)| left_out(m)).sum();
    let report: Vec<String> = per_site
        .iter()
        .map(|(site, (n, first))| format!("{n} × {site}: {first}"))
        .collect();
    let report = report.join("\n");

    // The negative control: the outage made lines repeat, more than the bound; only the
    // limit kept them out of the log.
    assert!(
        suppressed > bound as u64,
        "{outage:?}: only {suppressed} lines were left out: the outage did not repeat \
         anything, and the bound below proves nothing\n{report}"
    );
    // Something was logged at INFO or above (the outage is told).
    assert!(
        !per_site.is_empty(),
        "{outage:?}: nothing logged at INFO or above"
    );
    for (site, (n, first)) in &per_site {
        let most = allowed(first);
        assert!(
            *n <= most,
            "{outage:?}: {n} lines from {site} (at most {most} expected), the first: \
             {first}\n{report}"
        );
    }
    if std::env::var_os("DLOCK_TEST_LOG").is_some() {
        eprintln!("{outage:?}: {suppressed} lines left out, bound {bound}\n{report}");
    }
}

#[test]
fn left_out_counts_are_read() {
    assert_eq!(
        left_out("pub/sub: cannot connect (x) (12 more like this in the last 5 s were not logged)"),
        12
    );
    assert_eq!(left_out("pub/sub: connected again"), 0);
}
