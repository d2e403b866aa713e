//! What any caller of the TLS port can make the server hold: connections,
//! requests, request bytes and decision threads, each bounded by
//! configuration rather than by the caller's good will.
//!
//! Under `failurePolicy: Fail` every guarded status write in the cluster
//! waits on this server, and the TLS port answers whoever reaches it (unless
//! `--client-ca-file` is set). So the worst a caller can do is written down
//! here, as numbers:
//!
//! - **Connections**: at most [`Limits::max_connections`] are served at once;
//!   more wait in the listen backlog. A connection must finish its TLS
//!   handshake and bring its first request's headers within
//!   [`Limits::header_read_timeout`] of being accepted.
//! - **Buffered, unread bytes per connection**: HTTP/1.1 reads at most
//!   [`H1_MAX_BUF`] ahead of the handler. HTTP/2's flow-control windows bound
//!   what a peer may send before the handler reads it: the first
//!   [`H2_WIDE_CONNECTIONS`] HTTP/2 connections (the API servers', in a
//!   cluster whose port is locked down) get windows of
//!   [`H2_CONNECTION_WINDOW`] and [`H2_STREAM_WINDOW`], for throughput;
//!   every other one gets the protocol's initial window, [`H2_NARROW_WINDOW`],
//!   no more than an HTTP/1.1 connection reads ahead. A stream waiting for
//!   room in the body budget does not read, so its connection's window
//!   fills: across connections, unread bytes are at most
//!   [`Limits::max_connections`] × 64 KiB + [`H2_WIDE_CONNECTIONS`] × 1 MiB
//!   (48 MiB by default). h2 also holds a frame whole until it has
//!   arrived: at most [`H2_MAX_FRAME`], or [`H2_VERIFIED_MAX_FRAME`] on a
//!   wide connection whose client certificate the server verified (the API
//!   server's client then sends a review in one frame). Not bounded yet:
//!   the memory those bytes keep. h2 keeps each DATA frame's bytes as a
//!   slice of the read buffer it arrived in, so a peer that sends small
//!   DATA frames between large frames the server throws away makes each
//!   kept frame hold its whole buffer: about 2 MiB for a waiting stream's
//!   64 KiB window (RELIABILITY.md). A body being read is copied out of
//!   its frames as they arrive, so it holds no more than its bytes.
//! - **Requests waiting**: an HTTP/2 connection carries up to
//!   [`H2_MAX_STREAMS`] requests at once, each holding its headers (at most
//!   [`MAX_HEADER_BYTES`], decoded) and a task while it waits for the
//!   budget below. At most [`Limits::max_inflight_requests`] wait at once;
//!   another gets 429 at once, and its stream's buffered bytes go with it.
//! - **Request bodies**: each at most [`Limits::max_body_bytes`]; all of them
//!   together at most [`Limits::max_inflight_bytes`], reserved before a body
//!   is read (from its `Content-Length`, or the body limit without one) and
//!   held until its answer is made. A request that cannot reserve within
//!   [`Limits::request_timeout`] gets 429; one whose caller goes away stops
//!   waiting and costs nothing more.
//! - **Requests**: at most [`Limits::max_inflight_requests`] read or decided
//!   at once; as many more wait (above), within the same timeout.
//! - **CPU**: a review larger than [`INLINE_DECISION_BYTES`] is decided on a
//!   blocking thread, at most [`Limits::decision_threads`] at a time, so that
//!   no review holds up the async workers that serve every other review (the
//!   admin port, `/healthz` included, has a runtime of its own). A decision
//!   is linear in the review's size, so the work left for a request whose
//!   caller gave up is bounded by the body limit.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// HTTP/1.1: the most a connection's read buffer holds ahead of the handler.
pub const H1_MAX_BUF: usize = 64 * 1024;
/// HTTP/2: what a peer may send on a wide connection before the handler reads.
pub const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// HTTP/2: what a peer may send on one stream of a wide connection before
/// the handler reads.
pub const H2_STREAM_WINDOW: u32 = 256 * 1024;
/// HTTP/2: connections served with the wide windows above at once. A few
/// API servers open one or two connections each; a connection past these
/// works as well, with less in flight (one 35 KB review costs about 7 µs
/// more CPU over narrow windows at saturating load: RELIABILITY.md,
/// "Hostile callers").
pub const H2_WIDE_CONNECTIONS: usize = 16;
/// HTTP/2: the window of every other connection and its streams, the
/// protocol's initial one (a connection's window can grow, never shrink
/// below it).
pub const H2_NARROW_WINDOW: u32 = 65_535;
/// HTTP/2: the largest frame a peer may send on a wide connection whose
/// client certificate the server verified (`--client-ca-file`). Go's HTTP/2
/// client (the API server's) sends a request body in frames as large as the
/// server allows, up to 512 KiB: a 35 KB review in one frame rather than
/// three of the protocol's 16 KiB, read in one piece and kept without a copy
/// (3–5 µs less CPU per review; BENCHMARKS.md, "larger HTTP/2 frames"). Not
/// for an unverified caller: h2 holds a frame whole until it has arrived,
/// and a small DATA frame kept as a slice of the buffer a large frame came
/// in keeps that buffer alive, so larger frames would make the small-frame
/// gap (this module's documentation) up to four times as costly (reasoned
/// from the frame sizes, not measured).
pub const H2_VERIFIED_MAX_FRAME: u32 = 64 * 1024;
/// HTTP/2: the largest frame on every other connection, the protocol's
/// initial one.
pub const H2_MAX_FRAME: u32 = 16 * 1024;
/// HTTP/2: concurrent streams per connection. Go's HTTP/2 client (the API
/// server's) opens another connection when a connection is full.
pub const H2_MAX_STREAMS: u32 = 64;
/// HTTP/2: the most header bytes a request may carry, decoded (HPACK lets
/// a few wire bytes name a large header again). The API server sends well
/// under 2 KiB. (HTTP/1.1's headers are bounded by [`H1_MAX_BUF`].)
pub const MAX_HEADER_BYTES: u32 = 16 * 1024;
/// Reviews up to this size are decided on the async worker that read them:
/// a few hundred microseconds at most, cheaper than a thread hand-off.
pub const INLINE_DECISION_BYTES: usize = 128 * 1024;

/// The largest review the API server sends for a status write, with room.
///
/// The API server refuses request bodies over 3 MiB, and etcd refuses to
/// store an object over 1.5 MiB (`--max-request-bytes`, its default). A
/// status UPDATE's review carries the new object (at most what etcd will
/// store: a larger write fails at storage anyway) and the stored one, each
/// written as JSON; built-in types stored as protobuf can grow when written
/// as JSON. Two objects of 1.5 MiB, twice that for the JSON encoding, and
/// the review around them: 8 MiB. A cluster whose etcd stores larger
/// objects raises `--max-body-bytes` with it.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// The server's bounds; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// Request body bytes held at once, across all requests.
    pub max_inflight_bytes: usize,
    /// Requests read or decided at once.
    pub max_inflight_requests: usize,
    /// TLS connections served at once.
    pub max_connections: usize,
    /// Threads deciding large reviews at once.
    pub decision_threads: usize,
    /// Time allowed from a connection's accept to its first request's
    /// headers, TLS handshake included, and (HTTP/1.1) for each next request's.
    pub header_read_timeout: Duration,
    /// Time allowed for a request to be admitted under the limits and for its body.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_inflight_bytes: 4 * DEFAULT_MAX_BODY_BYTES,
            max_inflight_requests: 256,
            max_connections: 512,
            decision_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Limits that cannot work together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitsError {
    /// A request of the largest size could never be admitted.
    #[error(
        "--max-inflight-bytes ({inflight}) is below --max-body-bytes ({body}): the largest request could never be read"
    )]
    BudgetBelowBody {
        /// The in-flight budget.
        inflight: usize,
        /// The body limit.
        body: usize,
    },
    /// A count that must be at least one.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// Beyond what one reservation can hold (4 GiB).
    #[error("--max-body-bytes ({0}) is over 4 GiB")]
    BodyTooLarge(usize),
}

impl Limits {
    /// Checks that the limits work together.
    pub fn check(&self) -> Result<(), LimitsError> {
        for (value, name) in [
            (self.max_body_bytes, "--max-body-bytes"),
            (self.max_inflight_requests, "--max-inflight-requests"),
            (self.max_connections, "--max-connections"),
            (self.decision_threads, "--decision-threads"),
        ] {
            if value == 0 {
                return Err(LimitsError::Zero(name));
            }
        }
        if u32::try_from(self.max_body_bytes).is_err() {
            return Err(LimitsError::BodyTooLarge(self.max_body_bytes));
        }
        if self.max_inflight_bytes < self.max_body_bytes {
            return Err(LimitsError::BudgetBelowBody {
                inflight: self.max_inflight_bytes,
                body: self.max_body_bytes,
            });
        }
        Ok(())
    }
}

/// The shared budget of requests, body bytes and decision threads.
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    requests: Arc<Semaphore>,
    /// Places to wait for `requests` and `bytes`: a request that finds none
    /// is refused at once rather than held with its headers.
    waiting: Semaphore,
    bytes: Arc<Semaphore>,
    decisions: Arc<Semaphore>,
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdmitError {
    /// Its declared length is over the body limit.
    #[error("the request body is over {limit} bytes")]
    TooLarge {
        /// The body limit.
        limit: usize,
    },
    /// The budget had no room within the request timeout.
    #[error("the server holds as many requests as it may; try again")]
    Busy,
    /// As many requests as may wait for the budget were waiting.
    #[error("as many requests as may wait are waiting; try again")]
    TooManyWaiting,
}

/// What an admitted request holds until its answer is made.
#[derive(Debug)]
pub struct Admission {
    _request: OwnedSemaphorePermit,
    bytes: OwnedSemaphorePermit,
}

impl Admission {
    /// Gives back what was reserved beyond the `read` bytes the body had.
    pub fn keep_only(&mut self, read: usize) {
        let extra = self.bytes.num_permits().saturating_sub(read.max(1));
        if extra > 0 {
            // Dropping the split-off part returns it to the budget.
            drop(self.bytes.split(extra));
        }
    }
}

impl Budget {
    /// An unused budget of `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            requests: Arc::new(Semaphore::new(limits.max_inflight_requests)),
            waiting: Semaphore::new(limits.max_inflight_requests),
            bytes: Arc::new(Semaphore::new(limits.max_inflight_bytes)),
            decisions: Arc::new(Semaphore::new(limits.decision_threads)),
            limits,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Body bytes reserved now, for the metrics.
    pub fn bytes_in_flight(&self) -> usize {
        self.limits.max_inflight_bytes - self.bytes.available_permits()
    }

    /// Admits a request whose body declares `content_length` (or none):
    /// waits for a request slot and for the body's bytes, up to the request
    /// timeout. A body without a declared length reserves the body limit.
    /// At most `max_inflight_requests` wait at once; one more is refused at
    /// once. Dropping the returned future (the caller went away) gives up
    /// waiting.
    pub async fn admit(&self, content_length: Option<u64>) -> Result<Admission, AdmitError> {
        let limit = self.limits.max_body_bytes;
        let reserve = match content_length {
            Some(n) if n > limit as u64 => return Err(AdmitError::TooLarge { limit }),
            Some(n) => n as usize,
            None => limit,
        };
        // Checked in Limits::check: the body limit fits in a u32.
        let reserve = u32::try_from(reserve.max(1)).map_err(|_| AdmitError::TooLarge { limit })?;
        let Ok(_waiting) = self.waiting.try_acquire() else {
            return Err(AdmitError::TooManyWaiting);
        };
        let wait = async {
            let request = self.requests.clone().acquire_owned().await;
            let bytes = self.bytes.clone().acquire_many_owned(reserve).await;
            match (request, bytes) {
                (Ok(request), Ok(bytes)) => Ok(Admission {
                    _request: request,
                    bytes,
                }),
                // The semaphores are never closed.
                _ => Err(AdmitError::Busy),
            }
        };
        tokio::time::timeout(self.limits.request_timeout, wait)
            .await
            .unwrap_or(Err(AdmitError::Busy))
    }

    /// A decision thread, waited for; dropped when the decision is made.
    pub async fn decision_thread(&self) -> Option<OwnedSemaphorePermit> {
        self.decisions.clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_body_bytes: 100,
            max_inflight_bytes: 250,
            max_inflight_requests: 3,
            request_timeout: Duration::from_millis(50),
            ..Limits::default()
        }
    }

    #[test]
    fn the_default_limits_work_together() {
        assert_eq!(Limits::default().check(), Ok(()));
        let budget_below_body = Limits {
            max_inflight_bytes: 10,
            ..Limits::default()
        };
        assert!(matches!(
            budget_below_body.check(),
            Err(LimitsError::BudgetBelowBody { .. })
        ));
        let no_requests = Limits {
            max_inflight_requests: 0,
            ..Limits::default()
        };
        assert_eq!(no_requests.check(), Err(LimitsError::Zero("--max-inflight-requests")));
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_at_once() {
        let budget = Budget::new(limits());
        assert_eq!(
            budget.admit(Some(101)).await.err(),
            Some(AdmitError::TooLarge { limit: 100 })
        );
        assert_eq!(budget.bytes_in_flight(), 0);
    }

    #[tokio::test]
    async fn bytes_past_the_budget_wait_then_get_busy_and_hold_nothing() {
        let budget = Budget::new(limits());
        let first = budget.admit(Some(100)).await.unwrap();
        let second = budget.admit(Some(100)).await.unwrap();
        assert_eq!(budget.bytes_in_flight(), 200);
        // 50 bytes are left: a third body of 100 waits, then is refused.
        assert_eq!(budget.admit(Some(100)).await.err(), Some(AdmitError::Busy));
        assert_eq!(budget.bytes_in_flight(), 200);
        drop(first);
        let third = budget.admit(Some(100)).await.unwrap();
        assert_eq!(budget.bytes_in_flight(), 200);
        drop((second, third));
        assert_eq!(budget.bytes_in_flight(), 0);
    }

    #[tokio::test]
    async fn requests_past_the_count_wait_then_get_busy() {
        let budget = Budget::new(limits());
        let held: Vec<_> = admit_many(&budget, 3).await;
        assert_eq!(budget.admit(Some(1)).await.err(), Some(AdmitError::Busy));
        drop(held);
        assert!(budget.admit(Some(1)).await.is_ok());
    }

    #[tokio::test]
    async fn requests_past_the_waiting_places_are_refused_at_once() {
        let budget = Arc::new(Budget::new(Limits {
            request_timeout: Duration::from_secs(60),
            ..limits()
        }));
        let held = admit_many(&budget, 3).await;
        // Three wait (as many as may be in flight), the fourth is refused
        // without waiting out the timeout.
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let budget = budget.clone();
            waiting.spawn(async move { budget.admit(Some(1)).await.map(|_| ()) });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = std::time::Instant::now();
        assert_eq!(budget.admit(Some(1)).await.err(), Some(AdmitError::TooManyWaiting));
        assert!(started.elapsed() < Duration::from_secs(1));
        // The waiting ones are admitted as room is made.
        drop(held);
        while let Some(admitted) = waiting.join_next().await {
            assert_eq!(admitted.unwrap(), Ok(()));
        }
    }

    async fn admit_many(budget: &Budget, n: usize) -> Vec<Admission> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(budget.admit(Some(1)).await.unwrap());
        }
        held
    }

    #[tokio::test]
    async fn an_unknown_length_reserves_the_limit_and_gives_back_the_rest() {
        let budget = Budget::new(limits());
        let mut admitted = budget.admit(None).await.unwrap();
        assert_eq!(budget.bytes_in_flight(), 100);
        admitted.keep_only(30);
        assert_eq!(budget.bytes_in_flight(), 30);
        admitted.keep_only(0);
        assert_eq!(budget.bytes_in_flight(), 1);
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_stops_waiting_and_holds_nothing() {
        let budget = Arc::new(Budget::new(limits()));
        let first = budget.admit(Some(100)).await.unwrap();
        let second = budget.admit(Some(100)).await.unwrap();
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.admit(Some(100)).await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        waiting.abort();
        assert!(waiting.await.is_err(), "the waiting caller was cancelled");
        drop((first, second));
        assert_eq!(budget.bytes_in_flight(), 0);
    }
}
