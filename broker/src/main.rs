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
    std::process::exit(sluice_broker::daemon::run("sluiced", &cli.daemon));
}
