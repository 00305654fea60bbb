//! What an operator reads off a node: the refusal ledger (and the doctor and dump that read
//! it instead of the log), the Prometheus textfile (`metricsFile`), and the bounded log
//! (`logMaxBytes`, `logFormat: "json"`). Each through the real binary, as a runtime runs it.

#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;
#[path = "support/cni.rs"]
mod cni;
#[path = "support/prometheus.rs"]
mod prometheus;

use prometheus::prometheus_parse;
use cni::{Incident, Pod, Store, container_id, guard, mode};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use sys::TempDir;

/// The doctor's findings of one check, from a run over `store` with `extra` arguments.
fn stale_del_findings(store: &Store, extra: &[&str]) -> Vec<Value> {
    let conf = TempDir::new("sgobc");
    let state = store.state_dir.to_str().unwrap();
    let args = [&["--doctor", "--output", "json", "--conf-dir", conf.path.to_str().unwrap(), "--state-dir", state], extra].concat();
    let out = guard(&args);
    let body: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("the report is not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    body["findings"].as_array().unwrap().iter().filter(|f| f["check"] == "stale-dels").cloned().collect()
}

/// The incident's two sandboxes of one pod name, both added: `b` owns the pod.
fn two_sandboxes_of_one_pod() -> Incident {
    let incident = Incident::of("lijiaob", "etcd1-0");
    incident.store.add(&incident.a, &incident.pod_a).run().assert_ok();
    incident.store.add(&incident.b, &incident.pod_b).run().assert_ok();
    incident
}

fn finding_text(finding: &Value) -> String {
    finding.to_string()
}

#[test]
fn stale_dels_are_counted_in_the_ledger_which_the_doctor_and_dump_read() {
    let Incident { store, a, b, pod_a, pod_b } = two_sandboxes_of_one_pod();
    assert!(store.ledger_entry(&pod_a, "eth0").is_none(), "ADD writes no ledger entry");
    let before = store.snapshot();
    for _ in 0..3 {
        store.del(&a, &pod_a).run().assert_error(11);
    }
    assert_eq!(store.snapshot(), before, "a refused DEL changes nothing but its ledger entry");
    let entry = store.ledger_entry(&pod_a, "eth0").expect("the refusals are in the ledger");
    assert_eq!((entry["refused"].as_u64(), entry["audited"].as_u64(), entry["deferred"].as_u64()), (Some(3), Some(0), Some(0)), "{entry}");
    assert_eq!(entry["owner"], json!(b));
    assert_eq!(entry["staleSandboxes"], json!([a]));
    assert_eq!((entry["podNamespace"].as_str(), entry["podName"].as_str()), (Some("lijiaob"), Some("etcd1-0")));
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
    store.del(&c, &pod_c).config("staleDel", Some(json!("audit"))).run().assert_ok();
    let audited = store.ledger_entry(&pod_c, "eth0").unwrap();
    assert_eq!((audited["audited"].as_u64(), audited["owner"].as_str()), (Some(1), Some(d.as_str())), "{audited}");

    // The dump shows the counts on the row of the owner they protect.
    let owner_row = store.entry(&b, "eth0").unwrap();
    assert_eq!(owner_row["staleDels"]["refused"], 3, "{owner_row}");
    assert!(store.entry(&d, "eth0").unwrap()["staleDels"]["audited"] == 1);
    let table = String::from_utf8(cni::guard_ok(&["--dump-checkpoints", "--state-dir", store.state_dir.to_str().unwrap()]).stdout).unwrap();
    assert!(table.contains("stale DELs of this pod: 3 refused, 0 audited, 0 deferred"), "{table}");

    // The doctor counts from the ledger: the log is gone, and it says the same.
    std::fs::remove_file(&store.log_file).unwrap();
    let findings = stale_del_findings(&store, &[]);
    let warning = findings.iter().find(|f| f["severity"] == "warning").unwrap_or_else(|| panic!("{findings:?}"));
    for needed in ["3 stale DELs refused", b.as_str(), a.as_str(), "ledger"] {
        assert!(finding_text(warning).contains(needed), "the finding must name {needed}: {warning}");
    }
    let error = findings.iter().find(|f| f["severity"] == "error").unwrap_or_else(|| panic!("{findings:?}"));
    assert!(finding_text(error).contains("1 stale DELs let through in audit mode"), "{error}");

    // A read-only command writes nothing: not even the ledger's folder mtime moves.
    let mtime = std::fs::metadata(&ledger_dir).unwrap().modified().unwrap();
    let _ = stale_del_findings(&store, &[]);
    store.dump();
    assert_eq!(std::fs::metadata(&ledger_dir).unwrap().modified().unwrap(), mtime);

    // Once the owner is gone the count is history, not a warning.
    store.del(&b, &pod_b).run().assert_ok();
    store.del(&a, &pod_a).run().assert_ok();
    let findings = stale_del_findings(&store, &[]);
    assert!(findings.iter().all(|f| f["severity"] != "warning"), "{findings:?}");
    assert!(findings.iter().any(|f| finding_text(f).contains("history")), "{findings:?}");
}

/// A node upgraded from a guard without a ledger: its log (text or JSON lines, rotated or
/// not) still has the old refusals; the doctor reads them there, and never counts a refusal
/// twice once the ledger has it.
#[test]
fn the_log_is_read_for_what_came_before_the_ledger() {
    let Incident { store, a, b, pod_a, .. } = two_sandboxes_of_one_pod();
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
    let legacy_finding = findings.iter().find(|f| finding_text(f).contains("legacy/web-0")).unwrap_or_else(|| panic!("{findings:?}"));
    assert!(finding_text(legacy_finding).contains("2 stale DELs refused"), "{legacy_finding}");
    assert!(finding_text(legacy_finding).contains("before the ledger"), "{legacy_finding}");
    // The ledger's refusal (also in today's log) once, plus the one from before the upgrade.
    let current = findings.iter().find(|f| finding_text(f).contains("lijiaob/etcd1-0")).unwrap_or_else(|| panic!("{findings:?}"));
    assert!(finding_text(current).contains("2 stale DELs refused"), "{current}");
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
    let (pod_a, pod_b) = (Pod::new("lijiaob", "etcd1-0"), Pod::new("lijiaob", "etcd1-0"));
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as f64;
    with_metrics(store.add(&a, &pod_a)).run().assert_ok();
    with_metrics(store.add(&b, &pod_b)).run().assert_ok();
    with_metrics(store.del(&a, &pod_a)).run().assert_error(11);
    with_metrics(store.del(&a, &pod_a)).run().assert_error(11);

    let text = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(mode(&metrics) & 0o777, 0o644, "node_exporter may run as another user");
    assert_eq!(mode(&store.state_dir.join("counters")) & 0o777, 0o600);
    assert!(text.contains("# TYPE sandbox_guard_operations_total counter"), "{text}");
    let Some(samples) = prometheus_parse(sys::test_name!(), &text) else { return };
    let ops = "sandbox_guard_operations_total";
    assert_eq!(sample(&samples, ops, &[("verb", "ADD"), ("outcome", "added")]), Some(2.0), "{text}");
    assert_eq!(sample(&samples, ops, &[("verb", "DEL"), ("outcome", "refused")]), Some(2.0), "{text}");
    assert_eq!(sample(&samples, "sandbox_guard_checkpoints", &[]), Some(2.0), "{text}");
    assert_eq!(sample(&samples, "sandbox_guard_set_aside_files", &[]), Some(0.0), "{text}");
    assert_eq!(sample(&samples, "sandbox_guard_deferred_dels", &[]), Some(0.0), "{text}");
    let last_add = sample(&samples, "sandbox_guard_last_success_timestamp_seconds", &[("verb", "ADD")]).unwrap();
    assert!(last_add >= started, "{text}");
    assert_eq!(sample(&samples, "sandbox_guard_last_success_timestamp_seconds", &[("verb", "DEL")]), None, "no DEL succeeded yet: {text}");

    // The owner's DEL, then the old sandbox's: both pass; the count of checkpoints follows.
    with_metrics(store.del(&b, &pod_b)).run().assert_ok();
    with_metrics(store.del(&a, &pod_a)).run().assert_ok();
    let samples = prometheus_parse(sys::test_name!(), &std::fs::read_to_string(&metrics).unwrap()).unwrap();
    assert_eq!(sample(&samples, ops, &[("verb", "DEL"), ("outcome", "deleted")]), Some(2.0));
    assert_eq!(sample(&samples, ops, &[("verb", "DEL"), ("outcome", "refused")]), Some(2.0));
    assert_eq!(sample(&samples, "sandbox_guard_checkpoints", &[]), Some(0.0));
    assert!(sample(&samples, "sandbox_guard_last_success_timestamp_seconds", &[("verb", "DEL")]).is_some());
    // No temp file is left beside the textfile for the collector to trip on.
    assert_eq!(cni::files_in(&dir.path), vec![metrics.clone()]);
}

#[test]
fn a_json_log_rotates_at_its_cap_and_keeps_its_backups() {
    let store = Store::new();
    let cap = 4096u64;
    let json_log = |cni: cni::Cni| cni.config("logFormat", Some(json!("json"))).config("logMaxBytes", Some(json!(cap)));
    for _ in 0..30 {
        let (c, pod) = (container_id(), Pod::new("web", "front-0"));
        json_log(store.add(&c, &pod)).run().assert_ok();
        json_log(store.del(&c, &pod)).run().assert_ok();
    }
    let backup = |n: u32| PathBuf::from(format!("{}.{n}", store.log_file.display()));
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    assert!(size(&store.log_file) <= cap + 2048, "{}", size(&store.log_file));
    for n in [1, 2] {
        assert!(size(&backup(n)) > cap && size(&backup(n)) <= cap + 2048, "{}: {}", backup(n).display(), size(&backup(n)));
        assert_eq!(mode(&backup(n)) & 0o777, 0o600);
    }
    assert!(!backup(3).exists(), "two backups at most");
    for path in [store.log_file.clone(), backup(1), backup(2)] {
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let object: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", path.display()));
            for key in ["time", "pid", "level", "verb", "network", "container", "ifname", "pod", "outcome", "msg"] {
                assert!(object.get(key).is_some(), "{}: no {key}: {line}", path.display());
            }
        }
    }
}
