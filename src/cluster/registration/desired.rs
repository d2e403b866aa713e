//! The webhook configurations statusguard keeps in step with the rules in
//! force, and removes on `statusguard unregister`.
//!
//! What intercepts status writes must match the document being enforced,
//! not what Helm rendered once: the server applies its
//! ValidatingWebhookConfiguration and MutatingWebhookConfiguration from the
//! last valid document (server-side apply, one field manager, so that every
//! replica writes the same object and they converge without a leader).
//! Until a first valid document is loaded nothing is applied, so nothing
//! intercepts; an invalid document is never applied, so the protection a
//! valid one set up stays.
//!
//! The configurations fail safe:
//! - enforce and trim resources are behind the configured `failurePolicy`
//!   (`Fail` by default); audit resources have a webhook of their own with
//!   `Ignore`, since nothing is enforced for them;
//! - `matchConditions` (CEL) keep the document's exempt users and groups and
//!   `system:nodes` away from the webhook entirely, so break-glass works
//!   while statusguard is down.
//!
//! Each rule names the one version its resource's paths are written against
//! (the document's `version:`, else the CRD's storage version, which the
//! registration loop reads), with `matchPolicy: Equivalent`: the API server
//! converts a write made in any other served version to that one before it
//! calls the webhook, so a writer in another version (whose status may be
//! laid out differently) is decided on the layout the paths describe. Only a
//! resource whose version is unknown (a built-in one, or a CRD not there yet,
//! and no `version:`) is registered for every version, `*`, unconverted.
//!
//! Only the `webhooks` of each configuration are written, so the objects
//! themselves may be created by someone else (the Helm chart creates them
//! empty, so that the server needs to patch, never to create, webhook
//! configurations); where the server may create them, the first apply does.
//!
//! [`desired`] is pure: the same inputs give the same objects on every
//! replica. [`super::keep`] reads the inputs and applies what it returns.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::cluster::versions::ResolvedVersions;
use crate::ownership::{FailurePolicy, GroupResource, Mode, Ownership, ResourceRules};

use crate::rules::ConfigMapRef;

/// The group of every node's kubelet, never sent to the webhook.
pub const NODES_GROUP: &str = "system:nodes";

/// Where the API server sends reviews.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A Service in the cluster (the chart's).
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port.
        port: i32,
    },
    /// A base URL (`https://host:port`), for a server outside the cluster.
    Url(String),
}

impl WebhookTarget {
    fn client_config(&self, path: &str, ca_bundle: Option<&[u8]>) -> WebhookClientConfig {
        let mut config = WebhookClientConfig {
            ca_bundle: ca_bundle.map(|pem| ByteString(pem.to_vec())),
            ..Default::default()
        };
        match self {
            WebhookTarget::Service { namespace, name, port } => {
                config.service = Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(format!("/{path}")),
                    port: Some(*port),
                })
            }
            WebhookTarget::Url(base) => config.url = Some(format!("{}/{path}", base.trim_end_matches('/'))),
        }
        config
    }
}

/// `NAMESPACE/NAME:PORT` of a Service.
impl std::str::FromStr for WebhookTarget {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.starts_with("https://") {
            return Ok(WebhookTarget::Url(text.to_owned()));
        }
        let usage = || format!("{text:?}: expected NAMESPACE/NAME:PORT of a Service, or an https:// URL");
        let (namespace, rest) = text.split_once('/').ok_or_else(usage)?;
        let (name, port) = rest.split_once(':').ok_or_else(usage)?;
        let port: i32 = port.parse().map_err(|_| usage())?;
        if namespace.is_empty() || name.is_empty() || !(1..=65535).contains(&port) {
            return Err(usage());
        }
        Ok(WebhookTarget::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        })
    }
}

/// Where the `caBundle` of the configurations comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// No `caBundle`: the API server's own trust store verifies a URL target.
    None,
    /// A PEM file of the CA(s) that verify the serving certificate, read at
    /// every sync so that a rotated CA reaches the `caBundle`.
    File(PathBuf),
    /// The bundle of the certificates the server keeps itself.
    Managed,
}

/// How the server registers itself.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The name of both configurations (the chart's full name).
    pub name: String,
    /// Where the API server sends reviews.
    pub target: WebhookTarget,
    /// Where the `caBundle` comes from.
    pub ca: CaSource,
    /// The enforcing webhooks' `failurePolicy`.
    pub failure_policy: FailurePolicy,
    /// The API server waits this long for an answer.
    pub timeout_seconds: i32,
    /// Which namespaces' objects are sent; `None`: all.
    pub namespace_selector: Option<LabelSelector>,
    /// Which objects are sent, by their labels; `None`: all.
    pub object_selector: Option<LabelSelector>,
    /// How often the configurations are applied again even when nothing
    /// changed (repairs a hand edit or deletion).
    pub resync: Duration,
    /// Cluster mode: the ownership ConfigMap, whose writes get a webhook of
    /// their own that refuses an invalid document (`crate::rules::admission`).
    /// `Server::bind` sets it from the rules source, the one place that
    /// knows it, so that the webhook and its route never disagree.
    pub ownership_configmap: Option<ConfigMapRef>,
}

/// The two configurations, as the server applies them.
#[derive(Debug, Clone, PartialEq)]
pub struct Configurations {
    /// `validate` for enforce and trim resources, `audit` (failurePolicy
    /// Ignore) for audit resources; either left out when it has none.
    pub validating: ValidatingWebhookConfiguration,
    /// `mutate` for trim resources; no webhooks when there are none.
    pub mutating: MutatingWebhookConfiguration,
}

/// A webhook's name: `PATH.NAME.statusguard.dev`.
fn webhook_name(path: &str, registration: &Registration) -> String {
    format!("{path}.{}.statusguard.dev", registration.name)
}

/// Every version: what a rule names when the version of its resource is unknown.
pub const ALL_VERSIONS: &str = "*";

/// The version a resource's rule names: the document's, else the resolved
/// one, else every version.
pub fn rule_version<'a>(resource: &'a ResourceRules, resolved: &'a ResolvedVersions) -> &'a str {
    resource
        .version
        .as_deref()
        .or_else(|| {
            resolved
                .get(&GroupResource::new(resource.group.as_str(), resource.resource.as_str()))
                .map(String::as_str)
        })
        .unwrap_or(ALL_VERSIONS)
}

/// The rules of a webhook: `<resource>/status` UPDATE for each resource, in
/// the version its paths are written against.
fn rules_for<'r>(
    resources: impl Iterator<Item = &'r ResourceRules>,
    resolved: &ResolvedVersions,
) -> Vec<RuleWithOperations> {
    resources
        .map(|r| RuleWithOperations {
            api_groups: Some(vec![r.group.clone()]),
            api_versions: Some(vec![rule_version(r, resolved).to_owned()]),
            operations: Some(vec!["UPDATE".to_owned()]),
            resources: Some(vec![format!("{}/status", r.resource)]),
            scope: Some("*".to_owned()),
        })
        .collect()
}

/// A CEL string literal (CEL accepts JSON's escapes).
fn cel_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// The `matchConditions` that keep exempt writers and the nodes' kubelets
/// away from the webhook: the API server does not call it for them at all.
pub fn match_conditions(rules: &Ownership) -> Vec<MatchCondition> {
    let list = |items: Vec<&str>| items.into_iter().map(cel_string).collect::<Vec<_>>().join(", ");
    let mut conditions = Vec::new();
    if !rules.exempt_users.is_empty() {
        let users = list(rules.exempt_users.iter().map(String::as_str).collect());
        conditions.push(MatchCondition {
            name: "not-an-exempt-user".to_owned(),
            expression: format!("!(request.userInfo.username in [{users}])"),
        });
    }
    let mut groups: Vec<&str> = rules.exempt_groups.iter().map(String::as_str).collect();
    if !groups.contains(&NODES_GROUP) {
        groups.push(NODES_GROUP);
    }
    conditions.push(MatchCondition {
        name: "not-an-exempt-group".to_owned(),
        expression: format!(
            "!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in [{}]))",
            list(groups)
        ),
    });
    conditions
}

/// The webhooks the configurations hold: enforce and trim resources are
/// validated, audit resources are validated apart (they never block), trim
/// resources are also mutated. The kind is the first label of a webhook's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum WebhookKind {
    Validate,
    Audit,
    Mutate,
}

impl WebhookKind {
    fn as_str(self) -> &'static str {
        match self {
            WebhookKind::Validate => "validate",
            WebhookKind::Audit => "audit",
            WebhookKind::Mutate => "mutate",
        }
    }
}

/// Resources that share one webhook: the endpoint's path, and the
/// `failurePolicy` and `timeoutSeconds` they have.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Group {
    kind: WebhookKind,
    failure_policy: FailurePolicy,
    timeout_seconds: i32,
}

impl Group {
    /// The first label of the webhook's name: the kind alone for the
    /// server's own failure policy and timeout, else both appended
    /// (`validate-ignore-10s`).
    fn path(&self, registration: &Registration) -> String {
        if self.failure_policy == failure_policy(self.kind, None, registration)
            && self.timeout_seconds == registration.timeout_seconds
        {
            self.kind.as_str().to_owned()
        } else {
            format!(
                "{}-{}-{}s",
                self.kind.as_str(),
                self.failure_policy.to_string().to_lowercase(),
                self.timeout_seconds
            )
        }
    }
}

/// The failure policy of a resource in a webhook of `kind`: always `Ignore`
/// for audit, where nothing is enforced, so a write is never blocked; else
/// the resource's `own`, or the server's.
fn failure_policy(kind: WebhookKind, own: Option<FailurePolicy>, registration: &Registration) -> FailurePolicy {
    match kind {
        WebhookKind::Audit => FailurePolicy::Ignore,
        WebhookKind::Validate | WebhookKind::Mutate => own.unwrap_or(registration.failure_policy),
    }
}

/// The resources of `modes`, grouped by the failure policy and timeout
/// they have (their own, or the server's).
fn groups<'r>(
    registration: &Registration,
    rules: &'r Ownership,
    kind: WebhookKind,
    modes: &[Mode],
) -> BTreeMap<Group, Vec<&'r ResourceRules>> {
    let mut groups: BTreeMap<Group, Vec<&ResourceRules>> = BTreeMap::new();
    for r in rules.resources().iter().filter(|r| modes.contains(&r.mode)) {
        let group = Group {
            kind,
            failure_policy: failure_policy(kind, r.failure_policy, registration),
            timeout_seconds: r.timeout_seconds.unwrap_or(registration.timeout_seconds),
        };
        groups.entry(group).or_default().push(r);
    }
    groups
}

/// The configurations that match `rules`, with `resolved` the versions of
/// the resources whose document names none: pure, the same on every replica.
pub fn desired(
    registration: &Registration,
    rules: &Ownership,
    resolved: &ResolvedVersions,
    ca_bundle: Option<&[u8]>,
) -> Configurations {
    // Only the name: the labels belong to whoever created the object (the
    // chart), and an apply of them would take them over.
    let metadata = ObjectMeta {
        name: Some(registration.name.clone()),
        ..Default::default()
    };
    let conditions = match_conditions(rules);
    // One webhook of a group, at `endpoint`; the mutating one is the same
    // webhook with a reinvocation policy.
    let hook = |group: &Group, rules: Vec<RuleWithOperations>, endpoint: &str| ValidatingWebhook {
        name: webhook_name(&group.path(registration), registration),
        client_config: registration.target.client_config(endpoint, ca_bundle),
        rules: Some(rules),
        failure_policy: Some(group.failure_policy.to_string()),
        // The API server converts a write in another version of the
        // resource to the one the rule names (see the module's comment).
        match_policy: Some("Equivalent".to_owned()),
        match_conditions: Some(conditions.clone()),
        namespace_selector: registration.namespace_selector.clone(),
        object_selector: registration.object_selector.clone(),
        // Denied and trimmed writes get an Event, never for a dry run.
        side_effects: "NoneOnDryRun".to_owned(),
        admission_review_versions: vec!["v1".to_owned()],
        timeout_seconds: Some(group.timeout_seconds),
    };
    let mutating_hook = |group: &Group, rules: Vec<RuleWithOperations>| {
        let hook = hook(group, rules, "mutate");
        MutatingWebhook {
            name: hook.name,
            client_config: hook.client_config,
            rules: hook.rules,
            failure_policy: hook.failure_policy,
            match_policy: hook.match_policy,
            match_conditions: hook.match_conditions,
            namespace_selector: hook.namespace_selector,
            object_selector: hook.object_selector,
            reinvocation_policy: Some("IfNeeded".to_owned()),
            side_effects: hook.side_effects,
            admission_review_versions: hook.admission_review_versions,
            timeout_seconds: hook.timeout_seconds,
        }
    };
    let validating = groups(registration, rules, WebhookKind::Validate, &[Mode::Enforce, Mode::Trim])
        .into_iter()
        .chain(groups(registration, rules, WebhookKind::Audit, &[Mode::Audit]))
        .map(|(group, resources)| hook(&group, rules_for(resources.into_iter(), resolved), "validate"))
        .chain(
            registration
                .ownership_configmap
                .as_ref()
                .map(|configmap| ownership_hook(registration, configmap, ca_bundle)),
        )
        .collect();
    let mutating = groups(registration, rules, WebhookKind::Mutate, &[Mode::Trim])
        .into_iter()
        .map(|(group, resources)| mutating_hook(&group, rules_for(resources.into_iter(), resolved)))
        .collect();
    Configurations {
        validating: ValidatingWebhookConfiguration {
            metadata: metadata.clone(),
            webhooks: Some(validating),
        },
        mutating: MutatingWebhookConfiguration {
            metadata,
            webhooks: Some(mutating),
        },
    }
}

/// The webhook on writes of the ownership ConfigMap itself: `Ignore`, so
/// that a fix is never blocked while the server is down; only that one
/// object (its namespace by the label every namespace has, its name by a
/// match condition). Exempt writers are checked too: the check guards the
/// rules themselves, not a status, and an edit that keeps the stored
/// document passes whatever it holds ([`crate::rules::admission`]).
fn ownership_hook(
    registration: &Registration,
    configmap: &ConfigMapRef,
    ca_bundle: Option<&[u8]>,
) -> ValidatingWebhook {
    let path = crate::rules::admission::PATH.trim_start_matches('/');
    ValidatingWebhook {
        name: webhook_name("ownership", registration),
        client_config: registration.target.client_config(path, ca_bundle),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".to_owned()]),
            resources: Some(vec!["configmaps".to_owned()]),
            operations: Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()]),
            scope: Some("Namespaced".to_owned()),
        }]),
        failure_policy: Some(FailurePolicy::Ignore.to_string()),
        match_policy: Some("Equivalent".to_owned()),
        match_conditions: Some(vec![MatchCondition {
            name: "the-ownership-configmap".to_owned(),
            expression: format!("object.metadata.name == {}", cel_string(&configmap.name)),
        }]),
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                configmap.namespace.clone(),
            )])),
            ..Default::default()
        }),
        object_selector: None,
        side_effects: "None".to_owned(),
        admission_review_versions: vec!["v1".to_owned()],
        timeout_seconds: Some(5),
    }
}

#[cfg(test)]
mod tests;
