//! JSON values built under a memory budget.
//!
//! Text is cheap next to the `serde_json::Value` built from it: an object
//! of one member, `{"a":1}` (7 bytes), is a B-tree node of about 640 bytes.
//! A review of a few MiB whose owned values are such objects would need
//! hundreds of MiB to compare. Every value the request path and the
//! observer build from a review's text is therefore built through
//! [`Budgeted`], which estimates what each node costs as it builds it and
//! stops, with [`BudgetExceeded`], once a review's budget is spent. The
//! estimate is deliberately on the high side of what the allocator is asked
//! for, so that the budget is a bound, not a hope.
//!
//! The budget is the calling thread's, for the extent of a [`ValueBudget::enter`]
//! guard: a decision enters one for its review, and every value it builds
//! below (projection, condition items, on a grown stack too) spends from it
//! without each reader having to carry it. Outside a guard nothing is counted.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// What the values of one review may cost, in estimated bytes: enough for
/// every status the API server can store (1.5 MiB of ordinary JSON costs
/// a few tens of MiB as values at the very worst), and a bound on what the
/// decision threads hold at once.
pub const REVIEW_VALUE_BUDGET: usize = 32 * 1024 * 1024;

/// An object node: serde_json's map is a `BTreeMap<String, Value>`, whose
/// leaf holds eleven keys and values whether it has one or eleven.
const OBJECT_NODE: usize = 640;
/// Each member beyond a node's first: its share of further nodes.
const OBJECT_MEMBER: usize = 64;
/// Each array element: a 32-byte `Value`, doubled for the vector's growth.
const ARRAY_ELEMENT: usize = 64;
/// Each heap allocation's own overhead (a string, a vector).
const ALLOCATION: usize = 16;

thread_local! {
    /// The bytes left to this thread's values; `None`: not counted.
    static LEFT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// While alive, the values this thread builds spend from a budget; the
/// budget before it is put back when it is dropped.
#[derive(Debug)]
#[must_use = "the budget holds only while the guard lives"]
pub struct ValueBudget {
    outer: Option<usize>,
}

impl ValueBudget {
    /// Gives this thread's values `bytes` until the guard is dropped.
    pub fn enter(bytes: usize) -> Self {
        Self {
            outer: LEFT.replace(Some(bytes)),
        }
    }

    /// What is left of this thread's budget (`None`: nothing is counted).
    pub(crate) fn left() -> Option<usize> {
        LEFT.get()
    }

    /// Spends `bytes`, or says that there are not that many left (for
    /// what a reader holds besides values: captured text's slots).
    pub(crate) fn spend<E: serde::de::Error>(bytes: usize) -> Result<(), E> {
        LEFT.with(|left| match left.get() {
            None => Ok(()),
            Some(available) => match available.checked_sub(bytes) {
                Some(rest) => {
                    left.set(Some(rest));
                    Ok(())
                }
                None => {
                    left.set(Some(0));
                    Err(E::custom(BudgetExceeded))
                }
            },
        })
    }
}

impl Drop for ValueBudget {
    fn drop(&mut self) {
        LEFT.set(self.outer);
    }
}

/// The error a budgeted parse stops with; [`is_budget_exceeded`] finds it in
/// a serde_json error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetExceeded;

const BUDGET_EXCEEDED: &str = "the values of this review would need more memory than statusguard gives one review";

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(BUDGET_EXCEEDED)
    }
}

impl std::error::Error for BudgetExceeded {}

/// Whether a serde_json error is a budgeted parse that ran out.
pub fn is_budget_exceeded(error: &serde_json::Error) -> bool {
    error.to_string().starts_with(BUDGET_EXCEEDED)
}

/// Builds a [`Value`] as `Value::deserialize` does, spending from this
/// thread's budget.
pub fn build<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    Budgeted.deserialize(deserializer)
}

#[derive(Debug, Clone, Copy)]
struct Budgeted;

impl<'de> DeserializeSeed<'de> for Budgeted {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Budgeted {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // As serde_json: a float that is not finite becomes null.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        ValueBudget::spend::<E>(v.len() + ALLOCATION)?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        ValueBudget::spend::<E>(v.len() + ALLOCATION)?;
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        ValueBudget::spend::<A::Error>(ALLOCATION)?;
        let mut items = Vec::new();
        while let Some(item) = {
            ValueBudget::spend::<A::Error>(ARRAY_ELEMENT)?;
            seq.next_element_seed(self)?
        } {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        ValueBudget::spend::<A::Error>(OBJECT_NODE)?;
        let mut members = Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            ValueBudget::spend::<A::Error>(OBJECT_MEMBER + key.len() + ALLOCATION)?;
            let value = map.next_value_seed(self)?;
            // The last of duplicate keys wins, as in Go and serde_json.
            members.insert(key.into_owned(), value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(text: &str, bytes: usize) -> Result<Value, serde_json::Error> {
        let _budget = ValueBudget::enter(bytes);
        let mut deserializer = serde_json::Deserializer::from_str(text);
        super::build(&mut deserializer)
    }

    #[test]
    fn a_budgeted_value_is_the_value_serde_json_builds() {
        let text = r#"{"a": [1, -2, 3.5, "s\u00e9", null, true, {"b": {}}], "a": "last", "c": 18446744073709551615}"#;
        let expected: Value = serde_json::from_str(text).unwrap();
        assert_eq!(build(text, usize::MAX).unwrap(), expected);
        assert_eq!(build("[]", usize::MAX).unwrap(), json!([]));
    }

    #[test]
    fn many_small_objects_run_out_of_budget() {
        let text = format!("[{}]", vec![r#"{"a":1}"#; 10_000].join(","));
        // 70 KB of text would be over 6 MB of values.
        let err = build(&text, 4 * 1024 * 1024).unwrap_err();
        assert!(is_budget_exceeded(&err), "{err}");
        assert!(build(&text, 8 * 1024 * 1024).is_ok());
    }

    #[test]
    fn a_guard_puts_the_outer_budget_back_and_none_counts_nothing() {
        let text = format!("[{}]", vec![r#"{"a":1}"#; 1000].join(","));
        let parse = || super::build(&mut serde_json::Deserializer::from_str(&text));
        assert!(parse().is_ok(), "outside a guard nothing is counted");
        let _outer = ValueBudget::enter(10);
        assert!(parse().is_err());
        {
            let _inner = ValueBudget::enter(usize::MAX);
            assert!(parse().is_ok());
        }
        assert!(parse().is_err(), "the outer budget is back, spent");
    }

    #[test]
    fn the_estimate_grows_with_what_is_built() {
        let long = format!("\"{}\"", "x".repeat(1000));
        assert!(build(&long, 1000).is_err());
        assert!(build(&long, 1016).is_ok());
    }
}
