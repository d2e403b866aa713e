//! Fingerprints: a 64-bit hash of a JSON value under [`same_value`]'s
//! equality, read from its text without building it.
//!
//! Equal values (absent and `null` members alike, members in any order,
//! numbers by value, strings after unescaping) always have equal
//! fingerprints, so two fingerprints that differ prove that the values
//! differ. Equal fingerprints prove nothing: a collision only sends the
//! items to be built and compared, as they would be without fingerprints.
//! The decision of a write that rolls back another writer's items (issue 25:
//! a Gateway route's stale retry, the issue-12 fixture's) is then made on
//! one scan of each changed item, where building and comparing them cost
//! several times that.
//!
//! Most rolled-back items differ in one small place (an
//! `observedGeneration`, a transition time). Before fingerprinting items
//! whole, [`first_difference`] finds where the first changed pair first
//! differs, and [`at_path`] fingerprints every item of the group there
//! only: the value at one path is a function of the item's value too, so
//! different multisets of it also prove the items changed, for a scan of
//! each item up to that place.
//!
//! Nothing is built and nothing is allocated but a path's steps: nothing
//! is spent of the review's budget. Every item is read a bounded number of
//! times (a path is at most [`MAX_STEPS`] deep).
//!
//! [`same_value`]: crate::ownership::same_value

use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasher;

use foldhash::fast::FixedState;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

use super::cursor::{Cursor, Unread};
use super::project::ItemMembers;

/// A value's fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    /// The hash; meaningful only where `sure`.
    pub(crate) hash: u64,
    /// `false` where an object below it has a key written twice: a parse
    /// keeps the last, which the hash of its members does not follow.
    pub(crate) sure: bool,
    /// The value is `null` (or a number a parse turns into `null`): as a
    /// member, the same as absent.
    is_null: bool,
}

/// One seed for every hash: fingerprints are compared within a process only.
const STATE: FixedState = FixedState::with_seed(0x5354_4154_5553_4755);

// Tags that keep values of different kinds apart.
const NULL: u64 = 1;
const TRUE: u64 = 2;
const FALSE: u64 = 3;
const POSITIVE: u64 = 4;
const NEGATIVE: u64 = 5;
const FLOAT: u64 = 6;
const STRING: u64 = 7;
const LIST: u64 = 8;
const OBJECT: u64 = 9;
// Where a path leads nowhere: through a value that is not an object, not
// a list, or past a list's end.
const NOT_AN_OBJECT: u64 = 10;
const NOT_A_LIST: u64 = 11;
const PAST_THE_END: u64 = 12;

fn mix(a: u64, b: u64) -> u64 {
    STATE.hash_one((a, b))
}

const NULL_VALUE: Fingerprint = Fingerprint {
    hash: NULL,
    sure: true,
    is_null: true,
};

fn scalar(hash: u64) -> Fingerprint {
    Fingerprint {
        hash,
        sure: true,
        is_null: false,
    }
}

/// Sums the members of an object, each `(key hash, value)`: the sum does
/// not depend on their order, and a `null` member counts as absent. Says
/// whether no key hash came twice (else a key may have been written twice).
struct Members {
    sum: u64,
    sure: bool,
    keys: SmallVec<[u64; IN_PLACE]>,
}

/// The key hashes an object's fingerprint keeps, in place (a condition has
/// about six keys). An object with more is unsure: nothing is allocated to
/// tell whether a key came twice, and it is built and compared instead.
const IN_PLACE: usize = 32;

impl Members {
    fn new() -> Self {
        Self {
            sum: 0,
            sure: true,
            keys: SmallVec::new(),
        }
    }

    fn add(&mut self, key: &str, value: Fingerprint) {
        let key = STATE.hash_one(key);
        if self.keys.len() < IN_PLACE {
            self.keys.push(key);
        } else {
            self.sure = false;
        }
        self.sure &= value.sure;
        if !value.is_null {
            self.sum = self.sum.wrapping_add(mix(key, value.hash));
        }
    }

    fn finish(mut self) -> Fingerprint {
        self.keys.sort_unstable();
        let once = self.keys.windows(2).all(|pair| pair[0] != pair[1]);
        Fingerprint {
            hash: mix(OBJECT, self.sum),
            sure: self.sure && once,
            is_null: false,
        }
    }
}

/// The fingerprint of the JSON text `text`. It is read within serde_json's
/// nesting limit: a deeper value is an error, and its items are built and
/// compared (on the stack sized for them) instead.
pub(crate) fn of_text(text: &str) -> Result<Fingerprint, serde_json::Error> {
    Printer.deserialize(&mut serde_json::Deserializer::from_str(text))
}

/// The fingerprint of an object given as its members' keys and text (an
/// item of a list read item by item), as the object built from them.
pub(crate) fn of_members<'m, 'de: 'm>(
    members: impl IntoIterator<Item = &'m (Cow<'de, str>, &'de str)>,
) -> Result<Fingerprint, serde_json::Error> {
    let mut object = Members::new();
    for (key, raw) in members {
        object.add(key, of_text(raw)?);
    }
    Ok(object.finish())
}

#[derive(Clone, Copy)]
struct Printer;

impl<'de> DeserializeSeed<'de> for Printer {
    type Value = Fingerprint;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Fingerprint, D::Error> {
        deserializer.deserialize_any(self)
    }
}

// Mirrors `value_budget::Budgeted`, which builds what `same_value` compares.
impl<'de> Visitor<'de> for Printer {
    type Value = Fingerprint;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Fingerprint, E> {
        Ok(NULL_VALUE)
    }

    fn visit_none<E>(self) -> Result<Fingerprint, E> {
        Ok(NULL_VALUE)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Fingerprint, E> {
        Ok(scalar(if v { TRUE } else { FALSE }))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Fingerprint, E> {
        // As `Number::from(i64)`: a non-negative one is a positive integer.
        Ok(match u64::try_from(v) {
            Ok(positive) => scalar(mix(POSITIVE, positive)),
            Err(_) => scalar(mix(NEGATIVE, v as u64)),
        })
    }

    fn visit_u64<E>(self, v: u64) -> Result<Fingerprint, E> {
        Ok(scalar(mix(POSITIVE, v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Fingerprint, E> {
        if !v.is_finite() {
            return Ok(NULL_VALUE);
        }
        // 0.0 and -0.0 are equal numbers.
        let bits = if v == 0.0 { 0 } else { v.to_bits() };
        Ok(scalar(mix(FLOAT, bits)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Fingerprint, E> {
        Ok(scalar(mix(STRING, STATE.hash_one(v))))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fingerprint, A::Error> {
        let (mut hash, mut sure, mut len) = (LIST, true, 0u64);
        while let Some(item) = seq.next_element_seed(self)? {
            hash = mix(hash, item.hash);
            sure &= item.sure;
            len += 1;
        }
        Ok(Fingerprint {
            hash: mix(hash, len),
            sure,
            is_null: false,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fingerprint, A::Error> {
        let mut object = Members::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let value = map.next_value_seed(self)?;
            object.add(&key, value);
        }
        Ok(object.finish())
    }
}

/// A step from a value into one it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step<'t> {
    /// The member of this key (unescaped) of an object.
    Member(Cow<'t, str>),
    /// The item at this index of a list.
    Index(usize),
}

/// Where two items, given as their members, first differ: the member whose
/// key or text first differs, then, inside its text, the innermost value
/// that holds the first byte that differs. `None` where they do not differ,
/// or where the members themselves differ (the items are then compared
/// whole). Any path will do for a proof (see [`at_path`]); this one is
/// where a rollback's difference usually is.
pub(crate) fn first_difference<'t>(a: &ItemMembers<'t>, b: &ItemMembers<'_>) -> Option<Vec<Step<'t>>> {
    let (key, a_text, b_text) = a
        .iter()
        .zip(b)
        .find(|((k, x), (l, y))| k != l || x != y)
        .filter(|((k, _), (l, _))| k == l)
        .map(|((k, x), (_, y))| (k.clone(), *x, *y))?;
    let differs_at = a_text.bytes().zip(b_text.bytes()).take_while(|(x, y)| x == y).count();
    let mut path = vec![Step::Member(key)];
    // Any error only stops the path short: a shorter path is as sound.
    let _ = path_to(&mut Cursor::new(a_text), differs_at, &mut path);
    Some(path)
}

/// The deepest a path goes below an item's member. Each step reads the
/// value it enters once more, so a path costs at most this many reads of
/// the member; a shorter path is as sound, only less often a proof.
pub(crate) const MAX_STEPS: usize = 8;

/// Extends `path` into the value at `cursor` as deep as a value's text
/// holds byte `offset` (of the text the cursor walks). Stops reading as
/// soon as it has passed that value.
fn path_to<'t>(cursor: &mut Cursor<'t>, offset: usize, path: &mut Vec<Step<'t>>) -> Result<(), Unread> {
    if path.len() > MAX_STEPS {
        return Ok(());
    }
    let into = |cursor: &mut Cursor<'t>, step: Step<'t>, path: &mut Vec<Step<'t>>| {
        let start = cursor.start();
        let text = cursor.skip()?;
        if (start..start + text.len()).contains(&offset) {
            path.push(step);
            path_to(&mut Cursor::new(text), offset - start, path)?;
            // Found: nothing after it is read.
            return Err(Unread);
        }
        Ok(())
    };
    match cursor.peek() {
        Some(b'{') => cursor.object(|cursor, key| into(cursor, Step::Member(key), path)),
        Some(b'[') => cursor.list(|cursor, index| into(cursor, Step::Index(index), path)),
        _ => Ok(()),
    }
}

/// The fingerprint of an item's value at `path` (see [`first_difference`]):
/// a function of the item's value, as its fingerprint is (absent and `null`
/// alike, a path through anything but an object or a list, or past a
/// list's end, a constant of its own). `None` where unsure: a key on the
/// path written twice, or a value too deep to read here.
pub(crate) fn at_path(item: &ItemMembers<'_>, path: &[Step<'_>]) -> Option<u64> {
    let Some((Step::Member(first), rest)) = path.split_first() else {
        return of_members(item).ok().filter(|p| p.sure).map(|p| p.hash);
    };
    let mut found = item.iter().filter(|(key, _)| key == first);
    match (found.next(), found.next()) {
        (None, _) => Some(at_null(rest)),
        (Some((_, raw)), None) => {
            let mut probe = None;
            let _ = probe_at(&mut Cursor::new(raw), rest, false, &mut probe);
            probe
        }
        (Some(_), Some(_)) => None,
    }
}

/// What a path leads to through `null` (or an absent member).
fn at_null(rest: &[Step<'_>]) -> u64 {
    match rest.first() {
        None => NULL,
        Some(Step::Member(_)) => NOT_AN_OBJECT,
        Some(Step::Index(_)) => NOT_A_LIST,
    }
}

/// Sets `probe` to the fingerprint at `path` of the value at `cursor`
/// (`None`: unsure). With `whole`, the value is read to its end (an object
/// above it is read on, for its keys); otherwise reading may stop once
/// `probe` is set (with an `Err`).
fn probe_at(cursor: &mut Cursor<'_>, path: &[Step<'_>], whole: bool, probe: &mut Option<u64>) -> Result<(), Unread> {
    let Some((step, rest)) = path.split_first() else {
        let (print, _) = cursor.value(Printer)?;
        *probe = print.sure.then_some(print.hash);
        return Ok(());
    };
    match (step, cursor.peek()) {
        (Step::Member(wanted), Some(b'{')) => {
            let mut seen = false;
            // Every key is read: a key written twice leaves it unsure, as
            // does anything that stops the reading.
            let read = cursor.object(|cursor, key| {
                if key != *wanted {
                    return cursor.skip().map(drop);
                }
                if std::mem::replace(&mut seen, true) {
                    return Err(Unread);
                }
                probe_at(cursor, rest, true, probe)
            });
            match (read, seen) {
                (Err(unread), _) => {
                    *probe = None;
                    return Err(unread);
                }
                (Ok(()), true) => {}
                (Ok(()), false) => *probe = Some(at_null(rest)),
            }
            Ok(())
        }
        (Step::Index(wanted), Some(b'[')) => {
            let mut seen = false;
            // Not read whole, the list is left once its item is read: the
            // `Err` stops the reading, with `probe` set.
            let read = cursor.list(|cursor, index| {
                if index != *wanted {
                    return cursor.skip().map(drop);
                }
                seen = true;
                probe_at(cursor, rest, whole, probe)?;
                if whole { Ok(()) } else { Err(Unread) }
            });
            if whole && read.is_err() {
                *probe = None;
            }
            read?;
            if !seen {
                *probe = Some(PAST_THE_END);
            }
            Ok(())
        }
        (step, first) => {
            cursor.skip()?;
            *probe = Some(match (step, first) {
                (_, Some(b'n')) => at_null(path),
                (Step::Member(_), _) => NOT_AN_OBJECT,
                (Step::Index(_), _) => NOT_A_LIST,
            });
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::same_value;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn print(text: &str) -> Fingerprint {
        of_text(text).unwrap()
    }

    #[test]
    fn texts_of_equal_values_have_equal_fingerprints() {
        for (a, b) in [
            (r#"{"a":1,"b":[1,null,"x"]}"#, r#"{ "b" : [1, null, "x"], "a" : 1 }"#),
            (r#"{"a":1,"gone":null}"#, r#"{"a":1}"#),
            (r#"{"a":{"b":null}}"#, r#"{"a":{}}"#),
            (r#""A\n""#, r#""\u0041\u000a""#),
            ("1.0", "1.00"),
            ("100.0", "1e2"),
            ("0.0", "-0.0"),
            ("-0", "0.0"),
        ] {
            let read = |t: &str| serde_json::from_str::<Value>(t).unwrap();
            assert!(same_value(Some(&read(a)), Some(&read(b))), "{a} {b}");
            let (x, y) = (print(a), print(b));
            assert!(x.sure && y.sure, "{a} {b}");
            assert_eq!(x.hash, y.hash, "{a} and {b} are equal values");
        }
    }

    #[test]
    fn values_that_differ_get_different_fingerprints() {
        let texts = [
            "null",
            "true",
            "false",
            "0",
            "1",
            "-1",
            "1.0",
            "0.5",
            r#""1""#,
            r#""""#,
            "[]",
            "[null]",
            "[1,2]",
            "[2,1]",
            "{}",
            r#"{"a":1}"#,
            r#"{"a":2}"#,
            r#"{"b":1}"#,
            r#"{"a":[]}"#,
            r#"{"a":{}}"#,
            r#"[{}]"#,
            r#"[[]]"#,
        ];
        for (i, a) in texts.iter().enumerate() {
            for b in &texts[i + 1..] {
                assert_ne!(print(a).hash, print(b).hash, "{a} and {b}");
            }
        }
    }

    #[test]
    fn a_key_written_twice_leaves_the_fingerprint_unsure() {
        assert!(!print(r#"{"a":1,"a":2}"#).sure);
        assert!(!print(r#"[{"x":{"a":null,"a":2}}]"#).sure);
        assert!(print(r#"{"a":{"a":1},"b":{"a":1}}"#).sure);
    }

    /// An item's members, each value in its own text.
    fn members(texts: &[(&'static str, String)]) -> Vec<(Cow<'static, str>, String)> {
        texts.iter().map(|(k, t)| (Cow::Borrowed(*k), t.clone())).collect()
    }

    fn borrowed<'a>(members: &'a [(Cow<'static, str>, String)]) -> ItemMembers<'a> {
        members.iter().map(|(k, v)| (k.clone(), v.as_str())).collect()
    }

    #[test]
    fn the_first_difference_is_the_innermost_value_that_holds_it() {
        let conditions = |generation: u32| {
            format!(r#"[{{"type": "A", "observedGeneration": {generation}, "x": [1, 2]}}, {{"type": "B"}}]"#)
        };
        let old = members(&[("name", r#""gw""#.to_owned()), ("conditions", conditions(2))]);
        let new = members(&[("name", r#""gw""#.to_owned()), ("conditions", conditions(3))]);
        let (old, new) = (borrowed(&old), borrowed(&new));
        let path = first_difference(&old, &new).unwrap();
        assert_eq!(
            path,
            [
                Step::Member("conditions".into()),
                Step::Index(0),
                Step::Member("observedGeneration".into())
            ]
        );
        assert_ne!(at_path(&old, &path), at_path(&new, &path));
        assert_eq!(at_path(&old, &path), Some(mix(POSITIVE, 2)));
        assert_eq!(first_difference(&old, &old), None);
        // Members in another order: compared whole.
        let swapped = members(&[("conditions", conditions(2)), ("name", r#""gw""#.to_owned())]);
        assert_eq!(first_difference(&old, &borrowed(&swapped)), None);
    }

    #[test]
    fn a_path_leads_to_the_same_place_in_every_text_of_a_value() {
        let path = [Step::Member("c".into()), Step::Index(1), Step::Member("g".into())];
        let probe = |texts: &[(&'static str, &str)]| {
            let owned: Vec<_> = texts.iter().map(|(k, t)| (*k, (*t).to_owned())).collect();
            at_path(&borrowed(&members(&owned)), &path)
        };
        let two = probe(&[("c", r#"[0, {"g": 2, "h": 1}]"#)]);
        assert!(two.is_some());
        assert_eq!(two, probe(&[("c", r#"[ 0 , { "h" : 1 , "g" : 2 } ]"#)]));
        assert_ne!(
            two,
            probe(&[("c", r#"[0, {"g": 2.0}]"#)]),
            "2 and 2.0 are different numbers"
        );
        assert_eq!(
            probe(&[("c", r#"[0, {"g": 2.5}]"#)]),
            probe(&[("c", r#"[0, {"g": 25e-1}]"#)])
        );
        assert_eq!(two, probe(&[("z", "null"), ("c", r#"[0, {"h": 1, "g": 2}, 9]"#)]));
        // Absent and null alike; a key written twice on the path is unsure.
        assert_eq!(probe(&[("c", r#"[0, {"g": null}]"#)]), probe(&[("c", "[0, {}]")]));
        assert_eq!(probe(&[("c", r#"[0, {"g": 1, "g": 2}]"#)]), None);
        assert_eq!(probe(&[("c", "[0, 1]"), ("c", "[0, 1]")]), None);
        // Nowhere to go: constants of their own.
        assert_eq!(probe(&[("c", "[0]")]), Some(PAST_THE_END));
        assert_eq!(probe(&[("c", "[0, 7]")]), Some(NOT_AN_OBJECT));
        assert_eq!(probe(&[("c", "{}")]), Some(NOT_A_LIST));
        assert_eq!(probe(&[]), Some(NOT_A_LIST));
        assert_eq!(probe(&[("c", "null")]), Some(NOT_A_LIST));
    }

    #[test]
    fn an_object_of_more_keys_than_kept_in_place_is_unsure() {
        let object = |keys: usize| {
            let members: Vec<String> = (0..keys).map(|k| format!(r#""k{k}":{k}"#)).collect();
            format!("{{{}}}", members.join(","))
        };
        assert!(print(&object(IN_PLACE)).sure);
        assert!(!print(&object(IN_PLACE + 1)).sure);
    }

    #[test]
    fn a_path_goes_at_most_max_steps_deep_and_still_proves() {
        let nested = |leaf: u32| format!("{}{leaf}{}", "[".repeat(20), "]".repeat(20));
        let old = members(&[("m", nested(1))]);
        let new = members(&[("m", nested(2))]);
        let (old, new) = (borrowed(&old), borrowed(&new));
        let path = first_difference(&old, &new).unwrap();
        assert_eq!(path.len(), 1 + MAX_STEPS);
        assert_ne!(at_path(&old, &path), at_path(&new, &path));
    }

    #[test]
    fn a_value_deeper_than_serde_jsons_limit_is_an_error() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(of_text(&deep).is_err());
    }

    #[test]
    fn an_item_is_fingerprinted_as_the_object_of_its_members() {
        let members = [
            (Cow::Borrowed("b"), r#"{"x":[true]}"#),
            (Cow::Borrowed("a"), "1"),
            (Cow::Borrowed("c"), "null"),
        ];
        let item = of_members(&members).unwrap();
        let whole = print(r#"{"a":1,"b":{"x":[true]}}"#);
        assert_eq!(item.hash, whole.hash);
        let twice = [(Cow::Borrowed("a"), "1"), (Cow::Borrowed("a"), r#"{"x":[true]}"#)];
        assert!(!of_members(&twice).unwrap().sure);
    }

    /// JSON values of every kind, shallow enough to shrink well.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-c\"\\\\é]{0,3}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c]{1,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Another text of a value that `same_value` finds equal to it: members
    /// reversed, `null` members dropped or added, strings escaped.
    fn other_text(value: &Value, salt: bool) -> String {
        match value {
            Value::Object(members) => {
                let mut parts: Vec<String> = members
                    .iter()
                    .filter(|(_, v)| !(salt && v.is_null()))
                    .map(|(k, v)| format!("{}:{}", json!(k), other_text(v, !salt)))
                    .collect();
                parts.reverse();
                if !salt {
                    parts.push(r#""added":null"#.to_owned());
                }
                format!("{{{}}}", parts.join(","))
            }
            Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(|v| other_text(v, !salt)).collect();
                format!("[ {} ]", parts.join(" , "))
            }
            Value::String(s) => {
                let escaped: String = s.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
                format!("\"{escaped}\"")
            }
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn equal_values_have_equal_fingerprints(value in json_value(), salt in any::<bool>()) {
            let (text, other) = (value.to_string(), other_text(&value, salt));
            // Each text as a parse reads it (serde_json may read a float's
            // shortest text one unit off: both readers read it alike).
            let (read, other_read): (Value, Value) =
                (serde_json::from_str(&text).unwrap(), serde_json::from_str(&other).unwrap());
            prop_assert!(same_value(Some(&read), Some(&other_read)), "{} and {}", text, other);
            let (a, b) = (print(&text), print(&other));
            prop_assert!(a.sure && b.sure);
            prop_assert_eq!(a.hash, b.hash, "{} and {}", text, other);
        }

        /// Whatever the path, the values there are a function of the
        /// item's value: equal items in other text give equal probes.
        #[test]
        fn equal_items_lead_to_equal_values_at_any_path(
            item in prop::collection::btree_map("[a-c]{1,2}", json_value(), 0..4),
            salt in any::<bool>(),
            steps in prop::collection::vec(prop_oneof![
                "[a-c]{1,2}".prop_map(|k| Step::Member(Cow::Owned(k))),
                (0usize..3).prop_map(Step::Index),
            ], 1..4),
        ) {
            // The path starts at one of the item's members.
            let mut path = vec![Step::Member(Cow::Owned(
                item.keys().next().cloned().unwrap_or_else(|| "a".to_owned()),
            ))];
            path.extend(steps);
            let texts = |salt: bool| -> Vec<(Cow<'static, str>, String)> {
                let mut texts: Vec<_> = item
                    .iter()
                    .filter(|(_, v)| !(salt && v.is_null()))
                    .map(|(k, v)| (Cow::Owned(k.clone()), other_text(v, salt)))
                    .collect();
                if salt {
                    texts.reverse();
                }
                texts
            };
            let (plain, other) = (texts(false), texts(!salt));
            let probes = [borrowed(&plain), borrowed(&other)].map(|m| at_path(&m, &path));
            prop_assert!(probes[0].is_some());
            prop_assert_eq!(probes[0], probes[1]);
        }

        #[test]
        fn different_fingerprints_are_different_values(a in json_value(), b in json_value()) {
            let (a, b) = (a.to_string(), b.to_string());
            let read = |t: &str| serde_json::from_str::<Value>(t).unwrap();
            if print(&a).hash != print(&b).hash {
                prop_assert!(!same_value(Some(&read(&a)), Some(&read(&b))), "{} and {}", a, b);
            }
        }
    }
}
