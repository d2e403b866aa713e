//! The storage versions of the cluster's CRDs, for the webhook rules of the
//! resources whose ownership document names no `version:`.
//!
//! One kube-runtime watch of every CustomResourceDefinition keeps a map
//! from CRD name (`<plural>.<group>`) to its storage version (the version
//! with `storage: true`), so that the registration loop re-resolves when a
//! CRD's storage version changes or a CRD appears after the document. Only
//! the names are kept: each CRD is read into [`CrdStorage`], which skips its
//! schemas, and the initial list is read in small pages, so that a cluster
//! with many large CRDs costs little memory.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::Deserialize;
use tokio::sync::watch;

use crate::ownership::{GroupResource, Ownership};

/// The versions found for the resources whose document names none, by
/// group/resource: their CRDs' storage versions.
pub type ResolvedVersions = BTreeMap<GroupResource, String>;

/// CRDs per page of the initial list: a CRD with large schemas can be
/// hundreds of kilobytes, and a page is read whole before it is parsed.
const PAGE_SIZE: u32 = 20;

/// A CustomResourceDefinition as far as the webhook rules need it: its name
/// and the names of its versions, with the storage one marked. Every other
/// member (the schemas above all) is skipped unread.
#[derive(Debug, Clone, Deserialize)]
pub struct CrdStorage {
    /// `<plural>.<group>`.
    pub metadata: ObjectMeta,
    /// Absent in a watch's bookmarks.
    #[serde(default)]
    pub spec: CrdSpec,
}

/// The versions of a CRD.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CrdSpec {
    /// Every version the CRD defines.
    #[serde(default)]
    pub versions: Vec<CrdVersion>,
}

/// One version of a CRD.
#[derive(Debug, Clone, Deserialize)]
pub struct CrdVersion {
    /// `v1`, `v1beta2`.
    pub name: String,
    /// The version objects are stored in: exactly one has it.
    #[serde(default)]
    pub storage: bool,
}

impl CrdStorage {
    /// The version with `storage: true`.
    fn storage_version(&self) -> Option<&str> {
        self.spec.versions.iter().find(|v| v.storage).map(|v| v.name.as_str())
    }
}

impl kube::Resource for CrdStorage {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("CustomResourceDefinition")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("apiextensions.k8s.io")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("customresourcedefinitions")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What is known of the CRDs' storage versions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StorageVersions {
    /// The first list has not finished: nothing is known yet.
    #[default]
    Listing,
    /// CRD name to storage version, as last listed and watched.
    Listed(Arc<BTreeMap<String, String>>),
    /// The CRDs could not be listed (no RBAC grant, most often); the watch
    /// keeps retrying.
    Unreadable(String),
}

/// Why a resource's webhook rule names every version, `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unversioned {
    /// Its group has no dot: a built-in resource (a CRD's group needs one).
    BuiltIn,
    /// No CRD of that name exists (yet); a CRD created later is picked up.
    NoCrd(String),
    /// The CRDs cannot be read.
    Unreadable(String),
}

impl std::fmt::Display for Unversioned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unversioned::BuiltIn => f.write_str("a built-in resource (its group has no dot), which has no CRD"),
            Unversioned::NoCrd(name) => write!(f, "there is no CRD {name} (yet)"),
            Unversioned::Unreadable(error) => write!(f, "the CRDs cannot be read: {error}"),
        }
    }
}

/// The versions of the resources whose document names none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolution {
    /// Their CRDs' storage versions.
    pub versions: ResolvedVersions,
    /// Those registered for every version, and why.
    pub unversioned: BTreeMap<GroupResource, Unversioned>,
}

/// Resolves the version of every resource of `rules` whose document names
/// none; `None` while the CRDs are still being listed and one of them
/// needs its CRD (a built-in resource needs none).
pub fn resolve(rules: &Ownership, known: &StorageVersions) -> Option<Resolution> {
    let mut resolution = Resolution::default();
    for r in rules.resources().iter().filter(|r| r.version.is_none()) {
        let key = GroupResource::new(r.group.as_str(), r.resource.as_str());
        if !r.group.contains('.') {
            resolution.unversioned.insert(key, Unversioned::BuiltIn);
            continue;
        }
        let crd = format!("{}.{}", r.resource, r.group);
        match known {
            StorageVersions::Listing => return None,
            StorageVersions::Listed(versions) => match versions.get(&crd) {
                Some(version) => {
                    resolution.versions.insert(key, version.clone());
                }
                None => {
                    resolution.unversioned.insert(key, Unversioned::NoCrd(crd));
                }
            },
            StorageVersions::Unreadable(error) => {
                resolution
                    .unversioned
                    .insert(key, Unversioned::Unreadable(error.clone()));
            }
        }
    }
    Some(resolution)
}

/// Watches every CRD until the process ends, publishing their storage
/// versions to `known` whenever they change. Watch errors are retried with
/// backoff; what was listed stays known meanwhile.
pub async fn watch_storage_versions(client: Client, known: watch::Sender<StorageVersions>) {
    let api: Api<CrdStorage> = Api::all(client);
    let config = watcher::Config::default().page_size(PAGE_SIZE);
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // The versions as the watch has them, and those of a re-list under way.
    let mut listed: Option<BTreeMap<String, String>> = None;
    let mut relisting: BTreeMap<String, String> = BTreeMap::new();
    let mut last_error: Option<String> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => relisting.clear(),
            Ok(Event::InitApply(crd)) => {
                if let (Some(name), Some(version)) = (crd.metadata.name.as_ref(), crd.storage_version()) {
                    relisting.insert(name.clone(), version.to_owned());
                }
            }
            Ok(Event::InitDone) => listed = Some(std::mem::take(&mut relisting)),
            Ok(Event::Apply(crd)) => {
                if let (Some(versions), Some(name)) = (listed.as_mut(), crd.metadata.name.as_ref()) {
                    match crd.storage_version() {
                        Some(version) => versions.insert(name.clone(), version.to_owned()),
                        None => versions.remove(name),
                    };
                }
            }
            Ok(Event::Delete(crd)) => {
                if let (Some(versions), Some(name)) = (listed.as_mut(), crd.metadata.name.as_ref()) {
                    versions.remove(name);
                }
            }
            Err(e) => {
                let error = e.to_string();
                if last_error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "cannot watch the CustomResourceDefinitions; retrying (the webhook rules of resources without version: name their CRD's storage version once it can be read)");
                }
                last_error = Some(error.clone());
                if listed.is_none() {
                    known.send_if_modified(|state| replace_if_changed(state, StorageVersions::Unreadable(error)));
                }
                continue;
            }
        }
        if let Some(versions) = &listed {
            last_error = None;
            known.send_if_modified(|state| {
                if matches!(state, StorageVersions::Listed(current) if **current == *versions) {
                    false
                } else {
                    *state = StorageVersions::Listed(Arc::new(versions.clone()));
                    true
                }
            });
        }
    }
}

fn replace_if_changed(state: &mut StorageVersions, new: StorageVersions) -> bool {
    if *state == new {
        false
    } else {
        *state = new;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Ownership {
        Ownership::from_yaml(
            r#"
apiVersion: statusguard.dev/v1alpha1
kind: StatusOwnership
resources:
  - {group: example.com, resource: widgets}
  - {group: example.com, resource: gadgets, version: v3}
  - {group: example.com, resource: gizmos}
  - {group: autoscaling, resource: horizontalpodautoscalers}
"#,
        )
        .unwrap()
    }

    fn listed(crds: &[(&str, &str)]) -> StorageVersions {
        StorageVersions::Listed(Arc::new(
            crds.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
        ))
    }

    #[test]
    fn the_crds_storage_version_for_resources_without_one_of_their_own() {
        let known = listed(&[("widgets.example.com", "v2"), ("gadgets.example.com", "v1")]);
        let resolution = resolve(&rules(), &known).unwrap();
        // The document's version is its own: gadgets are not resolved.
        assert_eq!(
            resolution.versions,
            [(GroupResource::new("example.com", "widgets"), "v2".to_owned())]
                .into_iter()
                .collect()
        );
        assert_eq!(
            resolution.unversioned,
            [
                (
                    GroupResource::new("example.com", "gizmos"),
                    Unversioned::NoCrd("gizmos.example.com".to_owned())
                ),
                (
                    GroupResource::new("autoscaling", "horizontalpodautoscalers"),
                    Unversioned::BuiltIn
                ),
            ]
            .into_iter()
            .collect()
        );
    }

    #[test]
    fn nothing_is_resolved_before_the_first_list_unless_no_crd_is_needed() {
        assert_eq!(resolve(&rules(), &StorageVersions::Listing), None);
        let built_in = Ownership::from_yaml(
            "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nresources:\n  - {group: \"\", resource: configmaps}\n  - {group: example.com, resource: widgets, version: v1}\n",
        )
        .unwrap();
        let resolution = resolve(&built_in, &StorageVersions::Listing).unwrap();
        assert!(resolution.versions.is_empty());
        assert_eq!(
            resolution.unversioned.into_values().collect::<Vec<_>>(),
            vec![Unversioned::BuiltIn]
        );
    }

    #[test]
    fn unreadable_crds_leave_every_version() {
        let resolution = resolve(&rules(), &StorageVersions::Unreadable("403".to_owned())).unwrap();
        assert!(resolution.versions.is_empty());
        assert_eq!(
            resolution.unversioned[&GroupResource::new("example.com", "widgets")],
            Unversioned::Unreadable("403".to_owned())
        );
    }

    #[test]
    fn a_crd_is_read_without_its_schemas() {
        let crd: CrdStorage = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "versions": [
                {"name": "v1", "served": true, "storage": false, "schema": {"openAPIV3Schema": {"type": "object"}}},
                {"name": "v2", "served": true, "storage": true}]}
        }))
        .unwrap();
        assert_eq!(crd.storage_version(), Some("v2"));
        let bookmark: CrdStorage =
            serde_json::from_value(serde_json::json!({"metadata": {"resourceVersion": "12"}})).unwrap();
        assert_eq!(bookmark.storage_version(), None);
    }
}
