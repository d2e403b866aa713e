//! A status flush for kube-rs controllers that writes only what the
//! controller owns.
//!
//! [`StatusWriter::flush`] never sends a full Update of the status: that is
//! the write whose naive conflict retry rolls other writers back, the bug
//! statusguard exists to end. Every attempt reads the stored object live
//! (one GET), checks its uid, and sends a JSON merge patch that holds only
//! `metadata.resourceVersion` (the optimistic lock), the owned fields
//! ([`StatusWriter::owned_fields`], or [`StatusWriter::for_writer`] from the
//! ownership document the webhook enforces), the conditions list (the owned
//! condition types as staged, every other type as stored) and each keyed
//! list the writer owns entries of ([`StatusWriter::owned_entries`]: its
//! entries as staged, every other entry as stored). Other writers' fields
//! are never sent, and their items only as the attempt just read them, so
//! they can never be rolled back.
//!
//! A flush that fails leaves the caller's object exactly as it was; one that
//! succeeds replaces it with what the API server stored.
//!
//! Semantics the webhook shares: inside an owned value, an absent member and
//! a `null` one are the same (a `null` is sent as a removal). A staged status
//! without a conditions list leaves every condition as stored; to remove an
//! owned condition, stage the list without it. The same holds for a keyed
//! list and its entries.
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
//! writer.flush(&mut widget).await?; // sends observedGeneration and summary, nothing else
//! # Ok(()) }
//! ```
//!
//! The patch an attempt sends is a pure function of the staged and the
//! stored object:
//!
//! ```
//! use serde_json::json;
//! use statusguard::flush::{Owned, status_merge_patch};
//! use statusguard::ownership::FieldPath;
//!
//! let owned = Owned::new([FieldPath::parse("summary").unwrap()], ["Ready"]);
//! let conditions = FieldPath::parse("conditions").unwrap();
//! let staged = json!({"status": {"summary": {"ready": 2}, "replicas": 9, "conditions": [
//!     {"type": "Ready", "status": "True"}, {"type": "Scaled", "status": "False"}]}});
//! let stored = json!({"status": {"summary": {"ready": 1, "total": 0}, "replicas": 3, "conditions": [
//!     {"type": "Scaled", "status": "True"}]}});
//! let patch = status_merge_patch(&owned, &conditions, &staged, &stored, "41");
//! // "41" locks the write; `replicas` is not ours and not sent; the stored
//! // `total: 0` the staged summary lacks is removed; Scaled stays as stored,
//! // where it stood, and the new Ready follows it.
//! assert_eq!(patch, json!({"metadata": {"resourceVersion": "41"},
//!     "status": {"summary": {"ready": 2, "total": null}, "conditions": [
//!         {"type": "Scaled", "status": "True"}, {"type": "Ready", "status": "True"}]}}));
//! ```

use std::fmt::Debug;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use rand::Rng as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ownership::{FieldPath, GroupResource, KeyedList, Ownership, Parents, PathError, drop_nested};
use crate::rules::{ConfigMapRef, LoadError, fetch_configmap};

mod patch;
mod schema;

pub use patch::{Owned, status_merge_patch};

/// Why a flush (or building a writer) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// A declared path is not a dot path.
    #[error("invalid owned field path: {0}")]
    InvalidPath(#[from] PathError),
    /// A declared field overlaps the conditions list.
    #[error(
        "owned field status.{path} overlaps the conditions list at status.{conditions}; own condition types instead"
    )]
    OverlapsConditions {
        /// The field.
        path: String,
        /// The conditions path.
        conditions: String,
    },
    /// A keyed list overlaps an owned field, the conditions list or another
    /// keyed list: one value would have two rules.
    #[error(
        "keyed list status.{list} overlaps {other}; a list path may not overlap a field, the conditions or another list"
    )]
    ListOverlaps {
        /// The keyed list's path.
        list: String,
        /// What it overlaps, e.g. `the owned field status.summary`.
        other: String,
    },
    /// A keyed list declared without a key member, or with an empty key value.
    #[error("keyed list status.{list}: {problem}")]
    InvalidList {
        /// The keyed list's path.
        list: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A staged parent of an owned path is a value that is not an object.
    #[error("owned field status.{path} runs below a value that is not an object in the staged status")]
    BelowNonObject {
        /// The field.
        path: String,
    },
    /// The staged object lacks what the flush needs (name, uid, resourceVersion).
    #[error("the staged object has no {0}: read it from the API server first")]
    MissingMetadata(&'static str),
    /// The object was deleted and recreated since it was read.
    #[error("the stored object's uid {stored} is not the staged {staged}: it was deleted and recreated; not written")]
    UidMismatch {
        /// The staged uid.
        staged: String,
        /// The stored uid (empty when the stored object has none).
        stored: String,
    },
    /// The ownership document does not name the resource.
    #[error("{0} is not configured in the ownership document")]
    NotConfigured(String),
    /// Owned paths the CRD's schema would prune.
    #[error("the status fields {0:?} are not in the CRD's schema: the API server would prune them")]
    UnknownFields(Vec<String>),
    /// The CRD has no status schema for the version.
    #[error("the CRD has no version {0} with a status schema")]
    NoSchema(String),
    /// A retry policy that cannot be followed.
    #[error("invalid retry policy: {0}")]
    InvalidRetry(String),
    /// Every attempt conflicted.
    #[error("still conflicting after {attempts} attempts: {source}")]
    Conflict {
        /// How many writes were sent.
        attempts: u32,
        /// The last conflict.
        source: kube::Error,
    },
    /// Any other API error.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The object does not convert to or from JSON.
    #[error("cannot convert the object to or from JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The ownership document could not be loaded.
    #[error(transparent)]
    Rules(#[from] LoadError),
}

/// When and how often a conflicting write is tried again. The default is
/// client-go's `retry.DefaultRetry`: 5 attempts, 10 ms apart, 10 % jitter.
/// Built only through checked constructors, so a policy can never panic.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    attempts: u32,
    delay: Duration,
    factor: f64,
    jitter: f64,
}

/// No wait between attempts grows beyond this, whatever the factor.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

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
    /// `attempts` writes at most (at least 1), `delay` apart (at most
    /// [`MAX_RETRY_DELAY`]), with no backoff and no jitter.
    pub fn new(attempts: u32, delay: Duration) -> Result<Self, FlushError> {
        if attempts == 0 {
            return Err(FlushError::InvalidRetry("attempts must be at least 1".into()));
        }
        if delay > MAX_RETRY_DELAY {
            return Err(FlushError::InvalidRetry(format!(
                "a delay of {delay:?} is over {MAX_RETRY_DELAY:?}"
            )));
        }
        Ok(Self {
            attempts,
            delay,
            factor: 1.0,
            jitter: 0.0,
        })
    }

    /// Each wait is `factor` times the one before (a finite number from 1 to 10).
    pub fn backoff(mut self, factor: f64) -> Result<Self, FlushError> {
        self.factor = within("a backoff factor", factor, 1.0, 10.0)?;
        Ok(self)
    }

    /// Each wait is lengthened by a random share up to `jitter` (from 0 to 1).
    pub fn jitter(mut self, jitter: f64) -> Result<Self, FlushError> {
        self.jitter = within("a jitter", jitter, 0.0, 1.0)?;
        Ok(self)
    }

    /// The most writes one flush sends.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The waits between the writes of one flush, in order: one fewer
    /// than [`attempts`](Self::attempts), each at most [`MAX_RETRY_DELAY`].
    pub(crate) fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        let retries = usize::try_from(self.attempts.saturating_sub(1)).unwrap_or(usize::MAX);
        let jitter = self.jitter;
        ExponentialBuilder::new()
            .with_min_delay(self.delay)
            // Checked from 1 to 10 when set, so the narrowing loses nothing that matters.
            .with_factor(self.factor as f32)
            .with_max_delay(MAX_RETRY_DELAY)
            .with_max_times(retries)
            .build()
            // backon's own jitter is all or nothing (up to 100 %); client-go's
            // default is 10 %, so the share is drawn here.
            .map(move |delay| match jitter > 0.0 {
                true => delay
                    .mul_f64(1.0 + rand::rng().random_range(0.0..=jitter))
                    .min(MAX_RETRY_DELAY),
                false => delay,
            })
    }
}

/// `value`, when it is a number from `low` to `high` (NaN never is).
fn within(what: &str, value: f64, low: f64, high: f64) -> Result<f64, FlushError> {
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(FlushError::InvalidRetry(format!(
            "{what} of {value} is not from {low} to {high}"
        )))
    }
}

/// What a flush did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlushReport {
    /// Writes sent, the successful one included (2 means one conflict).
    pub attempts: u32,
}

/// Writes the status of objects of one `Api<K>`: only what it owns.
#[derive(Clone)]
pub struct StatusWriter<K> {
    api: Api<K>,
    client: Client,
    url: String,
    owned: Owned,
    conditions_path: FieldPath,
    retry: RetryPolicy,
}

impl<K> Debug for StatusWriter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter")
            .field("url", &self.url)
            .field("owned", &self.owned)
            .field("conditions_path", &self.conditions_path)
            .field("retry", &self.retry)
            .finish()
    }
}

impl<K> StatusWriter<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    /// A writer that owns nothing yet: declare what it owns with
    /// [`owned_fields`](Self::owned_fields) and
    /// [`owned_conditions`](Self::owned_conditions), or build it with
    /// [`for_writer`](Self::for_writer). A writer that owns nothing writes
    /// nothing but the resourceVersion.
    pub fn new(api: Api<K>) -> Self {
        let url = api.resource_url().to_owned();
        let client = api.clone().into_client();
        Self {
            api,
            client,
            url,
            owned: Owned::default(),
            conditions_path: FieldPath::single("conditions"),
            retry: RetryPolicy::default(),
        }
    }

    /// Declares owned field paths (dot paths below `.status`). Calls add up;
    /// a path below another declared path is dropped, whatever the order.
    /// Syntax errors are rejected here, before any write.
    pub fn owned_fields<I, S>(mut self, paths: I) -> Result<Self, FlushError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut fields = std::mem::take(&mut self.owned.fields);
        for text in paths {
            fields.push(FieldPath::parse(text.as_ref())?);
        }
        self.owned.fields = drop_nested(fields);
        self.check_overlaps()?;
        Ok(self)
    }

    /// Declares owned condition types: these are written as staged, every
    /// other type stays as the server holds it.
    pub fn owned_conditions<I, S>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.owned.conditions.extend(types.into_iter().map(Into::into));
        self
    }

    /// Where the conditions list lives below `.status` (default `conditions`).
    pub fn conditions_path(mut self, path: &str) -> Result<Self, FlushError> {
        self.conditions_path = FieldPath::parse(path)?;
        self.check_overlaps()?;
        Ok(self)
    }

    /// Declares owned entries of a keyed list: the entries of the list at
    /// `list_path` (a dot path below `.status`) whose `key_member` holds one
    /// of `values` are written as staged; entries with any other key value,
    /// or none, stay as the server holds them. Gateway API's
    /// `owned_entries("parents", "controllerName", [my_controller_name])`.
    /// Calls for the same list and key add up. Refused before any write: a
    /// bad path, an empty key member or value, and a list that overlaps an
    /// owned field, the conditions list or another keyed list.
    ///
    /// ```no_run
    /// # async fn reconcile(client: kube::Client) -> Result<(), statusguard::flush::FlushError> {
    /// use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
    /// use serde_json::json;
    /// use statusguard::flush::StatusWriter;
    ///
    /// let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
    /// let resource = ApiResource::from_gvk_with_plural(&gvk, "httproutes");
    /// let api: Api<DynamicObject> = Api::namespaced_with(client, "shop", &resource);
    /// let me = "gateway.envoyproxy.io/gatewayclass-controller";
    /// let writer = StatusWriter::new(api.clone()).owned_entries("parents", "controllerName", [me])?;
    ///
    /// let mut route = api.get("web").await?;
    /// // Stage this controller's entries; any other entry staged is ignored:
    /// // the flush sends every other entry as it reads it from the server.
    /// route.data["status"]["parents"] = json!([{
    ///     "parentRef": {"name": "eg"}, "controllerName": me,
    ///     "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
    ///                     "message": "", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
    /// }]);
    /// writer.flush(&mut route).await?;
    /// # Ok(()) }
    /// ```
    pub fn owned_entries<I, S>(mut self, list_path: &str, key_member: &str, values: I) -> Result<Self, FlushError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let list = KeyedList {
            path: FieldPath::parse(list_path)?,
            key: key_member.to_owned(),
        };
        let invalid = |problem| FlushError::InvalidList {
            list: list.path.to_string(),
            problem,
        };
        if list.key.is_empty() {
            return Err(invalid("the key member is empty"));
        }
        let values: Vec<String> = values.into_iter().map(Into::into).collect();
        if values.iter().any(String::is_empty) {
            return Err(invalid("an owned key value is empty"));
        }
        self.owned = std::mem::take(&mut self.owned).with_entries(list, values);
        self.check_overlaps()?;
        Ok(self)
    }

    /// How conflicts are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// A writer that owns exactly what the ownership document gives
    /// `username` for `resource`: the same rules the webhook enforces. A
    /// writer the document does not list owns nothing.
    pub fn for_writer(
        api: Api<K>,
        ownership: &Ownership,
        resource: &GroupResource,
        username: &str,
    ) -> Result<Self, FlushError> {
        let rules = ownership
            .resource(&resource.group, &resource.resource)
            .ok_or_else(|| FlushError::NotConfigured(resource.to_string()))?;
        let mut writer = Self::new(api);
        writer.conditions_path = rules.conditions_path.clone();
        if let Some(w) = rules.writer(username) {
            let mut owned = Owned::new(w.fields.iter().cloned(), w.conditions.iter().cloned());
            // The document was validated when parsed: its lists overlap
            // nothing. A list the writer holds no value of is not sent.
            for list in &rules.lists {
                let values = w.entries_of(&list.path);
                if !values.is_empty() {
                    owned = owned.with_entries(list.clone(), values.iter().cloned());
                }
            }
            writer.owned = owned;
        }
        Ok(writer)
    }

    /// [`for_writer`](Self::for_writer) with the document read now from the
    /// ConfigMap the webhook watches.
    pub async fn for_writer_from_configmap(
        api: Api<K>,
        configmap: &ConfigMapRef,
        resource: &GroupResource,
        username: &str,
    ) -> Result<Self, FlushError> {
        let ownership = fetch_configmap(&api.clone().into_client(), configmap).await?;
        Self::for_writer(api, &ownership, resource, username)
    }

    /// Each owned value has one rule: no field overlaps the conditions
    /// list, and no keyed list overlaps a field, the conditions or another
    /// keyed list (the same list with the same key is one list).
    fn check_overlaps(&self) -> Result<(), FlushError> {
        let conditions = &self.conditions_path;
        if let Some(path) = self.owned.fields.iter().find(|p| p.overlaps(conditions)) {
            return Err(FlushError::OverlapsConditions {
                path: path.to_string(),
                conditions: conditions.to_string(),
            });
        }
        for (i, (list, _)) in self.owned.entries.iter().enumerate() {
            let other = if let Some(field) = self.owned.fields.iter().find(|f| f.overlaps(&list.path)) {
                format!("the owned field status.{field}")
            } else if list.path.overlaps(conditions) {
                format!("the conditions list at status.{conditions}")
            } else if let Some((other, _)) = self.owned.entries[..i]
                .iter()
                .find(|(o, _)| o.path.overlaps(&list.path))
            {
                format!("the keyed list status.{} (key {:?})", other.path, other.key)
            } else {
                continue;
            };
            return Err(FlushError::ListOverlaps {
                list: list.path.to_string(),
                other,
            });
        }
        Ok(())
    }

    /// Writes what the writer owns of the staged object's status. On success
    /// `staged` becomes the server's response, so no undeclared staged value
    /// survives in memory; on any error `staged` is left as it was.
    pub async fn flush(&self, staged: &mut K) -> Result<FlushReport, FlushError> {
        let name = staged.meta().name.clone().ok_or(FlushError::MissingMetadata("name"))?;
        let staged_uid = staged.meta().uid.clone().ok_or(FlushError::MissingMetadata("uid"))?;
        let staged_json = serde_json::to_value(&*staged)?;
        // Fail before any write on a declared path that the staged value cannot hold.
        if let Some(path) = self
            .owned
            .fields
            .iter()
            .find(|p| matches!(p.parents_in(&staged_json), Parents::NonObjectAt(_)))
        {
            return Err(FlushError::BelowNonObject { path: path.to_string() });
        }
        let mut lock = staged_json
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .ok_or(FlushError::MissingMetadata("resourceVersion"))?
            .to_owned();
        // backon gives the waits; the loop stays explicit because each
        // retry must read the object again before it writes.
        let mut waits = self.retry.delays();
        let mut attempt = 0;
        loop {
            attempt += 1;
            // One read per attempt: the uid check, the nulls and the
            // conditions of the patch all come from it.
            let stored = self.read_json(&name).await?;
            let stored_uid = stored
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if stored_uid != staged_uid {
                return Err(FlushError::UidMismatch {
                    staged: staged_uid,
                    stored: stored_uid.to_owned(),
                });
            }
            if attempt > 1 {
                // A retry locks on what it just read.
                stored
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .clone_into(&mut lock);
            }
            let patch = status_merge_patch(&self.owned, &self.conditions_path, &staged_json, &stored, &lock);
            tracing::debug!(%name, attempt, %patch, "status merge patch");
            match self
                .api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    *staged = written;
                    return Ok(FlushReport { attempts: attempt });
                }
                Err(kube::Error::Api(e)) if e.code == 409 => match waits.next() {
                    Some(wait) => {
                        tracing::debug!(%name, attempt, reason = %e.message, "status write conflicted; retrying");
                        tokio::time::sleep(wait).await;
                    }
                    None => {
                        return Err(FlushError::Conflict {
                            attempts: attempt,
                            source: kube::Error::Api(e),
                        });
                    }
                },
                Err(e) => return Err(e.into()),
            }
        }
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

#[cfg(test)]
mod tests;
