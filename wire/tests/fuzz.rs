//! The native protocol's decoders under fuzzing (`sluice-fuzz`): arbitrary bytes, cut at
//! arbitrary points, through the frame decoder and then the request and response decoders —
//! what a peer can send a broker or a client. Corpus: `fuzz/corpus/wire_frames/` plus valid
//! encodings built here. Errors are fine; a panic or a hang is not.

use sluice_wire::messages::*;
use sluice_wire::{
    decode_request, decode_response, encode_request_with, Checksum, FrameDecoder, Request,
};

fn valid_requests() -> Vec<Vec<u8>> {
    let requests = [
        Request::CreateQueue(CreateQueueRequest {
            queue_name: "orders.fifo".into(),
            attributes: [("FifoQueue".to_string(), "true".to_string())].into(),
            tags: [("team".to_string(), "a".to_string())].into(),
        }),
        Request::SendMessage(SendMessageRequest {
            queue_url: "http://127.0.0.1:9324/000000000000/q".into(),
            message_body: "hello ✓".into(),
            delay_seconds: Some(5),
            message_group_id: Some("g".into()),
            ..Default::default()
        }),
        Request::ReceiveMessage(ReceiveMessageRequest {
            queue_url: "/000000000000/q".into(),
            max_number_of_messages: Some(10),
            wait_time_seconds: Some(20),
            message_system_attribute_names: vec!["All".into()],
            ..Default::default()
        }),
        Request::DeleteMessageBatch(DeleteMessageBatchRequest {
            queue_url: "/000000000000/q".into(),
            entries: vec![DeleteMessageBatchRequestEntry {
                id: "a".into(),
                receipt_handle: "AAAA".into(),
            }],
        }),
    ];
    let mut out = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        for checksum in [Checksum::None, Checksum::Xxh3] {
            out.push(
                encode_request_with(i as u64 + 1, r, checksum)
                    .expect("valid request")
                    .to_vec(),
            );
        }
    }
    // Two frames back to back.
    let two = [out[0].clone(), out[2].clone()].concat();
    out.push(two);
    out
}

#[test]
fn fuzz_wire_frames() {
    sluice_fuzz::Target::new(env!("CARGO_MANIFEST_DIR"), "wire_frames")
        .seeds(valid_requests())
        .input_bytes_max(256 * 1024)
        .run(|input| {
            // The first byte picks where the stream is cut, so chunk boundaries vary too.
            let cut = input.first().map_or(1, |b| usize::from(*b) + 1);
            let mut decoder = FrameDecoder::new(64 * 1024);
            for chunk in input.chunks(cut) {
                let mut rest = chunk;
                loop {
                    match decoder.decode(&mut rest) {
                        Ok(Some(frame)) => {
                            let _ = decode_request(&frame);
                            let _ = decode_response(&frame);
                        }
                        Ok(None) => break,
                        Err(_) => return,
                    }
                    if rest.is_empty() {
                        break;
                    }
                }
            }
            let _ = decoder.finish();
        });
}
