//! The whole configuration: the TOML file's schema, defaults, and validation.
//! Precedence: built-in default < file (`--config`) < environment < command line.
//! Each section is owned by its module; this file only aggregates them.

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

use crate::cache::CacheConfig;
use crate::fs::MountConfig;
use crate::meta::MetaConfig;
use crate::read::ReadConfig;
use crate::store::s3::S3Config;
use crate::write::WriteConfig;

/// Logging and metrics (`[telemetry]` in the config file).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Log filter: `error`, `warn`, `info`, `debug`, `trace`, or a tracing
    /// directive list (`lakemount=debug,fuser=warn`). `RUST_LOG` wins when set.
    pub log_level: String,
    /// Serve Prometheus metrics at `http://ADDR/metrics`. `None`: not served.
    /// Written as [`listen_addr::parse`] reads it (`127.0.0.1:9464`,
    /// `localhost:9464`, `:9464`).
    #[serde(deserialize_with = "listen_addr::option::deserialize")]
    pub metrics_addr: Option<SocketAddr>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_level: "info".into(),
            metrics_addr: None,
        }
    }
}

/// Everything `lakemount mount` needs besides the source and the mount point.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// S3 connection.
    pub s3: S3Config,
    /// Ownership, permissions, FUSE session.
    pub mount: MountConfig,
    /// Metadata caches.
    pub metadata: MetaConfig,
    /// Read path.
    pub read: ReadConfig,
    /// Data cache (memory and local disk).
    pub cache: CacheConfig,
    /// Writes (staging, uploads) of a writable mount.
    pub write: WriteConfig,
    /// Logging and metrics.
    pub telemetry: TelemetryConfig,
}

/// A config error: names the key and what is accepted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    // The cause is the `source()`: anyhow's `{:#}` appends it once.
    #[error("cannot read config file {path}")]
    Read {
        /// File path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The TOML is malformed, has an unknown key, or a value of the wrong type.
    #[error("config file {path}: {message}")]
    Parse {
        /// File path.
        path: String,
        /// The parser's message, naming the key and its line.
        message: String,
    },
    /// A value is out of its accepted range.
    #[error("invalid value for {key}: {message}")]
    Invalid {
        /// Dotted key, e.g. `read.part_size`.
        key: &'static str,
        /// What is accepted.
        message: String,
    },
}

/// S3's largest object part for a single ranged GET that still makes sense
/// here; also the S3 maximum part size of a multipart upload (5 GiB, "Amazon S3
/// multipart upload limits").
const MAX_PART_SIZE: u64 = 5 << 30;

/// Upper bound of `read.max_concurrent_gets`: more GETs of one file at once
/// than this only add connections (each GET holds one) without filling a link
/// any better.
const MAX_CONCURRENT_GETS: usize = 256;
/// Upper bound of `metadata.stale_if_error_secs`: 30 days, past any outage
/// a job would wait out.
const MAX_STALE_IF_ERROR_SECS: f64 = 30.0 * 86_400.0;
/// Upper bound of the metadata TTL keys: one year. Larger values overflow
/// `Instant` arithmetic (and `1e20` overflows `Duration`) where the TTL is
/// added to a time.
const MAX_TTL_SECS: f64 = 365.0 * 86_400.0;
/// Bounds of the S3 timeout keys: 1 ms (a zero timeout fails every request)
/// to one day.
const MIN_TIMEOUT_SECS: f64 = 0.001;
const MAX_TIMEOUT_SECS: f64 = 86_400.0;
/// Upper bound of `cache.ttl_secs`: ten years.
const MAX_CACHE_TTL_SECS: u64 = 10 * 365 * 86_400;

/// A duration key's check: `v` seconds within `min..=max` (NaN and
/// infinities are not), else the error naming `key` and the range.
fn seconds(key: &'static str, v: f64, min: f64, max: f64) -> Result<(), ConfigError> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key,
            message: format!("{v}; accepted: {min} to {max} seconds"),
        })
    }
}
/// Upper bound of `read.small_max_in_flight`: past this many GETs at once a
/// server throttles rather than answers faster.
const MAX_SMALL_IN_FLIGHT: usize = 1024;
/// Upper bound of `read.small_max_size`, bytes: an object fetched whole in
/// one GET and held in memory until opened; past 64 MiB it is a shard, for
/// the per-file read-ahead.
const MAX_SMALL_SIZE: u64 = 64 << 20;

impl Config {
    /// Parses TOML text. Unknown keys and wrong types are errors naming the key.
    pub fn from_toml(text: &str, path: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    /// Reads and parses a config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Checks ranges and relations between values.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, message: String| Err(ConfigError::Invalid { key, message });
        let r = &self.read;
        if r.part_size == 0 || r.part_size > MAX_PART_SIZE {
            return bad(
                "read.part_size",
                format!("{} bytes; accepted: 1 to {MAX_PART_SIZE}", r.part_size),
            );
        }
        if r.initial_window == 0 {
            return bad("read.initial_window", "0; accepted: at least 1 byte".into());
        }
        if r.max_window < r.initial_window {
            return bad(
                "read.max_window",
                format!(
                    "{} is below read.initial_window ({})",
                    r.max_window, r.initial_window
                ),
            );
        }
        if !(1..=MAX_CONCURRENT_GETS).contains(&r.max_concurrent_gets) {
            return bad(
                "read.max_concurrent_gets",
                format!(
                    "{}; accepted: 1 to {MAX_CONCURRENT_GETS}",
                    r.max_concurrent_gets
                ),
            );
        }
        if r.memory_budget.is_some_and(|b| b < r.part_size) {
            return bad(
                "read.memory_budget",
                format!(
                    "below read.part_size ({}); accepted: at least one part",
                    r.part_size
                ),
            );
        }
        if !(1..=MAX_SMALL_IN_FLIGHT).contains(&r.small_max_in_flight) {
            return bad(
                "read.small_max_in_flight",
                format!(
                    "{}; accepted: 1 to {MAX_SMALL_IN_FLIGHT}",
                    r.small_max_in_flight
                ),
            );
        }
        if r.small_max_size > MAX_SMALL_SIZE {
            return bad(
                "read.small_max_size",
                format!(
                    "{}; accepted: 0 (off) to {MAX_SMALL_SIZE} bytes",
                    r.small_max_size
                ),
            );
        }
        if let Some(b) = r.small_budget
            && b > 0
            && b < r.small_max_size
        {
            return bad(
                "read.small_budget",
                format!(
                    "below read.small_max_size ({}); accepted: 0 (no prefetch) or at \
                     least one small object",
                    r.small_max_size
                ),
            );
        }
        if r.no_open && !self.mount.read_only {
            return bad(
                "read.no_open",
                "true on a writable mount; accepted: true only with a read-only mount \
                 (writes need their opens)"
                    .to_string(),
            );
        }
        let c = &self.cache;
        if !(4096..=(64 << 20)).contains(&c.block_size) || !c.block_size.is_power_of_two() {
            return bad(
                "cache.block_size",
                format!(
                    "{}; accepted: a power of two from 4096 to 67108864 bytes",
                    c.block_size
                ),
            );
        }
        if !(1..=MAX_CACHE_TTL_SECS).contains(&c.ttl_secs) {
            return bad(
                "cache.ttl_secs",
                format!(
                    "{}; accepted: 1 to {MAX_CACHE_TTL_SECS} seconds",
                    c.ttl_secs
                ),
            );
        }
        if let Some(dir) = &c.dir
            && !dir.is_absolute()
        {
            return bad(
                "cache.dir",
                format!("{}; accepted: an absolute path", dir.display()),
            );
        }
        let m = &self.mount;
        // Permission bits only: a TOML `644` is decimal (0o1204) and would
        // silently set the sticky bit; it must be written `0o644`.
        if m.file_mode > 0o777 {
            return bad(
                "mount.file_mode",
                format!(
                    "{} (octal {:o}); accepted: 0o000 to 0o777, written e.g. 0o644 in TOML",
                    m.file_mode, m.file_mode
                ),
            );
        }
        if m.dir_mode > 0o777 {
            return bad(
                "mount.dir_mode",
                format!(
                    "{} (octal {:o}); accepted: 0o000 to 0o777, written e.g. 0o755 in TOML",
                    m.dir_mode, m.dir_mode
                ),
            );
        }
        // (uid_t)-1 and (gid_t)-1 mean "no change" to chown(2); the kernel
        // shows such an owner as the overflow id (65534).
        for (key, id) in [("mount.uid", m.uid), ("mount.gid", m.gid)] {
            if id == Some(u32::MAX) {
                return bad(
                    key,
                    format!("{}; accepted: 0 to {}", u32::MAX, u32::MAX - 1),
                );
            }
        }
        let w = &self.write;
        if !(crate::store::MIN_PART_SIZE..=crate::store::MAX_PART_SIZE).contains(&w.part_size) {
            return bad(
                "write.part_size",
                format!(
                    "{}; accepted: {} (S3's smallest part) to {} bytes",
                    w.part_size,
                    crate::store::MIN_PART_SIZE,
                    crate::store::MAX_PART_SIZE
                ),
            );
        }
        if !(crate::store::MIN_PART_SIZE..=crate::store::MAX_PART_SIZE).contains(&w.max_copy_size) {
            return bad(
                "write.max_copy_size",
                format!(
                    "{}; accepted: {} to {} bytes (S3's part limits)",
                    w.max_copy_size,
                    crate::store::MIN_PART_SIZE,
                    crate::store::MAX_PART_SIZE
                ),
            );
        }
        if w.upload_memory < w.part_size {
            return bad(
                "write.upload_memory",
                format!(
                    "{} is below write.part_size ({}); accepted: at least one part",
                    w.upload_memory, w.part_size
                ),
            );
        }
        seconds("write.upload_delay_secs", w.upload_delay_secs, 0.0, 3600.0)?;
        seconds("write.retry_secs", w.retry_secs, MIN_TIMEOUT_SECS, 3600.0)?;
        if !(0..=19).contains(&w.upload_nice) {
            return bad(
                "write.upload_nice",
                format!("{}; accepted: 0 to 19", w.upload_nice),
            );
        }
        seconds(
            "write.shutdown_wait_secs",
            w.shutdown_wait_secs,
            0.0,
            MAX_TIMEOUT_SECS,
        )?;
        if let Some(dir) = &w.staging_dir
            && !dir.is_absolute()
        {
            return bad(
                "write.staging_dir",
                format!("{}; accepted: an absolute path", dir.display()),
            );
        }
        if m.fuse_threads == 0 || m.fuse_threads > 64 {
            return bad(
                "mount.fuse_threads",
                format!("{}; accepted: 1 to 64", m.fuse_threads),
            );
        }
        let t = &self.metadata;
        seconds("metadata.ttl_secs", t.ttl_secs, 0.0, MAX_TTL_SECS)?;
        if let Some(k) = t.kernel_ttl_secs {
            seconds("metadata.kernel_ttl_secs", k, 0.0, MAX_TTL_SECS)?;
        }
        if let Some(n) = t.negative_ttl_secs {
            seconds("metadata.negative_ttl_secs", n, 0.0, MAX_TTL_SECS)?;
        }
        seconds(
            "metadata.stale_if_error_secs",
            t.stale_if_error_secs,
            0.0,
            MAX_STALE_IF_ERROR_SECS,
        )?;
        let level = self.telemetry.log_level.trim();
        let plain = ["error", "warn", "info", "debug", "trace", "off"];
        if !level.contains('=')
            && !level.contains(',')
            && !plain.contains(&level.to_ascii_lowercase().as_str())
        {
            return bad(
                "telemetry.log_level",
                format!(
                    "{level:?}; accepted: error, warn, info, debug, trace, off, or directives like lakemount=debug,fuser=warn"
                ),
            );
        }
        let s = &self.s3;
        if s.max_attempts == 0 || s.max_attempts > 20 {
            return bad(
                "s3.max_attempts",
                format!("{}; accepted: 1 to 20", s.max_attempts),
            );
        }
        seconds(
            "s3.connect_timeout_secs",
            s.connect_timeout_secs,
            MIN_TIMEOUT_SECS,
            MAX_TIMEOUT_SECS,
        )?;
        seconds(
            "s3.attempt_timeout_secs",
            s.attempt_timeout_secs,
            MIN_TIMEOUT_SECS,
            MAX_TIMEOUT_SECS,
        )?;
        seconds(
            "s3.stall_timeout_secs",
            s.stall_timeout_secs,
            MIN_TIMEOUT_SECS,
            MAX_TIMEOUT_SECS,
        )?;
        seconds(
            "s3.request_deadline_secs",
            s.request_deadline_secs,
            MIN_TIMEOUT_SECS,
            MAX_TIMEOUT_SECS,
        )?;
        if let Some(url) = &s.endpoint_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return bad(
                "s3.endpoint_url",
                format!("{url:?}; accepted: an http:// or https:// URL"),
            );
        }
        Ok(())
    }
}

/// Serde helpers for byte sizes in the config file: an integer (bytes) or a
/// string with a binary unit (`"8MiB"`, `"64KiB"`, `"2GiB"`; also `K`, `M`,
/// `G`, `T`), the forms `[cache] max_size` takes, without its percentages.
pub mod byte_size {
    use serde::{Deserialize, Deserializer};

    use crate::cache::Size;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Int(u64),
        Str(String),
    }

    fn bytes(r: Repr) -> Result<u64, String> {
        match r {
            Repr::Int(b) => Ok(b),
            Repr::Str(s) => match Size::parse(&s) {
                Ok(Size::Bytes(b)) => Ok(b),
                _ => Err(format!(
                    "{s:?}; accepted: bytes (e.g. 8388608) or a size like \"8MiB\""
                )),
            },
        }
    }

    /// A byte size. Errors: a message naming the accepted forms.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        bytes(Repr::deserialize(d)?).map_err(serde::de::Error::custom)
    }

    /// An optional byte size (the key may be left out).
    pub mod option {
        use super::*;

        /// A byte size, present. Errors: as [`super::deserialize`].
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
            super::bytes(Repr::deserialize(d)?)
                .map(Some)
                .map_err(serde::de::Error::custom)
        }
    }
}

/// Listen addresses (`telemetry.metrics_addr`, `--metrics-addr`).
pub mod listen_addr {
    use std::net::{SocketAddr, ToSocketAddrs};

    use serde::{Deserialize, Deserializer};

    /// Reads `IP:PORT` (`127.0.0.1:9464`, `[::1]:9464`), `HOST:PORT`
    /// (`localhost:9464`: resolved now, an IPv4 address preferred, the one a
    /// scraper given `localhost` or `127.0.0.1` reaches) or `:PORT` (every
    /// interface, as Prometheus exporters read it).
    /// Errors: a message naming the accepted forms.
    pub fn parse(s: &str) -> Result<SocketAddr, String> {
        let accepted =
            "accepted: IP:PORT, HOST:PORT or :PORT (every interface), e.g. 127.0.0.1:9464";
        let s = s.trim();
        if let Ok(a) = s.parse() {
            return Ok(a);
        }
        if let Some(port) = s.strip_prefix(':') {
            let port: u16 = port
                .parse()
                .map_err(|_| format!("{s:?}: bad port; {accepted}"))?;
            return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
        }
        let Some((host, port)) = s
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty() && !h.contains('/'))
        else {
            return Err(format!("{s:?}; {accepted}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{s:?}: bad port; {accepted}"))?;
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("{s:?}: {host} does not resolve ({e}); {accepted}"))?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| format!("{s:?}: {host} resolves to no address; {accepted}"))
    }

    /// An optional listen address (the key may be left out).
    pub mod option {
        use super::*;

        /// A listen address, present. Errors: as [`super::parse`].
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SocketAddr>, D::Error> {
            super::parse(&String::deserialize(d)?)
                .map(Some)
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_the_forms_exporters_use() {
        let parse = listen_addr::parse;
        assert_eq!(
            parse("127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(parse("[::1]:9464").unwrap(), "[::1]:9464".parse().unwrap());
        assert_eq!(parse(":9464").unwrap(), "0.0.0.0:9464".parse().unwrap());
        assert_eq!(
            parse("localhost:9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        for bad in [
            "9464",
            "localhost",
            ":x",
            "http://127.0.0.1:9464",
            "127.0.0.1:99999",
            "",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("accepted: IP:PORT"), "{bad}: {e}");
        }
        let e =
            Config::from_toml("[telemetry]\nmetrics_addr = \"localhost\"\n", "x.toml").unwrap_err();
        assert!(format!("{e:#}").contains("metrics_addr"), "{e:#}");
        let c = Config::from_toml("[telemetry]\nmetrics_addr = \":9464\"\n", "x.toml").unwrap();
        assert_eq!(
            c.telemetry.metrics_addr,
            Some("0.0.0.0:9464".parse().unwrap())
        );
    }

    #[test]
    fn shipped_example_parses_to_the_defaults() {
        let text = include_str!("../config/lakemount.toml");
        let c = Config::from_toml(text, "config/lakemount.toml").unwrap();
        assert_eq!(c, Config::default());
        c.validate().unwrap();
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::from_toml("[read]\npart_sise = 5\n", "x.toml").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("part_sise"), "{msg}");
        let e = Config::from_toml("colour = 1\n", "x.toml").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn wrong_type_is_named() {
        let e = Config::from_toml("[read]\npart_size = \"big\"\n", "x.toml").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("part_size"), "{msg}");
    }

    /// Byte sizes take the forms `[cache] max_size` takes (bar percentages)
    /// in every section, so an admin can write them one way throughout.
    #[test]
    fn byte_sizes_take_units_everywhere() {
        let text = "[read]\npart_size = \"8MiB\"\ninitial_window = \"64KiB\"\n\
                    max_window = 67108864\nmemory_budget = \"1GiB\"\n\
                    direct_io_min_size = \"64M\"\nkernel_read_ahead = \"1MiB\"\n\
                    [cache]\nblock_size = \"1MiB\"\nmemory_size = \"256MiB\"\n\
                    [write]\npart_size = \"16MiB\"\nupload_memory = \"512MiB\"\n\
                    max_copy_size = \"1GiB\"\n";
        let c = Config::from_toml(text, "x.toml").unwrap();
        assert_eq!(c.read.part_size, 8 << 20);
        assert_eq!(c.read.initial_window, 64 << 10);
        assert_eq!(c.read.max_window, 64 << 20);
        assert_eq!(c.read.memory_budget, Some(1 << 30));
        assert_eq!(c.read.direct_io_min_size, 64 << 20);
        assert_eq!(c.read.kernel_read_ahead, 1 << 20);
        assert_eq!(c.cache.block_size, 1 << 20);
        assert_eq!(c.cache.memory_size, 256 << 20);
        assert_eq!(c.write.part_size, 16 << 20);
        assert_eq!(c.write.upload_memory, 512 << 20);
        assert_eq!(c.write.max_copy_size, 1 << 30);
        for bad in ["\"8 apples\"", "\"50%\"", "-1", "\"1.5GiB\""] {
            let e = Config::from_toml(&format!("[read]\npart_size = {bad}\n"), "x.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("part_size"), "{bad}: {e}");
        }
        let e = Config::from_toml("[read]\npart_size = \"50%\"\n", "x.toml").unwrap_err();
        assert!(e.to_string().contains("\"8MiB\""), "{e}");
        // Below S3's smallest part: refused, naming the key.
        let c = Config::from_toml("[write]\nmax_copy_size = \"1MiB\"\n", "x.toml").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("write.max_copy_size"), "{e}");
    }

    /// Every duration key refuses NaN, infinities, negatives and values so
    /// large that adding them to a time would overflow, naming the key.
    #[test]
    fn every_duration_key_is_bounded_and_named() {
        let keys = [
            ("metadata", "ttl_secs"),
            ("metadata", "kernel_ttl_secs"),
            ("metadata", "negative_ttl_secs"),
            ("metadata", "stale_if_error_secs"),
            ("s3", "connect_timeout_secs"),
            ("s3", "attempt_timeout_secs"),
            ("s3", "stall_timeout_secs"),
            ("s3", "request_deadline_secs"),
        ];
        for (section, key) in keys {
            for v in ["inf", "nan", "-1.0", "1e20"] {
                let text = format!("[{section}]\n{key} = {v}\n");
                let e = Config::from_toml(&text, "x.toml")
                    .and_then(|c| c.validate().map(|()| c))
                    .map(drop)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains(&format!("{section}.{key}")), "{text}: {e}");
            }
        }
        for v in ["0", "400000000"] {
            let text = format!("[cache]\nttl_secs = {v}\n");
            let e = Config::from_toml(&text, "x.toml")
                .and_then(|c| c.validate().map(|()| c))
                .map(drop)
                .unwrap_err()
                .to_string();
            assert!(e.contains("cache.ttl_secs"), "{text}: {e}");
        }
    }

    #[test]
    fn out_of_range_is_named() {
        let mut c = Config::default();
        c.read.max_window = 1;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("read.max_window"), "{msg}");
        let mut c = Config::default();
        c.read.max_concurrent_gets = 0;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("read.max_concurrent_gets"), "{msg}");
        let mut c = Config::default();
        c.mount.read_only = false;
        c.validate().unwrap();
        c.write.part_size = 1 << 20;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("write.part_size"), "{msg}");
        // Writes need their opens: no-open mode on read-only mounts only.
        let mut c = Config::from_toml("[read]\nno_open = true\n", "x.toml").unwrap();
        c.validate().unwrap();
        c.mount.read_only = false;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("read.no_open"), "{msg}");
        let mut c = Config::default();
        c.write.staging_dir = Some("relative/dir".into());
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("write.staging_dir"), "{msg}");
        let c = Config::from_toml("[mount]\nuid = 4294967295\n", "x.toml").unwrap();
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("mount.uid"), "{msg}");
        // `file_mode = 644` in TOML is decimal: refused, not turned into 0o1204.
        let c = Config::from_toml("[mount]\nfile_mode = 644\n", "x.toml").unwrap();
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains("mount.file_mode") && msg.contains("0o644"),
            "{msg}"
        );
        let mut c = Config::default();
        c.telemetry.log_level = "verbose".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("telemetry.log_level")
        );
        c.telemetry.log_level = "lakemount=debug,fuser=warn".into();
        c.validate().unwrap();
    }
}
