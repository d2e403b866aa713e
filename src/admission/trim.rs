//! The trim: the JSON Patch that puts back what a write changed of other
//! writers' items, leaving the writer's own and unowned changes alone.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::Value;

use super::project::ChangedGroups;
use crate::ownership::{FieldPath, Item, ResourceRules, Violation, condition_type, same_value};

/// The patch could not be built (a bug).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PatchError(String);

/// The JSON Patch (paths from the object's root) that restores every violated
/// item of the new status to its value in the old one, leaving the writer's
/// own and unowned changes alone.
///
/// The items of a group in `changed` are unbuilt in the new status (`null`
/// in place): where they are, and whether each is the same as its old
/// counterpart, is what `changed` says.
pub(crate) fn restoring_patch(
    rules: &ResourceRules,
    violations: &[Violation],
    old_status: Option<&Value>,
    new_status: Option<&Value>,
    changed: &ChangedGroups,
) -> Result<Patch, PatchError> {
    // Only the status is copied to work on: the rest of a large object is
    // never touched by the patch.
    let status = new_status.cloned().unwrap_or(Value::Null);
    let mut work = Value::Object(serde_json::Map::from_iter([("status".to_owned(), status)]));
    let mut ops = Vec::new();
    let mut violated_types = BTreeSet::new();
    // By position in `rules.lists`: the violated key values.
    let mut violated_keys: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for violation in violations {
        match &violation.item {
            Item::Field(path) => restore(&mut work, path, path.get(old_status), &mut ops)?,
            Item::Condition(ty) => {
                violated_types.insert(ty.as_str());
            }
            Item::Entry { list, value, .. } => {
                if let Some(l) = rules.lists.iter().position(|l| &l.path == list) {
                    violated_keys.entry(l).or_default().insert(value.as_str());
                }
            }
        }
    }
    if !violated_types.is_empty() {
        restore_list(
            &mut work,
            &rules.conditions_path,
            old_status,
            (&violated_types, changed),
            condition_type,
            &mut ops,
        )?;
    }
    for (l, violated) in violated_keys {
        let list = &rules.lists[l];
        restore_list(
            &mut work,
            &list.path,
            old_status,
            (&violated, changed),
            |entry| list.key_of(entry),
            &mut ops,
        )?;
    }
    Ok(Patch(ops))
}

/// Appends the operations that put back, in the list at `list_path` of
/// `work`, every item whose key (`key_of`) is violated, as `old_status`
/// holds them. The one restore of a list, for conditions (keyed by type)
/// and keyed entries alike.
fn restore_list<'v>(
    work: &mut Value,
    list_path: &FieldPath,
    old_status: Option<&'v Value>,
    (violated, changed): (&BTreeSet<&str>, &ChangedGroups),
    key_of: impl Fn(&Value) -> Option<&str>,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), PatchError> {
    let old_list = list_path.get(old_status);
    let old_items: &'v [Value] = old_list
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let current_list = list_path.get(work.get("status")).and_then(Value::as_array);
    let current = current_list.map(Vec::as_slice).unwrap_or_default();
    // The unbuilt items of groups proven changed, by their index.
    let unbuilt: BTreeMap<usize, (&str, bool)> = changed
        .in_list(list_path)
        .flat_map(|(key, group)| group.new_items.iter().map(move |&(at, same)| (at, (key, same))))
        .collect();
    let restore_list = ListRestore::of(current, old_items, violated, &key_of, &unbuilt);
    match current_list {
        // An item at a time where the list is there to patch and stays a
        // list: the patch holds only the restored items. They are not
        // applied to `work`, which nothing reads after them: each removal
        // would shift the rest of the list, quadratic in a long one.
        Some(list) if restore_list.len_after(list.len()) > 0 || old_list.is_some() => {
            ops.extend(restore_list.operations(list_path));
        }
        // Otherwise the list is written whole (or removed, where it was
        // absent before and would be left empty).
        _ => {
            if !restore_list.is_empty() {
                let restored = restore_list.applied_to(current);
                let value = (!restored.is_empty() || old_list.is_some()).then_some(Value::Array(restored));
                restore(work, list_path, value.as_ref(), ops)?;
            }
        }
    }
    Ok(())
}

/// What restoring the violated types does to a conditions list, item by
/// item: a changed item is put back where it stands, an added one removed,
/// a removed one appended. The one restore of a list: the patch takes it as
/// operations, or applies it and writes the list whole.
struct ListRestore<'v> {
    /// By index in the new list: the old item to put there.
    replaced: Vec<(usize, &'v Value)>,
    /// Indexes in the new list, ascending.
    removed: Vec<usize>,
    appended: Vec<&'v Value>,
}

impl<'v> ListRestore<'v> {
    /// `unbuilt` are the items of `new` left unbuilt, by index: their key,
    /// and whether each is the same as the old item it pairs with.
    fn of(
        new: &[Value],
        old: &'v [Value],
        violated: &BTreeSet<&str>,
        key_of: &impl Fn(&Value) -> Option<&str>,
        unbuilt: &BTreeMap<usize, (&str, bool)>,
    ) -> Self {
        let mut old_by_type: BTreeMap<&str, VecDeque<&Value>> = BTreeMap::new();
        for item in old {
            if let Some(ty) = key_of(item).filter(|t| violated.contains(t)) {
                old_by_type.entry(ty).or_default().push_back(item);
            }
        }
        let (mut replaced, mut removed) = (Vec::new(), Vec::new());
        for (index, item) in new.iter().enumerate() {
            let (key, same) = match unbuilt.get(&index) {
                Some(&(key, same)) => (Some(key), Some(same)),
                None => (key_of(item), None),
            };
            let Some(ty) = key.filter(|t| violated.contains(t)) else {
                continue;
            };
            match old_by_type.get_mut(ty).and_then(VecDeque::pop_front) {
                Some(previous) if same.unwrap_or_else(|| same_value(Some(previous), Some(item))) => {}
                Some(previous) => replaced.push((index, previous)),
                None => removed.push(index),
            }
        }
        let appended = old_by_type.into_values().flatten().collect();
        Self {
            replaced,
            removed,
            appended,
        }
    }

    fn is_empty(&self) -> bool {
        self.replaced.is_empty() && self.removed.is_empty() && self.appended.is_empty()
    }

    /// How many items a list of `len` holds once restored.
    fn len_after(&self, len: usize) -> usize {
        len - self.removed.len() + self.appended.len()
    }

    /// The restore as operations on the list at `list_path`.
    fn operations(&self, list_path: &FieldPath) -> impl Iterator<Item = PatchOperation> {
        let at = |index: &str| {
            let mut pointer = list_path.status_pointer();
            pointer.push_back(index);
            pointer
        };
        let replaced = self.replaced.iter().map(move |(index, previous)| {
            PatchOperation::Replace(ReplaceOperation {
                path: at(&index.to_string()),
                value: (*previous).clone(),
            })
        });
        // From the end, so that each index still names the item it was found at.
        let removed = self.removed.iter().rev().map(move |index| {
            PatchOperation::Remove(RemoveOperation {
                path: at(&index.to_string()),
            })
        });
        let appended = self.appended.iter().map(move |previous| {
            PatchOperation::Add(AddOperation {
                path: at("-"),
                value: (*previous).clone(),
            })
        });
        replaced.chain(removed).chain(appended)
    }

    /// The list `new` restored.
    fn applied_to(&self, new: &[Value]) -> Vec<Value> {
        let mut result = Vec::with_capacity(self.len_after(new.len()));
        let (mut replaced, mut removed) = (self.replaced.iter().peekable(), self.removed.iter().peekable());
        for (index, item) in new.iter().enumerate() {
            if let Some((_, previous)) = replaced.next_if(|(at, _)| *at == index) {
                result.push((*previous).clone());
            } else if removed.next_if(|at| **at == index).is_none() {
                result.push(item.clone());
            }
        }
        result.extend(self.appended.iter().map(|previous| (*previous).clone()));
        result
    }
}

/// Appends the operation that makes `path` hold `value` (or be absent, for
/// `None`) in `work`, and applies it to `work`, so that later operations
/// see the parents it created.
fn restore(
    work: &mut Value,
    path: &FieldPath,
    value: Option<&Value>,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), PatchError> {
    let op = match value {
        None if path.get(work.get("status")).is_none() => return Ok(()),
        None => PatchOperation::Remove(RemoveOperation {
            path: path.status_pointer(),
        }),
        Some(value) => PatchOperation::Add(path.add_operation(work, value.clone())),
    };
    json_patch::patch(work, std::slice::from_ref(&op)).map_err(|e| PatchError(e.to_string()))?;
    ops.push(op);
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The list restore's two forms, operations and the whole list, are one
    /// restore: applying the operations gives the list it writes.
    #[test]
    fn the_operations_of_a_list_restore_give_the_list_it_writes() {
        let item = |ty: &str, status: &str| json!({"type": ty, "status": status});
        let old = vec![
            item("Ready", "True"),
            item("Ready", "False"),
            item("Scaled", "True"),
            item("Gone", "x"),
        ];
        let new = vec![
            item("Other", "True"),
            item("Ready", "Unknown"),
            item("Added", "True"),
            item("Ready", "False"),
            item("Scaled", "True"),
            item("Ready", "extra"),
        ];
        let violated: BTreeSet<&str> = ["Ready", "Added", "Gone"].into();
        let restore = ListRestore::of(&new, &old, &violated, &condition_type, &BTreeMap::new());
        let path = FieldPath::parse("conditions").unwrap();
        let mut object = json!({"status": {"conditions": new.clone()}});
        let ops: Vec<PatchOperation> = restore.operations(&path).collect();
        json_patch::patch(&mut object, &ops).unwrap();
        let restored = restore.applied_to(&new);
        assert_eq!(object["status"]["conditions"], Value::Array(restored.clone()));
        assert_eq!(restore.len_after(new.len()), restored.len());
        assert_eq!(
            restored,
            [
                item("Other", "True"),
                item("Ready", "True"),
                item("Ready", "False"),
                item("Scaled", "True"),
                item("Gone", "x"),
            ]
        );
    }
}
