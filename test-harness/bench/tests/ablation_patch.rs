//! The ablation patch (`ablation/filter-ablation.patch`, used by `ablation/run.sh`) must keep
//! applying to the filter as it is: a patch that no longer applies would only be noticed the
//! next time someone measures. `git apply --check` against the checkout, without changing it.

use std::path::Path;
use std::process::Command;

#[test]
fn the_ablation_patch_applies_to_the_filter() {
    let bench = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = bench.join("../..");
    let patch = bench.join("ablation/filter-ablation.patch");
    assert!(patch.is_file(), "{} is missing", patch.display());
    let git = Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["rev-parse", "--is-inside-work-tree"])
        .output();
    match git {
        Ok(out) if out.status.success() => {}
        _ => {
            // A source tarball without git: nothing to check against.
            assert!(
                std::env::var_os("CI").is_none(),
                "git or the checkout is missing under CI"
            );
            eprintln!("note: not a git checkout; ablation patch not checked");
            return;
        }
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["apply", "--check"])
        .arg(&patch)
        .output()
        .unwrap_or_else(|e| panic!("git apply: {e}"));
    assert!(
        out.status.success(),
        "the ablation patch no longer applies to filter/wasm (regenerate it: apply what still \
         applies, fix the rest by hand, `git diff > {}`):\n{}",
        patch.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
