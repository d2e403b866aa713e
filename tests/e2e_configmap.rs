//! Cluster mode: `statusguard serve --configmap` against the real API server,
//! with the rules edited live, broken, fixed, deleted, and the API server
//! restarted underneath. One test in its own binary, since it restarts the
//! binary's control plane.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::cluster;
use support::scenario::Scenario;
use support::webhook::{BinaryServer, eventually, metric};

const CONFIGMAP: &str = "statusguard-ownership";
const EXAMPLE: &str = include_str!("../examples/ownership.yaml");

/// The example document with observedGeneration owned by the scaler instead.
fn moved() -> String {
    EXAMPLE
        .replace("fields: [observedGeneration, summary]", "fields: [summary]")
        .replace(
            "fields: [replicas, scale.lastScaleTime]",
            "fields: [replicas, observedGeneration]",
        )
}

/// Both writers claim observedGeneration: invalid.
fn overlapping() -> String {
    EXAMPLE.replace(
        "fields: [replicas, scale.lastScaleTime]",
        "fields: [replicas, observedGeneration]",
    )
}

async fn write_configmap(api: &Api<ConfigMap>, document: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": CONFIGMAP}, "data": {"ownership.yaml": document}
    }))
    .unwrap();
    match api.get_opt(CONFIGMAP).await.unwrap() {
        Some(current) => {
            let mut next = cm;
            next.metadata.resource_version = current.metadata.resource_version;
            api.replace(CONFIGMAP, &PostParams::default(), &next).await.unwrap();
        }
        None => {
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
    }
}

/// Grants the server's own ServiceAccount what the Helm chart grants: read
/// configmaps and write events in its namespace, nothing cluster-wide.
async fn server_identity(s: &Scenario) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    cluster::service_account(&s.admin, &s.namespace, "statusguard").await;
    let roles: Api<Role> = Api::namespaced(s.admin.clone(), &s.namespace);
    cluster::ensure_json(
        &roles,
        json!({"metadata": {"name": "statusguard"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]}),
    )
    .await;
    let bindings: Api<RoleBinding> = Api::namespaced(s.admin.clone(), &s.namespace);
    cluster::ensure_json(
        &bindings,
        json!({"metadata": {"name": "statusguard"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "statusguard"},
               "subjects": [{"kind": "ServiceAccount", "name": "statusguard", "namespace": s.namespace}]}),
    )
    .await;
}

/// A merge patch of `observedGeneration` by `who`; returns the status code.
async fn patch_observed_generation(s: &Scenario, who: &kube::Client, value: i64) -> u16 {
    s.merge_patch_status(who, "w", json!({"status": {"observedGeneration": value}}))
        .await
        .code
}

#[tokio::test]
async fn configmap_rules_are_enforced_reloaded_live_and_never_broken_by_a_bad_edit() {
    let s = Scenario::new("e2e-configmap").await;
    server_identity(&s).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(s.admin.clone(), &s.namespace);

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = s.cluster.service_account_kubeconfig(&s.namespace, "statusguard").await;
    let source = format!("{}/{CONFIGMAP}", s.namespace);
    let server = BinaryServer::start(dir.path(), &["--configmap", &source], &[("KUBECONFIG", &kubeconfig)]).await;
    // At start, without the ConfigMap and then with an invalid one: not
    // ready, and /readyz says why; a valid one makes it ready.
    eventually(
        Duration::from_secs(30),
        "/readyz says the ConfigMap is missing",
        || async { matches!(server.get_admin("/readyz").await, Some((503, body)) if body.contains("not found")) },
    )
    .await;
    write_configmap(&configmaps, &overlapping()).await;
    eventually(Duration::from_secs(30), "/readyz says the document is invalid", || async {
        matches!(server.get_admin("/readyz").await, Some((503, body)) if body.contains("invalid ownership document"))
    })
    .await;
    write_configmap(&configmaps, EXAMPLE).await;
    server.wait_ready().await;
    let ca_pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    s.register_at(server.tls, &ca_pem, false, || server.metrics()).await;
    s.create_widget(
        "w",
        json!({"observedGeneration": 1, "replicas": 3, "conditions": [{"type": "Ready", "status": "True"}]}),
    )
    .await;

    // The ConfigMap's rules are enforced.
    let retry = s.stale_retry("w").await;
    assert_eq!(retry.code, 409, "{:?}\n{}", retry.body, server.log());

    // An edit that moves observedGeneration to the scaler takes effect without a restart.
    write_configmap(&configmaps, &moved()).await;
    s.wait_until_writable(
        &s.scaler,
        "w",
        10,
        Duration::from_secs(30),
        "the scaler may write observedGeneration",
    )
    .await;
    assert_eq!(patch_observed_generation(&s, &s.controller, 99).await, 409);

    // An invalid edit leaves those rules in force and is reported.
    write_configmap(&configmaps, &overlapping()).await;
    eventually(
        Duration::from_secs(30),
        "the invalid edit is reported in the metrics",
        || async {
            let metrics = server.metrics().await;
            metric(&metrics, "statusguard_config_reloads_total{result=\"invalid\"}") == Some(2.0)
                && metric(&metrics, "statusguard_rules_stale") == Some(1.0)
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(s.admin.clone(), &s.namespace);
    eventually(
        Duration::from_secs(30),
        "an InvalidOwnership event on the ConfigMap",
        || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={CONFIGMAP}")))
                .await
                .unwrap();
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("InvalidOwnership")
                    && e.message.as_deref().unwrap_or_default().contains("observedGeneration")
            })
        },
    )
    .await;
    assert_eq!(
        patch_observed_generation(&s, &s.controller, 98).await,
        409,
        "the previous rules stay in force"
    );
    let (status, body) = server.get_admin("/readyz").await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("stale"), "{body}");

    // A fixed edit recovers.
    write_configmap(&configmaps, EXAMPLE).await;
    eventually(
        Duration::from_secs(30),
        "the controller owns observedGeneration again",
        || async { patch_observed_generation(&s, &s.controller, 3).await == 200 },
    )
    .await;
    assert_eq!(metric(&server.metrics().await, "statusguard_rules_stale"), Some(0.0));

    // Deleting the ConfigMap keeps the last rules.
    let missing = |metrics: String| metric(&metrics, "statusguard_config_reloads_total{result=\"missing\"}");
    let missing_before = missing(server.metrics().await);
    assert_eq!(
        missing_before,
        Some(1.0),
        "reported once at start, before the ConfigMap existed"
    );
    configmaps.delete(CONFIGMAP, &DeleteParams::default()).await.unwrap();
    eventually(Duration::from_secs(30), "the deletion is reported", || async {
        missing(server.metrics().await) == Some(2.0)
            && metric(&server.metrics().await, "statusguard_rules_stale") == Some(1.0)
    })
    .await;
    assert_eq!(
        patch_observed_generation(&s, &s.scaler, 50).await,
        409,
        "the last good rules stay"
    );

    // The API server restarts: enforcement continues, later edits still load.
    let cluster = s.cluster;
    tokio::task::spawn_blocking(move || cluster.restart_apiserver())
        .await
        .unwrap()
        .unwrap();
    let admin = cluster.admin().await;
    let scaler = cluster.service_account_client("platform", "widget-scaler").await;
    let s = Scenario {
        admin: admin.clone(),
        scaler,
        ..s
    };
    eventually(Duration::from_secs(60), "enforcement after the restart", || async {
        patch_observed_generation(&s, &s.scaler, 51).await == 409
    })
    .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(admin, &s.namespace);
    write_configmap(&configmaps, &moved()).await;
    let value = s
        .wait_until_writable(
            &s.scaler,
            "w",
            60,
            Duration::from_secs(90),
            "an edit after the restart takes effect",
        )
        .await;
    let stored: Value = s.get(&s.admin, "w").await;
    assert_eq!(stored["status"]["observedGeneration"], value);
    s.unregister().await;
}
