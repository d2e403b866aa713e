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
                "{}certificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: Zm9v}}\n",
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
    ]
}

/// `webhook.clientAuth` from a ConfigMap, and the `helm test` pod's certificate.
const CLIENT_AUTH: &str = "webhook: {clientAuth: {enabled: true, caConfigMap: apiserver-webhook-client-ca}}\ntests: {clientCertSecret: probe-client}\n";

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
        "{}webhook: {{url: \"https://127.0.0.1:9443\", failurePolicy: Ignore}}\ncertificates: {{mode: existingSecret, existingSecret: my-tls, caBundle: Zm9v}}\n",
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
    assert_eq!(ca["data"]["ca.crt"].as_str().unwrap().trim(), "foo");

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
    assert_eq!(role["rules"][0]["resourceNames"], json!(["sg-statusguard-ownership"]));
    assert_eq!(
        role["rules"][1],
        json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["sg-statusguard-tls"], "verbs": ["get", "update"]})
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
        "{}nameOverride: guard\nimage: {{digest: \"sha256:{}\"}}\ntopologySpreadConstraints:\n  - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}}\npodSecurityContext: {{runAsUser: null, runAsGroup: null}}\ncontainerSecurityContext: {{readOnlyRootFilesystem: false}}\nwebhook: {{objectSelector: {{matchLabels: {{guard: \"yes\"}}}}, annotations: {{admissions.enforcer/disabled: \"true\"}}, labels: {{team: platform}}}}\n",
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
            statusguard::tls::crypto_provider(),
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
    let release = Release::new(home.path(), "sg", RELEASE_NAMESPACE, &cluster.kubeconfig);
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
