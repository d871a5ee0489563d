//! Invariants checked after every step, the heavier ones every so often, and the end-of-run
//! liveness check.

use super::*;

impl Sim {
    // ---- Invariants -------------------------------------------------------------------------

    pub fn check_invariants(&mut self) {
        for i in 0..self.nodes.len() {
            let Some(raft) = self.nodes[i].raft.as_ref() else {
                continue;
            };
            let id = self.nodes[i].id;
            let mut failures = Vec::new();
            let mut new_leaders = Vec::new();
            for g in raft.groups() {
                if g.role() == RaftRole::Leader {
                    match self.leaders.get(&(g.id(), g.term())) {
                        Some(&l) if l != id => failures.push(format!(
                            "two leaders in group {} term {}: {l} and {id}",
                            g.id(),
                            g.term()
                        )),
                        Some(_) => {}
                        None => new_leaders.push((g.id(), g.term())),
                    }
                }
                let last = self.nodes[i].last_commit[&g.id()];
                if g.commit() < last {
                    failures.push(format!(
                        "node {id} group {}: commit went back {last} -> {}",
                        g.id(),
                        g.commit()
                    ));
                }
                if g.commit() > g.log_end() {
                    failures.push(format!("node {id} group {}: commit past log end", g.id()));
                }
            }
            if let Some(f) = failures.first() {
                self.fail(f);
            }
            for k in new_leaders {
                self.stats.leaders_elected += 1;
                self.leaders.insert(k, id);
            }
            let commits: Vec<(GroupId, Offset)> = self.nodes[i]
                .raft
                .as_ref()
                .expect("up")
                .groups()
                .map(|g| (g.id(), g.commit()))
                .collect();
            for (g, c) in commits {
                self.nodes[i].last_commit.insert(g, c);
            }
        }
    }

    /// Log matching: any two disks holding an entry with the same offset and term hold the same
    /// entries below it. Costs O(log length) per pair; run it every so often and at the end.
    pub fn check_log_matching(&self) {
        for &g in &self.groups {
            let maps: Vec<BTreeMap<Offset, (Term, Offset, u64)>> = self
                .nodes
                .iter()
                .map(|n| {
                    n.disks[&g]
                        .entries()
                        .map(|e| (e.offset, (e.term, e.end(), xxh3_64(&e.data))))
                        .collect()
                })
                .collect();
            for a in 0..maps.len() {
                for b in a + 1..maps.len() {
                    let mut matched_below: Option<Offset> = None;
                    for (o, x) in maps[a].iter().rev() {
                        if maps[b].get(o).is_some_and(|y| y.0 == x.0) {
                            matched_below = Some(*o);
                            break;
                        }
                    }
                    let Some(top) = matched_below else { continue };
                    for (o, x) in maps[a].range(..=top) {
                        if let Some(y) = maps[b].get(o) {
                            if x != y {
                                self.fail(format!(
                                    "log matching broken in group {g}: nodes {} and {} agree at {top} but differ at {o}",
                                    a + 1,
                                    b + 1
                                ));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every committed entry is still held by a majority of its group's voters (flushed, or
    /// under a snapshot), and every acknowledged proposal is in the history.
    pub fn check_durability(&self) {
        for &g in &self.groups {
            // An entry commits on a majority of the leader's active membership, which may be one
            // appended after the committed one and later truncated away. What Raft guarantees
            // is that every quorum of the committed membership (one change away from it)
            // intersects the holders, so no replica lacking the entry can be elected.
            let ms = vec![self.committed_members[&g].clone()];
            for x in &self.history[&g] {
                let ok = ms.iter().all(|m| self.holders_ok(g, m, x, false));
                if !ok {
                    for m in &ms {
                        eprintln!("membership {:?}", m.members);
                    }
                    for n in &self.nodes {
                        let d = &n.disks[&g];
                        eprintln!(
                            "node {} disk {:?} start {} end {} flushed_end {} entry {:?}",
                            n.id,
                            d.id,
                            d.start(),
                            d.end(),
                            d.flushed_end(),
                            d.entry_at(x.offset).map(|e| (e.offset, e.term, e.end()))
                        );
                    }
                    eprintln!("history entry {x:?}");
                    self.dump(g);
                    self.fail(format!(
                        "group {g}: committed entry at {} missing from a possible quorum",
                        x.offset
                    ));
                }
            }
        }
        for &(g, o, t) in &self.acked {
            let h = &self.history[&g];
            let k = h.partition_point(|x| x.end <= o);
            if !h.get(k).is_some_and(|x| x.offset == o && x.term == t) {
                self.fail(format!("acked entry at {o} term {t} lost from history"));
            }
        }
    }

    /// Memberships a leader may have counted a commit with: the last committed one, and the last
    /// two on every replica's disk (up or down). A change takes effect when appended, so a
    /// commit decided just before a leader appended a change was counted with the one before.
    pub(super) fn candidate_memberships(&self, g: GroupId) -> Vec<Membership> {
        let mut ms = vec![self.committed_members[&g].clone()];
        for n in &self.nodes {
            let d = &n.disks[&g];
            let configs: Vec<Membership> = d
                .base
                .as_ref()
                .map(|(m, _)| m.membership.clone())
                .into_iter()
                .chain(
                    d.entries()
                        .filter(|e| e.kind == EntryKind::Config)
                        .map(|e| Membership::decode(&e.data).expect("valid config")),
                )
                .collect();
            ms.extend(configs.into_iter().rev().take(2));
        }
        ms
    }

    /// Whether enough of `m`'s voters hold `x` flushed: a majority (`majority`, what a leader
    /// counts), or enough that every quorum of `m` contains a holder (what keeps it from being
    /// lost). A voter whose disk was lost is a failed replica that can neither hold nor vote:
    /// the counts are taken over the others (and at least one holder is always required).
    pub(super) fn holders_ok(
        &self,
        g: GroupId,
        m: &Membership,
        x: &HEntry,
        majority: bool,
    ) -> bool {
        let voters: Vec<Replica> = m
            .members
            .iter()
            .filter(|(_, r)| *r == Role::Voter)
            .map(|(r, _)| *r)
            .collect();
        let lost = voters
            .iter()
            .filter(|r| self.nodes[self.idx(r.node)].disks[&g].id != r.disk)
            .count();
        let quorum = voters.len() / 2 + 1;
        let need = if majority {
            quorum.saturating_sub(lost)
        } else {
            (voters.len() - lost).saturating_sub(quorum) + 1
        }
        .max(1);
        let holders = voters
            .iter()
            .filter(|r| {
                let d = &self.nodes[self.idx(r.node)].disks[&g];
                d.id == r.disk && d.holds_flushed(x.offset, x.term, x.end)
            })
            .count();
        holders >= need
    }

    /// The membership in the committed history (from the most advanced live replica).
    fn known_membership(&self, g: GroupId) -> Option<Membership> {
        let committed = self.history[&g].last().map_or(0, |x| x.end);
        self.nodes
            .iter()
            .filter_map(|n| n.raft.as_ref()?.group(g))
            .filter(|gr| gr.log_end() >= committed)
            .max_by_key(|gr| (gr.commit(), gr.term()))
            .map(|gr| gr.membership().clone())
    }

    // ---- End of run -------------------------------------------------------------------------

    /// Heals every fault, restarts every node, and requires every group to elect a serving
    /// leader and commit a fresh proposal on all its members within `max_ms`.
    pub fn settle_and_check_liveness(&mut self, max_ms: u64) {
        self.heal();
        self.faults = Faults {
            flush: 0.5,
            ..Faults::none()
        };
        for n in &mut self.nodes {
            n.paused_until = 0;
        }
        for i in 0..self.nodes.len() {
            self.restart(i);
        }
        let groups = self.groups.clone();
        for g in groups {
            let ok = self.run_until(max_ms, |s| s.leader_of(g).is_some());
            if !ok {
                self.dump(g);
                self.fail(format!(
                    "liveness: group {g} has no serving leader after healing"
                ));
            }
            // A proposal can be lost with its leader (never acknowledged): re-propose until one
            // is acknowledged.
            let acked_before = self.acked.iter().filter(|a| a.0 == g).count();
            let deadline = self.now + max_ms;
            let mut next_try = self.now;
            loop {
                if self.acked.iter().filter(|a| a.0 == g).count() > acked_before {
                    break;
                }
                if self.now >= deadline {
                    self.dump(g);
                    self.fail(format!("liveness: group {g} did not commit after healing"));
                }
                if self.now >= next_try {
                    self.propose_to(g);
                    next_try = self.now + 500;
                }
                self.step();
            }
        }
        self.check_log_matching();
        self.check_durability();
    }

    pub fn dump(&self, g: GroupId) {
        for n in &self.nodes {
            match n.raft.as_ref().and_then(|r| r.group(g)) {
                Some(gr) => eprintln!(
                    "node {} g{g}: {:?} term {} leader {:?} commit {} log [{}, {}) last_term {} voter {} members {:?} disk {:?} paused_until {}",
                    n.id,
                    gr.role(),
                    gr.term(),
                    gr.leader(),
                    gr.commit(),
                    gr.log_start(),
                    gr.log_end(),
                    gr.last_term(),
                    gr.is_voter(),
                    gr.membership().members,
                    n.disks[&g].id,
                    n.paused_until
                ),
                None => eprintln!("node {} down", n.id),
            }
        }
    }

    pub fn summary(&self) -> String {
        format!("seed {} {:?}", self.seed, self.stats)
    }
}
