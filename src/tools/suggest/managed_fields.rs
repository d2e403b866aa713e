//! What an object's `managedFields` say: which field manager set which
//! status field and condition type through the status subresource.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;

use crate::ownership::FieldPath;
use crate::ownership::Item;

/// One object's status items by the field manager that set them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectFields {
    /// `namespace/name`, or `name`.
    pub object: String,
    /// Manager to the items it manages through the status subresource.
    pub managers: BTreeMap<String, BTreeSet<Item>>,
    /// The conditions list is atomic (owned whole by its last writer).
    pub atomic_conditions: BTreeSet<String>,
    /// Manager to the entries it manages of `listType=map` lists (other than
    /// the conditions list): each entry's key members with a string value,
    /// as `Item::Entry { list, key: member, value }`.
    pub entries: BTreeMap<String, BTreeSet<Item>>,
    /// Lists of objects owned whole (atomic: `f:parents: {}`), whose entries
    /// could belong to different writers (a string member with two values
    /// among them), to the managers that hold them.
    pub atomic_lists: BTreeMap<FieldPath, BTreeSet<String>>,
}

/// Reads an object's `managedFields`: the entries of the status
/// subresource, each one's leaves below `.status` (`conditions_key` is the
/// conditions list: its items keyed by type are condition types). `status`
/// is the object's own, where a list owned whole is told from a field.
pub fn object_fields(
    object: &str,
    entries: &[ManagedFieldsEntry],
    conditions_key: &str,
    status: Option<&Value>,
) -> ObjectFields {
    let mut fields = ObjectFields {
        object: object.to_owned(),
        ..Default::default()
    };
    for entry in entries {
        if entry.subresource.as_deref() != Some("status") {
            continue;
        }
        let (Some(manager), Some(set)) = (&entry.manager, &entry.fields_v1) else {
            continue;
        };
        let Some(set) = set.0.get("f:status") else {
            continue;
        };
        let mut found = Found::default();
        collect(set, &mut Vec::new(), conditions_key, status, &mut found);
        if found.atomic_conditions {
            fields.atomic_conditions.insert(manager.clone());
        }
        if !found.items.is_empty() {
            fields.managers.entry(manager.clone()).or_default().extend(found.items);
        }
        if !found.entries.is_empty() {
            fields.entries.entry(manager.clone()).or_default().extend(found.entries);
        }
        for list in found.atomic_lists {
            fields.atomic_lists.entry(list).or_default().insert(manager.clone());
        }
    }
    fields
}

/// What one manager's set holds.
#[derive(Default)]
struct Found {
    items: BTreeSet<Item>,
    atomic_conditions: bool,
    entries: BTreeSet<Item>,
    atomic_lists: BTreeSet<FieldPath>,
}

/// The leaves of a fieldsV1 set: a member `f:NAME` with member children is
/// an object (its leaves are named), with none (or only `.`) a leaf; a list
/// keyed or set-valued (`k:`/`v:` children) is a leaf, except the
/// conditions list at the top, whose `k:{"type":…}` items are condition
/// types. A keyed list's `k:{…}` items also give its entries by their key
/// members; a leaf that holds a list of objects in the object is a list
/// owned whole.
///
/// A dot path cannot name a key that holds a dot, so an object with such a
/// key is a leaf (owned whole), and such a key at the top is left out.
fn collect(set: &Value, path: &mut Vec<String>, conditions_key: &str, status: Option<&Value>, found: &mut Found) {
    let Some(members) = set.as_object() else {
        return;
    };
    for (key, child) in members {
        let Some(name) = key.strip_prefix("f:") else {
            continue;
        };
        let children = child.as_object();
        let child_names = || children.into_iter().flat_map(|c| c.keys());
        let field_names: Vec<&str> = child_names().filter_map(|k| k.strip_prefix("f:")).collect();
        let nameable_children = !field_names.is_empty() && field_names.iter().all(|n| !n.contains('.'));
        path.push(name.to_owned());
        if path.len() == 1 && name == conditions_key {
            let types: Vec<String> = child_names().filter_map(|k| condition_key_type(k)).collect();
            if types.is_empty() {
                found.atomic_conditions = true;
            }
            found.items.extend(types.into_iter().map(Item::Condition));
        } else if nameable_children {
            collect(child, path, conditions_key, status, found);
        } else if !name.contains('.')
            && let Ok(field) = FieldPath::parse(&path.join("."))
        {
            let keyed: Vec<Item> = child_names()
                .filter_map(|k| serde_json::from_str::<Value>(k.strip_prefix("k:")?).ok())
                .flat_map(|keys| match keys {
                    Value::Object(keys) => keys.into_iter().collect(),
                    _ => Vec::new(),
                })
                .filter_map(|(member, value)| {
                    Some(Item::Entry {
                        list: field.clone(),
                        key: member,
                        value: value.as_str()?.to_owned(),
                    })
                })
                .collect();
            if !keyed.is_empty() {
                found.entries.extend(keyed);
            } else if child_names().all(|k| k == ".") && could_be_split(field.get(status)) {
                found.atomic_lists.insert(field.clone());
            }
            found.items.insert(Item::Field(field));
        }
        path.pop();
    }
}

/// Whether a value is a list of objects whose entries could belong to
/// different writers: some string member holds two values among them.
fn could_be_split(value: Option<&Value>) -> bool {
    let Some(entries) = value.and_then(Value::as_array) else {
        return false;
    };
    let mut first: BTreeMap<&str, &str> = BTreeMap::new();
    for entry in entries.iter().filter_map(Value::as_object) {
        for (member, value) in entry {
            if let Some(value) = value.as_str()
                && *first.entry(member.as_str()).or_insert(value) != value
            {
                return true;
            }
        }
    }
    false
}

/// `k:{"type":"Ready"}` to `Ready`.
fn condition_key_type(key: &str) -> Option<String> {
    let keys: Value = serde_json::from_str(key.strip_prefix("k:")?).ok()?;
    keys.get("type")?.as_str().map(str::to_owned)
}
