//! Authenticated callers end to end: kube-apiserver configured as in the
//! Kubernetes documentation ("Dynamic Admission Control" → "Authenticate API
//! servers"), an AdmissionConfiguration whose webhook plugins name a
//! kubeconfig holding a client certificate for the webhook's host:port, and
//! statusguard with `--client-ca-file` trusting its CA.

mod support;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use statusguard::rules::RulesSource;
use support::cluster::{self, Cluster};
use support::mtls::{ClientIdentity, connector, exchange, refusal};
use support::scenario::Scenario;
use support::wait::retry_until;
use support::webhook::{RunningServer, config, files, free_port, write_pair};

/// What kube-apiserver is told before it starts: the client certificate it
/// presents, and the one webhook address it presents it to.
struct ApiServerSide {
    /// The API server's webhook client certificate, and the CA statusguard trusts.
    identity: ClientIdentity,
    /// The port of the statusguard that the kubeconfig names (127.0.0.1:PORT).
    webhook_port: u16,
}

fn apiserver_side() -> &'static ApiServerSide {
    static SIDE: OnceLock<ApiServerSide> = OnceLock::new();
    SIDE.get_or_init(|| ApiServerSide {
        identity: ClientIdentity::new("kube-apiserver webhook client"),
        webhook_port: free_port(),
    })
}

/// The AdmissionConfiguration of the documentation, for both webhook plugins.
fn admission_configuration(kubeconfig: &Path) -> String {
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
        plugin("ValidatingAdmissionWebhook"),
        plugin("MutatingAdmissionWebhook")
    )
}

/// The kubeconfig the AdmissionConfiguration names: a `users` entry per
/// webhook, named by the host:port of its URL (for a Service:
/// `NAME.NAMESPACE.svc:PORT`, or without `:443`).
fn webhook_kubeconfig(side: &ApiServerSide) -> String {
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: \"127.0.0.1:{}\"\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        side.webhook_port,
        b64(&side.identity.cert_pem),
        b64(&side.identity.key_pem)
    )
}

fn setup(dir: &Path) -> Result<Vec<String>, String> {
    let side = apiserver_side();
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok::<_, String>(path)
    };
    let kubeconfig = write("webhook-client.kubeconfig", webhook_kubeconfig(side))?;
    let admission = write("admission.yaml", admission_configuration(&kubeconfig))?;
    Ok(vec![format!("--admission-control-config-file={}", admission.display())])
}

async fn scenario(test: &str) -> Scenario {
    Scenario::on(Cluster::shared_with(setup), test).await
}

fn initial_status() -> Value {
    json!({"observedGeneration": 1, "replicas": 3,
           "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
                           "lastTransitionTime": "2026-12-01T10:00:00Z"}]})
}

/// statusguard on `port` with the example document, trusting `client_ca_pem`
/// for callers; returns it, its folder and the CA of its serving certificate.
async fn authenticating_server(port: u16, client_ca_pem: &str) -> (RunningServer, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let client_ca = dir.path().join("client-ca.crt");
    std::fs::write(&client_ca, client_ca_pem).unwrap();
    let mut config = config(RulesSource::Embedded, Some(files(dir.path())));
    config.listen = ([127, 0, 0, 1], port).into();
    config.client_ca_file = Some(client_ca);
    (RunningServer::start(config).await, dir, certs.ca_pem)
}

#[tokio::test]
async fn the_api_servers_calls_are_answered_and_callers_without_its_certificate_are_refused() {
    let side = apiserver_side();
    let s = scenario("e2e-mtls").await;
    let (server, _dir, server_ca) = authenticating_server(side.webhook_port, &side.identity.ca_pem).await;
    // Waits until the API server's calls are counted: they get through.
    s.register(&server, &server_ca, false).await;
    s.create_widget("w", initial_status()).await;

    let retry = s.stale_retry("w").await;
    assert_eq!(
        retry.code, 409,
        "statusguard denied the stale rollback: {:?}",
        retry.body
    );
    assert!(
        retry
            .message()
            .contains("status.observedGeneration (owned by system:serviceaccount:platform:widget-controller)"),
        "{}",
        retry.message()
    );
    let mut fresh = s.get(&s.scaler, "w").await;
    fresh["status"]["replicas"] = json!(5);
    let own = s.put_status(&s.scaler, &fresh).await;
    assert_eq!(own.code, 200, "the writer's own write passes: {:?}", own.body);
    assert_eq!(s.get(&s.admin, "w").await["status"]["replicas"], 5);

    // Direct callers of the webhook port.
    let review = std::fs::read(support::webhook::example("stale-rollback-review.json")).unwrap();
    let call = |identity: Option<&ClientIdentity>| {
        let connector = connector(&server_ca, identity, rustls::DEFAULT_VERSIONS);
        let review = review.clone();
        async move { exchange(server.tls, &connector, "/validate", &review).await }
    };
    assert!(call(None).await.is_err(), "no certificate: answered");
    let refused = refusal(server.tls, &connector(&server_ca, None, rustls::DEFAULT_VERSIONS)).await;
    assert!(
        matches!(&refused, Some(e) if e.contains("CertificateRequired")),
        "no certificate: {refused:?}"
    );
    let stranger = ClientIdentity::new("stranger");
    assert!(
        call(Some(&stranger)).await.is_err(),
        "another CA's certificate: answered"
    );
    let refused = refusal(
        server.tls,
        &connector(&server_ca, Some(&stranger), rustls::DEFAULT_VERSIONS),
    )
    .await;
    assert!(
        matches!(&refused, Some(e) if e.contains("UnknownCA")),
        "another CA's certificate: {refused:?}"
    );
    let same_as_apiserver = call(Some(&side.identity)).await;
    assert!(
        matches!(&same_as_apiserver, Ok(answer) if answer.contains("\"code\":409")),
        "{same_as_apiserver:?}"
    );

    // `statusguard probe` (the chart's `helm test`) needs a certificate too.
    let probe_dir = tempfile::tempdir().unwrap();
    let (cert, key) = (probe_dir.path().join("tls.crt"), probe_dir.path().join("tls.key"));
    std::fs::write(&cert, &side.identity.cert_pem).unwrap();
    std::fs::write(&key, &side.identity.key_pem).unwrap();
    let probe = |with_certificate: bool| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_statusguard"));
        command
            .args(["probe", "--name", &format!("statusguard-{}", s.namespace)])
            .env("KUBECONFIG", &s.cluster.kubeconfig);
        if with_certificate {
            command.arg("--client-cert").arg(&cert).arg("--client-key").arg(&key);
        }
        async move { command.output().await.unwrap() }
    };
    let with = probe(true).await;
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stdout));
    let without = probe(false).await;
    assert!(!without.status.success());
    let printed = String::from_utf8_lossy(&without.stdout);
    assert!(printed.contains("FAIL"), "{printed}");
    s.unregister().await;
}

/// A webhook the kubeconfig names no certificate for is called without one:
/// statusguard refuses the handshake and the guarded write fails closed.
#[tokio::test]
async fn a_webhook_the_kubeconfig_does_not_name_gets_no_certificate_and_the_write_fails_closed() {
    let side = apiserver_side();
    let s = scenario("e2e-mtls-unnamed").await;
    s.create_widget("w", initial_status()).await;
    let (server, _dir, server_ca) = authenticating_server(0, &side.identity.ca_pem).await;
    let name = format!("statusguard-{}", s.namespace);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.admin.clone());
    cluster::ensure_json(
        &validating,
        json!({"metadata": {"name": name}, "webhooks": [{
            "name": "validate.statusguard.dev",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{}/validate", server.tls.port()),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(&server_ca),
            },
            "rules": [{"apiGroups": ["example.com"], "apiVersions": ["*"], "resources": ["widgets/status"],
                       "operations": ["UPDATE"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"statusguard-test": s.namespace}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }]}),
    )
    .await;

    let refused = retry_until(Duration::from_secs(30), "the API server calls the webhook", || async {
        let mut own = s.get(&s.scaler, "w").await;
        own["status"]["replicas"] = json!(4);
        let written = s.put_status(&s.scaler, &own).await;
        if written.code == 200 {
            Err(written.body)
        } else {
            Ok(written)
        }
    })
    .await;
    assert_eq!(refused.code, 500, "{:?}", refused.body);
    // Go reports the refusal as it meets it: "remote error: tls: certificate
    // required", or, when it was already writing under TLS 1.3, a broken
    // pipe or an HTTP/2 connection that could not be established. What
    // holds: the call failed and no review reached statusguard.
    assert!(
        refused.message().contains("failed calling webhook"),
        "the API server's call failed: {}",
        refused.message()
    );
    let metrics = server.metrics().await;
    let reviewed = metrics
        .lines()
        .filter(|l| l.starts_with("statusguard_admission_requests_total{"))
        .any(|l| !l.ends_with(" 0"));
    assert!(!reviewed, "no review reached the server: {metrics}");
    let _ = validating.delete(&name, &DeleteParams::default()).await;
}
