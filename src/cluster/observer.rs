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

mod event_sender;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

use super::events::{self, Events};
use crate::admission::decide::Decision;
use crate::admission::observe::{Basis, COUNTED, Copied, ObservedWriters, Observer, ReviewedWrite, read};
use crate::metrics::Metrics;
use crate::ownership::{Item, Ownership, Violation};
use event_sender::{EventLimits, Pending, Stopped, send_events};

/// How much the observer may do.
#[derive(Debug, Clone)]
pub struct ObserveConfig {
    /// Writes read per second at most (a token bucket with this burst); 0: none.
    pub rate_per_second: u32,
    /// Request-body bytes of the writes read per second at most (a token
    /// bucket with this burst): the observer's CPU is about proportional
    /// to them; 0: none.
    pub bytes_per_second: u64,
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
            bytes_per_second: DEFAULT_OBSERVE_BYTES_RATE,
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

/// The default of [`ObserveConfig::bytes_per_second`]: 16 MiB of reviews a
/// second, about 40 ms of the observer's CPU (BENCHMARKS.md, issue 25).
pub const DEFAULT_OBSERVE_BYTES_RATE: u64 = 16 * 1024 * 1024;
/// Events waiting to be sent; beyond this they are dropped.
const EVENT_QUEUE: usize = 256;
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
        Self::of(f64::from(rate_per_second), f64::from(burst), now)
    }

    fn of(rate: f64, burst: f64, now: Instant) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
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
        self.has(1.0, now)
    }

    /// Takes a token if there is one.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        self.take_n(1.0, now)
    }

    /// Takes `n` tokens if there are as many.
    fn take_n(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// Whether `n` tokens are there to take.
    fn has(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= n
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
        Item::Entry { list, key, value } => {
            list.segments()
                .iter()
                .map(|s| s.len() + size_of::<String>())
                .sum::<usize>()
                + key.len()
                + value.len()
        }
    };
    size_of::<Violation>() + violation.owner.len() + item
}

/// The handlers' side of the observer: the rate limit, the queue and its
/// byte budget, and the record it fills.
#[derive(Debug)]
pub struct Observations {
    sender: mpsc::Sender<Job>,
    /// Writes, and their request bodies' bytes, taken per second.
    bucket: Mutex<(TokenBucket, TokenBucket)>,
    budget: ByteBudget,
    record: Arc<Mutex<Observer>>,
    config: ObserveConfig,
    /// When this replica started counting.
    since: SystemTime,
    /// This replica's pod name, when it is given one.
    replica: Option<String>,
}

impl Observations {
    /// An empty record and queue, and the observer that reads the queue
    /// once it is [spawned](ObserverLoop::spawn).
    pub fn new(config: ObserveConfig) -> (Self, ObserverLoop) {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let observations = Self {
            sender,
            bucket: Mutex::new((
                TokenBucket::new(config.rate_per_second, config.rate_per_second, Instant::now()),
                // A second's worth: a body larger than that is never observed.
                TokenBucket::of(
                    config.bytes_per_second as f64,
                    config.bytes_per_second as f64,
                    Instant::now(),
                ),
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
        };
        let observer = ObserverLoop {
            receiver,
            record: observations.record.clone(),
            config: observations.config.clone(),
        };
        (observations, observer)
    }

    /// Whether a write of a `body_bytes` request offered now could be taken
    /// (both rates allow it): only then does the request path copy it out.
    pub(crate) fn ready(&self, body_bytes: usize) -> bool {
        let now = Instant::now();
        self.bucket
            .lock()
            .is_ok_and(|mut b| b.0.ready(now) && b.1.has(body_bytes as f64, now))
    }

    /// Offers a decided status write of a guarded resource to the observer:
    /// taken when the rate allows and the queue has room in jobs and bytes,
    /// else counted as skipped. Never waits.
    ///
    /// Costs the request path, for at most `rate_per_second` writes a
    /// second: the statuses' text kept while the review is read (the request
    /// path copies a write only while [`ready`](Self::ready)), and a copy of
    /// the facts (cut) and the two statuses; the body is not kept.
    pub fn offer(
        &self,
        metrics: &Metrics,
        body_bytes: usize,
        write: Copied,
        rules: Arc<Ownership>,
        decision: &Decision,
    ) {
        if matches!(write, Copied::Declined) || !self.take_tokens(body_bytes) {
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

    fn take_tokens(&self, body_bytes: usize) -> bool {
        let now = Instant::now();
        match self.bucket.lock() {
            Ok(mut b) => {
                // Both or neither: a write refused by one rate spends nothing.
                if b.0.ready(now) && b.1.take_n(body_bytes as f64, now) {
                    b.0.take(now)
                } else {
                    false
                }
            }
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
}

/// The observer's side of the queue: reads the offered writes into the
/// record, and passes Events on.
#[derive(Debug)]
pub struct ObserverLoop {
    receiver: mpsc::Receiver<Job>,
    record: Arc<Mutex<Observer>>,
    config: ObserveConfig,
}

impl ObserverLoop {
    /// Starts the observer (and, with `events`, an event interval and an
    /// event rate, the Events sender).
    pub fn spawn(self, metrics: Arc<Metrics>, events: Option<Events>, tasks: &mut tokio::task::JoinSet<()>) {
        let config = &self.config;
        let events = match (events, config.event_interval) {
            (Some(events), Some(interval)) if config.event_rate_per_second > 0 => {
                let (sender, queue) = mpsc::channel(EVENT_QUEUE);
                let limits = EventLimits::new(
                    interval,
                    config.event_rate_per_second,
                    config.event_burst,
                    Instant::now(),
                );
                tasks.spawn(send_events(events, queue, limits, metrics.clone()));
                Some(sender)
            }
            _ => None,
        };
        tracing::info!(
            rate_per_second = config.rate_per_second,
            queue_bytes = config.queue_bytes,
            events = events.is_some(),
            event_rate_per_second = config.event_rate_per_second,
            authenticated_callers = config.authenticated_callers,
            "observing status writes"
        );
        tasks.spawn(observe(self.receiver, self.record, metrics, events));
    }
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
        let note = events::note(format!(
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

#[cfg(test)]
mod tests;
