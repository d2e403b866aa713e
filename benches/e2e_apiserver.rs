//! What a webhook adds to a status write through the real kube-apiserver:
//! sequential merge patches of a Widget's status with no webhook, with the
//! null webhook, and with statusguard, p50/p99 of each and the differences,
//! in one run, on the test control plane (tests/cluster/build.sh).
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

    // Warm the API server's caches and connections first.
    write_loop(&s, 50).await;
    let none = write_loop(&s, writes).await;

    let null_dir = tempfile::tempdir()?;
    let (port, ca_pem, answered) = null_webhook(null_dir.path()).await?;
    s.register_at(port, &ca_pem, false, || {
        let n = answered.load(Ordering::Relaxed);
        async move { format!("statusguard_admission_requests_total{{endpoint=\"validate\"}} {n}\n") }
    })
    .await;
    write_loop(&s, 50).await;
    let null = write_loop(&s, writes).await;
    s.unregister().await;

    let dir = tempfile::tempdir()?;
    let certs = write_pair(dir.path());
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(dir.path())))).await;
    s.register(&server, &certs.ca_pem, false).await;
    write_loop(&s, 50).await;
    let guard = write_loop(&s, writes).await;
    s.unregister().await;

    println!("e2e_apiserver: {writes} sequential status merge patches through kube-apiserver each");
    for (name, l) in [("no webhook", &none), ("null webhook", &null), ("statusguard", &guard)] {
        println!(
            "e2e_apiserver: {name:<13} p50 {:.2} ms  p99 {:.2} ms",
            percentile(l, 0.5),
            percentile(l, 0.99)
        );
    }
    println!(
        "e2e_apiserver: statusguard minus null webhook: p50 {:+.2} ms, p99 {:+.2} ms (goal: at most +0.5 ms)",
        percentile(&guard, 0.5) - percentile(&null, 0.5),
        percentile(&guard, 0.99) - percentile(&null, 0.99)
    );
    Ok(())
}
