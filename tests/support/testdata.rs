//! The fixtures under testdata/ (see testdata/README.md): conflists of real primaries,
//! results of each CNI version, CNI_ARGS as runtimes send them, damaged checkpoint files.
#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;

/// `testdata/<path>`; panics when it is not there, so a renamed fixture fails loudly.
pub fn fixture_path(path: &str) -> PathBuf {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(path);
    assert!(full.exists(), "no fixture testdata/{path}");
    full
}

/// The exact bytes of `testdata/<path>`.
pub fn fixture_bytes(path: &str) -> Vec<u8> {
    let full = fixture_path(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

/// The exact text of `testdata/<path>`.
pub fn fixture(path: &str) -> String {
    String::from_utf8(fixture_bytes(path))
        .unwrap_or_else(|e| panic!("testdata/{path} is not UTF-8: {e}"))
}

pub fn fixture_json(path: &str) -> Value {
    serde_json::from_str(&fixture(path))
        .unwrap_or_else(|e| panic!("testdata/{path} is not JSON: {e}"))
}

/// The files of `testdata/<dir>` (not its subfolders) as paths relative to testdata/, sorted.
pub fn fixtures_in(dir: &str) -> Vec<String> {
    let full = fixture_path(dir);
    let mut names: Vec<String> = std::fs::read_dir(&full)
        .unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| format!("{dir}/{}", path.file_name().unwrap().to_str().unwrap()))
        .collect();
    names.sort();
    names
}

/// `CNI_ARGS` as a runtime sends them: `testdata/cni-args/<runtime>.txt` with each
/// `{key}` replaced by its value.
pub fn cni_args(runtime: &str, values: &[(&str, &str)]) -> String {
    let path = format!("cni-args/{runtime}.txt");
    let mut args = fixture(&path).trim_end().to_string();
    for (key, value) in values {
        args = args.replace(&format!("{{{key}}}"), value);
    }
    assert!(
        !args.contains('{'),
        "testdata/{path} has a placeholder no value was given for: {args}"
    );
    args
}

/// A conflist of testdata/conflists/ with sandbox-guard last; `guard` points that entry at
/// the test's own state dir and log (it gets the entry), `primary` the first plugin at the
/// test's links.
pub fn guarded_conflist(
    file: &str,
    guard: impl FnOnce(&mut Value),
    primary: impl FnOnce(&mut Value),
) -> Value {
    let mut conf = fixture_json(&format!("conflists/{file}"));
    let plugins = conf["plugins"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("{file}: no plugins"));
    let last = plugins.last_mut().unwrap();
    assert_eq!(
        last["type"], "sandbox-guard",
        "{file}: sandbox-guard must be last"
    );
    guard(last);
    primary(&mut plugins[0]);
    conf
}
