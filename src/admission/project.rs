//! Projection: the parts of a status that the rules read, built from JSON
//! text without building anything else. Both readers use it: the single
//! pass while it reads a body, the two-pass path on the status text the
//! wire parse kept.

use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::wire::BorrowedKey;
use crate::ownership::PathTree;

/// The statuses of `oldObject` and `object`, projected: `None` for an
/// absent (or `null`) object, `Some(None)` for an object without a status.
#[derive(Debug, Default)]
pub(crate) struct ProjectedStatuses {
    pub(crate) old: Option<Option<Value>>,
    pub(crate) new: Option<Option<Value>>,
}

impl ProjectedStatuses {
    /// Both projections dropped without recursion: a projection made on
    /// the unbounded path may be nested as deep as the API server allows.
    pub(crate) fn drop_iteratively(self) {
        self.old
            .flatten()
            .into_iter()
            .chain(self.new.flatten())
            .for_each(crate::ownership::drop_iteratively);
    }
}

/// How deep a parse may nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Depth {
    /// serde_json's default limit (128): for the ordinary stack.
    Bounded,
    /// No limit: only on a stack sized for the text's measured nesting.
    Unbounded,
}

/// Why the status of an object could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProjectError {
    /// Nested deeper than a [`Depth::Bounded`] parse allows: parse again
    /// with [`Depth::Unbounded`] on a stack that fits [`nesting_depth`].
    #[error("nested deeper than the bounded parse allows")]
    TooDeep,
    /// Its values would need more memory than one review is given.
    #[error("{}", crate::value_budget::BudgetExceeded)]
    TooLarge,
    /// Not JSON (the API server never sends this).
    #[error("the object is not valid JSON: {0}")]
    Malformed(serde_json::Error),
}

/// The parts of a status that `paths` names, as a JSON value that holds
/// nothing else: each read path with its whole value, and the object
/// parents that lead to it. A parent that is not an object is kept as
/// `false` (it only matters that it is not an object); a `null` status is
/// `None`. In the conditions list, an item of a type `paths` does not read
/// is kept as `null`, so that every item keeps its index.
pub(crate) fn project_status(status: &RawValue, paths: &PathTree, depth: Depth) -> Result<Option<Value>, ProjectError> {
    let mut deserializer = serde_json::Deserializer::from_str(status.get());
    if depth == Depth::Unbounded {
        deserializer.disable_recursion_limit();
    }
    let status = Projection(paths, depth)
        .deserialize(&mut deserializer)
        .map(Some)
        .map_err(|e| {
            if is_recursion_limit(&e) {
                ProjectError::TooDeep
            } else if crate::value_budget::is_budget_exceeded(&e) {
                ProjectError::TooLarge
            } else {
                ProjectError::Malformed(e)
            }
        })?;
    Ok(status.filter(|s| !s.is_null()))
}

/// serde_json names no error code publicly; this is its message for
/// `ErrorCode::RecursionLimitExceeded` (pinned by a test), also where a
/// condition item's own parse passes it on.
fn is_recursion_limit(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// The deepest nesting of arrays and objects in JSON text, counted without
/// recursion (string contents are skipped).
pub fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in json.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A map key, kept only when `tree` reads below it.
struct ChildKey<'t>(&'t PathTree);

impl<'de, 't> DeserializeSeed<'de> for ChildKey<'t> {
    type Value = Option<(String, &'t PathTree)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 't> Visitor<'de> for ChildKey<'t> {
    type Value = Option<(String, &'t PathTree)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.child(key).map(|child| (key.to_owned(), child)))
    }
}

/// A value projected on `tree`: whole where the tree reads it whole, else
/// only the keys the tree names.
pub(crate) struct Projection<'t>(pub(crate) &'t PathTree, pub(crate) Depth);

impl<'de> DeserializeSeed<'de> for Projection<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.0.is_whole() {
            crate::value_budget::build(deserializer)
        } else if let Some(types) = self.0.condition_types() {
            deserializer.deserialize_any(ConditionsOf(types, self.1))
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

/// The scalar visits of a projecting visitor: `null` becomes `$null`, any
/// other scalar `$other`.
macro_rules! scalars_as {
    ($null:expr, $other:expr) => {
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok($null)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
            Ok($other)
        }

        fn visit_str<E>(self, _: &str) -> Result<Value, E> {
            Ok($other)
        }
    };
}

/// What stands for a parent that is not an object: only its kind matters.
const NOT_AN_OBJECT: Value = Value::Bool(false);

impl<'de> Visitor<'de> for Projection<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut projected = Map::new();
        while let Some(key) = map.next_key_seed(ChildKey(self.0))? {
            match key {
                Some((key, child)) => {
                    let value = map.next_value_seed(Projection(child, self.1))?;
                    // The last of duplicate keys wins, as in Go and serde_json.
                    projected.insert(key, value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(projected))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(NOT_AN_OBJECT)
    }

    scalars_as!(Value::Null, NOT_AN_OBJECT);
}

/// A conditions list: every item kept in place, read whole only when its
/// type is one of the set (the others become `null`). Anything but a list
/// stands for what it is: absent, or not a list.
struct ConditionsOf<'t>(&'t std::collections::BTreeSet<String>, Depth);

/// One item of a conditions list, read in one pass: its members are kept
/// as unparsed text until its `type` (which Go writes last) is known; only
/// an item of a read type is then built, the others become `null`.
struct ConditionItem<'t>(&'t std::collections::BTreeSet<String>, Depth);

impl<'de> DeserializeSeed<'de> for ConditionItem<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ConditionItem<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // metav1.Condition has six members; room for them without regrowing.
        let mut members: Vec<(std::borrow::Cow<'de, str>, &'de RawValue)> = Vec::with_capacity(8);
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            members.push((key, map.next_value::<&'de RawValue>()?));
        }
        // The last `type` wins, as the last of duplicate keys does in a value.
        let read = members
            .iter()
            .rev()
            .find(|(key, _)| key == "type")
            .and_then(|(_, raw)| {
                serde_json::from_str::<&str>(raw.get())
                    .map(std::borrow::Cow::Borrowed)
                    .or_else(|_| serde_json::from_str::<String>(raw.get()).map(std::borrow::Cow::Owned))
                    .ok()
            })
            .is_some_and(|ty| self.0.contains(ty.as_ref()));
        if !read {
            return Ok(Value::Null);
        }
        let mut item = Map::new();
        for (key, raw) in members {
            let mut deserializer = serde_json::Deserializer::from_str(raw.get());
            if self.1 == Depth::Unbounded {
                deserializer.disable_recursion_limit();
            }
            // A recursion-limit error keeps its message, which asks the
            // caller for the unbounded parse.
            let value = crate::value_budget::build(&mut deserializer).map_err(serde::de::Error::custom)?;
            item.insert(key.into_owned(), value);
        }
        Ok(Value::Object(item))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    scalars_as!(Value::Null, Value::Null);
}

impl<'de> Visitor<'de> for ConditionsOf<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(16));
        while let Some(item) = seq.next_element_seed(ConditionItem(self.0, self.1))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(NOT_AN_OBJECT)
    }

    scalars_as!(Value::Null, NOT_AN_OBJECT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::wire::ObjectView;
    use crate::ownership::FieldPath;
    use serde_json::json;

    fn tree(paths: &[&str]) -> PathTree {
        let paths: Vec<FieldPath> = paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect();
        PathTree::of(&paths)
    }

    fn project(object: Value, paths: &[&str]) -> Option<Value> {
        let text = serde_json::to_string(&object).unwrap();
        let view: ObjectView<'_> = serde_json::from_str(&text).unwrap();
        view.status
            .and_then(|status| project_status(status, &tree(paths), Depth::Bounded).unwrap())
    }

    #[test]
    fn the_projection_holds_the_read_paths_and_their_parents_only() {
        let object = json!({"spec": {"x": 1}, "status": {
            "a": {"b": {"deep": [1, 2]}, "c": 3}, "s": "text", "n": null, "l": [1], "other": {"k": 1}}});
        assert_eq!(
            project(object.clone(), &["a.b", "s.x", "n.y", "l.z", "missing.q"]),
            Some(json!({"a": {"b": {"deep": [1, 2]}}, "s": false, "n": null, "l": false}))
        );
        assert_eq!(project(object, &[]), Some(json!({})));
        assert_eq!(project(json!({"status": null}), &["a"]), None);
        assert_eq!(project(json!({"spec": {}}), &["a"]), None);
        assert_eq!(project(json!({"status": 7}), &["a"]), Some(json!(false)));
    }

    #[test]
    fn deep_values_outside_the_read_paths_are_skipped_at_any_depth() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        let text = format!(r#"{{"spec": {deep}, "status": {{"other": {deep}, "a": 1}}}}"#);
        let view: ObjectView<'_> = serde_json::from_str(&text).unwrap();
        let status = project_status(view.status.unwrap(), &tree(&["a"]), Depth::Bounded).unwrap();
        assert_eq!(status, Some(json!({"a": 1})));
    }

    #[test]
    fn a_deep_read_value_asks_for_the_unbounded_parse() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let text = format!(r#"{{"a": {deep}}}"#);
        let raw: &RawValue = serde_json::from_str(&text).unwrap();
        assert!(matches!(
            project_status(raw, &tree(&["a"]), Depth::Bounded),
            Err(ProjectError::TooDeep)
        ));
        let status = project_status(raw, &tree(&["a"]), Depth::Unbounded).unwrap().unwrap();
        assert_eq!(nesting_depth(&text), 201);
        crate::ownership::drop_iteratively(status);
    }

    #[test]
    fn conditions_of_types_nobody_owns_are_kept_in_place_unread() {
        let conditions = FieldPath::parse("conditions").unwrap();
        let tree = PathTree::with_conditions([], &conditions, ["Ready".to_owned()]);
        let text =
            r#"{"conditions": [{"type": "Other", "x": 1}, {"type": "Ready", "m": null}, 5, {"type": "Re\u0061dy"}]}"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        assert_eq!(
            project_status(raw, &tree, Depth::Bounded).unwrap(),
            Some(json!({"conditions": [null, {"type": "Ready", "m": null}, null, {"type": "Ready"}]}))
        );
        // A deep owned condition asks for the unbounded parse too.
        let deep = format!(
            r#"{{"conditions": [{{"type": "Ready", "d": {}1{}}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let raw: &RawValue = serde_json::from_str(&deep).unwrap();
        assert!(matches!(
            project_status(raw, &tree, Depth::Bounded),
            Err(ProjectError::TooDeep)
        ));
        let status = project_status(raw, &tree, Depth::Unbounded).unwrap().unwrap();
        crate::ownership::drop_iteratively(status);
    }

    #[test]
    fn nesting_depth_skips_brackets_in_strings() {
        assert_eq!(nesting_depth(r#"{"a": "[[[{{\"]]", "b": [[1]]}"#), 3);
        assert_eq!(nesting_depth("1"), 0);
    }
}
