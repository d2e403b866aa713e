//! The webhook endpoints: read the body, parse, decide, record, answer.
//! The decision itself is [`crate::decision::decide`].

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::App;
use crate::decision::{Decision, Endpoint, Outcome, decide};
use crate::review::{encode_response, parse_request};

/// The TLS port's routes. Any other method on these paths gets 405, any
/// other path 404 (axum's defaults).
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/validate", post(|State(app), req| admit(app, Endpoint::Validate, req)))
        .route("/mutate", post(|State(app), req| admit(app, Endpoint::Mutate, req)))
        .with_state(app)
}

fn plain(status: StatusCode, reason: impl std::fmt::Display) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{reason}\n"),
    )
        .into_response()
}

async fn admit(app: Arc<App>, endpoint: Endpoint, request: Request) -> Response {
    let body = match read_body(&app, request.into_body()).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let started = Instant::now();
    match answer(&app, endpoint, &body) {
        Ok(response) => response,
        Err((status, reason)) => {
            app.metrics.error(endpoint, started.elapsed());
            plain(status, reason)
        }
    }
}

/// Reads the whole body within the size limit and the request timeout.
async fn read_body(app: &App, body: Body) -> Result<Bytes, Response> {
    let limit = app.max_body_bytes;
    let read = tokio::time::timeout(app.request_timeout, axum::body::to_bytes(body, limit)).await;
    match read {
        Err(_) => Err(plain(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        )),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if is_length_limit(&e) => Err(plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {limit} bytes"),
        )),
        Ok(Err(e)) => Err(plain(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        )),
    }
}

fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The answer to a review, or the status and one-line reason of a bad one.
fn answer(app: &App, endpoint: Endpoint, body: &[u8]) -> Result<Response, (StatusCode, String)> {
    let started = Instant::now();
    let bad = |e: &dyn std::fmt::Display| (StatusCode::BAD_REQUEST, e.to_string());
    let request = parse_request(body).map_err(|e| bad(&e))?;
    let Some(rules) = app.rules.current() else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "no ownership rules loaded yet".to_owned(),
        ));
    };
    let decision = decide(&rules, &request, endpoint).map_err(|e| bad(&e))?;
    log_decision(endpoint, &request, &decision);
    let (group, resource) = (&request.resource.group, &request.resource.resource);
    app.metrics
        .decision(endpoint, &decision, group, resource, started.elapsed());
    let body = encode_response(decision.response).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// One line per decision that denied, trimmed or warned; nothing from the
/// object itself beyond its name, and nothing secret.
fn log_decision(
    endpoint: Endpoint,
    request: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
    decision: &Decision,
) {
    if !matches!(decision.outcome, Outcome::Denied | Outcome::Trimmed | Outcome::Warned) {
        return;
    }
    let violated: Vec<String> = decision.violations.iter().map(ToString::to_string).collect();
    tracing::info!(
        uid = %request.uid,
        endpoint = endpoint.as_str(),
        decision = decision.outcome.as_str(),
        group = %request.resource.group,
        resource = %request.resource.resource,
        name = %request.name,
        namespace = request.namespace.as_deref().unwrap_or(""),
        writer = %decision.writer,
        dry_run = request.dry_run,
        violations = %violated.join("; "),
        "status write {}", decision.outcome.as_str()
    );
}
