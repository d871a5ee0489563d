//! `sluiced`: the Sluice broker daemon. With no flags and no config file: a single node on
//! loopback, data in `./sluice-data`, one shard per core. The command line and life cycle are
//! `sluice_broker::daemon`'s (shared with `sluice serve`).

use clap::Parser;
use sluice_broker::daemon::{DaemonArgs, SETTINGS_HELP};

/// mimalloc (v3, its defaults): glibc's malloc and free took ~12% of the broker's CPU in the
/// throughput scenario; measured with mimalloc, 2 KiB batch-10 send+receive+delete went from
/// 18.3-20.4k to 21.7-22.5k msg/s (alternating runs, same machine).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's "free retained memory now" (the library is linked through `GLOBAL`).
    fn mi_collect(force: bool);
}

/// mimalloc keeps freed pages for reuse; after a burst of large request bodies a shard asks it
/// to give them back (`sluice_broker::http::set_memory_release`).
fn release_memory() {
    // SAFETY: mi_collect takes no pointers and may be called on any thread at any time; with
    // force = false it returns only the calling thread's free pages.
    unsafe { mi_collect(false) }
}

#[derive(Parser, Debug)]
#[command(
    name = "sluiced",
    version,
    about = "The Sluice message-queue broker",
    after_help = SETTINGS_HELP
)]
struct Cli {
    #[command(flatten)]
    daemon: DaemonArgs,
}

fn main() {
    let cli = Cli::parse();
    sluice_broker::http::set_memory_release(release_memory);
    std::process::exit(sluice_broker::daemon::run("sluiced", &cli.daemon));
}
