//! The embedded S3 server, driven over real sockets by object_store (the client Sluice uses):
//! authentication, durability across restarts, conditional-write races, multipart abort and
//! sweep, listings, and that DELETE leaves nothing behind.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::{GetRange, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use sluice_tier::embedded::CREDENTIALS_FILE;
use sluice_tier::{start_embedded, RemoteConfig};

fn loopback0() -> SocketAddr {
    "127.0.0.1:0".parse().expect("a valid address")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a test runtime")
}

fn client(server: &sluice_tier::EmbeddedHandle) -> object_store::aws::AmazonS3 {
    let mut config = RemoteConfig::for_embedded(server);
    config.attempt_timeout_ms = 10_000;
    config.build_client().expect("a client")
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push(p.clone()); // directories count as leftovers too
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn requests_without_the_generated_keys_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let mode = std::fs::metadata(dir.path().join(CREDENTIALS_FILE))
        .expect("credentials file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "credentials must be owner-only");

    let rt = runtime();
    let path = ObjPath::from("k");
    // Signed with a wrong secret.
    let mut bad = RemoteConfig::for_embedded(&server);
    bad.secret_key = "not-the-secret".into();
    let bad = bad.build_client().expect("client");
    let err = rt
        .block_on(bad.put(&path, PutPayload::from_static(b"x")))
        .expect_err("a wrong secret must be refused");
    assert!(
        matches!(
            err,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        ),
        "{err:?}"
    );
    // Not signed at all: a raw HTTP request.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(server.addr).expect("connect");
    s.write_all(b"PUT /sluice/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx")
        .expect("write");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 403"),
        "anonymous PUT answered: {answer}"
    );
    // Nothing was stored by either.
    let good = client(&server);
    assert!(matches!(
        rt.block_on(good.head(&path)),
        Err(object_store::Error::NotFound { .. })
    ));
    // The right keys work.
    rt.block_on(good.put(&path, PutPayload::from_static(b"x")))
        .expect("signed put");
}

#[test]
fn acknowledged_objects_and_keys_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let creds = server.credentials.clone();
    let c = client(&server);
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    rt.block_on(c.put(&ObjPath::from("a/b/c"), body.clone().into()))
        .expect("put");
    server.shutdown();

    let server = start_embedded(dir.path(), loopback0()).expect("restart");
    assert_eq!(server.credentials.access_key, creds.access_key);
    assert_eq!(server.credentials.secret_key, creds.secret_key);
    let c = client(&server);
    let got = rt
        .block_on(async { c.get(&ObjPath::from("a/b/c")).await?.bytes().await })
        .expect("get");
    assert_eq!(&got[..], &body[..]);
    let r = rt
        .block_on(c.get_range(&ObjPath::from("a/b/c"), 1000..1010))
        .expect("range");
    assert_eq!(&r[..], &body[1000..1010]);
    let suffix = rt
        .block_on(async {
            c.get_opts(
                &ObjPath::from("a/b/c"),
                object_store::GetOptions {
                    range: Some(GetRange::Suffix(7)),
                    ..Default::default()
                },
            )
            .await?
            .bytes()
            .await
        })
        .expect("suffix range");
    assert_eq!(&suffix[..], &body[body.len() - 7..]);
}

#[test]
fn delete_leaves_no_files_or_directories_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let c = client(&server);
    for k in ["x/y/z1", "x/y/z2", "x/w", "top"] {
        rt.block_on(c.put(&ObjPath::from(k), PutPayload::from_static(b"data")))
            .expect("put");
    }
    for k in ["x/y/z1", "x/y/z2", "x/w", "top"] {
        rt.block_on(c.delete(&ObjPath::from(k))).expect("delete");
    }
    let bucket = dir.path().join("s3/buckets/sluice");
    assert_eq!(files_under(&bucket), Vec::<std::path::PathBuf>::new());
    assert_eq!(
        files_under(&dir.path().join("s3/tmp")),
        Vec::<std::path::PathBuf>::new()
    );
    // Deleting what is not there is fine (S3 semantics).
    rt.block_on(c.delete(&ObjPath::from("never")))
        .expect("delete missing");
}

#[test]
fn listings_are_in_key_order_and_cover_every_key_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let c = client(&server);
    // Keys whose file-system layout differs from their S3 order: "a" is a file and "a/…" a
    // directory; '-' (0x2D) sorts before '/' (0x2F) before '0' (0x30).
    let mut keys = vec!["a", "a/b", "a-b", "a0", "a/b/c", "b.x", "p/q=2F", "p/q"];
    for k in &keys {
        rt.block_on(c.put(&ObjPath::from(*k), PutPayload::from_static(b"v")))
            .expect("put");
    }
    keys.sort();
    let listed: Vec<String> = rt
        .block_on(async {
            use futures::TryStreamExt;
            c.list(None)
                .map_ok(|m| m.location.to_string())
                .try_collect()
                .await
        })
        .expect("list");
    assert_eq!(listed, keys);
    let under_a: Vec<String> = rt
        .block_on(async {
            use futures::TryStreamExt;
            c.list(Some(&ObjPath::from("a")))
                .map_ok(|m| m.location.to_string())
                .try_collect()
                .await
        })
        .expect("list a/");
    assert_eq!(under_a, vec!["a/b", "a/b/c"]);
    let after: Vec<String> = rt
        .block_on(async {
            use futures::TryStreamExt;
            c.list_with_offset(None, &ObjPath::from("a/b"))
                .map_ok(|m| m.location.to_string())
                .try_collect()
                .await
        })
        .expect("list after");
    let want: Vec<String> = keys
        .iter()
        .filter(|k| **k > "a/b")
        .map(|k| k.to_string())
        .collect();
    assert_eq!(after, want);
}

/// Two writers race on the same key with `If-None-Match: *`, then with `If-Match: <etag>`:
/// each round exactly one wins, and the stored object is the winner's.
#[test]
fn conditional_writes_race_and_exactly_one_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let c = Arc::new(client(&server));
    const ROUNDS: usize = 8;
    // Large enough that both bodies are in flight at once.
    const BODY_BYTES: usize = 512 * 1024;
    for round in 0..ROUNDS {
        let path = ObjPath::from(format!("race/{round}"));
        let bodies: Vec<Bytes> = (0..2u8)
            .map(|w| Bytes::from(vec![w + 1; BODY_BYTES]))
            .collect();
        let results = rt.block_on(async {
            let tasks: Vec<_> = bodies
                .iter()
                .map(|b| {
                    let c = c.clone();
                    let path = path.clone();
                    let b = b.clone();
                    tokio::spawn(async move {
                        c.put_opts(&path, b.into(), PutOptions::from(PutMode::Create))
                            .await
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("task"));
            }
            out
        });
        let winners: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for r in &results {
            if let Err(e) = r {
                assert!(
                    matches!(e, object_store::Error::AlreadyExists { .. }),
                    "{e:?}"
                );
            }
        }
        let stored = rt
            .block_on(async { c.get(&path).await?.bytes().await })
            .expect("get");
        assert_eq!(stored, bodies[winners[0]]);

        // Compare-and-swap on the current ETag.
        let etag = rt.block_on(c.head(&path)).expect("head").e_tag;
        let results = rt.block_on(async {
            let tasks: Vec<_> = (0..2u8)
                .map(|w| {
                    let c = c.clone();
                    let path = path.clone();
                    let mode = PutMode::Update(UpdateVersion {
                        e_tag: etag.clone(),
                        version: None,
                    });
                    tokio::spawn(async move {
                        c.put_opts(
                            &path,
                            Bytes::from(vec![w + 10; BODY_BYTES]).into(),
                            mode.into(),
                        )
                        .await
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("task"));
            }
            out
        });
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "round {round} (If-Match): {results:?}"
        );
    }
}

#[test]
fn multipart_abort_and_the_age_sweep_remove_every_part() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let c = client(&server);
    let path = ObjPath::from("mp/one");
    let id = rt.block_on(c.create_multipart(&path)).expect("create");
    rt.block_on(c.put_part(&path, &id, 0, PutPayload::from_static(b"part one")))
        .expect("part");
    assert_eq!(server.upload_count().expect("count"), 1);
    rt.block_on(c.abort_multipart(&path, &id)).expect("abort");
    assert_eq!(server.upload_count().expect("count"), 0);
    assert!(matches!(
        rt.block_on(c.head(&path)),
        Err(object_store::Error::NotFound { .. })
    ));

    // Abandoned (neither completed nor aborted): the sweep removes it once old enough.
    let id2 = rt.block_on(c.create_multipart(&path)).expect("create");
    rt.block_on(c.put_part(&path, &id2, 0, PutPayload::from_static(b"part")))
        .expect("part");
    assert_eq!(
        server
            .sweep_uploads(Duration::from_secs(3600))
            .expect("sweep"),
        0
    );
    assert_eq!(server.sweep_uploads(Duration::ZERO).expect("sweep"), 1);
    assert_eq!(server.upload_count().expect("count"), 0);
    assert!(files_under(&dir.path().join("s3/uploads")).is_empty());
    // Completing a swept upload fails; nothing becomes visible.
    let done = rt.block_on(c.complete_multipart(&path, &id2, vec![]));
    assert!(done.is_err());
    assert!(matches!(
        rt.block_on(c.head(&path)),
        Err(object_store::Error::NotFound { .. })
    ));
}

#[test]
fn a_completed_multipart_upload_reads_back_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let c = client(&server);
    let path = ObjPath::from("mp/whole");
    let id = rt.block_on(c.create_multipart(&path)).expect("create");
    let chunks: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i; 70_000])).collect();
    let mut parts = Vec::new();
    for (i, ch) in chunks.iter().enumerate() {
        parts.push(
            rt.block_on(c.put_part(&path, &id, i, ch.clone().into()))
                .expect("part"),
        );
    }
    // Not visible before Complete.
    assert!(matches!(
        rt.block_on(c.head(&path)),
        Err(object_store::Error::NotFound { .. })
    ));
    rt.block_on(c.complete_multipart(&path, &id, parts))
        .expect("complete");
    let got = rt
        .block_on(async { c.get(&path).await?.bytes().await })
        .expect("get");
    assert_eq!(got, chunks.concat());
    assert_eq!(server.upload_count().expect("count"), 0);
}

#[test]
fn a_non_loopback_address_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let any: SocketAddr = "0.0.0.0:0".parse().expect("address");
    assert!(matches!(
        start_embedded(dir.path(), any),
        Err(sluice_tier::embedded::EmbeddedError::NotLoopback(_))
    ));
}
