//! Turns the results of the last `cargo bench` into `docs/benchmarks.md` and its plots.
//!
//! ```text
//! cargo bench -p redis-dlock-benches && cargo run --release -p redis-dlock-benches --example bench_report
//! ```
//!
//! With `--tls-section` it prints only the TLS section, from `target/dlock-bench/tls.csv`
//! (written by `cargo bench -p redis-dlock-benches --features tls-rustls --bench tls`).
//!
//! Reads `target/dlock-bench/{floor,cycle,contended,micro}.csv` (written by `benches/*.rs`) and
//! criterion's `target/criterion/<group>/<bench>/new/estimates.json`; writes
//! `docs/benchmarks.md`, `docs/img/cycle-ratios.svg` and `docs/img/handoff-latency.svg`. No
//! dependencies: the tables are Markdown and the plots hand-written SVG.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The ways the contended benchmark shares state between its threads (the last one, a
/// `LockClient` per thread with a 1 ms pause after each release, only for the handoff
/// configurations).
const SHARINGS: [&str; 4] = [
    "shared",
    "per_thread",
    "client_per_thread",
    "client_per_thread_think",
];

const BENCHES: [&str; 4] = ["floor", "cycle", "contended", "micro"];
const TARGET_RATIO: f64 = 1.10;

/// What the TLS bench's probe mode showed about the wire (measured by hand: the syscalls are
/// not counted by `cargo bench`; update this note when the command path changes).
const TLS_WIRE_NOTE: &str = "**On the wire and in the client** (measured by hand on 2026-11-25, library code as at `732310b`, with the bench's probe mode: `DLOCK_BENCH_NO_PIN=1 DLOCK_TLS_PROBE=<op>:<n>` running the bench binary under `strace -ff` (n = 2,000 and 12,000) and `valgrind --tool=callgrind` (n = 500 and 2,500), the difference divided by the difference in n). Per Token cycle over TLS the client makes 2 `writev` calls, one TLS record per command (125 and 195 bytes), and 2 `recvfrom` (27 and 26 bytes), and no `futex` (no other thread is woken); a TLS PING makes 1 `writev` (36 bytes) and 1 `recvfrom` (29 bytes). The server reads each record with 2 reads (header, body) and answers with 1 write, for the lock's commands as for PING. Over plain TCP each command is one send and one receive (284 bytes sent per cycle, 14 per PING). So a pool checkout sends nothing, rustls flushes once per command, and Nagle has nothing to hold back (one write per request, then the reply is awaited). Client instructions per operation (callgrind, deterministic): TLS PING 11.7 k, Token cycle over TLS 32.5 k (explicit ttl 31.5 k), the bare commands 34.0 k, SET + DEL 30.5 k; plain PING 7.6 k, cycle 23.1 k, bare commands 24.7 k. The cycle runs 9.0 k instructions more than two TLS PINGs, fewer than the same commands sent bare with `redis::cmd` (which grows its buffers where the library sizes them once); the largest single item is redis-rs's reply parser zero-filling its read buffer (combine's `extend_buf_sync`: 4.9 k instructions per lock command, 3.5 k per PING). The unlock script itself was timed against variants on a scratch `redis-server` (30,000 pipelined calls each, `usec_per_call`, two passes): the script as it is 2.28–3.96 µs, the same without its `PUBLISH` 2.98–3.11 µs, with a `#!lua` shebang 2.99–3.88 µs, `return 1` (the bare cost of a script call) 1.05–1.33 µs, `PING` 0.03–0.04 µs: no form of a compare-and-delete script comes near a PING, and Redis 7.0 has no compare-and-delete command.";
const TARGET_FAIRNESS: f64 = 0.3;
const TARGET_HANDOFF_P99_MS: f64 = 20.0;
const TARGET_CLIENT_NS: f64 = 1000.0;
const COMMAND: &str = "cargo bench -p redis-dlock-benches && cargo run --release -p redis-dlock-benches --example bench_report";

/// The uncontended cycles: (name, label, bare-command floor of the same commands).
const CYCLES: [(&str, &str, &str, &str); 8] = [
    (
        "token",
        "Token, default (watched, release published)",
        "floor_set_nx_px_evalsha_pub_raw",
        "`SET NX PX` + `EVALSHA` publishing",
    ),
    (
        "token_ttl",
        "Token, ttl 10 s (not watched, release published)",
        "floor_set_nx_px_evalsha_pub_raw",
        "`SET NX PX` + `EVALSHA` publishing",
    ),
    (
        "reentrant",
        "Reentrant, default (watched)",
        "floor_reentrant_raw",
        "`EVALSHA` acquire + `EVALSHA` release publishing",
    ),
    (
        "classic_decimal",
        "Classic, decimal",
        "floor_setnx_evalsha_raw",
        "`SETNX` + `EVALSHA`",
    ),
    (
        "classic_bigendian",
        "Classic, big-endian",
        "floor_setnx_evalsha_raw",
        "`SETNX` + `EVALSHA`",
    ),
    (
        "classic_key_ttl",
        "Classic, key_ttl",
        "floor_classic_set_nx_px_evalsha_raw",
        "`SET NX PX` + `EVALSHA`",
    ),
    (
        "classic_cas",
        "Classic, Takeover::CompareAndSet",
        "floor_setnx_evalsha_raw",
        "`SETNX` + `EVALSHA`",
    ),
    (
        "fair",
        "Fair, default (watched)",
        "floor_fair_raw",
        "`SET NX PX` + `EVALSHA` on 3 keys",
    ),
];

/// The contended configurations: (name, label, retry and wake-up settings).
const CONTENDED: [(&str, &str, &str); 6] = [
    (
        "token_default",
        "Token, defaults (pub/sub)",
        "watched (30 s lease); RetryPolicy::standard(): 4→32 ms backoff, jitter, 10 s; waiters \
         of other clients woken by pub/sub (`WakeUp::PubSub`, the default)",
    ),
    (
        "token_polling",
        "Token, polling",
        "as the defaults but `.wake_up(WakeUp::Polling)`: waiters of other clients poll under \
         the retry policy (the behaviour before waiters were woken by pub/sub; releases are still published)",
    ),
    (
        "token_tuned",
        "Token, tuned",
        "standard() with backoff 1→4 ms ×2, jitter; pub/sub",
    ),
    (
        "reentrant_default",
        "Reentrant, defaults (pub/sub)",
        "`Strategy::Reentrant` at its defaults: watched, RetryPolicy::standard(), pub/sub",
    ),
    (
        "classic_default",
        "Classic, defaults",
        "RetryPolicy::legacy(): 200 ms fixed, 5 retries; polling (the only way of Classic)",
    ),
    (
        "classic_tuned",
        "Classic, tuned",
        "fixed 5 ms, no retry limit, 10 s; polling",
    ),
];

/// The handoff target: the median handoff should be within this many round trips of the handoff floor.
const TARGET_HANDOFF_RTTS: f64 = 3.0;
/// The floor of a handoff in round trips: the release's and the acquire's.
const HANDOFF_FLOOR_RTTS: f64 = 2.0;
/// The configurations of the handoff comparison (pub/sub vs polling).
const HANDOFF_CONFIGS: [&str; 4] = [
    "token_default",
    "token_polling",
    "reentrant_default",
    "token_tuned",
];

/// All result rows: file → "section,name,metric" → value.
struct Results {
    files: BTreeMap<String, BTreeMap<String, String>>,
}

impl Results {
    fn load(dir: &Path) -> Result<Results, String> {
        let mut files = BTreeMap::new();
        for bench in BENCHES {
            let path = dir.join(format!("{bench}.csv"));
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "{}: {e}\nRun `cargo bench -p redis-dlock-benches` first (all four benches): {COMMAND}",
                    path.display()
                )
            })?;
            let mut rows = BTreeMap::new();
            for line in text.lines().skip(1) {
                let mut parts = line.splitn(4, ',');
                let (Some(s), Some(n), Some(m), Some(v)) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                rows.insert(format!("{s},{n},{m}"), v.to_owned());
            }
            files.insert(bench.to_owned(), rows);
        }
        Self::load_tls(&mut files, dir);
        Ok(Results { files })
    }

    /// The TLS bench's results, if it ran (only with `--features tls-rustls`).
    fn load_tls(files: &mut BTreeMap<String, BTreeMap<String, String>>, dir: &Path) {
        Self::load_one(files, dir, "tls");
    }

    /// Loads `<bench>.csv` if it is there.
    fn load_one(files: &mut BTreeMap<String, BTreeMap<String, String>>, dir: &Path, bench: &str) {
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("{bench}.csv"))) {
            let mut rows = BTreeMap::new();
            for line in text.lines().skip(1) {
                let mut parts = line.splitn(4, ',');
                if let (Some(s), Some(n), Some(m), Some(v)) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                {
                    rows.insert(format!("{s},{n},{m}"), v.to_owned());
                }
            }
            files.insert(bench.to_owned(), rows);
        }
    }

    fn s(&self, file: &str, section: &str, name: &str, metric: &str) -> Option<&str> {
        self.files
            .get(file)?
            .get(&format!("{section},{name},{metric}"))
            .map(String::as_str)
    }

    fn f(&self, file: &str, section: &str, name: &str, metric: &str) -> f64 {
        self.s(file, section, name, metric)
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    fn meta(&self, file: &str, metric: &str) -> String {
        self.s(file, "meta", "machine", metric)
            .unwrap_or("unknown")
            .to_owned()
    }
}

/// The repository's top directory (this generator lives in its `benches/` package).
fn workspace_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().ok();
    exe.as_deref()
        .and_then(|exe| {
            let dir = exe.parent()?;
            (dir.file_name()? == "examples")
                .then(|| dir.parent()?.parent().map(Path::to_path_buf))?
        })
        .unwrap_or_else(|| workspace_dir().join("target"))
}

/// Criterion's median estimate (ns) of `group/bench` from the last run, if present.
fn criterion_median(target: &Path, group: &str, bench: &str) -> Option<f64> {
    let path = target
        .join("criterion")
        .join(group)
        .join(bench)
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let at = text.find("\"median\"")?;
    let rest = &text[at..];
    let pe = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let num: String = rest[pe..]
        .chars()
        .skip_while(|c| c.is_whitespace())
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    num.parse().ok()
}

fn x(r: f64) -> String {
    if r.is_nan() {
        "–".to_owned()
    } else {
        format!("{r:.3}×")
    }
}

fn us(ns: f64) -> String {
    if ns.is_nan() {
        "–".to_owned()
    } else if ns >= 1_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

fn met(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**not met**"
    }
}

fn main() {
    let target = target_dir();
    // `--tls-section`: print only the TLS section (from `tls.csv` alone), e.g. to refresh it
    // without rerunning the other benches.
    if std::env::args().any(|a| a == "--tls-section") {
        let mut files = BTreeMap::new();
        Results::load_tls(&mut files, &target.join("dlock-bench"));
        let results = Results { files };
        let report = Report {
            r: &results,
            target: &target,
        };
        let mut md = String::new();
        report.tls(&mut md);
        print!("{md}");
        return;
    }
    // `--cycle-section`: the targets table and the uncontended-cycle section from `cycle.csv`
    // (printed; the section's chart is written to docs/img/cycle-ratios.svg)
    // alone (rows of other benches come out empty), to refresh them from a new cycle run.
    if std::env::args().any(|a| a == "--cycle-section") {
        let mut files = BTreeMap::new();
        Results::load_one(&mut files, &target.join("dlock-bench"), "cycle");
        let results = Results { files };
        let report = Report {
            r: &results,
            target: &target,
        };
        let mut md = String::new();
        report.targets(&mut md);
        report.cycle(&mut md);
        print!("{md}");
        let svg = workspace_dir().join("docs/img/cycle-ratios.svg");
        if let Err(e) = std::fs::write(&svg, report.cycle_svg()) {
            eprintln!("bench_report: cannot write {}: {e}", svg.display());
            std::process::exit(1);
        }
        return;
    }
    let results = match Results::load(&target.join("dlock-bench")) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench_report: {e}");
            std::process::exit(1);
        }
    };
    let docs = workspace_dir().join("docs");
    let img = docs.join("img");
    if let Err(e) = std::fs::create_dir_all(&img) {
        eprintln!("bench_report: cannot create {}: {e}", img.display());
        std::process::exit(1);
    }
    let report = Report {
        r: &results,
        target: &target,
    };
    let md = report.markdown();
    let outputs = [
        (docs.join("benchmarks.md"), md),
        (img.join("cycle-ratios.svg"), report.cycle_svg()),
        (img.join("handoff-latency.svg"), report.handoff_svg()),
    ];
    for (path, text) in outputs {
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("bench_report: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("wrote {}", path.display());
    }
}

struct Report<'a> {
    r: &'a Results,
    target: &'a Path,
}

impl Report<'_> {
    // ---- floors --------------------------------------------------------------------------

    fn ping(&self, file: &str) -> f64 {
        self.r.f(file, "floor", "ping_pool", "p50_ns")
    }

    /// The contended binary's floor: mean of the pooled-PING medians before and after.
    fn contended_ping(&self) -> f64 {
        let a = self.r.f("contended", "floor_start", "ping_pool", "p50_ns");
        let b = self.r.f("contended", "floor_end", "ping_pool", "p50_ns");
        if b.is_nan() {
            a
        } else {
            (a + b) / 2.0
        }
    }

    /// The headline: median over interleaved rounds of cycle p50 / (2 × PING p50) in the round.
    fn cycle_ratio(&self, name: &str) -> f64 {
        let paired = self.r.f("cycle", "cycle", name, "paired_ratio_2ping");
        if paired.is_nan() {
            self.pooled_cycle_ratio(name)
        } else {
            paired
        }
    }

    /// `x.xxx×` for a cycle ratio, with the lowest–highest of the runs when it was repeated.
    fn cycle_x(&self, name: &str, metric: &str) -> String {
        let value = if metric == "paired_ratio_2ping" {
            self.cycle_ratio(name)
        } else {
            self.r.f("cycle", "cycle", name, metric)
        };
        let lo = self.r.f("cycle", "cycle", name, &format!("{metric}_lo"));
        let hi = self.r.f("cycle", "cycle", name, &format!("{metric}_hi"));
        if lo.is_nan() || hi.is_nan() {
            x(value)
        } else {
            format!("{} ({:.3}–{:.3})", x(value), lo, hi)
        }
    }

    /// p50 of all the cycle's samples / (2 × p50 of all the PING samples).
    fn pooled_cycle_ratio(&self, name: &str) -> f64 {
        self.r.f("cycle", "cycle", name, "p50_ns") / (2.0 * self.ping("cycle"))
    }

    /// Median-batch CPU time of the client-side work of a Token cycle, without and with the two
    /// pool checkouts.
    fn client_side_ns(&self) -> (f64, f64) {
        let m = |b: &str| self.r.f("micro", "cpu", b, "median_ns");
        let without_pool = m("token_generate")
            + m("set_nx_px_build_and_pack")
            + m("evalsha_publish_build_and_pack");
        (without_pool, m("token_cycle_client_side"))
    }

    /// A contended run's handoff quantile in round trips (÷ the contended floor).
    fn handoff_rtts(&self, section: &str, name: &str, metric: &str) -> f64 {
        self.r.f("contended", section, name, metric) / self.contended_ping()
    }

    fn allocs(&self, kind: &str, name: &str, metric: &str) -> f64 {
        self.r.f("micro", &format!("alloc_{kind}"), name, metric)
    }

    // ---- the document --------------------------------------------------------------------

    fn markdown(&self) -> String {
        let mut md = String::new();
        self.intro(&mut md);
        self.targets(&mut md);
        self.machine(&mut md);
        self.floor(&mut md);
        self.cycle(&mut md);
        self.tls(&mut md);
        self.contended(&mut md);
        self.handoff(&mut md);
        self.many_keys(&mut md);
        self.micro(&mut md);
        mixed_fleet(&mut md);
        let _ = writeln!(md, "{FAIR_BENCH}");
        let _ = writeln!(md, "{KNOBS_BENCH}");
        let _ = writeln!(md, "{VALKEY_BENCH}");
        self.method(&mut md);
        md
    }

    fn intro(&self, md: &mut String) {
        let r = self.r;
        let _ = writeln!(
            md,
            "# Benchmarks\n\n\
             **Regenerate this whole page (tables and plots) with one command** (needs `redis-server` \
             on `PATH`; each bench starts its own server on a free loopback port):\n\n\
             ```sh\n{COMMAND}\n```\n\n\
             This file and `docs/img/*.svg` are written by `benches/bench_report.rs` from \
             `target/dlock-bench/*.csv` and criterion's estimates; edit the generator, not this \
             file.\n\n\
             > **Blocking path.** Threads of one `LockClient` wait for a key in an in-process \
             FIFO queue (a local release wakes the next one at once); threads of different \
             clients or processes are woken by the release published on \
             `redisson_lock__channel:{{key}}` (Token and Reentrant by default, \
             `WakeUp::PubSub`), or poll Redis under their retry policy (Classic, and \
             `WakeUp::Polling`). Token and Reentrant locks built without a `ttl` are renewed by \
             the client's watchdog. The figures below are those of the code at `{}` as \
             benchmarked on {}; rerun the command above after changes.\n\n\
             **How to read the figures.** One loopback round trip on these machines is either \
             ~12–20 µs (client and server on one core) or ~75–80 µs (different cores), and which \
             one a run gets can flip from run to run. So every figure is a **ratio to a floor \
             measured in the same run, on the same kind of connection**: the floor is the median \
             of one `PING` round trip on a pooled connection (an `r2d2::Pool<redis::Client>` \
             built with `test_on_check_out(false)`, like `LockClient`'s own pool), measured \
             interleaved with the operations it divides. Absolute times are shown in secondary \
             columns only.\n",
            r.meta("cycle", "git"),
            r.meta("cycle", "date"),
        );
    }

    fn targets(&self, md: &mut String) {
        let r = self.r;
        let _ = writeln!(md, "## Targets: the uncontended cycle\n");
        let _ = writeln!(md, "| target | measured | verdict |\n| --- | --- | --- |");
        for (name, label) in [
            ("token", "uncontended Token cycle, default (watched)"),
            (
                "token_ttl",
                "uncontended Token cycle with an explicit ttl (not watched)",
            ),
        ] {
            let ratio = self.cycle_ratio(name);
            let _ = writeln!(
                md,
                "| {label} ≤ {TARGET_RATIO:.2} × two pooled `PING`s | **{}** (p50 {} vs PING {}); \
                 the bare `SET NX PX` + publishing `EVALSHA` alone: {}; library over bare: {} | \
                 {} |",
                self.cycle_x(name, "paired_ratio_2ping"),
                us(r.f("cycle", "cycle", name, "p50_ns")),
                us(self.ping("cycle")),
                self.cycle_x("floor_set_nx_px_evalsha_pub_raw", "paired_ratio_2ping"),
                self.cycle_x(name, "paired_ratio_bare"),
                met(ratio <= TARGET_RATIO)
            );
        }
        for (name, label, bare, _) in &CYCLES[2..] {
            let ratio = self.cycle_ratio(name);
            let _ = writeln!(
                md,
                "| {label} cycle ≤ {TARGET_RATIO:.2} × its minimum round trips (2 PINGs) | **{}**; \
                 the bare commands alone: {}; library over bare: {} | {} |",
                self.cycle_x(name, "paired_ratio_2ping"),
                self.cycle_x(bare, "paired_ratio_2ping"),
                self.cycle_x(name, "paired_ratio_bare"),
                met(ratio <= TARGET_RATIO)
            );
        }
        let bare = self.allocs("cycle", "bare_set_nx_px_evalsha_pub_raw", "allocs");
        let bare_c = self.allocs("cycle", "bare_setnx_evalsha_raw", "allocs");
        for (name, label, bare, bare_label) in [
            (
                "token",
                "Token, default (watched)",
                bare,
                "`SET NX PX` + publishing `EVALSHA`",
            ),
            (
                "token_ttl",
                "Token, explicit ttl",
                bare,
                "`SET NX PX` + publishing `EVALSHA`",
            ),
            ("classic_decimal", "Classic", bare_c, "`SETNX` + `EVALSHA`"),
        ] {
            let lib = self.allocs("cycle", name, "allocs");
            let added = lib - bare;
            let _ = writeln!(
                md,
                "| no per-operation allocation beyond the command buffers: {label} | {lib:.2} \
                 allocations per cycle; the same commands sent bare with redis-rs: {bare:.2} \
                 ({bare_label}){} | {} |",
                if added > 0.005 {
                    format!(
                        "; the library adds {added:.2}{}",
                        if name == "token" {
                            " (the watchdog's record of the hold, `WatchState`)"
                        } else {
                            ""
                        }
                    )
                } else {
                    "; the library adds none (see [allocations](#allocations))".to_owned()
                },
                met(added <= 0.005)
            );
        }
        let (client, client_pool) = self.client_side_ns();
        let _ = writeln!(
            md,
            "| token generation, script SHAs and command buffers ≪ 1 µs per cycle | {} \
             (token + build and pack `SET` and the publishing `EVALSHA`; SHAs are computed once \
             per client); {} with the two pool checkouts | {} |",
            us(client),
            us(client_pool),
            met(client < TARGET_CLIENT_NS)
        );
        for sharing in &SHARINGS[..3] {
            let label = format!("token_default_{sharing}");
            let fair = r.f("contended", "contended", &label, "fairness");
            let p99 = r.f("contended", "handoff", &label, "p99_ns") / 1e6;
            let _ = writeln!(
                md,
                "| contended Token, defaults ({}): min/max sections per thread ≥ {TARGET_FAIRNESS} \
                 and handoff p99 ≤ {TARGET_HANDOFF_P99_MS} ms | fairness {fair:.2}, p99 {p99:.2} ms \
                 | {} |",
                sharing.replace('_', "-"),
                met(fair >= TARGET_FAIRNESS && p99 <= TARGET_HANDOFF_P99_MS)
            );
        }
        let _ = writeln!(md, "\n## Targets: the handoff to a waiter\n");
        let _ = writeln!(
            md,
            "\"Median handoff within 3 round trips of the floor\", 8 threads with a `LockClient` \
             each; definitions in [Handoff: pub/sub vs polling](#handoff-pubsub-vs-polling): \
             handoff = release → `lock()` returned in a thread that was already waiting; RTT = \
             pooled `PING` p50 of the run; handoff floor = {HANDOFF_FLOOR_RTTS:.0} RTT (release \
             + acquire round trip). Reading **A** (the target): p50 − floor ≤ \
             {TARGET_HANDOFF_RTTS:.0} RTT. Reading **B** (stricter): p50 ≤ \
             {TARGET_HANDOFF_RTTS:.0} RTT. The 1 ms-pause rows are the headline.\n"
        );
        let _ = writeln!(
            md,
            "| lock, loop | handoff to a waiter, p50 | p50 − floor | reading A: ≤ {0:.0} RTT above the floor | \
             reading B: p50 ≤ {0:.0} RTT |\n| --- | --- | --- | --- | --- |",
            TARGET_HANDOFF_RTTS
        );
        for cfg in ["token_default", "reentrant_default", "token_polling"] {
            for sharing in ["client_per_thread_think", "client_per_thread"] {
                let name = format!("{cfg}_{sharing}");
                let p50 = self.handoff_rtts("handoff_waiter", &name, "p50_ns");
                if p50.is_nan() {
                    continue;
                }
                let above = p50 - HANDOFF_FLOOR_RTTS;
                let _ = writeln!(
                    md,
                    "| {}, {} | {p50:.2} RTT | {above:.2} RTT | {} | {} |",
                    contended_label(cfg),
                    loop_label(sharing),
                    met(above <= TARGET_HANDOFF_RTTS),
                    met(p50 <= TARGET_HANDOFF_RTTS),
                );
            }
        }
        let _ = writeln!(md, "\n{EARLIER_RUNS}");
    }

    fn machine(&self, md: &mut String) {
        let r = self.r;
        let _ = writeln!(md, "## Machine and run\n");
        let _ = writeln!(md, "| | |\n| --- | --- |");
        for (label, metric) in [
            ("CPU", "cpu_model"),
            ("CPUs (nproc)", "nproc"),
            ("kernel", "kernel"),
            ("Server", "redis_version"),
            ("rustc", "rustc"),
            ("code (`git describe --dirty`)", "git"),
            ("run (UTC)", "date"),
        ] {
            let _ = writeln!(md, "| {label} | {} |", r.meta("cycle", metric));
        }
        let _ = writeln!(md, "| command | `{COMMAND}` |");
        let mut total = 0.0;
        for bench in BENCHES {
            let wall = r.f(bench, "meta", "run", "wall_s");
            total += wall;
            let _ = writeln!(
                md,
                "| `benches/{bench}.rs` | {} — {wall:.0} s; load average {} at start, {} at end |",
                r.meta(bench, "pinning"),
                r.meta(bench, "loadavg"),
                r.s(bench, "meta", "run", "loadavg_end")
                    .unwrap_or("unknown"),
            );
        }
        let _ = writeln!(
            md,
            "| measuring time | {total:.0} s in the four bench binaries (plus the release build) |\n"
        );
        let _ = writeln!(
            md,
            "Each bench binary starts its own `redis-server` (no persistence) and pins it to CPU 1 \
             and itself (every thread) to CPU 0 with `taskset`, so client and server never share \
             a core; if `taskset` fails the run goes on unpinned and says so above. \
             `DLOCK_BENCH_NO_PIN=1` turns pinning off.\n"
        );
    }

    fn floor(&self, md: &mut String) {
        let r = self.r;
        let ping = self.ping("floor");
        let _ = writeln!(md, "## Floor (`benches/floor.rs`)\n");
        let _ = writeln!(
            md,
            "Each operation timed one by one, in {:.0} interleaved rounds of {:.0} each. \
             **Ratio** = median over the rounds of (the operation's median in the round / the \
             pooled PING's median in the same round); the ratio of the whole-run medians is \
             next to it.\n",
            r.f("floor", "floor", "all", "rounds"),
            r.f("floor", "floor", "all", "per_round"),
        );
        let _ = writeln!(
            md,
            "| operation | round trips | ratio to PING | ratio of run medians | p50 | p99 | \
             criterion median |\n\
             | --- | --- | --- | --- | --- | --- | --- |"
        );
        for (name, label, rts) in [
            ("ping_pool", "`PING`, pooled (the floor)", 1),
            ("ping_raw", "`PING`, raw connection", 1),
            (
                "ping_raw_prepacked",
                "`PING`, raw, pre-packed bytes (no command building)",
                1,
            ),
            (
                "set_nx_px_evalsha_raw",
                "`SET NX PX` + `EVALSHA` unlock, raw",
                2,
            ),
            (
                "set_nx_px_evalsha_pool",
                "`SET NX PX` + `EVALSHA` unlock, one checkout per command",
                2,
            ),
            ("setnx_evalsha_raw", "`SETNX` + `EVALSHA` unlock, raw", 2),
            ("set_px_raw", "`SET key token PX ttl` alone, raw", 1),
            (
                "evalsha_miss_raw",
                "`EVALSHA` unlock alone on a key held by another value, raw",
                1,
            ),
        ] {
            let p50 = r.f("floor", "floor", name, "p50_ns");
            let _ = writeln!(
                md,
                "| {label} | {rts} | **{}** | {} | {} | {} | {} |",
                x(r.f("floor", "floor", name, "paired_ratio_ping")),
                x(p50 / ping),
                us(p50),
                us(r.f("floor", "floor", name, "p99_ns")),
                us(criterion_median(self.target, "floor", name).unwrap_or(f64::NAN)),
            );
        }
        let same = r.f("floor", "floor_info", "ping_raw_same_core", "p50_ns");
        if !same.is_nan() {
            let _ = writeln!(
                md,
                "\nFor the record, the raw `PING` with `redis-server` moved onto the client's core \
                 (CPU 0) in the same run: p50 {} ({} of the cross-core floor). That is the \
                 \"12 vs 75 µs\" flip the ratios protect against.",
                us(same),
                x(same / ping)
            );
        }
        let _ =
            writeln!(
            md,
            "\nThe server's own work shows: one `SET … PX` costs {} of a `PING` and one `EVALSHA` \
             of the compare-and-delete script {} (Lua call, `GET`, compare), so the two commands \
             of a cycle sent bare cost {} of the PING floor here before any library code runs \
             (above 2.00× in other runs). The ≤ 1.10 targets leave the library only what is left \
             of that margin.\n",
            x(r.f("floor", "floor", "set_px_raw", "paired_ratio_ping")),
            x(r.f("floor", "floor", "evalsha_miss_raw", "paired_ratio_ping")),
            x(r.f("floor", "floor", "set_nx_px_evalsha_raw", "paired_ratio_ping")),
        );
    }

    fn cycle(&self, md: &mut String) {
        let r = self.r;
        let ping = self.ping("cycle");
        let _ = writeln!(md, "## Uncontended cycle (`benches/cycle.rs`)\n");
        let _ = writeln!(
            md,
            "`lock.try_lock()?` then `guard.unlock()?` on a `Box<dyn DistributedLock>` from a \
             `LockClient` built by its builder (pool of 16, no checkout PING). Every cycle and the \
             floors are timed one by one in {:.0} interleaved rounds of {:.0}, and the whole \
             measurement is repeated in {:.0} runs in one process. **Ratio to 2 PING** = median \
             over the rounds of (the cycle's median in the round / 2 × the pooled PING's median \
             in the same round), given as the median of the runs with the lowest and highest run \
             in brackets; the ratio of the medians over all runs' samples is next to it. **Ratio \
             to bare** = the same paired ratio against the same two commands sent with redis-rs on \
             a raw connection (what the library adds over the commands themselves). Latencies are \
             over all runs' samples. Criterion's \
             median (absolute, not paired with a floor; its samples are means, so it carries the \
             tail) is for reference; criterion also measured `cycle/floor_ping_pool`: {}.\n",
            r.f("cycle", "cycle", "all", "rounds"),
            r.f("cycle", "cycle", "all", "per_round"),
            {
                let runs = r.f("cycle", "cycle", "all", "runs");
                if runs.is_nan() {
                    1.0
                } else {
                    runs
                }
            },
            us(criterion_median(self.target, "cycle", "floor_ping_pool").unwrap_or(f64::NAN)),
        );
        let _ = writeln!(
            md,
            "| lock | minimum round trips | ratio to 2 PING | target ≤ {TARGET_RATIO:.2} | ratio of run \
             medians | ratio to bare commands | bare commands | p50 | p99 | criterion median |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for (name, label, _, bare_label) in CYCLES {
            let p50 = r.f("cycle", "cycle", name, "p50_ns");
            let ratio = self.cycle_ratio(name);
            let crit = criterion_median(self.target, "cycle", name).unwrap_or(f64::NAN);
            let _ = writeln!(
                md,
                "| {label} | 2 | **{}** | {} | {} | {} | {bare_label} | {} | {} | {} |",
                self.cycle_x(name, "paired_ratio_2ping"),
                if ratio <= TARGET_RATIO {
                    "✓ met"
                } else {
                    "✗ not met"
                },
                x(self.pooled_cycle_ratio(name)),
                self.cycle_x(name, "paired_ratio_bare"),
                us(p50),
                us(r.f("cycle", "cycle", name, "p99_ns")),
                us(crit),
            );
        }
        let _ = writeln!(
            md,
            "\nFloors of this run: pooled PING p50 {}; bare `SET NX PX` + `EVALSHA` {} ({}), \
             the same with the publishing release (`EVALSHA unlock 1 key token 0 channel`, what \
             Token sends now) {} ({}); bare Reentrant scripts {} ({}); bare `SETNX` + `EVALSHA` \
             {} ({}); bare fair `SET NX PX` + `EVALSHA` on 3 keys (the fair release finding \
             nobody queued) {} ({}).\n",
            us(ping),
            us(r.f("cycle", "cycle", "floor_set_nx_px_evalsha_raw", "p50_ns")),
            x(self.cycle_ratio("floor_set_nx_px_evalsha_raw")),
            us(r.f(
                "cycle",
                "cycle",
                "floor_set_nx_px_evalsha_pub_raw",
                "p50_ns"
            )),
            x(self.cycle_ratio("floor_set_nx_px_evalsha_pub_raw")),
            us(r.f("cycle", "cycle", "floor_reentrant_raw", "p50_ns")),
            x(self.cycle_ratio("floor_reentrant_raw")),
            us(r.f("cycle", "cycle", "floor_setnx_evalsha_raw", "p50_ns")),
            x(self.cycle_ratio("floor_setnx_evalsha_raw")),
            us(r.f("cycle", "cycle", "floor_fair_raw", "p50_ns")),
            x(self.cycle_ratio("floor_fair_raw")),
        );
        let _ = writeln!(
            md,
            "**Watched vs explicit ttl.** Both Token rows send the same two commands; the \
             default lock is also registered with the client's watchdog at acquire and \
             deregistered at release (in memory, no I/O: a hold is renewed only after a third of \
             its 30 s lease). Paired, in this run: watched / ttl = {}.\n",
            x(self.cycle_ratio("token") / self.cycle_ratio("token_ttl")),
        );
        let same_wire: Vec<f64> = ["classic_decimal", "classic_bigendian", "classic_cas"]
            .iter()
            .map(|n| self.cycle_ratio(n))
            .collect();
        let spread = same_wire.iter().copied().fold(f64::MIN, f64::max)
            / same_wire.iter().copied().fold(f64::MAX, f64::min)
            - 1.0;
        let _ = writeln!(
            md,
            "**Resolution of this run.** Uncontended, Classic with `Takeover::CompareAndSet` sends \
             exactly what Classic with the default takeover sends (the takeover only runs on a \
             stale lock), and big-endian only changes the value's bytes (8 instead of 13): those \
             three rows differ by {:.1} % in this run. Between runs on this shared machine the \
             same row moved by more: while these benches were developed, Token's ratio ranged \
             from 1.07× to 1.17× and the bare commands' from 1.08× to 1.12× (the higher values \
             under heavy load from other jobs, see the load averages above). A row within a \
             few percent of 1.10 can land on either side in another run; the ratio to the bare \
             commands separates the library's share from the server's.\n",
            100.0 * spread
        );
        let _ = writeln!(
            md,
            "![Uncontended cycle, ratio to two pooled PINGs](img/cycle-ratios.svg)\n"
        );
    }

    /// The TLS bench (`benches/tls.rs`), if it ran.
    fn tls(&self, md: &mut String) {
        let r = self.r;
        let _ = writeln!(md, "## TLS (`benches/tls.rs`)\n");
        if r.s("tls", "summary", "all", "runs").is_none() {
            let _ = writeln!(
                md,
                "Not measured in this run: it needs the `tls-rustls` feature. Run \
                 `cargo bench -p redis-dlock-benches --features tls-rustls --bench tls`, then the report again.\n"
            );
            return;
        }
        let med = |metric: &str| r.f("tls", "summary", metric, "median");
        let _ = writeln!(
            md,
            "`cargo bench -p redis-dlock-benches --features tls-rustls --bench tls`: one `redis-server` with a plain and \
             a TLS port (certificates generated at start with `rcgen`), a `LockClient` over TLS \
             (rustls, `tls_certificates` with the test CA) and one over plain TCP, pools like \
             `LockClient`'s. In each of {:.0} runs (one process) ten operations are timed one by \
             one in {:.0} interleaved rounds of {:.0}; each ratio is the median over the rounds \
             of the paired medians, as in the cycle table, and the table gives the median of the \
             runs and the lowest and highest run. The TLS floor is a pooled `PING` on a TLS \
             connection (an `r2d2::Pool<redis::Client>` with `test_on_check_out(false)`, like \
             the lock's); the plain rows are the same measurement on the plain port.\n",
            r.f("tls", "summary", "all", "runs"),
            r.f("tls", "summary", "all", "rounds"),
            r.f("tls", "summary", "all", "per_round"),
        );
        let _ = writeln!(
            md,
            "| ratio | median of the runs | lowest run | highest run | target |\n\
             | --- | --- | --- | --- | --- |"
        );
        let rows = [
            (
                "token_tls_2ping_tls",
                "Token (watched) cycle over TLS / 2 TLS PING",
                true,
            ),
            (
                "token_ttl_tls_2ping_tls",
                "Token (explicit ttl) cycle over TLS / 2 TLS PING",
                true,
            ),
            (
                "token_plain_2ping_plain",
                "Token (watched) cycle over plain TCP / 2 plain PING",
                true,
            ),
            ("ping_tls_ping_plain", "TLS PING / plain PING", false),
        ];
        for (metric, label, target) in rows {
            let median = med(metric);
            let verdict = match (target, median <= TARGET_RATIO) {
                (false, _) => "(reference)".to_owned(),
                (true, true) => format!("≤ {TARGET_RATIO:.2}: ✓ met"),
                (true, false) => format!("≤ {TARGET_RATIO:.2}: ✗ not met"),
            };
            let _ = writeln!(
                md,
                "| {label} | **{}** | {} | {} | {verdict} |",
                x(median),
                x(r.f("tls", "summary", metric, "min")),
                x(r.f("tls", "summary", metric, "max")),
            );
        }
        let _ = writeln!(
            md,
            "\nCode at `{}`, {}; load average (1, 5, 15 min) at the start {} and at the end {}. \
             The plain-TCP row is the control: the cycle table's Token ratio measured again in \
             this binary, interleaved with the TLS rows.\n",
            r.meta("tls", "git"),
            r.meta("tls", "date"),
            r.meta("tls", "loadavg"),
            r.s("tls", "meta", "run", "loadavg_end")
                .unwrap_or("unknown"),
        );

        let _ = writeln!(md, "### Where a cycle's time above two PINGs goes\n");
        let _ = writeln!(
            md,
            "Measured in the same interleaved rounds. **SET + DEL**: the lock's acquire (`SET key \
             token NX PX ttl GET`) then a plain `DEL`: the same two round trips and about the \
             same bytes, no Lua. **Bare commands**: the lock's two commands exactly (the acquire, \
             then `EVALSHA <unlock.lua> 1 key token 0 channel`), built with `redis::cmd`, one \
             checkout per command of a pool like the floor's: everything but the library. \
             **Floor's pool**: the same Token lock on `LockClient::from_pool` of the floor's own \
             pool (the library's pool and connection wrapper against r2d2's plain one).\n"
        );
        let _ = writeln!(
            md,
            "| ratio (median of the runs; lowest–highest run) | over TLS | over plain TCP |\n\
             | --- | --- | --- |"
        );
        let cell = |metric: &str| {
            format!(
                "{} ({}–{})",
                x(med(metric)),
                x(r.f("tls", "summary", metric, "min")),
                x(r.f("tls", "summary", metric, "max"))
            )
        };
        for (label, tls, plain) in [
            (
                "SET NX PX GET + DEL / 2 PING",
                "set_del_tls_2ping_tls",
                "set_del_plain_2ping_plain",
            ),
            (
                "bare `SET NX PX GET` + `EVALSHA` unlock / 2 PING",
                "bare_tls_2ping_tls",
                "bare_plain_2ping_plain",
            ),
            (
                "**Token (watched) / 2 PING**",
                "token_tls_2ping_tls",
                "token_plain_2ping_plain",
            ),
            (
                "Token (watched) / bare commands (the library's share)",
                "token_tls_bare_tls",
                "token_plain_bare_plain",
            ),
            (
                "Token (watched) / the same lock on the floor's own pool",
                "token_tls_floor_pool",
                "",
            ),
        ] {
            let plain = if plain.is_empty() {
                "–".to_owned()
            } else {
                cell(plain)
            };
            let _ = writeln!(md, "| {label} | {} | {plain} |", cell(tls));
        }
        let p50 = |name: &str| r.f("tls", "summary", name, "p50_ns_median");
        let _ = writeln!(
            md,
            "\nAbsolute p50s (median of the runs' p50): TLS PING {}, SET + DEL {}, bare commands \
             {}, Token cycle {}; plain PING {}, SET + DEL {}, bare commands {}, Token cycle {}.\n",
            us(p50("ping_pool_tls")),
            us(p50("set_del_tls")),
            us(p50("bare_tls")),
            us(p50("token_tls")),
            us(p50("ping_pool_plain")),
            us(p50("set_del_plain")),
            us(p50("bare_plain")),
            us(p50("token_plain")),
        );
        let srv = |cmd: &str| {
            r.f(
                "tls",
                "summary",
                &format!("server_{cmd}"),
                "usec_per_call_median",
            )
        };
        let srv_range = |cmd: &str| {
            let name = format!("server_{cmd}");
            format!(
                "{:.2} µs ({:.2}–{:.2})",
                srv(cmd),
                r.f("tls", "summary", &name, "usec_per_call_min"),
                r.f("tls", "summary", &name, "usec_per_call_max")
            )
        };
        let _ = writeln!(
            md,
            "The server's own execution time per command (`INFO commandstats`, `usec_per_call`, \
             reset before each run; median of the runs, lowest–highest): `PING` {}, `SET … NX \
             PX … GET` {}, `EVALSHA` of the unlock script {} (of which its nested calls: `GET` \
             {}, `DEL` {}, `PUBLISH` to no subscriber {}; the rest is Lua: the call, the `KEYS` \
             and `ARGV` tables, the reply), a plain `DEL` {}. Per cycle the server executes \
             {:.2} µs against {:.2} µs for two PINGs. These times exclude reading, parsing and \
             answering the command and the TLS record layer, which every command pays.\n",
            srv_range("ping"),
            srv_range("set"),
            srv_range("evalsha"),
            srv_range("get"),
            srv_range("del"),
            srv_range("publish"),
            srv_range("del"),
            srv("set") + srv("evalsha"),
            2.0 * srv("ping"),
        );
        let (t, b, sd, lib) = (
            med("token_tls_2ping_tls"),
            med("bare_tls_2ping_tls"),
            med("set_del_tls_2ping_tls"),
            med("token_tls_bare_tls"),
        );
        let _ = writeln!(
            md,
            "**Why the cycle costs more than two PINGs.** Over TLS the cycle's median is {:.1} % \
             above two PINGs. The lock's two commands sent bare already cost {:.1} % above them: \
             {:.1} points with the acquire and a plain `DEL` (the `SET`'s work and the longer \
             messages, encrypted and decrypted at both ends), {:.1} more for the Lua release \
             instead of the `DEL`. The library adds {:.1} % over the bare commands, and its own \
             pool costs the same as the floor's (the control row). Nothing else is on the wire: \
             a checkout sends nothing (`test_on_check_out(false)`), each command is one write of \
             one TLS record and its reply one record, as for a PING (see below). \
             The target leaves the library and the two commands 10 % of two round trips, \
             and the commands' extra work is a fixed number of microseconds, not a share of \
             the round trip: the server alone spends {:.1} µs more per cycle than on two PINGs, \
             and the bare commands' p50 is {:.1} µs above two PINGs'. 10 % of two round trips \
             covers that only with a TLS PING p50 of at least {:.0} µs; this run's was {} \
             (the round trip of this machine changes from run to run, and a run with longer \
             round trips, like the one of the cycle table above, divides the same microseconds \
             by more). {}\n",
            (t - 1.0) * 100.0,
            (b - 1.0) * 100.0,
            (sd - 1.0) * 100.0,
            (b - sd) * 100.0,
            (lib - 1.0) * 100.0,
            srv("set") + srv("evalsha") - 2.0 * srv("ping"),
            (p50("bare_tls") - 2.0 * p50("ping_pool_tls")) / 1e3,
            (p50("bare_tls") - 2.0 * p50("ping_pool_tls")) / 1e3 / 0.2,
            us(p50("ping_pool_tls")),
            if b > TARGET_RATIO {
                "In this run the bare commands alone are above the target: a library that \
                 cost nothing would not meet it either."
            } else {
                "In this run the bare commands alone are within the target; what is left of it \
                 is the library's share."
            },
        );
        let _ = writeln!(md, "{TLS_WIRE_NOTE}");
    }

    /// The contended runs present in the results, in table order.
    fn contended_runs(&self) -> Vec<(&'static str, &'static str, &'static str, String)> {
        let mut runs = Vec::new();
        for (cfg, label, _) in CONTENDED {
            for sharing in SHARINGS {
                let name = format!("{cfg}_{sharing}");
                if self
                    .r
                    .s("contended", "contended", &name, "sections")
                    .is_some()
                {
                    runs.push((cfg, label, sharing, name));
                }
            }
        }
        runs
    }

    fn contended(&self, md: &mut String) {
        let r = self.r;
        let ping = self.contended_ping();
        let _ = writeln!(
            md,
            "## Contended: 8 threads on one key (`benches/contended.rs`)\n"
        );
        let _ = writeln!(
            md,
            "8 threads (all on CPU 0) loop `lock()` → `GET counter` → `SET counter n+1` (each on its \
             own raw connection) → `unlock()` for {} s per configuration, with one shared \
             `Arc<dyn DistributedLock>` (**shared**), one lock object per thread built from the \
             same `LockClient` (**per-thread**; both use that client's in-process FIFO waiter \
             queue, so a release wakes the next thread at once), or one `LockClient` per thread \
             (**client-per-thread**: the threads meet only in Redis, as separate processes would, \
             and learn of a release by pub/sub or by polling under their retry policy). \
             **client-per-thread-think** is the same with a {:.0} µs pause after each release \
             (outside the lock), so the releaser does not take the lock straight back: a release \
             goes to another thread, one already waiting or one whose pause just ended. **Handoff**: the releasing thread stores a timestamp right \
             before `unlock()`, the next thread to acquire measures from it to when its `lock()` \
             returned (handoffs back to the releasing thread itself are counted apart, as \
             self-handoffs). **Wait**: the duration of each `lock()` call. A section needs at \
             least 4 round trips (acquire, GET, SET, release), so **round trips per section** = \
             1 / (sections/s × floor) cannot go below 4 (without the pause). Floor: pooled PING \
             p50 {} (mean of the medians measured before and after).\n",
            r.f("contended", "contended", "token_default_shared", "duration_s").round(),
            r.f(
                "contended",
                "contended",
                "token_default_client_per_thread_think",
                "think_us"
            ),
            us(ping)
        );
        let _ = writeln!(
            md,
            "| configuration | lock object | sections/s | round trips per section | handoff p50 \
             (× RTT) | handoff p99 (× RTT) | handoff max | wait p50 | wait p99 | fairness \
             (min/max) | self-handoffs | `Timeout`s | counter |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for (_, label, sharing, name) in self.contended_runs() {
            let g = |m: &str| r.f("contended", "contended", &name, m);
            let h = |m: &str| r.f("contended", "handoff", &name, m);
            let w = |m: &str| r.f("contended", "wait", &name, m);
            let rate = g("sections_per_s");
            let _ = writeln!(
                md,
                "| {label} | {} | {rate:.0} | {:.1} | {} ({:.1}) | {} ({:.1}) | {} | {} | {} | {:.2} ({:.0}/{:.0}) | {:.0} of {:.0} | {:.0} | {} |",
                sharing.replace('_', "-"),
                1.0 / (rate * ping * 1e-9),
                us(h("p50_ns")),
                h("p50_ns") / ping,
                us(h("p99_ns")),
                h("p99_ns") / ping,
                us(h("max_ns")),
                us(w("p50_ns")),
                us(w("p99_ns")),
                g("fairness"),
                g("fair_min"),
                g("fair_max"),
                g("self_handoffs"),
                g("sections"),
                g("timeouts"),
                if r.s("contended", "contended", &name, "counter_ok") == Some("true") {
                    "exact"
                } else {
                    "**MISMATCH**"
                },
            );
        }
        let _ = writeln!(md, "\nSettings:\n");
        for (_, label, policy) in CONTENDED {
            let _ = writeln!(md, "- {label}: {policy}.");
        }
        let _ = writeln!(
            md,
            "\n`counter` = the final counter equals the number of sections (no two threads were \
             ever inside at once). A `Timeout` is a `lock()` that gave up under its policy (the \
             thread then simply calls `lock()` again).\n"
        );
        let crit: Vec<String> = ["token_default", "token_tuned", "classic_tuned"]
            .iter()
            .filter_map(|c| {
                let m = criterion_median(
                    self.target,
                    "contended",
                    &format!("{c}_8threads_per_section"),
                )?;
                Some(format!("{c} {} ({:.1} round trips)", us(m), m / ping))
            })
            .collect();
        if !crit.is_empty() {
            let _ = writeln!(
                md,
                "Criterion, time per section with 8 threads on one shared lock (median): {}.\n",
                crit.join("; ")
            );
        }
        let _ = writeln!(md, "Sections per thread:\n");
        for (_, label, sharing, name) in self.contended_runs() {
            let _ = writeln!(
                md,
                "- {label}, {}: {}",
                sharing.replace('_', "-"),
                r.s("contended", "contended", &name, "per_thread")
                    .unwrap_or("–")
            );
        }
        let _ = writeln!(md);
    }

    fn handoff(&self, md: &mut String) {
        let r = self.r;
        let ping = self.contended_ping();
        let bare = r.f("contended", "bare_handoff", "pubsub", "p50_ns");
        let bare_release = r.f("contended", "bare_handoff", "release", "p50_ns");
        let _ = writeln!(md, "## Handoff: pub/sub vs polling\n");
        let _ = writeln!(
            md,
            "The handoff target: *show the handoff time (release → next waiter holds the lock) under 8 \
             contending threads against polling; target: median handoff within 3 round trips of \
             the floor.* Measured in the contended runs above with one `LockClient` per thread \
             (the threads meet only in Redis, like processes; with a shared client the \
             in-process queue hands over without Redis's help, whatever the wake-up setting).\n\n\
             **Definitions.**\n\n\
             - **RTT** = one round trip: the pooled `PING` p50 of the same run ({}).\n\
             - **Handoff to a waiter** = from the releasing thread's timestamp, taken right \
             before `unlock()`, to the moment `lock()` returned in another thread **whose \
             `lock()` call began before that timestamp** (it was waiting when the lock was \
             released). A thread that calls `lock()` after the release and finds the lock free \
             is not a waiter being handed the lock; such handoffs count in the contended table \
             above (\"handoff\": any other thread) but not here.\n\
             - **Handoff floor** = {HANDOFF_FLOOR_RTTS:.0} RTT: the release round trip (the \
             unlock script, which publishes) plus the acquire round trip (the waiter's acquire \
             script). No wake-up scheme avoids them: the lock is free only once the release ran, \
             and the waiter holds it only once its acquire's reply is back. (The published message \
             can reach the waiter after half of the release round trip, so the physical bound is \
             nearer 1.5 RTT. Measured: the same handoff done with bare commands on raw \
             connections, the waiter blocked reading its own subscriber connection, took **{} = \
             {:.2} RTT** in this run; the release alone, a script that deletes and publishes, \
             took {} = {:.2} RTT, more than a `PING`. The floor is kept at the round \
             {HANDOFF_FLOOR_RTTS:.0} RTT; the table also gives each median against the bare \
             handoff.)\n\
             - **Target**, reading **A** (the target's words, \"within 3 round trips of the \
             floor\"): p50 − floor ≤ {TARGET_HANDOFF_RTTS:.0} RTT, i.e. p50 ≤ {:.0} RTT. \
             Reading **B** (stricter, \"within 3 round trips\" counted from zero): p50 ≤ \
             {TARGET_HANDOFF_RTTS:.0} RTT.\n\
             - Two loops: **1 ms pause** after each release (the releaser stays away a while, \
             the others wait: most releases are handed to a waiter; the headline) and **tight** \
             (each thread calls `lock()` again right after `unlock()`. With pub/sub the \
             releasing client, told by its release that other clients' waiters heard it, waits \
             its handoff courtesy (3 ms) before asking again, so a woken waiter gets the lock; \
             with polling the releaser usually takes the lock straight back, see the \
             self-handoffs in the contended table, and the handoffs to a waiter measured are \
             the minority a waiter won).\n",
            us(ping),
            us(bare),
            bare / ping,
            us(bare_release),
            bare_release / ping,
            HANDOFF_FLOOR_RTTS + TARGET_HANDOFF_RTTS,
        );
        let _ = writeln!(
            md,
            "| lock, wake-up | loop | handoff to a waiter p50 (× RTT) | p99 (× RTT) | p50 − floor | \
             A: ≤ {0:.0} RTT above floor | B: p50 ≤ {0:.0} RTT | p50 − bare handoff | \
             handoffs to a waiter / to any \
             other thread / sections | any other thread: p50 (× RTT) | `lock()` wait p50 / p99 | \
             fairness | sections/s |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            TARGET_HANDOFF_RTTS
        );
        for sharing in ["client_per_thread_think", "client_per_thread"] {
            for cfg in HANDOFF_CONFIGS {
                let name = format!("{cfg}_{sharing}");
                if r.s("contended", "contended", &name, "sections").is_none() {
                    continue;
                }
                let g = |m: &str| r.f("contended", "contended", &name, m);
                let hw = |m: &str| r.f("contended", "handoff_waiter", &name, m);
                let h = |m: &str| r.f("contended", "handoff", &name, m);
                let p50 = hw("p50_ns") / ping;
                let above = p50 - HANDOFF_FLOOR_RTTS;
                let tick = |ok: bool| if ok { "✓" } else { "✗" };
                let _ = writeln!(
                    md,
                    "| {} | {} | **{}** ({p50:.2}) | {} ({:.1}) | {above:.2} RTT | {} | {} | {:.2} RTT \
                     | {:.0} / \
                     {:.0} / {:.0} | {} ({:.2}) | {} / {} | {:.2} | {:.0} |",
                    contended_label(cfg),
                    loop_label(sharing),
                    us(hw("p50_ns")),
                    us(hw("p99_ns")),
                    hw("p99_ns") / ping,
                    tick(above <= TARGET_HANDOFF_RTTS),
                    tick(p50 <= TARGET_HANDOFF_RTTS),
                    p50 - bare / ping,
                    hw("n"),
                    h("n"),
                    g("sections"),
                    us(h("p50_ns")),
                    h("p50_ns") / ping,
                    us(r.f("contended", "wait", &name, "p50_ns")),
                    us(r.f("contended", "wait", &name, "p99_ns")),
                    g("fairness"),
                    g("sections_per_s"),
                );
            }
        }
        let think = |cfg: &str, m: &str| {
            self.handoff_rtts(
                "handoff_waiter",
                &format!("{cfg}_client_per_thread_think"),
                m,
            )
        };
        let (pubsub, polling) = (
            think("token_default", "p50_ns"),
            think("token_polling", "p50_ns"),
        );
        let _ = writeln!(
            md,
            "\nWith the pause, a Token waiter woken by pub/sub held the lock after a median \
             {pubsub:.2} RTT, a polling one after {polling:.2} RTT ({} of it); p99 {:.1} against \
             {:.1} RTT. Reentrant: p50 {:.2} RTT. The bare pub/sub handoff above took {:.2} RTT: \
             the library adds its own hops (the client's subscriber thread reads the message and \
             wakes the waiting thread through a condition variable, which then sends its acquire \
             script), with all 8 clients' threads and subscriber threads on one core here.\n",
            x(pubsub / polling),
            think("token_default", "p99_ns"),
            think("token_polling", "p99_ns"),
            think("reentrant_default", "p50_ns"),
            bare / ping,
        );
        let _ = writeln!(
            md,
            "![Handoff to a waiting thread by percentile, one LockClient per thread]\
             (img/handoff-latency.svg)\n"
        );
    }

    fn many_keys(&self, md: &mut String) {
        let r = self.r;
        let ping = self.contended_ping();
        let _ = writeln!(md, "## Many keys: 64 threads, each on its own keys\n");
        let _ = writeln!(
            md,
            "64 threads (all on CPU 0) each cycle `try_lock()` + `unlock()` over 4 keys of their \
             own (never contended) through one `LockClient` with a pool of 16 or 64 connections: \
             pool contention, no lock contention (default Token locks: watched, releases \
             published). The same-concurrency floors: the same 64 threads sending the Token \
             cycle's two commands bare (`SET NX PX`, the publishing `EVALSHA`; one r2d2 checkout \
             each, like the library), and two `PING`s per cycle, through an r2d2 pool of \
             the same size. The three workloads run in {:.0} interleaved rounds ({:.1} s each in \
             all); **throughput vs. bare / vs. 2 PINGs** = median over the rounds of the ratio of \
             cycles/s within the round. Latency ratios are to 2 × the single-thread pooled PING \
             floor ({}).\n",
            r.f("contended", "many_keys", "token_cycle_pool16", "rounds"),
            r.f("contended", "many_keys", "token_cycle_pool16", "duration_s"),
            us(ping),
        );
        let _ = writeln!(
            md,
            "| workload | pool | cycles/s | throughput vs. bare | throughput vs. 2 PINGs | p50 \
             (ratio to 2 PING) | p99 (ratio) | p50 vs. bare | errors | connections opened |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for pool in [16, 64] {
            for (work, label) in [
                ("token_cycle", "**Token try_lock + unlock**"),
                ("bare", "bare `SET NX PX` + publishing `EVALSHA`"),
                ("ping2", "2 × `PING`"),
            ] {
                let name = format!("{work}_pool{pool}");
                let bare = format!("bare_pool{pool}");
                let rate = |n: &str| r.f("contended", "many_keys", n, "cycles_per_s");
                let l = |n: &str, m: &str| r.f("contended", "many_keys_latency", n, m);
                let _ = writeln!(
                    md,
                    "| {label} | {pool} | {:.0} | {} | {} | {} ({}) | {} ({}) | {} | {:.0} | {:.0} |",
                    rate(&name),
                    x(r.f("contended", "many_keys", &name, "paired_vs_bare")),
                    x(r.f("contended", "many_keys", &name, "paired_vs_ping2")),
                    us(l(&name, "p50_ns")),
                    x(l(&name, "p50_ns") / (2.0 * ping)),
                    us(l(&name, "p99_ns")),
                    x(l(&name, "p99_ns") / (2.0 * ping)),
                    x(l(&name, "p50_ns") / l(&bare, "p50_ns")),
                    r.f("contended", "many_keys", &name, "errors"),
                    r.f("contended", "many_keys", &name, "connections"),
                );
            }
        }
        let crit: Vec<String> = [16, 64]
            .iter()
            .filter_map(|p| {
                let m = criterion_median(
                    self.target,
                    "many_keys",
                    &format!("pool{p}_64threads_per_cycle"),
                )?;
                Some(format!("pool {p}: {:.0} cycles/s", 1e9 / m))
            })
            .collect();
        if !crit.is_empty() {
            let _ = writeln!(
                md,
                "\nCriterion (64 threads, Token cycles; aggregate throughput from its median time \
                 per cycle): {}.",
                crit.join("; ")
            );
        }
        let _ = writeln!(
            md,
            "\nWith 64 threads on one client core, p99 is dominated by scheduling: a thread that \
             waits for a pooled connection waits behind up to 63 others.\n"
        );
    }

    fn micro(&self, md: &mut String) {
        let ping = self.ping("micro");
        let _ = writeln!(
            md,
            "## Client-side costs and allocations (`benches/micro.rs`)\n"
        );
        let _ = writeln!(
            md,
            "CPU time on the client, no network. Measured in {} interleaved batches of {} \
             calls: the **median batch** is the headline (other work on the shared machine only \
             ever adds time, so the best batch is closer to the code's own cost); criterion's \
             median for reference. Fraction of this run's pooled PING floor ({}):\n",
            self.r.f("micro", "cpu", "all", "rounds"),
            self.r.f("micro", "cpu", "all", "per_round"),
            us(ping)
        );
        let _ = writeln!(
            md,
            "| operation | median batch | best batch | criterion median | fraction of one PING |\n\
             | --- | --- | --- | --- | --- |"
        );
        for (name, label) in [
            (
                "token_generate",
                "token: 16 random bytes → 32 hex chars (stack only)",
            ),
            (
                "classic_value_decimal",
                "Classic value, decimal (`SystemTime::now` + format)",
            ),
            ("classic_value_bigendian", "Classic value, big-endian"),
            (
                "set_nx_px_build_and_pack",
                "build + pack `SET key token NX PX ttl`",
            ),
            (
                "evalsha_build_and_pack",
                "build + pack `EVALSHA sha 1 key token` (Classic's release)",
            ),
            (
                "evalsha_publish_build_and_pack",
                "build + pack `EVALSHA sha 1 key token 0 channel` (Token's publishing release, \
                 built as `src/scripts.rs` builds it)",
            ),
            ("setnx_build_and_pack", "build + pack `SETNX key value`"),
            (
                "pool_checkout_return",
                "r2d2 pool checkout + return (no I/O)",
            ),
            (
                "lock_client_pool_state",
                "`LockClient::pool_state()`: r2d2 `state()`, one more pool-mutex lock (the \
                 library calls it once per command, for its stale-connection retry budget)",
            ),
            (
                "token_cycle_client_side",
                "everything of a Token cycle but the I/O and the watchdog registration (token, \
                 `SET` + publishing `EVALSHA`, 2 checkouts)",
            ),
            (
                "script_sha1_once_per_client",
                "SHA1 of a script (once per `LockClient`, not per cycle)",
            ),
        ] {
            let median = self.r.f("micro", "cpu", name, "median_ns");
            let _ = writeln!(
                md,
                "| {label} | {median:.0} ns | {:.0} ns | {:.0} ns | {:.2} % |",
                self.r.f("micro", "cpu", name, "best_ns"),
                criterion_median(self.target, "micro", name).unwrap_or(f64::NAN),
                100.0 * median / ping
            );
        }
        let _ = writeln!(md, "\n### Allocations\n");
        let _ = writeln!(
            md,
            "Counted by a counting `#[global_allocator]` over 2,000 cycles against the real \
             server (5,000 for the steps without I/O), per cycle or step. `reallocs` are growths \
             of an existing buffer; bytes = requested sizes (growth counted as the increase).\n"
        );
        let _ = writeln!(
            md,
            "| what | allocations | reallocations | bytes |\n| --- | --- | --- | --- |"
        );
        for (kind, name, label) in [
            (
                "cycle",
                "token",
                "**Token cycle, default: watched** (library, try_lock + unlock)",
            ),
            (
                "cycle",
                "token_ttl",
                "**Token cycle, explicit ttl: not watched** (library)",
            ),
            (
                "cycle",
                "reentrant",
                "**Reentrant cycle, default: watched** (library)",
            ),
            (
                "cycle",
                "classic_decimal",
                "**Classic cycle, decimal** (library)",
            ),
            (
                "cycle",
                "classic_bigendian",
                "**Classic cycle, big-endian** (library)",
            ),
            (
                "cycle",
                "classic_key_ttl",
                "**Classic cycle, key_ttl** (library)",
            ),
            (
                "cycle",
                "bare_set_nx_px_evalsha_pub_raw",
                "bare `SET NX PX` + publishing `EVALSHA` (2 keys) with `redis::cmd`, raw \
                 connection: Token's commands",
            ),
            (
                "cycle",
                "bare_set_nx_px_evalsha_raw",
                "bare `SET NX PX` + 1-key `EVALSHA` with `redis::cmd`, raw connection",
            ),
            (
                "cycle",
                "bare_set_nx_px_evalsha_pool",
                "the same, one pool checkout per command",
            ),
            (
                "cycle",
                "bare_setnx_evalsha_raw",
                "bare `SETNX` + `EVALSHA`, raw",
            ),
            (
                "cycle",
                "bare_prepacked_reused_buffer",
                "bare, packed into one reused buffer + `req_packed_command`",
            ),
            ("step", "token_generate", "step: token generation"),
            ("step", "classic_value_decimal", "step: Classic value"),
            (
                "step",
                "set_nx_px_build",
                "step: build `SET NX PX` (`redis::cmd(..).arg(..)`)",
            ),
            (
                "step",
                "set_nx_px_pack",
                "step: `get_packed_command()` of it",
            ),
            ("step", "evalsha_build", "step: build `EVALSHA` (1 key)"),
            (
                "step",
                "evalsha_publish_build",
                "step: build the publishing `EVALSHA` (2 keys, as the library does)",
            ),
            (
                "step",
                "pool_checkout_return",
                "step: pool checkout + return",
            ),
            (
                "step",
                "reply_ok_prepacked_set",
                "step: send pre-packed bytes, read `+OK`",
            ),
            (
                "step",
                "reply_int_prepacked_evalsha",
                "step: send pre-packed bytes, read `:0`",
            ),
            (
                "setup",
                "lock_build_token",
                "setup: `client.lock(key).build()` (once per lock)",
            ),
        ] {
            let _ = writeln!(
                md,
                "| {label} | {:.2} | {:.2} | {:.0} |",
                self.allocs(kind, name, "allocs"),
                self.allocs(kind, name, "reallocs"),
                self.allocs(kind, name, "bytes"),
            );
        }
        let _ = writeln!(
            md,
            "\nWhere they come from (`DLOCK_BENCH_TRACE_ALLOC=1 cargo bench -p redis-dlock-benches --bench micro` prints \
             the call site of every allocation of one cycle of each lock): per command, redis-rs's \
             `Cmd` allocates its data buffer and its argument index (the library sizes both up \
             front with `Cmd::with_capacity`, hence no reallocations; bare `redis::cmd(..).arg(..)` \
             grows them), `Connection::req_command` packs into a fresh `Vec` \
             (`get_packed_command`), and the reply parser allocates 32 B: 4 per command, 8 per \
             cycle. Beyond those, a **watched** hold (Token and Reentrant without `ttl`) \
             allocates the watchdog's record of the hold (`WatchState::new`, one `Arc`, 160 B) at \
             acquire: the watched Token cycle {:.2} allocations against {:.2} with an explicit \
             ttl. The **Reentrant** cycle ({:.2} allocations, {:.2} reallocations) also records \
             the hold in its thread-local table \
             (`reentrant::note_local`, 3 allocations) and parses the acquire script's array reply \
             (224 B). The rest of the library's own code (token, value, lease, guard, pool \
             checkout, script SHA) allocates nothing per cycle. Writing the RESP bytes into a \
             reused buffer and sending them with `req_packed_command` would leave only the \
             parser's allocation (1 per command), for ~0.5 µs less CPU per cycle.\n",
            self.allocs("cycle", "token", "allocs"),
            self.allocs("cycle", "token_ttl", "allocs"),
            self.allocs("cycle", "reentrant", "allocs"),
            self.allocs("cycle", "reentrant", "reallocs"),
        );
    }

    fn method(&self, md: &mut String) {
        let _ = writeln!(md, "## Method and files\n");
        let _ = writeln!(
            md,
            "- `benches/floor.rs`, `benches/cycle.rs`, `benches/contended.rs`, `benches/micro.rs` \
             (criterion, `harness = false`); shared helpers in `benches/common/mod.rs`, which \
             reuses the test fixture `tests/support/mod.rs` for the throw-away `redis-server`.\n\
             - Headline figures are the benches' own measurements (per-operation timing, medians \
             of thousands of operations, interleaved with the floor); criterion runs the same \
             operations afterwards with short settings (0.5 s warm-up, 2 s measurement) and its \
             results and HTML report are in `target/criterion/` (open \
             `target/criterion/report/index.html`).\n\
             - Raw results: `target/dlock-bench/*.csv` (`section,name,metric,value`).\n\
             - `cargo test -p redis-dlock-benches --benches` (or `cargo bench -p redis-dlock-benches -- --test`) runs every bench path once, \
             briefly, without writing results.\n\
             - The machine is a shared 2-core VM: tails (p99, max) are dominated by scheduling \
             noise and vary a lot between runs; medians and ratios are the stable figures.\n"
        );
    }

    // ---- plots ---------------------------------------------------------------------------

    fn cycle_svg(&self) -> String {
        let rows: Vec<(String, f64, f64)> = CYCLES
            .iter()
            .map(|(name, label, bare, _)| {
                (
                    label.to_string(),
                    self.cycle_ratio(name),
                    self.cycle_ratio(bare),
                )
            })
            .collect();
        let (w, left, right, top, bar_h, gap) = (900.0, 330.0, 40.0, 50.0, 22.0, 14.0);
        let h = top + rows.len() as f64 * (bar_h + gap) + 60.0;
        let (lo, hi) = (
            0.9,
            1.3_f64.max(rows.iter().map(|r| r.1).fold(0.0, f64::max) + 0.05),
        );
        let sx = |v: f64| left + (v.clamp(lo, hi) - lo) / (hi - lo) * (w - left - right);
        let mut s = svg_open(w, h);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="24" font-size="15" font-weight="bold" text-anchor="middle">Uncontended cycle: p50 / (2 × pooled PING p50), same run</text>"#,
            w / 2.0
        );
        let axis_y = top + rows.len() as f64 * (bar_h + gap);
        let mut t = lo;
        while t <= hi + 1e-9 {
            let xx = sx(t);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{axis_y}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{t:.2}</text>"##,
                axis_y + 16.0
            );
            t += 0.05;
        }
        for (i, (label, ratio, bare)) in rows.iter().enumerate() {
            let y = top + i as f64 * (bar_h + gap);
            let colour = if label.starts_with("Token") {
                "#3b6fb6"
            } else if label.starts_with("Reentrant") {
                "#3a9a5b"
            } else {
                "#d9822b"
            };
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"##,
                left - 8.0,
                y + bar_h * 0.7,
                esc(label)
            );
            let _ = writeln!(
                s,
                r##"<rect x="{left}" y="{y:.1}" width="{:.1}" height="{bar_h}" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="11">{ratio:.3}</text>"##,
                (sx(*ratio) - left).max(0.0),
                sx(*ratio) + 4.0,
                y + bar_h * 0.7
            );
            let bx = sx(*bare);
            let _ = writeln!(
                s,
                r##"<line x1="{bx:.1}" y1="{:.1}" x2="{bx:.1}" y2="{:.1}" stroke="#222" stroke-width="2.5"/>"##,
                y - 3.0,
                y + bar_h + 3.0
            );
        }
        for (v, colour, label) in [
            (1.0, "#444", "2 PINGs"),
            (TARGET_RATIO, "#c0392b", "target 1.10"),
        ] {
            let xx = sx(v);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{axis_y}" stroke="{colour}" stroke-dasharray="6,4" stroke-width="1.5"/><text x="{xx:.1}" y="{:.1}" font-size="11" fill="{colour}" text-anchor="middle">{label}</text>"##,
                top - 8.0,
                top - 12.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{left}" y="{:.1}" font-size="11" fill="#333">bars: the library's cycle · black tick: the same two commands, bare redis-rs, raw connection</text>"##,
            axis_y + 40.0
        );
        s.push_str("</svg>\n");
        s
    }

    /// Percentile plot (HdrHistogram style): x = percentile on a "nines" scale, y = latency (log).
    fn handoff_svg(&self) -> String {
        // One colour per configuration; solid: client per thread with the 1 ms pause (every
        // release handed to a waiter), dotted: client per thread, tight loop; grey dashed: the
        // in-process queue (Token defaults, shared lock) for reference.
        let colours = [
            "#3b6fb6", "#c0392b", "#7fb2e5", "#3a9a5b", "#e6a23c", "#8e44ad",
        ];
        let mut runs: Vec<(String, &str, &str, String)> = Vec::new();
        for (i, (cfg, label, _)) in CONTENDED.iter().enumerate() {
            for (sharing, short, dash) in [
                ("client_per_thread_think", "1 ms pause", ""),
                (
                    "client_per_thread",
                    "tight",
                    r#" stroke-dasharray="1.5,2.5""#,
                ),
            ] {
                runs.push((
                    format!("{label}, {short}"),
                    colours[i % colours.len()],
                    dash,
                    format!("{cfg}_{sharing}"),
                ));
            }
        }
        runs.push((
            "Token, defaults, shared lock (in-process)".to_owned(),
            "#999",
            r#" stroke-dasharray="6,3""#,
            "token_default_shared".to_owned(),
        ));
        let mut series = Vec::new();
        for (label, colour, dash, name) in runs {
            let pts: Vec<(f64, f64)> = self
                .r
                .s("contended", "handoff_waiter_pct", &name, "q_ns")
                .or_else(|| self.r.s("contended", "handoff_pct", &name, "q_ns"))
                .unwrap_or("")
                .split_whitespace()
                .filter_map(|p| {
                    let (q, v) = p.split_once(':')?;
                    Some((q.parse().ok()?, v.parse().ok()?))
                })
                .collect();
            if pts.len() > 1 {
                series.push((label, colour, dash, pts));
            }
        }
        let (w, h, left, right, top, bottom) = (980.0, 520.0, 75.0, 340.0, 45.0, 60.0);
        let pw = w - left - right;
        let ph = h - top - bottom;
        let values = series.iter().flat_map(|s| s.3.iter().map(|p| p.1));
        let min_ns = values.clone().filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
        let max_ns = values
            .fold(0.0, f64::max)
            .max(TARGET_HANDOFF_P99_MS * 1e6 * 1.5);
        let lo = (min_ns.max(1_000.0) / 1e3).log10().floor();
        let hi = (max_ns / 1e3).log10().ceil();
        // x: nines = -log10(1 - q), 0 … 3.5; the max (q = 1) drawn at 4.
        const MAX_NINES: f64 = 4.0;
        let nines = |q: f64| {
            if q >= 1.0 {
                MAX_NINES
            } else {
                (-(1.0 - q).log10()).min(3.5)
            }
        };
        let sx = |q: f64| left + nines(q) / MAX_NINES * pw;
        let sy = |ns: f64| top + ph - ((ns.max(1.0) / 1e3).log10() - lo) / (hi - lo) * ph;
        let mut s = svg_open(w, h);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="24" font-size="15" font-weight="bold" text-anchor="middle">Handoff to a waiting thread by percentile, 8 threads on one key, one LockClient each</text>"#,
            w / 2.0
        );
        let mut d = lo;
        while d <= hi + 1e-9 {
            let yy = top + ph - (d - lo) / (hi - lo) * ph;
            let v = 10f64.powf(d);
            let label = if v >= 1000.0 {
                format!("{} ms", v / 1000.0)
            } else {
                format!("{v} µs")
            };
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{label}</text>"##,
                left + pw,
                left - 6.0,
                yy + 4.0
            );
            d += 1.0;
        }
        for (q, label) in [
            (0.0, "0%"),
            (0.9, "90%"),
            (0.99, "99%"),
            (0.999, "99.9%"),
            (1.0, "max"),
        ] {
            let xx = sx(q);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="{}"/><text x="{xx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{label}</text>"##,
                top + ph,
                if q == 0.99 { "#999" } else { "#ddd" },
                top + ph + 16.0
            );
        }
        let ty = sy(TARGET_HANDOFF_P99_MS * 1e6);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#c0392b" stroke-dasharray="6,4" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#c0392b">target: p99 ≤ 20 ms (Token, defaults)</text>"##,
            left + pw,
            left + 6.0,
            ty - 5.0
        );
        let ping = self.contended_ping();
        if !ping.is_nan() {
            let rtts = HANDOFF_FLOOR_RTTS + TARGET_HANDOFF_RTTS;
            let ty = sy(rtts * ping);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#27ae60" stroke-dasharray="6,4" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#27ae60">target: median ≤ floor + 3 RTT = {rtts:.0} RTT ({})</text>"##,
                left + pw,
                left + 6.0,
                ty - 5.0,
                esc(&us(rtts * ping))
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">percentile of handoffs (release → lock() returned in a thread already waiting)</text><text x="16" y="{:.1}" font-size="12" transform="rotate(-90 16 {:.1})" text-anchor="middle">handoff latency (log scale)</text>"##,
            left + pw / 2.0,
            h - 16.0,
            top + ph / 2.0,
            top + ph / 2.0
        );
        for (i, (label, colour, dashed, pts)) in series.iter().enumerate() {
            let mut path = String::new();
            for (k, (q, v)) in pts.iter().enumerate() {
                let _ = write!(
                    path,
                    "{}{:.1},{:.1} ",
                    if k == 0 { "M" } else { "L" },
                    sx(*q),
                    sy(*v)
                );
            }
            let dash = *dashed;
            let _ = writeln!(
                s,
                r#"<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#
            );
            let ly = top + 10.0 + i as f64 * 20.0;
            let lx = left + pw + 14.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
                lx + 26.0,
                lx + 32.0,
                ly + 4.0,
                esc(label)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// The label of a contended configuration.
fn contended_label(cfg: &str) -> &'static str {
    CONTENDED.iter().find(|c| c.0 == cfg).map_or("?", |c| c.1)
}

/// How the threads of a client-per-thread run loop.
fn loop_label(sharing: &str) -> &'static str {
    match sharing {
        "client_per_thread_think" => "1 ms pause after each release",
        "client_per_thread" => "tight loop",
        _ => "?",
    }
}

fn svg_open(w: f64, h: f64) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
"##
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The mixed-fleet measurement: not a criterion bench but an ignored test of
/// `tests/mixedfleet.rs`, run by hand; its figures are recorded here.
fn mixed_fleet(md: &mut String) {
    let _ = writeln!(md, "{MIXED_FLEET}");
}

/// Recorded output of `cargo test --release --test mixedfleet -- --ignored --nocapture measure`
/// (update it when the waiting path changes).
const MIXED_FLEET: &str = include_str!("mixed_fleet.md");

/// The verdicts of the page's previous generation, kept by hand: the same command on another
/// day's machine (update it when the page is regenerated on a machine of another kind).
const EARLIER_RUNS: &str = "**The same command on other days.** The previous generation of \
this page (code `c4b85f3`, 2026-11-21, pooled `PING` p50 55–63 µs; its cycle section rerun on \
2026-11-25 at `9b747ab`) measured the uncontended Token cycle at 1.103× two PINGs (explicit \
ttl 1.068×, met), Reentrant 1.153×, Classic 1.069–1.091× (met), the bare commands of those \
cycles 0.996–1.135×, and contended handoffs to a waiter of 3.95 RTT = 247 µs (Token, \
defaults, 1 ms pause), 4.00–4.02 RTT (Reentrant) and 1.67 RTT (Token polling, tight loop): \
the handoff target's reading A met in every row. Where a round trip is shorter, as on the machine of this page's runs (see Machine \
and run), the same server work (a script, a thread's wake-up) weighs more in every ratio, the \
bare commands' included: compare each row with its bare commands and with the other locks of \
the same run, not with another day's.\n";

/// Recorded runs of the cycle bench against Valkey 9.1 (`DLOCK_TEST_SERVER=… cargo bench -p
/// redis-dlock-benches --bench cycle`): the Token cycle with the native commands and with the
/// scripts forced (update it when the Token lock's commands change).
const VALKEY_BENCH: &str = include_str!("valkey_bench.md");

/// Recorded summary of three runs of `cargo bench -p redis-dlock-benches --bench fair` (update it when the fair lock
/// or its bench changes).
const FAIR_BENCH: &str = include_str!("fair_bench.md");

/// Recorded summary of runs of `cargo bench -p redis-dlock-benches --bench knobs`: each special
/// path and tuned timing of the runtime with and without it (update it when one changes).
const KNOBS_BENCH: &str = include_str!("knobs_bench.md");
