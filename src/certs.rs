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

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use x509_parser::extensions::GeneralName;

/// How far back a new certificate's validity starts.
pub const BACKDATE: Duration = Duration::from_secs(60);

/// The keys of the Secret.
pub mod keys {
    /// The trust bundle: the newest CA first, then the one it replaces
    /// during a rotation.
    pub const CA_BUNDLE: &str = "ca.crt";
    /// The newest CA's certificate, which signs serving certificates.
    pub const CA_CERT: &str = "ca-signing.crt";
    /// The newest CA's private key.
    pub const CA_KEY: &str = "ca.key";
    /// The serving certificate.
    pub const TLS_CERT: &str = "tls.crt";
    /// Its private key.
    pub const TLS_KEY: &str = "tls.key";
}

/// What the server's certificates must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPolicy {
    /// Every DNS name and IP address the serving certificate carries.
    pub names: BTreeSet<String>,
    /// How long a serving certificate is valid.
    pub leaf_validity: Duration,
    /// How long a CA is valid.
    pub ca_validity: Duration,
    /// How long a new CA is trusted before it signs what is served, and how
    /// long the old CA is still trusted after.
    pub overlap: Duration,
}

/// What the Secret holds (PEM text).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stored {
    /// The trust bundle.
    pub ca_bundle: String,
    /// The newest CA.
    pub ca_cert: String,
    /// Its key.
    pub ca_key: String,
    /// The serving certificate.
    pub tls_cert: String,
    /// Its key.
    pub tls_key: String,
}

/// What to do with the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
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

/// What [`next`] reads of a certificate.
#[derive(Debug, Clone)]
struct Facts {
    subject: String,
    issuer: String,
    not_before: i64,
    not_after: i64,
    names: BTreeSet<String>,
}

fn facts(pem: &[u8]) -> Option<Facts> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
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

/// Every certificate of a PEM bundle.
fn bundle_facts(pem: &str) -> Option<Vec<Facts>> {
    let blocks: Vec<String> = pem
        .split_inclusive("-----END CERTIFICATE-----")
        .filter(|b| b.contains("-----BEGIN CERTIFICATE-----"))
        .map(str::to_owned)
        .collect();
    blocks.iter().map(|b| facts(b.trim_start().as_bytes())).collect()
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

/// A new CA, valid from now (back-dated) for `validity`; unique by name, so
/// that a serving certificate's issuer names its CA.
fn new_ca(now: i64, validity: Duration) -> Result<(String, String), CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("statusguard CA {now}"));
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
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving certificate for `policy.names`, signed by the CA, never valid
/// beyond it.
fn new_leaf(now: i64, policy: &CertPolicy, ca_cert: &str, ca_key: &str) -> Result<(String, String), CertError> {
    let ca_key = KeyPair::from_pem(ca_key)?;
    let ca_end = facts(ca_cert.as_bytes()).map_or(i64::MAX, |f| f.not_after);
    let issuer = Issuer::from_ca_cert_pem(ca_cert, ca_key)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    for name in &policy.names {
        params.subject_alt_names.push(match name.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(name.clone().try_into()?),
        });
    }
    params.distinguished_name.push(DnType::CommonName, "statusguard");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.not_before = offset(now - secs(BACKDATE));
    params.not_after = offset(now.saturating_add(secs(policy.leaf_validity)).min(ca_end));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn fresh(now: i64, policy: &CertPolicy, why: String) -> Result<Step, CertError> {
    let (ca_cert, ca_key) = new_ca(now, policy.ca_validity)?;
    let (tls_cert, tls_key) = new_leaf(now, policy, &ca_cert, &ca_key)?;
    Ok(Step::Write(
        Box::new(Stored {
            ca_bundle: ca_cert.clone(),
            ca_cert,
            ca_key,
            tls_cert,
            tls_key,
        }),
        why,
    ))
}

/// What the Secret should hold next; see the module's rules.
pub fn next(stored: Option<&Stored>, policy: &CertPolicy, now: SystemTime) -> Result<Step, CertError> {
    let now = unix(now);
    let Some(stored) = stored.filter(|s| !s.ca_cert.is_empty()) else {
        return fresh(now, policy, "no certificate stored yet".to_owned());
    };
    let parsed = (
        facts(stored.ca_cert.as_bytes()),
        facts(stored.tls_cert.as_bytes()),
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
        let (ca_cert, ca_key) = new_ca(now, policy.ca_validity)?;
        next.ca_bundle = format!("{}{}", ca_cert, stored.ca_bundle);
        next.ca_cert = ca_cert;
        next.ca_key = ca_key;
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
        let (tls_cert, tls_key) = new_leaf(now, policy, &next.ca_cert, &next.ca_key)?;
        next.tls_cert = tls_cert;
        next.tls_key = tls_key;
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
pub fn not_after(pem: &str) -> Option<i64> {
    facts(pem.as_bytes()).map(|f| f.not_after)
}

/// The names a serving certificate needs for the webhook at `target`, and
/// `extra`: a Service's DNS names, or a URL's host.
pub fn names_for(target: &crate::cluster::registration::desired::WebhookTarget, extra: &[String]) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = extra.iter().filter(|n| !n.is_empty()).cloned().collect();
    match target {
        crate::cluster::registration::desired::WebhookTarget::Service { namespace, name, .. } => {
            names.extend([
                name.clone(),
                format!("{name}.{namespace}"),
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ]);
        }
        crate::cluster::registration::desired::WebhookTarget::Url(url) => {
            let host = url
                .trim_start_matches("https://")
                .split(['/', '?', '#'])
                .next()
                .unwrap_or_default();
            // [v6]:port, host:port, or host alone.
            let host = match host.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None => host.rsplit_once(':').map_or(host, |(h, _)| h),
            };
            if !host.is_empty() {
                names.insert(host.to_owned());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests;
