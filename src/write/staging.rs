//! The staging area: written files on local disk until S3 has them.
//!
//! Layout of the staging directory (`write.staging_dir`):
//! - `lock`: held (flock) by the running lakemount; a second one is refused,
//!   since two daemons uploading one staging area would race.
//! - `<id>.data`: the bytes of one written file, at their own offsets.
//! - `<id>.toml`: its journal record ([`Record`]): the object key it is to be
//!   uploaded as, and whether its writers closed it. Written (temp file,
//!   fsync, rename) before the first byte of data, at each rename, at the
//!   first open for writing and the last close, so a restart knows every
//!   file that was not uploaded yet, under which name, and whether it is whole.
//! - `origin`: the bucket and prefix this staging area uploads to; a mount of
//!   another one is refused, so staged files never land in the wrong bucket.
//!
//! A file leaves staging ([`Staging::remove`]) only once S3 answered its
//! upload, or when it was unlinked. Nothing else deletes staged files.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The journal record of one staged file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Full object key the file is to be uploaded as.
    pub key: String,
    /// Every writer closed it: a restart uploads it. A file still open for
    /// writing when the daemon stopped is kept but not uploaded (its bytes
    /// may be half a checkpoint).
    pub closed: bool,
}

/// The staging directory and the bytes it holds.
pub struct Staging {
    dir: PathBuf,
    /// Most bytes staged files may hold together (`write.staging_max_size`).
    limit: u64,
    /// Bytes staged files hold now (their sizes, summed).
    used: AtomicU64,
    next_id: AtomicU64,
    _lock: File,
}

/// A write would take staging past its size limit (ENOSPC).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("staging is full: {used} of {limit} bytes used, {wanted} more wanted")]
pub struct Full {
    /// Bytes staged now.
    pub used: u64,
    /// The limit, bytes.
    pub limit: u64,
    /// Bytes the refused change would add.
    pub wanted: u64,
}

impl Staging {
    /// Opens (creating, mode 0700) the staging directory `dir` of the mount
    /// of `origin` (`s3://bucket/prefix`) with a size limit of `limit`
    /// bytes, and locks it. Errors: the directory cannot be created, is in
    /// use by another lakemount, or belongs to another bucket or prefix.
    pub fn open(dir: &Path, origin: &str, limit: u64) -> anyhow::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("write.staging_dir: cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("write.staging_dir: cannot chmod {}", dir.display()))?;
        let lock = crate::cache::lock_dir(dir, "write.staging_dir", dir, "staging directory")?;
        let origin_path = dir.join("origin");
        match std::fs::read_to_string(&origin_path) {
            Ok(held) if held.trim_end() == origin => {}
            Ok(held) => anyhow::bail!(
                "write.staging_dir: {} holds files staged for {}, not {origin}; give each \
                 writable mount its own staging directory",
                dir.display(),
                held.trim_end()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::write(&origin_path, format!("{origin}\n")).with_context(|| {
                    format!("write.staging_dir: cannot write {}", origin_path.display())
                })?
            }
            Err(e) => {
                return Err(e).context(format!(
                    "write.staging_dir: reading {}",
                    origin_path.display()
                ));
            }
        }
        let next = staged_ids(dir)?.into_iter().max().map_or(1, |m| m + 1);
        Ok(Self {
            dir: dir.to_path_buf(),
            limit,
            used: AtomicU64::new(0),
            next_id: AtomicU64::new(next),
            _lock: lock,
        })
    }

    /// The staging directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size limit, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes staged files hold now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The data file of staged file `id`.
    pub fn data_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.data"))
    }

    fn record_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.toml"))
    }

    /// A new, empty staged file to be uploaded as `key`: its id and data
    /// file (read and write). The record is durable before this returns.
    pub fn create(&self, key: &str) -> std::io::Result<(u64, File)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.write_record(
            id,
            &Record {
                key: key.to_string(),
                closed: false,
            },
        )?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.data_path(id))?;
        Ok((id, file))
    }

    /// Rewrites the record of staged file `id` (a rename): temp file,
    /// fsync, rename over the old one, so a crash leaves the old or the new.
    pub fn write_record(&self, id: u64, record: &Record) -> std::io::Result<()> {
        let text = toml::to_string(record).map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!("{id}.toml.tmp"));
        // Callers of one id take turns (`Staged::record`), so one temp name
        // per id suffices.
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.record_path(id))?;
        File::open(&self.dir)?.sync_all()
    }

    /// Accounts a staged file growing from `old` to `new` bytes (or
    /// shrinking). Errors: [`Full`] when growth would pass the limit; nothing
    /// is accounted then.
    pub fn resize(&self, old: u64, new: u64) -> Result<(), Full> {
        if new <= old {
            self.used.fetch_sub(old - new, Ordering::Relaxed);
            return Ok(());
        }
        let wanted = new - old;
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + wanted <= self.limit).then_some(u + wanted)
            })
            .map(|_| ())
            .map_err(|used| Full {
                used,
                limit: self.limit,
                wanted,
            })
    }

    /// Accounts growth from `old` to `new` bytes that has happened already
    /// (a passthrough writer's), past the limit if need be.
    pub fn resize_over(&self, old: u64, new: u64) {
        if new >= old {
            self.used.fetch_add(new - old, Ordering::Relaxed);
        } else {
            self.used.fetch_sub(old - new, Ordering::Relaxed);
        }
    }

    /// Whether less than the limit is in use.
    pub fn has_room(&self) -> bool {
        self.used.load(Ordering::Relaxed) < self.limit
    }

    /// Deletes staged file `id` of `size` bytes (uploaded, or unlinked).
    /// The data goes first: a crash in between leaves a record without
    /// data, which recovery drops.
    pub fn remove(&self, id: u64, size: u64) {
        for p in [self.data_path(id), self.record_path(id)] {
            if let Err(e) = std::fs::remove_file(&p)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %p.display(), "cannot remove staged file: {e}");
            }
        }
        self.used.fetch_sub(size, Ordering::Relaxed);
    }

    /// A second name for staged file `id`'s data, `<id>.uploaded` beside
    /// it, for its bytes to outlive [`Self::remove`] (not counted in
    /// [`Self::used`]). `None` when it cannot be made (logged).
    pub fn set_aside(&self, id: u64) -> Option<PathBuf> {
        let p = self.dir.join(format!("{id}{UPLOADED}"));
        let _ = std::fs::remove_file(&p);
        match std::fs::hard_link(self.data_path(id), &p) {
            Ok(()) => Some(p),
            Err(e) => {
                tracing::warn!(path = %p.display(), "cannot keep an uploaded file's bytes: {e}");
                None
            }
        }
    }

    /// Deletes the record of staged file `id` (a record written again
    /// after the file was removed).
    pub fn remove_record(&self, id: u64) {
        let p = self.record_path(id);
        if let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), "cannot remove a staging record: {e}");
        }
    }

    /// Staged files a previous run left: (id, record, data file), oldest
    /// first, each accounted in [`Self::used`]. A record without its data
    /// file (a crash while removing) is dropped; a data file without a
    /// record (a crash while creating: no byte of it was written yet) too.
    pub fn recover(&self) -> anyhow::Result<Vec<(u64, Record, File)>> {
        // Uploaded bytes set aside (Self::set_aside): S3 has them.
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().ends_with(UPLOADED) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut out = Vec::new();
        let mut ids = staged_ids(&self.dir)?;
        ids.sort_unstable();
        for id in ids {
            let (rec, data) = (self.record_path(id), self.data_path(id));
            let record = match std::fs::read_to_string(&rec) {
                Ok(text) => match toml::from_str::<Record>(&text) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::error!(path = %rec.display(),
                            "unreadable staging record, its file is kept but not uploaded: {e}");
                        continue;
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).context(format!("reading {}", rec.display())),
            };
            let file = match OpenOptions::new().read(true).write(true).open(&data) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).context(format!("opening {}", data.display())),
            };
            match (record, file) {
                (Some(r), Some(f)) => {
                    let len = f.metadata()?.len();
                    self.used.fetch_add(len, Ordering::Relaxed);
                    out.push((id, r, f));
                }
                (Some(_), None) => {
                    let _ = std::fs::remove_file(&rec);
                }
                (None, Some(f)) if f.metadata()?.len() == 0 => {
                    let _ = std::fs::remove_file(&data);
                }
                (None, Some(_)) => tracing::error!(path = %data.display(),
                    "staged data without a record is kept but not uploaded"),
                (None, None) => {}
            }
        }
        Ok(out)
    }
}

/// Suffix of an uploaded file's data set aside ([`Staging::set_aside`]).
const UPLOADED: &str = ".uploaded";

/// Ids of the staged files (data or record) in `dir`.
fn staged_ids(dir: &Path) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        let stem = name
            .strip_suffix(".data")
            .or_else(|| name.strip_suffix(".toml"));
        if let Some(id) = stem.and_then(|s| s.parse::<u64>().ok())
            && !ids.contains(&id)
        {
            ids.push(id);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lm-staging-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_restart_finds_staged_files_under_their_last_name() {
        let d = tempdir("recover");
        {
            let s = Staging::open(&d, "s3://b/", 1 << 20).unwrap();
            let (a, fa) = s.create("ckpt/a.tmp").unwrap();
            fa.write_all_at(b"hello", 0).unwrap();
            s.resize(0, 5).unwrap();
            s.write_record(
                a,
                &Record {
                    key: "ckpt/a".into(),
                    closed: true,
                },
            )
            .unwrap();
            let (b, _) = s.create("ckpt/b").unwrap();
            s.remove(b, 0);
            assert!(
                Staging::open(&d, "s3://b/", 1 << 20).is_err(),
                "a second opener is refused"
            );
        }
        {
            let e = Staging::open(&d, "s3://other/", 1 << 20).err().unwrap();
            assert!(e.to_string().contains("s3://b/"), "{e}");
        }
        let s = Staging::open(&d, "s3://b/", 1 << 20).unwrap();
        let found = s.recover().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1.key, "ckpt/a");
        assert!(found[0].1.closed);
        assert_eq!(s.used(), 5);
        let mut buf = [0u8; 5];
        found[0].2.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello");
        let (c, _) = s.create("x").unwrap();
        assert!(c > found[0].0, "ids are not reused");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn growth_past_the_limit_is_refused_and_not_accounted() {
        let d = tempdir("full");
        let s = Staging::open(&d, "s3://b/", 100).unwrap();
        s.resize(0, 60).unwrap();
        assert_eq!(
            s.resize(60, 101),
            Err(Full {
                used: 60,
                limit: 100,
                wanted: 41
            })
        );
        assert_eq!(s.used(), 60);
        s.resize(60, 100).unwrap();
        s.resize(100, 10).unwrap();
        assert_eq!(s.used(), 10);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
