//! Power loss under the embedded S3 server: its data dir on faultfs (a FUSE file system that
//! forgets whatever was not fsynced), objects acknowledged, the power cut, the server restarted
//! on what a real disk would hold. Every acknowledged write must be there, whole; every
//! acknowledged delete must stay done; the keys must be the same. Random sizes and operations
//! take `SLUICE_SEED`. Skips, saying why, where `/dev/fuse` is missing.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_faultfs::{Limits, Mounted};
use sluice_tier::{start_embedded, RemoteConfig};

fn loopback0() -> SocketAddr {
    "127.0.0.1:0".parse().expect("a valid address")
}

#[test]
fn acknowledged_writes_and_deletes_survive_a_power_loss() {
    if !sluice_faultfs::fuse_available() {
        eprintln!("skipped: /dev/fuse is missing, faultfs cannot mount here");
        return;
    }
    let seed: u64 = match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a u64"),
        Err(_) => rand::random(),
    };
    struct SeedGuard(u64);
    impl Drop for SeedGuard {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("failed with SLUICE_SEED={}", self.0);
            }
        }
    }
    let _g = SeedGuard(seed);
    let mut rng = SmallRng::seed_from_u64(seed);

    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    let fs = Mounted::mount(&dir.path().join("backing"), &mnt, Limits::default()).expect("mount");
    // The data dir itself is the operator's: created and made durable before the server starts.
    let data = mnt.join("data");
    std::fs::create_dir(&data).expect("data dir");
    std::fs::File::open(&mnt)
        .and_then(|d| d.sync_all())
        .expect("fsync mount root");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // What the store must hold after the power loss: key -> body (None: deleted).
    let mut expected: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
    const ROUNDS: usize = 3;
    const OPS_PER_ROUND: usize = 25;
    let mut creds = None;
    for round in 0..=ROUNDS {
        let server = start_embedded(&data, loopback0()).expect("server");
        if let Some(c) = &creds {
            assert_eq!(
                &server.credentials.secret_key, c,
                "the keys changed across a power loss"
            );
        }
        creds = Some(server.credentials.secret_key.clone());
        let mut cfg = RemoteConfig::for_embedded(&server);
        cfg.attempt_timeout_ms = 10_000;
        let client = cfg.build_client().expect("client");
        // Check everything acknowledged before the last power loss.
        for (key, body) in &expected {
            let got = rt.block_on(async {
                client
                    .get(&ObjPath::from(key.as_str()))
                    .await?
                    .bytes()
                    .await
            });
            match (body, got) {
                (Some(b), Ok(g)) => assert_eq!(&g[..], &b[..], "round {round}: {key} differs"),
                (None, Err(object_store::Error::NotFound { .. })) => {}
                (b, g) => panic!(
                    "round {round}: {key}: want {:?} bytes, got {:?}",
                    b.as_ref().map(Vec::len),
                    g.map(|x| x.len())
                ),
            }
        }
        let listed: Vec<String> = rt
            .block_on(
                client
                    .list(None)
                    .map_ok(|m| m.location.to_string())
                    .try_collect(),
            )
            .expect("list");
        let want: Vec<String> = expected
            .iter()
            .filter(|(_, b)| b.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(listed, want, "round {round}: the listing");
        if round == ROUNDS {
            break;
        }
        for _ in 0..OPS_PER_ROUND {
            let key = format!("p/{}/k{}", rng.gen_range(0..3), rng.gen_range(0..12));
            if rng.gen_range(0..4) == 0 {
                rt.block_on(client.delete(&ObjPath::from(key.as_str())))
                    .expect("delete");
                expected.insert(key, None);
            } else {
                let len = rng.gen_range(0..40_000);
                let body: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                rt.block_on(client.put(&ObjPath::from(key.as_str()), body.clone().into()))
                    .expect("put");
                expected.insert(key, Some(body));
            }
        }
        fs.power_off().expect("power off");
        server.shutdown();
        fs.power_on();
    }
    drop(rt);
    fs.unmount();
}
