//! CRI `RuntimeService/Status` with `verbose: true`: the runtime's `info` map, which for
//! containerd holds `cniconfig` (what its CNI plugin loaded) and `lastCNILoadStatus`.
//! The protobuf is written and read by hand: `StatusRequest{verbose = 1}` is two bytes, and
//! of `StatusResponse` only field 2, `map<string, string> info`, is kept.

use std::io::{Read, Write};

use super::http2;

/// containerd 1.7+ and every CRI-O serve `v1`; containerd 1.6 serves both, 1.5 and older
/// only `v1alpha2`.
const PATHS: [&str; 2] = [
    "/runtime.v1.RuntimeService/Status",
    "/runtime.v1alpha2.RuntimeService/Status",
];

/// `StatusRequest { verbose: true }`: field 1, varint, 1.
const VERBOSE: [u8; 2] = [0x08, 0x01];

/// The runtime's verbose info, each key with its value as sent (JSON for containerd).
pub fn info<S: Read + Write>(
    mut connect: impl FnMut() -> Result<S, String>,
) -> Result<Vec<(String, String)>, String> {
    let mut errors = Vec::new();
    for path in PATHS {
        // A failed call leaves the connection in an unknown state: each path gets its own.
        let answer = connect().and_then(|mut stream| http2::unary(&mut stream, path, &VERBOSE));
        match answer.and_then(|message| status_info(&message)) {
            Ok(info) => return Ok(info),
            Err(e) => errors.push(format!("{path}: {e}")),
        }
    }
    Err(errors.join("; "))
}

/// CRI `RuntimeService/Version` (v1): `(runtime_name, runtime_version)` of the
/// `VersionResponse` (fields 2 and 3), e.g. `("cri-o", "1.33.0")`. The request is the empty
/// `VersionRequest`.
pub fn version<S: Read + Write>(stream: &mut S) -> Result<(String, String), String> {
    let message = http2::unary(stream, "/runtime.v1.RuntimeService/Version", &[])?;
    let (mut name, mut version) = (String::new(), String::new());
    let mut at = 0;
    while at < message.len() {
        match field(&message, &mut at)? {
            (2, Value::Bytes(b)) => name = text(b)?,
            (3, Value::Bytes(b)) => version = text(b)?,
            _ => {}
        }
    }
    Ok((name, version))
}

/// A protobuf field's payload, as far as this reader needs to tell them apart.
enum Value<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

/// Reads one field at `at`, or why it cannot.
fn field<'a>(buf: &'a [u8], at: &mut usize) -> Result<(u64, Value<'a>), String> {
    let key = varint(buf, at)?;
    let number = key >> 3;
    let value = match key & 7 {
        0 => {
            varint(buf, at)?;
            Value::Varint
        }
        1 => skip(buf, at, 8).map(|_| Value::Fixed)?,
        2 => {
            let len = usize::try_from(varint(buf, at)?).map_err(|_| "a length past memory")?;
            Value::Bytes(skip(buf, at, len)?)
        }
        5 => skip(buf, at, 4).map(|_| Value::Fixed)?,
        wire => {
            return Err(format!(
                "protobuf wire type {wire} (field {number}) is not read here"
            ));
        }
    };
    Ok((number, value))
}

fn skip<'a>(buf: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8], String> {
    let end = at
        .checked_add(len)
        .filter(|end| *end <= buf.len())
        .ok_or("a protobuf field runs past the message")?;
    let bytes = &buf[*at..end];
    *at = end;
    Ok(bytes)
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf
            .get(*at)
            .ok_or("a protobuf varint runs past the message")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a protobuf varint longer than ten bytes".to_string())
}

/// `StatusResponse.info` (field 2): map entries with key = 1 and value = 2, both strings.
pub fn status_info(message: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut info = Vec::new();
    let mut at = 0;
    while at < message.len() {
        if let (2, Value::Bytes(entry)) = field(message, &mut at)? {
            let (mut key, mut value) = (String::new(), String::new());
            let mut inner = 0;
            while inner < entry.len() {
                match field(entry, &mut inner)? {
                    (1, Value::Bytes(b)) => key = text(b)?,
                    (2, Value::Bytes(b)) => value = text(b)?,
                    _ => {}
                }
            }
            info.push((key, value));
        }
    }
    Ok(info)
}

fn text(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a protobuf string that is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::runtime::http2::tests::{Canned, XorShift, server_answer};

    fn varint(out: &mut Vec<u8>, mut value: usize) {
        while value >= 128 {
            out.push((value % 128) as u8 | 0x80);
            value /= 128;
        }
        out.push(value as u8);
    }

    fn entry(key: &str, value: &str) -> Vec<u8> {
        let mut inner = vec![0x0a, key.len() as u8];
        inner.extend_from_slice(key.as_bytes());
        inner.push(0x12);
        varint(&mut inner, value.len());
        inner.extend_from_slice(value.as_bytes());
        let mut out = vec![0x12];
        varint(&mut out, inner.len());
        out.extend(inner);
        out
    }

    /// Status (field 1) and runtime handlers (3) around the info entries, as containerd
    /// orders them.
    fn response(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut out = vec![0x0a, 0x04, 0x0a, 0x02, 0x08, 0x01];
        for (k, v) in entries {
            out.extend(entry(k, v));
        }
        out.extend([
            0x1a, 0x02, 0x0a, 0x00, 0x25, 1, 2, 3, 4, 0x09, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        out
    }

    #[test]
    fn reads_the_info_map() {
        let long = "x".repeat(200);
        let message = response(&[("cniconfig", "{}"), ("lastCNILoadStatus", &long)]);
        assert_eq!(
            status_info(&message).unwrap(),
            vec![
                ("cniconfig".to_string(), "{}".to_string()),
                ("lastCNILoadStatus".to_string(), long)
            ]
        );
    }

    #[test]
    fn tries_v1alpha2_after_v1() {
        let message = response(&[("cniconfig", "{}")]);
        let mut answers = vec![server_answer(&message), http2::tests::trailers_only()];
        let mut asked = 0;
        let info = info(|| {
            asked += 1;
            Ok(Canned::new(answers.pop().unwrap()))
        })
        .unwrap();
        assert_eq!(asked, 2);
        assert_eq!(info[0].0, "cniconfig");
        let both = super::info(|| Ok(Canned::new(Vec::new()))).unwrap_err();
        assert!(
            both.contains("v1.Runtime") && both.contains("v1alpha2"),
            "{both}"
        );
    }

    #[test]
    fn reads_the_runtime_version() {
        let mut message = Vec::new();
        for (number, text) in [(1u8, "0.1.0"), (2, "cri-o"), (3, "1.33.2"), (4, "v1")] {
            message.extend([number << 3 | 2, text.len() as u8]);
            message.extend(text.as_bytes());
        }
        let mut answer = Canned::new(server_answer(&message));
        assert_eq!(
            version(&mut answer).unwrap(),
            ("cri-o".to_string(), "1.33.2".to_string())
        );
        assert!(version(&mut Canned::new(Vec::new())).is_err());
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        for bad in [
            vec![0x12],
            vec![0x12, 0x05, 0x0a],
            vec![0x12, 0x02, 0x0a, 0x09],
            vec![0x13],
            vec![0x12, 0x03, 0x0a, 0x01, 0xff],
            vec![0xff; 11],
            vec![
                0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ] {
            assert!(status_info(&bad).is_err(), "{bad:?}");
        }
        let good = response(&[("cniconfig", "{\"a\":1}"), ("k", "v")]);
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        for _ in 0..20_000 {
            let mut input = good.clone();
            let at = rng.next_u64() as usize % input.len();
            input[at] = rng.next_u64() as u8;
            input.truncate(rng.next_u64() as usize % (input.len() + 1) + at / 2);
            let _ = status_info(&input);
        }
    }
}
