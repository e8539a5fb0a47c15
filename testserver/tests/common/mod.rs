//! Shared helpers: an `aws-sdk-s3` client configured for the test server.

#![allow(dead_code)]

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use lakemount_testserver::{ACCESS_KEY, REGION, SECRET_KEY};

/// Client config builder as lakemount would set it up (path style, static keys).
pub fn config(endpoint: &str) -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .force_path_style(true)
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test"))
}

/// A client with the SDK's default (standard) retries.
pub fn client(endpoint: &str) -> Client {
    Client::from_conf(config(endpoint).build())
}

/// A client that never retries, so each call is exactly one HTTP request.
pub fn client_no_retry(endpoint: &str) -> Client {
    Client::from_conf(
        config(endpoint)
            .retry_config(RetryConfig::disabled())
            .build(),
    )
}

/// HTTP status and S3 error code of a failed call (panics if no response came).
pub fn status_and_code<E>(err: &SdkError<E, HttpResponse>) -> (u16, Option<String>)
where
    E: ProvideErrorMetadata + std::fmt::Debug,
{
    let status = err
        .raw_response()
        .unwrap_or_else(|| panic!("no HTTP response: {err:?}"))
        .status()
        .as_u16();
    (status, err.code().map(str::to_owned))
}
