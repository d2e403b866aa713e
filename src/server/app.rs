//! The state every handler shares: the rules in force, the metrics, the
//! request budget, and whether the server is shutting down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

use crate::metrics::Metrics;
use crate::rules::RuleStore;
use crate::server::limits::{Budget, Limits};
use crate::server::observer::{Observations, ObserveConfig};

/// State shared by the handlers.
#[derive(Debug)]
pub struct App {
    /// The rules in force.
    pub rules: RuleStore,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// What requests may hold: slots, body bytes, decision threads.
    pub budget: Budget,
    shutting_down: AtomicBool,
    /// The ownership ConfigMap says `statusguard.dev/registration: disabled`.
    registration_disabled: AtomicBool,
    registration_changed: Notify,
    /// The CA bundle of the certificates the server keeps itself, if it does.
    trust_bundle: ArcSwapOption<Vec<u8>>,
    /// What writers change, and Events: fed off the request path.
    pub observations: Observations,
}

impl App {
    /// Fresh state: no rules in force, not shutting down.
    pub fn new(metrics: Arc<Metrics>, limits: Limits, observe: ObserveConfig) -> Arc<Self> {
        Arc::new(Self {
            rules: RuleStore::new(metrics.clone()),
            metrics,
            budget: Budget::new(limits),
            shutting_down: AtomicBool::new(false),
            registration_disabled: AtomicBool::new(false),
            registration_changed: Notify::new(),
            trust_bundle: ArcSwapOption::empty(),
            observations: Observations::new(observe),
        })
    }

    /// `Ok` when the webhook should receive traffic, else why not. TLS needs
    /// no entry here: the server only runs once its certificate loaded.
    pub fn readiness(&self) -> Result<(), String> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err("shutting down".into());
        }
        if self.rules.current().is_none() {
            let why = self.rules.problem().map(|p| p.to_string()).unwrap_or_default();
            return Err(format!("no ownership rules loaded: {why}"));
        }
        Ok(())
    }

    /// Whether the webhook configurations may be applied: `false` once
    /// `statusguard unregister` stood the servers down.
    pub fn registration_enabled(&self) -> bool {
        !self.registration_disabled.load(Ordering::SeqCst)
    }

    /// Follows the ConfigMap's registration annotation.
    pub fn set_registration_enabled(&self, enabled: bool) {
        if self.registration_disabled.swap(!enabled, Ordering::SeqCst) == enabled {
            self.registration_changed.notify_one();
        }
    }

    /// The CA bundle of the certificates the server keeps itself.
    pub fn trust_bundle(&self) -> Option<Arc<Vec<u8>>> {
        self.trust_bundle.load_full()
    }

    /// Publishes a new CA bundle; the webhook registration follows at once.
    pub fn set_trust_bundle(&self, bundle: Vec<u8>) {
        if self.trust_bundle.load().as_deref() != Some(&bundle) {
            self.trust_bundle.store(Some(Arc::new(bundle)));
            self.registration_changed.notify_one();
        }
    }

    /// Resolves after the next change of [`registration_enabled`](Self::registration_enabled)
    /// or of the [`trust_bundle`](Self::trust_bundle).
    pub async fn registration_changed(&self) {
        self.registration_changed.notified().await
    }

    /// From now on readiness is 503.
    pub fn start_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether [`start_shutdown`](Self::start_shutdown) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}
