//! A small fuzzing engine for Sluice's parsers, on stable Rust: seeded mutation campaigns over a
//! corpus kept in the repository (`fuzz/corpus/<target>/`), bounded in time, run by each crate's
//! tests next to the code they attack (`cargo test` runs every target for a few seconds).
//!
//! It is not coverage-guided (libFuzzer and AFL need a nightly compiler or their own toolchain
//! here): it mutates the corpus — bit flips, interesting integers, inserted, deleted, duplicated
//! and spliced ranges, tokens from the target's dictionary — so the corpus is what steers it.
//! Keep it rich: valid inputs of every shape a target accepts, and the inputs that once failed.
//!
//! A target is a function of the input bytes that must never panic and must return in bounded
//! time. On a panic the campaign saves the input, prints the target, seed and file, and fails.
//!
//! Knobs (environment):
//! - `SLUICE_FUZZ_SECONDS` — seconds per target (default [`SECONDS_DEFAULT`]);
//! - `SLUICE_SEED` — the campaign's seed (default: from the clock; always printed);
//! - `SLUICE_FUZZ_INPUT` — run only this file (replaying a saved failure);
//! - `SLUICE_FUZZ_OUT` — where failing inputs are saved (default: the system temp dir).
//!
//! A long campaign: `SLUICE_FUZZ_SECONDS=600 cargo test --release -p <crate> fuzz_`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Seconds per target in an ordinary test run (CI).
pub const SECONDS_DEFAULT: f64 = 2.0;
/// An input is cut to this many bytes unless the target says otherwise.
pub const INPUT_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// One input taking longer than this is reported as a hang.
pub const INPUT_TIME_MAX: Duration = Duration::from_secs(2);
/// Mutations stacked on one corpus entry, at most.
const MUTATIONS_MAX: u32 = 8;

/// One target's campaign.
pub struct Target<'a> {
    pub name: &'a str,
    /// The target's corpus directory (every file is one input).
    pub corpus_dir: PathBuf,
    /// Inputs built by the test itself (valid encodings), added to the corpus.
    pub seeds: Vec<Vec<u8>>,
    /// Byte strings worth inserting (keywords, field names, magic numbers).
    pub dictionary: Vec<Vec<u8>>,
    pub input_bytes_max: usize,
}

impl<'a> Target<'a> {
    /// A target whose corpus is `fuzz/corpus/<name>` at the workspace root; `manifest_dir` is
    /// the calling crate's `CARGO_MANIFEST_DIR`.
    pub fn new(manifest_dir: &str, name: &'a str) -> Self {
        Target {
            name,
            corpus_dir: Path::new(manifest_dir)
                .join("..")
                .join("fuzz")
                .join("corpus")
                .join(name),
            seeds: Vec::new(),
            dictionary: Vec::new(),
            input_bytes_max: INPUT_BYTES_MAX_DEFAULT,
        }
    }

    pub fn seeds(mut self, seeds: impl IntoIterator<Item = Vec<u8>>) -> Self {
        self.seeds.extend(seeds);
        self
    }

    pub fn dictionary<T: AsRef<[u8]>>(mut self, words: impl IntoIterator<Item = T>) -> Self {
        self.dictionary
            .extend(words.into_iter().map(|w| w.as_ref().to_vec()));
        self
    }

    pub fn input_bytes_max(mut self, n: usize) -> Self {
        self.input_bytes_max = n;
        self
    }

    /// Runs the campaign: every corpus entry as it is, then mutations until the time is up.
    /// Returns the number of inputs run. Panics (failing the test) on the first input that
    /// makes `run` panic or hang.
    pub fn run(self, run: impl Fn(&[u8])) -> u64 {
        let seed = std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        if let Ok(path) = std::env::var("SLUICE_FUZZ_INPUT") {
            let input = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            self.check(&run, &input, seed, 0);
            return 1;
        }
        let seconds = std::env::var("SLUICE_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(SECONDS_DEFAULT);
        let mut corpus = self.load_corpus();
        corpus.extend(self.seeds.iter().cloned());
        if corpus.is_empty() {
            corpus.push(Vec::new());
        }
        let mut runs = 0u64;
        for input in &corpus {
            self.check(&run, input, seed, runs);
            runs += 1;
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        while Instant::now() < deadline {
            let mut input = corpus[rng.gen_range(0..corpus.len())].clone();
            let n = rng.gen_range(1..=MUTATIONS_MAX);
            for _ in 0..n {
                self.mutate(&mut rng, &mut input, &corpus);
            }
            input.truncate(self.input_bytes_max);
            self.check(&run, &input, seed, runs);
            runs += 1;
        }
        eprintln!(
            "fuzz {}: {runs} inputs in {seconds} s from {} corpus entries (seed {seed}; \
             SLUICE_SEED={seed} replays it)",
            self.name,
            corpus.len()
        );
        runs
    }

    fn load_corpus(&self) -> Vec<Vec<u8>> {
        let Ok(entries) = std::fs::read_dir(&self.corpus_dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort(); // the same order every run: the seed replays exactly
        files
            .into_iter()
            .filter_map(|p| std::fs::read(p).ok())
            .collect()
    }

    fn check(&self, run: &impl Fn(&[u8]), input: &[u8], seed: u64, index: u64) {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(input)));
        let took = started.elapsed();
        let why = match outcome {
            Err(p) => p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_string()),
            Ok(()) if took > INPUT_TIME_MAX => format!("took {took:?} (a hang?)"),
            Ok(()) => return,
        };
        let dir = std::env::var_os("SLUICE_FUZZ_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let path = dir.join(format!("sluice-fuzz-{}-{seed}-{index}.bin", self.name));
        let saved = std::fs::write(&path, input).is_ok();
        let shown: String = input.iter().take(256).map(|b| format!("{b:02x}")).collect();
        panic!(
            "fuzz target {} failed on input #{index} (seed {seed}): {why}\n\
             input ({} bytes{}): {shown}\n\
             replay: SLUICE_FUZZ_INPUT={} (or SLUICE_SEED={seed}); add the file to {} once fixed",
            self.name,
            input.len(),
            if input.len() > 256 {
                ", first 256 shown"
            } else {
                ""
            },
            if saved {
                path.display().to_string()
            } else {
                "<not saved>".into()
            },
            self.corpus_dir.display(),
        );
    }

    fn mutate(&self, rng: &mut SmallRng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        const INTERESTING: [u64; 12] = [
            0,
            1,
            0x7f,
            0x80,
            0xff,
            0x7fff,
            0xffff,
            0x7fff_ffff,
            0xffff_ffff,
            0x8000_0000_0000_0000,
            u64::MAX,
            u64::MAX - 1,
        ];
        let len = input.len();
        match rng.gen_range(0..9) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] = rng.gen();
            }
            2 => {
                // An interesting integer, little or big endian, 1–8 bytes, over or into.
                let v = INTERESTING[rng.gen_range(0..INTERESTING.len())];
                let width = [1usize, 2, 4, 8][rng.gen_range(0..4)];
                let bytes = if rng.gen() {
                    v.to_le_bytes()[..width].to_vec()
                } else {
                    v.to_be_bytes()[8 - width..].to_vec()
                };
                let at = rng.gen_range(0..=len);
                if rng.gen() && at + width <= len {
                    input[at..at + width].copy_from_slice(&bytes);
                } else {
                    input.splice(at..at, bytes);
                }
            }
            3 => {
                let at = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                input.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let at = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - at).min(64));
                input.drain(at..at + n);
            }
            5 if len > 0 => {
                let at = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - at).min(64));
                let copy = input[at..at + n].to_vec();
                let to = rng.gen_range(0..=len);
                input.splice(to..to, copy);
            }
            6 => {
                // Splice: a range of another corpus entry.
                let other = &corpus[rng.gen_range(0..corpus.len())];
                if !other.is_empty() {
                    let a = rng.gen_range(0..other.len());
                    let b = rng.gen_range(a..=other.len());
                    let to = rng.gen_range(0..=len);
                    input.splice(to..to, other[a..b].iter().copied());
                }
            }
            7 if !self.dictionary.is_empty() => {
                let w = &self.dictionary[rng.gen_range(0..self.dictionary.len())];
                let at = rng.gen_range(0..=len);
                input.splice(at..at, w.iter().copied());
            }
            8 if len > 0 => {
                input.truncate(rng.gen_range(0..len));
            }
            _ => input.push(rng.gen()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_target_is_caught_and_reported() {
        let dir = std::env::temp_dir().join(format!("sluice-fuzz-selftest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a"), b"hello").expect("seed");
        std::env::set_var("SLUICE_FUZZ_OUT", &dir);
        let t = Target {
            name: "selftest",
            corpus_dir: dir.clone(),
            seeds: Vec::new(),
            dictionary: vec![b"BOOM".to_vec()],
            input_bytes_max: 64,
        };
        // The dictionary word appears within a couple of seconds of mutations.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.run(|input| {
                if input.windows(4).any(|w| w == b"BOOM") {
                    panic!("found it");
                }
            })
        }));
        let msg = r.expect_err("the campaign fails");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains("fuzz target selftest failed") && msg.contains("found it"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
