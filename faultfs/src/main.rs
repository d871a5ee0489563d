//! `faultfs --backing DIR --mount DIR`: mounts a faultfs until SIGINT or SIGTERM, then unmounts.
//! Power it off from another process by writing to `<mount>/.faultfs-ctl` (see the crate docs).

use clap::Parser;
use sluice_faultfs::{Limits, Mounted};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "A FUSE file system that forgets what was not made durable")]
struct Args {
    /// Directory for the durable bytes (created; must be empty).
    #[arg(long)]
    backing: PathBuf,
    /// Mount point (an existing directory).
    #[arg(long)]
    mount: PathBuf,
    /// Unsynced bytes held at most; writes past it fail with ENOSPC.
    #[arg(long, default_value_t = sluice_faultfs::model::VOLATILE_BYTES_MAX_DEFAULT)]
    volatile_bytes_max: u64,
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts later), so that
/// only an explicit `sigwait` receives them.
fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: the sigset is a plain value initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for(set: &libc::sigset_t) {
    let mut sig = 0;
    // SAFETY: `set` was initialised by block_termination_signals; `sig` is ours to write.
    unsafe { libc::sigwait(set, &mut sig) };
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Before the serving thread starts, so it inherits the mask and only sigwait gets them.
    let set = block_termination_signals();
    let limits = Limits {
        volatile_bytes_max: args.volatile_bytes_max,
    };
    let mounted = match Mounted::mount(&args.backing, &args.mount, limits) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("faultfs: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("faultfs: mounted on {}", args.mount.display());
    wait_for(&set);
    mounted.unmount();
    eprintln!("faultfs: unmounted");
    ExitCode::SUCCESS
}
