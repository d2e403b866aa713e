//! The certificates the server keeps for itself ([`crate::certs`]), in one
//! Secret shared by every replica.
//!
//! Each replica reads the Secret every check interval, serves the
//! certificate it holds and publishes its trust bundle (which the webhook
//! registration writes into the `caBundle`). When [`crate::certs::next`]
//! says the Secret must change, the replica writes it with the
//! resourceVersion it read: of replicas racing, one write wins and the
//! others read the winner's certificates on their next pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt as _};
use rustls::sign::CertifiedKey;

use crate::certs::{CertPolicy, Step, Stored, keys, next};
use crate::rules::ConfigMapRef;
use crate::server::state::App;
use crate::tls::{CertFiles, PemFiles, SwappableCert, certified_key};

/// Where and how the server keeps its certificates.
#[derive(Debug, Clone)]
pub struct ManagedCerts {
    /// NAMESPACE/NAME of the Secret.
    pub secret: ConfigMapRef,
    /// What the certificates must be.
    pub policy: CertPolicy,
    /// How often the Secret is read again.
    pub check_interval: Duration,
}

/// Why the Secret could not be brought to what it should hold.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// The API server refused or could not be reached.
    #[error("Secret {secret}: {source}")]
    Kube {
        /// The Secret.
        secret: String,
        /// What the API server said.
        source: kube::Error,
    },
    /// Certificates could not be made.
    #[error(transparent)]
    Cert(#[from] crate::certs::CertError),
    /// What the Secret holds does not load as a serving certificate.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// Other replicas kept winning the write.
    #[error("Secret {0}: changed by others on every attempt")]
    Contended(String),
}

fn stored(secret: &Secret) -> Stored {
    let text = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default()
    };
    Stored {
        ca_bundle: text(keys::CA_BUNDLE),
        ca_cert: text(keys::CA_CERT),
        ca_key: text(keys::CA_KEY),
        tls_cert: text(keys::TLS_CERT),
        tls_key: text(keys::TLS_KEY),
    }
}

fn data(stored: &Stored) -> BTreeMap<String, ByteString> {
    [
        (keys::CA_BUNDLE, &stored.ca_bundle),
        (keys::CA_CERT, &stored.ca_cert),
        (keys::CA_KEY, &stored.ca_key),
        (keys::TLS_CERT, &stored.tls_cert),
        (keys::TLS_KEY, &stored.tls_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
    .collect()
}

/// Reads the Secret, writes it where it must change, and returns what it
/// then holds. Creates it when it does not exist (where RBAC allows; the
/// chart creates it empty instead).
pub async fn sync(client: &Client, managed: &ManagedCerts) -> Result<Stored, CaError> {
    let secret_name = managed.secret.to_string();
    let kube_error = |source| CaError::Kube {
        secret: secret_name.clone(),
        source,
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), &managed.secret.namespace);
    for _ in 0..5 {
        let current = api.get_opt(&managed.secret.name).await.map_err(kube_error)?;
        let held = current.as_ref().map(stored);
        let (next_stored, why) = match next(held.as_ref(), &managed.policy, SystemTime::now())? {
            Step::Keep => return Ok(held.unwrap_or_default()),
            Step::Write(next_stored, why) => (*next_stored, why),
        };
        let written = match current {
            Some(mut secret) => {
                // resourceVersion stays as read: a replica that wrote first wins.
                secret.data = Some(data(&next_stored));
                secret.string_data = None;
                api.replace(&managed.secret.name, &PostParams::default(), &secret).await
            }
            None => {
                let mut secret = Secret {
                    data: Some(data(&next_stored)),
                    ..Default::default()
                };
                secret.metadata.name = Some(managed.secret.name.clone());
                api.create(&PostParams::default(), &secret).await
            }
        };
        match written {
            Ok(secret) => {
                tracing::info!(secret = %secret_name, resource_version = secret.resource_version().unwrap_or_default(), %why, "serving certificates written");
                return Ok(next_stored);
            }
            // Another replica wrote first: read again.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(kube_error(e)),
        }
    }
    Err(CaError::Contended(secret_name))
}

/// The serving certificate `stored` holds, ready for TLS.
pub fn serving_key(stored: &Stored) -> Result<CertifiedKey, CaError> {
    let pem = PemFiles {
        cert: stored.tls_cert.clone().into_bytes(),
        key: stored.tls_key.clone().into_bytes(),
        origin: CertFiles {
            cert: "the managed Secret's tls.crt".into(),
            key: "the managed Secret's tls.key".into(),
        },
    };
    Ok(certified_key(&pem)?)
}

/// Publishes what `stored` holds besides the serving certificate: its trust
/// bundle (for the webhooks' caBundle) and the certificate's expiry.
pub fn publish(stored: &Stored, app: &App) {
    app.set_trust_bundle(stored.ca_bundle.clone().into_bytes());
    app.metrics
        .serving_certificate_expiry(crate::certs::not_after(&stored.tls_cert));
}

/// Serves what `stored` holds and publishes its trust bundle.
pub fn load(stored: &Stored, target: &SwappableCert, app: &App) -> Result<(), CaError> {
    target.store(serving_key(stored)?);
    publish(stored, app);
    Ok(())
}

/// The first sync, before the server serves: retried (with a log line each
/// time) until the Secret holds usable certificates.
pub async fn first(client: &Client, managed: &ManagedCerts) -> Stored {
    let mut delay = Duration::from_millis(500);
    loop {
        match sync(client, managed).await {
            Ok(stored) => return stored,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "cannot get the serving certificates yet; not serving until then");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Keeps the certificates in step with the Secret until the process ends.
pub async fn keep(
    client: Client,
    managed: ManagedCerts,
    target: Arc<SwappableCert>,
    app: Arc<App>,
    mut loaded: Stored,
) {
    let mut tick = tokio::time::interval(managed.check_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        match sync(&client, &managed).await {
            Ok(stored) if stored == loaded => {}
            Ok(stored) => match load(&stored, &target, &app) {
                Ok(()) => {
                    tracing::info!(secret = %managed.secret, "serving the Secret's new certificates");
                    app.metrics.tls_reload(true);
                    loaded = stored;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the Secret's new certificates do not load; keeping those in service");
                    app.metrics.tls_reload(false);
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot sync the serving certificates; keeping those in service");
                app.metrics.tls_reload(false);
            }
        }
    }
}
