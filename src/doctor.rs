//! `lakemount doctor MOUNTPOINT`: a short baseline through a running mount
//! (a metadata walk, small-file reads, one sequential read), read against the
//! daemon's own counters before and after (`/stats` on its control socket),
//! that names the likely bottleneck in an admin's words. The rules and their
//! thresholds are in docs/ADMIN.md ("lakemount doctor").

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::cli::DoctorArgs;

/// Largest file the small-file step reads (`read.small_max_size`'s default).
const SMALL_MAX: u64 = 1 << 20;
/// Smallest file the sequential step reads.
const SEQ_MIN: u64 = 4 << 20;
/// Per-read buffer of the sequential step.
const READ_BUF: usize = 1 << 20;

/// S3 answers slower than this (mean over the baseline) make the node
/// S3-latency-bound.
const SLOW_S3_SECS: f64 = 0.020;
/// A cache device whose mean read is slower than this, and slower than S3,
/// is the bottleneck.
const SLOW_DEVICE_SECS: f64 = 0.005;
/// A walk slower than this many entries per second is metadata-bound ...
const SLOW_WALK_PER_SEC: f64 = 1000.0;
/// ... when it saw at least this many (a few entries behind one LIST say
/// nothing about the rate).
const MIN_WALK: u64 = 500;
/// Read-ahead refused for lack of memory budget names the budget when there
/// were at least this many refusals ...
const MIN_REFUSALS: f64 = 4.0;
/// ... and at least this share of the baseline's GETs: a refusal or two in a
/// burst of read-ahead is the budget doing its job, not too small.
const REFUSAL_SHARE: f64 = 0.05;
/// Node CPU idle below this share during the sequential read: CPU-bound ...
const BUSY_IDLE: f64 = 0.10;
/// ... when the read lasted at least this many seconds (also the shortest
/// read that can say S3's bandwidth is the limit).
const MIN_SEQ_SECS: f64 = 0.5;
/// Readers waiting for S3 bytes at least this share of the sequential
/// read's time (their waits summed) make it S3-bandwidth-bound.
const WAIT_SHARE: f64 = 0.5;

/// The likely bottleneck, as `--json` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bottleneck {
    /// The cache device is slow (or slower than S3).
    CacheDevice,
    /// Read-ahead was refused for lack of `read.memory_budget`.
    MemoryBudget,
    /// The node's CPUs were busy.
    Cpu,
    /// Each S3 request waits long for its answer.
    S3Latency,
    /// Listing and stat are slow.
    Metadata,
    /// Readers waited for S3 bytes at a good latency: bandwidth.
    S3Bandwidth,
    /// Nothing stood out.
    None,
}

impl Bottleneck {
    /// The `--json` name.
    pub fn name(self) -> &'static str {
        match self {
            Bottleneck::CacheDevice => "cache-device-slow",
            Bottleneck::MemoryBudget => "memory-budget-too-small",
            Bottleneck::Cpu => "cpu-bound",
            Bottleneck::S3Latency => "s3-latency-bound",
            Bottleneck::Metadata => "metadata-bound",
            Bottleneck::S3Bandwidth => "s3-bandwidth-bound",
            Bottleneck::None => "none",
        }
    }
}

/// The baseline's results and the daemon's counters around it.
#[derive(Debug, Default)]
pub struct Measured {
    /// Directory entries stat'ed by the walk, and its seconds.
    pub walk_entries: u64,
    /// Seconds of the walk.
    pub walk_secs: f64,
    /// Small files read, their bytes, seconds.
    pub small_files: u64,
    /// Seconds of the small-file reads.
    pub small_secs: f64,
    /// Bytes of the sequential read and its seconds.
    pub seq_bytes: u64,
    /// Seconds of the sequential read.
    pub seq_secs: f64,
    /// Share of the node's CPU time idle during the sequential read (0..1).
    pub seq_idle: Option<f64>,
    /// Daemon CPU cores used during the sequential read.
    pub seq_daemon_cores: Option<f64>,
    /// The daemon's stats before the baseline.
    pub before: Value,
    /// ... after the walk and the small files, before the sequential read:
    /// S3 latency is taken from this part (small GETs, LISTs), not from the
    /// sequential read's GETs, whose time is mostly their 8 MiB bodies.
    pub mid: Value,
    /// The daemon's stats after the baseline.
    pub after: Value,
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

impl Measured {
    fn delta(&self, path: &[&str]) -> f64 {
        let get = |v: &Value| path.iter().fold(v, |v, k| &v[*k]).as_f64().unwrap_or(0.0);
        get(&self.after) - get(&self.before)
    }

    /// Mean seconds of the summary at `path` between `from` and `to` (its
    /// sum and count deltas); `None` without samples.
    fn mean_between(from: &Value, to: &Value, path: &[&str]) -> Option<f64> {
        let get = |v: &Value, last: &str| {
            let v = path.iter().fold(v, |v, k| &v[*k]);
            v[last].as_f64().unwrap_or(0.0)
        };
        let n = get(to, "count") - get(from, "count");
        (n > 0.0).then(|| (get(to, "sum") - get(from, "sum")) / n)
    }

    /// Mean over the whole baseline.
    fn mean(&self, path: &[&str]) -> Option<f64> {
        Self::mean_between(&self.before, &self.after, path)
    }

    /// Mean S3 latency of `op` over the walk and the small files: a GET's
    /// time to its first byte where the daemon records it, so a slow link
    /// (long bodies) is not taken for a slow server.
    fn s3_latency(&self, op: &str) -> Option<f64> {
        self.s3_mean(op, "first_byte_secs")
            .or_else(|| self.s3_mean(op, "latency_secs"))
    }

    /// Mean of `op`'s summary `field` over the walk and the small files.
    fn s3_mean(&self, op: &str, field: &str) -> Option<f64> {
        let mid = if self.mid.is_null() {
            &self.after
        } else {
            &self.mid
        };
        Self::mean_between(&self.before, mid, &["s3", op, field])
    }

    /// Every finding, the likely bottleneck first, each with its reason.
    pub fn diagnose(&self) -> Vec<(Bottleneck, String)> {
        let a = &self.after;
        let mut out = Vec::new();
        // Means over the baseline, not the recorder's rolling quantiles: a
        // slow device with half its reads answered from read-ahead pages has
        // a fast median.
        let get_p50 = self.s3_latency("GET");
        let list_p50 = self.s3_latency("LIST");
        // A device read against a whole GET (not its first byte).
        let get_whole = self.s3_mean("GET", "latency_secs");
        let dev_p50 = self.mean(&["cache", "device_read_secs"]);
        let disk_bytes = self.delta(&["read", "served_bytes", "disk"]);
        let device_slow = a["cache"]["device_slow"].as_bool().unwrap_or(false);
        if device_slow
            || (disk_bytes > 0.0
                && dev_p50.is_some_and(|d| d > SLOW_DEVICE_SECS && get_whole.is_none_or(|g| d > g)))
        {
            out.push((
                Bottleneck::CacheDevice,
                format!(
                    "the cache device is slow: its reads take {} on average (S3's GETs {}); \
                     check the device (a failing SSD slows down before it fails), or move \
                     cache.dir to another one",
                    ms(dev_p50),
                    ms(get_whole)
                ),
            ));
        }
        let refusals = self.delta(&["read_ahead", "budget_refusals"]);
        let gets = self.delta(&["s3", "GET", "requests"]);
        if refusals >= MIN_REFUSALS && refusals >= REFUSAL_SHARE * gets {
            out.push((
                Bottleneck::MemoryBudget,
                format!(
                    "the read-ahead memory budget is too small: {refusals:.0} read-ahead parts \
                     were refused for lack of it beside {gets:.0} GETs (read.memory_budget = \
                     {}); raise it",
                    crate::cache::human(
                        f(&a["read_ahead"]["memory_budget_bytes"]).unwrap_or(0.0) as u64
                    )
                ),
            ));
        }
        let slow_s3 = get_p50.into_iter().chain(list_p50).fold(0.0, f64::max);
        if slow_s3 >= SLOW_S3_SECS {
            out.push((
                Bottleneck::S3Latency,
                format!(
                    "S3 answers slowly: GETs wait {} on average for their first byte, LISTs take \
                     {}; every file not read ahead waits that long. More readers in parallel (loader workers), a longer \
                     metadata.ttl_secs, or `lakemount warm` before the job hide it",
                    ms(get_p50),
                    ms(list_p50)
                ),
            ));
        }
        // Jiffies (10 ms) make a shorter read's idle share noise.
        if self.seq_secs >= MIN_SEQ_SECS && self.seq_idle.is_some_and(|i| i < BUSY_IDLE) {
            out.push((
                Bottleneck::Cpu,
                format!(
                    "the node's CPUs are busy: {:.0}% idle during the sequential read, the \
                     daemon using {:.1} cores; reads cannot go faster than the CPU serves them",
                    self.seq_idle.unwrap_or(0.0) * 100.0,
                    self.seq_daemon_cores.unwrap_or(0.0)
                ),
            ));
        }
        let walk_rate = self.walk_entries as f64 / self.walk_secs.max(1e-9);
        if self.walk_entries >= MIN_WALK && walk_rate < SLOW_WALK_PER_SEC {
            out.push((
                Bottleneck::Metadata,
                format!(
                    "metadata is slow: the walk stat'ed {walk_rate:.0} entries/s with {:.0} \
                     LIST and {:.0} HEAD requests; raise metadata.ttl_secs, or set \
                     metadata.prefetch_tree for a large tree",
                    self.delta(&["s3", "LIST", "requests"]),
                    self.delta(&["s3", "HEAD", "requests"])
                ),
            ));
        }
        // The waits of the sequential read: from the mid snapshot on.
        let waited = {
            let from = if self.mid.is_null() {
                &self.before
            } else {
                &self.mid
            };
            let sum = |v: &Value| f(&v["read"]["read_wait_secs"]["sum"]).unwrap_or(0.0);
            sum(a) - sum(from)
        };
        if out.is_empty() && self.seq_secs >= MIN_SEQ_SECS && waited >= WAIT_SHARE * self.seq_secs {
            out.push((
                Bottleneck::S3Bandwidth,
                format!(
                    "readers waited for S3 bytes ({waited:.1} s in all over a {:.1} s read) at \
                     a good latency: the sequential read ran at {:.0} MB/s, what S3 and the \
                     network give this node; compare with the link's speed",
                    self.seq_secs,
                    self.seq_bytes as f64 / self.seq_secs.max(1e-9) / 1e6
                ),
            ));
        }
        if out.is_empty() {
            out.push((
                Bottleneck::None,
                "no bottleneck stood out: reads did not wait for S3, the cache device or the \
                 CPU"
                .into(),
            ));
        }
        out
    }
}

fn ms(s: Option<f64>) -> String {
    match s {
        Some(s) if s < 0.01 => format!("{:.2} ms", s * 1e3),
        Some(s) => format!("{:.0} ms", s * 1e3),
        None => "n/a".into(),
    }
}

/// Runs `lakemount doctor`. Errors: not a running lakemount mount (no control
/// socket answers), or the mount cannot be read at all.
pub fn run_doctor(args: &DoctorArgs) -> anyhow::Result<()> {
    let socket = crate::telemetry::control::socket_path(&crate::telemetry::control::mount_root(
        &args.mountpoint,
    ));
    let stats = || {
        crate::stats::fetch(&socket).with_context(|| {
            format!(
                "{} is not a running lakemount mount (no control socket answered at {})",
                args.mountpoint.display(),
                socket.display()
            )
        })
    };
    let mut m = Measured {
        before: stats()?,
        ..Default::default()
    };
    let deadline = Duration::from_secs_f64(args.max_secs);
    eprintln!(
        "lakemount doctor: walking {} ...",
        args.mountpoint.display()
    );
    let t = Instant::now();
    let files = walk(
        &args.mountpoint,
        args.max_entries,
        deadline,
        &mut m.walk_entries,
    )?;
    m.walk_secs = t.elapsed().as_secs_f64();

    let small: Vec<&(PathBuf, u64)> = files
        .iter()
        .filter(|(_, s)| *s > 0 && *s <= SMALL_MAX)
        .take(args.small_files)
        .collect();
    eprintln!("lakemount doctor: reading {} small files ...", small.len());
    let t = Instant::now();
    for (p, _) in &small {
        read_uncached_until(p, u64::MAX, None)?;
        m.small_files += 1;
        if t.elapsed() > deadline {
            break;
        }
    }
    m.small_secs = t.elapsed().as_secs_f64();
    m.mid = stats()?;

    if let Some((p, _)) = files
        .iter()
        .filter(|(_, s)| *s >= SEQ_MIN)
        .max_by_key(|(_, s)| *s)
    {
        eprintln!("lakemount doctor: reading {} ...", p.display());
        let pid = m.before["mount"]["pid"].as_u64();
        let (cpu0, proc0) = (node_cpu(), pid.and_then(process_cpu_secs));
        let t = Instant::now();
        m.seq_bytes = read_uncached_until(p, args.seq_bytes, Some(t + deadline))?;
        m.seq_secs = t.elapsed().as_secs_f64();
        if let (Some((busy0, total0)), Some((busy1, total1))) = (cpu0, node_cpu()) {
            let total = (total1 - total0).max(1) as f64;
            m.seq_idle = Some(1.0 - (busy1 - busy0) as f64 / total);
        }
        if let (Some(a), Some(b)) = (proc0, pid.and_then(process_cpu_secs)) {
            m.seq_daemon_cores = Some((b - a) / m.seq_secs.max(1e-9));
        }
    }
    m.after = stats()?;
    let findings = m.diagnose();
    if args.json {
        println!("{}", report_json(&m, &findings));
    } else {
        print!("{}", report(&args.mountpoint, &m, &findings));
    }
    Ok(())
}

/// Breadth-first walk: `readdir` and `lstat` of up to `max` entries, or
/// until `deadline` passes. Returns the regular files and their sizes.
fn walk(
    root: &Path,
    max: u64,
    deadline: Duration,
    entries: &mut u64,
) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    let start = Instant::now();
    let mut files = Vec::new();
    let mut dirs = VecDeque::from([root.to_path_buf()]);
    while let Some(d) = dirs.pop_front() {
        // The root must list; below it, an entry that vanished or fails is
        // skipped (it is a data set being changed, not the mount failing).
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if d != root => {
                eprintln!("lakemount doctor: skipping {}: {e}", d.display());
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("listing {}", d.display())),
        };
        for e in rd {
            let Ok(e) = e else { continue };
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            *entries += 1;
            if meta.is_dir() {
                dirs.push_back(e.path());
            } else if meta.is_file() {
                files.push((e.path(), meta.len()));
            }
            if *entries >= max || start.elapsed() > deadline {
                return Ok(files);
            }
        }
    }
    Ok(files)
}

/// Reads up to `limit` bytes of `path` after dropping its page cache, so the
/// bytes come through lakemount, stopping at `until`. Returns the bytes read.
fn read_uncached_until(path: &Path, limit: u64, until: Option<Instant>) -> anyhow::Result<u64> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: fadvise on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; READ_BUF];
    let mut n = 0u64;
    while n < limit {
        let want = READ_BUF.min((limit - n).min(READ_BUF as u64) as usize);
        let got = f
            .read(&mut buf[..want])
            .with_context(|| format!("reading {}", path.display()))?;
        if got == 0 {
            break;
        }
        n += got as u64;
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
    }
    Ok(n)
}

/// (busy, total) jiffies of all CPUs from `/proc/stat`.
fn node_cpu() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// CPU seconds (user + system) of process `pid`.
fn process_cpu_secs(pid: u64) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let v: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = v.get(11)?.parse::<u64>().ok()? + v.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

fn report(mnt: &Path, m: &Measured, findings: &[(Bottleneck, String)]) -> String {
    let a = &m.after;
    let mut out = format!("lakemount doctor {}\n", mnt.display());
    out += &format!(
        "  metadata walk    {} entries in {:.2} s ({:.0}/s); {:.0} LISTs during it\n",
        m.walk_entries,
        m.walk_secs,
        m.walk_entries as f64 / m.walk_secs.max(1e-9),
        m.delta(&["s3", "LIST", "requests"])
    );
    out += &format!(
        "  small files      {} files of at most 1 MiB in {:.2} s ({:.0} files/s, {} each)\n",
        m.small_files,
        m.small_secs,
        m.small_files as f64 / m.small_secs.max(1e-9),
        ms((m.small_files > 0).then(|| m.small_secs / m.small_files as f64))
    );
    if m.seq_bytes > 0 {
        out += &format!(
            "  sequential read  {} in {:.2} s ({:.0} MB/s); node {:.0}% idle, daemon {:.1} cores\n",
            crate::cache::human(m.seq_bytes),
            m.seq_secs,
            m.seq_bytes as f64 / m.seq_secs.max(1e-9) / 1e6,
            m.seq_idle.unwrap_or(f64::NAN) * 100.0,
            m.seq_daemon_cores.unwrap_or(f64::NAN)
        );
    } else {
        out += "  sequential read  no file of 4 MiB or more found\n";
    }
    let l = &a["s3"]["GET"]["latency_secs"];
    out += &format!(
        "  S3               GETs {} on average (p99 {}; first byte {}), LISTs {}\n",
        ms(m.mean(&["s3", "GET", "latency_secs"])),
        ms(f(&l["p99"])),
        ms(m.mean(&["s3", "GET", "first_byte_secs"])),
        ms(m.mean(&["s3", "LIST", "latency_secs"]))
    );
    if a["cache"]["enabled"].as_bool().unwrap_or(false) {
        out += &format!(
            "  cache device     reads {} on average{}\n",
            ms(m.mean(&["cache", "device_read_secs"])),
            if a["cache"]["device_slow"].as_bool().unwrap_or(false) {
                ", SLOW against its reference"
            } else {
                ""
            }
        );
    }
    let (first, rest) = findings
        .split_first()
        .expect("diagnose returns one at least");
    out += &format!("likely bottleneck: {}: {}\n", first.0.name(), first.1);
    for (b, why) in rest {
        out += &format!("also: {}: {}\n", b.name(), why);
    }
    out
}

fn report_json(m: &Measured, findings: &[(Bottleneck, String)]) -> Value {
    json!({
        "bottleneck": findings[0].0.name(),
        "findings": findings.iter().map(|(b, why)| json!({"bottleneck": b.name(), "why": why}))
            .collect::<Vec<_>>(),
        "walk": {"entries": m.walk_entries, "secs": m.walk_secs},
        "small_files": {"files": m.small_files, "secs": m.small_secs},
        "sequential": {"bytes": m.seq_bytes, "secs": m.seq_secs, "node_idle": m.seq_idle,
                       "daemon_cores": m.seq_daemon_cores},
        "stats": m.after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(get_p50: f64, dev_p50: Option<f64>, refusals: u64, disk: u64) -> Value {
        // The "before" stats (all zero) have no samples yet.
        let n = if get_p50 > 0.0 { 10.0 } else { 0.0 };
        let dev = dev_p50.map_or(
            json!({"sum": 0, "count": 0}),
            |d| json!({"sum": d * 10.0, "count": 10}),
        );
        json!({
            "s3": {"GET": {"requests": 10, "latency_secs": {"p50": get_p50, "sum": get_p50 * n, "count": n}},
                   "LIST": {"requests": 2, "latency_secs": {"p50": get_p50, "sum": get_p50 * n, "count": n}}},
            "cache": {"enabled": true, "device_slow": false,
                      "device_read_secs": dev},
            "read": {"served_bytes": {"disk": disk}, "read_wait_secs": {"sum": 0.0}},
            "read_ahead": {"budget_refusals": refusals, "memory_budget_bytes": 1 << 20},
            "mount": {"pid": 1},
        })
    }

    fn measured(after: Value) -> Measured {
        Measured {
            walk_entries: 2000,
            walk_secs: 0.2,
            small_files: 100,
            small_secs: 0.1,
            seq_bytes: 64 << 20,
            seq_secs: 0.5,
            seq_idle: Some(0.5),
            seq_daemon_cores: Some(0.5),
            before: stats(0.0, None, 0, 0),
            mid: Value::Null,
            after,
        }
    }

    #[test]
    fn names_each_staged_bottleneck() {
        let first = |m: Measured| m.diagnose()[0].0;
        assert_eq!(
            first(measured(stats(0.05, None, 0, 0))),
            Bottleneck::S3Latency
        );
        assert_eq!(
            first(measured(stats(0.002, Some(0.08), 0, 1 << 20))),
            Bottleneck::CacheDevice
        );
        assert_eq!(
            first(measured(stats(0.002, None, 12, 0))),
            Bottleneck::MemoryBudget
        );
        assert_eq!(first(measured(stats(0.002, None, 0, 0))), Bottleneck::None);
        // A few refusals, or few beside many GETs, are the budget at work.
        assert_eq!(first(measured(stats(0.002, None, 3, 0))), Bottleneck::None);
        let mut many_gets = stats(0.002, None, 40, 0);
        many_gets["s3"]["GET"]["requests"] = json!(1010);
        assert_eq!(first(measured(many_gets)), Bottleneck::None);
        let mut most_refused = stats(0.002, None, 60, 0);
        most_refused["s3"]["GET"]["requests"] = json!(1010);
        assert_eq!(first(measured(most_refused)), Bottleneck::MemoryBudget);
        let mut busy = measured(stats(0.002, None, 0, 0));
        busy.seq_idle = Some(0.02);
        busy.seq_secs = 2.0;
        assert_eq!(first(busy), Bottleneck::Cpu);
        // A read of 0.5 s or more, its readers waiting most of it.
        let mut waiting = stats(0.002, None, 0, 0);
        waiting["read"]["read_wait_secs"]["sum"] = json!(1.5);
        let mut slow = measured(waiting.clone());
        slow.seq_secs = 2.0;
        assert_eq!(first(slow), Bottleneck::S3Bandwidth);
        let mut brief = measured(waiting);
        brief.seq_secs = 0.3;
        assert_eq!(first(brief), Bottleneck::None);
        let mut walk = measured(stats(0.002, None, 0, 0));
        walk.walk_secs = 10.0;
        assert_eq!(first(walk), Bottleneck::Metadata);
    }

    #[test]
    fn gets_slow_only_in_their_bodies_are_not_s3_latency() {
        let first = |m: Measured| m.diagnose()[0].0;
        // GETs of 50 ms whose first byte came after 2 ms: a slow link.
        let mut link = stats(0.05, None, 0, 0);
        link["s3"]["LIST"]["latency_secs"] = json!({"sum": 0.02, "count": 10});
        link["s3"]["GET"]["first_byte_secs"] = json!({"sum": 0.02, "count": 10});
        link["read"]["read_wait_secs"]["sum"] = json!(1.5);
        let mut m = measured(link.clone());
        m.seq_secs = 2.0;
        assert_eq!(first(m), Bottleneck::S3Bandwidth);
        // The same with a slow first byte is the server's latency.
        link["s3"]["GET"]["first_byte_secs"] = json!({"sum": 0.4, "count": 10});
        assert_eq!(first(measured(link)), Bottleneck::S3Latency);
    }
}
