//! The web console: pages served by `sluiced` itself on the metrics/admin listener
//! (`metrics::serve`, loopback by default), with a small JSON admin API under `/console/api/`.
//!
//! | path                         | what                                                        |
//! |------------------------------|-------------------------------------------------------------|
//! | `/console/`                  | the page (`assets/index.html`), then `app.js` and `app.css` |
//! | `GET  /console/api/session`  | who is logged in and the CSRF token (auth off: a session is made) |
//! | `POST /console/api/login`    | access key id + secret → session cookie (rate limited)      |
//! | `POST /console/api/sqs/<A>`  | one SQS action `<A>` (JSON 1.0 parameters) as the session's account |
//! | `GET  /console/api/...`      | overview, queues, peek, topics, records, groups, account    |
//!
//! The assets are embedded (`include_str!`): no build step, nothing fetched from elsewhere.
//! Nothing here is on the send/receive path: the API calls the same `Shard` service API the
//! front ends call, only when a person clicks or a page polls.
//!
//! Security, as for the APIs:
//! - with auth on, a login with an access key id and its secret; the session is an opaque
//!   random token in a cookie (`HttpOnly; SameSite=Strict; Path=/console`, `Secure` when the
//!   page was loaded over https, i.e. behind a TLS proxy: the listener itself is plain HTTP);
//! - every change is a `POST` with `Content-Type: application/json`, the session's CSRF token
//!   in `X-Sluice-Csrf`, and an `Origin` (when the browser sends one) equal to the page's own;
//! - every view and action runs as the session's account through the same code the SQS API
//!   uses (`http::actions::dispatch` with that `Caller`), so it is scoped exactly as SQS is;
//! - failed logins are limited per client address ([`LOGIN_FAILURES_MAX`] per
//!   [`LOGIN_WINDOW_MS`]);
//! - with auth off, the HTTP API's `Host`/`Origin` checks (`http::local`) apply to every request;
//! - responses carry a Content-Security-Policy without inline script and with
//!   `frame-ancestors 'none'`; the script builds every node with `textContent`, never HTML.

use crate::auth::{AuthMode, Caller};
use crate::http::protocol::{self, Params, SqsError};
use crate::metadata::DEFAULT_TENANT;
use crate::shard::Shard;
use crate::stream::{FetchRequest, OffsetSpec, StreamError};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Map, Value};
use sluice_wire::FrameKind;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;

/// The page, its script and its style, embedded in the binary.
const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The cookie that holds the session token.
pub const SESSION_COOKIE: &str = "sluice_console";
/// The header that carries the CSRF token on every change.
pub const CSRF_HEADER: &str = "x-sluice-csrf";
/// A session unused this long is forgotten (log in again).
pub const SESSION_IDLE_MS: u64 = 30 * 60 * 1000;
/// Sessions kept at once; at the cap the least recently used one is dropped.
pub const SESSIONS_MAX: usize = 1_024;
/// Failed logins allowed per client address per window; more are refused (429) unchecked.
pub const LOGIN_FAILURES_MAX: u32 = 5;
/// The window of [`LOGIN_FAILURES_MAX`].
pub const LOGIN_WINDOW_MS: u64 = 60_000;
/// Client addresses whose failures are remembered; the oldest entry gives way past it.
pub const LOGIN_CLIENTS_TRACKED_MAX: usize = 4_096;
/// The largest API request body (a test message is at most 1 MiB; JSON escaping grows it).
pub const API_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Queues listed at most on the queues page (the search narrows them).
pub const QUEUES_LISTED_MAX: usize = 500;
/// Records (or messages) one browse or peek shows at most.
pub const RECORDS_SHOWN_MAX: u32 = 100;
/// Bytes one browse or peek reads at most.
pub const BROWSE_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of one key, header or body shown; the rest is cut (and said so).
pub const VALUE_SHOWN_BYTES_MAX: usize = 16 * 1024;
/// Bytes of a session token and of a CSRF token (hex doubles them).
const TOKEN_BYTES: usize = 32;

/// The Content-Security-Policy of every console response: only our own script and style,
/// no inline script, never in a frame.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Why a console request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsoleError {
    #[error("log in first")]
    LoginRequired,
    #[error("the access key id or the secret is wrong")]
    BadCredentials,
    #[error("too many failed logins from this address; wait a minute")]
    LoginThrottled,
    #[error("refused: {0}")]
    Forbidden(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
}

impl ConsoleError {
    fn status(&self) -> StatusCode {
        match self {
            ConsoleError::LoginRequired | ConsoleError::BadCredentials => StatusCode::UNAUTHORIZED,
            ConsoleError::LoginThrottled => StatusCode::TOO_MANY_REQUESTS,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<StreamError> for ConsoleError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::UnknownTopic(_) => ConsoleError::NotFound(e.to_string()),
            StreamError::Unavailable(_) | StreamError::Throttled(_) => {
                ConsoleError::Unavailable(e.to_string())
            }
            other => ConsoleError::BadRequest(other.to_string()),
        }
    }
}

impl From<crate::error::ServiceError> for ConsoleError {
    fn from(e: crate::error::ServiceError) -> Self {
        let e = SqsError::from(e);
        if e.status == 404 || e.shape == "QueueDoesNotExist" {
            ConsoleError::NotFound(e.message)
        } else {
            ConsoleError::BadRequest(e.message)
        }
    }
}

type ApiResult = Result<Value, ConsoleError>;

#[derive(Debug, Clone)]
struct Session {
    account: String,
    verified: bool,
    csrf: String,
    last_used_ms: u64,
}

/// Failed logins of one client address in the current window.
#[derive(Debug, Clone, Copy)]
struct Failures {
    window_start_ms: u64,
    count: u32,
}

/// The console's state on shard 0 (the metrics listener runs there only).
#[derive(Default)]
pub struct Console {
    sessions: RefCell<HashMap<String, Session>>,
    failures: RefCell<HashMap<IpAddr, Failures>>,
}

/// Random bytes from the kernel, as hex.
fn random_token() -> Result<String, ConsoleError> {
    use std::io::Read;
    let mut b = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| ConsoleError::Unavailable(format!("no randomness for a session: {e}")))?;
    Ok(crate::auth::sigv4::hex(&b))
}

/// Equal in time that depends on the lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The `Origin` header, if any, names the same host and port as `Host` (and a scheme).
fn same_origin(headers: &HeaderMap) -> Result<(), ConsoleError> {
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    for origin in headers.get_all(http::header::ORIGIN) {
        let o = origin.to_str().unwrap_or("");
        let authority = o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"));
        if authority.is_none_or(|a| !a.eq_ignore_ascii_case(host)) {
            return Err(ConsoleError::Forbidden(format!(
                "cross-site request: Origin {o:?} is not this console's"
            )));
        }
    }
    Ok(())
}

fn https_origin(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| o.starts_with("https://"))
}

impl Console {
    fn new_session(&self, account: String, verified: bool, now_ms: u64) -> ApiResult {
        let token = random_token()?;
        let csrf = random_token()?;
        let mut sessions = self.sessions.borrow_mut();
        sessions.retain(|_, s| now_ms.saturating_sub(s.last_used_ms) < SESSION_IDLE_MS);
        if sessions.len() >= SESSIONS_MAX {
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used_ms)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            token.clone(),
            Session {
                account: account.clone(),
                verified,
                csrf: csrf.clone(),
                last_used_ms: now_ms,
            },
        );
        Ok(json!({"token": token, "account": account, "csrf": csrf}))
    }

    fn session(&self, headers: &HeaderMap, now_ms: u64) -> Option<(String, Session)> {
        let token = cookie_token(headers)?;
        let mut sessions = self.sessions.borrow_mut();
        let s = sessions.get_mut(&token)?;
        if now_ms.saturating_sub(s.last_used_ms) >= SESSION_IDLE_MS {
            sessions.remove(&token);
            return None;
        }
        s.last_used_ms = now_ms;
        Some((token, s.clone()))
    }

    /// Refuses a login from `ip` while it has used up its failures in this window.
    fn login_allowed(&self, ip: Option<IpAddr>, now_ms: u64) -> bool {
        let Some(ip) = ip else { return true };
        self.failures.borrow().get(&ip).is_none_or(|f| {
            now_ms.saturating_sub(f.window_start_ms) >= LOGIN_WINDOW_MS
                || f.count < LOGIN_FAILURES_MAX
        })
    }

    fn login_failed(&self, ip: Option<IpAddr>, now_ms: u64) {
        let Some(ip) = ip else { return };
        let mut failures = self.failures.borrow_mut();
        if failures.len() >= LOGIN_CLIENTS_TRACKED_MAX && !failures.contains_key(&ip) {
            failures.retain(|_, f| now_ms.saturating_sub(f.window_start_ms) < LOGIN_WINDOW_MS);
            if failures.len() >= LOGIN_CLIENTS_TRACKED_MAX {
                if let Some(oldest) = failures
                    .iter()
                    .min_by_key(|(_, f)| f.window_start_ms)
                    .map(|(k, _)| *k)
                {
                    failures.remove(&oldest);
                }
            }
        }
        let f = failures.entry(ip).or_insert(Failures {
            window_start_ms: now_ms,
            count: 0,
        });
        if now_ms.saturating_sub(f.window_start_ms) >= LOGIN_WINDOW_MS {
            *f = Failures {
                window_start_ms: now_ms,
                count: 0,
            };
        }
        f.count += 1;
    }
}

/// What the listener passes in about the request besides its parts.
pub struct RequestInfo<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    pub peer: Option<IpAddr>,
    pub ready: bool,
    pub uptime_s: f64,
}

fn with_security_headers(mut r: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        http::header::X_FRAME_OPTIONS,
        HeaderValue::from_static("DENY"),
    );
    h.insert(
        http::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    r
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    with_security_headers(r)
}

fn json_response(status: StatusCode, v: &Value) -> Response<Full<Bytes>> {
    respond(
        status,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

fn error_response(e: &ConsoleError) -> Response<Full<Bytes>> {
    json_response(e.status(), &json!({"error": e.to_string()}))
}

/// Answers a request under `/console`.
pub async fn handle(
    console: &Console,
    shard: &Rc<Shard>,
    req: RequestInfo<'_>,
) -> Response<Full<Bytes>> {
    // With auth off, the HTTP API's guard against DNS rebinding and cross-site requests.
    if shard.config.auth.mode == AuthMode::None {
        if let Err(e) = crate::http::local::check(req.headers, &shard.config.http_allowed_hosts) {
            return error_response(&ConsoleError::Forbidden(e.to_string()));
        }
    }
    let get = *req.method == Method::GET || *req.method == Method::HEAD;
    match req.path {
        "/console" => {
            let mut r = respond(StatusCode::MOVED_PERMANENTLY, "text/plain", Bytes::new());
            r.headers_mut().insert(
                http::header::LOCATION,
                HeaderValue::from_static("/console/"),
            );
            return r;
        }
        "/console/" | "/console/index.html" if get => {
            return respond(
                StatusCode::OK,
                "text/html; charset=utf-8",
                Bytes::from_static(INDEX_HTML.as_bytes()),
            )
        }
        "/console/app.js" if get => {
            return respond(
                StatusCode::OK,
                "text/javascript; charset=utf-8",
                Bytes::from_static(APP_JS.as_bytes()),
            )
        }
        "/console/app.css" if get => {
            return respond(
                StatusCode::OK,
                "text/css; charset=utf-8",
                Bytes::from_static(APP_CSS.as_bytes()),
            )
        }
        _ => {}
    }
    let Some(api) = req.path.strip_prefix("/console/api/") else {
        return error_response(&ConsoleError::NotFound(req.path.to_string()));
    };
    match api_call(console, shard, api, &req).await {
        Ok((v, cookie)) => {
            let mut r = json_response(StatusCode::OK, &v);
            if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
                r.headers_mut().insert(http::header::SET_COOKIE, c);
            }
            r
        }
        Err(e) => error_response(&e),
    }
}

fn set_cookie(token: &str, secure: bool, max_age_s: u64) -> String {
    format!(
        "{SESSION_COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// A change must be a same-origin JSON POST.
fn check_post(req: &RequestInfo<'_>) -> Result<(), ConsoleError> {
    if *req.method != Method::POST {
        return Err(ConsoleError::BadRequest("changes are POST requests".into()));
    }
    same_origin(req.headers)?;
    let json_body = req
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        // A cross-site form can send only form encodings or text/plain.
        return Err(ConsoleError::Forbidden(
            "changes must be sent as application/json by the console".into(),
        ));
    }
    Ok(())
}

fn body_json(body: &[u8]) -> Result<Map<String, Value>, ConsoleError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(ConsoleError::BadRequest(
            "the body must be a JSON object".into(),
        )),
    }
}

fn query_params(query: &str) -> HashMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

async fn api_call(
    console: &Console,
    shard: &Rc<Shard>,
    api: &str,
    req: &RequestInfo<'_>,
) -> Result<(Value, Option<String>), ConsoleError> {
    let now = crate::runtime::now_ms();
    let auth_on = shard.config.auth.mode == AuthMode::SigV4;
    let secure = https_origin(req.headers);
    if api == "login" {
        check_post(req)?;
        if !console.login_allowed(req.peer, now) {
            return Err(ConsoleError::LoginThrottled);
        }
        let m = body_json(&req.body)?;
        let field = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (akid, secret) = (field("access_key_id"), field("secret"));
        let account = match shard
            .config
            .auth
            .authenticate_token(Some(&format!("{akid}:{secret}")))
        {
            Ok(a) if !auth_on || shard.config.auth.keys.contains_key(&akid) => a,
            _ => {
                console.login_failed(req.peer, now);
                return Err(ConsoleError::BadCredentials);
            }
        };
        // With auth off only a known key with its secret gets here; its account is the one
        // the SQS API gives that key.
        let s = console.new_session(account, auth_on, now)?;
        let token = s["token"].as_str().unwrap_or("").to_string();
        let cookie = set_cookie(&token, secure, SESSION_IDLE_MS / 1000);
        return Ok((
            json!({"account": s["account"], "csrf": s["csrf"], "auth": auth_on}),
            Some(cookie),
        ));
    }
    if api == "session" && *req.method == Method::GET {
        if let Some((_, s)) = console.session(req.headers, now) {
            return Ok((
                json!({"account": s.account, "csrf": s.csrf, "auth": auth_on}),
                None,
            ));
        }
        if auth_on {
            return Ok((json!({"login_required": true, "auth": true}), None));
        }
        // Auth off: everyone is the default account, as in the SQS API; the session only
        // carries the CSRF token.
        let s = console.new_session(DEFAULT_TENANT.to_string(), false, now)?;
        let token = s["token"].as_str().unwrap_or("").to_string();
        return Ok((
            json!({"account": s["account"], "csrf": s["csrf"], "auth": false}),
            Some(set_cookie(&token, secure, SESSION_IDLE_MS / 1000)),
        ));
    }
    let Some((token, session)) = console.session(req.headers, now) else {
        return Err(ConsoleError::LoginRequired);
    };
    let caller = Caller {
        account: session.account.clone(),
        verified: session.verified,
    };
    let get = *req.method == Method::GET || *req.method == Method::HEAD;
    if !get {
        check_post(req)?;
        let given = req
            .headers
            .get(CSRF_HEADER)
            .map(HeaderValue::as_bytes)
            .unwrap_or(b"");
        if !constant_time_eq(given, session.csrf.as_bytes()) {
            return Err(ConsoleError::Forbidden(
                "missing or wrong CSRF token".into(),
            ));
        }
    }
    let q = query_params(req.query);
    let arg = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    let v = match (get, api) {
        (false, "logout") => {
            console.sessions.borrow_mut().remove(&token);
            return Ok((json!({"ok": true}), Some(set_cookie("", secure, 0))));
        }
        (false, a) if a.starts_with("sqs/") => sqs(shard, &caller, req, &a["sqs/".len()..]).await?,
        (true, "overview") => overview(shard, req).await,
        (true, "queues") => queues(shard, &caller, arg("search")).await,
        (true, "peek") => peek(shard, &caller, &q).await?,
        (true, "topics") => topics(shard, &caller).await,
        (true, "records") => records(shard, &caller, &q).await?,
        (true, "groups") => groups(shard, &caller).await?,
        (true, "group") => group(shard, &caller, arg("name")).await?,
        (true, "account") => account(shard, &caller),
        _ => return Err(ConsoleError::NotFound(format!("/console/api/{api}"))),
    };
    Ok((v, None))
}

/// One SQS action, as the SQS API runs it for this account.
async fn sqs(shard: &Rc<Shard>, caller: &Caller, req: &RequestInfo<'_>, action: &str) -> ApiResult {
    if !crate::http::actions::ACTIONS.contains(&action) {
        return Err(ConsoleError::NotFound(format!("no SQS action {action}")));
    }
    if req.body.len() > API_BODY_BYTES_MAX {
        return Err(ConsoleError::BadRequest("the request is too large".into()));
    }
    let params = Params::from_json(body_json(&req.body)?);
    let host = shard.config.http_addr.to_string();
    let ctx = crate::http::actions::Ctx {
        shard,
        caller,
        host: &host,
        path_queue: None,
    };
    let out = match crate::http::actions::dispatch(&ctx, action, params).await {
        Ok(out) => out,
        Err(e) => {
            // The SQS error as the API would answer it, shown as it is.
            return Ok(json!({"error": e.message, "code": e.shape}));
        }
    };
    let mut buf = Vec::new();
    protocol::render_json(out.as_ref(), &mut buf);
    serde_json::from_slice(&buf).map_err(|e| ConsoleError::Unavailable(e.to_string()))
}

async fn overview(shard: &Rc<Shard>, req: &RequestInfo<'_>) -> Value {
    let now = crate::runtime::now_ms();
    let snapshots = shard.metrics_snapshots().await;
    let disk_full = shard.disk.is_full(now);
    let (ready, why) = if !req.ready {
        (
            false,
            "starting: not every shard has started its front ends",
        )
    } else if disk_full {
        (
            false,
            "disk full: sends are refused until space is freed; receives and deletes go on",
        )
    } else {
        (true, "")
    };
    let mut ops = crate::metrics::OpCounts::default();
    let mut request_latency: HashMap<&'static str, (u64, u64)> = HashMap::new();
    for s in &snapshots {
        for p in &s.partitions {
            ops.sent += p.ops.sent;
            ops.received += p.ops.received;
            ops.deleted += p.ops.deleted;
            ops.dead_lettered += p.ops.dead_lettered;
            ops.redriven += p.ops.redriven;
        }
        for (a, r) in &s.requests {
            let name = match a {
                crate::metrics::Action::Sqs(n) => *n,
                crate::metrics::Action::Native(k) => match k {
                    FrameKind::SendMessage | FrameKind::SendMessageBatch => "SendMessage",
                    FrameKind::ReceiveMessage => "ReceiveMessage",
                    FrameKind::DeleteMessage | FrameKind::DeleteMessageBatch => "DeleteMessage",
                    _ => continue,
                },
                // The overview charts the queue calls; Kafka's are on the dashboard.
                crate::metrics::Action::Kafka(_) => continue,
            };
            let name = match name {
                "SendMessageBatch" => "SendMessage",
                "DeleteMessageBatch" => "DeleteMessage",
                n => n,
            };
            if matches!(name, "SendMessage" | "ReceiveMessage" | "DeleteMessage") {
                let e = request_latency.entry(name).or_default();
                e.0 += r.count;
                e.1 += r.duration_us_sum;
            }
        }
    }
    let oldest_age_ms = snapshots
        .iter()
        .flat_map(|s| s.partitions.iter())
        .filter_map(|p| p.oldest_age_ms)
        .max();
    let latency: Map<String, Value> = request_latency
        .into_iter()
        .map(|(k, (count, sum))| (k.to_string(), json!({"count": count, "us_sum": sum})))
        .collect();
    json!({
        "health": "ok",
        "ready": ready,
        "not_ready_reason": why,
        "uptime_s": req.uptime_s,
        "shards": shard.shards,
        "shards_answered": snapshots.len(),
        "disk_free_bytes": shard.disk.free_bytes(now),
        "disk_reserve_bytes": shard.disk.free_bytes_min(),
        "disk_full": disk_full,
        "now_ms": now,
        "totals": {
            "sent": ops.sent, "received": ops.received, "deleted": ops.deleted,
            "dead_lettered": ops.dead_lettered, "redriven": ops.redriven,
        },
        "request_latency": latency,
        "oldest_message_age_ms": oldest_age_ms,
    })
}

async fn queues(shard: &Rc<Shard>, caller: &Caller, search: &str) -> Value {
    let search = search.to_ascii_lowercase();
    let mut list = shard.list_queues(&caller.account, "");
    list.retain(|q| q.name.to_ascii_lowercase().contains(&search));
    list.sort_by(|a, b| a.name.cmp(&b.name));
    let total = list.len();
    list.truncate(QUEUES_LISTED_MAX);
    // One snapshot of every shard gives every partition's counters and oldest age at once.
    let snapshots = shard.metrics_snapshots().await;
    let mut by_id: HashMap<u64, (crate::engine::Counters, Option<u64>)> = HashMap::new();
    for p in snapshots.iter().flat_map(|s| s.partitions.iter()) {
        let e = by_id.entry(p.queue_id).or_default();
        e.0.visible += p.counters.visible;
        e.0.in_flight += p.counters.in_flight;
        e.0.delayed += p.counters.delayed;
        e.1 = e.1.max(p.oldest_age_ms);
    }
    let rows: Vec<Value> = list
        .iter()
        .map(|q| {
            let (c, age) = by_id.get(&q.id).cloned().unwrap_or_default();
            json!({
                "name": q.name,
                "url": format!("http://{}/{}/{}", shard.config.http_addr, q.tenant, q.name),
                "fifo": q.name.ends_with(".fifo"),
                "partitions": q.partitions,
                "visible": c.visible,
                "in_flight": c.in_flight,
                "delayed": c.delayed,
                "oldest_age_ms": age,
            })
        })
        .collect();
    json!({"queues": rows, "total": total, "shown_max": QUEUES_LISTED_MAX})
}

/// Bytes shown safely: UTF-8 text without control characters as text (the page escapes it),
/// anything else as hex; long values are cut.
fn shown(bytes: &[u8]) -> Value {
    let cut = bytes.len() > VALUE_SHOWN_BYTES_MAX;
    let b = &bytes[..bytes.len().min(VALUE_SHOWN_BYTES_MAX)];
    let text = std::str::from_utf8(b).ok().filter(|s| {
        !s.chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    });
    match text {
        Some(t) => json!({"text": t, "bytes": bytes.len(), "cut": cut}),
        None => json!({"hex": crate::auth::sigv4::hex(b), "bytes": bytes.len(), "cut": cut}),
    }
}

fn record_json(offset: u64, partition: u32, r: &sluice_storage::Record) -> Value {
    json!({
        "partition": partition,
        "offset": offset,
        "timestamp_ms": r.timestamp_ms,
        "key": r.key.as_deref().map(shown),
        "headers": r.headers.iter().map(|(k, v)| json!({"key": shown(k), "value": shown(v)})).collect::<Vec<_>>(),
        "value": shown(&r.value),
    })
}

fn number<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    k: &str,
) -> Result<Option<T>, ConsoleError> {
    match q.get(k).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| ConsoleError::BadRequest(format!("{k}={v}: not a number"))),
    }
}

/// A queue's messages read through its stream view: no lease, no receive count, no change.
async fn peek(shard: &Rc<Shard>, caller: &Caller, q: &HashMap<String, String>) -> ApiResult {
    let name = q.get("queue").map(String::as_str).unwrap_or("");
    let meta = crate::auth::access::queue_by_name(shard, caller, name, None)?;
    let max = number::<u32>(q, "max")?
        .unwrap_or(20)
        .clamp(1, RECORDS_SHOWN_MAX);
    let mut out = Vec::new();
    let mut partitions = Vec::new();
    for p in 0..meta.partitions {
        let start = shard
            .list_queue_offset(&meta, p, OffsetSpec::Earliest)
            .await?;
        let end = shard
            .list_queue_offset(&meta, p, OffsetSpec::Latest)
            .await?;
        partitions.push(json!({"partition": p, "start": start, "end": end}));
        let mut at = start;
        while (out.len() as u32) < max && at < end {
            let req = FetchRequest {
                offset: at,
                max_bytes: BROWSE_BYTES_MAX,
                max_records: max - out.len() as u32,
                wait_ms: 0,
            };
            let f = match shard.fetch_queue_stream(&meta, p, req).await {
                Ok(f) => f,
                // Compaction removed the start meanwhile: stop at what was read.
                Err(StreamError::OffsetOutOfRange { .. }) => break,
                Err(e) => return Err(e.into()),
            };
            for r in &f.records {
                out.push(record_json(r.offset, p, &r.record));
            }
            if f.next_offset <= at {
                break;
            }
            at = f.next_offset;
        }
    }
    Ok(json!({"queue": meta.name, "partitions": partitions, "messages": out}))
}

async fn topics(shard: &Rc<Shard>, caller: &Caller) -> Value {
    let mut list = shard.list_topics(&caller.account);
    list.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows = Vec::new();
    for t in list {
        let mut parts = Vec::new();
        for p in 0..t.partitions() {
            let start = shard.list_offset(&t, p, OffsetSpec::Earliest).await.ok();
            let end = shard.list_offset(&t, p, OffsetSpec::Latest).await.ok();
            parts.push(json!({"partition": p, "start": start, "end": end}));
        }
        rows.push(json!({
            "name": t.name,
            "partitions": parts,
            "retention_ms": t.config.retention_ms,
            "retention_bytes": t.config.retention_bytes,
            "segment_bytes": t.config.segment_bytes,
            "created_ms": t.created_ms,
        }));
    }
    json!({"topics": rows})
}

/// Records of a topic partition from an offset, or from the first at or after a time.
async fn records(shard: &Rc<Shard>, caller: &Caller, q: &HashMap<String, String>) -> ApiResult {
    let t = shard.topic(
        &caller.account,
        q.get("topic").map(String::as_str).unwrap_or(""),
    )?;
    let partition = number::<u32>(q, "partition")?.unwrap_or(0);
    let max = number::<u32>(q, "max")?
        .unwrap_or(20)
        .clamp(1, RECORDS_SHOWN_MAX);
    let offset = match (number::<u64>(q, "offset")?, number::<i64>(q, "time_ms")?) {
        (Some(o), _) => o,
        (None, Some(t_ms)) => {
            shard
                .list_offset(&t, partition, OffsetSpec::Timestamp(t_ms))
                .await?
        }
        (None, None) => {
            shard
                .list_offset(&t, partition, OffsetSpec::Earliest)
                .await?
        }
    };
    let req = FetchRequest {
        offset,
        max_bytes: BROWSE_BYTES_MAX,
        max_records: max,
        wait_ms: 0,
    };
    let f = shard.fetch(&t, partition, req).await?;
    let recs: Vec<Value> = f
        .records(offset)?
        .iter()
        .take(max as usize)
        .map(|r| record_json(r.offset, partition, &r.record))
        .collect();
    Ok(json!({
        "topic": t.name, "partition": partition, "from": offset,
        "start": f.start_offset, "end": f.end_offset, "records": recs,
    }))
}

async fn groups(shard: &Rc<Shard>, caller: &Caller) -> ApiResult {
    let names = shard.list_groups(&caller.account).await?;
    let mut rows = Vec::new();
    for g in names {
        let lag: u64 = shard
            .group_lag(&caller.account, &g)
            .await
            .map(|l| l.iter().map(|p| p.lag).sum())
            .unwrap_or(0);
        rows.push(json!({"name": g, "lag": lag}));
    }
    Ok(json!({"groups": rows}))
}

async fn group(shard: &Rc<Shard>, caller: &Caller, name: &str) -> ApiResult {
    let lags = shard.group_lag(&caller.account, name).await?;
    let described = shard.describe_group(&caller.account, name).await?;
    let members: Vec<Value> = described
        .as_ref()
        .map(|d| {
            d.members
                .iter()
                .map(|(m, parts)| {
                    json!({
                        "member": m,
                        "assignments": parts.iter().map(|(t, p)| json!({"topic": t, "partition": p})).collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let partitions: Vec<Value> = lags
        .iter()
        .map(|l| {
            json!({"topic": l.topic, "partition": l.partition, "committed": l.committed,
                   "latest": l.latest, "lag": l.lag})
        })
        .collect();
    Ok(json!({
        "name": name,
        "generation": described.as_ref().map(|d| d.generation),
        "members": members,
        "partitions": partitions,
        "now_ms": crate::runtime::now_ms(),
    }))
}

fn account(shard: &Rc<Shard>, caller: &Caller) -> Value {
    let quotas = &shard.config.quotas;
    let keys: Vec<&String> = {
        let mut k: Vec<&String> = shard
            .config
            .auth
            .keys
            .iter()
            .filter(|(_, c)| c.account == caller.account)
            .map(|(id, _)| id)
            .collect();
        k.sort();
        k
    };
    json!({
        "account": caller.account,
        "authenticated": caller.verified,
        "auth_mode": if shard.config.auth.mode == AuthMode::SigV4 { "sigv4" } else { "none" },
        "access_key_ids": keys,
        "queues": shard.list_queues(&caller.account, "").len(),
        "topics": shard.list_topics(&caller.account).len(),
        "quotas": {
            "requests_per_s": quotas.requests_per_s,
            "bytes_per_s": quotas.bytes_per_s,
            "queues_per_account": quotas.queues_per_account,
            "stored_bytes_per_account": quotas.stored_bytes_per_account,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn cross_origin_changes_are_refused() {
        let same = headers(&[
            ("host", "127.0.0.1:9400"),
            ("origin", "http://127.0.0.1:9400"),
        ]);
        assert!(same_origin(&same).is_ok());
        assert!(same_origin(&headers(&[("host", "127.0.0.1:9400")])).is_ok());
        for evil in [
            "http://localhost:9400",
            "http://127.0.0.1:8000",
            "https://evil.example",
            "null",
        ] {
            let h = headers(&[("host", "127.0.0.1:9400"), ("origin", evil)]);
            assert!(same_origin(&h).is_err(), "{evil}");
        }
    }

    #[test]
    fn binary_is_hex_and_text_is_text() {
        assert_eq!(shown(b"<script>")["text"], "<script>");
        assert_eq!(shown(&[0, 1, 0xff])["hex"], "0001ff");
        assert_eq!(shown(b"a\x1bb")["hex"], "611b62");
        let long = vec![b'a'; VALUE_SHOWN_BYTES_MAX + 1];
        assert_eq!(shown(&long)["cut"], true);
    }

    #[test]
    fn logins_are_limited_per_address() {
        let c = Console::default();
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let other: IpAddr = "127.0.0.2".parse().expect("ip");
        for _ in 0..LOGIN_FAILURES_MAX {
            assert!(c.login_allowed(Some(ip), 1_000));
            c.login_failed(Some(ip), 1_000);
        }
        assert!(!c.login_allowed(Some(ip), 1_000));
        assert!(c.login_allowed(Some(other), 1_000));
        assert!(c.login_allowed(Some(ip), 1_000 + LOGIN_WINDOW_MS));
    }

    #[test]
    fn sessions_expire_and_are_found_by_cookie() {
        let c = Console::default();
        let s = c.new_session("111".into(), true, 0).expect("session");
        let token = s["token"].as_str().expect("token").to_string();
        let cookie = format!("other=1; {SESSION_COOKIE}={token}");
        let h = headers(&[("cookie", cookie.as_str())]);
        assert_eq!(
            c.session(&h, 10).map(|(_, s)| s.account).as_deref(),
            Some("111")
        );
        assert!(c.session(&h, 10 + SESSION_IDLE_MS).is_none());
        assert!(c
            .session(&headers(&[("cookie", "sluice_console=nope")]), 0)
            .is_none());
    }
}
