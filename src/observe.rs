//! Who writes what: the status items each identity changes, read from the
//! status UPDATEs the webhook sees (every mode, listed writers or not), and
//! kept in a bounded record. This is what `statusguard suggest --observed`
//! turns into an ownership document: field managers are names a client
//! chooses, while the API server's `userInfo` is the identity the webhook
//! enforces.
//!
//! Pure: the server feeds it off the request path (`server::observer`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use kube::core::GroupVersionKind;
use kube::core::admission::Operation;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::decision::Item;
use crate::ownership::{FieldPath, Ownership, ResourceRules, condition_type, same_value};
use crate::review::{ResourceRef, Writer, is_status_update};

/// The identity of writes beyond the record's cap.
pub const OTHER_IDENTITY: &str = "(other)";
/// The item of changes beyond an identity's cap.
pub const OTHER_ITEM: &str = "(other)";

/// One status UPDATE as the observer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedWrite {
    /// `userInfo.username`.
    pub writer: String,
    /// The API group.
    pub group: String,
    /// The plural resource.
    pub resource: String,
    /// The object's API version (`group/version`, or `version` for the core group).
    pub api_version: String,
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
    /// What the write changes: top-level status fields, the declared field
    /// paths below them, and condition types.
    pub changed: Vec<Item>,
}

/// The parts of a review the observer reads: those of
/// [`crate::review::ReviewRequest`], plus the object's kind and uid that an
/// Event names (the request path never reads them).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    #[serde(default)]
    kind: Option<GroupVersionKind>,
    resource: ResourceRef,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    #[serde(default)]
    user_info: Writer,
    #[serde(default)]
    dry_run: bool,
    #[serde(borrow, default)]
    object: Option<Object<'a>>,
    #[serde(borrow, default)]
    old_object: Option<Object<'a>>,
}

#[derive(Deserialize)]
struct Object<'a> {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    uid: Option<String>,
}

/// Reads a status UPDATE of a resource `rules` names from an AdmissionReview
/// body; `Ok(None)` for any other request.
pub fn read_write(body: &[u8], rules: &Ownership) -> Result<Option<ObservedWrite>, serde_json::Error> {
    let envelope: Envelope<'_> = serde_json::from_slice(body)?;
    let Some(request) = envelope.request else {
        return Ok(None);
    };
    if !is_status_update(&request.operation, request.sub_resource.as_deref()) {
        return Ok(None);
    }
    let Some(resource) = rules.resource(&request.resource.group, &request.resource.resource) else {
        return Ok(None);
    };
    let old = request.old_object.as_ref().and_then(|o| o.status);
    let new = request.object.as_ref().and_then(|o| o.status);
    let changed = changed_items(resource, old, new)?;
    let kind = request.kind.unwrap_or_else(|| GroupVersionKind::gvk("", "", ""));
    Ok(Some(ObservedWrite {
        writer: request.user_info.username.unwrap_or_default(),
        group: request.resource.group,
        resource: request.resource.resource,
        api_version: kind.api_version(),
        kind: kind.kind,
        name: request.name,
        namespace: request.namespace.filter(|n| !n.is_empty()),
        uid: request.object.and_then(|o| o.metadata).and_then(|m| m.uid),
        dry_run: request.dry_run,
        changed,
    }))
}

/// The items a write changes, old status to new: each condition type whose
/// item changed; each declared field path (any writer's) that changed; and
/// each top-level field that changed outside the declared paths.
fn changed_items(
    rules: &ResourceRules,
    old: Option<&RawValue>,
    new: Option<&RawValue>,
) -> Result<Vec<Item>, serde_json::Error> {
    let (old_members, new_members) = (members(old)?, members(new)?);
    let conditions_key = rules.conditions_path.segments().first().map(String::as_str);
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
        if before.map(|r| r.get()) == after.map(|r| r.get()) {
            continue;
        }
        let parse = |raw: Option<&&RawValue>| raw.map(|r| serde_json::from_str::<Value>(r.get())).transpose();
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
        if Some(key) == conditions_key {
            let conditions = condition_changes(&rules.conditions_path, &before, &after);
            explained = !conditions.is_empty();
            changed.extend(conditions.into_iter().map(Item::Condition));
        }
        for path in declared
            .iter()
            .filter(|p| p.segments().first().map(String::as_str) == Some(key))
        {
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

/// The top-level members of a status (none for an absent or null one, or
/// one that is not an object).
fn members(status: Option<&RawValue>) -> Result<BTreeMap<Cow<'_, str>, &RawValue>, serde_json::Error> {
    match status {
        Some(raw) if raw.get().trim_start().starts_with('{') => serde_json::from_str(raw.get()),
        _ => Ok(BTreeMap::new()),
    }
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
/// counted as [`OTHER_IDENTITY`]) and by items per identity (the rest as
/// [`OTHER_ITEM`]); never any of an object's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedWriters {
    /// By group and resource.
    pub resources: Vec<ResourceRecord>,
    /// Identities the record holds by name (at most its cap).
    pub identities: usize,
    /// Writes counted as [`OTHER_IDENTITY`] because the cap was reached.
    pub capped_writes: u64,
}

/// The bounded record, as it fills.
#[derive(Debug)]
pub struct Observer {
    max_identities: usize,
    max_items: usize,
    by_resource: BTreeMap<(String, String), BTreeMap<String, IdentityRecord>>,
    identities: BTreeSet<String>,
    capped_writes: u64,
}

impl Observer {
    /// A record of at most `max_identities` identities, each with at most
    /// `max_items` fields and condition types.
    pub fn new(max_identities: usize, max_items: usize) -> Self {
        Self {
            max_identities,
            max_items,
            by_resource: BTreeMap::new(),
            identities: BTreeSet::new(),
            capped_writes: 0,
        }
    }

    /// Counts one write; returns the identity it was counted under.
    pub fn record(&mut self, write: &ObservedWrite) -> String {
        let known = self.identities.contains(&write.writer);
        let identity = if known || self.identities.len() < self.max_identities {
            if !known {
                self.identities.insert(write.writer.clone());
            }
            write.writer.clone()
        } else {
            self.capped_writes += 1;
            OTHER_IDENTITY.to_owned()
        };
        let writers = self
            .by_resource
            .entry((write.group.clone(), write.resource.clone()))
            .or_default();
        let record = writers.entry(identity.clone()).or_insert_with(|| IdentityRecord {
            identity: identity.clone(),
            ..Default::default()
        });
        record.writes += 1;
        for item in &write.changed {
            let full = record_items(&record.fields) + record_items(&record.conditions) >= self.max_items;
            let (map, key) = match item {
                Item::Field(path) => (&mut record.fields, path.to_string()),
                Item::Condition(ty) => (&mut record.conditions, ty.clone()),
            };
            let key = if map.contains_key(&key) || !full {
                key
            } else {
                OTHER_ITEM.to_owned()
            };
            *map.entry(key).or_default() += 1;
        }
        identity
    }

    /// The record as served.
    pub fn snapshot(&self) -> ObservedWriters {
        ObservedWriters {
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
