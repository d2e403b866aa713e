//! The certificate authority the server keeps for itself, in one Secret
//! shared by its replicas: a CA, its key, and a serving certificate it
//! signs, renewed and rotated without a moment in which the API server would
//! not trust what a replica serves.
//!
//! `next` is pure: given what the Secret holds, what this replica serves,
//! the policy and the time, it says what the Secret should hold next.
//!
//! First, what is unusable is repaired, whatever state the Secret is in:
//! - an empty or deleted Secret gets back what this replica serves (the CA
//!   the replicas already hold, never a new one); with nothing served yet,
//!   a new CA and serving certificate;
//! - a CA that cannot sign (unreadable, expired, or a `ca.key` that does not
//!   fit `ca-signing.crt`) is replaced through the overlap: a new CA is
//!   added to the bundle beside the old one, which keeps serving until the
//!   rules below move on;
//! - a serving certificate that cannot be served (unreadable, expired, a
//!   `tls.key` that does not fit `tls.crt`) is re-issued by the CA when
//!   that CA is trusted everywhere, else replaced by the one this replica
//!   serves;
//! - the bundle (`ca.crt`) always holds the CA that signs and the CA that
//!   signed the serving certificate; when it was damaged, also the CA of
//!   what this replica serves. Garbage is dropped, never trusted instead.
//!
//! Then the rules of a healthy Secret:
//! - the CA in its last third of validity: a new CA is **added** to the
//!   trust bundle (`ca.crt` then holds both), the serving certificate stays;
//! - the serving certificate is re-issued by the newest CA when it is in its
//!   last third, when the names it must carry changed, or when a new CA has
//!   been in the bundle for the overlap (long enough for every webhook's
//!   `caBundle` to hold it);
//! - the old CA leaves the bundle once the serving certificate of the new
//!   one has been out for the overlap (every replica has loaded it).
//!
//! Certificates are back-dated by `BACKDATE` against clock skew between
//! the server and the API server.
//!
//! This is also the one home of rcgen (the development CA of `serve` and
//! `gen-certs` is made by the same functions) and, in `read`, of PEM and
//! X.509 parsing.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

pub(crate) mod read;

use read::{Cert, Pair, Part, Read, Usable};
pub(crate) use read::{pem_certificates, pem_private_key};

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
    /// A certificate just made does not read back.
    #[error("a certificate just made cannot be read back")]
    Unreadable,
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
fn issued(cert: &Cert) -> i64 {
    cert.not_before + secs(BACKDATE)
}

/// In the last third of its validity.
fn due(cert: &Cert, now: i64) -> bool {
    let lifetime = cert.not_after - issued(cert);
    cert.not_after - now < lifetime / 3
}

/// A new CA called `name`, valid from now (back-dated) for `validity`.
fn new_ca(name: &str, now: i64, validity: Duration) -> Result<Usable, CertError> {
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
    made(&cert, &key)
}

fn made(cert: &rcgen::Certificate, key: &KeyPair) -> Result<Usable, CertError> {
    Ok(Usable {
        cert: Cert::from_der(cert.der()).ok_or(CertError::Unreadable)?,
        pair: Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        },
    })
}

/// A serving certificate for `names` (DNS names or IP addresses), signed by
/// `ca`, valid from now (back-dated) for `validity` but never beyond the CA.
fn new_leaf(now: i64, names: &BTreeSet<String>, validity: Duration, ca: &Pair) -> Result<Usable, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let ca_end = Cert::first_of(&ca.cert).map_or(i64::MAX, |c| c.not_after);
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
    made(&cert, &key)
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
    let leaf = new_leaf(now, &names, DEVELOPMENT_VALIDITY, &ca.pair)?;
    Ok(GeneratedCertificates {
        ca_pem: ca.pair.cert,
        cert_pem: leaf.pair.cert,
        key_pem: leaf.pair.key,
    })
}

/// Where a part of the next Secret comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Secret,
    /// What this replica serves.
    InHand,
    New,
}

/// What the Secret should hold next; see the module's rules. `in_hand` is
/// what this replica serves (`None` before its first certificate).
pub(crate) fn next(
    stored: Option<&Stored>,
    in_hand: Option<&Stored>,
    policy: &CertPolicy,
    now: SystemTime,
) -> Result<Step, CertError> {
    let now = unix(now);
    let stored = stored.cloned().unwrap_or_default();
    let secret = Read::of(&stored, now);
    let hand = in_hand.map(|h| Read::of(h, now));
    let mut notes: Vec<String> = Vec::new();

    // The CA that signs.
    let (ca, ca_from) = match (&secret.ca, hand.as_ref().and_then(Read::usable_ca)) {
        (Part::Usable(ca), _) => (ca.clone(), Source::Secret),
        (Part::Absent, Some(held)) => {
            notes.push("ca-signing.crt and ca.key are missing: the CA this replica holds is written back".to_owned());
            (held.clone(), Source::InHand)
        }
        (part, _) => {
            notes.push(match part {
                Part::Damaged(why) => format!("{why}: a new CA is trusted beside the old one"),
                _ => "ca-signing.crt and ca.key are missing: a new CA".to_owned(),
            });
            (new_managed_ca(now, policy)?, Source::New)
        }
    };
    // Trusted everywhere: in the bundle the webhooks were given, for the overlap.
    let ca_trusted =
        ca_from != Source::New && secret.bundle.contains(&ca.cert) && now - issued(&ca.cert) >= secs(policy.overlap);

    // The serving certificate, with the CA that signed it.
    let issuer_of = |leaf: &Cert| -> Option<Cert> {
        let held = hand.iter().flat_map(Read::issuers);
        std::iter::once(&ca.cert)
            .chain(secret.issuers())
            .chain(held)
            .find(|issuer| leaf.signed_by(issuer))
            .cloned()
    };
    let signed = |part: &Part| match part {
        Part::Usable(leaf) => Some(
            issuer_of(&leaf.cert)
                .map(|i| (leaf.clone(), i))
                .ok_or("no CA at hand signed tls.crt"),
        ),
        Part::Absent => None,
        Part::Damaged(why) => Some(Err(*why)),
    };
    let served = hand.as_ref().and_then(|h| signed(&h.leaf)).and_then(Result::ok);
    let ((leaf, issuer), leaf_from) = match (signed(&secret.leaf), &served) {
        (Some(Ok(leaf)), _) => (leaf, Source::Secret),
        (None, Some(served)) => {
            notes.push(
                "tls.crt and tls.key are missing: the serving certificate this replica serves is written back"
                    .to_owned(),
            );
            (served.clone(), Source::InHand)
        }
        (Some(Err(why)), Some(served)) if !ca_trusted => {
            notes.push(format!(
                "{why}: the serving certificate this replica serves is kept until a new CA is trusted"
            ));
            (served.clone(), Source::InHand)
        }
        (damage, _) => {
            notes.push(match damage {
                Some(Err(why)) => format!("{why}: a new serving certificate"),
                _ => "tls.crt and tls.key are missing: a new serving certificate".to_owned(),
            });
            let leaf = new_leaf(now, &policy.names, policy.leaf_validity, &ca.pair)?;
            ((leaf, ca.cert.clone()), Source::New)
        }
    };

    // The bundle: the CA that signs, the CA of the serving certificate, and
    // what else the Secret trusted (what this replica trusted, when the
    // Secret's bundle is gone); when it was damaged, also the CA of what
    // this replica serves.
    let trusted_before = match (secret.bundle.is_empty(), &hand) {
        (true, Some(hand)) => &hand.bundle,
        _ => &secret.bundle,
    };
    // A CA just made is not in the bundle yet: that is no damage.
    let lacks = |cert: &Cert| !secret.bundle.contains(cert);
    let damaged = secret.bundle_broken || (ca_from != Source::New && lacks(&ca.cert)) || lacks(&issuer);
    let served_by = served.as_ref().map(|(_, by)| by).filter(|_| damaged);
    let mut bundle: Vec<Cert> = Vec::new();
    let wanted = [&ca.cert, &issuer].into_iter().chain(trusted_before).chain(served_by);
    for cert in wanted.filter(|c| c.not_after > now) {
        if !bundle.contains(cert) {
            bundle.push(cert.clone());
        }
    }
    let bundle_changed = secret.bundle_broken || bundle.len() != secret.bundle.len() || bundle.iter().any(lacks);
    if secret.bundle.is_empty() && !secret.bundle_broken {
        notes.push("ca.crt is missing: it is written with the CAs in use".to_owned());
    } else if damaged {
        notes.push("ca.crt lacked a CA in use or held garbage: it is written with the CAs in use".to_owned());
    } else if secret.bundle.iter().any(|c| c.not_after <= now) {
        notes.push("ca.crt held an expired CA: it is dropped".to_owned());
    }

    if ca_from == Source::Secret && leaf_from == Source::Secret && !bundle_changed {
        return healthy(&stored, policy, now, &ca.cert, &leaf.cert, secret.bundle.len());
    }
    let why = match (secret.all_absent(), in_hand.is_some()) {
        (true, false) => "no certificate stored yet".to_owned(),
        (true, true) => "the Secret is empty or gone: it gets back the certificates this replica serves".to_owned(),
        (false, _) => format!("repair: {}", notes.join("; ")),
    };
    let ca_bundle = match bundle_changed {
        true => bundle.iter().map(Cert::pem).collect(),
        false => stored.ca_bundle,
    };
    Ok(Step::Write(
        Box::new(Stored {
            ca_bundle,
            ca_cert: ca.pair.cert,
            ca_key: ca.pair.key,
            tls_cert: leaf.pair.cert,
            tls_key: leaf.pair.key,
        }),
        why,
    ))
}

/// A CA for the Secret; unique by name, for a reader of the certificates.
fn new_managed_ca(now: i64, policy: &CertPolicy) -> Result<Usable, CertError> {
    new_ca(&format!("statusguard CA {now}"), now, policy.ca_validity)
}

/// The rules of a Secret whose every part is usable.
fn healthy(
    stored: &Stored,
    policy: &CertPolicy,
    now: i64,
    ca: &Cert,
    leaf: &Cert,
    bundle_len: usize,
) -> Result<Step, CertError> {
    let mut next = stored.clone();
    // 1. A CA in its last third: trust a new one beside it.
    if due(ca, now) && bundle_len == 1 {
        let new = new_managed_ca(now, policy)?.pair;
        next.ca_bundle = format!("{}{}", new.cert, stored.ca_bundle);
        next.ca_cert = new.cert;
        next.ca_key = new.key;
        return Ok(Step::Write(
            Box::new(next),
            "CA rotation: a new CA is trusted beside the old one".to_owned(),
        ));
    }
    // 2. The serving certificate.
    let by_current_ca = leaf.signed_by(ca);
    let new_ca_trusted = now - issued(ca) >= secs(policy.overlap);
    let why = if !by_current_ca && new_ca_trusted {
        Some("CA rotation: the new CA, trusted everywhere now, signs the serving certificate")
    } else if due(leaf, now) && (by_current_ca || new_ca_trusted) {
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
        let leaf = new_leaf(now, &policy.names, policy.leaf_validity, &ca)?.pair;
        next.tls_cert = leaf.cert;
        next.tls_key = leaf.key;
        return Ok(Step::Write(Box::new(next), why.to_owned()));
    }
    // 3. The old CA, once nothing it signed is served any more.
    if bundle_len > 1 && by_current_ca && now - issued(leaf) >= secs(policy.overlap) {
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
    Cert::first_of(pem).map(|c| c.not_after)
}

/// The names a serving certificate needs for the webhook at `target`, and
/// `extra`: a Service's DNS names, or a URL's host.
pub(crate) fn names_for(
    target: &crate::cluster::registration::desired::WebhookTarget,
    extra: &[String],
) -> BTreeSet<String> {
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
