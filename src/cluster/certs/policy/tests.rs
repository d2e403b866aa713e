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
    let verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crate::cluster::certs::tls::crypto_provider())
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
    let (stored, why) = written(next(None, None, &policy(), at(0)).unwrap());
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
    assert_eq!(
        next(Some(&stored), Some(&stored), &policy(), at(10)).unwrap(),
        Step::Keep
    );
    // An unreadable serving certificate is made again, by the same CA.
    let broken = Stored {
        tls_cert: "garbage".to_owned(),
        ..stored.clone()
    };
    let (repaired, why) = written(next(Some(&broken), None, &policy(), at(10)).unwrap());
    assert_eq!(why, "repair: tls.crt cannot be read: a new serving certificate");
    assert_eq!(
        (&repaired.ca_cert, &repaired.ca_bundle),
        (&stored.ca_cert, &stored.ca_bundle)
    );
    assert!(trusted(&stored.ca_bundle, &repaired.tls_cert, "127.0.0.1", at(11)));
}

#[test]
fn a_new_name_reissues_the_serving_certificate_under_the_same_ca() {
    let (stored, _) = written(next(None, None, &policy(), at(0)).unwrap());
    let mut wider = policy();
    wider.names.insert("statusguard.example.com".to_owned());
    let (next_stored, why) = written(next(Some(&stored), Some(&stored), &wider, at(10)).unwrap());
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
    let (first, _) = written(next(None, None, &policy, at(0)).unwrap());
    // (since when, what the Secret held)
    let mut history: VecDeque<(u64, Stored)> = VecDeque::from([(0, first)]);
    let mut reasons: Vec<String> = Vec::new();
    for t in (5..=4000).step_by(5) {
        let current = &history.back().unwrap().1;
        if let Step::Write(next_stored, why) = next(Some(current), Some(current), &policy, at(t)).unwrap() {
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

/// The states a Secret goes through over a CA's life and a rotation, as the
/// loop would write them, each with the time it was written and the time
/// the next one replaced it.
fn timeline() -> &'static [(u64, u64, Stored)] {
    static TIMELINE: std::sync::OnceLock<Vec<(u64, u64, Stored)>> = std::sync::OnceLock::new();
    TIMELINE.get_or_init(|| {
        let policy = policy();
        let (first, _) = written(next(None, None, &policy, at(0)).unwrap());
        let mut states = vec![(0, first)];
        for t in (5..=1300).step_by(5) {
            let current = &states.last().unwrap().1;
            if let Step::Write(next_stored, _) = next(Some(current), Some(current), &policy, at(t)).unwrap() {
                states.push((t, *next_stored));
            }
        }
        states
            .iter()
            .zip(states.iter().skip(1).map(|(t, _)| *t).chain([1300]))
            .map(|((from, state), until)| (*from, until, state.clone()))
            .collect()
    })
}

/// A Secret and a foreign one whose parts fit nothing of the timeline's:
/// its keys from one, its certificates from another, so they never pair up.
fn foreign() -> &'static (Stored, Stored) {
    static FOREIGN: std::sync::OnceLock<(Stored, Stored)> = std::sync::OnceLock::new();
    FOREIGN.get_or_init(|| {
        let make = || written(next(None, None, &policy(), at(0)).unwrap()).0;
        (make(), make())
    })
}

/// The timeline's state at `t` seconds.
fn state_at(t: u64) -> Stored {
    let (_, _, state) = timeline().iter().rfind(|(from, _, _)| *from <= t).unwrap();
    state.clone()
}

/// Does `key` fit `cert`, as rustls loads a served pair?
fn loads(cert: &str, key: &str) -> bool {
    crate::cluster::certs::tls::certified_key(&crate::cluster::certs::tls::PemPair {
        cert: cert.as_bytes().to_vec(),
        key: key.as_bytes().to_vec(),
        cert_origin: "tls.crt".into(),
        key_origin: "tls.key".into(),
    })
    .is_ok()
}

/// Every part usable: the serving pair loads and the bundle trusts it, the
/// CA's key fits it and the bundle holds it.
fn assert_usable(stored: &Stored, time: SystemTime) {
    assert!(loads(&stored.tls_cert, &stored.tls_key), "the serving pair loads");
    assert!(
        trusted(&stored.ca_bundle, &stored.tls_cert, "statusguard.ns.svc", time),
        "the bundle trusts the serving certificate"
    );
    let ca = read::Cert::first_of(&stored.ca_cert).unwrap();
    assert!(ca.fits(&stored.ca_key), "ca.key fits ca-signing.crt");
    assert!(
        read::bundle(&stored.ca_bundle).0.contains(&ca),
        "the bundle holds the CA"
    );
}

fn is_repair(why: &str) -> bool {
    why.starts_with("repair") || why.starts_with("the Secret is empty") || why == "no certificate stored yet"
}

#[test]
fn an_emptied_or_deleted_secret_gets_back_the_ca_the_replica_holds() {
    for t in [10, 400, 620, 660, 1000] {
        let held = state_at(t);
        for stored in [None, Some(Stored::default())] {
            let (back, why) = written(next(stored.as_ref(), Some(&held), &policy(), at(t)).unwrap());
            assert_eq!(
                why,
                "the Secret is empty or gone: it gets back the certificates this replica serves"
            );
            assert_eq!(back.ca_cert, held.ca_cert, "at {t} s: the same CA");
            assert_eq!(back.ca_key, held.ca_key);
            assert_eq!(back.tls_cert, held.tls_cert, "at {t} s: the same serving certificate");
            assert_eq!(
                read::bundle(&back.ca_bundle),
                read::bundle(&held.ca_bundle),
                "at {t} s: the same bundle"
            );
        }
    }
}

#[test]
fn a_serving_key_that_does_not_fit_is_replaced_by_the_trusted_ca_or_by_the_one_in_hand() {
    let (other, _) = foreign();
    // The CA, made at 0 s, is trusted from 30 s on.
    for (t, in_hand_kept) in [(10, true), (100, false)] {
        let good = state_at(t);
        let mismatched = Stored {
            tls_key: other.tls_key.clone(),
            ..good.clone()
        };
        let (repaired, why) = written(next(Some(&mismatched), Some(&good), &policy(), at(t)).unwrap());
        assert!(why.starts_with("repair: tls.key does not fit tls.crt"), "{why}");
        assert_eq!(repaired.ca_cert, good.ca_cert);
        assert_eq!(repaired.tls_cert == good.tls_cert, in_hand_kept, "at {t} s: {why}");
        assert_usable(&repaired, at(t));
        assert!(trusted(
            &good.ca_bundle,
            &repaired.tls_cert,
            "statusguard.ns.svc",
            at(t)
        ));
    }
}

/// A `ca.key` that does not fit is replaced through the overlap: a new CA
/// beside the old, which keeps signing what is served until the new one is
/// trusted; then the rotation runs its course.
#[test]
fn a_ca_key_that_does_not_fit_starts_a_rotation_through_the_overlap() {
    let (other, _) = foreign();
    let good = state_at(100);
    let mismatched = Stored {
        ca_key: other.ca_key.clone(),
        ..good.clone()
    };
    let (mut current, why) = written(next(Some(&mismatched), Some(&good), &policy(), at(100)).unwrap());
    assert_eq!(
        why,
        "repair: ca.key does not fit ca-signing.crt: a new CA is trusted beside the old one"
    );
    assert_ne!(current.ca_cert, good.ca_cert);
    assert_eq!(current.tls_cert, good.tls_cert, "what is served stays");
    assert_eq!(read::bundle(&current.ca_bundle).0.len(), 2);
    assert_usable(&current, at(100));
    let mut reasons = Vec::new();
    for t in (105..=200).step_by(5) {
        if let Step::Write(next_stored, why) = next(Some(&current), Some(&current), &policy(), at(t)).unwrap() {
            assert!(!is_repair(&why), "{why}");
            // Replicas and webhooks a step behind still agree.
            for (served, bundle) in [(&current, &*next_stored), (&*next_stored, &current)] {
                assert!(
                    trusted(&bundle.ca_bundle, &served.tls_cert, "statusguard.ns.svc", at(t)),
                    "{why}"
                );
            }
            current = *next_stored;
            reasons.push(why);
        }
    }
    assert_eq!(
        reasons,
        [
            "CA rotation: the new CA, trusted everywhere now, signs the serving certificate",
            "CA rotation: the old CA is no longer trusted"
        ]
    );
}

#[test]
fn garbage_in_ca_crt_keeps_the_ca_and_trusts_what_is_served() {
    // 620 s: mid-rotation, the bundle holds two CAs and the old one signed
    // what is served.
    for t in [100, 620, 660] {
        let good = state_at(t);
        for garbage in ["garbage", "-----BEGIN CERTIFICATE-----\nMIIB\n", ""] {
            let broken = Stored {
                ca_bundle: garbage.to_owned(),
                ..good.clone()
            };
            let (repaired, why) = written(next(Some(&broken), Some(&good), &policy(), at(t)).unwrap());
            assert!(why.starts_with("repair: ca.crt"), "{why}");
            assert_eq!(
                (&repaired.ca_cert, &repaired.tls_cert),
                (&good.ca_cert, &good.tls_cert),
                "at {t} s: {why}"
            );
            assert!(
                trusted(&repaired.ca_bundle, &good.tls_cert, "statusguard.ns.svc", at(t)),
                "at {t} s"
            );
            assert_usable(&repaired, at(t));
            // A replica that serves nothing yet cannot know a CA that only
            // the damaged bundle named: it keeps the CA, and what it serves
            // is trusted by the bundle the webhooks hold.
            let (repaired, why) = written(next(Some(&broken), None, &policy(), at(t)).unwrap());
            assert_eq!(repaired.ca_cert, good.ca_cert, "at {t} s: {why}");
            assert!(trusted(
                &good.ca_bundle,
                &repaired.tls_cert,
                "statusguard.ns.svc",
                at(t)
            ));
            assert_usable(&repaired, at(t));
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Kept,
    Emptied,
    Garbage,
    /// A valid certificate or key that belongs to another Secret.
    Foreign,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::Kept),
        Just(Damage::Emptied),
        Just(Damage::Garbage),
        Just(Damage::Foreign)
    ]
}

fn apply(damage: Damage, part: &mut String, foreign: &str) {
    match damage {
        Damage::Kept => {}
        Damage::Emptied => part.clear(),
        Damage::Garbage => *part = "garbage\n".to_owned(),
        Damage::Foreign => *part = foreign.to_owned(),
    }
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever was done to the Secret's parts, one step makes every part
    /// usable again; it keeps the CA unless the CA's own pair was damaged
    /// or, with nothing damaged, the CA's rotation falls due at that moment
    /// (the timeline writes its states every 5 s, so its CA can be a few
    /// seconds into its last third); and with a replica serving, neither
    /// what it serves nor what the webhooks trust stops being trusted.
    #[test]
    fn any_damage_is_repaired_in_one_step_without_a_moment_of_distrust(
        t in 0u64..1300,
        parts in proptest::array::uniform5(damage()),
        serving in any::<bool>(),
    ) {
        let good = state_at(t);
        let (keys, certs) = foreign();
        let mut damaged = good.clone();
        apply(parts[0], &mut damaged.ca_bundle, &certs.ca_bundle);
        apply(parts[1], &mut damaged.ca_cert, &certs.ca_cert);
        apply(parts[2], &mut damaged.ca_key, &keys.ca_key);
        apply(parts[3], &mut damaged.tls_cert, &certs.tls_cert);
        apply(parts[4], &mut damaged.tls_key, &keys.tls_key);
        let in_hand = serving.then_some(&good);
        let now = at(t);
        let (after, why) = match next(Some(&damaged), in_hand, &policy(), now).unwrap() {
            Step::Write(after, why) => (*after, why),
            Step::Keep => (damaged.clone(), String::new()),
        };
        assert_usable(&after, now);
        if let Step::Write(_, again) = next(Some(&after), Some(&after), &policy(), now).unwrap() {
            prop_assert!(!is_repair(&again), "{why}, then {again}");
        }
        // A scheduled rotation is a healthy Secret's step, never a repair's,
        // and it trusts the new CA beside the old one.
        let rotated = why.starts_with("CA rotation: a new CA");
        if rotated {
            let old_ca = read::Cert::first_of(&good.ca_cert).unwrap();
            prop_assert!(parts.iter().all(|d| matches!(d, Damage::Kept)), "{}", why);
            prop_assert!(due(&old_ca, unix(now)), "a rotation only once the CA is due: {}", why);
            prop_assert!(read::bundle(&after.ca_bundle).0.contains(&old_ca), "the old CA stays trusted: {}", why);
        }
        let ca_pair = (parts[1], parts[2]);
        if !rotated && (matches!(ca_pair, (Damage::Kept, Damage::Kept)) || (serving && matches!(ca_pair, (Damage::Emptied, Damage::Emptied)))) {
            prop_assert_eq!(&after.ca_cert, &good.ca_cert, "{}", why);
        }
        if serving {
            prop_assert!(trusted(&after.ca_bundle, &good.tls_cert, "statusguard.ns.svc", now), "what is served stays trusted: {}", why);
            prop_assert!(trusted(&good.ca_bundle, &after.tls_cert, "statusguard.ns.svc", now), "what the webhooks hold trusts what is served next: {}", why);
        }
    }
}

/// An undamaged Secret, at every second of the timeline, served or not:
/// its one step is the policy's own (nothing, or the next step of a
/// rotation or a renewal), never a repair, and it leaves every part usable
/// and what was served trusted. The timeline writes its states every 5 s,
/// so at some seconds its state is a step behind the policy.
#[test]
fn an_undamaged_secret_takes_only_the_policys_own_steps_at_every_second() {
    for t in 0..1300 {
        let good = state_at(t);
        for in_hand in [None, Some(&good)] {
            let now = at(t);
            let after = match next(Some(&good), in_hand, &policy(), now).unwrap() {
                Step::Write(after, why) => {
                    assert!(!is_repair(&why), "at {t} s: {why}");
                    *after
                }
                Step::Keep => good.clone(),
            };
            assert_usable(&after, now);
            assert!(
                trusted(&after.ca_bundle, &good.tls_cert, "statusguard.ns.svc", now),
                "at {t} s: what is served stays trusted"
            );
            assert!(
                trusted(&good.ca_bundle, &after.tls_cert, "statusguard.ns.svc", now),
                "at {t} s: what the webhooks hold trusts what is served next"
            );
        }
    }
}
