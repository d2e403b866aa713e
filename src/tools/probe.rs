//! `statusguard probe`: calls each webhook of a live configuration the way
//! the API server does — at its Service name (or URL), trusting only its
//! `caBundle`, over HTTP/1.1 — with a status UPDATE that changes nothing,
//! and checks the answer: the uid echoed and the write allowed. It is the
//! chart's `helm test`, and a check after an install or a certificate
//! rotation: the Service routes to a serving replica, the certificate is
//! valid for the name the API server dials and chains to the bundle it
//! trusts, and the server decides. A server that requires client
//! certificates (`--client-ca-file`) is probed with one (`--client-cert`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use kube::core::{DynamicObject, GroupVersionKind, GroupVersionResource, TypeMeta};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio_rustls::TlsConnector;

use crate::cluster::certs::files::CertFiles;
use crate::rules::{ConfigMapRef, LoadError, fetch_configmap};

/// Why a probe could not run, or what a webhook answered wrong.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot read {what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("ValidatingWebhookConfiguration {0} not found (is the release installed under this name?)")]
    NotFound(String),
    /// The ownership document guards resources, but no webhook is registered.
    #[error(
        "the ownership document in {configmap} guards {resources} resource(s) but {name} has no webhook: no server has registered them (are the pods running? their logs say why)"
    )]
    NotRegistered {
        /// The configurations' name.
        name: String,
        configmap: ConfigMapRef,
        /// How many resources the document guards.
        resources: usize,
    },
    #[error(transparent)]
    Document(#[from] LoadError),
    #[error("the client certificate: {0}")]
    ClientCertificate(crate::cluster::certs::tls::TlsError),
    #[error("{failed} of {total} webhook(s) failed the probe")]
    Failed { failed: usize, total: usize },
}

/// One webhook's probe.
#[derive(Debug)]
pub struct Probed {
    /// The configuration's kind and the webhook's name.
    pub webhook: String,
    pub url: String,
    /// How long the call took, or why it failed.
    pub result: Result<Duration, String>,
}

impl fmt::Display for Probed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.result {
            Ok(took) => write!(
                f,
                "ok    {} at {}: allowed in {} ms",
                self.webhook,
                self.url,
                took.as_millis()
            ),
            Err(why) => write!(f, "FAIL  {} at {}: {why}", self.webhook, self.url),
        }
    }
}

/// What to probe and how.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// The webhook configurations' name (the server's `--register-webhooks`).
    pub name: String,
    /// The ownership ConfigMap: with it, an empty configuration is an error
    /// when the document guards resources.
    pub configmap: Option<ConfigMapRef>,
    /// Dial this `host:port` instead of the name in the configuration
    /// (a port-forward, or a machine without cluster DNS); TLS still checks
    /// the configuration's name.
    pub connect_to: Option<String>,
    pub timeout: Duration,
    /// A client certificate and key to present, for a server that requires
    /// one (`--client-ca-file`).
    pub client_cert: Option<CertFiles>,
}

/// Probes every webhook of the validating and mutating configurations
/// `options.name`, and returns each one's result (none when no resource is
/// guarded). See [`failures`] for the verdict.
pub async fn probe(client: &kube::Client, options: &ProbeOptions) -> Result<Vec<Probed>, ProbeError> {
    let read = |what: &str, source| ProbeError::Kube {
        what: format!("{what} {}", options.name),
        source,
    };
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating = validating
        .get_opt(&options.name)
        .await
        .map_err(|e| read("ValidatingWebhookConfiguration", e))?
        .ok_or_else(|| ProbeError::NotFound(options.name.clone()))?;
    let mutating = mutating
        .get_opt(&options.name)
        .await
        .map_err(|e| read("MutatingWebhookConfiguration", e))?;

    let mut hooks: Vec<(String, WebhookClientConfig, Option<Resource>)> = Vec::new();
    for hook in validating.webhooks.unwrap_or_default() {
        let resource = hook.rules.as_deref().and_then(Resource::first_of);
        hooks.push((format!("validating {}", hook.name), hook.client_config, resource));
    }
    for hook in mutating.and_then(|m| m.webhooks).unwrap_or_default() {
        let resource = hook.rules.as_deref().and_then(Resource::first_of);
        hooks.push((format!("mutating {}", hook.name), hook.client_config, resource));
    }
    if hooks.is_empty()
        && let Some(configmap) = &options.configmap
    {
        let document = fetch_configmap(client, configmap).await?;
        if !document.resources().is_empty() {
            return Err(ProbeError::NotRegistered {
                name: options.name.clone(),
                configmap: configmap.clone(),
                resources: document.resources().len(),
            });
        }
    }

    let identity = match &options.client_cert {
        Some(files) => Some(ClientIdentity::load(files).map_err(ProbeError::ClientCertificate)?),
        None => None,
    };
    let mut probed = Vec::with_capacity(hooks.len());
    for (webhook, config, resource) in hooks {
        let target = Target::of(&config, options.connect_to.as_deref());
        let url = target
            .as_ref()
            .map_or_else(|e| e.clone(), |t| format!("https://{}{}", t.server_name_port, t.path));
        let result = match (target, resource) {
            (Err(why), _) => Err(why),
            (Ok(_), None) => Err("the webhook has no rule to build a review from".to_owned()),
            (Ok(target), Some(resource)) => {
                let started = Instant::now();
                match tokio::time::timeout(options.timeout, call(&target, &resource, identity.as_ref())).await {
                    Ok(Ok(())) => Ok(started.elapsed()),
                    Ok(Err(why)) => Err(why),
                    Err(_) => Err(format!("no answer within {:?}", options.timeout)),
                }
            }
        };
        probed.push(Probed { webhook, url, result });
    }
    Ok(probed)
}

/// The resource of a webhook's first rule, for the review the probe sends.
#[derive(Debug, Clone)]
struct Resource {
    group: String,
    version: String,
    resource: String,
}

impl Resource {
    fn first_of(rules: &[k8s_openapi::api::admissionregistration::v1::RuleWithOperations]) -> Option<Self> {
        let rule = rules.first()?;
        let first = |list: &Option<Vec<String>>| list.as_ref()?.first().cloned();
        let resource = first(&rule.resources)?;
        Some(Self {
            group: first(&rule.api_groups)?,
            version: first(&rule.api_versions)?,
            resource: resource.split('/').next().unwrap_or_default().to_owned(),
        })
    }
}

/// Where and how a webhook is called.
#[derive(Debug)]
struct Target {
    /// The name TLS verifies.
    server_name: String,
    /// `name:port` as the configuration says.
    server_name_port: String,
    /// What is dialled.
    dial: String,
    path: String,
    trusted: Vec<CertificateDer<'static>>,
}

impl Target {
    fn of(config: &WebhookClientConfig, connect_to: Option<&str>) -> Result<Self, String> {
        let (server_name, port, path) = match (&config.service, &config.url) {
            (Some(service), _) => (
                format!("{}.{}.svc", service.name, service.namespace),
                service.port.unwrap_or(443),
                service.path.clone().unwrap_or_else(|| "/".to_owned()),
            ),
            (None, Some(url)) => {
                let uri: hyper::Uri = url.parse().map_err(|e| format!("bad url {url}: {e}"))?;
                let host = uri.host().ok_or_else(|| format!("no host in {url}"))?;
                (
                    host.trim_start_matches('[').trim_end_matches(']').to_owned(),
                    uri.port_u16().map_or(443, i32::from),
                    uri.path().to_owned(),
                )
            }
            (None, None) => return Err("the webhook names neither a service nor a url".to_owned()),
        };
        let bundle = config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone())
            .filter(|b| !b.is_empty())
            .ok_or("the webhook has no caBundle (the server has not published its CA yet)")?;
        let trusted: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bundle)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the caBundle is not PEM: {e}"))?;
        if trusted.is_empty() {
            return Err("the caBundle holds no certificate".to_owned());
        }
        let server_name_port = match server_name.contains(':') {
            true => format!("[{server_name}]:{port}"),
            false => format!("{server_name}:{port}"),
        };
        Ok(Self {
            dial: connect_to.map_or_else(|| server_name_port.clone(), str::to_owned),
            server_name,
            server_name_port,
            path,
            trusted,
        })
    }
}

/// A client certificate chain and its key, parsed once for every call.
struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl ClientIdentity {
    fn load(files: &CertFiles) -> Result<Self, crate::cluster::certs::tls::TlsError> {
        // Loaded as a served pair is, which also checks that the key fits.
        let (certified, pem) = files.load()?;
        let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| crate::cluster::certs::tls::TlsError::Pem {
            path: files.key.clone(),
            message: e.to_string(),
        })?;
        let chain = certified.cert;
        Ok(Self { chain, key })
    }
}

/// One call: TLS to the target trusting only its bundle (presenting
/// `identity` when asked for a certificate), a status UPDATE that changes
/// nothing, and the answer checked.
async fn call(target: &Target, resource: &Resource, identity: Option<&ClientIdentity>) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in &target.trusted {
        roots
            .add(cert.clone())
            .map_err(|e| format!("the caBundle's certificate is unusable: {e}"))?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(crate::cluster::certs::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let tls = match identity {
        Some(identity) => tls
            .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
            .map_err(|e| format!("the client certificate is unusable: {e}"))?,
        None => tls.with_no_client_auth(),
    };
    let name = ServerName::try_from(target.server_name.clone()).map_err(|e| format!("bad server name: {e}"))?;
    let tcp = tokio::net::TcpStream::connect(&target.dial)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", target.dial))?;
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS with {} failed: {e}", target.server_name))?;

    let uid = format!("statusguard-probe-{}", rand::random::<u64>());
    let review = probe_review(resource, &uid);
    let review = serde_json::to_vec(&review).map_err(|e| format!("cannot encode the review: {e}"))?;
    let request = hyper::Request::post(&target.path)
        .header(hyper::header::HOST, &target.server_name_port)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(review)))
        .map_err(|e| e.to_string())?;
    let (status, body) = super::http1::exchange(stream, request).await?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()));
    }
    let answer: AdmissionReview<DynamicObject> =
        serde_json::from_slice(&body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let response = answer.response.ok_or("the AdmissionReview has no response")?;
    if response.uid != uid {
        return Err(format!("the uid was not echoed: sent {uid}, got {}", response.uid));
    }
    if !response.allowed {
        return Err(format!(
            "a write that changes nothing was denied: {}",
            response.result.message
        ));
    }
    Ok(())
}

/// A dry-run status UPDATE of an object that does not exist, changing
/// nothing, from a user no document names: every mode must allow it.
fn probe_review(resource: &Resource, uid: &str) -> AdmissionReview<DynamicObject> {
    const KIND: &str = "Probe";
    let kind = GroupVersionKind::gvk(&resource.group, &resource.version, KIND);
    let object = DynamicObject {
        types: Some(TypeMeta {
            api_version: kind.api_version(),
            kind: KIND.to_owned(),
        }),
        metadata: ObjectMeta {
            name: Some("statusguard-probe".to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        data: json!({ "status": {} }),
    };
    let request = AdmissionRequest {
        types: TypeMeta::default(),
        uid: uid.to_owned(),
        kind,
        resource: GroupVersionResource::gvr(&resource.group, &resource.version, &resource.resource),
        sub_resource: Some("status".to_owned()),
        request_kind: None,
        request_resource: None,
        request_sub_resource: None,
        name: "statusguard-probe".to_owned(),
        namespace: Some("default".to_owned()),
        operation: Operation::Update,
        user_info: UserInfo {
            username: Some("statusguard:probe".to_owned()),
            ..UserInfo::default()
        },
        object: Some(object.clone()),
        old_object: Some(object),
        dry_run: true,
        options: None,
    };
    AdmissionReview {
        types: TypeMeta {
            api_version: "admission.k8s.io/v1".to_owned(),
            kind: "AdmissionReview".to_owned(),
        },
        request: Some(request),
        response: None,
    }
}

/// `Err(Failed)` when any probe failed.
pub fn failures(probed: &[Probed]) -> Result<(), ProbeError> {
    match probed.iter().filter(|p| p.result.is_err()).count() {
        0 => Ok(()),
        failed => Err(ProbeError::Failed {
            failed,
            total: probed.len(),
        }),
    }
}

#[cfg(test)]
mod tests;
