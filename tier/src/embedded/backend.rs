//! s3s's `S3` trait over [`FsStore`]: request DTOs in, store calls, response DTOs out.
//! Every error is mapped here once, to the S3 error code a client expects.

use std::sync::Arc;

use s3s::dto::{
    AbortMultipartUploadInput, AbortMultipartUploadOutput, CompleteMultipartUploadInput,
    CompleteMultipartUploadOutput, CreateBucketInput, CreateBucketOutput,
    CreateMultipartUploadInput, CreateMultipartUploadOutput, DeleteObjectInput, DeleteObjectOutput,
    ETag, ETagCondition, GetObjectInput, GetObjectOutput, HeadBucketInput, HeadBucketOutput,
    HeadObjectInput, HeadObjectOutput, ListObjectsV2Input, ListObjectsV2Output, Object,
    PutObjectInput, PutObjectOutput, StreamingBlob, Timestamp, UploadPartInput, UploadPartOutput,
};
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};
use tokio::io::AsyncSeekExt;

use super::fsstore::{file_stream, Condition, FsError, FsStore, HEADER_LEN_BYTES};

/// Most keys one ListObjectsV2 page returns (S3's own cap): a listing is paged, never built
/// whole.
pub const LIST_PAGE_KEYS_MAX: usize = 1000;

pub struct Backend {
    pub store: Arc<FsStore>,
}

fn map_err(e: FsError) -> S3Error {
    match e {
        FsError::NoSuchKey => s3_error!(NoSuchKey),
        FsError::NoSuchBucket => s3_error!(NoSuchBucket),
        FsError::NoSuchUpload => s3_error!(NoSuchUpload),
        FsError::PreconditionFailed => s3_error!(PreconditionFailed),
        FsError::InvalidKey(why) => s3_error!(InvalidArgument, "{why}"),
        FsError::InvalidPart(why) => s3_error!(InvalidPart, "{why}"),
        FsError::Body(why) => s3_error!(IncompleteBody, "{why}"),
        e @ (FsError::Corrupt(_) | FsError::Io(_)) => {
            tracing::error!(error = %e, "embedded s3: store error");
            s3_error!(InternalError, "{e}")
        }
    }
}

fn condition(if_match: Option<ETagCondition>, if_none_match: Option<ETagCondition>) -> Condition {
    let conv = |c: ETagCondition| match c {
        ETagCondition::Any => None,
        ETagCondition::ETag(e) => Some(e.value().to_string()),
    };
    Condition {
        if_match: if_match.map(conv),
        if_none_match: if_none_match.map(conv),
    }
}

fn etag(e: String) -> ETag {
    ETag::Strong(e)
}

fn body_or_empty(body: Option<StreamingBlob>) -> StreamingBlob {
    body.unwrap_or_else(|| {
        StreamingBlob::wrap(futures::stream::empty::<Result<bytes::Bytes, std::io::Error>>())
    })
}

#[async_trait::async_trait]
impl S3 for Backend {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.store
            .create_bucket(&req.input.bucket)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        if !self
            .store
            .bucket_exists(&req.input.bucket)
            .await
            .map_err(map_err)?
        {
            return Err(s3_error!(NoSuchBucket));
        }
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let cond = condition(input.if_match, input.if_none_match);
        let info = self
            .store
            .put(&input.bucket, &input.key, body_or_empty(input.body), &cond)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(info.etag)),
            size: i64::try_from(info.size_bytes).ok(),
            ..PutObjectOutput::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let info = self
            .store
            .head(&req.input.bucket, &req.input.key)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: i64::try_from(info.size_bytes).ok(),
            e_tag: Some(etag(info.etag)),
            last_modified: Some(Timestamp::from(info.modified)),
            ..HeadObjectOutput::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let (info, mut file) = self
            .store
            .get(&input.bucket, &input.key)
            .await
            .map_err(map_err)?;
        let range = match input.range {
            Some(r) => r
                .check(info.size_bytes)
                .map_err(|_| s3_error!(InvalidRange))?,
            None => 0..info.size_bytes,
        };
        file.seek(std::io::SeekFrom::Start(HEADER_LEN_BYTES + range.start))
            .await
            .map_err(|e| map_err(e.into()))?;
        let len = range.end - range.start;
        let content_range = input.range.map(|_| {
            format!(
                "bytes {}-{}/{}",
                range.start,
                range.end.saturating_sub(1),
                info.size_bytes
            )
        });
        Ok(S3Response::new(GetObjectOutput {
            body: Some(StreamingBlob::wrap(file_stream(file, len))),
            content_length: i64::try_from(len).ok(),
            content_range,
            e_tag: Some(etag(info.etag)),
            last_modified: Some(Timestamp::from(info.modified)),
            ..GetObjectOutput::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.store
            .delete(&req.input.bucket, &req.input.key)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        if input.delimiter.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "delimiter listings are not supported"
            ));
        }
        let max = input
            .max_keys
            .map(|m| usize::try_from(m).unwrap_or(0))
            .unwrap_or(LIST_PAGE_KEYS_MAX)
            .min(LIST_PAGE_KEYS_MAX);
        let prefix = input.prefix.clone().unwrap_or_default();
        // The continuation token is the last key of the previous page: the walk resumes after it.
        let after = input
            .continuation_token
            .clone()
            .or_else(|| input.start_after.clone());
        let (page, truncated) = self
            .store
            .list_page(&input.bucket, &prefix, after.as_deref(), max)
            .await
            .map_err(map_err)?;
        let next = if truncated {
            page.last().map(|o| o.key.clone())
        } else {
            None
        };
        let contents: Vec<Object> = page
            .into_iter()
            .map(|o| Object {
                key: Some(o.key),
                size: i64::try_from(o.size_bytes).ok(),
                e_tag: Some(etag(o.etag)),
                last_modified: Some(Timestamp::from(o.modified)),
                ..Object::default()
            })
            .collect();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            max_keys: i32::try_from(max).ok(),
            key_count: i32::try_from(contents.len()).ok(),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            is_truncated: Some(truncated),
            next_continuation_token: next,
            contents: Some(contents),
            ..ListObjectsV2Output::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let id = self
            .store
            .create_upload(&req.input.bucket, &req.input.key)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(req.input.bucket),
            key: Some(req.input.key),
            upload_id: Some(id),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let e = self
            .store
            .upload_part(
                &input.bucket,
                &input.key,
                &input.upload_id,
                input.part_number,
                body_or_empty(input.body),
            )
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(e)),
            ..UploadPartOutput::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let mut parts = Vec::new();
        for p in input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
        {
            let (Some(n), Some(e)) = (p.part_number, p.e_tag) else {
                return Err(s3_error!(InvalidPart, "a part without number or ETag"));
            };
            parts.push((n, e.value().to_string()));
        }
        let cond = condition(input.if_match, input.if_none_match);
        let info = self
            .store
            .complete_upload(&input.bucket, &input.key, &input.upload_id, &parts, &cond)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(etag(info.etag)),
            ..CompleteMultipartUploadOutput::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.store
            .abort_upload(&req.input.bucket, &req.input.key, &req.input.upload_id)
            .await
            .map_err(map_err)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}
