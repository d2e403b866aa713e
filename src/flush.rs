//! A status flush for kube-rs controllers that writes only what the
//! controller owns.
//!
//! Without owned fields, [`StatusWriter::flush`] is the classic full Update
//! of the status (`replace_status`) with a naive conflict retry: on 409 it
//! refreshes only the resourceVersion (and the conditions it does not own)
//! and sends its stale copy again — the retry that rolls other writers back.
//!
//! With owned fields declared ([`StatusWriter::owned_fields`], or
//! [`StatusWriter::for_writer`] from the same ownership document the webhook
//! enforces), every attempt reads the stored object live, checks its uid,
//! and sends a JSON merge patch that holds only `metadata.resourceVersion`
//! (the optimistic lock), the declared fields and the conditions list. Other
//! writers' fields are never sent, so they can never be rolled back.
//!
//! A misspelled path does nothing on a CRD with a structural schema: the API
//! server prunes unknown fields from the patch. [`StatusWriter::check_schema`]
//! finds such paths in the CRD's `openAPIV3Schema` before they cost a bug.
//!
//! ```no_run
//! # async fn reconcile(client: kube::Client) -> Result<(), statusguard::flush::FlushError> {
//! use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
//! use statusguard::flush::StatusWriter;
//!
//! let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
//! let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
//! let api: Api<DynamicObject> = Api::namespaced_with(client, "shop", &resource);
//! let writer = StatusWriter::new(api.clone())
//!     .owned_fields(["observedGeneration", "summary"])?
//!     .owned_conditions(["Ready"]);
//!
//! let mut widget = api.get("w1").await?;
//! widget.data["status"]["observedGeneration"] = 7.into();
//! writer.flush(&mut widget).await?; // sends observedGeneration, summary and the conditions, nothing else
//! # Ok(()) }
//! ```
//!
//! The patch an attempt sends is a pure function of the staged and the
//! stored object:
//!
//! ```
//! use serde_json::json;
//! use statusguard::flush::status_merge_patch;
//! use statusguard::ownership::FieldPath;
//!
//! let owned = [FieldPath::parse("summary").unwrap()];
//! let conditions = FieldPath::parse("conditions").unwrap();
//! let staged = json!({"metadata": {"resourceVersion": "41"},
//!                     "status": {"summary": {"ready": 2}, "replicas": 9}});
//! let stored = json!({"metadata": {"resourceVersion": "42"},
//!                     "status": {"summary": {"ready": 1, "total": 0}, "replicas": 3}});
//! let patch = status_merge_patch(&owned, &conditions, &staged, &stored).unwrap();
//! // The staged resourceVersion locks the write; `replicas` is not ours and not
//! // sent; the stored `total: 0` the staged summary lacks is removed.
//! assert_eq!(patch, json!({"metadata": {"resourceVersion": "41"},
//!                          "status": {"summary": {"ready": 2, "total": null}}}));
//! ```

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSONSchemaProps};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use rand::Rng as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::ownership::{FieldPath, Ownership, PathError, drop_nested, value_at};

#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error("invalid owned field path: {0}")]
    InvalidPath(#[from] PathError),
    #[error(
        "owned field status.{path} overlaps the conditions list at status.{conditions}; own condition types instead"
    )]
    OverlapsConditions { path: String, conditions: String },
    #[error("owned field status.{path} runs below a value that is not an object in the staged status")]
    BelowNonObject { path: String },
    #[error("the staged object has no {0}: read it from the API server first")]
    MissingMetadata(&'static str),
    #[error("the stored object's uid {stored} is not the staged {staged}: it was deleted and recreated; not written")]
    UidMismatch { staged: String, stored: String },
    #[error("{0} is not configured in the ownership document")]
    NotConfigured(String),
    #[error("the status fields {0:?} are not in the CRD's schema: the API server would prune them")]
    UnknownFields(Vec<String>),
    #[error("the CRD has no version {0} with a status schema")]
    NoSchema(String),
    #[error("still conflicting after {attempts} attempts: {source}")]
    Conflict { attempts: u32, source: kube::Error },
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("cannot convert the object to or from JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    ConfigMap(#[from] crate::configmap::ConfigMapError),
}

/// When and how often a conflicting write is tried again. The default is
/// client-go's `retry.DefaultRetry`: 5 attempts, 10 ms apart, 10 % jitter.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub delay: Duration,
    pub factor: f64,
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            delay: Duration::from_millis(10),
            factor: 1.0,
            jitter: 0.1,
        }
    }
}

impl RetryPolicy {
    fn delay_before(&self, attempt: u32) -> Duration {
        let base = self.delay.as_secs_f64() * self.factor.powi(attempt.saturating_sub(2) as i32);
        let jitter = if self.jitter > 0.0 {
            rand::rng().random_range(0.0..=self.jitter)
        } else {
            0.0
        };
        Duration::from_secs_f64(base * (1.0 + jitter))
    }
}

/// What the writer owns, once owned fields are declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Owned {
    fields: Vec<FieldPath>,
}

/// What a flush did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushReport {
    /// Writes sent, the successful one included (2 means one conflict).
    pub attempts: u32,
}

/// Writes the status of objects of one `Api<K>`.
#[derive(Clone)]
pub struct StatusWriter<K> {
    api: Api<K>,
    client: Client,
    url: String,
    owned: Option<Owned>,
    owned_conditions: BTreeSet<String>,
    conditions_path: FieldPath,
    retry: RetryPolicy,
}

impl<K> Debug for StatusWriter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter")
            .field("url", &self.url)
            .field("owned", &self.owned)
            .field("owned_conditions", &self.owned_conditions)
            .field("conditions_path", &self.conditions_path)
            .field("retry", &self.retry)
            .finish()
    }
}

impl<K> StatusWriter<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    /// A writer with no owned fields: full Updates (the classic behaviour).
    pub fn new(api: Api<K>) -> Self {
        let url = api.resource_url().to_owned();
        let client = api.clone().into_client();
        Self {
            api,
            client,
            url,
            owned: None,
            owned_conditions: BTreeSet::new(),
            conditions_path: FieldPath::single("conditions"),
            retry: RetryPolicy::default(),
        }
    }

    /// Declares owned field paths (dot paths below `.status`); from now on
    /// every flush is a merge patch of only these, the conditions and the
    /// resourceVersion. Calls add up; a path below another declared path is
    /// dropped, whatever the order. Syntax errors are rejected here, before
    /// any write.
    pub fn owned_fields<I, S>(mut self, paths: I) -> Result<Self, FlushError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut fields = self.owned.take().unwrap_or_default().fields;
        for text in paths {
            fields.push(FieldPath::parse(text.as_ref())?);
        }
        self.owned = Some(Owned {
            fields: drop_nested(fields),
        });
        self.check_conditions_overlap()?;
        Ok(self)
    }

    /// Declares owned condition types: after a conflict, these keep the
    /// staged value and every other type is refreshed from the server.
    pub fn owned_conditions<I, S>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.owned_conditions.extend(types.into_iter().map(Into::into));
        self
    }

    /// Where the conditions list lives below `.status` (default `conditions`).
    pub fn conditions_path(mut self, path: &str) -> Result<Self, FlushError> {
        self.conditions_path = FieldPath::parse(path)?;
        self.check_conditions_overlap()?;
        Ok(self)
    }

    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// A writer that owns exactly what the ownership document gives
    /// `username` for `group`/`resource`: the same rules the webhook
    /// enforces. A writer the document does not list owns nothing (its
    /// flushes send only the conditions list).
    pub fn for_writer(
        api: Api<K>,
        ownership: &Ownership,
        group: &str,
        resource: &str,
        username: &str,
    ) -> Result<Self, FlushError> {
        let rules = ownership.resource(group, resource).ok_or_else(|| {
            FlushError::NotConfigured(if group.is_empty() {
                resource.to_owned()
            } else {
                format!("{group}/{resource}")
            })
        })?;
        let mut writer = Self::new(api);
        writer.conditions_path = rules.conditions_path.clone();
        let (fields, conditions) = match rules.writer(username) {
            Some(w) => (w.fields.clone(), w.conditions.clone()),
            None => (Vec::new(), Vec::new()),
        };
        writer.owned = Some(Owned { fields });
        Ok(writer.owned_conditions(conditions))
    }

    /// [`for_writer`](Self::for_writer) with the document read now from the
    /// ConfigMap the webhook watches.
    pub async fn for_writer_from_configmap(
        api: Api<K>,
        namespace: &str,
        name: &str,
        group: &str,
        resource: &str,
        username: &str,
    ) -> Result<Self, FlushError> {
        let ownership = crate::configmap::fetch_ownership(api.clone().into_client(), namespace, name).await?;
        Self::for_writer(api, &ownership, group, resource, username)
    }

    fn check_conditions_overlap(&self) -> Result<(), FlushError> {
        let fields = self.owned.as_ref().map(|o| o.fields.as_slice()).unwrap_or_default();
        match fields.iter().find(|p| p.overlaps(&self.conditions_path)) {
            Some(path) => Err(FlushError::OverlapsConditions {
                path: path.to_string(),
                conditions: self.conditions_path.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Owned field paths that the CRD's structural schema for `version`
    /// would prune: each must be declared under `status` in
    /// `openAPIV3Schema`, unless a parent preserves unknown fields.
    pub fn check_schema(&self, crd: &CustomResourceDefinition, version: &str) -> Result<(), FlushError> {
        let status = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("status"))
            .ok_or_else(|| FlushError::NoSchema(version.to_owned()))?;
        let mut paths: Vec<&FieldPath> = self
            .owned
            .as_ref()
            .map(|o| o.fields.iter().collect())
            .unwrap_or_default();
        paths.push(&self.conditions_path);
        let unknown: Vec<String> = paths
            .into_iter()
            .filter(|p| !schema_has(status, p.segments()))
            .map(ToString::to_string)
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(FlushError::UnknownFields(unknown))
        }
    }

    /// Writes the staged object's status; on success `staged` becomes the
    /// server's response, so no undeclared staged value survives in memory.
    pub async fn flush(&self, staged: &mut K) -> Result<FlushReport, FlushError> {
        let name = staged.meta().name.clone().ok_or(FlushError::MissingMetadata("name"))?;
        // The staged object as JSON, kept in step with `staged` across retries.
        let mut staged_json = serde_json::to_value(&*staged)?;
        if let Some(owned) = &self.owned {
            // Fail before any write on a declared path that the staged value cannot hold.
            if let Some(path) = owned
                .fields
                .iter()
                .find(|p| runs_below_non_object(staged_json.get("status"), p))
            {
                return Err(FlushError::BelowNonObject { path: path.to_string() });
            }
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = match &self.owned {
                None => self.api.replace_status(&name, &PostParams::default(), &*staged).await,
                Some(owned) => self.patch_attempt(&name, &staged_json, owned).await?,
            };
            match result {
                Ok(written) => {
                    *staged = written;
                    return Ok(FlushReport { attempts: attempt });
                }
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < self.retry.attempts => {
                    tracing::debug!(%name, attempt, reason = %e.message, "status write conflicted; refreshing and retrying");
                    tokio::time::sleep(self.retry.delay_before(attempt + 1)).await;
                    self.refresh(&name, &mut staged_json).await?;
                    *staged = serde_json::from_value(staged_json.clone())?;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    return Err(FlushError::Conflict {
                        attempts: attempt,
                        source: kube::Error::Api(e),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One owned-fields attempt: live read, uid check, merge patch.
    async fn patch_attempt(&self, name: &str, staged: &Value, owned: &Owned) -> Result<kube::Result<K>, FlushError> {
        let stored = self.read_json(name).await?;
        let uid = |object: &Value| {
            object
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let staged_uid = uid(staged).ok_or(FlushError::MissingMetadata("uid"))?;
        let stored_uid = uid(&stored).unwrap_or_default();
        if stored_uid != staged_uid {
            return Err(FlushError::UidMismatch {
                staged: staged_uid,
                stored: stored_uid,
            });
        }
        let patch = status_merge_patch(&owned.fields, &self.conditions_path, staged, &stored)?;
        tracing::debug!(%name, %patch, "status merge patch");
        Ok(self
            .api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await)
    }

    /// After a conflict: the stored resourceVersion, and every condition the
    /// writer does not own as the server holds it.
    async fn refresh(&self, name: &str, json: &mut Value) -> Result<(), FlushError> {
        let stored = self.read_json(name).await?;
        if let (Some(rv), Some(meta)) = (stored.pointer("/metadata/resourceVersion"), json.get_mut("metadata")) {
            meta["resourceVersion"] = rv.clone();
        }
        let stored_conditions =
            value_at(stored.get("status"), self.conditions_path.segments()).and_then(Value::as_array);
        let staged_conditions = value_at(json.get("status"), self.conditions_path.segments()).and_then(Value::as_array);
        if stored_conditions.is_some() || staged_conditions.is_some() {
            let merged = merge_conditions(
                staged_conditions.map(Vec::as_slice).unwrap_or_default(),
                stored_conditions.map(Vec::as_slice).unwrap_or_default(),
                &self.owned_conditions,
            );
            set_in_status(json, &self.conditions_path, Value::Array(merged));
        }
        Ok(())
    }

    /// A live read of the object as untyped JSON: a typed read could not
    /// tell a stored zero from an absent field.
    async fn read_json(&self, name: &str) -> Result<Value, FlushError> {
        let request = kube::core::Request::new(&self.url)
            .get(name, &Default::default())
            .map_err(kube::Error::BuildRequest)?;
        Ok(self.client.request::<Value>(request).await?)
    }
}

/// True when a parent of `path` in the staged status is a value that is not
/// an object (a merge patch could not put the child there).
fn runs_below_non_object(status: Option<&Value>, path: &FieldPath) -> bool {
    let mut current = match status {
        Some(s) if !s.is_null() => s,
        _ => return false,
    };
    let segments = path.segments();
    for segment in &segments[..segments.len() - 1] {
        match current.get(segment) {
            Some(child) if child.is_object() => current = child,
            None | Some(Value::Null) => return false,
            Some(_) => return true,
        }
    }
    !current.is_object()
}

/// The JSON merge patch of one owned-fields attempt: the staged
/// resourceVersion, each owned path as staged (or `null` where the staged
/// object lacks what the server holds), and the staged conditions list.
pub fn status_merge_patch(
    owned: &[FieldPath],
    conditions_path: &FieldPath,
    staged: &Value,
    stored: &Value,
) -> Result<Value, FlushError> {
    let resource_version = staged
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .ok_or(FlushError::MissingMetadata("resourceVersion"))?;
    let mut patch = serde_json::json!({ "metadata": { "resourceVersion": resource_version } });
    let (staged_status, stored_status) = (staged.get("status"), stored.get("status"));
    for path in owned {
        let staged_value = value_at(staged_status, path.segments());
        let stored_value = value_at(stored_status, path.segments());
        match (staged_value, stored_value) {
            (Some(value), stored) => set_in_status(&mut patch, path, replacing(value, stored)),
            // The server holds it (below object parents, or value_at would
            // not have found it) and the staged object does not: remove it.
            (None, Some(_)) => set_in_status(&mut patch, path, Value::Null),
            (None, None) => {}
        }
    }
    if let Some(list) = value_at(staged_status, conditions_path.segments()) {
        set_in_status(&mut patch, conditions_path, list.clone());
    }
    Ok(patch)
}

/// `staged` as a merge-patch value that makes the server hold exactly it:
/// inside objects, `null` for every key the server holds and the staged
/// value lacks, at every depth.
fn replacing(staged: &Value, stored: Option<&Value>) -> Value {
    match (staged, stored) {
        (Value::Object(staged), Some(Value::Object(stored))) => {
            let mut result: Map<String, Value> = staged
                .iter()
                .map(|(k, v)| (k.clone(), replacing(v, stored.get(k))))
                .collect();
            for key in stored.keys() {
                if !staged.contains_key(key) {
                    result.insert(key.clone(), Value::Null);
                }
            }
            Value::Object(result)
        }
        _ => staged.clone(),
    }
}

/// Sets `status.<path>` in `root` to `value`, making object parents
/// (replacing any non-object on the way) as needed.
fn set_in_status(root: &mut Value, path: &FieldPath, value: Value) {
    let mut current = root;
    for segment in std::iter::once("status").chain(path.segments().iter().map(String::as_str)) {
        if !current.is_object() {
            *current = Value::Object(Map::new());
        }
        let Value::Object(map) = current else { return };
        current = map.entry(segment).or_insert(Value::Null);
    }
    *current = value;
}

fn condition_type(item: &Value) -> Option<&str> {
    item.get("type").and_then(Value::as_str)
}

/// The staged conditions after a conflict: owned types as staged, every
/// other type as the server holds it (changed, added or removed by others).
pub fn merge_conditions(staged: &[Value], stored: &[Value], owned: &BTreeSet<String>) -> Vec<Value> {
    let is_owned = |c: &Value| condition_type(c).is_some_and(|t| owned.contains(t));
    let mut result: Vec<Value> = Vec::with_capacity(staged.len().max(stored.len()));
    let mut taken = vec![false; stored.len()];
    for item in staged {
        if is_owned(item) {
            result.push(item.clone());
        } else if let Some(i) =
            (0..stored.len()).find(|&i| !taken[i] && condition_type(&stored[i]) == condition_type(item))
        {
            taken[i] = true;
            result.push(stored[i].clone());
        }
    }
    for (i, item) in stored.iter().enumerate() {
        if !taken[i] && !is_owned(item) {
            result.push(item.clone());
        }
    }
    result
}

/// Whether the structural schema below `.status` declares `segments`.
fn schema_has(schema: &JSONSchemaProps, segments: &[String]) -> bool {
    let Some((first, rest)) = segments.split_first() else {
        return true;
    };
    if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
        return true;
    }
    match schema.properties.as_ref().and_then(|p| p.get(first)) {
        Some(child) => schema_has(child, rest),
        None => matches!(
            &schema.additional_properties,
            Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(s))
                if schema_has(s, rest)
        ),
    }
}

#[cfg(test)]
mod tests;
