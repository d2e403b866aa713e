//! The admission decision: a pure function of (rules, request, endpoint).
//!
//! No I/O, no clock. The API server sends UPDATE for PUT and for every kind
//! of PATCH alike, so the decision is made on the difference between
//! `oldObject` and `object`, never on the verb.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::StatusSummary;
use serde_json::Value;

use crate::ownership::{FieldPath, Mode, Ownership, ResourceRules, status_pointer, value_at};

/// Which webhook endpoint asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Validate,
    Mutate,
}

impl Endpoint {
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
    Field(FieldPath),
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
    pub item: Item,
    pub owner: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (owned by {})", self.item, self.owner)
    }
}

/// The decision on one request.
#[derive(Debug, Clone)]
pub struct Decision {
    pub outcome: Outcome,
    /// The user name that wrote, as the API server reported it.
    pub writer: String,
    /// The request's group/resource is named by the rules (so it may label metrics).
    pub guarded: bool,
    /// The violations this decision acted on (denied, restored or reported).
    pub violations: Vec<Violation>,
    pub response: AdmissionResponse,
}

/// A request that cannot be decided: the API server never sends one.
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    #[error("a status UPDATE review must carry {0}")]
    MissingObject(&'static str),
    #[error("could not build the restoring patch: {0}")]
    Patch(String),
}

/// How many violations a deny message names before it says "and N more".
const MESSAGE_ITEMS: usize = 10;
/// The API server asks webhooks to keep each warning under 120 characters.
const WARNING_CHARS: usize = 120;

/// Decides one admission request.
pub fn decide(
    rules: &Ownership,
    request: &AdmissionRequest<DynamicObject>,
    endpoint: Endpoint,
) -> Result<Decision, DecisionError> {
    let writer = request.user_info.username.clone().unwrap_or_default();
    let guarded_resource = rules.resource(&request.resource.group, &request.resource.resource);
    let decision = |outcome, violations, response| Decision {
        outcome,
        writer: writer.clone(),
        guarded: guarded_resource.is_some(),
        violations,
        response,
    };

    let allow = AdmissionResponse::from(request);

    let resource_rules = match guarded_resource {
        Some(r) if request.operation == Operation::Update && request.sub_resource.as_deref() == Some("status") => r,
        _ => return Ok(decision(Outcome::Skipped, vec![], allow)),
    };
    let groups = request.user_info.groups.as_deref().unwrap_or_default();
    if rules.is_exempt(&writer, groups) {
        return Ok(decision(Outcome::Exempt, vec![], allow));
    }
    // The mutating endpoint has work only in trim mode; enforce and audit are
    // decided once, at /validate.
    if endpoint == Endpoint::Mutate && resource_rules.mode != Mode::Trim {
        return Ok(decision(Outcome::Allowed, vec![], allow));
    }

    let old = request
        .old_object
        .as_ref()
        .ok_or(DecisionError::MissingObject("oldObject"))?;
    let new = request.object.as_ref().ok_or(DecisionError::MissingObject("object"))?;
    let violations = find_violations(resource_rules, &writer, old.data.get("status"), new.data.get("status"));
    if violations.is_empty() {
        return Ok(decision(Outcome::Allowed, vec![], allow));
    }

    Ok(match (endpoint, resource_rules.mode) {
        (Endpoint::Validate, Mode::Enforce | Mode::Trim) => {
            let response = deny_conflict(allow, &writer, &violations);
            decision(Outcome::Denied, violations, response)
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
            response.audit_annotations.insert("writer".to_owned(), writer.clone());
            decision(Outcome::Warned, violations, response)
        }
        (Endpoint::Mutate, _) => {
            let patch = restoring_patch(
                resource_rules,
                &violations,
                old.data.get("status"),
                new.data.get("status"),
            )?;
            let mut response = allow
                .with_patch(patch)
                .map_err(|e| DecisionError::Patch(e.to_string()))?;
            response.warnings = Some(violations.iter().map(|v| warning("restored", v)).collect());
            decision(Outcome::Trimmed, violations, response)
        }
    })
}

/// Every item owned by another writer that differs between the two statuses.
pub fn find_violations(
    rules: &ResourceRules,
    writer: &str,
    old_status: Option<&Value>,
    new_status: Option<&Value>,
) -> Vec<Violation> {
    let old_conditions = conditions(rules, old_status);
    let new_conditions = conditions(rules, new_status);
    let mut violations = Vec::new();
    for owner in rules.writers.iter().filter(|w| w.username != writer) {
        for path in &owner.fields {
            if path.get(old_status) != path.get(new_status) {
                violations.push(Violation {
                    item: Item::Field(path.clone()),
                    owner: owner.username.clone(),
                });
            }
        }
        for ty in &owner.conditions {
            if !same_items(&of_type(old_conditions, ty), &of_type(new_conditions, ty)) {
                violations.push(Violation {
                    item: Item::Condition(ty.clone()),
                    owner: owner.username.clone(),
                });
            }
        }
    }
    violations
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

fn condition_type(item: &Value) -> Option<&str> {
    item.get("type").and_then(Value::as_str)
}

fn of_type<'a>(list: &'a [Value], ty: &str) -> Vec<&'a Value> {
    list.iter().filter(|c| condition_type(c) == Some(ty)).collect()
}

/// Equal as multisets: the order of the conditions list does not matter.
fn same_items(a: &[&Value], b: &[&Value]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    a.iter().all(|x| match (0..b.len()).find(|&i| !used[i] && b[i] == *x) {
        Some(i) => {
            used[i] = true;
            true
        }
        None => false,
    })
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
pub fn restoring_patch(
    rules: &ResourceRules,
    violations: &[Violation],
    old_status: Option<&Value>,
    new_status: Option<&Value>,
) -> Result<Patch, DecisionError> {
    // Only the status is copied to work on: the rest of a large object is
    // never touched by the patch.
    let mut work = serde_json::json!({ "status": new_status.cloned().unwrap_or(Value::Null) });
    let mut ops = Vec::new();
    let mut violated_types = BTreeSet::new();
    for violation in violations {
        match &violation.item {
            Item::Field(path) => restore(&mut work, path.segments(), path.get(old_status), &mut ops)?,
            Item::Condition(ty) => {
                violated_types.insert(ty.as_str());
            }
        }
    }
    if !violated_types.is_empty() {
        let current = conditions(rules, work.get("status"));
        let restored = restored_conditions(current, conditions(rules, old_status), &violated_types);
        if restored != current {
            let old_list = rules.conditions_path.get(old_status);
            let value = (!restored.is_empty() || old_list.is_some()).then_some(Value::Array(restored));
            restore(&mut work, rules.conditions_path.segments(), value.as_ref(), &mut ops)?;
        }
    }
    Ok(Patch(ops))
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

/// Appends the operation that makes `segments` below `status` hold `value`
/// (or be absent, for `None`) in `work`, and applies it to `work`, so that
/// later operations see the parents it created.
fn restore(
    work: &mut Value,
    segments: &[String],
    value: Option<&Value>,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), DecisionError> {
    let op = match value {
        None => {
            if value_at(work.get("status"), segments).is_none() {
                return Ok(());
            }
            PatchOperation::Remove(RemoveOperation {
                path: status_pointer(segments),
            })
        }
        Some(value) => {
            // Walk down from the root (`work` is always `{"status": …}`)
            // while parents are objects; create the rest of the path in one
            // `add` where the first missing or non-object parent is.
            let path: Vec<&str> = std::iter::once("status")
                .chain(segments.iter().map(String::as_str))
                .collect();
            let mut depth = 0;
            let mut node: &Value = work;
            while depth < path.len() - 1 {
                match node.get(path[depth]) {
                    Some(child) if child.is_object() => {
                        node = child;
                        depth += 1;
                    }
                    _ => break,
                }
            }
            let mut built = value.clone();
            for key in path[depth + 1..].iter().rev() {
                built = Value::Object([((*key).to_owned(), built)].into_iter().collect());
            }
            PatchOperation::Add(AddOperation {
                path: jsonptr::PointerBuf::from_tokens(path[..=depth].iter().copied()),
                value: built,
            })
        }
    };
    json_patch::patch(work, std::slice::from_ref(&op)).map_err(|e| DecisionError::Patch(e.to_string()))?;
    ops.push(op);
    Ok(())
}

#[cfg(test)]
mod tests;
