use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Value, json};

use super::managed_fields::object_fields;
use super::*;
use crate::admission::observe::{IdentityRecord, ResourceRecord};

fn entry(manager: &str, subresource: Option<&str>, status: Value) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.to_owned()),
        operation: Some("Update".to_owned()),
        subresource: subresource.map(str::to_owned),
        fields_type: Some("FieldsV1".to_owned()),
        fields_v1: Some(FieldsV1(json!({"f:status": status}))),
        ..Default::default()
    }
}

fn field(path: &str) -> Item {
    Item::Field(FieldPath::parse(path).unwrap())
}

fn ready(types: &[&str]) -> Value {
    let mut conditions = serde_json::Map::new();
    conditions.insert(".".into(), json!({}));
    for ty in types {
        conditions.insert(
            format!("k:{{\"type\":\"{ty}\"}}"),
            json!({".": {}, "f:status": {}, "f:type": {}}),
        );
    }
    Value::Object(conditions)
}

/// Three widgets: the controller sets observedGeneration, Ready and
/// summary (an object it sets whole); the scaler sets replicas,
/// scale.lastScaleTime (scale.policy is the autoscaler's) and Scaled; a
/// health checker sets health; on w3 the scaler's stale retry left it
/// holding observedGeneration.
fn objects() -> Vec<ObjectFields> {
    let w = |name: &str, scaler_has_generation: bool| {
        let mut controller = json!({"f:summary": {"f:ready": {}, "f:total": {}}, "f:conditions": ready(&["Ready"])});
        let mut scaler =
            json!({"f:replicas": {}, "f:scale": {"f:lastScaleTime": {}}, "f:conditions": ready(&["Scaled"])});
        if scaler_has_generation {
            scaler["f:observedGeneration"] = json!({});
        } else {
            controller["f:observedGeneration"] = json!({});
        }
        object_fields(
            &format!("team-a/{name}"),
            &[
                entry("widget-controller", Some("status"), controller),
                entry("widget-scaler", Some("status"), scaler),
                entry("autoscaler", Some("status"), json!({"f:scale": {"f:policy": {}}})),
                entry("health-checker", Some("status"), json!({"f:health": {}})),
                // Spec writes and object creation are not status writes.
                entry("kubectl-create", None, json!({"f:replicas": {}})),
            ],
            "conditions",
        )
    };
    vec![w("w1", false), w("w2", false), w("w3", true)]
}

fn observed() -> ObservedWriters {
    let identity = |name: &str, fields: &[(&str, u64)], conditions: &[(&str, u64)]| IdentityRecord {
        identity: name.to_owned(),
        writes: 10,
        fields: fields.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        conditions: conditions.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    };
    ObservedWriters {
        basis: Some(crate::admission::observe::Basis {
            counted: crate::admission::observe::COUNTED.into(),
            replica: None,
            since: "2026-12-03T12:00:00Z".into(),
            authenticated_callers: true,
            rate_per_second: 200,
        }),
        resources: vec![ResourceRecord {
            group: "example.com".into(),
            resource: "widgets".into(),
            writers: vec![
                identity(
                    "system:serviceaccount:platform:widget-controller",
                    &[("observedGeneration", 8), ("summary", 8)],
                    &[("Ready", 8)],
                ),
                identity(
                    "system:serviceaccount:platform:widget-scaler",
                    &[("replicas", 5), ("scale", 5), ("observedGeneration", 2)],
                    &[("Scaled", 5)],
                ),
                identity("system:serviceaccount:ops:auditor", &[("notes", 1)], &[]),
            ],
        }],
        identities: 3,
        capped_writes: 0,
    }
}

#[test]
fn managed_fields_name_leaves_whole_objects_and_condition_types() {
    let fields = &objects()[0];
    assert_eq!(
        fields.managers["widget-controller"],
        [
            field("observedGeneration"),
            field("summary.ready"),
            field("summary.total"),
            Item::Condition("Ready".into()),
        ]
        .into_iter()
        .collect()
    );
    assert!(!fields.managers.contains_key("kubectl-create"), "not a status write");
    let atomic = object_fields(
        "x",
        &[entry("m", Some("status"), json!({"f:conditions": {}}))],
        "conditions",
    );
    assert!(atomic.atomic_conditions.contains("m"));
}

/// A dot path cannot name a key holding a dot: its object is owned whole,
/// and such a key at the top is left out rather than misnamed.
#[test]
fn keys_with_dots_are_owned_through_their_object() {
    let fields = object_fields(
        "x",
        &[entry(
            "m",
            Some("status"),
            json!({"f:endpoints": {"f:a.example.com": {}, "f:b": {}}, "f:top.level": {}, "f:plain": {}}),
        )],
        "conditions",
    );
    assert_eq!(
        fields.managers["m"],
        [field("endpoints"), field("plain")].into_iter().collect()
    );
}

#[test]
fn without_observed_writes_managers_are_named_for_a_human_to_map() {
    let draft = draft("example.com", "widgets", "conditions", &objects(), &[]);
    let text = render(std::slice::from_ref(&draft)).unwrap();
    assert!(
        text.contains("      # field manager \"widget-scaler\": no observed identity"),
        "{text}"
    );
    assert!(text.contains("      - user: widget-controller\n        fields: [observedGeneration, summary]  # contested: observedGeneration\n        conditions: [Ready]\n"), "{text}");
    // scale's leaves went to two managers: named one by one.
    assert!(text.contains("fields: [replicas, scale.lastScaleTime]"), "{text}");
    assert!(text.contains("fields: [scale.policy]"), "{text}");
    assert!(text.contains("#   status.observedGeneration (drafted for widget-controller):\n#     widget-controller: 2 object(s), e.g. team-a/w1, team-a/w2\n#     widget-scaler: 1 object(s), e.g. team-a/w3\n"), "{text}");
    Ownership::from_yaml(&text).expect("check accepts the draft");
}

#[test]
fn observed_writes_turn_managers_into_service_accounts() {
    let draft = draft("example.com", "widgets", "conditions", &objects(), &[observed()]);
    assert_eq!(
        draft.identities.get("widget-scaler").map(String::as_str),
        Some("system:serviceaccount:platform:widget-scaler")
    );
    let text = render(std::slice::from_ref(&draft)).unwrap();
    assert!(
        text.contains("      - serviceAccount: platform/widget-controller  # field manager \"widget-controller\"\n        fields: [observedGeneration, summary]  # contested: observedGeneration\n"),
        "{text}"
    );
    // Observed at the top level only, scale.policy is the scaler's as far as
    // the writes show: the autoscaler runs as the scaler, which owns scale whole.
    assert!(
        text.contains("      - serviceAccount: platform/widget-scaler  # field manager \"autoscaler\", \"widget-scaler\"\n        fields: [replicas, scale]\n"),
        "{text}"
    );
    // An identity the document does not list, seen writing a field no manager holds.
    assert!(
        text.contains("      - serviceAccount: ops/auditor\n        fields: [notes]\n"),
        "{text}"
    );
    // The unmapped manager stays named.
    assert!(
        text.contains("# field manager \"health-checker\": no observed identity"),
        "{text}"
    );
    let contested: Vec<String> = draft.contested().iter().map(|(i, _)| i.to_string()).collect();
    assert_eq!(contested, ["status.observedGeneration"]);
    let rules = Ownership::from_yaml(&text).expect("check accepts the draft");
    let widgets = rules.resource("example.com", "widgets").unwrap();
    assert_eq!(widgets.writers.len(), 4, "{text}");
}

#[test]
fn names_that_are_not_plain_are_quoted() {
    assert_eq!(yaml_string("platform/widget-scaler"), "platform/widget-scaler");
    assert_eq!(yaml_string("kubectl edit"), "\"kubectl edit\"");
    assert_eq!(yaml_string("true"), "\"true\"");
    assert_eq!(yaml_string(""), "\"\"");
    assert_eq!(yaml_string("1.5"), "\"1.5\"");
}

#[test]
fn resource_names_split_and_join() {
    for (name, group, resource) in [("widgets.example.com", "example.com", "widgets"), ("pods", "", "pods")] {
        assert_eq!(split_resource_name(name), (group.to_owned(), resource.to_owned()));
        assert_eq!(resource_name(group, resource), name);
    }
}

#[test]
fn a_draft_from_unauthenticated_observations_says_they_may_be_forged() {
    let warning = "whose callers the webhook did not authenticate";
    let trusted = draft("example.com", "widgets", "conditions", &objects(), &[observed()]);
    assert!(!render(std::slice::from_ref(&trusted)).unwrap().contains(warning));
    let mut open = observed();
    if let Some(basis) = open.basis.as_mut() {
        basis.authenticated_callers = false;
    }
    let mut older = observed();
    older.basis = None;
    for record in [open, older] {
        let draft = draft("example.com", "widgets", "conditions", &objects(), &[record]);
        assert!(draft.observed_unauthenticated);
        let text = render(std::slice::from_ref(&draft)).unwrap();
        assert!(text.contains(warning), "{text}");
        Ownership::from_yaml(&text).expect("check accepts the draft");
    }
    // Without observed writes there is nothing to distrust.
    let none = draft("example.com", "widgets", "conditions", &objects(), &[]);
    assert!(!render(std::slice::from_ref(&none)).unwrap().contains(warning));
}

#[test]
fn cut_names_in_the_record_are_not_drafted() {
    let mut record = observed();
    let cut = format!(
        "system:serviceaccount:ops:{}",
        crate::admission::observe::cut_to(&"x".repeat(600), 100)
    );
    record.resources[0].writers.push(IdentityRecord {
        identity: cut.clone(),
        writes: 1,
        fields: [("lonely".to_owned(), 1)].into_iter().collect(),
        conditions: Default::default(),
    });
    let text = render(&[draft("example.com", "widgets", "conditions", &objects(), &[record])]).unwrap();
    assert!(!text.contains("lonely") && !text.contains("xxxx"), "{text}");
}
