//! The state every handler shares: the rules in force, the metrics, the
//! request budget, the observer's queue, and whether the server is
//! shutting down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

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
        });
        (app, observer)
    }

    /// `Ok` when the webhook should receive traffic, else why not. TLS needs
    /// no entry here: the server only runs once its certificate loaded.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        if self.is_shutting_down() {
            return Err("shutting down".into());
        }
        if self.rules.current().is_none() {
            let why = self.rules.problem().map(|p| p.to_string()).unwrap_or_default();
            return Err(format!("no ownership rules loaded: {why}"));
        }
        Ok(())
    }

    /// Publishes a new CA bundle; the webhook registration follows at once.
    pub(crate) fn set_trust_bundle(&self, bundle: Vec<u8>) {
        self.trust_bundle.send_if_modified(|held| {
            if held.as_deref() == Some(&bundle) {
                return false;
            }
            *held = Some(Arc::new(bundle));
            true
        });
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
