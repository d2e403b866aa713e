//! The merge patch one attempt sends: a pure function of the staged and the stored object.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::ownership::{FieldPath, condition_type, drop_nested};

/// What a writer owns: field paths (none below another) and condition types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    pub(super) fields: Vec<FieldPath>,
    pub(super) conditions: BTreeSet<String>,
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
        }
    }

    /// The owned field paths, sorted.
    pub fn fields(&self) -> &[FieldPath] {
        &self.fields
    }

    /// The owned condition types.
    pub fn conditions(&self) -> &BTreeSet<String> {
        &self.conditions
    }
}

/// The JSON merge patch of one attempt, a pure function of the staged and
/// the stored object: `lock` as the resourceVersion, each owned path as
/// staged (`null` where the staged object lacks what the server holds), and,
/// when the staged status has a conditions list, that list with the owned
/// types as staged and every other type as stored.
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
    if let Some(staged_list) = conditions_path.get(staged_status).and_then(Value::as_array) {
        let stored_list = conditions_path
            .get(stored_status)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let merged = merge_conditions(staged_list, stored_list, &owned.conditions);
        conditions_path.set_in(&mut patch, Value::Array(merged));
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

/// The conditions list to write: owned types as staged, every other type as
/// the server holds it (changed, added or removed by others), in the staged
/// order where the staged list has the type, then the rest as stored.
pub(super) fn merge_conditions(staged: &[Value], stored: &[Value], owned: &BTreeSet<String>) -> Vec<Value> {
    let is_owned = |c: &Value| condition_type(c).is_some_and(|t| owned.contains(t));
    let mut result: Vec<Value> = Vec::with_capacity(staged.len().max(stored.len()));
    let mut taken = vec![false; stored.len()];
    for item in staged {
        if is_owned(item) {
            result.push(item.clone());
        } else if let Some(i) =
            (0..stored.len()).find(|&i| !taken[i] && condition_type(&stored[i]) == condition_type(item))
        {
            taken[i] = true;
            result.push(stored[i].clone());
        }
    }
    for (i, item) in stored.iter().enumerate() {
        if !taken[i] && !is_owned(item) {
            result.push(item.clone());
        }
    }
    result
}
