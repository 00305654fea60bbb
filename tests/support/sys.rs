//! Shared plumbing for the tests that touch the kernel or a runtime: privilege checks,
//! unique names, throwaway network namespaces and command helpers. Every resource made
//! here is released by `Drop`, so a failing assertion still cleans up.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// True when the test may go on. Outside CI a missing privilege or tool skips the test
/// loudly; under `CI=true` it fails, because a quiet skip there would hide a broken setup.
pub fn require(test: &str, root: bool, tools: &[&str]) -> bool {
    let mut missing = Vec::new();
    if root && !nix_is_root() {
        missing.push("root privileges".to_string());
    }
    for tool in tools {
        if !tool_exists(tool) {
            missing.push(format!("`{tool}` (see scripts/test.sh for the package)"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(", ");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs {what}; CI must provide it (scripts/test.sh installs the packages)");
    }
    eprintln!("SKIPPED {test}: needs {what}");
    false
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

pub fn tool_exists(tool: &str) -> bool {
    if tool.contains('/') {
        return Path::new(tool).exists();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

/// A name unique to this process and call, short enough for an interface name (<= 15 bytes)
/// when `prefix` is at most 5 bytes.
pub fn unique(prefix: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:05x}{:03x}", std::process::id() & 0xfffff, seq & 0xfff)
}

/// Runs a command and returns its output, panicking with both streams when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {} failed: {}\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command and reports only whether it succeeded (for cleanup and probes).
pub fn try_run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(prefix: &str) -> Netns {
        let name = unique(prefix);
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    /// Runs a command inside the namespace, panicking when it fails.
    pub fn exec(&self, cmd: &[&str]) -> Output {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(cmd);
        run("ip", &args)
    }

    /// Runs a command inside the namespace and reports whether it succeeded.
    pub fn try_exec(&self, cmd: &[&str]) -> bool {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(cmd);
        try_run("ip", &args)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        try_run("ip", &["netns", "delete", &self.name]);
    }
}

/// A host link deleted on drop (deleting one end of a veth removes both).
pub struct HostLink {
    pub name: String,
}

impl Drop for HostLink {
    fn drop(&mut self) {
        try_run("ip", &["link", "delete", &self.name]);
    }
}

/// A temporary directory removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
