//! A status UPDATE review with the members of the envelope, the request,
//! its objects and their statuses written in any order: reading and
//! deciding in one pass answers what parsing and then deciding answers, and
//! what the same review gets in the API server's order (where the single
//! pass reads the body once).
#![no_main]

#[path = "../common/mod.rs"]
mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use statusguard::admission::answer::{decide_request, read_and_decide};
use statusguard::admission::decide::Endpoint;
use statusguard::admission::wire::ReviewRequest;
use std::sync::LazyLock;

static RULES: LazyLock<[statusguard::ownership::Ownership; 3]> =
    LazyLock::new(|| [common::rules("enforce"), common::rules("trim"), common::rules("audit")]);

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(review) = review(&mut u) else { return };
    let api_server_order = common::member_order::write(&review, &mut |members| {
        members.sort_by_key(|(key, _)| api_server_rank(key))
    });
    let shuffled = common::member_order::write(&review, &mut |members| shuffle(&mut u, members));
    for rules in RULES.iter() {
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let mut answers = Vec::new();
            for body in [&api_server_order, &shuffled] {
                let one_pass = read_and_decide(rules, body, endpoint)
                    .map(|(request, decided)| format!("{}: {}", facts(&request), common::summary(decided)));
                let two_passes = statusguard::admission::wire::parse_request(body).map(|request| {
                    format!(
                        "{}: {}",
                        facts(&request),
                        common::summary(decide_request(rules, &request, endpoint))
                    )
                });
                let text = String::from_utf8_lossy(body);
                match (one_pass, two_passes) {
                    (Ok(one), Ok(two)) => {
                        assert_eq!(one, two, "one pass and two passes answer alike:\n{text}");
                        answers.push(one);
                    }
                    (one, two) => panic!("every order of a review is read: {one:?} {two:?}\n{text}"),
                }
            }
            assert_eq!(answers[0], answers[1], "the member order changes nothing");
        }
    }
});

/// What the request path reads of a request besides the decision (logs, the
/// observer): the single pass reads it as the wire does.
fn facts(request: &ReviewRequest<'_>) -> String {
    let metadata = |o: &Option<statusguard::admission::wire::ObjectView<'_>>| {
        o.as_ref().map(|o| {
            (
                o.metadata.uid.as_deref().map(str::to_owned),
                o.metadata.managed_fields.map(managed_fields),
            )
        })
    };
    format!(
        "{} {:?} {} {:?} {} {:?} {:?} {:?}",
        request.uid,
        request.kind,
        request.name,
        request.namespace,
        request.dry_run,
        request.field_manager,
        metadata(&request.object),
        metadata(&request.old_object)
    )
}

/// The managedFields as read: text written in another member order is the
/// same value.
fn managed_fields(text: &serde_json::value::RawValue) -> Option<Value> {
    serde_json::from_str(text.get()).ok()
}

/// A review of a Widget (or, now and then, of something the rules do not
/// read), with the head members varied.
fn review(u: &mut Unstructured<'_>) -> Result<Value> {
    let writer = common::WRITERS[u.int_in_range(0..=common::WRITERS.len() - 1)?];
    let old = common::status(u)?;
    // A write that changes nothing is the common case, and the one that
    // member order once broke; one that changes a member or a condition of
    // an otherwise equal status is taken by its text where it did not
    // change (issue 25).
    let new = match u.int_in_range(0..=2)? {
        0 => old.clone(),
        1 => common::status(u)?,
        _ => {
            let other = common::status(u)?;
            common::written_after(u, &old, other)?
        }
    };
    let mut review = common::review(writer, &old, &new);
    let request = &mut review["request"];
    if u.arbitrary()? {
        // A server-side apply: its options and the objects' managedFields.
        request["options"] = json!({"kind": "UpdateOptions", "fieldManager": "kubectl"});
        let managed = json!([{"manager": "kubectl", "operation": "Apply", "subresource": "status",
                              "fieldsV1": {"f:status": {"f:replicas": {}}}}]);
        request["object"]["metadata"]["managedFields"] = managed;
    }
    match u.int_in_range(0..=13)? {
        0 => request["operation"] = json!("CREATE"),
        1 => request["subResource"] = Value::Null,
        2 => {
            request.as_object_mut().map(|r| r.remove("subResource"));
        }
        3 => request["resource"]["resource"] = json!("others"),
        4 => request["oldObject"] = Value::Null,
        5 => {
            request.as_object_mut().map(|r| r.remove("object"));
        }
        6 => {
            request["object"].as_object_mut().map(|o| o.remove("status"));
        }
        7 => request["dryRun"] = json!(true),
        8 => request["kind"] = json!(["not", "a", "kind"]),
        9 => request["object"]["metadata"] = json!({"uid": 7, "name": "w"}),
        10 => request["options"] = json!("not options"),
        11 => request["oldObject"]["metadata"] = json!({"managedFields": null, "uid": "u"}),
        _ => {}
    }
    Ok(review)
}

/// Where the API server writes a member: the envelope's and the request's
/// in the order of Go's structs (the request's head before its objects),
/// any other after them in key order.
fn api_server_rank(key: &str) -> (usize, String) {
    const ENVELOPE: [&str; 3] = ["apiVersion", "kind", "request"];
    let mut order = ENVELOPE.iter().chain(&common::member_order::REQUEST_ORDER);
    (
        order
            .position(|k| *k == key)
            .unwrap_or(ENVELOPE.len() + common::member_order::REQUEST_ORDER.len()),
        key.to_owned(),
    )
}

fn shuffle(u: &mut Unstructured<'_>, members: &mut [(&String, &Value)]) {
    // Fisher-Yates; once the input runs out, the order is left as it is.
    for i in (1..members.len()).rev() {
        let j = u.int_in_range(0..=i).unwrap_or(i);
        members.swap(i, j);
    }
}
