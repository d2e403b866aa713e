//! Issue 22, item 4: a resource served in several versions is decided in
//! the version its paths are written against. statusguard registers itself
//! (its own registration loop, as `--register-webhooks` runs it) for a CRD
//! that serves v1 and v2 (`conversion: None`: the API server converts by
//! changing `apiVersion` alone), and the real API server converts writes
//! made in the other version before it calls the webhook:
//!
//! - a document without `version:` is registered for the CRD's storage
//!   version, with `matchPolicy: Equivalent`, and follows it when the
//!   storage version changes; a CRD created after the server started is
//!   picked up;
//! - a document with `version: v1` is registered for v1 whatever the storage;
//! - through the other version, a stale write of a field another writer
//!   owns is denied (409, by the ownership rules: the review was in the
//!   rules' version, or it would have been refused as undecidable), and a
//!   write of the writer's own field is allowed.

mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use support::cluster;
use support::scenario::{CONTROLLER, SCALER, Scenario};
use support::wait::retry_until;
use support::webhook::{BinaryServer, eventually, free_port, metric};

const NAMESPACE: &str = "e2e-versions";
const GROUP: &str = "versions.example.com";
/// The configurations the server registers.
const WEBHOOKS: &str = "statusguard-e2e-versions";
const LIMIT: Duration = Duration::from_secs(30);

/// The CRD of `plural` (kind `kind`): v1 and v2 served, `storage` stored,
/// no conversion webhook.
fn crd(plural: &str, kind: &str, storage: &str) -> Value {
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "status": {"type": "object", "properties": {
            "observedGeneration": {"type": "integer"},
            "replicas": {"type": "integer"}}}}}});
    let version = |name: &str| {
        json!({"name": name, "served": true, "storage": name == storage,
               "subresources": {"status": {}}, "schema": schema})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                 "versions": [version("v1"), version("v2")],
                 "conversion": {"strategy": "None"}}
    })
}

/// Creates or updates the CRD, and waits until both versions are served.
async fn apply_crd(admin: &Client, plural: &str, kind: &str, storage: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    api.patch(
        &format!("{plural}.{GROUP}"),
        &PatchParams::apply("e2e-versions").force(),
        &Patch::Apply(crd(plural, kind, storage)),
    )
    .await
    .unwrap();
    let params = ListParams::default();
    for version in ["v1", "v2"] {
        let objects = objects(admin, plural, kind, version);
        retry_until(LIMIT, &format!("{plural} served at {version}"), || {
            objects.list(&params)
        })
        .await;
    }
}

fn objects(client: &Client, plural: &str, kind: &str, version: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, version, kind), plural);
    Api::namespaced_with(client.clone(), NAMESPACE, &resource)
}

fn gauges(client: &Client, version: &str) -> Api<DynamicObject> {
    objects(client, "gauges", "Gauge", version)
}

/// The ownership document: the controller owns observedGeneration, the
/// scaler replicas, of gauges (at `version`, if given) and dials.
fn document(version: Option<&str>) -> String {
    let version = version.map(|v| format!("    version: {v}\n")).unwrap_or_default();
    let writers = "    writers:\n      - {serviceAccount: platform/widget-controller, fields: [observedGeneration]}\n      - {serviceAccount: platform/widget-scaler, fields: [replicas]}\n";
    format!(
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nexempt: {{groups: [\"system:masters\"]}}\nresources:\n  - group: {GROUP}\n    resource: gauges\n{version}{writers}  - group: {GROUP}\n    resource: dials\n{writers}"
    )
}

/// statusguard from `document`, registering itself for this test's
/// namespace, as the admin (whose grants are a superset of the chart's).
async fn start(dir: &Path, document: &str, kubeconfig: &Path) -> BinaryServer {
    let file = dir.join("ownership.yaml");
    std::fs::write(&file, document).unwrap();
    let port = free_port();
    let ca = dir.join("ca.pem").display().to_string();
    let selector = format!("{{\"matchLabels\":{{\"statusguard-test\":\"{NAMESPACE}\"}}}}");
    let args = [
        "--ownership",
        &file.display().to_string(),
        "--register-webhooks",
        WEBHOOKS,
        "--webhook-target",
        &format!("https://127.0.0.1:{port}"),
        "--webhook-ca-file",
        &ca,
        "--webhook-namespace-selector",
        &selector,
    ]
    .map(|a| a.to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = BinaryServer::start_on(port, dir, &args, &[("KUBECONFIG", kubeconfig)]).await;
    server.wait_ready().await;
    server
}

/// The registered validating rules, as (resource, apiVersions), after
/// checking that every webhook has `matchPolicy: Equivalent`.
async fn registered(admin: &Client) -> Vec<(String, Vec<String>)> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let Some(configuration) = api.get_opt(WEBHOOKS).await.unwrap() else {
        return vec![];
    };
    let mut rules = Vec::new();
    for hook in configuration.webhooks.unwrap_or_default() {
        assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"), "{}", hook.name);
        for rule in hook.rules.unwrap_or_default() {
            for resource in rule.resources.unwrap_or_default() {
                rules.push((resource, rule.api_versions.clone().unwrap_or_default()));
            }
        }
    }
    rules
}

fn rules(gauges: &str, dials: &str) -> Vec<(String, Vec<String>)> {
    vec![
        ("gauges/status".to_owned(), vec![gauges.to_owned()]),
        ("dials/status".to_owned(), vec![dials.to_owned()]),
    ]
}

async fn wait_registered(admin: &Client, gauges: &str, dials: &str, server: &BinaryServer) {
    let wanted = rules(gauges, dials);
    retry_until(LIMIT, &format!("registered for {wanted:?}"), || async {
        let now = registered(admin).await;
        if now == wanted {
            Ok(())
        } else {
            Err(format!("{now:?}; the server's log:\n{}", server.log()))
        }
    })
    .await;
}

/// The answer to a write: 200, or the API server's code and message.
fn answer<T>(written: Result<T, kube::Error>) -> (u16, String) {
    match written {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        Err(e) => panic!("the write did not reach the API server: {e}"),
    }
}

/// The scaler's stale full update through `version`: it read the gauge,
/// the controller then wrote observedGeneration (through v1), and the
/// scaler sends its copy back with only the resourceVersion refreshed and
/// its own replicas changed. Returns the answer.
async fn stale_write(s: &Scenario, name: &str, version: &str, generation: i64) -> (u16, String) {
    let mut stale = serde_json::to_value(gauges(&s.scaler, version).get(name).await.unwrap()).unwrap();
    assert_eq!(stale["apiVersion"], format!("{GROUP}/{version}"));
    let fresh = json!({"status": {"observedGeneration": generation}});
    let written = gauges(&s.controller, "v1")
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&fresh))
        .await;
    assert_eq!(answer(written).0, 200, "the controller writes its own field");
    let latest = gauges(&s.scaler, version).get(name).await.unwrap();
    stale["metadata"]["resourceVersion"] = json!(latest.metadata.resource_version);
    stale["status"]["replicas"] = json!(generation * 10);
    answer(
        gauges(&s.scaler, version)
            .replace_status(name, &PostParams::default(), &serde_json::from_value(stale).unwrap())
            .await,
    )
}

/// The scaler's merge patch of its own replicas through `version`.
async fn own_write(s: &Scenario, name: &str, version: &str, replicas: i64) -> (u16, String) {
    let patch = json!({"status": {"replicas": replicas}});
    answer(
        gauges(&s.scaler, version)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

/// Waits until a stale write through `version` is denied by the ownership
/// rules (the webhook configuration reaches the API server's cache within
/// a moment of its write), then checks the denial.
async fn denied_through(s: &Scenario, name: &str, version: &str, from: i64, server: &BinaryServer) -> i64 {
    let mut generation = from;
    let what = format!("a stale write through {version} is denied");
    let (code, message) = retry_until(LIMIT, &what, || {
        generation += 1;
        let generation = generation;
        async move {
            match stale_write(s, name, version, generation).await {
                (409, message) if message.contains("statusguard") => Ok((409, message)),
                other => Err(format!("{other:?}; the server's log:\n{}", server.log())),
            }
        }
    })
    .await;
    assert_eq!(code, 409);
    assert!(
        message.contains(
            "system:serviceaccount:platform:widget-scaler may not change status fields owned by other writers"
        ) && message.contains("observedGeneration (owned by system:serviceaccount:platform:widget-controller)"),
        "{message}"
    );
    generation
}

/// How many reviews the server denied for gauges, and how many it refused
/// as undecidable (a review in another version than the rules' is).
async fn denied_and_refused(server: &BinaryServer) -> (f64, f64) {
    let metrics = server.metrics().await;
    let denied = format!(
        "statusguard_admission_requests_total{{endpoint=\"validate\",group=\"{GROUP}\",resource=\"gauges\",decision=\"denied\"}}"
    );
    let refused = "statusguard_admission_requests_total{endpoint=\"validate\",group=\"(unconfigured)\",resource=\"(unconfigured)\",decision=\"error\"}";
    (
        metric(&metrics, &denied).unwrap_or_default(),
        metric(&metrics, refused).unwrap_or_default(),
    )
}

#[tokio::test]
async fn writes_in_another_served_version_are_converted_to_the_rules_version() {
    let s = Scenario::new(NAMESPACE).await;
    let admin = s.admin.clone();
    apply_crd(&admin, "gauges", "Gauge", "v1").await;
    cluster::grant_status_writers(&admin, "gauge-writer", GROUP, "gauges", &[CONTROLLER, SCALER]).await;
    let created = gauges(&admin, "v1")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Gauge",
                "metadata": {"name": "g"}, "spec": {}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut with_status = serde_json::to_value(&created).unwrap();
    with_status["status"] = json!({"observedGeneration": 1, "replicas": 3});
    gauges(&admin, "v1")
        .replace_status(
            "g",
            &PostParams::default(),
            &serde_json::from_value(with_status).unwrap(),
        )
        .await
        .unwrap();

    // A document without version: the CRD's storage version, v1; the dials
    // have no CRD yet: every version, until their CRD appears.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &document(None), &s.cluster.kubeconfig).await;
    wait_registered(&admin, "v1", "*", &server).await;
    eventually(
        LIMIT,
        "the log says why the dials' rule names every version",
        || async {
            let log = server.log();
            log.contains("there is no CRD dials.versions.example.com (yet)") && log.contains("names every version (*)")
        },
    )
    .await;
    apply_crd(&admin, "dials", "Dial", "v2").await;
    wait_registered(&admin, "v1", "v2", &server).await;

    // Through v2, converted to v1: the stale write is denied, the scaler's own field is allowed.
    // The gauges' rule was never anything but v1: only the conversion
    // brings a write through v2 to the webhook.
    let generation = denied_through(&s, "g", "v2", 100, &server).await;
    assert_eq!(own_write(&s, "g", "v2", 7).await, (200, String::new()));
    let (denied, refused) = denied_and_refused(&server).await;
    assert!(denied >= 1.0 && refused == 0.0, "{denied} denied, {refused} refused");

    // The storage version moves to v2: the rule follows it, and a write
    // through v1 is converted to v2.
    apply_crd(&admin, "gauges", "Gauge", "v2").await;
    wait_registered(&admin, "v2", "v2", &server).await;
    let generation = denied_through(&s, "g", "v1", generation, &server).await;
    assert_eq!(own_write(&s, "g", "v1", 8).await, (200, String::new()));
    drop(server);

    // A document with version: v1 is registered for v1 whatever the storage
    // (v2 now); a write through v2 is converted to v1, or the rules (which
    // name v1) would refuse to decide it. (While the API server still holds
    // the previous configuration, for v2, a review in v2 is refused: the
    // count is taken once the new one is in force.)
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &document(Some("v1")), &s.cluster.kubeconfig).await;
    wait_registered(&admin, "v1", "v2", &server).await;
    let generation = denied_through(&s, "g", "v2", generation, &server).await;
    let (denied, refused) = denied_and_refused(&server).await;
    assert_eq!(stale_write(&s, "g", "v2", generation + 1).await.0, 409);
    assert_eq!(own_write(&s, "g", "v2", 9).await, (200, String::new()));
    assert_eq!(denied_and_refused(&server).await, (denied + 1.0, refused));
    let stored = gauges(&admin, "v2").get("g").await.unwrap();
    assert_eq!(stored.data["status"]["replicas"], 9);
    drop(server);

    let api: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    api.delete(WEBHOOKS, &DeleteParams::default()).await.unwrap();
    eventually(LIMIT, "the configuration is gone", || async {
        registered(&admin).await.is_empty()
    })
    .await;
}
