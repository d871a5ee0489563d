//! `sluice-check <history.jsonl> [--margin-ms N] [--json]`: judges a history and prints the
//! report. Exit status: 0 pass, 1 anomalies, 2 undecided (no anomaly, but some check could not
//! decide: not a pass), 3 the history or the arguments could not be read.

use std::fs::File;
use std::io::BufReader;
use std::process::ExitCode;

use sluice_checker::{check, Config, History, Verdict};

const EXIT_ANOMALIES: u8 = 1;
const EXIT_UNDECIDED: u8 = 2;
const EXIT_UNREADABLE: u8 = 3;
const USAGE: &str = "usage: sluice-check <history.jsonl> [--margin-ms N] [--json]";

fn main() -> ExitCode {
    let mut path = None;
    let mut json = false;
    let mut cfg = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--margin-ms" => match args.next().and_then(|v| v.parse::<u64>().ok()) {
                Some(ms) => cfg.margin_us = ms.saturating_mul(1_000),
                None => {
                    eprintln!("--margin-ms needs a whole number of milliseconds\n{USAGE}");
                    return ExitCode::from(EXIT_UNREADABLE);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if path.is_none() && !a.starts_with("--") => path = Some(a),
            _ => {
                eprintln!("unexpected argument {a:?}\n{USAGE}");
                return ExitCode::from(EXIT_UNREADABLE);
            }
        }
    }
    let Some(path) = path else {
        eprintln!("{USAGE}");
        return ExitCode::from(EXIT_UNREADABLE);
    };
    let history = match File::open(&path)
        .map_err(sluice_checker::HistoryError::from)
        .and_then(|f| History::from_jsonl(BufReader::new(f)))
    {
        Ok(h) => h,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    let report = check(&history, &cfg);
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    match report.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(EXIT_ANOMALIES),
        Verdict::Undecided => ExitCode::from(EXIT_UNDECIDED),
    }
}
