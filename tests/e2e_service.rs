//! Issue 14: the path a real cluster uses. The chart is installed in
//! Service mode with its defaults (no `webhook.url`, certificates kept by the
//! server); the test API server runs with `--enable-aggregator-routing`, so it
//! reaches a webhook's Service at that Service's EndpointSlice addresses, as
//! a cluster reaches its pods. Two server processes run as the chart's pods
//! would: the Deployment's arguments, listening on the chart's dual-stack
//! address, with the chart's ServiceAccount token. The test plays the
//! endpoints controller: it probes each process's /readyz every 100 ms and
//! keeps one EndpointSlice per process in step (a non-loopback address of
//! this machine, since the API server refuses loopback endpoints; the
//! processes share it and differ by port, as pods differ by IP).
//!
//! Under a steady stream of guarded status writes (the scaler's own field,
//! the controller's own field, and the stale full update that rolls the
//! controller's field back):
//! - a rolling restart (a new process ready first, then SIGTERM to the old
//!   one, twice) rejects no legitimate write and stores no rollback. There is
//!   no preStop sleep and no deletion signal here: the server's own shutdown
//!   delay, readiness 503 while it still serves, is all that covers the
//!   window;
//! - SIGKILL of the replica that serves the traffic: writes go on through the
//!   other once the endpoint is marked unready;
//! - with both replicas gone, writes fail closed under `Fail`.
//!
//! One test in its own binary: it installs a release with cluster-wide webhooks.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::chart::Release;
use support::scenario::{Scenario, Written};
use support::webhook::{BinaryServer, free_port, signal};
use tokio::sync::watch;
use tokio::time::Instant;

const RELEASE: &str = "svc";
const NAMESPACE: &str = "statusguard-service";
const SERVICE: &str = "svc-statusguard";

/// A non-loopback IPv4 address of this machine: the one its default route
/// leaves from (a UDP "connect" sends nothing).
fn machine_address() -> String {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket
        .connect("198.51.100.1:9")
        .and_then(|()| socket.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|e| panic!("this test needs a non-loopback IPv4 address with a route: {e}"))
}

/// The chart's pods: a process per slot, by name.
type Pods = Arc<Mutex<BTreeMap<String, Arc<BinaryServer>>>>;

/// The pods running now, by slot (a copy: the lock is not held across awaits).
fn running(pods: &Pods) -> Vec<(String, Arc<BinaryServer>)> {
    pods.lock()
        .unwrap()
        .iter()
        .map(|(slot, pod)| (slot.clone(), pod.clone()))
        .collect()
}

/// The endpoints controller's part: every 100 ms, each process's readiness
/// into its EndpointSlice; a slot's slice is deleted when its process is gone.
/// Returns how many times it changed a slice.
async fn endpoints_controller(
    slices: Api<EndpointSlice>,
    pods: Pods,
    address: String,
    mut stop: watch::Receiver<bool>,
) -> usize {
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut published: BTreeMap<String, (u16, bool)> = BTreeMap::new();
    let mut changes = 0;
    while !*stop.borrow() {
        let current = running(&pods);
        for (slot, pod) in &current {
            let ready = matches!(
                probe.get(pod.admin_url("/readyz")).send().await,
                Ok(r) if r.status() == 200
            );
            if published.get(slot) == Some(&(pod.tls, ready)) {
                continue;
            }
            let name = format!("{SERVICE}-{slot}");
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/service-name": SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "statusguard-e2e"}},
                "addressType": "IPv4",
                "ports": [{"name": "webhook", "port": pod.tls, "protocol": "TCP"}],
                "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}],
            });
            slices
                .patch(
                    &name,
                    &PatchParams::apply("statusguard-e2e").force(),
                    &Patch::Apply(slice),
                )
                .await
                .unwrap();
            published.insert(slot.clone(), (pod.tls, ready));
            changes += 1;
        }
        let gone: Vec<String> = published
            .keys()
            .filter(|slot| !current.iter().any(|(s, _)| s == *slot))
            .cloned()
            .collect();
        for slot in gone {
            let _ = slices
                .delete(&format!("{SERVICE}-{slot}"), &DeleteParams::default())
                .await;
            published.remove(&slot);
            changes += 1;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), stop.changed()).await;
    }
    changes
}

/// What the writers saw, in the phase it happened.
#[derive(Debug, Default)]
struct Tally {
    /// Legitimate writes (each identity's own field) acknowledged.
    acknowledged: usize,
    /// Legitimate writes refused: (phase, code, message).
    rejected: Vec<(String, u16, String)>,
    /// Stale full updates denied by statusguard.
    denied: usize,
    /// Stale full updates refused because the webhook could not be called.
    refused_unreachable: usize,
    /// Stale full updates stored: rollbacks.
    rollbacks: Vec<String>,
    /// Stale full updates refused for anything else (the test's own bug).
    other: Vec<(u16, String)>,
}

fn webhook_unreachable(written: &Written) -> bool {
    written.code >= 500 && written.message().contains("failed calling webhook")
}

/// The writers: the scaler's own `replicas`, the controller's own
/// `observedGeneration`, and every fifth round the scaler's stale copy
/// (an older `observedGeneration`) put back with a fresh resourceVersion.
async fn writers(s: Arc<Scenario>, phase: watch::Receiver<String>, tally: Arc<Mutex<Tally>>) {
    let stale = s.get(&s.scaler, "w").await;
    let mut round: i64 = 0;
    loop {
        let current = phase.borrow().clone();
        if current == "stop" {
            return;
        }
        round += 1;
        let own = [
            s.merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": round}}))
                .await,
            s.merge_patch_status(
                &s.controller,
                "w",
                json!({"status": {"observedGeneration": round + 10}}),
            )
            .await,
        ];
        for written in own {
            let mut tally = tally.lock().unwrap();
            if written.code == 200 {
                tally.acknowledged += 1;
            } else {
                tally
                    .rejected
                    .push((current.clone(), written.code, written.message().to_owned()));
            }
        }
        if round % 5 == 0 {
            let latest = s.get(&s.scaler, "w").await;
            let mut retry = stale.clone();
            retry["metadata"]["resourceVersion"] = latest["metadata"]["resourceVersion"].clone();
            retry["status"]["replicas"] = json!(round);
            let written = s.put_status(&s.scaler, &retry).await;
            let mut tally = tally.lock().unwrap();
            match written.code {
                200 => tally.rollbacks.push(current.clone()),
                _ if written.message().contains("denied the request") => tally.denied += 1,
                _ if webhook_unreachable(&written) => tally.refused_unreachable += 1,
                code => tally.other.push((code, written.message().to_owned())),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a "pod" in `slot` on a fresh port and waits until it is ready.
async fn start_pod(pods: &Pods, slot: &str, home: &std::path::Path, args: &[String], kubeconfig: &std::path::Path) {
    let dir = home.join(slot);
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let pod = BinaryServer::start_at(
        &format!("[::]:{port}"),
        port,
        &dir,
        &args,
        &[("KUBECONFIG", kubeconfig)],
    )
    .await;
    pod.wait_ready().await;
    pods.lock().unwrap().insert(slot.to_owned(), Arc::new(pod));
}

/// The reviews a pod has answered so far.
async fn reviews(pod: &BinaryServer) -> f64 {
    let metrics = pod.metrics().await;
    metrics
        .lines()
        .filter(|l| l.starts_with("statusguard_admission_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the EndpointSlices list exactly `ready` as ready ports.
async fn wait_for_endpoints(slices: &Api<EndpointSlice>, ready: usize, what: &str) {
    support::wait::retry_until(Duration::from_secs(15), what, || async {
        let listed = slices
            .list(&kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={SERVICE}")))
            .await
            .unwrap();
        let count = listed
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        if count == ready { Ok(()) } else { Err(count) }
    })
    .await;
}

/// Stops `slot`'s process with `signal_name`, waits until it has exited
/// (the endpoints controller sees it terminate meanwhile), and returns how.
async fn stop_pod(pods: &Pods, slot: &str, signal_name: &str) -> std::process::ExitStatus {
    let pod = pods.lock().unwrap().get(slot).cloned().expect("the slot runs a pod");
    signal(&pod.process.0, signal_name);
    let pid = pod.process.0.id();
    drop(pod);
    // Exited and not yet reaped: a zombie, state Z after the command's name.
    support::wait::retry_until(Duration::from_secs(40), "the pod exits", || async {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) if !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.starts_with(" Z")) => Err("running"),
            _ => Ok(()),
        }
    })
    .await;
    let mut pod = pods.lock().unwrap().remove(slot).expect("the slot runs a pod");
    // The endpoints controller may hold it for a moment.
    let mut pod = loop {
        match Arc::try_unwrap(pod) {
            Ok(pod) => break pod,
            Err(shared) => pod = shared,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    pod.process.0.wait().unwrap()
}

#[tokio::test]
async fn rolling_restarts_and_crashes_through_the_service_reject_no_write() {
    let s = Arc::new(Scenario::new("e2e-service").await);
    let home = tempfile::tempdir().unwrap();
    let example = include_str!("../examples/ownership.yaml");
    let indented: String = example.lines().map(|l| format!("  {l}\n")).collect();
    // The chart's defaults but a shorter shutdown delay, to keep the test short.
    let values = format!("ownership:\n{indented}shutdown: {{delay: 2s, drainTimeout: 10s}}\n");
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&values);
    let args = release.server_args(home.path());
    assert!(
        args.iter()
            .any(|a| a == &format!("--webhook-target={NAMESPACE}/{SERVICE}:443")),
        "the chart targets its Service: {args:?}"
    );
    let kubeconfig = s.cluster.service_account_kubeconfig(NAMESPACE, "svc-statusguard").await;
    let slices: Api<EndpointSlice> = Api::namespaced(s.admin.clone(), NAMESPACE);
    let address = machine_address();

    let pods: Pods = Arc::default();
    let (first, second) = tokio::join!(
        start_pod(&pods, "a", home.path(), &args, &kubeconfig),
        start_pod(&pods, "b", home.path(), &args, &kubeconfig)
    );
    let ((), ()) = (first, second);
    let (stop_controller, stopped) = watch::channel(false);
    let controller = tokio::spawn(endpoints_controller(
        slices.clone(),
        pods.clone(),
        address.clone(),
        stopped,
    ));
    wait_for_endpoints(&slices, 2, "both pods are ready endpoints").await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 1}))
        .await;
    let all_metrics = || {
        let pods = pods.clone();
        async move {
            let current: Vec<Arc<BinaryServer>> = pods.lock().unwrap().values().cloned().collect();
            let mut text = String::new();
            for pod in current {
                text.push_str(&pod.metrics().await);
            }
            text
        }
    };
    s.wait_until_called(&["endpoint=\"validate\""], all_metrics).await;

    // `helm test`: its pod's command, dialling a replica's address (there is
    // no cluster DNS here) but verifying the Service's name and caBundle.
    let a_port = pods.lock().unwrap()["a"].tls;
    let connect_to = format!("--connect-to={address}:{a_port}");
    let (passed, said) = release.run_test_hook(&kubeconfig, &[&connect_to]);
    assert!(passed, "{said}");
    assert!(
        said.contains("ok    validating validate.svc-statusguard-statusguard-service.statusguard.dev at https://svc-statusguard.statusguard-service.svc:443/validate"),
        "{said}"
    );

    let (phase, phases) = watch::channel("steady".to_owned());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let writing = tokio::spawn(writers(s.clone(), phases, tally.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A rolling restart as a Deployment with maxUnavailable 0 does it: a
    // new pod ready first, then the old one terminated, one at a time.
    phase.send_replace("rolling restart".into());
    for (old, new) in [("a", "c"), ("b", "d")] {
        start_pod(&pods, new, home.path(), &args, &kubeconfig).await;
        wait_for_endpoints(&slices, 3, "the new pod is a ready endpoint").await;
        let status = stop_pod(&pods, old, "TERM").await;
        assert!(status.success(), "SIGTERM: a clean exit, got {status:?}");
        wait_for_endpoints(&slices, 2, "the old pod's endpoint is gone").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // SIGKILL of the replica the API server's connection is on.
    phase.send_replace("one pod killed".into());
    let mut busiest = ("c".to_owned(), -1.0);
    let before: Vec<(String, f64)> = {
        let current = running(&pods);
        let mut counts = Vec::new();
        for (slot, pod) in current {
            counts.push((slot, reviews(&pod).await));
        }
        counts
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (slot, count) in before {
        let pod = pods.lock().unwrap().get(&slot).cloned().unwrap();
        let delta = reviews(&pod).await - count;
        if delta > busiest.1 {
            busiest = (slot, delta);
        }
    }
    let killed_at = Instant::now();
    stop_pod(&pods, &busiest.0, "KILL").await;
    wait_for_endpoints(&slices, 1, "the killed pod's endpoint is gone").await;
    let unready_after = killed_at.elapsed();
    phase.send_replace("after the kill".into());
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Both gone: fail closed.
    phase.send_replace("stop".into());
    writing.await.unwrap();
    let survivor: Vec<String> = pods.lock().unwrap().keys().cloned().collect();
    for slot in survivor {
        stop_pod(&pods, &slot, "KILL").await;
    }
    wait_for_endpoints(&slices, 0, "no endpoint is left").await;
    let before = s.get(&s.admin, "w").await;
    // The scaler's own field, and a rollback of the controller's: both
    // fail closed, neither is passed unguarded.
    for status in [json!({"replicas": 999}), json!({"observedGeneration": 0})] {
        let written = s.merge_patch_status(&s.scaler, "w", json!({ "status": status })).await;
        assert!(
            webhook_unreachable(&written),
            "with no replica a guarded write ({status}) fails closed: {} {:?}",
            written.code,
            written.body
        );
    }
    assert_eq!(
        s.get(&s.admin, "w").await["status"],
        before["status"],
        "nothing was stored"
    );

    // `helm test` now fails, naming why.
    let (passed, said) = release.run_test_hook(&kubeconfig, &[&connect_to]);
    assert!(!passed, "{said}");
    assert!(said.contains("FAIL") && said.contains("cannot connect"), "{said}");

    stop_controller.send_replace(true);
    let changes = controller.await.unwrap();
    let tally = tally.lock().unwrap();
    eprintln!(
        "service path: {} writes acknowledged, {} stale rollbacks denied, {} refused while unreachable, {} EndpointSlice changes; the killed pod's endpoint was unready after {unready_after:?}; rejected: {:?}",
        tally.acknowledged, tally.denied, tally.refused_unreachable, changes, tally.rejected
    );
    assert!(tally.rollbacks.is_empty(), "rollbacks stored: {:?}", tally.rollbacks);
    assert!(tally.other.is_empty(), "unexpected answers: {:?}", tally.other);
    let rejected_in = |phase: &str| tally.rejected.iter().filter(|(p, ..)| p == phase).count();
    assert_eq!(rejected_in("steady"), 0, "{:?}", tally.rejected);
    assert_eq!(rejected_in("rolling restart"), 0, "{:?}", tally.rejected);
    assert_eq!(rejected_in("after the kill"), 0, "{:?}", tally.rejected);
    // Between the kill and the endpoint update a new connection may still be
    // dialled to the dead address (the API server does not retry a refused
    // connection): such writes fail closed, and only in that window.
    assert!(
        tally.rejected.iter().all(|(p, code, message)| p == "one pod killed"
            && *code >= 500
            && message.contains("failed calling webhook")),
        "{:?}",
        tally.rejected
    );
    assert!(tally.acknowledged > 100, "{}", tally.acknowledged);
    assert!(tally.denied > 10, "the stale retries were denied: {}", tally.denied);
}
