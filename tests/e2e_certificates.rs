//! Certificates the server keeps itself. The chart is installed in its
//! default certificate mode; two replicas run as its pods would and share
//! its (initially empty) Secret, under a steady stream of guarded status
//! writes through the real API server.
//! - Issue 13: with lifetimes of seconds, the serving certificate is renewed
//!   and the CA rotated, and not one webhook call fails.
//! - Issue 23: the Secret deleted, emptied, its keys mismatched and garbage
//!   in its `ca.crt`: each is recovered (with the same CA where one is
//!   usable), no replica exits, and not one webhook call fails.
//!
//! Each test installs a release with cluster-wide webhooks: they take turns
//! ([`ONE_AT_A_TIME`]), so that one's webhook never answers the other's writes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use support::chart::{Release, Uninstall, local_values};
use support::scenario::Scenario;
use support::webhook::{BinaryServer, free_port, metric, tls_connector};

/// Held by each test for its whole run.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Installs the example document as `release` (name, namespace) with the
/// webhook at `port` and the certificates `server` policy (a flow mapping);
/// the guard uninstalls it.
fn install(
    s: &Scenario,
    home: &std::path::Path,
    release: (&'static str, &'static str),
    port: u16,
    server: &str,
) -> (Release, Uninstall) {
    let (name, namespace) = release;
    let values = local_values(
        include_str!("../examples/ownership.yaml"),
        port,
        &format!("certificates:\n  server: {server}\n"),
    );
    let installed = Release::new(home, name, namespace, &s.cluster.kubeconfig);
    // Before the install, so that a half-done one is removed too.
    let uninstall = installed.uninstall_on_drop();
    installed.install(&values);
    (installed, uninstall)
}

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
    let _turn = ONE_AT_A_TIME.lock().await;
    let s = Scenario::new("e2e-certificates").await;
    let home = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    // A CA of 24 s is rotated at 16 s; a serving certificate of 9 s renewed every 6 s.
    let server = "{validity: 9s, caValidity: 24s, overlap: 3s, checkInterval: 300ms}";
    let (release, _uninstall) = install(&s, home.path(), (RELEASE, NAMESPACE), port_a, server);
    let pod = release.pod(s.cluster, home.path(), "certs-statusguard").await;

    // Two replicas start at once: one wins the first write of the empty Secret.
    let (a, _b) = pod.start_two_ready((port_a, port_b), home.path()).await;
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

const RECOVERY_RELEASE: &str = "recovery";
const RECOVERY_NAMESPACE: &str = "statusguard-certificates-recovery";
const RECOVERY_SECRET: &str = "recovery-statusguard-tls";

/// What the Secret holds, by key; empty when it is gone.
async fn secret_data(secrets: &Api<Secret>) -> BTreeMap<String, Vec<u8>> {
    let secret = secrets.get_opt(RECOVERY_SECRET).await.unwrap();
    let data = secret.and_then(|s| s.data).unwrap_or_default();
    data.into_iter().map(|(k, v)| (k, v.0)).collect()
}

/// Writes `data` as the whole of the Secret's data.
async fn overwrite(secrets: &Api<Secret>, data: BTreeMap<String, Vec<u8>>) {
    let mut secret = secrets.get(RECOVERY_SECRET).await.unwrap();
    secret.data = Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect());
    secrets
        .replace(RECOVERY_SECRET, &PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Does `key` (PEM) belong to the first certificate of `cert` (PEM)?
fn fits(cert: &[u8], key: &[u8]) -> bool {
    let Ok(key) = rcgen::KeyPair::from_pem(&String::from_utf8_lossy(key)) else {
        return false;
    };
    let Ok(der) = CertificateDer::from_pem_slice(cert) else {
        return false;
    };
    x509_parser::parse_x509_certificate(der.as_ref())
        .is_ok_and(|(_, cert)| cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw())
}

/// The Secret holds a usable state, and every replica serves its serving
/// certificate (so trusted by its bundle); returns that state.
async fn recovered(secrets: &Api<Secret>, replicas: &mut [&mut BinaryServer], what: &str) -> BTreeMap<String, Vec<u8>> {
    for replica in replicas.iter_mut() {
        assert_alive(replica);
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.tls).collect();
    support::wait::retry_until(Duration::from_secs(20), what, || async {
        let data = secret_data(secrets).await;
        let part = |key: &str| data.get(key).cloned().unwrap_or_default();
        let (bundle, ca, leaf) = (part("ca.crt"), part("ca-signing.crt"), part("tls.crt"));
        if !fits(&leaf, &part("tls.key")) || !fits(&ca, &part("ca.key")) {
            return Err("a key does not fit its certificate".to_owned());
        }
        let trusted: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&bundle).filter_map(Result::ok).collect();
        if !trusted.iter().any(|c| c.as_ref() == der(&ca)) {
            return Err("ca.crt does not hold ca-signing.crt".to_owned());
        }
        for port in &ports {
            match presented(*port, &String::from_utf8_lossy(&bundle)).await {
                Some(served) if served == der(&leaf) => {}
                other => return Err(format!("port {port} serves {:?} bytes", other.map(|c| c.len()))),
            }
        }
        Ok(data.clone())
    })
    .await
}

fn assert_alive(replica: &mut BinaryServer) {
    let exited = replica.process.0.try_wait().unwrap();
    assert!(exited.is_none(), "a replica exited ({exited:?}):\n{}", replica.log());
}

/// Issue 23: the Secret is deleted, emptied, its keys mismatched and its
/// `ca.crt` garbage, one after the other, while two replicas serve and the
/// API server sends them guarded writes: each time the Secret is back to a
/// usable state, with the same CA except where the CA's own key was
/// replaced (then a new CA through the overlap), no replica exits, and no
/// webhook call fails. Then a replica started on mismatched keys repairs
/// them and becomes ready.
#[tokio::test]
async fn every_damage_to_the_secret_is_recovered_without_a_failed_call_or_an_exit() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let s = Arc::new(Scenario::new("e2e-certificates-recovery").await);
    let home = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    let server = "{validity: 1h, caValidity: 24h, overlap: 3s, checkInterval: 300ms}";
    let (release, _uninstall) = install(&s, home.path(), (RECOVERY_RELEASE, RECOVERY_NAMESPACE), port_a, server);
    let pod = release.pod(s.cluster, home.path(), "recovery-statusguard").await;
    let (mut a, mut b) = pod.start_two_ready((port_a, port_b), home.path()).await;
    let secrets: Api<Secret> = Api::namespaced(s.admin.clone(), RECOVERY_NAMESPACE);
    let first = recovered(&secrets, &mut [&mut a, &mut b], "the first certificates").await;
    let ca_made = tokio::time::Instant::now();
    let ca = first["ca-signing.crt"].clone();
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 1}))
        .await;
    s.wait_until_called(&["endpoint=\"validate\""], || a.metrics()).await;

    // Guarded writes all along, each through replica A.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let s = s.clone();
        tokio::spawn(async move {
            let (mut written, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                written += 1;
                let answer = s
                    .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": written}}))
                    .await;
                if answer.code != 200 {
                    failed.push((answer.code, answer.message().to_owned()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (written, failed)
        })
    };

    // Deleted: recreated, with the CA the replicas hold.
    secrets.delete(RECOVERY_SECRET, &Default::default()).await.unwrap();
    let now = recovered(&secrets, &mut [&mut a, &mut b], "the deleted Secret is recreated").await;
    assert!(now["ca-signing.crt"] == ca, "the same CA after deletion");

    // Emptied (what a forced replacement leaves): the same CA again.
    overwrite(&secrets, BTreeMap::new()).await;
    let now = recovered(&secrets, &mut [&mut a, &mut b], "the emptied Secret is refilled").await;
    assert!(now["ca-signing.crt"] == ca, "the same CA after emptying");

    // Garbage in ca.crt: the bundle is written again, nothing else changes.
    let mut garbage = now.clone();
    garbage.insert("ca.crt".to_owned(), b"garbage".to_vec());
    overwrite(&secrets, garbage).await;
    let after = recovered(&secrets, &mut [&mut a, &mut b], "ca.crt is repaired").await;
    assert!(after["ca-signing.crt"] == ca, "the same CA after garbage in ca.crt");
    assert!(after["tls.crt"] == now["tls.crt"], "the same serving certificate");

    // tls.key of another pair: a new serving certificate by the same CA,
    // once the CA has been trusted for the overlap (before, the replicas
    // write back the pair they serve).
    tokio::time::sleep_until(ca_made + Duration::from_secs(4)).await;
    let mut mismatched = after.clone();
    let foreign = rcgen::KeyPair::generate().unwrap().serialize_pem().into_bytes();
    mismatched.insert("tls.key".to_owned(), foreign);
    overwrite(&secrets, mismatched).await;
    let now = recovered(&secrets, &mut [&mut a, &mut b], "a tls.key that fits").await;
    assert!(now["ca-signing.crt"] == ca, "the same CA after a foreign tls.key");
    assert!(now["tls.crt"] != after["tls.crt"], "a new serving certificate");

    // ca.key of another CA: a new CA through the overlap, to the end of it.
    let mut mismatched = now.clone();
    let foreign = rcgen::KeyPair::generate().unwrap().serialize_pem().into_bytes();
    mismatched.insert("ca.key".to_owned(), foreign);
    overwrite(&secrets, mismatched).await;
    let now = recovered(&secrets, &mut [&mut a, &mut b], "a ca.key that fits").await;
    assert!(now["ca-signing.crt"] != ca, "a new CA");
    support::wait::eventually(
        Duration::from_secs(20),
        "the rotation ends with the new CA alone",
        || async {
            let data = secret_data(&secrets).await;
            bundle_size(&data["ca.crt"]) == 1 && data["ca.crt"] == data["ca-signing.crt"]
        },
    )
    .await;
    let rotated = recovered(&secrets, &mut [&mut a, &mut b], "the rotated certificates").await;
    assert!(
        rotated["ca-signing.crt"] == now["ca-signing.crt"],
        "the CA of the repair"
    );

    stop.store(true, Ordering::SeqCst);
    let (written, failed) = writer.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of {written} writes failed: {failed:?}\nA:\n{}\nB:\n{}",
        failed.len(),
        a.log(),
        b.log()
    );
    assert!(written > 20, "{written} writes");

    // A pod that starts on mismatched keys repairs them and becomes ready.
    drop((a, b));
    let mut mismatched = rotated.clone();
    for key in ["tls.key", "ca.key"] {
        let foreign = rcgen::KeyPair::generate().unwrap().serialize_pem().into_bytes();
        mismatched.insert(key.to_owned(), foreign);
    }
    overwrite(&secrets, mismatched).await;
    let dir_c = home.path().join("c");
    std::fs::create_dir_all(&dir_c).unwrap();
    let mut c = pod.start_on(port_a, &dir_c).await;
    c.wait_ready().await;
    recovered(&secrets, &mut [&mut c], "a new replica repairs the keys").await;
}
