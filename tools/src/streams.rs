//! The stream commands: `topic create|list|describe|delete|produce`, `group list|describe` and `tail`,
//! over the SDK's stream calls (native protocol over QUIC).

use crate::output::{exit, CliError, Format};
use crate::{GroupCmd, TailArgs, TopicCmd};
use serde_json::{json, Value};
use sluice_sdk::types::{CreateTopicRequest, GetRoutingRequest, Request, Response};
use sluice_sdk::{Client, ConsumedRecord, Seek};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

/// Records asked for per fetch by `tail`.
pub const TAIL_FETCH_RECORDS_MAX: u32 = 500;
/// Bytes asked for per fetch by `tail`.
pub const TAIL_FETCH_BYTES_MAX: u32 = 1024 * 1024;
/// `tail --follow` waits this long for new records on a partition before looking at the next.
pub const TAIL_FOLLOW_WAIT_MS: u64 = 500;

pub async fn topic(client: &Client, c: TopicCmd) -> Result<Value, CliError> {
    match c {
        TopicCmd::Create {
            name,
            partitions,
            retention_ms,
            retention_bytes,
            segment_bytes,
        } => {
            let r = client
                .create_topic(CreateTopicRequest {
                    name,
                    partitions,
                    retention_ms,
                    retention_bytes,
                    segment_bytes,
                })
                .await?;
            Ok(json!({"name": r.name, "partitions": r.partitions}))
        }
        TopicCmd::List => {
            let topics = client.list_topics().await?;
            Ok(Value::Array(
                topics
                    .into_iter()
                    .map(|t| {
                        json!({
                            "name": t.name,
                            "partitions": t.partitions,
                            "retention_ms": t.retention_ms,
                            "retention_bytes": t.retention_bytes,
                        })
                    })
                    .collect(),
            ))
        }
        TopicCmd::Describe { name } => {
            let t = client.describe_topic(&name).await?;
            let mut offsets = Vec::new();
            for p in 0..t.partitions {
                let earliest = client.list_offset(&name, p, Seek::Earliest).await?;
                let latest = client.list_offset(&name, p, Seek::Latest).await?;
                offsets.push(json!({
                    "partition": p,
                    "earliest": earliest,
                    "latest": latest,
                    "records": latest.saturating_sub(earliest),
                }));
            }
            Ok(json!({
                "name": t.name,
                "partitions": t.partitions,
                "retention_ms": t.retention_ms,
                "retention_bytes": t.retention_bytes,
                "offsets": offsets,
            }))
        }
        TopicCmd::Delete { name } => {
            client.delete_topic(&name).await?;
            Ok(json!({"name": name, "result": "deleted"}))
        }
        TopicCmd::Produce {
            topic,
            values,
            key,
            key_separator,
            file,
            partition,
        } => produce(client, topic, values, key, key_separator, file, partition).await,
    }
}

/// `topic produce`: records from the arguments or from lines of input; one line of output
/// per partition written (its first and last offset).
async fn produce(
    client: &Client,
    topic: String,
    values: Vec<String>,
    key: Option<String>,
    key_separator: Option<String>,
    file: Option<std::path::PathBuf>,
    partition: Option<u32>,
) -> Result<Value, CliError> {
    let lines: Vec<String> = if values.is_empty() {
        crate::net::read_input(file.as_deref())?
            .lines()
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    } else {
        values
    };
    if lines.is_empty() {
        return Err(CliError::usage("no records to produce"));
    }
    let records: Vec<(Option<String>, String)> = lines
        .into_iter()
        .map(|l| match (&key, &key_separator) {
            (Some(k), _) => (Some(k.clone()), l),
            (None, Some(sep)) => match l.split_once(sep.as_str()) {
                Some((k, v)) => (Some(k.to_string()), v.to_string()),
                None => (None, l),
            },
            (None, None) => (None, l),
        })
        .collect();
    let n = records.len();
    let written = match partition {
        Some(p) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let recs: Vec<sluice_wire::batch::Record> = records
                .into_iter()
                .map(|(k, v)| sluice_wire::batch::Record {
                    timestamp_ms: now,
                    key: k.map(String::into_bytes),
                    value: v.into_bytes(),
                    headers: Vec::new(),
                })
                .collect();
            let bytes = sluice_wire::batch::encode(&recs).expect("at least one record");
            let r = client.produce_batch(&topic, Some(p), bytes).await?;
            vec![(r.partition, r.base_offset, r.last_offset)]
        }
        None => {
            let mut producer = client.topic_producer(&topic).await?;
            for (k, v) in &records {
                producer
                    .send(k.as_deref().map(str::as_bytes), v.as_bytes())
                    .await?;
            }
            producer.flush().await?
        }
    };
    Ok(json!({
        "topic": topic,
        "records": n,
        "partitions": written
            .into_iter()
            .map(|(p, first, last)| json!({"partition": p, "first_offset": first, "last_offset": last}))
            .collect::<Vec<_>>(),
    }))
}

pub async fn group(client: &Client, c: GroupCmd) -> Result<Value, CliError> {
    match c {
        GroupCmd::List => {
            let mut out = Vec::new();
            for g in client.list_groups().await? {
                let d = client.describe_group(&g).await?;
                let lag: u64 = client.group_lag(&g).await?.iter().map(|l| l.lag).sum();
                out.push(json!({
                    "group": g,
                    "generation": d.generation,
                    "members": d.members.len(),
                    "lag": lag,
                }));
            }
            Ok(Value::Array(out))
        }
        GroupCmd::Describe { group } => {
            let d = client.describe_group(&group).await?;
            let lags = client.group_lag(&group).await?;
            if !d.found && lags.is_empty() {
                return Err(CliError::server(format!(
                    "no consumer group {group:?} (no members and no committed offsets)"
                )));
            }
            // Every partition assigned or committed on: who has it, committed, latest, lag.
            let mut rows: BTreeMap<(String, u32), Value> = BTreeMap::new();
            let mut members = Vec::new();
            for m in &d.members {
                let mut parts = Vec::new();
                for a in &m.assignment {
                    parts.push(format!("{}/{}", a.topic, a.partition));
                    rows.insert(
                        (a.topic.clone(), a.partition),
                        json!({
                            "topic": a.topic,
                            "partition": a.partition,
                            "member": m.member_id,
                            "committed": null,
                            "latest": null,
                            "lag": null,
                        }),
                    );
                }
                members.push(json!({"member_id": m.member_id, "partitions": parts.join(",")}));
            }
            for l in &lags {
                let row = rows.entry((l.topic.clone(), l.partition)).or_insert_with(
                    || json!({"topic": l.topic, "partition": l.partition, "member": null}),
                );
                row["committed"] = json!(l.committed);
                row["latest"] = json!(l.latest);
                row["lag"] = json!(l.lag);
            }
            // Assigned but never committed: show how far the partition has got.
            for ((topic, partition), row) in rows.iter_mut() {
                if row["latest"].is_null() && !topic.starts_with("queue:") {
                    if let Ok(latest) = client.list_offset(topic, *partition, Seek::Latest).await {
                        row["latest"] = json!(latest);
                    }
                }
            }
            Ok(json!({
                "group": group,
                "generation": d.generation,
                "members": members,
                "partitions": rows.into_values().collect::<Vec<_>>(),
            }))
        }
    }
}

/// Unix milliseconds of `--from-time`: RFC 3339 (`2026-12-03T11:15:00Z`, fractions and
/// `+hh:mm` offsets allowed) or an integer Unix time (seconds if it has at most 10 digits,
/// else milliseconds).
pub fn parse_time_ms(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = s.parse().map_err(|_| format!("{s:?}: number too large"))?;
        return Ok(if s.len() <= 10 { n * 1000 } else { n });
    }
    let bad = || format!("{s:?}: expected RFC 3339 (2026-12-03T11:15:00Z) or Unix time");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        s.get(r)
            .filter(|x| x.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|x| x.parse().ok())
            .ok_or_else(bad)
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return Err(bad());
    }
    if second > 60 {
        return Err(bad());
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let frac = &s[start..i.min(start + 3)];
        millis = frac.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - frac.len() as u32);
    }
    let offset_s = match &s[i..] {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let h = num(i + 1..i + 3)?;
            let m = num(i + 4..i + 6)?;
            let v = h * 3600 + m * 60;
            if o.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return Err(bad()),
    };
    // Days from the civil date (Howard Hinnant's algorithm), proleptic Gregorian.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Ok(secs * 1000 + millis)
}

/// RFC 3339 (UTC, milliseconds) of Unix milliseconds.
pub fn format_time_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

fn text(bytes: &[u8]) -> (Value, bool) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (Value::String(s.to_string()), true),
        Err(_) => (
            Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect()),
            false,
        ),
    }
}

fn record_json(r: &ConsumedRecord) -> Value {
    let mut v = json!({
        "partition": r.partition,
        "offset": r.offset,
        "timestamp_ms": r.timestamp_ms,
        "time": format_time_ms(r.timestamp_ms),
    });
    match r.key.as_deref().map(text) {
        None => v["key"] = Value::Null,
        Some((k, true)) => v["key"] = k,
        Some((k, false)) => v["key_hex"] = k,
    }
    match text(&r.value) {
        (s, true) => v["value"] = s,
        (s, false) => v["value_hex"] = s,
    }
    v
}

fn print_record(format: Format, r: &ConsumedRecord) {
    let v = record_json(r);
    let line = match format {
        Format::Json => v.to_string(),
        Format::Table => {
            let show = |plain: &str, hex: &str| match (&v[plain], &v[hex]) {
                (Value::String(s), _) => s.escape_debug().to_string(),
                (_, Value::String(h)) => format!("0x{h}"),
                _ => "-".to_string(),
            };
            format!(
                "{}\t{}\t{}\t{}\t{}",
                r.partition,
                r.offset,
                v["time"].as_str().unwrap_or(""),
                show("key", "key_hex"),
                show("value", "value_hex"),
            )
        }
    };
    // A closed pipe (`| head`) ends the tail quietly.
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(exit::OK);
    }
}

/// `sluice tail`: prints records as they are read (JSON lines, or tab-separated for people).
/// Without --follow it stops at the end offsets seen when it started.
pub async fn tail(client: &Client, format: Format, a: TailArgs) -> Result<i32, CliError> {
    // A queue read as a stream (`queue:<name>`) has no topic description: its partition
    // count comes from the routing table.
    let count = if a.topic.starts_with("queue:") {
        let r = GetRoutingRequest {
            topic: a.topic.clone(),
        };
        match client.call(Request::GetRouting(r)).await? {
            Response::GetRouting(r) => r.partition_shards.len() as u32,
            other => return Err(CliError::server(format!("unexpected answer {other:?}"))),
        }
    } else {
        client.describe_topic(&a.topic).await?.partitions
    };
    let partitions: Vec<u32> = match a.partition {
        Some(p) if p >= count => {
            return Err(CliError::usage(format!(
                "--partition {p}: {} has {count} partitions",
                a.topic
            )))
        }
        Some(p) => vec![p],
        None => (0..count).collect(),
    };
    let from_time = match &a.from_time {
        Some(s) => Some(parse_time_ms(s).map_err(|e| CliError::usage(format!("--from-time {e}")))?),
        None => None,
    };
    // (partition, next offset to read, end offset when started)
    let mut cursors = Vec::with_capacity(partitions.len());
    for p in partitions {
        let latest = client.list_offset(&a.topic, p, Seek::Latest).await?;
        let start = match (a.from_offset, from_time, a.from) {
            (Some(o), _, _) => o,
            (None, Some(ms), _) => client.list_offset(&a.topic, p, Seek::Timestamp(ms)).await?,
            (None, None, Some(crate::From::Latest)) => latest,
            _ => client.list_offset(&a.topic, p, Seek::Earliest).await?,
        };
        cursors.push((p, start, latest));
    }
    if format == Format::Table {
        println!("PARTITION\tOFFSET\tTIME\tKEY\tVALUE");
    }
    let mut printed = 0usize;
    let max = a.max.unwrap_or(usize::MAX);
    let single = cursors.len() == 1;
    loop {
        // Some partition's position moved (a queue's log has offsets that are not records:
        // the broker's `next_offset` steps over them).
        let mut progressed = false;
        for (p, next, end) in cursors.iter_mut() {
            if printed >= max {
                return Ok(exit::OK);
            }
            if !a.follow && *next >= *end {
                continue;
            }
            // One partition: long-poll it; several: look at each in turn, waiting only when
            // a whole round found nothing (below).
            let wait = if a.follow && single {
                Duration::from_millis(TAIL_FOLLOW_WAIT_MS)
            } else {
                Duration::ZERO
            };
            let want = (max - printed).min(TAIL_FETCH_RECORDS_MAX as usize) as u32;
            let fetched = match client
                .fetch_records(&a.topic, *p, *next, TAIL_FETCH_BYTES_MAX, want, wait)
                .await
            {
                Ok(r) => r,
                // Retention removed what we wanted: go on from the partition's start.
                Err(sluice_sdk::Error::Service {
                    code: sluice_sdk::ErrorCode::OffsetOutOfRange,
                    ..
                }) => {
                    let earliest = client.list_offset(&a.topic, *p, Seek::Earliest).await?;
                    if earliest <= *next {
                        // Beyond the end (a future --from-offset): nothing yet.
                        if !a.follow {
                            *next = *end;
                        }
                        continue;
                    }
                    *next = earliest;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let before = *next;
            let mut at_end = false;
            for r in &fetched.records {
                if !a.follow && r.offset >= *end {
                    at_end = true;
                    break;
                }
                if printed >= max {
                    return Ok(exit::OK);
                }
                print_record(format, r);
                printed += 1;
                *next = r.offset + 1;
            }
            *next = if at_end {
                *end
            } else {
                (*next).max(fetched.next_offset)
            };
            progressed |= *next > before;
        }
        if printed >= max {
            return Ok(exit::OK);
        }
        // Without --follow, a round that read nothing ends the tail too (nothing more below
        // the end offsets can appear), so it cannot spin.
        if !a.follow && (!progressed || cursors.iter().all(|(_, next, end)| next >= end)) {
            return Ok(exit::OK);
        }
        if !progressed && !single {
            tokio::time::sleep(Duration::from_millis(TAIL_FOLLOW_WAIT_MS / 2)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_both_forms_and_round_trip() {
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_time_ms("2026-12-03T11:15:00.25Z"),
            Ok(1_796_296_500_250)
        );
        assert_eq!(
            parse_time_ms("2026-12-03T12:15:00+01:00"),
            parse_time_ms("2026-12-03T11:15:00Z")
        );
        assert_eq!(parse_time_ms("1796296500"), Ok(1_796_296_500_000));
        assert_eq!(parse_time_ms("1796296500250"), Ok(1_796_296_500_250));
        assert_eq!(
            format_time_ms(1_796_296_500_250),
            "2026-12-03T11:15:00.250Z"
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-03T11:15:00",
            "-5",
        ] {
            assert!(parse_time_ms(bad).is_err(), "{bad}");
        }
    }
}
