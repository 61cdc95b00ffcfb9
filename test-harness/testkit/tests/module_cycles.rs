//! No import cycles between the top-level modules of a crate (issue 42): a shared type lives in a
//! leaf module, not with its heaviest user. This test reads each checked crate's `src/` from its
//! roots (`lib.rs`, `main.rs`, `src/bin/*.rs`; each root is its own module tree), builds the
//! graph "top-level module `a` uses top-level module `b`" and fails listing every cycle (every
//! strongly connected component of more than one module), each edge of it and every `file:line`
//! that makes that edge.
//!
//! Module `a` uses `b` when code in a file of `a` (its own file or any of its submodules') names
//! `crate::b` (in a `use`, a `use crate::{b, ..}` group or any other path), a name the crate root
//! re-exports from `b` (`crate::Config` when `lib.rs` has `pub use config::Config`), or reaches
//! `b` through `super::` chains that climb to the crate root. Comments, string literals and
//! whatever follows `#[cfg(test)]` (a `mod tests { .. }`, a `mod tests;` file, a test-only `use`
//! or statement) are left out: tests may reach anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use testkit::workspace_root;

/// The crates checked, by folder under the workspace root.
const CRATES: &[&str] = &[
    "filter/core",
    "filter/snapshot",
    "filter/wasm",
    "test-harness/bench",
    "test-harness/testkit",
    "sidecar-metrics",
];

/// Cycles tolerated for now: (crate folder, the modules of the cycle). A cycle is tolerated when
/// its modules are among an entry's, so no module can join it; an entry that matches no cycle, or
/// only a smaller one, fails the test too, so the list only shrinks.
const ALLOWED: &[(&str, &[&str])] = &[];

#[test]
fn no_import_cycles_between_top_level_modules() {
    let root = workspace_root();
    let mut report = String::new();
    // For each entry of ALLOWED, the modules of the cycle it matched.
    let mut matched: Vec<Option<Vec<String>>> = vec![None; ALLOWED.len()];
    for dir in CRATES {
        for graph in crate_graphs(&root, dir) {
            for cycle in cycles(&graph) {
                let allowed = ALLOWED.iter().position(|(d, modules)| {
                    d == dir && cycle.modules.iter().all(|m| modules.contains(&m.as_str()))
                });
                match allowed {
                    Some(at) => matched[at] = Some(cycle.modules.clone()),
                    None => {
                        writeln!(
                            report,
                            "{}: {}",
                            graph.root.display(),
                            cycle.describe(&graph)
                        )
                        .unwrap();
                    }
                }
            }
        }
    }
    for ((dir, modules), matched) in ALLOWED.iter().zip(matched) {
        match matched {
            None => writeln!(
                report,
                "{dir}: the allowed cycle {} is gone: remove it from ALLOWED",
                modules.join(", ")
            ),
            Some(now) if now.len() < modules.len() => writeln!(
                report,
                "{dir}: the allowed cycle {} is now {}: shrink its entry in ALLOWED",
                modules.join(", "),
                now.join(", ")
            ),
            Some(_) => Ok(()),
        }
        .unwrap();
    }
    assert!(
        report.is_empty(),
        "import cycles between top-level modules (move the shared items into a leaf module):\n{report}"
    );
}

// ---------------------------------------------------------------------------------------------
// The module graph.

/// Where a reference is made: a file (relative to the workspace root) and a line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: PathBuf,
    line: usize,
}

/// The top-level modules of one crate root and the uses between them.
#[derive(Debug, Default)]
struct Graph {
    /// The root file, relative to the workspace root.
    root: PathBuf,
    modules: BTreeSet<String>,
    /// (user, used) → where.
    edges: BTreeMap<(String, String), Vec<Site>>,
}

/// The graphs of every root of the crate in `dir` (relative to `workspace`).
fn crate_graphs(workspace: &Path, dir: &str) -> Vec<Graph> {
    let src = workspace.join(dir).join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .filter(|p| p.is_file())
        .collect();
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = bins
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    assert!(
        !roots.is_empty(),
        "{dir}: no lib.rs, main.rs or src/bin/*.rs"
    );
    roots
        .iter()
        .map(|r| graph(r, &|p: &Path| std::fs::read_to_string(p).ok()).relative_to(workspace))
        .collect()
}

impl Graph {
    fn relative_to(mut self, base: &Path) -> Graph {
        let rel = |p: &Path| p.strip_prefix(base).unwrap_or(p).to_path_buf();
        self.root = rel(&self.root);
        for sites in self.edges.values_mut() {
            for s in sites.iter_mut() {
                s.file = rel(&s.file);
            }
        }
        self
    }
}

/// What one walk over the files of a module (or of the root) found.
#[derive(Default)]
struct Found {
    /// Top-level modules declared (only filled from the root file).
    modules: Vec<(String, PathBuf)>,
    /// Crate-level names referred to: (the top-level module the reference is in, the first path
    /// segment after `crate::`, where).
    refs: Vec<(String, String, Site)>,
    /// `use` items of the root file: (name brought in, the first segment of its path).
    root_uses: Vec<(String, String)>,
}

/// The graph of the crate whose root file is `root`; `read` gives a file's text (`None`: absent).
fn graph(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Graph {
    let mut found = Found::default();
    let text = read(root).unwrap_or_else(|| panic!("{}: cannot read", root.display()));
    let dir = root.parent().unwrap().to_path_buf();
    walk_file(root, &text, &dir, &[], read, &mut found);
    let modules: BTreeSet<String> = found.modules.iter().map(|(m, _)| m.clone()).collect();
    // Names the root re-exports, by the top-level module they come from.
    let reexports: BTreeMap<String, String> = found
        .root_uses
        .iter()
        .filter(|(_, first)| modules.contains(first))
        .map(|(name, first)| (name.clone(), first.clone()))
        .collect();
    let mut edges: BTreeMap<(String, String), Vec<Site>> = BTreeMap::new();
    for (from, first, site) in std::mem::take(&mut found.refs) {
        let to = if modules.contains(&first) {
            first
        } else if let Some(m) = reexports.get(&first) {
            m.clone()
        } else {
            continue;
        };
        if from != to {
            edges.entry((from, to)).or_default().push(site);
        }
    }
    for sites in edges.values_mut() {
        sites.sort();
        sites.dedup();
    }
    Graph {
        root: root.to_path_buf(),
        modules,
        edges,
    }
}

/// Walks one file of module `path` (empty: the crate root). `dir` is where the file's child
/// modules' files are (`x/` for `x.rs`, the file's own folder for `mod.rs` and roots).
fn walk_file(
    file: &Path,
    text: &str,
    dir: &Path,
    path: &[String],
    read: &dyn Fn(&Path) -> Option<String>,
    found: &mut Found,
) {
    let toks = lex(text);
    let at = |i: usize| toks.get(i).map(|t| &t.tok);
    let ident = |i: usize, s: &str| matches!(at(i), Some(Tok::Ident(x)) if x == s);
    let punct = |i: usize, c: char| at(i) == Some(&Tok::Punct(c));
    // Inline modules open at this file: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let line = toks[i].line;
        let site = || Site {
            file: file.to_path_buf(),
            line,
        };
        // `#![cfg(test)]` at the top of a file: the whole file is test code.
        if i == 0 && is_cfg_test(&toks, 0).is_some() && punct(1, '!') {
            return;
        }
        if let Some(after) = is_cfg_test(&toks, i) {
            i = skip_item(&toks, after);
            continue;
        }
        match &toks[i].tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth + 1) {
                    inline.pop();
                }
            }
            Tok::Ident(k) if k == "mod" => {
                if let Some(Tok::Ident(name)) = at(i + 1) {
                    let name = name.clone();
                    let mut here: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                    if punct(i + 2, ';') {
                        let mut child_dir = dir.to_path_buf();
                        for n in &here {
                            child_dir.push(n);
                        }
                        let candidates = [
                            (child_dir.join(format!("{name}.rs")), child_dir.join(&name)),
                            (child_dir.join(&name).join("mod.rs"), child_dir.join(&name)),
                        ];
                        let child = candidates
                            .iter()
                            .find_map(|(f, d)| read(f).map(|t| (f.clone(), d.clone(), t)));
                        let (child_file, grand_dir, child_text) = child.unwrap_or_else(|| {
                            panic!("{}:{line}: no file for `mod {name};`", file.display())
                        });
                        if path.is_empty() && here.is_empty() {
                            found.modules.push((name.clone(), child_file.clone()));
                        }
                        let mut child_path = path.to_vec();
                        child_path.append(&mut here);
                        child_path.push(name);
                        walk_file(
                            &child_file,
                            &child_text,
                            &grand_dir,
                            &child_path,
                            read,
                            found,
                        );
                        i += 3;
                        continue;
                    }
                    if punct(i + 2, '{') {
                        depth += 1;
                        inline.push((name, depth));
                        i += 3;
                        continue;
                    }
                }
            }
            Tok::Ident(k) if k == "use" && path.is_empty() && inline.is_empty() => {
                let (leaves, end) = use_leaves(&toks, i + 1);
                found.root_uses.extend(leaves);
                i = end;
                continue;
            }
            Tok::Ident(k)
                if k == "crate"
                    && at(i + 1) == Some(&Tok::PathSep)
                    && !punct(i.wrapping_sub(1), '$') =>
            {
                if let Some(top) = path.first() {
                    for first in first_segments(&toks, i + 2) {
                        found.refs.push((top.clone(), first, site()));
                    }
                }
            }
            Tok::Ident(k)
                if k == "super"
                    && at(i + 1) == Some(&Tok::PathSep)
                    && at(i.wrapping_sub(1)) != Some(&Tok::PathSep) =>
            {
                let mut supers = 0;
                let mut j = i;
                while ident(j, "super") && at(j + 1) == Some(&Tok::PathSep) {
                    supers += 1;
                    j += 2;
                }
                // Only a climb to the crate root leaves the top-level module.
                if !path.is_empty() && supers == path.len() + inline.len() {
                    for first in first_segments(&toks, j) {
                        found.refs.push((path[0].clone(), first, site()));
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// `#[cfg(test)]` at `i`, or `#![cfg(test)]`: the index after it.
fn is_cfg_test(toks: &[Token], i: usize) -> Option<usize> {
    let mut j = i;
    let is = |j: usize, t: Tok| toks.get(j).map(|x| &x.tok) == Some(&t);
    if !is(j, Tok::Punct('#')) {
        return None;
    }
    j += 1;
    if is(j, Tok::Punct('!')) {
        j += 1;
    }
    let want = [
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    for w in want {
        if !is(j, w) {
            return None;
        }
        j += 1;
    }
    Some(j)
}

/// Skips the item (or statement) that starts at `i` after its attributes: through the first `;`
/// outside brackets, or through the braces of its body (a `use` group's braces do not end it).
fn skip_item(toks: &[Token], mut i: usize) -> usize {
    // Further attributes.
    while toks.get(i).map(|t| &t.tok) == Some(&Tok::Punct('#')) {
        i += 1;
        if toks.get(i).map(|t| &t.tok) == Some(&Tok::Punct('[')) {
            i = skip_balanced(toks, i);
        }
    }
    let is_use = toks[i..]
        .iter()
        .take_while(|t| !matches!(t.tok, Tok::Punct(';' | '{')))
        .any(|t| t.tok == Tok::Ident("use".into()));
    while i < toks.len() {
        match toks[i].tok {
            Tok::Punct(';') => return i + 1,
            Tok::Punct('(' | '[') => i = skip_balanced(toks, i),
            Tok::Punct('{') if !is_use => return skip_balanced(toks, i),
            Tok::Punct('{') => i = skip_balanced(toks, i),
            _ => i += 1,
        }
    }
    i
}

/// From an opening bracket at `i`, the index after its match.
fn skip_balanced(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match toks[i].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The first segments of the path (or `{ .. }` group of paths) that starts at `i`.
fn first_segments(toks: &[Token], i: usize) -> Vec<String> {
    match toks.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => vec![s.clone()],
        Some(Tok::Punct('{')) => {
            let mut out = Vec::new();
            let mut depth = 0usize;
            let mut expect = true;
            for t in &toks[i..] {
                match &t.tok {
                    Tok::Punct('{') => {
                        depth += 1;
                        expect = depth == 1;
                        continue;
                    }
                    Tok::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Punct(',') if depth == 1 => {
                        expect = true;
                        continue;
                    }
                    Tok::Ident(s) if expect && depth == 1 && s != "self" => out.push(s.clone()),
                    _ => {}
                }
                expect = false;
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The names a `use` tree starting at `i` brings in, each with the first segment of its path
/// (`crate::`, `self::` and a leading `::` dropped), and the index after its `;`.
fn use_leaves(toks: &[Token], i: usize) -> (Vec<(String, String)>, usize) {
    let end = toks[i..]
        .iter()
        .position(|t| t.tok == Tok::Punct(';'))
        .map_or(toks.len(), |p| i + p);
    let mut out = Vec::new();
    use_tree(&toks[i..end], &[], &mut out);
    (out, (end + 1).min(toks.len()))
}

fn use_tree(toks: &[Token], prefix: &[String], out: &mut Vec<(String, String)>) {
    // Split at top-level commas when called for a group's content.
    let mut segs: Vec<String> = prefix.to_vec();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Ident(s) if s == "as" => {
                if let (Some(Tok::Ident(alias)), Some(first)) =
                    (toks.get(i + 1).map(|t| &t.tok), first_real(&segs))
                {
                    out.push((alias.clone(), first));
                }
                return;
            }
            Tok::Ident(s) => segs.push(s.clone()),
            Tok::PathSep => {}
            Tok::Punct('{') => {
                let close = skip_balanced(toks, i) - 1;
                let inner = &toks[i + 1..close];
                let mut start = 0;
                let mut depth = 0usize;
                for (k, t) in inner.iter().enumerate() {
                    match t.tok {
                        Tok::Punct('{') => depth += 1,
                        Tok::Punct('}') => depth -= 1,
                        Tok::Punct(',') if depth == 0 => {
                            use_tree(&inner[start..k], &segs, out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                use_tree(&inner[start..], &segs, out);
                return;
            }
            _ => {}
        }
        i += 1;
    }
    if segs.len() > prefix.len() || !prefix.is_empty() {
        let leaf = match segs.last().map(String::as_str) {
            Some("self") => segs.len().checked_sub(2).map(|k| segs[k].clone()),
            other => other.map(str::to_string),
        };
        if let (Some(leaf), Some(first)) = (leaf, first_real(&segs)) {
            out.push((leaf, first));
        }
    }
}

/// The first segment of a path after `crate`, `self` and `pub`-like noise.
fn first_real(segs: &[String]) -> Option<String> {
    segs.iter()
        .find(|s| !matches!(s.as_str(), "crate" | "self" | "pub"))
        .cloned()
}

/// Every cycle of `g`: its strongly connected components of more than one module.
fn cycles(g: &Graph) -> Vec<Cycle> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in g.edges.keys() {
        adj.entry(from).or_default().push(to);
    }
    // Tarjan's algorithm.
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        sccs: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, adj: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        for &w in adj.get(v).map(Vec::as_slice).unwrap_or(&[]) {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let l = s.low[v].min(s.low[w]);
                s.low.insert(v, l);
            } else if s.on.contains(w) {
                let l = s.low[v].min(s.index[w]);
                s.low.insert(v, l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            s.sccs.push(scc);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for m in &g.modules {
        if !s.index.contains_key(m.as_str()) {
            visit(m, &adj, &mut s);
        }
    }
    let mut out: Vec<Cycle> = s
        .sccs
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut modules: Vec<String> = c.into_iter().map(str::to_string).collect();
            modules.sort();
            Cycle { modules }
        })
        .collect();
    out.sort_by(|a, b| a.modules.cmp(&b.modules));
    out
}

struct Cycle {
    modules: Vec<String>,
}

impl Cycle {
    /// The modules, then each edge between them with every site that makes it.
    fn describe(&self, g: &Graph) -> String {
        let mut s = format!("cycle {}\n", self.modules.join(", "));
        for ((from, to), sites) in &g.edges {
            if self.modules.contains(from) && self.modules.contains(to) {
                let at: Vec<String> = sites
                    .iter()
                    .map(|x| format!("{}:{}", x.file.display(), x.line))
                    .collect();
                writeln!(s, "    {from} → {to}: {}", at.join(", ")).unwrap();
            }
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens: identifiers, `::` and single punctuation, with comments, strings and chars removed.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn lex(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let get = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && get(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && get(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && get(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && get(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1, &mut line);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime / label ('a).
            if get(i + 1) == '\\' {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if get(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let next = get(i);
            match word.as_str() {
                "r" | "br" | "cr" if next == '"' || next == '#' => {
                    let mut hashes = 0;
                    let mut j = i;
                    while get(j) == '#' {
                        hashes += 1;
                        j += 1;
                    }
                    if get(j) == '"' {
                        // A raw string: ends at `"` followed by as many `#`.
                        j += 1;
                        while j < c.len() {
                            if c[j] == '\n' {
                                line += 1;
                            }
                            if c[j] == '"' && (1..=hashes).all(|k| get(j + k) == '#') {
                                j += 1 + hashes;
                                break;
                            }
                            j += 1;
                        }
                        i = j;
                    } else if word == "r" && hashes == 1 {
                        // A raw identifier: r#type.
                        i = j;
                        let s = i;
                        while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                            i += 1;
                        }
                        out.push(Token {
                            tok: Tok::Ident(c[s..i].iter().collect()),
                            line,
                        });
                    } else {
                        out.push(Token {
                            tok: Tok::Ident(word),
                            line,
                        });
                    }
                }
                "b" | "c" if next == '"' => i = skip_string(&c, i + 1, &mut line),
                "b" if next == '\'' => {
                    i += 1;
                    if get(i + 1) == '\\' {
                        i += 2;
                    }
                    while i + 1 < c.len() && c[i + 1] != '\'' {
                        i += 1;
                    }
                    i += 2;
                }
                _ => out.push(Token {
                    tok: Tok::Ident(word),
                    line,
                }),
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch == ':' && get(i + 1) == ':' {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

/// From just after an opening `"`, the index after the closing one.
fn skip_string(c: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            '\n' => {
                *line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

// ---------------------------------------------------------------------------------------------
// The check itself, on small made-up crates.

/// The graph of a crate given as (path, text) pairs, the root first.
fn graph_of(files: &[(&str, &str)]) -> Graph {
    let map: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), t.to_string()))
        .collect();
    graph(Path::new(files[0].0), &|p: &Path| map.get(p).cloned())
}

fn edges(g: &Graph) -> Vec<String> {
    g.edges
        .iter()
        .map(|((a, b), sites)| {
            let at: Vec<String> = sites
                .iter()
                .map(|s| format!("{}:{}", s.file.display(), s.line))
                .collect();
            format!("{a}->{b} {}", at.join(","))
        })
        .collect()
}

#[test]
fn finds_each_kind_of_use_and_ignores_tests_comments_and_strings() {
    let g = graph_of(&[
        (
            "src/lib.rs",
            "pub mod a;\npub mod b;\nmod c;\nmod d;\npub use b::Thing;\npub use d::{Other as O, self};\n",
        ),
        (
            "src/a.rs",
            "use crate::b::X;\n// crate::c::Y in a comment\nconst S: &str = \"crate::c\";\n\
             #[cfg(test)]\n#[allow(dead_code)]\nmod tests { use crate::c::Z; }\n\
             #[cfg(test)]\nuse crate::c::W;\nmod inner { fn f() { super::super::d::f(); } }\n\
             fn g() -> crate::Thing { todo!() }\nfn h(_: crate::O) {}\nmod sub;\n",
        ),
        ("src/a/sub.rs", "use crate::{c::{P, Q}, b};\nuse super::sub2;\n"),
        (
            "src/b.rs",
            "pub struct X; pub struct Thing;\n#[cfg(test)]\nmod tests;\nfn f() { let _ = 'x'; let s = r#\"crate::a\"#; }\n",
        ),
        ("src/b/tests.rs", "use crate::a::Everything;\n"),
        ("src/c.rs", "pub(crate) fn f<'a>(x: &'a str) -> &'a str { x }\n"),
        ("src/d.rs", "pub struct Other;\n"),
    ]);
    assert_eq!(
        edges(&g),
        [
            "a->b src/a/sub.rs:1,src/a.rs:1,src/a.rs:10",
            "a->c src/a/sub.rs:1",
            "a->d src/a.rs:9,src/a.rs:11",
        ]
    );
    assert!(cycles(&g).is_empty());
}

#[test]
fn reports_every_cycle_with_its_edges_and_sites() {
    let g = graph_of(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\nmod e;\n"),
        ("src/a.rs", "use crate::b::X;\n"),
        ("src/b.rs", "use crate::c::X;\n"),
        ("src/c.rs", "\nuse crate::a::X;\nuse crate::d::Y;\n"),
        ("src/d.rs", "use crate::e::X;\n"),
        ("src/e/mod.rs", "mod f;\n"),
        ("src/e/f.rs", "fn f() { crate::d::g() }\n"),
    ]);
    let found = cycles(&g);
    let modules: Vec<Vec<String>> = found.iter().map(|c| c.modules.clone()).collect();
    assert_eq!(modules, [vec!["a", "b", "c"], vec!["d", "e"]]);
    let text = found[0].describe(&g);
    assert!(text.contains("c → a: src/c.rs:2"), "{text}");
    assert!(!text.contains("c → d"), "{text}");
    assert!(found[1].describe(&g).contains("e → d: src/e/f.rs:1"));
}
