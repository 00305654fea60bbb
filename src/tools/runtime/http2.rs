//! One gRPC unary call over HTTP/2 cleartext with prior knowledge, the way a CRI socket is
//! spoken to, in the few frames it takes: the client preface and SETTINGS, one HEADERS
//! block of literal fields (no Huffman, no table), one DATA frame, then the server's frames
//! until its END_STREAM. Only the answer's DATA is kept; the response headers are not
//! decoded, so a call without DATA (a Trailers-Only error such as an unknown method) is a
//! failure. A gRPC client crate would pull an async runtime into the binary every pod start
//! execs; this asks for what the readiness probe needs and nothing more.

use std::io::{Read, Write};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;

const STREAM: u32 = 1;
/// SETTINGS_MAX_FRAME_SIZE's default, which the client never raises: a larger frame is a
/// broken peer.
const MAX_FRAME: usize = 16_384;
/// The windows the client opens, so that it never has to grant more: an answer is cut off at
/// `MAX_ANSWER`, well inside them.
const WINDOW: u32 = 1 << 24;
/// containerd's verbose Status is a few KiB to a few hundred with many runtime handlers.
pub const MAX_ANSWER: usize = 4 << 20;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix, the prefix's other bits zero.
fn hpack_int(out: &mut Vec<u8>, value: usize, n: u32) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(value as u8);
        return;
    }
    out.push(max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Literal header fields without indexing, new name, neither side Huffman-coded.
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(&mut out, name.len(), 7);
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, value.len(), 7);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// What the client writes for a call of `path` with the protobuf `message`.
pub fn request(path: &str, message: &[u8]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    let mut settings = Vec::new();
    // SETTINGS_ENABLE_PUSH = 0, SETTINGS_INITIAL_WINDOW_SIZE = WINDOW.
    settings.extend_from_slice(&[0x00, 0x02, 0, 0, 0, 0]);
    settings.extend_from_slice(&[0x00, 0x04]);
    settings.extend_from_slice(&WINDOW.to_be_bytes());
    out.extend(frame(SETTINGS, 0, 0, &settings));
    // The connection's window is not covered by SETTINGS.
    out.extend(frame(0x8, 0, 0, &(WINDOW - 65_535).to_be_bytes()));
    let headers = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    out.extend(frame(HEADERS, END_HEADERS, STREAM, &headers));
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    out.extend(frame(DATA, END_STREAM, STREAM, &body));
    out
}

/// Sends the call and reads the answer's gRPC message (the 5-byte prefix removed).
/// Any byte sequence from the peer gives an answer or an error, never a panic.
pub fn unary<S: Read + Write>(
    stream: &mut S,
    path: &str,
    message: &[u8],
) -> Result<Vec<u8>, String> {
    stream
        .write_all(&request(path, message))
        .map_err(|e| format!("cannot send the call: {e}"))?;
    let body = read_answer(stream)?;
    grpc_message(&body)
}

fn read_answer<S: Read + Write>(stream: &mut S) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; 9];
        stream
            .read_exact(&mut head)
            .map_err(|e| format!("the answer ended early: {e}"))?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_FRAME {
            return Err(format!(
                "a frame of {len} bytes, more than the {MAX_FRAME} allowed"
            ));
        }
        let mut payload = vec![0u8; len];
        stream
            .read_exact(&mut payload)
            .map_err(|e| format!("the answer ended inside a frame: {e}"))?;
        match kind {
            DATA if id == STREAM => {
                body.extend_from_slice(unpadded(&payload, flags)?);
                if body.len() > MAX_ANSWER {
                    return Err(format!("an answer of more than {MAX_ANSWER} bytes"));
                }
                if flags & END_STREAM != 0 {
                    return Ok(body);
                }
            }
            HEADERS if id == STREAM && flags & END_STREAM != 0 => {
                // Trailers: grpc-status 0 comes after the DATA; a call without DATA failed.
                return if body.is_empty() {
                    Err("the runtime answered without a message (the method is unknown to it, or failed)".to_string())
                } else {
                    Ok(body)
                };
            }
            SETTINGS if flags & ACK == 0 => stream
                .write_all(&frame(SETTINGS, ACK, 0, &[]))
                .map_err(|e| format!("cannot acknowledge the settings: {e}"))?,
            PING if flags & ACK == 0 => stream
                .write_all(&frame(PING, ACK, 0, &payload))
                .map_err(|e| format!("cannot answer a ping: {e}"))?,
            RST_STREAM if id == STREAM => {
                return Err(format!(
                    "the runtime reset the call (code {})",
                    error_code(&payload)
                ));
            }
            GOAWAY => {
                return Err(format!(
                    "the runtime closed the connection (GOAWAY, code {})",
                    error_code(payload.get(4..).unwrap_or_default())
                ));
            }
            // Response headers, window updates, priorities, other streams: nothing to do.
            _ => {}
        }
    }
}

fn error_code(bytes: &[u8]) -> u32 {
    match bytes {
        [a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]),
        _ => 0,
    }
}

fn unpadded(payload: &[u8], flags: u8) -> Result<&[u8], String> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or("a padded frame without its pad length")?;
    rest.len()
        .checked_sub(pad as usize)
        .map(|end| &rest[..end])
        .ok_or_else(|| "a frame's padding longer than the frame".to_string())
}

/// The one message of a unary answer, out of its length-prefixed gRPC framing.
fn grpc_message(body: &[u8]) -> Result<Vec<u8>, String> {
    let (prefix, rest) = body
        .split_at_checked(5)
        .ok_or("the answer is shorter than its gRPC prefix")?;
    if prefix[0] != 0 {
        return Err("the runtime compressed its answer, which was not asked for".to_string());
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    rest.get(..len).map(<[u8]>::to_vec).ok_or_else(|| {
        format!(
            "the answer's message is cut short ({} of {len} bytes)",
            rest.len()
        )
    })
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A peer that answers with fixed bytes and keeps what the client wrote.
    pub struct Canned {
        pub input: std::io::Cursor<Vec<u8>>,
        pub written: Vec<u8>,
    }

    impl Canned {
        pub fn new(input: Vec<u8>) -> Canned {
            Canned {
                input: std::io::Cursor::new(input),
                written: Vec::new(),
            }
        }
    }

    impl Read for Canned {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Canned {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What a Go gRPC server sends for an answer `message`: SETTINGS, response headers (opaque
    /// here), the DATA split over two frames, one of them padded, and the trailers.
    pub fn server_answer(message: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        let (first, second) = body.split_at(body.len() / 2);
        let mut padded = vec![3u8];
        padded.extend_from_slice(second);
        padded.extend_from_slice(&[0, 0, 0]);
        let mut out = frame(SETTINGS, 0, 0, &[0, 5, 0, 0, 0x40, 0]);
        out.extend(frame(0x8, 0, 0, &[0, 0, 1, 0]));
        out.extend(frame(
            HEADERS,
            END_HEADERS,
            STREAM,
            &[0x88, 0x5f, 0x8b, 1, 2],
        ));
        out.extend(frame(DATA, 0, STREAM, first));
        out.extend(frame(PING, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]));
        out.extend(frame(DATA, PADDED, STREAM, &padded));
        out.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            STREAM,
            &[0x40, 1, b'x', 1, b'0'],
        ));
        out
    }

    /// A gRPC error answer: only trailers, no DATA.
    pub fn trailers_only() -> Vec<u8> {
        frame(HEADERS, END_STREAM | END_HEADERS, STREAM, &[0x40])
    }

    #[test]
    fn request_is_what_a_grpc_server_expects() {
        let req = request("/runtime.v1.RuntimeService/Status", &[0x08, 0x01]);
        assert!(req.starts_with(PREFACE));
        let headers = header_block(&[(":path", "/runtime.v1.RuntimeService/Status")]);
        assert_eq!(&headers[..7], b"\x00\x05:path");
        assert_eq!(headers[7], 33);
        assert!(req.windows(headers.len()).any(|w| w == headers.as_slice()));
        // The DATA frame: END_STREAM on stream 1, gRPC prefix, verbose = true.
        assert!(req.ends_with(&[0, 0, 7, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0x08, 0x01]));
        let mut long = Vec::new();
        hpack_int(&mut long, 300, 7);
        assert_eq!(long, [127, 173, 1]);
    }

    #[test]
    fn reads_the_message_and_acknowledges_the_settings() {
        let mut peer = Canned::new(server_answer(b"hello"));
        assert_eq!(unary(&mut peer, "/p", &[]).unwrap(), b"hello");
        let acks = frame(SETTINGS, ACK, 0, &[]);
        assert!(peer.written.windows(9).any(|w| w == acks.as_slice()));
        let pong = frame(PING, ACK, 0, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(peer.written.ends_with(&pong));
    }

    #[test]
    fn failures_are_errors() {
        let trailers_only = trailers_only();
        let reset = frame(RST_STREAM, 0, STREAM, &[0, 0, 0, 8]);
        let goaway = frame(GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 2]);
        let huge = {
            let mut f = frame(DATA, 0, STREAM, &[]);
            f[..3].copy_from_slice(&[0xff, 0xff, 0xff]);
            f
        };
        let compressed = frame(DATA, END_STREAM, STREAM, &[1, 0, 0, 0, 0]);
        let short = frame(DATA, END_STREAM, STREAM, &[0, 0, 0, 0, 9, 1]);
        let bad_pad = frame(DATA, PADDED | END_STREAM, STREAM, &[9, 1]);
        for (input, says) in [
            (trailers_only, "without a message"),
            (reset, "reset the call (code 8)"),
            (goaway, "GOAWAY, code 2"),
            (huge, "more than the 16384 allowed"),
            (compressed, "compressed"),
            (short, "cut short"),
            (bad_pad, "padding"),
            (Vec::new(), "ended early"),
        ] {
            let err = unary(&mut Canned::new(input), "/p", &[]).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }

    /// A small deterministic generator: the inputs are the same on every run.
    pub struct XorShift(pub u64);

    impl XorShift {
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn no_input_panics() {
        let good = server_answer(&[0x12, 0x04, 0x0a, 0x00, 0x12, 0x00]);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..20_000 {
            let mut input = good.clone();
            match round % 4 {
                0 => input.truncate(rng.next_u64() as usize % (good.len() + 1)),
                1 => {
                    for _ in 0..1 + rng.next_u64() % 4 {
                        let at = rng.next_u64() as usize % input.len();
                        input[at] = rng.next_u64() as u8;
                    }
                }
                2 => {
                    input = (0..rng.next_u64() % 200)
                        .map(|_| rng.next_u64() as u8)
                        .collect()
                }
                _ => {
                    let at = rng.next_u64() as usize % input.len();
                    input.insert(at, rng.next_u64() as u8);
                }
            }
            let _ = unary(&mut Canned::new(input), "/p", &[]);
        }
    }
}
