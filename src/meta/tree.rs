//! Listing a whole tree at once (`metadata.prefetch_tree`): ListObjectsV2
//! without a delimiter, one stream per top-level directory, run concurrently,
//! turned into the listing of every directory in the tree.
//!
//! A data set of 1M objects under 1000 directories is then known after ~1000
//! LIST pages fetched [`TREE_LIST_CONCURRENCY`] at a time, instead of page
//! after page, directory after directory, as a walk would fetch them.

use std::collections::HashMap;

use super::listing::{EntryKind, ListedEntry, finalize, skip};
use super::names::check_name;
use crate::store::{MAX_KEYS_PER_PAGE, ObjectMeta, ObjectStore, StoreError};

/// Listing streams run at once. 32 keeps a LAN-attached S3 busy without
/// tripping its per-prefix request-rate limits (AWS: 5,500 GET/HEAD and 3,500
/// LIST-class requests per second per prefix).
pub const TREE_LIST_CONCURRENCY: usize = 32;

/// Every key under `prefix` (no delimiter), all pages.
pub async fn list_all<S: ObjectStore>(
    store: &S,
    prefix: &str,
) -> Result<Vec<ObjectMeta>, StoreError> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let page = store
            .list_page(prefix, None, token, MAX_KEYS_PER_PAGE)
            .await?;
        keys.extend(page.objects);
        token = page.next_token;
        if token.is_none() {
            return Ok(keys);
        }
    }
}

/// Directory listings (prefix -> entries, each finalized as `list_dir` would)
/// built from every key under `base` (`""` or ending in `/`). Each directory
/// reached appears, empty ones included. A key with a component that cannot be
/// a name is cut at that component, exactly as delimiter listings show it.
pub fn build_listings(base: &str, keys: &[ObjectMeta]) -> HashMap<String, Vec<ListedEntry>> {
    let mut dirs: HashMap<String, Vec<ListedEntry>> = HashMap::new();
    dirs.entry(base.to_string()).or_default();
    for obj in keys {
        let Some(rest) = obj.key.strip_prefix(base) else {
            continue;
        };
        let mut dir = base.to_string();
        let mut parts = rest.split('/').peekable();
        while let Some(name) = parts.next() {
            let last = parts.peek().is_none();
            if last && name.is_empty() {
                break; // "dir/" marker: the directory itself
            }
            if let Err(why) = check_name(name) {
                skip(&obj.key, why);
                break;
            }
            let entry = if last {
                ListedEntry {
                    name: name.to_string(),
                    kind: EntryKind::File,
                    size: obj.size,
                    etag: obj.etag.clone(),
                    mtime: Some(obj.last_modified),
                }
            } else {
                ListedEntry {
                    name: name.to_string(),
                    kind: EntryKind::Dir,
                    size: 0,
                    etag: String::new(),
                    mtime: None,
                }
            };
            dirs.get_mut(&dir)
                .expect("parent inserted first")
                .push(entry);
            if last {
                break;
            }
            dir = format!("{dir}{name}/");
            dirs.entry(dir.clone()).or_default();
        }
    }
    dirs.into_iter()
        .map(|(prefix, entries)| {
            let entries = finalize(&prefix, entries);
            (prefix, entries)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::listing::list_dir;
    use crate::store::mem::MemStore;

    /// The tree builder agrees with delimiter listings, directory by directory.
    #[tokio::test]
    async fn tree_equals_delimiter_listings() {
        let s = MemStore::default();
        let keys = [
            "a/b/c",
            "a/b/d",
            "a/e",
            "x",
            "x/y",
            "m/",
            "m/n/",
            "bad//k",
            "f/./g",
            "f/ok",
            "top.txt",
            "deep/1/2/3/4.bin",
        ];
        for k in keys {
            s.put(k, "1");
        }
        let all = list_all(&s, "").await.unwrap();
        let tree = build_listings("", &all);
        for (prefix, entries) in &tree {
            let listed = list_dir(&s, prefix).await.unwrap();
            assert_eq!(&listed, entries, "directory {prefix:?}");
        }
        for d in [
            "",
            "a/",
            "a/b/",
            "x/",
            "m/",
            "m/n/",
            "bad/",
            "f/",
            "deep/1/2/3/",
        ] {
            assert!(tree.contains_key(d), "missing {d:?}");
        }
    }
}
