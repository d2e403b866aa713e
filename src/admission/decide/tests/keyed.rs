//! Keyed lists: Gateway API's `status.parents`, keyed by `controllerName`.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{answered, apply, decide_json, in_api_server_order, items};
use crate::admission::answer::{decide_request, read_and_decide};
use crate::admission::decide::{Endpoint, Outcome};
use crate::admission::wire::parse_request;
use crate::ownership::{Ownership, same_value};

const ENVOY: &str = "system:serviceaccount:envoy-gateway-system:envoy-gateway";
const ISTIOD: &str = "system:serviceaccount:istio-system:istiod";
const ENVOY_KEY: &str = "gateway.envoyproxy.io/gatewayclass-controller";
const ISTIO_KEY: &str = "istio.io/gateway-controller";
/// A controllerName with every character the pattern allows that a naive
/// message format would misread.
const ODD_KEY: &str = "example.com/a=b,c;d:e'f]";

fn rules(mode: &str) -> Ownership {
    let text = format!(
        "apiVersion: statusguard.dev/v1alpha1
kind: StatusOwnership
mode: {mode}
resources:
  - group: gateway.networking.k8s.io
    resource: httproutes
    lists:
      - path: parents
        key: controllerName
    writers:
      - serviceAccount: envoy-gateway-system/envoy-gateway
        entries:
          parents: [{ENVOY_KEY}]
      - serviceAccount: istio-system/istiod
        conditions: [Accepted]
        entries:
          parents: [\"{ISTIO_KEY}\", \"{ODD_KEY}\"]
"
    );
    Ownership::from_yaml(&text).unwrap()
}

fn review(user: &str, old: Value, new: Value) -> Value {
    let object = |status: Value| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "r", "namespace": "ns"}, "spec": {"hostnames": ["x"]}, "status": status})
    };
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "gateway.networking.k8s.io", "version": "v1", "kind": "HTTPRoute"},
            "resource": {"group": "gateway.networking.k8s.io", "version": "v1", "resource": "httproutes"},
            "subResource": "status",
            "name": "r", "namespace": "ns", "operation": "UPDATE",
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": object(new),
            "oldObject": object(old),
        }
    })
}

fn decision(
    mode: &str,
    user: &str,
    old: &Value,
    new: &Value,
    endpoint: Endpoint,
) -> crate::admission::decide::Decision {
    decide_json(&rules(mode), &review(user, old.clone(), new.clone()), endpoint)
}

fn entry(controller: &str, gateway: &str, accepted: &str) -> Value {
    json!({"parentRef": {"name": gateway}, "controllerName": controller,
           "conditions": [{"type": "Accepted", "status": accepted}]})
}

fn parents(entries: &[Value]) -> Value {
    json!({"parents": entries})
}

fn istio_item() -> String {
    format!("status.parents[controllerName=\"{ISTIO_KEY}\"]")
}

#[test]
fn a_stale_full_update_that_drops_anothers_entry_is_denied_naming_it_and_its_owner() {
    let old = parents(&[entry(ENVOY_KEY, "eg", "True"), entry(ISTIO_KEY, "istio", "True")]);
    let new = parents(&[entry(ENVOY_KEY, "eg", "False")]);
    let d = decision("enforce", ENVOY, &old, &new, Endpoint::Validate);
    assert_eq!(d.outcome, Outcome::Denied);
    assert_eq!(d.response.result.code, 409);
    assert_eq!(
        d.response.result.message,
        format!(
            "statusguard: {ENVOY} may not change status fields owned by other writers: {} (owned by {ISTIOD})",
            istio_item()
        )
    );
}

#[test]
fn writing_an_entry_under_anothers_key_is_denied() {
    let old = parents(&[entry(ENVOY_KEY, "eg", "True")]);
    let new = parents(&[entry(ENVOY_KEY, "eg", "True"), entry(ISTIO_KEY, "other", "True")]);
    let d = decision("enforce", ENVOY, &old, &new, Endpoint::Validate);
    assert_eq!(items(&d), [istio_item()]);
    // Changing an entry of another inside, too.
    let old = parents(&[entry(ISTIO_KEY, "istio", "True")]);
    let new = parents(&[entry(ISTIO_KEY, "istio", "False")]);
    assert_eq!(
        items(&decision("enforce", ENVOY, &old, &new, Endpoint::Validate)),
        [istio_item()]
    );
}

#[test]
fn a_take_over_removes_the_others_entry_and_is_denied() {
    let old = parents(&[entry(ISTIO_KEY, "shared", "True")]);
    let new = parents(&[entry(ENVOY_KEY, "shared", "True")]);
    let d = decision("enforce", ENVOY, &old, &new, Endpoint::Validate);
    assert_eq!(d.outcome, Outcome::Denied);
    assert_eq!(items(&d), [istio_item()]);
    // The reverse direction (a key changed to another's value) is the same rule.
    let d = decision("enforce", ENVOY, &new, &old, Endpoint::Validate);
    assert_eq!(items(&d), [istio_item()]);
}

#[test]
fn reordering_own_edits_unowned_entries_and_nulls_are_allowed() {
    let old = parents(&[
        entry(ENVOY_KEY, "eg", "True"),
        entry(ISTIO_KEY, "a", "True"),
        entry(ISTIO_KEY, "b", "False"),
        entry("nobody.example/x", "n", "True"),
        json!({"parentRef": {"name": "keyless"}}),
    ]);
    let reordered = parents(&[
        json!({"parentRef": {"name": "keyless"}}),
        entry(ISTIO_KEY, "b", "False"),
        entry(ENVOY_KEY, "eg", "True"),
        entry(ISTIO_KEY, "a", "True"),
        entry("nobody.example/x", "n", "True"),
    ]);
    let mut own_and_unowned = reordered.clone();
    own_and_unowned["parents"][2]["conditions"][0]["status"] = json!("False");
    own_and_unowned["parents"][4]["conditions"] = json!([]);
    own_and_unowned["parents"][0] = json!({"parentRef": {"name": "keyless2"}});
    own_and_unowned["parents"][1]["message"] = Value::Null;
    for mode in ["enforce", "trim", "audit"] {
        for new in [&reordered, &own_and_unowned] {
            let d = decision(mode, ENVOY, &old, new, Endpoint::Validate);
            assert_eq!(d.outcome, Outcome::Allowed, "{mode} {new}");
            let m = decision(mode, ENVOY, &old, new, Endpoint::Mutate);
            assert!(m.response.patch.is_none(), "{mode} {new}");
        }
    }
}

#[test]
fn odd_key_values_are_quoted_as_json_strings() {
    let old = parents(&[entry(ODD_KEY, "x", "True")]);
    let new = parents(&[]);
    let d = decision("enforce", ENVOY, &old, &new, Endpoint::Validate);
    assert_eq!(
        items(&d),
        [r#"status.parents[controllerName="example.com/a=b,c;d:e'f]"]"#]
    );
}

#[test]
fn audit_warns_and_annotates_each_entry() {
    let old = parents(&[entry(ISTIO_KEY, "istio", "True")]);
    let new = parents(&[entry(ENVOY_KEY, "istio", "True")]);
    let d = decision("audit", ENVOY, &old, &new, Endpoint::Validate);
    assert_eq!(d.outcome, Outcome::Warned);
    assert!(d.response.allowed);
    // Warnings are cut to 120 characters, as the API server asks.
    let warnings = d.response.warnings.clone().unwrap_or_default();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].starts_with(&format!("statusguard changed {}, owned by system:", istio_item())));
    assert_eq!(
        d.response.audit_annotations.get("violations"),
        Some(&format!("{} (owned by {ISTIOD})", istio_item()))
    );
}

#[test]
fn trim_puts_the_others_entries_back_and_keeps_the_writers_own() {
    // A take-over: B's entry comes back, A's new one stays.
    let old = parents(&[entry(ISTIO_KEY, "shared", "True"), entry(ENVOY_KEY, "eg", "True")]);
    let new = parents(&[entry(ENVOY_KEY, "shared", "True"), entry(ENVOY_KEY, "eg", "False")]);
    let d = decision("trim", ENVOY, &old, &new, Endpoint::Mutate);
    assert_eq!(d.outcome, Outcome::Trimmed);
    let trimmed = apply(&new, d.response.patch.as_deref().unwrap());
    assert_eq!(
        trimmed,
        parents(&[
            entry(ENVOY_KEY, "shared", "True"),
            entry(ENVOY_KEY, "eg", "False"),
            entry(ISTIO_KEY, "shared", "True"),
        ])
    );
    // Warnings are cut to 120 characters, as the API server asks.
    let warnings = d.response.warnings.clone().unwrap_or_default();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].starts_with(&format!("statusguard restored {}, owned by system:", istio_item())));
    // A stale full update: the dropped entries come back, changed ones are
    // put back in place.
    let old = parents(&[
        entry(ISTIO_KEY, "a", "True"),
        entry(ENVOY_KEY, "eg", "True"),
        entry(ODD_KEY, "o", "x"),
    ]);
    let new = parents(&[entry(ODD_KEY, "o", "y"), entry(ENVOY_KEY, "eg", "False")]);
    let d = decision("trim", ENVOY, &old, &new, Endpoint::Mutate);
    let trimmed = apply(&new, d.response.patch.as_deref().unwrap());
    assert_eq!(
        trimmed,
        parents(&[
            entry(ODD_KEY, "o", "x"),
            entry(ENVOY_KEY, "eg", "False"),
            entry(ISTIO_KEY, "a", "True")
        ])
    );
    // A list removed whole, and a status without one.
    for new in [json!({}), json!({"parents": null}), json!({"parents": "not a list"})] {
        let d = decision("trim", ENVOY, &old, &new, Endpoint::Mutate);
        let trimmed = apply(&new, d.response.patch.as_deref().unwrap());
        // Appended by key value: the order of a keyed list means nothing.
        assert_eq!(
            trimmed,
            parents(&[entry(ODD_KEY, "o", "x"), entry(ISTIO_KEY, "a", "True")]),
            "{new}"
        );
    }
}

// ---- properties ---------------------------------------------------------

fn key() -> impl Strategy<Value = Option<&'static str>> {
    prop::sample::select(vec![
        Some(ENVOY_KEY),
        Some(ISTIO_KEY),
        Some(ODD_KEY),
        Some("nobody.example/x"),
        None,
    ])
}

fn an_entry() -> impl Strategy<Value = Value> {
    (key(), 0..3u8, prop::sample::select(vec![json!("True"), json!("False"), Value::Null])).prop_map(
        |(key, gateway, accepted)| {
            let mut entry = json!({"parentRef": {"name": format!("g{gateway}")}, "conditions": [{"type": "Accepted", "status": accepted}]});
            if let Some(key) = key {
                entry["controllerName"] = json!(key);
            }
            entry
        },
    )
}

fn route_status() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => prop::collection::vec(an_entry(), 0..6).prop_map(|e| parents(&e)),
        1 => Just(json!({})),
        1 => Just(json!({"parents": 3})),
    ]
}

fn writer() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![ENVOY, ISTIOD, "someone-else"])
}

/// The entries of `status` keyed by a value `writer` does not own, as
/// sorted canonical JSON texts: what a trim must leave as stored.
fn others_entries(status: &Value, writer: &str) -> Vec<String> {
    let others: &[&str] = match writer {
        ENVOY => &[ISTIO_KEY, ODD_KEY],
        ISTIOD => &[ENVOY_KEY],
        _ => &[ENVOY_KEY, ISTIO_KEY, ODD_KEY],
    };
    let mut found: Vec<String> = status
        .get("parents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| {
            e.get("controllerName")
                .and_then(Value::as_str)
                .is_some_and(|k| others.contains(&k))
        })
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    found.sort();
    found
}

/// `status` with its list reversed.
fn reversed(status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(list) = status.get_mut("parents").and_then(Value::as_array_mut) {
        list.reverse();
    }
    status
}

proptest! {
    #[test]
    fn a_trimmed_write_is_allowed_and_holds_the_others_entries_as_stored(
        old in route_status(), new in route_status(), writer in writer()
    ) {
        let d = decision("trim", writer, &old, &new, Endpoint::Mutate);
        let trimmed = match &d.response.patch { Some(p) => apply(&new, p), None => new.clone() };
        let again = decision("trim", writer, &old, &trimmed, Endpoint::Validate);
        prop_assert_eq!(again.outcome, Outcome::Allowed, "{}", trimmed);
        prop_assert_eq!(others_entries(&trimmed, writer), others_entries(&old, writer));
        // The writer's own and unowned entries are as it wrote them.
        let own = |s: &Value| {
            let mut all: Vec<String> = s.get("parents").and_then(Value::as_array).into_iter().flatten()
                .map(|e| serde_json::to_string(e).unwrap()).collect();
            all.sort();
            let others = others_entries(s, writer);
            all.retain(|e| !others.contains(e));
            all
        };
        prop_assert_eq!(own(&trimmed), own(&new));
    }

    #[test]
    fn the_decision_does_not_depend_on_the_order_of_entries(
        old in route_status(), new in route_status(), writer in writer()
    ) {
        let d = decision("enforce", writer, &old, &new, Endpoint::Validate);
        for (o, n) in [(reversed(&old), new.clone()), (old.clone(), reversed(&new)), (reversed(&old), reversed(&new))] {
            let again = decision("enforce", writer, &o, &n, Endpoint::Validate);
            prop_assert_eq!(items(&again), items(&d));
        }
        // Unchanged is allowed, whatever the order.
        let same = decision("enforce", writer, &old, &reversed(&old), Endpoint::Validate);
        prop_assert_eq!(same.outcome, Outcome::Allowed);
        prop_assert!(same_value(Some(&old), Some(&old)));
    }

    #[test]
    fn one_pass_and_two_passes_agree_on_keyed_lists(
        old in route_status(), new in route_status(), writer in writer()
    ) {
        let body = in_api_server_order(&review(writer, old, new));
        for mode in ["enforce", "trim", "audit"] {
            let rules = rules(mode);
            for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
                let two_passes = parse_request(&body).map(|request| {
                    let decided = decide_request(&rules, &request, endpoint);
                    (request, decided)
                });
                prop_assert_eq!(answered(read_and_decide(&rules, &body, endpoint)), answered(two_passes));
            }
        }
    }
}
