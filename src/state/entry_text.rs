//! A record's sealed text as the symlink entries of format 1 held it on a journal: the store's
//! field names, with the punctuation around them, written as one byte each. This release
//! writes plain files and only reads these (`expand`); `compact` remains for tests that make
//! a store of the releases before. The bytes used are control characters that JSON never
//! carries raw (a string escapes them, and whitespace is only space, tab, newline and
//! return), so expanding is exact, and a text holding none of them (an ownership, a record of
//! another form) is its own expansion. The table is part of the format: never change an
//! entry.

use std::borrow::Cow;

/// In the order of `CODES`. None is a prefix of another, so at most one matches at a place.
const WORDS: [&str; 28] = [
    r#""checksum":"sha256:"#,
    r#"","record":{"network":""#,
    r#"","containerId":""#,
    r#"","ifName":""#,
    r#"","podNamespace":""#,
    r#"","podName":""#,
    r#"","podUid":""#,
    r#"","infraContainerId":""#,
    r#"","netns":""#,
    r#"","cniVersion":""#,
    r#"","generation":"#,
    r#","createdAt":""#,
    r#"","updatedAt":""#,
    r#"","prevResult":{"cniVersion":""#,
    r#"","interfaces":[{"name":""#,
    r#""},{"name":""#,
    r#"","mac":""#,
    r#"","sandbox":""#,
    r#""ips":[{"address":""#,
    r#"","gateway":""#,
    r#","interface":"#,
    r#""routes":["#,
    r#"{"dst":""#,
    r#","links":{"state":"observed","name":""#,
    r#"","kind":""#,
    r#","mtu":"#,
    r#","identity":{"netnsDev":"#,
    r#","netnsInode":"#,
];

/// 0x01 to 0x1f but tab, newline and carriage return, which JSON may hold between tokens.
const CODES: [u8; 28] = [
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0b, 0x0c, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13,
    0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
];

/// Whether `byte` is one of `CODES`, in comparisons only: `expand` scans every text read
/// with it, and so it vectorises.
fn is_code(byte: u8) -> bool {
    (1..0x20).contains(&byte) && byte != b'\t' && byte != b'\n' && byte != b'\r'
}

fn word_of(code: u8) -> Option<&'static str> {
    if !is_code(code) {
        return None;
    }
    CODES
        .iter()
        .position(|&c| c == code)
        .map(|index| WORDS[index])
}

/// `sealed` with each word of the table as its code; `None` for a text that holds a code
/// already, which no JSON does: it could not be told apart when expanded.
pub fn compact(sealed: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(sealed.len());
    let mut at = 0;
    'text: while let Some(&byte) = sealed.get(at) {
        if is_code(byte) {
            return None;
        }
        if matches!(byte, b'"' | b',' | b'{') {
            let rest = &sealed[at..];
            for (word, code) in WORDS.iter().zip(CODES) {
                let word = word.as_bytes();
                // The second byte first: it tells most words apart without a call.
                if rest.get(1) == word.get(1) && rest.starts_with(word) {
                    out.push(code);
                    at += word.len();
                    continue 'text;
                }
            }
        }
        out.push(byte);
        at += 1;
    }
    Some(out)
}

/// The text `compact` was given; any other text as it is.
pub fn expand(text: &[u8]) -> Cow<'_, [u8]> {
    // A fold, not `any`: a loop with no early exit vectorises.
    if !text
        .iter()
        .fold(false, |found, &byte| found | is_code(byte))
    {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len() * 2);
    for &byte in text {
        match word_of(byte) {
            Some(word) => out.extend_from_slice(word.as_bytes()),
            None => out.push(byte),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_word_is_a_prefix_of_another_and_no_code_is_json_whitespace() {
        for (i, a) in WORDS.iter().enumerate() {
            for (j, b) in WORDS.iter().enumerate() {
                assert!(i == j || !b.starts_with(a), "{a} is a prefix of {b}");
            }
            assert!(matches!(a.as_bytes()[0], b'"' | b',' | b'{'), "{a}");
        }
        for code in CODES {
            assert!((1..0x20).contains(&code) && !b"\t\n\r".contains(&code));
        }
        let coded: Vec<u8> = (0..=255).filter(|&byte| is_code(byte)).collect();
        assert_eq!(coded, CODES);
    }

    #[test]
    fn a_record_comes_back_byte_for_byte_and_shorter() {
        let text = br#"{"checksum":"sha256:00","record":{"network":"n","containerId":"c","ifName":"eth0","podNamespace":"ns","podName":"p","podUid":"u","infraContainerId":"c","netns":"/run/netns/x","cniVersion":"1.0.0","generation":2,"createdAt":"t","updatedAt":"t","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"0a"},{"name":"eth0","mac":"0b","sandbox":"/run/netns/x"}],"ips":[{"address":"10.0.0.2/8","gateway":"10.0.0.1","interface":1}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}},"links":{"state":"observed","name":"eth0","kind":"veth","mtu":1500},"identity":{"netnsDev":4,"netnsInode":1}}}"#;
        let compacted = compact(text).unwrap();
        assert!(compacted.len() < text.len() / 2, "{}", compacted.len());
        assert_eq!(expand(&compacted), &text[..]);
        // Whitespace and words split by it, as a runtime's prevResult may hold them.
        let spaced = b"{\"mac\" :\t\"x\",\r\n\"routes\":[]}";
        assert_eq!(expand(&compact(spaced).unwrap()), &spaced[..]);
    }

    #[test]
    fn a_text_holding_a_code_is_not_compacted_and_plain_text_expands_to_itself() {
        assert_eq!(compact(b"{\"a\":\"\x01\"}"), None);
        let plain = br#"{"checksum":"sha256:00","record":{}}"#;
        assert!(matches!(expand(plain), Cow::Borrowed(_)));
    }
}
