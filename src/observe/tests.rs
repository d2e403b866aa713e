use serde_json::{Value, json};

use super::*;

fn rules() -> Ownership {
    Ownership::from_yaml(include_str!("../../tests/fixtures/ownership.yaml")).unwrap()
}

fn review(writer: &str, old: Value, new: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
            "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
            "subResource": "status",
            "name": "w1",
            "namespace": "team-a",
            "operation": "UPDATE",
            "userInfo": {"username": writer, "groups": ["system:authenticated"]},
            "object": {"metadata": {"name": "w1", "uid": "abc", "managedFields": [{"manager": "x"}]}, "status": new},
            "oldObject": {"metadata": {"name": "w1", "uid": "abc"}, "status": old},
            "dryRun": false
        }
    }))
    .unwrap()
}

fn changed(old: Value, new: Value) -> Vec<String> {
    read_write(&review("someone", old, new), &rules())
        .unwrap()
        .expect("a guarded status update")
        .changed
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn top_level_fields_declared_paths_and_condition_types_are_named() {
    let old = json!({"observedGeneration": 1, "replicas": 2, "scale": {"lastScaleTime": "t1", "other": 1},
                     "conditions": [{"type": "Ready", "status": "True"}, {"type": "Scaled", "status": "False"}]});
    let new = json!({"observedGeneration": 2, "replicas": 2, "scale": {"lastScaleTime": "t2", "other": 1},
                     "unlisted": {"a": 1},
                     "conditions": [{"type": "Ready", "status": "True"}, {"type": "Scaled", "status": "True"}, {"type": "New", "status": "True"}]});
    assert_eq!(
        changed(old, new),
        [
            "status.observedGeneration",
            "status.scale.lastScaleTime",
            "status.unlisted",
            "condition New",
            "condition Scaled"
        ]
    );
}

#[test]
fn a_change_beside_the_declared_paths_names_its_top_level_field() {
    let old = json!({"scale": {"lastScaleTime": "t1", "other": 1}});
    let new = json!({"scale": {"lastScaleTime": "t1", "other": 2}});
    assert_eq!(changed(old, new), ["status.scale"]);
}

#[test]
fn unchanged_reordered_and_null_for_absent_are_not_changes() {
    let old = json!({"replicas": 2, "scale": {"a": 1, "b": null}, "conditions": [{"type": "Ready", "status": "True"}]});
    let new = json!({"scale": {"b": null, "a": 1}, "replicas": 2, "conditions": [{"status": "True", "type": "Ready"}]});
    assert!(changed(old.clone(), new).is_empty());
    assert!(changed(Value::Null, json!({})).is_empty());
    assert_eq!(changed(Value::Null, json!({"replicas": 1})), ["status.replicas"]);
}

#[test]
fn the_write_names_its_object_and_writer_and_other_requests_are_skipped() {
    let write = read_write(
        &review("system:serviceaccount:a:b", json!({}), json!({"replicas": 1})),
        &rules(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (
            write.writer.as_str(),
            write.api_version.as_str(),
            write.kind.as_str(),
            write.uid.as_deref()
        ),
        ("system:serviceaccount:a:b", "example.com/v1", "Widget", Some("abc"))
    );
    assert_eq!(write.namespace.as_deref(), Some("team-a"));
    let mut unguarded: Value = serde_json::from_slice(&review("x", json!({}), json!({}))).unwrap();
    unguarded["request"]["resource"]["resource"] = json!("doohickeys");
    assert!(
        read_write(&serde_json::to_vec(&unguarded).unwrap(), &rules())
            .unwrap()
            .is_none()
    );
    let mut create = unguarded.clone();
    create["request"]["resource"]["resource"] = json!("widgets");
    create["request"]["operation"] = json!("CREATE");
    assert!(
        read_write(&serde_json::to_vec(&create).unwrap(), &rules())
            .unwrap()
            .is_none()
    );
    assert!(read_write(b"not json", &rules()).is_err());
}

fn write(writer: &str, items: &[&str]) -> ObservedWrite {
    ObservedWrite {
        writer: writer.to_owned(),
        group: "example.com".into(),
        resource: "widgets".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        name: "w".into(),
        namespace: None,
        uid: None,
        dry_run: false,
        changed: items
            .iter()
            .map(|i| match i.strip_prefix("condition ") {
                Some(ty) => Item::Condition(ty.to_owned()),
                None => Item::Field(FieldPath::parse(i).unwrap()),
            })
            .collect(),
    }
}

#[test]
fn the_record_is_bounded_by_identities_and_items() {
    let mut observer = Observer::new(2, 2);
    observer.record(&write("a", &["x", "condition Ready"]));
    observer.record(&write("a", &["x", "y"]));
    observer.record(&write("b", &[]));
    assert_eq!(observer.record(&write("c", &["z"])), OTHER_IDENTITY);
    observer.record(&write("d", &["z"]));
    let snapshot = observer.snapshot();
    assert_eq!(snapshot.identities, 2);
    assert_eq!(snapshot.capped_writes, 2);
    let writers = &snapshot.resources[0].writers;
    let a = writers.iter().find(|w| w.identity == "a").unwrap();
    assert_eq!(a.writes, 2);
    assert_eq!(a.fields.get("x"), Some(&2));
    assert_eq!(a.fields.get(OTHER_ITEM), Some(&1), "y is past the item cap: {a:?}");
    assert_eq!(a.conditions.get("Ready"), Some(&1));
    let other = writers.iter().find(|w| w.identity == OTHER_IDENTITY).unwrap();
    assert_eq!((other.writes, other.fields.get("z")), (2, Some(&2)));
    let json = serde_json::to_value(&snapshot).unwrap();
    assert_eq!(json["resources"][0]["writers"][0]["identity"], OTHER_IDENTITY);
}
