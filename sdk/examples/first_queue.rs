//! The README's first program: create a queue, send a message, receive it and delete it.
//!
//! ```text
//! cargo run --release --bin sluiced &      # from the repository's root: data in ./sluice-data
//! cargo run --release -p sluice-sdk --example first_queue
//! ```

use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sluice_sdk::Error> {
    // A broker started without a certificate wrote a self-signed one into its data dir.
    let cert = "sluice-data/quic-selfsigned-cert.pem";
    let options = ClientOptions::new(Trust::PemFile(cert.into()));
    let client = Client::connect("127.0.0.1:7400".parse().unwrap(), options).await?;

    let queue = client.create_queue("orders").await?; // the queue's URL, as in SQS
    client.send(&queue, "order #1").await?; // returns once the message is on disk
    let long_poll = ReceiveOptions::long_poll(10, 20); // up to 10 messages, wait up to 20 s
    for m in client.receive(&queue, long_poll).await? {
        println!("{}", m.body);
        client.delete(&queue, &m.receipt_handle).await?;
    }
    Ok(())
}
