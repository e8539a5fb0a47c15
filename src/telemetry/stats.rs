//! The live view of a running mount (`lakemount stats`, `GET /stats`): the
//! metrics of [`super::metrics`] read back from the recorder's Prometheus text
//! and summed up into what an admin asks first. Every number is in bytes,
//! seconds or counts; absent metrics (nothing happened yet) are 0.

use serde_json::{Value, json};

use super::metrics as m;

/// One sample of the Prometheus text format: `name{k="v",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name, with `_sum` / `_count` suffixes of summaries kept.
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The value (`NaN` and `+Inf` as f64).
    pub value: f64,
}

/// Parses the text exposition format as the Prometheus recorder writes it
/// (one sample per line, `#` lines are comments, no timestamps). Lines that do
/// not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"` with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        out.push((key.trim_start_matches(',').to_string(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

/// Samples looked up by name and labels.
struct Samples(Vec<Sample>);

impl Samples {
    /// Sum of every sample of `name` whose labels include all of `want`.
    fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.matching(name, want)
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .sum()
    }

    /// The one value of `name` with `want` (the first), if any.
    fn get(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, want)
            .map(|s| s.value)
            .find(|v| v.is_finite())
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        want: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
    }

    /// Distinct values of label `key` among samples of `name`.
    fn label_values(&self, name: &str, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .0
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.labels.iter().find(|(k, _)| k == key))
            .map(|(_, v)| v.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// p50 / p95 / p99 of a summary (the recorder's quantiles over its
    /// rolling window), seconds, `null` where it has no samples; and the
    /// summary's `sum` (seconds) and `count` since start.
    fn quantiles(&self, name: &str, want: &[(&str, &str)]) -> Value {
        let q = |p: &str| {
            let mut w = want.to_vec();
            w.push(("quantile", p));
            self.get(name, &w)
        };
        json!({
            "p50": q("0.5"),
            "p95": q("0.95"),
            "p99": q("0.99"),
            "sum": self.sum(&format!("{name}_sum"), want),
            "count": self.sum(&format!("{name}_count"), want),
        })
    }
}

/// Facts of the mount that are not metrics.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MountInfo {
    /// The mount point, as given at mount.
    pub mountpoint: String,
    /// Bucket.
    pub bucket: String,
    /// Key prefix (`""` or ending in `/`).
    pub prefix: String,
    /// Whether the mount takes writes.
    pub read_only: bool,
    /// The data cache's directory, if any.
    pub cache_dir: Option<String>,
    /// The read-ahead memory budget, bytes (`read.memory_budget`).
    pub memory_budget_bytes: u64,
    /// lakemount's version.
    pub version: &'static str,
    /// The daemon's process id.
    pub pid: u32,
}

/// The stats document of `GET /stats` from the recorder's text `metrics`:
/// the JSON object documented in docs/ADMIN.md ("lakemount stats").
pub fn stats(metrics: &str, info: &MountInfo, uptime_secs: f64) -> Value {
    let s = Samples(parse(metrics));
    let served = |src: &str| s.sum(m::CACHE_SERVED_BYTES, &[("source", src)]);
    let (mem, disk, s3) = (served("memory"), served("disk"), served("s3"));
    let hit_ratio = (mem + disk + s3 > 0.0).then(|| (mem + disk) / (mem + disk + s3));
    let mut requests = serde_json::Map::new();
    for op in s.label_values(m::S3_REQUESTS, "op") {
        let total = s.sum(m::S3_REQUESTS, &[("op", &op)]);
        let ok: f64 = ["200", "204", "206", "304"]
            .iter()
            .map(|st| s.sum(m::S3_REQUESTS, &[("op", &op), ("status", st)]))
            .sum();
        let mut o = json!({
            "requests": total,
            "errors": total - ok,
            "retries": s.sum(m::S3_RETRIES, &[("op", &op)]),
        });
        o["latency_secs"] = s.quantiles(m::S3_REQUEST_SECONDS, &[("op", &op)]);
        if op == m::OP_GET {
            o["first_byte_secs"] = s.quantiles(m::S3_FIRST_BYTE_SECONDS, &[("op", &op)]);
        }
        requests.insert(op, o);
    }
    let mut v = json!({
        "mount": info,
        "uptime_secs": uptime_secs,
        "read": {
            "fuse_read_bytes": s.sum(m::FUSE_READ_BYTES, &[]),
            "page_cache_fill_bytes": s.sum(m::PAGE_CACHE_FILL_BYTES, &[]),
            "s3_get_bytes": s.sum(m::S3_GET_BYTES, &[]),
            "served_bytes": { "memory": mem, "disk": disk, "s3": s3 },
            "hit_ratio": hit_ratio,
            "passthrough_opens": s.sum(m::CACHE_PASSTHROUGH_OPENS, &[]),
            "read_wait_secs": s.quantiles(m::READ_WAIT_SECONDS, &[]),
        },
        "s3": requests,
        "read_ahead": {
            "memory_in_use_bytes": s.sum(m::PREFETCH_MEMORY_BYTES, &[]),
            "memory_budget_bytes": info.memory_budget_bytes,
            "waste_bytes": s.sum(m::PREFETCH_UNUSED_BYTES, &[]),
            "budget_refusals": s.sum(m::PREFETCH_BUDGET_REFUSALS, &[]),
            "small_objects_prefetched": s.sum(m::SMALL_PREFETCH_OBJECTS, &[]),
            "small_prefetch_hits": s.sum(m::SMALL_PREFETCH_HITS, &[]),
            "small_unread_bytes": s.sum(m::SMALL_PREFETCH_UNREAD_BYTES, &[]),
        },
        "cache": {
            "enabled": info.cache_dir.is_some(),
            "disk_bytes": s.sum(m::CACHE_DISK_BYTES, &[]),
            "limit_bytes": s.sum(m::CACHE_LIMIT_BYTES, &[]),
            "fs_free_bytes": s.sum(m::CACHE_FS_FREE_BYTES, &[]),
            "evictions": s.sum(m::CACHE_EVICTIONS, &[]),
            "bad_pieces": s.sum(m::CACHE_BAD_PIECES, &[]),
            "device_read_secs": s.quantiles(m::CACHE_READ_SECONDS, &[]),
            "device_slow": s.sum(m::CACHE_DEVICE_SLOW, &[]) > 0.0,
            "device_bypassed_reads": s.sum(m::CACHE_DEVICE_BYPASSED, &[]),
        },
        "writes": {
            "fuse_write_bytes": s.sum(m::FUSE_WRITE_BYTES, &[]),
            "passthrough_opens": s.sum(m::WRITE_PASSTHROUGH_OPENS, &[]),
            "staged_files": s.sum(m::WRITE_STAGED_FILES, &[]),
            "staged_bytes": s.sum(m::WRITE_STAGED_BYTES, &[]),
            "uploads_in_flight": s.sum(m::WRITE_UPLOADS_IN_FLIGHT, &[]),
            "uploaded_bytes": s.sum(m::S3_SENT_BYTES, &[]),
            "upload_failures": s.sum(m::WRITE_UPLOAD_FAILURES, &[]),
        },
        "fuse": {
            "requests": s.sum(m::FUSE_REQUESTS, &[]),
            "errors": s.sum(m::FUSE_ERRORS, &[]),
        },
    });
    integers(&mut v);
    v
}

/// Whole numbers (counts, bytes) as JSON integers; `-0.0` (an empty sum) as 0.
fn integers(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && (0.0..9.0e15).contains(&f.abs())
                && n.is_f64()
            {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integers),
        Value::Object(o) => o.values_mut().for_each(integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE lakemount_s3_requests_total counter
lakemount_s3_requests_total{op="GET",status="200"} 7
lakemount_s3_requests_total{op="GET",status="503"} 1
lakemount_s3_requests_total{op="LIST",status="200"} 2
lakemount_s3_request_duration_seconds{op="GET",quantile="0.5"} 0.02
lakemount_s3_request_duration_seconds{op="GET",quantile="0.95"} 0.04
lakemount_s3_request_duration_seconds{op="GET",quantile="0.99"} 0.08
lakemount_s3_request_duration_seconds_sum{op="GET"} 0.2
lakemount_cache_served_bytes_total{source="memory"} 300
lakemount_cache_served_bytes_total{source="disk"} 100
lakemount_cache_served_bytes_total{source="s3"} 400
lakemount_fuse_read_bytes_total 800
lakemount_keys_skipped_total{reason="bad \"name\"\\"} 3
"#;

    #[test]
    fn parses_the_recorders_text() {
        let s = parse(TEXT);
        assert_eq!(s.len(), 12);
        assert_eq!(s[0].name, "lakemount_s3_requests_total");
        assert_eq!(
            s[0].labels,
            vec![("op".into(), "GET".into()), ("status".into(), "200".into())]
        );
        assert_eq!(s[0].value, 7.0);
        assert_eq!(s[10].labels, vec![]);
        assert_eq!(s[11].labels[0].1, "bad \"name\"\\");
        assert!(parse("x{a=\"unterminated} 1\nnot a sample").is_empty());
    }

    #[test]
    fn sums_sources_requests_and_quantiles() {
        let info = MountInfo {
            mountpoint: "/mnt/x".into(),
            bucket: "b".into(),
            prefix: String::new(),
            read_only: true,
            cache_dir: Some("/c".into()),
            memory_budget_bytes: 1 << 20,
            version: "0",
            pid: 1,
        };
        let v = stats(TEXT, &info, 1.5);
        assert_eq!(v["read"]["fuse_read_bytes"], 800);
        assert_eq!(v["read"]["served_bytes"]["s3"], 400);
        assert_eq!(v["cache"]["evictions"].to_string(), "0");
        assert_eq!(v["read"]["hit_ratio"], 0.5);
        assert_eq!(v["s3"]["GET"]["requests"], 8);
        assert_eq!(v["s3"]["GET"]["errors"], 1);
        assert_eq!(v["s3"]["GET"]["latency_secs"]["p95"], 0.04);
        assert_eq!(v["s3"]["LIST"]["latency_secs"]["p50"], Value::Null);
        assert_eq!(v["read_ahead"]["memory_budget_bytes"], 1 << 20);
        assert_eq!(v["mount"]["bucket"], "b");
    }
}
