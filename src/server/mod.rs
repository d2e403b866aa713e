//! `statusguard serve`: the TLS admission webhook and its admin port.
//!
//! Wiring only: [`Server::bind`] loads what must be there before serving
//! (the certificate, local rules, the ports) and prepares every loop beside
//! the request path; [`Server::run`] starts them and serves until the stop
//! signal ([`shutdown`]). The parts: [`config`] (what to serve), [`state`]
//! (what the handlers share), [`http`] (the two ports), [`limits`] (what a
//! caller may make the server hold), and `crate::cluster` (what it keeps in
//! step with the cluster). The decision itself is [`crate::admission::answer::answer`].

pub mod config;
pub mod http;
pub mod limits;
pub mod shutdown;
pub mod state;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::cluster::certs::tls;
use crate::cluster::config_watch::watch_configmap;
use crate::cluster::events::Events;
use crate::cluster::observer::{ObserveConfig, ObserverLoop};
use crate::cluster::registration::Switch;
use crate::cluster::registration::keep::{Inputs, keep_registered};
use crate::cluster::registration::policies::keep_policies;
use crate::metrics::Metrics;
use crate::rules::RulesSource;
use config::{ServeConfig, ServerError};
use state::App;

/// A server with its sockets bound, ready to [`run`](Server::run).
pub struct Server {
    app: Arc<App>,
    config: ServeConfig,
    tls_listener: TcpListener,
    admin_port: http::admin::AdminPort,
    acceptor: TlsAcceptor,
    /// The loops beside the request path, started by `run`.
    background: Vec<BoxFuture<'static, ()>>,
    observer: ObserverLoop,
    events: Option<Events>,
}

impl Server {
    /// Loads TLS and (for a local source) the rules, and binds both ports.
    pub async fn bind(config: ServeConfig) -> Result<Self, ServerError> {
        config.limits.check()?;
        // What /observed counts can be forged unless callers are authenticated.
        let observe = ObserveConfig {
            authenticated_callers: config.client_ca_file.is_some(),
            ..config.observe.clone()
        };
        let (app, observer) = App::new(Arc::new(Metrics::default()), config.limits.clone(), observe);
        let client = match config.needs_cluster() {
            true => Some(kube::Client::try_default().await?),
            false => None,
        };
        let events = client.clone().map(Events::new);
        let mut background = Vec::new();

        let (switch, switch_followed) = watch::channel(Switch::Enabled);
        match (&config.rules, &client, &events) {
            (RulesSource::ConfigMap(configmap), Some(client), Some(events)) => {
                // Not ready until the watch delivers a first valid document.
                app.rules.waiting(format!(
                    "waiting for the first valid document from ConfigMap {configmap}"
                ));
                let watch = watch_configmap(
                    client.clone(),
                    configmap.clone(),
                    app.rules.clone(),
                    switch,
                    events.clone(),
                );
                background.push(watch.boxed());
            }
            (local, _, _) => {
                let rules = local.load_local()?;
                tracing::info!(source = %local, summary = %rules.summary(), "ownership rules loaded");
                app.rules.replace(rules);
            }
        }
        if let (Some(policies), Some(client)) = (config.policy_registration.clone(), &client) {
            let switch = switch_followed.clone();
            let metrics = app.metrics.clone();
            background.push(keep_policies(client.clone(), policies, metrics, app.rules.clone(), switch).boxed());
        }
        if let (Some(mut registration), Some(client)) = (config.registration.clone(), &client) {
            registration.ownership_configmap = config.ownership_configmap().cloned();
            let inputs = Inputs {
                rules: app.rules.clone(),
                switch: switch_followed,
                trust_bundle: app.trust_bundle(),
            };
            background.push(keep_registered(client.clone(), registration, app.metrics.clone(), inputs).boxed());
        }

        let resolver = config
            .certs
            .load(config.tls_reload_interval, &app, client.as_ref(), &mut background)
            .await?;
        let clients = config.client_verifier(&mut background)?;
        let acceptor = TlsAcceptor::from(Arc::new(tls::server_config_verifying_clients(resolver, clients)?));

        let listen = |addr| http::accept::listen(addr).map_err(|source| ServerError::Bind { addr, source });
        let tls_listener = listen(config.listen)?;
        let admin_port = http::admin::AdminPort::bind(config.admin_listen).map_err(|source| ServerError::Bind {
            addr: config.admin_listen,
            source,
        })?;
        Ok(Self {
            app,
            config,
            tls_listener,
            admin_port,
            acceptor,
            background,
            observer,
            events,
        })
    }

    /// The bound HTTPS address (the real port when 0 was asked for).
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls_listener.local_addr().unwrap_or(self.config.listen)
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_port.local_addr().unwrap_or(self.config.admin_listen)
    }

    /// The shared state, for tests and embedding.
    pub fn app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// Serves until `shutdown` resolves, then drains (see [`shutdown`]).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let config = self.config;
        let callers = match &config.client_ca_file {
            Some(path) => format!("authenticated: a client certificate from a CA in {}", path.display()),
            None => "unauthenticated: no client certificate asked for (--client-ca-file)".to_owned(),
        };
        tracing::info!(tls = %self.tls_listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            admin = %self.admin_port.local_addr().map(|a| a.to_string()).unwrap_or_default(), %callers, "statusguard serving");

        let mut tasks = tokio::task::JoinSet::new();
        for task in self.background {
            tasks.spawn(task);
        }
        self.observer.spawn(self.app.metrics.clone(), self.events, &mut tasks);
        // Held until the server has drained: dropping it stops the admin port.
        let _admin = self.admin_port.serve(self.app.clone());

        let stop_accepting = shutdown::stop_accepting(self.app.clone(), shutdown, config.shutdown_delay);
        let limits = http::accept::AcceptLimits::of(&config.limits);
        let router = http::admission::router(self.app, config.ownership_configmap().cloned());
        let open = http::accept::serve_tls(self.tls_listener, self.acceptor, router, limits, stop_accepting).await;
        shutdown::drain(open, config.shutdown_timeout).await;
        tasks.shutdown().await;
        tracing::info!("statusguard stopped");
    }
}
