//! TLS for the webhook: rustls with the ring provider, TLS 1.2 and 1.3 only,
//! certificates from files that are re-read when they change (including
//! kubelet's `..data` symlink swap), or a development CA and serving
//! certificate made at start with rcgen. Optionally, callers must present a
//! client certificate from a CA bundle that is re-read the same way.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

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
    /// rcgen could not make a certificate.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
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

/// A CA and a serving certificate it signed, in PEM.
#[derive(Debug, Clone)]
pub struct GeneratedCertificates {
    /// The CA certificate that verifies the serving certificate.
    pub ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// The serving certificate's private key.
    pub key_pem: String,
}

/// Makes a development CA and a serving certificate for localhost,
/// 127.0.0.1, ::1 and every name in `extra_sans` (DNS names or IPs).
pub fn generate_certificates(extra_sans: &[String]) -> Result<GeneratedCertificates, TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "statusguard development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    sans.extend(extra_sans.iter().filter(|s| !s.is_empty()).cloned());
    sans.dedup();
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    for san in &sans {
        params.subject_alt_names.push(match san.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(san.clone().try_into()?),
        });
    }
    params.distinguished_name.push(DnType::CommonName, "statusguard");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(GeneratedCertificates {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A certificate chain (leaf first) and its private key in PEM, with the
/// files they came from (named in errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFiles {
    /// The PEM certificate chain.
    pub cert: Vec<u8>,
    /// The PEM private key.
    pub key: Vec<u8>,
    /// Where they were read.
    pub origin: CertFiles,
}

impl PemFiles {
    /// The serving pair of generated certificates.
    pub fn generated(generated: &GeneratedCertificates) -> Self {
        Self {
            cert: generated.cert_pem.clone().into_bytes(),
            key: generated.key_pem.clone().into_bytes(),
            origin: CertFiles {
                cert: "generated certificate".into(),
                key: "generated key".into(),
            },
        }
    }
}

/// Parses a PEM chain (leaf first) and its private key into a served key.
pub fn certified_key(pem: &PemFiles) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: pem.origin.cert.clone(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: pem.origin.cert.clone(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| TlsError::Pem {
        path: pem.origin.key.clone(),
        message: format!("no usable private key: {e}"),
    })?;
    CertifiedKey::from_der(chain, key, &crypto_provider()).map_err(TlsError::KeyMismatch)
}

/// Serves whichever key pair was loaded last; new handshakes see a swap at
/// once, connections already established keep theirs.
#[derive(Debug)]
pub struct SwappableCert(ArcSwap<CertifiedKey>);

impl SwappableCert {
    /// Serves `key` until another is stored.
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self(ArcSwap::from_pointee(key)))
    }

    /// Serves `key` to every new handshake from now on.
    pub fn store(&self, key: CertifiedKey) {
        self.0.store(Arc::new(key));
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
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
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| TlsError::Pem {
            path: origin.to_owned(),
            message: e.to_string(),
        })?;
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

/// The PEM bundle of the CAs whose client certificates are accepted
/// (`--client-ca-file`), re-read every interval like [`CertFiles`], so a
/// rotated ConfigMap or Secret volume takes effect without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCaFile {
    /// The PEM bundle.
    pub path: PathBuf,
}

impl ClientCaFile {
    fn read(&self) -> Result<Vec<u8>, TlsError> {
        read_file(&self.path)
    }

    /// Loads the bundle once, for start-up: the verifier, and the bytes it came from.
    pub fn load(&self) -> Result<(Arc<SwappableClientVerifier>, Vec<u8>), TlsError> {
        let pem = self.read()?;
        let verifier = client_verifier(&pem, &self.path)?;
        Ok((SwappableClientVerifier::new(verifier), pem))
    }

    /// Polls the file until the process ends, swapping in each new valid
    /// bundle; a bundle that does not load leaves the last good one in force.
    /// `on_reload` hears of every attempt, `Ok` or not.
    pub async fn watch(
        self,
        target: Arc<SwappableClientVerifier>,
        loaded: Vec<u8>,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) {
        let install = |pem: &Vec<u8>| {
            let verifier = client_verifier(pem, &self.path)?;
            target.store(verifier);
            tracing::info!(file = %self.path.display(), "trusting a new client CA bundle for new connections");
            Ok(())
        };
        poll_files(
            "the client CA bundle",
            interval,
            loaded,
            || self.read(),
            install,
            on_reload,
        )
        .await;
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads `what` every `interval` until the process ends, and installs each
/// new version that differs from the one in service. What fails to read or
/// install is reported (once per version), the last good one stays.
async fn poll_files<F: PartialEq>(
    what: &str,
    interval: Duration,
    mut loaded: F,
    read: impl Fn() -> Result<F, TlsError>,
    install: impl Fn(&F) -> Result<(), TlsError>,
    on_reload: impl Fn(Result<(), &TlsError>),
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last version that failed to install, so that it is reported once.
    let mut rejected: Option<F> = None;
    loop {
        tick.tick().await;
        let files = match read() {
            Ok(files) if files == loaded || rejected.as_ref() == Some(&files) => continue,
            Ok(files) => files,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read {what}; keeping the one in service");
                on_reload(Err(&e));
                continue;
            }
        };
        match install(&files) {
            Ok(()) => {
                loaded = files;
                on_reload(Ok(()));
            }
            Err(e) => {
                // A pair's other file may still be on its way: any later
                // change is tried again on a later tick.
                rejected = Some(files);
                tracing::warn!(error = %e, "{what}: the new version does not load; keeping the one in service");
                on_reload(Err(&e));
            }
        }
    }
}

/// Certificate and key files, re-read every `interval`.
///
/// Re-reading by path, rather than watching for file events, also follows
/// the `..data` symlink swap with which kubelet updates a Secret volume.
/// A pair that fails to load (a half-written rotation: new certificate, old
/// key) is reported and retried; the last good pair stays in service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

impl CertFiles {
    fn read(&self) -> Result<PemFiles, TlsError> {
        Ok(PemFiles {
            cert: read_file(&self.cert)?,
            key: read_file(&self.key)?,
            origin: self.clone(),
        })
    }

    /// Loads the pair once, for start-up.
    pub fn load(&self) -> Result<(CertifiedKey, PemFiles), TlsError> {
        let pem = self.read()?;
        Ok((certified_key(&pem)?, pem))
    }

    /// Polls the files until the process ends, swapping in each new valid pair.
    /// `on_reload` hears of every attempt, `Ok` or not.
    pub async fn watch(
        self,
        target: Arc<SwappableCert>,
        loaded: PemFiles,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) {
        let install = |pem: &PemFiles| {
            target.store(certified_key(pem)?);
            tracing::info!(cert = %self.cert.display(), "serving a new TLS certificate");
            Ok(())
        };
        poll_files(
            "the TLS certificate and key",
            interval,
            loaded,
            || self.read(),
            install,
            on_reload,
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(cert: &str, key: &str) -> PemFiles {
        PemFiles {
            cert: cert.as_bytes().to_vec(),
            key: key.as_bytes().to_vec(),
            origin: CertFiles {
                cert: "c".into(),
                key: "k".into(),
            },
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
    fn generated_certificates_load_and_mismatched_keys_do_not() {
        let a = generate_certificates(&["statusguard.svc".into()]).unwrap();
        let b = generate_certificates(&[]).unwrap();
        assert!(certified_key(&PemFiles::generated(&a)).is_ok());
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
