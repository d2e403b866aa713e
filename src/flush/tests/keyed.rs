//! Keyed entries (issue 24): the list the patch sends, and the declarations
//! a writer refuses before any write.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::super::patch::merge_keyed;
use super::{object, test_api};
use crate::flush::{FlushError, Owned, StatusWriter, status_merge_patch};
use crate::ownership::{FieldPath, GroupResource, KeyedList, Ownership};

const ENVOY: &str = "gateway.envoyproxy.io/gatewayclass-controller";
const ISTIO: &str = "istio.io/gateway-controller";

fn parents() -> KeyedList {
    KeyedList {
        path: FieldPath::parse("parents").unwrap(),
        key: "controllerName".to_owned(),
    }
}

/// A `status.parents` entry: the Gateway it is for, whose it is, and a state.
fn entry(gateway: &str, controller: &str, accepted: &str) -> Value {
    json!({"parentRef": {"name": gateway}, "controllerName": controller, "accepted": accepted})
}

fn envoy_owns() -> BTreeSet<String> {
    [ENVOY.to_owned()].into()
}

fn merge(staged: &[Value], stored: &[Value]) -> Vec<Value> {
    merge_keyed(&parents(), staged, stored, &envoy_owns())
}

#[test]
fn the_writers_entries_go_as_staged_and_every_other_entry_as_stored() {
    let owned = Owned::default().with_entries(parents(), [ENVOY]);
    let conditions = FieldPath::parse("conditions").unwrap();
    let undeclared = entry("c", "example.com/nobody", "True");
    let keyless = json!({"parentRef": {"name": "d"}});
    // A stale copy: istio has since changed its entry and someone added two.
    let staged = object(
        "7",
        json!({"parents": [entry("a", ENVOY, "True"), entry("b", ISTIO, "Stale")]}),
    );
    let stored = object(
        "9",
        json!({"parents": [entry("a", ENVOY, "Old"), entry("b", ISTIO, "Fresh"), undeclared, keyless]}),
    );
    let patch = status_merge_patch(&owned, &conditions, &staged, &stored, "7");
    assert_eq!(
        patch,
        json!({"metadata": {"resourceVersion": "7"}, "status": {"parents": [
            entry("a", ENVOY, "True"), entry("b", ISTIO, "Fresh"), undeclared, keyless]}})
    );
    // Without a staged list nothing is sent: the entries stay as stored.
    let bare = object("7", json!({"replicas": 1}));
    assert_eq!(
        status_merge_patch(&owned, &conditions, &bare, &stored, "7"),
        json!({"metadata": {"resourceVersion": "7"}})
    );
}

#[test]
fn merged_lists_keep_the_stored_order_and_the_writers_places() {
    let (ea, eb, ec) = (
        entry("a", ENVOY, "True"),
        entry("b", ENVOY, "True"),
        entry("c", ENVOY, "True"),
    );
    let ea2 = entry("a", ENVOY, "False");
    let (ia, ib) = (entry("a", ISTIO, "True"), entry("b", ISTIO, "True"));
    // (what, staged, stored, merged)
    let cases = [
        (
            "a changed entry takes the place of the stored one",
            vec![ea2.clone(), ia.clone()],
            vec![ia.clone(), ea.clone(), ib.clone()],
            vec![ia.clone(), ea2.clone(), ib.clone()],
        ),
        (
            "a new entry follows the list",
            vec![ea.clone(), eb.clone()],
            vec![ea.clone(), ia.clone()],
            vec![ea.clone(), ia.clone(), eb.clone()],
        ),
        (
            "an entry the writer no longer stages is removed",
            vec![eb.clone()],
            vec![ea.clone(), ia.clone(), eb.clone()],
            vec![ia.clone(), eb.clone()],
        ),
        (
            "an unchanged entry stays where it stood, the changed one takes the other place",
            vec![eb.clone(), ea2.clone()],
            vec![ea.clone(), ia.clone(), eb.clone()],
            vec![ea2.clone(), ia.clone(), eb.clone()],
        ),
        (
            "the staged order of others' entries moves nothing",
            vec![ib.clone(), ia.clone(), ea.clone()],
            vec![ia.clone(), ea.clone(), ib.clone()],
            vec![ia.clone(), ea.clone(), ib.clone()],
        ),
        (
            "entries compare as a multiset: a duplicate is one of two",
            vec![ea.clone()],
            vec![ea.clone(), ea.clone(), ia.clone()],
            vec![ea.clone(), ia.clone()],
        ),
        (
            "an entry staged under another's key is not sent",
            vec![entry("z", ISTIO, "Forged")],
            vec![ia.clone()],
            vec![ia.clone()],
        ),
        (
            "an empty staged list removes only the writer's entries",
            vec![],
            vec![ea.clone(), ia.clone(), ec.clone()],
            vec![ia.clone()],
        ),
        (
            "a list the server lacks: the writer's entries alone",
            vec![ia.clone(), ec.clone()],
            vec![],
            vec![ec.clone()],
        ),
    ];
    for (what, staged, stored, merged) in cases {
        assert_eq!(merge(&staged, &stored), merged, "{what}");
    }
}

#[test]
fn a_writer_owning_two_key_values_keeps_each_entry_in_its_own_place() {
    let owned: BTreeSet<String> = [ENVOY.to_owned(), "envoy/internal".to_owned()].into();
    let stored = [
        entry("a", "envoy/internal", "True"),
        entry("a", ISTIO, "True"),
        entry("a", ENVOY, "True"),
    ];
    let staged = [entry("a", ENVOY, "False"), entry("a", "envoy/internal", "False")];
    assert_eq!(
        merge_keyed(&parents(), &staged, &stored, &owned),
        [
            entry("a", "envoy/internal", "False"),
            entry("a", ISTIO, "True"),
            entry("a", ENVOY, "False"),
        ]
    );
}

fn writer() -> StatusWriter<kube::api::DynamicObject> {
    StatusWriter::new(test_api())
}

#[tokio::test]
async fn a_list_that_overlaps_a_field_the_conditions_or_another_list_is_refused() {
    let overlaps = |result: Result<StatusWriter<_>, FlushError>, what: &str| match result {
        Err(FlushError::ListOverlaps { list, other }) => format!("{list} / {other}"),
        other => panic!("{what}: {other:?}"),
    };
    let field_first =
        writer()
            .owned_fields(["parents.count"])
            .unwrap()
            .owned_entries("parents", "controllerName", [ENVOY]);
    assert_eq!(
        overlaps(field_first, "field, then list"),
        "parents / the owned field status.parents.count"
    );
    let list_first = writer()
        .owned_entries("routes.parents", "controllerName", [ENVOY])
        .unwrap()
        .owned_fields(["routes"]);
    assert_eq!(
        overlaps(list_first, "list, then field"),
        "routes.parents / the owned field status.routes"
    );
    assert_eq!(
        overlaps(
            writer().owned_entries("conditions", "type", ["Ready"]),
            "the conditions"
        ),
        "conditions / the conditions list at status.conditions"
    );
    let moved = writer()
        .owned_entries("health", "name", ["a"])
        .unwrap()
        .conditions_path("health.conditions");
    assert_eq!(
        overlaps(moved, "conditions moved below a list"),
        "health / the conditions list at status.health.conditions"
    );
    let nested = writer()
        .owned_entries("parents", "controllerName", [ENVOY])
        .unwrap()
        .owned_entries("parents.extra", "name", ["x"]);
    assert_eq!(
        overlaps(nested, "a list below a list"),
        "parents.extra / the keyed list status.parents (key \"controllerName\")"
    );
    let rekeyed = writer()
        .owned_entries("parents", "controllerName", [ENVOY])
        .unwrap()
        .owned_entries("parents", "name", ["x"]);
    overlaps(rekeyed, "the same list under another key");
}

#[tokio::test]
async fn a_list_without_a_key_member_or_with_an_empty_value_is_refused_and_the_same_list_adds_up() {
    for (path, key, value) in [("parents", "", ENVOY), ("parents", "controllerName", "")] {
        assert!(
            matches!(
                writer().owned_entries(path, key, [value]),
                Err(FlushError::InvalidList { .. })
            ),
            "{key:?} {value:?}"
        );
    }
    for bad in ["", "a..b", ".parents"] {
        assert!(
            matches!(
                writer().owned_entries(bad, "controllerName", [ENVOY]),
                Err(FlushError::InvalidPath(_))
            ),
            "{bad:?}"
        );
    }
    let both = writer()
        .owned_entries("parents", "controllerName", [ENVOY])
        .unwrap()
        .owned_entries("parents", "controllerName", ["envoy/internal"])
        .unwrap();
    assert_eq!(
        both.owned.entries(),
        [(
            parents(),
            BTreeSet::from([ENVOY.to_owned(), "envoy/internal".to_owned()])
        )]
    );
}

#[tokio::test]
async fn a_writer_from_the_gateway_api_document_owns_its_entries_of_each_list() {
    let ownership = Ownership::from_yaml(include_str!("../../../examples/gateway-api.yaml")).unwrap();
    let envoy = "system:serviceaccount:envoy-gateway-system:envoy-gateway";
    let group = "gateway.networking.k8s.io";
    let routes =
        StatusWriter::for_writer(test_api(), &ownership, &GroupResource::new(group, "httproutes"), envoy).unwrap();
    assert_eq!(routes.owned.entries(), [(parents(), envoy_owns())]);
    assert!(routes.owned.fields().is_empty() && routes.owned.conditions().is_empty());
    let policies = StatusWriter::for_writer(
        test_api(),
        &ownership,
        &GroupResource::new(group, "backendtlspolicies"),
        envoy,
    )
    .unwrap();
    let ancestors = KeyedList {
        path: FieldPath::parse("ancestors").unwrap(),
        key: "controllerName".to_owned(),
    };
    assert_eq!(policies.owned.entries(), [(ancestors, envoy_owns())]);
    let nobody = StatusWriter::for_writer(
        test_api(),
        &ownership,
        &GroupResource::new(group, "httproutes"),
        "nobody",
    )
    .unwrap();
    assert_eq!(nobody.owned, Owned::default(), "an unlisted writer owns no entry");
}

/// Entries of a few owners (ours, another's, an undeclared one, none),
/// each with a small state, so that equal entries occur often.
fn entries() -> impl Strategy<Value = Vec<Value>> {
    let key = prop_oneof![Just(Some(ENVOY)), Just(Some(ISTIO)), Just(Some("other")), Just(None)];
    let one = (key, 0..3u8, 0..3u8).prop_map(|(key, gateway, state)| {
        let mut entry = json!({"parentRef": {"name": gateway.to_string()}, "state": state});
        if let Some(key) = key {
            entry["controllerName"] = json!(key);
        }
        entry
    });
    proptest::collection::vec(one, 0..8)
}

fn conditions_of() -> impl Strategy<Value = Vec<Value>> {
    let one = (prop_oneof![Just("Ready"), Just("Scaled"), Just("Other")], 0..2u8)
        .prop_map(|(ty, status)| json!({"type": ty, "status": status.to_string()}));
    proptest::collection::vec(one, 0..4)
}

fn sorted(mut items: Vec<Value>) -> Vec<Value> {
    items.sort_by_key(Value::to_string);
    items
}

fn owned_by(items: &[Value], member: &str, owned: &BTreeSet<String>, wanted: bool) -> Vec<Value> {
    items
        .iter()
        .filter(|item| {
            item.get(member)
                .and_then(Value::as_str)
                .is_some_and(|k| owned.contains(k))
                == wanted
        })
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// For the conditions and a keyed list alike (one merge serves both),
    /// after the patch is applied to the stored object: the writer's items
    /// are the staged ones (as a multiset), every other item is as stored
    /// and in the stored order, and a writer that changed nothing of its own
    /// leaves the list exactly as stored.
    #[test]
    fn the_writers_items_end_as_staged_and_every_other_item_as_stored(
        staged_parents in entries(),
        stored_parents in entries(),
        staged_conditions in conditions_of(),
        stored_conditions in conditions_of(),
        ours_too in any::<bool>(),
    ) {
        let mut values = envoy_owns();
        if ours_too {
            values.insert("other".to_owned());
        }
        let types: BTreeSet<String> = ["Ready".to_owned()].into();
        let owned = Owned::new(Vec::<FieldPath>::new(), types.iter().cloned()).with_entries(parents(), values.iter().cloned());
        let conditions = FieldPath::parse("conditions").unwrap();
        let staged = object("7", json!({"parents": staged_parents, "conditions": staged_conditions}));
        let stored = object("9", json!({"parents": stored_parents, "conditions": stored_conditions}));
        let patch = status_merge_patch(&owned, &conditions, &staged, &stored, "9");
        let mut merged = stored.clone();
        json_patch::merge(&mut merged, &patch);

        for (member, owned_keys, staged_list, stored_list, merged_list) in [
            ("controllerName", &values, &staged_parents, &stored_parents, merged["status"]["parents"].as_array()),
            ("type", &types, &staged_conditions, &stored_conditions, merged["status"]["conditions"].as_array()),
        ] {
            let merged_list = merged_list.cloned().unwrap_or_default();
            prop_assert_eq!(
                sorted(owned_by(&merged_list, member, owned_keys, true)),
                sorted(owned_by(staged_list, member, owned_keys, true)),
                "{}: the writer's items", member
            );
            prop_assert_eq!(
                owned_by(&merged_list, member, owned_keys, false),
                owned_by(stored_list, member, owned_keys, false),
                "{}: the others' items, in order", member
            );
            if sorted(owned_by(staged_list, member, owned_keys, true))
                == sorted(owned_by(stored_list, member, owned_keys, true))
            {
                prop_assert_eq!(&merged_list, stored_list, "{}: nothing of ours changed", member);
            }
        }
        // Flushing the same staged object again changes nothing.
        let again = status_merge_patch(&owned, &conditions, &staged, &merged, "10");
        let mut twice = merged.clone();
        json_patch::merge(&mut twice, &again);
        prop_assert_eq!(&twice["status"], &merged["status"]);
    }
}
