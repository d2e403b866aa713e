//! Off the request path: what each status write changed (the record of
//! observed writers, `GET /observed`) and a Kubernetes Event on the object
//! for each denied or trimmed write.
//!
//! A handler offers each decided write within a rate (a token bucket): the
//! offer carries the few facts and the two statuses the observer reads,
//! copied out of the review the decision read (`ReviewedWrite::of`, no
//! second parse), so that the body is freed with the request, and queues
//! the copy within a byte budget. A full queue, a slow or failing
//! Events API never delays or changes a decision: they only drop work,
//! counted in `statusguard_observations_skipped_total` and
//! `statusguard_events_total`.
//!
//! Reviews are not authenticated unless the webhook port asks for client
//! certificates, so what a review claims is never taken on trust for an
//! Event: the object must exist with the review's uid (one metadata read),
//! and Events are limited per object and per claimed writer, and in all.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::admission::decide::{Decision, Outcome};
use crate::admission::observe::{Basis, COUNTED, Copied, ObservedWriters, Observer, ReviewedWrite, WriteFacts, read};
use crate::metrics::Metrics;
use crate::ownership::{Item, Ownership, Violation};

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
    /// The bytes the record's names may take (each cut to
    /// [`crate::admission::observe::MAX_NAME_BYTES`]); past it, new names are counted
    /// as `(other)`.
    pub max_record_bytes: usize,
    /// The bytes of the writes waiting for the observer; a write that does
    /// not fit is skipped.
    pub queue_bytes: usize,
    /// Events: at most one per object, reason and writer in this interval;
    /// `None`: no Events.
    pub event_interval: Option<Duration>,
    /// Events published per second at most, in all (a token bucket); 0: none.
    pub event_rate_per_second: u32,
    /// The Events bucket's size: how many may go out at once after a quiet spell.
    pub event_burst: u32,
    /// Whether the webhook port requires client certificates (the API
    /// server's): `/observed` says so, and says its counts may be forged
    /// when it does not.
    pub authenticated_callers: bool,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        Self {
            rate_per_second: 200,
            max_identities: 256,
            max_items: 256,
            max_record_bytes: 1024 * 1024,
            queue_bytes: 8 * 1024 * 1024,
            event_interval: Some(Duration::from_secs(5)),
            event_rate_per_second: 5,
            event_burst: 20,
            authenticated_callers: false,
        }
    }
}

/// Jobs waiting for the observer; beyond this they are dropped.
const QUEUE: usize = 1024;
/// Events waiting to be sent; beyond this they are dropped.
const EVENT_QUEUE: usize = 256;
/// Limit on one call to the Kubernetes API (the object's read, an Event).
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// At most [`OBJECT_EVENTS`] Events on one object in this window, whoever
/// the writers: a caller who knows an object's uid cannot flood it by
/// claiming ever new writers.
const OBJECT_WINDOW: Duration = Duration::from_secs(60);
/// See [`OBJECT_WINDOW`].
const OBJECT_EVENTS: u32 = 12;
/// The limiters' maps are pruned of expired entries past this size.
const PRUNE_AT: usize = 10_000;

/// One decided write, for the observer: a copy of what it reads, never the
/// request body.
#[derive(Debug)]
struct Job {
    write: ReviewedWrite,
    rules: Arc<Ownership>,
    /// For a denied or trimmed write: the Event's reason and violations.
    stopped: Option<(Stopped, Vec<Violation>)>,
    /// This job's share of the queue's byte budget, returned when it is dropped.
    _reserved: Reserved,
}

/// A token bucket: `rate` tokens a second, at most `burst` saved up; full
/// at the start.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    pub(crate) fn new(rate_per_second: u32, burst: u32, now: Instant) -> Self {
        Self {
            rate: f64::from(rate_per_second),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.refilled = self.refilled.max(now);
    }

    /// Whether a token is there to take.
    pub(crate) fn ready(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= 1.0
    }

    /// Takes a token if there is one.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if self.ready(now) {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A budget of bytes shared by the handlers (which reserve) and the
/// observer (whose jobs return their share when dropped).
#[derive(Debug)]
struct ByteBudget {
    limit: usize,
    used: Arc<AtomicUsize>,
}

/// A share of a [`ByteBudget`], returned on drop.
#[derive(Debug)]
struct Reserved {
    used: Arc<AtomicUsize>,
    bytes: usize,
}

impl ByteBudget {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            used: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// `bytes` of the budget, if that many are left.
    fn reserve(&self, bytes: usize) -> Option<Reserved> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .ok()
            .map(|_| Reserved {
                used: self.used.clone(),
                bytes,
            })
    }

    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What a violation held by a job takes, roughly.
fn violation_bytes(violation: &Violation) -> usize {
    let item = match &violation.item {
        Item::Field(path) => path.segments().iter().map(|s| s.len() + size_of::<String>()).sum(),
        Item::Condition(ty) => ty.len(),
    };
    size_of::<Violation>() + violation.owner.len() + item
}

/// The handlers' side of the observer: the rate limit, the queue and its
/// byte budget, and the record it fills.
#[derive(Debug)]
pub struct Observations {
    sender: mpsc::Sender<Job>,
    receiver: Mutex<Option<mpsc::Receiver<Job>>>,
    bucket: Mutex<TokenBucket>,
    budget: ByteBudget,
    record: Arc<Mutex<Observer>>,
    config: ObserveConfig,
    /// When this replica started counting.
    since: SystemTime,
    /// This replica's pod name, when it is given one.
    replica: Option<String>,
}

impl Observations {
    /// An empty record and queue.
    pub fn new(config: ObserveConfig) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE);
        Self {
            sender,
            receiver: Mutex::new(Some(receiver)),
            bucket: Mutex::new(TokenBucket::new(
                config.rate_per_second,
                config.rate_per_second,
                Instant::now(),
            )),
            budget: ByteBudget::new(config.queue_bytes),
            record: Arc::new(Mutex::new(Observer::new(
                config.max_identities,
                config.max_items,
                config.max_record_bytes,
            ))),
            config,
            since: SystemTime::now(),
            replica: std::env::var("POD_NAME").ok(),
        }
    }

    /// Whether a write offered now could be taken (the rate allows one):
    /// only then does the request path copy the write out.
    pub(crate) fn ready(&self) -> bool {
        self.bucket.lock().is_ok_and(|mut bucket| bucket.ready(Instant::now()))
    }

    /// Offers a decided status write of a guarded resource to the observer:
    /// taken when the rate allows and the queue has room in jobs and bytes,
    /// else counted as skipped. Never waits.
    ///
    /// Costs the request path, for at most `rate_per_second` writes a
    /// second: the statuses' text kept while the review is read (the request
    /// path copies a write only while [`ready`](Self::ready)), and a copy of
    /// the facts (cut) and the two statuses; the body is not kept.
    pub fn offer(&self, metrics: &Metrics, write: Copied, rules: Arc<Ownership>, decision: &Decision) {
        if matches!(write, Copied::Declined) || !self.take_token() {
            metrics.observation_skipped("rate");
            return;
        }
        let Copied::Write(write) = write else {
            return;
        };
        // A dry run wrote nothing: neither recorded nor an Event.
        if write.facts.dry_run {
            return;
        }
        let stopped = Stopped::of(decision.outcome).map(|s| (s, decision.violations.clone()));
        let violations = stopped.iter().flat_map(|(_, v)| v).map(violation_bytes).sum::<usize>();
        let Some(reserved) = self.budget.reserve(size_of::<Job>() + write.bytes() + violations) else {
            metrics.observation_skipped("bytes");
            return;
        };
        let job = Job {
            write: *write,
            rules,
            stopped,
            _reserved: reserved,
        };
        if self.sender.try_send(job).is_err() {
            metrics.observation_skipped("queue");
        }
    }

    fn take_token(&self) -> bool {
        match self.bucket.lock() {
            Ok(mut bucket) => bucket.take(Instant::now()),
            Err(_) => false,
        }
    }

    /// The record as `GET /observed` serves it, with what it is based on.
    pub fn snapshot(&self) -> ObservedWriters {
        let mut snapshot = self.record.lock().map(|r| r.snapshot()).unwrap_or_default();
        snapshot.basis = Some(Basis {
            counted: COUNTED.to_owned(),
            replica: self.replica.clone(),
            since: humantime::format_rfc3339_seconds(self.since).to_string(),
            authenticated_callers: self.config.authenticated_callers,
            rate_per_second: self.config.rate_per_second,
        });
        snapshot
    }

    /// Starts the observer (and, with `client`, an event interval and an
    /// event rate, the Events sender). Once only: later calls do nothing.
    pub fn spawn(&self, metrics: Arc<Metrics>, client: Option<kube::Client>, tasks: &mut tokio::task::JoinSet<()>) {
        let Some(receiver) = self.receiver.lock().ok().and_then(|mut r| r.take()) else {
            return;
        };
        let events = match (client, self.config.event_interval) {
            (Some(client), Some(interval)) if self.config.event_rate_per_second > 0 => {
                let (sender, queue) = mpsc::channel(EVENT_QUEUE);
                let limits = EventLimits::new(
                    interval,
                    self.config.event_rate_per_second,
                    self.config.event_burst,
                    Instant::now(),
                );
                tasks.spawn(send_events(client, queue, limits, metrics.clone()));
                Some(sender)
            }
            _ => None,
        };
        tracing::info!(
            rate_per_second = self.config.rate_per_second,
            queue_bytes = self.config.queue_bytes,
            events = events.is_some(),
            event_rate_per_second = self.config.event_rate_per_second,
            authenticated_callers = self.config.authenticated_callers,
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

/// An Event to send, if the object is found: what the review claims, and
/// the note (at most the 1 kB an Event holds).
#[derive(Debug)]
struct Pending {
    stopped: Stopped,
    facts: WriteFacts,
    note: String,
}

async fn observe(
    mut jobs: mpsc::Receiver<Job>,
    record: Arc<Mutex<Observer>>,
    metrics: Arc<Metrics>,
    events: Option<mpsc::Sender<Pending>>,
) {
    while let Some(job) = jobs.recv().await {
        let write = match read(job.write, &job.rules) {
            Ok(Some(write)) => write,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "the observer could not read a status");
                metrics.observation_skipped("unreadable");
                continue;
            }
        };
        if let Ok(mut record) = record.lock() {
            let identity = record.record(&write);
            metrics.observed(&write.facts.group, &write.facts.resource, &identity);
        }
        let (Some(events), Some((stopped, violations))) = (&events, job.stopped) else {
            continue;
        };
        let items: Vec<String> = violations.iter().map(ToString::to_string).collect();
        let note = event_note(format!(
            "status write by {} {}: it changed {}",
            write.facts.writer,
            stopped.verb(),
            items.join(", ")
        ));
        let pending = Pending {
            stopped,
            facts: write.facts,
            note,
        };
        if events.try_send(pending).is_err() {
            metrics.event(stopped.reason(), "dropped");
        }
    }
}

/// Why an Event was not sent before its object was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// One for this object, reason and writer went out within the interval.
    Interval,
    /// [`OBJECT_EVENTS`] went out on this object within [`OBJECT_WINDOW`].
    Object,
    /// The Events rate, in all.
    Rate,
}

impl Limit {
    /// The `result` label of `statusguard_events_total`.
    fn result(self) -> &'static str {
        match self {
            Self::Interval => "limited",
            Self::Object => "object_limit",
            Self::Rate => "rate_limit",
        }
    }
}

/// The limits an Event passes before its object is read, kept by the
/// sender alone. Keys are hashes (with a per-process random key) of what
/// the review claims, so a forged review's long strings are never held.
#[derive(Debug)]
struct EventLimits {
    interval: Duration,
    rate: TokenBucket,
    hasher: RandomState,
    /// By (object, reason, writer): when one was last sent.
    last_sent: HashMap<u64, Instant>,
    /// By object: the window's start and how many were sent in it.
    per_object: HashMap<u64, (Instant, u32)>,
}

/// The keys of an Event that passed [`EventLimits::check`].
#[derive(Debug, Clone, Copy)]
struct Claim {
    key: u64,
    object: u64,
}

impl EventLimits {
    fn new(interval: Duration, rate_per_second: u32, burst: u32, now: Instant) -> Self {
        Self {
            interval,
            rate: TokenBucket::new(rate_per_second, burst.max(1), now),
            hasher: RandomState::new(),
            last_sent: HashMap::new(),
            per_object: HashMap::new(),
        }
    }

    /// Whether an Event on `object` (its uid) for `writer` may go out now;
    /// changes nothing, so that an Event whose object is not found costs
    /// none of the limits.
    fn check(&mut self, object: &str, stopped: Stopped, writer: &str, now: Instant) -> Result<Claim, Limit> {
        let claim = Claim {
            key: self.hasher.hash_one((object, stopped, writer)),
            object: self.hasher.hash_one(object),
        };
        if self
            .last_sent
            .get(&claim.key)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.interval)
        {
            return Err(Limit::Interval);
        }
        if self.per_object.get(&claim.object).is_some_and(|(start, sent)| {
            now.saturating_duration_since(*start) < OBJECT_WINDOW && *sent >= OBJECT_EVENTS
        }) {
            return Err(Limit::Object);
        }
        if !self.rate.ready(now) {
            return Err(Limit::Rate);
        }
        Ok(claim)
    }

    /// An Event that passed [`check`](Self::check) went out.
    fn sent(&mut self, claim: Claim, now: Instant) {
        self.rate.take(now);
        if self.last_sent.len() >= PRUNE_AT {
            let interval = self.interval;
            self.last_sent
                .retain(|_, at| now.saturating_duration_since(*at) < interval);
        }
        if self.per_object.len() >= PRUNE_AT {
            self.per_object
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < OBJECT_WINDOW);
        }
        self.last_sent.insert(claim.key, now);
        let window = self.per_object.entry(claim.object).or_insert((now, 0));
        if now.saturating_duration_since(window.0) >= OBJECT_WINDOW {
            *window = (now, 0);
        }
        window.1 += 1;
    }
}

/// What reading the object a review names found.
#[derive(Debug)]
enum Found {
    /// It exists with the review's uid.
    Object,
    /// No object with the review's uid (or the review names none that
    /// could be read): why.
    Nothing(&'static str),
    /// The read failed.
    Failed(String),
}

/// Reads the metadata of the object `facts` names, at the version of the
/// review's resource, and compares its uid with the review's.
async fn find_object(client: &kube::Client, facts: &WriteFacts) -> Found {
    let Some(uid) = facts.uid.as_deref() else {
        return Found::Nothing("the review names no uid");
    };
    // These go into the URL's path: refused rather than escaped, since no
    // real object has other names.
    if !is_dns_label(&facts.version)
        || !facts.namespace.as_deref().is_none_or(is_dns_label)
        || !is_object_name(&facts.name)
        || !is_kind(&facts.kind)
    {
        return Found::Nothing("the review names no object that could exist");
    }
    let resource = ApiResource {
        group: facts.group.clone(),
        version: facts.version.clone(),
        api_version: facts.api_version(),
        kind: facts.kind.clone(),
        plural: facts.resource.clone(),
    };
    let api: Api<DynamicObject> = match &facts.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    match tokio::time::timeout(EVENT_TIMEOUT, api.get_metadata_opt(&facts.name)).await {
        Err(_) => Found::Failed("the API server did not answer in time".into()),
        Ok(Err(e)) => Found::Failed(e.to_string()),
        Ok(Ok(None)) => Found::Nothing("no such object"),
        Ok(Ok(Some(object))) if object.metadata.uid.as_deref() == Some(uid) => Found::Object,
        Ok(Ok(Some(_))) => Found::Nothing("the object has another uid"),
    }
}

async fn send_events(
    client: kube::Client,
    mut queue: mpsc::Receiver<Pending>,
    mut limits: EventLimits,
    metrics: Arc<Metrics>,
) {
    let reporter = Reporter {
        controller: "statusguard".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // kube-runtime's recorder: repeats of one (object, reason, writer) become
    // one Event whose series counts them.
    let recorder = Recorder::new(client.clone(), reporter);
    // Resources whose objects could not be read: warned of once each (a
    // missing grant would otherwise warn at every denial).
    let mut warned: HashSet<(String, String)> = HashSet::new();
    while let Some(pending) = queue.recv().await {
        let facts = &pending.facts;
        let reason = pending.stopped.reason();
        let object = facts.uid.as_deref().unwrap_or(&facts.name);
        let claim = match limits.check(object, pending.stopped, &facts.writer, Instant::now()) {
            Ok(claim) => claim,
            Err(limit) => {
                metrics.event(reason, limit.result());
                continue;
            }
        };
        match find_object(&client, facts).await {
            Found::Object => {}
            Found::Nothing(why) => {
                tracing::debug!(why, group = %facts.group, resource = %facts.resource,
                    namespace = ?facts.namespace, name = %facts.name, uid = ?facts.uid,
                    "no Event for a review whose object was not found with its uid");
                metrics.event(reason, "unverified");
                continue;
            }
            Found::Failed(error) => {
                if warned.insert((facts.group.clone(), facts.resource.clone())) {
                    tracing::warn!(%error, group = %facts.group, resource = %facts.resource,
                        "cannot read an object to check a review's uid, so no Event is sent (does the server's role grant get on this resource?); further failures for this resource are logged at debug");
                } else {
                    tracing::debug!(%error, group = %facts.group, resource = %facts.resource, "cannot read an object to check a review's uid");
                }
                metrics.event(reason, "failed");
                continue;
            }
        }
        limits.sent(claim, Instant::now());
        let (event, regarding) = event_for(&pending);
        match tokio::time::timeout(EVENT_TIMEOUT, recorder.publish(&event, &regarding)).await {
            Ok(Ok(())) => metrics.event(reason, "sent"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, object = %facts.name, "could not send an Event");
                metrics.event(reason, "failed");
            }
            Err(_) => {
                tracing::warn!(object = %facts.name, "the Events API did not answer in time");
                metrics.event(reason, "failed");
            }
        }
    }
}

/// The Event for a denied or trimmed write, and the object it regards.
fn event_for(pending: &Pending) -> (Event, ObjectReference) {
    let facts = &pending.facts;
    let event = Event {
        type_: EventType::Warning,
        reason: pending.stopped.reason().into(),
        note: Some(pending.note.clone()),
        action: "ReviewStatusWrite".into(),
        secondary: writer_reference(&facts.writer),
    };
    let regarding = ObjectReference {
        api_version: Some(facts.api_version()),
        kind: Some(facts.kind.clone()),
        name: Some(facts.name.clone()),
        namespace: facts.namespace.clone(),
        uid: facts.uid.clone(),
        ..Default::default()
    };
    (event, regarding)
}

/// The ServiceAccount behind a `system:serviceaccount:NS:NAME` user name
/// (none unless both are names a ServiceAccount can have).
fn writer_reference(username: &str) -> Option<ObjectReference> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    if !is_dns_label(namespace) || !is_dns_subdomain(name) {
        return None;
    }
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ServiceAccount".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    })
}

/// An RFC 1123 label: a namespace, a version.
fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && is_dns_name(name, false)
}

/// An RFC 1123 subdomain: most objects' names.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && is_dns_name(name, true)
}

fn is_dns_name(name: &str, dots: bool) -> bool {
    let alphanumeric = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alphanumeric(first)
                && alphanumeric(last)
                && bytes.iter().all(|&c| alphanumeric(c) || c == b'-' || dots && c == b'.')
        }
        _ => false,
    }
}

/// A name the API server accepts in a path (not `.` or `..`, no `/` or
/// `%`), further kept to the characters a URL path holds unescaped.
fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&c))
}

/// A kind: a letter, then letters and digits.
fn is_kind(kind: &str) -> bool {
    kind.len() <= 63
        && kind.bytes().next().is_some_and(|c| c.is_ascii_alphabetic())
        && kind.bytes().all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests;
