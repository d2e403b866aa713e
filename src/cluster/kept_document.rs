//! What a server keeps across restarts in cluster mode: the last valid
//! ownership document, in a ConfigMap of its own beside the ownership
//! ConfigMap (`NAME-state`), where an operator may also put the
//! registration switch.
//!
//! Why a second object: the ownership ConfigMap belongs to whoever deploys
//! it (Helm, Argo CD, Flux). A restart while it is invalid or deleted must
//! still find the last valid document, and a GitOps re-sync of it must not
//! undo what an operator set to stand the servers down. Nobody renders the
//! state ConfigMap: the servers create it, write it by server-side apply
//! (one field manager, so every replica writes the same object), and only
//! ever with a document that parsed. An operator's annotation on it is
//! another manager's field, which the servers' applies leave alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::FIELD_MANAGER;
use crate::ownership::{CONFIGMAP_KEY, Ownership};
use crate::rules::source::{ConfigMapRef, LoadError, parse_only_document};

/// The annotation that says which version of the ownership ConfigMap the
/// kept document was read from.
pub const KEPT_FROM_ANNOTATION: &str = "statusguard.dev/kept-from-resource-version";

/// The state ConfigMap of the ownership ConfigMap `source`.
pub fn state_configmap(source: &ConfigMapRef) -> ConfigMapRef {
    ConfigMapRef {
        namespace: source.namespace.clone(),
        name: format!("{}-state", source.name),
    }
}

/// The last valid document, as a state ConfigMap holds it.
#[derive(Debug)]
pub struct KeptDocument {
    /// The rules it gives.
    pub rules: Ownership,
    /// The resourceVersion of the ownership ConfigMap it came from.
    pub from_resource_version: Option<String>,
}

/// The document kept in `state`, if it holds one that is valid for this
/// server (a document kept by a newer version may not be: then there is
/// none, and the error says why).
pub fn in_state(state: &ConfigMap, origin: &ConfigMapRef) -> Result<Option<KeptDocument>, LoadError> {
    let Some(text) = state.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)) else {
        return Ok(None);
    };
    // Read as the ownership ConfigMap's document is: the document itself,
    // never a manifest wrapping one.
    let rules = parse_only_document(&format!("ConfigMap {origin}"), text)?;
    let from_resource_version = state
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(KEPT_FROM_ANNOTATION))
        .cloned();
    Ok(Some(KeptDocument {
        rules,
        from_resource_version,
    }))
}

/// Reads the state ConfigMap; `None` when it does not exist.
pub async fn fetch_state(client: &Client, state: &ConfigMapRef) -> Result<Option<ConfigMap>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &state.namespace);
    api.get_opt(&state.name).await
}

/// Keeps `text`, a document that parsed, as the last valid one: creates
/// the state ConfigMap or updates the servers' fields of it.
pub async fn keep(
    client: &Client,
    state: &ConfigMapRef,
    text: &str,
    from_resource_version: Option<&str>,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &state.namespace);
    let mut annotations = BTreeMap::new();
    if let Some(version) = from_resource_version {
        annotations.insert(KEPT_FROM_ANNOTATION, version);
    }
    let apply = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": state.name,
            "labels": {"app.kubernetes.io/managed-by": "statusguard"},
            "annotations": annotations,
        },
        "data": {CONFIGMAP_KEY: text},
    });
    api.patch(&state.name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(apply))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::source::EMBEDDED_OWNERSHIP;

    fn configmap(value: serde_json::Value) -> ConfigMap {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_state_configmap_sits_beside_the_source() {
        let state = state_configmap(&"ops/statusguard-ownership".parse().unwrap());
        assert_eq!(state.to_string(), "ops/statusguard-ownership-state");
    }

    #[test]
    fn a_kept_document_loads_and_a_broken_one_is_refused() {
        let origin: ConfigMapRef = "ops/o-state".parse().unwrap();
        let kept = configmap(json!({
            "metadata": {"name": "o-state", "annotations": {KEPT_FROM_ANNOTATION: "42"}},
            "data": {CONFIGMAP_KEY: EMBEDDED_OWNERSHIP},
        }));
        let document = in_state(&kept, &origin).unwrap().unwrap();
        assert_eq!(document.rules, Ownership::from_yaml(EMBEDDED_OWNERSHIP).unwrap());
        assert_eq!(document.from_resource_version.as_deref(), Some("42"));
        assert!(!document.rules.resources().is_empty());

        let empty = configmap(json!({"metadata": {"name": "o-state"}}));
        assert!(in_state(&empty, &origin).unwrap().is_none());

        let broken = configmap(json!({"metadata": {"name": "o-state"}, "data": {CONFIGMAP_KEY: "kind: Nope\n"}}));
        let error = in_state(&broken, &origin).unwrap_err();
        assert!(error.to_string().starts_with("ConfigMap ops/o-state"), "{error}");
    }
}
