//! No import cycles between the top-level modules of kamera-lab and kamera-eval (issue 41): the
//! modules are layered (small types and helpers at the bottom, methods in the middle, the
//! dispatcher and reports on top), and this test reads each crate's `src/` and fails naming
//! every cycle the `crate::` paths form. A module and its submodules (`src/x.rs`, `src/x/**`)
//! are one node, so `super::` from a child to its parent is free; `lib.rs` is the root, whose
//! re-exports (`crate::Item`) count as imports of the module that defines the item.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Module name -> the other top-level modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// `text` with comments and the contents of string and char literals removed (so neither a doc
/// link `[`crate::x`]` nor a string `"crate::x"` counts as an import).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r' && (next == Some('"') || next == Some('#')) && !ident_char(c.get(i.wrapping_sub(1))) {
            // A raw string r"..." or r#"..."#.
            let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            i += 2 + hashes;
            while i < c.len()
                && !(c[i] == '"' && c[i + 1..].iter().take(hashes).filter(|&&x| x == '#').count() == hashes)
            {
                i += 1;
            }
            i += 1 + hashes;
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote after one char.
            i += if next == Some('\\') { 2 } else { 1 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
}

/// The identifier starting at `i` (after blanks), and where it ends.
fn ident_at(c: &[char], mut i: usize) -> (String, usize) {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    let start = i;
    while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
        i += 1;
    }
    (c[start..i].iter().collect(), i)
}

/// The first path segment of every entry of the use group opening at `c[open] == '{'`
/// (`{a, b::c, d::{e, f}}` gives a, b, d).
fn group_heads(c: &[char], open: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut i, mut at_entry) = (0usize, open, true);
    while i < c.len() {
        match c[i] {
            '{' => {
                depth += 1;
                at_entry = depth == 1;
                i += 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                i += 1;
            }
            ',' if depth == 1 => {
                at_entry = true;
                i += 1;
            }
            x if at_entry && depth == 1 && !x.is_whitespace() => {
                let (name, end) = ident_at(c, i);
                if !name.is_empty() {
                    heads.push(name);
                }
                at_entry = false;
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    heads
}

/// The first segment after every `crate::` in `code` (each head of a `crate::{...}` group).
fn crate_heads(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut heads = Vec::new();
    let word: Vec<char> = "crate".chars().collect();
    let mut i = 0;
    while i + word.len() < c.len() {
        if c[i..i + word.len()] == word[..] && !ident_char(i.checked_sub(1).and_then(|p| c.get(p))) {
            let mut j = i + word.len();
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            if c.get(j) == Some(&':') && c.get(j + 1) == Some(&':') {
                j += 2;
                while j < c.len() && c[j].is_whitespace() {
                    j += 1;
                }
                if c.get(j) == Some(&'{') {
                    heads.extend(group_heads(&c, j));
                } else {
                    heads.push(ident_at(&c, j).0);
                }
            }
        }
        i += 1;
    }
    heads
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// The module graph of the crate whose sources are `src`.
fn module_graph(src: &Path) -> Graph {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for p in rust_files(src) {
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if name != "lib" && name != "main" {
            files.entry(name).or_default().push(p);
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    // The root's re-exports: `pub use m::{A, B}` makes `crate::A` an import of m.
    let lib = code_only(&std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default());
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for stmt in lib.split(';') {
        let s = stmt.trim();
        let Some(path) = s.strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_start_matches("crate::").trim_start_matches("self::");
        let (m, rest) = path.split_once("::").unwrap_or((path, ""));
        if modules.contains(m.trim()) {
            let items = rest.trim().trim_start_matches('{').trim_end_matches('}');
            for item in items.split(',') {
                let item = item.split(" as ").last().unwrap().trim();
                owner.insert(item.to_string(), m.trim().to_string());
            }
        }
    }
    let mut graph = Graph::new();
    for (name, paths) in &files {
        let deps = graph.entry(name.clone()).or_default();
        for p in paths {
            let code = code_only(&std::fs::read_to_string(p).unwrap());
            for head in crate_heads(&code) {
                let target = if modules.contains(&head) {
                    Some(head)
                } else {
                    owner.get(&head).cloned()
                };
                if let Some(t) = target.filter(|t| t != name) {
                    deps.insert(t);
                }
            }
        }
    }
    graph
}

/// The cycles of `graph`: one per strongly connected component of more than one module, as
/// `a -> b -> ... -> a`, with the component's modules when the cycle does not pass all of them.
fn cycles(graph: &Graph) -> Vec<String> {
    let reach = |from: &str| -> BTreeMap<String, String> {
        // BFS parents: each reachable module -> the module it was reached from.
        let mut parent = BTreeMap::new();
        let mut queue = VecDeque::from([from.to_string()]);
        while let Some(m) = queue.pop_front() {
            for d in graph.get(&m).into_iter().flatten() {
                if !parent.contains_key(d) {
                    parent.insert(d.clone(), m.clone());
                    queue.push_back(d.clone());
                }
            }
        }
        parent
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if seen.contains(m) {
            continue;
        }
        let parent = reach(m);
        if !parent.contains_key(m) {
            continue;
        }
        // The component: the modules m reaches that reach m back.
        let component: Vec<&str> = parent
            .keys()
            .filter(|other| reach(other).contains_key(m))
            .map(String::as_str)
            .collect();
        seen.extend(component.iter().map(|c| c.to_string()));
        let mut path = vec![m.clone()];
        let mut at = parent[m].clone();
        while at != *m {
            path.push(at.clone());
            at = parent[&at].clone();
        }
        path.push(m.clone());
        path.reverse();
        let cycle = path.join(" -> ");
        out.push(if component.len() + 1 > path.len() {
            format!("{cycle} (one of the cycles through {})", component.join(", "))
        } else {
            cycle
        });
    }
    out
}

fn assert_acyclic(crate_name: &str, src: &Path) -> Graph {
    let graph = module_graph(src);
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "{crate_name}: import cycles between modules (layer them: small types and helpers below, \
         methods in the middle, the dispatcher and reports on top):\n  {}\ngraph: {graph:#?}",
        found.join("\n  ")
    );
    graph
}

#[test]
fn kamera_lab_modules_import_each_other_without_cycles() {
    let graph = assert_acyclic("kamera-lab", &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // The parser sees the real imports: the dispatcher sits on the evaluator and the methods.
    for (from, to) in [
        ("run", "evaluator"),
        ("run", "orbit"),
        ("form", "evaluator"),
        ("report", "noise"),
    ] {
        assert!(graph[from].contains(to), "{from} -> {to} not found: {graph:#?}");
    }
}

#[test]
fn kamera_eval_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kamera-eval/src");
    let graph = assert_acyclic("kamera-eval", &src);
    assert!(graph["generate"].contains("task"), "{graph:#?}");
}

#[test]
fn a_deliberate_cycle_is_found_and_named() {
    let dir = std::env::temp_dir().join(format!("kamera-lab-cycles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    let files = [
        (
            "lib.rs",
            "mod a;\nmod b;\nmod c;\nmod d;\npub use c::{Thing, Other as Renamed};\n",
        ),
        (
            "a.rs",
            "//! Doc naming [`crate::d`].\nmod sub;\nuse crate::{\n    b::X,\n    d,\n};\n",
        ),
        // A child's `super::` is its own node; its `crate::` paths are its parent's imports.
        ("a/sub.rs", "use super::X;\nfn f() { let _ = crate::d::y(); }\n"),
        (
            "b.rs",
            "// use crate::d;\nfn g<'a>(s: &'a str) -> char { let _ = \"crate::d\"; '\"' }\nfn h() { crate::Thing::new(); }\n",
        ),
        ("c.rs", "pub(crate) struct Thing;\nuse crate::a::sub as _;\n"),
        ("d.rs", "pub fn y() {}\n"),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let graph = module_graph(&src);
    let edges = |m: &str| graph[m].iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(edges("a"), ["b", "d"]);
    assert_eq!(
        edges("b"),
        ["c"],
        "comments and strings are not imports; crate::Thing is c's"
    );
    assert_eq!(edges("c"), ["a"]);
    assert!(edges("d").is_empty());
    assert_eq!(cycles(&graph), ["a -> b -> c -> a"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
