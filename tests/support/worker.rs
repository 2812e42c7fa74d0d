//! Worker processes: this test binary re-run as a child process that runs one of its own tests
//! (a "worker" test that does nothing unless an environment variable set by the parent says
//! so, and therefore passes at once in a normal run).
//!
//! The parent side is [`WorkerProcess`]; the worker side uses [`report`] to send a marker line
//! and [`hold_until_killed`] to stay alive, holding what it holds, until the parent kills it.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// A running worker process (`<this test binary> --exact <test> --nocapture
/// --test-threads=1`), its stdout read line by line on a thread of its own. Killed (if still
/// running) and reaped on drop.
pub struct WorkerProcess {
    child: Child,
    /// Held open (with [`spawn`](Self::spawn)) so that the worker can block reading it; it sees
    /// end-of-file once the parent goes away.
    _stdin: Option<ChildStdin>,
    lines: Option<mpsc::Receiver<String>>,
    /// The reader of the worker's stderr (with [`spawn_captured`](Self::spawn_captured)).
    stderr: Option<thread::JoinHandle<String>>,
    /// Lines [`wait_line`](Self::wait_line) read and passed over.
    seen: Vec<String>,
}

impl WorkerProcess {
    /// Runs the test `test_name` of this binary as a child process with the extra environment
    /// `envs`. Its stdin is a pipe kept open until the worker is dropped, its stderr is this
    /// process's.
    pub fn spawn<V: AsRef<OsStr>>(test_name: &str, envs: &[(&str, V)]) -> WorkerProcess {
        Self::start(test_name, envs, false)
    }

    /// Like [`spawn`](Self::spawn), for a worker that runs to its end: no stdin, and its stderr
    /// is captured for [`finish`](Self::finish).
    pub fn spawn_captured<V: AsRef<OsStr>>(test_name: &str, envs: &[(&str, V)]) -> WorkerProcess {
        Self::start(test_name, envs, true)
    }

    fn start<V: AsRef<OsStr>>(test_name: &str, envs: &[(&str, V)], capture: bool) -> WorkerProcess {
        let exe = std::env::current_exe().expect("current test binary");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped());
        if capture {
            cmd.stdin(Stdio::null()).stderr(Stdio::piped());
        } else {
            cmd.stdin(Stdio::piped()).stderr(Stdio::inherit());
        }
        let mut child = cmd.spawn().expect("spawn worker process");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = child.stderr.take().map(|mut err| {
            thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            })
        });
        WorkerProcess {
            child,
            _stdin: stdin,
            lines: Some(rx),
            stderr,
            seen: Vec::new(),
        }
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads the worker's stdout until `pick` accepts a line (returns its answer) or `timeout`
    /// has passed (or the output ended). The lines passed over are kept in
    /// [`seen`](Self::seen).
    pub fn wait_line<T>(
        &mut self,
        mut pick: impl FnMut(&str) -> Option<T>,
        timeout: Duration,
    ) -> Result<T, RecvTimeoutError> {
        let lines = self
            .lines
            .as_ref()
            .expect("the output was already collected");
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = lines.recv_timeout(left)?;
            if let Some(found) = pick(&line) {
                return Ok(found);
            }
            self.seen.push(line);
        }
    }

    /// Waits for the line `marker payload` of the worker's [`report`]; returns the payload.
    pub fn wait_marker(
        &mut self,
        marker: &str,
        timeout: Duration,
    ) -> Result<String, RecvTimeoutError> {
        self.wait_line(
            |line| line.strip_prefix(marker).map(|rest| rest.trim().to_owned()),
            timeout,
        )
    }

    /// The lines [`wait_line`](Self::wait_line) read and passed over.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// SIGKILL, then reap; the exit status.
    pub fn kill(&mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL the worker");
        self.child.wait().expect("reap the worker")
    }

    /// Waits for the worker to exit (panics, killing it, after `timeout`); its status, stdout
    /// and stderr (empty unless [`spawn_captured`](Self::spawn_captured)).
    pub fn finish(mut self, timeout: Duration) -> (ExitStatus, String, String) {
        let mut done = None;
        super::wait_until(timeout, || {
            done = self.child.try_wait().expect("try_wait");
            done.is_some()
        });
        let status = match done {
            Some(status) => status,
            None => {
                let _ = self.child.kill();
                let status = self.child.wait().expect("wait");
                let (out, err) = self.output();
                panic!(
                    "worker {} did not finish within {timeout:?} ({status})\n\
                     --- stdout\n{out}\n--- stderr\n{err}",
                    self.child.id()
                );
            }
        };
        let (out, err) = self.output();
        (status, out, err)
    }

    /// Everything the worker wrote, once it has exited: stdout, stderr.
    fn output(&mut self) -> (String, String) {
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let mut out = std::mem::take(&mut self.seen);
        if let Some(rx) = self.lines.take() {
            out.extend(rx.iter());
        }
        (out.join("\n"), err)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs the worker test `test_name` with `envs`, waits (up to 30 s) for its `marker` line, whose
/// payload is the hex of the value it locked with, SIGKILLs it mid-hold: that value. `what`
/// names the holder in failures.
pub fn killed_holder_value<V: AsRef<OsStr>>(
    test_name: &str,
    envs: &[(&str, V)],
    marker: &str,
    what: &str,
) -> Vec<u8> {
    killed_holder_value_at(test_name, envs, marker, what).0
}

/// [`killed_holder_value`], with the moment its `marker` line was read: the dead hold began
/// before it.
pub fn killed_holder_value_at<V: AsRef<OsStr>>(
    test_name: &str,
    envs: &[(&str, V)],
    marker: &str,
    what: &str,
) -> (Vec<u8>, Instant) {
    let mut holder = WorkerProcess::spawn(test_name, envs);
    let value = match holder.wait_marker(marker, Duration::from_secs(30)) {
        Ok(value) => hex::decode(value).expect("hex"),
        Err(e) => panic!("{what}: no lock reported ({e:?}): {:?}", holder.seen()),
    };
    let reported = Instant::now();
    let status = holder.kill();
    assert!(
        !status.success(),
        "{what}: the holder exited on its own: {status}"
    );
    (value, reported)
}

/// In a worker: prints `marker payload` on a line of its own, at once, for the parent's
/// [`WorkerProcess::wait_marker`].
pub fn report(marker: &str, payload: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{marker} {payload}").unwrap();
    out.flush().unwrap();
}

/// In a worker: "sleeps forever", until killed, or until the parent goes away and closes our
/// stdin; then leaves at once, without running any destructor (what it holds is not released,
/// like a crash).
pub fn hold_until_killed() -> ! {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::process::exit(0);
}
