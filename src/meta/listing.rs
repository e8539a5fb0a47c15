//! One directory's listing: every page of ListObjectsV2 with delimiter `/`,
//! turned into sorted, unique, valid directory entries.

use std::time::SystemTime;

use tracing::warn;

use super::names::check_name;
use crate::store::{MAX_KEYS_PER_PAGE, ObjectStore, StoreError};
use crate::telemetry::metrics as m;

/// Kind of a directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// An object.
    File,
    /// A common prefix or a `name/` marker.
    Dir,
}

/// One child of a directory as a listing saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedEntry {
    /// Name: the key component, exact UTF-8 bytes.
    pub name: String,
    /// File or directory.
    pub kind: EntryKind,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// ETag (empty for directories).
    pub etag: String,
    /// LastModified (`None` for directories).
    pub mtime: Option<SystemTime>,
}

/// Lists the directory at `prefix` (`""` or ending in `/`) to the end.
/// Entries come back sorted by name bytes, each name once: a name that is both
/// an object and a prefix is a directory (the file is shadowed, with a warning);
/// names that cannot be POSIX names are skipped with a warning; the directory's
/// own marker object (`prefix` itself) is not an entry.
pub async fn list_dir<S: ObjectStore>(
    store: &S,
    prefix: &str,
) -> Result<Vec<ListedEntry>, StoreError> {
    Ok(list_dir_upto(store, prefix, usize::MAX, None)
        .await?
        .expect("no limit"))
}

/// [`list_dir`], given up (`Ok(None)`) as soon as the listing returned more
/// than `max_entries` keys and common prefixes. `page_wait`: a page with no
/// answer within it fails the listing (a transient error, as a timeout).
pub async fn list_dir_upto<S: ObjectStore>(
    store: &S,
    prefix: &str,
    max_entries: usize,
    page_wait: Option<std::time::Duration>,
) -> Result<Option<Vec<ListedEntry>>, StoreError> {
    let mut entries = Vec::new();
    let mut token = None;
    let mut seen = 0usize;
    loop {
        let page = store.list_page(prefix, Some("/"), token, None, MAX_KEYS_PER_PAGE);
        let page = match page_wait {
            None => page.await?,
            Some(d) => tokio::time::timeout(d, page).await.map_err(|_| {
                StoreError::Transient(format!("LIST of {prefix:?}: no answer within {d:?}"))
            })??,
        };
        seen += page.objects.len() + page.common_prefixes.len();
        if seen > max_entries {
            return Ok(None);
        }
        for obj in page.objects {
            let Some(name) = obj.key.strip_prefix(prefix) else {
                continue;
            };
            if name.is_empty() {
                // The directory marker itself. One with content is odd: say so.
                if obj.size > 0 {
                    warn!(key = %obj.key.escape_debug(), size = obj.size,
                        "directory marker object has content; it is shown as a directory only");
                }
                continue;
            }
            if let Err(why) = check_name(name) {
                skip(&obj.key, why);
                continue;
            }
            entries.push(ListedEntry {
                name: name.to_string(),
                kind: EntryKind::File,
                size: obj.size,
                etag: obj.etag,
                mtime: Some(obj.last_modified),
            });
        }
        for cp in page.common_prefixes {
            let Some(name) = cp.strip_prefix(prefix).and_then(|n| n.strip_suffix('/')) else {
                continue;
            };
            if let Err(why) = check_name(name) {
                skip(&cp, why);
                continue;
            }
            entries.push(ListedEntry {
                name: name.to_string(),
                kind: EntryKind::Dir,
                size: 0,
                etag: String::new(),
                mtime: None,
            });
        }
        token = page.next_token;
        if token.is_none() {
            break;
        }
    }
    Ok(Some(finalize(prefix, entries)))
}

/// Keys asked for by [`find_one`]'s first request: the entry wanted comes
/// first or after the few keys that extend its name with a byte below `/`.
const FIND_ONE_PAGE: i32 = 32;

/// Looks up `name` in the directory at `prefix` without listing the
/// directory: ListObjectsV2 of the key `prefix + name` as prefix (delimiter
/// `/`, [`FIND_ONE_PAGE`] keys). In key order the object `name` comes
/// first, then keys extending the name with a byte below `/` (`name.bak`,
/// `name-1`), then the common prefix `name/`. When that first page ends
/// before `name/` could come (many such keys), one more ListObjectsV2 of
/// `name/` with MaxKeys 1 tells whether it is a directory: at most 2
/// requests whatever the directory holds. `name/` makes it a directory
/// (shadowing an object `name`, with a warning, as in [`list_dir`]); a name
/// that cannot be a POSIX name is not found. Errors: the store's.
pub async fn find_one<S: ObjectStore>(
    store: &S,
    prefix: &str,
    name: &str,
) -> Result<Option<ListedEntry>, StoreError> {
    if name.contains('/') || check_name(name).is_err() {
        return Ok(None);
    }
    let key = format!("{prefix}{name}");
    let sub = format!("{key}/");
    let page = store
        .list_page(&key, Some("/"), None, None, FIND_ONE_PAGE)
        .await?;
    // The object sorts before every other key with its name as prefix.
    let file = page
        .objects
        .iter()
        .find(|o| o.key == key)
        .map(|o| ListedEntry {
            name: name.to_string(),
            kind: EntryKind::File,
            size: o.size,
            etag: o.etag.clone(),
            mtime: Some(o.last_modified),
        });
    let past = page.objects.iter().any(|o| o.key.as_str() > sub.as_str())
        || page
            .common_prefixes
            .iter()
            .any(|cp| cp.as_str() > sub.as_str());
    let dir = if page.common_prefixes.contains(&sub) {
        true
    } else if past || page.next_token.is_none() {
        false
    } else {
        let under = store.list_page(&sub, None, None, None, 1).await?;
        !under.objects.is_empty() || !under.common_prefixes.is_empty()
    };
    if !dir {
        return Ok(file);
    }
    if file.is_some() {
        warn!(key = %key.escape_debug(),
            "object shadowed by a directory of the same name; only the directory is shown");
        metrics::counter!(m::KEYS_SKIPPED, "reason" => "shadowed").increment(1);
    }
    Ok(Some(ListedEntry {
        name: name.to_string(),
        kind: EntryKind::Dir,
        size: 0,
        etag: String::new(),
        mtime: None,
    }))
}

/// Sorts `entries` of the directory at `prefix` by name bytes and keeps each
/// name once: a name that is both a file and a directory is the directory (the
/// file is shadowed, with a warning).
pub(crate) fn finalize(prefix: &str, mut entries: Vec<ListedEntry>) -> Vec<ListedEntry> {
    // A directory sorts before a file of the same name, so dedup keeps the directory.
    entries.sort_by(|a, b| {
        a.name.as_bytes().cmp(b.name.as_bytes()).then(
            (a.kind == EntryKind::Dir)
                .cmp(&(b.kind == EntryKind::Dir))
                .reverse(),
        )
    });
    entries.dedup_by(|later, first| {
        if later.name != first.name {
            return false;
        }
        if later.kind != first.kind {
            warn!(
                key = %format!("{prefix}{}", later.name),
                "object shadowed by a directory of the same name; only the directory is shown"
            );
            metrics::counter!(m::KEYS_SKIPPED, "reason" => "shadowed").increment(1);
        }
        true
    });
    entries
}

pub(crate) fn skip(key: &str, why: super::names::BadName) {
    warn!(key = %key.escape_debug(), reason = %why, "key not shown");
    metrics::counter!(m::KEYS_SKIPPED, "reason" => "bad_name").increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    #[tokio::test]
    async fn shadowing_markers_and_bad_names() {
        let s = MemStore::default();
        for k in [
            "x", "x/y", "d/", "d/e/", "a//b", "./c", "../c", "ok", "f/./g", "sp ace", "p+lus",
        ] {
            s.put(k, "1");
        }
        s.put(&format!("{}/z", "n".repeat(256)), "1");
        let root = list_dir(&s, "").await.unwrap();
        let names: Vec<_> = root.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            names,
            vec![
                // "a//b": "a" is a common prefix; its only key is not shown.
                ("a", EntryKind::Dir),
                ("d", EntryKind::Dir),
                ("f", EntryKind::Dir),
                ("ok", EntryKind::File),
                ("p+lus", EntryKind::File),
                ("sp ace", EntryKind::File),
                ("x", EntryKind::Dir),
            ]
        );
        let d = list_dir(&s, "d/").await.unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].name.as_str(), d[0].kind), ("e", EntryKind::Dir));
        assert!(list_dir(&s, "d/e/").await.unwrap().is_empty());
        assert!(
            list_dir(&s, "f/").await.unwrap().is_empty(),
            "f/./g is not shown"
        );
        assert!(
            list_dir(&s, "a/").await.unwrap().is_empty(),
            "a//b is not shown"
        );
    }

    /// `find_one` answers as the directory's listing does, for every name
    /// the listing shows and some it does not.
    #[tokio::test]
    async fn find_one_agrees_with_the_listing() {
        let s = MemStore::default();
        let mut keys: Vec<String> = ["x", "x/y", "d/", "d/e/", "a//b", "ok", "sp ace", "n"]
            .iter()
            .map(|k| k.to_string())
            .collect();
        // 40 keys between the object "n" and the prefix "n/": two pages.
        keys.extend((0..40).map(|i| format!("n.{i:02}")));
        keys.extend(["n/inner".to_string(), "n0".to_string(), "x.bak".to_string()]);
        for k in &keys {
            s.put(k, "1");
        }
        let listed = list_dir(&s, "").await.unwrap();
        for e in &listed {
            assert_eq!(find_one(&s, "", &e.name).await.unwrap().as_ref(), Some(e));
        }
        for missing in ["nope", "o", "a/", "..", "x/"] {
            assert_eq!(find_one(&s, "", missing).await.unwrap(), None, "{missing}");
        }
        let d = find_one(&s, "d/", "e").await.unwrap().unwrap();
        assert_eq!(d.kind, EntryKind::Dir);
    }
}
