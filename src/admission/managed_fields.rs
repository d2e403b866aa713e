//! Server-side apply's record of who manages what (`metadata.managedFields`),
//! as far as a trim and a denial need it.
//!
//! A trim puts back the values of other writers' items, but the API server
//! has already recorded the write's field manager as the manager of every
//! field it sent (a forced apply even takes them from their manager). Left
//! so, the real owner's next apply without `--force-conflicts` conflicts
//! with the violator over its own items. The API server stores a mutating
//! webhook's edit of `managedFields` as sent (tests/e2e_ssa_admission.rs
//! shows it), so the trim also hands the management of each restored item
//! back: it becomes exactly what `oldObject` recorded for it.
//!
//! Only where the schema tracks an item on its own can it be handed back: a
//! field, and an entry of a `listType=map` list (conditions, keyed by
//! `type`), which fieldsV1 names `k:{"type":"Ready"}`. An atomic list (such
//! as Gateway API's `status.parents`) is one field with one manager; there
//! the entries' values are restored and the list's manager stays the writer.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use kube::core::admission::AdmissionResponse;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::ownership::{Item, ResourceRules};

/// The managedFields text of a review's object could not be read.
#[derive(Debug, thiserror::Error)]
#[error("metadata.managedFields is not a list of managed-field entries: {0}")]
pub(crate) struct ManagedFieldsError(String);

/// One step of an item's place in fieldsV1: a member (`f:name`) or the
/// entry of a map list whose `member` is `value` (`k:{"member":"value"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    Field(&'a str),
    Keyed { member: &'a str, value: &'a str },
}

impl Step<'_> {
    fn matches(&self, fields_key: &str) -> bool {
        match *self {
            Step::Field(name) => fields_key.strip_prefix("f:") == Some(name),
            Step::Keyed { member, value } => fields_key
                .strip_prefix("k:")
                .and_then(|key| serde_json::from_str::<Map<String, Value>>(key).ok())
                .is_some_and(|key| key.len() == 1 && key.get(member).and_then(Value::as_str) == Some(value)),
        }
    }
}

/// Where `item` lives in a fieldsV1 set, from the object's root.
fn steps<'a>(rules: &'a ResourceRules, item: &'a Item) -> Vec<Step<'a>> {
    let mut steps = vec![Step::Field("status")];
    match item {
        Item::Field(path) => steps.extend(path.segments().iter().map(|s| Step::Field(s))),
        Item::Condition(ty) => {
            steps.extend(rules.conditions_path.segments().iter().map(|s| Step::Field(s)));
            steps.push(Step::Keyed {
                member: "type",
                value: ty,
            });
        }
        Item::Entry { list, key, value } => {
            steps.extend(list.segments().iter().map(|s| Step::Field(s)));
            steps.push(Step::Keyed { member: key, value });
        }
    }
    steps
}

/// The managedFields of the object, with the management of each of `items`
/// made what `old` recorded for it; `None` when that changes nothing (or
/// the object records no managedFields: nothing to hand back).
pub(crate) fn handed_back(
    rules: &ResourceRules,
    items: &[&Item],
    old: Option<&RawValue>,
    new: Option<&RawValue>,
) -> Result<Option<Value>, ManagedFieldsError> {
    let Some(new) = new else { return Ok(None) };
    let mut entries = read(new)?;
    let old = old.map(read).transpose()?.unwrap_or_default();
    let mut changed = false;
    for item in items {
        let steps = steps(rules, item);
        // Taken from every manager as the write recorded it...
        for entry in &mut entries {
            if let Some(fields) = entry.get_mut("fieldsV1") {
                changed |= take(fields, &steps).is_some();
            }
        }
        // ...and given to the managers the stored object recorded.
        for previous in &old {
            let Some((place, subtree)) = previous.get("fieldsV1").and_then(|f| find(f, &steps)) else {
                continue;
            };
            let at = match entries.iter().position(|e| same_manager(e, previous)) {
                Some(at) => at,
                None => {
                    // A forced apply that took every field of a manager
                    // dropped its entry: it comes back, with this item only.
                    let entry = previous.iter().filter(|(k, _)| *k != "fieldsV1");
                    entries.push(entry.map(|(k, v)| (k.clone(), v.clone())).collect());
                    entries.len() - 1
                }
            };
            let fields = entries[at]
                .entry("fieldsV1")
                .or_insert_with(|| Value::Object(Map::new()));
            put(fields, &place, subtree.clone());
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    // A manager left with nothing is no manager (the API server drops such
    // entries itself on the next write).
    entries.retain(|e| {
        e.get("fieldsV1")
            .and_then(Value::as_object)
            .is_some_and(|f| !f.is_empty())
    });
    Ok(Some(Value::Array(entries.into_iter().map(Value::Object).collect())))
}

/// The longest managedFields text read: the API server keeps a whole
/// object under 1.5 MiB, and real managedFields are a few KiB.
const MAX_TEXT: usize = 1024 * 1024;

/// The entries of a managedFields text, built within the calling thread's
/// value budget (see `value_budget`).
fn read(raw: &RawValue) -> Result<Vec<Map<String, Value>>, ManagedFieldsError> {
    if raw.get().len() > MAX_TEXT {
        return Err(ManagedFieldsError(format!(
            "{} bytes, over {MAX_TEXT}",
            raw.get().len()
        )));
    }
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    let value = crate::value_budget::build(&mut deserializer).map_err(|e| ManagedFieldsError(e.to_string()))?;
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(entries) => entries
            .into_iter()
            .map(|entry| match entry {
                Value::Object(entry) => Ok(entry),
                _ => Err(ManagedFieldsError("an entry is not an object".to_owned())),
            })
            .collect(),
        _ => Err(ManagedFieldsError("not a list".to_owned())),
    }
}

/// The same manager: name, operation, API version and subresource alike,
/// which is how the API server tells its entries apart.
fn same_manager(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    ["manager", "operation", "apiVersion", "subresource"]
        .iter()
        .all(|k| a.get(*k) == b.get(*k))
}

/// Removes the subtree at `steps` from a fieldsV1 set, and every parent it
/// leaves empty (an empty parent would name the parent itself as managed).
/// Returns the concrete keys it was found at and the subtree.
fn take(fields: &mut Value, steps: &[Step<'_>]) -> Option<(Vec<String>, Value)> {
    let (first, rest) = steps.split_first()?;
    let map = fields.as_object_mut()?;
    let key = map.keys().find(|k| first.matches(k))?.clone();
    let (mut place, subtree) = if rest.is_empty() {
        (Vec::new(), map.remove(&key)?)
    } else {
        let child = map.get_mut(&key)?;
        let found = take(child, rest)?;
        if child.as_object().is_some_and(Map::is_empty) {
            map.remove(&key);
        }
        found
    };
    place.insert(0, key);
    Some((place, subtree))
}

/// The subtree at `steps` of a fieldsV1 set, and the concrete keys it is at.
fn find<'v>(fields: &'v Value, steps: &[Step<'_>]) -> Option<(Vec<String>, &'v Value)> {
    let (first, rest) = steps.split_first()?;
    let (key, child) = fields.as_object()?.iter().find(|(k, _)| first.matches(k))?;
    let (mut place, subtree) = if rest.is_empty() {
        (Vec::new(), child)
    } else {
        find(child, rest)?
    };
    place.insert(0, key.clone());
    Some((place, subtree))
}

/// Puts `subtree` at the concrete keys `place` of a fieldsV1 set, creating
/// the parents it needs.
fn put(fields: &mut Value, place: &[String], subtree: Value) {
    let mut at = fields;
    for key in place {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else { return };
        at = map.entry(key.clone()).or_insert_with(|| Value::Object(Map::new()));
    }
    *at = subtree;
}

/// Appended to the 409 of a denied server-side apply: kubectl adds its own
/// advice to retry with `--force-conflicts` under any 409 Conflict, and
/// that flag was likely given already.
pub(crate) const APPLY_ADVICE: &str = ". This is statusguard's ownership rule, not a field-manager conflict: \
     --force-conflicts does not override it. Apply only the fields, conditions and entries this writer owns \
     (leave the others out of the applied configuration), or write with a merge patch guarded by the resourceVersion";

/// Adds the operation that stores `managed` as `metadata.managedFields` to
/// the response's patch. The patch, a JSON array the trim wrote, gets the
/// operation appended to its text: its restored items are not read back
/// and written again.
pub(crate) fn add_to_patch(response: &mut AdmissionResponse, managed: Value) -> Result<(), ManagedFieldsError> {
    let op = PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["metadata", "managedFields"]),
        value: managed,
    });
    let encoding = |e: serde_json::Error| ManagedFieldsError(e.to_string());
    match response.patch.as_mut() {
        Some(bytes) if bytes.last() == Some(&b']') => {
            bytes.pop();
            if bytes.iter().rev().find(|b| !b.is_ascii_whitespace()) != Some(&b'[') {
                bytes.push(b',');
            }
            serde_json::to_writer(&mut *bytes, &op).map_err(encoding)?;
            bytes.push(b']');
            Ok(())
        }
        Some(_) => Err(ManagedFieldsError("the restoring patch is not a JSON array".to_owned())),
        None => {
            *response = response
                .clone()
                .with_patch(Patch(vec![op]))
                .map_err(|e| ManagedFieldsError(e.to_string()))?;
            Ok(())
        }
    }
}

/// Whether the write is a server-side apply by `field_manager`: its Apply
/// entry is new or changed. The review says nothing else of it (the API
/// server hands a webhook a PATCH's options as UpdateOptions, without
/// `force`).
pub(crate) fn is_apply(field_manager: &str, old: Option<&RawValue>, new: Option<&RawValue>) -> bool {
    let Some(new) = new else { return false };
    // Most writes are not applies: their entries never say so.
    if field_manager.is_empty() || !new.get().contains("\"Apply\"") {
        return false;
    }
    let applied = |raw: Option<&RawValue>| -> Option<Map<String, Value>> {
        read(raw?).ok()?.into_iter().find(|e| {
            e.get("manager").and_then(Value::as_str) == Some(field_manager)
                && e.get("operation").and_then(Value::as_str) == Some("Apply")
        })
    };
    match (applied(old), applied(Some(new))) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(before), Some(after)) => before != after,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ownership::{FieldPath, Ownership};

    fn rules() -> Ownership {
        Ownership::from_yaml(rules_text()).unwrap()
    }

    fn rules_text() -> &'static str {
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nmode: trim\nresources:\n  - group: example.com\n    resource: widgets\n    lists: [{path: parents, key: controllerName}]\n    writers:\n      - serviceAccount: ns/owner\n        fields: [replicas]\n        conditions: [Ready]\n        entries: {parents: [\"a.example/x\"]}\n"
    }

    fn raw(value: Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).unwrap()
    }

    fn entry(manager: &str, operation: &str, fields: Value) -> Value {
        json!({"manager": manager, "operation": operation, "apiVersion": "example.com/v1",
               "time": "2026-12-03T10:00:00Z", "fieldsType": "FieldsV1", "subresource": "status",
               "fieldsV1": fields})
    }

    /// The managedFields operation is appended to the patch's text, which
    /// then reads as the restoring operations followed by it.
    #[test]
    fn the_managed_fields_operation_follows_the_restoring_ones() {
        let managed = json!([entry("owner", "Update", json!({}))]);
        let add = json!({"op": "add", "path": "/metadata/managedFields", "value": managed});
        let restoring = json!([{"op": "replace", "path": "/status/replicas", "value": 3},
                               {"op": "remove", "path": "/status/conditions/1"}]);
        for (patch, expected) in [
            (Some(restoring.clone()), {
                let mut ops = restoring.as_array().unwrap().clone();
                ops.push(add.clone());
                Value::Array(ops)
            }),
            (Some(json!([])), json!([add.clone()])),
            (None, json!([add.clone()])),
        ] {
            let mut response = AdmissionResponse::invalid("");
            response.allowed = true;
            if let Some(patch) = patch {
                response = response.with_patch(serde_json::from_value(patch).unwrap()).unwrap();
            }
            add_to_patch(&mut response, managed.clone()).unwrap();
            let sent: Value = serde_json::from_slice(response.patch.as_deref().unwrap()).unwrap();
            assert_eq!(sent, expected);
        }
        let mut broken = AdmissionResponse::invalid("");
        broken.patch = Some(b"{}".to_vec());
        assert!(add_to_patch(&mut broken, managed).is_err());
    }

    /// A forced apply took a scalar and a condition from their owner (its
    /// entry dropped) and added a condition nobody managed: each goes back
    /// to what the stored object recorded; the writer keeps its own.
    #[test]
    fn a_trim_hands_each_restored_item_back_to_its_stored_manager() {
        let rules = rules();
        let rules = rules.resource("example.com", "widgets").unwrap();
        let old = json!([
            entry(
                "owner",
                "Apply",
                json!({"f:status": {"f:replicas": {},
                "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}}}})
            ),
            entry("violator", "Apply", json!({"f:status": {"f:mine": {}}})),
        ]);
        let new = json!([entry(
            "violator",
            "Apply",
            json!({"f:status": {"f:mine": {}, "f:replicas": {},
                "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}},
                                 "k:{\"type\":\"Scaled\"}": {".": {}}}}})
        )]);
        let items = [
            Item::Field(FieldPath::parse("replicas").unwrap()),
            Item::Condition("Ready".into()),
            Item::Condition("Scaled".into()),
        ];
        let items: Vec<&Item> = items.iter().collect();
        let handed = handed_back(rules, &items, Some(&raw(old)), Some(&raw(new)))
            .unwrap()
            .unwrap();
        assert_eq!(handed[0]["manager"], "violator");
        assert_eq!(handed[0]["fieldsV1"], json!({"f:status": {"f:mine": {}}}));
        assert_eq!(handed[1]["manager"], "owner");
        assert_eq!(
            handed[1]["fieldsV1"],
            json!({"f:status": {"f:replicas": {},
                "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}}}})
        );
        assert_eq!(handed[1]["time"], "2026-12-03T10:00:00Z");
    }

    /// A keyed entry of a map list goes back by its key; an atomic list
    /// (one field, owned whole) is left as the write recorded it.
    #[test]
    fn keyed_entries_go_back_by_key_and_an_atomic_list_stays_whole() {
        let rules = rules();
        let rules = rules.resource("example.com", "widgets").unwrap();
        let item = Item::Entry {
            list: FieldPath::parse("parents").unwrap(),
            key: "controllerName".into(),
            value: "a.example/x".into(),
        };
        let key = "k:{\"controllerName\":\"a.example/x\"}";
        let old = json!([entry(
            "owner",
            "Update",
            json!({"f:status": {"f:parents": {key: {".": {}}}}})
        )]);
        let new = json!([
            entry("owner", "Update", json!({"f:status": {"f:other": {}}})),
            entry(
                "violator",
                "Update",
                json!({"f:status": {"f:parents": {key: {".": {}}}}})
            ),
        ]);
        let handed = handed_back(rules, &[&item], Some(&raw(old)), Some(&raw(new)))
            .unwrap()
            .unwrap();
        assert_eq!(
            handed.as_array().unwrap().len(),
            1,
            "the violator manages nothing more: {handed}"
        );
        assert_eq!(
            handed[0]["fieldsV1"],
            json!({"f:status": {"f:other": {}, "f:parents": {key: {".": {}}}}})
        );
        let atomic = json!([entry("violator", "Apply", json!({"f:status": {"f:parents": {}}}))]);
        assert!(
            handed_back(rules, &[&item], None, Some(&raw(atomic)))
                .unwrap()
                .is_none()
        );
    }

    fn review(old_managed: Value, new_managed: Value) -> Vec<u8> {
        let object = |replicas: i64, managed: Value| json!({"metadata": {"name": "w", "uid": "u", "managedFields": managed}, "status": {"replicas": replicas}});
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r", "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
                "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
                "subResource": "status", "name": "w", "namespace": "ns", "operation": "UPDATE",
                "userInfo": {"username": "violator"},
                "object": object(5, new_managed), "oldObject": object(3, old_managed),
                "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "violator"}}
        }))
        .unwrap()
    }

    fn response(body: &[u8]) -> Value {
        serde_json::from_slice::<Value>(body).unwrap()["response"].clone()
    }

    /// Through the whole answer: the trim's patch restores the value and
    /// hands its management back; a denied apply says no flag overrides
    /// ownership, and a denied update does not.
    #[test]
    fn the_answer_hands_management_back_and_tells_an_apply_what_to_do() {
        use crate::admission::answer::answer;
        use crate::admission::decide::Endpoint;
        use base64::Engine as _;
        let rules = rules();
        let old = json!([entry("owner", "Apply", json!({"f:status": {"f:replicas": {}}}))]);
        let new = json!([entry("violator", "Apply", json!({"f:status": {"f:replicas": {}}}))]);
        let answered = answer(Some(&rules), &review(old.clone(), new.clone()), Endpoint::Mutate);
        let patch = response(&answered.body)["patch"].as_str().unwrap().to_owned();
        let patch: Value =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap();
        let mut object = json!({"metadata": {"managedFields": new.clone()}, "status": {"replicas": 5}});
        json_patch::patch(&mut object, &serde_json::from_value::<Patch>(patch).unwrap()).unwrap();
        assert_eq!(object["status"]["replicas"], 3);
        assert_eq!(object["metadata"]["managedFields"], old);

        let strict = Ownership::from_yaml(&rules_text().replace("mode: trim", "mode: enforce")).unwrap();
        let denied = response(&answer(Some(&strict), &review(old.clone(), new), Endpoint::Validate).body);
        assert_eq!(denied["status"]["code"], 409);
        assert!(
            denied["status"]["message"]
                .as_str()
                .unwrap()
                .contains("--force-conflicts does not override it")
        );
        let updated = json!([entry("violator", "Update", json!({"f:status": {"f:replicas": {}}}))]);
        let denied = response(&answer(Some(&strict), &review(old, updated), Endpoint::Validate).body);
        assert_eq!(denied["status"]["code"], 409);
        assert!(
            !denied["status"]["message"]
                .as_str()
                .unwrap()
                .contains("force-conflicts")
        );
    }

    /// A write whose resourceVersion is not the stored one fails the API
    /// server's precondition after mutating admission: the trim leaves it
    /// alone rather than warn of a restore that never happens.
    #[test]
    fn a_stale_write_is_left_to_the_api_servers_precondition() {
        use crate::admission::answer::answer;
        use crate::admission::decide::Endpoint;
        let rules = rules();
        let mut body: Value = serde_json::from_slice(&review(json!([]), json!([]))).unwrap();
        body["request"]["oldObject"]["metadata"]["resourceVersion"] = json!("7");
        // The API server compares versions as numbers: "07" is "7".
        for (written, trimmed) in [("5", false), ("7", true), ("07", true), ("", true)] {
            body["request"]["object"]["metadata"]["resourceVersion"] = json!(written);
            let answered = response(&answer(Some(&rules), &serde_json::to_vec(&body).unwrap(), Endpoint::Mutate).body);
            assert_eq!(answered["allowed"], true);
            assert_eq!(
                answered.get("patch").is_some(),
                trimmed,
                "resourceVersion {written:?}: {answered}"
            );
            assert_eq!(
                answered.get("warnings").is_some(),
                trimmed,
                "resourceVersion {written:?}: {answered}"
            );
        }
    }

    /// A hostile review's managedFields cost no more than a review's values
    /// may: text over 1 MiB is not read, and what is read is built within the
    /// value budget (a MiB of one-member objects would be ~80 MiB of values).
    #[test]
    fn managed_fields_are_read_within_bounds() {
        let _budget = crate::value_budget::ValueBudget::enter(crate::value_budget::REVIEW_VALUE_BUDGET);
        let rules = rules();
        let rules = rules.resource("example.com", "widgets").unwrap();
        let item = Item::Condition("Ready".into());
        let tiny = |n: usize| raw(Value::Array(vec![json!({"a": 0}); n]));
        let over = handed_back(rules, &[&item], None, Some(&tiny(200_000))).unwrap_err();
        assert!(over.to_string().contains("over 1048576"), "{over}");
        let costly = handed_back(rules, &[&item], None, Some(&tiny(120_000))).unwrap_err();
        assert!(costly.to_string().contains("more memory"), "{costly}");
    }

    #[test]
    fn unreadable_managed_fields_are_an_error_and_absent_ones_nothing() {
        let rules = rules();
        let rules = rules.resource("example.com", "widgets").unwrap();
        let item = Item::Condition("Ready".into());
        assert!(handed_back(rules, &[&item], None, Some(&raw(json!({"a": 1})))).is_err());
        assert!(handed_back(rules, &[&item], None, None).unwrap().is_none());
        assert!(
            handed_back(rules, &[&item], None, Some(&raw(Value::Null)))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_apply_is_told_by_a_new_or_changed_apply_entry_of_the_field_manager() {
        let before = raw(json!([entry("kubectl", "Apply", json!({"f:status": {"f:a": {}}}))]));
        let same = raw(json!([entry("kubectl", "Apply", json!({"f:status": {"f:a": {}}}))]));
        let changed = raw(json!([entry("kubectl", "Apply", json!({"f:status": {"f:b": {}}}))]));
        let updated = raw(json!([entry(
            "kubectl-edit",
            "Update",
            json!({"f:status": {"f:b": {}}})
        )]));
        assert!(is_apply("kubectl", None, Some(&changed)));
        assert!(is_apply("kubectl", Some(&before), Some(&changed)));
        assert!(!is_apply("kubectl", Some(&before), Some(&same)));
        assert!(!is_apply("kubectl-edit", None, Some(&updated)));
        assert!(!is_apply("", None, Some(&changed)));
        assert!(!is_apply("kubectl", None, None));
    }
}
