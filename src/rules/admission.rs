//! The ownership ConfigMap, checked at the door: in cluster mode the server
//! registers a webhook of its own on CREATE and UPDATE of that one
//! ConfigMap, so that `kubectl apply` of an invalid document fails at once
//! and lists every problem, instead of being tolerated (and reported) after
//! it is stored.
//!
//! That webhook has `failurePolicy: Ignore`: a fix must never be blocked
//! while the server is down. What gets past it unchecked is still handled
//! as before: the last valid document stays in force.

use kube::core::admission::AdmissionResponse;
use serde::Deserialize;

use crate::admission::wire;
use crate::ownership::CONFIGMAP_KEY;
use crate::rules::source::{ConfigMapRef, parse_only_document};

/// The path of the check on the TLS port.
pub const PATH: &str = "/validate-ownership";

/// The most a ConfigMap can hold (the API server refuses a larger one): a
/// document over it is refused unread, so that a forged review cannot make
/// the YAML parser build more.
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Only what the check reads of a review: everything else (the user, the
/// options, every other key of the ConfigMaps) is skipped unbuilt, so that
/// what a forged review makes the server hold is at most its two
/// documents' text, no tree of values.
#[derive(Deserialize)]
struct Review {
    request: Option<Request>,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
    object: Option<Object>,
    #[serde(rename = "oldObject")]
    old_object: Option<Object>,
}

#[derive(Deserialize)]
struct Object {
    kind: Option<String>,
    #[serde(default)]
    data: Data,
}

#[derive(Deserialize, Default)]
struct Data {
    #[serde(rename = "ownership.yaml")]
    document: Option<String>,
}

/// The answer to an AdmissionReview of the ownership ConfigMap `origin`:
/// allowed when the document it would store is valid or is the one already
/// stored (an edit of its labels or annotations, such as `statusguard
/// unregister`'s, is never blocked by a document stored while statusguard
/// was down), else denied with 422 and every problem. Only a body that is
/// no AdmissionReview at all is an error (the caller answers 400): a review
/// is always answered in-band.
pub fn review(body: &[u8], origin: &ConfigMapRef) -> Result<AdmissionResponse, serde_json::Error> {
    let review: Review = serde_json::from_slice(body)?;
    let Some(request) = review.request else {
        return Ok(AdmissionResponse::invalid("the AdmissionReview has no request"));
    };
    let response = wire::allow(&request.uid);
    // A DELETE has nothing to store; anything but a ConfigMap (such as
    // `statusguard probe`'s review) has no document to check.
    let Some(object) = request.object.filter(|o| o.kind.as_deref() == Some("ConfigMap")) else {
        return Ok(response);
    };
    let document = object.data.document;
    if request.old_object.is_some_and(|old| old.data.document == document) {
        return Ok(response);
    }
    Ok(match problems(document.as_deref(), origin) {
        None => response,
        Some(problems) => wire::refuse(
            response,
            422,
            "Invalid",
            format!(
                "ConfigMap {origin} would hold an invalid ownership document, which statusguard would not enforce: {}",
                problems.join("; ")
            ),
        ),
    })
}

/// Every problem of `document`, if it is not a valid one.
fn problems(document: Option<&str>, origin: &ConfigMapRef) -> Option<Vec<String>> {
    let Some(text) = document else {
        return Some(vec![format!("it has no key {CONFIGMAP_KEY:?}")]);
    };
    if text.len() > MAX_DOCUMENT_BYTES {
        return Some(vec![format!(
            "its {CONFIGMAP_KEY:?} is over {MAX_DOCUMENT_BYTES} bytes, more than a ConfigMap can hold"
        )]);
    }
    parse_only_document(&format!("ConfigMap {origin}"), text)
        .err()
        .map(|e| e.problems())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::rules::source::EMBEDDED_OWNERSHIP;
    use crate::test_support::{Target, body, update_review};

    fn configmap(document: Option<&str>) -> Value {
        let data = match document {
            Some(text) => json!({CONFIGMAP_KEY: text, "other": "x"}),
            None => json!({"other": "x"}),
        };
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "ownership", "namespace": "ops"}, "data": data})
    }

    fn review_of(document: Option<&str>) -> Vec<u8> {
        edit_of(None, document)
    }

    /// An UPDATE from `old` (if any) to `new`.
    fn edit_of(old: Option<&str>, new: Option<&str>) -> Vec<u8> {
        let target = Target {
            group: "",
            kind: "ConfigMap",
            resource: "configmaps",
            sub_resource: None,
            namespace: "ops",
            name: "ownership",
        };
        let mut review = update_review(&target, "someone", configmap(new), old.map(|o| configmap(Some(o))));
        review["request"]["uid"] = json!("u-1");
        body(&review)
    }

    fn answer(body: &[u8]) -> Value {
        let origin: ConfigMapRef = "ops/ownership".parse().unwrap();
        let body = wire::encode_response(&mut review(body, &origin).unwrap()).unwrap();
        serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
    }

    #[test]
    fn a_valid_document_is_allowed() {
        let response = answer(&review_of(Some(EMBEDDED_OWNERSHIP)));
        assert_eq!(response["allowed"], true, "{response}");
        assert_eq!(response["uid"], "u-1");
    }

    #[test]
    fn an_invalid_document_is_refused_with_every_problem() {
        let both = EMBEDDED_OWNERSHIP
            .replace(
                "fields: [replicas, scale.lastScaleTime]",
                "fields: [replicas, observedGeneration]",
            )
            .replace("conditions: [Scaled]", "conditions: [Ready]");
        let response = answer(&review_of(Some(&both)));
        assert_eq!(response["allowed"], false, "{response}");
        assert_eq!(response["status"]["code"], 422);
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("observedGeneration"), "{message}");
        assert!(message.contains("Ready"), "{message}");
        assert!(message.starts_with("ConfigMap ops/ownership would hold"), "{message}");
    }

    #[test]
    fn an_edit_that_keeps_the_stored_document_is_never_blocked_by_it() {
        let invalid = "kind: Nope\n";
        assert_eq!(answer(&edit_of(Some(invalid), Some(invalid)))["allowed"], true);
        let other = "kind: Neither\n";
        assert_eq!(answer(&edit_of(Some(invalid), Some(other)))["allowed"], false);
        assert_eq!(
            answer(&edit_of(Some(EMBEDDED_OWNERSHIP), Some(invalid)))["allowed"],
            false
        );
    }

    #[test]
    fn a_configmap_without_the_key_is_refused() {
        let response = answer(&review_of(None));
        assert_eq!(response["allowed"], false);
        assert!(
            response["status"]["message"]
                .as_str()
                .unwrap()
                .contains("no key \"ownership.yaml\""),
            "{response}"
        );
    }

    #[test]
    fn anything_but_a_configmap_has_nothing_to_check() {
        let mut probe: Value = serde_json::from_slice(&review_of(Some("kind: Nope\n"))).unwrap();
        probe["request"]["object"]["kind"] = json!("Probe");
        let response = answer(&serde_json::to_vec(&probe).unwrap());
        assert_eq!(response["allowed"], true, "{response}");
    }

    #[test]
    fn a_document_larger_than_a_configmap_is_refused_unread() {
        let huge = "# padding\n".repeat(MAX_DOCUMENT_BYTES / 10 + 1);
        let response = answer(&review_of(Some(&huge)));
        assert_eq!(response["allowed"], false, "{response}");
        assert!(
            response["status"]["message"]
                .as_str()
                .unwrap()
                .contains("more than a ConfigMap can hold"),
            "{response}"
        );
    }

    #[test]
    fn a_body_that_is_no_review_is_an_error_and_a_review_without_request_is_answered() {
        let origin: ConfigMapRef = "ops/ownership".parse().unwrap();
        assert!(review(b"{", &origin).is_err());
        let empty =
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})).unwrap();
        let answered = review(&empty, &origin).unwrap();
        assert!(!answered.allowed, "{answered:?}");
    }
}
