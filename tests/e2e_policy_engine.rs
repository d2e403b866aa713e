//! The chart with `engine: policies`: the server keeps the ownership rules
//! as admission policies that the API server enforces itself. The chart is
//! installed for real and the server runs as its pod would (the chart's
//! arguments, its ServiceAccount and only its RBAC):
//!
//! - a first install with an invalid document applies nothing;
//! - fixing the ConfigMap applies the policies, and enforcement starts;
//! - with the server stopped, enforcement goes on: nothing waits on it;
//! - an invalid document, and one the policies would decide differently
//!   from the webhook (trim, without `allowDeviations`), change nothing;
//! - a resource taken out of the document has its policies deleted;
//! - `statusguard unregister` (the pre-delete hook) leaves none behind,
//!   with a server running.
//!
//! One test in its own binary: it installs a release with cluster-wide policies.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use statusguard::policies::{KINDS, api_resource};
use support::chart::{Release, local_values};
use support::scenario::Scenario;
use support::webhook::{assert_metric, eventually, free_port};

const RELEASE: &str = "pol";
const NAMESPACE: &str = "statusguard-policy-engine";
const SERVICE_ACCOUNT: &str = "pol-statusguard";
/// The set's name: the release's webhook name (full name and namespace).
const SET: &str = "pol-statusguard-statusguard-policy-engine";
const CONFIGMAP: &str = "pol-statusguard-ownership";
const EXAMPLE: &str = include_str!("../examples/ownership.yaml");

fn document(mode: &str) -> String {
    EXAMPLE.replace("mode: enforce ", &format!("mode: {mode} "))
}

fn without_widgets() -> String {
    let cut = EXAMPLE.find("resources:").unwrap();
    format!("{}resources: []\n", &EXAMPLE[..cut])
}

/// Both writers claim observedGeneration: invalid for the server.
fn overlapping() -> String {
    document("enforce").replace(
        "fields: [replicas, scale.lastScaleTime]",
        "fields: [replicas, observedGeneration]",
    )
}

/// The set's objects, as `Kind/name`, sorted.
async fn applied(s: &Scenario) -> Vec<String> {
    let mut found = Vec::new();
    for kind in KINDS {
        let api: Api<DynamicObject> = Api::all_with(s.admin.clone(), &api_resource(kind));
        let listed = api
            .list_metadata(&ListParams::default().labels(&format!("statusguard.dev/policy-set={SET}")))
            .await
            .unwrap();
        found.extend(
            listed
                .items
                .into_iter()
                .map(|o| format!("{kind}/{}", o.metadata.name.unwrap_or_default())),
        );
    }
    found.sort();
    found
}

fn validating_pair() -> Vec<String> {
    vec![
        format!("ValidatingAdmissionPolicy/{SET}.widgets.example.com"),
        format!("ValidatingAdmissionPolicyBinding/{SET}.widgets.example.com"),
    ]
}

async fn edit_configmap(s: &Scenario, document: &str) {
    let api: Api<ConfigMap> = Api::namespaced(s.admin.clone(), NAMESPACE);
    let patch = json!({"data": {"ownership.yaml": document}});
    api.patch(CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Stays true for `period`: what an apply would have changed by then.
async fn stays(period: Duration, what: &str, check: impl AsyncFn() -> bool) {
    let until = tokio::time::Instant::now() + period;
    while tokio::time::Instant::now() < until {
        assert!(check().await, "no longer true: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn the_policies_follow_the_live_document_and_need_no_server() {
    let s = Scenario::new("e2e-policy-engine").await;
    let home = tempfile::tempdir().unwrap();
    let port = free_port();

    // No Service, certificate or webhook configuration is rendered.
    let values = local_values(&overlapping(), port, "engine: policies\n");
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&values);
    let _uninstall = release.uninstall_on_drop();
    let manifest = release.helm(&["get", "manifest", RELEASE, "-n", NAMESPACE]);
    for kind in ["kind: Service\n", "kind: Secret\n", "WebhookConfiguration\n"] {
        assert!(!manifest.contains(kind), "{kind} rendered in policies mode");
    }
    let pod = release.pod(s.cluster, home.path(), SERVICE_ACCOUNT).await;
    let server = pod.start_on(port, home.path()).await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 3}))
        .await;

    // An invalid first document: nothing applied, nothing enforced.
    eventually(Duration::from_secs(30), "/readyz says the document is invalid", || async {
        matches!(server.get_admin("/readyz").await, Some((503, body)) if body.contains("invalid ownership document"))
    })
    .await;
    assert!(applied(&s).await.is_empty());
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 200);
    let metrics = server.metrics().await;
    assert_metric(&metrics, "statusguard_policies_registered", 0.0);
    assert_metric(&metrics, "statusguard_policy_syncs_total{result=\"waiting\"}", 1.0);

    // Fixed by hand: the policies are applied and the API server enforces them.
    edit_configmap(&s, &document("enforce")).await;
    eventually(Duration::from_secs(30), "the validating policy is applied", || async {
        applied(&s).await == validating_pair()
    })
    .await;
    eventually(Duration::from_secs(30), "the API server enforces it", || async {
        s.write_observed_generation(&s.scaler, "w").await == 403
    })
    .await;
    assert_metric(&server.metrics().await, "statusguard_policies_registered", 1.0);

    // The server stopped: nothing waits on it.
    drop(server);
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 403);
    let own = s
        .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": 4}}))
        .await;
    assert_eq!(own.code, 200, "{:?}", own.body);

    // An invalid document changes nothing; nor does one with deviations.
    let server = pod.start_on(port, home.path()).await;
    server.wait_ready().await;
    edit_configmap(&s, &overlapping()).await;
    stays(Duration::from_secs(3), "the policies stay", || async {
        applied(&s).await == validating_pair()
    })
    .await;
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 403);
    edit_configmap(&s, &document("trim")).await;
    eventually(
        Duration::from_secs(30),
        "the server says why it applies nothing",
        || async {
            server
                .log()
                .contains("the policies would decide this document differently")
        },
    )
    .await;
    stays(Duration::from_secs(3), "no mutating policy", || async {
        applied(&s).await == validating_pair()
    })
    .await;
    // The policies in force are an older document's: the alert's series says so.
    let metrics = server.metrics().await;
    assert_metric(&metrics, "statusguard_policies_registered", 0.0);
    assert_metric(&metrics, "statusguard_policy_syncs_total{result=\"deviations\"}", 1.0);

    // A resource taken out: its policies are deleted.
    edit_configmap(&s, &without_widgets()).await;
    eventually(Duration::from_secs(30), "the policies are pruned", || async {
        applied(&s).await.is_empty()
    })
    .await;
    eventually(Duration::from_secs(30), "the API server stops enforcing", || async {
        s.write_observed_generation(&s.scaler, "w").await == 200
    })
    .await;

    // `statusguard unregister`, with a server running: none left behind.
    edit_configmap(&s, &document("enforce")).await;
    eventually(Duration::from_secs(30), "the policies are back", || async {
        applied(&s).await == validating_pair()
    })
    .await;
    let said = release.run_pre_delete_hook(&pod.kubeconfig);
    assert!(said.contains("ValidatingAdmissionPolicy"), "{said}");
    stays(Duration::from_secs(5), "no policy is applied again", || async {
        applied(&s).await.is_empty()
    })
    .await;
    drop(server);
}
