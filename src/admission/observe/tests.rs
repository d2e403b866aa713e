use serde_json::{Value, json};

use super::*;
use crate::admission::wire::{ReviewError, parse_request};
use crate::test_support::{body, widget_status_review};

/// A body as the request path copies it out: parsed once, then copied.
fn project(body: &[u8], rules: &Ownership) -> Result<Option<ReviewedWrite>, ReviewError> {
    parse_request(body).map(|request| ReviewedWrite::of(&request, StatusTexts::of(&request), rules))
}

/// A body copied out, then read as the observer reads it.
fn read_write(body: &[u8], rules: &Ownership) -> Result<Option<ObservedWrite>, String> {
    match project(body, rules).map_err(|e| e.to_string())? {
        Some(write) => read(write, rules).map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

fn rules() -> Ownership {
    Ownership::from_yaml(include_str!("../../../tests/fixtures/ownership.yaml")).unwrap()
}

fn review(writer: &str, old: Value, new: Value) -> Vec<u8> {
    body(&widget_status_review(writer, old, new))
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
            write.facts.writer.as_str(),
            write.facts.api_version().as_str(),
            write.facts.kind.as_str(),
            write.facts.uid.as_deref()
        ),
        ("system:serviceaccount:a:b", "example.com/v1", "Widget", Some("abc"))
    );
    assert_eq!(write.facts.namespace.as_deref(), Some("team-a"));
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

/// Gateway API's `status.parents`, as an implementation writes it.
fn parent(controller: &str, gateway: &str, accepted: &str) -> Value {
    json!({"controllerName": controller, "parentRef": {"name": gateway},
           "conditions": [{"type": "Accepted", "status": accepted, "message": "seen by the gateway"}]})
}

#[test]
fn changed_entries_of_an_undeclared_list_are_named_by_each_member_that_could_name_a_writer() {
    let old = json!({"parents": [parent("a.io/gw", "one", "True"), parent("b.io/gw", "two", "True")]});
    // a's entry changes; b's is untouched; a text member is never named.
    let mut new = json!({"parents": [parent("a.io/gw", "one", "False"), parent("b.io/gw", "two", "True")]});
    new["parents"][0]["note"] = json!("free text, not a name");
    assert_eq!(
        changed(old.clone(), new),
        ["status.parents", "status.parents[controllerName=\"a.io/gw\"]"]
    );
    // A full update that drops b's entry changes b's entries too.
    let dropped = json!({"parents": [parent("a.io/gw", "one", "True")], "other": [1, "x"]});
    assert_eq!(
        changed(old, dropped),
        [
            "status.other",
            "status.parents",
            "status.parents[controllerName=\"b.io/gw\"]"
        ]
    );
}

#[test]
fn a_declared_list_names_its_changed_entries_by_its_key_only() {
    let rules = Ownership::from_yaml(
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nresources:\n  - group: example.com\n    resource: widgets\n    lists: [{path: parents, key: controllerName}]\n",
    )
    .unwrap();
    let mut old = parent("a.io/gw", "one", "True");
    old["sectionName"] = json!("http");
    let new = json!({"parents": [parent("a.io/gw", "one", "False")]});
    let write = read_write(&review("x", json!({"parents": [old]}), new), &rules)
        .unwrap()
        .unwrap();
    let changed: Vec<String> = write.changed.iter().map(ToString::to_string).collect();
    assert_eq!(changed, ["status.parents[controllerName=\"a.io/gw\"]"]);
}

#[test]
fn entries_are_recorded_by_list_member_and_value_and_capped_apart() {
    let entry = |value: &str| Item::Entry {
        list: FieldPath::parse("parents").unwrap(),
        key: "controllerName".into(),
        value: value.into(),
    };
    let mut observer = Observer::new(4, 2, 1 << 20);
    let mut first = write("a", &["x", "condition Ready"]);
    first.changed.extend([entry("a.io/gw"), entry("b.io/gw")]);
    observer.record(&first);
    let mut second = write("a", &[]);
    second.changed.extend([entry("a.io/gw"), entry("c.io/gw")]);
    observer.record(&second);
    let snapshot = observer.snapshot();
    let a = &snapshot.resources[0].writers[0];
    let values = &a.entries["parents"]["controllerName"];
    assert_eq!(values.get("a.io/gw"), Some(&2));
    assert_eq!(values.get("b.io/gw"), Some(&1));
    assert!(!values.contains_key("c.io/gw"), "past the cap of 2 values: {a:?}");
    assert_eq!(a.fields.get(OTHER_ITEM), Some(&1));
    // The fields and conditions kept their own cap.
    assert_eq!((a.fields.get("x"), a.conditions.get("Ready")), (Some(&1), Some(&1)));
    let json = serde_json::to_value(&snapshot).unwrap();
    assert_eq!(
        json["resources"][0]["writers"][0]["entries"]["parents"]["controllerName"]["a.io/gw"],
        2
    );
    // A record from before entries were kept still reads.
    let older: ObservedWriters = serde_json::from_value(json!({"resources": [{"group": "g", "resource": "r",
        "writers": [{"identity": "a", "writes": 1, "fields": {}, "conditions": {}}]}], "identities": 1, "cappedWrites": 0}))
    .unwrap();
    assert!(older.resources[0].writers[0].entries.is_empty());
}

fn write(writer: &str, items: &[&str]) -> ObservedWrite {
    ObservedWrite {
        facts: WriteFacts {
            writer: writer.to_owned(),
            group: "example.com".into(),
            version: "v1".into(),
            resource: "widgets".into(),
            kind: "Widget".into(),
            name: "w".into(),
            namespace: None,
            uid: None,
            dry_run: false,
        },
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
    let mut observer = Observer::new(2, 2, 1 << 20);
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

#[test]
fn a_long_name_is_cut_on_a_character_boundary_with_a_marker() {
    assert_eq!(cut_to("short", 10), "short");
    assert_eq!(cut_to("exactly10!", 10), "exactly10!");
    let cut = cut_to("ééééééé", 10);
    assert_eq!(cut, "ééé\u{2026}", "2-byte characters and a 3-byte marker in 10 bytes");
    assert!(cut.len() <= 10 && is_cut(&cut), "{cut}");
    assert!(!is_cut("plain"));
    let long = "x".repeat(1 << 20);
    assert_eq!(cut_name(&long).len(), MAX_NAME_BYTES);
}

proptest::proptest! {
    /// Every cut is within its bound, a prefix of the name plus the marker,
    /// and names that fit are kept whole.
    #[test]
    fn a_cut_name_fits_and_keeps_its_start(name in "\\PC{0,80}", max in 3usize..60) {
        let cut = cut_to(&name, max);
        proptest::prop_assert!(cut.len() <= max);
        if name.len() <= max {
            proptest::prop_assert_eq!(cut.as_ref(), name.as_str());
        } else {
            let kept = cut.strip_suffix(CUT_MARKER).expect("the marker");
            proptest::prop_assert!(name.starts_with(kept));
        }
    }
}

/// A forged review: 1 MiB user name, status keys and condition types.
fn forged(writer: &str, key: &str, ty: &str) -> Vec<u8> {
    review(
        writer,
        json!({}),
        json!({key: 1, "conditions": [{"type": ty, "status": "True"}]}),
    )
}

#[test]
fn long_names_are_cut_in_the_copy_and_in_the_record_and_the_counts_kept() {
    let huge = |c: &str| c.repeat(1 << 20);
    let write = read_write(&forged(&huge("u"), &huge("k"), &huge("T")), &rules())
        .unwrap()
        .unwrap();
    assert_eq!(write.facts.writer.len(), MAX_NAME_BYTES);
    let mut observer = Observer::new(256, 256, 1 << 20);
    for _ in 0..3 {
        let identity = observer.record(&write);
        assert!(identity.len() <= MAX_NAME_BYTES && is_cut(&identity));
    }
    let snapshot = observer.snapshot();
    let writer = &snapshot.resources[0].writers[0];
    assert_eq!(writer.writes, 3);
    let field = writer.fields.keys().next().unwrap();
    let condition = writer.conditions.keys().next().unwrap();
    assert!(field.len() <= MAX_NAME_BYTES && is_cut(field), "{}", field.len());
    assert!(condition.len() <= MAX_NAME_BYTES && is_cut(condition));
    assert_eq!((writer.fields[field], writer.conditions[condition]), (3, 3));
    assert!(serde_json::to_vec(&snapshot).unwrap().len() < 4 * MAX_NAME_BYTES);
}

#[test]
fn the_copy_out_keeps_the_statuses_and_the_facts_only() {
    let body = review("someone", json!({"replicas": 1}), json!({"replicas": 2}));
    let write = project(&body, &rules()).unwrap().unwrap();
    let statuses = r#"{"replicas":1}"#.len() + r#"{"replicas":2}"#.len();
    assert_eq!(write.bytes(), write.facts.bytes() + statuses);
    assert!(write.bytes() < body.len() / 2, "{} of {}", write.bytes(), body.len());
    // A null dryRun or object is read as absent.
    let mut v: Value = serde_json::from_slice(&body).unwrap();
    v["request"]["dryRun"] = Value::Null;
    v["request"]["object"] = Value::Null;
    let write = project(&serde_json::to_vec(&v).unwrap(), &rules()).unwrap().unwrap();
    assert!(!write.facts.dry_run && write.facts.uid.is_none());
}

proptest::proptest! {
    /// Whatever names writes carry, the record's JSON stays within what its
    /// caps allow, and every write is counted once.
    #[test]
    fn the_record_is_bounded_in_bytes_by_its_caps(
        writes in proptest::collection::vec(
            ("[a-z]{1,3}", 0usize..2000, proptest::collection::vec(("[a-zA-Z]{1,4}", 0usize..2000, proptest::bool::ANY), 0..6)),
            1..60,
        )
    ) {
        let (max_identities, max_items, max_bytes) = (8, 4, 16 * 1024);
        let mut observer = Observer::new(max_identities, max_items, max_bytes);
        for (writer, pad, items) in &writes {
            let items: Vec<String> = items
                .iter()
                .map(|(name, pad, condition)| {
                    let name = format!("{name}{}", "x".repeat(*pad));
                    if *condition { format!("condition {name}") } else { name }
                })
                .collect();
            let items: Vec<&str> = items.iter().map(String::as_str).collect();
            let identity = observer.record(&write(&format!("{writer}{}", "y".repeat(*pad)), &items));
            proptest::prop_assert!(identity.len() <= MAX_NAME_BYTES);
        }
        let snapshot = observer.snapshot();
        let counted: u64 = snapshot.resources.iter().flat_map(|r| &r.writers).map(|w| w.writes).sum();
        proptest::prop_assert_eq!(counted, writes.len() as u64);
        proptest::prop_assert!(snapshot.identities <= max_identities);
        let json = serde_json::to_vec(&snapshot).unwrap().len();
        // The names' budget, and the (other) entries and counts around them.
        let others = (max_identities + 1) * (max_items + 2) * 64;
        proptest::prop_assert!(json <= max_bytes + others, "{} bytes", json);
    }
}

/// A status of two keyed lists' worth of items, as a Gateway route's or a
/// Widget's: `parents` entries keyed by `controllerName`, `conditions` by
/// type, each item drawn from a few shapes that the same value can be
/// written in (a number as `1` or `1.0`, a string escaped or not, a
/// member `null` or absent, a key written twice, members reordered).
fn item_strategy(key: &'static str) -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let owner = prop_oneof![
        Just("\"a.io/gw\""),
        Just("\"b.io/gw\""),
        Just("\"\\u0061.io/gw\""),
        Just("7"),
    ];
    let value = prop_oneof![
        Just("1"),
        Just("1.0"),
        Just("2"),
        Just("null"),
        Just("\"x\""),
        Just("\"\\u0078\""),
        Just("[1,{\"a\":1}]"),
        Just("{\"a\":1,\"b\":null}"),
        Just("{\"b\":2,\"a\":1}"),
    ];
    let member = (prop_oneof![Just("s"), Just("t"), Just(key)], value.clone());
    (owner, proptest::collection::vec(member, 0..4), value, any::<bool>()).prop_map(
        move |(owner, members, extra, owner_last)| {
            let mut parts: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let owned = format!("\"{key}\":{owner}");
            match owner_last {
                true => parts.push(owned),
                false => parts.insert(0, owned),
            }
            if extra != "null" {
                parts.push(format!("\"m\":{extra}"));
            }
            format!("{{{}}}", parts.join(","))
        },
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

    /// What a write changed is the same whether its lists of items are
    /// told from their text or built and compared.
    #[test]
    fn lists_told_from_their_text_change_what_built_lists_change(
        old_parents in proptest::collection::vec(item_strategy("controllerName"), 0..5),
        new_parents in proptest::collection::vec(item_strategy("controllerName"), 0..5),
        old_conditions in proptest::collection::vec(item_strategy("type"), 0..4),
        new_conditions in proptest::collection::vec(item_strategy("type"), 0..4),
        keep in proptest::collection::vec(proptest::bool::ANY, 5),
        odd in 0u8..4,
    ) {
        // New lists that keep some of the old items as they are, as a
        // stale retry or an own write does.
        let kept = |old: &[String], new: &[String]| -> Vec<String> {
            let mut out: Vec<String> = old.iter().zip(&keep).filter(|(_, k)| **k).map(|(i, _)| i.clone()).collect();
            out.extend(new.iter().cloned());
            out
        };
        let list = |items: &[String]| format!("[{}]", items.join(","));
        let new_parents = kept(&old_parents, &new_parents);
        let new_conditions = kept(&old_conditions, &new_conditions);
        // Now and then a list that is not a list of objects.
        let new_conditions = match odd {
            0 => "[1,\"x\"]".to_owned(),
            1 => "{\"type\":\"A\"}".to_owned(),
            _ => list(&new_conditions),
        };
        let old = format!("{{\"parents\":{},\"conditions\":{}}}", list(&old_parents), list(&old_conditions));
        let new = format!("{{\"parents\":{},\"conditions\":{new_conditions}}}", list(&new_parents));
        let keyed = Ownership::from_yaml(
            "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nresources:\n  - group: example.com\n    resource: widgets\n    lists: [{path: parents, key: controllerName}]\n    writers:\n      - user: a\n        conditions: [A]\n",
        )
        .unwrap();
        for rules in [keyed, rules()] {
            let resource = rules.resource("example.com", "widgets").unwrap();
            let by_text = changed_items_reading(resource, Some(&old), Some(&new), true).map_err(|e| e.to_string());
            let built = changed_items_reading(resource, Some(&old), Some(&new), false).map_err(|e| e.to_string());
            proptest::prop_assert_eq!(by_text, built, "old {} new {}", old, new);
        }
    }
}

/// A Gateway route's stale retry (`examples/`): every one of its 32
/// entries is rewritten, those of both implementations change, and that
/// is told from their text, as building them tells it.
#[test]
fn a_routes_stale_retry_is_told_from_its_text() {
    let review: Value =
        serde_json::from_str(include_str!("../../../examples/gateway-route-stale-review.json")).unwrap();
    let rules = Ownership::from_yaml(include_str!("../../../examples/gateway-api.yaml")).unwrap();
    let resource = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    let status = |object: &str| review["request"][object]["status"].to_string();
    let (old, new) = (status("oldObject"), status("object"));
    let (old_members, new_members) = (members(Some(&old)).unwrap(), members(Some(&new)).unwrap());
    let declared: Vec<&FieldPath> = resource.writers.iter().flat_map(|w| &w.fields).collect();
    let readers = Readers::of(resource, &declared, "parents");
    let told = items_changed_by_text(
        resource,
        &readers,
        old_members.get("parents"),
        new_members.get("parents"),
    )
    .expect("told from the text");
    let told: Vec<String> = told.iter().map(ToString::to_string).collect();
    assert_eq!(
        told,
        [
            "status.parents[controllerName=\"gateway.envoyproxy.io/gatewayclass-controller\"]",
            "status.parents[controllerName=\"istio.io/gateway-controller\"]"
        ]
    );
    let by_text = changed_items_reading(resource, Some(&old), Some(&new), true).unwrap();
    let built = changed_items_reading(resource, Some(&old), Some(&new), false).unwrap();
    assert_eq!(by_text, built);
}

#[test]
fn a_statuss_members_are_read_as_a_parse_reads_them() {
    let deep = |levels: usize| format!("{{\"d\": {}1{}}}", "[".repeat(levels), "]".repeat(levels));
    // A key written twice; values nested deeper than the skip reads (which
    // serde_json then reads); not JSON; not an object.
    for text in [
        r#"{"a": 1, "b": {"c": [1, "x"]}, "a" : 2}"#.to_owned(),
        deep(100),
        deep(200),
        r#"{"a": 1,}"#.to_owned(),
        r#"{"a": 1} x"#.to_owned(),
        "[1]".to_owned(),
    ] {
        let parsed: Result<BTreeMap<String, &RawValue>, _> = match text.starts_with('{') {
            true => serde_json::from_str(&text),
            false => Ok(BTreeMap::new()),
        };
        let read = members(Some(&text));
        match (read, parsed) {
            (Ok(read), Ok(parsed)) => {
                let read: BTreeMap<String, &str> = read.into_iter().map(|(k, v)| (k.into_owned(), v)).collect();
                let parsed: BTreeMap<String, &str> = parsed.into_iter().map(|(k, v)| (k, v.get())).collect();
                assert_eq!(read, parsed, "{text}");
            }
            (Err(_), Err(_)) => {}
            (read, parsed) => panic!("{text}: read {read:?}, parsed {parsed:?}"),
        }
    }
}

/// A write whose lists hold more members than the observer's budget of
/// values is unreadable whether they are told from their text or built:
/// the text path counts the members it holds as building them would.
#[test]
fn lists_over_the_budget_are_unreadable_either_way() {
    let rules = Ownership::from_yaml(include_str!("../../../examples/gateway-api.yaml")).unwrap();
    let resource = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    let entry = |controller: &str, generation: u32| {
        let members: Vec<String> = (0..50).map(|i| format!("\"m{i}\":{generation}")).collect();
        format!("{{\"controllerName\":\"{controller}\",{}}}", members.join(","))
    };
    let status = |generation| {
        let entries: Vec<String> = (0..40)
            .map(|i| entry(&format!("c{}.io/gw", i % 2), generation))
            .collect();
        format!("{{\"parents\":[{}]}}", entries.join(","))
    };
    let (old, new) = (status(1), status(2));
    for by_text in [true, false] {
        assert!(changed_items_reading(resource, Some(&old), Some(&new), by_text).is_ok());
        let _budget = crate::value_budget::ValueBudget::enter(16 * 1024);
        assert!(
            changed_items_reading(resource, Some(&old), Some(&new), by_text).is_err(),
            "by text: {by_text}"
        );
    }
}
