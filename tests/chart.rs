//! The Helm chart: lint, render, validation, acceptance by the real API
//! server, and install/upgrade/uninstall end to end.

mod support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};
use support::chart::{Release, chart, container_args, documents, helm, template_as};
use support::cluster::{self, Cluster};
use support::scenario::Scenario;
use support::webhook::{BinaryServer, eventually, free_port};

const RELEASE_NAMESPACE: &str = "statusguard-system";
/// The release's webhook configurations: its full name and namespace.
const WEBHOOKS: &str = "sg-statusguard-statusguard-system";
/// Where the rendered manifests are applied: apart from the installed
/// release, so that the two tests never touch each other's objects.
const APPLY_NAMESPACE: &str = "statusguard-apply";

/// `helm template` with `values` (YAML); Ok(manifests) or Err(stderr).
fn template(values: &str) -> Result<String, String> {
    template_as("sg", RELEASE_NAMESPACE, values)
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

/// (what, values, kinds that must be rendered, kinds that must not). The
/// webhook configurations are rendered empty: the server fills them in.
fn configurations() -> Vec<(&'static str, String, Vec<&'static str>, Vec<&'static str>)> {
    let base = [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Job",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ];
    let with = |extra: &[&'static str]| base.iter().chain(extra).copied().collect::<Vec<_>>();
    let never = |extra: &[&'static str]| extra.to_vec();
    vec![
        ("defaults", String::new(), with(&["Secret"]), never(&[])),
        (
            "helm certificates",
            format!("{}certificates: {{mode: helm}}\n", ownership()),
            with(&["Secret"]),
            never(&["Issuer"]),
        ),
        (
            "cert-manager",
            format!("{}certificates: {{mode: certManager}}\n", ownership()),
            with(&["Issuer", "Certificate"]),
            never(&["Secret"]),
        ),
        (
            "existing Secret",
            format!(
                "{}certificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: {CA_BUNDLE_BASE64}}}\n",
                ownership()
            ),
            with(&[]),
            never(&["Secret", "Certificate"]),
        ),
        (
            "trim mode",
            ownership().replace("mode: enforce", "mode: trim"),
            with(&[]),
            never(&[]),
        ),
        (
            "NetworkPolicy and ServiceMonitor",
            format!(
                "{}networkPolicy: {{enabled: true}}\nmetrics: {{service: {{enabled: true}}, serviceMonitor: {{enabled: true}}}}\n",
                ownership()
            ),
            with(&["NetworkPolicy", "ServiceMonitor"]),
            never(&[]),
        ),
        (
            // No webhook: no webhook Service, certificate or configuration,
            // but the metrics Service its ServiceMonitor selects (the alert
            // on unregistered policies reads those metrics).
            "policies engine, monitored",
            format!(
                "{}engine: policies\nmetrics: {{service: {{enabled: true}}, serviceMonitor: {{enabled: true}}}}\n",
                ownership()
            ),
            base.iter()
                .copied()
                .filter(|kind| !kind.ends_with("WebhookConfiguration"))
                .chain(["ServiceMonitor"])
                .collect(),
            never(&[
                "Secret",
                "ValidatingWebhookConfiguration",
                "MutatingWebhookConfiguration",
            ]),
        ),
        (
            "webhook URL",
            format!("{}webhook: {{url: \"https://127.0.0.1:9443\"}}\n", ownership()),
            with(&[]),
            never(&[]),
        ),
        (
            "client certificates required",
            format!("{}{CLIENT_AUTH}", ownership()),
            with(&["Secret"]),
            never(&[]),
        ),
        (
            // The dashboard in the release namespace: the API server test
            // applies every object there.
            "every knob of issue 23",
            format!(
                "{}{}",
                ownership(),
                every_knob().replace("    namespace: monitoring\n", "")
            ),
            with(&["NetworkPolicy", "PodMonitor", "PrometheusRule"])
                .into_iter()
                .filter(|kind| *kind != "ServiceAccount")
                .collect(),
            never(&["ServiceAccount", "ServiceMonitor"]),
        ),
    ]
}

/// The values file that sets every knob of issue 23 (chart-testing's ci/ folder).
fn every_knob() -> String {
    std::fs::read_to_string(chart().join("ci/every-knob-values.yaml")).unwrap()
}

/// A CA bundle for existingSecret mode, as PEM and as base64 of it.
const CA_BUNDLE_PEM: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
const CA_BUNDLE_BASE64: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkFBQUEKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQ==";

/// `webhook.clientAuth` from a ConfigMap, and the `helm test` pod's certificate.
const CLIENT_AUTH: &str = "webhook: {clientAuth: {enabled: true, caConfigMap: apiserver-webhook-client-ca}}\ntests: {clientCertSecret: probe-client}\n";

#[test]
fn helm_lint_strict_passes() {
    let home = tempfile::tempdir().unwrap();
    for values in [String::new(), ownership(), format!("{}{}", ownership(), every_knob())] {
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
fn the_server_keeps_the_webhooks_and_the_chart_grants_only_that() {
    let docs = documents(&template(&ownership()).unwrap());
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    let args = container_args(&template(&ownership()).unwrap(), "Deployment");
    for expected in [
        "--configmap=statusguard-system/sg-statusguard-ownership",
        "--register-webhooks=sg-statusguard-statusguard-system",
        "--webhook-target=statusguard-system/sg-statusguard:443",
        "--manage-certificates=statusguard-system/sg-statusguard-tls",
        "--cert-validity=90d",
        "--webhook-failure-policy=fail",
        "--webhook-timeout-seconds=5",
        "--events=true",
        "--event-interval=5s",
        "--observe-rate=200",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} not in {args:?}");
    }
    let selector = args
        .iter()
        .find_map(|a| a.strip_prefix("--webhook-namespace-selector="))
        .expect("a namespace selector");
    let selector: Value = serde_json::from_str(selector).unwrap();
    assert_eq!(
        selector["matchExpressions"][0],
        json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [RELEASE_NAMESPACE, "kube-system"]})
    );
    // A URL target and an existing Secret's CA, mounted from a ConfigMap of the chart's.
    let values = format!(
        "{}webhook: {{url: \"https://127.0.0.1:9443\", failurePolicy: Ignore}}\ncertificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: {CA_BUNDLE_BASE64}}}\n",
        ownership()
    );
    let manifests = template(&values).unwrap();
    let args = container_args(&manifests, "Deployment");
    for expected in [
        "--webhook-target=https://127.0.0.1:9443",
        "--webhook-ca-file=/etc/statusguard/ca/ca.crt",
        "--webhook-failure-policy=ignore",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} not in {args:?}");
    }
    let ca = documents(&manifests)
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "sg-statusguard-ca")
        .expect("the CA ConfigMap");
    assert_eq!(ca["data"]["ca.crt"].as_str().unwrap().trim(), CA_BUNDLE_PEM);

    // The webhook configurations are rendered empty: Helm never writes
    // their webhooks, which the server applies from the live document.
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        let configuration = find(kind);
        assert_eq!(configuration["metadata"]["name"], "sg-statusguard-statusguard-system");
        assert!(configuration.get("webhooks").is_none(), "{kind}: {configuration}");
    }
    // RBAC: the release's own two webhook configurations, the CRDs (read),
    // and its own ConfigMap; for the Events, get (only) on the guarded
    // resources, whose objects are read to check a review's uid.
    let cluster_role = find("ClusterRole");
    assert_eq!(
        cluster_role["rules"],
        json!([{"apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                "resourceNames": ["sg-statusguard-statusguard-system"], "verbs": ["get", "list", "watch", "patch", "delete"]},
               {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                "verbs": ["get", "list", "watch"]},
               {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
               {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]},
               {"apiGroups": ["example.com"], "resources": ["gadgets"], "verbs": ["get"]}])
    );
    let quiet = template(&format!("{}events: {{enabled: false}}\n", ownership())).unwrap();
    let role = documents(&quiet)
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .unwrap();
    assert_eq!(
        role["rules"].as_array().unwrap().len(),
        2,
        "no Events, no grant: {role}"
    );
    let quiet_args = container_args(&quiet, "Deployment");
    assert!(quiet_args.contains(&"--events=false".to_owned()), "{quiet_args:?}");
    let role = find("Role");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["sg-statusguard-ownership"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["sg-statusguard-ownership-state"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["sg-statusguard-tls"],
             "verbs": ["get", "list", "watch", "update"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ]),
        "the state ConfigMap and a deleted Secret are created; nothing else is: {role}"
    );
    // The server's certificates: an empty Secret, no key material in the manifests.
    let secret = find("Secret");
    assert!(secret.get("data").is_none(), "{secret}");
    let default_args = container_args(&template(&ownership()).unwrap(), "Deployment");
    assert!(
        !default_args.iter().any(|a| a.starts_with("--tls-cert")),
        "{default_args:?}"
    );
    let configmap = find("ConfigMap");
    assert_eq!(
        configmap["metadata"]["annotations"]["statusguard.dev/registration"],
        "enabled"
    );
    let document = configmap["data"]["ownership.yaml"].as_str().unwrap();
    statusguard::ownership::Ownership::from_yaml(document).expect("the chart renders a valid ownership document");

    // The pre-delete hook unregisters.
    let job = find("Job");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
    let hook_args = container_args(&template(&ownership()).unwrap(), "Job");
    assert_eq!(
        &hook_args[..3],
        [
            "unregister",
            "--name=sg-statusguard-statusguard-system",
            "--configmap=statusguard-system/sg-statusguard-ownership"
        ]
    );

    let deployment = find("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    // The server reloads its own certificates: nothing rolls the pods for them.
    assert!(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/certificate"].is_null());
}

/// Issue 14: a rollout without a window. preStop sleeps before SIGTERM, the
/// server keeps answering for the shutdown delay, then drains; the grace
/// period covers all three; a startupProbe guards the slow start.
#[test]
fn pods_stop_without_a_window_and_start_under_a_startup_probe() {
    let manifests = template(&ownership()).unwrap();
    let args = container_args(&manifests, "Deployment");
    assert!(args.iter().any(|a| a == "--shutdown-delay=5s"), "{args:?}");
    assert!(args.iter().any(|a| a == "--shutdown-timeout=25s"), "{args:?}");
    let docs = documents(&manifests);
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["lifecycle"]["preStop"], json!({"sleep": {"seconds": 5}}));
    assert_eq!(container["startupProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(pod["terminationGracePeriodSeconds"], 45);
    let tuned = template(&format!(
        "{}shutdown: {{preStopSleepSeconds: 0, delay: 10s, drainTimeout: 20s}}\n",
        ownership()
    ))
    .unwrap();
    let args = container_args(&tuned, "Deployment");
    assert!(args.iter().any(|a| a == "--shutdown-delay=10s"), "{args:?}");
    let docs = documents(&tuned);
    let container =
        &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]["containers"][0];
    assert!(container["lifecycle"].is_null(), "no preStop hook with 0 s");
    let chart_yaml: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap()).unwrap();
    assert_eq!(chart_yaml["kubeVersion"], ">=1.30.0-0");
}

/// `networkPolicy.metricsFrom: []` admits nobody to the admin port, as its
/// comment says; the default admits the namespace's pods.
#[test]
fn an_empty_metrics_from_admits_nobody() {
    let ingress = |values: &str| {
        let docs = documents(&template(values).unwrap());
        docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap()["spec"]["ingress"].clone()
    };
    let nobody = ingress("networkPolicy: {enabled: true, metricsFrom: []}\n");
    assert_eq!(nobody.as_array().unwrap().len(), 1, "{nobody}");
    assert_eq!(nobody[0]["ports"], json!([{"port": "webhook"}]));
    let default = ingress("networkPolicy: {enabled: true}\n");
    assert_eq!(default[1]["ports"], json!([{"port": "admin"}]));
    assert_eq!(default[1]["from"], json!([{"podSelector": {}}]));
}

/// Issue 14's knobs: each renders where it should.
#[test]
fn the_platform_knobs_render() {
    let values = format!(
        "{}nameOverride: guard\npriorityClassName: system-cluster-critical\nimage: {{digest: \"sha256:{}\"}}\ntopologySpreadConstraints:\n  - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}}\npodSecurityContext: {{runAsUser: null, runAsGroup: null}}\ncontainerSecurityContext: {{readOnlyRootFilesystem: false}}\nwebhook: {{objectSelector: {{matchLabels: {{guard: \"yes\"}}}}, annotations: {{admissions.enforcer/disabled: \"true\"}}, labels: {{team: platform}}}}\n",
        ownership(),
        "a".repeat(64)
    );
    let manifests = template(&values).unwrap();
    let docs = documents(&manifests);
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let deployment = find("Deployment");
    assert_eq!(deployment["metadata"]["name"], "sg-guard");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        format!("statusguard/statusguard@sha256:{}", "a".repeat(64))
    );
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    // OpenShift's restricted-v2 assigns the UID: the chart's is removed with null.
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert_eq!(pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"], false);
    let args = container_args(&manifests, "Deployment");
    assert!(
        args.iter()
            .any(|a| a == r#"--webhook-object-selector={"matchLabels":{"guard":"yes"}}"#),
        "{args:?}"
    );
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        let configuration = find(kind);
        assert_eq!(
            configuration["metadata"]["annotations"]["admissions.enforcer/disabled"],
            "true"
        );
        assert_eq!(configuration["metadata"]["labels"]["team"], "platform");
    }
    let full = documents(&template("fullnameOverride: webhook-guard\n").unwrap());
    assert!(
        full.iter()
            .any(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "webhook-guard")
    );
    // Listening: dual stack on the default ports; an address, ports and
    // the host's network when asked.
    let args = container_args(&template(&ownership()).unwrap(), "Deployment");
    assert!(args.contains(&"--listen=[::]:8443".to_owned()), "{args:?}");
    assert!(args.contains(&"--admin-listen=[::]:8080".to_owned()), "{args:?}");
    let host = template(&format!(
        "{}listenAddress: 0.0.0.0\nports: {{webhook: 10250, admin: 10251}}\nhostNetwork: true\n",
        ownership()
    ))
    .unwrap();
    let args = container_args(&host, "Deployment");
    assert!(args.contains(&"--listen=0.0.0.0:10250".to_owned()), "{args:?}");
    assert!(args.contains(&"--admin-listen=0.0.0.0:10251".to_owned()), "{args:?}");
    let docs = documents(&host);
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(
        pod["containers"][0]["ports"],
        json!([{"name": "webhook", "containerPort": 10250}, {"name": "admin", "containerPort": 10251}])
    );
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_array(),
        "replicas on the host's network need distinct nodes: {}",
        pod["affinity"]
    );
    let docs = documents(&template("dnsPolicy: Default\n").unwrap());
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["dnsPolicy"], "Default");
    assert!(pod.get("hostNetwork").is_none());
    // Cluster-scoped objects name the namespace: one release name in two
    // namespaces never shares them.
    let cluster_scoped = |namespace: &str| -> Vec<String> {
        documents(&template_as("sg", namespace, &ownership()).unwrap())
            .iter()
            .filter(|d| d["metadata"].get("namespace").is_none())
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let (here, there) = (cluster_scoped("team-a"), cluster_scoped("team-b"));
    assert_eq!(here.len(), 4, "{here:?}");
    assert!(here.iter().all(|name| !there.contains(name)), "{here:?} {there:?}");
    // Defaults: the hardened contexts.
    let docs = documents(&template(&ownership()).unwrap());
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
}

/// `helm test`: a pod that probes every registered webhook through the
/// Service, as the chart's ServiceAccount, and that no Service selects.
#[test]
fn helm_test_probes_the_webhooks() {
    let manifests = template(&ownership()).unwrap();
    let docs = documents(&manifests);
    let pod = docs.iter().find(|d| d["kind"] == "Pod").expect("a test pod");
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    assert_eq!(pod["spec"]["serviceAccountName"], "sg-statusguard");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert!(pod["metadata"]["labels"].get("app.kubernetes.io/name").is_none());
    assert_eq!(
        container_args(&manifests, "Pod")[..3],
        [
            "probe",
            "--name=sg-statusguard-statusguard-system",
            "--configmap=statusguard-system/sg-statusguard-ownership"
        ]
    );
    assert_eq!(container_args(&manifests, "Pod")[3], "--timeout=10s");
    // No pod of a hook carries the Service's selector labels.
    let job = docs.iter().find(|d| d["kind"] == "Job").unwrap();
    assert!(
        job["spec"]["template"]["metadata"]["labels"]
            .get("app.kubernetes.io/name")
            .is_none()
    );
    let off = template(&format!("{}tests: {{enabled: false}}\n", ownership())).unwrap();
    assert!(!documents(&off).iter().any(|d| d["kind"] == "Pod"));
}

/// `webhook.clientAuth`: the server requires the API server's client
/// certificate from a CA bundle of the user's ConfigMap or Secret, mounted
/// read-only as a whole volume (kubelet updates it; the server re-reads it),
/// and the `helm test` pod presents a certificate of its own. Off by default.
#[test]
fn client_auth_mounts_the_ca_bundle_and_passes_the_flag() {
    let pod_of = |manifests: &str, kind: &str| {
        let docs = documents(manifests);
        let object = docs.iter().find(|d| d["kind"] == kind).unwrap().clone();
        match kind {
            "Deployment" => object["spec"]["template"]["spec"].clone(),
            _ => object["spec"].clone(),
        }
    };
    let defaults = template(&ownership()).unwrap();
    let args = container_args(&defaults, "Deployment");
    assert!(!args.iter().any(|a| a.starts_with("--client-ca-file")), "{args:?}");
    assert!(
        pod_of(&defaults, "Deployment").get("volumes").is_none(),
        "server mode, no client CA: no volume"
    );
    assert!(
        !container_args(&defaults, "Pod")
            .iter()
            .any(|a| a.starts_with("--client-cert"))
    );

    let manifests = template(&format!("{}{CLIENT_AUTH}", ownership())).unwrap();
    let args = container_args(&manifests, "Deployment");
    assert!(
        args.contains(&"--client-ca-file=/etc/statusguard/client-ca/ca.crt".to_owned()),
        "{args:?}"
    );
    let pod = pod_of(&manifests, "Deployment");
    assert_eq!(
        pod["volumes"],
        json!([{"name": "client-ca", "configMap": {"name": "apiserver-webhook-client-ca"}}])
    );
    assert_eq!(
        pod["containers"][0]["volumeMounts"],
        json!([{"name": "client-ca", "mountPath": "/etc/statusguard/client-ca", "readOnly": true}])
    );
    let probe = pod_of(&manifests, "Pod");
    let args = container_args(&manifests, "Pod");
    assert!(
        args.contains(&"--client-cert=/etc/statusguard/probe-client/tls.crt".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--client-key=/etc/statusguard/probe-client/tls.key".to_owned()),
        "{args:?}"
    );
    assert_eq!(
        probe["volumes"],
        json!([{"name": "probe-client", "secret": {"secretName": "probe-client"}}])
    );
    assert_eq!(probe["containers"][0]["volumeMounts"][0]["readOnly"], true);

    // From a Secret, another key, beside the helm mode's serving certificate.
    let manifests = template(&format!(
        "{}certificates: {{mode: helm}}\nwebhook: {{clientAuth: {{enabled: true, caSecret: apiserver-ca, key: bundle.pem}}}}\ntests: {{enabled: false}}\n",
        ownership()
    ))
    .unwrap();
    let args = container_args(&manifests, "Deployment");
    assert!(
        args.contains(&"--client-ca-file=/etc/statusguard/client-ca/bundle.pem".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--tls-cert=/etc/statusguard/tls/tls.crt".to_owned()),
        "{args:?}"
    );
    let pod = pod_of(&manifests, "Deployment");
    let volumes = pod["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{volumes:?}");
    assert_eq!(
        volumes[1],
        json!({"name": "client-ca", "secret": {"secretName": "apiserver-ca"}})
    );
    assert_eq!(pod["containers"][0]["volumeMounts"].as_array().unwrap().len(), 2);
}

/// GitOps renders the chart on every sync: the same values must give the
/// same manifests, or each sync would swap trust and roll the pods.
#[test]
fn the_same_values_render_the_same_manifests() {
    for values in [String::new(), ownership()] {
        assert_eq!(template(&values).unwrap(), template(&values).unwrap());
    }
    // Per-resource webhook settings are part of the document the schema accepts.
    let overrides = ownership().replace(
        "resource: gadgets",
        "resource: gadgets\n      failurePolicy: Ignore\n      timeoutSeconds: 10",
    );
    let configmap = documents(&template(&overrides).unwrap())
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap")
        .unwrap();
    let rules =
        statusguard::ownership::Ownership::from_yaml(configmap["data"]["ownership.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        rules.resource("example.com", "gadgets").unwrap().timeout_seconds,
        Some(10)
    );
}

/// helm mode puts the host of webhook.url in the certificate it generates.
#[test]
fn helm_mode_certificates_name_the_webhook_url_host() {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    for (url, name) in [
        ("https://10.0.0.5:9443", "10.0.0.5"),
        ("https://hook.example.com", "hook.example.com"),
    ] {
        let values = format!("certificates: {{mode: helm}}\nwebhook: {{url: \"{url}\"}}\n");
        let docs = documents(&template(&values).unwrap());
        let secret = docs.iter().find(|d| d["kind"] == "Secret").unwrap();
        use base64::Engine as _;
        let decode = |key: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(secret["data"][key].as_str().unwrap())
                .unwrap()
        };
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&decode("ca.crt")).unwrap())
            .unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            statusguard::cluster::certs::tls::crypto_provider(),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(&decode("tls.crt")).unwrap();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        use rustls::client::danger::ServerCertVerifier as _;
        verifier
            .verify_server_cert(&leaf, &[], &server_name, &[], rustls::pki_types::UnixTime::now())
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// cert-manager mode: a CA of the release's own signs the serving
/// certificate (so renewals keep the trusted CA), or an issuer of the user's.
#[test]
fn cert_manager_mode_issues_from_a_ca() {
    let certificates = |values: &str| {
        documents(&template(values).unwrap())
            .into_iter()
            .filter(|d| d["kind"] == "Certificate" || d["kind"] == "Issuer")
            .map(|d| {
                (
                    d["kind"].as_str().unwrap().to_owned(),
                    d["metadata"]["name"].as_str().unwrap().to_owned(),
                    d["spec"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let own = certificates("certificates: {mode: certManager}\n");
    let ca = own
        .iter()
        .find(|(k, n, _)| k == "Certificate" && n == "sg-statusguard-ca")
        .unwrap();
    assert_eq!(ca.2["isCA"], true);
    let leaf = own
        .iter()
        .find(|(k, n, _)| k == "Certificate" && n == "sg-statusguard")
        .unwrap();
    assert_eq!(
        leaf.2["issuerRef"],
        json!({"kind": "Issuer", "name": "sg-statusguard-ca"})
    );
    assert!(own.iter().any(|(k, n, spec)| k == "Issuer"
        && n == "sg-statusguard-ca"
        && spec["ca"]["secretName"] == "sg-statusguard-ca"));
    // webhook.url's host is in the serving certificate.
    let with_url = certificates("certificates: {mode: certManager}\nwebhook: {url: \"https://10.0.0.5:9443\"}\n");
    let leaf = with_url
        .iter()
        .find(|(k, n, _)| k == "Certificate" && n == "sg-statusguard")
        .unwrap();
    assert_eq!(leaf.2["ipAddresses"], json!(["10.0.0.5"]));
    let theirs = certificates(
        "certificates: {mode: certManager, certManager: {issuerRef: {kind: ClusterIssuer, name: corp-ca}}}\n",
    );
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(
        theirs[0].2["issuerRef"],
        json!({"kind": "ClusterIssuer", "name": "corp-ca"})
    );
    // existingSecret: the CA as PEM or as base64 of PEM, alike.
    let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
    use base64::Engine as _;
    for ca_bundle in [pem.to_owned(), base64::engine::general_purpose::STANDARD.encode(pem)] {
        let values = format!(
            "certificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: {}}}\n",
            json!(ca_bundle)
        );
        let docs = documents(&template(&values).unwrap());
        let ca = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "sg-statusguard-ca")
            .unwrap();
        assert_eq!(ca["data"]["ca.crt"].as_str().unwrap().trim(), pem);
    }
}

/// The bounds on what a caller can make a pod hold, passed as flags; by
/// default below the pod's memory limit.
#[test]
fn the_limits_render_as_flags() {
    let args = container_args(&template(&ownership()).unwrap(), "Deployment");
    for expected in [
        "--max-body-bytes=8388608",
        "--max-inflight-bytes=33554432",
        "--max-inflight-requests=256",
        "--max-connections=512",
        "--header-read-timeout=10s",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} not in {args:?}");
    }
    let values = format!(
        "{}limits: {{maxBodyBytes: 16777216, maxInflightBytes: 67108864, maxInflightRequests: 64, maxConnections: 128, headerReadTimeout: 5s}}\n",
        ownership()
    );
    let args = container_args(&template(&values).unwrap(), "Deployment");
    for expected in [
        "--max-body-bytes=16777216",
        "--max-inflight-bytes=67108864",
        "--max-inflight-requests=64",
        "--max-connections=128",
        "--header-read-timeout=5s",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} not in {args:?}");
    }
    for bad in [
        "limits: {maxConnections: 0}\n",
        "limits: {headerReadTimeout: soon}\n",
        "limits: {maxBodies: 1}\n",
    ] {
        let err = template(&format!("{}{bad}", ownership())).unwrap_err();
        assert!(err.contains("limits"), "{bad}: {err}");
    }
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
            "a namespace that is not a DNS label",
            "webhook: {excludeNamespaces: [Kube_System]}\n".to_owned(),
            "excludeNamespaces",
        ),
        (
            "a label key with a space",
            "webhook: {optOutLabel: \"opt out\"}\n".to_owned(),
            "optOutLabel",
        ),
        (
            "an IP that is not one",
            "certificates: {extraIPs: [10.0.0.300]}\n".to_owned(),
            "extraIPs",
        ),
        (
            "a DNS name with a space",
            "certificates: {extraDNSNames: [\"a b\"]}\n".to_owned(),
            "extraDNSNames",
        ),
        (
            "a CA bundle that is neither PEM nor base64",
            "certificates: {mode: existingSecret, existingSecret: x, caBundle: \"not*base64\"}\n".to_owned(),
            "caBundle",
        ),
        (
            "a resource timeout beyond the API server's 30 s",
            ownership().replace("resource: gadgets", "resource: gadgets\n      timeoutSeconds: 31"),
            "timeoutSeconds",
        ),
        (
            "client certificates without a CA",
            "webhook: {clientAuth: {enabled: true}}\ntests: {enabled: false}\n".to_owned(),
            "clientAuth",
        ),
        (
            "client certificates from a ConfigMap and a Secret at once",
            "webhook: {clientAuth: {enabled: true, caConfigMap: a, caSecret: b}}\ntests: {enabled: false}\n".to_owned(),
            "clientAuth",
        ),
        (
            "client certificates and a helm test without one",
            "webhook: {clientAuth: {enabled: true, caConfigMap: a}}\n".to_owned(),
            "clientCertSecret",
        ),
        (
            "a client CA key that is a path",
            "webhook: {clientAuth: {enabled: true, caConfigMap: a, key: ../ca.crt}}\ntests: {enabled: false}\n"
                .to_owned(),
            "key",
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
            // The schema's message, never a template's stack trace.
            Err(e) => assert!(e.contains(phrase) && !e.contains("executing"), "{what}: {e}"),
        }
    }
}

/// CRDs of the optional integrations, so that the API server can accept
/// their objects: prometheus-operator's ServiceMonitor, PodMonitor and PrometheusRule and cert-manager's
/// Issuer and Certificate (schemas kept open; the real ones are stricter).
async fn integration_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (group, kind, plural) in [
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("monitoring.coreos.com", "PodMonitor", "podmonitors"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
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
    let release = Release::new(home.path(), "sg", RELEASE_NAMESPACE, &cluster.kubeconfig);
    // Uninstalled by hand below, as a user would; the guard is for a failure before that.
    let _uninstall = release.uninstall_on_drop();
    release.install(&values(example));

    // Run the server as the chart's pod would: its arguments, its
    // ServiceAccount (with only the chart's RBAC), its Secret's files.
    let secrets: Api<Secret> = Api::namespaced(s.admin.clone(), RELEASE_NAMESPACE);
    let kubeconfig = cluster
        .service_account_kubeconfig(RELEASE_NAMESPACE, "sg-statusguard")
        .await;
    let args = release.server_args(home.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // `helm test` before any server runs: the document guards widgets, and
    // nothing is registered.
    let (passed, said) = release.run_test_hook(&kubeconfig, &[]);
    assert!(!passed && said.contains("has no webhook"), "{said}");
    let server = BinaryServer::start_on(port, home.path(), &args, &[("KUBECONFIG", &kubeconfig)]).await;
    server.wait_ready().await;
    // The server keeps its certificates in the chart's (empty) Secret.
    let data = secrets.get("sg-statusguard-tls").await.unwrap().data;
    assert!(data.as_ref().is_some_and(|d| d.contains_key("tls.crt")), "{data:?}");
    // The server registers itself: helm rendered no webhook configuration.
    s.wait_until_called(&["endpoint=\"validate\""], || server.metrics())
        .await;
    let (passed, said) = release.run_test_hook(&kubeconfig, &[]);
    assert!(passed, "{said}");
    assert!(
        said.contains(&format!("at https://127.0.0.1:{port}/validate: allowed")),
        "{said}"
    );

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
    release.upgrade(&values(&moved));
    let kept = secrets.get("sg-statusguard-tls").await.unwrap().data;
    assert_eq!(kept, data, "the server's certificates are kept across upgrades");
    s.wait_until_writable(
        &s.scaler,
        "w",
        10,
        Duration::from_secs(30),
        "the upgrade's ownership is in force",
    )
    .await;
    let mut server = server;
    assert!(
        server.process.0.try_wait().unwrap().is_none(),
        "the server was not restarted"
    );

    // helm uninstall: its pre-delete hook removes the webhook configurations
    // while the server still runs, and stands it down. There is no kubelet
    // here to run the hook's Job, so the test runs its container's command
    // as the chart's ServiceAccount, then uninstalls without hooks.
    let said = release.run_pre_delete_hook(&kubeconfig);
    assert!(
        said.contains("deleted ValidatingWebhookConfiguration sg-statusguard-statusguard-system"),
        "{said}"
    );
    release.helm(&["uninstall", "sg", "-n", RELEASE_NAMESPACE, "--no-hooks"]);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(s.admin.clone());
    assert!(validating.get_opt(WEBHOOKS).await.unwrap().is_none());
    assert!(mutating.get_opt(WEBHOOKS).await.unwrap().is_none());
    assert!(
        server
            .metrics()
            .await
            .contains("statusguard_webhook_syncs_total{result=\"stood_down\"} 1"),
        "the running server stood down"
    );
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
    let _ = server.process.0.kill();
}

// Issue 23, sections 5 to 7: what a GitOps sync, a long release name, a
// switched mode or an operator's usual knobs did to the chart.

/// The object of `kind` named `name` in the manifests.
fn object(manifests: &str, kind: &str, name: &str) -> Value {
    documents(manifests)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The pod spec of the first object of `kind` (Deployment, Job, Pod).
fn pod_spec(manifests: &str, kind: &str) -> Value {
    let docs = documents(manifests);
    let object = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    match kind {
        "Pod" => object["spec"].clone(),
        _ => object["spec"]["template"]["spec"].clone(),
    }
}

/// system-cluster-critical is admitted only in kube-system unless a
/// ResourceQuota allows it (GKE refuses it): by default no pod of the chart
/// names a priority class; one of yours reaches the server and the hook.
#[test]
fn no_priority_class_unless_one_is_set() {
    let defaults = template(&ownership()).unwrap();
    for kind in ["Deployment", "Job", "Pod"] {
        let pod = pod_spec(&defaults, kind);
        assert!(pod.get("priorityClassName").is_none(), "{kind}: {pod}");
    }
    let set = template(&format!("{}priorityClassName: platform-critical\n", ownership())).unwrap();
    for kind in ["Deployment", "Job"] {
        assert_eq!(pod_spec(&set, kind)["priorityClassName"], "platform-critical", "{kind}");
    }
}

/// Helm allows release names of 53 characters; every name the chart
/// computes stays a DNS label (Services, Jobs and label values need one),
/// and a long name is cut with a hash, so two never meet. Short names are
/// unchanged (the other tests name them exactly).
#[test]
fn a_53_character_release_name_gives_names_of_63_characters_or_fewer() {
    let release = format!("r{}", "x".repeat(52));
    assert_eq!(release.len(), 53);
    let namespace = format!("n{}", "y".repeat(62));
    let modes = [
        "certificates: {mode: server}\n",
        "certificates: {mode: helm}\n",
        "certificates: {mode: certManager}\n",
        &format!("certificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: {CA_BUNDLE_BASE64}}}\n"),
    ];
    for mode in modes {
        let knobs = every_knob()
            .replace("    namespace: monitoring\n", "")
            .replace("serviceAccount:\n  create: false\n  name: platform-statusguard\n", "");
        let values = format!("{}{knobs}{mode}", ownership());
        let manifests = template_as(&release, &namespace, &values).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let docs = documents(&manifests);
        let mut names = Vec::new();
        for doc in &docs {
            let kind = doc["kind"].as_str().unwrap();
            let name = doc["metadata"]["name"].as_str().unwrap();
            assert!(name.len() <= 63, "{mode}: {kind} {name} has {} characters", name.len());
            names.push(format!("{kind}/{name}"));
            for labels in [
                &doc["metadata"]["labels"],
                &doc["spec"]["template"]["metadata"]["labels"],
            ] {
                for (key, value) in labels.as_object().into_iter().flatten() {
                    let value = value.as_str().unwrap();
                    assert!(value.len() <= 63, "{kind} {name}: label {key}={value}");
                }
            }
            if kind == "Service" {
                assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
            }
        }
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "two objects share a name: {names:?}");
        // What names an object and what refers to it still agree.
        let job = docs.iter().find(|d| d["kind"] == "Job").unwrap();
        let webhooks = docs
            .iter()
            .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
            .unwrap()["metadata"]["name"]
            .as_str()
            .unwrap();
        let args = container_args(&manifests, "Deployment");
        assert!(args.contains(&format!("--register-webhooks={webhooks}")), "{args:?}");
        let configmap = args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--configmap={namespace}/")))
            .unwrap();
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == configmap),
            "{configmap}"
        );
        let hook_args = container_args(&manifests, "Job");
        assert_eq!(hook_args[1], format!("--name={webhooks}"));
        assert_eq!(hook_args[2], format!("--configmap={namespace}/{configmap}"));
        let cluster_role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
        assert_eq!(cluster_role["rules"][0]["resourceNames"], json!([webhooks]));
        assert!(job["metadata"]["name"].as_str().unwrap().len() <= 63);
    }
}

/// A surge pod needs a node no replica holds when replicas must sit on
/// distinct nodes (hostNetwork, a required anti-affinity): with as many
/// usable nodes as replicas it never schedules and the rollout stalls. The
/// chart then replaces one pod at a time; otherwise it surges first.
#[test]
fn the_update_strategy_never_waits_for_a_node_that_does_not_exist() {
    let strategy = |values: &str| {
        let docs = documents(&template(&format!("{}{values}", ownership())).unwrap());
        docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["strategy"].clone()
    };
    let one_at_a_time = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}});
    let surge_first = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    assert_eq!(strategy(""), surge_first);
    assert_eq!(strategy("hostNetwork: true\n"), one_at_a_time);
    let required = "affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app.kubernetes.io/name: statusguard}}}]}}\n";
    assert_eq!(strategy(required), one_at_a_time);
    assert_eq!(
        strategy("updateStrategy: {type: Recreate}\n"),
        json!({"type": "Recreate"})
    );
    assert_eq!(
        strategy("hostNetwork: true\nupdateStrategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 25%}}\n"),
        json!({"rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25%"}})
    );
}

/// A Secret's type cannot change, and Helm deletes what a mode no longer
/// renders after the next mode wrote it: each mode reads a Secret of its
/// own. Server mode keeps its historical name (an upgrade keeps its CA).
#[test]
fn every_certificate_mode_reads_a_secret_of_its_own() {
    let mut seen = Vec::new();
    for (mode, secret, kind) in [
        ("server", "sg-statusguard-tls", Some("Opaque")),
        ("helm", "sg-statusguard-helm-tls", Some("kubernetes.io/tls")),
        ("certManager", "sg-statusguard-cert-manager-tls", None),
    ] {
        let manifests = template(&format!("{}certificates: {{mode: {mode}}}\n", ownership())).unwrap();
        match kind {
            Some(kind) => assert_eq!(object(&manifests, "Secret", secret)["type"], kind, "{mode}"),
            None => assert_eq!(
                object(&manifests, "Certificate", "sg-statusguard")["spec"]["secretName"],
                secret
            ),
        }
        let args = container_args(&manifests, "Deployment");
        let pod = pod_spec(&manifests, "Deployment");
        if mode == "server" {
            assert!(args.contains(&format!("--manage-certificates={RELEASE_NAMESPACE}/{secret}")));
            let role = documents(&manifests).into_iter().find(|d| d["kind"] == "Role").unwrap();
            let secret_rules: Vec<_> = role["rules"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["resources"] == json!(["secrets"]) && r.get("resourceNames").is_some())
                .collect();
            assert_eq!(secret_rules.len(), 1, "{role}");
            assert_eq!(secret_rules[0]["resourceNames"], json!([secret]));
        } else {
            assert_eq!(pod["volumes"][0]["secret"]["secretName"], secret, "{mode}");
        }
        seen.push(secret);
    }
    seen.dedup();
    assert_eq!(seen.len(), 3);
}

/// `--set webhook.excludeNamespaces={monitoring}` adds to the namespaces
/// never guarded; kube-system and the release namespace stay.
#[test]
fn excluded_namespaces_of_yours_add_to_kube_system() {
    let selector = |values: &str| {
        let args = container_args(&template(values).unwrap(), "Deployment");
        let selector = args
            .iter()
            .find_map(|a| a.strip_prefix("--webhook-namespace-selector="))
            .unwrap()
            .to_owned();
        serde_json::from_str::<Value>(&selector).unwrap()["matchExpressions"][0]["values"].clone()
    };
    assert_eq!(
        selector("webhook: {excludeNamespaces: [monitoring]}\n"),
        json!([RELEASE_NAMESPACE, "kube-system", "monitoring"])
    );
    assert_eq!(
        selector("webhook: {excludeNamespaces: [kube-system, monitoring]}\n"),
        json!([RELEASE_NAMESPACE, "kube-system", "monitoring"])
    );
    assert_eq!(selector(""), json!([RELEASE_NAMESPACE, "kube-system"]));
}

/// podLabels add to the pod's labels; the selector's own two cannot be
/// replaced (a Deployment whose template does not match its selector is
/// refused).
#[test]
fn pod_labels_cannot_replace_the_selector_labels() {
    let manifests = template("podLabels: {team: platform}\n").unwrap();
    let docs = documents(&manifests);
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["team"], "platform");
    for (key, value) in deployment["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "{key}");
    }
    for key in ["app.kubernetes.io/name", "app.kubernetes.io/instance"] {
        let err = template(&format!("podLabels: {{{key}: other}}\n")).unwrap_err();
        assert!(err.contains("podLabels") && !err.contains("executing"), "{key}: {err}");
    }
}

/// The schema refuses what the server, the API server or a template would
/// refuse later, with its own message (never a template's stack trace);
/// and it accepts issuers of other kinds than cert-manager's own.
#[test]
fn the_schema_refuses_what_would_fail_later() {
    let cases = [
        (
            "an issuerRef without a name",
            "certificates: {mode: certManager, certManager: {issuerRef: {kind: ClusterIssuer}}}\n",
            "name",
        ),
        (
            "an issuerRef with an empty kind",
            "certificates: {mode: certManager, certManager: {issuerRef: {kind: \"\", name: x}}}\n",
            "kind",
        ),
        (
            "a caBundle of broken base64",
            "certificates: {mode: existingSecret, existingSecret: x, caBundle: \"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkFBQUEK=x\"}\n",
            "caBundle",
        ),
        (
            "a caBundle of base64 that is not PEM",
            "certificates: {mode: existingSecret, existingSecret: x, caBundle: Zm9v}\n",
            "caBundle",
        ),
        (
            "an IPv6 address that is not one",
            "certificates: {mode: helm, extraIPs: [\":::\"]}\n",
            "extraIPs",
        ),
        (
            "an IPv6 address with two ::",
            "certificates: {extraIPs: [\"1::2::3\"]}\n",
            "extraIPs",
        ),
        (
            "a service account namespace with a dot",
            &ownership().replace("serviceAccount: platform/widget-scaler", "serviceAccount: team.a/x"),
            "serviceAccount",
        ),
        (
            "a PodDisruptionBudget that blocks every drain",
            "podDisruptionBudget: {maxUnavailable: 0}\n",
            "maxUnavailable",
        ),
        (
            "a PodDisruptionBudget of no number",
            "podDisruptionBudget: {maxUnavailable: one}\n",
            "maxUnavailable",
        ),
        (
            "a PodDisruptionBudget over 100%",
            "podDisruptionBudget: {maxUnavailable: 150%}\n",
            "maxUnavailable",
        ),
        (
            "a surge of no number",
            "updateStrategy: {rollingUpdate: {maxSurge: lots}}\n",
            "maxSurge",
        ),
        ("an unknown strategy", "updateStrategy: {type: BlueGreen}\n", "type"),
        (
            "a scrape interval that is no duration",
            "metrics: {service: {enabled: true}, serviceMonitor: {enabled: true, interval: often}}\n",
            "interval",
        ),
        (
            "a PodMonitor interval that is no duration",
            "metrics: {podMonitor: {enabled: true, interval: 30}}\n",
            "interval",
        ),
        (
            "a toleration operator",
            "tolerations: [{key: a, operator: Maybe}]\n",
            "operator",
        ),
        (
            "an objectSelector operator",
            "webhook: {objectSelector: {matchExpressions: [{key: a, operator: Like}]}}\n",
            "operator",
        ),
        (
            "serviceAccount.create=false without a name",
            "serviceAccount: {create: false}\n",
            "name",
        ),
        (
            "a probe threshold of 0",
            "probes: {readiness: {failureThreshold: 0}}\n",
            "failureThreshold",
        ),
        (
            "a liveness successThreshold other than 1",
            "probes: {liveness: {successThreshold: 2}}\n",
            "successThreshold",
        ),
        ("an env var without a name", "extraEnv: [{value: x}]\n", "name"),
    ];
    for (what, values, phrase) in cases {
        match template(values) {
            Ok(_) => panic!("{what}: rendered"),
            Err(e) => assert!(e.contains(phrase) && !e.contains("executing"), "{what}: {e}"),
        }
    }
    // An external issuer (cert-manager's AWS Private CA issuer, say) is an issuer too.
    let manifests = template(
        "certificates: {mode: certManager, certManager: {issuerRef: {kind: AWSPCAClusterIssuer, group: awspca.cert-manager.io, name: corp}}}\n",
    )
    .unwrap();
    assert_eq!(
        object(&manifests, "Certificate", "sg-statusguard")["spec"]["issuerRef"],
        json!({"kind": "AWSPCAClusterIssuer", "group": "awspca.cert-manager.io", "name": "corp"})
    );
    // Two monitors of the same pods.
    let err =
        template("metrics: {service: {enabled: true}, serviceMonitor: {enabled: true}, podMonitor: {enabled: true}}\n")
            .unwrap_err();
    assert!(err.contains("enable one"), "{err}");
    // A PrometheusRule whose alerts could select nothing.
    let err = template("metrics: {prometheusRule: {enabled: true}}\n").unwrap_err();
    assert!(err.contains("metrics.prometheusRule.enabled needs"), "{err}");
}

/// Issue 23's knobs, all at once (ci/every-knob-values.yaml): each lands
/// where it should.
#[test]
fn the_operator_knobs_render() {
    let manifests = template(&format!("{}{}", ownership(), every_knob())).unwrap();
    let docs = documents(&manifests);
    // serviceAccount.create=false: none rendered, yours bound and used.
    assert!(!docs.iter().any(|d| d["kind"] == "ServiceAccount"));
    for kind in ["RoleBinding", "ClusterRoleBinding"] {
        let binding = docs.iter().find(|d| d["kind"] == kind).unwrap();
        assert_eq!(binding["subjects"][0]["name"], "platform-statusguard", "{kind}");
    }
    for kind in ["Deployment", "Job", "Pod"] {
        let pod = pod_spec(&manifests, kind);
        assert_eq!(pod["serviceAccountName"], "platform-statusguard", "{kind}");
        assert_eq!(pod["nodeSelector"]["node-role.example.com/platform"], "true", "{kind}");
        assert_eq!(pod["tolerations"][0]["key"], "dedicated", "{kind}");
    }
    let pod = pod_spec(&manifests, "Deployment");
    let container = &pod["containers"][0];
    assert_eq!(container["env"][0]["name"], "POD_NAME");
    assert_eq!(
        container["env"][1],
        json!({"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"})
    );
    assert_eq!(
        container["env"][2]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "scratch", "emptyDir": {"sizeLimit": "16Mi"}}])
    );
    assert_eq!(
        container["volumeMounts"],
        json!([{"name": "scratch", "mountPath": "/scratch"}])
    );
    assert_eq!(
        container["startupProbe"],
        json!({"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 5, "failureThreshold": 30})
    );
    assert_eq!(container["livenessProbe"]["periodSeconds"], 20);
    assert_eq!(container["livenessProbe"]["timeoutSeconds"], 2);
    assert_eq!(container["readinessProbe"]["failureThreshold"], 2);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for kind in ["Job", "Pod"] {
        assert_eq!(
            pod_spec(&manifests, kind)["containers"][0]["resources"],
            json!({"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "96Mi"}}),
            "{kind}"
        );
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["template"]["metadata"]["labels"]["team"], "platform");
    // Monitoring: a PodMonitor on the admin port, the alerts, the dashboard.
    let monitor = object(&manifests, "PodMonitor", "sg-statusguard");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"],
        json!([{"port": "admin", "path": "/metrics", "interval": "1m", "scrapeTimeout": "20s"}])
    );
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let rule = object(&manifests, "PrometheusRule", "sg-statusguard");
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    for alert in [
        "StatusguardDown",
        "StatusguardRulesStale",
        "StatusguardCertificateExpiry",
        "StatusguardDenialSpike",
        "StatusguardSlowReviews",
    ] {
        assert!(alerts.contains(&alert), "{alert} not in {alerts:?}");
    }
    let dashboard = object(&manifests, "ConfigMap", "sg-statusguard-dashboard");
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(dashboard["metadata"]["annotations"]["grafana_folder"], "statusguard");
    let json: Value = serde_json::from_str(dashboard["data"]["statusguard.json"].as_str().unwrap()).unwrap();
    assert_eq!(json["uid"], "statusguard");
    // Off by default, and a Linux node by default.
    let defaults = template(&ownership()).unwrap();
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert!(!kinds(&defaults).iter().any(|k| k == kind), "{kind}");
    }
    assert!(
        !documents(&defaults)
            .iter()
            .any(|d| d["metadata"]["name"] == "sg-statusguard-dashboard")
    );
    for kind in ["Deployment", "Job", "Pod"] {
        assert_eq!(
            pod_spec(&defaults, kind)["nodeSelector"],
            json!({"kubernetes.io/os": "linux"}),
            "{kind}"
        );
    }
    let pod = pod_spec(&defaults, "Deployment");
    assert_eq!(
        pod["containers"][0]["startupProbe"],
        json!({"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 2, "failureThreshold": 60})
    );
    assert_eq!(
        pod_spec(&defaults, "Job")["containers"][0]["resources"],
        json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}})
    );
    assert!(kinds(&defaults).iter().any(|k| k == "ServiceAccount"));
}

/// Every `statusguard_*` series the alerts and the dashboard query is one
/// the server exports: counters with `_total`, histograms with `_bucket`.
/// A family is exposed once it has a series, so each is recorded once
/// here; violations are recorded only with a decision, so one stale write
/// is answered by the real admission router (src/metrics.rs's own test
/// checks the violation's labels).
#[tokio::test]
async fn the_alerts_and_the_dashboard_query_metrics_the_server_exports() {
    use tower::ServiceExt as _;
    let metrics = std::sync::Arc::new(statusguard::metrics::Metrics::default());
    let (app, _observer) = statusguard::server::state::App::new(
        metrics.clone(),
        statusguard::server::limits::Limits::default(),
        Default::default(),
    );
    app.rules
        .replace(statusguard::rules::RulesSource::Embedded.load_local().unwrap());
    // The scaler rolls back the controller's observedGeneration: denied, one violation.
    let widget = |generation: u64| {
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1", "namespace": "shop"},
               "status": {"observedGeneration": generation}})
    };
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
        "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
        "subResource": "status", "name": "w1", "namespace": "shop", "operation": "UPDATE",
        "userInfo": {"username": "system:serviceaccount:platform:widget-scaler"},
        "object": widget(1), "oldObject": widget(2),
    }});
    let request = axum::http::Request::post("/validate")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .unwrap();
    let response = statusguard::server::http::admission::router(app, None)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), axum::http::StatusCode::OK);
    metrics.error(
        statusguard::admission::decide::Endpoint::Validate,
        Duration::from_millis(1),
    );
    metrics.refused_before_reading(&statusguard::server::limits::AdmitError::TooLarge { limit: 1 });
    metrics.rules_loaded(1);
    metrics.rules_rejected("invalid");
    metrics.tls_reload(false);
    metrics.webhook_sync(statusguard::metrics::WebhookSync::Applied(1));
    metrics.serving_certificate_expiry(Some(1));
    metrics.observed("example.com", "widgets", "someone");
    metrics.observation_skipped("rate");
    metrics.event("StatusRollbackDenied", "sent");
    let exposition = metrics.encode();
    let mut exported = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                exported.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                exported.insert(name.to_owned());
            }
        }
    }
    for recorded in ["statusguard_admission_requests_total", "statusguard_violations_total"] {
        assert!(exported.contains(recorded), "{recorded}: {exported:?}");
    }
    let queried = |text: &str| -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("statusguard_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
        names
    };
    let manifests = template(&format!(
        "{}metrics: {{podMonitor: {{enabled: true}}, prometheusRule: {{enabled: true}}, dashboard: {{enabled: true}}}}\n",
        ownership()
    ))
    .unwrap();
    let rule = object(&manifests, "PrometheusRule", "sg-statusguard");
    let mut exprs = String::new();
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        exprs.push_str(r["expr"].as_str().unwrap());
        exprs.push('\n');
    }
    let dashboard = object(&manifests, "ConfigMap", "sg-statusguard-dashboard");
    let dashboard = dashboard["data"]["statusguard.json"].as_str().unwrap();
    for (what, text) in [("the alerts", exprs.as_str()), ("the dashboard", dashboard)] {
        let names = queried(text);
        assert!(names.len() >= 5, "{what}: {names:?}");
        for name in names {
            assert!(
                exported.contains(&name),
                "{what} query {name}, which the server does not export"
            );
        }
    }
}

/// With a NetworkPolicy and a ServiceMonitor or PodMonitor, Prometheus (in
/// a namespace of its own) may scrape the admin port by default; without a
/// monitor the default stays the release namespace; a metricsFrom of yours
/// (also []) is used as given.
#[test]
fn a_monitored_release_admits_prometheus_from_another_namespace() {
    let admin_from = |values: &str| {
        let docs = documents(&template(values).unwrap());
        let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
        policy["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .find(|rule| rule["ports"] == json!([{"port": "admin"}]))
            .map(|rule| rule["from"].clone())
    };
    let anywhere = Some(json!([{"namespaceSelector": {}}]));
    assert_eq!(
        admin_from(
            "networkPolicy: {enabled: true}\nmetrics: {service: {enabled: true}, serviceMonitor: {enabled: true}}\n"
        ),
        anywhere
    );
    assert_eq!(
        admin_from("networkPolicy: {enabled: true}\nmetrics: {podMonitor: {enabled: true}}\n"),
        anywhere
    );
    assert_eq!(
        admin_from("networkPolicy: {enabled: true}\n"),
        Some(json!([{"podSelector": {}}]))
    );
    let monitoring = "[{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]";
    assert_eq!(
        admin_from(&format!(
            "networkPolicy: {{enabled: true, metricsFrom: {monitoring}}}\nmetrics: {{podMonitor: {{enabled: true}}}}\n"
        )),
        Some(json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]))
    );
    assert_eq!(
        admin_from("networkPolicy: {enabled: true, metricsFrom: []}\nmetrics: {podMonitor: {enabled: true}}\n"),
        None
    );
}

/// Issue 23, section 5: helm mode makes its CA with `lookup`, which finds
/// nothing outside a live install, so `helm template` (Argo CD) renders new
/// key material every time. Decided: not for GitOps, and said so where a
/// user chooses the mode; server mode (the default) renders no key material.
#[test]
fn helm_mode_is_documented_as_not_for_gitops_because_each_render_rekeys() {
    let secret = |values: &str| -> Value {
        let docs = documents(&template(values).unwrap());
        docs.into_iter().find(|d| d["kind"] == "Secret").unwrap()
    };
    let helm = "certificates: {mode: helm}\n";
    assert_ne!(
        secret(helm)["data"]["ca.crt"],
        secret(helm)["data"]["ca.crt"],
        "helm mode rendered the same CA twice: if it is stable now, say so in values.yaml and the README"
    );
    assert_eq!(secret("")["data"], Value::Null);
    assert_eq!(template("").unwrap(), template("").unwrap());
    let values = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let readme = std::fs::read_to_string(chart().join("README.md")).unwrap();
    for (what, text) in [("values.yaml", values), ("README.md", readme)] {
        assert!(text.contains("Not for GitOps"), "{what} does not warn about helm mode");
    }
}

/// `replicas: 1` is allowed (a test cluster), but the NOTES say what it
/// costs: no pod through a rollout, a drain or a crash, which the
/// PodDisruptionBudget cannot prevent.
#[test]
fn a_single_replica_is_warned_about() {
    let cluster = Cluster::shared();
    let home = tempfile::tempdir().unwrap();
    let notes = |values: &str| {
        let file = home.path().join("values.yaml");
        std::fs::write(&file, values).unwrap();
        let output = helm(home.path())
            .args(["install", "single", "--dry-run=client", "-n", "statusguard-notes"])
            .arg(chart())
            .arg("-f")
            .arg(&file)
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let out = String::from_utf8_lossy(&output.stdout).into_owned();
        out[out.find("NOTES:").expect("NOTES in the output")..].to_owned()
    };
    let single = notes("replicas: 1\n");
    assert!(single.contains("WARNING: replicas: 1"), "{single}");
    assert!(single.contains("every guarded status write is refused"), "{single}");
    assert!(single.contains("PodDisruptionBudget cannot keep a replica"), "{single}");
    let two = notes("");
    assert!(!two.contains("WARNING"), "{two}");
}

/// Switching certificates.mode with `helm upgrade` used to fail with
/// "Secret type: field is immutable" (server mode's Opaque Secret and helm
/// mode's kubernetes.io/tls one shared a name). Every switch now upgrades.
#[tokio::test]
async fn certificates_mode_can_be_switched_with_helm_upgrade() {
    let cluster = Cluster::shared();
    let client = cluster.admin().await;
    integration_crds(&client).await;
    let home = tempfile::tempdir().unwrap();
    let release = Release::new(home.path(), "modes", "statusguard-modes", &cluster.kubeconfig);
    let _uninstall = release.uninstall_on_drop();
    let mode = |mode: &str| format!("{}certificates: {{mode: {mode}}}\n", ownership());
    release.install(&mode("server"));
    for next in ["helm", "server", "certManager", "helm", "certManager", "server"] {
        release.upgrade(&mode(next));
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "statusguard-modes");
    assert!(secrets.get_opt("modes-statusguard-tls").await.unwrap().is_some());
    assert!(secrets.get_opt("modes-statusguard-helm-tls").await.unwrap().is_none());
}
