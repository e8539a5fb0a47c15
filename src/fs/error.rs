//! File-system errors and their errno, mapped in exactly one place.

use crate::store::StoreError;

/// Errors of file-system operations. [`FsError::errno`] is the only errno mapping.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FsError {
    /// No such entry, or an inode the kernel already forgot.
    #[error("no such file or directory")]
    NotFound,
    /// A path component is not a directory.
    #[error("not a directory")]
    NotDir,
    /// The operation needs a file but got a directory.
    #[error("is a directory")]
    IsDir,
    /// A name over 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// A write on the read-only mount.
    #[error("read-only file system")]
    ReadOnly,
    /// An unknown file or directory handle.
    #[error("bad file handle")]
    BadHandle,
    /// The object changed or vanished since it was opened.
    #[error("object changed since open")]
    Stale,
    /// An open of an inode whose object was overwritten since the kernel
    /// looked it up: ESTALE, on which the kernel looks the name up again
    /// (`do_filp_open` retries with `LOOKUP_REVAL`) and finds the new
    /// version's inode. Expected, so logged at debug level.
    #[error("object replaced by a new version; look it up again")]
    Superseded,
    /// A directory to remove or replace is not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// The name exists already (mkdir, rename with RENAME_NOREPLACE).
    #[error("file exists")]
    Exists,
    /// Staging is full (`write.staging_max_size`) or its disk is.
    #[error("no space left in staging: {0}")]
    NoSpace(String),
    /// An argument the operation does not take (EINVAL).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The file is open with FUSE passthrough to another local file than
    /// this open would use (a cached object, a staged file uploaded since),
    /// so it cannot be opened for writing meanwhile (ETXTBSY).
    #[error("file busy: open by passthrough to another file")]
    Busy,
    /// Local disk I/O of staging failed (its errno).
    #[error("staging I/O: {1}")]
    Local(i32, String),
    /// An upload failed after its retries (EIO); the file stays staged.
    #[error("upload failed: {0}")]
    Upload(String),
    /// A name that no listing S3 gave last holds, looked up or made on a
    /// writable mount while S3 cannot be asked (a server or network fault):
    /// ENOENT, never remembered as a negative entry, so that a checkpoint
    /// can be created meanwhile (docs/WRITES.md, "While S3 is unreachable");
    /// an operation that would need S3 to tell more about it fails with it.
    #[error("not in the last listing, and S3 cannot be asked now: {0}")]
    Unlisted(String),
    /// No such extended attribute.
    #[error("no such attribute")]
    NoAttr,
    /// An error of the object store.
    #[error("object store: {0}")]
    Store(#[from] StoreError),
}

impl FsError {
    /// The errno the kernel gets. Throttling is never ENOENT; a missing object
    /// is never EIO.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound | FsError::Unlisted(_) => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::ReadOnly => libc::EROFS,
            FsError::BadHandle => libc::EBADF,
            FsError::Stale | FsError::Superseded => libc::ESTALE,
            FsError::NoAttr => libc::ENODATA,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Exists => libc::EEXIST,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::Busy => libc::ETXTBSY,
            FsError::Local(e, _) => *e,
            FsError::Upload(_) => libc::EIO,
            FsError::Store(e) => match e {
                StoreError::NotFound => libc::ENOENT,
                StoreError::PreconditionFailed => libc::ESTALE,
                StoreError::AccessDenied(_) | StoreError::NoCredentials(_) => libc::EACCES,
                StoreError::NoSuchBucket
                | StoreError::NoSuchUpload
                | StoreError::ListNotFound(_)
                | StoreError::InvalidRange
                | StoreError::Throttled(_)
                | StoreError::Transient(_)
                | StoreError::WrongRegion { .. }
                | StoreError::Other(_) => libc::EIO,
            },
        }
    }

    /// Whether a read found its object changed or gone in S3 since it was
    /// listed (a GET pinned to the listed ETag answered 412 or 404).
    pub fn is_changed_object(&self) -> bool {
        matches!(
            self,
            FsError::Stale | FsError::Store(StoreError::PreconditionFailed)
        )
    }

    /// Whether this is an expected answer (ENOENT, EISDIR, ...) rather than a
    /// fault worth a warning in the log.
    pub fn is_expected(&self) -> bool {
        !matches!(
            self,
            FsError::Store(_)
                | FsError::Stale
                | FsError::Local(..)
                | FsError::Upload(_)
                | FsError::Unlisted(_)
        )
    }
}

impl From<crate::write::WriteError> for FsError {
    fn from(e: crate::write::WriteError) -> Self {
        use crate::write::WriteError as W;
        match e {
            W::Full(f) => FsError::NoSpace(f.to_string()),
            W::Io(io) if io.raw_os_error() == Some(libc::ENOSPC) => {
                FsError::NoSpace(io.to_string())
            }
            W::Io(io) => FsError::Local(io.raw_os_error().unwrap_or(libc::EIO), io.to_string()),
            W::Upload(m) => FsError::Upload(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_is_never_enoent_and_missing_is_never_eio() {
        assert_eq!(
            FsError::from(StoreError::Throttled("x".into())).errno(),
            libc::EIO
        );
        assert_eq!(FsError::from(StoreError::NotFound).errno(), libc::ENOENT);
        assert_eq!(
            FsError::from(StoreError::PreconditionFailed).errno(),
            libc::ESTALE
        );
    }
}
