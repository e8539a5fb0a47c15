//! `mount-s3` for the benchmark: mounts a bucket (read-only unless --allow-writes) through the library
//! crates of Mountpoint for Amazon S3 (`mountpoint-s3-fs`, `mountpoint-s3-client`),
//! whose own CLI crate is not on crates.io. Only what bench/harness.py and
//! bench/torch_bench.py need; the defaults follow Mountpoint's CLI where it has one
//! (8 MiB parts, 16 FUSE threads, memory target 95% of the machine's memory,
//! 1 MiB cache blocks, the cache keeping 5% of its disk free, metadata TTL 60 s
//! when a cache is on, minimal otherwise).
//!
//!   mount-s3 BUCKET MOUNT_POINT [--prefix P/] [--endpoint-url URL] [--region R]
//!            [--force-path-style] [--cache DIR] [--metadata-ttl SECS|indefinite|minimal]
//!            [--allow-other] [--foreground] [--max-threads N] [--part-size BYTES] [--debug]
//!
//! Always in the foreground: runs until the file system is unmounted (`umount`)
//! or the process gets SIGINT/SIGTERM, then unmounts. Credentials come from the
//! usual AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the benchmark).
//! Bench-only (bench/README.md); not part of lakemount.

use std::path::PathBuf;

use anyhow::{Context as _, Result, anyhow};
use clap::Parser;
use mountpoint_s3_client::config::AddressingStyle;
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::data_cache::{CacheLimit, DataCacheConfig, DiskDataCacheConfig, ManagedCacheDir};
use mountpoint_s3_fs::fs::{CacheConfig, TimeToLive};
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::logging::{LoggingConfig, init_logging};
use mountpoint_s3_fs::memory::{CandidateSize, PagedPool, effective_total_memory};
use mountpoint_s3_fs::s3::config::{ClientConfig, MemoryLimitSetting, PartConfig, Region, TargetThroughputSetting};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig};

#[derive(Parser, Debug)]
#[command(name = "mount-s3", version = "(bench/mountpoint build of the Mountpoint for Amazon S3 libraries; versions in its Cargo.lock)", about = "Mount an S3 bucket read-only with Mountpoint's libraries (benchmark build)")]
struct Args {
    /// Bucket name
    bucket: String,
    /// Directory to mount the bucket at
    mount_point: PathBuf,
    /// Only this prefix of the bucket (must end with '/')
    #[arg(long, default_value = "")]
    prefix: String,
    /// S3 endpoint, e.g. http://127.0.0.1:39810
    #[arg(long)]
    endpoint_url: Option<String>,
    /// Signing region
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Path-style requests (http://host/bucket/key)
    #[arg(long)]
    force_path_style: bool,
    /// Local data cache: a directory in which Mountpoint keeps the blocks it read
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Size limit of the data cache in MiB (default: keep 5% of its disk free)
    #[arg(long, value_name = "MIB")]
    max_cache_size: Option<u64>,
    /// Metadata TTL: seconds, `indefinite` or `minimal` (default: 60 with --cache, else minimal)
    #[arg(long, value_name = "SECS")]
    metadata_ttl: Option<String>,
    /// Let other users (root included) use the mount
    #[arg(long)]
    allow_other: bool,
    /// Accepted for compatibility with mount-s3: read-only is this binary's default
    #[arg(long)]
    read_only: bool,
    /// Allow writes of new files (mount-s3's default; the read benchmarks mount read-only)
    #[arg(long, conflicts_with = "read_only")]
    allow_writes: bool,
    /// Accepted for compatibility with mount-s3; this binary always stays in the foreground
    #[arg(long, short = 'f')]
    foreground: bool,
    /// FUSE worker threads
    #[arg(long, default_value_t = 16)]
    max_threads: usize,
    /// GET part size in bytes
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    part_size: usize,
    /// Debug logging (MOUNTPOINT_LOG overrides the filter)
    #[arg(long)]
    debug: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // The benchmark runs on loopback: never let the credentials chain reach out to
    // the EC2 instance metadata service.
    if std::env::var_os("AWS_EC2_METADATA_DISABLED").is_none() {
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    }
    let _logging = init_logging(LoggingConfig {
        log_file: None,
        log_to_stdout: true,
        default_filter: if args.debug { "debug,awscrt=warn" } else { "warn,awscrt=off" }.to_string(),
    })?;

    let bucket = Bucket::new(args.bucket.clone()).map_err(|e| anyhow!("bucket {:?}: {e}", args.bucket))?;
    let prefix = Prefix::new(&args.prefix).map_err(|e| anyhow!("prefix {:?}: {e}", args.prefix))?;
    let s3_path = S3Path::new(bucket, prefix);

    let ttl = match &args.metadata_ttl {
        Some(s) => TimeToLive::new_from_str(s).map_err(|e| anyhow!("--metadata-ttl {s:?}: {e}"))?,
        None if args.cache.is_some() => TimeToLive::Duration(std::time::Duration::from_secs(60)),
        None => TimeToLive::Minimal,
    };
    let cache_config = CacheConfig::new(ttl);
    let fs_config = S3FilesystemConfig {
        cache_config: cache_config.clone(),
        s3_personality: S3Personality::Standard,
        read_only: !args.allow_writes,
        ..Default::default()
    };

    // The data cache lives in DIR/mountpoint-cache, emptied at mount (as mount-s3 does).
    let mut managed_cache_dir = None;
    let disk_cache_config = match &args.cache {
        None => None,
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cache directory {}", dir.display()))?;
            let managed = ManagedCacheDir::new_from_parent_with_cache_key(dir, None, true)
                .context("failed to create the cache directory")?;
            let cfg = DiskDataCacheConfig {
                cache_directory: managed.as_path_buf(),
                block_size: 1024 * 1024,
                limit: match args.max_cache_size {
                    Some(mib) => CacheLimit::TotalSize { max_size: (mib as usize) << 20 },
                    None => CacheLimit::default(),
                },
            };
            managed_cache_dir = Some(managed);
            Some(cfg)
        }
    };
    let data_cache_config = DataCacheConfig { disk_cache_config, express_cache_config: None };

    let fuse_config = FuseSessionConfig::new(
        MountPoint::new(&args.mount_point)?,
        FuseOptions { read_only: !args.allow_writes, allow_other: args.allow_other, ..Default::default() },
        args.max_threads,
    )?;
    let mp_config = MountpointConfig::new(fuse_config, fs_config, data_cache_config)?;

    let mem_limit = (effective_total_memory() as f64 * 0.95) as usize;
    let client_config = ClientConfig {
        region: Region::new_user_specified(args.region.clone()),
        endpoint_url: args.endpoint_url.clone(),
        addressing_style: if args.force_path_style { AddressingStyle::Path } else { AddressingStyle::Automatic },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: Default::default(),
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: TargetThroughputSetting::Default,
        bind: None,
        part_config: PartConfig::with_part_size(args.part_size).validate(MemoryLimitSetting::Default(mem_limit))?,
        user_agent: UserAgent::new(Some("lakemount-bench".to_string())),
        tls_config: None,
    };
    let pool = PagedPool::config()
        .with_candidate_sizes([CandidateSize::new(client_config.part_config.read_size_bytes)])
        .with_memory_limit(mem_limit)
        .build();
    // Like mount-s3: one ListObjectsV2 of the prefix first, so a wrong endpoint,
    // bucket or credentials fail the mount instead of the first read.
    let client = client_config.create_client(pool.clone(), Some(&s3_path)).context("failed to create the S3 client")?;
    let runtime = Runtime::new(client.event_loop_group());
    let superblock = Superblock::new(
        client.clone(),
        s3_path,
        SuperblockConfig { cache_config, s3_personality: S3Personality::Standard },
    );
    let mut session = mp_config
        .create_fuse_session(superblock, client, runtime, pool)
        .context("failed to mount")?;
    if let Some(dir) = managed_cache_dir {
        session.run_on_close(Box::new(move || drop(dir)));
    }
    eprintln!("mount-s3 (bench): {} mounted at {}", args.bucket, args.mount_point.display());
    session.join().context("FUSE session")
}
