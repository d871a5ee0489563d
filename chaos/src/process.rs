//! Process faults on any child process (issue 43): a SIGSTOP pause that is always ended with
//! SIGCONT — when its time is up, or when the guard drops (also on a panic), so a failing test
//! never leaves a node frozen. [`crate::node::Node`] uses it for the broker; the three-node
//! campaign pauses one node while the others go on.

use std::process::Child;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process {pid}: {error}")]
    Signal { pid: i32, error: std::io::Error },
    #[error("the process has no valid pid")]
    NoPid,
}

/// A stopped process; dropping it sends SIGCONT.
#[must_use = "the process is resumed when the guard drops"]
pub struct Paused {
    pid: libc::pid_t,
}

impl Paused {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Resumes now (the same as dropping the guard, with the error seen).
    pub fn resume(self) -> Result<(), ProcessError> {
        let r = signal(self.pid, libc::SIGCONT);
        std::mem::forget(self);
        r
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = signal(self.pid, libc::SIGCONT);
    }
}

fn signal(pid: libc::pid_t, sig: libc::c_int) -> Result<(), ProcessError> {
    // SAFETY: kill(2) has no memory effects. The pid is a child the caller holds (see `pause`),
    // not yet reaped, so it cannot name another process.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(ProcessError::Signal {
            pid,
            error: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// SIGSTOPs `child` until the guard drops. The borrow ties the guard to the `Child`, which is
/// what keeps the pid from being reaped and reused meanwhile.
pub fn pause(child: &Child) -> Result<Paused, ProcessError> {
    let pid = libc::pid_t::try_from(child.id()).map_err(|_| ProcessError::NoPid)?;
    signal(pid, libc::SIGSTOP)?;
    Ok(Paused { pid })
}

/// SIGSTOPs `child` for `duration`, then SIGCONTs it (blocking the calling thread meanwhile).
pub fn pause_for(child: &Child, duration: Duration) -> Result<(), ProcessError> {
    let paused = pause(child)?;
    std::thread::sleep(duration);
    paused.resume()
}

/// The state letter of `/proc/<pid>/stat` (`T` stopped, `S` sleeping, `R` running, ...).
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}
