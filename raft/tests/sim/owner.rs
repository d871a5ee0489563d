//! The log owner's side of the simulation: acting on `Ready` (hard state, snapshot, truncation,
//! writes, catch-up reads, snapshots, applying commits, client acknowledgements).

use super::*;

impl Sim {
    pub(super) fn handle_ready(&mut self, i: usize, r: MultiReady) {
        let id = self.nodes[i].id;
        for (g, mut rd) in r.groups {
            if let Some(hs) = rd.hard_state {
                let d = self.nodes[i].disks.get_mut(&g).expect("disk");
                if hs.disk != d.id {
                    self.fail("core persisted a hard state naming another disk");
                }
                d.hard = Some(hs);
            }
            if let Some(s) = rd.snapshot.take() {
                self.install_snapshot(i, g, s);
            }
            if let Some(t) = rd.truncate_to {
                // Truncating an entry that is in the committed history is a safety violation.
                let h = &self.history[&g];
                let d = &self.nodes[i].disks[&g];
                if let Some(e) = d.entry_at(t) {
                    let k = h.partition_point(|x| x.end <= e.offset);
                    if h.get(k)
                        .is_some_and(|x| x.offset == e.offset && x.term == e.term)
                    {
                        self.dump(g);
                        self.fail(format!(
                            "node {id} group {g}: truncating committed entry at {} term {}",
                            e.offset, e.term
                        ));
                    }
                }
                self.nodes[i].disks.get_mut(&g).expect("disk").truncate(t);
            }
            let d = self.nodes[i].disks.get_mut(&g).expect("disk");
            for e in &rd.entries {
                if e.offset != d.end() {
                    let end = d.end();
                    self.fail(format!(
                        "node {id} group {g}: append at {} but disk ends at {end}",
                        e.offset
                    ));
                }
                d.write(e);
            }
            d.epoch = rd.log_epoch;
            let (epoch, end) = (d.epoch, d.end());
            let raft = self.nodes[i].raft.as_mut().expect("up");
            if !rd.entries.is_empty() {
                raft.on_appended(g, epoch, end).expect("group exists");
            }
            for f in rd.fetches.drain(..) {
                let entries = self.nodes[i].disks[&g].read(f.from, f.max_bytes);
                self.stats.fetches += 1;
                if entries.first().is_some_and(|e| e.data.len() > f.max_bytes) {
                    self.stats.oversized_reads += 1;
                }
                let raft = self.nodes[i].raft.as_mut().expect("up");
                raft.on_fetched(g, f.peer, f.from, entries)
                    .expect("group exists");
            }
            for peer in rd.snapshot_requests.drain(..) {
                let (meta, hash) = self.nodes[i].disks[&g]
                    .base
                    .clone()
                    .expect("a leader with a log start has a snapshot");
                let raft = self.nodes[i].raft.as_mut().expect("up");
                let want = raft.group(g).expect("group").snapshot_meta();
                if want != meta {
                    self.fail(format!(
                        "snapshot meta mismatch: core {want:?} disk {meta:?}"
                    ));
                }
                let s = Snapshot {
                    meta,
                    data: Bytes::copy_from_slice(&hash.to_le_bytes()),
                };
                raft.on_snapshot_built(g, peer, s).expect("group exists");
            }
            if let Some(c) = rd.commit {
                self.apply(i, g, c);
            }
            for p in &rd.committed {
                self.on_acked(g, p.offset, p.term, p.end);
            }
        }
        for m in r.messages {
            self.send(m);
        }
    }

    fn install_snapshot(&mut self, i: usize, g: GroupId, s: Snapshot) {
        let hash = u64::from_le_bytes(s.data[..8].try_into().expect("8-byte snapshot"));
        let off = s.meta.offset;
        let h = &self.history[&g];
        let at = h.partition_point(|e| e.end <= off);
        let expect = if off == 0 {
            0
        } else if at > 0 && h[at - 1].end == off {
            h[at - 1].chain
        } else {
            self.fail(format!("snapshot at {off} not at a committed boundary"));
        };
        if hash != expect {
            self.fail(format!("snapshot at {off} has the wrong state"));
        }
        self.nodes[i]
            .disks
            .get_mut(&g)
            .expect("disk")
            .install(s.meta, hash);
        self.nodes[i].applied.insert(g, (off, hash));
        self.stats.snapshots_installed += 1;
    }

    /// Applies committed entries on node `i`, checking them against (or extending) the history.
    fn apply(&mut self, i: usize, g: GroupId, commit: Offset) {
        let (mut at, mut chain) = self.nodes[i].applied[&g];
        while at < commit {
            let Some(e) = self.nodes[i].disks[&g].entry_at(at).cloned() else {
                self.fail(format!(
                    "node {} group {g}: commit {commit} but no entry at {at} on disk",
                    i + 1
                ));
            };
            if e.offset != at {
                self.fail("applied offset not at a batch boundary");
            }
            chain = hash_entry(chain, &e);
            let data_hash = xxh3_64(&e.data);
            let h = self.history.get_mut(&g).expect("group");
            let k = h.partition_point(|x| x.end <= at);
            if k < h.len() {
                let x = &h[k];
                if x.offset != e.offset
                    || x.term != e.term
                    || x.data_hash != data_hash
                    || x.chain != chain
                {
                    let x = x.clone();
                    self.fail(format!(
                        "node {} group {g}: committed entry at {at} differs: history {x:?}, node term {} end {}",
                        i + 1,
                        e.term,
                        e.end()
                    ));
                }
            } else {
                if e.kind == EntryKind::Config {
                    let m = Membership::decode(&e.data).expect("valid config");
                    self.committed_members.insert(g, m);
                }
                if std::env::var("SIM_TRACE").is_ok_and(|v| v == format!("{g}:{at}")) {
                    let gr = self.nodes[i].raft.as_ref().unwrap().group(g).unwrap();
                    eprintln!(
                        "TRACE t={} node {} {:?} term {} commit {} members {:?}",
                        self.now,
                        i + 1,
                        gr.role(),
                        gr.term(),
                        gr.commit(),
                        gr.membership().members
                    );
                    for (p, pr) in gr.progress() {
                        eprintln!("  progress {p}: {pr:?}");
                    }
                    for n in &self.nodes {
                        let d = &n.disks[&g];
                        eprintln!(
                            "  node {} end {} flushed_end {} entry {:?}",
                            n.id,
                            d.end(),
                            d.flushed_end(),
                            d.entry_at(at).map(|e| (e.offset, e.term))
                        );
                    }
                }
                let h = self.history.get_mut(&g).expect("group");
                h.push(HEntry {
                    offset: e.offset,
                    end: e.end(),
                    term: e.term,
                    data_hash,
                    chain,
                });
                self.stats.committed_offsets = e.end();
            }
            at = e.end();
        }
        self.nodes[i].applied.insert(g, (at, chain));
    }

    /// A client is told its proposal committed: it must be in the history, and flushed on a
    /// majority of the voters.
    fn on_acked(&mut self, g: GroupId, offset: Offset, term: Term, end: Offset) {
        self.stats.acked += 1;
        let h = &self.history[&g];
        let k = h.partition_point(|x| x.end <= offset);
        if !h
            .get(k)
            .is_some_and(|x| x.offset == offset && x.term == term)
        {
            self.fail(format!(
                "acked proposal at {offset} term {term} not committed"
            ));
        }
        let x = h[k].clone();
        let ms = self.candidate_memberships(g);
        if self.check_flushed_on_ack && !ms.iter().any(|m| self.holders_ok(g, m, &x, true)) {
            self.dump(g);
            self.fail(format!(
                "acked proposal at {offset} term {term} (end {end}) not flushed on a majority of voters"
            ));
        }
        self.acked.push((g, offset, term));
    }
}
