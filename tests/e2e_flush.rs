//! The library's status flush against the real API server.

mod support;

use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use statusguard::flush::{FlushError, RetryPolicy, StatusWriter};
use statusguard::ownership::{GroupResource, Ownership};
use statusguard::rules::{ConfigMapRef, RulesSource};
use support::cluster::{self, Cluster};
use support::legacy::replace_status_with_naive_retry;
use support::scenario::Scenario;

const NAMESPACE: &str = "e2e-flush";

async fn setup() -> (Api<DynamicObject>, kube::Client) {
    let cluster = Cluster::shared();
    let admin = cluster.admin().await;
    cluster::install_widget_crd(&admin).await;
    cluster::namespace(&admin, NAMESPACE, json!({})).await;
    (cluster::widgets(&admin, NAMESPACE), admin)
}

/// A Widget stored with `status`, read back as the staged copy.
async fn widget(api: &Api<DynamicObject>, name: &str, status: Value) -> DynamicObject {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": 1}
    }))
    .unwrap();
    let mut created = api.create(&PostParams::default(), &object).await.unwrap();
    created.data["status"] = status;
    api.replace_status(name, &PostParams::default(), &created)
        .await
        .unwrap()
}

/// The stored status, untyped: a stored zero is not an absent field here.
async fn stored_status(api: &Api<DynamicObject>, name: &str) -> Value {
    api.get(name).await.unwrap().data["status"].clone()
}

/// Another writer's merge patch, between the staged read and the flush.
async fn other_writer(api: &Api<DynamicObject>, name: &str, status: Value) {
    let patch = kube::api::Patch::Merge(json!({ "status": status }));
    api.patch_status(name, &Default::default(), &patch).await.unwrap();
}

#[tokio::test]
async fn a_conflict_is_retried_and_the_other_writers_value_survives() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "conflict", json!({"observedGeneration": 1, "replicas": 3})).await;
    other_writer(&api, "conflict", json!({"observedGeneration": 2})).await;
    staged.data["status"]["replicas"] = json!(5);
    let writer = StatusWriter::new(api.clone()).owned_fields(["replicas"]).unwrap();
    let report = writer.flush(&mut staged).await.unwrap();
    assert_eq!(
        report.attempts, 2,
        "the first patch conflicts on the staged resourceVersion"
    );
    assert_eq!(
        stored_status(&api, "conflict").await,
        json!({"observedGeneration": 2, "replicas": 5})
    );
}

#[tokio::test]
async fn the_legacy_full_update_retry_rolls_the_other_writer_back() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "legacy", json!({"observedGeneration": 1, "replicas": 3})).await;
    other_writer(&api, "legacy", json!({"observedGeneration": 2})).await;
    staged.data["status"]["replicas"] = json!(5);
    let attempts = replace_status_with_naive_retry(&api, &mut staged, 5).await.unwrap();
    assert_eq!(attempts, 2);
    assert_eq!(
        stored_status(&api, "legacy").await["observedGeneration"],
        1,
        "rolled back: the bug statusguard ends"
    );
}

#[tokio::test]
async fn only_declared_fields_are_written_and_memory_holds_the_servers_state() {
    let (api, _) = setup().await;
    let mut staged = widget(
        &api,
        "declared",
        json!({"observedGeneration": 1, "replicas": 3, "note": "server"}),
    )
    .await;
    staged.data["status"]["replicas"] = json!(4);
    staged.data["status"]["observedGeneration"] = json!(9);
    staged.data["status"]["note"] = json!("staged");
    let writer = StatusWriter::new(api.clone()).owned_fields(["replicas"]).unwrap();
    assert_eq!(writer.flush(&mut staged).await.unwrap().attempts, 1);
    let stored = stored_status(&api, "declared").await;
    assert_eq!(
        stored,
        json!({"observedGeneration": 1, "replicas": 4, "note": "server"})
    );
    assert_eq!(
        staged.data["status"], stored,
        "no undeclared staged value survives in memory"
    );
}

#[tokio::test]
async fn a_declared_field_the_staged_object_cleared_is_removed() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "cleared", json!({"replicas": 3, "note": "x"})).await;
    staged.data["status"].as_object_mut().unwrap().remove("note");
    StatusWriter::new(api.clone())
        .owned_fields(["note"])
        .unwrap()
        .flush(&mut staged)
        .await
        .unwrap();
    assert_eq!(stored_status(&api, "cleared").await, json!({"replicas": 3}));
}

#[tokio::test]
async fn a_nested_declared_path_leaves_its_sibling_to_the_server() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "nested", json!({"summary": {"ready": 1, "total": 3}})).await;
    other_writer(&api, "nested", json!({"summary": {"total": 4}})).await;
    staged.data["status"]["summary"] = json!({"ready": 2, "total": 99});
    StatusWriter::new(api.clone())
        .owned_fields(["summary.ready"])
        .unwrap()
        .flush(&mut staged)
        .await
        .unwrap();
    assert_eq!(
        stored_status(&api, "nested").await,
        json!({"summary": {"ready": 2, "total": 4}})
    );
}

#[tokio::test]
async fn a_wholly_declared_object_loses_the_children_the_staged_object_dropped() {
    let (api, _) = setup().await;
    for conflict in [false, true] {
        let name = format!("whole-{conflict}");
        // total: 0 and details.ready: 0 are stored zeros a typed read would drop.
        let mut staged = widget(
            &api,
            &name,
            json!({"summary": {"ready": 1, "total": 0, "details": {"ready": 0}}}),
        )
        .await;
        if conflict {
            other_writer(&api, &name, json!({"observedGeneration": 5})).await;
        }
        staged.data["status"]["summary"] = json!({"ready": 2});
        let writer = StatusWriter::new(api.clone()).owned_fields(["summary"]).unwrap();
        let report = writer.flush(&mut staged).await.unwrap();
        assert_eq!(report.attempts, if conflict { 2 } else { 1 });
        let stored = stored_status(&api, &name).await;
        assert_eq!(stored["summary"], json!({"ready": 2}), "conflict: {conflict}");
        if conflict {
            assert_eq!(stored["observedGeneration"], 5);
        }
    }
}

fn condition(ty: &str, status: &str) -> Value {
    json!({"type": ty, "status": status, "reason": "R", "message": "", "lastTransitionTime": "2026-12-01T10:00:00Z"})
}

#[tokio::test]
async fn owned_conditions_are_written_as_staged_and_the_others_kept_as_stored() {
    let (api, _) = setup().await;
    let (ready, scaled) = (|s| condition("Ready", s), |s| condition("Scaled", s));
    let healthy = condition("Healthy", "True");
    let writer = StatusWriter::new(api.clone())
        .owned_fields(["replicas"])
        .unwrap()
        .owned_conditions(["Ready"]);

    // Without a conflict: Ready as staged; Scaled is not ours and stays as stored.
    let mut staged = widget(&api, "conds", json!({"conditions": [ready("False"), scaled("False")]})).await;
    staged.data["status"]["conditions"] = json!([ready("True"), scaled("True")]);
    assert_eq!(writer.flush(&mut staged).await.unwrap().attempts, 1);
    assert_eq!(
        stored_status(&api, "conds").await["conditions"],
        json!([ready("True"), scaled("False")])
    );

    // After a conflict the same holds: the other writer's changed and added
    // conditions survive, the owned one wins.
    other_writer(
        &api,
        "conds",
        json!({"conditions": [ready("False"), scaled("True"), healthy.clone()]}),
    )
    .await;
    staged.data["status"]["conditions"] = json!([ready("Unknown"), scaled("False")]);
    assert_eq!(writer.flush(&mut staged).await.unwrap().attempts, 2);
    assert_eq!(
        stored_status(&api, "conds").await["conditions"],
        json!([ready("Unknown"), scaled("True"), healthy])
    );
}

/// Regression (issue 11, item 3): a staged status without a conditions list
/// (a kube-rs status skips an empty Vec) left the stored Ready alone without
/// a conflict, and removed it after one. It is left alone either way now.
#[tokio::test]
async fn a_staged_status_without_conditions_keeps_them_with_or_without_a_conflict() {
    let (api, _) = setup().await;
    let writer = StatusWriter::new(api.clone())
        .owned_fields(["replicas"])
        .unwrap()
        .owned_conditions(["Ready"]);
    for conflict in [false, true] {
        let name = format!("no-list-{conflict}");
        let mut staged = widget(
            &api,
            &name,
            json!({"replicas": 1, "conditions": [condition("Ready", "True")]}),
        )
        .await;
        if conflict {
            other_writer(&api, &name, json!({"observedGeneration": 3})).await;
        }
        staged.data["status"] = json!({"replicas": 2});
        let report = writer.flush(&mut staged).await.unwrap();
        assert_eq!(report.attempts, if conflict { 2 } else { 1 });
        assert_eq!(
            stored_status(&api, &name).await["conditions"],
            json!([condition("Ready", "True")]),
            "conflict: {conflict}"
        );
    }
}

#[tokio::test]
async fn absent_and_null_parents_stay_as_they_are() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "parents", json!({"replicas": 1, "extra": null})).await;
    let writer = StatusWriter::new(api.clone())
        .owned_fields(["summary.details.ready", "extra.a"])
        .unwrap();
    writer.flush(&mut staged).await.unwrap();
    let raw = serde_json::to_value(api.get("parents").await.unwrap()).unwrap();
    assert!(
        raw["status"].get("summary").is_none(),
        "no parent was created: {}",
        raw["status"]
    );
    assert_eq!(
        raw["status"].get("extra"),
        Some(&Value::Null),
        "the null parent stays null: {}",
        raw["status"]
    );
}

#[tokio::test]
async fn an_object_deleted_and_recreated_under_the_same_name_is_not_written() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "recreated", json!({"replicas": 1})).await;
    api.delete("recreated", &DeleteParams::default()).await.unwrap();
    widget(&api, "recreated", json!({"replicas": 2})).await;
    staged.data["status"]["replicas"] = json!(3);
    let result = StatusWriter::new(api.clone())
        .owned_fields(["replicas"])
        .unwrap()
        .flush(&mut staged)
        .await;
    assert!(matches!(result, Err(FlushError::UidMismatch { .. })), "{result:?}");
    assert_eq!(stored_status(&api, "recreated").await["replicas"], 2);
    assert_eq!(staged.data["status"]["replicas"], 3, "the caller's object is as it was");
}

/// Regression (issue 11, item 4): after a 409 the flush used to copy the
/// server's resourceVersion and conditions into the caller's object, and
/// kept them when the flush then failed. A failed flush now leaves the
/// caller's object exactly as it was.
#[tokio::test]
async fn a_failed_flush_leaves_the_callers_object_as_it_was() {
    let s = Scenario::new("e2e-flush-untouched").await;
    let (_server, _dir) = s.guarded_by(RulesSource::Embedded, false).await;
    s.create_widget(
        "w",
        json!({"observedGeneration": 1, "conditions": [condition("Ready", "True")]}),
    )
    .await;
    let scaler_api = cluster::widgets(&s.scaler, &s.namespace);
    let mut staged = scaler_api.get("w").await.unwrap();
    // Another write makes the staged copy stale, so the first attempt conflicts.
    cluster::widgets(&s.controller, &s.namespace)
        .patch_status(
            "w",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"conditions": [condition("Ready", "False")]}})),
        )
        .await
        .unwrap();
    // The scaler wrongly claims observedGeneration: the webhook denies every attempt.
    staged.data["status"]["observedGeneration"] = json!(7);
    let before = staged.clone();
    let writer = StatusWriter::new(scaler_api)
        .owned_fields(["observedGeneration"])
        .unwrap()
        .retry(RetryPolicy::new(3, std::time::Duration::from_millis(10)).unwrap());
    let result = writer.flush(&mut staged).await;
    assert!(
        matches!(result, Err(FlushError::Conflict { attempts: 3, .. })),
        "{result:?}"
    );
    assert_eq!(
        serde_json::to_value(&staged).unwrap(),
        serde_json::to_value(&before).unwrap(),
        "the caller's object is untouched"
    );
    s.unregister().await;
}

#[tokio::test]
async fn a_misspelled_path_does_nothing_because_the_schema_prunes_it() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "typo", json!({"observedGeneration": 1})).await;
    staged.data["status"]["observedGeneraton"] = json!(2);
    let writer = StatusWriter::new(api.clone())
        .owned_fields(["observedGeneraton"])
        .unwrap();
    writer.flush(&mut staged).await.unwrap();
    assert_eq!(stored_status(&api, "typo").await, json!({"observedGeneration": 1}));
    // The check against the live CRD's schema finds it.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(api.clone().into_client());
    let crd = crds.get("widgets.example.com").await.unwrap();
    assert!(matches!(writer.check_schema(&crd, "v1"), Err(FlushError::UnknownFields(f)) if f == ["observedGeneraton"]));
}

#[tokio::test]
async fn bad_paths_fail_before_any_write() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "badpaths", json!({"replicas": 1, "summary": {"ready": 1}})).await;
    let before = api.get("badpaths").await.unwrap().metadata.resource_version;
    staged.data["status"]["summary"] = json!(5);
    let writer = StatusWriter::new(api.clone())
        .owned_fields(["summary.ready", "replicas"])
        .unwrap();
    let result = writer.flush(&mut staged).await;
    assert!(
        matches!(result, Err(FlushError::BelowNonObject { ref path }) if path == "summary.ready"),
        "{result:?}"
    );
    for bad in ["", "a.", ".a", "a..b", "conditions", "conditions.Ready"] {
        assert!(StatusWriter::new(api.clone()).owned_fields([bad]).is_err(), "{bad:?}");
    }
    assert_eq!(
        api.get("badpaths").await.unwrap().metadata.resource_version,
        before,
        "nothing was written"
    );
}

#[tokio::test]
async fn a_large_integer_round_trips_exactly() {
    let (api, _) = setup().await;
    let mut staged = widget(&api, "bignum", json!({"bigNumber": 1})).await;
    staged.data["status"]["bigNumber"] = json!(9223372036854775807_i64);
    StatusWriter::new(api.clone())
        .owned_fields(["bigNumber"])
        .unwrap()
        .flush(&mut staged)
        .await
        .unwrap();
    assert_eq!(staged.data["status"]["bigNumber"], json!(9223372036854775807_i64));
    assert_eq!(
        stored_status(&api, "bignum").await["bigNumber"],
        json!(9223372036854775807_i64)
    );
}

#[tokio::test]
async fn with_the_webhook_enforcing_the_flush_passes_where_the_full_update_retry_is_denied() {
    let s = Scenario::new("e2e-flush-guard").await;
    let (_server, _dir) = s.guarded_by(RulesSource::Embedded, false).await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 3}))
        .await;

    let scaler_api = cluster::widgets(&s.scaler, &s.namespace);
    let mut stale = scaler_api.get("w").await.unwrap();
    let controller_api = cluster::widgets(&s.controller, &s.namespace);
    controller_api
        .patch_status(
            "w",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"observedGeneration": 2}})),
        )
        .await
        .unwrap();
    stale.data["status"]["replicas"] = json!(5);

    let legacy = replace_status_with_naive_retry(&scaler_api, &mut stale.clone(), 5).await;
    match legacy {
        Err(kube::Error::Api(e)) => assert!(e.code == 409 && e.message.contains("statusguard"), "{e:?}"),
        other => panic!("the full-update retry was not denied: {other:?}"),
    }

    let ownership = Ownership::from_yaml(statusguard::rules::EMBEDDED_OWNERSHIP).unwrap();
    let writer = StatusWriter::for_writer(
        scaler_api.clone(),
        &ownership,
        &GroupResource::new("example.com", "widgets"),
        "system:serviceaccount:platform:widget-scaler",
    )
    .unwrap();
    let report = writer.flush(&mut stale).await.unwrap();
    assert_eq!(report.attempts, 2);
    let stored = s.get(&s.admin, "w").await;
    assert_eq!(
        (
            stored["status"]["observedGeneration"].clone(),
            stored["status"]["replicas"].clone()
        ),
        (json!(2), json!(5))
    );
    s.unregister().await;
}

#[tokio::test]
async fn the_shared_status_example_shows_the_rollback_and_its_cure() {
    let (_, admin) = setup().await;
    cluster::namespace(&admin, "e2e-flush-example", json!({})).await;
    // `cargo test` builds the examples next to the test binaries' folder.
    let example = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/shared_status");
    assert!(example.exists(), "{} was not built", example.display());
    for (mode, expected) in [("legacy", "ROLLED BACK"), ("library", "both writes kept")] {
        let output = std::process::Command::new(&example)
            .args(["--namespace", "e2e-flush-example", "--scaler", mode])
            .env("KUBECONFIG", &Cluster::shared().kubeconfig)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{mode}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains(expected), "{mode}: {stdout}");
    }
}

#[tokio::test]
async fn a_writer_reads_its_ownership_from_the_webhooks_configmap() {
    let (api, admin) = setup().await;
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin, NAMESPACE);
    let cm = serde_json::from_value(json!({
        "metadata": {"name": "flush-ownership"},
        "data": {"ownership.yaml": statusguard::rules::EMBEDDED_OWNERSHIP}
    }))
    .unwrap();
    configmaps.create(&PostParams::default(), &cm).await.unwrap();
    let widgets = GroupResource::new("example.com", "widgets");
    let configmap = ConfigMapRef {
        namespace: NAMESPACE.into(),
        name: "flush-ownership".into(),
    };
    let writer = StatusWriter::for_writer_from_configmap(
        api.clone(),
        &configmap,
        &widgets,
        "system:serviceaccount:platform:widget-scaler",
    )
    .await
    .unwrap();
    let mut staged = widget(&api, "from-configmap", json!({"observedGeneration": 1, "replicas": 3})).await;
    staged.data["status"]["replicas"] = json!(4);
    staged.data["status"]["observedGeneration"] = json!(0);
    writer.flush(&mut staged).await.unwrap();
    assert_eq!(
        stored_status(&api, "from-configmap").await,
        json!({"observedGeneration": 1, "replicas": 4})
    );

    let nope = ConfigMapRef {
        namespace: NAMESPACE.into(),
        name: "nope".into(),
    };
    let missing = StatusWriter::for_writer_from_configmap(api.clone(), &nope, &widgets, "x").await;
    assert!(matches!(missing, Err(FlushError::Rules(_))), "{missing:?}");
}

/// Regression (issue 11, items 5 and 6): `StatusWriter::new(api)` alone, or
/// with only owned conditions, was the full-Update retry that rolls other
/// writers back. The owned-fields merge patch is the only path now.
#[tokio::test]
async fn a_writer_declaring_only_conditions_or_nothing_never_rolls_anyone_back() {
    let (api, _) = setup().await;
    for (name, writer) in [
        (
            "only-conditions",
            StatusWriter::new(api.clone()).owned_conditions(["Ready"]),
        ),
        ("nothing", StatusWriter::new(api.clone())),
    ] {
        let mut staged = widget(&api, name, json!({"observedGeneration": 1, "replicas": 3})).await;
        other_writer(&api, name, json!({"observedGeneration": 2})).await;
        writer.flush(&mut staged).await.unwrap();
        assert_eq!(
            stored_status(&api, name).await["observedGeneration"],
            2,
            "{name}: rolled back"
        );
    }
}
