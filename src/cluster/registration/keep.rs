//! Server-managed registration: the webhook configurations follow the rules
//! in force ([`super::desired`]).
//!
//! Every replica runs this loop and applies the same objects with the same
//! field manager, so they converge without a leader. One loop, woken by the
//! typed channels of what it follows: the rules put in force, the
//! registration [`Switch`], the trust bundle of the certificates the server
//! keeps itself, the CRDs' storage versions, and any change of the
//! configurations themselves (watched by name: a hand edit, or a deploy
//! tool's forced replacement that empties them, is repaired within a
//! second or two); and by the clock: the CA file is read every
//! [`CA_POLL`], everything is applied again every resync interval, and a
//! failed apply is retried with backoff. It applies nothing before the first valid
//! document, and nothing while the switch stands the servers down
//! (`statusguard unregister`).
//!
//! Each rule names the version its resource's paths are written against: the
//! document's `version:`, else its CRD's storage version, which a watch of
//! the CRDs ([`versions`]) keeps current; the loop applies again when one
//! changes or a CRD appears. A resource with neither is registered for every
//! version (`*`), and the log says so.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::watch_object;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Switch;
use super::desired::{CaSource, Configurations, Registration, desired};
use crate::cluster::FIELD_MANAGER;
use crate::cluster::versions::{self, Resolution, StorageVersions};
use crate::metrics::{Metrics, WebhookSync};
use crate::ownership::{GroupResource, Ownership};
use crate::rules::store::{InForce, RuleStore};

/// How often the CA file is read for a new bundle.
const CA_POLL: Duration = Duration::from_secs(2);
/// A change of the configurations by someone else is repaired at once, but
/// no sooner than this after the last apply: a guard, should another writer
/// fight the servers over them.
const DRIFT_SPACING: Duration = Duration::from_secs(1);
/// A loop with nothing timed to do still looks again this often.
const IDLE: Duration = Duration::from_secs(3600);

/// Why the configurations could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot read the webhook CA bundle {path}: {source}")]
    CaFile { path: PathBuf, source: std::io::Error },
    #[error("the server's own certificates are not loaded yet")]
    NoManagedBundle,
    #[error("cannot write {kind} {name}: {source}")]
    Write {
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
}

/// What the loop follows, each a typed channel from its one writer.
#[derive(Debug)]
pub struct Inputs {
    /// The rules in force; also why none are, for the log.
    pub rules: Arc<RuleStore>,
    /// The ownership ConfigMap's registration annotation.
    pub switch: watch::Receiver<Switch>,
    /// The CA bundle of the certificates the server keeps itself.
    pub trust_bundle: watch::Receiver<Option<Arc<Vec<u8>>>>,
}

/// What was last applied: the rules generation, the CA bundle and the
/// versions found for the resources whose document names none.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    generation: u64,
    ca_bundle: Option<Vec<u8>>,
    resolution: Resolution,
}

/// What the loop last reported, so that a state is logged (and counted) once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reported {
    Nothing,
    Waiting,
    ListingCrds,
    StoodDown,
    Failed(String),
    Applied,
}

/// The last successful apply: what, and when.
#[derive(Debug)]
struct Registered {
    applied: Applied,
    at: Instant,
}

/// After a failed apply: what it was, and when it is tried again.
#[derive(Debug)]
struct Retry {
    wanted: Applied,
    at: Instant,
}

/// Keeps the webhook configurations in step with the rules, and the CRDs'
/// storage versions, until the process ends.
pub async fn keep_registered(client: Client, registration: Registration, metrics: Arc<Metrics>, inputs: Inputs) {
    let (versions_found, storage_versions) = watch::channel(StorageVersions::default());
    let (changed, own_changes) = watch::channel(0);
    let name = registration.name.clone();
    let in_force = inputs.rules.subscribe();
    let keeper = Keeper {
        client: client.clone(),
        registration,
        metrics,
        rules: inputs.rules,
        in_force,
        switch: inputs.switch,
        trust_bundle: inputs.trust_bundle,
        versions: storage_versions,
        own_changes,
        drifted: false,
        registered: None,
        retry: None,
        backoff: backoff(),
        reported: Reported::Nothing,
    };
    tokio::join!(
        versions::watch_storage_versions(client.clone(), versions_found),
        watch_own_configurations(client, name, changed),
        keeper.run(),
    );
}

/// Counts every change of the two configurations named `name` that
/// [`is_drift`] (each watched by name: a field selector, which a Role
/// limited to those names allows).
async fn watch_own_configurations(client: Client, name: String, changed: watch::Sender<u64>) {
    let validating = watch_object(Api::<ValidatingWebhookConfiguration>::all(client.clone()), &name)
        .default_backoff()
        .map_ok(|object| is_drift(object.as_ref().map(|o| &o.metadata)))
        .boxed();
    let mutating = watch_object(Api::<MutatingWebhookConfiguration>::all(client), &name)
        .default_backoff()
        .map_ok(|object| is_drift(object.as_ref().map(|o| &o.metadata)))
        .boxed();
    let mut changes = futures::stream::select(validating, mutating);
    let mut last_error: Option<String> = None;
    while let Some(change) = changes.next().await {
        match change {
            Ok(drifted) => {
                last_error = None;
                if drifted {
                    changed.send_modify(|count| *count += 1);
                }
            }
            Err(e) => {
                let error = e.to_string();
                if last_error.as_ref() != Some(&error) {
                    tracing::warn!(%name, %error, "cannot watch the webhook configurations; retrying (a change to them is repaired at the next resync instead)");
                }
                last_error = Some(error);
            }
        }
    }
}

/// Whether a version of a configuration (`None`: deleted) is someone
/// else's doing: its `webhooks` no longer held by the servers' field
/// manager (a replacement, as `helm upgrade --force` makes), or written in
/// part by another (a hand edit). The servers' own applies, this replica's
/// or another's, are not drift: replicas of two versions that want
/// different configurations (a rolling upgrade) then meet at the resync,
/// not once a second.
fn is_drift(metadata: Option<&ObjectMeta>) -> bool {
    let Some(metadata) = metadata else { return true };
    let holds_webhooks = |entry: &ManagedFieldsEntry| {
        entry
            .fields_v1
            .as_ref()
            .is_some_and(|fields| fields.0.get("f:webhooks").is_some())
    };
    let entries = metadata.managed_fields.as_deref().unwrap_or_default();
    let ours = entries
        .iter()
        .any(|e| e.manager.as_deref() == Some(FIELD_MANAGER) && holds_webhooks(e));
    let others = entries
        .iter()
        .any(|e| e.manager.as_deref() != Some(FIELD_MANAGER) && holds_webhooks(e));
    !ours || others
}

/// Retries of a failed apply: from half a second, doubling to 30 s, with jitter
/// so that replicas refused together do not retry together.
pub(super) fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}

struct Keeper {
    client: Client,
    registration: Registration,
    metrics: Arc<Metrics>,
    rules: Arc<RuleStore>,
    in_force: watch::Receiver<Option<InForce>>,
    switch: watch::Receiver<Switch>,
    trust_bundle: watch::Receiver<Option<Arc<Vec<u8>>>>,
    versions: watch::Receiver<StorageVersions>,
    own_changes: watch::Receiver<u64>,
    /// The configurations changed since they were last applied.
    drifted: bool,
    registered: Option<Registered>,
    retry: Option<Retry>,
    backoff: ExponentialBackoff,
    reported: Reported,
}

impl Keeper {
    async fn run(mut self) {
        tracing::info!(name = %self.registration.name, target = ?self.registration.target, "keeping the webhook configurations in step with the rules");
        loop {
            let wake = self.sync().await.unwrap_or_else(|| Instant::now() + IDLE);
            // A channel whose writer is gone (no ConfigMap: no switch)
            // fails its branch, which then waits no more.
            tokio::select! {
                Ok(()) = self.in_force.changed() => {},
                Ok(()) = self.switch.changed() => {},
                Ok(()) = self.trust_bundle.changed() => {},
                Ok(()) = self.versions.changed() => {},
                Ok(()) = self.own_changes.changed() => self.drifted = true,
                () = tokio::time::sleep_until(wake) => {},
            }
        }
    }

    /// Brings the configurations to what the inputs say; returns when the
    /// loop must look again even if no input changes.
    async fn sync(&mut self) -> Option<Instant> {
        let now = Instant::now();
        if *self.switch.borrow_and_update() == Switch::StoodDown {
            if self.report(Reported::StoodDown) {
                tracing::warn!(name = %self.registration.name, "statusguard.dev/registration: disabled, on the ownership ConfigMap or its state ConfigMap, stands the servers down (statusguard unregister, or the runbook): the webhook configurations are not applied");
                self.metrics.webhook_sync(WebhookSync::StoodDown);
            }
            self.registered = None;
            self.retry = None;
            return None;
        }
        let Some(in_force) = self.in_force.borrow_and_update().clone() else {
            if self.report(Reported::Waiting) {
                let why = self.rules.problem().map(|p| p.to_string()).unwrap_or_default();
                tracing::warn!(name = %self.registration.name, %why, "no valid ownership rules yet: no webhook configuration is applied, nothing is intercepted");
                self.metrics.webhook_sync(WebhookSync::Waiting);
            }
            return None;
        };
        let known = self.versions.borrow_and_update().clone();
        let Some(resolution) = versions::resolve(&in_force.rules, &known) else {
            if self.report(Reported::ListingCrds) {
                tracing::info!(name = %self.registration.name, "listing the CRDs for the storage versions of the resources without version: before any webhook configuration is applied");
            }
            return None;
        };
        let managed = self.trust_bundle.borrow_and_update().clone();
        let ca_poll = matches!(self.registration.ca, CaSource::File(_)).then(|| now + CA_POLL);
        let ca_bundle = match read_ca_bundle(&self.registration.ca, managed.as_deref().map(Vec::as_slice)) {
            Ok(bundle) => bundle,
            Err(e) => {
                self.failed(e.to_string());
                return ca_poll;
            }
        };
        let wanted = Applied {
            generation: in_force.generation,
            ca_bundle,
            resolution,
        };
        let earliest = |at: Instant| Some(ca_poll.map_or(at, |poll| poll.min(at)));
        if let Some(Registered { applied, at }) = &self.registered
            && *applied == wanted
        {
            let resync = *at + self.registration.resync;
            let due = match self.drifted {
                true => resync.min(*at + DRIFT_SPACING),
                false => resync,
            };
            if now < due {
                return earliest(due);
            }
        }
        if let Some(retry) = &self.retry
            && retry.wanted == wanted
            && now < retry.at
        {
            return earliest(retry.at);
        }
        let configurations = desired(
            &self.registration,
            &in_force.rules,
            &wanted.resolution.versions,
            wanted.ca_bundle.as_deref(),
        );
        match apply(&self.client, &configurations).await {
            Ok(()) => {
                let before = self.registered.take().map(|r| r.applied);
                if before.as_ref() != Some(&wanted) {
                    tracing::info!(name = %self.registration.name, generation = wanted.generation, summary = %in_force.rules.summary(), "webhook configurations applied");
                    if before.as_ref().map(|a| (a.generation, &a.resolution))
                        != Some((wanted.generation, &wanted.resolution))
                    {
                        log_versions(&in_force.rules, &wanted.resolution);
                    }
                }
                self.metrics.webhook_sync(WebhookSync::Applied(wanted.generation));
                self.reported = Reported::Applied;
                self.registered = Some(Registered {
                    applied: wanted,
                    at: now,
                });
                self.drifted = false;
                self.retry = None;
                self.backoff = backoff();
                earliest(now + self.registration.resync)
            }
            Err(e) => {
                self.failed(e.to_string());
                let delay = self.backoff.next().unwrap_or(Duration::from_secs(30));
                let at = now + delay;
                self.retry = Some(Retry { wanted, at });
                earliest(at)
            }
        }
    }

    /// Whether `state` is news (then it is what was last reported).
    fn report(&mut self, state: Reported) -> bool {
        let news = self.reported != state;
        self.reported = state;
        news
    }

    fn failed(&mut self, error: String) {
        if self.report(Reported::Failed(error.clone())) {
            tracing::warn!(%error, "cannot apply the webhook configurations; retrying (what is registered stays)");
        }
        self.metrics.webhook_sync(WebhookSync::Failed);
    }
}

/// The CA bundle to write into the configurations, read now; `managed` is
/// the bundle of the certificates the server keeps itself.
fn read_ca_bundle(source: &CaSource, managed: Option<&[u8]>) -> Result<Option<Vec<u8>>, RegistrationError> {
    match source {
        CaSource::None => Ok(None),
        CaSource::File(path) => std::fs::read(path)
            .map(Some)
            .map_err(|source| RegistrationError::CaFile {
                path: path.clone(),
                source,
            }),
        CaSource::Managed => managed
            .map(|bundle| Some(bundle.to_vec()))
            .ok_or(RegistrationError::NoManagedBundle),
    }
}

/// Applies both configurations (server-side apply, forced: statusguard is
/// the one owner of what it writes). k8s-openapi writes `apiVersion` and
/// `kind`, which an apply body needs.
async fn apply(client: &Client, configurations: &Configurations) -> Result<(), RegistrationError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let name = configurations.validating.metadata.name.clone().unwrap_or_default();
    let write_error = |kind: &'static str| {
        let name = name.clone();
        move |source| RegistrationError::Write { kind, name, source }
    };
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    validating
        .patch(&name, &params, &Patch::Apply(&configurations.validating))
        .await
        .map_err(write_error("ValidatingWebhookConfiguration"))?;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutating
        .patch(&name, &params, &Patch::Apply(&configurations.mutating))
        .await
        .map_err(write_error("MutatingWebhookConfiguration"))?;
    Ok(())
}

/// One line per resource: the version its rule names, and where it comes
/// from; a warning for each registered for every version.
fn log_versions(rules: &Ownership, resolution: &Resolution) {
    for r in rules.resources() {
        let resource = r.name();
        let key = GroupResource::new(r.group.as_str(), r.resource.as_str());
        if let Some(version) = &r.version {
            tracing::info!(%resource, %version, "the webhook rule names the document's version: writes in other versions are converted to it");
        } else if let Some(version) = resolution.versions.get(&key) {
            tracing::info!(%resource, %version, "the webhook rule names the CRD's storage version: writes in other versions are converted to it");
        } else if let Some(why) = resolution.unversioned.get(&key) {
            tracing::warn!(%resource, %why, "the webhook rule names every version (*): writes are not converted, and the paths are read in whatever version a writer uses; name version: in the document");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managed(entries: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(serde_json::json!({"name": "sg", "managedFields": entries})).unwrap()
    }

    #[test]
    fn only_someone_elses_writes_of_the_webhooks_are_drift() {
        let ours = serde_json::json!({"manager": FIELD_MANAGER, "operation": "Apply",
                                      "fieldsType": "FieldsV1", "fieldsV1": {"f:webhooks": {}}});
        let helm = serde_json::json!({"manager": "helm", "operation": "Update",
                                      "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}});
        let edit = serde_json::json!({"manager": "kubectl-edit", "operation": "Update",
                                      "fieldsType": "FieldsV1", "fieldsV1": {"f:webhooks": {}}});
        // The servers' own apply (any replica's), beside the chart's labels.
        assert!(!is_drift(Some(&managed(serde_json::json!([ours, helm])))));
        // Deleted; replaced (helm --force: nobody holds the webhooks); edited by hand.
        assert!(is_drift(None));
        assert!(is_drift(Some(&managed(serde_json::json!([helm])))));
        assert!(is_drift(Some(&managed(serde_json::json!([ours, edit])))));
    }
}
