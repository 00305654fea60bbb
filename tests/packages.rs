//! Every tool a test asks for is installed by scripts/test.sh on a fresh machine. The tools
//! are read from the tests' own sources (the lists given to `skip_unless_root!`,
//! `skip_unless_tools!` and `require`, the `TOOLS` constants, and `Command::new` of a literal
//! name); each must have a row in tests/support/packages.rs, and each row's package must be in
//! scripts/test.sh's `need_packages` list (or its pip install, or the node's build). Where a
//! row's Debian package is installed, the package's own file list must hold the tool, so a
//! wrong row fails too.

#[path = "support/packages.rs"]
mod packages;

use packages::Provider;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(REPO).join(relative))
        .unwrap_or_else(|e| panic!("read {relative}: {e}"))
}

/// The text from `open` (just past an opening bracket) to its matching closing bracket.
fn bracketed(text: &str, open: usize) -> &str {
    let mut depth = 1;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open..open + i];
                }
            }
            _ => {}
        }
    }
    &text[open..]
}

fn string_literals(span: &str) -> impl Iterator<Item = &str> {
    span.split('"').skip(1).step_by(2)
}

/// The tools one test source asks for.
fn tools_in(source: &str) -> BTreeSet<String> {
    let mut spans = Vec::new();
    for marker in ["skip_unless_root!(", "skip_unless_tools!(", "require("] {
        for (at, _) in source.match_indices(marker) {
            spans.push(bracketed(source, at + marker.len()));
        }
    }
    // A program named by a literal; one named by a variable is a built or found path.
    for (at, _) in source.match_indices("Command::new(\"") {
        spans.push(bracketed(source, at + "Command::new(".len()));
    }
    // `const TOOLS: &[&str] = &[...]` and its kin (EXEC_TOOLS, `[&str; 3] = [...]`).
    for (at, _) in source.match_indices("TOOLS: ") {
        let rest = &source[at..];
        let Some(list) = rest
            .find('=')
            .and_then(|eq| rest[eq..].find('[').map(|b| eq + b + 1))
        else {
            continue;
        };
        spans.push(bracketed(rest, list));
    }
    spans
        .into_iter()
        .flat_map(string_literals)
        .map(str::to_string)
        .collect()
}

/// Each tool the tests ask for, with the files that ask for it.
fn tools_asked_for() -> BTreeMap<String, Vec<String>> {
    let mut tools: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for dir in ["tests", "tests/support"] {
        for entry in std::fs::read_dir(Path::new(REPO).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            // This file names the markers it looks for.
            if path.extension().is_none_or(|e| e != "rs") || name == "tests/packages.rs" {
                continue;
            }
            for tool in tools_in(&std::fs::read_to_string(&path).unwrap()) {
                tools.entry(tool).or_default().push(name.clone());
            }
        }
    }
    tools
}

/// The packages named by `need_packages` in a script (continued lines joined).
fn need_packages(script: &str) -> BTreeSet<String> {
    let joined = script.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("need_packages "))
        .flat_map(|words| words.split_whitespace().map(str::to_string))
        .collect()
}

/// Why `provider` is not provided by a fresh run of scripts/test.sh (whose text is
/// `test_sh`), or None.
fn not_provided(provider: Provider, test_sh: &str) -> Option<String> {
    match provider {
        Provider::Debian(package) => (!need_packages(test_sh).contains(package))
            .then(|| format!("Debian's {package} is not in scripts/test.sh's need_packages")),
        Provider::PyPi(package) => {
            let pinned = format!("'{package}==");
            (!(test_sh.contains("pip install") && test_sh.contains(&pinned)))
                .then(|| format!("PyPI's {package} is not pip-installed by scripts/test.sh"))
        }
        Provider::NodeBuild(script) => (!Path::new(REPO).join(script).is_file())
            .then(|| format!("{script}, which builds it, is missing")),
        Provider::RustToolchain => (!test_sh.contains("need_cargo"))
            .then(|| "scripts/test.sh does not check for cargo (need_cargo)".to_string()),
    }
}

/// Every tool the tests ask for that a fresh run of `test_sh` would not provide, with why.
fn unprovided(test_sh: &str) -> Vec<String> {
    tools_asked_for()
        .into_iter()
        .filter_map(|(tool, files)| {
            let why = match packages::provider(&tool) {
                None => "it has no row in tests/support/packages.rs".to_string(),
                Some(provider) => not_provided(provider, test_sh)?,
            };
            Some(format!(
                "`{tool}` (asked for in {}): {why}",
                files.join(", ")
            ))
        })
        .collect()
}

#[test]
fn every_tool_a_test_asks_for_is_installed_by_the_test_script() {
    let tools = tools_asked_for();
    // The scan itself must see the lists: a parser that found nothing would pass anything.
    for known in [
        "mkfs.xfs",
        "containerd",
        "/usr/lib/cni/bridge",
        "strace",
        "podman",
    ] {
        assert!(
            tools.contains_key(known),
            "the scan of tests/ missed `{known}`: {:?}",
            tools.keys()
        );
    }
    let missing = unprovided(&read("scripts/test.sh"));
    assert!(
        missing.is_empty(),
        "a fresh machine would lack what these tests need:\n{}",
        missing.join("\n")
    );
}

/// The control: the same check on a test.sh that lacks one package must name the tool.
#[test]
fn a_package_dropped_from_the_test_script_is_caught() {
    let test_sh = read("scripts/test.sh");
    for (package, tool) in [
        ("xfsprogs", "mkfs.xfs"),
        ("strace", "strace"),
        ("tcpdump", "tcpdump"),
    ] {
        let dropped: String = test_sh
            .replace("\\\n", " ")
            .lines()
            .map(|line| {
                if line.trim_start().starts_with("need_packages ") {
                    line.split_whitespace()
                        .filter(|word| *word != package)
                        .collect::<Vec<_>>()
                        .join(" ")
                } else {
                    line.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let missing = unprovided(&dropped);
        assert!(
            missing.iter().any(|m| m.starts_with(&format!("`{tool}`"))),
            "without {package} in need_packages the check did not name `{tool}`: {missing:?}"
        );
    }
}

#[test]
fn the_node_build_builds_the_containerd_a_test_asks_for() {
    for (tool, provider) in packages::PROVIDERS {
        let Provider::NodeBuild(script) = provider else {
            continue;
        };
        // .../<component>-<version>/<binary>: the version the build script pins.
        let dir = Path::new(tool).parent().unwrap().file_name().unwrap();
        let version = dir.to_str().unwrap().rsplit_once('-').unwrap().1;
        assert!(
            read(script).contains(&format!("_VERSION={version}\n")),
            "{tool}: {script} does not build version {version}"
        );
    }
}

/// True when `package`'s own file list holds `tool` (a path, with /usr merged or not, or a
/// command in a bin dir), or when the tool is the package's own name.
fn package_holds(files: &str, package: &str, tool: &str) -> bool {
    let merged = |path: &str| path.strip_prefix("/usr").unwrap_or(path).to_string();
    files.lines().any(|file| {
        if tool.starts_with('/') {
            merged(file) == merged(tool)
        } else {
            file.ends_with(&format!("/bin/{tool}")) || file.ends_with(&format!("/sbin/{tool}"))
        }
    }) || tool == package
}

#[test]
fn each_debian_row_names_the_package_that_holds_the_tool() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut wrong = Vec::new();
    for (tool, provider) in packages::PROVIDERS {
        let Provider::Debian(package) = provider else {
            continue;
        };
        let listed = Command::new("dpkg-query").args(["-L", package]).output();
        let files = match listed {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            _ if ci => panic!("{package} is not installed: scripts/test.sh must install it"),
            _ => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED the row of `{tool}`: {package} is not installed here"
                );
                continue;
            }
        };
        if !package_holds(&files, package, tool) {
            wrong.push(format!("`{tool}` is not in {package}'s file list"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
