//! https with a generated CA: trusted through a custom CA bundle, refused without.

mod common;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use lakemount_testserver::TestServer;

fn https_client(endpoint: &str, ca_pem: Option<&[u8]>) -> Client {
    let trust = match ca_pem {
        Some(pem) => TrustStore::empty().with_pem_certificate(pem.to_vec()),
        None => TrustStore::default(),
    };
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(
            TlsContext::builder()
                .with_trust_store(trust)
                .build()
                .unwrap(),
        )
        .build_https();
    let conf = common::config(endpoint)
        .http_client(http)
        .retry_config(RetryConfig::disabled())
        .build();
    Client::from_conf(conf)
}

#[test]
fn tls_with_custom_ca() {
    let (s, ca_path) = TestServer::start_tls_background().unwrap();
    assert!(s.endpoint().starts_with("https://127.0.0.1:"));
    let pem = std::fs::read(&ca_path).unwrap();
    assert!(String::from_utf8_lossy(&pem).contains("BEGIN CERTIFICATE"));
    s.create_bucket("tls-bucket");
    s.put("tls-bucket", "k", &b"secret"[..]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = https_client(&s.endpoint(), Some(&pem));
        let out = c
            .get_object()
            .bucket("tls-bucket")
            .key("k")
            .send()
            .await
            .unwrap();
        assert_eq!(
            &out.body.collect().await.unwrap().into_bytes()[..],
            b"secret"
        );

        // `localhost` is in the certificate too.
        let port = s.addr().port();
        let c = https_client(&format!("https://localhost:{port}"), Some(&pem));
        c.head_bucket().bucket("tls-bucket").send().await.unwrap();

        // Without the CA the handshake fails.
        let c = https_client(&s.endpoint(), None);
        let err = c
            .head_bucket()
            .bucket("tls-bucket")
            .send()
            .await
            .unwrap_err();
        assert!(err.raw_response().is_none(), "{err:?}");
    });
    assert_eq!(s.request_count("GetObject"), 1);
    s.shutdown();
    drop(s);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!ca_path.exists(), "CA file is removed with the server");
}
