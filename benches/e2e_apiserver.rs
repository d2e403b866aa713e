//! What a webhook adds to a status write through the real kube-apiserver:
//! sequential merge patches of a Widget's status with no webhook, with the
//! null webhook, with statusguard, and with statusguard's rules as admission
//! policies (`statusguard export policies`), p50/p99 of each, the
//! differences and the API server's CPU per write, in one run, on the test
//! control plane (tests/cluster/build.sh). Then the policies' CEL cost
//! budget: the largest owned list, found by bisection, whose writes the
//! policies still decide.
//!
//!     cargo bench --bench e2e_apiserver
//!     E2E_WRITES=1000 cargo bench --bench e2e_apiserver

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use statusguard::rules::RulesSource;
use support::scenario::Scenario;
use support::webhook::{RunningServer, config, files, write_pair};

type Error = Box<dyn std::error::Error>;

/// `writes` sequential merge patches of the scaler's own field; the latencies, sorted.
async fn write_loop(s: &Scenario, writes: u32) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(writes as usize);
    for i in 0..writes {
        let started = Instant::now();
        let written = s
            .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": i}}))
            .await;
        latencies.push(started.elapsed());
        assert_eq!(written.code, 200, "{:?}", written.body);
    }
    latencies.sort();
    latencies
}

/// The kube-apiserver of the test control plane: the process whose command
/// line names its port.
fn apiserver_pid(url: &str) -> Option<u32> {
    let port = url.rsplit(':').next()?;
    let wanted = format!("--secure-port={port}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_apiserver = args.first()?.ends_with(b"kube-apiserver");
        (is_apiserver && args.contains(&wanted.as_bytes())).then_some(pid)
    })
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name's closing parenthesis: fields 3.. of proc(5).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, here 11 and 12; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

/// [`write_loop`], with the API server's CPU per write in µs.
async fn measured(s: &Scenario, writes: u32, apiserver: Option<u32>) -> (Vec<Duration>, f64) {
    let before = apiserver.map_or(0.0, cpu_seconds);
    let latencies = write_loop(s, writes).await;
    let after = apiserver.map_or(0.0, cpu_seconds);
    (latencies, (after - before) * 1e6 / f64::from(writes))
}

/// The embedded rules as admission policies, the controller also owning
/// `deep` (kept as written: the cost budget's probe), bound to the
/// scenario's namespace; waits until the API server enforces them (the
/// controller's write of the scaler's `replicas` is refused).
async fn apply_policies(s: &Scenario) -> Result<(), Error> {
    let document = statusguard::rules::EMBEDDED_OWNERSHIP.replace(
        "fields: [observedGeneration, summary]",
        "fields: [observedGeneration, summary, deep]",
    );
    assert_ne!(document, statusguard::rules::EMBEDDED_OWNERSHIP);
    let rules = statusguard::ownership::Ownership::from_yaml(&document)?;
    for mut object in statusguard::policies::policies("bench", &rules) {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        if kind.ends_with("Binding") {
            object["spec"]["matchResources"] =
                json!({"namespaceSelector": {"matchLabels": {"statusguard-test": s.namespace}}});
        }
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::all_with(s.admin.clone(), &statusguard::policies::api_resource(&kind));
        api.patch(
            &name,
            &kube::api::PatchParams::apply("bench").force(),
            &kube::api::Patch::Apply(&object),
        )
        .await?;
    }
    // A value never written before: always a change.
    let attempt = AtomicU64::new(1_000_000);
    support::wait::retry_until(Duration::from_secs(30), "the policies take effect", || async {
        let value = attempt.fetch_add(1, Ordering::Relaxed);
        let written = s
            .merge_patch_status(&s.controller, "w", json!({"status": {"replicas": value}}))
            .await;
        if written.code == 403 { Ok(()) } else { Err(written.code) }
    })
    .await;
    Ok(())
}

/// The largest owned list (items of one member each) whose write by
/// another writer the policies still decide within the CEL cost budget,
/// by bisection between `low` (decided) and `high` (not).
async fn largest_within_budget(s: &Scenario, mut low: usize, mut high: usize) -> (usize, Duration) {
    let mut slowest = Duration::ZERO;
    while high - low > low / 20 {
        let middle = (low + high) / 2;
        let mut object = s.get(&s.admin, "w").await;
        object["status"]["deep"] = json!({"items": (0..middle).map(|i| json!({"a": i})).collect::<Vec<_>>()});
        let stored = s.put_status(&s.admin, &object).await;
        assert_eq!(stored.code, 200, "{:?}", stored.body);
        // The scaler writes its own field: the controller's `deep` is compared.
        let started = Instant::now();
        let written = s
            .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": middle}}))
            .await;
        let took = started.elapsed();
        if written.code == 200 {
            low = middle;
            slowest = took;
        } else {
            high = middle;
        }
    }
    (low, slowest)
}

/// The latency of one write by the scaler (its own field) while the
/// controller's owned `deep` holds a list of `items`, the median of `runs`.
async fn write_with_owned_list(s: &Scenario, items: usize, runs: u32) -> Duration {
    let mut object = s.get(&s.admin, "w").await;
    object["status"]["deep"] = json!({"items": (0..items).map(|i| json!({"a": i})).collect::<Vec<_>>()});
    let stored = s.put_status(&s.admin, &object).await;
    assert_eq!(stored.code, 200, "{:?}", stored.body);
    let mut latencies = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let written = s
            .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": 10_000 + run}}))
            .await;
        latencies.push(started.elapsed());
        assert_eq!(written.code, 200, "{items} items: {:?}", written.body);
    }
    latencies.sort();
    latencies[latencies.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The null webhook in process, on a loopback port; counts what it answers.
async fn null_webhook(dir: &std::path::Path) -> Result<(u16, String, Arc<AtomicU64>), Error> {
    let certs = write_pair(dir);
    let (key, _) = files(dir).load()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(statusguard::cluster::certs::tls::server_config(
        statusguard::cluster::certs::tls::SwappableCert::new(key),
    )?));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let answered = Arc::new(AtomicU64::new(0));
    let counter = answered.clone();
    let router = common::null_router().layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                next.run(request).await
            }
        },
    ));
    let limits = statusguard::server::http::accept::AcceptLimits::of(&Default::default());
    tokio::spawn(statusguard::server::http::accept::serve_tls(
        listener,
        acceptor,
        router,
        limits,
        std::future::pending(),
    ));
    Ok((port, certs.ca_pem, answered))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("e2e_apiserver: run with `cargo bench --bench e2e_apiserver`");
        return Ok(());
    }
    let writes: u32 = std::env::var("E2E_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let s = Scenario::new("bench-e2e").await;
    s.create_widget("w", json!({"observedGeneration": 1, "replicas": 0}))
        .await;
    let apiserver = apiserver_pid(&s.cluster.url);
    if apiserver.is_none() {
        eprintln!("e2e_apiserver: kube-apiserver's process not found: no CPU figures");
    }

    // Warm the API server's caches and connections first.
    write_loop(&s, 50).await;
    let (none, none_cpu) = measured(&s, writes, apiserver).await;

    let null_dir = tempfile::tempdir()?;
    let (port, ca_pem, answered) = null_webhook(null_dir.path()).await?;
    s.register_at(port, &ca_pem, false, || {
        let n = answered.load(Ordering::Relaxed);
        async move { format!("statusguard_admission_requests_total{{endpoint=\"validate\"}} {n}\n") }
    })
    .await;
    write_loop(&s, 50).await;
    let (null, null_cpu) = measured(&s, writes, apiserver).await;
    s.unregister().await;

    let dir = tempfile::tempdir()?;
    let certs = write_pair(dir.path());
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(dir.path())))).await;
    s.register(&server, &certs.ca_pem, false).await;
    write_loop(&s, 50).await;
    let (guard, guard_cpu) = measured(&s, writes, apiserver).await;
    s.unregister().await;

    apply_policies(&s).await?;
    write_loop(&s, 50).await;
    let (policies, policies_cpu) = measured(&s, writes, apiserver).await;
    let (largest, slowest) = largest_within_budget(&s, 1_000, 20_000).await;
    let mut sweep = Vec::new();
    for items in [10, 100, 1_000, 3_000] {
        sweep.push((items, write_with_owned_list(&s, items, 5).await));
    }

    println!("e2e_apiserver: {writes} sequential status merge patches through kube-apiserver each");
    for (name, l, cpu) in [
        ("no webhook", &none, none_cpu),
        ("null webhook", &null, null_cpu),
        ("statusguard", &guard, guard_cpu),
        ("policies", &policies, policies_cpu),
    ] {
        println!(
            "e2e_apiserver: {name:<13} p50 {:.2} ms  p99 {:.2} ms  kube-apiserver CPU {cpu:.0} µs per write",
            percentile(l, 0.5),
            percentile(l, 0.99)
        );
    }
    println!(
        "e2e_apiserver: policies minus no webhook: p50 {:+.2} ms, p99 {:+.2} ms",
        percentile(&policies, 0.5) - percentile(&none, 0.5),
        percentile(&policies, 0.99) - percentile(&none, 0.99)
    );
    for (items, took) in &sweep {
        println!(
            "e2e_apiserver: policies, the controller's owned list of {items} items compared: a write takes {:.1} ms (median of 5)",
            took.as_secs_f64() * 1e3
        );
    }
    println!(
        "e2e_apiserver: the policies decide an owned list of up to about {largest} items within CEL's cost budget (that write took {:.0} ms)",
        slowest.as_secs_f64() * 1e3
    );
    println!(
        "e2e_apiserver: statusguard minus null webhook: p50 {:+.2} ms, p99 {:+.2} ms (goal: at most +0.5 ms)",
        percentile(&guard, 0.5) - percentile(&null, 0.5),
        percentile(&guard, 0.99) - percentile(&null, 0.99)
    );
    Ok(())
}
