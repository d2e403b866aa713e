//! The certificate authority the server keeps for itself, in one Secret
//! shared by its replicas: a CA, its key, and a serving certificate it
//! signs, renewed and rotated without a moment in which the API server would
//! not trust what a replica serves.
//!
//! [`next`] is pure: given what the Secret holds, the policy and the time,
//! it says what the Secret should hold next. The rules:
//! - nothing usable stored: a new CA and a serving certificate;
//! - the CA in its last third of validity: a new CA is **added** to the
//!   trust bundle (`ca.crt` then holds both), the serving certificate stays;
//! - the serving certificate is re-issued by the newest CA when it is in its
//!   last third, when the names it must carry changed, or when a new CA has
//!   been in the bundle for the overlap (long enough for every webhook's
//!   `caBundle` to hold it);
//! - the old CA leaves the bundle once the serving certificate of the new
//!   one has been out for the overlap (every replica has loaded it).
//!
//! Certificates are back-dated by [`BACKDATE`] against clock skew between
//! the server and the API server.
//!
//! This is also the one home of rcgen (the development CA of `serve` and
//! `gen-certs` is made by the same functions) and of PEM and X.509 parsing.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::extensions::GeneralName;

/// How far back a new certificate's validity starts.
pub(crate) const BACKDATE: Duration = Duration::from_secs(60);

/// How long the development CA and certificate of `serve` without
/// certificates, and of `gen-certs`, are valid: long enough never to be
/// renewed in development.
const DEVELOPMENT_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The keys of the Secret.
pub(crate) mod keys {
    /// The trust bundle: the newest CA first, then the one it replaces
    /// during a rotation.
    pub(crate) const CA_BUNDLE: &str = "ca.crt";
    /// The newest CA's certificate, which signs serving certificates.
    pub(crate) const CA_CERT: &str = "ca-signing.crt";
    pub(crate) const CA_KEY: &str = "ca.key";
    pub(crate) const TLS_CERT: &str = "tls.crt";
    pub(crate) const TLS_KEY: &str = "tls.key";
}

/// What the server's certificates must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertPolicy {
    /// Every DNS name and IP address the serving certificate carries.
    pub(crate) names: BTreeSet<String>,
    /// How long a serving certificate is valid.
    pub(crate) leaf_validity: Duration,
    /// How long a CA is valid.
    pub(crate) ca_validity: Duration,
    /// How long a new CA is trusted before it signs what is served, and how
    /// long the old CA is still trusted after.
    pub(crate) overlap: Duration,
}

/// What the Secret holds (PEM text), one field per key of [`keys`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Stored {
    pub(crate) ca_bundle: String,
    pub(crate) ca_cert: String,
    pub(crate) ca_key: String,
    pub(crate) tls_cert: String,
    pub(crate) tls_key: String,
}

/// What to do with the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// It holds what it should.
    Keep,
    /// Write this, for this reason.
    Write(Box<Stored>, String),
}

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// rcgen failed (a name it cannot encode, for one).
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The certificates of a PEM bundle, in order; sections of other kinds
/// (keys) are skipped, a malformed section is an error.
pub(crate) fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, pem::Error> {
    CertificateDer::pem_slice_iter(pem).collect()
}

/// The first private key of a PEM text.
pub(crate) fn pem_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, pem::Error> {
    PrivateKeyDer::from_pem_slice(pem)
}

/// What [`next`] reads of a certificate.
#[derive(Debug, Clone)]
struct Facts {
    subject: String,
    issuer: String,
    not_before: i64,
    not_after: i64,
    names: BTreeSet<String>,
}

fn facts_der(der: &[u8]) -> Option<Facts> {
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
    Some(Facts {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        names,
    })
}

/// The first certificate of a PEM text.
fn facts(pem: &str) -> Option<Facts> {
    facts_der(CertificateDer::from_pem_slice(pem.as_bytes()).ok()?.as_ref())
}

/// Every certificate of a PEM bundle.
fn bundle_facts(pem: &str) -> Option<Vec<Facts>> {
    let certificates = pem_certificates(pem.as_bytes()).ok()?;
    certificates.iter().map(|der| facts_der(der.as_ref())).collect()
}

fn unix(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn offset(seconds: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(seconds).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// When a certificate was issued: its validity start, less the back-dating.
fn issued(f: &Facts) -> i64 {
    f.not_before + secs(BACKDATE)
}

/// In the last third of its validity.
fn due(f: &Facts, now: i64) -> bool {
    let lifetime = f.not_after - issued(f);
    f.not_after - now < lifetime / 3
}

/// A certificate and its private key, in PEM.
#[derive(Debug, Clone)]
struct Pair {
    cert: String,
    key: String,
}

/// A new CA called `name`, valid from now (back-dated) for `validity`.
fn new_ca(name: &str, now: i64, validity: Duration) -> Result<Pair, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = offset(now - secs(BACKDATE));
    params.not_after = offset(now.saturating_add(secs(validity)));
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// The CA of the Secret; unique by name, so that a serving certificate's
/// issuer names its CA.
fn new_managed_ca(now: i64, validity: Duration) -> Result<Pair, CertError> {
    new_ca(&format!("statusguard CA {now}"), now, validity)
}

/// A serving certificate for `names` (DNS names or IP addresses), signed by
/// `ca`, valid from now (back-dated) for `validity` but never beyond the CA.
fn new_leaf(now: i64, names: &BTreeSet<String>, validity: Duration, ca: &Pair) -> Result<Pair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let ca_end = facts(&ca.cert).map_or(i64::MAX, |f| f.not_after);
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    for name in names {
        params.subject_alt_names.push(match name.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(name.clone().try_into()?),
        });
    }
    params.distinguished_name.push(DnType::CommonName, "statusguard");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.not_before = offset(now - secs(BACKDATE));
    params.not_after = offset(now.saturating_add(secs(validity)).min(ca_end));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A development CA and a serving certificate it signed, in PEM.
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
pub fn generate_certificates(extra_sans: &[String]) -> Result<GeneratedCertificates, CertError> {
    let now = unix(SystemTime::now());
    let ca = new_ca("statusguard development CA", now, DEVELOPMENT_VALIDITY)?;
    let mut names: BTreeSet<String> = ["localhost", "127.0.0.1", "::1"].map(str::to_owned).into();
    names.extend(extra_sans.iter().filter(|s| !s.is_empty()).cloned());
    let leaf = new_leaf(now, &names, DEVELOPMENT_VALIDITY, &ca)?;
    Ok(GeneratedCertificates {
        ca_pem: ca.cert,
        cert_pem: leaf.cert,
        key_pem: leaf.key,
    })
}

fn fresh(now: i64, policy: &CertPolicy, why: String) -> Result<Step, CertError> {
    let ca = new_managed_ca(now, policy.ca_validity)?;
    let leaf = new_leaf(now, &policy.names, policy.leaf_validity, &ca)?;
    Ok(Step::Write(
        Box::new(Stored {
            ca_bundle: ca.cert.clone(),
            ca_cert: ca.cert,
            ca_key: ca.key,
            tls_cert: leaf.cert,
            tls_key: leaf.key,
        }),
        why,
    ))
}

/// What the Secret should hold next; see the module's rules.
pub(crate) fn next(stored: Option<&Stored>, policy: &CertPolicy, now: SystemTime) -> Result<Step, CertError> {
    let now = unix(now);
    let Some(stored) = stored.filter(|s| !s.ca_cert.is_empty()) else {
        return fresh(now, policy, "no certificate stored yet".to_owned());
    };
    let parsed = (
        facts(&stored.ca_cert),
        facts(&stored.tls_cert),
        bundle_facts(&stored.ca_bundle),
        KeyPair::from_pem(&stored.ca_key).ok(),
        KeyPair::from_pem(&stored.tls_key).ok(),
    );
    let (Some(ca), Some(leaf), Some(bundle), Some(_), Some(_)) = parsed else {
        return fresh(now, policy, "the stored certificates cannot be read".to_owned());
    };
    if ca.not_after <= now || !bundle.iter().any(|b| b.subject == ca.subject) {
        return fresh(now, policy, "the stored CA has expired or is not trusted".to_owned());
    }

    let mut next = stored.clone();
    // 1. A CA in its last third: trust a new one beside it.
    if due(&ca, now) && bundle.len() == 1 {
        let new = new_managed_ca(now, policy.ca_validity)?;
        next.ca_bundle = format!("{}{}", new.cert, stored.ca_bundle);
        next.ca_cert = new.cert;
        next.ca_key = new.key;
        return Ok(Step::Write(
            Box::new(next),
            "CA rotation: a new CA is trusted beside the old one".to_owned(),
        ));
    }
    // 2. The serving certificate.
    let by_current_ca = leaf.issuer == ca.subject;
    let new_ca_trusted = now - issued(&ca) >= secs(policy.overlap);
    let why = if !by_current_ca && new_ca_trusted {
        Some("CA rotation: the new CA, trusted everywhere now, signs the serving certificate")
    } else if leaf.not_after <= now || (due(&leaf, now) && (by_current_ca || new_ca_trusted)) {
        Some("renewal: the serving certificate is in the last third of its validity")
    } else if leaf.names != policy.names && (by_current_ca || new_ca_trusted) {
        Some("the serving certificate's names changed")
    } else {
        None
    };
    if let Some(why) = why {
        let ca = Pair {
            cert: next.ca_cert.clone(),
            key: next.ca_key.clone(),
        };
        let leaf = new_leaf(now, &policy.names, policy.leaf_validity, &ca)?;
        next.tls_cert = leaf.cert;
        next.tls_key = leaf.key;
        return Ok(Step::Write(Box::new(next), why.to_owned()));
    }
    // 3. The old CA, once nothing it signed is served any more.
    if bundle.len() > 1 && by_current_ca && now - issued(&leaf) >= secs(policy.overlap) {
        next.ca_bundle = stored.ca_cert.clone();
        return Ok(Step::Write(
            Box::new(next),
            "CA rotation: the old CA is no longer trusted".to_owned(),
        ));
    }
    Ok(Step::Keep)
}

/// When a PEM certificate stops being valid (Unix seconds), for metrics.
pub(crate) fn not_after(pem: &str) -> Option<i64> {
    facts(pem).map(|f| f.not_after)
}

/// The names a serving certificate needs for the webhook at `target`, and
/// `extra`: a Service's DNS names, or a URL's host.
pub(crate) fn names_for(target: &crate::webhooks::WebhookTarget, extra: &[String]) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = extra.iter().filter(|n| !n.is_empty()).cloned().collect();
    match target {
        crate::webhooks::WebhookTarget::Service { namespace, name, .. } => {
            names.extend([
                name.clone(),
                format!("{name}.{namespace}"),
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ]);
        }
        crate::webhooks::WebhookTarget::Url(url) => {
            let uri = url.parse::<hyper::Uri>().ok();
            // An IPv6 host comes in brackets, which a certificate does not carry.
            let host = uri
                .as_ref()
                .and_then(hyper::Uri::host)
                .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
            names.extend(host.filter(|h| !h.is_empty()).map(str::to_owned));
        }
    }
    names
}

#[cfg(test)]
mod tests;
