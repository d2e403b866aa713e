//! The real Gateway API on the test control plane: the pinned CRDs
//! (sigs.k8s.io/gateway-api, standard channel, fetched by
//! tests/cluster/gateway-api.sh), two implementations with ServiceAccounts of
//! their own, and statusguard registered for route and policy status.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::core::Request;
use serde_json::{Value, json};

use super::cluster::{self, Cluster};
use super::scenario::{Written, send};

pub const GROUP: &str = "gateway.networking.k8s.io";

/// A Gateway API implementation: who it runs as and the controllerName it
/// writes into the entries it owns.
#[derive(Clone, Copy, Debug)]
pub struct Implementation {
    pub namespace: &'static str,
    pub service_account: &'static str,
    pub controller_name: &'static str,
    pub gateway_class: &'static str,
}

impl Implementation {
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.service_account)
    }

    pub fn document_name(&self) -> String {
        format!("{}/{}", self.namespace, self.service_account)
    }
}

pub const ENVOY: Implementation = Implementation {
    namespace: "envoy-gateway-system",
    service_account: "envoy-gateway",
    controller_name: "gateway.envoyproxy.io/gatewayclass-controller",
    gateway_class: "envoy",
};

pub const ISTIO: Implementation = Implementation {
    namespace: "istio-system",
    service_account: "istiod",
    controller_name: "istio.io/gateway-controller",
    gateway_class: "istio",
};

/// The folder with the pinned CRDs: STATUSGUARD_GATEWAY_CRDS (set by
/// tests/run.sh), else fetched into the cache by tests/cluster/gateway-api.sh.
pub fn crds_dir() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| super::printed_path("tests/cluster/gateway-api.sh"))
        .clone()
}

pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

pub fn httproutes(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource("HTTPRoute", "httproutes"))
}

/// Installs GatewayClass, Gateway, HTTPRoute, GRPCRoute and BackendTLSPolicy
/// from the pinned CRDs and waits until each is Established and served.
pub async fn install_crds(client: &Client) {
    use kube::runtime::wait::{await_condition, conditions};
    let dir = crds_dir().unwrap_or_else(|e| panic!("the Gateway API CRDs: {e}"));
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        cluster::ensure(&api, &crd).await;
        names.push(crd.metadata.name.clone().unwrap_or_default());
    }
    assert!(names.len() >= 5, "CRDs in {}: {names:?}", dir.display());
    for name in names {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(60), established)
            .await
            .unwrap_or_else(|_| panic!("{name} was Established in time"))
            .expect("the CRD can be watched");
    }
    let probe = httproutes(client, "default");
    let params = kube::api::ListParams::default();
    super::wait::retry_until(Duration::from_secs(30), "HTTPRoute is served", || probe.list(&params)).await;
}

/// One test's share of the cluster for Gateway API: the CRDs, both
/// implementations' ServiceAccounts with status rights on routes and
/// policies, a GatewayClass and a Gateway of each, and a namespace labelled
/// for this test's webhook configurations.
pub struct GatewayScenario {
    pub cluster: &'static Cluster,
    pub admin: Client,
    pub envoy: Client,
    pub istio: Client,
    pub namespace: String,
}

impl GatewayScenario {
    pub async fn new(test: &str) -> Self {
        let cluster = Cluster::shared();
        let admin = cluster.admin().await;
        install_crds(&admin).await;
        let subjects = [
            (ENVOY.namespace, ENVOY.service_account),
            (ISTIO.namespace, ISTIO.service_account),
        ];
        for (ns, name) in subjects {
            cluster::namespace(&admin, ns, json!({})).await;
            cluster::service_account(&admin, ns, name).await;
        }
        for (role, plural) in [
            ("gateway-httproute-status", "httproutes"),
            ("gateway-grpcroute-status", "grpcroutes"),
            ("gateway-backendtlspolicy-status", "backendtlspolicies"),
        ] {
            cluster::grant_status_writers(&admin, role, GROUP, plural, &subjects).await;
        }
        cluster::namespace(&admin, test, json!({"statusguard-test": test})).await;
        let classes: Api<DynamicObject> = Api::all_with(admin.clone(), &resource("GatewayClass", "gatewayclasses"));
        let gateways: Api<DynamicObject> = Api::namespaced_with(admin.clone(), test, &resource("Gateway", "gateways"));
        for implementation in [ENVOY, ISTIO] {
            cluster::ensure_json(
                &classes,
                json!({"apiVersion": format!("{GROUP}/v1"), "kind": "GatewayClass",
                       "metadata": {"name": implementation.gateway_class},
                       "spec": {"controllerName": implementation.controller_name}}),
            )
            .await;
            cluster::ensure_json(
                &gateways,
                json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Gateway",
                       "metadata": {"name": implementation.gateway_class},
                       "spec": {"gatewayClassName": implementation.gateway_class,
                                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
            )
            .await;
        }
        let envoy = cluster
            .service_account_client(ENVOY.namespace, ENVOY.service_account)
            .await;
        let istio = cluster
            .service_account_client(ISTIO.namespace, ISTIO.service_account)
            .await;
        Self {
            cluster,
            admin,
            envoy,
            istio,
            namespace: test.to_owned(),
        }
    }

    pub fn client(&self, implementation: Implementation) -> &Client {
        if implementation.controller_name == ENVOY.controller_name {
            &self.envoy
        } else {
            &self.istio
        }
    }

    fn base_path(&self) -> String {
        format!("/apis/{GROUP}/v1/namespaces/{}/httproutes", self.namespace)
    }

    /// Creates an HTTPRoute attached to both Gateways, with `parents` as
    /// its status (written by the admin, which statusguard exempts).
    pub async fn create_route(&self, name: &str, parents: Value) -> Value {
        let api = httproutes(&self.admin, &self.namespace);
        let object = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1"), "kind": "HTTPRoute",
            "metadata": {"name": name},
            "spec": {"parentRefs": [{"name": ENVOY.gateway_class}, {"name": ISTIO.gateway_class}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &object).await.unwrap();
        let mut with_status = serde_json::to_value(&created).unwrap();
        with_status["status"] = json!({"parents": parents});
        let written = self.put_status(&self.admin, &with_status).await;
        assert_eq!(written.code, 200, "{:?}", written.body);
        written.body
    }

    pub async fn get(&self, client: &Client, name: &str) -> Value {
        let api = httproutes(client, &self.namespace);
        serde_json::to_value(api.get(name).await.unwrap()).unwrap()
    }

    /// A full UpdateStatus (what controller-runtime's `Status().Update` sends).
    pub async fn put_status(&self, client: &Client, object: &Value) -> Written {
        super::scenario::put_status(client, &self.base_path(), object).await
    }

    pub async fn merge_patch_status(&self, client: &Client, name: &str, patch: Value) -> Written {
        let request = Request::new(self.base_path())
            .patch_subresource("status", name, &PatchParams::default(), &Patch::Merge(patch))
            .unwrap();
        send(client, request).await
    }

    /// A server-side apply of `status` as field manager `manager`.
    pub async fn apply_status(
        &self,
        client: &Client,
        manager: &str,
        name: &str,
        status: Value,
        force: bool,
    ) -> Written {
        let body = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "HTTPRoute",
                          "metadata": {"name": name}, "status": status});
        let mut params = PatchParams::apply(manager);
        params.force = force;
        let request = Request::new(self.base_path())
            .patch_subresource("status", name, &params, &Patch::Apply(body))
            .unwrap();
        send(client, request).await
    }

    /// Registers statusguard at `https://127.0.0.1:port/` for route and policy
    /// status in this test's namespace (`mutate`: also the mutating webhook,
    /// for trim), and waits until the API server calls it: a dry-run status
    /// write by an implementation reaches the webhook.
    pub async fn register_at<F, Fut>(&self, port: u16, ca_pem: &str, mutate: bool, metrics: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = String>,
    {
        cluster::register_test_webhooks(
            &self.admin,
            &self.namespace,
            (
                GROUP,
                &["httproutes/status", "grpcroutes/status", "backendtlspolicies/status"],
            ),
            port,
            ca_pem,
            mutate,
        )
        .await;
        let wanted: &[&str] = if mutate {
            &["endpoint=\"validate\"", "endpoint=\"mutate\""]
        } else {
            &["endpoint=\"validate\""]
        };

        let probe = "webhook-probe";
        if httproutes(&self.admin, &self.namespace)
            .get_opt(probe)
            .await
            .unwrap()
            .is_none()
        {
            self.create_route(probe, json!([])).await;
        }
        super::wait::retry_until(Duration::from_secs(30), "the API server calls the webhook", || async {
            let object = self.get(&self.admin, probe).await;
            let request = Request::new(self.base_path())
                .replace_subresource(
                    "status",
                    probe,
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    serde_json::to_vec(&object).unwrap(),
                )
                .unwrap();
            let _ = send(&self.envoy, request).await;
            let metrics = metrics().await;
            let called = wanted.iter().all(|w| {
                metrics
                    .lines()
                    .any(|l| l.starts_with("statusguard_admission_requests_total") && l.contains(w))
            });
            if called { Ok(()) } else { Err(metrics) }
        })
        .await
    }

    pub async fn unregister(&self) {
        let name = format!("statusguard-{}", self.namespace);
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(self.admin.clone());
        let _ = validating.delete(&name, &DeleteParams::default()).await;
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(self.admin.clone());
        let _ = mutating.delete(&name, &DeleteParams::default()).await;
    }
}

/// One `status.parents` entry as an implementation writes it: the parent
/// Gateway, the implementation's controllerName, and `conditions` (type,
/// status) with the fields the CRD requires.
pub fn parent(implementation: Implementation, gateway: &str, conditions: &[(&str, &str)]) -> Value {
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|(kind, status)| {
            json!({"type": kind, "status": status, "reason": kind, "message": "",
                   "observedGeneration": 1, "lastTransitionTime": "2026-12-01T10:00:00Z"})
        })
        .collect();
    json!({"parentRef": {"group": GROUP, "kind": "Gateway", "name": gateway},
           "controllerName": implementation.controller_name,
           "conditions": conditions})
}

/// The `status.parents` entries of `object` keyed by controllerName, in order.
pub fn controllers(object: &Value) -> Vec<String> {
    object["status"]["parents"]
        .as_array()
        .map(|parents| {
            parents
                .iter()
                .map(|p| p["controllerName"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
