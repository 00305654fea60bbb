//! `--dump-checkpoints`: every checkpoint with its ownership, for people or for tools.
//!
//! Records are read and verified a batch at a time under the shared lock and rendered; the
//! rendered rows are sorted as kubectl sorts pods (namespace, then name) and written after the
//! lock is let go, so a reader that stops reading (`| less` left open) holds up no ADD or
//! DEL. The primary's result is copied through as raw bytes. It creates, chmods and locks
//! nothing it reads.

use std::io::{self, Write};
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::cni::result::ResultView;
use crate::error::{GuardError, Kind, Result};
use crate::kernel::link_facts::LinkFacts;
use crate::state::checkpoint::{Checkpoint, split_file_name};
use crate::state::deferred::DeferredDel;
use crate::state::ledger::LedgerEntry;
use crate::state::lock::WaitNotice;
use crate::state::ownership::Ownership;
use crate::state::ownership::PodKey;
use crate::state::{Folder, Loaded, READ_BATCH, Store, read_entry_for_listing};

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
        self.admits_fields(
            record.pod_namespace.as_deref(),
            record.pod_name.as_deref(),
            record.pod_uid.as_deref(),
            Some(&record.container_id),
        )
    }

    fn admits_fields(
        &self,
        namespace: Option<&str>,
        name: Option<&str>,
        uid: Option<&str>,
        container_id: Option<&str>,
    ) -> bool {
        let same = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|want| Some(want) == have)
        };
        same(&self.namespace, namespace)
            && same(&self.pod_name, name)
            && same(&self.pod_uid, uid)
            && self.admits_container(container_id)
    }

    /// An untrusted file may belong to any pod, so only a container-ID filter can rule it out.
    fn admits_container(&self, container_id: Option<&str>) -> bool {
        self.container_id
            .as_deref()
            .is_none_or(|want| container_id.is_some_and(|id| id.starts_with(want)))
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
    /// The sandbox that owns the pod key instead, when another one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    superseded_by: Option<String>,
    ips: Vec<String>,
    interfaces: Vec<InterfaceRow<'a>>,
    routes: Vec<RouteRow>,
    cni_version: Option<&'a str>,
    created_at: Option<&'a str>,
    updated_at: Option<&'a str>,
    set_aside: bool,
    status: Status,
    /// Why a row is not `ok`, and where its file is.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a Path>,
    prev_result: Option<&'a RawValue>,
    /// Null for records from before link facts; {"state":"unavailable",...} when ADD could not read them.
    links: Option<&'a LinkFacts>,
    /// A deferred DEL's: since when, the owner it was kept from, its failed replays.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    deferred: Option<DeferredFields<'a>>,
    /// The owner's row: the stale DELs of its pod key the refusal ledger counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    stale_dels: Option<StaleDels<'a>>,
}

/// A ledger entry as the dump shows it: every key holding a container ID says so in its
/// name, as `owner` on a row is a boolean.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StaleDels<'a> {
    refused: u64,
    audited: u64,
    deferred: u64,
    first_at: &'a str,
    last_at: &'a str,
    owner_container_id: &'a str,
    owner_generation: u64,
    stale_sandboxes: &'a [String],
    more_sandboxes: u64,
}

impl<'a> StaleDels<'a> {
    fn of(entry: &'a LedgerEntry) -> StaleDels<'a> {
        StaleDels {
            refused: entry.refused,
            audited: entry.audited,
            deferred: entry.deferred,
            first_at: &entry.first_at,
            last_at: &entry.last_at,
            owner_container_id: &entry.owner,
            owner_generation: entry.owner_generation,
            stale_sandboxes: &entry.stale_sandboxes,
            more_sandboxes: entry.more_sandboxes,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeferredFields<'a> {
    deferred_at: &'a str,
    deferred_for_owner: &'a str,
    attempts: u32,
    last_error: Option<&'a str>,
    last_attempt_at: Option<&'a str>,
    /// The last replay ran out of `replayTimeoutSeconds` (a slow or hung primary).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    hung: bool,
}

#[derive(Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Status {
    Ok,
    /// Another sandbox owns the pod key: this one's DEL is stale, and `--restore` leaves it.
    Superseded,
    /// In records/, failing its checksum: the next ADD, DEL or GC sets it aside.
    Corrupt,
    /// In set-aside/ under its own name: refuses the DELs that need it.
    SetAside,
    /// In set-aside/ with a `~time` suffix: kept for inspection, blocks nothing.
    Kept,
    /// An ownership whose record is gone: the next DEL or GC of the pod key drops it.
    OwnerWithoutRecord,
    /// Delegate mode: a stale DEL kept from the primary until its pod key is free.
    Deferred,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Superseded => "superseded",
            Status::Corrupt => "CORRUPT",
            Status::SetAside => "SET ASIDE",
            Status::Kept => "kept",
            Status::OwnerWithoutRecord => "NO RECORD",
            Status::Deferred => "deferred",
        }
    }
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

pub fn run(
    state_dir: &Path,
    format: Format,
    filter: &Filter,
    lock_timeout: Duration,
) -> Result<()> {
    let mut sink: Box<dyn Sink> = match format {
        Format::Json => Box::new(JsonSink),
        Format::Table => Box::new(TableSink::default()),
    };
    // The plugin makes its state dir at the first ADD: a node without a pod yet has none,
    // which is an empty dump, not an error.
    let written = if std::fs::symlink_metadata(state_dir).is_err() {
        eprintln!(
            "sandbox-guard: no state directory at {} yet: no pod was added with it as stateDir (--state-dir names another)",
            state_dir.display()
        );
        let mut out = io::stdout().lock();
        sink.finish(&mut out, state_dir, &[])
            .map_err(DumpError::Write)
    } else {
        let store = Store::open_read_only(state_dir)?;
        write_all(&store, filter, sink.as_mut(), lock_timeout)
    };
    written
        // A reader that stops early (`| head`) is not an error.
        .or_else(|e| match e {
            DumpError::Write(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            DumpError::Write(e) => Err(GuardError::new(
                Kind::Io,
                format!("cannot write the dump: {e}"),
            )),
            DumpError::Store(e) => Err(e),
        })
}

enum DumpError {
    Store(GuardError),
    Write(io::Error),
}

impl From<GuardError> for DumpError {
    fn from(e: GuardError) -> DumpError {
        DumpError::Store(e)
    }
}

impl From<io::Error> for DumpError {
    fn from(e: io::Error) -> DumpError {
        DumpError::Write(e)
    }
}

/// Renders the rows under the lock, a batch at a time; sorts and writes them with the lock
/// let go.
fn write_all(
    store: &Store,
    filter: &Filter,
    sink: &mut dyn Sink,
    lock_timeout: Duration,
) -> std::result::Result<(), DumpError> {
    let notice = WaitNotice::new(store.root(), lock_timeout);
    let on_wait = |holder: &str| notice.hear(holder);
    let mut paths = store.record_paths()?;
    let mut rows = Rendered::default();
    // Records that own their pod key: when every owner file is one of them, no owner is
    // without its record, and the owners need not be read one by one.
    let mut owning = 0;
    // Small and bounded (`state::ledger`): read once, shown on the owners' rows.
    let ledger: std::collections::HashMap<PodKey, LedgerEntry> = {
        let _lock = store.read_lock(lock_timeout, &on_wait)?;
        store
            .list_ledger()?
            .into_iter()
            .map(|entry| (entry.key.clone(), entry))
            .collect()
    };
    loop {
        let mut read = 0;
        let _lock = store.read_lock(lock_timeout, &on_wait)?;
        for path in paths.by_ref() {
            owning += usize::from(record_rows(
                store, filter, &ledger, &path?, sink, &mut rows,
            )?);
            read += 1;
            if read == READ_BATCH {
                break;
            }
        }
        if read == 0 {
            break;
        }
    }
    // Then what no record stands for: set-aside files (by name) and owners without a record.
    for path in store.list_set_aside()? {
        let status = if crate::state::set_aside_blocks(&path) {
            (
                Status::SetAside,
                "failed verification; it refuses the DELs that need it until you delete it",
            )
        } else {
            (
                Status::Kept,
                "damaged and kept for inspection; it blocks nothing",
            )
        };
        let row = unverified_row(&path, status.0, status.1.to_string());
        if filter.admits_container(row.container_id) {
            push_row(sink, &mut rows, &row)?;
        }
    }
    let orphans = if store.count(Folder::Owners)? > owning {
        store.read_in_batches(Folder::Owners, lock_timeout, &on_wait, |path| {
            match read_entry_for_listing::<Ownership>(path) {
                Loaded::Valid(owner) if !store.owner_is_backed(&owner) => Some(owner),
                _ => None,
            }
        })?
    } else {
        Vec::new()
    };
    for (_, owner) in &orphans {
        let row = orphan_row(owner);
        if filter.admits_fields(
            row.pod_namespace,
            row.pod_name,
            row.pod_uid,
            row.container_id,
        ) {
            push_row(sink, &mut rows, &row)?;
        }
    }
    let deferred = {
        let _lock = store.read_lock(lock_timeout, &on_wait)?;
        store.list_deferred()?
    };
    for (path, loaded) in &deferred {
        let row = match loaded {
            Loaded::Valid(entry) => deferred_row(entry),
            _ => unverified_row(path, Status::Corrupt, "a deferred DEL that failed verification: GC leaves it; delete it once its sandbox is gone from the primary".to_string()),
        };
        if filter.admits_fields(
            row.pod_namespace,
            row.pod_name,
            row.pod_uid,
            row.container_id,
        ) {
            push_row(sink, &mut rows, &row)?;
        }
    }
    rows.at.sort_by(|a, b| RowAt::order(&rows.keys, a, b));
    let sorted: Vec<&[u8]> = rows
        .at
        .iter()
        .map(|at| &rows.bytes[at.row.clone()])
        .collect();
    let mut out = io::stdout().lock();
    sink.finish(&mut out, store.root(), &sorted)?;
    out.flush()?;
    Ok(())
}

/// The rendered rows back to back in one buffer, and their sort keys in another: a buffer of
/// its own per row or per key would round every one up to its allocation's size and about
/// double the memory a large store's dump takes.
#[derive(Default)]
struct Rendered {
    bytes: Vec<u8>,
    keys: Vec<u8>,
    at: Vec<RowAt>,
}

/// Where one rendered row is and where it sorts: kubectl's order (namespace, then name), then
/// the sandbox and the interface; rows that name no pod go last.
struct RowAt {
    no_pod: bool,
    /// The namespace, the pod's name, the container ID and the interface, in `keys`.
    key: [Range<usize>; 4],
    row: Range<usize>,
}

impl RowAt {
    /// Compares two rows by their keys, which lie in `keys`.
    fn order(keys: &[u8], a: &RowAt, b: &RowAt) -> std::cmp::Ordering {
        let fields = |at: &RowAt| at.key.clone().into_iter().map(|range| &keys[range]);
        a.no_pod
            .cmp(&b.no_pod)
            .then_with(|| fields(a).cmp(fields(b)))
    }
}

fn push_row(sink: &mut dyn Sink, rows: &mut Rendered, row: &Row) -> io::Result<()> {
    let start = rows.bytes.len();
    sink.row(&mut rows.bytes, row)?;
    let mut key = |value: Option<&str>| {
        let at = rows.keys.len();
        rows.keys
            .extend_from_slice(value.unwrap_or_default().as_bytes());
        at..rows.keys.len()
    };
    let key = [
        key(row.pod_namespace),
        key(row.pod_name),
        key(row.container_id),
        key(row.if_name),
    ];
    rows.at.push(RowAt {
        no_pod: row.pod_name.is_none(),
        key,
        row: start..rows.bytes.len(),
    });
    Ok(())
}

/// Writes the row of the record at `path` if the filter admits it; returns whether the
/// record owns its pod key, filtered or not.
fn record_rows(
    store: &Store,
    filter: &Filter,
    ledger: &std::collections::HashMap<PodKey, LedgerEntry>,
    path: &Path,
    sink: &mut dyn Sink,
    rows: &mut Rendered,
) -> io::Result<bool> {
    match store.load_record_at(path) {
        Loaded::Valid(record) => {
            let (owner, superseded_by) = owner_of(store, &record);
            if filter.admits(&record) {
                let view = ResultView::parse(&record.prev_result).ok();
                let mut row = record_row(&record, owner.is_some(), &view);
                row.stale_dels = owner
                    .as_ref()
                    .and_then(|owner| ledger.get(&owner.key))
                    .map(StaleDels::of);
                if let Some(other) = superseded_by {
                    row.status = Status::Superseded;
                    row.reason = Some(format!(
                        "pod {} belongs to sandbox {} now: this sandbox's DEL is stale (chained: refused until {} is gone; delegate: deferred)",
                        crate::names::pod_text(row.pod_namespace, row.pod_name),
                        crate::names::short_id(&other),
                        crate::names::short_id(&other),
                    ));
                    row.superseded_by = Some(other);
                }
                push_row(sink, rows, &row)?;
            }
            // Each owner file once, by its first interface.
            Ok(owner
                .is_some_and(|owner| owner.interfaces().first() == Some(&record.if_name.as_str())))
        }
        Loaded::Corrupt { path, reason } => {
            let row = unverified_row(
                &path,
                Status::Corrupt,
                format!("failed verification: {reason}"),
            );
            if filter.admits_container(row.container_id) {
                push_row(sink, rows, &row)?;
            }
            Ok(false)
        }
        Loaded::Missing => Ok(false),
    }
}

/// The ownership of the record's pod that stands on this very attachment, under whichever
/// `podKey` rule its network follows (the dump reads no config); else the container that
/// owns the pod instead, as `--restore` finds it.
fn owner_of(store: &Store, record: &Checkpoint) -> (Option<Ownership>, Option<String>) {
    let owners: Vec<Ownership> = record
        .pod_keys()
        .into_iter()
        .filter_map(|key| match store.load_owner(&key) {
            Ok(Loaded::Valid(owner)) => Some(owner),
            _ => None,
        })
        .collect();
    let own = owners
        .iter()
        .find(|owner| owner.holds(&record.container_id, &record.if_name))
        .cloned();
    let other = match own {
        Some(_) => None,
        None => owners
            .iter()
            .find(|owner| owner.container_id != record.container_id)
            .map(|owner| owner.container_id.clone()),
    };
    (own, other)
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
        superseded_by: None,
        ips: view
            .iter()
            .flat_map(|v| v.ips.iter().map(|ip| ip.address.to_string()))
            .collect(),
        interfaces: view
            .iter()
            .flat_map(|v| v.interfaces.iter())
            .map(|i| InterfaceRow {
                name: &i.name,
                // Results of 0.x plugins often leave the MAC out; ADD read it from the netns.
                mac: i.mac.as_deref().or_else(|| observed_mac(record, &i.name)),
                sandbox: i.sandbox.as_deref(),
            })
            .collect(),
        routes: view
            .iter()
            .flat_map(|v| v.routes.iter())
            .map(|r| RouteRow {
                dst: r.dst.to_string(),
                gw: r.gw,
            })
            .collect(),
        cni_version: Some(&record.cni_version),
        created_at: Some(&record.created_at),
        updated_at: Some(&record.updated_at),
        set_aside: false,
        status: Status::Ok,
        reason: None,
        path: None,
        prev_result: Some(&record.prev_result),
        links: record.links.as_ref(),
        deferred: None,
        stale_dels: None,
    }
}

/// The MAC that ADD read from the pod's netns, when `name` is the checkpointed interface.
fn observed_mac<'a>(record: &'a Checkpoint, name: &str) -> Option<&'a str> {
    match record.links.as_ref()? {
        LinkFacts::Observed(facts) if facts.name == name => facts.mac.as_deref(),
        _ => None,
    }
}

/// A file that cannot be trusted: shown with what its name tells, never its content.
fn unverified_row(path: &Path, status: Status, reason: String) -> Row<'_> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let (network, container_id, if_name) = match split_file_name(name) {
        Some((n, c, i)) => (Some(n), Some(c), Some(i)),
        None => (None, None, None),
    };
    Row {
        network,
        container_id,
        if_name,
        set_aside: status != Status::Corrupt,
        path: Some(path),
        ..empty_row(status, reason)
    }
}

fn orphan_row(owner: &Ownership) -> Row<'_> {
    Row {
        network: Some(&owner.key.network),
        container_id: Some(&owner.container_id),
        if_name: owner.interfaces().first().copied(),
        pod_namespace: Some(&owner.key.pod_namespace),
        pod_name: Some(&owner.key.pod_name),
        pod_uid: owner.pod_uid.as_deref(),
        generation: Some(owner.generation),
        owner: true,
        ..empty_row(
            Status::OwnerWithoutRecord,
            "owns the pod key but its record is gone; the next DEL or GC of the pod drops this ownership".to_string(),
        )
    }
}

fn deferred_row(entry: &DeferredDel) -> Row<'_> {
    let view = entry
        .prev_result
        .as_deref()
        .and_then(|raw| ResultView::parse(raw).ok());
    let failures = match (entry.attempts, entry.last_error.as_deref()) {
        (0, _) => String::new(),
        (n, _) if entry.hung => format!(
            "; {n} replays failed, the last hung: it ran out of replayTimeoutSeconds while the primary still worked"
        ),
        (n, error) => format!("; {n} replays failed, the last: {}", error.unwrap_or("-")),
    };
    Row {
        network: Some(&entry.key.network),
        container_id: Some(&entry.container_id),
        if_name: Some(entry.if_name()),
        pod_namespace: Some(&entry.key.pod_namespace),
        pod_name: Some(&entry.key.pod_name),
        pod_uid: entry.pod_uid.as_deref(),
        netns: Some(&entry.netns),
        ips: view
            .iter()
            .flat_map(|v| v.ips.iter().map(|ip| ip.address.to_string()))
            .collect(),
        cni_version: Some(&entry.cni_version),
        created_at: Some(&entry.deferred_at),
        prev_result: entry.prev_result.as_deref(),
        deferred: Some(DeferredFields {
            deferred_at: &entry.deferred_at,
            deferred_for_owner: &entry.owner,
            attempts: entry.attempts,
            last_error: entry.last_error.as_deref(),
            last_attempt_at: entry.last_attempt_at.as_deref(),
            hung: entry.hung,
        }),
        ..empty_row(
            Status::Deferred,
            format!(
                "stale DEL kept from the primary since {}, while sandbox {} owns the pod; replayed once the pod's name is free{failures}",
                entry.deferred_at,
                crate::names::short_id(&entry.owner)
            ),
        )
    }
}

fn empty_row<'a>(status: Status, reason: String) -> Row<'a> {
    Row {
        network: None,
        container_id: None,
        if_name: None,
        pod_namespace: None,
        pod_name: None,
        pod_uid: None,
        infra_container_id: None,
        netns: None,
        generation: None,
        owner: false,
        superseded_by: None,
        ips: Vec::new(),
        interfaces: Vec::new(),
        routes: Vec::new(),
        cni_version: None,
        created_at: None,
        updated_at: None,
        set_aside: false,
        status,
        reason: Some(reason),
        path: None,
        prev_result: None,
        links: None,
        deferred: None,
        stale_dels: None,
    }
}

trait Sink {
    /// Renders one row (and counts it); the rows are written, sorted, by `finish`.
    fn row(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()>;
    fn finish(&mut self, out: &mut dyn Write, root: &Path, rows: &[&[u8]]) -> io::Result<()>;
}

/// A JSON array, one row per line.
#[derive(Default)]
struct JsonSink;

impl Sink for JsonSink {
    fn row(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        serde_json::to_writer(&mut *out, row)?;
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn Write, _root: &Path, rows: &[&[u8]]) -> io::Result<()> {
        if rows.is_empty() {
            return out.write_all(b"[]\n");
        }
        for (at, row) in rows.iter().enumerate() {
            out.write_all(if at == 0 { b"[\n  " } else { b",\n  " })?;
            out.write_all(row)?;
        }
        out.write_all(b"\n]\n")
    }
}

/// Columns of fixed width; a longer cell pushes its line out of alignment rather than being
/// cut (a truncated pod name would mislead).
#[derive(Default)]
struct TableSink {
    rows: usize,
    owned: usize,
    /// Rows per `Status`, in its order.
    by_status: [usize; 7],
}

const COLUMNS: [(&str, usize); 9] = [
    ("POD", 28),
    ("CONTAINER", 13),
    ("IF", 6),
    ("NETWORK", 16),
    ("IPS", 18),
    ("GEN", 4),
    ("OWNER", 5),
    ("AGE", 4),
    ("STATE", 0),
];

fn write_cells(out: &mut dyn Write, cells: [&str; 9]) -> io::Result<()> {
    let mut line = String::with_capacity(128);
    for ((_, width), cell) in COLUMNS.iter().zip(cells) {
        line.push_str(&format!("{cell:<width$}  "));
    }
    writeln!(out, "{}", line.trim_end())
}

/// `count` and the noun, singular or plural as the count asks.
fn counted(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

impl Sink for TableSink {
    fn row(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        self.rows += 1;
        self.owned += usize::from(row.owner && row.status == Status::Ok);
        self.by_status[row.status as usize] += 1;
        let pod = crate::names::pod_text(row.pod_namespace, row.pod_name);
        let container = crate::names::short_id(row.container_id.unwrap_or("-"));
        let ips = if row.ips.is_empty() {
            "-".to_string()
        } else {
            row.ips.join(",")
        };
        let generation = row.generation.map_or("-".to_string(), |g| g.to_string());
        let age = row
            .created_at
            .and_then(crate::clock::parse_rfc3339)
            .map_or("-".to_string(), |t| {
                crate::clock::age(t, crate::clock::unix_seconds())
            });
        let owner = if row.owner { "*" } else { "" };
        let cells = [
            &pod,
            container,
            row.if_name.unwrap_or("-"),
            row.network.unwrap_or("-"),
            &ips,
            &generation,
            owner,
            &age,
            row.status.label(),
        ];
        write_cells(out, cells)?;
        if let Some(entry) = &row.stale_dels {
            let more = if entry.more_sandboxes > 0 {
                format!(" and {} more", entry.more_sandboxes)
            } else {
                String::new()
            };
            let stale: Vec<&str> = entry
                .stale_sandboxes
                .iter()
                .map(|id| crate::names::short_id(id))
                .collect();
            writeln!(
                out,
                "    stale DEL calls for this pod: {} refused, {} audited, {} deferred, {} .. {}, from sandbox {}{more}",
                entry.refused,
                entry.audited,
                entry.deferred,
                entry.first_at,
                entry.last_at,
                stale.join(", ")
            )?;
        }
        // A row that is not plainly ok says why (and an untrusted one which file) below it.
        match (row.path, &row.reason) {
            (Some(path), Some(reason)) => writeln!(out, "    {}: {reason}", path.display()),
            (None, Some(reason)) => writeln!(out, "    {reason}"),
            _ => Ok(()),
        }
    }

    fn finish(&mut self, out: &mut dyn Write, root: &Path, rows: &[&[u8]]) -> io::Result<()> {
        write_cells(out, COLUMNS.map(|(header, _)| header))?;
        for row in rows {
            out.write_all(row)?;
        }
        let count = |status: Status| self.by_status[status as usize];
        let records = count(Status::Ok) + count(Status::Superseded);
        writeln!(
            out,
            "\n{}, {} owning their pod name (*), {} not trusted",
            counted(records, "checkpoint", "checkpoints"),
            self.owned,
            self.rows - records - count(Status::Deferred)
        )?;
        let root = root.display();
        let notes = [
            (
                Status::Superseded,
                counted(
                    count(Status::Superseded),
                    "sandbox whose pod another sandbox owns now: its DEL is stale, and passes once the owner is gone",
                    "sandboxes whose pod another sandbox owns now: their DELs are stale, and pass once the owners are gone",
                ),
            ),
            (
                Status::Corrupt,
                format!(
                    "{} in {root}/records: the next ADD, DEL or GC of each sets it aside",
                    counted(
                        count(Status::Corrupt),
                        "file fails verification",
                        "files fail verification"
                    )
                ),
            ),
            (
                Status::SetAside,
                format!(
                    "{} in {root}/set-aside: delete each once `crictl pods` shows no newer sandbox of its pod",
                    counted(
                        count(Status::SetAside),
                        "file refuses the DELs that need it",
                        "files refuse the DELs that need them"
                    )
                ),
            ),
            (
                Status::Kept,
                format!(
                    "{} in {root}/set-aside, kept for inspection: they block nothing",
                    counted(count(Status::Kept), "damaged copy", "damaged copies")
                ),
            ),
            (
                Status::OwnerWithoutRecord,
                format!(
                    "{}: the next DEL or GC of the pod drops that ownership",
                    counted(
                        count(Status::OwnerWithoutRecord),
                        "owner without a record",
                        "owners without a record"
                    )
                ),
            ),
            (
                Status::Deferred,
                counted(
                    count(Status::Deferred),
                    "sandbox's stale DEL waits for its pod's name to be free: the owner's DEL or GC replays it to the primary",
                    "sandboxes' stale DELs wait for their pod's name to be free: the owner's DEL or GC replays each to the primary",
                ),
            ),
        ];
        for (status, note) in notes {
            if count(status) > 0 {
                writeln!(out, "{}: {note}", status.label())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's states read as `--restore`'s results do: lower case for what is in order,
    /// capitals for what needs an operator.
    #[test]
    fn states_read_as_the_restore_table_does() {
        assert_eq!(Status::Deferred.label(), "deferred");
        assert_eq!(Status::Superseded.label(), "superseded");
        assert_eq!(Status::Ok.label(), "ok");
    }

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(counted(1, "checkpoint", "checkpoints"), "1 checkpoint");
        assert_eq!(counted(0, "checkpoint", "checkpoints"), "0 checkpoints");
        assert_eq!(counted(2, "checkpoint", "checkpoints"), "2 checkpoints");
    }
}
