//! A consumer loop: receive, run the handler with visibility heartbeats, delete on success.

use std::future::Future;
use std::time::Duration;

use sluice_wire::messages::Message;

use crate::error::Result;
use crate::{Client, ReceiveOptions};

/// How [`Client::consume`] receives and leases.
#[derive(Clone, Debug)]
pub struct ConsumeOptions {
    /// Messages per receive (1–10); they are handled concurrently. Default 10.
    pub max_messages: u32,
    /// Long-poll wait per receive, 0–20 s. Default 20.
    pub wait_time_seconds: u32,
    /// The lease a received message gets, renewed every half of it while its handler runs.
    /// Default 30 s.
    pub visibility_timeout_seconds: u32,
    /// Return after this many empty receives in a row (`None`: never). Default `None`.
    pub stop_after_empty_receives: Option<u32>,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        ConsumeOptions {
            max_messages: 10,
            wait_time_seconds: 20,
            visibility_timeout_seconds: 30,
            stop_after_empty_receives: None,
        }
    }
}

impl Client {
    /// Receives messages from `queue_url` and runs `handler` on each: on `Ok` the message is
    /// deleted, on `Err` it is left to come back after its lease (at-least-once). While a
    /// handler runs, its message's lease is extended (a heartbeat every half visibility
    /// timeout), so slow work is not handed to another consumer meanwhile. Returns on a
    /// receive or delete error, or per [`ConsumeOptions::stop_after_empty_receives`].
    ///
    /// ```no_run
    /// # async fn demo(client: sluice_sdk::Client, queue_url: String) -> sluice_sdk::Result<()> {
    /// client
    ///     .consume(&queue_url, Default::default(), |m| async move {
    ///         println!("{}", m.body);
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub async fn consume<F, Fut, E>(
        &self,
        queue_url: &str,
        options: ConsumeOptions,
        handler: F,
    ) -> Result<()>
    where
        F: Fn(Message) -> Fut,
        Fut: Future<Output = std::result::Result<(), E>>,
        E: std::fmt::Display,
    {
        let visibility = options.visibility_timeout_seconds.max(1);
        let mut empty = 0u32;
        loop {
            let received = self
                .receive(
                    queue_url,
                    ReceiveOptions {
                        visibility_timeout: Some(visibility),
                        ..ReceiveOptions::long_poll(options.max_messages, options.wait_time_seconds)
                    },
                )
                .await?;
            if received.is_empty() {
                empty += 1;
                if options
                    .stop_after_empty_receives
                    .is_some_and(|n| empty >= n)
                {
                    return Ok(());
                }
                continue;
            }
            empty = 0;
            let work = received
                .into_iter()
                .map(|m| self.handle_one(queue_url, visibility, m, &handler));
            for r in futures::future::join_all(work).await {
                r?;
            }
        }
    }

    async fn handle_one<F, Fut, E>(
        &self,
        queue_url: &str,
        visibility: u32,
        message: Message,
        handler: &F,
    ) -> Result<()>
    where
        F: Fn(Message) -> Fut,
        Fut: Future<Output = std::result::Result<(), E>>,
        E: std::fmt::Display,
    {
        let handle = message.receipt_handle.clone();
        let heartbeat = {
            let (client, url, handle) = (self.clone(), queue_url.to_string(), handle.clone());
            tokio::spawn(async move {
                let every = Duration::from_millis(u64::from(visibility) * 500);
                loop {
                    tokio::time::sleep(every).await;
                    if let Err(e) = client.change_visibility(&url, &handle, visibility).await {
                        tracing::warn!(error = %e, "sluice consumer: heartbeat failed");
                        return;
                    }
                }
            })
        };
        let outcome = handler(message).await;
        heartbeat.abort();
        match outcome {
            Ok(()) => self.delete(queue_url, &handle).await,
            Err(e) => {
                tracing::debug!(error = %e, "sluice consumer: handler failed; message left for redelivery");
                Ok(())
            }
        }
    }
}
