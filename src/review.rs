//! AdmissionReview on the wire: reading the parts of a request the decision
//! needs, and writing the response in the form the API server documents.
//!
//! The request side is a narrow view of `admission.k8s.io/v1`: of `object`
//! and `oldObject` only the `status` is kept, as unparsed text
//! ([`RawValue`]) borrowed from the body, and the decision later parses only
//! the status paths its rules read (`project_status`). Everything else is
//! skipped by serde_json without being built, and without recursion, so
//! neither the size nor the depth of an object costs more than reading it. The response side is kube's
//! [`AdmissionResponse`].

use std::fmt;

use base64::Engine as _;
use kube::core::admission::{AdmissionResponse, META_API_VERSION_V1, META_KIND, Operation};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::ownership::PathTree;

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
    /// Required by the API, read by nobody here.
    #[serde(rename = "kind")]
    _kind: IgnoredAny,
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
    /// Nothing will be persisted.
    #[serde(default)]
    pub dry_run: bool,
}

/// An object of a review: only its `status`, unparsed; every other member
/// is skipped unread.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct ObjectView<'a> {
    /// `status`, absent or `null` alike as `None`.
    #[serde(borrow, default)]
    pub status: Option<&'a RawValue>,
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

/// What the single pass knows of a request when it reaches its first
/// object: enough to say which status paths the decision will read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestHead<'h> {
    pub(crate) resource: &'h ResourceRef,
    pub(crate) sub_resource: Option<&'h str>,
    pub(crate) operation: &'h Operation,
    pub(crate) user_info: &'h Writer,
}

/// The statuses of `oldObject` and `object`, projected while the body was
/// read: `None` for an absent (or `null`) object, `Some(None)` for an object
/// without a status.
#[derive(Debug, Default)]
pub(crate) struct ProjectedStatuses {
    pub(crate) old: Option<Option<Value>>,
    pub(crate) new: Option<Option<Value>>,
}

/// Reads a review in one pass: the status of each object is projected on
/// the paths that `plan` names for the request's head as it is read, so
/// that the body is scanned once. `plan` returns `None` when the decision
/// will not read the objects (then they are skipped unread).
///
/// This is the fast path of [`parse_request`] followed by
/// `project_status`, and answers alike in every member order. The plan is
/// made at the first object that follows the head (where the API server
/// writes it); an object read before that is kept as text, as
/// [`parse_request`] keeps it, and projected at the end once the plan is
/// known. It gives up (`None`) wherever the two could differ or where it
/// cannot do the work alone: a body that is not a well-formed review, a
/// head member written after the plan was made from the head (it could
/// change the plan), a duplicate member, or a read value deeper than the
/// bounded parse. The caller then takes the two-pass path, which answers
/// every one of those cases.
pub(crate) fn parse_request_projecting<'b, 't>(
    body: &'b [u8],
    plan: impl Fn(RequestHead<'_>) -> Option<&'t PathTree>,
) -> Option<(ReviewRequest<'b>, Option<ProjectedStatuses>)> {
    // Checked as UTF-8 once, here, rather than string by string as it is
    // read: the text the status is projected from is then known to be valid.
    let text = std::str::from_utf8(body).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let read = EnvelopeSeed(&plan).deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    read
}

struct EnvelopeSeed<'p, P>(&'p P);

type Read<'b> = Option<(ReviewRequest<'b>, Option<ProjectedStatuses>)>;

impl<'de, 't, P: Fn(RequestHead<'_>) -> Option<&'t PathTree>> DeserializeSeed<'de> for EnvelopeSeed<'_, P> {
    type Value = Read<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, 't, P: Fn(RequestHead<'_>) -> Option<&'t PathTree>> Visitor<'de> for EnvelopeSeed<'_, P> {
    type Value = Read<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let (mut api_version, mut kind, mut request) = (None::<&str>, None::<&str>, None);
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            match key.as_ref() {
                "apiVersion" if api_version.is_none() => api_version = Some(map.next_value()?),
                "kind" if kind.is_none() => kind = Some(map.next_value()?),
                "request" if request.is_none() => request = Some(map.next_value_seed(RequestSeed(self.0))?),
                "apiVersion" | "kind" | "request" => return Err(A::Error::custom("duplicate member")),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let is_v1 = api_version == Some(META_API_VERSION_V1) && kind == Some(META_KIND);
        Ok(request.filter(|_| is_v1).flatten())
    }
}

/// The members of a request, as its derived `Deserialize` names them.
#[derive(Deserialize, PartialEq, Eq)]
#[serde(field_identifier, rename_all = "camelCase")]
enum RequestMember {
    Uid,
    Kind,
    Resource,
    SubResource,
    Name,
    Namespace,
    Operation,
    UserInfo,
    Object,
    OldObject,
    DryRun,
    #[serde(other)]
    Other,
}

/// How the single pass read one object.
enum ObjectRead<'b> {
    Unseen,
    /// Before the plan could be made, or where the decision reads no
    /// status: as [`parse_request`] reads it.
    Raw(Option<ObjectView<'b>>),
    /// Its status projected on the plan's paths.
    Projected(Option<Option<Value>>),
}

struct RequestSeed<'p, P>(&'p P);

impl<'de, 't, P: Fn(RequestHead<'_>) -> Option<&'t PathTree>> DeserializeSeed<'de> for RequestSeed<'_, P> {
    type Value = Read<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, 't, P: Fn(RequestHead<'_>) -> Option<&'t PathTree>> Visitor<'de> for RequestSeed<'_, P> {
    type Value = Read<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionRequest")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut uid: Option<String> = None;
        let mut kind_seen = false;
        let mut resource: Option<ResourceRef> = None;
        let mut sub_resource: Option<Option<String>> = None;
        let mut name: Option<String> = None;
        let mut namespace: Option<Option<String>> = None;
        let mut operation: Option<Operation> = None;
        let mut user_info: Option<Writer> = None;
        let mut dry_run: Option<bool> = None;
        let (mut object, mut old_object) = (ObjectRead::Unseen, ObjectRead::Unseen);
        // The plan, made once at the first object: Some(paths to read or None).
        let mut planned: Option<Option<&'t PathTree>> = None;
        let duplicate = || A::Error::custom("duplicate member");
        while let Some(member) = map.next_key::<RequestMember>()? {
            let is_head = matches!(
                member,
                RequestMember::Resource
                    | RequestMember::SubResource
                    | RequestMember::Operation
                    | RequestMember::UserInfo
            );
            if is_head && planned.is_some() {
                return Err(A::Error::custom("a request member after an object"));
            }
            match member {
                RequestMember::Uid if uid.is_none() => uid = Some(map.next_value()?),
                RequestMember::Kind if !kind_seen => {
                    kind_seen = true;
                    map.next_value::<IgnoredAny>()?;
                }
                RequestMember::Resource if resource.is_none() => resource = Some(map.next_value()?),
                RequestMember::SubResource if sub_resource.is_none() => sub_resource = Some(map.next_value()?),
                RequestMember::Name if name.is_none() => name = Some(map.next_value()?),
                RequestMember::Namespace if namespace.is_none() => namespace = Some(map.next_value()?),
                RequestMember::Operation if operation.is_none() => operation = Some(map.next_value()?),
                RequestMember::UserInfo if user_info.is_none() => user_info = Some(map.next_value()?),
                RequestMember::DryRun if dry_run.is_none() => dry_run = Some(map.next_value()?),
                RequestMember::Object | RequestMember::OldObject => {
                    let slot = if member == RequestMember::Object {
                        &mut object
                    } else {
                        &mut old_object
                    };
                    if !matches!(slot, ObjectRead::Unseen) {
                        return Err(duplicate());
                    }
                    if planned.is_none()
                        && let (Some(resource), Some(operation), Some(user_info)) = (&resource, &operation, &user_info)
                    {
                        planned = Some((self.0)(RequestHead {
                            resource,
                            sub_resource: sub_resource.as_ref().and_then(Option::as_deref),
                            operation,
                            user_info,
                        }));
                    }
                    *slot = match planned {
                        Some(Some(paths)) => ObjectRead::Projected(map.next_value_seed(ObjectStatus(paths))?),
                        _ => ObjectRead::Raw(map.next_value()?),
                    };
                }
                RequestMember::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => return Err(duplicate()),
            }
        }
        let (Some(uid), true, Some(resource), Some(operation), Some(user_info)) =
            (uid, kind_seen, resource, operation, user_info)
        else {
            return Ok(None);
        };
        // The paths the plan reads: an object read raw before the plan was
        // made (a member order other than the API server's) is projected on
        // them now, so that one pass answers what two passes answer in every
        // order. A status too deep for the bounded parse is left to them.
        let paths = planned.flatten();
        let mut projected = ProjectedStatuses::default();
        let (Ok(object), Ok(old_object)) = (
            settle(object, paths, &mut projected.new),
            settle(old_object, paths, &mut projected.old),
        ) else {
            return Ok(None);
        };
        // Projected statuses only where the plan read them; an object the
        // plan never reached (absent) is absent in them too.
        let statuses = paths.is_some().then_some(projected);
        let request = ReviewRequest {
            uid,
            _kind: IgnoredAny,
            resource,
            sub_resource: sub_resource.flatten(),
            name: name.unwrap_or_default(),
            namespace: namespace.flatten(),
            operation,
            user_info,
            object,
            old_object,
            dry_run: dry_run.unwrap_or_default(),
        };
        Ok(Some((request, statuses)))
    }
}

/// An object as the single pass leaves it, with its status projected on
/// `paths` (when the plan reads objects) into `projected`.
fn settle<'b>(
    read: ObjectRead<'b>,
    paths: Option<&PathTree>,
    projected: &mut Option<Option<Value>>,
) -> Result<Option<ObjectView<'b>>, ProjectError> {
    Ok(match read {
        ObjectRead::Unseen => None,
        ObjectRead::Raw(view) => {
            if let (Some(paths), Some(ObjectView { status })) = (paths, view) {
                *projected = Some(match status {
                    Some(raw) => project_status(raw, paths, Depth::Bounded)?,
                    None => None,
                });
            }
            view
        }
        ObjectRead::Projected(status) => {
            let present = status.is_some().then_some(ObjectView { status: None });
            *projected = status;
            present
        }
    })
}

/// An object (or `null`) whose status is projected on `paths`; every other
/// member is skipped unread.
struct ObjectStatus<'t>(&'t PathTree);

impl<'de> DeserializeSeed<'de> for ObjectStatus<'_> {
    type Value = Option<Option<Value>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ObjectStatus<'_> {
    type Value = Option<Option<Value>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut status = None;
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            if key == "status" {
                if status.is_some() {
                    return Err(serde::de::Error::custom("duplicate member"));
                }
                status = Some(map.next_value_seed(Projection(self.0, Depth::Bounded))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(status.filter(|s| !s.is_null())))
    }
}

impl ReviewRequest<'_> {
    /// The allowing response to this request, to build on.
    pub fn allow(&self) -> AdmissionResponse {
        let mut response = AdmissionResponse::invalid("");
        response.uid.clone_from(&self.uid);
        response.allowed = true;
        response.result = Default::default();
        response
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
        is_status_update(&self.operation, self.sub_resource.as_deref())
    }
}

/// A status UPDATE: the only kind of request statusguard inspects.
pub(crate) fn is_status_update(operation: &Operation, sub_resource: Option<&str>) -> bool {
    *operation == Operation::Update && sub_resource == Some("status")
}

/// A response for a review that could be read but not decided: the API
/// server shows `message` to the writer, with the HTTP-like `code`.
pub fn refuse(mut response: AdmissionResponse, code: u16, reason: &str, message: String) -> AdmissionResponse {
    response.allowed = false;
    response.result = kube::core::Status::failure(&message, reason).with_code(code);
    response
}

/// How deep a parse may nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Depth {
    /// serde_json's default limit (128): for the ordinary stack.
    Bounded,
    /// No limit: only on a stack sized for the text's measured nesting.
    Unbounded,
}

/// Why the status of an object could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProjectError {
    /// Nested deeper than a [`Depth::Bounded`] parse allows: parse again
    /// with [`Depth::Unbounded`] on a stack that fits [`nesting_depth`].
    #[error("nested deeper than the bounded parse allows")]
    TooDeep,
    /// Its values would need more memory than one review is given.
    #[error("{}", crate::value_budget::BudgetExceeded)]
    TooLarge,
    /// Not JSON (the API server never sends this).
    #[error("the object is not valid JSON: {0}")]
    Malformed(serde_json::Error),
}

/// The parts of a status that `paths` names, as a JSON value that holds
/// nothing else: each read path with its whole value, and the object
/// parents that lead to it. A parent that is not an object is kept as
/// `false` (it only matters that it is not an object); a `null` status is
/// `None`. In the conditions list, an item of a type `paths` does not read
/// is kept as `null`, so that every item keeps its index.
pub(crate) fn project_status(status: &RawValue, paths: &PathTree, depth: Depth) -> Result<Option<Value>, ProjectError> {
    let mut deserializer = serde_json::Deserializer::from_str(status.get());
    if depth == Depth::Unbounded {
        deserializer.disable_recursion_limit();
    }
    let status = Projection(paths, depth)
        .deserialize(&mut deserializer)
        .map(Some)
        .map_err(|e| {
            if is_recursion_limit(&e) {
                ProjectError::TooDeep
            } else if crate::value_budget::is_budget_exceeded(&e) {
                ProjectError::TooLarge
            } else {
                ProjectError::Malformed(e)
            }
        })?;
    Ok(status.filter(|s| !s.is_null()))
}

/// serde_json names no error code publicly; this is its message for
/// `ErrorCode::RecursionLimitExceeded` (pinned by a test), also where a
/// condition item's own parse passes it on.
fn is_recursion_limit(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// The deepest nesting of arrays and objects in JSON text, counted without
/// recursion (string contents are skipped).
pub fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in json.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A map key, borrowed from the body unless it holds escapes.
struct BorrowedKey;

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

/// A map key, kept only when `tree` reads below it.
struct ChildKey<'t>(&'t PathTree);

impl<'de, 't> DeserializeSeed<'de> for ChildKey<'t> {
    type Value = Option<(String, &'t PathTree)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 't> Visitor<'de> for ChildKey<'t> {
    type Value = Option<(String, &'t PathTree)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.child(key).map(|child| (key.to_owned(), child)))
    }
}

/// A value projected on `tree`: whole where the tree reads it whole, else
/// only the keys the tree names.
struct Projection<'t>(&'t PathTree, Depth);

impl<'de> DeserializeSeed<'de> for Projection<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.0.is_whole() {
            crate::value_budget::build(deserializer)
        } else if let Some(types) = self.0.condition_types() {
            deserializer.deserialize_any(ConditionsOf(types, self.1))
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

/// The scalar visits of a projecting visitor: `null` becomes `$null`, any
/// other scalar `$other`.
macro_rules! scalars_as {
    ($null:expr, $other:expr) => {
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok($null)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_str<E>(self, _: &str) -> Result<Value, E> {
            Ok($other)
        }
    };
}

/// What stands for a parent that is not an object: only its kind matters.
const NOT_AN_OBJECT: Value = Value::Bool(false);

impl<'de> Visitor<'de> for Projection<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut projected = Map::new();
        while let Some(key) = map.next_key_seed(ChildKey(self.0))? {
            match key {
                Some((key, child)) => {
                    let value = map.next_value_seed(Projection(child, self.1))?;
                    // The last of duplicate keys wins, as in Go and serde_json.
                    projected.insert(key, value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(projected))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(NOT_AN_OBJECT)
    }

    scalars_as!(Value::Null, NOT_AN_OBJECT);
}

/// A conditions list: every item kept in place, read whole only when its
/// type is one of the set (the others become `null`). Anything but a list
/// stands for what it is: absent, or not a list.
struct ConditionsOf<'t>(&'t std::collections::BTreeSet<String>, Depth);

/// One item of a conditions list, read in one pass: its members are kept
/// as unparsed text until its `type` (which Go writes last) is known; only
/// an item of a read type is then built, the others become `null`.
struct ConditionItem<'t>(&'t std::collections::BTreeSet<String>, Depth);

impl<'de> DeserializeSeed<'de> for ConditionItem<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ConditionItem<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // metav1.Condition has six members; room for them without regrowing.
        let mut members: Vec<(std::borrow::Cow<'de, str>, &'de RawValue)> = Vec::with_capacity(8);
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            members.push((key, map.next_value::<&'de RawValue>()?));
        }
        // The last `type` wins, as the last of duplicate keys does in a value.
        let read = members
            .iter()
            .rev()
            .find(|(key, _)| key == "type")
            .and_then(|(_, raw)| {
                serde_json::from_str::<&str>(raw.get())
                    .map(std::borrow::Cow::Borrowed)
                    .or_else(|_| serde_json::from_str::<String>(raw.get()).map(std::borrow::Cow::Owned))
                    .ok()
            })
            .is_some_and(|ty| self.0.contains(ty.as_ref()));
        if !read {
            return Ok(Value::Null);
        }
        let mut item = Map::new();
        for (key, raw) in members {
            let mut deserializer = serde_json::Deserializer::from_str(raw.get());
            if self.1 == Depth::Unbounded {
                deserializer.disable_recursion_limit();
            }
            // A recursion-limit error keeps its message, which asks the
            // caller for the unbounded parse.
            let value = crate::value_budget::build(&mut deserializer).map_err(serde::de::Error::custom)?;
            item.insert(key.into_owned(), value);
        }
        Ok(Value::Object(item))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    scalars_as!(Value::Null, Value::Null);
}

impl<'de> Visitor<'de> for ConditionsOf<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(16));
        while let Some(item) = seq.next_element_seed(ConditionItem(self.0, self.1))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(NOT_AN_OBJECT)
    }

    scalars_as!(Value::Null, NOT_AN_OBJECT);
}

/// Encodes a response as an AdmissionReview.
///
/// kube's `AdmissionResponse` serializes `patch` as an array of numbers
/// (kube-rs/kube#1781); the API documents, and the API server expects, a
/// base64 string. The patch bytes are taken out and written beside the rest
/// of the response in that form, in one serialization pass; `response`
/// is left without its patch, which is now in the bytes.
pub fn encode_response(response: &mut AdmissionResponse) -> Result<Vec<u8>, ReviewError> {
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
        api_version: META_API_VERSION_V1,
        kind: META_KIND,
        response: WireResponse {
            response: &*response,
            patch,
        },
    };
    serde_json::to_vec(&review).map_err(ReviewError::Encode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::FieldPath;
    use serde_json::json;

    fn tree(paths: &[&str]) -> PathTree {
        let paths: Vec<FieldPath> = paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect();
        PathTree::of(&paths)
    }

    fn project(object: Value, paths: &[&str]) -> Option<Value> {
        let text = serde_json::to_string(&object).unwrap();
        let view: ObjectView<'_> = serde_json::from_str(&text).unwrap();
        view.status
            .and_then(|status| project_status(status, &tree(paths), Depth::Bounded).unwrap())
    }

    #[test]
    fn the_projection_holds_the_read_paths_and_their_parents_only() {
        let object = json!({"spec": {"x": 1}, "status": {
            "a": {"b": {"deep": [1, 2]}, "c": 3}, "s": "text", "n": null, "l": [1], "other": {"k": 1}}});
        assert_eq!(
            project(object.clone(), &["a.b", "s.x", "n.y", "l.z", "missing.q"]),
            Some(json!({"a": {"b": {"deep": [1, 2]}}, "s": false, "n": null, "l": false}))
        );
        assert_eq!(project(object, &[]), Some(json!({})));
        assert_eq!(project(json!({"status": null}), &["a"]), None);
        assert_eq!(project(json!({"spec": {}}), &["a"]), None);
        assert_eq!(project(json!({"status": 7}), &["a"]), Some(json!(false)));
    }

    #[test]
    fn deep_values_outside_the_read_paths_are_skipped_at_any_depth() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        let text = format!(r#"{{"spec": {deep}, "status": {{"other": {deep}, "a": 1}}}}"#);
        let view: ObjectView<'_> = serde_json::from_str(&text).unwrap();
        let status = project_status(view.status.unwrap(), &tree(&["a"]), Depth::Bounded).unwrap();
        assert_eq!(status, Some(json!({"a": 1})));
    }

    #[test]
    fn a_deep_read_value_asks_for_the_unbounded_parse() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let text = format!(r#"{{"a": {deep}}}"#);
        let raw: &RawValue = serde_json::from_str(&text).unwrap();
        assert!(matches!(
            project_status(raw, &tree(&["a"]), Depth::Bounded),
            Err(ProjectError::TooDeep)
        ));
        let status = project_status(raw, &tree(&["a"]), Depth::Unbounded).unwrap().unwrap();
        assert_eq!(nesting_depth(&text), 201);
        crate::ownership::drop_iteratively(status);
    }

    #[test]
    fn conditions_of_types_nobody_owns_are_kept_in_place_unread() {
        let conditions = FieldPath::parse("conditions").unwrap();
        let tree = PathTree::with_conditions([], &conditions, ["Ready".to_owned()]);
        let text =
            r#"{"conditions": [{"type": "Other", "x": 1}, {"type": "Ready", "m": null}, 5, {"type": "Re\u0061dy"}]}"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        assert_eq!(
            project_status(raw, &tree, Depth::Bounded).unwrap(),
            Some(json!({"conditions": [null, {"type": "Ready", "m": null}, null, {"type": "Ready"}]}))
        );
        // A deep owned condition asks for the unbounded parse too.
        let deep = format!(
            r#"{{"conditions": [{{"type": "Ready", "d": {}1{}}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let raw: &RawValue = serde_json::from_str(&deep).unwrap();
        assert!(matches!(
            project_status(raw, &tree, Depth::Bounded),
            Err(ProjectError::TooDeep)
        ));
        let status = project_status(raw, &tree, Depth::Unbounded).unwrap().unwrap();
        crate::ownership::drop_iteratively(status);
    }

    #[test]
    fn nesting_depth_skips_brackets_in_strings() {
        assert_eq!(nesting_depth(r#"{"a": "[[[{{\"]]", "b": [[1]]}"#), 3);
        assert_eq!(nesting_depth("1"), 0);
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
}
