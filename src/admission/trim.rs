//! The trim: the JSON Patch that puts back what a write changed of other
//! writers' items, leaving the writer's own and unowned changes alone.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use jsonptr::PointerBuf;
use serde_json::Value;

use super::project::ChangedGroups;
use crate::ownership::{FieldPath, Item, ResourceRules, Violation, condition_type, same_value};

/// The patch could not be built (a bug).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PatchError(String);

/// The JSON Patch (paths from the object's root), as the JSON text the
/// response carries, that restores every violated item of the new status
/// to its value in the old one, leaving the writer's own and unowned
/// changes alone.
///
/// The items of a group in `changed` are unbuilt in both statuses (`null`
/// in place): where the new ones are, whether each is the same as its old
/// counterpart, and the old ones' text, is what `changed` says. That text
/// is written into the patch as it was read: a rolled-back item is put
/// back without being built, copied or encoded again.
pub(crate) fn restoring_patch<'v>(
    rules: &ResourceRules,
    violations: &[Violation],
    old_status: Option<&'v Value>,
    new_status: Option<&Value>,
    changed: &'v ChangedGroups,
) -> Result<Vec<u8>, PatchError> {
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
    write_patch(&ops)
}

/// An item a restore puts back: built, or the JSON text of one that never
/// was (see [`ChangedGroups`]).
#[derive(Debug, Clone, Copy)]
enum Restored<'v> {
    Value(&'v Value),
    Text(&'v [u8]),
}

impl Restored<'_> {
    fn to_value(self) -> Result<Value, PatchError> {
        match self {
            Restored::Value(value) => Ok(value.clone()),
            Restored::Text(text) => serde_json::from_slice(text).map_err(|e| PatchError(e.to_string())),
        }
    }
}

/// How an item is put back: over the item at its index, or after the list's last.
#[derive(Debug, Clone, Copy)]
enum Put {
    Replace,
    Add,
}

impl Put {
    /// The operation's name in JSON Patch.
    fn op(self) -> &'static str {
        match self {
            Put::Replace => "replace",
            Put::Add => "add",
        }
    }
}

/// One operation of the restoring patch.
#[derive(Debug)]
enum RestoreOp<'v> {
    /// Written as json_patch writes it.
    Built(PatchOperation),
    /// An item's JSON text put at `path`: written in json_patch's form, its
    /// value copied as it was read.
    Text {
        put: Put,
        path: PointerBuf,
        value: &'v [u8],
    },
}

impl<'v> RestoreOp<'v> {
    fn of(put: Put, path: PointerBuf, item: Restored<'v>) -> Self {
        match (put, item) {
            (_, Restored::Text(value)) => RestoreOp::Text { put, path, value },
            (Put::Replace, Restored::Value(value)) => RestoreOp::Built(PatchOperation::Replace(ReplaceOperation {
                path,
                value: value.clone(),
            })),
            (Put::Add, Restored::Value(value)) => RestoreOp::Built(PatchOperation::Add(AddOperation {
                path,
                value: value.clone(),
            })),
        }
    }
}

/// The patch's JSON text: an array of the operations, each as json_patch
/// writes one (`{"op":…,"path":…,"value":…}`).
fn write_patch(ops: &[RestoreOp<'_>]) -> Result<Vec<u8>, PatchError> {
    let encoding = |e: serde_json::Error| PatchError(e.to_string());
    let text_length: usize = ops
        .iter()
        .map(|op| match op {
            RestoreOp::Text { value, .. } => value.len() + 64,
            RestoreOp::Built(_) => 64,
        })
        .sum();
    let mut patch = Vec::with_capacity(text_length + 2);
    patch.push(b'[');
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            patch.push(b',');
        }
        match op {
            RestoreOp::Built(op) => serde_json::to_writer(&mut patch, op).map_err(encoding)?,
            RestoreOp::Text { put, path, value } => {
                patch.extend_from_slice(b"{\"op\":\"");
                patch.extend_from_slice(put.op().as_bytes());
                patch.extend_from_slice(b"\",\"path\":");
                serde_json::to_writer(&mut patch, path.as_str()).map_err(encoding)?;
                patch.extend_from_slice(b",\"value\":");
                patch.extend_from_slice(value);
                patch.push(b'}');
            }
        }
    }
    patch.push(b']');
    Ok(patch)
}

/// Appends the operations that put back, in the list at `list_path` of
/// `work`, every item whose key (`key_of`) is violated, as `old_status`
/// (or, for the groups in `changed`, their old items' text) holds them.
/// The one restore of a list, for conditions (keyed by type) and keyed
/// entries alike.
fn restore_list<'v>(
    work: &mut Value,
    list_path: &FieldPath,
    old_status: Option<&'v Value>,
    (violated, changed): (&BTreeSet<&str>, &'v ChangedGroups),
    key_of: impl Fn(&Value) -> Option<&str>,
    ops: &mut Vec<RestoreOp<'v>>,
) -> Result<(), PatchError> {
    let old_list = list_path.get(old_status);
    // The old items, in list order within each key value.
    let mut old_items: Vec<(&str, Restored<'v>)> = old_list
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| key_of(item).map(|key| (key, Restored::Value(item))))
        .collect();
    for (key, group) in changed.in_list(list_path) {
        old_items.extend(group.old_items.iter().map(|text| (key, Restored::Text(text))));
    }
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
                let restored = restore_list.applied_to(current)?;
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
    replaced: Vec<(usize, Restored<'v>)>,
    /// Indexes in the new list, ascending.
    removed: Vec<usize>,
    appended: Vec<Restored<'v>>,
}

impl<'v> ListRestore<'v> {
    /// `old` are the old list's items with their keys, in list order
    /// within each key. `unbuilt` are the items of `new` left
    /// unbuilt, by index: their key, and whether each is the same as the
    /// old item it pairs with.
    fn of(
        new: &[Value],
        old: Vec<(&str, Restored<'v>)>,
        violated: &BTreeSet<&str>,
        key_of: &impl Fn(&Value) -> Option<&str>,
        unbuilt: &BTreeMap<usize, (&str, bool)>,
    ) -> Self {
        let mut old_by_type: BTreeMap<&str, VecDeque<Restored<'v>>> = BTreeMap::new();
        for (key, item) in old.into_iter().filter(|(key, _)| violated.contains(key)) {
            old_by_type.entry(key).or_default().push_back(item);
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
            let same = |previous: Restored<'_>| match (same, previous) {
                (Some(same), _) => same,
                (None, Restored::Value(previous)) => same_value(Some(previous), Some(item)),
                // Never met: an old item is text only where its group's
                // new items are unbuilt, each told the same or not.
                (None, Restored::Text(_)) => false,
            };
            match old_by_type.get_mut(ty).and_then(VecDeque::pop_front) {
                Some(previous) if same(previous) => {}
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
    fn operations(&self, list_path: &FieldPath) -> impl Iterator<Item = RestoreOp<'v>> {
        let at = |index: &str| {
            let mut pointer = list_path.status_pointer();
            pointer.push_back(index);
            pointer
        };
        let replaced = self
            .replaced
            .iter()
            .map(move |&(index, previous)| RestoreOp::of(Put::Replace, at(&index.to_string()), previous));
        // From the end, so that each index still names the item it was found at.
        let removed = self.removed.iter().rev().map(move |index| {
            RestoreOp::Built(PatchOperation::Remove(RemoveOperation {
                path: at(&index.to_string()),
            }))
        });
        let appended = self
            .appended
            .iter()
            .map(move |&previous| RestoreOp::of(Put::Add, at("-"), previous));
        replaced.chain(removed).chain(appended)
    }

    /// The list `new` restored.
    fn applied_to(&self, new: &[Value]) -> Result<Vec<Value>, PatchError> {
        let mut result = Vec::with_capacity(self.len_after(new.len()));
        let (mut replaced, mut removed) = (self.replaced.iter().peekable(), self.removed.iter().peekable());
        for (index, item) in new.iter().enumerate() {
            if let Some((_, previous)) = replaced.next_if(|(at, _)| *at == index) {
                result.push(previous.to_value()?);
            } else if removed.next_if(|at| **at == index).is_none() {
                result.push(item.clone());
            }
        }
        for previous in &self.appended {
            result.push(previous.to_value()?);
        }
        Ok(result)
    }
}

/// Appends the operation that makes `path` hold `value` (or be absent, for
/// `None`) in `work`, and applies it to `work`, so that later operations
/// see the parents it created.
fn restore(
    work: &mut Value,
    path: &FieldPath,
    value: Option<&Value>,
    ops: &mut Vec<RestoreOp<'_>>,
) -> Result<(), PatchError> {
    let op = match value {
        None if path.get(work.get("status")).is_none() => return Ok(()),
        None => PatchOperation::Remove(RemoveOperation {
            path: path.status_pointer(),
        }),
        Some(value) => PatchOperation::Add(path.add_operation(work, value.clone())),
    };
    json_patch::patch(work, std::slice::from_ref(&op)).map_err(|e| PatchError(e.to_string()))?;
    ops.push(RestoreOp::Built(op));
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
        let old = [
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
        let old_items = old
            .iter()
            .map(|item| (condition_type(item).unwrap(), Restored::Value(item)));
        let restore = ListRestore::of(&new, old_items.collect(), &violated, &condition_type, &BTreeMap::new());
        let path = FieldPath::parse("conditions").unwrap();
        let mut object = json!({"status": {"conditions": new.clone()}});
        let ops: Vec<RestoreOp<'_>> = restore.operations(&path).collect();
        let patch: json_patch::Patch = serde_json::from_slice(&write_patch(&ops).unwrap()).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
        let restored = restore.applied_to(&new).unwrap();
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
