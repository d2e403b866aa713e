//! The webhook endpoints: read the body, answer through the one pipeline,
//! record, reply. The decision itself is [`crate::admission::decide::decide`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Version, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt as _;
use tracing::field::Empty;

use crate::admission::answer::{Answer, RequestFacts, Verdict, answer_observing};
use crate::admission::decide::{Decision, Endpoint, Outcome};
use crate::admission::observe::{Copied, observed_at};
use crate::admission::wire::encode_response;
use crate::ownership::Ownership;
use crate::rules::{self, ConfigMapRef};
use crate::server::limits::{AdmitError, INLINE_DECISION_BYTES};
use crate::server::state::App;

/// The TLS port's routes. Any other method on these paths gets 405, any
/// other path 404 (axum's defaults).
/// With `ownership` (cluster mode) also the check of that ConfigMap's
/// writes, `/validate-ownership`.
pub fn router(app: Arc<App>, ownership: Option<ConfigMapRef>) -> Router {
    let mut router = Router::new()
        .route("/validate", post(|State(app), req| admit(app, Endpoint::Validate, req)))
        .route("/mutate", post(|State(app), req| admit(app, Endpoint::Mutate, req)));
    if let Some(origin) = ownership {
        let origin = Arc::new(origin);
        router = router.route(
            rules::admission::PATH,
            post(move |State(app), req| admit_ownership_document(app, origin, req)),
        );
    }
    router
        .layer(middleware::from_fn_with_state(app.clone(), close_when_draining))
        .with_state(app)
}

/// While the server drains (from SIGTERM through the shutdown delay), each
/// HTTP/1.1 answer says `Connection: close`: the caller drops that
/// connection once it has read the answer and dials anew, reaching a replica
/// still in the Service's endpoints. Closing idle keep-alive connections
/// instead races a request being written on one, and the API server does not
/// retry a POST that met a closed connection: that write would be rejected
/// under `Fail`. (HTTP/2 callers get a GOAWAY when the delay ends, which
/// has no such race.)
async fn close_when_draining(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let http1 = request.version() <= Version::HTTP_11;
    let mut response = next.run(request).await;
    if http1 && app.is_shutting_down() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reserves and reads the body of a review, within the limits every
/// request has; `Err` is the answer when it cannot be read.
async fn admitted_body(app: &App, request: Request) -> Result<(Bytes, crate::server::limits::Admission), Response> {
    let content_length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Held until the answer is made: the body's bytes and a request slot.
    let mut admission = match app.budget.admit(content_length).await {
        Ok(admission) => admission,
        Err(e) => {
            let status = match e {
                AdmitError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                AdmitError::Busy | AdmitError::TooManyWaiting => StatusCode::TOO_MANY_REQUESTS,
            };
            app.metrics.refused_before_reading(&e);
            tracing::warn!(status = status.as_u16(), reason = %e, "request refused before it was read");
            return Err(plain(status, e));
        }
    };
    let declared = content_length.and_then(|n| usize::try_from(n).ok());
    let body = match read_body(app, request.into_body(), declared).await {
        Ok(body) => body,
        Err((status, reason)) => {
            // A client that went away mid-body hears nothing: not worth a warning.
            if status == StatusCode::BAD_REQUEST {
                tracing::debug!(status = status.as_u16(), %reason, "request body unreadable");
            } else {
                tracing::warn!(status = status.as_u16(), %reason, "request refused before it was read");
            }
            return Err(plain(status, reason));
        }
    };
    admission.keep_only(body.len());
    Ok((body, admission))
}

/// A write of the ownership ConfigMap: parsed on a decision thread (a
/// document is YAML, and a forged one may be large), answered in-band.
#[tracing::instrument(name = "ownership_review", skip_all)]
async fn admit_ownership_document(app: Arc<App>, origin: Arc<ConfigMapRef>, request: Request) -> Response {
    let (body, _admission) = match admitted_body(&app, request).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let answered = on_a_decision_thread(&app, move || {
        rules::admission::review(&body, &origin).map(|mut response| encode_response(&mut response))
    });
    match answered.await {
        Some(Ok(Ok(json))) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Some(Ok(Err(e))) => plain(StatusCode::INTERNAL_SERVER_ERROR, e),
        Some(Err(e)) => plain(StatusCode::BAD_REQUEST, format!("not an AdmissionReview: {e}")),
        None => plain(StatusCode::SERVICE_UNAVAILABLE, "the review could not be decided"),
    }
}

fn plain(status: StatusCode, reason: impl std::fmt::Display) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{reason}\n"),
    )
        .into_response()
}

#[tracing::instrument(name = "review", skip_all, fields(endpoint = endpoint.as_str(), uid = Empty, writer = Empty, decision = Empty))]
async fn admit(app: Arc<App>, endpoint: Endpoint, request: Request) -> Response {
    let (body, _admission) = match admitted_body(&app, request).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    // A small review is decided on this async worker, a large one on a
    // blocking thread, at most
    // [`Limits::decision_threads`](crate::server::limits::Limits) at a time,
    // so that no review holds up the async workers (and with them `/healthz`
    // and every other review). `None` only if the blocking thread panicked (a
    // bug; the request gets 503 and the server goes on).
    let decided_here = body.len() <= INLINE_DECISION_BYTES;
    let decided = if decided_here {
        Some(answer_and_offer(&app, &body, endpoint))
    } else {
        let shared = app.clone();
        on_a_decision_thread(&app, move || answer_and_offer(&shared, &body, endpoint)).await
    };
    let Some((answer, elapsed)) = decided else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "the review could not be decided");
    };
    record(&app, endpoint, &answer, elapsed);
    // An answer decided on this worker waits until the worker has run its
    // other ready tasks and looked at its sockets (a poll that does not
    // block; under load at the latest after 61 tasks, tokio's event
    // interval): the reviews that arrived on other connections are decided
    // first, their answers reach their callers back to back, and a caller
    // that had gone idle is woken once for them, not once each (waking
    // another core costs the sender about 5 µs in a VM; BENCHMARKS.md,
    // "answers written together"). A lone review pays one more turn of the
    // worker. A review decided on a thread of its own comes back alone, and
    // is answered at once.
    if decided_here {
        tokio::task::yield_now().await;
    }
    let status = StatusCode::from_u16(answer.http_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, answer.content_type)], answer.body).into_response()
}

/// Runs `work` on a blocking thread, at most
/// [`Limits::decision_threads`](crate::server::limits::Limits) at a time.
/// Waiting for a thread ends with the request if its caller goes away.
/// `None` only if no thread could be had or the work panicked (a bug; the
/// request gets 503 and the server goes on).
async fn on_a_decision_thread<T: Send + 'static>(app: &App, work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let thread = app.budget.decision_thread().await?;
    let done = tokio::task::spawn_blocking(move || {
        let done = work();
        drop(thread);
        done
    });
    match done.await {
        Ok(done) => Some(done),
        Err(e) => {
            tracing::error!(error = %e, "a decision thread failed");
            None
        }
    }
}

/// The answer under the rules in force, and how long it took; a decided
/// status write is then offered to the observer.
fn answer_and_offer(app: &App, body: &Bytes, endpoint: Endpoint) -> (Answer, Duration) {
    let started = Instant::now();
    let rules = app.rules.current();
    // The write is copied out for the observer only while it could take it.
    let observing = app.observations.ready(body.len());
    let (answer, write) = answer_observing(rules.as_deref(), body, endpoint, observing);
    let elapsed = started.elapsed();
    if let (Verdict::Decided(decision), Some(rules)) = (&answer.verdict, rules) {
        observe(app, endpoint, body.len(), write, rules, decision);
    }
    (answer, elapsed)
}

/// Offers a status write of a guarded resource to the observer, once per
/// write: at the endpoint that observes its mode ([`observed_at`]).
fn observe(
    app: &App,
    endpoint: Endpoint,
    body_bytes: usize,
    write: Copied,
    rules: Arc<Ownership>,
    decision: &Decision,
) {
    if decision.mode.is_some_and(|mode| observed_at(mode) == endpoint) {
        app.observations.offer(&app.metrics, body_bytes, write, rules, decision);
    }
}

/// Metrics for every answer, a log line for every denial, trim, warning
/// and error; nothing from the object itself beyond its name.
fn record(app: &App, endpoint: Endpoint, answer: &Answer, elapsed: Duration) {
    let span = tracing::Span::current();
    if let Some(request) = &answer.request {
        span.record("uid", request.uid.as_str());
    }
    match &answer.verdict {
        Verdict::Decided(decision) => {
            span.record("writer", decision.writer.as_str());
            span.record("decision", decision.outcome.as_str());
            app.metrics.decision(endpoint, decision, elapsed);
            log_decision(endpoint, answer.request.as_ref(), decision);
        }
        Verdict::Refused { code, reason } => {
            app.metrics.error(endpoint, elapsed);
            tracing::warn!(code, %reason, "review denied: it cannot be decided");
        }
        Verdict::Failed { reason } => {
            app.metrics.error(endpoint, elapsed);
            tracing::warn!(status = answer.http_status, %reason, "request refused");
        }
        Verdict::NotReady => {
            app.metrics.error(endpoint, elapsed);
            tracing::warn!(
                status = answer.http_status,
                "review refused: no ownership rules in force yet"
            );
        }
    }
}

/// One self-contained line per decision that denied, trimmed or warned, so
/// that a log search needs no span context.
fn log_decision(endpoint: Endpoint, request: Option<&RequestFacts>, decision: &Decision) {
    if !matches!(decision.outcome, Outcome::Denied | Outcome::Trimmed | Outcome::Warned)
        || !tracing::enabled!(tracing::Level::INFO)
    {
        return;
    }
    let violated: Vec<String> = decision.violations.iter().map(ToString::to_string).collect();
    let (uid, name, namespace, dry_run) = request.map_or(("", "", "", false), |r| {
        (r.uid.as_str(), r.name.as_str(), r.namespace.as_str(), r.dry_run)
    });
    tracing::info!(
        uid,
        endpoint = endpoint.as_str(),
        decision = decision.outcome.as_str(),
        writer = %decision.writer,
        name,
        namespace,
        dry_run,
        group = %decision.labels.group,
        resource = %decision.labels.resource,
        violations = %violated.join("; "),
        "status write {}", decision.outcome.as_str()
    );
}

/// Reads the whole body within the size limit and the request timeout.
async fn read_body(app: &App, body: Body, declared: Option<usize>) -> Result<Bytes, (StatusCode, String)> {
    let limits = app.budget.limits();
    let limit = limits.max_body_bytes;
    let read = tokio::time::timeout(limits.request_timeout, collect_compact(body, limit, declared)).await;
    match read {
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time".to_owned(),
        )),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if is_length_limit(&*e) => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {limit} bytes"),
        )),
        Ok(Err(e)) => Err((StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}"))),
    }
}

/// Reads a body of at most `limit` bytes into one buffer, copying each
/// frame out as it arrives, `declared` bytes reserved at the second frame.
///
/// Not `to_bytes`, which holds every frame until the end: an HTTP/2 frame
/// is a slice of the connection's read buffer and keeps all of it alive, so
/// a peer that sent 257-byte DATA frames between 16 KB frames the server
/// throws away made a body of 2 MB hold 55 MiB (RELIABILITY.md, "Hostile
/// callers"). A body of one frame is kept as it came, without a copy.
async fn collect_compact(body: Body, limit: usize, declared: Option<usize>) -> Result<Bytes, axum::BoxError> {
    let mut body = http_body_util::Limited::new(body, limit);
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        // Trailers carry nothing a review needs.
        let Ok(data) = frame?.into_data() else { continue };
        if data.is_empty() {
            continue;
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            Some(earlier) => {
                joined.reserve(declared.unwrap_or(0).max(earlier.len() + data.len()));
                joined.extend_from_slice(&earlier);
                joined.extend_from_slice(&data);
            }
            None => joined.extend_from_slice(&data),
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

fn is_length_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(frames: Vec<Bytes>) -> Body {
        Body::from_stream(futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>)))
    }

    #[tokio::test]
    async fn frames_are_joined_in_order() {
        let frames: Vec<Bytes> = [&b"{\"a\":"[..], b"[1,2", b"]}"]
            .into_iter()
            .map(Bytes::from_static)
            .collect();
        let joined = collect_compact(body_of(frames), 100, Some(11)).await.unwrap();
        assert_eq!(&joined[..], b"{\"a\":[1,2]}");
    }

    #[tokio::test]
    async fn a_body_of_one_frame_is_kept_as_it_came() {
        let frame = Bytes::from(vec![b' '; 4096]);
        let kept = collect_compact(body_of(vec![frame.clone()]), 8192, None).await.unwrap();
        assert_eq!(kept.as_ptr(), frame.as_ptr());
    }

    /// The frames of a body are slices of one large buffer, as an HTTP/2
    /// connection's are: once a frame is read, nothing holds it, so small
    /// frames do not keep their buffers alive while the rest arrives.
    #[tokio::test]
    async fn no_frame_is_held_while_the_rest_arrives() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let held = Arc::new(AtomicBool::new(false));
        let buffer = Bytes::from(vec![b'x'; 1 << 20]);
        // Frame i is cut from the buffer as it is sent; from the third on,
        // no earlier one may still be alive (the first two are joined when
        // the second arrives).
        let frames = futures::stream::unfold((buffer.clone(), 0usize, held.clone()), |(buffer, i, held)| async move {
            if i == 100 {
                return None;
            }
            if i >= 2 && !buffer.is_unique() {
                held.store(true, Ordering::SeqCst);
            }
            let frame = buffer.slice(i * 257..(i + 1) * 257);
            Some((Ok::<_, std::io::Error>(frame), (buffer, i + 1, held)))
        });
        drop(buffer);
        let joined = collect_compact(Body::from_stream(frames), 1 << 20, None).await.unwrap();
        assert_eq!(joined.len(), 25_700);
        assert!(
            !held.load(Ordering::SeqCst),
            "an earlier frame was held while the body arrived"
        );
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_as_such() {
        let frames = vec![Bytes::from(vec![b' '; 60]), Bytes::from(vec![b' '; 60])];
        let refused = collect_compact(body_of(frames), 100, None).await.unwrap_err();
        assert!(is_length_limit(&*refused), "{refused}");
    }
}
