use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
#[path = "../../../fuzz/common/member_order.rs"]
mod member_order;
use super::compare::same_items;
use crate::admission::answer::{decide_request, read_and_decide};
use crate::admission::observe::StatusTexts;
use crate::admission::one_pass::{self, Reading};
use crate::admission::project::Proofs;
use crate::admission::trim::restoring_patch;
use crate::admission::wire::{RequestHead, ReviewError, ReviewRequest, encode_response, parse_request};
use crate::test_support::{json_value, with_null_members};

const CONTROLLER: &str = "system:serviceaccount:platform:widget-controller";
const SCALER: &str = "system:serviceaccount:platform:widget-scaler";

/// The shared fixture (tests/fixtures/ownership.yaml) in `mode`.
fn rules(mode: &str) -> Ownership {
    let text =
        include_str!("../../../tests/fixtures/ownership.yaml").replace("mode: enforce", &format!("mode: {mode}"));
    Ownership::from_yaml(&text).unwrap()
}

fn review(user: &str, old: Value, new: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
            "subResource": "status",
            "name": "w", "namespace": "ns", "operation": "UPDATE",
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "status": new},
            "oldObject": {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "status": old},
        }
    })
}

fn decide_json(rules: &Ownership, review: &Value, endpoint: Endpoint) -> Decision {
    let body = serde_json::to_vec(review).unwrap();
    let request = parse_request(&body).unwrap();
    decide_request(rules, &request, endpoint).unwrap()
}

fn status_decision(mode: &str, user: &str, old: Value, new: Value, endpoint: Endpoint) -> Decision {
    decide_json(&rules(mode), &review(user, old, new), endpoint)
}

fn items(d: &Decision) -> Vec<String> {
    d.violations.iter().map(|v| v.item.to_string()).collect()
}

fn apply(new: &Value, patch: &[u8]) -> Value {
    let patch: json_patch::Patch = serde_json::from_slice(patch).unwrap();
    let mut doc = json!({"status": new});
    json_patch::patch(&mut doc, &patch).unwrap();
    doc["status"].take()
}

fn stale() -> (Value, Value) {
    let old = json!({"observedGeneration": 2, "replicas": 3, "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "Scaled", "status": "True"}]});
    let new = json!({"observedGeneration": 1, "replicas": 5, "conditions": [
        {"type": "Ready", "status": "False"}, {"type": "Scaled", "status": "True"}]});
    (old, new)
}

#[test]
fn enforce_denies_a_stale_write_with_409_naming_items_and_owners() {
    let (old, new) = stale();
    let d = status_decision("enforce", SCALER, old, new, Endpoint::Validate);
    assert_eq!(d.outcome, Outcome::Denied);
    assert!(!d.response.allowed);
    assert_eq!(d.response.uid, "uid-1");
    assert_eq!(d.response.result.code, 409);
    assert_eq!(d.response.result.reason, "Conflict");
    assert_eq!(
        d.response.result.message,
        format!(
            "statusguard: {SCALER} may not change status fields owned by other writers: \
             status.observedGeneration (owned by {CONTROLLER}), condition Ready (owned by {CONTROLLER})"
        )
    );
}

#[test]
fn enforce_mutate_allows_without_patch() {
    let (old, new) = stale();
    let d = status_decision("enforce", SCALER, old, new, Endpoint::Mutate);
    assert!(d.response.allowed && d.response.patch.is_none());
}

#[test]
fn what_is_inspected_and_what_is_skipped() {
    let (old, new) = stale();
    let base = review(SCALER, old, new);
    // (what, a change to the review, expected outcome)
    type Change = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Change, Outcome)> = vec![
        (
            "status update of a configured resource",
            Box::new(|_| {}),
            Outcome::Denied,
        ),
        (
            "CREATE",
            Box::new(|r| r["request"]["operation"] = json!("CREATE")),
            Outcome::Skipped,
        ),
        (
            "main resource",
            Box::new(|r| r["request"]["subResource"] = Value::Null),
            Outcome::Skipped,
        ),
        (
            "scale subresource",
            Box::new(|r| r["request"]["subResource"] = json!("scale")),
            Outcome::Skipped,
        ),
        (
            "unconfigured resource",
            Box::new(|r| r["request"]["resource"]["resource"] = json!("others")),
            Outcome::Skipped,
        ),
        (
            "other group",
            Box::new(|r| r["request"]["resource"]["group"] = json!("x.io")),
            Outcome::Skipped,
        ),
        (
            "exempt user",
            Box::new(|r| r["request"]["userInfo"]["username"] = json!("breakglass")),
            Outcome::Exempt,
        ),
        (
            "exempt group",
            Box::new(|r| r["request"]["userInfo"]["groups"] = json!(["system:masters"])),
            Outcome::Exempt,
        ),
        (
            "dry run: same decision",
            Box::new(|r| r["request"]["dryRun"] = json!(true)),
            Outcome::Denied,
        ),
        (
            "the owner itself",
            Box::new(|r| r["request"]["userInfo"]["username"] = json!(CONTROLLER)),
            Outcome::Denied,
        ),
    ];
    for (what, change, expected) in cases {
        let mut r = base.clone();
        change(&mut r);
        let d = decide_json(&rules("enforce"), &r, Endpoint::Validate);
        assert_eq!(d.outcome, expected, "{what}");
        assert_eq!(d.response.allowed, expected != Outcome::Denied, "{what}");
        if expected != Outcome::Denied {
            assert!(d.response.warnings.is_none() && d.response.patch.is_none(), "{what}");
        }
    }
}

#[test]
fn the_owner_may_change_its_own_but_not_the_others() {
    // The controller rolls back the scaler's replicas: that is a violation too.
    let (old, mut new) = stale();
    new["observedGeneration"] = json!(3);
    let d = status_decision("enforce", CONTROLLER, old, new, Endpoint::Validate);
    assert_eq!(items(&d), ["status.replicas"]);
}

#[test]
fn an_unlisted_writer_may_change_only_unowned_items() {
    let old = json!({"observedGeneration": 1, "note": "a", "conditions": [{"type": "Other", "status": "True"}]});
    let new = json!({"observedGeneration": 1, "note": "b", "conditions": [{"type": "Other", "status": "False"}]});
    let d = status_decision("enforce", "someone", old.clone(), new, Endpoint::Validate);
    assert_eq!(d.outcome, Outcome::Allowed);
    let new = json!({"observedGeneration": 2, "note": "a", "conditions": [{"type": "Other", "status": "True"}]});
    let d = status_decision("enforce", "someone", old, new, Endpoint::Validate);
    assert_eq!(items(&d), ["status.observedGeneration"]);
}

#[test]
fn field_comparison_rules() {
    // (what, old status, new status, violated?)
    let cases = [
        (
            "absent and null are the same",
            json!({}),
            json!({"observedGeneration": null}),
            false,
        ),
        (
            "null and absent are the same",
            json!({"observedGeneration": null}),
            json!({}),
            false,
        ),
        ("added", json!({}), json!({"observedGeneration": 1}), true),
        ("removed", json!({"observedGeneration": 1}), json!({}), true),
        (
            "int64 max compares exactly",
            json!({"observedGeneration": 9223372036854775807_i64}),
            json!({"observedGeneration": 9223372036854775806_i64}),
            true,
        ),
        (
            "1 is not 1.0",
            json!({"observedGeneration": 1}),
            json!({"observedGeneration": 1.0}),
            true,
        ),
        (
            "a whole object: child changed",
            json!({"summary": {"ready": 1}}),
            json!({"summary": {"ready": 2}}),
            true,
        ),
        (
            "a whole object: child added",
            json!({"summary": {}}),
            json!({"summary": {"x": {"y": 1}}}),
            true,
        ),
        (
            "a whole object: same",
            json!({"summary": {"a": [1, 2]}}),
            json!({"summary": {"a": [1, 2]}}),
            false,
        ),
        (
            "array order matters in fields",
            json!({"summary": [1, 2]}),
            json!({"summary": [2, 1]}),
            true,
        ),
        ("status removed", json!({"observedGeneration": 1}), Value::Null, true),
        (
            "a path segment with / and ~",
            json!({"a/b~c": 1}),
            json!({"a/b~c": 2}),
            true,
        ),
        ("unowned sibling", json!({"other": 1}), json!({"other": 2}), false),
    ];
    for (what, old, new, violated) in cases {
        let d = status_decision("enforce", SCALER, old, new, Endpoint::Validate);
        assert_eq!(d.outcome == Outcome::Denied, violated, "{what}: {:?}", items(&d));
    }
}

#[test]
fn condition_comparison_rules() {
    let ready = json!({"type": "Ready", "status": "True"});
    let scaled = json!({"type": "Scaled", "status": "True"});
    let cases = [
        (
            "order does not matter",
            json!([ready, scaled]),
            json!([scaled, ready]),
            false,
        ),
        (
            "changed",
            json!([ready]),
            json!([{"type": "Ready", "status": "False"}]),
            true,
        ),
        ("removed", json!([ready, scaled]), json!([scaled]), true),
        ("added", json!([scaled]), json!([scaled, ready]), true),
        ("duplicated", json!([ready]), json!([ready, ready]), true),
        (
            "own condition changed",
            json!([ready, scaled]),
            json!([ready, {"type": "Scaled", "status": "False"}]),
            false,
        ),
        (
            "unowned condition added",
            json!([ready]),
            json!([ready, {"type": "Other"}]),
            false,
        ),
        ("list removed", json!([ready]), Value::Null, true),
        ("not a list is empty", json!("junk"), json!([]), false),
    ];
    for (what, old, new, violated) in cases {
        let d = status_decision(
            "enforce",
            SCALER,
            json!({"conditions": old}),
            json!({"conditions": new}),
            Endpoint::Validate,
        );
        assert_eq!(d.outcome == Outcome::Denied, violated, "{what}: {:?}", items(&d));
    }
}

#[test]
fn conditions_live_where_the_resource_says() {
    let mut r = review(
        "bob",
        json!({"health": {"checks": [{"type": "Ready", "status": "True"}]}, "conditions": [{"type": "Ready"}]}),
        json!({"health": {"checks": [{"type": "Ready", "status": "False"}]}, "conditions": []}),
    );
    r["request"]["resource"]["resource"] = json!("gadgets");
    let d = decide_json(&rules("enforce"), &r, Endpoint::Validate);
    assert_eq!(items(&d), ["condition Ready"]);
}

/// The scaler's stale write ([`stale`], two violations) in `mode` on
/// `endpoint`, asserted allowed with `outcome` and a warning per violation.
fn stale_write_allowed_with_two_warnings(mode: &str, endpoint: Endpoint, outcome: Outcome) -> Decision {
    let (old, new) = stale();
    let d = status_decision(mode, SCALER, old, new, endpoint);
    assert_eq!(d.outcome, outcome);
    assert!(d.response.allowed);
    assert_eq!(d.response.warnings.as_ref().map(Vec::len), Some(2));
    d
}

#[test]
fn audit_allows_with_a_warning_per_violation_and_annotations() {
    let d = stale_write_allowed_with_two_warnings("audit", Endpoint::Validate, Outcome::Warned);
    let warnings = d.response.warnings.unwrap();
    assert!(warnings.iter().all(|w| w.chars().count() <= 120), "{warnings:?}");
    assert!(d.response.audit_annotations["violations"].contains("status.observedGeneration"));
    let (old, new) = stale();
    let d = status_decision("audit", SCALER, old, new, Endpoint::Mutate);
    assert!(d.response.allowed && d.response.patch.is_none() && d.response.warnings.is_none());
}

#[test]
fn trim_validate_denies_like_enforce() {
    let (old, new) = stale();
    let d = status_decision("trim", SCALER, old, new, Endpoint::Validate);
    assert_eq!((d.outcome, d.response.result.code), (Outcome::Denied, 409));
}

#[test]
fn trim_restores_other_writers_items_and_keeps_the_writers_own() {
    let d = stale_write_allowed_with_two_warnings("trim", Endpoint::Mutate, Outcome::Trimmed);
    let (old, new) = stale();
    let trimmed = apply(&new, d.response.patch.as_ref().unwrap());
    assert_eq!(
        trimmed,
        json!({"observedGeneration": 2, "replicas": 5, "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Scaled", "status": "True"}]})
    );
    let again = status_decision("trim", SCALER, old, trimmed, Endpoint::Mutate);
    assert_eq!(again.outcome, Outcome::Allowed);
    assert!(again.response.patch.is_none());
}

#[test]
fn trim_patch_shapes() {
    // (what, old status, new status, the status after the patch); the
    // scale.* cases are written by the controller, the rest by the scaler.
    let cases = [
        (
            "remove what old lacked",
            json!({}),
            json!({"observedGeneration": 4}),
            json!({}),
        ),
        (
            "add back what was removed",
            json!({"observedGeneration": 4}),
            json!({"x": 1}),
            json!({"x": 1, "observedGeneration": 4}),
        ),
        (
            "create the status",
            json!({"observedGeneration": 4}),
            Value::Null,
            json!({"observedGeneration": 4}),
        ),
        (
            "create parents only where needed",
            json!({"scale": {"lastScaleTime": "t"}}),
            json!({"scale": {"other": 1}}),
            json!({"scale": {"other": 1, "lastScaleTime": "t"}}),
        ),
        (
            "a missing parent is created",
            json!({"scale": {"lastScaleTime": "t"}}),
            json!({}),
            json!({"scale": {"lastScaleTime": "t"}}),
        ),
        (
            "a scalar parent becomes an object",
            json!({"scale": {"lastScaleTime": "t"}}),
            json!({"scale": 7}),
            json!({"scale": {"lastScaleTime": "t"}}),
        ),
        (
            "escaped pointer",
            json!({"a/b~c": 1}),
            json!({"a/b~c": 2}),
            json!({"a/b~c": 1}),
        ),
        (
            "a restored condition keeps its position",
            json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Mine"}]}),
            json!({"conditions": [{"type": "X"}, {"type": "Ready", "status": "False"}, {"type": "Mine", "v": 2}]}),
            json!({"conditions": [{"type": "X"}, {"type": "Ready", "status": "True"}, {"type": "Mine", "v": 2}]}),
        ),
        (
            "a removed condition is appended",
            json!({"conditions": [{"type": "Ready"}, {"type": "X"}]}),
            json!({"conditions": [{"type": "X", "v": 2}]}),
            json!({"conditions": [{"type": "X", "v": 2}, {"type": "Ready"}]}),
        ),
        (
            "an added condition is removed",
            json!({"conditions": [{"type": "X"}]}),
            json!({"conditions": [{"type": "Ready"}, {"type": "X"}]}),
            json!({"conditions": [{"type": "X"}]}),
        ),
        (
            "an added list is removed",
            json!({}),
            json!({"conditions": [{"type": "Ready"}]}),
            json!({}),
        ),
        (
            "a removed list comes back",
            json!({"conditions": [{"type": "Ready"}]}),
            json!({"replicas": 1}),
            json!({"replicas": 1, "conditions": [{"type": "Ready"}]}),
        ),
    ];
    for (what, old, new, expected) in cases {
        let writer = if old.get("scale").is_some() { CONTROLLER } else { SCALER };
        let d = status_decision("trim", writer, old.clone(), new.clone(), Endpoint::Mutate);
        assert_eq!(d.outcome, Outcome::Trimmed, "{what}");
        let patch = d.response.patch.as_ref().unwrap();
        let trimmed = apply(&new, patch);
        assert_eq!(trimmed, expected, "{what}: {}", String::from_utf8_lossy(patch));
        let again = status_decision("trim", writer, old, trimmed, Endpoint::Mutate);
        assert_eq!(again.outcome, Outcome::Allowed, "{what}: trimming twice");
    }
}

#[test]
fn deny_message_is_capped() {
    let owner_fields: Vec<String> = (0..25).map(|i| format!("f{i:02}")).collect();
    let text = format!(
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nresources:\n  - group: example.com\n    resource: widgets\n    writers:\n      - {{user: owner, fields: [{}]}}\n",
        owner_fields.join(", ")
    );
    let rules = Ownership::from_yaml(&text).unwrap();
    let new: serde_json::Map<String, Value> = owner_fields.iter().map(|f| (f.clone(), json!(1))).collect();
    let d = decide_json(&rules, &review("x", json!({}), Value::Object(new)), Endpoint::Validate);
    assert_eq!(d.violations.len(), 25);
    assert!(
        d.response.result.message.ends_with("f09 (owned by owner), and 15 more"),
        "{}",
        d.response.result.message
    );
}

#[test]
fn long_names_keep_warnings_under_120_characters() {
    let long = "x".repeat(300);
    let text = format!(
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nmode: audit\nresources:\n  - group: example.com\n    resource: widgets\n    writers:\n      - {{user: \"{long}\", fields: [\"{long}\"]}}\n"
    );
    let rules = Ownership::from_yaml(&text).unwrap();
    let d = decide_json(
        &rules,
        &review("x", json!({}), json!({ long.clone(): 1 })),
        Endpoint::Validate,
    );
    assert_eq!(d.response.warnings.unwrap()[0].chars().count(), 120);
}

#[test]
fn a_status_update_without_old_object_is_an_error_not_a_guess() {
    let (old, new) = stale();
    let mut r = review(SCALER, old, new);
    r["request"]["oldObject"] = Value::Null;
    let body = serde_json::to_vec(&r).unwrap();
    let request = parse_request(&body).unwrap();
    assert!(matches!(
        decide_request(&rules("enforce"), &request, Endpoint::Validate),
        Err(DecisionError::MissingObject("oldObject"))
    ));
}

/// The decision parses nothing: it is made on the head and two values, as
/// an offline caller holds them.
#[test]
fn the_decision_is_made_on_values() {
    use crate::admission::wire::{ResourceRef, Writer};
    use kube::core::admission::Operation;
    let resource = ResourceRef {
        group: "example.com".into(),
        version: "v1".into(),
        resource: "widgets".into(),
    };
    let writer = Writer {
        username: Some(SCALER.into()),
        groups: None,
    };
    let head = RequestHead {
        uid: "u",
        resource: &resource,
        sub_resource: Some("status"),
        operation: &Operation::Update,
        user_info: &writer,
    };
    let (old, new) = stale();
    let decided = decide(
        &rules("enforce"),
        &head,
        Endpoint::Validate,
        Some(Some(&old)),
        Some(Some(&new)),
    )
    .unwrap();
    assert_eq!(decided.outcome, Outcome::Denied);
    assert_eq!(decided.response.uid, "u");
    assert_eq!(items(&decided), ["status.observedGeneration", "condition Ready"]);
    assert!(matches!(
        decide(&rules("enforce"), &head, Endpoint::Validate, None, Some(Some(&new))),
        Err(DecisionError::MissingObject("oldObject"))
    ));
}

/// The shared fixture in `mode`, its widgets written for `version`.
fn rules_at_version(mode: &str, version: &str) -> Ownership {
    let text = include_str!("../../../tests/fixtures/ownership.yaml")
        .replace("mode: enforce", &format!("mode: {mode}"))
        .replace(
            "    resource: widgets\n",
            &format!("    resource: widgets\n    version: {version}\n"),
        );
    let rules = Ownership::from_yaml(&text).unwrap();
    assert_eq!(
        rules.resource("example.com", "widgets").unwrap().version.as_deref(),
        Some(version)
    );
    rules
}

/// `review` made in `version` (`None`: without one).
fn in_version(mut review: Value, version: Option<&str>) -> Value {
    let resource = review["request"]["resource"].as_object_mut().unwrap();
    match version {
        Some(v) => resource.insert("version".into(), json!(v)),
        None => resource.remove("version"),
    };
    review
}

/// Both readers' answer, after checking that they agree.
fn read_both(rules: &Ownership, review: &Value, endpoint: Endpoint) -> Result<Decision, DecisionError> {
    let body = in_api_server_order(review);
    let request = parse_request(&body).unwrap();
    let two_passes = decide_request(rules, &request, endpoint);
    let (_, one_pass) = read_and_decide(rules, &body, endpoint).unwrap();
    let text = |d: &Result<Decision, DecisionError>| match d {
        Ok(d) => format!("{:?} {:?}", d.outcome, d.violations),
        Err(e) => e.to_string(),
    };
    assert_eq!(text(&one_pass), text(&two_passes));
    one_pass
}

#[test]
fn a_review_in_another_version_than_the_rules_is_refused_not_read_against_the_wrong_layout() {
    let (old, new) = stale();
    let rules = rules_at_version("enforce", "v1");
    // In the rules' version: decided as ever.
    let at_v1 = read_both(
        &rules,
        &in_version(review(SCALER, old.clone(), new.clone()), Some("v1")),
        Endpoint::Validate,
    );
    assert_eq!(at_v1.unwrap().outcome, Outcome::Denied);
    // In another: refused, saying how to register the webhook.
    let at_v2 = read_both(
        &rules,
        &in_version(review(SCALER, old.clone(), new.clone()), Some("v2")),
        Endpoint::Validate,
    );
    let Err(refused) = at_v2 else {
        panic!("decided: {at_v2:?}")
    };
    assert_eq!(
        refused.code(),
        500,
        "statusguard's registration is wrong, not the writer's request"
    );
    assert_eq!(
        refused.to_string(),
        "the rules of example.com/widgets are written for version v1, and this review is for version v2: the webhook \
         must be registered with apiVersions [v1] and matchPolicy Equivalent, so that the API server converts the write"
    );
    // Without a version: nothing says the layout is the rules'.
    let unnamed = read_both(
        &rules,
        &in_version(review(SCALER, old.clone(), new.clone()), None),
        Endpoint::Validate,
    );
    assert!(
        matches!(&unnamed, Err(DecisionError::WrongVersion { got, .. }) if got == "names no version"),
        "{unnamed:?}"
    );
}

#[test]
fn what_does_not_read_the_status_is_answered_in_any_version() {
    let (old, new) = stale();
    let v2 = |user: &str| in_version(review(user, old.clone(), new.clone()), Some("v2"));
    // Exempt writers are decided on who they are.
    let exempt = read_both(
        &rules_at_version("enforce", "v1"),
        &v2("breakglass"),
        Endpoint::Validate,
    );
    assert_eq!(exempt.unwrap().outcome, Outcome::Exempt);
    // Enforce has no work at /mutate; /validate refuses.
    let mutate = read_both(&rules_at_version("enforce", "v1"), &v2(SCALER), Endpoint::Mutate);
    assert_eq!(mutate.unwrap().outcome, Outcome::Allowed);
    // Trim reads the status at /mutate too: refused there.
    let trim = read_both(&rules_at_version("trim", "v1"), &v2(SCALER), Endpoint::Mutate);
    assert!(matches!(trim, Err(DecisionError::WrongVersion { .. })), "{trim:?}");
    // Another resource, and rules that name no version, decide every version.
    let gadgets = read_both(
        &rules_at_version("enforce", "v1"),
        &review_with(
            SCALER,
            vec![],
            "UPDATE",
            Some("status"),
            "gadgets",
            json!({}),
            json!({"x": 1}),
        ),
        Endpoint::Validate,
    );
    assert_eq!(gadgets.unwrap().outcome, Outcome::Allowed);
    let unversioned = read_both(&rules("enforce"), &v2(SCALER), Endpoint::Validate);
    assert_eq!(unversioned.unwrap().outcome, Outcome::Denied);
}

// ---- invariants -----------------------------------------------------------

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-c]{0,2}".prop_map(Value::from),
    ]
}

fn small_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::btree_map("[a-c]", inner.clone(), 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            prop::collection::vec(inner, 0..3).prop_map(Value::Array),
        ]
    })
}

fn condition() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["Ready", "Scaled", "Other"]),
        prop::sample::select(vec!["True", "False"]),
    )
        .prop_map(|(t, s)| json!({"type": t, "status": s}))
}

/// A status over the keys the rules name, plus unowned ones.
fn status() -> impl Strategy<Value = Value> {
    let keys = vec!["observedGeneration", "summary", "replicas", "scale", "free"];
    (
        prop::collection::btree_map(prop::sample::select(keys), small_json(), 0..5),
        prop::option::of(prop::collection::vec(condition(), 0..4)),
    )
        .prop_map(|(fields, conditions)| {
            let mut status: serde_json::Map<String, Value> =
                fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            if let Some(c) = conditions {
                status.insert("conditions".into(), Value::Array(c));
            }
            Value::Object(status)
        })
}

fn writer() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![CONTROLLER, SCALER, "someone-else"])
}

/// `new` with every item that `writer` does not own taken from `old`.
fn only_own_changes(writer: &str, old: &Value, new: &Value) -> Value {
    let r = rules("trim");
    let widgets = r.resource("example.com", "widgets").unwrap();
    let violations = find_violations(widgets, writer, Some(old), Some(new));
    let patch = restoring_patch(widgets, &violations, Some(old), Some(new), &Default::default()).unwrap();
    apply(new, &patch)
}

proptest! {
    #[test]
    fn after_a_trim_patch_no_violation_remains_and_trimming_twice_is_trimming_once(
        old in status(), new in status(), writer in writer()
    ) {
        let d = status_decision("trim", writer, old.clone(), new.clone(), Endpoint::Mutate);
        let trimmed = match &d.response.patch { Some(p) => apply(&new, p), None => new.clone() };
        let again = status_decision("trim", writer, old.clone(), trimmed.clone(), Endpoint::Mutate);
        prop_assert_eq!(again.outcome, Outcome::Allowed);
        prop_assert!(again.response.patch.is_none());
        let validate = status_decision("trim", writer, old, trimmed, Endpoint::Validate);
        prop_assert_eq!(validate.outcome, Outcome::Allowed);
    }

    #[test]
    fn a_writers_own_and_unowned_changes_are_never_denied_or_altered(
        old in status(), new in status(), writer in writer()
    ) {
        // Make a write that changes only what the writer may change.
        let own_only = only_own_changes(writer, &old, &new);
        for mode in ["enforce", "trim", "audit"] {
            let d = status_decision(mode, writer, old.clone(), own_only.clone(), Endpoint::Validate);
            prop_assert_eq!(d.outcome, Outcome::Allowed, "{}", mode);
            let m = status_decision(mode, writer, old.clone(), own_only.clone(), Endpoint::Mutate);
            prop_assert!(m.response.patch.is_none() && m.response.allowed);
        }
    }

    #[test]
    fn a_trim_keeps_every_item_the_writer_may_change(
        old in status(), new in status(), writer in writer()
    ) {
        let d = status_decision("trim", writer, old.clone(), new.clone(), Endpoint::Mutate);
        let trimmed = match &d.response.patch { Some(p) => apply(&new, p), None => new.clone() };
        // Every unowned top-level key and every condition of a type the
        // writer may change is as the writer wrote it.
        let r = rules("trim");
        let widgets = r.resource("example.com", "widgets").unwrap();
        let others: Vec<_> = widgets.writers.iter().filter(|w| w.username != writer).collect();
        for key in ["observedGeneration", "summary", "replicas", "scale", "free"] {
            let owned_by_other = others.iter().any(|w| w.fields.iter().any(|f| f.segments()[0] == key));
            if !owned_by_other {
                prop_assert_eq!(trimmed.get(key), new.get(key), "{}", key);
            }
        }
        let may = |c: &&Value| !others.iter().any(|w| w.conditions.iter().any(|t| Some(t.as_str()) == condition_type(c)));
        let kept = |s: &Value| s.get("conditions").and_then(Value::as_array).map(|l| l.iter().filter(may).cloned().collect::<Vec<_>>()).unwrap_or_default();
        prop_assert_eq!(kept(&trimmed), kept(&new));
    }

    #[test]
    fn the_owner_of_everything_is_never_denied(old in status(), new in status()) {
        let text = "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nresources:\n  - group: example.com\n    resource: widgets\n    writers:\n      - {user: all, fields: [observedGeneration, summary, replicas, scale, free], conditions: [Ready, Scaled, Other]}\n";
        let rules = Ownership::from_yaml(text).unwrap();
        let d = decide_json(&rules, &review("all", old, new), Endpoint::Validate);
        prop_assert_eq!(d.outcome, Outcome::Allowed);
    }
}

/// An old status and a new one that shares most of its values with it, as
/// most writes do: the single reader leaves values of the same text unbuilt.
fn partly_changed() -> impl Strategy<Value = (Value, Value)> {
    (status(), status(), prop::collection::vec(any::<bool>(), 8)).prop_map(|(old, other, keep)| {
        let mut new = old.clone();
        let keys = [
            "observedGeneration",
            "summary",
            "replicas",
            "scale",
            "free",
            "conditions",
        ];
        for (key, keep) in keys.iter().zip(&keep) {
            if !keep {
                match other.get(*key) {
                    Some(value) => new[*key] = value.clone(),
                    None => {
                        new.as_object_mut().unwrap().remove(*key);
                    }
                }
            }
        }
        // Or one condition item changed in a list otherwise the same.
        if !keep[6]
            && let (Some(list), Some(item)) = (
                new.get_mut("conditions").and_then(Value::as_array_mut),
                other["conditions"].get(0).cloned(),
            )
            && !list.is_empty()
        {
            let at = usize::from(keep[7]) % list.len();
            list[at] = item;
        }
        (old, new)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Issue 25: the reader compares values as text before it builds them.
    /// What it decides, and the trim it answers, are what the full values
    /// give: `find_violations` and `restoring_patch` on the whole statuses.
    #[test]
    fn values_left_unbuilt_for_their_text_change_no_answer(
        (old, new) in partly_changed(), writer in writer(),
        mode in prop::sample::select(vec!["enforce", "trim", "audit"]),
    ) {
        let r = rules(mode);
        let widgets = r.resource("example.com", "widgets").unwrap();
        let expected = find_violations(widgets, writer, Some(&old), Some(&new));
        let validated = status_decision(mode, writer, old.clone(), new.clone(), Endpoint::Validate);
        prop_assert_eq!(&validated.violations, &expected);
        if mode == "trim" {
            let mutated = status_decision(mode, writer, old.clone(), new.clone(), Endpoint::Mutate);
            prop_assert_eq!(&mutated.violations, &expected);
            let trimmed = match &mutated.response.patch { Some(p) => apply(&new, p), None => new.clone() };
            let patch = restoring_patch(widgets, &expected, Some(&old), Some(&new), &Default::default()).unwrap();
            prop_assert_eq!(&trimmed, &apply(&new, &patch));
        }
    }
}

/// `review` with its objects as `objects` says: "no object", "null old",
/// "no status", or as they are.
fn with_objects(mut review: Value, objects: &str) -> Value {
    let request = review["request"].as_object_mut().unwrap();
    match objects {
        "no object" => {
            request.remove("object");
        }
        "null old" => {
            request.insert("oldObject".into(), Value::Null);
        }
        "no status" => {
            request["object"].as_object_mut().unwrap().remove("status");
        }
        _ => {}
    }
    review
}

fn review_with(
    user: &str,
    groups: Vec<String>,
    operation: &str,
    sub: Option<&str>,
    resource: &str,
    old: Value,
    new: Value,
) -> Value {
    let mut r = review(user, old, new);
    r["request"]["userInfo"]["groups"] = json!(groups);
    r["request"]["operation"] = json!(operation);
    r["request"]["resource"]["resource"] = json!(resource);
    match sub {
        Some(s) => r["request"]["subResource"] = json!(s),
        None => {
            r["request"].as_object_mut().unwrap().remove("subResource");
        }
    }
    r
}

proptest! {
    /// Issue 11, item 2: absent and `null` are the same at every depth
    /// inside owned values (and in condition items).
    #[test]
    fn nulls_where_members_are_absent_are_never_a_change(old in status(), writer in writer()) {
        for (a, b) in [(old.clone(), with_null_members(&old)), (with_null_members(&old), old.clone())] {
            let d = status_decision("enforce", writer, a, b, Endpoint::Validate);
            prop_assert_eq!(d.outcome, Outcome::Allowed, "{:?}", d.violations);
        }
    }

    /// Issue 12: the narrow parse reads what kube's full AdmissionReview
    /// parse reads, and deciding on the projected statuses finds exactly the
    /// violations the full statuses hold.
    #[test]
    fn the_narrow_parse_agrees_with_the_full_one(
        old in status(), new in status(), writer in writer(),
        groups in prop::collection::vec(prop::sample::select(vec!["system:masters".to_owned(), "g".to_owned()]), 0..2),
        operation in prop::sample::select(vec!["UPDATE", "CREATE"]),
        sub in prop::option::of(prop::sample::select(vec!["status", "scale"])),
        resource in prop::sample::select(vec!["widgets", "gadgets", "others"]),
    ) {
        let r = review_with(writer, groups, operation, sub, resource, old.clone(), new.clone());
        let body = serde_json::to_vec(&r).unwrap();
        let narrow = parse_request(&body).unwrap();
        let full: kube::core::admission::AdmissionReview<kube::core::DynamicObject> = serde_json::from_slice(&body).unwrap();
        let full: kube::core::admission::AdmissionRequest<kube::core::DynamicObject> = full.try_into().unwrap();
        prop_assert_eq!(&narrow.uid, &full.uid);
        prop_assert_eq!((&narrow.resource.group, &narrow.resource.resource), (&full.resource.group, &full.resource.resource));
        prop_assert_eq!(&narrow.sub_resource, &full.sub_resource);
        prop_assert_eq!(&narrow.operation, &full.operation);
        prop_assert_eq!(&narrow.user_info.username, &full.user_info.username);
        prop_assert_eq!(&narrow.user_info.groups, &full.user_info.groups);
        prop_assert_eq!((narrow.dry_run, &narrow.name, &narrow.namespace), (full.dry_run, &full.name, &full.namespace));

        let rules = rules("enforce");
        let decision = decide_request(&rules, &narrow, Endpoint::Validate).unwrap();
        let expected = match rules.resource("example.com", resource) {
            Some(resource_rules) if operation == "UPDATE" && sub == Some("status") && !rules.is_exempt(writer, narrow.groups()) => {
                let status = |o: &Option<kube::core::DynamicObject>| o.as_ref().and_then(|o| o.data.get("status")).cloned();
                find_violations(resource_rules, writer, status(&full.old_object).as_ref(), status(&full.object).as_ref())
            }
            _ => vec![],
        };
        prop_assert_eq!(decision.violations, expected);
    }
}

/// A review's body as the API server writes it: the request's members in
/// the order of Go's `AdmissionRequest`, the objects after the head.
fn in_api_server_order(review: &Value) -> Vec<u8> {
    let request = review["request"].as_object().unwrap();
    let members: Vec<String> = member_order::REQUEST_ORDER
        .iter()
        .filter_map(|key| request.get(*key).map(|value| format!("{}:{}", json!(key), value)))
        .collect();
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{{}}}}}"#,
        members.join(",")
    )
    .into_bytes()
}

/// What a reader and a decision answer, comparable across the two paths.
fn answered(read: Result<(ReviewRequest<'_>, Result<Decision, DecisionError>), ReviewError>) -> String {
    match read {
        Err(e) => format!("not read: {e}"),
        Ok((request, Err(e))) => format!("{}: not decided: {e}", request.uid),
        Ok((_, Ok(mut decision))) => {
            let body = encode_response(&mut decision.response).unwrap();
            // As a value: audit annotations are a hash map, in no set order.
            let mut sent: Value = serde_json::from_slice(&body).unwrap();
            // The patch too: restored items are written as they were read.
            if let Some(patch) = sent["response"].get_mut("patch") {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(patch.as_str().unwrap())
                    .unwrap();
                *patch = serde_json::from_slice(&bytes).unwrap();
            }
            format!("{:?} {:?} {sent}", decision.outcome, decision.violations)
        }
    }
}

/// How the single pass is told to read a review for `endpoint`, with `proofs`.
fn reading<'r>(
    rules: &'r Ownership,
    endpoint: Endpoint,
    proofs: Proofs,
) -> impl Fn(&RequestHead<'_>) -> Option<Reading<'r>> + Copy + 'r {
    move |head| match plan(rules, head, endpoint) {
        Plan::Read(r) => Some(Reading {
            paths: &r.read_paths,
            writer: r.writer_position(head.user_info.name()),
            proofs,
        }),
        Plan::Answer(_) | Plan::Refuse(_) => None,
    }
}

#[test]
fn the_single_pass_projects_a_body_in_the_api_servers_order_and_leaves_others_to_two_passes() {
    let rules = rules("enforce");
    let plan = reading(&rules, Endpoint::Validate, Proofs::Off);
    let (old, new) = stale();
    let review = review(SCALER, old, new);
    let (_, statuses, _) = one_pass::read(&in_api_server_order(&review), plan).unwrap();
    let statuses = statuses.expect("projected in the single pass");
    assert_eq!(statuses.new.unwrap().unwrap()["observedGeneration"], 1);
    // serde_json writes the members sorted: `object` before `resource`.
    let sorted = serde_json::to_vec(&review).unwrap();
    let (request, statuses, _) = one_pass::read(&sorted, plan).unwrap();
    assert!(statuses.is_none() && request.object.unwrap().status.is_some());
    // A duplicate member, escaped text and a deep owned value are left to
    // the two-pass path.
    let mut duplicated = in_api_server_order(&review);
    duplicated.truncate(duplicated.len() - 2);
    duplicated.extend_from_slice(br#","uid":"again"}}"#);
    assert!(one_pass::read(&duplicated, plan).is_none());
    let deep = json!({"observedGeneration": (0..200).fold(json!(1), |v, _| json!([v]))});
    let deep_review = review_with(SCALER, vec![], "UPDATE", Some("status"), "widgets", json!({}), deep);
    let deep_body = in_api_server_order(&deep_review);
    assert!(one_pass::read(&deep_body, plan).is_none());
    let (_, decided) = read_and_decide(&rules, &deep_body, Endpoint::Validate).unwrap();
    assert_eq!(decided.unwrap().outcome, Outcome::Denied);
}

#[test]
fn the_second_object_takes_what_it_did_not_change_by_its_text() {
    let rules = rules("enforce");
    let endpoints: Vec<Value> = (0..50)
        .map(|i| json!({"ip": format!("10.0.0.{i}"), "port": 8080}))
        .collect();
    let old = json!({"observedGeneration": 2, "replicas": 3, "free": endpoints, "conditions": [
        {"type": "Ready", "status": "True", "message": "m", "observedGeneration": 2},
        {"type": "Scaled", "status": "True"}, {"type": "Other", "status": "True"}]});
    let mut new = old.clone();
    // A field of the controller's (denied), and one member of its condition.
    new["observedGeneration"] = json!(1);
    new["conditions"][0]["observedGeneration"] = json!(1);
    let body = in_api_server_order(&review(SCALER, old, new));
    let before = crate::admission::cursor::taken_by_text();
    let one_pass = answered(read_and_decide(&rules, &body, Endpoint::Validate));
    // The object's apiVersion, kind and metadata; the status's replicas and
    // free; the items Scaled and Other; Ready's message, status and type;
    // and in the object read first, Other's status, taken from Scaled's
    // before it.
    assert_eq!(crate::admission::cursor::taken_by_text() - before, 3 + 2 + 2 + 3 + 1);
    let request = parse_request(&body).unwrap();
    let decided = decide_request(&rules, &request, Endpoint::Validate);
    assert_eq!(one_pass, answered(Ok((request, decided))));
    assert!(one_pass.starts_with("Denied"), "{one_pass}");
}

#[test]
fn duplicate_keys_in_either_object_are_read_as_two_passes_read_them() {
    let rules = rules("enforce");
    let old = json!({"observedGeneration": 2, "replicas": 3, "free": 1, "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "Scaled", "status": "True"}]});
    let body = String::from_utf8(in_api_server_order(&review(SCALER, old.clone(), old))).unwrap();
    // Each edit is made in the first object (`object`), the second, or both.
    let edits = [
        (r#""replicas":3"#, r#""replicas":5,"replicas":3"#),
        (r#""replicas":3"#, r#""replicas":3,"replicas":5"#),
        (r#""free":1"#, r#""free":1,"free":2"#),
        (
            r#""observedGeneration":2"#,
            r#""observedGeneration":2,"observedGeneration":2"#,
        ),
        (
            r#""observedGeneration":2"#,
            r#""observedGeneration":2,"observedGeneration":7"#,
        ),
        (
            r#""observedGeneration":2"#,
            r#""observedGeneration":7,"observedGeneration":2"#,
        ),
        (
            r#""status":"True","type":"Ready""#,
            r#""status":"False","status":"True","type":"Ready""#,
        ),
        (
            r#""status":"True","type":"Ready""#,
            r#""status":"True","type":"Ready","type":"Scaled""#,
        ),
        (
            r#""metadata":{"name":"w"}"#,
            r#""metadata":{"name":"w"},"spec":1,"spec":2"#,
        ),
        // A list written twice: its items are not the first list's.
        (
            r#""conditions":[{"status":"True","type":"Ready"}"#,
            r#""conditions":[{"status":"True","type":"Ready"}],"conditions":[{"status":"False","type":"Ready"}"#,
        ),
    ];
    for (from, to) in edits {
        assert_eq!(body.matches(from).count(), 2, "{from}");
        let first = body.replacen(from, to, 1);
        let at = body.rfind(from).unwrap();
        let second = format!("{}{to}{}", &body[..at], &body[at + from.len()..]);
        let both = body.replace(from, to);
        for edited in [first, second, both] {
            let two_passes = parse_request(edited.as_bytes()).map(|request| {
                let decided = decide_request(&rules, &request, Endpoint::Validate);
                (request, decided)
            });
            assert_eq!(
                answered(read_and_decide(&rules, edited.as_bytes(), Endpoint::Validate)),
                answered(two_passes),
                "{edited}"
            );
        }
    }
}

/// `new` sharing most of its text with `old`, as a real write does: `old`
/// with the first member of `new`, and with the first of `new`'s conditions
/// in place of its own first.
fn sharing(old: &Value, new: &Value) -> Value {
    let mut shared = old.clone();
    let (Some(members), Some(new_members)) = (shared.as_object_mut(), new.as_object()) else {
        return new.clone();
    };
    if let Some((key, value)) = new_members.iter().find(|(key, _)| *key != "conditions") {
        members.insert(key.clone(), value.clone());
    }
    let first_condition = new_members.get("conditions").and_then(|c| c.get(0));
    match (
        members.get_mut("conditions").and_then(|c| c.get_mut(0)),
        first_condition,
    ) {
        (Some(item), Some(new_item)) => *item = new_item.clone(),
        (None, Some(_)) => {
            members.insert("conditions".into(), new_members["conditions"].clone());
        }
        _ => {}
    }
    shared
}

proptest! {
    /// Issue 12: reading and deciding in one pass answers exactly what
    /// parsing and then deciding answers, for bodies in the API server's
    /// member order (the single pass) and in others (the two-pass path).
    #[test]
    fn the_single_pass_answers_what_two_passes_answer(
        old in status(), new in status(), writer in writer(),
        groups in prop::collection::vec(prop::sample::select(vec!["system:masters".to_owned(), "g".to_owned()]), 0..2),
        // Weighted towards the requests whose statuses are read.
        operation in prop::sample::select(vec!["UPDATE", "UPDATE", "UPDATE", "CREATE"]),
        sub in prop::sample::select(vec![Some("status"), Some("status"), Some("scale"), None]),
        resource in prop::sample::select(vec!["widgets", "widgets", "gadgets", "others"]),
        objects in prop::sample::select(vec!["both", "no object", "null old", "no status"]),
        nulls in any::<bool>(),
        // Issue 25: statuses that share most of their text, taken by it.
        shared in any::<bool>(),
    ) {
        let new = if shared { sharing(&old, &new) } else { new };
        let new = if nulls { with_null_members(&new) } else { new };
        let r = with_objects(review_with(writer, groups, operation, sub, resource, old, new), objects);
        for body in [in_api_server_order(&r), serde_json::to_vec(&r).unwrap()] {
            for mode in ["enforce", "trim", "audit"] {
                let rules = rules(mode);
                for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
                    let two_passes = parse_request(&body).map(|request| {
                        let decided = decide_request(&rules, &request, endpoint);
                        (request, decided)
                    });
                    prop_assert_eq!(
                        answered(read_and_decide(&rules, &body, endpoint)),
                        answered(two_passes),
                        "{} {:?}", mode, endpoint
                    );
                }
            }
        }
    }
}

// ---- condition items as multisets ----------------------------------------

/// The pairwise matching `same_items` did before issue 22 (quadratic): the
/// oracle the canonical-form comparison must agree with.
fn same_items_pairwise(a: &[&Value], b: &[&Value]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    a.iter().all(
        |x| match (0..b.len()).find(|&i| !used[i] && same_value(Some(b[i]), Some(x))) {
            Some(i) => {
                used[i] = true;
                true
            }
            None => false,
        },
    )
}

#[test]
fn condition_items_compare_as_multisets_under_same_value() {
    // (what, a, b, same?)
    let cases = [
        (
            "reordered duplicates",
            json!([{"type": "R", "m": 1}, {"type": "R", "m": 1}, {"type": "R", "m": 2}]),
            json!([{"type": "R", "m": 2}, {"type": "R", "m": 1}, {"type": "R", "m": 1}]),
            true,
        ),
        (
            "the same items, other counts",
            json!([{"type": "R", "m": 1}, {"type": "R", "m": 1}, {"type": "R", "m": 2}]),
            json!([{"type": "R", "m": 1}, {"type": "R", "m": 2}, {"type": "R", "m": 2}]),
            false,
        ),
        (
            "null members are absent at every depth",
            json!([{"type": "R", "m": null, "d": {"x": null, "y": [{"z": null}]}}, {"type": "R", "m": 2}]),
            json!([{"type": "R", "m": 2}, {"type": "R", "d": {"y": [{}]}}]),
            true,
        ),
        (
            "a null item in a list is an item",
            json!([{"type": "R", "l": [null]}, {"type": "R"}]),
            json!([{"type": "R"}, {"type": "R", "l": []}]),
            false,
        ),
        (
            "1 is not 1.0",
            json!([{"type": "R", "n": 1}, {"type": "R", "n": 2}]),
            json!([{"type": "R", "n": 2}, {"type": "R", "n": 1.0}]),
            false,
        ),
        (
            "-0.0 is 0.0, but not 0",
            json!([{"type": "R", "n": -0.0}, {"type": "R", "n": 0}]),
            json!([{"type": "R", "n": 0}, {"type": "R", "n": 0.0}]),
            true,
        ),
        (
            "big integers compare exactly",
            json!([{"type": "R", "n": u64::MAX}, {"type": "R", "n": i64::MIN}]),
            json!([{"type": "R", "n": i64::MIN}, {"type": "R", "n": u64::MAX - 1}]),
            false,
        ),
        (
            "a key is not a value",
            json!([{"type": "R", "ab": "c"}, {"type": "R"}]),
            json!([{"type": "R"}, {"type": "R", "a": "bc"}]),
            false,
        ),
    ];
    for (what, a, b, same) in cases {
        let a: Vec<&Value> = a.as_array().unwrap().iter().collect();
        let b: Vec<&Value> = b.as_array().unwrap().iter().collect();
        assert_eq!(same_items(&a, &b), same, "{what}");
        assert_eq!(same_items_pairwise(&a, &b), same, "{what}: the oracle");
    }
}

/// A list, and another made of it: shuffled, with null members added to
/// some items, maybe one item replaced.
fn item_lists() -> impl Strategy<Value = (Vec<Value>, Vec<Value>)> {
    prop::collection::vec(json_value(), 0..8).prop_flat_map(|a| {
        let len = a.len();
        (
            Just(a.clone()),
            Just(a).prop_shuffle(),
            prop::collection::vec(any::<bool>(), len),
            prop::option::of((0..len.max(1), json_value())),
        )
            .prop_map(|(a, shuffled, nulls, replaced)| {
                let mut b: Vec<Value> = shuffled
                    .into_iter()
                    .zip(nulls)
                    .map(|(item, add)| if add { with_null_members(&item) } else { item })
                    .collect();
                if let Some((at, item)) = replaced.filter(|(at, _)| *at < b.len()) {
                    b[at] = item;
                }
                (a, b)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Issue 22: the canonical-form comparison answers what the pairwise
    /// matching answered, on lists with duplicates, nulls, reordering and
    /// every form of number.
    #[test]
    fn the_multiset_comparison_agrees_with_pairwise_matching((a, b) in item_lists()) {
        let (a, b): (Vec<&Value>, Vec<&Value>) = (a.iter().collect(), b.iter().collect());
        prop_assert_eq!(same_items(&a, &b), same_items_pairwise(&a, &b));
        prop_assert!(same_items(&a, &a));
    }
}

#[test]
fn ten_thousand_reordered_condition_items_are_decided_at_once() {
    // A CRD without `listType: map` stores duplicate types: 10,000 Ready
    // items, reversed, took 11 s when compared item against item. In a
    // debug build it now takes about 3 s of CPU. The bound is on this
    // thread's CPU time, not on wall time, so a loaded machine cannot fail it.
    let ready = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"type": "Ready", "status": "True", "message": format!("item {i}")}))
            .collect()
    };
    let old = json!({"conditions": ready(10_000)});
    let mut reversed = ready(10_000);
    reversed.reverse();
    let start = thread_cpu_seconds();
    let d = status_decision(
        "enforce",
        SCALER,
        old.clone(),
        json!({"conditions": reversed.clone()}),
        Endpoint::Validate,
    );
    assert_eq!(d.outcome, Outcome::Allowed);
    reversed[0]["status"] = json!("False");
    let d = status_decision(
        "enforce",
        SCALER,
        old,
        json!({"conditions": reversed}),
        Endpoint::Validate,
    );
    assert_eq!(items(&d), ["condition Ready"]);
    let spent = thread_cpu_seconds() - start;
    assert!(spent < 6.0, "{spent:.2} s of CPU");
}

/// CPU time this thread has used, in seconds, from `/proc/thread-self/stat`
/// (utime and stime, fields 14 and 15, counted after the command name, which
/// may itself hold spaces and parentheses).
fn thread_cpu_seconds() -> f64 {
    let stat =
        std::fs::read_to_string("/proc/thread-self/stat").expect("this test reads its CPU time from /proc (Linux)");
    let after_name = &stat[stat.rfind(')').expect("a /proc stat line") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name, state is field 3, so utime (14) is index 11.
    let ticks: f64 = fields[11..13]
        .iter()
        .map(|f| f.parse::<f64>().expect("a tick count"))
        .sum();
    ticks / 100.0
}

// ---- member order ---------------------------------------------------------

/// JSON text of `value` with each object's members ordered by the next of
/// `ranks` (cycled), so that a property test can write any order.
fn in_order_of(value: &Value, ranks: &[u32]) -> Vec<u8> {
    let mut ranks = ranks.iter().copied().cycle();
    member_order::write(value, &mut |members| {
        let mut ranked: Vec<(u32, (&String, &Value))> = members
            .iter()
            .map(|member| (ranks.next().unwrap_or_default(), *member))
            .collect();
        ranked.sort_by_key(|(rank, _)| *rank);
        for (slot, (_, member)) in members.iter_mut().zip(ranked) {
            *slot = member;
        }
    })
}

/// What one pass and two passes answer to `body`, in every mode and on
/// both endpoints, after checking that they answer alike.
fn both_paths(body: &[u8]) -> Vec<String> {
    let mut answers = Vec::new();
    for mode in ["enforce", "trim", "audit"] {
        let rules = rules(mode);
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let two_passes = parse_request(body).map(|request| {
                let decided = decide_request(&rules, &request, endpoint);
                (request, decided)
            });
            // The statuses' text the observer copies: what the wire reads.
            if let (Some((_, _, texts)), Ok(request)) = (
                one_pass::read(body, reading(&rules, endpoint, Proofs::Off)),
                &two_passes,
            ) {
                assert_eq!(texts, StatusTexts::of(&request.0), "{mode} {endpoint:?}");
            }
            let one_pass = answered(read_and_decide(&rules, body, endpoint));
            assert_eq!(
                one_pass,
                answered(two_passes),
                "{mode} {endpoint:?}: {}",
                String::from_utf8_lossy(body)
            );
            answers.push(one_pass);
        }
    }
    answers
}

/// The request's members as its derived `Deserialize` knows them are those
/// the API server writes (the tests' list of its order): none is missing
/// from what the single pass tells a head member by.
#[test]
fn the_requests_members_are_those_the_api_server_writes() {
    let mut derived = crate::admission::wire::request_members().to_vec();
    let mut written = member_order::REQUEST_ORDER.to_vec();
    derived.sort_unstable();
    written.sort_unstable();
    assert_eq!(derived, written);
}

/// The members after the objects (the API server writes `dryRun` and
/// `options` there) complete the head the single pass read for its plan:
/// read as reading every member at once reads them, and where that cannot
/// be told (a member of the head after the objects, a member written
/// twice, a value that does not read), every member is read again, with
/// the answer two passes give.
#[test]
fn members_after_the_objects_are_read_as_reading_all_members_at_once_reads_them() {
    let (old, new) = stale();
    let review = review(SCALER, old, new);
    let base = String::from_utf8(in_api_server_order(&review)).unwrap();
    let head_of = |request: &ReviewRequest<'_>| {
        format!(
            "{} {:?} {:?} {:?} {:?} {} {:?} {:?} {:?} {:?}",
            request.uid,
            request.kind,
            request.resource,
            request.sub_resource,
            request.namespace,
            request.name,
            request.operation,
            request.user_info,
            request.field_manager,
            request.dry_run,
        )
    };
    let rules = rules("enforce");
    let plan = reading(&rules, Endpoint::Validate, Proofs::Off);
    for (before, after) in [
        (
            "",
            r#","dryRun":true,"options":{"kind":"UpdateOptions","fieldManager":"scaler"}"#,
        ),
        ("", r#","options":{"fieldManager":"kubectl"},"dryRun":null"#),
        ("", r#","dryRun":false,"requestKind":{"kind":"Widget"},"options":null"#),
        ("", r#","options":7,"dryRun":true"#),
        ("", r#","dryRun":"yes""#),
        ("", r#","dryRun":true,"dryRun":false"#),
        ("", r#","options":{},"options":{"fieldManager":"x"}"#),
        (r#""dryRun":true,"#, r#","dryRun":true"#),
        (r#""options":{"fieldManager":"x"},"#, r#","dryRun":true"#),
        ("", r#","uid":"another""#),
        ("", r#","namespace":"other""#),
        (
            "",
            r#","userInfo":{"username":"system:serviceaccount:platform:widget-controller"}"#,
        ),
    ] {
        // Inserted after `"request":{`, and before the request's `}`.
        let at = base.find(r#""request":{"#).unwrap() + r#""request":{"#.len();
        let end = base.rfind("}}").unwrap();
        let body = format!("{}{before}{}{after}{}", &base[..at], &base[at..end], &base[end..]);
        let body = body.as_bytes();
        both_paths(body);
        match (one_pass::read(body, plan), parse_request(body)) {
            (Some((one, _, _)), Ok(two)) => assert_eq!(head_of(&one), head_of(&two), "{before} {after}"),
            (Some(_), Err(e)) => panic!("read in one pass, not in two ({e}): {before} {after}"),
            (None, _) => {}
        }
    }
    // The API server's order is read, its tail alone; a member written
    // twice is read by neither path.
    let read_alone = |after: &str| {
        let end = base.rfind("}}").unwrap();
        let body = format!("{}{after}{}", &base[..end], &base[end..]);
        one_pass::read(body.as_bytes(), plan).map(|(request, statuses, _)| (head_of(&request), statuses.is_some()))
    };
    let (head, projected) = read_alone(r#","dryRun":true"#).unwrap();
    assert!(projected && head.ends_with("None true"), "{head}");
    for twice in [r#","namespace":"other""#, r#","dryRun":true,"dryRun":false"#] {
        assert_eq!(read_alone(twice), None, "a member written twice is not read: {twice}");
    }
}

#[test]
fn an_object_before_user_info_is_decided_as_in_the_api_servers_order() {
    // Issue 22: `object` before `userInfo`, `oldObject` after it. The single
    // pass read `object` before it could plan, projected only `oldObject`,
    // and denied a write that changes nothing with 400 "a status UPDATE
    // review must carry object".
    let (old, _) = stale();
    let review = review(SCALER, old.clone(), old);
    let request = &review["request"];
    let mut members: Vec<String> = [
        "uid",
        "kind",
        "resource",
        "subResource",
        "operation",
        "object",
        "userInfo",
        "oldObject",
    ]
    .iter()
    .map(|key| format!("{}:{}", json!(key), request[key]))
    .collect();
    let body = |members: &[String]| {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{{}}}}}"#,
            members.join(",")
        )
        .into_bytes()
    };
    let rules = rules("enforce");
    for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
        let (_, decided) = read_and_decide(&rules, &body(&members), endpoint).unwrap();
        assert_eq!(decided.unwrap().outcome, Outcome::Allowed, "{endpoint:?}");
    }
    let expected = both_paths(&in_api_server_order(&review));
    assert_eq!(both_paths(&body(&members)), expected);
    // `object` before the resource or the operation too.
    members.swap(2, 5);
    assert_eq!(both_paths(&body(&members)), expected);
    members.swap(2, 5);
    members.swap(4, 5);
    assert_eq!(both_paths(&body(&members)), expected);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Issue 22: in any order of the envelope's, the request's, the
    /// objects' and the statuses' members, one pass answers what two
    /// passes answer, and what the API server's order gets.
    #[test]
    fn every_member_order_gets_the_answer_of_the_api_servers_order(
        old in status(), new in status(), writer in writer(),
        unchanged in any::<bool>(),
        sub in prop::sample::select(vec![Some("status"), Some("status"), None]),
        objects in prop::sample::select(vec!["both", "both", "no object", "null old", "no status"]),
        ranks in prop::collection::vec(any::<u32>(), 1..64),
    ) {
        let new = if unchanged { old.clone() } else { new };
        let r = with_objects(review_with(writer, vec![], "UPDATE", sub, "widgets", old, new), objects);
        let expected = both_paths(&in_api_server_order(&r));
        prop_assert_eq!(both_paths(&in_order_of(&r, &ranks)), expected);
    }
}

mod keyed;

/// Issue 25: the Gateway route's stale retry (16 entries of the other
/// implementation rolled back) is decided at `/validate` on fingerprints:
/// the entries are proven changed and never built, and the decision names
/// what building and comparing them (`/mutate`) names. An entry written
/// back with the same value in other text is no change.
#[test]
fn rolled_back_entries_are_proven_changed_unbuilt_and_named_as_building_names_them() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let text = std::fs::read_to_string(examples.join("gateway-api.yaml")).unwrap();
    let stale = std::fs::read(examples.join("gateway-route-stale-review.json")).unwrap();
    let rules = |mode: &str| Ownership::from_yaml(&text.replace("mode: enforce", &format!("mode: {mode}"))).unwrap();
    let trim = rules("trim");
    let (_, statuses, _) = one_pass::read(&stale, reading(&trim, Endpoint::Validate, Proofs::Names)).unwrap();
    let statuses = statuses.unwrap();
    let parents = crate::ownership::FieldPath::parse("parents").unwrap();
    assert_eq!(
        statuses.changed.of(&parents).collect::<Vec<_>>(),
        ["istio.io/gateway-controller"]
    );
    let entries = |status: &Option<Option<Value>>| status.clone().unwrap().unwrap()["parents"].clone();
    assert!(
        entries(&statuses.old).as_array().unwrap().iter().all(Value::is_null),
        "nothing of the entries is built"
    );
    let violations = |endpoint| {
        let (_, decided) = read_and_decide(&trim, &stale, endpoint).unwrap();
        decided.unwrap().violations
    };
    let proven = violations(Endpoint::Validate);
    assert_eq!(proven.len(), 1);
    assert_eq!(proven, violations(Endpoint::Mutate));
    // The trim, from the old entries alone (one of the 16 written back as
    // stored, so left alone), is the patch made from the whole statuses.
    let mut review: Value = serde_json::from_slice(&stale).unwrap();
    let first = (review["request"]["oldObject"]["status"]["parents"].as_array().unwrap())
        .iter()
        .position(|e| e["controllerName"] == "istio.io/gateway-controller")
        .unwrap();
    review["request"]["object"]["status"]["parents"][first] =
        review["request"]["oldObject"]["status"]["parents"][first].clone();
    let body = member_order::write(&review, &mut |members| {
        members.sort_by_key(|(k, _)| member_order::REQUEST_ORDER.iter().position(|r| r == k));
    });
    let statuses = one_pass::read(&body, reading(&trim, Endpoint::Mutate, Proofs::Restore))
        .unwrap()
        .1
        .unwrap();
    let groups: Vec<_> = statuses.changed.in_list(&parents).collect();
    assert_eq!(groups.len(), 1, "proven changed for the restore too");
    let same: Vec<bool> = groups[0].1.new_items.iter().map(|&(_, same)| same).collect();
    assert_eq!(same.iter().filter(|s| **s).count(), 1);
    assert!(
        [&statuses.old, &statuses.new].iter().all(|status| entries(status)
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_null)),
        "no entry is built: the restore writes the old ones' text"
    );
    let (request, trimmed) = read_and_decide(&trim, &body, Endpoint::Mutate).unwrap();
    let patch = trimmed.unwrap().response.patch.unwrap();
    let status = |object: &str| review["request"][object]["status"].clone();
    let whole = decide(
        &trim,
        &request.head(),
        Endpoint::Mutate,
        Some(Some(&status("oldObject"))),
        Some(Some(&status("object"))),
    )
    .unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch).unwrap();
    let whole: Vec<Value> = serde_json::from_slice(&whole.response.patch.unwrap()).unwrap();
    assert_eq!(ops, whole);
    assert_eq!(ops.len(), 15, "the entry written back as stored is left alone");
    // The same stale copy, but the other implementation's entries written
    // back as they are stored, in other text: each condition's members in
    // the other order, absent members as null. Allowed, as building and
    // comparing finds.
    let mut review: Value = serde_json::from_slice(&stale).unwrap();
    let stored = review["request"]["oldObject"]["status"]["parents"].clone();
    let written = review["request"]["object"]["status"]["parents"].as_array_mut().unwrap();
    for (entry, stored) in written.iter_mut().zip(stored.as_array().unwrap()) {
        if entry["controllerName"] == "istio.io/gateway-controller" {
            *entry = stored.clone();
            entry["conditions"][1]["added"] = Value::Null;
        }
    }
    let body = member_order::write(&review, &mut |members| {
        if members.iter().any(|(k, _)| *k == "lastTransitionTime") {
            members.reverse();
        } else {
            members.sort_by_key(|(k, _)| member_order::REQUEST_ORDER.iter().position(|r| r == k));
        }
    });
    let text = String::from_utf8(body.clone()).unwrap();
    assert!(
        text.contains(r#"{"type":"Accepted","status""#),
        "the conditions are written in another order"
    );
    for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
        let (_, decided) = read_and_decide(&rules("trim"), &body, endpoint).unwrap();
        assert_eq!(decided.unwrap().outcome, Outcome::Allowed, "{endpoint:?}");
    }
}

/// Issue 25: a keyed entry whose nested conditions a write rewrote (the
/// route's stale retry: two values in each of the 8 conditions of all 32
/// entries) is read against the first object's entry where it differs
/// (`Cursor::skip_against`), not whole; one pass answers what two passes
/// answer, also where the rewrite is not of values alone (a member more)
/// or is not JSON.
#[test]
fn rewritten_nested_conditions_are_read_against_the_first_where_they_differ() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let text = std::fs::read_to_string(examples.join("gateway-api.yaml")).unwrap();
    let stale = std::fs::read(examples.join("gateway-route-stale-review.json")).unwrap();
    // The second object read is `oldObject`: the API server writes it last.
    let body = String::from_utf8(stale.clone()).unwrap();
    let second = body.rfind("\"oldObject\"").unwrap();
    let in_second = |from: &str, to: &str| {
        let at = second + body[second..].find(from).unwrap();
        format!("{}{to}{}", &body[..at], &body[at + from.len()..]).into_bytes()
    };
    let member_more = in_second(r#""type":"Accepted","#, r#""type":"Accepted","added":1,"#);
    let not_json = in_second(r#""observedGeneration":"#, r#""observedGeneration":0"#);
    // How many entries are read against the first at least; `None`: the
    // single pass gives up (and two passes answer).
    for (case, body, read_against) in [
        ("the stale retry", &stale, Some(32)),
        ("a condition with a member more", &member_more, Some(31)),
        ("a condition that is not JSON", &not_json, None),
    ] {
        for mode in ["enforce", "trim", "audit"] {
            let rules = Ownership::from_yaml(&text.replace("mode: enforce", &format!("mode: {mode}"))).unwrap();
            for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
                let before = crate::admission::cursor::read_against();
                let one_pass = answered(read_and_decide(&rules, body, endpoint));
                let read = crate::admission::cursor::read_against() - before;
                let two_passes = parse_request(body).map(|request| {
                    let decided = decide_request(&rules, &request, endpoint);
                    (request, decided)
                });
                assert_eq!(one_pass, answered(two_passes), "{case}, {mode} {endpoint:?}");
                // Where the mode reads objects at this endpoint.
                let proofs = match (mode, endpoint) {
                    ("enforce", Endpoint::Validate) => Proofs::Names,
                    ("trim", Endpoint::Mutate) => Proofs::Restore,
                    _ => continue,
                };
                let single_pass = one_pass::read(body, reading(&rules, endpoint, proofs));
                match read_against {
                    Some(at_least) => {
                        assert!(single_pass.is_some(), "{case}, {mode} {endpoint:?}: read in one pass");
                        assert!(
                            read >= at_least,
                            "{case}, {mode} {endpoint:?}: {read} read against the first"
                        );
                    }
                    None => assert!(single_pass.is_none(), "{case}, {mode} {endpoint:?}: left to two passes"),
                }
            }
        }
    }
}

/// Issue 25: an observed write is read as fast as any other, and the
/// observer is given the statuses' text as the single pass found it (the
/// second status read, or taken as the first's text): it reads from it what
/// it reads from the wire's parse.
#[test]
fn an_observed_write_is_copied_from_the_single_pass_as_the_wire_reads_it() {
    use crate::admission::answer::answer_observing;
    use crate::admission::observe::{self, Copied, ReviewedWrite};
    let rules = rules("enforce");
    let (old, new) = stale();
    for (old, new, changes) in [(old.clone(), new, true), (old.clone(), old, false)] {
        let body = in_api_server_order(&review(SCALER, old, new));
        let (_, statuses, _) = one_pass::read(&body, reading(&rules, Endpoint::Validate, Proofs::Names)).unwrap();
        assert!(statuses.is_some(), "projected in the single pass");
        let Copied::Write(write) = answer_observing(Some(&rules), &body, Endpoint::Validate, true).1 else {
            panic!("the write is copied for the observer");
        };
        let request = parse_request(&body).unwrap();
        let wire = ReviewedWrite::of(&request, StatusTexts::of(&request), &rules).unwrap();
        let observed = observe::read(*write, &rules).unwrap().unwrap();
        assert_eq!(observed, observe::read(wire, &rules).unwrap().unwrap());
        assert_eq!(!observed.changed.is_empty(), changes, "{:?}", observed.changed);
    }
}

/// Issue 25: an item of the second object whose text is the first's but
/// for one member's value is read as that value alone, its other members
/// taken by their text; an item that differs otherwise (two values, a
/// member more) is read member by member. One pass answers what two passes
/// answer either way.
#[test]
fn an_item_changed_in_one_value_is_read_as_that_value() {
    let rules = rules("enforce");
    let ready = json!({"type": "Ready", "status": "True", "message": "m", "observedGeneration": 2, "reason": "R"});
    let old = json!({"observedGeneration": 2, "conditions": [ready, {"type": "Other", "status": "True"}]});
    let taken = |new: &Value| {
        let body = in_api_server_order(&review(SCALER, old.clone(), new.clone()));
        let before = crate::admission::cursor::taken_by_text();
        let one_pass = answered(read_and_decide(&rules, &body, Endpoint::Validate));
        let taken = crate::admission::cursor::taken_by_text() - before;
        let request = parse_request(&body).unwrap();
        let decided = decide_request(&rules, &request, Endpoint::Validate);
        assert_eq!(one_pass, answered(Ok((request, decided))), "{new}");
        taken
    };
    // The object's four members taken whole.
    assert_eq!(taken(&old), 4);
    type Change = fn(&mut Value);
    let cases: [(&str, Change, usize); 8] = [
        ("the first member", |c| c["message"] = json!("other"), 4),
        ("a middle member, longer", |c| c["observedGeneration"] = json!(12345), 4),
        ("a middle member, shorter", |c| c["reason"] = json!(""), 4),
        ("the last member, the key value", |c| c["type"] = json!("Readier"), 4),
        (
            "a member's value, an object",
            |c| c["status"] = json!({"a": [1, {"b": null}]}),
            4,
        ),
        // A key renamed in its place: read member by member.
        (
            "a key",
            |c| {
                let reason = c["reason"].take();
                c.as_object_mut().unwrap().remove("reason");
                c["raison"] = reason;
            },
            4,
        ),
        // Read member by member: message, reason and type differ or
        // move, the rest are taken at their place.
        (
            "two members",
            |c| {
                c["message"] = json!("x");
                c["reason"] = json!("y");
            },
            3,
        ),
        // "extra" sorts first: every member after it is at another place.
        ("a member more", |c| c["extra"] = json!(1), 0),
    ];
    for (what, change, members_taken) in cases {
        let mut new = old.clone();
        change(&mut new["conditions"][0]);
        // The object's apiVersion, kind and metadata, the status's
        // observedGeneration, the item Other; and Ready's members.
        assert_eq!(taken(&new), 3 + 1 + 1 + members_taken, "{what}");
    }
}

// ---- items read against the item before -------------------------------------

/// The body of `writer`'s review with the texts `old` and `new` as the
/// statuses' `conditions`, in the API server's order.
fn with_condition_texts(writer: &str, old: &str, new: &str) -> Vec<u8> {
    let status = |at: &str| json!({"observedGeneration": 2, "conditions": at});
    let body = in_api_server_order(&review(writer, status("@old@"), status("@new@")));
    String::from_utf8(body)
        .unwrap()
        .replace(r#""@old@""#, old)
        .replace(r#""@new@""#, new)
        .into_bytes()
}

/// Whether one pass reads `body` (rather than leave it to two passes).
fn read_in_one_pass(body: &[u8]) -> bool {
    one_pass::read(body, reading(&rules("enforce"), Endpoint::Validate, Proofs::Names)).is_some()
}

/// Two lists of condition items alike (see
/// [`crate::test_support::alike_items`]), from the same members.
fn alike_item_lists() -> impl Strategy<Value = (String, String)> {
    crate::test_support::alike_item_members().prop_flat_map(|base| {
        (
            crate::test_support::alike_items(base.clone()),
            crate::test_support::alike_items(base),
        )
    })
}

proptest! {
    /// Issue 25: in the object read first, a condition item is read against
    /// the item before it (its members alike taken unread, moved with their
    /// noted starts); one pass still answers what two passes answer.
    #[test]
    fn items_read_against_the_item_before_answer_as_two_passes_answer(
        (old, new) in alike_item_lists(), writer in writer(),
    ) {
        let body = with_condition_texts(writer, &old, &new);
        both_paths(&body);
        // Every such body is read in one pass: a read that gave up would
        // be answered by two passes, and agree.
        prop_assert!(read_in_one_pass(&body), "read in one pass");
    }
}

/// Issue 25: the fixture's kind of conditions, alike but for their type:
/// in the object read first each item after the first is taken from the
/// one before but for its type, and a nested value taken so is read
/// against by the object read second, as if read.
#[test]
fn alike_items_are_taken_from_the_item_before() {
    let condition = |kind: &str, generation: u32| {
        format!(
            r#"{{"lastTransitionTime":"2026-12-01T10:00:00Z","message":"{}","nested":{{"a":[1,"x"],"g":{generation}}},"observedGeneration":{generation},"status":"True","type":"{kind}"}}"#,
            "m".repeat(50)
        )
    };
    let list = |generation: u32| {
        let types = ["Ready", "Progressing", "Scaled", "Healthy", "Degraded", "Reviewed"];
        let items: Vec<String> = types.iter().map(|kind| condition(kind, generation)).collect();
        format!("[{}]", items.join(","))
    };
    // The scaler's stale retry: every condition's generation rolled back.
    let body = with_condition_texts(SCALER, &list(2), &list(1));
    both_paths(&body);
    assert!(read_in_one_pass(&body), "read in one pass");
    let rules = rules("enforce");
    let (taken, against) = (
        crate::admission::cursor::taken_by_text(),
        crate::admission::cursor::read_against(),
    );
    let answer = answered(read_and_decide(&rules, &body, Endpoint::Validate));
    assert!(answer.starts_with("Denied"), "{answer}");
    let (taken, against) = (
        crate::admission::cursor::taken_by_text() - taken,
        crate::admission::cursor::read_against() - against,
    );
    // The object read first: the five members before the type of each of
    // the five items after the first, taken from the item before. The
    // object read second: each item's two members before `nested`, and
    // its two after `observedGeneration`, taken from the first object's;
    // the object's apiVersion, kind and metadata, and the status's
    // observedGeneration.
    assert_eq!(taken, 5 * 5 + 6 * (2 + 2) + 3 + 1, "taken by text");
    // Each item's `nested` read against the first object's, which needs the
    // starts noted in it: for five of the six, moved from the item before.
    assert_eq!(against, 6, "read against the first object's");
}
