//! ListObjectsV2 through the real AWS SDK: pagination, delimiters, start-after.

mod common;

use std::collections::HashSet;

use common::client;
use lakemount_testserver::TestServer;

const BUCKET: &str = "list-bucket";

/// Every key and common prefix of a full paginated listing, in order, plus the
/// size of each page.
async fn list_all(
    c: &aws_sdk_s3::Client,
    prefix: Option<&str>,
    delimiter: Option<&str>,
    max_keys: Option<i32>,
) -> (Vec<String>, Vec<usize>) {
    let mut names = Vec::new();
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let out = c
            .list_objects_v2()
            .bucket(BUCKET)
            .set_prefix(prefix.map(str::to_owned))
            .set_delimiter(delimiter.map(str::to_owned))
            .set_max_keys(max_keys)
            .set_continuation_token(token.clone())
            .send()
            .await
            .unwrap();
        let mut page: Vec<String> = out
            .contents()
            .iter()
            .map(|o| {
                assert!(o.size().is_some() && o.e_tag().is_some() && o.last_modified().is_some());
                o.key().unwrap().to_owned()
            })
            .chain(
                out.common_prefixes()
                    .iter()
                    .map(|p| p.prefix().unwrap().to_owned()),
            )
            .collect();
        assert_eq!(out.key_count(), Some(page.len() as i32));
        // Keys and prefixes come in two lists; merged they must be sorted.
        page.sort();
        pages.push(page.len());
        names.extend(page);
        if out.is_truncated() == Some(true) {
            token = Some(out.next_continuation_token().unwrap().to_owned());
        } else {
            assert!(out.next_continuation_token().is_none());
            break;
        }
        assert!(pages.len() < 5000, "listing does not end");
    }
    (names, pages)
}

fn assert_sorted_unique(names: &[String]) {
    let set: HashSet<&String> = names.iter().collect();
    assert_eq!(set.len(), names.len(), "duplicates in listing");
    assert!(names.windows(2).all(|w| w[0] < w[1]), "listing not sorted");
}

#[tokio::test]
async fn paginates_2500_keys() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    let mut keys: Vec<String> = (0..2500).map(|i| format!("data/{i:05}.bin")).collect();
    for k in &keys {
        s.put(BUCKET, k, &b"x"[..]);
    }
    let c = client(&s.endpoint());
    // Default max-keys (1000) and explicit 1000.
    for max in [None, Some(1000), Some(5000)] {
        let (names, pages) = list_all(&c, None, None, max).await;
        assert_eq!(pages, [1000, 1000, 500]);
        assert_sorted_unique(&names);
        keys.sort();
        assert_eq!(names, keys);
    }
    let (names, pages) = list_all(&c, Some("data/01"), None, Some(300)).await;
    assert_eq!(pages, [300, 300, 300, 100]);
    assert_eq!(names.len(), 1000);
    assert_sorted_unique(&names);

    // The SDK's paginator sees the same keys.
    let mut n = 0;
    let mut pages = c.list_objects_v2().bucket(BUCKET).into_paginator().send();
    while let Some(p) = pages.next().await {
        n += p.unwrap().contents().len();
    }
    assert_eq!(n, 2500);
}

#[tokio::test]
async fn delimiter_prefixes_across_pages() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    let mut expected = Vec::new();
    for i in 0..1500 {
        let k = format!("root/f{i:04}");
        s.put(BUCKET, &k, &b"x"[..]);
        expected.push(k);
    }
    // Ten "directories" sorting between the files, each with several entries, plus a
    // file and a directory of the same name.
    for d in 0..10 {
        let dir = format!("root/f{:04}d/", d * 150 + 75);
        for j in 0..5 {
            s.put(BUCKET, &format!("{dir}{j}"), &b"y"[..]);
            s.put(BUCKET, &format!("{dir}sub/{j}"), &b"z"[..]);
        }
        expected.push(dir);
    }
    s.put(BUCKET, "root/f0075d", &b"same name as a dir"[..]);
    expected.push("root/f0075d".to_owned());
    s.put(BUCKET, "outside", &b"o"[..]);
    expected.sort();
    assert_eq!(expected.len(), 1511);

    let c = client(&s.endpoint());
    for max in [1000, 100, 7, 1] {
        let (names, pages) = list_all(&c, Some("root/"), Some("/"), Some(max)).await;
        assert_sorted_unique(&names);
        assert_eq!(names, expected, "max-keys {max}");
        assert!(pages.iter().all(|&p| p <= max as usize));
        assert_eq!(pages.iter().sum::<usize>(), 1511);
        if max == 1000 {
            assert_eq!(pages, [1000, 511]);
        }
    }

    // Inside one directory: files and one common prefix.
    let (names, _) = list_all(&c, Some("root/f0075d/"), Some("/"), None).await;
    assert_eq!(
        names,
        [
            "root/f0075d/0",
            "root/f0075d/1",
            "root/f0075d/2",
            "root/f0075d/3",
            "root/f0075d/4",
            "root/f0075d/sub/"
        ]
    );
    // Top level.
    let (names, _) = list_all(&c, None, Some("/"), None).await;
    assert_eq!(names, ["outside", "root/"]);
}

#[tokio::test]
async fn start_after_and_prefix_edge_cases() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    for k in ["a", "a/", "a/x", "a/y/z", "a!", "a0", "b"] {
        s.put(BUCKET, k, &b"1"[..]);
    }
    let c = client(&s.endpoint());
    let out = c
        .list_objects_v2()
        .bucket(BUCKET)
        .start_after("a/x")
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = out.contents().iter().map(|o| o.key().unwrap()).collect();
    assert_eq!(keys, ["a/y/z", "a0", "b"]);

    // `a/` with delimiter `/` under prefix `a/`: the key `a/` itself is listed.
    let (names, _) = list_all(&c, Some("a/"), Some("/"), None).await;
    assert_eq!(names, ["a/", "a/x", "a/y/"]);
    let (names, _) = list_all(&c, None, Some("/"), Some(1)).await;
    assert_eq!(names, ["a", "a!", "a/", "a0", "b"]);
    let (names, _) = list_all(&c, Some("zzz"), Some("/"), None).await;
    assert!(names.is_empty());
}

#[tokio::test]
async fn url_encoding_type() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    s.put(BUCKET, "d ir/a+b%.txt", &b"1"[..]);
    let c = client(&s.endpoint());
    let out = c
        .list_objects_v2()
        .bucket(BUCKET)
        .encoding_type(aws_sdk_s3::types::EncodingType::Url)
        .delimiter("/")
        .send()
        .await
        .unwrap();
    assert_eq!(out.common_prefixes()[0].prefix(), Some("d%20ir/"));
    let out = c
        .list_objects_v2()
        .bucket(BUCKET)
        .encoding_type(aws_sdk_s3::types::EncodingType::Url)
        .send()
        .await
        .unwrap();
    assert_eq!(out.contents()[0].key(), Some("d%20ir/a%2Bb%25.txt"));
}

#[tokio::test]
async fn list_objects_v1_pages_with_marker() {
    let s = TestServer::start().await.unwrap();
    s.create_bucket(BUCKET);
    for i in 0..25 {
        s.put(BUCKET, &format!("d/{i:02}"), &b"1"[..]);
        s.put(BUCKET, &format!("d/{i:02}x/sub"), &b"1"[..]);
    }
    let c = client(&s.endpoint());
    let mut names = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let out = c
            .list_objects()
            .bucket(BUCKET)
            .prefix("d/")
            .delimiter("/")
            .max_keys(10)
            .set_marker(marker.clone())
            .send()
            .await
            .unwrap();
        let mut page: Vec<String> = out
            .contents()
            .iter()
            .map(|o| o.key().unwrap().to_owned())
            .chain(
                out.common_prefixes()
                    .iter()
                    .map(|p| p.prefix().unwrap().to_owned()),
            )
            .collect();
        assert!(page.len() <= 10);
        page.sort();
        names.extend(page);
        if out.is_truncated() != Some(true) {
            break;
        }
        marker = Some(out.next_marker().unwrap().to_owned());
    }
    assert_eq!(names.len(), 50);
    assert_sorted_unique(&names);
}
