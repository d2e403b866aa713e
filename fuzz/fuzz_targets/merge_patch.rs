//! The library's merge patch, checked against an RFC 7386 merge applied to
//! the stored object: owned fields end as staged (absent and null alike),
//! owned condition types as staged (in any order: the stored order is
//! kept), everything else as stored.
#![no_main]

#[path = "../common/mod.rs"]
mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use statusguard::flush::{Owned, status_merge_patch};
use statusguard::ownership::{FieldPath, Parents, condition_type, same_value};

const PATHS: [&str; 6] = [
    "observedGeneration",
    "summary",
    "summary.x",
    "scale.lastScaleTime",
    "free.ready.x",
    "notes",
];

fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let mut fields = Vec::new();
    for path in PATHS {
        if u.arbitrary()? {
            fields.push(FieldPath::parse(path).expect("a valid path"));
        }
    }
    let types: Vec<&str> = ["Ready", "Scaled"]
        .into_iter()
        .filter(|_| u.arbitrary().unwrap_or(false))
        .collect();
    let owned = Owned::new(fields, types.iter().copied());
    let conditions = FieldPath::parse("conditions").expect("a valid path");
    let staged = json!({"metadata": {"resourceVersion": "1"}, "status": common::status(u)?});
    let stored = json!({"metadata": {"resourceVersion": "2"}, "status": common::status(u)?, "spec": {"size": 1}});
    // The flush refuses staged values below a non-object before any write.
    if owned
        .fields()
        .iter()
        .any(|p| matches!(p.parents_in(&staged), Parents::NonObjectAt(_)))
    {
        return Ok(());
    }
    let patch = status_merge_patch(&owned, &conditions, &staged, &stored, "9");
    let mut merged = stored.clone();
    json_patch::merge(&mut merged, &patch);

    assert_eq!(merged["metadata"]["resourceVersion"], "9");
    assert_eq!(merged["spec"], stored["spec"]);
    for path in owned.fields() {
        assert!(
            same_value(path.get(merged.get("status")), path.get(staged.get("status"))),
            "{path}: merged {merged} staged {staged}"
        );
    }
    // A top-level key that no owned path and not the conditions touch is as stored.
    if let Some(stored_map) = stored["status"].as_object() {
        for (key, value) in stored_map {
            let touched = key == "conditions" || owned.fields().iter().any(|p| p.segments()[0] == *key);
            if !touched {
                assert_eq!(merged["status"].get(key), Some(value), "{key}");
            }
        }
    }
    // Conditions: untouched without a staged list; else owned types as staged, others as stored.
    let list = |v: &Value| v["status"].get("conditions").and_then(Value::as_array).cloned();
    match list(&staged) {
        None if stored["status"].is_object() => assert_eq!(list(&merged), list(&stored)),
        None => {}
        Some(staged_list) => {
            let merged_list = list(&merged).unwrap_or_default();
            let of = |l: &[Value], owned_types: bool| -> Vec<Value> {
                l.iter()
                    .filter(|c| condition_type(c).is_some_and(|t| types.contains(&t)) == owned_types)
                    .cloned()
                    .collect()
            };
            // Both as multisets: the flush keeps the stored order (a new
            // owned item at the end), so only what is there is compared.
            let key = |c: &Value| c.to_string();
            let sorted = |mut items: Vec<Value>| {
                items.sort_by_key(key);
                items
            };
            assert_eq!(sorted(of(&merged_list, true)), sorted(of(&staged_list, true)));
            let others_stored = of(&list(&stored).unwrap_or_default(), false);
            assert_eq!(sorted(of(&merged_list, false)), sorted(others_stored));
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});
