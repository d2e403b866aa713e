//! The plain-HTTP admin port: probes and metrics, outside the webhook's TLS,
//! served on a thread and runtime of its own.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

use crate::server::state::App;

/// The admin port, bound, on a runtime of its own: one worker thread.
///
/// Whatever floods the webhook's port keeps the main runtime's workers
/// busy, and the kubelet restarts a pod whose liveness probe does not
/// answer. Apart, the probes (and the metrics that show the flood) are
/// answered within the operating system's share of a core.
pub struct AdminPort {
    listener: TcpListener,
    runtime: AdminRuntime,
}

/// Serves the admin port until dropped.
pub struct AdminServing {
    _runtime: AdminRuntime,
}

/// A runtime that may be dropped from async code (a runtime's own drop
/// waits for its workers, which async code may not do).
struct AdminRuntime(Option<Runtime>);

impl Drop for AdminRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl AdminPort {
    /// Starts the runtime and binds `addr` on it.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("admin")
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            super::accept::listen(addr)?
        };
        Ok(Self {
            listener,
            runtime: AdminRuntime(Some(runtime)),
        })
    }

    /// The bound address (the real port when 0 was asked for).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves the routes below on the port's own runtime.
    pub fn serve(self, app: Arc<App>) -> AdminServing {
        let Self { listener, runtime } = self;
        if let Some(handle) = runtime.0.as_ref().map(Runtime::handle) {
            handle.spawn(async move {
                if let Err(e) = axum::serve(listener, router(app)).await {
                    tracing::error!(error = %e, "the admin server stopped");
                }
            });
        }
        AdminServing { _runtime: runtime }
    }
}

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
