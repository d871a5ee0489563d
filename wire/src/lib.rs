//! Sluice wire format: frames, message types, error codes, version negotiation. No I/O, no
//! runtime: the broker's QUIC front end and the SDK own the streams and call into this crate with
//! bytes.
//!
//! | module       | purpose                                                                  |
//! |--------------|--------------------------------------------------------------------------|
//! | `frame`      | the byte layout of a frame, frame kinds, limits, `encode_frame`          |
//! | `decoder`    | `FrameDecoder`: arbitrary chunks in, whole validated frames out, bounded |
//! | `messages`   | the rkyv-archived request/response structs (SQS member names)            |
//! | `codec`      | `Request`/`Response` enums, `encode_*`/`decode_*`, zero-copy access      |
//! | `error_code` | `ErrorCode`: stable numbers, SQS codes and HTTP statuses, retryability   |
//! | `handshake`  | `Hello`/`HelloOk` version negotiation                                     |
//!
//! A request's path: the SDK calls `encode_request(id, &Request::SendMessage(..))` and writes the
//! bytes to a QUIC stream; the broker feeds what the stream yields to its `FrameDecoder`, gets a
//! `Frame` (checked against the limit before allocation, body in an aligned buffer, checksum
//! verified), calls `decode_request` (bytecheck validation, then deserialise), runs the command,
//! and answers with `encode_response(id, &Response::SendMessage(..))` or an `Error` frame; the
//! SDK decodes that with its own `FrameDecoder` and `decode_response`, and matches it to the
//! waiting call by request id.

#![forbid(unsafe_code)]

pub mod codec;
pub mod decoder;
pub mod error_code;
pub mod frame;
pub mod handshake;
pub mod messages;

pub use codec::{
    access_body, decode_body, decode_request, decode_response, encode_body, encode_request,
    encode_request_with, encode_response, encode_response_with, EncodeError, MessageError, Request,
    Response, WireMessage,
};
pub use decoder::{decode_one, DecodeError, FrameDecoder};
pub use error_code::ErrorCode;
pub use frame::{
    encode_frame, frame_checksum, Checksum, Frame, FrameHeader, FrameKind, FLAG_CHECKSUM,
    FRAME_BYTES_MAX, FRAME_BYTES_MIN, FRAME_FORMAT_VERSION, FRAME_HEADER_BYTES, FRAME_MAGIC,
    FRAME_TRAILER_BYTES, MESSAGE_BYTES_MAX, REQUEST_FRAME_BYTES_MAX,
};
pub use handshake::{
    answer_hello, negotiate_version, supported_versions, ServerInfo, PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
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
pub fn fuzz_one(data: &[u8]) {
    let data = &data[..data.len().min(FUZZ_INPUT_BYTES_MAX)];
    let Some((&control, rest)) = data.split_first() else {
        return;
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
                    assert!(frame.header.frame_bytes() <= decoder.frame_bytes_max());
                    let request = decode_request(&frame);
                    let response = decode_response(&frame);
                    // A valid message re-encodes into a frame that decodes to the same message.
                    if let Ok(request) = request {
                        let bytes = encode_request(frame.request_id(), &request)
                            .expect("a decoded request re-encodes");
                        let again = decode_one(&bytes, FRAME_BYTES_MAX).expect("own frame decodes");
                        assert_eq!(decode_request(&again).ok(), Some(request));
                    }
                    if let Ok(response) = response {
                        let bytes = encode_response(frame.request_id(), &response)
                            .expect("a decoded response re-encodes");
                        let again = decode_one(&bytes, FRAME_BYTES_MAX).expect("own frame decodes");
                        assert_eq!(decode_response(&again).ok(), Some(response));
                    }
                }
                Ok(None) => break,
                Err(e) if e.is_fatal() => {
                    let _ = e.to_error_response();
                    fatal = Some(e);
                    break 'chunks;
                }
                Err(e) => {
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
            let _ = decoder.finish();
        }
    }
}
