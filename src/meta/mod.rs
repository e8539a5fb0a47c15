//! Metadata: the inode table, the directory-listing cache and lookup.
//!
//! A lookup never sends a HeadObject: it lists the parent directory (every page
//! of ListObjectsV2 with delimiter `/`), caches the listing for
//! [`MetaConfig::ttl_secs`], and answers every lookup in that directory from it.
//! Concurrent lookups in one directory share one listing (single-flight, through
//! moka's `try_get_with`).

pub mod inode;
pub mod listing;
pub mod names;
pub mod tree;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

pub use inode::{Attr, InodeTable, ROOT_INO};
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
    /// At mount, list the whole tree under the mount prefix in the background
    /// (ListObjectsV2 without delimiter, per subtree and in `StartAfter` key
    /// ranges, 32 requests at once; see [`tree`]), so a walk or a loader finds
    /// every listing cached. For data sets read whole.
    pub prefetch_tree: bool,
}

impl Default for MetaConfig {
    fn default() -> Self {
        Self {
            ttl_secs: 60.0,
            kernel_ttl_secs: None,
            negative_ttl_secs: None,
            max_negative_entries: 100_000,
            max_cached_entries: 1_000_000,
            prefetch_tree: false,
        }
    }
}

fn secs(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0))
}

impl MetaConfig {
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
}

/// One directory's entries and when the store was asked for them.
#[derive(Debug)]
pub struct DirListing {
    /// Sorted, unique entries.
    pub entries: Vec<ListedEntry>,
    /// When the listing was fetched.
    pub fetched: std::time::Instant,
}

impl DirListing {
    fn new(entries: Vec<ListedEntry>) -> Self {
        Self {
            entries,
            fetched: std::time::Instant::now(),
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
        Self {
            store,
            inodes: InodeTable::new(root_prefix),
            config,
            listings,
            negative,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &MetaConfig {
        &self.config
    }

    /// The listing of the directory at `prefix`, from the cache when fresh.
    /// Concurrent callers for one directory share one listing.
    /// Errors: the store's, after its retries.
    pub async fn listing(&self, prefix: &str) -> Result<Listing, StoreError> {
        if self.config.ttl().is_zero() {
            return Ok(Arc::new(DirListing::new(
                timed_list(&*self.store, prefix).await?,
            )));
        }
        if let Some(hit) = self.listings.get(prefix).await {
            metrics::counter!(m::META_LISTING_CACHE, "result" => "hit").increment(1);
            return Ok(hit);
        }
        metrics::counter!(m::META_LISTING_CACHE, "result" => "miss").increment(1);
        let store = self.store.clone();
        let key = prefix.to_string();
        self.listings
            .try_get_with(prefix.to_string(), async move {
                timed_list(&*store, &key)
                    .await
                    .map(|e| Arc::new(DirListing::new(e)))
            })
            .await
            .map_err(|e| (*e).clone())
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
        let listing = self.listing(prefix).await?;
        let entries = &listing.entries;
        let found = entries
            .binary_search_by(|e| e.name.as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| entries[i].clone());
        if found.is_none() && use_negative {
            metrics::counter!(m::META_NEGATIVE_CACHE, "result" => "miss").increment(1);
            self.negative.insert(negative_key, listing.fetched);
        }
        Ok(found)
    }

    /// Lists the whole tree under `prefix` in concurrent key ranges (see
    /// [`tree`]) and caches the listing of every directory in it.
    pub async fn prefetch_tree(&self, prefix: &str) -> Result<tree::RangeStats, StoreError> {
        let (listings, stats) =
            tree::list_tree(&*self.store, prefix, tree::ListOpts::default()).await?;
        for (p, entries) in listings {
            self.listings
                .insert(p, Arc::new(DirListing::new(entries)))
                .await;
        }
        Ok(stats)
    }
}

/// [`listing::list_dir`] with its latency recorded.
async fn timed_list<S: ObjectStore>(
    store: &S,
    prefix: &str,
) -> Result<Vec<ListedEntry>, StoreError> {
    let start = std::time::Instant::now();
    let result = listing::list_dir(store, prefix).await;
    metrics::histogram!(m::META_LISTING_SECONDS).record(start.elapsed().as_secs_f64());
    result
}
