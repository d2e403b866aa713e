//! One request pipeline, body to answer: read and decide (in one pass where
//! the body allows it), encode. `/validate`,
//! `/mutate` and `statusguard review` all answer through [`answer`], so the
//! CLI prints exactly what the server would send.
//!
//! A body that is not a review gets HTTP 400 with a one-line reason. Once a
//! review has parsed, every answer is an AdmissionReview: a request that
//! cannot be decided is denied in the review itself, with a code and a
//! message the API server shows the writer, as kube's admission examples do.
//! Only "no rules in force yet" stays an HTTP 503, so that the webhook's
//! `failurePolicy` (not statusguard) decides what an unready server means.

use crate::decision::{Decision, Endpoint, read_and_decide};
use crate::ownership::Ownership;
use crate::review::{encode_response, parse_request, refuse};

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
    let read = match rules {
        Some(rules) => read_and_decide(rules, body, endpoint).map(|(request, decided)| (request, Some(decided))),
        None => parse_request(body).map(|request| (request, None)),
    };
    let (request, decided) = match read {
        Ok(read) => read,
        Err(e) => return plain(400, None, Verdict::Failed { reason: e.to_string() }),
    };
    let uid = Some(RequestFacts {
        uid: request.uid.clone(),
        name: request.name.clone(),
        namespace: request.namespace.clone().unwrap_or_default(),
        dry_run: request.dry_run,
    });
    let Some(decided) = decided else {
        return plain(503, uid, Verdict::NotReady);
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
    match encoded {
        Ok((body, verdict)) => Answer {
            http_status: 200,
            content_type: JSON,
            body,
            request: uid,
            verdict,
        },
        Err(e) => plain(500, uid, Verdict::Failed { reason: e.to_string() }),
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
