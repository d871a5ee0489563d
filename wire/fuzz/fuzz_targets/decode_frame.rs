//! Arbitrary bytes through `FrameDecoder` (in chunks, possibly misaligned) and every frame that
//! comes out through request and response decoding. The logic lives in `sluice_wire::fuzz_one`,
//! which a stable test also runs, so this target cannot rot.
//!
//! Run: `cd wire/fuzz && cargo +nightly fuzz run decode_frame`

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sluice_wire::fuzz_one(data);
});
