//! AdmissionReview on the wire: the one definition of the request
//! statusguard reads, and the response in the form the API server documents.
//!
//! The request side is a narrow view of `admission.k8s.io/v1`: of `object`
//! and `oldObject` only the `metadata.uid` and the `status` are kept, the
//! status as unparsed text ([`RawValue`]) borrowed from the body, and the
//! decision later parses only the status paths its rules read (see
//! `project`). Everything else is skipped by serde_json without being built,
//! and without recursion, so neither the size nor the depth of an object
//! costs more than reading it. [`ReviewRequest`] is the only list of the
//! request's members: the single pass (`one_pass`) reads them through its
//! derived `Deserialize`. The response side is kube's [`AdmissionResponse`].

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use kube::core::admission::{AdmissionResponse, META_API_VERSION_V1, META_KIND, Operation};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// Why a body is not an admission review statusguard can answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReviewError {
    /// Not JSON.
    #[error("malformed JSON: {0}")]
    Json(serde_json::Error),
    /// JSON, but not of the AdmissionReview's shape.
    #[error("not an AdmissionReview: {0}")]
    NotAReview(serde_json::Error),
    /// Another apiVersion or kind.
    #[error("unsupported review {api_version}/{kind}: statusguard answers {META_API_VERSION_V1}/{META_KIND}")]
    Version {
        /// The review's apiVersion.
        api_version: String,
        /// The review's kind.
        kind: String,
    },
    /// A review without `request`.
    #[error("the AdmissionReview has no request")]
    NoRequest,
    /// The response could not be serialized.
    #[error("could not encode the response: {0}")]
    Encode(serde_json::Error),
}

/// The parts of an `admission.k8s.io/v1` AdmissionRequest that statusguard
/// reads, borrowed from the request body.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRequest<'a> {
    /// Copied into the response.
    pub uid: String,
    /// The object's kind (`kind.kind`), for an Event on it; the decision
    /// never reads it, so any other shape of `kind` reads as `None`.
    #[serde(borrow, deserialize_with = "kind_of")]
    pub kind: Option<Cow<'a, str>>,
    /// The resource written.
    pub resource: ResourceRef,
    /// `status` for a write of the status subresource.
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// The object's name (for logs).
    #[serde(default)]
    pub name: String,
    /// The object's namespace (for logs).
    #[serde(default)]
    pub namespace: Option<String>,
    /// UPDATE for PUT and every PATCH alike.
    pub operation: Operation,
    /// Who writes.
    pub user_info: Writer,
    /// The object as it will be stored.
    #[serde(borrow, default)]
    pub object: Option<ObjectView<'a>>,
    /// The object as it is stored.
    #[serde(borrow, default)]
    pub old_object: Option<ObjectView<'a>>,
    /// `options.fieldManager` (the options of an UPDATE or a PATCH alike),
    /// to tell a server-side apply; any other shape reads as `None`.
    #[serde(borrow, default, rename = "options", deserialize_with = "field_manager_of")]
    pub field_manager: Option<Cow<'a, str>>,
    /// Nothing will be persisted (absent or `null`: false).
    #[serde(default, deserialize_with = "null_as_false")]
    pub dry_run: bool,
}

/// The members of [`ReviewRequest`] that the API server writes after the
/// objects (Go's `AdmissionRequest` order): [`ReviewRequest::completed`]
/// reads them alone.
const TAIL_MEMBERS: [&str; 2] = ["dryRun", "options"];

/// The names of [`ReviewRequest`]'s members as its derived `Deserialize`
/// knows them, taken from it once, so that it stays the only list of them.
pub(crate) fn request_members() -> &'static [&'static str] {
    /// A deserializer that only takes the field names a struct gives it.
    struct FieldNames<'f>(&'f mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for FieldNames<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("a struct only"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("the fields are taken"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    static MEMBERS: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
    MEMBERS.get_or_init(|| {
        let mut fields: &'static [&'static str] = &[];
        // Always an error: the names are all it is for.
        let _ = ReviewRequest::deserialize(FieldNames(&mut fields));
        fields
    })
}

impl<'a> ReviewRequest<'a> {
    /// This request, read from `before` (the members up to the objects),
    /// completed with `after` (those after them) as reading all of them at
    /// once would have read it, without reading `before` again: the single
    /// pass reads the head first, to plan the objects' reading. `None` where
    /// it cannot tell (a member of the head after the objects, a member
    /// written twice, a tail member that does not read), and all of them
    /// must be read together, which then says what is wrong.
    pub(crate) fn completed(
        mut self,
        before: &[(Cow<'a, str>, &'a RawValue)],
        after: &[(Cow<'a, str>, &'a RawValue)],
    ) -> Option<Self> {
        let mut seen = [false; TAIL_MEMBERS.len()];
        for (key, _) in before {
            if let Some(at) = TAIL_MEMBERS.iter().position(|m| m == key) {
                seen[at] = true;
            }
        }
        for (key, value) in after {
            let Some(at) = TAIL_MEMBERS.iter().position(|m| m == key) else {
                if request_members().contains(&key.as_ref()) {
                    // A member of the head.
                    return None;
                }
                // Not one of the request's: ignored, as the derive ignores it.
                continue;
            };
            if std::mem::replace(&mut seen[at], true) {
                return None;
            }
            match TAIL_MEMBERS[at] {
                "dryRun" => self.dry_run = null_as_false(*value).ok()?,
                _ => self.field_manager = field_manager_of(*value).ok()?,
            }
        }
        Some(self)
    }
}

fn null_as_false<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or_default())
}

/// An object of a review: its uid and its `status`, unparsed; every other
/// member is skipped unread.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectView<'a> {
    /// What is read of `metadata`; the decision never reads it, so any other
    /// shape of `metadata` reads as empty.
    #[serde(borrow, default, deserialize_with = "metadata_of")]
    pub metadata: MetadataView<'a>,
    /// `status`, absent or `null` alike as `None`.
    #[serde(borrow, default)]
    pub status: Option<&'a RawValue>,
}

/// What a review's object holds in `metadata` that statusguard reads.
#[derive(Debug, Clone, Default)]
pub struct MetadataView<'a> {
    /// `metadata.uid`, for an Event on the object.
    pub uid: Option<Cow<'a, str>>,
    /// `metadata.resourceVersion`: a write that names another than the
    /// stored one fails the API server's precondition after mutation.
    pub resource_version: Option<Cow<'a, str>>,
    /// `metadata.managedFields`, unread: only a write that is denied or
    /// trimmed reads it (to tell an apply, and to hand management back).
    pub managed_fields: Option<&'a RawValue>,
}

/// `request.resource`: what the rules are looked up by, and the version
/// the objects are in.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ResourceRef {
    /// The API group; `""` is the core group.
    pub group: String,
    /// The version the review's objects are in (after the API server's
    /// conversion, under `matchPolicy: Equivalent`); empty when not sent.
    #[serde(default)]
    pub version: String,
    /// The plural resource name.
    pub resource: String,
}

/// `request.userInfo`: who writes. `extra` and `uid` are not read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Writer {
    /// The user name (`system:serviceaccount:NS:NAME` for a service account).
    #[serde(default)]
    pub username: Option<String>,
    /// The groups the user is in.
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

impl Writer {
    /// The user name (empty when the API server sent none).
    pub fn name(&self) -> &str {
        self.username.as_deref().unwrap_or_default()
    }

    /// The groups (none when the API server sent none).
    pub fn group_names(&self) -> &[String] {
        self.groups.as_deref().unwrap_or_default()
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(borrow, default)]
    request: Option<ReviewRequest<'a>>,
}

/// Parses an `admission.k8s.io/v1` AdmissionReview and returns its request.
pub fn parse_request(body: &[u8]) -> Result<ReviewRequest<'_>, ReviewError> {
    let review: Envelope<'_> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ReviewError::NotAReview(e)
        } else {
            ReviewError::Json(e)
        }
    })?;
    if review.api_version != META_API_VERSION_V1 || review.kind != META_KIND {
        return Err(ReviewError::Version {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    review.request.ok_or(ReviewError::NoRequest)
}

/// The request without its objects: what the decision is made on, besides
/// the two statuses.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'h> {
    /// Copied into the response.
    pub uid: &'h str,
    /// The resource written.
    pub resource: &'h ResourceRef,
    /// `status` for a write of the status subresource.
    pub sub_resource: Option<&'h str>,
    /// UPDATE for PUT and every PATCH alike.
    pub operation: &'h Operation,
    /// Who writes.
    pub user_info: &'h Writer,
}

/// The allowing response to the request `uid`, to build on (kube's
/// `AdmissionResponse::from` needs the whole typed request).
pub fn allow(uid: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid.to_owned();
    response.allowed = true;
    response.result = Default::default();
    response
}

impl RequestHead<'_> {
    /// The allowing response to this request, to build on.
    pub fn allow(&self) -> AdmissionResponse {
        allow(self.uid)
    }

    /// A status UPDATE: the only kind of request statusguard inspects.
    pub fn is_status_update(&self) -> bool {
        *self.operation == Operation::Update && self.sub_resource == Some("status")
    }
}

impl ReviewRequest<'_> {
    /// The request without its objects.
    pub fn head(&self) -> RequestHead<'_> {
        RequestHead {
            uid: &self.uid,
            resource: &self.resource,
            sub_resource: self.sub_resource.as_deref(),
            operation: &self.operation,
            user_info: &self.user_info,
        }
    }

    /// The allowing response to this request, to build on.
    pub fn allow(&self) -> AdmissionResponse {
        self.head().allow()
    }

    /// The writer's user name (empty when the API server sent none).
    pub fn username(&self) -> &str {
        self.user_info.name()
    }

    /// The writer's groups.
    pub fn groups(&self) -> &[String] {
        self.user_info.group_names()
    }

    /// A status UPDATE: the only kind of request statusguard inspects.
    pub fn is_status_update(&self) -> bool {
        self.head().is_status_update()
    }
}

/// A response for a review that could be read but not decided: the API
/// server shows `message` to the writer, with the HTTP-like `code`.
pub fn refuse(mut response: AdmissionResponse, code: u16, reason: &str, message: String) -> AdmissionResponse {
    response.allowed = false;
    response.result = kube::core::Status::failure(&message, reason).with_code(code);
    response
}

fn kind_of<'de: 'a, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    deserializer.deserialize_any(StringAt("kind"))
}

fn metadata_of<'de: 'a, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<MetadataView<'a>, D::Error> {
    MetadataOf.deserialize(deserializer)
}

fn field_manager_of<'de: 'a, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    deserializer.deserialize_any(StringAt("fieldManager"))
}

/// `metadata`, read as [`ObjectView`] reads it: its uid and the text of its
/// managedFields, leniently (any other shape reads as empty).
pub(crate) struct MetadataOf;

impl<'de> DeserializeSeed<'de> for MetadataOf {
    type Value = MetadataView<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetadataOf {
    type Value = MetadataView<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut metadata = MetadataView::default();
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            // The last of duplicate keys wins, as in Go and serde_json.
            match key.as_ref() {
                "uid" => metadata.uid = map.next_value_seed(AnyString)?,
                "resourceVersion" => metadata.resource_version = map.next_value_seed(AnyString)?,
                "managedFields" => metadata.managed_fields = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(metadata)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(MetadataView::default())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(MetadataView::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(MetadataView::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(MetadataView::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(MetadataView::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(MetadataView::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(MetadataView::default())
    }
}

/// The string member `.0` of a JSON object, read leniently: anything else
/// (no such member, another type, not an object) is `None`. For facts only
/// an Event names: a review the decision reads is never refused over them.
struct StringAt(&'static str);

/// A string, or `None` for any other JSON value (skipped unread).
struct AnyString;

/// The scalar visits of a lenient visitor: every one is `None`.
macro_rules! scalars_as_none {
    () => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    };
}

impl<'de> Visitor<'de> for StringAt {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            if key == self.0 {
                // The last of duplicate keys wins, as in Go and serde_json.
                found = map.next_value_seed(AnyString)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    scalars_as_none!();
}

impl<'de> DeserializeSeed<'de> for AnyString {
    type Value = Option<Cow<'de, str>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AnyString {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(s.to_owned())))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_as_none!();
}

/// A map key, borrowed from the body unless it holds escapes.
pub(crate) struct BorrowedKey;

impl<'de> DeserializeSeed<'de> for BorrowedKey {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for BorrowedKey {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(key))
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(key.to_owned()))
    }
}

/// Encodes a response as an AdmissionReview.
///
/// kube's `AdmissionResponse` serializes `patch` as an array of numbers
/// (kube-rs/kube#1781); the API documents, and the API server expects, a
/// base64 string. The patch bytes are taken out and written as the
/// response's last member, base64 straight into the body (a restoring patch
/// can be most of the answer: it is neither copied into a string nor
/// scanned for characters to escape, which base64 has none of); `response`
/// is left without its patch, which is now in the bytes.
pub fn encode_response(response: &mut AdmissionResponse) -> Result<Vec<u8>, ReviewError> {
    #[derive(serde::Serialize)]
    struct WireReview<'a> {
        #[serde(rename = "apiVersion")]
        api_version: &'a str,
        kind: &'a str,
        response: &'a AdmissionResponse,
    }
    let patch = response.patch.take();
    let review = WireReview {
        api_version: META_API_VERSION_V1,
        kind: META_KIND,
        response: &*response,
    };
    // A denial's review is a few hundred bytes: one allocation, not the
    // four of a vector grown from serde_json's 128.
    let mut body = Vec::with_capacity(1024);
    serde_json::to_writer(&mut body, &review).map_err(ReviewError::Encode)?;
    let Some(patch) = patch else {
        return Ok(body);
    };
    let encoding = |why: &str| ReviewError::Encode(serde::ser::Error::custom(why));
    // `response` is the review's last member, and never empty (it has a uid):
    // the text ends with `}}`, and its members with `}`.
    if !body.ends_with(b"}}") {
        return Err(encoding("the review does not end with its response"));
    }
    body.truncate(body.len() - 2);
    body.extend_from_slice(br#","patch":""#);
    let encoded = base64::encoded_len(patch.len(), true).ok_or_else(|| encoding("the patch is too large"))?;
    let at = body.len();
    body.resize(at + encoded, 0);
    base64::engine::general_purpose::STANDARD
        .encode_slice(&patch, &mut body[at..])
        .map_err(|e| encoding(&e.to_string()))?;
    body.extend_from_slice(br#""}}"#);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`ReviewRequest::completed`] reads the members after the objects by
    /// name: the tail's names are the derived `Deserialize`'s, so that a
    /// renamed member is never taken for an unknown one.
    #[test]
    fn the_tail_members_are_the_requests_fields() {
        for member in TAIL_MEMBERS {
            assert!(request_members().contains(&member), "{member}");
        }
    }

    #[test]
    fn the_review_envelope_is_checked() {
        let err = parse_request(br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}"#);
        assert!(matches!(err, Err(ReviewError::Version { .. })));
        let err = parse_request(br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#);
        assert!(matches!(err, Err(ReviewError::NoRequest)));
        assert!(matches!(parse_request(b"{"), Err(ReviewError::Json(_))));
        assert!(matches!(parse_request(b"[1]"), Err(ReviewError::NotAReview(_))));
    }

    /// The patch is the response's base64 `patch` member, beside the
    /// `patchType` kube sets, and every other member is kube's.
    #[test]
    fn a_patch_is_encoded_as_base64_in_the_response() {
        let allow = || AdmissionResponse::invalid("").into_review().response.unwrap();
        for patch in [&b"[]"[..], br#"[{"op":"remove","path":"/status/a"}]"#, &[0xff, 0, b'"']] {
            let mut response = allow().with_patch(json_patch::Patch(Vec::new())).unwrap();
            response.uid = "u-\"1".to_owned();
            response.patch = Some(patch.to_vec());
            let body = encode_response(&mut response).unwrap();
            let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                (sent["apiVersion"].as_str(), sent["kind"].as_str()),
                (Some("admission.k8s.io/v1"), Some("AdmissionReview"))
            );
            assert_eq!(sent["response"]["uid"], "u-\"1");
            assert_eq!(sent["response"]["patchType"], "JSONPatch");
            let decoded = base64::engine::general_purpose::STANDARD.decode(sent["response"]["patch"].as_str().unwrap());
            assert_eq!(decoded.unwrap(), patch);
            assert!(response.patch.is_none(), "taken into the body");
        }
        let body = encode_response(&mut allow()).unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(sent["response"].get("patch").is_none() && sent["response"].get("patchType").is_none());
    }

    #[test]
    fn the_facts_only_an_event_names_are_read_leniently() {
        let review = |kind: &str, metadata: &str| {
            format!(
                r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "kind": {kind},
                    "resource": {{"group": "", "resource": "pods"}}, "operation": "UPDATE", "userInfo": {{}},
                    "object": {{"metadata": {metadata}}}}}}}"#
            )
        };
        let body = review(r#"{"kind": "Widget"}"#, r#"{"name": "w", "uid": "1234"}"#);
        let request = parse_request(body.as_bytes()).unwrap();
        assert_eq!(request.kind.as_deref(), Some("Widget"));
        assert_eq!(request.object.and_then(|o| o.metadata.uid).as_deref(), Some("1234"));
        for (kind, metadata) in [
            ("5", "null"),
            (r#"{"kind": 5}"#, r#"[1]"#),
            (r#"[]"#, r#"{"uid": {"a": 1}}"#),
        ] {
            let body = review(kind, metadata);
            let request = parse_request(body.as_bytes()).unwrap();
            assert_eq!(request.kind, None, "{kind}");
            assert_eq!(request.object.and_then(|o| o.metadata.uid), None, "{metadata}");
        }
    }
}
