//! Metadata: the inode table, the directory-listing cache and lookup.
//!
//! A lookup never sends a HeadObject: it lists the parent directory (every page
//! of ListObjectsV2 with delimiter `/`), caches the listing for
//! [`MetaConfig::ttl_secs`], and answers every lookup in that directory from it.
//! Concurrent lookups in one directory share one listing (single-flight, through
//! moka's `try_get_with`).
//!
//! A directory with more than [`MetaConfig::max_dir_entries`] entries is too
//! large to cache: its listing is given up at that many entries and the
//! directory is remembered as huge for the TTL. A lookup in it then sends
//! one ListObjectsV2 with the name's key as prefix ([`listing::find_one`]:
//! 1 request instead of ceil(N/1000)), as every lookup does with a TTL of
//! 0; opendir lists it for the directory handle only, never into the cache.

pub mod inode;
pub mod listing;
pub mod names;
pub mod tree;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tracing::warn;

pub use inode::{Attr, CachedPages, InodeTable, ROOT_INO};
pub use listing::{EntryKind, ListedEntry};

use crate::store::{ObjectStore, StoreError};
use crate::telemetry::metrics as m;

/// Metadata cache settings (`[metadata]` in the config file).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// How long a directory listing (and so every attribute and every "no such
    /// name" answer from it) is trusted, seconds. A data lake is read-mostly:
    /// 60 s means an object added or replaced in S3 shows within two minutes
    /// (this TTL plus the kernel's entry TTL stacked on it), while
    /// an epoch over a million files costs one LIST per 1000 files per minute at
    /// most. 0: every lookup lists again.
    pub ttl_secs: f64,
    /// How long the kernel may cache entries and attributes without asking,
    /// seconds (FUSE entry_timeout / attr_timeout). Unset: `ttl_secs`.
    pub kernel_ttl_secs: Option<f64>,
    /// How long a name found missing stays missing, seconds, in lakemount's
    /// negative cache and the kernel's (a negative dentry). Unset: `ttl_secs`.
    pub negative_ttl_secs: Option<f64>,
    /// Names held in the negative cache at most.
    pub max_negative_entries: u64,
    /// Directory entries held in cached listings at most, summed over all
    /// directories. One entry took 338 bytes of RSS with 24-byte names
    /// (`cargo run --release --example meta_memory`, docs/OPERATIONS.md), so
    /// the default of 1M is ~340 MB at most.
    pub max_cached_entries: u64,
    /// A directory listing more entries than this is not cached: lookups in it
    /// use HeadObject + a one-key ListObjectsV2, and each opendir lists it for
    /// itself (docs/OPERATIONS.md, "Huge directories"). Capped at
    /// `max_cached_entries`. 250,000 entries (~85 MB of listing cache) take
    /// 250 LIST pages to find out: a lookup waits at most that long before its
    /// HEAD, and a directory of the 100,000 files a loader typically reads is
    /// still listed and cached whole. 0: every lookup uses HeadObject +
    /// ListObjectsV2 (no directory is listed for a lookup).
    pub max_dir_entries: u64,
    /// At mount, list the whole tree under the mount prefix in the background
    /// (ListObjectsV2 without delimiter, per subtree and in `StartAfter` key
    /// ranges, 32 requests at once; see [`tree`]), so a walk or a loader finds
    /// every listing cached. For data sets read whole.
    pub prefetch_tree: bool,
    /// Stale-if-error: how long past `ttl_secs` a directory's last listing is
    /// still served when listing it again fails with a server or network
    /// fault (5xx, throttling, timeouts, refused connections: the server is
    /// down or failing), seconds. Cached files of such a directory keep
    /// reading meanwhile. 3600: an outage of up to an hour does not stop a
    /// training job whose data is cached. 0: never (the fault is EIO).
    pub stale_if_error_secs: f64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        Self {
            ttl_secs: 60.0,
            kernel_ttl_secs: None,
            negative_ttl_secs: None,
            max_negative_entries: 100_000,
            max_cached_entries: 1_000_000,
            max_dir_entries: 250_000,
            prefetch_tree: false,
            stale_if_error_secs: 3600.0,
        }
    }
}

fn secs(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0))
}

impl MetaConfig {
    /// How long past the TTL a last listing is served while listing fails.
    pub fn stale_if_error(&self) -> Duration {
        secs(self.stale_if_error_secs)
    }

    /// Listing TTL.
    pub fn ttl(&self) -> Duration {
        secs(self.ttl_secs)
    }

    /// Kernel entry/attribute timeout.
    pub fn kernel_ttl(&self) -> Duration {
        secs(self.kernel_ttl_secs.unwrap_or(self.ttl_secs))
    }

    /// Negative-lookup TTL (lakemount's cache and the kernel's).
    pub fn negative_ttl(&self) -> Duration {
        secs(self.negative_ttl_secs.unwrap_or(self.ttl_secs))
    }

    /// Entries above which a directory is not cached (`max_dir_entries`,
    /// at most `max_cached_entries`).
    pub fn huge_dir_entries(&self) -> usize {
        self.max_dir_entries
            .min(self.max_cached_entries)
            .try_into()
            .unwrap_or(usize::MAX)
    }
}

/// One directory's entries and when the store was asked for them.
#[derive(Debug)]
pub struct DirListing {
    /// Sorted, unique entries.
    pub entries: Vec<ListedEntry>,
    /// When the listing was fetched.
    pub fetched: std::time::Instant,
    /// Set once it is served past its TTL because listing again failed
    /// (stale-if-error): it no longer shows that a name is missing.
    pub served_stale: std::sync::atomic::AtomicBool,
}

impl DirListing {
    /// `entries` (sorted by name bytes, unique) as of `listing`: its fetch
    /// time and stale flag (a listing with local changes merged in).
    pub fn like(listing: &DirListing, entries: Vec<ListedEntry>) -> Self {
        Self {
            entries,
            fetched: listing.fetched,
            served_stale: std::sync::atomic::AtomicBool::new(
                listing
                    .served_stale
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
        }
    }

    /// A listing of `entries` (sorted by name bytes, unique), fetched now.
    fn new(entries: Vec<ListedEntry>) -> Self {
        Self {
            entries,
            fetched: std::time::Instant::now(),
            served_stale: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

type Listing = Arc<DirListing>;

/// Listings of directories, cached by key prefix, and the negative cache.
pub struct Meta<S> {
    store: Arc<S>,
    config: MetaConfig,
    listings: moka::future::Cache<String, Listing>,
    /// (directory prefix, name) found missing -> when the listing that showed
    /// it missing was fetched (the entry is trusted for the negative TTL from then).
    negative: moka::sync::Cache<(String, String), std::time::Instant>,
    /// Directories found to hold more than `max_dir_entries`, for the TTL.
    huge: moka::sync::Cache<String, ()>,
    /// The last listing fetched of each directory, for the TTL plus
    /// [`MetaConfig::stale_if_error`] (the same `Arc`s as `listings`).
    last_good: moka::sync::Cache<String, Listing>,
    /// Directories changed on this mount -> when (for the TTL): a cached
    /// listing fetched before is not used.
    changed: moka::sync::Cache<String, std::time::Instant>,
    /// Whether stale listings are being served now: warned once per outage.
    outage: std::sync::atomic::AtomicBool,
    /// The inode table.
    pub inodes: InodeTable,
}

impl<S: ObjectStore> Meta<S> {
    /// A metadata layer over `store`; `root_prefix` is `""` or ends with `/`.
    pub fn new(store: Arc<S>, config: MetaConfig, root_prefix: &str) -> Self {
        let listings = moka::future::Cache::builder()
            .max_capacity(config.max_cached_entries.max(1))
            .weigher(|_: &String, v: &Listing| {
                v.entries.len().saturating_add(1).min(u32::MAX as usize) as u32
            })
            .time_to_live(config.ttl().max(Duration::from_millis(1)))
            .build();
        let negative = moka::sync::Cache::builder()
            .max_capacity(config.max_negative_entries.max(1))
            .time_to_live(config.negative_ttl().max(Duration::from_millis(1)))
            .build();
        let huge = moka::sync::Cache::builder()
            .max_capacity(MAX_HUGE_DIRS)
            .time_to_live(config.ttl().max(Duration::from_millis(1)))
            .build();
        let last_good = moka::sync::Cache::builder()
            .max_capacity(config.max_cached_entries.max(1))
            .weigher(|_: &String, v: &Listing| {
                v.entries.len().saturating_add(1).min(u32::MAX as usize) as u32
            })
            .time_to_live((config.ttl() + config.stale_if_error()).max(Duration::from_millis(1)))
            .build();
        let changed = moka::sync::Cache::builder()
            .max_capacity(config.max_negative_entries.max(1))
            .time_to_live(config.ttl().max(Duration::from_millis(1)))
            .build();
        Self {
            store,
            inodes: InodeTable::new(root_prefix),
            config,
            listings,
            negative,
            huge,
            last_good,
            changed,
            outage: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &MetaConfig {
        &self.config
    }

    /// The listing of the directory at `prefix`, from the cache when fresh.
    /// Concurrent callers for one directory share one listing. A directory too
    /// large to cache is listed whole for this caller alone.
    /// Errors: the store's, after its retries.
    pub async fn listing(&self, prefix: &str) -> Result<Listing, StoreError> {
        match self.cached_listing(prefix).await? {
            Some(listing) => Ok(listing),
            None => Ok(Arc::new(DirListing::new(
                timed_list(&*self.store, prefix, usize::MAX, None)
                    .await?
                    .expect("no limit"),
            ))),
        }
    }

    /// The listing of `prefix` when the cache holds it now, without asking
    /// the store (`None` otherwise: not listed yet, expired, too large).
    pub async fn listing_if_cached(&self, prefix: &str) -> Option<Listing> {
        self.listings.get(prefix).await
    }

    /// The cached (or now fetched and cached) listing of `prefix`; `None` when
    /// the directory holds more than `max_dir_entries` entries.
    async fn cached_listing(&self, prefix: &str) -> Result<Option<Listing>, StoreError> {
        if self.huge.contains_key(prefix) {
            return Ok(None);
        }
        let limit = self.config.huge_dir_entries();
        if self.config.ttl().is_zero() {
            let listed = timed_list(&*self.store, prefix, limit, None).await?;
            return Ok(listed.map(|e| Arc::new(DirListing::new(e))));
        }
        if let Some(hit) = self.listings.get(prefix).await {
            // A listing that was under way when this directory changed on
            // this mount may have been cached after the change dropped the
            // old one: it is older than the change, so list again.
            let changed = self.changed.get(prefix);
            if changed.is_none_or(|t| hit.fetched > t) {
                metrics::counter!(m::META_LISTING_CACHE, "result" => "hit").increment(1);
                return Ok(Some(hit));
            }
            self.listings.invalidate(prefix).await;
        }
        metrics::counter!(m::META_LISTING_CACHE, "result" => "miss").increment(1);
        let store = self.store.clone();
        let key = prefix.to_string();
        // With a last listing that may be served instead, a page with no
        // answer for STALE_WAIT counts as a failed refresh (served stale
        // below): a server that takes connections and answers nothing would
        // otherwise hold every lookup here until the request deadline.
        // Once one refresh found S3 failing, the next (another directory of
        // the same path, say) wait less.
        let outage = self.outage.load(std::sync::atomic::Ordering::Relaxed);
        let page_wait = self.fallback(prefix).map(|_| {
            if outage {
                STALE_WAIT_IN_OUTAGE
            } else {
                STALE_WAIT
            }
        });
        let result = self
            .listings
            .try_get_with(prefix.to_string(), async move {
                let started = std::time::Instant::now();
                match timed_list(&*store, &key, limit, page_wait).await {
                    Ok(Some(e)) => Ok(Arc::new(DirListing {
                        entries: e,
                        // When asked: a change after that may be missing.
                        fetched: started,
                        served_stale: std::sync::atomic::AtomicBool::new(false),
                    })),
                    Ok(None) => Err(None),
                    Err(e) => Err(Some(e)),
                }
            })
            .await;
        match result {
            Ok(listing) => {
                if !self.config.stale_if_error().is_zero() {
                    self.fetched_fine(prefix, &listing);
                }
                Ok(Some(listing))
            }
            Err(e) => match &*e {
                Some(store_error) => match self.stale_listing(prefix, store_error).await {
                    Some(stale) => Ok(Some(stale)),
                    None => Err(store_error.clone()),
                },
                None => {
                    if !self.huge.contains_key(prefix) {
                        warn!(prefix = %prefix.escape_debug(), max_dir_entries = limit,
                            "directory too large to cache: lookups in it list the name alone");
                        metrics::counter!(m::META_HUGE_DIRS).increment(1);
                        self.huge.insert(prefix.to_string(), ());
                    }
                    Ok(None)
                }
            },
        }
    }

    /// Keeps `listing` of `prefix` as its last good one; ends an outage.
    fn fetched_fine(&self, prefix: &str, listing: &Listing) {
        let held = self.last_good.get(prefix);
        if held.is_none_or(|h| !Arc::ptr_eq(&h, listing)) {
            self.last_good.insert(prefix.to_string(), listing.clone());
        }
        if self
            .outage
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!("S3 answers listings again: stale listings no longer served");
        }
    }

    /// The last good listing of `prefix`, when it may still be served in
    /// place of a new one: at most the TTL plus
    /// [`MetaConfig::stale_if_error`] old.
    fn fallback(&self, prefix: &str) -> Option<Listing> {
        if self.config.stale_if_error().is_zero() {
            return None;
        }
        let old = self.last_good.get(prefix)?;
        (old.fetched.elapsed() <= self.config.ttl() + self.config.stale_if_error()).then_some(old)
    }

    /// The last good listing of `prefix` ([`Self::fallback`]) when listing
    /// it failed with a server or network fault (`err`), served for the
    /// next TTL; warns once per outage.
    async fn stale_listing(&self, prefix: &str, err: &StoreError) -> Option<Listing> {
        if !matches!(err, StoreError::Transient(_) | StoreError::Throttled(_)) {
            return None;
        }
        let old = self.fallback(prefix)?;
        old.served_stale
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // Served for the next TTL without asking again: one failing refresh
        // per directory per TTL, not one per lookup.
        self.listings.insert(prefix.to_string(), old.clone()).await;
        metrics::counter!(m::META_STALE_LISTINGS).increment(1);
        if !self.outage.swap(true, std::sync::atomic::Ordering::Relaxed) {
            warn!(
                prefix = %prefix.escape_debug(),
                error = %err,
                stale_if_error_secs = self.config.stale_if_error_secs,
                "listing failed: serving the last listings past their TTL until S3 answers \
                 (cached files keep reading; others fail with EIO)"
            );
        }
        Some(old)
    }

    /// Drops the cached listing of `prefix` and the negative entry of
    /// `name` in it (a change made on this mount), so the next lookup lists
    /// again.
    pub async fn invalidate(&self, prefix: &str, name: &str) {
        self.changed
            .insert(prefix.to_string(), std::time::Instant::now());
        self.listings.invalidate(prefix).await;
        self.last_good.invalidate(prefix);
        self.negative
            .invalidate(&(prefix.to_string(), name.to_string()));
    }

    /// Drops every cached listing and negative entry (a directory renamed
    /// on this mount changes many).
    pub fn invalidate_all(&self) {
        self.listings.invalidate_all();
        self.last_good.invalidate_all();
        self.negative.invalidate_all();
    }

    /// Finds `name` in the directory at `prefix`. `Ok(None)`: no such entry
    /// (remembered in the negative cache for the negative TTL).
    pub async fn find(&self, prefix: &str, name: &str) -> Result<Option<ListedEntry>, StoreError> {
        let negative_key = (prefix.to_string(), name.to_string());
        let use_negative = !self.config.negative_ttl().is_zero();
        let negative_ttl = self.config.negative_ttl();
        if use_negative
            && let Some(seen) = self.negative.get(&negative_key)
            && seen.elapsed() < negative_ttl
        {
            metrics::counter!(m::META_NEGATIVE_CACHE, "result" => "hit").increment(1);
            return Ok(None);
        }
        // With a TTL of 0 a listing serves one lookup: one name is asked.
        let listing = if self.config.ttl().is_zero() {
            None
        } else {
            self.cached_listing(prefix).await?
        };
        let (found, as_of) = match listing {
            Some(listing) => {
                let entries = &listing.entries;
                let found = entries
                    .binary_search_by(|e| e.name.as_bytes().cmp(name.as_bytes()))
                    .ok()
                    .map(|i| entries[i].clone());
                // A stale listing (served while S3 fails) shows what was
                // there, not that a name is missing now: no ENOENT from it.
                let stale = listing
                    .served_stale
                    .load(std::sync::atomic::Ordering::Relaxed);
                if found.is_none() && stale {
                    return Err(StoreError::Transient(format!(
                        "{name:?} is not in the last listing of {prefix:?}, and S3 cannot be \
                         asked now"
                    )));
                }
                (found, listing.fetched)
            }
            None => {
                let asked = std::time::Instant::now();
                (self.find_direct(prefix, name).await?, asked)
            }
        };
        if found.is_none() && use_negative {
            metrics::counter!(m::META_NEGATIVE_CACHE, "result" => "miss").increment(1);
            self.negative.insert(negative_key, as_of);
        }
        Ok(found)
    }

    /// Looks `name` up without listing its directory
    /// ([`listing::find_one`]): in a directory too large to cache, and with
    /// a TTL of 0 (nothing to cache a listing for).
    async fn find_direct(
        &self,
        prefix: &str,
        name: &str,
    ) -> Result<Option<ListedEntry>, StoreError> {
        metrics::counter!(m::META_DIRECT_LOOKUPS).increment(1);
        listing::find_one(&*self.store, prefix, name).await
    }

    /// Lists the whole tree under `prefix` in concurrent key ranges (see
    /// [`tree`]) and caches the listing of every directory in it.
    pub async fn prefetch_tree(&self, prefix: &str) -> Result<tree::RangeStats, StoreError> {
        let (listings, stats) =
            tree::list_tree(&*self.store, prefix, tree::ListOpts::default()).await?;
        let limit = self.config.huge_dir_entries();
        for (p, entries) in listings {
            if entries.len() > limit {
                metrics::counter!(m::META_HUGE_DIRS).increment(1);
                self.huge.insert(p, ());
                continue;
            }
            let listing = Arc::new(DirListing::new(entries));
            if !self.config.stale_if_error().is_zero() {
                self.last_good.insert(p.clone(), listing.clone());
            }
            self.listings.insert(p, listing).await;
        }
        Ok(stats)
    }
}

/// Directories remembered as too large to cache, at most. Each is one prefix
/// string; 10,000 of them are a few hundred KB.
const MAX_HUGE_DIRS: u64 = 10_000;

/// How long a refresh of a directory's listing waits for each LIST page
/// when its last listing may still be served ([`Meta::fallback`]): a page
/// with no answer by then fails the refresh, and the last listing is served
/// as while S3 fails. A page of 1,000 keys takes milliseconds to a few
/// hundred on a sound server; a server that takes the connection and
/// answers nothing would otherwise hold every lookup in the directory until
/// `s3.request_deadline_secs`.
const STALE_WAIT: Duration = Duration::from_secs(5);

/// [`STALE_WAIT`] while stale listings are served already (an outage is
/// known): each directory of a path would otherwise cost a lookup 5 s.
const STALE_WAIT_IN_OUTAGE: Duration = Duration::from_secs(1);

/// [`listing::list_dir_upto`] with its latency recorded.
async fn timed_list<S: ObjectStore>(
    store: &S,
    prefix: &str,
    max_entries: usize,
    page_wait: Option<Duration>,
) -> Result<Option<Vec<ListedEntry>>, StoreError> {
    let start = std::time::Instant::now();
    let result = listing::list_dir_upto(store, prefix, max_entries, page_wait).await;
    metrics::histogram!(m::META_LISTING_SECONDS).record(start.elapsed().as_secs_f64());
    result
}
