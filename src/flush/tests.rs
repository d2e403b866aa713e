use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;

fn paths(texts: &[&str]) -> Vec<FieldPath> {
    drop_nested(texts.iter().map(|t| FieldPath::parse(t).unwrap()).collect())
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
    let patch = status_merge_patch(&paths(&["observedGeneration"]), &conditions(), &staged, &stored).unwrap();
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
    for (what, owned, staged, stored, expected) in cases {
        let patch = status_merge_patch(
            &paths(&owned),
            &conditions(),
            &object("1", staged),
            &object("2", stored),
        )
        .unwrap();
        assert_eq!(patch.get("status"), expected.as_ref(), "{what}");
    }
}

#[test]
fn the_patch_needs_a_resource_version() {
    let staged = json!({"metadata": {"name": "w"}, "status": {}});
    assert!(matches!(
        status_merge_patch(&[], &conditions(), &staged, &staged),
        Err(FlushError::MissingMetadata("resourceVersion"))
    ));
}

#[test]
fn after_a_conflict_owned_conditions_win_and_the_others_come_from_the_server() {
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
    assert_eq!(
        merge_conditions(&staged, &stored, &owned),
        [
            json!({"type": "Ready", "status": "True"}),
            json!({"type": "Scaled", "status": "True"}),
            json!({"type": "Healthy", "status": "True"}),
        ]
    );
    // An unowned condition the server no longer has is dropped.
    assert_eq!(
        merge_conditions(&[json!({"type": "Gone"})], &[], &owned),
        Vec::<Value>::new()
    );
}

#[test]
fn a_path_below_a_scalar_is_found() {
    let p = |s| FieldPath::parse(s).unwrap();
    let status = json!({"summary": 5, "a": {"b": "x"}, "n": null});
    assert!(runs_below_non_object(Some(&status), &p("summary.ready")));
    assert!(runs_below_non_object(Some(&status), &p("a.b.c")));
    assert!(!runs_below_non_object(Some(&status), &p("a.b")));
    assert!(!runs_below_non_object(Some(&status), &p("n.x")));
    assert!(!runs_below_non_object(Some(&status), &p("missing.x")));
    assert!(!runs_below_non_object(None, &p("a.b")));
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
    assert_eq!(writer.owned.unwrap().fields, paths(&["summary"]));
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
    let writer = StatusWriter::for_writer(
        test_api(),
        &ownership,
        "example.com",
        "widgets",
        "system:serviceaccount:platform:widget-scaler",
    )
    .unwrap();
    assert_eq!(
        writer.owned.unwrap().fields,
        paths(&["replicas", "scale.lastScaleTime"])
    );
    assert_eq!(writer.owned_conditions, ["Scaled".to_owned()].into());
    let nobody = StatusWriter::for_writer(test_api(), &ownership, "example.com", "widgets", "nobody").unwrap();
    assert_eq!(
        nobody.owned,
        Some(Owned::default()),
        "an unlisted writer owns nothing, but still patches"
    );
    assert!(matches!(
        StatusWriter::for_writer(test_api(), &ownership, "", "pods", "x"),
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
    let delay = policy.delay_before(3);
    assert!(
        delay >= Duration::from_millis(10) && delay <= Duration::from_millis(11),
        "{delay:?}"
    );
}
