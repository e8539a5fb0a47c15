//! The write half of the S3 store ([`WriteStore`] of `S3Store`) against the
//! real test server over HTTP: PutObject, multipart upload, CopyObject and
//! DeleteObject, checked in the server's own storage.

mod common;

use std::sync::Once;

use bytes::Bytes;
use common::{bucket, data, server};
use lakemount::store::s3::{S3Config, S3Store};
use lakemount::store::{MIN_PART_SIZE, StoreError, UploadedPart, WriteStore};

async fn store(bucket: &str) -> S3Store {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        // SAFETY: set once, before any thread of this binary reads the
        // environment through the AWS SDK.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", common::ACCESS_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", common::SECRET_KEY);
        }
    });
    let config = S3Config {
        endpoint_url: Some(server().endpoint()),
        region: Some("us-east-1".into()),
        ..S3Config::default()
    };
    S3Store::new(bucket, &config).await.unwrap()
}

/// A PUT stores the bytes under keys with spaces, `+` and non-ASCII; a copy
/// pinned to the source's ETag copies it, one pinned to an old ETag is
/// refused (412); a delete removes the key, and deleting it again succeeds.
#[tokio::test]
async fn put_copy_and_delete_round_trip() {
    let b = bucket("store-put");
    let s = store(&b).await;
    let body = data(100_000, 1);
    let etag = s
        .put("dir/a b+c é", Bytes::from(body.clone()))
        .await
        .unwrap();
    assert!(!etag.is_empty());
    assert_eq!(server().get(&b, "dir/a b+c é").unwrap(), body);
    let copied = s.copy("dir/a b+c é", &etag, "other/x").await.unwrap();
    assert_eq!(copied, etag, "a copy keeps the bytes and so the MD5 ETag");
    assert_eq!(server().get(&b, "other/x").unwrap(), body);
    s.put("dir/a b+c é", Bytes::from_static(b"new"))
        .await
        .unwrap();
    assert_eq!(
        s.copy("dir/a b+c é", &etag, "other/y").await,
        Err(StoreError::PreconditionFailed)
    );
    assert!(server().get(&b, "other/y").is_none());
    s.delete("other/x").await.unwrap();
    assert!(server().get(&b, "other/x").is_none());
    s.delete("other/x").await.unwrap();
}

/// A multipart upload is listed while pending and, once completed, is the
/// parts' bytes in order under a multipart ETag; an aborted one leaves no
/// object and is no longer listed; aborting it again succeeds.
#[tokio::test]
async fn multipart_uploads_complete_and_abort() {
    let b = bucket("store-mpu");
    let s = store(&b).await;
    let (p1, p2) = (data(MIN_PART_SIZE as usize, 2), data(12_345, 3));
    let id = s.create_multipart("ckpt/step-1/model.bin").await.unwrap();
    let gone = s.create_multipart("ckpt/step-1/optim.bin").await.unwrap();
    let pending = s.list_multipart("ckpt/").await.unwrap();
    let mut ids: Vec<&str> = pending.iter().map(|u| u.upload_id.as_str()).collect();
    ids.sort();
    let mut want = vec![id.as_str(), gone.as_str()];
    want.sort();
    assert_eq!(ids, want);
    assert!(s.list_multipart("other/").await.unwrap().is_empty());
    // Parts sent out of order, completed in order.
    let e2 = s
        .upload_part("ckpt/step-1/model.bin", &id, 2, Bytes::from(p2.clone()))
        .await
        .unwrap();
    let e1 = s
        .upload_part("ckpt/step-1/model.bin", &id, 1, Bytes::from(p1.clone()))
        .await
        .unwrap();
    let parts = [
        UploadedPart {
            number: 1,
            etag: e1,
        },
        UploadedPart {
            number: 2,
            etag: e2,
        },
    ];
    let etag = s
        .complete_multipart("ckpt/step-1/model.bin", &id, &parts)
        .await
        .unwrap();
    assert!(etag.trim_matches('"').ends_with("-2"), "{etag}");
    let stored = server().get(&b, "ckpt/step-1/model.bin").unwrap();
    assert_eq!(stored.len(), p1.len() + p2.len());
    assert!(stored[..p1.len()] == p1[..] && stored[p1.len()..] == p2[..]);
    // A retried completion of an upload that already completed.
    assert_eq!(
        s.complete_multipart("ckpt/step-1/model.bin", &id, &parts)
            .await,
        Err(StoreError::NoSuchUpload)
    );
    // A copy of a multipart object is one part: its ETag is its MD5.
    let copied = s
        .copy("ckpt/step-1/model.bin", &etag, "ckpt/copy.bin")
        .await
        .unwrap();
    assert!(
        !copied.contains('-') && copied.trim_matches('"').len() == 32,
        "{copied}"
    );
    s.abort_multipart("ckpt/step-1/optim.bin", &gone)
        .await
        .unwrap();
    assert!(s.list_multipart("ckpt/").await.unwrap().is_empty());
    assert!(server().get(&b, "ckpt/step-1/optim.bin").is_none());
    s.abort_multipart("ckpt/step-1/optim.bin", &gone)
        .await
        .unwrap();
}
