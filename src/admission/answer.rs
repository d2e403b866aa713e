//! One request pipeline, body to answer: read (in one pass where the body
//! allows it), decide, encode. `/validate`, `/mutate` and
//! `statusguard review` all answer through [`answer`], so the CLI prints
//! exactly what the server would send. This is the only reader of request
//! bodies.
//!
//! A body that is not a review gets HTTP 400 with a one-line reason. Once a
//! review has parsed, every answer is an AdmissionReview: a request that
//! cannot be decided is denied in the review itself, with a code and a
//! message the API server shows the writer, as kube's admission examples do.
//! Only "no rules in force yet" stays an HTTP 503, so that the webhook's
//! `failurePolicy` (not statusguard) decides what an unready server means.

use super::decide::{Decision, DecisionError, Endpoint, MAX_NESTING, Outcome, Plan, decide, decide_projected, plan};
use super::managed_fields;
use super::observe::{Copied, ReviewedWrite, StatusTexts, observed_at};
use super::one_pass::{self, Reading};
use super::project::{Captured, Depth, ProjectError, Proofs, Side, capture_status, nesting_depth, realize};
use super::wire::{ObjectView, RequestHead, ReviewError, ReviewRequest, encode_response, parse_request, refuse};
use crate::ownership::{Ownership, PathTree};
use crate::value_budget::{REVIEW_VALUE_BUDGET, ValueBudget};

/// Stack for the parse, compare, copy and encode of one level of a deep
/// value (debug builds use several times what release builds do).
const STACK_PER_LEVEL: usize = 16 * 1024;
const STACK_BASE: usize = 1024 * 1024;

/// What was answered, for logs and metrics.
#[derive(Debug)]
pub enum Verdict {
    /// Decided; its response (without the patch, now in the body) is what was sent.
    Decided(Box<Decision>),
    /// A review that could not be decided, denied in-band.
    Refused {
        /// The code the denial carries.
        code: u16,
        /// Why.
        reason: String,
    },
    /// Not a review (HTTP 400), or a review that could not be encoded (HTTP 500).
    Failed {
        /// Why.
        reason: String,
    },
    /// No rules in force yet (HTTP 503).
    NotReady,
}

/// The facts of a request that logs name: nothing from the object itself
/// beyond its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFacts {
    /// The review's uid.
    pub uid: String,
    /// The object's name.
    pub name: String,
    /// The object's namespace (empty for a cluster-scoped object).
    pub namespace: String,
    /// Nothing will be persisted.
    pub dry_run: bool,
}

/// The answer to one request body.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status: 200 whenever the body holds an AdmissionReview.
    pub http_status: u16,
    /// `application/json` for a review, else `text/plain; charset=utf-8`.
    pub content_type: &'static str,
    /// The encoded review, or a one-line reason.
    pub body: Vec<u8>,
    /// What identifies the request, once it was read.
    pub request: Option<RequestFacts>,
    /// What happened.
    pub verdict: Verdict,
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

/// Answers one request body with the rules in force (`None`: none yet).
pub fn answer(rules: Option<&Ownership>, body: &[u8], endpoint: Endpoint) -> Answer {
    answer_observing(rules, body, endpoint, false).0
}

/// [`answer`], and, when `observe` asks for it, a copy of the status write
/// for the observer, taken from what the single pass read: a decided status
/// UPDATE of a guarded resource, at the endpoint that observes its mode.
pub(crate) fn answer_observing(
    rules: Option<&Ownership>,
    body: &[u8],
    endpoint: Endpoint,
    observe: bool,
) -> (Answer, Copied) {
    let read = match rules {
        Some(rules) => read_and_decide_with_texts(rules, body, endpoint)
            .map(|(request, texts, decided)| (request, texts, Some(decided))),
        None => parse_request(body).map(|request| (request, StatusTexts::default(), None)),
    };
    let (request, texts, decided) = match read {
        Ok(read) => read,
        Err(e) => {
            return (
                plain(400, None, Verdict::Failed { reason: e.to_string() }),
                Copied::Nothing,
            );
        }
    };
    let uid = Some(RequestFacts {
        uid: request.uid.clone(),
        name: request.name.clone(),
        namespace: request.namespace.clone().unwrap_or_default(),
        dry_run: request.dry_run,
    });
    let (Some(decided), Some(rules)) = (decided, rules) else {
        return (plain(503, uid, Verdict::NotReady), Copied::Nothing);
    };
    let decided = decided.map(|decision| with_managed_fields(rules, &request, decision));
    let write = match &decided {
        Ok(decision) if decision.mode.is_some_and(|mode| observed_at(mode) == endpoint) => match observe {
            false => Copied::Declined,
            true => ReviewedWrite::of(&request, texts, rules)
                .map_or(Copied::Nothing, |write| Copied::Write(Box::new(write))),
        },
        _ => Copied::Nothing,
    };
    let encoded = match decided {
        Ok(mut decision) => {
            encode_response(&mut decision.response).map(|body| (body, Verdict::Decided(Box::new(decision))))
        }
        Err(e) => {
            let reason = e.to_string();
            let code = e.code();
            let message = format!("statusguard cannot decide this write: {reason}");
            let reason_word = if code >= 500 { "InternalError" } else { "BadRequest" };
            let mut response = refuse(request.allow(), code, reason_word, message);
            encode_response(&mut response).map(|body| (body, Verdict::Refused { code, reason }))
        }
    };
    let answer = match encoded {
        Ok((body, verdict)) => Answer {
            http_status: 200,
            content_type: JSON,
            body,
            request: uid,
            verdict,
        },
        Err(e) => plain(500, uid, Verdict::Failed { reason: e.to_string() }),
    };
    (answer, write)
}

/// What only the objects' metadata tell, added to a decision: a denial of
/// a server-side apply says that no flag overrides ownership; a trim of a
/// stale write is left to the API server's precondition, and any other hands
/// the management of what it restores back to its managers (see
/// `managed_fields`). Read only for a denial or a trim.
fn with_managed_fields(rules: &Ownership, request: &ReviewRequest<'_>, mut decision: Decision) -> Decision {
    if !matches!(decision.outcome, Outcome::Denied | Outcome::Trimmed) {
        return decision;
    }
    // The managedFields are built, where they are, under a review's budget.
    let _budget = ValueBudget::enter(REVIEW_VALUE_BUDGET);
    let old = request.old_object.as_ref().and_then(|o| o.metadata.managed_fields);
    let new = request.object.as_ref().and_then(|o| o.metadata.managed_fields);
    match decision.outcome {
        Outcome::Denied => {
            let field_manager = request.field_manager.as_deref().unwrap_or_default();
            if managed_fields::is_apply(field_manager, old, new) {
                decision.response.result.message.push_str(managed_fields::APPLY_ADVICE);
            }
        }
        // The API server checks a write's resourceVersion after mutating
        // admission and refuses a stale one with its own 409: restoring
        // items of a write that will fail would only warn its writer of a
        // trim that never happens (the retry, on a fresh copy, is decided).
        Outcome::Trimmed if is_stale(request) => {
            decision.outcome = Outcome::Allowed;
            decision.violations.clear();
            decision.response = request.allow();
        }
        Outcome::Trimmed => {
            let Some(resource_rules) = rules.resource(&request.resource.group, &request.resource.resource) else {
                return decision;
            };
            let items: Vec<_> = decision.violations.iter().map(|v| &v.item).collect();
            match managed_fields::handed_back(resource_rules, &items, old, new) {
                Ok(None) => {}
                Ok(Some(handed_back)) => {
                    if let Err(e) = managed_fields::add_to_patch(&mut decision.response, handed_back) {
                        warn_unhanded(&mut decision, &e.to_string());
                    }
                }
                // The API server validates managedFields before admission:
                // never seen, but the restored values matter more.
                Err(e) => warn_unhanded(&mut decision, &e.to_string()),
            }
        }
        Outcome::Skipped | Outcome::Exempt | Outcome::Allowed | Outcome::Warned => {}
    }
    decision
}

/// The write names a resourceVersion other than the stored object's.
fn is_stale(request: &ReviewRequest<'_>) -> bool {
    let written = request
        .object
        .as_ref()
        .and_then(|o| o.metadata.resource_version.as_deref());
    let stored = request
        .old_object
        .as_ref()
        .and_then(|o| o.metadata.resource_version.as_deref());
    match (written, stored) {
        // The API server compares the versions as numbers (etcd revisions).
        (Some(written), Some(stored)) => match (written.parse::<u64>(), stored.parse::<u64>()) {
            (Ok(written), Ok(stored)) => written != 0 && written != stored,
            _ => !written.is_empty() && written != stored,
        },
        _ => false,
    }
}

fn warn_unhanded(decision: &mut Decision, why: &str) {
    let warning = format!("statusguard restored the values but not who manages them: {why}");
    decision.response.warnings.get_or_insert_with(Vec::new).push(warning);
}

/// Reads a review body and decides it: the request as read, and the
/// decision on it (or why it could not be decided).
///
/// The body is read once where it can be (`one_pass`): the decision's plan
/// is made from the request's head, which the API server writes before the
/// objects, and each object's status is projected on the plan's paths as it
/// is read. Anything the single pass does not handle alone (a member after
/// the objects that changes the plan, a malformed body, a deep read value)
/// is read and decided again by [`parse_request`] and [`decide_request`],
/// which give the same answer for every body the single pass reads, in any
/// member order (a property test and the `review_member_order` fuzz target
/// compare them).
pub fn read_and_decide<'b>(
    rules: &Ownership,
    body: &'b [u8],
    endpoint: Endpoint,
) -> Result<(ReviewRequest<'b>, Result<Decision, DecisionError>), ReviewError> {
    read_and_decide_with_texts(rules, body, endpoint).map(|(request, _, decided)| (request, decided))
}

/// [`read_and_decide`], and the statuses' text as the reader found it (for
/// the observer, which reads what the write changed from it: an observed
/// write is read as fast as any other).
fn read_and_decide_with_texts<'b>(
    rules: &Ownership,
    body: &'b [u8],
    endpoint: Endpoint,
) -> Result<(ReviewRequest<'b>, StatusTexts<'b>, Result<Decision, DecisionError>), ReviewError> {
    // Every value built from this body spends from one budget.
    let _budget = ValueBudget::enter(REVIEW_VALUE_BUDGET);
    let reading = |head: &RequestHead<'_>| match plan(rules, head, endpoint) {
        Plan::Read(resource_rules) => Some(Reading {
            paths: &resource_rules.read_paths,
            writer: resource_rules.writer_position(head.user_info.name()),
            proofs: proofs(endpoint),
        }),
        Plan::Answer(_) | Plan::Refuse(_) => None,
    };
    if let Some((request, statuses, texts)) = one_pass::read(body, reading) {
        let decided = match &statuses {
            Some(statuses) => decide_projected(rules, &request.head(), endpoint, statuses),
            None => decide_request(rules, &request, endpoint),
        };
        return Ok((request, texts, decided));
    }
    let request = parse_request(body)?;
    let decided = decide_request(rules, &request, endpoint);
    let texts = StatusTexts::of(&request);
    Ok((request, texts, decided))
}

/// What changed items are proven changed by their fingerprints for, and
/// left unbuilt: `/validate` names what changed and needs no values;
/// `/mutate` restores the old items, and builds only them.
fn proofs(endpoint: Endpoint) -> Proofs {
    match endpoint {
        Endpoint::Validate => Proofs::Names,
        Endpoint::Mutate => Proofs::Restore,
    }
}

/// Decides a request the wire parse read: its statuses are projected from
/// the text it kept, then decided.
///
/// Objects nested deeper than serde_json's default limit are decided the
/// same way, on a stack allocated for their measured depth, up to
/// [`MAX_NESTING`] levels.
pub fn decide_request(
    rules: &Ownership,
    request: &ReviewRequest<'_>,
    endpoint: Endpoint,
) -> Result<Decision, DecisionError> {
    let _budget = ValueBudget::enter(REVIEW_VALUE_BUDGET);
    match project_and_decide(rules, request, endpoint, Depth::Bounded) {
        Err(DecisionError::TooDeep { .. }) => {
            let mut deepest = 0;
            for (which, view) in [("object", &request.object), ("oldObject", &request.old_object)] {
                let depth = view
                    .as_ref()
                    .and_then(|v| v.status)
                    .map_or(0, |raw| nesting_depth(raw.get()));
                if depth > MAX_NESTING {
                    return Err(DecisionError::TooDeep { which, depth });
                }
                deepest = deepest.max(depth);
            }
            stacker::grow(STACK_BASE + deepest * STACK_PER_LEVEL, || {
                project_and_decide(rules, request, endpoint, Depth::Unbounded)
            })
        }
        other => other,
    }
}

fn project_and_decide(
    rules: &Ownership,
    request: &ReviewRequest<'_>,
    endpoint: Endpoint,
    depth: Depth,
) -> Result<Decision, DecisionError> {
    let head = request.head();
    let Plan::Read(resource_rules) = plan(rules, &head, endpoint) else {
        return decide(rules, &head, endpoint, None, None);
    };
    let reading = (
        &resource_rules.read_paths,
        resource_rules.writer_position(head.user_info.name()),
    );
    let old = capture(request.old_object.as_ref(), "oldObject", reading, depth)?;
    let new = capture(request.object.as_ref(), "object", reading, depth)?;
    let statuses = realize(Some(old), Some(new), depth, proofs(endpoint)).map_err(|(side, e)| match side {
        Side::Old => decision_error("oldObject", e),
        Side::New => decision_error("object", e),
    })?;
    let decided = decide_projected(rules, &head, endpoint, &statuses);
    // Projections made on the unbounded path may be nested as deep as the
    // API server allows: dropped without recursion, whatever the stack.
    // (A bounded projection is at most serde_json's 128 levels deep.)
    if depth == Depth::Unbounded {
        statuses.drop_iteratively();
    }
    decided
}

/// The status of an object the plan reads, captured on `paths`.
fn capture<'b>(
    view: Option<&ObjectView<'b>>,
    which: &'static str,
    (paths, writer): (&PathTree, Option<usize>),
    depth: Depth,
) -> Result<Option<Captured<'b>>, DecisionError> {
    let Some(raw) = view.ok_or(DecisionError::MissingObject(which))?.status else {
        return Ok(None);
    };
    capture_status(raw, paths, writer, depth).map_err(|e| decision_error(which, e))
}

fn decision_error(which: &'static str, e: ProjectError) -> DecisionError {
    match e {
        ProjectError::TooDeep => DecisionError::TooDeep { which, depth: 0 },
        ProjectError::TooLarge => DecisionError::TooLarge { which },
        other => DecisionError::Malformed {
            which,
            reason: other.to_string(),
        },
    }
}

fn plain(http_status: u16, request: Option<RequestFacts>, verdict: Verdict) -> Answer {
    let body = match &verdict {
        Verdict::Failed { reason } | Verdict::Refused { reason, .. } => format!("{reason}\n").into_bytes(),
        Verdict::NotReady => b"no ownership rules in force yet\n".to_vec(),
        Verdict::Decided(_) => Vec::new(),
    };
    Answer {
        http_status,
        content_type: TEXT,
        body,
        request,
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn rules() -> Ownership {
        crate::rules::RulesSource::Embedded.load_local().unwrap()
    }

    fn review(request: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
            .unwrap()
    }

    fn status_update(object: Option<Value>, old: Option<Value>) -> Value {
        json!({
            "uid": "u-1", "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
            "subResource": "status", "name": "w", "namespace": "ns", "operation": "UPDATE",
            "userInfo": {"username": "someone"}, "object": object, "oldObject": old,
        })
    }

    #[test]
    fn a_body_that_is_not_a_review_gets_400_text() {
        let answer = answer(Some(&rules()), b"{nope", Endpoint::Validate);
        assert_eq!((answer.http_status, answer.content_type), (400, TEXT));
        assert!(String::from_utf8_lossy(&answer.body).starts_with("malformed JSON"));
        assert!(answer.request.is_none());
    }

    #[test]
    fn an_undecidable_review_is_denied_in_the_review_with_its_uid() {
        let body = review(status_update(Some(json!({"status": {}})), None));
        let answer = answer(Some(&rules()), &body, Endpoint::Validate);
        assert_eq!((answer.http_status, answer.content_type), (200, JSON));
        let sent: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(sent["response"]["uid"], "u-1");
        assert_eq!(sent["response"]["allowed"], false);
        assert_eq!(sent["response"]["status"]["code"], 400);
        let message = sent["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("must carry oldObject"), "{message}");
        assert!(matches!(answer.verdict, Verdict::Refused { code: 400, .. }));
    }

    #[test]
    fn no_rules_in_force_is_503_for_the_failure_policy_to_decide() {
        let body = review(status_update(Some(json!({})), Some(json!({}))));
        let answer = answer(None, &body, Endpoint::Validate);
        assert_eq!(answer.http_status, 503);
        assert_eq!(answer.request.map(|r| r.uid).as_deref(), Some("u-1"));
    }

    #[test]
    fn a_decided_review_is_200_json() {
        let body = review(status_update(Some(json!({})), Some(json!({}))));
        let answer = answer(Some(&rules()), &body, Endpoint::Validate);
        assert_eq!((answer.http_status, answer.content_type), (200, JSON));
        assert!(matches!(answer.verdict, Verdict::Decided(_)));
    }
}
