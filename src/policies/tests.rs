use super::*;

const DOC: &str = include_str!("../../examples/ownership.yaml");

fn rules(mode: &str) -> Ownership {
    Ownership::from_yaml(&DOC.replace("mode: enforce", &format!("mode: {mode}"))).unwrap()
}

fn kinds(objects: &[Value]) -> Vec<&str> {
    objects.iter().map(|o| o["kind"].as_str().unwrap()).collect()
}

#[test]
fn the_same_document_gives_the_same_bytes() {
    let a = serde_json::to_string(&policies("statusguard", &rules("trim"))).unwrap();
    let b = serde_json::to_string(&policies("statusguard", &rules("trim"))).unwrap();
    assert_eq!(a, b);
}

#[test]
fn enforce_denies_with_one_validation_over_every_violation() {
    let objects = policies("statusguard", &rules("enforce"));
    assert_eq!(
        kinds(&objects),
        ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    );
    let spec = &objects[0]["spec"];
    assert_eq!(objects[0]["metadata"]["name"], "statusguard.widgets.example.com");
    assert_eq!(spec["validations"].as_array().unwrap().len(), 1);
    assert_eq!(spec["validations"][0]["reason"], "Forbidden");
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(objects[1]["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(
        spec["matchConstraints"]["resourceRules"][0]["resources"],
        json!(["widgets/status"])
    );
    // Exempt groups and the nodes never reach the policy.
    let conditions = spec["matchConditions"].to_string();
    assert!(conditions.contains("system:masters") && conditions.contains("system:nodes"));
}

#[test]
fn audit_warns_once_per_owned_item_in_the_webhooks_words() {
    let rules = rules("audit");
    let objects = policies("statusguard", &rules);
    let validations = objects[0]["spec"]["validations"].as_array().unwrap();
    let items: usize = rules.resources()[0]
        .writers
        .iter()
        .map(|w| w.fields.len() + w.conditions.len())
        .sum();
    assert_eq!(validations.len(), items);
    assert_eq!(
        validations[0]["message"],
        "statusguard changed status.observedGeneration, owned by system:serviceaccount:platform:widget-controller"
    );
    assert_eq!(objects[1]["spec"]["validationActions"], json!(["Audit", "Warn"]));
    assert_eq!(objects[0]["spec"]["failurePolicy"], "Ignore");
}

#[test]
fn trim_restores_with_a_mutating_policy_behind_the_deny_one() {
    let objects = policies("sg", &rules("trim"));
    assert_eq!(
        kinds(&objects),
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding"
        ]
    );
    let mutating = &objects[2]["spec"];
    assert_eq!(mutating["failurePolicy"], "Ignore");
    assert_eq!(mutating["reinvocationPolicy"], "IfNeeded");
    // A mutation per field and per list, each applied to the object as the
    // ones before it left it.
    let mutations = mutating["mutations"].as_array().unwrap();
    let patches: Vec<&str> = mutations
        .iter()
        .map(|m| m["jsonPatch"]["expression"].as_str().unwrap())
        .collect();
    let fields = rules("trim").resources()[0]
        .writers
        .iter()
        .map(|w| w.fields.len())
        .sum::<usize>();
    assert_eq!(patches.len(), fields + 1, "{patches:#?}");
    let patch = patches.join("\n");
    // Never the whole conditions list: item by item.
    assert!(patch.contains(r#""/status/conditions" + "/" + string(i)"#), "{patch}");
    assert!(
        patch.contains(r#"JSONPatch{op: "remove", path: "/status/replicas"}"#),
        "{patch}"
    );
}

#[test]
fn a_resource_whose_writers_own_nothing_has_no_policy() {
    // The API server takes no ValidatingAdmissionPolicy without a validation.
    let doc = r#"
apiVersion: statusguard.dev/v1alpha1
kind: StatusOwnership
mode: audit
resources:
  - group: example.com
    resource: widgets
    writers:
      - serviceAccount: platform/widget-controller
"#;
    let rules = Ownership::from_yaml(doc).unwrap();
    assert!(policies("sg", &rules).is_empty());
}

#[test]
fn set_names_are_label_values_and_name_prefixes() {
    for good in ["statusguard", "sg.team-a", "a", &"a".repeat(63)] {
        assert_eq!(set_name(good).as_deref(), Ok(good));
    }
    for bad in ["", "Statusguard", "-sg", "sg.", "sg_a", "sg/a", &"a".repeat(64)] {
        assert!(set_name(bad).is_err(), "{bad:?}");
    }
    assert!(name_problems(&"a".repeat(63), &rules("enforce")).is_empty());
    // A group of 243 characters takes `sg.widgets.<group>` past 253.
    let group = vec!["g".repeat(60); 4].join(".");
    let doc = DOC.replace("group: example.com", &format!("group: {group}"));
    let long_group = Ownership::from_yaml(&doc).unwrap();
    let problems = name_problems("sg", &long_group);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("254 characters"), "{problems:?}");
}

#[test]
fn only_trim_is_a_deviation_of_the_document_itself() {
    assert!(deviations(&rules("enforce")).is_empty());
    assert!(deviations(&rules("audit")).is_empty());
    let trim = deviations(&rules("trim"));
    assert_eq!(trim.len(), 1);
    assert!(trim[0].starts_with("example.com/widgets: mode trim"), "{trim:?}");
}

#[test]
fn every_object_is_labelled_for_removal() {
    for object in policies("sg", &rules("trim")) {
        assert_eq!(object["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(object["apiVersion"], API_VERSION);
    }
}
