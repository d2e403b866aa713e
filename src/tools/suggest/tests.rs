use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Value, json};

use std::collections::BTreeMap;

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
            None,
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
        entries: Default::default(),
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
        None,
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
        None,
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
        entries: Default::default(),
    });
    let text = render(&[draft("example.com", "widgets", "conditions", &objects(), &[record])]).unwrap();
    assert!(!text.contains("lonely") && !text.contains("xxxx"), "{text}");
}

/// A Gateway API controllerName with every character its pattern allows
/// that YAML could misread.
const AWKWARD: &str = "example.com/a=b,c;d:e'f";

/// `f:parents` of a `listType=map` list keyed by controllerName: one entry
/// per value, as server-side apply records them.
fn keyed_parents(values: &[&str]) -> Value {
    let mut set = serde_json::Map::new();
    set.insert(".".into(), json!({}));
    for value in values {
        let key = serde_json::to_string(&json!({"controllerName": value})).unwrap();
        set.insert(
            format!("k:{key}"),
            json!({".": {}, "f:controllerName": {}, "f:conditions": {}}),
        );
    }
    json!({"f:parents": Value::Object(set)})
}

/// Two routes whose `parents` two managers share by controllerName, one of
/// them with [`AWKWARD`] as its value; `ours` also wrote `shared` on r2.
fn keyed_objects(shared: Option<&str>) -> Vec<ObjectFields> {
    let mut theirs = vec![AWKWARD];
    theirs.extend(shared);
    let mut ours = vec!["ours.io/gw"];
    ours.extend(shared);
    vec![
        object_fields(
            "ns/r1",
            &[
                entry("ours", Some("status"), keyed_parents(&["ours.io/gw"])),
                entry("theirs", Some("status"), keyed_parents(&[AWKWARD])),
            ],
            "conditions",
            None,
        ),
        object_fields(
            "ns/r2",
            &[
                entry("ours", Some("status"), keyed_parents(&ours)),
                entry("theirs", Some("status"), keyed_parents(&theirs)),
            ],
            "conditions",
            None,
        ),
    ]
}

#[test]
fn keyed_managed_fields_draft_a_list_and_each_writers_entries() {
    let objects = keyed_objects(None);
    assert!(objects[0].entries["theirs"].contains(&Item::Entry {
        list: FieldPath::parse("parents").unwrap(),
        key: "controllerName".into(),
        value: AWKWARD.into(),
    }));
    let draft = draft("gateway.networking.k8s.io", "httproutes", "conditions", &objects, &[]);
    let text = render(std::slice::from_ref(&draft)).unwrap();
    assert!(
        text.contains("    lists:\n      - path: parents\n        key: controllerName\n"),
        "{text}"
    );
    // The list is owned by key value, never as a field, and not contested.
    assert!(
        !text.contains("fields: [parents]") && !text.contains("status.parents (drafted"),
        "{text}"
    );
    let rules = Ownership::from_yaml(&text).expect("check accepts the draft");
    let routes = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    assert_eq!(
        (routes.lists[0].path.to_string(), routes.lists[0].key.as_str()),
        ("parents".into(), "controllerName")
    );
    let entries_of = |user: &str| {
        let writer = routes.writers.iter().find(|w| w.username == user).unwrap();
        writer.entries_of(&routes.lists[0].path).to_vec()
    };
    assert_eq!(entries_of("ours"), ["ours.io/gw"]);
    assert_eq!(entries_of("theirs"), [AWKWARD], "quoted so that it reads back: {text}");
}

#[test]
fn a_key_value_two_writers_wrote_is_said_and_owned_by_neither() {
    let draft = draft(
        "gateway.networking.k8s.io",
        "httproutes",
        "conditions",
        &keyed_objects(Some("both.io/gw")),
        &[],
    );
    let text = render(std::slice::from_ref(&draft)).unwrap();
    assert!(
        text.contains(
            "        # \"both.io/gw\" was written by \"ours\" and \"theirs\": a key value has one owner per list"
        ),
        "{text}"
    );
    let rules = Ownership::from_yaml(&text).expect("check accepts the draft");
    let routes = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    for writer in &routes.writers {
        assert!(
            !writer
                .entries_of(&routes.lists[0].path)
                .contains(&"both.io/gw".to_owned()),
            "{text}"
        );
    }
    assert_eq!(routes.writers.len(), 2);
}

/// Gateway API's HTTPRoute: `status.parents` is atomic, so managedFields
/// give it whole to the last writer.
fn atomic_route(last: &str) -> ObjectFields {
    let status = json!({"parents": [
        {"controllerName": "envoy.io/gw", "parentRef": {"name": "envoy"}},
        {"controllerName": AWKWARD, "parentRef": {"name": "istio"}},
    ]});
    object_fields(
        "ns/route",
        &[entry(last, Some("status"), json!({"f:parents": {}}))],
        "conditions",
        Some(&status),
    )
}

#[test]
fn an_atomic_list_says_managed_fields_cannot_tell_who_writes_which_entry() {
    let route = atomic_route("istio");
    assert!(route.atomic_lists[&FieldPath::parse("parents").unwrap()].contains("istio"));
    let draft = draft("gateway.networking.k8s.io", "httproutes", "conditions", &[route], &[]);
    let text = render(std::slice::from_ref(&draft)).unwrap();
    assert!(
        text.contains("    # status.parents is owned whole (atomic list, by field manager \"istio\"): who writes which entry cannot be told from managedFields;\n    # observe writes (statusguard suggest --observed"),
        "{text}"
    );
    assert!(!text.contains("    lists:\n"), "{text}");
    Ownership::from_yaml(&text).expect("check accepts the draft");
    // A list of objects no member could split is no such list.
    let one_writer = object_fields(
        "ns/route",
        &[entry("m", Some("status"), json!({"f:parents": {}}))],
        "conditions",
        Some(&json!({"parents": [{"controllerName": "a"}, {"controllerName": "a"}]})),
    );
    assert!(one_writer.atomic_lists.is_empty());
}

/// The observed record of two implementations writing their own entries
/// (and a timestamp member, different in every write).
fn observed_entries() -> ObservedWriters {
    let identity = |name: &str, controller: &str, times: &[&str]| {
        let mut members = BTreeMap::new();
        members.insert(
            "controllerName".to_owned(),
            [(controller.to_owned(), 3)].into_iter().collect(),
        );
        members.insert("since".to_owned(), times.iter().map(|t| (t.to_string(), 1)).collect());
        IdentityRecord {
            identity: name.to_owned(),
            writes: 3,
            fields: [("parents".to_owned(), 3)].into_iter().collect(),
            conditions: Default::default(),
            entries: [("parents".to_owned(), members)].into_iter().collect(),
        }
    };
    let mut record = observed();
    record.resources = vec![ResourceRecord {
        group: "gateway.networking.k8s.io".into(),
        resource: "httproutes".into(),
        writers: vec![
            identity("system:serviceaccount:envoy-system:envoy", "envoy.io/gw", &["t1", "t3"]),
            identity("system:serviceaccount:istio-system:istiod", AWKWARD, &["t2", "t4"]),
        ],
    }];
    record
}

#[test]
fn observed_writes_draft_the_entries_of_an_atomic_list() {
    let draft = draft(
        "gateway.networking.k8s.io",
        "httproutes",
        "conditions",
        &[atomic_route("istio")],
        &[observed_entries()],
    );
    // Both identities wrote the list the manager holds whole: which one it
    // runs as cannot be told, and no guess is written.
    assert!(draft.identities.is_empty(), "{:?}", draft.identities);
    let text = render(std::slice::from_ref(&draft)).unwrap();
    assert!(
        text.contains("cannot be told from managedFields;\n    # its lists: entry below is drafted from the observed writes.\n    lists:\n      - path: parents\n        key: controllerName\n"),
        "{text}"
    );
    assert!(!text.contains("fields: [parents]"), "{text}");
    let rules = Ownership::from_yaml(&text).expect("check accepts the draft");
    let routes = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    let owner = routes.writers.iter().find(|w| w.username.ends_with(":istiod")).unwrap();
    assert_eq!(owner.entries_of(&routes.lists[0].path), [AWKWARD]);
    let envoy = routes.writers.iter().find(|w| w.username.ends_with(":envoy")).unwrap();
    assert_eq!(envoy.entries_of(&routes.lists[0].path), ["envoy.io/gw"]);
}

/// Writers and the values each wrote, as a test writes them.
type WritersValues<'a> = &'a [(&'a str, &'a [&'a str])];

#[test]
fn the_key_is_a_member_constant_per_writer_controller_name_first() {
    let parents = || FieldPath::parse("parents").unwrap();
    let evidence = |members: &[(&str, WritersValues)]| -> EntryEvidence {
        let members = members
            .iter()
            .map(|(member, writers)| {
                let writers = writers
                    .iter()
                    .map(|(w, values)| (w.to_string(), values.iter().map(|v| v.to_string()).collect()))
                    .collect();
                (member.to_string(), writers)
            })
            .collect();
        [(parents(), members)].into_iter().collect()
    };
    let key = |e: &EntryEvidence| keyed_lists(e).first().map(|l| l.key.clone());
    // Both name the writers; controllerName wins. A timestamp never does.
    let both = evidence(&[
        ("aaa", &[("a", &["x"]), ("b", &["y"])]),
        ("controllerName", &[("a", &["a.io"]), ("b", &["b.io"])]),
        ("since", &[("a", &["t1", "t3"]), ("b", &["t2"])]),
    ]);
    assert_eq!(key(&both).as_deref(), Some("controllerName"));
    let other = evidence(&[
        ("name", &[("a", &["n1"]), ("b", &["n2"])]),
        ("since", &[("a", &["t1", "t3"]), ("b", &["t2"])]),
    ]);
    assert_eq!(key(&other).as_deref(), Some("name"));
    // One writer splits nothing; writers with the same values are not told apart.
    assert_eq!(key(&evidence(&[("controllerName", &[("a", &["a.io"])])])), None);
    assert_eq!(
        key(&evidence(&[("phase", &[("a", &["Ready"]), ("b", &["Ready"])])])),
        None
    );
    // A rollback of b's entry by a leaves a's own value and b's: b.io is said, not given.
    let rolled = evidence(&[("controllerName", &[("a", &["a.io", "b.io"]), ("b", &["b.io", "b2.io"])])]);
    let list = &keyed_lists(&rolled)[0];
    assert_eq!(list.owners["a"], "a.io");
    assert_eq!(list.owners["b"], "b2.io");
    assert_eq!(list.shared.keys().collect::<Vec<_>>(), ["b.io"]);
}

#[test]
fn quoted_values_read_back_as_they_were() {
    let values = [
        AWKWARD,
        "a\"b\\c",
        "line\nbreak\ttab",
        "nel\u{85}ls\u{2028}",
        "emoji \u{1F600}",
        "#not a comment",
        "- x",
        "[a, b]",
        "{a: b}",
        "* & ! | > % @ `",
    ];
    for value in values {
        let text = yaml_string(value);
        let back: Vec<String> = serde_saphyr::from_str(&format!("[{text}]")).unwrap();
        assert_eq!(back, [value], "{text}");
        let back: BTreeMap<String, String> = serde_saphyr::from_str(&format!("{text}: {text}\n")).unwrap();
        assert_eq!(back.get(value).map(String::as_str), Some(value), "{text}");
    }
}
