//! The merge patch one attempt sends: a pure function of the staged and the stored object.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::ownership::{FieldPath, KeyedList, drop_nested};

/// What a writer owns: field paths (none below another), condition types,
/// and the entries of keyed lists whose key member holds one of its values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    pub(super) fields: Vec<FieldPath>,
    pub(super) conditions: BTreeSet<String>,
    pub(super) entries: Vec<(KeyedList, BTreeSet<String>)>,
}

impl Owned {
    /// Owns `fields` (a path below another is dropped) and the condition `types`.
    pub fn new<S: Into<String>>(
        fields: impl IntoIterator<Item = FieldPath>,
        types: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            fields: drop_nested(fields.into_iter().collect()),
            conditions: types.into_iter().map(Into::into).collect(),
            entries: Vec::new(),
        }
    }

    /// Also owns the entries of `list` keyed by one of `values`. Values for
    /// the same list (path and key) add up. Nothing is checked here:
    /// [`StatusWriter::owned_entries`](super::StatusWriter::owned_entries)
    /// refuses a list that overlaps a field, the conditions or another list.
    pub fn with_entries<S: Into<String>>(mut self, list: KeyedList, values: impl IntoIterator<Item = S>) -> Self {
        let values = values.into_iter().map(Into::into);
        match self.entries.iter_mut().find(|(l, _)| *l == list) {
            Some((_, owned)) => owned.extend(values),
            None => self.entries.push((list, values.collect())),
        }
        self
    }

    /// The owned field paths, sorted.
    pub fn fields(&self) -> &[FieldPath] {
        &self.fields
    }

    /// The owned condition types.
    pub fn conditions(&self) -> &BTreeSet<String> {
        &self.conditions
    }

    /// The keyed lists, each with the key values whose entries are owned.
    pub fn entries(&self) -> &[(KeyedList, BTreeSet<String>)] {
        &self.entries
    }
}

/// The JSON merge patch of one attempt, a pure function of the staged and
/// the stored object: `lock` as the resourceVersion, each owned path as
/// staged (`null` where the staged object lacks what the server holds), and,
/// for the conditions list and each keyed list the staged status has, that
/// list with the owned items as staged and every other item as stored, in
/// the stored order (new owned items at the end).
pub fn status_merge_patch(
    owned: &Owned,
    conditions_path: &FieldPath,
    staged: &Value,
    stored: &Value,
    lock: &str,
) -> Value {
    let mut patch = serde_json::json!({ "metadata": { "resourceVersion": lock } });
    let (staged_status, stored_status) = (staged.get("status"), stored.get("status"));
    for path in &owned.fields {
        match (path.get(staged_status), path.get(stored_status)) {
            (Some(value), stored) => path.set_in(&mut patch, replacing(value, stored)),
            // The server holds it (below object parents, or `get` would not
            // have found it) and the staged object does not: remove it.
            (None, Some(_)) => path.set_in(&mut patch, Value::Null),
            (None, None) => {}
        }
    }
    // Conditions are the keyed list whose key is `type`: one merge serves both.
    let conditions = KeyedList {
        path: conditions_path.clone(),
        key: "type".to_owned(),
    };
    let lists = std::iter::once((&conditions, &owned.conditions)).chain(owned.entries.iter().map(|(l, v)| (l, v)));
    for (list, values) in lists {
        // A staged status without the list leaves it as stored.
        if let Some(staged_list) = list.path.get(staged_status).and_then(Value::as_array) {
            let merged = merge_keyed(list, staged_list, list.entries(stored_status), values);
            list.path.set_in(&mut patch, Value::Array(merged));
        }
    }
    patch
}

/// `staged` as a merge-patch value that makes the server hold exactly it:
/// inside objects, `null` for every key the server holds and the staged
/// value lacks, at every depth.
fn replacing(staged: &Value, stored: Option<&Value>) -> Value {
    match (staged, stored) {
        (Value::Object(staged), Some(Value::Object(stored))) => {
            let mut result: Map<String, Value> = staged
                .iter()
                .map(|(k, v)| (k.clone(), replacing(v, stored.get(k))))
                .collect();
            for key in stored.keys() {
                if !staged.contains_key(key) {
                    result.insert(key.clone(), Value::Null);
                }
            }
            Value::Object(result)
        }
        _ => staged.clone(),
    }
}

/// A keyed list to write: the stored list with the writer's items (those
/// whose key is one of `owned`) replaced, as a multiset, by its staged ones.
/// Every other item (another key, or none) is as the server holds it, in
/// the stored order: a stale staged copy neither rolls it back nor moves it.
/// The writer's items keep the stored places: an item staged unchanged stays
/// where it stood, a changed one takes the place of a stored item with the
/// same key, and the rest follow at the end in the staged order; a stored
/// item of the writer with no staged counterpart is removed.
///
/// Quadratic in the writer's items, linear in the others; lists under
/// status are short (Gateway API caps `parents` at 32).
pub(super) fn merge_keyed(
    list: &KeyedList,
    staged: &[Value],
    stored: &[Value],
    owned: &BTreeSet<String>,
) -> Vec<Value> {
    let owned_key = |item: &Value| list.key_of(item).filter(|key| owned.contains(*key)).map(str::to_owned);
    let mine: Vec<(&Value, String)> = staged
        .iter()
        .filter_map(|item| Some((item, owned_key(item)?)))
        .collect();
    let mut placed = vec![false; mine.len()];
    // For each stored item of the writer: its key, and the staged item that takes its place.
    let mut slots: Vec<(Option<String>, Option<usize>)> = stored.iter().map(|item| (owned_key(item), None)).collect();
    // An item staged unchanged first, so that it stays where it stood; then
    // any staged item with the same key.
    for unchanged in [true, false] {
        for ((key, place), item) in slots.iter_mut().zip(stored) {
            let Some(key) = key.as_deref().filter(|_| place.is_none()) else {
                continue;
            };
            let fits = |j: usize| !placed[j] && mine[j].1 == key && (!unchanged || mine[j].0 == item);
            if let Some(j) = (0..mine.len()).find(|&j| fits(j)) {
                placed[j] = true;
                *place = Some(j);
            }
        }
    }
    let mut result = Vec::with_capacity(stored.len().max(mine.len()));
    for (item, (key, place)) in stored.iter().zip(&slots) {
        match (key, place) {
            (None, _) => result.push(item.clone()),
            (Some(_), Some(j)) => result.push(mine[*j].0.clone()),
            (Some(_), None) => {} // removed by the writer
        }
    }
    let rest = mine.iter().zip(&placed).filter(|(_, done)| !**done);
    result.extend(rest.map(|((item, _), _)| (*item).clone()));
    result
}
