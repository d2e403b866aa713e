use super::*;
use crate::admission::answer::{Verdict, answer};
use crate::admission::decide::{Endpoint, Outcome};
use crate::ownership::Ownership;

/// The client certificate is loaded once, with its key checked against
/// it; a wrong pair is named before any webhook is called.
#[test]
fn a_client_certificate_loads_only_with_its_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let (one, other) = (
        crate::cluster::certs::policy::generate_certificates(&[]).unwrap(),
        crate::cluster::certs::policy::generate_certificates(&[]).unwrap(),
    );
    let files = CertFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&files.cert, &one.cert_pem).unwrap();
    std::fs::write(&files.key, &one.key_pem).unwrap();
    let identity = ClientIdentity::load(&files).unwrap();
    assert_eq!(identity.chain.len(), 1);
    std::fs::write(&files.key, &other.key_pem).unwrap();
    assert!(matches!(
        ClientIdentity::load(&files),
        Err(crate::cluster::certs::tls::TlsError::KeyMismatch(_))
    ));
}

/// The probe's review is what the server reads as a status UPDATE of the
/// guarded resource, and it is allowed in every mode at both endpoints:
/// a failed probe then means the path, not the write.
#[test]
fn the_probe_review_is_a_guarded_no_op_every_mode_allows() {
    let resource = Resource {
        group: "example.com".to_owned(),
        version: "v1".to_owned(),
        resource: "widgets".to_owned(),
    };
    let body = serde_json::to_vec(&probe_review(&resource, "uid-probe")).unwrap();
    for mode in ["enforce", "trim", "audit"] {
        let text =
            include_str!("../../../tests/fixtures/ownership.yaml").replace("mode: enforce", &format!("mode: {mode}"));
        let rules = Ownership::from_yaml(&text).unwrap();
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let answered = answer(Some(&rules), &body, endpoint);
            assert_eq!(answered.http_status, 200, "{mode}/{}", endpoint.as_str());
            let Verdict::Decided(decision) = answered.verdict else {
                panic!("{mode}/{}: not decided: {:?}", endpoint.as_str(), answered.verdict);
            };
            assert_eq!(decision.outcome, Outcome::Allowed, "{mode}/{}", endpoint.as_str());
            assert_eq!(
                decision.labels.resource, "widgets",
                "{mode}: not read as the guarded resource"
            );
            let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&answered.body).unwrap();
            let response = review.response.unwrap();
            assert_eq!(response.uid, "uid-probe");
            assert!(
                response.allowed,
                "{mode}/{}: {}",
                endpoint.as_str(),
                response.result.message
            );
            assert!(response.patch.is_none(), "{mode}: a no-op was patched");
        }
    }
}
