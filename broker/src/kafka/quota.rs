//! Per-account rates on the Kafka port (`[quotas] requests_per_s`, `bytes_per_s`), charged
//! once per request as the HTTP and QUIC front ends do (`Shard::admit`, its request frame's
//! bytes). Kafka's own quotas slow a client down rather than fail it (the broker delays its
//! answer and says so in `throttle_time_ms`), and Kafka clients do not retry a throttling
//! error on most APIs; so a request over its account's rate waits here for its bucket to
//! refill, up to [`KAFKA_THROTTLE_WAIT_MS_MAX`], and only then is answered
//! `THROTTLING_QUOTA_EXCEEDED`. Requests on one connection are answered in order, so a
//! throttled client has one request waiting per connection: nothing queues up in the broker.

use super::dispatch::code;
use super::Conn;
use crate::metadata::DEFAULT_TENANT;
use std::time::Duration;

/// How often a throttled request tries its account's bucket again.
pub const KAFKA_THROTTLE_RETRY_MS: u64 = 20;
/// The longest a request waits for its account's rate before it is refused.
pub const KAFKA_THROTTLE_WAIT_MS_MAX: u64 = 5_000;

/// Charges one request of `bytes` to the connection's account, waiting while it is over its
/// rate; `Err(THROTTLING_QUOTA_EXCEEDED)` after [`KAFKA_THROTTLE_WAIT_MS_MAX`].
pub async fn admit(conn: &Conn, bytes: u64) -> Result<(), i16> {
    let account = conn.account.as_deref().unwrap_or(DEFAULT_TENANT);
    let mut waited_ms = 0;
    loop {
        match conn.shard.admit(account, bytes) {
            Ok(()) => return Ok(()),
            Err(_) if waited_ms >= KAFKA_THROTTLE_WAIT_MS_MAX => {
                return Err(code::THROTTLING_QUOTA_EXCEEDED)
            }
            Err(_) => {
                glommio::timer::sleep(Duration::from_millis(KAFKA_THROTTLE_RETRY_MS)).await;
                waited_ms += KAFKA_THROTTLE_RETRY_MS;
            }
        }
    }
}
