//! The ownership document: who owns which status fields and condition types.
//!
//! One YAML document, shared by the webhook (`--ownership FILE`, or key
//! `ownership.yaml` of a ConfigMap) and by the library's status flush, so
//! that a controller and the webhook can never disagree about ownership.
//! [`Ownership::from_yaml`] parses and validates it completely; a document
//! with any error never becomes rules.

mod document;
mod item;
mod path;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::Deserialize;

pub use item::{Item, Violation};
pub use path::{FieldPath, Parents, PathError, condition_type, drop_iteratively, same_value};
pub(crate) use path::{KeyedItems, PathTree, write_canonical};

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
    index: LookupMap<String, LookupMap<String, usize>>,
}

/// The tables every review is looked up in, by its strings (group,
/// resource, condition types, field names, entry keys): foldhash, seeded at
/// random per process as std's `RandomState` is, so that the strings a
/// caller sends cannot be chosen to collide, at a fraction of SipHash's cost.
pub(crate) type LookupMap<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

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
    /// The keyed lists, in document order: lists whose entries belong to
    /// the writer that declares the value of their key member.
    pub lists: Vec<KeyedList>,
    /// The writers in document order.
    pub writers: Vec<WriterRules>,
    /// Every status path the decision reads: the owned fields, the conditions
    /// list and the keyed lists (read whole).
    pub(crate) read_paths: PathTree,
    /// Who owns what, by the first segment of a field and by condition type:
    /// a review is checked for the items it holds, whatever the number of writers.
    pub(crate) owners: OwnerIndex,
}

/// Positions in [`ResourceRules::writers`] of the owners of fields (by the
/// field's first segment: `(writer, field)`) and of condition types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OwnerIndex {
    pub(crate) fields_by_key: LookupMap<String, Vec<(usize, usize)>>,
    pub(crate) by_condition_type: LookupMap<String, usize>,
    /// Per keyed list (by position in [`ResourceRules::lists`]): key value ->
    /// (writer, position of the value in the writer's entries of that list).
    pub(crate) by_entry_key: Vec<LookupMap<String, (usize, usize)>>,
}

impl OwnerIndex {
    fn of(lists: &[KeyedList], writers: &[WriterRules]) -> Self {
        let mut index = Self {
            by_entry_key: lists
                .iter()
                .map(|list| {
                    let mut owners = LookupMap::default();
                    for (w, writer) in writers.iter().enumerate() {
                        for (v, value) in writer.entries_of(&list.path).iter().enumerate() {
                            owners.insert(value.clone(), (w, v));
                        }
                    }
                    owners
                })
                .collect(),
            ..Self::default()
        };
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
    /// Owned entries: by keyed list path, the key values (sorted, unique)
    /// whose entries this writer owns.
    pub entries: BTreeMap<FieldPath, Vec<String>>,
}

impl WriterRules {
    /// The key values this writer owns in the keyed list at `list`.
    pub fn entries_of(&self, list: &FieldPath) -> &[String] {
        self.entries.get(list).map(Vec::as_slice).unwrap_or_default()
    }
}

/// A list below `.status` whose entries each name their owner in one member
/// (Gateway API's `status.parents`, keyed by `controllerName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedList {
    /// Where the list lives below `.status`.
    pub path: FieldPath,
    /// The member of each entry whose string value names the entry's owner.
    pub key: String,
}

impl KeyedList {
    /// The key value of an entry: its `key` member, when that is a string.
    /// An entry without one belongs to no writer.
    pub fn key_of<'v>(&self, entry: &'v serde_json::Value) -> Option<&'v str> {
        entry.get(&self.key).and_then(serde_json::Value::as_str)
    }

    /// The list in a status; anything that is not a list counts as empty.
    pub fn entries<'a>(&self, status: Option<&'a serde_json::Value>) -> &'a [serde_json::Value] {
        self.path
            .get(status)
            .and_then(serde_json::Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
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
        let doc: document::Document =
            serde_saphyr::from_str(text).map_err(|e| OwnershipError::Syntax(e.to_string()))?;
        document::compile(doc)
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
    /// The conditions list of a status; anything that is not a list counts
    /// as empty.
    pub(crate) fn conditions<'a>(&self, status: Option<&'a serde_json::Value>) -> &'a [serde_json::Value] {
        self.conditions_path
            .get(status)
            .and_then(serde_json::Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The entry of `username`, if the document lists it.
    pub fn writer(&self, username: &str) -> Option<&WriterRules> {
        self.writers.iter().find(|w| w.username == username)
    }

    /// The position of `username` among the writers, where it is one.
    pub(crate) fn writer_position(&self, username: &str) -> Option<usize> {
        self.writers.iter().position(|w| w.username == username)
    }

    /// `group/resource`, or just `resource` for the core group.
    pub fn name(&self) -> String {
        GroupResource::new(self.group.as_str(), self.resource.as_str()).to_string()
    }
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

#[cfg(test)]
mod tests;
