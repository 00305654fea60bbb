//! Prometheus text as a scraper reads it: Debian's python3 with prometheus_client's parser.
//! Needs `crate::sys`.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;

use crate::sys;

/// Runs Debian's python3 with prometheus_client's text parser over `text`; returns the samples
/// as [name, labels, value], or None (the test is skipped, or fails under CI) without it.
pub fn prometheus_parse(test: &str, text: &str) -> Option<Vec<(String, Value, f64)>> {
    const PARSE: &str = "import json, sys\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        out = []\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in family.samples:\n\
        \x20       out.append([s.name, s.labels, s.value, family.type])\n\
        print(json.dumps(out))\n";
    let python = "/usr/bin/python3";
    let usable = Command::new(python)
        .args(["-c", "import prometheus_client.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    // The package scripts/test.sh installs; `require` fails under CI and says SKIPPED outside.
    if !usable && !sys::require(test, false, &["python3-prometheus-client"]) {
        return None;
    }
    let mut child = Command::new(python)
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client rejects the textfile: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(String, Value, f64, String)> = serde_json::from_slice(&out.stdout).unwrap();
    Some(
        samples
            .into_iter()
            .map(|(name, labels, value, _)| (name, labels, value))
            .collect(),
    )
}
