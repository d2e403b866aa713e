use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use super::patch::merge_keyed;
use super::*;
use crate::ownership::{KeyedList, same_value};

fn paths(texts: &[&str]) -> Vec<FieldPath> {
    drop_nested(texts.iter().map(|t| FieldPath::parse(t).unwrap()).collect())
}

fn owned(fields: &[&str], types: &[&str]) -> Owned {
    Owned::new(paths(fields), types.iter().copied())
}

fn patch_of(owned: &Owned, staged: &Value, stored: &Value) -> Value {
    status_merge_patch(owned, &conditions(), staged, stored, "7")
}

fn object(rv: &str, status: Value) -> Value {
    json!({"metadata": {"name": "w", "uid": "u1", "resourceVersion": rv}, "status": status})
}

fn conditions() -> FieldPath {
    FieldPath::parse("conditions").unwrap()
}

#[test]
fn the_patch_holds_only_the_resource_version_declared_fields_and_conditions() {
    let staged = object(
        "7",
        json!({"observedGeneration": 3, "replicas": 9, "conditions": [{"type": "Ready"}]}),
    );
    let stored = object("8", json!({"observedGeneration": 2, "replicas": 5}));
    let patch = patch_of(&owned(&["observedGeneration"], &["Ready"]), &staged, &stored);
    assert_eq!(
        patch,
        json!({"metadata": {"resourceVersion": "7"}, "status": {"observedGeneration": 3, "conditions": [{"type": "Ready"}]}})
    );
}

#[test]
fn patch_shapes() {
    // (what, owned, staged status, stored status, the patch's status)
    let cases = [
        (
            "cleared field is removed",
            vec!["note"],
            json!({}),
            json!({"note": "x"}),
            Some(json!({"note": null})),
        ),
        ("absent on both: nothing", vec!["note"], json!({}), json!({}), None),
        (
            "staged null is cleared",
            vec!["note"],
            json!({"note": null}),
            json!({"note": "x"}),
            Some(json!({"note": null})),
        ),
        (
            "nested path leaves its sibling to the server",
            vec!["summary.ready"],
            json!({"summary": {"ready": 2, "total": 9}}),
            json!({"summary": {"ready": 1, "total": 3}}),
            Some(json!({"summary": {"ready": 2}})),
        ),
        (
            "a whole object: stored children the staged lacks become null, at every depth",
            vec!["summary"],
            json!({"summary": {"ready": 2, "details": {}}}),
            json!({"summary": {"ready": 1, "total": 0, "details": {"ready": 0}}}),
            Some(json!({"summary": {"ready": 2, "total": null, "details": {"ready": null}}})),
        ),
        (
            "a child whose parent the server lacks: no parent made",
            vec!["summary.details.ready"],
            json!({}),
            json!({}),
            None,
        ),
        (
            "a null parent stays null",
            vec!["extra.a"],
            json!({"extra": null}),
            json!({"extra": null}),
            None,
        ),
        (
            "a staged value creates its parents",
            vec!["summary.details.ready"],
            json!({"summary": {"details": {"ready": 1}}}),
            json!({}),
            Some(json!({"summary": {"details": {"ready": 1}}})),
        ),
        (
            "int64 beyond 2^53 is exact",
            vec!["bigNumber"],
            json!({"bigNumber": 9223372036854775807_i64}),
            json!({"bigNumber": 1}),
            Some(json!({"bigNumber": 9223372036854775807_i64})),
        ),
    ];
    for (what, fields, staged, stored, expected) in cases {
        let patch = patch_of(&owned(&fields, &[]), &object("1", staged), &object("2", stored));
        assert_eq!(patch.get("status"), expected.as_ref(), "{what}");
    }
}

/// Regression (issue 11, item 3): the conditions sent depend only on the
/// staged and the stored object, never on whether a conflict happened. A
/// staged status without a list leaves every stored condition alone.
#[test]
fn without_a_staged_conditions_list_no_condition_is_touched() {
    let stored = object("8", json!({"conditions": [{"type": "Ready", "status": "True"}]}));
    let writer = owned(&["replicas"], &["Ready"]);
    for staged_status in [json!({"replicas": 3}), json!(null)] {
        let patch = patch_of(&writer, &object("7", staged_status.clone()), &stored);
        assert!(
            patch.pointer("/status/conditions").is_none(),
            "{staged_status}: {patch}"
        );
    }
    // With a list, the owned types are as staged (Ready dropped) and the
    // others as stored, on the first attempt as on a retry.
    let staged = object("7", json!({"conditions": [{"type": "Other", "status": "Stale"}]}));
    let stored = object(
        "8",
        json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "Fresh"}]}),
    );
    assert_eq!(
        patch_of(&writer, &staged, &stored)["status"]["conditions"],
        json!([{"type": "Other", "status": "Fresh"}])
    );
}

fn types() -> KeyedList {
    KeyedList {
        path: conditions(),
        key: "type".to_owned(),
    }
}

fn merge_conditions(staged: &[Value], stored: &[Value], owned: &BTreeSet<String>) -> Vec<Value> {
    merge_keyed(&types(), staged, stored, owned)
}

#[test]
fn owned_conditions_win_and_the_others_come_from_the_server() {
    let owned: BTreeSet<String> = ["Ready".to_owned()].into();
    let staged = [
        json!({"type": "Ready", "status": "True"}),
        json!({"type": "Scaled", "status": "False"}),
    ];
    let stored = [
        json!({"type": "Scaled", "status": "True"}),
        json!({"type": "Ready", "status": "False"}),
        json!({"type": "Healthy", "status": "True"}),
    ];
    // In the stored order: the staged order of a stale copy moves no one's item.
    assert_eq!(
        merge_conditions(&staged, &stored, &owned),
        [
            json!({"type": "Scaled", "status": "True"}),
            json!({"type": "Ready", "status": "True"}),
            json!({"type": "Healthy", "status": "True"}),
        ]
    );
    // An unowned condition the server no longer has is dropped.
    assert_eq!(
        merge_conditions(&[json!({"type": "Gone"})], &[], &owned),
        Vec::<Value>::new()
    );
}

/// Issue 11, item 2: inside an owned value, `null` and absent are the same
/// for the library too: applying the patch leaves the owned value equal (as
/// the webhook compares) to the staged one, nulls or not.
#[test]
fn applied_patches_hold_the_staged_value_with_nulls_as_absences() {
    let writer = owned(&["extra"], &[]);
    for (staged, stored) in [
        (json!({"extra": {"a": null, "b": 1}}), json!({"extra": {"a": "x"}})),
        (json!({"extra": {"a": {"n": null}}}), json!({})),
        (json!({"extra": {}}), json!({"extra": {"a": "x", "b": 2}})),
    ] {
        let (staged, mut stored) = (object("7", staged), object("8", stored));
        let patch = patch_of(&writer, &staged, &stored);
        json_patch::merge(&mut stored, &patch);
        let path = FieldPath::parse("extra").unwrap();
        assert!(
            same_value(path.get(stored.get("status")), path.get(staged.get("status"))),
            "{stored} vs {staged}"
        );
    }
}

fn test_api() -> Api<kube::api::DynamicObject> {
    let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let gvk = kube::api::GroupVersionKind::gvk("example.com", "v1", "Widget");
    Api::namespaced_with(
        client,
        "ns",
        &kube::api::ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

#[tokio::test]
async fn declared_paths_are_checked_and_nested_ones_dropped_across_calls() {
    let writer = StatusWriter::new(test_api())
        .owned_fields(["summary.ready"])
        .unwrap()
        .owned_fields(["summary"])
        .unwrap();
    assert_eq!(writer.owned.fields(), paths(&["summary"]));
    for bad in ["", ".a", "a.", "a..b"] {
        assert!(
            matches!(
                StatusWriter::new(test_api()).owned_fields([bad]),
                Err(FlushError::InvalidPath(_))
            ),
            "{bad:?}"
        );
    }
    for bad in ["conditions", "conditions.x"] {
        assert!(
            matches!(
                StatusWriter::new(test_api()).owned_fields([bad]),
                Err(FlushError::OverlapsConditions { .. })
            ),
            "{bad}"
        );
    }
    let moved = StatusWriter::new(test_api())
        .owned_fields(["health"])
        .unwrap()
        .conditions_path("health.checks");
    assert!(matches!(moved, Err(FlushError::OverlapsConditions { .. })));
}

#[tokio::test]
async fn a_writer_from_the_ownership_document_owns_what_the_webhook_enforces() {
    let ownership = Ownership::from_yaml(include_str!("../../examples/ownership.yaml")).unwrap();
    let widgets = GroupResource::new("example.com", "widgets");
    let writer = StatusWriter::for_writer(
        test_api(),
        &ownership,
        &widgets,
        "system:serviceaccount:platform:widget-scaler",
    )
    .unwrap();
    assert_eq!(writer.owned.fields(), paths(&["replicas", "scale.lastScaleTime"]));
    assert_eq!(writer.owned.conditions(), &BTreeSet::from(["Scaled".to_owned()]));
    let nobody = StatusWriter::for_writer(test_api(), &ownership, &widgets, "nobody").unwrap();
    assert_eq!(nobody.owned, Owned::default(), "an unlisted writer owns nothing");
    assert!(matches!(
        StatusWriter::for_writer(test_api(), &ownership, &GroupResource::new("", "pods"), "x"),
        Err(FlushError::NotConfigured(_))
    ));
}

#[tokio::test]
async fn the_schema_check_finds_paths_the_api_server_would_prune() {
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(include_str!("../../tests/cluster/widget-crd.yaml")).unwrap();
    let good = StatusWriter::new(test_api())
        .owned_fields(["observedGeneration", "summary.details.ready"])
        .unwrap();
    assert!(good.check_schema(&crd, "v1").is_ok());
    let typo = StatusWriter::new(test_api())
        .owned_fields(["observedGeneraton", "summary.redy"])
        .unwrap();
    match typo.check_schema(&crd, "v1") {
        Err(FlushError::UnknownFields(fields)) => assert_eq!(fields, ["observedGeneraton", "summary.redy"]),
        other => panic!("{other:?}"),
    }
    assert!(matches!(good.check_schema(&crd, "v2"), Err(FlushError::NoSchema(_))));
}

#[test]
fn the_default_retry_is_client_gos() {
    let policy = RetryPolicy::default();
    assert_eq!((policy.attempts, policy.delay), (5, Duration::from_millis(10)));
    let delays: Vec<Duration> = policy.delays().collect();
    assert_eq!(delays.len(), 4, "a wait before each of the 4 retries");
    for delay in delays {
        assert!(
            delay >= Duration::from_millis(10) && delay <= Duration::from_millis(11),
            "{delay:?}"
        );
    }
}

/// Regression (issue 11, item 5): a negative, NaN or huge factor used to
/// panic in `Duration::from_secs_f64`; such policies cannot be built now,
/// and no valid one waits past the cap.
#[test]
fn retry_policies_are_checked_when_built_and_never_panic() {
    let base = || RetryPolicy::new(100, Duration::from_secs(1)).unwrap();
    for factor in [-1.0, f64::NAN, f64::INFINITY, 0.5, 1e300] {
        assert!(
            matches!(base().backoff(factor), Err(FlushError::InvalidRetry(_))),
            "{factor}"
        );
    }
    for jitter in [-0.1, f64::NAN, 2.0] {
        assert!(
            matches!(base().jitter(jitter), Err(FlushError::InvalidRetry(_))),
            "{jitter}"
        );
    }
    assert!(RetryPolicy::new(0, Duration::ZERO).is_err());
    assert!(RetryPolicy::new(1, Duration::from_secs(3600)).is_err());
    let steep = base().backoff(10.0).unwrap().jitter(1.0).unwrap();
    let delays: Vec<Duration> = steep.delays().collect();
    assert_eq!(delays.len(), 99);
    assert!(delays.iter().all(|delay| *delay <= MAX_RETRY_DELAY), "{delays:?}");
    let most_retries = RetryPolicy::new(u32::MAX, MAX_RETRY_DELAY)
        .unwrap()
        .backoff(10.0)
        .unwrap();
    assert!(most_retries.delays().take(1000).all(|delay| delay <= MAX_RETRY_DELAY));
}

mod keyed;
