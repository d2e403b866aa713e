//! Prometheus metrics, all prefixed `statusguard_`.
//!
//! Labels are bounded by configuration: group/resource/owner/item come from
//! the ownership rules (a request for anything unconfigured is counted under
//! `UNCONFIGURED`), never from object names or request contents.

use std::sync::RwLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::admission::decide::{Decision, Endpoint, ResourceLabels, UNCONFIGURED};
use crate::ownership::{Item, LookupMap, Violation};
use crate::server::limits::AdmitError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub endpoint: &'static str,
    pub group: String,
    pub resource: String,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EndpointLabels {
    pub endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ViolationLabels {
    pub group: String,
    pub resource: String,
    pub owner: String,
    pub item: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ObservedLabels {
    pub group: String,
    pub resource: String,
    /// Bounded: the observer's identity cap (then `(other)`), each cut to
    /// [`crate::admission::observe::MAX_NAME_BYTES`] as the record cuts it.
    pub writer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EventLabels {
    pub reason: &'static str,
    pub result: &'static str,
}

/// How a sync of the webhook configurations ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookSync {
    /// Applied from this rules generation.
    Applied(u64),
    /// The apply failed: what is registered stays registered.
    Failed,
    /// No valid rules yet: nothing is registered.
    Waiting,
    /// The registration switch stands the servers down: nothing is applied.
    StoodDown,
}

impl WebhookSync {
    /// The `result` label of `statusguard_webhook_syncs_total`.
    fn result(self) -> &'static str {
        match self {
            WebhookSync::Applied(_) => "applied",
            WebhookSync::Failed => "error",
            WebhookSync::Waiting => "waiting",
            WebhookSync::StoodDown => "stood_down",
        }
    }
}

/// How a sync of the admission policies (`--register-policies`) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicySync {
    /// Applied from this rules generation (and the set pruned).
    Applied(u64),
    /// The apply failed: what is applied stays.
    Failed,
    /// No valid rules yet: nothing is applied.
    Waiting,
    /// The registration switch stands the servers down: nothing is applied.
    StoodDown,
    /// The rules in force would be decided differently by the policies, and
    /// deviations are not allowed: the policies in force stay.
    Deviations,
}

impl PolicySync {
    /// The `result` label of `statusguard_policy_syncs_total`.
    fn result(self) -> &'static str {
        match self {
            PolicySync::Applied(_) => "applied",
            PolicySync::Failed => "error",
            PolicySync::Waiting => "waiting",
            PolicySync::StoodDown => "stood_down",
            PolicySync::Deviations => "deviations",
        }
    }
}

type ViolationCounters = LookupMap<String, LookupMap<String, LookupMap<String, LookupMap<Item, Counter>>>>;

/// The server's metrics registry and the families it records into.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    refused_unread: Family<ResultLabels, Counter>,
    duration: Family<EndpointLabels, Histogram>,
    violations: Family<ViolationLabels, Counter>,
    /// The counters of `violations` met before, by group, resource, owner
    /// and item, found with the decision's own strings: a denial otherwise
    /// builds four label strings and hashes them with SipHash (the family's
    /// table) per violation. As bounded as the family's labels.
    violation_counters: RwLock<ViolationCounters>,
    rules_generation: Gauge,
    rules_stale: Gauge,
    config_reloads: Family<ResultLabels, Counter>,
    tls_reloads: Family<ResultLabels, Counter>,
    webhooks_registered: Gauge,
    webhooks_generation: Gauge,
    webhook_syncs: Family<ResultLabels, Counter>,
    policies_registered: Gauge,
    policies_generation: Gauge,
    policy_syncs: Family<ResultLabels, Counter>,
    serving_certificate_expiry: Gauge,
    observed_writes: Family<ObservedLabels, Counter>,
    observations_skipped: Family<ResultLabels, Counter>,
    events: Family<EventLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("statusguard");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission reviews answered, by endpoint, resource and decision",
            requests.clone(),
        );
        let refused_unread = Family::<ResultLabels, Counter>::default();
        registry.register(
            "requests_refused_unread",
            "Requests refused before their body was read, by result (too_large: over --max-body-bytes; busy: no room under --max-inflight-bytes or --max-inflight-requests in time; too_many_waiting: as many requests as --max-inflight-requests were already waiting for room)",
            refused_unread.clone(),
        );
        // 50 µs to ~0.8 s: the decision is microseconds, a large object's
        // parse a few milliseconds.
        let duration = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00005, 2.0, 15))
        });
        registry.register(
            "admission_duration_seconds",
            "Time from the request body read to the response, by endpoint",
            duration.clone(),
        );
        let violations = Family::<ViolationLabels, Counter>::default();
        registry.register(
            "violations",
            "Changes to items owned by another writer, denied, restored or reported",
            violations.clone(),
        );
        let rules_generation = Gauge::default();
        registry.register(
            "rules_generation",
            "How many ownership documents have been loaded (0: none yet, not ready)",
            rules_generation.clone(),
        );
        let rules_stale = Gauge::default();
        registry.register(
            "rules_stale",
            "1 while the rules in force are older than the configured source (invalid or deleted)",
            rules_stale.clone(),
        );
        let config_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Ownership documents read from the source, by result (valid, invalid, missing)",
            config_reloads.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_reloads",
            "Serving certificate reloads, by result",
            tls_reloads.clone(),
        );
        let webhooks_registered = Gauge::default();
        registry.register(
            "webhooks_registered",
            "1 while the webhook configurations match the rules in force (server-managed registration)",
            webhooks_registered.clone(),
        );
        let webhooks_generation = Gauge::default();
        registry.register(
            "webhooks_rules_generation",
            "The rules generation the webhook configurations were last applied from (0: never)",
            webhooks_generation.clone(),
        );
        let webhook_syncs = Family::<ResultLabels, Counter>::default();
        registry.register(
            "webhook_syncs",
            "Webhook configuration syncs, by result (applied, error, waiting: no valid rules yet, stood_down)",
            webhook_syncs.clone(),
        );
        let policies_registered = Gauge::default();
        registry.register(
            "policies_registered",
            "1 while the admission policies match the rules in force (--register-policies)",
            policies_registered.clone(),
        );
        let policies_generation = Gauge::default();
        registry.register(
            "policies_rules_generation",
            "The rules generation the admission policies were last applied from (0: never)",
            policies_generation.clone(),
        );
        let policy_syncs = Family::<ResultLabels, Counter>::default();
        registry.register(
            "policy_syncs",
            "Admission policy syncs, by result (applied, error, waiting: no valid rules yet, stood_down, deviations: not applied)",
            policy_syncs.clone(),
        );
        let serving_certificate_expiry = Gauge::default();
        registry.register(
            "serving_certificate_expiry_timestamp_seconds",
            "When the serving certificate the server keeps itself stops being valid (Unix time; 0: not kept by the server)",
            serving_certificate_expiry.clone(),
        );
        let observed_writes = Family::<ObservedLabels, Counter>::default();
        registry.register(
            "observed_writes",
            "Status UPDATEs of guarded resources seen by the observer (GET /observed has the items), by writer",
            observed_writes.clone(),
        );
        let observations_skipped = Family::<ResultLabels, Counter>::default();
        registry.register(
            "observations_skipped",
            "Status UPDATEs the observer did not read, by reason (rate: over --observe-rate or --observe-bytes-rate, queue: its queue was full, bytes: over the room left in --observe-queue-bytes, unreadable)",
            observations_skipped.clone(),
        );
        let events = Family::<EventLabels, Counter>::default();
        registry.register(
            "events",
            "Kubernetes Events for denied and trimmed writes, by reason and result (sent; limited: within --event-interval of the last one for the object, reason and writer; object_limit: the object's cap per minute; rate_limit: over --event-rate; unverified: no object with the review's uid, as for a forged review; dropped: queue full; failed: the object could not be read, or the Event not sent)",
            events.clone(),
        );
        // Counters that exist at 0 from the start, so that rate() and alerts
        // see the first increment.
        for result in ["success", "error"] {
            drop(tls_reloads.get_or_create(&ResultLabels { result }));
        }
        for result in ["valid", "invalid", "missing"] {
            drop(config_reloads.get_or_create(&ResultLabels { result }));
        }
        Self {
            registry,
            requests,
            refused_unread,
            duration,
            violations,
            violation_counters: RwLock::default(),
            rules_generation,
            rules_stale,
            config_reloads,
            tls_reloads,
            webhooks_registered,
            webhooks_generation,
            webhook_syncs,
            policies_registered,
            policies_generation,
            policy_syncs,
            serving_certificate_expiry,
            observed_writes,
            observations_skipped,
            events,
        }
    }
}

impl Metrics {
    /// Records one answered review.
    pub(crate) fn decision(&self, endpoint: Endpoint, decision: &Decision, took: Duration) {
        // The decision's labels name only configured resources: bounded by configuration.
        let ResourceLabels { group, resource } = decision.labels.clone();
        for v in &decision.violations {
            self.violation_counter(&group, &resource, v).inc();
        }
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.as_str(),
                group,
                resource,
                decision: decision.outcome.as_str(),
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    /// The counter of `violation` of the rules of `group`/`resource`.
    fn violation_counter(&self, group: &str, resource: &str, violation: &Violation) -> Counter {
        let met = self.violation_counters.read().ok().and_then(|counters| {
            counters
                .get(group)?
                .get(resource)?
                .get(violation.owner.as_str())?
                .get(&violation.item)
                .cloned()
        });
        if let Some(counter) = met {
            return counter;
        }
        let counter = self
            .violations
            .get_or_create(&ViolationLabels {
                group: group.to_owned(),
                resource: resource.to_owned(),
                owner: violation.owner.clone(),
                item: violation.item.to_string(),
            })
            .clone();
        if let Ok(mut counters) = self.violation_counters.write() {
            counters
                .entry(group.to_owned())
                .or_default()
                .entry(resource.to_owned())
                .or_default()
                .entry(violation.owner.clone())
                .or_default()
                .insert(violation.item.clone(), counter.clone());
        }
        counter
    }

    /// A request refused before its body was read, by why.
    pub fn refused_before_reading(&self, why: &AdmitError) {
        let result = match why {
            AdmitError::TooLarge { .. } => "too_large",
            AdmitError::Busy => "busy",
            AdmitError::TooManyWaiting => "too_many_waiting",
        };
        self.refused_unread.get_or_create(&ResultLabels { result }).inc();
    }

    /// Records a review that could not be answered (bad input).
    pub fn error(&self, endpoint: Endpoint, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.as_str(),
                group: UNCONFIGURED.to_owned(),
                resource: UNCONFIGURED.to_owned(),
                decision: "error",
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    /// Valid rules were put in force as `generation`.
    pub fn rules_loaded(&self, generation: u64) {
        self.rules_generation.set(generation as i64);
        self.rules_stale.set(0);
        self.config_reloads
            .get_or_create(&ResultLabels { result: "valid" })
            .inc();
    }

    /// The source changed but could not be used; the rules in force stay.
    pub fn rules_rejected(&self, result: &'static str) {
        self.rules_stale.set(1);
        self.config_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// A certificate reload was tried.
    pub fn tls_reload(&self, ok: bool) {
        self.tls_reloads
            .get_or_create(&ResultLabels {
                result: if ok { "success" } else { "error" },
            })
            .inc();
    }

    /// A webhook configuration sync ended as `sync` says.
    pub fn webhook_sync(&self, sync: WebhookSync) {
        let result = sync.result();
        self.webhook_syncs.get_or_create(&ResultLabels { result }).inc();
        match sync {
            WebhookSync::Applied(generation) => {
                self.webhooks_registered.set(1);
                self.webhooks_generation.set(generation as i64);
            }
            // A failed apply changes nothing in the cluster: what was
            // registered (and from which generation) still is.
            WebhookSync::Failed => {}
            WebhookSync::Waiting | WebhookSync::StoodDown => {
                self.webhooks_registered.set(0);
            }
        }
    }

    /// An admission policy sync ended as `sync` says.
    pub fn policy_sync(&self, sync: PolicySync) {
        let result = sync.result();
        self.policy_syncs.get_or_create(&ResultLabels { result }).inc();
        match sync {
            PolicySync::Applied(generation) => {
                self.policies_registered.set(1);
                self.policies_generation.set(generation as i64);
            }
            // The policies in force are an older document's, or (an apply
            // that stopped part way, a prune refused) a mix of two: the
            // generation says which was last applied whole.
            PolicySync::Failed | PolicySync::Deviations | PolicySync::Waiting | PolicySync::StoodDown => {
                self.policies_registered.set(0);
            }
        }
    }

    /// The serving certificate the server keeps itself ends at `not_after`.
    pub fn serving_certificate_expiry(&self, not_after: Option<i64>) {
        self.serving_certificate_expiry.set(not_after.unwrap_or_default());
    }

    /// The observer counted a write of `writer` (its bounded identity).
    pub fn observed(&self, group: &str, resource: &str, writer: &str) {
        self.observed_writes
            .get_or_create(&ObservedLabels {
                group: group.to_owned(),
                resource: resource.to_owned(),
                writer: writer.to_owned(),
            })
            .inc();
    }

    /// A write the observer did not read, and why.
    pub fn observation_skipped(&self, result: &'static str) {
        self.observations_skipped.get_or_create(&ResultLabels { result }).inc();
    }

    /// An Event for a decision, and what became of it.
    pub fn event(&self, reason: &'static str, result: &'static str) {
        self.events.get_or_create(&EventLabels { reason, result }).inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(metrics: &Metrics, series: &str) -> Option<f64> {
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// A violation is counted only with a decision, which nothing outside
    /// the crate can record: this is the proof that the family the alerts
    /// and the dashboard query (tests/chart.rs) is exported, with its labels.
    #[test]
    fn a_decision_with_a_violation_exports_the_violations_counter() {
        use crate::admission::answer::read_and_decide;
        use crate::admission::decide::Outcome;
        use crate::ownership::Ownership;
        use crate::test_support::{body, widget_status_review};
        use serde_json::json;

        let rules = Ownership::from_yaml(include_str!("../tests/fixtures/ownership.yaml")).unwrap();
        // The scaler's stale write of the controller's observedGeneration.
        let review = body(&widget_status_review(
            "system:serviceaccount:platform:widget-scaler",
            json!({"observedGeneration": 2, "replicas": 3}),
            json!({"observedGeneration": 1, "replicas": 3}),
        ));
        let (_, decided) = read_and_decide(&rules, &review, Endpoint::Validate).unwrap();
        let decision = decided.unwrap();
        assert_eq!(decision.outcome, Outcome::Denied);
        assert_eq!(decision.violations.len(), 1, "{:?}", decision.violations);

        let metrics = Metrics::default();
        assert!(
            !metrics.encode().contains("statusguard_violations"),
            "no series before a violation"
        );
        metrics.decision(Endpoint::Validate, &decision, Duration::from_millis(1));
        let text = metrics.encode();
        assert!(text.contains("# TYPE statusguard_violations counter\n"), "{text}");
        assert_eq!(
            value(
                &metrics,
                "statusguard_violations_total{group=\"example.com\",resource=\"widgets\",owner=\"system:serviceaccount:platform:widget-controller\",item=\"status.observedGeneration\"}"
            ),
            Some(1.0),
            "{text}"
        );
    }

    #[test]
    fn a_failed_webhook_sync_leaves_what_is_registered_registered() {
        let metrics = Metrics::default();
        metrics.webhook_sync(WebhookSync::Applied(3));
        metrics.webhook_sync(WebhookSync::Failed);
        assert_eq!(value(&metrics, "statusguard_webhooks_registered"), Some(1.0));
        assert_eq!(value(&metrics, "statusguard_webhooks_rules_generation"), Some(3.0));
        assert_eq!(
            value(&metrics, "statusguard_webhook_syncs_total{result=\"error\"}"),
            Some(1.0)
        );
        metrics.webhook_sync(WebhookSync::StoodDown);
        assert_eq!(value(&metrics, "statusguard_webhooks_registered"), Some(0.0));
    }
}
