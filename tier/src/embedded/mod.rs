//! The embedded S3 server: s3s over Sluice's own file-system backend, on loopback, on its own
//! thread with its own tokio runtime, authenticated with keys generated under the data dir.
//!
//! | module      | what                                                             |
//! |-------------|------------------------------------------------------------------|
//! | `fsstore`   | objects, multipart uploads and listings on disk (durable, locked)|
//! | `backend`   | s3s's `S3` trait over `fsstore`, errors mapped to S3 codes        |
//! | `faults`    | injected faults (5xx, hangs, dropped connections, lost responses)|
//!
//! Start with [`start_embedded`]; the returned [`EmbeddedHandle`] carries the endpoint, the
//! bucket and the keys a client needs, and stops the server when dropped.

mod backend;
mod faults;
mod fsstore;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub use self::backend::LIST_PAGE_KEYS_MAX;
pub use self::faults::{Fault, FaultInjector, FaultRule};
pub use self::fsstore::KEY_LEN_BYTES_MAX;

/// The one bucket the embedded server creates; Sluice keeps all tiered objects in it.
pub const BUCKET: &str = "sluice";
/// File under the data dir holding the generated access key and secret (mode 0600).
pub const CREDENTIALS_FILE: &str = "credentials";
/// Permission bits of the credentials file: owner read/write only.
const CREDENTIALS_MODE: u32 = 0o600;
/// Abandoned multipart uploads older than this are swept (their parts would hold disk forever).
pub const UPLOAD_AGE_MAX_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;
/// How often the sweep looks for abandoned uploads.
pub const UPLOAD_SWEEP_INTERVAL_MS_DEFAULT: u64 = 10 * 60 * 1000;
/// Worker threads of the server's runtime: it serves one broker's tiering, not the world.
const RUNTIME_WORKERS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("embedded s3: i/o on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("embedded s3: the credentials file {0} is malformed")]
    BadCredentials(PathBuf),
    #[error("embedded s3: opening the store: {0}")]
    Store(#[from] fsstore::FsError),
    #[error("embedded s3: {0} is not a loopback address (the embedded server is single-node, for this host only)")]
    NotLoopback(SocketAddr),
    #[error("embedded s3: the server thread failed to start: {0}")]
    Start(String),
}

/// Settings of the embedded server; [`EmbeddedConfig::new`] has the defaults.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub dir: PathBuf,
    /// A loopback address (anything else is refused); port 0 picks a free port.
    pub addr: SocketAddr,
    pub upload_age_max_ms: u64,
    pub upload_sweep_interval_ms: u64,
}

impl EmbeddedConfig {
    pub fn new(dir: &Path, addr: SocketAddr) -> Self {
        Self {
            dir: dir.to_path_buf(),
            addr,
            upload_age_max_ms: UPLOAD_AGE_MAX_MS_DEFAULT,
            upload_sweep_interval_ms: UPLOAD_SWEEP_INTERVAL_MS_DEFAULT,
        }
    }
}

/// The access key and secret a client signs its requests with.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .finish()
    }
}

/// A running embedded server. Dropping it (or [`EmbeddedHandle::shutdown`]) stops the server
/// and closes every connection; objects already acknowledged stay on disk.
pub struct EmbeddedHandle {
    pub endpoint: String,
    pub addr: SocketAddr,
    pub bucket: String,
    pub credentials: Credentials,
    pub faults: Arc<FaultInjector>,
    dir: PathBuf,
    store: Arc<fsstore::FsStore>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    runtime: tokio::runtime::Handle,
}

impl EmbeddedHandle {
    /// Stops the server and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Removes abandoned multipart uploads older than `age` now (the periodic sweep's work).
    pub fn sweep_uploads(&self, age: Duration) -> Result<usize, EmbeddedError> {
        let store = self.store.clone();
        Ok(self
            .runtime
            .block_on(async move { store.sweep_uploads(age).await })?)
    }

    /// Multipart uploads on disk (started, neither completed nor aborted).
    pub fn upload_count(&self) -> Result<usize, EmbeddedError> {
        let store = self.store.clone();
        Ok(self
            .runtime
            .block_on(async move { store.upload_count().await })?)
    }

    /// The data dir (objects live under `buckets/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EmbeddedHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Starts the embedded server on `addr` (loopback; port 0 picks one) with its data in `dir`.
pub fn start_embedded(dir: &Path, addr: SocketAddr) -> Result<EmbeddedHandle, EmbeddedError> {
    start_embedded_with(EmbeddedConfig::new(dir, addr))
}

pub fn start_embedded_with(config: EmbeddedConfig) -> Result<EmbeddedHandle, EmbeddedError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EmbeddedError::Io { path, source }
    };
    if !config.addr.ip().is_loopback() {
        return Err(EmbeddedError::NotLoopback(config.addr));
    }
    // The data dir itself is the operator's (or the broker's): it must exist durably already.
    std::fs::create_dir_all(&config.dir).map_err(io_err(&config.dir))?;
    let credentials = load_or_create_credentials(&config.dir)?;
    let store = Arc::new(fsstore::FsStore::open(&config.dir.join("s3"))?);
    let faults = Arc::new(FaultInjector::default());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_WORKERS)
        .thread_name("sluice-embedded-s3")
        .enable_all()
        .build()
        .map_err(io_err(&config.dir))?;
    let rt_handle = runtime.handle().clone();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(config.addr))
        .map_err(|source| EmbeddedError::Io {
            path: PathBuf::from(config.addr.to_string()),
            source,
        })?;
    let addr = listener.local_addr().map_err(io_err(&config.dir))?;
    {
        let store = store.clone();
        runtime.block_on(async move { store.create_bucket(BUCKET).await })?;
    }

    let mut builder = S3ServiceBuilder::new(backend::Backend {
        store: store.clone(),
    });
    // Every request must be signed with the generated keys; s3s's default access check then
    // refuses anonymous requests.
    builder.set_auth(SimpleAuth::from_single(
        credentials.access_key.clone(),
        credentials.secret_key.as_str(),
    ));
    let service = builder.build();

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let sweep_store = store.clone();
    let sweep_every = Duration::from_millis(config.upload_sweep_interval_ms.max(1));
    let sweep_age = Duration::from_millis(config.upload_age_max_ms);
    let thread_faults = faults.clone();
    let thread = std::thread::Builder::new()
        .name("sluice-embedded-s3".into())
        .spawn(move || {
            runtime.block_on(async move {
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(sweep_every);
                    loop {
                        tick.tick().await;
                        if let Err(e) = sweep_store.sweep_uploads(sweep_age).await {
                            tracing::warn!(error = %e, "embedded s3: upload sweep failed");
                        }
                    }
                });
                let accept = async {
                    loop {
                        let (stream, _) = match listener.accept().await {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::warn!(error = %e, "embedded s3: accept failed");
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        };
                        let svc = faults::with_faults(service.clone(), thread_faults.clone());
                        tokio::spawn(async move {
                            let _ =
                                hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                    .serve_connection(TokioIo::new(stream), svc)
                                    .await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime here ends every connection task: a stopped server answers
            // nothing more.
            runtime.shutdown_timeout(Duration::from_millis(0));
        })
        .map_err(|e| EmbeddedError::Start(e.to_string()))?;

    // The runtime moved into the thread; keep a handle for the blocking helpers. They must not
    // be called after shutdown.
    Ok(EmbeddedHandle {
        endpoint: format!("http://{addr}"),
        addr,
        bucket: BUCKET.to_string(),
        credentials,
        faults,
        dir: config.dir,
        store,
        stop: Some(stop_tx),
        thread: Some(thread),
        runtime: rt_handle,
    })
}

/// Reads the keys from `dir/credentials`, or generates them there (mode 0600, fsynced) on the
/// first start.
fn load_or_create_credentials(dir: &Path) -> Result<Credentials, EmbeddedError> {
    let path = dir.join(CREDENTIALS_FILE);
    let io_err = |source| EmbeddedError::Io {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mut lines = text.lines();
            let (Some(access_key), Some(secret_key)) = (lines.next(), lines.next()) else {
                return Err(EmbeddedError::BadCredentials(path));
            };
            if access_key.is_empty() || secret_key.is_empty() {
                return Err(EmbeddedError::BadCredentials(path));
            }
            // Tighten a file someone loosened: the secret must stay the owner's.
            let mode = std::fs::metadata(&path)
                .map_err(io_err)?
                .permissions()
                .mode();
            if mode & 0o777 != CREDENTIALS_MODE {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(CREDENTIALS_MODE))
                    .map_err(io_err)?;
            }
            Ok(Credentials {
                access_key: access_key.to_string(),
                secret_key: secret_key.to_string(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let creds = Credentials {
                access_key: format!("SLUICE{:016X}", rand::random::<u64>()),
                secret_key: format!(
                    "{:032x}{:032x}",
                    rand::random::<u128>(),
                    rand::random::<u128>()
                ),
            };
            let tmp = dir.join(format!("{CREDENTIALS_FILE}.tmp"));
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(CREDENTIALS_MODE)
                .open(&tmp)
                .map_err(io_err)?;
            f.write_all(format!("{}\n{}\n", creds.access_key, creds.secret_key).as_bytes())
                .map_err(io_err)?;
            f.sync_all().map_err(io_err)?;
            std::fs::rename(&tmp, &path).map_err(io_err)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err)?;
            Ok(creds)
        }
        Err(e) => Err(io_err(e)),
    }
}
