use super::*;

const HEADER: &str = "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\n";

fn doc(resources: &str) -> String {
    format!("{HEADER}resources:\n{resources}")
}

fn problems(text: &str) -> Vec<String> {
    match Ownership::from_yaml(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.problems(),
    }
}

#[test]
fn the_example_document_is_valid() {
    let rules = Ownership::from_yaml(include_str!("../../examples/ownership.yaml")).unwrap();
    assert_eq!(rules.default_mode, Mode::Enforce);
    let widgets = rules.resource("example.com", "widgets").unwrap();
    let controller = widgets
        .writer("system:serviceaccount:platform:widget-controller")
        .unwrap();
    assert_eq!(controller.conditions, ["Progressing", "Ready"]);
    assert!(rules.is_exempt("anyone", &["system:masters".to_owned()]));
    assert!(!rules.is_exempt("anyone", &["system:authenticated".to_owned()]));
}

#[test]
fn defaults_apply_where_the_document_is_silent() {
    let rules = Ownership::from_yaml(&doc("  - group: \"\"\n    resource: configmaps\n")).unwrap();
    let configmaps = rules.resource("", "configmaps").unwrap();
    assert_eq!(configmaps.mode, Mode::Enforce);
    assert_eq!(configmaps.conditions_path.to_string(), "conditions");
    assert!(configmaps.writers.is_empty());
    assert_eq!(configmaps.name(), "configmaps");
    assert!(rules.resource("", "widgets").is_none());
}

#[test]
fn a_resource_names_the_version_its_paths_are_written_against() {
    let rules = Ownership::from_yaml(&doc(
        "  - {group: cluster.x-k8s.io, resource: machines, version: v1beta2}
  - {group: example.com, resource: widgets}
",
    ))
    .unwrap();
    let machines = rules.resource("cluster.x-k8s.io", "machines").unwrap();
    assert_eq!(machines.version.as_deref(), Some("v1beta2"));
    // None: the server takes the CRD's storage version.
    assert_eq!(rules.resource("example.com", "widgets").unwrap().version, None);
}

#[test]
fn a_version_that_no_api_server_serves_is_refused() {
    for bad in ["\"*\"", "V1", "\"1\"", "v1/status", "\"\"", "v1.2", "-v1", "v1-"] {
        let text = doc(&format!(
            "  - {{group: example.com, resource: widgets, version: {bad}}}\n"
        ));
        let problems = problems(&text);
        assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
        assert!(
            problems[0].starts_with("resources[0] (example.com/widgets): version ")
                && problems[0].contains("is not a Kubernetes version name"),
            "{bad}: {problems:?}"
        );
    }
    let long = format!("v{}", "1".repeat(63));
    assert_eq!(
        problems(&doc(&format!(
            "  - {{group: example.com, resource: widgets, version: {long}}}\n"
        )))
        .len(),
        1
    );
}

#[test]
fn core_resources_the_kubelet_and_control_plane_write_need_an_explicit_opt_in() {
    let err = Ownership::from_yaml(&doc(
        "  - {group: \"\", resource: nodes}\n  - {group: \"\", resource: pods, mode: trim}\n",
    ))
    .unwrap_err()
    .problems();
    assert_eq!(err.len(), 2, "{err:?}");
    assert!(
        err[0].contains("core nodes") && err[0].contains("allowSystemResource: true"),
        "{err:?}"
    );
    // Audit never blocks a write; an explicit opt-in accepts the risk; the
    // same name in another group is not a core resource.
    for ok in [
        "  - {group: \"\", resource: pods, mode: audit}\n",
        "  - {group: \"\", resource: nodes, allowSystemResource: true}\n",
        "  - {group: example.com, resource: pods}\n",
    ] {
        assert!(Ownership::from_yaml(&doc(ok)).is_ok(), "{ok}");
    }
}

#[test]
fn a_resource_mode_overrides_the_default() {
    let text = format!(
        "{HEADER}mode: audit\nresources:\n  - {{group: a, resource: x}}\n  - {{group: a, resource: y, mode: trim}}\n"
    );
    let rules = Ownership::from_yaml(&text).unwrap();
    assert_eq!(rules.resource("a", "x").unwrap().mode, Mode::Audit);
    assert_eq!(rules.resource("a", "y").unwrap().mode, Mode::Trim);
}

#[test]
fn a_users_and_a_service_accounts_username() {
    let rules = Ownership::from_yaml(&doc(
        "  - group: a\n    resource: x\n    writers:\n      - {serviceAccount: ns/sa, fields: [f]}\n      - {user: alice@example.com, fields: [g]}\n      - {user: nobody}\n",
    ))
    .unwrap();
    let x = rules.resource("a", "x").unwrap();
    assert!(x.writer("system:serviceaccount:ns:sa").is_some());
    assert!(x.writer("alice@example.com").is_some());
    assert!(x.writer("nobody").unwrap().fields.is_empty());
}

#[test]
fn a_path_below_the_writers_own_path_is_dropped_whatever_the_order() {
    for fields in [
        "[summary.ready, summary, a.b.c, a.b]",
        "[summary, a.b, summary.ready, a.b.c]",
    ] {
        let rules = Ownership::from_yaml(&doc(&format!(
            "  - group: a\n    resource: x\n    writers:\n      - {{user: u, fields: {fields}}}\n"
        )))
        .unwrap();
        let fields: Vec<String> = rules.resource("a", "x").unwrap().writers[0]
            .fields
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(fields, ["a.b", "summary"]);
    }
}

#[test]
fn every_broken_rule_is_reported_with_its_location() {
    // (what is broken, the document, a phrase the error must contain)
    let cases: &[(&str, String, &str)] = &[
        (
            "wrong apiVersion",
            "apiVersion: v1\nkind: StatusOwnership\n".into(),
            "apiVersion must be",
        ),
        (
            "wrong kind",
            "apiVersion: statusguard.dev/v1alpha1\nkind: Ownership\n".into(),
            "kind must be",
        ),
        ("unknown mode", format!("{HEADER}mode: block\n"), "block"),
        ("unknown top-level key", format!("{HEADER}resorces: []\n"), "resorces"),
        (
            "unknown resource key",
            doc("  - {group: a, resource: x, writer: []}\n"),
            "writer",
        ),
        (
            "unknown writer key",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, feilds: [a]}\n"),
            "feilds",
        ),
        ("unknown exempt key", format!("{HEADER}exempt: {{user: [a]}}\n"), "user"),
        (
            "empty path",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [\"\"]}\n"),
            "resources[0] (a/x) writer u: field: the path is empty",
        ),
        (
            "leading dot",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [.a]}\n"),
            "empty segment",
        ),
        (
            "trailing dot",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [a.]}\n"),
            "empty segment",
        ),
        (
            "double dot",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [a..b]}\n"),
            "empty segment",
        ),
        (
            "the conditions path",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [conditions]}\n"),
            "overlaps the conditions list",
        ),
        (
            "below the conditions path",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [conditions.x]}\n"),
            "overlaps the conditions list",
        ),
        (
            "containing the conditions path",
            doc(
                "  - group: a\n    resource: x\n    conditions: health.conditions\n    writers:\n      - {user: u, fields: [health]}\n",
            ),
            "overlaps the conditions list",
        ),
        (
            "bad conditions path",
            doc("  - {group: a, resource: x, conditions: \"a..b\"}\n"),
            "resources[0] (a/x): conditions: path \"a..b\" has an empty segment",
        ),
        (
            "same field, two writers",
            doc(
                "  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [f]}\n      - {user: v, fields: [f]}\n",
            ),
            "field f of u and field f of v overlap",
        ),
        (
            "nested fields, two writers",
            doc(
                "  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [s.ready]}\n      - {user: v, fields: [s]}\n",
            ),
            "field s.ready of u and field s of v overlap",
        ),
        (
            "same condition, two writers",
            doc(
                "  - group: a\n    resource: x\n    writers:\n      - {user: u, conditions: [Ready]}\n      - {user: v, conditions: [Ready]}\n",
            ),
            "condition type Ready is declared by both u and v",
        ),
        (
            "both identities",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, serviceAccount: ns/sa}\n"),
            "resources[0] (a/x) writers[0]: a writer needs exactly one",
        ),
        (
            "no identity",
            doc("  - group: a\n    resource: x\n    writers:\n      - {fields: [f]}\n"),
            "exactly one of serviceAccount or user",
        ),
        (
            "service account without namespace",
            doc("  - group: a\n    resource: x\n    writers:\n      - {serviceAccount: sa}\n"),
            "must be NAMESPACE/NAME",
        ),
        (
            "service account with bad name",
            doc("  - group: a\n    resource: x\n    writers:\n      - {serviceAccount: ns/Bad_Name}\n"),
            "must be NAMESPACE/NAME",
        ),
        (
            "empty user",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: \"\"}\n"),
            "user is empty",
        ),
        (
            "same writer twice",
            doc(
                "  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [f]}\n      - {user: u, fields: [g]}\n",
            ),
            "writer u: appears twice",
        ),
        (
            "same SA twice, spelled as user",
            doc(
                "  - group: a\n    resource: x\n    writers:\n      - {serviceAccount: ns/sa}\n      - {user: \"system:serviceaccount:ns:sa\"}\n",
            ),
            "appears twice",
        ),
        (
            "same resource twice",
            doc("  - {group: a, resource: x}\n  - {group: a, resource: x}\n"),
            "resources[1] (a/x): the same group/resource as resources[0]",
        ),
        (
            "empty resource",
            doc("  - {group: a, resource: \"\"}\n"),
            "must name the plural resource",
        ),
        (
            "subresource named",
            doc("  - {group: a, resource: x/status}\n"),
            "plural name only",
        ),
        (
            "empty condition type",
            doc("  - group: a\n    resource: x\n    writers:\n      - {user: u, conditions: [\"\"]}\n"),
            "empty condition type",
        ),
        ("not YAML", "{{{".into(), "not a valid ownership document"),
        (
            "a list, not a document",
            "- a\n- b\n".into(),
            "not a valid ownership document",
        ),
        (
            "wrong type",
            format!("{HEADER}resources: 5\n"),
            "not a valid ownership document",
        ),
        ("empty text", "".into(), "not a valid ownership document"),
    ];
    for (what, text, expected) in cases {
        let found = problems(text);
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{what}: expected {expected:?} in {found:#?}"
        );
    }
}

#[test]
fn group_and_resource_must_be_names_the_api_server_can_send() {
    // (group, resource, what the one problem says)
    let refused = [
        ("\"*\"", "widgets", "group \"*\" must be"),
        ("\"*.example.com\"", "widgets", "group \"*.example.com\" must be"),
        ("Example.com", "widgets", "group \"Example.com\" must be"),
        ("example..com", "widgets", "group \"example..com\" must be"),
        ("-example.com", "widgets", "group \"-example.com\" must be"),
        ("example.com", "\"*\"", "resource \"*\" must be a plural resource name"),
        (
            "example.com",
            "Widgets",
            "resource \"Widgets\" must be a plural resource name",
        ),
        (
            "example.com",
            "wid.gets",
            "resource \"wid.gets\" must be a plural resource name",
        ),
        (
            "example.com",
            "wid_gets",
            "resource \"wid_gets\" must be a plural resource name",
        ),
        ("example.com", "widgets/status", "resource is the plural name only"),
        ("example.com", "\"\"", "resource must name the plural resource"),
        ("\"\"", "\"*\"", "resource \"*\" must be a plural resource name"),
    ];
    for (group, resource, expected) in refused {
        let found = problems(&doc(&format!("  - {{group: {group}, resource: {resource}}}\n")));
        assert_eq!(found.len(), 1, "{group}/{resource}: {found:#?}");
        assert!(
            found[0].starts_with("resources[0] (") && found[0].contains(expected),
            "{group}/{resource}: expected {expected:?} in {found:#?}"
        );
    }
    let long = "x".repeat(64);
    let found = problems(&doc(&format!("  - {{group: a, resource: {long}}}\n")));
    assert!(found[0].contains("at most 63 characters"), "{found:#?}");
    // Both wrong: both named, each where it is.
    let found = problems(&doc(
        "  - {group: a, resource: x}\n  - {group: \"*\", resource: \"*\"}\n",
    ));
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found.iter().all(|p| p.starts_with("resources[1] (*/*): ")),
        "{found:#?}"
    );
    for (group, resource) in [
        ("\"\"", "configmaps"),
        ("example.com", "widgets"),
        ("apps", "deployments"),
        ("cluster.x-k8s.io", "machinedeployments"),
        ("a1-b.example", "x1-y"),
    ] {
        let text = doc(&format!("  - {{group: {group}, resource: {resource}}}\n"));
        assert!(Ownership::from_yaml(&text).is_ok(), "{group}/{resource}");
    }
}

#[test]
fn all_errors_are_reported_not_just_the_first() {
    let text = "apiVersion: v1\nkind: Nope\nresources:\n  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [a..b, conditions]}\n      - {user: v}\n      - {user: v}\n";
    assert_eq!(problems(text).len(), 5, "{:#?}", problems(text));
}

#[test]
fn empty_writers_and_writers_that_own_nothing_are_allowed() {
    let rules = Ownership::from_yaml(&doc(
        "  - {group: a, resource: x, writers: []}\n  - group: a\n    resource: y\n    writers:\n      - {user: u}\n",
    ))
    .unwrap();
    assert_eq!(
        rules.summary(),
        "2 resources, 1 writers, 0 fields, 0 condition types (default mode enforce)"
    );
}

/// Regression (issue 11, item 5): a namespace is a DNS label, so
/// `ns.a/sa` names no service account and is refused; a dotted name is fine.
#[test]
fn a_service_account_namespace_cannot_hold_a_dot() {
    let p = problems(&doc(
        "  - group: a\n    resource: x\n    writers:\n      - {serviceAccount: ns.a/sa}\n",
    ));
    assert!(p[0].contains("must be NAMESPACE/NAME"), "{p:?}");
    let rules = Ownership::from_yaml(&doc(
        "  - group: a\n    resource: x\n    writers:\n      - {serviceAccount: ns/sa.v1}\n",
    ))
    .unwrap();
    assert!(
        rules
            .resource("a", "x")
            .unwrap()
            .writer("system:serviceaccount:ns:sa.v1")
            .is_some()
    );
}

#[test]
fn paths_with_slash_and_tilde_are_accepted() {
    let rules = Ownership::from_yaml(&doc(
        "  - group: a\n    resource: x\n    writers:\n      - {user: u, fields: [\"a/b.c~d\"]}\n",
    ))
    .unwrap();
    let path = &rules.resource("a", "x").unwrap().writers[0].fields[0];
    assert_eq!(path.status_pointer().as_str(), "/status/a~1b/c~0d");
}

// ---- keyed lists ----------------------------------------------------------

const ENVOY: &str = "gateway.envoyproxy.io/gatewayclass-controller";
const ISTIO: &str = "istio.io/gateway-controller";

/// The document: HTTPRoute `parents` keyed by `controllerName`.
fn routes(extra_list: &str, envoy_entries: &str, istio_entries: &str) -> String {
    doc(&format!(
        "  - group: gateway.networking.k8s.io
    resource: httproutes
    lists:
      - path: parents
        key: controllerName
{extra_list}    writers:
      - serviceAccount: envoy-gateway-system/envoy-gateway
        entries:
{envoy_entries}      - serviceAccount: istio-system/istiod
        entries:
{istio_entries}"
    ))
}

#[test]
fn a_keyed_list_and_its_writers_entries_compile() {
    let text = routes(
        "",
        &format!("          parents: [{ENVOY}]\n"),
        &format!("          parents: [\"{ISTIO}\", \"odd=a,b;c:d'e\"]\n"),
    );
    let rules = Ownership::from_yaml(&text).unwrap();
    let r = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    assert_eq!(r.lists.len(), 1);
    assert_eq!(r.lists[0].path.to_string(), "parents");
    assert_eq!(r.lists[0].key, "controllerName");
    let parents = FieldPath::parse("parents").unwrap();
    let istiod = r.writer("system:serviceaccount:istio-system:istiod").unwrap();
    assert_eq!(istiod.entries_of(&parents), [ISTIO, "odd=a,b;c:d'e"]);
    assert_eq!(r.owners.by_entry_key[0].get(ENVOY), Some(&(0, 0)));
    assert_eq!(r.owners.by_entry_key[0].get("odd=a,b;c:d'e"), Some(&(1, 1)));
    // The list is read entry by entry: the entries of declared key values.
    let read = r.read_paths.child("parents").and_then(PathTree::keyed).unwrap();
    assert_eq!(read.member, "controllerName");
    let mut values: Vec<(&str, Option<usize>)> = read.values.iter().map(|(v, o)| (v.as_str(), *o)).collect();
    values.sort_unstable();
    assert_eq!(values, [(ENVOY, Some(0)), (ISTIO, Some(1)), ("odd=a,b;c:d'e", Some(1))]);
}

#[test]
fn keyed_list_problems_are_each_named_with_where_they_are() {
    let text = routes(
        "      - path: parents.inner\n        key: x\n      - path: conditions\n        key: type\n      - path: a..b\n        key: k\n      - path: other\n        key: \"\"\n",
        &format!("          parents: [{ISTIO}, \"\", {ISTIO}]\n          nowhere: [x]\n"),
        &format!("          parents: [{ISTIO}]\n"),
    );
    let problems = problems(&text);
    let at = "resources[0] (gateway.networking.k8s.io/httproutes)";
    let envoy = format!("{at} writer system:serviceaccount:envoy-gateway-system:envoy-gateway");
    for expected in [
        format!("{at} lists[1]: path parents.inner overlaps lists[0] at status.parents; a list is declared once"),
        format!("{at} lists[2]: path conditions overlaps the conditions list at status.conditions"),
        format!("{at} lists[3]: path: path \"a..b\" has an empty segment (a leading, trailing or doubled dot)"),
        format!("{at} lists[4]: key is empty; name the member of each entry that says whose it is"),
        format!("{envoy}: entries: \"nowhere\" is not a list declared in lists: (declared: [parents])"),
        format!("{envoy}: entries.parents[1]: empty key value"),
        format!("{envoy}: entries.parents[2]: \"{ISTIO}\" is listed twice"),
        format!(
            "{at}: the entries of status.parents keyed \"{ISTIO}\" are declared by both \
             system:serviceaccount:envoy-gateway-system:envoy-gateway and system:serviceaccount:istio-system:istiod; \
             a key value has one owner per list"
        ),
    ] {
        assert!(problems.contains(&expected), "missing {expected:?} in {problems:#?}");
    }
    assert_eq!(problems.len(), 8, "{problems:#?}");
}

#[test]
fn a_field_may_not_overlap_a_keyed_list() {
    let text = routes(
        "",
        &format!("          parents: [{ENVOY}]\n        fields: [parents.x, other]\n"),
        "          {}\n",
    );
    let problems = problems(&text);
    assert_eq!(
        problems,
        ["resources[0] (gateway.networking.k8s.io/httproutes) writer \
             system:serviceaccount:envoy-gateway-system:envoy-gateway: field \"parents.x\" overlaps a keyed list \
             (lists:); own its entries instead"]
    );
}
