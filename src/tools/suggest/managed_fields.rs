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
}

/// Reads an object's `managedFields`: the entries of the status
/// subresource, each one's leaves below `.status` (`conditions_key` is the
/// conditions list: its items keyed by type are condition types).
pub fn object_fields(object: &str, entries: &[ManagedFieldsEntry], conditions_key: &str) -> ObjectFields {
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
        let Some(status) = set.0.get("f:status") else {
            continue;
        };
        let mut items = BTreeSet::new();
        let mut atomic = false;
        collect(status, &mut Vec::new(), conditions_key, &mut items, &mut atomic);
        if atomic {
            fields.atomic_conditions.insert(manager.clone());
        }
        if !items.is_empty() {
            fields.managers.entry(manager.clone()).or_default().extend(items);
        }
    }
    fields
}

/// The leaves of a fieldsV1 set: a member `f:NAME` with member children is
/// an object (its leaves are named), with none (or only `.`) a leaf; a list
/// keyed or set-valued (`k:`/`v:` children) is a leaf, except the
/// conditions list at the top, whose `k:{"type":…}` items are condition types.
///
/// A dot path cannot name a key that holds a dot, so an object with such a
/// key is a leaf (owned whole), and such a key at the top is left out.
fn collect(set: &Value, path: &mut Vec<String>, conditions_key: &str, items: &mut BTreeSet<Item>, atomic: &mut bool) {
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
                *atomic = true;
            }
            items.extend(types.into_iter().map(Item::Condition));
        } else if nameable_children {
            collect(child, path, conditions_key, items, atomic);
        } else if !name.contains('.')
            && let Ok(field) = FieldPath::parse(&path.join("."))
        {
            items.insert(Item::Field(field));
        }
        path.pop();
    }
}

/// `k:{"type":"Ready"}` to `Ready`.
fn condition_key_type(key: &str) -> Option<String> {
    let keys: Value = serde_json::from_str(key.strip_prefix("k:")?).ok()?;
    keys.get("type")?.as_str().map(str::to_owned)
}
