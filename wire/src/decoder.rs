//! The incremental frame decoder: bytes in, whole frames out, as a QUIC stream delivers them.
//!
//! What must stay true, whatever the input:
//! - it never panics;
//! - it judges a header (magic, flags, length against the limit) before it allocates for the
//!   body, and it never holds more than one frame: at most `frame_bytes_max` bytes;
//! - the body buffer grows with the bytes that actually arrived (a peer that announces 10 MiB and
//!   sends 10 bytes costs 64 KiB, not 10 MiB), and never past the announced length;
//! - bodies land in an `AlignedVec` (rkyv 0.8 rejects misaligned input), copied once;
//! - a CHECKSUM trailer is verified before the frame is handed over, and before its kind is
//!   trusted.
//!
//! Errors that leave frame boundaries intact (an unknown kind) are non-fatal: the caller answers
//! with an `Error` frame and goes on reading. The others (`DecodeError::is_fatal`) desynchronise
//! the stream; the decoder then repeats the same error on every call, and the caller answers
//! with an `Error` frame (request id from `DecodeError::request_id`) and closes the stream.

use rkyv::util::AlignedVec;
use thiserror::Error;

use crate::error_code::ErrorCode;
use crate::frame::{
    frame_checksum, Frame, FrameHeader, FrameKind, FLAGS_KNOWN, FRAME_BYTES_MAX, FRAME_BYTES_MIN,
    FRAME_HEADER_BYTES, FRAME_MAGIC, FRAME_TRAILER_BYTES,
};
use crate::messages::ErrorResponse;

/// The body buffer's first allocation; it then doubles, up to the announced body length.
pub const BODY_CHUNK_BYTES_INITIAL: usize = 64 * 1024;

/// Why a byte stream is not a sequence of valid frames.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("bad magic byte 0x{found:02x} (expected 0x{FRAME_MAGIC:02x}): not a Sluice frame stream, or a newer frame layout")]
    BadMagic { found: u8 },
    #[error("reserved flag bits set: 0x{flags:02x} (request {request_id})")]
    ReservedFlags { flags: u8, request_id: u64 },
    #[error("frame of {frame_bytes} bytes exceeds the limit of {limit_bytes} bytes (request {request_id})")]
    FrameTooLarge {
        frame_bytes: u64,
        limit_bytes: usize,
        request_id: u64,
    },
    #[error("checksum mismatch (request {request_id}): trailer 0x{trailer:016x}, computed 0x{computed:016x}")]
    ChecksumMismatch {
        request_id: u64,
        trailer: u64,
        computed: u64,
    },
    #[error("unknown frame kind 0x{kind:04x} (request {request_id})")]
    UnknownKind { kind: u16, request_id: u64 },
    #[error("stream closed inside a frame: {buffered_bytes} bytes of a frame buffered")]
    Truncated { buffered_bytes: usize },
}

impl DecodeError {
    /// Whether frame boundaries are lost (the stream must be closed after answering).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, DecodeError::UnknownKind { .. })
    }

    /// The request the error is about, 0 (connection level) if the header was not read.
    pub fn request_id(&self) -> u64 {
        match self {
            DecodeError::BadMagic { .. } | DecodeError::Truncated { .. } => 0,
            DecodeError::ReservedFlags { request_id, .. }
            | DecodeError::FrameTooLarge { request_id, .. }
            | DecodeError::ChecksumMismatch { request_id, .. }
            | DecodeError::UnknownKind { request_id, .. } => *request_id,
        }
    }

    pub fn error_code(&self) -> ErrorCode {
        match self {
            DecodeError::BadMagic { .. } | DecodeError::ReservedFlags { .. } => {
                ErrorCode::ProtocolViolation
            }
            DecodeError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            DecodeError::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
            DecodeError::UnknownKind { .. } => ErrorCode::UnknownFrameKind,
            DecodeError::Truncated { .. } => ErrorCode::MalformedFrame,
        }
    }

    /// The `Error` frame body that tells the peer what went wrong.
    pub fn to_error_response(&self) -> ErrorResponse {
        ErrorResponse::new(self.error_code(), self.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Gathering the 16 header bytes.
    Header,
    /// Gathering `header.body_len` body bytes.
    Body(FrameHeader),
    /// Gathering the 8 trailer bytes.
    Trailer(FrameHeader),
}

/// Incremental, bounded frame decoder for one stream. See the module documentation.
///
/// ```
/// # use sluice_wire::{FrameDecoder, REQUEST_FRAME_BYTES_MAX};
/// let mut decoder = FrameDecoder::new(REQUEST_FRAME_BYTES_MAX);
/// let chunk: &[u8] = &[]; // as the stream delivered it
/// let mut input = chunk;
/// loop {
///     match decoder.decode(&mut input) {
///         Ok(Some(_frame)) => { /* decode_request(&frame), handle */ }
///         Ok(None) => break, // chunk consumed; wait for more
///         Err(e) if !e.is_fatal() => { /* answer e.to_error_response(), go on */ }
///         Err(_e) => { /* answer, then close the stream */ break }
///     }
/// }
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    frame_bytes_max: usize,
    state: State,
    header: [u8; FRAME_HEADER_BYTES],
    header_len: usize,
    body: AlignedVec,
    trailer: [u8; FRAME_TRAILER_BYTES],
    trailer_len: usize,
    /// Set by a fatal error: the stream is desynchronised for good.
    failed: Option<DecodeError>,
    /// Reserve a body's declared length at once (see [`FrameDecoder::reserve_declared`]).
    reserve_declared: bool,
}

impl FrameDecoder {
    /// A decoder that accepts frames up to `frame_bytes_max` bytes (header and trailer included),
    /// clamped to [`FRAME_BYTES_MIN`]..=[`FRAME_BYTES_MAX`].
    pub fn new(frame_bytes_max: usize) -> Self {
        FrameDecoder {
            frame_bytes_max: clamp_limit(frame_bytes_max),
            state: State::Header,
            header: [0; FRAME_HEADER_BYTES],
            header_len: 0,
            body: AlignedVec::new(),
            trailer: [0; FRAME_TRAILER_BYTES],
            trailer_len: 0,
            failed: None,
            reserve_declared: false,
        }
    }

    /// Reserves each body's declared length (up to the limit) when its header arrives, instead
    /// of growing the buffer as bytes come: for a peer whose sizes are trusted, a client reading
    /// the answers it asked for. A 2 MB fetch answer growing by doubling was copied again at
    /// every step (7% of a consuming client's CPU). A server keeps the default: a client's
    /// header alone must not make it hold a frame's worth of memory.
    pub fn reserve_declared(mut self) -> Self {
        self.reserve_declared = true;
        self
    }

    pub fn frame_bytes_max(&self) -> usize {
        self.frame_bytes_max
    }

    /// Changes the limit for frames whose header has not been read yet (a server may read
    /// `Hello` with a small limit and raise it once the peer is authenticated).
    pub fn set_frame_bytes_max(&mut self, frame_bytes_max: usize) {
        self.frame_bytes_max = clamp_limit(frame_bytes_max);
    }

    /// Bytes of a partial frame held right now (at most `frame_bytes_max`).
    pub fn buffered_bytes(&self) -> usize {
        self.header_len + self.body.len() + self.trailer_len
    }

    /// Consumes bytes from the front of `input` until one frame is complete (returned; the rest
    /// of `input` is left for the next call) or `input` is empty (`Ok(None)`).
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Frame>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.step(input) {
            Err(e) if e.is_fatal() => {
                self.failed = Some(e.clone());
                Err(e)
            }
            other => other,
        }
    }

    /// Call when the stream ends: an error if it ended inside a frame (or had failed before).
    pub fn finish(&self) -> Result<(), DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.buffered_bytes() {
            0 => Ok(()),
            buffered_bytes => Err(DecodeError::Truncated { buffered_bytes }),
        }
    }

    fn step(&mut self, input: &mut &[u8]) -> Result<Option<Frame>, DecodeError> {
        loop {
            match self.state {
                State::Header => {
                    if self.header_len == 0 {
                        // Judge the magic on the first byte: a peer speaking HTTP or TLS is
                        // told so at once, not after 15 more bytes that may never come.
                        match input.first() {
                            None => return Ok(None),
                            Some(&b) if b != FRAME_MAGIC => {
                                return Err(DecodeError::BadMagic { found: b })
                            }
                            Some(_) => {}
                        }
                    }
                    let n = take_into(&mut self.header[self.header_len..], input);
                    self.header_len += n;
                    if self.header_len < FRAME_HEADER_BYTES {
                        return Ok(None);
                    }
                    let header = FrameHeader::parse(&self.header);
                    self.check_header(&header)?;
                    // Never more than the announced length, which is within the limit.
                    let declared = header.body_len as usize;
                    self.body = AlignedVec::with_capacity(if self.reserve_declared {
                        declared
                    } else {
                        declared.min(BODY_CHUNK_BYTES_INITIAL)
                    });
                    self.state = State::Body(header);
                }
                State::Body(header) => {
                    let missing = header.body_len as usize - self.body.len();
                    let n = missing.min(input.len());
                    if n > 0 {
                        self.grow_body(header.body_len as usize, n);
                        let (chunk, rest) = input.split_at(n);
                        self.body.extend_from_slice(chunk);
                        *input = rest;
                    }
                    if self.body.len() < header.body_len as usize {
                        return Ok(None);
                    }
                    if !header.has_checksum() {
                        return self.complete(header).map(Some);
                    }
                    self.state = State::Trailer(header);
                }
                State::Trailer(header) => {
                    let n = take_into(&mut self.trailer[self.trailer_len..], input);
                    self.trailer_len += n;
                    if self.trailer_len < FRAME_TRAILER_BYTES {
                        return Ok(None);
                    }
                    let trailer = u64::from_le_bytes(self.trailer);
                    let computed = frame_checksum(&self.header, &self.body);
                    if trailer != computed {
                        return Err(DecodeError::ChecksumMismatch {
                            request_id: header.request_id,
                            trailer,
                            computed,
                        });
                    }
                    return self.complete(header).map(Some);
                }
            }
        }
    }

    fn check_header(&self, header: &FrameHeader) -> Result<(), DecodeError> {
        if header.flags & !FLAGS_KNOWN != 0 {
            return Err(DecodeError::ReservedFlags {
                flags: header.flags,
                request_id: header.request_id,
            });
        }
        // u64 arithmetic: cannot overflow whatever body_len says, on any pointer width.
        let frame_bytes = FRAME_HEADER_BYTES as u64
            + u64::from(header.body_len)
            + if header.has_checksum() {
                FRAME_TRAILER_BYTES as u64
            } else {
                0
            };
        if frame_bytes > self.frame_bytes_max as u64 {
            return Err(DecodeError::FrameTooLarge {
                frame_bytes,
                limit_bytes: self.frame_bytes_max,
                request_id: header.request_id,
            });
        }
        Ok(())
    }

    /// Makes room for `n` more body bytes: doubling (amortised copies), never past `body_len`.
    fn grow_body(&mut self, body_len: usize, n: usize) {
        let needed = self.body.len() + n;
        if needed <= self.body.capacity() {
            return;
        }
        let target = needed.max(self.body.capacity() * 2).min(body_len);
        self.body.reserve_exact(target - self.body.len());
    }

    /// Hands over the finished frame and resets for the next one.
    fn complete(&mut self, header: FrameHeader) -> Result<Frame, DecodeError> {
        let body = std::mem::take(&mut self.body);
        self.state = State::Header;
        self.header_len = 0;
        self.trailer_len = 0;
        debug_assert_eq!(body.len(), header.body_len as usize);
        if FrameKind::from_u16(header.kind).is_none() {
            return Err(DecodeError::UnknownKind {
                kind: header.kind,
                request_id: header.request_id,
            });
        }
        Ok(Frame { header, body })
    }
}

fn clamp_limit(frame_bytes_max: usize) -> usize {
    frame_bytes_max.clamp(FRAME_BYTES_MIN, FRAME_BYTES_MAX)
}

/// Copies as much of `input` as fits into `dst`, advances `input`, returns the count.
fn take_into(dst: &mut [u8], input: &mut &[u8]) -> usize {
    let n = dst.len().min(input.len());
    let (chunk, rest) = input.split_at(n);
    dst[..n].copy_from_slice(chunk);
    *input = rest;
    n
}

/// Decodes one complete frame held in a single buffer (a datagram, a test vector, a stored
/// frame): it must contain exactly one frame, nothing more. `buf` may have any alignment.
pub fn decode_one(buf: &[u8], frame_bytes_max: usize) -> Result<Frame, DecodeError> {
    let mut decoder = FrameDecoder::new(frame_bytes_max);
    let mut input = buf;
    match decoder.decode(&mut input)? {
        Some(frame) if input.is_empty() => Ok(frame),
        // Trailing bytes: report them as a truncated second frame.
        Some(_) => Err(DecodeError::Truncated {
            buffered_bytes: input.len(),
        }),
        None => {
            decoder.finish()?;
            // An empty buffer holds no frame.
            Err(DecodeError::Truncated { buffered_bytes: 0 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_request, encode_request, encode_request_with, Request};
    use crate::frame::{encode_frame, Checksum, FLAG_CHECKSUM, REQUEST_FRAME_BYTES_MAX};
    use crate::messages::{DeleteMessageRequest, SendMessageRequest};

    fn send(body: &str) -> Request {
        Request::SendMessage(SendMessageRequest {
            queue_url: "http://localhost:9324/000000000000/q".into(),
            message_body: body.into(),
            ..Default::default()
        })
    }

    /// Every frame and every error a whole stream produces, fed in `chunk`-byte pieces, then
    /// `finish`. Stops at the first fatal error.
    fn run(bytes: &[u8], chunk: usize, limit: usize) -> (Vec<Frame>, Vec<DecodeError>) {
        let mut decoder = FrameDecoder::new(limit);
        let (mut frames, mut errors) = (Vec::new(), Vec::new());
        for piece in bytes.chunks(chunk.max(1)) {
            let mut input = piece;
            loop {
                assert!(decoder.buffered_bytes() <= decoder.frame_bytes_max());
                match decoder.decode(&mut input) {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => break,
                    Err(e) => {
                        let fatal = e.is_fatal();
                        errors.push(e);
                        if fatal {
                            return (frames, errors);
                        }
                    }
                }
            }
        }
        if let Err(e) = decoder.finish() {
            errors.push(e);
        }
        (frames, errors)
    }

    #[test]
    fn byte_by_byte_and_all_at_once_agree() {
        let bytes = encode_request(5, &send("hello")).expect("encodes");
        let (one, e1) = run(&bytes, 1, REQUEST_FRAME_BYTES_MAX);
        let (all, e2) = run(&bytes, bytes.len(), REQUEST_FRAME_BYTES_MAX);
        assert!(e1.is_empty() && e2.is_empty());
        assert_eq!(one, all);
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn garbage_is_bad_magic_at_the_first_byte() {
        for garbage in [
            &b"GET / HTTP/1.1\r\n"[..],
            &[0x16, 0x03, 0x01],
            &[0x00],
            &[0xFF; 64],
        ] {
            let mut decoder = FrameDecoder::new(REQUEST_FRAME_BYTES_MAX);
            let mut input = garbage;
            let err = decoder.decode(&mut input).expect_err("not a frame");
            assert_eq!(err, DecodeError::BadMagic { found: garbage[0] });
            assert!(err.is_fatal());
            assert_eq!(err.error_code(), ErrorCode::ProtocolViolation);
            assert_eq!(err.request_id(), 0);
            // Sticky, and nothing was buffered for it.
            assert_eq!(decoder.decode(&mut &[FRAME_MAGIC][..]), Err(err.clone()));
            assert_eq!(decoder.finish(), Err(err));
            assert_eq!(decoder.buffered_bytes(), 0);
        }
    }

    #[test]
    fn truncated_streams_are_reported_at_close() {
        let bytes = encode_request_with(5, &send("hello"), Checksum::Xxh3).expect("encodes");
        for cut in 1..bytes.len() {
            let (frames, errors) = run(&bytes[..cut], 3, REQUEST_FRAME_BYTES_MAX);
            assert!(frames.is_empty());
            assert_eq!(
                errors,
                vec![DecodeError::Truncated {
                    buffered_bytes: cut
                }]
            );
        }
        // Nothing at all is a clean close.
        assert_eq!(run(&[], 1, REQUEST_FRAME_BYTES_MAX), (vec![], vec![]));
    }

    #[test]
    fn oversized_frames_are_refused_before_allocation() {
        // A header announcing 4 GiB: refused from the 16 header bytes alone.
        let header = FrameHeader {
            kind: FrameKind::SendMessage.as_u16(),
            flags: 0,
            body_len: u32::MAX,
            request_id: 11,
        };
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
        let err = decoder
            .decode(&mut &header.to_bytes()[..])
            .expect_err("too large");
        assert_eq!(
            err,
            DecodeError::FrameTooLarge {
                frame_bytes: 16 + u64::from(u32::MAX),
                limit_bytes: FRAME_BYTES_MAX,
                request_id: 11,
            }
        );
        assert_eq!(err.request_id(), 11);
        assert_eq!(err.error_code(), ErrorCode::FrameTooLarge);
        assert_eq!(decoder.body.capacity(), 0);

        // Exactly at a configured lower limit passes; one byte over does not.
        let limit = FRAME_BYTES_MIN;
        let body = vec![0u8; limit - FRAME_HEADER_BYTES];
        let kind = FrameKind::DeleteQueue.as_u16();
        let at = encode_frame(kind, 1, &body, Checksum::None).expect("fits");
        assert_eq!(at.len(), limit);
        let (frames, errors) = run(&at, 4096, limit);
        assert_eq!((frames.len(), errors.len()), (1, 0));
        let over = encode_frame(kind, 2, &body, Checksum::Xxh3).expect("fits");
        let (frames, errors) = run(&over, 4096, limit);
        assert!(frames.is_empty());
        assert!(matches!(errors[..], [DecodeError::FrameTooLarge { .. }]));
    }

    #[test]
    fn the_body_buffer_follows_the_bytes_that_arrived() {
        // Announce a frame at the top limit, send 100 bytes of it.
        let header = FrameHeader {
            kind: FrameKind::SendMessage.as_u16(),
            flags: 0,
            body_len: (FRAME_BYTES_MAX - FRAME_HEADER_BYTES) as u32,
            request_id: 1,
        };
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
        let mut input = &header.to_bytes()[..];
        assert_eq!(decoder.decode(&mut input), Ok(None));
        assert_eq!(decoder.decode(&mut &[0u8; 100][..]), Ok(None));
        assert!(decoder.body.capacity() <= BODY_CHUNK_BYTES_INITIAL);
        // Feed the rest in uneven pieces: capacity never passes the announced length.
        let rest = vec![0u8; header.body_len as usize - 100];
        for piece in rest.chunks(777_777) {
            let mut input = piece;
            let _ = decoder.decode(&mut input);
            assert!(decoder.body.capacity() <= header.body_len as usize);
        }
    }

    #[test]
    fn a_decoder_reserving_the_declared_body_fills_one_buffer_without_moving_it() {
        let body = vec![7u8; 2_000_000];
        let kind = FrameKind::DeleteQueue.as_u16();
        let frame = encode_frame(kind, 9, &body, Checksum::Xxh3).expect("fits");
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX).reserve_declared();
        let mut input = &frame[..FRAME_HEADER_BYTES];
        assert_eq!(decoder.decode(&mut input), Ok(None));
        assert_eq!(
            decoder.body.capacity(),
            body.len(),
            "reserved at the header"
        );
        let buffer = decoder.body.as_ptr();
        let mut got = None;
        for piece in frame[FRAME_HEADER_BYTES..].chunks(65_536) {
            let mut input = piece;
            if let Some(f) = decoder.decode(&mut input).expect("decodes") {
                got = Some(f);
            } else {
                assert_eq!(
                    decoder.body.as_ptr(),
                    buffer,
                    "never copied to a new buffer"
                );
            }
        }
        let f = got.expect("a frame");
        assert_eq!(f.body.as_ptr(), buffer);
        assert_eq!(&f.body[..], &body[..]);
    }

    #[test]
    fn misaligned_input_decodes_the_same() {
        let bytes = encode_request(3, &send("aligned or not")).expect("encodes");
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        let misaligned = &shifted[1..];
        // rkyv itself refuses the misaligned body in place...
        let body = &misaligned[FRAME_HEADER_BYTES..];
        if !(body.as_ptr() as usize).is_multiple_of(16) {
            assert!(
                rkyv::access::<rkyv::Archived<SendMessageRequest>, rkyv::rancor::Error>(body)
                    .is_err()
            );
        }
        // ...the decoder copies it into an aligned buffer first.
        let frame = decode_one(misaligned, REQUEST_FRAME_BYTES_MAX).expect("decodes");
        assert_eq!(frame.body.as_ptr() as usize % 16, 0);
        assert_eq!(decode_request(&frame), Ok(send("aligned or not")));
    }

    #[test]
    fn every_single_bit_flip_of_a_checksummed_frame_is_detected() {
        let bytes =
            encode_request_with(0x0102_0304, &send("bits"), Checksum::Xxh3).expect("encodes");
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.to_vec();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let (_frames, errors) = run(&flipped, 7, REQUEST_FRAME_BYTES_MAX);
            // Clearing the CHECKSUM flag makes the frame 8 bytes shorter: it then decodes, and
            // the orphaned trailer is refused as the start of a next frame. Any other flip fails
            // the frame itself.
            assert!(!errors.is_empty(), "flip of bit {bit} went unnoticed");
            if bit / 8 >= FRAME_HEADER_BYTES {
                assert!(
                    matches!(errors[0], DecodeError::ChecksumMismatch { .. }),
                    "bit {bit}: {:?}",
                    errors[0]
                );
            }
        }
    }

    #[test]
    fn reserved_flags_are_refused() {
        let mut bytes = encode_request(1, &send("x")).expect("encodes").to_vec();
        bytes[1] |= 0x80;
        let (_, errors) = run(&bytes, 64, REQUEST_FRAME_BYTES_MAX);
        assert_eq!(
            errors,
            vec![DecodeError::ReservedFlags {
                flags: 0x80,
                request_id: 1
            }]
        );
        assert_eq!(FLAGS_KNOWN, FLAG_CHECKSUM);
    }

    #[test]
    fn unknown_kinds_are_answered_and_the_stream_goes_on() {
        let mut stream = encode_frame(0x03FF, 41, b"produce", Checksum::None).expect("fits");
        stream.extend(encode_frame(0x7FFF, 42, b"", Checksum::Xxh3).expect("fits"));
        stream.extend(
            encode_request(
                43,
                &Request::DeleteMessage(DeleteMessageRequest {
                    queue_url: "u".into(),
                    receipt_handle: "r".into(),
                }),
            )
            .expect("encodes"),
        );
        let (frames, errors) = run(&stream, 5, REQUEST_FRAME_BYTES_MAX);
        assert_eq!(
            errors,
            vec![
                DecodeError::UnknownKind {
                    kind: 0x03FF,
                    request_id: 41
                },
                DecodeError::UnknownKind {
                    kind: 0x7FFF,
                    request_id: 42
                },
            ]
        );
        assert!(!errors[0].is_fatal());
        let answer = errors[0].to_error_response();
        assert_eq!(answer.error_code(), ErrorCode::UnknownFrameKind);
        assert!(answer.message.contains("0x03ff"));
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].request_id(), 43);
    }

    #[test]
    fn limits_are_clamped() {
        assert_eq!(FrameDecoder::new(0).frame_bytes_max(), FRAME_BYTES_MIN);
        assert_eq!(
            FrameDecoder::new(usize::MAX).frame_bytes_max(),
            FRAME_BYTES_MAX
        );
        let mut d = FrameDecoder::new(REQUEST_FRAME_BYTES_MAX);
        d.set_frame_bytes_max(FRAME_BYTES_MIN);
        assert_eq!(d.frame_bytes_max(), FRAME_BYTES_MIN);
    }

    #[test]
    fn decode_one_wants_exactly_one_frame() {
        let bytes = encode_request(1, &send("one")).expect("encodes");
        assert!(decode_one(&bytes, REQUEST_FRAME_BYTES_MAX).is_ok());
        let mut two = bytes.to_vec();
        two.extend_from_slice(&bytes);
        assert_eq!(
            decode_one(&two, REQUEST_FRAME_BYTES_MAX),
            Err(DecodeError::Truncated {
                buffered_bytes: bytes.len()
            })
        );
        assert_eq!(
            decode_one(&[], REQUEST_FRAME_BYTES_MAX),
            Err(DecodeError::Truncated { buffered_bytes: 0 })
        );
    }
}
