//! Cluster mode: the ownership ConfigMap, watched with kube-runtime.
//!
//! Only that one object is watched (a field selector on its name), so a Role
//! limited to get/list/watch of configmaps in its namespace suffices. A valid
//! new document replaces the rules atomically; anything else (YAML or schema
//! errors, overlapping owners, a missing key, a deleted ConfigMap) leaves the
//! last good rules in force and is reported: a warning log, the
//! `rules_stale` gauge and `config_reloads_total`, and a Warning Event on the
//! ConfigMap (reason `InvalidOwnership`).

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, Resource as _};

use super::App;
use crate::configmap::ownership_of;
use crate::ownership::{CONFIGMAP_KEY, OwnershipError};

/// Watches `namespace/name` until the process ends. Watch errors (the API
/// server restarting, a 410 Gone) are retried with backoff; the rules in
/// force never lapse meanwhile.
pub async fn watch_configmap(client: Client, namespace: String, name: String, app: Arc<App>) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let reporter = Reporter {
        controller: "statusguard".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let recorder = Recorder::new(client, reporter);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut state = WatchState {
        namespace,
        name,
        app,
        recorder,
        last_text: None,
        seen_in_init: false,
    };
    tracing::info!(configmap = %state.key(), "watching the ownership ConfigMap");
    while let Some(event) = events.next().await {
        match event {
            Ok(WatchEvent::Init) => state.seen_in_init = false,
            Ok(WatchEvent::InitApply(cm)) => {
                state.seen_in_init = true;
                state.apply(&cm).await;
            }
            Ok(WatchEvent::InitDone) if !state.seen_in_init => state.gone("not found").await,
            Ok(WatchEvent::InitDone) => {}
            Ok(WatchEvent::Apply(cm)) => state.apply(&cm).await,
            Ok(WatchEvent::Delete(_)) => state.gone("deleted").await,
            Err(e) => {
                tracing::warn!(configmap = %state.key(), error = %e, "watching the ownership ConfigMap failed; retrying, the rules in force stay")
            }
        }
    }
}

struct WatchState {
    namespace: String,
    name: String,
    app: Arc<App>,
    recorder: Recorder,
    /// The document text last acted on: a re-list after a watch restart
    /// delivers the same object again, which changes nothing.
    last_text: Option<Option<String>>,
    seen_in_init: bool,
}

impl WatchState {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    async fn apply(&mut self, cm: &ConfigMap) {
        let text = cm.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)).cloned();
        if self.last_text.as_ref() == Some(&text) {
            return;
        }
        self.last_text = Some(text);
        match ownership_of(cm) {
            Ok(rules) => {
                let summary = rules.summary();
                let generation = self.app.rules.replace(rules);
                tracing::info!(configmap = %self.key(), generation, %summary, "ownership rules loaded");
            }
            Err(e) => self.invalid(cm, &e).await,
        }
    }

    async fn invalid(&self, cm: &ConfigMap, error: &OwnershipError) {
        let problems = error.problems();
        let in_force = if self.app.rules.current().is_some() {
            "the previous rules stay in force"
        } else {
            "no rules are in force yet"
        };
        let why = format!(
            "ConfigMap {} holds an invalid ownership document ({in_force}): {}",
            self.key(),
            problems.join("; ")
        );
        tracing::warn!(configmap = %self.key(), problems = ?problems, "invalid ownership document; {in_force}");
        self.app.rules.reject("invalid", why);
        let mut note = format!("{in_force}: {}", problems.join("; "));
        // An Event note holds at most 1 kB.
        if note.len() > 1000 {
            let mut cut = 997;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidOwnership".into(),
            note: Some(note),
            action: "LoadOwnership".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &cm.object_ref(&())).await {
            tracing::warn!(configmap = %self.key(), error = %e, "cannot publish the InvalidOwnership event");
        }
    }

    async fn gone(&mut self, what: &str) {
        self.last_text = Some(None);
        let in_force = if self.app.rules.current().is_some() {
            "the last good rules stay in force"
        } else {
            "no rules are in force: not ready"
        };
        tracing::warn!(configmap = %self.key(), "the ownership ConfigMap is {what}; {in_force}");
        self.app
            .rules
            .reject("missing", format!("ConfigMap {} is {what}; {in_force}", self.key()));
    }
}
