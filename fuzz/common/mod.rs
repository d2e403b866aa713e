//! Shared by the fuzz targets: the rules they decide with, and statuses and
//! reviews built from the fuzzer's bytes over the keys those rules name, so
//! that mutations spend their time where ownership is decided.
#![allow(dead_code)]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use serde_json::{Map, Value, json};
use statusguard::admission::decide::{Decision, DecisionError};
use statusguard::ownership::Ownership;

pub mod member_order;

/// The key values of `status.parents` entries: two owned (by the controller
/// and by the scaler), one nobody's; with `=`, `,`, `;`, `:` and `'` as a
/// Gateway API controllerName may hold them.
pub const ENTRY_KEYS: [&str; 3] = ["ctl.example/a=b;c", "scaler.example/x,y:'z'", "free.example/q"];

/// The shared fixture of the tests, in `mode`, with Widgets' `status.parents`
/// a keyed list (by `controllerName`) whose entries the controller and the
/// scaler own.
pub fn rules(mode: &str) -> Ownership {
    let text = include_str!("../../tests/fixtures/ownership.yaml")
        .replace("mode: enforce", &format!("mode: {mode}"))
        .replace(
            "    resource: widgets\n",
            "    resource: widgets\n    lists:\n      - {path: parents, key: controllerName}\n",
        )
        .replace(
            "        conditions: [Ready, Progressing]\n",
            &format!(
                "        conditions: [Ready, Progressing]\n        entries: {{parents: [{:?}]}}\n",
                ENTRY_KEYS[0]
            ),
        )
        .replace(
            "        conditions: [Scaled]\n",
            &format!(
                "        conditions: [Scaled]\n        entries: {{parents: [{:?}]}}\n",
                ENTRY_KEYS[1]
            ),
        );
    match Ownership::from_yaml(&text) {
        Ok(rules) => rules,
        Err(e) => panic!("the fixture is valid: {e}"),
    }
}

pub const WRITERS: [&str; 6] = [
    "system:serviceaccount:platform:widget-controller",
    "system:serviceaccount:platform:widget-scaler",
    "system:serviceaccount:platform:widget-health",
    "alice@example.com",
    "someone-else",
    "breakglass",
];

/// Keys at every level: the owned ones (top-level and nested) and others.
const KEYS: [&str; 12] = [
    "observedGeneration",
    "summary",
    "replicas",
    "scale",
    "lastScaleTime",
    "health",
    "notes",
    "a/b~c",
    "free",
    "ready",
    "x",
    "conditions",
];
const TYPES: [&str; 6] = ["Ready", "Progressing", "Scaled", "Healthy", "Other", "Reviewed"];

pub fn value(u: &mut Unstructured<'_>, depth: u32) -> Result<Value> {
    let choice = if depth == 0 {
        u.int_in_range(0..=4)?
    } else {
        u.int_in_range(0..=7)?
    };
    Ok(match choice {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => json!(u.int_in_range(-2i64..=3)?),
        3 => json!(["a", "b", ""][u.int_in_range(0..=2)?]),
        4 => json!(u.arbitrary::<f64>()?.is_finite().then_some(1.5)),
        5 | 6 => {
            let mut map = Map::new();
            for _ in 0..u.int_in_range(0..=3)? {
                map.insert(
                    KEYS[u.int_in_range(0..=KEYS.len() - 1)?].to_owned(),
                    value(u, depth - 1)?,
                );
            }
            Value::Object(map)
        }
        _ => {
            let mut items = Vec::new();
            for _ in 0..u.int_in_range(0..=2)? {
                items.push(value(u, depth - 1)?);
            }
            Value::Array(items)
        }
    })
}

pub fn condition(u: &mut Unstructured<'_>) -> Result<Value> {
    let mut item = Map::new();
    if u.int_in_range(0..=9)? > 0 {
        item.insert("type".into(), json!(TYPES[u.int_in_range(0..=TYPES.len() - 1)?]));
    }
    item.insert("status".into(), json!(["True", "False"][u.int_in_range(0..=1)?]));
    if u.arbitrary()? {
        item.insert("message".into(), value(u, 1)?);
    }
    Ok(Value::Object(item))
}

/// An entry of the keyed list: a key value of [`ENTRY_KEYS`] (or none, or
/// not a string) and a member or two.
pub fn entry(u: &mut Unstructured<'_>) -> Result<Value> {
    let mut item = Map::new();
    match u.int_in_range(0..=9)? {
        0 => {}
        1 => {
            item.insert("controllerName".into(), value(u, 1)?);
        }
        _ => {
            item.insert(
                "controllerName".into(),
                json!(ENTRY_KEYS[u.int_in_range(0..=ENTRY_KEYS.len() - 1)?]),
            );
        }
    }
    let gateway = ["a", "b"][u.int_in_range(0..=1)?];
    item.insert("parentRef".into(), json!({ "name": gateway }));
    if u.arbitrary()? {
        item.insert("conditions".into(), Value::Array(vec![condition(u)?]));
    }
    Ok(Value::Object(item))
}

/// A status: top-level keys over the fixture's names, maybe a conditions
/// list, maybe a keyed list.
pub fn status(u: &mut Unstructured<'_>) -> Result<Value> {
    if u.int_in_range(0..=15)? == 0 {
        return value(u, 1);
    }
    let mut map = Map::new();
    for _ in 0..u.int_in_range(0..=5)? {
        map.insert(KEYS[u.int_in_range(0..=KEYS.len() - 2)?].to_owned(), value(u, 3)?);
    }
    if u.arbitrary()? {
        let mut list = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            list.push(condition(u)?);
        }
        map.insert("conditions".into(), Value::Array(list));
    }
    if u.arbitrary()? {
        let mut list = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            list.push(entry(u)?);
        }
        map.insert("parents".into(), Value::Array(list));
    }
    Ok(Value::Object(map))
}

/// A new status for `old`: one of its own, or, as most writes are, `old`
/// with some top-level members taken from `other` (the rest the same text),
/// and in a list, now and then, one item of `other`'s in place of `old`'s.
pub fn written_after(u: &mut Unstructured<'_>, old: &Value, other: Value) -> Result<Value> {
    let (Some(old_map), Some(other_map)) = (old.as_object(), other.as_object()) else {
        return Ok(other);
    };
    if u.arbitrary()? {
        return Ok(other);
    }
    let mut new = old_map.clone();
    for key in KEYS.iter().chain(&["conditions", "parents"]) {
        let items = (new.get(*key).and_then(Value::as_array), other_map.get(*key).and_then(Value::as_array));
        if let (Some(items), Some(other_items)) = items
            && !items.is_empty()
            && !other_items.is_empty()
            && u.arbitrary()?
        {
            let mut items = items.clone();
            let at = u.int_in_range(0..=items.len() - 1)?;
            items[at] = other_items[u.int_in_range(0..=other_items.len() - 1)?].clone();
            new.insert((*key).to_owned(), Value::Array(items));
        } else if u.arbitrary()? {
            match other_map.get(*key) {
                Some(value) => new.insert((*key).to_owned(), value.clone()),
                None => new.remove(*key),
            };
        }
    }
    Ok(Value::Object(new))
}

/// A status UPDATE review of a Widget by one of [`WRITERS`].
pub fn review(writer: &str, old: &Value, new: &Value) -> Value {
    let object = |status: &Value| {
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "uid": "u"},
               "spec": {"size": 1}, "status": status})
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "fuzz", "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
        "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
        "subResource": "status", "name": "w", "namespace": "ns", "operation": "UPDATE",
        "userInfo": {"username": writer, "groups": ["system:authenticated"]},
        "object": object(new), "oldObject": object(old)}})
}

/// A decision's outcome, violations and response, comparable (the audit
/// annotations are a hash map, so the response is compared as a value).
pub fn summary(decided: std::result::Result<Decision, DecisionError>) -> String {
    match decided {
        Ok(mut decision) => {
            let body = statusguard::admission::wire::encode_response(&mut decision.response).expect("encodable");
            let mut sent: Value = serde_json::from_slice(&body).expect("JSON");
            // The patch as a value: restored items are written as they were
            // read, so member order and spacing follow the review's text.
            if let Some(patch) = sent["response"].get_mut("patch") {
                use base64::Engine as _;
                let text = patch.as_str().expect("the patch is a string");
                let bytes = base64::engine::general_purpose::STANDARD.decode(text).expect("base64");
                *patch = serde_json::from_slice(&bytes).expect("the patch is JSON");
            }
            format!("{:?} {:?} {sent}", decision.outcome, decision.violations)
        }
        Err(e) => format!("not decided: {e}"),
    }
}
