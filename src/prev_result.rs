//! A typed view of the primary plugin's result. The bytes themselves are passed on and
//! stored verbatim; this view only reads what the guard compares and shows.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
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
fn cidr<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<IpNetwork, D::Error> {
    let text = <std::borrow::Cow<str>>::deserialize(deserializer)?;
    if !text.contains('/') {
        return Err(serde::de::Error::custom(format!("address {text:?} has no prefix length")));
    }
    text.parse().map_err(serde::de::Error::custom)
}

#[derive(Debug, Deserialize)]
pub struct RouteView {
    pub dst: IpNetwork,
    #[serde(default)]
    pub gw: Option<IpAddr>,
}

impl ResultView {
    pub fn parse(raw: &RawValue) -> Result<ResultView> {
        serde_json::from_str(raw.get()).map_err(|e| {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn reads_a_result() {
        let view = ResultView::parse(&raw(
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/run/netns/x"}],
               "ips":[{"address":"10.1.0.9/24","gateway":"10.1.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0"}],"custom":1}"#,
        ))
        .unwrap();
        assert_eq!(view.cidrs(), vec!["10.1.0.9/24"]);
        assert_eq!(view.interfaces[0].mac.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
    }

    #[test]
    fn rejects_what_is_not_a_result() {
        for text in [r#""a string""#, r#"{"ips":"10.0.0.1"}"#, r#"{"ips":[{"address":"not-a-cidr"}]}"#, r#"{"ips":[{"address":"10.0.0.1"}]}"#, "[1]"] {
            assert_eq!(ResultView::parse(&raw(text)).unwrap_err().code(), 6, "{text}");
        }
    }
}
