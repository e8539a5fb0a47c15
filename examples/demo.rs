//! The main job end to end on an embedded default: an S3 server on loopback
//! (in-process), a generated sample data set, a lakemount mount, every file read
//! through the mount by parallel readers as a data loader does, each file's
//! checksum verified against the source, throughput and S3 request counts
//! printed, then unmount.
//!
//! `cargo run --release --example demo [-- --help]`

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use lakemount::app::Mounted;
use lakemount::cli::Source;
use lakemount::config::Config;
use lakemount_testserver::TestServer;

/// Demo settings.
#[derive(Debug, Parser)]
#[command(about = "Mount an embedded S3 server's sample data set and read it all back")]
struct Args {
    /// WebDataset-style tar shards to generate.
    #[arg(long, default_value_t = 8)]
    shards: usize,
    /// Size of each shard, MiB.
    #[arg(long, default_value_t = 32)]
    shard_mib: usize,
    /// Small JPEG-sized files (4-12 KB) to generate.
    #[arg(long, default_value_t = 3000)]
    small_files: usize,
    /// Parallel readers (data-loader workers).
    #[arg(long, default_value_t = 8)]
    readers: usize,
    /// Mount point (default: a fresh directory under /tmp).
    #[arg(long)]
    mountpoint: Option<PathBuf>,
}

const BUCKET: &str = "lakemount-demo";

/// One object of the sample set: its key, size, and CRC32C.
struct Expected {
    key: String,
    size: usize,
    crc: u32,
}

/// Deterministic bytes (xorshift64), so every run checks the same data.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// A WebDataset shard: samples of `NNNNNN.jpg` + `NNNNNN.cls` in a POSIX tar.
fn make_shard(shard: usize, target: usize) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::with_capacity(target + (1 << 20)));
    let mut sample = 0usize;
    while builder.get_ref().len() < target {
        let id = shard * 1_000_000 + sample;
        let mut jpg = vec![0u8; 60_000 + (id * 7919) % 120_000];
        fill(&mut jpg, id as u64);
        for (name, body) in [
            (format!("{id:09}.jpg"), jpg),
            (
                format!("{id:09}.cls"),
                format!("{}\n", id % 1000).into_bytes(),
            ),
        ] {
            let mut h = tar::Header::new_ustar();
            h.set_size(body.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            builder
                .append_data(&mut h, name, &body[..])
                .expect("tar append");
        }
        sample += 1;
    }
    builder.into_inner().expect("tar finish")
}

fn populate(server: &TestServer, args: &Args) -> Vec<Expected> {
    let mut expected = Vec::new();
    for i in 0..args.shards {
        let body = make_shard(i, args.shard_mib << 20);
        let key = format!("train/shards/shard-{i:05}.tar");
        expected.push(Expected {
            key: key.clone(),
            size: body.len(),
            crc: crc32c::crc32c(&body),
        });
        server.put(BUCKET, &key, body);
    }
    for i in 0..args.small_files {
        let mut body = vec![0u8; 4_000 + (i * 2_654_435_761) % 8_000];
        fill(&mut body, 1 << 40 | i as u64);
        body[..4].copy_from_slice(&[0xFF, 0xD8, 0xFF, 0xE0]); // JPEG SOI + APP0
        let key = format!("train/images/{:02}/img-{i:06}.jpg", i % 16);
        expected.push(Expected {
            key: key.clone(),
            size: body.len(),
            crc: crc32c::crc32c(&body),
        });
        server.put(BUCKET, &key, body);
    }
    expected
}

/// Reads one file as a loader worker would; a `.tar` is walked sample by sample.
/// Returns (bytes, samples, crc) of what the mount served.
fn read_through(path: &Path) -> std::io::Result<(usize, usize, u32)> {
    struct Crc<R> {
        inner: R,
        crc: u32,
        bytes: usize,
    }
    impl<R: Read> Read for Crc<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
            self.bytes += n;
            Ok(n)
        }
    }
    let file = std::fs::File::open(path)?;
    let mut r = Crc {
        inner: std::io::BufReader::with_capacity(1 << 20, file),
        crc: 0,
        bytes: 0,
    };
    let mut samples = 0;
    if path.extension().is_some_and(|e| e == "tar") {
        let mut archive = tar::Archive::new(&mut r);
        for entry in archive.entries()? {
            let mut entry = entry?;
            if entry.path()?.extension().is_some_and(|e| e == "jpg") {
                samples += 1;
            }
            std::io::copy(&mut entry, &mut std::io::sink())?;
        }
    }
    std::io::copy(&mut r, &mut std::io::sink())?; // tar padding after the end marker
    Ok((r.bytes, samples, r.crc))
}

fn mib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Credentials of the embedded server, for the SDK's environment provider.
    // SAFETY: set before any other thread of this process exists.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", lakemount_testserver::ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", lakemount_testserver::SECRET_KEY);
    }
    lakemount::telemetry::init_logging("warn,lakemount=info")?;

    let server = TestServer::start_background()?;
    server.create_bucket(BUCKET);
    let t = Instant::now();
    let expected = populate(&server, &args);
    let total: usize = expected.iter().map(|e| e.size).sum();
    println!(
        "S3 server on {} holds s3://{BUCKET}: {} shards of ~{} MiB, {} small files, {:.1} MiB in all ({:.1} s to generate)",
        server.endpoint(),
        args.shards,
        args.shard_mib,
        args.small_files,
        total as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );

    let scratch = std::env::temp_dir().join(format!("lakemount-demo-{}", std::process::id()));
    let mountpoint = args
        .mountpoint
        .clone()
        .unwrap_or_else(|| scratch.join("mnt"));
    std::fs::create_dir_all(&mountpoint)?;
    let mut config = Config::default();
    config.s3.endpoint_url = Some(server.endpoint());
    config.validate()?;
    let source = Source::parse(&format!("s3://{BUCKET}")).map_err(anyhow::Error::msg)?;
    let mounted = Mounted::start(&source, &mountpoint, &config)?;
    println!("mounted s3://{BUCKET} at {}", mountpoint.display());
    server.reset_counts();

    // Parallel readers pull work from one queue, shards first, as loader workers do.
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let shard_bytes = AtomicUsize::new(0);
    let samples = AtomicUsize::new(0);
    let verified = AtomicUsize::new(0);
    let t = Instant::now();
    let shard_time = Mutex::new(Duration::ZERO);
    std::thread::scope(|s| {
        for _ in 0..args.readers.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(e) = expected.get(i) else { break };
                    match read_through(&mountpoint.join(&e.key)) {
                        Ok((bytes, n, crc)) if bytes == e.size && crc == e.crc => {
                            verified.fetch_add(1, Ordering::Relaxed);
                            samples.fetch_add(n, Ordering::Relaxed);
                            if e.key.ends_with(".tar") {
                                shard_bytes.fetch_add(bytes, Ordering::Relaxed);
                                *shard_time.lock().unwrap() = t.elapsed();
                            }
                        }
                        Ok((bytes, _, crc)) => failures.lock().unwrap().push(format!(
                            "{}: read {bytes} bytes crc {crc:08x}, expected {} bytes crc {:08x}",
                            e.key, e.size, e.crc
                        )),
                        Err(err) => failures.lock().unwrap().push(format!("{}: {err}", e.key)),
                    }
                }
            });
        }
    });
    let elapsed = t.elapsed();
    let listed = walk_count(&mountpoint)?;
    let failures = failures.into_inner().unwrap();
    let shard_elapsed = *shard_time.lock().unwrap();
    let small = expected.len() - args.shards;

    println!(
        "read {} files ({:.1} MiB) with {} parallel readers in {:.2} s: {:.1} MiB/s overall",
        expected.len(),
        total as f64 / (1 << 20) as f64,
        args.readers,
        elapsed.as_secs_f64(),
        mib_per_s(total, elapsed)
    );
    println!(
        "  shards: {} samples, {:.1} MiB/s while shards were being read",
        samples.load(Ordering::Relaxed),
        mib_per_s(shard_bytes.load(Ordering::Relaxed), shard_elapsed)
    );
    println!(
        "  small files: {small} files, {:.0} files/s over the run",
        small as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    println!("  directory walk found {listed} files");
    println!(
        "S3 requests seen by the server while reading (after the mount's one start-up \
         ListObjectsV2 probe): ListObjectsV2 {}, HeadObject {}, GetObject {}",
        server.request_count("ListObjectsV2"),
        server.request_count("HeadObject"),
        server.request_count("GetObject")
    );
    mounted.unmount()?;
    let _ = std::fs::remove_dir_all(&scratch);
    println!("unmounted");

    if failures.is_empty() && listed == expected.len() {
        println!(
            "checksums verified: {}/{} files OK",
            verified.load(Ordering::Relaxed),
            expected.len()
        );
        Ok(())
    } else {
        for f in &failures {
            eprintln!("MISMATCH {f}");
        }
        anyhow::bail!(
            "{} of {} files failed verification; the walk found {listed} files",
            failures.len(),
            expected.len()
        )
    }
}

/// Files under `root`, counted by a directory walk through the mount.
fn walk_count(root: &Path) -> std::io::Result<usize> {
    let mut count = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            } else {
                count += 1;
            }
        }
    }
    Ok(count)
}
