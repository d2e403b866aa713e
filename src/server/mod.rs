//! `statusguard serve`: the TLS admission webhook and its admin port.
//!
//! Wiring only. The parts: [`app`] (shared state), [`accept`] (the TLS
//! accept loop), [`admission`] (the webhook endpoints), [`admin`] (probes and
//! metrics), [`watch`] (the ConfigMap of cluster mode), [`register`] (the
//! webhook configurations, kept in step with the rules). The decision itself
//! is [`crate::admission::answer::answer`].

pub mod accept;
pub mod admin;
pub mod admission;
pub mod app;
pub mod ca;
pub mod crds;
pub mod limits;
pub mod observer;
pub mod register;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use app::App;

use crate::metrics::Metrics;
use crate::rules::{ConfigMapRef, LoadError, RulesSource};
use crate::tls::{self, CertFiles, ClientCaFile, PemFiles, SwappableCert, SwappableClientVerifier};
use crate::webhooks::Registration;

/// Everything `serve` needs; the CLI fills it from flags and environment.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where the rules come from.
    pub rules: RulesSource,
    /// The HTTPS address of `/validate` and `/mutate`.
    pub listen: SocketAddr,
    /// The plain-HTTP address of the probes and metrics.
    pub admin_listen: SocketAddr,
    /// Certificate and key files; `None` makes a development CA and certificate.
    pub tls_files: Option<CertFiles>,
    /// How often the certificate files and the client CA file are checked for a change.
    pub tls_reload_interval: Duration,
    /// With generated certificates: where to write the CA that verifies them.
    pub write_ca: Option<PathBuf>,
    /// More names for a generated certificate.
    pub tls_sans: Vec<String>,
    /// What callers may make the server hold (connections, requests, bytes,
    /// threads) and how long they may take.
    pub limits: limits::Limits,
    /// Callers of the TLS port must present a client certificate from a CA
    /// in this PEM bundle (re-read like `tls_files`); `None`: no client
    /// certificate is asked for.
    pub client_ca_file: Option<PathBuf>,
    /// After the stop signal, how long readiness is 503 while new
    /// connections are still accepted and served: the time the endpoints
    /// controller and the API server need to stop sending here.
    pub shutdown_delay: Duration,
    /// After the stop signal, how long in-flight requests may take.
    pub shutdown_timeout: Duration,
    /// Keep these webhook configurations in step with the rules in force.
    pub registration: Option<Registration>,
    /// Keep a CA and serving certificate in this Secret (instead of `tls_files`).
    pub managed_certs: Option<ca::ManagedCerts>,
    /// What the observer of status writes may do; its Events are sent only
    /// when the server talks to a cluster anyway (a ConfigMap, registration
    /// or certificates it keeps).
    pub observe: observer::ObserveConfig,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The certificate could not be loaded or made.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// `--write-ca` could not be written.
    #[error("cannot write the CA to {path}: {source}")]
    WriteCa {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The limits contradict each other.
    #[error(transparent)]
    Limits(#[from] limits::LimitsError),
    /// A local rules source is broken: the server does not start on it.
    #[error(transparent)]
    Rules(#[from] LoadError),
    /// --manage-certificates with no name to put in the certificate.
    #[error("--manage-certificates needs --webhook-target or --cert-name: the certificate must name the server")]
    NoCertificateNames,
    /// The managed certificates do not load.
    #[error("the managed certificates do not load: {0}")]
    ManagedCerts(String),
    /// Cluster mode without a reachable cluster configuration.
    #[error(
        "cannot reach the Kubernetes API for --configmap or --register-webhooks (in-cluster config, or KUBECONFIG): {0}"
    )]
    Kube(#[from] kube::Error),
}

/// Certificate files and what was last loaded from them.
struct CertReload {
    files: CertFiles,
    target: Arc<SwappableCert>,
    loaded: PemFiles,
}

/// The client CA bundle and what was last loaded from it.
struct ClientCaReload {
    file: ClientCaFile,
    target: Arc<SwappableClientVerifier>,
    loaded: Vec<u8>,
}

/// Cluster mode: the ConfigMap to watch, and the client to watch it with.
struct ConfigMapWatch {
    client: kube::Client,
    configmap: ConfigMapRef,
}

/// A server with its sockets bound, ready to [`run`](Server::run).
pub struct Server {
    app: Arc<App>,
    config: ServeConfig,
    tls_listener: TcpListener,
    admin_listener: TcpListener,
    acceptor: TlsAcceptor,
    cert_reload: Option<CertReload>,
    client_ca_reload: Option<ClientCaReload>,
    configmap_watch: Option<ConfigMapWatch>,
    registration: Option<(kube::Client, Registration)>,
    managed_certs: Option<(kube::Client, ca::ManagedCerts, Arc<SwappableCert>, crate::certs::Stored)>,
    /// For the Events of denied and trimmed writes.
    client: Option<kube::Client>,
}

impl Server {
    /// Loads TLS and (for a local source) the rules, and binds both ports.
    pub async fn bind(config: ServeConfig) -> Result<Self, ServerError> {
        config.limits.check()?;
        // What /observed counts can be forged unless callers are authenticated.
        let observe = observer::ObserveConfig {
            authenticated_callers: config.client_ca_file.is_some(),
            ..config.observe.clone()
        };
        let app = App::new(Arc::new(Metrics::default()), config.limits.clone(), observe);

        let needs_client = matches!(config.rules, RulesSource::ConfigMap(_))
            || config.registration.is_some()
            || config.managed_certs.is_some();
        let client = match needs_client {
            true => Some(kube::Client::try_default().await?),
            false => None,
        };
        let registration = config
            .registration
            .clone()
            .zip(client.clone())
            .map(|(registration, client)| (client, registration));
        let configmap_watch = match (&config.rules, client.clone()) {
            (RulesSource::ConfigMap(configmap), Some(client)) => {
                // Not ready until the watch delivers a first valid document.
                app.rules.waiting(format!(
                    "waiting for the first valid document from ConfigMap {configmap}"
                ));
                Some(ConfigMapWatch {
                    client,
                    configmap: configmap.clone(),
                })
            }
            (local, _) => {
                let rules = local.load_local()?;
                tracing::info!(source = %local, summary = %rules.summary(), "ownership rules loaded");
                app.rules.replace(rules);
                None
            }
        };

        let mut managed_certs = None;
        let (resolver, cert_reload) = match (&config.tls_files, config.managed_certs.clone().zip(client.clone())) {
            (_, Some((managed, client))) => {
                if managed.policy.names.is_empty() {
                    return Err(ServerError::NoCertificateNames);
                }
                tracing::info!(secret = %managed.secret, names = ?managed.policy.names, "keeping the serving certificates in a Secret");
                let stored = ca::first(&client, &managed).await;
                let key = ca::serving_key(&stored).map_err(|e| ServerError::ManagedCerts(e.to_string()))?;
                let target = SwappableCert::new(key);
                ca::publish(&stored, &app);
                managed_certs = Some((client, managed, target.clone(), stored));
                (target, None)
            }
            (Some(files), None) => {
                let (key, loaded) = files.load()?;
                let target = SwappableCert::new(key);
                tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "serving TLS from files, reloaded when they change");
                let reload = CertReload {
                    files: files.clone(),
                    target: target.clone(),
                    loaded,
                };
                (target, Some(reload))
            }
            (None, None) => {
                let generated = tls::generate_certificates(&config.tls_sans)?;
                let key = tls::certified_key(&PemFiles::generated(&generated))?;
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
        let client_ca_reload = match &config.client_ca_file {
            Some(path) => {
                let file = ClientCaFile { path: path.clone() };
                let (target, loaded) = file.load()?;
                Some(ClientCaReload { file, target, loaded })
            }
            None => None,
        };
        let clients = client_ca_reload
            .as_ref()
            .map(|reload| reload.target.clone() as Arc<dyn rustls::server::danger::ClientCertVerifier>);
        let acceptor = TlsAcceptor::from(Arc::new(tls::server_config_verifying_clients(resolver, clients)?));

        let listen = |addr| accept::listen(addr).map_err(|source| ServerError::Bind { addr, source });
        let tls_listener = listen(config.listen)?;
        let admin_listener = listen(config.admin_listen)?;
        Ok(Self {
            app,
            config,
            tls_listener,
            admin_listener,
            acceptor,
            cert_reload,
            client_ca_reload,
            configmap_watch,
            registration,
            managed_certs,
            client,
        })
    }

    /// The bound HTTPS address (the real port when 0 was asked for).
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls_listener.local_addr().unwrap_or(self.config.listen)
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener.local_addr().unwrap_or(self.config.admin_listen)
    }

    /// The shared state, for tests and embedding.
    pub fn app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// Serves until `shutdown` resolves; then readiness turns 503 at once,
    /// new connections are still accepted and served for the shutdown
    /// delay, then none is accepted, and in-flight requests finish (up to
    /// the shutdown timeout) before this returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            app,
            config,
            tls_listener,
            admin_listener,
            acceptor,
            cert_reload,
            client_ca_reload,
            configmap_watch,
            registration,
            managed_certs,
            client,
        } = self;
        let callers = match &config.client_ca_file {
            Some(path) => format!("authenticated: a client certificate from a CA in {}", path.display()),
            None => "unauthenticated: no client certificate asked for (--client-ca-file)".to_owned(),
        };
        tracing::info!(tls = %tls_listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            admin = %admin_listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), %callers, "statusguard serving");

        let mut background = tokio::task::JoinSet::new();
        if let Some(CertReload { files, target, loaded }) = cert_reload {
            let metrics = app.metrics.clone();
            background.spawn(files.watch(target, loaded, config.tls_reload_interval, move |r| {
                metrics.tls_reload(r.is_ok())
            }));
        }
        if let Some(ClientCaReload { file, target, loaded }) = client_ca_reload {
            // Reported in the log only: the reload metric counts serving certificates.
            background.spawn(file.watch(target, loaded, config.tls_reload_interval, |_| {}));
        }
        if let Some(ConfigMapWatch { client, configmap }) = configmap_watch {
            background.spawn(watch::watch_configmap(client, configmap, app.clone()));
        }
        if let Some((client, managed, target, stored)) = managed_certs {
            background.spawn(ca::keep(client, managed, target, app.clone(), stored));
        }
        if let Some((client, registration)) = registration {
            background.spawn(register::keep_registered(client, registration, app.clone()));
        }
        app.observations.spawn(app.metrics.clone(), client, &mut background);
        let admin = admin::router(app.clone());
        background.spawn(async move {
            if let Err(e) = axum::serve(admin_listener, admin).await {
                tracing::error!(error = %e, "the admin server stopped");
            }
        });

        let limits = accept::AcceptLimits::of(&config.limits);
        let delay = config.shutdown_delay;
        let stop_accepting = {
            let app = app.clone();
            async move {
                shutdown.await;
                app.start_shutdown();
                if !delay.is_zero() {
                    tracing::info!(delay = ?delay, "shutting down: readiness is 503; still serving until the delay is over, so that no caller is turned away");
                    tokio::time::sleep(delay).await;
                }
            }
        };
        let open = accept::serve_tls(
            tls_listener,
            acceptor,
            admission::router(app.clone()),
            limits,
            stop_accepting,
        )
        .await;

        tracing::info!("shutting down: no new connection is accepted, draining in-flight requests");
        if tokio::time::timeout(config.shutdown_timeout, open.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(timeout = ?config.shutdown_timeout, "in-flight requests did not finish in time");
        }
        background.shutdown().await;
        tracing::info!("statusguard stopped");
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
