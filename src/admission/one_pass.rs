//! The fast reader: a review read in one pass, the status of each object
//! projected on the rules' paths as it is read, so that the body is scanned
//! once. It answers what [`parse_request`](super::wire::parse_request)
//! followed by the projection answers, in every member order: the
//! `review_member_order` and `review_decide` fuzz targets and a property test
//! compare the two on every input.
//!
//! It lists no member of the request: every member but the two objects is
//! kept as unparsed text and read by [`ReviewRequest`]'s own derived
//! `Deserialize` (they are small: names, the resource, the writer), so that
//! adding a member to [`ReviewRequest`] is the only edit.

use std::borrow::Cow;
use std::fmt;

use kube::core::admission::{META_API_VERSION_V1, META_KIND};
use serde::de::value::MapDeserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::project::{Capture, Captured, Depth, ProjectError, ProjectedStatuses, capture_status, realize};
use super::wire::{BorrowedKey, MetadataView, ObjectView, RequestHead, ReviewRequest};
use crate::ownership::PathTree;

/// How the objects of a request are read, as the plan says from its head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading<'t> {
    /// The status paths the decision reads.
    pub(crate) paths: &'t PathTree,
    /// Whether the statuses' text is kept in the request as well (for the
    /// observer): the objects are then read as the wire reads them and
    /// projected from their text.
    pub(crate) keep_text: bool,
    /// The writer's position among the resource's writers: its own values
    /// are never compared, so never read.
    pub(crate) writer: Option<usize>,
}

impl Reading<'_> {
    fn same(this: Option<Self>, other: Option<Self>) -> bool {
        match (this, other) {
            (None, None) => true,
            (Some(a), Some(b)) => std::ptr::eq(a.paths, b.paths) && a.keep_text == b.keep_text && a.writer == b.writer,
            _ => false,
        }
    }
}

/// What one pass read: the request, and the two statuses projected where
/// the plan reads them (`None` where it reads none).
pub(crate) type Read<'b> = (ReviewRequest<'b>, Option<ProjectedStatuses>);

/// Reads a review in one pass. `plan` returns `None` when the decision will
/// not read the objects (then they are skipped unread, their status kept
/// as text as the wire keeps it).
///
/// The plan is made at the first object whose head is complete, from the
/// members read before it (the API server writes the head first); an
/// object read before that is kept as text, and projected at the end on the
/// plan's paths if a later object made one. It gives up (`None`) wherever the two readers could differ or
/// where it cannot do the work alone: a body that is not a well-formed
/// review, a member written after the objects that changes the plan, a
/// duplicate member, or a read value deeper than the bounded parse. The
/// caller then takes the two-pass path, which answers every one of those.
pub(crate) fn read<'b, 't>(body: &'b [u8], plan: impl Fn(&RequestHead<'_>) -> Option<Reading<'t>>) -> Option<Read<'b>> {
    // Checked as UTF-8 once, here, rather than string by string as it is
    // read: the text the status is projected from is then known to be valid.
    let text = std::str::from_utf8(body).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let read = EnvelopeSeed(&plan).deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    read
}

struct EnvelopeSeed<'p, P>(&'p P);

impl<'de, 't, P: Fn(&RequestHead<'_>) -> Option<Reading<'t>>> DeserializeSeed<'de> for EnvelopeSeed<'_, P> {
    type Value = Option<Read<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, 't, P: Fn(&RequestHead<'_>) -> Option<Reading<'t>>> Visitor<'de> for EnvelopeSeed<'_, P> {
    type Value = Option<Read<'de>>;

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

/// How the single pass read one object.
enum ObjectRead<'b> {
    Unseen,
    /// Before the plan could be made, where the decision reads no status,
    /// or where the plan keeps the text: as the wire reads it.
    Raw(Option<ObjectView<'b>>),
    /// Its metadata read, and its status captured on the plan's paths.
    Projected(Option<(MetadataView<'b>, Option<Captured<'b>>)>),
}

/// The request's members other than the objects, as unparsed text.
type Members<'b> = Vec<(Cow<'b, str>, &'b RawValue)>;

/// The request as far as `members` hold it, read by its derived
/// `Deserialize`: the one list of its members. Its objects are left out.
fn request_of<'b>(members: &Members<'b>) -> Result<ReviewRequest<'b>, serde_json::Error> {
    ReviewRequest::deserialize(MapDeserializer::new(members.iter().cloned()))
}

struct RequestSeed<'p, P>(&'p P);

impl<'de, 't, P: Fn(&RequestHead<'_>) -> Option<Reading<'t>>> DeserializeSeed<'de> for RequestSeed<'_, P> {
    type Value = Option<Read<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, 't, P: Fn(&RequestHead<'_>) -> Option<Reading<'t>>> Visitor<'de> for RequestSeed<'_, P> {
    type Value = Option<Read<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionRequest")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // The API server sends about a dozen members.
        let mut members: Members<'de> = Vec::with_capacity(16);
        let (mut object, mut old_object) = (ObjectRead::Unseen, ObjectRead::Unseen);
        // The plan, made once at the first object whose head is complete.
        let mut planned: Option<Option<Reading<'t>>> = None;
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            let slot = match key.as_ref() {
                "object" => &mut object,
                "oldObject" => &mut old_object,
                _ => {
                    members.push((key, map.next_value()?));
                    continue;
                }
            };
            if !matches!(slot, ObjectRead::Unseen) {
                return Err(serde::de::Error::custom("duplicate member"));
            }
            if planned.is_none()
                && let Ok(head) = request_of(&members)
            {
                planned = Some((self.0)(&head.head()));
            }
            *slot = match planned {
                Some(Some(Reading {
                    paths,
                    keep_text: false,
                    writer,
                })) => ObjectRead::Projected(map.next_value_seed(ObjectStatus(paths, writer))?),
                _ => ObjectRead::Raw(map.next_value()?),
            };
        }
        let Ok(mut request) = request_of(&members) else {
            return Ok(None);
        };
        // A member after the objects that would have changed the plan (a
        // member order other than the API server's) is left to two passes.
        if let Some(made) = planned
            && !Reading::same(made, (self.0)(&request.head()))
        {
            return Ok(None);
        }
        // An object read raw before the plan was made is projected on its
        // paths now, so that one pass answers what two passes answer in
        // every order. A status too deep for the bounded parse is left to
        // them, as are objects that all came before the head.
        let reading = planned.flatten().map(|p| (p.paths, p.writer));
        let (mut old_status, mut new_status) = (None, None);
        let (Ok(object), Ok(old_object)) = (
            settle(object, reading, &mut new_status),
            settle(old_object, reading, &mut old_status),
        ) else {
            return Ok(None);
        };
        request.object = object;
        request.old_object = old_object;
        // Projected statuses only where the plan reads them; an object the
        // plan never reached (absent) is absent in them too.
        if reading.is_none() {
            return Ok(Some((request, None)));
        }
        match realize(old_status, new_status, Depth::Bounded) {
            Ok(projected) => Ok(Some((request, Some(projected)))),
            Err(_) => Ok(None),
        }
    }
}

/// An object as the single pass leaves it, with its status projected on
/// `paths` (when the plan reads objects) into `projected`.
fn settle<'b>(
    read: ObjectRead<'b>,
    reading: Option<(&PathTree, Option<usize>)>,
    projected: &mut Option<Option<Captured<'b>>>,
) -> Result<Option<ObjectView<'b>>, ProjectError> {
    Ok(match read {
        ObjectRead::Unseen => None,
        ObjectRead::Raw(view) => {
            if let (Some((paths, writer)), Some(view)) = (reading, &view) {
                *projected = Some(match view.status {
                    Some(raw) => capture_status(raw, paths, writer, Depth::Bounded)?,
                    None => None,
                });
            }
            view
        }
        ObjectRead::Projected(None) => None,
        ObjectRead::Projected(Some((metadata, status))) => {
            *projected = Some(status);
            Some(ObjectView { metadata, status: None })
        }
    })
}

/// An object (or `null`) whose status is projected on `paths`, read as
/// [`ObjectView`] reads the rest of it: its metadata, every other member skipped.
struct ObjectStatus<'t>(&'t PathTree, Option<usize>);

impl<'de> DeserializeSeed<'de> for ObjectStatus<'_> {
    type Value = Option<(MetadataView<'de>, Option<Captured<'de>>)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ObjectStatus<'_> {
    type Value = Option<(MetadataView<'de>, Option<Captured<'de>>)>;

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
        use serde::de::Error;
        let (mut metadata, mut status) = (None, None);
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            match key.as_ref() {
                "status" if status.is_none() => status = Some(map.next_value_seed(Capture(self.0, self.1))?),
                "metadata" if metadata.is_none() => metadata = Some(map.next_value_seed(super::wire::MetadataOf)?),
                "status" | "metadata" => return Err(A::Error::custom("duplicate member")),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let status = status.filter(|s| !matches!(s, Captured::Settled(Value::Null)));
        Ok(Some((metadata.unwrap_or_default(), status)))
    }
}
