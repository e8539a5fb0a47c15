//! GetObject sent straight to the SDK's HTTP connector, signed with SigV4
//! ([`super::sigv4`]): the one request lakemount sends by the ten thousand.
//!
//! The SDK's orchestrator (interceptors, a config bag per request, endpoint
//! rules evaluated per request, retry classifiers) cost more CPU per small GET
//! than the request itself (docs/READAHEAD.md, "What limits epoch 1"). This
//! path keeps what the SDK provides below and beside it: its HTTP connector
//! (hyper, rustls, the CA bundle, connect and first-byte timeouts), its
//! credentials chain, its endpoint rules (evaluated once per mount, at start)
//! and `aws-sigv4`'s signing key and signature functions (the canonical
//! request of a GET is written by [`super::sigv4`]). What it does itself:
//!
//! * **Retries**: up to `s3.max_attempts` attempts within
//!   `s3.request_deadline_secs`, with full-jitter backoff doubling from
//!   100 ms after a fault of the server or the path to it (500, 502, 504,
//!   a broken connection or body) and from 500 ms after throttling (503,
//!   429, throttling codes), at most 20 s (the AWS SDK for JavaScript's
//!   retry delays). Unlike the SDK there is no retry
//!   quota shared by all requests: a throttling storm slows each request
//!   down (backoff) instead of leaving every later 503 one attempt. The
//!   connection of a failed attempt is not reused.
//! * **Hedging**: a GET whose headers are late by the recent 95th
//!   percentile, and that a reader waits for, is sent a second time
//!   ([`super::hedge`]); the first sound answer is read. A body that
//!   pauses as long while a reader waits gets a GET of its rest, pinned to
//!   its ETag; whichever body sends bytes first is read.
//! * **Clock skew**: the server's `Date` header corrects the signing time,
//!   as the SDK's clock-skew interceptor does; `RequestTimeTooSkewed` is
//!   retried with the corrected time.
//! * **Resumed bodies**: a body that fails or stalls part way is continued
//!   from the first byte not received, with a ranged GET pinned to the same
//!   ETag (`If-Match`), so the bytes kept and the bytes added are of one
//!   version. That counts as one more attempt. An object listed without an
//!   ETag cannot be pinned: its GET starts over instead.
//! * **Stalls**: no byte of the body for `s3.stall_timeout_secs` (1 s) fails
//!   the attempt, and the next one resumes the body (the SDK's
//!   stalled-stream protection has the same purpose, with 5 s).
//! * **Credentials**: reused until a minute before they expire (wall-clock
//!   time, so a suspended host does not keep expired ones); credentials
//!   without an expiry for 15 minutes (the SDK identity cache's default). An
//!   `ExpiredToken` answer drops them and the attempt is retried.
//!
//! Endpoints whose rules ask for another auth scheme than SigV4 (S3 Express
//! One Zone's session auth, SigV4a for multi-region access points) or extra
//! headers are left to the SDK: [`DirectGet::new`] returns `None` for them.

use std::ops::Range;
use std::sync::RwLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_smithy_http_client::Connector;
use aws_smithy_runtime_api::client::connection::CaptureSmithyConnection;
use aws_smithy_runtime_api::client::http::HttpConnector;
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_types::Document;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;
use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

use super::StoreError;
use super::hedge::{Hedge, Urgency};
use super::pool::BufferPool;
use super::sigv4::{EMPTY_SHA256, GetSigner};
use crate::telemetry::metrics as m;

/// Bytes of an object key sent as they are; every other byte is
/// percent-encoded. The unreserved characters of RFC 3986 and `/`, as S3's
/// SigV4 canonical URI wants them ("Signature Version 4 signing process",
/// canonical request, Amazon S3 API reference).
const KEY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// First retry delay before jitter after a fault of the server or the path
/// to it (5xx, a broken connection or body); doubles per attempt. The AWS
/// SDK for JavaScript v3's retry delay base (`DEFAULT_RETRY_DELAY_BASE`,
/// @aws-sdk/middleware-retry): such faults are of one request, not of
/// load, and a reader waits on them.
pub(super) const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// First retry delay before jitter after throttling; doubles per attempt
/// (the same SDK's `THROTTLING_RETRY_DELAY_BASE`): the server asked for
/// fewer requests.
const THROTTLE_BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest retry delay before jitter (the standard strategy's maximum).
const BACKOFF_MAX: Duration = Duration::from_secs(20);
/// How long credentials without an expiry time are reused (the SDK's
/// default identity cache expiration).
const CREDENTIALS_REUSE: Duration = Duration::from_secs(15 * 60);
/// Credentials are refreshed this long before they expire.
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(60);
/// The `User-Agent` of GETs, for the server's logs.
const USER_AGENT: &str = concat!("lakemount/", env!("CARGO_PKG_VERSION"));
/// Error bodies are read up to this many bytes for their `<Code>`.
const MAX_ERROR_BODY: usize = 64 << 10;

/// What [`DirectGet::new`] needs from the SDK configuration.
pub(super) struct Setup<'a> {
    pub bucket: &'a str,
    pub region: &'a str,
    /// The endpoint URL as the SDK would use it; `None`: AWS.
    pub endpoint_url: Option<&'a str>,
    pub force_path_style: bool,
    pub use_fips: bool,
    pub use_dual_stack: bool,
    /// `None`: unsigned requests (`s3.no_sign_request`).
    pub credentials: Option<SharedCredentialsProvider>,
    pub connector: Connector,
    pub max_attempts: u32,
    /// First-byte limit of one attempt (also of one credentials load).
    pub attempt_timeout: Duration,
    /// Longest pause of a body before the attempt is given up and resumed.
    pub stall_timeout: Duration,
    /// Hedged GETs ([`super::hedge`]).
    pub hedge: bool,
    /// No attempt is started, and none waits for headers, past this long
    /// after the first one began.
    pub deadline: Duration,
}

/// Ranged, ETag-pinned GETs of one bucket. Cheap to share behind an `Arc`.
pub(super) struct DirectGet {
    connector: Connector,
    /// The bucket's URL without a trailing `/`: a key's URL is this, `/`,
    /// and the key encoded with [`KEY`].
    base: String,
    /// The `Host` GETs are sent and signed with ([`host_and_origin`]).
    host: String,
    /// Length of `base`'s scheme and authority: a URL's path follows.
    origin_len: usize,
    /// Server clock minus ours, milliseconds, from the last `Date` header.
    skew_ms: AtomicI64,
    signer: GetSigner,
    credentials: Option<CredentialsCache>,
    max_attempts: u32,
    attempt_timeout: Duration,
    stall_timeout: Duration,
    hedge: Option<Hedge>,
    deadline: Duration,
}

impl std::fmt::Debug for DirectGet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectGet")
            .field("base", &self.base)
            .finish()
    }
}

impl DirectGet {
    /// Resolves the bucket's endpoint with the SDK's S3 endpoint rules.
    /// `None` when the rules want something this path does not do (another
    /// auth scheme than SigV4, extra headers) or fail: GETs then go through
    /// the SDK.
    pub(super) async fn new(s: Setup<'_>) -> Option<Self> {
        let mut params = Params::builder()
            .bucket(s.bucket)
            .region(s.region)
            .force_path_style(s.force_path_style)
            .use_fips(s.use_fips)
            .use_dual_stack(s.use_dual_stack);
        if let Some(url) = s.endpoint_url {
            params = params.endpoint(url);
        }
        let params = params.build().ok()?;
        let endpoint = match DefaultResolver::new().resolve_endpoint(&params).await {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("S3 endpoint rules: {e}; GETs go through the SDK");
                return None;
            }
        };
        if endpoint.headers().next().is_some() {
            return None;
        }
        let (mut signing_region, mut signing_name) = (s.region.to_string(), "s3".to_string());
        if let Some(Document::Array(schemes)) = endpoint.properties().get("authSchemes") {
            let Some(Document::Object(first)) = schemes.first() else {
                return None;
            };
            let text = |k: &str| match first.get(k) {
                Some(Document::String(v)) => Some(v.clone()),
                _ => None,
            };
            if text("name").as_deref() != Some("sigv4") {
                return None;
            }
            signing_region = text("signingRegion").unwrap_or(signing_region);
            signing_name = text("signingName").unwrap_or(signing_name);
        }
        let base = endpoint.url().trim_end_matches('/').to_string();
        let (host, origin_len) = host_and_origin(&base)?;
        Some(Self {
            connector: s.connector,
            base,
            host,
            origin_len,
            skew_ms: AtomicI64::new(0),
            signer: GetSigner::new(&signing_region, &signing_name),
            credentials: s
                .credentials
                .map(|p| CredentialsCache::new(p, s.attempt_timeout)),
            max_attempts: s.max_attempts.max(1),
            attempt_timeout: s.attempt_timeout,
            stall_timeout: s.stall_timeout,
            hedge: s.hedge.then(|| Hedge::new(m::OP_GET)),
            deadline: s.deadline,
        })
    }

    /// GET of `range` (end exclusive, non-empty) of `key`, pinned to `etag`
    /// when it is not empty, into one buffer from `pool`; hedged only while
    /// a reader waits for it (`urgency`, `None`: always). Errors as
    /// [`super::ObjectStore::get_range`]; counted in the request metrics
    /// once per call, whatever its attempts.
    pub(super) async fn get_range(
        &self,
        pool: &BufferPool,
        key: &str,
        range: Range<u64>,
        etag: &str,
        urgency: Option<&Urgency>,
    ) -> Result<Bytes, StoreError> {
        let start = Instant::now();
        let want = (range.end - range.start) as usize;
        let mut buf = pool.take(want);
        let url = format!(
            "{}/{}",
            self.base,
            percent_encoding::utf8_percent_encode(key, KEY)
        );
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            // A resumed attempt asks for the rest only; without an ETag to
            // pin it to, the rest could be of another version: start over.
            if etag.is_empty() {
                buf.clear();
            }
            let from = range.start + buf.len() as u64;
            let deadline = start + self.deadline;
            let failure = match self
                .attempt(&url, from..range.end, etag, &mut buf, deadline, urgency)
                .await
            {
                Ok(status) => break Ok(status),
                Err(f) => f,
            };
            if !failure.retry || attempt >= self.max_attempts {
                break Err(failure);
            }
            let delay = backoff(attempt, failure.throttled());
            if Instant::now() + delay >= deadline {
                break Err(failure);
            }
            m::s3_retry(m::OP_GET, &failure.status);
            tokio::time::sleep(delay).await;
        };
        match outcome {
            Ok(status) => {
                m::s3_request(m::OP_GET, status, start.elapsed());
                m::s3_bytes_received(buf.len() as u64);
                Ok(pool.freeze(buf))
            }
            Err(f) => {
                m::s3_request(m::OP_GET, &f.status, start.elapsed());
                Err(f.error)
            }
        }
    }

    /// One attempt: GET `range` of `url` and append its bytes to `buf` until
    /// it holds the whole range. The status label for the metrics on
    /// success (`206`, or `200` from a server that ignored Range). Headers
    /// not in by `deadline` fail it, not retried; a body that is arriving
    /// is not cut by it.
    async fn attempt(
        &self,
        url: &str,
        range: Range<u64>,
        etag: &str,
        buf: &mut Vec<u8>,
        deadline: Instant,
        urgency: Option<&Urgency>,
    ) -> Result<&'static str, Failure> {
        let want = (range.end - range.start) as usize;
        let t0 = Instant::now();
        let sent = tokio::time::timeout_at(
            deadline.into(),
            self.hedged_send(url, &range, etag, urgency),
        );
        let sent = sent.await;
        // Failed answers (throttling, errors) and no answer at all count
        // too: a server slow to answer anything is slow.
        m::s3_first_byte(m::OP_GET, t0.elapsed());
        let answer = match sent {
            Ok(a) => a?,
            Err(_) => {
                return Err(Failure::fatal(
                    StoreError::Transient(format!(
                        "GET {url}: no answer within s3.request_deadline_secs ({:?})",
                        self.deadline
                    )),
                    "deadline",
                ));
            }
        };
        let target = buf.len() + want;
        let mut answer = answer;
        let read = self
            .read_body(url, range.end, etag, &mut answer, buf, target, urgency)
            .await;
        let poison = |f: Failure| {
            if let Some(c) = answer.connection.get() {
                c.poison();
            }
            f
        };
        match read {
            Ok(()) if buf.len() == target => Ok(answer.label),
            Ok(()) => Err(poison(Failure::retry(
                StoreError::Transient(format!(
                    "GET {url}: the body ended {} bytes short",
                    target - buf.len()
                )),
                "short_body",
            ))),
            Err(BodyError::Stalled(d)) => Err(poison(Failure::retry(
                StoreError::Transient(format!("GET {url}: no byte of the body for {d:?}")),
                "stall",
            ))),
            Err(BodyError::Failed(e)) => Err(poison(Failure::retry(
                StoreError::Transient(format!("reading GET body of {url}: {e}")),
                "network",
            ))),
        }
    }

    /// Appends the body of `answer` to `buf` until it holds `target` bytes
    /// (the last of them byte `end - 1` of the object) or the body ends, as
    /// [`read_into`] does. A body that pauses for the hedge delay while a
    /// reader waits for its bytes (`urgency`) is hedged when it can be
    /// pinned to `etag` and the hedge budget allows ([`Self::hedge_rest`]).
    /// A hedge wins only with body bytes, so a server that sends every
    /// body late after its headers gets one hedge per pause, not a chain.
    #[allow(clippy::too_many_arguments)]
    async fn read_body(
        &self,
        url: &str,
        end: u64,
        etag: &str,
        answer: &mut Answer,
        buf: &mut Vec<u8>,
        target: usize,
        urgency: Option<&Urgency>,
    ) -> Result<(), BodyError> {
        let stall = self.stall_timeout;
        let hedge = self.hedge.as_ref().filter(|_| !etag.is_empty());
        while buf.len() < target {
            let stall_at = Instant::now() + stall;
            let next = match next_chunk(answer, hedge, urgency, stall_at).await {
                Some(n) => n,
                None => match hedge.filter(|h| Instant::now() < stall_at && h.try_spend()) {
                    Some(_) => {
                        let rest = end - (target - buf.len()) as u64..end;
                        self.hedge_rest(url, rest, etag, answer, stall_at).await?
                    }
                    // Stalled, or no hedge left in the budget.
                    None => tokio::time::timeout_at(stall_at.into(), answer.body.try_next())
                        .await
                        .map_err(|_| BodyError::Stalled(stall))?,
                },
            };
            let chunk = match next {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => return Err(BodyError::Failed(crate::store::s3::error_chain(&e))),
            };
            append(buf, &chunk, &mut answer.skip, target);
        }
        Ok(())
    }

    /// Sends a GET of `rest` (pinned to `etag`) beside the paused body of
    /// `answer` and gives the next chunk of whichever body sends one first:
    /// when the new one does, it replaces `answer` (the paused connection is
    /// closed). Headers alone do not win: a server that answers headers at
    /// once and sends the body later would otherwise be asked again at
    /// every pause. A failed hedge leaves the paused body, until `stall_at`.
    async fn hedge_rest(
        &self,
        url: &str,
        rest: Range<u64>,
        etag: &str,
        answer: &mut Answer,
        stall_at: Instant,
    ) -> Result<Result<Option<Bytes>, aws_smithy_types::byte_stream::error::Error>, BodyError> {
        let resume = async {
            let mut new = self.send(url, &rest, etag).await.ok()?;
            loop {
                match new.body.try_next().await {
                    Ok(Some(chunk)) if chunk.is_empty() => continue,
                    Ok(Some(chunk)) => return Some((new, chunk)),
                    _ => return None,
                }
            }
        };
        tokio::select! {
            n = tokio::time::timeout_at(stall_at.into(), answer.body.try_next()) => {
                let n = n.map_err(|_| BodyError::Stalled(self.stall_timeout))?;
                m::s3_hedge(m::OP_GET, m::HEDGE_FIRST_WON);
                Ok(n)
            }
            Some((new, chunk)) = resume => {
                m::s3_hedge(m::OP_GET, m::HEDGE_WON);
                if let Some(c) = answer.connection.get() {
                    c.poison();
                }
                *answer = new;
                Ok(Ok(Some(chunk)))
            }
        }
    }

    /// [`Self::send`], hedged ([`Hedge::run`]) when hedging is on.
    async fn hedged_send(
        &self,
        url: &str,
        range: &Range<u64>,
        etag: &str,
        urgency: Option<&Urgency>,
    ) -> Result<Answer, Failure> {
        match &self.hedge {
            Some(hedge) => hedge.run(urgency, || self.send(url, range, etag)).await,
            None => self.send(url, range, etag).await,
        }
    }

    /// Sends a GET of `range` of `url` and checks its answer's headers; the
    /// body is left to read. A failed answer's connection is poisoned.
    async fn send(&self, url: &str, range: &Range<u64>, etag: &str) -> Result<Answer, Failure> {
        // No Host header: the connector writes it from the URL as
        // `self.host` is (over HTTP/2, `:authority` is the URL's as written).
        let range_value = format!("bytes={}-{}", range.start, range.end - 1);
        let mut req = http::Request::get(url)
            .header(http::header::USER_AGENT, USER_AGENT)
            .header(http::header::RANGE, &range_value);
        let if_match = (!etag.is_empty()).then_some(etag);
        if let Some(e) = if_match {
            req = req.header(http::header::IF_MATCH, e);
        }
        if let Some(creds) = &self.credentials {
            let creds = creds.get().await?;
            let path = &url[self.origin_len..];
            let now = self.server_now();
            let signed = self
                .signer
                .sign(&creds, now, &self.host, path, &range_value, if_match);
            req = req
                .header("x-amz-date", signed.amz_date)
                .header("x-amz-content-sha256", EMPTY_SHA256)
                .header(http::header::AUTHORIZATION, signed.authorization);
            if let Some(token) = creds.session_token() {
                req = req.header("x-amz-security-token", token);
            }
        }
        let req = req
            .body(SdkBody::empty())
            .map_err(|e| Failure::fatal(StoreError::Other(format!("GET {url}: {e}")), "error"))?;
        let mut req: HttpRequest = req
            .try_into()
            .map_err(|e| Failure::fatal(StoreError::Other(format!("GET {url}: {e}")), "error"))?;
        let connection = CaptureSmithyConnection::new();
        req.add_extension(connection.clone());
        // A failed attempt's connection is closed, not reused: the next
        // attempt may reach a sound server behind the same name.
        let poison = |f: Failure| {
            if f.retry
                && let Some(c) = connection.get()
            {
                c.poison();
            }
            f
        };
        let resp = match self.connector.call(req).await {
            Ok(r) => r,
            Err(e) => {
                let label = if e.is_timeout() { "timeout" } else { "network" };
                let what = crate::store::s3::error_chain(&e);
                return Err(poison(Failure {
                    error: StoreError::Transient(format!("GET {url}: {what}")),
                    status: label.into(),
                    // Any fault of the connection, not only I/O and timeouts:
                    // a GET is idempotent, and hyper reports a pooled
                    // connection the server closed as we sent ("connection
                    // closed before message completed") as neither.
                    retry: !e.is_user(),
                }));
            }
        };
        if let Some(date) = resp.headers().get("date") {
            self.note_server_date(date);
        }
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let body = ByteStream::new(resp.into_body());
            let f = error_response(status, body, self.attempt_timeout).await;
            if (f.status.ends_with("ExpiredToken") || f.status.ends_with("TokenRefreshRequired"))
                && let Some(c) = &self.credentials
            {
                c.forget();
            }
            return Err(poison(f));
        }
        let header = |name: &str| resp.headers().get(name).map(str::to_string);
        let sent = header("etag");
        if sent.is_some_and(|e| !etag.is_empty() && !same_etag(&e, etag)) {
            // A server that ignored If-Match: these bytes are of another version.
            return Err(Failure::fatal(
                StoreError::PreconditionFailed,
                "etag_mismatch",
            ));
        }
        let want = (range.end - range.start) as usize;
        let length = header("content-length").and_then(|v| v.trim().parse::<u64>().ok());
        // Retried: a proxy or a server node can send a wrong range once.
        let bad_range = |what: String| {
            poison(Failure {
                error: StoreError::Transient(format!(
                    "GET {url} bytes {}-{}: the server sent {what}",
                    range.start,
                    range.end - 1
                )),
                status: "bad_range".into(),
                retry: true,
            })
        };
        // 206 names the range it sends in Content-Range; a 206 without the
        // header is taken as the range when its length is the range's. A
        // server that ignored Range sends the whole object (200): only the
        // bytes of the range are kept from it.
        let ranged = match header("content-range") {
            Some(cr) => match super::s3::content_range_start(&cr) {
                Some(first) if first == range.start => true,
                _ => return Err(bad_range(format!("Content-Range {cr:?}"))),
            },
            None => status == 206 || length == Some(want as u64),
        };
        let expect = if ranged { want as u64 } else { range.end };
        if let Some(l) = length.filter(|&l| if ranged { l != expect } else { l < expect }) {
            return Err(bad_range(format!("{l} bytes")));
        }
        Ok(Answer {
            label: if ranged { "206" } else { "200" },
            skip: if ranged { 0 } else { range.start },
            body: ByteStream::new(resp.into_body()),
            connection,
        })
    }

    /// Keeps the offset of the server's clock from a `Date` header (RFC 9110
    /// HTTP-date) for signing.
    fn note_server_date(&self, date: &str) {
        use aws_smithy_types::date_time::{DateTime, Format};
        let Some(server) = DateTime::from_str(date.trim(), Format::HttpDate)
            .ok()
            .and_then(|t| SystemTime::try_from(t).ok())
        else {
            return;
        };
        let now = SystemTime::now();
        let ms = match server.duration_since(now) {
            Ok(ahead) => ahead.as_millis() as i64,
            Err(behind) => -(behind.duration().as_millis() as i64),
        };
        self.skew_ms.store(ms, Ordering::Relaxed);
    }

    /// Our clock corrected by the server's last `Date`.
    fn server_now(&self) -> SystemTime {
        let ms = self.skew_ms.load(Ordering::Relaxed);
        let now = SystemTime::now();
        if ms >= 0 {
            now + Duration::from_millis(ms as u64)
        } else {
            now - Duration::from_millis(ms.unsigned_abs())
        }
    }
}

/// A 2xx answer whose headers passed the checks, its body not read yet.
struct Answer {
    /// Status label for the metrics: `206`, or `200` from a server that
    /// ignored Range.
    label: &'static str,
    /// Bytes of the body before the range (a `200` of the whole object).
    skip: u64,
    body: ByteStream,
    /// The connection, to poison when the body fails.
    connection: CaptureSmithyConnection,
}

/// A failed attempt: the error if it is the last, its metrics label, and
/// whether another attempt may succeed.
struct Failure {
    error: StoreError,
    status: String,
    retry: bool,
}

impl Failure {
    fn fatal(error: StoreError, status: &str) -> Self {
        Self {
            error,
            status: status.into(),
            retry: false,
        }
    }

    fn retry(error: StoreError, status: &str) -> Self {
        Self {
            error,
            status: status.into(),
            retry: true,
        }
    }

    /// The server asked for fewer requests (503 SlowDown, 429, a
    /// throttling code).
    fn throttled(&self) -> bool {
        matches!(self.error, StoreError::Throttled(_))
    }
}

/// The `Host` of GETs to the bucket URL `base`, as the HTTP connector
/// writes it (host, and `:port` unless the scheme's default; userinfo
/// dropped), and the length of `base`'s scheme and authority, after which a
/// URL's path starts. `None` for a URL without an authority.
fn host_and_origin(base: &str) -> Option<(String, usize)> {
    let uri = base.parse::<http::Uri>().ok()?;
    let scheme = uri.scheme_str()?;
    let authority = uri.authority()?;
    let host = match (scheme, uri.port_u16()) {
        ("http", Some(80)) | ("https", Some(443)) | (_, None) => authority.host().to_string(),
        (_, Some(port)) => format!("{}:{port}", authority.host()),
    };
    Some((host, scheme.len() + "://".len() + authority.as_str().len()))
}

/// Whether two ETags name the same version: equal once a weak prefix
/// (`W/`) and the quotes are set aside (some servers send them unquoted).
fn same_etag(a: &str, b: &str) -> bool {
    let bare = |e: &str| {
        let e = e.trim();
        let e = e.strip_prefix("W/").unwrap_or(e);
        e.trim_matches('"').to_string()
    };
    bare(a) == bare(b)
}

/// Delay before attempt `attempt + 1`: full jitter over
/// `min(BACKOFF_MAX, base * 2^(attempt - 1))`, the base
/// [`THROTTLE_BACKOFF_BASE`] after throttling, else [`BACKOFF_BASE`].
pub(super) fn backoff(attempt: u32, throttled: bool) -> Duration {
    let base = if throttled {
        THROTTLE_BACKOFF_BASE
    } else {
        BACKOFF_BASE
    };
    let cap = base
        .saturating_mul(1 << (attempt - 1).min(16))
        .min(BACKOFF_MAX);
    cap.mul_f64(fastrand::f64())
}

/// Why a body could not be read to its end.
pub(super) enum BodyError {
    /// No byte for this long.
    Stalled(Duration),
    /// The connection or the body failed; the error chain.
    Failed(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Stalled(d) => write!(f, "no byte of the body for {d:?}"),
            BodyError::Failed(e) => f.write_str(e),
        }
    }
}

/// Appends the body's bytes to `buf`, the first `skip` dropped, until it
/// holds `target` bytes or the body ends. Errors: the body's, or a stall of
/// `stall` with no bytes.
///
/// Each chunk the HTTP client hands over is copied and dropped at once, so a
/// part costs its own size in memory while it downloads. Collecting the
/// chunks first and joining them afterwards held every chunk plus the joined
/// copy, and fragmented the heap (200 handles read at once: RSS ~500 MiB
/// above the read-ahead budget, docs/OPERATIONS.md).
pub(super) async fn read_into(
    buf: &mut Vec<u8>,
    mut body: ByteStream,
    mut skip: u64,
    target: usize,
    stall: Duration,
) -> Result<(), BodyError> {
    while buf.len() < target {
        let chunk = match tokio::time::timeout(stall, body.try_next()).await {
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(BodyError::Failed(crate::store::s3::error_chain(&e))),
            Err(_) => return Err(BodyError::Stalled(stall)),
        };
        append(buf, &chunk, &mut skip, target);
    }
    Ok(())
}

/// The next chunk of `answer`'s body, or `None` when `hedge` is on and the
/// body has paused for its delay while a reader waits (`urgency`; `None`
/// counts as waited for), or when `stall_at` comes. A reader that starts to
/// wait during the pause makes the delay count from the pause's start.
async fn next_chunk(
    answer: &mut Answer,
    hedge: Option<&Hedge>,
    urgency: Option<&Urgency>,
    stall_at: Instant,
) -> Option<Result<Option<Bytes>, aws_smithy_types::byte_stream::error::Error>> {
    let paused = Instant::now();
    loop {
        let waiting = urgency.filter(|u| !u.is_waited());
        let hedge_at = match hedge {
            Some(h) if waiting.is_none() => (paused + h.delay()).min(stall_at),
            _ => stall_at,
        };
        let marked = async {
            match waiting {
                Some(u) => u.waited().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            n = answer.body.try_next() => return Some(n),
            () = tokio::time::sleep_until(hedge_at.into()) => return None,
            () = marked => {}
        }
    }
}

/// Appends `chunk` to `buf`, its first `skip` bytes dropped (and counted
/// off `skip`), up to `target` bytes in `buf`.
fn append(buf: &mut Vec<u8>, chunk: &[u8], skip: &mut u64, target: usize) {
    let n = (*skip).min(chunk.len() as u64) as usize;
    *skip -= n as u64;
    let c = &chunk[n..];
    let n = c.len().min(target - buf.len());
    buf.extend_from_slice(&c[..n]);
}

/// The [`Failure`] of a non-2xx answer, from its status and the `<Code>`
/// and `<Message>` of its XML body (S3 "Error Responses").
async fn error_response(status: u16, body: ByteStream, stall: Duration) -> Failure {
    let mut text = Vec::new();
    // Best effort: an unreadable error body still has its status.
    let _ = read_into(&mut text, body, 0, MAX_ERROR_BODY, stall).await;
    let text = String::from_utf8_lossy(&text);
    let element = |name: &str| {
        let open = format!("<{name}>");
        let from = text.find(&open)? + open.len();
        let len = text[from..].find(&format!("</{name}>"))?;
        Some(text[from..from + len].trim().to_string())
    };
    let code = element("Code").unwrap_or_default();
    let msg = format!("{status} {code} {}", element("Message").unwrap_or_default());
    let msg = msg.trim().to_string();
    // The codes the SDK's retry classifiers call throttling or transient
    // (aws-runtime's AwsErrorCodeClassifier), and those of a stale clock or
    // token, which the next attempt fixes (corrected time, new credentials).
    let throttling = matches!(
        code.as_str(),
        "SlowDown"
            | "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "RequestThrottled"
            | "RequestLimitExceeded"
            | "BandwidthLimitExceeded"
            | "PriorRequestNotComplete"
    );
    let transient = matches!(
        code.as_str(),
        "RequestTimeout" | "RequestTimeoutException" | "InternalError"
    );
    let stale = matches!(
        code.as_str(),
        "RequestTimeTooSkewed" | "ExpiredToken" | "TokenRefreshRequired"
    );
    let (error, retry) = match (status, code.as_str()) {
        (_, "NoSuchBucket") => (StoreError::NoSuchBucket, false),
        (404, _) | (_, "NoSuchKey") => (StoreError::NotFound, false),
        (412, _) => (StoreError::PreconditionFailed, false),
        (416, _) => (StoreError::InvalidRange, false),
        (_, _) if stale => (StoreError::AccessDenied(msg), true),
        (401 | 403, _) => (StoreError::AccessDenied(msg), false),
        (503 | 429, _) => (StoreError::Throttled(msg), true),
        (_, _) if throttling => (StoreError::Throttled(msg), true),
        (500 | 502 | 504, _) => (StoreError::Transient(msg), true),
        (_, _) if transient => (StoreError::Transient(msg), true),
        (500..=599, _) => (StoreError::Transient(msg), false),
        _ => (StoreError::Other(msg), false),
    };
    // The code in the label of a stale clock or token, for the caller.
    let status = if stale {
        format!("{status}_{code}")
    } else {
        status.to_string()
    };
    Failure {
        error,
        status,
        retry,
    }
}

/// The credentials of a provider, reused until shortly before they expire.
struct CredentialsCache {
    provider: SharedCredentialsProvider,
    /// The credentials and when to stop using them (wall-clock time: an
    /// `Instant` stops while the host is suspended).
    current: RwLock<Option<(Credentials, SystemTime)>>,
    /// Longest wait for the provider.
    timeout: Duration,
    /// Held while the provider is asked, so concurrent GETs ask once.
    refresh: tokio::sync::Mutex<()>,
}

impl CredentialsCache {
    fn new(provider: SharedCredentialsProvider, timeout: Duration) -> Self {
        Self {
            provider,
            current: RwLock::new(None),
            timeout,
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    fn fresh(&self) -> Option<Credentials> {
        let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
        cur.as_ref()
            .filter(|(_, until)| SystemTime::now() < *until)
            .map(|(id, _)| id.clone())
    }

    /// Drops the credentials held (the server said they expired).
    fn forget(&self) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Errors as the SDK's: none loaded is [`StoreError::NoCredentials`], a
    /// timeout [`StoreError::Transient`] (retried), anything else
    /// [`StoreError::AccessDenied`].
    async fn get(&self) -> Result<Credentials, Failure> {
        if let Some(id) = self.fresh() {
            return Ok(id);
        }
        let _one = self.refresh.lock().await;
        if let Some(id) = self.fresh() {
            return Ok(id);
        }
        let loaded = tokio::time::timeout(self.timeout, self.provider.provide_credentials()).await;
        let creds = match loaded {
            Ok(Ok(c)) => c,
            Err(_) => {
                return Err(Failure::retry(
                    StoreError::Transient("loading AWS credentials timed out".into()),
                    "credentials",
                ));
            }
            Ok(Err(e)) => {
                let error = super::s3::credentials_failure(&e, super::s3::error_chain(&e));
                let retry = matches!(error, StoreError::Transient(_));
                return Err(Failure {
                    error,
                    status: "credentials".into(),
                    retry,
                });
            }
        };
        let until = match creds.expiry() {
            Some(t) => t.checked_sub(CREDENTIALS_MARGIN).unwrap_or(t),
            None => SystemTime::now() + CREDENTIALS_REUSE,
        };
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some((creds.clone(), until));
        Ok(creds)
    }
}

#[cfg(test)]
mod tests {
    use super::{BACKOFF_BASE, BACKOFF_MAX, KEY, THROTTLE_BACKOFF_BASE, backoff, host_and_origin};

    #[test]
    fn keys_are_encoded_as_s3_signs_them() {
        let enc = |k: &str| percent_encoding::utf8_percent_encode(k, KEY).to_string();
        assert_eq!(enc("a/b-c_d.e~f"), "a/b-c_d.e~f");
        assert_eq!(enc("a b+c"), "a%20b%2Bc");
        assert_eq!(enc("x/../y//z"), "x/../y//z");
        assert_eq!(enc("\u{e9}%?#\u{1}"), "%C3%A9%25%3F%23%01");
    }

    #[test]
    fn hosts_and_paths_are_split_as_sent() {
        for (base, host, path) in [
            ("http://127.0.0.1:9000/bucket", "127.0.0.1:9000", "/bucket"),
            (
                "https://s3.eu-west-3.amazonaws.com",
                "s3.eu-west-3.amazonaws.com",
                "",
            ),
            ("http://h", "h", ""),
            ("https://s/b", "s", "/b"),
            ("http://minio:80/b", "minio", "/b"),
            ("https://m:443/b", "m", "/b"),
            ("http://[::1]:9000/b", "[::1]:9000", "/b"),
            ("https://u:p@h:09000/pre/b", "h:9000", "/pre/b"),
        ] {
            let (h, origin) = host_and_origin(base).unwrap();
            assert_eq!((h.as_str(), &base[origin..]), (host, path), "{base}");
        }
    }

    #[test]
    fn etags_compare_without_quotes_or_weak_prefix() {
        assert!(super::same_etag("\"abc\"", "\"abc\""));
        assert!(super::same_etag("abc", "\"abc\""));
        assert!(super::same_etag("W/\"abc\"", "\"abc\""));
        assert!(!super::same_etag("\"abc\"", "\"abd\""));
        assert!(!super::same_etag("\"abc-2\"", "\"abc\""));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        for attempt in 1..40 {
            for (throttled, base) in [(false, BACKOFF_BASE), (true, THROTTLE_BACKOFF_BASE)] {
                let d = backoff(attempt, throttled);
                assert!(d <= BACKOFF_MAX, "attempt {attempt}: {d:?}");
                assert!(d <= base * (1 << (attempt - 1).min(16)));
            }
        }
    }
}
