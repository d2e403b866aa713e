//! Who writes what: the status items each identity changes, read from the
//! status UPDATEs the webhook sees (every mode, listed writers or not), and
//! kept in a bounded record. This is what `statusguard suggest --observed`
//! turns into an ownership document: field managers are names a client
//! chooses, while the API server's `userInfo` is the identity the webhook
//! enforces.
//!
//! Pure: the request path copies each write it observes out of the review
//! it read for the decision (`ReviewedWrite::of`, never a second parse of
//! the body), and the server's observer reads the copy off it ([`read`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::cursor::members_of;
use super::decide::Endpoint;
use super::decide::compare::same_items;
use super::project;
use super::wire::{ObjectView, ReviewRequest};
use crate::ownership::{FieldPath, Item, KeyedList, Mode, Ownership, ResourceRules, condition_type, same_value};

/// What the values built from one observed write may cost (estimated, see
/// `value_budget`): a quarter of a decision's.
const OBSERVE_VALUE_BUDGET: usize = 8 * 1024 * 1024;

/// The identity of writes beyond the record's cap.
pub const OTHER_IDENTITY: &str = "(other)";
/// The item of changes beyond an identity's cap.
pub const OTHER_ITEM: &str = "(other)";

/// The longest name the observer keeps, in bytes: identities, field paths
/// and condition types in the record and the metrics, and every fact it
/// copies out of a review. Longer names are cut on a character boundary and
/// end in [`CUT_MARKER`]. Generous for real names (a ServiceAccount's user
/// name is at most 340 bytes, a condition type 316); the cap is for forged
/// reviews, which can carry megabytes in any string.
pub const MAX_NAME_BYTES: usize = 512;
/// The end of a name that was cut.
pub const CUT_MARKER: &str = "\u{2026}";

/// `name` cut to at most `max` bytes on a character boundary, ending in
/// [`CUT_MARKER`] where it was cut; unchanged when it fits.
pub fn cut_to(name: &str, max: usize) -> Cow<'_, str> {
    if name.len() <= max {
        return Cow::Borrowed(name);
    }
    let mut end = max.saturating_sub(CUT_MARKER.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{CUT_MARKER}", &name[..end]))
}

/// `name` cut to [`MAX_NAME_BYTES`].
pub fn cut_name(name: &str) -> Cow<'_, str> {
    cut_to(name, MAX_NAME_BYTES)
}

/// Whether `name` was cut by [`cut_to`]: no real writer or item.
pub fn is_cut(name: &str) -> bool {
    name.ends_with(CUT_MARKER)
}

/// What a review says about a status write, each fact cut to
/// [`MAX_NAME_BYTES`]. Nothing here is verified: without client
/// certificates on the webhook port, a caller can claim anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFacts {
    /// `userInfo.username`.
    pub writer: String,
    /// The API group.
    pub group: String,
    /// The version of the resource the review names (the object is read at it).
    pub version: String,
    /// The plural resource.
    pub resource: String,
    /// The object's kind.
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// The object's namespace (none for a cluster-scoped object).
    pub namespace: Option<String>,
    /// The object's uid.
    pub uid: Option<String>,
    /// Nothing will be persisted.
    pub dry_run: bool,
}

impl WriteFacts {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        match self.group.as_str() {
            "" => self.version.clone(),
            group => format!("{group}/{}", self.version),
        }
    }

    fn bytes(&self) -> usize {
        let optional = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        self.writer.len()
            + self.group.len()
            + self.version.len()
            + self.resource.len()
            + self.kind.len()
            + self.name.len()
            + optional(&self.namespace)
            + optional(&self.uid)
    }
}

/// The text of a review's two statuses, each `None` where its object or
/// its status is absent or `null`: JSON the review's reader validated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StatusTexts<'b> {
    /// `oldObject`'s status.
    pub(crate) old: Option<&'b str>,
    /// `object`'s status.
    pub(crate) new: Option<&'b str>,
}

impl<'b> StatusTexts<'b> {
    /// The statuses' text as the wire read them.
    pub(crate) fn of(request: &ReviewRequest<'b>) -> Self {
        let text = |o: &Option<ObjectView<'b>>| o.as_ref().and_then(|o| o.status).map(RawValue::get);
        Self {
            old: text(&request.old_object),
            new: text(&request.object),
        }
    }
}

/// A status UPDATE of a guarded resource as the server keeps it until the
/// observer reads it: the facts and the two statuses' JSON, copied out of
/// the review so that its body is freed with the request.
#[derive(Debug, Clone)]
pub struct ReviewedWrite {
    /// What the review says about the write.
    pub facts: WriteFacts,
    /// Validated JSON (see [`StatusTexts`]).
    old_status: Option<Box<str>>,
    new_status: Option<Box<str>>,
}

impl ReviewedWrite {
    /// The bytes this copy holds (its strings and statuses, not the struct).
    pub fn bytes(&self) -> usize {
        let status = |s: &Option<Box<str>>| s.as_ref().map_or(0, |r| r.len());
        self.facts.bytes() + status(&self.old_status) + status(&self.new_status)
    }
}

/// One status UPDATE as the observer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedWrite {
    /// What the review says about the write.
    pub facts: WriteFacts,
    /// What the write changes: top-level status fields, the declared field
    /// paths below them, and condition types.
    pub changed: Vec<Item>,
}

impl ReviewedWrite {
    /// Copies a status UPDATE of a resource `rules` names out of a request
    /// as it was read for the decision, with its statuses' `texts` as the
    /// same reader found them; `None` for any other request.
    pub(crate) fn of(request: &ReviewRequest<'_>, texts: StatusTexts<'_>, rules: &Ownership) -> Option<Self> {
        if !request.is_status_update() {
            return None;
        }
        // The group and resource are the configured ones: bounded by the rules.
        let resource = rules.resource(&request.resource.group, &request.resource.resource)?;
        let kept = |s: &str| cut_name(s).into_owned();
        let facts = WriteFacts {
            writer: request.user_info.username.as_deref().map(kept).unwrap_or_default(),
            group: resource.group.clone(),
            version: kept(&request.resource.version),
            resource: resource.resource.clone(),
            kind: request.kind.as_deref().map(kept).unwrap_or_default(),
            name: kept(&request.name),
            namespace: request.namespace.as_deref().filter(|n| !n.is_empty()).map(kept),
            uid: request
                .object
                .as_ref()
                .and_then(|o| o.metadata.uid.as_deref())
                .map(kept),
            dry_run: request.dry_run,
        };
        Some(Self {
            facts,
            old_status: texts.old.map(Box::from),
            new_status: texts.new.map(Box::from),
        })
    }
}

/// What the request path kept of a decided write for the observer.
#[derive(Debug)]
pub enum Copied {
    /// Not copied: the observer could take no write when the review was read.
    Declined,
    /// Nothing to observe: not a status UPDATE of a guarded resource, or
    /// not at the endpoint that observes it.
    Nothing,
    /// The copy (boxed: it is queued as it is, and most answers carry none).
    Write(Box<ReviewedWrite>),
}

/// Where a write of a resource in `mode` is observed, once per write: at
/// `/mutate` for trim resources (`/validate` then sees the trimmed object),
/// at `/validate` for the others.
pub(crate) fn observed_at(mode: Mode) -> Endpoint {
    match mode {
        Mode::Trim => Endpoint::Mutate,
        Mode::Enforce | Mode::Audit => Endpoint::Validate,
    }
}

/// What a copied-out write changed; `Ok(None)` when the rules in force no
/// longer name its resource.
pub fn read(write: ReviewedWrite, rules: &Ownership) -> Result<Option<ObservedWrite>, serde_json::Error> {
    let Some(resource) = rules.resource(&write.facts.group, &write.facts.resource) else {
        return Ok(None);
    };
    // The values of one write are bounded in memory, more tightly than a
    // decision's: the observer runs beside the decisions, and a write whose
    // changed members are larger is skipped (counted "unreadable"), never
    // decided on.
    let _budget = crate::value_budget::ValueBudget::enter(OBSERVE_VALUE_BUDGET);
    let changed = changed_items(resource, write.old_status.as_deref(), write.new_status.as_deref())?;
    Ok(Some(ObservedWrite {
        facts: write.facts,
        changed,
    }))
}

/// The items a write changes, old status to new: each condition type whose
/// item changed; each declared field path (any writer's) that changed; and
/// each top-level field that changed outside the declared paths.
fn changed_items(rules: &ResourceRules, old: Option<&str>, new: Option<&str>) -> Result<Vec<Item>, serde_json::Error> {
    changed_items_reading(rules, old, new, true)
}

/// [`changed_items`], `by_text` telling the lists of items it can from
/// their text ([`items_changed_by_text`]); without it, every member that
/// changed is built and compared (what the tests compare it with).
fn changed_items_reading(
    rules: &ResourceRules,
    old: Option<&str>,
    new: Option<&str>,
    by_text: bool,
) -> Result<Vec<Item>, serde_json::Error> {
    let (old_members, new_members) = (members(old)?, members(new)?);
    let declared: Vec<&FieldPath> = rules.writers.iter().flat_map(|w| &w.fields).collect();
    let mut changed = BTreeSet::new();
    let keys: BTreeSet<&str> = old_members
        .keys()
        .chain(new_members.keys())
        .map(|k| k.as_ref())
        .collect();
    for key in keys {
        let (before, after) = (old_members.get(key), new_members.get(key));
        // The API server encodes both objects alike: equal text, equal value.
        if before == after {
            continue;
        }
        let readers = Readers::of(rules, &declared, key);
        if by_text && let Some(items) = items_changed_by_text(rules, &readers, before, after) {
            changed.extend(items);
            continue;
        }
        let parse = |raw: Option<&&str>| {
            raw.map(|r| crate::value_budget::build(&mut serde_json::Deserializer::from_str(r)))
                .transpose()
        };
        let (before, after) = (parse(before)?, parse(after)?);
        if same_value(before.as_ref(), after.as_ref()) {
            continue;
        }
        let wrap = |value: Option<Value>| {
            let mut status = serde_json::Map::new();
            if let Some(value) = value {
                status.insert(key.to_owned(), value);
            }
            Value::Object(status)
        };
        let (before, after) = (wrap(before), wrap(after));
        let mut explained = false;
        if readers.conditions {
            let conditions = condition_changes(&rules.conditions_path, &before, &after);
            explained = !conditions.is_empty();
            changed.extend(conditions.into_iter().map(Item::Condition));
        }
        for list in &readers.lists {
            let entries = entry_changes(list.entries(Some(&before)), list.entries(Some(&after)), |entry| {
                list.key_of(entry).map(|value| (list.key.as_str(), value))
            });
            explained |= !entries.is_empty();
            changed.extend(entries.into_iter().map(|(key, value)| Item::Entry {
                list: list.path.clone(),
                key,
                value,
            }));
        }
        // A list of objects no document keys yet: its changed entries by
        // each member that could name their writer, for `suggest` to find
        // the one that does (Gateway API's controllerName). The list itself
        // is still named below, as any top-level field.
        if readers.lists.is_empty()
            && !readers.conditions
            && let Ok(path) = FieldPath::parse(key)
        {
            let entries = entry_changes(list_at(&before, key), list_at(&after, key), |entry| {
                entry.as_object().into_iter().flatten().filter_map(|(member, value)| {
                    Some((member.as_str(), value.as_str().filter(|v| names_a_writer(v))?))
                })
            });
            changed.extend(entries.into_iter().map(|(key, value)| Item::Entry {
                list: path.clone(),
                key,
                value,
            }));
        }
        for path in &readers.declared {
            if !same_value(path.get(Some(&before)), path.get(Some(&after))) {
                changed.insert(Item::Field((*path).clone()));
                explained = true;
            }
        }
        if !explained && let Ok(path) = FieldPath::parse(key) {
            changed.insert(Item::Field(path));
        }
    }
    Ok(changed.into_iter().collect())
}

/// The rules that read into one top-level member of a status.
struct Readers<'r> {
    /// It holds the conditions (the conditions path starts with it).
    conditions: bool,
    /// The keyed lists in it.
    lists: Vec<&'r KeyedList>,
    /// The declared field paths in it.
    declared: Vec<&'r FieldPath>,
}

impl<'r> Readers<'r> {
    /// The readers of member `key`, of the rules and declared paths given.
    fn of(rules: &'r ResourceRules, declared: &[&'r FieldPath], key: &str) -> Self {
        let in_key = |path: &FieldPath| path.segments().first().map(String::as_str) == Some(key);
        Self {
            conditions: in_key(&rules.conditions_path),
            lists: rules.lists.iter().filter(|list| in_key(&list.path)).collect(),
            declared: declared.iter().copied().filter(|path| in_key(path)).collect(),
        }
    }
}

/// The items that changed in a top-level member of two statuses, told
/// from their text where the member is a list of items that only one rule
/// reads as such (the conditions, by type; or keyed lists, by key) and no
/// declared path reads into: as the decision tells a changed group without
/// building it ([`project::changed_keys_by_text`]). `None` where that does
/// not tell: the member is then built and compared. A stale retry of a
/// Gateway route rewrites all its entries; building them was most of what
/// observing it cost.
fn items_changed_by_text(
    rules: &ResourceRules,
    readers: &Readers<'_>,
    before: Option<&&str>,
    after: Option<&&str>,
) -> Option<Vec<Item>> {
    let (before, after) = (*before?, *after?);
    let whole = |path: &FieldPath| path.segments().len() == 1;
    if !readers.declared.is_empty() {
        return None;
    }
    match (readers.conditions, readers.lists.as_slice()) {
        (true, []) if whole(&rules.conditions_path) => {
            // A type's last item is the one that counts (`condition_changes`).
            let types = project::changed_keys_by_text(before, after, "type", true)?;
            Some(types.into_iter().map(Item::Condition).collect())
        }
        (false, lists @ [_, ..]) if lists.iter().all(|list| whole(&list.path)) => {
            let mut items = Vec::new();
            for list in lists {
                let values = project::changed_keys_by_text(before, after, &list.key, false)?;
                items.extend(values.into_iter().map(|value| Item::Entry {
                    list: list.path.clone(),
                    key: list.key.clone(),
                    value,
                }));
            }
            Some(items)
        }
        _ => None,
    }
}

/// The (member, value) groups whose entries differ between two lists,
/// entries grouped by each (member, value) `keys_of` gives them and
/// compared as multisets, as the decision compares keyed entries: an entry
/// added, removed or changed changes its groups. Linear in the entries'
/// members (and `n log n` in a reordered group).
fn entry_changes<'v, K>(
    before: &'v [Value],
    after: &'v [Value],
    keys_of: impl Fn(&'v Value) -> K,
) -> BTreeSet<(String, String)>
where
    K: IntoIterator<Item = (&'v str, &'v str)>,
{
    let grouped = |list: &'v [Value]| {
        let mut groups: BTreeMap<(&'v str, &'v str), Vec<&'v Value>> = BTreeMap::new();
        for entry in list {
            for key in keys_of(entry) {
                groups.entry(key).or_default().push(entry);
            }
        }
        groups
    };
    let (before, after) = (grouped(before), grouped(after));
    let none: Vec<&Value> = Vec::new();
    before
        .keys()
        .chain(after.keys().filter(|k| !before.contains_key(*k)))
        .filter(|k| !same_items(before.get(*k).unwrap_or(&none), after.get(*k).unwrap_or(&none)))
        .map(|(member, value)| ((*member).to_owned(), (*value).to_owned()))
        .collect()
}

/// The list at a status's top-level `key` (empty when it holds none).
fn list_at<'v>(status: &'v Value, key: &str) -> &'v [Value] {
    status
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Whether a string member's value could name a writer: a name, not text
/// (no white space or control characters), so that messages and the like
/// never enter the record.
fn names_a_writer(value: &str) -> bool {
    !value.is_empty() && !value.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The top-level members of a status (none for an absent or null one, or
/// one that is not an object): each key and its value's text, the last of
/// a key written twice, as a parse keeps it. Read with the decision's
/// validating skip; a text it cannot read (one nested deeper than it
/// reads) is read by serde_json instead, which says why it is not JSON.
fn members(status: Option<&str>) -> Result<BTreeMap<Cow<'_, str>, &str>, serde_json::Error> {
    let Some(text) = status.filter(|text| text.trim_start().starts_with('{')) else {
        return Ok(BTreeMap::new());
    };
    // Collected in order: of a key written twice, the last is kept.
    if let Ok(members) = members_of(text) {
        return Ok(members.into_iter().collect());
    }
    let parsed: BTreeMap<Cow<'_, str>, &RawValue> = serde_json::from_str(text)?;
    Ok(parsed.into_iter().map(|(key, raw)| (key, raw.get())).collect())
}

/// The condition types whose items differ between two statuses.
fn condition_changes(path: &FieldPath, before: &Value, after: &Value) -> BTreeSet<String> {
    let by_type = |status: &Value| -> BTreeMap<String, Value> {
        path.get(Some(status))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|item| Some((condition_type(item)?.to_owned(), item.clone())))
            .collect()
    };
    let (before, after) = (by_type(before), by_type(after));
    before
        .keys()
        .chain(after.keys())
        .filter(|ty| !same_value(before.get(*ty), after.get(*ty)))
        .cloned()
        .collect()
}

/// What one identity was seen changing on one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityRecord {
    /// `userInfo.username`, or [`OTHER_IDENTITY`].
    pub identity: String,
    /// Status UPDATEs seen.
    pub writes: u64,
    /// Field path (below `.status`) to the number of writes that changed it.
    pub fields: BTreeMap<String, u64>,
    /// Condition type to the number of writes that changed it.
    pub conditions: BTreeMap<String, u64>,
    /// Keyed entries: list path (below `.status`) to member to value to the
    /// number of writes that changed the entries with that value. For a
    /// list the document keys, by its key; for any other top-level list of
    /// objects, by each string member whose value is a name. Capped apart
    /// from the fields and conditions (so that members such as timestamps
    /// never crowd them out); the rest are counted as the field
    /// [`OTHER_ITEM`]. Absent from servers before issue 24.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub entries: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
}

/// One resource's writers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRecord {
    /// The API group.
    pub group: String,
    /// The plural resource.
    pub resource: String,
    /// By identity, in name order.
    pub writers: Vec<IdentityRecord>,
}

/// The record `GET /observed` serves: bounded by identities (the rest are
/// counted as [`OTHER_IDENTITY`]), by items per identity (the rest as
/// [`OTHER_ITEM`]), and in bytes: names are cut to [`MAX_NAME_BYTES`], and
/// once the names held reach the record's byte cap, new ones are counted
/// under those two. Never any of an object's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedWriters {
    /// What the counts are based on; absent from servers before issue 22.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<Basis>,
    /// By group and resource.
    pub resources: Vec<ResourceRecord>,
    /// Identities the record holds by name (at most its cap).
    pub identities: usize,
    /// Writes counted as [`OTHER_IDENTITY`] because a cap was reached.
    pub capped_writes: u64,
}

impl ObservedWriters {
    /// Whether the record says its callers were authenticated. A record
    /// without a basis (an older server) is taken as unauthenticated.
    pub fn authenticated(&self) -> bool {
        self.basis.as_ref().is_some_and(|b| b.authenticated_callers)
    }
}

/// What [`Basis::counted`] says.
pub const COUNTED: &str = "status UPDATEs of guarded resources in the admission reviews this replica received \
     since it started (dry runs excepted; at most ratePerSecond a second are read). A review is whatever \
     a caller of the webhook port sent: unless authenticatedCallers is true, anyone who reached the port \
     could have added writes under any identity.";

/// What the counts of a record are based on, so that whoever reads it
/// (`statusguard suggest`, a human) knows how far to trust them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Basis {
    /// What was counted, in words ([`COUNTED`]).
    pub counted: String,
    /// The replica that counted (its pod name), when it knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Since when (RFC 3339): the replica's start; the record is not kept
    /// across restarts.
    pub since: String,
    /// Whether the webhook port required a client certificate of its
    /// callers (the API server's). When false, the counts may include
    /// forged reviews.
    pub authenticated_callers: bool,
    /// Status writes read per second at most; the rest are not counted.
    pub rate_per_second: u32,
}

/// What a name held by the record costs against its byte cap besides its
/// own bytes: the map entry and the JSON around it, roughly.
const ENTRY_BYTES: usize = 48;

/// The bounded record, as it fills.
#[derive(Debug)]
pub struct Observer {
    max_identities: usize,
    max_items: usize,
    max_bytes: usize,
    /// The bytes of the names held, with [`ENTRY_BYTES`] for each.
    bytes: usize,
    by_resource: BTreeMap<(String, String), BTreeMap<String, IdentityRecord>>,
    identities: BTreeSet<String>,
    capped_writes: u64,
}

impl Observer {
    /// A record of at most `max_identities` identities, each with at most
    /// `max_items` fields and condition types, whose names take at most
    /// about `max_bytes` (the `(other)` entries aside).
    pub fn new(max_identities: usize, max_items: usize, max_bytes: usize) -> Self {
        Self {
            max_identities,
            max_items,
            max_bytes,
            bytes: 0,
            by_resource: BTreeMap::new(),
            identities: BTreeSet::new(),
            capped_writes: 0,
        }
    }

    /// Takes `cost` from the byte cap, if it fits.
    fn admit(bytes: &mut usize, max_bytes: usize, cost: usize) -> bool {
        if bytes.saturating_add(cost) > max_bytes {
            return false;
        }
        *bytes += cost;
        true
    }

    /// Counts one write; returns the identity it was counted under (cut to
    /// [`MAX_NAME_BYTES`], or [`OTHER_IDENTITY`]): the metrics' label.
    pub fn record(&mut self, write: &ObservedWrite) -> String {
        let Self {
            max_identities,
            max_items,
            max_bytes,
            bytes,
            by_resource,
            identities,
            capped_writes,
        } = self;
        let writer = cut_name(&write.facts.writer);
        let writers = by_resource
            .entry((write.facts.group.clone(), write.facts.resource.clone()))
            .or_default();
        let known = identities.contains(writer.as_ref());
        // An identity's name is held in the set, and twice for each resource
        // it writes (the key, and the record's own field).
        let copies = usize::from(!known) + 2 * usize::from(!writers.contains_key(writer.as_ref()));
        let held = (known || identities.len() < *max_identities)
            && Self::admit(bytes, *max_bytes, copies * (writer.len() + ENTRY_BYTES));
        let identity = if held {
            if !known {
                identities.insert(writer.clone().into_owned());
            }
            writer.into_owned()
        } else {
            *capped_writes += 1;
            OTHER_IDENTITY.to_owned()
        };
        let record = writers.entry(identity.clone()).or_insert_with(|| IdentityRecord {
            identity: identity.clone(),
            ..Default::default()
        });
        record.writes += 1;
        for item in &write.changed {
            let full = record_items(&record.fields) + record_items(&record.conditions) >= *max_items;
            let (map, key) = match item {
                Item::Field(path) => (&mut record.fields, path.to_string()),
                Item::Condition(ty) => (&mut record.conditions, ty.clone()),
                Item::Entry { list, key, value } => {
                    let list = list.to_string();
                    let (list, key, value) = (cut_name(&list), cut_name(key), cut_name(value));
                    let held = record
                        .entries
                        .values()
                        .flat_map(BTreeMap::values)
                        .map(record_items)
                        .sum::<usize>();
                    let known = record
                        .entries
                        .get(list.as_ref())
                        .and_then(|m| m.get(key.as_ref()))
                        .is_some_and(|v| v.contains_key(value.as_ref()));
                    if known
                        || held < *max_items
                            && Self::admit(bytes, *max_bytes, list.len() + key.len() + value.len() + ENTRY_BYTES)
                    {
                        let values = record.entries.entry(list.into_owned()).or_default();
                        *values
                            .entry(key.into_owned())
                            .or_default()
                            .entry(value.into_owned())
                            .or_default() += 1;
                    } else {
                        *record.fields.entry(OTHER_ITEM.to_owned()).or_default() += 1;
                    }
                    continue;
                }
            };
            let key = cut_name(&key).into_owned();
            let key = if map.contains_key(&key) || !full && Self::admit(bytes, *max_bytes, key.len() + ENTRY_BYTES) {
                key
            } else {
                OTHER_ITEM.to_owned()
            };
            *map.entry(key).or_default() += 1;
        }
        identity
    }

    /// The record as served (without its basis, which the server adds).
    pub fn snapshot(&self) -> ObservedWriters {
        ObservedWriters {
            basis: None,
            resources: self
                .by_resource
                .iter()
                .map(|((group, resource), writers)| ResourceRecord {
                    group: group.clone(),
                    resource: resource.clone(),
                    writers: writers.values().cloned().collect(),
                })
                .collect(),
            identities: self.identities.len(),
            capped_writes: self.capped_writes,
        }
    }
}

fn record_items(map: &BTreeMap<String, u64>) -> usize {
    map.keys().filter(|k| *k != OTHER_ITEM).count()
}

#[cfg(test)]
mod tests;
