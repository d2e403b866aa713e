//! The rules in force, swapped atomically: a request reads one whole
//! document, never half of an old and half of a new one.
//!
//! Two readers, two ways in: a request loads the rules lock-free from an
//! [`ArcSwapOption`]; whoever follows the rules (the webhook registration,
//! later the policies) [subscribes](RuleStore::subscribe) to a
//! [`watch::Receiver`] of what is in force, the one typed channel the live
//! document reaches them through.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::ownership::Ownership;

/// Rules put in force, and which time that was (1 for the first document).
#[derive(Debug, Clone)]
pub struct InForce {
    pub generation: u64,
    pub rules: Arc<Ownership>,
}

/// The rules a server decides with, and why its source is not in force when
/// it is not.
#[derive(Debug)]
pub struct RuleStore {
    current: ArcSwapOption<Ownership>,
    in_force: watch::Sender<Option<InForce>>,
    /// Why the source is not (or no longer) what is in force.
    problem: ArcSwapOption<String>,
    metrics: Arc<Metrics>,
}

impl RuleStore {
    /// An empty store: nothing in force until [`replace`](Self::replace).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            current: ArcSwapOption::empty(),
            in_force: watch::Sender::new(None),
            problem: ArcSwapOption::from_pointee("no ownership document loaded yet".to_owned()),
            metrics,
        }
    }

    /// The rules in force, if any were ever loaded.
    pub fn current(&self) -> Option<Arc<Ownership>> {
        self.current.load_full()
    }

    /// What is in force now, and every change from now on.
    pub fn subscribe(&self) -> watch::Receiver<Option<InForce>> {
        self.in_force.subscribe()
    }

    /// Puts valid rules in force; returns the new generation.
    pub fn replace(&self, rules: Ownership) -> u64 {
        let rules = Arc::new(rules);
        let mut generation = 0;
        // Under the channel's lock: the generation and the rules a request
        // loads change together.
        self.in_force.send_modify(|in_force| {
            generation = in_force.as_ref().map_or(0, |f| f.generation) + 1;
            self.current.store(Some(rules.clone()));
            *in_force = Some(InForce { generation, rules });
        });
        self.problem.store(None);
        self.metrics.rules_loaded(generation);
        generation
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
        self.in_force.borrow().as_ref().map_or(0, |f| f.generation)
    }

    /// What is wrong with the source, if anything.
    pub fn problem(&self) -> Option<Arc<String>> {
        self.problem.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RulesSource;

    #[tokio::test]
    async fn a_follower_sees_each_document_put_in_force_with_its_generation() {
        let store = RuleStore::new(Arc::new(Metrics::default()));
        let mut follower = store.subscribe();
        assert!(follower.borrow_and_update().is_none());
        let rules = RulesSource::Embedded.load_local().unwrap();
        assert_eq!(store.replace(rules.clone()), 1);
        follower.changed().await.unwrap();
        let in_force = follower.borrow_and_update().clone().unwrap();
        assert_eq!((in_force.generation, &*in_force.rules), (1, &rules));
        assert_eq!(store.current().as_deref(), Some(&rules));
        store.reject("invalid", "broken".into());
        assert!(
            !follower.has_changed().unwrap(),
            "a rejected document changes nothing in force"
        );
        assert_eq!(store.replace(rules), 2);
        assert_eq!(store.generation(), 2);
        assert!(follower.has_changed().unwrap());
    }
}
