//! Faults injected in front of the S3 service, so the client's retries, timeouts and aborts
//! can be tested against the real server (the `finjector` idea: the hook lives in the code).
//! With no rule armed, a request passes straight through.

use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use s3s::service::S3Service;
use s3s::{Body, HttpError, HttpResponse};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status (e.g. 503) and an S3 error body, without handling.
    Status(u16),
    /// Never answer (the client's per-attempt timeout must fire).
    Hang,
    /// Close the connection without an answer, without handling.
    DropConnection,
    /// Handle the request (it takes effect), then close the connection without the answer:
    /// a lost response, e.g. a CompleteMultipartUpload that did complete.
    DropResponse,
}

/// One armed fault: applies to the next `times` requests that match.
#[derive(Debug, Clone)]
pub struct FaultRule {
    pub fault: Fault,
    /// Only requests with this method (`"PUT"`, `"GET"`, …); any if `None`.
    pub method: Option<&'static str>,
    /// Only requests whose query string contains this (e.g. `"partNumber"`, `"uploadId"`).
    pub query_contains: Option<&'static str>,
    /// Only requests without a query string (an object GET, not a listing).
    pub query_absent: bool,
    pub times: u32,
}

impl FaultRule {
    pub fn new(fault: Fault, times: u32) -> Self {
        Self {
            fault,
            method: None,
            query_contains: None,
            query_absent: false,
            times,
        }
    }

    pub fn method(mut self, method: &'static str) -> Self {
        self.method = Some(method);
        self
    }

    pub fn no_query(mut self) -> Self {
        self.query_absent = true;
        self
    }

    pub fn query(mut self, contains: &'static str) -> Self {
        self.query_contains = Some(contains);
        self
    }
}

#[derive(Debug, Default)]
pub struct FaultInjector {
    rules: Mutex<Vec<FaultRule>>,
    fired: Mutex<u64>,
}

impl FaultInjector {
    pub fn arm(&self, rule: FaultRule) {
        self.rules.lock().expect("fault lock poisoned").push(rule);
    }

    pub fn clear(&self) {
        self.rules.lock().expect("fault lock poisoned").clear();
    }

    /// How many faults have fired so far.
    pub fn fired(&self) -> u64 {
        *self.fired.lock().expect("fault lock poisoned")
    }

    fn take(&self, method: &http::Method, query: Option<&str>) -> Option<Fault> {
        let mut rules = self.rules.lock().expect("fault lock poisoned");
        let i = rules.iter().position(|r| {
            r.times > 0
                && r.method.is_none_or(|m| m == method.as_str())
                && r.query_contains
                    .is_none_or(|q| query.is_some_and(|s| s.contains(q)))
                && (!r.query_absent || query.is_none_or(str::is_empty))
        })?;
        rules[i].times -= 1;
        let fault = rules[i].fault;
        if rules[i].times == 0 {
            rules.remove(i);
        }
        *self.fired.lock().expect("fault lock poisoned") += 1;
        Some(fault)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("injected fault: connection dropped")]
struct Dropped;

/// The S3 service behind the fault injector.
#[derive(Clone)]
pub struct FaultyService {
    s3: S3Service,
    faults: Arc<FaultInjector>,
}

pub fn with_faults(s3: S3Service, faults: Arc<FaultInjector>) -> FaultyService {
    FaultyService { s3, faults }
}

impl hyper::service::Service<http::Request<Incoming>> for FaultyService {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = futures::future::BoxFuture<'static, Result<HttpResponse, HttpError>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let s3 = self.s3.clone();
        let fault = self.faults.take(req.method(), req.uri().query());
        Box::pin(async move {
            match fault {
                None => hyper::service::Service::call(&s3, req).await,
                Some(Fault::Status(code)) => {
                    let xml = format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
                         <Error><Code>ServiceUnavailable</Code>\
                         <Message>injected {code}</Message></Error>"
                    );
                    let mut resp = HttpResponse::new(Body::from(xml));
                    *resp.status_mut() = http::StatusCode::from_u16(code)
                        .unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE);
                    Ok(resp)
                }
                Some(Fault::Hang) => {
                    futures::future::pending::<()>().await;
                    Err(HttpError::new(Box::new(Dropped)))
                }
                Some(Fault::DropConnection) => Err(HttpError::new(Box::new(Dropped))),
                Some(Fault::DropResponse) => {
                    let _ = hyper::service::Service::call(&s3, req).await;
                    Err(HttpError::new(Box::new(Dropped)))
                }
            }
        })
    }
}
