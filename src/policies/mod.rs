//! The ownership document as admission policies the API server evaluates
//! itself: a ValidatingAdmissionPolicy per resource (enforce: Deny; audit:
//! Audit and Warn; trim: Deny as the backstop) and, per trim resource, a
//! MutatingAdmissionPolicy that restores the other writers' items, each with
//! its binding. No webhook, no network hop, nothing that can be down.
//!
//! [`policies`] is pure and deterministic (sorted keys, document order), so
//! its output can be committed to GitOps and compared byte for byte.
//!
//! What CEL cannot say as the webhook does is listed by [`deviations`] (and
//! in the README's "Webhook or policies?"): `check` warns about it and
//! `export policies` refuses it unless told to allow it.

pub mod cel;
mod restore;

use serde_json::{Value, json};

use crate::admission::decide::{MESSAGE_ITEMS, warning};
use crate::cluster::registration::desired::{ALL_VERSIONS, match_conditions};
use crate::ownership::{Item, Mode, Ownership, ResourceRules, Violation};

/// The API version of every policy object.
pub const API_VERSION: &str = "admissionregistration.k8s.io/v1";
/// The label every exported object carries, so that `unregister` and the
/// registration loop find them (and only them).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The label's value.
pub const MANAGED_BY: &str = "statusguard";
/// The label naming the set an object belongs to (the name prefix), by
/// which `--register-policies` prunes and `unregister` deletes.
pub const POLICY_SET_LABEL: &str = "statusguard.dev/policy-set";

/// The four kinds of a set, in the order they are applied (a policy
/// before its binding).
pub const KINDS: [&str; 4] = [
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
];

/// The API resource of one of [`KINDS`].
pub fn api_resource(kind: &str) -> kube::api::ApiResource {
    let plural = format!("{}s", kind.to_lowercase()).replace("policys", "policies");
    let gvk = kube::core::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    kube::api::ApiResource::from_gvk_with_plural(&gvk, &plural)
}

/// An owned item and its owner, with the CEL that tells whether a write changed it.
struct Guarded<'r> {
    item: Item,
    owner: &'r str,
    changed: String,
}

impl Guarded<'_> {
    /// The violation a writer other than the owner commits by changing it.
    fn violation(&self) -> Violation {
        Violation {
            item: self.item.clone(),
            owner: self.owner.to_owned(),
        }
    }
}

/// Every owned item of a resource, in the webhook's order (writer, then
/// fields, conditions and keyed entries), with its change test.
fn guarded(resource: &ResourceRules) -> Vec<Guarded<'_>> {
    let mut items = Vec::new();
    for writer in &resource.writers {
        for field in &writer.fields {
            let (old, new) = (
                cel::value_at("variables.old", field.segments()),
                cel::value_at("variables.new", field.segments()),
            );
            items.push(Guarded {
                item: Item::Field(field.clone()),
                owner: &writer.username,
                changed: format!("!{}", cel::same(&old, &new)),
            });
        }
        for ty in &writer.conditions {
            items.push(Guarded {
                item: Item::Condition(ty.clone()),
                owner: &writer.username,
                changed: format!(
                    "!{}",
                    cel::same_items(
                        &cel::items_with("variables.oldConditions", "type", ty),
                        &cel::items_with("variables.newConditions", "type", ty)
                    )
                ),
            });
        }
        for (l, list) in resource.lists.iter().enumerate() {
            for value in writer.entries_of(&list.path) {
                items.push(Guarded {
                    item: Item::Entry {
                        list: list.path.clone(),
                        key: list.key.clone(),
                        value: value.clone(),
                    },
                    owner: &writer.username,
                    changed: format!(
                        "!{}",
                        cel::same_items(
                            &cel::items_with(&format!("variables.oldList{l}"), &list.key, value),
                            &cel::items_with(&format!("variables.newList{l}"), &list.key, value)
                        )
                    ),
                });
            }
        }
    }
    items
}

/// The variables every policy of a resource reads: both statuses, the
/// writer, the lists the items live in, and whether each item changed.
fn variables(resource: &ResourceRules, items: &[Guarded<'_>]) -> Vec<Value> {
    let var = |name: String, expression: String| json!({"name": name, "expression": expression});
    let mut vars = vec![
        var("old".into(), "oldObject.?status.orValue(null)".into()),
        var("new".into(), "object.?status.orValue(null)".into()),
        var("writer".into(), "request.userInfo.username".into()),
    ];
    if resource.writers.iter().any(|w| !w.conditions.is_empty()) {
        vars.push(var(
            "oldConditions".into(),
            cel::list_at("variables.old", &resource.conditions_path),
        ));
        vars.push(var(
            "newConditions".into(),
            cel::list_at("variables.new", &resource.conditions_path),
        ));
    }
    for (l, list) in resource.lists.iter().enumerate() {
        vars.push(var(format!("oldList{l}"), cel::list_at("variables.old", &list.path)));
        vars.push(var(format!("newList{l}"), cel::list_at("variables.new", &list.path)));
    }
    // Each item's test is a variable of its own: evaluated only when a
    // writer other than its owner writes, and once.
    for (i, item) in items.iter().enumerate() {
        vars.push(var(format!("changed{i}"), item.changed.clone()));
    }
    vars.push(var("violations".into(), violations(items)));
    vars
}

/// Whether the writer changed item `i`, which it does not own.
fn violated(i: usize, item: &Guarded<'_>) -> String {
    format!(
        "(variables.writer != {} && variables.changed{i})",
        cel::string(item.owner)
    )
}

/// The list of every violation, each as the webhook words it.
fn violations(items: &[Guarded<'_>]) -> String {
    if items.is_empty() {
        return "[]".into();
    }
    let parts: Vec<String> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let text = item.violation().to_string();
            format!("({} ? [{}] : [])", violated(i, item), cel::string(&text))
        })
        .collect();
    parts.join(" + ")
}

/// The deny message, as the webhook's: the writer, then at most
/// [`MESSAGE_ITEMS`] violations and how many more.
fn deny_message() -> String {
    format!(
        "\"statusguard: \" + variables.writer + \" may not change status fields owned by other writers: \" + \
         variables.violations.transformList(i, v, i < {MESSAGE_ITEMS}, v).join(\", \") + \
         (size(variables.violations) > {MESSAGE_ITEMS} ? \", and \" + string(size(variables.violations) - {MESSAGE_ITEMS}) + \" more\" : \"\")"
    )
}

/// The longest object name the API server takes (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Checks a set's name (the objects' name prefix and the value of
/// [`POLICY_SET_LABEL`]): a label value that is also the start of a DNS
/// subdomain, lowercase letters, digits, `-` and `.`, at most 63
/// characters. For clap, so that a bad name stops the command at once.
pub fn set_name(name: &str) -> Result<String, String> {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid = (1..=63).contains(&name.len())
        && name.chars().all(|c| alphanumeric(c) || c == '-' || c == '.')
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric);
    if valid {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "{name:?}: a policy set's name is 1 to 63 lowercase letters, digits, '-' and '.', starting and \
             ending with a letter or digit (it names the objects and labels them)"
        ))
    }
}

/// The objects of set `prefix` whose name would be longer than the API
/// server takes, one line each: a long group name can take it past 253.
pub fn name_problems(prefix: &str, rules: &Ownership) -> Vec<String> {
    rules
        .resources()
        .iter()
        .map(|resource| object_name(prefix, resource))
        .filter(|name| name.len() > MAX_NAME)
        .map(|name| {
            format!(
                "{name}: {} characters, more than the {MAX_NAME} a name may have: choose a shorter set name",
                name.len()
            )
        })
        .collect()
}

/// The objects' name for a resource: `PREFIX.RESOURCE.GROUP` (a DNS
/// subdomain, as the document's names are), `PREFIX.RESOURCE` for the core group.
pub fn object_name(prefix: &str, resource: &ResourceRules) -> String {
    if resource.group.is_empty() {
        format!("{prefix}.{}", resource.resource)
    } else {
        format!("{prefix}.{}.{}", resource.resource, resource.group)
    }
}

fn metadata(prefix: &str, name: &str) -> Value {
    json!({"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_SET_LABEL: prefix}})
}

fn match_constraints(resource: &ResourceRules) -> Value {
    json!({
        "matchPolicy": "Equivalent",
        "resourceRules": [{
            "apiGroups": [resource.group],
            "apiVersions": [resource.version.as_deref().unwrap_or(ALL_VERSIONS)],
            "operations": ["UPDATE"],
            "resources": [format!("{}/status", resource.resource)],
            "scope": "*",
        }],
    })
}

/// The ValidatingAdmissionPolicy of a resource and its binding.
fn validating(prefix: &str, rules: &Ownership, resource: &ResourceRules, items: &[Guarded<'_>]) -> [Value; 2] {
    let name = object_name(prefix, resource);
    let (validations, actions, failure_policy) = match resource.mode {
        // One validation over every violation: the API server shows only the
        // first failing validation's message, and the webhook lists them all.
        Mode::Enforce | Mode::Trim => (
            vec![json!({
                "expression": "size(variables.violations) == 0",
                "messageExpression": deny_message(),
                "reason": "Forbidden",
            })],
            json!(["Deny"]),
            resource
                .failure_policy
                .unwrap_or(crate::ownership::FailurePolicy::Fail)
                .to_string(),
        ),
        // One validation per item: each failing one is a warning of its own,
        // as the webhook gives one per violation.
        Mode::Audit => (
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    json!({
                        "expression": format!("!{}", violated(i, item)),
                        "message": warning("changed", &item.violation()),
                    })
                })
                .collect(),
            json!(["Audit", "Warn"]),
            "Ignore".to_owned(),
        ),
    };
    let spec = json!({
        "failurePolicy": failure_policy,
        "matchConstraints": match_constraints(resource),
        "matchConditions": match_conditions(rules),
        "variables": variables(resource, items),
        "validations": validations,
    });
    // No auditAnnotations: a valueExpression cannot be `null` on one branch
    // only, so it would annotate every write. The API server's own
    // `validation.policy.admission.k8s.io/validation_failure` annotation
    // carries each failed validation (its message names item and owner).
    [
        json!({
            "apiVersion": API_VERSION,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": metadata(prefix, &name),
            "spec": spec,
        }),
        json!({
            "apiVersion": API_VERSION,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": metadata(prefix, &name),
            "spec": {"policyName": name, "validationActions": actions},
        }),
    ]
}

/// The MutatingAdmissionPolicy of a trim resource and its binding.
fn mutating(prefix: &str, rules: &Ownership, resource: &ResourceRules, items: &[Guarded<'_>]) -> [Value; 2] {
    let name = object_name(prefix, resource);
    let vars = variables(resource, items);
    let mut mutations: Vec<Value> = restore::patches(resource, items)
        .into_iter()
        .map(|expression| json!({"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}))
        .collect();
    if mutations.is_empty() {
        // The API server requires one mutation; this one restores nothing.
        mutations.push(json!({"patchType": "JSONPatch", "jsonPatch": {"expression": "[]"}}));
    }
    [
        json!({
            "apiVersion": API_VERSION,
            "kind": "MutatingAdmissionPolicy",
            "metadata": metadata(prefix, &name),
            "spec": {
                // A restore that cannot apply leaves the write to the Deny
                // policy behind it, which refuses it: fail closed, not twice.
                "failurePolicy": "Ignore",
                "matchConstraints": match_constraints(resource),
                "matchConditions": match_conditions(rules),
                "variables": vars,
                "mutations": mutations,
                // Other policies' mutations run in no fixed order: run again
                // after them, so that what is restored stays restored.
                "reinvocationPolicy": "IfNeeded",
            },
        }),
        json!({
            "apiVersion": API_VERSION,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": metadata(prefix, &name),
            "spec": {"policyName": name},
        }),
    ]
}

/// Every policy and binding for the document, in document order: per
/// resource the validating pair, then (trim) the mutating pair.
pub fn policies(prefix: &str, rules: &Ownership) -> Vec<Value> {
    let mut objects = Vec::new();
    // A resource whose writers own nothing has nothing to check: the API
    // server takes no policy without a validation.
    for resource in rules.resources() {
        let items = guarded(resource);
        if items.is_empty() {
            continue;
        }
        objects.extend(validating(prefix, rules, resource, &items));
        if resource.mode == Mode::Trim {
            objects.extend(mutating(prefix, rules, resource, &items));
        }
    }
    objects
}

/// Owned values the policies compare as the webhook does only down to
/// [`cel::NULL_DEPTH`] levels (below that a `null` member differs from an
/// absent one), one line per resource that owns any: the document cannot
/// say how deep they are, so `check` names them for the reader to judge.
pub fn depth_notes(rules: &Ownership) -> Vec<String> {
    rules
        .resources()
        .iter()
        .filter_map(|resource| {
            let mut owned: Vec<String> = resource
                .writers
                .iter()
                .flat_map(|w| w.fields.iter().map(|f| format!("status.{f}")))
                .collect();
            owned.extend(resource.lists.iter().map(|l| format!("status.{}[]", l.path)));
            (!owned.is_empty()).then(|| {
                format!(
                    "{}: as policies, `null` and absent are alike only {} levels into {}: deeper, a `null` member \
                     counts as a change",
                    resource.name(),
                    cel::NULL_DEPTH,
                    owned.join(", ")
                )
            })
        })
        .collect()
}

/// Where the policies answer differently from the webhook for this
/// document, one line each naming the resource; empty when they decide alike.
pub fn deviations(rules: &Ownership) -> Vec<String> {
    let mut found = Vec::new();
    for resource in rules.resources() {
        let name = resource.name();
        if resource.mode == Mode::Trim {
            found.push(format!(
                "{name}: mode trim: a MutatingAdmissionPolicy restores silently (no warning, audit annotation \
                 or Event), does not hand server-side apply ownership back to the owner, and refuses a write \
                 whose restored number is beyond 2^53"
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests;
