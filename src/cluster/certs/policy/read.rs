//! Reading certificates, keys and the Secret's parts: PEM with
//! rustls-pki-types, X.509 with x509-parser. Nothing here trusts what it
//! reads: what does not parse or does not fit is reported, never a panic.

use std::collections::BTreeSet;
use std::net::IpAddr;

use rcgen::KeyPair;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::Stored;

/// The certificates of a PEM bundle, in order; sections of other kinds
/// (keys) are skipped, a malformed section is an error.
pub(crate) fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, pem::Error> {
    CertificateDer::pem_slice_iter(pem).collect()
}

/// The first private key of a PEM text.
pub(crate) fn pem_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, pem::Error> {
    PrivateKeyDer::from_pem_slice(pem)
}

/// A certificate as read, with what the policy decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cert {
    pub(super) der: Vec<u8>,
    pub(super) is_ca: bool,
    pub(super) not_before: i64,
    pub(super) not_after: i64,
    /// The DNS names and IP addresses it names.
    pub(super) names: BTreeSet<String>,
}

impl Cert {
    pub(super) fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let mut names = BTreeSet::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => {
                        names.insert((*dns).to_owned());
                    }
                    GeneralName::IPAddress(bytes) => {
                        let ip = match bytes.len() {
                            4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                            16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                            _ => None,
                        };
                        names.extend(ip.map(|ip| ip.to_string()));
                    }
                    _ => {}
                }
            }
        }
        Some(Self {
            der: der.to_vec(),
            is_ca: cert.is_ca(),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            names,
        })
    }

    /// The first certificate of a PEM text.
    pub(super) fn first_of(pem: &str) -> Option<Self> {
        Self::from_der(CertificateDer::from_pem_slice(pem.as_bytes()).ok()?.as_ref())
    }

    fn parsed(&self) -> Option<X509Certificate<'_>> {
        x509_parser::parse_x509_certificate(&self.der)
            .ok()
            .map(|(_, cert)| cert)
    }

    /// Whether `key_pem` is the private key of this certificate: the public
    /// keys compared, not only that the key parses.
    pub(super) fn fits(&self, key_pem: &str) -> bool {
        let (Ok(key), Some(cert)) = (KeyPair::from_pem(key_pem), self.parsed()) else {
            return false;
        };
        cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw()
    }

    /// Whether `issuer` signed this certificate (by name and by signature).
    pub(super) fn signed_by(&self, issuer: &Cert) -> bool {
        let (Some(cert), Some(ca)) = (self.parsed(), issuer.parsed()) else {
            return false;
        };
        cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
    }

    pub(super) fn pem(&self) -> String {
        let config = ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF);
        ::pem::encode_config(&::pem::Pem::new("CERTIFICATE", self.der.clone()), config)
    }
}

/// The certificates of a PEM bundle that can be read, and whether anything
/// in it could not (a broken section, or a section that is no certificate).
pub(super) fn bundle(pem: &str) -> (Vec<Cert>, bool) {
    let mut certs = Vec::new();
    let mut broken = false;
    for section in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let Ok(der) = section else {
            // A section that is not PEM leaves the reader where it cannot be
            // trusted to find the next one.
            broken = true;
            break;
        };
        match Cert::from_der(der.as_ref()) {
            Some(cert) => certs.push(cert),
            None => broken = true,
        }
    }
    // Text with no certificate section at all is garbage too.
    broken |= certs.is_empty() && !pem.trim().is_empty();
    (certs, broken)
}

/// A certificate and its private key, in PEM.
#[derive(Debug, Clone)]
pub(super) struct Pair {
    pub(super) cert: String,
    pub(super) key: String,
}

/// A certificate with its key, both fit for use now.
#[derive(Debug, Clone)]
pub(super) struct Usable {
    pub(super) cert: Cert,
    pub(super) pair: Pair,
}

/// One of the Secret's two pairs (CA, serving certificate), as read.
#[derive(Debug, Clone)]
pub(super) enum Part {
    Usable(Usable),
    /// Neither the certificate nor the key is there.
    Absent,
    /// There, but not usable: why.
    Damaged(&'static str),
}

/// What a Secret, or what a replica serves, holds, read at `now`.
pub(super) struct Read {
    pub(super) ca: Part,
    pub(super) leaf: Part,
    /// The readable certificates of `ca.crt`.
    pub(super) bundle: Vec<Cert>,
    /// `ca-signing.crt` whatever its key: an issuer to look for.
    ca_cert: Option<Cert>,
    pub(super) bundle_broken: bool,
}

impl Read {
    pub(super) fn of(stored: &Stored, now: i64) -> Self {
        let ca_cert = Cert::first_of(&stored.ca_cert);
        let ca = match &ca_cert {
            _ if stored.ca_cert.trim().is_empty() && stored.ca_key.trim().is_empty() => Part::Absent,
            None => Part::Damaged("ca-signing.crt cannot be read"),
            Some(cert) if !cert.is_ca => Part::Damaged("ca-signing.crt is not a CA"),
            Some(cert) if cert.not_after <= now => Part::Damaged("the CA has expired"),
            Some(cert) if !cert.fits(&stored.ca_key) => Part::Damaged("ca.key does not fit ca-signing.crt"),
            Some(cert) => Part::Usable(Usable {
                cert: cert.clone(),
                pair: Pair {
                    cert: stored.ca_cert.clone(),
                    key: stored.ca_key.clone(),
                },
            }),
        };
        let leaf = match Cert::first_of(&stored.tls_cert) {
            _ if stored.tls_cert.trim().is_empty() && stored.tls_key.trim().is_empty() => Part::Absent,
            None => Part::Damaged("tls.crt cannot be read"),
            Some(cert) if cert.not_after <= now => Part::Damaged("the serving certificate has expired"),
            Some(cert) if !cert.fits(&stored.tls_key) => Part::Damaged("tls.key does not fit tls.crt"),
            Some(cert) => Part::Usable(Usable {
                cert,
                pair: Pair {
                    cert: stored.tls_cert.clone(),
                    key: stored.tls_key.clone(),
                },
            }),
        };
        let (bundle, bundle_broken) = bundle(&stored.ca_bundle);
        Self {
            ca,
            leaf,
            bundle,
            ca_cert,
            bundle_broken,
        }
    }

    pub(super) fn usable_ca(&self) -> Option<&Usable> {
        match &self.ca {
            Part::Usable(ca) => Some(ca),
            _ => None,
        }
    }

    pub(super) fn all_absent(&self) -> bool {
        matches!((&self.ca, &self.leaf), (Part::Absent, Part::Absent)) && self.bundle.is_empty() && !self.bundle_broken
    }

    /// Every CA certificate it names, which may have signed a serving certificate.
    pub(super) fn issuers(&self) -> impl Iterator<Item = &Cert> {
        self.ca_cert.iter().chain(&self.bundle)
    }
}
