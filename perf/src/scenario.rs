//! Scenarios as TOML files (`perf/scenarios/*.toml`): what load to offer, in what shape, for how
//! long, against which targets and floors. A file is parsed strictly (unknown keys are errors)
//! and validated before anything starts, so a typo gets a clear message, not a half-run.
//!
//! A file may sweep the number of consumer groups of a topic (`groups = [1, 2, 4]`): it then
//! expands into one [`Case`] per value, each run against every target in the same run.

use crate::loadgen::{Arrival, LoadSpec, Mode, Phase, Profile, SizeDist};
use crate::target::Shape;
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// Upper bounds that keep a scenario file from asking for an unbounded run.
const DURATION_S_MAX: f64 = 3600.0;
const PRODUCERS_MAX: usize = 1024;
const CONSUMERS_MAX: usize = 1024;
const CONNECTIONS_MAX: usize = 256;
const BATCH_MAX: usize = 1000;
const IN_FLIGHT_MAX: usize = 1024;
const RATE_PER_S_MAX: f64 = 10_000_000.0;
/// Every body carries a 40-byte header (producer, sequence, intended send time).
pub const BODY_BYTES_MIN: usize = crate::loadgen::HEADER_BYTES;
pub const BODY_BYTES_MAX: usize = 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    #[serde(default)]
    description: String,
    /// Words printed beside every figure of Sluice targets, e.g. "fsync before every ack".
    durability: String,
    #[serde(default = "default_targets")]
    targets: Vec<String>,
    /// Floors measured in the same run: "fio" (disk), "quinn-echo" (transport round trip),
    /// "quic-fetch" (a plain quinn server answering `receive_max` records of the message size
    /// from memory: what QUIC alone costs a consumed record).
    #[serde(default)]
    floors: Vec<String>,
    /// Fixed seed; without one a seed is drawn and printed.
    seed: Option<u64>,
    load: LoadFile,
    message: MessageFile,
    shape: ShapeFile,
}

fn default_targets() -> Vec<String> {
    vec!["sluice-quic".into(), "sluice-http".into()]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadFile {
    /// "open" (fixed arrival rate), "closed" (max throughput, `in_flight` batches per producer)
    /// or "rtt" (round trips at `rate_per_s`: each producer sends, receives back and deletes,
    /// one call at a time).
    mode: String,
    /// "mixed" (default), "produce-only" (no consumers) or "consume-only" (a backlog of
    /// `messages_max` first, then consumers alone, measured).
    #[serde(default)]
    phase: Option<String>,
    rate_per_s: Option<f64>,
    #[serde(default = "one")]
    in_flight: usize,
    /// Closed loop only: producers hold back while more than this many messages are sent but
    /// not yet received (by every group), so the run measures what the queue sustains end
    /// to end, not how fast a backlog grows while consumers starve. None: no bound.
    backlog_max: Option<u64>,
    producers: usize,
    consumers: usize,
    #[serde(default = "one")]
    connections: usize,
    #[serde(default = "one")]
    batch: usize,
    #[serde(default = "ten")]
    receive_max: usize,
    #[serde(default = "receive_wait_ms")]
    receive_wait_ms: u64,
    #[serde(default)]
    warmup_s: f64,
    duration_s: f64,
    /// Stop producing after this many messages even if the duration is not over.
    messages_max: Option<u64>,
    /// How long consumers may keep draining after the producers stopped.
    #[serde(default = "drain_s")]
    drain_s: f64,
    #[serde(default)]
    profile: Option<ProfileFile>,
}

fn one() -> usize {
    1
}
fn ten() -> usize {
    10
}
fn receive_wait_ms() -> u64 {
    1000
}
fn drain_s() -> f64 {
    10.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    /// "steady" or "bursty" (a square wave: peaks of `peak_to_average` × the mean rate).
    kind: String,
    #[serde(default = "peak")]
    peak_to_average: f64,
    #[serde(default = "low")]
    low_to_average: f64,
    #[serde(default = "period")]
    period_s: f64,
    /// "uniform" (evenly spaced at the current rate) or "poisson" (exponential gaps).
    #[serde(default = "uniform")]
    arrival: String,
}

fn peak() -> f64 {
    3.5
}
fn low() -> f64 {
    0.5
}
fn period() -> f64 {
    6.0
}
fn uniform() -> String {
    "uniform".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageFile {
    /// Fixed size in bytes, or the mean of `dist`.
    size: usize,
    /// "fixed" (default) or "lognormal" (seeded; `sigma` is the log-space deviation).
    #[serde(default)]
    dist: Option<String>,
    #[serde(default = "sigma")]
    sigma: f64,
    min: Option<usize>,
    max: Option<usize>,
}

fn sigma() -> f64 {
    0.5
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShapeFile {
    /// "standard", "fifo" or "topic".
    kind: String,
    /// FIFO message groups, or topic consumer groups (a list sweeps).
    groups: Option<OneOrMany>,
    partitions: Option<u32>,
}

/// A parsed, validated scenario file.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub durability: String,
    pub targets: Vec<String>,
    pub floors: Vec<String>,
    pub seed: Option<u64>,
    pub cases: Vec<Case>,
}

/// One shape of a scenario with its load (a scenario without a sweep has one case).
#[derive(Debug, Clone)]
pub struct Case {
    /// The scenario name, plus `-g<N>` for each value of a sweep.
    pub name: String,
    pub load: LoadSpec,
}

fn bad(path: &str, msg: impl std::fmt::Display) -> String {
    format!("scenario {path}: {msg}")
}

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Scenario, String> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| bad(&p, e))?;
    parse(&text).map_err(|e| bad(&p, e))
}

/// Parses and validates a scenario from TOML text.
pub fn parse(text: &str) -> Result<Scenario, String> {
    let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
    if f.name.is_empty()
        || !f
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "name {:?}: use letters, digits, '-' and '_' only",
            f.name
        ));
    }
    if f.durability.trim().is_empty() {
        return Err("durability: say what every acknowledged send had".into());
    }
    for fl in &f.floors {
        if !["fio", "quinn-echo", "quic-fetch"].contains(&fl.as_str()) {
            return Err(format!(
                "floors: unknown floor {fl:?} (fio, quinn-echo, quic-fetch)"
            ));
        }
    }
    let l = &f.load;
    let range = |what: &str, v: usize, max: usize| -> Result<(), String> {
        if v == 0 || v > max {
            Err(format!("load.{what} = {v}: must be 1..={max}"))
        } else {
            Ok(())
        }
    };
    range("producers", l.producers, PRODUCERS_MAX)?;
    range("consumers", l.consumers, CONSUMERS_MAX)?;
    range("connections", l.connections, CONNECTIONS_MAX)?;
    range("batch", l.batch, BATCH_MAX)?;
    range("in_flight", l.in_flight, IN_FLIGHT_MAX)?;
    range("receive_max", l.receive_max, BATCH_MAX)?;
    let secs = |what: &str, v: f64, min: f64| -> Result<Duration, String> {
        if !(v.is_finite() && v >= min && v <= DURATION_S_MAX) {
            Err(format!(
                "load.{what} = {v}: must be {min}..={DURATION_S_MAX}"
            ))
        } else {
            Ok(Duration::from_secs_f64(v))
        }
    };
    let duration = secs("duration_s", l.duration_s, 0.01)?;
    let warmup = secs("warmup_s", l.warmup_s, 0.0)?;
    let drain = secs("drain_s", l.drain_s, 0.1)?;
    if l.receive_wait_ms > 20_000 {
        return Err("load.receive_wait_ms: at most 20000".into());
    }
    let rate = |kind: &str| -> Result<f64, String> {
        let r = l
            .rate_per_s
            .ok_or(format!("load.rate_per_s: {kind} scenario needs a rate"))?;
        if !(r.is_finite() && r > 0.0 && r <= RATE_PER_S_MAX) {
            return Err(format!(
                "load.rate_per_s = {r}: must be in (0, {RATE_PER_S_MAX}]"
            ));
        }
        Ok(r)
    };
    if l.backlog_max.is_some() && l.mode != "closed" {
        return Err("load.backlog_max: only a closed-loop scenario has one".into());
    }
    let mode = match l.mode.as_str() {
        "open" => Mode::Open {
            rate_per_s: rate("an open-loop")?,
        },
        "rtt" => {
            let r = rate("a round-trip")?;
            if matches!(f.shape.kind.as_str(), "topic") {
                return Err("load.mode \"rtt\": round trips are of queue calls (standard or fifo), not of a topic".into());
            }
            Mode::RoundTrip { rate_per_s: r }
        }
        "closed" => {
            if l.rate_per_s.is_some() {
                return Err("load.rate_per_s: a closed-loop scenario has no rate".into());
            }
            if l.backlog_max == Some(0) {
                return Err("load.backlog_max = 0: must be at least 1".into());
            }
            Mode::Closed {
                in_flight: l.in_flight,
                backlog_max: l.backlog_max,
            }
        }
        m => return Err(format!("load.mode {m:?}: \"open\", \"closed\" or \"rtt\"")),
    };
    let phase = match l.phase.as_deref().unwrap_or("mixed") {
        "mixed" => Phase::Mixed,
        "produce-only" => Phase::ProduceOnly,
        "consume-only" => {
            if !matches!(
                mode,
                Mode::Closed {
                    backlog_max: None,
                    ..
                }
            ) || l.messages_max.is_none()
            {
                return Err("load.phase \"consume-only\": needs a closed loop without backlog_max and messages_max (the backlog)".into());
            }
            Phase::ConsumeOnly
        }
        p => {
            return Err(format!(
                "load.phase {p:?}: \"mixed\", \"produce-only\" or \"consume-only\""
            ))
        }
    };
    let profile = match &l.profile {
        None => Profile::Steady {
            arrival: Arrival::Uniform,
        },
        Some(pf) => {
            let arrival = match pf.arrival.as_str() {
                "uniform" => Arrival::Uniform,
                "poisson" => Arrival::Poisson,
                a => return Err(format!("load.profile.arrival {a:?}: uniform or poisson")),
            };
            match pf.kind.as_str() {
                "steady" => Profile::Steady { arrival },
                "bursty" => {
                    let (pk, lo) = (pf.peak_to_average, pf.low_to_average);
                    if !(pk > 1.0 && pk <= 100.0 && (0.0..1.0).contains(&lo)) {
                        return Err(
                            "load.profile: peak_to_average must be in (1, 100], low_to_average in [0, 1)"
                                .into(),
                        );
                    }
                    if !(pf.period_s > 0.0 && pf.period_s <= DURATION_S_MAX) {
                        return Err("load.profile.period_s: must be positive".into());
                    }
                    Profile::Bursty {
                        peak_to_average: pk,
                        low_to_average: lo,
                        period: Duration::from_secs_f64(pf.period_s),
                        arrival,
                    }
                }
                k => return Err(format!("load.profile.kind {k:?}: steady or bursty")),
            }
        }
    };
    if matches!(profile, Profile::Bursty { .. }) && !matches!(mode, Mode::Open { .. }) {
        return Err("load.profile: bursts need an open-loop scenario (a rate)".into());
    }
    let m = &f.message;
    let size = match m.dist.as_deref().unwrap_or("fixed") {
        "fixed" => SizeDist::Fixed(m.size),
        "lognormal" => {
            let min = m.min.unwrap_or(BODY_BYTES_MIN);
            let max = m.max.unwrap_or(m.size * 8);
            if !(m.sigma > 0.0 && m.sigma <= 3.0) {
                return Err("message.sigma: must be in (0, 3]".into());
            }
            if min < BODY_BYTES_MIN || max > BODY_BYTES_MAX || min > m.size || m.size > max {
                return Err(format!(
                    "message: need {BODY_BYTES_MIN} <= min <= size <= max <= {BODY_BYTES_MAX}"
                ));
            }
            SizeDist::LogNormal {
                mean: m.size,
                sigma: m.sigma,
                min,
                max,
            }
        }
        d => return Err(format!("message.dist {d:?}: fixed or lognormal")),
    };
    if !(BODY_BYTES_MIN..=BODY_BYTES_MAX).contains(&m.size) {
        return Err(format!(
            "message.size = {}: must be {BODY_BYTES_MIN}..={BODY_BYTES_MAX}",
            m.size
        ));
    }
    let groups: Vec<u32> = match &f.shape.groups {
        None => vec![1],
        Some(OneOrMany::One(g)) => vec![*g],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if groups.is_empty() || groups.iter().any(|g| *g == 0 || *g > 100_000) {
        return Err("shape.groups: each must be 1..=100000".into());
    }
    let shapes: Vec<(String, Shape)> = match f.shape.kind.as_str() {
        "standard" => {
            if f.shape.groups.is_some() || f.shape.partitions.is_some() {
                return Err("shape: a standard queue has no groups or partitions".into());
            }
            vec![(f.name.clone(), Shape::Standard)]
        }
        "fifo" => {
            if groups.len() != 1 || f.shape.partitions.is_some() {
                return Err("shape: fifo takes one `groups` value and no partitions".into());
            }
            vec![(f.name.clone(), Shape::Fifo { groups: groups[0] })]
        }
        "topic" => {
            let partitions = f.shape.partitions.unwrap_or(1);
            if partitions == 0 || partitions > 1024 {
                return Err("shape.partitions: must be 1..=1024".into());
            }
            let sweep = groups.len() > 1;
            groups
                .iter()
                .map(|&g| {
                    let name = if sweep {
                        format!("{}-g{g}", f.name)
                    } else {
                        f.name.clone()
                    };
                    (
                        name,
                        Shape::Topic {
                            partitions,
                            groups: g,
                        },
                    )
                })
                .collect()
        }
        k => return Err(format!("shape.kind {k:?}: standard, fifo or topic")),
    };
    let cases = shapes
        .into_iter()
        .map(|(name, shape)| Case {
            name,
            load: LoadSpec {
                mode: mode.clone(),
                phase,
                profile: profile.clone(),
                producers: l.producers,
                consumers: l.consumers,
                connections: l.connections,
                batch: l.batch,
                receive_max: l.receive_max,
                receive_wait: Duration::from_millis(l.receive_wait_ms),
                warmup,
                duration,
                messages_max: l.messages_max,
                drain,
                size: size.clone(),
                shape,
                seed: 0,
            },
        })
        .collect();
    Ok(Scenario {
        name: f.name,
        description: f.description,
        durability: f.durability,
        targets: f.targets,
        floors: f.floors,
        seed: f.seed,
        cases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
        name = "t"
        durability = "fsync before every ack"
        [load]
        mode = "open"
        rate_per_s = 100
        producers = 1
        consumers = 1
        duration_s = 1
        [message]
        size = 2048
        [shape]
        kind = "topic"
        partitions = 2
        groups = [1, 2, 4]
    "#;

    #[test]
    fn a_sweep_expands_into_cases() {
        let s = parse(OK).expect("parses");
        let names: Vec<_> = s.cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["t-g1", "t-g2", "t-g4"]);
        assert_eq!(
            s.cases[2].load.shape,
            Shape::Topic {
                partitions: 2,
                groups: 4
            }
        );
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let unknown = OK.replace("producers = 1", "producers = 1\nproducer = 2");
        assert!(parse(&unknown).unwrap_err().contains("producer"));
        let zero = OK.replace("producers = 1", "producers = 0");
        assert!(parse(&zero).unwrap_err().contains("load.producers"));
        let no_rate = OK.replace("rate_per_s = 100", "");
        assert!(parse(&no_rate).unwrap_err().contains("rate_per_s"));
        assert!(parse("name = ").is_err());
        let tiny = OK.replace("size = 2048", "size = 3");
        assert!(parse(&tiny).unwrap_err().contains("message.size"));
        let floors = |list: &str| {
            OK.replace(
                "durability = \"fsync before every ack\"",
                &format!("durability = \"fsync before every ack\"\nfloors = [{list}]"),
            )
        };
        let s = parse(&floors(r#""fio", "quinn-echo", "quic-fetch""#)).expect("parses");
        assert_eq!(s.floors, ["fio", "quinn-echo", "quic-fetch"]);
        assert!(parse(&floors(r#""quic-fetches""#))
            .unwrap_err()
            .contains("unknown floor \"quic-fetches\""));
    }

    #[test]
    fn only_a_closed_loop_bounds_its_backlog() {
        let open = OK.replace("producers = 1", "producers = 1\nbacklog_max = 100");
        assert!(parse(&open).unwrap_err().contains("load.backlog_max"));
        let closed = open
            .replace(r#"mode = "open""#, r#"mode = "closed""#)
            .replace("rate_per_s = 100", "in_flight = 4");
        let s = parse(&closed).expect("parses");
        assert!(matches!(
            s.cases[0].load.mode,
            Mode::Closed {
                in_flight: 4,
                backlog_max: Some(100)
            }
        ));
        let zero = closed.replace("backlog_max = 100", "backlog_max = 0");
        assert!(parse(&zero).unwrap_err().contains("load.backlog_max"));
    }

    #[test]
    fn round_trips_are_of_queue_calls_at_a_rate() {
        let rtt = OK.replace(r#"mode = "open""#, r#"mode = "rtt""#);
        assert!(parse(&rtt).unwrap_err().contains("not of a topic"));
        let queue = rtt
            .replace(r#"kind = "topic""#, r#"kind = "standard""#)
            .replace("partitions = 2\n", "")
            .replace("groups = [1, 2, 4]", "");
        let s = parse(&queue).expect("parses");
        assert!(matches!(
            s.cases[0].load.mode,
            Mode::RoundTrip { rate_per_s } if rate_per_s == 100.0
        ));
        let no_rate = queue.replace("rate_per_s = 100", "");
        assert!(parse(&no_rate)
            .unwrap_err()
            .contains("round-trip scenario needs a rate"));
    }
}
