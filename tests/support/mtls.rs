//! Client certificates for the webhook's `--client-ca-file`, and a raw TLS
//! exchange that tells a refused handshake from an answer.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use statusguard::cluster::certs::tls::crypto_provider;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A CA and one client certificate (clientAuth) it signed, all in PEM.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// The CA: what `--client-ca-file` holds.
    pub ca_pem: String,
    /// The client certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl ClientIdentity {
    /// A new CA named after `name`, and a client certificate with CN `name`.
    pub fn new(name: &str) -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = rcgen::CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client.distinguished_name.push(DnType::CommonName, name);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = client.signed_by(&key, &ca).unwrap();
        Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The certificate and key, as reqwest takes them.
    pub fn reqwest_identity(&self) -> reqwest::Identity {
        reqwest::Identity::from_pem(format!("{}{}", self.cert_pem, self.key_pem).as_bytes()).unwrap()
    }
}

/// A TLS connector that trusts only `server_ca_pem`, offers `versions`, and
/// presents `identity`'s certificate when asked (none with `None`).
pub fn connector(
    server_ca_pem: &str,
    identity: Option<&ClientIdentity>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> TlsConnector {
    TlsConnector::from(Arc::new(client_config(server_ca_pem, identity, versions)))
}

/// [`connector`] with the default versions, offering HTTP/2 alone in its
/// handshake (ALPN `h2`), as the API server's client does.
pub fn h2_connector(server_ca_pem: &str, identity: Option<&ClientIdentity>) -> TlsConnector {
    let mut config = client_config(server_ca_pem, identity, rustls::DEFAULT_VERSIONS);
    config.alpn_protocols = vec![b"h2".to_vec()];
    TlsConnector::from(Arc::new(config))
}

fn client_config(
    server_ca_pem: &str,
    identity: Option<&ClientIdentity>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(server_ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    match identity {
        Some(identity) => {
            let chain = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    }
}

/// POSTs `body` to `path` over HTTP/1.1 through `connector` and reads to
/// the end: `Ok(the response)`, or `Err(what failed)`. Under TLS 1.3 the
/// client finishes its side of the handshake before the server has checked
/// its certificate, so a refusal shows as the server's alert on the first
/// read; under TLS 1.2 it fails the handshake itself.
pub async fn exchange(addr: SocketAddr, connector: &TlsConnector, path: &str, body: &[u8]) -> Result<String, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    // A refused client may find the connection closed while it writes
    // (broken pipe): the server's alert is then still there to be read.
    let written = super::webhook::sent(&mut tls, &request).await;
    let mut response = Vec::new();
    let read = tls.read_to_end(&mut response).await;
    match (written, read) {
        (_, Err(e)) => Err(format!("read: {e}")),
        (Err(e), Ok(_)) => Err(format!("write: {e}")),
        (Ok(()), Ok(_)) if response.is_empty() => Err("the connection closed without an answer".into()),
        (Ok(()), Ok(_)) => Ok(String::from_utf8_lossy(&response).into_owned()),
    }
}

/// Why the server refuses `connector`'s handshake, as the client hears it:
/// `Some(the error)`, or `None` when the connection is still open after 5 s
/// (accepted). Nothing is sent: under TLS 1.3 a write could meet the
/// connection the server closed and hide its alert behind a broken pipe.
pub async fn refusal(addr: SocketAddr, connector: &TlsConnector) -> Option<String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = match connector.connect(name, tcp).await {
        Ok(tls) => tls,
        Err(e) => return Some(format!("handshake: {e}")),
    };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(std::time::Duration::from_secs(5), tls.read(&mut byte)).await {
        Ok(Err(e)) => Some(format!("read: {e}")),
        Ok(Ok(0)) => Some("closed without an alert".into()),
        Ok(Ok(_)) => Some("the server sent data unasked".into()),
        Err(_) => None,
    }
}
