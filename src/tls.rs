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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

impl CertFiles {
    fn read(&self) -> Result<PemFiles, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        Ok(PemFiles {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
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
        mut loaded: PemFiles,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last pair that failed to load, so that it is reported once.
        let mut rejected: Option<PemFiles> = None;
        loop {
            tick.tick().await;
            let pem = match self.read() {
                Ok(pem) if pem == loaded || rejected.as_ref() == Some(&pem) => continue,
                Ok(pem) => pem,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the TLS files; keeping the certificate in service");
                    on_reload(Err(&e));
                    continue;
                }
            };
            match certified_key(&pem) {
                Ok(key) => {
                    target.store(key);
                    loaded = pem;
                    tracing::info!(cert = %self.cert.display(), "serving a new TLS certificate");
                    on_reload(Ok(()));
                }
                Err(e) => {
                    // The other file of the pair may still be on its way: any
                    // change to either file is tried again on a later tick.
                    rejected = Some(pem);
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
