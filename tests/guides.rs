//! Every Rust snippet of the README and the guides is compiled. Their ```rust blocks are
//! doctests (src/doctests.rs; .ci/package-check checks that every docs/*.md is included), but
//! inline code is not: a table row or a sentence that shows a call chain would rot unseen (the
//! 0.1 options of the Classic strategy stayed in a table after they moved into
//! `ClassicOptions`). So each inline snippet that is Rust code must also appear, verbatim
//! (whitespace aside), in a compiled ```rust block of the same file; `(..)` and `…` stand for
//! any arguments.
//!
//! Which inline code is a snippet: in a table row, any code with a call (`(`) that is Rust
//! rather than Java, Python or Go (those use camelCase methods or keyword arguments, see
//! [`is_rust`]); in prose, a chain of calls (`a(..).b(..)`) or a statement ending in `?`.

use std::path::{Path, PathBuf};

/// Inline code of other languages that [`is_rust`] cannot tell apart by its shape, and the few
/// Rust lines a doctest of this crate cannot compile (each says why).
const OTHER_LANGUAGES: &[&str] = &[
    "time.time() + timeout",
    "time.time() + expires + 1",
    "redis.lock(name, timeout=…)",
    "redis.replicate_commands()",
    // The crate's internals, for contributors (docs/architecture.md): not public.
    "stats::Kind::new(\"token\")",
    // A call into rustls, which this crate does not re-export (README, TLS): the doctests
    // cannot name it.
    "rustls::crypto::ring::default_provider().install_default()",
];

fn guides() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// A guide split into what rustdoc compiles and the inline snippets outside its blocks.
struct Guide {
    /// Every compiled block's text (hidden `# ` lines included), without whitespace.
    compiled: String,
    /// (line number, in a table, inline code)
    inline: Vec<(usize, bool, String)>,
}

fn read(path: &Path) -> Guide {
    let text = std::fs::read_to_string(path).expect("read guide");
    let mut compiled = String::new();
    let mut inline = Vec::new();
    // None outside a block; Some(compiled?) inside one.
    let mut block: Option<bool> = None;
    // The lines of the paragraph being read, outside blocks and tables.
    let mut prose: Vec<(usize, bool, &str)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            spans(&prose, &mut inline);
            prose.clear();
            block = match block {
                Some(_) => None,
                // rustdoc compiles an unlabelled block as Rust too.
                None => Some(
                    info.is_empty()
                        || (info.starts_with("rust")
                            && !info.contains("ignore")
                            && !info.contains("compile_fail")),
                ),
            };
            continue;
        }
        match block {
            Some(true) => {
                let code = trimmed
                    .strip_prefix("# ")
                    .or_else(|| (trimmed == "#").then_some(""))
                    .unwrap_or(trimmed);
                compiled.extend(code.chars().filter(|c| !c.is_whitespace()));
            }
            Some(false) => {}
            None if trimmed.starts_with('|') => {
                spans(&prose, &mut inline);
                prose.clear();
                spans(&[(i + 1, true, line)], &mut inline);
            }
            None if trimmed.is_empty() => {
                spans(&prose, &mut inline);
                prose.clear();
            }
            None => prose.push((i + 1, false, line)),
        }
    }
    spans(&prose, &mut inline);
    Guide { compiled, inline }
}

/// The inline code of a paragraph (its lines, numbered; a table row is a paragraph of its
/// own): a span may go on over a line break, which counts as a space.
fn spans(paragraph: &[(usize, bool, &str)], out: &mut Vec<(usize, bool, String)>) {
    let mut code: Option<(usize, String)> = None;
    for (number, table, line) in paragraph {
        for (k, part) in line.split('`').enumerate() {
            if k > 0 {
                // A backtick: a span opens or closes.
                code = match code.take() {
                    Some((at, text)) => {
                        out.push((at, *table, text));
                        None
                    }
                    None => Some((*number, String::new())),
                };
            }
            if let Some((_, text)) = code.as_mut() {
                if k == 0 && !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(if k == 0 { part.trim_start() } else { part });
            }
        }
    }
}

/// Rust, not Java, Python, Go or Lua: no camelCase method, no keyword argument, no `new X(`.
fn is_rust(code: &str) -> bool {
    if OTHER_LANGUAGES.contains(&code) || code.contains("new ") || code.contains("redis.call") {
        return false;
    }
    let bytes = code.as_bytes();
    // `.fooBar(` or `.Foo(`: a method name that is not snake_case.
    for (i, _) in code.match_indices('.') {
        let name: String = code[i + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty()
            && bytes.get(i + 1 + name.len()) == Some(&b'(')
            && name.chars().any(|c| c.is_ascii_uppercase())
        {
            return false;
        }
    }
    !code.contains("=…") && !code.contains("= ")
}

/// `x.y(`: a method called on a receiver.
fn has_method_call(code: &str) -> bool {
    code.match_indices('.').any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let name: String = code[i + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ')')
            && !name.is_empty()
            && code[i + 1 + name.len()..].starts_with('(')
    })
}

/// Inline code that is a snippet to compile (see the file's comment).
fn is_snippet(code: &str, table: bool) -> bool {
    if !code.contains('(') || !is_rust(code) {
        return false;
    }
    if table {
        // A call on a path or a receiver, or a builder step: `a::b(..)`, `x.y(..)`, `.y(..)`;
        // not a bare name (`lock()`), a value (`Ok(false)`) or text with parentheses.
        return code.contains("::") || code.starts_with('.') || has_method_call(code);
    }
    let chain = code.contains(").") && code.split(").").skip(1).any(|s| s.contains('('));
    chain || code.trim_end().ends_with('?')
}

/// True when `code` (without whitespace) is in `compiled`, `(..)` and `…` matching any
/// arguments (up to [`WILDCARD`] characters).
fn is_compiled(code: &str, compiled: &str) -> bool {
    let code: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    // A `|` in a table cell is written `\|`.
    let code = code.replace("(..)", "(…)").replace("\\|", "|");
    let pieces: Vec<&str> = code.split('…').collect();
    let (first, rest) = pieces
        .split_first()
        .expect("split gives one piece at least");
    compiled.match_indices(first).any(|(start, _)| {
        let mut at = start + first.len();
        rest.iter().all(|p| match compiled[at..].find(p) {
            Some(found) if found <= WILDCARD => {
                at += found + p.len();
                true
            }
            _ => false,
        })
    })
}

/// The most a `(..)` or `…` stands for.
const WILDCARD: usize = 160;

#[test]
fn every_rust_snippet_of_the_guides_is_compiled() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for path in guides() {
        let guide = read(&path);
        for (line, table, code) in &guide.inline {
            if !is_snippet(code, *table) {
                continue;
            }
            checked += 1;
            if !is_compiled(code, &guide.compiled) {
                missing.push(format!(
                    "{}:{line}: `{code}`",
                    path.file_name().unwrap_or_default().to_string_lossy()
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} snippets found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "Rust inline code that no compiled ```rust block of its guide contains (add it to \
         one, e.g. a block under the table, so that rustdoc compiles it):\n{}",
        missing.join("\n")
    );
}

/// The check can fail: the 0.1 form of a Classic option, in a table, is not found in a block
/// that has only the 0.2 form.
#[test]
fn a_stale_table_snippet_is_found() {
    let compiled: String = "let b = client.lock(\"k\").strategy(Strategy::Classic(ClassicOptions::new().encoding(Encoding::FloatSeconds))).ttl(Duration::from_secs(5));"
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let stale = ".strategy(Strategy::Classic).encoding(Encoding::FloatSeconds).ttl(T)";
    assert!(is_snippet(stale, true));
    assert!(!is_compiled(stale, &compiled));
    let fresh =
        ".strategy(Strategy::Classic(ClassicOptions::new().encoding(Encoding::FloatSeconds)))";
    assert!(is_compiled(fresh, &compiled));
    assert!(is_compiled(".ttl(..)", &compiled));
    // Java and Python are not Rust.
    assert!(!is_rust("redisson.getLock(name)"));
    assert!(!is_rust(
        "new RedisLockRegistry(connectionFactory, registryKey).obtain(lockKey)"
    ));
    assert!(!is_rust("redis.lock(name, timeout=…)"));
    assert!(is_rust(
        "RetryPolicy::legacy().fixed_delay(Duration::from_millis(100))"
    ));
}
