//! Listing a whole tree at once (`metadata.prefetch_tree`): ListObjectsV2
//! without a delimiter, in subtrees and key ranges listed concurrently, turned
//! into the listing of every directory in the tree.
//!
//! ## Subtrees
//!
//! [`list_tree`] asks each subtree (first the mount root) for one page without
//! delimiter. A subtree that fits is done. One that does not, whose page
//! reached at most two subdirectories (so each holds about a page of keys or
//! more), is cut into its subdirectories: one delimiter page names them, and
//! each becomes a subtree of its own (1M objects in 1000 directories: ~1000
//! pages, all concurrent, no page wasted). Any other subtree (many small
//! directories, or one huge flat directory) is listed in key ranges.
//!
//! ## Key ranges (`StartAfter` splits)
//!
//! One ListObjectsV2 stream is a chain of pages: each page needs the previous
//! page's continuation token, so 100,000 keys are 100 round trips one after the
//! other, however many connections are free. A stream can instead start
//! anywhere with `StartAfter`, so [`list_ranges`] cuts the key space into
//! ranges `(after, end]`, each listed by its own stream that stops at the first
//! key past `end`. The ranges partition the key space, so their union is the
//! listing and no key is seen twice, whatever the keys are (a property test
//! checks this for keys with bytes below `/` and non-ASCII characters).
//!
//! Where to cut is learnt from the data ([`split_points`]): a range starts as
//! one stream; when its page comes back full and still inside the range, the
//! page shows which character position varies from key to key (the first
//! position where its first and last key differ) and which characters occur
//! from there on. The rest of the range is cut at coarser positions, one
//! boundary per such character: after `flat/f000999.jpg`, at `flat/f01`,
//! `flat/f02`, ... and `flat/f1`, `flat/f2`, .... A position is cut only where
//! each range is expected to hold [`MIN_RANGE_PAGES`] pages or more, and only
//! at positions whose character occurs in the varying part (not at constant
//! text like `flat/f`). Ranges are cut again as their own pages come back
//! full, while fewer than twice the concurrency are open, coarsest cuts
//! first. A page that runs past its range's end hands the keys beyond to the
//! ranges still waiting in the queue, which then start later or not at all.
//!
//! Measured with the in-memory store (`tree_listing_cost_by_shape`): 100,000
//! keys in one directory take 125 pages, 15 one after the other (instead of
//! 100); 300 x 1000 under one top-level directory 303 pages, 5 deep; 20,000
//! directories of 5 keys 128 pages, 11 deep; 50,000 hashed names 64 pages, 6
//! deep. Through a mount (tests/metadata.rs), 90,005 keys in one directory:
//! 116 LIST pages in 27 key ranges, 15 deep.

use std::collections::{HashMap, VecDeque};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Semaphore;

use super::listing::{EntryKind, ListedEntry, finalize, skip};
use super::names::check_name;
use crate::store::{MAX_KEYS_PER_PAGE, ObjectMeta, ObjectStore, StoreError};

/// Listing streams run at once. 32 keeps a LAN-attached S3 busy without
/// tripping its per-prefix request-rate limits (AWS: 5,500 GET/HEAD and 3,500
/// LIST-class requests per second per prefix).
pub const TREE_LIST_CONCURRENCY: usize = 32;

/// A key range is cut only where each piece is expected to hold at least this
/// many pages: a range can cost one page beyond its keys (the page that runs
/// past its end, or finds it empty), so 2 keeps that overhead below 50% where
/// the estimate holds (measured: 16-28%, see the module doc). 4 left 50,000
/// hashed names (3 pages per first character) uncut.
pub const MIN_RANGE_PAGES: usize = 2;

/// What a [`list_ranges`] run cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeStats {
    /// ListObjectsV2 pages requested.
    pub pages: usize,
    /// Key ranges listed (1 when nothing was split).
    pub ranges: usize,
    /// Objects found.
    pub objects: usize,
    /// Longest chain of pages that had to follow one another (each range's
    /// pages, plus the pages of the ranges it was cut from): the listing's
    /// duration in round trips when streams are free. One stream: `pages`.
    pub depth: usize,
}

/// Keys `> after` (from the prefix's first key when `None`) and `<= end` (to
/// the prefix's last key when `None`), resumed at `token` when set.
#[derive(Debug)]
struct KeyRange {
    after: Option<String>,
    end: Option<String>,
    token: Option<String>,
    /// Pages before this range's next one on its chain (see [`RangeStats::depth`]).
    depth: usize,
}

/// How a tree or a key range is listed. [`ListOpts::default`] is what the
/// mount uses; tests shrink the pages.
#[derive(Clone, Copy, Debug)]
pub struct ListOpts {
    /// ListObjectsV2 requests in flight at most, over the whole listing.
    pub concurrency: usize,
    /// MaxKeys of each request.
    pub page_keys: i32,
    /// See [`MIN_RANGE_PAGES`].
    pub min_range_pages: usize,
}

impl Default for ListOpts {
    fn default() -> Self {
        Self {
            concurrency: TREE_LIST_CONCURRENCY,
            page_keys: MAX_KEYS_PER_PAGE,
            min_range_pages: MIN_RANGE_PAGES,
        }
    }
}

/// Every key under `prefix` (no delimiter) after `start_after` (all when
/// `None`), listed in concurrent key ranges (see the module doc). `sink` gets
/// each page's keys that fall in its range, in no particular order across
/// pages; every key exactly once. With `permits`, each request holds one
/// (a limit shared with other listings).
pub async fn list_ranges<S: ObjectStore>(
    store: &S,
    prefix: &str,
    start_after: Option<String>,
    opts: ListOpts,
    permits: Option<&Semaphore>,
    mut sink: impl FnMut(Vec<ObjectMeta>),
) -> Result<RangeStats, StoreError> {
    let concurrency = opts.concurrency.max(1);
    let page_keys = opts.page_keys;
    let min_range_keys = opts.min_range_pages * page_keys.max(1) as usize;
    let mut stats = RangeStats {
        ranges: 1,
        ..RangeStats::default()
    };
    let mut queue = VecDeque::from([KeyRange {
        after: start_after,
        end: None,
        token: None,
        depth: 0,
    }]);
    let mut running = FuturesUnordered::new();
    loop {
        while running.len() < concurrency
            && let Some(r) = queue.pop_front()
        {
            running.push(async move {
                let start_after = if r.token.is_none() {
                    r.after.as_deref()
                } else {
                    None
                };
                let _permit = match permits {
                    Some(p) => Some(p.acquire().await.expect("semaphore never closed")),
                    None => None,
                };
                let page = store
                    .list_page(prefix, None, r.token.clone(), start_after, page_keys)
                    .await;
                (r, page)
            });
        }
        let Some((mut range, page)) = running.next().await else {
            return Ok(stats);
        };
        let page = page?;
        stats.pages += 1;
        range.depth += 1;
        stats.depth = stats.depth.max(range.depth);
        let mut objects = page.objects;
        let listing_ended = page.next_token.is_none();
        let page_last = objects.last().map(|o| o.key.clone());
        let inside = match &range.end {
            Some(end) => objects.partition_point(|o| o.key.as_str() <= end.as_str()),
            None => objects.len(),
        };
        let beyond = objects.split_off(inside);
        if let Some(end) = &range.end
            && (!beyond.is_empty() || listing_ended)
        {
            // The page ran past this range: it holds every key up to its last
            // (to the prefix's end when it was the last page), which is the
            // start of ranges still waiting in the queue. Hand them over.
            let covered = if listing_ended {
                None
            } else {
                page_last.as_deref()
            };
            stats.objects += donate(&mut queue, end, covered, beyond, &mut sink);
        }
        let done = listing_ended
            || page_last.as_deref() != objects.last().map(|o| o.key.as_str())
            || objects.is_empty()
            || objects.last().map(|o| &o.key) == range.end.as_ref();
        stats.objects += objects.len();
        if done {
            sink(objects);
            continue;
        }
        // A full page inside the range: more of it follows. Cut the rest?
        let open = running.len() + queue.len() + 1;
        let budget = (2 * concurrency).saturating_sub(open);
        let cuts = split_points(
            prefix,
            &objects,
            range.end.as_deref(),
            min_range_keys,
            budget,
        );
        range.token = page.next_token;
        range.after = page_last;
        if let Some(first) = cuts.first() {
            let end = range.end.replace(first.clone());
            let ends = cuts.iter().skip(1).cloned().map(Some).chain([end]);
            for (after, end) in cuts.iter().zip(ends) {
                queue.push_back(KeyRange {
                    after: Some(after.clone()),
                    end,
                    token: None,
                    depth: range.depth,
                });
                stats.ranges += 1;
            }
        }
        queue.push_front(range);
        sink(objects);
    }
}

/// Lists the whole tree under `base` (`""` or ending in `/`) and returns every
/// directory's listing (see the module doc): each subtree is first asked for
/// one page without delimiter; a subtree that does not fit in it is either cut
/// into its subdirectories (when that page showed at most two of them, so each
/// holds about a page or more: one delimiter page names them, and each becomes
/// a subtree of its own) or listed in key ranges (many small directories, or
/// one huge flat one).
pub async fn list_tree<S: ObjectStore>(
    store: &S,
    base: &str,
    opts: ListOpts,
) -> Result<(HashMap<String, Vec<ListedEntry>>, RangeStats), StoreError> {
    let permits = Semaphore::new(opts.concurrency.max(1));
    let builder = std::sync::Mutex::new(TreeBuilder::new(base));
    let mut stats = RangeStats::default();
    let mut jobs = FuturesUnordered::new();
    let subtree = |dir: String, after: Option<String>, depth: usize| {
        let (permits, builder) = (&permits, &builder);
        async move {
            subtree_job(store, permits, builder, opts, dir, after)
                .await
                .map(|(next, st)| (next, st, depth))
        }
    };
    jobs.push(subtree(base.to_string(), None, 0));
    while let Some(done) = jobs.next().await {
        let (next, st, depth) = done?;
        stats.pages += st.pages;
        stats.ranges += st.ranges;
        stats.objects += st.objects;
        stats.depth = stats.depth.max(depth + st.depth);
        for (dir, after) in next {
            jobs.push(subtree(dir, after, depth + st.depth));
        }
    }
    drop(jobs);
    let listings = builder.into_inner().expect("no panic while held").finish();
    Ok((listings, stats))
}

/// One subtree of [`list_tree`]: the keys under `dir` after `after`. Returns
/// the subtrees it was cut into (directory, start after) and its own cost.
async fn subtree_job<S: ObjectStore>(
    store: &S,
    permits: &Semaphore,
    builder: &std::sync::Mutex<TreeBuilder>,
    opts: ListOpts,
    dir: String,
    after: Option<String>,
) -> Result<(Vec<(String, Option<String>)>, RangeStats), StoreError> {
    let add = |objects: &[ObjectMeta]| {
        let mut b = builder.lock().unwrap();
        for o in objects {
            b.add(o);
        }
    };
    let mut st = RangeStats {
        ranges: 1,
        ..RangeStats::default()
    };
    let first = {
        let _p = permits.acquire().await.expect("never closed");
        store
            .list_page(&dir, None, None, after.as_deref(), opts.page_keys)
            .await?
    };
    st.pages += 1;
    st.depth += 1;
    st.objects += first.objects.len();
    add(&first.objects);
    let Some(last) = first.objects.last().map(|o| o.key.clone()) else {
        return Ok((Vec::new(), st));
    };
    if first.next_token.is_none() {
        return Ok((Vec::new(), st));
    }
    // Children of `dir` the page reached (a '/' after the name).
    let mut children: Vec<&str> = first
        .objects
        .iter()
        .filter_map(|o| {
            let rest = o.key.strip_prefix(dir.as_str())?;
            rest.find('/').map(|i| &rest[..=i])
        })
        .collect();
    children.dedup();
    if !children.is_empty() && children.len() <= 2 {
        // Big subdirectories: name them with one delimiter page.
        let page = {
            let _p = permits.acquire().await.expect("never closed");
            store
                .list_page(&dir, Some("/"), None, None, opts.page_keys)
                .await?
        };
        st.pages += 1;
        st.depth += 1;
        if page.next_token.is_none() && !page.common_prefixes.is_empty() {
            // Files of `dir` itself that the first page did not reach.
            let files: Vec<ObjectMeta> =
                page.objects.into_iter().filter(|o| o.key > last).collect();
            st.objects += files.len();
            add(&files);
            let next = page
                .common_prefixes
                .into_iter()
                .filter_map(|sub| {
                    if last.starts_with(&sub) {
                        Some((sub, Some(last.clone())))
                    } else if sub.as_str() > last.as_str() {
                        Some((sub, None))
                    } else {
                        None // wholly on the first page
                    }
                })
                .collect();
            return Ok((next, st));
        }
    }
    let ranges = list_ranges(store, &dir, Some(last), opts, Some(permits), |objects| {
        add(&objects)
    })
    .await?;
    st.pages += ranges.pages;
    st.ranges += ranges.ranges;
    st.objects += ranges.objects;
    st.depth += ranges.depth;
    Ok((Vec::new(), st))
}

/// Gives `keys` (sorted, all after `after_end`) to the queued ranges that start
/// at or after `after_end` and have not been asked for yet, when a page of the
/// range ending at `after_end` listed past it. That page covered the key space
/// up to `covered` (inclusive; `None`: to the end of the prefix), so such a
/// range is complete when it ends within it, and otherwise resumes after
/// `covered`. Returns the number of keys handed over.
fn donate(
    queue: &mut VecDeque<KeyRange>,
    after_end: &str,
    covered: Option<&str>,
    keys: Vec<ObjectMeta>,
    sink: &mut impl FnMut(Vec<ObjectMeta>),
) -> usize {
    let mut given = 0;
    queue.retain_mut(|r| {
        let Some(after) = r.after.as_deref() else {
            return true; // the first range: before this one
        };
        if after < after_end {
            return true; // before this one
        }
        let lo = keys.partition_point(|o| o.key.as_str() <= after);
        let hi = match &r.end {
            Some(end) => keys.partition_point(|o| o.key.as_str() <= end.as_str()),
            None => keys.len(),
        };
        if lo < hi {
            given += hi - lo;
            sink(keys[lo..hi].to_vec());
        }
        let complete = match (covered, r.end.as_deref()) {
            (None, _) => true,
            (Some(c), Some(end)) => c >= end,
            (Some(_), None) => false,
        };
        if !complete
            && let Some(c) = covered
            && c > after
        {
            r.after = Some(c.to_string());
            r.token = None;
        }
        !complete
    });
    given
}

/// Where to cut the rest of a key range after a full page (`page`, sorted,
/// inside the range) whose range ends at `end` (`None`: the prefix's end):
/// sorted boundaries, each after the page's last key and before `end`, at most
/// `max` of them, coarsest positions first. Empty when no cut is expected to
/// leave ranges of `min_keys` keys. Only the number of ranges (and so the
/// parallelism and the overhead) depends on these guesses, never the result.
pub fn split_points(
    prefix: &str,
    page: &[ObjectMeta],
    end: Option<&str>,
    min_keys: usize,
    max: usize,
) -> Vec<String> {
    let (Some(first), Some(last)) = (page.first(), page.last()) else {
        return Vec::new();
    };
    if max == 0 || page.len() < 2 {
        return Vec::new();
    }
    let f: Vec<char> = first.key.chars().collect();
    let l: Vec<char> = last.key.chars().collect();
    // The first position where the page's keys differ.
    let p = common_len(&f, &l);
    if p >= l.len() {
        return Vec::new();
    }
    // Characters at the varying position (which positions look like counters),
    // and at it or after it (the alphabet boundaries are drawn from).
    let mut at_p: Vec<char> = Vec::new();
    let mut alphabet: Vec<char> = Vec::new();
    for o in page {
        let mut chars = o.key.chars().skip(p);
        if let Some(c) = chars.next() {
            at_p.push(c);
            alphabet.push(c);
        }
        alphabet.extend(chars);
    }
    at_p.sort_unstable();
    at_p.dedup();
    alphabet.sort_unstable();
    alphabet.dedup();
    let rank = |c: char| alphabet.partition_point(|&a| a < c);
    let base = alphabet.len().max(2) as f64;
    // Characters of the alphabet the page spanned at position p.
    let spanned = match f.get(p) {
        Some(&c) => rank(l[p]) - rank(c) + 1,
        None => rank(l[p]) + 1,
    };
    let prefix_len = prefix.chars().count();
    let lowest = match end {
        Some(e) => common_len(&l, &e.chars().collect::<Vec<_>>()),
        None => prefix_len,
    }
    .max(prefix_len);
    // Expected keys per range when cutting at position q (p - 1 down to `lowest`).
    let mut per_range = page.len() as f64 * base / spanned.max(1) as f64;
    let mut levels = Vec::new();
    for q in (lowest..p).rev() {
        if per_range >= min_keys as f64 && alphabet.binary_search(&l[q]).is_ok() {
            levels.push(q);
        }
        per_range *= base;
    }
    let mut cuts = Vec::new();
    'levels: for &q in levels.iter().rev() {
        let head: String = l[..q].iter().collect();
        for &c in alphabet.iter().filter(|&&c| c > l[q]) {
            let cut = format!("{head}{c}");
            if end.is_some_and(|e| cut.as_str() >= e) {
                break;
            }
            if cuts.len() == max {
                break 'levels;
            }
            cuts.push(cut);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

fn common_len(a: &[char], b: &[char]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Directory listings built from the keys under a base prefix, fed in any
/// order (as [`list_ranges`] delivers them).
#[derive(Debug)]
pub struct TreeBuilder {
    base: String,
    dirs: HashMap<String, Vec<ListedEntry>>,
}

impl TreeBuilder {
    /// A builder for the tree under `base` (`""` or ending in `/`).
    pub fn new(base: &str) -> Self {
        Self {
            base: base.to_string(),
            dirs: HashMap::from([(base.to_string(), Vec::new())]),
        }
    }

    /// Adds one object: an entry in its directory, and each directory on its
    /// path (once). A key with a component that cannot be a name is cut at
    /// that component, exactly as delimiter listings show it.
    pub fn add(&mut self, obj: &ObjectMeta) {
        let Some(rest) = obj.key.strip_prefix(self.base.as_str()) else {
            return;
        };
        let mut dir = self.base.clone();
        let mut parts = rest.split('/').peekable();
        while let Some(name) = parts.next() {
            let last = parts.peek().is_none();
            if last && name.is_empty() {
                return; // "dir/" marker: the directory itself
            }
            if let Err(why) = check_name(name) {
                skip(&obj.key, why);
                return;
            }
            if last {
                self.dirs
                    .get_mut(&dir)
                    .expect("parent inserted first")
                    .push(ListedEntry {
                        name: name.to_string(),
                        kind: EntryKind::File,
                        size: obj.size,
                        etag: obj.etag.clone(),
                        mtime: Some(obj.last_modified),
                    });
                return;
            }
            let child = format!("{dir}{name}/");
            if !self.dirs.contains_key(&child) {
                self.dirs.insert(child.clone(), Vec::new());
                self.dirs
                    .get_mut(&dir)
                    .expect("parent inserted first")
                    .push(ListedEntry {
                        name: name.to_string(),
                        kind: EntryKind::Dir,
                        size: 0,
                        etag: String::new(),
                        mtime: None,
                    });
            }
            dir = child;
        }
    }

    /// Every directory reached (empty ones included): prefix -> entries,
    /// each finalized as `list_dir` would.
    pub fn finish(self) -> HashMap<String, Vec<ListedEntry>> {
        self.dirs
            .into_iter()
            .map(|(prefix, entries)| {
                let entries = finalize(&prefix, entries);
                (prefix, entries)
            })
            .collect()
    }
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
        let opts = ListOpts {
            concurrency: 4,
            page_keys: 2,
            min_range_pages: 1,
        };
        let (tree, _) = list_tree(&s, "", opts).await.unwrap();
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

    async fn collect(
        s: &MemStore,
        prefix: &str,
        concurrency: usize,
        page: i32,
        min_pages: usize,
    ) -> (Vec<String>, RangeStats) {
        let mut keys = Vec::new();
        let opts = ListOpts {
            concurrency,
            page_keys: page,
            min_range_pages: min_pages,
        };
        let stats = list_ranges(s, prefix, None, opts, None, |objs| {
            keys.extend(objs.into_iter().map(|o| o.key))
        })
        .await
        .unwrap();
        (keys, stats)
    }

    fn sorted_unique(mut keys: Vec<String>) -> Vec<String> {
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "a key was listed twice");
        keys
    }

    async fn tree_of(s: &MemStore, base: &str) -> (usize, RangeStats) {
        let (listings, st) = list_tree(s, base, ListOpts::default()).await.unwrap();
        let files = listings
            .values()
            .flatten()
            .filter(|e| e.kind == EntryKind::File)
            .count();
        assert_eq!(files, st.objects, "{st:?}");
        println!("{base:?}: {st:?}");
        (files, st)
    }

    /// Request counts and depth (round trips one after the other) of tree
    /// listings of the shapes the benchmark and the issue use.
    #[tokio::test]
    async fn tree_listing_cost_by_shape() {
        // 100,000 keys in one directory: 100 pages one after the other unsplit.
        let flat = MemStore::default();
        for i in 0..100_000 {
            flat.put(&format!("flat/f{i:06}.jpg"), "");
        }
        let (n, st) = tree_of(&flat, "").await;
        assert_eq!(n, 100_000);
        assert!(st.depth <= 16, "flat listing still sequential: {st:?}");
        assert!(st.pages <= 130, "flat listing overhead: {st:?}");
        let (_, st) = tree_of(&flat, "flat/").await;
        assert!(st.depth <= 16 && st.pages <= 130, "{st:?}");

        // 300 directories of one page each under one top-level directory.
        let tree = MemStore::default();
        for d in 0..300 {
            for f in 0..1000 {
                tree.put(&format!("train/d{d:03}/f{f:04}.jpg"), "");
            }
        }
        let (n, st) = tree_of(&tree, "").await;
        assert_eq!(n, 300_000);
        assert!(st.depth <= 8, "tree listing still sequential: {st:?}");
        assert!(st.pages <= 306, "tree listing overhead: {st:?}");

        // Many small directories: listed without delimiter, about keys/1000 pages.
        let small_dirs = MemStore::default();
        for d in 0..20_000 {
            for f in 0..5 {
                small_dirs.put(&format!("s/{d:05}/{f}"), "");
            }
        }
        let (n, st) = tree_of(&small_dirs, "").await;
        assert_eq!(n, 100_000);
        assert!(
            st.depth <= 20,
            "small directories listed one by one: {st:?}"
        );
        assert!(
            st.pages <= 130,
            "small directories cost a page each: {st:?}"
        );

        // Hashed names in one directory.
        let hex = MemStore::default();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            hex.put(&format!("h/{x:016x}"), "");
        }
        let (n, st) = tree_of(&hex, "h/").await;
        assert_eq!(n, 50_000);
        assert!(st.depth <= 12, "hashed listing still sequential: {st:?}");
        assert!(st.pages <= 70, "hashed listing overhead: {st:?}");

        // A tree of one page and one key: two pages, nothing cut.
        let small = MemStore::default();
        for d in 0..20 {
            for f in 0..50 {
                small.put(&format!("set/{d:02}/sub/{f:03}.bin"), "");
            }
        }
        small.put("top.txt", "");
        let (n, st) = tree_of(&small, "").await;
        assert_eq!(n, 1001);
        assert!(st.pages <= 3, "{st:?}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Whatever the keys (bytes below '/', non-ASCII, prefixes of each
        /// other), page size and concurrency: the ranges together list every
        /// key under the prefix exactly once.
        #[test]
        fn ranges_partition_the_listing(
            keys in proptest::collection::btree_set(
                "[\\x01-/0-9a-c~\u{7f}\u{e9}\u{65e5}\u{10FFFF}]{1,7}", 0..120),
            prefix in proptest::sample::select(vec!["", "a", "a/", "\u{e9}", "0/1"]),
            page in 2i32..6,
            concurrency in 1usize..6,
            min_pages in 0usize..3,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let s = MemStore::default();
            for k in &keys {
                s.put(k, "");
                s.put(&format!("{prefix}{k}"), "");
            }
            let (got, st) = rt.block_on(collect(&s, prefix, concurrency, page, min_pages));
            let got = sorted_unique(got);
            let mut want: Vec<String> = keys
                .iter()
                .flat_map(|k| [k.clone(), format!("{prefix}{k}")])
                .filter(|k| k.starts_with(prefix))
                .collect();
            want.sort();
            want.dedup();
            proptest::prop_assert_eq!(got, want, "{:?}", st);
        }
    }

    /// The property above does cut ranges (it is not one stream in disguise).
    #[tokio::test]
    async fn small_pages_cut_many_ranges() {
        let s = MemStore::default();
        for i in 0..500 {
            s.put(&format!("p/{i:03}-\u{e9}"), "");
            s.put(&format!("p/\u{1}{i}"), "");
        }
        let (keys, st) = collect(&s, "p/", 4, 3, 1).await;
        assert_eq!(sorted_unique(keys).len(), 1000);
        assert!(st.ranges > 10, "{st:?}");
    }

    #[test]
    fn cuts_are_after_the_page_and_before_the_end() {
        let page: Vec<ObjectMeta> = (0..1000)
            .map(|i| ObjectMeta {
                key: format!("flat/f{i:06}.jpg"),
                size: 0,
                etag: String::new(),
                last_modified: std::time::SystemTime::UNIX_EPOCH,
            })
            .collect();
        let cuts = split_points("flat/", &page, None, 4000, 100);
        assert!(cuts.contains(&"flat/f01".to_string()), "{cuts:?}");
        assert!(cuts.contains(&"flat/f1".to_string()), "{cuts:?}");
        assert!(
            !cuts.contains(&"flat/f001".to_string()),
            "one-page ranges: {cuts:?}"
        );
        assert!(cuts.iter().all(|c| c.as_str() > "flat/f000999.jpg"));
        let bounded = split_points("flat/", &page, Some("flat/f05"), 4000, 100);
        assert!(
            bounded.iter().all(|c| c.as_str() < "flat/f05"),
            "{bounded:?}"
        );
        assert!(!bounded.is_empty());
        assert!(split_points("flat/", &page, None, 4000, 0).is_empty());
        assert_eq!(split_points("flat/", &page, None, 4000, 3).len(), 3);
    }
}
