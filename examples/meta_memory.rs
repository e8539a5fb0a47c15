//! Measures the memory of cached metadata: 1M directory entries (1000
//! directories of 1000 files, keys like `train/000123/img-000456.jpg`) held in
//! the listing cache, then 1M inodes in the inode table, as resident-set growth.
//!
//! `cargo run --release --example meta_memory`

use std::sync::Arc;

use lakemount::meta::{Meta, MetaConfig, ROOT_INO};
use lakemount::store::mem::MemStore;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::main]
async fn main() {
    const DIRS: usize = 1000;
    const FILES: usize = 1000;
    let store = Arc::new(MemStore::default());
    for d in 0..DIRS {
        for f in 0..FILES {
            store.put(&format!("train/{d:06}/img-{f:06}.jpg"), bytes::Bytes::new());
        }
    }
    let config = MetaConfig {
        ttl_secs: 3600.0,
        ..MetaConfig::default()
    };
    let meta = Meta::new(store.clone(), config, "");
    let before = rss_bytes();
    let n = meta.prefetch_tree("").await.unwrap().objects;
    let listed = rss_bytes();
    let per_entry = (listed - before) as f64 / n as f64;
    println!(
        "listing cache: {n} entries, RSS +{:.1} MiB, {per_entry:.0} bytes per entry",
        (listed - before) as f64 / (1 << 20) as f64
    );

    // Look every file up, as a loader opening each one does: 1M inodes.
    let train = meta.find("", "train").await.unwrap().unwrap();
    let train_attr = meta
        .inodes
        .upsert(ROOT_INO, "", &train, true, std::time::Instant::now());
    let before = rss_bytes();
    for d in 0..DIRS {
        let dir_name = format!("{d:06}");
        let dir = meta.find("train/", &dir_name).await.unwrap().unwrap();
        let dir_attr = meta.inodes.upsert(
            train_attr.ino,
            "train/",
            &dir,
            true,
            std::time::Instant::now(),
        );
        let prefix = format!("train/{dir_name}/");
        let listing = meta.listing(&prefix).await.unwrap();
        for e in &listing.entries {
            meta.inodes
                .upsert(dir_attr.ino, &prefix, e, true, std::time::Instant::now());
        }
    }
    let after = rss_bytes();
    let inodes = meta.inodes.len();
    println!(
        "inode table: {inodes} inodes, RSS +{:.1} MiB, {:.0} bytes per inode",
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / inodes as f64
    );
}
