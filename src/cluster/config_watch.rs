//! Cluster mode: the ownership ConfigMap, watched with kube-runtime.
//!
//! Only that one object is watched ([`watch_object`], a field selector on its
//! name), so a Role limited to get/list/watch of that ConfigMap suffices. A
//! valid new document replaces the rules atomically; anything else (YAML or
//! schema errors, overlapping owners, a missing key, a deleted ConfigMap)
//! leaves the last good rules in force and is reported: a warning log, the
//! `rules_stale` gauge and `config_reloads_total`, and a Warning Event on the
//! ConfigMap (reason `InvalidOwnership`). Its annotation
//! `statusguard.dev/registration: disabled` stands the webhook registration
//! down: the watch reads it into the [`Switch`] the registration follows.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher::watch_object;
use kube::{Api, Client, Resource as _};
use tokio::sync::watch;

use super::events::{self, Events};
use super::registration::Switch;
use crate::ownership::CONFIGMAP_KEY;
use crate::rules::store::RuleStore;
use crate::rules::{ConfigMapRef, LoadError, from_configmap};

/// What the watch last acted on: a re-list after a watch restart delivers
/// the same object again, which changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Nothing,
    /// The ConfigMap was absent.
    Absent,
    /// The ConfigMap, with this text under the document's key (or none).
    Document(Option<String>),
}

/// Watches the ConfigMap until the process ends: its document into
/// `rules`, its annotation into `switch`. Watch errors (the API server
/// restarting, a 410 Gone) are retried with backoff; the rules in force
/// never lapse meanwhile.
pub async fn watch_configmap(
    client: Client,
    configmap: ConfigMapRef,
    rules: Arc<RuleStore>,
    switch: watch::Sender<Switch>,
    events: Events,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &configmap.namespace);
    let mut state = WatchState {
        configmap,
        rules,
        switch,
        events,
        seen: Seen::Nothing,
    };
    tracing::info!(configmap = %state.configmap, "watching the ownership ConfigMap");
    let mut updates = watch_object(api, &state.configmap.name).default_backoff().boxed();
    while let Some(update) = updates.next().await {
        match update {
            Ok(Some(object)) => state.apply(&object).await,
            Ok(None) => state.gone().await,
            Err(e) => {
                tracing::warn!(configmap = %state.configmap, error = %e, "watching the ownership ConfigMap failed; retrying, the rules in force stay")
            }
        }
    }
}

struct WatchState {
    configmap: ConfigMapRef,
    rules: Arc<RuleStore>,
    switch: watch::Sender<Switch>,
    events: Events,
    seen: Seen,
}

impl WatchState {
    fn in_force(&self) -> &'static str {
        if self.rules.current().is_some() {
            "the last good rules stay in force"
        } else {
            "no rules are in force: not ready"
        }
    }

    async fn apply(&mut self, object: &ConfigMap) {
        self.switch.send_if_modified(|switch| {
            let was = std::mem::replace(switch, Switch::of(object));
            was != *switch
        });
        let seen = Seen::Document(object.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)).cloned());
        if self.seen == seen {
            return;
        }
        self.seen = seen;
        match from_configmap(object, &self.configmap) {
            Ok(rules) => {
                let summary = rules.summary();
                let generation = self.rules.replace(rules);
                tracing::info!(configmap = %self.configmap, generation, %summary, "ownership rules loaded");
            }
            Err(e) => self.invalid(object, &e).await,
        }
    }

    async fn invalid(&self, object: &ConfigMap, error: &LoadError) {
        let problems = error.problems();
        let in_force = self.in_force();
        tracing::warn!(configmap = %self.configmap, problems = ?problems, "invalid ownership document; {in_force}");
        self.rules.reject(
            "invalid",
            format!(
                "ConfigMap {} holds an invalid ownership document ({in_force}): {}",
                self.configmap,
                problems.join("; ")
            ),
        );
        let note = events::note(format!("{in_force}: {}", problems.join("; ")));
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidOwnership".into(),
            note: Some(note),
            action: "LoadOwnership".into(),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(configmap = %self.configmap, error = %e, "cannot publish the InvalidOwnership event");
        }
    }

    async fn gone(&mut self) {
        if self.seen == Seen::Absent {
            return;
        }
        self.seen = Seen::Absent;
        let in_force = self.in_force();
        tracing::warn!(configmap = %self.configmap, "the ownership ConfigMap is absent; {in_force}");
        self.rules.reject(
            "missing",
            format!(
                "ConfigMap {} is absent (not found or deleted); {in_force}",
                self.configmap
            ),
        );
    }
}
