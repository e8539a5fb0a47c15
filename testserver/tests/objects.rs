//! Object operations through the real AWS SDK: awkward keys, ranges, conditions.

mod common;

use aws_sdk_s3::primitives::ByteStream;
use common::{client, client_no_retry, status_and_code};
use lakemount_testserver::TestServer;

const BUCKET: &str = "test-bucket";

async fn server() -> TestServer {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    s
}

async fn get_all(c: &aws_sdk_s3::Client, key: &str) -> Vec<u8> {
    let out = c.get_object().bucket(BUCKET).key(key).send().await.unwrap();
    out.body.collect().await.unwrap().into_bytes().to_vec()
}

fn awkward_keys() -> Vec<String> {
    let long = "L".repeat(300);
    [
        "plus+sign",
        "with space",
        "a b",
        "a+b",
        "percent%41%",
        "hash#frag",
        "paren(1)",
        "question?mark&amp=1",
        "tilde~star*quote'",
        "ünïcödé/日本語.txt",
        "a",
        "a/x",
        "a/",
        "//",
        "a//b",
        "a/./b",
        "trailing.",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("dir/{long}"), format!("{long}/x")])
    .collect()
}

#[tokio::test]
async fn awkward_keys_round_trip() {
    let s = server().await;
    let c = client(&s.endpoint());
    let keys = awkward_keys();
    for (i, k) in keys.iter().enumerate() {
        let body = format!("content {i} of {k}");
        let put = c
            .put_object()
            .bucket(BUCKET)
            .key(k)
            .body(ByteStream::from(body.clone().into_bytes()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {k:?}: {e:?}"));
        // The key is stored exactly as given (no `+` -> space, no path cleanup).
        assert_eq!(
            s.get(BUCKET, k).as_deref(),
            Some(body.as_bytes()),
            "storage key {k:?}"
        );
        assert_eq!(put.e_tag(), s.etag(BUCKET, k).as_deref());
    }
    for (i, k) in keys.iter().enumerate() {
        let got = get_all(&c, k).await;
        assert_eq!(got, format!("content {i} of {k}").into_bytes(), "GET {k:?}");
        let head = c.head_object().bucket(BUCKET).key(k).send().await.unwrap();
        assert_eq!(head.content_length(), Some(got.len() as i64));
    }
    // `a b` and `a+b` are two different objects.
    assert_ne!(get_all(&c, "a b").await, get_all(&c, "a+b").await);

    let listed = c
        .list_objects_v2()
        .bucket(BUCKET)
        .send()
        .await
        .unwrap()
        .contents()
        .iter()
        .map(|o| o.key().unwrap().to_owned())
        .collect::<Vec<_>>();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(listed, expected);

    // Delete, then it is gone.
    c.delete_object()
        .bucket(BUCKET)
        .key("a+b")
        .send()
        .await
        .unwrap();
    assert!(s.get(BUCKET, "a+b").is_none());
    assert!(s.get(BUCKET, "a b").is_some());
}

#[tokio::test]
async fn missing_key_and_bucket() {
    let s = server().await;
    let c = client_no_retry(&s.endpoint());
    let err = c
        .get_object()
        .bucket(BUCKET)
        .key("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err), (404, Some("NoSuchKey".into())));
    let err = c
        .head_object()
        .bucket(BUCKET)
        .key("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err).0, 404);
    let err = c
        .head_bucket()
        .bucket("missing-bucket")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err).0, 404);
    c.head_bucket().bucket(BUCKET).send().await.unwrap();
    let err = c
        .get_object()
        .bucket("missing-bucket")
        .key("k")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err), (404, Some("NoSuchBucket".into())));
}

#[tokio::test]
async fn ranges() {
    let s = server().await;
    let c = client_no_retry(&s.endpoint());
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let etag = s.put(BUCKET, "obj", data.clone());
    s.put(BUCKET, "empty", Vec::new());

    for (range, start, end) in [
        ("bytes=100-199", 100, 200),
        ("bytes=0-0", 0, 1),
        ("bytes=-100", 900, 1000),
        ("bytes=900-", 900, 1000),
        ("bytes=990-5000", 990, 1000),
        ("bytes=-5000", 0, 1000),
    ] {
        let out = c
            .get_object()
            .bucket(BUCKET)
            .key("obj")
            .range(range)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{range}: {e:?}"));
        assert_eq!(
            out.content_range(),
            Some(format!("bytes {start}-{}/1000", end - 1).as_str()),
            "{range}"
        );
        assert_eq!(out.content_length(), Some((end - start) as i64));
        assert_eq!(out.e_tag(), Some(etag.as_str()));
        let body = out.body.collect().await.unwrap().into_bytes();
        assert_eq!(&body[..], &data[start..end], "{range}");
    }

    for range in ["bytes=1000-", "bytes=1000-1001", "bytes=-0"] {
        let err = c
            .get_object()
            .bucket(BUCKET)
            .key("obj")
            .range(range)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            status_and_code(&err),
            (416, Some("InvalidRange".into())),
            "{range}"
        );
    }

    // Whole object: 200 with all headers.
    let out = c
        .get_object()
        .bucket(BUCKET)
        .key("obj")
        .send()
        .await
        .unwrap();
    assert_eq!(out.content_length(), Some(1000));
    assert!(out.content_range().is_none());
    assert!(out.last_modified().is_some());
    assert_eq!(out.e_tag(), Some(etag.as_str()));

    // Empty object: 200 and no body without a range; any range is unsatisfiable.
    let out = c
        .get_object()
        .bucket(BUCKET)
        .key("empty")
        .send()
        .await
        .unwrap();
    assert_eq!(out.content_length(), Some(0));
    assert!(out.body.collect().await.unwrap().into_bytes().is_empty());
    let err = c
        .get_object()
        .bucket(BUCKET)
        .key("empty")
        .range("bytes=0-")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err).0, 416);

    // HEAD reports size, ETag and Last-Modified.
    let head = c
        .head_object()
        .bucket(BUCKET)
        .key("obj")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(1000));
    assert_eq!(head.e_tag(), Some(etag.as_str()));
    assert!(head.last_modified().is_some());
}

#[tokio::test]
async fn conditional_requests() {
    let s = server().await;
    let c = client_no_retry(&s.endpoint());
    let etag = s.put(BUCKET, "obj", &b"version 1"[..]);
    // Quoted hex MD5 of the content.
    assert_eq!(etag, "\"db3ec040e20dfc657dab510aeab74759\"");

    let out = c
        .get_object()
        .bucket(BUCKET)
        .key("obj")
        .if_match(&etag)
        .send()
        .await
        .unwrap();
    assert_eq!(out.e_tag(), Some(etag.as_str()));

    s.put(BUCKET, "obj", &b"version 2"[..]);
    let err = c
        .get_object()
        .bucket(BUCKET)
        .key("obj")
        .if_match(&etag)
        .range("bytes=0-3")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        status_and_code(&err),
        (412, Some("PreconditionFailed".into()))
    );
    let err = c
        .head_object()
        .bucket(BUCKET)
        .key("obj")
        .if_match(&etag)
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err).0, 412);

    let new_etag = s.etag(BUCKET, "obj").unwrap();
    let err = c
        .get_object()
        .bucket(BUCKET)
        .key("obj")
        .if_none_match(&new_etag)
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err).0, 304);
    c.get_object()
        .bucket(BUCKET)
        .key("obj")
        .if_none_match(&etag)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn buckets_via_http() {
    let s = TestServer::start().await.unwrap();
    let c = client_no_retry(&s.endpoint());
    c.create_bucket()
        .bucket("made-by-sdk")
        .send()
        .await
        .unwrap();
    s.create_bucket("made-directly");
    let names: Vec<String> = c
        .list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .map(|b| b.name().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["made-by-sdk", "made-directly"]);
    c.put_object()
        .bucket("made-by-sdk")
        .key("k")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    let err = c
        .delete_bucket()
        .bucket("made-by-sdk")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status_and_code(&err), (409, Some("BucketNotEmpty".into())));
    s.delete("made-by-sdk", "k");
    c.delete_bucket()
        .bucket("made-by-sdk")
        .send()
        .await
        .unwrap();
    c.head_bucket()
        .bucket("made-by-sdk")
        .send()
        .await
        .unwrap_err();
}

#[tokio::test]
async fn wrong_secret_is_rejected() {
    let s = server().await;
    let conf = common::config(&s.endpoint())
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            lakemount_testserver::ACCESS_KEY,
            "wrong-secret",
            None,
            None,
            "test",
        ))
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .build();
    let c = aws_sdk_s3::Client::from_conf(conf);
    let err = c.list_objects_v2().bucket(BUCKET).send().await.unwrap_err();
    assert_eq!(status_and_code(&err).0, 403);
}
