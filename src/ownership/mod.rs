//! The ownership document: who owns which status fields and condition types.
//!
//! One YAML document, shared by the webhook (`--ownership FILE`, or key
//! `ownership.yaml` of a ConfigMap) and by the library's status flush, so
//! that a controller and the webhook can never disagree about ownership.
//! [`Ownership::from_yaml`] parses and validates it completely; a document
//! with any error never becomes rules.

mod path;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::Deserialize;

pub use path::{FieldPath, PathError};
pub(crate) use path::{status_pointer, value_at};

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

/// Why a document cannot become rules. `Invalid` carries every rule broken,
/// each naming where.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("not a valid ownership document: {0}")]
    Syntax(String),
    #[error("invalid ownership document:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
    #[error("the ConfigMap has no key {CONFIGMAP_KEY:?}")]
    MissingKey,
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
    mode: Option<Mode>,
    conditions: Option<String>,
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

/// Only the one key of a ConfigMap manifest that `check` needs; everything
/// else in the manifest is Kubernetes' business.
#[derive(Debug, Deserialize)]
struct ConfigMapManifest {
    kind: String,
    #[serde(default)]
    data: BTreeMap<String, String>,
}

// ---- the validated rules -----------------------------------------------

/// Validated ownership rules, ready for decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub default_mode: Mode,
    pub exempt_users: BTreeSet<String>,
    pub exempt_groups: BTreeSet<String>,
    resources: Vec<ResourceRules>,
    /// group -> resource -> position in `resources`; looked up with
    /// borrowed strings, so the webhook's request path allocates nothing.
    index: HashMap<String, HashMap<String, usize>>,
}

/// The rules of one group/resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRules {
    pub group: String,
    pub resource: String,
    pub mode: Mode,
    /// Where the conditions list lives below `.status`.
    pub conditions_path: FieldPath,
    pub writers: Vec<WriterRules>,
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

    /// Accepts either the document itself or a ConfigMap manifest holding it
    /// under `data["ownership.yaml"]` (what `statusguard check FILE` reads).
    pub fn from_document_or_configmap(text: &str) -> Result<Self, OwnershipError> {
        if let Ok(cm) = serde_saphyr::from_str::<ConfigMapManifest>(text)
            && cm.kind == "ConfigMap"
        {
            let inner = cm.data.get(CONFIGMAP_KEY).ok_or(OwnershipError::MissingKey)?;
            return Self::from_yaml(inner);
        }
        Self::from_yaml(text)
    }

    /// The rules of a group/resource, if it is configured.
    pub fn resource(&self, group: &str, resource: &str) -> Option<&ResourceRules> {
        let &i = self.index.get(group)?.get(resource)?;
        self.resources.get(i)
    }

    pub fn resources(&self) -> &[ResourceRules] {
        &self.resources
    }

    pub fn is_exempt(&self, username: &str, groups: &[String]) -> bool {
        self.exempt_users.contains(username) || groups.iter().any(|g| self.exempt_groups.contains(g))
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
    pub fn writer(&self, username: &str) -> Option<&WriterRules> {
        self.writers.iter().find(|w| w.username == username)
    }

    /// `group/resource`, or just `resource` for the core group.
    pub fn name(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.group, self.resource)
        }
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
        if r.resource.is_empty() {
            problems.push(format!("{at}: resource must name the plural resource"));
        }
        if r.resource.contains('/') {
            problems.push(format!(
                "{at}: resource is the plural name only; statusguard always guards its /status"
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

fn compile_resource(r: ResourceDoc, default_mode: Mode, at: &str, problems: &mut Vec<String>) -> Option<ResourceRules> {
    let conditions_text = r.conditions.as_deref().unwrap_or("conditions");
    let conditions_path = match FieldPath::parse(conditions_text) {
        Ok(p) => Some(p),
        Err(e) => {
            problems.push(format!("{at}: conditions: {e}"));
            None
        }
    };

    let mut writers: Vec<WriterRules> = Vec::new();
    for (j, w) in r.writers.into_iter().enumerate() {
        let wat = format!("{at} writers[{j}]");
        let username = match (&w.service_account, &w.user) {
            (Some(sa), None) => match sa.split_once('/') {
                Some((ns, name)) if is_dns_name(ns) && is_dns_name(name) => service_account_username(ns, name),
                _ => {
                    problems.push(format!("{wat}: serviceAccount {sa:?} must be NAMESPACE/NAME"));
                    continue;
                }
            },
            (None, Some(user)) if !user.is_empty() => user.clone(),
            (None, Some(_)) => {
                problems.push(format!("{wat}: user is empty"));
                continue;
            }
            _ => {
                problems.push(format!("{wat}: a writer needs exactly one of serviceAccount or user"));
                continue;
            }
        };
        let wat = format!("{at} writer {username}");
        if writers.iter().any(|other| other.username == username) {
            problems.push(format!("{wat}: appears twice"));
            continue;
        }

        let mut fields = Vec::new();
        for text in &w.fields {
            match FieldPath::parse(text) {
                Ok(path) => {
                    if let Some(cond) = &conditions_path
                        && path.overlaps(cond)
                    {
                        problems.push(format!(
                            "{wat}: field {text:?} overlaps the conditions list at status.{cond}; own condition types instead"
                        ));
                        continue;
                    }
                    fields.push(path);
                }
                Err(e) => problems.push(format!("{wat}: field: {e}")),
            }
        }
        let mut conditions: Vec<String> = Vec::new();
        for ty in w.conditions {
            if ty.is_empty() {
                problems.push(format!("{wat}: empty condition type"));
            } else if !conditions.contains(&ty) {
                conditions.push(ty);
            }
        }
        writers.push(WriterRules {
            username,
            fields: drop_nested(fields),
            conditions: {
                conditions.sort();
                conditions
            },
        });
    }

    for (a, first) in writers.iter().enumerate() {
        for second in &writers[a + 1..] {
            for p in &first.fields {
                for q in &second.fields {
                    if p.overlaps(q) {
                        problems.push(format!(
                            "{at}: field {p} of {} and field {q} of {} overlap; a field has one owner",
                            first.username, second.username
                        ));
                    }
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

    Some(ResourceRules {
        group: r.group,
        resource: r.resource,
        mode: r.mode.unwrap_or(default_mode),
        conditions_path: conditions_path?,
        writers,
    })
}

/// Keeps only the outermost of one writer's paths: a declared object is owned
/// whole, so a path below it adds nothing. Order of declaration never matters.
pub fn drop_nested(mut paths: Vec<FieldPath>) -> Vec<FieldPath> {
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

/// A Kubernetes namespace or service-account name (DNS-1123 subdomain).
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests;
