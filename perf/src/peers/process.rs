//! Peer servers as child processes: a fresh directory of our own under the work dir, free
//! loopback ports, a log file, a readiness probe with a deadline, and a stop on Drop that
//! terminates the server's whole process group and removes only the directory we created.

use crate::target::TargetError;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a server has to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a readiness probe is retried.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// How long one probe connection may take.
const PROBE_IO_TIMEOUT: Duration = Duration::from_millis(500);
/// How much of a server's log an error quotes.
const LOG_TAIL_BYTES: usize = 2000;

static DIRS: AtomicU32 = AtomicU32::new(0);

/// The error for a missing server binary: the suite reports the peer as skipped.
pub(crate) fn find_binary(candidates: &[&str]) -> Result<PathBuf, TargetError> {
    for c in candidates {
        let p = Path::new(c);
        if p.is_absolute() {
            if p.is_file() {
                return Ok(p.to_path_buf());
            }
        } else if let Some(paths) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&paths) {
                let full = dir.join(p);
                if full.is_file() {
                    return Ok(full);
                }
            }
        }
    }
    Err(TargetError(format!(
        "{} not found: run perf/scripts/install-peers.sh (Debian packages)",
        candidates.first().copied().unwrap_or("server")
    )))
}

/// A loopback port nobody listens on right now (the OS picks it; the server binds it a moment
/// later).
pub(crate) fn free_port() -> Result<u16, TargetError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| TargetError(format!("free port: {e}")))?;
    let port = l
        .local_addr()
        .map_err(|e| TargetError(format!("free port: {e}")))?
        .port();
    Ok(port)
}

/// Creates `work_dir/peers/<peer>-<pid>-<n>`, new and empty, for one server's data and log.
pub(crate) fn own_dir(work_dir: &Path, peer: &str) -> Result<PathBuf, TargetError> {
    let n = DIRS.fetch_add(1, Ordering::Relaxed);
    let dir = work_dir
        .join("peers")
        .join(format!("{peer}-{}-{n}", std::process::id()));
    if dir.exists() {
        return Err(TargetError(format!("{} already exists", dir.display())));
    }
    fs::create_dir_all(&dir).map_err(|e| TargetError(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// One running server. Dropping it stops it: SIGTERM to its process group, SIGKILL after
/// [`STOP_TIMEOUT`], then removes its directory (if it owns one).
pub(crate) struct Server {
    label: String,
    child: Child,
    log: PathBuf,
    /// Removed on Drop: created by [`own_dir`] for this server alone.
    owned_dir: Option<PathBuf>,
}

impl Server {
    /// Starts `cmd` in its own process group with stdout and stderr to `log`.
    pub(crate) fn spawn(
        label: &str,
        mut cmd: Command,
        log: PathBuf,
        owned_dir: Option<PathBuf>,
    ) -> Result<Server, TargetError> {
        let out = File::create(&log).map_err(|e| TargetError(format!("{}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| TargetError(format!("{}: {e}", log.display())))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| TargetError(format!("{label}: cannot start {cmd:?}: {e}")))?;
        Ok(Server {
            label: label.to_string(),
            child,
            log,
            owned_dir,
        })
    }

    /// The server's process group: it is started as the leader of a group of its own.
    pub(crate) fn group(&self) -> u32 {
        self.child.id()
    }

    /// Retries `probe` until it says the server serves, the server exits, or `timeout` passes.
    pub(crate) fn wait_ready(
        &mut self,
        timeout: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> Result<(), TargetError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(TargetError(format!(
                    "{} exited during startup ({status}); log:\n{}",
                    self.label,
                    self.log_tail()
                )));
            }
            if probe() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TargetError(format!(
                    "{} not serving after {timeout:?}; log:\n{}",
                    self.label,
                    self.log_tail()
                )));
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let start = text.len().saturating_sub(LOG_TAIL_BYTES);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    fn signal_group(&self, signal: &str) {
        // No `unsafe` for libc::kill: kill(1) signals the whole group (negative pid).
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg("--")
            .arg(format!("-{}", self.child.id()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal_group("TERM");
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Whatever is left of the group (the leader may be gone while its children linger).
        self.signal_group("KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.owned_dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Connects to `port` on loopback, writes `hello` (if any) and reads until the reply starts
/// with `expect`: a readiness probe that checks the protocol answers, not only the socket.
pub(crate) fn probe_tcp(port: u16, hello: &[u8], expect: &[u8]) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, PROBE_IO_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(PROBE_IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(PROBE_IO_TIMEOUT));
    if !hello.is_empty() && s.write_all(hello).is_err() {
        return false;
    }
    let mut got = Vec::with_capacity(expect.len());
    let mut buf = [0u8; 256];
    while got.len() < expect.len() {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got.starts_with(expect)
}
