//! `--register-policies NAME`: the ownership rules as admission policies
//! ([`crate::policies`]), kept in step with the rules in force the way the
//! webhook configurations are ([`super::keep`]).
//!
//! Every replica applies the same objects with the same field manager
//! (server-side apply), so they converge without a leader. Nothing is
//! applied before the first valid document or while the registration
//! [`Switch`] stands the servers down, and an invalid document never is:
//! the rules in force are only ever a valid one, so what a valid document
//! set up stays. A document the policies would decide differently from the
//! webhook ([`crate::policies::deviations`]) is not applied either, unless
//! `--register-policies-allow-deviations` says so: the policies in force
//! stay, and the log names every deviation.
//!
//! Objects of the set (labelled [`POLICY_SET_LABEL`]`: NAME`) that the
//! rules no longer want, a resource taken out of the document or the
//! mutating policy of a resource no longer in trim, are deleted after the
//! apply. `statusguard unregister` deletes the whole set.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use backon::ExponentialBackoff;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Switch;
use super::keep::backoff;
use crate::cluster::FIELD_MANAGER;
use crate::metrics::{Metrics, PolicySync};
use crate::policies::{self, KINDS, POLICY_SET_LABEL, api_resource};
use crate::rules::store::{InForce, RuleStore};

/// A loop with nothing timed to do still looks again this often.
const IDLE: Duration = Duration::from_secs(3600);

/// How the server keeps its policies.
#[derive(Debug, Clone)]
pub struct PolicyRegistration {
    /// The set's name: the first label of every object's name, and the
    /// value of [`POLICY_SET_LABEL`].
    pub name: String,
    /// Apply even a document the policies decide differently from the webhook.
    pub allow_deviations: bool,
    /// How often the policies are applied again when nothing changed
    /// (repairs a hand edit or deletion).
    pub resync: Duration,
}

/// Why the policies could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PolicyRegistrationError {
    /// The API server refused an apply, a list or a delete.
    #[error("cannot {verb} {kind} {name}: {source}")]
    Write {
        /// apply, list or delete.
        verb: &'static str,
        /// The object's kind.
        kind: String,
        /// Its name (empty for a list).
        name: String,
        /// What the API server said.
        source: kube::Error,
    },
}

/// What the loop last reported, so that a state is logged once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reported {
    Nothing,
    Waiting,
    StoodDown,
    Deviations(u64),
    Failed(String),
    Applied(u64),
}

/// Keeps the policies of set `registration.name` in step with the rules
/// in force until the process ends.
pub async fn keep_policies(
    client: Client,
    registration: PolicyRegistration,
    metrics: Arc<Metrics>,
    rules: Arc<RuleStore>,
    switch: watch::Receiver<Switch>,
) {
    let in_force = rules.subscribe();
    let mut keeper = PolicyKeeper {
        client,
        registration,
        metrics,
        rules,
        in_force,
        switch,
        reported: Reported::Nothing,
        applied: None,
        backoff: backoff(),
    };
    tracing::info!(name = %keeper.registration.name, "keeping the admission policies in step with the rules");
    loop {
        let wake = keeper.sync().await.unwrap_or_else(|| Instant::now() + IDLE);
        // A channel whose writer is gone (no ConfigMap: no switch) fails
        // its branch, which then waits no more.
        tokio::select! {
            Ok(()) = keeper.in_force.changed() => {},
            Ok(()) = keeper.switch.changed() => {},
            () = tokio::time::sleep_until(wake) => {},
        }
    }
}

struct PolicyKeeper {
    client: Client,
    registration: PolicyRegistration,
    metrics: Arc<Metrics>,
    rules: Arc<RuleStore>,
    in_force: watch::Receiver<Option<InForce>>,
    switch: watch::Receiver<Switch>,
    reported: Reported,
    /// The rules generation last applied, and when.
    applied: Option<(u64, Instant)>,
    backoff: ExponentialBackoff,
}

impl PolicyKeeper {
    /// Whether `state` is news (then it is what was last reported).
    fn report(&mut self, state: Reported) -> bool {
        let news = self.reported != state;
        self.reported = state;
        news
    }

    /// One pass; returns when to look again even if no input changes.
    async fn sync(&mut self) -> Option<Instant> {
        let name = self.registration.name.clone();
        if *self.switch.borrow_and_update() == Switch::StoodDown {
            if self.report(Reported::StoodDown) {
                tracing::warn!(%name, "statusguard.dev/registration: disabled stands the servers down: the admission policies are not applied");
                self.metrics.policy_sync(PolicySync::StoodDown);
            }
            self.applied = None;
            return None;
        }
        let Some(in_force) = self.in_force.borrow_and_update().clone() else {
            if self.report(Reported::Waiting) {
                let why = self.rules.problem().map(|p| p.to_string()).unwrap_or_default();
                tracing::warn!(%name, %why, "no valid ownership rules yet: no admission policy is applied");
                self.metrics.policy_sync(PolicySync::Waiting);
            }
            return None;
        };
        let now = Instant::now();
        let resync = self.registration.resync;
        if let Some((generation, at)) = self.applied
            && generation == in_force.generation
            && now < at + resync
        {
            return Some(at + resync);
        }
        let too_long = policies::name_problems(&name, &in_force.rules);
        if !too_long.is_empty() {
            if self.report(Reported::Failed(too_long.join("; "))) {
                tracing::error!(%name, generation = in_force.generation, problems = ?too_long, "the admission policies cannot be named: not applied (the policies in force stay)");
                self.metrics.policy_sync(PolicySync::Failed);
            }
            return None;
        }
        let deviations = policies::deviations(&in_force.rules);
        if !deviations.is_empty() && !self.registration.allow_deviations {
            if self.report(Reported::Deviations(in_force.generation)) {
                tracing::error!(%name, generation = in_force.generation, ?deviations, "the policies would decide this document differently from the webhook: not applied (the policies in force stay); --register-policies-allow-deviations applies it as it is");
                self.metrics.policy_sync(PolicySync::Deviations);
            }
            return None;
        }
        match apply(&self.client, &name, &policies::policies(&name, &in_force.rules)).await {
            Ok(()) => {
                if self.report(Reported::Applied(in_force.generation)) {
                    tracing::info!(%name, generation = in_force.generation, summary = %in_force.rules.summary(), "admission policies applied");
                }
                self.metrics.policy_sync(PolicySync::Applied(in_force.generation));
                self.applied = Some((in_force.generation, now));
                self.backoff = backoff();
                Some(now + resync)
            }
            Err(e) => {
                let error = e.to_string();
                if self.report(Reported::Failed(error.clone())) {
                    tracing::warn!(%name, %error, "cannot apply the admission policies; retrying (what is applied stays)");
                }
                self.metrics.policy_sync(PolicySync::Failed);
                Some(now + self.backoff.next().unwrap_or(Duration::from_secs(30)))
            }
        }
    }
}

/// Applies `objects` (server-side apply, forced: statusguard is the one
/// owner of what it writes), then deletes the set's objects not among them.
async fn apply(client: &Client, set: &str, objects: &[serde_json::Value]) -> Result<(), PolicyRegistrationError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut wanted = BTreeSet::new();
    for object in objects {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(&kind));
        api.patch(&name, &params, &Patch::Apply(object))
            .await
            .map_err(|source| PolicyRegistrationError::Write {
                verb: "apply",
                kind: kind.clone(),
                name: name.clone(),
                source,
            })?;
        wanted.insert((kind, name));
    }
    // Bindings first, so that no policy is ever left bound to nothing.
    for kind in KINDS.iter().rev() {
        for name in set_members(client, set, kind).await? {
            if !wanted.contains(&((*kind).to_owned(), name.clone())) {
                delete(client, kind, &name).await?;
            }
        }
    }
    Ok(())
}

/// The names of the set's objects of `kind`.
pub(crate) async fn set_members(
    client: &Client,
    set: &str,
    kind: &str,
) -> Result<Vec<String>, PolicyRegistrationError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(kind));
    let selector = format!("{POLICY_SET_LABEL}={set}");
    let list = match api.list_metadata(&ListParams::default().labels(&selector)).await {
        Ok(list) => list,
        // A kind this API server does not serve (MutatingAdmissionPolicy
        // before Kubernetes 1.36 without its feature gate) holds none.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Vec::new()),
        Err(source) => {
            return Err(PolicyRegistrationError::Write {
                verb: "list",
                kind: kind.to_owned(),
                name: String::new(),
                source,
            });
        }
    };
    Ok(list.items.into_iter().filter_map(|o| o.metadata.name).collect())
}

/// Deletes one object; one already gone is not an error.
pub(crate) async fn delete(client: &Client, kind: &str, name: &str) -> Result<bool, PolicyRegistrationError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(kind));
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(source) => Err(PolicyRegistrationError::Write {
            verb: "delete",
            kind: kind.to_owned(),
            name: name.to_owned(),
            source,
        }),
    }
}
