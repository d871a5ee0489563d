//! The embedded S3 server's file-system backend.
//!
//! Layout under the data dir (`root`):
//!
//! | path                               | what                                               |
//! |------------------------------------|----------------------------------------------------|
//! | `buckets/<bucket>/<seg>/…/<seg>@o` | one object: a [`HEADER_LEN_BYTES`] header, then the body |
//! | `uploads/<upload id>/meta`         | a multipart upload's bucket and key                |
//! | `uploads/<upload id>/<n>`          | its part `n` (same header + body)                  |
//! | `tmp/`                             | files being written; renamed into place when durable |
//!
//! A key's `/`-separated segments become directories, each escaped (bytes outside
//! `[A-Za-z0-9._-]` as `%XX`); the object file is the last segment plus `@o`. `@` is always
//! escaped, so the key `a` (file `a@o`) and the key `a/b` (directory `a`) never collide.
//! Listing walks that tree in S3 key order: within one directory a child directory sorts as its
//! decoded name plus `/`, which is exactly where its keys fall among its siblings.
//!
//! The object's ETag lives in its own header, written in the same file and renamed with it,
//! so an ETag can never describe other bytes (no side file, nothing to leave behind on DELETE).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use xxhash_rust::xxh3::Xxh3;

/// Magic at the start of every stored object and part file.
const MAGIC: &[u8; 8] = b"SLTIER01";
/// The ETag is the 128-bit xxh3 of the body, as 32 hex digits.
const ETAG_LEN_BYTES: usize = 32;
/// Header: magic, then the ETag.
pub const HEADER_LEN_BYTES: u64 = (MAGIC.len() + ETAG_LEN_BYTES) as u64;
/// Chunk size when streaming a body out of a file.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Suffix of an object file: `@` is always escaped in segments, so it cannot clash with a
/// directory.
const OBJECT_SUFFIX: &str = "@o";
/// Longest key accepted (S3's own limit).
pub const KEY_LEN_BYTES_MAX: usize = 1024;
/// Stripes of the per-key write lock: writes to one key are serialised; two keys that share a
/// stripe wait for each other too (harmless, and bounded memory).
const KEY_LOCK_STRIPES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such object")]
    NoSuchKey,
    #[error("no such bucket")]
    NoSuchBucket,
    #[error("no such multipart upload")]
    NoSuchUpload,
    #[error("precondition failed")]
    PreconditionFailed,
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
    #[error("invalid part list: {0}")]
    InvalidPart(&'static str),
    #[error("stored file is corrupt: {0}")]
    Corrupt(PathBuf),
    #[error("request body: {0}")]
    Body(String),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

/// What a write requires of the current object, checked under the key's lock.
#[derive(Debug, Clone, Default)]
pub struct Condition {
    /// `If-Match`: `Some(None)` is `*` (must exist), `Some(Some(etag))` must equal.
    pub if_match: Option<Option<String>>,
    /// `If-None-Match`: `Some(None)` is `*` (must not exist), `Some(Some(etag))` must differ.
    pub if_none_match: Option<Option<String>>,
}

#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub key: String,
    pub size_bytes: u64,
    pub etag: String,
    pub modified: SystemTime,
}

pub struct FsStore {
    root: PathBuf,
    key_locks: Vec<tokio::sync::Mutex<()>>,
}

impl FsStore {
    pub fn open(root: &Path) -> Result<Self, FsError> {
        // Each directory's entry must be durable in its parent, or a power loss takes the
        // whole subtree (and every acknowledged object in it) with it.
        create_dir_durable_blocking(root)?;
        for sub in ["buckets", "uploads", "tmp"] {
            create_dir_durable_blocking(&root.join(sub))?;
        }
        // Anything in tmp/ is a write that never reached its rename: not visible, never acked.
        for entry in std::fs::read_dir(root.join("tmp"))? {
            let _ = std::fs::remove_file(entry?.path());
        }
        sync_dir_blocking(&root.join("tmp"))?;
        Ok(Self {
            root: root.to_path_buf(),
            key_locks: (0..KEY_LOCK_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        })
    }

    fn lock_for(&self, bucket: &str, key: &str) -> &tokio::sync::Mutex<()> {
        let h = xxhash_rust::xxh3::xxh3_64(format!("{bucket}\0{key}").as_bytes());
        &self.key_locks[(h % KEY_LOCK_STRIPES as u64) as usize]
    }

    fn bucket_dir(&self, bucket: &str) -> Result<PathBuf, FsError> {
        if bucket.is_empty() || bucket.contains('/') || bucket.starts_with('.') {
            return Err(FsError::NoSuchBucket);
        }
        Ok(self.root.join("buckets").join(bucket))
    }

    pub async fn create_bucket(&self, bucket: &str) -> Result<(), FsError> {
        let dir = self.bucket_dir(bucket)?;
        tokio::fs::create_dir_all(&dir).await?;
        sync_dir(&self.root.join("buckets")).await?;
        Ok(())
    }

    pub async fn bucket_exists(&self, bucket: &str) -> Result<bool, FsError> {
        Ok(tokio::fs::metadata(self.bucket_dir(bucket)?).await.is_ok())
    }

    async fn existing_bucket(&self, bucket: &str) -> Result<PathBuf, FsError> {
        let dir = self.bucket_dir(bucket)?;
        if tokio::fs::metadata(&dir).await.is_err() {
            return Err(FsError::NoSuchBucket);
        }
        Ok(dir)
    }

    fn object_path(bucket_dir: &Path, key: &str) -> Result<PathBuf, FsError> {
        validate_key(key)?;
        let mut path = bucket_dir.to_path_buf();
        let mut segs = key.split('/').peekable();
        while let Some(seg) = segs.next() {
            let escaped = escape_segment(seg);
            if segs.peek().is_some() {
                path.push(escaped);
            } else {
                path.push(format!("{escaped}{OBJECT_SUFFIX}"));
            }
        }
        Ok(path)
    }

    fn new_tmp_path(&self) -> PathBuf {
        self.root
            .join("tmp")
            .join(format!("{:032x}", rand::random::<u128>()))
    }

    /// Streams `body` into a durable temporary file (header + body, fsynced) and returns it with
    /// its ETag. The caller renames it into place under the key's lock.
    async fn write_tmp<S, E>(&self, body: S) -> Result<(PathBuf, String, u64), FsError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let path = self.new_tmp_path();
        let result = async {
            let mut file = tokio::fs::File::create(&path).await?;
            // Placeholder header; the ETag is only known at the end.
            file.write_all(&[0u8; HEADER_LEN_BYTES as usize]).await?;
            let mut hasher = Xxh3::new();
            let mut size = 0u64;
            let mut body = body;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| FsError::Body(e.to_string()))?;
                hasher.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).await?;
            }
            let etag = format!("{:032x}", hasher.digest128());
            file.seek(io::SeekFrom::Start(0)).await?;
            file.write_all(MAGIC).await?;
            file.write_all(etag.as_bytes()).await?;
            file.flush().await?;
            // Durable before it can become visible: the rename below publishes only fsynced bytes.
            file.sync_all().await?;
            Ok::<_, FsError>((etag, size))
        }
        .await;
        match result {
            Ok((etag, size)) => Ok((path, etag, size)),
            Err(e) => {
                let _ = tokio::fs::remove_file(&path).await;
                Err(e)
            }
        }
    }

    /// Puts an object: durable (file and directories fsynced) before it returns Ok.
    pub async fn put<S, E>(
        &self,
        bucket: &str,
        key: &str,
        body: S,
        cond: &Condition,
    ) -> Result<ObjectInfo, FsError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let bucket_dir = self.existing_bucket(bucket).await?;
        let dest = Self::object_path(&bucket_dir, key)?;
        let (tmp, etag, size) = self.write_tmp(body).await?;
        let published = self
            .publish(&bucket_dir, bucket, key, &dest, &tmp, cond)
            .await;
        if published.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        published?;
        Ok(ObjectInfo {
            key: key.to_string(),
            size_bytes: size,
            etag,
            modified: SystemTime::now(),
        })
    }

    /// Checks the condition and renames `tmp` over `dest`, both under the key's lock: two
    /// conditional writers cannot both pass the check.
    async fn publish(
        &self,
        bucket_dir: &Path,
        bucket: &str,
        key: &str,
        dest: &Path,
        tmp: &Path,
        cond: &Condition,
    ) -> Result<(), FsError> {
        let _guard = self.lock_for(bucket, key).lock().await;
        let current = read_etag(dest).await?;
        check_condition(cond, current.as_deref())?;
        let parent = dest.parent().expect("an object path has a parent");
        // A concurrent DELETE of a sibling may remove an emptied parent between these steps;
        // retry the mkdir once then.
        for attempt in 0..2 {
            create_dirs_durable(bucket_dir, parent).await?;
            match tokio::fs::rename(tmp, dest).await {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempt == 0 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // The rename is durable only once the directory holding the new entry is.
        sync_dir(parent).await?;
        sync_dir(&self.root.join("tmp")).await?;
        Ok(())
    }

    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectInfo, FsError> {
        let bucket_dir = self.existing_bucket(bucket).await?;
        let path = Self::object_path(&bucket_dir, key)?;
        let mut file = open_object(&path).await?;
        let etag = read_header(&mut file, &path).await?;
        let meta = file.metadata().await?;
        Ok(ObjectInfo {
            key: key.to_string(),
            size_bytes: meta.len().saturating_sub(HEADER_LEN_BYTES),
            etag,
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        })
    }

    /// Opens an object for reading `range` (start, end exclusive, already checked against the
    /// size by the caller). The open file stays valid even if the key is overwritten meanwhile.
    pub async fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<(ObjectInfo, tokio::fs::File), FsError> {
        let bucket_dir = self.existing_bucket(bucket).await?;
        let path = Self::object_path(&bucket_dir, key)?;
        let mut file = open_object(&path).await?;
        let etag = read_header(&mut file, &path).await?;
        let meta = file.metadata().await?;
        Ok((
            ObjectInfo {
                key: key.to_string(),
                size_bytes: meta.len().saturating_sub(HEADER_LEN_BYTES),
                etag,
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            },
            file,
        ))
    }

    /// Deletes an object and any directories it leaves empty; durable before Ok. Deleting a
    /// missing key succeeds (S3 semantics).
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), FsError> {
        let bucket_dir = self.existing_bucket(bucket).await?;
        let path = Self::object_path(&bucket_dir, key)?;
        let _guard = self.lock_for(bucket, key).lock().await;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mut dir = path.parent().map(Path::to_path_buf);
        let mut last_removed_parent = path.parent().map(Path::to_path_buf);
        // Remove directories the delete emptied, up to the bucket (rmdir fails on a non-empty
        // one, which ends the walk).
        while let Some(d) = dir {
            if d == bucket_dir || !d.starts_with(&bucket_dir) {
                break;
            }
            if tokio::fs::remove_dir(&d).await.is_err() {
                break;
            }
            last_removed_parent = d.parent().map(Path::to_path_buf);
            dir = d.parent().map(Path::to_path_buf);
        }
        if let Some(p) = last_removed_parent {
            sync_dir(&p).await?;
        }
        Ok(())
    }

    /// One page of keys under `prefix`, in S3 order, strictly after `after`, at most `max`.
    /// Returns the page and whether more keys follow. Walks the tree lazily: subtrees wholly
    /// before `after` or outside `prefix` are skipped unread, and the walk stops at `max + 1`.
    pub async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        after: Option<&str>,
        max: usize,
    ) -> Result<(Vec<ObjectInfo>, bool), FsError> {
        let bucket_dir = self.existing_bucket(bucket).await?;
        let mut out = Vec::with_capacity(max.min(1024));
        let mut truncated = false;
        // Stack of (dir, its key prefix with trailing '/', or "" at the root); children are
        // pushed in reverse order so the smallest pops first.
        enum Item {
            Dir(PathBuf, String),
            File(PathBuf, String),
        }
        let mut stack = vec![Item::Dir(bucket_dir, String::new())];
        while let Some(item) = stack.pop() {
            match item {
                Item::File(path, key) => {
                    if out.len() == max {
                        truncated = true;
                        break;
                    }
                    let Ok(mut file) = open_object(&path).await else {
                        continue; // deleted since the directory was read
                    };
                    let etag = read_header(&mut file, &path).await?;
                    let meta = file.metadata().await?;
                    out.push(ObjectInfo {
                        key,
                        size_bytes: meta.len().saturating_sub(HEADER_LEN_BYTES),
                        etag,
                        modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
                Item::Dir(path, dir_key) => {
                    let mut children = Vec::new();
                    let mut rd = match tokio::fs::read_dir(&path).await {
                        Ok(rd) => rd,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e.into()),
                    };
                    while let Some(entry) = rd.next_entry().await? {
                        let name = entry.file_name();
                        let Some(name) = name.to_str() else { continue };
                        let is_dir = entry.file_type().await?.is_dir();
                        let (sort_key, child) = if is_dir {
                            let Some(seg) = unescape_segment(name) else {
                                continue;
                            };
                            let k = format!("{dir_key}{seg}/");
                            (k.clone(), Item::Dir(entry.path(), k))
                        } else {
                            let Some(stem) = name.strip_suffix(OBJECT_SUFFIX) else {
                                continue;
                            };
                            let Some(seg) = unescape_segment(stem) else {
                                continue;
                            };
                            let k = format!("{dir_key}{seg}");
                            (k.clone(), Item::File(entry.path(), k))
                        };
                        // Outside the prefix: neither this key nor anything below it matches.
                        if !(sort_key.starts_with(prefix) || prefix.starts_with(&sort_key)) {
                            continue;
                        }
                        if let Some(after) = after {
                            let skip = match &child {
                                Item::File(..) => sort_key.as_str() <= after,
                                // Every key below sorts after sort_key and starts with it.
                                Item::Dir(..) => {
                                    sort_key.as_str() < after && !after.starts_with(&sort_key)
                                }
                            };
                            if skip {
                                continue;
                            }
                        }
                        if let Item::File(..) = child {
                            if !sort_key.starts_with(prefix) {
                                continue;
                            }
                        }
                        children.push((sort_key, child));
                    }
                    children.sort_by(|a, b| b.0.cmp(&a.0));
                    stack.extend(children.into_iter().map(|(_, c)| c));
                }
            }
        }
        Ok((out, truncated))
    }

    // ---- multipart ----

    fn upload_dir(&self, upload_id: &str) -> Result<PathBuf, FsError> {
        if upload_id.is_empty()
            || upload_id.len() > 64
            || !upload_id.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(FsError::NoSuchUpload);
        }
        Ok(self.root.join("uploads").join(upload_id))
    }

    async fn upload_meta(&self, upload_id: &str) -> Result<(PathBuf, String, String), FsError> {
        let dir = self.upload_dir(upload_id)?;
        let meta = match tokio::fs::read_to_string(dir.join("meta")).await {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(FsError::NoSuchUpload),
            Err(e) => return Err(e.into()),
        };
        let (bucket, key) = meta
            .split_once('\n')
            .ok_or_else(|| FsError::Corrupt(dir.join("meta")))?;
        Ok((dir.clone(), bucket.to_string(), key.to_string()))
    }

    pub async fn create_upload(&self, bucket: &str, key: &str) -> Result<String, FsError> {
        let bucket_dir = self.existing_bucket(bucket).await?;
        Self::object_path(&bucket_dir, key)?;
        let id = format!("{:032x}", rand::random::<u128>());
        let dir = self.upload_dir(&id)?;
        tokio::fs::create_dir(&dir).await?;
        let mut f = tokio::fs::File::create(dir.join("meta")).await?;
        f.write_all(format!("{bucket}\n{key}").as_bytes()).await?;
        f.sync_all().await?;
        sync_dir(&dir).await?;
        sync_dir(&self.root.join("uploads")).await?;
        Ok(id)
    }

    pub async fn upload_part<S, E>(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: S,
    ) -> Result<String, FsError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if !(1..=10_000).contains(&part_number) {
            return Err(FsError::InvalidPart("part number outside 1..=10000"));
        }
        let (dir, b, k) = self.upload_meta(upload_id).await?;
        if b != bucket || k != key {
            return Err(FsError::NoSuchUpload);
        }
        let (tmp, etag, _) = self.write_tmp(body).await?;
        let dest = dir.join(part_number.to_string());
        if let Err(e) = tokio::fs::rename(&tmp, &dest).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            // Aborted (or swept) while this part was in flight.
            if e.kind() == io::ErrorKind::NotFound {
                return Err(FsError::NoSuchUpload);
            }
            return Err(e.into());
        }
        sync_dir(&dir).await?;
        Ok(etag)
    }

    /// Joins the parts into the object (durable, conditions checked under the key's lock) and
    /// removes the upload. Parts must be listed in ascending order with their ETags.
    pub async fn complete_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(i32, String)],
        cond: &Condition,
    ) -> Result<ObjectInfo, FsError> {
        let (dir, b, k) = self.upload_meta(upload_id).await?;
        if b != bucket || k != key {
            return Err(FsError::NoSuchUpload);
        }
        if parts.is_empty() {
            return Err(FsError::InvalidPart("no parts"));
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(FsError::InvalidPart("parts not in ascending order"));
        }
        let mut files = Vec::with_capacity(parts.len());
        for (n, etag) in parts {
            let path = dir.join(n.to_string());
            let mut f = match tokio::fs::File::open(&path).await {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(FsError::InvalidPart("a listed part was never uploaded"))
                }
                Err(e) => return Err(e.into()),
            };
            let stored = read_header(&mut f, &path).await?;
            if stored != etag.trim_matches('"') {
                return Err(FsError::InvalidPart("a part's ETag does not match"));
            }
            files.push(f);
        }
        let body = futures::stream::iter(files)
            .then(|f| async move { file_stream(f, u64::MAX) })
            .flatten();
        let info = self.put(bucket, key, Box::pin(body), cond).await?;
        self.remove_upload_dir(&dir).await?;
        Ok(info)
    }

    pub async fn abort_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<(), FsError> {
        let (dir, b, k) = self.upload_meta(upload_id).await?;
        if b != bucket || k != key {
            return Err(FsError::NoSuchUpload);
        }
        self.remove_upload_dir(&dir).await
    }

    async fn remove_upload_dir(&self, dir: &Path) -> Result<(), FsError> {
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        sync_dir(&self.root.join("uploads")).await?;
        Ok(())
    }

    /// Removes multipart uploads started more than `age` ago (an abandoned upload's parts
    /// would otherwise hold disk forever). Returns how many were removed.
    pub async fn sweep_uploads(&self, age: Duration) -> Result<usize, FsError> {
        let now = SystemTime::now();
        let mut removed = 0;
        let mut rd = tokio::fs::read_dir(self.root.join("uploads")).await?;
        while let Some(entry) = rd.next_entry().await? {
            let meta = match tokio::fs::metadata(entry.path().join("meta")).await {
                Ok(m) => m,
                // A directory without meta is a create that crashed half-way.
                Err(_) => entry.metadata().await?,
            };
            let started = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if now.duration_since(started).unwrap_or_default() >= age {
                tokio::fs::remove_dir_all(entry.path()).await?;
                removed += 1;
            }
        }
        if removed > 0 {
            sync_dir(&self.root.join("uploads")).await?;
        }
        Ok(removed)
    }

    /// Number of multipart uploads on disk (for tests and metrics).
    pub async fn upload_count(&self) -> Result<usize, FsError> {
        let mut n = 0;
        let mut rd = tokio::fs::read_dir(self.root.join("uploads")).await?;
        while rd.next_entry().await?.is_some() {
            n += 1;
        }
        Ok(n)
    }
}

fn check_condition(cond: &Condition, current: Option<&str>) -> Result<(), FsError> {
    if let Some(want) = &cond.if_match {
        match (want, current) {
            (_, None) => return Err(FsError::PreconditionFailed),
            (Some(etag), Some(cur)) if etag.trim_matches('"') != cur => {
                return Err(FsError::PreconditionFailed)
            }
            _ => {}
        }
    }
    if let Some(want) = &cond.if_none_match {
        match (want, current) {
            (None, Some(_)) => return Err(FsError::PreconditionFailed),
            (Some(etag), Some(cur)) if etag.trim_matches('"') == cur => {
                return Err(FsError::PreconditionFailed)
            }
            _ => {}
        }
    }
    Ok(())
}

fn validate_key(key: &str) -> Result<(), FsError> {
    if key.is_empty() || key.len() > KEY_LEN_BYTES_MAX {
        return Err(FsError::InvalidKey("empty or longer than 1024 bytes"));
    }
    // An empty segment would need an empty file name.
    if key.split('/').any(str::is_empty) {
        return Err(FsError::InvalidKey(
            "empty path segment ('//', leading or trailing '/')",
        ));
    }
    Ok(())
}

fn escape_segment(seg: &str) -> String {
    let mut out = String::with_capacity(seg.len());
    for b in seg.bytes() {
        if b.is_ascii_alphanumeric()
            || b == b'-'
            || b == b'_'
            || (b == b'.' && seg != "." && seg != "..")
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unescape_segment(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

async fn open_object(path: &Path) -> Result<tokio::fs::File, FsError> {
    match tokio::fs::File::open(path).await {
        Ok(f) => Ok(f),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Err(FsError::NoSuchKey)
        }
        Err(e) => Err(e.into()),
    }
}

async fn read_header(file: &mut tokio::fs::File, path: &Path) -> Result<String, FsError> {
    let mut header = [0u8; HEADER_LEN_BYTES as usize];
    file.seek(io::SeekFrom::Start(0)).await?;
    file.read_exact(&mut header)
        .await
        .map_err(|_| FsError::Corrupt(path.to_path_buf()))?;
    if &header[..MAGIC.len()] != MAGIC {
        return Err(FsError::Corrupt(path.to_path_buf()));
    }
    String::from_utf8(header[MAGIC.len()..].to_vec())
        .map_err(|_| FsError::Corrupt(path.to_path_buf()))
}

async fn read_etag(path: &Path) -> Result<Option<String>, FsError> {
    match open_object(path).await {
        Ok(mut f) => Ok(Some(read_header(&mut f, path).await?)),
        Err(FsError::NoSuchKey) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Streams `len` body bytes of an object file, from wherever the file's cursor is placed
/// (after the header unless the caller seeked).
pub fn file_stream(
    file: tokio::fs::File,
    len: u64,
) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + Sync + 'static {
    futures::stream::try_unfold((file, len), |(mut file, left)| async move {
        if left == 0 {
            return Ok(None);
        }
        let want = READ_CHUNK_BYTES.min(usize::try_from(left).unwrap_or(usize::MAX));
        let mut buf = vec![0u8; want];
        let n = file.read(&mut buf).await?;
        if n == 0 {
            if left == u64::MAX {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "object file shorter than its size",
            ));
        }
        buf.truncate(n);
        let left = if left == u64::MAX {
            left
        } else {
            left - n as u64
        };
        Ok(Some((Bytes::from(buf), (file, left))))
    })
}

/// Creates `dir` (below `base`) and makes each new entry durable in its parent.
async fn create_dirs_durable(base: &Path, dir: &Path) -> Result<(), FsError> {
    if tokio::fs::metadata(dir).await.is_ok() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut d = dir.to_path_buf();
    while d != base && tokio::fs::metadata(&d).await.is_err() {
        missing.push(d.clone());
        match d.parent() {
            Some(p) => d = p.to_path_buf(),
            None => break,
        }
    }
    for m in missing.iter().rev() {
        match tokio::fs::create_dir(m).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(p) = m.parent() {
            sync_dir(p).await?;
        }
    }
    Ok(())
}

async fn sync_dir(dir: &Path) -> Result<(), FsError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || sync_dir_blocking(&dir))
        .await
        .map_err(|e| FsError::Io(io::Error::other(e)))??;
    Ok(())
}

/// Creates `dir` and any missing ancestors, fsyncing each new entry's parent.
fn create_dir_durable_blocking(dir: &Path) -> Result<(), io::Error> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_durable_blocking(parent)?;
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        sync_dir_blocking(parent)?;
    }
    Ok(())
}

fn sync_dir_blocking(dir: &Path) -> Result<(), io::Error> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips_and_never_makes_an_object_suffix() {
        for seg in ["a", ".", "..", "a@o", "x y", "ü", "%41", "a.b-c_d"] {
            let e = escape_segment(seg);
            assert!(!e.contains('@'), "{seg} -> {e}");
            assert!(e != "." && e != "..");
            assert_eq!(unescape_segment(&e).as_deref(), Some(seg));
        }
    }

    #[test]
    fn conditions() {
        let none_match_any = Condition {
            if_none_match: Some(None),
            ..Condition::default()
        };
        assert!(check_condition(&none_match_any, None).is_ok());
        assert!(check_condition(&none_match_any, Some("e")).is_err());
        let match_e = Condition {
            if_match: Some(Some("\"e\"".into())),
            ..Condition::default()
        };
        assert!(check_condition(&match_e, Some("e")).is_ok());
        assert!(check_condition(&match_e, Some("f")).is_err());
        assert!(check_condition(&match_e, None).is_err());
    }
}
