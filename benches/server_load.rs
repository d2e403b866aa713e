//! A load generator for the real server: N keep-alive HTTPS connections on
//! loopback post the 16 KiB review to /mutate (trim mode) as fast as the
//! server answers, for a bounded time. Client and server share the machine,
//! so the figures are a lower bound for the server alone.
//!
//!     cargo bench --bench server_load
//!     LOAD_SECONDS=20 LOAD_CONNECTIONS=8 LOAD_ENDPOINT=validate cargo bench --bench server_load

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use statusguard::rules::RulesSource;
use statusguard::server::{ServeConfig, Server};
use statusguard::tls::{CertFiles, generate_certificates};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing
    // that asks for a measurement: run briefly then.
    let measuring = std::env::args().any(|a| a == "--bench");
    let seconds: u64 = env_or("LOAD_SECONDS", if measuring { 10 } else { 1 });
    let connections: usize = env_or("LOAD_CONNECTIONS", 8);
    let endpoint: String = env_or("LOAD_ENDPOINT", "mutate".to_owned());

    let dir = tempfile::tempdir()?;
    let certs = generate_certificates(&[])?;
    std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem)?;
    std::fs::write(dir.path().join("tls.key"), &certs.key_pem)?;
    std::fs::write(dir.path().join("ownership.yaml"), common::ownership())?;
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = Server::bind(ServeConfig {
        rules: RulesSource::File(dir.path().join("ownership.yaml")),
        listen: loopback,
        admin_listen: loopback,
        tls_files: Some(CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        }),
        tls_reload_interval: Duration::from_secs(2),
        write_ca: None,
        tls_sans: vec![],
        max_body_bytes: 16 << 20,
        header_read_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        shutdown_timeout: Duration::from_secs(5),
    })
    .await?;
    let url = format!("https://localhost:{}/{endpoint}", server.tls_addr().port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let body = bytes::Bytes::from(serde_json::to_vec(&common::review(true))?);
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(certs.ca_pem.as_bytes())?)
        .http1_only()
        .pool_max_idle_per_host(connections)
        .timeout(Duration::from_secs(10))
        .build()?;

    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let sent = Instant::now();
                let ok = match client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => r.bytes().await.is_ok(),
                    _ => false,
                };
                if ok {
                    latencies.push(sent.elapsed());
                } else {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (l, e) = worker.await?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    println!(
        "server_load: /{endpoint}, {} byte review, {connections} keep-alive TLS connections, {:.1} s",
        body.len(),
        elapsed.as_secs_f64()
    );
    println!(
        "server_load: {} reviews, {errors} errors, {:.0} reviews/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.90).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
    let _ = stop.send(());
    serving.await?;
    Ok(())
}
