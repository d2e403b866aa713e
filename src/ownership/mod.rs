//! The ownership document: who owns which status fields and condition types.
//!
//! One YAML document, shared by the webhook (`--ownership FILE`, or key
//! `ownership.yaml` of a ConfigMap) and by the library's status flush, so
//! that a controller and the webhook can never disagree about ownership.
//! [`Ownership::from_yaml`] parses and validates it completely; a document
//! with any error never becomes rules.

mod path;

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde::Deserialize;

pub use path::{FieldPath, Parents, PathError, condition_type, drop_iteratively, same_value};
pub(crate) use path::{PathTree, write_canonical};

/// The `apiVersion` of the ownership document.
pub const API_VERSION: &str = "statusguard.dev/v1alpha1";
/// The `kind` of the ownership document.
pub const KIND: &str = "StatusOwnership";
/// The ConfigMap key that holds the document.
pub const CONFIGMAP_KEY: &str = "ownership.yaml";

/// What happens to a write that changes what another writer owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `/validate` denies the write with 409 Conflict.
    #[default]
    Enforce,
    /// `/mutate` restores the other writers' items with a JSON Patch;
    /// `/validate` denies whatever is left as a backstop.
    Trim,
    /// `/validate` allows the write with warnings and audit annotations.
    Audit,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "enforce",
            Mode::Trim => "trim",
            Mode::Audit => "audit",
        })
    }
}

/// What the API server does with a write when the webhook cannot answer
/// (the webhook's `failurePolicy`): per resource in the document, and the
/// server's default (`--webhook-failure-policy fail|ignore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[cfg_attr(feature = "server", derive(clap::ValueEnum))]
pub enum FailurePolicy {
    /// The write is refused: ownership is never bypassed.
    Fail,
    /// The write passes unguarded.
    Ignore,
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        })
    }
}

/// Why a document cannot become rules. `Invalid` carries every rule broken,
/// each naming where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OwnershipError {
    /// Not YAML of the document's shape (with line and column).
    #[error("not a valid ownership document: {0}")]
    Syntax(String),
    /// Well-formed, but rules are broken; one line per problem.
    #[error("invalid ownership document:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

impl OwnershipError {
    /// Every problem as its own line, for logs, Events and `check`.
    pub fn problems(&self) -> Vec<String> {
        match self {
            OwnershipError::Invalid(problems) => problems.clone(),
            other => vec![other.to_string()],
        }
    }
}

// ---- the document as written -------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
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
    writers: Vec<WriterDoc>,
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
}

// ---- the validated rules -----------------------------------------------

/// Validated ownership rules, ready for decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    /// The mode of every resource that names none.
    pub default_mode: Mode,
    /// User names that may change any status field (break-glass).
    pub exempt_users: BTreeSet<String>,
    /// Groups whose members may change any status field.
    pub exempt_groups: BTreeSet<String>,
    resources: Vec<ResourceRules>,
    /// group -> resource -> position in `resources`; looked up with
    /// borrowed strings, so the webhook's request path allocates nothing.
    index: HashMap<String, HashMap<String, usize>>,
}

/// The rules of one group/resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRules {
    /// The API group; `""` is the core group.
    pub group: String,
    /// The plural resource name.
    pub resource: String,
    /// The version the paths are written against (`v1`, `v1beta2`): the
    /// webhooks are registered for it with `matchPolicy: Equivalent`, so the
    /// API server converts a write made in any other version to it. `None`:
    /// the server takes the CRD's storage version when it registers.
    pub version: Option<String>,
    /// What happens to a write that changes another writer's items.
    pub mode: Mode,
    /// This resource's webhook `failurePolicy`, where it differs from the
    /// server's (audit resources always have `Ignore`).
    pub failure_policy: Option<FailurePolicy>,
    /// This resource's webhook `timeoutSeconds` (1 to 30), where it differs.
    pub timeout_seconds: Option<i32>,
    /// Where the conditions list lives below `.status`.
    pub conditions_path: FieldPath,
    /// The writers in document order.
    pub writers: Vec<WriterRules>,
    /// Every status path the decision reads: the owned fields and the conditions list.
    pub(crate) read_paths: PathTree,
    /// Who owns what, by the first segment of a field and by condition type:
    /// a review is checked for the items it holds, whatever the number of writers.
    pub(crate) owners: OwnerIndex,
}

/// Positions in [`ResourceRules::writers`] of the owners of fields (by the
/// field's first segment: `(writer, field)`) and of condition types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OwnerIndex {
    pub(crate) fields_by_key: HashMap<String, Vec<(usize, usize)>>,
    pub(crate) by_condition_type: HashMap<String, usize>,
}

impl OwnerIndex {
    fn of(writers: &[WriterRules]) -> Self {
        let mut index = Self::default();
        for (w, writer) in writers.iter().enumerate() {
            for (f, field) in writer.fields.iter().enumerate() {
                if let Some(first) = field.segments().first() {
                    index.fields_by_key.entry(first.clone()).or_default().push((w, f));
                }
            }
            for ty in &writer.conditions {
                index.by_condition_type.insert(ty.clone(), w);
            }
        }
        index
    }
}

/// What one writer owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterRules {
    /// The user name the API server reports in `userInfo.username`.
    pub username: String,
    /// Owned field paths, none below another (nested declarations dropped), sorted.
    pub fields: Vec<FieldPath>,
    /// Owned condition types, sorted and unique.
    pub conditions: Vec<String>,
}

/// A resource by API group and plural name, written `group/resource`
/// (`resource` alone for the core group).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// The API group; `""` is the core group.
    pub group: String,
    /// The plural resource name.
    pub resource: String,
}

impl GroupResource {
    /// The resource `resource` of API group `group`.
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
        }
    }
}

impl fmt::Display for GroupResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}/{}", self.group, self.resource)
        }
    }
}

/// The API server's user name of a service account.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

impl Ownership {
    /// Parses and validates a document, reporting every broken rule.
    pub fn from_yaml(text: &str) -> Result<Self, OwnershipError> {
        let doc: Document = serde_saphyr::from_str(text).map_err(|e| OwnershipError::Syntax(e.to_string()))?;
        compile(doc)
    }

    /// The rules of a group/resource, if it is configured.
    pub fn resource(&self, group: &str, resource: &str) -> Option<&ResourceRules> {
        let &i = self.index.get(group)?.get(resource)?;
        self.resources.get(i)
    }

    /// Every configured resource, in document order.
    pub fn resources(&self) -> &[ResourceRules] {
        &self.resources
    }

    /// True when the user or one of its groups is exempt (break-glass).
    pub fn is_exempt<G: AsRef<str>>(&self, username: &str, groups: &[G]) -> bool {
        self.exempt_users.contains(username) || groups.iter().any(|g| self.exempt_groups.contains(g.as_ref()))
    }

    /// A one-line summary for `check` and logs.
    pub fn summary(&self) -> String {
        let (mut writers, mut fields, mut conditions) = (0, 0, 0);
        for w in self.resources.iter().flat_map(|r| &r.writers) {
            writers += 1;
            fields += w.fields.len();
            conditions += w.conditions.len();
        }
        format!(
            "{} resources, {writers} writers, {fields} fields, {conditions} condition types (default mode {})",
            self.resources.len(),
            self.default_mode
        )
    }
}

impl ResourceRules {
    /// The entry of `username`, if the document lists it.
    pub fn writer(&self, username: &str) -> Option<&WriterRules> {
        self.writers.iter().find(|w| w.username == username)
    }

    /// `group/resource`, or just `resource` for the core group.
    pub fn name(&self) -> String {
        GroupResource::new(self.group.as_str(), self.resource.as_str()).to_string()
    }
}

fn compile(doc: Document) -> Result<Ownership, OwnershipError> {
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
    let mut index: HashMap<String, HashMap<String, usize>> = HashMap::new();
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

/// Core resources whose status the kubelet or the control plane writes:
/// guarding them where a webhook outage fails writes can stall the cluster
/// itself (nodes going NotReady, pods never scheduled), so the document must
/// say so explicitly.
pub const SYSTEM_RESOURCES: [&str; 8] = [
    "nodes",
    "pods",
    "namespaces",
    "services",
    "persistentvolumes",
    "persistentvolumeclaims",
    "replicationcontrollers",
    "resourcequotas",
];

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
    let mut writers: Vec<WriterRules> = Vec::new();
    for (j, w) in r.writers.into_iter().enumerate() {
        if let Some(writer) = compile_writer(w, at, j, conditions_path.as_ref(), problems) {
            if writers.iter().any(|other| other.username == writer.username) {
                problems.push(format!("{at} writer {}: appears twice", writer.username));
            } else {
                writers.push(writer);
            }
        }
    }
    check_single_owners(&writers, at, problems);
    let conditions_path = conditions_path?;
    let read_paths = PathTree::with_conditions(
        writers.iter().flat_map(|w| &w.fields),
        &conditions_path,
        writers.iter().flat_map(|w| w.conditions.iter().cloned()),
    );
    let owners = OwnerIndex::of(&writers);
    Some(ResourceRules {
        group: r.group,
        resource: r.resource,
        version,
        mode,
        failure_policy: r.failure_policy,
        timeout_seconds: r.timeout_seconds,
        conditions_path,
        writers,
        read_paths,
        owners,
    })
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
    Some(WriterRules {
        username,
        fields: drop_nested(fields),
        conditions,
    })
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
        }
    }
}

/// Keeps only the outermost of one writer's paths: a declared object is owned
/// whole, so a path below it adds nothing. Order of declaration never matters.
pub(crate) fn drop_nested(mut paths: Vec<FieldPath>) -> Vec<FieldPath> {
    // Sorted by segments, a parent comes right before its children.
    paths.sort();
    paths.dedup();
    let mut kept: Vec<FieldPath> = Vec::with_capacity(paths.len());
    for path in paths {
        if !kept.last().is_some_and(|parent| path.is_within(parent)) {
            kept.push(path);
        }
    }
    kept
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

#[cfg(test)]
mod tests;
