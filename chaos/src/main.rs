//! `sluice-chaos`: a fault campaign against a real sluiced (see README.md). Exit status: 0 pass,
//! 1 anomalies, 2 undecided, 3 the campaign itself failed (options, broker start, history).

use clap::Parser;

const EXIT_HARNESS_ERROR: i32 = 3;

fn main() {
    let opts = sluice_chaos::Options::parse();
    match sluice_chaos::run(&opts) {
        Ok(outcome) => {
            print!("{}", outcome.report.to_text());
            println!("report: {}", opts.out.join("report.json").display());
            std::process::exit(outcome.exit_code);
        }
        Err(e) => {
            eprintln!("sluice-chaos: {e}");
            std::process::exit(EXIT_HARNESS_ERROR);
        }
    }
}
