//! Rules 7 and 8 (`state::ownership`): the API server's word where the store cannot decide,
//! asked only with a `kubeconfig` and a pod UID to compare, never under the store's lock
//! (one pod's slow answer must not hold another pod's verb). An answer that does not come
//! within `API_BOUND` leaves the verb to the local rule, logged as `api-unanswered`.

use crate::cni::config::StaleDelPolicy;
use crate::cni::env::Attachment;
use crate::cni::log::{CAUSE_LATE_ADD, CAUSE_NAME_MOVED, Level, Outcome};
use crate::cni::pod_in_api::{self, Asked, PodInApi};
use crate::cni::verbs::Invocation;
use crate::error::{GuardError, Kind, Result};
use crate::state::deferred::DeferredDel;
use crate::state::held::{HeldWith, MovedTo};
use crate::state::ownership::{self, ApiPod, PodKey, PodKeyScope};
use crate::state::{Loaded, Store};

/// The pod the API server holds under `key`'s name, asked with `kubeconfig`, or `None` when
/// it cannot tell in time: logged as `api-unanswered`, with `then` saying what follows.
fn ask(
    inv: &Invocation,
    attachment: Option<&Attachment>,
    kubeconfig: &std::path::Path,
    key: &PodKey,
    then: &str,
) -> Option<PodInApi> {
    match pod_in_api::ask(kubeconfig, &key.pod_namespace, &key.pod_name) {
        Asked::Answered(pod) => Some(pod),
        Asked::Unknown(why) => {
            note_unanswered(kubeconfig);
            let subject = inv.subject(attachment, Some(key.pod()));
            inv.log.event(
                Level::Warn,
                inv.verb,
                &subject,
                Outcome::ApiUnanswered,
                &format!("the API server could not be asked, so {then}: {why}"),
            );
            None
        }
    }
}

/// `ask` with the network's kubeconfig, for a verb the local rule then decides alone.
fn ask_for_verb(inv: &Invocation, attachment: &Attachment, key: &PodKey) -> Option<PodInApi> {
    let kubeconfig = inv.conf.kubeconfig.as_deref()?;
    ask(
        inv,
        Some(attachment),
        kubeconfig,
        key,
        "the local rule alone decides",
    )
}

fn api_pod(pod: &PodInApi) -> Option<ApiPod<'_>> {
    Some(ApiPod {
        uid: pod.uid.as_deref().filter(|_| pod.found)?,
        node: pod.node_name.as_deref(),
    })
}

/// This node's name as kubelet registered it: `nodeName`, else the host name (kubelet's
/// default without `--hostname-override`).
fn this_node(inv: &Invocation) -> String {
    inv.conf.node_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_lowercase())
            .unwrap_or_default()
    })
}

/// A DEL rule 7 holds: its key, the API's pod of the name now, and the refusal chained mode
/// answers with.
pub struct Moved {
    pub key: PodKey,
    pub uid: String,
    pub node: Option<String>,
    pub error: GuardError,
}

/// What a held DEL keeps of its hold, for the replay to ask again as this network asked.
pub fn moved_to(inv: &Invocation, moved: &Moved) -> Option<MovedTo> {
    Some(MovedTo {
        pod_uid: moved.uid.clone(),
        node: moved.node.clone(),
        kubeconfig: inv.conf.kubeconfig.clone()?,
        scope: inv.conf.pod_key_scope.name().to_string(),
        this_node: this_node(inv),
    })
}

/// What a DEL kept for want of an answer keeps (`delegated::kept_unanswered`): a hold whose
/// API pod is not known (`pod_uid` empty), asked again as any hold is (`still_moved`).
pub fn unanswered_hold(inv: &Invocation) -> Option<MovedTo> {
    Some(MovedTo {
        pod_uid: String::new(),
        node: None,
        kubeconfig: inv.conf.kubeconfig.clone()?,
        scope: inv.conf.pod_key_scope.name().to_string(),
        this_node: this_node(inv),
    })
}

/// A held DEL's own entry, found again (its retry after the sandbox was forgotten): held as
/// before, without asking, so an API that does not answer now cannot let it through.
pub fn held_before(entry: &DeferredDel) -> Option<Moved> {
    let moved = entry.moved_to.as_ref()?;
    Some(Moved::held(
        &entry.key,
        moved,
        "The DEL is kept for the primary until the API server has no other pod of that name.",
    ))
}

/// Chained mode's retry of a DEL rule 7 refused (`held`, kept in its record): refused again
/// unless an answer now frees the name (`still_held`). Judged by this DEL's own
/// `podKeyScope` and `nodeName`: its network is the one that held it.
pub fn held_in_record(inv: &Invocation, key: &PodKey, uid: &str, held: &MovedTo) -> Option<Moved> {
    let now = MovedTo {
        scope: inv.conf.pod_key_scope.name().to_string(),
        // The host name stands in for a `nodeName` only where the hold had none either.
        this_node: inv
            .conf
            .node_name
            .clone()
            .unwrap_or_else(|| held.this_node.clone()),
        ..held.clone()
    };
    still_held(inv, key, uid, &now).then(|| {
        Moved::held(
            key,
            held,
            &format!(
                "Refused until the API server answers that no other pod has that name (the StatefulSet scaled down, or the \
                 pod deleted); an API server that does not answer keeps it refused. Without one, write {} over {} (a file of \
                 root's, not writable by others) and the next retry goes by the local rule. The runtime retries the DEL.",
                crate::state::held::VIEW_OFF.trim_end(),
                held.kubeconfig.display()
            ),
        )
    })
}

impl Moved {
    /// A hold made before, kept in `moved`.
    fn held(key: &PodKey, moved: &MovedTo, details: &str) -> Moved {
        Moved {
            key: key.clone(),
            uid: moved.pod_uid.clone(),
            node: moved.node.clone(),
            error: GuardError::new(
                Kind::StaleDel,
                match moved.pod_uid.as_str() {
                    "" => format!(
                        "stale DEL refused: the API server did not answer for pod {} when this DEL of a sandbox of the boot \
                         before was first held",
                        key.pod()
                    ),
                    uid => format!(
                        "stale DEL refused: pod {} was pod UID {uid} in the API server when this DEL was first held",
                        key.pod()
                    ),
                },
            )
            .with_details(details),
        }
    }

    /// The log's fields: `owner=` is the API's pod UID, not a container ID.
    fn fields(&self) -> [(&'static str, &str); 2] {
        [("cause", CAUSE_NAME_MOVED), ("owner", self.uid.as_str())]
    }

    /// Delegate mode's answer where it cannot defer: refused.
    pub fn refuse(self, inv: &Invocation, attachment: &Attachment) -> GuardError {
        let subject = inv.subject(Some(attachment), Some(self.key.pod()));
        inv.log.event_with(
            Level::Warn,
            inv.verb,
            &subject,
            Outcome::Refused,
            &self.fields(),
            &self.error.msg,
        );
        self.error
    }

    /// Chained mode's: refused, once the old sandbox's interface was taken out of its netns
    /// here (`removed`: what became of it, or why it could not be removed).
    pub fn refuse_removed(
        self,
        inv: &Invocation,
        attachment: &Attachment,
        removed: std::result::Result<String, GuardError>,
    ) -> GuardError {
        let subject = inv.subject(Some(attachment), Some(self.key.pod()));
        let (level, done) = match removed {
            Ok(done) => (Level::Warn, done),
            Err(err) => (
                Level::Error,
                format!(
                    "{} could not be removed from its netns: {}",
                    attachment.ifname, err.msg
                ),
            ),
        };
        inv.log.event_with(
            level,
            inv.verb,
            &subject,
            Outcome::Refused,
            &self.fields(),
            &format!("{}; {done}", self.error.msg),
        );
        let details = format!("{} On this node, {done}.", self.error.details);
        self.error.with_details(details)
    }

    /// Delegate mode's: deferred until the name is free (`still_moved`), its interface
    /// removed here; `done` says what became of the interface.
    pub fn log_deferred(&self, inv: &Invocation, attachment: &Attachment, done: &str) {
        let subject = inv.subject(Some(attachment), Some(self.key.pod()));
        inv.log.event_with(
            Level::Warn,
            inv.verb,
            &subject,
            Outcome::Deferred,
            &self.fields(),
            &match self.uid.as_str() {
                "" => format!(
                    "DEL deferred: the API server has not answered for pod {} since this DEL of a sandbox of the boot before \
                     was first held; the primary gets it once the API answers that no other pod has that name; {done}",
                    self.key.pod()
                ),
                uid => format!(
                    "DEL deferred: pod {} is now pod UID {uid} in the API server; the primary gets this DEL once the API has \
                     no other pod of that name; {done}",
                    self.key.pod()
                ),
            },
        );
    }
}

/// What rule 7 found for a DEL.
pub enum Rule7 {
    /// The name moved to another pod the primary's state reaches.
    Moved(Box<Moved>),
    /// Not asked (no kubeconfig, pod UID or key), or the API's answer leaves the name here.
    NotMoved,
    /// Asked, and no answer came (logged).
    Unanswered,
}

impl Rule7 {
    pub fn moved(self) -> Option<Moved> {
        match self {
            Rule7::Moved(moved) => Some(*moved),
            Rule7::NotMoved | Rule7::Unanswered => None,
        }
    }
}

/// Rule 7 for a DEL rules 1-6 let go, of pod UID `uid`: whether the name has moved to another
/// pod the primary's state reaches. Logs only an unanswered ask.
pub fn name_moved(
    inv: &Invocation,
    attachment: &Attachment,
    keys: &[PodKey],
    uid: Option<&str>,
) -> Rule7 {
    let (Some(_), Some(uid), Some(key)) = (&inv.conf.kubeconfig, uid, keys.first()) else {
        return Rule7::NotMoved;
    };
    let Some(pod) = ask_for_verb(inv, attachment, key) else {
        return Rule7::Unanswered;
    };
    let node = this_node(inv);
    if !ownership::name_moved(uid, api_pod(&pod), inv.conf.pod_key_scope, &node) {
        return Rule7::NotMoved;
    }
    let other_uid = pod.uid.clone().unwrap_or_default();
    let place = match pod.node_name.as_deref() {
        Some(there) if there == node => "on this node".to_string(),
        Some(there) => format!("on node {there}"),
        None => "not yet on a node".to_string(),
    };
    let reach = match inv.conf.pod_key_scope {
        PodKeyScope::Cluster => {
            "podKeyScope is \"cluster\": the primary's state of the name is the whole cluster's"
        }
        PodKeyScope::Node => "the primary keeps its state of the name on this node",
    };
    let error = GuardError::new(
        Kind::StaleDel,
        format!(
            "stale DEL refused: pod {} is now pod UID {other_uid} {place} in the API server, not this sandbox's pod UID {uid}",
            key.pod()
        ),
    )
    .with_details(format!(
        "{reach}, so this DEL would free what the newer pod holds in it. The runtime retries the DEL; it passes once the API \
         server has no other pod of that name (the StatefulSet scaled down, or the pod deleted)."
    ));
    Rule7::Moved(Box::new(Moved {
        key: key.clone(),
        uid: other_uid,
        node: pod.node_name,
        error,
    }))
}

/// For a deferred DEL held by rule 7: whether the name is still another pod's. Asked with the
/// kubeconfig it was held with, else (gone, turned off, or refused at once) with the one this
/// verb's config names; an answer from either decides. With no answer it stays held (replayed
/// now, it could free a live pod's state), and the log says so. The local rule decides only
/// where the held-with file says the API server's view is off (`VIEW_OFF`, the installer's
/// turn-off) and this config names no kubeconfig that could answer instead: neither a missing
/// file nor a config without a kubeconfig says so alone, as CRI-O and multus hand a DEL the
/// config of its ADD, which may predate the view.
pub fn still_moved(inv: &Invocation, entry: &DeferredDel) -> bool {
    let (Some(moved), Some(uid)) = (&entry.moved_to, entry.pod_uid.as_deref()) else {
        return false;
    };
    still_held(inv, &entry.key, uid, moved)
}

/// `still_moved` for the hold `moved` of pod UID `uid`'s DEL under `key`, a deferred entry's
/// or a refused record's.
fn still_held(inv: &Invocation, key: &PodKey, uid: &str, moved: &MovedTo) -> bool {
    let held_with = moved.held_with();
    let this_network = inv
        .conf
        .kubeconfig
        .as_deref()
        .filter(|named| *named != moved.kubeconfig.as_path())
        .filter(|named| kubeconfig_at(named) == HeldWith::Present);
    let candidates: Vec<&std::path::Path> = [
        (held_with == HeldWith::Present).then_some(moved.kubeconfig.as_path()),
        this_network,
    ]
    .into_iter()
    .flatten()
    .collect();
    let warn = |text: String| {
        let subject = inv.subject(None, Some(key.pod()));
        inv.log.event(
            Level::Warn,
            inv.verb,
            &subject,
            Outcome::ApiUnanswered,
            &text,
        );
    };
    if candidates.is_empty() {
        if held_with == HeldWith::TurnedOff {
            warn(format!(
                "the kubeconfig {} this DEL was held with says the API server's view is turned off, and network {} names no other kubeconfig there to ask: the local rule decides it",
                moved.kubeconfig.display(),
                inv.conf.network,
            ));
            return false;
        }
        warn(format!(
            "the kubeconfig {} this DEL was held with is gone and network {} names no other kubeconfig there to ask: the DEL stays held (sandbox-guard --doctor says how out)",
            moved.kubeconfig.display(),
            inv.conf.network,
        ));
        return true;
    }
    let started = std::time::Instant::now();
    let mut unanswered = Vec::new();
    for kubeconfig in candidates {
        // One bound for the whole decision: a second ask only after a first that failed at
        // once (credentials refused, a file it cannot use), never after a timeout.
        if !unanswered.is_empty() && started.elapsed() >= pod_in_api::API_BOUND / 2 {
            break;
        }
        // Each further held key of a sweep would wait its bound for the same outcome.
        if went_unanswered(kubeconfig) {
            unanswered.push(format!(
                "with {}: no answer earlier in this sweep",
                kubeconfig.display()
            ));
            continue;
        }
        match pod_in_api::ask(kubeconfig, &key.pod_namespace, &key.pod_name) {
            Asked::Answered(answer) => {
                let scope = PodKeyScope::from_name(&moved.scope);
                return ownership::name_moved(uid, api_pod(&answer), scope, &moved.this_node);
            }
            Asked::Unknown(why) => {
                note_unanswered(kubeconfig);
                unanswered.push(format!("with {}: {why}", kubeconfig.display()));
            }
        }
    }
    warn(format!(
        "the API server could not be asked, so the DELs of pod {} held for it stay held: {}",
        key.pod(),
        unanswered.join("; ")
    ));
    true
}

/// The kubeconfigs this process asked with and got no answer from in time.
fn unanswered() -> std::sync::MutexGuard<'static, Vec<std::path::PathBuf>> {
    static UNANSWERED: std::sync::Mutex<Vec<std::path::PathBuf>> =
        std::sync::Mutex::new(Vec::new());
    UNANSWERED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn note_unanswered(kubeconfig: &std::path::Path) {
    let mut list = unanswered();
    if !list.iter().any(|path| path == kubeconfig) {
        list.push(kubeconfig.to_path_buf());
    }
}

/// Whether this process asked with `kubeconfig` and got no answer.
fn went_unanswered(kubeconfig: &std::path::Path) -> bool {
    unanswered().iter().any(|path| path == kubeconfig)
}

/// Before deferred DELs no answer has held are replayed (nobody owns their pod's name here
/// any more), of pod UIDs `uids`: whether they wait. Under `podKeyScope: "cluster"` a primary
/// keeps what any DEL of the name would free wherever the pod lives, and after a failover while
/// this node was down its owners here ended with the boot, unasked. So they wait while the
/// API server shows a pod of the name of another pod UID that is not on this node (on another,
/// or not yet placed), and while no answer comes (logged): a replay blocks no teardown, and
/// failing open could free a live pod's state. The installer's turn-off sign in the
/// kubeconfig leaves them to the local rule. Judged by the sweeping network's config: another
/// network's entries it replays have its primary's type (`free_here`), so the same state.
pub fn replay_waits(inv: &Invocation, key: &PodKey, uids: &[&str]) -> bool {
    let Some(kubeconfig) = asked_before_replays(inv) else {
        return false;
    };
    if replays_wait_unanswered(inv) {
        return true;
    }
    let then = "its deferred DELs wait for a later sweep";
    let Some(pod) = ask(inv, None, kubeconfig, key, then) else {
        return true;
    };
    let this = this_node(inv);
    pod.found
        && pod.uid.as_deref().is_none_or(|uid| !uids.contains(&uid))
        && pod.node_name.as_deref() != Some(this.as_str())
}

/// Whether `replay_waits` waits without asking: this process asked with the kubeconfig it
/// asks with and got no answer (the DEL that freed the name, or this sweep's key before), so
/// a new ask would wait its bound for the same outcome.
pub fn replays_wait_unanswered(inv: &Invocation) -> bool {
    asked_before_replays(inv).is_some_and(went_unanswered)
}

/// Whether this network's replays ask the API server before they replay (`replay_waits`):
/// `podKeyScope: "cluster"`, a kubeconfig, and not the off sign in it.
pub fn replays_ask(inv: &Invocation) -> bool {
    asked_before_replays(inv).is_some()
}

/// The kubeconfig `replay_waits` asks with, where it asks.
fn asked_before_replays(inv: &Invocation) -> Option<&std::path::Path> {
    if inv.conf.pod_key_scope != PodKeyScope::Cluster {
        return None;
    }
    let kubeconfig = inv.conf.kubeconfig.as_deref()?;
    (kubeconfig_at(kubeconfig) != HeldWith::TurnedOff).then_some(kubeconfig)
}

/// What the kubeconfig at `path` says: `HeldWith` read for any path.
fn kubeconfig_at(path: &std::path::Path) -> HeldWith {
    crate::state::held::held_with_at(path)
}

/// Whether rule 8 asks about an ADD of pod UID `uid` whose name's owner here is of pod UID
/// `owner` (`None`: no owner, or one whose pod UID is unknown). An owner of another pod UID: the
/// answer keeps the name here with the pod that has it. No owner: only a primary keyed
/// across the cluster can be hurt by this ADD, and only before it runs, so only where the
/// guard runs first: delegate mode with no plugin before it (chained, or delegate mode after
/// another plugin, it comes after the primary's ADD).
fn late_add_asks(inv: &Invocation, uid: &str, owner: Option<&str>) -> bool {
    match owner {
        Some(owner) => owner != uid,
        None => {
            inv.conf.pod_key_scope == PodKeyScope::Cluster
                && inv.conf.delegate.is_some()
                && inv.conf.prev_result.is_none()
        }
    }
}

/// Rule 8, before the ADD takes the name: refused when the API server's pod of the name has
/// another UID than this ADD's, asked where `late_add_asks`. Read without the store's lock. A
/// name the API has no pod of is let go: a static pod's mirror may not be there yet.
pub fn refuse_late_add(inv: &Invocation, attachment: &Attachment, key: &PodKey) -> Result<()> {
    let (Some(_), Some(uid)) = (&inv.conf.kubeconfig, attachment.pod.uid.as_deref()) else {
        return Ok(());
    };
    let owner_uid = Store::open_read_only(&inv.conf.state_dir)
        .ok()
        .and_then(|store| match store.load_owner(key) {
            Ok(Loaded::Valid(owner)) => owner.pod_uid,
            _ => None,
        });
    if !late_add_asks(inv, uid, owner_uid.as_deref()) {
        return Ok(());
    }
    let Some(pod) = ask_for_verb(inv, attachment, key) else {
        return Ok(());
    };
    if !ownership::late_add(uid, api_pod(&pod)) {
        return Ok(());
    }
    let other = pod.uid.as_deref().unwrap_or_default();
    let chained = inv.conf.delegate.is_none();
    let err = GuardError::new(
        Kind::Superseded,
        format!(
            "ADD refused: pod {} is pod UID {other} in the API server, not this sandbox's pod UID {uid}",
            key.pod()
        ),
    )
    .with_details(if chained {
        "This sandbox is of a pod deleted while its sandbox was made; taking the name would take it from the pod that has it \
         now. Chained, the primary has set this sandbox up already: its DELs are refused while the newer pod owns the name \
         here, then pass. The runtime removes the sandbox."
    } else {
        "This sandbox is of a pod deleted while its sandbox was made; the primary was not run for it. The runtime removes \
         the sandbox; nothing is to be done."
    });
    let subject = inv.subject(Some(attachment), Some(key.pod()));
    let fields = [("cause", CAUSE_LATE_ADD), ("owner", other)];
    if inv.conf.stale_del == StaleDelPolicy::Audit {
        let text = format!("audit mode let a late ADD through: {}", err.msg);
        inv.log.event_with(
            Level::Warn,
            inv.verb,
            &subject,
            Outcome::Audited,
            &fields,
            &text,
        );
        return Ok(());
    }
    inv.log.event_with(
        Level::Warn,
        inv.verb,
        &subject,
        Outcome::Refused,
        &fields,
        &err.msg,
    );
    Err(err)
}
