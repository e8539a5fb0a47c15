//! Throw-away TLS: a self-signed CA generated at start, and a server certificate
//! for `127.0.0.1`, `::1` and `localhost` signed by it.

use std::io;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

fn err(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

/// Generates the CA and server certificate; returns the acceptor and the CA's PEM.
pub(crate) fn make_acceptor() -> io::Result<(TlsAcceptor, String)> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "lakemount-testserver CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(err)?).map_err(err)?;

    let mut leaf_params = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
        "localhost".to_owned(),
    ])
    .map_err(err)?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "lakemount-testserver");
    leaf_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = KeyPair::generate().map_err(err)?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca).map_err(err)?;

    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone(), ca.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));

    // Explicit provider: the workspace may enable both `ring` and `aws-lc-rs` in
    // rustls, in which case there is no unambiguous process-wide default.
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(err)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), ca.pem()))
}
