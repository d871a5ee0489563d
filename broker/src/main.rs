//! `sluiced`: the Sluice broker daemon. With no flags and no config file: a single node on
//! loopback, data in `./sluice-data`, one shard per core. The command line and life cycle are
//! `sluice_broker::daemon`'s (shared with `sluice serve`).

use clap::Parser;
use sluice_broker::daemon::{DaemonArgs, SETTINGS_HELP};

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
