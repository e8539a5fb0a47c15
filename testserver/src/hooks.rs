//! Test hooks: per-operation request counters, injected failures and delays.
//!
//! They run inside s3s's access check, which s3s calls for every request once the
//! operation is known (after routing and the signature check, before the request
//! body of a PUT is read and before the operation itself runs).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use s3s::access::{S3Access, S3AccessContext};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};

#[derive(Debug, Clone)]
struct Delay {
    op: String,
    key_prefix: String,
    delay: Duration,
}

/// The `op` of a [`Hooks::set_delay`] rule that delays GetObject bodies:
/// the headers go out at once, the body's first byte after the delay, as a
/// server that answers from metadata and then reads the data does.
pub const BODY_DELAY_OP: &str = "GetObjectBody";

/// Shared hook state; every method is thread-safe and never blocks for long.
#[derive(Debug, Default)]
pub struct Hooks {
    /// How ListObjects(V2) treats `encoding-type=url`: 0 honours it (the
    /// default), 1 ignores it (raw keys, no EncodingType in the answer), 2
    /// rejects it with 400 InvalidArgument, as some S3-compatible servers do.
    pub encoding_mode: std::sync::atomic::AtomicU8,
    counts: Mutex<HashMap<String, u64>>,
    failures: Mutex<HashMap<String, (u16, u32)>>,
    /// Per operation: how many more requests are carried out and then
    /// answered 500, as if the answer were lost.
    lost: Mutex<HashMap<String, u32>>,
    /// The region requests must be signed for, as a strict server checks;
    /// `None`: any.
    region: Mutex<Option<String>>,
    delays: Mutex<Vec<Delay>>,
    cuts: Mutex<Vec<Cut>>,
    /// GetObject body bytes sent since the last reset (of a broken body, the
    /// bytes before the break).
    body_bytes: std::sync::atomic::AtomicU64,
    /// (key, Range header) of every GetObject since the last reset.
    get_ranges: Mutex<Vec<(String, Option<String>)>>,
    per_key: Mutex<Option<PerKey>>,
    pacer: Mutex<Option<Pacer>>,
}

/// `set_body_rate`: one link shared by every GetObject body.
#[derive(Debug)]
struct Pacer {
    bytes_per_sec: f64,
    /// When the link is free again: the end of the last chunk reserved.
    free_at: std::time::Instant,
}

/// `fail_first_per_key` / `hold_first_per_key`: what the first requests
/// of each key get, how many of them, and how many each key has had.
#[derive(Debug)]
struct PerKey {
    fault: KeyFault,
    times: u32,
    seen: HashMap<String, u32>,
}

/// What one of the first requests of a key gets.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyFault {
    /// An error with this HTTP status.
    Status(u16),
    /// Its answer, this much later.
    Hold(Duration),
}

/// A GetObject body fault: `times` bodies of keys starting with `key_prefix`
/// end (or stall) after `after` bytes.
#[derive(Debug, Clone)]
struct Cut {
    key_prefix: String,
    after: usize,
    stall: bool,
    times: u32,
}

/// What happens to a GetObject body after its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    /// The connection fails: the client gets fewer bytes than announced.
    Cut(usize),
    /// No more bytes, and the connection stays open.
    Stall(usize),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hooks {
    /// Number of requests of `op` served since the last reset.
    pub fn count(&self, op: &str) -> u64 {
        lock(&self.counts).get(op).copied().unwrap_or(0)
    }

    /// Every counter: (operation, requests), sorted by operation.
    pub fn counts(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = lock(&self.counts)
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        v.sort();
        v
    }

    /// Sets every counter back to zero.
    pub fn reset_counts(&self) {
        lock(&self.counts).clear();
        self.body_bytes
            .store(0, std::sync::atomic::Ordering::Relaxed);
        lock(&self.get_ranges).clear();
    }

    /// Records a GetObject of `key` with this Range header.
    pub fn add_get_range(&self, key: &str, range: Option<String>) {
        lock(&self.get_ranges).push((key.to_owned(), range));
    }

    /// (key, Range header) of every GetObject since the last reset, in order.
    pub fn get_ranges(&self) -> Vec<(String, Option<String>)> {
        lock(&self.get_ranges).clone()
    }

    /// Counts `n` GetObject body bytes sent.
    pub fn add_body_bytes(&self, n: u64) {
        self.body_bytes
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// GetObject body bytes sent since the last reset.
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The next `times` requests of `op` fail with `status`.
    pub fn fail_next(&self, op: &str, status: u16, times: u32) {
        let mut f = lock(&self.failures);
        if times == 0 {
            f.remove(op);
        } else {
            f.insert(op.to_owned(), (status, times));
        }
    }

    /// The next `times` requests of `op` are carried out, then answered
    /// 500 InternalError: the client sees a failure although the server
    /// acted, as when an answer is lost. `times == 0` removes the rule.
    /// Honoured by CreateMultipartUpload.
    pub fn lose_answers(&self, op: &str, times: u32) {
        let mut l = lock(&self.lost);
        if times == 0 {
            l.remove(op);
        } else {
            l.insert(op.to_owned(), times);
        }
    }

    /// From now on requests signed for another region than `region` are
    /// refused (400 AuthorizationHeaderMalformed, naming the region
    /// expected in the message, as AWS and MinIO do); `None`: any region.
    pub fn require_region(&self, region: Option<&str>) {
        *lock(&self.region) = region.map(str::to_owned);
    }

    /// Whether this request of `op`, carried out, must be answered as a
    /// lost answer ([`Self::lose_answers`]).
    pub fn take_lost(&self, op: &str) -> bool {
        let mut l = lock(&self.lost);
        let Some(left) = l.get_mut(op) else {
            return false;
        };
        *left -= 1;
        if *left == 0 {
            l.remove(op);
        }
        true
    }

    /// From now on the first `times` requests of every key (of any
    /// operation; a listing's key is its prefix) fail with `status`.
    /// `times == 0` turns it off.
    pub fn fail_first_per_key(&self, status: u16, times: u32) {
        self.first_per_key(KeyFault::Status(status), times);
    }

    /// The first `times` requests of each key are answered `delay` late
    /// (without blocking other requests); 0 times: none from now on.
    pub fn hold_first_per_key(&self, delay: Duration, times: u32) {
        self.first_per_key(KeyFault::Hold(delay), times);
    }

    fn first_per_key(&self, fault: KeyFault, times: u32) {
        *lock(&self.per_key) = (times > 0).then(|| PerKey {
            fault,
            times,
            seen: HashMap::new(),
        });
    }

    fn take_key_fault(&self, key: &str) -> Option<KeyFault> {
        let mut p = lock(&self.per_key);
        let p = p.as_mut()?;
        let n = p.seen.entry(key.to_owned()).or_insert(0);
        *n += 1;
        (*n <= p.times).then_some(p.fault)
    }

    /// Requests of `op` whose key starts with `key_prefix` sleep `delay` first.
    /// A zero delay removes the rule for that `(op, key_prefix)`.
    pub fn set_delay(&self, op: &str, key_prefix: &str, delay: Duration) {
        let mut d = lock(&self.delays);
        d.retain(|x| !(x.op == op && x.key_prefix == key_prefix));
        if !delay.is_zero() {
            d.push(Delay {
                op: op.to_owned(),
                key_prefix: key_prefix.to_owned(),
                delay,
            });
        }
    }

    /// The next `times` GetObject bodies of keys starting with `key_prefix`
    /// break after their first `after` bytes: cut (`stall` false) or stalled.
    /// `times == 0` removes the rule for `key_prefix`.
    pub fn break_bodies(&self, key_prefix: &str, after: usize, stall: bool, times: u32) {
        let mut c = lock(&self.cuts);
        c.retain(|x| x.key_prefix != key_prefix);
        if times > 0 {
            c.push(Cut {
                key_prefix: key_prefix.to_owned(),
                after,
                stall,
                times,
            });
        }
    }

    /// The fault for this GetObject body of `key`, if a rule takes it.
    pub fn take_body_fault(&self, key: &str) -> Option<BodyFault> {
        let mut c = lock(&self.cuts);
        let i = c.iter().position(|x| key.starts_with(&x.key_prefix))?;
        let cut = c[i].clone();
        c[i].times -= 1;
        if c[i].times == 0 {
            c.remove(i);
        }
        Some(if cut.stall {
            BodyFault::Stall(cut.after)
        } else {
            BodyFault::Cut(cut.after)
        })
    }

    /// From now on every GetObject body is sent at most `bytes_per_sec` in
    /// all (bodies share the rate, as on one link); 0 turns it off.
    pub fn set_body_rate(&self, bytes_per_sec: u64) {
        *lock(&self.pacer) = (bytes_per_sec > 0).then(|| Pacer {
            bytes_per_sec: bytes_per_sec as f64,
            free_at: std::time::Instant::now(),
        });
    }

    /// Reserves the link for `n` bytes: the instant they have been sent, or
    /// `None` when no rate is set.
    pub fn reserve_body(&self, n: usize) -> Option<std::time::Instant> {
        let mut p = lock(&self.pacer);
        let p = p.as_mut()?;
        let start = p.free_at.max(std::time::Instant::now());
        p.free_at = start + Duration::from_secs_f64(n as f64 / p.bytes_per_sec);
        Some(p.free_at)
    }

    /// Whether `set_body_rate` is in force.
    pub fn paced(&self) -> bool {
        lock(&self.pacer).is_some()
    }

    fn record(&self, op: &str) {
        *lock(&self.counts).entry(op.to_owned()).or_insert(0) += 1;
    }

    fn take_failure(&self, op: &str) -> Option<u16> {
        let mut f = lock(&self.failures);
        let (status, left) = f.get_mut(op)?;
        let status = *status;
        *left -= 1;
        if *left == 0 {
            f.remove(op);
        }
        Some(status)
    }

    /// The pause before the first byte of a GetObject body of `key`, after
    /// its headers ([`BODY_DELAY_OP`] rules of [`Self::set_delay`]).
    pub fn body_delay(&self, key: &str) -> Option<Duration> {
        self.delay_for(BODY_DELAY_OP, key)
    }

    fn delay_for(&self, op: &str, key: &str) -> Option<Duration> {
        lock(&self.delays)
            .iter()
            .filter(|d| d.op == op && key.starts_with(&d.key_prefix))
            .map(|d| d.delay)
            .max()
    }
}

/// The S3 error a `fail_next(op, status, _)` injects.
pub fn injected_error(status: u16) -> S3Error {
    let code = match status {
        400 => S3ErrorCode::InvalidRequest,
        403 => S3ErrorCode::AccessDenied,
        404 => S3ErrorCode::NoSuchKey,
        409 => S3ErrorCode::OperationAborted,
        412 => S3ErrorCode::PreconditionFailed,
        416 => S3ErrorCode::InvalidRange,
        500 => S3ErrorCode::InternalError,
        501 => S3ErrorCode::NotImplemented,
        503 => S3ErrorCode::SlowDown,
        _ => S3ErrorCode::Custom("InjectedError".into()),
    };
    let mut err = S3Error::with_message(code, format!("injected failure (HTTP {status})"));
    if let Ok(sc) = http::StatusCode::from_u16(status) {
        err.set_status_code(sc);
    }
    err
}

/// The key a request is about, for delay matching: the object key, or for a
/// bucket-level request the `prefix` query parameter (so a ListObjectsV2 of one
/// "directory" can be slowed), else "".
fn request_key(cx: &S3AccessContext<'_>) -> String {
    match cx.s3_path() {
        S3Path::Object { key, .. } => key.to_string(),
        _ => cx
            .uri()
            .query()
            .and_then(|q| {
                q.split('&').find_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (k == "prefix").then(|| crate::percent::decode_query(v))
                })
            })
            .unwrap_or_default(),
    }
}

/// The region of the credential scope of a SigV4 `Authorization` header
/// (`Credential=KEY/DATE/REGION/s3/aws4_request`).
fn signed_region(headers: &http::HeaderMap) -> Option<String> {
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let cred = auth.split("Credential=").nth(1)?.split(',').next()?;
    cred.split('/').nth(2).map(str::to_owned)
}

/// s3s access hook: counts, delays, injects failures, then requires a signature.
pub struct HookAccess {
    pub(crate) hooks: std::sync::Arc<Hooks>,
}

#[async_trait::async_trait]
impl S3Access for HookAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name().to_owned();
        self.hooks.record(&op);
        if let Some(d) = self.hooks.delay_for(&op, &request_key(cx)) {
            tokio::time::sleep(d).await;
        }
        if let Some(status) = self.hooks.take_failure(&op) {
            return Err(injected_error(status));
        }
        match self.hooks.take_key_fault(&request_key(cx)) {
            Some(KeyFault::Status(status)) => return Err(injected_error(status)),
            Some(KeyFault::Hold(d)) => tokio::time::sleep(d).await,
            None => {}
        }
        let required = lock(&self.hooks.region).clone();
        if let Some(want) = required {
            let signed = signed_region(cx.headers());
            if signed.as_deref() != Some(want.as_str()) {
                let mut err = S3Error::with_message(
                    S3ErrorCode::AuthorizationHeaderMalformed,
                    format!(
                        "The authorization header is malformed; the region '{}' is wrong; \
                         expecting '{want}'",
                        signed.unwrap_or_default()
                    ),
                );
                err.set_status_code(http::StatusCode::BAD_REQUEST);
                return Err(err);
            }
        }
        match cx.credentials() {
            Some(_) => Ok(()),
            None => Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "Signature is required",
            )),
        }
    }
}
