//! `sluice log dump` and `sluice log verify`: offline reading of segment files with the storage
//! crate's batch format (like kafka-dump-log). The broker need not run; nothing is written.
//!
//! A segment is read whole into memory (segments are at most `segment_bytes_max`, 256 MiB for
//! queue partitions). Batches are walked from position 0; the log pre-zeroes segment space, so
//! the first all-zero header ends the data. Checked per batch: header (magic, version, lengths),
//! xxh3 checksum, record structure, and offset continuity (each batch starts where the previous
//! one ended, the first where the file name says). Bytes after the data that are not zero, and
//! index entries that point at no batch, are reported as warnings: recovery truncates a torn
//! tail and rebuilds indexes, so neither loses acknowledged data.

use crate::output::CliError;
use serde_json::{json, Value};
use sluice_storage::fs::BLOCK_BYTES;
use sluice_storage::index::OffsetIndex;
use sluice_wire::batch::BatchView;
use sluice_wire::batch::BATCH_HEADER_BYTES;
use std::path::{Path, PathBuf};

/// Bytes of a record value shown by `log dump --values` (the rest is elided).
pub const VALUE_PREVIEW_BYTES_MAX: usize = 64;

/// What a walk over one segment found.
pub struct SegmentReport {
    pub json: Value,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub next_offset: u64,
}

fn base_from_name(path: &Path) -> Option<u64> {
    path.file_stem()?.to_str()?.parse().ok()
}

/// The segment files under `path` grouped by directory (one log each), by base offset; or the
/// one file given. Directories are searched recursively, so a whole data dir works.
pub fn logs(path: &Path) -> Result<Vec<Vec<PathBuf>>, CliError> {
    let meta =
        std::fs::metadata(path).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        return Ok(vec![vec![path.to_path_buf()]]);
    }
    let mut out = Vec::new();
    collect(path, &mut out, 0)?;
    if out.is_empty() {
        return Err(CliError::usage(format!(
            "{}: no segment (*.log) files; give a data dir, a partition dir or a segment file",
            path.display()
        )));
    }
    Ok(out)
}

/// Directory depth searched below the path given (a data dir is `queues/<id>/<partition>/`).
const SEARCH_DEPTH_MAX: usize = 8;

fn collect(dir: &Path, out: &mut Vec<Vec<PathBuf>>, depth: usize) -> Result<(), CliError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| CliError::usage(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut segs: Vec<(u64, PathBuf)> = entries
        .iter()
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "log"))
        .filter_map(|p| base_from_name(p).map(|b| (b, p.clone())))
        .collect();
    segs.sort();
    if !segs.is_empty() {
        out.push(segs.into_iter().map(|(_, p)| p).collect());
    }
    if depth < SEARCH_DEPTH_MAX {
        for e in entries.iter().filter(|p| p.is_dir()) {
            collect(e, out, depth + 1)?;
        }
    }
    Ok(())
}

/// The start of a value: printable ASCII as is, other bytes as `\xNN` (engine records are
/// binary).
fn preview(v: &[u8]) -> String {
    let shown = &v[..v.len().min(VALUE_PREVIEW_BYTES_MAX)];
    let mut s: String = shown
        .iter()
        .map(|b| match b {
            b' '..=b'~' if *b != b'\\' => (*b as char).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect();
    if v.len() > shown.len() {
        s.push('…');
    }
    s
}

/// `log dump` for people: one line per segment, batch and (with --records) record, like
/// kafka-dump-log.
pub fn dump_text(segments: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for seg in segments.as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "segment {} base_offset={} next_offset={} batches={} data_bytes={} file_bytes={} index_entries={}",
            seg["segment"].as_str().unwrap_or("?"),
            seg["base_offset"],
            seg["next_offset"],
            seg["batches"],
            seg["data_bytes"],
            seg["file_bytes"],
            seg["index_entries"],
        );
        for b in seg["batch_list"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  batch position={} offsets={}..={} records={} size_bytes={} first_timestamp_ms={} max_timestamp_ms={} control={} checksum={}",
                b["position"], b["base_offset"], b["last_offset"], b["records"], b["size_bytes"],
                b["first_timestamp_ms"], b["max_timestamp_ms"], b["control"],
                b["checksum"].as_str().unwrap_or("?"),
            );
            for r in b["record_list"].as_array().into_iter().flatten() {
                let _ = write!(
                    out,
                    "    record offset={} timestamp_ms={} key_bytes={} value_bytes={}",
                    r["offset"], r["timestamp_ms"], r["key_bytes"], r["value_bytes"]
                );
                if let Some(v) = r["value"].as_str() {
                    let _ = write!(out, " value={v}");
                }
                if let Some(e) = r["error"].as_str() {
                    let _ = write!(out, " ERROR {e}");
                }
                out.push('\n');
            }
        }
        for e in seg["errors"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  CORRUPT: {}", e.as_str().unwrap_or("?"));
        }
        for w in seg["warnings"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  warning: {}", w.as_str().unwrap_or("?"));
        }
    }
    out
}

/// Which batches `log dump` lists (all are verified).
#[derive(Debug, Clone, Copy)]
pub struct Select {
    /// List each batch's records.
    pub records: bool,
    /// With `records`: a preview of each value.
    pub values: bool,
    /// List batches that hold this offset or later ones.
    pub from_offset: u64,
    /// List at most this many batches in all.
    pub max_batches: usize,
}

impl Select {
    /// Summaries only: nothing listed.
    const NONE: Select = Select {
        records: false,
        values: false,
        from_offset: u64::MAX,
        max_batches: 0,
    };
}

/// Walks one segment file, verifying every batch and listing those `select` and `budget`
/// (batches still to list) allow.
pub fn walk(
    path: &Path,
    expected_base: Option<u64>,
    select: Select,
    budget: &mut usize,
) -> Result<SegmentReport, CliError> {
    let (records, values) = (select.records, select.values);
    let bytes =
        std::fs::read(path).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    let base = base_from_name(path);
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    if let (Some(b), Some(e)) = (base, expected_base) {
        if b != e {
            errors.push(format!(
                "segment base {b} does not follow the previous segment's end {e}"
            ));
        }
    }
    let mut batches = Vec::new();
    let mut batch_count = 0usize;
    let mut positions = Vec::new();
    let mut pos = 0usize;
    let mut next = base.or(expected_base);
    let mut data_end = 0usize;
    while pos + BATCH_HEADER_BYTES <= bytes.len() {
        // Zeros up to the next 4 KiB boundary with a batch there: a gap that a commit started
        // beside another left (the log's readers step over it too).
        let block_end = pos.next_multiple_of(BLOCK_BYTES as usize);
        if BatchView::parse(&bytes[pos..]).is_err()
            && block_end < bytes.len()
            && bytes[pos..block_end].iter().all(|b| *b == 0)
            && BatchView::parse(&bytes[block_end..]).is_ok()
        {
            pos = block_end;
            continue;
        }
        let head = &bytes[pos..pos + BATCH_HEADER_BYTES];
        if head.iter().all(|b| *b == 0) {
            break;
        }
        let view = match BatchView::parse(&bytes[pos..]) {
            Ok(v) => v,
            Err(e) => {
                errors.push(format!("batch at position {pos}: {e}"));
                break;
            }
        };
        let h = &view.header;
        if let Err(e) = view.validate_records() {
            errors.push(format!(
                "batch at position {pos} (offset {}): {e}",
                h.base_offset
            ));
        }
        if let Some(n) = next {
            if h.base_offset != n {
                errors.push(format!(
                    "batch at position {pos}: base offset {} where {n} was expected",
                    h.base_offset
                ));
            }
        }
        let listed = *budget > 0 && h.last_offset() >= select.from_offset;
        let mut b = json!({
            "position": pos,
            "base_offset": h.base_offset,
            "last_offset": h.last_offset(),
            "version": h.version,
            "term": h.term,
            "records": h.record_count,
            "size_bytes": h.batch_len,
            "first_timestamp_ms": h.first_timestamp_ms,
            "max_timestamp_ms": h.max_timestamp_ms,
            "control": h.is_control(),
            "checksum": format!("{:016x}", h.checksum),
        });
        if listed && records {
            let list: Vec<Value> = view
                .records()
                .map(|r| match r {
                    Ok(r) => {
                        let mut o = json!({
                            "offset": r.offset,
                            "timestamp_ms": r.timestamp_ms,
                            "key_bytes": r.key.map(<[u8]>::len),
                            "value_bytes": r.value.len(),
                        });
                        if values {
                            o["value"] = Value::String(preview(r.value));
                        }
                        o
                    }
                    Err(e) => json!({ "error": e.to_string() }),
                })
                .collect();
            b["record_list"] = Value::Array(list);
        }
        if listed {
            batches.push(b);
            *budget -= 1;
        }
        positions.push((pos, h.base_offset));
        batch_count += 1;
        next = Some(h.next_offset());
        pos += h.batch_len as usize;
        data_end = pos;
    }
    if errors.is_empty() {
        if let Some(i) = bytes[data_end..].iter().position(|b| *b != 0) {
            warnings.push(format!(
                "non-zero bytes at position {} after the last batch (a torn tail that recovery \
                 truncates, if this is the active segment)",
                data_end + i
            ));
        }
    }
    // The sparse index: every entry must point at a batch boundary with that offset.
    let index_path = path.with_extension("index");
    let mut index_entries = 0;
    if let (Ok(ix), Some(seg_base)) = (std::fs::read(&index_path), base) {
        let ix = OffsetIndex::parse(&ix);
        index_entries = ix.len();
        for i in 0..ix.len() {
            let e = ix.get(i);
            let want = seg_base + u64::from(e.rel_offset);
            if !positions
                .iter()
                .any(|(p, o)| *p == e.position as usize && *o == want)
            {
                warnings.push(format!(
                    "index entry {i} (offset {want} at position {}) points at no such batch \
                     (indexes are hints; the broker rebuilds a bad one)",
                    e.position
                ));
            }
        }
    }
    let json = json!({
        "segment": path.display().to_string(),
        "base_offset": base,
        "file_bytes": bytes.len(),
        "data_bytes": data_end,
        "batches": batch_count,
        "next_offset": next,
        "index_entries": index_entries,
        "batch_list": batches,
        "errors": errors,
        "warnings": warnings,
    });
    Ok(SegmentReport {
        json,
        errors,
        warnings,
        next_offset: next.unwrap_or(0),
    })
}

/// `log dump`: every segment's summary and the batches `select` asks for.
pub fn dump(path: &Path, select: Select) -> Result<(Value, bool), CliError> {
    let mut out = Vec::new();
    let mut corrupt = false;
    let mut budget = select.max_batches;
    for log in logs(path)? {
        let mut expected = None;
        for seg in log {
            let r = walk(&seg, expected, select, &mut budget)?;
            corrupt |= !r.errors.is_empty();
            expected = Some(r.next_offset);
            out.push(r.json);
        }
    }
    Ok((Value::Array(out), corrupt))
}

/// `log verify`: a summary per segment; `true` in the second place when anything is corrupt.
/// On a terminal, progress (segments and bytes done) goes to stderr.
pub fn verify(path: &Path) -> Result<(Value, bool), CliError> {
    use std::io::IsTerminal;
    let logs = logs(path)?;
    let total: usize = logs.iter().map(Vec::len).sum();
    let progress = std::io::stderr().is_terminal();
    let mut out = Vec::new();
    let mut corrupt = false;
    let mut done = 0;
    let mut bytes_done = 0u64;
    for log in logs {
        let mut expected = None;
        for seg in log {
            let r = walk(&seg, expected, Select::NONE, &mut 0)?;
            corrupt |= !r.errors.is_empty();
            expected = Some(r.next_offset);
            done += 1;
            bytes_done += r.json["data_bytes"].as_u64().unwrap_or(0);
            if progress {
                eprint!("\rverified {done}/{total} segments, {bytes_done} bytes of batches");
            }
            out.push(json!({
                "segment": r.json["segment"],
                "base_offset": r.json["base_offset"],
                "next_offset": r.json["next_offset"],
                "batches": r.json["batches"],
                "data_bytes": r.json["data_bytes"],
                "status": if r.errors.is_empty() { "ok" } else { "CORRUPT" },
                "problems": r.errors.iter().chain(&r.warnings).cloned().collect::<Vec<_>>().join("; "),
            }));
        }
    }
    if progress {
        eprintln!();
    }
    Ok((Value::Array(out), corrupt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::batch::Record;
    use sluice_wire::batch::{encode, set_base_offset};

    /// A commit started beside another writes from the next 4 KiB boundary; the zeros before it
    /// are a gap, not the end of the log, and not corruption.
    #[test]
    fn walk_steps_over_the_gap_before_a_block_boundary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000000.log");
        let first =
            encode(&[Record::new(1, vec![7; 1000]), Record::new(2, vec![8; 10])]).expect("batch");
        let mut second = encode(&[Record::new(3, vec![9; 100])]).expect("batch");
        set_base_offset(&mut second, 2);
        let mut file = first.clone();
        file.resize(BLOCK_BYTES as usize, 0);
        file.extend_from_slice(&second);
        file.resize(3 * BLOCK_BYTES as usize, 0);
        std::fs::write(&path, &file).expect("write");
        let select = Select {
            records: false,
            values: false,
            from_offset: 0,
            max_batches: 10,
        };
        let report = walk(&path, None, select, &mut 10).expect("walk");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.next_offset, 3);
        assert_eq!(report.json["batches"], 2);
        assert_eq!(report.json["data_bytes"], BLOCK_BYTES + second.len() as u64);
        let positions: Vec<u64> = report.json["batch_list"]
            .as_array()
            .expect("batches")
            .iter()
            .map(|b| b["position"].as_u64().expect("position"))
            .collect();
        assert_eq!(positions, [0, BLOCK_BYTES]);
    }
}
