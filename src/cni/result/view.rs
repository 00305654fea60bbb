//! The typed view of a result: what the guard compares and shows.

use ipnetwork::IpNetwork;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{GuardError, Kind, Result};

#[derive(Debug, Deserialize)]
pub struct ResultView {
    #[serde(default)]
    pub interfaces: Vec<InterfaceView>,
    #[serde(default)]
    pub ips: Vec<IpView>,
    #[serde(default)]
    pub routes: Vec<RouteView>,
}

#[derive(Debug, Deserialize)]
pub struct InterfaceView {
    pub name: String,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub sandbox: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct IpView {
    #[serde(deserialize_with = "cidr")]
    pub address: IpNetwork,
}

/// The spec writes addresses in CIDR form; a bare address (which ipnetwork would read as a
/// /32) means the primary's result is broken, and checkpointing it would hide that.
fn cidr<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<IpNetwork, D::Error> {
    let text = <std::borrow::Cow<str>>::deserialize(deserializer)?;
    if !text.contains('/') {
        return Err(serde::de::Error::custom(format!(
            "address {text:?} has no prefix length"
        )));
    }
    text.parse().map_err(serde::de::Error::custom)
}

#[derive(Debug, Deserialize)]
pub struct RouteView {
    pub dst: IpNetwork,
    #[serde(default, deserialize_with = "gateway")]
    pub gw: Option<IpAddr>,
}

/// A gateway: `""` reads as none, as Go's `net.IP` reads it (libcni's types).
fn gateway<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<IpAddr>, D::Error> {
    match <Option<std::borrow::Cow<str>>>::deserialize(deserializer)? {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

impl ResultView {
    /// Reads a checkpointed result, leniently: records written before results were
    /// validated must stay readable by the dump, the doctor and CHECK.
    pub fn parse(raw: &RawValue) -> Result<ResultView> {
        let read = if is_legacy_text(raw) {
            serde_json::from_str::<LegacyView>(raw.get()).map(LegacyView::into_view)
        } else {
            serde_json::from_str(raw.get())
        };
        read.map_err(|e| {
            GuardError::new(
                Kind::Decode,
                format!(
                    "prevResult is not a CNI result ({e}): the plugin before sandbox-guard in the \
                     conflist must return a result with \"ips\" as CIDR strings"
                ),
            )
        })
    }

    /// The addresses as CIDR strings, sorted so two results compare regardless of order.
    pub fn cidrs(&self) -> Vec<String> {
        let mut cidrs: Vec<String> = self.ips.iter().map(|ip| ip.address.to_string()).collect();
        cidrs.sort();
        cidrs
    }
}

/// A 0.1.0 or 0.2.0 result, as a checkpoint keeps it: `ip4` and `ip6`, each with its routes.
#[derive(Deserialize)]
struct LegacyView {
    #[serde(default)]
    ip4: Option<LegacyIpView>,
    #[serde(default)]
    ip6: Option<LegacyIpView>,
}

#[derive(Deserialize)]
struct LegacyIpView {
    #[serde(deserialize_with = "cidr")]
    ip: IpNetwork,
    #[serde(default)]
    routes: Option<Vec<RouteView>>,
}

impl LegacyView {
    fn into_view(self) -> ResultView {
        let mut view = ResultView {
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
        };
        for config in [self.ip4, self.ip6].into_iter().flatten() {
            view.ips.push(IpView { address: config.ip });
            view.routes.extend(config.routes.unwrap_or_default());
        }
        view
    }
}

/// Whether a stored result is in the 0.1.0/0.2.0 shape (ADD checkpoints results that say
/// their version).
fn is_legacy_text(raw: &RawValue) -> bool {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(rename = "cniVersion", default)]
        cni_version: Option<String>,
    }
    serde_json::from_str::<Peek>(raw.get())
        .is_ok_and(|p| matches!(p.cni_version.as_deref(), Some("0.1.0" | "0.2.0")))
}
