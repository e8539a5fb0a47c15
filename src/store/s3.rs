//! [`ObjectStore`] over `aws-sdk-s3`: with `store/get.rs` the only modules
//! that import the SDK. LIST and HEAD are SDK calls; GETs go through
//! [`DirectGet`] (the SDK's connector, signer and endpoint rules without its
//! orchestrator) unless the endpoint needs what only the SDK does.
//!
//! Retries: the SDK's standard retry strategy (exponential backoff with jitter)
//! retries throttling (503 SlowDown), 5xx and transport faults up to
//! [`S3Config::max_attempts`] times, and `DirectGet` follows the same rule;
//! what is left is returned as a typed [`StoreError`]. Every call is counted in
//! `lakemount_s3_requests_total{op,status}`.

use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::config::Region;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::EncodingType;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use bytes::Bytes;
use serde::Deserialize;

use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::HttpConnectorSettings;

use super::get::{self, DirectGet};
use super::pool::BufferPool;
use super::{ListPage, ObjectMeta, ObjectStore, StoreError};
use crate::telemetry::metrics as m;

/// Region used when neither the config, the environment nor a profile names one.
/// `us-east-1` is what S3-compatible servers (MinIO, Garage, Ceph) accept by default.
pub const FALLBACK_REGION: &str = "us-east-1";

/// S3 connection settings (`[s3]` in the config file).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct S3Config {
    /// Custom endpoint, e.g. `http://minio.internal:9000`. `None`: AWS S3.
    pub endpoint_url: Option<String>,
    /// Region; `None`: the AWS chain (env, profile), else [`FALLBACK_REGION`].
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`). `None`: on for a custom
    /// endpoint (MinIO and most on-prem stores need it), off for AWS.
    pub force_path_style: Option<bool>,
    /// Shared-config profile name (`~/.aws/config`).
    pub profile: Option<String>,
    /// Send unsigned requests (public buckets); no credentials are looked up.
    pub no_sign_request: bool,
    /// PEM file of CA certificates trusted for HTTPS instead of the system roots
    /// (an on-prem endpoint with an internal CA). `None`: `AWS_CA_BUNDLE` if set.
    pub ca_bundle: Option<PathBuf>,
    /// Attempts per request including the first (SDK standard retry strategy).
    pub max_attempts: u32,
    /// TCP/TLS connect timeout, seconds.
    pub connect_timeout_secs: f64,
    /// Timeout of one attempt of one request, seconds (a 64 MiB part at 10 MB/s
    /// takes ~7 s; 30 s leaves room for a slow, shared link). For a GET: until
    /// its response headers.
    pub attempt_timeout_secs: f64,
    /// A GET body that sends no byte for this long is given up and resumed
    /// from its first missing byte with a new request, seconds. 1 s: a TCP
    /// connection that delivers pauses longer only after several lost
    /// retransmissions in a row (Linux's minimum RTO is 200 ms, doubling),
    /// and a resumed request costs one GET, while a reader waits out every
    /// second of it.
    pub stall_timeout_secs: f64,
    /// A GET without response headers after nearly every GET has them (the
    /// 95th percentile of recent ones, 10 ms to 2 s) is sent a second time,
    /// and the first answer taken; at most one GET in ten is
    /// (`store/hedge.rs`). ListObjectsV2 requests the same way.
    pub hedged_gets: bool,
    /// Sign the SHA-256 of upload bodies (PutObject, UploadPart). `false`
    /// (default): `UNSIGNED-PAYLOAD` (SigV4, "Signature calculations for the
    /// Authorization header"); the SDK's CRC32 checksum of the body still
    /// goes with each request, so the server checks the bytes, and a pass of
    /// SHA-256 over every byte uploaded is saved. `true` for a server that
    /// refuses unsigned payloads.
    pub sign_payload: bool,
    /// Longest time a request and its retries may take before its error is
    /// returned (EIO), seconds: no attempt starts, and none waits for
    /// headers, past it. A GET body that is arriving is not cut by it.
    pub request_deadline_secs: f64,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            endpoint_url: None,
            region: None,
            force_path_style: None,
            profile: None,
            no_sign_request: false,
            ca_bundle: None,
            max_attempts: 5,
            connect_timeout_secs: 5.0,
            attempt_timeout_secs: 30.0,
            stall_timeout_secs: 1.0,
            hedged_gets: true,
            sign_payload: false,
            request_deadline_secs: 60.0,
        }
    }
}

/// An S3 bucket reached through `aws-sdk-s3`. Cheap to clone.
#[derive(Clone, Debug)]
pub struct S3Store {
    pub(super) client: aws_sdk_s3::Client,
    pub(super) bucket: String,
    /// Listings ask for `encoding-type=url` until the server refuses it once
    /// (some S3-compatible servers answer 400 or 501); then they list without.
    url_listing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Buffers of GET bodies, reused ([`super::pool`]).
    pool: BufferPool,
    /// GETs without the SDK's orchestrator ([`super::get`]); `None` for
    /// endpoints whose rules need what only the SDK does.
    direct: Option<std::sync::Arc<DirectGet>>,
    /// `s3.max_attempts`, for the listing check's own retries.
    pub(super) max_attempts: u32,
    /// `s3.attempt_timeout_secs`, which uploads extend by their size.
    pub(super) attempt_timeout: Duration,
    /// `s3.sign_payload`.
    pub(super) sign_payload: bool,
    /// `s3.stall_timeout_secs`, for GET bodies read through the SDK.
    stall: Duration,
    /// Hedged ListObjectsV2 requests; `None`: `s3.hedged_gets` off.
    list_hedge: Option<std::sync::Arc<super::hedge::Hedge>>,
}

impl S3Store {
    /// Builds the client from `config` and the standard AWS credential chain
    /// (environment, shared profile, web identity, instance metadata). Does no
    /// network I/O. Errors: an unreadable or non-PEM CA bundle.
    pub async fn new(bucket: &str, config: &S3Config) -> anyhow::Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(profile) = &config.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        } else if config.endpoint_url.is_some() {
            // A custom endpoint is not on EC2's metadata service's map: take the
            // region from the environment or the profile, else the fallback,
            // and never probe IMDS for it.
            use aws_config::meta::region::RegionProviderChain;
            let mut profile = aws_config::profile::ProfileFileRegionProvider::builder();
            if let Some(name) = &config.profile {
                profile = profile.profile_name(name);
            }
            loader = loader.region(
                RegionProviderChain::first_try(
                    aws_config::environment::EnvironmentVariableRegionProvider::new(),
                )
                .or_else(profile.build())
                .or_else(Region::new(FALLBACK_REGION)),
            );
        }
        if config.no_sign_request {
            loader = loader.no_credentials();
        }
        if let Some(url) = &config.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        let (ca_bundle, ca_source) = match &config.ca_bundle {
            Some(p) => (Some(p.clone()), "s3.ca_bundle"),
            None => (
                std::env::var_os("AWS_CA_BUNDLE").map(PathBuf::from),
                "AWS_CA_BUNDLE",
            ),
        };
        // An endpoint given as plain http needs no CA: a bundle that
        // cannot be loaded is then a warning, not a failed mount.
        let env_endpoints = !std::env::var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
            .is_ok_and(|v| v.eq_ignore_ascii_case("true"));
        let plain_http = config
            .endpoint_url
            .clone()
            .or_else(|| {
                env_endpoints
                    .then(|| std::env::var("AWS_ENDPOINT_URL_S3").ok())
                    .flatten()
            })
            .or_else(|| {
                env_endpoints
                    .then(|| std::env::var("AWS_ENDPOINT_URL").ok())
                    .flatten()
            })
            .is_some_and(|u| u.trim().to_ascii_lowercase().starts_with("http://"));
        let ctx = match ca_bundle.filter(|p| !p.as_os_str().is_empty()) {
            Some(path) => match tls_context_with_ca(&path, ca_source) {
                Ok(ctx) => Some(ctx),
                Err(e) if plain_http => {
                    tracing::warn!("{e:#}; ignored: the endpoint is plain http");
                    None
                }
                Err(e) => return Err(e),
            },
            None => None,
        };
        let tls = match ctx {
            Some(ctx) => {
                loader = loader.http_client(
                    aws_smithy_http_client::Builder::new()
                        .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
                        .tls_context(ctx.clone())
                        .build_https(),
                );
                ctx
            }
            None => tls::TlsContext::default(),
        };
        loader = loader
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(config.max_attempts.max(1))
                    .with_initial_backoff(get::BACKOFF_BASE),
            )
            // A LIST or HEAD whose body stops is given up as a GET's is.
            // Not uploads: a server may stop reading a body for longer while
            // it writes; their attempt timeout bounds them instead.
            .stalled_stream_protection(
                aws_sdk_s3::config::StalledStreamProtectionConfig::enabled()
                    .upload_enabled(false)
                    .grace_period(Duration::from_secs_f64(config.stall_timeout_secs))
                    .build(),
            )
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs_f64(config.connect_timeout_secs))
                    .operation_attempt_timeout(Duration::from_secs_f64(config.attempt_timeout_secs))
                    .operation_timeout(Duration::from_secs_f64(config.request_deadline_secs))
                    .build(),
            );
        let sdk = loader.load().await;
        let mut builder = aws_sdk_s3::config::Builder::from(&sdk);
        if sdk.region().is_none() {
            builder = builder.region(Region::new(FALLBACK_REGION));
        }
        let path_style = config
            .force_path_style
            .unwrap_or(config.endpoint_url.is_some());
        builder = builder.force_path_style(path_style);
        // Validate response checksums only where the API requires it: a ranged
        // GET has no whole-object checksum to check anyway, and hashing every
        // byte costs a core at link speed. TLS protects the transfer; the disk
        // cache keeps its own CRC32C per piece.
        builder = builder
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            )
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            );
        builder = builder.interceptor(SdkRetries);
        let s3 = builder.build();
        let direct = DirectGet::new(get::Setup {
            bucket,
            region: s3.region().map_or(FALLBACK_REGION, |r| r.as_ref()),
            endpoint_url: s3_endpoint_url(&sdk).as_deref(),
            force_path_style: path_style,
            use_fips: sdk.use_fips().unwrap_or(false),
            use_dual_stack: sdk.use_dual_stack().unwrap_or(false),
            credentials: sdk.credentials_provider(),
            connector: aws_smithy_http_client::Connector::builder()
                .connector_settings(
                    HttpConnectorSettings::builder()
                        .connect_timeout(Duration::from_secs_f64(config.connect_timeout_secs))
                        .read_timeout(Duration::from_secs_f64(config.attempt_timeout_secs))
                        .build(),
                )
                .sleep_impl(aws_smithy_async::rt::sleep::TokioSleep::new())
                .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(tls)
                .build(),
            max_attempts: config.max_attempts,
            attempt_timeout: Duration::from_secs_f64(config.attempt_timeout_secs),
            stall_timeout: Duration::from_secs_f64(config.stall_timeout_secs),
            hedge: config.hedged_gets,
            deadline: Duration::from_secs_f64(config.request_deadline_secs),
        })
        .await;
        if direct.is_none() {
            tracing::info!(
                bucket,
                "GETs of this bucket go through the full S3 SDK client"
            );
        }
        Ok(Self {
            client: aws_sdk_s3::Client::from_conf(s3),
            bucket: bucket.to_string(),
            url_listing: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
            pool: BufferPool::none(),
            direct: direct.map(std::sync::Arc::new),
            max_attempts: config.max_attempts.max(1),
            attempt_timeout: Duration::from_secs_f64(config.attempt_timeout_secs),
            sign_payload: config.sign_payload,
            stall: Duration::from_secs_f64(config.stall_timeout_secs),
            list_hedge: config
                .hedged_gets
                .then(|| std::sync::Arc::new(super::hedge::Hedge::new(m::OP_LIST))),
        })
    }

    /// GET bodies go into buffers from `pool` (reused once dropped); without
    /// this call each is a new allocation.
    pub fn with_buffer_pool(mut self, pool: BufferPool) -> Self {
        self.pool = pool;
        self
    }

    /// The bucket name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The region requests are signed for.
    pub fn region(&self) -> &str {
        self.client
            .config()
            .region()
            .map_or(FALLBACK_REGION, |r| r.as_ref())
    }
}

/// The endpoint URL the SDK's S3 client uses, as its config does it: one set
/// in code (lakemount's `s3.endpoint_url`), else `AWS_ENDPOINT_URL_S3` or the
/// profile's `s3` service `endpoint_url`, else the global `AWS_ENDPOINT_URL`
/// or profile `endpoint_url`. `None`: AWS.
fn s3_endpoint_url(sdk: &aws_config::SdkConfig) -> Option<String> {
    if sdk.get_origin("endpoint_url").is_client_config() {
        return sdk.endpoint_url().map(str::to_string);
    }
    let key = aws_types::service_config::ServiceConfigKey::builder()
        .service_id("S3")
        .env("AWS_ENDPOINT_URL")
        .profile("endpoint_url")
        .build()
        .ok()?;
    sdk.service_config()
        .and_then(|c| c.load_config(key))
        .or_else(|| sdk.endpoint_url().map(str::to_string))
}

/// Counts the SDK's own retries (LIST, HEAD, uploads, copies, deletes) in
/// `lakemount_s3_retries_total{cause="sdk"}`, as [`get`] counts a GET's:
/// the SDK retries inside one call, which lakemount's request counts see as
/// one request.
#[derive(Debug)]
struct SdkRetries;

impl aws_smithy_runtime_api::client::interceptors::Intercept for SdkRetries {
    fn name(&self) -> &'static str {
        "lakemount-retry-counter"
    }

    fn read_before_attempt(
        &self,
        _ctx: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _rc: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use aws_smithy_runtime_api::client::orchestrator::Metadata;
        use aws_smithy_runtime_api::client::retries::RequestAttempts;
        let retry = cfg
            .load::<RequestAttempts>()
            .is_some_and(|a| a.attempts() > 1);
        if retry && let Some(op) = cfg.load::<Metadata>().and_then(|md| sdk_op(md.name())) {
            m::s3_retry(op, "sdk");
        }
        Ok(())
    }
}

/// lakemount's metric label of an SDK operation (`None`: not one it sends).
fn sdk_op(name: &str) -> Option<&'static str> {
    Some(match name {
        "ListObjectsV2" | "ListObjects" => m::OP_LIST,
        "HeadObject" | "HeadBucket" => m::OP_HEAD,
        "GetObject" => m::OP_GET,
        "PutObject" => m::OP_PUT,
        "CreateMultipartUpload" => m::OP_CREATE_MULTIPART,
        "UploadPart" => m::OP_UPLOAD_PART,
        "CompleteMultipartUpload" => m::OP_COMPLETE_MULTIPART,
        "AbortMultipartUpload" => m::OP_ABORT_MULTIPART,
        "ListMultipartUploads" => m::OP_LIST_MULTIPART,
        "CopyObject" => m::OP_COPY,
        "UploadPartCopy" => m::OP_UPLOAD_PART_COPY,
        "DeleteObject" => m::OP_DELETE,
        _ => return None,
    })
}

/// TLS settings that trust only the certificates in the PEM file at `path`
/// (the AWS CLI's `AWS_CA_BUNDLE` semantics). Plain-http endpoints still work.
/// Errors name `source`, where the path came from (`s3.ca_bundle` or
/// `AWS_CA_BUNDLE`): an unreadable file, or one without a PEM certificate.
fn tls_context_with_ca(path: &std::path::Path, source: &str) -> anyhow::Result<tls::TlsContext> {
    use aws_smithy_http_client::tls::{TlsContext, TrustStore};
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("{source}: cannot read {}: {e}", path.display()))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        anyhow::bail!(
            "{source}: {} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    let trust = TrustStore::empty()
        .with_native_roots(false)
        .with_pem_certificate(pem);
    TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| anyhow::anyhow!("{source}: {}: {e}", path.display()))
}

/// Maps an SDK error to a [`StoreError`] and the status label for metrics.
pub(super) fn map_sdk_error<E>(err: SdkError<E, HttpResponse>) -> (StoreError, String)
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = se.err().code().unwrap_or("").to_string();
            let msg = match se.err().message().filter(|m| !m.is_empty()) {
                Some(m) => format!("{status} {code} {m}"),
                None if !code.is_empty() => format!("{status} {code}"),
                None => no_s3_error(status, se.raw(), se.err()),
            };
            let wrong_region = (status == 301
                || matches!(
                    code.as_str(),
                    "AuthorizationHeaderMalformed" | "PermanentRedirect"
                ))
            .then(|| region_named(se.raw(), se.err().message().unwrap_or("")))
            .flatten();
            let mapped = match (status, code.as_str()) {
                _ if let Some(expected) = wrong_region => StoreError::WrongRegion {
                    expected,
                    message: msg.trim().to_string(),
                },
                (_, "NoSuchBucket") => StoreError::NoSuchBucket,
                (_, "NoSuchUpload") => StoreError::NoSuchUpload,
                (404, _) | (_, "NoSuchKey") => StoreError::NotFound,
                (412, _) => StoreError::PreconditionFailed,
                (416, _) => StoreError::InvalidRange,
                (401 | 403, _) => StoreError::AccessDenied(msg.trim().to_string()),
                (503, _) | (_, "SlowDown") => StoreError::Throttled(msg.trim().to_string()),
                (500..=599, _) => StoreError::Transient(msg.trim().to_string()),
                _ => StoreError::Other(msg.trim().to_string()),
            };
            (mapped, status.to_string())
        }
        SdkError::TimeoutError(_) => (
            StoreError::Transient(format!("timeout: {}", error_chain(&err))),
            "timeout".into(),
        ),
        SdkError::DispatchFailure(_) if let Some(c) = credentials_error(&err) => (
            credentials_failure(c, error_chain(&err)),
            "credentials".into(),
        ),
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            (StoreError::Transient(error_chain(&err)), "network".into())
        }
        _ => (
            StoreError::Other(format!("{}", DisplayErrorContext(&err))),
            "error".into(),
        ),
    }
}

/// The region an answer to a request signed for the wrong one names: its
/// `x-amz-bucket-region` header (AWS), the `<Region>` of its error body
/// (AWS, Garage, MinIO), or `expecting 'R'` in its message (AWS, MinIO).
fn region_named(raw: &HttpResponse, message: &str) -> Option<String> {
    let valid = |r: &str| {
        let r = r.trim();
        (!r.is_empty()
            && r.len() <= 64
            && r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        .then(|| r.to_string())
    };
    if let Some(r) = raw.headers().get("x-amz-bucket-region").and_then(valid) {
        return Some(r);
    }
    let body = raw.body().bytes().map(String::from_utf8_lossy);
    if let Some(r) = body.as_deref().and_then(|b| {
        let start = b.find("<Region>")? + "<Region>".len();
        valid(&b[start..start + b[start..].find("</Region>")?])
    }) {
        return Some(r);
    }
    let start = message.find("expecting '")? + "expecting '".len();
    valid(&message[start..start + message[start..].find('\'')?])
}

/// The text of an answer that carries no S3 error code or message (a body
/// the SDK could not read as the operation's answer or as an S3 error: not
/// an S3 endpoint, a proxy's page, a body cut short): the status and its
/// reason, what the SDK said, and how the body begins.
fn no_s3_error(status: u16, raw: &HttpResponse, err: &(dyn std::error::Error + 'static)) -> String {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let body = match raw.body().bytes() {
        Some([]) => "; the body is empty".to_string(),
        Some(b) => {
            let head = String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned();
            format!("; the body begins {:?}", head)
        }
        None => String::new(),
    };
    format!(
        "{status} {reason}, with no S3 error code in the answer ({}){body}",
        error_chain(err)
    )
}

/// The [`StoreError`] of a failure to load credentials (`chain`: its text):
/// none from any source is NoCredentials (the admin must give some), a
/// misconfigured source (a bad profile) AccessDenied, a timeout or a failed
/// provider (a credential_process that exited non-zero, an expired SSO
/// session, a refused or unreachable AssumeRole) Transient: retried, then
/// EIO.
pub(super) fn credentials_failure(
    e: &aws_credential_types::provider::error::CredentialsError,
    chain: String,
) -> StoreError {
    use aws_credential_types::provider::error::CredentialsError as C;
    match e {
        C::CredentialsNotLoaded(_) => StoreError::NoCredentials(chain),
        C::ProviderTimedOut(_) => {
            StoreError::Transient(format!("loading AWS credentials timed out: {chain}"))
        }
        // Credentials that are set up wrong do not load on a retry.
        C::InvalidConfiguration(_) => {
            StoreError::AccessDenied(format!("AWS credentials are misconfigured: {chain}"))
        }
        // A provider that failed this time (a credential_process that exited
        // non-zero, STS or instance metadata unreachable or throttling) may
        // work the next: retried, then EIO, not EACCES.
        _ => StoreError::Transient(format!("loading AWS credentials failed: {chain}")),
    }
}

/// The credentials error the request failed with, if it failed loading them.
fn credentials_error<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a aws_credential_types::provider::error::CredentialsError> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(c) = e.downcast_ref::<aws_credential_types::provider::error::CredentialsError>()
        {
            return Some(c);
        }
        cur = e.source();
    }
    None
}

/// The error and its causes on one line, innermost last, without repeats
/// (the SDK's wrappers often repeat their cause's text).
pub(super) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        // One line: some SDK errors list their causes on indented lines.
        let text = e
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = e.source();
    }
    parts.join(": ")
}

/// Why a ListObjectsV2 answer is not whole, if it is not: no IsTruncated
/// (AWS, MinIO, Garage, Ceph RGW and SeaweedFS always send it), a KeyCount
/// above its entries (a cut can only lose entries; older Ceph RGW counts
/// objects only, below the entries), or IsTruncated without the token to go
/// on with.
fn incomplete_listing(
    out: &aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Output,
) -> Option<String> {
    if out.is_truncated().is_none() {
        return Some("the answer has no IsTruncated".into());
    }
    let entries = out.contents().len() + out.common_prefixes().len();
    if let Some(n) = out.key_count()
        && n > 0
        && n as usize > entries
    {
        return Some(format!(
            "the answer says KeyCount {n} and holds {entries} entries"
        ));
    }
    if out.is_truncated() == Some(true) && out.next_continuation_token().is_none() {
        return Some("the answer says IsTruncated without NextContinuationToken".into());
    }
    None
}

/// Decodes a name of a ListObjectsV2 answer given with `encoding-type=url`:
/// `%XX` escapes, and `+` for a space (Amazon S3 writes a space as `+` and a
/// `+` as `%2B`; botocore decodes the same way, with `unquote_plus`). `None`
/// when the bytes are not UTF-8 (S3 keys are UTF-8).
fn url_decode(raw: &str) -> Option<String> {
    let spaced = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

impl ObjectStore for S3Store {
    async fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation: Option<String>,
        start_after: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, StoreError> {
        // S3 ignores StartAfter with a continuation token; send only one.
        let start_after = match continuation {
            Some(_) => None,
            None => start_after.map(str::to_string),
        };
        use std::sync::atomic::Ordering::Relaxed;
        let request = |url: bool| {
            self.client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_delimiter(delimiter.map(str::to_string))
                .set_continuation_token(continuation.clone())
                .set_start_after(start_after.clone())
                .max_keys(max_keys)
                // XML 1.0 cannot carry most control characters (U+0001..U+001F):
                // without this, one such key fails the whole page.
                .set_encoding_type(url.then_some(EncodingType::Url))
                .send()
        };
        let mut attempt = 0;
        let out = loop {
            attempt += 1;
            let start = Instant::now();
            let url = self.url_listing.load(Relaxed);
            let mut res = match &self.list_hedge {
                Some(h) => h.run(None, || request(url)).await,
                None => request(url).await,
            };
            if url
                && let Err(SdkError::ServiceError(se)) = &res
                && matches!(se.raw().status().as_u16(), 400 | 501)
            {
                // A server that does not know encoding-type: list without it, and
                // keep doing so if that works.
                let plain = request(false).await;
                if plain.is_ok() {
                    self.url_listing.store(false, Relaxed);
                    tracing::warn!(
                        "the S3 server refused encoding-type=url in ListObjectsV2 ({}); listing \
                     without it: keys with control characters will fail their listing page",
                        se.raw().status().as_u16()
                    );
                }
                res = plain;
            }
            let out = match res {
                Ok(out) => out,
                Err(e) => {
                    let (err, status) = map_sdk_error(e);
                    m::s3_request(m::OP_LIST, &status, start.elapsed());
                    return Err(match err {
                        StoreError::NotFound => StoreError::ListNotFound(format!(
                            "ListObjectsV2 of {prefix:?}, HTTP {status}"
                        )),
                        e => e,
                    });
                }
            };
            // The SDK's XML reader takes a body cut short but well-formed so
            // far (a chunked answer that ends early) as a shorter listing: its
            // entries would be missing, as ENOENT. KeyCount (sent by S3 and
            // Garage before the entries) and IsTruncated tell.
            let Some(why) = incomplete_listing(&out) else {
                m::s3_request(m::OP_LIST, "200", start.elapsed());
                break out;
            };
            if attempt >= self.max_attempts {
                m::s3_request(m::OP_LIST, "incomplete", start.elapsed());
                return Err(StoreError::Transient(format!(
                    "ListObjectsV2 of {prefix:?}: {why}"
                )));
            }
            m::s3_retry(m::OP_LIST, "incomplete");
            tokio::time::sleep(get::backoff(attempt, false)).await;
        };
        // Decode only when the server says it encoded: one that ignores the
        // request sends raw keys, where a `%` or `+` is part of the name.
        let encoded = out.encoding_type() == Some(&EncodingType::Url);
        let name = |raw: &str| -> Option<String> {
            if !encoded {
                return Some(raw.to_string());
            }
            let decoded = url_decode(raw);
            if decoded.is_none() {
                tracing::warn!(
                    key = raw,
                    "ListObjectsV2 returned a URL-encoded key that is not UTF-8; skipped"
                );
            }
            decoded
        };
        let objects = out
            .contents()
            .iter()
            .filter_map(|o| {
                Some(ObjectMeta {
                    key: name(o.key()?)?,
                    size: o.size().unwrap_or(0).max(0) as u64,
                    etag: o.e_tag().unwrap_or("").to_string(),
                    last_modified: to_system_time(o.last_modified()),
                })
            })
            .collect();
        let common_prefixes = out
            .common_prefixes()
            .iter()
            .filter_map(|p| name(p.prefix()?))
            .collect();
        let truncated = out.is_truncated().unwrap_or(false);
        let next_token = out.next_continuation_token().map(str::to_string);
        Ok(ListPage {
            objects,
            common_prefixes,
            next_token: if truncated { next_token } else { None },
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let start = Instant::now();
        let res = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await;
        match res {
            Ok(out) => {
                m::s3_request(m::OP_HEAD, "200", start.elapsed());
                Ok(ObjectMeta {
                    key: key.to_string(),
                    size: out.content_length().unwrap_or(0).max(0) as u64,
                    etag: out.e_tag().unwrap_or("").to_string(),
                    last_modified: to_system_time(out.last_modified()),
                })
            }
            Err(e) => {
                let (err, status) = map_sdk_error(e);
                m::s3_request(m::OP_HEAD, &status, start.elapsed());
                Err(err)
            }
        }
    }

    async fn get_range_ahead(
        &self,
        key: &str,
        range: Range<u64>,
        etag: &str,
        urgency: super::Urgency,
    ) -> Result<Bytes, StoreError> {
        match &self.direct {
            Some(direct) => {
                direct
                    .get_range(&self.pool, key, range, etag, Some(&urgency))
                    .await
            }
            // The SDK's path does not hedge.
            None => Box::pin(self.sdk_get_range(key, range, etag)).await,
        }
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, StoreError> {
        debug_assert!(range.start < range.end);
        match &self.direct {
            Some(direct) => direct.get_range(&self.pool, key, range, etag, None).await,
            None => Box::pin(self.sdk_get_range(key, range, etag)).await,
        }
    }
}

impl S3Store {
    /// [`ObjectStore::get_range`] through the SDK's orchestrator, for
    /// endpoints the direct GET path (`store/get.rs`) does not serve.
    /// Boxed by its callers: its future is several KiB, and every GET
    /// future would otherwise be as large (each prefetch or read-ahead GET
    /// is moved into a task of its own).
    async fn sdk_get_range(
        &self,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, StoreError> {
        let start = Instant::now();
        let res = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .set_if_match((!etag.is_empty()).then(|| etag.to_string()))
            .send()
            .await;
        let out = match res {
            Ok(out) => out,
            Err(e) => {
                let (err, status) = map_sdk_error(e);
                m::s3_request(m::OP_GET, &status, start.elapsed());
                return Err(err);
            }
        };
        let want = (range.end - range.start) as usize;
        let length = out.content_length();
        // 206 names the range it sends in Content-Range; a 206 without the
        // header is taken as the range when its length is the range's. A
        // server that ignored Range sends the whole object (200): only the
        // bytes of the range are kept from it.
        let bad_range = |what: String| {
            m::s3_request(m::OP_GET, "bad_range", start.elapsed());
            Err(StoreError::Transient(format!(
                "GET {key} bytes {}-{}: the server sent {what}",
                range.start,
                range.end - 1
            )))
        };
        let ranged = match out.content_range() {
            Some(cr) => match content_range_start(cr) {
                Some(first) if first == range.start => true,
                _ => return bad_range(format!("Content-Range {cr:?}")),
            },
            None => length == Some(want as i64),
        };
        if let Some(l) = length.filter(|&l| ranged && l > want as i64) {
            return bad_range(format!("{l} bytes"));
        }
        let skip = if ranged { 0 } else { range.start };
        let mut buf = self.pool.take(want);
        if let Err(e) = get::read_into(&mut buf, out.body, skip, want, self.stall).await {
            m::s3_request(m::OP_GET, "network", start.elapsed());
            return Err(StoreError::Transient(format!("reading GET body: {e}")));
        }
        let body = self.pool.freeze(buf);
        m::s3_request(
            m::OP_GET,
            if ranged { "206" } else { "200" },
            start.elapsed(),
        );
        m::s3_bytes_received(body.len() as u64);
        if body.len() == want {
            Ok(body)
        } else {
            Err(StoreError::Transient(format!(
                "GET {key} bytes {}-{}: got {} bytes, expected {want}",
                range.start,
                range.end - 1,
                body.len()
            )))
        }
    }
}

/// First byte of a `Content-Range: bytes FIRST-LAST/SIZE` value (RFC 9110,
/// section 14.4), `None` when it is not of that form.
pub(super) fn content_range_start(value: &str) -> Option<u64> {
    let spec = value.trim().strip_prefix("bytes")?.trim_start();
    spec.split_once('-')?.0.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{HttpResponse, content_range_start, region_named, url_decode};
    use aws_smithy_types::body::SdkBody;

    fn answer(header: Option<&str>, body: &str) -> HttpResponse {
        let mut r = HttpResponse::new(400.try_into().unwrap(), SdkBody::from(body.to_string()));
        if let Some(h) = header {
            r.headers_mut().insert("x-amz-bucket-region", h.to_string());
        }
        r
    }

    #[test]
    fn the_region_an_answer_names_is_found_where_servers_put_it() {
        // AWS: the header (a 301, or a 400 to a HEAD).
        assert_eq!(
            region_named(&answer(Some("eu-west-1"), ""), "").as_deref(),
            Some("eu-west-1")
        );
        // Garage: the error's <Region>, the message names none.
        let garage = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>\
            AuthorizationHeaderMalformed</Code><Message>Authorization header malformed, \
            unexpected scope: 20261206/us-east-1/s3/aws4_request</Message><Resource>/b\
            </Resource><Region>garage</Region></Error>";
        assert_eq!(
            region_named(&answer(None, garage), "unexpected scope").as_deref(),
            Some("garage")
        );
        // AWS and MinIO: "expecting 'R'" in the message.
        let msg = "The authorization header is malformed; the region 'us-east-1' is wrong; \
                   expecting 'ap-south-1'";
        assert_eq!(
            region_named(&answer(None, ""), msg).as_deref(),
            Some("ap-south-1")
        );
        // Nothing named, or nothing that can be a region.
        assert_eq!(region_named(&answer(None, "<Error/>"), "malformed"), None);
        assert_eq!(
            region_named(&answer(Some("a b<"), "<Region></Region>"), "expecting ''"),
            None
        );
    }

    #[test]
    fn content_range_first_byte() {
        assert_eq!(content_range_start("bytes 100-199/1000"), Some(100));
        assert_eq!(content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(content_range_start("bytes */1000"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }

    #[test]
    fn url_decoding_of_listed_names() {
        assert_eq!(url_decode("a+b").as_deref(), Some("a b"));
        assert_eq!(url_decode("a%2Bb").as_deref(), Some("a+b"));
        assert_eq!(url_decode("a%20b").as_deref(), Some("a b"));
        assert_eq!(url_decode("a%2520b").as_deref(), Some("a%20b"));
        assert_eq!(url_decode("ctl%01x/%0D").as_deref(), Some("ctl\u{1}x/\r"));
        assert_eq!(
            url_decode("%C3%A9t%C3%A9").as_deref(),
            Some("\u{e9}t\u{e9}")
        );
        assert_eq!(url_decode("d/%E6%97%A5").as_deref(), Some("d/\u{65e5}"));
        // Not UTF-8.
        assert_eq!(url_decode("%FF%FE"), None);
        // A stray `%` is kept as it is.
        assert_eq!(url_decode("100%").as_deref(), Some("100%"));
    }
}
