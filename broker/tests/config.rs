//! The `sluiced` binary's configuration: the TOML file, flags and environment variables in
//! their order of precedence, unknown keys refused by name, `--print-config`, and no secret in
//! the start-up log (a real broker started with a SigV4 secret in its file, stderr captured).

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Bound on one short `sluiced` call (parse and print).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a broker's start and stop.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const SECRET: &str = "wJalrXUtnFEMI-s3cr3t-value-never-logged";

/// A `sluiced` command with a clean environment (no SLUICE_* from the caller).
fn sluiced() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluiced"));
    c.env_clear().env("RUST_LOG", "info");
    c
}

fn run(mut c: Command) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluiced");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        let mut o = Vec::new();
        let mut e = Vec::new();
        let _ = out.read_to_end(&mut o);
        let _ = err.read_to_end(&mut e);
        let _ = tx.send((child.wait(), o, e));
    });
    match rx.recv_timeout(CALL_TIMEOUT) {
        Ok((status, stdout, stderr)) => Output {
            status: status.expect("wait"),
            stdout,
            stderr,
        },
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("sluiced did not finish");
        }
    }
}

fn print_config(file: Option<&Path>, env: &[(&str, &str)], flags: &[&str]) -> toml::Table {
    let mut c = sluiced();
    if let Some(f) = file {
        c.arg("--config").arg(f);
    }
    c.envs(env.iter().copied())
        .args(flags)
        .arg("--print-config");
    let out = run(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("--print-config is not TOML ({e}): {text}"))
}

#[test]
fn flags_beat_environment_beats_file_beats_defaults() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("sluice.toml");
    std::fs::write(
        &file,
        "shards = 3\nregion = \"eu-west-1\"\n[quic]\nidle_timeout_ms = 1234\n[metrics]\naddr = \"127.0.0.1:9555\"\n",
    )
    .expect("write");
    let t = print_config(Some(&file), &[], &[]);
    assert_eq!(t["shards"].as_integer(), Some(3));
    assert_eq!(
        t["partitions"].as_integer(),
        Some(3),
        "partitions follow shards"
    );
    assert_eq!(t["region"].as_str(), Some("eu-west-1"));
    assert_eq!(t["quic"]["idle_timeout_ms"].as_integer(), Some(1234));
    assert_eq!(t["metrics"]["addr"].as_str(), Some("127.0.0.1:9555"));
    // Defaults fill the rest.
    assert_eq!(t["http"]["addr"].as_str(), Some("127.0.0.1:9324"));
    assert_eq!(t["quic"]["addr"].as_str(), Some("127.0.0.1:7400"));
    assert_eq!(t["data_dir"].as_str(), Some("sluice-data"));

    let env = [("SLUICE_SHARDS", "2"), ("SLUICE_REGION", "ap-south-1")];
    let t = print_config(Some(&file), &env, &[]);
    assert_eq!(t["shards"].as_integer(), Some(2));
    assert_eq!(t["region"].as_str(), Some("ap-south-1"));
    assert_eq!(t["quic"]["idle_timeout_ms"].as_integer(), Some(1234));

    let t = print_config(Some(&file), &env, &["--shards", "1", "--no-quic"]);
    assert_eq!(t["shards"].as_integer(), Some(1));
    assert_eq!(t["quic"]["enabled"].as_bool(), Some(false));

    // SLUICE_CONFIG names the file like --config.
    let mut c = sluiced();
    c.env("SLUICE_CONFIG", &file).arg("--print-config");
    let out = run(c);
    assert!(String::from_utf8_lossy(&out.stdout).contains("eu-west-1"));

    // With nothing: the embedded default, and --print-config touches no data dir.
    let mut c = sluiced();
    c.current_dir(dir.path()).arg("--print-config");
    let out = run(c);
    assert_eq!(out.status.code(), Some(0));
    assert!(!dir.path().join("sluice-data").exists());
}

#[test]
fn bad_configuration_is_a_clear_error_with_exit_code_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&str, &str); 5] = [
        ("shards = 2\nshardz = 3\n", "shardz"),
        ("[quic]\nadress = \"127.0.0.1:1\"\n", "adress"),
        ("[http]\naddr = \"not an address\"\n", "addr"),
        ("shards = 0\n", "shards"),
        ("this is not toml", "config file"),
    ];
    for (text, named) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).expect("write");
        let mut c = sluiced();
        c.arg("--config").arg(&file);
        let out = run(c);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(
            err.contains(named),
            "{text:?}: error does not name {named}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let mut c = sluiced();
    c.arg("--config").arg(dir.path().join("missing.toml"));
    let out = run(c);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

fn wait_for_line(child: &mut Child, what: &str) -> (String, std::sync::mpsc::Receiver<String>) {
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + START_TIMEOUT;
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(what) {
                    return (seen, rx);
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!("no {what:?} line from sluiced; stderr so far:\n{seen}");
            }
        }
    }
}

#[test]
fn no_secret_reaches_the_log_and_the_effective_config_is_logged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("sluice.toml");
    let http = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    std::fs::write(
        &file,
        format!(
            "data_dir = {:?}\nshards = 1\n[auth]\nmode = \"sigv4\"\n\
             access_keys = [{{ id = \"AKIDCONFIGTEST\", secret = \"{SECRET}\" }}]\n\
             [http]\naddr = \"{http}\"\n[quic]\naddr = \"127.0.0.1:0\"\n[metrics]\naddr = \"127.0.0.1:0\"\n\
             [kafka]\naddr = \"127.0.0.1:0\"\n",
            dir.path().join("data").display().to_string()
        ),
    )
    .expect("write");
    // The other secret input, the environment, too.
    let mut child = sluiced()
        .arg("--config")
        .arg(&file)
        .env("SLUICE_ACCESS_KEYS", format!("AKIDENV:{SECRET}-env"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluiced");
    // A failing assertion below must not leave the broker running.
    struct KillOnDrop(Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let (mut log, rx) = wait_for_line(&mut child, "daemon: ready");
    let mut child = KillOnDrop(child);
    let pid = child.0.id().to_string();
    // The daemon turned transparent huge pages off for itself (`sluice_storage::rt`). Kernels
    // without the status field (before 5.0) are not checked.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    if let Some(thp) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
        assert_eq!(thp.split_whitespace().nth(1), Some("0"), "{thp}");
    }
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + START_TIMEOUT;
    let code = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s.code();
        }
        assert!(Instant::now() < deadline, "sluiced did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        log.push_str(&line);
        log.push('\n');
    }
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    // The effective configuration was logged, keys named and secrets redacted; the flag and
    // environment layer won over the file (SLUICE_ACCESS_KEYS replaces the file's keys).
    assert!(
        log.contains("effective") || log.contains("config="),
        "{log}"
    );
    assert!(log.contains("AKIDENV"), "{log}");
    assert!(log.contains("<redacted>"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}
