//! Issue 13: the webhook configurations follow the live ownership document,
//! and fail safe. The chart is installed for real; the server runs as its
//! pod would (the chart's arguments, ServiceAccount and only its RBAC, its
//! Secret's files) against the real API server:
//!
//! - a first install with an invalid document intercepts nothing and says why;
//! - fixing the ConfigMap by hand registers the webhook, enforcement starts;
//! - removing and adding the resource by hand changes interception;
//! - with statusguard down, exempt identities and `system:nodes` still
//!   write (matchConditions), others are refused (Fail), and audit resources
//!   stay writable (Ignore);
//! - an emptied webhook list (a forced replacement) is repaired within 2 s;
//! - `statusguard unregister` leaves no webhook behind, even with a server
//!   running.
//!
//! One test in its own binary: it installs a release with cluster-wide webhooks.

mod support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use support::chart::{Release, local_values};
use support::scenario::Scenario;
use support::webhook::{assert_metric, eventually, free_port};

const RELEASE: &str = "reg";
const NAMESPACE: &str = "statusguard-registration";
const NAME: &str = "reg-statusguard";
/// The release's webhook configurations: its full name and namespace.
const WEBHOOKS: &str = "reg-statusguard-statusguard-registration";
const CONFIGMAP: &str = "reg-statusguard-ownership";
const EXAMPLE: &str = include_str!("../examples/ownership.yaml");

/// The example with a break-glass user, in `mode`, or without widgets.
fn document(mode: &str) -> String {
    EXAMPLE
        .replace("  users: []", "  users: [breakglass]")
        .replace("mode: enforce ", &format!("mode: {mode} "))
}

fn without_widgets() -> String {
    let cut = EXAMPLE.find("resources:").unwrap();
    format!("{}resources: []\n", &EXAMPLE[..cut])
}

/// Both writers claim observedGeneration: valid YAML the chart's schema
/// accepts, an invalid document for the server.
fn overlapping() -> String {
    document("enforce").replace(
        "fields: [replicas, scale.lastScaleTime]",
        "fields: [replicas, observedGeneration]",
    )
}

/// The webhooks the server registered for status writes, as (name,
/// failurePolicy, resources); the ownership ConfigMap's own is left out.
async fn registered(s: &Scenario) -> Vec<(String, String, Vec<String>)> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    let Some(configuration) = api.get_opt(WEBHOOKS).await.unwrap() else {
        return vec![];
    };
    configuration
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .filter(|hook| !hook.name.starts_with("ownership."))
        .map(|hook| {
            let resources = hook
                .rules
                .unwrap_or_default()
                .into_iter()
                .flat_map(|r| r.resources.unwrap_or_default())
                .collect();
            (hook.name, hook.failure_policy.unwrap_or_default(), resources)
        })
        .collect()
}

async fn edit_configmap(s: &Scenario, document: &str) {
    let api: Api<ConfigMap> = Api::namespaced(s.admin.clone(), NAMESPACE);
    let patch = json!({"data": {"ownership.yaml": document}});
    api.patch(CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A client of the admin's credentials impersonating `user` in `groups`.
async fn impersonating(s: &Scenario, user: &str, groups: &[&str]) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(&s.cluster.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn the_webhooks_follow_the_live_document_and_fail_safe() {
    let s = Scenario::new("e2e-registration").await;
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    // The break-glass user and the nodes may write widgets, as any writer.
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(s.admin.clone());
    support::cluster::ensure_json(
        &bindings,
        json!({"metadata": {"name": "widget-writer-breakglass-and-nodes"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "widget-writer"},
               "subjects": [{"kind": "User", "name": "breakglass", "apiGroup": "rbac.authorization.k8s.io"},
                            {"kind": "Group", "name": "system:nodes", "apiGroup": "rbac.authorization.k8s.io"}]}),
    )
    .await;
    let breakglass = impersonating(&s, "breakglass", &["system:authenticated"]).await;
    let node = impersonating(&s, "system:node:n1", &["system:nodes", "system:authenticated"]).await;

    // A first install whose document the chart's schema accepts and the server rejects.
    let values = local_values(&overlapping(), port, "certificates:\n  extraIPs: [127.0.0.1]\n");
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&values);
    let pod = release.pod(s.cluster, home.path(), NAME).await;
    let start = || pod.start_on(port, home.path());

    let server = start().await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 3}))
        .await;
    eventually(Duration::from_secs(30), "/readyz says the document is invalid", || async {
        matches!(server.get_admin("/readyz").await, Some((503, body)) if body.contains("invalid ownership document"))
    })
    .await;
    let metrics = server.metrics().await;
    assert_metric(&metrics, "statusguard_webhooks_registered", 0.0);
    assert_metric(&metrics, "statusguard_webhook_syncs_total{result=\"waiting\"}", 1.0);
    assert!(registered(&s).await.is_empty(), "nothing intercepts");
    let events: Api<Event> = Api::namespaced(s.admin.clone(), NAMESPACE);
    eventually(
        Duration::from_secs(30),
        "an InvalidOwnership Event on the ConfigMap",
        || async {
            let listed = events.list(&ListParams::default()).await.unwrap();
            listed.items.iter().any(|e| {
                e.reason.as_deref() == Some("InvalidOwnership") && e.involved_object.name.as_deref() == Some(CONFIGMAP)
            })
        },
    )
    .await;
    // Nothing is intercepted: the scaler may write the controller's field.
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 200);

    // Fixing the ConfigMap by hand registers the webhook; enforcement starts.
    edit_configmap(&s, &document("enforce")).await;
    server.wait_ready().await;
    eventually(
        Duration::from_secs(30),
        "the validate webhook is registered",
        || async {
            registered(&s).await
                == vec![(
                    "validate.reg-statusguard-statusguard-registration.statusguard.dev".to_owned(),
                    "Fail".to_owned(),
                    vec!["widgets/status".to_owned()],
                )]
        },
    )
    .await;
    s.wait_until_called(&["endpoint=\"validate\""], || server.metrics())
        .await;
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 409);
    // The chart's ClusterRole lets the server read the Widget CRD: the rule
    // names its storage version, to which the API server converts the others.
    let hooks = Api::<ValidatingWebhookConfiguration>::all(s.admin.clone())
        .get(WEBHOOKS)
        .await
        .unwrap()
        .webhooks
        .unwrap_or_default();
    let rule = &hooks[0].rules.as_deref().unwrap_or_default()[0];
    assert_eq!(rule.api_versions, Some(vec!["v1".to_owned()]), "{hooks:?}");
    assert_eq!(hooks[0].match_policy.as_deref(), Some("Equivalent"));

    // Issue 23: a forced replacement by a deploy tool (helm upgrade --force,
    // Argo CD's Replace=true) leaves the webhook list empty; the server
    // watches its configurations and applies them again within 2 s.
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    validating
        .patch(
            WEBHOOKS,
            &PatchParams::default(),
            &Patch::Merge(&json!({"webhooks": []})),
        )
        .await
        .unwrap();
    let emptied = std::time::Instant::now();
    eventually(
        Duration::from_secs(2),
        "the emptied webhook list is repaired",
        || async { !registered(&s).await.is_empty() },
    )
    .await;
    eprintln!("the emptied webhook list was repaired in {:?}", emptied.elapsed());
    // The API server applies the configuration when its own informer has
    // it, a moment after this test read it.
    eventually(Duration::from_secs(5), "enforcing again", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;

    // Removing the resource by hand releases it within seconds; adding it back guards it again.
    edit_configmap(&s, &without_widgets()).await;
    eventually(
        Duration::from_secs(30),
        "the scaler may write observedGeneration",
        || async { s.write_observed_generation(&s.scaler, "w").await == 200 },
    )
    .await;
    // The rules in force and the webhook configurations are applied apart:
    // the write may be allowed by the new rules a moment before the
    // configuration that still names the widgets is emptied.
    eventually(Duration::from_secs(30), "the widgets' webhook is removed", || async {
        registered(&s).await.is_empty()
    })
    .await;
    edit_configmap(&s, &document("enforce")).await;
    eventually(Duration::from_secs(30), "the widgets are guarded again", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;

    // statusguard down (SIGKILL): Fail refuses others, but exempt users and
    // the nodes never reach the webhook.
    drop(server);
    eventually(Duration::from_secs(30), "the scaler's write is refused", || async {
        let code = s.write_observed_generation(&s.scaler, "w").await;
        code != 200 && code != 409
    })
    .await;
    assert_eq!(s.write_observed_generation(&breakglass, "w").await, 200, "break-glass");
    assert_eq!(s.write_observed_generation(&node, "w").await, 200, "system:nodes");

    // An audit resource has Ignore: writable with statusguard down.
    let server = start().await;
    server.wait_ready().await;
    edit_configmap(&s, &document("audit")).await;
    eventually(Duration::from_secs(30), "the audit webhook is registered", || async {
        registered(&s).await
            == vec![(
                "audit.reg-statusguard-statusguard-registration.statusguard.dev".to_owned(),
                "Ignore".to_owned(),
                vec!["widgets/status".to_owned()],
            )]
    })
    .await;
    drop(server);
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 200, "Ignore");

    // `statusguard unregister` as the pre-delete hook runs it, with a server
    // running: nothing left behind, and the server does not put it back.
    let server = start().await;
    edit_configmap(&s, &document("enforce")).await;
    eventually(Duration::from_secs(30), "enforce again", || async {
        s.write_observed_generation(&s.scaler, "w").await == 409
    })
    .await;
    release.run_pre_delete_hook(&pod.kubeconfig);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(s.admin.clone());
    // Longer than the server's 2 s wake-up: it stood down, it re-applies nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(validating.get_opt(WEBHOOKS).await.unwrap().is_none());
    assert!(mutating.get_opt(WEBHOOKS).await.unwrap().is_none());
    let metrics = server.metrics().await;
    assert_metric(&metrics, "statusguard_webhook_syncs_total{result=\"stood_down\"}", 1.0);
    assert_eq!(s.write_observed_generation(&s.scaler, "w").await, 200);
    drop(server);
}
