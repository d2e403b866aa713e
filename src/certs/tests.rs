use std::collections::VecDeque;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

fn policy() -> CertPolicy {
    CertPolicy {
        names: ["statusguard.ns.svc".to_owned(), "127.0.0.1".to_owned()].into(),
        leaf_validity: Duration::from_secs(300),
        ca_validity: Duration::from_secs(900),
        overlap: Duration::from_secs(30),
    }
}

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

/// Does a client that trusts `bundle` accept `cert` for `name` at `time`?
fn trusted(bundle: &str, cert: &str, name: &str, time: SystemTime) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crate::tls::crypto_provider())
        .build()
        .unwrap();
    let leaf = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
    let now = UnixTime::since_unix_epoch(time.duration_since(UNIX_EPOCH).unwrap());
    verifier
        .verify_server_cert(&leaf, &[], &ServerName::try_from(name.to_owned()).unwrap(), &[], now)
        .is_ok()
}

fn written(step: Step) -> (Stored, String) {
    match step {
        Step::Write(stored, why) => (*stored, why),
        Step::Keep => panic!("expected a write"),
    }
}

#[test]
fn nothing_stored_makes_a_ca_and_a_serving_certificate_it_signs() {
    let (stored, why) = written(next(None, &policy(), at(0)).unwrap());
    assert_eq!(why, "no certificate stored yet");
    assert_eq!(stored.ca_bundle, stored.ca_cert);
    for name in ["statusguard.ns.svc", "127.0.0.1"] {
        assert!(trusted(&stored.ca_bundle, &stored.tls_cert, name, at(1)), "{name}");
    }
    assert!(!trusted(&stored.ca_bundle, &stored.tls_cert, "other.ns.svc", at(1)));
    // Back-dated: trusted by a client whose clock is behind.
    assert!(trusted(
        &stored.ca_bundle,
        &stored.tls_cert,
        "127.0.0.1",
        at(0) - Duration::from_secs(30)
    ));
    assert_eq!(next(Some(&stored), &policy(), at(10)).unwrap(), Step::Keep);
    // Unreadable: started again.
    let broken = Stored {
        tls_cert: "garbage".to_owned(),
        ..stored
    };
    assert_eq!(
        written(next(Some(&broken), &policy(), at(10)).unwrap()).1,
        "the stored certificates cannot be read"
    );
}

#[test]
fn a_new_name_reissues_the_serving_certificate_under_the_same_ca() {
    let (stored, _) = written(next(None, &policy(), at(0)).unwrap());
    let mut wider = policy();
    wider.names.insert("statusguard.example.com".to_owned());
    let (next_stored, why) = written(next(Some(&stored), &wider, at(10)).unwrap());
    assert_eq!(why, "the serving certificate's names changed");
    assert_eq!(next_stored.ca_bundle, stored.ca_bundle);
    assert!(trusted(
        &stored.ca_bundle,
        &next_stored.tls_cert,
        "statusguard.example.com",
        at(11)
    ));
}

/// Over several CA lifetimes, stepping every 5 s as a server's loop would.
/// Replicas load the Secret, and webhooks get its bundle, up to `lag` late
/// (less than the overlap): at every moment, every serving certificate some
/// replica may still serve is trusted by every bundle some webhook may still
/// hold. And renewals and rotations do happen.
#[test]
fn renewals_and_rotations_never_serve_what_a_recent_bundle_does_not_trust() {
    let policy = policy();
    let lag = 20;
    let (first, _) = written(next(None, &policy, at(0)).unwrap());
    // (since when, what the Secret held)
    let mut history: VecDeque<(u64, Stored)> = VecDeque::from([(0, first)]);
    let mut reasons: Vec<String> = Vec::new();
    for t in (5..=4000).step_by(5) {
        let current = &history.back().unwrap().1;
        if let Step::Write(next_stored, why) = next(Some(current), &policy, at(t)).unwrap() {
            history.push_back((t, *next_stored));
            reasons.push(why);
        }
        // What was stored within the lag, and the last state before it.
        while history.len() > 1 && t - history[1].0 >= lag {
            history.pop_front();
        }
        for (served_since, served) in &history {
            for (bundle_since, bundle) in &history {
                assert!(
                    trusted(&bundle.ca_bundle, &served.tls_cert, "statusguard.ns.svc", at(t)),
                    "at {t} s the certificate stored at {served_since} s is not trusted by the bundle of {bundle_since} s; steps: {reasons:?}"
                );
            }
        }
    }
    let count = |prefix: &str| reasons.iter().filter(|r| r.starts_with(prefix)).count();
    assert!(count("renewal") >= 3, "{reasons:?}");
    assert!(count("CA rotation: a new CA") >= 3, "{reasons:?}");
    assert_eq!(
        count("CA rotation: a new CA"),
        count("CA rotation: the old CA"),
        "{reasons:?}"
    );
}

#[test]
fn the_webhook_target_names_the_certificate() {
    let service: crate::cluster::registration::desired::WebhookTarget = "ns/sg:443".parse().unwrap();
    assert_eq!(
        names_for(&service, &["extra.example.com".to_owned()]),
        [
            "extra.example.com",
            "sg",
            "sg.ns",
            "sg.ns.svc",
            "sg.ns.svc.cluster.local"
        ]
        .map(str::to_owned)
        .into()
    );
    for (url, host) in [
        ("https://127.0.0.1:9443", "127.0.0.1"),
        ("https://webhook.example.com/base", "webhook.example.com"),
        ("https://[::1]:8443/", "::1"),
    ] {
        let target: crate::cluster::registration::desired::WebhookTarget = url.parse().unwrap();
        assert_eq!(names_for(&target, &[]), [host.to_owned()].into(), "{url}");
    }
}
