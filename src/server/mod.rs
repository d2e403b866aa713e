//! `statusguard serve`: the TLS admission webhook and its admin port.
//!
//! Plumbing around the pure decision: TLS with certificate reload, the
//! rules source, probes, metrics, graceful shutdown.

mod admin;
mod admission;
pub mod rules;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use admin::router as admin_router;
pub use admission::router as admission_router;
use rules::RuleStore;

use crate::metrics::Metrics;
use crate::ownership::Ownership;
use crate::tls::{self, CertFiles, SwappableCert};

/// The example ownership document, compiled in: the rules `serve` uses when
/// no source is named, so that it runs on a fresh machine with no setup.
pub const EMBEDDED_OWNERSHIP: &str = include_str!("../../examples/ownership.yaml");

/// Where the ownership rules come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulesSource {
    Embedded,
    File(PathBuf),
    ConfigMap { namespace: String, name: String },
}

/// Everything `serve` needs; the CLI fills it from flags and environment.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub rules: RulesSource,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Certificate and key files; `None` makes a development CA and certificate.
    pub tls_files: Option<CertFiles>,
    pub tls_reload_interval: Duration,
    /// With generated certificates: where to write the CA that verifies them.
    pub write_ca: Option<PathBuf>,
    pub tls_sans: Vec<String>,
    pub max_body_bytes: usize,
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
    pub shutdown_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot write the CA to {path}: {source}")]
    WriteCa { path: PathBuf, source: std::io::Error },
    #[error("cannot read the ownership document {path}: {source}")]
    ReadRules { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Rules {
        path: String,
        source: crate::ownership::OwnershipError,
    },
    #[error("cannot reach the Kubernetes API for --configmap (in-cluster config, or KUBECONFIG): {0}")]
    Kube(#[from] kube::Error),
}

/// State shared by the handlers.
#[derive(Debug)]
pub struct App {
    pub rules: RuleStore,
    pub metrics: Arc<Metrics>,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    tls_ready: AtomicBool,
    shutting_down: AtomicBool,
}

impl App {
    pub fn new(metrics: Arc<Metrics>, max_body_bytes: usize, request_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            rules: RuleStore::new(metrics.clone()),
            metrics,
            max_body_bytes,
            request_timeout,
            tls_ready: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
        })
    }

    /// `Ok` when the webhook should receive traffic, else why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err("shutting down".into());
        }
        if !self.tls_ready.load(Ordering::SeqCst) {
            return Err("TLS is not ready".into());
        }
        if self.rules.current().is_none() {
            let why = self.rules.problem().map(|p| p.to_string()).unwrap_or_default();
            return Err(format!("no ownership rules loaded: {why}"));
        }
        Ok(())
    }

    pub fn set_tls_ready(&self) {
        self.tls_ready.store(true, Ordering::SeqCst);
    }
}

/// A server with its sockets bound, ready to [`run`](Server::run).
pub struct Server {
    app: Arc<App>,
    config: ServeConfig,
    tls_listener: TcpListener,
    admin_listener: TcpListener,
    acceptor: TlsAcceptor,
    cert_watch: Option<(CertFiles, Arc<SwappableCert>, tls::PemPair)>,
    /// Cluster mode: the client and the ConfigMap to watch.
    configmap_watch: Option<(kube::Client, String, String)>,
}

impl Server {
    /// Loads TLS and (for a static source) the rules, and binds both ports.
    pub async fn bind(config: ServeConfig) -> Result<Self, ServerError> {
        let metrics = Arc::new(Metrics::default());
        let app = App::new(metrics, config.max_body_bytes, config.request_timeout);

        let mut configmap_watch = None;
        match &config.rules {
            RulesSource::Embedded => {
                let rules = parse_rules("the embedded example", EMBEDDED_OWNERSHIP)?;
                tracing::info!(summary = %rules.summary(), "no --ownership or --configmap: using the embedded example ownership document");
                app.rules.replace(rules);
            }
            RulesSource::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ServerError::ReadRules {
                    path: path.clone(),
                    source,
                })?;
                let rules = parse_rules(&path.display().to_string(), &text)?;
                tracing::info!(path = %path.display(), summary = %rules.summary(), "ownership rules loaded");
                app.rules.replace(rules);
            }
            RulesSource::ConfigMap { namespace, name } => {
                // Not ready until the watch delivers a first valid document.
                let client = kube::Client::try_default().await?;
                app.rules.waiting(format!(
                    "waiting for the first valid document from ConfigMap {namespace}/{name}"
                ));
                configmap_watch = Some((client, namespace.clone(), name.clone()));
            }
        }

        let (resolver, cert_watch) = match &config.tls_files {
            Some(files) => {
                let (key, loaded) = files.load()?;
                let resolver = SwappableCert::new(key);
                tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "serving TLS from files, reloaded when they change");
                (resolver.clone(), Some((files.clone(), resolver, loaded)))
            }
            None => {
                let generated = tls::generate_certificates(&config.tls_sans)?;
                let path = std::path::Path::new("generated");
                let key = tls::certified_key(generated.cert_pem.as_bytes(), generated.key_pem.as_bytes(), path, path)?;
                if let Some(path) = &config.write_ca {
                    std::fs::write(path, &generated.ca_pem).map_err(|source| ServerError::WriteCa {
                        path: path.clone(),
                        source,
                    })?;
                    tracing::info!(path = %path.display(), "wrote the CA that verifies the generated certificate");
                }
                tracing::info!(sans = ?config.tls_sans, "no --tls-cert/--tls-key: serving a certificate generated at start for localhost, 127.0.0.1, ::1 and --tls-san");
                (SwappableCert::new(key), None)
            }
        };
        let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(resolver)?));

        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })
        };
        let tls_listener = bind(config.listen).await?;
        let admin_listener = bind(config.admin_listen).await?;
        app.set_tls_ready();
        Ok(Self {
            app,
            config,
            tls_listener,
            admin_listener,
            acceptor,
            cert_watch,
            configmap_watch,
        })
    }

    pub fn tls_addr(&self) -> SocketAddr {
        self.tls_listener.local_addr().unwrap_or(self.config.listen)
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener.local_addr().unwrap_or(self.config.admin_listen)
    }

    pub fn app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// Serves until `shutdown` resolves; then readiness turns 503, no new
    /// connection is accepted, and in-flight requests finish (up to the
    /// shutdown timeout) before this returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            app,
            config,
            tls_listener,
            admin_listener,
            acceptor,
            cert_watch,
            configmap_watch,
        } = self;
        tracing::info!(tls = %tls_listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            admin = %admin_listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "statusguard serving");

        let mut background = tokio::task::JoinSet::new();
        if let Some((files, resolver, loaded)) = cert_watch {
            let metrics = app.metrics.clone();
            background.spawn(files.watch(resolver, loaded, config.tls_reload_interval, move |r| {
                metrics.tls_reload(r.is_ok())
            }));
        }
        if let Some((client, namespace, name)) = configmap_watch {
            background.spawn(watch::watch_configmap(client, namespace, name, app.clone()));
        }
        let admin = admin::router(app.clone());
        background.spawn(async move {
            if let Err(e) = axum::serve(admin_listener, admin).await {
                tracing::error!(error = %e, "the admin server stopped");
            }
        });

        let service = TowerToHyperService::new(admission::router(app.clone()));
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        let builder = Arc::new(builder);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();

        tokio::pin!(shutdown);
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = tls_listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let acceptor = acceptor.clone();
            let builder = builder.clone();
            let service = service.clone();
            let watcher = graceful.watcher();
            let handshake_timeout = config.header_read_timeout;
            tokio::spawn(async move {
                // Plain HTTP, a stalled client or a bad certificate request
                // ends here, before any HTTP is read: never answered.
                let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                let conn = builder.serve_connection(TokioIo::new(tls), service);
                if let Err(e) = watcher.watch(conn.into_owned()).await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }

        app.shutting_down.store(true, Ordering::SeqCst);
        drop(tls_listener);
        tracing::info!("shutting down: readiness is 503, draining in-flight requests");
        if tokio::time::timeout(config.shutdown_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(timeout = ?config.shutdown_timeout, "in-flight requests did not finish in time");
        }
        background.shutdown().await;
        tracing::info!("statusguard stopped");
    }
}

fn parse_rules(origin: &str, text: &str) -> Result<Ownership, ServerError> {
    Ownership::from_yaml(text).map_err(|source| ServerError::Rules {
        path: origin.to_owned(),
        source,
    })
}

/// Resolves at the first SIGTERM or SIGINT; a second one exits at once.
pub async fn shutdown_signal() {
    first_signal().await;
    tokio::spawn(async {
        first_signal().await;
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130);
    });
}

async fn first_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
