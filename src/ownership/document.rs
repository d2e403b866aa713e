//! The document as written, and its compilation into rules: every check a
//! document passes before it becomes [`Ownership`], each problem named.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::{
    API_VERSION, FailurePolicy, FieldPath, KIND, KeyedList, LookupMap, Mode, OwnerIndex, Ownership, OwnershipError,
    PathTree, ResourceRules, SYSTEM_RESOURCES, WriterRules, drop_nested, service_account_username,
};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Document {
    api_version: String,
    kind: String,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    exempt: ExemptDoc,
    #[serde(default)]
    resources: Vec<ResourceDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExemptDoc {
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResourceDoc {
    group: String,
    resource: String,
    version: Option<String>,
    mode: Option<Mode>,
    conditions: Option<String>,
    #[serde(default)]
    allow_system_resource: bool,
    failure_policy: Option<FailurePolicy>,
    timeout_seconds: Option<i32>,
    #[serde(default)]
    lists: Vec<ListDoc>,
    #[serde(default)]
    writers: Vec<WriterDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListDoc {
    path: String,
    key: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WriterDoc {
    service_account: Option<String>,
    user: Option<String>,
    #[serde(default)]
    fields: Vec<String>,
    #[serde(default)]
    conditions: Vec<String>,
    /// By keyed list path (as written in `lists`), the key values owned.
    #[serde(default)]
    entries: BTreeMap<String, Vec<String>>,
}

pub(super) fn compile(doc: Document) -> Result<Ownership, OwnershipError> {
    let mut problems = Vec::new();
    if doc.api_version != API_VERSION {
        problems.push(format!("apiVersion must be {API_VERSION:?}, not {:?}", doc.api_version));
    }
    if doc.kind != KIND {
        problems.push(format!("kind must be {KIND:?}, not {:?}", doc.kind));
    }
    for (i, user) in doc.exempt.users.iter().enumerate() {
        if user.is_empty() {
            problems.push(format!("exempt.users[{i}]: empty user name"));
        }
    }
    for (i, group) in doc.exempt.groups.iter().enumerate() {
        if group.is_empty() {
            problems.push(format!("exempt.groups[{i}]: empty group name"));
        }
    }

    let mut resources: Vec<ResourceRules> = Vec::new();
    // Where each group/resource was first declared, for the duplicate error.
    let mut first_seen: HashMap<(String, String), usize> = HashMap::new();
    for (i, r) in doc.resources.into_iter().enumerate() {
        let at = format!("resources[{i}] ({}/{})", r.group, r.resource);
        // A name the API server could never send (`*` above all) would
        // register a webhook that matches everything and enforce nothing.
        if !r.group.is_empty() && !is_dns_subdomain(&r.group) {
            problems.push(format!(
                "{at}: group {:?} must be \"\" (the core group) or an API group, a DNS-1123 subdomain such as \
                 example.com (lower case letters, digits, '-' and '.'); wildcards are not allowed",
                r.group
            ));
        }
        if r.resource.is_empty() {
            problems.push(format!("{at}: resource must name the plural resource"));
        } else if r.resource.contains('/') {
            problems.push(format!(
                "{at}: resource is the plural name only; statusguard always guards its /status"
            ));
        } else if !is_resource_name(&r.resource) {
            problems.push(format!(
                "{at}: resource {:?} must be a plural resource name, a DNS-1123 label such as widgets (lower case \
                 letters, digits and '-', at most 63 characters); wildcards are not allowed",
                r.resource
            ));
        }
        match first_seen.entry((r.group.clone(), r.resource.clone())) {
            Entry::Occupied(first) => {
                problems.push(format!("{at}: the same group/resource as resources[{}]", first.get()));
            }
            Entry::Vacant(slot) => {
                slot.insert(i);
            }
        }
        if let Some(rules) = compile_resource(r, doc.mode, &at, &mut problems) {
            resources.push(rules);
        }
    }
    if !problems.is_empty() {
        return Err(OwnershipError::Invalid(problems));
    }
    let mut index: LookupMap<String, LookupMap<String, usize>> = LookupMap::default();
    for (i, r) in resources.iter().enumerate() {
        index.entry(r.group.clone()).or_default().insert(r.resource.clone(), i);
    }
    Ok(Ownership {
        default_mode: doc.mode,
        exempt_users: doc.exempt.users.into_iter().collect(),
        exempt_groups: doc.exempt.groups.into_iter().collect(),
        resources,
        index,
    })
}

fn compile_resource(r: ResourceDoc, default_mode: Mode, at: &str, problems: &mut Vec<String>) -> Option<ResourceRules> {
    let mode = r.mode.unwrap_or(default_mode);
    if r.group.is_empty()
        && SYSTEM_RESOURCES.contains(&r.resource.as_str())
        && mode != Mode::Audit
        && r.failure_policy != Some(FailurePolicy::Ignore)
        && !r.allow_system_resource
    {
        problems.push(format!(
            "{at}: the kubelet and the control plane write the status of core {}: in mode {mode} a statusguard outage \
             (failurePolicy Fail) blocks them too; use mode: audit or failurePolicy: Ignore, or set \
             allowSystemResource: true to accept that",
            r.resource
        ));
    }
    if let Some(t) = r.timeout_seconds.filter(|t| !(1..=30).contains(t)) {
        problems.push(format!(
            "{at}: timeoutSeconds {t} is outside 1 to 30 (the API server's bounds)"
        ));
    }
    let version = checked_version(r.version, at, problems);
    let conditions_text = r.conditions.as_deref().unwrap_or("conditions");
    let conditions_path = FieldPath::parse(conditions_text)
        .map_err(|e| problems.push(format!("{at}: conditions: {e}")))
        .ok();
    let lists = compile_lists(r.lists, conditions_path.as_ref(), at, problems);
    let mut writers: Vec<WriterRules> = Vec::new();
    for (j, w) in r.writers.into_iter().enumerate() {
        if let Some(writer) = compile_writer(w, at, j, conditions_path.as_ref(), &lists, problems) {
            if writers.iter().any(|other| other.username == writer.username) {
                problems.push(format!("{at} writer {}: appears twice", writer.username));
            } else {
                writers.push(writer);
            }
        }
    }
    check_single_owners(&writers, at, problems);
    let conditions_path = conditions_path?;
    // Each read value knows its owner: a writer's own values are never
    // compared on its writes, so they are never built either.
    let mut read_paths = PathTree::default();
    for (w, writer) in writers.iter().enumerate() {
        for field in &writer.fields {
            read_paths.add_owned(field, w);
        }
    }
    let owned = |values: &dyn Fn(&WriterRules) -> &[String]| -> Vec<(String, Option<usize>)> {
        let each = writers.iter().enumerate();
        each.flat_map(|(w, writer)| values(writer).iter().map(move |v| (v.clone(), Some(w))))
            .collect()
    };
    read_paths.add_keyed(&conditions_path, "type", owned(&|w| &w.conditions));
    // A keyed list is read entry by entry, as the conditions are: an entry
    // whose key value nobody declared is anyone's, and never compared.
    for list in &lists {
        read_paths.add_keyed(&list.path, &list.key, owned(&|w| w.entries_of(&list.path)));
    }
    let owners = OwnerIndex::of(&lists, &writers);
    Some(ResourceRules {
        group: r.group,
        resource: r.resource,
        version,
        mode,
        failure_policy: r.failure_policy,
        timeout_seconds: r.timeout_seconds,
        conditions_path,
        lists,
        writers,
        read_paths,
        owners,
    })
}

/// The keyed lists of a resource: each a valid path that overlaps neither
/// the conditions list nor another list, with a non-empty key member. A list
/// with a problem is noted and left out.
fn compile_lists(
    lists: Vec<ListDoc>,
    conditions_path: Option<&FieldPath>,
    at: &str,
    problems: &mut Vec<String>,
) -> Vec<KeyedList> {
    let mut compiled: Vec<(usize, KeyedList)> = Vec::new();
    for (i, list) in lists.into_iter().enumerate() {
        let list_at = format!("{at} lists[{i}]");
        let path = match FieldPath::parse(&list.path) {
            Ok(path) => path,
            Err(e) => {
                problems.push(format!("{list_at}: path: {e}"));
                continue;
            }
        };
        let mut valid = true;
        if list.key.is_empty() {
            problems.push(format!(
                "{list_at}: key is empty; name the member of each entry that says whose it is"
            ));
            valid = false;
        }
        if let Some(conditions) = conditions_path.filter(|c| path.overlaps(c)) {
            problems.push(format!(
                "{list_at}: path {path} overlaps the conditions list at status.{conditions}"
            ));
            valid = false;
        }
        if let Some((j, other)) = compiled.iter().find(|(_, other)| path.overlaps(&other.path)) {
            problems.push(format!(
                "{list_at}: path {path} overlaps lists[{j}] at status.{}; a list is declared once",
                other.path
            ));
            valid = false;
        }
        if valid {
            compiled.push((i, KeyedList { path, key: list.key }));
        }
    }
    compiled.into_iter().map(|(_, list)| list).collect()
}

/// The document's `version`, if it is one the API server can serve: a
/// DNS-1035 label (what a CRD's version names must be: lower case, digits
/// and '-', starting with a letter), so never `*`.
fn checked_version(version: Option<String>, at: &str, problems: &mut Vec<String>) -> Option<String> {
    let version = version?;
    if is_dns_label(&version, 63) && version.starts_with(|c: char| c.is_ascii_lowercase()) {
        Some(version)
    } else {
        problems.push(format!(
            "{at}: version {version:?} is not a Kubernetes version name (v1, v1beta2: lower case, digits and '-', starting with a letter)"
        ));
        None
    }
}

/// One writer's entry, or `None` (with the problems noted) when it names no
/// valid identity.
fn compile_writer(
    w: WriterDoc,
    at: &str,
    index: usize,
    conditions_path: Option<&FieldPath>,
    lists: &[KeyedList],
    problems: &mut Vec<String>,
) -> Option<WriterRules> {
    let entry_at = format!("{at} writers[{index}]");
    let username = match (&w.service_account, &w.user) {
        (Some(sa), None) => match sa.split_once('/') {
            Some((ns, name)) if is_namespace_name(ns) && is_dns_subdomain(name) => service_account_username(ns, name),
            _ => {
                problems.push(format!(
                    "{entry_at}: serviceAccount {sa:?} must be NAMESPACE/NAME (a namespace is a DNS label: lower case, digits and '-')"
                ));
                return None;
            }
        },
        (None, Some(user)) if !user.is_empty() => user.clone(),
        (None, Some(_)) => {
            problems.push(format!("{entry_at}: user is empty"));
            return None;
        }
        _ => {
            problems.push(format!(
                "{entry_at}: a writer needs exactly one of serviceAccount or user"
            ));
            return None;
        }
    };
    let writer_at = format!("{at} writer {username}");
    let mut fields = Vec::new();
    for text in &w.fields {
        match FieldPath::parse(text) {
            Ok(path) if conditions_path.is_some_and(|c| path.overlaps(c)) => problems.push(format!(
                "{writer_at}: field {text:?} overlaps the conditions list at status.{}; own condition types instead",
                conditions_path.map(ToString::to_string).unwrap_or_default()
            )),
            Ok(path) if lists.iter().any(|l| path.overlaps(&l.path)) => problems.push(format!(
                "{writer_at}: field {text:?} overlaps a keyed list (lists:); own its entries instead"
            )),
            Ok(path) => fields.push(path),
            Err(e) => problems.push(format!("{writer_at}: field: {e}")),
        }
    }
    let mut conditions: Vec<String> = Vec::new();
    for ty in w.conditions {
        if ty.is_empty() {
            problems.push(format!("{writer_at}: empty condition type"));
        } else if !conditions.contains(&ty) {
            conditions.push(ty);
        }
    }
    conditions.sort();
    let entries = compile_entries(w.entries, lists, &writer_at, problems);
    Some(WriterRules {
        username,
        fields: drop_nested(fields),
        conditions,
        entries,
    })
}

/// A writer's `entries`: each names a declared list and holds non-empty,
/// distinct key values (opaque strings: any character is allowed).
fn compile_entries(
    entries: BTreeMap<String, Vec<String>>,
    lists: &[KeyedList],
    writer_at: &str,
    problems: &mut Vec<String>,
) -> BTreeMap<FieldPath, Vec<String>> {
    let mut compiled = BTreeMap::new();
    for (text, values) in entries {
        let Some(list) = FieldPath::parse(&text)
            .ok()
            .and_then(|path| lists.iter().find(|l| l.path == path))
        else {
            let declared: Vec<String> = lists.iter().map(|l| l.path.to_string()).collect();
            problems.push(format!(
                "{writer_at}: entries: {text:?} is not a list declared in lists: (declared: [{}])",
                declared.join(", ")
            ));
            continue;
        };
        let mut kept: Vec<String> = Vec::with_capacity(values.len());
        for (k, value) in values.into_iter().enumerate() {
            if value.is_empty() {
                problems.push(format!("{writer_at}: entries.{text}[{k}]: empty key value"));
            } else if kept.contains(&value) {
                problems.push(format!(
                    "{writer_at}: entries.{text}[{k}]: {} is listed twice",
                    serde_json::Value::from(value)
                ));
            } else {
                kept.push(value);
            }
        }
        kept.sort();
        compiled.insert(list.path.clone(), kept);
    }
    compiled
}

/// Every field and condition type has at most one owner among the writers.
fn check_single_owners(writers: &[WriterRules], at: &str, problems: &mut Vec<String>) {
    for (a, first) in writers.iter().enumerate() {
        for second in &writers[a + 1..] {
            for p in &first.fields {
                for q in second.fields.iter().filter(|q| p.overlaps(q)) {
                    problems.push(format!(
                        "{at}: field {p} of {} and field {q} of {} overlap; a field has one owner",
                        first.username, second.username
                    ));
                }
            }
            for c in first.conditions.iter().filter(|c| second.conditions.contains(c)) {
                problems.push(format!(
                    "{at}: condition type {c} is declared by both {} and {}",
                    first.username, second.username
                ));
            }
            for (list, values) in &first.entries {
                for value in values.iter().filter(|v| second.entries_of(list).contains(v)) {
                    problems.push(format!(
                        "{at}: the entries of status.{list} keyed {} are declared by both {} and {}; a key value has one owner per list",
                        serde_json::Value::from(value.as_str()),
                        first.username,
                        second.username
                    ));
                }
            }
        }
    }
}

/// A service-account name: a DNS-1123 subdomain (dots allowed).
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(|label| is_dns_label(label, 253))
}

/// A namespace name: a DNS-1123 label (no dots, at most 63 characters).
fn is_namespace_name(s: &str) -> bool {
    is_dns_label(s, 63)
}

/// A plural resource name: a DNS-1123 label, as the API server's resource
/// names and CRDs' plurals are.
fn is_resource_name(s: &str) -> bool {
    is_dns_label(s, 63)
}

fn is_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}
