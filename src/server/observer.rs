//! Off the request path: what each status write changed (the record of
//! observed writers, `GET /observed`) and a Kubernetes Event on the object
//! for each denied or trimmed write. A handler only offers the request body
//! to a bounded queue, within a rate; a full queue, a slow or failing Events
//! API never delays or changes a decision, they only drop work (counted in
//! `statusguard_observations_skipped_total` and `statusguard_events_total`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::decision::{Decision, Outcome, Violation};
use crate::metrics::Metrics;
use crate::observe::{ObservedWrite, ObservedWriters, Observer, read_write};
use crate::ownership::Ownership;

use super::watch::event_note;

/// How much the observer may do.
#[derive(Debug, Clone)]
pub struct ObserveConfig {
    /// Writes read per second at most (a token bucket with this burst); 0: none.
    pub rate_per_second: u32,
    /// Identities the record names; the rest are counted as `(other)`.
    pub max_identities: usize,
    /// Fields and condition types per identity; the rest as `(other)`.
    pub max_items: usize,
    /// Events: at most one per object, reason and writer in this interval;
    /// `None`: no Events.
    pub event_interval: Option<Duration>,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        Self {
            rate_per_second: 200,
            max_identities: 256,
            max_items: 256,
            event_interval: Some(Duration::from_secs(5)),
        }
    }
}

/// Jobs waiting for the observer; beyond this they are dropped.
const QUEUE: usize = 1024;
/// Events waiting to be sent; beyond this they are dropped.
const EVENT_QUEUE: usize = 256;
/// Limit on one call to the Events API.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// One decided write, for the observer.
#[derive(Debug)]
pub struct Job {
    body: Bytes,
    rules: Arc<Ownership>,
    outcome: Outcome,
    violations: Vec<Violation>,
}

/// The handlers' side of the observer: the rate limit, the queue, and the
/// record it fills.
#[derive(Debug)]
pub struct Observations {
    sender: mpsc::Sender<Job>,
    receiver: Mutex<Option<mpsc::Receiver<Job>>>,
    bucket: Mutex<Bucket>,
    record: Arc<Mutex<Observer>>,
    config: ObserveConfig,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Observations {
    /// An empty record and queue.
    pub fn new(config: ObserveConfig) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE);
        Self {
            sender,
            receiver: Mutex::new(Some(receiver)),
            bucket: Mutex::new(Bucket {
                tokens: f64::from(config.rate_per_second),
                refilled: Instant::now(),
            }),
            record: Arc::new(Mutex::new(Observer::new(config.max_identities, config.max_items))),
            config,
        }
    }

    /// Offers a decided status write of a guarded resource to the observer:
    /// taken when the rate allows and the queue has room, else counted as
    /// skipped. Never waits.
    pub fn offer(&self, metrics: &Metrics, body: &Bytes, rules: Arc<Ownership>, decision: &Decision) {
        if !self.take_token() {
            metrics.observation_skipped("rate");
            return;
        }
        let job = Job {
            body: body.clone(),
            rules,
            outcome: decision.outcome,
            violations: decision.violations.clone(),
        };
        if self.sender.try_send(job).is_err() {
            metrics.observation_skipped("queue");
        }
    }

    fn take_token(&self) -> bool {
        let rate = f64::from(self.config.rate_per_second);
        let Ok(mut bucket) = self.bucket.lock() else {
            return false;
        };
        let now = Instant::now();
        let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The record as `GET /observed` serves it.
    pub fn snapshot(&self) -> ObservedWriters {
        self.record.lock().map(|r| r.snapshot()).unwrap_or_default()
    }

    /// Starts the observer (and, with `client` and an event interval, the
    /// Events sender). Once only: later calls do nothing.
    pub fn spawn(&self, metrics: Arc<Metrics>, client: Option<kube::Client>, tasks: &mut tokio::task::JoinSet<()>) {
        let Some(receiver) = self.receiver.lock().ok().and_then(|mut r| r.take()) else {
            return;
        };
        let events = match (client, self.config.event_interval) {
            (Some(client), Some(interval)) => {
                let (sender, queue) = mpsc::channel(EVENT_QUEUE);
                tasks.spawn(send_events(client, queue, interval, metrics.clone()));
                Some(sender)
            }
            _ => None,
        };
        tracing::info!(
            rate_per_second = self.config.rate_per_second,
            events = events.is_some(),
            "observing status writes"
        );
        tasks.spawn(observe(receiver, self.record.clone(), metrics, events));
    }
}

/// What an Event reports: a rollback the webhook stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stopped {
    Denied,
    Trimmed,
}

impl Stopped {
    fn of(outcome: Outcome) -> Option<Self> {
        match outcome {
            Outcome::Denied => Some(Self::Denied),
            Outcome::Trimmed => Some(Self::Trimmed),
            _ => None,
        }
    }

    /// The Event's reason, and the metric label.
    fn reason(self) -> &'static str {
        match self {
            Self::Denied => "StatusRollbackDenied",
            Self::Trimmed => "StatusRollbackTrimmed",
        }
    }

    /// What became of the write, in the Event's note.
    fn verb(self) -> &'static str {
        match self {
            Self::Denied => "denied",
            Self::Trimmed => "trimmed (the owners' items restored)",
        }
    }
}

/// An Event to send.
#[derive(Debug)]
struct Pending {
    stopped: Stopped,
    write: ObservedWrite,
    violations: Vec<Violation>,
}

async fn observe(
    mut jobs: mpsc::Receiver<Job>,
    record: Arc<Mutex<Observer>>,
    metrics: Arc<Metrics>,
    events: Option<mpsc::Sender<Pending>>,
) {
    while let Some(job) = jobs.recv().await {
        let write = match read_write(&job.body, &job.rules) {
            Ok(Some(write)) => write,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "the observer could not read a review");
                metrics.observation_skipped("unreadable");
                continue;
            }
        };
        // A dry run wrote nothing: neither recorded nor an Event.
        if write.dry_run {
            continue;
        }
        if let Ok(mut record) = record.lock() {
            let identity = record.record(&write);
            metrics.observed(&write.group, &write.resource, &identity);
        }
        let Some(stopped) = Stopped::of(job.outcome) else {
            continue;
        };
        if let Some(events) = &events
            && events
                .try_send(Pending {
                    stopped,
                    write,
                    violations: job.violations,
                })
                .is_err()
        {
            metrics.event(stopped.reason(), "dropped");
        }
    }
}

async fn send_events(
    client: kube::Client,
    mut queue: mpsc::Receiver<Pending>,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let reporter = Reporter {
        controller: "statusguard".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // kube-runtime's recorder: repeats of one (object, reason, writer) become
    // one Event whose series counts them.
    let recorder = Recorder::new(client, reporter);
    let mut last_sent: HashMap<(String, Stopped, String), Instant> = HashMap::new();
    while let Some(pending) = queue.recv().await {
        let object = pending
            .write
            .uid
            .clone()
            .unwrap_or_else(|| format!("{:?}/{}", pending.write.namespace, pending.write.name));
        let reason = pending.stopped.reason();
        let key = (object, pending.stopped, pending.write.writer.clone());
        let now = Instant::now();
        if last_sent.get(&key).is_some_and(|at| now.duration_since(*at) < interval) {
            metrics.event(reason, "limited");
            continue;
        }
        if last_sent.len() > 10_000 {
            last_sent.retain(|_, at| now.duration_since(*at) < interval);
        }
        last_sent.insert(key, now);
        let (event, regarding) = event_for(&pending);
        match tokio::time::timeout(EVENT_TIMEOUT, recorder.publish(&event, &regarding)).await {
            Ok(Ok(())) => metrics.event(reason, "sent"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, object = %pending.write.name, "could not send an Event");
                metrics.event(reason, "failed");
            }
            Err(_) => {
                tracing::warn!(object = %pending.write.name, "the Events API did not answer in time");
                metrics.event(reason, "failed");
            }
        }
    }
}

/// The Event for a denied or trimmed write, and the object it regards.
fn event_for(pending: &Pending) -> (Event, ObjectReference) {
    let write = &pending.write;
    let verb = pending.stopped.verb();
    let items: Vec<String> = pending.violations.iter().map(ToString::to_string).collect();
    let note = event_note(format!(
        "status write by {} {verb}: it changed {}",
        write.writer,
        items.join(", ")
    ));
    let event = Event {
        type_: EventType::Warning,
        reason: pending.stopped.reason().into(),
        note: Some(note),
        action: "ReviewStatusWrite".into(),
        secondary: writer_reference(&write.writer),
    };
    let regarding = ObjectReference {
        api_version: Some(write.api_version.clone()),
        kind: Some(write.kind.clone()),
        name: Some(write.name.clone()),
        namespace: write.namespace.clone(),
        uid: write.uid.clone(),
        ..Default::default()
    };
    (event, regarding)
}

/// The ServiceAccount behind a `system:serviceaccount:NS:NAME` user name.
fn writer_reference(username: &str) -> Option<ObjectReference> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ServiceAccount".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_writer_is_the_related_object() {
        let sa = writer_reference("system:serviceaccount:platform:widget-scaler").unwrap();
        assert_eq!(
            (sa.kind.as_deref(), sa.namespace.as_deref(), sa.name.as_deref()),
            (Some("ServiceAccount"), Some("platform"), Some("widget-scaler"))
        );
        assert!(writer_reference("alice@example.com").is_none());
        assert!(writer_reference("system:serviceaccount:nocolon").is_none());
    }

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        let note = event_note("é".repeat(600));
        assert!(note.len() <= 1000 && note.ends_with("..."), "{}", note.len());
        assert_eq!(event_note("short".into()), "short");
    }

    #[test]
    fn the_bucket_admits_its_rate() {
        let observations = Observations::new(ObserveConfig {
            rate_per_second: 3,
            ..Default::default()
        });
        let taken = (0..10).filter(|_| observations.take_token()).count();
        assert_eq!(taken, 3);
        let none = Observations::new(ObserveConfig {
            rate_per_second: 0,
            ..Default::default()
        });
        assert!(!none.take_token());
    }
}
