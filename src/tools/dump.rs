//! `--dump-checkpoints`: every checkpoint with its ownership, for people or for tools.
//!
//! Records are read and verified a batch at a time under the shared lock and rendered; the
//! rendered rows are sorted as kubectl sorts pods (namespace, then name) and written after the
//! lock is let go, so a reader that stops reading (`| less` left open) holds up no ADD or
//! DEL. The primary's result is copied through as raw bytes. It creates, chmods and locks
//! nothing it reads.

use std::collections::HashMap;
use std::ffi::OsString;
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
use crate::state::ownership::{
    DelVerdict, Deleter, Owner, Ownership, PodKey, PodKeyRule, judge_del,
};
use crate::state::pending_add::{self, PendingAdd, Standing};
use crate::state::{Folder, Loaded, READ_BATCH, RECORDS, Store, read_entry_for_listing};
use crate::tools::counted;

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

    /// Whether the row of `owner` without its record (`orphan_row`) would be shown.
    fn admits_owner(&self, owner: &Ownership) -> bool {
        self.admits_fields(
            Some(&owner.key.pod_namespace),
            Some(&owner.key.pod_name),
            owner.pod_uid.as_deref(),
            Some(&owner.container_id),
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
    /// A file's name may be any bytes: shown as the table shows it, never failing the dump.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "lossy_path")]
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
    /// A pending ADD's: when it was noted, its primary's pid, its failed rollbacks.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pending_add: Option<PendingAddFields<'a>>,
    /// An ownership's row whose record is gone: counted as no checkpoint.
    #[serde(skip)]
    without_record: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PendingAddFields<'a> {
    noted_at: &'a str,
    /// None when the primary never ran.
    primary_pid: Option<i32>,
    /// Processes of the primary's group that still carry the call's marker.
    primary_processes: usize,
    /// `at-the-primary`, `cut-off`, `committed` or `earlier-boot`.
    standing: &'static str,
    of_another_boot: bool,
    rollback_attempts: u32,
    rollback_last_error: Option<&'a str>,
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
    /// Held for the API server's pod of the name (rule 7): `deferredForOwner` is its UID.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_for_api_pod: Option<&'a crate::state::held::MovedTo>,
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
    /// Delegate mode: an ADD at the primary now, or cut off there: the pod's next verb rolls
    /// it back.
    PendingAdd,
    /// Delegate mode: a cut-off ADD the primary has had the DEL of: the sandbox's own DEL is
    /// answered without it.
    RolledBack,
    /// A record or an ownership of a sandbox that ended with an earlier boot: nothing judges
    /// by it.
    PreviousBoot,
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
            Status::PendingAdd => "pending-add",
            Status::RolledBack => "rolled-back",
            Status::PreviousBoot => "previous-boot",
        }
    }
}

fn lossy_path<S: serde::Serializer>(
    path: &Option<&Path>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match path {
        Some(path) => serializer.serialize_str(&path.to_string_lossy()),
        None => serializer.serialize_none(),
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
        Format::Json => Box::new(JsonSink::default()),
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
        sink.begin(&mut out)
            .and_then(|()| sink.finish(&mut out, state_dir))
            .map_err(DumpError::Write)
    } else {
        let store = Store::open_as_it_is(state_dir)?;
        write_all(&store, filter, sink.as_mut(), lock_timeout)
    };
    written
        // A reader that stops early (`| head`) is not an error.
        .or_else(|e| match e {
            DumpError::Write(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            DumpError::Write(e) => {
                Err(GuardError::new(Kind::Io, format!("cannot write the dump: {e}")).with_source(e))
            }
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

/// The records are read twice: a first pass lists where each row sorts and its file's name in
/// a plain vector, sorted once; a second reads the records again in that order and renders
/// each one, so what is shown is the record as it is then, and no more than a batch of rendered
/// rows is held. Each batch is written with the lock let go, so a reader that stops reading
/// (`| less` left open) holds up no ADD or DEL. The few rows that stand for no record (set-aside
/// files, owners without a record, deferred DELs) are rendered before the second pass, or with
/// their pod's first row there, and merged in.
fn write_all(
    store: &Store,
    filter: &Filter,
    sink: &mut dyn Sink,
    lock_timeout: Duration,
) -> std::result::Result<(), DumpError> {
    let notice = WaitNotice::new(store.root(), lock_timeout);
    let on_wait = |holder: &str| notice.hear(holder);
    // Small and bounded (`state::ledger`): read once, shown on the owners' rows.
    let ledger: HashMap<PodKey, LedgerEntry> = {
        let _lock = store.read_lock(lock_timeout, &on_wait)?;
        store
            .list_ledger()?
            .into_iter()
            .map(|entry| (entry.key.clone(), entry))
            .collect()
    };
    // Every admitted record's place in the order and its file's name.
    let mut listed: Vec<Listed> = Vec::new();
    let mut paths = store.record_paths()?;
    loop {
        let mut read = 0;
        let _lock = store.read_lock(lock_timeout, &on_wait)?;
        for path in paths.by_ref() {
            list_record(store, filter, &path.map_err(listing_error)?, &mut listed);
            read += 1;
            if read == READ_BATCH {
                break;
            }
        }
        if read == 0 {
            break;
        }
    }
    drop(paths);
    // Stable: records of equal keys keep the order they were read in.
    listed.sort_by(|a, b| a.key().cmp(&b.key()));
    // The owner files the second pass reads by name, each with its pod's rows: those of the
    // keys the listed records can stand on, under either podKey rule.
    let mut named: Vec<String> = listed
        .iter()
        .flat_map(Listed::owner_keys)
        .map(|(key, ..)| key.digest())
        .collect();
    named.sort_unstable();
    named.dedup();
    let mut others = Rendered::default();
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
            push_row(sink, &mut others, &row)?;
        }
    }
    // The other owner files are read here, once each, and judged in the same hold of the lock.
    let mut orphans = store.read_in_batches(Folder::Owners, lock_timeout, &on_wait, |path| {
        let is_named = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| named.binary_search_by(|d| d.as_str().cmp(name)).is_ok());
        if is_named {
            return None;
        }
        match read_entry_for_listing::<Ownership>(path) {
            Loaded::Valid(owner)
                if filter.admits_owner(&owner) && !store.owner_is_backed(&owner) =>
            {
                Some(owner)
            }
            _ => None,
        }
    })?;
    drop(named);
    // A listing that runs across renames into the folder may return a name twice.
    orphans.sort_by(|a, b| a.0.cmp(&b.0));
    orphans.dedup_by(|a, b| a.0 == b.0);
    for (_, owner) in &orphans {
        orphan_row_into(store, sink, &mut others, owner)?;
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
            push_row(sink, &mut others, &row)?;
        }
    }
    let notes: Vec<(PendingAdd, Standing, Option<i32>)> = pending_add::digests(store.root())
        .iter()
        .filter_map(|digest| match pending_add::load(store.root(), digest) {
            Ok(Loaded::Valid(note)) => {
                let (standing, pid) = pending_add::standing(store.root(), digest, &note);
                Some((note, standing, pid))
            }
            // Written or removed as it was read: the pod's verb owns it.
            _ => None,
        })
        .collect();
    for (note, standing, pid) in &notes {
        let row = pending_add_row(note, *standing, *pid);
        if filter.admits_fields(row.pod_namespace, row.pod_name, None, row.container_id) {
            push_row(sink, &mut others, &row)?;
        }
    }
    let rolled_back = pending_add::rolled_back_ids(store.root());
    for id in &rolled_back {
        let reason = if pending_add::marked_in_this_boot(store.root(), id) {
            "its ADD was cut off at the primary and rolled back: the primary has had its DEL, and its own DEL is answered without the primary"
        } else {
            "a mark of an earlier boot: it answers nothing, and the sandbox's next DEL or GC removes it"
        };
        let row = Row {
            network: Some(&id.network),
            container_id: Some(&id.container_id),
            if_name: Some(&id.if_name),
            ..empty_row(Status::RolledBack, reason.to_string())
        };
        if filter.admits_container(row.container_id)
            && filter.namespace.is_none()
            && filter.pod_name.is_none()
            && filter.pod_uid.is_none()
        {
            push_row(sink, &mut others, &row)?;
        }
    }
    // Stable: rows of equal keys keep the order they were read in, records first.
    others
        .at
        .sort_by(|a, b| a.key(&others.keys).cmp(&b.key(&others.keys)));

    let mut out = io::stdout().lock();
    let mut pending = Vec::with_capacity(PENDING_BYTES);
    sink.begin(&mut pending)?;
    let mut others_at = 0;
    // The owners of the pod whose rows are being written, read with its first row, and those
    // of them no record stands on, rendered to go between its rows.
    let mut owners: HashMap<PodKey, Option<Ownership>> = HashMap::new();
    let (mut pod_orphans, mut pod_orphans_at) = (Rendered::default(), 0);
    let records = store.root().join(RECORDS);
    // Rows are on stdout: an error from here on leaves them short of the whole list.
    let mut written = false;
    let mut lock = None;
    let mut loads = 0;
    for (at, record) in listed.iter().enumerate() {
        let key = record.key();
        let first_of_pod = at == 0 || !listed[at - 1].same_pod(record);
        if lock.is_none() {
            lock = Some(
                store
                    .read_lock(lock_timeout, &on_wait)
                    .map_err(|e| cut_short(e.into(), written))?,
            );
        }
        if first_of_pod {
            owners.clear();
            let pod = listed[at..]
                .iter()
                .take_while(|other| other.same_pod(record));
            for owner in read_pod_owners(store, filter, pod, &mut owners) {
                orphan_row_into(store, sink, &mut pod_orphans, &owner)?;
            }
            // Sorted with the rows not yet written: an owner file copied under another pod's
            // name holds a row that sorts with that pod's.
            let keys = &pod_orphans.keys;
            pod_orphans.at[pod_orphans_at..].sort_by(|a, b| a.key(keys).cmp(&b.key(keys)));
        }
        write_before(
            sink,
            &mut pending,
            [
                (&pod_orphans, &mut pod_orphans_at),
                (&others, &mut others_at),
            ],
            Some(&key),
        )?;
        // A record removed since the first pass is not found and is left out, as `ls` or
        // `ps` leave out what went between listing it and reading it.
        record_rows(
            store,
            filter,
            &ledger,
            &mut owners,
            &records.join(&record.file_name),
            &mut |row| {
                sink.separate(&mut pending)?;
                sink.render(&mut pending, row)
            },
        )?;
        loads += 1;
        if loads == READ_BATCH || pending.len() >= PENDING_BYTES {
            lock = None;
            loads = 0;
            out.write_all(&pending)?;
            pending.clear();
            written = true;
        }
    }
    drop(lock);
    write_before(
        sink,
        &mut pending,
        [
            (&pod_orphans, &mut pod_orphans_at),
            (&others, &mut others_at),
        ],
        None,
    )?;
    sink.finish(&mut pending, store.root())?;
    out.write_all(&pending)?;
    out.flush()?;
    Ok(())
}

/// Writes the rows of `sources` (each sorted, from its cursor on) that sort before `bound`,
/// all of them without one, in order; on equal keys the earlier source first.
fn write_before(
    sink: &mut dyn Sink,
    pending: &mut Vec<u8>,
    mut sources: [(&Rendered, &mut usize); 2],
    bound: Option<&SortKey>,
) -> io::Result<()> {
    loop {
        let next = sources
            .iter()
            .enumerate()
            .filter_map(|(source, (rows, at))| {
                let row = rows.at.get(**at)?;
                Some((source, row.key(&rows.keys)))
            })
            .filter(|(_, key)| bound.is_none_or(|bound| key < bound))
            .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        let Some((source, _)) = next else {
            return Ok(());
        };
        let (rows, at) = &mut sources[source];
        sink.separate(pending)?;
        pending.extend_from_slice(&rows.bytes[rows.at[**at].row.clone()]);
        **at += 1;
    }
}

/// Reads the owner files of the keys `pod`'s records can stand on (its rows, next to each
/// other in the order) into `owners` as `load_owner` gives them, and returns those that no
/// record filed under its own name stands on, judged in the same hold of the lock as the read.
fn read_pod_owners<'a>(
    store: &Store,
    filter: &Filter,
    pod: impl Iterator<Item = &'a Listed> + Clone,
    owners: &mut HashMap<PodKey, Option<Ownership>>,
) -> Vec<Ownership> {
    let mut orphans = Vec::new();
    for (key, ..) in pod.clone().flat_map(Listed::owner_keys) {
        if owners.contains_key(&key) {
            continue;
        }
        let read = store.read_owner_file(&key).unwrap_or(Loaded::Missing);
        if let Loaded::Valid(owner) = &read {
            let stood_on = pod
                .clone()
                .filter(|listed| listed.at_its_name)
                .flat_map(Listed::owner_keys)
                .any(|(stands_on, container_id, if_name)| {
                    stands_on == owner.key && owner.holds(container_id, if_name)
                });
            if !stood_on && filter.admits_owner(owner) && !store.owner_is_backed(owner) {
                orphans.push(owner.clone());
            }
        }
        let judged = match store.judge_owner(&key, read) {
            Loaded::Valid(owner) => Some(owner),
            _ => None,
        };
        owners.insert(key, judged);
    }
    orphans
}

/// Renders `owner`'s row, an ownership no record stands on, into `rows`.
fn orphan_row_into(
    store: &Store,
    sink: &mut dyn Sink,
    rows: &mut Rendered,
    owner: &Ownership,
) -> io::Result<()> {
    let row = orphan_row(
        owner,
        store
            .ended_with(owner.boot_id.as_deref())
            .map(|boot| ended_reason(store, boot, "ownership")),
    );
    push_row(sink, rows, &row)
}

/// The error that stopped the dump, saying the rows it wrote are not all of them when it had
/// written some: a table or an array cut short looks whole to whoever reads only stdout.
fn cut_short(err: DumpError, written: bool) -> DumpError {
    match err {
        DumpError::Store(err) if written => {
            let details = format!(
                "{} The rows written before it are incomplete: run the dump again for the whole list.",
                err.details
            );
            DumpError::Store(
                GuardError::new(err.kind, format!("the dump stopped part way: {}", err.msg))
                    .with_details(details.trim_start()),
            )
        }
        err => err,
    }
}

/// Rendered rows are written in pieces of about this size, each with the lock let go.
const PENDING_BYTES: usize = 8 << 10;

fn listing_error(e: io::Error) -> GuardError {
    GuardError::new(Kind::Io, format!("cannot list the records: {e}")).with_source(e)
}

/// Where a record's row sorts, its file, and the owners it can stand on, from the first pass.
struct Listed {
    no_pod: bool,
    keyed: bool,
    /// Filed under its own name, where DEL and GC look for it: only then does it back its owner.
    at_its_name: bool,
    network: String,
    namespace: String,
    pod: String,
    container_id: String,
    if_name: String,
    file_name: OsString,
}

impl Listed {
    fn key(&self) -> SortKey<'_> {
        SortKey {
            no_pod: self.no_pod,
            fields: [
                self.namespace.as_bytes(),
                self.pod.as_bytes(),
                self.container_id.as_bytes(),
                self.if_name.as_bytes(),
            ],
        }
    }

    fn same_pod(&self, other: &Listed) -> bool {
        (self.no_pod, &self.namespace, &self.pod) == (other.no_pod, &other.namespace, &other.pod)
    }

    /// The pod keys of each `podKey` rule this record's owner may be filed under, each with
    /// the interface that would stand on it (none for a record of no pod or a damaged one).
    fn owner_keys(&self) -> impl Iterator<Item = (PodKey, &str, &str)> {
        let rules: &[_] = if self.keyed {
            &PodKeyRule::CHOICES
        } else {
            &[]
        };
        rules.iter().map(|(_, rule)| {
            let key = rule.key(&self.network, &self.namespace, &self.pod, &self.if_name);
            (key, self.container_id.as_str(), self.if_name.as_str())
        })
    }
}

/// Reads the record at `path` and lists it if the filter admits it.
fn list_record(store: &Store, filter: &Filter, path: &Path, listed: &mut Vec<Listed>) {
    let file_name = path.file_name().unwrap_or_default().to_os_string();
    match store.load_record_at(path) {
        Loaded::Valid(record) => {
            if filter.admits(&record) {
                listed.push(Listed {
                    no_pod: record.pod_name.is_none(),
                    // A pod key needs both (`checkpoint::pod_key`).
                    keyed: record.pod_name.is_some() && record.pod_namespace.is_some(),
                    at_its_name: file_name.to_str() == Some(record.id().file_name().as_str()),
                    network: record.network.clone(),
                    namespace: record.pod_namespace.clone().unwrap_or_default(),
                    pod: record.pod_name.clone().unwrap_or_default(),
                    container_id: record.container_id.clone(),
                    if_name: record.if_name.clone(),
                    file_name,
                });
            }
        }
        Loaded::Corrupt { .. } => {
            // Shown with what its name tells, as its row is.
            let named = file_name.to_str().and_then(split_file_name);
            if filter.admits_container(named.map(|(_, container_id, _)| container_id)) {
                let (container_id, if_name) = named
                    .map(|(_, container_id, if_name)| {
                        (container_id.to_string(), if_name.to_string())
                    })
                    .unwrap_or_default();
                listed.push(Listed {
                    no_pod: true,
                    keyed: false,
                    at_its_name: false,
                    network: String::new(),
                    namespace: String::new(),
                    pod: String::new(),
                    container_id,
                    if_name,
                    file_name,
                });
            }
        }
        Loaded::Missing => {}
    }
}

/// A row's sort key: kubectl's order (namespace, then name), then the sandbox and the
/// interface; rows that name no pod go last.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct SortKey<'a> {
    no_pod: bool,
    /// The namespace, the pod's name, the container ID and the interface.
    fields: [&'a [u8]; 4],
}

/// The rows that stand for no record, rendered back to back in one buffer and their sort keys
/// in another: a buffer of its own per row or per key would round every one up to its
/// allocation's size.
#[derive(Default)]
struct Rendered {
    bytes: Vec<u8>,
    keys: Vec<u8>,
    at: Vec<RowAt>,
}

/// Where one rendered row is and where it sorts.
struct RowAt {
    no_pod: bool,
    /// The namespace, the pod's name, the container ID and the interface, in `keys`.
    key: [Range<usize>; 4],
    row: Range<usize>,
}

impl RowAt {
    fn key<'a>(&self, keys: &'a [u8]) -> SortKey<'a> {
        SortKey {
            no_pod: self.no_pod,
            fields: self.key.clone().map(|range| &keys[range]),
        }
    }
}

fn push_row(sink: &mut dyn Sink, rows: &mut Rendered, row: &Row) -> io::Result<()> {
    let start = rows.bytes.len();
    sink.render(&mut rows.bytes, row)?;
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

/// Hands `emit` the row of the record at `path` if the filter admits it, as it is now. Its
/// ownership is the one this dump read of its pod key (`owners`), once for all the pod's rows.
fn record_rows(
    store: &Store,
    filter: &Filter,
    ledger: &HashMap<PodKey, LedgerEntry>,
    owners: &mut HashMap<PodKey, Option<Ownership>>,
    path: &Path,
    emit: &mut dyn FnMut(&Row) -> io::Result<()>,
) -> io::Result<()> {
    match store.load_record_at(path) {
        Loaded::Valid(record) => {
            let (owner, superseded_by) = owner_of(store, owners, &record);
            let owner_key = owner.map(|owner| owner.key);
            if filter.admits(&record) {
                let view = ResultView::parse(&record.prev_result).ok();
                let mut row = record_row(&record, owner_key.is_some(), &view);
                row.stale_dels = owner_key
                    .as_ref()
                    .and_then(|key| ledger.get(key))
                    .map(StaleDels::of);
                if let Some(other) = superseded_by {
                    let pod = crate::names::pod_text(row.pod_namespace, row.pod_name);
                    let short = crate::names::short_id(&other.container_id);
                    row.status = Status::Superseded;
                    // Told as the verbs would judge this sandbox's DEL now.
                    let found = Owner {
                        ownership: &other,
                        backed: store.owner_is_backed(&other),
                    };
                    row.reason = Some(
                        match judge_del(&record.container_id, Deleter::Recorded, Some(found)) {
                            DelVerdict::Repair(_) => format!(
                                "pod {pod} was taken by sandbox {short}, whose record is gone: this sandbox's DEL drops that ownership and passes"
                            ),
                            _ => format!(
                                "pod {pod} belongs to sandbox {short} now: this sandbox's DEL is stale (chained: refused until {short} is gone; delegate: deferred)"
                            ),
                        },
                    );
                    row.superseded_by = Some(other.container_id);
                }
                if let (Some(held), None) = (&record.held, &row.reason) {
                    let node = held
                        .node
                        .as_deref()
                        .map_or(String::new(), |node| format!(" on node {node}"));
                    row.reason = Some(format!(
                        "its DEL is refused: pod {} was pod UID {}{node} in the API server when the DEL was first refused \
                         (rule 7); retries stay refused until the API server answers that no other pod has the name, or the view is \
                         turned off",
                        crate::names::pod_text(row.pod_namespace, row.pod_name),
                        held.pod_uid,
                    ));
                }
                if let Some(boot) = store.ended_with(record.boot_id.as_deref()) {
                    row.status = Status::PreviousBoot;
                    row.reason = Some(ended_reason(store, boot, "record"));
                    row.superseded_by = None;
                }
                emit(&row)?;
            }
            Ok(())
        }
        Loaded::Corrupt { path, reason } => {
            let row = unverified_row(
                &path,
                Status::Corrupt,
                format!("failed verification: {reason}"),
            );
            if filter.admits_container(row.container_id) {
                emit(&row)?;
            }
            Ok(())
        }
        Loaded::Missing => Ok(()),
    }
}

/// The ownership of the record's pod that stands on this very attachment, under whichever
/// `podKey` rule its network follows (the dump reads no config); else the ownership of the
/// container that owns the pod instead, as `--restore` finds it.
fn owner_of(
    store: &Store,
    read: &mut HashMap<PodKey, Option<Ownership>>,
    record: &Checkpoint,
) -> (Option<Ownership>, Option<Ownership>) {
    let owners: Vec<Ownership> = record
        .pod_keys()
        .into_iter()
        .filter_map(|key| {
            read.entry(key)
                .or_insert_with_key(|key| match store.load_owner(key) {
                    Ok(Loaded::Valid(owner)) => Some(owner),
                    _ => None,
                })
                .clone()
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
            .cloned(),
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
        pending_add: None,
        without_record: false,
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

/// Why a previous-boot row blocks nothing, and what becomes of it: the live folders of an
/// earlier boot go aside with the next writer; an entry that names another boot under this
/// boot's marker stays until its sandbox's DEL or its pod's next verb replaces it.
fn ended_reason(store: &Store, boot: &str, what: &str) -> String {
    let next = match store.live_folders() {
        crate::state::boot::LiveFolders::Previous(_) => {
            "the next ADD, DEL or GC moves it to previous-boot/"
        }
        _ => "the DEL of its sandbox, or its pod's next ADD, DEL or GC, replaces or removes it",
    };
    format!("its sandbox ended with the boot {boot}: no verb judges by this {what}, and {next}")
}

/// `ended`: why the ownership is an ended boot's, where it is.
fn orphan_row(owner: &Ownership, ended: Option<String>) -> Row<'_> {
    let (status, reason) = match ended {
        Some(reason) => (Status::PreviousBoot, reason),
        None => (
            Status::OwnerWithoutRecord,
            "owns the pod key but its record is gone; the next DEL or GC of the pod drops this ownership".to_string(),
        ),
    };
    Row {
        network: Some(&owner.key.network),
        container_id: Some(&owner.container_id),
        if_name: owner.interfaces().first().copied(),
        pod_namespace: Some(&owner.key.pod_namespace),
        pod_name: Some(&owner.key.pod_name),
        pod_uid: owner.pod_uid.as_deref(),
        generation: Some(owner.generation),
        owner: true,
        without_record: true,
        ..empty_row(status, reason)
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
            held_for_api_pod: entry.moved_to.as_ref(),
            attempts: entry.attempts,
            last_error: entry.last_error.as_deref(),
            last_attempt_at: entry.last_attempt_at.as_deref(),
            hung: entry.hung,
        }),
        ..empty_row(
            Status::Deferred,
            match &entry.moved_to {
                Some(moved) if moved.pod_uid.is_empty() => format!(
                    "DEL of a sandbox of the boot before kept from the primary since {}, the API server unanswered then; replayed once it answers that no other pod has the name{failures}",
                    entry.deferred_at
                ),
                Some(moved) => format!(
                    "DEL kept from the primary since {}, while the API server shows the pod's name on pod UID {} ({}); replayed once it has no other pod of that name{failures}",
                    entry.deferred_at,
                    moved.pod_uid,
                    moved
                        .node
                        .as_deref()
                        .map_or("not on a node".to_string(), |node| format!("node {node}"))
                ),
                None => format!(
                    "stale DEL kept from the primary since {}, while sandbox {} owns the pod; replayed once the pod's name is free{failures}",
                    entry.deferred_at,
                    crate::names::short_id(&entry.owner)
                ),
            },
        )
    }
}

fn pending_add_row(note: &PendingAdd, standing: Standing, pid: Option<i32>) -> Row<'_> {
    let ran = match pid {
        Some(pid) => format!("its primary ran as pid {pid}"),
        None => "its primary never ran".to_string(),
    };
    let failures = match note.attempts {
        0 => String::new(),
        n => format!(
            "; {} failed, the last: {}",
            counted(n as usize, "rollback", "rollbacks"),
            note.last_error.as_deref().unwrap_or("-")
        ),
    };
    let reason = match standing {
        Standing::EarlierBoot => format!(
            "an ADD noted in an earlier boot ({ran}): nothing of it runs; the pod's next verb drops the note"
        ),
        Standing::Committed => format!(
            "its ADD committed ({ran}) before its guard could remove the note: the pod's next verb drops it"
        ),
        Standing::AtThePrimary { .. } => format!("an ADD at the primary now ({ran})"),
        Standing::CutOff { processes } => format!(
            "an ADD cut off at the primary ({ran}; {} of its group still run): the pod's next verb kills them and \
             gives the primary this sandbox's DEL, or, while another sandbox holds the pod, that sandbox's DEL does, and \
             the pod's next ADD drops the note{failures}",
            counted(processes, "process", "processes")
        ),
    };
    Row {
        network: Some(&note.key.network),
        container_id: Some(&note.container_id),
        if_name: Some(&note.if_name),
        pod_namespace: Some(&note.key.pod_namespace),
        pod_name: Some(&note.key.pod_name),
        netns: Some(&note.netns),
        cni_version: Some(&note.cni_version),
        created_at: Some(&note.written_at),
        pending_add: Some(PendingAddFields {
            noted_at: &note.written_at,
            primary_pid: pid,
            primary_processes: standing.processes(),
            standing: match standing {
                Standing::EarlierBoot => "earlier-boot",
                Standing::Committed => "committed",
                Standing::AtThePrimary { .. } => "at-the-primary",
                Standing::CutOff { .. } => "cut-off",
            },
            of_another_boot: note.of_another_boot(),
            rollback_attempts: note.attempts,
            rollback_last_error: note.last_error.as_deref(),
        }),
        ..empty_row(Status::PendingAdd, reason)
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
        pending_add: None,
        without_record: false,
    }
}

trait Sink {
    /// What comes before the first row.
    fn begin(&mut self, out: &mut dyn Write) -> io::Result<()>;
    /// What comes before each row written, in the order written.
    fn separate(&mut self, out: &mut dyn Write) -> io::Result<()>;
    /// Renders one row and counts it.
    fn render(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()>;
    /// What comes after the last row.
    fn finish(&mut self, out: &mut dyn Write, root: &Path) -> io::Result<()>;
}

/// A JSON array, one row per line.
#[derive(Default)]
struct JsonSink {
    written: usize,
    /// One row's text. serde_json writes a row token by token; through `dyn Write` each token
    /// is a call and a copy of its own, which musl's memcpy makes slow for the one-byte ones.
    row: Vec<u8>,
}

impl Sink for JsonSink {
    fn begin(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }

    fn separate(&mut self, out: &mut dyn Write) -> io::Result<()> {
        self.written += 1;
        out.write_all(if self.written == 1 {
            b"[\n  "
        } else {
            b",\n  "
        })
    }

    fn render(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        self.row.clear();
        serde_json::to_writer(&mut self.row, row)?;
        out.write_all(&self.row)
    }

    fn finish(&mut self, out: &mut dyn Write, _root: &Path) -> io::Result<()> {
        out.write_all(if self.written == 0 { b"[]\n" } else { b"\n]\n" })
    }
}

/// Columns of fixed width; a longer cell pushes its line out of alignment rather than being
/// cut (a truncated pod name would mislead).
#[derive(Default)]
struct TableSink {
    rows: usize,
    owned: usize,
    /// Rows per `Status`, in its order.
    by_status: [usize; 10],
    /// Of the previous-boot rows, those of an ownership whose record is gone: no checkpoint.
    previous_boot_owners: usize,
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

impl Sink for TableSink {
    fn begin(&mut self, out: &mut dyn Write) -> io::Result<()> {
        write_cells(out, COLUMNS.map(|(header, _)| header))
    }

    fn separate(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }

    fn render(&mut self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        self.rows += 1;
        self.owned += usize::from(row.owner && row.status == Status::Ok);
        self.by_status[row.status as usize] += 1;
        self.previous_boot_owners +=
            usize::from(row.status == Status::PreviousBoot && row.without_record);
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

    fn finish(&mut self, out: &mut dyn Write, root: &Path) -> io::Result<()> {
        let count = |status: Status| self.by_status[status as usize];
        let records = count(Status::Ok) + count(Status::Superseded) + count(Status::PreviousBoot)
            - self.previous_boot_owners;
        writeln!(
            out,
            "\n{}, {} owning their pod name (*), {} not trusted",
            counted(records, "checkpoint", "checkpoints"),
            self.owned,
            self.rows
                - records
                - count(Status::Deferred)
                - count(Status::PendingAdd)
                - count(Status::RolledBack)
                - self.previous_boot_owners
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
            (
                Status::PendingAdd,
                counted(
                    count(Status::PendingAdd),
                    "ADD is at the primary now or was cut off there: the pod's next verb, or the sweep, rolls it back",
                    "ADDs are at the primary now or were cut off there: each pod's next verb, or the sweep, rolls them back",
                ),
            ),
            (
                Status::RolledBack,
                counted(
                    count(Status::RolledBack),
                    "cut-off ADD was rolled back: its sandbox's DEL is answered without the primary, and GC drops the mark once the runtime forgets the sandbox",
                    "cut-off ADDs were rolled back: their sandboxes' DELs are answered without the primary, and GC drops each mark once the runtime forgets the sandbox",
                ),
            ),
            (
                Status::PreviousBoot,
                counted(
                    count(Status::PreviousBoot),
                    "entry is of a sandbox that ended with an earlier boot: nothing judges by it, and its row says what becomes of it",
                    "entries are of sandboxes that ended with an earlier boot: nothing judges by them, and each row says what becomes of it",
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
