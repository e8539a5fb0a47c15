//! lakemount: mount an S3 / MinIO data lake as a read-only POSIX tree.
//!
//! # Layout
//! - [`cli`] / [`config`]: command line and TOML config -> [`config::Config`], no I/O.
//! - [`app`]: composition root: store -> fs -> FUSE session; signals; shutdown.
//! - [`fuse`]: the adapter implementing `fuser::Filesystem`; the only user of fuser types.
//! - [`fs`]: async POSIX operations, handles, errno mapping ([`fs::FsError`]).
//! - [`meta`]: inode table, listing cache, name rules.
//! - [`read`]: ranged GETs pinned to the ETag, sequential read-ahead.
//! - [`cache`]: the data cache (memory and local-disk tiers) for epochs 2..N; fully
//!   cached files are served by FUSE passthrough.
//! - [`write`](mod@write): writable mounts: staging on local disk, the overlay of local
//!   changes, background uploads.
//! - [`warm`]: `lakemount warm`, filling the cache of a running mount.
//! - [`store`]: the [`store::ObjectStore`] trait; `store::s3` is the only SDK user.
//! - [`telemetry`]: logging and metrics.

pub mod app;
pub mod cache;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod fs;
pub mod fstab;
pub mod fuse;
pub mod meta;
pub mod read;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod warm;
pub mod write;
