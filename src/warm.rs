//! `lakemount warm PATH...`: fills the data cache of a running mount before a
//! job starts, by reading files through the mount in parallel.
//!
//! What is cached already is asked of the mount itself (extended attribute
//! [`XATTR_CACHED`], bytes of the file's current version in the cache); those
//! files are skipped. Before reading, the file's kernel page cache is dropped
//! (`posix_fadvise(POSIX_FADV_DONTNEED)`), so the reads reach lakemount and its
//! cache instead of being answered from memory.

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cache::human;
use crate::cli::WarmArgs;
use crate::fs::{XATTR_CACHE_LIMIT, XATTR_CACHE_USED, XATTR_CACHED};

/// Bytes per read(2) while warming (the kernel splits it into FUSE requests).
const READ_BUF: usize = 1 << 20;

/// What one warm run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Files read through the mount.
    pub files: u64,
    /// Bytes read through the mount.
    pub bytes: u64,
    /// Files skipped because they were fully cached already.
    pub cached_files: u64,
    /// Bytes of those files.
    pub cached_bytes: u64,
    /// Files that could not be read (each printed on stderr).
    pub failed: u64,
}

/// Reads a numeric lakemount extended attribute of `path`. `None`: the
/// attribute does not exist there (not a lakemount mount, or no cache).
fn xattr_u64(path: &Path, name: &str) -> std::io::Result<Option<u64>> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    let n = CString::new(name)?;
    let mut buf = [0u8; 32];
    // SAFETY: valid NUL-terminated strings; `buf` is writable for its length.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
            _ => Err(e),
        };
    }
    let s = std::str::from_utf8(&buf[..r as usize]).unwrap_or("");
    Ok(s.trim().parse().ok())
}

/// Every regular file under `paths` (files given directly, directories walked),
/// with its size in bytes.
fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = paths.iter().rev().cloned().collect();
    while let Some(p) = stack.pop() {
        let md = std::fs::metadata(&p).with_context(|| format!("{}", p.display()))?;
        if md.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&p)
                .with_context(|| format!("{}", p.display()))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}", p.display()))?;
            entries.sort();
            stack.extend(entries.into_iter().rev());
        } else if md.is_file() {
            out.push((p, md.len()));
        }
    }
    Ok(out)
}

/// Reads `path` to its end, counting bytes into `done`. Drops its page cache first.
fn read_through(path: &Path, done: &AtomicU64, bar: &ProgressBar) -> std::io::Result<u64> {
    let mut f = File::open(path)?;
    // SAFETY: fadvise on an open fd; advisory only.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; READ_BUF];
    let mut total = 0;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
        done.fetch_add(n as u64, Ordering::Relaxed);
        bar.inc(n as u64);
    }
}

/// Runs `lakemount warm`. Prints a one-line summary on stdout. Errors: a path
/// not on a lakemount mount with a data cache, more to fetch than the size
/// guard allows, or files that could not be read (after reading all others).
pub fn run_warm(args: &WarmArgs) -> anyhow::Result<Summary> {
    let first = args.paths.first().context("no PATH given")?;
    let limit = xattr_u64(first, XATTR_CACHE_LIMIT)
        .with_context(|| format!("{}", first.display()))?
        .with_context(|| {
            format!(
                "{} is not on a lakemount mount with a data cache (mount with --cache-dir or [cache] dir)",
                first.display()
            )
        })?;
    let used = xattr_u64(first, XATTR_CACHE_USED)?.unwrap_or(0);
    let files = collect(&args.paths)?;
    let mut todo = VecDeque::new();
    let mut s = Summary::default();
    let mut to_fetch = 0u64;
    for (p, size) in files {
        let cached = xattr_u64(&p, XATTR_CACHED)
            .with_context(|| format!("{}", p.display()))?
            .with_context(|| {
                format!(
                    "{} is not on a lakemount mount with a data cache",
                    p.display()
                )
            })?;
        if cached >= size {
            s.cached_files += 1;
            s.cached_bytes += size;
        } else {
            to_fetch += size - cached;
            todo.push_back((p, size));
        }
    }
    if !args.force {
        if let Some(max) = args.max_bytes
            && to_fetch > max
        {
            bail!(
                "{} to fetch is more than --max-bytes {}; nothing read (--force to warm anyway)",
                human(to_fetch),
                human(max)
            );
        }
        if to_fetch > limit {
            bail!(
                "{} to fetch is more than the cache can hold ({} limit, {} in use; the limit is \
                 min(cache.max_size, in use + free space - cache.min_free)); warming it would \
                 evict what it just fetched. Nothing read: warm less, free space, raise \
                 cache.max_size or lower cache.min_free, or --force",
                human(to_fetch),
                human(limit),
                human(used)
            );
        }
    }
    let bar = ProgressBar::new(todo.iter().map(|t| t.1).sum());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let started = Instant::now();
    let queue = Mutex::new(todo);
    let done = AtomicU64::new(0);
    let counts = Mutex::new((0u64, 0u64, 0u64)); // files, bytes, failed
    std::thread::scope(|sc| {
        for _ in 0..args.jobs.max(1) {
            sc.spawn(|| {
                loop {
                    let Some((p, _)) = queue.lock().unwrap().pop_front() else {
                        return;
                    };
                    match read_through(&p, &done, &bar) {
                        Ok(n) => {
                            let mut c = counts.lock().unwrap();
                            c.0 += 1;
                            c.1 += n;
                        }
                        Err(e) => {
                            bar.suspend(|| eprintln!("lakemount warm: {}: {e}", p.display()));
                            counts.lock().unwrap().2 += 1;
                        }
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let (f, b, failed) = *counts.lock().unwrap();
    s.files = f;
    s.bytes = b;
    s.failed = failed;
    println!(
        "warmed {} files, {} in {:.1} s ({}/s); already cached: {} files, {}; failed: {}",
        s.files,
        human(s.bytes),
        secs,
        human((s.bytes as f64 / secs.max(1e-9)) as u64),
        s.cached_files,
        human(s.cached_bytes),
        s.failed
    );
    if s.failed > 0 {
        bail!("{} files could not be read (listed above)", s.failed);
    }
    Ok(s)
}
