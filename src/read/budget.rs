//! One memory budget for read-ahead, shared by every open file.
//!
//! Read-ahead parts reserve their size before their GET is sent and give it back
//! when dropped. A reservation that does not fit is refused, and the handle's
//! window stops growing instead of allocating: 200 shards read at once share the
//! budget rather than multiply it. The part a reader is waiting for right now
//! (demand) never waits on the budget, so an idle handle's read-ahead cannot
//! stall another reader; such parts are bounded by the kernel's FUSE requests in
//! flight ([`crate::fuse::MAX_BACKGROUND`] x 1 MiB) and counted as overdraft.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Budget granularity: permits count KiB so one `u32` acquire covers 4 TiB.
const UNIT: u64 = 1024;

/// Default budget when none is configured: 1/16 of physical memory, at least
/// 256 MiB and at most 8 GiB. A GPU node runs loader workers, pinned host
/// buffers and the page cache beside us; 1/16 leaves them the rest.
pub fn default_budget_bytes() -> u64 {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let phys = if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        4 << 30
    };
    (phys / 16).clamp(256 << 20, 8 << 30)
}

/// The shared budget. Cheap to clone.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sem: Arc<Semaphore>,
    total: u64,
    /// Bytes held by demand parts beyond the budget.
    overdraft: AtomicU64,
    /// Open readers sharing the budget.
    readers: AtomicUsize,
    /// Held while the gauge of bytes in use is set, so that the last change
    /// sets the last value.
    gauge: std::sync::Mutex<()>,
}

/// Bytes held against the budget; returned on drop.
#[derive(Debug)]
pub struct Reservation {
    _permit: Option<OwnedSemaphorePermit>,
    overdraft: u64,
    budget: MemoryBudget,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Given back before the gauge is set, not after this returns.
        drop(self._permit.take());
        if self.overdraft > 0 {
            self.budget
                .inner
                .overdraft
                .fetch_sub(self.overdraft, Ordering::Relaxed);
        }
        self.budget.report();
    }
}

fn units(bytes: u64) -> u32 {
    bytes.div_ceil(UNIT).min(u32::MAX as u64) as u32
}

impl MemoryBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Self {
        let permits = units(bytes.max(UNIT)) as usize;
        Self {
            inner: Arc::new(Inner {
                sem: Arc::new(Semaphore::new(permits)),
                total: permits as u64 * UNIT,
                overdraft: AtomicU64::new(0),
                readers: AtomicUsize::new(0),
                gauge: std::sync::Mutex::new(()),
            }),
        }
    }

    /// The budget, bytes.
    pub fn total(&self) -> u64 {
        self.inner.total
    }

    /// Whether demand beyond the budget is held now (overdraft above 0).
    pub fn overdrawn(&self) -> bool {
        self.inner.overdraft.load(Ordering::Relaxed) > 0
    }

    /// Bytes reserved now (read-ahead within the budget plus demand overdraft).
    pub fn in_use(&self) -> u64 {
        let free = self.inner.sem.available_permits() as u64 * UNIT;
        self.inner.total - free + self.inner.overdraft.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` for read-ahead, or `None` when they do not fit now.
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        let permit = self
            .inner
            .sem
            .clone()
            .try_acquire_many_owned(units(bytes))
            .ok()?;
        self.report();
        Some(Reservation {
            _permit: Some(permit),
            overdraft: 0,
            budget: self.clone(),
        })
    }

    /// Sets the gauge of bytes in use (`lakemount_prefetch_memory_bytes`) to
    /// what they are now: at every reservation and every return, so an idle
    /// mount shows what it still holds, not what its last read held.
    fn report(&self) {
        let _one = self.inner.gauge.lock().unwrap();
        metrics::gauge!(crate::telemetry::metrics::PREFETCH_MEMORY_BYTES).set(self.in_use() as f64);
    }

    /// Reserves `bytes` for a part a reader waits for: from the budget when they
    /// fit, else as overdraft. Never waits.
    pub fn reserve_demand(&self, bytes: u64) -> Reservation {
        self.try_reserve(bytes).unwrap_or_else(|| {
            self.inner.overdraft.fetch_add(bytes, Ordering::Relaxed);
            self.report();
            Reservation {
                _permit: None,
                overdraft: bytes,
                budget: self.clone(),
            }
        })
    }

    /// Registers an open reader; the returned guard unregisters it.
    pub fn register_reader(&self) -> ReaderGuard {
        self.inner.readers.fetch_add(1, Ordering::Relaxed);
        ReaderGuard(self.clone())
    }

    /// The window one reader may grow to while others share the budget:
    /// the budget divided by the open readers.
    pub fn fair_share(&self) -> u64 {
        self.inner.total / self.inner.readers.load(Ordering::Relaxed).max(1) as u64
    }
}

/// Counts one open reader while alive.
#[derive(Debug)]
pub struct ReaderGuard(MemoryBudget);

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.inner.readers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_returned() {
        let b = MemoryBudget::new(10 << 20);
        let r1 = b.try_reserve(6 << 20).unwrap();
        assert!(b.try_reserve(6 << 20).is_none(), "over budget");
        let r2 = b.try_reserve(4 << 20).unwrap();
        assert_eq!(b.in_use(), 10 << 20);
        let d = b.reserve_demand(1 << 20);
        assert_eq!(b.in_use(), 11 << 20, "demand overdraft counted");
        drop((r1, r2, d));
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn fair_share_divides_by_readers() {
        let b = MemoryBudget::new(64 << 20);
        let g: Vec<_> = (0..4).map(|_| b.register_reader()).collect();
        assert_eq!(b.fair_share(), 16 << 20);
        drop(g);
        assert_eq!(b.fair_share(), 64 << 20);
    }

    #[test]
    fn default_is_within_bounds() {
        let d = default_budget_bytes();
        assert!((256 << 20..=8 << 30).contains(&d));
    }
}
