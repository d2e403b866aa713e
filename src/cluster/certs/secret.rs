//! The loop beside [`next`]: the certificates the server keeps for itself,
//! in one Secret shared by every replica.
//!
//! Each replica reads the Secret every check interval, serves the
//! certificate it holds and publishes its trust bundle (which the webhook
//! registration writes into the `caBundle`). When [`next`] says the Secret
//! must change, the replica writes it with the resourceVersion it read: of
//! replicas racing, one write wins and the others read the winner's
//! certificates on their next pass.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::{ExponentialBuilder, Retryable as _};
use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::watch_object;
use kube::{Client, ResourceExt as _};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use crate::cluster::certs::policy::{self, CertError, CertPolicy, Step, Stored, keys, next};
use crate::cluster::certs::tls::{PemPair, SwappableCert, TlsError, certified_key};
use crate::metrics::Metrics;
use crate::rules::source::split_namespaced_name;

/// Where and how the server keeps its certificates.
#[derive(Debug, Clone)]
pub struct ManagedCerts {
    /// The Secret the replicas share.
    pub(crate) secret: SecretRef,
    pub(crate) policy: CertPolicy,
    /// How often the Secret is read again.
    pub(crate) check_interval: Duration,
}

/// The Secret the certificates are kept in, written `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl FromStr for SecretRef {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (namespace, name) = split_namespaced_name(text)?;
        Ok(Self { namespace, name })
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why the Secret could not be brought to what it should hold.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CaError {
    /// The API server refused or could not be reached.
    #[error("Secret {secret}: {source}")]
    Kube { secret: String, source: kube::Error },
    #[error(transparent)]
    Cert(#[from] CertError),
    /// What the Secret holds does not load as a serving certificate.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Another replica's write won (on every attempt, once retried).
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
/// then holds. Creates it when it does not exist (RBAC must allow `create`:
/// a deleted Secret is recreated with `in_hand`, what this replica serves).
/// Of 5 attempts, each after another replica's write won, the last gives
/// up with [`CaError::Contended`].
pub(crate) async fn sync(client: &Client, managed: &ManagedCerts, in_hand: Option<&Stored>) -> Result<Stored, CaError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &managed.secret.namespace);
    let contention = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(200))
        .with_jitter()
        .with_max_times(4);
    (|| sync_once(&api, managed, in_hand))
        .retry(contention)
        .when(|e| matches!(e, CaError::Contended(_)))
        .await
}

/// One read, and at most one write.
async fn sync_once(api: &Api<Secret>, managed: &ManagedCerts, in_hand: Option<&Stored>) -> Result<Stored, CaError> {
    let secret_name = managed.secret.to_string();
    let kube_error = |source| CaError::Kube {
        secret: secret_name.clone(),
        source,
    };
    let current = api.get_opt(&managed.secret.name).await.map_err(kube_error)?;
    let held = current.as_ref().map(stored);
    let (next_stored, why) = match next(held.as_ref(), in_hand, &managed.policy, SystemTime::now())? {
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
            Ok(next_stored)
        }
        // Another replica wrote first: read again.
        Err(kube::Error::Api(e)) if e.code == 409 => Err(CaError::Contended(secret_name)),
        Err(e) => Err(kube_error(e)),
    }
}

/// The serving certificate `stored` holds, ready for TLS.
pub(crate) fn serving_key(stored: &Stored) -> Result<CertifiedKey, CaError> {
    let pem = PemPair {
        cert: stored.tls_cert.clone().into_bytes(),
        key: stored.tls_key.clone().into_bytes(),
        cert_origin: "the managed Secret's tls.crt".into(),
        key_origin: "the managed Secret's tls.key".into(),
    };
    Ok(certified_key(&pem)?)
}

/// Where what the Secret holds besides the serving certificate goes: its
/// trust bundle to the webhook registration (for the caBundle), the
/// certificate's expiry and the reloads to the metrics.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) trust_bundle: watch::Sender<Option<Arc<Vec<u8>>>>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Published {
    fn set_trust_bundle(&self, bundle: Vec<u8>) {
        self.trust_bundle.send_if_modified(|held| {
            if held.as_deref() == Some(&bundle) {
                return false;
            }
            *held = Some(Arc::new(bundle));
            true
        });
    }
}

/// Publishes what `stored` holds besides the serving certificate: its trust
/// bundle (for the webhooks' caBundle) and the certificate's expiry.
pub(crate) fn publish(stored: &Stored, app: &Published) {
    app.set_trust_bundle(stored.ca_bundle.clone().into_bytes());
    app.metrics
        .serving_certificate_expiry(policy::not_after(&stored.tls_cert));
}

/// Serves what `stored` holds and publishes its trust bundle.
pub(crate) fn load(stored: &Stored, target: &SwappableCert, app: &Published) -> Result<(), CaError> {
    target.store(serving_key(stored)?);
    publish(stored, app);
    Ok(())
}

/// The first sync, before the server serves: retried (with a log line each
/// time, backing off from 0.5 s to 30 s) until the Secret holds usable
/// certificates.
pub(crate) async fn first(client: &Client, managed: &ManagedCerts) -> Stored {
    let backoff = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(30))
        .without_max_times();
    loop {
        // Without a limit of attempts this ends only with Ok; the loop only
        // spares a panic on the impossible.
        let synced = (|| sync(client, managed, None))
            .retry(backoff)
            .notify(|e, delay| tracing::warn!(error = %e, retry_in = ?delay, "cannot get the serving certificates yet; not serving until then"))
            .await;
        if let Ok(stored) = synced {
            return stored;
        }
    }
}

/// Keeps the certificates in step with the Secret until the process ends.
/// With nothing `loaded` yet, it starts with [`first`] and serves what that
/// returns: a server can open its ports (with [`SwappableCert::empty`])
/// before its first certificate and let its probes answer meanwhile.
pub(crate) async fn keep(
    client: Client,
    managed: ManagedCerts,
    target: Arc<SwappableCert>,
    app: Published,
    mut loaded: Option<Stored>,
) {
    let mut tick = tokio::time::interval(managed.check_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if loaded.is_some() {
        // The first tick is at once: what was loaded was read just now.
        tick.tick().await;
    }
    // A change of the Secret (emptied or replaced by a forced upgrade or a
    // GitOps replace, deleted, edited) is repaired at once, not at the next
    // check. The watch restarts with backoff; the ticks go on meanwhile.
    let api: Api<Secret> = Api::namespaced(client.clone(), &managed.secret.namespace);
    let mut changed = watch_object(api, &managed.secret.name).default_backoff().boxed();
    let mut watch_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(change) = changed.next() => match change {
                Ok(_) => watch_error = None,
                // Not a change: the next tick syncs. Said once per error.
                Err(e) => {
                    let error = e.to_string();
                    if watch_error.as_ref() != Some(&error) {
                        tracing::warn!(secret = %managed.secret, %error, "cannot watch the Secret; retrying (a change to it is repaired at the next check instead)");
                    }
                    watch_error = Some(error);
                    continue;
                }
            },
        }
        let synced = match &loaded {
            Some(held) => sync(&client, &managed, Some(held)).await,
            None => Ok(first(&client, &managed).await),
        };
        match synced {
            Ok(stored) if loaded.as_ref() == Some(&stored) => {}
            Ok(stored) => match load(&stored, &target, &app) {
                Ok(()) => {
                    tracing::info!(secret = %managed.secret, "serving the Secret's new certificates");
                    if loaded.is_some() {
                        app.metrics.tls_reload(true);
                    }
                    loaded = Some(stored);
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
