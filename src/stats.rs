//! `lakemount stats MOUNTPOINT`: the live view of a running mount, read from
//! its control socket (`GET /stats`, telemetry/control.rs). `--json` prints the
//! document as it came; otherwise a few lines for a terminal, and with
//! `--watch` the rates between two refreshes as well.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::Value;

use crate::cache::human;
use crate::cli::StatsArgs;

/// Runs `lakemount stats`. Errors: no daemon behind the socket (names the
/// socket and the mount point), or an answer that is not the stats document.
pub fn run_stats(args: &StatsArgs) -> anyhow::Result<()> {
    let socket = match &args.socket {
        Some(s) => s.clone(),
        None => {
            // The mount point's own socket first: finding the mount from a
            // path inside it stats the path, which a wedged daemon would
            // never answer.
            use crate::telemetry::control::{mount_root, socket_path};
            let direct = socket_path(&args.mountpoint);
            if direct.exists() {
                direct
            } else {
                socket_path(&mount_root(&args.mountpoint))
            }
        }
    };
    let mut last: Option<(Instant, Value)> = None;
    loop {
        let v = fetch(&socket).with_context(|| {
            format!(
                "no lakemount control socket answered at {} (is {} a running lakemount mount? \
                     the socket belongs to the daemon's user: run as that user, usually root)",
                socket.display(),
                args.mountpoint.display()
            )
        })?;
        let out = if args.json {
            format!("{v}\n")
        } else {
            // With --watch: clear the terminal and go home first, as watch(1) does.
            let clear = if args.watch.is_some() {
                "\x1b[2J\x1b[H"
            } else {
                ""
            };
            let view = render(&v, last.as_ref().map(|(t, p)| (t.elapsed(), p)));
            format!("{clear}{view}")
        };
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => {}
            // The reader went away (`stats --watch | head`): done.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e).context("writing to standard output"),
        }
        drop(stdout);
        let Some(every) = args.watch else {
            return Ok(());
        };
        last = Some((Instant::now(), v));
        std::thread::sleep(Duration::from_secs_f64(every));
    }
}

/// The daemon's `/stats` document from its control socket. Errors: nothing
/// answers there, or the answer is not JSON.
pub fn fetch(socket: &Path) -> anyhow::Result<Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let text = rt.block_on(get(socket, "/stats"))?;
    serde_json::from_str(&text).context("the daemon's /stats is not JSON")
}

/// One `GET path` over the Unix socket; the body on 200.
async fn get(socket: &Path, path: &str) -> anyhow::Result<String> {
    let stream = tokio::net::UnixStream::connect(socket).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, "lakemount")
        .body(Empty::<Bytes>::new())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .context("no answer within 10 s")??;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        bail!("{status}: {}", body.trim());
    }
    Ok(body)
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn bytes(v: &Value) -> String {
    human(num(v) as u64)
}

/// Milliseconds of a seconds value, or `-` when absent.
fn ms(v: &Value) -> String {
    match v.as_f64() {
        Some(s) if s < 0.01 => format!("{:.2} ms", s * 1e3),
        Some(s) => format!("{:.0} ms", s * 1e3),
        None => "-".into(),
    }
}

/// The terminal view; with `prev` (time since, document) also rates.
fn render(v: &Value, prev: Option<(Duration, &Value)>) -> String {
    let m = &v["mount"];
    let r = &v["read"];
    let mut out = String::new();
    let mode = if m["read_only"].as_bool().unwrap_or(true) {
        "read-only"
    } else {
        "read-write"
    };
    let cache = match m["cache_dir"].as_str() {
        Some(d) => format!("cache {d}"),
        None => "no disk cache".into(),
    };
    out += &format!(
        "lakemount {} on {}: s3://{}/{} ({mode}, {cache}), up {:.0} s, pid {}\n",
        m["version"].as_str().unwrap_or("?"),
        m["mountpoint"].as_str().unwrap_or("?"),
        m["bucket"].as_str().unwrap_or("?"),
        m["prefix"].as_str().unwrap_or(""),
        num(&v["uptime_secs"]),
        m["pid"],
    );
    let sb = &r["served_bytes"];
    let ratio = match r["hit_ratio"].as_f64() {
        Some(h) => format!("{:.1}%", h * 100.0),
        None => "-".into(),
    };
    out += &format!(
        "read        {} by read requests, {} put in readers' page cache ahead, {} from S3 \
         GETs; cache hit ratio {ratio} (memory {}, disk {}, S3 {}); {} passthrough opens (the \
         kernel reads those: in no count)\n",
        bytes(&r["fuse_read_bytes"]),
        bytes(&r["page_cache_fill_bytes"]),
        bytes(&r["s3_get_bytes"]),
        bytes(&sb["memory"]),
        bytes(&sb["disk"]),
        bytes(&sb["s3"]),
        num(&r["passthrough_opens"]),
    );
    if let Some((dt, p)) = prev {
        let rate = |now: &Value, before: &Value| {
            human(((num(now) - num(before)).max(0.0) / dt.as_secs_f64().max(1e-3)) as u64)
        };
        out += &format!(
            "rate        {}/s by read requests, {}/s from S3\n",
            rate(&r["fuse_read_bytes"], &p["read"]["fuse_read_bytes"]),
            rate(&r["s3_get_bytes"], &p["read"]["s3_get_bytes"]),
        );
    }
    if let Some(ops) = v["s3"].as_object() {
        for (op, o) in ops {
            let l = &o["latency_secs"];
            out += &format!(
                "S3 {op:<8} {} requests, {} errors, {} retries; latency p50 {} p95 {} p99 {}\n",
                num(&o["requests"]),
                num(&o["errors"]),
                num(&o["retries"]),
                ms(&l["p50"]),
                ms(&l["p95"]),
                ms(&l["p99"]),
            );
        }
    }
    let ra = &v["read_ahead"];
    out += &format!(
        "read-ahead  {} of the {} memory budget in use; {} fetched and dropped unread; \
         small objects prefetched {}, prefetch hits {}, unread {}\n",
        bytes(&ra["memory_in_use_bytes"]),
        bytes(&ra["memory_budget_bytes"]),
        bytes(&ra["waste_bytes"]),
        num(&ra["small_objects_prefetched"]),
        num(&ra["small_prefetch_hits"]),
        bytes(&ra["small_unread_bytes"]),
    );
    let c = &v["cache"];
    if c["device_slow"].as_bool().unwrap_or(false) {
        out += &format!(
            "ALARM       the cache device's reads stay above twice their reference \
             ({} reads sent to S3 instead)\n",
            num(&c["device_bypassed_reads"])
        );
    }
    if c["enabled"].as_bool().unwrap_or(false) {
        let d = &c["device_read_secs"];
        out += &format!(
            "cache       {} of {} limit, {} free on its file system; device reads p50 {} p99 {}; \
             {} evictions, {} bad pieces\n",
            bytes(&c["disk_bytes"]),
            bytes(&c["limit_bytes"]),
            bytes(&c["fs_free_bytes"]),
            ms(&d["p50"]),
            ms(&d["p99"]),
            num(&c["evictions"]),
            num(&c["bad_pieces"]),
        );
    }
    let w = &v["writes"];
    if !m["read_only"].as_bool().unwrap_or(true) {
        out += &format!(
            "writes      {} written through lakemount, {} passthrough writer opens (written by \
             the kernel); staged {} files ({}), {} uploads in flight, {} uploaded, {} failed uploads\n",
            bytes(&w["fuse_write_bytes"]),
            num(&w["passthrough_opens"]),
            num(&w["staged_files"]),
            bytes(&w["staged_bytes"]),
            num(&w["uploads_in_flight"]),
            bytes(&w["uploaded_bytes"]),
            num(&w["upload_failures"]),
        );
    }
    out
}
