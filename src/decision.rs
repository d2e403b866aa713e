//! The admission decision: a pure function of (rules, request, endpoint).
//!
//! No I/O, no clock. The API server sends UPDATE for PUT and for every kind
//! of PATCH alike, so the decision is made on the difference between
//! `oldObject` and `object`, never on the verb. Only the status paths the
//! rules name are parsed (`project_status`); exempt writers and requests
//! that are not guarded status updates never have their objects parsed.
//!
//! Values are compared with [`same_value`]: absent and `null` are the same at
//! every depth inside an owned value, numbers compare exactly, a condition
//! type by its list items in any order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use json_patch::{Patch, PatchOperation, RemoveOperation};
use kube::core::admission::AdmissionResponse;
use kube::core::response::StatusSummary;
use serde_json::Value;

use crate::ownership::{
    FieldPath, Mode, Ownership, ResourceRules, condition_type, drop_iteratively, same_value, write_canonical,
};
use crate::review::{
    Depth, ObjectView, ProjectError, ProjectedStatuses, RequestHead, ReviewError, ReviewRequest, is_status_update,
    nesting_depth, parse_request, parse_request_projecting, project_status,
};
use crate::value_budget::{REVIEW_VALUE_BUDGET, ValueBudget};

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

/// An owned item of the status.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Item {
    /// A field path below `.status`.
    Field(FieldPath),
    /// A condition type.
    Condition(String),
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Field(path) => write!(f, "status.{path}"),
            Item::Condition(ty) => write!(f, "condition {ty}"),
        }
    }
}

/// A change by `writer` to an `item` that `owner` owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What was changed.
    pub item: Item,
    /// Who owns it.
    pub owner: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (owned by {})", self.item, self.owner)
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
/// Stack for the parse, compare, copy and encode of one level of a deep
/// value (debug builds use several times what release builds do).
const STACK_PER_LEVEL: usize = 16 * 1024;
const STACK_BASE: usize = 1024 * 1024;

/// How many violations a deny message names before it says "and N more".
const MESSAGE_ITEMS: usize = 10;
/// The API server asks webhooks to keep each warning under 120 characters.
const WARNING_CHARS: usize = 120;

/// Reads a review body and decides it: the request as read, and the
/// decision on it (or why it could not be decided).
///
/// The body is read once where it can be: the decision's plan is made from
/// the request's head (resource, subresource, operation, writer), which the
/// API server writes before the objects, and each object's status is
/// projected on the plan's paths as it is read (an object written before
/// the head is projected once the head is known). Anything the single pass
/// does not handle alone (a head member after the objects, a malformed
/// body, a deep read value) is read and decided again by [`parse_request`]
/// and [`decide`], which give the same answer for every body the single
/// pass reads, in any member order (a property test and the
/// `review_member_order` fuzz target compare them).
pub fn read_and_decide<'b>(
    rules: &Ownership,
    body: &'b [u8],
    endpoint: Endpoint,
) -> Result<(ReviewRequest<'b>, Result<Decision, DecisionError>), ReviewError> {
    // Every value built from this body spends from one budget.
    let _budget = ValueBudget::enter(REVIEW_VALUE_BUDGET);
    let plan_paths = |head: RequestHead<'_>| match plan(rules, head, endpoint) {
        Plan::Read(resource_rules) => Some(&resource_rules.read_paths),
        Plan::Answer(_) | Plan::Refuse(_) => None,
    };
    if let Some((request, statuses)) = parse_request_projecting(body, plan_paths) {
        let decided = match &statuses {
            Some(statuses) => decide_at(rules, &request, endpoint, Statuses::Projected(statuses)),
            None => decide(rules, &request, endpoint),
        };
        return Ok((request, decided));
    }
    let request = parse_request(body)?;
    let decided = decide(rules, &request, endpoint);
    Ok((request, decided))
}

/// Decides one admission request.
///
/// Objects nested deeper than serde_json's default limit are decided the
/// same way, on a stack allocated for their measured depth, up to
/// [`MAX_NESTING`] levels.
pub fn decide(rules: &Ownership, request: &ReviewRequest<'_>, endpoint: Endpoint) -> Result<Decision, DecisionError> {
    let _budget = ValueBudget::enter(REVIEW_VALUE_BUDGET);
    match decide_at(rules, request, endpoint, Statuses::Project(Depth::Bounded)) {
        Err(DecisionError::TooDeep { .. }) => {
            let mut deepest = 0;
            for (which, view) in [("object", request.object), ("oldObject", request.old_object)] {
                let depth = view.and_then(|v| v.status).map_or(0, |raw| nesting_depth(raw.get()));
                if depth > MAX_NESTING {
                    return Err(DecisionError::TooDeep { which, depth });
                }
                deepest = deepest.max(depth);
            }
            stacker::grow(STACK_BASE + deepest * STACK_PER_LEVEL, || {
                decide_at(rules, request, endpoint, Statuses::Project(Depth::Unbounded))
            })
        }
        other => other,
    }
}

/// Whether a request's objects are read, and under which rules.
enum Plan<'r> {
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
fn plan<'r>(rules: &'r Ownership, head: RequestHead<'_>, endpoint: Endpoint) -> Plan<'r> {
    let resource_rules = match rules.resource(&head.resource.group, &head.resource.resource) {
        Some(r) if is_status_update(head.operation, head.sub_resource) => r,
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

/// Where the decision gets the two statuses from.
enum Statuses<'p> {
    /// Projected from the request's objects, at this depth.
    Project(Depth),
    /// Projected already, by the single pass.
    Projected(&'p ProjectedStatuses),
}

fn decide_at(
    rules: &Ownership,
    request: &ReviewRequest<'_>,
    endpoint: Endpoint,
    statuses: Statuses<'_>,
) -> Result<Decision, DecisionError> {
    let writer = request.username();
    let configured = rules.resource(&request.resource.group, &request.resource.resource);
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

    let allow = request.allow();
    let head = RequestHead {
        resource: &request.resource,
        sub_resource: request.sub_resource.as_deref(),
        operation: &request.operation,
        user_info: &request.user_info,
    };
    let resource_rules = match plan(rules, head, endpoint) {
        Plan::Answer(outcome) => return Ok(decision(outcome, vec![], allow)),
        Plan::Refuse(refused) => return Err(refused),
        Plan::Read(resource_rules) => resource_rules,
    };

    let mut owned: (Option<Value>, Option<Value>) = (None, None);
    let (old, new) = match statuses {
        Statuses::Projected(projected) => (
            projected
                .old
                .as_ref()
                .ok_or(DecisionError::MissingObject("oldObject"))?
                .as_ref(),
            projected
                .new
                .as_ref()
                .ok_or(DecisionError::MissingObject("object"))?
                .as_ref(),
        ),
        Statuses::Project(depth) => {
            let status = |which: &'static str, view: Option<ObjectView<'_>>| {
                let Some(raw) = view.ok_or(DecisionError::MissingObject(which))?.status else {
                    return Ok(None);
                };
                project_status(raw, &resource_rules.read_paths, depth).map_err(|e| match e {
                    ProjectError::TooDeep => DecisionError::TooDeep { which, depth: 0 },
                    ProjectError::TooLarge => DecisionError::TooLarge { which },
                    other => DecisionError::Malformed {
                        which,
                        reason: other.to_string(),
                    },
                })
            };
            owned = (
                status("oldObject", request.old_object)?,
                status("object", request.object)?,
            );
            (owned.0.as_ref(), owned.1.as_ref())
        }
    };
    let violations = find_violations(resource_rules, writer, old, new);
    let decided = if violations.is_empty() {
        Ok(decision(Outcome::Allowed, vec![], allow))
    } else {
        act(resource_rules, writer, violations, old, new, endpoint, allow)
            .map(|(outcome, violations, response)| decision(outcome, violations, response))
    };
    // Projections made on the unbounded path may be nested as deep as the
    // API server allows: dropped without recursion, whatever the stack.
    // (A bounded projection is at most serde_json's 128 levels deep.)
    if let Statuses::Project(Depth::Unbounded) = statuses {
        let (old, new) = owned;
        old.into_iter().chain(new).for_each(drop_iteratively);
    }
    decided
}

/// What the violations found lead to, by endpoint and mode.
fn act(
    resource_rules: &ResourceRules,
    writer: &str,
    violations: Vec<Violation>,
    old: Option<&Value>,
    new: Option<&Value>,
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
            let patch = restoring_patch(resource_rules, &violations, old, new)?;
            let mut response = allow
                .with_patch(patch)
                .map_err(|e| DecisionError::Patch(e.to_string()))?;
            response.warnings = Some(violations.iter().map(|v| warning("restored", v)).collect());
            (Outcome::Trimmed, violations, response)
        }
    })
}

/// Every item owned by another writer that differs between the two statuses.
pub(crate) fn find_violations(
    rules: &ResourceRules,
    writer: &str,
    old_status: Option<&Value>,
    new_status: Option<&Value>,
) -> Vec<Violation> {
    // Only the items the two statuses hold are looked at, through the owner
    // index: the cost follows the review, not the number of writers.
    // (writer, 0 for a field or 1 for a condition, position): document order.
    let mut found: BTreeSet<(usize, u8, usize)> = BTreeSet::new();
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
                found.insert((w, 0, f));
            }
        }
    }
    // Items by type, once.
    let (old_by_type, new_by_type) = (
        by_type(conditions(rules, old_status)),
        by_type(conditions(rules, new_status)),
    );
    // Each type once: a type in both statuses is compared once, not twice.
    let types_only_new = new_by_type.keys().filter(|ty| !old_by_type.contains_key(*ty));
    for ty in old_by_type.keys().chain(types_only_new) {
        let Some(&w) = rules.owners.by_condition_type.get(*ty) else {
            continue;
        };
        let owner = &rules.writers[w];
        if owner.username != writer && !same_items(of_type(&old_by_type, ty), of_type(&new_by_type, ty)) {
            let position = owner.conditions.iter().position(|c| c == ty).unwrap_or_default();
            found.insert((w, 1, position));
        }
    }
    found
        .into_iter()
        .map(|(w, kind, i)| {
            let owner = &rules.writers[w];
            let item = if kind == 0 {
                Item::Field(owner.fields[i].clone())
            } else {
                Item::Condition(owner.conditions[i].clone())
            };
            Violation {
                item,
                owner: owner.username.clone(),
            }
        })
        .collect()
}

/// The conditions list of a status; anything that is not a list counts as empty.
fn conditions<'a>(rules: &ResourceRules, status: Option<&'a Value>) -> &'a [Value] {
    rules
        .conditions_path
        .get(status)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn of_type<'m, 'v>(map: &'m BTreeMap<&str, Vec<&'v Value>>, ty: &str) -> &'m [&'v Value] {
    map.get(ty).map(Vec::as_slice).unwrap_or_default()
}

fn by_type(list: &[Value]) -> BTreeMap<&str, Vec<&Value>> {
    let mut map: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for item in list {
        if let Some(ty) = condition_type(item) {
            map.entry(ty).or_default().push(item);
        }
    }
    map
}

/// Equal as multisets under [`same_value`]: the order of the conditions
/// list does not matter, and a type may have several items (a CRD without
/// `listType: map` stores duplicates).
///
/// The same items in the same order (the common case) are seen in one walk.
/// Otherwise each item's canonical form is written and the sorted forms are
/// compared: `n log n` in the items and linear in their bytes, where
/// matching item against item would be quadratic (10,000 reordered items
/// took 11 s that way).
fn same_items(a: &[&Value], b: &[&Value]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.iter().zip(b).all(|(x, y)| same_value(Some(x), Some(y))) {
        return true;
    }
    if a.len() == 1 {
        return false;
    }
    let (mut a_bytes, mut b_bytes) = (Vec::new(), Vec::new());
    sorted_forms(a, &mut a_bytes) == sorted_forms(b, &mut b_bytes)
}

/// The canonical forms of `items` (see [`write_canonical`]), written into
/// one buffer, sorted.
fn sorted_forms<'f>(items: &[&Value], bytes: &'f mut Vec<u8>) -> Vec<&'f [u8]> {
    let mut ends = Vec::with_capacity(items.len());
    for item in items {
        write_canonical(item, bytes);
        ends.push(bytes.len());
    }
    let bytes: &'f [u8] = bytes;
    let mut forms: Vec<&[u8]> = ends
        .iter()
        .scan(0, |start, &end| {
            let form = &bytes[*start..end];
            *start = end;
            Some(form)
        })
        .collect();
    forms.sort_unstable();
    forms
}

fn deny_conflict(allow: AdmissionResponse, writer: &str, violations: &[Violation]) -> AdmissionResponse {
    let mut listed: Vec<String> = violations
        .iter()
        .take(MESSAGE_ITEMS)
        .map(Violation::to_string)
        .collect();
    if violations.len() > MESSAGE_ITEMS {
        listed.push(format!("and {} more", violations.len() - MESSAGE_ITEMS));
    }
    let message = format!(
        "statusguard: {writer} may not change status fields owned by other writers: {}",
        listed.join(", ")
    );
    let mut response = allow.deny(message);
    // 409 makes client-go's and kube-rs's conflict handling refetch and retry,
    // which is exactly the recovery from writing a stale copy.
    response.result.code = 409;
    response.result.reason = "Conflict".to_owned();
    response.result.status = Some(StatusSummary::Failure);
    response
}

fn warning(verb: &str, violation: &Violation) -> String {
    let text = format!("statusguard {verb} {}, owned by {}", violation.item, violation.owner);
    if text.chars().count() <= WARNING_CHARS {
        text
    } else {
        let mut cut: String = text.chars().take(WARNING_CHARS - 1).collect();
        cut.push('…');
        cut
    }
}

/// The JSON Patch (paths from the object's root) that restores every violated
/// item of the new status to its value in the old one, leaving the writer's
/// own and unowned changes alone.
pub(crate) fn restoring_patch(
    rules: &ResourceRules,
    violations: &[Violation],
    old_status: Option<&Value>,
    new_status: Option<&Value>,
) -> Result<Patch, DecisionError> {
    // Only the status is copied to work on: the rest of a large object is
    // never touched by the patch.
    let status = new_status.cloned().unwrap_or(Value::Null);
    let mut work = Value::Object(serde_json::Map::from_iter([("status".to_owned(), status)]));
    let mut ops = Vec::new();
    let mut violated_types = BTreeSet::new();
    for violation in violations {
        match &violation.item {
            Item::Field(path) => restore(&mut work, path, path.get(old_status), &mut ops)?,
            Item::Condition(ty) => {
                violated_types.insert(ty.as_str());
            }
        }
    }
    if !violated_types.is_empty() {
        let old_list = rules.conditions_path.get(old_status);
        let current = rules.conditions_path.get(work.get("status")).and_then(Value::as_array);
        let per_item = current.map(|list| {
            per_item_restore(
                &rules.conditions_path,
                list,
                conditions(rules, old_status),
                &violated_types,
            )
        });
        match per_item {
            // An item at a time where the list is there to patch and stays a
            // list: the patch holds only the restored items. They are not
            // applied to `work`, which nothing reads after them: each removal
            // would shift the rest of the list, quadratic in a long one.
            Some((item_ops, left)) if left > 0 || old_list.is_some() => ops.extend(item_ops),
            _ => {
                let current = conditions(rules, work.get("status"));
                let restored = restored_conditions(current, conditions(rules, old_status), &violated_types);
                if restored != current {
                    let value = (!restored.is_empty() || old_list.is_some()).then_some(Value::Array(restored));
                    restore(&mut work, &rules.conditions_path, value.as_ref(), &mut ops)?;
                }
            }
        }
    }
    Ok(Patch(ops))
}

/// The operations that turn the conditions list `new` into what
/// [`restored_conditions`] makes of it, one item at a time: a changed item
/// is replaced where it stands, an added one removed, a removed one
/// appended. Also returns how many items the list then holds.
fn per_item_restore(
    list_path: &FieldPath,
    new: &[Value],
    old: &[Value],
    violated: &BTreeSet<&str>,
) -> (Vec<PatchOperation>, usize) {
    let at = |index: &str| {
        let mut pointer = list_path.status_pointer();
        pointer.push_back(index);
        pointer
    };
    let mut old_by_type: BTreeMap<&str, VecDeque<&Value>> = BTreeMap::new();
    for item in old {
        if let Some(ty) = condition_type(item).filter(|t| violated.contains(t)) {
            old_by_type.entry(ty).or_default().push_back(item);
        }
    }
    let mut ops = Vec::new();
    let mut removed = Vec::new();
    for (index, item) in new.iter().enumerate() {
        let Some(ty) = condition_type(item).filter(|t| violated.contains(t)) else {
            continue;
        };
        match old_by_type.get_mut(ty).and_then(VecDeque::pop_front) {
            Some(previous) if same_value(Some(previous), Some(item)) => {}
            Some(previous) => ops.push(PatchOperation::Replace(json_patch::ReplaceOperation {
                path: at(&index.to_string()),
                value: previous.clone(),
            })),
            None => removed.push(index),
        }
    }
    // From the end, so that each index still names the item it was found at.
    for index in removed.iter().rev() {
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: at(&index.to_string()),
        }));
    }
    let mut appended = 0;
    for previous in old_by_type.into_values().flatten() {
        appended += 1;
        ops.push(PatchOperation::Add(json_patch::AddOperation {
            path: at("-"),
            value: previous.clone(),
        }));
    }
    (ops, new.len() - removed.len() + appended)
}

/// The conditions list as written, with each violated type's items put back
/// as they were: a changed item keeps its position, an added one is dropped,
/// a removed one is appended.
fn restored_conditions(new: &[Value], old: &[Value], violated: &BTreeSet<&str>) -> Vec<Value> {
    let mut old_by_type: BTreeMap<&str, VecDeque<&Value>> = BTreeMap::new();
    for item in old {
        if let Some(ty) = condition_type(item).filter(|t| violated.contains(t)) {
            old_by_type.entry(ty).or_default().push_back(item);
        }
    }
    let mut result = Vec::with_capacity(new.len());
    for item in new {
        match condition_type(item).filter(|t| violated.contains(t)) {
            Some(ty) => {
                if let Some(previous) = old_by_type.get_mut(ty).and_then(VecDeque::pop_front) {
                    result.push(previous.clone());
                }
            }
            None => result.push(item.clone()),
        }
    }
    result.extend(old_by_type.into_values().flatten().cloned());
    result
}

/// Appends the operation that makes `path` hold `value` (or be absent, for
/// `None`) in `work`, and applies it to `work`, so that later operations
/// see the parents it created.
fn restore(
    work: &mut Value,
    path: &FieldPath,
    value: Option<&Value>,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), DecisionError> {
    let op = match value {
        None if path.get(work.get("status")).is_none() => return Ok(()),
        None => PatchOperation::Remove(RemoveOperation {
            path: path.status_pointer(),
        }),
        Some(value) => PatchOperation::Add(path.add_operation(work, value.clone())),
    };
    json_patch::patch(work, std::slice::from_ref(&op)).map_err(|e| DecisionError::Patch(e.to_string()))?;
    ops.push(op);
    Ok(())
}

#[cfg(test)]
mod tests;
