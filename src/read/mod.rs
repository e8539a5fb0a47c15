//! The read path: ranged GETs pinned to the ETag seen at open, sequential
//! read-ahead per open file ([`reader`]), and one memory budget for all
//! read-ahead ([`budget`]).

pub mod budget;
pub mod part;
pub mod reader;
pub mod small;

use serde::Deserialize;

pub use budget::MemoryBudget;
pub use part::PendingRead;
pub use reader::Reader;

/// Read-path settings (`[read]` in the config file). Sizes in bytes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReadConfig {
    /// Largest single ranged GET. 8 MiB keeps per-request overhead under a few
    /// percent at loopback/LAN speeds while one failed part costs little to retry.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub part_size: u64,
    /// Window after open or a seek: what a random read fetches at least.
    /// 64 KiB: a random 4 KiB read costs about what a 4 KiB GET costs (the
    /// benchmark measured 256 KiB random GETs at ~0.6x the rate of 4 KiB ones,
    /// bench/RESULTS.md), while a Parquet footer or a tar header still fits.
    /// Sequential readers double it from here.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub initial_window: u64,
    /// Largest read-ahead window of one stream of reads (an open file has up
    /// to [`reader::MAX_STREAMS`]). 64 MiB is 8 parts in flight,
    /// enough to fill a 10 Gbit/s link at 50 ms per GET.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub max_window: u64,
    /// Most ranged GETs of read-ahead one stream of reads has in flight at once.
    /// 8 = `max_window / part_size` with the defaults: the window is fetched
    /// as 8 concurrent parts, each on its own connection, which filled the
    /// 10 Gbit/s, 2 ms link profile of bench/ (the raw client filled it with
    /// 4). Parts a reader is waiting for are sent regardless.
    pub max_concurrent_gets: usize,
    /// Memory all read-ahead may hold at once, bytes. `None`: 1/16 of physical
    /// memory, between 256 MiB and 8 GiB ([`budget::default_budget_bytes`]).
    /// When it is used up, windows stop growing instead of allocating.
    #[serde(deserialize_with = "crate::config::byte_size::option::deserialize")]
    pub memory_budget: Option<u64>,
    /// Kernel read-ahead for the mount (`/sys/class/bdi/<dev>/read_ahead_kb`),
    /// bytes. The FUSE default of 128 KiB means one request to lakemount per
    /// 128 KiB read; 1 MiB lets the kernel send 1 MiB reads (the FUSE request
    /// limit is 256 pages, `fuse_max_pages_limit`). 0: leave the kernel's value.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub kernel_read_ahead: u64,
    /// Files of at least this many bytes bypass the kernel page cache
    /// (FOPEN_DIRECT_IO): each read(2) comes to lakemount and is answered
    /// straight into the reader's buffer from read-ahead, one copy fewer than
    /// through the page cache, which a shard read once per epoch would only
    /// pass through (and push other pages out of). Such files report
    /// `st_blksize` 1 MiB so readers that size their buffer from it (Python's
    /// `open`, coreutils; not glibc stdio) send large reads; small reads are
    /// where the page cache is better (the kernel turns them into 1 MiB
    /// requests), hence the size floor. mmap still works
    /// (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6+; on older kernels every file
    /// uses the page cache). 64 MiB: shards (100 MB-10 GB) go direct, samples
    /// and small files stay cached. 0: every file uses the page cache.
    /// Measured in bench/RESULTS.md; docs/READAHEAD.md.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub direct_io_min_size: u64,
    /// Small-object read-ahead ([`small`]): objects of at most this many
    /// bytes count as small; when one is read from S3 by its own reader, the
    /// other small objects of its directory are fetched in the background.
    /// 1 MiB: one sample per file (JPEG, JSON, audio clips: 4 KB-1 MB) is
    /// small, a shard (100 MB+) is not, and one GET fetches it whole. 0: off.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub small_max_size: u64,
    /// Small-object prefetch GETs in flight at once, 1-1024. 512: at a
    /// 10-30 ms first byte, 17,000-51,000 objects/s, above what a single
    /// server node serves, so the prefetch phase of a shuffled epoch ends
    /// sooner; 256 and fewer left the epoch latency-bound (docs/READAHEAD.md).
    /// A server that cannot keep up only queues them.
    pub small_max_in_flight: usize,
    /// Bytes of small objects prefetched but not opened yet, at most. They
    /// are held in memory and also reserved from `memory_budget`. `None`: a
    /// quarter of `memory_budget`. When it is full, prefetch waits for opens
    /// instead of dropping unread objects.
    #[serde(deserialize_with = "crate::config::byte_size::option::deserialize")]
    pub small_budget: Option<u64>,
    /// No FUSE open or release requests (read-only mounts): the first open
    /// is answered ENOSYS, after which the kernel opens files without asking
    /// lakemount and keeps their page cache (FUSE no-open support, Linux
    /// 4.19+). A loader's small file then costs its read alone instead of
    /// open, read (or page-cache fill) and release; with a data cache,
    /// prefetched small objects are put in the page cache as they arrive,
    /// and their reads cost no request. What is given up, for
    /// every file of the mount: FUSE passthrough of cached files and direct
    /// I/O for large ones (`direct_io_min_size`), since both are chosen at
    /// open. Off by default; for mounts of small-file data sets
    /// (docs/READAHEAD.md, "Mounts without opens").
    pub no_open: bool,
}

impl Default for ReadConfig {
    fn default() -> Self {
        Self {
            part_size: 8 << 20,
            initial_window: 64 << 10,
            max_window: 64 << 20,
            max_concurrent_gets: 8,
            memory_budget: None,
            kernel_read_ahead: 1 << 20,
            direct_io_min_size: 64 << 20,
            small_max_size: 1 << 20,
            small_max_in_flight: 512,
            small_budget: None,
            no_open: false,
        }
    }
}

impl ReadConfig {
    /// The memory budget in force, bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.memory_budget
            .unwrap_or_else(budget::default_budget_bytes)
    }

    /// The small-object budget in force, bytes, given the memory budget
    /// `budget_total`: `small_budget`, or a quarter of the memory budget;
    /// never more than the memory budget.
    pub fn small_budget_bytes(&self, budget_total: u64) -> u64 {
        self.small_budget
            .unwrap_or(budget_total / 4)
            .min(budget_total)
    }
}
