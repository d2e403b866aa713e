//! The admission decision: a pure function of (rules, request head, the two
//! statuses, endpoint).
//!
//! No I/O, no clock, no parsing: the statuses come projected (see
//! `answer`). The API server sends UPDATE for PUT and for every kind of
//! PATCH alike, so the decision is made on the difference between
//! `oldObject` and `object`, never on the verb. `plan` says, from the head
//! alone, whether the statuses are read at all: exempt writers and requests
//! that are not guarded status updates never have their objects parsed.
//!
//! Values are compared with [`same_value`]: absent and `null` are the same at
//! every depth inside an owned value, numbers compare exactly, a condition
//! type by its list items in any order.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kube::core::admission::AdmissionResponse;
use kube::core::response::StatusSummary;
use serde_json::Value;

use super::project::{ChangedGroups, ProjectedStatuses};
use super::trim::restoring_patch;
use super::wire::RequestHead;
use crate::ownership::{Item, Mode, Ownership, ResourceRules, Violation, condition_type, same_value};
use crate::value_budget::REVIEW_VALUE_BUDGET;
use compare::changed_keys;

/// Which webhook endpoint asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// The validating webhook: denies (enforce, trim) or warns (audit).
    Validate,
    /// The mutating webhook: restores others' items (trim).
    Mutate,
}

impl Endpoint {
    /// The endpoint's name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Validate => "validate",
            Endpoint::Mutate => "mutate",
        }
    }
}

/// What the decision did, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Not a status UPDATE of a configured resource: not inspected.
    Skipped,
    /// The writer is exempt.
    Exempt,
    /// Inspected; nothing to object to here.
    Allowed,
    /// Denied with 409 Conflict.
    Denied,
    /// Allowed with a JSON Patch that restores other writers' items.
    Trimmed,
    /// Allowed with warnings (audit).
    Warned,
}

impl Outcome {
    /// The outcome's name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Skipped => "skipped",
            Outcome::Exempt => "exempt",
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Trimmed => "trimmed",
            Outcome::Warned => "warned",
        }
    }
}

/// The metric label of a request for a resource the rules do not name:
/// labels are bounded by configuration, never by what requests carry.
pub const UNCONFIGURED: &str = "(unconfigured)";

/// The decision on one request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// What was decided.
    pub outcome: Outcome,
    /// The user name that wrote, as the API server reported it.
    pub writer: String,
    /// The group and resource as metric labels: the configured names, or
    /// [`UNCONFIGURED`] for both when the rules do not name the resource.
    pub labels: ResourceLabels,
    /// The resource's mode; `None` when the rules do not name it.
    pub mode: Option<Mode>,
    /// The violations this decision acted on (denied, restored or reported).
    pub violations: Vec<Violation>,
    /// The answer to send.
    pub response: AdmissionResponse,
}

/// The group and resource a decision counts under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceLabels {
    /// The API group, or [`UNCONFIGURED`].
    pub group: String,
    /// The plural resource name, or [`UNCONFIGURED`].
    pub resource: String,
}

/// A request that cannot be decided: the API server never sends one
/// (unless the webhook is registered for another version than the rules).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// The rules' paths are written for one version and the review's objects
    /// are in another: read against the wrong layout, they would decide wrongly.
    #[error(
        "the rules of {resource} are written for version {wanted}, and this review {got}: the webhook must be registered with apiVersions [{wanted}] and matchPolicy Equivalent, so that the API server converts the write"
    )]
    WrongVersion {
        /// `group/resource`.
        resource: String,
        /// The version the rules name.
        wanted: String,
        /// `is for version V`, or `names no version`.
        got: String,
    },
    /// A status UPDATE without `object` or `oldObject`.
    #[error("a status UPDATE review must carry {0}")]
    MissingObject(&'static str),
    /// `object` or `oldObject` is not JSON statusguard can read.
    #[error("{which} cannot be read: {reason}")]
    Malformed {
        /// `object` or `oldObject`.
        which: &'static str,
        /// Why.
        reason: String,
    },
    /// Deeper than any object the API server stores.
    #[error(
        "{which} is nested {depth} levels deep; statusguard decides up to {MAX_NESTING} levels (the API server's own limit is 10000)"
    )]
    TooDeep {
        /// `object` or `oldObject`.
        which: &'static str,
        /// Its nesting.
        depth: usize,
    },
    /// Its owned values would cost more memory to compare than a review is
    /// given (32 MiB of estimated values): no status the API server can store
    /// comes near it, only a forged review.
    #[error(
        "the owned values of {which} would need more than {} MiB to compare; statusguard gives one review that much",
        REVIEW_VALUE_BUDGET / (1024 * 1024)
    )]
    TooLarge {
        /// `object` or `oldObject`.
        which: &'static str,
    },
    /// Building the JSON Patch failed (a bug, reported in-band as 500).
    #[error("could not build the restoring patch: {0}")]
    Patch(String),
}

impl DecisionError {
    /// The HTTP-like code the denial carries: 500 for statusguard's own
    /// failures (a patch it cannot make, a webhook registered for another
    /// version than its rules), 400 for a request the API server would never send.
    pub fn code(&self) -> u16 {
        match self {
            DecisionError::Patch(_) | DecisionError::WrongVersion { .. } => 500,
            DecisionError::TooLarge { .. } => 413,
            _ => 400,
        }
    }
}

/// The deepest object statusguard decides: the API server's JSON decoder
/// stops at 10,000 levels, and this leaves room above it.
pub const MAX_NESTING: usize = 16_384;

/// How many violations a deny message names before it says "and N more".
pub(crate) const MESSAGE_ITEMS: usize = 10;
/// The API server asks webhooks to keep each warning under 120 characters.
const WARNING_CHARS: usize = 120;

/// Whether a request's objects are read, and under which rules.
pub(crate) enum Plan<'r> {
    /// Answered on the head alone, with this outcome.
    Answer(Outcome),
    /// The statuses are read and compared under these rules.
    Read(&'r ResourceRules),
    /// Refused without reading the objects.
    Refuse(DecisionError),
}

/// The one place that says which requests have their objects read: the
/// single pass asks it before it reads an object, the decision before it
/// decides.
pub(crate) fn plan<'r>(rules: &'r Ownership, head: &RequestHead<'_>, endpoint: Endpoint) -> Plan<'r> {
    let resource_rules = match rules.resource(&head.resource.group, &head.resource.resource) {
        Some(r) if head.is_status_update() => r,
        _ => return Plan::Answer(Outcome::Skipped),
    };
    // Exempt writers are decided on who they are alone: nothing of the
    // object is read, whatever its shape.
    if rules.is_exempt(head.user_info.name(), head.user_info.group_names()) {
        return Plan::Answer(Outcome::Exempt);
    }
    // The mutating endpoint has work only in trim mode; enforce and audit are
    // decided once, at /validate.
    if endpoint == Endpoint::Mutate && resource_rules.mode != Mode::Trim {
        return Plan::Answer(Outcome::Allowed);
    }
    if let Some(wanted) = resource_rules
        .version
        .as_deref()
        .filter(|&v| v != head.resource.version)
    {
        return Plan::Refuse(DecisionError::WrongVersion {
            resource: resource_rules.name(),
            wanted: wanted.to_owned(),
            got: Some(head.resource.version.as_str())
                .filter(|v| !v.is_empty())
                .map_or_else(|| "names no version".to_owned(), |v| format!("is for version {v}")),
        });
    }
    Plan::Read(resource_rules)
}

/// Decides one admission request on its head and its two statuses, each
/// `None` where the review carries no such object and `Some(None)` where
/// the object has no status. The statuses need hold only what the rules
/// read: the projection of the status on the resource's paths (or the
/// whole status).
pub fn decide(
    rules: &Ownership,
    head: &RequestHead<'_>,
    endpoint: Endpoint,
    old: Option<Option<&Value>>,
    new: Option<Option<&Value>>,
) -> Result<Decision, DecisionError> {
    decide_statuses(rules, head, endpoint, (old, new), &ChangedGroups::default())
}

/// [`decide`] on statuses as [`realize`](super::project::realize) projects
/// them: the groups of items it proved changed are left out of both
/// statuses, and count as changed.
pub(crate) fn decide_projected(
    rules: &Ownership,
    head: &RequestHead<'_>,
    endpoint: Endpoint,
    statuses: &ProjectedStatuses,
) -> Result<Decision, DecisionError> {
    let both = (
        statuses.old.as_ref().map(Option::as_ref),
        statuses.new.as_ref().map(Option::as_ref),
    );
    decide_statuses(rules, head, endpoint, both, &statuses.changed)
}

fn decide_statuses(
    rules: &Ownership,
    head: &RequestHead<'_>,
    endpoint: Endpoint,
    (old, new): (Option<Option<&Value>>, Option<Option<&Value>>),
    changed: &ChangedGroups,
) -> Result<Decision, DecisionError> {
    let writer = head.user_info.name();
    let configured = rules.resource(&head.resource.group, &head.resource.resource);
    let labels = match configured {
        Some(r) => ResourceLabels {
            group: r.group.clone(),
            resource: r.resource.clone(),
        },
        None => ResourceLabels {
            group: UNCONFIGURED.to_owned(),
            resource: UNCONFIGURED.to_owned(),
        },
    };
    let decision = |outcome, violations, response| Decision {
        outcome,
        writer: writer.to_owned(),
        labels: labels.clone(),
        mode: configured.map(|r| r.mode),
        violations,
        response,
    };
    let allow = head.allow();
    let resource_rules = match plan(rules, head, endpoint) {
        Plan::Answer(outcome) => return Ok(decision(outcome, vec![], allow)),
        Plan::Refuse(refused) => return Err(refused),
        Plan::Read(resource_rules) => resource_rules,
    };
    let old = old.ok_or(DecisionError::MissingObject("oldObject"))?;
    let new = new.ok_or(DecisionError::MissingObject("object"))?;
    let violations = violations_in(resource_rules, writer, old, new, changed);
    if violations.is_empty() {
        return Ok(decision(Outcome::Allowed, vec![], allow));
    }
    act(resource_rules, writer, violations, (old, new, changed), endpoint, allow)
        .map(|(outcome, violations, response)| decision(outcome, violations, response))
}

/// What the violations found lead to, by endpoint and mode.
fn act(
    resource_rules: &ResourceRules,
    writer: &str,
    violations: Vec<Violation>,
    (old, new, changed): (Option<&Value>, Option<&Value>, &ChangedGroups),
    endpoint: Endpoint,
    allow: AdmissionResponse,
) -> Result<(Outcome, Vec<Violation>, AdmissionResponse), DecisionError> {
    Ok(match (endpoint, resource_rules.mode) {
        (Endpoint::Validate, Mode::Enforce | Mode::Trim) => {
            let response = deny_conflict(allow, writer, &violations);
            (Outcome::Denied, violations, response)
        }
        (Endpoint::Validate, Mode::Audit) => {
            let mut response = allow;
            response.warnings = Some(violations.iter().map(|v| warning("changed", v)).collect());
            response.audit_annotations.insert(
                "violations".to_owned(),
                violations
                    .iter()
                    .map(Violation::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            );
            response
                .audit_annotations
                .insert("writer".to_owned(), writer.to_owned());
            (Outcome::Warned, violations, response)
        }
        (Endpoint::Mutate, _) => {
            let patch = restoring_patch(resource_rules, &violations, old, new, changed)
                .map_err(|e| DecisionError::Patch(e.to_string()))?;
            // kube sets the patch type only with a patch it encodes itself:
            // an empty one, replaced by the restoring patch's text.
            let mut response = allow
                .with_patch(json_patch::Patch(Vec::new()))
                .map_err(|e| DecisionError::Patch(e.to_string()))?;
            response.patch = Some(patch);
            response.warnings = Some(violations.iter().map(|v| warning("restored", v)).collect());
            (Outcome::Trimmed, violations, response)
        }
    })
}

/// Every item owned by another writer that differs between the two statuses.
#[cfg(test)]
pub(crate) fn find_violations(
    rules: &ResourceRules,
    writer: &str,
    old_status: Option<&Value>,
    new_status: Option<&Value>,
) -> Vec<Violation> {
    violations_in(rules, writer, old_status, new_status, &ChangedGroups::default())
}

/// [`find_violations`], where the groups of items in `changed` (left out of
/// both statuses) are known to differ.
fn violations_in(
    rules: &ResourceRules,
    writer: &str,
    old_status: Option<&Value>,
    new_status: Option<&Value>,
    changed: &ChangedGroups,
) -> Vec<Violation> {
    // Only the items the two statuses hold are looked at, through the owner
    // index: the cost follows the review, not the number of writers.
    // (writer, 0 for a field, 1 for a condition or 2 for keyed entries,
    // position, position of the key value): document order.
    let mut found: BTreeSet<(usize, u8, usize, usize)> = BTreeSet::new();
    let present: BTreeSet<&str> = [old_status, new_status]
        .into_iter()
        .filter_map(|status| status.and_then(Value::as_object))
        .flat_map(|map| map.keys().map(String::as_str))
        .collect();
    for key in present {
        for &(w, f) in rules
            .owners
            .fields_by_key
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let path = &rules.writers[w].fields[f];
            if rules.writers[w].username != writer && !same_value(path.get(old_status), path.get(new_status)) {
                found.insert((w, 0, f, 0));
            }
        }
    }
    // Each type once: a type in both statuses is compared once, not twice.
    let others = |w: usize| rules.writers[w].username != writer;
    let types = changed_keys(
        (rules.conditions(old_status), rules.conditions(new_status)),
        condition_type,
        changed.of(&rules.conditions_path),
        |ty| rules.owners.by_condition_type.get(ty).is_some_and(|&w| others(w)),
    );
    for ty in types {
        if let Some(&w) = rules.owners.by_condition_type.get(ty) {
            let position = rules.writers[w]
                .conditions
                .iter()
                .position(|c| c == ty)
                .unwrap_or_default();
            found.insert((w, 1, position, 0));
        }
    }
    // Keyed entries, the same way: by key value, each value once, entries
    // of one value a multiset. A key changed from V to W changes both groups.
    for (l, list) in rules.lists.iter().enumerate() {
        let Some(owners) = rules.owners.by_entry_key.get(l).filter(|o| !o.is_empty()) else {
            continue;
        };
        let values = changed_keys(
            (list.entries(old_status), list.entries(new_status)),
            |entry| list.key_of(entry),
            changed.of(&list.path),
            |value| owners.get(value).is_some_and(|&(w, _)| others(w)),
        );
        for value in values {
            if let Some(&(w, v)) = owners.get(value) {
                found.insert((w, 2, l, v));
            }
        }
    }
    found
        .into_iter()
        .map(|(w, kind, i, v)| {
            let owner = &rules.writers[w];
            let item = match kind {
                0 => Item::Field(owner.fields[i].clone()),
                1 => Item::Condition(owner.conditions[i].clone()),
                _ => {
                    let list = &rules.lists[i];
                    Item::Entry {
                        list: list.path.clone(),
                        key: list.key.clone(),
                        value: owner.entries_of(&list.path)[v].clone(),
                    }
                }
            };
            Violation {
                item,
                owner: owner.username.clone(),
            }
        })
        .collect()
}

fn deny_conflict(allow: AdmissionResponse, writer: &str, violations: &[Violation]) -> AdmissionResponse {
    // Written into one string, sized for the usual few violations: the
    // message is built for every denial. (Writing to a String cannot fail.)
    let mut message = String::with_capacity(512);
    let _ = write!(
        message,
        "statusguard: {writer} may not change status fields owned by other writers: "
    );
    for (at, violation) in violations.iter().take(MESSAGE_ITEMS).enumerate() {
        let separator = if at == 0 { "" } else { ", " };
        let _ = write!(message, "{separator}{violation}");
    }
    if violations.len() > MESSAGE_ITEMS {
        let _ = write!(message, ", and {} more", violations.len() - MESSAGE_ITEMS);
    }
    let mut response = allow.deny(message);
    // 409 makes client-go's and kube-rs's conflict handling refetch and retry,
    // which is exactly the recovery from writing a stale copy.
    response.result.code = 409;
    response.result.reason = "Conflict".to_owned();
    response.result.status = Some(StatusSummary::Failure);
    response
}

pub(crate) fn warning(verb: &str, violation: &Violation) -> String {
    let text = format!("statusguard {verb} {}, owned by {}", violation.item, violation.owner);
    if text.chars().count() <= WARNING_CHARS {
        text
    } else {
        let mut cut: String = text.chars().take(WARNING_CHARS - 1).collect();
        cut.push('…');
        cut
    }
}

/// Also the observer's: it names the entries a write changed as the decision compares them.
pub(super) mod compare;
#[cfg(test)]
mod tests;
