//! Shared plumbing for the tests that touch the kernel or a runtime: privilege checks,
//! unique names, throwaway network namespaces and command helpers. Every resource made
//! here is released by `Drop`, so a failing assertion still cleans up.
#![allow(dead_code, unused_macros)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Write;
use std::ops::RangeInclusive;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

#[path = "packages.rs"]
mod packages;

/// True when the test may go on. Outside CI a missing privilege or tool skips the test
/// loudly; under `CI=true` it fails, because a quiet skip there would hide a broken setup.
pub fn require(test: &str, root: bool, tools: &[&str]) -> bool {
    for tool in tools {
        assert!(
            packages::provider(tool).is_some(),
            "{test} asks for `{tool}`, which has no row in tests/support/packages.rs: add the \
             package that provides it there and to scripts/test.sh's need_packages"
        );
    }
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
    // Straight to the process's stderr: the test harness swallows what a passing test
    // prints with eprintln!, and a skip nobody sees is a quiet one.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs {what}");
    false
}

/// The name of the enclosing function, for a test to name itself.
macro_rules! test_name {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        path.strip_suffix("::here")
            .and_then(|p| p.rsplit("::").next())
            .unwrap_or(path)
    }};
}

/// Returns from the calling test, saying why, unless it runs as root and finds `tools`
/// (see `require`).
macro_rules! skip_unless_root {
    ($tools:expr) => {
        if !crate::sys::require(crate::sys::test_name!(), true, $tools) {
            return;
        }
    };
}

/// Returns from the calling test, saying why, unless it finds `tools` (see `require`).
macro_rules! skip_unless_tools {
    ($tools:expr) => {
        if !crate::sys::require(crate::sys::test_name!(), false, $tools) {
            return;
        }
    };
}

#[allow(unused_imports)]
pub(crate) use {skip_unless_root, skip_unless_tools, test_name};

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
    format!(
        "{prefix}{:05x}{:03x}",
        std::process::id() & 0xfffff,
        seq & 0xfff
    )
}

/// Runs a command and returns its output, panicking with both streams when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert_succeeded(program, args, &out);
    out
}

/// Panics with both streams unless `program args` exited 0.
pub fn assert_succeeded(program: &str, args: &[&str], out: &Output) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{program} {} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        args.join(" "),
        out.status
    );
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

/// Lower-case hex of `bytes`, as sha256sum and image digests print them.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first three octets of a /24 `first.second.x.0/24`, `second` in `seconds`, that no other
/// caller in this process took and no host route or address uses yet: two tests with the same
/// pod addresses would fight over the host routes, and a bridge gateway or macvlan pod must
/// never answer for somebody else's network. Each harness passes its own range, chosen apart
/// from the others', so suites running side by side never contend for the same /24s. The
/// search starts at a pid-seeded slot so concurrent test processes start at different places.
pub fn free_subnet(first: u8, seconds: RangeInclusive<u8>) -> [u8; 3] {
    static TAKEN: Mutex<BTreeSet<[u8; 3]>> = Mutex::new(BTreeSet::new());
    let mut taken = TAKEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let host_state = format!(
        "{}{}",
        String::from_utf8_lossy(&run("ip", &["-4", "route", "show", "table", "all"]).stdout),
        String::from_utf8_lossy(&run("ip", &["-4", "-o", "addr", "show"]).stdout)
    );
    let (low, high) = (*seconds.start() as usize, *seconds.end() as usize);
    assert!(low <= high, "empty range {seconds:?}");
    let slots = (high - low + 1) * 256;
    let seed = std::process::id() as usize;
    // 7919 is prime, so coprime with every slot count (at most 256 * 256): the walk visits
    // every slot once.
    for step in 0..slots {
        let slot = (seed + step * 7919) % slots;
        let octets = [first, (low + slot / 256) as u8, (slot % 256) as u8];
        let prefix = format!("{}.{}.{}.", octets[0], octets[1], octets[2]);
        if !taken.contains(&octets) && !host_state.contains(&prefix) {
            taken.insert(octets);
            return octets;
        }
    }
    panic!("no free {first}.{low}-{high}.x.0/24 on this host");
}

/// Mount points at or below `dir` in this process's mount namespace, deepest first (so each
/// can be unmounted before what it sits on) and unescaped (mountinfo writes space, tab,
/// newline and backslash as `\ooo`).
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let mountinfo = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mountinfo
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(|field| PathBuf::from(OsString::from_vec(unescape_mount_point(field))))
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.as_os_str().len()));
    points
}

fn unescape_mount_point(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&byte, tail)) = rest.split_first() {
        let code = tail.get(..3).and_then(|c| std::str::from_utf8(c).ok());
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(unescaped) if byte == b'\\' => {
                out.push(unescaped);
                rest = &tail[3..];
            }
            _ => {
                out.push(byte);
                rest = tail;
            }
        }
    }
    out
}

/// Whether `path`'s file system journals its metadata, as the guard decides where an ownership
/// may be a symlink (src/state/journal.rs): XFS, btrfs, tmpfs, ext4 with a running jbd2.
pub fn journals_metadata(path: &Path) -> bool {
    let out = run(
        "findmnt",
        &["-no", "FSTYPE,SOURCE", "-T", path.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields.as_slice() {
        ["xfs" | "btrfs" | "tmpfs", ..] => true,
        ["ext2" | "ext3" | "ext4", source, ..] => std::fs::canonicalize(source)
            .ok()
            .and_then(|dev| dev.file_name().map(|n| n.to_string_lossy().into_owned()))
            .is_some_and(|name| Path::new(&format!("/proc/fs/jbd2/{name}-8")).exists()),
        _ => false,
    }
}
