//! Metric names (Prometheus style, unit in the name) and the recorder.
//!
//! A Prometheus recorder is always installed so that the shutdown summary can
//! read the counters; `/metrics` is served only when `telemetry.metrics_addr` is set.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Counter: S3 requests, labels `op` (LIST, HEAD, GET) and `status` (HTTP
/// status code, or `network` / `timeout` / `error` when no response arrived).
pub const S3_REQUESTS: &str = "lakemount_s3_requests_total";
/// Histogram: latency of one S3 request including SDK retries, seconds; label `op`.
pub const S3_REQUEST_SECONDS: &str = "lakemount_s3_request_duration_seconds";
/// Histogram: time from a GET's attempt to its response headers (the
/// server's time to first byte, plus the network), an error answer's or a
/// timeout's included, seconds; label `op`.
pub const S3_FIRST_BYTE_SECONDS: &str = "lakemount_s3_first_byte_seconds";
/// Counter: S3 request attempts that failed and were tried again, labels
/// `op` and `cause` (the failed attempt's HTTP status, or `network`,
/// `timeout`, `stall`, `short_body`, `credentials`). A resumed GET body
/// counts here too.
pub const S3_RETRIES: &str = "lakemount_s3_retries_total";
/// Counter: hedged requests (a second request sent when the first was late,
/// `store/hedge.rs`), labels `op` (GET, LIST) and `won`: `hedge` when the second answered first,
/// `first` when the first still did, `failed` when the second failed first.
pub const S3_HEDGES: &str = "lakemount_s3_hedges_total";
/// Gauge: the current hedge delay, seconds, label `op` (the 95th
/// percentile of recent GETs' time to headers or LISTs' time, 10 ms to 2 s).
pub const S3_HEDGE_DELAY: &str = "lakemount_s3_hedge_delay_seconds";
/// [`S3_HEDGES`] label: the hedged request answered first.
pub const HEDGE_WON: &str = "hedge";
/// [`S3_HEDGES`] label: the first request answered first after all.
pub const HEDGE_FIRST_WON: &str = "first";
/// [`S3_HEDGES`] label: the hedged request failed while the first was
/// still waiting (which is then waited for).
pub const HEDGE_FAILED: &str = "failed";
/// Counter: bytes received in GET bodies.
pub const S3_GET_BYTES: &str = "lakemount_s3_get_bytes_total";
/// Counter: bytes sent in PutObject and UploadPart bodies (once per
/// request that succeeded, not per attempt).
pub const S3_SENT_BYTES: &str = "lakemount_s3_sent_bytes_total";
/// Gauge: files in staging on a writable mount (written, not yet handed
/// over to S3).
pub const WRITE_STAGED_FILES: &str = "lakemount_write_staged_files";
/// Gauge: bytes staged files hold (queued for upload or uploading).
pub const WRITE_STAGED_BYTES: &str = "lakemount_write_staged_bytes";
/// Gauge: uploads of staged files in flight.
pub const WRITE_UPLOADS_IN_FLIGHT: &str = "lakemount_write_uploads_in_flight";
/// Histogram: time to upload one staged file (PutObject or the whole
/// multipart upload), seconds.
pub const WRITE_UPLOAD_SECONDS: &str = "lakemount_write_upload_duration_seconds";
/// Counter: uploads of staged files that failed after the store's retries
/// (each is logged as an error naming the file and tried again later).
pub const WRITE_UPLOAD_FAILURES: &str = "lakemount_write_upload_failures_total";
/// Counter: opens of staged files served by FUSE passthrough (the kernel
/// then reads and writes the data file in staging; those bytes are not in
/// `lakemount_fuse_write_bytes_total`).
pub const WRITE_PASSTHROUGH_OPENS: &str = "lakemount_write_passthrough_opens_total";
/// Counter: bytes taken by FUSE write requests (into staging).
pub const FUSE_WRITE_BYTES: &str = "lakemount_fuse_write_bytes_total";
/// Counter: bytes returned to FUSE read requests.
pub const FUSE_READ_BYTES: &str = "lakemount_fuse_read_bytes_total";
/// Counter: opens answered with FOPEN_DIRECT_IO (files of at least
/// `read.direct_io_min_size` bytes): their reads bypass the page cache.
pub const FUSE_DIRECT_IO_OPENS: &str = "lakemount_fuse_direct_io_opens_total";
/// Counter: small objects put in the kernel page cache (FUSE_NOTIFY_STORE),
/// label `result` (ok: their reads need no request; failed: the kernel
/// refused, and they are read through lakemount). At their open; on a mount
/// without opens (`read.no_open`, with a data cache), as small-object
/// read-ahead fetches them.
pub const PAGE_CACHE_FILLS: &str = "lakemount_page_cache_fills_total";
/// Counter: bytes of the objects of [`PAGE_CACHE_FILLS`] with `result` ok:
/// put in the page cache, where a reader reads them with no read request
/// (bytes pushed ahead on a mount without opens may never be read).
pub const PAGE_CACHE_FILL_BYTES: &str = "lakemount_page_cache_fill_bytes_total";
/// Counter: objects pushed to the page cache whose kernel attributes were
/// made stale (FUSE_NOTIFY_INVAL_INODE, pages kept), so that a loader that
/// sends no request per file sends a GETATTR or LOOKUP for each
/// (docs/READAHEAD.md, "A silent loader is asked for a sign").
pub const FUSE_ATTR_INVALIDATIONS: &str = "lakemount_fuse_attr_invalidations_total";
/// Gauge: files open on the mount: opens (and creates) answered and not
/// yet released, counted once the release's bookkeeping is done.
pub const FUSE_OPEN_FILES: &str = "lakemount_fuse_open_files";
/// Gauge: file handles a mount without opens (`read.no_open`) keeps, one
/// per inode being read (src/fuse/handles.rs).
pub const FUSE_INODE_HANDLES: &str = "lakemount_fuse_inode_handles";
/// Counter: FUSE requests received, label `op` (lookup, getattr, open, read,
/// flush, release, opendir, readdir, readdirplus, releasedir, forget, getxattr,
/// listxattr, statfs, access, ioctl, and on a writable mount create, write,
/// fsync, fsyncdir, setattr, mkdir, unlink, rmdir, rename).
pub const FUSE_REQUESTS: &str = "lakemount_fuse_requests_total";
/// Counter: FUSE requests answered with an error, label `errno`.
pub const FUSE_ERRORS: &str = "lakemount_fuse_errors_total";
/// Counter: keys not shown because their name cannot be a POSIX path
/// component (empty, `.`, `..`, over 255 bytes), or a file shadowed by a directory.
pub const KEYS_SKIPPED: &str = "lakemount_keys_skipped_total";

/// Counter: read-ahead bytes fetched but dropped before any reader used them.
pub const PREFETCH_UNUSED_BYTES: &str = "lakemount_prefetch_unused_bytes_total";
/// Counter: read-ahead windows reset by a seek.
pub const PREFETCH_WINDOW_RESETS: &str = "lakemount_prefetch_window_resets_total";
/// Counter: read-ahead parts not sent because the memory budget was used up.
pub const PREFETCH_BUDGET_REFUSALS: &str = "lakemount_prefetch_budget_refusals_total";
/// Gauge: bytes reserved by read-ahead and demand parts now.
pub const PREFETCH_MEMORY_BYTES: &str = "lakemount_prefetch_memory_bytes";
/// Histogram: time one FUSE read waited for S3 data, seconds (0 when prefetched).
pub const READ_WAIT_SECONDS: &str = "lakemount_read_wait_seconds";

/// Counter: small objects fetched whole by small-object read-ahead.
pub const SMALL_PREFETCH_OBJECTS: &str = "lakemount_small_prefetch_objects_total";
/// Counter: bytes of those objects.
pub const SMALL_PREFETCH_BYTES: &str = "lakemount_small_prefetch_bytes_total";
/// Counter: opens that found their object prefetched, label `state` (ready:
/// its bytes were here; in_flight: its GET was under way and was shared;
/// pushed: on a mount without opens, put in the page cache before any read
/// of it, so counted when pushed; cached: written to the data cache when
/// memory ran short, read from there).
pub const SMALL_PREFETCH_HITS: &str = "lakemount_small_prefetch_hits_total";
/// Counter: prefetched objects dropped unread, label `reason` (expired: not
/// opened in time; changed: opened at another ETag; failed: the GET failed;
/// opened: fetched by a scan racing with the object's own first open).
/// Their bytes count in `lakemount_prefetch_unused_bytes_total`.
pub const SMALL_PREFETCH_DROPPED: &str = "lakemount_small_prefetch_dropped_total";
/// Gauge: small-object prefetch GETs in flight.
pub const SMALL_PREFETCH_IN_FLIGHT: &str = "lakemount_small_prefetch_in_flight";
/// Gauge: bytes of small objects prefetched (or being fetched) and not opened;
/// on a mount without opens, pushed ones until the loader is seen at them.
pub const SMALL_PREFETCH_UNREAD_BYTES: &str = "lakemount_small_prefetch_unread_bytes";

/// Counter: directory-listing cache lookups, label `result` (hit, miss).
pub const META_LISTING_CACHE: &str = "lakemount_meta_listing_cache_total";
/// Counter: listings served past their TTL because listing the directory
/// again failed with a server or network fault (stale-if-error).
pub const META_STALE_LISTINGS: &str = "lakemount_meta_stale_listings_total";
/// Counter: negative-cache lookups, label `result` (hit: answered "missing"
/// without a listing; miss: a name found missing and remembered).
pub const META_NEGATIVE_CACHE: &str = "lakemount_meta_negative_cache_total";
/// Histogram: time to list one whole directory (all pages), seconds.
pub const META_LISTING_SECONDS: &str = "lakemount_meta_listing_seconds";
/// Counter: lookups answered by a ListObjectsV2 of the name alone, because
/// the directory is too large to list (`metadata.max_dir_entries`) or the
/// metadata TTL is 0.
pub const META_DIRECT_LOOKUPS: &str = "lakemount_meta_direct_lookups_total";
/// Gauge: inodes in the inode table (root included): what the kernel holds
/// lookups of; shrinks as the kernel sends `forget`.
pub const META_INODES: &str = "lakemount_meta_inodes";
/// Counter: directory listings given up at `metadata.max_dir_entries` entries.
pub const META_HUGE_DIRS: &str = "lakemount_meta_huge_dirs_total";

/// Counter: cache block hits, label `tier` (memory, disk).
pub const CACHE_HITS: &str = "lakemount_cache_hits_total";
/// Counter: cache block misses (blocks fetched from S3 while the cache is on).
pub const CACHE_MISSES: &str = "lakemount_cache_misses_total";
/// Counter: bytes of blocks served while the cache is on, label `source`
/// (memory, disk, s3).
pub const CACHE_SERVED_BYTES: &str = "lakemount_cache_served_bytes_total";
/// Histogram: time to read and verify one block (or packed object) the cache
/// device served, seconds; reads the page cache answered are not in it.
pub const CACHE_READ_SECONDS: &str = "lakemount_cache_read_seconds";
/// Counter: cached blocks removed to make room (least recently used first).
pub const CACHE_EVICTIONS: &str = "lakemount_cache_evictions_total";
/// Counter: cached blocks removed because they were not read for `cache.ttl_secs`.
pub const CACHE_EXPIRATIONS: &str = "lakemount_cache_expirations_total";
/// Counter: corrupt or truncated cached blocks (or block maps) found and
/// discarded (then refetched).
pub const CACHE_BAD_PIECES: &str = "lakemount_cache_bad_pieces_total";
/// Counter: blocks not cached, label `reason` (full: only recently read
/// blocks could be evicted; queue_full: writes lag behind; io_error).
pub const CACHE_SKIPPED: &str = "lakemount_cache_skipped_total";
/// Counter: opens served by FUSE passthrough from a fully cached file (the
/// kernel then reads the local file; those reads are not counted elsewhere).
pub const CACHE_PASSTHROUGH_OPENS: &str = "lakemount_cache_passthrough_opens_total";
/// Gauge: bytes the disk cache holds (allocated size of its blocks and maps).
pub const CACHE_DISK_BYTES: &str = "lakemount_cache_disk_bytes";
/// Gauge: the disk cache's size limit in force, bytes.
pub const CACHE_LIMIT_BYTES: &str = "lakemount_cache_limit_bytes";
/// Gauge: free bytes on the cache's file system.
pub const CACHE_FS_FREE_BYTES: &str = "lakemount_cache_fs_free_bytes";
/// Gauge: recent cache-device read latency over its reference, label `kind`
/// (block, packed).
pub const CACHE_DEVICE_LATENCY_RATIO: &str = "lakemount_cache_device_latency_ratio";
/// Gauge: 1 while the cache device's reads of `kind` stay above twice their
/// reference, else 0.
pub const CACHE_DEVICE_SLOW: &str = "lakemount_cache_device_slow";
/// Counter: cache reads of `kind` sent to S3 because the device was slow
/// and slower than S3.
pub const CACHE_DEVICE_BYPASSED: &str = "lakemount_cache_device_bypassed_total";

/// `op` label of ListObjectsV2.
pub const OP_LIST: &str = "LIST";
/// `op` label of HeadObject.
pub const OP_HEAD: &str = "HEAD";
/// `op` label of GetObject.
pub const OP_GET: &str = "GET";
/// `op` label of PutObject.
pub const OP_PUT: &str = "PUT";
/// `op` label of CreateMultipartUpload.
pub const OP_CREATE_MULTIPART: &str = "CREATE_MULTIPART";
/// `op` label of UploadPart.
pub const OP_UPLOAD_PART: &str = "UPLOAD_PART";
/// `op` label of CompleteMultipartUpload.
pub const OP_COMPLETE_MULTIPART: &str = "COMPLETE_MULTIPART";
/// `op` label of AbortMultipartUpload.
pub const OP_ABORT_MULTIPART: &str = "ABORT_MULTIPART";
/// `op` label of ListMultipartUploads.
pub const OP_LIST_MULTIPART: &str = "LIST_MULTIPART";
/// `op` label of CopyObject.
pub const OP_COPY: &str = "COPY";
/// `op` label of UploadPartCopy.
pub const OP_UPLOAD_PART_COPY: &str = "UPLOAD_PART_COPY";
/// `op` label of DeleteObject.
pub const OP_DELETE: &str = "DELETE";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder once. It serves nothing itself: the control
/// endpoint ([`super::control`]) renders it at `/metrics`.
pub fn install() {
    if HANDLE.get().is_some() {
        return;
    }
    // `build_recorder`, not `build`: `build` would bind the exporter's own
    // listener (0.0.0.0:9000 by default, the port MinIO uses).
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_ok() {
        let _ = HANDLE.set(handle);
    }
}

/// Creates, at 0, the series an admin alarms on, so that an "any increase"
/// rule sees its first event (a series that first appears at 1 has no
/// increase in Prometheus). `cache`: a disk cache is on; `writable`: a
/// writable mount.
pub fn register_alarm_series(cache: bool, writable: bool) {
    metrics::counter!(PREFETCH_BUDGET_REFUSALS).increment(0);
    metrics::counter!(PREFETCH_UNUSED_BYTES).increment(0);
    metrics::counter!(S3_GET_BYTES).increment(0);
    metrics::counter!(FUSE_READ_BYTES).increment(0);
    metrics::counter!(PAGE_CACHE_FILL_BYTES).increment(0);
    if cache {
        metrics::counter!(CACHE_BAD_PIECES).increment(0);
        metrics::counter!(CACHE_EVICTIONS).increment(0);
        for kind in ["block", "packed"] {
            metrics::counter!(CACHE_DEVICE_BYPASSED, "kind" => kind).increment(0);
        }
        // Probes are never bypassed: passthrough stops instead.
        for kind in ["block", "packed", "probe"] {
            metrics::gauge!(CACHE_DEVICE_SLOW, "kind" => kind).set(0.0);
        }
    }
    if writable {
        metrics::counter!(WRITE_UPLOAD_FAILURES).increment(0);
        metrics::counter!(WRITE_PASSTHROUGH_OPENS).increment(0);
        metrics::gauge!(WRITE_STAGED_BYTES).increment(0.0);
    }
}

/// Drains histogram samples into their summaries. The recorder does it only
/// when rendering; a mount nobody scrapes would otherwise keep every sample.
/// Call every few seconds (the control endpoint does).
pub fn upkeep() {
    if let Some(h) = HANDLE.get() {
        h.run_upkeep();
    }
}

/// The Prometheus text of every metric, or `None` before [`install`].
pub fn render() -> Option<String> {
    HANDLE.get().map(|h| h.render())
}

/// Lines of [`render`] that count S3 requests and what the data cache skipped,
/// found bad or passed through, for the shutdown log.
pub fn s3_request_summary() -> Vec<String> {
    render()
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            [
                S3_REQUESTS,
                S3_RETRIES,
                S3_HEDGES,
                S3_HEDGE_DELAY,
                S3_GET_BYTES,
                CACHE_SKIPPED,
                CACHE_BAD_PIECES,
                CACHE_PASSTHROUGH_OPENS,
            ]
            .iter()
            .any(|m| l.starts_with(m))
        })
        .map(str::to_string)
        .collect()
}

/// Records one finished S3 request.
pub fn s3_request(op: &'static str, status: &str, elapsed: Duration) {
    metrics::counter!(S3_REQUESTS, "op" => op, "status" => status.to_string()).increment(1);
    metrics::histogram!(S3_REQUEST_SECONDS, "op" => op).record(elapsed.as_secs_f64());
}

/// Records the response headers of one `op` attempt, `elapsed` after it
/// was sent.
pub fn s3_first_byte(op: &'static str, elapsed: Duration) {
    metrics::histogram!(S3_FIRST_BYTE_SECONDS, "op" => op).record(elapsed.as_secs_f64());
}

/// Records one failed attempt of an `op` request that is tried again.
pub fn s3_retry(op: &'static str, cause: &str) {
    metrics::counter!(S3_RETRIES, "op" => op, "cause" => cause.to_string()).increment(1);
}

/// Records one hedged GET and which request won ([`HEDGE_WON`],
/// [`HEDGE_FIRST_WON`]).
pub fn s3_hedge(op: &'static str, won: &'static str) {
    metrics::counter!(S3_HEDGES, "op" => op, "won" => won).increment(1);
}

/// Sets the hedge delay gauge.
pub fn s3_hedge_delay(op: &'static str, delay: Duration) {
    metrics::gauge!(S3_HEDGE_DELAY, "op" => op).set(delay.as_secs_f64());
}

/// Records bytes of an upload that succeeded.
pub fn s3_bytes_sent(n: u64) {
    metrics::counter!(S3_SENT_BYTES).increment(n);
}

/// Records GET body bytes.
pub fn s3_bytes_received(n: u64) {
    metrics::counter!(S3_GET_BYTES).increment(n);
}
