//! What `statusguard serve` is told: the CLI fills a [`ServeConfig`] from
//! flags and environment, tests build one directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use crate::cluster::certs::files::{CertFiles, ClientCaFile};
use crate::cluster::certs::secret::{self as ca, ManagedCerts};
use crate::cluster::certs::tls::{self, SwappableCert};
use crate::cluster::observer::ObserveConfig;
use crate::cluster::registration::desired::Registration;
use crate::cluster::registration::policies::PolicyRegistration;
use crate::rules::{ConfigMapRef, LoadError, RulesSource};
use crate::server::limits::{self, Limits};
use crate::server::state::App;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where the rules come from.
    pub rules: RulesSource,
    /// The HTTPS address of `/validate` and `/mutate`.
    pub listen: SocketAddr,
    /// The plain-HTTP address of the probes and metrics.
    pub admin_listen: SocketAddr,
    /// Where the serving certificate comes from.
    pub certs: CertSource,
    /// How often certificate files and the client CA file are checked for a change.
    pub tls_reload_interval: Duration,
    /// Callers of the TLS port must present a client certificate from a CA
    /// in this PEM bundle (re-read like certificate files); `None`: no
    /// client certificate is asked for.
    pub client_ca_file: Option<PathBuf>,
    /// What callers may make the server hold (connections, requests, bytes,
    /// threads) and how long they may take.
    pub limits: Limits,
    /// After the stop signal, how long readiness is 503 while new
    /// connections are still accepted and served: the time the endpoints
    /// controller and the API server need to stop sending here.
    pub shutdown_delay: Duration,
    /// After the stop signal, how long in-flight requests may take.
    pub shutdown_timeout: Duration,
    /// Keep these webhook configurations in step with the rules in force.
    pub registration: Option<Registration>,
    /// Keep the rules as admission policies of this set in step with the rules in force.
    pub policy_registration: Option<PolicyRegistration>,
    /// What the observer of status writes may do; its Events are sent only
    /// when the server talks to a cluster anyway (a ConfigMap, registration
    /// or certificates it keeps).
    pub observe: ObserveConfig,
}

/// Why the server could not start on its configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // each message names what its fields are
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot write the CA to {path}: {source}")]
    WriteCa { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Limits(#[from] limits::LimitsError),
    /// A local rules source is broken: the server does not start on it.
    #[error(transparent)]
    Rules(#[from] LoadError),
    #[error("--manage-certificates needs --webhook-target or --cert-name: the certificate must name the server")]
    NoCertificateNames,
    #[error(
        "cannot reach the Kubernetes API for --configmap or --register-webhooks (in-cluster config, or KUBECONFIG): {0}"
    )]
    Kube(#[from] kube::Error),
}

/// Where the serving certificate comes from: one of three, never a mix.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// PEM files, re-read when they change.
    Files(CertFiles),
    /// A CA and serving certificate the server keeps in a Secret its
    /// replicas share, renewed and rotated.
    Secret(ManagedCerts),
    /// Made at start for localhost, 127.0.0.1, ::1 and `sans` (development
    /// and tests).
    Generated {
        /// More names (DNS or IP) for the certificate.
        sans: Vec<String>,
        /// Where to write the CA that verifies it.
        write_ca: Option<PathBuf>,
    },
}

impl ServeConfig {
    /// The verifier of client certificates `client_ca_file` asks for; the
    /// loop that re-reads the file goes into `background`.
    pub(crate) fn client_verifier(
        &self,
        background: &mut Vec<BoxFuture<'static, ()>>,
    ) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, ServerError> {
        let Some(path) = &self.client_ca_file else {
            return Ok(None);
        };
        let file = ClientCaFile { path: path.clone() };
        let (target, loaded) = file.load()?;
        // Reported in the log only: the reload metric counts serving certificates.
        background.push(
            file.watch(target.clone(), loaded, self.tls_reload_interval, |_| {})
                .boxed(),
        );
        Ok(Some(target))
    }

    /// Whether the server talks to a Kubernetes API: for its ConfigMap, its
    /// webhook registration or its Secret.
    /// The ownership ConfigMap, in cluster mode: its writes are checked at
    /// the door (a route, and a webhook of the registration).
    pub(crate) fn ownership_configmap(&self) -> Option<&ConfigMapRef> {
        match &self.rules {
            RulesSource::ConfigMap(configmap) => Some(configmap),
            _ => None,
        }
    }

    pub(crate) fn needs_cluster(&self) -> bool {
        matches!(self.rules, RulesSource::ConfigMap(_))
            || self.registration.is_some()
            || self.policy_registration.is_some()
            || matches!(self.certs, CertSource::Secret(_))
    }
}

impl CertSource {
    /// The certificate to serve; for files and a Secret, the loop that keeps
    /// it current goes into `background`.
    pub(crate) async fn load(
        &self,
        reload_interval: Duration,
        app: &Arc<App>,
        client: Option<&kube::Client>,
        background: &mut Vec<BoxFuture<'static, ()>>,
    ) -> Result<Arc<SwappableCert>, ServerError> {
        match self {
            CertSource::Secret(managed) => {
                if managed.policy.names.is_empty() {
                    return Err(ServerError::NoCertificateNames);
                }
                let client = match client {
                    Some(client) => client.clone(),
                    None => kube::Client::try_default().await?,
                };
                tracing::info!(secret = %managed.secret, names = ?managed.policy.names, "keeping the serving certificates in a Secret");
                // The ports (and the probes) open at once; readiness waits
                // for the first certificate, which the loop reads (and, if
                // the Secret is gone or damaged, repairs) with backoff: an
                // unreachable Secret is no crash loop.
                let target = SwappableCert::empty();
                app.ready_when_serving(target.clone(), format!("Secret {}", managed.secret));
                let published = app.certificates_published();
                background.push(ca::keep(client, managed.clone(), target.clone(), published, None).boxed());
                Ok(target)
            }
            CertSource::Files(files) => {
                let (key, loaded) = files.load()?;
                let target = SwappableCert::new(key);
                tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "serving TLS from files, reloaded when they change");
                let metrics = app.metrics.clone();
                let reload = files.clone().watch(target.clone(), loaded, reload_interval, move |r| {
                    metrics.tls_reload(r.is_ok())
                });
                background.push(reload.boxed());
                Ok(target)
            }
            CertSource::Generated { sans, write_ca } => {
                let (key, generated) = tls::generated(sans)?;
                if let Some(path) = write_ca {
                    std::fs::write(path, &generated.ca_pem).map_err(|source| ServerError::WriteCa {
                        path: path.clone(),
                        source,
                    })?;
                    tracing::info!(path = %path.display(), "wrote the CA that verifies the generated certificate");
                }
                tracing::info!(
                    ?sans,
                    "no --tls-cert/--tls-key: serving a certificate generated at start for localhost, 127.0.0.1, ::1 and --tls-san"
                );
                Ok(SwappableCert::new(key))
            }
        }
    }
}
