//! The ownership document in a ConfigMap (key `ownership.yaml`): read once
//! (the library, `check --configmap`) or watched (`serve --configmap`).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use crate::ownership::{CONFIGMAP_KEY, Ownership, OwnershipError};

#[derive(Debug, thiserror::Error)]
pub enum ConfigMapError {
    #[error("ConfigMap {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("cannot read ConfigMap {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("ConfigMap {namespace}/{name}: {source}")]
    Invalid {
        namespace: String,
        name: String,
        source: OwnershipError,
    },
}

/// The validated document held by a ConfigMap object.
pub fn ownership_of(configmap: &ConfigMap) -> Result<Ownership, OwnershipError> {
    let text = configmap
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIGMAP_KEY))
        .ok_or(OwnershipError::MissingKey)?;
    Ownership::from_yaml(text)
}

/// Reads and validates the document of ConfigMap `namespace/name` now.
pub async fn fetch_ownership(client: Client, namespace: &str, name: &str) -> Result<Ownership, ConfigMapError> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    let configmap = match api.get_opt(&name).await {
        Ok(Some(cm)) => cm,
        Ok(None) => return Err(ConfigMapError::NotFound { namespace, name }),
        Err(source) => {
            return Err(ConfigMapError::Read {
                namespace,
                name,
                source,
            });
        }
    };
    ownership_of(&configmap).map_err(|source| ConfigMapError::Invalid {
        namespace,
        name,
        source,
    })
}
