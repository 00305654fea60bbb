//! The release before the pod key (`podKey`): its binary, built from its commit once into a
//! cached target dir (`<target>/old-release/`), for the tests that run it and this release
//! interleaved on one state dir: an upgrade, a rolling one, a downgrade. Its sources come from
//! this repository's history (`git archive`), its crates from the local cargo registry cache
//! (`--offline`): a clone without that commit (a shallow one) cannot run these tests.
//! Needs `sys` and `cni` (tests/support/sys.rs, cni.rs) included by the test crate.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cni::Cni;

/// The commit whose binary wrote testdata/upgrade/state-v1: main before the pod-key merge.
pub const COMMIT: &str = "3da3744d5ed301524b8487ae4910da0240a8c17d";

/// The tools building it takes; a test skips (outside CI) or fails (in CI) without them.
pub const TOOLS: [&str; 3] = ["git", "tar", "cargo"];

/// The old release's binary, built on first use (a few minutes on two cores; cached after).
pub fn binary() -> PathBuf {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("old-release");
    let short = &COMMIT[..7];
    let (source, target) = (
        cache.join(format!("src-{short}")),
        cache.join(format!("target-{short}")),
    );
    let binary = target.join("release").join("sandbox-guard");
    std::fs::create_dir_all(&cache).unwrap();
    // One builder at a time across test binaries run at once.
    let lock = std::fs::File::create(cache.join(".lock")).unwrap();
    lock.lock().unwrap();
    if binary.exists() {
        return binary;
    }
    let repo = env!("CARGO_MANIFEST_DIR");
    let _ = std::fs::remove_dir_all(&source);
    std::fs::create_dir_all(&source).unwrap();
    let archive = Command::new("sh")
        .arg("-c")
        .arg("git -C \"$1\" archive \"$2\" | tar -x -C \"$3\"")
        .args(["sh", repo, COMMIT, source.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(
        archive.success(),
        "cannot check out the old release {COMMIT} from {repo}'s history (a shallow clone? fetch it)"
    );
    // Its speed does not matter: built for the test, not for a node.
    let built = Command::new("cargo")
        .args(["build", "--release", "--offline", "--bin", "sandbox-guard"])
        .current_dir(&source)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .status()
        .unwrap();
    assert!(built.success(), "cannot build the old release {COMMIT}");
    binary
}

/// The old release's binary for `test`, or `None` once `sys::require` has said why not
/// (SKIPPED outside CI, a failure in CI).
pub fn required(test: &str) -> Option<PathBuf> {
    crate::sys::require(test, false, &TOOLS).then(binary)
}

/// `call` run by the old release's binary instead of this one.
pub fn by_old(call: Cni, old: &Path) -> Cni {
    call.wrapped_in(&["/bin/sh", "-c", "exec \"$0\"", old.to_str().unwrap()])
}
