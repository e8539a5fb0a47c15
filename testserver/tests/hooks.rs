//! Test hooks: request counting, injected failures, delays, shutdown, sync use.

mod common;

use std::time::{Duration, Instant};

use aws_sdk_s3::primitives::ByteStream;
use common::{client, client_no_retry, status_and_code};
use lakemount_testserver::TestServer;

const BUCKET: &str = "hook-bucket";

#[tokio::test]
async fn counts_requests_per_operation() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    s.put(BUCKET, "k", &b"data"[..]);
    let c = client_no_retry(&s.endpoint());
    s.reset_counts();

    c.get_object().bucket(BUCKET).key("k").send().await.unwrap();
    c.get_object()
        .bucket(BUCKET)
        .key("k")
        .range("bytes=0-1")
        .send()
        .await
        .unwrap();
    c.get_object()
        .bucket(BUCKET)
        .key("missing")
        .send()
        .await
        .unwrap_err();
    c.head_object()
        .bucket(BUCKET)
        .key("k")
        .send()
        .await
        .unwrap();
    c.list_objects_v2().bucket(BUCKET).send().await.unwrap();
    c.head_bucket().bucket(BUCKET).send().await.unwrap();
    c.put_object()
        .bucket(BUCKET)
        .key("new")
        .body(ByteStream::from_static(b"v"))
        .send()
        .await
        .unwrap();

    assert_eq!(s.request_count("GetObject"), 3);
    assert_eq!(s.request_count("HeadObject"), 1);
    assert_eq!(s.request_count("ListObjectsV2"), 1);
    assert_eq!(s.request_count("HeadBucket"), 1);
    assert_eq!(s.request_count("PutObject"), 1);
    assert_eq!(s.request_count("ListObjects"), 0);
    // Direct storage access is not an HTTP request.
    s.put(BUCKET, "direct", &b"d"[..]);
    assert_eq!(s.request_count("PutObject"), 1);
    s.reset_counts();
    assert_eq!(s.request_count("GetObject"), 0);
}

#[tokio::test]
async fn fail_next_injects_status() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    s.put(BUCKET, "k", &b"data"[..]);
    let c = client_no_retry(&s.endpoint());

    for (status, code) in [
        (503, "SlowDown"),
        (500, "InternalError"),
        (403, "AccessDenied"),
    ] {
        s.fail_next("GetObject", status, 2);
        for _ in 0..2 {
            let err = c
                .get_object()
                .bucket(BUCKET)
                .key("k")
                .send()
                .await
                .unwrap_err();
            assert_eq!(status_and_code(&err), (status, Some(code.to_owned())));
        }
        // Other operations are unaffected, and the third GET succeeds.
        c.head_object()
            .bucket(BUCKET)
            .key("k")
            .send()
            .await
            .unwrap();
        c.get_object().bucket(BUCKET).key("k").send().await.unwrap();
    }
    assert_eq!(s.request_count("GetObject"), 9);

    s.fail_next("ListObjectsV2", 503, 1);
    let err = c.list_objects_v2().bucket(BUCKET).send().await.unwrap_err();
    assert_eq!(status_and_code(&err).0, 503);

    // With the SDK's standard retries a single 503 is retried transparently.
    let retrying = client(&s.endpoint());
    s.reset_counts();
    s.fail_next("HeadObject", 503, 1);
    retrying
        .head_object()
        .bucket(BUCKET)
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(s.request_count("HeadObject"), 2);

    // times == 0 cancels.
    s.fail_next("GetObject", 500, 5);
    s.fail_next("GetObject", 500, 0);
    c.get_object().bucket(BUCKET).key("k").send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_get_does_not_block_others() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    s.put(BUCKET, "slow/big", vec![7u8; 1 << 20]);
    s.put(BUCKET, "fast/small", &b"quick"[..]);
    s.set_delay("GetObject", "slow/", Duration::from_millis(1500));
    let c = client_no_retry(&s.endpoint());

    let t0 = Instant::now();
    let slow = {
        let c = c.clone();
        tokio::spawn(async move {
            let out = c
                .get_object()
                .bucket(BUCKET)
                .key("slow/big")
                .send()
                .await
                .unwrap();
            out.body.collect().await.unwrap().into_bytes().len()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.get_object()
        .bucket(BUCKET)
        .key("fast/small")
        .send()
        .await
        .unwrap();
    c.head_object()
        .bucket(BUCKET)
        .key("slow/big")
        .send()
        .await
        .unwrap();
    let fast = t0.elapsed();
    assert!(
        fast < Duration::from_millis(1000),
        "fast requests took {fast:?}"
    );
    assert_eq!(slow.await.unwrap(), 1 << 20);
    assert!(t0.elapsed() >= Duration::from_millis(1500));

    // Zero removes the rule.
    s.set_delay("GetObject", "slow/", Duration::ZERO);
    let t1 = Instant::now();
    c.get_object()
        .bucket(BUCKET)
        .key("slow/big")
        .send()
        .await
        .unwrap();
    assert!(t1.elapsed() < Duration::from_millis(1000));
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    let c = client_no_retry(&s.endpoint());
    c.head_bucket().bucket(BUCKET).send().await.unwrap();
    s.shutdown();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = c.head_bucket().bucket(BUCKET).send().await.unwrap_err();
    assert!(
        err.raw_response().is_none(),
        "expected a connection error, got {err:?}"
    );
}

/// Sync callers: the server owns its runtime; the client runs on another one.
#[test]
fn background_server_from_sync_code() {
    let s = TestServer::start_background().unwrap();
    s.create_bucket(BUCKET);
    s.put(BUCKET, "k", &b"hello"[..]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = rt.block_on(async {
        let c = client_no_retry(&s.endpoint());
        let out = c.get_object().bucket(BUCKET).key("k").send().await.unwrap();
        out.body.collect().await.unwrap().into_bytes()
    });
    assert_eq!(&body[..], b"hello");
    assert_eq!(s.request_count("GetObject"), 1);
    // A clone shares the server; dropping it does not stop the server.
    let s2 = s.clone();
    drop(s2);
    rt.block_on(async {
        let c = client_no_retry(&s.endpoint());
        c.head_bucket().bucket(BUCKET).send().await.unwrap();
    });
    s.shutdown();
}

/// The environment sets AWS_CA_BUNDLE; plain http to loopback must still work.
#[tokio::test]
async fn works_with_aws_ca_bundle_set() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    // Only observe the variable; tests run in parallel threads, so no set_var.
    eprintln!("AWS_CA_BUNDLE={:?}", std::env::var_os("AWS_CA_BUNDLE"));
    let c = client_no_retry(&s.endpoint());
    c.head_bucket().bucket(BUCKET).send().await.unwrap();
}
