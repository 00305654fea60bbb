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

/// Every `const NAME: &str` of the tests with its value: a literal, or the repository's own
/// path joined with one (`concat!(env!("CARGO_MANIFEST_DIR"), "...")`).
fn str_constants<'a>(sources: impl Iterator<Item = &'a str>) -> BTreeMap<String, String> {
    let mut constants = BTreeMap::new();
    for source in sources {
        for (at, _) in source.match_indices("const ") {
            let rest = &source[at + "const ".len()..];
            let Some((name, rest)) = rest.split_once(": &str = ") else {
                continue;
            };
            if !is_constant_name(name) {
                continue;
            }
            let value = &rest[..rest.find(';').unwrap_or(0)];
            let literals: Vec<&str> = string_literals(value).collect();
            let value = match literals.as_slice() {
                [literal] if value.trim_start().starts_with('"') => literal.to_string(),
                ["CARGO_MANIFEST_DIR", tail] if value.starts_with("concat!") => {
                    format!("{REPO}{tail}")
                }
                _ => continue,
            };
            constants.insert(name.to_string(), value);
        }
    }
    constants
}

/// SCREAMING_SNAKE_CASE, as a constant's name is.
fn is_constant_name(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// The constants named in a needs list (`libcni::LIBCNI_1_3`, `KUBECTL`), lists of tools
/// (`TOOLS`) aside: those are read where they are defined.
fn constants_named(span: &str) -> impl Iterator<Item = &str> {
    span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        // `module::NAME`, not `Type::VARIANT`.
        .filter(|token| {
            let mut path: Vec<&str> = token.split("::").collect();
            path.pop();
            path.iter()
                .all(|module| module.starts_with(|c: char| c.is_ascii_lowercase()))
        })
        .filter_map(|token| token.rsplit("::").next())
        .filter(|name| {
            name.len() > 1
                && name.starts_with(|c: char| c.is_ascii_uppercase())
                && is_constant_name(name)
                && !name.ends_with("TOOLS")
        })
}

/// The tools one test source asks for, its constants looked up in `constants`; one it cannot
/// look up is named as such, so that the check fails on it.
fn tools_in(source: &str, constants: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut spans = Vec::new();
    for marker in ["skip_unless_root!(", "skip_unless_tools!(", "require("] {
        for (at, _) in source.match_indices(marker) {
            spans.push(bracketed(source, at + marker.len()));
        }
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
    let mut tools: BTreeSet<String> = spans
        .iter()
        .flat_map(|span| string_literals(span))
        .map(str::to_string)
        .collect();
    for name in spans.iter().flat_map(|span| constants_named(span)) {
        let tool = constants.get(name).cloned();
        tools
            .insert(tool.unwrap_or_else(|| format!("the constant {name}, not found as a literal")));
    }
    // A program run by name: Command::new, sys::run and try_run, Netns::exec and try_exec.
    // A name in a variable is a built or found path; what starts with `-` (the guard's own
    // flag, install::run) or is a relative path (a conflist, e2e_doctor's run) is no program.
    for marker in ["Command::new(", "run(", "exec(&["] {
        for (at, _) in source.match_indices(marker) {
            let Some(rest) = source[at + marker.len()..].trim_start().strip_prefix('"') else {
                continue;
            };
            let program = &rest[..rest.find('"').unwrap_or(0)];
            let relative = program.contains('/') && !program.starts_with('/');
            if !program.is_empty() && !program.starts_with('-') && !relative {
                tools.insert(program.to_string());
            }
        }
    }
    // The reference plugins, wherever a test names one.
    for literal in string_literals(source) {
        if literal.starts_with("/usr/lib/cni/") && !literal.contains(['{', ' ']) {
            tools.insert(literal.to_string());
        }
    }
    tools
}

/// Each tool the tests ask for, with the files that ask for it.
fn tools_asked_for() -> BTreeMap<String, Vec<String>> {
    let mut sources = Vec::new();
    for dir in ["tests", "tests/support"] {
        for entry in std::fs::read_dir(Path::new(REPO).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            // This file names the markers it looks for.
            if path.extension().is_none_or(|e| e != "rs") || name == "tests/packages.rs" {
                continue;
            }
            sources.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
    let constants = str_constants(sources.iter().map(|(_, text)| text.as_str()));
    let mut tools: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, text) in &sources {
        for tool in tools_in(text, &constants) {
            tools.entry(tool).or_default().push(name.clone());
        }
    }
    // The shell model primaries say what they run in a `# Needs:` line; each must have one.
    for dir in ["tests/cri", "tests/primaries"] {
        for entry in std::fs::read_dir(Path::new(REPO).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            let text = std::fs::read_to_string(&path).unwrap();
            let needs = text
                .lines()
                .find_map(|line| line.strip_prefix("# Needs: "))
                .unwrap_or_else(|| {
                    panic!("{name} has no `# Needs:` line naming the tools it runs")
                });
            // "(and model-lib.sh's)": what it sources says the rest.
            let own = needs.split(" (").next().unwrap();
            for tool in own.split_whitespace() {
                tools
                    .entry(tool.to_string())
                    .or_default()
                    .push(name.clone());
            }
        }
    }
    tools
}

/// The packages named by `need_packages` in a script: the words after it on its line (continued
/// lines joined), also where the call is an argument (`timed "..." need_packages ...`).
fn need_packages(script: &str) -> BTreeSet<String> {
    script
        .replace("\\\n", " ")
        .lines()
        .filter(|line| calls_need_packages(line))
        .flat_map(|line| {
            line.split_whitespace()
                .skip_while(|word| *word != "need_packages")
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether a (continued-lines-joined) script line calls need_packages, a comment not.
fn calls_need_packages(line: &str) -> bool {
    !line.trim_start().starts_with('#') && line.split_whitespace().any(|w| w == "need_packages")
}

/// Why `provider` is not provided by a fresh run of scripts/test.sh (whose text is
/// `test_sh`), or None.
fn not_provided(provider: Provider, test_sh: &str) -> Option<String> {
    match provider {
        Provider::Debian(package) | Provider::DebianPython(package) => (!need_packages(test_sh)
            .contains(package))
        .then(|| format!("Debian's {package} is not in scripts/test.sh's need_packages")),
        Provider::PyPi(package) => {
            let pinned = format!("'{package}==");
            (!(test_sh.contains("pip install") && test_sh.contains(&pinned)))
                .then(|| format!("PyPI's {package} is not pip-installed by scripts/test.sh"))
        }
        Provider::NodeBuild(script) => (!test_sh.contains("scripts/node.sh build"))
            .then(|| format!("scripts/test.sh does not run the node's build ({script})")),
        Provider::InRepo(_) => None,
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
        "/usr/bin/catatonit",
        "/var/cache/sg-node/bin/kubernetes-1.37.2/kubectl",
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vendor/cni-1.3.0"),
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

/// `test_sh` with `package` taken out of its need_packages lists.
fn without_package(test_sh: &str, package: &str) -> String {
    test_sh
        .replace("\\\n", " ")
        .lines()
        .map(|line| {
            if calls_need_packages(line) {
                line.split_whitespace()
                    .filter(|word| *word != package)
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The control: the same check on a test.sh that lacks one package names that package's tools,
/// and only those.
#[test]
fn a_package_dropped_from_the_test_script_is_caught() {
    let test_sh = read("scripts/test.sh");
    assert!(
        unprovided(&test_sh).is_empty(),
        "the script itself must pass"
    );
    for (package, tool) in [
        ("xfsprogs", "mkfs.xfs"),
        ("strace", "strace"),
        ("tcpdump", "tcpdump"),
    ] {
        let dropped = without_package(&test_sh, package);
        assert_ne!(
            need_packages(&dropped),
            need_packages(&test_sh),
            "{package} was not in scripts/test.sh's need_packages to drop"
        );
        let missing = unprovided(&dropped);
        assert!(
            missing.iter().any(|m| m.starts_with(&format!("`{tool}`"))),
            "without {package} in need_packages the check did not name `{tool}`: {missing:?}"
        );
        let why = format!("Debian's {package} is not");
        assert!(
            missing.iter().all(|m| m.contains(&why)),
            "without {package} the check named other tools too: {missing:?}"
        );
    }
}

/// The control for the node's build: without it in the script, the binaries it builds are named.
#[test]
fn a_test_script_without_the_node_build_is_caught() {
    let test_sh = read("scripts/test.sh");
    let dropped = test_sh.replace("scripts/node.sh build", "scripts/node.sh");
    assert_ne!(
        dropped, test_sh,
        "scripts/test.sh does not run the node's build"
    );
    let missing = unprovided(&dropped);
    assert!(
        missing
            .iter()
            .any(|m| m.starts_with("`/var/cache/sg-node/bin/kubernetes-1.37.2/kubectl`")),
        "without the node's build the check did not name the node's kubectl: {missing:?}"
    );
}

#[test]
fn the_node_build_builds_the_versions_the_tests_ask_for() {
    for (tool, provider) in packages::PROVIDERS {
        let Provider::NodeBuild(script) = provider else {
            continue;
        };
        // .../<component>-<version>/<binary>: the version the build script pins.
        let dir = Path::new(tool).parent().unwrap().file_name().unwrap();
        let version = dir.to_str().unwrap().rsplit_once('-').unwrap().1;
        // Pinned as `NAME_VERSION=1.2.3` or `${OVERRIDE:-1.2.3}`.
        let text = read(script);
        assert!(
            text.contains(&format!("_VERSION={version}\n"))
                || text.contains(&format!(":-{version}}}\n")),
            "{tool}: {script} does not build version {version}"
        );
    }
}

/// True when a package's file list holds `tool`: a path, with /usr merged or not, or a command
/// in a bin dir.
fn package_holds(files: &str, tool: &str) -> bool {
    let merged = |path: &str| path.strip_prefix("/usr").unwrap_or(path).to_string();
    files.lines().any(|file| {
        if tool.starts_with('/') {
            merged(file) == merged(tool)
        } else {
            file.ends_with(&format!("/bin/{tool}")) || file.ends_with(&format!("/sbin/{tool}"))
        }
    })
}

#[test]
fn each_debian_row_names_the_package_that_holds_the_tool() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut wrong = Vec::new();
    for (tool, provider) in packages::PROVIDERS {
        let (Provider::Debian(package) | Provider::DebianPython(package)) = provider else {
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
        let holds = match provider {
            Provider::DebianPython(_) => files.lines().any(|f| f.contains("/dist-packages/")),
            _ => package_holds(&files, tool),
        };
        if !holds {
            wrong.push(format!("`{tool}` is not in {package}'s file list"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
