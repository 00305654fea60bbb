//! Every row of a real-node figures table in README.md and docs/ is found, verbatim, in a
//! committed run file (docs/runs/), so that each published figure traces to the run that wrote
//! it. A figures table is one whose header names what the node tests count (pods unreachable
//! or that lost their network, NotReady sandboxes, stale DELs).

use std::fs;
use std::path::{Path, PathBuf};

const COUNTED: &[&str] = &[
    "unreachable",
    "lost their network",
    "NotReady",
    "stale DELs",
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    files.sort();
    files
}

/// The data rows of `text`'s figures tables, each with its line number.
fn figures_rows(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with('|') {
            i += 1;
            continue;
        }
        let header = lines[i];
        let mut end = i;
        while end < lines.len() && lines[end].starts_with('|') {
            end += 1;
        }
        if COUNTED.iter().any(|word| header.contains(word)) {
            // The header and its separator row come first.
            rows.extend((i + 2..end).map(|n| (n + 1, lines[n])));
        }
        i = end;
    }
    rows
}

#[test]
fn every_published_real_node_row_is_in_a_committed_run_file() {
    let runs: Vec<String> = markdown_in(&repo().join("docs/runs"))
        .iter()
        .map(|path| fs::read_to_string(path).unwrap())
        .collect();
    let mut published = vec![repo().join("README.md")];
    published.extend(markdown_in(&repo().join("docs")));
    let mut unfound = Vec::new();
    let mut checked = 0;
    for path in &published {
        let text = fs::read_to_string(path).unwrap();
        for (line, row) in figures_rows(&text) {
            checked += 1;
            if !runs.iter().any(|run| run.lines().any(|l| l == row)) {
                unfound.push(format!("{}:{line}: {row}", path.display()));
            }
        }
    }
    assert!(
        checked > 0,
        "no figures table found: the check checks nothing"
    );
    assert!(
        unfound.is_empty(),
        "rows of real-node figures that no file in docs/runs/ holds (quote a committed run, \
         verbatim):\n{}",
        unfound.join("\n")
    );
}

#[test]
fn a_row_changed_by_hand_is_caught() {
    let run = "| containerd2 | chained | 1 | 0/24 |\n";
    let doc = "| runtime | mode | stale DELs at the primary | new pods unreachable |\n\
               | --- | --- | ---: | ---: |\n| containerd2 | chained | 1 | 0 of 24 |\n\n\
               | component | version |\n| --- | --- |\n| kubelet | 1.34.4 |\n";
    let rows = figures_rows(doc);
    assert_eq!(rows, vec![(3, "| containerd2 | chained | 1 | 0 of 24 |")]);
    assert!(!run.lines().any(|l| l == rows[0].1));
}
