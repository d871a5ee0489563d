//! Per-account quotas: requests and bytes per second, queues, and stored bytes. One tenant's burst must not
//! take the broker from the others: past its rate an account gets `RequestThrottled` (SQS's
//! retryable throttling error; the SDKs back off and retry), and the others are unaffected.
//!
//! Rates are token buckets kept by each shard for the accounts it serves, each shard allowing
//! its share of the account's rate (`rate / shards`): connections spread over the shards
//! (`SO_REUSEPORT`, one QUIC endpoint per core), so the sum is the account's rate without any
//! cross-core traffic on the request path. A bucket holds one second of its rate, so a burst of
//! up to a second's worth passes at once. Time is an argument (tests drive it).

use crate::error::ServiceError;
use std::collections::HashMap;

/// Queues an account may hold, unless configured (`[quotas] queues_per_account`).
pub const QUEUES_PER_ACCOUNT_DEFAULT: usize = 100_000;
/// How stale a shard's view of every account's stored bytes may be, ms: an account may pass
/// its stored-bytes quota by what it sends in this long (and one gathering's round trip).
pub const STORED_BYTES_CHECK_INTERVAL_MS: u64 = 250;
/// Accounts whose buckets one shard remembers; past it, full (idle) buckets are forgotten
/// first, and a forgotten account starts again with a full bucket (never less than its due).
pub const ACCOUNTS_TRACKED_MAX: usize = 10_000;

/// What each account may do (`None`: unlimited).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Requests per second, each API call one (a batch counts once).
    pub requests_per_s: Option<u32>,
    /// Request bytes per second (HTTP: the request body; QUIC: the request frame's body).
    pub bytes_per_s: Option<u64>,
    pub queues_per_account: usize,
    /// Bytes one account's queue and topic logs may hold on disk (`sluice_log_size_bytes`
    /// summed over its partitions: deleted messages count until compaction removes their
    /// segment); past it, sends and produces get `RequestThrottled` (retryable) until
    /// consumers drain, retention trims or queues are deleted.
    pub stored_bytes_per_account: Option<u64>,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            requests_per_s: None,
            bytes_per_s: None,
            queues_per_account: QUEUES_PER_ACCOUNT_DEFAULT,
            stored_bytes_per_account: None,
        }
    }
}

/// The refusal of a request past the account's request rate.
pub const REQUESTS_THROTTLED: &str =
    "this account's request rate quota is used up; retry with back-off";
/// The refusal of a request past the account's byte rate (metrics tell the two apart by it).
pub const BYTES_THROTTLED: &str = "this account's byte rate quota is used up; retry with back-off";

/// A token bucket: `tokens` available at `at_ms`, refilled at `rate` per second up to `rate`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

impl Bucket {
    fn full(rate: f64, now_ms: u64) -> Self {
        Bucket {
            tokens: rate,
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, rate: f64, now_ms: u64) {
        let elapsed_s = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed_s * rate).min(rate);
        self.at_ms = self.at_ms.max(now_ms);
    }
}

#[derive(Debug, Clone, Copy)]
struct Buckets {
    requests: Bucket,
    bytes: Bucket,
}

/// One shard's view of every account's rates.
#[derive(Debug)]
pub struct RateLimiter {
    /// This shard's share of each rate, per second.
    requests_per_s: Option<f64>,
    bytes_per_s: Option<f64>,
    accounts: HashMap<String, Buckets>,
}

impl RateLimiter {
    pub fn new(config: &QuotaConfig, shards: usize) -> Self {
        let share = |r: f64| (r / shards.max(1) as f64).max(1.0);
        RateLimiter {
            requests_per_s: config.requests_per_s.map(|r| share(f64::from(r))),
            bytes_per_s: config.bytes_per_s.map(|b| share(b as f64)),
            accounts: HashMap::new(),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.requests_per_s.is_none() && self.bytes_per_s.is_none()
    }

    /// Admits one request of `bytes` for `account` at `now_ms`, or says it is throttled (and
    /// takes nothing: a refused request costs the account nothing).
    pub fn admit(&mut self, account: &str, bytes: u64, now_ms: u64) -> Result<(), ServiceError> {
        if self.is_unlimited() {
            return Ok(());
        }
        let req_rate = self.requests_per_s.unwrap_or(f64::INFINITY);
        let byte_rate = self.bytes_per_s.unwrap_or(f64::INFINITY);
        if !self.accounts.contains_key(account) && self.accounts.len() >= ACCOUNTS_TRACKED_MAX {
            self.forget_idle(now_ms);
        }
        let b = self
            .accounts
            .entry(account.to_string())
            .or_insert_with(|| Buckets {
                requests: Bucket::full(req_rate, now_ms),
                bytes: Bucket::full(byte_rate, now_ms),
            });
        b.requests.refill(req_rate, now_ms);
        b.bytes.refill(byte_rate, now_ms);
        if b.requests.tokens < 1.0 {
            return Err(ServiceError::Throttled(REQUESTS_THROTTLED));
        }
        // A single request larger than a whole second's bytes passes when the bucket is full,
        // so that a low byte quota never makes a legal message impossible to send.
        let bytes = bytes as f64;
        if b.bytes.tokens < bytes.min(byte_rate) {
            return Err(ServiceError::Throttled(BYTES_THROTTLED));
        }
        b.requests.tokens -= 1.0;
        b.bytes.tokens -= bytes;
        Ok(())
    }

    /// Forgets the accounts whose buckets are full again (they would start full anyway); if
    /// none is, the least recently seen half.
    fn forget_idle(&mut self, now_ms: u64) {
        let (req_rate, byte_rate) = (
            self.requests_per_s.unwrap_or(f64::INFINITY),
            self.bytes_per_s.unwrap_or(f64::INFINITY),
        );
        self.accounts.retain(|_, b| {
            let (mut r, mut y) = (b.requests, b.bytes);
            r.refill(req_rate, now_ms);
            y.refill(byte_rate, now_ms);
            r.tokens < req_rate || y.tokens < byte_rate
        });
        if self.accounts.len() >= ACCOUNTS_TRACKED_MAX {
            let mut seen: Vec<u64> = self.accounts.values().map(|b| b.requests.at_ms).collect();
            seen.sort_unstable();
            let cutoff = seen[seen.len() / 2];
            self.accounts.retain(|_, b| b.requests.at_ms > cutoff);
        }
    }
}

/// One shard's view of the bytes each account stores, over every shard: gathered at most
/// every [`STORED_BYTES_CHECK_INTERVAL_MS`], when a send asks, by the shard that asks. No
/// cross-core traffic without a quota, and at most one gathering per interval per shard with
/// one. Time is an argument.
#[derive(Debug)]
pub struct StoredBytes {
    quota_bytes: Option<u64>,
    by_account: HashMap<String, u64>,
    gathered_ms: Option<u64>,
    gathering: bool,
}

impl StoredBytes {
    pub fn new(config: &QuotaConfig) -> Self {
        StoredBytes {
            quota_bytes: config.stored_bytes_per_account,
            by_account: HashMap::new(),
            gathered_ms: None,
            gathering: false,
        }
    }

    /// Whether the view should be gathered again before `account`'s send is decided at
    /// `now_ms` (and, if so, marks a gathering as started: the caller must `gathered` or
    /// `gather_failed`).
    pub fn start_gathering(&mut self, now_ms: u64) -> bool {
        let fresh = self
            .gathered_ms
            .is_some_and(|at| now_ms >= at && now_ms - at < STORED_BYTES_CHECK_INTERVAL_MS);
        if self.quota_bytes.is_none() || fresh || self.gathering {
            return false;
        }
        self.gathering = true;
        true
    }

    /// The sums of every shard, as of `now_ms`. At most one entry per account with data.
    pub fn gathered(&mut self, by_account: HashMap<String, u64>, now_ms: u64) {
        self.by_account = by_account;
        self.gathered_ms = Some(now_ms);
        self.gathering = false;
    }

    pub fn gather_failed(&mut self) {
        self.gathering = false;
    }

    /// `Ok` while `account` stores less than its quota, else the retryable error naming it.
    pub fn check(&self, account: &str) -> Result<(), ServiceError> {
        let Some(quota_bytes) = self.quota_bytes else {
            return Ok(());
        };
        let stored_bytes = self.by_account.get(account).copied().unwrap_or(0);
        if stored_bytes >= quota_bytes {
            return Err(ServiceError::StoredBytesQuota {
                stored_bytes,
                quota_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(requests: Option<u32>, bytes: Option<u64>, shards: usize) -> RateLimiter {
        RateLimiter::new(
            &QuotaConfig {
                requests_per_s: requests,
                bytes_per_s: bytes,
                ..QuotaConfig::default()
            },
            shards,
        )
    }

    #[test]
    fn stored_bytes_are_checked_against_a_view_gathered_once_per_interval() {
        let mut none = StoredBytes::new(&QuotaConfig::default());
        assert!(!none.start_gathering(0), "no quota: nothing is gathered");
        none.check("a").expect("no quota");
        let mut s = StoredBytes::new(&QuotaConfig {
            stored_bytes_per_account: Some(1_000),
            ..QuotaConfig::default()
        });
        assert!(s.start_gathering(10));
        assert!(!s.start_gathering(10), "one gathering at a time");
        s.gathered(HashMap::from([("a".into(), 1_000), ("b".into(), 999)]), 10);
        let e = s.check("a").expect_err("at the quota");
        let info = e.info();
        assert_eq!((info.code, info.http_status), ("RequestThrottled", 403));
        assert!(info.retryable);
        assert!(e.to_string().contains("stored-bytes quota"), "{e}");
        s.check("b").expect("below the quota");
        s.check("c").expect("nothing stored");
        assert!(!s.start_gathering(10 + STORED_BYTES_CHECK_INTERVAL_MS - 1));
        assert!(s.start_gathering(10 + STORED_BYTES_CHECK_INTERVAL_MS));
        s.gather_failed();
        assert!(s.start_gathering(10 + STORED_BYTES_CHECK_INTERVAL_MS));
        s.gathered(HashMap::new(), 300);
        s.check("a").expect("drained");
    }

    #[test]
    fn unlimited_admits_everything() {
        let mut l = limiter(None, None, 2);
        assert!(l.is_unlimited());
        for i in 0..100_000 {
            l.admit("a", 1 << 20, i / 1000).expect("no quota");
        }
        assert!(l.accounts.is_empty(), "nothing is tracked");
    }

    #[test]
    fn a_burst_of_one_second_then_the_rate() {
        // 20 requests/s over 2 shards: 10 per shard.
        let mut l = limiter(Some(20), None, 2);
        let mut ok = 0;
        for _ in 0..100 {
            ok += u32::from(l.admit("a", 0, 1_000).is_ok());
        }
        assert_eq!(ok, 10, "one second's worth at once");
        let e = l.admit("a", 0, 1_000).expect_err("throttled");
        assert_eq!(e.info().code, "RequestThrottled");
        assert!(e.info().retryable);
        // Another account is not affected.
        l.admit("b", 0, 1_000).expect("other account");
        // 100 ms later: one more token.
        l.admit("a", 0, 1_100).expect("refilled");
        assert!(l.admit("a", 0, 1_100).is_err());
        // A clock that goes back refills nothing and breaks nothing.
        assert!(l.admit("a", 0, 500).is_err());
        // Over a long time the rate holds: 10 s → about 100 admitted.
        let mut ok = 0;
        for t in (2_000..12_000).step_by(10) {
            ok += u32::from(l.admit("a", 0, t).is_ok());
        }
        assert!((99..=111).contains(&ok), "{ok}");
    }

    #[test]
    fn bytes_are_metered_and_a_refused_request_costs_nothing() {
        let mut l = limiter(None, Some(1_000), 1);
        l.admit("a", 600, 0).expect("fits");
        let e = l.admit("a", 600, 0).expect_err("over the byte rate");
        assert!(e.to_string().contains("byte rate"), "{e}");
        l.admit("a", 400, 0).expect("the refusal took nothing");
        // A request larger than a second's worth passes on a full bucket (never impossible).
        l.admit("a", 5_000, 10_000).expect("full bucket");
        assert!(l.admit("a", 1, 10_000).is_err(), "and it empties it");
    }

    #[test]
    fn tracked_accounts_are_bounded() {
        let mut l = limiter(Some(1_000), None, 1);
        for i in 0..(ACCOUNTS_TRACKED_MAX * 3) {
            l.admit(&format!("acct{i}"), 0, i as u64)
                .expect("first request");
        }
        assert!(
            l.accounts.len() <= ACCOUNTS_TRACKED_MAX,
            "{}",
            l.accounts.len()
        );
    }
}
