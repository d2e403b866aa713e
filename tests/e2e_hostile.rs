//! Hostile shapes through the real API server: what it stores and sends for
//! a deeply nested status and for `null` members, and statusguard deciding
//! every such write.

mod support;

use kube::api::{Patch, PatchParams};
use kube::core::Request;
use serde_json::{Value, json};
use statusguard::admission::project::nesting_depth;
use statusguard::rules::RulesSource;
use support::scenario::{Scenario, Written, send};
use support::webhook::RunningServer;

/// The controller owns `deep` (kept at any depth by the CRD) and `extra`
/// (a nullable object with a nullable `c`); the scaler owns `replicas`.
const RULES: &str = r#"
apiVersion: statusguard.dev/v1alpha1
kind: StatusOwnership
exempt: {groups: ["system:masters"]}
resources:
  - group: example.com
    resource: widgets
    writers:
      - {serviceAccount: platform/widget-controller, fields: [observedGeneration, deep, extra], conditions: [Ready]}
      - {serviceAccount: platform/widget-scaler, fields: [replicas], conditions: [Scaled]}
"#;

async fn guard(s: &Scenario) -> (RunningServer, tempfile::TempDir, tempfile::TempDir) {
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_dir.path().join("ownership.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let (server, tls_dir) = s.guarded_by(RulesSource::File(rules), false).await;
    (server, tls_dir, rules_dir)
}

fn nested(levels: usize, inner: &str) -> String {
    format!("{}{inner}{}", r#"{"a":"#.repeat(levels), "}".repeat(levels))
}

/// A merge patch of the status, sent as text: a body nested thousands of
/// levels deep never passes through a recursive serializer here.
async fn patch_text(s: &Scenario, client: &kube::Client, name: &str, status: &str) -> Written {
    let mut request = Request::new(format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace))
        .patch_subresource("status", name, &PatchParams::default(), &Patch::Merge(json!({})))
        .unwrap();
    *request.body_mut() = format!(r#"{{"status":{status}}}"#).into_bytes();
    send(client, request).await
}

/// The stored object as text (serde_json would refuse to parse it).
async fn stored_text(s: &Scenario, name: &str) -> String {
    let request = http::Request::get(format!(
        "/apis/example.com/v1/namespaces/{}/widgets/{name}",
        s.namespace
    ))
    .body(Vec::new())
    .unwrap();
    s.admin.request_text(request).await.unwrap()
}

/// Issue 11, item 1. The API server's JSON decoder allows 10,000 levels in
/// a field that keeps unknown fields; it stores and sends such a status, and
/// statusguard decides every write of it: a writer changing only its own
/// field, the owner of the deep field, an exempt writer, and a stale full
/// Update. (Before, every one got HTTP 400 "recursion limit exceeded".)
#[tokio::test]
async fn a_status_nested_as_deep_as_the_api_server_allows_is_decided() {
    let s = Scenario::new("e2e-deep").await;
    let (server, _tls, _rules) = guard(&s).await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 1}))
        .await;

    // What the API server accepts: 9,990 levels below `blob` (the body is two
    // levels deeper), not 10,001.
    let refused = patch_text(&s, &s.admin, "w", &format!(r#"{{"blob":{}}}"#, nested(10_001, "1"))).await;
    assert!(refused.code >= 400, "10,001 levels were accepted: {}", refused.code);
    let written = patch_text(&s, &s.admin, "w", &format!(r#"{{"blob":{}}}"#, nested(9_990, "1"))).await;
    assert_eq!(written.code, 200, "the exempt admin writes the deep blob");
    let stored = stored_text(&s, "w").await;
    assert!(
        nesting_depth(&stored) >= 9_990,
        "stored {} levels",
        nesting_depth(&stored)
    );

    // Every later write carries the deep blob in object and oldObject.
    let own = patch_text(&s, &s.scaler, "w", r#"{"replicas":2}"#).await;
    assert_eq!(own.code, 200, "the scaler writes its own field: {:?}", own.body);
    let deep_owned = patch_text(&s, &s.controller, "w", &format!(r#"{{"deep":{}}}"#, nested(5_000, "1"))).await;
    assert_eq!(
        deep_owned.code, 200,
        "the controller writes its deep field: {:?}",
        deep_owned.body
    );
    let theirs = patch_text(&s, &s.scaler, "w", &format!(r#"{{"deep":{}}}"#, nested(5_000, "2"))).await;
    assert_eq!(theirs.code, 409, "{:?}", theirs.body);
    assert!(
        theirs.message().contains("status.deep (owned by"),
        "{}",
        theirs.message()
    );

    // A stale full Update of the whole deep object, changing only replicas.
    let text = stored_text(&s, "w").await.replace(r#""replicas":2"#, r#""replicas":3"#);
    let mut request = Request::new(format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace))
        .replace_subresource("status", "w", &Default::default(), Vec::new())
        .unwrap();
    *request.body_mut() = text.into_bytes();
    let put = send(&s.scaler, request).await;
    assert_eq!(put.code, 200, "{:?}", put.body);

    // Every review was decided: denials counted (the API server may call the
    // webhook again when it retries a patch internally), never an error.
    let metrics = server.app.metrics.encode();
    let denied = support::webhook::metric(
        &metrics,
        r#"statusguard_admission_requests_total{endpoint="validate",group="example.com",resource="widgets",decision="denied"}"#,
    );
    assert!(denied.is_some_and(|n| n >= 1.0), "{metrics}");
    assert!(!metrics.contains(r#"decision="error"}"#), "{metrics}");
    s.unregister().await;
}

/// Issue 11, item 2. What the API server stores for `null`: a member that is
/// not `nullable` is pruned, a `nullable: true` one is stored as `null`. A
/// stale full Update from a client that sends `null` for its empty fields
/// then carries `c: null` where the stored object has no `c`: the same
/// value, and allowed. (Before, a 409 on every retry.)
#[tokio::test]
async fn null_and_absent_are_the_same_inside_an_owned_object() {
    let s = Scenario::new("e2e-null").await;
    let (_server, _tls, _rules) = guard(&s).await;
    s.create_widget("w", json!({"replicas": 1, "extra": {"a": "x"}})).await;

    let mut stale = s.get(&s.scaler, "w").await;
    stale["status"]["replicas"] = json!(2);
    stale["status"]["extra"] = json!({"a": "x", "b": null, "c": null});
    stale["status"]["summary"] = Value::Null;
    let written = s.put_status(&s.scaler, &stale).await;
    assert_eq!(written.code, 200, "{:?}", written.body);
    let stored = s.get(&s.admin, "w").await;
    assert_eq!(
        stored["status"]["extra"],
        json!({"a": "x", "c": null}),
        "b (not nullable) was pruned, c (nullable) stored as null"
    );
    assert!(
        stored["status"].get("summary").is_none(),
        "a non-nullable null is pruned"
    );

    // The owner's write of `extra` with c absent is no change to anyone either way.
    let written = s
        .merge_patch_status(&s.controller, "w", json!({"status": {"extra": {"a": "y"}}}))
        .await;
    assert_eq!(written.code, 200, "{:?}", written.body);
    // And another writer really changing it is still denied.
    let written = s
        .merge_patch_status(&s.scaler, "w", json!({"status": {"extra": {"c": "z"}}}))
        .await;
    assert_eq!(written.code, 409, "{:?}", written.body);
    s.unregister().await;
}
