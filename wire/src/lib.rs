//! Sluice wire format: frames, message types, error codes, version negotiation. No I/O, no
//! runtime: the broker's QUIC front end and the SDK own the streams and call into this crate with
//! bytes.
//!
//! | module       | purpose                                                                  |
//! |--------------|--------------------------------------------------------------------------|
//! | `batch`      | the record-batch format: encode, parse, verify (the bytes on disk, too)  |
//! | `frame`      | the byte layout of a frame, frame kinds, limits, `encode_frame`          |
//! | `decoder`    | `FrameDecoder`: arbitrary chunks in, whole validated frames out, bounded |
//! | `messages`   | the rkyv-archived request/response structs (SQS member names)            |
//! | `codec`      | `Request`/`Response` enums, `encode_*`/`decode_*`, zero-copy access      |
//! | `error_code` | `ErrorCode`: stable numbers, SQS codes and HTTP statuses, retryability   |
//! | `handshake`  | `Hello`/`HelloOk` version negotiation                                     |
//! | `limits`     | SQS's limits (message size, batch entries, ...), one home each           |
//!
//! A request's path: the SDK calls `encode_request(id, &Request::SendMessage(..))` and writes the
//! bytes to a QUIC stream; the broker feeds what the stream yields to its `FrameDecoder`, gets a
//! `Frame` (checked against the limit before allocation, body in an aligned buffer, checksum
//! verified), calls `decode_request` (bytecheck validation, then deserialise), runs the command,
//! and answers with `encode_response(id, &Response::SendMessage(..))` or an `Error` frame; the
//! SDK decodes that with its own `FrameDecoder` and `decode_response`, and matches it to the
//! waiting call by request id.

#![forbid(unsafe_code)]

pub mod batch;
pub mod codec;
pub mod decoder;
pub mod error_code;
pub mod frame;
pub mod handshake;
pub mod limits;
pub mod messages;

pub use codec::{
    access_body, decode_body, decode_fetch_result, decode_request, decode_response, encode_body,
    encode_fetch_response, encode_request, encode_request_with, encode_response,
    encode_response_with, EncodeError, FetchedBatches, MessageError, Request, Response,
    WireMessage,
};
pub use decoder::{decode_one, DecodeError, FrameDecoder};
pub use error_code::ErrorCode;
pub use frame::{
    encode_frame, frame_checksum, Checksum, Frame, FrameHeader, FrameKind, FLAG_CHECKSUM,
    FRAME_BYTES_MAX, FRAME_BYTES_MIN, FRAME_FORMAT_VERSION, FRAME_HEADER_BYTES, FRAME_MAGIC,
    FRAME_TRAILER_BYTES, MESSAGE_BYTES_MAX, REQUEST_FRAME_BYTES_MAX,
};
pub use handshake::{
    answer_hello, negotiate_version, not_leader_response, supported_versions, ServerInfo,
    PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_NOT_LEADER,
};
pub use messages::*;

/// Input of at most this many bytes drives one fuzz case (bigger inputs are cut, so that a case
/// stays fast).
pub const FUZZ_INPUT_BYTES_MAX: usize = 1 << 20;

/// One fuzz case, shared by `fuzz/fuzz_targets/decode_frame.rs` and the stable test that runs it
/// on random inputs: the first byte picks the chunk size the bytes are fed in (as a QUIC stream
/// may split them anywhere) and whether to start one byte off alignment; the rest goes through a
/// `FrameDecoder` and every frame that comes out through both `decode_request` and
/// `decode_response`. It must never panic, never hold more than the decoder's limit, and keep
/// reporting a fatal error once it hit one.
pub fn fuzz_one(data: &[u8]) -> FuzzStats {
    let mut stats = FuzzStats::default();
    let data = &data[..data.len().min(FUZZ_INPUT_BYTES_MAX)];
    let Some((&control, rest)) = data.split_first() else {
        return stats;
    };
    let chunk_bytes = usize::from(control & 0x3F) + 1;
    // Copy one byte off a 16-byte boundary when asked: the decoder must not care.
    let misaligned: Vec<u8>;
    let rest = if control & 0x40 != 0 {
        let mut v = Vec::with_capacity(rest.len() + 1);
        v.push(0);
        v.extend_from_slice(rest);
        misaligned = v;
        &misaligned[1..]
    } else {
        rest
    };
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MIN);
    let mut fatal: Option<DecodeError> = None;
    'chunks: for chunk in rest.chunks(chunk_bytes) {
        let mut input = chunk;
        loop {
            assert!(decoder.buffered_bytes() <= decoder.frame_bytes_max());
            match decoder.decode(&mut input) {
                Ok(Some(frame)) => {
                    stats.frames += 1;
                    assert!(frame.header.frame_bytes() <= decoder.frame_bytes_max());
                    let request = decode_request(&frame);
                    let response = decode_response(&frame);
                    // A valid message re-encodes into a frame that decodes to the same message.
                    if let Ok(request) = request {
                        stats.messages += 1;
                        let bytes = encode_request(frame.request_id(), &request)
                            .expect("a decoded request re-encodes");
                        let again = decode_one(&bytes, FRAME_BYTES_MAX).expect("own frame decodes");
                        assert_eq!(decode_request(&again).ok(), Some(request));
                    }
                    if let Ok(response) = response {
                        stats.messages += 1;
                        let bytes = encode_response(frame.request_id(), &response)
                            .expect("a decoded response re-encodes");
                        let again = decode_one(&bytes, FRAME_BYTES_MAX).expect("own frame decodes");
                        assert_eq!(decode_response(&again).ok(), Some(response));
                    }
                }
                Ok(None) => break,
                Err(e) if e.is_fatal() => {
                    stats.errors += 1;
                    let _ = e.to_error_response();
                    fatal = Some(e);
                    break 'chunks;
                }
                Err(e) => {
                    stats.errors += 1;
                    let _ = e.to_error_response();
                }
            }
        }
    }
    match fatal {
        Some(e) => {
            // Sticky: a desynchronised stream stays failed.
            assert_eq!(decoder.decode(&mut &[FRAME_MAGIC][..]), Err(e.clone()));
            assert_eq!(decoder.finish(), Err(e));
        }
        None => {
            if decoder.finish().is_err() {
                stats.errors += 1;
            }
        }
    }
    stats
}

/// What one fuzz case went through (lets the stable test check it is not vacuous).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuzzStats {
    pub frames: usize,
    pub messages: usize,
    pub errors: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    /// xorshift64*: a fixed seed makes every case repeatable without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// The same logic as the cargo-fuzz target, on a few thousand inputs from a fixed seed:
    /// random bytes, valid pipelined streams, and valid streams with mutated bytes, cut short or
    /// with a rewritten header field. None may panic (fuzz_one asserts the decoder's bounds).
    #[test]
    fn fuzz_one_survives_random_and_mutated_input() {
        const CASES: usize = 4000;
        const POOL: usize = 200;
        let mut rng = Rng(0x5EED_0FF1);
        // Generating arbitrary messages dominates the cost: draw a pool once, reuse it.
        let mut runner = TestRunner::deterministic();
        let pool: Vec<(Request, Response)> = (0..POOL)
            .map(|_| {
                let r = any::<Request>().new_tree(&mut runner).expect("generates");
                let s = any::<Response>().new_tree(&mut runner).expect("generates");
                (r.current(), s.current())
            })
            .collect();
        let mut total = FuzzStats::default();
        for case in 0..CASES {
            let mut data = vec![rng.next() as u8];
            let mut stream = Vec::new();
            for i in 0..=rng.below(3) {
                let checksum = if rng.next().is_multiple_of(2) {
                    Checksum::None
                } else {
                    Checksum::Xxh3
                };
                let id = rng.next();
                let (request, response) = &pool[rng.below(POOL)];
                let bytes = if i % 2 == 0 {
                    encode_request_with(id, request, checksum)
                } else {
                    encode_response_with(id, response, checksum)
                };
                stream.extend(bytes.expect("encodes"));
            }
            match case % 5 {
                0 => {
                    let n = rng.below(2048);
                    stream.clear();
                    stream.extend((0..n).map(|_| rng.next() as u8));
                    if rng.next().is_multiple_of(2) && !stream.is_empty() {
                        stream[0] = FRAME_MAGIC;
                    }
                }
                1 => {}
                2 => {
                    for _ in 0..=rng.below(4) {
                        let at = rng.below(stream.len());
                        stream[at] ^= 1 << rng.below(8);
                    }
                }
                3 => stream.truncate(rng.below(stream.len())),
                _ => {
                    // Overwrite the first header's kind or length with something arbitrary.
                    let field = if rng.next().is_multiple_of(2) {
                        2..4
                    } else {
                        4..8
                    };
                    for b in &mut stream[field] {
                        *b = rng.next() as u8;
                    }
                }
            }
            data.extend_from_slice(&stream);
            let stats = fuzz_one(&data);
            total.frames += stats.frames;
            total.messages += stats.messages;
            total.errors += stats.errors;
        }
        // Not vacuous: most valid frames get through, and most damage is caught.
        assert!(total.messages > CASES / 2, "{total:?}");
        assert!(total.errors > CASES / 2, "{total:?}");
    }

    #[test]
    fn fuzz_one_handles_edge_inputs() {
        fuzz_one(&[]);
        fuzz_one(&[0]);
        fuzz_one(&[0xFF; 17]);
        fuzz_one(&[0x00, FRAME_MAGIC]);
        let mut big = vec![0x7F, FRAME_MAGIC, 0, 0x01, 0x02];
        big.extend_from_slice(&u32::MAX.to_le_bytes());
        big.resize(FUZZ_INPUT_BYTES_MAX + 10, 0xAB);
        fuzz_one(&big);
    }
}
