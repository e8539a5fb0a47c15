//! Command line: clap types and their mapping onto [`Config`]. No I/O here
//! except reading the `--config` file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError};

/// Mount an S3 / MinIO bucket as a read-only POSIX tree.
#[derive(Debug, Parser)]
#[command(name = "lakemount", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount s3://BUCKET[/PREFIX] at MOUNTPOINT (read-only unless --read-write). Stays in the
    /// foreground until SIGINT/SIGTERM or `umount`, unless --daemon.
    Mount(Box<MountArgs>),
    /// Fill the data cache of a running mount: read PATHs (files, or directories
    /// recursively) through it in parallel, skipping what is cached already.
    Warm(WarmArgs),
    /// Live view of a running mount: bytes by source, cache hit ratio, S3
    /// requests and their latency, read-ahead, cache, uploads.
    Stats(StatsArgs),
    /// Short baseline through a running mount (metadata walk, small files, one
    /// sequential read) that names the likely bottleneck.
    Doctor(DoctorArgs),
}

/// `lakemount doctor` arguments.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The mount point of a running lakemount (or a directory in it to test).
    pub mountpoint: PathBuf,
    /// Print the measurements and findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// Directory entries the metadata walk stats at most.
    #[arg(long, default_value_t = 5000)]
    pub max_entries: u64,
    /// Small files (at most 1 MiB) read at most.
    #[arg(long, default_value_t = 200)]
    pub small_files: usize,
    /// Bytes of the largest file the sequential read reads at most: "256MiB".
    #[arg(long, value_parser = parse_bytes, default_value = "256MiB")]
    pub seq_bytes: u64,
    /// Seconds each step may take at most.
    #[arg(long, default_value_t = 30.0)]
    pub max_secs: f64,
}

/// `lakemount stats` arguments.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The mount point of a running lakemount.
    pub mountpoint: PathBuf,
    /// Print the stats document as JSON (bytes, seconds, counts), one line per refresh.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds (default 2; `--watch=5`) until interrupted,
    /// with rates since the last refresh.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2",
          require_equals = true, value_parser = parse_watch)]
    pub watch: Option<f64>,
    /// The control socket, when not the default one of MOUNTPOINT.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// `--watch` seconds: 0.1 to one day.
fn parse_watch(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.1..=86_400.0).contains(v))
        .ok_or_else(|| format!("{s:?}: seconds from 0.1 to 86400"))
}

/// `lakemount warm` arguments.
#[derive(Debug, Args)]
pub struct WarmArgs {
    /// Files or directories on a lakemount mount with a data cache.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Files read at once.
    #[arg(long, short = 'j', default_value_t = 8)]
    pub jobs: usize,
    /// Refuse (read nothing) when more than SIZE is to be fetched: bytes, "20GiB".
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub max_bytes: Option<u64>,
    /// Warm even when it is more than --max-bytes or than the cache can hold.
    #[arg(long)]
    pub force: bool,
}

/// A size in bytes: "4096", "512MiB", "20GiB" (no percentages).
fn parse_bytes(s: &str) -> Result<u64, String> {
    match crate::cache::Size::parse(s)? {
        crate::cache::Size::Bytes(b) => Ok(b),
        crate::cache::Size::Percent(_) => Err(format!("{s:?}: a size in bytes, not a percentage")),
    }
}

/// `lakemount mount` arguments. Each option overrides the config file key named
/// in its help; each `LAKEMOUNT_*` variable overrides the file, the option the variable.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// Bucket and optional prefix: s3://BUCKET[/PREFIX].
    pub source: String,
    /// Existing directory to mount on.
    pub mountpoint: PathBuf,

    /// TOML config file (see config/lakemount.toml for every key).
    #[arg(long, env = "LAKEMOUNT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// S3 endpoint for MinIO and other S3-compatible stores [s3.endpoint_url].
    #[arg(long, env = "LAKEMOUNT_ENDPOINT_URL", value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// Region [s3.region].
    #[arg(long, env = "LAKEMOUNT_REGION")]
    pub region: Option<String>,
    /// Shared-config profile for credentials [s3.profile].
    #[arg(long, env = "LAKEMOUNT_PROFILE")]
    pub profile: Option<String>,
    /// Path-style addressing (default for a custom endpoint) [s3.force_path_style].
    #[arg(long, conflicts_with = "virtual_hosted_style")]
    pub force_path_style: bool,
    /// Virtual-hosted-style addressing (BUCKET.endpoint) [s3.force_path_style = false].
    #[arg(long)]
    pub virtual_hosted_style: bool,
    /// Send unsigned requests (public buckets) [s3.no_sign_request].
    #[arg(long)]
    pub no_sign_request: bool,
    /// PEM CA bundle to trust for HTTPS (internal CA); default AWS_CA_BUNDLE [s3.ca_bundle].
    #[arg(long, env = "LAKEMOUNT_CA_BUNDLE", value_name = "FILE")]
    pub ca_bundle: Option<PathBuf>,

    /// Mount options, comma-separated: allow_other, ro, rw, uid=N, gid=N,
    /// file_mode=OCTAL, dir_mode=OCTAL.
    #[arg(short = 'o', value_name = "OPTIONS", value_delimiter = ',')]
    pub options: Vec<String>,
    /// Let other users access the mount [mount.allow_other].
    #[arg(long)]
    pub allow_other: bool,
    /// Owner of every entry [mount.uid].
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group of every entry [mount.gid].
    #[arg(long)]
    pub gid: Option<u32>,
    /// File permission bits, octal, e.g. 644 [mount.file_mode].
    #[arg(long, value_parser = parse_octal)]
    pub file_mode: Option<u16>,
    /// Directory permission bits, octal, e.g. 755 [mount.dir_mode].
    #[arg(long, value_parser = parse_octal)]
    pub dir_mode: Option<u16>,
    /// Read-only mount, the default [mount.read_only].
    #[arg(long, conflicts_with = "read_write")]
    pub read_only: bool,
    /// Writable mount: files written are staged on local disk and uploaded
    /// after close; fsync waits for S3 [mount.read_only = false].
    #[arg(long)]
    pub read_write: bool,
    /// Staging directory of a writable mount [write.staging_dir].
    #[arg(long, env = "LAKEMOUNT_STAGING_DIR", value_name = "DIR")]
    pub staging_dir: Option<PathBuf>,

    /// Listing/attribute TTL in seconds; 0 lists on every lookup [metadata.ttl_secs].
    #[arg(long, env = "LAKEMOUNT_METADATA_TTL", value_name = "SECS")]
    pub metadata_ttl: Option<f64>,

    /// Cache file data on local disk in DIR (e.g. on NVMe) for epochs 2..N [cache.dir].
    #[arg(long, env = "LAKEMOUNT_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Disk cache size limit: bytes, "20GiB", or "80%" of its file system [cache.max_size].
    #[arg(long, env = "LAKEMOUNT_CACHE_MAX_SIZE", value_name = "SIZE", value_parser = crate::cache::Size::parse)]
    pub cache_max_size: Option<crate::cache::Size>,

    /// Log filter (error, warn, info, debug, trace); RUST_LOG wins [telemetry.log_level].
    #[arg(long, env = "LAKEMOUNT_LOG_LEVEL", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics: IP:PORT, HOST:PORT,
    /// or :PORT for every interface [telemetry.metrics_addr].
    #[arg(long, env = "LAKEMOUNT_METRICS_ADDR", value_name = "ADDR", value_parser = crate::config::listen_addr::parse)]
    pub metrics_addr: Option<SocketAddr>,

    /// Detach into the background once mounted; the command exits 0 when the
    /// mount is ready, or non-zero with the reason.
    #[arg(long, conflicts_with = "foreground")]
    pub daemon: bool,
    /// Stay in the foreground (the default).
    #[arg(long)]
    pub foreground: bool,
    /// With --daemon: append logs to this file (default: discarded).
    #[arg(long, value_name = "FILE", requires = "daemon")]
    pub log_file: Option<PathBuf>,
}

fn parse_octal(s: &str) -> Result<u16, String> {
    let digits = s.trim_start_matches("0o");
    u16::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mode from 0 to 777"))
}

/// The bucket and key prefix of `s3://BUCKET[/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix: `""` or ending in `/`.
    pub prefix: String,
}

impl Source {
    /// Parses `s3://BUCKET[/PREFIX]` (the `s3://` may be left out); the
    /// prefix is taken as written, a `/` added at its end when missing.
    /// Errors: an empty bucket, or a bucket name outside S3's 3-63 characters
    /// of lowercase letters, digits, `.` and `-` ("Bucket naming rules").
    pub fn parse(s: &str) -> Result<Self, String> {
        let rest = s.strip_prefix("s3://").unwrap_or(s);
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !valid {
            return Err(format!(
                "{s:?}: bucket name {bucket:?} must be 3-63 characters of a-z, 0-9, '.', '-' \
                 (expected s3://BUCKET[/PREFIX])"
            ));
        }
        // Taken as written: a key may begin with '/', and `s3://b//data`
        // names the keys under `/data/`, not those under `data/`.
        let prefix = if prefix.is_empty() || prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        Ok(Self {
            bucket: bucket.to_string(),
            prefix,
        })
    }
}

impl MountArgs {
    /// The config file (if any) with this command line laid over it, validated.
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        // `-o SECTION.KEY=VALUE` options are laid over the file's TOML.
        let dotted: Vec<(&str, &str)> = self
            .options
            .iter()
            .filter_map(|o| o.trim().split_once('='))
            .filter(|(k, _)| k.contains('.'))
            .collect();
        let mut c = match (&self.config, dotted.is_empty()) {
            (Some(path), true) => Config::from_file(path)?,
            (None, true) => Config::default(),
            (path, false) => {
                let text = match path {
                    Some(p) => std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                        path: p.display().to_string(),
                        source,
                    })?,
                    None => String::new(),
                };
                let label = match path {
                    Some(p) => format!("{} with the -o options", p.display()),
                    None => "the -o options".to_string(),
                };
                Config::from_toml(&overlay(&text, &dotted, &label)?, &label).map_err(|e| {
                    // Name the -o option at fault, not a line of a file nobody wrote.
                    dotted
                        .iter()
                        .find_map(|kv| {
                            let one = overlay(&text, std::slice::from_ref(kv), &label).ok()?;
                            let ConfigError::Parse { message, .. } =
                                Config::from_toml(&one, &label).err()?
                            else {
                                return None;
                            };
                            let why = message.lines().last().unwrap_or_default().to_string();
                            Some(ConfigError::Invalid {
                                key: "-o",
                                message: format!("{}={}: {why}", kv.0, kv.1),
                            })
                        })
                        .unwrap_or(e)
                })?
            }
        };
        let s3 = &mut c.s3;
        set(&mut s3.endpoint_url, self.endpoint_url.clone());
        set(&mut s3.region, self.region.clone());
        set(&mut s3.profile, self.profile.clone());
        set(&mut s3.ca_bundle, self.ca_bundle.clone());
        if self.force_path_style {
            s3.force_path_style = Some(true);
        }
        if self.virtual_hosted_style {
            s3.force_path_style = Some(false);
        }
        s3.no_sign_request |= self.no_sign_request;
        let m = &mut c.mount;
        for opt in self
            .options
            .iter()
            .map(|o| o.trim())
            .filter(|o| !o.is_empty())
        {
            let invalid = |message: String| ConfigError::Invalid { key: "-o", message };
            match opt.split_once('=') {
                None if opt == "allow_other" => m.allow_other = true,
                None if opt == "ro" => m.read_only = true,
                None if opt == "rw" => m.read_only = false,
                Some(("uid", v)) => {
                    m.uid = Some(v.parse().map_err(|_| invalid(format!("uid={v}")))?)
                }
                Some(("gid", v)) => {
                    m.gid = Some(v.parse().map_err(|_| invalid(format!("gid={v}")))?)
                }
                Some(("file_mode", v)) => m.file_mode = parse_octal(v).map_err(invalid)?,
                Some(("dir_mode", v)) => m.dir_mode = parse_octal(v).map_err(invalid)?,
                Some((k, _)) if k.contains('.') => {} // laid over the file above
                _ => {
                    return Err(invalid(format!(
                        "unknown option {opt:?}; accepted: allow_other, ro, rw, uid=N, gid=N, \
                         file_mode=OCTAL, dir_mode=OCTAL, SECTION.KEY=VALUE (a config key)"
                    )));
                }
            }
        }
        m.allow_other |= self.allow_other;
        set(&mut m.uid, self.uid);
        set(&mut m.gid, self.gid);
        if let Some(v) = self.file_mode {
            m.file_mode = v;
        }
        if let Some(v) = self.dir_mode {
            m.dir_mode = v;
        }
        if self.read_only {
            m.read_only = true;
        }
        if self.read_write {
            m.read_only = false;
        }
        if let Some(dir) = &self.staging_dir {
            c.write.staging_dir =
                Some(std::path::absolute(dir).map_err(|e| ConfigError::Invalid {
                    key: "write.staging_dir",
                    message: format!("{}: {e}", dir.display()),
                })?);
        }
        if let Some(v) = self.metadata_ttl {
            c.metadata.ttl_secs = v;
        }
        if let Some(dir) = &self.cache_dir {
            c.cache.dir = Some(std::path::absolute(dir).map_err(|e| ConfigError::Invalid {
                key: "cache.dir",
                message: format!("{}: {e}", dir.display()),
            })?);
        }
        if let Some(v) = self.cache_max_size {
            c.cache.max_size = v;
        }
        if let Some(v) = &self.log_level {
            c.telemetry.log_level = v.clone();
        }
        set(&mut c.telemetry.metrics_addr, self.metrics_addr);
        c.validate()?;
        Ok(c)
    }
}

/// `text` (TOML) with each `(SECTION.KEY, VALUE)` set: VALUE as a TOML value
/// when it is one (`60`, `true`, `0o644`), else as a string (`100GiB`,
/// `/nvme/cache`). Errors name `label` and the key.
fn overlay(text: &str, keys: &[(&str, &str)], label: &str) -> Result<String, ConfigError> {
    let parse_err = |message: String| ConfigError::Parse {
        path: label.to_string(),
        message,
    };
    let mut root: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
    for (key, value) in keys {
        let parts: Vec<&str> = key.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(parse_err(format!("bad key {key:?} (SECTION.KEY=VALUE)")));
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        let mut table = &mut root;
        for p in &parts[..parts.len() - 1] {
            table = table
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| parse_err(format!("{key}: {p} is not a section")))?;
        }
        table.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(root.to_string())
}

/// Overrides `slot` when the command line gave a value.
fn set<T>(slot: &mut Option<T>, v: Option<T>) {
    if v.is_some() {
        *slot = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config of `lakemount mount s3://bkt /mnt ARGS...`.
    fn config_of(args: &[&str]) -> Result<Config, ConfigError> {
        let argv = ["lakemount", "mount", "s3://bkt", "/mnt"];
        let cli = Cli::parse_from(argv.iter().chain(args));
        let Command::Mount(args) = cli.command else {
            panic!("not a mount command")
        };
        args.to_config()
    }

    #[test]
    fn sources() {
        let s = Source::parse("s3://my-bucket/a/b").unwrap();
        assert_eq!(
            (s.bucket.as_str(), s.prefix.as_str()),
            ("my-bucket", "a/b/")
        );
        assert_eq!(Source::parse("s3://bkt").unwrap().prefix, "");
        assert_eq!(Source::parse("bkt/x/").unwrap().prefix, "x/");
        assert_eq!(Source::parse("s3://bkt//data").unwrap().prefix, "/data/");
        assert_eq!(Source::parse("s3://bkt/data//").unwrap().prefix, "data//");
        assert!(Source::parse("s3://").is_err());
        assert!(Source::parse("s3://Bad_Bucket").is_err());
    }

    #[test]
    fn command_line_overrides_file() {
        let dir = std::env::temp_dir().join(format!("lakemount-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "[metadata]\nttl_secs = 5.0\n[mount]\nfile_mode = 0o600\n",
        )
        .unwrap();
        let c = config_of(&[
            "--config",
            file.to_str().unwrap(),
            "--metadata-ttl",
            "7",
            "-o",
            "allow_other,uid=12",
        ])
        .unwrap();
        assert_eq!(c.metadata.ttl_secs, 7.0);
        assert_eq!(c.mount.file_mode, 0o600);
        assert!(c.mount.allow_other);
        assert_eq!(c.mount.uid, Some(12));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dotted_options_set_config_keys() {
        let c = config_of(&[
            "-o",
            "metadata.ttl_secs=60,cache.max_size=10GiB,cache.dir=/nvme/c,mount.file_mode=0o600",
        ])
        .unwrap();
        assert_eq!(c.metadata.ttl_secs, 60.0);
        assert_eq!(c.cache.max_size, crate::cache::Size::Bytes(10 << 30));
        assert_eq!(
            c.cache.dir.as_deref(),
            Some(std::path::Path::new("/nvme/c"))
        );
        assert_eq!(c.mount.file_mode, 0o600);
        let e = config_of(&["-o", "cache.nope=1"]).unwrap_err().to_string();
        assert!(
            e.starts_with("invalid value for -o: cache.nope=1: unknown field `nope`"),
            "{e}"
        );
    }

    #[test]
    fn watch_takes_no_operand_as_its_value() {
        let cli = Cli::parse_from(["lakemount", "stats", "--watch", "/mnt/x"]);
        let Command::Stats(a) = cli.command else {
            panic!("not stats")
        };
        assert_eq!(
            (a.watch, a.mountpoint.to_str()),
            (Some(2.0), Some("/mnt/x"))
        );
        let cli = Cli::parse_from(["lakemount", "stats", "/mnt/x", "--watch=0.5"]);
        let Command::Stats(a) = cli.command else {
            panic!("not stats")
        };
        assert_eq!(a.watch, Some(0.5));
    }
}
