//! Fixtures shared by the unit tests of several modules: AdmissionReviews as
//! the API server sends them, and JSON values for property tests.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// What a review is about: the object's kind, the resource and subresource
/// it was written through, and where it lives.
pub(crate) struct Target<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub resource: &'a str,
    pub sub_resource: Option<&'a str>,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The status subresource of the fixture's Widget `team-a/w1`.
pub(crate) const WIDGET_STATUS: Target<'static> = Target {
    group: "example.com",
    kind: "Widget",
    resource: "widgets",
    sub_resource: Some("status"),
    namespace: "team-a",
    name: "w1",
};

/// An AdmissionReview (v1, uid `u1`, not a dry run) of `user`'s UPDATE of
/// `target` to `object`, from `old_object` where there is one.
pub(crate) fn update_review(target: &Target<'_>, user: &str, object: Value, old_object: Option<Value>) -> Value {
    let version = "v1";
    let mut request = json!({
        "uid": "u1",
        "kind": {"group": target.group, "version": version, "kind": target.kind},
        "resource": {"group": target.group, "version": version, "resource": target.resource},
        "name": target.name,
        "namespace": target.namespace,
        "operation": "UPDATE",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": object,
        "dryRun": false
    });
    if let Some(sub_resource) = target.sub_resource {
        request["subResource"] = json!(sub_resource);
    }
    if let Some(old_object) = old_object {
        request["oldObject"] = old_object;
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// `writer`'s write of the Widget's status from `old` to `new`; the new
/// object carries managedFields, as the API server sends it.
pub(crate) fn widget_status_review(writer: &str, old: Value, new: Value) -> Value {
    update_review(
        &WIDGET_STATUS,
        writer,
        json!({"metadata": {"name": "w1", "uid": "abc", "managedFields": [{"manager": "x"}]}, "status": new}),
        Some(json!({"metadata": {"name": "w1", "uid": "abc"}, "status": old})),
    )
}

/// JSON text of `review`.
pub(crate) fn body(review: &Value) -> Vec<u8> {
    serde_json::to_vec(review).unwrap()
}

/// JSON values with every form of number, nulls inside objects and lists,
/// and few enough shapes that equal values are common.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(1.0),
            json!(0.0),
            json!(-0.0),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(i64::MAX),
            json!(9_007_199_254_740_993_u64),
            json!(9_007_199_254_740_992.0),
        ]),
        "[ab]{0,2}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            prop::collection::btree_map("[ab]{1,2}", inner.clone(), 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            prop::collection::vec(inner, 0..3).prop_map(Value::Array),
        ]
    })
}

/// `value` with a `null` member added to every object at every depth: what a
/// client that sends nulls writes where a typed client that drops them
/// writes nothing.
pub(crate) fn with_null_members(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out: Map<String, Value> = map.iter().map(|(k, v)| (k.clone(), with_null_members(v))).collect();
            out.insert("zz-null".to_owned(), Value::Null);
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(with_null_members).collect()),
        other => other.clone(),
    }
}

/// The members condition items alike are made of (see [`alike_items`]):
/// keys and their values' text, a key at times twice.
pub(crate) fn alike_item_members() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    let key = prop::sample::select(vec!["status", "reason", "message", "observedGeneration"]);
    prop::collection::vec((key, alike_value()), 0..5)
}

fn alike_value() -> impl Strategy<Value = &'static str> + Clone {
    prop::sample::select(vec![
        r#""True""#,
        r#""False""#,
        "1",
        "12",
        "1.5",
        "null",
        r#"{"a":[1,{"b":"c"}]}"#,
        r#"{"a":[1,{"b":"d"}],"e":[]}"#,
        "[]",
        r#""m""#,
        r#""mé""#,
        r#""\u0041""#,
    ])
}

/// A list of condition items alike, as text: each item `members` with its
/// type and up to two values changed or added, the type anywhere among
/// them; white space after a colon, a comma, `{` or an item, or before `}`,
/// or none; now and then an item that is not an object or is empty.
pub(crate) fn alike_items(members: Vec<(&'static str, &'static str)>) -> impl Strategy<Value = String> {
    let kind = prop::sample::select(vec!["Ready", "Scaled", "Other", "Healthy", "Re\\u0061dy"]);
    let item = (
        kind,
        0..6usize,
        prop::collection::vec((0..6usize, alike_value()), 0..3),
        any::<u8>(),
    );
    prop::collection::vec(item, 0..7).prop_map(move |items| {
        let items: Vec<String> = items
            .into_iter()
            .map(|(kind, type_at, changes, spacing)| {
                match spacing {
                    0..=7 => return "{}".to_owned(),
                    8..=15 => return "[1]".to_owned(),
                    _ => {}
                }
                let mut item: Vec<(&str, String)> = members.iter().map(|(k, v)| (*k, v.to_string())).collect();
                for (at, value) in changes {
                    match item.get_mut(at) {
                        Some(member) => member.1 = value.to_owned(),
                        None => item.push(("extra", value.to_owned())),
                    }
                }
                item.insert(type_at.min(item.len()), ("type", format!("\"{kind}\"")));
                let space = |bit: u8| if spacing & (1 << bit) != 0 { " " } else { "" };
                let (colon, comma, open, close, after) = (space(2), space(3), space(4), space(5), space(6));
                let item: Vec<String> = item.iter().map(|(k, v)| format!("\"{k}\":{colon}{v}")).collect();
                format!("{{{open}{}{close}}}{after}", item.join(&format!(",{comma}")))
            })
            .collect();
        format!("[{}]", items.join(","))
    })
}
