//! Nothing the project builds or tests may read outside the repository: this test fails when a
//! tracked source file (`git ls-files`) refers to a path outside it — a `shared/` folder beside
//! the clone, an absolute folder of a developer's machine, or a `../` chain that climbs above the
//! repository root from where it is resolved (the crate folder for `.rs` and `.toml`, the file's
//! own folder otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use testkit::workspace_root;

/// Files checked, by extension; extension-less files are checked when they start with `#!`.
const EXTENSIONS: &[&str] = &["rs", "sh", "toml", "yaml", "yml", "json", "md"];

/// Not checked: recorded benchmark output (its reports name where the measuring run wrote its
/// chart, on that machine), and this file, which spells out the forms it looks for.
const EXEMPT: &[&str] = &[
    "test-harness/bench/results/",
    "test-harness/testkit/tests/repo_paths.rs",
];

/// Absolute folders that only exist on some developer's machine.
const MACHINE_FOLDERS: &[&str] = &["/work/", "/home/", "/Users/", "/root/"];

/// Characters that can be part of a path component.
fn path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$' | b'{' | b'}')
}

/// Whether a path may start right after `prev` (the byte before it, if any): at the start of a
/// line, after a quote, bracket, `=` or whitespace, or after a `/` that follows no path component
/// (as in `concat!(env!("CARGO_MANIFEST_DIR"), "/../x")`).
fn path_starts_after(line: &[u8], at: usize) -> bool {
    let Some(prev) = at.checked_sub(1).map(|i| line[i]) else {
        return true;
    };
    if prev == b'/' {
        return at < 2 || !path_char(line[at - 2]);
    }
    matches!(
        prev,
        b'"' | b'\'' | b'`' | b'(' | b'[' | b'<' | b'=' | b' ' | b'\t'
    )
}

/// The number of `..` components of each relative path in `line` that starts with one (only
/// paths that have a `/` next to a `..`: `Foo { .. }` or `a..b` are not paths).
fn climbs(line: &str) -> Vec<usize> {
    let b = line.as_bytes();
    let dotdot_at = |i: usize| {
        b.get(i..i + 2) == Some(b"..") && b.get(i + 2).is_none_or(|&c| c == b'/' || !path_char(c))
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !(dotdot_at(i) && path_starts_after(b, i) && (i == 0 || b[i - 1] != b'.')) {
            i += 1;
            continue;
        }
        let mut slash = i > 0 && b[i - 1] == b'/';
        let mut n = 0;
        let mut j = i;
        while dotdot_at(j) {
            n += 1;
            j += 2;
            if b.get(j) == Some(&b'/') {
                slash = true;
                j += 1;
            } else {
                break;
            }
        }
        if slash {
            found.push(n);
        }
        i = j.max(i + 1);
    }
    found
}

/// What in `text` (a file resolved from a folder `base_depth` levels below the repository root)
/// refers to a path outside the repository, as `line: reason` strings.
fn outside_references(text: &str, base_depth: usize) -> Vec<String> {
    let mut found = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let no = no + 1;
        for folder in MACHINE_FOLDERS {
            if line.contains(folder) {
                found.push(format!("{no}: absolute path under `{folder}`"));
            }
        }
        for (at, _) in line.match_indices("shared/") {
            let before = &line[..at];
            let starts = path_starts_after(line.as_bytes(), at) && !before.ends_with('/');
            if starts || before.ends_with("../") {
                found.push(format!("{no}: a `shared/` folder (not in the repository)"));
            }
        }
        for n in climbs(line) {
            if n > base_depth {
                found.push(format!(
                    "{no}: `../` × {n} climbs above the repository root (resolved {base_depth} \
                     level(s) below it)"
                ));
            }
        }
    }
    found
}

fn tracked_files(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .unwrap_or_else(|e| panic!("git is needed to list the repository's files: {e}"));
    assert!(
        out.status.success(),
        "`git ls-files` failed in {}: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8 file names")
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

fn depth(dir: &str) -> usize {
    Path::new(dir).components().count()
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

#[test]
fn no_tracked_source_file_refers_to_a_path_outside_the_repository() {
    let root = workspace_root();
    let files = tracked_files(&root);
    assert!(
        files.iter().any(|f| f == "build.sh"),
        "`git ls-files` in {} did not list build.sh",
        root.display()
    );
    let crates: BTreeSet<&str> = files
        .iter()
        .filter(|f| *f == "Cargo.toml" || f.ends_with("/Cargo.toml"))
        .map(|f| parent(f))
        .collect();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        if EXEMPT.iter().any(|e| file.starts_with(e)) {
            continue;
        }
        let name = file.rsplit('/').next().unwrap_or(file);
        let ext = name.rsplit_once('.').map(|(_, e)| e);
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue; // not UTF-8 text (images)
        };
        let wanted = match ext {
            Some(e) => EXTENSIONS.contains(&e),
            None => text.starts_with("#!"),
        };
        if !wanted {
            continue;
        }
        // Rust paths (`env!("CARGO_MANIFEST_DIR")`) and Cargo's are relative to the crate.
        let base = if matches!(ext, Some("rs" | "toml")) {
            let mut dir = parent(file);
            while !dir.is_empty() && !crates.contains(dir) {
                dir = parent(dir);
            }
            dir
        } else {
            parent(file)
        };
        checked += 1;
        for p in outside_references(&text, depth(base)) {
            problems.push(format!("{file}:{p}"));
        }
    }
    assert!(checked > 50, "only {checked} files checked");
    assert!(
        problems.is_empty(),
        "tracked files refer to paths outside the repository (keep test data under \
         test-harness/fixtures/):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_finds_each_kind_of_outside_reference() {
    // Inside the repository: a crate two levels down reaching the fixtures, Rust ranges and
    // patterns, prose with ellipses, a link one level up from a nested folder.
    for ok in [
        r#"concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/bodies")"#,
        "let part = &b[last..]; let Foo { .. } = foo; for i in 0..=n {}",
        "wait... and `../sse/x.sse`, see [here](../README.md)",
        r#"cd "$(dirname "${BASH_SOURCE[0]}")/..""#,
        "src/shared/mod.rs and shared-data/ and shared prefixes",
    ] {
        assert_eq!(outside_references(ok, 2), Vec::<String>::new(), "{ok}");
    }
    // Outside: the forms the project's tests used before their data moved into the repository.
    for bad in [
        r#"concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures/metrics/")"#,
        r#"root.join("../shared/fixtures/bodies")"#,
        r#"here.parent().map(|p| p.join("shared/fixtures/metrics"))"#,
        r#"PathBuf::from("/work/shared/fixtures/bodies")"#,
        "see `../../../x`",
        r#"Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")"#,
    ] {
        assert!(!outside_references(bad, 2).is_empty(), "not caught: {bad}");
    }
    assert_eq!(climbs("a ../../.. b"), vec![3]);
    assert_eq!(climbs(r#""/../x""#), vec![1]);
}
