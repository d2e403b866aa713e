//! Dot paths below `.status`, and every operation on the JSON at such a path.
//!
//! The webhook (comparing and restoring) and the library (building its merge
//! patch) must never disagree about what "the value at `status.a.b`" is, so
//! reading, writing, walking parents and escaping pointers live here only.

use std::fmt;

use jsonptr::PointerBuf;
use serde_json::{Map, Value};

/// A syntax error in a dot path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path is the empty string.
    #[error("the path is empty")]
    Empty,
    /// A segment between dots is empty.
    #[error("path {0:?} has an empty segment (a leading, trailing or doubled dot)")]
    EmptySegment(String),
}

/// A dot-separated path of JSON object keys below `.status`, e.g. `summary.ready`.
///
/// A segment may hold any character but `.`, including `/` and `~`, which are
/// escaped per RFC 6901 only when the path becomes a JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPath(Vec<String>);

/// Where the parents of a path stand in a document (see [`FieldPath::parents_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parents {
    /// Every parent is an object: the value can be set in place.
    Objects,
    /// The first `n` segments (counting `status`) are objects; the next one
    /// is absent or `null`.
    MissingAt(usize),
    /// The first `n` segments are objects; the next one holds a value that is
    /// not an object, so nothing can be set below it.
    NonObjectAt(usize),
}

impl FieldPath {
    /// Parses a dot path.
    pub fn parse(text: &str) -> Result<Self, PathError> {
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(PathError::EmptySegment(text.to_owned()));
        }
        Ok(Self(segments))
    }

    /// A one-segment path; `segment` must be non-empty and hold no dot.
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    pub(crate) fn single(segment: &str) -> Self {
        Self(vec![segment.to_owned()])
    }

    /// The JSON object keys of the path, outermost first.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// True when `self` equals `other` or lies below it.
    pub fn is_within(&self, other: &FieldPath) -> bool {
        self.0.len() >= other.0.len() && self.0[..other.0.len()] == other.0[..]
    }

    /// True when one of the two paths equals or lies below the other.
    pub fn overlaps(&self, other: &FieldPath) -> bool {
        self.is_within(other) || other.is_within(self)
    }

    /// The JSON Pointer of this path inside a whole object: `/status/<segments>`.
    pub fn status_pointer(&self) -> PointerBuf {
        self.keys_from_root(self.0.len() + 1)
    }

    /// The pointer to the first `n` keys of `status`, then this path's segments.
    fn keys_from_root(&self, n: usize) -> PointerBuf {
        PointerBuf::from_tokens(self.keys().take(n))
    }

    /// `status` followed by the segments: the keys from an object's root.
    fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once("status").chain(self.0.iter().map(String::as_str))
    }

    /// The value at this path below `status`; `None` when it or a parent is
    /// absent, `null`, or a parent is not an object. Absent and `null` are
    /// the same to ownership.
    pub fn get<'a>(&self, status: Option<&'a Value>) -> Option<&'a Value> {
        let mut current = status?;
        for segment in &self.0 {
            current = current.as_object()?.get(segment)?;
        }
        (!current.is_null()).then_some(current)
    }

    /// How the parents of this path stand in `root` (an object whose
    /// `status` holds the path).
    pub fn parents_in(&self, root: &Value) -> Parents {
        let keys: Vec<&str> = self.keys().collect();
        let mut node = root;
        for (depth, key) in keys[..keys.len() - 1].iter().enumerate() {
            match node.get(key) {
                Some(child) if child.is_object() => node = child,
                None | Some(Value::Null) => return Parents::MissingAt(depth),
                Some(_) => return Parents::NonObjectAt(depth),
            }
        }
        Parents::Objects
    }

    /// The JSON Patch `add` that makes this path hold `value` in `root`: at
    /// the first parent that is missing or not an object, the rest of the
    /// path is created in one value.
    pub fn add_operation(&self, root: &Value, value: Value) -> json_patch::AddOperation {
        let keys: Vec<&str> = self.keys().collect();
        let objects = match self.parents_in(root) {
            Parents::Objects => keys.len() - 1,
            Parents::MissingAt(n) | Parents::NonObjectAt(n) => n,
        };
        let mut built = value;
        for key in keys[objects + 1..].iter().rev() {
            built = Value::Object(Map::from_iter([((*key).to_owned(), built)]));
        }
        json_patch::AddOperation {
            path: self.keys_from_root(objects + 1),
            value: built,
        }
    }

    /// Sets `status.<path>` in `root` to `value`, making object parents
    /// (replacing any non-object on the way) as needed. This is what an RFC
    /// 7386 merge patch does with the same keys.
    pub fn set_in(&self, root: &mut Value, value: Value) {
        let mut current = root;
        for key in self.keys() {
            if !current.is_object() {
                *current = Value::Object(Map::new());
            }
            let Value::Object(map) = current else { return };
            current = map.entry(key).or_insert(Value::Null);
        }
        *current = value;
    }
}

/// The status paths a resource's rules read, as a tree of object keys: the
/// webhook parses exactly these parts of an object and skips the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PathTree {
    children: std::collections::BTreeMap<String, PathTree>,
    /// The whole value here is read.
    whole: bool,
    /// Where the whole value is read: the position of its owner among the
    /// resource's writers (whose own values are never compared).
    owner: Option<usize>,
    /// A list whose items are read whole only when their key member has one
    /// of the owned values: the conditions (by `type`) and keyed lists.
    keyed: Option<KeyedItems>,
}

/// Which items of a list are read: those whose string `member` is one of
/// `values` (the others are nobody's, and never compared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyedItems {
    pub(crate) member: String,
    /// The read values, each with the position of its owner among the
    /// resource's writers, where known.
    pub(crate) values: super::LookupMap<String, Option<usize>>,
}

impl PathTree {
    /// The tree of `fields` read whole, and of the conditions list at
    /// `conditions`, whose items are read only when their type is one of
    /// `types` (an item of a type nobody owns is never compared).
    #[cfg(test)]
    pub fn with_conditions<'a>(
        fields: impl IntoIterator<Item = &'a FieldPath>,
        conditions: &FieldPath,
        types: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut root = Self::of(fields);
        root.add_keyed(conditions, "type", types.into_iter().map(|t| (t, None)));
        root
    }

    /// Adds `path`, read whole, owned by the writer at position `owner`.
    pub fn add_owned(&mut self, path: &FieldPath, owner: usize) {
        let node = self.node_at(path);
        node.whole = true;
        node.owner = Some(owner);
    }

    /// Adds the list at `path`, whose items are read only when their string
    /// `member` is one of `values` (each with its owner's position, where
    /// known).
    pub fn add_keyed(
        &mut self,
        path: &FieldPath,
        member: &str,
        values: impl IntoIterator<Item = (String, Option<usize>)>,
    ) {
        self.node_at(path).keyed = Some(KeyedItems {
            member: member.to_owned(),
            values: values.into_iter().collect(),
        });
    }

    fn node_at(&mut self, path: &FieldPath) -> &mut PathTree {
        let mut node = self;
        for segment in path.segments() {
            node = node.children.entry(segment.clone()).or_default();
        }
        node
    }

    /// Where the whole value is read: its owner's position, where known.
    pub fn owner(&self) -> Option<usize> {
        self.owner
    }

    /// At a list read item by item: which items are read.
    pub fn keyed(&self) -> Option<&KeyedItems> {
        self.keyed.as_ref()
    }

    /// The tree of `paths`; a path below another one adds nothing.
    #[cfg(test)]
    pub fn of<'a>(paths: impl IntoIterator<Item = &'a FieldPath>) -> Self {
        let mut root = PathTree::default();
        for path in paths {
            let mut node = &mut root;
            for segment in path.segments() {
                node = node.children.entry(segment.clone()).or_default();
            }
            node.whole = true;
        }
        root
    }

    /// The subtree below `key`, when something below it is read.
    pub fn child(&self, key: &str) -> Option<&PathTree> {
        self.children.get(key)
    }

    /// True when the whole value at this node is read.
    pub fn is_whole(&self) -> bool {
        self.whole
    }
}

/// The `type` of a condition list item, if it has a string one.
pub fn condition_type(item: &Value) -> Option<&str> {
    item.get("type").and_then(Value::as_str)
}

/// Equality as ownership sees it: absent and `null` are the same at every
/// depth inside objects (a typed client that drops `null` members writes the
/// same value as one that sends them), numbers compare exactly, and arrays
/// compare item by item (`null` is a real item in a list).
///
/// Iterative, so a value nested as deep as the API server allows never
/// exhausts the stack.
pub fn same_value(a: Option<&Value>, b: Option<&Value>) -> bool {
    // Without containers on both sides there is nothing to walk: no allocation.
    match (a.filter(|v| !v.is_null()), b.filter(|v| !v.is_null())) {
        (None, None) => return true,
        (Some(Value::Object(_)), Some(Value::Object(_))) | (Some(Value::Array(_)), Some(Value::Array(_))) => {}
        (a, b) => return a == b,
    }
    let mut pending: Vec<(Option<&Value>, Option<&Value>)> = vec![(a, b)];
    while let Some((a, b)) = pending.pop() {
        let (a, b) = (a.filter(|v| !v.is_null()), b.filter(|v| !v.is_null()));
        match (a, b) {
            (None, None) => {}
            (Some(Value::Object(a)), Some(Value::Object(b))) => {
                for (key, value) in a {
                    pending.push((Some(value), b.get(key)));
                }
                for (key, value) in b {
                    if !a.contains_key(key) && !value.is_null() {
                        return false;
                    }
                }
            }
            (Some(Value::Array(a)), Some(Value::Array(b))) => {
                if a.len() != b.len() {
                    return false;
                }
                // Inside a list `null` is an item, not an absence.
                for (x, y) in a.iter().zip(b) {
                    if x.is_null() != y.is_null() {
                        return false;
                    }
                    pending.push((Some(x), Some(y)));
                }
            }
            (Some(Value::Object(_) | Value::Array(_)), _) | (_, Some(Value::Object(_) | Value::Array(_))) => {
                return false;
            }
            (a, b) => {
                if a != b {
                    return false;
                }
            }
        }
    }
    true
}

/// Appends to `out` the canonical form of `value`: two values are
/// [`same_value`] exactly when their canonical forms are the same bytes.
/// Comparing lists of values as multisets is then a sort of their forms,
/// `n log n` in the list and linear in its bytes, where comparing item
/// against item would be quadratic.
///
/// The form keeps `same_value`'s rules: an object's `null` members are left
/// out (absent and `null` are the same) and the others written in key order
/// (member order never matters); a list keeps its order and its `null`
/// items; a number keeps its kind (an unsigned or a negative integer, or a
/// float, `-0.0` written as `0.0` since the two are equal), as serde_json
/// compares numbers: `1` is not `1.0`. Every string and container carries
/// its length, so that no form is the start of another. Iterative, like
/// `same_value`.
pub(crate) fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    enum Next<'v> {
        Value(&'v Value),
        Key(&'v str),
    }
    fn length(out: &mut Vec<u8>, n: usize) {
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    let mut pending = vec![Next::Value(value)];
    while let Some(next) = pending.pop() {
        let value = match next {
            Next::Key(key) => {
                length(out, key.len());
                out.extend_from_slice(key.as_bytes());
                continue;
            }
            Next::Value(value) => value,
        };
        match value {
            Value::Null => out.push(b'n'),
            Value::Bool(b) => out.push(if *b { b't' } else { b'f' }),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    out.push(b'u');
                    out.extend_from_slice(&u.to_be_bytes());
                } else if let Some(i) = n.as_i64() {
                    out.push(b'i');
                    out.extend_from_slice(&i.to_be_bytes());
                } else {
                    let f = n.as_f64().unwrap_or_default();
                    let f = if f == 0.0 { 0.0 } else { f };
                    out.push(b'd');
                    out.extend_from_slice(&f.to_bits().to_be_bytes());
                }
            }
            Value::String(s) => {
                out.push(b's');
                length(out, s.len());
                out.extend_from_slice(s.as_bytes());
            }
            Value::Array(items) => {
                out.push(b'[');
                length(out, items.len());
                pending.extend(items.iter().rev().map(Next::Value));
            }
            Value::Object(map) => {
                let mut members: Vec<(&str, &Value)> = map
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.as_str(), v))
                    .collect();
                // Already in key order unless serde_json keeps insertion order.
                members.sort_unstable_by(|a, b| a.0.cmp(b.0));
                out.push(b'{');
                length(out, members.len());
                for (key, value) in members.into_iter().rev() {
                    pending.push(Next::Value(value));
                    pending.push(Next::Key(key));
                }
            }
        }
    }
}

/// Drops a value without recursion: serde_json's own `Drop` recurses once
/// per level, and a value may be nested as deep as the API server allows.
pub fn drop_iteratively(value: Value) {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => pending.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{json_value, with_null_members};
    use serde_json::json;

    fn p(text: &str) -> FieldPath {
        FieldPath::parse(text).unwrap()
    }

    #[test]
    fn parses_dot_paths_and_rejects_empty_segments() {
        assert_eq!(p("a.b").segments(), ["a", "b"]);
        assert_eq!(p("a/b~c").segments(), ["a/b~c"]);
        assert_eq!(FieldPath::parse(""), Err(PathError::Empty));
        for bad in [".a", "a.", "a..b", "."] {
            assert!(
                matches!(FieldPath::parse(bad), Err(PathError::EmptySegment(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn pointers_escape_slash_and_tilde() {
        assert_eq!(p("a/b.c~d").status_pointer().as_str(), "/status/a~1b/c~0d");
    }

    #[test]
    fn overlap_is_prefix_by_segment_not_by_text() {
        assert!(p("a.b").is_within(&p("a")));
        assert!(p("a").overlaps(&p("a.b")));
        assert!(!p("ab").overlaps(&p("a")));
        assert!(!p("a.c").overlaps(&p("a.b")));
    }

    #[test]
    fn get_treats_null_and_non_object_parents_as_absent() {
        let status = json!({"a": {"b": 1, "n": null}, "s": "x"});
        assert_eq!(p("a.b").get(Some(&status)), Some(&json!(1)));
        assert_eq!(p("a.n").get(Some(&status)), None);
        assert_eq!(p("s.x").get(Some(&status)), None);
        assert_eq!(p("a.b").get(None), None);
    }

    #[test]
    fn parents_and_the_add_that_creates_them() {
        let root = json!({"status": {"a": {"b": 1}, "s": "x", "n": null}});
        assert_eq!(p("a.b").parents_in(&root), Parents::Objects);
        assert_eq!(p("a.c.d").parents_in(&root), Parents::MissingAt(2));
        assert_eq!(p("s.x").parents_in(&root), Parents::NonObjectAt(1));
        assert_eq!(p("n.x").parents_in(&root), Parents::MissingAt(1));
        assert_eq!(p("x").parents_in(&json!({})), Parents::MissingAt(0));
        let add = p("a.c.d").add_operation(&root, json!(5));
        assert_eq!(add.path.as_str(), "/status/a/c");
        assert_eq!(add.value, json!({"d": 5}));
        let add = p("s.x").add_operation(&root, json!(5));
        assert_eq!((add.path.as_str(), add.value), ("/status/s", json!({"x": 5})));
        let add = p("a.b").add_operation(&root, json!(2));
        assert_eq!((add.path.as_str(), add.value), ("/status/a/b", json!(2)));
    }

    #[test]
    fn set_in_makes_object_parents_like_a_merge_patch() {
        let mut root = json!({"status": {"s": "x"}});
        p("s.y.z").set_in(&mut root, json!(1));
        assert_eq!(root, json!({"status": {"s": {"y": {"z": 1}}}}));
        let mut root = Value::Null;
        p("a").set_in(&mut root, json!(2));
        assert_eq!(root, json!({"status": {"a": 2}}));
    }

    #[test]
    fn absent_and_null_are_the_same_at_every_depth_but_not_in_lists() {
        let same = |a: Value, b: Value| same_value(Some(&a), Some(&b));
        assert!(same(json!({"a": null}), json!({})));
        assert!(same(json!({"a": {"b": null, "c": 1}}), json!({"a": {"c": 1}})));
        assert!(!same(json!(null), json!({})));
        assert!(same_value(None, Some(&Value::Null)));
        assert!(!same(json!({"a": {"b": 1}}), json!({"a": {}})));
        assert!(!same(json!([null]), json!([])));
        assert!(!same(json!([null]), json!([{}])));
        assert!(same(json!([{"a": null}]), json!([{}])));
        assert!(!same(json!(1), json!(1.0)));
        assert!(!same(json!([1, 2]), json!([2, 1])));
    }

    fn canonical(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        write_canonical(value, &mut out);
        out
    }

    #[test]
    fn canonical_forms_are_the_same_exactly_where_values_are() {
        let same = |a: Value, b: Value| canonical(&a) == canonical(&b);
        assert!(same(json!({"a": null, "b": {"c": null}}), json!({"b": {}})));
        assert!(!same(json!({"b": {}}), json!({})));
        assert!(!same(json!([null]), json!([])));
        assert!(!same(json!(null), json!({})));
        assert!(same(json!(-0.0), json!(0.0)));
        assert!(!same(json!(0), json!(0.0)));
        assert!(!same(json!(1), json!(1.0)));
        assert!(!same(json!(u64::MAX), json!(u64::MAX as f64)));
        assert!(!same(json!(-1), json!(-1.0)));
        assert!(!same(json!({"ab": "c"}), json!({"a": "bc"})));
        assert!(!same(json!(["ab", "c"]), json!(["a", "bc"])));
        assert!(!same(json!([[1], []]), json!([[], [1]])));
        // The number rules are serde_json's without `arbitrary_precision`,
        // where "1.0" and "1.00" are the same number: a build that turned
        // that feature on must revisit `write_canonical`.
        let parsed = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        assert_eq!(parsed("1.0"), parsed("1.00"));
        assert!(same(parsed("1.0"), parsed("1.00")));
        assert!(same(parsed("-0"), parsed("0.0")));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        #[test]
        fn canonical_forms_agree_with_same_value(a in json_value(), b in json_value()) {
            proptest::prop_assert_eq!(canonical(&a) == canonical(&b), same_value(Some(&a), Some(&b)));
            // And the equal pairs, which two random values seldom are.
            let nulled = with_null_members(&a);
            proptest::prop_assert!(same_value(Some(&a), Some(&nulled)));
            proptest::prop_assert_eq!(canonical(&a), canonical(&nulled));
        }
    }

    #[test]
    fn deep_values_compare_and_drop_without_recursion() {
        let mut deep = json!(1);
        let mut other = json!(2);
        // Built by moving, never through `json!` (which would serialize
        // the inner value recursively).
        let wrap = |inner: Value| Value::Object(Map::from_iter([("a".to_owned(), inner)]));
        for _ in 0..200_000 {
            deep = wrap(deep);
            other = wrap(other);
        }
        assert!(!same_value(Some(&deep), Some(&other)));
        drop_iteratively(deep);
        drop_iteratively(other);
    }
}
