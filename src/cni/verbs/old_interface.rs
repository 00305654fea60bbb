//! The interface of a sandbox whose DEL the primary does not get now (delegate mode's
//! deferred DEL; either mode's DEL held because the pod's name moved): taken out of that
//! sandbox's netns here, so the old netns stops answering for the pod's address while its DEL
//! waits. Only the interface ADD recorded, and only where the netns is provably the recorded
//! one and no live sandbox's (`kernel::teardown`).

use serde_json::value::RawValue;

use crate::cni::env::Attachment;
use crate::error::Result;
use crate::kernel::link_facts::LinkFacts;
use crate::kernel::teardown::{self, Teardown};
use crate::state::checkpoint::{Checkpoint, SandboxIdentity};
use crate::state::{Loaded, Store};

/// What ADD recorded of the old sandbox's interface.
pub struct Recorded<'a> {
    pub netns: &'a str,
    pub mac: Option<&'a str>,
    pub identity: Option<&'a SandboxIdentity>,
    /// Recorded in this boot (`Store::of_this_boot`): a netns's device, inode and cookie and a
    /// link's index count again from each boot, so an identity of another proves nothing.
    pub this_boot: bool,
}

/// The MAC ADD saw on the sandbox's interface, else the one the primary's result gives an
/// interface of that name inside a sandbox.
pub fn recorded_mac(
    record: Option<&Checkpoint>,
    prev_result: Option<&RawValue>,
    if_name: &str,
) -> Option<String> {
    let observed = record.and_then(|r| match &r.links {
        Some(LinkFacts::Observed(facts)) => facts.mac.clone(),
        _ => None,
    });
    observed.or_else(|| {
        let view = crate::cni::result::ResultView::parse(prev_result?).ok()?;
        view.interfaces
            .into_iter()
            .find(|i| i.name == if_name && i.sandbox.is_some())
            .and_then(|i| i.mac)
    })
}

/// The netns a DEL's interface is removed from: the DEL's own, else (a repeated DEL without
/// one) the recorded path, unless it was recorded in another boot (`Store::of_this_boot`).
pub fn netns_of<'a>(attachment: &'a Attachment, recorded: &'a str, this_boot: bool) -> &'a str {
    match (attachment.netns.as_str(), this_boot) {
        ("", true) => recorded,
        ("", false) => "",
        (own, _) => own,
    }
}

/// The netns (device, inode) of every live sandbox the store knows but `container_id`'s, when
/// `netns` is a namespace at all: the old sandbox's teardown must never reach into one of
/// them. The old sandbox's own other interfaces (an owner of several, `podKey: "name"`) are
/// no live sandbox's: its DEL of each comes next. A rare path, so it may list the records.
pub fn live_netns(store: &Store, container_id: &str, netns: &str) -> Vec<(u64, u64)> {
    if crate::kernel::netns::netns_identity(netns).is_none() {
        return Vec::new();
    }
    let Ok(records) = store.list_records() else {
        return Vec::new();
    };
    records
        .into_iter()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Valid(record) if record.container_id != container_id => record
                .identity
                .map(|id| (id.netns_dev, id.netns_inode))
                .or_else(|| crate::kernel::netns::netns_identity(&record.netns)),
            _ => None,
        })
        .collect()
}

/// Takes the old sandbox's interface out of its netns (never one of `live`), if it is
/// provably the one recorded: what became of it, for the log.
pub fn remove(attachment: &Attachment, recorded: &Recorded, live: &[(u64, u64)]) -> Result<String> {
    let netns = recorded.netns;
    if !recorded.this_boot {
        return Ok(format!(
            "nothing removed from {netns}: the interface was recorded in another boot, so its identity proves nothing now; it goes when the primary gets this DEL"
        ));
    }
    let identity = recorded.identity;
    let kernel_view = teardown::Recorded {
        netns,
        if_name: &attachment.ifname,
        mac: recorded.mac,
        netns_id: identity.map(|id| (id.netns_dev, id.netns_inode)),
        netns_cookie: identity.and_then(|id| id.netns_cookie),
        if_index: identity.and_then(|id| id.if_index),
        if_kind: identity.and_then(|id| id.if_kind.as_deref()),
    };
    teardown::remove_interface(&kernel_view, live).map(|outcome| match outcome {
        Teardown::Removed => format!(
            "removed {} ({}) from its netns {netns}",
            attachment.ifname,
            recorded.mac.unwrap_or("no MAC recorded")
        ),
        Teardown::Absent => "its interface is gone already".to_string(),
        Teardown::LeftAlone(why) => {
            format!("nothing removed from {netns}: {why}; it goes when the primary gets this DEL")
        }
    })
}
