//! Issue 22: forged reviews make no Events. The chart is installed and the
//! server runs as its pod would, with the chart's ServiceAccount and RBAC.
//! A real write the webhook denies is a Warning Event on its object; reviews
//! posted straight to the webhook's port, which asks for no client
//! certificate, are answered, but one naming an existing object with a
//! made-up uid and one naming no object at all make no Event, and are
//! counted as unverified; long names in them are cut in `/observed` and
//! the metrics.
//!
//! One test in its own binary: it installs a release with cluster-wide webhooks.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::chart::Release;
use support::scenario::Scenario;
use support::webhook::{BinaryServer, free_port, https_client, metric};

const RELEASE: &str = "events";
const NAMESPACE: &str = "statusguard-events";
const SCALER: &str = "system:serviceaccount:platform:widget-scaler";

const OWNERSHIP: &str = "ownership:
  apiVersion: statusguard.dev/v1alpha1
  kind: StatusOwnership
  mode: enforce
  resources:
    - group: example.com
      resource: widgets
      writers:
        - {serviceAccount: platform/widget-controller, fields: [observedGeneration]}
        - {serviceAccount: platform/widget-scaler, fields: [replicas]}
";

/// A review as the API server would send it for the scaler's write of
/// `name`'s observedGeneration (the controller's): denied.
fn forged_review(namespace: &str, name: &str, uid: &str) -> Value {
    let object = |generation: i64| {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
               "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
               "spec": {"size": 3}, "status": {"observedGeneration": generation, "replicas": 1}})
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("review-of-{uid}"),
            "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
            "requestKind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "requestResource": {"group": "example.com", "version": "v1", "resource": "widgets"},
            "subResource": "status",
            "name": name,
            "namespace": namespace,
            "operation": "UPDATE",
            "userInfo": {"username": SCALER, "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": object(7),
            "oldObject": object(1),
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}
        }
    })
}

/// The StatusRollbackDenied Events in `namespace`.
async fn denied_events(s: &Scenario) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(s.admin.clone(), &s.namespace);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("StatusRollbackDenied"))
        .collect()
}

#[tokio::test]
async fn only_an_object_that_exists_with_the_reviews_uid_gets_an_event() {
    let s = Scenario::new("e2e-events").await;
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&format!(
        "{OWNERSHIP}webhook:\n  url: https://127.0.0.1:{port}\nevents:\n  interval: 500ms\n"
    ));
    let args = release.server_args(home.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The chart's own ServiceAccount: its RBAC is what the check reads with.
    let kubeconfig = s
        .cluster
        .service_account_kubeconfig(NAMESPACE, "events-statusguard")
        .await;
    let server = BinaryServer::start_on(port, home.path(), &args, &[("KUBECONFIG", &kubeconfig)]).await;
    server.wait_ready().await;
    s.wait_until_called(&["endpoint=\"validate\""], || server.metrics())
        .await;

    // A real write the webhook denies: an Event on the object.
    s.create_widget("w1", json!({"observedGeneration": 1, "replicas": 1}))
        .await;
    let uid = s.get(&s.admin, "w1").await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let written = s
        .merge_patch_status(&s.scaler, "w1", json!({"status": {"observedGeneration": 5}}))
        .await;
    assert_eq!(written.code, 409, "{:?}", written.body);
    let real = support::wait::retry_until(Duration::from_secs(20), "an Event on w1", || async {
        let events = denied_events(&s).await;
        match events.len() {
            0 => Err(format!("none yet; the server's log:\n{}", server.log())),
            _ => Ok(events),
        }
    })
    .await;
    let regarding = real[0].regarding.clone().expect("the object");
    assert_eq!(
        (
            regarding.name.as_deref(),
            regarding.uid.as_deref(),
            regarding.kind.as_deref()
        ),
        (Some("w1"), Some(uid.as_str()), Some("Widget"))
    );

    // Forged reviews, straight to the webhook's port: answered (denied)...
    let secret: Api<Secret> = Api::namespaced(s.admin.clone(), NAMESPACE);
    let tls = secret.get("events-statusguard-tls").await.unwrap();
    let ca = tls
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("the CA")
        .0
        .clone();
    let client = https_client(&String::from_utf8(ca).unwrap());
    let url = format!("https://127.0.0.1:{port}/validate");
    // The third claims a 256 KiB user name and status key.
    let long = "x".repeat(256 * 1024);
    let mut long_names = forged_review(&s.namespace, "ghost", "00000000-0000-4000-8000-00000000cafe");
    long_names["request"]["userInfo"]["username"] = json!(long);
    long_names["request"]["object"]["status"][&long] = json!(1);
    for review in [
        forged_review(&s.namespace, "w1", "00000000-0000-4000-8000-00000000f00d"),
        forged_review(&s.namespace, "ghost", "00000000-0000-4000-8000-00000000beef"),
        long_names,
    ] {
        let answer: Value = client
            .post(&url)
            .json(&review)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
    }
    // ...and counted as unverified, with no Event.
    let series = "statusguard_events_total{reason=\"StatusRollbackDenied\",result=\"unverified\"}";
    support::wait::retry_until(Duration::from_secs(20), "the forged reviews are counted", || async {
        let metrics = server.metrics().await;
        match metric(&metrics, series) {
            Some(3.0) => Ok(()),
            _ => Err(metrics),
        }
    })
    .await;
    let events = denied_events(&s).await;
    let regarding: Vec<(Option<String>, Option<String>)> = events
        .iter()
        .filter_map(|e| e.regarding.as_ref())
        .map(|r| (r.name.clone(), r.uid.clone()))
        .collect();
    assert_eq!(
        regarding,
        [(Some("w1".to_owned()), Some(uid.clone()))],
        "only the real write's Event"
    );
    let metrics = server.metrics().await;
    let longest = metrics.lines().map(str::len).max().unwrap_or_default();
    assert!(longest < 2048, "a metrics line of {longest} bytes");
    assert_eq!(
        metric(
            &metrics,
            "statusguard_events_total{reason=\"StatusRollbackDenied\",result=\"sent\"}"
        ),
        Some(1.0),
        "{metrics}"
    );

    // The record counted the writes, names cut, and says it could be forged.
    let (_, observed) = server.get_admin("/observed").await.unwrap();
    assert!(observed.len() < 8 * 1024, "/observed is {} bytes", observed.len());
    let observed: Value = serde_json::from_str(&observed).unwrap();
    assert_eq!(observed["basis"]["authenticatedCallers"], false, "{observed}");
    let scaler = observed["resources"][0]["writers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["identity"] == SCALER)
        .cloned()
        .unwrap_or_default();
    assert_eq!(scaler["writes"], 3, "{observed}");
    let cut = observed["resources"][0]["writers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["identity"].as_str().is_some_and(|i| i.starts_with("xxxx")))
        .cloned()
        .unwrap_or_default();
    assert_eq!(cut["writes"], 1, "{observed}");
    assert!(cut["identity"].as_str().unwrap().ends_with('\u{2026}'), "{observed}");
}
