//! The `dlock` command, run as the built binary against real servers: waiting and `--no-wait`,
//! renewal past several leases, lost locks (deleted key, paused Redis, fixed ttl, forced
//! release), signal forwarding, exit statuses, `status`, `release --force`, Classic interop
//! with SETNX/GETSET sent as the Java lockers send them, and unreachable or unauthenticated
//! servers.
//!
//! Needs the `cli` feature: `cargo test --features cli --test cli`.
#![cfg(feature = "cli")]

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis_dlock::Encoding;
use support::expiry::{self, epoch_ms};
use support::{raw, wait_until, RedisServer};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");
const BUSY: i32 = 75;
const LOST: i32 = 79;
const UNAVAILABLE: i32 = 69;
const DATA: i32 = 65;
const USAGE: i32 = 64;
/// Generous bound for a dlock run that should end by itself.
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// A shell script that records the signals it gets and waits for `$1/go`:
/// `started` once running (and it ends if the directory goes away),
/// `signals` gets one line per signal (TERM exits 43, INT 42, HUP 41, QUIT 40, USR1 39),
/// `done` when told to finish.
const HOLD: &str = r#"
trap 'echo TERM >> "$1/signals"; exit 43' TERM
trap 'echo INT >> "$1/signals"; exit 42' INT
trap 'echo HUP >> "$1/signals"; exit 41' HUP
trap 'echo QUIT >> "$1/signals"; exit 40' QUIT
trap 'echo USR1 >> "$1/signals"; exit 39' USR1
touch "$1/started"
while [ -d "$1" ] && [ ! -e "$1/go" ]; do sleep 0.05; done
touch "$1/done"
"#;

/// A private scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dlock-cli-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn has(&self, name: &str) -> bool {
        self.0.join(name).exists()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(name)).unwrap_or_default()
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.0.join(name), b"").expect("touch");
    }

    /// Waits for `name` to appear; panics after `EXIT_BOUND`.
    fn wait_for(&self, name: &str) {
        assert!(
            wait_until(EXIT_BOUND, || self.has(name)),
            "{name} never appeared in {}",
            self.0.display()
        );
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `dlock`, its stdout and stderr read on threads.
struct Dlock {
    child: Child,
    started: Instant,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

/// How a `dlock` ended.
#[derive(Debug)]
struct Ended {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Ended {
    fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("dlock died by a signal: {self:?}"))
    }
}

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

impl Dlock {
    /// `dlock ARGS` with `$REDIS_URL` = `url` (if any), stdin closed.
    fn spawn(url: Option<&str>, args: &[&str]) -> Dlock {
        Self::spawn_with(url, args, Stdio::null())
    }

    fn spawn_with(url: Option<&str>, args: &[&str], stdin: Stdio) -> Dlock {
        let mut cmd = Command::new(DLOCK);
        cmd.args(args)
            .env_remove("REDIS_URL")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(url) = url {
            cmd.env("REDIS_URL", url);
        }
        let mut child = cmd.spawn().expect("spawn dlock");
        let out = reader(child.stdout.take().expect("stdout"));
        let err = reader(child.stderr.take().expect("stderr"));
        Dlock {
            child,
            started: Instant::now(),
            out: Some(out),
            err: Some(err),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `sig` (a name for kill(1): TERM, INT, HUP) to this dlock only.
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} {}", self.pid());
    }

    /// Waits for the exit; kills it and panics after `bound`.
    fn wait(mut self, bound: Duration) -> Ended {
        let mut exited = None;
        wait_until(bound, || {
            exited = self.child.try_wait().expect("try_wait");
            exited.is_some()
        });
        let Some(status) = exited else {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let err = self.err.take().map(|h| h.join().unwrap_or_default());
            panic!("dlock did not exit within {bound:?}; stderr: {err:?}");
        };
        let took = self.started.elapsed();
        Ended {
            status,
            stdout: self
                .out
                .take()
                .map(|h| h.join().unwrap_or_default())
                .unwrap_or_default(),
            stderr: self
                .err
                .take()
                .map(|h| h.join().unwrap_or_default())
                .unwrap_or_default(),
            took,
        }
    }
}

impl Drop for Dlock {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `dlock ARGS` run to its end.
fn dlock(url: Option<&str>, args: &[&str]) -> Ended {
    Dlock::spawn(url, args).wait(EXIT_BOUND)
}

/// `dlock run --key KEY EXTRA... -- sh -c HOLD sh DIR`.
fn hold(url: &str, key: &str, extra: &[&str], dir: &Scratch) -> Dlock {
    let dir = dir.path().to_str().expect("utf-8 temp dir");
    let mut args = vec!["run", "--key", key];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", HOLD, "sh", dir]);
    Dlock::spawn(Some(url), &args)
}

/// A loopback port with nothing listening on it.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn second_run_waits_for_the_first_or_exits_75_with_no_wait() {
    let server = RedisServer::start();
    let url = server.url();
    let (a, b) = (Scratch::new(), Scratch::new());
    let first = hold(&url, "job", &[], &a);
    a.wait_for("started");

    let b_dir = b.path().to_str().unwrap().to_owned();
    let second = Dlock::spawn(
        Some(&url),
        &[
            "run",
            "--key",
            "job",
            "--wait",
            "60s",
            "--",
            "sh",
            "-c",
            r#"touch "$1/ran""#,
            "sh",
            &b_dir,
        ],
    );
    // With --no-wait: 75 at once, and the command does not run.
    let busy = dlock(
        Some(&url),
        &[
            "run",
            "--key",
            "job",
            "--no-wait",
            "--",
            "sh",
            "-c",
            r#"touch "$1/nowait""#,
            "sh",
            &b_dir,
        ],
    );
    assert_eq!(busy.code(), BUSY, "{busy:?}");
    assert!(busy.stderr.contains("busy"), "{busy:?}");
    assert!(!b.has("nowait"));
    // --quiet drops the busy message, not the status.
    let quiet = dlock(
        Some(&url),
        &["run", "--key", "job", "--no-wait", "--quiet", "--", "true"],
    );
    assert_eq!(quiet.code(), BUSY, "{quiet:?}");
    assert_eq!(quiet.stderr, "");
    // A bounded wait that runs out: 75 too, after the wait.
    let timed_out = dlock(
        Some(&url),
        &["run", "--key", "job", "--wait", "500ms", "--", "true"],
    );
    assert_eq!(timed_out.code(), BUSY, "{timed_out:?}");
    assert!(timed_out.stderr.contains("still busy"), "{timed_out:?}");
    assert!(
        timed_out.took >= Duration::from_millis(450),
        "{timed_out:?}"
    );

    // The waiting run has not run its command while the first holds the lock (given time to,
    // which it must not use).
    let mut second = second;
    thread::sleep(Duration::from_millis(500));
    assert!(
        second.is_running() && !b.has("ran"),
        "second run did not wait"
    );

    a.touch("go");
    let first = first.wait(EXIT_BOUND);
    assert_eq!(first.code(), 0, "{first:?}");
    let second = second.wait(EXIT_BOUND);
    assert_eq!(second.code(), 0, "{second:?}");
    assert!(b.has("ran"));
    assert!(
        !raw::exists(&mut server.conn(), "job"),
        "released at the end"
    );
}

#[test]
fn a_command_that_outlives_several_leases_keeps_its_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    // One run per strategy, at the same time, each for more than three leases of 1 s.
    let runs: Vec<(&str, Dlock)> = ["token", "reentrant", "classic"]
        .into_iter()
        .map(|s| {
            let key = format!("long-{s}");
            let d = Dlock::spawn(
                Some(&url),
                &[
                    "run",
                    "--key",
                    &key,
                    "--strategy",
                    s,
                    "--lease",
                    "1s",
                    "--",
                    "sleep",
                    "3.5",
                ],
            );
            (s, d)
        })
        .collect();
    assert!(wait_until(EXIT_BOUND, || ["token", "reentrant", "classic"]
        .iter()
        .all(|s| raw::exists(&mut conn, &format!("long-{s}")))));
    let token_value = raw::get(&mut conn, "long-token");
    let first_expiry = expiry::decode(
        Encoding::Decimal,
        &raw::get(&mut conn, "long-classic").expect("classic value"),
    );
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2800) {
        for s in ["token", "reentrant"] {
            let pttl = raw::pttl(&mut conn, &format!("long-{s}"));
            assert!(pttl > 0, "{s}: lease not renewed (pttl {pttl})");
        }
        assert_eq!(
            raw::get(&mut conn, "long-token"),
            token_value,
            "same holder"
        );
        let classic = raw::get(&mut conn, "long-classic").expect("classic still held");
        let expiry_ms = expiry::decode(Encoding::Decimal, &classic);
        assert!(expiry_ms > epoch_ms(), "classic expiry passed while held");
        // Time under test: sampled while the leases run past their length.
        thread::sleep(Duration::from_millis(100));
    }
    let last_expiry = expiry::decode(
        Encoding::Decimal,
        &raw::get(&mut conn, "long-classic").expect("classic value"),
    );
    assert!(
        last_expiry >= first_expiry + 1000,
        "the classic expiry moved on: {first_expiry} -> {last_expiry}"
    );
    for (s, d) in runs {
        let ended = d.wait(EXIT_BOUND);
        assert_eq!(ended.code(), 0, "{s}: {ended:?}");
        assert!(
            !raw::exists(&mut conn, &format!("long-{s}")),
            "{s}: released"
        );
    }
}

/// Waits for a run that must end lost: exit 79, a message, and SIGTERM for the command.
fn assert_lost(run: Dlock, dir: &Scratch, what: &str) -> Ended {
    let ended = run.wait(EXIT_BOUND);
    assert_eq!(ended.code(), LOST, "{what}: {ended:?}");
    assert!(ended.stderr.contains("LOST"), "{what}: {ended:?}");
    assert_eq!(
        dir.read("signals"),
        "TERM\n",
        "{what}: the command got SIGTERM"
    );
    assert!(!dir.has("done"), "{what}");
    ended
}

#[test]
fn a_deleted_key_is_a_lost_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let cases: [(&str, &[&str]); 4] = [
        ("token", &["--lease", "1s"]),
        ("reentrant", &["--strategy", "reentrant", "--lease", "1s"]),
        ("classic", &["--strategy", "classic", "--lease", "1s"]),
        ("fixed-ttl", &["--ttl", "20s"]),
    ];
    let mut conn = server.conn();
    let runs: Vec<_> = cases
        .iter()
        .map(|(name, extra)| {
            let dir = Scratch::new();
            let run = hold(&url, &format!("del-{name}"), extra, &dir);
            (*name, dir, run)
        })
        .collect();
    for (name, dir, _) in &runs {
        dir.wait_for("started");
        raw::del(&mut conn, &format!("del-{name}"));
    }
    for (name, dir, run) in runs {
        let ended = assert_lost(run, &dir, name);
        // Found within a renewal or check period (1/3 s; 20s/3 for the fixed ttl), far
        // from the 20 s ttl or the kill-after.
        assert!(ended.took < Duration::from_secs(15), "{name}: {ended:?}");
    }
}

/// `--permits 2`: two runs hold a permit each while a third is refused (`--no-wait`) or waits,
/// and runs once one of the two ends; a permit that disappears from the semaphore while its
/// command runs is a loss, as a lock's is.
#[test]
fn permits_run_at_most_n_copies_and_a_vanished_permit_is_a_loss() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let permit = ["--permits", "2", "--lease", "1s"];
    let dirs = [Scratch::new(), Scratch::new()];
    let mut runs: Vec<_> = dirs.iter().map(|d| hold(&url, "sem", &permit, d)).collect();
    for d in &dirs {
        d.wait_for("started");
    }
    assert_eq!(raw::get_i64(&mut conn, "sem"), 0, "both permits taken");
    let third = Scratch::new();
    let third_dir = third.path().to_str().expect("utf-8").to_owned();
    let touch = |name: &str| {
        vec![
            "--".to_owned(),
            "sh".to_owned(),
            "-c".to_owned(),
            format!(r#"touch "$1/{name}""#),
            "sh".to_owned(),
            third_dir.clone(),
        ]
    };
    let args = |wait: &[&str], name: &str| -> Vec<String> {
        let mut a: Vec<String> = ["run", "--key", "sem", "--permits", "2"]
            .iter()
            .chain(wait)
            .map(|s| s.to_string())
            .collect();
        a.extend(touch(name));
        a
    };
    let busy = Dlock::spawn(
        Some(&url),
        &args(&["--no-wait"], "nowait")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .wait(EXIT_BOUND);
    assert_eq!(busy.code(), BUSY, "{busy:?}");
    assert!(!third.has("nowait"));
    let mut waiting = Dlock::spawn(
        Some(&url),
        &args(&["--wait", "60s"], "ran")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    thread::sleep(Duration::from_millis(500));
    assert!(
        waiting.is_running() && !third.has("ran"),
        "the third did not wait"
    );
    dirs[0].touch("go");
    let first = runs.remove(0).wait(EXIT_BOUND);
    assert_eq!(first.code(), 0, "{first:?}");
    let waited = waiting.wait(EXIT_BOUND);
    assert_eq!(waited.code(), 0, "{waited:?}");
    assert!(third.has("ran"));

    // The second run's permit vanishes (its sorted set deleted): a loss.
    raw::del(&mut conn, "{sem}:timeout");
    let ended = assert_lost(runs.remove(0), &dirs[1], "a vanished permit");
    assert!(ended.took < Duration::from_secs(15), "{ended:?}");
}

#[test]
fn redis_paused_past_the_lease_is_a_lost_lock() {
    let server = RedisServer::start();
    let dir = Scratch::new();
    let run = hold(&server.url(), "paused", &["--lease", "1s"], &dir);
    dir.wait_for("started");
    server.pause();
    // Seen while Redis is still frozen: the lease ran out by the local clock.
    let signalled = wait_until(Duration::from_secs(15), || dir.has("signals"));
    server.resume();
    assert!(signalled, "no SIGTERM while Redis was paused");
    let ended = assert_lost(run, &dir, "paused");
    assert!(ended.stderr.contains("lease ran out"), "{ended:?}");
}

#[test]
fn a_fixed_ttl_that_passes_is_a_loss_and_sigkill_follows_an_ignored_sigterm() {
    let server = RedisServer::start();
    let dir = Scratch::new();
    let d = dir.path().to_str().unwrap();
    // The command ignores SIGTERM (and `exec`s so the ignoring process is the one killed).
    let script = r#"trap '' TERM; touch "$1/started"; exec sleep 60"#;
    let run = Dlock::spawn(
        Some(&server.url()),
        &[
            "run",
            "--key",
            "ttl",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            d,
        ],
    );
    dir.wait_for("started");
    let ended = run.wait(EXIT_BOUND);
    assert_eq!(ended.code(), LOST, "{ended:?}");
    assert!(ended.stderr.contains("--ttl"), "{ended:?}");
    assert!(ended.stderr.contains("SIGKILL"), "{ended:?}");
    assert!(ended.took < Duration::from_secs(20), "{ended:?}");
}

#[test]
fn signals_reach_the_command_and_its_status_passes_through() {
    let server = RedisServer::start();
    let url = server.url();
    let cases = [
        ("TERM", 43),
        ("INT", 42),
        ("HUP", 41),
        ("QUIT", 40),
        ("USR1", 39),
    ];
    let runs: Vec<_> = cases
        .iter()
        .map(|(sig, _)| {
            let dir = Scratch::new();
            let run = hold(&url, &format!("sig-{sig}"), &[], &dir);
            (dir, run)
        })
        .collect();
    for ((sig, status), (dir, run)) in cases.iter().zip(runs) {
        dir.wait_for("started");
        run.signal(sig);
        let ended = run.wait(EXIT_BOUND);
        assert_eq!(ended.code(), *status, "SIG{sig}: {ended:?}");
        assert_eq!(
            dir.read("signals"),
            format!("{sig}\n"),
            "SIG{sig} reached it once"
        );
        assert!(!raw::exists(&mut server.conn(), &format!("sig-{sig}")));
    }
}

/// Ctrl-C at a terminal: the terminal signals its whole foreground process group, the command
/// included, so dlock must not forward that SIGINT a second time. The command's trap takes
/// 0.3 s, so a second SIGINT would be recorded as a second line. Runs dlock on a pseudo
/// terminal made by script(1) (util-linux).
#[test]
fn ctrl_c_at_a_terminal_reaches_the_command_once() {
    let server = RedisServer::start();
    let dir = Scratch::new();
    let d = dir.path().to_str().unwrap();
    std::fs::write(
        dir.path().join("cmd.sh"),
        r#"trap 'echo INT >> "$1/signals"; sleep 0.3' INT
touch "$1/started"
while [ ! -e "$1/signals" ]; do sleep 0.05; done
sleep 1
exit 42
"#,
    )
    .expect("write script");
    // `exec`: dlock is then the terminal's foreground job alone, as when an interactive shell
    // starts it. script(1) runs the line with $SHELL (sh when unset); a shell left waiting in
    // the same process group would take the Ctrl-C itself and report 130, whatever dlock does.
    let line = format!("exec {DLOCK} run --key tty -- sh {d}/cmd.sh {d}");
    let mut script = Command::new("script")
        .args(["-q", "-f", "-e", "-c", &line, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env("REDIS_URL", server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("script(1) from util-linux");
    let mut keyboard = script.stdin.take().expect("stdin");
    dir.wait_for("started");
    keyboard.write_all(b"\x03").expect("type Ctrl-C");
    keyboard.flush().expect("flush");
    let mut exited = None;
    wait_until(EXIT_BOUND, || {
        exited = script.try_wait().expect("try_wait");
        exited.is_some()
    });
    let status = exited.expect("dlock under script(1) did not exit");
    drop(keyboard);
    assert_eq!(
        status.code(),
        Some(42),
        "the command's status through script -e"
    );
    assert_eq!(dir.read("signals"), "INT\n", "one SIGINT, not two");
    assert!(!raw::exists(&mut server.conn(), "tty"));
}

/// A dlock killed outright cannot renew any more: on Linux its command gets SIGTERM.
#[cfg(target_os = "linux")]
#[test]
fn a_command_whose_dlock_is_killed_gets_sigterm() {
    use std::os::unix::process::ExitStatusExt;
    let server = RedisServer::start();
    let dir = Scratch::new();
    let run = hold(&server.url(), "orphan", &[], &dir);
    dir.wait_for("started");
    let mut run = run;
    run.signal("KILL");
    assert!(wait_until(EXIT_BOUND, || !run.is_running()));
    assert_eq!(run.child.wait().expect("status").signal(), Some(9));
    // Not `run.wait()`: without the fix the command lives on and holds dlock's pipes open.
    let got_term = wait_until(Duration::from_secs(10), || dir.read("signals") == "TERM\n");
    if !got_term {
        dir.touch("go"); // let the orphan end
    }
    assert!(
        got_term,
        "the command did not get SIGTERM: {:?}",
        dir.read("signals")
    );
}

#[test]
fn exit_status_and_standard_streams_pass_through() {
    let server = RedisServer::start();
    let url = Some(server.url());
    let url = url.as_deref();
    let code = |script: &str| dlock(url, &["run", "--key", "st", "--", "sh", "-c", script]);
    assert_eq!(code("exit 0").code(), 0);
    assert_eq!(code("exit 42").code(), 42);
    assert_eq!(code("exit 75").code(), 75, "the command's own 75 too");
    // Killed by a signal: 128 + the signal, as a shell reports it.
    assert_eq!(code("kill -KILL $$").code(), 128 + 9);
    let missing = dlock(url, &["run", "--key", "st", "--", "/nonexistent/command"]);
    assert_eq!(missing.code(), 127, "{missing:?}");
    let dir = Scratch::new();
    let not_executable = dlock(
        url,
        &["run", "--key", "st", "--", dir.path().to_str().unwrap()],
    );
    assert_eq!(not_executable.code(), 126, "{not_executable:?}");
    assert!(
        !raw::exists(&mut server.conn(), "st"),
        "released after each"
    );

    // stdin in, stdout and stderr out.
    let mut run = Dlock::spawn_with(
        url,
        &[
            "run",
            "--key",
            "st",
            "--",
            "sh",
            "-c",
            "tr a-z A-Z; echo to-stderr >&2",
        ],
        Stdio::piped(),
    );
    let mut stdin = run.child.stdin.take().expect("stdin");
    stdin.write_all(b"hello\n").expect("write");
    drop(stdin);
    let ended = run.wait(EXIT_BOUND);
    assert_eq!(ended.code(), 0, "{ended:?}");
    assert_eq!(ended.stdout, "HELLO\n");
    assert_eq!(ended.stderr, "to-stderr\n");
}

#[test]
fn status_and_forced_release() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let status = |key: &str| dlock(Some(&url), &["status", "--key", key]);

    let free = status("st");
    assert_eq!(free.code(), 1, "{free:?}");
    assert!(free.stdout.contains("free"), "{free:?}");

    let dir = Scratch::new();
    let run = hold(&url, "st", &["--lease", "1s"], &dir);
    dir.wait_for("started");
    let held = status("st");
    assert_eq!(held.code(), 0, "{held:?}");
    let token = String::from_utf8(raw::get(&mut conn, "st").expect("held")).unwrap();
    assert!(held.stdout.contains("kind: token"), "{held:?}");
    assert!(
        held.stdout.contains(&format!("holder: {token}")),
        "{held:?}"
    );
    assert!(held.stdout.contains("ttl: "), "{held:?}");

    // release needs --force; with it, the holder's run sees its lock lost.
    let refused = dlock(Some(&url), &["release", "--key", "st"]);
    assert_eq!(refused.code(), USAGE, "{refused:?}");
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    assert!(raw::exists(&mut conn, "st"));
    let released = dlock(Some(&url), &["release", "--key", "st", "--force"]);
    assert_eq!(released.code(), 0, "{released:?}");
    assert!(!raw::exists(&mut conn, "st"));
    assert_lost(run, &dir, "forced release");
    let nothing = dlock(Some(&url), &["release", "--key", "st", "--force"]);
    assert_eq!(nothing.code(), 1, "{nothing:?}");

    // A reentrant holder: a hash.
    let dir = Scratch::new();
    let run = hold(&url, "re", &["--strategy", "reentrant"], &dir);
    dir.wait_for("started");
    let held = status("re");
    assert_eq!(held.code(), 0, "{held:?}");
    assert!(held.stdout.contains("kind: hash"), "{held:?}");
    assert!(held.stdout.contains("(count 1)"), "{held:?}");
    dir.touch("go");
    assert_eq!(run.wait(EXIT_BOUND).code(), 0);

    // Classic values written by a legacy locker: live, then stale.
    let live = (epoch_ms() + 60_000).to_string();
    raw::set(&mut conn, "cl", live.as_bytes());
    let held = status("cl");
    assert_eq!(held.code(), 0, "{held:?}");
    assert!(held.stdout.contains("kind: classic (decimal)"), "{held:?}");
    assert!(held.stdout.contains(&format!("expiry: {live}")), "{held:?}");
    raw::set(
        &mut conn,
        "cl",
        &expiry::encode(Encoding::BigEndian, epoch_ms() - 5_000),
    );
    let stale = status("cl");
    assert_eq!(stale.code(), 1, "a stale classic lock is free: {stale:?}");
    assert!(
        stale.stdout.contains("kind: classic (big-endian)"),
        "{stale:?}"
    );
    assert!(stale.stdout.contains("expired"), "{stale:?}");

    // `dlock run` writes every family's format, and `status` names it.
    for (name, shape) in [
        ("float-seconds", "a float of seconds"),
        ("uuid-ms", "<uuid>:<ms>"),
        ("nanos", "19 digits"),
    ] {
        let key = format!("cl:{name}");
        let dir = Scratch::new();
        let run = hold(
            &url,
            &key,
            &["--strategy", "classic", "--classic-encoding", name],
            &dir,
        );
        dir.wait_for("started");
        let value = String::from_utf8(raw::get(&mut conn, &key).expect("held")).unwrap();
        let fits = match name {
            "float-seconds" => value.split_once('.').is_some_and(|(s, _)| s.len() == 10),
            "uuid-ms" => value.len() == 36 + 1 + 13 && value.as_bytes()[36] == b':',
            _ => value.len() == 19 && value.bytes().all(|b| b.is_ascii_digit()),
        };
        assert!(fits, "{name}: {value:?} is not {shape}");
        let held = status(&key);
        assert_eq!(held.code(), 0, "{held:?}");
        assert!(
            held.stdout.contains(&format!("kind: classic ({name})")),
            "{held:?}"
        );
        dir.touch("go");
        assert_eq!(run.wait(EXIT_BOUND).code(), 0);
        assert!(!raw::exists(&mut conn, &key), "{name}: released");
    }
}

/// One attempt of the legacy Java locker, command for command: `SETNX key <expiry>`; on 0,
/// `GET key` and, when that expiry has passed, `GETSET key <expiry>`, won if the old value is
/// the one read. With `expire_secs` (the 8-byte locker) an `EXPIRE` follows a win. Returns the
/// value written when it won.
fn java_try_lock(
    conn: &mut redis::Connection,
    key: &str,
    encoding: Encoding,
    timeout_ms: i64,
    expire_secs: Option<u64>,
) -> Option<Vec<u8>> {
    let value = expiry::encode(encoding, epoch_ms() + timeout_ms + 1);
    let expire = |conn: &mut redis::Connection| {
        if let Some(secs) = expire_secs {
            let _: i64 = redis::cmd("EXPIRE")
                .arg(key)
                .arg(secs)
                .query(conn)
                .expect("EXPIRE");
        }
    };
    let set: i64 = redis::cmd("SETNX")
        .arg(key)
        .arg(&value)
        .query(conn)
        .expect("SETNX");
    if set == 1 {
        expire(conn);
        return Some(value);
    }
    let current: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(conn).expect("GET");
    let current = current?;
    if expiry::decode(encoding, &current) >= epoch_ms() {
        return None;
    }
    let old: Option<Vec<u8>> = redis::cmd("GETSET")
        .arg(key)
        .arg(&value)
        .query(conn)
        .expect("GETSET");
    if old.as_deref() == Some(&current[..]) {
        expire(conn);
        Some(value)
    } else {
        None
    }
}

#[test]
fn classic_interlocks_with_java_setnx_getset_lockers() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let classic = |key: &str, extra: &[&str], cmd: &[&str]| {
        let mut args = vec!["run", "--key", key, "--strategy", "classic"];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(cmd);
        dlock(Some(&url), &args)
    };

    // A Java holder (decimal, no TTL) keeps dlock out: at once with --no-wait, and after the
    // legacy retries (5 × 200 ms) by default.
    assert!(java_try_lock(&mut conn, "j", Encoding::Decimal, 60_000, None).is_some());
    let busy = classic("j", &["--no-wait"], &["true"]);
    assert_eq!(busy.code(), BUSY, "{busy:?}");
    let retried = classic("j", &[], &["true"]);
    assert_eq!(retried.code(), BUSY, "{retried:?}");
    assert!(retried.stderr.contains("6 attempts"), "{retried:?}");
    assert!(retried.took >= Duration::from_millis(900), "{retried:?}");

    // A stale Java lock (its expiry passed, no TTL) is taken over, and freed after the run.
    raw::set(&mut conn, "j", (epoch_ms() - 10_000).to_string().as_bytes());
    let took_over = classic("j", &["--no-wait"], &["true"]);
    assert_eq!(took_over.code(), 0, "{took_over:?}");
    assert!(!raw::exists(&mut conn, "j"));

    // dlock holds: the Java locker sees a live decimal expiry and fails, however often.
    let dir = Scratch::new();
    let run = hold(&url, "j", &["--strategy", "classic", "--lease", "1s"], &dir);
    dir.wait_for("started");
    for _ in 0..15 {
        assert_eq!(
            java_try_lock(&mut conn, "j", Encoding::Decimal, 1_000, None),
            None
        );
        // Time under test: tried while the 1 s lease runs past its length.
        thread::sleep(Duration::from_millis(100));
    }
    let value = raw::get(&mut conn, "j").expect("held");
    assert!(expiry::decode(Encoding::Decimal, &value) > epoch_ms());
    assert_eq!(
        raw::pttl(&mut conn, "j"),
        -1,
        "decimal: no key TTL, as the legacy locker"
    );
    dir.touch("go");
    assert_eq!(run.wait(EXIT_BOUND).code(), 0);
    assert!(java_try_lock(&mut conn, "j", Encoding::Decimal, 1_000, None).is_some());

    // The 8-byte locker (with EXPIRE): each keeps the other out.
    assert!(java_try_lock(&mut conn, "b", Encoding::BigEndian, 60_000, Some(60)).is_some());
    let busy = classic(
        "b",
        &["--classic-encoding", "big-endian", "--no-wait"],
        &["true"],
    );
    assert_eq!(busy.code(), BUSY, "{busy:?}");
    // A decimal dlock does not read an 8-byte value: it refuses, and leaves it alone.
    let mismatch = classic("b", &["--no-wait"], &["true"]);
    assert_eq!(mismatch.code(), DATA, "{mismatch:?}");
    assert!(raw::exists(&mut conn, "b"));
    raw::del(&mut conn, "b");
    let dir = Scratch::new();
    let run = hold(
        &url,
        "b",
        &[
            "--strategy",
            "classic",
            "--classic-encoding",
            "big-endian",
            "--lease",
            "1s",
        ],
        &dir,
    );
    dir.wait_for("started");
    for _ in 0..15 {
        assert_eq!(
            java_try_lock(&mut conn, "b", Encoding::BigEndian, 1_000, Some(1)),
            None
        );
        let value = raw::get(&mut conn, "b").expect("held");
        assert_eq!(value.len(), 8, "8-byte value");
        assert!(expiry::decode(Encoding::BigEndian, &value) > epoch_ms());
        assert!(
            raw::pttl(&mut conn, "b") > 0,
            "big-endian: the key has a TTL"
        );
        // Time under test: sampled while the lease runs past its length.
        thread::sleep(Duration::from_millis(100));
    }
    dir.touch("go");
    assert_eq!(run.wait(EXIT_BOUND).code(), 0);
    assert!(!raw::exists(&mut conn, "b"));
}

#[test]
fn unreachable_or_unauthenticated_redis_exits_69() {
    let dead = format!("redis://127.0.0.1:{}/", closed_port());
    for args in [
        &["run", "--key", "k", "--", "true"][..],
        &["status", "--key", "k"],
        &["release", "--key", "k", "--force"],
    ] {
        let ended = dlock(Some(&dead), args);
        assert_eq!(ended.code(), UNAVAILABLE, "{args:?}: {ended:?}");
        assert!(
            ended.stderr.contains("cannot reach Redis"),
            "{args:?}: {ended:?}"
        );
    }

    let secret = "the-right-secret";
    let server = RedisServer::start();
    // Set after the start: the fixture's readiness check pings without a password.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(secret)
        .query(&mut server.conn())
        .expect("CONFIG SET requirepass");
    let port = server.port();
    let wrong_secret = "not-the-secret-4711";
    let wrong = format!("redis://:{wrong_secret}@127.0.0.1:{port}/");
    let none = format!("redis://127.0.0.1:{port}/");
    for url in [&wrong, &none] {
        for args in [
            &["run", "--key", "k", "--", "true"][..],
            &["status", "--key", "k"],
        ] {
            let ended = dlock(Some(url), args);
            assert_eq!(ended.code(), UNAVAILABLE, "{url} {args:?}: {ended:?}");
            assert!(
                ended.stderr.contains("authentication failed"),
                "{url} {args:?}: {ended:?}"
            );
            assert!(
                !ended.stderr.contains(wrong_secret),
                "password printed: {ended:?}"
            );
        }
    }
    // A user the ACL does not let run scripts: told apart by the reply's code (NOPERM).
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "u", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha",
        ])
        .query(
            &mut redis::Client::open(format!("redis://:{secret}@127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection())
                .expect("admin connection"),
        )
        .expect("ACL SETUSER");
    let denied = format!("redis://u:pw@127.0.0.1:{port}/");
    let ended = dlock(Some(&denied), &["run", "--key", "k", "--", "true"]);
    assert_eq!(ended.code(), UNAVAILABLE, "{ended:?}");
    assert!(
        ended.stderr.contains("the ACL user may not run") && ended.stderr.contains("NOPERM"),
        "{ended:?}"
    );
    let right = format!("redis://:{secret}@127.0.0.1:{port}/");
    let ok = dlock(Some(&right), &["run", "--key", "k", "--", "true"]);
    assert_eq!(ok.code(), 0, "{ok:?}");
}

#[test]
fn usage_errors_exit_64_and_the_url_defaults_to_redis_url() {
    let server = RedisServer::start();
    let url = server.url();
    let no_url = dlock(None, &["run", "--key", "k", "--", "true"]);
    assert_eq!(no_url.code(), USAGE, "{no_url:?}");
    assert!(no_url.stderr.contains("REDIS_URL"), "{no_url:?}");
    for bad in [
        &["run", "--key", "k"][..],
        &["run", "--key", "k", "--wait", "soon", "--", "true"],
        &["run", "--key", "k", "--bogus", "--", "true"],
        &[
            "run",
            "--key",
            "k",
            "--strategy",
            "token",
            "--classic-encoding",
            "decimal",
            "--",
            "true",
        ],
        &["status"],
        &["lock", "--key", "k"],
    ] {
        let ended = dlock(Some(&url), bad);
        assert_eq!(ended.code(), USAGE, "{bad:?}: {ended:?}");
    }
    // From $REDIS_URL, and --url wins over it.
    let from_env = dlock(Some(&url), &["run", "--key", "k", "--", "true"]);
    assert_eq!(from_env.code(), 0, "{from_env:?}");
    let dead = format!("redis://127.0.0.1:{}/", closed_port());
    let from_flag = dlock(
        Some(&dead),
        &["run", "--url", &url, "--key", "k", "--", "true"],
    );
    assert_eq!(from_flag.code(), 0, "{from_flag:?}");
    let help = dlock(None, &["--help"]);
    assert_eq!(help.code(), 0);
    assert!(help.stdout.contains("dlock run"), "{help:?}");
}

/// `--strategy fair`: a second run queues in Redis behind the first and runs its command only
/// after the first one's has finished; `status` reports the fair holder and its queue, and
/// `release --force` takes the lock from a fair holder (whose run then ends lost) while its
/// queued waiter goes on.
#[test]
fn fair_runs_take_turns_and_status_and_forced_release_know_them() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let status = |key: &str| dlock(Some(&url), &["status", "--key", key]);
    let queued = |conn: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("ZCARD")
            .arg(format!("dlock_fair_q:{{{key}}}"))
            .query(conn)
            .expect("ZCARD")
    };

    let (a, b) = (Scratch::new(), Scratch::new());
    let first = hold(&url, "fair-job", &["--strategy", "fair"], &a);
    a.wait_for("started");
    let held = status("fair-job");
    assert_eq!(held.code(), 0, "{held:?}");
    let token = String::from_utf8(raw::get(&mut conn, "fair-job").expect("held")).unwrap();
    assert!(held.stdout.contains("kind: fair"), "{held:?}");
    assert!(
        held.stdout.contains(&format!("holder: {token}")),
        "{held:?}"
    );
    assert!(held.stdout.contains("ttl: "), "{held:?}");
    assert!(held.stdout.contains("waiters: 0"), "{held:?}");

    // The second run's command records whether the first one's had finished when it started.
    let (a_dir, b_dir) = (
        a.path().to_str().unwrap().to_owned(),
        b.path().to_str().unwrap().to_owned(),
    );
    let mut second = Dlock::spawn(
        Some(&url),
        &[
            "run",
            "--key",
            "fair-job",
            "--strategy",
            "fair",
            "--wait",
            "60s",
            "--",
            "sh",
            "-c",
            r#"if [ -e "$1/done" ]; then touch "$2/after"; fi; touch "$2/ran""#,
            "sh",
            &a_dir,
            &b_dir,
        ],
    );
    assert!(
        wait_until(EXIT_BOUND, || queued(&mut conn, "fair-job") == 1),
        "the second run queued in Redis"
    );
    let waiting = status("fair-job");
    assert!(waiting.stdout.contains("waiters: 1"), "{waiting:?}");
    // Given time to run its command, which it must not.
    thread::sleep(Duration::from_millis(500));
    assert!(
        second.is_running() && !b.has("ran"),
        "the second run waited"
    );

    a.touch("go");
    let first = first.wait(EXIT_BOUND);
    assert_eq!(first.code(), 0, "{first:?}");
    let second = second.wait(EXIT_BOUND);
    assert_eq!(second.code(), 0, "{second:?}");
    assert!(b.has("ran"));
    assert!(b.has("after"), "the commands overlapped");
    assert!(!raw::exists(&mut conn, "fair-job"), "released at the end");
    assert_eq!(queued(&mut conn, "fair-job"), 0);
    assert_eq!(status("fair-job").code(), 1);

    // A forced release: the holder's run ends lost, and the queued waiter gets the lock.
    let (c, d) = (Scratch::new(), Scratch::new());
    let holder = hold(
        &url,
        "fair-rel",
        &["--strategy", "fair", "--lease", "1s"],
        &c,
    );
    c.wait_for("started");
    let waiter = hold(
        &url,
        "fair-rel",
        &["--strategy", "fair", "--wait", "60s"],
        &d,
    );
    assert!(
        wait_until(EXIT_BOUND, || queued(&mut conn, "fair-rel") == 1),
        "the waiter queued"
    );
    let released = dlock(Some(&url), &["release", "--key", "fair-rel", "--force"]);
    assert_eq!(released.code(), 0, "{released:?}");
    assert_lost(holder, &c, "forced release of a fair lock");
    d.wait_for("started");
    let taken = String::from_utf8(raw::get(&mut conn, "fair-rel").expect("held")).unwrap();
    let now = status("fair-rel");
    assert!(now.stdout.contains("kind: fair"), "{now:?}");
    assert!(now.stdout.contains(&format!("holder: {taken}")), "{now:?}");
    d.touch("go");
    let waiter = waiter.wait(EXIT_BOUND);
    assert_eq!(waiter.code(), 0, "{waiter:?}");

    // A key whose braces form no hash tag: the queue has another name, which status finds.
    let e = Scratch::new();
    let odd = hold(&url, "odd{}job", &["--strategy", "fair"], &e);
    e.wait_for("started");
    let odd_status = status("odd{}job");
    assert!(odd_status.stdout.contains("kind: fair"), "{odd_status:?}");
    assert!(odd_status.stdout.contains("waiters: 0"), "{odd_status:?}");
    e.touch("go");
    assert_eq!(odd.wait(EXIT_BOUND).code(), 0);
}

/// The keys whose name contains `part` (a lock's key and its companions: a fair queue, ...).
fn keys_like(conn: &mut redis::Connection, part: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("*{part}*"))
        .query(conn)
        .expect("KEYS")
}

/// `parts` joined into one argument list.
fn joined(parts: &[&[&str]]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.iter().map(|a| a.to_string()))
        .collect()
}

/// `dlock ARGS` (owned) run to its end, with no URL in the environment.
fn dlock_owned(args: &[String]) -> Ended {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    dlock(None, &args)
}

/// `dlock run`, `status` and `release` through Sentinel (`--sentinel URL --master NAME`) and
/// on a Cluster (`--cluster URL`): the lock lands on the master the Sentinels name, or on the
/// node that owns its slot. Through Sentinel each write waits for a replica: with the replica
/// cut off, the lock is not taken and the command does not run (exit 69, saying why).
#[test]
fn sentinel_and_cluster_deployments() {
    let set = support::Sentinel::start(1, 1);
    let urls = set.sentinel_urls();
    let mut via: Vec<&str> = vec!["--master", support::SENTINEL_SERVICE];
    for u in &urls {
        via.extend_from_slice(&["--sentinel", u.as_str()]);
    }
    // A run holds the lock on the master; status and release find it there.
    let dir = Scratch::new();
    let d = dir.path().to_str().expect("utf-8 temp dir");
    let args = joined(&[
        &["run"],
        &via,
        &["--key", "sn", "--", "sh", "-c", HOLD, "sh", d],
    ]);
    let run = Dlock::spawn(None, &args.iter().map(String::as_str).collect::<Vec<_>>());
    dir.wait_for("started");
    let token = raw::get(&mut set.server(0).conn(), "sn").expect("held on the master");
    let held = dlock_owned(&joined(&[&["status"], &via, &["--key", "sn"]]));
    assert_eq!(held.code(), 0, "{held:?}");
    let token = String::from_utf8(token).unwrap();
    assert!(
        held.stdout.contains(&format!("holder: {token}")),
        "{held:?}"
    );
    dir.touch("go");
    assert_eq!(run.wait(EXIT_BOUND).code(), 0);
    let free = dlock_owned(&joined(&[&["status"], &via, &["--key", "sn"]]));
    assert_eq!(free.code(), 1, "{free:?}");

    // The replica frozen, its link still open: the master still lists it, so `auto` requires
    // it, and nothing confirms the lock: exit 69, and the refused write was undone before
    // dlock exited (checked at once, no waiting): the next run need not wait out the lease.
    set.server(1).pause();
    let refused = dlock_owned(&joined(&[
        &["run"],
        &via,
        &["--key", "sn-auto", "--no-wait", "--ttl", "1h", "--", "true"],
    ]));
    assert_eq!(refused.code(), UNAVAILABLE, "{refused:?}");
    assert!(refused.stderr.contains("replicas"), "{refused:?}");
    assert!(
        !raw::exists(&mut set.server(0).conn(), "sn-auto"),
        "the refused run (auto) left its write on the master"
    );
    set.server(1).resume();

    // The replica cut off (frozen, its link closed): no replica confirms the lock. A dlock
    // started now meets a master without a replica, which `auto` takes as a deployment
    // without replicas: a job that must not run then asks for one.
    set.cut_the_replica_off();
    let ran = dir.path().join("ran");
    let ran_path = ran.to_str().unwrap();
    let refused = dlock_owned(&joined(&[
        &["run"],
        &via,
        &[
            "--key",
            "sn",
            "--no-wait",
            "--replica-acks",
            "1",
            "--",
            "touch",
            ran_path,
        ],
    ]));
    assert_eq!(refused.code(), UNAVAILABLE, "{refused:?}");
    assert!(refused.stderr.contains("replicas"), "{refused:?}");
    assert!(!ran.exists(), "the command ran without a confirmed lock");
    // The refused write was undone before dlock exited: the next run need not wait out the
    // lease (checked as soon as it exits, no waiting).
    let mut master = set.server(0).conn();
    assert!(
        !raw::exists(&mut master, "sn"),
        "the refused run left its write on the master"
    );
    // The same directly on the primary, for each strategy dlock runs (a lease and a fixed
    // --ttl), and a run that waits (its attempts retried until --wait ends).
    let primary = set.server(0).url();
    for (strategy, extra) in [
        ("token", &["--no-wait"][..]),
        ("token", &["--no-wait", "--ttl", "1h"][..]),
        ("token", &["--wait", "1500ms"][..]),
        ("classic", &["--no-wait"][..]),
        ("reentrant", &["--no-wait"][..]),
        ("fair", &["--no-wait"][..]),
    ] {
        let key = format!("undone:{strategy}:{}", extra.len());
        let mut args = vec![
            "run",
            "--key",
            &key,
            "--strategy",
            strategy,
            "--replica-acks",
            "1",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "touch", ran_path]);
        let refused = dlock(Some(&primary), &args);
        assert_eq!(
            refused.code(),
            UNAVAILABLE,
            "{strategy} {extra:?}: {refused:?}"
        );
        assert!(
            !ran.exists(),
            "{strategy}: the command ran without a confirmed lock"
        );
        assert!(
            keys_like(&mut master, &key).is_empty(),
            "{strategy} {extra:?}: the refused run left {:?} on the primary",
            keys_like(&mut master, &key)
        );
    }
    set.server(1).resume();

    // A cluster: the key's node holds it.
    let cluster = support::Cluster::start(3);
    let seeds = cluster.urls();
    let on: Vec<&str> = vec![
        "--cluster",
        seeds[0].as_str(),
        "--cluster",
        seeds[1].as_str(),
    ];
    let dir = Scratch::new();
    let d = dir.path().to_str().expect("utf-8 temp dir");
    let args = joined(&[
        &["run"],
        &on,
        &["--key", "cl:k", "--", "sh", "-c", HOLD, "sh", d],
    ]);
    let run = Dlock::spawn(None, &args.iter().map(String::as_str).collect::<Vec<_>>());
    dir.wait_for("started");
    let held = dlock_owned(&joined(&[&["status"], &on, &["--key", "cl:k"]]));
    assert_eq!(held.code(), 0, "{held:?}");
    assert!(held.stdout.contains("kind: token"), "{held:?}");
    let released = dlock_owned(&joined(&[&["release"], &on, &["--key", "cl:k", "--force"]]));
    assert_eq!(released.code(), 0, "{released:?}");
    assert_lost(run, &dir, "forced release on a cluster");
}

/// The other fleets' flags: `--shedlock` (with `--at-least`), `--spring-registry`, and the
/// Classic encodings of the float-seconds, uuid:ms and nanosecond families; `status` names
/// what each wrote.
#[test]
fn shedlock_spring_and_classic_family_flags() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let status = |key: &str| dlock(Some(&url), &["status", "--key", key]);

    // ShedLock: the job's key, ShedLock's value, kept until --at-least after the start.
    let job = "job-lock:default:nightly";
    let ran = dlock(
        Some(&url),
        &[
            "run",
            "--shedlock",
            "nightly",
            "--ttl",
            "10s",
            "--at-least",
            "3s",
            "--no-wait",
            "--",
            "true",
        ],
    );
    assert_eq!(ran.code(), 0, "{ran:?}");
    let value = String::from_utf8(raw::get(&mut conn, job).expect("kept after the run")).unwrap();
    assert!(
        value.starts_with("ADDED:") && value.contains('@'),
        "{value}"
    );
    let pttl = raw::pttl(&mut conn, job);
    assert!(
        pttl > 0 && pttl <= 3_000,
        "kept for the rest of --at-least: {pttl} ms"
    );
    let held = status(job);
    assert_eq!(held.code(), 0, "{held:?}");
    assert!(held.stdout.contains("kind: shedlock"), "{held:?}");
    // A second run of the job meanwhile is skipped.
    let again = dlock(
        Some(&url),
        &[
            "run",
            "--shedlock",
            "nightly",
            "--ttl",
            "10s",
            "--no-wait",
            "--",
            "true",
        ],
    );
    assert_eq!(again.code(), BUSY, "{again:?}");
    // --shedlock-env names ShedLock's environment.
    let other_env = dlock(
        Some(&url),
        &[
            "run",
            "--shedlock",
            "nightly",
            "--shedlock-env",
            "prod",
            "--ttl",
            "10s",
            "--at-least",
            "1s",
            "--no-wait",
            "--",
            "true",
        ],
    );
    assert_eq!(other_env.code(), 0, "{other_env:?}");
    assert!(raw::exists(&mut conn, "job-lock:prod:nightly"));

    // Spring: the registry's key <registry>:<lock key>, a UUID value.
    let dir = Scratch::new();
    let run = hold(&url, "invoice-42", &["--spring-registry", "orders"], &dir);
    dir.wait_for("started");
    let held = status("orders:invoice-42");
    assert_eq!(held.code(), 0, "{held:?}");
    assert!(held.stdout.contains("kind: spring"), "{held:?}");
    dir.touch("go");
    assert_eq!(run.wait(EXIT_BOUND).code(), 0);
    assert!(!raw::exists(&mut conn, "orders:invoice-42"));

    // The Classic families: each run writes its family's format, and status names it.
    type Shape = fn(&str) -> bool;
    let families: [(&str, Shape); 3] = [
        ("float-seconds", |v| {
            v.parse::<f64>().is_ok() && v.contains('.')
        }),
        ("uuid-ms", |v| v.len() > 37 && v.as_bytes()[36] == b':'),
        ("nanos", |v| {
            v.len() == 19 && v.bytes().all(|b| b.is_ascii_digit())
        }),
    ];
    for (encoding, looks_like) in families {
        let key = format!("family:{encoding}");
        let dir = Scratch::new();
        let run = hold(
            &url,
            &key,
            &["--strategy", "classic", "--classic-encoding", encoding],
            &dir,
        );
        dir.wait_for("started");
        let value = String::from_utf8(raw::get(&mut conn, &key).expect("held")).unwrap();
        assert!(looks_like(&value), "{encoding}: {value}");
        let held = status(&key);
        assert_eq!(held.code(), 0, "{held:?}");
        assert!(
            held.stdout.contains(&format!("kind: classic ({encoding})")),
            "{held:?}"
        );
        dir.touch("go");
        assert_eq!(run.wait(EXIT_BOUND).code(), 0, "{encoding}");
    }
}
