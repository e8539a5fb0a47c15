//! SigV4 of lakemount's GETs ([`super::get`]), header-signed as the AWS SDK
//! signs S3 requests: single percent-encoding of the path (S3 does not
//! normalise it), `X-Amz-Content-SHA256` of the empty body, `User-Agent` not
//! signed ("Signature Version 4 signing process", Amazon S3 API reference).
//!
//! GetObject is the request lakemount sends by the ten thousand, and
//! `aws-sigv4`'s general path (a header map built per request, string
//! formatting, four HMACs to derive the signing key) cost more than
//! the rest of building the request (docs/READAHEAD.md). This one writes the
//! canonical request for the fixed set of headers a GET has into one
//! buffer and derives the signing key once per day and credentials, with
//! `aws-sigv4`'s own key derivation and signature functions. The tests check
//! that its signatures are `aws-sigv4`'s for the same requests.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use sha2::{Digest, Sha256};

/// SHA-256 of the empty body, lower-case hex: a GET's
/// `X-Amz-Content-SHA256`.
pub(super) const EMPTY_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The headers SigV4 adds to one GET.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Signed {
    /// `X-Amz-Date`: `YYYYMMDDTHHMMSSZ`, UTC.
    pub amz_date: String,
    /// `Authorization`.
    pub authorization: String,
}

/// Signs GETs for one signing region and service name.
pub(super) struct GetSigner {
    region: String,
    service: String,
    /// The signing key of the last day and credentials signed with.
    key: Mutex<Option<DayKey>>,
}

struct DayKey {
    /// `YYYYMMDD`.
    day: String,
    access_key: String,
    secret: String,
    key: Vec<u8>,
}

impl GetSigner {
    pub(super) fn new(region: &str, service: &str) -> Self {
        Self {
            region: region.to_string(),
            service: service.to_string(),
            key: Mutex::new(None),
        }
    }

    /// The SigV4 headers of a GET at `now` of `path` (the URL's path as
    /// sent, already percent-encoded) on `host` (the URL's authority
    /// without a default port, as the `Host` header goes out), with the
    /// `Range` value `range` and, when given, the `If-Match` value
    /// `if_match`. With a session token the request must also carry it as
    /// `X-Amz-Security-Token`, which is signed.
    pub(super) fn sign(
        &self,
        creds: &Credentials,
        now: SystemTime,
        host: &str,
        path: &str,
        range: &str,
        if_match: Option<&str>,
    ) -> Signed {
        let (day, amz_date) = amz_dates(now);
        let token = creds.session_token();
        let mut signed_headers = String::with_capacity(80);
        let mut creq = String::with_capacity(256 + path.len());
        creq.push_str("GET\n");
        creq.push_str(path);
        creq.push_str("\n\n");
        let mut header = |name: &str, value: &str| {
            creq.push_str(name);
            creq.push(':');
            push_trimmed(&mut creq, value);
            creq.push('\n');
            if !signed_headers.is_empty() {
                signed_headers.push(';');
            }
            signed_headers.push_str(name);
        };
        header("host", host);
        if let Some(v) = if_match {
            header("if-match", v);
        }
        header("range", range);
        header("x-amz-content-sha256", EMPTY_SHA256);
        header("x-amz-date", &amz_date);
        if let Some(t) = token {
            header("x-amz-security-token", t);
        }
        creq.push('\n');
        creq.push_str(&signed_headers);
        creq.push('\n');
        creq.push_str(EMPTY_SHA256);

        let scope = format!("{day}/{}/{}/aws4_request", self.region, self.service);
        let mut sts = String::with_capacity(160);
        sts.push_str("AWS4-HMAC-SHA256\n");
        sts.push_str(&amz_date);
        sts.push('\n');
        sts.push_str(&scope);
        sts.push('\n');
        push_hex(&mut sts, &Sha256::digest(creq.as_bytes()));
        let signature = {
            let mut key = self.key.lock().unwrap();
            let fresh = key.as_ref().is_some_and(|k| {
                k.day == day
                    && k.access_key == creds.access_key_id()
                    && k.secret == creds.secret_access_key()
            });
            if !fresh {
                let derived = aws_sigv4::sign::v4::generate_signing_key(
                    creds.secret_access_key(),
                    now,
                    &self.region,
                    &self.service,
                );
                *key = Some(DayKey {
                    day: day.clone(),
                    access_key: creds.access_key_id().to_string(),
                    secret: creds.secret_access_key().to_string(),
                    key: derived.as_ref().to_vec(),
                });
            }
            let key = &key.as_ref().expect("set above").key;
            aws_sigv4::sign::v4::calculate_signature(key, sts.as_bytes())
        };
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, \
             Signature={signature}",
            creds.access_key_id()
        );
        Signed {
            amz_date,
            authorization,
        }
    }
}

/// `YYYYMMDD` and `YYYYMMDDTHHMMSSZ` of `t`, UTC (whole seconds).
fn amz_dates(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    let day = format!("{y:04}{m:02}{d:02}");
    let date = format!("{day}T{:02}{:02}{:02}Z", s / 3600, s % 3600 / 60, s % 60);
    (day, date)
}

/// Year, month (1-12), day (1-31) of `days` since 1970-01-01 in the
/// proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Appends `value` as SigV4 canonicalises a header value: spaces at either
/// end dropped, each run of spaces inside made one.
fn push_trimmed(out: &mut String, value: &str) {
    let mut space = false;
    for c in value.trim_matches(' ').chars() {
        if c == ' ' {
            space = true;
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
}

/// Appends `bytes` as lower-case hex.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sigv4::http_request::{
        PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
        UriPathNormalizationMode,
    };
    use aws_smithy_runtime_api::client::identity::Identity;
    use std::time::Duration;

    /// The `Authorization` header `aws-sigv4` gives the same GET, signed as
    /// lakemount signed GETs with it before.
    fn reference(
        creds: &Credentials,
        now: SystemTime,
        url: &str,
        range: &str,
        if_match: Option<&str>,
    ) -> (String, String) {
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let identity: Identity = creds.clone().into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("eu-west-3")
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let mut headers = vec![("user-agent", "lakemount/0"), ("range", range)];
        if let Some(e) = if_match {
            headers.push(("if-match", e));
        }
        let signable =
            SignableRequest::new("GET", url, headers.into_iter(), SignableBody::Bytes(&[]))
                .unwrap();
        let (instructions, _) = aws_sigv4::http_request::sign(signable, &params)
            .unwrap()
            .into_parts();
        let (headers, _) = instructions.into_parts();
        let get = |n: &str| {
            headers
                .iter()
                .find(|h| h.name() == n)
                .map(|h| h.value().to_string())
                .unwrap()
        };
        (get("authorization"), get("x-amz-date"))
    }

    #[test]
    fn signatures_are_those_of_aws_sigv4() {
        let plain = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "t",
        );
        let session = Credentials::new(
            "ASIAEXAMPLE",
            "secret/with+chars",
            Some("FwoGZXIvYXdzEJr//////////token==".into()),
            None,
            "t",
        );
        let times = [
            UNIX_EPOCH + Duration::from_secs(1_764_953_443),
            // Just before and after midnight UTC, and a leap day.
            UNIX_EPOCH + Duration::from_secs(1_764_979_199),
            UNIX_EPOCH + Duration::from_secs(1_764_979_200),
            UNIX_EPOCH + Duration::from_secs(951_782_400) + Duration::from_millis(999),
        ];
        let cases = [
            (
                "http://127.0.0.1:9000",
                "/bucket/train/a%20b%2Bc/x.jpg",
                None,
            ),
            (
                "https://bucket.s3.eu-west-3.amazonaws.com",
                "/k%C3%A9y/%E2%9C%93",
                Some("\"9b2cf535f27731c974343645a3985328\""),
            ),
            ("http://minio.local:80", "/b/dir/f.bin", Some("\"abc-12\"")),
            (
                "https://s3.example:8443",
                "/b/with%20space",
                Some("  \"x  y\"  "),
            ),
        ];
        // The same access key with a rotated secret: the key kept is not reused.
        let rotated = Credentials::new("AKIDEXAMPLE", "rotated-secret", None, None, "t");
        let signer = GetSigner::new("eu-west-3", "s3");
        // Each time in turn with each of the credentials: the same day with
        // another secret must not reuse the key kept.
        for &t in &times {
            for creds in [&plain, &rotated, &session] {
                for (base, path, etag) in cases {
                    let url = format!("{base}{path}");
                    let uri: http::Uri = url.parse().unwrap();
                    let host = match (uri.scheme_str(), uri.port_u16()) {
                        (Some("http"), Some(80)) | (Some("https"), Some(443)) | (_, None) => {
                            uri.host().unwrap().to_string()
                        }
                        (_, Some(p)) => format!("{}:{p}", uri.host().unwrap()),
                    };
                    let range = "bytes=1048576-2097151";
                    let ours = signer.sign(creds, t, &host, path, range, etag);
                    let (auth, date) = reference(creds, t, &url, range, etag);
                    assert_eq!(ours.authorization, auth, "{url} at {t:?}");
                    assert_eq!(ours.amz_date, date, "{url} at {t:?}");
                }
            }
        }
    }

    #[test]
    fn dates_are_utc_calendar_dates() {
        let at = |s: u64| amz_dates(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), ("19700101".into(), "19700101T000000Z".into()));
        assert_eq!(
            at(951_868_799),
            ("20000229".into(), "20000229T235959Z".into())
        );
        assert_eq!(
            at(4_107_542_400),
            ("21000301".into(), "21000301T000000Z".into())
        );
    }
}
