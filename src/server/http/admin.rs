//! The plain-HTTP admin port: probes and metrics, outside the webhook's TLS.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::server::state::App;

/// The admin port's routes: `/healthz`, `/readyz`, `/metrics`, and
/// `/observed` (who changed which status items, as JSON).
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/observed", get(observed))
        .with_state(app)
}

async fn observed(State(app): State<Arc<App>>) -> impl IntoResponse {
    axum::Json(app.observations.snapshot())
}

async fn readyz(State(app): State<Arc<App>>) -> impl IntoResponse {
    match app.readiness() {
        Ok(()) => {
            // Ready, but say so when the rules in force are older than the source.
            let body = match app.rules.problem() {
                Some(problem) => format!(
                    "ready (rules generation {}; stale: {problem})\n",
                    app.rules.generation()
                ),
                None => format!("ready (rules generation {})\n", app.rules.generation()),
            };
            (StatusCode::OK, body)
        }
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
}
