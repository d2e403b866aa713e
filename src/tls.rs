//! TLS for the webhook: rustls with the ring provider, TLS 1.2 and 1.3 only,
//! certificates from files that are re-read when they change (including
//! kubelet's `..data` symlink swap), or a development CA and serving
//! certificate made at start with rcgen.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The one crypto provider statusguard uses, chosen on purpose: ring is pure
/// Rust plus assembly (no C toolchain or cmake), and kube's client uses it too.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("the private key does not fit the certificate: {0}")]
    KeyMismatch(rustls::Error),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A CA and a serving certificate it signed, in PEM.
#[derive(Debug, Clone)]
pub struct GeneratedCertificates {
    pub ca_pem: String,
    pub cert_pem: String,
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

/// Parses a PEM chain (leaf first) and its private key into a served key.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_owned(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key_path.to_owned(),
        message: format!("no usable private key: {e}"),
    })?;
    CertifiedKey::from_der(chain, key, &crypto_provider()).map_err(TlsError::KeyMismatch)
}

/// Serves whichever key pair was loaded last; new handshakes see a swap at
/// once, connections already established keep theirs.
#[derive(Debug)]
pub struct SwappableCert(ArcSwap<CertifiedKey>);

impl SwappableCert {
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self(ArcSwap::from_pointee(key)))
    }

    pub fn store(&self, key: CertifiedKey) {
        self.0.store(Arc::new(key));
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// The rustls server configuration: TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Certificate and key files, re-read every `interval`.
///
/// Re-reading by path, rather than watching for file events, also follows
/// the `..data` symlink swap with which kubelet updates a Secret volume.
/// A pair that fails to load (a half-written rotation: new certificate, old
/// key) is reported and retried; the last good pair stays in service.
/// The bytes of a certificate file and its key file, as last read.
pub type PemPair = (Vec<u8>, Vec<u8>);

#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    fn read(&self) -> Result<PemPair, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Loads the pair once, for start-up.
    pub fn load(&self) -> Result<(CertifiedKey, PemPair), TlsError> {
        let bytes = self.read()?;
        Ok((certified_key(&bytes.0, &bytes.1, &self.cert, &self.key)?, bytes))
    }

    /// Polls the files until the process ends, swapping in each new valid pair.
    /// `on_reload` hears of every attempt, `Ok` or not.
    pub async fn watch(
        self,
        target: Arc<SwappableCert>,
        mut loaded: PemPair,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last pair that failed to load, so that it is reported once.
        let mut rejected: Option<PemPair> = None;
        loop {
            tick.tick().await;
            let bytes = match self.read() {
                Ok(bytes) if bytes == loaded || rejected.as_ref() == Some(&bytes) => continue,
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the TLS files; keeping the certificate in service");
                    on_reload(Err(&e));
                    continue;
                }
            };
            match certified_key(&bytes.0, &bytes.1, &self.cert, &self.key) {
                Ok(key) => {
                    target.store(key);
                    loaded = bytes;
                    tracing::info!(cert = %self.cert.display(), "serving a new TLS certificate");
                    on_reload(Ok(()));
                }
                Err(e) => {
                    // The other file of the pair may still be on its way: any
                    // change to either file is tried again on a later tick.
                    rejected = Some(bytes);
                    tracing::warn!(error = %e, "the new TLS files do not load; keeping the certificate in service");
                    on_reload(Err(&e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_load_and_mismatched_keys_do_not() {
        let a = generate_certificates(&["statusguard.svc".into()]).unwrap();
        let b = generate_certificates(&[]).unwrap();
        let p = Path::new("x");
        assert!(certified_key(a.cert_pem.as_bytes(), a.key_pem.as_bytes(), p, p).is_ok());
        assert!(matches!(
            certified_key(a.cert_pem.as_bytes(), b.key_pem.as_bytes(), p, p),
            Err(TlsError::KeyMismatch(_))
        ));
        assert!(matches!(
            certified_key(b"", a.key_pem.as_bytes(), p, p),
            Err(TlsError::NoCertificate { .. })
        ));
        assert!(matches!(
            certified_key(a.cert_pem.as_bytes(), b"junk", p, p),
            Err(TlsError::Pem { .. })
        ));
    }
}
