//! The state every handler shares: the rules in force, the metrics, the
//! request budget, the observer's queue, and whether the server is
//! shutting down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use crate::cluster::certs::secret::Published;
use crate::cluster::certs::tls::SwappableCert;
use crate::cluster::observer::{Observations, ObserveConfig, ObserverLoop};
use crate::metrics::Metrics;
use crate::rules::store::RuleStore;
use crate::server::limits::{Budget, Limits};

/// State shared by the handlers.
#[derive(Debug)]
pub struct App {
    /// The rules in force.
    pub rules: Arc<RuleStore>,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// What requests may hold: slots, body bytes, decision threads.
    pub(crate) budget: Budget,
    /// What writers change, and Events: fed off the request path.
    pub(crate) observations: Observations,
    shutting_down: AtomicBool,
    /// The CA bundle of the certificates the server keeps itself, for the
    /// webhook registration to follow.
    trust_bundle: watch::Sender<Option<Arc<Vec<u8>>>>,
    /// The certificate readiness waits for, and where it comes from.
    serving: OnceLock<(Arc<SwappableCert>, String)>,
}

impl App {
    /// Fresh state: no rules in force, not shutting down; and the observer
    /// that reads what the handlers offer, to be spawned by whoever runs the
    /// server.
    pub fn new(metrics: Arc<Metrics>, limits: Limits, observe: ObserveConfig) -> (Arc<Self>, ObserverLoop) {
        let (observations, observer) = Observations::new(observe);
        let app = Arc::new(Self {
            rules: Arc::new(RuleStore::new(metrics.clone())),
            metrics,
            budget: Budget::new(limits),
            observations,
            shutting_down: AtomicBool::new(false),
            trust_bundle: watch::Sender::new(None),
            serving: OnceLock::new(),
        });
        (app, observer)
    }

    /// `Ok` when the webhook should receive traffic, else why not.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        if self.is_shutting_down() {
            return Err("shutting down".into());
        }
        if let Some((serving, source)) = self.serving.get()
            && !serving.is_serving()
        {
            return Err(format!("waiting for the serving certificate from {source}"));
        }
        if self.rules.current().is_none() {
            let why = self.rules.problem().map(|p| p.to_string()).unwrap_or_default();
            return Err(format!("no ownership rules loaded: {why}"));
        }
        Ok(())
    }

    /// Where the certificates the server keeps itself publish their CA
    /// bundle (the webhook registration follows it) and their figures.
    pub(crate) fn certificates_published(&self) -> Published {
        Published {
            trust_bundle: self.trust_bundle.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Readiness waits for `serving` to hold a certificate: with the
    /// certificates kept in a Secret, the ports (and the probes) open before
    /// the first one is read.
    pub(crate) fn ready_when_serving(&self, serving: Arc<SwappableCert>, source: String) {
        let _ = self.serving.set((serving, source));
    }

    /// The CA bundle of the certificates the server keeps itself, now and
    /// at every change.
    pub(crate) fn trust_bundle(&self) -> watch::Receiver<Option<Arc<Vec<u8>>>> {
        self.trust_bundle.subscribe()
    }

    /// From now on readiness is 503.
    pub fn start_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether [`start_shutdown`](Self::start_shutdown) was called.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}
