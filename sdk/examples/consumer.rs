//! Receives messages with long polling, keeps the lease of slow work alive with visibility
//! heartbeats, and deletes each message once it is processed.
//!
//! ```text
//! cargo run -p sluice-sdk --example consumer -- /tmp/sluice/quic-selfsigned-cert.pem orders
//! ```

use std::time::Duration;

use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};

/// Leases last this long; a heartbeat renews them at half of it.
const VISIBILITY_TIMEOUT_S: u32 = 30;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let cert = args
        .next()
        .unwrap_or("sluice-data/quic-selfsigned-cert.pem".into());
    let queue = args.next().unwrap_or("orders".into());
    let addr = std::env::var("SLUICE_QUIC_ADDR").unwrap_or("127.0.0.1:7400".into());

    let client = Client::connect(
        addr.parse()?,
        ClientOptions::new(Trust::PemFile(cert.into())),
    )
    .await?;
    let url = client.get_queue_url(&queue).await?;
    loop {
        let options = ReceiveOptions {
            visibility_timeout: Some(VISIBILITY_TIMEOUT_S),
            ..ReceiveOptions::long_poll(10, 20)
        };
        let messages = client.receive(&url, options).await?;
        if messages.is_empty() {
            println!("queue is empty");
            return Ok(());
        }
        for m in messages {
            // Heartbeat while the work runs, so no other consumer gets the message meanwhile.
            let heartbeat = {
                let (client, url, handle) = (client.clone(), url.clone(), m.receipt_handle.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(u64::from(
                            VISIBILITY_TIMEOUT_S / 2,
                        )))
                        .await;
                        if client
                            .change_visibility(&url, &handle, VISIBILITY_TIMEOUT_S)
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                })
            };
            println!("processing {}: {}", m.message_id, m.body);
            heartbeat.abort();
            // Delete only after the work succeeded: a crash before this redelivers it.
            client.delete(&url, &m.receipt_handle).await?;
        }
    }
}
