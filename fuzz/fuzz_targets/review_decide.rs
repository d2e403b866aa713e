//! Any body, on both endpoints and in every mode: the pipeline never
//! panics, whatever it answers with 200 is a review echoing the uid, and
//! reading and deciding in one pass answers what parsing and then deciding
//! answers. In trim mode, `/validate` (which proves items changed by their
//! fingerprints, unbuilt) names the violations `/mutate` (which builds and
//! compares them) names.
#![no_main]

#[path = "../common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use statusguard::admission::answer::answer;
use statusguard::admission::answer::{decide_request, read_and_decide};
use statusguard::admission::decide::Endpoint;
use std::sync::LazyLock;

static RULES: LazyLock<[statusguard::ownership::Ownership; 3]> =
    LazyLock::new(|| [common::rules("enforce"), common::rules("trim"), common::rules("audit")]);

fuzz_target!(|body: &[u8]| {
    let trim = &RULES[1];
    let violations = |endpoint| match read_and_decide(trim, body, endpoint) {
        Ok((_, Ok(decision))) => Some(decision.violations),
        _ => None,
    };
    if let (Some(proven), Some(built)) = (violations(Endpoint::Validate), violations(Endpoint::Mutate)) {
        assert_eq!(proven, built, "proofs by fingerprint name what building names");
    }
    for rules in RULES.iter() {
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let answer = answer(Some(rules), body, endpoint);
            let one_pass = read_and_decide(rules, body, endpoint).map(|(_, decided)| common::summary(decided));
            let two_passes = statusguard::admission::wire::parse_request(body)
                .map(|request| common::summary(decide_request(rules, &request, endpoint)));
            match (one_pass, two_passes) {
                (Ok(one), Ok(two)) => assert_eq!(one, two, "one pass and two passes answer alike"),
                (one, two) => assert_eq!(one.is_ok(), two.is_ok(), "one pass and two passes read alike"),
            }
            if answer.http_status == 200 {
                let sent: serde_json::Value = serde_json::from_slice(&answer.body).expect("a 200 answer is JSON");
                let uid = answer.request.as_ref().map(|r| r.uid.as_str());
                assert_eq!(sent["response"]["uid"].as_str(), uid, "the uid is echoed");
                assert_eq!(sent["kind"], "AdmissionReview");
            } else {
                assert!(matches!(answer.http_status, 400 | 500), "{}", answer.http_status);
            }
        }
    }
});
