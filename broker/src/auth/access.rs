//! What a caller may reach: queues named by URL, ARN or owner account, resolved **within the
//! caller's account**. Both front ends (HTTP and native QUIC) resolve through these functions
//! and nothing else, so an account check cannot be forgotten in one of them.
//!
//! When the broker checks credentials ([`Caller::verified`]), a name that points into another
//! account resolves exactly as a queue that does not exist (`NonExistentQueue`, or
//! `ResourceNotFound` for move tasks): an attacker learns nothing about other tenants, not even
//! whether a queue exists. With authentication off (the local default) there are no tenants to
//! keep apart: any account named in a URL or ARN is served, as a local SQS emulator does.

use super::{valid_account, Caller};
use crate::error::{ServiceError, ServiceResult};
use crate::metadata::QueueMeta;
use crate::shard::Shard;
use std::sync::Arc;

/// The account an address names, split out of `http(s)://<host>/<account>/<name>` or
/// `/<account>/<name>` (the host is not checked: SDKs use many spellings of it).
pub fn parse_queue_url(url: &str) -> ServiceResult<(&str, &str)> {
    let invalid = || ServiceError::InvalidAddress(url.to_string());
    let path = match url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    {
        Some(rest) => rest.find('/').map_or("", |i| &rest[i..]),
        None => url,
    };
    let mut segs = path.strip_prefix('/').ok_or_else(invalid)?.split('/');
    let (Some(account), Some(name), None) = (segs.next(), segs.next(), segs.next()) else {
        return Err(invalid());
    };
    if !valid_account(account) || name.is_empty() {
        return Err(invalid());
    }
    Ok((account, name))
}

/// The queue a URL names, if the caller may reach it.
pub fn queue_by_url(shard: &Shard, caller: &Caller, url: &str) -> ServiceResult<Arc<QueueMeta>> {
    let (account, name) = parse_queue_url(url)?;
    shard.queue(owner(caller, Some(account))?, name)
}

/// The queue `name` of `owner` (GetQueueUrl's `QueueOwnerAWSAccountId`; the caller's own
/// account when absent).
pub fn queue_by_name(
    shard: &Shard,
    caller: &Caller,
    name: &str,
    owner_account: Option<&str>,
) -> ServiceResult<Arc<QueueMeta>> {
    shard.queue(owner(caller, owner_account)?, name)
}

/// The account an ARN (`arn:aws:sqs:<region>:<account>:<name>`) is looked up in: always the
/// caller's when credentials are checked — the shard then finds a queue of another account
/// nowhere — else the one the ARN names.
pub fn arn_account<'a>(caller: &'a Caller, arn: &'a str) -> &'a str {
    if caller.verified {
        return &caller.account;
    }
    arn.split(':')
        .nth(4)
        .filter(|a| valid_account(a))
        .unwrap_or(&caller.account)
}

/// The account a request may address: the caller's own, or any when tenants are not enforced.
fn owner<'a>(caller: &'a Caller, named: Option<&'a str>) -> ServiceResult<&'a str> {
    match named {
        None => Ok(&caller.account),
        Some(a) if a == caller.account => Ok(a),
        Some(_) if caller.verified => Err(ServiceError::NonExistentQueue),
        Some(a) if valid_account(a) => Ok(a),
        Some(_) => Err(ServiceError::NonExistentQueue),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(account: &str, verified: bool) -> Caller {
        Caller {
            account: account.to_string(),
            verified,
        }
    }

    #[test]
    fn urls_split_into_account_and_name() {
        for url in [
            "http://localhost:9324/111111111111/q",
            "https://sqs.us-east-1.amazonaws.com/111111111111/q",
            "/111111111111/q",
        ] {
            assert_eq!(parse_queue_url(url).expect(url), ("111111111111", "q"));
        }
        for bad in [
            "",
            "q",
            "http://h/q",
            "http://h/111/q/extra",
            "http://h/111/",
            "/bad account/q",
        ] {
            assert!(
                matches!(parse_queue_url(bad), Err(ServiceError::InvalidAddress(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_verified_caller_reaches_only_its_own_account() {
        let me = caller("111111111111", true);
        assert_eq!(owner(&me, None).expect("own"), "111111111111");
        assert_eq!(
            owner(&me, Some("111111111111")).expect("own"),
            "111111111111"
        );
        assert!(matches!(
            owner(&me, Some("222222222222")),
            Err(ServiceError::NonExistentQueue)
        ));
        assert_eq!(
            arn_account(&me, "arn:aws:sqs:us-east-1:222222222222:q"),
            "111111111111"
        );
    }

    #[test]
    fn without_authentication_any_account_is_addressable() {
        let anon = caller("000000000000", false);
        assert_eq!(
            owner(&anon, Some("222222222222")).expect("open"),
            "222222222222"
        );
        assert_eq!(
            arn_account(&anon, "arn:aws:sqs:us-east-1:222222222222:q"),
            "222222222222"
        );
        assert_eq!(arn_account(&anon, "not-an-arn"), "000000000000");
    }
}
