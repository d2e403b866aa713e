//! Stopping without turning a caller away: the signals that start it, and
//! the drain that follows.
//!
//! At the first SIGTERM or SIGINT readiness turns 503 at once; new
//! connections are still accepted and served for the shutdown delay (while
//! the endpoints controller and the API server stop sending here); then none
//! is accepted, and in-flight requests finish, up to the shutdown timeout. A
//! second signal exits at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::server::http::accept::OpenConnections;
use crate::server::state::App;

/// Resolves when the server must stop accepting: `signal`, then readiness
/// 503 and the `delay` during which connections are still served.
pub(crate) async fn stop_accepting(app: Arc<App>, signal: impl Future<Output = ()>, delay: Duration) {
    signal.await;
    app.start_shutdown();
    if !delay.is_zero() {
        tracing::info!(delay = ?delay, "shutting down: readiness is 503; still serving until the delay is over, so that no caller is turned away");
        tokio::time::sleep(delay).await;
    }
}

/// Lets the in-flight requests of the `open` connections finish, for at
/// most `timeout`.
pub(crate) async fn drain(open: OpenConnections, timeout: Duration) {
    tracing::info!("shutting down: no new connection is accepted, draining in-flight requests");
    if tokio::time::timeout(timeout, open.drained()).await.is_err() {
        tracing::warn!(timeout = ?timeout, "in-flight requests did not finish in time");
    }
}

/// Resolves at the first SIGTERM or SIGINT. `on_second` runs if another
/// signal arrives afterwards (the binary exits at once then). The handlers
/// are registered by this call, not at the first poll: from the moment the
/// server can answer, a signal always means a graceful shutdown, never the
/// default exit.
pub fn shutdown_signal(on_second: impl FnOnce() + Send + 'static) -> impl Future<Output = ()> + Send {
    let mut signals = Signals::register();
    async move {
        signals.recv().await;
        tokio::spawn(async move {
            signals.recv().await;
            tracing::warn!("second signal: exiting at once");
            on_second();
        });
    }
}

/// SIGTERM and SIGINT, listened for from their registration on.
struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn register() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(signal) => Some(signal),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for {name}");
                    None
                }
            };
            Self {
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            // A signal that could not be listened for never arrives.
            async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.terminate) => {},
                _ = next(&mut self.interrupt) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
