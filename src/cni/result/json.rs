//! A result's JSON read member by member, each value left as its text, and the messages that
//! say where in the result a value sits.

use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// Where in the result a value sits, for a message: written out only when there is one, so
/// that a valid result, the case on every ADD, formats no path.
pub(super) type At<'a> = &'a dyn fmt::Display;

/// Where the member `.1` of the object at `.0` sits.
pub(super) struct MemberAt<'a>(pub(super) At<'a>, pub(super) &'a str);

impl fmt::Display for MemberAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// Where the item `.1` of the array at `.0` sits.
pub(super) struct ItemAt<'a>(pub(super) At<'a>, pub(super) usize);

impl fmt::Display for ItemAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// A problem found in the result: one sentence naming the member and what is wrong.
pub(super) type Found<T> = std::result::Result<T, String>;

pub(super) fn write_object<'a>(
    out: &mut String,
    members: impl Iterator<Item = (&'a str, &'a str)>,
) {
    out.push('{');
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&json_string(key));
        out.push(':');
        out.push_str(value);
    }
    out.push('}');
}

pub(super) fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// One JSON object of the result: its members in order, their values unparsed.
pub(super) struct Members(pub(super) Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Members, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

impl Members {
    /// The value of a key the spec defines. `null` counts as absent, as libcni's Go decoder
    /// reads it; a key given twice is refused, since readers would disagree on which counts.
    pub(super) fn get(&self, key: &str, at: At) -> Found<Option<&RawValue>> {
        let mut values = self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| &**v);
        let first = values.next();
        if values.next().is_some() {
            return Err(format!("{at} has the key \"{key}\" twice"));
        }
        Ok(first.filter(|v| kind(v) != Json::Null))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Json {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Json::Object => "an object",
            Json::Array => "an array",
            Json::String => "a string",
            Json::Number => "a number",
            Json::Bool => "a boolean",
            Json::Null => "null",
        })
    }
}

/// The type of a value, from its first byte: the text is JSON already.
pub(super) fn kind(value: &RawValue) -> Json {
    match value.get().trim_start().as_bytes().first() {
        Some(b'{') => Json::Object,
        Some(b'[') => Json::Array,
        Some(b'"') => Json::String,
        Some(b't' | b'f') => Json::Bool,
        Some(b'n') => Json::Null,
        _ => Json::Number,
    }
}

pub(super) fn expect(value: &RawValue, at: At, want: Json) -> Found<()> {
    let have = kind(value);
    if have == want {
        Ok(())
    } else {
        Err(format!("{at} is {have}, not {want}"))
    }
}

pub(super) fn read_members(value: &RawValue, at: At) -> Found<Members> {
    serde_json::from_str(value.get()).map_err(|e| format!("{at} cannot be read: {e}"))
}

pub(super) fn object(value: &RawValue, at: At) -> Found<Members> {
    expect(value, at, Json::Object)?;
    read_members(value, at)
}

pub(super) fn array(value: &RawValue, at: At) -> Found<Vec<Box<RawValue>>> {
    expect(value, at, Json::Array)?;
    serde_json::from_str(value.get()).map_err(|e| format!("{at} cannot be read: {e}"))
}

pub(super) fn string(value: &RawValue, at: At) -> Found<String> {
    expect(value, at, Json::String)?;
    serde_json::from_str(value.get()).map_err(|e| format!("{at} cannot be read: {e}"))
}

pub(super) fn number(value: &RawValue, at: At, what: &str) -> Found<serde_json::Number> {
    if kind(value) != Json::Number {
        return Err(format!("{at} is {}, not {what}", kind(value)));
    }
    // A number too large for a double does not read: it is not an integer we take either.
    serde_json::from_str(value.get())
        .map_err(|_| format!("{at} {} is not {what}", shown_number(value.get())))
}

pub(super) fn unsigned(value: &RawValue, at: At) -> Found<u64> {
    let what = "an unsigned integer";
    number(value, at, what)?
        .as_u64()
        .ok_or_else(|| format!("{at} {} is not {what}", shown_number(value.get())))
}

pub(super) fn integer(value: &RawValue, at: At) -> Found<()> {
    let what = "an integer";
    let n = number(value, at, what)?;
    if n.is_i64() || n.is_u64() {
        Ok(())
    } else {
        Err(format!("{at} {} is not {what}", shown_number(value.get())))
    }
}

/// A gateway: an IP address, or `""` for none (Go's `net.IP` reads it so, and libcni with it).
pub(super) fn gateway_ip(value: &RawValue, at: At) -> Found<Option<IpAddr>> {
    let text = string(value, at)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| format!("{at} {} is not an IP address", shown(&text)))
}

pub(super) fn cidr_member(value: &RawValue, at: At) -> Found<IpNetwork> {
    let text = string(value, at)?;
    parse_cidr(&text).ok_or_else(|| {
        if text.contains('/') {
            format!("{at} {} is not an address in CIDR form", shown(&text))
        } else {
            format!(
                "{at} {} has no prefix length: the spec wants CIDR form",
                shown(&text)
            )
        }
    })
}

/// `address/prefix` as Go's `net.ParseCIDR` reads it: a plain IPv4 or IPv6 address, a
/// decimal prefix no longer than the address. The address keeps its host bits.
pub(super) fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (address, prefix) = text.split_once('/')?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNetwork::new(address.parse().ok()?, prefix.parse().ok()?).ok()
}

/// An optional member, read by `read` when present and not null.
pub(super) fn optional<T>(
    members: &Members,
    at: At,
    key: &str,
    read: fn(&RawValue, At) -> Found<T>,
) -> Found<Option<T>> {
    members
        .get(key, at)?
        .map(|value| read(value, &MemberAt(at, key)))
        .transpose()
}

/// A value for a message: quoted, escaped, cut short so the message stays one line.
pub(super) fn shown(text: &str) -> String {
    const MAX: usize = 48;
    let mut out = String::from("\"");
    for c in text.chars() {
        let escaped: String = c.escape_debug().collect();
        if out.len() + escaped.len() > MAX {
            out.push_str("\"...");
            return out;
        }
        out.push_str(&escaped);
    }
    out.push('"');
    out
}

/// A number for a message, cut short (JSON numbers are ASCII).
pub(super) fn shown_number(text: &str) -> String {
    const MAX: usize = 24;
    match text.get(..MAX) {
        Some(head) if text.len() > MAX => format!("{head}..."),
        _ => text.to_string(),
    }
}
