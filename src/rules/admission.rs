//! The ownership ConfigMap, checked at the door: in cluster mode the server
//! registers a webhook of its own on CREATE and UPDATE of that one
//! ConfigMap, so that `kubectl apply` of an invalid document fails at once
//! and lists every problem, instead of being tolerated (and reported) after
//! it is stored.
//!
//! That webhook has `failurePolicy: Ignore`: a fix must never be blocked
//! while the server is down. What gets past it unchecked is still handled
//! as before: the last valid document stays in force.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::admission::AdmissionResponse;
use serde::Deserialize;

use crate::admission::wire;
use crate::ownership::CONFIGMAP_KEY;
use crate::rules::source::{ConfigMapRef, LoadError, from_configmap};

/// The path of the check on the TLS port.
pub const PATH: &str = "/validate-ownership";

/// The most a ConfigMap can hold (the API server refuses a larger one): a
/// document over it is refused unread, so that a forged review cannot make
/// the YAML parser build more.
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Only what the check reads of a review: everything else (the old object,
/// the user, the options) is skipped unbuilt, so that what a forged review
/// makes the server hold is its document's text, no tree of values.
#[derive(Deserialize)]
struct Review {
    request: Option<Request>,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
    object: Option<Object>,
}

#[derive(Deserialize)]
struct Object {
    kind: Option<String>,
    data: Option<BTreeMap<String, String>>,
}

/// The answer to an AdmissionReview of the ownership ConfigMap `origin`:
/// allowed when the document it would store is valid, else denied with 422
/// and every problem. Only a body that is no AdmissionReview at all is an
/// error (the caller answers 400): a review is always answered in-band.
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
    Ok(match problems(object.data, origin) {
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

/// Every problem of the document a ConfigMap with `data` holds, if it is
/// not valid.
fn problems(data: Option<BTreeMap<String, String>>, origin: &ConfigMapRef) -> Option<Vec<String>> {
    let too_large = data
        .as_ref()
        .and_then(|d| d.get(CONFIGMAP_KEY))
        .is_some_and(|text| text.len() > MAX_DOCUMENT_BYTES);
    if too_large {
        return Some(vec![format!(
            "its {CONFIGMAP_KEY:?} is over {MAX_DOCUMENT_BYTES} bytes, more than a ConfigMap can hold"
        )]);
    }
    let configmap = ConfigMap {
        data,
        ..Default::default()
    };
    match from_configmap(&configmap, origin) {
        Ok(_) => None,
        Err(LoadError::MissingKey { .. }) => Some(vec![format!("it has no key {CONFIGMAP_KEY:?}")]),
        Err(e) => Some(e.problems()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::rules::source::EMBEDDED_OWNERSHIP;
    use crate::test_support::{Target, body, update_review};

    fn review_of(document: Option<&str>) -> Vec<u8> {
        let data = match document {
            Some(text) => json!({CONFIGMAP_KEY: text}),
            None => json!({"other": "x"}),
        };
        let configmap = Target {
            group: "",
            kind: "ConfigMap",
            resource: "configmaps",
            sub_resource: None,
            namespace: "ops",
            name: "ownership",
        };
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "ownership", "namespace": "ops"}, "data": data});
        let mut review = update_review(&configmap, "someone", object, None);
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
