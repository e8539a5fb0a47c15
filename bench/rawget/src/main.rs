//! rawget: the raw-S3 side of lakemount's benchmark harness (bench/harness.py).
//!
//! * The **limit**: pulls objects with concurrent ranged GETs through the same
//!   S3 client library lakemount uses (`aws-sdk-s3`, hyper 1 HTTP client), with
//!   no file system in between: the best any mount could do on this server.
//! * Deterministic **data sets**: tar shards and trees of small files from a
//!   seeded PRNG (same bytes on every machine), and a concurrent uploader.
//!
//! Usage (options are `--name value`; every command prints one JSON line):
//!
//! ```text
//! rawget gen-shards --dir D --count N --size BYTES [--seed S]
//! rawget gen-files  --dir D --dirs N --per-dir M --min BYTES --max BYTES --ext EXT [--seed S]
//! rawget put   --bucket B --dir D --prefix P [--concurrency 64]
//! rawget seq   --bucket B --keys K1,K2 [--part 8388608] [--concurrency 16] [--max-secs 10]
//! rawget rand  --bucket B --keys K1,K2 --bs 4096 [--concurrency 4] [--secs 6] [--seed 1]
//! rawget small --bucket B --prefix P [--concurrency 8] [--max-secs 10]
//! rawget list  --bucket B --prefix P [--max-secs 20]
//! rawget mpu   --bucket B --key K --file F [--part 8388608] [--concurrency 16]
//! rawget wait  --bucket B --key K --size BYTES [--max-secs 600]
//! ```
//!
//! `mpu` is the raw multipart-upload limit: one file uploaded as one object
//! with fixed-size parts, `--concurrency` parts in flight. `wait` polls
//! HeadObject until `K` exists with `--size` bytes (a write-back mount's
//! upload finished) and prints how long that took.
//!
//! S3 commands take `--endpoint URL` (else `AWS_ENDPOINT_URL`) and `--region R`
//! (else `AWS_REGION`, else `us-east-1`); credentials come from the usual AWS
//! chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`). Path-style addressing.
//! An HTTPS endpoint with its own CA: `AWS_CA_BUNDLE` (a PEM file), as lakemount.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::primitives::ByteStream;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first().cloned() else {
        eprintln!("usage: rawget gen-shards|gen-files|put|seq|rand|small|list --opt value ...");
        std::process::exit(2);
    };
    let opts = match parse_opts(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rawget: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let res = rt.block_on(async move {
        match cmd.as_str() {
            "gen-shards" => gen_shards(&opts),
            "gen-files" => gen_files(&opts),
            "put" => put(&opts).await,
            "seq" => seq(&opts).await,
            "rand" => rand(&opts).await,
            "small" => small(&opts).await,
            "list" => list(&opts).await,
            "mpu" => mpu(&opts).await,
            "wait" => wait(&opts).await,
            other => Err(format!("unknown command {other}").into()),
        }
    });
    if let Err(e) = res {
        eprintln!("rawget: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- options

struct Opts(HashMap<String, String>);

fn parse_opts(args: &[String]) -> Result<Opts> {
    let mut map = HashMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let name = a
            .strip_prefix("--")
            .ok_or_else(|| format!("expected --option, got {a}"))?;
        let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        map.insert(name.to_string(), value.clone());
    }
    Ok(Opts(map))
}

impl Opts {
    fn str(&self, name: &str) -> Result<String> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| format!("missing --{name}").into())
    }
    fn num(&self, name: &str, default: Option<u64>) -> Result<u64> {
        match (self.0.get(name), default) {
            (Some(v), _) => Ok(v
                .parse()
                .map_err(|_| format!("--{name}: not a number: {v}"))?),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("missing --{name}").into()),
        }
    }
    fn secs(&self, name: &str, default: f64) -> Result<Duration> {
        let v = match self.0.get(name) {
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name}: not a number: {v}"))?,
            None => default,
        };
        Ok(Duration::from_secs_f64(v))
    }
}

// ---------------------------------------------------------------- PRNG

/// splitmix64: tiny, fast, deterministic on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let v = self.next().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&v[..n]);
    }
}

/// FNV-1a of a name, to derive a per-file seed.
fn name_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

// ---------------------------------------------------------------- data sets

/// One 512-byte ustar header for a regular file.
fn tar_header(name: &str, size: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    let put = |h: &mut [u8; 512], off: usize, s: &[u8]| h[off..off + s.len()].copy_from_slice(s);
    put(&mut h, 0, name.as_bytes());
    put(&mut h, 100, b"0000644\0");
    put(&mut h, 108, b"0001750\0");
    put(&mut h, 116, b"0001750\0");
    put(&mut h, 124, format!("{size:011o}\0").as_bytes());
    put(
        &mut h,
        136,
        format!("{:011o}\0", 1_700_000_000u64).as_bytes(),
    );
    put(&mut h, 148, b"        ");
    h[156] = b'0';
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    put(&mut h, 265, b"bench");
    put(&mut h, 297, b"bench");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    h
}

/// WebDataset-style tar shards: samples `NNNNNN.jpg` (64-192 KiB of random
/// bytes) + `NNNNNN.cls` (a label), until the shard reaches `--size` bytes.
fn gen_shards(o: &Opts) -> Result<()> {
    let dir = PathBuf::from(o.str("dir")?);
    let count = o.num("count", None)?;
    let size = o.num("size", None)?;
    let seed = o.num("seed", Some(1))?;
    std::fs::create_dir_all(&dir)?;
    let start = Instant::now();
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 << 10];
    for s in 0..count {
        let name = format!("shard-{s:04}.tar");
        let path = dir.join(&name);
        let mut rng = Rng::new(name_seed(seed, &name));
        let mut out = std::io::BufWriter::with_capacity(4 << 20, std::fs::File::create(&path)?);
        let mut written = 0u64;
        let mut i = 0u64;
        // Leave room for the last sample and the two zero blocks that end the archive.
        while written + 1024 + (200 << 10) < size {
            let jpg = 65536 + rng.below(131072);
            let base = format!("{s:04}{i:06}");
            out.write_all(&tar_header(&format!("{base}.jpg"), jpg))?;
            let padded = jpg.div_ceil(512) * 512;
            let body = &mut buf[..padded as usize];
            rng.fill(body);
            body[jpg as usize..].fill(0);
            out.write_all(body)?;
            let cls = format!("{}\n", rng.below(1000));
            out.write_all(&tar_header(&format!("{base}.cls"), cls.len() as u64))?;
            let mut block = [0u8; 512];
            block[..cls.len()].copy_from_slice(cls.as_bytes());
            out.write_all(&block)?;
            written += 512 + padded + 1024;
            i += 1;
        }
        // Pad with zero blocks to exactly `size` (a tar ends with >= 2 zero blocks).
        let pad = size - written;
        let zeros = vec![0u8; 1 << 20];
        let mut left = pad;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            out.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        out.flush()?;
        total += size;
    }
    println!(
        "{{\"cmd\":\"gen-shards\",\"files\":{count},\"bytes\":{total},\"secs\":{:.3}}}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--dirs` directories (`dNNN/`) of `--per-dir` files (`fNNNN.EXT`), or with
/// `--dirs 0` one flat directory of `--per-dir` files (`fNNNNNN.EXT`); sizes
/// uniform in [min, max], contents random. Existing files of the right size are kept.
fn gen_files(o: &Opts) -> Result<()> {
    let dir = PathBuf::from(o.str("dir")?);
    let dirs = o.num("dirs", None)?;
    let per_dir = o.num("per-dir", None)?;
    let min = o.num("min", None)?;
    let max = o.num("max", None)?;
    let ext = o.str("ext")?;
    let seed = o.num("seed", Some(1))?;
    let start = Instant::now();
    let mut buf = vec![0u8; max as usize];
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut one = |rel: String| -> Result<()> {
        let path = dir.join(&rel);
        let mut rng = Rng::new(name_seed(seed, &rel));
        let size = min + rng.below(max - min + 1);
        files += 1;
        bytes += size;
        if std::fs::metadata(&path)
            .map(|m| m.len() == size)
            .unwrap_or(false)
        {
            return Ok(());
        }
        rng.fill(&mut buf[..size as usize]);
        std::fs::write(&path, &buf[..size as usize])?;
        Ok(())
    };
    if dirs == 0 {
        std::fs::create_dir_all(&dir)?;
        for i in 0..per_dir {
            one(format!("f{i:06}.{ext}"))?;
        }
    } else {
        for d in 0..dirs {
            std::fs::create_dir_all(dir.join(format!("d{d:03}")))?;
            for i in 0..per_dir {
                one(format!("d{d:03}/f{i:04}.{ext}"))?;
            }
        }
    }
    println!(
        "{{\"cmd\":\"gen-files\",\"files\":{files},\"bytes\":{bytes},\"secs\":{:.3}}}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------- S3

async fn client(o: &Opts) -> Result<aws_sdk_s3::Client> {
    let region =
        o.0.get("region")
            .cloned()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .unwrap_or_else(|| "us-east-1".into());
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).region(Region::new(region));
    if let Some(ep) = o.0.get("endpoint") {
        loader = loader.endpoint_url(ep);
    }
    // AWS_CA_BUNDLE as lakemount reads it (an HTTPS endpoint with its own
    // CA), with the same HTTP client and TLS stack.
    if let Some(path) = std::env::var_os("AWS_CA_BUNDLE").filter(|p| !p.is_empty()) {
        use aws_smithy_http_client::tls::{
            self, TlsContext, TrustStore, rustls_provider::CryptoMode,
        };
        let pem = std::fs::read(&path).map_err(|e| err("reading AWS_CA_BUNDLE", e))?;
        let trust = TrustStore::empty()
            .with_native_roots(false)
            .with_pem_certificate(pem);
        let ctx = TlsContext::builder()
            .with_trust_store(trust)
            .build()
            .map_err(|e| err("AWS_CA_BUNDLE", e))?;
        loader = loader.http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(ctx)
                .build_https(),
        );
    }
    let sdk = loader.load().await;
    // No checksums computed or validated on our side: lakemount's ranged GETs are
    // not validated either, and plain PUTs keep the upload a single request.
    let conf = aws_sdk_s3::config::Builder::from(&sdk)
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .build();
    Ok(aws_sdk_s3::Client::from_conf(conf))
}

fn err<E: std::error::Error>(what: &str, e: E) -> Box<dyn std::error::Error + Send + Sync> {
    format!("{what}: {}", aws_sdk_s3::error::DisplayErrorContext(e)).into()
}

/// Uploads `--file` as `--key` by one multipart upload of `--part`-byte
/// parts, `--concurrency` in flight.
async fn mpu(o: &Opts) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let key = o.str("key")?;
    let path = PathBuf::from(o.str("file")?);
    let part = o.num("part", Some(8 << 20))?;
    let conc = o.num("concurrency", Some(16))? as usize;
    let file = Arc::new(std::fs::File::open(&path)?);
    let size = file.metadata()?.len();
    let start = Instant::now();
    let id = s3
        .create_multipart_upload()
        .bucket(&bucket)
        .key(&key)
        .send()
        .await
        .map_err(|e| err("CreateMultipartUpload", e))?
        .upload_id()
        .ok_or("no upload id")?
        .to_string();
    let n = size.div_ceil(part);
    let sem = Arc::new(tokio::sync::Semaphore::new(conc));
    let mut tasks = Vec::new();
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await?;
        let (s3, bucket, key, id, file) = (
            s3.clone(),
            bucket.clone(),
            key.clone(),
            id.clone(),
            file.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let off = i * part;
            let len = part.min(size - off) as usize;
            let data = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, off).map(|_| buf)
            })
            .await??;
            let out = s3
                .upload_part()
                .bucket(&bucket)
                .key(&key)
                .upload_id(&id)
                .part_number(i as i32 + 1)
                .body(ByteStream::from(data))
                .send()
                .await
                .map_err(|e| err("UploadPart", e))?;
            drop(permit);
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                aws_sdk_s3::types::CompletedPart::builder()
                    .part_number(i as i32 + 1)
                    .set_e_tag(out.e_tag().map(str::to_string))
                    .build(),
            )
        }));
    }
    let mut parts = Vec::new();
    for t in tasks {
        parts.push(t.await??);
    }
    s3.complete_multipart_upload()
        .bucket(&bucket)
        .key(&key)
        .upload_id(&id)
        .multipart_upload(
            aws_sdk_s3::types::CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .map_err(|e| err("CompleteMultipartUpload", e))?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"cmd\":\"mpu\",\"bytes\":{size},\"parts\":{n},\"secs\":{secs:.3},\"mb_per_s\":{:.1}}}",
        size as f64 / secs / 1e6
    );
    Ok(())
}

/// Polls HeadObject of `--key` (every 20 ms) until it has `--size` bytes.
async fn wait(o: &Opts) -> Result<()> {
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let key = o.str("key")?;
    let size = o.num("size", None)? as i64;
    let max = Duration::from_secs(o.num("max-secs", Some(600))?);
    let start = Instant::now();
    loop {
        if let Ok(h) = s3.head_object().bucket(&bucket).key(&key).send().await
            && h.content_length() == Some(size)
        {
            break;
        }
        if start.elapsed() > max {
            return Err(format!("{key}: not {size} bytes after {max:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "{{\"cmd\":\"wait\",\"secs\":{:.3}}}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Uploads every file under `--dir` as `--prefix` + its relative path.
async fn put(o: &Opts) -> Result<()> {
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let dir = PathBuf::from(o.str("dir")?);
    let prefix = o.str("prefix")?;
    let conc = o.num("concurrency", Some(64))? as usize;
    let mut files = Vec::new();
    walk(&dir, &mut files)?;
    files.sort();
    let files = Arc::new(files);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (s3, bucket, dir, prefix, files, next, done, bytes) = (
            s3.clone(),
            bucket.clone(),
            dir.clone(),
            prefix.clone(),
            files.clone(),
            next.clone(),
            done.clone(),
            bytes.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = files.get(i) else {
                    return Ok::<(), Box<dyn std::error::Error + Send + Sync>>(());
                };
                let rel = path
                    .strip_prefix(&dir)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                let key = format!("{prefix}{rel}");
                let len = std::fs::metadata(path)?.len();
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let body = reopen(path, len).await?;
                    let res = s3
                        .put_object()
                        .bucket(&bucket)
                        .key(&key)
                        .content_length(len as i64)
                        .body(body)
                        .send()
                        .await;
                    match res {
                        Ok(_) => break,
                        Err(e) if attempt < 5 => {
                            eprintln!(
                                "rawget put {key}: attempt {attempt}: {}",
                                aws_sdk_s3::error::DisplayErrorContext(&e)
                            );
                            tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                        }
                        Err(e) => return Err(err(&format!("PUT {key}"), e)),
                    }
                }
                bytes.fetch_add(len, Ordering::Relaxed);
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 20000 == 0 {
                    eprintln!(
                        "rawget put: {n}/{} objects, {:.0} s",
                        files.len(),
                        start.elapsed().as_secs_f64()
                    );
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"cmd\":\"put\",\"files\":{},\"bytes\":{},\"secs\":{secs:.3},\"files_per_s\":{:.1}}}",
        files.len(),
        bytes.load(Ordering::Relaxed),
        files.len() as f64 / secs
    );
    Ok(())
}

async fn reopen(path: &Path, len: u64) -> Result<ByteStream> {
    if len > (16 << 20) {
        Ok(ByteStream::from_path(path)
            .await
            .map_err(|e| err("read", e))?)
    } else {
        Ok(ByteStream::from(tokio::fs::read(path).await?))
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            walk(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// Object sizes by HEAD.
async fn sizes(s3: &aws_sdk_s3::Client, bucket: &str, keys: &[String]) -> Result<Vec<u64>> {
    let mut v = Vec::new();
    for k in keys {
        let h = s3
            .head_object()
            .bucket(bucket)
            .key(k)
            .send()
            .await
            .map_err(|e| err(&format!("HEAD {k}"), e))?;
        v.push(h.content_length().unwrap_or(0) as u64);
    }
    Ok(v)
}

/// One ranged GET (or a whole-object GET when `range` is None); returns the
/// body's length, read chunk by chunk and dropped (nothing is copied or kept).
async fn get(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    range: Option<(u64, u64)>,
) -> Result<u64> {
    let mut req = s3.get_object().bucket(bucket).key(key);
    if let Some((a, b)) = range {
        req = req.range(format!("bytes={a}-{}", b - 1));
    }
    let out = req
        .send()
        .await
        .map_err(|e| err(&format!("GET {key}"), e))?;
    let mut body = out.body;
    let mut n = 0u64;
    while let Some(chunk) = body
        .try_next()
        .await
        .map_err(|e| err(&format!("GET {key} body"), e))?
    {
        n += chunk.len() as u64;
    }
    Ok(n)
}

fn keys_opt(o: &Opts) -> Result<Vec<String>> {
    Ok(o.str("keys")?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}

fn report(cmd: &str, bytes: u64, requests: u64, secs: f64, extra: &str) {
    println!(
        "{{\"cmd\":\"{cmd}\",\"bytes\":{bytes},\"requests\":{requests},\"secs\":{secs:.4},\"mib_per_s\":{:.2},\"req_per_s\":{:.2}{extra}}}",
        bytes as f64 / secs / 1048576.0,
        requests as f64 / secs
    );
}

/// Sequential limit: every object split into `--part`-byte ranges, fetched by
/// `--concurrency` workers (parts of all objects interleaved, so K objects are
/// pulled side by side as K sequential readers would), until all bytes are in
/// or `--max-secs` passed (no new GET starts after that).
async fn seq(o: &Opts) -> Result<()> {
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let keys = keys_opt(o)?;
    let part = o.num("part", Some(8 << 20))?;
    let conc = o.num("concurrency", Some(16))? as usize;
    let max = o.secs("max-secs", 10.0)?;
    let sizes = sizes(&s3, &bucket, &keys).await?;
    let mut work: Vec<(usize, u64, u64)> = Vec::new();
    let nparts = sizes.iter().map(|s| s.div_ceil(part)).max().unwrap_or(0);
    for p in 0..nparts {
        for (k, &size) in sizes.iter().enumerate() {
            let a = p * part;
            if a < size {
                work.push((k, a, (a + part).min(size)));
            }
        }
    }
    let work = Arc::new(work);
    let keys = Arc::new(keys);
    let next = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let reqs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (s3, bucket, keys, work, next, bytes, reqs) = (
            s3.clone(),
            bucket.clone(),
            keys.clone(),
            work.clone(),
            next.clone(),
            bytes.clone(),
            reqs.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < max {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(k, a, b)) = work.get(i) else { break };
                let n = get(&s3, &bucket, &keys[k], Some((a, b))).await?;
                bytes.fetch_add(n, Ordering::Relaxed);
                reqs.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    report(
        "seq",
        bytes.load(Ordering::Relaxed),
        reqs.load(Ordering::Relaxed),
        secs,
        &format!(",\"concurrency\":{conc},\"part\":{part}"),
    );
    Ok(())
}

/// Random limit: `--concurrency` workers each issue `--bs`-byte ranged GETs at
/// random `--bs`-aligned offsets of random objects for `--secs` seconds.
async fn rand(o: &Opts) -> Result<()> {
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let keys = Arc::new(keys_opt(o)?);
    let bs = o.num("bs", None)?;
    let conc = o.num("concurrency", Some(4))?;
    let dur = o.secs("secs", 6.0)?;
    let seed = o.num("seed", Some(1))?;
    let sizes = Arc::new(sizes(&s3, &bucket, &keys).await?);
    let bytes = Arc::new(AtomicU64::new(0));
    let reqs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..conc {
        let (s3, bucket, keys, sizes, bytes, reqs) = (
            s3.clone(),
            bucket.clone(),
            keys.clone(),
            sizes.clone(),
            bytes.clone(),
            reqs.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed.wrapping_mul(1000).wrapping_add(w));
            while start.elapsed() < dur {
                let k = rng.below(keys.len() as u64) as usize;
                let blocks = sizes[k] / bs;
                let a = rng.below(blocks) * bs;
                let n = get(&s3, &bucket, &keys[k], Some((a, a + bs))).await?;
                bytes.fetch_add(n, Ordering::Relaxed);
                reqs.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    report(
        "rand",
        bytes.load(Ordering::Relaxed),
        reqs.load(Ordering::Relaxed),
        secs,
        &format!(",\"concurrency\":{conc},\"bs\":{bs}"),
    );
    Ok(())
}

/// Every key under a prefix (ListObjectsV2 pages of 1000, no delimiter).
async fn list_keys(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
    deadline: Option<Instant>,
) -> Result<(Vec<(String, u64)>, u64)> {
    let mut out = Vec::new();
    let mut token = None;
    let mut pages = 0;
    loop {
        let r = s3
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token)
            .send()
            .await
            .map_err(|e| err(&format!("LIST {prefix}"), e))?;
        pages += 1;
        for obj in r.contents() {
            out.push((
                obj.key().unwrap_or_default().to_string(),
                obj.size().unwrap_or(0) as u64,
            ));
        }
        token = r.next_continuation_token().map(str::to_string);
        if token.is_none() || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok((out, pages));
        }
    }
}

/// Small-file limit: lists the prefix (not timed), then `--concurrency` workers
/// GET whole objects until all are read or `--max-secs` passed.
async fn small(o: &Opts) -> Result<()> {
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let prefix = o.str("prefix")?;
    let conc = o.num("concurrency", Some(8))? as usize;
    let max = o.secs("max-secs", 10.0)?;
    let (keys, _) = list_keys(&s3, &bucket, &prefix, None).await?;
    let keys = Arc::new(keys);
    let next = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let reqs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (s3, bucket, keys, next, bytes, reqs) = (
            s3.clone(),
            bucket.clone(),
            keys.clone(),
            next.clone(),
            bytes.clone(),
            reqs.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < max {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((k, _)) = keys.get(i) else { break };
                let n = get(&s3, &bucket, k, None).await?;
                bytes.fetch_add(n, Ordering::Relaxed);
                reqs.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let files = reqs.load(Ordering::Relaxed);
    report(
        "small",
        bytes.load(Ordering::Relaxed),
        files,
        secs,
        &format!(
            ",\"files\":{files},\"files_per_s\":{:.1},\"concurrency\":{conc}",
            files as f64 / secs
        ),
    );
    Ok(())
}

/// Metadata limit: one paginated ListObjectsV2 of the prefix (1000 keys a page,
/// one page after another), entries per second.
async fn list(o: &Opts) -> Result<()> {
    let s3 = client(o).await?;
    let bucket = o.str("bucket")?;
    let prefix = o.str("prefix")?;
    let max = o.secs("max-secs", 20.0)?;
    let start = Instant::now();
    let (keys, pages) = list_keys(&s3, &bucket, &prefix, Some(start + max)).await?;
    let secs = start.elapsed().as_secs_f64();
    let files = keys.len() as u64;
    report(
        "list",
        0,
        pages,
        secs,
        &format!(
            ",\"files\":{files},\"files_per_s\":{:.1}",
            files as f64 / secs
        ),
    );
    Ok(())
}
