//! The rules in force, swapped atomically: a request reads one whole
//! document, never half of an old and half of a new one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

use crate::metrics::Metrics;
use crate::ownership::Ownership;

/// The rules a server decides with, and why its source is not in force when
/// it is not.
#[derive(Debug)]
pub struct RuleStore {
    current: ArcSwapOption<Ownership>,
    generation: AtomicU64,
    /// Why the source is not (or no longer) what is in force.
    problem: ArcSwapOption<String>,
    metrics: Arc<Metrics>,
    /// Wakes the one follower of the rules (the webhook registration).
    replaced: Notify,
}

impl RuleStore {
    /// An empty store: nothing in force until [`replace`](Self::replace).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            current: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
            problem: ArcSwapOption::from_pointee("no ownership document loaded yet".to_owned()),
            metrics,
            replaced: Notify::new(),
        }
    }

    /// The rules in force, if any were ever loaded.
    pub fn current(&self) -> Option<Arc<Ownership>> {
        self.current.load_full()
    }

    /// Puts valid rules in force; returns the new generation.
    pub fn replace(&self, rules: Ownership) -> u64 {
        self.current.store(Some(Arc::new(rules)));
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.problem.store(None);
        self.metrics.rules_loaded(generation);
        // A permit is kept when nobody waits yet: the follower never misses one.
        self.replaced.notify_one();
        generation
    }

    /// Resolves after the next [`replace`](Self::replace) (or at once if one
    /// happened since the last call). For one follower.
    pub async fn replaced(&self) {
        self.replaced.notified().await
    }

    /// The source could not be used: the rules in force stay, and the reason
    /// is shown until a valid document arrives. `result` labels the metric.
    pub fn reject(&self, result: &'static str, why: String) {
        self.problem.store(Some(Arc::new(why)));
        self.metrics.rules_rejected(result);
    }

    /// Why the rules are not loaded yet, before the source was even read
    /// (counted nowhere: nothing was rejected).
    pub fn waiting(&self, why: String) {
        self.problem.store(Some(Arc::new(why)));
    }

    /// How many times rules were put in force.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// What is wrong with the source, if anything.
    pub fn problem(&self) -> Option<Arc<String>> {
        self.problem.load_full()
    }
}
