//! Fault campaigns against a real `sluiced` (issue 43): load through the native SDK recorded as a
//! checker history, one fault per round (kill -9, SIGSTOP, power loss through faultfs, a
//! restart with a skewed clock), then heal, a final drain and the checker's verdict, with a
//! report (text and JSON). See README.md.

pub mod load;
pub mod net;
pub mod node;
pub mod process;
pub mod relay;
pub mod report;
pub mod schedule;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use load::{Shared, Target};
use node::Node;
use report::{CampaignReport, FaultRecord};
use schedule::{FaultKind, Planned, Schedule};

/// The most nodes a campaign can run today: the cluster does not exist yet.
pub const NODES_SUPPORTED_MAX: usize = 1;
/// Load after the last fault, before healing, so the last recovery is measured.
const AFTER_LAST_FAULT_MS: u64 = 1_500;
/// A started node must take its queues within this.
const SETUP_TIMEOUT_MS: u64 = 30_000;
/// Beyond the load's visibility timeout before the drain: every load lease has expired (the
/// checker's rule for the drain marker).
const DRAIN_SETTLE_MS: u64 = 1_000;
/// The default skew bound. A restart moves the clock by at most twice this (from one skew to
/// the opposite one), which stays under the checker's default 100 ms margin: a single node
/// whose wall clock jumps by that much must still keep its leases and deduplication window
/// within the margin. A larger jump forward shortens leases taken before it by the jump, which
/// a correct broker may do, so it is not a fault this campaign may hold against it.
pub const SKEW_MS_MAX_DEFAULT: i64 = 40;

/// Everything a campaign run can fail with (the verdict is not an error).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    #[error("invalid options: {0}")]
    Options(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot start {path}: {error}")]
    Spawn {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("sluiced did not get ready ({why}); its log: {log}")]
    NotReady { log: PathBuf, why: String },
    #[error("creating the queues: {0}")]
    Setup(String),
    #[error("network namespace: {0}")]
    Net(String),
    #[error("faultfs: {0}")]
    Faultfs(String),
    #[error("recording the history: {0}")]
    Record(String),
    #[error("reading the history back: {0}")]
    History(String),
}

/// The command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "sluice-chaos",
    about = "Fault campaign against a real sluiced: load, faults, drain, the checker's verdict"
)]
pub struct Options {
    /// Seed of the fault schedule (printed; the same seed replays the schedule) [default: time].
    #[arg(long, env = "SLUICE_SEED")]
    pub seed: Option<u64>,
    /// Rounds, one fault each.
    #[arg(long, conflicts_with = "minutes")]
    pub rounds: Option<u64>,
    /// Run rounds until this many minutes have passed (instead of --rounds).
    #[arg(long)]
    pub minutes: Option<f64>,
    /// Broker nodes. Only 1 today (the cluster does not exist yet).
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Fault kinds to draw from, comma-separated: kill, pause, power, skew.
    #[arg(long, default_value = "kill,pause", value_delimiter = ',')]
    pub faults: Vec<String>,
    /// The sluiced binary [default: $SLUICED_BIN, else target/debug/sluiced next to this one].
    #[arg(long)]
    pub sluiced: Option<PathBuf>,
    /// Where history.jsonl, report.txt, report.json and the brokers' logs go.
    #[arg(long)]
    pub out: PathBuf,
    /// Load client tasks.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// The bound of the clock skew a skew fault draws from, in ms (both signs).
    #[arg(long, default_value_t = SKEW_MS_MAX_DEFAULT)]
    pub skew_ms_max: i64,
    /// The checker's margin, in ms.
    #[arg(long, default_value_t = sluice_checker::MARGIN_MS_DEFAULT)]
    pub margin_ms: u64,
    /// Self-test of the harness: send one more message after the load, and leave it out of the
    /// drain's recorded receives, as a broker that lost it would. The verdict must then be one
    /// lost write.
    #[arg(long, hide = true)]
    pub plant_lost_write: bool,
}

/// Rounds when neither --rounds nor --minutes is given.
pub const ROUNDS_DEFAULT: u64 = 5;

impl Options {
    fn kinds(&self) -> Result<Vec<FaultKind>, ChaosError> {
        let mut kinds = Vec::new();
        for f in self
            .faults
            .iter()
            .map(|f| f.trim())
            .filter(|f| !f.is_empty())
        {
            let k = FaultKind::parse(f).ok_or_else(|| {
                ChaosError::Options(format!(
                    "--faults: unknown fault {f:?} (kill, pause, power, skew)"
                ))
            })?;
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        if kinds.is_empty() {
            return Err(ChaosError::Options("--faults: none given".into()));
        }
        Ok(kinds)
    }

    fn validate(&self) -> Result<Vec<FaultKind>, ChaosError> {
        if self.nodes == 0 || self.nodes > NODES_SUPPORTED_MAX {
            return Err(ChaosError::Options(format!(
                "--nodes {}: only --nodes 1 is supported until the cluster exists (issue 43); \
                 the node set is a list so that more can be added then",
                self.nodes
            )));
        }
        if self.skew_ms_max < 1 || 2 * self.skew_ms_max >= self.margin_ms as i64 {
            return Err(ChaosError::Options(format!(
                "--skew-ms-max {}: must be at least 1 and less than half the checker's margin \
                 ({} ms), so that a restart's clock jump stays inside the margin",
                self.skew_ms_max, self.margin_ms
            )));
        }
        if self.clients == 0 {
            return Err(ChaosError::Options("--clients: at least 1".into()));
        }
        self.kinds()
    }
}

/// The sluiced to run: `--sluiced`, `$SLUICED_BIN`, or `sluiced` next to this binary.
pub fn sluiced_path(opt: Option<&Path>) -> Result<PathBuf, ChaosError> {
    if let Some(p) = opt {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("SLUICED_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()?;
    let p = me
        .parent()
        .map(|d| d.join("sluiced"))
        .filter(|p| p.exists());
    p.ok_or_else(|| {
        ChaosError::Options(
            "no sluiced: pass --sluiced or set SLUICED_BIN (cargo build -p sluice-broker --bin sluiced)"
                .into(),
        )
    })
}

/// The data dir's disk: a plain directory, or faultfs when power faults are drawn.
struct Disk {
    _tmp: tempfile::TempDir,
    fs: Option<sluice_faultfs::Mounted>,
    data: PathBuf,
}

impl Disk {
    fn new(power: bool) -> Result<Disk, ChaosError> {
        let tmp = tempfile::Builder::new().prefix("sluice-chaos").tempdir()?;
        if !power {
            let data = tmp.path().join("data");
            std::fs::create_dir(&data)?;
            return Ok(Disk {
                _tmp: tmp,
                fs: None,
                data,
            });
        }
        if !sluice_faultfs::fuse_available() {
            return Err(ChaosError::Faultfs(
                "power faults need faultfs, and /dev/fuse is missing here".into(),
            ));
        }
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        let fs = sluice_faultfs::Mounted::mount(
            &tmp.path().join("backing"),
            &mnt,
            sluice_faultfs::Limits::default(),
        )
        .map_err(|e| ChaosError::Faultfs(e.to_string()))?;
        // The data dir is the operator's: created and made durable before the broker starts.
        let data = mnt.join("data");
        std::fs::create_dir(&data)?;
        std::fs::File::open(&mnt)?.sync_all()?;
        Ok(Disk {
            _tmp: tmp,
            fs: Some(fs),
            data,
        })
    }
}

/// The campaign's result: the report and the process exit status it maps to.
pub struct Outcome {
    pub report: CampaignReport,
    /// 0 pass, 1 anomalies, 2 undecided (as `sluice-check`).
    pub exit_code: i32,
}

/// Runs a campaign. Brokers are killed on every way out (their `Drop`, and with this process).
pub fn run(opts: &Options) -> Result<Outcome, ChaosError> {
    let kinds = opts.validate()?;
    let sluiced = sluiced_path(opts.sluiced.as_deref())?;
    let seed = opts.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let rounds_max = match (opts.rounds, opts.minutes) {
        (Some(r), _) => r,
        (None, Some(_)) => u64::MAX,
        (None, None) => ROUNDS_DEFAULT,
    };
    let until = opts
        .minutes
        .map(|m| Instant::now() + Duration::from_secs_f64((m * 60.0).max(0.0)));
    eprintln!(
        "sluice-chaos: seed {seed} (replay with --seed {seed}), faults {:?}, nodes {}",
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        opts.nodes
    );
    std::fs::create_dir_all(&opts.out)?;
    let logs = opts.out.join("logs");
    std::fs::create_dir_all(&logs)?;
    let history_path = opts.out.join("history.jsonl");
    let shared = Arc::new(Shared::new(std::fs::File::create(&history_path)?));

    let disk = Disk::new(kinds.contains(&FaultKind::Power))?;
    // A list, so that faults can name a node once there are several.
    let mut nodes: Vec<Node> = (0..opts.nodes)
        .map(|i| Node::new(i, &sluiced, &disk.data, &logs))
        .collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let start_node = |node: &mut Node, skew_ms: i64| -> Result<Target, ChaosError> {
        let addr = node.start(skew_ms)?;
        rt.block_on(load::setup(addr, node.cert_path(), SETUP_TIMEOUT_MS))
    };

    let target = start_node(&mut nodes[0], 0)?;
    shared.set_target(Some(target));
    let tasks: Vec<_> = (0..opts.clients)
        .map(|i| rt.spawn(load::client_task(shared.clone(), i, seed)))
        .collect();

    let mut records: Vec<FaultRecord> = Vec::new();
    let mut schedule = Schedule::new(seed, &kinds, opts.nodes, opts.skew_ms_max);
    let mut result: Result<(), ChaosError> = Ok(());
    for _ in 0..rounds_max {
        if until.is_some_and(|u| Instant::now() >= u) || shared.stopped() {
            break;
        }
        let Some(planned) = schedule.next() else {
            break;
        };
        std::thread::sleep(Duration::from_millis(planned.quiet_ms));
        match inject(&planned, &mut nodes, &disk, &shared, &start_node) {
            Ok(rec) => {
                eprintln!("sluice-chaos: round {}: {}", planned.round, rec.note);
                records.push(rec);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_ok() {
        std::thread::sleep(Duration::from_millis(AFTER_LAST_FAULT_MS));
    }
    shared.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        let _ = rt.block_on(t);
    }
    result?;

    // Heal: a clean restart (no skew, power on), then the drain once every lease has expired.
    for n in nodes.iter_mut() {
        n.resume();
        n.kill();
    }
    let target = start_node(&mut nodes[0], 0)?;
    let plant = match opts.plant_lost_write {
        true => rt.block_on(load::plant_send(&shared, &target)),
        false => None,
    };
    std::thread::sleep(Duration::from_millis(
        u64::from(load::VISIBILITY_TIMEOUT_S) * 1000 + DRAIN_SETTLE_MS,
    ));
    shared.mark_drain();
    let drained = rt.block_on(load::drain(&shared, &target, plant));
    for n in nodes.iter_mut() {
        n.kill();
    }
    drop(nodes);
    drop(disk);
    let samples = shared.samples();
    if let Some(e) = shared.error() {
        return Err(ChaosError::Record(e));
    }
    let shared = Arc::try_unwrap(shared)
        .map_err(|_| ChaosError::Record("a client task still holds the history".into()))?;
    load::finish(shared)?;

    let text = std::fs::read(&history_path)?;
    let history = sluice_checker::History::from_jsonl(text.as_slice())
        .map_err(|e| ChaosError::History(e.to_string()))?;
    let cfg = sluice_checker::Config {
        margin_us: opts.margin_ms * 1000,
        ..Default::default()
    };
    let checked = sluice_checker::check(&history, &cfg);
    let report = CampaignReport::build(seed, opts, &kinds, records, &samples, drained, &checked);
    std::fs::write(opts.out.join("report.txt"), report.to_text())?;
    std::fs::write(opts.out.join("report.json"), report.to_json())?;
    std::fs::write(opts.out.join("checker.txt"), checked.to_text())?;
    let exit_code = match checked.verdict {
        sluice_checker::Verdict::Pass => 0,
        sluice_checker::Verdict::Fail => 1,
        sluice_checker::Verdict::Undecided => 2,
    };
    Ok(Outcome { report, exit_code })
}

/// One fault, healed: returns what happened and when (in the history's microseconds).
fn inject(
    planned: &Planned,
    nodes: &mut [Node],
    disk: &Disk,
    shared: &Shared,
    start_node: &dyn Fn(&mut Node, i64) -> Result<Target, ChaosError>,
) -> Result<FaultRecord, ChaosError> {
    let node = nodes
        .get_mut(planned.node)
        .ok_or_else(|| ChaosError::Options(format!("no node {}", planned.node)))?;
    let injected_us = shared.now_us();
    let note = match planned.kind {
        FaultKind::Kill | FaultKind::Skew => {
            shared.set_target(None);
            node.kill();
            let skew = planned.skew_ms.unwrap_or(0);
            match planned.kind {
                FaultKind::Skew => format!("kill -9, restart with clock skew {skew} ms"),
                _ => "kill -9, restart".to_string(),
            }
        }
        FaultKind::Pause => {
            let ms = planned.pause_ms.unwrap_or(schedule::PAUSE_MS_MIN);
            node.pause();
            std::thread::sleep(Duration::from_millis(ms));
            node.resume();
            let healed_us = shared.now_us();
            return Ok(FaultRecord::new(
                planned.clone(),
                injected_us,
                healed_us,
                format!("SIGSTOP {ms} ms, SIGCONT"),
            ));
        }
        FaultKind::Power => {
            let fs = disk.fs.as_ref().ok_or_else(|| {
                ChaosError::Faultfs("a power fault without faultfs mounted".into())
            })?;
            // The machine loses power under the running broker, which dies with it.
            let cut = match planned.tear_seed {
                Some(seed) => fs.power_off_torn(seed),
                None => fs.power_off(),
            };
            shared.set_target(None);
            node.kill();
            let cut = cut.map_err(|e| ChaosError::Faultfs(e.to_string()))?;
            fs.power_on();
            format!(
                "power off{} ({} volatile bytes, {} files dropped{}), kill -9, power on, restart",
                if planned.torn { " torn" } else { "" },
                cut.volatile_bytes_dropped,
                cut.nodes_dropped,
                match cut.torn {
                    Some((ino, off, kept, len)) =>
                        format!(", torn inode {ino} at {off}: {kept} of {len} bytes kept"),
                    None => String::new(),
                }
            )
        }
    };
    let healed_us = shared.now_us();
    let target = start_node(node, planned.skew_ms.unwrap_or(0))?;
    shared.set_target(Some(target));
    Ok(FaultRecord::new(
        planned.clone(),
        injected_us,
        healed_us,
        note,
    ))
}
