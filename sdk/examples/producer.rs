//! Sends messages to a queue.
//!
//! ```text
//! sluiced --data-dir /tmp/sluice &
//! cargo run -p sluice-sdk --example producer -- /tmp/sluice/quic-selfsigned-cert.pem orders 100
//! ```

use sluice_sdk::types::SendMessageBatchRequestEntry;
use sluice_sdk::{Client, ClientOptions, Trust};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let cert = args
        .next()
        .unwrap_or("sluice-data/quic-selfsigned-cert.pem".into());
    let queue = args.next().unwrap_or("orders".into());
    let count: usize = args.next().map_or(Ok(100), |n| n.parse())?;
    let addr = std::env::var("SLUICE_QUIC_ADDR").unwrap_or("127.0.0.1:7400".into());

    let client = Client::connect(
        addr.parse()?,
        ClientOptions::new(Trust::PemFile(cert.into())),
    )
    .await?;
    let url = client.create_queue(&queue).await?;
    // Batches of 10: one request (and one fsync'd group commit) per batch.
    for start in (0..count).step_by(10) {
        let entries = (start..count.min(start + 10))
            .map(|i| SendMessageBatchRequestEntry {
                id: i.to_string(),
                message_body: format!("order #{i}"),
                ..Default::default()
            })
            .collect();
        let result = client.send_batch(&url, entries).await?;
        for failed in &result.failed {
            eprintln!(
                "entry {} failed: {:?} {:?}",
                failed.id,
                failed.error_code(),
                failed.message
            );
        }
    }
    println!("sent {count} messages to {url}");
    Ok(())
}
