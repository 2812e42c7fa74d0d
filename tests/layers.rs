//! The house by layers (see docs/architecture.md): every file of src/ belongs to one layer and
//! imports only from its own layer or below, and no files import each other in a cycle. Read
//! from the source text: every
//! `crate::` path, `super::` path and child-module path outside comments and unit tests.
//!
//! A new file must be given its layer in [`LAYERS`]; the test names it otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first.
const VOCABULARY: u8 = 0;
const RUNTIME: u8 = 1;
const ALGORITHMS: u8 = 2;
const FACADE: u8 = 3;

/// Every module of the library (src/bin is the `dlock` command, a crate of its own, which uses
/// only the public API) and its layer.
const LAYERS: &[(&str, u8)] = &[
    ("error", VOCABULARY),
    ("time", VOCABULARY),
    ("retry", VOCABULARY),
    ("keys", VOCABULARY),
    ("ids", VOCABULARY),
    ("scripts", VOCABULARY),
    ("server", VOCABULARY),
    ("stats", VOCABULARY),
    ("lease", VOCABULARY),
    ("lock", VOCABULARY),
    ("client", RUNTIME),
    ("client::access", RUNTIME),
    ("client::acquire", RUNTIME),
    ("client::admin", RUNTIME),
    ("client::cleanup", RUNTIME),
    ("client::confirm", RUNTIME),
    ("client::grants", RUNTIME),
    ("client::janitor", RUNTIME),
    ("client::jobs", RUNTIME),
    ("client::live", RUNTIME),
    ("client::native", RUNTIME),
    ("client::pool", RUNTIME),
    ("client::repeats", RUNTIME),
    ("client::sentinel_watch", RUNTIME),
    ("client::subscriber", RUNTIME),
    ("client::subscriber::reader", RUNTIME),
    ("client::subscriber::registry", RUNTIME),
    ("client::switches", RUNTIME),
    ("client::target", RUNTIME),
    ("client::test_hooks", RUNTIME),
    ("client::tuning", RUNTIME),
    ("client::waiters", RUNTIME),
    ("client::watchdog", RUNTIME),
    ("client::watched", RUNTIME),
    ("primitives", ALGORITHMS),
    ("primitives::classic", ALGORITHMS),
    ("primitives::fair", ALGORITHMS),
    ("primitives::hold", ALGORITHMS),
    ("primitives::multilock", ALGORITHMS),
    ("primitives::reentrant", ALGORITHMS),
    ("primitives::string_value", ALGORITHMS),
    ("primitives::spring", ALGORITHMS),
    ("primitives::shedlock", ALGORITHMS),
    ("primitives::token", ALGORITHMS),
    ("primitives::rwlock", ALGORITHMS),
    ("primitives::redlock", ALGORITHMS),
    ("primitives::semaphore", ALGORITHMS),
    ("strategy", FACADE),
    ("client::builder", FACADE),
    ("bench_hooks", FACADE),
    ("doctests", FACADE),
    ("crate", FACADE),
];

fn layer_name(l: u8) -> &'static str {
    ["vocabulary", "runtime", "algorithms", "facade"][usize::from(l)]
}

/// Module path (`client::janitor`; `crate` for lib.rs) → source text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("dir entry").path();
            let rel = path.strip_prefix(src).expect("under src/").to_path_buf();
            if path.is_dir() {
                if rel != Path::new("bin") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let mut parts: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if parts.last().map(String::as_str) == Some("mod") {
                parts.pop();
            }
            let name = if parts == ["lib"] {
                "crate".to_owned()
            } else {
                parts.join("::")
            };
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.insert(name, text);
        }
    }
    out
}

/// The text without comments, string contents and the unit tests (which come last in a file).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' {
                i += 2;
                continue;
            }
            if b[i] == b'"' {
                in_str = false;
                out.push('"');
            }
            i += 1;
        } else if b[i] == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i = text[i..].find("*/").map_or(b.len(), |j| i + j + 2);
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '"': skipped whole.
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') {
            // An escaped one such as '\"'.
            i += 4;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that starts at `start` (an index just past `crate::`, `super::` or a child
/// module name followed by `::`), expanded through `{a, b::{c, d}}` groups: the segment lists.
fn paths_at(code: &str, start: usize) -> Vec<Vec<String>> {
    fn tree(s: &[char], i: &mut usize) -> Vec<Vec<String>> {
        let mut prefix: Vec<String> = Vec::new();
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                let mut all = Vec::new();
                loop {
                    while *i < s.len() && (s[*i].is_whitespace() || s[*i] == ',') {
                        *i += 1;
                    }
                    if *i >= s.len() || s[*i] == '}' {
                        *i += 1;
                        break;
                    }
                    for p in tree(s, i) {
                        let mut full = prefix.clone();
                        full.extend(p);
                        all.push(full);
                    }
                }
                return all;
            }
            let begin = *i;
            while *i < s.len() && ident_char(s[*i]) {
                *i += 1;
            }
            if *i == begin {
                return vec![prefix];
            }
            prefix.push(s[begin..*i].iter().collect());
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
            } else {
                // ` as alias`, `;`, `(`, `,` ...: the path ends here.
                return vec![prefix];
            }
        }
    }
    let chars: Vec<char> = code[start..].chars().take(4_000).collect();
    let mut i = 0;
    tree(&chars, &mut i)
}

/// The longest module named by a path's leading segments.
fn resolve(known: &BTreeSet<String>, segments: &[String]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| known.contains(m))
}

/// Module → the modules its code names.
fn imports(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<String> = mods.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, text) in mods {
        let code = code(text);
        let parent: Vec<String> = if name == "crate" {
            Vec::new()
        } else {
            let mut p: Vec<String> = name.split("::").map(str::to_owned).collect();
            p.pop();
            p
        };
        let own: Vec<String> = if name == "crate" {
            Vec::new()
        } else {
            name.split("::").map(str::to_owned).collect()
        };
        // Child modules declared here (`mod x;`), named by relative paths `x::...`.
        let children: BTreeSet<String> = code
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let rest = l
                    .strip_prefix("pub(crate) mod ")
                    .or_else(|| l.strip_prefix("pub mod "))
                    .or_else(|| l.strip_prefix("mod "))?;
                rest.strip_suffix(';').map(str::to_owned)
            })
            .collect();
        let mut found = BTreeSet::new();
        let bytes = code.as_bytes();
        for (i, _) in code.match_indices("::") {
            // The segment before `::`, if it starts a path.
            let mut b = i;
            while b > 0 && ident_char(bytes[b - 1] as char) {
                b -= 1;
            }
            if b > 0 && (bytes[b - 1] == b':' || ident_char(bytes[b - 1] as char)) {
                continue; // not the first segment
            }
            let first = &code[b..i];
            let base: Vec<String> = match first {
                "crate" => Vec::new(),
                "super" => parent.clone(),
                "self" => own.clone(),
                c if children.contains(c) => {
                    let mut v = own.clone();
                    v.push(c.to_owned());
                    v
                }
                _ => continue,
            };
            for rest in paths_at(&code, i + 2) {
                let mut full = base.clone();
                full.extend(rest);
                if let Some(m) = resolve(&known, &full) {
                    if &m != name {
                        found.insert(m);
                    }
                }
            }
        }
        graph.insert(name.clone(), found);
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(t: &mut T<'g>, v: &'g str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let graph = t.graph;
        for w in graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.insert(w.to_owned());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    imports(&modules(&src))
}

#[test]
fn every_module_has_a_layer() {
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let missing: Vec<String> = graph()
        .keys()
        .filter(|m| !layers.contains_key(m.as_str()))
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "give these modules a layer in tests/layers.rs and docs/architecture.md: {missing:?}"
    );
}

#[test]
fn each_layer_imports_only_from_below() {
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut upward = Vec::new();
    for (from, tos) in graph() {
        let Some(&lf) = layers.get(from.as_str()) else {
            continue; // reported by every_module_has_a_layer
        };
        for to in tos {
            if let Some(&lt) = layers.get(to.as_str()) {
                if lt > lf {
                    upward.push(format!(
                        "{from} ({}) imports {to} ({})",
                        layer_name(lf),
                        layer_name(lt)
                    ));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports up the layers: {upward:#?}");
}

#[test]
fn no_import_cycle() {
    let found = cycles(&graph());
    assert!(found.is_empty(), "import cycles: {found:#?}");
}

/// The check itself: it must see imports through groups, `super::` and child paths, and find
/// a cycle where there is one.
#[test]
fn the_check_sees_grouped_relative_and_cyclic_imports() {
    let mods: BTreeMap<String, String> = [
        (
            "a",
            "use crate::{b::{self, X}, c};\n// use crate::d;\nfn f() { crate::e::g(); }",
        ),
        ("b", "use super::a::Y;\nconst S: &str = \"crate::d::z\";"),
        ("c", "pub(crate) mod inner;\nuse inner::Z;"),
        ("c::inner", ""),
        ("d", ""),
        ("e", "/* crate::d */ use crate::a as _;"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let g = imports(&mods);
    let set = |v: &[&str]| {
        v.iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<String>>()
    };
    assert_eq!(g["a"], set(&["b", "c", "e"]));
    // Not a path inside a string or a comment.
    assert_eq!(g["b"], set(&["a"]));
    assert_eq!(g["c"], set(&["c::inner"]));
    assert_eq!(g["e"], set(&["a"]));
    let found = cycles(&g);
    assert_eq!(found, vec![set(&["a", "b", "e"])]);
}
