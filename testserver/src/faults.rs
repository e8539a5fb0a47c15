//! A fault-injecting HTTP proxy on loopback, for tests and benchmarks: it
//! forwards every request to an upstream S3 server and breaks a chosen share
//! of them in one of the ways real networks and servers do.
//!
//! The request goes upstream unchanged (the `Host` header too, so a SigV4
//! signature made for the proxy's address still verifies upstream). Which
//! requests fail, and how, comes from a seeded generator: a run is
//! repeatable for one order of requests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// One way to break a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// 500 InternalError with an S3 XML error body; nothing goes upstream.
    Status500,
    /// 503 SlowDown with an S3 XML error body; nothing goes upstream.
    Status503,
    /// The connection is closed before any response.
    ResetBefore,
    /// Headers and half the body, then the connection fails.
    ResetMidBody,
    /// Half the body as a complete chunked body: no error, just short.
    TruncatedBody,
    /// Headers and half the body, then nothing for [`FaultPlan::stall`],
    /// then the rest.
    StallMidBody,
    /// The response is held back [`FaultPlan::slow`] before it starts.
    SlowFirstByte,
    /// A 206 that covers the whole object comes back as a plain 200 without
    /// Content-Range, as from a server that ignores Range. (The request
    /// itself goes up unchanged: dropping its Range header would break its
    /// SigV4 signature. A 206 of part of an object is left alone.)
    WholeObject,
    /// Content-Range names a first byte one past the asked one.
    WrongContentRange,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 9] = [
        Fault::Status500,
        Fault::Status503,
        Fault::ResetBefore,
        Fault::ResetMidBody,
        Fault::TruncatedBody,
        Fault::StallMidBody,
        Fault::SlowFirstByte,
        Fault::WholeObject,
        Fault::WrongContentRange,
    ];

    /// A short name, for counts and logs.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Status500 => "500",
            Fault::Status503 => "503",
            Fault::ResetBefore => "reset_before",
            Fault::ResetMidBody => "reset_mid_body",
            Fault::TruncatedBody => "truncated_body",
            Fault::StallMidBody => "stall_mid_body",
            Fault::SlowFirstByte => "slow_first_byte",
            Fault::WholeObject => "whole_object",
            Fault::WrongContentRange => "wrong_content_range",
        }
    }
}

/// Which requests fail and how.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Share of requests broken, 0.0-1.0.
    pub rate: f64,
    /// The kinds drawn from, each equally likely.
    pub kinds: Vec<Fault>,
    /// Seed of the generator.
    pub seed: u64,
    /// How long [`Fault::StallMidBody`] stalls.
    pub stall: Duration,
    /// How long [`Fault::SlowFirstByte`] holds a response.
    pub slow: Duration,
}

impl FaultPlan {
    /// `rate` of requests broken, every kind, a 20 s stall, a 2 s slow start.
    pub fn every_kind(rate: f64, seed: u64) -> Self {
        Self {
            rate,
            kinds: Fault::ALL.to_vec(),
            seed,
            stall: Duration::from_secs(20),
            slow: Duration::from_secs(2),
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

struct Shared {
    upstream: SocketAddr,
    plan: Mutex<FaultPlan>,
    rng: Mutex<u64>,
    client: Client<HttpConnector, Incoming>,
    requests: AtomicU64,
    injected: Mutex<Vec<(Fault, u64)>>,
    started: std::time::Instant,
}

/// A running proxy. Stops when dropped (or on [`FaultProxy::shutdown`]).
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1` (random port) to `upstream`, on a
    /// runtime of its own (a background thread).
    pub fn start(upstream: SocketAddr, plan: FaultPlan) -> std::io::Result<FaultProxy> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream, plan)
    }

    /// Like [`FaultProxy::start`], listening on `listen` (e.g. a fixed port).
    pub fn start_on(
        listen: SocketAddr,
        upstream: SocketAddr,
        plan: FaultPlan,
    ) -> std::io::Result<FaultProxy> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("lakemount-faultproxy")
            .enable_all()
            .build()?;
        let client = {
            let _g = rt.enter();
            Client::builder(TokioExecutor::new()).build_http()
        };
        let shared = Arc::new(Shared {
            upstream,
            rng: Mutex::new(plan.seed | 1),
            plan: Mutex::new(plan),
            client,
            requests: AtomicU64::new(0),
            injected: Mutex::new(Vec::new()),
            started: std::time::Instant::now(),
        });
        let listener = rt.block_on(TcpListener::bind(listen))?;
        let addr = listener.local_addr()?;
        let (stop, rx) = watch::channel(false);
        let s = shared.clone();
        std::thread::Builder::new()
            .name("lakemount-faultproxy-main".into())
            .spawn(move || {
                rt.block_on(accept_loop(listener, s, rx));
                rt.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(FaultProxy { addr, shared, stop })
    }

    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the share of requests broken from now on.
    pub fn set_rate(&self, rate: f64) {
        self.shared.plan.lock().unwrap().rate = rate;
    }

    /// Replaces the plan from now on (the generator keeps its state).
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.shared.plan.lock().unwrap() = plan;
    }

    /// Requests seen so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Faults injected so far, by kind (kinds never drawn are left out).
    pub fn injected(&self) -> Vec<(Fault, u64)> {
        self.shared.injected.lock().unwrap().clone()
    }

    /// Stops accepting and drops open connections.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|v| *v) => break,
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
            let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            tokio::select! {
                _ = http.serve_connection(TokioIo::new(stream), service) => {}
                _ = stop.wait_for(|v| *v) => {}
            }
        });
    }
}

impl Shared {
    /// The fault for the next request, if it gets one (xorshift64*).
    fn draw(&self) -> Option<(Fault, Duration, Duration)> {
        let plan = self.plan.lock().unwrap().clone();
        if plan.kinds.is_empty() || plan.rate <= 0.0 {
            return None;
        }
        let next = || {
            let mut x = self.rng.lock().unwrap();
            *x ^= *x >> 12;
            *x ^= *x << 25;
            *x ^= *x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let roll = (next() >> 11) as f64 / (1u64 << 53) as f64;
        if roll >= plan.rate {
            return None;
        }
        let fault = plan.kinds[(next() % plan.kinds.len() as u64) as usize];
        Some((fault, plan.stall, plan.slow))
    }

    fn count(&self, fault: Fault) {
        let mut v = self.injected.lock().unwrap();
        match v.iter_mut().find(|(f, _)| *f == fault) {
            Some((_, n)) => *n += 1,
            None => v.push((fault, 1)),
        }
    }
}

/// Whether each injected fault is written to stderr (seconds since start,
/// kind, method, URI, Range): `LAKEMOUNT_FAULTPROXY_TRACE` set.
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("LAKEMOUNT_FAULTPROXY_TRACE").is_some())
}

/// The error a handler returns to make hyper drop the connection unanswered.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by the fault proxy")
    }
}

impl std::error::Error for Dropped {}

async fn handle(
    shared: Arc<Shared>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Body>, Dropped> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let fault = shared.draw();
    if let Some((f, _, _)) = fault {
        shared.count(f);
    }
    let fault_kind = fault.map(|(f, _, _)| f);
    if let Some(f) = fault_kind
        && trace()
    {
        let range = req
            .headers()
            .get(hyper::header::RANGE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        eprintln!(
            "{:.3} {} {} {} {range}",
            shared.started.elapsed().as_secs_f64(),
            f.name(),
            req.method(),
            req.uri()
        );
    }
    match fault_kind {
        Some(Fault::Status500) => return Ok(xml_error(500, "InternalError")),
        Some(Fault::Status503) => return Ok(xml_error(503, "SlowDown")),
        Some(Fault::ResetBefore) => return Err(Dropped),
        _ => {}
    }
    let (mut parts, body) = req.into_parts();
    let asked_range = parts.headers.contains_key(hyper::header::RANGE);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    parts.uri = match format!("http://{}{path}", shared.upstream).parse() {
        Ok(u) => u,
        Err(_) => return Ok(xml_error(400, "InvalidURI")),
    };
    let resp = match shared
        .client
        .request(hyper::Request::from_parts(parts, body))
        .await
    {
        Ok(r) => r,
        Err(_) => return Ok(xml_error(502, "BadGateway")),
    };
    let (mut parts, body) = resp.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Err(Dropped);
    };
    let ok = parts.status.is_success();
    let half = body.slice(..body.len() / 2);
    let out: Body = match fault {
        Some((Fault::SlowFirstByte, _, slow)) => {
            tokio::time::sleep(slow).await;
            full(body)
        }
        Some((Fault::WholeObject, _, _)) if ok && asked_range => {
            let whole = parts
                .headers
                .get(hyper::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(covers_whole);
            if whole {
                parts.status = hyper::StatusCode::OK;
                parts.headers.remove(hyper::header::CONTENT_RANGE);
            }
            full(body)
        }
        Some((Fault::WrongContentRange, _, _)) if ok && asked_range => {
            if let Some(v) = parts.headers.get(hyper::header::CONTENT_RANGE).cloned()
                && let Some(shifted) = shift_content_range(v.to_str().unwrap_or(""))
                && let Ok(h) = shifted.parse()
            {
                parts.headers.insert(hyper::header::CONTENT_RANGE, h);
            }
            full(body)
        }
        Some((Fault::ResetMidBody, _, _)) if ok && body.len() > 1 => {
            let cut = futures::stream::once(async {
                // A pause so that the half is flushed before the failure.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::other(
                    "fault proxy: connection reset mid-body",
                ))
            });
            stream_body(half, cut)
        }
        Some((Fault::TruncatedBody, _, _)) if ok && body.len() > 1 => {
            // Chunked (no Content-Length): the client sees a body that ends
            // cleanly, short.
            parts.headers.remove(hyper::header::CONTENT_LENGTH);
            full(half)
        }
        Some((Fault::StallMidBody, stall, _)) if ok && body.len() > 1 => {
            let rest = body.slice(body.len() / 2..);
            let later = futures::stream::once(async move {
                tokio::time::sleep(stall).await;
                Ok(Frame::data(rest))
            });
            stream_body(half, later)
        }
        _ => full(body),
    };
    Ok(hyper::Response::from_parts(parts, out))
}

fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|e: Infallible| match e {}).boxed()
}

/// `head`, then what `rest` yields.
fn stream_body<S>(head: Bytes, rest: S) -> Body
where
    S: futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send + Sync + 'static,
{
    use futures::StreamExt;
    let first = futures::stream::iter([Ok::<_, std::io::Error>(Frame::data(head))]);
    BodyExt::boxed(StreamBody::new(first.chain(rest)))
}

/// Whether `bytes A-B/N` is the whole object (A = 0, B = N - 1).
fn covers_whole(v: &str) -> bool {
    let Some((range, total)) = v
        .trim()
        .strip_prefix("bytes ")
        .and_then(|s| s.split_once('/'))
    else {
        return false;
    };
    let total: Option<u64> = total.trim().parse().ok();
    match (range.split_once('-'), total) {
        (Some((a, b)), Some(n)) => {
            a.trim() == "0" && b.trim().parse::<u64>().ok() == n.checked_sub(1)
        }
        _ => false,
    }
}

/// `bytes A-B/N` with A and B one higher (a range that starts one byte late).
fn shift_content_range(v: &str) -> Option<String> {
    let spec = v.trim().strip_prefix("bytes ")?;
    let (range, total) = spec.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b): (u64, u64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    Some(format!("bytes {}-{}/{total}", a + 1, b + 1))
}

fn xml_error(status: u16, code: &str) -> hyper::Response<Body> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>injected by the fault proxy</Message><RequestId>faultproxy</RequestId></Error>"
    );
    hyper::Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/xml")
        .body(full(Bytes::from(body)))
        .expect("static response")
}

#[cfg(test)]
mod tests {
    use super::{covers_whole, shift_content_range};

    #[test]
    fn whole_object_ranges_are_recognised() {
        assert!(covers_whole("bytes 0-999/1000"));
        assert!(!covers_whole("bytes 0-998/1000"));
        assert!(!covers_whole("bytes 1-999/1000"));
        assert!(!covers_whole("bytes 0-0/*"));
    }

    #[test]
    fn content_range_shifts_by_one_byte() {
        assert_eq!(
            shift_content_range("bytes 0-99/1000").as_deref(),
            Some("bytes 1-100/1000")
        );
        assert_eq!(shift_content_range("bytes */1000"), None);
    }
}
