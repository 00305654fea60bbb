//! What an operator reads off a node: the refusal ledger (and the doctor and dump that read
//! it instead of the log), the Prometheus textfile (`metricsFile`), and the bounded log
//! (`logMaxBytes`, `logFormat: "json"`). Each through the real binary, as a runtime runs it.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{Incident, Pod, Store, container_id, mode};
use prometheus::prometheus_parse;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use sys::TempDir;

/// The doctor's findings of one check, from a run over `store` with `extra` arguments.
fn stale_del_findings(store: &Store, extra: &[&str]) -> Vec<Value> {
    store
        .doctor_findings(extra)
        .into_iter()
        .filter(|f| f["check"] == "stale-dels")
        .collect()
}

/// The incident's two sandboxes of one pod name, both added: `b` owns the pod.
fn two_sandboxes_of_one_pod() -> Incident {
    let incident = Incident::of("lijiaob", "etcd1-0");
    incident
        .store
        .add(&incident.a, &incident.pod_a)
        .run()
        .assert_ok();
    incident
        .store
        .add(&incident.b, &incident.pod_b)
        .run()
        .assert_ok();
    incident
}

fn finding_text(finding: &Value) -> String {
    finding.to_string()
}

#[test]
fn stale_dels_are_counted_in_the_ledger_which_the_doctor_and_dump_read() {
    let Incident {
        store,
        a,
        b,
        pod_a,
        pod_b,
    } = two_sandboxes_of_one_pod();
    assert!(
        store.ledger_entry(&pod_a).is_none(),
        "ADD writes no ledger entry"
    );
    let before = store.snapshot();
    for _ in 0..3 {
        store.del(&a, &pod_a).run().assert_error(11);
    }
    assert_eq!(
        store.snapshot(),
        before,
        "a refused DEL changes nothing but its ledger entry"
    );
    let entry = store
        .ledger_entry(&pod_a)
        .expect("the refusals are in the ledger");
    assert_eq!(
        (
            entry["refused"].as_u64(),
            entry["audited"].as_u64(),
            entry["deferred"].as_u64()
        ),
        (Some(3), Some(0), Some(0)),
        "{entry}"
    );
    assert_eq!(entry["owner"], json!(b));
    assert_eq!(entry["staleSandboxes"], json!([a]));
    assert_eq!(
        (entry["podNamespace"].as_str(), entry["podName"].as_str()),
        (Some("lijiaob"), Some("etcd1-0"))
    );
    let ledger_dir = store.state_dir.join("ledger");
    assert_eq!(mode(&ledger_dir) & 0o777, 0o700);
    for file in cni::files_in(&ledger_dir) {
        assert_eq!(mode(&file) & 0o777, 0o600, "{}", file.display());
    }

    // Audit mode counts the DELs it lets through, on the key they were stale for.
    let (c, d) = (container_id(), container_id());
    let (pod_c, pod_d) = (Pod::new("web", "db-0"), Pod::new("web", "db-0"));
    store.add(&c, &pod_c).run().assert_ok();
    store.add(&d, &pod_d).run().assert_ok();
    store
        .del(&c, &pod_c)
        .config("staleDel", Some(json!("audit")))
        .run()
        .assert_ok();
    let audited = store.ledger_entry(&pod_c).unwrap();
    assert_eq!(
        (audited["audited"].as_u64(), audited["owner"].as_str()),
        (Some(1), Some(d.as_str())),
        "{audited}"
    );

    // The dump shows the counts on the row of the owner they protect.
    let owner_row = store.entry(&b, "eth0").unwrap();
    assert_eq!(owner_row["staleDels"]["refused"], 3, "{owner_row}");
    assert!(store.entry(&d, "eth0").unwrap()["staleDels"]["audited"] == 1);
    let table = String::from_utf8(
        cni::guard_ok(&[
            "--dump-checkpoints",
            "--state-dir",
            store.state_dir.to_str().unwrap(),
        ])
        .stdout,
    )
    .unwrap();
    assert!(
        table.contains("stale DEL calls for this pod: 3 refused, 0 audited, 0 deferred"),
        "{table}"
    );

    // The doctor counts from the ledger: the log is gone, and it says the same.
    std::fs::remove_file(&store.log_file).unwrap();
    let findings = stale_del_findings(&store, &[]);
    let warning = findings
        .iter()
        .find(|f| f["severity"] == "warning")
        .unwrap_or_else(|| panic!("{findings:?}"));
    for needed in ["3 stale DELs refused", &b[..13], &a[..13], "ledger"] {
        assert!(
            finding_text(warning).contains(needed),
            "the finding must name {needed}: {warning}"
        );
    }
    // People read IDs as crictl prints them: 13 characters, not 64.
    assert!(!finding_text(warning).contains(b.as_str()), "{warning}");
    let error = findings
        .iter()
        .find(|f| f["severity"] == "error")
        .unwrap_or_else(|| panic!("{findings:?}"));
    assert!(
        finding_text(error).contains("1 stale DEL let through in audit mode"),
        "{error}"
    );

    // A read-only command writes nothing: not even the ledger's folder mtime moves.
    let mtime = std::fs::metadata(&ledger_dir).unwrap().modified().unwrap();
    let _ = stale_del_findings(&store, &[]);
    store.dump();
    assert_eq!(
        std::fs::metadata(&ledger_dir).unwrap().modified().unwrap(),
        mtime
    );

    // Once the owner is gone the count is history, not a warning.
    store.del(&b, &pod_b).run().assert_ok();
    store.del(&a, &pod_a).run().assert_ok();
    let findings = stale_del_findings(&store, &[]);
    assert!(
        findings.iter().all(|f| f["severity"] != "warning"),
        "{findings:?}"
    );
    assert!(
        findings.iter().any(|f| finding_text(f).contains("history")),
        "{findings:?}"
    );
}

/// A node upgraded from a guard without a ledger: its log (text or JSON lines, rotated or
/// not) still has the old refusals; the doctor reads them there, and never counts a refusal
/// twice once the ledger has it.
#[test]
fn the_log_is_read_for_what_came_before_the_ledger() {
    let Incident {
        store, a, b, pod_a, ..
    } = two_sandboxes_of_one_pod();
    store.del(&a, &pod_a).run().assert_error(11);

    let (old, old_owner) = (container_id(), container_id());
    let net = cni::NETWORK;
    let legacy = format!(
        "2020-01-02T03:04:05Z sandbox-guard[42] WARN DEL network={net} container={old} ifname=eth0 pod=legacy/web-0 outcome=refused cause=stale-del owner={old_owner} stale DEL refused\n\
         {{\"time\":\"2020-01-02T03:04:09Z\",\"pid\":43,\"level\":\"WARN\",\"verb\":\"DEL\",\"network\":\"{net}\",\"container\":\"{old}\",\"ifname\":\"eth0\",\"pod\":\"legacy/web-0\",\"outcome\":\"refused\",\"cause\":\"stale-del\",\"owner\":\"{old_owner}\",\"msg\":\"stale DEL refused\"}}\n\
         2020-01-01T00:00:00Z sandbox-guard[44] WARN DEL network={net} container={a} ifname=eth0 pod=lijiaob/etcd1-0 outcome=refused cause=stale-del owner={b} before the upgrade\n"
    );
    // In the rotated backup, as a node that rotated since would have it.
    std::fs::write(format!("{}.1", store.log_file.display()), legacy).unwrap();
    let findings = stale_del_findings(&store, &["--log-file", store.log_file.to_str().unwrap()]);
    let legacy_finding = findings
        .iter()
        .find(|f| finding_text(f).contains("legacy/web-0"))
        .unwrap_or_else(|| panic!("{findings:?}"));
    assert!(
        finding_text(legacy_finding).contains("2 stale DELs refused"),
        "{legacy_finding}"
    );
    assert!(
        finding_text(legacy_finding).contains("before the ledger"),
        "{legacy_finding}"
    );
    // The ledger's refusal (also in today's log) once, plus the one from before the upgrade.
    let current = findings
        .iter()
        .find(|f| finding_text(f).contains("lijiaob/etcd1-0"))
        .unwrap_or_else(|| panic!("{findings:?}"));
    assert!(
        finding_text(current).contains("2 stale DELs refused"),
        "{current}"
    );
}

fn sample(samples: &[(String, Value, f64)], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l[*k] == *v))
        .map(|(_, _, value)| *value)
}

#[test]
fn the_metrics_file_parses_as_prometheus_text_and_counts_every_outcome() {
    let store = Store::new();
    let dir = TempDir::new("sgmet");
    let metrics = dir.path.join("sandbox-guard.prom");
    let with_metrics = |cni: cni::Cni| cni.config("metricsFile", Some(json!(metrics)));
    let (a, b) = (container_id(), container_id());
    let (pod_a, pod_b) = (
        Pod::new("lijiaob", "etcd1-0"),
        Pod::new("lijiaob", "etcd1-0"),
    );
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    with_metrics(store.add(&a, &pod_a)).run().assert_ok();
    with_metrics(store.add(&b, &pod_b)).run().assert_ok();
    with_metrics(store.del(&a, &pod_a)).run().assert_error(11);
    with_metrics(store.del(&a, &pod_a)).run().assert_error(11);

    let text = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(
        mode(&metrics) & 0o777,
        0o644,
        "node_exporter may run as another user"
    );
    assert_eq!(mode(&store.state_dir.join("counters")) & 0o777, 0o600);
    assert!(
        text.contains("# TYPE sandbox_guard_operations_total counter"),
        "{text}"
    );
    let Some(samples) = prometheus_parse(sys::test_name!(), &text) else {
        return;
    };
    let ops = "sandbox_guard_operations_total";
    assert_eq!(
        sample(&samples, ops, &[("verb", "ADD"), ("outcome", "added")]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, ops, &[("verb", "DEL"), ("outcome", "refused")]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "sandbox_guard_checkpoints", &[]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "sandbox_guard_set_aside_files", &[]),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "sandbox_guard_deferred_dels", &[]),
        Some(0.0),
        "{text}"
    );
    let last_add = sample(
        &samples,
        "sandbox_guard_last_success_timestamp_seconds",
        &[("verb", "ADD")],
    )
    .unwrap();
    assert!(last_add >= started, "{text}");
    assert_eq!(
        sample(
            &samples,
            "sandbox_guard_last_success_timestamp_seconds",
            &[("verb", "DEL")]
        ),
        None,
        "no DEL succeeded yet: {text}"
    );
    // An idle node's file is old but exact: it says as of when, for alerts to read it against.
    let written = sample(&samples, "sandbox_guard_textfile_timestamp_seconds", &[])
        .unwrap_or_else(|| panic!("no written-at time: {text}"));
    assert!(written >= last_add, "{text}");

    // The owner's DEL, then the old sandbox's: both pass; the count of checkpoints follows.
    with_metrics(store.del(&b, &pod_b)).run().assert_ok();
    with_metrics(store.del(&a, &pod_a)).run().assert_ok();
    let samples = prometheus_parse(
        sys::test_name!(),
        &std::fs::read_to_string(&metrics).unwrap(),
    )
    .unwrap();
    assert_eq!(
        sample(&samples, ops, &[("verb", "DEL"), ("outcome", "deleted")]),
        Some(2.0)
    );
    assert_eq!(
        sample(&samples, ops, &[("verb", "DEL"), ("outcome", "refused")]),
        Some(2.0)
    );
    assert_eq!(
        sample(&samples, "sandbox_guard_checkpoints", &[]),
        Some(0.0)
    );
    assert!(
        sample(
            &samples,
            "sandbox_guard_last_success_timestamp_seconds",
            &[("verb", "DEL")]
        )
        .is_some()
    );
    // No temp file is left beside the textfile for the collector to trip on.
    assert_eq!(cni::files_in(&dir.path), vec![metrics.clone()]);
}

#[test]
fn a_json_log_rotates_at_its_cap_and_keeps_its_backups() {
    let store = Store::new();
    let cap = 4096u64;
    let json_log = |cni: cni::Cni| {
        cni.config("logFormat", Some(json!("json")))
            .config("logMaxBytes", Some(json!(cap)))
    };
    for _ in 0..30 {
        let (c, pod) = (container_id(), Pod::new("web", "front-0"));
        json_log(store.add(&c, &pod)).run().assert_ok();
        json_log(store.del(&c, &pod)).run().assert_ok();
    }
    let backup = |n: u32| PathBuf::from(format!("{}.{n}", store.log_file.display()));
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    assert!(size(&store.log_file) <= cap, "{}", size(&store.log_file));
    for n in [1, 2] {
        // Full: the next line would not have fitted.
        assert!(
            size(&backup(n)) > cap - 1024 && size(&backup(n)) <= cap,
            "{}: {}",
            backup(n).display(),
            size(&backup(n))
        );
        assert_eq!(mode(&backup(n)) & 0o777, 0o600);
    }
    assert!(!backup(3).exists(), "two backups at most");
    for path in [store.log_file.clone(), backup(1), backup(2)] {
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let object: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", path.display()));
            for key in [
                "time",
                "pid",
                "level",
                "verb",
                "network",
                "container",
                "ifname",
                "pod",
                "outcome",
                "msg",
            ] {
                assert!(
                    object.get(key).is_some(),
                    "{}: no {key}: {line}",
                    path.display()
                );
            }
        }
    }
}

/// The operations_total samples of one outcome, by `reason`.
fn rejected_by_reason(samples: &[(String, Value, f64)]) -> std::collections::BTreeMap<String, f64> {
    samples
        .iter()
        .filter(|(name, labels, _)| {
            name == "sandbox_guard_operations_total" && labels["outcome"] == "rejected"
        })
        .map(|(_, labels, value)| {
            (
                format!(
                    "{}/{}",
                    labels["verb"].as_str().unwrap_or("?"),
                    labels["reason"].as_str().unwrap_or("?")
                ),
                *value,
            )
        })
        .collect()
}

/// After a bad install every ADD fails on its config: the counters and the log must say so,
/// with whatever paths can still be read from a config the plugin refuses, and the runtime
/// must get the same error as without any of this.
#[test]
fn a_rejected_config_is_counted_and_logged() {
    let store = Store::new();
    let dir = TempDir::new("sgrej");
    let metrics = dir.path.join("sandbox-guard.prom");
    let with_metrics = |cni: cni::Cni| cni.config("metricsFile", Some(json!(metrics)));
    let pod = Pod::new("web", "front-0");
    let (unspoken, bad_key, cut_short) = (container_id(), container_id(), container_id());
    with_metrics(store.add(&unspoken, &pod))
        .version("9.9.9")
        .run()
        .assert_error(1);
    with_metrics(store.add(&bad_key, &pod))
        .config("staleDel", Some(json!("maybe")))
        .run()
        .assert_error(7);
    // A conflist cut short (a half-written file): not JSON, but its paths are still there.
    let truncated = format!(
        r#"{{"cniVersion":"1.0.0","name":"{}","type":"sandbox-guard","stateDir":{},"logFile":{},"metricsFile":{},"staleDel":"#,
        cni::NETWORK,
        json!(store.state_dir),
        json!(store.log_file),
        json!(metrics)
    );
    store
        .add(&cut_short, &pod)
        .stdin(truncated.into_bytes())
        .run()
        .assert_error(6);
    // A DEL refused for its config is counted under its own verb.
    with_metrics(store.del(&bad_key, &pod))
        .config("ipConflict", Some(json!(true)))
        .run()
        .assert_error(6);

    let text = std::fs::read_to_string(&metrics)
        .unwrap_or_else(|e| panic!("no metrics file after rejected configs: {e}"));
    let Some(samples) = prometheus_parse(sys::test_name!(), &text) else {
        return;
    };
    let expected: std::collections::BTreeMap<String, f64> = [
        ("ADD/decode", 1.0),
        ("ADD/incompatible-version", 1.0),
        ("ADD/invalid-config", 1.0),
        ("DEL/decode", 1.0),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect();
    assert_eq!(rejected_by_reason(&samples), expected, "{text}");

    let lines = std::fs::read_to_string(&store.log_file).unwrap_or_default();
    let rejected: Vec<_> = lines
        .lines()
        .filter_map(|line| {
            let entry = sandbox_guard_log_entry(line)?;
            (entry["outcome"] == "rejected").then_some(entry)
        })
        .collect();
    assert_eq!(rejected.len(), 4, "{lines}");
    for (entry, (container, reason)) in rejected.iter().zip([
        (&unspoken, "incompatible-version"),
        (&bad_key, "invalid-config"),
        (&cut_short, "decode"),
        (&bad_key, "decode"),
    ]) {
        assert_eq!(entry["container"], json!(container), "{lines}");
        assert_eq!(entry["reason"], json!(reason), "{lines}");
        assert_eq!(entry["level"], json!("ERROR"), "{lines}");
    }
    // The counts stay exact when the valid config comes back.
    with_metrics(store.add(&unspoken, &pod)).run().assert_ok();
    let samples = prometheus_parse(
        sys::test_name!(),
        &std::fs::read_to_string(&metrics).unwrap(),
    )
    .unwrap();
    assert_eq!(rejected_by_reason(&samples), expected);
    assert_eq!(
        sample(
            &samples,
            "sandbox_guard_operations_total",
            &[("verb", "ADD"), ("outcome", "added")]
        ),
        Some(1.0)
    );
}

/// Whatever cannot be read or written, a rejected config gets the answer it got before:
/// garbage on stdin, a metrics path that is a directory, a relative log path.
#[test]
fn counting_a_rejected_config_never_changes_the_answer() {
    let store = Store::new();
    let dir = TempDir::new("sgrej");
    let pod = Pod::new("web", "front-0");
    let garbage = store
        .add(&container_id(), &pod)
        .stdin(b"\x00\xff{\"logFile\":\x01".to_vec())
        .run();
    garbage.assert_error(6);
    assert!(
        !store.state_dir.exists(),
        "nothing to count into: no state dir is made"
    );
    let in_the_way = dir.path.join("metrics.prom");
    std::fs::create_dir(&in_the_way).unwrap();
    let reply = store
        .add(&container_id(), &pod)
        .version("9.9.9")
        .config("metricsFile", Some(json!(in_the_way)))
        .run();
    reply.assert_error(1);
    assert!(
        reply.stdout.lines().count() == 1,
        "one error object on stdout: {}",
        reply.stdout
    );
    let relative = store
        .add(&container_id(), &pod)
        .config("logFile", Some(json!("guard.log")))
        .config("staleDel", Some(json!("x")))
        .run();
    relative.assert_error(7);
    assert!(!Path::new("guard.log").exists());
}

/// A line of the log as its fields (text or JSON), read as the doctor reads them.
fn sandbox_guard_log_entry(line: &str) -> Option<Value> {
    if line.starts_with('{') {
        return serde_json::from_str(line).ok();
    }
    let mut words = line.split(' ');
    let _time = words.next()?;
    words
        .next()
        .filter(|program| program.starts_with("sandbox-guard["))?;
    let level = words.next()?;
    let verb = words.next()?;
    let mut object = serde_json::Map::new();
    object.insert("level".into(), json!(level));
    object.insert("verb".into(), json!(verb));
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            break;
        };
        if !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
            break;
        }
        object.insert(key.into(), json!(value));
    }
    Some(Value::Object(object))
}

/// Many processes at once (a node starting a deployment's pods): every file of the log stays
/// within `logMaxBytes`, and no line is lost or torn.
#[test]
fn rotation_keeps_its_bound_under_many_parallel_writers() {
    let store = Store::new();
    let cap = 4096u64;
    let writers = 24;
    let rounds = 4;
    let mut total_lines = 0;
    for _ in 0..rounds {
        let running: Vec<_> = (0..writers)
            .map(|n| {
                let pod = Pod::new("web", &format!("front-{n}"));
                store
                    .add(&container_id(), &pod)
                    .config("logMaxBytes", Some(json!(cap)))
                    .spawn()
            })
            .collect();
        for run in running {
            run.wait().assert_ok();
            total_lines += 1;
        }
        let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        for path in [
            store.log_file.clone(),
            PathBuf::from(format!("{}.1", store.log_file.display())),
            PathBuf::from(format!("{}.2", store.log_file.display())),
        ] {
            assert!(
                size(&path) <= cap,
                "{} holds {} bytes, over logMaxBytes {cap}",
                path.display(),
                size(&path)
            );
            for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
                assert!(
                    sandbox_guard_log_entry(line).is_some(),
                    "torn line in {}: {line}",
                    path.display()
                );
            }
        }
    }
    assert!(total_lines == writers * rounds);
}

/// No value of `logMaxBytes` fails an ADD: below the floor it is raised to it, and the log
/// says so once per file.
#[test]
fn no_log_max_bytes_value_fails_an_add() {
    let store = Store::new();
    let pod = Pod::new("web", "front-0");
    for value in [
        json!(1),
        json!(100),
        json!(4095),
        json!(-1),
        json!(1.5),
        json!("10MiB"),
        json!(null),
        json!(u64::MAX),
    ] {
        store
            .add(&container_id(), &pod)
            .config("logMaxBytes", Some(value.clone()))
            .run()
            .assert_ok();
    }
    for _ in 0..40 {
        store
            .add(&container_id(), &pod)
            .config("logMaxBytes", Some(json!(100)))
            .run()
            .assert_ok();
    }
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let backup = PathBuf::from(format!("{}.1", store.log_file.display()));
    assert!(
        size(&backup) > 100 && size(&backup) <= 4096,
        "rotated at the floor: {}",
        size(&backup)
    );
    let newest = std::fs::read_to_string(&store.log_file).unwrap();
    assert!(
        newest.contains("logMaxBytes 100 is below 4096"),
        "the log says it raised the cap:\n{newest}"
    );
}

/// The ADD line's generation and netns are fields a program reads (`generation=2`), not text
/// that starts with `generation=` and so comes out escaped as `generation\x3d2`; the text
/// names another sandbox in crictl's short form.
#[test]
fn the_add_line_carries_generation_as_a_field() {
    let i = Incident::of("shop", "web-0");
    let (store, a, b) = (&i.store, &i.a, &i.b);
    store.add(a, &i.pod_a).run().assert_ok();
    store.add(b, &i.pod_b).run().assert_ok();
    let text = std::fs::read_to_string(&store.log_file).unwrap();
    let added: Vec<&str> = text
        .lines()
        .filter(|line| line.contains(" outcome=added "))
        .collect();
    assert_eq!(added.len(), 2, "{text}");
    assert!(!text.contains("\\x3d"), "{text}");
    for (line, generation) in added.iter().zip(["generation=1 ", "generation=2 "]) {
        let fields = line.split(" outcome=added ").nth(1).unwrap();
        assert!(fields.starts_with(generation), "{line}");
        assert!(fields.contains(" netns="), "{line}");
    }
    let took_over = added[1];
    assert!(
        took_over.contains(&format!("from sandbox {} ", &a[..13])),
        "{took_over}"
    );
    assert!(
        !took_over.contains(a.as_str()),
        "one short form in the text: {took_over}"
    );
}
