//! What `statusguard suggest` reads: the objects of a resource (their
//! `managedFields`), through discovery and paged lists, and the observed
//! writers of each replica (`GET /observed`, or a saved copy).

use http_body_util::Empty;
use hyper::body::Bytes;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::{Discovery, Scope};
use kube::{Client, ResourceExt};

use super::managed_fields::{ObjectFields, object_fields};
use crate::admission::observe::ObservedWriters;

/// Why the cluster or a record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("the cluster serves no resource {0} (RESOURCE.GROUP, e.g. widgets.example.com; a core resource alone)")]
    UnknownResource(String),
    #[error("cannot read {what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("cannot read the observed writes at {source_name}: {reason}")]
    Observed { source_name: String, reason: String },
}

/// Every object of `group`/`resource` (in `namespace`, or all), read in
/// pages, as the status fields their managers set.
pub async fn objects(
    client: &Client,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    conditions_key: &str,
) -> Result<Vec<ObjectFields>, FetchError> {
    let name = super::resource_name(group, resource);
    let discovery = Discovery::new(client.clone())
        .filter(&[group])
        .run()
        .await
        .map_err(|source| FetchError::Kube {
            what: format!("the API group {group:?}"),
            source,
        })?;
    let (api_resource, capabilities) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.group == group && ar.plural == resource)
        .ok_or_else(|| FetchError::UnknownResource(name.clone()))?;
    let api: Api<DynamicObject> = match (capabilities.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &api_resource),
        _ => Api::all_with(client.clone(), &api_resource),
    };
    let mut fields = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(|source| FetchError::Kube {
            what: name.clone(),
            source,
        })?;
        for object in &page.items {
            let id = match object.namespace() {
                Some(ns) => format!("{ns}/{}", object.name_any()),
                None => object.name_any(),
            };
            fields.push(object_fields(
                &id,
                object.managed_fields(),
                conditions_key,
                object.data.get("status"),
            ));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(fields)
}

/// A replica's record: `http://HOST:PORT/observed` (its admin port, e.g.
/// through `kubectl port-forward`), or a file holding one.
pub async fn observed(source: &str) -> Result<ObservedWriters, FetchError> {
    let failed = |reason: String| FetchError::Observed {
        source_name: source.to_owned(),
        reason,
    };
    let body = match source.strip_prefix("http://") {
        Some(_) => {
            let uri: hyper::Uri = source.parse().map_err(|e| failed(format!("not a URL: {e}")))?;
            let authority = uri.authority().ok_or_else(|| failed("the URL names no host".into()))?;
            // The admin port's record, unless the URL names another path.
            let path = match uri.path_and_query().map(|p| p.as_str()) {
                None | Some("/") => "/observed",
                Some(path) => path,
            };
            let tcp = tokio::net::TcpStream::connect(authority.as_str())
                .await
                .map_err(|e| failed(e.to_string()))?;
            let request = hyper::Request::get(path)
                .header(hyper::header::HOST, authority.as_str())
                .body(Empty::<Bytes>::new())
                .map_err(|e| failed(e.to_string()))?;
            let (status, body) = crate::tools::http1::exchange(tcp, request).await.map_err(failed)?;
            if !status.is_success() {
                return Err(failed(format!("HTTP {status}")));
            }
            body.to_vec()
        }
        None if source.contains("://") => return Err(failed("only http:// (the admin port) or a file".into())),
        None => std::fs::read(source).map_err(|e| failed(e.to_string()))?,
    };
    serde_json::from_slice(&body).map_err(|e| failed(format!("not a record of observed writes: {e}")))
}
