//! Output for people (tables) and for scripts (`--output json`), and the exit codes.
//!
//! Every command produces one JSON value; the table is derived from it: an array of objects is
//! a table with one column per key, an object is a two-column key/value table, a string is
//! printed as is. So the two outputs never disagree.

use serde_json::Value;
use std::fmt::Write as _;

/// Exit codes scripts can trust (also in `sluice --help`).
pub mod exit {
    pub const OK: i32 = 0;
    /// The broker answered with an error (queue does not exist, invalid parameter, …).
    pub const SERVER: i32 = 1;
    /// The command line or a local input (file, stdin) is wrong.
    pub const USAGE: i32 = 2;
    /// The broker could not be reached, or the connection failed mid-request, or timed out.
    pub const CONNECTION: i32 = 3;
    /// `log verify` / `log dump` found corrupt data.
    pub const CORRUPT: i32 = 4;
}

/// A failed command: what to print and which exit code.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub kind: &'static str,
    pub message: String,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: exit::USAGE,
            kind: "usage",
            message: message.into(),
        }
    }

    pub fn server(message: impl Into<String>) -> Self {
        CliError {
            code: exit::SERVER,
            kind: "server",
            message: message.into(),
        }
    }

    pub fn connection(message: impl Into<String>) -> Self {
        CliError {
            code: exit::CONNECTION,
            kind: "connection",
            message: message.into(),
        }
    }
}

impl From<sluice_sdk::Error> for CliError {
    fn from(e: sluice_sdk::Error) -> Self {
        use sluice_sdk::Error as E;
        match &e {
            E::Service { .. } | E::UnsupportedVersion { .. } | E::Protocol(_) => {
                CliError::server(e.to_string())
            }
            E::InvalidRequest(_) => CliError::usage(e.to_string()),
            E::Connect(_) | E::ConnectionLost(_) | E::Timeout(_) | E::Tls(_) => {
                CliError::connection(e.to_string())
            }
            // The SDK's error enum may grow; an unknown failure is reported as the broker's.
            #[allow(unreachable_patterns)]
            _ => CliError::server(e.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// One JSON document on stdout, for scripts.
    Json,
}

pub fn print(format: Format, v: &Value) {
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(v).expect("a JSON value serialises")
        ),
        Format::Table => print!("{}", table(v)),
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        // One line per row: control characters are escaped.
        Value::String(s) => s.escape_debug().to_string(),
        other => other.to_string(),
    }
}

fn render(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, s) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(s);
            } else {
                let _ = write!(line, "{s:<w$}  ", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The table form of a command's JSON result.
pub fn table(v: &Value) -> String {
    match v {
        Value::Array(items) if items.is_empty() => "(none)\n".into(),
        Value::Array(items) => {
            let mut keys: Vec<String> = Vec::new();
            for i in items {
                if let Value::Object(m) = i {
                    for k in m.keys() {
                        if !keys.contains(k) {
                            keys.push(k.clone());
                        }
                    }
                }
            }
            if keys.is_empty() {
                return items.iter().map(|i| cell(i) + "\n").collect();
            }
            let mut rows = vec![keys.iter().map(|k| k.to_uppercase()).collect::<Vec<_>>()];
            for i in items {
                rows.push(keys.iter().map(|k| cell(&i[k.as_str()])).collect());
            }
            render(&rows)
        }
        Value::Object(m) => {
            // Arrays of objects (a topic's partitions, a group's members) follow as their
            // own tables under their key; everything else is a key/value row.
            let nested = |v: &Value| matches!(v, Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object));
            let rows: Vec<Vec<String>> = m
                .iter()
                .filter(|(_, v)| !nested(v))
                .map(|(k, v)| {
                    let v = match v {
                        Value::Object(_) | Value::Array(_) => v.to_string(),
                        other => cell(other),
                    };
                    vec![k.clone(), v]
                })
                .collect();
            let mut out = render(&rows);
            for (k, v) in m.iter().filter(|(_, v)| nested(v)) {
                let _ = write!(out, "\n{}:\n{}", k.to_uppercase(), table(v));
            }
            out
        }
        other => cell(other) + "\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_of_objects_become_aligned_tables() {
        let v = serde_json::json!([{"name": "a", "n": 1}, {"name": "long-name", "n": 22}]);
        assert_eq!(table(&v), "N   NAME\n1   a\n22  long-name\n");
    }

    #[test]
    fn arrays_of_objects_inside_an_object_become_their_own_tables() {
        let v = serde_json::json!({"name": "t", "offsets": [{"partition": 0, "latest": 5}]});
        assert_eq!(
            table(&v),
            "name  t\n\nOFFSETS:\nLATEST  PARTITION\n5       0\n"
        );
    }

    #[test]
    fn objects_become_key_value_rows() {
        let v = serde_json::json!({"QueueArn": "arn", "Visible": "3"});
        assert_eq!(table(&v), "QueueArn  arn\nVisible   3\n");
    }
}
