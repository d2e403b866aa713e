//! The Events of denied and trimmed writes, sent off the observer: each
//! passes limits per object, reason and claimed writer, per object, and in
//! all, and goes out only when its object exists with the review's uid.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType};
use tokio::sync::mpsc;

use super::TokenBucket;
use crate::admission::decide::Outcome;
use crate::admission::observe::WriteFacts;
use crate::cluster::events::Events;
use crate::metrics::Metrics;

/// Limit on one call to the Kubernetes API (the object's read, an Event).
pub(super) const EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// At most [`OBJECT_EVENTS`] Events on one object in this window, whoever
/// the writers: a caller who knows an object's uid cannot flood it by
/// claiming ever new writers.
pub(super) const OBJECT_WINDOW: Duration = Duration::from_secs(60);
/// See [`OBJECT_WINDOW`].
pub(super) const OBJECT_EVENTS: u32 = 12;
/// The limiters' maps are pruned of expired entries past this size.
pub(super) const PRUNE_AT: usize = 10_000;

/// What an Event reports: a rollback the webhook stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Stopped {
    Denied,
    Trimmed,
}

impl Stopped {
    pub(super) fn of(outcome: Outcome) -> Option<Self> {
        match outcome {
            Outcome::Denied => Some(Self::Denied),
            Outcome::Trimmed => Some(Self::Trimmed),
            _ => None,
        }
    }

    /// The Event's reason, and the metric label.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Self::Denied => "StatusRollbackDenied",
            Self::Trimmed => "StatusRollbackTrimmed",
        }
    }

    /// What became of the write, in the Event's note.
    pub(super) fn verb(self) -> &'static str {
        match self {
            Self::Denied => "denied",
            Self::Trimmed => "trimmed (the owners' items restored)",
        }
    }
}

/// An Event to send, if the object is found: what the review claims, and
/// the note (at most the 1 kB an Event holds).
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) stopped: Stopped,
    pub(super) facts: WriteFacts,
    pub(super) note: String,
}

/// Why an Event was not sent before its object was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Limit {
    /// One for this object, reason and writer went out within the interval.
    Interval,
    /// [`OBJECT_EVENTS`] went out on this object within [`OBJECT_WINDOW`].
    Object,
    /// The Events rate, in all.
    Rate,
}

impl Limit {
    /// The `result` label of `statusguard_events_total`.
    pub(super) fn result(self) -> &'static str {
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
pub(super) struct EventLimits {
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
pub(super) struct Claim {
    key: u64,
    object: u64,
}

impl EventLimits {
    pub(super) fn new(interval: Duration, rate_per_second: u32, burst: u32, now: Instant) -> Self {
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
    pub(super) fn check(&mut self, object: &str, stopped: Stopped, writer: &str, now: Instant) -> Result<Claim, Limit> {
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
    pub(super) fn sent(&mut self, claim: Claim, now: Instant) {
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
pub(super) enum Found {
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
pub(super) async fn find_object(client: &kube::Client, facts: &WriteFacts) -> Found {
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

pub(super) async fn send_events(
    recorder: Events,
    mut queue: mpsc::Receiver<Pending>,
    mut limits: EventLimits,
    metrics: Arc<Metrics>,
) {
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
        match find_object(recorder.client(), facts).await {
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
pub(super) fn event_for(pending: &Pending) -> (Event, ObjectReference) {
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
pub(super) fn writer_reference(username: &str) -> Option<ObjectReference> {
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
pub(super) fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && is_dns_name(name, false)
}

/// An RFC 1123 subdomain: most objects' names.
pub(super) fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && is_dns_name(name, true)
}

pub(super) fn is_dns_name(name: &str, dots: bool) -> bool {
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
pub(super) fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&c))
}

/// A kind: a letter, then letters and digits.
pub(super) fn is_kind(kind: &str) -> bool {
    kind.len() <= 63
        && kind.bytes().next().is_some_and(|c| c.is_ascii_alphabetic())
        && kind.bytes().all(|c| c.is_ascii_alphanumeric())
}
