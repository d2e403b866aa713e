//! The fast reader: a review read in one pass, the status of each object
//! projected on the rules' paths as it is read, so that the body is scanned
//! once. It answers what [`parse_request`](super::wire::parse_request)
//! followed by the projection answers, in every member order: the
//! `review_member_order` and `review_decide` fuzz targets and a property test
//! compare the two on every input.
//!
//! The second object is read against the first (issue 25): the API server
//! encodes both with one encoder, so what a write did not change is the
//! same bytes in both. Each member of the second object, each member of
//! its status, each item of a list read item by item and each member of
//! such an item whose text is the first's at the same place is moved past
//! with a comparison of bytes ([`Cursor::same`]) and taken as the first read
//! it; only what differs is scanned (after a comparison of the bytes up to
//! where it differs, at each of those levels). An item that differs from
//! the first's in one member's value (a condition's `observedGeneration`)
//! is read as that value, its other members taken unread. A large owned
//! value that did not change is then scanned once, not twice, and built
//! never.
//!
//! It lists no member of the request: every member but the two objects is
//! kept as unparsed text and read by [`ReviewRequest`]'s own derived
//! `Deserialize` (they are small: names, the resource, the writer), once
//! the head is complete, for the plan. The members after the objects
//! (`dryRun`, `options`) then complete that read
//! ([`ReviewRequest::completed`], which takes the names of the head's
//! members from the derive) instead of a second read of every member: 0.7
//! µs of a 3 KB review's 7.0 µs denial (BENCHMARKS.md, "the request read
//! once").

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::marker::PhantomData;

use kube::core::admission::{META_API_VERSION_V1, META_KIND};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde::de::value::MapDeserializer;
use serde_json::Value;
use serde_json::value::RawValue;

use super::cursor::{Cursor, Unread, count_taken, span_in};
use super::observe::StatusTexts;
use super::project::{
    Capture, Captured, CapturedItem, Depth, ItemMembers, ItemRead, ListItem, ProjectError, ProjectedStatuses, Proofs,
    SLOT, capture_status, realize, spend_on_member,
};
use super::wire::{MetadataView, ObjectView, RequestHead, ReviewRequest};
use crate::ownership::{KeyedItems, LookupMap, PathTree};
use crate::value_budget::ValueBudget;

/// How the objects of a request are read, as the plan says from its head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading<'t> {
    /// The status paths the decision reads.
    pub(crate) paths: &'t PathTree,
    /// The writer's position among the resource's writers: its own values
    /// are never compared, so never read.
    pub(crate) writer: Option<usize>,
    /// What changed items are proven changed for, and left unbuilt (see
    /// [`realize`]).
    pub(crate) proofs: Proofs,
}

impl Reading<'_> {
    fn same(this: Option<Self>, other: Option<Self>) -> bool {
        match (this, other) {
            (None, None) => true,
            (Some(a), Some(b)) => std::ptr::eq(a.paths, b.paths) && a.writer == b.writer && a.proofs == b.proofs,
            _ => false,
        }
    }
}

/// What one pass read: the request, the two statuses projected where the
/// plan reads them (`None` where it reads none), and the statuses' text
/// (for the observer, which reads what the write changed from it).
pub(crate) type Read<'b> = (ReviewRequest<'b>, Option<ProjectedStatuses>, StatusTexts<'b>);

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
///
/// The second object read is compared with the first as it is read: each
/// of its members, status members and items of a list read item by item
/// whose text is the first's is moved past with a comparison of bytes and
/// taken as the first read it ([`Cursor::same`]).
pub(crate) fn read<'b, 't>(body: &'b [u8], plan: impl Fn(&RequestHead<'_>) -> Option<Reading<'t>>) -> Option<Read<'b>> {
    // Checked as UTF-8 once, here, rather than string by string as it is
    // read: the text the status is projected from is then known to be valid.
    // simdutf8 checks the fixture's 35 KB in half of std's time (0.30
    // against 0.62 µs: `cargo bench --bench decision -- utf-8`).
    let text = simdutf8::basic::from_utf8(body).ok()?;
    let mut cursor = Cursor::new(text);
    let read = envelope(&mut cursor, &plan).ok()?;
    cursor.end().ok()?;
    read
}

fn envelope<'b, 't>(
    cursor: &mut Cursor<'b>,
    plan: &impl Fn(&RequestHead<'_>) -> Option<Reading<'t>>,
) -> Result<Option<Read<'b>>, Unread> {
    let (mut api_version, mut kind, mut request) = (None::<&str>, None::<&str>, None);
    cursor.object(|cursor, key| {
        match key.as_ref() {
            "apiVersion" if api_version.is_none() => api_version = Some(cursor.value(PhantomData::<&'b str>)?.0),
            "kind" if kind.is_none() => kind = Some(cursor.value(PhantomData::<&'b str>)?.0),
            "request" if request.is_none() => request = Some(read_request(cursor, plan)?),
            "apiVersion" | "kind" | "request" => return Err(Unread),
            _ => {
                cursor.skip()?;
            }
        }
        Ok(())
    })?;
    let is_v1 = api_version == Some(META_API_VERSION_V1) && kind == Some(META_KIND);
    Ok(request.filter(|_| is_v1).flatten())
}

/// How the single pass read one object.
enum ObjectRead<'b> {
    Unseen,
    /// Before the plan could be made, or where the decision reads no
    /// status: as the wire reads it.
    Raw(Option<ObjectView<'b>>),
    /// Its metadata read, and its status captured on the plan's paths.
    Projected(ProjectedObject<'b>),
    /// Read as `Projected`, the first of the two: kept in [`FirstObject`]
    /// until the second is read.
    First,
}

/// The plan the single pass made, with the request's head it made it from
/// and how many members that head was read from.
struct Planned<'b, 't> {
    reading: Option<Reading<'t>>,
    head: ReviewRequest<'b>,
    members_read: usize,
}

/// The request's members other than the objects, as unparsed text.
type Members<'b> = Vec<(Cow<'b, str>, &'b RawValue)>;

/// The request as far as `members` hold it, read by its derived
/// `Deserialize`: the one list of its members. Its objects are left out.
fn request_of<'b>(members: &Members<'b>) -> Result<ReviewRequest<'b>, serde_json::Error> {
    ReviewRequest::deserialize(MapDeserializer::new(members.iter().cloned()))
}

fn read_request<'b, 't>(
    cursor: &mut Cursor<'b>,
    plan: &impl Fn(&RequestHead<'_>) -> Option<Reading<'t>>,
) -> Result<Option<Read<'b>>, Unread> {
    // The API server sends about a dozen members.
    let mut members: Members<'b> = Vec::with_capacity(16);
    let (mut object, mut old_object) = (ObjectRead::Unseen, ObjectRead::Unseen);
    // The plan, made once at the first object whose head is complete.
    let mut planned: Option<Planned<'b, 't>> = None;
    // The first object projected, which the second is compared with.
    let mut first: Option<FirstObject<'b>> = None;
    cursor.object(|cursor, key| {
        let slot = match key.as_ref() {
            "object" => &mut object,
            "oldObject" => &mut old_object,
            _ => {
                members.push((key, cursor.value(PhantomData::<&'b RawValue>)?.0));
                return Ok(());
            }
        };
        if !matches!(slot, ObjectRead::Unseen) {
            return Err(Unread);
        }
        if planned.is_none()
            && let Ok(head) = request_of(&members)
        {
            planned = Some(Planned {
                reading: plan(&head.head()),
                head,
                members_read: members.len(),
            });
        }
        *slot = match planned.as_ref().and_then(|p| p.reading) {
            Some(Reading { paths, writer, .. }) => {
                let (read, text) = read_object(cursor, (paths, writer), first.as_ref())?;
                if first.is_some() {
                    ObjectRead::Projected(read)
                } else {
                    first = Some(FirstObject { read, text });
                    ObjectRead::First
                }
            }
            _ => ObjectRead::Raw(cursor.value(PhantomData::<Option<ObjectView<'b>>>)?.0),
        };
        Ok(())
    })?;
    // The head read for the plan, completed with the members after the
    // objects (the API server's `dryRun` and `options`): its head is the
    // plan's. Else all the members read again.
    let (made, completed) = match planned {
        Some(Planned {
            reading,
            head,
            members_read,
        }) => (
            Some(reading),
            members
                .split_at_checked(members_read)
                .and_then(|(before, after)| head.completed(before, after)),
        ),
        None => (None, None),
    };
    let mut request = match completed {
        Some(request) => request,
        None => {
            let Ok(request) = request_of(&members) else {
                return Ok(None);
            };
            // A member after the objects that would have changed the plan
            // (a member order other than the API server's) is left to two
            // passes.
            if let Some(made) = made
                && !Reading::same(made, plan(&request.head()))
            {
                return Ok(None);
            }
            request
        }
    };
    // An object read raw before the plan was made is projected on its
    // paths now, so that one pass answers what two passes answer in
    // every order. A status too deep for the bounded parse is left to
    // them, as are objects that all came before the head.
    let planned = made.flatten();
    let reading = planned.map(|p| (p.paths, p.writer));
    let mut first = first.map(|f| f.read);
    let [object, old_object] = [object, old_object].map(|read| match read {
        ObjectRead::First => ObjectRead::Projected(first.take().flatten()),
        other => other,
    });
    let (mut old_status, mut new_status) = (None, None);
    let (Ok((object, new_text)), Ok((old_object, old_text))) = (
        settle(object, reading, &mut new_status),
        settle(old_object, reading, &mut old_status),
    ) else {
        return Ok(None);
    };
    request.object = object;
    request.old_object = old_object;
    let texts = StatusTexts {
        old: old_text,
        new: new_text,
    };
    // Projected statuses only where the plan reads them; an object the
    // plan never reached (absent) is absent in them too.
    if reading.is_none() {
        return Ok(Some((request, None, texts)));
    }
    let proofs = planned.map_or(Proofs::Off, |p| p.proofs);
    match realize(old_status, new_status, Depth::Bounded, proofs) {
        Ok(projected) => Ok(Some((request, Some(projected), texts))),
        Err(_) => Ok(None),
    }
}

/// An object (or `null`) as the single pass reads it: its metadata, its
/// status captured on the plan's paths, and its status's text (`None` where
/// it is absent or `null`).
type ProjectedObject<'b> = Option<(MetadataView<'b>, Option<Captured<'b>>, Option<&'b str>)>;

/// The object read first, as it was read, and where its values were.
struct FirstObject<'b> {
    read: ProjectedObject<'b>,
    text: ObjectText<'b>,
}

/// Where an object's members were, and its status's.
#[derive(Default)]
struct ObjectText<'b> {
    members: SpansByKey<'b>,
    status: SpansByKey<'b>,
}

/// Members' spans by their key. A hash map: an object of a review may have
/// hundreds of thousands of members, each looked up once; hashed as the
/// rules' tables are ([`LookupMap`]).
type SpansByKey<'b> = LookupMap<Cow<'b, str>, Span<'b>>;

/// A member's text, with what reading it spent of the review's budget,
/// and for a list read item by item, its items'.
struct Span<'b> {
    text: &'b str,
    spent: usize,
    items: Vec<ItemText<'b>>,
}

/// An item's text, what reading it spent, and the members of an item the
/// capture left out (those of a captured item are in its capture).
struct ItemText<'b> {
    text: &'b str,
    spent: usize,
    unread: Option<ItemMembers<'b>>,
}

impl<'b> Span<'b> {
    fn new(text: &'b str, spent: usize) -> Self {
        Self {
            text,
            spent,
            items: Vec::new(),
        }
    }
}

/// Where the spans of the object being read go: nowhere for the second
/// object, which nothing is compared with.
struct Spans<'b> {
    spans: SpansByKey<'b>,
    kept: bool,
}

impl<'b> Spans<'b> {
    fn new(kept: bool) -> Self {
        Self {
            // An object's members, a status's: room for the usual few
            // without growing (a table that grows rehashes every key).
            spans: if kept {
                LookupMap::with_capacity_and_hasher(16, Default::default())
            } else {
                LookupMap::default()
            },
            kept,
        }
    }

    /// Keeps `span`, counted against the review's budget. A key written
    /// twice is compared with nothing, neither its text nor its items':
    /// a reader keeps the last, and its items are not the first's.
    fn keep(&mut self, key: Cow<'b, str>, span: Span<'b>) -> Result<(), Unread> {
        if !self.kept {
            return Ok(());
        }
        // The entry, its key, and the table's spare room and its old and new
        // tables while it grows.
        ValueBudget::spend::<serde_json::Error>(4 * std::mem::size_of::<(Cow<'b, str>, Span<'b>)>() + key.len())?;
        match self.spans.entry(key) {
            Entry::Occupied(mut twice) => *twice.get_mut() = Span::new("", 0),
            Entry::Vacant(first) => {
                first.insert(span);
            }
        }
        Ok(())
    }
}

/// Moves past the value here if it is the same text as the first object's
/// `span`: what reading it spent of the budget is spent again, so that the
/// single pass never runs out later than two passes would.
fn same_text<'s, 'b>(cursor: &mut Cursor<'b>, span: Option<&'s Span<'b>>) -> Result<Option<&'s Span<'b>>, Unread> {
    match span {
        Some(span) if cursor.same(span.text) => {
            ValueBudget::spend::<serde_json::Error>(span.spent)?;
            Ok(Some(span))
        }
        _ => Ok(None),
    }
}

fn member<'s, 'b>(spans: Option<&'s SpansByKey<'b>>, key: &str) -> Option<&'s Span<'b>> {
    spans?.get(key)
}

/// Runs `read`, and says what it spent of the review's budget.
fn spending<T>(read: impl FnOnce() -> Result<T, Unread>) -> Result<(T, usize), Unread> {
    let before = ValueBudget::left();
    let read = read()?;
    let spent = match (before, ValueBudget::left()) {
        (Some(before), Some(after)) => before.saturating_sub(after),
        _ => 0,
    };
    Ok((read, spent))
}

/// An object (or `null`) whose status is captured on the plan's paths, read
/// as [`ObjectView`] reads the rest of it: its metadata, every other
/// member skipped. `first` is the object read before it, if any.
fn read_object<'b>(
    cursor: &mut Cursor<'b>,
    reading: (&PathTree, Option<usize>),
    first: Option<&FirstObject<'b>>,
) -> Result<(ProjectedObject<'b>, ObjectText<'b>), Unread> {
    let mut text = ObjectText::default();
    if cursor.peek() != Some(b'{') {
        return match cursor.value(PhantomData::<Option<IgnoredAny>>)?.0 {
            None => Ok((None, text)),
            Some(_) => Err(Unread),
        };
    }
    let (first_read, first_text) = (first.and_then(|f| f.read.as_ref()), first.map(|f| &f.text));
    let mut spans = Spans::new(first.is_none());
    // The second object's values that differ are read against the first's.
    cursor.note_starts(first.is_none());
    let (mut metadata, mut status, mut status_text) = (None, None, None);
    cursor.object(|cursor, key| {
        match key.as_ref() {
            "status" if status.is_some() => return Err(Unread),
            "metadata" if metadata.is_some() => return Err(Unread),
            _ => {}
        }
        let first_member = member(first_text.map(|t| &t.members), &key);
        if same_text(cursor, first_member)?.is_some() {
            match key.as_ref() {
                "status" => {
                    status = Some(first_read.and_then(|(_, s, _)| s.clone()));
                    status_text = first_read.and_then(|(_, _, t)| *t);
                }
                "metadata" => metadata = first_read.map(|(m, _, _)| m.clone()),
                _ => {}
            }
            return Ok(());
        }
        let (read, spent) = spending(|| match key.as_ref() {
            "status" => {
                let first_status = first_text.map(|t| &t.status);
                let first_captured = first_read.and_then(|(_, s, _)| s.as_ref());
                let (captured, read, members) = read_status(cursor, reading, first_status, first_captured, spans.kept)?;
                status = Some(Some(captured));
                // As `ObjectView` reads it: `null` is no status.
                status_text = Some(read).filter(|t| *t != "null");
                text.status = members;
                Ok(read)
            }
            "metadata" => {
                let (read, span) = cursor.value(super::wire::MetadataOf)?;
                metadata = Some(read);
                Ok(span)
            }
            _ => cursor.skip_against(first_member.map(|first| first.text)),
        })?;
        spans.keep(key, Span::new(read, spent))
    })?;
    cursor.note_starts(false);
    text.members = spans.spans;
    let status = status
        .flatten()
        .filter(|s| !matches!(s, Captured::Settled(Value::Null)));
    Ok((Some((metadata.unwrap_or_default(), status, status_text)), text))
}

/// A status captured on `paths` as [`Capture`] captures it, but member by
/// member where it is an object the paths lead into, so that each member
/// whose text is the first object's (`first`, captured as
/// `first_captured`) is taken as the first read it. Returns the capture,
/// the status's text, and (when `kept`) where its members were.
fn read_status<'b>(
    cursor: &mut Cursor<'b>,
    (paths, writer): (&PathTree, Option<usize>),
    first: Option<&SpansByKey<'b>>,
    first_captured: Option<&Captured<'b>>,
    kept: bool,
) -> Result<(Captured<'b>, &'b str, SpansByKey<'b>), Unread> {
    if paths.is_whole() || paths.keyed().is_some() || cursor.peek() != Some(b'{') {
        let (captured, text) = capture(cursor, paths, writer, None)?;
        return Ok((captured, text, SpansByKey::default()));
    }
    let first_members = match first_captured {
        Some(Captured::Object(members)) => members.as_slice(),
        _ => &[],
    };
    let start = cursor.start();
    let mut members: Vec<(String, Captured<'b>)> = Vec::with_capacity(8);
    let mut spans = Spans::new(kept);
    cursor.object(|cursor, key| {
        let first_span = member(first, &key);
        let Some(child) = paths.child(&key) else {
            // Not read: only its text matters, for the object read second.
            if same_text(cursor, first_span)?.is_none() {
                let text = cursor.skip_against(first_span.map(|first| first.text))?;
                spans.keep(key, Span::new(text, 0))?;
            }
            return Ok(());
        };
        // What `Capture` spends for a member it reads.
        ValueBudget::spend::<serde_json::Error>(2 * std::mem::size_of::<(String, Captured<'b>)>() + key.len())?;
        let captured = match same_text(cursor, first_span)? {
            // The first object's capture of the same text: a span is kept
            // only for a key written once, so it is that key's capture.
            Some(_) => match first_members.iter().rev().find(|(k, _)| *k == key) {
                Some((_, captured)) => captured.clone(),
                None => return Err(Unread),
            },
            None => {
                let first_items = first_span.map(|s| s.items.as_slice()).zip(
                    first_members
                        .iter()
                        .rev()
                        .find(|(k, _)| *k == key)
                        .and_then(|(_, c)| match c {
                            Captured::Items(items) => Some(items.as_slice()),
                            _ => None,
                        }),
                );
                let ((captured, text, items), spent) = spending(|| match child.keyed() {
                    Some(keyed) if !child.is_whole() && cursor.peek() == Some(b'[') => {
                        read_items(cursor, (keyed, writer), first_items, spans.kept)
                    }
                    _ => {
                        let (captured, text) = capture(cursor, child, writer, first_span.map(|s| s.text))?;
                        Ok((captured, text, Vec::new()))
                    }
                })?;
                let mut span = Span::new(text, spent);
                span.items = items;
                spans.keep(key.clone(), span)?;
                captured
            }
        };
        // The last of duplicate keys wins, as in Go and serde_json.
        members.retain(|(k, _)| *k != key);
        members.push((key.into_owned(), captured));
        Ok(())
    })?;
    Ok((Captured::Object(members), cursor.since(start), spans.spans))
}

/// The value here captured on `paths` as [`Capture`] captures it, and its
/// text. A value read whole is only moved past with [`Cursor::skip`] (read
/// against `first`, the first object's text of it, if any): its text is
/// what is captured.
fn capture<'b>(
    cursor: &mut Cursor<'b>,
    paths: &PathTree,
    writer: Option<usize>,
    first: Option<&str>,
) -> Result<(Captured<'b>, &'b str), Unread> {
    if paths.is_whole() {
        let text = cursor.skip_against(first)?;
        return Ok((Captured::whole(paths, writer, text), text));
    }
    cursor.value(Capture(paths, writer))
}

/// A list read item by item, as [`Capture`] reads it. In the object read
/// second, an item whose text is the first object's item at its index is
/// taken as the first read it, and each member of another item whose text
/// is the first's member at its place is taken by text.
fn read_items<'b>(
    cursor: &mut Cursor<'b>,
    reading: (&KeyedItems, Option<usize>),
    first: Option<(&[ItemText<'b>], &[Option<CapturedItem<'b>>])>,
    kept: bool,
) -> Result<(Captured<'b>, &'b str, Vec<ItemText<'b>>), Unread> {
    let start = cursor.start();
    let capacity = first.map_or(16, |(_, items)| items.len());
    let (mut items, mut texts): (Vec<Option<CapturedItem<'b>>>, Vec<ItemText<'b>>) = (
        Vec::with_capacity(capacity),
        Vec::with_capacity(if kept { capacity } else { 0 }),
    );
    cursor.list(|cursor, index| {
        let first_item = first.and_then(|(texts, items)| Some((texts.get(index)?, items.get(index)?)));
        // How far the item's text is the first's: all of it, or up to where
        // the write changed it.
        let alike = first_item.map_or(0, |(text, _)| cursor.common_prefix(text.text));
        let whole = first_item.filter(|(text, _)| alike == text.text.len() && cursor.take_ending(alike));
        let item = match (whole, first_item) {
            (Some((text, item)), _) => {
                ValueBudget::spend::<serde_json::Error>(text.spent)?;
                item.clone()
            }
            (None, first_item) => {
                let against = match first_item {
                    Some((text, item)) => {
                        item.as_ref()
                            .map(CapturedItem::members)
                            .or(text.unread.as_ref())
                            .map(|members| ReadAgainst {
                                members,
                                text: text.text,
                                alike,
                                before: false,
                            })
                    }
                    // In the object read first, the item before this one:
                    // a list's items are often alike (a condition's members
                    // in the same order, its time and generation those of
                    // the item before), and the bytes alike are not read
                    // again.
                    None if first.is_none() => index.checked_sub(1).and_then(|previous| {
                        let text = texts.get(previous)?;
                        let members = items
                            .get(previous)?
                            .as_ref()
                            .map(CapturedItem::members)
                            .or(text.unread.as_ref())?;
                        let alike = cursor.common_prefix(text.text);
                        // Only where the bytes alike hold a member's value
                        // whole: else the item is read as it would be alone,
                        // at no more cost than this look.
                        let (_, first_end) = span_in(text.text, members.first()?.1)?;
                        (first_end < alike).then_some(ReadAgainst {
                            members,
                            text: text.text,
                            alike,
                            before: true,
                        })
                    }),
                    None => None,
                };
                let ((item, text), spent) = spending(|| {
                    let start = cursor.start();
                    let item = read_item(cursor, reading, against)?;
                    Ok((item, cursor.since(start)))
                })?;
                let (item, unread) = match item {
                    Some(Ok(item)) => (Some(item), None),
                    Some(Err(members)) => (None, Some(members)),
                    None => (None, None),
                };
                if kept {
                    ValueBudget::spend::<serde_json::Error>(2 * std::mem::size_of::<ItemText<'b>>())?;
                    texts.push(ItemText { text, spent, unread });
                }
                item
            }
        };
        // What `Capture` spends for an item: a slot (doubled for growth),
        // and the `null` it may become.
        ValueBudget::spend::<serde_json::Error>(2 * std::mem::size_of::<Option<CapturedItem<'b>>>() + SLOT)?;
        items.push(item);
        Ok(())
    })?;
    Ok((Captured::Items(items), cursor.since(start), texts))
}

/// An item read before that the item here is read against.
#[derive(Debug, Clone, Copy)]
struct ReadAgainst<'a, 'b> {
    /// Its members, each a key and its value's text (a slice of `text`).
    members: &'a ItemMembers<'b>,
    text: &'b str,
    /// How many bytes of `text` the item here starts with.
    alike: usize,
    /// `false`: the first object's item at this index, read by the object
    /// read second, which takes the first's members as they are. `true`:
    /// the item before this one in the object read first; what is taken
    /// from it is moved here (its text at this item's place, its noted
    /// starts moved with it: [`Cursor::note_moved`]), so that each member
    /// is this item's own text, its starts noted as a read would note them
    /// for the object read second, and a value that differs is read alone
    /// (noted), not against it.
    before: bool,
}

/// An item of a list read item by item, read as `ListItem` reads it: an
/// object's members (captured, or given back where its key is not read),
/// `None` for anything else. Each member's value is moved past with
/// [`Cursor::skip`] (the first object's items are most of what the single
/// pass validates, member by member); a member whose key and text are those
/// of `against`'s member at its place is taken by text.
///
/// `against` is the first object's item at this index (in the object read
/// second) or the item before this one (in the object read first). The
/// members before the first difference from it are taken unread, and where
/// it lies in a member's value, that value is read alone
/// ([`read_to_difference`]); an item that differs only there is then read.
fn read_item<'b>(
    cursor: &mut Cursor<'b>,
    (keyed, writer): (&KeyedItems, Option<usize>),
    against: Option<ReadAgainst<'_, 'b>>,
) -> Result<ItemRead<'b>, Unread> {
    if cursor.peek() != Some(b'{') {
        return Ok(cursor.value(ListItem(keyed, writer))?.0);
    }
    let first_members: &[(Cow<'b, str>, &'b str)] = against.map_or(&[], |against| against.members.as_slice());
    let before = against.is_some_and(|against| against.before);
    // A condition has six members.
    let mut members: ItemMembers<'b> = Vec::with_capacity(first_members.len().max(8));
    let read_to = match against {
        Some(against) => read_to_difference(cursor, against, &mut members)?,
        None => ReadTo::Start,
    };
    let member = |cursor: &mut Cursor<'b>, key: Cow<'b, str>| {
        spend_on_member::<serde_json::Error>(&key)?;
        let raw = match first_members.get(members.len()) {
            Some((first_key, raw)) if *first_key == key && before => {
                let at = cursor.start();
                match cursor.same(raw) {
                    true => cursor.moved(raw, at).ok_or(Unread)?,
                    false => cursor.skip()?,
                }
            }
            Some((first_key, raw)) if *first_key == key => match cursor.same(raw) {
                true => *raw,
                false => cursor.skip_against(Some(raw))?,
            },
            _ => cursor.skip()?,
        };
        members.push((key, raw));
        Ok(())
    };
    match read_to {
        ReadTo::Start => cursor.object(member)?,
        ReadTo::Member => cursor.rest_of_object(member)?,
        ReadTo::End => {}
    }
    Ok(Some(CapturedItem::of(keyed, writer, members)))
}

/// How far [`read_to_difference`] read an item.
#[derive(Debug, PartialEq, Eq)]
enum ReadTo {
    /// Nothing: the cursor is at the item's start.
    Start,
    /// Its members up to one past the first difference: the cursor is just
    /// past that member's value. (Against the item before, where every
    /// member is alike but the text after the last is not: all of them,
    /// the cursor just past the last one's value.)
    Member,
    /// The whole item: the cursor is past its end.
    End,
}

/// Reads the item here into `read` as far as its text tells, against
/// `against` (see [`ReadAgainst`]).
///
/// The members whose values end before the first difference (with the byte
/// after them) are `against`'s: taken unread. Where the difference lies in
/// the next member's value (never in a key or between members), that value
/// is read, validated ([`ReadTo::Member`]); and where the text after it is
/// `against`'s text after that member's value, to the item's end, the
/// members after it are taken too ([`ReadTo::End`]): the common way a
/// controller's write changes an item (an `observedGeneration`, a status, a
/// time), and the way one condition differs from the one before it (its
/// type). Against the item before, where every member's value is alike,
/// all are taken, and the item whole where the text after them is alike
/// too. Else nothing is read ([`ReadTo::Start`]).
fn read_to_difference<'b>(
    cursor: &mut Cursor<'b>,
    against: ReadAgainst<'_, 'b>,
    read: &mut ItemMembers<'b>,
) -> Result<ReadTo, Unread> {
    let ReadAgainst {
        members,
        text,
        alike,
        before,
    } = against;
    // Where each member's value lies in `against`'s text (all of them do,
    // from its own read).
    let span = |raw: &str| span_in(text, raw);
    // The first member whose value does not end before the difference.
    let changed = members
        .iter()
        .position(|(_, raw)| span(raw).is_none_or(|(_, end)| end >= alike))
        .unwrap_or(members.len());
    let changed_value = match members.get(changed) {
        Some((_, raw)) => match span(raw).filter(|&(at, _)| at <= alike) {
            Some(value) => Some(value),
            None => return Ok(ReadTo::Start),
        },
        // Every member's value alike: against the item before, all are
        // taken. Against the first object's item (taken whole before this
        // where the text after its last value is alike too), read from
        // the start, as it was.
        None if before && !members.is_empty() => None,
        None => return Ok(ReadTo::Start),
    };
    let start = cursor.start();
    let noted = cursor.starts_noted();
    // Where each member before the one read here lies: against the item
    // before, this item's own text, whose starts (those in the item before,
    // moved) are noted before the value read here notes its own.
    let before_value = changed_value.map_or_else(
        || members.last().and_then(|(_, raw)| span(raw)),
        |(at, _)| Some((at, at)),
    );
    if before {
        cursor.note_moved(&text[..before_value.map_or(0, |(_, end)| end)], start);
    }
    // A member taken: here, where it is in `against`'s text `+ base - less`.
    let take = |cursor: &Cursor<'b>, raw: &'b str, (base, less): (usize, usize)| match before {
        true => {
            let here = cursor.text_at((span(raw)?.0 + base).checked_sub(less)?, raw.len())?;
            debug_assert_eq!(here, raw, "taken only where the same bytes are");
            Some(here)
        }
        false => Some(raw),
    };
    // Where the text left to take starts in `against`'s, and how many
    // members were read here; `None` where the text here is not what
    // `against`'s bytes alike promise, and nothing is kept.
    let mut read_alike = || {
        for (key, raw) in &members[..changed] {
            read.push((key.clone(), take(cursor, raw, (start, 0))?));
        }
        match changed_value {
            Some((value_at, value_end)) => {
                let first = (!before).then_some(members[changed].1);
                let value = cursor.skip_at(start + value_at, first)?;
                read.push((members[changed].0.clone(), value));
                Some((value_end, 1))
            }
            None => {
                let last_end = before_value.map(|(_, end)| end)?;
                cursor.take_text(&text[..last_end]).then_some((last_end, 0))
            }
        }
    };
    let Some((read_to, read_here)) = read_alike() else {
        read.clear();
        cursor.forget_starts_from(noted);
        return Ok(ReadTo::Start);
    };
    for (key, _) in read.iter() {
        spend_on_member::<serde_json::Error>(key)?;
    }
    count_taken(changed);
    let after = cursor.here();
    if !cursor.take_text(&text[read_to..]) {
        return Ok(ReadTo::Member);
    }
    if before {
        cursor.note_moved(&text[read_to..], after);
    }
    let rest = members.get(changed + read_here..).unwrap_or_default();
    for (key, raw) in rest {
        spend_on_member::<serde_json::Error>(key)?;
        // As far past the value read here as past its end in `against`.
        let raw = take(cursor, raw, (after, read_to)).ok_or(Unread)?;
        read.push((key.clone(), raw));
    }
    count_taken(rest.len());
    Ok(ReadTo::End)
}

/// An object as the single pass leaves it, and its status's text, with its
/// status projected on `paths` (when the plan reads objects) into
/// `projected`.
fn settle<'b>(
    read: ObjectRead<'b>,
    reading: Option<(&PathTree, Option<usize>)>,
    projected: &mut Option<Option<Captured<'b>>>,
) -> Result<(Option<ObjectView<'b>>, Option<&'b str>), ProjectError> {
    Ok(match read {
        ObjectRead::Unseen | ObjectRead::First => (None, None),
        ObjectRead::Raw(view) => {
            if let (Some((paths, writer)), Some(view)) = (reading, &view) {
                *projected = Some(match view.status {
                    Some(raw) => capture_status(raw, paths, writer, Depth::Bounded)?,
                    None => None,
                });
            }
            let text = view.as_ref().and_then(|v| v.status).map(RawValue::get);
            (view, text)
        }
        ObjectRead::Projected(None) => (None, None),
        ObjectRead::Projected(Some((metadata, status, text))) => {
            *projected = Some(status);
            (Some(ObjectView { metadata, status: None }), text)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::cursor::members_of;
    use crate::admission::skip::{ValueStarts, value_end_noting};

    /// Starts noted by a read that reads a list's items each alone.
    #[derive(Default)]
    struct ReadAlone(Vec<u32>);

    impl ValueStarts for ReadAlone {
        fn note(&mut self, at: usize) {
            self.0.push(at as u32);
        }
    }

    proptest::proptest! {
        /// Issue 25: a list read item by item in the object read first,
        /// each item against the one before, notes the starts that a read
        /// of each item alone notes, and gives each item's members as
        /// reading it alone gives them, slices of its own text.
        #[test]
        fn items_read_against_the_item_before_are_noted_and_taken_as_read_alone(
            list in proptest::strategy::Strategy::prop_flat_map(
                crate::test_support::alike_item_members(),
                crate::test_support::alike_items,
            ),
        ) {
            let keyed = KeyedItems {
                member: "type".into(),
                values: [("Ready", Some(0)), ("Scaled", None), ("Other", Some(1))]
                    .map(|(key, owner)| (key.to_owned(), owner))
                    .into_iter()
                    .collect(),
            };
            let mut cursor = Cursor::new(&list);
            cursor.note_starts(true);
            let Ok((Captured::Items(items), _, texts)) = read_items(&mut cursor, (&keyed, None), None, true) else {
                panic!("read: {list}");
            };
            let mut alone = ReadAlone::default();
            for text in &texts {
                let (at, _) = span_in(&list, text.text).expect("the item's own text");
                if text.text.starts_with('{') {
                    proptest::prop_assert!(value_end_noting(list.as_bytes(), at, &mut alone).is_some());
                }
                let item = items[texts.iter().position(|t| std::ptr::eq(t, text)).unwrap()].as_ref();
                let Some(members) = item.map(CapturedItem::members).or(text.unread.as_ref()) else {
                    continue;
                };
                proptest::prop_assert_eq!(members, &members_of(text.text).unwrap(), "{}", list);
                for (_, raw) in members {
                    proptest::prop_assert!(span_in(text.text, raw).is_some(), "{} in {}", raw, text.text);
                }
            }
            proptest::prop_assert_eq!(cursor.starts(), alone.0.as_slice(), "{}", list);
        }
    }

    #[test]
    fn an_item_is_read_against_the_first_up_to_its_first_difference() {
        let first = r#"{"a":"m","b":2,"c":{"d":[1]}}"#;
        let members = members_of(first).unwrap();
        // The second item; how far it is read; the members read, by index
        // into the first's, or as a value read here; where the cursor ends.
        let value = |text: &'static str| Err::<usize, _>(text);
        for (second, read_to, read, at) in [
            (
                r#"{"a":"other","b":2,"c":{"d":[1]}},"#,
                ReadTo::End,
                vec![value(r#""other""#), Ok(1), Ok(2)],
                33,
            ),
            (
                r#"{"a":"m","b":12345,"c":{"d":[1]}}]"#,
                ReadTo::End,
                vec![Ok(0), value("12345"), Ok(2)],
                33,
            ),
            (
                r#"{"a":"m","b": 3,"c":{"d":[1]}}]"#,
                ReadTo::End,
                vec![Ok(0), value("3"), Ok(2)],
                30,
            ),
            (
                r#"{"a":"m","b":2,"c":null}]"#,
                ReadTo::End,
                vec![Ok(0), Ok(1), value("null")],
                24,
            ),
            // Two values: up to the first, then member by member.
            (
                r#"{"a":"m","b":3,"c":{"d":[2]}}]"#,
                ReadTo::Member,
                vec![Ok(0), value("3")],
                14,
            ),
            // A member fewer or more, not JSON after the value.
            (r#"{"a":"m","b":2}]"#, ReadTo::Member, vec![Ok(0), value("2")], 14),
            (
                r#"{"a":"m","b":2,"c":{"d":[1]},"e":1}]"#,
                ReadTo::Member,
                vec![Ok(0), Ok(1), value(r#"{"d":[1]}"#)],
                28,
            ),
            (
                r#"{"a":"m","b":2x,"c":{"d":[1]}}]"#,
                ReadTo::Member,
                vec![Ok(0), value("2")],
                14,
            ),
            // A key renamed, with or without its length; not a value.
            (r#"{"a":"m","x":2,"c":{"d":[1]}}]"#, ReadTo::Start, vec![], 0),
            (r#"{"a":"m","bb":2,"c":{"d":[1]}}]"#, ReadTo::Start, vec![], 0),
            (r#"{"a":"m","b":[,"c":{"d":[1]}}]"#, ReadTo::Start, vec![], 0),
        ] {
            let mut cursor = Cursor::new(second);
            let alike = cursor.common_prefix(first);
            let mut got = Vec::new();
            assert_eq!(
                read_to_difference(
                    &mut cursor,
                    ReadAgainst {
                        members: &members,
                        text: first,
                        alike,
                        before: false
                    },
                    &mut got
                ),
                Ok(read_to),
                "{second}"
            );
            let expected: ItemMembers<'_> = read
                .into_iter()
                .enumerate()
                .map(|(i, member)| match member {
                    Ok(index) => members[index].clone(),
                    Err(text) => (members[i].0.clone(), text),
                })
                .collect();
            assert_eq!(got, expected, "{second}");
            assert_eq!(cursor.since(0), &second[..at], "{second}");
        }
    }
}
