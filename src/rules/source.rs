//! The sources of ownership rules, and the one loader for all of them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

use crate::ownership::{CONFIGMAP_KEY, Ownership, OwnershipError};

/// The example ownership document, compiled in: the rules `serve` uses when
/// no source is named, so that it runs on a fresh machine with no setup.
pub const EMBEDDED_OWNERSHIP: &str = include_str!("../../examples/ownership.yaml");

/// A ConfigMap by namespace and name, written `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigMapRef {
    /// The namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl FromStr for ConfigMapRef {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (namespace, name) = split_namespaced_name(text)?;
        Ok(Self { namespace, name })
    }
}

/// `NAMESPACE/NAME`, both parts non-empty: how every namespaced object is
/// named on the command line.
pub(crate) fn split_namespaced_name(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
    }
}

impl fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where the ownership rules come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulesSource {
    /// [`EMBEDDED_OWNERSHIP`].
    Embedded,
    /// A file holding the document, or a ConfigMap manifest with key `ownership.yaml`.
    File(PathBuf),
    /// A live ConfigMap's key `ownership.yaml` (cluster mode).
    ConfigMap(ConfigMapRef),
}

impl fmt::Display for RulesSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RulesSource::Embedded => f.write_str("the embedded example document"),
            RulesSource::File(path) => write!(f, "{}", path.display()),
            RulesSource::ConfigMap(cm) => write!(f, "ConfigMap {cm}"),
        }
    }
}

/// Why a source gave no rules; every variant names the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The document is broken.
    #[error("{origin}: {source}")]
    Invalid {
        /// Where the document came from.
        origin: String,
        /// Every problem found.
        source: OwnershipError,
    },
    /// A ConfigMap (manifest or live) without the document's key.
    #[error("{origin}: the ConfigMap has no key {CONFIGMAP_KEY:?}")]
    MissingKey {
        /// Where the ConfigMap came from.
        origin: String,
    },
    /// The live ConfigMap does not exist.
    #[error("ConfigMap {0} not found")]
    NotFound(ConfigMapRef),
    /// A ConfigMap source without a client (the `client` feature is off).
    #[error("{0}: reading a live ConfigMap needs a Kubernetes client")]
    NoClient(ConfigMapRef),
    /// The API server could not be asked.
    #[cfg(feature = "client")]
    #[error("cannot read ConfigMap {configmap}: {source}")]
    Kube {
        /// The ConfigMap.
        configmap: ConfigMapRef,
        /// The client's error.
        source: kube::Error,
    },
}

impl LoadError {
    /// Every problem as its own line, for logs, Events and `check`.
    pub fn problems(&self) -> Vec<String> {
        match self {
            LoadError::Invalid {
                source: OwnershipError::Invalid(problems),
                ..
            } => problems.clone(),
            other => vec![other.to_string()],
        }
    }
}

/// Only the one key of a ConfigMap manifest the loader needs; everything
/// else in the manifest is Kubernetes' business.
#[derive(Debug, Deserialize)]
struct ConfigMapManifest {
    kind: String,
    #[serde(default)]
    data: BTreeMap<String, String>,
}

/// Parses text that holds either the ownership document or a ConfigMap
/// manifest with the document under `data["ownership.yaml"]`.
pub fn parse_document(origin: &str, text: &str) -> Result<Ownership, LoadError> {
    if let Ok(manifest) = serde_saphyr::from_str::<ConfigMapManifest>(text)
        && manifest.kind == "ConfigMap"
    {
        let document = manifest.data.get(CONFIGMAP_KEY).ok_or_else(|| LoadError::MissingKey {
            origin: origin.to_owned(),
        })?;
        return parse_only_document(origin, document);
    }
    parse_only_document(origin, text)
}

pub(crate) fn parse_only_document(origin: &str, text: &str) -> Result<Ownership, LoadError> {
    Ownership::from_yaml(text).map_err(|source| LoadError::Invalid {
        origin: origin.to_owned(),
        source,
    })
}

impl RulesSource {
    /// Loads a source that needs no cluster: the embedded example or a file.
    pub fn load_local(&self) -> Result<Ownership, LoadError> {
        match self {
            RulesSource::Embedded => parse_document(&self.to_string(), EMBEDDED_OWNERSHIP),
            RulesSource::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
                    path: path.clone(),
                    source,
                })?;
                parse_document(&self.to_string(), &text)
            }
            RulesSource::ConfigMap(cm) => Err(LoadError::NoClient(cm.clone())),
        }
    }

    /// Loads any source now; a live ConfigMap is read with `client`.
    #[cfg(feature = "client")]
    pub async fn load(&self, client: &kube::Client) -> Result<Ownership, LoadError> {
        match self {
            RulesSource::ConfigMap(cm) => fetch_configmap(client, cm).await,
            local => local.load_local(),
        }
    }
}

/// The rules held by a live ConfigMap object (what cluster mode watches).
#[cfg(feature = "client")]
pub fn from_configmap(
    configmap: &k8s_openapi::api::core::v1::ConfigMap,
    origin: &ConfigMapRef,
) -> Result<Ownership, LoadError> {
    let origin = format!("ConfigMap {origin}");
    let text = configmap
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIGMAP_KEY))
        .ok_or_else(|| LoadError::MissingKey { origin: origin.clone() })?;
    parse_only_document(&origin, text)
}

/// Reads and validates the document of a live ConfigMap now.
#[cfg(feature = "client")]
pub async fn fetch_configmap(client: &kube::Client, configmap: &ConfigMapRef) -> Result<Ownership, LoadError> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), &configmap.namespace);
    match api.get_opt(&configmap.name).await {
        Ok(Some(object)) => from_configmap(&object, configmap),
        Ok(None) => Err(LoadError::NotFound(configmap.clone())),
        Err(source) => Err(LoadError::Kube {
            configmap: configmap.clone(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configmap_refs_parse_and_print() {
        let cm: ConfigMapRef = "ns/name".parse().unwrap();
        assert_eq!((cm.namespace.as_str(), cm.name.as_str()), ("ns", "name"));
        assert_eq!(cm.to_string(), "ns/name");
        for bad in ["ns", "/name", "ns/", "a/b/c"] {
            assert!(bad.parse::<ConfigMapRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_document_and_a_configmap_manifest_load_alike() {
        let manifest = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\ndata:\n  ownership.yaml: |\n{}",
            EMBEDDED_OWNERSHIP
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        );
        assert_eq!(
            parse_document("m", &manifest).unwrap(),
            RulesSource::Embedded.load_local().unwrap()
        );
        let missing = "apiVersion: v1\nkind: ConfigMap\ndata: {other: x}\n";
        assert!(matches!(
            parse_document("m", missing),
            Err(LoadError::MissingKey { origin }) if origin == "m"
        ));
    }

    #[test]
    fn errors_name_their_source() {
        let err = RulesSource::File("/nonexistent/rules.yaml".into())
            .load_local()
            .unwrap_err();
        assert!(
            err.to_string().starts_with("cannot read /nonexistent/rules.yaml"),
            "{err}"
        );
        let err = parse_document("doc.yaml", "kind: Nope\n").unwrap_err();
        assert!(err.to_string().starts_with("doc.yaml: "), "{err}");
    }
}
