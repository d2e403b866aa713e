//! TLS for the webhook: rustls with the ring provider, TLS 1.2 and 1.3 only,
//! serving whichever certificate was loaded last ([`SwappableCert`], fed by
//! the file poll, the Secret loop, or a development certificate made at
//! start). Optionally, callers must present a client certificate from a CA
//! bundle that can be swapped the same way ([`SwappableClientVerifier`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::cluster::certs::policy::{
    CertError, GeneratedCertificates, generate_certificates, pem_certificates, pem_private_key,
};

/// The one crypto provider statusguard uses, chosen on purpose: ring is pure
/// Rust plus assembly (no C toolchain or cmake), and kube's client uses it too.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a certificate could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{path}: no PEM certificate found")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A file is not PEM of the expected kind.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key and the certificate are not a pair.
    #[error("the private key does not fit the certificate: {0}")]
    KeyMismatch(rustls::Error),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The development certificate could not be made.
    #[error(transparent)]
    Generate(#[from] CertError),
    /// The client CA bundle holds a certificate that cannot be a trust anchor.
    #[error("{path}: not a usable CA certificate: {source}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// rustls refused to verify clients with the CA bundle.
    #[error("{path}: cannot verify client certificates with it: {source}")]
    ClientVerifier {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::server::VerifierBuilderError,
    },
}

/// A certificate chain (leaf first) and its private key in PEM, with where
/// each came from (named in errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemPair {
    /// The PEM certificate chain.
    pub cert: Vec<u8>,
    /// The PEM private key.
    pub key: Vec<u8>,
    /// Where the chain was read.
    pub cert_origin: PathBuf,
    /// Where the key was read.
    pub key_origin: PathBuf,
}

/// Parses a PEM chain (leaf first) and its private key into a served key.
pub fn certified_key(pem: &PemPair) -> Result<CertifiedKey, TlsError> {
    let chain = pem_certificates(&pem.cert).map_err(|e| TlsError::Pem {
        path: pem.cert_origin.clone(),
        message: e.to_string(),
    })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: pem.cert_origin.clone(),
        });
    }
    let key = pem_private_key(&pem.key).map_err(|e| TlsError::Pem {
        path: pem.key_origin.clone(),
        message: format!("no usable private key: {e}"),
    })?;
    CertifiedKey::from_der(chain, key, &crypto_provider()).map_err(TlsError::KeyMismatch)
}

/// A development CA and serving certificate made now (see
/// [`generate_certificates`]): the key to serve, and the PEM of both.
pub(crate) fn generated(extra_sans: &[String]) -> Result<(CertifiedKey, GeneratedCertificates), TlsError> {
    let generated = generate_certificates(extra_sans)?;
    let key = certified_key(&PemPair {
        cert: generated.cert_pem.clone().into_bytes(),
        key: generated.key_pem.clone().into_bytes(),
        cert_origin: "generated certificate".into(),
        key_origin: "generated key".into(),
    })?;
    Ok((key, generated))
}

/// Serves whichever key pair was loaded last; new handshakes see a swap at
/// once, connections already established keep theirs.
#[derive(Debug)]
pub struct SwappableCert(ArcSwapOption<CertifiedKey>);

impl SwappableCert {
    /// Serves `key` until another is stored.
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self(ArcSwapOption::from_pointee(key)))
    }

    /// Serves nothing (every handshake fails) until a key is stored: for a
    /// server that opens its ports before its first certificate, so that
    /// its probes answer meanwhile.
    pub(crate) fn empty() -> Arc<Self> {
        Arc::new(Self(ArcSwapOption::empty()))
    }

    /// Serves `key` to every new handshake from now on.
    pub fn store(&self, key: CertifiedKey) {
        self.0.store(Some(Arc::new(key)));
    }

    /// Whether a key was stored: readiness waits for it.
    pub(crate) fn is_serving(&self) -> bool {
        self.0.load().is_some()
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.load_full()
    }
}

/// The rustls server configuration: TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1,
/// no client certificate asked for.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<rustls::ServerConfig, TlsError> {
    server_config_verifying_clients(resolver, None)
}

/// [`server_config`], and with `clients` every caller must present a client
/// certificate that `clients` accepts, or the handshake fails.
pub fn server_config_verifying_clients(
    resolver: Arc<dyn ResolvesServerCert>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// A verifier that requires a client certificate chaining to one of the CA
/// certificates in `pem` (a PEM bundle; other PEM sections are ignored).
/// `origin` names the file in errors.
pub fn client_verifier(pem: &[u8], origin: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    let certificates = pem_certificates(pem).map_err(|e| TlsError::Pem {
        path: origin.to_owned(),
        message: e.to_string(),
    })?;
    for cert in certificates {
        roots.add(cert).map_err(|source| TlsError::ClientCa {
            path: origin.to_owned(),
            source,
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            path: origin.to_owned(),
        });
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crypto_provider())
        .build()
        .map_err(|source| TlsError::ClientVerifier {
            path: origin.to_owned(),
            source,
        })
}

/// Verifies client certificates with whichever CA bundle was loaded last;
/// new handshakes see a swap at once, established connections are not
/// checked again. Always asks for a certificate and requires one.
#[derive(Debug)]
pub struct SwappableClientVerifier(ArcSwap<Arc<dyn ClientCertVerifier>>);

impl SwappableClientVerifier {
    /// Verifies with `verifier` until another is stored.
    pub fn new(verifier: Arc<dyn ClientCertVerifier>) -> Arc<Self> {
        Arc::new(Self(ArcSwap::from_pointee(verifier)))
    }

    /// Verifies every new handshake with `verifier` from now on.
    pub fn store(&self, verifier: Arc<dyn ClientCertVerifier>) {
        self.0.store(Arc::new(verifier));
    }
}

impl ClientCertVerifier for SwappableClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints. The trait lends the hints out of `&self`, which a swapped
    /// bundle cannot; and an empty list asks a client to send the
    /// certificate it has, which is what the API server does with the one
    /// its kubeconfig names. Unauthenticated callers also learn nothing of
    /// the trusted CAs.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.load().verify_client_cert(end_entity, intermediates, now)
    }

    // The signature checks depend on the crypto provider only, never on the
    // bundle: a swap between the chain check and these is harmless.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.load().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.load().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.load().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(cert: &str, key: &str) -> PemPair {
        PemPair {
            cert: cert.as_bytes().to_vec(),
            key: key.as_bytes().to_vec(),
            cert_origin: "c".into(),
            key_origin: "k".into(),
        }
    }

    /// A client certificate for `name`, signed by a new CA: (CA PEM, certificate DER).
    fn client_of_new_ca(name: &str) -> (String, CertificateDer<'static>) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client.distinguished_name.push(DnType::CommonName, name);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = client.signed_by(&KeyPair::generate().unwrap(), &ca).unwrap();
        (ca.pem(), cert.der().clone())
    }

    #[test]
    fn the_client_verifier_accepts_its_cas_certificates_and_follows_a_swap() {
        let (ca_a, client_a) = client_of_new_ca("a");
        let (ca_b, client_b) = client_of_new_ca("b");
        let path = Path::new("ca.pem");
        let accepts = |verifier: &SwappableClientVerifier, cert: &CertificateDer<'_>| {
            verifier.verify_client_cert(cert, &[], UnixTime::now()).is_ok()
        };
        let verifier = SwappableClientVerifier::new(client_verifier(ca_a.as_bytes(), path).unwrap());
        assert!(verifier.client_auth_mandatory());
        assert!(accepts(&verifier, &client_a));
        assert!(!accepts(&verifier, &client_b), "another CA's certificate");
        verifier.store(client_verifier(ca_b.as_bytes(), path).unwrap());
        assert!(!accepts(&verifier, &client_a), "after the swap");
        assert!(accepts(&verifier, &client_b));
        let bundle = format!("{ca_a}{ca_b}");
        verifier.store(client_verifier(bundle.as_bytes(), path).unwrap());
        assert!(
            accepts(&verifier, &client_a) && accepts(&verifier, &client_b),
            "a bundle trusts each"
        );
    }

    #[test]
    fn a_client_ca_file_without_a_certificate_is_refused_by_name() {
        let path = Path::new("client-ca.pem");
        let key_only = generate_certificates(&[]).unwrap().key_pem;
        for pem in ["", "junk", key_only.as_str()] {
            let err = client_verifier(pem.as_bytes(), path).err().unwrap();
            assert!(matches!(err, TlsError::NoCertificate { .. }), "{pem:?}: {err}");
            assert!(err.to_string().contains("client-ca.pem"), "{err}");
        }
        let truncated = "-----BEGIN CERTIFICATE-----\nMIIB\n";
        assert!(matches!(
            client_verifier(truncated.as_bytes(), path),
            Err(TlsError::Pem { .. })
        ));
    }

    #[test]
    fn an_empty_resolver_serves_nothing_until_a_key_is_stored() {
        let resolver = SwappableCert::empty();
        assert!(!resolver.is_serving());
        let (key, _) = generated(&[]).unwrap();
        resolver.store(key);
        assert!(resolver.is_serving());
    }

    #[test]
    fn generated_certificates_load_and_mismatched_keys_do_not() {
        let a = generate_certificates(&["statusguard.svc".into()]).unwrap();
        let b = generate_certificates(&[]).unwrap();
        assert!(certified_key(&pem(&a.cert_pem, &a.key_pem)).is_ok());
        assert!(matches!(
            certified_key(&pem(&a.cert_pem, &b.key_pem)),
            Err(TlsError::KeyMismatch(_))
        ));
        assert!(matches!(
            certified_key(&pem("", &a.key_pem)),
            Err(TlsError::NoCertificate { .. })
        ));
        assert!(matches!(
            certified_key(&pem(&a.cert_pem, "junk")),
            Err(TlsError::Pem { .. })
        ));
    }
}
