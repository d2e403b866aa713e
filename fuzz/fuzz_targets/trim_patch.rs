//! For any stale write of any writer: the trim patch, applied to `object`,
//! leaves no violation, and keeps the writer's own and unowned changes.
#![no_main]

#[path = "../common/mod.rs"]
mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use statusguard::admission::answer::decide_request;
use statusguard::admission::decide::{Endpoint, Outcome, decide};
use statusguard::admission::wire::parse_request;
use statusguard::ownership::condition_type;
use std::sync::LazyLock;

static TRIM: LazyLock<statusguard::ownership::Ownership> = LazyLock::new(|| common::rules("trim"));

fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let writer = common::WRITERS[u.int_in_range(0..=common::WRITERS.len() - 1)?];
    let old = common::status(u)?;
    let other = common::status(u)?;
    let new = common::written_after(u, &old, other)?;
    let review = common::review(writer, &old, &new);
    let body = serde_json::to_vec(&review).expect("serializable");
    let request = parse_request(&body).expect("a valid review");
    let decision = decide_request(&TRIM, &request, Endpoint::Mutate).expect("decided");
    // The reader leaves values of the same text in both statuses unbuilt:
    // it answers what the whole statuses answer.
    let whole = decide(
        &TRIM,
        &request.head(),
        Endpoint::Mutate,
        Some(Some(&old)),
        Some(Some(&new)),
    )
    .expect("decided");
    assert_eq!(
        decision.violations, whole.violations,
        "the text comparison changes no decision"
    );
    let patch = |decision: &statusguard::admission::decide::Decision| {
        (decision.response.patch.as_deref()).map(|p| serde_json::from_slice::<Value>(p).expect("the patch is JSON"))
    };
    assert_eq!(patch(&decision), patch(&whole), "nor the trim");
    let mut object = review["request"]["object"].clone();
    if let Some(patch) = &decision.response.patch {
        let patch: json_patch::Patch = serde_json::from_slice(patch).expect("the patch is JSON Patch");
        json_patch::patch(&mut object, &patch).expect("the patch applies to object");
    }
    // Decided again, the patched write has nothing left to restore or deny.
    let again = common::review(writer, &old, &object["status"]);
    let body = serde_json::to_vec(&again).expect("serializable");
    let request = parse_request(&body).expect("a valid review");
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let d = decide_request(&TRIM, &request, endpoint).expect("decided");
        assert!(
            d.violations.is_empty(),
            "{endpoint:?} after the trim: {:?}",
            d.violations
        );
        assert!(
            matches!(d.outcome, Outcome::Allowed | Outcome::Exempt),
            "{:?}",
            d.outcome
        );
    }
    // Outside the status, nothing changed.
    let original = &review["request"]["object"];
    for key in ["apiVersion", "kind", "metadata", "spec"] {
        assert_eq!(object[key], original[key], "{key}");
    }
    // Every top-level key no other writer owns any of, and every condition
    // of a type no other writer owns, is as the writer wrote it.
    let widgets = TRIM.resource("example.com", "widgets").expect("configured");
    let others: Vec<_> = widgets.writers.iter().filter(|w| w.username != writer).collect();
    let exempt = TRIM.is_exempt(writer, &["system:authenticated"]);
    if let (Some(new_map), Some(trimmed)) = (new.as_object(), object["status"].as_object())
        && !exempt
    {
        for (key, value) in new_map {
            let owned_elsewhere = others.iter().any(|w| w.fields.iter().any(|f| f.segments()[0] == *key));
            if key != "conditions" && key != "parents" && !owned_elsewhere {
                assert_eq!(trimmed.get(key), Some(value), "{key}");
            }
        }
        let mine = |list: Option<&Value>| -> Vec<Value> {
            list.and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter(|c| {
                            !others
                                .iter()
                                .any(|w| w.conditions.iter().any(|t| Some(t.as_str()) == condition_type(c)))
                        })
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(mine(trimmed.get("conditions")), mine(new_map.get("conditions")));
        // And every entry of the keyed list keyed by a value no other writer
        // owns, in the order written (a restore only appends the others').
        let parents = widgets.lists.first().expect("the keyed list");
        let entries_mine = |list: Option<&Value>| -> Vec<Value> {
            list.and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter(|e| {
                            !others.iter().any(|w| {
                                parents
                                    .key_of(e)
                                    .is_some_and(|k| w.entries_of(&parents.path).iter().any(|v| v == k))
                            })
                        })
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(
            entries_mine(trimmed.get("parents")),
            entries_mine(new_map.get("parents"))
        );
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});
