//! AdmissionReview on the wire: reading a request and writing the response
//! in the form the API server documents.

use base64::Engine as _;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND};

/// Why a body is not an admission review statusguard can answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("malformed JSON: {0}")]
    Json(serde_json::Error),
    #[error("not an AdmissionReview: {0}")]
    NotAReview(serde_json::Error),
    #[error("unsupported review {api_version}/{kind}: statusguard answers {META_API_VERSION_V1}/{META_KIND}")]
    Version { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("could not encode the response: {0}")]
    Encode(serde_json::Error),
}

/// Parses an `admission.k8s.io/v1` AdmissionReview and returns its request.
pub fn parse_request(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ReviewError::NotAReview(e)
        } else {
            ReviewError::Json(e)
        }
    })?;
    if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
        return Err(ReviewError::Version {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// Encodes a response as an AdmissionReview.
///
/// kube's `AdmissionResponse` serializes `patch` as an array of numbers
/// (kube-rs/kube#1781); the API documents, and the API server expects, a
/// base64 string. The patch bytes are taken out and written beside the rest
/// of the response in that form, in one serialization pass.
pub fn encode_response(mut response: AdmissionResponse) -> Result<Vec<u8>, ReviewError> {
    #[derive(serde::Serialize)]
    struct WireResponse<'a> {
        #[serde(flatten)]
        response: &'a AdmissionResponse,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch: Option<String>,
    }
    #[derive(serde::Serialize)]
    struct WireReview<'a> {
        #[serde(rename = "apiVersion")]
        api_version: &'a str,
        kind: &'a str,
        response: WireResponse<'a>,
    }
    let patch = response
        .patch
        .take()
        .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes));
    let review = WireReview {
        api_version: &response.types.api_version,
        kind: &response.types.kind,
        response: WireResponse {
            response: &response,
            patch,
        },
    };
    serde_json::to_vec(&review).map_err(ReviewError::Encode)
}
