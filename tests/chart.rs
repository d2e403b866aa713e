//! The Helm chart: lint, render, validation, acceptance by the real API
//! server, and install/upgrade/uninstall end to end.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};
use support::cluster::{self, Cluster};
use support::scenario::Scenario;
use support::webhook::{BinaryServer, eventually, free_port};

const RELEASE_NAMESPACE: &str = "statusguard-system";
/// Where the rendered manifests are applied: apart from the installed
/// release, so that the two tests never touch each other's objects.
const APPLY_NAMESPACE: &str = "statusguard-apply";

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/statusguard")
}

/// helm, with its caches and config in a folder of the test's own.
fn helm(home: &Path) -> Command {
    let assets = cluster::assets().unwrap_or_else(|e| panic!("no helm binary: {e}"));
    let mut command = Command::new(assets.join("helm"));
    for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        command.env(var, home.join(var));
    }
    command
}

/// `helm template` with `values` (YAML); Ok(manifests) or Err(stderr).
fn template(values: &str) -> Result<String, String> {
    template_as("sg", RELEASE_NAMESPACE, values)
}

fn template_as(release: &str, namespace: &str, values: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let output = helm(dir.path())
        .args(["template", release])
        .arg(chart())
        .args(["-n", namespace, "-f"])
        .arg(&file)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn documents(manifests: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(manifests)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn kinds(manifests: &str) -> Vec<String> {
    documents(manifests)
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The shared fixture (tests/fixtures/ownership.yaml) as chart values.
fn ownership() -> String {
    let fixture = include_str!("fixtures/ownership.yaml");
    let indented: String = fixture
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("  {l}\n"))
        .collect();
    format!("ownership:\n{indented}")
}

/// (what, values, kinds that must be rendered, kinds that must not)
fn configurations() -> Vec<(&'static str, String, Vec<&'static str>, Vec<&'static str>)> {
    let base = [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ];
    let with = |extra: &[&'static str]| base.iter().chain(extra).copied().collect::<Vec<_>>();
    vec![
        (
            "defaults",
            String::new(),
            with(&["Secret", "ValidatingWebhookConfiguration"]),
            vec!["MutatingWebhookConfiguration"],
        ),
        (
            "helm certificates",
            ownership(),
            with(&["Secret", "ValidatingWebhookConfiguration"]),
            vec!["Issuer"],
        ),
        (
            "cert-manager",
            format!("{}certificates: {{mode: certManager}}\n", ownership()),
            with(&["Issuer", "Certificate", "ValidatingWebhookConfiguration"]),
            vec!["Secret"],
        ),
        (
            "existing Secret",
            format!(
                "{}certificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: Zm9v}}\n",
                ownership()
            ),
            with(&["ValidatingWebhookConfiguration"]),
            vec!["Secret", "Certificate"],
        ),
        (
            "trim mode",
            ownership().replace("mode: enforce", "mode: trim"),
            with(&["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"]),
            vec![],
        ),
        (
            "NetworkPolicy and ServiceMonitor",
            format!(
                "{}networkPolicy: {{enabled: true}}\nmetrics: {{service: {{enabled: true}}, serviceMonitor: {{enabled: true}}}}\n",
                ownership()
            ),
            with(&["NetworkPolicy", "ServiceMonitor"]),
            vec![],
        ),
        (
            "webhook URL",
            format!("{}webhook: {{url: \"https://127.0.0.1:9443\"}}\n", ownership()),
            with(&["ValidatingWebhookConfiguration"]),
            vec![],
        ),
    ]
}

#[test]
fn helm_lint_strict_passes() {
    let home = tempfile::tempdir().unwrap();
    for values in [String::new(), ownership()] {
        let file = home.path().join("values.yaml");
        std::fs::write(&file, values).unwrap();
        let output = helm(home.path())
            .args(["lint", "--strict"])
            .arg(chart())
            .arg("-f")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn every_configuration_renders_what_it_should() {
    for (what, values, present, absent) in configurations() {
        let manifests = template(&values).unwrap_or_else(|e| panic!("{what}: {e}"));
        let kinds = kinds(&manifests);
        for kind in present {
            assert!(kinds.iter().any(|k| k == kind), "{what}: no {kind} in {kinds:?}");
        }
        for kind in absent {
            assert!(!kinds.iter().any(|k| k == kind), "{what}: unexpected {kind}");
        }
    }
}

#[test]
fn the_webhooks_follow_the_ownership_document_and_the_certificate() {
    let values = ownership().replace("resource: gadgets", "resource: gadgets\n      mode: trim");
    let docs = documents(&template(&values).unwrap());
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    let validating = find("ValidatingWebhookConfiguration");
    let hook = &validating["webhooks"][0];
    assert_eq!(hook["rules"].as_array().unwrap().len(), 2);
    assert_eq!(hook["rules"][0]["resources"], json!(["widgets/status"]));
    assert_eq!(hook["rules"][0]["operations"], json!(["UPDATE"]));
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["clientConfig"]["service"]["path"], "/validate");
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0]["values"];
    assert_eq!(excluded, &json!([RELEASE_NAMESPACE, "kube-system"]));
    let mutating = find("MutatingWebhookConfiguration");
    assert_eq!(
        mutating["webhooks"][0]["rules"][0]["resources"],
        json!(["gadgets/status"]),
        "only trim resources"
    );
    assert_eq!(mutating["webhooks"][0]["reinvocationPolicy"], "IfNeeded");

    let secret = find("Secret");
    assert_eq!(
        hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"],
        "the webhooks trust the Secret's CA"
    );
    let deployment = find("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    assert!(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/certificate"].is_string());
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert!(
        args.contains(&json!("--configmap=statusguard-system/sg-statusguard-ownership")),
        "{args:?}"
    );
    let configmap = find("ConfigMap");
    let document = configmap["data"]["ownership.yaml"].as_str().unwrap();
    statusguard::ownership::Ownership::from_yaml(document).expect("the chart renders a valid ownership document");
}

#[test]
fn invalid_values_fail_with_a_clear_message() {
    let cases = [
        ("a wrong type", "replicas: two\n".to_owned(), "replicas"),
        ("an unknown key", "replica: 2\n".to_owned(), "replica"),
        (
            "an unknown mode",
            ownership().replace("mode: enforce", "mode: block"),
            "mode",
        ),
        (
            "a wrong apiVersion",
            ownership().replace("statusguard.dev/v1alpha1", "v1"),
            "apiVersion",
        ),
        (
            "an unknown ownership key",
            ownership().replace("exempt:", "exemptions:"),
            "exemptions",
        ),
        (
            "a writer with two identities",
            ownership().replace(
                "- serviceAccount: platform/widget-scaler",
                "- serviceAccount: platform/widget-scaler\n          user: bob",
            ),
            "writers",
        ),
        (
            "a bad field path",
            ownership().replace("fields: [replicas, scale.lastScaleTime]", "fields: [\"a..b\"]"),
            "fields",
        ),
        (
            "existingSecret without caBundle",
            "certificates: {mode: existingSecret, existingSecret: x}\n".to_owned(),
            "caBundle",
        ),
        (
            "a bad failure policy",
            "webhook: {failurePolicy: Sometimes}\n".to_owned(),
            "failurePolicy",
        ),
        (
            "ServiceMonitor without its Service",
            "metrics: {serviceMonitor: {enabled: true}}\n".to_owned(),
            "metrics.service.enabled",
        ),
    ];
    for (what, values, phrase) in cases {
        match template(&values) {
            Ok(_) => panic!("{what}: rendered"),
            Err(e) => assert!(e.contains(phrase), "{what}: {e}"),
        }
    }
}

/// CRDs of the optional integrations, so that the API server can accept
/// their objects: prometheus-operator's ServiceMonitor and cert-manager's
/// Issuer and Certificate (schemas kept open; the real ones are stricter).
async fn integration_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (group, kind, plural) in [
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("cert-manager.io", "Issuer", "issuers"),
        ("cert-manager.io", "Certificate", "certificates"),
    ] {
        cluster::ensure_json(
            &crds,
            json!({"metadata": {"name": format!("{plural}.{group}")}, "spec": {
                "group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}),
        )
        .await;
    }
}

#[tokio::test]
async fn the_rendered_manifests_are_accepted_by_the_api_server() {
    let cluster = Cluster::shared();
    let client = cluster.admin().await;
    integration_crds(&client).await;
    cluster::namespace(&client, APPLY_NAMESPACE, json!({})).await;
    let mut discovery = None;
    for (what, values, _, _) in configurations() {
        // Another release name too: the webhook configurations are cluster-scoped.
        let manifests = template_as("applied", APPLY_NAMESPACE, &values).unwrap();
        for doc in documents(&manifests) {
            let gvk = kube::api::GroupVersionKind::try_from(
                &serde_json::from_value::<kube::api::TypeMeta>(doc.clone()).unwrap(),
            )
            .unwrap();
            // Discovery is run again until it knows the integration CRDs.
            let mut resolved = None;
            for _ in 0..50 {
                if discovery.is_none() {
                    discovery = Some(Discovery::new(client.clone()).run().await.unwrap());
                }
                resolved = discovery.as_ref().and_then(|d| d.resolve_gvk(&gvk));
                if resolved.is_some() {
                    break;
                }
                discovery = None;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let (resource, capabilities) =
                resolved.unwrap_or_else(|| panic!("{what}: the API server does not know {gvk:?}"));
            let api: Api<DynamicObject> = match capabilities.scope {
                Scope::Namespaced => Api::namespaced_with(client.clone(), APPLY_NAMESPACE, &resource),
                Scope::Cluster => Api::all_with(client.clone(), &resource),
            };
            let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
            let params = PatchParams::apply("statusguard-chart-test").dry_run();
            if let Err(e) = api.patch(&name, &params, &Patch::Apply(&doc)).await {
                panic!("{what}: the API server rejected {} {name}: {e}", gvk.kind);
            }
        }
    }
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_drive_the_webhook_end_to_end() {
    let s = Scenario::new("e2e-chart").await;
    let cluster = s.cluster;
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let example = include_str!("../examples/ownership.yaml");
    let values = |document: &str| {
        let indented: String = document.lines().map(|l| format!("  {l}\n")).collect();
        format!(
            "ownership:\n{indented}webhook:\n  url: https://127.0.0.1:{port}\ncertificates:\n  extraIPs: [127.0.0.1]\n"
        )
    };
    let values_file = home.path().join("values.yaml");
    std::fs::write(&values_file, values(example)).unwrap();
    let run_helm = |args: &[&str]| {
        let output = helm(home.path())
            .args(args)
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let chart = chart().display().to_string();
    let values_path = values_file.display().to_string();
    run_helm(&[
        "install",
        "sg",
        &chart,
        "-n",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "-f",
        &values_path,
    ]);

    // Run the server as the chart's ServiceAccount, with the chart's certificate.
    let secrets: Api<Secret> = Api::namespaced(s.admin.clone(), RELEASE_NAMESPACE);
    let secret = secrets.get("sg-statusguard-tls").await.unwrap();
    let data = secret.data.unwrap();
    for key in ["tls.crt", "tls.key"] {
        std::fs::write(home.path().join(key), &data[key].0).unwrap();
    }
    let kubeconfig = cluster
        .service_account_kubeconfig(RELEASE_NAMESPACE, "sg-statusguard")
        .await;
    let cert = home.path().join("tls.crt").display().to_string();
    let key = home.path().join("tls.key").display().to_string();
    let server = BinaryServer::start_on(
        port,
        home.path(),
        &[
            "--configmap",
            "statusguard-system/sg-statusguard-ownership",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
        &[("KUBECONFIG", &kubeconfig)],
    )
    .await;
    server.wait_ready().await;
    s.wait_until_called(&["endpoint=\"validate\""], || server.metrics())
        .await;

    // The stale rollback is denied through the chart's webhook configuration.
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 3}))
        .await;
    let retry = s.stale_retry("w").await;
    assert_eq!(retry.code, 409, "{:?}\n{}", retry.body, server.log());

    // helm upgrade with observedGeneration moved to the scaler: the same process changes its decision.
    let moved = example
        .replace("fields: [observedGeneration, summary]", "fields: [summary]")
        .replace(
            "fields: [replicas, scale.lastScaleTime]",
            "fields: [replicas, observedGeneration]",
        );
    std::fs::write(&values_file, values(&moved)).unwrap();
    run_helm(&["upgrade", "sg", &chart, "-n", RELEASE_NAMESPACE, "-f", &values_path]);
    let kept = secrets.get("sg-statusguard-tls").await.unwrap().data.unwrap();
    assert_eq!(kept, data, "the generated certificate is kept across upgrades (lookup)");
    s.wait_until_writable(
        &s.scaler,
        "w",
        10,
        Duration::from_secs(30),
        "the upgrade's ownership is in force",
    )
    .await;
    let mut process = server.process;
    assert!(process.0.try_wait().unwrap().is_none(), "the server was not restarted");

    // helm uninstall removes the webhook configurations: status writes pass again.
    run_helm(&["uninstall", "sg", "-n", RELEASE_NAMESPACE]);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    assert!(validating.get_opt("sg-statusguard").await.unwrap().is_none());
    eventually(
        Duration::from_secs(30),
        "the controller's field is writable by anyone again",
        || async {
            s.merge_patch_status(&s.controller, "w", json!({"status": {"replicas": 42}}))
                .await
                .code
                == 200
        },
    )
    .await;
    let _ = process.0.kill();
}
