//! JSON that keeps its keys in the order the file had them, and is written back in the
//! file's own style (its indent, its final newline). serde_json's `Value` sorts keys, which
//! would reorder every key of the primary's file on the first install; the plugin's own
//! paths keep using `Value`, so this type costs them nothing.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    pub fn object(pairs: Vec<(&str, Json)>) -> Json {
        Json::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Object(pairs) => pairs.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// The semantic value: key order does not count, as for libcni.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a parsed document serializes")
    }

    pub fn same_as(&self, other: &Json) -> bool {
        self.to_value() == other.to_value()
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(text) => s.serialize_str(text),
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(pairs) => {
                let mut map = s.serialize_map(Some(pairs.len()))?;
                for (k, v) in pairs {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(n)
            .map(Json::Number)
            .ok_or_else(|| E::custom("not a JSON number"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut pairs: Vec<(String, Json)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            // A repeated key: the last value wins, as Go's decoder into a map does.
            match pairs.iter_mut().find(|(k, _)| *k == key) {
                Some(pair) => pair.1 = value,
                None => pairs.push((key, value)),
            }
        }
        Ok(Json::Object(pairs))
    }
}

/// A config file: its JSON and how it was written.
#[derive(Debug, Clone)]
pub struct Doc {
    pub root: Json,
    /// `None`: on one line.
    indent: Option<String>,
    final_newline: bool,
}

impl Doc {
    pub fn parse(bytes: &[u8]) -> Result<Doc, serde_json::Error> {
        let root: Json = serde_json::from_slice(bytes)?;
        let text = String::from_utf8_lossy(bytes);
        let body = text.trim_end();
        let indent = body.contains('\n').then(|| {
            body.lines()
                .skip(1)
                .map(|line| &line[..line.len() - line.trim_start().len()])
                .find(|lead| !lead.is_empty())
                .unwrap_or("  ")
                .to_string()
        });
        Ok(Doc {
            root,
            indent,
            final_newline: text.ends_with('\n'),
        })
    }

    /// A new file in the style this project writes: two spaces, a final newline.
    pub fn new(root: Json) -> Doc {
        Doc {
            root,
            indent: Some("  ".to_string()),
            final_newline: true,
        }
    }

    pub fn with_root(&self, root: Json) -> Doc {
        Doc {
            root,
            ..self.clone()
        }
    }

    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match &self.indent {
            Some(indent) => {
                let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
                let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
                self.root.serialize(&mut ser).expect("serialize to memory");
            }
            None => serde_json::to_writer(&mut out, &self.root).expect("serialize to memory"),
        }
        if self.final_newline {
            out.push(b'\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order_and_style() {
        let text = "{\n    \"name\": \"n\",\n    \"cniVersion\": \"1.0.0\",\n    \"plugins\": [\n        {\n            \"type\": \"x\",\n            \"mtu\": 1.5\n        }\n    ]\n}\n";
        let doc = Doc::parse(text.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(doc.render()).unwrap(), text);
        let compact = "{\"type\":\"macvlan\",\"b\":[1,2]}";
        assert_eq!(
            Doc::parse(compact.as_bytes()).unwrap().render(),
            compact.as_bytes()
        );
    }

    #[test]
    fn order_does_not_count_in_comparison() {
        let a: Json = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
        let b: Json = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap();
        assert!(a.same_as(&b));
        assert_ne!(a, b);
    }
}
