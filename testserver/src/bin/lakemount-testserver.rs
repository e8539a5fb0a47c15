//! Runs the in-memory S3 test server until killed, for manual runs and demos.
//!
//! ```text
//! lakemount-testserver [--port N] [--bucket NAME]... [--populate-demo] [--tls]
//!                      [--stats-port N] [--ttfb-ms MS] [--ttfb-ops OP,OP...]
//! ```
//!
//! Prints `endpoint=URL` (and `ca=PATH` with `--tls`), plus the credentials, on
//! stdout, then serves until killed. With `--stats-port`, plain HTTP on that
//! loopback port answers any request with the request counters, one
//! `s3_requests{op="GetObject"} 123` line per operation (for the benchmark).
//!
//! `--ttfb-ms MS` emulates the per-request latency of a real S3 or MinIO
//! server (time to first byte): every request of the operations in
//! `--ttfb-ops` (default: the read operations GetObject, HeadObject,
//! ListObjectsV2, ListObjects; never the uploads) waits MS milliseconds
//! before it is answered. The wait is a tokio timer (the hook of
//! [`TestServer::set_delay`]), so it blocks no other request: N requests in
//! flight all wait MS, as on a real server, not N x MS. The benchmark combines
//! it with a bandwidth limit on the server's port (bench/README.md).

use std::io::Write;
use std::net::SocketAddr;

use lakemount_testserver::{ACCESS_KEY, REGION, SECRET_KEY, TestServer};

const USAGE: &str = "usage: lakemount-testserver [--port N] [--bucket NAME]... [--populate-demo] \
                     [--tls] [--stats-port N] [--ttfb-ms MS] [--ttfb-ops OP,OP...]";

/// What `--help` says after the usage line.
const HELP: &str = "An in-memory S3 server on loopback (for tests, the demo and the benchmark);
everything is lost when it stops. Prints endpoint=URL and the credentials to
use, then serves until killed.

  --port N          listen on 127.0.0.1:N (default: a free port)
  --bucket NAME     create the bucket (repeatable)
  --populate-demo   fill every bucket with a small sample tree
  --tls             serve HTTPS with a generated CA (printed as ca=PATH)
  --stats-port N    plain HTTP on N answers with the request counters
  --ttfb-ms MS      delay each read request's answer by MS (a real server's
                    time to first byte)
  --ttfb-ops LIST   the operations --ttfb-ms delays (default: GetObject,
                    HeadObject, ListObjectsV2, ListObjects)";

/// Operations `--ttfb-ms` delays unless `--ttfb-ops` says otherwise: what a
/// reader sends (PUTs of the upload stay fast).
const TTFB_OPS: &[&str] = &["GetObject", "HeadObject", "ListObjectsV2", "ListObjects"];

struct Args {
    port: u16,
    buckets: Vec<String>,
    populate_demo: bool,
    tls: bool,
    stats_port: Option<u16>,
    ttfb_ms: f64,
    ttfb_ops: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        buckets: Vec::new(),
        populate_demo: false,
        tls: false,
        stats_port: None,
        ttfb_ms: 0.0,
        ttfb_ops: TTFB_OPS.iter().map(|s| (*s).to_owned()).collect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (a.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--port" => {
                args.port = value("--port")?
                    .parse()
                    .map_err(|e| format!("--port: {e}"))?
            }
            "--bucket" => args.buckets.push(value("--bucket")?),
            "--populate-demo" => args.populate_demo = true,
            "--stats-port" => {
                args.stats_port = Some(
                    value("--stats-port")?
                        .parse()
                        .map_err(|e| format!("--stats-port: {e}"))?,
                )
            }
            "--ttfb-ms" => {
                args.ttfb_ms = value("--ttfb-ms")?
                    .parse()
                    .map_err(|e| format!("--ttfb-ms: {e}"))?;
                if !(args.ttfb_ms >= 0.0 && args.ttfb_ms < 60_000.0) {
                    return Err("--ttfb-ms: must be between 0 and 60000".to_owned());
                }
            }
            "--ttfb-ops" => {
                args.ttfb_ops = value("--ttfb-ops")?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            }
            "--tls" => args.tls = true,
            "-h" | "--help" => {
                println!("{USAGE}\n\n{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(args)
}

/// A small tree that shows what lakemount mounts: shards, nested directories,
/// a file and a directory of the same name, awkward characters, an empty file.
fn populate_demo(server: &TestServer, bucket: &str) {
    for i in 0..8u32 {
        let data: Vec<u8> = (0..1024 * 1024u32)
            .map(|j| (j.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8)
            .collect();
        server.put(bucket, &format!("train/shard-{i:05}.bin"), data);
    }
    for (k, v) in [
        ("README.txt", "lakemount demo bucket\n"),
        ("train/labels.csv", "id,label\n0,cat\n1,dog\n"),
        ("val/images/0001.txt", "image 1\n"),
        ("val/images/0002.txt", "image 2\n"),
        ("odd/a", "a file named a\n"),
        ("odd/a/x", "a file under a directory named a\n"),
        ("odd/with space+plus%.txt", "awkward name\n"),
        ("odd/ünïcödé.txt", "non-ASCII name\n"),
        ("empty.bin", ""),
    ] {
        server.put(bucket, k, v.as_bytes().to_vec());
    }
}

/// Answers every connection on `127.0.0.1:port` with the request counters
/// (blocks forever).
fn serve_stats(server: TestServer, port: u16) -> ! {
    use std::io::Read;
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
        eprintln!("--stats-port {port}: {e}");
        std::process::exit(1)
    });
    loop {
        let Ok((mut conn, _)) = listener.accept() else {
            continue;
        };
        // Read the request head (bounded in time: a silent client must not
        // wedge the endpoint), then answer and close our side cleanly.
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(1)));
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
            match conn.read(&mut buf) {
                Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let body: String = server
            .request_counts()
            .iter()
            .map(|(op, n)| format!("s3_requests{{op=\"{op}\"}} {n}\n"))
            .collect();
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.shutdown(std::net::Shutdown::Write);
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut ca = None;
    // Kept alive (main never returns) so the server's tasks keep running.
    let mut _runtime = None;
    let server = if args.tls {
        let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
        let (s, path) = TestServer::start_tls_background_on(addr).expect("start server");
        ca = Some(path);
        s
    } else {
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
        let s = rt
            .block_on(TestServer::start_on(addr))
            .expect("start server");
        _runtime = Some(rt);
        s
    };
    for b in &args.buckets {
        server.create_bucket(b);
        if args.populate_demo {
            populate_demo(&server, b);
        }
    }
    if args.ttfb_ms > 0.0 {
        let d = std::time::Duration::from_secs_f64(args.ttfb_ms / 1000.0);
        for op in &args.ttfb_ops {
            server.set_delay(op, "", d);
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "endpoint={}", server.endpoint());
    if let Some(p) = ca {
        let _ = writeln!(out, "ca={}", p.display());
    }
    let _ = writeln!(out, "access_key={ACCESS_KEY}");
    let _ = writeln!(out, "secret_key={SECRET_KEY}");
    if args.ttfb_ms > 0.0 {
        let _ = writeln!(
            out,
            "ttfb_ms={} ops={}",
            args.ttfb_ms,
            args.ttfb_ops.join(",")
        );
    }
    let _ = writeln!(out, "region={REGION}");
    let _ = out.flush();
    drop(out);
    if let Some(port) = args.stats_port {
        serve_stats(server, port);
    }
    loop {
        std::thread::park();
    }
}
