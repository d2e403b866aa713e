//! Issue 13: certificates the server keeps itself. The chart is installed
//! in its default certificate mode with lifetimes of seconds; two replicas
//! run as its pods would and share its (initially empty) Secret. Under a
//! steady stream of guarded status writes through the real API server, the
//! serving certificate is renewed and the CA rotated, and not one webhook
//! call fails.
//!
//! One test in its own binary: it installs a release with cluster-wide webhooks.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use support::chart::Release;
use support::scenario::Scenario;
use support::webhook::{BinaryServer, free_port, metric, tls_connector};

const RELEASE: &str = "certs";
const NAMESPACE: &str = "statusguard-certificates";
const SECRET: &str = "certs-statusguard-tls";

/// The certificate a server presents to a client that trusts `bundle`;
/// `None` when the handshake fails.
async fn presented(port: u16, bundle: &str) -> Option<Vec<u8>> {
    let connector = tls_connector(bundle, &[&rustls::version::TLS13]);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let name = ServerName::try_from("127.0.0.1").ok()?;
    let tls = connector.connect(name, tcp).await.ok()?;
    let (_, session) = tls.get_ref();
    Some(session.peer_certificates()?.first()?.as_ref().to_vec())
}

fn der(pem: &[u8]) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem).unwrap().as_ref().to_vec()
}

fn bundle_size(pem: &[u8]) -> usize {
    CertificateDer::pem_slice_iter(pem).count()
}

#[tokio::test]
async fn renewals_and_ca_rotations_under_load_fail_no_webhook_call() {
    let s = Scenario::new("e2e-certificates").await;
    let home = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    let example = include_str!("../examples/ownership.yaml");
    let indented: String = example.lines().map(|l| format!("  {l}\n")).collect();
    // A CA of 24 s is rotated at 16 s; a serving certificate of 9 s renewed every 6 s.
    let values = format!(
        "ownership:\n{indented}webhook:\n  url: https://127.0.0.1:{port_a}\ncertificates:\n  server: {{validity: 9s, caValidity: 24s, overlap: 3s, checkInterval: 300ms}}\n"
    );
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&values);
    let args = release.server_args(home.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = s
        .cluster
        .service_account_kubeconfig(NAMESPACE, "certs-statusguard")
        .await;
    let env = [("KUBECONFIG", kubeconfig.as_path())];

    // Two replicas start at once: one wins the first write of the empty Secret.
    let (dir_a, dir_b) = (home.path().join("a"), home.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let (a, b) = tokio::join!(
        BinaryServer::start_on(port_a, &dir_a, &args, &env),
        BinaryServer::start_on(port_b, &dir_b, &args, &env)
    );
    a.wait_ready().await;
    b.wait_ready().await;
    let secrets: Api<Secret> = Api::namespaced(s.admin.clone(), NAMESPACE);
    let read = || async {
        let data = secrets.get(SECRET).await.unwrap().data.unwrap();
        (data["ca.crt"].0.clone(), data["tls.crt"].0.clone())
    };
    let (bundle, leaf) = read().await;
    let bundle_text = String::from_utf8(bundle.clone()).unwrap();
    for port in [port_a, port_b] {
        let served = support::wait::retry_until(
            Duration::from_secs(10),
            "both replicas serve the Secret's certificate",
            || async {
                match presented(port, &bundle_text).await {
                    Some(served) if served == der(&leaf) => Ok(served),
                    other => Err(other.map(|c| c.len())),
                }
            },
        )
        .await;
        assert_eq!(served, der(&leaf));
    }
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 1}))
        .await;
    s.wait_until_called(&["endpoint=\"validate\""], || a.metrics()).await;

    // A steady stream of the scaler's own writes, each through the webhook,
    // while the Secret is watched for renewals and rotations.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let secrets = secrets.clone();
        tokio::spawn(async move {
            let (mut leaves, mut cas, mut largest_bundle) = (BTreeSet::new(), BTreeSet::new(), 0);
            while !stop.load(Ordering::SeqCst) {
                if let Some(data) = secrets.get(SECRET).await.ok().and_then(|s| s.data) {
                    leaves.insert(data["tls.crt"].0.clone());
                    cas.insert(data["ca-signing.crt"].0.clone());
                    largest_bundle = largest_bundle.max(bundle_size(&data["ca.crt"].0));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (leaves.len(), cas.len(), largest_bundle)
        })
    };
    let (mut written, mut failed) = (0, Vec::new());
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(40) {
        written += 1;
        let answer = s
            .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": written}}))
            .await;
        if answer.code != 200 {
            failed.push((started.elapsed(), answer.code, answer.message().to_owned()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (leaves, cas, largest_bundle) = watcher.await.unwrap();
    let metrics = a.metrics().await;
    assert!(
        failed.is_empty(),
        "{} of {written} writes failed: {failed:?}\n{}",
        failed.len(),
        a.log()
    );
    assert!(leaves >= 4, "serving certificates seen: {leaves}");
    assert!(cas >= 2, "CAs seen: {cas}");
    assert_eq!(largest_bundle, 2, "both CAs were trusted through the rotation");
    let reviewed = metric(
        &metrics,
        "statusguard_admission_requests_total{endpoint=\"validate\",group=\"example.com\",resource=\"widgets\",decision=\"allowed\"}",
    )
    .unwrap_or_default();
    assert!(
        reviewed >= f64::from(written) * 0.9,
        "{reviewed} reviews for {written} writes\n{metrics}"
    );
    // Both replicas still serve what the Secret holds.
    let (bundle, leaf) = read().await;
    let bundle_text = String::from_utf8(bundle).unwrap();
    for port in [port_a, port_b] {
        support::wait::retry_until(
            Duration::from_secs(5),
            "both replicas serve the Secret's certificate",
            || async {
                match presented(port, &bundle_text).await {
                    Some(served) if served == der(&leaf) => Ok(()),
                    other => Err(other.map(|c| c.len())),
                }
            },
        )
        .await;
    }
}
