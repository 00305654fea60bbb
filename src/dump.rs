//! `--dump-checkpoints`: every checkpoint with its ownership, for people or for tools.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::{GuardError, Kind, Result};
use crate::prev_result::ResultView;
use crate::store::checkpoint::Checkpoint;
use crate::store::{Access, Loaded, Store};

#[derive(Debug, Clone, Copy)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// A prefix, as people copy the short IDs crictl prints.
    pub container_id: Option<String>,
}

impl Filter {
    fn admits(&self, namespace: Option<&str>, pod_name: Option<&str>, pod_uid: Option<&str>, container_id: &str) -> bool {
        let same = |want: &Option<String>, have: Option<&str>| want.as_deref().is_none_or(|w| Some(w) == have);
        same(&self.namespace, namespace)
            && same(&self.pod_name, pod_name)
            && same(&self.pod_uid, pod_uid)
            && self.container_id.as_deref().is_none_or(|w| container_id.starts_with(w))
    }
}

pub fn run(state_dir: &Path, format: Format, filter: &Filter) -> Result<()> {
    if std::fs::symlink_metadata(state_dir).is_err() {
        return Err(GuardError::new(
            Kind::Io,
            format!("no state directory at {}: pass --state-dir with the plugin's stateDir", state_dir.display()),
        ));
    }
    let store = Store::open(state_dir, Access::Shared)?;
    // container ID + ifname + network -> generation, for the owner flag.
    let owners: HashMap<(String, String, String), u64> = store
        .list_owners()?
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(o) => Some(((o.key.network, o.container_id, o.key.if_name), o.generation)),
            _ => None,
        })
        .collect();

    let mut rows = Vec::new();
    for (path, loaded) in store.list_records()? {
        match loaded {
            Loaded::Valid(record) => {
                if filter.admits(record.pod_namespace.as_deref(), record.pod_name.as_deref(), record.pod_uid.as_deref(), &record.container_id) {
                    let owner = owners.contains_key(&(record.network.clone(), record.container_id.clone(), record.if_name.clone()));
                    rows.push(record_row(&record, owner));
                }
            }
            Loaded::Corrupt { path, reason } => rows.push(unverified_row(&path, &format!("failed verification: {reason}"), false)),
            Loaded::Missing => drop(path),
        }
    }
    for path in store.list_set_aside()? {
        rows.push(unverified_row(&path, "set aside after failing verification; delete it once resolved", true));
    }
    // An untrusted file may belong to any pod, so only a container-ID filter can rule it out.
    rows.retain(|row| {
        row["status"] == "ok"
            || filter.container_id.as_deref().is_none_or(|want| row["containerId"].as_str().is_some_and(|id| id.starts_with(want)))
    });

    let out = io::stdout();
    let mut out = out.lock();
    let written = match format {
        Format::Json => serde_json::to_writer_pretty(&mut out, &rows).map_err(io::Error::from).and_then(|()| writeln!(out)),
        Format::Table => write_table(&mut out, &rows, store.root()),
    };
    written.or_else(|e| if e.kind() == io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })
        .map_err(|e| GuardError::new(Kind::Io, format!("cannot write the dump: {e}")))
}

fn record_row(record: &Checkpoint, owner: bool) -> Value {
    let view = ResultView::parse(&record.prev_result).ok();
    let ips: Vec<String> = view.as_ref().map(|v| v.ips.iter().map(|ip| ip.address.to_string()).collect()).unwrap_or_default();
    let interfaces: Vec<Value> = view.as_ref().map_or_else(Vec::new, |v| {
        v.interfaces.iter().map(|i| json!({"name": i.name, "mac": i.mac, "sandbox": i.sandbox})).collect()
    });
    let routes: Vec<Value> = view.as_ref().map_or_else(Vec::new, |v| {
        v.routes.iter().map(|r| json!({"dst": r.dst.to_string(), "gw": r.gw})).collect()
    });
    json!({
        "network": record.network,
        "containerId": record.container_id,
        "ifName": record.if_name,
        "podNamespace": record.pod_namespace,
        "podName": record.pod_name,
        "podUid": record.pod_uid,
        "infraContainerId": record.infra_container_id,
        "netns": record.netns,
        "generation": record.generation,
        "owner": owner,
        "ips": ips,
        "interfaces": interfaces,
        "routes": routes,
        "cniVersion": record.cni_version,
        "createdAt": record.created_at,
        "updatedAt": record.updated_at,
        "setAside": false,
        "status": "ok",
        "prevResult": serde_json::from_str::<Value>(record.prev_result.get()).unwrap_or(Value::Null),
        // Null for records from before link facts; {"state":"unavailable",...} when ADD could not read them.
        "links": record.links,
    })
}

/// A file that cannot be trusted: shown with what its name tells, never its content.
fn unverified_row(path: &PathBuf, status: &str, set_aside: bool) -> Value {
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let mut parts = name.splitn(3, ':');
    let (network, container_id, if_name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(c), Some(i)) => (Some(n), Some(c), Some(i.split('~').next().unwrap_or(i))),
        _ => (None, None, None),
    };
    json!({
        "network": network,
        "containerId": container_id,
        "ifName": if_name,
        "podNamespace": null, "podName": null, "podUid": null, "netns": null,
        "generation": null, "owner": false, "ips": [], "createdAt": null,
        "setAside": set_aside,
        "status": status,
        "path": path,
    })
}

fn write_table(out: &mut impl Write, rows: &[Value], root: &Path) -> io::Result<()> {
    let now = crate::clock::unix_seconds();
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let mut lines = vec![["POD", "CONTAINER", "IF", "NETWORK", "IPS", "GEN", "OWNER", "AGE", "STATE"].map(String::from)];
    for row in rows {
        let pod = match (row["podNamespace"].as_str(), row["podName"].as_str()) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.to_string(),
            _ => "-".to_string(),
        };
        let container: String = text(&row["containerId"]).chars().take(13).collect();
        let ips: Vec<&str> = row["ips"].as_array().map_or_else(Vec::new, |a| a.iter().filter_map(Value::as_str).collect());
        let age = row["createdAt"].as_str().and_then(crate::clock::parse_rfc3339).map_or("-".to_string(), |t| crate::clock::age(t, now));
        let state = if row["status"] == "ok" { "ok".to_string() } else if row["setAside"] == true { "SET ASIDE".to_string() } else { "CORRUPT".to_string() };
        lines.push([
            pod,
            container,
            text(&row["ifName"]),
            text(&row["network"]),
            if ips.is_empty() { "-".to_string() } else { ips.join(",") },
            row["generation"].as_u64().map_or("-".to_string(), |g| g.to_string()),
            if row["owner"] == true { "*".to_string() } else { String::new() },
            age,
            state,
        ]);
    }
    let widths: Vec<usize> = (0..9).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    for line in &lines {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    let owned = rows.iter().filter(|r| r["owner"] == true).count();
    let bad = rows.iter().filter(|r| r["status"] != "ok").count();
    writeln!(out, "\n{} checkpoints, {owned} owning their pod name (*), {bad} not trusted", rows.len())?;
    if bad > 0 {
        writeln!(
            out,
            "Untrusted checkpoints are kept in {}/set-aside; a DEL that needs one is refused until you delete it.",
            root.display()
        )?;
    }
    Ok(())
}
