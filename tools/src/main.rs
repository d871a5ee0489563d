//! `sluice`: the Sluice command-line tool — queue admin, dead-letter queues and redrive, the
//! data plane, and offline log inspection. See `sluice --help`.

mod cluster;
mod logtool;
mod net;
mod output;
mod streams;

use clap::{Args, CommandFactory, Parser, Subcommand};
use output::{exit, CliError, Format};
use std::net::SocketAddr;
use std::path::PathBuf;

const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  the broker answered with an error (no such queue, invalid parameter, ...)
  2  usage: bad arguments, or an unreadable local file or stdin
  3  connection: the broker could not be reached, the connection failed, or it timed out
  4  log dump/verify found corrupt data

Queues are named by name (resolved with GetQueueUrl) or by their full URL.
Errors are printed on stderr (as JSON with --output json); results on stdout.";

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "Operate a Sluice broker: queues, dead-letter queues, messages, topics, groups, logs",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    conn: Conn,
    /// Output format: `table` for people, `json` for scripts.
    #[arg(
        long,
        short = 'o',
        global = true,
        value_enum,
        default_value = "table",
        env = "SLUICE_OUTPUT"
    )]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

/// How to reach the broker.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// The broker's native QUIC address; in a cluster, several nodes' (repeat the option or
    /// give a comma list): the first that answers is used, and requests follow the partition's
    /// leader from there.
    #[arg(
        long,
        global = true,
        env = "SLUICE_ENDPOINT",
        value_delimiter = ',',
        default_value = "127.0.0.1:7400"
    )]
    pub endpoint: Vec<SocketAddr>,
    /// PEM file of the certificate (or CA) to trust for QUIC; default: the self-signed
    /// certificate of a local broker, `sluice-data/quic-selfsigned-cert.pem`.
    #[arg(long, global = true, env = "SLUICE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Do not verify the broker's certificate (throw-away local brokers only).
    #[arg(long, global = true, env = "SLUICE_INSECURE")]
    pub insecure: bool,
    /// The name the broker's certificate must carry.
    #[arg(
        long,
        global = true,
        env = "SLUICE_SERVER_NAME",
        default_value = "localhost"
    )]
    pub server_name: String,
    /// Time allowed to connect and for each request (a receive adds its wait), milliseconds.
    #[arg(
        long,
        global = true,
        env = "SLUICE_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub timeout_ms: u64,
    /// Access key id, for brokers that require authentication (`auth.mode = "sigv4"`); the
    /// same keys sign SQS HTTP requests. Needs --secret-access-key.
    #[arg(
        long,
        global = true,
        env = "SLUICE_ACCESS_KEY_ID",
        requires = "secret_access_key"
    )]
    pub access_key_id: Option<String>,
    /// The key's secret. Prefer the environment variable: a flag shows in the process list.
    #[arg(
        long,
        global = true,
        env = "SLUICE_SECRET_ACCESS_KEY",
        hide_env_values = true,
        requires = "access_key_id"
    )]
    pub secret_access_key: Option<Secret>,
}

/// A secret from the command line or environment; `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, list, describe, update, purge and delete queues.
    #[command(subcommand)]
    Queue(QueueCmd),
    /// Dead-letter queues: their sources, peeking at messages, redrive tasks.
    #[command(subcommand)]
    Dlq(DlqCmd),
    /// Send messages: each BODY argument is one message; or --file, or stdin. Several messages
    /// go in batches of 10; exit code 1 if any was not sent (each result says which).
    Send(SendArgs),
    /// Receive messages (they stay invisible for the visibility timeout unless --delete).
    Receive(ReceiveArgs),
    /// Delete received messages by receipt handle.
    Delete {
        /// Queue name or URL.
        queue: String,
        /// Receipt handles from `sluice receive`.
        #[arg(required = true)]
        receipt_handles: Vec<String>,
    },
    /// Topics (Kafka-style partitioned logs): create, list, describe (partitions, offsets,
    /// retention), delete.
    #[command(subcommand)]
    Topic(TopicCmd),
    /// Consumer groups: list them, describe one (members, assignments, committed offsets and
    /// lag per partition).
    #[command(subcommand)]
    Group(GroupCmd),
    /// Print a topic's records from a starting point: JSON lines with --output json, else one
    /// tab-separated line each (partition, offset, time, key, value; non-UTF-8 bytes in hex).
    /// Without --follow it stops at the end offsets seen at start. TOPIC may be
    /// `queue:<name>`: a queue's messages read as a stream (leases untouched).
    Tail(TailArgs),
    /// Offline segment-log inspection (the broker need not run; nothing is written).
    #[command(subcommand)]
    Log(LogCmd),
    /// Run a broker in this process (the same broker and flags as `sluiced`), until SIGINT or
    /// SIGTERM. With no flags and no config file: the embedded single node on loopback, data
    /// in ./sluice-data. In-process rather than starting a `sluiced` binary, so that it works
    /// wherever `sluice` alone was installed (`cargo install`, `cargo run --bin sluice`).
    #[command(after_help = sluice_broker::daemon::SETTINGS_HELP)]
    Serve(Box<sluice_broker::daemon::DaemonArgs>),
    /// Cluster nodes: a node's identity (node id, disk id) and its certificate.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Development helpers: a local multi-node cluster.
    #[command(subcommand)]
    Dev(cluster::DevCmd),
    /// Make a SASL/SCRAM login for the broker's Kafka port: reads the password from stdin (its
    /// first line), prints `[[auth.scram_credentials]]` entries for the broker's config file.
    /// They hold a random salt and the salted, hashed keys of RFC 5802, not the password.
    #[command(
        after_help = "Example: echo \"$PASSWORD\" | sluice scram-credential --user alice \
        --account 111111111111 >> sluice.toml"
    )]
    ScramCredential(ScramCredentialArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(
        after_help = "Example (bash): sluice completions bash > /etc/bash_completion.d/sluice"
    )]
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand, Debug)]
pub enum QueueCmd {
    /// Create a queue (idempotent when the attributes match). A name ending in `.fifo` (or
    /// --fifo) makes a FIFO queue.
    Create {
        name: String,
        /// FIFO queue: appends `.fifo` to the name if missing and sets FifoQueue=true.
        #[arg(long)]
        fifo: bool,
        /// Queue attribute, SQS name=value (VisibilityTimeout=30, RedrivePolicy='{...}', ...).
        #[arg(long = "attr", value_name = "NAME=VALUE")]
        attributes: Vec<String>,
        /// Tag, key=value.
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
    },
    /// List queue URLs, optionally only those whose name starts with a prefix.
    List {
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Every attribute of a queue: counts (visible, in flight, delayed), settings, ARN.
    Describe { queue: String },
    /// Change queue attributes.
    Update {
        queue: String,
        /// Queue attribute, SQS name=value.
        #[arg(long = "attr", value_name = "NAME=VALUE", required = true)]
        attributes: Vec<String>,
    },
    /// Delete every message of a queue. Instant whatever the queue's size (each partition
    /// records one purge marker; space is reclaimed later by compaction), so there is no
    /// progress to show. SQS allows one purge per 60 seconds.
    Purge { queue: String },
    /// Delete a queue and its messages.
    Delete { queue: String },
}

#[derive(Subcommand, Debug)]
pub enum TopicCmd {
    /// Create a topic (idempotent for an identical configuration).
    Create {
        name: String,
        /// Partitions, 1-1024 (spread over the broker's cores).
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Delete whole segments older than this, milliseconds; default: keep.
        #[arg(long)]
        retention_ms: Option<u64>,
        /// Delete the oldest segments beyond this size per partition, bytes; default: keep.
        #[arg(long)]
        retention_bytes: Option<u64>,
        /// Segment size, bytes; default: the broker's.
        #[arg(long)]
        segment_bytes: Option<u64>,
    },
    /// The topics, with partitions and retention.
    List,
    /// A topic's settings and, per partition, its earliest and latest (next) offset.
    Describe { name: String },
    /// Delete a topic and its data.
    Delete { name: String },
    /// Produce records: the VALUES given, else one record per non-empty line of --file or
    /// stdin (as `kcat -P` does). Acknowledged once durable (fsync). Keyed records go to
    /// `xxh3(key) % partitions`, keyless ones round robin, unless --partition.
    Produce {
        topic: String,
        values: Vec<String>,
        /// The key of every record.
        #[arg(long, conflicts_with = "key_separator")]
        key: Option<String>,
        /// Split each record at the first SEP into key and value (`kcat -K`).
        #[arg(long, value_name = "SEP")]
        key_separator: Option<String>,
        /// Read records from this file (`-` for stdin), one per non-empty line.
        #[arg(long, conflicts_with = "values")]
        file: Option<PathBuf>,
        /// Every record to this partition.
        #[arg(long)]
        partition: Option<u32>,
    },
}

#[derive(Subcommand, Debug)]
pub enum GroupCmd {
    /// The consumer groups, with generation, member count and total lag.
    List,
    /// A group's members and, per partition, its member, committed offset, latest offset and
    /// lag (latest - committed). Exit 1 if the group has neither members nor commits.
    Describe { group: String },
}

/// Where `tail` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum From {
    /// The oldest record still kept.
    Earliest,
    /// Only records produced from now on.
    Latest,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    pub topic: String,
    /// Only this partition (default: every partition, each in order).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Start at this offset (in each partition tailed).
    #[arg(long, conflicts_with_all = ["from_time", "from"])]
    pub from_offset: Option<u64>,
    /// Start at the first record at or after this time: RFC 3339 (2026-12-03T11:15:00Z) or
    /// Unix time (seconds if at most 10 digits, else milliseconds).
    #[arg(long, conflicts_with = "from")]
    pub from_time: Option<String>,
    /// Start at the earliest record (default) or at the end.
    #[arg(long, value_enum)]
    pub from: Option<From>,
    /// Keep waiting for new records (until interrupted or --max).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Stop after this many records.
    #[arg(long, short = 'n')]
    pub max: Option<usize>,
}

#[derive(Subcommand, Debug)]
pub enum DlqCmd {
    /// Queues whose RedrivePolicy names this queue as their dead-letter queue.
    Sources { queue: String },
    /// Look at messages without consuming them. Implemented as a receive with visibility
    /// timeout 0: the messages stay visible, but their receive count goes up by one (so a DLQ
    /// that has its own RedrivePolicy may move them on).
    Peek {
        queue: String,
        /// Messages to show, 1-10.
        #[arg(long, default_value_t = 10)]
        max: u32,
    },
    /// Redrive tasks: move messages out of a dead-letter queue.
    #[command(subcommand)]
    Redrive(RedriveCmd),
}

#[derive(Subcommand, Debug)]
pub enum RedriveCmd {
    /// Start moving the dead-letter queue's messages back to their sources (or --to a queue).
    Start {
        /// The dead-letter queue (name or URL).
        queue: String,
        /// Destination queue (name or URL); default: each message's original source queue.
        #[arg(long)]
        to: Option<String>,
        /// Messages moved per second, 1-500; default: as fast as the broker allows.
        #[arg(long)]
        rate: Option<u32>,
        /// Wait until the task ends (progress on a terminal); print its final state; exit 1
        /// if it failed or was cancelled.
        #[arg(long)]
        wait: bool,
    },
    /// The most recent redrive tasks of a dead-letter queue.
    List {
        queue: String,
        /// Tasks to show, 1-10.
        #[arg(long, default_value_t = 10)]
        max: u32,
    },
    /// Cancel a running task by its handle (from `redrive start` or `redrive list`).
    Cancel { task_handle: String },
}

#[derive(Args, Debug)]
pub struct SendArgs {
    /// Queue name or URL.
    pub queue: String,
    /// Message bodies, one message each. With none and no --file, the body is read from stdin.
    pub bodies: Vec<String>,
    /// Read the body from this file (`-` for stdin).
    #[arg(long, conflicts_with = "bodies")]
    pub file: Option<PathBuf>,
    /// With --file or stdin: one message per non-empty line instead of one for the whole input.
    #[arg(long)]
    pub lines: bool,
    /// Message attribute: name=value (a String), or name:Type=value (Type: String, Number).
    #[arg(long = "attr", value_name = "NAME[:TYPE]=VALUE")]
    pub attributes: Vec<String>,
    /// MessageGroupId (FIFO queues: the order group).
    #[arg(long)]
    pub group: Option<String>,
    /// MessageDeduplicationId (FIFO queues: 5-minute exactly-once ingestion); the same for
    /// every message of this call.
    #[arg(long)]
    pub dedup_id: Option<String>,
    /// DelaySeconds, 0-900.
    #[arg(long)]
    pub delay: Option<u32>,
}

#[derive(Args, Debug)]
pub struct ReceiveArgs {
    /// Queue name or URL.
    pub queue: String,
    /// Messages at most, 1-10.
    #[arg(long, default_value_t = 1)]
    pub max: u32,
    /// Visibility timeout of the received messages, seconds (default: the queue's).
    #[arg(long)]
    pub visibility: Option<u32>,
    /// Long-poll wait for the first message, 0-20 seconds.
    #[arg(long, default_value_t = 0)]
    pub wait: u32,
    /// Delete each message after printing it (consume).
    #[arg(long)]
    pub delete: bool,
}

#[derive(Subcommand, Debug)]
enum LogCmd {
    /// Decode segments: each batch's position, offsets, timestamps, size and checksum (and
    /// with --records each record). PATH: a data dir, a partition dir, or one `.log` file.
    Dump {
        path: PathBuf,
        /// List the records of each batch.
        #[arg(long)]
        records: bool,
        /// With --records: show the start of each value.
        #[arg(long, requires = "records")]
        values: bool,
        /// List only batches holding this offset or later ones (every batch is still checked).
        #[arg(long, default_value_t = 0)]
        from_offset: u64,
        /// List at most this many batches.
        #[arg(long, default_value_t = usize::MAX)]
        max_batches: usize,
    },
    /// Check every batch (header, xxh3 checksum, record structure, offset continuity) and the
    /// offset indexes; exit code 4 if anything is corrupt. DIR: a data dir or partition dir.
    Verify { path: PathBuf },
}

fn fail(format: Format, e: &CliError) -> i32 {
    match format {
        Format::Json => eprintln!(
            "{}",
            serde_json::json!({"error": {"kind": e.kind, "message": e.message, "exit_code": e.code}})
        ),
        Format::Table => eprintln!("sluice: {}", e.message),
    }
    e.code
}

#[derive(Args, Debug)]
struct ScramCredentialArgs {
    /// The SASL user name clients log in with (`sasl.username`).
    #[arg(long)]
    user: String,
    /// The account (tenant) the user acts in.
    #[arg(long, default_value = sluice_broker::metadata::DEFAULT_TENANT)]
    account: String,
    /// SCRAM-SHA-256, SCRAM-SHA-512, or both (one entry each).
    #[arg(long, default_value = "both", value_parser = ["SCRAM-SHA-256", "SCRAM-SHA-512", "both"])]
    mechanism: String,
    /// PBKDF2 iterations (4096..=16384): what each login costs the client.
    #[arg(long, default_value_t = sluice_broker::auth::scram::SCRAM_ITERATIONS_DEFAULT)]
    iterations: u32,
}

/// `sluice scram-credential`: the config entries for a password read from stdin.
fn scram_credential(a: &ScramCredentialArgs) -> Result<i32, CliError> {
    use sluice_broker::auth::scram::{Mechanism, ScramCredential};
    if a.user.is_empty() || !sluice_broker::auth::valid_account(&a.account) {
        return Err(CliError::usage(
            "--user must not be empty; --account is 1-64 of A-Z a-z 0-9 - _",
        ));
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| CliError::usage(format!("reading the password from stdin: {e}")))?;
    let password = line.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(CliError::usage("an empty password on stdin"));
    }
    let mechanisms = match Mechanism::from_name(&a.mechanism) {
        Some(m) => vec![m],
        None => Mechanism::ALL.to_vec(),
    };
    for m in mechanisms {
        let c = ScramCredential::generate(m, &a.account, password.as_bytes(), a.iterations)
            .map_err(|e| CliError::usage(e.to_string()))?;
        println!("{}", c.toml_entry(&a.user));
    }
    Ok(exit::OK)
}

fn run(cli: Cli) -> Result<i32, CliError> {
    let format = cli.output;
    match cli.command {
        Command::ScramCredential(a) => scram_credential(&a),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sluice", &mut script);
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            Ok(exit::OK)
        }
        Command::Log(LogCmd::Dump {
            path,
            records,
            values,
            from_offset,
            max_batches,
        }) => {
            let select = logtool::Select {
                records,
                values,
                from_offset,
                max_batches,
            };
            let (v, corrupt) = logtool::dump(&path, select)?;
            match format {
                Format::Json => output::print(format, &v),
                Format::Table => print!("{}", logtool::dump_text(&v)),
            }
            Ok(if corrupt { exit::CORRUPT } else { exit::OK })
        }
        Command::Log(LogCmd::Verify { path }) => {
            let (v, corrupt) = logtool::verify(&path)?;
            output::print(format, &v);
            Ok(if corrupt { exit::CORRUPT } else { exit::OK })
        }
        Command::Serve(args) => Ok(sluice_broker::daemon::run("sluice serve", &args)),
        Command::Cluster(c) => cluster::run(format, c),
        Command::Dev(c) => cluster::run_dev(format, c),
        Command::Topic(c) => net::run(&cli.conn, format, net::Op::Topic(c)),
        Command::Group(c) => net::run(&cli.conn, format, net::Op::Group(c)),
        Command::Tail(a) => net::run_tail(&cli.conn, format, a),
        Command::Queue(c) => net::run(&cli.conn, format, net::Op::Queue(c)),
        Command::Dlq(c) => net::run(&cli.conn, format, net::Op::Dlq(c)),
        Command::Send(a) => net::run(&cli.conn, format, net::Op::Send(a)),
        Command::Receive(a) => net::run(&cli.conn, format, net::Op::Receive(a)),
        Command::Delete {
            queue,
            receipt_handles,
        } => net::run(
            &cli.conn,
            format,
            net::Op::Delete {
                queue,
                receipt_handles,
            },
        ),
    }
}

/// The broker allocator, for `sluice serve` (see `sluiced`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    let format = cli.output;
    let code = match run(cli) {
        Ok(c) => c,
        Err(e) => fail(format, &e),
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Several endpoints: repeated, as a comma list, or both; one by default.
    #[test]
    fn endpoints_are_a_list() {
        let endpoints = |args: &[&str]| {
            let mut argv = vec!["sluice"];
            argv.extend_from_slice(args);
            argv.extend_from_slice(&["queue", "list"]);
            Cli::try_parse_from(argv).map(|c| {
                c.conn
                    .endpoint
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(endpoints(&[]).expect("default"), ["127.0.0.1:7400"]);
        assert_eq!(
            endpoints(&[
                "--endpoint",
                "127.0.0.1:1,127.0.0.1:2",
                "--endpoint",
                "127.0.0.1:3"
            ])
            .expect("list"),
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        );
        assert!(endpoints(&["--endpoint", "127.0.0.1:1,nonsense"]).is_err());
    }
}
