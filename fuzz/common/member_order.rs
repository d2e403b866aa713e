//! JSON text with each object's members in an order of the caller's: the
//! fuzz target and the unit tests write one review in many member orders.

use serde_json::Value;

/// The members of an AdmissionReview's request in the order the API server
/// writes them: the order of Go's `AdmissionRequest` struct.
pub const REQUEST_ORDER: [&str; 12] = [
    "uid",
    "kind",
    "resource",
    "subResource",
    "name",
    "namespace",
    "operation",
    "userInfo",
    "object",
    "oldObject",
    "dryRun",
    "options",
];

/// An object's member: its key and its value.
pub type Member<'a> = (&'a String, &'a Value);

/// JSON text of `value` with each object's members in the order `order`
/// leaves them.
pub fn write(value: &Value, order: &mut dyn FnMut(&mut [Member<'_>])) -> Vec<u8> {
    fn write_into(value: &Value, order: &mut dyn FnMut(&mut [Member<'_>]), out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut members: Vec<Member<'_>> = map.iter().collect();
                order(&mut members);
                out.push('{');
                for (i, (key, value)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(key.as_str()).to_string());
                    out.push(':');
                    write_into(value, order, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_into(item, order, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write_into(value, order, &mut out);
    out.into_bytes()
}
