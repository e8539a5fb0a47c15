//! The cache device's read latency against its own reference: a dying SSD gets
//! slow before it fails. [`DeviceHealth`] keeps, per kind of read (whole
//! blocks, packed small objects: their sizes differ by 100x), a learned
//! reference and a recent average; a kind whose recent average stays above
//! twice its reference is *slow* (a warning, a gauge), and while it is slow
//! and also slower than S3 answers the same blocks, reads of that kind
//! bypass the device and go to S3, all but one in [`PROBE_EVERY`] which keeps
//! the measurement going so that recovery is seen.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::telemetry::metrics as m;

/// Samples averaged into the first reference.
const LEARN: u64 = 50;
/// Weight of one sample in the reference (a long-run average, ~1000 reads).
const REFERENCE_ALPHA: f64 = 0.001;
/// Weight of one sample in the recent average (~20 reads).
const RECENT_ALPHA: f64 = 0.05;
/// Slow: the (clipped) recent average above this times the reference ...
const SLOW_RATIO: f64 = 2.0;
/// ... for this many reads in a row ("stays above", not one stall).
const SLOW_AFTER: u32 = 20;
/// Healthy again when the recent average is below this ratio (hysteresis).
const RECOVER_RATIO: f64 = 1.5;
/// Samples count at most this many times the reference in the slow decision.
const CLIP: f64 = 10.0;
/// While bypassing, one read in this many still goes to the device.
pub const PROBE_EVERY: u64 = 20;
/// At most one slow-device warning per kind per this.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Kinds of cache-device reads, each with a reference of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// A block of an object's data file (up to `cache.block_size`).
    Block,
    /// A small object's record in a pack file.
    Packed,
    /// A read of [`PROBE_LEN`] bytes of a file handed to FUSE passthrough,
    /// whose own reads the kernel does without lakemount.
    Probe,
}

/// Bytes of one probe read of a passthrough file.
pub const PROBE_LEN: usize = 64 << 10;
/// At most one probe read per this, per cache directory.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

impl ReadKind {
    fn label(self) -> &'static str {
        match self {
            ReadKind::Block => "block",
            ReadKind::Packed => "packed",
            ReadKind::Probe => "probe",
        }
    }
}

#[derive(Debug, Default)]
struct Tracker {
    samples: u64,
    /// Seconds; during learning, the running mean.
    reference: f64,
    recent: f64,
    /// As `recent`, of samples clipped at [`CLIP`] x the reference.
    trend: f64,
    /// Reads in a row with `trend > SLOW_RATIO * reference`.
    above: u32,
    slow: bool,
    last_warn: Option<Instant>,
}

impl Tracker {
    /// Adds one sample; returns a change of the slow state, if any.
    fn sample(&mut self, t: f64) -> Option<bool> {
        self.samples += 1;
        if self.samples <= LEARN {
            self.reference += (t - self.reference) / self.samples as f64;
            self.recent = self.reference;
            self.trend = self.reference;
            return None;
        }
        self.recent += (t - self.recent) * RECENT_ALPHA;
        let ratio = self.ratio();
        // The reference follows the device only while it is healthy, so a
        // lasting slowdown is not learned as the new normal.
        if !self.slow && ratio <= SLOW_RATIO {
            self.reference += (t - self.reference) * REFERENCE_ALPHA;
        }
        // The slow decision follows an average of samples clipped at
        // CLIP x the reference: one stall of 100x would otherwise hold the
        // average above 2x for dozens of reads, while a device with half of
        // its reads slow (read-ahead pages answer the others) stays above.
        let clipped = t.min(CLIP * self.reference);
        self.trend += (clipped - self.trend) * RECENT_ALPHA;
        if self.trend > SLOW_RATIO * self.reference {
            self.above = self.above.saturating_add(1);
        } else {
            self.above = 0;
        }
        match self.slow {
            false if self.above >= SLOW_AFTER => {
                self.slow = true;
                Some(true)
            }
            true if ratio < RECOVER_RATIO => {
                self.slow = false;
                Some(false)
            }
            _ => None,
        }
    }

    fn ratio(&self) -> f64 {
        if self.reference > 0.0 {
            self.recent / self.reference
        } else {
            1.0
        }
    }
}

/// Read-latency state of one cache directory's device.
#[derive(Debug, Default)]
pub struct DeviceHealth {
    block: Mutex<Tracker>,
    packed: Mutex<Tracker>,
    probe: Mutex<Tracker>,
    /// Milliseconds after `epoch` of the last probe read; 0: none yet.
    last_probe_ms: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
    /// Recent seconds S3 took per block fetched by the cache, as f64 bits; 0: unknown.
    s3_per_block: AtomicU64,
    /// Reads counted for the 1-in-[`PROBE_EVERY`] probe while bypassing.
    reads: AtomicU64,
}

impl DeviceHealth {
    fn tracker(&self, kind: ReadKind) -> &Mutex<Tracker> {
        match kind {
            ReadKind::Block => &self.block,
            ReadKind::Packed => &self.packed,
            ReadKind::Probe => &self.probe,
        }
    }

    /// Whether reads of `kind` are slow now (above twice their reference).
    pub fn slow(&self, kind: ReadKind) -> bool {
        self.tracker(kind).lock().unwrap().slow
    }

    /// Whether files may be handed to FUSE passthrough: not while whole-block
    /// or probe reads are slow. The kernel's passthrough reads bypass
    /// lakemount, so neither the alarm nor the bypass to S3 would see them;
    /// through lakemount each read is timed for the alarm, and goes to S3
    /// while the device is also slower than S3.
    pub fn passthrough_ok(&self) -> bool {
        !self.slow(ReadKind::Block) && !self.slow(ReadKind::Probe)
    }

    /// Whether a probe read is due (at most one per [`PROBE_INTERVAL`]);
    /// `true` claims it.
    pub fn probe_due(&self) -> bool {
        let epoch = *self.epoch.get_or_init(Instant::now);
        let now = epoch.elapsed().as_millis() as u64 + 1;
        let last = self.last_probe_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < PROBE_INTERVAL.as_millis() as u64 {
            return false;
        }
        self.last_probe_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Records one device read of `kind` that took `took` (open, read, CRC
    /// check); warns and sets the gauges when the slow state changes.
    pub fn sample(&self, kind: ReadKind, took: Duration, dir: &std::path::Path) {
        let mut t = self.tracker(kind).lock().unwrap();
        let change = t.sample(took.as_secs_f64());
        metrics::gauge!(m::CACHE_DEVICE_LATENCY_RATIO, "kind" => kind.label()).set(t.ratio());
        match change {
            Some(true) => {
                metrics::gauge!(m::CACHE_DEVICE_SLOW, "kind" => kind.label()).set(1.0);
                if t.last_warn.is_none_or(|w| w.elapsed() >= WARN_INTERVAL) {
                    t.last_warn = Some(Instant::now());
                    warn!(
                        kind = kind.label(),
                        recent_ms = t.recent * 1e3,
                        reference_ms = t.reference * 1e3,
                        dir = %dir.display(),
                        "cache device reads are more than twice as slow as their reference; \
                         check the device (a failing SSD slows down before it fails); while it \
                         is also slower than S3, reads go to S3"
                    );
                }
            }
            Some(false) => {
                metrics::gauge!(m::CACHE_DEVICE_SLOW, "kind" => kind.label()).set(0.0);
                info!(
                    kind = kind.label(),
                    recent_ms = t.recent * 1e3,
                    dir = %dir.display(),
                    "cache device reads are back near their reference"
                );
            }
            None => {}
        }
    }

    /// Records an S3 fetch of `blocks` blocks for the cache that took `took`.
    pub fn sample_s3(&self, took: Duration, blocks: u64) {
        if blocks == 0 {
            return;
        }
        let per = took.as_secs_f64() / blocks as f64;
        let old = f64::from_bits(self.s3_per_block.load(Ordering::Relaxed));
        let new = if old == 0.0 {
            per
        } else {
            old + (per - old) * RECENT_ALPHA
        };
        self.s3_per_block.store(new.to_bits(), Ordering::Relaxed);
    }

    /// Whether a read of `kind` should go to S3 instead of the device: the
    /// kind is slow and its recent latency is above S3's per block (unknown
    /// S3 latency: no bypass), except for one read in [`PROBE_EVERY`].
    /// Counted in `lakemount_cache_device_bypassed_total`.
    pub fn bypass(&self, kind: ReadKind) -> bool {
        let recent = {
            let t = self.tracker(kind).lock().unwrap();
            if !t.slow {
                return false;
            }
            t.recent
        };
        let s3 = f64::from_bits(self.s3_per_block.load(Ordering::Relaxed));
        if s3 == 0.0 || recent <= s3 {
            return false;
        }
        if self
            .reads
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(PROBE_EVERY)
        {
            return false;
        }
        metrics::counter!(m::CACHE_DEVICE_BYPASSED, "kind" => kind.label()).increment(1);
        true
    }
}

/// Fills `buf` from `f` at `off` (as `read_exact_at`) and says whether the
/// device was read: first a `preadv2(RWF_NOWAIT)` that only copies what the
/// page cache holds (Linux 4.14+); when it fills `buf`, the read never
/// reached the device and is no sample of its latency (blocks written in the
/// last minutes are read back from memory). Errors: those of `read_exact_at`.
pub fn read_exact_at_counting(
    f: &std::fs::File,
    buf: &mut [u8],
    off: u64,
) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over `buf`, which is valid for writes of its length;
    // the descriptor is open for the call.
    let n = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, off as libc::off_t, libc::RWF_NOWAIT) };
    if n >= 0 && n as usize == buf.len() {
        return Ok(false);
    }
    // EAGAIN (not all cached), a short read, or no RWF_NOWAIT support.
    f.read_exact_at(buf, off)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lasting_slowdown_is_slow_and_stays_slow_until_it_recovers() {
        let h = DeviceHealth::default();
        let dir = std::path::Path::new("/c");
        for _ in 0..1000 {
            h.sample(ReadKind::Block, MS, dir);
        }
        assert!(!h.block.lock().unwrap().slow);
        // One stall is not a slow device.
        h.sample(ReadKind::Block, 100 * MS, dir);
        h.sample(ReadKind::Block, MS, dir);
        assert!(!h.block.lock().unwrap().slow);
        for _ in 0..SLOW_AFTER + 40 {
            h.sample(ReadKind::Block, 10 * MS, dir);
        }
        assert!(h.block.lock().unwrap().slow);
        // Thousands of slow reads later it is still slow: not learned as normal.
        for _ in 0..5000 {
            h.sample(ReadKind::Block, 10 * MS, dir);
        }
        assert!(h.block.lock().unwrap().slow);
        assert!(!h.packed.lock().unwrap().slow, "kinds are apart");
        for _ in 0..200 {
            h.sample(ReadKind::Block, MS, dir);
        }
        assert!(!h.block.lock().unwrap().slow);
        // Every other read slow (read-ahead pages answer the rest): slow.
        for i in 0..200 {
            h.sample(ReadKind::Block, if i % 2 == 0 { MS } else { 50 * MS }, dir);
        }
        assert!(h.block.lock().unwrap().slow);
    }

    #[test]
    fn bypass_only_when_slow_and_slower_than_s3_with_probes() {
        let h = DeviceHealth::default();
        let dir = std::path::Path::new("/c");
        for _ in 0..LEARN {
            h.sample(ReadKind::Block, MS, dir);
        }
        for _ in 0..200 {
            h.sample(ReadKind::Block, 50 * MS, dir);
        }
        assert!(h.block.lock().unwrap().slow);
        assert!(!h.bypass(ReadKind::Block), "S3's latency not known yet");
        h.sample_s3(200 * MS, 2); // 100 ms per block: slower than the device
        assert!(!h.bypass(ReadKind::Block));
        for _ in 0..200 {
            h.sample_s3(4 * MS, 2);
        }
        let bypassed = (0..100).filter(|_| h.bypass(ReadKind::Block)).count();
        assert_eq!(bypassed as u64, 100 - 100 / PROBE_EVERY);
        assert!(!h.bypass(ReadKind::Packed));
    }

    #[test]
    fn reads_from_the_page_cache_are_no_device_samples() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("lakemount-nowait-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        read_exact_at_counting(&f, &mut buf, 0).unwrap();
        assert!(
            !read_exact_at_counting(&f, &mut buf, 0).unwrap(),
            "cached pages"
        );
        // SAFETY: fadvise on a descriptor we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert!(
            read_exact_at_counting(&f, &mut buf, 0).unwrap(),
            "dropped pages"
        );
        assert!(buf.iter().all(|b| *b == 7));
        let _ = std::fs::remove_file(&path);
    }
}
