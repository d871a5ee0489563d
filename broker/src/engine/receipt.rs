//! Receipt handles: unforgeable tokens naming one lease on one message.
//!
//! Layout before encoding (41 bytes): format version (1) | queue id u64 LE | partition u32 LE |
//! message id u64 LE | lease epoch u32 LE | HMAC-SHA256 tag truncated to 16 bytes (128 bits).
//! The tag covers every byte before it, under a broker secret, so a client can neither forge a
//! handle nor retarget one to another message, lease or queue. Encoded as URL-safe base64
//! without padding (55 characters), so it travels in query strings, JSON and XML unescaped.
//!
//! The codec lives at the edge (front ends encode on receive and decode on delete); the
//! partition engine gets the decoded, verified [`Receipt`] and checks it against its state.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

use super::error::EngineError;

const RECEIPT_VERSION: u8 = 1;
const PAYLOAD_BYTES: usize = 1 + 8 + 4 + 8 + 4;
/// 128-bit tag: forging needs ~2^128 tries, far beyond any online guessing.
const TAG_BYTES: usize = 16;
const RAW_BYTES: usize = PAYLOAD_BYTES + TAG_BYTES;
/// Length of the base64 text of `RAW_BYTES` without padding.
const ENCODED_LEN: usize = (RAW_BYTES * 4).div_ceil(3);
/// Shortest broker secret accepted: the HMAC key should carry at least 256 bits.
pub const RECEIPT_SECRET_BYTES_MIN: usize = 32;

/// A decoded, authenticated receipt handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt {
    pub queue_id: u64,
    pub partition: u32,
    /// The message's id within its partition (its position in the partition's send order).
    pub msg_id: u64,
    /// The lease this handle names: the message's receive count when it was received.
    pub epoch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ReceiptError {
    #[error("malformed receipt handle")]
    Malformed,
    #[error("receipt handle failed authentication")]
    BadTag,
    #[error("receipt handle belongs to another queue")]
    WrongQueue,
}

impl From<ReceiptError> for EngineError {
    fn from(e: ReceiptError) -> Self {
        EngineError::ReceiptHandleIsInvalid(match e {
            ReceiptError::Malformed => "malformed",
            ReceiptError::BadTag => "not issued by this broker",
            ReceiptError::WrongQueue => "issued for another queue",
        })
    }
}

/// Encodes and verifies receipt handles under one broker secret.
#[derive(Clone)]
pub struct ReceiptCodec {
    /// Keyed once; cloning the keyed state per handle skips re-deriving the HMAC pads.
    mac: Hmac<Sha256>,
}

impl ReceiptCodec {
    /// `secret` must be at least [`RECEIPT_SECRET_BYTES_MIN`] bytes of key material.
    pub fn new(secret: &[u8]) -> Result<Self, EngineError> {
        if secret.len() < RECEIPT_SECRET_BYTES_MIN {
            return Err(EngineError::param(
                "ReceiptSecret",
                "must be at least 32 bytes",
            ));
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|_| EngineError::param("ReceiptSecret", "unusable HMAC key"))?;
        Ok(ReceiptCodec { mac })
    }

    fn payload(r: &Receipt) -> [u8; PAYLOAD_BYTES] {
        let mut p = [0u8; PAYLOAD_BYTES];
        p[0] = RECEIPT_VERSION;
        p[1..9].copy_from_slice(&r.queue_id.to_le_bytes());
        p[9..13].copy_from_slice(&r.partition.to_le_bytes());
        p[13..21].copy_from_slice(&r.msg_id.to_le_bytes());
        p[21..25].copy_from_slice(&r.epoch.to_le_bytes());
        p
    }

    pub fn encode(&self, r: &Receipt) -> String {
        let payload = Self::payload(r);
        let mut mac = self.mac.clone();
        mac.update(&payload);
        let tag = mac.finalize().into_bytes();
        let mut raw = [0u8; RAW_BYTES];
        raw[..PAYLOAD_BYTES].copy_from_slice(&payload);
        raw[PAYLOAD_BYTES..].copy_from_slice(&tag[..TAG_BYTES]);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Verifies the tag (in constant time) and that the handle belongs to `queue_id`.
    pub fn decode(&self, handle: &str, queue_id: u64) -> Result<Receipt, ReceiptError> {
        // Checking the length first bounds the work an attacker can make us do.
        if handle.len() != ENCODED_LEN {
            return Err(ReceiptError::Malformed);
        }
        let mut raw = [0u8; RAW_BYTES + 2];
        let n = URL_SAFE_NO_PAD
            .decode_slice(handle.as_bytes(), &mut raw)
            .map_err(|_| ReceiptError::Malformed)?;
        if n != RAW_BYTES || raw[0] != RECEIPT_VERSION {
            return Err(ReceiptError::Malformed);
        }
        let mut mac = self.mac.clone();
        mac.update(&raw[..PAYLOAD_BYTES]);
        mac.verify_truncated_left(&raw[PAYLOAD_BYTES..RAW_BYTES])
            .map_err(|_| ReceiptError::BadTag)?;
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8-byte slice"));
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().expect("4-byte slice"));
        let r = Receipt {
            queue_id: u64_at(1),
            partition: u32_at(9),
            msg_id: u64_at(13),
            epoch: u32_at(21),
        };
        if r.queue_id != queue_id {
            return Err(ReceiptError::WrongQueue);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(seed: u8) -> ReceiptCodec {
        ReceiptCodec::new(&[seed; 32]).expect("32-byte secret")
    }

    const R: Receipt = Receipt {
        queue_id: 7,
        partition: 3,
        msg_id: 123_456,
        epoch: 2,
    };

    #[test]
    fn round_trip() {
        let c = codec(1);
        let h = c.encode(&R);
        assert_eq!(h.len(), ENCODED_LEN);
        assert!(h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(c.decode(&h, 7), Ok(R));
    }

    #[test]
    fn wrong_queue_and_wrong_secret() {
        let h = codec(1).encode(&R);
        assert_eq!(codec(1).decode(&h, 8), Err(ReceiptError::WrongQueue));
        assert_eq!(codec(2).decode(&h, 7), Err(ReceiptError::BadTag));
    }

    #[test]
    fn every_bit_flip_is_rejected() {
        let c = codec(1);
        let h = c.encode(&R);
        let raw = URL_SAFE_NO_PAD.decode(&h).expect("valid base64");
        for i in 0..raw.len() * 8 {
            let mut m = raw.clone();
            m[i / 8] ^= 1 << (i % 8);
            let forged = URL_SAFE_NO_PAD.encode(&m);
            assert!(c.decode(&forged, 7).is_err(), "bit {i}");
        }
    }

    #[test]
    fn garbage_is_malformed() {
        let c = codec(1);
        for g in ["", "abc", &"A".repeat(55), &"!".repeat(55), &"A".repeat(56)] {
            assert!(c.decode(g, 7).is_err(), "{g:?}");
        }
        assert!(ReceiptCodec::new(&[0; 31]).is_err());
    }
}
