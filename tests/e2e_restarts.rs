//! Issue 23: every tolerated state survives a restart. The chart is
//! installed for real and the server runs as its pod would (the chart's
//! arguments, ServiceAccount and only its RBAC) against the real API server:
//!
//! - a valid document is kept in the state ConfigMap;
//! - an invalid document is refused at the door, with every problem listed
//!   (the API server calls the server's own webhook on the ConfigMap);
//! - with the server down, the door lets anything through (`Ignore`), and a
//!   server that then restarts on the invalid ConfigMap, or on none at all,
//!   is ready and enforces the kept document, and `/readyz`, its log and an
//!   `InvalidOwnership` Event say so;
//! - the registration switch on the state ConfigMap holds when the
//!   ownership ConfigMap is re-applied as GitOps would, `enabled`.
//!
//! One test in its own binary: it installs a release with cluster-wide webhooks.

mod support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use support::chart::{Release, local_values};
use support::scenario::Scenario;
use support::webhook::{eventually, free_port};

const RELEASE: &str = "rst";
const NAMESPACE: &str = "statusguard-restarts";
const NAME: &str = "rst-statusguard";
const WEBHOOKS: &str = "rst-statusguard-statusguard-restarts";
const CONFIGMAP: &str = "rst-statusguard-ownership";
const STATE: &str = "rst-statusguard-ownership-state";
const EXAMPLE: &str = include_str!("../examples/ownership.yaml");

/// Two problems: both writers claim observedGeneration, and both Ready.
fn doubly_invalid() -> String {
    EXAMPLE
        .replace(
            "fields: [replicas, scale.lastScaleTime]",
            "fields: [replicas, observedGeneration]",
        )
        .replace("conditions: [Scaled]", "conditions: [Ready]")
}

/// The webhooks registered, by name.
async fn registered(s: &Scenario) -> Vec<String> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    let Some(configuration) = api.get_opt(WEBHOOKS).await.unwrap() else {
        return vec![];
    };
    let mut names: Vec<String> = configuration
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|hook| hook.name)
        .collect();
    names.sort();
    names
}

fn ownership_manifest(document: &str, registration: Option<&str>) -> serde_json::Value {
    let mut manifest = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
        "data": {"ownership.yaml": document},
    });
    if let Some(value) = registration {
        manifest["metadata"]["annotations"] = json!({"statusguard.dev/registration": value});
    }
    manifest
}

/// What `kubectl apply --server-side --force-conflicts` sends: an apply of
/// the whole manifest, under the manager "kubectl".
async fn apply_configmap(s: &Scenario, manifest: &serde_json::Value) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(s.admin.clone(), NAMESPACE);
    api.patch(
        CONFIGMAP,
        &PatchParams::apply("kubectl").force(),
        &Patch::Apply(manifest),
    )
    .await
    .map(drop)
}

async fn invalid_ownership_events(s: &Scenario) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(s.admin.clone(), NAMESPACE);
    let listed = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={CONFIGMAP}")))
        .await
        .unwrap();
    listed
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InvalidOwnership"))
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test]
async fn the_last_valid_document_survives_restarts_and_bad_documents_are_refused_at_the_door() {
    let s = Scenario::new("e2e-restarts").await;
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let values = local_values(EXAMPLE, port, "certificates:\n  extraIPs: [127.0.0.1]\n");
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&values);
    let pod = release.pod(s.cluster, home.path(), NAME).await;
    let start = || pod.start_on(port, home.path());
    let configmaps: Api<ConfigMap> = Api::namespaced(s.admin.clone(), NAMESPACE);

    // A valid document: enforced, registered with the door, and kept.
    let server = start().await;
    server.wait_ready().await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 3}))
        .await;
    let door = format!("ownership.{WEBHOOKS}.statusguard.dev");
    let validate = format!("validate.{WEBHOOKS}.statusguard.dev");
    eventually(
        Duration::from_secs(30),
        "the status and door webhooks are registered",
        || async { registered(&s).await == vec![door.clone(), validate.clone()] },
    )
    .await;
    // The API server applies the configuration when its own informer has
    // it, a moment after this test read it.
    eventually(Duration::from_secs(5), "enforcing", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;
    let document_of = |name: &'static str| {
        let configmaps = configmaps.clone();
        async move {
            configmaps
                .get_opt(name)
                .await
                .unwrap()
                .and_then(|configmap| configmap.data)
                .and_then(|data| data.get("ownership.yaml").cloned())
        }
    };
    let rendered = document_of(CONFIGMAP).await;
    assert!(rendered.is_some());
    eventually(Duration::from_secs(30), "the document is kept", || async {
        document_of(STATE).await == rendered
    })
    .await;

    // An invalid document is refused at the door, every problem listed; a
    // valid edit passes.
    let refused = apply_configmap(&s, &ownership_manifest(&doubly_invalid(), None))
        .await
        .expect_err("an invalid document is refused");
    let kube::Error::Api(status) = &refused else {
        panic!("{refused:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains(&door), "{}", status.message);
    assert!(status.message.contains("observedGeneration"), "{}", status.message);
    assert!(status.message.contains("Ready"), "{}", status.message);
    apply_configmap(&s, &ownership_manifest(EXAMPLE, Some("enabled")))
        .await
        .expect("a valid document passes the door");

    // The server down: the door is Ignore, the invalid document is stored.
    drop(server);
    apply_configmap(&s, &ownership_manifest(&doubly_invalid(), Some("enabled")))
        .await
        .expect("with the server down nothing blocks a write of the ConfigMap");

    // A restart on the invalid ConfigMap: ready, enforcing the kept document.
    let server = start().await;
    server.wait_ready().await;
    // Once the invalid ConfigMap is read, /readyz says so, and that the
    // kept document stays in force.
    eventually(
        Duration::from_secs(30),
        "/readyz: invalid, the kept document in force",
        || async {
            matches!(server.get_admin("/readyz").await,
            Some((200, body)) if body.contains("holds an invalid ownership document") && body.contains(STATE))
        },
    )
    .await;
    eventually(Duration::from_secs(30), "enforced after the restart", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;
    assert_eq!(s.write_observed_generation(&s.controller, "w").await, 200);
    eventually(
        Duration::from_secs(30),
        "an InvalidOwnership Event names the kept document",
        || async { invalid_ownership_events(&s).await.iter().any(|m| m.contains(STATE)) },
    )
    .await;
    assert!(
        server
            .log()
            .contains("invalid ownership document; the last valid document, kept in ConfigMap"),
        "{}",
        server.log()
    );

    // A restart with the ConfigMap deleted: the same.
    drop(server);
    configmaps.delete(CONFIGMAP, &DeleteParams::default()).await.unwrap();
    let server = start().await;
    server.wait_ready().await;
    eventually(Duration::from_secs(30), "enforced with no ConfigMap", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "/readyz says the ConfigMap is absent",
        || async { matches!(server.get_admin("/readyz").await, Some((200, body)) if body.contains("absent")) },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "an InvalidOwnership Event says the ConfigMap is absent",
        || async { invalid_ownership_events(&s).await.iter().any(|m| m.contains("absent")) },
    )
    .await;

    // The runbook under GitOps: the switch on the state ConfigMap stands
    // the servers down, the configurations are deleted, and a re-applied
    // manifest saying `enabled` does not undo it.
    apply_configmap(&s, &ownership_manifest(EXAMPLE, Some("enabled")))
        .await
        .unwrap();
    let switch = |value: Option<&str>| json!({"metadata": {"annotations": {"statusguard.dev/registration": value}}});
    configmaps
        .patch(STATE, &PatchParams::default(), &Patch::Merge(switch(Some("disabled"))))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the server stands down", || async {
        server.log().contains("stands the servers down")
    })
    .await;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    validating.delete(WEBHOOKS, &DeleteParams::default()).await.unwrap();
    let mutating: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(s.admin.clone());
    mutating.delete(WEBHOOKS, &DeleteParams::default()).await.unwrap();
    apply_configmap(&s, &ownership_manifest(EXAMPLE, Some("enabled")))
        .await
        .unwrap();
    // Longer than any re-apply after a change of the ConfigMap.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(registered(&s).await.is_empty(), "the re-sync did not undo the runbook");
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 200);
    configmaps
        .patch(STATE, &PatchParams::default(), &Patch::Merge(switch(None)))
        .await
        .unwrap();
    // The configurations are the chart's to create: an upgrade brings them back.
    release.upgrade(&values);
    eventually(Duration::from_secs(30), "registered again", || async {
        registered(&s).await == vec![door.clone(), validate.clone()]
    })
    .await;
    eventually(Duration::from_secs(30), "enforced again", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;

    // `statusguard unregister` (the pre-delete hook) with the ownership
    // ConfigMap already gone: the server still enforces the kept document,
    // so the switch goes on the state ConfigMap, and the deletions hold.
    configmaps.delete(CONFIGMAP, &DeleteParams::default()).await.unwrap();
    let said = release.run_pre_delete_hook(&pod.kubeconfig);
    assert!(said.contains(STATE), "{said}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(registered(&s).await.is_empty(), "{}", server.log());
    let state = configmaps.get(STATE).await.unwrap();
    assert_eq!(
        state
            .metadata
            .annotations
            .unwrap_or_default()
            .get("statusguard.dev/registration")
            .map(String::as_str),
        Some("disabled")
    );
    drop(server);
}
