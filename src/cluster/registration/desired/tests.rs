use super::*;
use serde_json::{Value, json};

fn registration() -> Registration {
    Registration {
        name: "statusguard".to_owned(),
        target: "statusguard/statusguard:443".parse().unwrap(),
        ca: CaSource::None,
        failure_policy: FailurePolicy::Fail,
        timeout_seconds: 5,
        namespace_selector: None,
        object_selector: None,
        resync: Duration::from_secs(60),
        ownership_configmap: None,
    }
}

/// No version found for any resource: each rule names the document's, or `*`.
fn unresolved() -> ResolvedVersions {
    ResolvedVersions::new()
}

fn rules(text: &str) -> Ownership {
    Ownership::from_yaml(text).unwrap()
}

/// An ownership document of `resources`, one flow mapping each.
fn document(resources: &[&str]) -> String {
    let mut text = String::from("apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\n");
    if !resources.is_empty() {
        text.push_str("resources:\n");
    }
    for resource in resources {
        text.push_str(&format!("  - {resource}\n"));
    }
    text
}

const MIXED: &str = r#"
apiVersion: statusguard.dev/v1alpha1
kind: StatusOwnership
mode: enforce
exempt: {users: [breakglass, "o'brien"], groups: ["system:masters"]}
resources:
  - {group: example.com, resource: widgets, writers: [{user: a, fields: [x]}]}
  - {group: example.com, resource: gadgets, mode: trim, writers: [{user: a, fields: [x]}]}
  - {group: example.com, resource: gizmos, mode: audit}
"#;

fn json_of<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}

#[test]
fn one_webhook_per_mode_with_the_resources_of_that_mode() {
    let configurations = desired(&registration(), &rules(MIXED), &unresolved(), Some(b"PEM"));
    let validating = json_of(&configurations.validating);
    assert_eq!(validating["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(validating["kind"], "ValidatingWebhookConfiguration");
    let hooks = validating["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2);
    assert_eq!(hooks[0]["name"], "validate.statusguard.statusguard.dev");
    assert_eq!(hooks[0]["failurePolicy"], "Fail");
    assert_eq!(
        hooks[0]["rules"],
        json!([
            {"apiGroups": ["example.com"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["widgets/status"], "scope": "*"},
            {"apiGroups": ["example.com"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["gadgets/status"], "scope": "*"},
        ])
    );
    assert_eq!(
        hooks[0]["clientConfig"],
        json!({"service": {"namespace": "statusguard", "name": "statusguard", "path": "/validate", "port": 443}, "caBundle": "UEVN"})
    );
    // Audit resources: nothing is enforced for them, so never Fail.
    assert_eq!(hooks[1]["name"], "audit.statusguard.statusguard.dev");
    assert_eq!(hooks[1]["failurePolicy"], "Ignore");
    assert_eq!(hooks[1]["rules"][0]["resources"], json!(["gizmos/status"]));
    assert_eq!(hooks[1]["clientConfig"]["service"]["path"], "/validate");

    let mutating = json_of(&configurations.mutating);
    let hooks = mutating["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0]["rules"][0]["resources"], json!(["gadgets/status"]));
    assert_eq!(hooks[0]["reinvocationPolicy"], "IfNeeded");
    assert_eq!(hooks[0]["clientConfig"]["service"]["path"], "/mutate");
}

#[test]
fn no_resources_of_a_kind_means_no_webhook_of_that_kind() {
    let only_enforce = rules(&document(&["{group: example.com, resource: widgets}"]));
    let configurations = desired(&registration(), &only_enforce, &unresolved(), None);
    assert_eq!(configurations.validating.webhooks.as_ref().unwrap().len(), 1);
    assert_eq!(configurations.mutating.webhooks, Some(vec![]));
    assert!(
        json_of(&configurations.validating)["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none()
    );
    let empty = rules(&document(&[]));
    assert_eq!(
        desired(&registration(), &empty, &unresolved(), None)
            .validating
            .webhooks,
        Some(vec![])
    );
}

#[test]
fn exempt_identities_and_the_nodes_never_reach_the_webhook() {
    let conditions = match_conditions(&rules(MIXED));
    assert_eq!(
        json_of(&conditions),
        json!([
            {"name": "not-an-exempt-user", "expression": r#"!(request.userInfo.username in ["breakglass", "o'brien"])"#},
            {"name": "not-an-exempt-group",
             "expression": r#"!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in ["system:masters", "system:nodes"]))"#},
        ])
    );
    // Without exempt users, only the groups' condition, which always holds system:nodes.
    let plain = rules(&document(&[]));
    let conditions = match_conditions(&plain);
    assert_eq!(conditions.len(), 1);
    assert!(conditions[0].expression.contains(r#"["system:nodes"]"#));
    // Every webhook carries them.
    let configurations = desired(&registration(), &rules(MIXED), &unresolved(), None);
    for hook in configurations.validating.webhooks.unwrap() {
        assert_eq!(hook.match_conditions.unwrap().len(), 2);
    }
}

#[test]
fn the_selectors_reach_every_webhook() {
    let selector: LabelSelector = serde_json::from_value(json!({"matchLabels": {"guard": "yes"}})).unwrap();
    let registration = Registration {
        object_selector: Some(selector.clone()),
        namespace_selector: Some(selector.clone()),
        ..registration()
    };
    let configurations = desired(&registration, &rules(MIXED), &unresolved(), None);
    for hook in configurations.validating.webhooks.unwrap() {
        assert_eq!(hook.object_selector.as_ref(), Some(&selector));
        assert_eq!(hook.namespace_selector.as_ref(), Some(&selector));
    }
    let mutate = &configurations.mutating.webhooks.unwrap()[0];
    assert_eq!(mutate.object_selector.as_ref(), Some(&selector));
}

#[test]
fn the_ownership_configmap_is_checked_at_the_door_and_never_blocked() {
    let configmap: ConfigMapRef = "ops/o'wnership".parse().unwrap();
    let with_door = Registration {
        ownership_configmap: Some(configmap),
        ..registration()
    };
    let hooks = desired(&with_door, &rules(MIXED), &unresolved(), None)
        .validating
        .webhooks
        .unwrap();
    let door = hooks
        .iter()
        .find(|h| h.name == "ownership.statusguard.statusguard.dev")
        .expect("the ConfigMap's own webhook");
    assert_eq!(
        json_of(door),
        json!({
            "name": "ownership.statusguard.statusguard.dev",
            "clientConfig": {"service": {"namespace": "statusguard", "name": "statusguard",
                                          "path": "/validate-ownership", "port": 443}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                       "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
            "failurePolicy": "Ignore",
            "matchPolicy": "Equivalent",
            "matchConditions": [{"name": "the-ownership-configmap",
                                 "expression": r#"object.metadata.name == "o'wnership""#}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        })
    );
    // The status webhooks are as without it.
    let without = desired(&registration(), &rules(MIXED), &unresolved(), None);
    assert_eq!(hooks.len(), without.validating.webhooks.unwrap().len() + 1);
}

#[test]
fn targets_parse_from_a_service_or_a_url() {
    assert_eq!(
        "ns/name:8443".parse::<WebhookTarget>(),
        Ok(WebhookTarget::Service {
            namespace: "ns".into(),
            name: "name".into(),
            port: 8443
        })
    );
    let url: WebhookTarget = "https://127.0.0.1:9443/".parse().unwrap();
    assert_eq!(
        url.client_config("mutate", None).url.as_deref(),
        Some("https://127.0.0.1:9443/mutate")
    );
    for bad in ["ns/name", "name:443", "ns/name:0", "/name:443", "ns/name:http"] {
        assert!(bad.parse::<WebhookTarget>().is_err(), "{bad}");
    }
}

#[test]
fn the_same_rules_give_the_same_configurations() {
    let a = desired(&registration(), &rules(MIXED), &unresolved(), Some(b"x"));
    let b = desired(&registration(), &rules(MIXED), &unresolved(), Some(b"x"));
    assert_eq!(
        serde_json::to_vec(&a.validating).unwrap(),
        serde_json::to_vec(&b.validating).unwrap()
    );
}

#[test]
fn a_resource_may_have_its_own_failure_policy_and_timeout() {
    let text = document(&[
        "{group: example.com, resource: widgets}",
        "{group: example.com, resource: gadgets, failurePolicy: Ignore, timeoutSeconds: 10}",
        "{group: example.com, resource: gizmos, failurePolicy: Ignore, timeoutSeconds: 10, mode: trim}",
        "{group: example.com, resource: doodads, mode: audit, failurePolicy: Fail, timeoutSeconds: 2}",
        r#"{group: "", resource: pods, failurePolicy: Ignore}"#,
    ]);
    let configurations = desired(&registration(), &rules(&text), &unresolved(), None);
    let hooks: Vec<(String, String, i32, Vec<String>)> = configurations
        .validating
        .webhooks
        .unwrap()
        .into_iter()
        .map(|h| {
            let resources = h
                .rules
                .unwrap()
                .into_iter()
                .flat_map(|r| r.resources.unwrap())
                .collect();
            (h.name, h.failure_policy.unwrap(), h.timeout_seconds.unwrap(), resources)
        })
        .collect();
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        hooks,
        vec![
            (
                "validate.statusguard.statusguard.dev".into(),
                "Fail".into(),
                5,
                owned(&["widgets/status"])
            ),
            (
                "validate-ignore-5s.statusguard.statusguard.dev".into(),
                "Ignore".into(),
                5,
                owned(&["pods/status"])
            ),
            (
                "validate-ignore-10s.statusguard.statusguard.dev".into(),
                "Ignore".into(),
                10,
                owned(&["gadgets/status", "gizmos/status"])
            ),
            // Audit stays Ignore whatever the document says; its timeout applies.
            (
                "audit-ignore-2s.statusguard.statusguard.dev".into(),
                "Ignore".into(),
                2,
                owned(&["doodads/status"])
            ),
        ]
    );
    let mutate = &configurations.mutating.webhooks.unwrap()[0];
    assert_eq!(mutate.name, "mutate-ignore-10s.statusguard.statusguard.dev");
    assert_eq!(mutate.timeout_seconds, Some(10));
}

#[test]
fn a_timeout_outside_the_api_servers_bounds_is_refused() {
    for t in [0, 31] {
        let text = document(&[&format!("{{group: a, resource: b, timeoutSeconds: {t}}}")]);
        let problems = Ownership::from_yaml(&text).unwrap_err().problems();
        assert!(problems[0].contains("outside 1 to 30"), "{problems:?}");
    }
}

#[test]
fn each_rule_names_the_version_its_paths_are_written_against() {
    let text = &document(&[
        "{group: example.com, resource: widgets}",
        "{group: cluster.x-k8s.io, resource: machines, version: v1beta2}",
        "{group: example.com, resource: gadgets, mode: trim}",
        "{group: autoscaling, resource: horizontalpodautoscalers, mode: audit}",
    ]);
    // The CRDs' storage versions; the document's version wins over its CRD's.
    let resolved: ResolvedVersions = [
        (GroupResource::new("example.com", "widgets"), "v1".to_owned()),
        (GroupResource::new("example.com", "gadgets"), "v2".to_owned()),
        (GroupResource::new("cluster.x-k8s.io", "machines"), "v1beta1".to_owned()),
    ]
    .into_iter()
    .collect();
    let configurations = desired(&registration(), &rules(text), &resolved, None);
    let rules_of = |hooks: Value| -> Vec<(Value, Value)> {
        hooks
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|h| {
                // Every webhook asks the API server to convert.
                assert_eq!(h["matchPolicy"], "Equivalent", "{h}");
                h["rules"].as_array().unwrap().clone()
            })
            .map(|r| (r["resources"][0].clone(), r["apiVersions"].clone()))
            .collect()
    };
    assert_eq!(
        rules_of(json_of(&configurations.validating)["webhooks"].clone()),
        vec![
            (json!("widgets/status"), json!(["v1"])),
            (json!("machines/status"), json!(["v1beta2"])),
            (json!("gadgets/status"), json!(["v2"])),
            // Unknown: every version, unconverted.
            (json!("horizontalpodautoscalers/status"), json!(["*"])),
        ]
    );
    assert_eq!(
        rules_of(json_of(&configurations.mutating)["webhooks"].clone()),
        vec![(json!("gadgets/status"), json!(["v2"]))]
    );
    // A version found for a resource the document does not name changes nothing.
    let mut more = resolved.clone();
    more.insert(GroupResource::new("example.com", "others"), "v9".to_owned());
    assert_eq!(desired(&registration(), &rules(text), &more, None), configurations);
}
