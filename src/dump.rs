//! `--dump-checkpoints`: every checkpoint with its ownership, for people or for tools.
//!
//! Streams: one record is read, verified and written at a time, in directory order, so a
//! node with ten thousand pods dumps in constant memory (sort the JSON, or `sort` the table,
//! for another order); the primary's result is copied through as raw bytes.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::value::RawValue;

use crate::error::{GuardError, Kind, Result};
use crate::link_facts::LinkFacts;
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
    fn admits(&self, record: &Checkpoint) -> bool {
        let same = |want: &Option<String>, have: &Option<String>| want.is_none() || want == have;
        same(&self.namespace, &record.pod_namespace)
            && same(&self.pod_name, &record.pod_name)
            && same(&self.pod_uid, &record.pod_uid)
            && self.admits_container(Some(&record.container_id))
    }

    /// An untrusted file may belong to any pod, so only a container-ID filter can rule it out.
    fn admits_container(&self, container_id: Option<&str>) -> bool {
        self.container_id.as_deref().is_none_or(|want| container_id.is_some_and(|id| id.starts_with(want)))
    }
}

/// One line of the dump; the JSON output is an array of these.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Row<'a> {
    network: Option<&'a str>,
    container_id: Option<&'a str>,
    if_name: Option<&'a str>,
    pod_namespace: Option<&'a str>,
    pod_name: Option<&'a str>,
    pod_uid: Option<&'a str>,
    infra_container_id: Option<&'a str>,
    netns: Option<&'a str>,
    generation: Option<u64>,
    /// Owns its pod key now.
    owner: bool,
    ips: Vec<String>,
    interfaces: Vec<InterfaceRow<'a>>,
    routes: Vec<RouteRow>,
    cni_version: Option<&'a str>,
    created_at: Option<&'a str>,
    updated_at: Option<&'a str>,
    set_aside: bool,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a Path>,
    prev_result: Option<&'a RawValue>,
    /// Null for records from before link facts; {"state":"unavailable",...} when ADD could not read them.
    links: Option<&'a LinkFacts>,
}

#[derive(Serialize)]
struct InterfaceRow<'a> {
    name: &'a str,
    mac: Option<&'a str>,
    sandbox: Option<&'a str>,
}

#[derive(Serialize)]
struct RouteRow {
    dst: String,
    gw: Option<std::net::IpAddr>,
}

pub fn run(state_dir: &Path, format: Format, filter: &Filter, _lock_timeout: std::time::Duration) -> Result<()> {
    if std::fs::symlink_metadata(state_dir).is_err() {
        return Err(GuardError::new(
            Kind::Io,
            format!("no state directory at {}: pass --state-dir with the plugin's stateDir", state_dir.display()),
        ));
    }
    let store = Store::open(state_dir, Access::Shared)?;
    let records = store.record_paths()?;
    let set_aside = store.list_set_aside()?;
    let mut sink: Box<dyn Sink> = match format {
        Format::Json => Box::new(JsonSink::default()),
        Format::Table => Box::new(TableSink::default()),
    };
    let mut out = BufWriter::with_capacity(64 * 1024, io::stdout().lock());
    write_rows(&store, filter, records, &set_aside, sink.as_mut(), &mut out)
        .and_then(|()| out.flush())
        // A reader that stops early (`| head`) is not an error.
        .or_else(|e| if e.kind() == io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })
        .map_err(|e| GuardError::new(Kind::Io, format!("cannot write the dump: {e}")))
}

fn write_rows(
    store: &Store,
    filter: &Filter,
    records: impl Iterator<Item = io::Result<PathBuf>>,
    set_aside: &[PathBuf],
    sink: &mut dyn Sink,
    out: &mut dyn Write,
) -> io::Result<()> {
    for path in records {
        match store.load_record_at(&path?) {
            Loaded::Valid(record) if filter.admits(&record) => {
                let view = ResultView::parse(&record.prev_result).ok();
                sink.row(out, &record_row(&record, owns_its_pod_key(store, &record), &view))?;
            }
            Loaded::Corrupt { path, reason } => {
                let row = unverified_row(&path, format!("failed verification: {reason}"), false);
                if filter.admits_container(row.container_id) {
                    sink.row(out, &row)?;
                }
            }
            _ => {}
        }
    }
    for path in set_aside {
        let row = unverified_row(path, "set aside after failing verification; delete it once resolved".into(), true);
        if filter.admits_container(row.container_id) {
            sink.row(out, &row)?;
        }
    }
    sink.finish(out, store.root())
}

fn owns_its_pod_key(store: &Store, record: &Checkpoint) -> bool {
    record.pod_key().is_some_and(|key| {
        matches!(store.load_owner(&key), Ok(Loaded::Valid(owner)) if owner.container_id == record.container_id)
    })
}

fn record_row<'a>(record: &'a Checkpoint, owner: bool, view: &'a Option<ResultView>) -> Row<'a> {
    Row {
        network: Some(&record.network),
        container_id: Some(&record.container_id),
        if_name: Some(&record.if_name),
        pod_namespace: record.pod_namespace.as_deref(),
        pod_name: record.pod_name.as_deref(),
        pod_uid: record.pod_uid.as_deref(),
        infra_container_id: record.infra_container_id.as_deref(),
        netns: Some(&record.netns),
        generation: Some(record.generation),
        owner,
        ips: view.iter().flat_map(|v| v.ips.iter().map(|ip| ip.address.to_string())).collect(),
        interfaces: view.iter().flat_map(|v| v.interfaces.iter()).map(|i| InterfaceRow {
            name: &i.name,
            mac: i.mac.as_deref(),
            sandbox: i.sandbox.as_deref(),
        }).collect(),
        routes: view.iter().flat_map(|v| v.routes.iter()).map(|r| RouteRow { dst: r.dst.to_string(), gw: r.gw }).collect(),
        cni_version: Some(&record.cni_version),
        created_at: Some(&record.created_at),
        updated_at: Some(&record.updated_at),
        set_aside: false,
        status: "ok".to_string(),
        path: None,
        prev_result: Some(&record.prev_result),
        links: record.links.as_ref(),
    }
}

/// A file that cannot be trusted: shown with what its name tells, never its content.
fn unverified_row(path: &Path, status: String, set_aside: bool) -> Row<'_> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let mut parts = name.splitn(3, ':');
    let (network, container_id, if_name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(c), Some(i)) => (Some(n), Some(c), Some(i.split('~').next().unwrap_or(i))),
        _ => (None, None, None),
    };
    Row {
        network,
        container_id,
        if_name,
        pod_namespace: None,
        pod_name: None,
        pod_uid: None,
        infra_container_id: None,
        netns: None,
        generation: None,
        owner: false,
        ips: Vec::new(),
        interfaces: Vec::new(),
        routes: Vec::new(),
        cni_version: None,
        created_at: None,
        updated_at: None,
        set_aside,
        status,
        path: Some(path),
        prev_result: None,
        links: None,
    }
}

trait Sink {
    fn row(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()>;
    fn finish(&mut self, out: &mut dyn Write, root: &Path) -> io::Result<()>;
}

/// A JSON array, one row per line.
#[derive(Default)]
struct JsonSink {
    rows: usize,
}

impl Sink for JsonSink {
    fn row(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        out.write_all(if self.rows == 0 { b"[\n  " } else { b",\n  " })?;
        serde_json::to_writer(&mut *out, row)?;
        self.rows += 1;
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn Write, _root: &Path) -> io::Result<()> {
        out.write_all(if self.rows == 0 { b"[]\n" } else { b"\n]\n" })
    }
}

/// Columns of fixed width, so rows can go out as they are read; a longer cell pushes its
/// line out of alignment rather than being cut (a truncated pod name would mislead).
#[derive(Default)]
struct TableSink {
    rows: usize,
    owned: usize,
    untrusted: usize,
}

const COLUMNS: [(&str, usize); 9] =
    [("POD", 28), ("CONTAINER", 13), ("IF", 6), ("NETWORK", 16), ("IPS", 18), ("GEN", 4), ("OWNER", 5), ("AGE", 4), ("STATE", 0)];

fn write_cells(out: &mut dyn Write, cells: [&str; 9]) -> io::Result<()> {
    let mut line = String::with_capacity(128);
    for ((_, width), cell) in COLUMNS.iter().zip(cells) {
        line.push_str(&format!("{cell:<width$}  "));
    }
    writeln!(out, "{}", line.trim_end())
}

impl Sink for TableSink {
    fn row(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        if self.rows == 0 {
            write_cells(out, COLUMNS.map(|(header, _)| header))?;
        }
        self.rows += 1;
        self.owned += usize::from(row.owner);
        let pod = match (row.pod_namespace, row.pod_name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.to_string(),
            _ => "-".to_string(),
        };
        let container: String = row.container_id.unwrap_or("-").chars().take(13).collect();
        let ips = if row.ips.is_empty() { "-".to_string() } else { row.ips.join(",") };
        let generation = row.generation.map_or("-".to_string(), |g| g.to_string());
        let age = row
            .created_at
            .and_then(crate::clock::parse_rfc3339)
            .map_or("-".to_string(), |t| crate::clock::age(t, crate::clock::unix_seconds()));
        let state = match (row.status.as_str(), row.set_aside) {
            ("ok", _) => "ok",
            (_, true) => "SET ASIDE",
            _ => "CORRUPT",
        };
        self.untrusted += usize::from(state != "ok");
        let owner = if row.owner { "*" } else { "" };
        write_cells(out, [&pod, &container, row.if_name.unwrap_or("-"), row.network.unwrap_or("-"), &ips, &generation, owner, &age, state])
    }

    fn finish(&mut self, out: &mut dyn Write, root: &Path) -> io::Result<()> {
        if self.rows == 0 {
            write_cells(out, COLUMNS.map(|(header, _)| header))?;
        }
        writeln!(out, "\n{} checkpoints, {} owning their pod name (*), {} not trusted", self.rows, self.owned, self.untrusted)?;
        if self.untrusted > 0 {
            writeln!(
                out,
                "Untrusted checkpoints are kept in {}/set-aside; a DEL that needs one is refused until you delete it.",
                root.display()
            )?;
        }
        Ok(())
    }
}
