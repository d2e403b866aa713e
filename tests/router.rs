//! The HTTP layer in process, without sockets or TLS: the real routers
//! driven with `tower::ServiceExt::oneshot`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use statusguard::metrics::Metrics;
use statusguard::rules::{EMBEDDED_OWNERSHIP, RulesSource};
use statusguard::server::http::{admin, admission};
use statusguard::server::limits::Limits;
use statusguard::server::state::App;
use tower::ServiceExt as _;

const CONTROLLER: &str = "system:serviceaccount:platform:widget-controller";
const SCALER: &str = "system:serviceaccount:platform:widget-scaler";

/// Handlers' state with these limits, no rules, and the observer's defaults.
fn app(max_body_bytes: usize, request_timeout: Duration) -> Arc<App> {
    let limits = Limits {
        max_body_bytes,
        max_inflight_bytes: max_body_bytes.max(Limits::default().max_inflight_bytes),
        request_timeout,
        ..Limits::default()
    };
    App::new(Arc::new(Metrics::default()), limits, Default::default()).0
}

fn app_with_rules() -> Arc<App> {
    let app = app(16 * 1024 * 1024, Duration::from_secs(5));
    app.rules.replace(RulesSource::Embedded.load_local().unwrap());
    app
}

async fn call(router: Router, method: Method, path: &str, body: impl Into<Body>) -> (StatusCode, String, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, content_type, String::from_utf8_lossy(&bytes).into_owned())
}

/// A status UPDATE of a Widget, written as text so that a status nested
/// thousands of levels deep never passes through a recursive serializer.
fn review_text(writer: &str, groups: &[&str], old_status: &str, new_status: &str) -> String {
    let request = json!({
        "uid": "u-1", "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
        "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
        "subResource": "status", "name": "w1", "namespace": "shop", "operation": "UPDATE",
        "userInfo": {"username": writer, "groups": groups},
        "object": "NEW", "oldObject": "OLD",
    });
    let object = |status: &str| {
        format!(r#"{{"apiVersion":"example.com/v1","kind":"Widget","metadata":{{"name":"w1"}},"status":{status}}}"#)
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        .to_string()
        .replace(r#""NEW""#, &object(new_status))
        .replace(r#""OLD""#, &object(old_status))
}

fn nested(levels: usize, inner: &str) -> String {
    format!("{}{inner}{}", r#"{"a":"#.repeat(levels), "}".repeat(levels))
}

async fn review(router: Router, path: &str, body: String) -> Value {
    let (status, content_type, text) = call(router, Method::POST, path, body).await;
    assert_eq!(
        (status, content_type.as_str()),
        (StatusCode::OK, "application/json"),
        "{text}"
    );
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["response"]["uid"], "u-1");
    answer["response"].clone()
}

#[tokio::test]
async fn readiness_follows_the_rules_and_the_shutdown() {
    let app = app(1024, Duration::from_secs(1));
    let router = || admin::router(app.clone());
    let (status, _, body) = call(router(), Method::GET, "/readyz", Body::empty()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("no ownership rules loaded"), "{body}");
    app.rules.replace(RulesSource::Embedded.load_local().unwrap());
    let (status, _, body) = call(router(), Method::GET, "/readyz", Body::empty()).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "ready (rules generation 1)\n")
    );
    app.start_shutdown();
    let (status, _, body) = call(router(), Method::GET, "/readyz", Body::empty()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("shutting down"), "{body}");
    let (status, _, _) = call(router(), Method::GET, "/healthz", Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "liveness does not depend on readiness");
}

#[tokio::test]
async fn without_rules_a_review_gets_503_for_the_failure_policy() {
    let app = app(1024 * 1024, Duration::from_secs(1));
    let body = review_text(SCALER, &[], "{}", "{}");
    let (status, _, text) = call(admission::router(app, None), Method::POST, "/validate", body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
}

#[tokio::test]
async fn methods_paths_and_limits() {
    let app = app(1024, Duration::from_secs(1));
    app.rules.replace(RulesSource::Embedded.load_local().unwrap());
    let router = || admission::router(app.clone(), None);
    assert_eq!(
        call(router(), Method::GET, "/validate", Body::empty()).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        call(router(), Method::POST, "/other", Body::empty()).await.0,
        StatusCode::NOT_FOUND
    );
    let (status, _, text) = call(router(), Method::POST, "/validate", vec![b' '; 2048]).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "the request body is over 1024 bytes\n")
    );
}

/// Regression (issue 11, item 1): a status nested deeper than serde_json's
/// default limit made every write of the object fail with HTTP 400
/// "recursion limit exceeded", exempt writers included. Now every review is
/// decided, as deep as the API server stores (10,000 levels).
#[tokio::test]
async fn a_deeply_nested_status_is_decided_for_every_writer() {
    let router = || admission::router(app_with_rules(), None);
    let deep = nested(10_000, "1");
    let deeper = nested(10_000, "2");
    let with = |blob: &str, generation: u32, summary: &str| {
        format!(r#"{{"observedGeneration":{generation},"blob":{blob},"summary":{summary}}}"#)
    };

    // The owner of observedGeneration changes it; a deep unowned blob changes too.
    let body = review_text(CONTROLLER, &[], &with(&deep, 1, "{}"), &with(&deeper, 2, "{}"));
    let response = review(router(), "/validate", body).await;
    assert_eq!(response["allowed"], true, "{response}");

    // Exempt: decided on who writes, whatever the object holds.
    let body = review_text(
        "admin",
        &["system:masters"],
        &with(&deep, 1, "{}"),
        &with(&deeper, 9, "{}"),
    );
    assert_eq!(review(router(), "/validate", body).await["allowed"], true);

    // Another writer's deep owned value changes: denied, naming it.
    let body = review_text(SCALER, &[], &with("1", 1, &deep), &with("1", 1, &deeper));
    let response = review(router(), "/validate", body).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 409);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("status.summary")
    );

    // Unchanged deep owned values are equal, at any depth.
    let body = review_text(SCALER, &[], &with(&deeper, 1, &deep), &with(&deep, 1, &deep));
    assert_eq!(review(router(), "/validate", body).await["allowed"], true);
}

#[tokio::test]
async fn nesting_beyond_what_the_api_server_stores_is_denied_in_the_review() {
    let router = admission::router(app_with_rules(), None);
    let far = nested(20_000, "1");
    let body = review_text(SCALER, &[], &format!(r#"{{"summary":{far}}}"#), r#"{"summary":1}"#);
    let response = review(router, "/validate", body).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("nested 20001 levels deep"), "{message}");
}

#[tokio::test]
async fn serve_reads_a_configmap_manifest_like_check_and_review() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: statusguard}}\ndata:\n  ownership.yaml: |\n{}",
        EMBEDDED_OWNERSHIP
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    let path = dir.path().join("configmap.yaml");
    std::fs::write(&path, manifest).unwrap();
    let mut config = statusguard::server::config::ServeConfig {
        rules: RulesSource::File(path),
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        certs: statusguard::server::config::CertSource::Generated {
            sans: vec![],
            write_ca: None,
        },
        tls_reload_interval: Duration::from_secs(2),
        limits: Limits {
            max_body_bytes: 1024,
            header_read_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            ..Limits::default()
        },
        client_ca_file: None,
        shutdown_timeout: Duration::from_secs(1),
        shutdown_delay: Duration::ZERO,
        registration: None,
        policy_registration: None,
        observe: Default::default(),
    };
    let server = statusguard::server::Server::bind(config.clone()).await.unwrap();
    assert_eq!(
        server.app().rules.current().as_deref(),
        Some(&RulesSource::Embedded.load_local().unwrap())
    );
    config.rules = RulesSource::File(dir.path().join("missing.yaml"));
    let err = statusguard::server::Server::bind(config).await.err().unwrap();
    assert!(err.to_string().contains("missing.yaml"), "{err}");
}

/// Found under the stress harness's load: the SIGTERM handler was only
/// installed when the accept loop first polled its stop future, so a
/// SIGTERM right after the first connection was taken (the loop not yet
/// back to its select) ended the process without a drain. The handlers are
/// now installed by the call itself. (On a regression this test's process
/// dies of the signal.)
#[tokio::test]
async fn the_shutdown_signal_is_listened_for_from_the_call_not_the_first_poll() {
    let shutdown = statusguard::server::shutdown::shutdown_signal(|| {});
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("the SIGTERM sent before the first poll is seen");
}
