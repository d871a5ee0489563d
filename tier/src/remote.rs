//! The remote segment store: uploads sealed segments to any S3 API, reads ranges back through a
//! verified cache, deletes, and reconciles with a listing. It runs on its own thread with its
//! own tokio runtime; callers talk to it through a bounded channel and await a reply on a
//! runtime-agnostic oneshot, so a glommio shard never blocks on S3 (a full queue is an error
//! at once, [`TierError::Overloaded`], never a wait).
//!
//! Every S3 call is one or more attempts, each cut at `attempt_timeout_ms`, retried with
//! jittered exponential backoff while the failure may be transient (5xx, timeouts, dropped
//! connections); a multipart upload that fails for good is aborted so no parts linger.

use std::collections::HashSet;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::channel::oneshot;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, PutPayload, RetryConfig,
};
use rand::Rng;

use crate::cache::{CacheKey, CacheValue, Lru};
use crate::frame::{self, FrameError, FrameMeta, FOOTER_LEN_BYTES};
use crate::key::{Part, SegmentId};

/// Defaults; each has a field in [`RemoteConfig`].
pub const ATTEMPT_TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const ATTEMPTS_MAX_DEFAULT: u32 = 6;
pub const BACKOFF_INITIAL_MS_DEFAULT: u64 = 100;
pub const BACKOFF_MAX_MS_DEFAULT: u64 = 5_000;
/// S3's smallest part (but the last) is 5 MiB; above this size an upload goes multipart.
pub const MULTIPART_THRESHOLD_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
pub const PART_SIZE_BYTES_DEFAULT: u64 = 8 * 1024 * 1024;
/// Verified-read granularity: one block is fetched, checked and cached as a unit.
pub const BLOCK_SIZE_BYTES_DEFAULT: u32 = 1024 * 1024;
pub const CACHE_CAPACITY_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Commands waiting for the store; beyond this a caller gets `Overloaded` at once.
pub const QUEUE_DEPTH_MAX_DEFAULT: usize = 1024;
/// Commands running at once; beyond it they wait in the queue (and the queue's bound then
/// refuses new ones).
pub const COMMANDS_IN_FLIGHT_MAX_DEFAULT: usize = 64;
/// Uploads running at once (each holds its segment in memory).
pub const UPLOADS_IN_FLIGHT_MAX_DEFAULT: usize = 4;
/// Reconciliation leaves objects younger than this alone: they may be an upload whose commit
/// record is still being replicated.
pub const ORPHAN_GRACE_MS_DEFAULT: u64 = 60 * 60 * 1000;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("the tier store's queue is full ({0} commands waiting)")]
    Overloaded(usize),
    #[error("the tier store has stopped")]
    Stopped,
    #[error("{op}: gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        op: &'static str,
        attempts: u32,
        last: String,
    },
    #[error("{op}: no such object {key}")]
    NotFound { op: &'static str, key: String },
    #[error("{op}: refused by the object store (authentication or permission): {detail}")]
    Refused { op: &'static str, detail: String },
    #[error("{op}: precondition failed or object exists: {key}")]
    Conflict { op: &'static str, key: String },
    #[error("{op}: {detail}")]
    Store { op: &'static str, detail: String },
    #[error("object {key} is corrupt: {source}")]
    Corrupt { key: String, source: FrameError },
    #[error("object {key}: range {start}..{end} is outside its {len} payload bytes")]
    OutOfRange {
        key: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Where and how to reach the object store.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    /// Prepended to every key (e.g. a cluster id), so one bucket can hold several clusters.
    pub key_prefix: String,
    pub attempt_timeout_ms: u64,
    pub attempts_max: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    pub multipart_threshold_bytes: u64,
    pub part_size_bytes: u64,
    pub block_size_bytes: u32,
    pub cache_capacity_bytes: u64,
    pub queue_depth_max: usize,
    pub commands_in_flight_max: usize,
    pub uploads_in_flight_max: usize,
}

impl RemoteConfig {
    pub fn new(endpoint: &str, bucket: &str, access_key: &str, secret_key: &str) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            bucket: bucket.to_string(),
            region: "us-east-1".to_string(),
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            key_prefix: String::new(),
            attempt_timeout_ms: ATTEMPT_TIMEOUT_MS_DEFAULT,
            attempts_max: ATTEMPTS_MAX_DEFAULT,
            backoff_initial_ms: BACKOFF_INITIAL_MS_DEFAULT,
            backoff_max_ms: BACKOFF_MAX_MS_DEFAULT,
            multipart_threshold_bytes: MULTIPART_THRESHOLD_BYTES_DEFAULT,
            part_size_bytes: PART_SIZE_BYTES_DEFAULT,
            block_size_bytes: BLOCK_SIZE_BYTES_DEFAULT,
            cache_capacity_bytes: CACHE_CAPACITY_BYTES_DEFAULT,
            queue_depth_max: QUEUE_DEPTH_MAX_DEFAULT,
            commands_in_flight_max: COMMANDS_IN_FLIGHT_MAX_DEFAULT,
            uploads_in_flight_max: UPLOADS_IN_FLIGHT_MAX_DEFAULT,
        }
    }

    /// The embedded server's endpoint, bucket and keys.
    pub fn for_embedded(server: &crate::EmbeddedHandle) -> Self {
        Self::new(
            &server.endpoint,
            &server.bucket,
            &server.credentials.access_key,
            &server.credentials.secret_key,
        )
    }

    /// An object_store client with this config's timeouts; its own retries are off (this
    /// module retries, so one policy holds for every call, multipart parts included).
    pub fn build_client(&self) -> Result<AmazonS3, TierError> {
        let options = ClientOptions::new()
            .with_allow_http(self.endpoint.starts_with("http://"))
            .with_timeout(Duration::from_millis(self.attempt_timeout_ms))
            .with_connect_timeout(Duration::from_millis(self.attempt_timeout_ms));
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .with_virtual_hosted_style_request(false)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_client_options(options)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 0,
                retry_timeout: Duration::from_millis(self.attempt_timeout_ms),
            })
            .build()
            .map_err(|e| TierError::Config(e.to_string()))
    }

    fn validate(&self) -> Result<(), TierError> {
        let bad = |why: &str| Err(TierError::Config(why.to_string()));
        if self.attempts_max == 0 {
            return bad("attempts_max must be at least 1");
        }
        if self.part_size_bytes == 0 || self.multipart_threshold_bytes == 0 {
            return bad("part_size_bytes and multipart_threshold_bytes must be positive");
        }
        if !(1..=frame::BLOCK_SIZE_BYTES_MAX).contains(&self.block_size_bytes) {
            return bad("block_size_bytes out of range");
        }
        if self.queue_depth_max == 0
            || self.uploads_in_flight_max == 0
            || self.commands_in_flight_max == 0
        {
            return bad("queue_depth_max and the in-flight limits must be positive");
        }
        Ok(())
    }
}

/// Where a segment went: what the commit record ("offsets [a, b) are at object K") names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedSegment {
    pub segment_key: String,
    pub index_key: String,
    pub segment_payload_bytes: u64,
    pub index_payload_bytes: u64,
}

/// What a reconciliation found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub kept: Vec<String>,
    pub deleted: Vec<String>,
    /// Not in the keep set, but younger than the grace: left alone this time.
    pub too_young: Vec<String>,
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteStats {
    pub attempts_retried: u64,
    pub multipart_aborted: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub corrupt_reads: u64,
}

enum Command {
    Upload {
        id: SegmentId,
        segment: Bytes,
        index: Bytes,
        reply: oneshot::Sender<Result<UploadedSegment, TierError>>,
    },
    Read {
        key: String,
        range: Range<u64>,
        reply: oneshot::Sender<Result<Bytes, TierError>>,
    },
    Delete {
        keys: Vec<String>,
        reply: oneshot::Sender<Result<(), TierError>>,
    },
    Reconcile {
        prefix: String,
        keep: HashSet<String>,
        grace_ms: u64,
        reply: oneshot::Sender<Result<ReconcileReport, TierError>>,
    },
}

/// The caller's side: cheap to clone, usable from any thread or runtime.
#[derive(Clone)]
pub struct RemoteHandle {
    tx: tokio::sync::mpsc::Sender<Command>,
    inner: Arc<Inner>,
    queue_depth_max: usize,
}

/// The running store; dropping it stops the thread after in-flight work is cancelled.
pub struct RemoteStore {
    handle: RemoteHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    client: AmazonS3,
    config: RemoteConfig,
    cache: Mutex<Lru>,
    stats: Mutex<RemoteStats>,
}

impl RemoteStore {
    pub fn start(config: RemoteConfig) -> Result<Self, TierError> {
        config.validate()?;
        let client = config.build_client()?;
        let inner = Arc::new(Inner {
            client,
            cache: Mutex::new(Lru::new(config.cache_capacity_bytes)),
            stats: Mutex::new(RemoteStats::default()),
            config: config.clone(),
        });
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Command>(config.queue_depth_max);
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-tier")
            .enable_all()
            .build()
            .map_err(|e| TierError::Config(format!("tier runtime: {e}")))?;
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-tier".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let uploads =
                        Arc::new(tokio::sync::Semaphore::new(worker.config.uploads_in_flight_max));
                    let running = Arc::new(tokio::sync::Semaphore::new(
                        worker.config.commands_in_flight_max,
                    ));
                    loop {
                        // A command leaves the queue only when it can run: the queue's bound
                        // is then what pushes back on callers.
                        let permit = tokio::select! {
                            p = running.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                            _ = &mut stop_rx => break,
                        };
                        let cmd = tokio::select! {
                            cmd = rx.recv() => match cmd { Some(c) => c, None => break },
                            _ = &mut stop_rx => break,
                        };
                        let w = worker.clone();
                        let uploads = uploads.clone();
                        tokio::spawn(async move {
                            w.run(cmd, uploads).await;
                            drop(permit);
                        });
                    }
                });
                runtime.shutdown_timeout(Duration::from_millis(0));
            })
            .map_err(|e| TierError::Config(format!("tier thread: {e}")))?;
        Ok(Self {
            handle: RemoteHandle {
                tx,
                inner,
                queue_depth_max: config.queue_depth_max,
            },
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> RemoteHandle {
        self.handle.clone()
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RemoteHandle {
    fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, TierError>>) -> Command,
    ) -> impl Future<Output = Result<T, TierError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.try_send(make(reply)).map_err(|e| match e {
            tokio::sync::mpsc::error::TrySendError::Full(_) => {
                TierError::Overloaded(self.queue_depth_max)
            }
            tokio::sync::mpsc::error::TrySendError::Closed(_) => TierError::Stopped,
        });
        async move {
            sent?;
            rx.await.map_err(|_| TierError::Stopped)?
        }
    }

    /// Uploads a sealed segment and its index (index first). Ok means both objects are
    /// complete in the store; only then may a commit record name them.
    pub fn upload(
        &self,
        id: SegmentId,
        segment: Bytes,
        index: Bytes,
    ) -> impl Future<Output = Result<UploadedSegment, TierError>> {
        self.submit(move |reply| Command::Upload {
            id,
            segment,
            index,
            reply,
        })
    }

    /// Reads `range` of an uploaded object's payload; every byte was checked against its
    /// block's checksum.
    pub fn read(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Bytes, TierError>> {
        let key = key.to_string();
        self.submit(move |reply| Command::Read { key, range, reply })
    }

    pub fn delete(&self, keys: Vec<String>) -> impl Future<Output = Result<(), TierError>> {
        self.submit(move |reply| Command::Delete { keys, reply })
    }

    /// Lists `prefix` and deletes every object neither in `keep` nor younger than `grace_ms`,
    /// without reading any object's data.
    pub fn reconcile(
        &self,
        prefix: &str,
        keep: HashSet<String>,
        grace_ms: u64,
    ) -> impl Future<Output = Result<ReconcileReport, TierError>> {
        let prefix = prefix.to_string();
        self.submit(move |reply| Command::Reconcile {
            prefix,
            keep,
            grace_ms,
            reply,
        })
    }

    pub fn stats(&self) -> RemoteStats {
        self.inner.stats.lock().expect("stats lock").clone()
    }

    pub fn cache_used_bytes(&self) -> u64 {
        self.inner.cache.lock().expect("cache lock").used_bytes()
    }

    pub fn key_prefix(&self) -> &str {
        &self.inner.config.key_prefix
    }
}

fn classify(op: &'static str, key: &str, e: object_store::Error) -> Result<TierError, String> {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => Ok(TierError::NotFound {
            op,
            key: key.to_string(),
        }),
        E::AlreadyExists { .. } | E::Precondition { .. } => Ok(TierError::Conflict {
            op,
            key: key.to_string(),
        }),
        E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => {
            Ok(TierError::Refused {
                op,
                detail: source.to_string(),
            })
        }
        E::InvalidPath { .. } | E::NotSupported { .. } | E::NotImplemented => {
            Ok(TierError::Store {
                op,
                detail: e.to_string(),
            })
        }
        // 5xx, timeouts, refused and dropped connections: worth another attempt.
        other => Err(other.to_string()),
    }
}

impl Inner {
    async fn run(self: Arc<Self>, cmd: Command, uploads: Arc<tokio::sync::Semaphore>) {
        match cmd {
            Command::Upload {
                id,
                segment,
                index,
                reply,
            } => {
                let Ok(_permit) = uploads.acquire().await else {
                    let _ = reply.send(Err(TierError::Stopped));
                    return;
                };
                let _ = reply.send(self.upload(&id, &segment, &index).await);
            }
            Command::Read { key, range, reply } => {
                let _ = reply.send(self.read(&key, range).await);
            }
            Command::Delete { keys, reply } => {
                let mut result = Ok(());
                for k in &keys {
                    if let Err(e) = self.delete(k).await {
                        result = Err(e);
                        break;
                    }
                }
                let _ = reply.send(result);
            }
            Command::Reconcile {
                prefix,
                keep,
                grace_ms,
                reply,
            } => {
                let _ = reply.send(self.reconcile(&prefix, &keep, grace_ms).await);
            }
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or `attempts_max` is spent; each
    /// attempt is cut at `attempt_timeout_ms`.
    async fn retry<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        mut attempt: F,
    ) -> Result<T, TierError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, object_store::Error>>,
    {
        let timeout = Duration::from_millis(self.config.attempt_timeout_ms);
        let mut backoff_ms = self.config.backoff_initial_ms.max(1);
        let mut last = String::new();
        for n in 1..=self.config.attempts_max {
            match tokio::time::timeout(timeout, attempt()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => match classify(op, key, e) {
                    Ok(permanent) => return Err(permanent),
                    Err(transient) => last = transient,
                },
                Err(_) => last = format!("attempt timed out after {timeout:?}"),
            }
            if n == self.config.attempts_max {
                break;
            }
            self.stats.lock().expect("stats lock").attempts_retried += 1;
            // Full jitter: retries of many callers spread out instead of arriving together.
            let sleep_ms = rand::thread_rng().gen_range(backoff_ms / 2..=backoff_ms);
            tracing::debug!(op, key, attempt = n, sleep_ms, error = %last, "tier: retrying");
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            backoff_ms = (backoff_ms * 2).min(self.config.backoff_max_ms.max(1));
        }
        Err(TierError::RetriesExhausted {
            op,
            attempts: self.config.attempts_max,
            last,
        })
    }

    async fn upload(
        &self,
        id: &SegmentId,
        segment: &[u8],
        index: &[u8],
    ) -> Result<UploadedSegment, TierError> {
        let prefix = &self.config.key_prefix;
        let index_key = id.key(prefix, Part::Index);
        let segment_key = id.key(prefix, Part::Segment);
        self.put_object(
            &index_key,
            frame::encode(index, self.config.block_size_bytes),
        )
        .await?;
        self.put_object(
            &segment_key,
            frame::encode(segment, self.config.block_size_bytes),
        )
        .await?;
        Ok(UploadedSegment {
            segment_key,
            index_key,
            segment_payload_bytes: segment.len() as u64,
            index_payload_bytes: index.len() as u64,
        })
    }

    /// Puts one object: a single PUT up to the threshold, else multipart (aborted if it fails
    /// for good). The key is the segment's identity, so a retried or redone upload rewrites
    /// the same bytes: overwriting is idempotent.
    async fn put_object(&self, key: &str, body: Bytes) -> Result<(), TierError> {
        let path = ObjPath::from(key);
        if (body.len() as u64) <= self.config.multipart_threshold_bytes {
            return self
                .retry("put", key, || {
                    self.client.put(&path, PutPayload::from_bytes(body.clone()))
                })
                .await
                .map(|_| ());
        }
        let upload_id = self
            .retry("create multipart", key, || {
                self.client.create_multipart(&path)
            })
            .await?;
        match self.put_parts(key, &path, &upload_id, &body).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // No parts may outlive a failed upload (they cost storage and are invisible).
                let aborted = self
                    .retry("abort multipart", key, || {
                        self.client.abort_multipart(&path, &upload_id)
                    })
                    .await;
                self.stats.lock().expect("stats lock").multipart_aborted += 1;
                if let Err(abort_err) = aborted {
                    tracing::warn!(key, error = %abort_err, "tier: abort failed; the server's age sweep will remove the parts");
                }
                Err(e)
            }
        }
    }

    async fn put_parts(
        &self,
        key: &str,
        path: &ObjPath,
        upload_id: &String,
        body: &Bytes,
    ) -> Result<(), TierError> {
        let part_size = usize::try_from(self.config.part_size_bytes).unwrap_or(usize::MAX);
        let mut parts = Vec::new();
        let mut offset = 0usize;
        let mut idx = 0usize;
        while offset < body.len() {
            let end = (offset + part_size).min(body.len());
            let chunk = body.slice(offset..end);
            let part = self
                .retry("upload part", key, || {
                    self.client.put_part(
                        path,
                        upload_id,
                        idx,
                        PutPayload::from_bytes(chunk.clone()),
                    )
                })
                .await?;
            parts.push(part);
            offset = end;
            idx += 1;
        }
        let completed = self
            .retry("complete multipart", key, || {
                self.client
                    .complete_multipart(path, upload_id, parts.clone())
            })
            .await;
        match completed {
            Ok(_) => Ok(()),
            // A retry of a Complete whose answer was lost finds the upload gone: the object
            // is there if that first Complete took effect.
            Err(TierError::NotFound { .. }) => {
                let head = self.retry("head", key, || self.client.head(path)).await?;
                if head.size == body.len() as u64 {
                    Ok(())
                } else {
                    Err(TierError::Store {
                        op: "complete multipart",
                        detail: format!(
                            "upload gone and the object has {} bytes, not {}",
                            head.size,
                            body.len()
                        ),
                    })
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn get_range(&self, key: &str, range: GetRange) -> Result<Bytes, TierError> {
        let path = ObjPath::from(key);
        self.retry("get", key, || {
            let opts = GetOptions {
                range: Some(range.clone()),
                ..GetOptions::default()
            };
            let path = &path;
            async move { self.client.get_opts(path, opts).await?.bytes().await }
        })
        .await
    }

    fn corrupt(&self, key: &str, source: FrameError) -> TierError {
        self.stats.lock().expect("stats lock").corrupt_reads += 1;
        // Whatever was cached for the key came from the same object: drop it all.
        self.cache
            .lock()
            .expect("cache lock")
            .remove(&CacheKey::Meta(Arc::from(key)));
        TierError::Corrupt {
            key: key.to_string(),
            source,
        }
    }

    async fn meta(&self, key: &str) -> Result<Arc<FrameMeta>, TierError> {
        let ck = CacheKey::Meta(Arc::from(key));
        if let Some(CacheValue::Meta(m)) = self.cache.lock().expect("cache lock").get(&ck) {
            return Ok(m);
        }
        let footer_bytes = self
            .get_range(key, GetRange::Suffix(FOOTER_LEN_BYTES))
            .await?;
        let footer = frame::decode_footer(&footer_bytes).map_err(|e| self.corrupt(key, e))?;
        let table_range = footer.table_range();
        let table = if table_range.is_empty() {
            Bytes::new()
        } else {
            self.get_range(key, GetRange::Bounded(table_range)).await?
        };
        let meta =
            Arc::new(frame::decode_table(&footer, &table).map_err(|e| self.corrupt(key, e))?);
        self.cache
            .lock()
            .expect("cache lock")
            .insert(ck, CacheValue::Meta(meta.clone()));
        Ok(meta)
    }

    async fn read(&self, key: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        let meta = self.meta(key).await?;
        let blocks = meta.blocks_for(&range).map_err(|_| TierError::OutOfRange {
            key: key.to_string(),
            start: range.start,
            end: range.end,
            len: meta.payload_len_bytes,
        })?;
        let key_arc: Arc<str> = Arc::from(key);
        let mut out = bytes::BytesMut::with_capacity((range.end - range.start) as usize);
        for i in blocks {
            let ck = CacheKey::Block(key_arc.clone(), i);
            let cached = self.cache.lock().expect("cache lock").get(&ck);
            let block = match cached {
                Some(CacheValue::Block(b)) => {
                    self.stats.lock().expect("stats lock").cache_hits += 1;
                    b
                }
                _ => {
                    self.stats.lock().expect("stats lock").cache_misses += 1;
                    let r = meta.block_range(i);
                    let b = self.get_range(key, GetRange::Bounded(r)).await?;
                    meta.verify_block(i, &b).map_err(|e| self.corrupt(key, e))?;
                    self.cache
                        .lock()
                        .expect("cache lock")
                        .insert(ck, CacheValue::Block(b.clone()));
                    b
                }
            };
            let br = meta.block_range(i);
            let from = range.start.max(br.start) - br.start;
            let to = range.end.min(br.end) - br.start;
            out.extend_from_slice(&block[from as usize..to as usize]);
        }
        Ok(out.freeze())
    }

    async fn delete(&self, key: &str) -> Result<(), TierError> {
        let path = ObjPath::from(key);
        let meta = {
            let mut cache = self.cache.lock().expect("cache lock");
            let ck = CacheKey::Meta(Arc::from(key));
            let m = cache.get(&ck);
            cache.remove(&ck);
            m
        };
        if let Some(CacheValue::Meta(m)) = meta {
            let mut cache = self.cache.lock().expect("cache lock");
            for i in 0..m.block_count() {
                cache.remove(&CacheKey::Block(Arc::from(key), i));
            }
        }
        match self
            .retry("delete", key, || self.client.delete(&path))
            .await
        {
            Ok(()) | Err(TierError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn reconcile(
        &self,
        prefix: &str,
        keep: &HashSet<String>,
        grace_ms: u64,
    ) -> Result<ReconcileReport, TierError> {
        let mut report = ReconcileReport::default();
        let now = SystemTime::now();
        let list_prefix = ObjPath::from(prefix);
        // The listing itself is paged by the client (1000 keys a request); each page's
        // orphans are deleted before the next is fetched, so memory stays bounded by a page
        // plus the report.
        let mut attempts_left = self.config.attempts_max;
        let mut after: Option<ObjPath> = None;
        'pages: loop {
            let mut stream = match &after {
                Some(a) => self.client.list_with_offset(Some(&list_prefix), a),
                None => self.client.list(Some(&list_prefix)),
            };
            loop {
                let item = tokio::time::timeout(
                    Duration::from_millis(self.config.attempt_timeout_ms),
                    stream.try_next(),
                )
                .await;
                let meta = match item {
                    Ok(Ok(Some(m))) => m,
                    Ok(Ok(None)) => break 'pages,
                    Ok(Err(e)) => {
                        if let Ok(permanent) = classify("list", prefix, e) {
                            return Err(permanent);
                        }
                        attempts_left -= 1;
                        if attempts_left == 0 {
                            return Err(TierError::RetriesExhausted {
                                op: "list",
                                attempts: self.config.attempts_max,
                                last: "listing failed".into(),
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(self.config.backoff_initial_ms))
                            .await;
                        continue 'pages; // resume after the last key seen
                    }
                    Err(_) => {
                        attempts_left -= 1;
                        if attempts_left == 0 {
                            return Err(TierError::RetriesExhausted {
                                op: "list",
                                attempts: self.config.attempts_max,
                                last: "listing timed out".into(),
                            });
                        }
                        continue 'pages;
                    }
                };
                let key = meta.location.to_string();
                after = Some(meta.location.clone());
                if keep.contains(&key) {
                    report.kept.push(key);
                    continue;
                }
                let age_ms = now
                    .duration_since(SystemTime::from(meta.last_modified))
                    .unwrap_or_default()
                    .as_millis();
                if age_ms < u128::from(grace_ms) {
                    report.too_young.push(key);
                    continue;
                }
                self.delete(&key).await?;
                report.deleted.push(key);
            }
        }
        Ok(report)
    }
}
