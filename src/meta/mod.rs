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

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

pub use inode::{Attr, InodeTable, ROOT_INO};
pub use listing::{EntryKind, ListedEntry};

use crate::store::{ObjectStore, StoreError};

/// Metadata cache settings (`[metadata]` in the config file).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// How long a directory listing (and so every attribute and every "no such
    /// name" answer from it) is trusted, seconds. A data lake is read-mostly:
    /// 60 s means an object added or replaced in S3 shows within a minute, while
    /// an epoch over a million files costs one LIST per 1000 files per minute at
    /// most. 0: every lookup lists again.
    pub ttl_secs: f64,
    /// How long the kernel may cache entries and attributes without asking,
    /// seconds (FUSE entry_timeout / attr_timeout). Defaults to `ttl_secs`.
    pub kernel_ttl_secs: Option<f64>,
    /// Directory listings kept at most (each holds every entry of one directory).
    pub max_cached_dirs: u64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        Self {
            ttl_secs: 60.0,
            kernel_ttl_secs: None,
            max_cached_dirs: 10_000,
        }
    }
}

impl MetaConfig {
    /// Listing TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs_f64(self.ttl_secs.max(0.0))
    }

    /// Kernel entry/attribute timeout.
    pub fn kernel_ttl(&self) -> Duration {
        Duration::from_secs_f64(self.kernel_ttl_secs.unwrap_or(self.ttl_secs).max(0.0))
    }
}

/// Listings of directories, cached by key prefix.
pub struct Meta<S> {
    store: Arc<S>,
    config: MetaConfig,
    listings: moka::future::Cache<String, Arc<Vec<ListedEntry>>>,
    /// The inode table.
    pub inodes: InodeTable,
}

impl<S: ObjectStore> Meta<S> {
    /// A metadata layer over `store`; `root_prefix` is `""` or ends with `/`.
    pub fn new(store: Arc<S>, config: MetaConfig, root_prefix: &str) -> Self {
        let listings = moka::future::Cache::builder()
            .max_capacity(config.max_cached_dirs.max(1))
            .time_to_live(config.ttl().max(Duration::from_millis(1)))
            .build();
        Self {
            store,
            inodes: InodeTable::new(root_prefix),
            config,
            listings,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &MetaConfig {
        &self.config
    }

    /// The listing of the directory at `prefix`, from the cache when fresh.
    /// Errors: the store's, after its retries.
    pub async fn listing(&self, prefix: &str) -> Result<Arc<Vec<ListedEntry>>, StoreError> {
        if self.config.ttl().is_zero() {
            return Ok(Arc::new(listing::list_dir(&*self.store, prefix).await?));
        }
        let store = self.store.clone();
        let key = prefix.to_string();
        self.listings
            .try_get_with(prefix.to_string(), async move {
                listing::list_dir(&*store, &key).await.map(Arc::new)
            })
            .await
            .map_err(|e| (*e).clone())
    }

    /// Finds `name` in the directory at `prefix`. `Ok(None)`: no such entry.
    pub async fn find(&self, prefix: &str, name: &str) -> Result<Option<ListedEntry>, StoreError> {
        let entries = self.listing(prefix).await?;
        Ok(entries
            .binary_search_by(|e| e.name.as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| entries[i].clone()))
    }
}
