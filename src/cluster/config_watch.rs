//! Cluster mode: the ownership ConfigMap, watched with kube-runtime.
//!
//! Only that object and its state ConfigMap are watched ([`watch_object`], a
//! field selector on each name), so a Role limited to them by name
//! suffices. A valid new document replaces the rules atomically; anything
//! else (YAML or schema errors, overlapping owners, a missing key, a
//! deleted ConfigMap) leaves the last good rules in force and is reported:
//! a warning log, the `rules_stale` gauge and `config_reloads_total`, and a
//! Warning Event on the ConfigMap (reason `InvalidOwnership`).
//!
//! Every valid document is also kept in the state ConfigMap
//! (`kept_document`), and a server that starts while the ConfigMap
//! is invalid or absent enforces the kept one: a restart does not turn a
//! tolerated state into a lockout. The annotation
//! `statusguard.dev/registration: disabled`, on either ConfigMap, stands the
//! webhook registration down: the watch reads both into the [`Switch`] the
//! registration follows. On the state ConfigMap, which no GitOps tool
//! renders, a re-sync cannot undo it.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher::{self, watch_object};
use kube::{Api, Client, Resource as _};
use tokio::sync::watch;

use super::events::{self, Events};
use super::kept_document;
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

/// One change of either watched object.
enum Change {
    Ownership(Result<Option<ConfigMap>, watcher::Error>),
    State(Result<Option<ConfigMap>, watcher::Error>),
}

/// Watches the ConfigMap and its state ConfigMap until the process ends:
/// the document into `rules` (and, when valid, into the state ConfigMap),
/// both annotations into `switch`. Watch errors (the API server restarting,
/// a 410 Gone) are retried with backoff; the rules in force never lapse
/// meanwhile.
pub async fn watch_configmap(
    client: Client,
    configmap: ConfigMapRef,
    rules: Arc<RuleStore>,
    switch: watch::Sender<Switch>,
    events: Events,
) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &configmap.namespace);
    let mut watch = WatchState {
        state_configmap: kept_document::state_configmap(&configmap),
        configmap,
        client,
        rules,
        switch,
        events,
        seen: Seen::Nothing,
        kept: None,
        last_valid: None,
        enforcing_kept: false,
        stood_down: StoodDown::default(),
    };
    watch.start_from_kept().await;
    tracing::info!(configmap = %watch.configmap, state = %watch.state_configmap, "watching the ownership ConfigMap");
    let ownership = watch_object(api.clone(), &watch.configmap.name)
        .default_backoff()
        .map(Change::Ownership);
    let kept = watch_object(api, &watch.state_configmap.name)
        .default_backoff()
        .map(Change::State);
    let mut updates = futures::stream::select(ownership, kept).boxed();
    while let Some(update) = updates.next().await {
        match update {
            Change::Ownership(Ok(Some(object))) => watch.apply(&object).await,
            Change::Ownership(Ok(None)) => watch.gone().await,
            Change::State(Ok(object)) => watch.state_changed(object.as_ref()).await,
            Change::Ownership(Err(e)) | Change::State(Err(e)) => {
                tracing::warn!(configmap = %watch.configmap, error = %e, "watching the ownership ConfigMap failed; retrying, the rules in force stay")
            }
        }
    }
}

/// Which of the two ConfigMaps stands the registration down.
#[derive(Debug, Default)]
struct StoodDown {
    by_ownership: bool,
    by_state: bool,
}

struct WatchState {
    configmap: ConfigMapRef,
    state_configmap: ConfigMapRef,
    client: Client,
    rules: Arc<RuleStore>,
    switch: watch::Sender<Switch>,
    events: Events,
    seen: Seen,
    /// The document text the state ConfigMap holds, as last seen.
    kept: Option<String>,
    /// The last valid document this server loaded from the ownership
    /// ConfigMap, and the resourceVersion it came from.
    last_valid: Option<(String, Option<String>)>,
    /// The rules in force came from the state ConfigMap, not (yet) from the
    /// ownership ConfigMap.
    enforcing_kept: bool,
    stood_down: StoodDown,
}

impl WatchState {
    fn in_force(&self) -> String {
        match (self.rules.current().is_some(), self.enforcing_kept) {
            (true, true) => format!(
                "the last valid document, kept in ConfigMap {}, stays in force",
                self.state_configmap
            ),
            (true, false) => "the last good rules stay in force".to_owned(),
            (false, _) => "no rules are in force: not ready".to_owned(),
        }
    }

    /// At start, before the ownership ConfigMap is read: the kept document,
    /// if there is a valid one, is in force (and the server ready) until
    /// the ConfigMap delivers a valid document of its own.
    async fn start_from_kept(&mut self) {
        match kept_document::fetch_state(&self.client, &self.state_configmap).await {
            Ok(object) => self.state_changed(object.as_ref()).await,
            // The state ConfigMap's watch delivers it again.
            Err(e) => {
                tracing::warn!(state = %self.state_configmap, error = %e, "cannot read the kept ownership document yet; starting without it")
            }
        }
    }

    /// The state ConfigMap as it is now (`None`: absent): its switch is
    /// followed; its document is put in force if nothing is (at start, or
    /// when the read at start failed); and a document it lost (deleted or
    /// emptied) is kept again from what this server loaded last. (A
    /// different document in it is left alone: during a rolling upgrade
    /// replicas may disagree on what is valid, and would overwrite each
    /// other without end.)
    async fn state_changed(&mut self, object: Option<&ConfigMap>) {
        self.stood_down.by_state = object.map(Switch::of) == Some(Switch::StoodDown);
        self.follow_switch();
        self.kept = object
            .and_then(|o| o.data.as_ref())
            .and_then(|d| d.get(CONFIGMAP_KEY))
            .cloned();
        if self.kept.is_none()
            && let Some((text, version)) = self.last_valid.clone()
        {
            self.keep(&text, version.as_deref()).await;
        }
        let Some(object) = object else { return };
        if self.rules.current().is_some() {
            return;
        }
        match kept_document::in_state(object, &self.state_configmap) {
            Ok(Some(kept)) => {
                let summary = kept.rules.summary();
                let generation = self.rules.replace(kept.rules);
                self.rules.waiting(format!(
                    "enforcing the last valid document, kept in ConfigMap {} (from resourceVersion {}), until ConfigMap {} holds a valid one",
                    self.state_configmap,
                    kept.from_resource_version.as_deref().unwrap_or("unknown"),
                    self.configmap
                ));
                tracing::info!(state = %self.state_configmap, generation, %summary, "enforcing the kept ownership document until the ConfigMap holds a valid one");
                self.enforcing_kept = true;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(state = %self.state_configmap, problems = ?e.problems(), "the kept ownership document does not load; starting without it")
            }
        }
    }

    /// Registration is on unless either ConfigMap stands it down.
    fn follow_switch(&self) {
        let wanted = match self.stood_down.by_ownership || self.stood_down.by_state {
            true => Switch::StoodDown,
            false => Switch::Enabled,
        };
        self.switch.send_if_modified(|switch| {
            let was = std::mem::replace(switch, wanted);
            was != *switch
        });
    }

    async fn apply(&mut self, object: &ConfigMap) {
        self.stood_down.by_ownership = Switch::of(object) == Switch::StoodDown;
        self.follow_switch();
        let seen = Seen::Document(object.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)).cloned());
        if self.seen == seen {
            return;
        }
        self.seen = seen;
        match from_configmap(object, &self.configmap) {
            Ok(rules) => {
                let summary = rules.summary();
                let generation = self.rules.replace(rules);
                self.enforcing_kept = false;
                tracing::info!(configmap = %self.configmap, generation, %summary, "ownership rules loaded");
                if let Some(text) = object.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)) {
                    let version = object.metadata.resource_version.clone();
                    self.last_valid = Some((text.clone(), version.clone()));
                    self.keep(text, version.as_deref()).await;
                }
            }
            Err(e) => self.invalid(object, &e).await,
        }
    }

    /// Keeps `text` (valid: it loaded) in the state ConfigMap, unless that
    /// already holds it.
    async fn keep(&mut self, text: &str, version: Option<&str>) {
        if self.kept.as_deref() == Some(text) {
            return;
        }
        match kept_document::keep(&self.client, &self.state_configmap, text, version).await {
            Ok(()) => {
                tracing::info!(state = %self.state_configmap, from_resource_version = version.unwrap_or_default(), "kept the ownership document for restarts");
                self.kept = Some(text.to_owned());
            }
            // Tried again with the next valid document, or when the state
            // ConfigMap is seen without one; meanwhile a restart finds the
            // previous one.
            Err(e) => {
                tracing::warn!(state = %self.state_configmap, error = %e, "cannot keep the ownership document for restarts")
            }
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
        self.publish_invalid(format!("{in_force}: {}", problems.join("; ")), &object.object_ref(&()))
            .await;
    }

    /// The `InvalidOwnership` Warning Event, on the ownership ConfigMap
    /// (which `kubectl describe` shows, or, when it is gone, `kubectl get
    /// events --field-selector involvedObject.name=NAME` still finds).
    async fn publish_invalid(&self, note: String, regarding: &ObjectReference) {
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidOwnership".into(),
            note: Some(events::note(note)),
            action: "LoadOwnership".into(),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&event, regarding).await {
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
        // Only where rules are in force: a first install before its
        // ConfigMap exists is not worth a warning.
        if self.rules.current().is_some() {
            let regarding = ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("ConfigMap".to_owned()),
                namespace: Some(self.configmap.namespace.clone()),
                name: Some(self.configmap.name.clone()),
                ..Default::default()
            };
            self.publish_invalid(format!("the ConfigMap is absent; {in_force}"), &regarding)
                .await;
        }
    }
}
