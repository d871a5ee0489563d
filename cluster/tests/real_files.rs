//! A single-replica group on real files (glommio DMA): the hard-state file's tmp + fsync +
//! rename + directory sync works on O_DIRECT files, a proposal commits once flushed, and a
//! reopened replica restores its term, vote, disk id and log.

mod common;

use common::{log_config, on_glommio, proposal, raft_config, GROUP};
use sluice_cluster::{Create, Replica, ReplicaConfig, HARD_STATE_FILE};
use sluice_raft::{DiskId, Membership, Replica as Member};
use sluice_storage::fs::DmaFs;
use std::path::PathBuf;

async fn open(root: &std::path::Path, now_ms: u64) -> Replica<DmaFs> {
    let fs = DmaFs::new(root).await.expect("fs");
    let me = Member {
        node: 1,
        disk: DiskId(0xABCD),
    };
    let cfg = ReplicaConfig {
        node: 1,
        group: GROUP,
        raft: raft_config(),
        seed: 3,
    };
    let create = Create::Bootstrap(Membership::voters(&[me]));
    Replica::open(fs, root.join("p7"), log_config(), cfg, create, now_ms)
        .await
        .expect("open")
}

/// Drives a lone replica until `done` (virtual time, 10 ms a round).
async fn drive(r: &mut Replica<DmaFs>, now: &mut u64, done: impl Fn(&Replica<DmaFs>) -> bool) {
    for _ in 0..2_000 {
        if done(r) {
            return;
        }
        *now += 10;
        r.tick(*now);
        let mut out = Vec::new();
        r.handle_ready(&mut out).await.expect("ready");
        r.flush().await.expect("flush");
        r.handle_ready(&mut out).await.expect("ready");
        assert!(out.is_empty(), "a lone replica sends nothing");
    }
    panic!("not done within 20 s of virtual time");
}

#[test]
fn a_lone_replica_on_real_files_commits_and_restores_its_hard_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = tmp.path().to_path_buf();
    on_glommio(move || async move {
        let mut now = 0;
        let (hs, end) = {
            let mut r = open(&root, now).await;
            drive(&mut r, &mut now, |r| r.is_serving()).await;
            let mut t = r.propose(proposal(1, 3)).expect("propose");
            drive(&mut r, &mut now, |r| r.committed_end() > t.offset).await;
            let info = t.try_take().expect("resolved").expect("committed");
            assert_eq!((info.base_offset, info.last_offset), (1, 3));
            (r.hard_state(), r.log().end_offset())
        };
        assert!(root.join("p7").join(HARD_STATE_FILE).exists());
        let mut r = open(&root, now).await;
        assert_eq!(r.hard_state(), hs);
        assert_eq!(r.disk(), DiskId(0xABCD));
        assert_eq!(r.log().end_offset(), end);
        drive(&mut r, &mut now, |r| r.is_serving()).await;
        assert!(r.term() > hs.term);
        assert_eq!(
            r.log().last_term(),
            r.term(),
            "the new term's no-op is last"
        );
    });
}
