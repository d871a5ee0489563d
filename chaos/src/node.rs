//! One `sluiced` process: start (waiting for its "ready" line), kill -9, SIGSTOP/SIGCONT. The
//! process is killed when the [`Node`] drops (also on a panic), and dies with the campaign
//! process itself (`PR_SET_PDEATHSIG`), so no broker outlives a run.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ChaosError;

/// How long a start may take until the "ready" line (a recovery replays the whole log).
pub const READY_TIMEOUT_MS: u64 = 60_000;
const READY_POLL_MS: u64 = 20;

/// One broker process and where it keeps its data and logs.
pub struct Node {
    pub index: usize,
    sluiced: PathBuf,
    pub data_dir: PathBuf,
    log_dir: PathBuf,
    child: Option<Child>,
    starts: u32,
    /// The QUIC address of the running process (port 0: a new one each start).
    pub quic: Option<SocketAddr>,
    /// The network namespace the process runs in (the three-node campaign's, see
    /// [`crate::net`]); `None`: the host's, on loopback.
    netns: Option<crate::net::NetNode>,
}

impl Node {
    pub fn new(index: usize, sluiced: &Path, data_dir: &Path, log_dir: &Path) -> Node {
        Node {
            index,
            sluiced: sluiced.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            child: None,
            starts: 0,
            quic: None,
            netns: None,
        }
    }

    /// Runs the process in `netns` from the next start on, its listeners on the namespace's
    /// address (port 0) instead of loopback: the peers and clients that reach that address are
    /// the ones the harness's network faults let through.
    pub fn set_netns(&mut self, netns: Option<crate::net::NetNode>) {
        self.netns = netns;
    }

    /// The self-signed certificate the broker writes into its data dir on its first start.
    pub fn cert_path(&self) -> PathBuf {
        self.data_dir.join("quic-selfsigned-cert.pem")
    }

    /// Starts the process (with a clock skew when `skew_ms` is not 0) and waits until it is
    /// ready; returns its QUIC address.
    pub fn start(&mut self, skew_ms: i64) -> Result<SocketAddr, ChaosError> {
        self.kill();
        let log = self
            .log_dir
            .join(format!("sluiced-{}-{}.log", self.index, self.starts));
        self.starts += 1;
        let out = std::fs::File::create(&log)?;
        let (mut cmd, ip) = match &self.netns {
            Some(ns) => (
                ns.command(&self.sluiced)
                    .map_err(|e| ChaosError::Net(e.to_string()))?,
                ns.addr.to_string(),
            ),
            None => (Command::new(&self.sluiced), "127.0.0.1".to_string()),
        };
        let any_port = format!("{ip}:0");
        cmd.arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--shards", "1", "--no-kafka"])
            .args(["--http-addr", &any_port, "--quic-addr", &any_port])
            .args(["--metrics-addr", &any_port])
            .env("SLUICE_AUTH", "none")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if skew_ms != 0 {
            cmd.arg(format!("--test-clock-skew-ms={skew_ms}"));
        }
        // SAFETY: prctl(2) is async-signal-safe and touches only the child's own state; it runs
        // between fork and exec. The campaign forks brokers from its main thread only, which
        // lives for the whole run, so the signal comes exactly when the campaign dies.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| ChaosError::Spawn {
            path: self.sluiced.clone(),
            error: e,
        })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = ready_quic_addr(&text) {
                self.quic = Some(addr);
                return Ok(addr);
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(ChaosError::NotReady {
                        log,
                        why: format!("exited with {status}"),
                    });
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(ChaosError::NotReady {
                    log,
                    why: format!("no ready line in {READY_TIMEOUT_MS} ms"),
                });
            }
            std::thread::sleep(Duration::from_millis(READY_POLL_MS));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(child) = self.child.as_ref() {
            let Ok(pid) = libc::pid_t::try_from(child.id()) else {
                return;
            };
            // SAFETY: kill(2) on the pid of our own child, not yet reaped (we hold its Child),
            // so the pid cannot name another process.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// kill -9 and reap. A no-op when not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a stopped process.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.quic = None;
    }

    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGSTOP for `duration`, then SIGCONT (also if this thread panics meanwhile); a no-op
    /// when not running.
    pub fn pause_for(&self, duration: Duration) -> Result<(), crate::process::ProcessError> {
        match self.child.as_ref() {
            Some(child) => crate::process::pause_for(child, duration),
            None => Ok(()),
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The QUIC address in the broker's "ready" log line
/// (`... sluiced::daemon: ready http=... quic=127.0.0.1:7400 ...`).
pub fn ready_quic_addr(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("daemon: ready"))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("quic="))
        .and_then(|a| a.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_names_the_quic_address() {
        let log = "2026 INFO sluiced::daemon: starting\n2026 INFO sluiced::daemon: ready \
                   http=127.0.0.1:1 quic=127.0.0.1:7400 quic_enabled=true metrics=127.0.0.1:2\n";
        assert_eq!(
            ready_quic_addr(log),
            Some("127.0.0.1:7400".parse().expect("addr"))
        );
        assert_eq!(ready_quic_addr("INFO sluiced::daemon: starting\n"), None);
    }
}
